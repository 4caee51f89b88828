/* cm_model_dummy.c - model shapes without weights: the built-in presets, a
 * Hugging Face config.json, and random weights of that shape
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
} presets[] = {
    {"llama-2-7b", "llama", 32, 32, 32, 128, 4096, 11008, 32000, 4096, 0, 0, 10000.f, 1e-5f},
    {"llama-3-8b", "llama", 32, 32, 8, 128, 4096, 14336, 128256, 8192, 0, 0, 500000.f, 1e-5f},
    {"llama-3-70b", "llama", 80, 64, 8, 128, 8192, 28672, 128256, 8192, 0, 0, 500000.f, 1e-5f},
    {"mistral-7b", "llama", 32, 32, 8, 128, 4096, 14336, 32000, 32768, 0, 0, 1000000.f, 1e-5f},
    {"qwen2-7b", "qwen2", 28, 28, 4, 128, 3584, 18944, 152064, 32768, 0, 1, 1000000.f, 1e-6f},
    {"qwen2.5-7b", "qwen2", 28, 28, 4, 128, 3584, 18944, 152064, 32768, 0, 1, 1000000.f, 1e-6f},
    {"smollm2-135m", "llama", 30, 9, 3, 64, 576, 1536, 49152, 8192, 1, 0, 100000.f, 1e-5f},
    /* Llama 3.1 / 3.3: the 3.0 shapes at 131,072 positions through llama3 RoPE scaling (8x over 8,192) */
    {"llama-3.1-8b", "llama", 32, 32, 8, 128, 4096, 14336, 128256, 131072, 0, 0, 500000.f, 1e-5f},
    {"llama-3.3-70b", "llama", 80, 64, 8, 128, 8192, 28672, 128256, 131072, 0, 0, 500000.f, 1e-5f},
};

const char *cm_model_preset_names(void) {
    return "llama-2-7b, llama-3-8b, llama-3-70b, llama-3.1-8b, llama-3.3-70b, mistral-7b, qwen2-7b, qwen2.5-7b, "
           "smollm2-135m";
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
        c->rope_type = c->qkv_bias ? CM_ROPE_NEOX : CM_ROPE_NORM;
        if (c->ctx_len == 131072 && !strncmp(c->name, "llama-3.", 8))
            c->rs = (cm_rope_scaling){CM_RS_LLAMA3, 8.f, 8192, 1.f, 4.f, 0, 0, 0, 1.f};
        return 0;
    }
    return LLM_ENOTFOUND;
}

static uint32_t jint(json_t *o, const char *k, uint32_t def) {
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < (1 << 30)
               ? (uint32_t)json_integer_value(v)
               : def;
}

static double jnum(json_t *o, const char *k, double def) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) && json_number_value(v) > 0 ? json_number_value(v) : def;
}

/* config.json keys of a decoder (llama, mistral, qwen2): honoured by this
 * parser or the loaders, or known not to change the math (names, ids,
 * training settings). Any other key whose value is not null or false
 * changes the model in a way this engine does not implement, and refuses
 * it by name: sliding windows, soft-capping, biases the loader does not
 * read, a hidden_act other than silu, ... */
static const char *const HF_KEYS[] = {
    /* honoured */
    "model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "attention_bias",
    "rope_theta", "rms_norm_eps", "rope_scaling", "partial_rotary_factor", "hidden_act", "quantization_config",
    "use_sliding_window", "sliding_window", "max_window_layers", "mlp_bias", "pretraining_tp",
    /* no effect on the math */
    "architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype", "bos_token_id",
    "eos_token_id", "pad_token_id", "initializer_range", "use_cache", "attention_dropout", "hidden_dropout",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "embd_pdrop", "resid_pdrop", "output_attentions",
    "output_hidden_states", "return_dict", "auto_map", "unsloth_version", "_attn_implementation",
    "tokenizer_class", "use_return_dict", "keys_to_ignore_at_inference", "chunk_size_feed_forward",
    "is_encoder_decoder", "is_decoder", "add_cross_attention", "tie_encoder_decoder", "task_specific_params",
    "problem_type", "id2label", "label2id", "finetuning_task", "prefix", "sep_token_id", "decoder_start_token_id",
    "rope_interleaved" /* (false only: see below) */, "layer_types", NULL};

static int decoder_keys(json_t *o, const char *path, cm_model_config *c, char *err, size_t errlen) {
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        int known = 0;
        for (const char *const *k = HF_KEYS; *k; k++)
            if (!strcmp(*k, key)) known = 1;
        if (!known && !json_is_null(v) && !json_is_false(v)) {
            char *d = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            snprintf(err, errlen, "%s: %.60s = %.60s changes the model in a way this engine does not implement: refused "
                     "rather than computed wrong", path, key, d ? d : "?");
            free(d);
            return LLM_EUNSUP;
        }
    }
    const char *act = json_string_value(json_object_get(o, "hidden_act"));
    if (act && strcmp(act, "silu")) {
        snprintf(err, errlen, "%s: hidden_act '%.32s' is not supported (silu)", path, act);
        return LLM_EUNSUP;
    }
    if (json_is_true(json_object_get(o, "mlp_bias")) || json_is_true(json_object_get(o, "rope_interleaved"))) {
        snprintf(err, errlen, "%s: %s = true is not supported", path,
                 json_is_true(json_object_get(o, "mlp_bias")) ? "mlp_bias" : "rope_interleaved");
        return LLM_EUNSUP;
    }
    json_t *lt = json_object_get(o, "layer_types"); /* every layer full attention, or refused */
    for (size_t i = 0; json_is_array(lt) && i < json_array_size(lt); i++) {
        const char *t = json_string_value(json_array_get(lt, i));
        if (!t || strcmp(t, "full_attention")) {
            snprintf(err, errlen, "%s: layer_types[%zu] = '%.32s' is not supported (full_attention)", path, i,
                     t ? t : "?");
            return LLM_EUNSUP;
        }
    }
    /* a sliding window: Qwen2 says whether it is used; Mistral's applies whenever it is set */
    json_t *sw = json_object_get(o, "sliding_window");
    json_t *use = json_object_get(o, "use_sliding_window");
    int windowed = json_is_integer(sw) && (use ? json_is_true(use) : 1);
    if (windowed && json_integer_value(sw) < (json_int_t)c->ctx_len) {
        snprintf(err, errlen, "%s: sliding_window %lld (shorter than max_position_embeddings %u) is not supported for "
                 "%s: sliding-window attention runs only for gemma3", path, (long long)json_integer_value(sw), c->ctx_len,
                 c->arch);
        return LLM_EUNSUP;
    }
    json_t *pr = json_object_get(o, "partial_rotary_factor");
    if (pr && !json_is_null(pr)) {
        double f = json_is_number(pr) ? json_number_value(pr) : -1;
        uint32_t rd = (uint32_t)(c->head_dim * f + 0.5);
        if (!(f > 0 && f <= 1) || rd == 0 || rd % 2 || fabs(rd - c->head_dim * f) > 1e-6) {
            snprintf(err, errlen, "%s: partial_rotary_factor %g does not give an even number of rotated dims of %u",
                     path, f, c->head_dim);
            return LLM_EUNSUP;
        }
        c->rope_dim = rd;
    }
    return cm_rope_from_json(json_object_get(o, "rope_scaling"), c, path, err, errlen);
}

int cm_model_config_json(const char *path, cm_model_config *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        snprintf(err, errlen, "%s: not a JSON object%s%s", path, o ? "" : ": ", o ? "" : je.text);
        json_decref(o);
        return LLM_EFORMAT;
    }
    const char *mt = json_string_value(json_object_get(o, "model_type"));
    snprintf(c->arch, sizeof c->arch, "%s", mt && !strcmp(mt, "qwen2") ? "qwen2" : "llama");
    snprintf(c->name, sizeof c->name, "%s", path);
    c->n_layer = jint(o, "num_hidden_layers", 0);
    c->dim = jint(o, "hidden_size", 0);
    c->n_head = jint(o, "num_attention_heads", 0);
    c->n_kv_head = jint(o, "num_key_value_heads", c->n_head);
    c->head_dim = jint(o, "head_dim", c->n_head ? c->dim / c->n_head : 0);
    c->rope_dim = c->head_dim;
    c->hidden = jint(o, "intermediate_size", 0);
    c->vocab = jint(o, "vocab_size", 0);
    c->ctx_len = jint(o, "max_position_embeddings", 4096);
    c->tied = json_is_true(json_object_get(o, "tie_word_embeddings"));
    c->qkv_bias = !strcmp(c->arch, "qwen2") || json_is_true(json_object_get(o, "attention_bias"));
    c->rope_theta = (float)jnum(o, "rope_theta", 10000);
    c->norm_eps = (float)jnum(o, "rms_norm_eps", 1e-5);
    c->rope_type = c->qkv_bias ? CM_ROPE_NEOX : CM_ROPE_NORM;
    if (!(mt && !strcmp(mt, "bert"))) {
        int rc = decoder_keys(o, path, c, err, errlen);
        if (rc) {
            json_decref(o);
            return rc;
        }
    }
    if (mt && !strcmp(mt, "bert")) {
        snprintf(c->arch, sizeof c->arch, "bert");
        c->encoder = 1;
        c->n_kv_head = c->n_head;
        c->n_types = jint(o, "type_vocab_size", 0);
        c->ctx_len = c->max_seq = jint(o, "max_position_embeddings", 512);
        c->norm_eps = (float)jnum(o, "layer_norm_eps", 1e-12);
        c->qkv_bias = 1;
        const char *act = json_string_value(json_object_get(o, "hidden_act"));
        const char *pe = json_string_value(json_object_get(o, "position_embedding_type"));
        if (act && !strcmp(act, "gelu")) c->gelu_tanh = 0;
        else if (act && (!strcmp(act, "gelu_new") || !strcmp(act, "gelu_pytorch_tanh"))) c->gelu_tanh = 1;
        else {
            snprintf(err, errlen, "%s: hidden_act '%.32s' is not supported (gelu, gelu_new)", path, act ? act : "");
            json_decref(o);
            return LLM_EUNSUP;
        }
        if (pe && strcmp(pe, "absolute")) {
            snprintf(err, errlen, "%s: position_embedding_type '%.32s' is not supported (absolute)", path, pe);
            json_decref(o);
            return LLM_EUNSUP;
        }
    }
    json_decref(o);
    if (!c->n_layer || !c->dim || !c->n_head || !c->head_dim || !c->hidden || !c->vocab) {
        snprintf(err, errlen,
                 "%s: needs num_hidden_layers, hidden_size, num_attention_heads, intermediate_size and vocab_size", path);
        return LLM_EFORMAT;
    }
    return 0;
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
        wtype != CM_Q4_1) {
        snprintf(err, errlen, "dummy weights: type %s is not one of f32, f16, bf16, q8_0, q4_0, q4_1",
                 cm_dtype_name(wtype));
        return LLM_EUNSUP;
    }
    cm_model_config c = *cfg;
    if (!c.rope_dim) c.rope_dim = c.head_dim;
    int rc = cm_model_validate_config(&c, err, errlen);
    if (rc) return rc;
    uint64_t D = c.dim, QD = (uint64_t)c.n_head * c.head_dim, KVD = (uint64_t)c.n_kv_head * c.head_dim, H = c.hidden;
    if (cm_dtype_block(wtype) > 1 && (D % 32 || QD % 32 || H % 32)) {
        snprintf(err, errlen, "dummy weights: %s needs dim, heads x head_dim and FFN size in multiples of 32",
                 cm_dtype_name(wtype));
        return LLM_EUNSUP;
    }
    /* name, [ne0 (row length), ne1 (rows)], type: matrices in wtype, vectors in F32 */
    struct spec {
        char name[64];
        uint64_t k, n;
        int type;
    };
    size_t per_layer = 9 + (c.qkv_bias ? 3 : 0), nt = 3 + per_layer * c.n_layer;
    struct spec *sp = calloc(nt, sizeof *sp);
    cm_model_file *f = calloc(1, sizeof *f);
    size_t k = 0;
    if (!sp || !f) goto oom;
#define ADD(nm, K, N, T)                                                                                               \
    do {                                                                                                               \
        snprintf(sp[k].name, sizeof sp[k].name, "%s", nm);                                                             \
        sp[k].k = (K);                                                                                                 \
        sp[k].n = (N);                                                                                                 \
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
        LAYER("ffn_norm.weight", D, 1, CM_F32);
        LAYER("ffn_gate.weight", D, H, wtype);
        LAYER("ffn_up.weight", D, H, wtype);
        LAYER("ffn_down.weight", H, D, wtype);
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
        if (!(skip && sp[i].n > 1)) total += (cm_dtype_row_bytes(sp[i].type, sp[i].k) * sp[i].n + 63) / 64 * 64;
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
        t->n_dims = sp[i].n > 1 ? 2 : 1;
        t->ne[0] = sp[i].k;
        t->ne[1] = sp[i].n;
        t->ne[2] = t->ne[3] = 1;
        t->data = p;
        t->nbytes = cm_dtype_row_bytes(t->type, t->ne[0]) * t->ne[1];
        if (skip && t->ne[1] > 1) {
            t->data = NULL;
            continue;
        }
        /* weights uniform in +-1/sqrt(row length) keep activations O(1) through the layers */
        fill(p, t->type, t->ne[0] * t->ne[1], t->ne[1] == 1 && !strstr(t->name, "bias") ? -1.f
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
