#include "tl_plan.h"
#include "cm_error.h"
#include "cm_model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The parameters of the experts a token does not use: (E - K) experts' SwiGLU in every layer. */
static double idle_expert_params(const tl_model_shape *m) {
    return m->n_expert ? (double)m->n_layer * (m->n_expert - m->n_expert_used) * 3.0 * m->dim * m->hidden : 0;
}

double tl_params_estimate(const tl_model_shape *m) {
    double D = m->dim, QD = (double)m->n_head * m->head_dim, KVD = (double)m->n_kv_head * m->head_dim;
    double E = m->n_expert ? m->n_expert : 1, router = m->n_expert ? D * m->n_expert : 0;
    double per_layer = D * QD + 2 * D * KVD + QD * D + 3 * D * m->hidden * E + router + 2 * D;
    return (double)m->vocab * D * (m->tied ? 1 : 2) + m->n_layer * per_layer + D;
}

static void shape_from_cfg(const cm_model_config *c, const char *name, tl_model_shape *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", name);
    out->n_layer = (int)c->n_layer;
    out->n_head = (int)c->n_head;
    out->n_kv_head = (int)c->n_kv_head;
    out->head_dim = (int)c->head_dim;
    out->dim = (int)c->dim;
    out->hidden = (int)c->hidden;
    out->vocab = (int)c->vocab;
    out->ctx = (int)c->ctx_len;
    out->tied = c->tied;
    out->n_expert = (int)c->n_expert;
    out->n_expert_used = (int)c->n_expert_used;
    out->params = tl_params_estimate(out);
    out->active_params = out->params - idle_expert_params(out);
}

int tl_model_preset(const char *name, tl_model_shape *out) {
    cm_model_config c;
    int rc = cm_model_preset(name, &c);
    if (!rc) shape_from_cfg(&c, c.name, out);
    return rc;
}

int tl_model_from_config(const char *path, tl_model_shape *out, char *err, size_t errlen) {
    cm_model_config c;
    memset(out, 0, sizeof *out);
    int rc = cm_model_config_json(path, &c, err, errlen);
    if (!rc) shape_from_cfg(&c, path, out);
    return rc;
}

int tl_model_from_gguf(const char *path, tl_model_shape *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    cm_model_file *f;
    int rc = cm_model_open(path, &f, err, errlen);
    if (rc) return rc;
    const cm_model_config *c = &f->cfg;
    shape_from_cfg(c, c->name[0] ? c->name : path, out);
    double bytes = 0, params = 0;
    for (size_t i = 0; i < f->n_tensors; i++) {
        bytes += (double)f->tensors[i].nbytes;
        double n = 1;
        for (uint32_t d = 0; d < f->tensors[i].n_dims; d++) n *= (double)f->tensors[i].ne[d];
        params += n;
    }
    out->weight_bytes = bytes;
    out->params = params;
    out->active_params = params - idle_expert_params(out);
    cm_model_close(f);
    return 0;
}

double tl_kv_bytes_per_token(const tl_model_shape *m, double kv_elem_bytes) {
    return 2.0 * m->n_layer * m->n_kv_head * m->head_dim * kv_elem_bytes;
}

void tl_plan(const tl_model_shape *m, const tl_plan_in *in, tl_plan_out *o) {
    memset(o, 0, sizeof *o);
    int tp = in->tp > 0 ? in->tp : 1, pp = in->pp > 0 ? in->pp : 1, L = in->max_model_len > 0 ? in->max_model_len : m->ctx;
    double weights = m->weight_bytes > 0 ? m->weight_bytes : m->params * in->weight_elem_bytes;
    o->kv_bytes_per_token = tl_kv_bytes_per_token(m, in->kv_elem_bytes);
    /* KV heads split over the ranks (replicated when there are fewer heads than ranks) */
    int kv_per_gpu = m->n_kv_head >= tp ? (m->n_kv_head + tp - 1) / tp : 1;
    /* activations of one step (fp32 on the way, a few buffers of the widest
     * layer per batched token) and the logits of the running sequences */
    int bt = in->max_batched_tokens > 0 ? in->max_batched_tokens : 2048, seqs = in->max_num_seqs > 0 ? in->max_num_seqs : 256;
    double widest = fmax(m->dim, fmax((double)m->hidden / tp, (double)m->n_head * m->head_dim / tp));
    o->activation_bytes_per_gpu = (double)bt * widest * 4 * 6 + (double)seqs * m->vocab * 4;
    double budget = in->gpu_memory * (in->utilization > 0 ? in->utilization : 0.9);
    if (m->n_kv_head < tp && m->n_kv_head > 0 && tp % m->n_kv_head) {
        snprintf(o->why, sizeof o->why, "%d KV heads cannot be spread evenly over %d GPUs", m->n_kv_head, tp);
        return;
    }
    if (pp > m->n_layer || pp > TL_PLAN_MAX_STAGES) {
        snprintf(o->why, sizeof o->why, "%d pipeline stages for %d layers", pp, m->n_layer);
        return;
    }
    /* stages: the layers as the worker splits them (the earlier stages one more where they do not divide);
     * the embeddings on stage 0, the LM head (a copy of them when tied) on the last, the rest by layer */
    double emb = (double)m->vocab * m->dim * (weights / fmax(m->params, 1)), head = emb;
    double per_layer = (weights - emb - (m->tied ? 0 : head)) / m->n_layer;
    o->stages = pp;
    int worst = 0;
    for (int s = 0; s < pp; s++) {
        int l0 = (int)(((long long)s * m->n_layer + pp - 1) / pp), l1 = (int)(((long long)(s + 1) * m->n_layer + pp - 1) / pp);
        double w = pp == 1 ? weights / tp : (per_layer * (l1 - l0) + (s == pp - 1 ? head : 0)) / tp + (s == 0 ? emb / tp : 0);
        double kv = 2.0 * (l1 - l0) * kv_per_gpu * m->head_dim * in->kv_elem_bytes, pool = budget - w - o->activation_bytes_per_gpu;
        o->stage[s].l0 = l0, o->stage[s].l1 = l1, o->stage[s].weight_bytes = w, o->stage[s].kv_bytes_per_token = kv;
        o->stage[s].kv_pool_bytes = pool > 0 ? pool : 0;
        o->stage[s].max_tokens = pool > 0 ? floor(pool / kv) : 0;
        if (o->stage[s].max_tokens < o->stage[worst].max_tokens || (pool <= 0 && o->stage[worst].kv_pool_bytes > 0)) worst = s;
    }
    o->weight_bytes_per_gpu = o->stage[worst].weight_bytes;
    o->kv_bytes_per_token_per_gpu = o->stage[worst].kv_bytes_per_token;
    o->kv_pool_bytes_per_gpu = o->stage[worst].kv_pool_bytes;
    if (o->kv_pool_bytes_per_gpu <= 0) {
        snprintf(o->why, sizeof o->why,
                 "the weights (%.1f GiB per GPU%s) and activations (%.1f GiB) leave no room for the KV cache in %.1f GiB "
                 "(%.0f%% of %.1f GiB): use more GPUs, a smaller dtype or quantization",
                 o->weight_bytes_per_gpu / 1073741824.0, pp > 1 ? " on the fullest stage" : "",
                 o->activation_bytes_per_gpu / 1073741824.0, budget / 1073741824.0,
                 100 * (in->utilization > 0 ? in->utilization : 0.9), in->gpu_memory / 1073741824.0);
        return;
    }
    o->max_tokens = o->stage[worst].max_tokens;
    o->max_full_seqs = L > 0 ? floor(o->max_tokens / L) : 0;
    if (o->max_tokens < L) {
        snprintf(o->why, sizeof o->why,
                 "the KV cache holds %.0f tokens, less than one sequence of max_model_len %d: lower --max-model-len or add "
                 "memory",
                 o->max_tokens, L);
        return;
    }
    o->fits = 1;
}

double tl_cost_per_1k_requests(double prompt_tokens, double output_tokens, double in_price, double out_price) {
    return 1000.0 * (prompt_tokens * in_price + output_tokens * out_price) / 1e6;
}

double tl_selfhost_per_million(double gpus, double gpu_hourly, double output_tokens_per_s) {
    if (!(output_tokens_per_s > 0)) return INFINITY;
    return gpus * gpu_hourly / 3600.0 / output_tokens_per_s * 1e6;
}

double tl_break_even_requests_per_day(double gpus, double gpu_hourly, double fixed_monthly, double api_cost_per_request) {
    if (!(api_cost_per_request > 0)) return INFINITY;
    double per_day = gpus * gpu_hourly * 24.0 + fixed_monthly * 12.0 / 365.0;
    return per_day / api_cost_per_request;
}
