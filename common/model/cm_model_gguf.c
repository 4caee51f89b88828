/* cm_model_gguf.c - the single-file formats: GGUF (the hyper-parameters
 * from its metadata, every key checked against what the engine honours) and
 * llama2.c checkpoints. */
#include "cm_model.h"

#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_rope.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int gguf_u32_arch(const cm_gguf *g, const char *arch, const char *suffix, uint32_t *out,
                         int required, char *err, size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = cm_gguf_get_u32(g, key, out);
    if (rc == LLM_ENOTFOUND && !required) return 0;
    if (rc) snprintf(err, errlen, "metadata '%s' is %s", key, rc == LLM_ENOTFOUND ? "missing" : "not an unsigned integer");
    return rc;
}

/* Gemma 3's attention: what the GGUF says (the window, linear RoPE scaling of the global layers) and
 * what llama.cpp's loader fixes for the architecture, as Hugging Face's config does (five local layers
 * to one global, the local layers' RoPE base 10,000; the 27B's query scale from dim / heads, the
 * others' from the head size). */
static int gemma_config(const cm_gguf *g, cm_model_config *c, char *err, size_t errlen) {
    int rc;
    c->swa_period = 6;
    c->rope_theta_swa = 10000.f;
    if ((rc = gguf_u32_arch(g, c->arch, "attention.sliding_window", &c->swa_window, 1, err, errlen))) return rc;
    if ((rc = gguf_u32_arch(g, c->arch, "attention.sliding_window_pattern", &c->swa_period, 0, err, errlen)))
        return rc;
    if (c->swa_window == 0 || c->swa_period == 0) {
        snprintf(err, errlen, "%s.attention.sliding_window and its pattern must be positive", c->arch);
        return LLM_EFORMAT;
    }
    if (c->n_layer == 62 && c->n_head) c->attn_scale = 1.f / sqrtf((float)c->dim / (float)c->n_head); /* 27B */
    return 0;
}

/* Experts (Mixtral as llama with experts, qwen3moe): how many, how many a token uses, the width of each
 * (qwen3moe's own key; Mixtral's experts are feed_forward_length wide). llama.cpp renormalises the chosen
 * experts' weights for both architectures, as their Hugging Face configs do. */
static int moe_config(const cm_gguf *g, cm_model_config *c, char *err, size_t errlen) {
    int rc, q3 = !strcmp(c->arch, "qwen3moe") || c->gpt_oss; /* the architectures that are only MoE */
    if ((rc = gguf_u32_arch(g, c->arch, "expert_count", &c->n_expert, q3, err, errlen))) return rc;
    if (!c->n_expert) {
        if (q3) {
            snprintf(err, errlen, "%s.expert_count is 0", c->arch);
            return LLM_EFORMAT;
        }
        return 0;
    }
    if (strcmp(c->arch, "llama") && strcmp(c->arch, "mistral") && !q3) {
        snprintf(err, errlen, "%s.expert_count = %u: experts are supported for llama (Mixtral), qwen3moe and gpt-oss", c->arch,
                 c->n_expert);
        return LLM_EUNSUP;
    }
    if ((rc = gguf_u32_arch(g, c->arch, "expert_used_count", &c->n_expert_used, 1, err, errlen)) ||
        (q3 && (rc = gguf_u32_arch(g, c->arch, "expert_feed_forward_length", &c->hidden, 1, err, errlen))))
        return rc;
    c->expert_norm = 1;
    return 0;
}

/* gpt-oss: what the GGUF says (the window) and what llama.cpp's loader fixes for the architecture as the
 * model's code does (every other layer local starting with the first, the clamped SwiGLU's alpha 1.702 and
 * limit 7). Its YaRN blends between the unrounded ends (OpenAI's and Hugging Face's code, vLLM; llama.cpp
 * rounds them out as for other models). */
static int gpt_oss_config(const cm_gguf *g, cm_model_config *c, char *err, size_t errlen) {
    int rc;
    c->swa_period = 2;
    c->swiglu_alpha = 1.702f;
    c->swiglu_limit = 7.f;
    if ((rc = gguf_u32_arch(g, c->arch, "attention.sliding_window", &c->swa_window, 1, err, errlen))) return rc;
    if (c->swa_window == 0) {
        snprintf(err, errlen, "%s.attention.sliding_window must be positive", c->arch);
        return LLM_EFORMAT;
    }
    return 0;
}

/* The {arch}. keys this loader honours, for every architecture it takes;
 * gemma3 adds its own. Any other {arch}. key changes the math in a way the
 * engine does not implement (a sliding window on a llama, logit
 * soft-capping, experts, ...): the model is refused, naming the key and its
 * value, rather than computed wrong without a word. general.* and
 * tokenizer.* keys describe the file and the tokenizer. */
static const char *const KEYS_ALL[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "attention.key_length", "attention.value_length",
    "rope.dimension_count", "rope.freq_base", "vocab_size", "rope.scaling.type", "rope.scaling.factor",
    "rope.scaling.original_context_length", "rope.scaling.attn_factor", "rope.scaling.yarn_beta_fast",
    "rope.scaling.yarn_beta_slow", "rope.scaling.finetuned", NULL};
static const char *const KEYS_GEMMA[] = {"attention.sliding_window", "attention.sliding_window_pattern", NULL};
static const char *const KEYS_MOE[] = {"expert_count", "expert_used_count", "expert_feed_forward_length", NULL};
static const char *const KEYS_GPT_OSS[] = {"attention.sliding_window", NULL};

static int listed(const char *const *l, const char *s, size_t n) {
    for (; *l; l++)
        if (strlen(*l) == n && !memcmp(*l, s, n)) return 1;
    return 0;
}

static void kv_value(const cm_gguf_kv *kv, char *out, size_t len) {
    switch (kv->type) {
    case CM_GGUF_STRING: snprintf(out, len, "'%.*s'", (int)(kv->v.s.len < 40 ? kv->v.s.len : 40), kv->v.s.ptr); break;
    case CM_GGUF_F32: case CM_GGUF_F64: snprintf(out, len, "%g", kv->v.f); break;
    case CM_GGUF_I8: case CM_GGUF_I16: case CM_GGUF_I32: case CM_GGUF_I64:
        snprintf(out, len, "%lld", (long long)kv->v.i);
        break;
    case CM_GGUF_BOOL: snprintf(out, len, "%s", kv->v.u ? "true" : "false"); break;
    case CM_GGUF_ARRAY: snprintf(out, len, "an array of %llu", (unsigned long long)kv->v.arr.n); break;
    default: snprintf(out, len, "%llu", (unsigned long long)kv->v.u);
    }
}

static int check_keys(const cm_gguf *g, const cm_model_config *c, char *err, size_t errlen) {
    size_t al = strlen(c->arch);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const cm_gguf_kv *kv = &g->kv[i];
        if (kv->key.len <= al || memcmp(kv->key.ptr, c->arch, al) || kv->key.ptr[al] != '.') continue;
        const char *rest = kv->key.ptr + al + 1;
        size_t n = kv->key.len - al - 1;
        if (listed(KEYS_ALL, rest, n) || (c->gemma && listed(KEYS_GEMMA, rest, n)) ||
            (c->gpt_oss && listed(KEYS_GPT_OSS, rest, n)) ||
            (c->n_expert && listed(KEYS_MOE, rest, n)))
            continue;
        char v[64];
        kv_value(kv, v, sizeof v);
        snprintf(err, errlen, "metadata %.*s = %s changes the model in a way this engine does not implement: refused "
                 "rather than computed wrong", (int)(kv->key.len < 96 ? kv->key.len : 96), kv->key.ptr, v);
        return LLM_EUNSUP;
    }
    return 0;
}

static int config_from_gguf(cm_model_file *m, char *err, size_t errlen) {
    cm_gguf *g = m->gguf;
    cm_model_config *c = &m->cfg;
    cm_str s;
    if (cm_gguf_get_str(g, "general.architecture", &s)) {
        snprintf(err, errlen, "general.architecture is missing");
        return LLM_EFORMAT;
    }
    if (s.len >= sizeof c->arch) s.len = sizeof c->arch - 1;
    memcpy(c->arch, s.ptr, s.len);
    c->arch[s.len] = 0;
    if (strcmp(c->arch, "llama") == 0 || strcmp(c->arch, "mistral") == 0) {
        c->rope_type = CM_ROPE_NORM;
    } else if (strcmp(c->arch, "qwen2") == 0) {
        c->rope_type = CM_ROPE_NEOX;
        c->qkv_bias = 1;
    } else if (strcmp(c->arch, "qwen3") == 0 || strcmp(c->arch, "qwen3moe") == 0) {
        c->rope_type = CM_ROPE_NEOX;
        c->qk_norm = 1;
    } else if (strcmp(c->arch, "gemma3") == 0) {
        c->rope_type = CM_ROPE_NEOX;
        c->gemma = c->qk_norm = 1;
    } else if (strcmp(c->arch, "gpt-oss") == 0) {
        c->rope_type = CM_ROPE_NEOX;
        c->gpt_oss = c->qkv_bias = 1;
    } else {
        snprintf(err, errlen, "unknown architecture '%s' (supported: llama, mistral, qwen2, qwen3, qwen3moe, gemma3, gpt-oss)",
                 c->arch);
        return LLM_EUNSUP;
    }
    if (!cm_gguf_get_str(g, "general.name", &s)) {
        size_t n = s.len < sizeof c->name - 1 ? s.len : sizeof c->name - 1;
        memcpy(c->name, s.ptr, n);
    }
    int rc;
    if ((rc = gguf_u32_arch(g, c->arch, "block_count", &c->n_layer, 1, err, errlen)) ||
        (rc = gguf_u32_arch(g, c->arch, "embedding_length", &c->dim, 1, err, errlen)) ||
        (rc = gguf_u32_arch(g, c->arch, "feed_forward_length", &c->hidden, 1, err, errlen)) ||
        (rc = gguf_u32_arch(g, c->arch, "attention.head_count", &c->n_head, 1, err, errlen)))
        return rc;
    c->n_kv_head = c->n_head;
    c->ctx_len = 2048;
    if ((rc = gguf_u32_arch(g, c->arch, "attention.head_count_kv", &c->n_kv_head, 0, err, errlen)) ||
        (rc = gguf_u32_arch(g, c->arch, "context_length", &c->ctx_len, 0, err, errlen)))
        return rc;
    if (c->n_head == 0) {
        snprintf(err, errlen, "attention.head_count is 0");
        return LLM_EFORMAT;
    }
    c->head_dim = c->dim / c->n_head;
    if ((rc = gguf_u32_arch(g, c->arch, "attention.key_length", &c->head_dim, 0, err, errlen)))
        return rc;
    c->rope_dim = c->head_dim;
    if ((rc = gguf_u32_arch(g, c->arch, "rope.dimension_count", &c->rope_dim, 0, err, errlen)))
        return rc;
    c->rope_theta = 10000.f;
    c->norm_eps = 1e-5f;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.freq_base", c->arch);
    cm_gguf_get_f32(g, key, &c->rope_theta);
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", c->arch);
    cm_gguf_get_f32(g, key, &c->norm_eps);
    uint32_t vlen = c->head_dim;
    if ((rc = gguf_u32_arch(g, c->arch, "attention.value_length", &vlen, 0, err, errlen))) return rc;
    if (vlen != c->head_dim) {
        snprintf(err, errlen, "%s.attention.value_length %u differs from the key length %u: not supported", c->arch, vlen,
                 c->head_dim);
        return LLM_EUNSUP;
    }
    if ((rc = moe_config(g, c, err, errlen)) || (rc = check_keys(g, c, err, errlen))) return rc;
    if (c->gemma && (rc = gemma_config(g, c, err, errlen))) return rc;
    if (c->gpt_oss && (rc = gpt_oss_config(g, c, err, errlen))) return rc;
    if ((rc = cm_rope_from_gguf(g, c, err, errlen))) return rc;
    if (c->gpt_oss && c->rs.type == CM_RS_YARN) c->rs.truncate = 0;
    if (c->gemma && c->rs.type != CM_RS_NONE && c->rs.type != CM_RS_LINEAR) { /* its local layers are never scaled */
        snprintf(err, errlen, "%s.rope.scaling.type %s is not supported for gemma3 (linear, none)", c->arch,
                 cm_rope_type_name(c->rs.type));
        return LLM_EUNSUP;
    }
    int type;
    uint64_t n;
    const void *d;
    if (cm_gguf_get_arr(g, "tokenizer.ggml.tokens", &type, &n, &d) == 0) c->vocab = (uint32_t)n;
    uint32_t v = 0; /* stays 0 when the key is absent */
    if (gguf_u32_arch(g, c->arch, "vocab_size", &v, 0, err, errlen) == 0 && v) c->vocab = v;
    if (!c->vocab) {
        const cm_gguf_tensor *t = cm_gguf_find_tensor(g, "token_embd.weight");
        if (t) c->vocab = (uint32_t)t->ne[1];
    }
    c->tied = cm_gguf_find_tensor(g, "output.weight") == NULL;
    if (c->ctx_len == 0 || c->ctx_len > (1u << 24)) {
        snprintf(err, errlen, "bad context length %u", c->ctx_len);
        return LLM_EFORMAT;
    }
    m->n_tensors = g->n_tensors;
    m->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *m->tensors);
    if (!m->tensors) return LLM_ENOMEM;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const cm_gguf_tensor *t = &g->tensors[i];
        cm_tensor_ref *r = &m->tensors[i];
        size_t nl = t->name.len < sizeof r->name - 1 ? t->name.len : sizeof r->name - 1;
        memcpy(r->name, t->name.ptr, nl);
        r->type = t->type;
        r->n_dims = t->n_dims;
        memcpy(r->ne, t->ne, sizeof r->ne);
        r->data = t->data;
        r->nbytes = t->nbytes;
    }
    return 0;
}

/* llama2.c legacy (v0) checkpoint: 7 int32 then fp32 weights. */
static int open_llama2c(cm_model_file *m, char *err, size_t errlen) {
    if (m->map_size < 28) {
        snprintf(err, errlen, "neither GGUF nor a llama2.c checkpoint (%zu bytes)", m->map_size);
        return LLM_ETRUNC;
    }
    int32_t h[7];
    memcpy(h, m->map, sizeof h);
    cm_model_config *c = &m->cfg;
    for (int i = 0; i < 7; i++) {
        if (i != 5 && h[i] <= 0) {
            snprintf(err, errlen, "neither GGUF nor a llama2.c checkpoint (header field %d is %d)", i, h[i]);
            return LLM_EFORMAT;
        }
    }
    if (h[5] == 0 || h[5] == INT32_MIN) {
        snprintf(err, errlen, "llama2.c header has vocab size 0");
        return LLM_EFORMAT;
    }
    strcpy(c->arch, "llama");
    strcpy(c->name, "llama2.c");
    c->dim = (uint32_t)h[0];
    c->hidden = (uint32_t)h[1];
    c->n_layer = (uint32_t)h[2];
    c->n_head = (uint32_t)h[3];
    c->n_kv_head = (uint32_t)h[4];
    c->tied = h[5] > 0;
    c->vocab = (uint32_t)(h[5] > 0 ? h[5] : -h[5]);
    c->ctx_len = (uint32_t)h[6];
    c->head_dim = c->dim / c->n_head;
    c->rope_dim = c->head_dim;
    c->rope_type = CM_ROPE_NORM;
    c->rope_theta = 10000.f;
    c->norm_eps = 1e-5f;
    int rc = cm_model_validate_config(c, err, errlen);
    if (rc) return rc;
    if (c->head_dim * c->n_head != c->dim || c->ctx_len > (1u << 20)) {
        snprintf(err, errlen, "llama2.c header is inconsistent (dim %u, heads %u, seq_len %u)", c->dim,
                 c->n_head, c->ctx_len);
        return LLM_EFORMAT;
    }
    uint64_t D = c->dim, L = c->n_layer, H = c->hidden, V = c->vocab, KV = (uint64_t)c->n_kv_head * c->head_dim;
    struct { const char *fmt; uint64_t ne0, ne1, per_layer; } parts[] = {
        {"token_embd.weight", D, V, 0},  {"blk.%u.attn_norm.weight", D, 1, 1},
        {"blk.%u.attn_q.weight", D, D, 1}, {"blk.%u.attn_k.weight", D, KV, 1},
        {"blk.%u.attn_v.weight", D, KV, 1}, {"blk.%u.attn_output.weight", D, D, 1},
        {"blk.%u.ffn_norm.weight", D, 1, 1}, {"blk.%u.ffn_gate.weight", D, H, 1},
        {"blk.%u.ffn_down.weight", H, D, 1}, {"blk.%u.ffn_up.weight", D, H, 1},
        {"output_norm.weight", D, 1, 0},
    };
    size_t np = sizeof parts / sizeof parts[0];
    m->n_tensors = 0;
    m->tensors = calloc(np * L + 2, sizeof *m->tensors);
    if (!m->tensors) return LLM_ENOMEM;
    uint64_t off = 28;
    for (size_t p = 0; p < np; p++) {
        uint64_t per = parts[p].ne0 * parts[p].ne1 * 4, count = parts[p].per_layer ? L : 1;
        for (uint64_t l = 0; l < count; l++) {
            if (off + per > m->map_size) {
                snprintf(err, errlen, "llama2.c checkpoint is truncated (needs more than %zu bytes)",
                         m->map_size);
                return LLM_ETRUNC;
            }
            cm_tensor_ref *t = &m->tensors[m->n_tensors++];
            snprintf(t->name, sizeof t->name, parts[p].fmt, (unsigned)l);
            t->type = CM_F32;
            t->n_dims = parts[p].ne1 > 1 ? 2 : 1;
            t->ne[0] = parts[p].ne0;
            t->ne[1] = parts[p].ne1;
            t->ne[2] = t->ne[3] = 1;
            t->data = (const uint8_t *)m->map + off;
            t->nbytes = per;
            off += per;
        }
    }
    off += (uint64_t)c->ctx_len * (c->head_dim / 2) * 4 * 2; /* legacy freq_cis tables, unused */
    if (!c->tied) {
        uint64_t per = D * V * 4;
        if (off + per > m->map_size) {
            snprintf(err, errlen, "llama2.c checkpoint is truncated (classifier missing)");
            return LLM_ETRUNC;
        }
        cm_tensor_ref *t = &m->tensors[m->n_tensors++];
        strcpy(t->name, "output.weight");
        t->type = CM_F32;
        t->n_dims = 2;
        t->ne[0] = D;
        t->ne[1] = V;
        t->ne[2] = t->ne[3] = 1;
        t->data = (const uint8_t *)m->map + off;
        t->nbytes = per;
    }
    return 0;
}

/* Reads a whole model file from memory: map is the file's bytes; borrowed
 * when the caller keeps it, else it is an mmap the result owns. */
static int open_from(void *map, size_t size, int borrowed, const char *path, cm_model_file **out, char *err,
                     size_t errlen) {
    *out = NULL;
    char e[400] = "";
    int rc;
    cm_model_file *m = calloc(1, sizeof *m);
    if (!m) {
        if (!borrowed) munmap(map, size);
        return LLM_ENOMEM;
    }
    snprintf(m->path, sizeof m->path, "%s", path);
    uint32_t magic = 0;
    if (size >= 4) memcpy(&magic, map, 4);
    if (magic == 0x46554747u) {
        m->format = CM_FMT_GGUF;
        rc = borrowed ? cm_gguf_open_mem(map, size, &m->gguf, e, sizeof e)
                      : cm_gguf_open_mapped(map, size, &m->gguf, e, sizeof e);
        if (rc) goto fail;
        if ((rc = config_from_gguf(m, e, sizeof e))) goto fail;
    } else {
        m->format = CM_FMT_LLAMA2C;
        m->map = map;
        m->map_size = size;
        m->map_borrowed = borrowed;
        if ((rc = open_llama2c(m, e, sizeof e))) goto fail;
    }
    if ((rc = cm_model_validate_config(&m->cfg, e, sizeof e))) goto fail;
    *out = m;
    return 0;
fail:
    if (err) snprintf(err, errlen, "%s: %s", path, e);
    cm_model_close(m);
    return rc;
}

int cm_model_open_file(const char *path, cm_model_file **out, char *err, size_t errlen) {
    *out = NULL;
    void *map;
    size_t size;
    char e[400] = "";
    int rc = cm_map_file(path, 1, &map, &size, e, sizeof e);
    if (rc) {
        if (err) snprintf(err, errlen, "%s: %s", path, e);
        return rc;
    }
    return open_from(map, size, 0, path, out, err, errlen);
}

int cm_model_open_mem(const void *data, size_t size, const char *name, cm_model_file **out, char *err, size_t errlen) {
    return open_from((void *)data, size, 1, name, out, err, errlen);
}
