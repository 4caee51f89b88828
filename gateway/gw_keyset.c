#include "gw_keyset.h"

#include <stdlib.h>
#include <string.h>

static uint32_t slot(uint64_t k, uint32_t cap) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (uint32_t)k & (cap - 1);
}

static void rehash(gw_keyset *s, uint32_t cap) {
    uint64_t *old = s->k;
    uint32_t oc = s->cap;
    s->k = calloc(cap, sizeof *s->k);
    if (!s->k) {
        s->k = old;
        return;
    }
    s->cap = cap;
    s->n = 0;
    for (uint32_t i = 0; i < oc; i++)
        if (old[i]) gw_keyset_add(s, old[i]);
    free(old);
}

void gw_keyset_add(gw_keyset *s, uint64_t k) {
    if (!k) k = 1;
    if (!s->cap || 2 * (s->n + 1) > s->cap) rehash(s, s->cap ? 2 * s->cap : 1024);
    if (!s->cap) return;
    for (uint32_t i = slot(k, s->cap);; i = (i + 1) & (s->cap - 1)) {
        if (s->k[i] == k) return;
        if (!s->k[i]) {
            s->k[i] = k;
            s->n++;
            return;
        }
    }
}

int gw_keyset_has(const gw_keyset *s, uint64_t k) {
    if (!k) k = 1;
    if (!s->cap) return 0;
    for (uint32_t i = slot(k, s->cap);; i = (i + 1) & (s->cap - 1)) {
        if (s->k[i] == k) return 1;
        if (!s->k[i]) return 0;
    }
}

void gw_keyset_del(gw_keyset *s, uint64_t k) {
    if (!k) k = 1;
    if (!s->cap) return;
    uint32_t i = slot(k, s->cap);
    for (;; i = (i + 1) & (s->cap - 1)) {
        if (!s->k[i]) return;
        if (s->k[i] == k) break;
    }
    /* backward-shift deletion keeps probe chains intact */
    s->k[i] = 0;
    s->n--;
    for (uint32_t j = (i + 1) & (s->cap - 1); s->k[j]; j = (j + 1) & (s->cap - 1)) {
        uint64_t v = s->k[j];
        s->k[j] = 0;
        s->n--;
        gw_keyset_add(s, v);
    }
}

void gw_keyset_clear(gw_keyset *s) {
    if (s->k) memset(s->k, 0, sizeof *s->k * s->cap);
    s->n = 0;
}
