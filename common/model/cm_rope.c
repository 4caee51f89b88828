/* cm_rope.c - RoPE scaling from GGUF and config.json; see cm_rope.h. The
 * formulas are Hugging Face's _compute_*_parameters and vLLM's rotary
 * embeddings, written out from their definitions. */
#include "cm_rope.h"
#include "cm_error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cm_rope_type_name(int type) {
    switch (type) {
    case CM_RS_LINEAR: return "linear";
    case CM_RS_DYNAMIC: return "dynamic";
    case CM_RS_YARN: return "yarn";
    case CM_RS_LLAMA3: return "llama3";
    default: return "none";
    }
}

static double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * log(factor) + 1.0; }

/* yarn's blend ends: the pair index at which a wavelength makes rot turns over orig_ctx */
static double corr_dim(double rot, double dim, double base, double orig) {
    return dim * log(orig / (rot * 2 * M_PI)) / (2 * log(base));
}

void cm_rope_inv_freq(const cm_rope_scaling *rs, double theta, uint32_t rope_dim, const float *factors,
                      float *inv_freq) {
    uint32_t half = rope_dim / 2;
    int type = rs ? rs->type : CM_RS_NONE;
    double f = rs && rs->factor > 0 ? rs->factor : 1.0;
    if (type == CM_RS_DYNAMIC) /* vLLM: the NTK base for the longest context the factor allows */
        theta *= pow(f * f - (f - 1), (double)rope_dim / (double)(rope_dim - 2));
    double lo = 0, hi = 0;
    if (type == CM_RS_YARN) {
        lo = corr_dim(rs->beta_fast, rope_dim, theta, rs->orig_ctx);
        hi = corr_dim(rs->beta_slow, rope_dim, theta, rs->orig_ctx);
        if (rs->truncate) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        if (lo < 0) lo = 0;
        if (hi > rope_dim - 1) hi = rope_dim - 1;
        if (lo == hi) hi += 0.001;
    }
    for (uint32_t i = 0; i < half; i++) {
        double v = pow(theta, -2.0 * i / (double)rope_dim);
        switch (type) {
        case CM_RS_LINEAR:
            v /= f;
            break;
        case CM_RS_YARN: { /* extrapolate the fast pairs, interpolate the slow ones, blend between */
            double ramp = ((double)i - lo) / (hi - lo);
            double ext = 1 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp);
            v = v / f * (1 - ext) + v * ext;
            break;
        }
        case CM_RS_LLAMA3: {
            double wavelen = 2 * M_PI / v, lo_w = rs->orig_ctx / rs->low_freq_factor,
                   hi_w = rs->orig_ctx / rs->high_freq_factor;
            if (wavelen > lo_w) {
                v /= f;
            } else if (wavelen >= hi_w) {
                double s = (rs->orig_ctx / wavelen - rs->low_freq_factor) / (rs->high_freq_factor - rs->low_freq_factor);
                v = (1 - s) * v / f + s * v;
            }
            break;
        }
        default:
            break;
        }
        if (factors) v /= factors[i];
        inv_freq[i] = (float)v;
    }
}

/* What the scaling changes beyond the frequencies: the longest context (as
 * vLLM derives it) and yarn's attention factor, folded into the score
 * scale (q.k times mscale^2: every rotated dim carries mscale on q and k). */
static int finish(cm_model_config *c, const char *what, char *err, size_t errlen) {
    cm_rope_scaling *rs = &c->rs;
    if (rs->type == CM_RS_NONE) return 0;
    if (!(rs->factor >= 1.f && rs->factor <= 1024.f)) {
        snprintf(err, errlen, "%s: rope scaling factor %g is out of range (1..1024)", what, (double)rs->factor);
        return LLM_EFORMAT;
    }
    if ((rs->type == CM_RS_YARN || rs->type == CM_RS_LLAMA3) && !(rs->orig_ctx > 0 && rs->orig_ctx <= c->ctx_len)) {
        snprintf(err, errlen, "%s: %s rope scaling needs an original context between 1 and %u (it is %u)", what,
                 cm_rope_type_name(rs->type), c->ctx_len, rs->orig_ctx);
        return LLM_EFORMAT;
    }
    if (rs->type == CM_RS_LLAMA3 && !(rs->low_freq_factor > 0 && rs->high_freq_factor > rs->low_freq_factor)) {
        snprintf(err, errlen, "%s: llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor (%g, %g)", what,
                 (double)rs->low_freq_factor, (double)rs->high_freq_factor);
        return LLM_EFORMAT;
    }
    if (rs->type == CM_RS_YARN) {
        if (!(rs->beta_fast > rs->beta_slow && rs->beta_slow > 0)) {
            snprintf(err, errlen, "%s: yarn needs beta_fast > beta_slow > 0 (%g, %g)", what, (double)rs->beta_fast,
                     (double)rs->beta_slow);
            return LLM_EFORMAT;
        }
        if (!(rs->mscale > 0 && rs->mscale < 100)) {
            snprintf(err, errlen, "%s: yarn attention factor %g is out of range", what, (double)rs->mscale);
            return LLM_EFORMAT;
        }
        if (rs->mscale != 1.f && c->rope_dim != c->head_dim) { /* only rotated dims carry it: no single score scale */
            snprintf(err, errlen, "%s: yarn's attention factor with partial rotary (%u of %u dims) is not supported",
                     what, c->rope_dim, c->head_dim);
            return LLM_EUNSUP;
        }
        float base = c->attn_scale > 0 ? c->attn_scale : 1.f / sqrtf((float)c->head_dim);
        c->attn_scale = base * rs->mscale * rs->mscale;
    }
    if (!c->gemma) { /* Gemma 3's GGUF and config give the scaled context already */
        double len = rs->type == CM_RS_LINEAR || rs->type == CM_RS_DYNAMIC ? (double)c->ctx_len * rs->factor
                     : rs->type == CM_RS_YARN                             ? (double)rs->orig_ctx * rs->factor
                                                                          : (double)c->ctx_len;
        c->ctx_len = len > (double)(1u << 24) ? (1u << 24) : (uint32_t)len;
    }
    return 0;
}

static int str_is(cm_str s, const char *z) { return s.len == strlen(z) && !memcmp(s.ptr, z, s.len); }

int cm_rope_from_gguf(const cm_gguf *g, cm_model_config *c, char *err, size_t errlen) {
    char key[128], what[160];
    cm_str st;
    cm_rope_scaling *rs = &c->rs;
    memset(rs, 0, sizeof *rs);
    snprintf(key, sizeof key, "%s.rope.scaling.type", c->arch);
    if (cm_gguf_get_str(g, key, &st) || str_is(st, "none")) return 0;
    if (str_is(st, "linear")) rs->type = CM_RS_LINEAR;
    else if (str_is(st, "yarn")) rs->type = CM_RS_YARN;
    else {
        snprintf(err, errlen, "%s '%.*s' is not supported (none, linear, yarn)", key, (int)(st.len < 32 ? st.len : 32),
                 st.ptr);
        return LLM_EUNSUP;
    }
    snprintf(what, sizeof what, "%s.rope.scaling", c->arch);
    rs->factor = 1.f;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", c->arch);
    cm_gguf_get_f32(g, key, &rs->factor);
    if (rs->type == CM_RS_YARN) {
        float attn = 1.f;
        rs->orig_ctx = c->ctx_len;
        rs->beta_fast = 32.f;
        rs->beta_slow = 1.f;
        rs->truncate = 1;
        snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", c->arch);
        cm_gguf_get_u32(g, key, &rs->orig_ctx);
        snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", c->arch);
        cm_gguf_get_f32(g, key, &attn);
        snprintf(key, sizeof key, "%s.rope.scaling.yarn_beta_fast", c->arch);
        cm_gguf_get_f32(g, key, &rs->beta_fast);
        snprintf(key, sizeof key, "%s.rope.scaling.yarn_beta_slow", c->arch);
        cm_gguf_get_f32(g, key, &rs->beta_slow);
        /* llama.cpp: the attention factor multiplies yarn's own 0.1 ln(s) + 1 */
        rs->mscale = (float)(attn * yarn_mscale(rs->factor, 1.0));
        if (rs->orig_ctx > c->ctx_len) c->ctx_len = rs->orig_ctx;
    }
    return finish(c, what, err, errlen);
}

static int jnum(const json_t *o, const char *k, double def, double *out) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return -1;
    *out = json_number_value(v);
    return 0;
}

int cm_rope_from_json(const json_t *o, cm_model_config *c, const char *what, char *err, size_t errlen) {
    cm_rope_scaling *rs = &c->rs;
    memset(rs, 0, sizeof *rs);
    if (!o || json_is_null(o)) return 0;
    if (!json_is_object(o)) {
        snprintf(err, errlen, "%s: rope_scaling must be an object or null", what);
        return LLM_EFORMAT;
    }
    const json_t *tv = json_object_get(o, "rope_type");
    if (!tv) tv = json_object_get(o, "type");
    const char *t = json_string_value(tv);
    if (!t) {
        snprintf(err, errlen, "%s: rope_scaling without a rope_type", what);
        return LLM_EFORMAT;
    }
    /* the keys each type reads; any other is refused by name */
    static const struct {
        const char *name;
        int type;
        const char *keys;
    } T[] = {
        {"default", CM_RS_NONE, ""},
        {"linear", CM_RS_LINEAR, "factor"},
        {"dynamic", CM_RS_DYNAMIC, "factor"},
        {"yarn", CM_RS_YARN, "factor original_max_position_embeddings attention_factor beta_fast beta_slow mscale "
                             "mscale_all_dim truncate"},
        {"llama3", CM_RS_LLAMA3, "factor original_max_position_embeddings low_freq_factor high_freq_factor"},
    };
    int k = -1;
    for (int i = 0; i < (int)(sizeof T / sizeof *T); i++)
        if (!strcmp(t, T[i].name)) k = i;
    if (k < 0) {
        snprintf(err, errlen, "%s: rope_scaling rope_type '%.40s' is not supported (linear, dynamic, yarn, llama3)", what,
                 t);
        return LLM_EUNSUP;
    }
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)o, key, val) {
        if (!strcmp(key, "rope_type") || !strcmp(key, "type")) continue;
        size_t n = strlen(key);
        const char *p = strstr(T[k].keys, key);
        int listed = p && (p == T[k].keys || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0);
        if (!listed && !json_is_null(val)) {
            char *v = json_dumps(val, JSON_ENCODE_ANY | JSON_COMPACT);
            snprintf(err, errlen, "%s: rope_scaling.%.40s = %.40s is not supported with rope_type %s", what, key,
                     v ? v : "?", t);
            free(v);
            return LLM_EUNSUP;
        }
    }
    rs->type = T[k].type;
    if (rs->type == CM_RS_NONE) return 0;
    double f = 0, orig = 0, a = 0, b = 0, ms = 0, msa = 0, attn = 0;
    int bad = jnum(o, "factor", 0, &f) | jnum(o, "original_max_position_embeddings", c->ctx_len, &orig);
    if (bad || !(orig > 0 && orig < (double)(1u << 24))) {
        snprintf(err, errlen, "%s: rope_scaling factor and original_max_position_embeddings must be numbers", what);
        return LLM_EFORMAT;
    }
    rs->factor = (float)f;
    rs->orig_ctx = (uint32_t)orig;
    if (rs->type == CM_RS_LLAMA3) {
        bad = jnum(o, "low_freq_factor", 1, &a) | jnum(o, "high_freq_factor", 4, &b);
        rs->low_freq_factor = (float)a;
        rs->high_freq_factor = (float)b;
    } else if (rs->type == CM_RS_YARN) {
        bad = jnum(o, "beta_fast", 32, &a) | jnum(o, "beta_slow", 1, &b) | jnum(o, "mscale", 0, &ms) |
              jnum(o, "mscale_all_dim", 0, &msa) | jnum(o, "attention_factor", -1, &attn);
        const json_t *tr = json_object_get(o, "truncate");
        if (tr && !json_is_boolean(tr) && !json_is_null(tr)) bad = 1;
        rs->truncate = !json_is_false(tr);
        rs->beta_fast = (float)a;
        rs->beta_slow = (float)b;
        if (attn < 0) /* Hugging Face: 0.1 ln(s) + 1, or its ratio with DeepSeek's mscale pair */
            attn = ms && msa ? yarn_mscale(f, ms) / yarn_mscale(f, msa) : yarn_mscale(f, 1.0);
        rs->mscale = (float)attn;
    }
    if (bad) {
        snprintf(err, errlen, "%s: a rope_scaling field of rope_type %s is not a number", what, t);
        return LLM_EFORMAT;
    }
    return finish(c, what, err, errlen);
}
