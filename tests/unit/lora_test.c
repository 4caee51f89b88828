/* LoRA adapters in one step: on the models tests/ref/lora_ref.py makes (run
 * by lora_e2e), three sequences (adapter a, adapter b, the base model) go
 * through one wk_forward_batch and each must give the logits it gives alone,
 * and adapter a's must match the model with a merged into its weights.
 *   lora_test DIR   (without DIR, as a plain ctest run: nothing to check) */
#include "cm_error.h"
#include "cm_log.h"
#include "kernels.h"
#include "tst.h"
#include "wk_lora.h"
#include "wk_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 40, BLK = 16, PER = 4 }; /* prompt tokens; blocks of a sequence */

static double rel(const float *a, const float *b, int n) {
    double d = 0, s = 0;
    for (int i = 0; i < n; i++) d += (double)(a[i] - b[i]) * (a[i] - b[i]), s += (double)b[i] * b[i];
    return sqrt(d / s);
}

/* The last token's logits of each of n sequences (tokens tok[i], adapter lora[i]) in one step. */
static void step(wk_model *m, int n, const int32_t (*tok)[N], const int *lora, float *out) {
    wk_cache *c;
    CHECK_RC(wk_cache_create(m, KN_KV_F32, BLK, 3 * PER, &c), 0);
    int32_t blocks[3][PER];
    wk_batch_seq s[3];
    for (int i = 0; i < n; i++) {
        for (int b = 0; b < PER; b++) blocks[i][b] = i * PER + b;
        s[i] = (wk_batch_seq){tok[i], N, 0, blocks[i], N - 1, lora[i]};
    }
    CHECK_RC(wk_forward_batch(m, c, n, s, out), 0);
    wk_cache_free(c);
}

int main(int argc, char **argv) {
    if (argc < 2) return tst_done("lora_test");
    cm_log_set_level(CM_LOG_WARN);
    char base[1024], la[1100], lb[1100], merged[1024], err[512] = "";
    snprintf(base, sizeof base, "%s/base.gguf", argv[1]);
    snprintf(la, sizeof la, "a=%s/lora-a", argv[1]);
    snprintf(lb, sizeof lb, "b=%s/lora-b", argv[1]);
    snprintf(merged, sizeof merged, "%s/merged-a", argv[1]);
    const char *mods[2] = {la, lb};
    wk_model *m = NULL, *mm = NULL;
    wk_model_opts o = {.model_path = base, .threads = 2, .max_batch = 3 * N, .lora_modules = mods, .n_lora_modules = 2};
    CHECK_RC(wk_model_load(&o, &m, err, sizeof err), 0);
    wk_model_opts om = {.model_path = merged, .threads = 2, .max_batch = 3 * N};
    CHECK_RC(wk_model_load(&om, &mm, err, sizeof err), 0);
    if (!m || !mm) {
        fprintf(stderr, "lora_test: %s\n", err);
        return 1;
    }
    kn_set_act_f32(1);
    int V = (int)m->cfg.vocab;
    int32_t tok[3][N];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < N; j++) tok[i][j] = 300 + (int32_t)((i * 7919 + j * 104729) % 20000);
    int lora[3] = {1, 2, 0};
    float *batch = malloc(sizeof(float) * 3 * (size_t)V), *alone = malloc(sizeof(float) * (size_t)V);
    step(m, 3, tok, lora, batch);
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        step(m, 1, tok + i, lora + i, alone);
        double e = rel(batch + (size_t)i * V, alone, V);
        worst = e > worst ? e : worst;
        CHECK(e < 1e-6);
    }
    /* a's sequence against the merged model, and against the base (the adapter must matter) */
    int zero = 0;
    step(mm, 1, tok, &zero, alone);
    double em = rel(batch, alone, V);
    CHECK(em < 1e-4);
    step(m, 1, tok, &zero, alone);
    double eb = rel(batch, alone, V);
    CHECK(eb > 1e-2);
    printf("lora_test: a, b and the base in one step vs alone rel-L2 %.1e (worst); a vs merged weights %.1e; "
           "a vs the base %.2f\n", worst, em, eb);
    kn_set_act_f32(0);
    free(batch);
    free(alone);
    wk_model_free(m);
    wk_model_free(mm);
    return tst_done("lora_test");
}
