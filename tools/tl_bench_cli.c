/* llmserve bench serve: load against any OpenAI-compatible server, with
 * vLLM's `vllm bench serve` flags and result keys. One thread per request
 * slot (--max-concurrency), arrivals from a Poisson (gamma with
 * --burstiness) process, streaming so TTFT and inter-token latencies are
 * seen as the client sees them. Token counts come from the server's usage
 * (or, when a server sends none, one token per streamed chunk).
 * --sweep runs one point per value and finds the capacity knee. */
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

enum { M_TTFT, M_TPOT, M_ITL, M_E2EL, N_METRICS };
static const char *const metric_names[N_METRICS] = {"ttft", "tpot", "itl", "e2el"};

typedef struct {
    char *body;                  /* request JSON */
    char *prompt;                /* its text, for --tokenizer counts */
    char *text;                  /* what came back (kept with --tokenizer) */
    size_t text_len, text_cap;
    int usage_out;               /* the server's completion_tokens, when it sent usage */
    /* results */
    int ok, cancelled, out_tokens, in_tokens, chunks, status;
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
    double rate, burst, range, min_gain, slo;
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

static volatile sig_atomic_t bench_stop;
static void on_int(int s) {
    (void)s;
    bench_stop = 1;
}

static int connect_to(const bench_target *t) {
    struct addrinfo hints = {0}, *res;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(t->host, t->port, &hints, &res)) return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, 0);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

/* Reads what is there, waking every 100 ms to see Ctrl-C: 1 data, 0 end, -1 error, -2 stopped. */
static ssize_t read_or_stop(int fd, char *buf, size_t len) {
    struct pollfd pf = {fd, POLLIN, 0};
    for (;;) {
        if (bench_stop) return -2;
        int pr = poll(&pf, 1, 100);
        if (pr < 0 && errno != EINTR) return -1;
        if (pr > 0) return read(fd, buf, len);
    }
}

static void add_itl(bench_req *q, double gap) {
    if (q->n_itl == q->cap_itl) {
        int cap = q->cap_itl ? 2 * q->cap_itl : 64;
        double *n = realloc(q->itl, sizeof(double) * (size_t)cap);
        if (!n) return;
        q->itl = n;
        q->cap_itl = cap;
    }
    q->itl[q->n_itl++] = gap;
}

static int keep_text; /* --tokenizer given: keep the generated text */

static void append_text(bench_req *q, const char *t) {
    size_t l = strlen(t);
    if (q->text_len + l + 1 > q->text_cap) {
        size_t cap = (q->text_len + l + 1) * 2;
        char *n = realloc(q->text, cap);
        if (!n) return;
        q->text = n;
        q->text_cap = cap;
    }
    memcpy(q->text + q->text_len, t, l + 1);
    q->text_len += l;
}

/* One SSE event's JSON: text (completions) or delta.content (chat), and usage. */
static void on_event(bench_req *q, const char *data, double *last) {
    json_t *j = json_loads(data, 0, NULL);
    if (!j) return;
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    const char *txt = NULL;
    if (ch) {
        json_t *d = json_object_get(ch, "delta");
        txt = json_string_value(d ? json_object_get(d, "content") : json_object_get(ch, "text"));
    }
    if (txt && *txt) {
        double t = cm_now();
        if (q->chunks++ == 0) q->ttft = t - q->start;
        else add_itl(q, t - *last);
        *last = t;
        if (keep_text) append_text(q, txt);
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        q->out_tokens = q->usage_out = (int)json_integer_value(json_object_get(u, "completion_tokens"));
        q->in_tokens = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
    }
    json_decref(j);
}

/* One streaming request; fills the timings and the usage. */
static void run_one(const bench_target *t, bench_req *q) {
    int fd = connect_to(t);
    q->start = cm_now();
    if (fd < 0) {
        q->e2el = cm_now() - q->start;
        return;
    }
    char head[1024];
    size_t bl = strlen(q->body);
    int hl = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%sContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n",
                      t->path, t->host, t->auth, bl);
    if (write(fd, head, (size_t)hl) != hl || write(fd, q->body, bl) != (ssize_t)bl) {
        close(fd);
        q->e2el = cm_now() - q->start;
        return;
    }
    char buf[65536];
    size_t have = 0;
    int status = 0, headers_done = 0, done = 0;
    double last = 0;
    while (!done) {
        ssize_t n = read_or_stop(fd, buf + have, sizeof buf - have - 1);
        if (n == -2) q->cancelled = 1;
        if (n <= 0) break;
        have += (size_t)n;
        buf[have] = 0;
        char *p = buf;
        if (!headers_done) {
            char *e = strstr(buf, "\r\n\r\n");
            if (!e) continue;
            sscanf(buf, "HTTP/1.%*d %d", &status);
            q->status = status;
            headers_done = 1;
            p = e + 4;
        }
        if (status != 200) { /* an error body, not a stream: keep its start for the report */
            size_t l = strlen(q->err);
            snprintf(q->err + l, sizeof q->err - l, "%s", p);
            have = 0;
            continue;
        }
        /* SSE events: "data: ...\n\n" (inside chunked framing, whose size lines we skip) */
        char *ev, *end;
        while ((ev = strstr(p, "data: ")) && (end = strstr(ev, "\n\n"))) {
            *end = 0;
            if (!strncmp(ev + 6, "[DONE]", 6)) {
                done = 1;
                break;
            }
            on_event(q, ev + 6, &last);
            p = end + 2;
        }
        size_t used = (size_t)(p - buf);
        if (used == 0 && have == sizeof buf - 1) break; /* one event over 64 KiB: not a stream we read */
        memmove(buf, p, have - used);
        have -= used;
    }
    if (!q->out_tokens) q->out_tokens = q->chunks; /* no usage: a chunk a token */
    q->ok = done && status == 200 && q->chunks > 0;
    q->e2el = cm_now() - q->start;
    close(fd);
}

static void progress(int done, int n) {
    int w = 30, f = n ? done * w / n : w;
    fprintf(stderr, "\r[%.*s%.*s] %d/%d requests", f, "##############################", w - f,
            "..............................", done, n);
}

static void *slot_thread(void *arg) {
    bench *b = arg;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        int i = b->next < b->n && !bench_stop ? b->next++ : -1;
        pthread_mutex_unlock(&b->mu);
        if (i < 0) break;
        double wait;
        while (!bench_stop && (wait = b->t0 + b->arrival[i] - cm_now()) > 0) {
            if (wait > 0.1) wait = 0.1;
            struct timespec ts = {0, (long)(wait * 1e9)};
            nanosleep(&ts, NULL);
        }
        if (bench_stop) {
            b->r[i].cancelled = 1;
            break;
        }
        pthread_mutex_lock(&b->mu);
        if (++b->active > b->peak_active) b->peak_active = b->active;
        pthread_mutex_unlock(&b->mu);
        run_one(b->tg, &b->r[i]);
        pthread_mutex_lock(&b->mu);
        b->active--;
        int fin = ++b->finished;
        progress(fin, b->n);
        pthread_mutex_unlock(&b->mu);
    }
    return NULL;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* mean / median / std / pNN of one metric, in ms, into res (vLLM's keys). */
static void stats(json_t *res, const bench_opts *o, int m, double *v, int n) {
    const char *name = metric_names[m];
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

/* Peak memory as the server reports it on /metrics while the run lasts:
 * KV cache usage (llmserve: and vllm: names) and resident memory (the
 * server process, plus our worker groups), GPU memory where exported. */
typedef struct {
    const bench_target *tg;
    volatile int stop;
    double peak_kv, peak_rss, peak_gpu;
    int seen;
} mem_poll;

static int http_get(const bench_target *t, const char *path, char **out) {
    int fd = connect_to(t);
    if (fd < 0) return -1;
    char req[512];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n", path, t->host, t->auth);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    ssize_t r;
    while (buf && (r = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)r;
        if (cap - len < 4096) {
            char *nb = cap < (64u << 20) ? realloc(buf, cap *= 2) : NULL;
            if (!nb) break;
            buf = nb;
        }
    }
    close(fd);
    if (!buf) return -1;
    buf[len] = 0;
    *out = buf;
    return strncmp(buf, "HTTP/1.1 200", 12) ? -1 : 0;
}

static void *poll_metrics(void *arg) {
    mem_poll *m = arg;
    while (!m->stop) {
        char *t = NULL, *save = NULL;
        if (!http_get(m->tg, "/metrics", &t)) {
            double kv = 0, rss = 0, gpu = 0;
            for (char *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                if (line[0] == '#') continue;
                char *sp = strrchr(line, ' ');
                if (!sp) continue;
                double v = atof(sp + 1);
                if (strstr(line, "kv_cache_usage_perc") || strstr(line, "gpu_cache_usage_perc")) kv = v > kv ? v : kv;
                else if (!strncmp(line, "process_resident_memory_bytes", 29) || strstr(line, "worker_rss_bytes")) rss += v;
                else if (strstr(line, "gpu_memory_used_bytes")) gpu += v;
            }
            m->seen = 1;
            if (kv > m->peak_kv) m->peak_kv = kv;
            if (rss > m->peak_rss) m->peak_rss = rss;
            if (gpu > m->peak_gpu) m->peak_gpu = gpu;
        }
        free(t);
        for (int i = 0; i < 5 && !m->stop; i++) {
            struct timespec ts = {0, 50000000};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

/* The server's speculative-decoding counters (vLLM's names, which llmserve
 * exports too): proposals, draft tokens, accepted tokens; -1 when it has none. */
static void spec_counts(const bench_target *t, double out[3]) {
    static const char *names[3] = {"vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                                   "vllm:spec_decode_num_accepted_tokens_total"};
    out[0] = out[1] = out[2] = -1;
    char *txt = NULL, *save = NULL;
    if (http_get(t, "/metrics", &txt)) {
        free(txt);
        return;
    }
    for (char *line = strtok_r(txt, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        for (int k = 0; k < 3; k++) {
            size_t nl = strlen(names[k]);
            char *sp = strrchr(line, ' ');
            if (strncmp(line, names[k], nl) || (line[nl] != '{' && line[nl] != ' ') || !sp) continue;
            out[k] = (out[k] < 0 ? 0 : out[k]) + atof(sp + 1);
        }
    free(txt);
}

/* ShareGPT: [{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}, ...].
 * The first human turn is the prompt; the reply's length (4 bytes a token,
 * without a tokenizer) is the output length. */
static int load_sharegpt(const char *path, int want, char ***prompts, int **outs, int *n, char *err, size_t errlen) {
    json_error_t je;
    json_t *a = json_load_file(path, 0, &je);
    if (!a) {
        snprintf(err, errlen, "%s: not valid JSON: %s (line %d)", path, je.text, je.line);
        return LLM_EFORMAT;
    }
    if (!json_is_array(a)) {
        snprintf(err, errlen, "%s: a ShareGPT file is a JSON array of {\"conversations\": [...]}", path);
        json_decref(a);
        return LLM_EFORMAT;
    }
    *prompts = calloc(json_array_size(a) + 1, sizeof **prompts);
    *outs = calloc(json_array_size(a) + 1, sizeof **outs);
    *n = 0;
    size_t i;
    json_t *e;
    json_array_foreach(a, i, e) {
        json_t *cv = json_object_get(e, "conversations");
        json_t *h = json_array_get(cv, 0), *g = json_array_get(cv, 1);
        const char *hf = json_string_value(json_object_get(h, "from")), *gf = json_string_value(json_object_get(g, "from"));
        const char *hv = json_string_value(json_object_get(h, "value")), *gv = json_string_value(json_object_get(g, "value"));
        if (!hf || !gf || !hv || !gv || strcmp(hf, "human") || strcmp(gf, "gpt") || strlen(hv) < 4) continue;
        (*prompts)[*n] = strdup(hv);
        int ol = (int)(strlen(gv) / 4);
        (*outs)[*n] = ol < 4 ? 4 : ol > 2048 ? 2048 : ol;
        (*n)++;
        if (*n >= want) break;
    }
    json_decref(a);
    if (!*n) {
        snprintf(err, errlen, "%s: no conversation starts with a human turn followed by a gpt turn", path);
        free(*prompts);
        free(*outs);
        *prompts = NULL;
        *outs = NULL;
        return LLM_EFORMAT;
    }
    return 0;
}

/* The request bodies of one run: random words (text works on both endpoints
 * and every server), a shared prefix per group, or ShareGPT turns. */
static int build_requests(const bench_opts *o, uint64_t seed, bench_req *r, int total) {
    static const char *words[] = {"river", "stone", "light", "market", "engine", "garden", "signal", "forest", "paper",
                                  "window", "silver", "ocean", "winter", "thread", "bridge", "planet"};
    tl_bench_seed(seed);
    int prefix = !strcmp(o->dataset, "prefix-repetition");
    char **prefixes = calloc((size_t)o->n_px, sizeof *prefixes);
    if (!prefixes) return LLM_ENOMEM;
    for (int p = 0; p < o->n_px; p++) {
        prefixes[p] = malloc((size_t)o->px_len * 8 + 1);
        if (!prefixes[p]) continue;
        size_t off = 0;
        for (int w = 0; w < o->px_len; w++)
            off += (size_t)sprintf(prefixes[p] + off, "%s ", words[(size_t)(tl_bench_urand() * 16)]);
        prefixes[p][off] = 0;
    }
    int rc = 0;
    for (int i = 0; i < total && !rc; i++) {
        int il = prefix ? (int)o->sx_len : (int)((double)o->in_len * (1 - o->range + 2 * o->range * tl_bench_urand()));
        int ol = prefix ? (int)o->px_out : (int)((double)o->out_len * (1 - o->range + 2 * o->range * tl_bench_urand()));
        if (il < 1) il = 1;
        if (ol < 1) ol = 1;
        char *text;
        if (o->sg) {
            text = strdup(o->sg[i % o->n_sg]);
            ol = o->sg_out[i % o->n_sg];
        } else {
            const char *px = prefix ? prefixes[i % o->n_px] : NULL;
            text = malloc((size_t)il * 8 + (px ? strlen(px) : 0) + 1);
            if (text) {
                size_t off = px ? (size_t)sprintf(text, "%s", px) : 0;
                for (int w = 0; w < il; w++)
                    off += (size_t)sprintf(text + off, "%s ", words[(size_t)(tl_bench_urand() * 16)]);
                text[off] = 0;
            }
        }
        r[i].prompt = text ? strdup(text) : NULL;
        json_t *j = !text   ? NULL
                    : o->chat ? json_pack("{s:[{s:s,s:s}]}", "messages", "role", "user", "content", text)
                              : json_pack("{s:s}", "prompt", text);
        free(text);
        if (!j) {
            rc = LLM_ENOMEM;
            break;
        }
        json_object_set_new(j, "max_tokens", json_integer(ol));
        json_object_set_new(j, "stream", json_true());
        json_object_set_new(j, "stream_options", json_pack("{s:b}", "include_usage", 1));
        json_object_set_new(j, "temperature", json_real(0));
        if (o->model) json_object_set_new(j, "model", json_string(o->model));
        if (o->ignore_eos) json_object_set_new(j, "ignore_eos", json_true());
        r[i].body = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        if (!r[i].body) rc = LLM_ENOMEM;
    }
    for (int p = 0; p < o->n_px; p++) free(prefixes[p]);
    free(prefixes);
    return rc;
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

/* One run at (rate, max_conc): the requests, the report printed, the JSON in
 * *out. Returns how many requests completed. */
static int run_point(const bench_opts *o, double rate, long max_conc, uint64_t seed, json_t **out) {
    int total = (int)(o->num + o->warm), num = (int)o->num, warm = (int)o->warm;
    bench_req *all = calloc((size_t)total, sizeof *all);
    double *arrival = calloc((size_t)num, sizeof *arrival);
    *out = NULL;
    if (!all || !arrival || build_requests(o, seed, all, total)) {
        fprintf(stderr, "llmserve bench: out of memory building %d requests\n", total);
        for (int i = 0; all && i < total; i++) free(all[i].body);
        free(all);
        free(arrival);
        return 0;
    }
    for (int i = 0; i < warm && !bench_stop; i++) run_one(&o->tg, &all[i]); /* one at a time, not reported */
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
    spec_counts(&o->tg, spec0);
    int polling = pthread_create(&mth, NULL, poll_metrics, &mp) == 0, started = 0;
    b.t0 = cm_now();
    for (; th && started < slots; started++)
        if (pthread_create(&th[started], NULL, slot_thread, &b)) break;
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    double dur = cm_now() - b.t0;
    mp.stop = 1;
    if (polling) pthread_join(mth, NULL);
    spec_counts(&o->tg, spec1);
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
            if (q->cancelled || (bench_stop && q->e2el == 0)) cancelled++;
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

static double num_of(json_t *res, const char *key) { return json_number_value(json_object_get(res, key)); }

/* --sweep max-concurrency=1,2,4 | request-rate=1,2,4: a run per value, a
 * table, the knee, the plot. */
static int run_sweep(const bench_opts *o) {
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
    const char *param = conc ? "max-concurrency" : "request-rate", *mn = metric_names[o->sweep_metric];
    json_t *points = json_array();
    double thr[64], lat[64], rps[64], p50t[64], p99t[64], p50o[64], p99o[64];
    int got = 0;
    for (int i = 0; i < n && !bench_stop; i++) {
        printf("\n---- %s=%g ----\n", param, val[i]);
        fflush(stdout);
        json_t *res;
        int done = run_point(o, conc ? o->rate : val[i], conc ? (long)val[i] : o->max_conc,
                             (uint64_t)o->seed * 1000 + (uint64_t)i, &res);
        if (!res) break;
        if (!done || json_object_get(res, "interrupted")) { /* a cut point would bend the curve */
            json_decref(res);
            break;
        }
        char key[32];
        snprintf(key, sizeof key, "p99_%s_ms", mn);
        thr[got] = num_of(res, "output_throughput");
        lat[got] = num_of(res, key);
        rps[got] = num_of(res, "request_throughput");
        p50t[got] = num_of(res, "median_ttft_ms");
        p99t[got] = num_of(res, "p99_ttft_ms");
        p50o[got] = num_of(res, "median_tpot_ms");
        p99o[got] = num_of(res, "p99_tpot_ms");
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
    return bench_stop ? 130 : rc;
}

/* "http://host:port/prefix" -> host, port, path prefix + endpoint. */
static int parse_target(const char *base, const char *endpoint, const char *api_key, bench_target *t) {
    memset(t, 0, sizeof *t);
    if (!strncmp(base, "https://", 8)) {
        fprintf(stderr, "llmserve bench: https is not supported; put the server behind plain http for the bench\n");
        return 2;
    }
    const char *hp = strstr(base, "://") ? strstr(base, "://") + 3 : base;
    size_t hl = strcspn(hp, ":/");
    const char *rest = hp + hl, *port = "80";
    size_t pl = 2;
    if (*rest == ':') {
        port = rest + 1;
        pl = strcspn(port, "/");
        rest = port + pl;
    }
    size_t bl = strlen(rest);
    while (bl && rest[bl - 1] == '/') bl--;
    if (!hl || hl >= sizeof t->host || !pl || pl >= sizeof t->port || strspn(port, "0123456789") < pl ||
        bl + strlen(endpoint) >= sizeof t->path || endpoint[0] != '/') {
        fprintf(stderr, "llmserve bench: bad --base-url '%s' or --endpoint '%s'\n", base, endpoint);
        return 2;
    }
    memcpy(t->host, hp, hl);
    memcpy(t->port, port, pl);
    snprintf(t->path, sizeof t->path, "%.*s%s", (int)bl, rest, endpoint);
    if (api_key && (strlen(api_key) > 250 || strpbrk(api_key, "\r\n"))) {
        fprintf(stderr, "llmserve bench: --api-key must be one line of at most 250 characters\n");
        return 2;
    }
    if (api_key) snprintf(t->auth, sizeof t->auth, "Authorization: Bearer %s\r\n", api_key);
    return 0;
}

static int parse_lists(bench_opts *o, const char *pcts, const char *metrics) {
    o->np = 0;
    for (const char *p = pcts; *p;) {
        char *end;
        double x = strtod(p, &end);
        if (end == p || (*end && *end != ',') || !(x > 0 && x <= 100) || o->np == 16) {
            fprintf(stderr, "llmserve bench: --metric-percentiles expects up to 16 numbers in (0, 100], like 50,90,99\n");
            return 2;
        }
        o->pcts[o->np++] = x;
        p = *end ? end + 1 : end;
    }
    memset(o->show, 0, sizeof o->show);
    for (const char *p = metrics; *p;) {
        size_t l = strcspn(p, ",");
        int m = 0;
        while (m < N_METRICS && (strlen(metric_names[m]) != l || strncmp(p, metric_names[m], l))) m++;
        if (m == N_METRICS) {
            fprintf(stderr, "llmserve bench: --percentile-metrics expects a list of ttft,tpot,itl,e2el\n");
            return 2;
        }
        o->show[m] = 1;
        p += l + (p[l] == ',');
    }
    for (const char *p = o->goodput; p && *p;) {
        p += strspn(p, " ");
        if (!*p) break;
        int m = 0;
        while (m < N_METRICS && (strncmp(p, metric_names[m], strlen(metric_names[m])) || p[strlen(metric_names[m])] != ':'))
            m++;
        char *end = NULL;
        double ms = m < N_METRICS && m != M_ITL ? strtod(p + strlen(metric_names[m]) + 1, &end) : 0;
        if (!end || !(ms > 0) || (*end && *end != ' ')) {
            fprintf(stderr, "llmserve bench: --goodput expects \"ttft:MS tpot:MS e2el:MS\" (any of them), got '%s'\n",
                    o->goodput);
            return 2;
        }
        o->g[m] = ms / 1e3;
        p = end;
    }
    return 0;
}

static void usage(void) {
    printf("usage: llmserve bench serve [flags]\n"
           "  --base-url URL              server (default http://127.0.0.1:8000)\n"
           "  --endpoint PATH             /v1/completions (default) or /v1/chat/completions\n"
           "  --model NAME                model field of the requests\n"
           "  --api-key KEY               sent as a bearer token\n"
           "  --tokenizer GGUF            count prompt and output tokens with this model's tokenizer\n"
           "                              (default: the server's usage, else one token per streamed chunk)\n"
           "  --dataset-name NAME         random (default), prefix-repetition or sharegpt\n"
           "  --dataset-path FILE         ShareGPT JSON for --dataset-name sharegpt\n"
           "  --num-prompts N             requests per run (default 100)\n"
           "  --random-input-len N        words per random prompt (default 256)\n"
           "  --random-output-len N       max_tokens per request (default 128)\n"
           "  --random-range-ratio F      lengths drawn in [1-F, 1+F] x the mean (default 0)\n"
           "  --prefix-repetition-prefix-len N, -suffix-len N, -num-prefixes N, -output-len N (256, 256, 10, 128)\n"
           "  --request-rate R|inf        arrivals per second (default inf: all at once)\n"
           "  --burstiness F              gamma shape of the arrivals; 1 is Poisson (default 1)\n"
           "  --max-concurrency N         requests in flight at most (default: no limit)\n"
           "  --num-warmups N             requests sent one at a time first, not counted (default 0)\n"
           "  --seed N                    prompts and arrivals (default 0)\n"
           "  --ignore-eos                generate max_tokens whatever the model says\n"
           "  --percentile-metrics LIST   metrics printed with percentiles (default ttft,tpot,itl,e2el)\n"
           "  --metric-percentiles LIST   percentiles (default 50,90,99)\n"
           "  --goodput \"ttft:MS tpot:MS e2el:MS\"  SLOs a request must meet to count as good\n"
           "  --save-result               write the result JSON (a name like vLLM's)\n"
           "  --result-dir DIR            where result files go (default .)\n"
           "  --result-filename F         the result JSON's name (a sweep: the base of its files)\n"
           "  --sweep max-concurrency=1,2,4,...|request-rate=1,2,4,...\n"
           "                              one run per value; a table, the knee, a plot (SVG; PNG if a converter)\n"
           "  --sweep-metric M            latency of the knee and plot: ttft, tpot, itl or e2el (default e2el)\n"
           "  --sweep-min-gain F          knee: the next point gains less than F of throughput (default 0.10)\n"
           "  --sweep-slo MS              knee: the largest point whose p99 of --sweep-metric is within MS\n"
           "Ctrl-C stops: what finished is reported, the rest is not counted (exit 130).\n");
}

/* llmserve bench plot SWEEP.json OUT.svg: redraws a saved sweep. */
static int plot_main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: llmserve bench plot SWEEP.json OUT.svg\n");
        return 2;
    }
    json_error_t je;
    json_t *sw = json_load_file(argv[2], 0, &je), *pts = json_object_get(sw, "points");
    const char *param = json_string_value(json_object_get(sw, "sweep")),
               *mn = json_string_value(json_object_get(sw, "latency_metric"));
    size_t n = json_array_size(pts);
    if (!sw || !param || !mn || n == 0 || n > 64 || strlen(mn) > 8) {
        fprintf(stderr, "llmserve bench plot: %s is not a sweep result of llmserve bench serve --sweep\n", argv[2]);
        json_decref(sw);
        return 2;
    }
    double val[64], thr[64], lat[64];
    char key[32];
    snprintf(key, sizeof key, "p99_%s_ms", mn);
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_array_get(pts, i);
        val[i] = num_of(p, "sweep_value");
        thr[i] = num_of(p, "output_throughput");
        lat[i] = num_of(p, key);
    }
    int knee = json_is_true(json_object_get(sw, "knee_reached")) || num_of(sw, "slo_ms") > 0
                   ? (int)json_integer_value(json_object_get(sw, "knee_index"))
                   : -1;
    const char *model = json_string_value(json_object_get(json_array_get(pts, 0), "model_id"));
    char title[200];
    snprintf(title, sizeof title, "%.120s: throughput vs p99 %s, sweep of %s", model ? model : "server", mn, param);
    FILE *f = fopen(argv[3], "w");
    int bad = !f || tl_bench_svg(f, title, param, val, thr, lat, (int)n, mn, knee, num_of(sw, "slo_ms"));
    if (f && fclose(f)) bad = 1;
    json_decref(sw);
    if (bad) fprintf(stderr, "llmserve bench plot: cannot write %s\n", argv[3]);
    return bad;
}

int tl_bench_main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "plot")) return plot_main(argc, argv);
    if (argc < 2 || strcmp(argv[1], "serve")) {
        fprintf(stderr, "usage: llmserve bench serve [flags]   (--help for the flags)\n"
                        "       llmserve bench plot SWEEP.json OUT.svg\n");
        return 2;
    }
    argc--;
    argv++;
    bench_opts o = {.endpoint = "/v1/completions", .dataset = "random", .rate = INFINITY, .burst = 1,
                    .min_gain = 0.10, .num = 100, .in_len = 256, .out_len = 128, .px_len = 256, .sx_len = 256,
                    .n_px = 10, .px_out = 128, .sweep_metric = M_E2EL};
    const char *base = "http://127.0.0.1:8000", *api_key = NULL, *pcts = "50,90,99", *pmetrics = "ttft,tpot,itl,e2el",
               *dataset_path = NULL;
    enum { O_PXL = 256, O_SXL, O_NPX, O_PXO, O_DSP, O_PM, O_RD, O_SW, O_SWM, O_SWG, O_SWS, O_TOK };
    const char *tok_path = NULL;
    static const struct option lo[] = {
        {"base-url", 1, 0, 'u'}, {"endpoint", 1, 0, 'e'}, {"model", 1, 0, 'm'}, {"dataset-name", 1, 0, 'd'},
        {"num-prompts", 1, 0, 'n'}, {"random-input-len", 1, 0, 'i'}, {"random-output-len", 1, 0, 'o'},
        {"random-range-ratio", 1, 0, 'R'}, {"request-rate", 1, 0, 'r'}, {"burstiness", 1, 0, 'b'},
        {"max-concurrency", 1, 0, 'c'}, {"num-warmups", 1, 0, 'w'}, {"seed", 1, 0, 's'}, {"ignore-eos", 0, 0, 'E'},
        {"metric-percentiles", 1, 0, 'p'}, {"goodput", 1, 0, 'g'}, {"save-result", 0, 0, 'S'},
        {"result-filename", 1, 0, 'f'}, {"api-key", 1, 0, 'k'}, {"prefix-repetition-prefix-len", 1, 0, O_PXL},
        {"prefix-repetition-suffix-len", 1, 0, O_SXL}, {"prefix-repetition-num-prefixes", 1, 0, O_NPX},
        {"prefix-repetition-output-len", 1, 0, O_PXO}, {"dataset-path", 1, 0, O_DSP},
        {"percentile-metrics", 1, 0, O_PM}, {"result-dir", 1, 0, O_RD}, {"sweep", 1, 0, O_SW},
        {"sweep-metric", 1, 0, O_SWM}, {"sweep-min-gain", 1, 0, O_SWG}, {"sweep-slo", 1, 0, O_SWS},
        {"tokenizer", 1, 0, O_TOK},
        {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int c, bad = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'u': base = optarg; break;
        case 'e': o.endpoint = optarg; break;
        case 'm': o.model = optarg; break;
        case 'd': o.dataset = optarg; break;
        case 'n': bad |= cm_parse_long("--num-prompts", optarg, 1, 1000000, &o.num); break;
        case 'i': bad |= cm_parse_long("--random-input-len", optarg, 1, 1000000, &o.in_len); break;
        case 'o': bad |= cm_parse_long("--random-output-len", optarg, 1, 1000000, &o.out_len); break;
        case 'R': bad |= cm_parse_double("--random-range-ratio", optarg, 0, 0.999, &o.range); break;
        case 'r':
            if (!strcmp(optarg, "inf")) o.rate = INFINITY;
            else bad |= cm_parse_double("--request-rate", optarg, 1e-6, 1e9, &o.rate);
            break;
        case 'b': bad |= cm_parse_double("--burstiness", optarg, 1e-3, 1e3, &o.burst); break;
        case 'c': bad |= cm_parse_long("--max-concurrency", optarg, 1, 100000, &o.max_conc); break;
        case 'w': bad |= cm_parse_long("--num-warmups", optarg, 0, 10000, &o.warm); break;
        case 's': bad |= cm_parse_long("--seed", optarg, 0, 1L << 40, &o.seed); break;
        case 'E': o.ignore_eos = 1; break;
        case 'p': pcts = optarg; break;
        case 'g': o.goodput = optarg; break;
        case 'S': o.save = 1; break;
        case 'f': o.result_file = optarg; break;
        case 'k': api_key = optarg; break;
        case O_PXL: bad |= cm_parse_long("--prefix-repetition-prefix-len", optarg, 0, 1000000, &o.px_len); break;
        case O_SXL: bad |= cm_parse_long("--prefix-repetition-suffix-len", optarg, 1, 1000000, &o.sx_len); break;
        case O_NPX: bad |= cm_parse_long("--prefix-repetition-num-prefixes", optarg, 1, 100000, &o.n_px); break;
        case O_PXO: bad |= cm_parse_long("--prefix-repetition-output-len", optarg, 1, 1000000, &o.px_out); break;
        case O_DSP: dataset_path = optarg; break;
        case O_PM: pmetrics = optarg; break;
        case O_RD: o.result_dir = optarg; break;
        case O_SW: o.sweep = optarg; break;
        case O_SWM: {
            int m = 0;
            while (m < N_METRICS && strcmp(optarg, metric_names[m])) m++;
            if (m == N_METRICS) {
                fprintf(stderr, "llmserve bench: --sweep-metric expects ttft, tpot, itl or e2el\n");
                bad = 1;
            }
            o.sweep_metric = m < N_METRICS ? m : M_E2EL;
            break;
        }
        case O_SWG: bad |= cm_parse_double("--sweep-min-gain", optarg, 0, 10, &o.min_gain); break;
        case O_SWS: bad |= cm_parse_double("--sweep-slo", optarg, 1e-3, 1e9, &o.slo); break;
        case O_TOK: tok_path = optarg; break;
        case 'h': usage(); return 0;
        default: return 2;
        }
    }
    if (bad || optind < argc) {
        if (optind < argc) fprintf(stderr, "llmserve bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (parse_target(base, o.endpoint, api_key, &o.tg) || parse_lists(&o, pcts, pmetrics)) return 2;
    o.chat = strstr(o.endpoint, "chat") != NULL;
    if (strcmp(o.dataset, "random") && strcmp(o.dataset, "prefix-repetition") && strcmp(o.dataset, "sharegpt")) {
        fprintf(stderr, "llmserve bench: --dataset-name must be random, prefix-repetition or sharegpt\n");
        return 2;
    }
    if (o.result_dir) {
        struct stat st;
        if (mkdir(o.result_dir, 0755) && errno != EEXIST) {
            fprintf(stderr, "llmserve bench: cannot create --result-dir %s: %s\n", o.result_dir, strerror(errno));
            return 2;
        }
        if (stat(o.result_dir, &st) || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "llmserve bench: --result-dir %s is not a directory\n", o.result_dir);
            return 2;
        }
    }
    if (!strcmp(o.dataset, "sharegpt")) {
        char err[512];
        if (!dataset_path) {
            fprintf(stderr, "llmserve bench: --dataset-name sharegpt needs --dataset-path FILE\n");
            return 2;
        }
        if (load_sharegpt(dataset_path, (int)(o.num + o.warm), &o.sg, &o.sg_out, &o.n_sg, err, sizeof err)) {
            fprintf(stderr, "llmserve bench: %s\n", err);
            return 2;
        }
    }
    cm_model_file *tok_file = NULL;
    if (tok_path) { /* the model's GGUF: its tokenizer counts prompt and output tokens on this side */
        char err[512];
        int trc = cm_model_open(tok_path, &tok_file, err, sizeof err);
        if (!trc && tok_file->format != CM_FMT_GGUF) {
            snprintf(err, sizeof err, "%s: --tokenizer takes a GGUF model file", tok_path);
            trc = LLM_EFORMAT;
        }
        if (!trc && (trc = cm_tok_from_gguf(tok_file->gguf, &o.tok, err, sizeof err)) == 0) keep_text = 1;
        if (trc) {
            fprintf(stderr, "llmserve bench: --tokenizer %s\n", err);
            cm_model_close(tok_file);
            return 2;
        }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_int;
    sigaction(SIGINT, &sa, NULL);
    int rc;
    if (o.sweep) rc = run_sweep(&o);
    else {
        json_t *res;
        int done = run_point(&o, o.rate, o.max_conc, (uint64_t)o.seed, &res);
        json_decref(res);
        rc = bench_stop ? 130 : done > 0 ? 0 : 1;
    }
    for (int i = 0; i < o.n_sg; i++) free(o.sg[i]);
    free(o.sg);
    free(o.sg_out);
    cm_tok_free(o.tok);
    cm_model_close(tok_file);
    return rc;
}
