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
#include <sys/stat.h>

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

static const char *const LLAMA3_RE = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
                                     "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const QWEN2_RE = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}"
                                    "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int byte_level(json_t *p, int use_regex) {
    const char *ty = jtype(p);
    json_t *ur = json_object_get(p, "use_regex");
    return ty && !strcmp(ty, "ByteLevel") && !json_is_true(json_object_get(p, "add_prefix_space")) &&
           (ur ? json_is_true(ur) : 1) == use_regex;
}

/* The byte-level pre-tokenizers our encoder implements, as tokenizer.json
 * spells them: GPT-2's (ByteLevel with its regex), StarCoder / SmolLM's
 * (single digits, then GPT-2's), Llama 3's and Qwen2's (a Split by their
 * regex, then ByteLevel without one). -1: anything else. */
static int bpe_pre(json_t *pre) {
    if (byte_level(pre, 1)) return CM_PRE_GPT2;
    const char *ty = jtype(pre);
    json_t *seq = json_object_get(pre, "pretokenizers");
    if (!ty || strcmp(ty, "Sequence") || json_array_size(seq) != 2) return -1;
    json_t *a = json_array_get(seq, 0), *b = json_array_get(seq, 1);
    const char *at = jtype(a);
    if (at && !strcmp(at, "Digits") && json_is_true(json_object_get(a, "individual_digits")) && byte_level(b, 1))
        return CM_PRE_SMOLLM;
    const char *re = json_string_value(json_object_get(json_object_get(a, "pattern"), "Regex"));
    const char *beh = json_string_value(json_object_get(a, "behavior"));
    if (!at || strcmp(at, "Split") || !re || !beh || strcmp(beh, "Isolated") || json_is_true(json_object_get(a, "invert")) ||
        !byte_level(b, 0))
        return -1;
    return !strcmp(re, LLAMA3_RE) ? CM_PRE_LLAMA3 : !strcmp(re, QWEN2_RE) ? CM_PRE_QWEN2 : -1;
}

/* A token named in tokenizer_config.json: a string or {"content": ...}. */
static const char *config_token(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    return json_is_string(v) ? json_string_value(v) : json_string_value(json_object_get(v, "content"));
}

/* Byte-level BPE (GPT-2, SmolLM, Llama 3, Qwen2): vocabulary, merges by rank,
 * the added tokens, BOS from the post-processor or the config, EOS and the
 * chat template from the config. */
static int from_json_bpe(json_t *root, json_t *cfg, cm_tokenizer *t, char *e, size_t el) {
    json_t *model = json_object_get(root, "model"), *v;
    t->kind = CM_TOK_BPE;
    static const char *const unsupported[] = {"byte_fallback", "ignore_merges", "fuse_unk", NULL};
    for (const char *const *k = unsupported; *k; k++)
        if (json_is_true(json_object_get(model, *k))) {
            snprintf(e, el, "BPE model option %s is not supported", *k);
            return LLM_EUNSUP;
        }
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix", NULL};
    for (const char *const *k = affixes; *k; k++)
        if ((v = json_object_get(model, *k)) && !json_is_null(v) && (!json_is_string(v) || json_string_length(v))) {
            snprintf(e, el, "BPE model option %s is not supported", *k);
            return LLM_EUNSUP;
        }
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) {
        snprintf(e, el, "a BPE normalizer ('%.40s') is not supported", jtype(norm) ? jtype(norm) : "?");
        return LLM_EUNSUP;
    }
    if ((t->pre = bpe_pre(json_object_get(root, "pre_tokenizer"))) < 0) {
        snprintf(e, el, "pre_tokenizer is not one of the byte-level ones supported (GPT-2, SmolLM/StarCoder digits, "
                        "Llama 3 and Qwen2 splits)");
        return LLM_EUNSUP;
    }
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges"), *added = json_object_get(root, "added_tokens");
    size_t nv = json_object_size(vocab), na = json_array_size(added);
    if (!json_is_object(vocab) || nv == 0 || nv + na > MAX_VOCAB || !json_is_array(merges)) {
        snprintf(e, el, "model.vocab must be an object of 1 to %d tokens and model.merges a list", MAX_VOCAB);
        return LLM_EFORMAT;
    }
    /* the added tokens may lie past the vocabulary: ids 0..max over both */
    json_int_t top = (json_int_t)nv - 1;
    size_t i;
    json_t *at;
    json_array_foreach(added, i, at) {
        json_t *idv = json_object_get(at, "id");
        if (json_is_integer(idv) && json_integer_value(idv) > top) top = json_integer_value(idv);
    }
    if (top >= (json_int_t)(nv + na)) {
        snprintf(e, el, "token ids go up to %lld, past the %zu tokens the file has", (long long)top, nv + na);
        return LLM_EFORMAT;
    }
    int rc = cm_tok_alloc_vocab(t, (int32_t)(top + 1));
    if (rc) return rc;
    const char *k;
    json_object_foreach(vocab, k, v) {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id > top || t->text[id]) {
            snprintf(e, el, "model.vocab: token '%.40s' has id %lld (ids must be unique and dense)", k, (long long)id);
            return LLM_EFORMAT;
        }
        if ((rc = cm_tok_set_entry(t, (int32_t)id, k, strlen(k)))) return rc;
        t->type[id] = CM_TT_NORMAL;
    }
    json_array_foreach(added, i, at) {
        json_t *idv = json_object_get(at, "id");
        const char *c = json_string_value(json_object_get(at, "content"));
        json_int_t id = json_is_integer(idv) ? json_integer_value(idv) : -1;
        if (!c || id < 0 || id > top || (t->text[id] && strcmp(t->text[id], c))) {
            snprintf(e, el, "added_tokens[%zu] is not a token with a free or matching id", i);
            return LLM_EFORMAT;
        }
        if (!t->text[id] && (rc = cm_tok_set_entry(t, (int32_t)id, c, strlen(c)))) return rc;
        t->type[id] = json_is_true(json_object_get(at, "special")) ? CM_TT_CONTROL : CM_TT_USER;
    }
    for (json_int_t id = 0; id <= top; id++)
        if (!t->text[id]) {
            snprintf(e, el, "token id %lld is in neither model.vocab nor added_tokens", (long long)id);
            return LLM_EFORMAT;
        }
    /* BOS and EOS: the post-processor's template, else the config */
    json_t *post = json_object_get(root, "post_processor");
    const char *pty = jtype(post), *bos = config_token(cfg, "bos_token"), *eos = config_token(cfg, "eos_token");
    t->add_bos = json_is_true(json_object_get(cfg, "add_bos_token"));
    if (pty && !strcmp(pty, "TemplateProcessing")) {
        json_t *single = json_object_get(post, "single"), *sa = json_object_get(json_array_get(single, 0), "SpecialToken");
        json_t *seq = json_object_get(json_array_get(single, 1), "Sequence");
        if (json_array_size(single) != 2 || !sa || !seq) {
            snprintf(e, el, "post_processor TemplateProcessing: only [BOS] $A is supported for BPE");
            return LLM_EUNSUP;
        }
        bos = json_string_value(json_object_get(sa, "id"));
        t->add_bos = 1;
    } else if (post && !json_is_null(post) && (!pty || strcmp(pty, "ByteLevel"))) {
        snprintf(e, el, "post_processor '%.40s' is not supported (ByteLevel, TemplateProcessing)", pty ? pty : "?");
        return LLM_EUNSUP;
    }
    t->bos = lookup(t, bos);
    t->eos = lookup(t, eos);
    if (t->add_bos && t->bos < 0) {
        snprintf(e, el, "a BOS token is to be added but is not in the vocabulary");
        return LLM_EFORMAT;
    }
    const char *tmpl = json_string_value(json_object_get(cfg, "chat_template"));
    if (tmpl && !(t->chat_template = strdup(tmpl))) return LLM_ENOMEM;
    return 0;
}

/* Unigram (SentencePiece models converted to tokenizer.json: T5, ALBERT,
 * XLM-R shapes): [piece, log probability] pairs, unk_id, byte fallback; the
 * Metaspace pre-tokenizer; no normalizer (a Precompiled or NFKC one is
 * refused: its tables are not implemented); a template adding a special
 * token before and / or after the text. */
static int from_json_unigram(json_t *root, cm_tokenizer *t, char *e, size_t el) {
    json_t *model = json_object_get(root, "model");
    t->kind = CM_TOK_UNI;
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) {
        snprintf(e, el, "a Unigram normalizer ('%.40s') is not supported", jtype(norm) ? jtype(norm) : "?");
        return LLM_EUNSUP;
    }
    json_t *pre = json_object_get(root, "pre_tokenizer");
    const char *pty = jtype(pre), *rep = json_string_value(json_object_get(pre, "replacement"));
    const char *scheme = json_string_value(json_object_get(pre, "prepend_scheme"));
    json_t *split = json_object_get(pre, "split"), *aps = json_object_get(pre, "add_prefix_space");
    if (!pty || strcmp(pty, "Metaspace") || !rep || strcmp(rep, SPM_SPACE)) {
        snprintf(e, el, "a Unigram pre_tokenizer must be Metaspace with U+2581 ('%.40s' is not supported)", pty ? pty : "?");
        return LLM_EUNSUP;
    }
    t->uni_split = split ? json_is_true(split) : 1;
    t->uni_prepend = scheme ? (!strcmp(scheme, "always") ? 1 : !strcmp(scheme, "first") ? 2 : 0) : aps && !json_is_true(aps) ? 0 : 1;
    if (scheme && strcmp(scheme, "always") && strcmp(scheme, "first") && strcmp(scheme, "never")) {
        snprintf(e, el, "Metaspace prepend_scheme '%.20s' is not one of always, first, never", scheme);
        return LLM_EUNSUP;
    }
    t->uni_byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    json_t *vocab = json_object_get(model, "vocab"), *unk = json_object_get(model, "unk_id");
    size_t nv = json_array_size(vocab);
    if (!json_is_array(vocab) || nv == 0 || nv > MAX_VOCAB || !json_is_integer(unk) || json_integer_value(unk) < 0 ||
        json_integer_value(unk) >= (json_int_t)nv) {
        snprintf(e, el, "model.vocab must be a list of 1 to %d [piece, score] pairs and model.unk_id one of them",
                 MAX_VOCAB);
        return LLM_EFORMAT;
    }
    int rc = cm_tok_alloc_vocab(t, (int32_t)nv);
    if (rc) return rc;
    size_t i;
    json_t *v;
    json_array_foreach(vocab, i, v) {
        json_t *pc = json_array_get(v, 0), *sc = json_array_get(v, 1);
        if (json_array_size(v) != 2 || !json_is_string(pc) || !json_is_number(sc)) {
            snprintf(e, el, "model.vocab[%zu] is not [piece, score]", i);
            return LLM_EFORMAT;
        }
        if ((rc = cm_tok_set_entry(t, (int32_t)i, json_string_value(pc), json_string_length(pc)))) return rc;
        t->score[i] = (float)json_number_value(sc);
        const char *p = json_string_value(pc);
        t->type[i] = strlen(p) == 6 && !strncmp(p, "<0x", 3) && p[5] == '>' ? CM_TT_BYTE : CM_TT_NORMAL;
    }
    t->unk = (int32_t)json_integer_value(unk);
    t->type[t->unk] = CM_TT_UNKNOWN;
    json_t *at;
    json_array_foreach(json_object_get(root, "added_tokens"), i, at) {
        json_t *idv = json_object_get(at, "id");
        const char *c = json_string_value(json_object_get(at, "content"));
        json_int_t id = json_is_integer(idv) ? json_integer_value(idv) : -1;
        if (!c || id < 0 || id >= (json_int_t)nv || strcmp(t->text[id], c)) {
            snprintf(e, el, "added_tokens[%zu] is not a token of the vocabulary with its id", i);
            return LLM_EFORMAT;
        }
        if (id != t->unk) t->type[id] = json_is_true(json_object_get(at, "special")) ? CM_TT_CONTROL : CM_TT_USER;
    }
    json_t *post = json_object_get(root, "post_processor");
    const char *ppt = jtype(post);
    if (post && !json_is_null(post)) {
        json_t *single = json_object_get(post, "single");
        size_t ns = json_array_size(single);
        if (!ppt || strcmp(ppt, "TemplateProcessing") || ns < 1 || ns > 3) {
            snprintf(e, el, "post_processor '%.40s' is not supported for Unigram (TemplateProcessing)", ppt ? ppt : "?");
            return LLM_EUNSUP;
        }
        int seen_a = 0;
        for (size_t k = 0; k < ns; k++) {
            json_t *it = json_array_get(single, k), *sp = json_object_get(it, "SpecialToken");
            if (json_object_get(it, "Sequence")) {
                seen_a = 1;
                continue;
            }
            int32_t id = lookup(t, json_string_value(json_object_get(sp, "id")));
            if (id < 0) {
                snprintf(e, el, "post_processor names a token that is not in the vocabulary");
                return LLM_EFORMAT;
            }
            if (seen_a) t->eos = id, t->add_eos = 1;
            else t->bos = id, t->add_bos = 1;
        }
        if (t->add_eos && !t->add_bos) t->add_bos = 1; /* encoding "with specials" adds the EOS */
    }
    return 0;
}

/* After cm_tok_finish: the merges, "a b" strings or ["a", "b"] pairs. */
static int bpe_merges(json_t *root, cm_tokenizer *t, char *e, size_t el) {
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges"), *m;
    int rc = cm_tok_merges_init(t, json_array_size(merges));
    if (rc) return rc;
    size_t i;
    json_array_foreach(merges, i, m) {
        if (json_is_string(m)) {
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (sp) cm_tok_merge_add(t, (int32_t)i, s, (size_t)(sp - s), sp + 1, strlen(sp + 1));
        } else if (json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
            cm_tok_merge_add(t, (int32_t)i, json_string_value(a), json_string_length(a), json_string_value(b),
                             json_string_length(b));
        } else {
            snprintf(e, el, "model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", i);
            return LLM_EFORMAT;
        }
    }
    return 0;
}

static int from_json(json_t *root, json_t *cfg, cm_tokenizer *t, char *e, size_t el) {
    json_t *model = json_object_get(root, "model");
    const char *mty = jtype(model);
    if (!mty && json_object_get(model, "continuing_subword_prefix") && json_object_get(model, "max_input_chars_per_word"))
        mty = "WordPiece"; /* older files leave the type out */
    if (!mty && json_object_get(model, "merges")) mty = "BPE";
    if (mty && !strcmp(mty, "BPE")) return from_json_bpe(root, cfg, t, e, el);
    if (mty && !strcmp(mty, "Unigram")) return from_json_unigram(root, t, e, el);
    if (!mty || strcmp(mty, "WordPiece")) {
        snprintf(e, el, "model '%.40s' is not supported (WordPiece, byte-level BPE, Unigram)", mty ? mty : "?");
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

/* The tokenizer from tokenizer.json's bytes and tokenizer_config.json's
 * (cfg_len 0: none). */
static int from_mem(const char *data, size_t len, const char *cfg_data, size_t cfg_len, cm_tokenizer **out, char *err,
                    size_t errlen) {
    *out = NULL;
    char e[300] = "";
    int rc;
    json_error_t je;
    json_t *cfg = NULL;
    cm_tokenizer *t = cm_tok_new();
    if (!t) return LLM_ENOMEM;
    json_t *root = json_loadb(data, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(root)) {
        snprintf(e, sizeof e, "not a JSON object%s%s", root ? "" : ": ", root ? "" : je.text);
        rc = LLM_EFORMAT;
        goto fail;
    }
    if (cfg_len) cfg = json_loadb(cfg_data, cfg_len, JSON_REJECT_DUPLICATES, &je); /* json_is_object is a macro */
    if (cfg_len && !json_is_object(cfg)) {
        snprintf(e, sizeof e, "tokenizer_config.json is not a JSON object");
        rc = LLM_EFORMAT;
        goto fail;
    }
    if ((rc = from_json(root, cfg, t, e, sizeof e))) goto fail;
    if ((rc = cm_tok_finish(t))) goto fail;
    if (t->kind == CM_TOK_BPE && (rc = bpe_merges(root, t, e, sizeof e))) goto fail;
    if (t->kind == CM_TOK_UNI) cm_tok_unigram_ready(t);
    json_decref(root);
    json_decref(cfg);
    *out = t;
    return 0;
fail:
    if (err) snprintf(err, errlen, "%s", e);
    json_decref(root);
    json_decref(cfg);
    cm_tok_free(t);
    return rc;
}

int cm_tok_from_hf_json_mem(const char *data, size_t len, cm_tokenizer **out, char *err, size_t errlen) {
    return from_mem(data, len, NULL, 0, out, err, errlen);
}

static int map_json(const char *path, void **map, size_t *size, char *e, size_t el) {
    int rc = cm_map_file(path, 2, map, size, e, el);
    if (!rc && *size > (256u << 20)) {
        snprintf(e, el, "%zu bytes is more than a tokenizer file may hold (256 MB)", *size);
        munmap(*map, *size);
        *map = NULL;
        rc = LLM_EFORMAT;
    }
    return rc;
}

int cm_tok_from_hf_json(const char *path, cm_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    void *map = NULL;
    size_t size = 0;
    char e[400] = "";
    int rc = map_json(path, &map, &size, e, sizeof e);
    if (!rc) rc = from_mem(map, size, NULL, 0, out, e, sizeof e);
    if (map) munmap(map, size);
    if (rc && err) snprintf(err, errlen, "%s: %s", path, e);
    return rc;
}

int cm_tok_from_hf_dir(const char *dir, cm_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    char p[1024], pc[1024], e[400] = "";
    void *map = NULL, *cmap = NULL;
    size_t size = 0, csize = 0;
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    snprintf(pc, sizeof pc, "%s/tokenizer_config.json", dir);
    struct stat st;
    int rc = map_json(p, &map, &size, e, sizeof e);
    if (!rc && stat(pc, &st) == 0 && (rc = map_json(pc, &cmap, &csize, e, sizeof e)))
        snprintf(p, sizeof p, "%s", pc); /* the error is the config's */
    if (!rc) rc = from_mem(map, size, cmap, csize, out, e, sizeof e);
    if (map) munmap(map, size);
    if (cmap) munmap(cmap, csize);
    if (rc && err) snprintf(err, errlen, "%s: %s", p, e);
    return rc;
}
