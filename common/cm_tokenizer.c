#include "cm_tokenizer.h"
#include "cm_error.h"
#include "cm_log.h"
#include "cm_unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define MAX_VOCAB (1 << 22)
#define SPM_SPACE "\xe2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */

struct cm_tokenizer {
    int kind, pre;
    int32_t n_vocab;
    char **text;          /* vocab entry as stored */
    uint32_t *text_len;
    char **piece;         /* the bytes it decodes to */
    uint32_t *piece_len;
    float *score;
    int *type;
    uint32_t hmask;
    int32_t *htab;        /* open addressing: text -> id */
    uint64_t mmask;
    uint64_t *mkey;       /* (left << 32 | right) + 1; 0 = empty */
    int32_t *mrank, *mres;
    int32_t bos, eos, unk;
    int32_t eog[8];
    int n_eog;
    int add_bos, add_space_prefix;
    int32_t byte_tok[256];
    int32_t *specials;    /* control and user-defined ids, longest first */
    int n_specials;
    /* Trie over the specials' texts: node 0 is the root; (node << 8 | byte) + 1
     * keys an open-addressing table of child nodes. A match walks at most the
     * longest special's length, so splitting specials out is linear in the text. */
    uint64_t *trie_key;
    int32_t *trie_child, *trie_id; /* child node per key; token ending at each node (-1) */
    uint64_t trie_mask;
    int32_t trie_nodes;
    uint32_t max_token_bytes;      /* longest text any one token stands for */
    char *chat_template;
};

/* ---- byte-level mapping (GPT-2 bytes_to_unicode) ------------------------ */

static uint32_t byte_cp[256];
static int16_t cp_byte[512];

static void init_byte_map(void) {
    static int done;
    if (done) return;
    int n = 0;
    for (int i = 0; i < 512; i++) cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        byte_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        cp_byte[byte_cp[b]] = (int16_t)b;
    }
    done = 1;
}

/* ---- hash tables ------------------------------------------------------ */

static int32_t find_text(const cm_tokenizer *t, const char *s, size_t len) {
    uint32_t h = (uint32_t)XXH3_64bits(s, len) & t->hmask;
    for (;;) {
        int32_t id = t->htab[h];
        if (id < 0) return -1;
        if (t->text_len[id] == len && memcmp(t->text[id], s, len) == 0) return id;
        h = (h + 1) & t->hmask;
    }
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

static int64_t find_merge(const cm_tokenizer *t, int32_t l, int32_t r) {
    uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
    uint64_t h = XXH3_64bits(&key, 8) & t->mmask;
    while (t->mkey[h]) {
        if (t->mkey[h] == key) return (int64_t)h;
        h = (h + 1) & t->mmask;
    }
    return -1;
}

/* ---- construction ------------------------------------------------------ */

static int set_entry(cm_tokenizer *t, int32_t id, const char *s, size_t len) {
    t->text[id] = malloc(len + 1);
    if (!t->text[id]) return LLM_ENOMEM;
    memcpy(t->text[id], s, len);
    t->text[id][len] = 0;
    t->text_len[id] = (uint32_t)len;
    return 0;
}

static int alloc_vocab(cm_tokenizer *t, int32_t n) {
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

static uint64_t trie_slot(const cm_tokenizer *t, uint64_t key) {
    uint64_t h = XXH3_64bits(&key, 8) & t->trie_mask;
    while (t->trie_key[h] && t->trie_key[h] != key) h = (h + 1) & t->trie_mask;
    return h;
}

static int32_t trie_next(const cm_tokenizer *t, int32_t node, unsigned char c) {
    uint64_t h = trie_slot(t, ((uint64_t)node << 8 | c) + 1);
    return t->trie_key[h] ? t->trie_child[h] : -1;
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
static int finish(cm_tokenizer *t) {
    init_byte_map();
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
                if (cp < 512 && cp_byte[cp] >= 0) p[o++] = (char)cp_byte[cp];
                else { memcpy(p + o, s + i, (size_t)n); o += (size_t)n; }
                i += (size_t)n;
            }
        } else if (t->kind == CM_TOK_SPM && t->type[id] == CM_TT_BYTE && parse_byte_token(s, len) >= 0) {
            p[o++] = (char)parse_byte_token(s, len);
            t->byte_tok[(unsigned char)p[0]] = id;
        } else if (t->kind == CM_TOK_SPM) {
            for (size_t i = 0; i < len;) {
                if (i + 3 <= len && memcmp(s + i, SPM_SPACE, 3) == 0) { p[o++] = ' '; i += 3; }
                else p[o++] = s[i++];
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
            int n = cm_utf8_encode(byte_cp[b], u);
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
    static const char *eog_names[] = {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>",
                                      "<end_of_turn>", "<|end|>", "<|eom_id|>"};
    for (size_t i = 0; i < sizeof eog_names / sizeof eog_names[0] && t->n_eog < 8; i++) {
        int32_t id = find_text(t, eog_names[i], strlen(eog_names[i]));
        if (id >= 0 && id != t->eos && t->type[id] == CM_TT_CONTROL) t->eog[t->n_eog++] = id;
    }
    return 0;
}

static cm_tokenizer *tok_new(void) {
    cm_tokenizer *t = calloc(1, sizeof *t);
    if (t) t->bos = t->eos = t->unk = -1;
    return t;
}

int cm_tok_from_gguf(const cm_gguf *g, cm_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    int rc = LLM_EFORMAT;
    cm_str model, pre, *toks = NULL, *merges = NULL;
    cm_tokenizer *t = tok_new();
    if (!t) return LLM_ENOMEM;
    if (cm_gguf_get_str(g, "tokenizer.ggml.model", &model)) {
        snprintf(err, errlen, "tokenizer.ggml.model is missing: the file has no tokenizer");
        goto fail;
    }
    if (cm_str_eq(model, "gpt2")) t->kind = CM_TOK_BPE;
    else if (cm_str_eq(model, "llama")) t->kind = CM_TOK_SPM;
    else {
        snprintf(err, errlen, "tokenizer model '%.*s' is not supported (gpt2, llama)", (int)(model.len > 32 ? 32 : model.len), model.ptr);
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
    if ((rc = alloc_vocab(t, (int32_t)kt->v.arr.n))) goto fail;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if ((rc = set_entry(t, i, toks[i].ptr, toks[i].len))) goto fail;
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
    t->add_bos = t->kind == CM_TOK_SPM;
    t->add_space_prefix = t->kind == CM_TOK_SPM;
    cm_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
    cm_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix);
    if (t->add_bos && t->bos < 0) t->add_bos = 0;
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
    if ((rc = finish(t))) goto fail;
    if (t->kind == CM_TOK_BPE) {
        const cm_gguf_kv *km = cm_gguf_find(g, "tokenizer.ggml.merges");
        if (!km || (rc = cm_gguf_arr_strings(km, &merges))) {
            snprintf(err, errlen, "tokenizer.ggml.merges is missing or not a string array");
            rc = LLM_EFORMAT;
            goto fail;
        }
        uint64_t nm = km->v.arr.n, cap = 1;
        while (cap < nm * 2 + 2) cap <<= 1;
        t->mmask = cap - 1;
        t->mkey = calloc(cap, sizeof *t->mkey);
        t->mrank = malloc(cap * sizeof *t->mrank);
        t->mres = malloc(cap * sizeof *t->mres);
        if (!t->mkey || !t->mrank || !t->mres) { rc = LLM_ENOMEM; goto fail; }
        char buf[1024];
        for (uint64_t i = 0; i < nm; i++) {
            const char *s = merges[i].ptr, *sp = memchr(s, ' ', merges[i].len);
            if (!sp || merges[i].len >= sizeof buf) continue; /* malformed merge: skip */
            size_t ll = (size_t)(sp - s), rl = merges[i].len - ll - 1;
            int32_t l = find_text(t, s, ll), r = find_text(t, sp + 1, rl);
            memcpy(buf, s, ll);
            memcpy(buf + ll, sp + 1, rl);
            int32_t m = find_text(t, buf, ll + rl);
            if (l < 0 || r < 0 || m < 0 || find_merge(t, l, r) >= 0) continue;
            uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
            uint64_t h = XXH3_64bits(&key, 8) & t->mmask;
            while (t->mkey[h]) h = (h + 1) & t->mmask;
            t->mkey[h] = key;
            t->mrank[h] = (int32_t)i;
            t->mres[h] = m;
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
    cm_tokenizer *t = tok_new();
    int rc = t ? alloc_vocab(t, (int32_t)vocab) : LLM_ENOMEM;
    static const char *ctl[3] = {"<unk>", "<s>", "</s>"};
    for (uint32_t i = 0; i < vocab && !rc; i++) {
        char buf[32];
        if (i < 3) snprintf(buf, sizeof buf, "%s", ctl[i]);
        else if (i < 259) snprintf(buf, sizeof buf, "<0x%02X>", i - 3);
        else if (i == 259) snprintf(buf, sizeof buf, "%s", SPM_SPACE); /* the word boundary, so spaces decode */
        else snprintf(buf, sizeof buf, "<tok_%u>", i);
        rc = set_entry(t, (int32_t)i, buf, strlen(buf));
        t->type[i] = i == 0 ? CM_TT_UNKNOWN : i < 3 ? CM_TT_CONTROL : i < 259 ? CM_TT_BYTE : CM_TT_NORMAL;
        t->score[i] = -(float)i;
    }
    if (!rc) {
        t->kind = CM_TOK_SPM;
        t->unk = 0;
        t->bos = 1;
        t->eos = 2;
        t->add_bos = 1;
        rc = finish(t);
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
    cm_tokenizer *t = tok_new();
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    if (!t) { rc = LLM_ENOMEM; goto fail; }
    if (!f) {
        snprintf(err, errlen, "%s: cannot open tokenizer", path);
        rc = LLM_EIO;
        goto fail;
    }
    if (vocab == 0 || vocab > MAX_VOCAB || (rc = alloc_vocab(t, (int32_t)vocab))) {
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
        if ((rc = set_entry(t, (int32_t)i, tmp, o))) goto fail;
        t->type[i] = i == 0 ? CM_TT_UNKNOWN : (i == 1 || i == 2) ? CM_TT_CONTROL
                     : parse_byte_token(tmp, o) >= 0 ? CM_TT_BYTE : CM_TT_NORMAL;
    }
    t->kind = CM_TOK_SPM;
    t->unk = 0;
    t->bos = vocab > 1 ? 1 : -1;
    t->eos = vocab > 2 ? 2 : -1;
    t->add_bos = t->bos >= 0;
    t->add_space_prefix = 1;
    if ((rc = finish(t))) goto fail;
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

/* ---- output vector ---------------------------------------------------- */

typedef struct {
    int32_t *v;
    size_t n, cap;
    size_t limit;        /* more ids than this: stop (over) */
    int oom, over;
} ivec;

static void push(ivec *o, int32_t id) {
    if (o->over) return;
    if (o->n >= o->limit) {
        o->over = 1;
        return;
    }
    if (o->n == o->cap) {
        size_t nc = o->cap ? o->cap * 2 : 64;
        int32_t *nv = realloc(o->v, nc * sizeof *nv);
        if (!nv) { o->oom = 1; return; }
        o->v = nv;
        o->cap = nc;
    }
    o->v[o->n++] = id;
}

/* ---- merge heap (shared by BPE and SPM) -------------------------------- */

typedef struct {
    float key;        /* smaller first: rank for BPE, -score for SPM */
    int32_t pos;      /* left symbol index: ties go leftmost */
    int32_t lid, rid; /* BPE: symbol ids at push; SPM: symbol lengths at push */
} hent;

typedef struct {
    hent *a;
    size_t n, cap;
} heap;

static int hless(const hent *x, const hent *y) {
    return x->key < y->key || (x->key == y->key && x->pos < y->pos);
}

static int hpush(heap *h, hent e) {
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 64;
        hent *na = realloc(h->a, nc * sizeof *na);
        if (!na) return LLM_ENOMEM;
        h->a = na;
        h->cap = nc;
    }
    size_t i = h->n++;
    while (i && hless(&e, &h->a[(i - 1) / 2])) { h->a[i] = h->a[(i - 1) / 2]; i = (i - 1) / 2; }
    h->a[i] = e;
    return 0;
}

static hent hpop(heap *h) {
    hent top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && hless(&h->a[c + 1], &h->a[c])) c++;
        if (!hless(&h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n) h->a[i] = last;
    return top;
}

/* ---- byte-level BPE ------------------------------------------------------ */

typedef struct {
    int32_t *id, *prev, *next;
    int32_t *start, *len; /* SPM: byte span of each symbol */
    size_t cap;
    heap h;
} work;

static int work_reserve(work *w, size_t n) {
    if (n <= w->cap) return 0;
    size_t nc = n * 2;
    int32_t *a = realloc(w->id, nc * 4), *b, *c, *d, *e;
    if (!a) return LLM_ENOMEM;
    w->id = a;
    if (!(b = realloc(w->prev, nc * 4))) return LLM_ENOMEM;
    w->prev = b;
    if (!(c = realloc(w->next, nc * 4))) return LLM_ENOMEM;
    w->next = c;
    if (!(d = realloc(w->start, nc * 4))) return LLM_ENOMEM;
    w->start = d;
    if (!(e = realloc(w->len, nc * 4))) return LLM_ENOMEM;
    w->len = e;
    w->cap = nc;
    return 0;
}

static void bpe_try(const cm_tokenizer *t, work *w, int32_t i) {
    if (i < 0 || w->next[i] < 0) return;
    int64_t h = find_merge(t, w->id[i], w->id[w->next[i]]);
    if (h < 0) return;
    hent e = {(float)t->mrank[h], i, w->id[i], w->id[w->next[i]]};
    hpush(&w->h, e);
}

static int bpe_word(const cm_tokenizer *t, work *w, const unsigned char *s, size_t n, ivec *out) {
    if (work_reserve(w, n)) return LLM_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        w->id[i] = t->byte_tok[s[i]] >= 0 ? t->byte_tok[s[i]] : t->unk;
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    w->h.n = 0;
    for (size_t i = 0; i + 1 < n; i++) bpe_try(t, w, (int32_t)i);
    while (w->h.n) {
        hent e = hpop(&w->h);
        int32_t l = e.pos, r = w->next[l];
        if (w->id[l] != e.lid || r < 0 || w->id[r] != e.rid || w->id[l] < 0) continue; /* stale */
        int64_t h = find_merge(t, w->id[l], w->id[r]);
        w->id[l] = t->mres[h];
        w->next[l] = w->next[r];
        if (w->next[r] >= 0) w->prev[w->next[r]] = l;
        w->id[r] = -2; /* dead */
        bpe_try(t, w, w->prev[l]);
        bpe_try(t, w, l);
    }
    for (int32_t i = 0; i >= 0 && (size_t)i < n; i = w->next[i])
        if (w->id[i] >= 0) push(out, w->id[i]);
    return 0;
}

/* ---- pre-tokenizers: the regexes of GPT-2, Llama 3 and Qwen2, by hand --- */

enum { C_L = 1, C_N = 2, C_S = 4, C_O = 8 };

static int cls(uint32_t cp) {
    if (cm_uni_is_letter(cp)) return C_L;
    if (cm_uni_is_number(cp)) return C_N;
    if (cm_uni_is_space(cp)) return C_S;
    return C_O;
}

static size_t match_contraction(const uint32_t *c, size_t i, size_t n, int icase) {
    if (c[i] != '\'' || i + 1 >= n) return 0;
    uint32_t a = c[i + 1], b = i + 2 < n ? c[i + 2] : 0;
    if (icase) {
        if (a < 128) a |= 0x20;
        if (b < 128 && b) b |= 0x20;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

static size_t run(const int *k, size_t i, size_t n, int mask) {
    size_t j = i;
    while (j < n && (k[j] & mask)) j++;
    return j;
}

/* whitespace: \s+(?!\S)|\s+ */
static size_t match_space(const int *k, size_t i, size_t n) {
    size_t e = run(k, i, n, C_S);
    if (e == n || e - i == 1) return e;
    return e - 1;
}

/* Length in code points of the pre-token starting at i. */
static size_t next_gpt2(const uint32_t *c, const int *k, size_t i, size_t n) {
    size_t m = match_contraction(c, i, n, 0);
    if (m) return m;
    size_t j = i + (c[i] == ' ' && i + 1 < n && !(k[i + 1] & C_S));
    if (k[j] & (C_L | C_N | C_O)) return run(k, j, n, k[j]) - i; /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+' */
    return match_space(k, i, n) - i;
}

static int is_nl(uint32_t cp) {
    return cp == '\r' || cp == '\n';
}

static size_t next_llama3(const uint32_t *c, const int *k, size_t i, size_t n, int max_digits) {
    size_t m = match_contraction(c, i, n, 1);
    if (m) return m;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    size_t j = i + (!(k[i] & (C_L | C_N)) && !is_nl(c[i]) && i + 1 < n && (k[i + 1] & C_L));
    if (k[j] & C_L) return run(k, j, n, C_L) - i;
    if (k[i] & C_N) { /* \p{N}{1,max} */
        size_t e = run(k, i, n, C_N);
        return e - i > (size_t)max_digits ? (size_t)max_digits : e - i;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    j = i + (c[i] == ' ' && i + 1 < n && (k[i + 1] & C_O));
    if (k[j] & C_O) {
        size_t e = run(k, j, n, C_O);
        while (e < n && is_nl(c[e])) e++;
        return e - i;
    }
    /* \s*[\r\n]+ */
    size_t e = run(k, i, n, C_S), last = n;
    for (size_t p = i; p < e; p++)
        if (is_nl(c[p])) last = p;
    if (last != n) return last + 1 - i;
    return match_space(k, i, n) - i;
}

static int encode_bpe_text(const cm_tokenizer *t, work *w, const char *s, size_t len, ivec *out) {
    uint32_t *cp = malloc((len + 1) * sizeof *cp);
    int *k = malloc((len + 1) * sizeof *k);
    size_t *off = malloc((len + 1) * sizeof *off);
    int rc = 0;
    if (!cp || !k || !off) { rc = LLM_ENOMEM; goto done; }
    size_t n = 0;
    for (size_t i = 0; i < len; n++) {
        off[n] = i;
        i += (size_t)cm_utf8_decode(s + i, len - i, &cp[n]);
        k[n] = cls(cp[n]);
    }
    off[n] = len;
    if (t->pre == CM_PRE_SMOLLM) /* digits split individually first, then GPT-2 */
        for (size_t i = 0; i < n; i++)
            if (k[i] == C_N) k[i] = 16;
    size_t seg = n; /* smollm: each digit is a piece and ends the text before it */
    if (t->pre == CM_PRE_SMOLLM) seg = 0;
    for (size_t i = 0; i < n && !rc && !out->over;) {
        size_t m;
        if (k[i] == 16) {
            m = 1;
        } else {
            if (t->pre == CM_PRE_SMOLLM && seg <= i) /* the next digit; each byte is passed once */
                for (seg = i; seg < n && k[seg] != 16;) seg++;
            if (t->pre == CM_PRE_LLAMA3) m = next_llama3(cp, k, i, seg, 3);
            else if (t->pre == CM_PRE_QWEN2) m = next_llama3(cp, k, i, seg, 1);
            else m = next_gpt2(cp, k, i, seg);
        }
        if (m == 0) m = 1;
        if (i + m > n) m = n - i;
        rc = bpe_word(t, w, (const unsigned char *)s + off[i], off[i + m] - off[i], out);
        i += m;
    }
done:
    free(cp);
    free(k);
    free(off);
    return rc;
}

/* ---- SentencePiece BPE --------------------------------------------------- */

static void spm_try(const cm_tokenizer *t, work *w, const char *s, int32_t i) {
    if (i < 0 || w->next[i] < 0) return;
    int32_t r = w->next[i];
    int32_t id = find_text(t, s + w->start[i], (size_t)(w->len[i] + w->len[r]));
    if (id < 0) return;
    hent e = {-t->score[id], i, w->len[i], w->len[r]};
    hpush(&w->h, e);
}

static int encode_spm_text(const cm_tokenizer *t, work *w, const char *text, size_t len, int prefix,
                           ivec *out) {
    /* escape: ' ' -> U+2581, optional leading one */
    char *s = malloc(len * 3 + 4);
    if (!s) return LLM_ENOMEM;
    size_t n = 0;
    if (prefix) { memcpy(s, SPM_SPACE, 3); n = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(s + n, SPM_SPACE, 3); n += 3; }
        else s[n++] = text[i];
    }
    if (work_reserve(w, n + 1)) { free(s); return LLM_ENOMEM; }
    int32_t ns = 0;
    for (size_t i = 0; i < n; ns++) {
        uint32_t cp;
        int l = cm_utf8_decode(s + i, n - i, &cp);
        w->start[ns] = (int32_t)i;
        w->len[ns] = l;
        w->prev[ns] = ns - 1;
        w->next[ns] = ns + 1;
        i += (size_t)l;
    }
    if (ns) w->next[ns - 1] = -1;
    w->h.n = 0;
    for (int32_t i = 0; i + 1 < ns; i++) spm_try(t, w, s, i);
    while (w->h.n) {
        hent e = hpop(&w->h);
        int32_t l = e.pos, r = w->next[l];
        if (w->len[l] != e.lid || r < 0 || w->len[r] != e.rid) continue; /* stale */
        w->len[l] += w->len[r];
        w->len[r] = 0;
        w->next[l] = w->next[r];
        if (w->next[r] >= 0) w->prev[w->next[r]] = l;
        spm_try(t, w, s, w->prev[l]);
        spm_try(t, w, s, l);
    }
    for (int32_t i = 0; ns && i >= 0; i = w->next[i]) {
        int32_t id = find_text(t, s + w->start[i], (size_t)w->len[i]);
        if (id >= 0) { push(out, id); continue; }
        for (int32_t b = 0; b < w->len[i]; b++) { /* byte fallback */
            int32_t bt = t->byte_tok[(unsigned char)s[w->start[i] + b]];
            push(out, bt >= 0 ? bt : t->unk);
        }
    }
    free(s);
    return 0;
}

/* ---- encode ------------------------------------------------------------ */

/* The longest special token at s (user-defined ones always, control ones
 * when parse_special), or -1. */
static int32_t match_special(const cm_tokenizer *t, const char *s, size_t n, int parse_special) {
    int32_t node = 0, best = -1;
    for (size_t k = 0; k < n; k++) {
        node = trie_next(t, node, (unsigned char)s[k]);
        if (node < 0) break;
        int32_t id = t->trie_id[node];
        if (id >= 0 && (parse_special || t->type[id] == CM_TT_USER)) best = id;
    }
    return best;
}

int cm_tok_encode(const cm_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                  int32_t **ids, size_t *n) {
    return cm_tok_encode_limit(t, text, len, add_bos, parse_special, SIZE_MAX, ids, n);
}

int cm_tok_encode_limit(const cm_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                        size_t max_ids, int32_t **ids, size_t *n) {
    ivec out = {.limit = max_ids};
    work w = {0};
    int rc = 0, prev_special = 1;
    *ids = NULL;
    *n = 0;
    if (add_bos < 0) add_bos = t->add_bos;
    /* no token stands for more than max_token_bytes: a text that long is over
     * the limit whatever it says, and is refused before any work */
    size_t least = t->max_token_bytes ? len / t->max_token_bytes : 0;
    if (max_ids != SIZE_MAX && least > max_ids) {
        *n = least;
        return LLM_ERANGE;
    }
    if (add_bos && t->bos >= 0) push(&out, t->bos);
    size_t i = 0, frag = 0;
    while (i <= len && !rc && !out.over) {
        int32_t sp = i < len && t->n_specials ? match_special(t, text + i, len - i, parse_special) : -1;
        if (sp < 0 && i < len) { i++; continue; }
        if (i > frag) { /* raw text [frag, i) */
            if (t->kind == CM_TOK_BPE) rc = encode_bpe_text(t, &w, text + frag, i - frag, &out);
            else rc = encode_spm_text(t, &w, text + frag, i - frag, t->add_space_prefix && prev_special, &out);
            prev_special = 0;
        }
        if (sp < 0) break;
        push(&out, sp);
        prev_special = 1;
        i += t->text_len[sp];
        frag = i;
    }
    free(w.id); free(w.prev); free(w.next); free(w.start); free(w.len); free(w.h.a);
    if (!rc && out.oom) rc = LLM_ENOMEM;
    if (!rc && out.over) {
        rc = LLM_ERANGE;
        *n = out.n + 1;
    }
    if (rc) {
        free(out.v);
        return rc;
    }
    *ids = out.v;
    *n = out.n;
    return 0;
}

/* ---- decode ------------------------------------------------------------ */

int cm_tok_piece(const cm_tokenizer *t, int32_t id, int render_special, const char **bytes, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return LLM_ERANGE;
    if (t->type[id] == CM_TT_CONTROL && !render_special) {
        *bytes = "";
        *len = 0;
        return 0;
    }
    *bytes = t->piece[id];
    *len = t->piece_len[id];
    return 0;
}

char *cm_tok_decode(const cm_tokenizer *t, const int32_t *ids, size_t n, int render_special) {
    size_t cap = 64, o = 0;
    char *s = malloc(cap);
    for (size_t i = 0; s && i < n; i++) {
        const char *p;
        size_t l;
        if (cm_tok_piece(t, ids[i], render_special, &p, &l)) continue;
        if (t->kind == CM_TOK_SPM && o == 0 && l && p[0] == ' ' && t->add_space_prefix) { p++; l--; }
        if (o + l + 1 > cap) {
            while (o + l + 1 > cap) cap *= 2;
            char *ns = realloc(s, cap);
            if (!ns) { free(s); return NULL; }
            s = ns;
        }
        memcpy(s + o, p, l);
        o += l;
    }
    if (s) s[o] = 0;
    return s;
}

void cm_detok_init(cm_detok *d, const cm_tokenizer *t) {
    d->npend = 0;
    d->first = t->kind == CM_TOK_SPM && t->add_space_prefix;
}

size_t cm_detok_push(cm_detok *d, const cm_tokenizer *t, int32_t id, char *out, size_t cap) {
    const char *p;
    size_t l, o = 0;
    if (cm_tok_piece(t, id, 0, &p, &l) || l == 0) return 0;
    if (d->first) {
        if (p[0] == ' ') { p++; l--; }
        d->first = 0;
    }
    /* pending bytes first, then the piece; emit the complete prefix */
    for (size_t i = 0; i < l; i++) {
        if (d->npend == sizeof d->pend) { /* never a valid partial: flush as is */
            size_t m = d->npend < cap - o ? d->npend : cap - o;
            memcpy(out + o, d->pend, m);
            o += m;
            d->npend = 0;
        }
        d->pend[d->npend++] = p[i];
    }
    size_t c = cm_utf8_complete_prefix(d->pend, d->npend);
    if (c > cap - o) c = cap - o;
    memcpy(out + o, d->pend, c);
    memmove(d->pend, d->pend + c, d->npend - c);
    d->npend -= c;
    return o + c;
}

size_t cm_detok_flush(cm_detok *d, char *out, size_t cap) {
    size_t c = d->npend < cap ? d->npend : cap;
    memcpy(out, d->pend, c);
    d->npend = 0;
    return c;
}

/* ---- accessors --------------------------------------------------------- */

int32_t cm_tok_vocab(const cm_tokenizer *t) { return t->n_vocab; }
int32_t cm_tok_bos(const cm_tokenizer *t) { return t->bos; }
int32_t cm_tok_eos(const cm_tokenizer *t) { return t->eos; }
int32_t cm_tok_unk(const cm_tokenizer *t) { return t->unk; }
int cm_tok_kind(const cm_tokenizer *t) { return t->kind; }
int cm_tok_pre(const cm_tokenizer *t) { return t->pre; }
const char *cm_tok_chat_template(const cm_tokenizer *t) { return t->chat_template; }

int cm_tok_type(const cm_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? t->type[id] : 0;
}

int cm_tok_is_eog(const cm_tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return 1;
    return 0;
}

int32_t cm_tok_lookup(const cm_tokenizer *t, const char *s) {
    return find_text(t, s, strlen(s));
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
    uint64_t nkv = 8 + (t->kind == CM_TOK_BPE ? 2 : 0) + (t->bos >= 0) + (t->eos >= 0) + (t->unk >= 0) +
                   (t->chat_template != NULL);
    wput(&b, "GGUF", 4);
    wu32(&b, 3);
    wu64(&b, 0);   /* tensors */
    wu64(&b, nkv);
    const char *model = t->kind == CM_TOK_BPE ? "gpt2" : "llama";
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
