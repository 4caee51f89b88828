/* plan_test: the capacity formulas and cost arithmetic against worked
 * examples computed by hand. argv[1]: the default model (optional). */
#include "cm_error.h"
#include "tl_plan.h"
#include "tst.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    tl_model_shape m;
    /* a 32-layer model with 32 KV heads of 128 in fp16: 2 x 32 x 32 x 128 x 2 */
    CHECK_RC(tl_model_preset("llama-2-7b", &m), 0);
    CHECK_NEAR(tl_kv_bytes_per_token(&m, 2), 524288, 0);
    CHECK_NEAR(m.params / 1e9, 6.74, 0.01); /* Llama-2-7B: 6.74B */
    /* Llama-3-70B: 80 layers, 8 KV heads x 128, fp16 */
    CHECK_RC(tl_model_preset("llama-3-70b", &m), 0);
    CHECK_NEAR(tl_kv_bytes_per_token(&m, 2), 327680, 0);
    CHECK_NEAR(m.params / 1e9, 70.55, 0.1);
    CHECK_NEAR(tl_kv_bytes_per_token(&m, 1), 163840, 0); /* fp8 cache halves it */
    /* mixtures of experts, against the published counts: Mixtral 8x7B 46.7B of which 12.9B a token;
     * Qwen3-30B-A3B 30.5B, 3.3B a token; a dense model's are all active (Qwen3-8B: 8.2B) */
    tl_model_shape x;
    CHECK_RC(tl_model_preset("mixtral-8x7b", &x), 0);
    CHECK_NEAR(x.params / 1e9, 46.7, 0.05);
    CHECK_NEAR(x.active_params / 1e9, 12.9, 0.05);
    CHECK_RC(tl_model_preset("qwen3-30b-a3b", &x), 0);
    CHECK_NEAR(x.params / 1e9, 30.5, 0.05);
    CHECK_NEAR(x.active_params / 1e9, 3.3, 0.1); /* 3.35 here; "3.3B activated" published */
    /* gpt-oss (OpenAI's model card: 20.91B and 116.83B, 3.61B and 5.13B active): OpenAI counts the active
     * parameters without the input embedding table (a token reads one row of it); ours hold it */
    CHECK_RC(tl_model_preset("gpt-oss-20b", &x), 0);
    CHECK_NEAR(x.params / 1e9, 20.91, 0.05);
    CHECK_NEAR((x.active_params - (double)x.vocab * x.dim) / 1e9, 3.61, 0.05);
    CHECK_RC(tl_model_preset("gpt-oss-120b", &x), 0);
    CHECK_NEAR(x.params / 1e9, 116.83, 0.1);
    CHECK_NEAR((x.active_params - (double)x.vocab * x.dim) / 1e9, 5.13, 0.05);
    CHECK_RC(tl_model_preset("qwen3-8b", &x), 0);
    CHECK_NEAR(x.params / 1e9, 8.2, 0.05);
    CHECK(x.active_params == x.params);
    /* 70B fp16 does not fit one 80 GiB GPU; over 4 it does: weights 32.85 GiB each */
    tl_plan_in in = {.gpu_memory = 80 * 1073741824.0, .utilization = 0.9, .max_model_len = 8192, .tp = 1,
                     .weight_elem_bytes = 2, .kv_elem_bytes = 2, .max_num_seqs = 256, .max_batched_tokens = 2048};
    tl_plan_out o;
    tl_plan(&m, &in, &o);
    CHECK_INT(o.fits, 0);
    CHECK(o.why[0] != 0);
    in.tp = 4;
    tl_plan(&m, &in, &o);
    CHECK_INT(o.fits, 1);
    CHECK_NEAR(o.weight_bytes_per_gpu / 1073741824.0, 70.55e9 * 2 / 4 / 1073741824.0, 0.1);
    CHECK_NEAR(o.kv_bytes_per_token_per_gpu, 327680 / 4.0, 0);
    CHECK_NEAR(o.max_tokens, floor(o.kv_pool_bytes_per_gpu / (327680 / 4.0)), 0);
    CHECK_NEAR(o.max_full_seqs, floor(o.max_tokens / 8192), 0);
    /* TP 16 over 8 KV heads: each rank holds a replica of one head */
    in.tp = 16;
    tl_plan(&m, &in, &o);
    CHECK_NEAR(o.kv_bytes_per_token_per_gpu, 2.0 * 80 * 1 * 128 * 2, 0);
    double w16 = o.weight_bytes_per_gpu, t16 = o.max_tokens;
    /* TP 8 x PP 2 on the same 16 GPUs: 40 layers a stage, one KV head a GPU, so half the KV bytes a token of
     * TP 16's; the layers' weights halve too, stage 0 adds the embeddings, stage 1 the LM head */
    in.tp = 8;
    in.pp = 2;
    tl_plan(&m, &in, &o);
    CHECK_INT(o.fits, 1);
    CHECK_INT(o.stages, 2);
    CHECK(o.stage[0].l0 == 0 && o.stage[0].l1 == 40 && o.stage[1].l0 == 40 && o.stage[1].l1 == 80);
    CHECK_NEAR(o.stage[0].kv_bytes_per_token, 2.0 * 40 * 1 * 128 * 2, 0);
    double emb = (double)m.vocab * m.dim * 2 / 8;
    CHECK_NEAR(o.stage[0].weight_bytes, o.stage[1].weight_bytes, 1); /* embeddings there, an untied head here */
    CHECK_NEAR(o.stage[0].weight_bytes + o.stage[1].weight_bytes, 2 * w16, 1e3); /* all of it, over 8 a stage */
    CHECK(o.stage[0].weight_bytes > emb);
    CHECK(o.max_tokens > 1.9 * t16); /* half the KV a token */
    /* 5 layers in 2 stages: 3 + 2 (the earlier stage takes the extra one, as the worker does); more stages
     * than layers do not fit */
    m.n_layer = 5;
    tl_plan(&m, &in, &o);
    CHECK(o.stage[0].l1 == 3 && o.stage[1].l0 == 3 && o.stage[1].l1 == 5);
    in.pp = 6;
    tl_plan(&m, &in, &o);
    CHECK(!o.fits && strstr(o.why, "6 pipeline stages"));
    in.pp = 1;
    CHECK_RC(tl_model_preset("no-such-model", &m), LLM_ENOTFOUND);
    char err[256];
    CHECK(tl_model_from_config("/nonexistent/config.json", &m, err, sizeof err) != 0);
    /* the default model from its GGUF: SmolLM2-135M, 23040 bytes per token in fp16 */
    if (argc > 1 && access(argv[1], R_OK) == 0) {
        CHECK_RC(tl_model_from_gguf(argv[1], &m, err, sizeof err), 0);
        CHECK_NEAR(tl_kv_bytes_per_token(&m, 2), 23040, 0);
        CHECK_NEAR(m.params / 1e6, 134.5, 1.0);
        CHECK(m.weight_bytes > 80e6 && m.weight_bytes < 110e6);
    }
    /* cost: 1000 requests of 500 in + 200 out at 3 / 15 per million = 1.5 + 3.0 */
    CHECK_NEAR(tl_cost_per_1k_requests(500, 200, 3, 15), 4.5, 1e-9);
    /* one GPU at 2.0/hour making 1000 tok/s: 2 / 3.6M tokens = 0.5556 per million */
    CHECK_NEAR(tl_selfhost_per_million(1, 2.0, 1000), 2.0 / 3.6, 1e-9);
    /* break-even: 48/day GPU + 3000/month fixed (98.63/day) over 0.0045 per request */
    CHECK_NEAR(tl_break_even_requests_per_day(1, 2.0, 3000, 0.0045), (48 + 3000 * 12.0 / 365) / 0.0045, 1e-6);
    CHECK(isinf(tl_selfhost_per_million(1, 2, 0)));
    /* bench: percentiles as numpy/vLLM compute them */
    double v[5] = {1, 2, 3, 4, 10};
    CHECK_NEAR(tl_bench_percentile(v, 5, 50), 3, 1e-12);
    CHECK_NEAR(tl_bench_percentile(v, 5, 90), 7.6, 1e-12);
    CHECK_NEAR(tl_bench_percentile(v, 5, 99), 9.76, 1e-12);
    CHECK_NEAR(tl_bench_percentile(v, 1, 99), 1, 1e-12);
    /* Poisson arrivals at 4 req/s: mean gap 0.25 s, coefficient of variation 1;
     * burstiness 4: same mean, CV 0.5; rate inf: all at once */
    for (int k = 0; k < 2; k++) {
        double burst = k ? 4 : 1, sum = 0, sq = 0;
        int n = 200000;
        for (int i = 0; i < n; i++) {
            double g = tl_bench_gap(4, burst);
            sum += g;
            sq += g * g;
        }
        double mean = sum / n, cv = sqrt(sq / n - mean * mean) / mean;
        CHECK_NEAR(mean, 0.25, 0.005);
        CHECK_NEAR(cv, 1 / sqrt(burst), 0.02);
    }
    CHECK_NEAR(tl_bench_gap(INFINITY, 1), 0, 0);
    /* goodput: a request counts when it meets every SLO that was given */
    const double none[3] = {0, 0, 0}, ttft_only[3] = {0.2, 0, 0}, all3[3] = {0.2, 0.05, 2.0};
    CHECK(tl_bench_meets_slo(9, 9, 9, none));
    CHECK(tl_bench_meets_slo(0.2, 9, 9, ttft_only));  /* the bound itself passes */
    CHECK(!tl_bench_meets_slo(0.21, 0, 0, ttft_only));
    CHECK(tl_bench_meets_slo(0.1, 0.05, 1.9, all3));
    CHECK(!tl_bench_meets_slo(0.1, 0.06, 1.9, all3)); /* one SLO missed is enough */
    CHECK(!tl_bench_meets_slo(0.1, 0.04, 2.5, all3));
    /* knee: throughput 100 -> 190 (+90%) -> 350 (+84%) -> 380 (+8.6%) -> 385;
     * while p99 rises: the knee is point 2 (past it, < 10% more for more latency) */
    double thr[5] = {100, 190, 350, 380, 385}, lat[5] = {50, 55, 70, 140, 300};
    int reached;
    CHECK_RC(tl_bench_knee(thr, lat, 5, 0.10, 0, &reached), 2);
    CHECK_RC(reached, 1);
    /* a flat step whose latency does not rise is not the knee */
    double lat_flat[5] = {50, 55, 70, 70, 300};
    CHECK_RC(tl_bench_knee(thr, lat_flat, 5, 0.10, 0, &reached), 3);
    /* still gaining everywhere: the last point, and not reached */
    double thr_up[3] = {100, 200, 400};
    CHECK_RC(tl_bench_knee(thr_up, lat, 3, 0.10, 0, &reached), 2);
    CHECK_RC(reached, 0);
    /* SLO: the largest point with p99 within it; none meets it: -1 */
    CHECK_RC(tl_bench_knee(thr, lat, 5, 0.10, 100, &reached), 2);
    CHECK_RC(reached, 1);
    CHECK_RC(tl_bench_knee(thr, lat, 5, 0.10, 1000, &reached), 4);
    CHECK_RC(reached, 0);
    CHECK_RC(tl_bench_knee(thr, lat, 5, 0.10, 10, &reached), -1);
    /* the plot: one circle per point, the knee marked, the title escaped */
    double val[5] = {1, 2, 4, 8, 16};
    char *svg = NULL;
    size_t svg_len = 0;
    FILE *mf = open_memstream(&svg, &svg_len);
    CHECK_RC(tl_bench_svg(mf, "a<b>&\"c\"", "max-concurrency", val, thr, lat, 5, "e2el", 2, 100), 0);
    fclose(mf);
    int circles = 0;
    for (const char *q = svg; (q = strstr(q, "<circle")); q++) circles++;
    CHECK_RC(circles, 5);
    CHECK(strstr(svg, "max-concurrency=4 (knee)") != NULL);
    CHECK(strstr(svg, "a&lt;b&gt;&amp;&quot;c&quot;") != NULL);
    CHECK(strstr(svg, "SLO 100 ms") != NULL);
    CHECK(strstr(svg, "</svg>") != NULL);
    free(svg);
    return tst_done("plan_test");
}
