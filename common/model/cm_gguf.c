#include "cm_gguf.h"
#include "cm_dtype.h"
#include "cm_error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_MAX_DIMS 4

typedef struct {
    const uint8_t *p;
    size_t size, off;
    char *err;
    size_t errlen;
} rd_t;

static int fail(rd_t *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(rd_t *r, int code, const char *fmt, ...) {
    if (r->err && r->errlen) {
        int n = snprintf(r->err, r->errlen, "at byte %zu: ", r->off);
        va_list ap;
        va_start(ap, fmt);
        if (n >= 0 && (size_t)n < r->errlen) vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return code;
}

static int need(rd_t *r, uint64_t n, const char *what) {
    if (n > r->size - r->off)
        return fail(r, LLM_ETRUNC, "file ends inside %s (%llu bytes needed, %zu left)", what,
                    (unsigned long long)n, r->size - r->off);
    return 0;
}

static int rd_u32(rd_t *r, uint32_t *v, const char *what) {
    int rc = need(r, 4, what);
    if (rc) return rc;
    memcpy(v, r->p + r->off, 4);
    r->off += 4;
    return 0;
}

static int rd_u64(rd_t *r, uint64_t *v, const char *what) {
    int rc = need(r, 8, what);
    if (rc) return rc;
    memcpy(v, r->p + r->off, 8);
    r->off += 8;
    return 0;
}

static int rd_str(rd_t *r, cm_str *s, const char *what) {
    uint64_t len;
    int rc = rd_u64(r, &len, what);
    if (rc) return rc;
    if ((rc = need(r, len, what))) return rc;
    s->ptr = (const char *)r->p + r->off;
    s->len = len;
    r->off += len;
    return 0;
}

static const unsigned scalar_size[CM_GGUF_TYPE_COUNT] = {
    [CM_GGUF_U8] = 1, [CM_GGUF_I8] = 1, [CM_GGUF_U16] = 2, [CM_GGUF_I16] = 2,
    [CM_GGUF_U32] = 4, [CM_GGUF_I32] = 4, [CM_GGUF_F32] = 4, [CM_GGUF_BOOL] = 1,
    [CM_GGUF_U64] = 8, [CM_GGUF_I64] = 8, [CM_GGUF_F64] = 8,
};

/* Reads a scalar of the given type at the cursor into kv's union. */
static int rd_scalar(rd_t *r, int type, cm_gguf_kv *kv) {
    unsigned sz = scalar_size[type];
    int rc = need(r, sz, "a metadata value");
    if (rc) return rc;
    const uint8_t *p = r->p + r->off;
    uint8_t u8; uint16_t u16; uint32_t u32; uint64_t u64; float f32; double f64;
    switch (type) {
    case CM_GGUF_U8: kv->v.u = p[0]; break;
    case CM_GGUF_BOOL:
        if (p[0] > 1) return fail(r, LLM_EFORMAT, "bool value %u is neither 0 nor 1", p[0]);
        kv->v.u = p[0];
        break;
    case CM_GGUF_I8: memcpy(&u8, p, 1); kv->v.i = (int8_t)u8; break;
    case CM_GGUF_U16: memcpy(&u16, p, 2); kv->v.u = u16; break;
    case CM_GGUF_I16: memcpy(&u16, p, 2); kv->v.i = (int16_t)u16; break;
    case CM_GGUF_U32: memcpy(&u32, p, 4); kv->v.u = u32; break;
    case CM_GGUF_I32: memcpy(&u32, p, 4); kv->v.i = (int32_t)u32; break;
    case CM_GGUF_U64: memcpy(&u64, p, 8); kv->v.u = u64; break;
    case CM_GGUF_I64: memcpy(&u64, p, 8); kv->v.i = (int64_t)u64; break;
    case CM_GGUF_F32: memcpy(&f32, p, 4); kv->v.f = f32; break;
    case CM_GGUF_F64: memcpy(&f64, p, 8); kv->v.f = f64; break;
    default: return fail(r, LLM_EFORMAT, "bad scalar type %d", type);
    }
    r->off += sz;
    return 0;
}

static int rd_kv(rd_t *r, cm_gguf_kv *kv) {
    uint32_t type;
    int rc = rd_str(r, &kv->key, "a metadata key");
    if (rc) return rc;
    if (kv->key.len == 0) return fail(r, LLM_EFORMAT, "empty metadata key");
    if ((rc = rd_u32(r, &type, "a metadata type"))) return rc;
    if (type >= CM_GGUF_TYPE_COUNT)
        return fail(r, LLM_EFORMAT, "metadata key '%.*s' has unknown type %u",
                    (int)(kv->key.len > 64 ? 64 : kv->key.len), kv->key.ptr, type);
    kv->type = (int)type;
    if (type == CM_GGUF_STRING) return rd_str(r, &kv->v.s, "a metadata string");
    if (type != CM_GGUF_ARRAY) return rd_scalar(r, (int)type, kv);

    uint32_t et;
    uint64_t n;
    if ((rc = rd_u32(r, &et, "an array type")) || (rc = rd_u64(r, &n, "an array length")))
        return rc;
    if (et >= CM_GGUF_TYPE_COUNT || et == CM_GGUF_ARRAY)
        return fail(r, LLM_EFORMAT, "array '%.*s' has unsupported element type %u",
                    (int)(kv->key.len > 64 ? 64 : kv->key.len), kv->key.ptr, et);
    kv->v.arr.type = (int)et;
    kv->v.arr.n = n;
    kv->v.arr.data = r->p + r->off;
    if (et == CM_GGUF_STRING) {
        /* each element is at least its 8-byte length: bound n before walking */
        if (n > (r->size - r->off) / 8)
            return fail(r, LLM_ETRUNC, "string array of %llu elements cannot fit in the file",
                        (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            cm_str s;
            if ((rc = rd_str(r, &s, "a string array element"))) return rc;
        }
        return 0;
    }
    uint64_t es = scalar_size[et];
    if (n > (r->size - r->off) / es)
        return fail(r, LLM_ETRUNC, "array of %llu elements of %llu bytes runs past the end",
                    (unsigned long long)n, (unsigned long long)es);
    r->off += n * es;
    return 0;
}

static int rd_tensor(rd_t *r, cm_gguf_tensor *t) {
    int rc = rd_str(r, &t->name, "a tensor name");
    if (rc) return rc;
    if (t->name.len == 0 || t->name.len > 256)
        return fail(r, LLM_EFORMAT, "tensor name length %llu is not in 1..256",
                    (unsigned long long)t->name.len);
    if ((rc = rd_u32(r, &t->n_dims, "tensor dims"))) return rc;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return fail(r, LLM_EFORMAT, "tensor '%.*s' has %u dims (1..4 allowed)", (int)t->name.len,
                    t->name.ptr, t->n_dims);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if ((rc = rd_u64(r, &t->ne[d], "tensor shape"))) return rc;
        if (t->ne[d] == 0 || t->ne[d] > (1ull << 40) || nel > (UINT64_MAX >> 1) / t->ne[d])
            return fail(r, LLM_EFORMAT, "tensor '%.*s' has bad dimension %llu", (int)t->name.len,
                        t->name.ptr, (unsigned long long)t->ne[d]);
        nel *= t->ne[d];
    }
    uint32_t type;
    if ((rc = rd_u32(r, &type, "tensor type")) || (rc = rd_u64(r, &t->offset, "tensor offset")))
        return rc;
    t->type = (int)type;
    size_t blk = cm_dtype_block((int)type);
    if (!blk)
        return fail(r, LLM_EUNSUP, "tensor '%.*s' has unsupported type %u", (int)t->name.len,
                    t->name.ptr, type);
    if (t->ne[0] % blk)
        return fail(r, LLM_EFORMAT, "tensor '%.*s': row of %llu is not a multiple of the %s block %zu",
                    (int)t->name.len, t->name.ptr, (unsigned long long)t->ne[0],
                    cm_dtype_name((int)type), blk);
    uint64_t rows = nel / t->ne[0];
    uint64_t rb = cm_dtype_row_bytes((int)type, t->ne[0]);
    if (rows > UINT64_MAX / rb)
        return fail(r, LLM_EFORMAT, "tensor '%.*s' is too large", (int)t->name.len, t->name.ptr);
    t->nbytes = rows * rb;
    return 0;
}

/* Tensor names are unique: a hash set over them, linear in the count (a
 * pairwise check took 24 s on 100,000 tiny tensors). */
static int check_unique(rd_t *r, const cm_gguf *g) {
    if (g->n_tensors < 2) return 0;
    uint64_t cap = 16;
    while (cap < g->n_tensors * 2) cap <<= 1;
    uint64_t *set = calloc(cap, sizeof *set); /* index + 1, 0 = empty */
    if (!set) return fail(r, LLM_ENOMEM, "out of memory checking %llu tensor names", (unsigned long long)g->n_tensors);
    int rc = 0;
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) {
        const cm_str *n = &g->tensors[i].name;
        uint64_t h = XXH3_64bits(n->ptr, n->len) & (cap - 1);
        for (;; h = (h + 1) & (cap - 1)) {
            if (!set[h]) {
                set[h] = i + 1;
                break;
            }
            const cm_str *o = &g->tensors[set[h] - 1].name;
            if (o->len == n->len && !memcmp(o->ptr, n->ptr, n->len)) {
                rc = fail(r, LLM_EFORMAT, "duplicate tensor name '%.*s'", (int)n->len, n->ptr);
                break;
            }
        }
    }
    free(set);
    return rc;
}

static int parse(rd_t *r, cm_gguf *g) {
    uint32_t magic;
    int rc;
    if ((rc = rd_u32(r, &magic, "the magic"))) return rc;
    if (magic != GGUF_MAGIC) {
        r->off = 0;
        return fail(r, LLM_EFORMAT, "not a GGUF file (magic %08x)", magic);
    }
    if ((rc = rd_u32(r, &g->version, "the version"))) return rc;
    if (g->version != 2 && g->version != 3) {
        if (g->version == 1) return fail(r, LLM_EUNSUP, "GGUF version 1 is not supported");
        return fail(r, LLM_EUNSUP, "GGUF version %u is not supported (big-endian file?)",
                    g->version);
    }
    if ((rc = rd_u64(r, &g->n_tensors, "the tensor count")) ||
        (rc = rd_u64(r, &g->n_kv, "the metadata count")))
        return rc;
    /* a kv is at least 8+1+4+1 bytes and a tensor info 8+1+4+8+4+8: bound the
     * counts by the file size before allocating anything */
    if (g->n_kv > (r->size - r->off) / 14)
        return fail(r, LLM_EFORMAT, "metadata count %llu cannot fit in the file",
                    (unsigned long long)g->n_kv);
    if (g->n_tensors > (r->size - r->off) / 33)
        return fail(r, LLM_EFORMAT, "tensor count %llu cannot fit in the file",
                    (unsigned long long)g->n_tensors);
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return fail(r, LLM_ENOMEM, "out of memory");
    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((rc = rd_kv(r, &g->kv[i]))) return rc;
    g->alignment = 32;
    const cm_gguf_kv *al = cm_gguf_find(g, "general.alignment");
    if (al) {
        if (al->type != CM_GGUF_U32 || al->v.u == 0 || (al->v.u & (al->v.u - 1)) || al->v.u > 65536)
            return fail(r, LLM_EFORMAT, "general.alignment must be a power of two u32 <= 65536");
        g->alignment = al->v.u;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((rc = rd_tensor(r, &g->tensors[i]))) return rc;
    uint64_t data = (r->off + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors && data > r->size) {
        r->off = r->size;
        return fail(r, LLM_ETRUNC, "file ends before its tensor data");
    }
    g->data_offset = data;
    uint64_t avail = data <= r->size ? r->size - data : 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        cm_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment)
            return fail(r, LLM_EFORMAT, "tensor '%.*s' offset %llu is not aligned to %llu",
                        (int)t->name.len, t->name.ptr, (unsigned long long)t->offset,
                        (unsigned long long)g->alignment);
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return fail(r, LLM_ETRUNC,
                        "tensor '%.*s' (%llu bytes at data offset %llu) runs past the end of the "
                        "file (%llu data bytes)",
                        (int)t->name.len, t->name.ptr, (unsigned long long)t->nbytes,
                        (unsigned long long)t->offset, (unsigned long long)avail);
        t->data = g->base + data + t->offset;
    }
    return check_unique(r, g);
}

int cm_gguf_open_mem(const void *data, size_t size, cm_gguf **out, char *err, size_t errlen) {
    *out = NULL;
    cm_gguf *g = calloc(1, sizeof *g);
    if (!g) return LLM_ENOMEM;
    g->base = data;
    g->size = size;
    rd_t r = {.p = data, .size = size, .err = err, .errlen = errlen};
    int rc = parse(&r, g);
    if (rc) {
        cm_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

int cm_map_file(const char *path, size_t min_size, void **map, size_t *size, char *err, size_t errlen) {
    *map = NULL;
    *size = 0;
    /* O_NONBLOCK: open() of a FIFO with no writer would wait forever */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (err) snprintf(err, errlen, "cannot open: %s", strerror(errno));
        return LLM_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (err) snprintf(err, errlen, "not a regular file");
        close(fd);
        return LLM_EIO;
    }
    if ((uint64_t)st.st_size < min_size || st.st_size == 0) {
        if (err) snprintf(err, errlen, "file of %lld bytes is too short", (long long)st.st_size);
        close(fd);
        return LLM_ETRUNC;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        if (err) snprintf(err, errlen, "mmap failed: %s", strerror(errno));
        return LLM_EIO;
    }
    *map = p;
    *size = (size_t)st.st_size;
    return 0;
}

int cm_gguf_open_mapped(void *map, size_t size, cm_gguf **out, char *err, size_t errlen) {
    int rc = cm_gguf_open_mem(map, size, out, err, errlen);
    if (rc) {
        munmap(map, size);
        return rc;
    }
    (*out)->mapped = 1;
    return 0;
}

int cm_gguf_open(const char *path, cm_gguf **out, char *err, size_t errlen) {
    *out = NULL;
    void *p;
    size_t n;
    char e[400] = "";
    int rc = cm_map_file(path, 8, &p, &n, e, sizeof e);
    if (!rc) rc = cm_gguf_open_mapped(p, n, out, e, sizeof e);
    if (rc && err) snprintf(err, errlen, "%s: %s", path, e);
    return rc;
}

void cm_gguf_close(cm_gguf *g) {
    if (!g) return;
    if (g->mapped) munmap((void *)g->base, g->size);
    free(g->kv);
    free(g->tensors);
    free(g);
}

int cm_str_eq(cm_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

const cm_gguf_kv *cm_gguf_find(const cm_gguf *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key.ptr && cm_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const cm_gguf_tensor *cm_gguf_find_tensor(const cm_gguf *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (cm_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

static int is_unsigned(int t) {
    return t == CM_GGUF_U8 || t == CM_GGUF_U16 || t == CM_GGUF_U32 || t == CM_GGUF_U64;
}
static int is_signed(int t) {
    return t == CM_GGUF_I8 || t == CM_GGUF_I16 || t == CM_GGUF_I32 || t == CM_GGUF_I64;
}

int cm_gguf_get_u64(const cm_gguf *g, const char *key, uint64_t *out) {
    const cm_gguf_kv *kv = cm_gguf_find(g, key);
    if (!kv) return LLM_ENOTFOUND;
    if (is_unsigned(kv->type)) *out = kv->v.u;
    else if (is_signed(kv->type) && kv->v.i >= 0) *out = (uint64_t)kv->v.i;
    else return LLM_EFORMAT;
    return 0;
}

int cm_gguf_get_u32(const cm_gguf *g, const char *key, uint32_t *out) {
    uint64_t v;
    int rc = cm_gguf_get_u64(g, key, &v);
    if (rc) return rc;
    if (v > UINT32_MAX) return LLM_EFORMAT;
    *out = (uint32_t)v;
    return 0;
}

int cm_gguf_get_f32(const cm_gguf *g, const char *key, float *out) {
    const cm_gguf_kv *kv = cm_gguf_find(g, key);
    if (!kv) return LLM_ENOTFOUND;
    if (kv->type == CM_GGUF_F32 || kv->type == CM_GGUF_F64) *out = (float)kv->v.f;
    else if (is_unsigned(kv->type)) *out = (float)kv->v.u;
    else if (is_signed(kv->type)) *out = (float)kv->v.i;
    else return LLM_EFORMAT;
    return 0;
}

int cm_gguf_get_bool(const cm_gguf *g, const char *key, int *out) {
    const cm_gguf_kv *kv = cm_gguf_find(g, key);
    if (!kv) return LLM_ENOTFOUND;
    if (kv->type != CM_GGUF_BOOL) return LLM_EFORMAT;
    *out = (int)kv->v.u;
    return 0;
}

int cm_gguf_get_str(const cm_gguf *g, const char *key, cm_str *out) {
    const cm_gguf_kv *kv = cm_gguf_find(g, key);
    if (!kv) return LLM_ENOTFOUND;
    if (kv->type != CM_GGUF_STRING) return LLM_EFORMAT;
    *out = kv->v.s;
    return 0;
}

int cm_gguf_get_arr(const cm_gguf *g, const char *key, int *type, uint64_t *n, const void **data) {
    const cm_gguf_kv *kv = cm_gguf_find(g, key);
    if (!kv) return LLM_ENOTFOUND;
    if (kv->type != CM_GGUF_ARRAY) return LLM_EFORMAT;
    *type = kv->v.arr.type;
    *n = kv->v.arr.n;
    *data = kv->v.arr.data;
    return 0;
}

int cm_gguf_arr_strings(const cm_gguf_kv *kv, cm_str **out) {
    if (kv->type != CM_GGUF_ARRAY || kv->v.arr.type != CM_GGUF_STRING) return LLM_EFORMAT;
    cm_str *s = malloc((kv->v.arr.n ? kv->v.arr.n : 1) * sizeof *s);
    if (!s) return LLM_ENOMEM;
    const uint8_t *p = kv->v.arr.data; /* bounds were validated at open */
    for (uint64_t i = 0; i < kv->v.arr.n; i++) {
        uint64_t len;
        memcpy(&len, p, 8);
        s[i].ptr = (const char *)p + 8;
        s[i].len = len;
        p += 8 + len;
    }
    *out = s;
    return 0;
}
