/* membw - memory read bandwidth with N threads (the decode roofline), and
 * the int8 multiply-add ceiling of the CPU paths (the prefill roofline).
 * usage: membw THREADS [MiB]   prints "read_gbps <value>" (median of 7)
 *        membw THREADS int8    prints "int8_gmacs <path> <value>" per path the
 *            CPU has: vpmaddubsw ymm (avx2, 32 MACs an op), zmm (avx512),
 *            vpdpbusd zmm (avx512-vnni, 64 MACs an op with the widening add),
 *            each from 8 independent chains, all threads at once. A kernel
 *            also widens (vpmaddwd) and scales, so this is a ceiling it
 *            cannot reach, not a target. */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const __m256i *p;
    size_t n;
    long long sink;
} job;

static void *reader(void *a) {
    job *j = a;
    /* four independent chains, and a prefetch 4 KiB ahead as the GEMM does
     * (hardware prefetchers stop at page ends): the best a reader can do */
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < j->n; i += 4) {
        _mm_prefetch((const char *)(j->p + i) + 4096, _MM_HINT_T0);
        _mm_prefetch((const char *)(j->p + i) + 4096 + 64, _MM_HINT_T0);
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(j->p + i));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256(j->p + i + 1));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256(j->p + i + 2));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256(j->p + i + 3));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    j->sink = _mm256_extract_epi64(a0, 0);
    return NULL;
}

#define CHAINS(OP)                                                                                   \
    for (long i = 0; i < n; i++) {                                                                   \
        OP(a0); OP(a1); OP(a2); OP(a3); OP(a4); OP(a5); OP(a6); OP(a7); \
    }

typedef struct {
    int path;
    long n;
    long long sink;
} mjob;

static void *mac_avx2(mjob *j) {
    /* distinct starts, or the compiler folds the identical chains into one */
    __m256i w = _mm256_set1_epi8(3), a0 = _mm256_set1_epi8(1), a1 = _mm256_set1_epi8(2), a2 = _mm256_set1_epi8(3),
            a3 = _mm256_set1_epi8(4), a4 = _mm256_set1_epi8(5), a5 = _mm256_set1_epi8(6), a6 = _mm256_set1_epi8(7),
            a7 = _mm256_set1_epi8(8);
    long n = j->n;
#define M2(a) a = _mm256_maddubs_epi16(w, a)
    CHAINS(M2)
    a0 = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(a0, a1), _mm256_add_epi16(a2, a3)),
                          _mm256_add_epi16(_mm256_add_epi16(a4, a5), _mm256_add_epi16(a6, a7)));
    j->sink = _mm256_extract_epi64(a0, 0);
    return NULL;
}

__attribute__((target("avx512bw,avx512vnni"))) static void *mac_avx512(mjob *j) {
    __m512i w = _mm512_set1_epi8(3), a0 = _mm512_set1_epi8(1), a1 = _mm512_set1_epi8(2), a2 = _mm512_set1_epi8(3),
            a3 = _mm512_set1_epi8(4), a4 = _mm512_set1_epi8(5), a5 = _mm512_set1_epi8(6), a6 = _mm512_set1_epi8(7),
            a7 = _mm512_set1_epi8(8);
    long n = j->n;
#define M5(a) a = _mm512_maddubs_epi16(w, a)
#define V5(a) a = _mm512_dpbusd_epi32(a, w, w)
    if (j->path == 1) { CHAINS(M5) } else { CHAINS(V5) }
    a0 = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                          _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    j->sink = _mm512_reduce_add_epi32(a0);
    return NULL;
}

static void *mac_thread(void *a) {
    mjob *j = a;
    return j->path ? mac_avx512(j) : mac_avx2(j);
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 1;
    if (argc > 2 && !strcmp(argv[2], "int8")) {
        if (nt < 1 || nt > 256) return 2;
        __builtin_cpu_init();
        static const char *const names[] = {"avx2", "avx512", "avx512-vnni"};
        static const int macs[] = {32, 64, 64};
        int have[] = {__builtin_cpu_supports("avx2"), __builtin_cpu_supports("avx512bw"),
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni")};
        for (int p = 0; p < 3; p++) {
            if (!have[p]) continue;
            double r[5];
            for (int rep = 0; rep < 5; rep++) {
                pthread_t th[256];
                mjob j[256];
                struct timespec a, b;
                long n = 4000000;
                clock_gettime(CLOCK_MONOTONIC, &a);
                for (int t = 0; t < nt; t++) {
                    j[t] = (mjob){p, n, 0};
                    pthread_create(&th[t], NULL, mac_thread, &j[t]);
                }
                for (int t = 0; t < nt; t++) pthread_join(th[t], NULL);
                clock_gettime(CLOCK_MONOTONIC, &b);
                double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
                r[rep] = (double)n * 8 * macs[p] * nt / s / 1e9;
            }
            qsort(r, 5, sizeof r[0], cmp);
            printf("int8_gmacs %s %.0f\n", names[p], r[2]);
        }
        return 0;
    }
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024, bytes = mib << 20;
    if (nt < 1 || nt > 256 || mib < 1) return 2;
    __m256i *buf = aligned_alloc(64, bytes);
    if (!buf) return 1;
    memset(buf, 1, bytes);
    size_t per = bytes / 32 / (size_t)nt / 4 * 4;
    double r[7];
    for (int rep = 0; rep < 7; rep++) {
        pthread_t th[256];
        job j[256];
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int t = 0; t < nt; t++) {
            j[t] = (job){buf + (size_t)t * per, per, 0};
            pthread_create(&th[t], NULL, reader, &j[t]);
        }
        for (int t = 0; t < nt; t++) pthread_join(th[t], NULL);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
        r[rep] = (double)(per * 32 * (size_t)nt) / s / 1e9;
    }
    qsort(r, 7, sizeof r[0], cmp);
    printf("read_gbps %.1f\n", r[3]);
    free(buf);
    return 0;
}
