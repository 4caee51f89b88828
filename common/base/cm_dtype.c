#include "cm_dtype.h"

static const struct { const char *name; unsigned blk, bytes; } dtypes[CM_DTYPE_COUNT] = {
    [CM_F32] = {"F32", 1, 4},       [CM_F16] = {"F16", 1, 2},
    [CM_Q4_0] = {"Q4_0", 32, 18},   [CM_Q4_1] = {"Q4_1", 32, 20},
    [CM_Q5_0] = {"Q5_0", 32, 22},   [CM_Q5_1] = {"Q5_1", 32, 24},
    [CM_Q8_0] = {"Q8_0", 32, 34},   [CM_Q8_1] = {"Q8_1", 32, 36},
    [CM_Q2_K] = {"Q2_K", 256, 84},  [CM_Q3_K] = {"Q3_K", 256, 110},
    [CM_Q4_K] = {"Q4_K", 256, 144}, [CM_Q5_K] = {"Q5_K", 256, 176},
    [CM_Q6_K] = {"Q6_K", 256, 210}, [CM_Q8_K] = {"Q8_K", 256, 292},
    [CM_I8] = {"I8", 1, 1},         [CM_I16] = {"I16", 1, 2},
    [CM_I32] = {"I32", 1, 4},       [CM_I64] = {"I64", 1, 8},
    [CM_F64] = {"F64", 1, 8},       [CM_BF16] = {"BF16", 1, 2},
    [CM_MXFP4] = {"MXFP4", 32, 17},
};

size_t cm_dtype_block(int type) {
    return type >= 0 && type < CM_DTYPE_COUNT ? dtypes[type].blk : 0;
}

size_t cm_dtype_block_bytes(int type) {
    return type >= 0 && type < CM_DTYPE_COUNT ? dtypes[type].bytes : 0;
}

const char *cm_dtype_name(int type) {
    return cm_dtype_block(type) ? dtypes[type].name : "unknown";
}

size_t cm_dtype_row_bytes(int type, uint64_t n) {
    size_t blk = cm_dtype_block(type);
    if (!blk || n % blk) return 0;
    return (size_t)(n / blk) * dtypes[type].bytes;
}
