/* llmserve plan / llmserve cost: the command-line faces of tl_plan.c. */
#include "cm_error.h"
#include "cm_model.h"
#include "cm_parse.h"
#include "tl_common.h"
#include "tl_plan.h"

#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double dtype_bytes(const char *s) {
    if (!strcmp(s, "fp32") || !strcmp(s, "float32") || !strcmp(s, "f32")) return 4;
    if (!strcmp(s, "fp16") || !strcmp(s, "float16") || !strcmp(s, "bf16") || !strcmp(s, "bfloat16") || !strcmp(s, "f16") ||
        !strcmp(s, "auto"))
        return 2;
    if (!strcmp(s, "fp8") || !strcmp(s, "int8") || !strcmp(s, "q8_0")) return 1;
    if (!strcmp(s, "int4") || !strcmp(s, "q4_0") || !strcmp(s, "q4_1") || !strcmp(s, "awq") || !strcmp(s, "gptq"))
        return 0.5625; /* 4 bits plus a scale per 32 */
    return 0;
}

int tl_plan_main(int argc, char **argv) {
    const char *model = NULL, *dtype = "fp16", *kvd = "fp16", *quant = NULL;
    double gpu_gib = 80, util = 0.9, mml = 0, tp = 1, pp = 1, seqs = 256, bt = 2048;
    int as_json = 0;
    static const struct option lo[] = {{"model", 1, 0, 'm'}, {"gpu-memory", 1, 0, 'g'}, {"gpu-memory-utilization", 1, 0, 'u'},
                                       {"max-model-len", 1, 0, 'l'}, {"tensor-parallel-size", 1, 0, 't'},
                                       {"pipeline-parallel-size", 1, 0, 'P'},
                                       {"dtype", 1, 0, 'd'}, {"kv-cache-dtype", 1, 0, 'k'}, {"quantization", 1, 0, 'q'},
                                       {"max-num-seqs", 1, 0, 's'}, {"max-num-batched-tokens", 1, 0, 'b'},
                                       {"json", 0, 0, 'j'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int c, bad = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'g': bad = cm_parse_double("--gpu-memory", optarg, 0.1, 1e6, &gpu_gib); break;
        case 'u': bad = cm_parse_double("--gpu-memory-utilization", optarg, 0.01, 1, &util); break;
        case 'l': bad = cm_parse_double("--max-model-len", optarg, 1, 1e8, &mml); break;
        case 't': bad = cm_parse_double("--tensor-parallel-size", optarg, 1, 1024, &tp); break;
        case 'P': bad = cm_parse_double("--pipeline-parallel-size", optarg, 1, TL_PLAN_MAX_STAGES, &pp); break;
        case 'd': dtype = optarg; break;
        case 'k': kvd = optarg; break;
        case 'q': quant = optarg; break;
        case 's': bad = cm_parse_double("--max-num-seqs", optarg, 1, 1e6, &seqs); break;
        case 'b': bad = cm_parse_double("--max-num-batched-tokens", optarg, 1, 1e8, &bt); break;
        case 'j': as_json = 1; break;
        case 'h':
            printf("usage: llmserve plan --model GGUF|config.json|PRESET [--gpu-memory GiB] [--gpu-memory-utilization F]\n"
                   "       [--max-model-len N] [--tensor-parallel-size N] [--pipeline-parallel-size N]\n"
                   "       [--dtype fp16|bf16|fp32] [--kv-cache-dtype fp16|fp8|fp32]\n"
                   "       [--quantization int8|int4|fp8] [--max-num-seqs N] [--max-num-batched-tokens N] [--json]\n"
                   "presets: %s\n", cm_model_preset_names());
            return 0;
        default: return 2;
        }
        if (bad) return 2;
    }
    if (!model) {
        fprintf(stderr, "llmserve plan: --model is required (a GGUF file, a config.json or a preset name)\n");
        return 2;
    }
    tl_model_shape m;
    char err[512] = "";
    size_t ml = strlen(model);
    int rc;
    if (ml > 5 && !strcmp(model + ml - 5, ".gguf")) rc = tl_model_from_gguf(model, &m, err, sizeof err);
    else if (ml > 5 && !strcmp(model + ml - 5, ".json")) rc = tl_model_from_config(model, &m, err, sizeof err);
    else {
        rc = tl_model_preset(model, &m);
        if (rc) snprintf(err, sizeof err, "'%s' is not a .gguf, a .json config or a preset (see --help)", model);
    }
    if (rc) {
        fprintf(stderr, "llmserve plan: %s\n", err);
        return 1;
    }
    tl_plan_in in = {gpu_gib * 1073741824.0, util, (int)mml, (int)tp, (int)pp, dtype_bytes(quant ? quant : dtype), dtype_bytes(kvd),
                     (int)seqs, (int)bt};
    if (!in.weight_elem_bytes || !in.kv_elem_bytes) {
        fprintf(stderr, "llmserve plan: unknown dtype '%s'\n", !in.kv_elem_bytes ? kvd : quant ? quant : dtype);
        return 2;
    }
    if (quant) m.weight_bytes = 0; /* quantizing on load: bytes from the parameter count */
    tl_plan_out o;
    tl_plan(&m, &in, &o);
    int L = in.max_model_len ? in.max_model_len : m.ctx;
    if (as_json) {
        json_t *j = json_pack("{s:s,s:f,s:f,s:i,s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:b,s:s?}", "model", m.name, "params",
                              m.params, "active_params", m.active_params,
                              "tensor_parallel_size", in.tp, "max_model_len", L, "weight_bytes_per_gpu",
                              o.weight_bytes_per_gpu, "activation_bytes_per_gpu", o.activation_bytes_per_gpu,
                              "kv_bytes_per_token", o.kv_bytes_per_token, "kv_bytes_per_token_per_gpu",
                              o.kv_bytes_per_token_per_gpu, "kv_pool_bytes_per_gpu", o.kv_pool_bytes_per_gpu, "max_tokens",
                              o.max_tokens, "max_full_length_seqs", o.max_full_seqs, "fits", o.fits, "why",
                              o.fits ? NULL : o.why);
        json_object_set_new(j, "pipeline_parallel_size", json_integer(in.pp));
        json_t *st = json_array();
        for (int i = 0; i < o.stages; i++)
            json_array_append_new(st, json_pack("{s:i,s:i,s:f,s:f,s:f,s:f}", "first_layer", o.stage[i].l0, "layers",
                                                o.stage[i].l1 - o.stage[i].l0, "weight_bytes_per_gpu",
                                                o.stage[i].weight_bytes, "kv_bytes_per_token_per_gpu",
                                                o.stage[i].kv_bytes_per_token, "kv_pool_bytes_per_gpu",
                                                o.stage[i].kv_pool_bytes, "max_tokens", o.stage[i].max_tokens));
        json_object_set_new(j, "stages", st);
        char *s = json_dumps(j, JSON_INDENT(2));
        puts(s);
        free(s);
        json_decref(j);
    } else {
        printf("model %s: %.2fB parameters, %d layers, %d KV heads x %d head dim\n", m.name, m.params / 1e9, m.n_layer,
               m.n_kv_head, m.head_dim);
        if (m.n_expert)
            printf("experts: %d a layer, %d a token: %.2fB parameters active a token (all %.2fB held in memory)\n",
                   m.n_expert, m.n_expert_used, m.active_params / 1e9, m.params / 1e9);
        printf("GPU: %.1f GiB x %d, %.0f%% usable\n", gpu_gib, in.tp * in.pp, util * 100);
        for (int i = 0; in.pp > 1 && i < o.stages; i++)
            printf("stage %d: layers %d..%d%s%s on %d GPU(s): weights %.2f GiB, KV %.0f bytes a token, pool %.2f GiB = "
                   "%.0f tokens a GPU\n", i, o.stage[i].l0, o.stage[i].l1 - 1, i == 0 ? " + embeddings" : "",
                   i == o.stages - 1 ? " + LM head" : "", in.tp, o.stage[i].weight_bytes / 1073741824.0,
                   o.stage[i].kv_bytes_per_token, o.stage[i].kv_pool_bytes / 1073741824.0, o.stage[i].max_tokens);
        if (in.pp > 1) printf("(the fullest stage sets the group's cache: its figures below)\n");
        printf("weights per GPU:        %10.2f GiB\n", o.weight_bytes_per_gpu / 1073741824.0);
        printf("activations per GPU:    %10.2f GiB (estimate: %d batched tokens, %d sequences)\n",
               o.activation_bytes_per_gpu / 1073741824.0, in.max_batched_tokens, in.max_num_seqs);
        printf("KV bytes per token:     %10.0f (2 x %d layers x %d kv heads x %d x %g bytes); %.0f per GPU\n",
               o.kv_bytes_per_token, m.n_layer, m.n_kv_head, m.head_dim, in.kv_elem_bytes, o.kv_bytes_per_token_per_gpu);
        printf("KV pool per GPU:        %10.2f GiB\n", o.kv_pool_bytes_per_gpu / 1073741824.0);
        printf("max tokens in cache:    %10.0f\n", o.max_tokens);
        printf("max full-length (%d-token) sequences at once: %.0f\n", L, o.max_full_seqs);
        if (!o.fits) printf("DOES NOT FIT: %s\n", o.why);
    }
    return o.fits ? 0 : 3;
}

int tl_cost_main(int argc, char **argv) {
    double pt = -1, ot = -1, ip = -1, op = -1, gpus = 1, hourly = -1, tput = -1, fixed = 0;
    const char *bench = NULL;
    int as_json = 0;
    static const struct option lo[] = {{"prompt-tokens", 1, 0, 'p'}, {"output-tokens", 1, 0, 'o'},
                                       {"input-price", 1, 0, 'i'},   {"output-price", 1, 0, 'O'},
                                       {"gpus", 1, 0, 'g'},          {"gpu-hourly-price", 1, 0, 'H'},
                                       {"output-throughput", 1, 0, 't'}, {"bench-result", 1, 0, 'b'},
                                       {"fixed-monthly", 1, 0, 'f'}, {"json", 0, 0, 'j'},
                                       {"help", 0, 0, 'h'},          {0, 0, 0, 0}};
    int c, bad = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'p': bad = cm_parse_double("--prompt-tokens", optarg, 0, 1e9, &pt); break;
        case 'o': bad = cm_parse_double("--output-tokens", optarg, 0, 1e9, &ot); break;
        case 'i': bad = cm_parse_double("--input-price", optarg, 0, 1e6, &ip); break;
        case 'O': bad = cm_parse_double("--output-price", optarg, 0, 1e6, &op); break;
        case 'g': bad = cm_parse_double("--gpus", optarg, 0.01, 1e6, &gpus); break;
        case 'H': bad = cm_parse_double("--gpu-hourly-price", optarg, 0, 1e6, &hourly); break;
        case 't': bad = cm_parse_double("--output-throughput", optarg, 1e-6, 1e12, &tput); break;
        case 'b': bench = optarg; break;
        case 'f': bad = cm_parse_double("--fixed-monthly", optarg, 0, 1e12, &fixed); break;
        case 'j': as_json = 1; break;
        case 'h':
            printf("usage: llmserve cost --prompt-tokens N --output-tokens N --input-price P --output-price P\n"
                   "       [--gpus N --gpu-hourly-price P (--output-throughput TOK/S | --bench-result FILE.json)]\n"
                   "       [--fixed-monthly P] [--json]\n"
                   "prices per million tokens (API) and per GPU hour; the bench result is the JSON of\n"
                   "`llmserve bench serve --save-result` or `vllm bench serve` (its output_throughput).\n");
            return 0;
        default: return 2;
        }
        if (bad) return 2;
    }
    if (pt < 0 || ot < 0 || ip < 0 || op < 0) {
        fprintf(stderr, "llmserve cost: --prompt-tokens, --output-tokens, --input-price and --output-price are required\n");
        return 2;
    }
    if (bench) {
        json_error_t je;
        json_t *j = json_load_file(bench, 0, &je);
        json_t *v = j ? json_object_get(j, "output_throughput") : NULL;
        if (!json_is_number(v) || !(json_number_value(v) > 0)) {
            fprintf(stderr, "llmserve cost: %s has no positive output_throughput\n", bench);
            json_decref(j);
            return 1;
        }
        tput = json_number_value(v);
        json_decref(j);
    }
    double per1k = tl_cost_per_1k_requests(pt, ot, ip, op), per_req = per1k / 1000;
    int self = hourly >= 0 && tput > 0;
    double selfm = self ? tl_selfhost_per_million(gpus, hourly, tput) : 0;
    double be = self ? tl_break_even_requests_per_day(gpus, hourly, fixed, per_req) : 0;
    double cap = self && ot > 0 ? tput * 86400.0 / ot : 0;
    if (as_json) {
        json_t *j = json_pack("{s:f,s:f}", "api_cost_per_1k_requests", per1k, "api_cost_per_request", per_req);
        if (self) {
            json_object_set_new(j, "selfhost_cost_per_million_output_tokens", json_real(selfm));
            json_object_set_new(j, "selfhost_cost_per_1k_requests", json_real(selfm * ot / 1000.0));
            json_object_set_new(j, "break_even_requests_per_day", json_real(be));
            json_object_set_new(j, "capacity_requests_per_day", json_real(cap));
        }
        char *s = json_dumps(j, JSON_INDENT(2));
        puts(s);
        free(s);
        json_decref(j);
        return 0;
    }
    printf("API: %.4f per 1k requests (%.0f prompt + %.0f output tokens at %g / %g per million)\n", per1k, pt, ot, ip, op);
    if (self) {
        printf("self-hosted: %g GPU(s) at %g per hour, %.1f output tokens/s: %.4f per million output tokens, "
               "%.4f per 1k requests\n",
               gpus, hourly, tput, selfm, selfm * ot / 1000.0);
        printf("break-even: %.0f requests per day (GPUs all day + %g fixed per month); the deployment serves up to "
               "%.0f requests per day%s\n",
               be, fixed, cap, be > cap ? ": it never breaks even at this size" : "");
    }
    return 0;
}
