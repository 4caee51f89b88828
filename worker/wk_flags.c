#include "wk_flags.h"

#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_parse.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int wk_parse_size(const char *s, size_t *out) {
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0)) return LLM_EINVAL;
    double mul = 1;
    if (*end) {
        static const struct { const char *suf; double mul; } sf[] = {
            {"k", 1e3}, {"kb", 1e3}, {"kib", 1024.0}, {"m", 1e6}, {"mb", 1e6}, {"mib", 1048576.0},
            {"g", 1e9}, {"gb", 1e9}, {"gib", 1073741824.0}, {"t", 1e12}, {"tib", 1099511627776.0}};
        size_t i = 0;
        for (; i < sizeof sf / sizeof sf[0]; i++)
            if (!strcasecmp(end, sf[i].suf)) break;
        if (i == sizeof sf / sizeof sf[0]) return LLM_EINVAL;
        mul = sf[i].mul;
    }
    double b = v * mul;
    if (b < 1 || b > 1e18) return LLM_EINVAL;
    *out = (size_t)b;
    return 0;
}

int wk_engine_flag(wk_engine_opts *o, int code, const char *arg) {
    switch (code) {
    case WK_F_MAX_SEQS: return cm_parse_int("--max-num-seqs", arg, 1, 65536, &o->max_num_seqs);
    case WK_F_MAX_STEP_MS: {
        int v;
        if (cm_parse_int("--max-step-ms", arg, 0, 600000, &v)) return LLM_EINVAL;
        o->max_step_ms = (float)v;
        return 0;
    }
    case WK_F_MAX_TOKENS: return cm_parse_int("--max-num-batched-tokens", arg, 1, 1 << 20, &o->max_num_batched_tokens);
    case WK_F_MAX_LEN: return cm_parse_int("--max-model-len", arg, 2, 1 << 24, &o->max_model_len);
    case WK_F_BLOCK:
        if (cm_parse_int("--block-size", arg, 1, 1024, &o->block_size)) return LLM_EINVAL;
        if (o->block_size & (o->block_size - 1)) {
            fprintf(stderr, "llmserve: --block-size must be a power of two, not %d\n", o->block_size);
            return LLM_EINVAL;
        }
        return 0;
    case WK_F_KV_MEM:
        if (wk_parse_size(arg, &o->kv_cache_bytes)) {
            fprintf(stderr, "llmserve: --kv-cache-memory expects a size such as 2GiB or 512MiB, not '%s'\n", arg);
            return LLM_EINVAL;
        }
        return 0;
    case WK_F_GPU_UTIL: {
        char *end;
        double v = strtod(arg, &end);
        if (end == arg || *end || !(v > 0 && v <= 1)) {
            fprintf(stderr, "llmserve: --gpu-memory-utilization expects a fraction in (0, 1], not '%s'\n", arg);
            return LLM_EINVAL;
        }
        o->gpu_memory_utilization = (float)v;
        return 0;
    }
    case WK_F_PREFIX_ON: o->prefix_caching = 1; return 0;
    case WK_F_PREFIX_OFF: o->prefix_caching = 0; return 0;
    case WK_F_KV_DTYPE: return wk_parse_kv_dtype(arg, &o->kv_type);
    case WK_F_SPEC_CONFIG: {
        char err[256];
        if (wk_spec_config_parse(&o->spec, arg, err, sizeof err)) {
            fprintf(stderr, "llmserve: --%s\n", err);
            return LLM_EINVAL;
        }
        return 0;
    }
    case WK_F_SPEC_K:
        if (cm_parse_int("--num-speculative-tokens", arg, 0, WK_SPEC_MAX_K, &o->spec.k)) return LLM_EINVAL;
        o->spec.method = o->spec.k ? WK_SPEC_NGRAM : WK_SPEC_NONE;
        return 0;
    case WK_F_SPEC_NMAX: return cm_parse_int("--ngram-prompt-lookup-max", arg, 1, 64, &o->spec.ngram_max);
    case WK_F_SPEC_NMIN: return cm_parse_int("--ngram-prompt-lookup-min", arg, 1, 64, &o->spec.ngram_min);
    case WK_F_SPEC_MAX_BATCH:
        return cm_parse_int("--speculative-disable-by-batch-size", arg, 0, 65536, &o->spec.max_batch);
    case WK_F_OFFLOAD_SIZE: {
        char *end;
        double gib = strtod(arg, &end);
        if (end != arg && !*end && gib >= 0 && gib <= 1 << 20) { /* a bare number: GiB, as vLLM's flag */
            o->kv_offload_bytes = (size_t)(gib * 1073741824.0);
            return 0;
        }
        if (wk_parse_size(arg, &o->kv_offload_bytes)) {
            fprintf(stderr, "llmserve: --kv-offloading-size expects GiB (8) or a size such as 512MiB, not '%s'\n", arg);
            return LLM_EINVAL;
        }
        return 0;
    }
    case WK_F_OFFLOAD_DIR:
        if (!*arg || strlen(arg) > 400) {
            fprintf(stderr, "llmserve: --kv-offloading-dir expects a directory (at most 400 bytes)\n");
            return LLM_EINVAL;
        }
        o->kv_offload_dir = arg;
        return 0;
    case WK_F_OFFLOAD_DISK:
        if (wk_parse_size(arg, &o->kv_offload_disk_bytes) || !o->kv_offload_disk_bytes) {
            fprintf(stderr, "llmserve: --kv-offloading-disk-size expects a size such as 64GiB, not '%s'\n", arg);
            return LLM_EINVAL;
        }
        return 0;
    default: return LLM_EINVAL;
    }
}

int wk_parse_kv_dtype(const char *s, int *out) {
    if (!strcmp(s, "auto") || !strcmp(s, "f16") || !strcmp(s, "fp16")) *out = KN_KV_F16;
    else if (!strcmp(s, "f32") || !strcmp(s, "fp32")) *out = KN_KV_F32;
    else if (!strcmp(s, "fp8") || !strcmp(s, "fp8_e4m3")) *out = KN_KV_FP8;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *out = KN_KV_BF16;
    else {
        fprintf(stderr, "llmserve: --kv-cache-dtype expects auto|f16|bf16|f32|fp8, not '%s'\n", s);
        return LLM_EINVAL;
    }
    return 0;
}

int wk_model_flag(wk_load_flags *f, int code, const char *arg) {
    switch (code) {
    case WK_M_LOAD_FORMAT:
        if (!strcmp(arg, "auto") || !strcmp(arg, "gguf")) f->dummy = 0;
        else if (!strcmp(arg, "dummy")) f->dummy = 1;
        else {
            fprintf(stderr, "llmserve: --load-format expects auto or dummy, not '%s'\n", arg);
            return LLM_EINVAL;
        }
        return 0;
    case WK_M_CONFIG: f->config = arg; return 0;
    case WK_M_DTYPE: {
        static const struct { const char *name; int type; } t[] = {
            {"auto", 0},         {"f16", CM_F16},     {"float16", CM_F16}, {"half", CM_F16},    {"bf16", CM_BF16},
            {"bfloat16", CM_BF16}, {"f32", CM_F32},   {"float32", CM_F32}, {"float", CM_F32},   {"q8_0", CM_Q8_0},
            {"q4_0", CM_Q4_0},   {"q4_1", CM_Q4_1},   {"q4_k", CM_Q4_K},   {"q6_k", CM_Q6_K}};
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
            if (!strcasecmp(arg, t[i].name)) {
                f->dtype = t[i].type;
                f->dtype_set = i > 0; /* "auto" leaves the default */
                return 0;
            }
        fprintf(stderr, "llmserve: --dtype expects auto, f16, bf16, f32, q8_0, q4_0, q4_1, q4_k or q6_k, not '%s'\n",
                arg);
        return LLM_EINVAL;
    }
    case WK_M_DEVICE:
        if (!strcmp(arg, "cpu")) f->device = WK_DEV_CPU;
        else if (!strcmp(arg, "cuda")) f->device = WK_DEV_CUDA;
        else {
            fprintf(stderr, "llmserve: --device expects cpu or cuda, not '%s'\n", arg);
            return LLM_EINVAL;
        }
        return 0;
    case WK_M_QUANT:
        if (!strcmp(arg, "none") || !strcmp(arg, "auto")) f->quant = WK_QUANT_NONE;
        else if (!strcmp(arg, "fp8")) f->quant = WK_QUANT_FP8;
        else if (!strcmp(arg, "awq")) f->quant = WK_QUANT_AWQ;
        else if (!strcmp(arg, "gptq")) f->quant = WK_QUANT_GPTQ;
        else if (!strcmp(arg, "int8") || !strcmp(arg, "int4")) {
            fprintf(stderr, "llmserve: --quantization %s is not a method: an AWQ or GPTQ checkpoint says its own in "
                            "config.json (or give awq / gptq), a GGUF file its types\n", arg);
            return LLM_EINVAL;
        } else {
            fprintf(stderr, "llmserve: --quantization expects fp8, awq, gptq (or none), not '%s'\n", arg);
            return LLM_EINVAL;
        }
        return 0;
    case WK_M_ROPE: {
        json_error_t je;
        json_t *j = json_loads(arg, 0, &je);
        int ok = json_is_object(j);
        json_decref(j);
        if (!ok) {
            fprintf(stderr, "llmserve: --rope-scaling expects a JSON object as config.json's rope_scaling, not '%s'\n", arg);
            return LLM_EINVAL;
        }
        f->rope_scaling = arg;
        return 0;
    }
    case WK_M_EP:
        f->expert_parallel = 1;
        return 0;
    case WK_M_LORA_ON:
        f->lora_on = 1;
        return 0;
    case WK_M_MAX_LORAS:
    case WK_M_LORA_RANK: {
        char *end;
        long v = strtol(arg, &end, 10);
        int top = code == WK_M_MAX_LORAS ? WK_MAX_LORA_MODULES : 512;
        if (end == arg || *end || v < 1 || v > top) {
            fprintf(stderr, "llmserve: --%s expects an integer from 1 to %d, not '%s'\n",
                    code == WK_M_MAX_LORAS ? "max-loras" : "max-lora-rank", top, arg);
            return LLM_EINVAL;
        }
        *(code == WK_M_MAX_LORAS ? &f->max_loras : &f->max_lora_rank) = (int)v;
        return 0;
    }
    case WK_M_LORA: { /* NAME=PATH[,NAME=PATH...] */
        size_t n = strlen(arg) + 1;
        if (n > sizeof f->lora_buf - f->lora_used) {
            fprintf(stderr, "llmserve: --lora-modules: too long\n");
            return LLM_EINVAL;
        }
        char *s = f->lora_buf + f->lora_used;
        memcpy(s, arg, n);
        f->lora_used += n;
        for (char *save = NULL, *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(t, '=');
            size_t nl = eq ? (size_t)(eq - t) : 0;
            int ok = eq && nl > 0 && nl < 64 && eq[1];
            for (size_t i = 0; ok && i < nl; i++)
                ok = (t[i] >= 'a' && t[i] <= 'z') || (t[i] >= 'A' && t[i] <= 'Z') || (t[i] >= '0' && t[i] <= '9') ||
                     strchr("-_.:", t[i]);
            if (!ok || f->n_lora_modules == WK_MAX_LORA_MODULES) {
                fprintf(stderr, "llmserve: --lora-modules expects NAME=PATH (a name of letters, digits, '-', '_', '.', "
                        "':', under 64 characters), not '%s'\n", t);
                return LLM_EINVAL;
            }
            f->lora_modules[f->n_lora_modules++] = t;
        }
        return 0;
    }
    case WK_M_SEED: {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(arg, &end, 10);
        if (errno || end == arg || *end || arg[0] == '-') {
            fprintf(stderr, "llmserve: --dummy-seed expects a non-negative integer, not '%s'\n", arg);
            return LLM_EINVAL;
        }
        f->seed = v;
        return 0;
    }
    }
    return LLM_EINVAL;
}

int wk_model_flags_apply(const wk_load_flags *f, wk_model_opts *mo) {
    if (f->dummy && !f->config) {
        fprintf(stderr, "llmserve: --load-format dummy needs --model-config PRESET|config.json\n");
        return LLM_EINVAL;
    }
    if (!f->dummy && f->config) {
        fprintf(stderr, "llmserve: --model-config gives the shape of dummy weights: add --load-format dummy\n");
        return LLM_EINVAL;
    }
    mo->model_config = f->dummy ? f->config : NULL;
    mo->dummy_type = f->dtype_set ? f->dtype : CM_F16;
    mo->seed = f->seed;
    mo->device = f->device;
    mo->quant = f->quant;
    mo->rope_scaling = f->rope_scaling;
    mo->expert_parallel = f->expert_parallel;
    if (f->n_lora_modules && !f->lora_on) {
        fprintf(stderr, "llmserve: --lora-modules needs --enable-lora\n");
        return LLM_EINVAL;
    }
    if (f->n_lora_modules > (f->max_loras ? f->max_loras : 8)) {
        fprintf(stderr, "llmserve: %d --lora-modules, more than --max-loras %d\n", f->n_lora_modules,
                f->max_loras ? f->max_loras : 8);
        return LLM_EINVAL;
    }
    for (int i = 0; i < f->n_lora_modules; i++)
        for (int j = 0; j < i; j++)
            if (!strncmp(f->lora_modules[i], f->lora_modules[j], strcspn(f->lora_modules[i], "=") + 1)) {
                fprintf(stderr, "llmserve: --lora-modules names '%.*s' twice\n", (int)strcspn(f->lora_modules[i], "="),
                        f->lora_modules[i]);
                return LLM_EINVAL;
            }
    mo->lora_on = f->lora_on;
    mo->lora_modules = f->lora_modules;
    mo->n_lora_modules = f->n_lora_modules;
    mo->max_loras = f->max_loras;
    mo->max_lora_rank = f->max_lora_rank;
    return 0;
}
