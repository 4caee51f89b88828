/* engine_tst.h - what the engine's tests share: the default model loaded
 * once, a corpus of its real text, and helpers that run requests and gather
 * their outputs by id. */
#ifndef ENGINE_TST_H
#define ENGINE_TST_H

#include "tst.h"
#include "wk_engine.h"

#include <stddef.h>
#include <stdint.h>

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#else
#define UNDER_TSAN 0
#endif
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#else
#define UNDER_ASAN 0
#endif

#define MAXR 40
#define MAXT 512

typedef struct {
    int32_t tok[WK_MAX_N][MAXT];
    int n[WK_MAX_N];
    char text[WK_MAX_N][4096];
    size_t tlen[WK_MAX_N];
    int finish[WK_MAX_N];
    wk_token_lp lp[WK_MAX_N][64];
    int cached;
    int last, after_last; /* outputs saying the request is over, and outputs after one */
} result;

extern wk_model *model;
extern int32_t *corpus;
extern size_t n_corpus;

/* Loads argv[1] (the GGUF model) and makes the corpus: 0, or TST_SKIP when
 * the model is absent, 1 when it does not load. */
int engine_tst_begin(int argc, char **argv, const char *name);
void engine_tst_end(void);
/* An engine's options: a token budget, a sequence cap, 2048 positions, 256 MiB of cache. */
void opts(wk_engine_opts *o, int budget, int max_seqs);
/* Drains outputs into res[id]. */
void collect(wk_engine *e, result *res);
/* Steps until idle, collecting. */
void run_all(wk_engine *e, result *res);
/* Greedy, max_tokens, ignoring end of sequence. */
wk_params greedy(int max_tokens);
/* A slice of the corpus of length len starting at off. */
void prompt(int off, int len, int32_t *out);

#endif
