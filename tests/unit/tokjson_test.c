/* tokjson_test: a tokenizer.json read by cm_tok_hf.c against the ids
 * Hugging Face's `tokenizers` gives the same file (written by
 * tests/e2e/run_hf_e2e.sh: Unigram models trained with `tokenizers` itself,
 * with and without byte fallback).
 *   argv[1] tokenizer.json, argv[2] the reference: [{"text", "ids"}],
 *   argv[3] 1: the ids were made with the template's special tokens
 * Also: the export / import round trip gives the same ids, and decoding
 * gives the text back where no character was unknown (nor special). */
#include "cm_error.h"
#include "cm_tokenizer.h"
#include "tst.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 4 || access(argv[1], R_OK) || access(argv[2], R_OK)) {
        printf("tokjson_test: inputs absent; skipped\n");
        return TST_SKIP;
    }
    char err[400] = "";
    cm_tokenizer *t = NULL, *t2 = NULL;
    CHECK_RC(cm_tok_from_hf_json(argv[1], &t, err, sizeof err), 0);
    if (!t) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    uint8_t *ex = NULL;
    size_t exl = 0;
    CHECK_RC(cm_tok_export(t, &ex, &exl), 0);
    CHECK_RC(cm_tok_import(ex, exl, &t2, err, sizeof err), 0);
    free(ex);
    int specials = atoi(argv[3]), n = 0, same = 0, same2 = 0, round = 0, known = 0;
    json_error_t je;
    json_t *ref = json_load_file(argv[2], 0, &je), *c;
    size_t i;
    json_array_foreach(ref, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        json_t *ids = json_object_get(c, "ids");
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        CHECK_RC(cm_tok_encode(t, text, strlen(text), specials, 1, &a, &na), 0);
        if (t2) CHECK_RC(cm_tok_encode(t2, text, strlen(text), specials, 1, &b, &nb), 0);
        int s = na == json_array_size(ids), unk = 0;
        for (size_t k = 0; s && k < na; k++) s = a[k] == json_integer_value(json_array_get(ids, k));
        for (size_t k = 0; k < na; k++) unk |= a[k] == cm_tok_unk(t) || cm_tok_type(t, a[k]) == CM_TT_CONTROL;
        if (!s) {
            fprintf(stderr, "text %zu '%.40s': ids differ from tokenizers':", i, text);
            for (size_t k = 0; k < na && k < 24; k++) fprintf(stderr, " %d", a[k]);
            fprintf(stderr, "\n");
        }
        same += s;
        same2 += na == nb && (!na || !memcmp(a, b, na * sizeof *a));
        if (!unk && !specials && text[0] && text[0] != ' ') { /* what comes back: the text, spaces and all */
            char *d = cm_tok_decode(t, a, na, 0);
            known++;
            if (d && strcmp(d, text)) fprintf(stderr, "text %zu: decoded as '%s'\n", i, d);
            round += d && !strcmp(d, text);
            free(d);
        }
        n++;
        free(a);
        free(b);
    }
    printf("tokjson_test: %d texts, %d with the reference's ids, %d/%d decoded back\n", n, same, round, known);
    CHECK(n >= 10);
    CHECK_INT(same, n);
    CHECK_INT(same2, n);
    CHECK_INT(round, known);
    json_decref(ref);
    cm_tok_free(t);
    cm_tok_free(t2);
    return tst_done("tokjson_test");
}
