/* llmserve-gemm-bench: the quantized matmul alone, per SIMD path, in the
 * shapes of a model's layers, so a kernel change is measured against the
 * machine's ceilings (llmserve-membw) rather than guessed from a whole run.
 *
 *   llmserve-gemm-bench [--threads 2] [--reps 7] [--isa avx512-amx,avx512,avx2]
 *       [--type q4_1,q8_0] [--batch 1,4,16,32,151] [--shape 1536x576,576x1536]
 *       [--cold MiB]
 *
 * A shape NxK is N output rows of length K (SmolLM2-135M: 576x576 for
 * q/o, 1536x576 for gate/up, 576x1536 for down, 49152x576 for the head).
 * For each (type, shape, batch) the paths run interleaved, REPS times, each
 * time enough calls to last ~50 ms; the line gives the median as GMAC/s
 * (N*K*B multiply-adds a call) and GB/s of weight bytes read (the decode
 * bound is bandwidth, the prefill bound is MACs). Activations are quantized
 * once outside the timing, as the forward pass quantizes once per input
 * that several matmuls share. Random weights with plausible scales.
 *
 * The weights of one shape stay in the caches from call to call (a server
 * CPU's last level holds hundreds of MiB): that measures the kernel. With
 * --cold MiB each path holds copies of the matrix, together at least MiB,
 * and the calls go round them, so every call streams its weights from DRAM
 * as a decode step does (give a few times the last-level cache).
 * A benchmark, not a test: it prints figures and checks nothing. */
#include "cm_dtype.h"
#include "cm_quantize.h"
#include "cm_error.h"
#include "kernels.h"

#include "bn_util.h"
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>


static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Weights made as `llmserve quantize` makes them, from uniform random floats. */
static void *rand_weight(int type, int64_t n, int64_t k) {
    size_t rb = cm_dtype_row_bytes(type, (uint64_t)k), sz = rb * (size_t)n;
    uint8_t *p = malloc(sz);
    float *x = malloc(sizeof(float) * (size_t)k);
    if (!p || !x) {
        free(p), free(x);
        return NULL;
    }
    for (int64_t r = 0; r < n; r++) {
        for (int64_t i = 0; i < k; i++) x[i] = 0.05f * ((float)(rnd() % 2001) / 1000.f - 1.f);
        cm_quantize_row(type, x, k, NULL, p + (size_t)r * rb);
    }
    free(x);
    return p;
}

/* Comma-separated list of ints (or NxK pairs when pairs) into out; count. */
static int parse_list(const char *s, int64_t *out, int max, int pairs) {
    int n = 0;
    while (*s && n < max) {
        char *e;
        out[n++] = strtoll(s, &e, 10);
        if (pairs) {
            if (*e != 'x') return -1;
            out[n++] = strtoll(e + 1, &e, 10);
        }
        if (*e == ',') e++;
        else if (*e) return -1;
        s = e;
    }
    return n;
}

/* A path by name: avx512-amx is AVX-512 with AMX tiles for whole 16-row tiles, avx512 without them. */
static int set_path(const char *name) {
    if (!strcmp(name, "avx512-amx")) return kn_set_isa("avx512") || kn_set_amx(1);
    int rc = kn_set_isa(name);
    kn_set_amx(0);
    return rc;
}

int main(int argc, char **argv) {
    int threads = 2, reps = 7;
    int64_t cold_mib = 0;
    const char *isa_list = NULL, *type_list = "q4_1,q8_0";
    int64_t batch[16], shape[32];
    int n_batch = parse_list("1,4,16,32,151", batch, 16, 0);
    int n_shape = parse_list("1536x576,576x1536,576x576", shape, 32, 1);
    static const struct option opts[] = {{"threads", 1, 0, 't'}, {"reps", 1, 0, 'r'},   {"isa", 1, 0, 'i'},
                                         {"type", 1, 0, 'y'},    {"batch", 1, 0, 'b'},  {"shape", 1, 0, 's'},
                                         {"cold", 1, 0, 'c'},    {"help", 0, 0, 'h'},   {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 't': threads = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'i': isa_list = optarg; break;
        case 'y': type_list = optarg; break;
        case 'b': n_batch = parse_list(optarg, batch, 16, 0); break;
        case 's': n_shape = parse_list(optarg, shape, 32, 1); break;
        case 'c': cold_mib = atoll(optarg); break;
        default:
            fprintf(stderr, "usage: %s [--threads 2] [--reps 7] [--isa avx512-amx,avx512,avx2] [--type q4_1,q8_0] "
                            "[--batch 1,4,16,32,151] [--shape 1536x576,576x1536,576x576] [--cold MiB]\n", argv[0]);
            return c == 'h' ? 0 : 2;
        }
    }
    if (threads < 1 || reps < 1 || n_batch < 1 || n_shape < 2 || cold_mib < 0 || cold_mib > 65536) {
        fprintf(stderr, "gemm-bench: bad --threads, --reps, --batch, --shape or --cold\n");
        return 2;
    }
    kn_init();
    static const char *all[] = {"avx512-amx", "avx512", "avx2", "neon-dotprod", "neon", "scalar"};
    const char *isas[8];
    int n_isa = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", isa_list ? isa_list : "avx512-amx,avx512,avx2,neon-dotprod,neon");
    for (char *t = strtok(buf, ","); t && n_isa < 8; t = strtok(NULL, ",")) {
        int known = 0;
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) known |= !strcmp(t, all[i]);
        if (!known || set_path(t)) { /* the default list names every path; only a chosen one is worth a word */
            if (isa_list) fprintf(stderr, "gemm-bench: path %s is not on this CPU, skipped\n", t);
            continue;
        }
        isas[n_isa++] = strdup(t);
    }
    if (!n_isa) return 1;
    kn_pool *pool;
    if (kn_pool_create(threads, &pool)) return 1;
    printf("%-6s %-11s %5s %-12s %9s %9s  (median of %d, %d thread(s)%s)\n", "type", "shape", "B", "path", "GMAC/s",
           "GB/s", reps, threads, cold_mib ? ", weights from DRAM" : "");
    char tbuf[64];
    snprintf(tbuf, sizeof tbuf, "%s", type_list);
    for (char *tn = strtok(tbuf, ","); tn; tn = strtok(NULL, ",")) {
        int type = -1;
        for (int t = 0; t < CM_DTYPE_COUNT; t++)
            if (cm_quantize_supported(t) && cm_dtype_block(t) > 1 && !strcasecmp(tn, cm_dtype_name(t))) type = t;
        if (type < 0) {
            fprintf(stderr, "gemm-bench: type %s: use q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k\n", tn);
            return 2;
        }
        for (int si = 0; si < n_shape; si += 2) {
            int64_t n = shape[si], k = shape[si + 1];
            if (n < 1 || k < 32 || k % 32) {
                fprintf(stderr, "gemm-bench: shape %lldx%lld: K must be a multiple of 32\n", (long long)n,
                        (long long)k);
                return 2;
            }
            void *raw = rand_weight(type, n, k);
            double wbytes = (double)cm_dtype_row_bytes(type, (uint64_t)k) * (double)n;
            int copies = cold_mib ? (int)((double)cold_mib * 1048576.0 / wbytes) + 1 : 1;
            if (copies > 4096) copies = 4096;
            kn_weight *w = calloc((size_t)(n_isa * copies), sizeof *w);
            if (!w) return 1;
            for (int i = 0; i < n_isa; i++) {
                set_path(isas[i]); /* repacked under the path that runs it */
                for (int j = 0; j < copies; j++)
                    if (!raw || kn_weight_init(&w[i * copies + j], type, n, k, raw)) return 1;
            }
            for (int bi = 0; bi < n_batch; bi++) {
                int B = (int)batch[bi];
                if (B < 1) continue;
                float *x = malloc(sizeof(float) * (size_t)B * (size_t)k);
                float *y = malloc(sizeof(float) * (size_t)B * (size_t)n);
                for (int64_t i = 0; i < B * k; i++) x[i] = (float)rnd() / 65535.f / 32768.f - 1.f;
                kn_act a;
                if (!x || !y || kn_act_init(&a, k, B)) return 1;
                kn_quantize_act(&a, x, B);
                const kn_weight *wp[1];
                float *yp[1] = {y};
                double macs = (double)n * (double)k * B, t[8][64];
                int calls[8];
                for (int i = 0; i < n_isa; i++) { /* calibrate: ~50 ms a timing */
                    set_path(isas[i]);
                    double t0 = bn_now();
                    int m = 0;
                    while (bn_now() - t0 < 0.02) {
                        wp[0] = &w[i * copies + m % copies];
                        kn_matmul_multi(pool, 1, wp, yp, x, &a, B);
                        m++;
                    }
                    calls[i] = m * 5 / 2 + 1;
                }
                for (int r = 0; r < reps && r < 64; r++)
                    for (int i = 0; i < n_isa; i++) {
                        set_path(isas[i]);
                        double t0 = bn_now();
                        for (int m = 0; m < calls[i]; m++) {
                            wp[0] = &w[i * copies + (r * calls[i] + m) % copies];
                            kn_matmul_multi(pool, 1, wp, yp, x, &a, B);
                        }
                        t[i][r] = (bn_now() - t0) / calls[i];
                    }
                for (int i = 0; i < n_isa; i++) {
                    int nr = reps < 64 ? reps : 64;
                    qsort(t[i], (size_t)nr, sizeof(double), bn_cmp_d);
                    double med = nr % 2 ? t[i][nr / 2] : 0.5 * (t[i][nr / 2 - 1] + t[i][nr / 2]);
                    printf("%-6s %5lldx%-5lld %5d %-12s %9.1f %9.1f\n", tn, (long long)n, (long long)k, B, isas[i],
                           macs / med * 1e-9, wbytes / med * 1e-9);
                }
                fflush(stdout);
                kn_act_free(&a);
                free(x);
                free(y);
            }
            for (int i = 0; i < n_isa * copies; i++) kn_weight_free(&w[i]);
            free(w);
            free(raw);
        }
    }
    kn_pool_destroy(pool);
    for (int i = 0; i < n_isa; i++) free((void *)isas[i]);
    return 0;
}
