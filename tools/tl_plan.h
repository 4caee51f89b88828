/* tl_plan.h - capacity planning (llmserve plan) and cost arithmetic
 * (llmserve cost): pure functions, so the tests check them against worked
 * examples. */
#ifndef TL_PLAN_H
#define TL_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    char name[128];
    int n_layer, n_head, n_kv_head, head_dim, dim, hidden, vocab, ctx, tied;
    int n_expert, n_expert_used; /* mixture of experts (hidden: each expert's width); 0: dense */
    double params;              /* parameter count */
    double active_params;       /* of them, those one token computes with (= params when dense) */
    double weight_bytes;        /* as stored (GGUF: the tensors' bytes); 0: from params x dtype */
} tl_model_shape;

typedef struct {
    double gpu_memory;          /* bytes per GPU */
    double utilization;         /* share of it for weights + activations + KV */
    int max_model_len;          /* 0: the model's */
    int tp;                     /* tensor-parallel size (ranks a stage) */
    int pp;                     /* pipeline stages (the layers split as the worker splits them); 0: 1 */
    double weight_elem_bytes;   /* dtype / quantization of the weights when weight_bytes is 0 */
    double kv_elem_bytes;       /* 2 fp16/bf16, 1 fp8/int8, 4 fp32 */
    int max_num_seqs;           /* for the activation estimate */
    int max_batched_tokens;
} tl_plan_in;

typedef struct {
    double weight_bytes_per_gpu, activation_bytes_per_gpu, kv_pool_bytes_per_gpu;
    double kv_bytes_per_token;          /* whole model (all GPUs) */
    double kv_bytes_per_token_per_gpu;
    double max_tokens, max_full_seqs;
    int fits;
    char why[256];                      /* when it does not fit */
    /* per pipeline stage (pp of them, at most TL_PLAN_MAX_STAGES): its layers [l0, l1), what one of its GPUs
     * holds (stage 0 the embeddings, the last the LM head), its KV bytes a token and the tokens its pool
     * holds. The group's cache is the same number of blocks on every stage, so the fewest tokens of any stage
     * is the group's: the *_per_gpu figures above are that stage's */
    int stages;
    struct { int l0, l1; double weight_bytes, kv_bytes_per_token, kv_pool_bytes, max_tokens; } stage[64];
} tl_plan_out;
#define TL_PLAN_MAX_STAGES 64

/* Built-in shapes (cm_model_preset). 0 or LLM_ENOTFOUND. */
int tl_model_preset(const char *name, tl_model_shape *out);
/* From a Hugging Face config.json. */
int tl_model_from_config(const char *path, tl_model_shape *out, char *err, size_t errlen);
/* From a GGUF (metadata and tensor sizes). */
int tl_model_from_gguf(const char *path, tl_model_shape *out, char *err, size_t errlen);
/* Parameters of a llama-family shape (embeddings, attention, SwiGLU or its experts and router, norms). */
double tl_params_estimate(const tl_model_shape *m);

double tl_kv_bytes_per_token(const tl_model_shape *m, double kv_elem_bytes);
void tl_plan(const tl_model_shape *m, const tl_plan_in *in, tl_plan_out *out);

/* Cost arithmetic. Prices in currency units per million tokens. */
double tl_cost_per_1k_requests(double prompt_tokens, double output_tokens, double in_price, double out_price);
/* Self-hosting cost per million generated tokens at a sustained output rate. */
double tl_selfhost_per_million(double gpus, double gpu_hourly, double output_tokens_per_s);
/* Requests per day at which self-hosting (GPUs all day + fixed monthly costs)
 * costs what the API does. */
double tl_break_even_requests_per_day(double gpus, double gpu_hourly, double fixed_monthly, double api_cost_per_request);

/* bench serve: vLLM's percentile (linear between order statistics) of a
 * sorted array, and one inter-arrival gap of a gamma process with mean
 * 1/rate (burstiness 1: Poisson; rate inf: 0). */
double tl_bench_percentile(const double *sorted, int n, double p);
double tl_bench_gap(double rate, double burstiness);
/* Goodput: whether one request met every SLO given (seconds; 0: none) for
 * TTFT, TPOT and E2E latency, as vLLM's --goodput counts it. */
int tl_bench_meets_slo(double ttft, double tpot, double e2el, const double slo[3]);
/* The request RNG (prompts and arrivals share it, so a seed fixes a run). */
void tl_bench_seed(uint64_t seed);
double tl_bench_urand(void);
/* The capacity knee of a sweep, points in increasing load. With slo > 0: the
 * largest point whose latency meets it (-1 when none does). Otherwise: the
 * first point past which the next gains less than min_gain (a fraction) of
 * throughput while latency rises; n - 1 when no point does. *reached is 1
 * when the sweep went past the knee (0: the knee may lie beyond the sweep). */
int tl_bench_knee(const double *thr, const double *lat, int n, double min_gain, double slo, int *reached);
/* Throughput (x) against p99 latency (y) as a self-contained SVG, the
 * points labelled param=value, the knee marked, the SLO drawn when > 0. */
int tl_bench_svg(FILE *f, const char *title, const char *param, const double *value, const double *thr,
                 const double *lat, int n, const char *lat_name, int knee, double slo);

#endif
