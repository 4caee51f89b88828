/* cm_grammar_int.h - the grammar's compiled form, shared by the reader
 * (cm_grammar.c) and the matcher (cm_gmatch.c); no other module includes it. */
#ifndef CM_GRAMMAR_INT_H
#define CM_GRAMMAR_INT_H

#include "cm_error.h"
#include "cm_grammar.h"

#include <stdlib.h>

/* An element: the grammar is one array of them, each alternative a run
 * ended by G_END, so "the next element" is always index + 1. */
enum { G_END = 0, G_CHARS = 1, G_RULE = 2 };
typedef struct {
    uint32_t kind : 2;
    uint32_t arg : 30; /* G_CHARS: class index; G_RULE: rule id */
} g_el;

typedef struct {
    char *name;
    int32_t *alts; /* element index where each alternative starts */
    int n_alts, cap_alts;
    int defined, line, col; /* where it was first referenced (for "undefined rule") */
} g_rule;

typedef struct g_mask g_mask;

struct cm_grammar {
    g_el *el;
    int n_el, cap_el;
    uint8_t (*cls)[32]; /* byte sets, bit b of byte b>>3 */
    int n_cls, cap_cls;
    g_rule *rules;
    int n_rules, cap_rules;
    int root;
    /* the mask cache (cm_gmatch.c) */
    g_mask **masks;
    int n_masks, cap_masks;
    uint64_t walks, hits, clock;
};

static inline int g_has(const uint8_t *set, unsigned b) { return set[b >> 3] >> (b & 7) & 1; }

/* Grows the array *p (of *cap elements of size bytes) to hold need, doubling
 * from 16; LLM_ENOMEM (and *p as it was) when it cannot. */
static inline int g_grow(void **p, int *cap, int need, size_t size) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return LLM_ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

#endif
