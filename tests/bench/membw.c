/* membw - memory read bandwidth with N threads (the decode roofline).
 * usage: membw THREADS [MiB]   prints "read_gbps <value>" (median of 7). */
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

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 1;
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
