#include "cm_safetensors.h"
#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_gguf.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static const struct { const char *name; int type; int bytes; } st_dtypes[] = {
    {"F32", CM_F32, 4},  {"F16", CM_F16, 2},  {"BF16", CM_BF16, 2}, {"F64", CM_F64, 8},
    {"I8", CM_I8, 1},    {"I16", CM_I16, 2},  {"I32", CM_I32, 4},   {"I64", CM_I64, 8},
    {"U8", CM_ST_OTHER, 1}, {"U16", CM_ST_OTHER, 2}, {"U32", CM_ST_OTHER, 4}, {"U64", CM_ST_OTHER, 8},
    {"BOOL", CM_ST_OTHER, 1}, {"F8_E4M3", CM_ST_OTHER, 1}, {"F8_E5M2", CM_ST_OTHER, 1},
};

static int cmp_begin(const void *a, const void *b) {
    const cm_st_tensor *x = a, *y = b;
    return x->data < y->data ? -1 : x->data > y->data;
}

/* One entry of the header: checks and fills t (name set by the caller). */
static int parse_entry(const char *name, json_t *v, const uint8_t *buf, uint64_t buf_len, cm_st_tensor *t,
                       char *e, size_t el) {
    if (!json_is_object(v)) {
        snprintf(e, el, "tensor '%s': not an object", name);
        return LLM_EFORMAT;
    }
    const char *dt = json_string_value(json_object_get(v, "dtype"));
    json_t *shape = json_object_get(v, "shape"), *offs = json_object_get(v, "data_offsets");
    if (!dt || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2) {
        snprintf(e, el, "tensor '%s': needs dtype, shape and data_offsets [begin, end]", name);
        return LLM_EFORMAT;
    }
    int bytes = 0;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (!strcmp(dt, st_dtypes[i].name)) {
            t->type = st_dtypes[i].type;
            bytes = st_dtypes[i].bytes;
            snprintf(t->dtype, sizeof t->dtype, "%s", dt);
        }
    if (!bytes) {
        snprintf(e, el, "tensor '%s': unknown dtype '%.16s'", name, dt);
        return LLM_EFORMAT;
    }
    size_t nd = json_array_size(shape);
    if (nd > 4) {
        snprintf(e, el, "tensor '%s': %zu dimensions (at most 4)", name, nd);
        return LLM_EUNSUP;
    }
    t->n_dims = (uint32_t)nd;
    uint64_t count = 1;
    for (int i = 0; i < 4; i++) t->ne[i] = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0) {
            snprintf(e, el, "tensor '%s': shape entry %zu is not a non-negative integer", name, i);
            return LLM_EFORMAT;
        }
        uint64_t n = (uint64_t)json_integer_value(d);
        if (n && count > UINT64_MAX / n / 8) {
            snprintf(e, el, "tensor '%s': shape overflows", name);
            return LLM_EFORMAT;
        }
        count *= n;
        t->ne[nd - 1 - i] = n; /* the last dimension is the contiguous one */
    }
    json_t *b = json_array_get(offs, 0), *en = json_array_get(offs, 1);
    if (!json_is_integer(b) || !json_is_integer(en) || json_integer_value(b) < 0 ||
        json_integer_value(en) < json_integer_value(b)) {
        snprintf(e, el, "tensor '%s': data_offsets are not 0 <= begin <= end", name);
        return LLM_EFORMAT;
    }
    uint64_t begin = (uint64_t)json_integer_value(b), end = (uint64_t)json_integer_value(en);
    if (end > buf_len) {
        snprintf(e, el, "tensor '%s': data [%" PRIu64 ", %" PRIu64 ") runs past the %" PRIu64 "-byte buffer",
                 name, begin, end, buf_len);
        return LLM_ETRUNC;
    }
    if (end - begin != count * (uint64_t)bytes) {
        snprintf(e, el, "tensor '%s': %" PRIu64 " bytes of data for %" PRIu64 " elements of %s", name,
                 end - begin, count, dt);
        return LLM_EFORMAT;
    }
    t->data = buf + begin;
    t->nbytes = end - begin;
    if ((uintptr_t)t->data % (uintptr_t)bytes) {
        snprintf(e, el, "tensor '%s': data at offset %" PRIu64 " is not aligned to its %d-byte elements", name,
                 begin, bytes);
        return LLM_EFORMAT;
    }
    return 0;
}

static int parse(cm_safetensors *s, char *e, size_t el) {
    if (s->size < 8) {
        snprintf(e, el, "file of %zu bytes has no header length", s->size);
        return LLM_ETRUNC;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | s->base[i];
    if (n > CM_ST_MAX_HEADER || n > s->size - 8) {
        snprintf(e, el, "header length %" PRIu64 " does not fit the %zu-byte file (limit %u)", n, s->size,
                 CM_ST_MAX_HEADER);
        return n > CM_ST_MAX_HEADER ? LLM_EFORMAT : LLM_ETRUNC;
    }
    if (n < 2 || s->base[8] != '{') {
        snprintf(e, el, "header is not a JSON object (not a safetensors file)");
        return LLM_EFORMAT;
    }
    json_error_t je;
    json_t *h = json_loadb((const char *)s->base + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!h || !json_is_object(h)) {
        snprintf(e, el, "header is not valid JSON: %s (at byte %d)", h ? "not an object" : je.text,
                 h ? 0 : je.position);
        json_decref(h);
        return LLM_EFORMAT;
    }
    const uint8_t *buf = s->base + 8 + n;
    uint64_t buf_len = s->size - 8 - n;
    size_t cap = json_object_size(h), names_len = 0;
    const char *key;
    json_t *v;
    json_object_foreach(h, key, v) names_len += strlen(key) + 1;
    s->tensors = calloc(cap ? cap : 1, sizeof *s->tensors);
    s->names = malloc(names_len ? names_len : 1);
    if (!s->tensors || !s->names) {
        json_decref(h);
        return LLM_ENOMEM;
    }
    int rc = 0;
    size_t off = 0;
    json_object_foreach(h, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v)) {
                snprintf(e, el, "__metadata__ is not an object");
                rc = LLM_EFORMAT;
                break;
            }
            continue;
        }
        cm_st_tensor *t = &s->tensors[s->n_tensors];
        size_t kl = strlen(key);
        memcpy(s->names + off, key, kl + 1);
        t->name = s->names + off;
        off += kl + 1;
        if ((rc = parse_entry(t->name, v, buf, buf_len, t, e, el))) break;
        s->n_tensors++;
    }
    json_decref(h);
    if (rc) return rc;
    /* The ranges must tile the buffer: sort by start, each begins where the
     * previous ended (empty tensors may sit anywhere on the way). */
    cm_st_tensor *sorted = malloc(sizeof *sorted * (s->n_tensors ? s->n_tensors : 1));
    if (!sorted) return LLM_ENOMEM;
    memcpy(sorted, s->tensors, sizeof *sorted * s->n_tensors);
    qsort(sorted, s->n_tensors, sizeof *sorted, cmp_begin);
    uint64_t at = 0;
    for (size_t i = 0; i < s->n_tensors && !rc; i++) {
        uint64_t b = (uint64_t)((const uint8_t *)sorted[i].data - buf);
        if (b != at && !(sorted[i].nbytes == 0 && b <= at)) {
            snprintf(e, el, "tensor '%s': data starts at %" PRIu64 ", not where the previous ends (%" PRIu64
                     "): %s", sorted[i].name, b, at, b < at ? "overlap" : "gap");
            rc = LLM_EFORMAT;
        }
        if (b + sorted[i].nbytes > at) at = b + sorted[i].nbytes;
    }
    free(sorted);
    if (!rc && at != buf_len) {
        snprintf(e, el, "tensors end at %" PRIu64 " of a %" PRIu64 "-byte buffer", at, buf_len);
        rc = LLM_EFORMAT;
    }
    return rc;
}

int cm_st_open_mem(const void *data, size_t size, cm_safetensors **out, char *err, size_t errlen) {
    *out = NULL;
    cm_safetensors *s = calloc(1, sizeof *s);
    if (!s) return LLM_ENOMEM;
    s->base = data;
    s->size = size;
    char e[400] = "";
    int rc = parse(s, e, sizeof e);
    if (rc) {
        if (err) snprintf(err, errlen, "%s", e);
        cm_st_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

int cm_st_open(const char *path, cm_safetensors **out, char *err, size_t errlen) {
    *out = NULL;
    void *p;
    size_t n;
    char e[400] = "";
    int rc = cm_map_file(path, 8, &p, &n, e, sizeof e);
    if (!rc) {
        rc = cm_st_open_mem(p, n, out, e, sizeof e);
        if (rc) munmap(p, n);
        else (*out)->mapped = 1;
    }
    if (rc && err) snprintf(err, errlen, "%s: %s", path, e);
    return rc;
}

void cm_st_close(cm_safetensors *s) {
    if (!s) return;
    if (s->mapped) munmap((void *)s->base, s->size);
    free(s->tensors);
    free(s->names);
    free(s);
}

const cm_st_tensor *cm_st_find(const cm_safetensors *s, const char *name) {
    for (size_t i = 0; i < s->n_tensors; i++)
        if (!strcmp(s->tensors[i].name, name)) return &s->tensors[i];
    return NULL;
}
