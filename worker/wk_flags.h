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
    WK_F_MAX_STEP_MS,
    WK_F_SPEC_CONFIG,
    WK_F_SPEC_K,
    WK_F_SPEC_NMAX,
    WK_F_SPEC_NMIN,
    WK_F_SPEC_MAX_BATCH,
    WK_F_OFFLOAD_SIZE,
    WK_F_OFFLOAD_DIR,
    WK_F_OFFLOAD_DISK,
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
    {"kv-cache-dtype", required_argument, 0, WK_F_KV_DTYPE},                                       \
    {"max-step-ms", required_argument, 0, WK_F_MAX_STEP_MS},                                       \
    {"speculative-config", required_argument, 0, WK_F_SPEC_CONFIG},                               \
    {"num-speculative-tokens", required_argument, 0, WK_F_SPEC_K},                                \
    {"ngram-prompt-lookup-max", required_argument, 0, WK_F_SPEC_NMAX},                            \
    {"ngram-prompt-lookup-min", required_argument, 0, WK_F_SPEC_NMIN},                            \
    {"speculative-disable-by-batch-size", required_argument, 0, WK_F_SPEC_MAX_BATCH},             \
    {"kv-offloading-size", required_argument, 0, WK_F_OFFLOAD_SIZE},                              \
    {"kv-offloading-dir", required_argument, 0, WK_F_OFFLOAD_DIR},                                \
    {"kv-offloading-disk-size", required_argument, 0, WK_F_OFFLOAD_DISK}

#define WK_ENGINE_FLAGS_HELP                                                                       \
    "engine:\n"                                                                                    \
    "  --max-num-seqs N            sequences in one step (default 256)\n"                          \
    "  --max-num-batched-tokens N  token budget of one step; prompts are prefilled in chunks\n"   \
    "                              of what is left after decodes (default 512)\n"                 \
    "  --max-step-ms MS            a step's time target: prefill chunks are sized to it at the\n"  \
    "                              measured cost per token; decodes always advance (default 250;\n" \
    "                              a kv_producer: only steps that decode; 0: tokens only)\n"      \
    "  --max-model-len N           longest prompt + completion (default: the model's context)\n"   \
    "  --block-size N              KV block size in tokens, a power of two (default 16)\n"        \
    "  --kv-cache-memory SIZE      KV cache on the CPU: bytes, or with K/M/G/KiB/MiB/GiB\n"        \
    "                              (default 4GiB, capped at what max-num-seqs full sequences use)\n" \
    "  --gpu-memory-utilization F  GPU share for weights + activations + KV (CUDA backend)\n"     \
    "  --enable-prefix-caching     reuse the K/V of repeated prefixes (default on)\n"            \
    "  --no-enable-prefix-caching\n"                                                             \
    "  --kv-cache-dtype T          auto|f16|bf16|f32|fp8 (default auto = f16; fp8: E4M3, half of f16)\n"   \
    "  --kv-offloading-size SIZE   a host-memory tier under the KV cache: blocks the cache evicts\n" \
    "                              are kept there and a prefix found there is loaded back, not\n"  \
    "                              recomputed. A number is GiB (vLLM's); or bytes with K/M/G/KiB/\n"  \
    "                              MiB/GiB (default 0: none)\n"                                    \
    "  --kv-offloading-dir DIR     a disk tier under that (or under the cache): one checksummed\n"  \
    "                              file per block in DIR/<model fingerprint>/, kept across\n"     \
    "                              restarts; a bad file is dropped, never served (default none)\n" \
    "  --kv-offloading-disk-size SIZE  the disk tier's bound (default 16GiB)\n"                \
    "  --speculative-config JSON   speculative decoding, vLLM's spelling: {\"method\": \"ngram\",\n"        \
    "                              \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4,\n"           \
    "                              \"prompt_lookup_min\": 1, \"disable_by_batch_size\": 0} (default off),\n" \
    "                              or {\"method\": \"draft_model\", \"model\": PATH, ...}: a smaller model\n"    \
    "                              with the same tokenizer (with --load-format dummy: its shape);\n"        \
    "                              \"cost_rule\": false speculates even where it cannot pay\n"              \
    "  --num-speculative-tokens K  the same, prompt-lookup (n-gram) drafts of up to K tokens\n"         \
    "  --ngram-prompt-lookup-max N, --ngram-prompt-lookup-min M   n-gram lengths matched (4, 1)\n"     \
    "  --speculative-disable-by-batch-size B   never speculate while more than B sequences decode\n"  \
    "                              (default 0: no cap; a sequence speculates while its acceptance\n"  \
    "                              beats the step's measured compute share)\n"

/* The model's device (--device cpu|cuda) and weights without a checkpoint,
 * spelled as vLLM does: --load-format dummy --model-config
 * PRESET|config.json [--dtype T]. Codes from
 * WK_MODEL_FLAG_BASE go to wk_model_flag (check them before engine flags),
 * then wk_model_flags_apply fills the model options. */
enum { WK_MODEL_FLAG_BASE = 0x2000, WK_M_LOAD_FORMAT = WK_MODEL_FLAG_BASE, WK_M_CONFIG, WK_M_DTYPE, WK_M_SEED, WK_M_DEVICE, WK_M_QUANT,
       WK_M_ROPE, WK_M_EP, WK_M_LORA_ON, WK_M_LORA, WK_M_MAX_LORAS, WK_M_LORA_RANK };

#define WK_MAX_LORA_MODULES 64

#define WK_MODEL_LONGOPTS                                                                          \
    {"load-format", required_argument, 0, WK_M_LOAD_FORMAT},                                       \
    {"model-config", required_argument, 0, WK_M_CONFIG},                                          \
    {"dtype", required_argument, 0, WK_M_DTYPE},                                                   \
    {"dummy-seed", required_argument, 0, WK_M_SEED},                                               \
    {"device", required_argument, 0, WK_M_DEVICE},                                                 \
    {"quantization", required_argument, 0, WK_M_QUANT},                                            \
    {"rope-scaling", required_argument, 0, WK_M_ROPE},                                             \
    {"enable-expert-parallel", no_argument, 0, WK_M_EP},                                           \
    {"enable-lora", no_argument, 0, WK_M_LORA_ON},                                                 \
    {"lora-modules", required_argument, 0, WK_M_LORA},                                            \
    {"max-loras", required_argument, 0, WK_M_MAX_LORAS},                                          \
    {"max-lora-rank", required_argument, 0, WK_M_LORA_RANK}

#define WK_MODEL_FLAGS_HELP                                                                        \
    "model:\n"                                                                                     \
    "  --device cpu|cuda           where the forward pass runs (default cpu)\n"                     \
    "  --quantization fp8          FP8 E4M3 weights (per-channel scales) and activations (CUDA)\n"   \
    "  --quantization awq|gptq     insist the checkpoint is AWQ / GPTQ (read from config.json anyway)\n" \
    "  --rope-scaling JSON         RoPE scaling for a model that has none, as config.json's rope_scaling\n" \
    "                              ({\"rope_type\":\"yarn\",\"factor\":4,...}; linear, dynamic, yarn, llama3):\n" \
    "                              the context grows as vLLM derives it\n" \
    "  --enable-expert-parallel    a mixture of experts' experts whole on each rank of the tensor-parallel\n" \
    "                              group, a share each (default: every expert's FFN columns split, as\n" \
    "                              a dense FFN's); attention stays tensor parallel\n" \
    "  --enable-lora               serve LoRA adapters (with --lora-modules)\n"                     \
    "  --lora-modules NAME=PATH    a PEFT adapter directory served as model NAME; repeat the flag or\n" \
    "                              separate with commas. Requests of different adapters and of the base\n" \
    "                              model share each batch\n"                                        \
    "  --max-loras N               adapters held at once (default 8; all are loaded at start)\n"    \
    "  --max-lora-rank N           the highest adapter rank accepted (default 16, at most 512)\n"   \
    "weights without a checkpoint (benchmarks):\n"                                                 \
    "  --load-format auto|dummy    dummy: random weights of --model-config's shape (default auto)\n" \
    "  --model-config SPEC         a preset (llama-2-7b, llama-3-8b, llama-3-70b, llama-3.1-8b,\n"  \
    "                              llama-3.3-70b, mistral-7b, mixtral-8x7b, qwen2-7b, qwen2.5-7b,\n" \
    "                              qwen3-8b, qwen3-32b, qwen3-30b-a3b, gpt-oss-20b, gpt-oss-120b,\n" \
    "                              smollm2-135m) or a\n"                                          \
    "                              config.json path (gpt_oss, llama, mistral, mixtral, qwen2, qwen3,\n" \
    "                              qwen3_moe)\n"                                                    \
    "  --dtype T                   dummy weight type: f16 (default), bf16, f32, q8_0, q4_0, q4_1, q4_k, q6_k\n" \
    "  --dummy-seed N              seed of the dummy weights (default 0)\n"

typedef struct {
    int dummy;
    const char *config;
    int dtype, dtype_set;                /* cm_dtype when dtype_set, else F16 */
    uint64_t seed;
    int device;                          /* WK_DEV_* */
    int quant;                           /* WK_QUANT_* */
    const char *rope_scaling;            /* --rope-scaling JSON */
    int expert_parallel;                 /* --enable-expert-parallel */
    int lora_on, max_loras, max_lora_rank;
    const char *lora_modules[WK_MAX_LORA_MODULES]; /* "NAME=PATH" */
    int n_lora_modules;
    char lora_buf[4096];                 /* the comma-separated lists, split */
    size_t lora_used;
} wk_load_flags;

/* 0 when applied, LLM_EINVAL with a message on stderr for a bad value. */
int wk_model_flag(wk_load_flags *f, int code, const char *arg);
/* Checks the combination (dummy needs a config, a config needs dummy) and
 * sets mo's dummy fields. LLM_EINVAL with a message. */
int wk_model_flags_apply(const wk_load_flags *f, wk_model_opts *mo);

/* 0 when applied, LLM_EINVAL with a message on stderr for a bad value. */
int wk_engine_flag(wk_engine_opts *o, int code, const char *arg);
/* --kv-cache-dtype auto|f16|f32|fp8 (fp8_e4m3) -> KN_KV_*; LLM_EINVAL with a message. */
int wk_parse_kv_dtype(const char *s, int *out);
/* "4GiB", "512M", "1073741824" -> bytes. */
int wk_parse_size(const char *s, size_t *out);

#endif
