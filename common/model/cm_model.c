/* cm_model.c - the model file object every format fills: its checks, its
 * tensors, its name, its end. The readers are cm_model_gguf.c (GGUF,
 * llama2.c) and cm_hf.c (Hugging Face); cm_model_open.c picks one. */
#include "cm_model.h"

#include "cm_error.h"
#include "cm_safetensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_LAYERS 1024
#define MAX_DIM 65536
#define MAX_VOCAB (1u << 22)

int cm_model_validate_config(const cm_model_config *c, char *err, size_t errlen) {
    if (!c->n_layer || c->n_layer > MAX_LAYERS || !c->dim || c->dim > MAX_DIM || !c->n_head ||
        !c->n_kv_head || !c->hidden || c->hidden > 8 * MAX_DIM || !c->vocab || c->vocab > MAX_VOCAB ||
        !c->head_dim || c->head_dim % 2 || c->head_dim > 1024) {
        snprintf(err, errlen,
                 "implausible hyper-parameters (layers %u, dim %u, heads %u/%u, head_dim %u, ffn %u, "
                 "vocab %u)",
                 c->n_layer, c->dim, c->n_head, c->n_kv_head, c->head_dim, c->hidden, c->vocab);
        return LLM_EFORMAT;
    }
    if (c->n_head % c->n_kv_head) {
        snprintf(err, errlen, "%u heads is not a multiple of %u KV heads", c->n_head, c->n_kv_head);
        return LLM_EFORMAT;
    }
    if (c->rope_dim > c->head_dim || c->rope_dim % 2) {
        snprintf(err, errlen, "rope dimension %u does not fit head dimension %u", c->rope_dim,
                 c->head_dim);
        return LLM_EFORMAT;
    }
    if (c->n_expert > 1024 || c->n_expert_used > c->n_expert || (c->n_expert && !c->n_expert_used)) {
        snprintf(err, errlen, "implausible experts: %u used of %u", c->n_expert_used, c->n_expert);
        return LLM_EFORMAT;
    }
    if (!(c->norm_eps > 0 && c->norm_eps < 1) || !(c->rope_theta > 0)) {
        snprintf(err, errlen, "bad norm epsilon %g or rope theta %g", c->norm_eps, c->rope_theta);
        return LLM_EFORMAT;
    }
    return 0;
}

void cm_model_served_name(const char *model_path, const char *dummy_config, char *out, size_t len) {
    const char *p = dummy_config ? dummy_config : model_path;
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--; /* a directory given as DIR/ is named DIR */
    const char *base = p + n;
    while (base > p && base[-1] != '/') base--;
    snprintf(out, len, "%s%.*s", dummy_config ? "dummy-" : "", (int)(p + n - base), base);
    char *dot = strrchr(out, '.');
    if (!dummy_config && dot && !strcmp(dot, ".gguf")) *dot = 0;
}

void cm_model_close(cm_model_file *m) {
    if (!m) return;
    cm_gguf_close(m->gguf);
    for (int i = 0; i < m->n_st; i++) cm_st_close(m->st[i]);
    free(m->st);
    if (m->map && !m->map_borrowed) munmap(m->map, m->map_size);
    free(m->owned);
    for (int i = 0; i < m->n_bufs; i++) free(m->bufs[i]);
    free(m->bufs);
    free(m->tensors);
    free(m);
}

const cm_tensor_ref *cm_model_tensor(const cm_model_file *m, const char *name) {
    for (size_t i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) {
            m->tensors[i].used = 1;
            return &m->tensors[i];
        }
    return NULL;
}

const char *cm_model_unused_tensor(const cm_model_file *m) {
    for (size_t i = 0; i < m->n_tensors; i++)
        if (!m->tensors[i].used) return m->tensors[i].name;
    return NULL;
}

int cm_model_tensor_expect(const cm_model_file *m, const char *name, uint64_t ne0, uint64_t ne1,
                           const cm_tensor_ref **out, char *err, size_t errlen) {
    const cm_tensor_ref *t = cm_model_tensor(m, name);
    if (!t) {
        snprintf(err, errlen, "%s: tensor '%s' is missing", m->path, name);
        return LLM_ENOTFOUND;
    }
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1) {
        snprintf(err, errlen, "%s: tensor '%s' has shape [%" PRIu64 ", %" PRIu64 "], expected [%" PRIu64
                 ", %" PRIu64 "]", m->path, name, t->ne[0], t->ne[1], ne0, ne1);
        return LLM_EFORMAT;
    }
    *out = t;
    return 0;
}
