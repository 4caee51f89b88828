/* wk_kv.c - the KV cache: paged blocks for the engine (wk_cache) and a
 * single sequence's cache for the tools (wk_kv). */
#include "wk_model.h"
#include "wk_cuda.h"
#include "cm_dtype.h"
#include "cm_quant.h"
#include "cm_hf_quant.h"
#include "cm_error.h"
#include "cm_log.h"
#include "cm_rope.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

size_t wk_kv_bytes_per_token(const wk_model *m, int type) {
    return 2 * (size_t)(m->layer1 - m->layer0) * (size_t)m->n_kv_l * m->cfg.head_dim * kn_kv_elem_bytes(type);
}

int wk_cache_create(const wk_model *m, int type, int block_size, int n_blocks, wk_cache **out) {
    *out = NULL;
    if (type < KN_KV_F32 || type > KN_KV_BF16) return LLM_EINVAL;
    if (block_size <= 0 || block_size > 4096 || (block_size & (block_size - 1)) || n_blocks <= 0) return LLM_EINVAL;
    wk_cache *c = calloc(1, sizeof *c);
    if (!c) return LLM_ENOMEM;
    c->type = type;
    c->block_size = block_size;
    while ((1 << c->block_shift) < block_size) c->block_shift++;
    c->n_blocks = n_blocks;
    c->n_layer = m->layer1 - m->layer0; /* this pipeline stage's layers */
    c->block_stride = (size_t)block_size * (size_t)m->n_kv_l * m->cfg.head_dim * kn_kv_elem_bytes(type);
    size_t total = c->block_stride * (size_t)n_blocks * (size_t)c->n_layer;
    c->device = m->device == WK_DEV_CUDA;
    int rc = 0;
    if (c->device) {
        rc = wk_cuda_alloc((void **)&c->k, total);
        if (!rc) rc = wk_cuda_alloc((void **)&c->v, total);
    } else {
        c->k = malloc(total);
        c->v = malloc(total);
        rc = c->k && c->v ? 0 : LLM_ENOMEM;
    }
    if (rc) {
        wk_cache_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void wk_cache_free(wk_cache *c) {
    if (!c) return;
    free(c->copies);
    if (c->device) {
        wk_cuda_release(c->k);
        wk_cuda_release(c->v);
    } else {
        free(c->k);
        free(c->v);
    }
    free(c);
}

void wk_cache_copy(wk_cache *c, int src, int dst) {
    if (c->record_copies) {
        if (c->n_copies == c->cap_copies) {
            int cap = c->cap_copies ? 2 * c->cap_copies : 16;
            int32_t *n = realloc(c->copies, sizeof(int32_t) * 2 * (size_t)cap);
            if (n) {
                c->copies = n;
                c->cap_copies = cap;
            }
        }
        if (c->n_copies < c->cap_copies) { /* the other ranks replay it before the next step */
            c->copies[2 * c->n_copies] = src;
            c->copies[2 * c->n_copies + 1] = dst;
            c->n_copies++;
        }
    }
    if (c->device) {
        wk_cuda_cache_copy(c, src, dst);
        return;
    }
    for (int l = 0; l < c->n_layer; l++) {
        size_t base = (size_t)l * (size_t)c->n_blocks * c->block_stride;
        memcpy(c->k + base + (size_t)dst * c->block_stride, c->k + base + (size_t)src * c->block_stride, c->block_stride);
        memcpy(c->v + base + (size_t)dst * c->block_stride, c->v + base + (size_t)src * c->block_stride, c->block_stride);
    }
}

#define KV_PRIVATE_BLOCK 16

int wk_kv_create(const wk_model *m, int ctx, int type, wk_kv **out) {
    *out = NULL;
    if (ctx <= 0 || (uint32_t)ctx > m->cfg.ctx_len) return LLM_ERANGE;
    if (type < KN_KV_F32 || type > KN_KV_BF16) return LLM_EINVAL;
    wk_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return LLM_ENOMEM;
    int nb = (ctx + KV_PRIVATE_BLOCK - 1) / KV_PRIVATE_BLOCK;
    int rc = wk_cache_create(m, type, KV_PRIVATE_BLOCK, nb, &kv->cache);
    kv->blocks = malloc(sizeof(int32_t) * (size_t)nb);
    if (rc || !kv->blocks) {
        wk_kv_free(kv);
        return rc ? rc : LLM_ENOMEM;
    }
    for (int i = 0; i < nb; i++) kv->blocks[i] = i;
    kv->ctx = ctx;
    kv->type = type;
    *out = kv;
    return 0;
}

void wk_kv_free(wk_kv *kv) {
    if (!kv) return;
    wk_cache_free(kv->cache);
    free(kv->blocks);
    free(kv);
}
