/* wk_forward.c - the forward pass over a batch of sequences (CPU kernels,
 * or the CUDA backend), and the tensor-parallel step plans the ranks follow. */
#include "wk_model.h"
#include "wk_cuda.h"
#include "wk_lora.h"
#include "wk_wire.h"
#include "cm_dtype.h"
#include "cm_quant.h"
#include "cm_hf_quant.h"
#include "cm_error.h"
#include "cm_log.h"
#include "cm_rope.h"
#include "cm_time.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- parallel element-wise helpers: rows split over the pool ---------- */

typedef struct {
    wk_model *m;
    int T, op;
    const float *w;
    float *dst, *src;
    int n;
    kn_act *act;
} rows_ctx;

enum { OP_NORM, OP_SILU, OP_GELU, OP_QUANT, OP_SWIGLU_OAI };

/* gpt-oss's clamped SwiGLU, a = (clamp(b) + 1) * g * sigmoid(alpha g) with g = min(a, limit) */
static void swiglu_oai(float *a, const float *b, int n, float alpha, float limit) {
    for (int i = 0; i < n; i++) {
        float g = a[i] < limit ? a[i] : limit, u = b[i] < -limit ? -limit : b[i] > limit ? limit : b[i];
        a[i] = (u + 1.f) * g / (1.f + expf(-alpha * g));
    }
}

static void rows_task(void *p, int ith, int nth) {
    rows_ctx *c = p;
    int r0 = c->T * ith / nth, r1 = c->T * (ith + 1) / nth;
    for (int r = r0; r < r1; r++) {
        size_t o = (size_t)r * (size_t)c->n;
        if (c->op == OP_NORM) kn_rmsnorm(c->dst + o, c->src + o, c->w, c->n, c->m->cfg.norm_eps);
        else if (c->op == OP_SILU) kn_silu_mul(c->dst + o, c->src + o, c->n);
        else if (c->op == OP_GELU) kn_gelu_mul(c->dst + o, c->src + o, c->n);
        else if (c->op == OP_SWIGLU_OAI)
            swiglu_oai(c->dst + o, c->src + o, c->n, c->m->cfg.swiglu_alpha, c->m->cfg.swiglu_limit);
    }
    if (c->op == OP_QUANT && r1 > r0) {
        kn_act sub = kn_act_view(c->act, r0);
        kn_quantize_act(&sub, c->src + (size_t)r0 * (size_t)c->n, r1 - r0);
    }
}

static void par_rows(wk_model *m, int op, int T, float *dst, float *src, const float *w, int n, kn_act *act) {
    rows_ctx c = {m, T, op, w, dst, src, n, act};
    if (T == 1) rows_task(&c, 0, 1);
    else kn_pool_run(m->pool, rows_task, &c);
    if (op == OP_QUANT) act->rows = T;
}

/* y_i = x[.perm] . W_i^T for act-order weights sharing one perm: the input gathered and quantized once. */
static void mm_perm(wk_model *m, int nw, const kn_weight *const *w, float *const *y, const float *x, int T) {
    int64_t k = w[0]->k;
    const int32_t *perm = w[0]->perm;
    for (int t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) m->xperm[t * k + j] = x[t * k + perm[j]];
    kn_act a = m->act_perm; /* the same memory at this row length */
    a.k = k;
    a.nblk = k / 32;
    int quant = 0;
    for (int i = 0; i < nw; i++) quant |= kn_weight_wants_act(w[i]);
    if (quant) par_rows(m, OP_QUANT, T, NULL, m->xperm, NULL, (int)k, &a);
    kn_matmul_multi(m->pool, nw, w, y, m->xperm, &a, T);
}

/* y = x . W^T for the listed weights, quantizing x once when needed. */
static void mm_plain(wk_model *m, int nw, const kn_weight *const *w, float *const *y, float *x, kn_act *act, int T) {
    int quant = 0;
    for (int i = 0; i < nw; i++) quant |= kn_weight_wants_act(w[i]);
    if (quant) par_rows(m, OP_QUANT, T, NULL, x, NULL, (int)act->k, act);
    if (m->act_hook)
        for (int i = 0; i < nw; i++) m->act_hook(m->act_hook_ctx, w[i], x, T);
    kn_matmul_multi(m->pool, nw, w, y, x, act, T);
}

/* The same, act-order weights (kn_weight.perm) apart: one gather for each distinct order. */
static void mm(wk_model *m, int nw, const kn_weight *const *w, float *const *y, float *x, kn_act *act, int T) {
    if (!m->perm_k) {
        mm_plain(m, nw, w, y, x, act, T);
        return;
    }
    const kn_weight *rest[4], *same[4];
    float *ry[4], *sy[4];
    int nr = 0, done[4] = {0};
    for (int i = 0; i < nw; i++) {
        if (!w[i]->perm) {
            rest[nr] = w[i], ry[nr++] = y[i];
            continue;
        }
        if (done[i]) continue;
        int ns = 0;
        for (int j = i; j < nw; j++)
            if (w[j]->perm == w[i]->perm) {
                if (m->act_hook) m->act_hook(m->act_hook_ctx, w[j], x, T);
                same[ns] = w[j], sy[ns++] = y[j], done[j] = 1;
            }
        mm_perm(m, ns, same, sy, x, T);
    }
    if (nr) mm_plain(m, nr, rest, ry, x, act, T);
}

/* Adds the bias (if any), rotates and stores K/V of every token of the step. */
static void qkv_post(wk_model *m, const wk_layer *L, wk_cache *c, int l, int T) {
    const cm_model_config *cf = &m->cfg;
    int hd = (int)cf->head_dim, nh = m->n_head_l, nkv = m->n_kv_l, QD = nh * hd, KVD = nkv * hd;
    size_t eb = kn_kv_elem_bytes(c->type), layer = (size_t)l * (size_t)c->n_blocks * c->block_stride;
    size_t mask = ((size_t)1 << c->block_shift) - 1;
    for (int t = 0; t < T; t++) {
        float *q = m->q + (size_t)t * QD, *k = m->k + (size_t)t * KVD, *v = m->v + (size_t)t * KVD;
        int pos = m->tok_pos[t];
        if (L->bq) for (int i = 0; i < QD; i++) q[i] += L->bq[i];
        if (L->bk) for (int i = 0; i < KVD; i++) k[i] += L->bk[i];
        if (L->bv) for (int i = 0; i < KVD; i++) v[i] += L->bv[i];
        if (L->q_norm)
            for (int h = 0; h < nh; h++) kn_rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, L->q_norm, hd, cf->norm_eps);
        if (L->k_norm)
            for (int h = 0; h < nkv; h++) kn_rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, L->k_norm, hd, cf->norm_eps);
        if (cf->attn_scale > 0) /* the kernel scales by 1/sqrt(hd): the rest here */
            for (int i = 0; i < QD; i++) q[i] *= cf->attn_scale * sqrtf((float)hd);
        kn_rope(q, nh, hd, (int)cf->rope_dim, cf->rope_type, pos, L->inv_freq);
        kn_rope(k, nkv, hd, (int)cf->rope_dim, cf->rope_type, pos, L->inv_freq);
        size_t off = layer + (size_t)m->tok_blocks[t][pos >> c->block_shift] * c->block_stride +
                     ((size_t)pos & mask) * (size_t)KVD * eb;
        kn_kv_store(c->type, c->k + off, k, KVD);
        kn_kv_store(c->type, c->v + off, v, KVD);
    }
}

/* The experts' FFN over the step's T normalised rows m->xb into m->xb2 (this rank's part of the sum, as a
 * dense down projection's). The router scores every expert for each token; a softmax over all of them weighs
 * the n_expert_used best (renormalised to sum 1 when the model says so). Then expert by expert, the tokens
 * that chose it are gathered into one GEMM, so each expert's weights are read once a step however many
 * tokens of the batch chose it (llama.cpp's mul_mat_id, vLLM's fused MoE, grouped by expert). */
static void moe_ffn(wk_model *m, const wk_layer *L, int T) {
    const cm_model_config *cf = &m->cfg;
    int D = (int)cf->dim, E = (int)cf->n_expert, K = (int)cf->n_expert_used, H = m->hidden_l;
    const kn_weight *rw = &L->router;
    float *rl = m->moe_logits;
    mm(m, 1, &rw, &rl, m->xb, &m->act_dim, T);
    for (int t = 0; t < T; t++) {
        float *s = rl + (size_t)t * E, sum = 0, kept = 0;
        if (L->router_b)
            for (int e = 0; e < E; e++) s[e] += L->router_b[e];
        float mx = s[0];
        for (int e = 1; e < E; e++) mx = s[e] > mx ? s[e] : mx;
        for (int e = 0; e < E; e++) sum += s[e] = expf(s[e] - mx);
        int *pe = m->moe_e + (size_t)t * K;
        float *pw = m->moe_w + (size_t)t * K;
        for (int j = 0; j < K; j++) { /* the best left, the lowest index on a tie (as torch.topk) */
            int b = 0;
            for (int e = 1; e < E; e++) b = s[e] > s[b] ? e : b;
            pe[j] = b;
            kept += pw[j] = s[b] / sum;
            s[b] = -1.f; /* below every probability: taken */
        }
        if (cf->expert_norm)
            for (int j = 0; j < K; j++) pw[j] /= kept;
    }
    memset(m->xb2, 0, sizeof(float) * (size_t)T * (size_t)D);
    for (int e = m->exp0; e < m->exp1; e++) { /* this rank's experts: every one but under expert parallelism */
        int n = 0;
        for (int i = 0; i < T * K; i++)
            if (m->moe_e[i] == e) m->moe_rows[n] = i / K, m->moe_slot[n++] = i;
        if (!n) continue;
        for (int i = 0; i < n; i++)
            memcpy(m->moe_x + (size_t)i * D, m->xb + (size_t)m->moe_rows[i] * D, sizeof(float) * (size_t)D);
        const kn_weight *gu[2] = {&L->xgate[e], &L->xup[e]}, *dn = &L->xdown[e];
        float *gu_out[2] = {m->hb, m->hb2}, *y = m->moe_y;
        mm(m, 2, gu, gu_out, m->moe_x, &m->act_dim, n);
        if (L->xgate_b) { /* gpt-oss: this rank's columns of the expert's biases */
            const float *gb = L->xgate_b + (size_t)e * cf->hidden + m->hid0, *ub = L->xup_b + (size_t)e * cf->hidden + m->hid0;
            for (int i = 0; i < n; i++)
                for (int j = 0; j < H; j++) m->hb[(size_t)i * H + j] += gb[j], m->hb2[(size_t)i * H + j] += ub[j];
        }
        par_rows(m, cf->gpt_oss ? OP_SWIGLU_OAI : OP_SILU, n, m->hb, m->hb2, NULL, H, NULL);
        mm(m, 1, &dn, &y, m->hb, &m->act_hidden, n);
        if (L->xdown_b && m->hid0 == 0) /* once over the ranks that split the expert's columns */
            for (int i = 0; i < n; i++)
                for (int d = 0; d < D; d++) y[(size_t)i * D + d] += L->xdown_b[(size_t)e * D + d];
        for (int i = 0; i < n; i++) {
            float w = m->moe_w[m->moe_slot[i]], *dst = m->xb2 + (size_t)m->moe_rows[i] * D, *src = y + (size_t)i * D;
            for (int d = 0; d < D; d++) dst[d] += w * src[d];
        }
    }
}

/* Sums a row-parallel matmul's partial results over the stage's ranks. */
static int reduce(wk_model *m, float *buf, size_t n) {
    return m->comm && m->tp_size > 1 ? m->comm->ops->all_reduce_sum(m->comm, buf, n) : 0;
}

static int bcast(wk_comm *c, void *buf, size_t bytes, int root) { return c->ops->broadcast(c, buf, bytes, root); }

/* A step's rows m->x [T][dim] coming into this rank's stage (after: going out of it): a first rank takes
 * them from the stage before and hands them to its stage, or sends them to the stage after. */
static int stage_hops(wk_model *m, int T, int after) {
    size_t bytes = sizeof(float) * (size_t)T * m->cfg.dim;
    if (after) return !m->tp_rank && m->next ? bcast(m->next, m->x, bytes, 0) : 0;
    if (!m->pp_rank) return 0;
    int rc = wk_wire_up(m, m->x, bytes);
    return rc ? rc : wk_wire_on(m, m->x, bytes, 0); /* to its stage only: a hop is between two stages */
}

/* The final norm and this rank's rows of the LM head over the first n rows of m->x into out [n][vocab_l]. */
static void lm_head(wk_model *m, int n, float *out) {
    par_rows(m, OP_NORM, n, m->xb, m->x, m->output_norm, (int)m->cfg.dim, NULL);
    const kn_weight *ow = &m->output;
    mm(m, 1, &ow, &out, m->xb, &m->act_dim, n);
}

/* Grows this rank's logits buffer (its vocabulary columns, under TP) to n rows. */
static int lm_grow(wk_model *m, int n) {
    if (n <= m->lm_rows) return 0;
    if (m->tp_size > 1) {
        float *a = realloc(m->lm_local, sizeof(float) * (size_t)n * (size_t)m->vocab_l);
        if (!a) return LLM_ENOMEM;
        m->lm_local = a;
    }
    m->lm_rows = n;
    return 0;
}

/* The LM head over n rows (lm_grow'n first), each of the stage's ranks its vocabulary columns, gathered on
 * its first rank into out [n][vocab] (the others' out is not written). */
static int head_gather(wk_model *m, int n, float *out) {
    if (m->device == WK_DEV_CUDA) return wk_cuda_head(m, n, m->tp_rank ? NULL : out);
    if (m->tp_size == 1) {
        lm_head(m, n, out);
        return 0;
    }
    lm_head(m, n, m->lm_local);
    return m->comm->ops->all_gather_cols(m->comm, m->lm_local, n, m->voc_width, m->tp_rank == 0 ? out : NULL);
}

/* The last stage's logits over the n rows that want them: the LM head, gathered on the stage's first rank
 * into a slot of the way back, whose thread sends it to the driver (which samples) while the stage goes on.
 * Overlapped or not, every step's logits go back this one way, in order. */
static int last_stage_logits(wk_model *m, int n) {
    int rc = 0;
    float *out = NULL;
    if (!m->tp_rank && !(out = wk_wire_back_buf(m, (size_t)n * m->cfg.vocab, &rc))) return rc;
    if ((rc = lm_grow(m, n)) || (rc = head_gather(m, n, out))) return rc;
    return m->tp_rank ? 0 : wk_wire_back_send(m);
}

/* A pipelined step's logits: the driver receives them, the last stage computes and sends them. */
static int stage_logits(wk_model *m, int n, float *logits) {
    if (wk_wire_driver(m)) return bcast(m->ring, logits, sizeof(float) * (size_t)n * m->cfg.vocab, 1);
    return m->pp_rank == m->pp_size - 1 ? last_stage_logits(m, n) : 0; /* a middle stage: no logits */
}

/* A step's rows set up (positions, block tables; stage 0 embeds the tokens, a later stage has received
 * its rows in m->x) and this stage's layers run over them; max_len: its longest sequence (check_batch). */
static int forward_layers(wk_model *m, wk_cache *c, int n_seq, const wk_batch_seq *s, int T, int max_len) {
    if (m->device == WK_DEV_CUDA) return wk_cuda_layers(m, c, n_seq, s, T, max_len); /* a stage on the GPU */
    const cm_model_config *cf = &m->cfg;
    int D = (int)cf->dim, H = m->hidden_l, rc;
    for (int i = 0, t = 0; i < n_seq; i++) {
        m->attn_seq[i] = (kn_attn_seq){s[i].n, s[i].pos0, t, s[i].blocks};
        for (int j = 0; j < s[i].n; j++, t++) {
            if (m->pp_rank == 0) { /* later stages receive the rows (stage_hops) */
                kn_get_row(&m->tok_embd, s[i].tokens[j], m->x + (size_t)t * D);
                if (cf->gemma) /* Gemma scales the embedding by sqrt(dim) (in fp32, as llama.cpp) */
                    for (int d = 0; d < D; d++) m->x[(size_t)t * D + d] *= sqrtf((float)D);
            }
            m->tok_pos[t] = s[i].pos0 + j;
            m->tok_blocks[t] = s[i].blocks;
        }
    }
    int lora = m->n_loras ? wk_lora_group(m, n_seq, s) : 0; /* the rows grouped by adapter, for every layer */
    if (lora < 0) return lora;
    for (uint32_t l = (uint32_t)m->layer0; l < (uint32_t)m->layer1; l++) {
        wk_layer *L = &m->layers[l];
        par_rows(m, OP_NORM, T, m->xb, m->x, L->attn_norm, D, NULL);
        const kn_weight *qkv[3] = {&L->wq, &L->wk, &L->wv};
        float *qkv_out[3] = {m->q, m->k, m->v};
        mm(m, 3, qkv, qkv_out, m->xb, &m->act_dim, T);
        int QDl = m->n_head_l * (int)cf->head_dim, KVDl = m->n_kv_l * (int)cf->head_dim;
        if (lora) {
            wk_lora_out o[3] = {{WK_LORA_Q, m->q, QDl}, {WK_LORA_K, m->k, KVDl}, {WK_LORA_V, m->v, KVDl}};
            wk_lora_apply(m, (int)l, 3, o, m->xb, D);
        }
        qkv_post(m, L, c, (int)l - m->layer0, T);
        size_t layer = (size_t)(l - (uint32_t)m->layer0) * (size_t)c->n_blocks * c->block_stride;
        kn_attn_args aa = {n_seq, m->attn_seq, m->n_head_l, m->n_kv_l, (int)cf->head_dim, c->type,
                           c->block_shift, m->attn_scratch_len, m->q, m->att, c->k + layer, c->v + layer, c->block_stride,
                           m->attn_scratch, L->window, L->sinks};
        kn_attention(m->pool, &aa);
        const kn_weight *wo = &L->wo;
        float *o_out = m->xb2;
        mm(m, 1, &wo, &o_out, m->att, &m->act_q, T);
        if (L->bo && m->head0 == 0) /* once over the ranks that split the heads */
            for (int t = 0; t < T; t++)
                for (int d = 0; d < D; d++) m->xb2[(size_t)t * D + d] += L->bo[d];
        if (lora) wk_lora_apply(m, (int)l, 1, &(wk_lora_out){WK_LORA_O, m->xb2, D}, m->att, QDl);
        if ((rc = reduce(m, m->xb2, (size_t)T * D))) return rc;
        if (L->post_attn_norm) par_rows(m, OP_NORM, T, m->xb2, m->xb2, L->post_attn_norm, D, NULL);
        for (size_t i = 0; i < (size_t)T * D; i++) m->x[i] += m->xb2[i];
        par_rows(m, OP_NORM, T, m->xb, m->x, L->ffn_norm, D, NULL);
        if (cf->n_expert) {
            moe_ffn(m, L, T);
        } else {
            const kn_weight *gu[2] = {&L->gate, &L->up};
            float *gu_out[2] = {m->hb, m->hb2};
            mm(m, 2, gu, gu_out, m->xb, &m->act_dim, T);
            if (lora) {
                wk_lora_out o[2] = {{WK_LORA_GATE, m->hb, H}, {WK_LORA_UP, m->hb2, H}};
                wk_lora_apply(m, (int)l, 2, o, m->xb, D);
            }
            par_rows(m, cf->gemma ? OP_GELU : OP_SILU, T, m->hb, m->hb2, NULL, H, NULL);
            const kn_weight *dn = &L->down;
            float *d_out = m->xb2;
            mm(m, 1, &dn, &d_out, m->hb, &m->act_hidden, T);
            if (lora) wk_lora_apply(m, (int)l, 1, &(wk_lora_out){WK_LORA_DOWN, m->xb2, D}, m->hb, H);
        }
        if ((rc = reduce(m, m->xb2, (size_t)T * D))) return rc;
        if (L->post_ffn_norm) par_rows(m, OP_NORM, T, m->xb2, m->xb2, L->post_ffn_norm, D, NULL);
        for (size_t i = 0; i < (size_t)T * D; i++) m->x[i] += m->xb2[i];
    }
    return 0;
}

/* The rows that want logits gathered to the front of m->x; how many. */
static int logit_rows(wk_model *m, int n_seq, const wk_batch_seq *s) {
    int n = 0, D = (int)m->cfg.dim, move = m->device != WK_DEV_CUDA; /* the GPU's rows stay on it */
    for (int i = 0, t = 0; i < n_seq; t += s[i].n, i++)
        for (int j = s[i].logits_from; j < s[i].n; j++, n++)
            if (move && n != t + j) memcpy(m->x + (size_t)n * D, m->x + (size_t)(t + j) * D, sizeof(float) * (size_t)D);
    return n;
}

/* One step of T tokens (T <= max_batch) from n_seq sequences. With tensor
 * parallelism every rank runs this with the same plan on its shard; logits
 * (vocabulary-parallel) are gathered on rank 0, whose `logits` is used. */
static int forward_step(wk_model *m, wk_cache *c, int n_seq, const wk_batch_seq *s, int T, int max_len,
                        float *logits) {
    int rc;
    if ((rc = stage_hops(m, T, 0)) || (rc = forward_layers(m, c, n_seq, s, T, max_len)) ||
        (rc = stage_hops(m, T, 1)))
        return rc;
    /* gather the rows that want logits, then one LM-head GEMM */
    int n = logit_rows(m, n_seq, s);
    if (!n) return 0;
    if (m->pp_size > 1) return stage_logits(m, n, logits);
    return (rc = lm_grow(m, n)) ? rc : head_gather(m, n, logits); /* one rank: straight into the caller's buffer */
}

/* ---- tensor parallel step plans ----------------------------------------
 * Rank 0 broadcasts each step: a header {magic, n_seq, n_copies, n_ints},
 * then n_ints int32: the copy-on-write pairs, then per sequence n, pos0,
 * logits_from, table length, LoRA adapter, its tokens and its blocks. A
 * keep-alive and a LoRA update (wk_model.h) are headers of their own. */

static int plan_grow(wk_model *m, size_t n) {
    if (n <= m->plan_cap) return 0;
    size_t cap = m->plan_cap ? m->plan_cap : 4096;
    while (cap < n) cap *= 2;
    int32_t *p = realloc(m->plan, sizeof(int32_t) * cap);
    if (!p) return LLM_ENOMEM;
    m->plan = p;
    m->plan_cap = cap;
    return 0;
}

/* The plan of a step into m->plan, its header into hdr. */
static int plan_build(wk_model *m, wk_cache *c, int n_seq, const wk_batch_seq *s, int32_t magic, int32_t hdr[4]) {
    size_t n = 2 * (size_t)c->n_copies;
    for (int i = 0; i < n_seq; i++) n += 5 + (size_t)s[i].n + (size_t)((s[i].pos0 + s[i].n + c->block_size - 1) >> c->block_shift);
    int rc = plan_grow(m, n);
    if (rc) return rc;
    int32_t *p = m->plan;
    if (c->n_copies) memcpy(p, c->copies, sizeof(int32_t) * 2 * (size_t)c->n_copies);
    p += 2 * c->n_copies;
    for (int i = 0; i < n_seq; i++) {
        int nb = (s[i].pos0 + s[i].n + c->block_size - 1) >> c->block_shift;
        *p++ = s[i].n;
        *p++ = s[i].pos0;
        *p++ = s[i].logits_from;
        *p++ = nb;
        *p++ = s[i].lora;
        memcpy(p, s[i].tokens, sizeof(int32_t) * (size_t)s[i].n);
        p += s[i].n;
        memcpy(p, s[i].blocks, sizeof(int32_t) * (size_t)nb);
        p += nb;
    }
    hdr[0] = magic, hdr[1] = n_seq, hdr[2] = c->n_copies, hdr[3] = (int32_t)n;
    c->n_copies = 0;
    return 0;
}

/* A built plan sent on (the driver's; chain: down the pipeline too, else to its stage only). */
static int plan_out(wk_model *m, int32_t hdr[4], int chain) {
    m->plan_t = cm_now();
    int rc = wk_wire_on(m, hdr, sizeof(int32_t) * 4, chain);
    return rc ? rc : wk_wire_on(m, m->plan, sizeof(int32_t) * (size_t)hdr[3], chain);
}

/* A step's sequences checked (ids, positions, adapters, the batch capacity); *T its tokens. The CPU's
 * attention scratch grows with the longest sequence seen, not per step (before the plan is sent: a failure
 * here must not leave the other ranks waiting for a step). */
static int check_batch(wk_model *m, int n_seq, const wk_batch_seq *s, int *T_out, int *max_out) {
    int T = 0, max_len = 1;
    if (n_seq <= 0) return LLM_EINVAL;
    for (int i = 0; i < n_seq; i++) {
        if (s[i].n <= 0 || s[i].pos0 < 0 || s[i].logits_from < 0 || s[i].logits_from > s[i].n ||
            s[i].lora < 0 || s[i].lora > m->n_loras || (s[i].lora && !m->loras[s[i].lora - 1]))
            return LLM_EINVAL;
        if ((int64_t)s[i].pos0 + s[i].n > (int64_t)m->cfg.ctx_len) return LLM_ERANGE;
        for (int j = 0; j < s[i].n; j++)
            if (s[i].tokens[j] < 0 || (uint32_t)s[i].tokens[j] >= m->cfg.vocab) return LLM_EINVAL;
        if (s[i].pos0 + s[i].n > max_len) max_len = s[i].pos0 + s[i].n;
        T += s[i].n;
        if (T > m->max_batch) return LLM_ERANGE;
    }
    if (m->device == WK_DEV_CPU && m->attn_scratch_len < max_len) {
        free(m->attn_scratch);
        m->attn_scratch = malloc(sizeof(float) * kn_attention_scratch(max_len) * (size_t)kn_pool_size(m->pool));
        if (!m->attn_scratch) {
            m->attn_scratch_len = 0;
            return LLM_ENOMEM;
        }
        m->attn_scratch_len = max_len;
    }
    *T_out = T;
    *max_out = max_len;
    return 0;
}

/* ---- pipeline stages, overlapped -------------------------------------
 * The driver runs stage 0 and the engine; while the later stages compute
 * the steps in flight (up to one a stage), stage 0 computes the next, of
 * other sequences (wk_engine's virtual engines). The driver sends a step's
 * plan to its own stage's ranks, runs their layers with them, then passes
 * the plan and the rows to stage 1. Each later stage's first rank takes
 * them from the stage before, hands them to its stage, runs its layers and
 * passes its rows on; the last stage runs the LM head too, gathers the
 * logits on its first rank and queues them for the ring (the way back,
 * wk_wire.h: a thread sends them, in order, while the stage takes the next
 * step's rows in). The driver collects the oldest step in flight after
 * launching one, or alone when there is nothing to launch: it takes the
 * next logits off the ring. The wires down are a chain and the way back
 * never holds it up, so no wait closes a cycle, for any number of stages. */
#define PLAN_PIPE 0x4c50504e

int wk_forward_pp(wk_model *m, wk_cache *c, int n_seq, const wk_batch_seq *s, float *prev, int prev_rows) {
    int rc, T = 0, max_len;
    int32_t hdr[4] = {PLAN_PIPE, 0, 0, 0};
    if (m->pp_size < 2 || !wk_wire_driver(m) || !m->next || !m->ring) return LLM_EINVAL;
    if (n_seq) {
        if ((rc = check_batch(m, n_seq, s, &T, &max_len)) || (rc = plan_build(m, c, n_seq, s, PLAN_PIPE, hdr)) ||
            (rc = plan_out(m, hdr, 0)) || (rc = forward_layers(m, c, n_seq, s, T, max_len)) ||
            (rc = bcast(m->next, hdr, sizeof hdr, 0)) ||
            (rc = bcast(m->next, m->plan, sizeof(int32_t) * (size_t)hdr[3], 0)) ||
            (rc = bcast(m->next, m->x, sizeof(float) * (size_t)T * m->cfg.dim, 0)))
            return rc;
    }
    return prev_rows ? bcast(m->ring, prev, sizeof(float) * (size_t)prev_rows * m->cfg.vocab, 1) : 0;
}

/* A rank's part of an overlapped step whose header and plan it has (and, a first rank, handed to its
 * stage). Stage 0's other ranks: the layers, with the driver. A later stage's first rank takes the rows in
 * and hands them to its stage, which runs its layers; then it passes the header, the plan and its rows on,
 * or (the last stage) the stage runs the LM head, the logits gathered on its first rank and queued for the
 * way back. */
static int follow_pipe(wk_model *m, wk_cache *c, int32_t hdr[4], int n_seq, const wk_batch_seq *s) {
    int rc, T = 0, max_len, last = m->pp_rank == m->pp_size - 1;
    if ((rc = check_batch(m, n_seq, s, &T, &max_len))) return rc;
    if (m->pp_rank == 0) return forward_layers(m, c, n_seq, s, T, max_len);
    size_t rows = sizeof(float) * (size_t)T * m->cfg.dim;
    if ((rc = wk_wire_up(m, m->x, rows)) || (rc = wk_wire_on(m, m->x, rows, 0)) ||
        (rc = forward_layers(m, c, n_seq, s, T, max_len)))
        return rc;
    if (!last) {
        if (m->tp_rank) return 0;
        if ((rc = bcast(m->next, hdr, sizeof(int32_t) * 4, 0)) ||
            (rc = bcast(m->next, m->plan, sizeof(int32_t) * (size_t)hdr[3], 0)))
            return rc;
        return bcast(m->next, m->x, rows, 0);
    }
    int n = logit_rows(m, n_seq, s);
    return n ? last_stage_logits(m, n) : 0;
}

int wk_forward_shutdown(wk_model *m) {
    int32_t hdr[4] = {WK_PLAN_MAGIC, 0, 0, 0};
    return wk_wire_down(m, hdr, sizeof hdr);
}

#define PLAN_KEEPALIVE (-1) /* n_seq of an empty step: rank 0 is idle, and alive */
int wk_forward_keepalive(wk_model *m) {
    wk_comm *w = m->next ? m->next : m->comm;
    if (!wk_wire_driver(m) || !wk_wire_grouped(m) || w->timeout_s <= 0) return 0;
    double t = cm_now();
    if (t - m->plan_t < w->timeout_s / 4) return 0;
    m->plan_t = t;
    int32_t hdr[4] = {WK_PLAN_MAGIC, PLAN_KEEPALIVE, 0, 0};
    return wk_wire_down(m, hdr, sizeof hdr);
}

int wk_forward_follow(wk_model *m, wk_cache *c, int *shutdown) {
    *shutdown = 0;
    int32_t hdr[4] = {0, 0, 0, 0}; /* the driver takes nothing in: it never follows */
    int rc = wk_wire_up(m, hdr, sizeof hdr);
    if (rc) return rc;
    /* an overlapped step goes on down the pipeline once this stage has run it (follow_pipe) */
    int pipe = hdr[0] == PLAN_PIPE && m->pp_size > 1;
    if ((rc = wk_wire_on(m, hdr, sizeof hdr, !pipe))) return rc;
    if (hdr[0] == WK_PLAN_MAGIC && hdr[1] == PLAN_KEEPALIVE && !hdr[2] && !hdr[3]) return 0;
    if (hdr[0] == WK_PLAN_MAGIC && hdr[1] == WK_PLAN_LORA) {
        char buf[1024];
        if (hdr[3] < 2 || (size_t)hdr[3] > sizeof buf) return LLM_EFORMAT;
        if ((rc = wk_wire_down(m, buf, (size_t)hdr[3]))) return rc;
        size_t nl = strnlen(buf, (size_t)hdr[3]);
        if (nl + 1 >= (size_t)hdr[3] || buf[hdr[3] - 1]) return LLM_EFORMAT;
        return wk_lora_follow(m, hdr[2], buf, buf + nl + 1);
    }
    if ((hdr[0] != WK_PLAN_MAGIC && !pipe) || hdr[1] < 0 || hdr[1] > m->max_batch || hdr[2] < 0 || hdr[3] < 0)
        return LLM_EFORMAT;
    if (hdr[1] == 0) {
        if (pipe) return LLM_EFORMAT; /* an overlapped step has sequences */
        *shutdown = 1;
        return 0;
    }
    if ((rc = plan_grow(m, (size_t)hdr[3])) || (rc = wk_wire_up(m, m->plan, sizeof(int32_t) * (size_t)hdr[3])) ||
        (rc = wk_wire_on(m, m->plan, sizeof(int32_t) * (size_t)hdr[3], !pipe)))
        return rc;
    const int32_t *p = m->plan, *end = m->plan + hdr[3];
    if (2 * (int64_t)hdr[2] > hdr[3]) return LLM_EFORMAT;
    for (int i = 0; i < hdr[2]; i++, p += 2) {
        if (p[0] < 0 || p[0] >= c->n_blocks || p[1] < 0 || p[1] >= c->n_blocks) return LLM_EFORMAT;
        wk_cache_copy(c, p[0], p[1]);
    }
    for (int i = 0; i < hdr[1]; i++) {
        if (end - p < 5) return LLM_EFORMAT;
        int n = p[0], nb = p[3], lora = p[4];
        if (n <= 0 || nb < 0 || lora < 0 || lora > m->n_loras || (lora && !m->loras[lora - 1]) ||
            end - p - 5 < (int64_t)n + nb)
            return LLM_EFORMAT;
        for (int k = 0; k < nb; k++)
            if (p[5 + n + k] < 0 || p[5 + n + k] >= c->n_blocks) return LLM_EFORMAT;
        if (((int64_t)p[1] + n + c->block_size - 1) >> c->block_shift > nb) return LLM_EFORMAT;
        m->plan_seqs[i] = (wk_batch_seq){p + 5, n, p[1], p + 5 + n, p[2], lora};
        p += 5 + n + nb;
    }
    return pipe ? follow_pipe(m, c, hdr, hdr[1], m->plan_seqs) : wk_forward_batch(m, c, hdr[1], m->plan_seqs, NULL);
}

int wk_forward_batch(wk_model *m, wk_cache *c, int n_seq, const wk_batch_seq *s, float *logits) {
    int T, max_len, rc = check_batch(m, n_seq, s, &T, &max_len);
    if (rc) return rc;
    if (wk_wire_driver(m) && wk_wire_grouped(m)) {
        int32_t hdr[4];
        if ((rc = plan_build(m, c, n_seq, s, WK_PLAN_MAGIC, hdr)) || (rc = plan_out(m, hdr, 1))) return rc;
    }
    if (m->device == WK_DEV_CUDA && m->pp_size == 1) return wk_cuda_forward(m, c, n_seq, s, T, max_len, logits);
    return forward_step(m, c, n_seq, s, T, max_len, logits);
}

int wk_forward(wk_model *m, wk_kv *kv, const int32_t *tokens, int T, float *logits, int all_logits) {
    if (T <= 0) return LLM_EINVAL;
    if (T > kv->ctx - kv->n) return LLM_ERANGE;
    for (int done = 0; done < T;) {
        int n = T - done < m->max_batch ? T - done : m->max_batch;
        int last = done + n == T;
        wk_batch_seq s = {tokens + done, n, kv->n, kv->blocks, n, 0};
        float *lg = NULL;
        if (all_logits) {
            lg = logits + (size_t)done * m->cfg.vocab;
            s.logits_from = 0;
        } else if (last) {
            lg = logits;
            s.logits_from = n - 1;
        }
        int rc = wk_forward_batch(m, kv->cache, 1, &s, lg);
        if (rc) return rc;
        kv->n += n;
        done += n;
    }
    return 0;
}
