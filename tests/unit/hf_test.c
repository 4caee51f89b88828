/* hf_test: a llama-family Hugging Face checkpoint against the same model as
 * GGUF. tests/e2e/run_hf_e2e.sh writes the default GGUF as an F16 (and a
 * BF16) Hugging Face directory with tests/ref/gguf_to_hf.py (the `gguf`
 * package dequantizes, Q/K rows in Hugging Face's order) and the ids that
 * Hugging Face's `tokenizers` gives a list of texts with that tokenizer.json.
 *   argv[1] the GGUF, argv[2] the directory, argv[3] the reference ids (JSON)
 * Checks: the directory's tokenizer gives the reference's ids, and the
 * GGUF's tokenizer the same; the chat template, BOS/EOS and vocabulary
 * carry over; the logits of both models (float activations) agree to the
 * F16 rounding of the weights, and greedy decoding gives the same tokens. */
#include "cm_error.h"
#include "tst.h"
#include "wk_model.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *prompts[] = {
    "The capital of France is",
    "<|im_start|>user\nWhat is 12 times 7?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    ",
};

int main(int argc, char **argv) {
    if (argc < 4 || access(argv[1], R_OK) || access(argv[3], R_OK)) {
        printf("hf_test: model or reference ids absent; skipped\n");
        return TST_SKIP;
    }
    kn_set_act_f32(1); /* reference mode: no int8 rounding between the two */
    char err[600] = "";
    wk_model *g = NULL, *h = NULL;
    wk_model_opts og = {.model_path = argv[1], .threads = 2, .max_batch = 64};
    wk_model_opts oh = {.model_path = argv[2], .threads = 2, .max_batch = 64};
    CHECK_RC(wk_model_load(&og, &g, err, sizeof err), 0);
    if (!g) fprintf(stderr, "%s\n", err);
    CHECK_RC(wk_model_load(&oh, &h, err, sizeof err), 0);
    if (!h) fprintf(stderr, "%s\n", err);
    if (!g || !h) return 1;
    CHECK_INT(h->file->format, CM_FMT_HF);
    CHECK_INT(h->cfg.rope_type, CM_ROPE_NEOX); /* Hugging Face's order, where the GGUF interleaves */
    CHECK_INT(g->cfg.rope_type, CM_ROPE_NORM);
    CHECK_INT(h->cfg.tied, g->cfg.tied);
    CHECK_INT(cm_tok_vocab(h->tok), cm_tok_vocab(g->tok));
    CHECK_INT(cm_tok_eos(h->tok), cm_tok_eos(g->tok));
    CHECK(cm_tok_chat_template(h->tok) && cm_tok_chat_template(g->tok) &&
          !strcmp(cm_tok_chat_template(h->tok), cm_tok_chat_template(g->tok)));
    /* the reference's ids: `tokenizers` on the directory's tokenizer.json */
    json_error_t je;
    json_t *ref = json_load_file(argv[3], 0, &je);
    size_t i;
    json_t *c;
    int same_ref = 0, same_gguf = 0, n = (int)json_array_size(ref);
    json_array_foreach(ref, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        json_t *ids = json_object_get(c, "ids");
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        CHECK_RC(cm_tok_encode(h->tok, text, strlen(text), 0, 1, &a, &na), 0);
        CHECK_RC(cm_tok_encode(g->tok, text, strlen(text), 0, 1, &b, &nb), 0);
        int s = na == json_array_size(ids);
        for (size_t k = 0; s && k < na; k++) s = a[k] == json_integer_value(json_array_get(ids, k));
        if (!s) fprintf(stderr, "text %zu '%.40s': ids differ from tokenizers'\n", i, text);
        same_ref += s;
        same_gguf += na == nb && !memcmp(a, b, na * sizeof *a);
        free(a);
        free(b);
    }
    CHECK(n >= 10);
    CHECK_INT(same_ref, n);
    CHECK_INT(same_gguf, n);
    json_decref(ref);
    /* logits and greedy tokens */
    int V = (int)g->cfg.vocab;
    float *lg = malloc(sizeof(float) * (size_t)V), *lh = malloc(sizeof(float) * (size_t)V);
    double worst = 0;
    for (size_t p = 0; p < sizeof prompts / sizeof prompts[0]; p++) {
        int32_t *ids = NULL;
        size_t nt = 0;
        CHECK_RC(cm_tok_encode(g->tok, prompts[p], strlen(prompts[p]), -1, 1, &ids, &nt), 0);
        wk_kv *kg = NULL, *kh = NULL;
        CHECK_RC(wk_kv_create(g, 256, KN_KV_F32, &kg), 0);
        CHECK_RC(wk_kv_create(h, 256, KN_KV_F32, &kh), 0);
        CHECK_RC(wk_forward(g, kg, ids, (int)nt, lg, 0), 0);
        CHECK_RC(wk_forward(h, kh, ids, (int)nt, lh, 0), 0);
        int equal = 0, steps = 12;
        for (int s = 0; s < steps; s++) {
            double d = 0, r = 0;
            int ag = 0, ah = 0;
            for (int v = 0; v < V; v++) {
                d += ((double)lg[v] - lh[v]) * ((double)lg[v] - lh[v]);
                r += (double)lg[v] * lg[v];
                if (lg[v] > lg[ag]) ag = v;
                if (lh[v] > lh[ah]) ah = v;
            }
            double rel = sqrt(d / r);
            if (rel > worst) worst = rel;
            equal += ag == ah;
            int32_t t = ag;
            CHECK_RC(wk_forward(g, kg, &t, 1, lg, 0), 0);
            CHECK_RC(wk_forward(h, kh, &t, 1, lh, 0), 0);
        }
        printf("hf_test: prompt %zu: %d/%d greedy tokens equal\n", p, equal, steps);
        CHECK(equal >= steps - 1); /* the F16 rounding may flip a near tie */
        wk_kv_free(kg);
        wk_kv_free(kh);
        free(ids);
    }
    printf("hf_test: %d texts tokenized as tokenizers does; logits rel-L2 at most %.2e\n", n, worst);
    CHECK(worst < 2e-2);
    free(lg);
    free(lh);
    wk_model_free(g);
    wk_model_free(h);
    return tst_done("hf_test");
}
