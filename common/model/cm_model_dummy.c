/* cm_model_dummy.c - model shapes without weights: the built-in presets, a
 * Hugging Face config.json (cm_hf_config.c), and random weights of that shape
 * (`--load-format dummy`), so a machine with no checkpoint can run and
 * benchmark the real computation. */
#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_model.h"
#include "cm_rope.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static const struct {
    const char *name, *arch;
    uint32_t layers, heads, kv, hd, dim, hidden, vocab, ctx;
    int tied, bias;
    float theta, eps;
    uint32_t experts, used; /* mixture of experts (hidden: each expert's width), 0: dense */
} presets[] = {
    {"llama-2-7b", "llama", 32, 32, 32, 128, 4096, 11008, 32000, 4096, 0, 0, 10000.f, 1e-5f, 0, 0},
    {"llama-3-8b", "llama", 32, 32, 8, 128, 4096, 14336, 128256, 8192, 0, 0, 500000.f, 1e-5f, 0, 0},
    {"llama-3-70b", "llama", 80, 64, 8, 128, 8192, 28672, 128256, 8192, 0, 0, 500000.f, 1e-5f, 0, 0},
    {"mistral-7b", "llama", 32, 32, 8, 128, 4096, 14336, 32000, 32768, 0, 0, 1000000.f, 1e-5f, 0, 0},
    {"qwen2-7b", "qwen2", 28, 28, 4, 128, 3584, 18944, 152064, 32768, 0, 1, 1000000.f, 1e-6f, 0, 0},
    {"qwen2.5-7b", "qwen2", 28, 28, 4, 128, 3584, 18944, 152064, 32768, 0, 1, 1000000.f, 1e-6f, 0, 0},
    {"smollm2-135m", "llama", 30, 9, 3, 64, 576, 1536, 49152, 8192, 1, 0, 100000.f, 1e-5f, 0, 0},
    /* Llama 3.1 / 3.3: the 3.0 shapes at 131,072 positions through llama3 RoPE scaling (8x over 8,192) */
    {"llama-3.1-8b", "llama", 32, 32, 8, 128, 4096, 14336, 128256, 131072, 0, 0, 500000.f, 1e-5f, 0, 0},
    {"llama-3.3-70b", "llama", 80, 64, 8, 128, 8192, 28672, 128256, 131072, 0, 0, 500000.f, 1e-5f, 0, 0},
    /* Qwen3: per-head query/key norms, no biases; Qwen3-30B-A3B: 128 experts of 768, 8 a token */
    {"qwen3-8b", "qwen3", 36, 32, 8, 128, 4096, 12288, 151936, 40960, 0, 0, 1000000.f, 1e-6f, 0, 0},
    {"qwen3-32b", "qwen3", 64, 64, 8, 128, 5120, 25600, 151936, 40960, 0, 0, 1000000.f, 1e-6f, 0, 0},
    {"qwen3-30b-a3b", "qwen3moe", 48, 32, 4, 128, 2048, 768, 151936, 40960, 0, 0, 1000000.f, 1e-6f, 128, 8},
    /* Mixtral: llama with 8 experts of 14,336, 2 a token */
    {"mixtral-8x7b", "llama", 32, 32, 8, 128, 4096, 14336, 32000, 32768, 0, 0, 1000000.f, 1e-5f, 8, 2},
    /* gpt-oss: 32 (120b: 128) experts of 2,880, 4 a token; the rest of the architecture in gpt_oss() */
    {"gpt-oss-20b", "gpt-oss", 24, 64, 8, 64, 2880, 2880, 201088, 4096, 0, 1, 150000.f, 1e-5f, 32, 4},
    {"gpt-oss-120b", "gpt-oss", 36, 64, 8, 64, 2880, 2880, 201088, 4096, 0, 1, 150000.f, 1e-5f, 128, 4},
};

/* gpt-oss's fixed parts (its config.json): every other layer local over 128 positions, the clamped
 * SwiGLU, YaRN x32 over 4,096 positions (131,072 in all) between unrounded ends */
static int gpt_oss(cm_model_config *c) {
    c->gpt_oss = 1;
    c->swa_window = 128;
    c->swa_period = 2;
    c->swiglu_alpha = 1.702f;
    c->swiglu_limit = 7.f;
    json_t *rs = json_pack("{s:s, s:f, s:i, s:f, s:f, s:b}", "rope_type", "yarn", "factor", 32.0,
                           "original_max_position_embeddings", 4096, "beta_fast", 32.0, "beta_slow", 1.0, "truncate", 0);
    char err[200];
    int rc = rs ? cm_rope_from_json(rs, c, "gpt-oss", err, sizeof err) : LLM_ENOMEM;
    json_decref(rs);
    return rc;
}

const char *cm_model_preset_names(void) {
    return "gpt-oss-20b, gpt-oss-120b, llama-2-7b, llama-3-8b, llama-3-70b, llama-3.1-8b, llama-3.3-70b, mistral-7b, "
           "mixtral-8x7b, qwen2-7b, qwen2.5-7b, qwen3-8b, qwen3-32b, qwen3-30b-a3b, smollm2-135m";
}

int cm_model_preset(const char *name, cm_model_config *c) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcasecmp(name, presets[i].name)) continue;
        memset(c, 0, sizeof *c);
        snprintf(c->arch, sizeof c->arch, "%s", presets[i].arch);
        snprintf(c->name, sizeof c->name, "%s", presets[i].name);
        c->n_layer = presets[i].layers;
        c->n_head = presets[i].heads;
        c->n_kv_head = presets[i].kv;
        c->head_dim = c->rope_dim = presets[i].hd;
        c->dim = presets[i].dim;
        c->hidden = presets[i].hidden;
        c->vocab = presets[i].vocab;
        c->ctx_len = presets[i].ctx;
        c->tied = presets[i].tied;
        c->qkv_bias = presets[i].bias;
        c->rope_theta = presets[i].theta;
        c->norm_eps = presets[i].eps;
        c->qk_norm = !strncmp(c->arch, "qwen3", 5);
        c->rope_type = c->qkv_bias || c->qk_norm ? CM_ROPE_NEOX : CM_ROPE_NORM;
        c->n_expert = presets[i].experts;
        c->n_expert_used = presets[i].used;
        c->expert_norm = c->n_expert > 0;
        if (c->ctx_len == 131072 && !strncmp(c->name, "llama-3.", 8))
            c->rs = (cm_rope_scaling){CM_RS_LLAMA3, 8.f, 8192, 1.f, 4.f, 0, 0, 0, 1.f};
        if (!strcmp(c->arch, "gpt-oss")) return gpt_oss(c);
        return 0;
    }
    return LLM_ENOTFOUND;
}

int cm_model_config_resolve(const char *spec, cm_model_config *c, char *err, size_t errlen) {
    if (cm_model_preset(spec, c) == 0) return 0;
    if (!strchr(spec, '/') && !strstr(spec, ".json")) {
        snprintf(err, errlen, "unknown model preset '%s' (presets: %s; or a config.json path)", spec,
                 cm_model_preset_names());
        return LLM_ENOTFOUND;
    }
    return cm_model_config_json(spec, c, err, errlen);
}

/* splitmix64, so a seed fixes the weights */
static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-a, a) like vLLM's dummy loader; quantized types get random
 * codes with a scale that gives the same range. Vectors (norms) are 1. */
static void fill(void *dst, int type, uint64_t n, float a, uint64_t *s) {
    if (type == CM_F32) {
        float *p = dst;
        for (uint64_t i = 0; i < n; i++) p[i] = a < 0 ? 1.f : ((float)(mix(s) >> 40) / 16777216.f * 2 - 1) * a;
        return;
    }
    if (type == CM_F16 || type == CM_BF16) {
        uint16_t *p = dst;
        for (uint64_t i = 0; i < n; i++) {
            float v = ((float)(mix(s) >> 40) / 16777216.f * 2 - 1) * a;
            p[i] = type == CM_F16 ? cm_f32_to_f16(v) : cm_f32_to_bf16(v);
        }
        return;
    }
    if (type == CM_Q4_K || type == CM_Q6_K) { /* random codes and sub-block scales, a sane super-block scale */
        size_t bb = cm_dtype_block_bytes(type), nb = (size_t)(n / 256);
        uint8_t *p = dst;
        /* Q4_K: w = d*sc*q - dmin*m, sc and m 6-bit, q 0..15 (|w| up to ~945 d); Q6_K: w = d*sc*(q-32), sc
         * int8 (|w| up to 4096 d); d at 0 (Q4_K, dmin at 2) or at the block's end (Q6_K) */
        uint16_t dh = cm_f32_to_f16(type == CM_Q4_K ? a / 945 : a / 4096), mh = cm_f32_to_f16(a / 945);
        for (size_t b = 0; b < nb; b++, p += bb) {
            for (size_t i = 0; i < bb; i += 8) {
                uint64_t r = mix(s);
                memcpy(p + i, &r, bb - i < 8 ? bb - i : 8);
            }
            if (type == CM_Q4_K) memcpy(p, &dh, 2), memcpy(p + 2, &mh, 2);
            else memcpy(p + bb - 2, &dh, 2);
        }
        return;
    }
    /* Q8_0: w = d*q, q in [-128, 127]; Q4_0: w = d*(q-8); Q4_1: w = d*q + m, q in [0, 15] */
    size_t bb = cm_dtype_block_bytes(type), nb = (size_t)(n / 32), hd = type == CM_Q4_1 ? 4 : 2;
    uint8_t *p = dst;
    float d = type == CM_Q8_0 ? a / 127 : type == CM_Q4_0 ? a / 8 : 2 * a / 15;
    uint16_t dh = cm_f32_to_f16(d), mh = cm_f32_to_f16(-a);
    for (size_t b = 0; b < nb; b++, p += bb) {
        memcpy(p, &dh, 2);
        if (type == CM_Q4_1) memcpy(p + 2, &mh, 2);
        for (size_t i = hd; i < bb; i += 8) {
            uint64_t r = mix(s);
            memcpy(p + i, &r, bb - i < 8 ? bb - i : 8);
        }
    }
}

int cm_model_dummy(const cm_model_config *cfg, int wtype, uint64_t seed, unsigned flags, cm_model_file **out,
                   char *err, size_t errlen) {
    *out = NULL;
    if (wtype != CM_F32 && wtype != CM_F16 && wtype != CM_BF16 && wtype != CM_Q8_0 && wtype != CM_Q4_0 &&
        wtype != CM_Q4_1 && wtype != CM_Q4_K && wtype != CM_Q6_K) {
        snprintf(err, errlen, "dummy weights: type %s is not one of f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q6_k",
                 cm_dtype_name(wtype));
        return LLM_EUNSUP;
    }
    cm_model_config c = *cfg;
    if (!c.rope_dim) c.rope_dim = c.head_dim;
    int rc = cm_model_validate_config(&c, err, errlen);
    if (rc) return rc;
    uint64_t D = c.dim, QD = (uint64_t)c.n_head * c.head_dim, KVD = (uint64_t)c.n_kv_head * c.head_dim, H = c.hidden;
    uint64_t blk = cm_dtype_block(wtype);
    if (blk > 1 && (D % blk || QD % blk || H % blk)) {
        snprintf(err, errlen, "dummy weights: %s needs dim, heads x head_dim and FFN size in multiples of %llu",
                 cm_dtype_name(wtype), (unsigned long long)blk);
        return LLM_EUNSUP;
    }
    /* name, [ne0 (row length), ne1 (rows)], type: matrices in wtype, vectors in F32 */
    struct spec {
        char name[64];
        uint64_t k, n, e; /* e: experts (merged [k, n, e], as current GGUFs hold them), 1 otherwise */
        int type;
    };
    size_t per_layer = 10 + (c.qkv_bias ? 3 : 0) + (c.qk_norm ? 2 : 0) + (c.gpt_oss ? 6 : 0), nt = 3 + per_layer * c.n_layer;
    struct spec *sp = calloc(nt, sizeof *sp);
    cm_model_file *f = calloc(1, sizeof *f);
    size_t k = 0;
    if (!sp || !f) goto oom;
#define ADD(nm, K, N, T)                                                                                               \
    do {                                                                                                               \
        snprintf(sp[k].name, sizeof sp[k].name, "%s", nm);                                                             \
        sp[k].k = (K);                                                                                                 \
        sp[k].n = (N);                                                                                                 \
        sp[k].e = 1;                                                                                                   \
        sp[k++].type = (T);                                                                                            \
    } while (0)
    ADD("token_embd.weight", D, c.vocab, wtype);
    ADD("output_norm.weight", D, 1, CM_F32);
    if (!c.tied) ADD("output.weight", D, c.vocab, wtype);
    for (uint32_t l = 0; l < c.n_layer; l++) {
        char nm[64];
#define LAYER(suffix, K, N, T)                                                                                         \
    do {                                                                                                               \
        snprintf(nm, sizeof nm, "blk.%u.%s", l, suffix);                                                               \
        ADD(nm, K, N, T);                                                                                              \
    } while (0)
        LAYER("attn_norm.weight", D, 1, CM_F32);
        LAYER("attn_q.weight", D, QD, wtype);
        LAYER("attn_k.weight", D, KVD, wtype);
        LAYER("attn_v.weight", D, KVD, wtype);
        LAYER("attn_output.weight", QD, D, wtype);
        LAYER(c.gpt_oss ? "post_attention_norm.weight" : "ffn_norm.weight", D, 1, CM_F32);
        if (c.gpt_oss) { /* sinks 1 (as norms are), biases 0.02 wide */
            LAYER("attn_output.bias", D, 1, CM_F32);
            LAYER("attn_sinks.weight", c.n_head, 1, CM_F32);
            LAYER("ffn_gate_inp.bias", c.n_expert, 1, CM_F32);
            LAYER("ffn_gate_exps.bias", H, c.n_expert, CM_F32);
            LAYER("ffn_up_exps.bias", H, c.n_expert, CM_F32);
            LAYER("ffn_down_exps.bias", D, c.n_expert, CM_F32);
        }
        if (c.n_expert) {
            LAYER("ffn_gate_inp.weight", D, c.n_expert, CM_F32);
            LAYER("ffn_gate_exps.weight", D, H, wtype);
            sp[k - 1].e = c.n_expert;
            LAYER("ffn_up_exps.weight", D, H, wtype);
            sp[k - 1].e = c.n_expert;
            LAYER("ffn_down_exps.weight", H, D, wtype);
            sp[k - 1].e = c.n_expert;
        } else {
            LAYER("ffn_gate.weight", D, H, wtype);
            LAYER("ffn_up.weight", D, H, wtype);
            LAYER("ffn_down.weight", H, D, wtype);
        }
        if (c.qk_norm) {
            LAYER("attn_q_norm.weight", c.head_dim, 1, CM_F32);
            LAYER("attn_k_norm.weight", c.head_dim, 1, CM_F32);
        }
        if (c.qkv_bias) {
            LAYER("attn_q.bias", QD, 1, CM_F32);
            LAYER("attn_k.bias", KVD, 1, CM_F32);
            LAYER("attn_v.bias", KVD, 1, CM_F32);
        }
    }
#undef LAYER
#undef ADD
    nt = k;
    /* matrices the device makes itself (CM_DUMMY_DEVICE_MATRICES) get no host memory */
    int skip = (flags & CM_DUMMY_DEVICE_MATRICES) && wtype != CM_F32;
    size_t total = 64;
    for (size_t i = 0; i < nt; i++)
        if (!(skip && sp[i].n > 1)) total += (cm_dtype_row_bytes(sp[i].type, sp[i].k) * sp[i].n * sp[i].e + 63) / 64 * 64;
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    double phys = pages > 0 && psize > 0 ? (double)pages * (double)psize : 0;
    if (phys > 0 && (double)total > 0.9 * phys) { /* refuse before the fill makes the kernel kill us */
        snprintf(err, errlen, "dummy weights of the %s shape need %.1f GiB in %s, more than this machine's %.1f GiB%s",
                 c.name, (double)total / 1073741824.0, cm_dtype_name(wtype), phys / 1073741824.0,
                 skip ? "" : " (a smaller --dtype, or --device cuda to make them on the GPU)");
        free(sp);
        cm_model_close(f);
        return LLM_ENOMEM;
    }
    f->tensors = calloc(nt, sizeof *f->tensors);
    f->owned = aligned_alloc(64, total);
    if (!f->tensors || !f->owned) goto oom;
    f->format = CM_FMT_DUMMY;
    f->cfg = c;
    f->n_tensors = nt;
    f->owned_size = total;
    snprintf(f->path, sizeof f->path, "dummy:%s", c.name);
    uint64_t s = seed * 0x2545f4914f6cdd1dull + 1;
    char *p = f->owned;
    for (size_t i = 0; i < nt; i++) {
        cm_tensor_ref *t = &f->tensors[i];
        snprintf(t->name, sizeof t->name, "%s", sp[i].name);
        t->type = sp[i].type;
        t->n_dims = sp[i].e > 1 ? 3 : sp[i].n > 1 ? 2 : 1;
        t->ne[0] = sp[i].k;
        t->ne[1] = sp[i].n;
        t->ne[2] = sp[i].e;
        t->ne[3] = 1;
        t->data = p;
        t->nbytes = cm_dtype_row_bytes(t->type, t->ne[0]) * t->ne[1] * t->ne[2];
        if (skip && t->ne[1] > 1) {
            t->data = NULL;
            continue;
        }
        /* weights uniform in +-1/sqrt(row length) keep activations O(1) through the layers */
        fill(p, t->type, t->ne[0] * t->ne[1] * t->ne[2], t->ne[1] == 1 && !strstr(t->name, "bias") ? -1.f
                                                  : strstr(t->name, "bias")              ? 0.02f
                                                                                         : 1.f / sqrtf((float)t->ne[0]),
             &s);
        p += (t->nbytes + 63) / 64 * 64;
    }
    free(sp);
    *out = f;
    return 0;
oom:
    snprintf(err, errlen, "dummy weights: out of memory for the %s shape", c.name);
    free(sp);
    cm_model_close(f);
    return LLM_ENOMEM;
}
