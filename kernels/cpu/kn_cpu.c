/* kn_cpu.c - run-time dispatch, weight repacking, the parallel matmul driver
 * and the element-wise ops. */
#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_quant.h"
#include "kn_int.h"

#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__aarch64__)
#include <sys/auxv.h>
#endif
#if (defined(__x86_64__) || defined(__i386__)) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static const kn_impl *impl = &kn_impl_scalar;
static int initialised;
static int act_f32; /* float activations for quantized weights (reference mode) */

void kn_set_act_f32(int on) {
    act_f32 = on;
}

int kn_weight_wants_act(const kn_weight *w) {
    return w->pack != KN_PACK_NONE && !act_f32;
}

static const kn_impl *isa_impl(const char *what) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (strcmp(what, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &kn_impl_avx2 : NULL;
    if (strcmp(what, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                       __builtin_cpu_supports("avx512dq")
                   ? &kn_impl_avx512
                   : NULL;
#endif
#if defined(__aarch64__)
    if (strcmp(what, "neon") == 0) return &kn_impl_neon; /* Advanced SIMD is part of ARMv8-A */
    if (strcmp(what, "neon-dotprod") == 0) return getauxval(AT_HWCAP) & HWCAP_ASIMDDP ? &kn_impl_neon_dot : NULL;
#endif
    return strcmp(what, "scalar") == 0 ? &kn_impl_scalar : NULL;
}

static int amx_state; /* 0 not asked yet, 1 usable, -1 not */

/* The CPU's AMX-TILE and AMX-INT8 bits (cpuid 7.0 EDX 24, 25), and Linux's grant of the tile data state
 * to this process (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), which it needs before the first
 * tile instruction of any thread. */
static int amx_usable(void) {
    if (amx_state) return amx_state > 0;
    amx_state = -1;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__linux__)
    unsigned a, b, c, d;
    if (!isa_impl("avx512") || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1) || !(d >> 25 & 1))
        return 0;
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0) return 0;
    amx_state = 1;
#endif
    return amx_state > 0;
}

int kn_set_amx(int on) {
    if (on && !amx_usable()) return LLM_EUNSUP;
#if defined(__x86_64__) || defined(__i386__)
    kn_amx_on = on;
#endif
    return 0;
}

int kn_amx_active(void) {
    kn_init();
#if defined(__x86_64__) || defined(__i386__)
    return kn_amx_on && impl == &kn_impl_avx512;
#else
    return 0;
#endif
}

/* AMX on by default where usable, LLMSERVE_AMX=0 keeps it off; a note for the start-up line. */
static void amx_default(char *why, size_t len) {
    const char *env = getenv("LLMSERVE_AMX");
    if (env && !strcmp(env, "0")) return;
    if (kn_set_amx(1) != 0) return;
    size_t n = strlen(why);
    if (n < len) snprintf(why + n, len - n, "; AMX int8 tiles for batches of 16+");
}

int kn_set_isa(const char *name) {
    const kn_impl *p = isa_impl(name);
    if (!p) return LLM_EUNSUP;
    impl = p;
    initialised = 1;
    return 0;
}

static char isa_reason[256];

/* Reference mode for a whole process (exactness checks): LLMSERVE_ACT_F32=1. */
static void act_f32_env(void) {
    const char *f32 = getenv("LLMSERVE_ACT_F32");
    if (f32 && !strcmp(f32, "1")) act_f32 = 1;
}

int kn_follow_isa(const char *name, int amx, const char *whose) {
    const kn_impl *p = NULL;
    static const char *const names[] = {"avx512", "avx2", "neon-dotprod", "neon", "scalar"};
    for (size_t i = 0; i < sizeof names / sizeof *names && !p; i++) {
        const kn_impl *q = isa_impl(names[i]);
        if (q && (!strcmp(q->name, name) || !strcmp(names[i], name))) p = q;
    }
    if (!p || (amx && (p != isa_impl("avx512") || !amx_usable()))) return LLM_EUNSUP;
    if (!initialised) act_f32_env();
    impl = p;
    initialised = 1;
    kn_set_amx(amx);
    snprintf(isa_reason, sizeof isa_reason, "%.64s%s", whose, amx ? "; AMX int8 tiles for batches of 16+" : "");
    return 0;
}

const char *kn_isa_reason(void) {
    kn_init();
    return isa_reason;
}

#if defined(__x86_64__) || defined(__i386__)
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A CPU with both may run AVX-512 slower than AVX2 (frequency drops, or 512-bit work split in halves),
 * so the two time the shape that dominates a step: a Q4_1 GEMM (512 x 1024, 4 activation rows), best
 * of 9 interleaved runs each, one thread. AVX-512 stays unless AVX2 is 15% faster in each of 3 rounds
 * a few ms apart: noise must not flip the choice between processes of one host. Processes that start
 * together (a group's ranks) time each other's AVX-512 on a shared core: 6 at once on 2 cores under
 * ASan picked AVX2 in 7 of 360 starts with one round. A worker group's ranks take rank 0's choice
 * (kn_follow_isa) rather than their own. About 10 ms where AVX-512 wins. */
static void pick_by_measuring(const kn_impl *a, const kn_impl *b, char *why, size_t whylen) {
    enum { N = 512, K = 1024, B = 4 };
    size_t rb = cm_dtype_row_bytes(CM_Q4_1, K);
    uint8_t *raw = malloc(rb * N);
    float *x = malloc(sizeof(float) * B * K), *y = malloc(sizeof(float) * B * N);
    kn_weight w;
    kn_act act;
    int ok = raw && x && y && kn_act_init(&act, K, B) == 0;
    if (ok) {
        uint32_t r = 12345;
        for (size_t i = 0; i < rb * N; i++) raw[i] = (uint8_t)((r = r * 1103515245u + 12345u) >> 16);
        for (int i = 0; i < N * K / 32; i++) { /* sane scales: bytes 0..3 of each block are d and m */
            uint16_t d = cm_f32_to_f16(0.01f), m = cm_f32_to_f16(-0.08f);
            memcpy(raw + (size_t)i * 20, &d, 2);
            memcpy(raw + (size_t)i * 20 + 2, &m, 2);
        }
        for (int i = 0; i < B * K; i++) x[i] = (float)((i * 37) % 17) - 8.f;
        ok = kn_weight_init(&w, CM_Q4_1, N, K, raw) == 0;
        if (!ok) kn_act_free(&act);
    }
    if (!ok) {
        snprintf(why, whylen, "cpuid (no memory to measure)");
        impl = a;
        free(raw), free(x), free(y);
        return;
    }
    double best[2];
    const kn_impl *c[2] = {a, b};
    int pick = 1;
    for (int round = 0; round < 3 && pick; round++) {
        if (round) { /* apart in time (and from processes that started with this one) */
            struct timespec gap = {0, 2000000L + 1000000L * (getpid() % 4)};
            nanosleep(&gap, NULL);
        }
        best[0] = best[1] = 1e9;
        for (int rep = 0; rep < 9; rep++)
            for (int i = 0; i < 2; i++) {
                c[i]->quant_act(x, K, act.qs, act.d, act.ds);
                for (int j = 1; j < B; j++)
                    c[i]->quant_act(x + j * K, K, act.qs + j * K, act.d + j * (K / 32), act.ds + j * (K / 32));
                double t0 = now_s();
                c[i]->gemm_q4(&w, &act, B, y, N, 0, N / KN_ROWS);
                double t = now_s() - t0;
                if (t < best[i]) best[i] = t;
            }
        pick = best[1] < 0.85 * best[0];
    }
    impl = c[pick];
    snprintf(why, whylen, "cpuid has %s and %s; a Q4 GEMM took %.0f us on %s and %.0f us on %s", a->name, b->name,
             1e6 * best[0], a->name, 1e6 * best[1], b->name);
    kn_weight_free(&w);
    kn_act_free(&act);
    free(raw), free(x), free(y);
}
#endif

void kn_init(void) {
    if (initialised) return;
    initialised = 1;
    act_f32_env();
    const char *env = getenv("LLMSERVE_ISA");
    char pre[96] = "";
    if (env && *env) {
        if (kn_set_isa(env) == 0) {
            snprintf(isa_reason, sizeof isa_reason, "LLMSERVE_ISA=%s", env);
            if (!strcmp(env, "avx512")) amx_default(isa_reason, sizeof isa_reason);
            return;
        }
        snprintf(pre, sizeof pre, "LLMSERVE_ISA=%.32s is not available on this CPU; ", env);
    }
    char why[200];
    impl = &kn_impl_scalar;
    snprintf(why, sizeof why, "no SIMD path for this CPU");
#if defined(__x86_64__) || defined(__i386__)
    const kn_impl *a512 = isa_impl("avx512"), *a2 = isa_impl("avx2");
    if (a512 && a2) pick_by_measuring(a512, a2, why, sizeof why);
    else if ((impl = a512 ? a512 : a2 ? a2 : &kn_impl_scalar) != &kn_impl_scalar) snprintf(why, sizeof why, "cpuid");
#elif defined(__aarch64__)
    impl = isa_impl("neon-dotprod") ? &kn_impl_neon_dot : &kn_impl_neon;
    snprintf(why, sizeof why, "%s", impl == &kn_impl_neon_dot ? "HWCAP has asimddp" : "HWCAP lacks asimddp");
#endif
    snprintf(isa_reason, sizeof isa_reason, "%s%s", pre, why);
#if defined(__x86_64__) || defined(__i386__)
    if (impl == &kn_impl_avx512) amx_default(isa_reason, sizeof isa_reason);
#endif
}

const char *kn_isa_name(void) {
    kn_init();
    return impl->name;
}

/* ---- weights ------------------------------------------------------------ */

/* 4-bit types (Q4_0, Q4_1, Q4_K: one scale and minimum per block of 32) into
 * kn_pq4, Q4_0 (whose minimum is -8 times its scale) into kn_pq4s; scales are rounded to fp16 (Q4_K's d*scale has up to 17
 * significant bits: a relative change below 2.5e-4, far under the int8
 * activations' rounding). */
static void repack_q4(kn_weight *w) {
    int64_t nb = w->k / 32, ng = (w->n + KN_ROWS - 1) / KN_ROWS;
    size_t rb = cm_dtype_row_bytes(w->type, (uint64_t)w->k);
    int sym = w->pack == KN_PACK_Q4S;
    size_t bs = sym ? sizeof(kn_pq4s) : sizeof(kn_pq4);
    for (int64_t g = 0; g < ng; g++)
        for (int64_t blk = 0; blk < nb; blk++) {
            kn_pq4 *p = (kn_pq4 *)((char *)w->packed + (size_t)(g * nb + blk) * bs);
            kn_pq4s *ps = (kn_pq4s *)p;
            memset(p, 0, bs);
            for (int r = 0; r < KN_ROWS; r++) {
                int64_t row = g * KN_ROWS + r;
                if (row >= w->n) continue; /* zero rows pad the last group */
                uint8_t q[32];
                float d[2], m[2];
                cm_unpack32(w->type, (const uint8_t *)w->raw + (size_t)row * rb, blk, q, d, m);
                uint8_t *qs = sym ? ps->qs[0] : p->qs[0];
                if (sym) ps->d[r] = cm_f32_to_f16(d[0]);
                else p->d[r] = cm_f32_to_f16(d[0]), p->m[r] = cm_f32_to_f16(m[0]);
                for (int c = 0; c < 4; c++)
                    for (int i = 0; i < 4; i++)
                        qs[64 * c + r * 4 + i] = (uint8_t)(q[8 * c + i] | (q[8 * c + 4 + i] << 4));
            }
        }
}

/* Q5_0, Q5_1, Q5_K, Q6_K (u 0..63) into kn_pq6h, Q2_K, Q3_K (u 0..15) into kn_pq4h; kn_pq8h (a byte
 * each) is the layout both are read as. */
static void repack_q8h(kn_weight *w) {
    int64_t nb = w->k / 32, ng = (w->n + KN_ROWS - 1) / KN_ROWS;
    size_t rb = cm_dtype_row_bytes(w->type, (uint64_t)w->k);
    int sym = w->pack == KN_PACK_Q6S; /* kn_pq6s: d only (m = -32d), qs and qh 64 bytes earlier */
    int six = w->pack == KN_PACK_Q6H || sym, nib = w->pack == KN_PACK_Q4H || six;
    size_t bs = sym ? sizeof(kn_pq6s) : six ? sizeof(kn_pq6h) : nib ? sizeof(kn_pq4h) : sizeof(kn_pq8h);
    for (int64_t g = 0; g < ng; g++)
        for (int64_t blk = 0; blk < nb; blk++) {
            /* the two share d and m's place; only qs differs */
            kn_pq8h *p = (kn_pq8h *)((char *)w->packed + (size_t)(g * nb + blk) * bs);
            uint8_t *qs = (uint8_t *)p + kn_q8h_qs(kn_q8h_mode(w->pack)), *qh = qs + 256; /* 4 x 64 nibble bytes */
            memset(p, 0, bs);
            for (int r = 0; r < KN_ROWS; r++) {
                int64_t row = g * KN_ROWS + r;
                if (row >= w->n) continue;
                uint8_t q[32];
                float d[2], m[2];
                cm_unpack32(w->type, (const uint8_t *)w->raw + (size_t)row * rb, blk, q, d, m);
                for (int h = 0; h < 2; h++) {
                    p->d[h][r] = cm_f32_to_f16(d[h]);
                    if (!sym) p->m[h][r] = cm_f32_to_f16(m[h]);
                }
                for (int c = 0; c < 8; c++)
                    for (int i = 0; i < 4; i++) {
                        if (nib) qs[64 * (c & 3) + r * 4 + i] |= (uint8_t)((q[4 * c + i] & 15) << (c >= 4 ? 4 : 0));
                        else qs[64 * c + r * 4 + i] = q[4 * c + i];
                        if (six) qh[64 * (c >> 2) + r * 4 + i] |= (uint8_t)(((q[4 * c + i] >> 4) & 3) << (2 * (c & 3)));
                    }
            }
        }
}

static void repack_q8(kn_weight *w) {
    int64_t nb = w->k / 32, ng = (w->n + KN_ROWS - 1) / KN_ROWS;
    size_t rb = cm_dtype_row_bytes(w->type, (uint64_t)w->k);
    kn_pq8 *P = w->packed;
    for (int64_t g = 0; g < ng; g++)
        for (int64_t blk = 0; blk < nb; blk++) {
            kn_pq8 *p = &P[g * nb + blk];
            memset(p, 0, sizeof *p);
            memset(p->qs, 128, sizeof p->qs);
            for (int r = 0; r < KN_ROWS; r++) {
                int64_t row = g * KN_ROWS + r;
                if (row >= w->n) continue;
                const cm_block_q8_0 *b = (const cm_block_q8_0 *)((const uint8_t *)w->raw + (size_t)row * rb) + blk;
                p->d[r] = b->d;
                for (int c = 0; c < 8; c++)
                    for (int i = 0; i < 4; i++) p->qs[c][r * 4 + i] = (uint8_t)(b->qs[4 * c + i] + 128);
            }
        }
}

int kn_weight_init(kn_weight *w, int type, int64_t n, int64_t k, const void *raw) {
    kn_init();
    memset(w, 0, sizeof *w);
    w->type = type;
    w->n = n;
    w->k = k;
    w->raw = raw;
    if (n <= 0 || k <= 0) return LLM_EINVAL;
    switch (type) {
    case CM_F32: case CM_F16: case CM_BF16: return 0;
    default: if (!cm_quant_known(type)) return LLM_EUNSUP;
    }
    if (k % (int64_t)cm_dtype_block(type)) return LLM_EINVAL;
    int64_t ng = (n + KN_ROWS - 1) / KN_ROWS, nb = k / 32;
    w->pack = type == CM_Q8_0                      ? KN_PACK_Q8
              : type == CM_Q4_0                    ? KN_PACK_Q4S
              : type == CM_Q4_1 || type == CM_Q4_K ? KN_PACK_Q4
              : type == CM_Q2_K || type == CM_Q3_K ? KN_PACK_Q4H
              : type == CM_Q6_K                    ? KN_PACK_Q6S
                                                   : KN_PACK_Q6H;
    size_t sz = (size_t)(ng * nb) * (w->pack == KN_PACK_Q8    ? sizeof(kn_pq8)
                                     : w->pack == KN_PACK_Q4  ? sizeof(kn_pq4)
                                     : w->pack == KN_PACK_Q4S ? sizeof(kn_pq4s)
                                     : w->pack == KN_PACK_Q4H ? sizeof(kn_pq4h)
                                     : w->pack == KN_PACK_Q6H ? sizeof(kn_pq6h)
                                     : w->pack == KN_PACK_Q6S ? sizeof(kn_pq6s)
                                                              : sizeof(kn_pq8h));
    w->packed = aligned_alloc(64, (sz + 63) / 64 * 64);
    if (!w->packed) return LLM_ENOMEM;
    if (w->pack == KN_PACK_Q8) repack_q8(w);
    else if (w->pack == KN_PACK_Q4 || w->pack == KN_PACK_Q4S) repack_q4(w);
    else repack_q8h(w);
    return 0;
}

void kn_weight_free(kn_weight *w) {
    if (!w) return;
    free(w->packed);
    w->packed = NULL;
}

int kn_act_init(kn_act *a, int64_t k, int cap) {
    memset(a, 0, sizeof *a);
    a->k = k;
    a->nblk = k / 32;
    a->cap = cap;
    a->qs = aligned_alloc(64, ((size_t)cap * (size_t)k + 63) / 64 * 64);
    a->d = malloc(sizeof(float) * (size_t)(cap * (a->nblk ? a->nblk : 1)));
    a->ds = malloc(sizeof(float) * (size_t)(cap * (a->nblk ? a->nblk : 1)));
    a->hs = malloc(sizeof(float) * (size_t)(cap * (a->nblk ? 2 * a->nblk : 1)));
    if (!a->qs || !a->d || !a->ds || !a->hs) {
        kn_act_free(a);
        return LLM_ENOMEM;
    }
    return 0;
}

void kn_act_free(kn_act *a) {
    free(a->qs);
    free(a->d);
    free(a->ds);
    free(a->hs);
    memset(a, 0, sizeof *a);
}

kn_act kn_act_view(const kn_act *a, int r0) {
    kn_act v = *a;
    v.qs += (size_t)r0 * (size_t)a->k;
    v.d += (size_t)r0 * (size_t)a->nblk;
    v.ds += (size_t)r0 * (size_t)a->nblk;
    v.hs += (size_t)r0 * (size_t)a->nblk * 2;
    v.cap -= r0;
    return v;
}

void kn_quantize_act(kn_act *a, const float *x, int rows) {
    a->rows = rows;
    for (int b = 0; b < rows; b++) {
        const int8_t *q = a->qs + (size_t)b * a->k;
        const float *d = a->d + (size_t)b * a->nblk;
        impl->quant_act(x + (size_t)b * a->k, a->k, a->qs + (size_t)b * a->k, a->d + (size_t)b * a->nblk,
                        a->ds + (size_t)b * a->nblk);
        float *hs = a->hs + (size_t)b * a->nblk * 2; /* kn_pq8h's minimums: k adds, against the GEMM's k*n */
        for (int64_t j = 0; j < a->nblk; j++) {
            int s0 = 0, s1 = 0;
            for (int i = 0; i < 16; i++) s0 += q[32 * j + i], s1 += q[32 * j + 16 + i];
            hs[2 * j] = d[j] * (float)s0;
            hs[2 * j + 1] = d[j] * (float)s1;
        }
    }
}

/* ---- matmul driver ------------------------------------------------------ */

typedef struct {
    int nw;
    const kn_weight *const *w;
    float *const *y;
    const float *x;
    const kn_act *a;
    int B;
    int64_t units; /* total row groups */
} mm_ctx;

/* Each thread's float row scratch, freed by a key destructor when the thread
 * exits (pool workers, tensor-parallel ranks, any caller). */
static __thread float *tl_row;
static __thread size_t tl_cap;
static pthread_key_t row_key;
static pthread_once_t row_once = PTHREAD_ONCE_INIT;

static void row_key_make(void) { pthread_key_create(&row_key, free); }

/* Float weights: F32 rows straight from the tensor, F16/BF16 rows
 * converted KN_ROWS at a time, then the ISA's blocked float GEMM. */
static void gemm_float(const kn_weight *w, const float *x, int B, float *y, int64_t r0, int64_t r1) {
    if (w->type == CM_F32) {
        impl->gemm_f32((const float *)w->raw + r0 * w->k, w->k, r1 - r0, x, B, y + r0, w->n);
        return;
    }
    if ((size_t)w->k * KN_ROWS > tl_cap) { /* grows once per thread, not per call */
        free(tl_row);
        tl_row = malloc(sizeof(float) * (size_t)w->k * KN_ROWS);
        tl_cap = tl_row ? (size_t)w->k * KN_ROWS : 0;
        if (!tl_row) abort();
        pthread_once(&row_once, row_key_make);
        pthread_setspecific(row_key, tl_row);
    }
    for (int64_t r = r0; r < r1; r += KN_ROWS) {
        int64_t nr = r1 - r < KN_ROWS ? r1 - r : KN_ROWS;
        for (int64_t i = 0; i < nr; i++) kn_get_row(w, r + i, tl_row + i * w->k);
        impl->gemm_f32(tl_row, w->k, nr, x, B, y + r, w->n);
    }
}

static void mm_task(void *p, int ith, int nth) {
    mm_ctx *c = p;
    int64_t u0 = c->units * ith / nth, u1 = c->units * (ith + 1) / nth, base = 0;
    for (int i = 0; i < c->nw && u0 < u1; i++) {
        const kn_weight *w = c->w[i];
        int64_t ng = (w->n + KN_ROWS - 1) / KN_ROWS;
        int64_t g0 = u0 - base, g1 = u1 - base;
        base += ng;
        if (g0 >= ng) continue;
        if (g0 < 0) g0 = 0;
        if (g1 > ng) g1 = ng;
        if (g1 <= g0) continue;
        int q4 = w->pack == KN_PACK_Q4 || w->pack == KN_PACK_Q4S;
        if (kn_weight_wants_act(w) && q4) impl->gemm_q4(w, c->a, c->B, c->y[i], w->n, g0, g1);
        else if (kn_weight_wants_act(w) && kn_pack_q8h(w->pack)) impl->gemm_q8h(w, c->a, c->B, c->y[i], w->n, g0, g1);
        else if (kn_weight_wants_act(w)) impl->gemm_q8(w, c->a, c->B, c->y[i], w->n, g0, g1);
        else {
            int64_t r1 = g1 * KN_ROWS < w->n ? g1 * KN_ROWS : w->n;
            gemm_float(w, c->x, c->B, c->y[i], g0 * KN_ROWS, r1);
        }
    }
}

void kn_matmul_multi(kn_pool *p, int nw, const kn_weight *const *w, float *const *y,
                     const float *x, const kn_act *a, int B) {
    mm_ctx c = {nw, w, y, x, a, B, 0};
    for (int i = 0; i < nw; i++) c.units += (w[i]->n + KN_ROWS - 1) / KN_ROWS;
    kn_pool_run(p, mm_task, &c);
}

void kn_gemm_f32(const float *w, int64_t k, int64_t n, const float *x, int B, float *y, int64_t ldy) {
    impl->gemm_f32(w, k, n, x, B, y, ldy);
}

void kn_matmul(kn_pool *p, const kn_weight *w, float *y, const float *x, kn_act *a, int B) {
    if (kn_weight_wants_act(w)) kn_quantize_act(a, x, B);
    kn_matmul_multi(p, 1, &w, &y, x, a, B);
}

void kn_get_row(const kn_weight *w, int64_t r, float *out) {
    size_t rb = cm_dtype_row_bytes(w->type, (uint64_t)w->k);
    const uint8_t *row = (const uint8_t *)w->raw + (size_t)r * rb;
    switch (w->type) {
    case CM_F32: memcpy(out, row, sizeof(float) * (size_t)w->k); return;
    case CM_Q8_0:
        for (int64_t b = 0; b < w->k / 32; b++) {
            const cm_block_q8_0 *q = (const cm_block_q8_0 *)row + b;
            float d = cm_f16_to_f32(q->d);
            for (int i = 0; i < 32; i++) out[32 * b + i] = d * (float)q->qs[i];
        }
        return;
    case CM_Q4_0:
    case CM_Q4_1:
        for (int64_t b = 0; b < w->k / 32; b++) {
            const uint8_t *qs;
            float d, m;
            if (w->type == CM_Q4_0) {
                const cm_block_q4_0 *q = (const cm_block_q4_0 *)row + b;
                d = cm_f16_to_f32(q->d);
                m = -8.f * d;
                qs = q->qs;
            } else {
                const cm_block_q4_1 *q = (const cm_block_q4_1 *)row + b;
                d = cm_f16_to_f32(q->d);
                m = cm_f16_to_f32(q->m);
                qs = q->qs;
            }
            for (int i = 0; i < 16; i++) {
                out[32 * b + i] = d * (float)(qs[i] & 15) + m;
                out[32 * b + 16 + i] = d * (float)(qs[i] >> 4) + m;
            }
        }
        return;
    case CM_F16: impl->f16_to_f32((const uint16_t *)row, out, (int)w->k); return;
    case CM_BF16:
        for (int64_t i = 0; i < w->k; i++) out[i] = cm_bf16_to_f32(((const uint16_t *)row)[i]);
        return;
    default: /* the other quantized types */
        for (int64_t b = 0; b < w->k / 32; b++) {
            uint8_t q[32];
            float d[2], m[2];
            cm_unpack32(w->type, row, b, q, d, m);
            for (int i = 0; i < 32; i++) out[32 * b + i] = d[i / 16] * (float)q[i] + m[i / 16];
        }
    }
}

/* ---- element-wise ------------------------------------------------------- */

void kn_gelu_mul(float *a, const float *b, int n) {
    if (act_f32 || !impl->gelu_mul) kn_gelu_mul_scalar(a, b, n); /* reference mode stays libm-exact */
    else impl->gelu_mul(a, b, n);
}

void kn_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = 0; /* fp32 sum of squares: n <= 65536 keeps the error far below bf16 weights' */
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float s = 1.f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * s * w[i];
}

void kn_rope(float *x, int n_heads, int head_dim, int rope_dim, int type, int pos,
             const float *inv_freq) {
    float cs[512], sn[512]; /* rope_dim/2 <= 512: head_dim is capped at 1024 by the loader */
    int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        float a = (float)pos * inv_freq[i];
        cs[i] = cosf(a);
        sn[i] = sinf(a);
    }
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            int i0 = type == 1 ? i : 2 * i, i1 = type == 1 ? i + half : 2 * i + 1;
            float a = v[i0], b = v[i1];
            v[i0] = a * cs[i] - b * sn[i];
            v[i1] = a * sn[i] + b * cs[i];
        }
    }
}

void kn_lora_shrink(const void *at, int half, int in, int ldr, const float *const *x, int nr, float scale,
                    float *t) {
    impl->lora_shrink(at, half, in, ldr, x, nr, scale, t);
}

void kn_lora_expand(const void *bt, int half, int rk, int out, const float *t, int ldt, int nr,
                    float *const *y) {
    impl->lora_expand(bt, half, rk, out, t, ldt, nr, y);
}

void kn_silu_mul(float *a, const float *b, int n) {
    if (act_f32) kn_silu_mul_scalar(a, b, n); /* reference mode stays libm-exact */
    else impl->silu_mul(a, b, n);
}

float kn_exp_sum(const float *x, int n, float mx, float scale, float *out) {
    return act_f32 ? kn_exp_sum_scalar(x, n, mx, scale, out) : impl->exp_sum(x, n, mx, scale, out);
}

void kn_softmax(float *x, int n) {
    float mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) sum += (x[i] = expf(x[i] - mx));
    float inv = 1.f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void kn_kv_store(int kv_type, void *dst, const float *src, int n) {
    if (kv_type == KN_KV_F16) impl->f32_to_f16(src, dst, n);
    else if (kv_type == KN_KV_FP8)
        for (int i = 0; i < n; i++) ((uint8_t *)dst)[i] = cm_f32_to_e4m3(src[i]);
    else if (kv_type == KN_KV_BF16)
        for (int i = 0; i < n; i++) ((uint16_t *)dst)[i] = cm_f32_to_bf16(src[i]);
    else memcpy(dst, src, sizeof(float) * (size_t)n);
}

size_t kn_attention_scratch(int max_len) {
    /* scores of up to KN_ATTN_TILE_ROWS rows (8 heads of one token, or a prefill tile), and a tile's K and V
     * blocks and outputs (16 rows of up to 256 each) */
    return (size_t)max_len * KN_ATTN_TILE_ROWS + 3 * 16 * 256 + 16;
}

/* Work unit: one query token x a slice of one KV head's query heads. Whole
 * groups (K and V rows read once for all their heads) when there are enough
 * units to keep every thread busy; single heads otherwise (a decode step of
 * a 3-KV-head model on 2 threads would split 1:2). With whole groups, a
 * unit is a tile (impl->attn_tile) of up to KN_ATTN_TILE_ROWS / group
 * consecutive tokens of a prompt's chunk, or one decode token (a window's
 * rows past its first slide: one at a time, each from its own first): its rows
 * share each K and V row's conversion, and a token's result is the same as
 * alone or through attn_group. Units are dealt
 * to threads in order by cost (positions read), so a long sequence next to
 * short ones does not leave threads idle; every thread walks the same unit
 * order, so the split needs no shared state. */
typedef struct {
    const kn_attn_args *a;
    int slice;      /* query heads per unit */
    int tile;       /* tokens per unit of a prompt's chunk */
    int64_t total;  /* sum of unit costs */
} attn_ctx;

/* Tokens in the unit at token t of sq. */
static int attn_unit_tokens(const attn_ctx *c, const kn_attn_seq *sq, int t) {
    return sq->T - t < c->tile ? sq->T - t : c->tile;
}

static void attn_task(void *p, int ith, int nth) {
    const attn_ctx *c = p;
    const kn_attn_args *a = c->a;
    int group = a->n_head / a->n_kv, per_kv = (group + c->slice - 1) / c->slice;
    float *s = a->scratch + (size_t)ith * kn_attention_scratch(a->max_len);
    float scale = 1.f / sqrtf((float)a->hd);
    size_t eb = kn_kv_elem_bytes(a->kv_type), qs = (size_t)a->n_head * a->hd;
    kn_kv_rows kv = {NULL, NULL, NULL, a->block_shift, a->kv_type, a->block_stride,
                     (size_t)a->n_kv * (size_t)a->hd * eb, 0, NULL};
    int64_t lo = c->total * ith / nth, hi = c->total * (ith + 1) / nth, cum = 0;
    for (int si = 0; si < a->n_seq && cum < hi; si++) {
        const kn_attn_seq *sq = &a->seq[si];
        kv.blocks = sq->blocks;
        for (int t = 0, nt; t < sq->T && cum < hi; t += nt) {
            nt = attn_unit_tokens(c, sq, t);
            kv.first = kn_attn_first(a, sq->pos0 + t);
            int len = sq->pos0 + t + 1 - kv.first, cost = nt * len + nt * (nt - 1) / 2;
            for (int u = 0; u < a->n_kv * per_kv; u++) {
                /* a unit belongs to the thread whose share holds its midpoint */
                int64_t mid = cum + cost / 2;
                cum += cost;
                if (mid < lo || mid >= hi) continue;
                int kvh = u / per_kv, h0 = u % per_kv * c->slice, g = group - h0 < c->slice ? group - h0 : c->slice;
                size_t qo = ((size_t)(sq->row + t) * a->n_head + (size_t)kvh * group + h0) * a->hd;
                kv.k = (const char *)a->kc + (size_t)kvh * a->hd * eb;
                kv.v = (const char *)a->vc + (size_t)kvh * a->hd * eb;
                kv.sink = a->sinks ? a->sinks + (size_t)kvh * group + h0 : NULL;
                /* a tile's rows share their first position: under a window, only while it has not yet slid */
                kv.first = kn_attn_first(a, sq->pos0 + t);
                if (c->tile > 1 && kn_attn_first(a, sq->pos0 + t + nt - 1) == kv.first &&
                    impl->attn_tile(a->q + qo, qs, &kv, len, nt, a->hd, g, scale, s, a->out + qo))
                    continue;
                for (int i = 0; i < nt; i++) { /* one token at a time */
                    kv.first = kn_attn_first(a, sq->pos0 + t + i);
                    impl->attn_group(a->q + qo + i * qs, &kv, sq->pos0 + t + i + 1 - kv.first, a->hd, g, scale, s,
                                     a->out + qo + i * qs);
                }
            }
        }
    }
}

void kn_attention(kn_pool *p, const kn_attn_args *a) {
    int group = a->n_head / a->n_kv;
    attn_ctx c = {a, group < 8 ? group : 8, 1, 0};
    int64_t tokens = 0;
    for (int si = 0; si < a->n_seq; si++) tokens += a->seq[si].T;
    if (kn_pool_size(p) > 1 && tokens * a->n_kv < 4 * kn_pool_size(p)) c.slice = 1;
    if (impl->attn_tile && c.slice == group) c.tile = KN_ATTN_TILE_ROWS / group > 1 ? KN_ATTN_TILE_ROWS / group : 1;
    int per_kv = (group + c.slice - 1) / c.slice;
    for (int si = 0; si < a->n_seq; si++)
        for (int t = 0, p0 = a->seq[si].pos0, nt; t < a->seq[si].T; t += nt) {
            nt = attn_unit_tokens(&c, &a->seq[si], t);
            int len = p0 + t + 1 - kn_attn_first(a, p0 + t);
            c.total += (int64_t)(nt * len + nt * (nt - 1) / 2) * a->n_kv * per_kv;
        }
    kn_pool_run(p, attn_task, &c);
}
