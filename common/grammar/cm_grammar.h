/* cm_grammar.h - context-free grammars over bytes, and the token masks that
 * keep a model's output inside one (structured outputs).
 *
 * The text form is llama.cpp's GBNF: `name ::= alternatives`, with "quoted
 * literals", [character classes] (ranges, ^, \xHH \uHHHH escapes), `.`,
 * (groups), rule names, and the postfix operators * + ? {m} {m,} {m,n}; `#`
 * comments; `root` is the start. Classes and literals are code points,
 * compiled to UTF-8 byte sequences, so the automaton runs on bytes and a
 * token may end inside a character. Repetitions become right-recursive
 * rules, which the matcher runs as tail calls (a long list does not deepen
 * the stack). Left recursion is refused when the grammar is read.
 *
 * A parse in progress (cm_gstate) is the set of pushdown stacks still
 * alive, each stack a shared-tail list of positions in the grammar. A token
 * is allowed when its bytes keep one stack alive; the mask of every allowed
 * token comes from one walk of the vocabulary's byte trie (shared prefixes
 * are matched once, dead subtrees skipped), and is cached in the grammar by
 * the parse state it was computed for: inside a long string or a repeated
 * structure the state recurs and the walk is not repeated.
 *
 * Thread safety: a grammar is read-only once built except for its mask
 * cache, which cm_gstate_mask writes; masks for one grammar are computed by
 * one thread at a time. */
#ifndef CM_GRAMMAR_H
#define CM_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "cm_tokenizer.h"

#define CM_GRAMMAR_MAX_TEXT (1 << 20)   /* bytes of GBNF */
#define CM_GRAMMAR_MAX_ELEMENTS (1 << 20) /* after repetitions are expanded */

typedef struct cm_grammar cm_grammar;
typedef struct cm_gstate cm_gstate;
typedef struct cm_vtrie cm_vtrie;

/* A rule of this name, when the text defines one, is the start instead of root (cm_grammar_after's wrapper). */
#define CM_GRAMMAR_OUTER_ROOT "llmserve-root"

/* Reads GBNF text; on error err says what and where (line:column). */
int cm_grammar_parse(const char *text, size_t len, cm_grammar **out, char *err, size_t errlen);
void cm_grammar_free(cm_grammar *g);
/* The GBNF of gbnf (len bytes) put after a reasoning block: any text up to and including the first close (the
 * block's end, printable ASCII, at most 32 bytes), then optional whitespace, then gbnf's root. open non-NULL:
 * the block is optional and starts with open (Qwen3's "<think>"; the model may also answer at once); NULL: the
 * output starts inside the block (DeepSeek-R1, whose template opens it). The text inside is any text without
 * close (a KMP automaton as right-recursive rules, which the matcher runs as tail calls). *out malloc'd. */
int cm_grammar_after(const char *gbnf, size_t len, const char *open, const char *close, char **out);
/* Sizes, for logs and tests. */
int cm_grammar_rules(const cm_grammar *g);
int cm_grammar_elements(const cm_grammar *g);

/* A parse at the start of the grammar. */
int cm_gstate_new(cm_grammar *g, cm_gstate **out);
int cm_gstate_clone(const cm_gstate *s, cm_gstate **out);
void cm_gstate_free(cm_gstate *s);
/* Feeds bytes: 0 and the state advanced when they keep the parse alive,
 * LLM_EINVAL and the state unchanged when they do not. */
int cm_gstate_feed(cm_gstate *s, const void *bytes, size_t n);
/* Whether the bytes would be accepted, without advancing. */
int cm_gstate_allows(cm_gstate *s, const void *bytes, size_t n);
/* The bytes so far form a whole sentence of the grammar. */
int cm_gstate_complete(const cm_gstate *s);
/* Complete, and no byte may follow. */
int cm_gstate_done(const cm_gstate *s);
/* The grammar a parse runs. */
cm_grammar *cm_gstate_grammar(const cm_gstate *s);

/* The vocabulary as a byte trie: what each token id writes (control tokens
 * and empty pieces are left out: no grammar allows them). */
int cm_vtrie_build(const cm_tokenizer *t, cm_vtrie **out);
void cm_vtrie_free(cm_vtrie *v);
int32_t cm_vtrie_vocab(const cm_vtrie *v);
/* The bytes of token id (NULL, 0 when it writes none). */
const uint8_t *cm_vtrie_bytes(const cm_vtrie *v, int32_t id, size_t *len);

/* bits[(vocab + 63) / 64]: bit id set when token id keeps the parse alive.
 * Ending tokens (EOS) are the caller's: allowed when cm_gstate_complete. */
int cm_gstate_mask(cm_gstate *s, const cm_vtrie *v, uint64_t *bits);
/* Masks computed by a trie walk, and those served from the cache. */
void cm_grammar_mask_stats(const cm_grammar *g, uint64_t *walks, uint64_t *hits);

#endif
