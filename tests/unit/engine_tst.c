/* engine_tst.c - see engine_tst.h. */
#include "engine_tst.h"

#include "cm_error.h"
#include "cm_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

wk_model *model;
static const char *text =
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based inks and a wooden press adapted from those used for wine. Books became "
    "cheaper, literacy spread across Europe, and ideas travelled faster than ever before. Scholars argue about "
    "how much credit belongs to Gutenberg alone, since block printing had existed in China and Korea for "
    "centuries, but the speed of the European adoption is not in doubt. Within fifty years presses were running "
    "in more than two hundred cities, and millions of volumes had been printed. ";

int32_t *corpus;
size_t n_corpus;

void opts(wk_engine_opts *o, int budget, int max_seqs) {
    wk_engine_opts_default(o);
    o->max_num_batched_tokens = budget;
    o->max_num_seqs = max_seqs;
    o->max_model_len = 2048;
    o->kv_cache_bytes = (size_t)256 << 20;
}

/* Drains outputs into res[id]. */
void collect(wk_engine *e, result *res) {
    const wk_output *o;
    int n = wk_engine_outputs(e, &o);
    for (int i = 0; i < n; i++) {
        result *r = &res[o[i].id];
        int c = o[i].index;
        for (int k = 0; k < o[i].n_tokens && r->n[c] < MAXT; k++) {
            if (o[i].logprobs && r->n[c] < 64) r->lp[c][r->n[c]] = o[i].logprobs[k];
            r->tok[c][r->n[c]++] = o[i].tokens[k];
        }
        if (r->tlen[c] + o[i].text_len < sizeof r->text[c]) {
            memcpy(r->text[c] + r->tlen[c], o[i].text, o[i].text_len);
            r->tlen[c] += o[i].text_len;
        }
        if (o[i].finish) r->finish[c] = o[i].finish;
        r->cached = o[i].cached_tokens;
        r->after_last += r->last > 0;
        r->last += o[i].last;
    }
}

void run_all(wk_engine *e, result *res) {
    while (wk_engine_has_work(e)) {
        int rc = wk_engine_step(e);
        CHECK(rc >= 0);
        if (rc < 0) break;
        collect(e, res);
    }
    collect(e, res);
}

wk_params greedy(int max_tokens) {
    wk_params p;
    wk_params_default(&p);
    p.s.temperature = 0;
    p.max_tokens = max_tokens;
    p.ignore_eos = 1;
    return p;
}

/* Prompt i: a slice of the corpus of length len starting at off. */
void prompt(int off, int len, int32_t *out) {
    for (int i = 0; i < len; i++) out[i] = corpus[(size_t)(off + i) % n_corpus];
}

int engine_tst_begin(int argc, char **argv, const char *name) {
    if (argc < 2 || access(argv[1], R_OK) != 0) {
        fprintf(stderr, "%s: model %s not found; run tools/setup.sh to fetch it\n", name, argc > 1 ? argv[1] : "?");
        return TST_SKIP;
    }
    cm_log_set_level(CM_LOG_WARN);
    char err[512];
    wk_model_opts mo = {.model_path = argv[1], .max_batch = 512};
    if (wk_model_load(&mo, &model, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", name, err);
        return 1;
    }
    /* a corpus of real text, repeated */
    size_t n1;
    int32_t *one;
    CHECK_RC(cm_tok_encode(model->tok, text, strlen(text), 0, 0, &one, &n1), 0);
    n_corpus = n1 * 40;
    corpus = malloc(sizeof(int32_t) * n_corpus);
    for (size_t i = 0; i < n_corpus; i++) corpus[i] = one[i % n1];
    /* vary the repeats so slices are not all alike */
    for (size_t i = n1; i < n_corpus; i += 17) corpus[i] = one[(i * 7) % n1];
    free(one);
    return 0;
}

void engine_tst_end(void) {
    free(corpus);
    wk_model_free(model);
}
