/* tl_bench.h's command: llmserve bench serve, in parts - the client
 * (tl_bench_client.c), the datasets (tl_bench_data.c), a run and its report
 * (tl_bench_run.c), the flags (tl_bench_cli.c). This header is theirs. */
#ifndef TL_BENCH_INT_H
#define TL_BENCH_INT_H

#include "cm_tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/types.h>

enum { M_TTFT, M_TPOT, M_ITL, M_E2EL, N_METRICS };
extern const char *const tlb_metric_names[N_METRICS];

typedef struct {
    char *body;                  /* request JSON */
    char *prompt;                /* its text, for --tokenizer counts */
    char *text;                  /* what came back (kept with --tokenizer) */
    size_t text_len, text_cap;
    int usage_out;               /* the server's completion_tokens, when it sent usage */
    /* results */
    int ok, cancelled, out_tokens, in_tokens, chunks, status;
    int cls;                     /* --dataset-name mixed: 0 a short request, 1 a long prompt */
    char err[240];               /* the start of an error response's body */
    double start, ttft, e2el;
    double *itl;
    int n_itl, cap_itl;
} bench_req;

typedef struct {
    char host[256], port[16], path[384], auth[300];
} bench_target;

typedef struct {
    bench_target tg;
    const char *endpoint, *model, *dataset, *goodput, *result_dir, *result_file, *sweep;
    double rate, burst, range, min_gain, slo, long_frac;
    long long_in, long_out;      /* --dataset-name mixed: the long class's prompt words and max_tokens */
    long num, in_len, out_len, max_conc, seed, warm, px_len, sx_len, n_px, px_out;
    int ignore_eos, save, chat, sweep_metric;
    double pcts[16];
    int np, show[N_METRICS];
    double g[N_METRICS];         /* goodput SLOs in seconds, 0: none */
    cm_tokenizer *tok;           /* --tokenizer: client-side token counts, as vLLM's bench makes them */
    char **sg;                   /* ShareGPT prompts and output lengths */
    int *sg_out, n_sg;
} bench_opts;

typedef struct {
    const bench_target *tg;
    bench_req *r;
    int n, next, active, peak_active, finished;
    double *arrival;             /* seconds after t0 */
    double t0;
    pthread_mutex_t mu;
} bench;


/* Peak memory as the server reports it on /metrics while the run lasts:
 * KV cache usage (llmserve: and vllm: names) and resident memory (the
 * server process, plus our worker groups), GPU memory where exported. */
typedef struct {
    const bench_target *tg;
    volatile int stop;
    double peak_kv, peak_rss, peak_gpu;
    int seen;
} mem_poll;


/* ---- the client (tl_bench_client.c) ------------------------------------ */
extern int tlb_keep_text;         /* --tokenizer given: keep the generated text */
extern volatile sig_atomic_t tlb_stop; /* SIGINT: finish what runs, start nothing */
void tlb_on_int(int s);
/* One request, start to end, streamed. */
void tlb_run_one(const bench_target *t, bench_req *q);
/* A request slot's thread (arg: a bench): takes the next request at its arrival time. */
void *tlb_slot_thread(void *arg);
/* The poller's thread (arg: a mem_poll). */
void *tlb_poll_metrics(void *arg);
/* The server's speculative-decoding counters: drafts, draft tokens, accepted tokens. */
void tlb_spec_counts(const bench_target *t, double out[3]);

/* ---- the datasets (tl_bench_data.c) ------------------------------------ */
int tlb_load_sharegpt(const char *path, int want, char ***prompts, int **outs, int *n, char *err, size_t errlen);
/* total requests' bodies (and prompts) for --dataset-name random / prefix / sharegpt. */
int tlb_build_requests(const bench_opts *o, uint64_t seed, bench_req *r, int total);

/* ---- a run and its report (tl_bench_run.c) ------------------------------ */
/* One point at rate (inf: all at once) and max_conc (0: unlimited): vLLM's result keys in *out. */
int tlb_run_point(const bench_opts *o, double rate, long max_conc, uint64_t seed, json_t **out);
/* --sweep: a point per value, the knee, the curves. */
int tlb_run_sweep(const bench_opts *o);
double tlb_num_of(json_t *res, const char *key);

#endif
