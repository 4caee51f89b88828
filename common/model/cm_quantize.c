#include "cm_quantize.h"
#include "cm_dtype.h"
#include "cm_error.h"

#include <math.h>
#include <string.h>

int cm_quantize_supported(int type) {
    switch (type) {
    case CM_F32: case CM_F16: case CM_BF16: case CM_Q4_0: case CM_Q4_1: case CM_Q5_0: case CM_Q5_1:
    case CM_Q8_0: case CM_Q2_K: case CM_Q3_K: case CM_Q4_K: case CM_Q5_K: case CM_Q6_K: return 1;
    default: return 0;
    }
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }
static float wt(const float *w, int i) { return w ? w[i] : 1.f; }
/* the value a scale will be read back as */
static float f16r(float v) { return cm_f16_to_f32(cm_f32_to_f16(v)); }
static void put16(uint8_t *p, float v) {
    uint16_t h = cm_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* Symmetric: x ~ s*q, q in [qmin, qmax] (qmin = -qmax-1: one more level below 0). Candidates map the
 * element of largest magnitude near either end; each is refitted by least squares for its rounding.
 * Returns the scale (0 for an all-zero block). */
static float fit_sym(const float *x, const float *w, int n, int qmin, int qmax) {
    float amax = 0, xm = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), xm = x[i];
    if (amax == 0) return 0;
    float best_s = xm / (float)qmin, best_e = INFINITY;
    for (int side = 0; side < 2; side++)
        for (int t = side ? -2 : -4; t <= (side ? 2 : 4); t++) { /* 14 candidates: more near the longer side */
            float lev = side ? (float)qmax + 0.1f * (float)t : (float)qmin - 0.1f * (float)t; /* xm's level */
            if (fabsf(lev) < 0.5f) continue;
            float s = xm / lev;
            double sxq = 0, sqq = 0;
            for (int i = 0; i < n; i++) {
                int q = clampi((int)lrintf(x[i] / s), qmin, qmax);
                sxq += wt(w, i) * x[i] * q;
                sqq += wt(w, i) * (double)q * q;
            }
            if (sqq <= 0) continue;
            /* the refitted scale, judged as the caller will use it: rounding against itself */
            float s2 = f16r((float)(sxq / sqq));
            double e = 0;
            for (int i = 0; i < n; i++) {
                double d = x[i] - (double)s2 * clampi((int)lrintf(x[i] / s2), qmin, qmax);
                e += wt(w, i) * d * d;
            }
            if (e < best_e) best_e = e, best_s = s2;
        }
    return best_s;
}

/* Affine: x ~ s*q + m, q in [0, qmax], s >= 0; with neg_min the offset m must be <= 0 (the K-quants
 * store -m as an unsigned minimum). Candidate steps over the range, each refitted by weighted least
 * squares for (s, m) given its rounding. */
static void fit_affine(const float *x, const float *w, int n, int qmax, int neg_min, float *s_out, float *m_out) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    if (neg_min && lo > 0) lo = 0;
    if (hi <= lo) {
        *s_out = 0;
        *m_out = lo;
        return;
    }
    float best_s = (hi - lo) / (float)qmax, best_m = lo;
    double best_e = INFINITY;
    for (int t = -3; t <= 6; t++) {
        float s = (hi - lo) / ((float)qmax + 0.1f * (float)t);
        if (s <= 0) continue;
        double a = 0, b = 0, c = 0, d = 0, e = 0; /* sums of w q^2, w q, w, w x q, w x */
        for (int i = 0; i < n; i++) {
            int q = clampi((int)lrintf((x[i] - lo) / s), 0, qmax);
            float wi = wt(w, i);
            a += wi * (double)q * q, b += wi * q, c += wi, d += wi * x[i] * q, e += wi * x[i];
        }
        double det = a * c - b * b, s2, m2;
        if (det > 0) s2 = (d * c - b * e) / det, m2 = (a * e - b * d) / det;
        else s2 = s, m2 = lo;
        if (neg_min && m2 > 0) m2 = 0, s2 = a > 0 ? d / a : s;
        if (s2 <= 0) continue;
        double err = 0; /* judged as the caller will use it: rounding against the refitted pair */
        for (int i = 0; i < n; i++) {
            int q = clampi((int)lrint((x[i] - m2) / s2), 0, qmax);
            double r = x[i] - s2 * q - m2;
            err += wt(w, i) * r * r;
        }
        if (err < best_e) best_e = err, best_s = (float)s2, best_m = (float)m2;
    }
    *s_out = best_s;
    *m_out = best_m;
}

static int qsym(float x, float s, int qmin, int qmax) { return s == 0 ? 0 : clampi((int)lrintf(x / s), qmin, qmax); }
static int qaff(float x, float s, float m, int qmax) { return s == 0 ? 0 : clampi((int)lrintf((x - m) / s), 0, qmax); }

/* ---- blocks of 32 ------------------------------------------------------- */

static void q8_0(const float *x, uint8_t *b) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    float d = f16r(amax / 127.f);
    put16(b, d);
    for (int i = 0; i < 32; i++) b[2 + i] = (uint8_t)(int8_t)qsym(x[i], d, -127, 127);
}

/* Q4_0, Q4_1, Q5_0, Q5_1: bits 4 or 5, with or without a stored minimum. */
static void q45(const float *x, const float *w, int bits, int has_min, uint8_t *b) {
    int qmax = (1 << bits) - 1, off = 1 << (bits - 1);
    float d, m = 0;
    uint8_t u[32];
    if (has_min) {
        fit_affine(x, w, 32, qmax, 0, &d, &m);
        d = f16r(d), m = f16r(m);
        for (int i = 0; i < 32; i++) u[i] = (uint8_t)qaff(x[i], d, m, qmax);
    } else {
        d = f16r(fit_sym(x, w, 32, -off, off - 1));
        for (int i = 0; i < 32; i++) u[i] = (uint8_t)(qsym(x[i], d, -off, off - 1) + off);
    }
    put16(b, d);
    if (has_min) put16(b + 2, m);
    uint8_t *p = b + 2 + 2 * has_min;
    if (bits == 5) {
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) qh |= (uint32_t)(u[j] >> 4) << j;
        for (int j = 0; j < 4; j++) p[j] = (uint8_t)(qh >> (8 * j));
        p += 4;
    }
    for (int j = 0; j < 16; j++) p[j] = (uint8_t)((u[j] & 15) | (u[j + 16] & 15) << 4);
}

/* ---- super-blocks of 256 ------------------------------------------------ */

/* Q4_K and Q5_K: 8 sub-blocks of 32, 6-bit scales and minimums. */
static void qk45(const float *x, const float *w, int bits, uint8_t *b) {
    int qmax = (1 << bits) - 1;
    float s[8], mn[8], smax = 0, mmax = 0;
    for (int j = 0; j < 8; j++) {
        float m;
        fit_affine(x + 32 * j, w ? w + 32 * j : NULL, 32, qmax, 1, &s[j], &m);
        mn[j] = -m;
        smax = fmaxf(smax, s[j]), mmax = fmaxf(mmax, mn[j]);
    }
    float d = f16r(smax / 63.f), dmin = f16r(mmax / 63.f);
    uint8_t sc[8], mq[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(d > 0 ? clampi((int)lrintf(s[j] / d), 0, 63) : 0);
        mq[j] = (uint8_t)(dmin > 0 ? clampi((int)lrintf(mn[j] / dmin), 0, 63) : 0);
    }
    put16(b, d);
    put16(b + 2, dmin);
    uint8_t *S = b + 4;
    memset(S, 0, 12);
    for (int j = 0; j < 4; j++) {
        S[j] = sc[j] | (uint8_t)((sc[j + 4] >> 4) << 6);
        S[j + 4] = mq[j] | (uint8_t)((mq[j + 4] >> 4) << 6);
        S[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mq[j + 4] & 15) << 4);
    }
    uint8_t u[256];
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 32; i++) u[32 * j + i] = (uint8_t)qaff(x[32 * j + i], d * sc[j], -dmin * mq[j], qmax);
    uint8_t *qh = b + 16, *qs = b + (bits == 5 ? 48 : 16);
    if (bits == 5) memset(qh, 0, 32);
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            uint8_t lo = u[64 * g + l], hi = u[64 * g + 32 + l];
            qs[32 * g + l] = (uint8_t)((lo & 15) | (hi & 15) << 4);
            if (bits == 5) qh[l] |= (uint8_t)((lo >> 4) << (2 * g) | (hi >> 4) << (2 * g + 1));
        }
}

static void q6_k(const float *x, const float *w, uint8_t *b) {
    float s[16], amax = 0;
    for (int j = 0; j < 16; j++) {
        s[j] = fit_sym(x + 16 * j, w ? w + 16 * j : NULL, 16, -32, 31);
        amax = fmaxf(amax, fabsf(s[j]));
    }
    float d = f16r(amax / 127.f);
    int8_t sc[16];
    for (int j = 0; j < 16; j++) sc[j] = (int8_t)(d > 0 ? clampi((int)lrintf(s[j] / d), -128, 127) : 0);
    uint8_t u[256];
    for (int i = 0; i < 256; i++) u[i] = (uint8_t)(qsym(x[i], d * sc[i / 16], -32, 31) + 32);
    uint8_t *ql = b, *qh = b + 128;
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            uint8_t q1 = u[128 * n + l], q2 = u[128 * n + 32 + l], q3 = u[128 * n + 64 + l], q4 = u[128 * n + 96 + l];
            ql[64 * n + l] = (uint8_t)((q1 & 15) | (q3 & 15) << 4);
            ql[64 * n + 32 + l] = (uint8_t)((q2 & 15) | (q4 & 15) << 4);
            qh[32 * n + l] = (uint8_t)((q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
        }
    memcpy(b + 192, sc, 16);
    put16(b + 208, d);
}

/* Q3_K: 16 sub-blocks of 16, q in -4..3, 6-bit signed scales (stored +32). */
static void q3_k(const float *x, const float *w, uint8_t *b) {
    float s[16], amax = 0;
    for (int j = 0; j < 16; j++) {
        s[j] = fit_sym(x + 16 * j, w ? w + 16 * j : NULL, 16, -4, 3);
        amax = fmaxf(amax, fabsf(s[j]));
    }
    float d = f16r(amax / 31.f);
    int sc[16];
    for (int j = 0; j < 16; j++) sc[j] = d > 0 ? clampi((int)lrintf(s[j] / d), -32, 31) : 0;
    uint8_t *hm = b, *qs = b + 32, *S = b + 96;
    memset(b, 0, 108);
    for (int j = 0; j < 16; j++) {
        int v = sc[j] + 32, lo = v & 15, hi = v >> 4;
        S[j % 8] |= (uint8_t)(j < 8 ? lo : lo << 4);
        S[8 + j % 4] |= (uint8_t)(hi << (2 * (j / 4)));
    }
    for (int e = 0; e < 256; e++) {
        int u = qsym(x[e], d * (float)sc[e / 16], -4, 3) + 4, n = e / 128, jj = (e % 128) / 32, l = e % 32;
        qs[32 * n + l] |= (uint8_t)((u & 3) << (2 * jj));
        if (u & 4) hm[l] |= (uint8_t)(1 << (4 * n + jj));
    }
    put16(b + 108, d);
}

/* Q2_K: 16 sub-blocks of 16, q in 0..3, 4-bit scales and minimums. */
static void q2_k(const float *x, const float *w, uint8_t *b) {
    float s[16], mn[16], smax = 0, mmax = 0;
    for (int j = 0; j < 16; j++) {
        float m;
        fit_affine(x + 16 * j, w ? w + 16 * j : NULL, 16, 3, 1, &s[j], &m);
        mn[j] = -m;
        smax = fmaxf(smax, s[j]), mmax = fmaxf(mmax, mn[j]);
    }
    float d = f16r(smax / 15.f), dmin = f16r(mmax / 15.f);
    memset(b, 0, 80);
    int sc[16], mq[16];
    for (int j = 0; j < 16; j++) {
        sc[j] = d > 0 ? clampi((int)lrintf(s[j] / d), 0, 15) : 0;
        mq[j] = dmin > 0 ? clampi((int)lrintf(mn[j] / dmin), 0, 15) : 0;
        b[j] = (uint8_t)(sc[j] | mq[j] << 4);
    }
    uint8_t *qs = b + 16;
    for (int e = 0; e < 256; e++) {
        int j = e / 16, u = qaff(x[e], d * (float)sc[j], -dmin * (float)mq[j], 3), n = e / 128, jj = (e % 128) / 32;
        qs[32 * n + e % 32] |= (uint8_t)(u << (2 * jj));
    }
    put16(b + 80, d);
    put16(b + 82, dmin);
}

int cm_quantize_row(int type, const float *x, int64_t n, const float *imp, void *out) {
    if (!cm_quantize_supported(type)) return LLM_EUNSUP;
    size_t blk = cm_dtype_block(type), bb = cm_dtype_block_bytes(type);
    if (n <= 0 || n % (int64_t)blk) return LLM_EINVAL;
    uint8_t *o = out;
    for (int64_t i = 0; i < n; i += (int64_t)blk, o += bb) {
        const float *xb = x + i, *wb = imp ? imp + i : NULL;
        switch (type) {
        case CM_F32: memcpy(o, xb, 4); break;
        case CM_F16: put16(o, *xb); break;
        case CM_BF16: { uint16_t h = cm_f32_to_bf16(*xb); memcpy(o, &h, 2); break; }
        case CM_Q8_0: q8_0(xb, o); break;
        case CM_Q4_0: q45(xb, wb, 4, 0, o); break;
        case CM_Q4_1: q45(xb, wb, 4, 1, o); break;
        case CM_Q5_0: q45(xb, wb, 5, 0, o); break;
        case CM_Q5_1: q45(xb, wb, 5, 1, o); break;
        case CM_Q4_K: qk45(xb, wb, 4, o); break;
        case CM_Q5_K: qk45(xb, wb, 5, o); break;
        case CM_Q6_K: q6_k(xb, wb, o); break;
        case CM_Q3_K: q3_k(xb, wb, o); break;
        case CM_Q2_K: q2_k(xb, wb, o); break;
        }
    }
    return 0;
}
