/* bert_test - the BERT encoder and its WordPiece tokenizer against an
 * independent reference.
 *
 * tests/data/minilm_golden.json comes from tests/ref/bert_ref.py (Hugging
 * Face's `tokenizers` for the ids, numpy in float64 for the embeddings) on
 * all-MiniLM-L6-v2, which setup fetches. Every case must give the same ids
 * and an embedding with cosine >= 0.99999 to the reference, alone, all
 * batched in one step, and spread over many small steps, bit for bit the
 * same in all three (an input's result does not depend on its neighbours).
 * Then the refusals: ids outside the vocabulary, inputs too long or empty. */
#include "cm_error.h"
#include "tst.h"
#include "wk_bert.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double cosine(const float *a, const double *b, int n) {
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) {
        ab += a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += b[i] * b[i];
    }
    return ab / sqrt(aa * bb);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bert_test MODEL_DIR GOLDEN\n");
        return 2;
    }
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s/config.json", argv[1]);
    if (access(cfg, R_OK) != 0) {
        printf("bert_test: %s absent (tools/setup.sh fetches it); skipped\n", argv[1]);
        return TST_SKIP;
    }
    json_error_t je;
    json_t *doc = json_load_file(argv[2], JSON_ALLOW_NUL, &je); /* a case holds U+0000 */
    CHECK(doc != NULL);
    if (!doc) return 1;
    CHECK(!strcmp(json_string_value(json_object_get(doc, "magic")), "llmserve-bert-golden"));
    char err[600] = "";
    wk_encoder *e = NULL;
    wk_encoder_opts o = {.model_path = argv[1], .threads = 2};
    CHECK_RC(wk_encoder_load(&o, &e, err, sizeof err), 0);
    if (!e) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    CHECK_INT(e->cfg.pooling, CM_POOL_MEAN);
    CHECK_INT(e->cfg.normalize, 1);
    CHECK_INT(wk_encoder_max_len(e), 256); /* sentence_bert_config.json, not the 512 positions */
    json_t *cases = json_object_get(doc, "cases");
    int n = (int)json_array_size(cases), D = (int)e->cfg.dim;
    CHECK(n >= 20);
    int32_t **toks = calloc((size_t)n, sizeof *toks);
    int *len = calloc((size_t)n, sizeof *len);
    float *alone = malloc(sizeof(float) * (size_t)(n * D)), *batch = malloc(sizeof(float) * (size_t)(n * D)),
          *small = malloc(sizeof(float) * (size_t)(n * D));
    double *ref = malloc(sizeof(double) * (size_t)D), worst = 1;
    size_t i;
    json_t *c;
    int ids_equal = 0;
    json_array_foreach(cases, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t tl = json_string_length(json_object_get(c, "text"));
        json_t *ids = json_object_get(c, "ids");
        size_t nt = 0;
        CHECK_RC(cm_tok_encode(e->tok, text, tl, 1, 1, &toks[i], &nt), 0);
        len[i] = (int)nt;
        int same = nt == json_array_size(ids);
        for (size_t k = 0; same && k < nt; k++) same = toks[i][k] == json_integer_value(json_array_get(ids, k));
        if (!same) fprintf(stderr, "case %zu '%.40s': ids differ from the reference's\n", i, text);
        ids_equal += same;
        CHECK_RC(wk_encode(e, 1, (const int32_t *const *)&toks[i], &len[i], alone + i * (size_t)D), 0);
    }
    CHECK_INT(ids_equal, n);
    CHECK_RC(wk_encode(e, n, (const int32_t *const *)toks, len, batch), 0);
    json_array_foreach(cases, i, c) {
        json_t *emb = json_object_get(c, "embedding");
        CHECK_INT(json_array_size(emb), D);
        for (int d = 0; d < D; d++) ref[d] = json_number_value(json_array_get(emb, (size_t)d));
        double cs = cosine(alone + i * (size_t)D, ref, D);
        if (cs < worst) worst = cs;
        CHECK(cs >= 0.99999);
    }
    printf("bert_test: %d cases, ids equal, worst cosine to the reference %.9f\n", n, worst);
    CHECK(memcmp(alone, batch, sizeof(float) * (size_t)(n * D)) == 0);
    wk_encoder_free(e);
    /* steps of 64 tokens: inputs spread over many steps */
    wk_encoder_opts o2 = {.model_path = argv[1], .threads = 1, .max_tokens = 64};
    CHECK_RC(wk_encoder_load(&o2, &e, err, sizeof err), 0);
    if (e) {
        CHECK_INT(e->max_tokens, 256); /* never less than the longest input */
        CHECK_RC(wk_encode(e, n, (const int32_t *const *)toks, len, small), 0);
        CHECK(memcmp(alone, small, sizeof(float) * (size_t)(n * D)) == 0);
        /* refusals */
        int32_t bad[3] = {101, (int32_t)e->cfg.vocab, 102}, *bp = bad, bl = 3, zl = 0;
        CHECK_RC(wk_encode(e, 1, (const int32_t *const *)&bp, &bl, small), LLM_EINVAL);
        CHECK_RC(wk_encode(e, 1, (const int32_t *const *)&bp, &zl, small), LLM_ERANGE);
        int32_t *lng = calloc(300, sizeof *lng);
        int ll = 257;
        CHECK_RC(wk_encode(e, 1, (const int32_t *const *)&lng, &ll, small), LLM_ERANGE);
        ll = 256;
        CHECK_RC(wk_encode(e, 1, (const int32_t *const *)&lng, &ll, small), 0);
        free(lng);
        /* the tokenizer survives export and import (what gateways receive) */
        uint8_t *ex = NULL;
        size_t exl = 0;
        cm_tokenizer *t2 = NULL;
        CHECK_RC(cm_tok_export(e->tok, &ex, &exl), 0);
        CHECK_RC(cm_tok_import(ex, exl, &t2, err, sizeof err), 0);
        if (t2) {
            CHECK_INT(cm_tok_kind(t2), CM_TOK_WPM);
            CHECK(cm_tok_fingerprint(t2) == cm_tok_fingerprint(e->tok));
            json_array_foreach(cases, i, c) {
                const char *text = json_string_value(json_object_get(c, "text"));
                int32_t *ids2 = NULL;
                size_t n2 = 0;
                CHECK_RC(cm_tok_encode(t2, text, json_string_length(json_object_get(c, "text")), 1, 1, &ids2, &n2), 0);
                CHECK(n2 == (size_t)len[i] && !memcmp(ids2, toks[i], n2 * sizeof *ids2));
                free(ids2);
            }
            char *dec = cm_tok_decode(t2, toks[1], (size_t)len[1], 0);
            CHECK(dec && !strcmp(dec, "what is the capital of france ?")); /* pieces joined by spaces, no clean-up */
            if (dec) printf("bert_test: decode '%s'\n", dec);
            free(dec);
            cm_tok_free(t2);
        }
        free(ex);
        wk_encoder_free(e);
    }
    for (int k = 0; k < n; k++) free(toks[k]);
    free(toks); free(len); free(alone); free(batch); free(small); free(ref);
    json_decref(doc);
    return tst_done("bert_test");
}
