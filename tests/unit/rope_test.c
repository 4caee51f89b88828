/* RoPE scaling and the refusal of model settings the engine does not
 * implement, on the models tests/ref/rope_ref.py makes (run by rope_e2e):
 *   - each scaled model (GGUF: none, llama3's rope_freqs.weight, linear,
 *     yarn; Hugging Face config.json: llama3, linear, dynamic, yarn, yarn
 *     with its own attention factor and betas) runs 320 random tokens with
 *     float activations, and its logits at positions past the original
 *     context of 128 must match the independent numpy forward (llama_ref.py)
 *     to 1e-3 relative, top-1 equal;
 *   - --rope-scaling on a model without scaling gives the same logits as
 *     the file's own keys, and is refused on a model that has its own;
 *   - each model carrying a setting the engine does not implement must fail
 *     to load with an error that names it.
 * Without arguments (as a plain ctest run) it checks the frequency tables
 * against hand-worked values. */
#include "cm_error.h"
#include "cm_rope.h"
#include "kernels.h"
#include "tst.h"
#include "wk_model.h"
#include "wk_sampler.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double rel_l2(const float *a, const double *b, int n) {
    double d = 0, s = 0;
    for (int i = 0; i < n; i++) {
        d += (a[i] - b[i]) * (a[i] - b[i]);
        s += b[i] * b[i];
    }
    return sqrt(d / s);
}

static void scaled(const char *name, const char *path, const char *rope, const char *ref_path) {
    char err[512] = "";
    json_error_t je;
    json_t *ref = json_load_file(ref_path, 0, &je);
    CHECK(ref != NULL);
    if (!ref) return;
    wk_model *m = NULL;
    wk_model_opts o = {.model_path = path, .threads = 2, .max_batch = 64, .rope_scaling = rope};
    CHECK_RC(wk_model_load(&o, &m, err, sizeof err), 0);
    if (!m) {
        fprintf(stderr, "%s: %s\n", name, err);
        json_decref(ref);
        return;
    }
    json_t *ids = json_object_get(ref, "ids");
    int n = (int)json_array_size(ids), V = (int)m->cfg.vocab;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) toks[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
    float *lg = malloc(sizeof(float) * (size_t)V);
    double *want = malloc(sizeof(double) * (size_t)V);
    wk_kv *kv = NULL;
    CHECK_RC(wk_kv_create(m, n + 1, KN_KV_F32, &kv), 0);
    if (!kv) n = 0; /* (reported) */
    kn_set_act_f32(1);
    int at = 0;
    size_t ci;
    json_t *c;
    double worst = 0;
    int top_ok = 0, nchk = 0;
    json_array_foreach(json_object_get(ref, "checks"), ci, c) {
        int pos = (int)json_integer_value(json_object_get(c, "pos"));
        json_t *l = json_object_get(c, "logits");
        CHECK_INT(json_array_size(l), V);
        if ((int)json_array_size(l) != V || pos < at || pos >= n) break;
        CHECK_RC(wk_forward(m, kv, toks + at, pos + 1 - at, lg, 0), 0); /* chunks through the KV cache */
        at = pos + 1;
        for (int i = 0; i < V; i++) want[i] = json_real_value(json_array_get(l, (size_t)i));
        double e = rel_l2(lg, want, V);
        int wt = 0;
        for (int i = 1; i < V; i++)
            if (want[i] > want[wt]) wt = i;
        worst = e > worst ? e : worst;
        top_ok += wk_argmax(lg, V) == wt;
        nchk++;
        CHECK(e < 1e-3);
        CHECK_INT(wk_argmax(lg, V), wt);
    }
    kn_set_act_f32(0);
    printf("%-34s ctx %6u, %d positions up to %d: logits rel-L2 %.1e (worst), top-1 %d/%d\n", name, m->cfg.ctx_len,
           nchk, at - 1, worst, top_ok, nchk);
    if (kv) wk_kv_free(kv);
    free(toks);
    free(lg);
    free(want);
    wk_model_free(m);
    json_decref(ref);
}

static void refused(const char *name, const char *path, const char *rope, const char *key) {
    char err[512] = "";
    wk_model *m = NULL;
    wk_model_opts o = {.model_path = path, .threads = 1, .max_batch = 4, .rope_scaling = rope};
    int rc = wk_model_load(&o, &m, err, sizeof err);
    int ok = rc != 0 && strstr(err, key) != NULL;
    CHECK(ok);
    printf("%-34s %s: %s\n", name, ok ? "refused, naming it" : "NOT REFUSED AS IT MUST BE", rc ? err : "(loaded)");
    if (m) wk_model_free(m);
}

/* Frequency tables against values worked by hand from the definitions. */
static void tables(void) {
    float f[8];
    /* none: theta^(-2i/d) */
    cm_rope_inv_freq(NULL, 10000.0, 16, NULL, f);
    CHECK_NEAR(f[0], 1.0, 1e-7);
    CHECK_NEAR(f[4], 0.01, 1e-7);
    /* linear 4: every pair a quarter */
    cm_rope_scaling lin = {CM_RS_LINEAR, 4.f, 0, 0, 0, 0, 0, 0, 1.f};
    cm_rope_inv_freq(&lin, 10000.0, 16, NULL, f);
    CHECK_NEAR(f[4], 0.0025, 1e-8);
    /* llama3 8x over 128: wavelength 6.3 and 19.9 kept, 62.8 blended ((128/62.8 - 1)/3 = 0.346 of it kept), 199+ /8 */
    cm_rope_scaling l3 = {CM_RS_LLAMA3, 8.f, 128, 1.f, 4.f, 0, 0, 0, 1.f};
    cm_rope_inv_freq(&l3, 10000.0, 16, NULL, f);
    CHECK_NEAR(f[1], pow(10000.0, -2.0 / 16), 1e-7);
    double s = (128.0 / (2 * M_PI / 0.1) - 1) / 3;
    CHECK_NEAR(f[2], (1 - s) * 0.1 / 8 + s * 0.1, 1e-7);
    CHECK_NEAR(f[5], pow(10000.0, -10.0 / 16) / 8, 1e-8);
    /* the divisors of a GGUF rope_freqs.weight apply on top */
    float div[8] = {1, 1, 2, 8, 8, 8, 8, 8};
    cm_rope_inv_freq(NULL, 10000.0, 16, div, f);
    CHECK_NEAR(f[3], pow(10000.0, -6.0 / 16) / 8, 1e-8);
    /* yarn 4x over 128, betas 32 / 1: pairs below floor(16 ln(128/(64 pi)) / (2 ln 1e4)) = 0 extrapolate... */
    cm_rope_scaling y = {CM_RS_YARN, 4.f, 128, 0, 0, 32.f, 1.f, 1, 1.f};
    cm_rope_inv_freq(&y, 10000.0, 16, NULL, f);
    double hi = ceil(16 * log(128 / (2 * M_PI)) / (2 * log(10000.0))); /* 3 */
    CHECK_NEAR(f[0], 1.0, 1e-7);                                        /* ramp 0: kept */
    CHECK_NEAR(f[7], pow(10000.0, -14.0 / 16) / 4, 1e-8);               /* past hi: interpolated */
    double r = 2 / hi;                                                   /* pair 2 of the ramp 0..3 */
    CHECK_NEAR(f[2], 0.1 / 4 * r + 0.1 * (1 - r), 1e-7);
    /* dynamic, as vLLM: base * (f^2 - f + 1)^(d/(d-2)) */
    cm_rope_scaling dy = {CM_RS_DYNAMIC, 4.f, 0, 0, 0, 0, 0, 0, 1.f};
    cm_rope_inv_freq(&dy, 10000.0, 16, NULL, f);
    CHECK_NEAR(f[1], pow(10000.0 * pow(13.0, 16.0 / 14), -2.0 / 16), 1e-7);
}

int main(int argc, char **argv) {
    tables();
    if (argc < 2) return tst_done("rope_test");
    char mp[1024];
    snprintf(mp, sizeof mp, "%s/manifest.json", argv[1]);
    json_error_t je;
    json_t *man = json_load_file(mp, 0, &je);
    CHECK(man != NULL);
    size_t i;
    json_t *e;
    json_array_foreach(man, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *path = json_string_value(json_object_get(e, "path"));
        const char *ref = json_string_value(json_object_get(e, "ref"));
        const char *key = json_string_value(json_object_get(e, "refuse"));
        const char *rope = json_string_value(json_object_get(e, "rope_scaling")); /* as --rope-scaling */
        if (ref) {
            char rp[1024];
            snprintf(rp, sizeof rp, "%s/%s", argv[1], ref);
            scaled(name, path, rope, rp);
        } else if (key) {
            refused(name, path, rope, key);
        }
    }
    json_decref(man);
    return tst_done("rope_test");
}
