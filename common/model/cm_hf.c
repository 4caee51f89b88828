/* cm_hf.c - a Hugging Face checkpoint directory as a cm_model_file.
 *
 * config.json gives the shape (cm_model_config_json), the safetensors files
 * the weights, renamed the GGUF way so the forward passes never know the
 * format. Every name a JSON file gives (shards, the pooling module's folder)
 * is checked to stay inside the directory. */
#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_hf_quant.h"
#include "cm_model.h"
#include "cm_safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_SHARDS 1024

int cm_hf_safe_name(const char *s) {
    if (!s || !*s || *s == '.' || strlen(s) > 200) return 0;
    for (const char *p = s; *p; p++)
        if (*p == '/' || *p == '\\' || (unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) return 0;
    return 1;
}

/* Per-layer tensors: the Hugging Face suffix after the layer prefix, and the
 * GGUF name after "blk.N.". */
static const struct { const char *hf, *gg; } llama_layer[] = {
    {"self_attn.q_proj.weight", "attn_q.weight"},     {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.weight", "attn_k.weight"},     {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.weight", "attn_v.weight"},     {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"}, {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},          {"mlp.down_proj.weight", "ffn_down.weight"},
    {"input_layernorm.weight", "attn_norm.weight"},   {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},       {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
}, llama_expert[] = { /* after "<prefix>.experts.E.": Qwen3-MoE's and Mixtral's names */
    {"gate_proj.weight", "ffn_gate"}, {"up_proj.weight", "ffn_up"}, {"down_proj.weight", "ffn_down"},
    {"w1.weight", "ffn_gate"},        {"w3.weight", "ffn_up"},      {"w2.weight", "ffn_down"},
}, llama_top[] = {
    {"model.embed_tokens.weight", "token_embd.weight"}, {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
}, bert_layer[] = {
    {"attention.self.query.weight", "attn_q.weight"},   {"attention.self.query.bias", "attn_q.bias"},
    {"attention.self.key.weight", "attn_k.weight"},     {"attention.self.key.bias", "attn_k.bias"},
    {"attention.self.value.weight", "attn_v.weight"},   {"attention.self.value.bias", "attn_v.bias"},
    {"attention.output.dense.weight", "attn_output.weight"}, {"attention.output.dense.bias", "attn_output.bias"},
    {"attention.output.LayerNorm.weight", "attn_output_norm.weight"},
    {"attention.output.LayerNorm.bias", "attn_output_norm.bias"},
    {"intermediate.dense.weight", "ffn_up.weight"},     {"intermediate.dense.bias", "ffn_up.bias"},
    {"output.dense.weight", "ffn_down.weight"},         {"output.dense.bias", "ffn_down.bias"},
    {"output.LayerNorm.weight", "layer_output_norm.weight"}, {"output.LayerNorm.bias", "layer_output_norm.bias"},
}, bert_top[] = {
    {"embeddings.word_embeddings.weight", "token_embd.weight"},
    {"embeddings.position_embeddings.weight", "position_embd.weight"},
    {"embeddings.token_type_embeddings.weight", "token_types.weight"},
    {"embeddings.LayerNorm.weight", "token_embd_norm.weight"}, {"embeddings.LayerNorm.bias", "token_embd_norm.bias"},
};

/* gpt-oss's own (after the layer prefix); its post-attention norm keeps GGUF's gpt-oss name */
static const struct { const char *hf, *gg; } oss_layer[] = {
    {"self_attn.o_proj.bias", "attn_output.bias"},    {"self_attn.sinks", "attn_sinks.weight"},
    {"mlp.router.weight", "ffn_gate_inp.weight"},     {"mlp.router.bias", "ffn_gate_inp.bias"},
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
};

/* The GGUF name of a Hugging Face tensor name, or 0 when the model does not
 * use it (position_ids, the BERT pooler, rotary caches). */
static int map_name(int encoder, int oss, const char *hf, char *out, size_t len) {
    char n[256];
    snprintf(n, sizeof n, "%s", hf);
    /* old BERT checkpoints: LayerNorm.gamma / beta; saved from a task model: "bert." */
    size_t nl = strlen(n);
    if (nl > 6 && !strcmp(n + nl - 6, ".gamma")) snprintf(n + nl - 6, sizeof n - (nl - 6), ".weight");
    else if (nl > 5 && !strcmp(n + nl - 5, ".beta")) snprintf(n + nl - 5, sizeof n - (nl - 5), ".bias");
    const char *s = n;
    if (encoder && !strncmp(s, "bert.", 5)) s += 5;
    const char *lp = encoder ? "encoder.layer." : "model.layers.";
    size_t lpl = strlen(lp);
    if (!strncmp(s, lp, lpl)) {
        char *end;
        unsigned long l = strtoul(s + lpl, &end, 10);
        if (end == s + lpl || *end != '.' || l > 100000) return 0;
        const char *rest = end + 1;
        /* an expert's matrix: GGUF's older per-expert name, blk.N.ffn_gate.E.weight */
        const char *ep = !strncmp(rest, "mlp.experts.", 12) ? rest + 12
                         : !strncmp(rest, "block_sparse_moe.experts.", 25) ? rest + 25 : NULL;
        if (!encoder && ep) {
            char *ee;
            unsigned long e = strtoul(ep, &ee, 10);
            if (ee == ep || *ee != '.' || e > 100000) return 0;
            for (size_t i = 0; i < sizeof llama_expert / sizeof llama_expert[0]; i++)
                if (!strcmp(ee + 1, llama_expert[i].hf) && (ep == rest + 12) == (i < 3)) {
                    snprintf(out, len, "blk.%lu.%s.%lu.weight", l, llama_expert[i].gg, e);
                    return 1;
                }
            return 0;
        }
        for (size_t i = 0; !encoder && oss && i < sizeof oss_layer / sizeof oss_layer[0]; i++)
            if (!strcmp(rest, oss_layer[i].hf)) {
                snprintf(out, len, "blk.%lu.%s", l, oss_layer[i].gg);
                return 1;
            }
        size_t nt = encoder ? sizeof bert_layer / sizeof bert_layer[0] : sizeof llama_layer / sizeof llama_layer[0];
        for (size_t i = 0; i < nt; i++) {
            const char *h = encoder ? bert_layer[i].hf : llama_layer[i].hf;
            if (!strcmp(end + 1, h)) {
                snprintf(out, len, "blk.%lu.%s", l, encoder ? bert_layer[i].gg : llama_layer[i].gg);
                return 1;
            }
        }
        return 0;
    }
    size_t nt = encoder ? sizeof bert_top / sizeof bert_top[0] : sizeof llama_top / sizeof llama_top[0];
    for (size_t i = 0; i < nt; i++)
        if (!strcmp(s, encoder ? bert_top[i].hf : llama_top[i].hf)) {
            snprintf(out, len, "%s", encoder ? bert_top[i].gg : llama_top[i].gg);
            return 1;
        }
    return 0;
}

static json_t *load_json(const char *dir, const char *name, int required, char *e, size_t el) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    if (stat(p, &st) != 0) {
        if (required) snprintf(e, el, "%s is missing", name);
        return NULL;
    }
    json_error_t je;
    json_t *o = S_ISREG(st.st_mode) && st.st_size < (64 << 20) ? json_load_file(p, JSON_REJECT_DUPLICATES, &je)
                                                               : NULL;
    if (!o || !json_is_object(o)) {
        snprintf(e, el, "%s is not a JSON object%s%s", name, o ? "" : ": ", o ? "" : je.text);
        json_decref(o);
        return NULL;
    }
    return o;
}

/* sentence-transformers' modules.json -> pooling, normalize; its
 * sentence_bert_config.json -> max_seq. Absent: CLS pooling, normalised
 * (vLLM's default for BERT embedding models). */
static int sentence_config(const char *dir, cm_model_config *c, char *e, size_t el) {
    c->pooling = CM_POOL_CLS;
    c->normalize = 1;
    json_t *mods = NULL;
    char p[1024];
    snprintf(p, sizeof p, "%s/modules.json", dir);
    struct stat st;
    if (stat(p, &st) != 0) return 0;
    json_error_t je;
    mods = st.st_size < (1 << 20) ? json_load_file(p, 0, &je) : NULL;
    if (!json_is_array(mods)) {
        snprintf(e, el, "modules.json is not a JSON array");
        json_decref(mods);
        return LLM_EFORMAT;
    }
    int rc = 0;
    c->normalize = 0;
    size_t i;
    json_t *m;
    json_array_foreach(mods, i, m) {
        const char *type = json_string_value(json_object_get(m, "type"));
        const char *path = json_string_value(json_object_get(m, "path"));
        if (!type) continue;
        if (strstr(type, "Normalize")) c->normalize = 1;
        if (!strstr(type, "Pooling")) continue;
        if (!cm_hf_safe_name(path)) {
            snprintf(e, el, "modules.json: pooling path '%.64s' is not a folder name", path ? path : "");
            rc = LLM_EFORMAT;
            break;
        }
        char cfg[512];
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        json_t *pc = load_json(dir, cfg, 1, e, el);
        if (!pc) {
            rc = LLM_EFORMAT;
            break;
        }
        int mean = json_is_true(json_object_get(pc, "pooling_mode_mean_tokens"));
        int cls = json_is_true(json_object_get(pc, "pooling_mode_cls_token"));
        int last = json_is_true(json_object_get(pc, "pooling_mode_lasttoken"));
        int other = json_is_true(json_object_get(pc, "pooling_mode_max_tokens")) ||
                    json_is_true(json_object_get(pc, "pooling_mode_mean_sqrt_len_tokens")) ||
                    json_is_true(json_object_get(pc, "pooling_mode_weightedmean_tokens"));
        json_decref(pc);
        if (mean + cls + last != 1 || other) {
            snprintf(e, el, "%.200s: only one of mean, CLS or last-token pooling is supported", cfg);
            rc = LLM_EUNSUP;
            break;
        }
        c->pooling = mean ? CM_POOL_MEAN : cls ? CM_POOL_CLS : CM_POOL_LAST;
    }
    json_decref(mods);
    if (rc) return rc;
    json_t *sb = load_json(dir, "sentence_bert_config.json", 0, e, el);
    if (sb) {
        json_t *v = json_object_get(sb, "max_seq_length");
        if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < (json_int_t)c->ctx_len)
            c->max_seq = (uint32_t)json_integer_value(v);
        json_decref(sb);
    }
    return 0;
}

/* The shard file names: model.safetensors, or the distinct values of the
 * index's weight_map. */
static int shard_names(const char *dir, char ***names, int *n, char *e, size_t el) {
    *names = NULL;
    *n = 0;
    char p[1024];
    struct stat st;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    if (stat(p, &st) != 0) {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        if (stat(p, &st) != 0) {
            snprintf(e, el, "neither model.safetensors nor model.safetensors.index.json is there");
            return LLM_ENOTFOUND;
        }
        *names = calloc(1, sizeof **names);
        if (!*names || !((*names)[0] = strdup("model.safetensors"))) return LLM_ENOMEM;
        *n = 1;
        return 0;
    }
    json_t *idx = load_json(dir, "model.safetensors.index.json", 1, e, el);
    if (!idx) return LLM_EFORMAT;
    json_t *wm = json_object_get(idx, "weight_map");
    int rc = 0;
    if (!json_is_object(wm)) {
        snprintf(e, el, "model.safetensors.index.json has no weight_map object");
        rc = LLM_EFORMAT;
    }
    *names = calloc(MAX_SHARDS, sizeof **names);
    if (!*names) rc = LLM_ENOMEM;
    const char *k;
    json_t *v;
    if (!rc) json_object_foreach(wm, k, v) {
        const char *f = json_string_value(v);
        if (!cm_hf_safe_name(f)) {
            snprintf(e, el, "weight_map: '%.64s' names '%.64s', not a file of the directory", k, f ? f : "");
            rc = LLM_EFORMAT;
            break;
        }
        int seen = 0;
        for (int i = 0; i < *n && !seen; i++) seen = !strcmp((*names)[i], f);
        if (seen) continue;
        if (*n == MAX_SHARDS) {
            snprintf(e, el, "weight_map names more than %d files", MAX_SHARDS);
            rc = LLM_EFORMAT;
            break;
        }
        if (!((*names)[(*n)++] = strdup(f))) rc = LLM_ENOMEM;
    }
    json_decref(idx);
    if (!rc && !*n) {
        snprintf(e, el, "weight_map is empty");
        rc = LLM_EFORMAT;
    }
    return rc;
}

static int push_tensor(cm_model_file *m, size_t *cap, const cm_tensor_ref *r) {
    if (m->n_tensors == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        cm_tensor_ref *nt = realloc(m->tensors, nc * sizeof *nt);
        if (!nt) return LLM_ENOMEM;
        m->tensors = nt;
        *cap = nc;
    }
    m->tensors[m->n_tensors++] = *r;
    return 0;
}

/* An AWQ / GPTQ layer's parts as the files give them. */
typedef struct {
    char name[64]; /* the GGUF name of its weight */
    const cm_st_tensor *part[CM_HFQ_NPARTS];
} hfq_layer;

typedef struct {
    cm_hfq_config cfg;
    hfq_layer *l;
    size_t n, cap;
} hfq_set;

static int add_part(hfq_set *q, int p, const char *name, const cm_st_tensor *t, const char *file, char *e,
                    size_t el) {
    size_t i = 0;
    while (i < q->n && strcmp(q->l[i].name, name)) i++;
    if (i == q->n) {
        if (q->n == q->cap) {
            size_t nc = q->cap ? q->cap * 2 : 64;
            hfq_layer *nl = realloc(q->l, nc * sizeof *nl);
            if (!nl) return LLM_ENOMEM;
            q->l = nl;
            q->cap = nc;
        }
        memset(&q->l[q->n], 0, sizeof q->l[0]);
        snprintf(q->l[q->n].name, sizeof q->l[0].name, "%s", name);
        q->n++;
    }
    if (q->l[i].part[p]) {
        snprintf(e, el, "%s: tensor '%s' appears twice", file, t->name);
        return LLM_EFORMAT;
    }
    q->l[i].part[p] = t;
    return 0;
}

/* gpt-oss's experts as OpenAI ships them: per layer, gate and up interleaved row by row (even rows gate)
 * in one tensor, each row MXFP4 blocks of 32 (16 bytes, element 2i in byte i's low nibble and 2i+1 in its
 * high one) with their E8M0 scales apart, and the biases likewise interleaved. */
enum { OSS_GU_B, OSS_GU_S, OSS_GU_BIAS, OSS_DN_B, OSS_DN_S, OSS_DN_BIAS, OSS_N };
static const char *const oss_part_names[OSS_N] = {"gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias",
                                                  "down_proj_blocks",    "down_proj_scales",    "down_proj_bias"};
typedef struct {
    const cm_st_tensor *p[OSS_N];
} oss_layer_parts;

/* The layer and part of "model.layers.N.mlp.experts.<part>", or -1. */
static int oss_part(const char *name, uint32_t n_layer, uint32_t *layer) {
    const char *lp = "model.layers.";
    if (strncmp(name, lp, 13)) return -1;
    char *end;
    unsigned long l = strtoul(name + 13, &end, 10);
    if (end == name + 13 || l >= n_layer || strncmp(end, ".mlp.experts.", 13)) return -1;
    for (int i = 0; i < OSS_N; i++)
        if (!strcmp(end + 13, oss_part_names[i])) {
            *layer = (uint32_t)l;
            return i;
        }
    return -1;
}

static int add_tensors(cm_model_file *m, const cm_safetensors *s, const char *file, size_t *cap, hfq_set *q,
                       oss_layer_parts *oss, char *e, size_t el) {
    for (size_t i = 0; i < s->n_tensors; i++) {
        const cm_st_tensor *t = &s->tensors[i];
        char name[64], base[256];
        uint32_t ol;
        int op = oss ? oss_part(t->name, m->cfg.n_layer, &ol) : -1;
        if (op >= 0) {
            if (oss[ol].p[op]) {
                snprintf(e, el, "%s: tensor '%s' appears twice", file, t->name);
                return LLM_EFORMAT;
            }
            oss[ol].p[op] = t;
            continue;
        }
        int p = q->cfg.method ? cm_hfq_part(t->name, base, sizeof base) : -1;
        if (p >= 0) {
            int rc = map_name(m->cfg.encoder, m->cfg.gpt_oss, base, name, sizeof name) ? add_part(q, p, name, t, file, e, el) : 0;
            if (rc) return rc;
            continue;
        }
        if (!map_name(m->cfg.encoder, m->cfg.gpt_oss, t->name, name, sizeof name)) {
            /* an encoder's task heads (pooler, cls) are not its embedding; a decoder's every
             * tensor is its math, but for the RoPE table old checkpoints saved (recomputed here) */
            size_t nl = strlen(t->name);
            if (m->cfg.encoder || (nl > 20 && !strcmp(t->name + nl - 20, "rotary_emb.inv_freq"))) continue;
            snprintf(e, el, "%s: tensor '%s' is not one this engine computes with: refused rather than ignored", file,
                     t->name);
            return LLM_EUNSUP;
        }
        if (t->type != CM_F32 && t->type != CM_F16 && t->type != CM_BF16) {
            snprintf(e, el, "%s: tensor '%s' is %s (F32, F16 and BF16 load)", file, t->name, t->dtype);
            return LLM_EUNSUP;
        }
        if (cm_model_tensor(m, name)) {
            snprintf(e, el, "%s: tensor '%s' appears twice", file, t->name);
            return LLM_EFORMAT;
        }
        cm_tensor_ref r;
        memset(&r, 0, sizeof r);
        snprintf(r.name, sizeof r.name, "%s", name);
        r.type = t->type;
        r.n_dims = t->n_dims;
        memcpy(r.ne, t->ne, sizeof r.ne);
        r.data = t->data;
        r.nbytes = t->nbytes;
        int rc = push_tensor(m, cap, &r);
        if (rc) return rc;
    }
    return 0;
}

static int own_buf(cm_model_file *m, void *p) {
    void **nb = realloc(m->bufs, sizeof *nb * (size_t)(m->n_bufs + 1));
    if (!nb) {
        free(p);
        return LLM_ENOMEM;
    }
    m->bufs = nb;
    m->bufs[m->n_bufs++] = p;
    return 0;
}

static float st_float(const cm_st_tensor *t, size_t i) {
    const uint8_t *d = t->data;
    if (t->type == CM_F32) {
        float f;
        memcpy(&f, d + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, d + 2 * i, 2);
    return t->type == CM_F16 ? cm_f16_to_f32(h) : cm_bf16_to_f32(h);
}

/* Rows row0, row0 + step, ... (n of them) of each expert of an [E][rows][k] MXFP4 blocks + scales pair as a
 * GGUF MXFP4 tensor [k, n, E] (e, qs[16]: element j in byte j's low nibble, j + 16 in its high one), and the
 * same rows of the [E][rows] bias as F32 [n, E]. */
static int oss_tensor(cm_model_file *m, size_t *cap, const cm_st_tensor *bl, const cm_st_tensor *sc,
                      const cm_st_tensor *bias, uint32_t l, const char *kind, uint64_t E, uint64_t rows, uint64_t k,
                      uint64_t row0, uint64_t step, char *e, size_t el) {
    uint64_t n = rows / step, nb = k / 32;
    if (bl->n_dims != 4 || bl->ne[0] != 16 || bl->ne[1] != nb || bl->ne[2] != rows || bl->ne[3] != E ||
        strcmp(bl->dtype, "U8") || sc->n_dims != 3 || sc->ne[0] != nb || sc->ne[1] != rows || sc->ne[2] != E ||
        strcmp(sc->dtype, "U8") || bias->n_dims != 2 || bias->ne[0] != rows || bias->ne[1] != E ||
        (bias->type != CM_F32 && bias->type != CM_F16 && bias->type != CM_BF16)) {
        snprintf(e, el, "layer %u: '%s' / '%s' / '%s' are not U8 [%llu, %llu, %llu, 16], U8 [.., %llu] and a float "
                 "[%llu, %llu]", l, bl->name, sc->name, bias->name, (unsigned long long)E, (unsigned long long)rows,
                 (unsigned long long)nb, (unsigned long long)nb, (unsigned long long)E, (unsigned long long)rows);
        return LLM_EFORMAT;
    }
    uint8_t *w = malloc(E * n * nb * 17);
    float *b = malloc(sizeof(float) * E * n);
    int rc = !w || !b ? LLM_ENOMEM : 0;
    if (rc) {
        free(w);
        free(b);
        return rc;
    }
    if ((rc = own_buf(m, w))) {
        free(b);
        return rc;
    }
    if ((rc = own_buf(m, b))) return rc;
    const uint8_t *B = bl->data, *S = sc->data;
    for (uint64_t x = 0; x < E; x++)
        for (uint64_t r = 0; r < n; r++) {
            uint64_t src = x * rows + row0 + r * step;
            b[x * n + r] = st_float(bias, src);
            for (uint64_t j = 0; j < nb; j++) {
                const uint8_t *in = B + (src * nb + j) * 16;
                uint8_t *o = w + ((x * n + r) * nb + j) * 17, u[32];
                for (int i = 0; i < 16; i++) u[2 * i] = in[i] & 15, u[2 * i + 1] = in[i] >> 4;
                o[0] = S[src * nb + j];
                for (int i = 0; i < 16; i++) o[1 + i] = (uint8_t)(u[i] | u[i + 16] << 4);
            }
        }
    cm_tensor_ref r;
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "blk.%u.ffn_%s_exps.weight", l, kind);
    r.type = CM_MXFP4;
    r.n_dims = 3;
    r.ne[0] = k, r.ne[1] = n, r.ne[2] = E, r.ne[3] = 1;
    r.data = w;
    r.nbytes = E * n * nb * 17;
    if ((rc = push_tensor(m, cap, &r))) return rc;
    snprintf(r.name, sizeof r.name, "blk.%u.ffn_%s_exps.bias", l, kind);
    r.type = CM_F32;
    r.n_dims = 2;
    r.ne[0] = n, r.ne[1] = E, r.ne[2] = 1;
    r.data = b;
    r.nbytes = sizeof(float) * E * n;
    return push_tensor(m, cap, &r);
}

/* Every layer's gpt-oss experts into the GGUF tensors the loader reads (llama.cpp's converter does the same). */
static int oss_convert(cm_model_file *m, size_t *cap, const oss_layer_parts *oss, char *e, size_t el) {
    const cm_model_config *c = &m->cfg;
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const oss_layer_parts *p = &oss[l];
        for (int i = 0; i < OSS_N; i++)
            if (!p->p[i]) {
                snprintf(e, el, "model.layers.%u.mlp.experts.%s is missing (gpt-oss's experts load as MXFP4 blocks, "
                         "scales and biases)", l, oss_part_names[i]);
                return LLM_EFORMAT;
            }
        int rc;
        if ((rc = oss_tensor(m, cap, p->p[OSS_GU_B], p->p[OSS_GU_S], p->p[OSS_GU_BIAS], l, "gate", c->n_expert,
                             2 * (uint64_t)c->hidden, c->dim, 0, 2, e, el)) ||
            (rc = oss_tensor(m, cap, p->p[OSS_GU_B], p->p[OSS_GU_S], p->p[OSS_GU_BIAS], l, "up", c->n_expert,
                             2 * (uint64_t)c->hidden, c->dim, 1, 2, e, el)) ||
            (rc = oss_tensor(m, cap, p->p[OSS_DN_B], p->p[OSS_DN_S], p->p[OSS_DN_BIAS], l, "down", c->n_expert, c->dim,
                             c->hidden, 0, 1, e, el)))
            return rc;
    }
    return 0;
}

/* Every AWQ / GPTQ layer into GGUF blocks (and its permutation). */
static int convert_layers(cm_model_file *m, size_t *cap, const hfq_set *q, char *e, size_t el) {
    if (q->n) {
        void **nb = realloc(m->bufs, sizeof *nb * (size_t)(m->n_bufs + 2 * (int)q->n));
        if (!nb) return LLM_ENOMEM;
        m->bufs = nb;
    }
    for (size_t i = 0; i < q->n; i++) {
        const hfq_layer *l = &q->l[i];
        if (cm_model_tensor(m, l->name)) {
            snprintf(e, el, "'%s' is both quantized and a plain weight", l->name);
            return LLM_EFORMAT;
        }
        cm_tensor_ref w, perm;
        void *bw, *bp;
        int rc = cm_hfq_convert(&q->cfg, l->part, l->name, &w, &perm, &bw, &bp, e, el);
        if (rc) return rc;
        if (bw) m->bufs[m->n_bufs++] = bw;
        if (bp) m->bufs[m->n_bufs++] = bp;
        if ((rc = push_tensor(m, cap, &w)) || (perm.data && (rc = push_tensor(m, cap, &perm)))) return rc;
    }
    return 0;
}

int cm_hf_open(const char *dir, cm_model_file **out, char *err, size_t errlen) {
    *out = NULL;
    char e[512] = "";
    char **shards = NULL;
    int n_shards = 0, rc;
    size_t cap = 0;
    hfq_set q;
    memset(&q, 0, sizeof q);
    oss_layer_parts *oss_parts = NULL;
    cm_model_file *m = calloc(1, sizeof *m);
    if (!m) return LLM_ENOMEM;
    m->format = CM_FMT_HF;
    snprintf(m->path, sizeof m->path, "%s", dir);
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", dir);
    struct stat st;
    if (stat(p, &st) != 0) {
        snprintf(e, sizeof e, "a directory without config.json (not a Hugging Face checkpoint)");
        rc = LLM_ENOTFOUND;
        goto fail;
    }
    json_t *cj = load_json(dir, "config.json", 1, e, sizeof e);
    if (!cj) {
        rc = LLM_EFORMAT;
        goto fail;
    }
    const char *mt = json_string_value(json_object_get(cj, "model_type"));
    static const char *const types[] = {"bert", "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gpt_oss",
                                        NULL};
    int known = 0;
    for (const char *const *t = types; mt && *t; t++) known |= !strcmp(mt, *t);
    snprintf(e, sizeof e, "config.json: model_type '%.32s' is not supported (bert, gpt_oss, llama, mistral, mixtral, "
             "qwen2, qwen3, qwen3_moe)", mt ? mt : "");
    int tie = json_is_true(json_object_get(cj, "tie_word_embeddings"));
    if (!known) {
        json_decref(cj);
        rc = LLM_EUNSUP;
        goto fail;
    }
    e[0] = 0;
    /* gpt-oss ships its experts in MXFP4 (quant_method mxfp4, the rest unquantized): read below, not by cm_hf_quant */
    const char *qm = json_string_value(json_object_get(json_object_get(cj, "quantization_config"), "quant_method"));
    int oss = !strcmp(mt, "gpt_oss");
    if (oss && (!qm || strcmp(qm, "mxfp4"))) {
        snprintf(e, sizeof e, "config.json: a gpt_oss checkpoint loads with its experts in MXFP4 (quant_method mxfp4, "
                 "as OpenAI ships it), not %.32s", qm ? qm : "unquantized");
        json_decref(cj);
        rc = LLM_EUNSUP;
        goto fail;
    }
    rc = oss ? 0 : cm_hfq_config_parse(cj, &q.cfg, e, sizeof e);
    if (!rc && q.cfg.method && !strcmp(mt, "bert")) {
        snprintf(e, sizeof e, "config.json: quantized encoder (bert) checkpoints are not supported");
        rc = LLM_EUNSUP;
    }
    json_decref(cj);
    if (rc) goto fail;
    m->hf_quant = q.cfg.method;
    if ((rc = cm_model_config_json(p, &m->cfg, e, sizeof e))) goto fail;
    const char *base = strrchr(dir, '/') && strrchr(dir, '/')[1] ? strrchr(dir, '/') + 1 : dir;
    snprintf(m->cfg.name, sizeof m->cfg.name, "%s", base);
    if (!m->cfg.encoder) {
        m->cfg.rope_type = CM_ROPE_NEOX; /* Hugging Face keeps q/k unpermuted: rotate halves */
    } else if ((rc = sentence_config(dir, &m->cfg, e, sizeof e))) {
        goto fail;
    }
    if (oss && !(oss_parts = calloc(m->cfg.n_layer, sizeof *oss_parts))) {
        rc = LLM_ENOMEM;
        goto fail;
    }
    if ((rc = shard_names(dir, &shards, &n_shards, e, sizeof e))) goto fail;
    m->st = calloc((size_t)n_shards, sizeof *m->st);
    if (!m->st) {
        rc = LLM_ENOMEM;
        goto fail;
    }
    for (int i = 0; i < n_shards; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, shards[i]);
        char se[400];
        if ((rc = cm_st_open(p, &m->st[m->n_st], se, sizeof se))) {
            snprintf(e, sizeof e, "%s", se);
            goto fail;
        }
        m->n_st++;
        if ((rc = add_tensors(m, m->st[i], shards[i], &cap, &q, oss_parts, e, sizeof e))) goto fail;
    }
    if ((rc = convert_layers(m, &cap, &q, e, sizeof e))) goto fail;
    if (oss_parts && (rc = oss_convert(m, &cap, oss_parts, e, sizeof e))) goto fail;
    free(oss_parts);
    oss_parts = NULL;
    free(q.l);
    q.l = NULL;
    m->cfg.tied = !m->cfg.encoder && (tie || !cm_model_tensor(m, "output.weight"));
    if ((rc = cm_model_validate_config(&m->cfg, e, sizeof e))) goto fail;
    for (int i = 0; i < n_shards; i++) free(shards[i]);
    free(shards);
    *out = m;
    return 0;
fail:
    if (err) snprintf(err, errlen, "%s: %s", dir, e);
    free(q.l);
    free(oss_parts);
    for (int i = 0; i < n_shards; i++) free(shards[i]);
    free(shards);
    cm_model_close(m);
    return rc;
}
