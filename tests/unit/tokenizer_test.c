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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Export -> import gives a tokenizer that encodes every case to the same ids,
 * with the same fingerprint, and whose own export is byte-identical. */
static void check_export(const cm_tokenizer *t, const char *const *cases, int n_cases) {
    uint8_t *b, *b2;
    size_t nb, nb2;
    cm_tokenizer *u;
    char err[256];
    CHECK_RC(cm_tok_export(t, &b, &nb), 0);
    CHECK_RC(cm_tok_import(b, nb, &u, err, sizeof err), 0);
    if (!u) return;
    CHECK_RC(cm_tok_export(u, &b2, &nb2), 0);
    CHECK(nb == nb2 && memcmp(b, b2, nb) == 0);
    CHECK(cm_tok_fingerprint(t) == cm_tok_fingerprint(u));
    CHECK_INT(cm_tok_vocab(u), cm_tok_vocab(t));
    CHECK_INT(cm_tok_bos(u), cm_tok_bos(t));
    CHECK_INT(cm_tok_eos(u), cm_tok_eos(t));
    CHECK((cm_tok_chat_template(t) == NULL) == (cm_tok_chat_template(u) == NULL));
    for (int c = 0; c < n_cases; c++) {
        int32_t *x, *y;
        size_t nx, ny;
        CHECK_RC(cm_tok_encode(t, cases[c], strlen(cases[c]), -1, 1, &x, &nx), 0);
        CHECK_RC(cm_tok_encode(u, cases[c], strlen(cases[c]), -1, 1, &y, &ny), 0);
        CHECK(nx == ny && memcmp(x, y, nx * sizeof *x) == 0);
        free(x);
        free(y);
    }
    /* a cut or corrupted blob is refused, never read past its end */
    int refused = 0;
    for (int k = 1; k <= 64; k++) {
        size_t cut = nb * (size_t)k / 65;
        cm_tokenizer *v = NULL;
        uint8_t *part = malloc(cut);
        memcpy(part, b, cut);
        if (cm_tok_import(part, cut, &v, err, sizeof err)) refused++;
        cm_tok_free(v);
        free(part);
    }
    CHECK_INT(refused, 64);
    free(b);
    free(b2);
    cm_tok_free(u);
}

static const char *const export_cases[] = {
    "Hello world", "  two  spaces and\ttabs\n\nnewlines", "<|im_start|>user\nHi<|im_end|>", "digits 1234567 and 3.14",
    "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80", "don't you're we'll", "<s>raw</s>",
};

/* Hostile inputs of `mb` MiB each: none may be slow (the tokenizer is linear),
 * and every one round-trips. Prints the throughput of each. */
static void adversarial(const cm_tokenizer *t, const char *name, size_t mb) {
    static const char *const unit[] = {"a", "hello ", "!?.,;:-", "<|im_start|>", "\xd0\x96\xe4\xb8\xad\xf0\x9f\x98\x80x1 ",
                                       "1234567890", " ", "\n", "<|<<|", "'s'"};
    static const char *const label[] = {"one letter", "one word repeated", "punctuation only", "special tokens only",
                                        "mixed scripts", "digits only", "spaces only", "newlines only",
                                        "special prefixes", "contractions"};
    size_t len = mb << 20;
    char *s = malloc(len + 1);
    double worst = 1e30;
    for (size_t u = 0; u < sizeof unit / sizeof unit[0]; u++) {
        size_t ul = strlen(unit[u]);
        for (size_t k = 0; k < len; k++) s[k] = unit[u][k % ul];
        size_t n = len - len % ul;
        s[n] = 0;
        int32_t *ids;
        size_t ni;
        double t0 = tst_now();
        int rc = cm_tok_encode(t, s, n, 0, 1, &ids, &ni);
        double dt = tst_now() - t0;
        CHECK_RC(rc, 0);
        if (rc) continue;
        char *back = cm_tok_decode(t, ids, ni, 1);
        int same = back && strlen(back) == n && memcmp(back, s, n) == 0;
        if (!same) fprintf(stderr, "%s: %s does not round-trip\n", name, label[u]);
        CHECK(same);
        double mbs = (double)n / (1 << 20) / (dt > 1e-9 ? dt : 1e-9);
        if (mbs < worst) worst = mbs;
        printf("tokenizer %s, %zu MiB of %s: %zu ids in %.3f s (%.1f MiB/s)\n", name, mb, label[u], ni, dt, mbs);
        /* a stall guard, not a benchmark: quadratic work on 2 MiB takes minutes */
        CHECK(dt < 30.0);
        free(back);
        free(ids);
    }
    printf("tokenizer %s: worst case %.1f MiB/s\n", name, worst);
    /* a limit stops the work early and says how far it got */
    for (size_t k = 0; k < len; k++) s[k] = "hello "[k % 6];
    int32_t *ids;
    size_t ni;
    CHECK_RC(cm_tok_encode_limit(t, s, 600, 0, 1, 50, &ids, &ni), LLM_ERANGE);
    CHECK(ids == NULL && ni > 50);
    CHECK_RC(cm_tok_encode_limit(t, s, len, 0, 1, 8192, &ids, &ni), LLM_ERANGE);
    CHECK(ni > 8192);
    int32_t *full;
    size_t nf;
    CHECK_RC(cm_tok_encode_limit(t, s, 600, 0, 1, 1000, &ids, &ni), 0);
    CHECK_RC(cm_tok_encode(t, s, 600, 0, 1, &full, &nf), 0);
    CHECK(ni == nf && memcmp(ids, full, ni * sizeof *ids) == 0);
    free(ids);
    CHECK_RC(cm_tok_encode_limit(t, s, 600, 0, 1, nf, &ids, &ni), 0); /* exactly at the limit is fine */
    free(ids);
    free(full);
    free(s);
}

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
    /* families with no system role: a system prompt rides with the first user
     * turn, or is a user turn of its own when none follows (it was dropped),
     * and a later system message is a user turn, not the model's */
    cm_chat_msg only_sys[] = {{"system", "Be brief"}}, late_sys[] = {{"user", "Hi"}, {"system", "Now in French"}};
    CHECK_RC(cm_chat_render(CM_CHAT_GEMMA, NULL, only_sys, 1, 1, &out), 0);
    CHECK(strcmp(out, "<start_of_turn>user\nBe brief<end_of_turn>\n<start_of_turn>model\n") == 0);
    free(out);
    CHECK_RC(cm_chat_render(CM_CHAT_GEMMA, NULL, late_sys, 2, 0, &out), 0);
    CHECK(strcmp(out, "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>user\nNow in French<end_of_turn>\n") == 0);
    free(out);
    CHECK_RC(cm_chat_render(CM_CHAT_LLAMA2, NULL, only_sys, 1, 1, &out), 0);
    CHECK(strcmp(out, "<s>[INST] <<SYS>>\nBe brief\n<</SYS>>\n\n [/INST]") == 0);
    free(out);
    CHECK_RC(cm_chat_render(CM_CHAT_MISTRAL, NULL, late_sys, 2, 0, &out), 0);
    CHECK(strcmp(out, "<s>[INST] Hi [/INST][INST] Now in French [/INST]") == 0);
    free(out);
    cm_chat_msg badrole[] = {{"wizard", "Hi"}};
    CHECK_RC(cm_chat_render(CM_CHAT_CHATML, NULL, badrole, 1, 1, &out), LLM_EINVAL);
    CHECK(cm_tok_is_eog(t, cm_tok_lookup(t, "<|im_end|>")));
    free(sys);
    json_decref(doc);
    check_export(t, export_cases, (int)(sizeof export_cases / sizeof export_cases[0]));
    adversarial(t, "smollm2", 2);
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
    check_export(t, export_cases, (int)(sizeof export_cases / sizeof export_cases[0]));
    if (cm_tok_kind(t) == CM_TOK_SPM) adversarial(t, "llama-spm", 1);
    cm_tok_free(t);
    cm_gguf_close(g);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tokenizer_test TOKENS.json MODEL [VOCAB_DIR]\n");
        return 2;
    }
    cm_tokenizer *syn;
    CHECK_RC(cm_tok_synthetic(32000, &syn), 0);
    check_export(syn, export_cases, (int)(sizeof export_cases / sizeof export_cases[0]));
    adversarial(syn, "stand-in (dummy weights)", 1);
    cm_tok_free(syn);
    reference_ids(argv[1], argv[2]);
    if (argc > 3) {
        vocab_vectors(argv[3], "ggml-vocab-gpt-2.gguf");
        vocab_vectors(argv[3], "ggml-vocab-llama-spm.gguf");
    }
    return tst_done("tokenizer_test");
}
