/* cm_hf_quant.c - AWQ / GPTQ linear layers into GGUF blocks (see the
 * header for the layouts). Written from the formats' packing rules; checked
 * against tests/ref/hf_quant.py, a numpy packer and unpacker written from the
 * same rules, by tests/e2e/run_hf_quant_e2e.sh. */
#include "cm_hf_quant.h"
#include "cm_dtype.h"
#include "cm_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int get_int(json_t *o, const char *a, const char *b, int dflt) {
    json_t *v = json_object_get(o, a);
    if (!v && b) v = json_object_get(o, b);
    if (!v) return dflt;
    return json_is_integer(v) && json_integer_value(v) >= -1 && json_integer_value(v) <= 1 << 20
               ? (int)json_integer_value(v)
               : -2;
}

int cm_hfq_config_parse(json_t *config, cm_hfq_config *q, char *e, size_t el) {
    memset(q, 0, sizeof *q);
    json_t *qc = json_object_get(config, "quantization_config");
    if (!qc || json_is_null(qc)) return 0;
    const char *method = json_string_value(json_object_get(qc, "quant_method"));
    if (!json_is_object(qc) || !method) {
        snprintf(e, el, "config.json: quantization_config has no quant_method");
        return LLM_EFORMAT;
    }
    if (!strcmp(method, "gptq")) q->method = CM_HFQ_GPTQ;
    else if (!strcmp(method, "awq")) q->method = CM_HFQ_AWQ;
    else {
        snprintf(e, el, "config.json: quant_method '%.32s' is not supported (awq, gptq)", method);
        return LLM_EUNSUP;
    }
    q->bits = get_int(qc, "bits", "w_bit", 4);
    int g = get_int(qc, "group_size", "q_group_size", 128);
    if (q->bits != 4 && !(q->bits == 8 && q->method == CM_HFQ_GPTQ)) {
        snprintf(e, el, "config.json: %s with bits %d is not supported (4; GPTQ also 8)", method, q->bits);
        return LLM_EUNSUP;
    }
    if (g != -1 && (g <= 0 || g % CM_QK)) {
        snprintf(e, el, "config.json: group_size %d is not supported (-1 or a multiple of %d)", g, CM_QK);
        return LLM_EUNSUP;
    }
    q->group = g == -1 ? 0 : g;
    if (q->method == CM_HFQ_GPTQ) {
        json_t *f = json_object_get(qc, "checkpoint_format");
        const char *fmt = f ? json_string_value(f) : "gptq";
        if (!fmt || (strcmp(fmt, "gptq") && strcmp(fmt, "gptq_v2"))) {
            snprintf(e, el, "config.json: GPTQ checkpoint_format '%.32s' is not supported (gptq, gptq_v2)",
                     fmt ? fmt : "?");
            return LLM_EUNSUP;
        }
        q->zero_v2 = !strcmp(fmt, "gptq_v2");
    } else {
        json_t *v = json_object_get(qc, "version");
        const char *ver = v ? json_string_value(v) : "gemm";
        if (!ver || strcasecmp(ver, "gemm")) {
            snprintf(e, el, "config.json: AWQ version '%.32s' is not supported (gemm)", ver ? ver : "?");
            return LLM_EUNSUP;
        }
        if (json_is_false(json_object_get(qc, "zero_point"))) {
            snprintf(e, el, "config.json: AWQ without zero points is not supported");
            return LLM_EUNSUP;
        }
        q->zero_v2 = 1;
    }
    return 0;
}

static const char *const suffix[CM_HFQ_NPARTS] = {".qweight", ".qzeros", ".scales", ".g_idx"};

int cm_hfq_part(const char *name, char *base, size_t len) {
    size_t n = strlen(name);
    for (int p = 0; p < CM_HFQ_NPARTS; p++) {
        size_t s = strlen(suffix[p]);
        if (n > s && !strcmp(name + n - s, suffix[p]) && n - s + 8 < len) {
            memcpy(base, name, n - s);
            memcpy(base + n - s, ".weight", 8);
            return p;
        }
    }
    return -1;
}

static const int awq_field[8] = {0, 4, 1, 5, 2, 6, 3, 7}; /* column 8c+j lives in field awq_field[j] */

static float scale_at(const cm_st_tensor *s, size_t i) {
    if (s->type == CM_F16) return cm_f16_to_f32(((const uint16_t *)s->data)[i]);
    if (s->type == CM_BF16) return cm_bf16_to_f32(((const uint16_t *)s->data)[i]);
    return ((const float *)s->data)[i];
}

static int shape_is(const cm_st_tensor *t, uint64_t ne0, uint64_t ne1) {
    return t->n_dims == 2 && t->ne[0] == ne0 && t->ne[1] == ne1;
}

/* The zero of group g, column n (v1 stores z-1). */
static uint64_t zero_at(const cm_hfq_config *q, const uint32_t *Z, uint64_t g, uint64_t n, uint64_t N) {
    const uint64_t pack = 32u / (unsigned)q->bits, mask = (1u << q->bits) - 1;
    uint64_t z = q->method == CM_HFQ_GPTQ ? (Z[g * (N / pack) + n / pack] >> (q->bits * (n % pack))) & mask
                                          : (Z[g * (N / 8) + n / 8] >> (4 * awq_field[n % 8])) & mask;
    return z + !q->zero_v2;
}

int cm_hfq_convert(const cm_hfq_config *q, const cm_st_tensor *const part[CM_HFQ_NPARTS], const char *name,
                   cm_tensor_ref *w, cm_tensor_ref *perm, void **buf_w, void **buf_perm, char *e, size_t el) {
    *buf_w = *buf_perm = NULL;
    const cm_st_tensor *qw = part[CM_HFQ_QWEIGHT], *qz = part[CM_HFQ_QZEROS], *sc = part[CM_HFQ_SCALES],
                       *gi = part[CM_HFQ_GIDX];
    const char *what = q->method == CM_HFQ_GPTQ ? "GPTQ" : "AWQ";
    for (int p = 0; p < 3; p++)
        if (!part[p]) {
            snprintf(e, el, "%s layer '%s' has no %s", what, name, suffix[p] + 1);
            return LLM_EFORMAT;
        }
    if (gi && q->method == CM_HFQ_AWQ) {
        snprintf(e, el, "AWQ layer '%s' has a g_idx (a GPTQ tensor)", name);
        return LLM_EFORMAT;
    }
    if (qw->type != CM_I32 || qz->type != CM_I32 || (gi && gi->type != CM_I32) ||
        (sc->type != CM_F16 && sc->type != CM_BF16 && sc->type != CM_F32)) {
        snprintf(e, el, "%s layer '%s': qweight, qzeros and g_idx must be I32, scales F16, BF16 or F32", what, name);
        return LLM_EFORMAT;
    }
    const uint64_t pack = 32u / (unsigned)q->bits, mask = (1u << q->bits) - 1;
    uint64_t K, N;
    if (q->method == CM_HFQ_GPTQ) N = qw->ne[0], K = qw->ne[1] * pack;
    else N = qw->ne[0] * 8, K = qw->ne[1];
    uint64_t gs = q->group ? (uint64_t)q->group : K, G = gs ? K / gs : 0;
    if (qw->n_dims != 2 || !K || !N || K % CM_QK || N % pack || K > (1u << 20) || N > (1u << 24) || K % gs ||
        !shape_is(sc, N, G) || !shape_is(qz, N / pack, G) || (gi && (gi->n_dims != 1 || gi->ne[0] != K))) {
        snprintf(e, el,
                 "%s layer '%s': shapes qweight [%llu, %llu], qzeros [%llu, %llu], scales [%llu, %llu] do not "
                 "fit %d bits in groups of %d (inputs a multiple of %d)",
                 what, name, (unsigned long long)qw->ne[1], (unsigned long long)qw->ne[0],
                 (unsigned long long)qz->ne[1], (unsigned long long)qz->ne[0], (unsigned long long)sc->ne[1],
                 (unsigned long long)sc->ne[0], q->bits, q->group ? q->group : -1, CM_QK);
        return LLM_EFORMAT;
    }
    const uint32_t *W = qw->data, *Z = qz->data;
    const int32_t *gidx = gi ? gi->data : NULL;
    /* the group of each input, and the order that makes the groups contiguous */
    int32_t *order = NULL;
    int act_order = 0;
    if (gidx) {
        for (uint64_t k = 0; k < K; k++) {
            if (gidx[k] < 0 || (uint64_t)gidx[k] >= G) {
                snprintf(e, el, "GPTQ layer '%s': g_idx[%llu] = %d is not a group (0..%llu)", name,
                         (unsigned long long)k, gidx[k], (unsigned long long)G - 1);
                return LLM_EFORMAT;
            }
            act_order |= (uint64_t)gidx[k] != k / gs;
        }
    }
    if (act_order) {
        uint64_t *count = calloc(G + 1, sizeof *count);
        order = malloc(sizeof *order * K);
        if (!count || !order) {
            free(count);
            free(order);
            return LLM_ENOMEM;
        }
        for (uint64_t k = 0; k < K; k++) count[gidx[k] + 1]++;
        int bad = 0;
        for (uint64_t g = 0; g < G; g++) bad |= count[g + 1] % CM_QK != 0;
        for (uint64_t g = 1; g <= G; g++) count[g] += count[g - 1]; /* count[g]: where group g starts */
        for (uint64_t k = 0; k < K; k++) order[count[gidx[k]]++] = (int32_t)k; /* stable counting sort */
        free(count);
        if (bad) {
            free(order);
            snprintf(e, el, "GPTQ layer '%s': act-order groups whose sizes are not multiples of %d", name, CM_QK);
            return LLM_EUNSUP;
        }
    }
    /* the zero of each (group, column); Q4_0 when all are 8 */
    int all8 = q->bits == 4, type;
    for (uint64_t g = 0; g < G; g++)
        for (uint64_t n = 0; n < N; n++) {
            uint64_t z = zero_at(q, Z, g, n, N);
            if (q->bits == 8 && z != 128) {
                free(order);
                snprintf(e, el, "GPTQ layer '%s': 8-bit zero point %llu (asymmetric); only symmetric 8-bit "
                         "(zero 128) loads", name, (unsigned long long)z);
                return LLM_EUNSUP;
            }
            all8 &= z == 8;
        }
    type = q->bits == 8 ? CM_Q8_0 : all8 ? CM_Q4_0 : CM_Q4_1;
    size_t rb = cm_dtype_row_bytes(type, K);
    uint8_t *out = malloc(rb * N);
    if (!out) {
        free(order);
        return LLM_ENOMEM;
    }
    for (uint64_t n = 0; n < N; n++) {
        for (uint64_t b = 0; b < K / CM_QK; b++) {
            uint64_t k0 = order ? (uint64_t)order[b * CM_QK] : b * CM_QK;
            uint64_t g = gidx ? (uint64_t)gidx[k0] : k0 / gs;
            float s = scale_at(sc, g * N + n);
            if (!(s > -65504.f && s < 65504.f)) { /* NaN, or past fp16 */
                free(out);
                free(order);
                snprintf(e, el, "%s layer '%s': scale %g of group %llu, column %llu is not a finite fp16", what,
                         name, (double)s, (unsigned long long)g, (unsigned long long)n);
                return LLM_EFORMAT;
            }
            uint64_t z = zero_at(q, Z, g, n, N);
            uint8_t v[CM_QK];
            for (int j = 0; j < CM_QK; j++) {
                uint64_t k = order ? (uint64_t)order[b * CM_QK + j] : b * CM_QK + j;
                if (q->method == CM_HFQ_GPTQ) v[j] = (uint8_t)((W[(k / pack) * N + n] >> (q->bits * (k % pack))) & mask);
                else v[j] = (uint8_t)((W[k * (N / 8) + n / 8] >> (4 * awq_field[n % 8])) & mask);
            }
            uint8_t *blk = out + n * rb + b * cm_dtype_block_bytes(type);
            if (type == CM_Q8_0) {
                cm_block_q8_0 *o = (cm_block_q8_0 *)blk;
                o->d = cm_f32_to_f16(s);
                for (int j = 0; j < CM_QK; j++) o->qs[j] = (int8_t)(v[j] - 128);
            } else if (type == CM_Q4_0) {
                cm_block_q4_0 *o = (cm_block_q4_0 *)blk;
                o->d = cm_f32_to_f16(s);
                for (int j = 0; j < 16; j++) o->qs[j] = (uint8_t)(v[j] | v[j + 16] << 4);
            } else {
                cm_block_q4_1 *o = (cm_block_q4_1 *)blk;
                o->d = cm_f32_to_f16(s);
                o->m = cm_f32_to_f16(-s * (float)z);
                for (int j = 0; j < 16; j++) o->qs[j] = (uint8_t)(v[j] | v[j + 16] << 4);
            }
        }
    }
    memset(w, 0, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", name);
    w->type = type;
    w->n_dims = 2;
    w->ne[0] = K;
    w->ne[1] = N;
    w->ne[2] = w->ne[3] = 1;
    w->data = out;
    w->nbytes = rb * N;
    *buf_w = out;
    memset(perm, 0, sizeof *perm);
    if (order) {
        size_t l = strlen(name);
        snprintf(perm->name, sizeof perm->name, "%.*s.perm", (int)(l > 7 ? l - 7 : l), name);
        perm->type = CM_I32;
        perm->n_dims = 1;
        perm->ne[0] = K;
        perm->ne[1] = perm->ne[2] = perm->ne[3] = 1;
        perm->data = order;
        perm->nbytes = sizeof *order * K;
        *buf_perm = order;
    }
    return 0;
}
