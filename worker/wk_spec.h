/* wk_spec.h - speculative decoding: configuration and draft proposers.
 *
 * Prompt lookup (n-gram) drafts: the sequence's last n tokens (n from
 * prompt_lookup_max down to prompt_lookup_min) are looked for earlier in the
 * sequence (prompt and output), and the tokens that followed the latest
 * earlier occurrence are proposed. No second model: it pays where the output
 * copies its input (code edits, quoting, summaries with names).
 *
 * Draft-model drafts: a smaller model with the same vocabulary, in the same
 * worker with its own paged KV cache (wk_draft.c), proposes its greedy
 * continuation, one draft-model step per draft.
 *
 * The engine verifies the K drafts of a sequence in one step (K + 1 rows of
 * logits) by drawing each row exactly as plain decoding would and keeping
 * the drafts up to the first draw that differs. For a deterministic draft
 * that is the standard rejection sampling (accept d with probability p(d);
 * on rejection draw from p with d removed), so the output is the target's,
 * and with a seed the very same tokens. */
#ifndef WK_SPEC_H
#define WK_SPEC_H

#include <stddef.h>
#include <stdint.h>

#define WK_SPEC_MAX_K 16 /* drafts a sequence may propose in one step */

#define WK_SPEC_PATH_MAX 1024

enum { WK_SPEC_NONE = 0, WK_SPEC_NGRAM = 1, WK_SPEC_DRAFT = 2 };

typedef struct {
    int method;          /* WK_SPEC_* */
    int k;               /* num_speculative_tokens: drafts at most, 1..WK_SPEC_MAX_K */
    int ngram_min;       /* prompt_lookup_min, >= 1 */
    int ngram_max;       /* prompt_lookup_max, >= ngram_min */
    int max_batch;       /* disable_by_batch_size: no speculation in a step where more than this many
                            sequences decode; 0 (the default): no cap, the engine's cost rule decides (a
                            sequence speculates while its acceptance beats the compute share of the step) */
    int cost_rule;       /* 1 (default): that rule; 0: speculate whenever there are drafts (an llmserve key,
                            "cost_rule": false, for measuring and for testing a draft that cannot pay) */
    char model[WK_SPEC_PATH_MAX]; /* draft_model: the draft's model file */
} wk_spec_config;

/* Off, with the defaults a method gets when it is turned on. */
void wk_spec_config_default(wk_spec_config *c);

/* vLLM's --speculative-config JSON: {"method": "ngram", "num_speculative_tokens": K,
 * "prompt_lookup_max": N, "prompt_lookup_min": M, "disable_by_batch_size": B} or {"method":
 * "draft_model", "model": PATH, "num_speculative_tokens": K} ("model" alone implies draft_model), and
 * our "cost_rule": false. An unknown key, a method we do not run, a key of the other method, or a
 * value out of range is refused with a message in err. LLM_EINVAL. */
int wk_spec_config_parse(wk_spec_config *c, const char *json, char *err, size_t errlen);

/* Checks a configuration built from flags; LLM_EINVAL with a message. */
int wk_spec_config_check(const wk_spec_config *c, char *err, size_t errlen);

/* Up to k drafts for the sequence tok[0..n) into out: the tokens that
 * follow an earlier occurrence of its longest suffix of nmin..nmax tokens
 * that occurs earlier (the latest occurrence with k tokens after it, else
 * the one with the most). Returns how many (0: no match). O(n * nmax). */
int wk_spec_ngram(const int32_t *tok, int n, int nmin, int nmax, int k, int32_t *out);

/* The next proposal length of a sequence that proposed k drafts and had
 * accepted of them taken: one more after a full acceptance, one past what
 * was taken otherwise, within [1, kmax]. */
int wk_spec_next_k(int k, int accepted, int kmax);

struct wk_cost;
/* The acceptance a sequence's drafts need to pay in a step where `decodes`
 * sequences decode, from the step cost fit (ms = F + a*T): a*B / (F + a*B),
 * plus draft_cost (a draft model's cost per token against the target's).
 * 1 or more: no draft can pay; 1 while the fit knows nothing. */
float wk_spec_floor(const struct wk_cost *c, int decodes, float draft_cost);

#endif
