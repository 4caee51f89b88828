/* cm_tok_build.c - making tokenizers (GGUF, llama2.c, synthetic, an export)
 * and exporting them: see cm_tokenizer.h. */
#include "cm_tok_int.h"
#include "cm_error.h"
#include "cm_log.h"
#include "cm_unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- construction ------------------------------------------------------ */

int cm_tok_set_entry(cm_tokenizer *t, int32_t id, const char *s, size_t len) {
    t->text[id] = malloc(len + 1);
    if (!t->text[id]) return LLM_ENOMEM;
    memcpy(t->text[id], s, len);
    t->text[id][len] = 0;
    t->text_len[id] = (uint32_t)len;
    return 0;
}

int cm_tok_alloc_vocab(cm_tokenizer *t, int32_t n) {
    t->n_vocab = n;
    t->text = calloc((size_t)n, sizeof *t->text);
    t->text_len = calloc((size_t)n, sizeof *t->text_len);
    t->piece = calloc((size_t)n, sizeof *t->piece);
    t->piece_len = calloc((size_t)n, sizeof *t->piece_len);
    t->score = calloc((size_t)n, sizeof *t->score);
    t->type = calloc((size_t)n, sizeof *t->type);
    return t->text && t->text_len && t->piece && t->piece_len && t->score && t->type ? 0 : LLM_ENOMEM;
}

static int parse_byte_token(const char *s, size_t len) {
    if (len != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static int build_text_index(cm_tokenizer *t) {
    uint32_t cap = 1;
    while (cap < (uint32_t)t->n_vocab * 2) cap <<= 1;
    t->hmask = cap - 1;
    t->htab = malloc(sizeof(int32_t) * cap);
    if (!t->htab) return LLM_ENOMEM;
    memset(t->htab, 0xff, sizeof(int32_t) * cap);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (find_text(t, t->text[id], t->text_len[id]) >= 0) continue; /* first wins on duplicates */
        uint32_t h = (uint32_t)XXH3_64bits(t->text[id], t->text_len[id]) & t->hmask;
        while (t->htab[h] >= 0) h = (h + 1) & t->hmask;
        t->htab[h] = id;
    }
    return 0;
}

static int build_trie(cm_tokenizer *t) {
    size_t bytes = 1;
    for (int i = 0; i < t->n_specials; i++) bytes += t->text_len[t->specials[i]];
    uint64_t cap = 2;
    while (cap < bytes * 2) cap <<= 1;
    t->trie_mask = cap - 1;
    t->trie_key = calloc(cap, sizeof *t->trie_key);
    t->trie_child = malloc(sizeof(int32_t) * cap);
    t->trie_id = malloc(sizeof(int32_t) * bytes);
    if (!t->trie_key || !t->trie_child || !t->trie_id) return LLM_ENOMEM;
    t->trie_nodes = 1;
    t->trie_id[0] = -1;
    for (int i = t->n_specials - 1; i >= 0; i--) { /* shortest first: on equal texts the lower id wins below */
        int32_t id = t->specials[i], node = 0;
        for (uint32_t k = 0; k < t->text_len[id]; k++) {
            uint64_t key = ((uint64_t)node << 8 | (unsigned char)t->text[id][k]) + 1, h = trie_slot(t, key);
            if (!t->trie_key[h]) {
                t->trie_key[h] = key;
                t->trie_child[h] = t->trie_nodes;
                t->trie_id[t->trie_nodes++] = -1;
            }
            node = t->trie_child[h];
        }
        if (t->trie_id[node] < 0 || id < t->trie_id[node]) t->trie_id[node] = id;
    }
    return 0;
}

/* Decoded bytes of every token, byte tokens, specials, end-of-generation set. */
int cm_tok_finish(cm_tokenizer *t) {
    cm_tok_init_byte_map();
    int rc = build_text_index(t);
    if (rc) return rc;
    for (int i = 0; i < 256; i++) t->byte_tok[i] = -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = t->text[id];
        size_t len = t->text_len[id], o = 0;
        char *p = malloc(len + 1);
        if (!p) return LLM_ENOMEM;
        if (t->kind == CM_TOK_BPE && t->type[id] != CM_TT_CONTROL && t->type[id] != CM_TT_USER) {
            for (size_t i = 0; i < len;) {
                uint32_t cp;
                int n = cm_utf8_decode(s + i, len - i, &cp);
                if (cp < 512 && cm_tok_cp_byte[cp] >= 0) p[o++] = (char)cm_tok_cp_byte[cp];
                else { memcpy(p + o, s + i, (size_t)n); o += (size_t)n; }
                i += (size_t)n;
            }
        } else if ((t->kind == CM_TOK_SPM || t->kind == CM_TOK_UNI) && t->type[id] == CM_TT_BYTE &&
                   parse_byte_token(s, len) >= 0) {
            p[o++] = (char)parse_byte_token(s, len);
            t->byte_tok[(unsigned char)p[0]] = id;
        } else if (t->kind == CM_TOK_SPM || t->kind == CM_TOK_UNI) {
            for (size_t i = 0; i < len;) {
                if (i + 3 <= len && memcmp(s + i, SPM_SPACE, 3) == 0) { p[o++] = ' '; i += 3; }
                else p[o++] = s[i++];
            }
        } else if (t->kind == CM_TOK_WPM && t->type[id] == CM_TT_NORMAL) {
            /* "##ing" continues a word; any other piece starts one after a space */
            if (len >= t->wp_prefix_len && t->wp_prefix_len && !memcmp(s, t->wp_prefix, t->wp_prefix_len)) {
                memcpy(p, s + t->wp_prefix_len, len - t->wp_prefix_len);
                o = len - t->wp_prefix_len;
            } else {
                char *q = realloc(p, len + 2);
                if (!q) { free(p); return LLM_ENOMEM; }
                p = q;
                p[0] = ' ';
                memcpy(p + 1, s, len);
                o = len + 1;
            }
        } else {
            memcpy(p, s, len);
            o = len;
        }
        p[o] = 0;
        t->piece[id] = p;
        t->piece_len[id] = (uint32_t)o;
    }
    if (t->kind == CM_TOK_BPE) {
        for (int b = 0; b < 256; b++) {
            char u[4];
            int n = cm_utf8_encode(cm_tok_byte_cp[b], u);
            t->byte_tok[b] = find_text(t, u, (size_t)n);
        }
    }
    /* specials: control and user-defined tokens, longest first */
    t->specials = malloc(sizeof(int32_t) * (size_t)t->n_vocab);
    if (!t->specials) return LLM_ENOMEM;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if ((t->type[id] == CM_TT_CONTROL || t->type[id] == CM_TT_USER) && t->text_len[id] > 0)
            t->specials[t->n_specials++] = id;
    for (int i = 1; i < t->n_specials; i++) { /* insertion sort: few specials */
        int32_t v = t->specials[i];
        int j = i - 1;
        while (j >= 0 && t->text_len[t->specials[j]] < t->text_len[v]) { t->specials[j + 1] = t->specials[j]; j--; }
        t->specials[j + 1] = v;
    }
    if ((rc = build_trie(t))) return rc;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t l = t->piece_len[id] > t->text_len[id] ? t->piece_len[id] : t->text_len[id];
        if (l > t->max_token_bytes) t->max_token_bytes = l;
    }
    if (t->eos >= 0) t->eog[t->n_eog++] = t->eos;
    /* OpenAI's harmony (gpt-oss): a reply is several messages, each closed by <|end|>, the whole by <|return|>
     * (or <|call|> for a tool call); so <|end|> ends no generation here (as llama.cpp does), and the markers
     * that carry the structure are shown in the output text (user-defined, not control) for the chat
     * layer to split the channels (cm_harmony.h) */
    int32_t ch = find_text(t, "<|channel|>", 11), rt = find_text(t, "<|return|>", 10);
    int harmony = ch >= 0 && rt >= 0 && t->type[ch] == CM_TT_CONTROL && t->type[rt] == CM_TT_CONTROL;
    static const char *eog_names[] = {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>",
                                      "<end_of_turn>", "<|end|>", "<|eom_id|>", "<|return|>", "<|call|>"};
    for (size_t i = 0; i < sizeof eog_names / sizeof eog_names[0] && t->n_eog < 8; i++) {
        if (harmony && !strcmp(eog_names[i], "<|end|>")) continue;
        int32_t id = find_text(t, eog_names[i], strlen(eog_names[i]));
        if (id >= 0 && id != t->eos && t->type[id] == CM_TT_CONTROL) t->eog[t->n_eog++] = id;
    }
    static const char *shown[] = {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"};
    for (size_t i = 0; harmony && i < sizeof shown / sizeof shown[0]; i++) {
        int32_t id = find_text(t, shown[i], strlen(shown[i]));
        if (id >= 0 && t->type[id] == CM_TT_CONTROL) t->type[id] = CM_TT_USER;
    }
    return 0;
}

int cm_tok_merges_init(cm_tokenizer *t, uint64_t n) {
    uint64_t cap = 1;
    while (cap < n * 2 + 2) cap <<= 1;
    t->mmask = cap - 1;
    t->mkey = calloc(cap, sizeof *t->mkey);
    t->mrank = malloc(cap * sizeof *t->mrank);
    t->mres = malloc(cap * sizeof *t->mres);
    return t->mkey && t->mrank && t->mres ? 0 : LLM_ENOMEM;
}

void cm_tok_merge_add(cm_tokenizer *t, int32_t rank, const char *ls, size_t ll, const char *rs, size_t rl) {
    char buf[1024];
    if (ll + rl >= sizeof buf) return; /* malformed merge: skipped */
    int32_t l = find_text(t, ls, ll), r = find_text(t, rs, rl);
    memcpy(buf, ls, ll);
    memcpy(buf + ll, rs, rl);
    int32_t m = find_text(t, buf, ll + rl);
    if (l < 0 || r < 0 || m < 0 || find_merge(t, l, r) >= 0) return;
    uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
    uint64_t h = XXH3_64bits(&key, 8) & t->mmask;
    while (t->mkey[h]) h = (h + 1) & t->mmask;
    t->mkey[h] = key;
    t->mrank[h] = rank;
    t->mres[h] = m;
}

cm_tokenizer *cm_tok_new(void) {
    cm_tokenizer *t = calloc(1, sizeof *t);
    if (t) t->bos = t->eos = t->unk = -1;
    return t;
}

int cm_tok_from_gguf(const cm_gguf *g, cm_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    int rc = LLM_EFORMAT;
    cm_str model, pre, *toks = NULL, *merges = NULL;
    cm_tokenizer *t = cm_tok_new();
    if (!t) return LLM_ENOMEM;
    if (cm_gguf_get_str(g, "tokenizer.ggml.model", &model)) {
        snprintf(err, errlen, "tokenizer.ggml.model is missing: the file has no tokenizer");
        goto fail;
    }
    if (cm_str_eq(model, "gpt2")) t->kind = CM_TOK_BPE;
    else if (cm_str_eq(model, "llama")) t->kind = CM_TOK_SPM;
    else if (cm_str_eq(model, "wordpiece")) t->kind = CM_TOK_WPM;
    else if (cm_str_eq(model, "unigram")) t->kind = CM_TOK_UNI;
    else {
        snprintf(err, errlen, "tokenizer model '%.*s' is not supported (gpt2, llama, wordpiece, unigram)", (int)(model.len > 32 ? 32 : model.len), model.ptr);
        rc = LLM_EUNSUP;
        goto fail;
    }
    const cm_gguf_kv *kt = cm_gguf_find(g, "tokenizer.ggml.tokens");
    if (!kt || (rc = cm_gguf_arr_strings(kt, &toks))) {
        snprintf(err, errlen, "tokenizer.ggml.tokens is missing or not a string array");
        rc = LLM_EFORMAT;
        goto fail;
    }
    if (kt->v.arr.n == 0 || kt->v.arr.n > MAX_VOCAB) {
        snprintf(err, errlen, "vocabulary of %llu tokens is out of range", (unsigned long long)kt->v.arr.n);
        rc = LLM_EFORMAT;
        goto fail;
    }
    if ((rc = cm_tok_alloc_vocab(t, (int32_t)kt->v.arr.n))) goto fail;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if ((rc = cm_tok_set_entry(t, i, toks[i].ptr, toks[i].len))) goto fail;
    int at;
    uint64_t an;
    const void *ad;
    if (cm_gguf_get_arr(g, "tokenizer.ggml.token_type", &at, &an, &ad) == 0) {
        if (an != (uint64_t)t->n_vocab || (at != CM_GGUF_I32 && at != CM_GGUF_U32)) {
            snprintf(err, errlen, "tokenizer.ggml.token_type has %llu entries of type %d, expected %d int32",
                     (unsigned long long)an, at, t->n_vocab);
            rc = LLM_EFORMAT;
            goto fail;
        }
        for (int32_t i = 0; i < t->n_vocab; i++) memcpy(&t->type[i], (const char *)ad + 4 * i, 4);
    } else {
        for (int32_t i = 0; i < t->n_vocab; i++) t->type[i] = CM_TT_NORMAL;
    }
    if (cm_gguf_get_arr(g, "tokenizer.ggml.scores", &at, &an, &ad) == 0) {
        if (an != (uint64_t)t->n_vocab || at != CM_GGUF_F32) {
            snprintf(err, errlen, "tokenizer.ggml.scores has %llu entries, expected %d float32", (unsigned long long)an, t->n_vocab);
            rc = LLM_EFORMAT;
            goto fail;
        }
        memcpy(t->score, ad, sizeof(float) * (size_t)t->n_vocab);
    }
    uint32_t v;
    if (cm_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &v) == 0 && v < (uint32_t)t->n_vocab) t->bos = (int32_t)v;
    if (cm_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &v) == 0 && v < (uint32_t)t->n_vocab) t->eos = (int32_t)v;
    if (cm_gguf_get_u32(g, "tokenizer.ggml.unknown_token_id", &v) == 0 && v < (uint32_t)t->n_vocab) t->unk = (int32_t)v;
    t->add_bos = t->kind == CM_TOK_SPM || t->kind == CM_TOK_WPM;
    t->add_space_prefix = t->kind == CM_TOK_SPM;
    cm_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
    cm_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix);
    if (t->add_bos && t->bos < 0) t->add_bos = 0;
    if (t->kind == CM_TOK_UNI) {
        uint32_t u = 0;
        t->uni_split = 1;
        t->uni_prepend = 1;
        if (!cm_gguf_get_u32(g, "tokenizer.unigram.flags", &u)) {
            t->uni_split = (int)(u & 1), t->uni_prepend = (int)(u >> 1 & 3), t->uni_byte_fallback = (int)(u >> 3 & 1);
            t->add_eos = (int)(u >> 4 & 1);
        }
        t->add_space_prefix = 0;
        if (t->unk < 0) {
            snprintf(err, errlen, "a unigram tokenizer needs an unknown token");
            rc = LLM_EFORMAT;
            goto fail;
        }
    }
    if (t->kind == CM_TOK_WPM) {
        cm_str px = {"##", 2};
        t->wp_max_chars = 100;
        cm_gguf_get_u32(g, "tokenizer.wordpiece.flags", &t->wp_flags);
        cm_gguf_get_u32(g, "tokenizer.wordpiece.max_chars", &t->wp_max_chars);
        if (t->wp_max_chars == 0 || t->wp_max_chars > 10000 || t->unk < 0) {
            snprintf(err, errlen, "tokenizer.wordpiece.max_chars must be 1..10000, and an unknown token is needed");
            rc = LLM_EFORMAT;
            goto fail;
        }
        cm_gguf_get_str(g, "tokenizer.wordpiece.prefix", &px);
        if (px.len >= sizeof t->wp_prefix) {
            snprintf(err, errlen, "tokenizer.wordpiece.prefix is longer than %zu bytes", sizeof t->wp_prefix - 1);
            rc = LLM_EFORMAT;
            goto fail;
        }
        memcpy(t->wp_prefix, px.ptr, px.len);
        t->wp_prefix_len = (uint32_t)px.len;
        t->add_space_prefix = 0;
    }
    t->pre = CM_PRE_GPT2;
    if (t->kind == CM_TOK_BPE && cm_gguf_get_str(g, "tokenizer.ggml.pre", &pre) == 0) {
        if (cm_str_eq(pre, "llama-bpe") || cm_str_eq(pre, "llama3")) t->pre = CM_PRE_LLAMA3;
        else if (cm_str_eq(pre, "qwen2")) t->pre = CM_PRE_QWEN2;
        else if (cm_str_eq(pre, "smollm") || cm_str_eq(pre, "starcoder") || cm_str_eq(pre, "refact") ||
                 cm_str_eq(pre, "codeshell"))
            t->pre = CM_PRE_SMOLLM;
        else if (!cm_str_eq(pre, "gpt-2") && !cm_str_eq(pre, "gpt2") && !cm_str_eq(pre, "default"))
            CM_WARN("pre-tokenizer '%.*s' is not known; using GPT-2's", (int)(pre.len > 32 ? 32 : pre.len), pre.ptr);
    }
    if ((rc = cm_tok_finish(t))) goto fail;
    if (t->kind == CM_TOK_UNI) cm_tok_unigram_ready(t);
    if (t->kind == CM_TOK_BPE) {
        const cm_gguf_kv *km = cm_gguf_find(g, "tokenizer.ggml.merges");
        if (!km || (rc = cm_gguf_arr_strings(km, &merges))) {
            snprintf(err, errlen, "tokenizer.ggml.merges is missing or not a string array");
            rc = LLM_EFORMAT;
            goto fail;
        }
        if ((rc = cm_tok_merges_init(t, km->v.arr.n))) goto fail;
        for (uint64_t i = 0; i < km->v.arr.n; i++) {
            const char *s = merges[i].ptr, *sp = memchr(s, ' ', merges[i].len);
            if (sp) cm_tok_merge_add(t, (int32_t)i, s, (size_t)(sp - s), sp + 1, merges[i].len - (size_t)(sp - s) - 1);
        }
    }
    cm_str tmpl;
    if (cm_gguf_get_str(g, "tokenizer.chat_template", &tmpl) == 0) {
        t->chat_template = malloc(tmpl.len + 1);
        if (!t->chat_template) { rc = LLM_ENOMEM; goto fail; }
        memcpy(t->chat_template, tmpl.ptr, tmpl.len);
        t->chat_template[tmpl.len] = 0;
    }
    free(toks);
    free(merges);
    *out = t;
    return 0;
fail:
    free(toks);
    free(merges);
    cm_tok_free(t);
    return rc;
}

/* For models without a tokenizer (dummy weights): SentencePiece-style,
 * <unk> <s> </s>, the 256 byte tokens (any text encodes, byte by byte), the
 * word boundary U+2581, then placeholder pieces "<tok_N>" up to the
 * vocabulary size. */
int cm_tok_synthetic(uint32_t vocab, cm_tokenizer **out) {
    *out = NULL;
    if (vocab < 260 || vocab > MAX_VOCAB) return LLM_EINVAL;
    cm_tokenizer *t = cm_tok_new();
    int rc = t ? cm_tok_alloc_vocab(t, (int32_t)vocab) : LLM_ENOMEM;
    static const char *ctl[3] = {"<unk>", "<s>", "</s>"};
    for (uint32_t i = 0; i < vocab && !rc; i++) {
        char buf[32];
        if (i < 3) snprintf(buf, sizeof buf, "%s", ctl[i]);
        else if (i < 259) snprintf(buf, sizeof buf, "<0x%02X>", i - 3);
        else if (i == 259) snprintf(buf, sizeof buf, "%s", SPM_SPACE); /* the word boundary, so spaces decode */
        else snprintf(buf, sizeof buf, "<tok_%u>", i);
        rc = cm_tok_set_entry(t, (int32_t)i, buf, strlen(buf));
        t->type[i] = i == 0 ? CM_TT_UNKNOWN : i < 3 ? CM_TT_CONTROL : i < 259 ? CM_TT_BYTE : CM_TT_NORMAL;
        t->score[i] = -(float)i;
    }
    if (!rc) {
        t->kind = CM_TOK_SPM;
        t->unk = 0;
        t->bos = 1;
        t->eos = 2;
        t->add_bos = 1;
        rc = cm_tok_finish(t);
    }
    if (rc) {
        cm_tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int cm_tok_from_llama2c(const char *path, uint32_t vocab, cm_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    int rc = LLM_EFORMAT;
    cm_tokenizer *t = cm_tok_new();
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    if (!t) { rc = LLM_ENOMEM; goto fail; }
    if (!f) {
        snprintf(err, errlen, "%s: cannot open tokenizer", path);
        rc = LLM_EIO;
        goto fail;
    }
    if (vocab == 0 || vocab > MAX_VOCAB || (rc = cm_tok_alloc_vocab(t, (int32_t)vocab))) {
        snprintf(err, errlen, "%s: bad vocabulary size %u", path, vocab);
        rc = rc ? rc : LLM_EINVAL;
        goto fail;
    }
    int32_t maxlen;
    if (fread(&maxlen, 4, 1, f) != 1 || maxlen <= 0 || maxlen > 4096) {
        snprintf(err, errlen, "%s: not a llama2.c tokenizer (bad header)", path);
        rc = LLM_EFORMAT;
        goto fail;
    }
    buf = malloc((size_t)maxlen * 3 + 1);
    if (!buf) { rc = LLM_ENOMEM; goto fail; }
    for (uint32_t i = 0; i < vocab; i++) {
        int32_t len;
        if (fread(&t->score[i], 4, 1, f) != 1 || fread(&len, 4, 1, f) != 1 || len < 0 || len > maxlen ||
            fread(buf, 1, (size_t)len, f) != (size_t)len) {
            snprintf(err, errlen, "%s: tokenizer is truncated or corrupt at token %u of %u", path, i, vocab);
            rc = LLM_ETRUNC;
            goto fail;
        }
        /* pieces were exported with ' ' for SentencePiece's U+2581: restore it */
        char tmp[4096 * 3];
        size_t o = 0;
        for (int32_t j = 0; j < len; j++) {
            if (buf[j] == ' ') { memcpy(tmp + o, SPM_SPACE, 3); o += 3; }
            else tmp[o++] = buf[j];
        }
        if ((rc = cm_tok_set_entry(t, (int32_t)i, tmp, o))) goto fail;
        t->type[i] = i == 0 ? CM_TT_UNKNOWN : (i == 1 || i == 2) ? CM_TT_CONTROL
                     : parse_byte_token(tmp, o) >= 0 ? CM_TT_BYTE : CM_TT_NORMAL;
    }
    t->kind = CM_TOK_SPM;
    t->unk = 0;
    t->bos = vocab > 1 ? 1 : -1;
    t->eos = vocab > 2 ? 2 : -1;
    t->add_bos = t->bos >= 0;
    t->add_space_prefix = 1;
    if ((rc = cm_tok_finish(t))) goto fail;
    free(buf);
    fclose(f);
    *out = t;
    return 0;
fail:
    free(buf);
    if (f) fclose(f);
    cm_tok_free(t);
    return rc;
}

void cm_tok_free(cm_tokenizer *t) {
    if (!t) return;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->text) free(t->text[i]);
        if (t->piece) free(t->piece[i]);
    }
    free(t->text); free(t->text_len); free(t->piece); free(t->piece_len);
    free(t->score); free(t->type); free(t->htab);
    free(t->mkey); free(t->mrank); free(t->mres);
    free(t->specials); free(t->chat_template);
    free(t->trie_key); free(t->trie_child); free(t->trie_id);
    free(t);
}

/* ---- export: the tokenizer as a tensor-less GGUF ------------------------ */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} wbuf;

static void wput(wbuf *b, const void *d, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        uint8_t *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void wu32(wbuf *b, uint32_t v) { wput(b, &v, 4); }
static void wu64(wbuf *b, uint64_t v) { wput(b, &v, 8); }
static void wstr(wbuf *b, const char *s, size_t n) {
    wu64(b, n);
    wput(b, s, n);
}
static void wkey(wbuf *b, const char *k, uint32_t type) {
    wstr(b, k, strlen(k));
    wu32(b, type);
}

typedef struct {
    int32_t rank, l, r;
} merge_ent;

static int merge_cmp(const void *a, const void *b) {
    const merge_ent *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static const char *pre_name(int pre) {
    switch (pre) {
    case CM_PRE_LLAMA3: return "llama-bpe";
    case CM_PRE_QWEN2: return "qwen2";
    case CM_PRE_SMOLLM: return "smollm";
    default: return "gpt2";
    }
}

int cm_tok_export(const cm_tokenizer *t, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    merge_ent *m = NULL;
    size_t nm = 0;
    if (t->kind == CM_TOK_BPE && t->mkey) {
        m = malloc(sizeof *m * (t->mmask + 1));
        if (!m) return LLM_ENOMEM;
        for (uint64_t h = 0; h <= t->mmask; h++)
            if (t->mkey[h]) {
                uint64_t k = t->mkey[h] - 1;
                m[nm++] = (merge_ent){t->mrank[h], (int32_t)(k >> 32), (int32_t)(uint32_t)k};
            }
        qsort(m, nm, sizeof *m, merge_cmp);
    }
    wbuf b = {0};
    uint64_t nkv = 8 + (t->kind == CM_TOK_BPE ? 2 : 0) + (t->kind == CM_TOK_WPM ? 3 : 0) + (t->kind == CM_TOK_UNI) + (t->bos >= 0) + (t->eos >= 0) + (t->unk >= 0) +
                   (t->chat_template != NULL);
    wput(&b, "GGUF", 4);
    wu32(&b, 3);
    wu64(&b, 0);   /* tensors */
    wu64(&b, nkv);
    const char *model = t->kind == CM_TOK_BPE   ? "gpt2"
                        : t->kind == CM_TOK_WPM ? "wordpiece"
                        : t->kind == CM_TOK_UNI ? "unigram"
                                                : "llama";
    wkey(&b, "tokenizer.ggml.model", CM_GGUF_STRING);
    wstr(&b, model, strlen(model));
    wkey(&b, "tokenizer.ggml.tokens", CM_GGUF_ARRAY);
    wu32(&b, CM_GGUF_STRING);
    wu64(&b, (uint64_t)t->n_vocab);
    for (int32_t i = 0; i < t->n_vocab; i++) wstr(&b, t->text[i], t->text_len[i]);
    wkey(&b, "tokenizer.ggml.token_type", CM_GGUF_ARRAY);
    wu32(&b, CM_GGUF_I32);
    wu64(&b, (uint64_t)t->n_vocab);
    wput(&b, t->type, sizeof(int32_t) * (size_t)t->n_vocab);
    wkey(&b, "tokenizer.ggml.scores", CM_GGUF_ARRAY);
    wu32(&b, CM_GGUF_F32);
    wu64(&b, (uint64_t)t->n_vocab);
    wput(&b, t->score, sizeof(float) * (size_t)t->n_vocab);
    uint8_t v8;
    wkey(&b, "tokenizer.ggml.add_bos_token", CM_GGUF_BOOL);
    v8 = (uint8_t)(t->add_bos != 0);
    wput(&b, &v8, 1);
    wkey(&b, "tokenizer.ggml.add_space_prefix", CM_GGUF_BOOL);
    v8 = (uint8_t)(t->add_space_prefix != 0);
    wput(&b, &v8, 1);
    /* what cm_tok_from_gguf cannot infer for tokenizers of other origins */
    wkey(&b, "general.architecture", CM_GGUF_STRING);
    wstr(&b, "tokenizer", 9);
    wkey(&b, "general.alignment", CM_GGUF_U32);
    wu32(&b, 32);
    if (t->kind == CM_TOK_BPE) {
        const char *pre = pre_name(t->pre);
        wkey(&b, "tokenizer.ggml.pre", CM_GGUF_STRING);
        wstr(&b, pre, strlen(pre));
        wkey(&b, "tokenizer.ggml.merges", CM_GGUF_ARRAY);
        wu32(&b, CM_GGUF_STRING);
        wu64(&b, nm);
        for (size_t i = 0; i < nm; i++) {
            uint32_t ll = t->text_len[m[i].l], rl = t->text_len[m[i].r];
            wu64(&b, (uint64_t)ll + 1 + rl);
            wput(&b, t->text[m[i].l], ll);
            wput(&b, " ", 1);
            wput(&b, t->text[m[i].r], rl);
        }
    }
    if (t->kind == CM_TOK_UNI) {
        wkey(&b, "tokenizer.unigram.flags", CM_GGUF_U32);
        wu32(&b, (uint32_t)(t->uni_split | t->uni_prepend << 1 | t->uni_byte_fallback << 3 | t->add_eos << 4));
    }
    if (t->kind == CM_TOK_WPM) {
        wkey(&b, "tokenizer.wordpiece.flags", CM_GGUF_U32);
        wu32(&b, t->wp_flags);
        wkey(&b, "tokenizer.wordpiece.max_chars", CM_GGUF_U32);
        wu32(&b, t->wp_max_chars);
        wkey(&b, "tokenizer.wordpiece.prefix", CM_GGUF_STRING);
        wstr(&b, t->wp_prefix, t->wp_prefix_len);
    }
    if (t->bos >= 0) { wkey(&b, "tokenizer.ggml.bos_token_id", CM_GGUF_U32); wu32(&b, (uint32_t)t->bos); }
    if (t->eos >= 0) { wkey(&b, "tokenizer.ggml.eos_token_id", CM_GGUF_U32); wu32(&b, (uint32_t)t->eos); }
    if (t->unk >= 0) { wkey(&b, "tokenizer.ggml.unknown_token_id", CM_GGUF_U32); wu32(&b, (uint32_t)t->unk); }
    if (t->chat_template) {
        wkey(&b, "tokenizer.chat_template", CM_GGUF_STRING);
        wstr(&b, t->chat_template, strlen(t->chat_template));
    }
    free(m);
    if (b.oom) {
        free(b.p);
        return LLM_ENOMEM;
    }
    *out = b.p;
    *len = b.n;
    return 0;
}

int cm_tok_import(const void *data, size_t len, cm_tokenizer **out, char *err, size_t errlen) {
    cm_gguf *g = NULL;
    *out = NULL;
    int rc = cm_gguf_open_mem(data, len, &g, err, errlen);
    if (!rc) rc = cm_tok_from_gguf(g, out, err, errlen); /* copies what it keeps */
    cm_gguf_close(g);
    return rc;
}

uint64_t cm_tok_fingerprint(const cm_tokenizer *t) {
    uint8_t *b;
    size_t n;
    if (cm_tok_export(t, &b, &n)) return 0;
    uint64_t h = XXH3_64bits(b, n);
    free(b);
    return h ? h : 1;
}

uint32_t cm_tok_max_token_bytes(const cm_tokenizer *t) { return t->max_token_bytes; }
