#include "cm_idmap.h"
#include "cm_error.h"

#include <stdlib.h>

static size_t slot(uint64_t k, size_t cap) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k & (cap - 1);
}

static int grow(cm_idmap *m) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    uint64_t *k = calloc(cap, sizeof *k);
    void **v = calloc(cap, sizeof *v);
    if (!k || !v) {
        free(k);
        free(v);
        return LLM_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->k[i]) continue;
        size_t j = slot(m->k[i], cap);
        while (k[j]) j = (j + 1) & (cap - 1);
        k[j] = m->k[i];
        v[j] = m->v[i];
    }
    free(m->k);
    free(m->v);
    m->k = k;
    m->v = v;
    m->cap = cap;
    return 0;
}

int cm_idmap_put(cm_idmap *m, uint64_t key, void *val) {
    if (!key) {
        m->zero = val;
        m->has_zero = 1;
        return 0;
    }
    if (2 * (m->n + 1) > m->cap && grow(m)) return LLM_ENOMEM;
    size_t i = slot(key, m->cap);
    while (m->k[i] && m->k[i] != key) i = (i + 1) & (m->cap - 1);
    if (!m->k[i]) m->n++;
    m->k[i] = key;
    m->v[i] = val;
    return 0;
}

void *cm_idmap_get(const cm_idmap *m, uint64_t key) {
    if (!key) return m->has_zero ? m->zero : NULL;
    if (!m->cap) return NULL;
    for (size_t i = slot(key, m->cap); m->k[i]; i = (i + 1) & (m->cap - 1))
        if (m->k[i] == key) return m->v[i];
    return NULL;
}

void *cm_idmap_del(cm_idmap *m, uint64_t key) {
    if (!key) {
        void *v = m->has_zero ? m->zero : NULL;
        m->zero = NULL;
        m->has_zero = 0;
        return v;
    }
    if (!m->cap) return NULL;
    size_t i = slot(key, m->cap);
    while (m->k[i] && m->k[i] != key) i = (i + 1) & (m->cap - 1);
    if (!m->k[i]) return NULL;
    void *val = m->v[i];
    m->k[i] = 0;
    m->n--;
    /* backward shift: pull later entries of the probe chain into the hole */
    for (size_t j = (i + 1) & (m->cap - 1); m->k[j]; j = (j + 1) & (m->cap - 1)) {
        size_t home = slot(m->k[j], m->cap);
        if (((j - home) & (m->cap - 1)) >= ((j - i) & (m->cap - 1))) {
            m->k[i] = m->k[j];
            m->v[i] = m->v[j];
            m->k[j] = 0;
            i = j;
        }
    }
    return val;
}

void cm_idmap_free(cm_idmap *m) {
    free(m->k);
    free(m->v);
    m->k = NULL;
    m->v = NULL;
    m->cap = m->n = 0;
    m->zero = NULL;
    m->has_zero = 0;
}
