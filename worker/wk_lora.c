/* wk_lora.c - PEFT LoRA adapters: loading into this rank's share, and the
 * per-sequence deltas of a step (wk_lora.h). */
#include "wk_lora.h"
#include "wk_wire.h"

#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_gguf.h"
#include "cm_hash.h"
#include "cm_log.h"
#include "cm_time.h"
#include "cm_safetensors.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const MOD_HF[WK_LORA_N] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                              "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                              "mlp.down_proj"};

/* adapter_config.json: honoured (peft_type, r, lora_alpha, target_modules, use_rslora; the rest only at the
 * value that changes nothing: no DoRA, no bias, no modules saved whole, every layer) or with no effect on
 * the forward pass (names, training settings). Any other key that is not null, false or empty refuses it. */
static const char *const KEYS[] = {"peft_type", "r", "lora_alpha", "target_modules", "use_rslora", "use_dora",
    "bias", "modules_to_save", "layers_to_transform", "layers_pattern", "rank_pattern", "alpha_pattern",
    "fan_in_fan_out", "lora_bias", "exclude_modules",
    /* no effect */
    "base_model_name_or_path", "task_type", "inference_mode", "lora_dropout", "init_lora_weights", "revision",
    "auto_mapping", "megatron_config", "megatron_core", "loftq_config", "layer_replication", "peft_version",
    "eva_config", "corda_config", "trainable_token_indices", "qalora_group_size", "use_qalora", "target_parameters",
    NULL};

static int empty(json_t *v) {
    return !v || json_is_null(v) || json_is_false(v) || (json_is_array(v) && !json_array_size(v)) ||
           (json_is_object(v) && !json_object_size(v)) || (json_is_string(v) && !strcmp(json_string_value(v), "none"));
}

static int config(const char *dir, wk_lora *l, int targets[WK_LORA_N], char *err, size_t errlen) {
    char p[1024];
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    json_error_t je;
    json_t *o = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
    int rc = LLM_EUNSUP;
    if (!json_is_object(o)) {
        snprintf(err, errlen, "%s: %s", p, o ? "not a JSON object" : je.text);
        json_decref(o);
        return LLM_EFORMAT;
    }
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        int known = 0;
        for (const char *const *k = KEYS; *k && !known; k++) known = !strcmp(*k, key);
        if (!known && !empty(v)) {
            snprintf(err, errlen, "%s: %.60s changes the adapter in a way this engine does not implement: refused", p, key);
            goto out;
        }
    }
    static const char *const must_be_empty[] = {"use_dora", "bias", "modules_to_save", "layers_to_transform",
                                                "rank_pattern", "alpha_pattern", "fan_in_fan_out", "lora_bias",
                                                "exclude_modules", NULL};
    for (const char *const *k = must_be_empty; *k; k++)
        if (!empty(json_object_get(o, *k))) {
            snprintf(err, errlen, "%s: %s is not supported (LoRA of the linear projections, every layer, no bias)", p, *k);
            goto out;
        }
    const char *pt = json_string_value(json_object_get(o, "peft_type"));
    if (pt && strcmp(pt, "LORA")) {
        snprintf(err, errlen, "%s: peft_type '%.32s' is not LORA", p, pt);
        goto out;
    }
    json_t *r = json_object_get(o, "r"), *al = json_object_get(o, "lora_alpha");
    if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > WK_LORA_MAX_RANK ||
        (al && !json_is_number(al))) {
        snprintf(err, errlen, "%s: r must be a positive integer and lora_alpha a number", p);
        rc = LLM_EFORMAT;
        goto out;
    }
    l->rank = (int)json_integer_value(r);
    l->ldr = (l->rank + KN_LORA_ALIGN - 1) / KN_LORA_ALIGN * KN_LORA_ALIGN;
    double alpha = al ? json_number_value(al) : 8;
    l->scale = (float)(alpha / (json_is_true(json_object_get(o, "use_rslora")) ? sqrt(l->rank) : l->rank));
    json_t *tm = json_object_get(o, "target_modules");
    for (int i = 0; i < WK_LORA_N; i++) targets[i] = 0;
    size_t n = json_is_array(tm) ? json_array_size(tm) : json_is_string(tm) ? 1 : 0;
    for (size_t i = 0; i < n; i++) {
        const char *t = json_is_array(tm) ? json_string_value(json_array_get(tm, i)) : json_string_value(tm);
        int found = 0;
        for (int j = 0; t && j < WK_LORA_N; j++) {
            const char *short_name = strchr(MOD_HF[j], '.') + 1;
            if (!strcmp(t, short_name) || !strcmp(t, MOD_HF[j])) targets[j] = found = 1;
        }
        if (!found) {
            snprintf(err, errlen, "%s: target_modules '%.40s' is not a projection this engine adapts (q_proj, k_proj, "
                     "v_proj, o_proj, gate_proj, up_proj, down_proj)", p, t ? t : "?");
            goto out;
        }
    }
    rc = 0;
out:
    json_decref(o);
    return rc;
}

static float elem(const cm_st_tensor *t, uint64_t i) {
    if (t->type == CM_F32) return ((const float *)t->data)[i];
    uint16_t h = ((const uint16_t *)t->data)[i];
    return t->type == CM_F16 ? cm_f16_to_f32(h) : cm_bf16_to_f32(h);
}

/* Element i of t into factor b (0: A, 1: B) of x at e: the F16 bits as they are, else as a float. */
static void set(wk_lora_mat *x, size_t e, int b, const cm_st_tensor *t, uint64_t i) {
    if (x->half) ((uint16_t *)(b ? x->bt : x->at))[e] = ((const uint16_t *)t->data)[i];
    else ((float *)(b ? x->bt : x->at))[e] = elem(t, i);
}

/* This rank's share of projection j: input columns [c0, c0 + in_l) of in, output rows [r0, r0 + out_l) of out. */
static void share(const wk_model *m, int j, int *in, int *c0, int *in_l, int *out, int *r0, int *out_l) {
    const cm_model_config *c = &m->cfg;
    int D = (int)c->dim, hd = (int)c->head_dim, H = (int)c->hidden;
    int q0 = m->head0 * hd, qn = m->n_head_l * hd, k0 = m->kv0 * hd, kn = m->n_kv_l * hd;
    *in = D, *c0 = 0, *in_l = D;
    switch (j) {
    case WK_LORA_Q: *out = (int)c->n_head * hd, *r0 = q0, *out_l = qn; break;
    case WK_LORA_K: case WK_LORA_V: *out = (int)c->n_kv_head * hd, *r0 = k0, *out_l = kn; break;
    case WK_LORA_GATE: case WK_LORA_UP: *out = H, *r0 = m->hid0, *out_l = m->hidden_l; break;
    case WK_LORA_O: *in = (int)c->n_head * hd, *c0 = q0, *in_l = qn, *out = D, *r0 = 0, *out_l = D; break;
    default: *in = H, *c0 = m->hid0, *in_l = m->hidden_l, *out = D, *r0 = 0, *out_l = D; break;
    }
}

/* The Hugging Face row of GGUF row g of a Q (or K) projection whose RoPE rotates adjacent pairs: llama.cpp's
 * converter interleaves each head's halves (row 2i <- i, 2i+1 <- hd/2 + i); its base weights are stored so. */
/* The row of B's source for this rank's output row g of projection j. Q/K rows differ in order where the
 * engine's RoPE and the source's disagree: a PEFT adapter is in Hugging Face order, and on a GGUF base of
 * adjacent-pair RoPE the engine's rows are in the converter's order; a GGUF LoRA is in the converter's
 * order, and on a Hugging Face llama directory the engine's rows are in Hugging Face order (qwen's
 * converter keeps the order, as its RoPE rotates halves). */
static int src_row(const wk_model *m, int gguf, int j, int g) {
    int hd = (int)m->cfg.head_dim;
    if (j != WK_LORA_Q && j != WK_LORA_K) return g;
    int h = g / hd, i = g % hd;
    if (!gguf) return m->cfg.rope_type != CM_ROPE_NORM ? g : h * hd + (i % 2 ? hd / 2 + i / 2 : i / 2);
    if (m->file->format != CM_FMT_HF || strcmp(m->cfg.arch, "llama")) return g;
    return h * hd + (i < hd / 2 ? 2 * i : 2 * (i - hd / 2) + 1);
}

static int load_mat(const wk_model *m, wk_lora *l, int layer, int j, const cm_st_tensor *A, const cm_st_tensor *B,
                    const char *dir, char *err, size_t errlen) {
    int in, c0, in_l, out, r0, out_l, r = l->rank;
    share(m, j, &in, &c0, &in_l, &out, &r0, &out_l);
    const cm_st_tensor *ts[2] = {A, B};
    for (int i = 0; i < 2; i++) {
        const cm_st_tensor *t = ts[i];
        uint64_t want0 = i ? (uint64_t)r : (uint64_t)in, want1 = i ? (uint64_t)out : (uint64_t)r;
        if (!t || t->n_dims != 2 || t->ne[0] != want0 || t->ne[1] != want1 ||
            (t->type != CM_F32 && t->type != CM_F16 && t->type != CM_BF16)) {
            snprintf(err, errlen, "%s: layer %d %s lora_%c: %s (expected F32/F16/BF16 [%llu, %llu])", dir, layer,
                     MOD_HF[j], i ? 'B' : 'A', t ? "wrong shape or type" : "missing", (unsigned long long)want1,
                     (unsigned long long)want0);
            return LLM_EFORMAT;
        }
    }
    wk_lora_mat *x = &l->mat[(size_t)layer * WK_LORA_N + (size_t)j];
    x->half = A->type == CM_F16 && B->type == CM_F16;
    size_t es = x->half ? sizeof(uint16_t) : sizeof(float);
    x->at = calloc((size_t)in_l * (size_t)l->ldr, es); /* the columns past the rank stay zero */
    x->bt = malloc(es * (size_t)r * (size_t)out_l);
    if (!x->at || !x->bt) return LLM_ENOMEM;
    for (int k = 0; k < r; k++)
        for (int c = 0; c < in_l; c++) set(x, (size_t)c * l->ldr + k, 0, A, (uint64_t)k * in + (uint64_t)(c0 + c));
    for (int o = 0; o < out_l; o++) {
        int hr = src_row(m, l->gguf, j, r0 + o);
        for (int k = 0; k < r; k++) set(x, (size_t)k * out_l + o, 1, B, (uint64_t)hr * r + (uint64_t)k);
    }
    return 0;
}

/* The projections' GGUF names, in the order of wk_lora.mat. */
static const char *const MOD_GGUF[WK_LORA_N] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                                "ffn_down"};

/* A GGUF LoRA (llama.cpp's convert_lora_to_gguf: general.type "adapter", adapter.type "lora",
 * adapter.lora.alpha, tensors blk.N.<projection>.weight.lora_a [in, r] and .lora_b [r, out], Q/K rows in
 * the converter's order): every key honoured or a general.* name, every tensor a factor of a projection
 * this engine adapts, one rank for all; else refused by name. */
static int load_gguf(const wk_model *m, wk_lora *l, const char *path, int max_rank, char *err, size_t errlen) {
    cm_gguf *g = NULL;
    char e[400];
    int rc = cm_gguf_open(path, &g, e, sizeof e);
    if (rc) {
        snprintf(err, errlen, "LoRA adapter %s: %s", l->name, e);
        return rc;
    }
    rc = LLM_EUNSUP;
    cm_str arch = {0}, type = {0}, at = {0};
    cm_gguf_get_str(g, "general.architecture", &arch);
    cm_gguf_get_str(g, "general.type", &type);
    cm_gguf_get_str(g, "adapter.type", &at);
    if (type.len != 7 || memcmp(type.ptr, "adapter", 7) || at.len != 4 || memcmp(at.ptr, "lora", 4)) {
        snprintf(err, errlen, "LoRA adapter %s: %s is not a LoRA adapter (general.type '%.*s', adapter.type '%.*s')",
                 l->name, path, (int)type.len, type.ptr ? type.ptr : "", (int)at.len, at.ptr ? at.ptr : "");
        goto out;
    }
    if (arch.len != strlen(m->cfg.arch) || memcmp(arch.ptr, m->cfg.arch, arch.len)) {
        snprintf(err, errlen, "LoRA adapter %s: %s is for architecture '%.*s', the model is '%s'", l->name, path,
                 (int)arch.len, arch.ptr ? arch.ptr : "", m->cfg.arch);
        goto out;
    }
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const cm_str *k = &g->kv[i].key;
        if ((k->len > 8 && !memcmp(k->ptr, "general.", 8)) || (k->len == 12 && !memcmp(k->ptr, "adapter.type", 12)) ||
            (k->len == 18 && !memcmp(k->ptr, "adapter.lora.alpha", 18)))
            continue;
        snprintf(err, errlen, "LoRA adapter %s: %s has key %.*s, which changes the adapter in a way this engine "
                 "does not implement: refused", l->name, path, (int)k->len, k->ptr);
        goto out;
    }
    float alpha = 0;
    cm_gguf_get_f32(g, "adapter.lora.alpha", &alpha);
    cm_st_tensor *ts = calloc((size_t)g->n_tensors + 1, sizeof *ts);
    if (!ts) { rc = LLM_ENOMEM; goto out; }
    int *slot = calloc((size_t)l->n_layer * WK_LORA_N * 2, sizeof *slot); /* tensor index + 1 of each factor */
    if (!slot) { free(ts); rc = LLM_ENOMEM; goto out; }
    rc = 0;
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) {
        const cm_gguf_tensor *t = &g->tensors[i];
        char nm[160];
        snprintf(nm, sizeof nm, "%.*s", (int)(t->name.len < 150 ? t->name.len : 150), t->name.ptr);
        unsigned layer;
        int off = 0, j = -1, b = -1;
        if (sscanf(nm, "blk.%u.%n", &layer, &off) == 1 && off && layer < (unsigned)l->n_layer)
            for (int k = 0; k < WK_LORA_N && j < 0; k++) {
                size_t ml = strlen(MOD_GGUF[k]);
                if (strncmp(nm + off, MOD_GGUF[k], ml)) continue;
                if (!strcmp(nm + off + ml, ".weight.lora_a")) j = k, b = 0;
                else if (!strcmp(nm + off + ml, ".weight.lora_b")) j = k, b = 1;
            }
        if (j < 0) {
            snprintf(err, errlen, "LoRA adapter %s: tensor '%s' is not a LoRA factor of a projection this engine "
                     "adapts: refused rather than ignored", l->name, nm);
            rc = LLM_EUNSUP;
            break;
        }
        ts[i] = (cm_st_tensor){NULL, t->type, "", t->n_dims, {t->ne[0], t->ne[1], t->ne[2], t->ne[3]}, t->data,
                               t->nbytes};
        slot[((size_t)layer * WK_LORA_N + (size_t)j) * 2 + (size_t)b] = (int)i + 1;
        if (!b && (!l->rank || (int)t->ne[1] != l->rank)) {
            if (l->rank) {
                snprintf(err, errlen, "LoRA adapter %s: tensors of rank %d and %d: one rank for the whole adapter "
                         "is supported", l->name, l->rank, (int)t->ne[1]);
                rc = LLM_EUNSUP;
            }
            l->rank = (int)t->ne[1];
        }
    }
    if (!rc && (l->rank < 1 || l->rank > max_rank || l->rank > WK_LORA_MAX_RANK)) {
        snprintf(err, errlen, "LoRA adapter %s: rank %d is %s --max-lora-rank %d", l->name, l->rank,
                 l->rank < 1 ? "not a rank:" : "above", max_rank);
        rc = LLM_EINVAL;
    }
    if (!rc) {
        l->ldr = (l->rank + KN_LORA_ALIGN - 1) / KN_LORA_ALIGN * KN_LORA_ALIGN;
        l->scale = alpha != 0 ? alpha / (float)l->rank : 1.f; /* llama.cpp's: no alpha, no scaling */
        l->gguf = 1;
        if (!(l->mat = calloc((size_t)l->n_layer * WK_LORA_N, sizeof *l->mat))) rc = LLM_ENOMEM;
    }
    for (int layer = 0; !rc && layer < l->n_layer; layer++)
        for (int j = 0; !rc && j < WK_LORA_N; j++) {
            int ia = slot[((size_t)layer * WK_LORA_N + (size_t)j) * 2], ib = slot[((size_t)layer * WK_LORA_N + (size_t)j) * 2 + 1];
            if (ia || ib) rc = load_mat(m, l, layer, j, ia ? &ts[ia - 1] : NULL, ib ? &ts[ib - 1] : NULL, path, err, errlen);
        }
    free(slot);
    free(ts);
out:
    cm_gguf_close(g);
    return rc;
}

int wk_lora_load(const wk_model *m, const char *name, const char *dir, int max_rank, wk_lora **out, char *err,
                 size_t errlen) {
    *out = NULL;
    const cm_model_config *c = &m->cfg;
    if (c->n_expert || c->gemma || m->perm_k) {
        snprintf(err, errlen, "LoRA adapter %s: not supported on %s models", name,
                 c->n_expert ? "mixture-of-experts" : c->gemma ? "gemma3" : "act-order GPTQ");
        return LLM_EUNSUP;
    }
    wk_lora *l = calloc(1, sizeof *l);
    if (!l) return LLM_ENOMEM;
    snprintf(l->name, sizeof l->name, "%s", name);
    snprintf(l->path, sizeof l->path, "%s", dir);
    l->n_layer = (int)c->n_layer;
    int targets[WK_LORA_N], rc;
    cm_safetensors *st = NULL;
    struct stat sb;
    if (!stat(dir, &sb) && S_ISREG(sb.st_mode)) { /* a file: a GGUF LoRA */
        if ((rc = load_gguf(m, l, dir, max_rank, err, errlen))) goto fail;
        *out = l;
        return 0;
    }
    if ((rc = config(dir, l, targets, err, errlen))) goto fail;
    if (l->rank > max_rank) {
        snprintf(err, errlen, "LoRA adapter %s: rank %d is above --max-lora-rank %d", name, l->rank, max_rank);
        rc = LLM_EINVAL;
        goto fail;
    }
    l->mat = calloc((size_t)c->n_layer * WK_LORA_N, sizeof *l->mat);
    if (!l->mat) { rc = LLM_ENOMEM; goto fail; }
    char p[1024], e[400];
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    if ((rc = cm_st_open(p, &st, e, sizeof e))) {
        snprintf(err, errlen, "LoRA adapter %s: %s", name, e);
        goto fail;
    }
    /* every tensor one this engine applies */
    for (size_t i = 0; i < st->n_tensors; i++) {
        const char *t = st->tensors[i].name, *s = t;
        if (!strncmp(s, "base_model.model.", 17)) s += 17;
        char *end;
        unsigned long layer = strncmp(s, "model.layers.", 13) ? ~0ul : strtoul(s + 13, &end, 10);
        int ok = 0;
        if (layer < c->n_layer && *end == '.')
            for (int j = 0; j < WK_LORA_N && !ok; j++) {
                size_t ml = strlen(MOD_HF[j]);
                ok = targets[j] && !strncmp(end + 1, MOD_HF[j], ml) &&
                     (!strcmp(end + 1 + ml, ".lora_A.weight") || !strcmp(end + 1 + ml, ".lora_B.weight"));
            }
        if (!ok) {
            snprintf(err, errlen, "LoRA adapter %s: tensor '%.120s' is not a LoRA factor of a targeted projection this "
                     "engine adapts: refused rather than ignored", name, t);
            rc = LLM_EUNSUP;
            goto fail;
        }
    }
    int found = 0;
    for (uint32_t layer = 0; layer < c->n_layer; layer++)
        for (int j = 0; j < WK_LORA_N; j++) {
            char an[256], bn[256];
            snprintf(an, sizeof an, "base_model.model.model.layers.%u.%s.lora_A.weight", layer, MOD_HF[j]);
            snprintf(bn, sizeof bn, "base_model.model.model.layers.%u.%s.lora_B.weight", layer, MOD_HF[j]);
            const cm_st_tensor *A = cm_st_find(st, an), *B = cm_st_find(st, bn);
            if (!A) A = cm_st_find(st, an + 17);
            if (!B) B = cm_st_find(st, bn + 17);
            if (!A && !B) continue;
            if ((rc = load_mat(m, l, (int)layer, j, A, B, dir, err, errlen))) goto fail;
            found++;
        }
    if (!found) {
        snprintf(err, errlen, "LoRA adapter %s: %s has no LoRA factors", name, p);
        rc = LLM_EFORMAT;
        goto fail;
    }
    cm_st_close(st);
    *out = l;
    return 0;
fail:
    cm_st_close(st);
    wk_lora_free(l);
    return rc;
}

void wk_lora_free(wk_lora *l) {
    if (!l) return;
    for (size_t i = 0; l->mat && i < (size_t)l->n_layer * WK_LORA_N; i++) {
        free(l->mat[i].at);
        free(l->mat[i].bt);
    }
    free(l->mat);
    free(l);
}

int wk_lora_find(const wk_model *m, const char *name) {
    for (int i = 0; i < m->n_loras; i++)
        if (m->loras[i] && !m->loras[i]->dead && !strcmp(m->loras[i]->name, name)) return i + 1;
    return 0;
}

uint64_t wk_lora_salt(const wk_model *m, int slot, uint64_t salt) {
    const wk_lora *L = m->loras[slot - 1];
    salt = cm_salt_lora(salt, L->name);
    if (!L->gen) return salt;
    char g[32];
    snprintf(g, sizeof g, "#%u", L->gen);
    return cm_salt_lora(salt, g);
}

/* Rank 0 tells the ranks that slot (1-based) now holds name from path (path empty: freed). */
static int send_update(wk_model *m, int slot, const char *name, const char *path) {
    size_t nl = strlen(name), pl = strlen(path), n = nl + pl + 2;
    char buf[1024];
    if (n > sizeof buf) return LLM_ERANGE;
    memcpy(buf, name, nl + 1);
    memcpy(buf + nl + 1, path, pl + 1);
    int32_t hdr[4] = {WK_PLAN_MAGIC, WK_PLAN_LORA, slot, (int32_t)n};
    m->plan_t = cm_now();
    int rc = wk_wire_down(m, hdr, sizeof hdr);
    return rc ? rc : wk_wire_down(m, buf, n);
}

/* Every rank says whether its part of an update failed; all learn whether any did (one all-reduce). */
static int agree(wk_model *m, int failed, int *any) {
    *any = failed;
    return wk_wire_grouped(m) ? wk_wire_agree(m, failed, any) : 0;
}

static void put(wk_model *m, int slot, wk_lora *L) {
    m->loras[slot - 1] = L;
    if (L && slot > m->n_loras) m->n_loras = slot;
    while (m->n_loras && !m->loras[m->n_loras - 1]) m->n_loras--;
}

int wk_lora_add(wk_model *m, const char *name, const char *path, char *err, size_t errlen) {
    if (!m->max_loras) {
        snprintf(err, errlen, "LoRA is off on this worker (start it with --enable-lora)");
        return LLM_EUNSUP;
    }
    size_t nl = strlen(name);
    if (!nl || nl > 63 || strpbrk(name, "\n=,") || !path[0]) {
        snprintf(err, errlen, "lora_name must be 1 to 63 characters without newline, '=' or ',', and lora_path "
                              "a directory");
        return LLM_EINVAL;
    }
    if (wk_lora_find(m, name)) {
        snprintf(err, errlen, "The lora adapter '%s' has already been loaded.", name);
        return LLM_EINVAL;
    }
    int slot = 0;
    for (int i = 0; i < m->max_loras && !slot; i++)
        if (!m->loras[i]) slot = i + 1;
    if (!slot) {
        snprintf(err, errlen, "all %d LoRA slots (--max-loras) are taken: unload an adapter first", m->max_loras);
        return LLM_EAGAIN;
    }
    wk_lora *L = NULL;
    int rc = wk_lora_load(m, name, path, m->max_lora_rank, &L, err, errlen);
    if (rc) return rc; /* nothing sent: the other ranks never hear of it */
    L->gen = ++m->lora_version;
    put(m, slot, L);
    if (wk_wire_grouped(m)) {
        int any;
        if ((rc = send_update(m, slot, name, path)) || (rc = agree(m, 0, &any))) return rc;
        if (any) {
            put(m, slot, NULL);
            wk_lora_free(L);
            snprintf(err, errlen, "LoRA adapter %s: another rank of the group could not load %s (see its log)",
                     name, path);
            return LLM_EIO;
        }
    }
    CM_INFO("LoRA adapter %s loaded from %s (rank %d) into slot %d", name, path, L->rank, slot);
    return 0;
}

int wk_lora_remove(wk_model *m, const char *name, char *err, size_t errlen) {
    int slot = m->max_loras ? wk_lora_find(m, name) : 0;
    if (!slot) {
        snprintf(err, errlen, "The lora adapter '%s' cannot be found.", name);
        return LLM_ENOTFOUND;
    }
    m->loras[slot - 1]->dead = 1;
    m->lora_version++;
    CM_INFO("LoRA adapter %s unloaded (%d requests still use it)", name, m->loras[slot - 1]->refs);
    return 0;
}

void wk_lora_ref(wk_model *m, int slot, int d) {
    if (slot > 0 && slot <= m->n_loras && m->loras[slot - 1]) m->loras[slot - 1]->refs += d;
}

int wk_lora_collect(wk_model *m) {
    for (int i = 0; i < m->n_loras; i++) {
        wk_lora *L = m->loras[i];
        if (!L || !L->dead || L->refs > 0) continue;
        int rc = wk_wire_grouped(m) ? send_update(m, i + 1, L->name, "") : 0;
        put(m, i + 1, NULL);
        wk_lora_free(L);
        if (rc) return rc;
    }
    return 0;
}

int wk_lora_follow(wk_model *m, int slot, const char *name, const char *path) {
    if (slot < 1 || slot > m->max_loras) return LLM_EFORMAT;
    if (!path[0]) { /* freed on rank 0 */
        wk_lora_free(m->loras[slot - 1]);
        put(m, slot, NULL);
        return 0;
    }
    char err[512] = "";
    wk_lora *L = NULL;
    int failed = m->loras[slot - 1] != NULL || wk_lora_load(m, name, path, m->max_lora_rank, &L, err, sizeof err);
    if (failed) CM_ERR("LoRA adapter %s: rank %d could not load it: %s", name, m->tp_rank, err[0] ? err : "slot in use");
    else put(m, slot, L);
    int any, rc = agree(m, failed, &any);
    if (any && !failed) {
        put(m, slot, NULL);
        wk_lora_free(L);
    }
    return rc;
}

/* A step's rows of one adapter for one output, up to ITEM_ROWS of them: one piece of work. */
#define ITEM_ROWS 16
typedef struct {
    const wk_lora_mat *f;
    const wk_lora *L;
    const wk_lora_out *o;
    int r0, n; /* rows[r0, r0 + n) */
} apply_item;

struct wk_lora_step {
    int32_t *rows;   /* the step's rows, grouped by adapter: adapter a's are rows[start[a - 1], start[a]) */
    int *start;      /* [n_loras + 1]; start[0] is where the first adapter's rows begin */
    apply_item *it;
    int cap_rows, cap_it;
};

void wk_lora_step_free(struct wk_lora_step *st) {
    if (!st) return;
    free(st->rows);
    free(st->start);
    free(st->it);
    free(st);
}

int wk_lora_group(wk_model *m, int n_seq, const wk_batch_seq *s) {
    int any = 0, T = 0, na = m->n_loras;
    for (int i = 0; i < n_seq; i++) any |= s[i].lora, T += s[i].n;
    if (!any) return 0;
    struct wk_lora_step *st = m->lora_step;
    if (!st && !(st = m->lora_step = calloc(1, sizeof *st))) return LLM_ENOMEM;
    int need_it = 3 * (T / ITEM_ROWS + na + 1); /* items of up to three outputs */
    if (T > st->cap_rows || need_it > st->cap_it || !st->start) {
        int32_t *r = realloc(st->rows, sizeof(int32_t) * (size_t)T);
        if (r) st->rows = r;
        apply_item *it = realloc(st->it, sizeof(apply_item) * (size_t)need_it);
        if (it) st->it = it;
        if (!st->start) st->start = malloc(sizeof(int) * ((size_t)m->max_loras + 2));
        if (!r || !it || !st->start) return LLM_ENOMEM;
        st->cap_rows = T, st->cap_it = need_it;
    }
    /* a counting sort over the slots: start[a] counts, then begins, then ends adapter a's rows */
    int *start = st->start;
    memset(start, 0, sizeof(int) * ((size_t)na + 2));
    for (int i = 0; i < n_seq; i++) start[s[i].lora + 1] += s[i].n;
    for (int a = 1; a <= na + 1; a++) start[a] += start[a - 1];
    for (int i = 0, t0 = 0; i < n_seq; t0 += s[i].n, i++)
        for (int t = t0; t < t0 + s[i].n; t++) st->rows[start[s[i].lora]++] = t;
    return 1;
}

typedef struct {
    int in_l;
    const float *x;
    const int32_t *rows;
    const apply_item *it;
    int n_item;
} apply_ctx;

/* Items [i0, i1): each adapter's factors read once for up to ITEM_ROWS rows, through the kernels' shrink
 * (x A^T, scaled, into a rank-sized row each on the stack) and expand (+= t B^T). */
static void apply_task(void *arg, int ith, int nth) {
    apply_ctx *c = arg;
    int i0 = c->n_item * ith / nth, i1 = c->n_item * (ith + 1) / nth;
    for (int i = i0; i < i1; i++) {
        const apply_item *it = &c->it[i];
        const float *xr[ITEM_ROWS];
        float *yr[ITEM_ROWS];
        for (int r = 0; r < it->n; r++) {
            xr[r] = c->x + (size_t)c->rows[it->r0 + r] * c->in_l;
            yr[r] = it->o->y + (size_t)c->rows[it->r0 + r] * it->o->out_l;
        }
        float t[ITEM_ROWS * WK_LORA_MAX_RANK];
        kn_lora_shrink(it->f->at, it->f->half, c->in_l, it->L->ldr, xr, it->n, it->L->scale, t);
        kn_lora_expand(it->f->bt, it->f->half, it->L->rank, it->o->out_l, t, it->L->ldr, it->n, yr);
    }
}

void wk_lora_apply(wk_model *m, int l, int n, const wk_lora_out *o, const float *x, int in_l) {
    struct wk_lora_step *st = m->lora_step;
    int n_item = 0;
    for (int a = 1; a <= m->n_loras; a++) { /* adapter a's rows: [start[a - 1], start[a]) */
        const wk_lora *L = m->loras[a - 1];
        for (int k = 0; L && k < n; k++) {
            const wk_lora_mat *f = &L->mat[(size_t)l * WK_LORA_N + (size_t)o[k].which];
            if (!f->at) continue;
            for (int r = st->start[a - 1]; r < st->start[a]; r += ITEM_ROWS)
                st->it[n_item++] =
                    (apply_item){f, L, &o[k], r, st->start[a] - r < ITEM_ROWS ? st->start[a] - r : ITEM_ROWS};
        }
    }
    apply_ctx c = {in_l, x, st->rows, st->it, n_item};
    if (n_item == 1) apply_task(&c, 0, 1);
    else if (n_item) kn_pool_run(m->pool, apply_task, &c);
}
