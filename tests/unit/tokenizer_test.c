/* Tokenizer: the default model's tokenizer against reference ids made by an
 * independent implementation (tests/ref/make_tokens.py, HF tokenizers), the
 * encode -> decode round trip, the incremental detokenizer (never half a
 * UTF-8 character), chat templates, and with ../shared present llama.cpp's
 * vocabulary test vectors for GPT-2 BPE and SentencePiece. */
#include "cm_chat.h"
#include "cm_error.h"
#include "cm_model.h"
#include "cm_tokenizer.h"
#include "cm_unicode.h"
#include "tst.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void check_detok(const cm_tokenizer *t, const int32_t *ids, size_t n, const char *want) {
    cm_detok d;
    cm_detok_init(&d, t);
    size_t cap = strlen(want) + 256, o = 0;
    char *out = malloc(cap);
    int partial = 0;
    for (size_t i = 0; i < n; i++) {
        size_t w = cm_detok_push(&d, t, ids[i], out + o, cap - o);
        if (cm_utf8_complete_prefix(out + o, w) != w) partial++;
        o += w;
    }
    o += cm_detok_flush(&d, out + o, cap - o);
    out[o] = 0;
    CHECK_INT(partial, 0);
    CHECK(strcmp(out, want) == 0);
    free(out);
}

static void reference_ids(const char *json_path, const char *model) {
    if (access(model, R_OK) != 0) {
        printf("reference ids: %s absent (run tools/setup.sh); skipped\n", model);
        return;
    }
    cm_model_file *m;
    cm_tokenizer *t;
    char err[512];
    CHECK_RC(cm_model_open(model, &m, err, sizeof err), 0);
    CHECK_RC(cm_tok_from_gguf(m->gguf, &t, err, sizeof err), 0);
    CHECK_INT(cm_tok_pre(t), CM_PRE_SMOLLM);
    json_error_t je;
    json_t *doc = json_load_file(json_path, 0, &je);
    CHECK(doc != NULL);
    size_t i, ok = 0, total = 0;
    json_t *c;
    json_array_foreach(json_object_get(doc, "cases"), i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        json_t *want = json_object_get(c, "ids");
        int32_t *ids;
        size_t n;
        total++;
        CHECK_RC(cm_tok_encode(t, text, strlen(text), 0, 1, &ids, &n), 0);
        int same = n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(want, k));
        if (!same) {
            fprintf(stderr, "mismatch for '%s':\n ours:", text);
            for (size_t k = 0; k < n; k++) fprintf(stderr, " %d", ids[k]);
            fprintf(stderr, "\n  ref:");
            for (size_t k = 0; k < json_array_size(want); k++)
                fprintf(stderr, " %lld", json_integer_value(json_array_get(want, k)));
            fprintf(stderr, "\n");
        }
        ok += same;
        char *back = cm_tok_decode(t, ids, n, 1); /* byte-level BPE round-trips exactly */
        CHECK(back && strcmp(back, text) == 0);
        free(back);
        if (!strstr(text, "<|")) check_detok(t, ids, n, text);
        free(ids);
    }
    CHECK_INT(ok, total);
    CHECK(total >= 50);
    printf("reference ids: %zu/%zu strings identical\n", ok, total);
    /* a long hostile word stays fast (O(n log n) merges) */
    size_t big = 1 << 20;
    char *s = malloc(big + 1);
    for (size_t k = 0; k < big; k++) s[k] = "ab"[k % 2];
    s[big] = 0;
    int32_t *ids;
    size_t n;
    CHECK_RC(cm_tok_encode(t, s, big, 0, 1, &ids, &n), 0);
    char *back = cm_tok_decode(t, ids, n, 1);
    CHECK(back && strcmp(back, s) == 0);
    free(back);
    free(ids);
    /* invalid UTF-8 is encoded byte by byte and decodes back to the same bytes
     * (bytes 0xfe/0xff, which UTF-8 never uses, have no token in this vocabulary) */
    const char bad[] = "ok \xe2\x82 end \xc3(";
    CHECK_RC(cm_tok_encode(t, bad, sizeof bad - 1, 0, 1, &ids, &n), 0);
    back = cm_tok_decode(t, ids, n, 1);
    CHECK(back && memcmp(back, bad, sizeof bad) == 0);
    free(back);
    free(ids);
    free(s);
    /* chat template from metadata: ChatML with SmolLM2's default system prompt */
    const char *tmpl = cm_tok_chat_template(t);
    CHECK_INT(cm_chat_detect(tmpl), CM_CHAT_CHATML);
    char *sys = cm_chat_default_system(tmpl);
    CHECK(sys && strcmp(sys, "You are a helpful AI assistant named SmolLM, trained by Hugging Face") == 0);
    cm_chat_msg msgs[] = {{"user", "Hi"}};
    char *out;
    CHECK_RC(cm_chat_render(CM_CHAT_CHATML, sys, msgs, 1, 1, &out), 0);
    CHECK(strcmp(out, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                      "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n") == 0);
    free(out);
    cm_chat_msg badrole[] = {{"wizard", "Hi"}};
    CHECK_RC(cm_chat_render(CM_CHAT_CHATML, NULL, badrole, 1, 1, &out), LLM_EINVAL);
    CHECK(cm_tok_is_eog(t, cm_tok_lookup(t, "<|im_end|>")));
    free(sys);
    json_decref(doc);
    cm_tok_free(t);
    cm_model_close(m);
}

/* llama.cpp's vocab test files: strings split by __ggml_vocab_test__, ids per line. */
static void vocab_vectors(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (access(path, R_OK) != 0) {
        printf("vocab %s: not present; skipped\n", name);
        return;
    }
    cm_gguf *g;
    cm_tokenizer *t;
    char err[512];
    CHECK_RC(cm_gguf_open(path, &g, err, sizeof err), 0);
    CHECK_RC(cm_tok_from_gguf(g, &t, err, sizeof err), 0);
    char ip[1100], op[1100];
    snprintf(ip, sizeof ip, "%s.inp", path);
    snprintf(op, sizeof op, "%s.out", path);
    FILE *fi = fopen(ip, "rb"), *fo = fopen(op, "rb");
    static char in[1 << 16];
    size_t nin = fread(in, 1, sizeof in - 1, fi);
    in[nin] = 0;
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = in, line[8192];
    int total = 0, ok = 0;
    while (*p) {
        char *e = strstr(p, sep);
        if (!e) break;
        *e = 0;
        if (!fgets(line, sizeof line, fo)) break;
        int32_t *ids;
        size_t n;
        CHECK_RC(cm_tok_encode(t, p, strlen(p), 0, 0, &ids, &n), 0);
        char ours[8192] = "";
        size_t o = 0;
        for (size_t k = 0; k < n; k++) o += (size_t)snprintf(ours + o, sizeof ours - o, " %d", ids[k]);
        line[strcspn(line, "\n")] = 0;
        total++;
        if (strcmp(ours, line) == 0) ok++;
        else fprintf(stderr, "%s: '%s'\n  ours:%s\n  want:%s\n", name, p, ours, line);
        free(ids);
        p = e + strlen(sep);
    }
    fclose(fi);
    fclose(fo);
    printf("vocab %s: %d/%d strings identical\n", name, ok, total);
    CHECK(total > 20);
    CHECK_INT(ok, total);
    cm_tok_free(t);
    cm_gguf_close(g);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tokenizer_test TOKENS.json MODEL [VOCAB_DIR]\n");
        return 2;
    }
    reference_ids(argv[1], argv[2]);
    if (argc > 3) {
        vocab_vectors(argv[3], "ggml-vocab-gpt-2.gguf");
        vocab_vectors(argv[3], "ggml-vocab-llama-spm.gguf");
    }
    return tst_done("tokenizer_test");
}
