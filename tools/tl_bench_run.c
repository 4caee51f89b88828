/* tl_bench_run.c - one llmserve bench serve point (its requests, threads,
 * and vLLM's result keys) and a sweep over points with its knee. */
#include "cm_error.h"
#include "cm_model.h"
#include "cm_parse.h"
#include "cm_time.h"
#include "cm_tokenizer.h"
#include "tl_common.h"
#include "tl_plan.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "tl_bench_int.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* mean / median / std / pNN of one metric, in ms, into res (vLLM's keys). */
static void stats(json_t *res, const bench_opts *o, int m, double *v, int n) {
    const char *name = tlb_metric_names[m];
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    double mean = 0, sd = 0;
    for (int i = 0; i < n; i++) mean += v[i];
    mean = n ? mean / n : 0;
    for (int i = 0; i < n; i++) sd += (v[i] - mean) * (v[i] - mean);
    sd = n ? sqrt(sd / n) : 0;
    char key[64];
    snprintf(key, sizeof key, "mean_%s_ms", name);
    json_object_set_new(res, key, json_real(mean * 1e3));
    snprintf(key, sizeof key, "median_%s_ms", name);
    json_object_set_new(res, key, json_real(tl_bench_percentile(v, n, 50) * 1e3));
    snprintf(key, sizeof key, "std_%s_ms", name);
    json_object_set_new(res, key, json_real(sd * 1e3));
    if (o->show[m]) printf("%-6s mean %9.2f ms  median %9.2f ms", name, mean * 1e3, tl_bench_percentile(v, n, 50) * 1e3);
    for (int i = 0; i < o->np; i++) {
        snprintf(key, sizeof key, "p%g_%s_ms", o->pcts[i], name);
        double x = tl_bench_percentile(v, n, o->pcts[i]) * 1e3;
        json_object_set_new(res, key, json_real(x));
        if (o->show[m]) printf("  p%g %9.2f ms", o->pcts[i], x);
    }
    /* the sweep's knee reads p99 whatever --metric-percentiles says */
    snprintf(key, sizeof key, "p99_%s_ms", name);
    if (!json_object_get(res, key)) json_object_set_new(res, key, json_real(tl_bench_percentile(v, n, 99) * 1e3));
    if (o->show[m]) printf("\n");
}

static void result_path(const bench_opts *o, const char *name, char *out, size_t len) {
    if (name[0] == '/' || !o->result_dir) snprintf(out, len, "%s", name);
    else snprintf(out, len, "%s/%s", o->result_dir, name);
}

/* vLLM's default name: backend-rate-concurrency-model-time. */
static void default_name(const bench_opts *o, double rate, long conc, char *out, size_t len) {
    char stamp[32], model[96];
    time_t t = time(NULL);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime(&t));
    snprintf(model, sizeof model, "%s", o->model ? o->model : "model");
    for (char *c = model; *c; c++)
        if (*c == '/' || *c == ' ') *c = '-';
    char r[32];
    if (isfinite(rate)) snprintf(r, sizeof r, "%g", rate);
    else snprintf(r, sizeof r, "inf");
    snprintf(out, len, "openai-%sqps-concurrency%ld-%s-%s.json", r, conc, model, stamp);
}

/* --dataset-name mixed: TTFT, TPOT, ITL and E2EL again for each class of request, printed and under
 * "classes": {"short": {...}, "long": {...}} with the same keys (disaggregated prefill is judged by the
 * short ones' ITL beside the long ones' TTFT). */
static void class_stats(json_t *res, const bench_opts *o, const bench_req *r, int num) {
    static const char *const names[2] = {"short", "long"};
    json_t *cl = json_object();
    for (int c = 0; c < 2; c++) {
        int n = 0, n_itl = 0;
        for (int i = 0; i < num; i++)
            if (r[i].ok && r[i].cls == c) n++, n_itl += r[i].n_itl;
        if (!n) continue;
        double *v[N_METRICS];
        for (int m = 0; m < N_METRICS; m++) v[m] = malloc(sizeof(double) * (size_t)((m == M_ITL ? n_itl : n) + 1));
        int k = 0, ki = 0;
        for (int i = 0; i < num; i++) {
            const bench_req *q = &r[i];
            if (!q->ok || q->cls != c) continue;
            if (v[M_TTFT]) v[M_TTFT][k] = q->ttft;
            if (v[M_TPOT]) v[M_TPOT][k] = q->out_tokens > 1 ? (q->e2el - q->ttft) / (q->out_tokens - 1) : 0;
            if (v[M_E2EL]) v[M_E2EL][k] = q->e2el;
            k++;
            for (int j = 0; j < q->n_itl && v[M_ITL]; j++) v[M_ITL][ki++] = q->itl[j];
        }
        json_t *one = json_pack("{s:i}", "completed", n);
        printf("---- %s requests: %d ----\n", names[c], n);
        for (int m = 0; m < N_METRICS; m++)
            if (v[m]) stats(one, o, m, v[m], m == M_ITL ? ki : k);
        for (int m = 0; m < N_METRICS; m++) free(v[m]);
        json_object_set_new(cl, names[c], one);
    }
    json_object_set_new(res, "classes", cl);
}

/* One run at (rate, max_conc): the requests, the report printed, the JSON in
 * *out. Returns how many requests completed. */
int tlb_run_point(const bench_opts *o, double rate, long max_conc, uint64_t seed, json_t **out) {
    int total = (int)(o->num + o->warm), num = (int)o->num, warm = (int)o->warm;
    bench_req *all = calloc((size_t)total, sizeof *all);
    double *arrival = calloc((size_t)num, sizeof *arrival);
    *out = NULL;
    if (!all || !arrival || tlb_build_requests(o, seed, all, total)) {
        fprintf(stderr, "llmserve bench: out of memory building %d requests\n", total);
        for (int i = 0; all && i < total; i++) free(all[i].body);
        free(all);
        free(arrival);
        return 0;
    }
    for (int i = 0; i < warm && !tlb_stop; i++) tlb_run_one(&o->tg, &all[i]); /* one at a time, not reported */
    bench b = {.tg = &o->tg, .r = all + warm, .n = num, .arrival = arrival};
    pthread_mutex_init(&b.mu, NULL);
    double t = 0;
    for (int i = 0; i < num; i++) {
        arrival[i] = t;
        t += tl_bench_gap(rate, o->burst);
    }
    int slots = max_conc > 0 && max_conc < num ? (int)max_conc : num;
    if (slots > 1024) slots = 1024;
    pthread_t *th = malloc(sizeof *th * (size_t)slots), mth;
    mem_poll mp = {.tg = &o->tg};
    double spec0[3], spec1[3];
    tlb_spec_counts(&o->tg, spec0);
    int polling = pthread_create(&mth, NULL, tlb_poll_metrics, &mp) == 0, started = 0;
    b.t0 = cm_now();
    for (; th && started < slots; started++)
        if (pthread_create(&th[started], NULL, tlb_slot_thread, &b)) break;
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    double dur = cm_now() - b.t0;
    mp.stop = 1;
    if (polling) pthread_join(mth, NULL);
    tlb_spec_counts(&o->tg, spec1);
    fprintf(stderr, "\n");

    int usage_seen = 0;
    for (int i = 0; i < num; i++) { /* counts: the tokenizer's when given, else the server's usage, else chunks */
        bench_req *q = &b.r[i];
        usage_seen |= q->usage_out > 0;
        if (!q->ok || !o->tok) continue;
        int32_t *ids = NULL;
        size_t n = 0;
        if (q->text && !cm_tok_encode(o->tok, q->text, q->text_len, 0, 0, &ids, &n)) q->out_tokens = (int)n;
        free(ids);
        ids = NULL;
        if (q->prompt && !cm_tok_encode(o->tok, q->prompt, strlen(q->prompt), -1, 0, &ids, &n)) q->in_tokens = (int)n;
        free(ids);
    }
    int done = 0, failed = 0, cancelled = 0, good = 0, nt = 0, n_itl = 0;
    long server_out = 0;
    long in_tok = 0, out_tok = 0;
    for (int i = 0; i < num; i++) n_itl += b.r[i].n_itl;
    double *v[N_METRICS];
    for (int m = 0; m < N_METRICS; m++) v[m] = malloc(sizeof(double) * (size_t)((m == M_ITL ? n_itl : num) + 1));
    n_itl = 0;
    double max_tok_s = 0;
    for (int i = 0; i < num; i++) {
        bench_req *q = &b.r[i];
        if (!q->ok) {
            if (q->cancelled || (tlb_stop && q->e2el == 0)) cancelled++;
            else failed++;
            continue;
        }
        done++;
        in_tok += q->in_tokens;
        out_tok += q->out_tokens;
        server_out += q->usage_out;
        double tpot = q->out_tokens > 1 ? (q->e2el - q->ttft) / (q->out_tokens - 1) : 0;
        const double slo[3] = {o->g[M_TTFT], o->g[M_TPOT], o->g[M_E2EL]};
        good += tl_bench_meets_slo(q->ttft, tpot, q->e2el, slo);
        if (v[M_TTFT]) v[M_TTFT][nt] = q->ttft;
        if (v[M_TPOT]) v[M_TPOT][nt] = tpot;
        if (v[M_E2EL]) v[M_E2EL][nt] = q->e2el;
        nt++;
        for (int k = 0; k < q->n_itl && v[M_ITL]; k++) v[M_ITL][n_itl++] = q->itl[k];
    }
    /* vLLM's max_output_tokens_per_s: the most tokens that arrived in one
     * second-wide bucket of the run (a token at its chunk's arrival). */
    int nsec = (int)dur + 2;
    double *bucket = calloc((size_t)nsec, sizeof *bucket);
    for (int i = 0; bucket && i < num; i++) {
        bench_req *q = &b.r[i];
        if (!q->ok) continue;
        double at = q->start - b.t0 + q->ttft;
        for (int k = -1; k < q->n_itl; k++) {
            if (k >= 0) at += q->itl[k];
            int s = (int)at;
            if (s >= 0 && s < nsec) bucket[s] += (double)q->out_tokens / q->chunks;
        }
    }
    for (int s = 0; bucket && s < nsec; s++)
        if (bucket[s] > max_tok_s) max_tok_s = bucket[s];
    free(bucket);
    json_t *res = json_pack("{s:s,s:s,s:i,s:i,s:f,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:i}", "backend", "openai", "endpoint",
                            o->endpoint, "completed", done, "failed", failed, "duration", dur, "total_input_tokens",
                            (json_int_t)in_tok, "total_output_tokens", (json_int_t)out_tok, "request_throughput",
                            done / dur, "request_goodput", o->goodput ? good / dur : done / dur, "output_throughput",
                            out_tok / dur, "total_token_throughput", (in_tok + out_tok) / dur,
                            "max_output_tokens_per_s", max_tok_s, "max_concurrent_requests", b.peak_active);
    json_object_set_new(res, "max_concurrency", max_conc > 0 ? json_integer(max_conc) : json_null());
    json_object_set_new(res, "request_rate", isfinite(rate) ? json_real(rate) : json_string("inf"));
    json_object_set_new(res, "burstiness", json_real(o->burst));
    json_object_set_new(res, "num_prompts", json_integer(num));
    json_object_set_new(res, "token_counts", json_string(o->tok ? "tokenizer" : usage_seen ? "usage" : "chunks"));
    if (o->tok && usage_seen) json_object_set_new(res, "server_output_tokens", json_integer(server_out));
    if (o->model) json_object_set_new(res, "model_id", json_string(o->model));
    if (cancelled) json_object_set_new(res, "interrupted", json_integer(cancelled));
    printf("============ Serving Benchmark Result ============\n");
    printf("Successful requests: %d   failed: %d   duration: %.2f s\n", done, failed, dur);
    if (cancelled) printf("Interrupted: %d requests did not finish and are not counted\n", cancelled);
    for (int i = 0; i < num; i++) { /* the first failure says why, so a wrong flag is found at once */
        const bench_req *q = &b.r[i];
        if (q->ok || q->cancelled || q->e2el == 0) continue;
        char msg[240];
        snprintf(msg, sizeof msg, "%s", q->err);
        msg[strcspn(msg, "\r\n")] = 0;
        if (!q->status) printf("First failure: no response from %s:%s\n", o->tg.host, o->tg.port);
        else printf("First failure: HTTP %d %s\n", q->status, msg[0] ? msg : "(an empty or cut stream)");
        break;
    }
    printf("Total input tokens: %ld   output tokens: %ld\n", in_tok, out_tok);
    printf("Request throughput: %.2f req/s   output: %.2f tok/s   total: %.2f tok/s   peak output: %.0f tok/s   "
           "peak concurrency: %d\n",
           done / dur, out_tok / dur, (in_tok + out_tok) / dur, max_tok_s, b.peak_active);
    if (mp.seen) {
        json_object_set_new(res, "peak_kv_cache_usage_perc", json_real(mp.peak_kv));
        json_object_set_new(res, "peak_server_memory_bytes", json_real(mp.peak_rss));
        printf("Peak memory (server /metrics): KV cache %.1f%%, resident %.1f MiB", mp.peak_kv * 100,
               mp.peak_rss / 1048576.0);
        if (mp.peak_gpu > 0) {
            json_object_set_new(res, "peak_gpu_memory_bytes", json_real(mp.peak_gpu));
            printf(", GPU %.1f MiB", mp.peak_gpu / 1048576.0);
        }
        printf("\n");
    }
    if (spec0[0] >= 0 && spec1[0] > spec0[0] && spec1[1] > spec0[1] && spec1[2] >= spec0[2]) {
        /* vLLM's figures: accepted / proposed drafts, and tokens a verification yields (the accepted + 1) */
        double nd = spec1[0] - spec0[0], ndt = spec1[1] - spec0[1], na = spec1[2] - spec0[2];
        json_object_set_new(res, "spec_decode_num_drafts", json_real(nd));
        json_object_set_new(res, "spec_decode_acceptance_rate", json_real(na / ndt));
        json_object_set_new(res, "spec_decode_mean_acceptance_length", json_real(1 + na / nd));
        printf("Speculative decoding: %.0f of %.0f drafts accepted (%.1f%%), mean acceptance length %.2f "
               "(tokens a verification yields) over %.0f verifications\n",
               na, ndt, 100 * na / ndt, 1 + na / nd, nd);
    }
    if (o->goodput) printf("Request goodput: %.2f req/s (%d of %d met the SLOs)\n", good / dur, good, done);
    for (int m = 0; m < N_METRICS; m++)
        if (v[m]) stats(res, o, m, v[m], m == M_ITL ? n_itl : nt);
    for (int m = 0; m < N_METRICS; m++) free(v[m]);
    if (!strcmp(o->dataset, "mixed")) class_stats(res, o, b.r, num);
    if (o->save || o->result_file) {
        char name[256], fn[768];
        if (o->result_file && !o->sweep) snprintf(name, sizeof name, "%s", o->result_file);
        else default_name(o, rate, max_conc, name, sizeof name);
        result_path(o, name, fn, sizeof fn);
        if (json_dump_file(res, fn, JSON_INDENT(2))) fprintf(stderr, "llmserve bench: cannot write %s\n", fn);
        else printf("result: %s\n", fn);
    }
    for (int i = 0; i < total; i++) {
        free(all[i].body);
        free(all[i].prompt);
        free(all[i].text);
        free(all[i].itl);
    }
    free(all);
    free(arrival);
    free(th);
    pthread_mutex_destroy(&b.mu);
    *out = res;
    return done;
}

double tlb_num_of(json_t *res, const char *key) { return json_number_value(json_object_get(res, key)); }

/* --sweep max-concurrency=1,2,4 | request-rate=1,2,4: a run per value, a
 * table, the knee, the plot. */
int tlb_run_sweep(const bench_opts *o) {
    const char *eq = strchr(o->sweep, '=');
    int conc = eq && !strncmp(o->sweep, "max-concurrency", (size_t)(eq - o->sweep)) && eq - o->sweep == 15;
    int rate = eq && !strncmp(o->sweep, "request-rate", (size_t)(eq - o->sweep)) && eq - o->sweep == 12;
    double val[64];
    int n = 0, ok = (conc || rate) && eq[1];
    for (const char *p = ok ? eq + 1 : ""; ok && *p;) {
        char *end;
        double x = strtod(p, &end);
        if (n == 64 || end == p || (*end && *end != ',') || !(x > 0) || (conc && x != floor(x)) ||
            (n && x <= val[n - 1]))
            ok = 0;
        else
            val[n++] = x;
        p = *end ? end + 1 : end;
    }
    if (!ok || n < 2) {
        fprintf(stderr, "llmserve bench: --sweep expects max-concurrency=V1,V2,... or request-rate=V1,V2,..., "
                        "at least two positive values in increasing order, got '%s'\n",
                o->sweep);
        return 2;
    }
    const char *param = conc ? "max-concurrency" : "request-rate", *mn = tlb_metric_names[o->sweep_metric];
    json_t *points = json_array();
    double thr[64], lat[64], rps[64], p50t[64], p99t[64], p50o[64], p99o[64];
    int got = 0;
    for (int i = 0; i < n && !tlb_stop; i++) {
        printf("\n---- %s=%g ----\n", param, val[i]);
        fflush(stdout);
        json_t *res;
        int done = tlb_run_point(o, conc ? o->rate : val[i], conc ? (long)val[i] : o->max_conc,
                             (uint64_t)o->seed * 1000 + (uint64_t)i, &res);
        if (!res) break;
        if (!done || json_object_get(res, "interrupted")) { /* a cut point would bend the curve */
            json_decref(res);
            break;
        }
        char key[32];
        snprintf(key, sizeof key, "p99_%s_ms", mn);
        thr[got] = tlb_num_of(res, "output_throughput");
        lat[got] = tlb_num_of(res, key);
        rps[got] = tlb_num_of(res, "request_throughput");
        p50t[got] = tlb_num_of(res, "median_ttft_ms");
        p99t[got] = tlb_num_of(res, "p99_ttft_ms");
        p50o[got] = tlb_num_of(res, "median_tpot_ms");
        p99o[got] = tlb_num_of(res, "p99_tpot_ms");
        json_object_set_new(res, "sweep_value", json_real(val[i]));
        json_array_append_new(points, res);
        val[got++] = val[i];
    }
    int reached, knee = tl_bench_knee(thr, lat, got, o->min_gain, o->slo, &reached);
    printf("\n============ Sweep: %s ============\n", param);
    int mark = reached || (o->slo > 0 && knee >= 0) ? knee : -1; /* an unreached knee is only the last point */
    char lh[16];
    snprintf(lh, sizeof lh, "p99 %s", mn);
    printf("%15s %9s %11s %10s %10s %10s %10s %10s\n", param, "req/s", "out tok/s", "p50 TTFT", "p99 TTFT", "p50 TPOT",
           "p99 TPOT", lh);
    printf("%15s %9s %11s %10s %10s %10s %10s %10s\n", "", "", "", "ms", "ms", "ms", "ms", "ms");
    for (int i = 0; i < got; i++)
        printf("%15g %9.2f %11.1f %10.1f %10.1f %10.1f %10.1f %10.1f%s\n", val[i], rps[i], thr[i], p50t[i], p99t[i],
               p50o[i], p99o[i], lat[i], i == mark ? "  <- knee" : "");
    char why[256];
    if (got == 0) snprintf(why, sizeof why, "no point completed");
    else if (o->slo > 0 && knee < 0) snprintf(why, sizeof why, "no point meets p99 %s <= %g ms", mn, o->slo);
    else if (o->slo > 0)
        snprintf(why, sizeof why, "%s=%g is the largest point with p99 %s <= %g ms%s", param, val[knee], mn, o->slo,
                 reached ? "" : " (the last swept: capacity may lie beyond)");
    else if (reached)
        snprintf(why, sizeof why, "past %s=%g throughput gains less than %.0f%% while p99 %s rises", param, val[knee],
                 o->min_gain * 100, mn);
    else
        snprintf(why, sizeof why, "not reached: throughput still gains %.0f%% or more up to %s=%g; sweep further",
                 o->min_gain * 100, param, val[got - 1]);
    printf("Knee: %s\n", why);
    json_t *sw = json_pack("{s:s,s:s,s:o,s:f,s:f}", "sweep", param, "latency_metric", mn, "points", points,
                           "min_gain", o->min_gain, "slo_ms", o->slo);
    json_object_set_new(sw, "knee_index", json_integer(knee));
    json_object_set_new(sw, "knee_value", knee >= 0 ? json_real(val[knee]) : json_null());
    json_object_set_new(sw, "knee_reached", json_boolean(reached));
    json_object_set_new(sw, "knee_reason", json_string(why));
    char fn[768], base[96];
    snprintf(base, sizeof base, "sweep-%s", param);
    if (o->result_file) snprintf(base, sizeof base, "%.*s", (int)strcspn(o->result_file, "."), o->result_file);
    char name[128];
    snprintf(name, sizeof name, "%s.json", base);
    result_path(o, name, fn, sizeof fn);
    int rc = got ? 0 : 1;
    if (json_dump_file(sw, fn, JSON_INDENT(2))) {
        fprintf(stderr, "llmserve bench: cannot write %s\n", fn);
        rc = 1;
    } else printf("sweep result: %s\n", fn);
    json_decref(sw);
    snprintf(name, sizeof name, "%s.svg", base);
    result_path(o, name, fn, sizeof fn);
    FILE *f = got ? fopen(fn, "w") : NULL;
    if (f) {
        char title[200];
        snprintf(title, sizeof title, "%.120s: throughput vs p99 %s, sweep of %s", o->model ? o->model : o->tg.host, mn,
                 param);
        int bad = tl_bench_svg(f, title, param, val, thr, lat, got, mn, mark, o->slo);
        if (fclose(f) || bad) rc = 1;
        printf("plot: %s\n", fn);
        /* a PNG beside it when a converter is installed (rsvg-convert, or ImageMagick's convert) */
        char png[800], cmd[2048];
        snprintf(png, sizeof png, "%.*s.png", (int)(strlen(fn) - 4), fn);
        snprintf(cmd, sizeof cmd,
                 "{ command -v rsvg-convert >/dev/null && rsvg-convert -o '%s' '%s'; } 2>/dev/null || "
                 "{ convert -version 2>/dev/null | grep -q ImageMagick && convert '%s' '%s'; } 2>/dev/null",
                 png, fn, fn, png);
        if (!strchr(fn, '\'') && system(cmd) == 0) printf("plot: %s\n", png);
    } else if (got) {
        fprintf(stderr, "llmserve bench: cannot write %s: %s\n", fn, strerror(errno));
        rc = 1;
    }
    return tlb_stop ? 130 : rc;
}
