/* cm_tok_int.h - what the tokenizer's two files share: the tokenizer
 * itself, the byte map and the lookups. cm_tok_build.c makes tokenizers
 * (from GGUF, llama2.c, a synthetic vocabulary, an export) and exports
 * them; cm_tokenizer.c encodes and decodes. No other module includes this. */
#ifndef CM_TOK_INT_H
#define CM_TOK_INT_H

#include "cm_tokenizer.h"

#include <stdint.h>
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
    /* WordPiece (CM_TOK_WPM): BERT's normalizer steps (CM_WPM_*), the prefix
     * of word-continuing pieces ("##"), the longest word not made [UNK] */
    unsigned wp_flags;
    char wp_prefix[8];
    uint32_t wp_prefix_len, wp_max_chars;
    /* Unigram (CM_TOK_UNI): scores are log probabilities (Viterbi); the
     * Metaspace pre-tokenizer's ways; the post-processor's EOS */
    double uni_unk_score;          /* the lowest score less 10: an unknown character's */
    int uni_split, uni_prepend;    /* words split at U+2581; 1: always, 2: first section only */
    int uni_byte_fallback, add_eos;
};

enum { CM_WPM_CLEAN = 1, CM_WPM_CHINESE = 2, CM_WPM_STRIP = 4, CM_WPM_LOWER = 8 };

/* ---- construction (cm_tok_build.c), for the files that build tokenizers --- */
cm_tokenizer *cm_tok_new(void);
int cm_tok_alloc_vocab(cm_tokenizer *t, int32_t n);
int cm_tok_set_entry(cm_tokenizer *t, int32_t id, const char *s, size_t len);
/* After vocabulary, types, ids and flags are set: indexes, pieces, specials. */
int cm_tok_finish(cm_tokenizer *t);
/* BPE merges, after cm_tok_finish (they look tokens up): room for n, then
 * each (left, right) pair by rank; pairs naming no token are skipped. */
int cm_tok_merges_init(cm_tokenizer *t, uint64_t n);
/* Unigram, after cm_tok_finish: the unknown character's score. */
void cm_tok_unigram_ready(cm_tokenizer *t);
void cm_tok_merge_add(cm_tokenizer *t, int32_t rank, const char *ls, size_t ll, const char *rs, size_t rl);

/* ---- byte-level mapping (GPT-2 bytes_to_unicode): cm_tokenizer.c ------- */

extern uint32_t cm_tok_byte_cp[256];  /* byte -> its code point */
extern int16_t cm_tok_cp_byte[512];   /* code point -> byte, -1 */
void cm_tok_init_byte_map(void);

/* ---- hash tables ------------------------------------------------------ */

static inline int32_t find_text(const cm_tokenizer *t, const char *s, size_t len) {
    uint32_t h = (uint32_t)XXH3_64bits(s, len) & t->hmask;
    for (;;) {
        int32_t id = t->htab[h];
        if (id < 0) return -1;
        if (t->text_len[id] == len && memcmp(t->text[id], s, len) == 0) return id;
        h = (h + 1) & t->hmask;
    }
}


static inline int64_t find_merge(const cm_tokenizer *t, int32_t l, int32_t r) {
    uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
    uint64_t h = XXH3_64bits(&key, 8) & t->mmask;
    while (t->mkey[h]) {
        if (t->mkey[h] == key) return (int64_t)h;
        h = (h + 1) & t->mmask;
    }
    return -1;
}

static inline uint64_t trie_slot(const cm_tokenizer *t, uint64_t key) {
    uint64_t h = XXH3_64bits(&key, 8) & t->trie_mask;
    while (t->trie_key[h] && t->trie_key[h] != key) h = (h + 1) & t->trie_mask;
    return h;
}

static inline int32_t trie_next(const cm_tokenizer *t, int32_t node, unsigned char c) {
    uint64_t h = trie_slot(t, ((uint64_t)node << 8 | c) + 1);
    return t->trie_key[h] ? t->trie_child[h] : -1;
}

#endif
