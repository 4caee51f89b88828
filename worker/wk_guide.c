#include "wk_guide.h"
#include "cm_error.h"
#include "cm_log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define CACHE 32 /* compiled grammars kept once no request uses them */

typedef struct {
    uint64_t h, used;
    size_t len;
    char *text;
    cm_grammar *g;
    int refs;
} entry;

struct wk_guide {
    const cm_tokenizer *tok;
    cm_vtrie *trie; /* built on first use */
    int32_t vocab;
    uint8_t *is_end; /* [vocab] end-of-generation ids */
    int32_t first_end;
    entry *ent;
    int n_ent, cap_ent;
    float *orig;     /* [vocab] the logits before the first draw */
    uint64_t *bits;  /* [(vocab + 63) / 64] */
    uint64_t clock;
    wk_guide_stats st;
};

int wk_guide_create(const cm_tokenizer *t, const int32_t *eog, int n_eog, wk_guide **out) {
    *out = NULL;
    wk_guide *g = calloc(1, sizeof *g);
    if (!g) return LLM_ENOMEM;
    g->tok = t;
    g->vocab = cm_tok_vocab(t);
    g->is_end = calloc((size_t)g->vocab, 1);
    g->orig = malloc(sizeof *g->orig * (size_t)g->vocab);
    g->bits = malloc(sizeof *g->bits * (size_t)((g->vocab + 63) / 64));
    if (!g->is_end || !g->orig || !g->bits) {
        wk_guide_free(g);
        return LLM_ENOMEM;
    }
    g->first_end = -1;
    for (int i = 0; i < n_eog; i++)
        if (eog[i] >= 0 && eog[i] < g->vocab) {
            g->is_end[eog[i]] = 1;
            if (g->first_end < 0) g->first_end = eog[i];
        }
    *out = g;
    return 0;
}

void wk_guide_free(wk_guide *g) {
    if (!g) return;
    CM_INFO("structured outputs: %llu grammars compiled, %llu found compiled; %llu draws, %llu redrawn under a mask "
            "(%llu masks by trie walk, %llu from cache)", (unsigned long long)g->st.compiled,
            (unsigned long long)g->st.cache_hits, (unsigned long long)g->st.draws, (unsigned long long)g->st.redraws,
            (unsigned long long)g->st.mask_walks, (unsigned long long)g->st.mask_hits);
    for (int i = 0; i < g->n_ent; i++) {
        free(g->ent[i].text);
        cm_grammar_free(g->ent[i].g);
    }
    free(g->ent);
    cm_vtrie_free(g->trie);
    free(g->is_end);
    free(g->orig);
    free(g->bits);
    free(g);
}

static entry *find(wk_guide *g, const cm_grammar *gr) {
    for (int i = 0; i < g->n_ent; i++)
        if (g->ent[i].g == gr) return &g->ent[i];
    return NULL;
}

int wk_guide_begin(wk_guide *g, const char *text, size_t len, cm_gstate **st, char *err, size_t errlen) {
    *st = NULL;
    if (!g->trie) {
        int rc = cm_vtrie_build(g->tok, &g->trie);
        if (rc) {
            snprintf(err, errlen, "out of memory for the vocabulary trie");
            return rc;
        }
    }
    uint64_t h = XXH3_64bits(text, len);
    entry *e = NULL;
    for (int i = 0; i < g->n_ent && !e; i++)
        if (g->ent[i].h == h && g->ent[i].len == len && !memcmp(g->ent[i].text, text, len)) e = &g->ent[i];
    if (e) {
        g->st.cache_hits++;
    } else {
        cm_grammar *gr;
        int rc = cm_grammar_parse(text, len, &gr, err, errlen);
        if (rc) return rc;
        if (g->n_ent >= CACHE) { /* the least recently used grammar no parse holds goes */
            int victim = -1;
            for (int i = 0; i < g->n_ent; i++)
                if (!g->ent[i].refs && (victim < 0 || g->ent[i].used < g->ent[victim].used)) victim = i;
            if (victim >= 0) {
                free(g->ent[victim].text);
                cm_grammar_free(g->ent[victim].g);
                g->ent[victim] = g->ent[--g->n_ent];
            }
        }
        if (g->n_ent >= g->cap_ent) {
            int cap = g->cap_ent ? g->cap_ent * 2 : 8;
            entry *q = realloc(g->ent, sizeof *q * (size_t)cap);
            if (!q) {
                cm_grammar_free(gr);
                return LLM_ENOMEM;
            }
            g->ent = q, g->cap_ent = cap;
        }
        e = &g->ent[g->n_ent];
        *e = (entry){h, 0, len, malloc(len + 1), gr, 0};
        if (!e->text) {
            cm_grammar_free(gr);
            return LLM_ENOMEM;
        }
        memcpy(e->text, text, len);
        e->text[len] = 0;
        g->n_ent++;
        g->st.compiled++;
        CM_LOG(CM_LOG_DEBUG, "grammar compiled: %d rules, %d elements, %zu bytes of GBNF", cm_grammar_rules(gr),
               cm_grammar_elements(gr), len);
    }
    int rc = cm_gstate_new(e->g, st);
    if (rc) return rc;
    e->refs++;
    e->used = ++g->clock;
    return 0;
}

int wk_guide_fork(wk_guide *g, const cm_gstate *st, cm_gstate **out) {
    int rc = cm_gstate_clone(st, out);
    if (rc) return rc;
    entry *e = find(g, cm_gstate_grammar(st));
    if (e) e->refs++;
    return 0;
}

void wk_guide_end(wk_guide *g, cm_gstate *st) {
    if (!st) return;
    entry *e = find(g, cm_gstate_grammar(st));
    if (e && e->refs > 0) e->refs--;
    cm_gstate_free(st);
}

static int is_end(const wk_guide *g, int32_t t, const int32_t *stop_ids, int n_stop_ids) {
    if (g->is_end[t]) return 1;
    for (int i = 0; i < n_stop_ids; i++)
        if (stop_ids[i] == t) return 1;
    return 0;
}

static int allowed(wk_guide *g, cm_gstate *st, int32_t t, const int32_t *stop_ids, int n_stop_ids) {
    if (is_end(g, t, stop_ids, n_stop_ids)) return cm_gstate_complete(st);
    size_t l;
    const uint8_t *b = cm_vtrie_bytes(g->trie, t, &l);
    return b && cm_gstate_allows(st, b, l);
}

int32_t wk_guide_sample(wk_guide *g, cm_gstate *st, wk_sample_ctx *c, const wk_sample_params *p, uint64_t *rng,
                        float *lg, const int32_t *prompt, int n_prompt, const int32_t *out, int n_out, const int32_t *mask,
                        int n_mask, const int32_t *stop_ids, int n_stop_ids, int n_logprobs, wk_token_lp *lp) {
    int V = g->vocab;
    g->st.draws++;
    memcpy(g->orig, lg, sizeof *lg * (size_t)V);
    int32_t t = wk_sample_next(c, p, rng, lg, prompt, n_prompt, out, n_out, mask, n_mask, n_logprobs, lp);
    if (allowed(g, st, t, stop_ids, n_stop_ids)) return t;
    g->st.redraws++;
    uint64_t w0, h0, w1, h1;
    cm_grammar_mask_stats(cm_gstate_grammar(st), &w0, &h0);
    int rc = cm_gstate_mask(st, g->trie, g->bits);
    if (rc) return rc;
    cm_grammar_mask_stats(cm_gstate_grammar(st), &w1, &h1);
    g->st.mask_walks += w1 - w0;
    g->st.mask_hits += h1 - h0;
    int complete = cm_gstate_complete(st), any = 0;
    memcpy(lg, g->orig, sizeof *lg * (size_t)V);
    for (int i = 0; i < V; i++)
        if (!(is_end(g, i, stop_ids, n_stop_ids) ? complete : (int)(g->bits[i >> 6] >> (i & 63) & 1))) lg[i] = -INFINITY;
    for (int i = 0; i < n_mask; i++) lg[mask[i]] = -INFINITY;
    for (int i = 0; i < V && !any; i++) any = lg[i] > -INFINITY;
    if (!any) /* cannot happen (a parse with nothing to follow ends its choice first); end it rather than draw from nothing */
        return g->first_end >= 0 ? g->first_end : t;
    t = wk_sample_next(c, p, rng, lg, prompt, n_prompt, out, n_out, mask, n_mask, 0, NULL);
    if (lp) wk_sample_logprobs(c, g->orig, t, n_logprobs, lp);
    return t;
}

int wk_guide_advance(wk_guide *g, cm_gstate *st, int32_t t) {
    if (g->is_end[t]) return 1;
    size_t l;
    const uint8_t *b = cm_vtrie_bytes(g->trie, t, &l);
    if (!b) return 1; /* a stop id with no text: it ends the choice */
    int rc = cm_gstate_feed(st, b, l);
    if (rc) return rc;
    return cm_gstate_done(st);
}

void wk_guide_get_stats(const wk_guide *g, wk_guide_stats *st) { *st = g->st; }
