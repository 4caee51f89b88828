/* CUDA kernels against their CPU references on random data. Without a GPU
 * (as on the development machines and in CI) it says so and skips (77). */
#include "cm_dtype.h"
#include "cm_error.h"
#include "kernels.h"
#include "kn_cuda.h"
#include "tst.h"

#include <stdlib.h>
#include <string.h>

static float frand(void) { return (float)rand() / (float)RAND_MAX * 2.f - 1.f; }

static double rel(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i] != a[i]) return 1e9;
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(d / (s > 0 ? s : 1));
}

int main(void) {
    int ndev = 0;
    kn_cuda_device_count(&ndev);
    if (ndev == 0) {
        printf("cuda_test: no CUDA device on this machine; skipped\n");
        return TST_SKIP;
    }
    srand(7);
    /* rmsnorm */
    int rows = 5, n = 576;
    float *x = malloc(sizeof(float) * (size_t)(rows * n)), *w = malloc(sizeof(float) * (size_t)n);
    float *ref = malloc(sizeof(float) * (size_t)(rows * n)), *got = malloc(sizeof(float) * (size_t)(rows * n));
    for (int i = 0; i < rows * n; i++) x[i] = frand() * 3;
    for (int i = 0; i < n; i++) w[i] = frand();
    for (int r = 0; r < rows; r++) kn_rmsnorm(ref + r * n, x + r * n, w, n, 1e-5f);
    float *dx, *dw, *dy;
    CHECK_RC(kn_cuda_malloc((void **)&dx, sizeof(float) * (size_t)(rows * n)), 0);
    CHECK_RC(kn_cuda_malloc((void **)&dw, sizeof(float) * (size_t)n), 0);
    CHECK_RC(kn_cuda_malloc((void **)&dy, sizeof(float) * (size_t)(rows * n)), 0);
    kn_cuda_upload(dx, x, sizeof(float) * (size_t)(rows * n));
    kn_cuda_upload(dw, w, sizeof(float) * (size_t)n);
    CHECK_RC(kn_cuda_rmsnorm(dy, dx, dw, rows, n, 1e-5f), 0);
    kn_cuda_download(got, dy, sizeof(float) * (size_t)(rows * n));
    CHECK(rel(got, ref, (size_t)(rows * n)) < 1e-5);
    /* rope, both conventions */
    float inv[32];
    for (int i = 0; i < 32; i++) inv[i] = powf(10000.f, -2.f * (float)i / 64.f);
    for (int type = 0; type < 2; type++) {
        memcpy(ref, x, sizeof(float) * 9 * 64);
        kn_rope(ref, 9, 64, 64, type, 123, inv);
        kn_cuda_upload(dx, x, sizeof(float) * 9 * 64);
        CHECK_RC(kn_cuda_rope(dx, 9, 64, 64, type, 123, 10000.f), 0);
        kn_cuda_download(got, dx, sizeof(float) * 9 * 64);
        CHECK(rel(got, ref, 9 * 64) < 1e-4);
    }
    /* matmul over the GGUF types against the float64 reference */
    int types[] = {CM_F32, CM_F16, CM_Q4_0, CM_Q4_1, CM_Q8_0};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int64_t N = 77, K = 256;
        int B = 3;
        size_t bytes = cm_dtype_row_bytes(types[t], (uint64_t)K) * (size_t)N;
        uint8_t *raw = malloc(bytes);
        for (size_t i = 0; i < bytes; i++) raw[i] = (uint8_t)rand();
        if (types[t] == CM_F32) for (size_t i = 0; i < bytes / 4; i++) ((float *)raw)[i] = frand();
        if (types[t] == CM_F16) for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)raw)[i] = cm_f32_to_f16(frand());
        size_t bb = cm_dtype_block_bytes(types[t]);
        if (types[t] != CM_F32 && types[t] != CM_F16)
            for (size_t i = 0; i < bytes / bb; i++) {
                uint16_t d = cm_f32_to_f16(0.01f), m = cm_f32_to_f16(-0.05f);
                memcpy(raw + i * bb, &d, 2);
                if (types[t] == CM_Q4_1) memcpy(raw + i * bb + 2, &m, 2);
            }
        kn_weight wt = {types[t], N, K, raw, 0, NULL};
        float *xs = malloc(sizeof(float) * (size_t)(B * K)), *yr = malloc(sizeof(float) * (size_t)(B * N)),
              *yg = malloc(sizeof(float) * (size_t)(B * N));
        for (int i = 0; i < B * K; i++) xs[i] = frand();
        kn_ref_matmul(&wt, yr, xs, B);
        void *dwt;
        float *dxs, *dys;
        kn_cuda_malloc(&dwt, bytes);
        kn_cuda_malloc((void **)&dxs, sizeof(float) * (size_t)(B * K));
        kn_cuda_malloc((void **)&dys, sizeof(float) * (size_t)(B * N));
        kn_cuda_upload(dwt, raw, bytes);
        kn_cuda_upload(dxs, xs, sizeof(float) * (size_t)(B * K));
        CHECK_RC(kn_cuda_matmul(types[t], dwt, N, K, dxs, dys, B), 0);
        kn_cuda_download(yg, dys, sizeof(float) * (size_t)(B * N));
        double e = rel(yg, yr, (size_t)(B * N));
        printf("cuda matmul %s: rel %.2e\n", cm_dtype_name(types[t]), e);
        CHECK(e < 1e-5);
        kn_cuda_free(dwt); kn_cuda_free(dxs); kn_cuda_free(dys);
        free(raw); free(xs); free(yr); free(yg);
    }
    CHECK_RC(kn_cuda_sync(), 0);
    kn_cuda_free(dx); kn_cuda_free(dw); kn_cuda_free(dy);
    free(x); free(w); free(ref); free(got);
    return tst_done("cuda_test");
}
