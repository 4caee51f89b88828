/* cm_tok_hf.c - a tokenizer from a Hugging Face tokenizer.json.
 *
 * Only what the file says is honoured: a step this reader does not
 * implement (another model, normalizer, pre-tokenizer or post-processor) is
 * refused by name rather than skipped, since a skipped step gives different
 * ids without an error. */
#include "cm_error.h"
#include "cm_gguf.h"
#include "cm_tok_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_WORD_CHARS 10000

static const char *jtype(json_t *o) { return json_string_value(json_object_get(o, "type")); }

/* Before the text index exists (cm_tok_finish builds it): a scan, for the
 * few tokens the file names. */
static int32_t lookup(const cm_tokenizer *t, const char *s) {
    if (!s) return -1;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->text[i] && !strcmp(t->text[i], s)) return i;
    return -1;
}

static int wpm_normalizer(cm_tokenizer *t, json_t *n, char *e, size_t el) {
    if (!n || json_is_null(n)) return 0;
    const char *ty = jtype(n);
    if (!ty || strcmp(ty, "BertNormalizer")) {
        snprintf(e, el, "normalizer '%.40s' is not supported (BertNormalizer)", ty ? ty : "?");
        return LLM_EUNSUP;
    }
    json_t *sa = json_object_get(n, "strip_accents");
    int lower = json_is_true(json_object_get(n, "lowercase"));
    int strip = json_is_boolean(sa) ? json_is_true(sa) : lower; /* null: follows lowercase */
    t->wp_flags = (json_is_true(json_object_get(n, "clean_text")) ? CM_WPM_CLEAN : 0) |
                  (json_is_true(json_object_get(n, "handle_chinese_chars")) ? CM_WPM_CHINESE : 0) |
                  (strip ? CM_WPM_STRIP : 0) | (lower ? CM_WPM_LOWER : 0);
    return 0;
}

/* [CLS] $A [SEP] from a TemplateProcessing or BertProcessing: bos and eos. */
static int wpm_post(cm_tokenizer *t, json_t *p, char *e, size_t el) {
    t->add_bos = 0;
    if (!p || json_is_null(p)) return 0;
    const char *ty = jtype(p);
    const char *first = NULL, *last = NULL;
    if (ty && !strcmp(ty, "BertProcessing")) {
        first = json_string_value(json_array_get(json_object_get(p, "cls"), 0));
        last = json_string_value(json_array_get(json_object_get(p, "sep"), 0));
    } else if (ty && !strcmp(ty, "TemplateProcessing")) {
        json_t *single = json_object_get(p, "single");
        size_t n = json_array_size(single);
        json_t *a = json_array_get(single, 0), *b = json_array_get(single, 1), *c = json_array_get(single, 2);
        json_t *sa = json_object_get(a, "SpecialToken"), *sc = json_object_get(c, "SpecialToken");
        json_t *seq = json_object_get(b, "Sequence");
        if (n == 3 && sa && sc && seq) {
            first = json_string_value(json_object_get(sa, "id"));
            last = json_string_value(json_object_get(sc, "id"));
        }
        if (!first || !last) {
            snprintf(e, el, "post_processor TemplateProcessing: only a single template of the form "
                            "[special] $A [special] is supported");
            return LLM_EUNSUP;
        }
    } else {
        snprintf(e, el, "post_processor '%.40s' is not supported (BertProcessing, TemplateProcessing)",
                 ty ? ty : "?");
        return LLM_EUNSUP;
    }
    t->bos = lookup(t, first);
    t->eos = lookup(t, last);
    if (t->bos < 0 || t->eos < 0) {
        snprintf(e, el, "post_processor names tokens that are not in the vocabulary");
        return LLM_EFORMAT;
    }
    t->add_bos = 1;
    return 0;
}

static int from_json(json_t *root, cm_tokenizer *t, char *e, size_t el) {
    json_t *model = json_object_get(root, "model");
    const char *mty = jtype(model);
    if (!mty && json_object_get(model, "continuing_subword_prefix") && json_object_get(model, "max_input_chars_per_word"))
        mty = "WordPiece"; /* older files leave the type out */
    if (!mty || strcmp(mty, "WordPiece")) {
        snprintf(e, el, "model '%.40s' is not supported (WordPiece)", mty ? mty : "?");
        return LLM_EUNSUP;
    }
    t->kind = CM_TOK_WPM;
    json_t *vocab = json_object_get(model, "vocab");
    size_t nv = json_object_size(vocab);
    if (!json_is_object(vocab) || nv == 0 || nv > MAX_VOCAB) {
        snprintf(e, el, "model.vocab is not an object of 1 to %d tokens", MAX_VOCAB);
        return LLM_EFORMAT;
    }
    int rc = cm_tok_alloc_vocab(t, (int32_t)nv);
    if (rc) return rc;
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= (json_int_t)nv || t->text[id]) {
            snprintf(e, el, "model.vocab: token '%.40s' has id %lld (ids must be 0..%zu, each once)", k,
                     (long long)id, nv - 1);
            return LLM_EFORMAT;
        }
        if ((rc = cm_tok_set_entry(t, (int32_t)id, k, strlen(k)))) return rc;
        t->type[id] = CM_TT_NORMAL;
    }
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    const char *px = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    json_t *mc = json_object_get(model, "max_input_chars_per_word");
    if (!px) px = "##";
    if (strlen(px) >= sizeof t->wp_prefix) {
        snprintf(e, el, "continuing_subword_prefix is longer than %zu bytes", sizeof t->wp_prefix - 1);
        return LLM_EFORMAT;
    }
    snprintf(t->wp_prefix, sizeof t->wp_prefix, "%s", px);
    t->wp_prefix_len = (uint32_t)strlen(px);
    t->wp_max_chars = 100;
    if (json_is_integer(mc)) {
        if (json_integer_value(mc) <= 0 || json_integer_value(mc) > MAX_WORD_CHARS) {
            snprintf(e, el, "max_input_chars_per_word must be 1..%d", MAX_WORD_CHARS);
            return LLM_EFORMAT;
        }
        t->wp_max_chars = (uint32_t)json_integer_value(mc);
    }
    /* added tokens: special ones are control tokens, the rest user-defined;
     * both are split out of the text before normalization */
    size_t i;
    json_t *at;
    json_array_foreach(json_object_get(root, "added_tokens"), i, at) {
        json_t *idv = json_object_get(at, "id");
        const char *c = json_string_value(json_object_get(at, "content"));
        json_int_t id = json_is_integer(idv) ? json_integer_value(idv) : -1;
        if (!c || id < 0 || id >= (json_int_t)nv || strcmp(t->text[id], c)) {
            snprintf(e, el, "added_tokens[%zu] is not a token of the vocabulary with its id", i);
            return LLM_EFORMAT;
        }
        t->type[id] = json_is_true(json_object_get(at, "special")) ? CM_TT_CONTROL : CM_TT_USER;
    }
    t->unk = lookup(t, unk);
    if (t->unk < 0) {
        snprintf(e, el, "model.unk_token '%.40s' is not in the vocabulary", unk ? unk : "");
        return LLM_EFORMAT;
    }
    if ((rc = wpm_normalizer(t, json_object_get(root, "normalizer"), e, el))) return rc;
    json_t *pre = json_object_get(root, "pre_tokenizer");
    const char *pty = jtype(pre);
    if (pre && !json_is_null(pre) && (!pty || strcmp(pty, "BertPreTokenizer"))) {
        snprintf(e, el, "pre_tokenizer '%.40s' is not supported (BertPreTokenizer)", pty ? pty : "?");
        return LLM_EUNSUP;
    }
    return wpm_post(t, json_object_get(root, "post_processor"), e, el);
}

int cm_tok_from_hf_json_mem(const char *data, size_t len, cm_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    char e[300] = "";
    int rc;
    json_error_t je;
    cm_tokenizer *t = cm_tok_new();
    if (!t) return LLM_ENOMEM;
    json_t *root = json_loadb(data, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(root)) {
        snprintf(e, sizeof e, "not a JSON object%s%s", root ? "" : ": ", root ? "" : je.text);
        rc = LLM_EFORMAT;
        goto fail;
    }
    if ((rc = from_json(root, t, e, sizeof e))) goto fail;
    if ((rc = cm_tok_finish(t))) goto fail;
    json_decref(root);
    *out = t;
    return 0;
fail:
    if (err) snprintf(err, errlen, "%s", e);
    json_decref(root);
    cm_tok_free(t);
    return rc;
}

int cm_tok_from_hf_json(const char *path, cm_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    void *map;
    size_t size;
    char e[400] = "";
    int rc = cm_map_file(path, 2, &map, &size, e, sizeof e);
    if (!rc && size > (256u << 20)) {
        snprintf(e, sizeof e, "%zu bytes is more than a tokenizer.json may hold (256 MB)", size);
        rc = LLM_EFORMAT;
    }
    if (!rc) rc = cm_tok_from_hf_json_mem(map, size, out, e, sizeof e);
    if (map) munmap(map, size);
    if (rc && err) snprintf(err, errlen, "%s: %s", path, e);
    return rc;
}
