/* wk_flags.h - the engine's command-line flags, shared by `llmserve
 * generate --batch` and `llmserve-worker` so both spell them alike (and as
 * vLLM does). Add WK_ENGINE_LONGOPTS to a getopt_long table and hand every
 * code >= WK_FLAG_BASE to wk_engine_flag. */
#ifndef WK_FLAGS_H
#define WK_FLAGS_H

#include "wk_engine.h"

#include <getopt.h>

enum {
    WK_FLAG_BASE = 0x1000,
    WK_F_MAX_SEQS = WK_FLAG_BASE,
    WK_F_MAX_TOKENS,
    WK_F_MAX_LEN,
    WK_F_BLOCK,
    WK_F_KV_MEM,
    WK_F_GPU_UTIL,
    WK_F_PREFIX_ON,
    WK_F_PREFIX_OFF,
    WK_F_KV_DTYPE,
};

#define WK_ENGINE_LONGOPTS                                                                         \
    {"max-num-seqs", required_argument, 0, WK_F_MAX_SEQS},                                         \
    {"max-num-batched-tokens", required_argument, 0, WK_F_MAX_TOKENS},                             \
    {"max-model-len", required_argument, 0, WK_F_MAX_LEN},                                         \
    {"block-size", required_argument, 0, WK_F_BLOCK},                                              \
    {"kv-cache-memory", required_argument, 0, WK_F_KV_MEM},                                        \
    {"gpu-memory-utilization", required_argument, 0, WK_F_GPU_UTIL},                              \
    {"enable-prefix-caching", no_argument, 0, WK_F_PREFIX_ON},                                     \
    {"no-enable-prefix-caching", no_argument, 0, WK_F_PREFIX_OFF},                                 \
    {"kv-cache-dtype", required_argument, 0, WK_F_KV_DTYPE}

#define WK_ENGINE_FLAGS_HELP                                                                       \
    "engine:\n"                                                                                    \
    "  --max-num-seqs N            sequences in one step (default 256)\n"                          \
    "  --max-num-batched-tokens N  token budget of one step; prompts are prefilled in chunks\n"   \
    "                              of what is left after decodes (default 512)\n"                 \
    "  --max-model-len N           longest prompt + completion (default: the model's context)\n"   \
    "  --block-size N              KV block size in tokens, a power of two (default 16)\n"        \
    "  --kv-cache-memory SIZE      KV cache on the CPU: bytes, or with K/M/G/KiB/MiB/GiB\n"        \
    "                              (default 4GiB, capped at what max-num-seqs full sequences use)\n" \
    "  --gpu-memory-utilization F  GPU share for weights + activations + KV (CUDA backend)\n"     \
    "  --enable-prefix-caching     reuse the K/V of repeated prefixes (default on)\n"            \
    "  --no-enable-prefix-caching\n"                                                             \
    "  --kv-cache-dtype T          auto|f16|f32 (default auto = f16)\n"

/* 0 when applied, LLM_EINVAL with a message on stderr for a bad value. */
int wk_engine_flag(wk_engine_opts *o, int code, const char *arg);
/* "4GiB", "512M", "1073741824" -> bytes. */
int wk_parse_size(const char *s, size_t *out);

#endif
