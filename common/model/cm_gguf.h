/* cm_gguf.h - GGUF v2/v3 reader over a read-only mapping.
 *
 * Every length, count and offset in the file is checked against the end of
 * the mapping before it is used, so a truncated, corrupt or hostile file is
 * refused with a message (file offset and what was wrong) and never read past
 * its end. Strings and arrays point into the mapping: they live as long as
 * the cm_gguf. Strings are NOT NUL-terminated; use (ptr, len). */
#ifndef CM_GGUF_H
#define CM_GGUF_H

#include <stddef.h>
#include <stdint.h>

enum cm_gguf_type {
    CM_GGUF_U8 = 0, CM_GGUF_I8, CM_GGUF_U16, CM_GGUF_I16, CM_GGUF_U32, CM_GGUF_I32,
    CM_GGUF_F32, CM_GGUF_BOOL, CM_GGUF_STRING, CM_GGUF_ARRAY, CM_GGUF_U64, CM_GGUF_I64,
    CM_GGUF_F64, CM_GGUF_TYPE_COUNT
};

typedef struct { const char *ptr; uint64_t len; } cm_str;

typedef struct {
    cm_str key;
    int type;            /* enum cm_gguf_type */
    union {
        uint64_t u;      /* unsigned integers and bool */
        int64_t i;       /* signed integers */
        double f;        /* floats */
        cm_str s;
        struct {
            int type;            /* element type (never ARRAY: nested arrays are refused) */
            uint64_t n;
            const uint8_t *data; /* packed little-endian elements; for STRING, n (u64 len, bytes) records */
        } arr;
    } v;
} cm_gguf_kv;

typedef struct {
    cm_str name;
    uint32_t n_dims;
    uint64_t ne[4];      /* ne[0] is the contiguous (row) dimension */
    int type;            /* enum cm_dtype */
    uint64_t offset;     /* from the start of the data section */
    uint64_t nbytes;
    const void *data;    /* inside the mapping */
} cm_gguf_tensor;

typedef struct cm_gguf {
    const uint8_t *base; /* mapping */
    size_t size;
    int mapped;          /* 1: munmap on close; 0: caller's memory */
    uint32_t version;
    uint64_t n_kv, n_tensors;
    cm_gguf_kv *kv;
    cm_gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset;
} cm_gguf;

/* Maps and parses a file. On failure returns an LLM_E* code and, if err is
 * non-NULL, writes one line that names the file and says what and where. */
int cm_gguf_open(const char *path, cm_gguf **out, char *err, size_t errlen);
/* Maps a whole regular file read-only. A FIFO, device or directory is
 * refused without blocking (opened O_NONBLOCK, checked with fstat); so is a
 * file shorter than min_size. err does not name the file. */
int cm_map_file(const char *path, size_t min_size, void **map, size_t *size, char *err, size_t errlen);
/* cm_gguf_open_mem over a cm_map_file mapping, which the result then owns
 * (unmapped on close, and on failure). */
int cm_gguf_open_mapped(void *map, size_t size, cm_gguf **out, char *err, size_t errlen);
/* Same over caller-owned memory (tests, fuzzing); data must outlive the result. */
int cm_gguf_open_mem(const void *data, size_t size, cm_gguf **out, char *err, size_t errlen);
void cm_gguf_close(cm_gguf *g);

/* Lookups return NULL when the key/tensor is absent. */
const cm_gguf_kv *cm_gguf_find(const cm_gguf *g, const char *key);
const cm_gguf_tensor *cm_gguf_find_tensor(const cm_gguf *g, const char *name);
/* Typed getters: 0, LLM_ENOTFOUND (absent; *out untouched) or LLM_EFORMAT
 * (present with a type that cannot convert). Integers accept any integer type
 * that fits. */
int cm_gguf_get_u64(const cm_gguf *g, const char *key, uint64_t *out);
int cm_gguf_get_u32(const cm_gguf *g, const char *key, uint32_t *out);
int cm_gguf_get_f32(const cm_gguf *g, const char *key, float *out);
int cm_gguf_get_bool(const cm_gguf *g, const char *key, int *out);
int cm_gguf_get_str(const cm_gguf *g, const char *key, cm_str *out);
/* Array accessor: element type and count; string arrays are walked with
 * cm_gguf_arr_strings. */
int cm_gguf_get_arr(const cm_gguf *g, const char *key, int *type, uint64_t *n, const void **data);
/* Splits a validated string array into n cm_str (caller frees the array). */
int cm_gguf_arr_strings(const cm_gguf_kv *kv, cm_str **out);
int cm_str_eq(cm_str s, const char *c);

#endif
