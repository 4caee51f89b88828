/* llmserve bench serve: load against any OpenAI-compatible server, with
 * vLLM's `vllm bench serve` flags and result keys. One thread per request
 * slot (--max-concurrency), arrivals from a Poisson (gamma with
 * --burstiness) process, streaming so TTFT and inter-token latencies are
 * seen as the client sees them. Token counts come from the server's usage. */
#include "cm_error.h"
#include "tl_common.h"
#include "tl_plan.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    char *body;                  /* request JSON */
    int prompt_len, output_len;
    /* results */
    int ok, out_tokens, in_tokens;
    double start, ttft, e2el;
    double *itl;
    int n_itl, cap_itl;
} bench_req;

typedef struct {
    char host[256], port[16], path[128], auth[300];
    bench_req *r;
    int n, next, max_conc, active, peak_active;
    double *arrival;             /* seconds after t0 */
    double t0;
    pthread_mutex_t mu;
    volatile sig_atomic_t *stop;
} bench;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 1;
static double urand(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* Gamma(shape k, scale theta) by Marsaglia-Tsang; k = burstiness, mean 1/rate. */
static double gamma_draw(double k, double theta) {
    if (k < 1) return gamma_draw(k + 1, theta) * pow(urand(), 1.0 / k);
    double d = k - 1.0 / 3, c = 1 / sqrt(9 * d);
    for (;;) {
        double x, v;
        do {
            double u1 = urand(), u2 = urand();
            x = sqrt(-2 * log(u1 > 0 ? u1 : 1e-300)) * cos(2 * M_PI * u2);
            v = 1 + c * x;
        } while (v <= 0);
        v = v * v * v;
        double u = urand();
        if (u < 1 - 0.0331 * x * x * x * x || log(u) < 0.5 * x * x + d * (1 - v + log(v))) return d * v * theta;
    }
}

/* Inter-arrival gaps for rate (req/s) and burstiness (1 = Poisson). */
double tl_bench_gap(double rate, double burstiness) {
    if (!isfinite(rate) || rate <= 0) return 0;
    return gamma_draw(burstiness, 1.0 / (rate * burstiness));
}

static int connect_to(const bench *b) {
    struct addrinfo hints = {0}, *res;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(b->host, b->port, &hints, &res)) return -1;
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

/* One streaming request; fills the timings and the usage. */
static void run_one(bench *b, bench_req *q) {
    int fd = connect_to(b);
    q->start = now();
    if (fd < 0) return;
    char head[1024];
    size_t bl = strlen(q->body);
    int hl = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%sContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n",
                      b->path, b->host, b->auth, bl);
    if (write(fd, head, (size_t)hl) != hl || write(fd, q->body, bl) != (ssize_t)bl) {
        close(fd);
        return;
    }
    char buf[65536];
    size_t have = 0;
    int status = 0, headers_done = 0, done = 0;
    double last = 0;
    while (!done) {
        ssize_t n = read(fd, buf + have, sizeof buf - have - 1);
        if (n <= 0) break;
        have += (size_t)n;
        buf[have] = 0;
        char *p = buf;
        if (!headers_done) {
            char *e = strstr(buf, "\r\n\r\n");
            if (!e) continue;
            sscanf(buf, "HTTP/1.1 %d", &status);
            headers_done = 1;
            p = e + 4;
        }
        /* SSE events: "data: ...\n\n" (possibly inside chunked framing lines, which we skip) */
        char *ev;
        while ((ev = strstr(p, "data: ")) && strstr(ev, "\n\n")) {
            char *end = strstr(ev, "\n\n");
            *end = 0;
            const char *data = ev + 6;
            if (!strncmp(data, "[DONE]", 6)) {
                done = 1;
                q->ok = status == 200 && q->out_tokens > 0;
                break;
            }
            json_t *j = json_loads(data, 0, NULL);
            if (j) {
                json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
                const char *txt = NULL;
                if (ch) {
                    json_t *d = json_object_get(ch, "delta");
                    txt = json_string_value(d ? json_object_get(d, "content") : json_object_get(ch, "text"));
                }
                if (txt && *txt) {
                    double t = now();
                    if (q->ttft == 0) q->ttft = t - q->start;
                    else {
                        if (q->n_itl == q->cap_itl) {
                            q->cap_itl = q->cap_itl ? 2 * q->cap_itl : 64;
                            q->itl = realloc(q->itl, sizeof(double) * (size_t)q->cap_itl);
                        }
                        if (q->itl) q->itl[q->n_itl++] = t - last;
                    }
                    last = t;
                }
                json_t *u = json_object_get(j, "usage");
                if (json_is_object(u)) {
                    q->out_tokens = (int)json_integer_value(json_object_get(u, "completion_tokens"));
                    q->in_tokens = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
                }
                json_decref(j);
            }
            p = end + 2;
        }
        size_t used = (size_t)(p - buf);
        memmove(buf, p, have - used);
        have -= used;
    }
    q->e2el = now() - q->start;
    close(fd);
}

static void *slot_thread(void *arg) {
    bench *b = arg;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        int i = b->next < b->n && !*b->stop ? b->next++ : -1;
        pthread_mutex_unlock(&b->mu);
        if (i < 0) break;
        double wait = b->t0 + b->arrival[i] - now();
        if (wait > 0) {
            struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&b->mu);
        if (++b->active > b->peak_active) b->peak_active = b->active;
        pthread_mutex_unlock(&b->mu);
        run_one(b, &b->r[i]);
        pthread_mutex_lock(&b->mu);
        b->active--;
        int fin = 0;
        for (int k = 0; k < b->n; k++) fin += b->r[k].e2el > 0;
        pthread_mutex_unlock(&b->mu);
        fprintf(stderr, "\rbench: %d/%d requests done", fin, b->n);
    }
    return NULL;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* vLLM's percentile: linear interpolation between order statistics. */
double tl_bench_percentile(const double *sorted, int n, double p) {
    if (n <= 0) return 0;
    double r = p / 100.0 * (n - 1);
    int lo = (int)floor(r), hi = lo + 1 < n ? lo + 1 : lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (r - lo);
}

static void stats(json_t *res, const char *name, double *v, int n, const double *pcts, int np, int print) {
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
    if (print) printf("%-6s mean %9.2f ms  median %9.2f ms", name, mean * 1e3, tl_bench_percentile(v, n, 50) * 1e3);
    for (int i = 0; i < np; i++) {
        snprintf(key, sizeof key, "p%g_%s_ms", pcts[i], name);
        double x = tl_bench_percentile(v, n, pcts[i]) * 1e3;
        json_object_set_new(res, key, json_real(x));
        if (print) printf("  p%g %9.2f ms", pcts[i], x);
    }
    if (print) printf("\n");
}

/* Peak memory as the server reports it on /metrics while the run lasts:
 * KV cache usage (llmserve: and vllm: names) and resident memory (the
 * server process, plus our worker groups). */
typedef struct {
    bench *b;
    volatile int stop;
    double peak_kv, peak_rss;
    int seen;
} mem_poll;

static int http_get(const bench *b, const char *path, char **out) {
    int fd = connect_to(b);
    if (fd < 0) return -1;
    char req[512];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n", path, b->host, b->auth);
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
            char *nb = realloc(buf, cap *= 2);
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
        if (!http_get(m->b, "/metrics", &t)) {
            double kv = 0, rss = 0;
            for (char *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                if (line[0] == '#') continue;
                char *sp = strrchr(line, ' ');
                if (!sp) continue;
                double v = atof(sp + 1);
                if (strstr(line, "kv_cache_usage_perc") || strstr(line, "gpu_cache_usage_perc")) kv = v > kv ? v : kv;
                else if (!strncmp(line, "process_resident_memory_bytes", 29) || strstr(line, "worker_rss_bytes")) rss += v;
            }
            m->seen = 1;
            if (kv > m->peak_kv) m->peak_kv = kv;
            if (rss > m->peak_rss) m->peak_rss = rss;
        }
        free(t);
        struct timespec ts = {0, 250000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
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

static volatile sig_atomic_t bench_stop;
static void on_int(int s) {
    (void)s;
    bench_stop = 1;
}

int tl_bench_main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "serve")) {
        fprintf(stderr, "usage: llmserve bench serve [flags]   (--help for the flags)\n");
        return 2;
    }
    argc--;
    argv++;
    const char *base = "http://127.0.0.1:8000", *endpoint = "/v1/completions", *model = NULL, *dataset = "random",
               *save = NULL, *api_key = NULL, *pcts_s = "50,90,99", *goodput = NULL, *dataset_path = NULL;
    double rate = INFINITY, burst = 1, range = 0;
    int num = 100, in_len = 256, out_len = 128, max_conc = 0, seed = 0, ignore_eos = 0, warm = 0;
    int px_len = 256, sx_len = 256, n_px = 10, px_out = 128;
    static const struct option lo[] = {{"base-url", 1, 0, 'u'}, {"endpoint", 1, 0, 'e'}, {"model", 1, 0, 'm'},
                                       {"dataset-name", 1, 0, 'd'}, {"num-prompts", 1, 0, 'n'},
                                       {"random-input-len", 1, 0, 'i'}, {"random-output-len", 1, 0, 'o'},
                                       {"random-range-ratio", 1, 0, 'R'}, {"request-rate", 1, 0, 'r'},
                                       {"burstiness", 1, 0, 'b'}, {"max-concurrency", 1, 0, 'c'},
                                       {"num-warmups", 1, 0, 'w'}, {"seed", 1, 0, 's'}, {"ignore-eos", 0, 0, 'E'},
                                       {"metric-percentiles", 1, 0, 'p'}, {"goodput", 1, 0, 'g'},
                                       {"save-result", 0, 0, 'S'}, {"result-filename", 1, 0, 'f'},
                                       {"api-key", 1, 0, 'k'}, {"prefix-repetition-prefix-len", 1, 0, 1},
                                       {"prefix-repetition-suffix-len", 1, 0, 2}, {"prefix-repetition-num-prefixes", 1, 0, 3},
                                       {"prefix-repetition-output-len", 1, 0, 4}, {"dataset-path", 1, 0, 5},
                                       {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int c, do_save = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'u': base = optarg; break;
        case 'e': endpoint = optarg; break;
        case 'm': model = optarg; break;
        case 'd': dataset = optarg; break;
        case 'n': num = atoi(optarg); break;
        case 'i': in_len = atoi(optarg); break;
        case 'o': out_len = atoi(optarg); break;
        case 'R': range = atof(optarg); break;
        case 'r': rate = !strcmp(optarg, "inf") ? INFINITY : atof(optarg); break;
        case 'b': burst = atof(optarg); break;
        case 'c': max_conc = atoi(optarg); break;
        case 'w': warm = atoi(optarg); break;
        case 's': seed = atoi(optarg); break;
        case 'E': ignore_eos = 1; break;
        case 'p': pcts_s = optarg; break;
        case 'g': goodput = optarg; break;
        case 'S': do_save = 1; break;
        case 'f': save = optarg; break;
        case 'k': api_key = optarg; break;
        case 1: px_len = atoi(optarg); break;
        case 2: sx_len = atoi(optarg); break;
        case 3: n_px = atoi(optarg); break;
        case 4: px_out = atoi(optarg); break;
        case 5: dataset_path = optarg; break;
        case 'h':
            printf("usage: llmserve bench serve [--base-url URL] [--endpoint /v1/completions|/v1/chat/completions]\n"
                   "  [--model NAME] [--dataset-name random|prefix-repetition|sharegpt] [--dataset-path FILE] [--num-prompts N]\n"
                   "  [--random-input-len N] [--random-output-len N] [--random-range-ratio F]\n"
                   "  [--prefix-repetition-prefix-len N --prefix-repetition-suffix-len N\n"
                   "   --prefix-repetition-num-prefixes N --prefix-repetition-output-len N]\n"
                   "  [--request-rate R|inf] [--burstiness F] [--max-concurrency N] [--num-warmups N] [--seed N]\n"
                   "  [--ignore-eos] [--metric-percentiles 50,90,99] [--goodput ttft:MS tpot:MS e2el:MS]\n"
                   "  [--save-result] [--result-filename F] [--api-key KEY]\n");
            return 0;
        default: return 2;
        }
    }
    if (num < 1 || in_len < 1 || out_len < 1 || !(burst > 0) || range < 0 || range >= 1 || n_px < 1 || px_len < 0 ||
        sx_len < 1 || px_out < 1) {
        fprintf(stderr, "llmserve bench: bad numeric flag\n");
        return 2;
    }
    bench b;
    memset(&b, 0, sizeof b);
    const char *hp = strstr(base, "://") ? strstr(base, "://") + 3 : base;
    const char *colon = strchr(hp, ':'), *slash = strchr(hp, '/');
    size_t hl = colon ? (size_t)(colon - hp) : slash ? (size_t)(slash - hp) : strlen(hp);
    if (hl >= sizeof b.host) return 2;
    memcpy(b.host, hp, hl);
    snprintf(b.port, sizeof b.port, "%.*s", colon ? (int)((slash ? slash : colon + strlen(colon)) - colon - 1) : 2,
             colon ? colon + 1 : "80");
    snprintf(b.path, sizeof b.path, "%s", endpoint);
    if (api_key) snprintf(b.auth, sizeof b.auth, "Authorization: Bearer %.250s\r\n", api_key);
    int chat = strstr(endpoint, "chat") != NULL;
    if (strcmp(dataset, "random") && strcmp(dataset, "prefix-repetition") && strcmp(dataset, "sharegpt")) {
        fprintf(stderr, "llmserve bench: --dataset-name must be random, prefix-repetition or sharegpt\n");
        return 2;
    }
    char **sg = NULL;
    int *sg_out = NULL, n_sg = 0;
    if (!strcmp(dataset, "sharegpt")) {
        char err[512];
        if (!dataset_path) {
            fprintf(stderr, "llmserve bench: --dataset-name sharegpt needs --dataset-path FILE\n");
            return 2;
        }
        if (load_sharegpt(dataset_path, num + warm, &sg, &sg_out, &n_sg, err, sizeof err)) {
            fprintf(stderr, "llmserve bench: %s\n", err);
            return 2;
        }
    }
    rng_state = (uint64_t)seed * 2654435761u + 1;
    int total = num + warm;
    b.r = calloc((size_t)total, sizeof *b.r);
    b.arrival = calloc((size_t)total, sizeof *b.arrival);
    if (!b.r || !b.arrival) return 1;
    /* prompts: random words (text works on both endpoints and every server) */
    static const char *words[] = {"river", "stone", "light", "market", "engine", "garden", "signal", "forest", "paper",
                                  "window", "silver", "ocean", "winter", "thread", "bridge", "planet"};
    char **prefixes = calloc((size_t)n_px, sizeof *prefixes);
    for (int p = 0; p < n_px; p++) {
        prefixes[p] = malloc((size_t)px_len * 8 + 1);
        size_t o = 0;
        for (int w = 0; w < px_len; w++) o += (size_t)sprintf(prefixes[p] + o, "%s ", words[(size_t)(urand() * 16)]);
        prefixes[p][o] = 0;
    }
    for (int i = 0; i < total; i++) {
        int prefix = !strcmp(dataset, "prefix-repetition");
        int il = prefix ? sx_len : (int)(in_len * (1 - range + 2 * range * urand()));
        int ol = prefix ? px_out : (int)(out_len * (1 - range + 2 * range * urand()));
        if (il < 1) il = 1;
        if (ol < 1) ol = 1;
        char *text;
        if (sg) {
            text = strdup(sg[i % n_sg]);
            ol = sg_out[i % n_sg];
        } else {
            text = malloc((size_t)il * 8 + (prefix ? strlen(prefixes[0]) : 0) + 1);
            size_t o = 0;
            if (prefix) o += (size_t)sprintf(text, "%s", prefixes[i % n_px]);
            for (int w = 0; w < il; w++) o += (size_t)sprintf(text + o, "%s ", words[(size_t)(urand() * 16)]);
            text[o] = 0;
        }
        json_t *j = chat ? json_pack("{s:[{s:s,s:s}]}", "messages", "role", "user", "content", text)
                         : json_pack("{s:s}", "prompt", text);
        json_object_set_new(j, "max_tokens", json_integer(ol));
        json_object_set_new(j, "stream", json_true());
        json_object_set_new(j, "stream_options", json_pack("{s:b}", "include_usage", 1));
        json_object_set_new(j, "temperature", json_real(0));
        if (model) json_object_set_new(j, "model", json_string(model));
        if (ignore_eos) json_object_set_new(j, "ignore_eos", json_true());
        b.r[i].body = json_dumps(j, JSON_COMPACT);
        b.r[i].output_len = ol;
        json_decref(j);
        free(text);
    }
    for (int p = 0; p < n_px; p++) free(prefixes[p]);
    free(prefixes);
    for (int i = 0; i < n_sg; i++) free(sg[i]);
    free(sg);
    free(sg_out);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_int;
    sigaction(SIGINT, &sa, NULL);
    b.stop = &bench_stop;
    pthread_mutex_init(&b.mu, NULL);
    /* warm-ups first, one at a time */
    for (int i = 0; i < warm; i++) run_one(&b, &b.r[i]);
    b.r += warm;
    b.n = num;
    double t = 0;
    for (int i = 0; i < num; i++) {
        b.arrival[i] = t;
        t += tl_bench_gap(rate, burst);
    }
    int slots = max_conc > 0 ? max_conc : num;
    if (slots > 1024) slots = 1024;
    pthread_t *th = malloc(sizeof *th * (size_t)slots), mth;
    mem_poll mp = {&b, 0, 0, 0, 0};
    int polling = pthread_create(&mth, NULL, poll_metrics, &mp) == 0;
    b.t0 = now();
    for (int i = 0; i < slots; i++) pthread_create(&th[i], NULL, slot_thread, &b);
    for (int i = 0; i < slots; i++) pthread_join(th[i], NULL);
    double dur = now() - b.t0;
    mp.stop = 1;
    if (polling) pthread_join(mth, NULL);
    fprintf(stderr, "\n");
    /* results */
    double pcts[16];
    int np = 0;
    for (const char *p = pcts_s; *p && np < 16;) {
        pcts[np++] = atof(p);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    int done = 0, failed = 0;
    long in_tok = 0, out_tok = 0;
    double *ttft = malloc(sizeof(double) * (size_t)num), *tpot = malloc(sizeof(double) * (size_t)num),
           *e2el = malloc(sizeof(double) * (size_t)num);
    int n_itl = 0;
    for (int i = 0; i < num; i++) n_itl += b.r[i].n_itl;
    double *itl = malloc(sizeof(double) * (size_t)(n_itl + 1));
    double g_ttft = 0, g_tpot = 0, g_e2el = 0;
    for (const char *p = goodput; p && *p;) {
        if (!strncmp(p, "ttft:", 5)) g_ttft = atof(p + 5) / 1e3;
        else if (!strncmp(p, "tpot:", 5)) g_tpot = atof(p + 5) / 1e3;
        else if (!strncmp(p, "e2el:", 5)) g_e2el = atof(p + 5) / 1e3;
        p = strchr(p, ' ');
        if (!p) break;
        p++;
    }
    int good = 0, nt = 0;
    n_itl = 0;
    for (int i = 0; i < num; i++) {
        bench_req *q = &b.r[i];
        if (!q->ok) {
            failed += q->e2el > 0 || !bench_stop;
            continue;
        }
        done++;
        in_tok += q->in_tokens;
        out_tok += q->out_tokens;
        ttft[nt] = q->ttft;
        e2el[nt] = q->e2el;
        tpot[nt] = q->out_tokens > 1 ? (q->e2el - q->ttft) / (q->out_tokens - 1) : 0;
        if ((!g_ttft || q->ttft <= g_ttft) && (!g_tpot || tpot[nt] <= g_tpot) && (!g_e2el || q->e2el <= g_e2el)) good++;
        nt++;
        for (int k = 0; k < q->n_itl; k++) itl[n_itl++] = q->itl[k];
    }
    json_t *res = json_pack("{s:s,s:s,s:i,s:i,s:f,s:I,s:I,s:f,s:f,s:f,s:f,s:i}", "backend", "openai", "endpoint", endpoint,
                            "completed", done, "failed", failed, "duration", dur, "total_input_tokens", (json_int_t)in_tok,
                            "total_output_tokens", (json_int_t)out_tok, "request_throughput", done / dur,
                            "request_goodput", goodput ? good / dur : (double)done / dur, "output_throughput",
                            out_tok / dur, "total_token_throughput", (in_tok + out_tok) / dur, "max_concurrent_requests",
                            b.peak_active);
    printf("============ Serving Benchmark Result ============\n");
    printf("Successful requests: %d   failed: %d   duration: %.2f s\n", done, failed, dur);
    printf("Total input tokens: %ld   output tokens: %ld\n", in_tok, out_tok);
    printf("Request throughput: %.2f req/s   output: %.2f tok/s   total: %.2f tok/s   peak concurrency: %d\n",
           done / dur, out_tok / dur, (in_tok + out_tok) / dur, b.peak_active);
    if (mp.seen) {
        json_object_set_new(res, "peak_kv_cache_usage_perc", json_real(mp.peak_kv));
        json_object_set_new(res, "peak_server_memory_bytes", json_real(mp.peak_rss));
        printf("Peak memory (server /metrics): KV cache %.1f%%, resident %.1f MiB\n", mp.peak_kv * 100,
               mp.peak_rss / 1048576.0);
    }
    if (goodput) printf("Request goodput: %.2f req/s (%d of %d met the SLOs)\n", good / dur, good, done);
    stats(res, "ttft", ttft, nt, pcts, np, 1);
    stats(res, "tpot", tpot, nt, pcts, np, 1);
    stats(res, "itl", itl, n_itl, pcts, np, 1);
    stats(res, "e2el", e2el, nt, pcts, np, 1);
    if (do_save || save) {
        char fn[512];
        if (save) snprintf(fn, sizeof fn, "%s", save);
        else snprintf(fn, sizeof fn, "bench-%ld.json", (long)time(NULL));
        if (json_dump_file(res, fn, JSON_INDENT(2))) fprintf(stderr, "llmserve bench: cannot write %s\n", fn);
        else printf("result: %s\n", fn);
    }
    json_decref(res);
    for (int i = -warm; i < num; i++) {
        free(b.r[i].body);
        free(b.r[i].itl);
    }
    free(b.r - warm);
    free(b.arrival);
    free(th);
    free(ttft);
    free(tpot);
    free(e2el);
    free(itl);
    return done > 0 ? 0 : 1;
}
