/* cm_safetensors.h - safetensors reader over a read-only mapping.
 *
 * The format: an 8-byte little-endian header length N, N bytes of JSON (an
 * object of name -> {"dtype", "shape", "data_offsets": [begin, end]} plus an
 * optional "__metadata__" of strings), then the data buffer. Everything is
 * checked before use, as the GGUF reader checks: N against the file, the JSON
 * (UTF-8, no duplicate names), each dtype, each shape (at most 4 dimensions,
 * no overflow), each byte range against the buffer and against the shape,
 * and the ranges together (they tile the buffer exactly: no gap, no
 * overlap, as the format's own reader demands). A file that fails any check
 * is refused with one line that names the tensor and the problem. */
#ifndef CM_SAFETENSORS_H
#define CM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define CM_ST_MAX_HEADER (100u << 20) /* the format's own reader's limit */

/* Element types beyond enum cm_dtype's (which safetensors shares F32, F16,
 * BF16, F64, I8..I64 with): kept so a file that holds them opens, but no
 * model uses them as weights. */
enum { CM_ST_OTHER = -1 };

typedef struct {
    const char *name;    /* NUL-terminated, owned by the cm_safetensors */
    int type;            /* enum cm_dtype (F32, F16, BF16, F64, I8, I16, I32, I64) or CM_ST_OTHER */
    char dtype[12];      /* as the file spells it ("F32", "U8", "F8_E4M3", ...) */
    uint32_t n_dims;
    uint64_t ne[4];      /* ne[0] contiguous: the file's shape reversed; 1 past n_dims */
    const void *data;    /* inside the mapping */
    uint64_t nbytes;
} cm_st_tensor;

typedef struct cm_safetensors {
    const uint8_t *base; /* the file's bytes */
    size_t size;
    int mapped;          /* 1: munmap on close */
    size_t n_tensors;
    cm_st_tensor *tensors;
    char *names;         /* the tensors' names, packed */
} cm_safetensors;

/* Maps and parses a file; err gets one line that names the file. */
int cm_st_open(const char *path, cm_safetensors **out, char *err, size_t errlen);
/* The same over caller-owned memory (tests, fuzzing), which must outlive the result. */
int cm_st_open_mem(const void *data, size_t size, cm_safetensors **out, char *err, size_t errlen);
void cm_st_close(cm_safetensors *s);
/* NULL when absent. */
const cm_st_tensor *cm_st_find(const cm_safetensors *s, const char *name);

#endif
