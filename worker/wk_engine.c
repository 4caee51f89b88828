#include "wk_engine_int.h"
#include "wk_lora.h"
#include "wk_cuda.h"
#include "cm_error.h"
#include "cm_log.h"
#include "cm_time.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void wk_engine_opts_default(wk_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_num_seqs = 256;
    o->max_num_batched_tokens = 512;
    o->block_size = 16;
    o->kv_cache_bytes = (size_t)4 << 30;
    o->kv_type = KN_KV_F16;
    o->prefix_caching = 1;
    o->gpu_memory_utilization = 0.9f; /* vLLM's default */
    o->max_step_ms = 250;
    o->starve_ms = 10000;
    wk_spec_config_default(&o->spec);
}

const char *wk_finish_name(int f) {
    return f == WK_FINISH_STOP ? "stop" : f == WK_FINISH_LENGTH ? "length" : f == WK_FINISH_ABORT ? "abort" : NULL;
}

static size_t mem_total(void) {
    long pages = sysconf(_SC_PHYS_PAGES), ps = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && ps > 0 ? (size_t)pages * (size_t)ps : 0;
}

int wk_engine_create(wk_model *m, const wk_engine_opts *oi, wk_engine **out, char *err, size_t errlen) {
    *out = NULL;
    wk_engine *e = calloc(1, sizeof *e);
    if (!e) return LLM_ENOMEM;
    int rc = LLM_EINVAL;
    wk_cost_init(&e->cost);
    e->m = m;
    e->o = *oi;
    wk_engine_opts *o = &e->o;
    const cm_model_config *c = &m->cfg;
    if (o->max_model_len <= 0) o->max_model_len = (int)c->ctx_len;
    if (o->max_num_batched_tokens <= 0) o->max_num_batched_tokens = m->max_batch;
    if (o->max_num_seqs <= 0 || o->max_num_seqs > 65536) {
        snprintf(err, errlen, "max_num_seqs must be 1..65536, not %d", o->max_num_seqs);
        goto fail;
    }
    if (o->max_model_len > (int)c->ctx_len) {
        snprintf(err, errlen, "max_model_len %d exceeds the model's context of %u tokens", o->max_model_len, c->ctx_len);
        goto fail;
    }
    if (o->max_num_batched_tokens > m->max_batch) {
        snprintf(err, errlen, "max_num_batched_tokens %d exceeds the model's batch capacity %d",
                 o->max_num_batched_tokens, m->max_batch);
        goto fail;
    }
    if (o->block_size <= 0 || o->block_size > 1024 || (o->block_size & (o->block_size - 1))) {
        snprintf(err, errlen, "block size must be a power of two from 1 to 1024, not %d", o->block_size);
        goto fail;
    }
    if ((rc = wk_spec_config_check(&o->spec, err, errlen))) goto fail;
    rc = LLM_EINVAL;
    wk_model *dm = o->spec.method == WK_SPEC_DRAFT ? o->draft : NULL;
    if (o->spec.method == WK_SPEC_DRAFT) {
        if (!dm) {
            snprintf(err, errlen, "draft_model speculation needs the draft model loaded");
            goto fail;
        }
        if (dm->cfg.vocab != c->vocab ||
            (m->tok && dm->tok && cm_tok_fingerprint(m->tok) != cm_tok_fingerprint(dm->tok))) {
            snprintf(err, errlen,
                     "the draft model %s does not share the target's tokenizer (vocabulary %u vs %u tokens%s); a "
                     "draft must propose the target's tokens",
                     dm->file->path, dm->cfg.vocab, c->vocab, dm->cfg.vocab == c->vocab ? ", other tokens" : "");
            goto fail;
        }
        if (dm->device != m->device || dm->max_batch < o->max_num_batched_tokens) {
            snprintf(err, errlen, "the draft model must run on the target's device with its batch capacity");
            goto fail;
        }
        double wd = 0, wt = 0; /* weight bytes: what a decode reads */
        for (size_t i = 0; i < dm->file->n_tensors; i++) wd += (double)dm->file->tensors[i].nbytes;
        for (size_t i = 0; i < m->file->n_tensors; i++) wt += (double)m->file->tensors[i].nbytes;
        e->draft_cost = wt > 0 ? (float)(wd / wt) : 1.f;
    }
    if (o->kv_type < KN_KV_F32 || o->kv_type > KN_KV_BF16) {
        snprintf(err, errlen, "unknown KV cache type %d", o->kv_type);
        goto fail;
    }
    /* a draft model's cache has as many blocks as the target's: the budget is shared in that proportion */
    size_t per_tok = wk_kv_bytes_per_token(m, o->kv_type), per_tok_d = dm ? wk_kv_bytes_per_token(dm, o->kv_type) : 0,
           per_block = (per_tok + per_tok_d) * (size_t)o->block_size;
    int64_t full_seq_blocks = (o->max_model_len + o->block_size - 1) / o->block_size;
    int64_t nb = o->n_blocks;
    if (nb <= 0) {
        if (m->device == WK_DEV_CUDA) { /* what --gpu-memory-utilization leaves after weights and activations */
            long gb = 0;
            if ((rc = wk_cuda_kv_blocks(m, o->gpu_memory_utilization, per_block, &gb, err, errlen))) goto fail;
            nb = gb;
        } else {
            nb = (int64_t)(o->kv_cache_bytes / per_block);
        }
        int64_t useful = full_seq_blocks * o->max_num_seqs; /* more can never be used at once */
        if (nb > useful) nb = useful;
    }
    if (nb > (1 << 30)) nb = 1 << 30;
    if (nb < full_seq_blocks) {
        snprintf(err, errlen,
                 "the KV cache holds %lld tokens (%lld blocks of %d), less than one sequence of max_model_len %d; "
                 "raise --kv-cache-memory (needs %.1f MiB) or lower --max-model-len",
                 (long long)(nb * o->block_size), (long long)nb, o->block_size, o->max_model_len,
                 (double)full_seq_blocks * (double)per_block / 1048576.0);
        rc = LLM_ERANGE;
        goto fail;
    }
    size_t kv_bytes = (size_t)nb * per_block, weights = m->file->map_size, phys = mem_total();
    if (m->device == WK_DEV_CPU && phys && kv_bytes + weights > phys) {
        snprintf(err, errlen, "the KV cache (%.1f GiB) and the weights (%.1f GiB) exceed this machine's memory (%.1f GiB)",
                 (double)kv_bytes / 1073741824.0, (double)weights / 1073741824.0, (double)phys / 1073741824.0);
        rc = LLM_ENOMEM;
        goto fail;
    }
    o->n_blocks = (int)nb;
    if ((rc = wk_cache_create(m, o->kv_type, o->block_size, o->n_blocks, &e->cache))) {
        snprintf(err, errlen, "cannot allocate the KV cache (%zu bytes): %s", kv_bytes, cm_strerror(rc));
        goto fail;
    }
    if (dm && ((rc = wk_cache_create(dm, o->kv_type, o->block_size, o->n_blocks, &e->dcache)) ||
               (rc = wk_blocks_create(o->n_blocks, o->block_size, 0, &e->dblocks)))) {
        snprintf(err, errlen, "cannot allocate the draft model's KV cache: %s", cm_strerror(rc));
        goto fail;
    }
    if (dm) {
        e->dplan = malloc(sizeof *e->dplan * (size_t)o->max_num_batched_tokens);
        e->dmap = malloc(sizeof(int) * 2 * (size_t)o->max_num_batched_tokens);
        e->dend = malloc(sizeof(int) * (size_t)o->max_num_batched_tokens);
        if (!e->dplan || !e->dmap || !e->dend) {
            rc = LLM_ENOMEM;
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        CM_INFO("draft model %s: %u layers, dim %u, %zu KV bytes per token, %.3f of the target's weight bytes",
                dm->file->path, dm->cfg.n_layer, dm->cfg.dim, per_tok_d, (double)e->draft_cost);
    }
    if ((rc = wk_blocks_create(o->n_blocks, o->block_size, o->prefix_caching, &e->blocks)) ||
        (rc = wk_sample_ctx_init(&e->sc, (int)c->vocab))) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if ((rc = wk_offload_init(e, err, errlen))) goto fail;
    e->eog = malloc(sizeof(int32_t) * 64);
    e->plan = malloc(sizeof *e->plan * (size_t)o->max_num_batched_tokens);
    e->plan_seq = malloc(sizeof *e->plan_seq * (size_t)o->max_num_batched_tokens);
    e->row_copy = malloc(sizeof(float) * c->vocab);
    /* pipeline stages overlap their steps (wk_step.c): a step in flight a stage, the oldest collected once
     * each stage has one */
    e->pipe = m->pp_size > 1 ? m->pp_size : 0;
    if (e->pipe) CM_INFO("pipeline of %d stages: %d virtual engines, a step of each in flight at once", e->pipe, e->pipe);
    e->ve = e->pipe - 1;
    int fly_ok = 1;
    for (int i = 0; i < e->pipe && i < WK_MAX_STAGES; i++) {
        e->fly[i].plan = malloc(sizeof *e->fly[i].plan * (size_t)o->max_num_batched_tokens);
        e->fly[i].seq = malloc(sizeof *e->fly[i].seq * (size_t)o->max_num_batched_tokens);
        fly_ok &= e->fly[i].plan && e->fly[i].seq;
    }
    if (!e->eog || !e->plan || !e->plan_seq || !e->row_copy || !fly_ok || e->pipe > WK_MAX_STAGES) {
        rc = LLM_ENOMEM;
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < (int32_t)c->vocab && e->n_eog < 64; i++)
        if (cm_tok_is_eog(m->tok, i)) e->eog[e->n_eog++] = i;
    e->rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    e->st.kv_bytes_per_token = per_tok;
    CM_INFO("KV cache: %zu bytes per token (2 x %u layers x %d kv heads x %u head dim x %zu bytes), %d blocks of %d "
            "tokens = %.1f MiB, %lld tokens, %lld sequences of %d tokens",
            per_tok, m->layer1 - m->layer0, m->n_kv_l, c->head_dim, kn_kv_elem_bytes(o->kv_type), o->n_blocks, o->block_size,
            (double)kv_bytes / 1048576.0, (long long)nb * o->block_size, (long long)(nb / full_seq_blocks),
            o->max_model_len);
    *out = e;
    return 0;
fail:
    wk_engine_free(e);
    return rc;
}

static void seq_free(wk_engine *e, wk_seq *s) {
    if (!s) return;
    wk_blocks_release(e->blocks, &s->bs);
    wk_bseq_free(&s->bs);
    wk_draft_release(e, s);
    wk_bseq_free(&s->dbs);
    wk_guide_end(e->guide, s->gs);
    free(s->tok);
    free(s->text);
    free(s->lp);
    free(s);
}

static void req_free(wk_engine *e, wk_req *r) {
    wk_lora_ref(e->m, r->p.lora, -1);
    for (int i = 0; i < r->n_seqs; i++) seq_free(e, r->seqs[i]);
    free(r->stop_buf);
    free(r->stop_ids);
    free(r->end_ids);
    free(r->bias);
    free(r->plp);
    free(r);
}

void wk_engine_free(wk_engine *e) {
    if (!e) return;
    if (e->pipe)
        CM_INFO("pipeline of %d stages: %llu steps launched, up to %d in flight at once", e->pipe,
                (unsigned long long)e->launched, e->fly_peak);
    for (int i = 0; i < e->n_reqs; i++) req_free(e, e->reqs[i]);
    free(e->reqs);
    cm_idmap_free(&e->by_id);
    free(e->waiting);
    free(e->running);
    wk_blocks_free(e->blocks);
    wk_tier_free(e->tier);
    wk_cache_free(e->cache);
    wk_blocks_free(e->dblocks);
    wk_cache_free(e->dcache);
    free(e->dlogits);
    free(e->dplan);
    free(e->dmap);
    free(e->dend);
    wk_sample_ctx_free(&e->sc);
    for (int i = 0; i < e->n_psc; i++) wk_sample_ctx_free(&e->psc[i]);
    free(e->psc);
    free(e->draws);
    wk_guide_free(e->guide);
    free(e->eog);
    free(e->plan);
    free(e->plan_seq);
    free(e->logits);
    for (int i = 0; i < WK_MAX_STAGES; i++) {
        free(e->fly[i].plan);
        free(e->fly[i].seq);
        free(e->fly[i].logits);
    }
    free(e->row_copy);
    free(e->outs);
    free(e->otok);
    free(e->olp);
    free(e->otext);
    free(e->view);
    free(e);
}

/* ---- outputs ------------------------------------------------------------ */

/* Every entry that changes the engine comes through here: the engine has
 * one owner thread, and a second one is a bug that would corrupt it quietly,
 * so it stops the process loudly instead. */

void wk_eng_out_begin(wk_engine *e) {
    if (!e->owned) {
        e->owner = pthread_self();
        e->owned = 1;
    } else if (!pthread_equal(e->owner, pthread_self())) {
        CM_ERR("wk_engine touched from a second thread: the engine has one owner");
        abort();
    }
    if (!e->drained) return;
    e->n_outs = e->n_otok = e->n_olp = 0;
    e->n_otext = 0;
    e->drained = 0;
}

static int seq_text_reserve(wk_seq *s, size_t more) {
    GROW(s->text, s->text_cap, s->text_len + more + 1);
    return 0;
}

/* Reports what the sequence produced since the last report. */
int wk_eng_emit(wk_engine *e, wk_seq *s) {
    wk_req *r = s->req;
    int n_gen = s->n_tok - r->n_prompt, nt = n_gen - s->tok_sent;
    size_t upto = s->text_len;
    if (!s->finish && r->max_stop > 1) {
        /* hold back what could be the start of a stop string, on a character boundary */
        upto = s->text_len > r->max_stop - 1 ? s->text_len - (r->max_stop - 1) : 0;
        while (upto > s->text_sent && ((unsigned char)s->text[upto] & 0xC0) == 0x80) upto--;
        if (upto < s->text_sent) upto = s->text_sent;
    }
    size_t tl = upto - s->text_sent;
    if (!nt && !tl && !s->finish) return 0;
    int nplp = r->plp && !r->plp_sent && s->index == 0 ? r->n_prompt - 1 : 0;
    GROW(e->outs, e->cap_outs, e->n_outs + 1);
    GROW(e->otok, e->cap_otok, e->n_otok + nt);
    GROW(e->otext, e->cap_otext, e->n_otext + tl);
    if (r->p.logprobs >= 0 || nplp) GROW(e->olp, e->cap_olp, e->n_olp + nt + nplp);
    out_rec *o = &e->outs[e->n_outs++];
    *o = (out_rec){r->id, s->index, nt, e->n_otok, -1, s->finish, r->n_prompt, n_gen, r->cached, s->stop_str, s->stop_tok,
                   e->n_otext, tl, -1, 0, 0};
    if (nplp) {
        o->plp_off = e->n_olp;
        o->n_plp = nplp;
        memcpy(e->olp + e->n_olp, r->plp, sizeof(wk_token_lp) * (size_t)nplp);
        e->n_olp += nplp;
        r->plp_sent = 1;
    }
    if (nt) memcpy(e->otok + e->n_otok, s->tok + r->n_prompt + s->tok_sent, sizeof(int32_t) * (size_t)nt);
    e->n_otok += nt;
    if (r->p.logprobs >= 0) {
        o->lp_off = e->n_olp;
        if (nt) memcpy(e->olp + e->n_olp, s->lp, sizeof(wk_token_lp) * (size_t)nt);
        e->n_olp += nt;
        s->n_lp = 0;
    }
    if (tl) memcpy(e->otext + e->n_otext, s->text + s->text_sent, tl);
    e->n_otext += tl;
    s->tok_sent = n_gen;
    s->text_sent = upto;
    return 0;
}

/* The request is going: its newest output (its last choice's end, emitted
 * just now) says so, so the caller frees the id on it whatever number of
 * choices ever ran. */
static void mark_last(wk_engine *e, const wk_req *r) {
    for (int i = e->n_outs - 1; i >= 0; i--)
        if (e->outs[i].id == r->id) {
            e->outs[i].last = 1;
            return;
        }
}

int wk_engine_outputs(wk_engine *e, const wk_output **out) {
    wk_eng_out_begin(e);
    if (e->n_outs > e->cap_view) {
        wk_output *v = realloc(e->view, sizeof *v * (size_t)e->n_outs);
        if (!v) return LLM_ENOMEM;
        e->view = v;
        e->cap_view = e->n_outs;
    }
    for (int i = 0; i < e->n_outs; i++) {
        const out_rec *o = &e->outs[i];
        e->view[i] = (wk_output){o->id, o->index, o->n_tokens, e->otok + o->tok_off,
                                 o->lp_off >= 0 ? e->olp + o->lp_off : NULL,
                                 o->plp_off >= 0 ? e->olp + o->plp_off : NULL, o->n_plp, e->otext + o->text_off,
                                 o->text_len, o->finish, o->stop_str, o->stop_tok, o->prompt_tokens,
                                 o->completion_tokens, o->cached_tokens, o->last};
    }
    *out = e->view;
    e->drained = 1;
    return e->n_outs;
}

/* ---- requests ----------------------------------------------------------- */

static wk_seq *seq_new(wk_req *r, int index, const int32_t *tok, int n) {
    wk_seq *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->req = r;
    s->index = index;
    s->stop_str = s->stop_tok = -1;
    s->cap = r->n_prompt + (r->p.max_tokens > 0 ? r->p.max_tokens : 16) + 1;
    s->tok = malloc(sizeof(int32_t) * (size_t)s->cap);
    if (!s->tok) {
        free(s);
        return NULL;
    }
    memcpy(s->tok, tok, sizeof(int32_t) * (size_t)n);
    s->n_tok = n;
    s->bs.salt = r->p.cache_salt;
    s->spec_rate = 1.f;
    return s;
}

#define BAD(...)                                                                                   \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        return LLM_EINVAL;                                                                         \
    } while (0)

static int check_params(const wk_engine *e, const wk_params *p, char *err, size_t errlen) {
    int V = (int)e->m->cfg.vocab;
    const wk_sample_params *s = &p->s;
    if (!(s->temperature >= 0) || s->temperature > 100) BAD("temperature must be between 0 and 100");
    if (!(s->top_p > 0 && s->top_p <= 1)) BAD("top_p must be in (0, 1]");
    if (!(s->min_p >= 0 && s->min_p <= 1)) BAD("min_p must be in [0, 1]");
    if (s->top_k < -1) BAD("top_k must be -1 (off) or positive");
    if (!(fabsf(s->presence_penalty) <= 2)) BAD("presence_penalty must be in [-2, 2]");
    if (!(fabsf(s->frequency_penalty) <= 2)) BAD("frequency_penalty must be in [-2, 2]");
    if (!(s->repetition_penalty > 0 && s->repetition_penalty <= 100)) BAD("repetition_penalty must be in (0, 100]");
    if (s->n_bias < 0 || s->n_bias > WK_MAX_BIAS) BAD("logit_bias has more than %d entries", WK_MAX_BIAS);
    for (int i = 0; i < s->n_bias; i++) {
        if (s->bias[i].id < 0 || s->bias[i].id >= V) BAD("logit_bias token %d is not in the vocabulary", s->bias[i].id);
        if (!(fabsf(s->bias[i].bias) <= 100)) BAD("logit_bias values must be in [-100, 100]");
    }
    if (p->n < 1 || p->n > WK_MAX_N) BAD("n must be 1..%d", WK_MAX_N);
    if (p->max_tokens < 0) BAD("max_tokens must be positive");
    if (p->min_tokens < 0 || (p->max_tokens && p->min_tokens > p->max_tokens)) BAD("min_tokens must be in [0, max_tokens]");
    if (p->logprobs < -1 || p->logprobs > WK_MAX_LOGPROBS) BAD("logprobs must be 0..%d", WK_MAX_LOGPROBS);
    if (p->n_stop < 0 || p->n_stop > WK_MAX_STOP) BAD("at most %d stop strings", WK_MAX_STOP);
    for (int i = 0; i < p->n_stop; i++) {
        size_t l = p->stop[i] ? strlen(p->stop[i]) : 0;
        if (l == 0 || l > WK_MAX_STOP_LEN) BAD("stop strings must be 1..%d bytes", WK_MAX_STOP_LEN);
    }
    if (p->n_stop_ids < 0 || p->n_stop_ids > WK_MAX_STOP_IDS) BAD("at most %d stop token ids", WK_MAX_STOP_IDS);
    if (p->grammar && p->grammar_len > CM_GRAMMAR_MAX_TEXT) BAD("the grammar is longer than %d bytes", CM_GRAMMAR_MAX_TEXT);
    if (p->prompt_logprobs < -1 || p->prompt_logprobs > WK_MAX_LOGPROBS) BAD("prompt_logprobs must be 0..%d", WK_MAX_LOGPROBS);
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= V) BAD("stop token id %d is not in the vocabulary", p->stop_ids[i]);
    return 0;
}

static wk_req *find_req(const wk_engine *e, uint64_t id) { return cm_idmap_get(&e->by_id, id); }

static int resume(wk_engine *e, wk_seq *s, const int32_t *out, int n, size_t text_sent, char *err, size_t errlen);

int wk_engine_add(wk_engine *e, uint64_t id, const int32_t *prompt, int n_prompt, const wk_params *p, char *err,
                  size_t errlen) {
    wk_eng_out_begin(e);
    int rc;
    if ((rc = check_params(e, p, err, errlen))) return rc;
    if (p->n_resume < 0 || p->n_resume >= n_prompt) BAD("a resumed output of %d tokens needs a prompt before it", p->n_resume);
    if (p->n_resume && (p->n != 1 || p->prompt_logprobs >= 0)) BAD("a resumed request has n = 1 and no prompt_logprobs");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || (uint32_t)prompt[i] >= e->m->cfg.vocab)
            BAD("prompt token %d at position %d is not in the vocabulary of %u", prompt[i], i, e->m->cfg.vocab);
    const int32_t *resumed = prompt + n_prompt - p->n_resume;
    n_prompt -= p->n_resume;
    if (n_prompt <= 0) BAD("the prompt is empty");
    int L = e->o.max_model_len;
    if (n_prompt >= L) {
        snprintf(err, errlen, "this model's maximum context length is %d tokens; the prompt has %d", L, n_prompt);
        return LLM_ERANGE;
    }
    if (p->max_tokens && (int64_t)n_prompt + p->max_tokens > L) {
        snprintf(err, errlen,
                 "this model's maximum context length is %d tokens, but %d were requested (%d in the prompt, %d "
                 "for the completion)",
                 L, n_prompt + p->max_tokens, n_prompt, p->max_tokens);
        return LLM_ERANGE;
    }
    if (find_req(e, id)) {
        snprintf(err, errlen, "request id %llu is already running", (unsigned long long)id);
        return LLM_EAGAIN;
    }
    GROW(e->reqs, e->cap_reqs, e->n_reqs + 1);
    wk_req *r = calloc(1, sizeof *r);
    if (!r) return LLM_ENOMEM;
    r->id = id;
    r->arrival = ++e->arrivals;
    r->queued_at = cm_now();
    r->p = *p;
    wk_lora_ref(e->m, r->p.lora, 1); /* the adapter stays while the request does */
    r->n_prompt = n_prompt;
    if (!r->p.max_tokens) r->p.max_tokens = L - n_prompt;
    size_t sl = 0;
    for (int i = 0; i < p->n_stop; i++) sl += strlen(p->stop[i]) + 1;
    r->stop_buf = malloc(sl + 1);
    r->stop_ids = malloc(sizeof(int32_t) * (size_t)(p->n_stop_ids + 1));
    r->bias = malloc(sizeof(wk_bias) * (size_t)(p->s.n_bias + 1));
    r->end_ids = malloc(sizeof(int32_t) * (size_t)(p->n_stop_ids + e->n_eog + 1));
    if (!r->stop_buf || !r->stop_ids || !r->bias || !r->end_ids) goto oom;
    for (int i = 0; i < p->n_stop_ids; i++) r->end_ids[r->n_end_ids++] = p->stop_ids[i];
    if (!p->ignore_eos)
        for (int i = 0; i < e->n_eog; i++) r->end_ids[r->n_end_ids++] = e->eog[i];
    for (int i = 0, o = 0; i < p->n_stop; i++) {
        size_t l = strlen(p->stop[i]);
        memcpy(r->stop_buf + o, p->stop[i], l + 1);
        r->p.stop[i] = r->stop_buf + o;
        o += (int)l + 1;
        if (l > r->max_stop) r->max_stop = l;
    }
    if (p->n_stop_ids) memcpy(r->stop_ids, p->stop_ids, sizeof(int32_t) * (size_t)p->n_stop_ids);
    r->p.stop_ids = r->stop_ids;
    if (p->s.n_bias) memcpy(r->bias, p->s.bias, sizeof(wk_bias) * (size_t)p->s.n_bias);
    r->p.s.bias = r->bias;
    if (!p->has_seed) r->p.seed = wk_rng_next(&e->rng);
    wk_seq *s = seq_new(r, 0, prompt, n_prompt);
    if (!s) goto oom;
    r->seqs[0] = s;
    r->n_seqs = r->n_live = 1;
    r->p.grammar = NULL; /* the parse holds what it needs */
    if (p->prompt_logprobs >= 0 && n_prompt > 1 && !(r->plp = calloc((size_t)n_prompt - 1, sizeof *r->plp))) goto oom;
    if (p->grammar) {
        rc = e->guide ? 0 : wk_guide_create(e->m->tok, e->eog, e->n_eog, &e->guide);
        if (!rc) rc = wk_guide_begin(e->guide, p->grammar, p->grammar_len, &s->gs, err, errlen);
        if (rc) {
            req_free(e, r);
            if (rc == LLM_ENOMEM) snprintf(err, errlen, "out of memory");
            return rc;
        }
    }
    s->rng = wk_rng_seed(r->p.seed, 0);
    if (p->n_resume && (rc = resume(e, s, resumed, p->n_resume, p->resume_text, err, errlen))) {
        req_free(e, r);
        if (rc == LLM_ENOMEM) snprintf(err, errlen, "out of memory");
        return rc;
    }
    if (s->finish) { /* the output it resumes had ended: only its end is reported */
        wk_eng_seq_finish(e, s, s->finish);
        rc = wk_eng_emit(e, s);
        mark_last(e, r);
        e->st.requests_finished++;
        req_free(e, r);
        return rc;
    }
    if (cm_idmap_put(&e->by_id, id, r)) goto oom;
    if (wk_eng_push_waiting(e, s)) {
        cm_idmap_del(&e->by_id, id);
        goto oom;
    }
    r->at = e->n_reqs;
    e->reqs[e->n_reqs++] = r;
    return 0;
oom:
    req_free(e, r);
    snprintf(err, errlen, "out of memory");
    return LLM_ENOMEM;
}

/* Ends a sequence: frees its blocks now; the request goes when its last choice does. */
void wk_eng_seq_finish(wk_engine *e, wk_seq *s, int finish) {
    if (s->state == S_WAITING) wk_eng_remove_from(e->waiting, &e->n_waiting, s);
    else if (s->state == S_RUNNING) wk_eng_remove_from(e->running, &e->n_running, s);
    s->state = S_DONE;
    s->finish = finish;
    wk_blocks_release(e->blocks, &s->bs);
    wk_draft_release(e, s);
    s->req->n_live--;
}

void wk_eng_req_drop(wk_engine *e, wk_req *r) {
    if (find_req(e, r->id) != r) return;
    mark_last(e, r);
    cm_idmap_del(&e->by_id, r->id);
    e->reqs[r->at] = e->reqs[--e->n_reqs];
    e->reqs[r->at]->at = r->at;
    req_free(e, r);
}

int wk_engine_abort(wk_engine *e, uint64_t id) {
    wk_eng_out_begin(e);
    wk_req *r = find_req(e, id);
    if (!r) return LLM_ENOTFOUND;
    for (int k = 0; k < e->n_fly; k++) { /* a step in flight: its rows come back to no one */
        struct wk_fly *f = &e->fly[(e->fly0 + k) % e->pipe];
        for (int i = 0; i < f->n; i++)
            if (f->seq[i] && f->seq[i]->req == r) f->seq[i] = NULL;
    }
    for (int i = 0; i < r->n_seqs; i++) {
        wk_seq *s = r->seqs[i];
        if (s->state == S_DONE) continue;
        wk_eng_seq_finish(e, s, WK_FINISH_ABORT);
        s->text_sent = s->text_len; /* nothing more is delivered */
        s->tok_sent = s->n_tok - r->n_prompt;
        s->n_lp = 0;
        wk_eng_emit(e, s);
    }
    e->st.requests_aborted++;
    wk_eng_req_drop(e, r);
    return 0;
}

int wk_engine_has_work(const wk_engine *e) {
    return e->n_waiting + e->n_running + e->n_fly > 0;
}

/* ---- after the forward: sampling and stopping ------------------------- */

static int is_stop_token(const wk_engine *e, const wk_req *r, int32_t t) {
    for (int i = 0; i < r->p.n_stop_ids; i++)
        if (r->p.stop_ids[i] == t) return 1;
    if (r->p.ignore_eos) return 0;
    for (int i = 0; i < e->n_eog; i++)
        if (e->eog[i] == t) return 1;
    return 0;
}

/* Appends the sampled token, updates the text and decides whether it ends. */
static int accept(wk_engine *e, wk_seq *s, int32_t t, const wk_token_lp *lp) {
    wk_req *r = s->req;
    GROW(s->tok, s->cap, s->n_tok + 1);
    s->tok[s->n_tok++] = t;
    if (lp) {
        GROW(s->lp, s->lp_cap, s->n_lp + 1);
        s->lp[s->n_lp++] = *lp;
    }
    e->st.tokens_generated++;
    int n_gen = s->n_tok - r->n_prompt;
    if (is_stop_token(e, r, t)) {
        s->finish = WK_FINISH_STOP;
        for (int i = 0; i < r->p.n_stop_ids; i++) /* one of the request's: vLLM reports it */
            if (r->p.stop_ids[i] == t) s->stop_tok = t;
    } else {
        const char *piece;
        size_t pl = 0;
        cm_tok_piece(e->m->tok, t, 0, &piece, &pl);
        if (seq_text_reserve(s, pl + 64)) return LLM_ENOMEM;
        size_t before = s->text_len;
        s->text_len += cm_detok_push(&s->dt, e->m->tok, t, s->text + s->text_len, s->text_cap - s->text_len - 1);
        if (r->p.n_stop && s->text_len > before) {
            /* a stop string may begin in text emitted by earlier tokens */
            size_t from = before > r->max_stop - 1 ? before - (r->max_stop - 1) : 0, best = (size_t)-1;
            s->text[s->text_len] = 0;
            int which = -1;
            for (int i = 0; i < r->p.n_stop; i++) {
                const char *hit = strstr(s->text + from, r->p.stop[i]);
                if (hit && (size_t)(hit - s->text) < best) best = (size_t)(hit - s->text), which = i;
            }
            if (best != (size_t)-1 && !s->gs) {
                s->text_len = best;
                s->finish = WK_FINISH_STOP;
                s->stop_str = which;
            } else if (best != (size_t)-1 && cm_gstate_complete(s->gs)) {
                s->finish = WK_FINISH_STOP; /* under a grammar: once the output is whole, and never cut */
                s->stop_str = which;
            }
        }
    }
    if (!s->finish && (n_gen >= r->p.max_tokens || s->n_tok >= e->o.max_model_len)) s->finish = WK_FINISH_LENGTH;
    if (s->finish == WK_FINISH_LENGTH) { /* a cut-off character still goes out, as bytes */
        if (seq_text_reserve(s, 64)) return LLM_ENOMEM;
        s->text_len += cm_detok_flush(&s->dt, s->text + s->text_len, s->text_cap - s->text_len - 1);
    }
    return 0;
}

/* A moved request's delivered output, taken as if sampled here: the text,
 * the stop checks and the parse all advance; nothing is reported again. */
static int resume(wk_engine *e, wk_seq *s, const int32_t *out, int n, size_t text_sent, char *err, size_t errlen) {
    wk_req *r = s->req;
    cm_detok_init(&s->dt, e->m->tok);
    s->dt.first = 0;
    uint64_t generated = e->st.tokens_generated;
    int rc = 0;
    for (int i = 0; i < n && !s->finish && !rc; i++) {
        int done = 0;
        if (s->gs && !is_stop_token(e, r, out[i]) && (done = wk_guide_advance(e->guide, s->gs, out[i])) < 0) {
            snprintf(err, errlen, "the resumed output's token %d (at %d) does not fit the grammar", out[i], i);
            return LLM_EINVAL;
        }
        rc = accept(e, s, out[i], NULL);
        if (!rc && done && !s->finish) s->finish = WK_FINISH_STOP;
        /* the draw that chose it (one a token when sampling): a seeded request goes on with the numbers it
         * would have drawn next had it run here from the start (a grammar's redraws aside) */
        if (r->p.s.temperature > 0) wk_rng_next(&s->rng);
    }
    e->st.tokens_generated = generated;
    if (rc) return rc;
    if (text_sent > s->text_len) BAD("resume_text_bytes %zu is past the %zu bytes of the resumed output's text", text_sent,
                                     s->text_len);
    s->tok_sent = s->n_tok - r->n_prompt;
    s->text_sent = text_sent;
    return 0;
}

/* The ends a sequence may not draw yet (min_tokens). */
static const int32_t *end_mask(const wk_seq *s, int *n) {
    const wk_req *r = s->req;
    *n = s->n_tok - r->n_prompt < r->p.min_tokens ? r->n_end_ids : 0;
    return *n ? r->end_ids : NULL;
}

int32_t wk_eng_draw(wk_seq *s, wk_sample_ctx *sc, float *row, wk_token_lp *lp) {
    const wk_req *r = s->req;
    int n_mask, nlp = r->p.logprobs;
    const int32_t *mask = end_mask(s, &n_mask);
    return wk_sample_next(sc, &r->p.s, &s->rng, row, s->tok, r->n_prompt, s->tok + r->n_prompt, s->n_tok - r->n_prompt,
                          mask, n_mask, nlp > 0 ? nlp : 0, nlp >= 0 ? lp : NULL);
}

int wk_eng_accept(wk_engine *e, wk_seq *s, int32_t t, const wk_token_lp *lp) {
    return accept(e, s, t, s->req->p.logprobs >= 0 ? lp : NULL);
}

int wk_eng_sample(wk_engine *e, wk_seq *s, float *row) {
    wk_req *r = s->req;
    int n_gen = s->n_tok - r->n_prompt, n_mask;
    const int32_t *mask = end_mask(s, &n_mask);
    wk_token_lp lp;
    int nlp = r->p.logprobs, done = 0;
    int32_t t;
    if (s->gs) {
        t = wk_guide_sample(e->guide, s->gs, &e->sc, &r->p.s, &s->rng, row, s->tok, r->n_prompt, s->tok + r->n_prompt,
                            n_gen, mask, n_mask, r->p.stop_ids, r->p.n_stop_ids, nlp > 0 ? nlp : 0, nlp >= 0 ? &lp : NULL);
        if (t < 0) return t;
        /* a stop id ends the choice (sampled only once the output is whole): its text is not parsed */
        if (!is_stop_token(e, r, t) && (done = wk_guide_advance(e->guide, s->gs, t)) < 0) {
            if (done != LLM_EINVAL) return done;
            /* the parse broke: this choice ends, never the step (nor the worker) */
            CM_ERR("request %llu choice %d: its grammar refused the token sampled under it (%d); aborted",
                   (unsigned long long)r->id, s->index, t);
            s->finish = WK_FINISH_ABORT;
            return 0;
        }
    } else {
        t = wk_eng_draw(s, &e->sc, row, &lp);
    }
    int rc = accept(e, s, t, nlp >= 0 ? &lp : NULL);
    if (!rc && done && !s->finish) s->finish = WK_FINISH_STOP; /* the grammar allows nothing more */
    return rc;
}

/* After a prompt's prefill, choices 1..n-1 fork from choice 0: they share
 * every block (the partial last one is copied when first written). */
int wk_eng_fork(wk_engine *e, wk_seq *s0) {
    wk_req *r = s0->req;
    r->forked = 1;
    for (int i = 1; i < r->p.n; i++) {
        wk_seq *c = seq_new(r, i, s0->tok, s0->n_tok);
        if (!c) return LLM_ENOMEM;
        r->seqs[r->n_seqs++] = c;
        r->n_live++;
        c->rng = wk_rng_seed(r->p.seed, i);
        c->n_computed = s0->n_computed;
        cm_detok_init(&c->dt, e->m->tok);
        c->dt.first = 0;
        int rc = s0->gs ? wk_guide_fork(e->guide, s0->gs, &c->gs) : 0;
        if (!rc) rc = wk_blocks_fork(e->blocks, &s0->bs, &c->bs);
        if (!rc) rc = wk_eng_push_running(e, c);
        if (rc) return rc;
        c->ve = s0->ve; /* its prompt's blocks, and its steps, are its first choice's */
    }
    return 0;
}

/* A speculating decode's K + 1 rows (rows[K+1][V]): each is drawn as plain
 * decoding would draw it, in order, keeping drafts up to the first draw
 * that differs (that draw, or the bonus after the last draft, is the step's
 * own token). Then only the positions whose input was kept stay computed:
 * the surplus blocks go and the prefix cache keys nothing past them. */
int wk_eng_verify(wk_engine *e, wk_seq *s, float *rows) {
    int k = s->n_draft, base = s->n_computed, drawn = 0, accepted = 0, rc;
    size_t V = e->m->cfg.vocab;
    for (int j = 0; j <= k; j++) {
        if ((rc = wk_eng_sample(e, s, rows + (size_t)j * V))) return rc;
        drawn++;
        int hit = j < k && s->tok[s->n_tok - 1] == s->draft[j];
        accepted += hit;
        if (!hit || s->finish) break;
    }
    s->n_computed = base + drawn; /* inputs: the last token, then the kept drafts */
    wk_draft_keep(e, s, base + 1 + accepted);
    if ((rc = wk_blocks_truncate(e->blocks, &s->bs, s->n_computed + 1))) return rc;
    wk_blocks_commit(e->blocks, &s->bs, s->tok, s->n_computed);
    e->st.spec_drafts++;
    e->st.spec_draft_tokens += (uint64_t)k;
    e->st.spec_accepted_tokens += (uint64_t)accepted;
    for (int j = 0; j < accepted; j++) e->st.spec_accepted_pos[j]++;
    s->spec_k = wk_spec_next_k(k, accepted, e->o.spec.k);
    s->spec_rate = 0.7f * s->spec_rate + 0.3f * (float)accepted / (float)k;
    /* a run of proposals with nothing taken (free text, where earlier n-grams do not predict) backs off
       1, 3, 7, 15, 31 decodes before the next; one taken draft brings it back at once */
    s->spec_miss = accepted ? 0 : s->spec_miss + 1;
    s->spec_wait = accepted ? 0 : (1 << (s->spec_miss < 5 ? s->spec_miss : 5)) - 1;
    return 0;
}

/* n prompt tokens from position p0, cut in chunks as the scheduler would
 * (sized at their middle), each step with its fixed part. */
static double estimate(const wk_engine *e, int p0, int n) {
    if (!wk_cost_known(&e->cost) || n <= 0) return 0;
    int chunk = e->o.max_num_batched_tokens;
    if (e->o.max_step_ms > 0 && !e->o.step_decoding_only)
        chunk = wk_cost_max_chunk(&e->cost, e->o.max_step_ms, 0, 0, p0 + n / 2, MIN_PREFILL_CHUNK, chunk);
    double steps = (double)((n + chunk - 1) / chunk);
    return wk_cost_predict(&e->cost, n, wk_cost_attended(p0, n)) + wk_cost_predict(&e->cost, 0, 0) * (steps - 1);
}

double wk_engine_prefill_estimate_ms(const wk_engine *e, int n) { return estimate(e, 0, n); }

double wk_engine_prompt_estimate_ms(const wk_engine *e, const int32_t *prompt, int n, uint64_t salt) {
    int hit = wk_blocks_cached(e->blocks, salt, prompt, n);
    return estimate(e, hit, n - hit);
}

void wk_engine_get_stats(const wk_engine *e, wk_engine_stats *st) {
    *st = e->st;
    st->waiting = e->n_waiting;
    st->running = e->n_running;
    wk_blocks_stats b;
    wk_blocks_get_stats(e->blocks, &b);
    st->blocks_total = b.total;
    st->blocks_free = b.free;
    st->blocks_cached = b.cached;
    st->prefix_queries = b.queries;
    st->prefix_hits = b.hits;
}

int wk_engine_events(wk_engine *e, wk_kv_event *out, int max) {
    return wk_blocks_events(e->blocks, out, max);
}

void wk_engine_each_key(const wk_engine *e, void (*fn)(void *ctx, uint64_t key), void *ctx) {
    wk_blocks_each_key(e->blocks, fn, ctx);
}

const wk_model *wk_engine_model(const wk_engine *e) { return e->m; }

wk_model *wk_engine_model_rw(wk_engine *e) { return e->m; }
int wk_engine_idle(wk_engine *e) { return wk_forward_keepalive(e->m); }
wk_cache *wk_engine_cache(wk_engine *e) { return e->cache; }
const wk_engine_opts *wk_engine_options(const wk_engine *e) { return &e->o; }
