/* wk_guide.h - structured outputs in the engine: grammars compiled once and
 * cached by their text, the vocabulary's byte trie, and the constrained
 * draw.
 *
 * The draw samples as usual first and keeps the token when the grammar
 * allows it (one token's bytes through the parse: microseconds). Only when
 * it does not is the whole mask computed (a trie walk, or the grammar's
 * cache) and the draw repeated on the masked logits with the same
 * processing (temperature, top-k/p, penalties). Greedy decoding gets the
 * best allowed token either way; sampling gets the model's distribution
 * restricted to allowed tokens, up to the truncation (top-k/p) being taken
 * before the mask on the first try. End-of-generation tokens are allowed
 * exactly when the output so far is complete; when nothing may follow, the
 * choice ends there (finish "stop").
 *
 * Single-threaded, as the engine is. */
#ifndef WK_GUIDE_H
#define WK_GUIDE_H

#include "cm_grammar.h"
#include "wk_sampler.h"

#include <stddef.h>
#include <stdint.h>

typedef struct wk_guide wk_guide;

/* eog: the vocabulary's end-of-generation ids. The trie is built on first use. */
int wk_guide_create(const cm_tokenizer *t, const int32_t *eog, int n_eog, wk_guide **out);
void wk_guide_free(wk_guide *g);
/* A parse at the start of the GBNF text (compiled, or found in the cache). */
int wk_guide_begin(wk_guide *g, const char *gbnf, size_t len, cm_gstate **st, char *err, size_t errlen);
/* A copy of a parse for another choice. */
int wk_guide_fork(wk_guide *g, const cm_gstate *st, cm_gstate **out);
/* Ends a parse (NULL is fine). */
void wk_guide_end(wk_guide *g, cm_gstate *st);
/* wk_sample_next under the grammar (same arguments); stop_ids are treated
 * as ends. Returns the token, or a negative LLM_E* code. */
int32_t wk_guide_sample(wk_guide *g, cm_gstate *st, wk_sample_ctx *c, const wk_sample_params *p, uint64_t *rng,
                        float *logits, const int32_t *prompt, int n_prompt, const int32_t *out, int n_out,
                        const int32_t *mask, int n_mask, const int32_t *stop_ids, int n_stop_ids, int n_logprobs,
                        wk_token_lp *lp);
/* Advances the parse past tok; 1 when nothing may follow (the choice ends). */
int wk_guide_advance(wk_guide *g, cm_gstate *st, int32_t tok);

typedef struct {
    uint64_t compiled, cache_hits;  /* grammars */
    uint64_t draws, redraws;        /* constrained draws; those the first try did not settle */
    uint64_t mask_walks, mask_hits; /* full masks by trie walk; from the grammars' caches */
} wk_guide_stats;
void wk_guide_get_stats(const wk_guide *g, wk_guide_stats *st);

#endif
