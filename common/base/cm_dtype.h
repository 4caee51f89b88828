/* cm_dtype.h - tensor element types, numbered as GGUF numbers them, and the
 * half-precision conversions every module uses. */
#ifndef CM_DTYPE_H
#define CM_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum cm_dtype {
    CM_F32 = 0, CM_F16 = 1, CM_Q4_0 = 2, CM_Q4_1 = 3, CM_Q5_0 = 6, CM_Q5_1 = 7,
    CM_Q8_0 = 8, CM_Q8_1 = 9, CM_Q2_K = 10, CM_Q3_K = 11, CM_Q4_K = 12, CM_Q5_K = 13,
    CM_Q6_K = 14, CM_Q8_K = 15, CM_I8 = 24, CM_I16 = 25, CM_I32 = 26, CM_I64 = 27,
    CM_F64 = 28, CM_BF16 = 30, CM_MXFP4 = 39,
    CM_DTYPE_COUNT = 40
};

/* GGUF block layouts (32 elements per block). */
#define CM_QK 32
typedef struct { uint16_t d; uint8_t qs[16]; } cm_block_q4_0;              /* w = d*(q-8) */
typedef struct { uint16_t d, m; uint8_t qs[16]; } cm_block_q4_1;           /* w = d*q + m */
typedef struct { uint16_t d; int8_t qs[32]; } cm_block_q8_0;               /* w = d*q */
/* qs[j] holds element j in its low nibble and element j+16 in its high one. */

/* Elements per block and bytes per block; block size 0 means unknown type. */
size_t cm_dtype_block(int type);
size_t cm_dtype_block_bytes(int type);
const char *cm_dtype_name(int type);
/* Bytes of a row of n elements, or 0 if n is not a multiple of the block. */
size_t cm_dtype_row_bytes(int type, uint64_t n);

static inline float cm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even. */
static inline uint16_t cm_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t man = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = 1u << (shift - 1), rest = man & ((1u << shift) - 1);
        uint32_t r = man >> shift;
        if (rest > half || (rest == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (uint32_t)(exp << 10) | (man >> 13), rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

static inline float cm_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t cm_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* FP8 E4M3 ("fn": no infinities, +-448 largest, 0x7f / 0xff NaN), as CUDA's
 * __nv_fp8_e4m3 and the FP8 KV cache use it. */
static inline float cm_e4m3_to_f32(uint8_t v) {
    uint32_t e = (v >> 3) & 15, m = v & 7, bits;
    float f;
    if (e == 15 && m == 7) {
        bits = 0x7fc00000u;
    } else if (e == 0) { /* subnormal: m x 2^-9 */
        f = (float)m * (1.f / 512.f);
        return v & 0x80 ? -f : f;
    } else {
        bits = ((e + 127 - 7) << 23) | (m << 20);
    }
    bits |= (uint32_t)(v & 0x80) << 24;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even, saturating at +-448 (infinities too); NaN stays NaN. */
static inline uint8_t cm_f32_to_e4m3(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint8_t s = (uint8_t)((x >> 24) & 0x80);
    x &= 0x7fffffff;
    if (x > 0x7f800000u) return 0x7f;
    if (x >= 0x43e00000u) return s | 0x7e; /* >= 448 */
    if (x < 0x3c800000u) {                 /* below 2^-6: subnormal steps of 2^-9 */
        float a;
        memcpy(&a, &x, 4);
        a *= 512.f;
        uint32_t q = (uint32_t)a;
        float rest = a - (float)q;
        if (rest > 0.5f || (rest == 0.5f && (q & 1))) q++;
        return s | (uint8_t)q; /* q = 8 is exactly 2^-6, the first normal code */
    }
    x += 0x7ffffu + ((x >> 20) & 1); /* round the 23-bit mantissa to 3 bits, ties to even */
    uint32_t e = (x >> 23) - 127 + 7, m = (x >> 20) & 7;
    if (e > 15 || (e == 15 && m == 7)) return s | 0x7e;
    return s | (uint8_t)((e << 3) | m);
}

#endif
