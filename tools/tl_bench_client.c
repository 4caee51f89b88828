/* tl_bench_client.c - llmserve bench serve's client: one streaming HTTP
 * request at a time per slot thread, timed as the client sees it (TTFT,
 * inter-token gaps, end to end), and the server's /metrics polled for peaks. */
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

volatile sig_atomic_t tlb_stop;
const char *const tlb_metric_names[N_METRICS] = {"ttft", "tpot", "itl", "e2el"};
void tlb_on_int(int s) {
    (void)s;
    tlb_stop = 1;
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
        if (tlb_stop) return -2;
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

int tlb_keep_text; /* --tokenizer given: keep the generated text */

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
        if (tlb_keep_text) append_text(q, txt);
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        q->out_tokens = q->usage_out = (int)json_integer_value(json_object_get(u, "completion_tokens"));
        q->in_tokens = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
    }
    json_decref(j);
}

/* One streaming request; fills the timings and the usage. */
void tlb_run_one(const bench_target *t, bench_req *q) {
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

void *tlb_slot_thread(void *arg) {
    bench *b = arg;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        int i = b->next < b->n && !tlb_stop ? b->next++ : -1;
        pthread_mutex_unlock(&b->mu);
        if (i < 0) break;
        double wait;
        while (!tlb_stop && (wait = b->t0 + b->arrival[i] - cm_now()) > 0) {
            if (wait > 0.1) wait = 0.1;
            struct timespec ts = {0, (long)(wait * 1e9)};
            nanosleep(&ts, NULL);
        }
        if (tlb_stop) {
            b->r[i].cancelled = 1;
            break;
        }
        pthread_mutex_lock(&b->mu);
        if (++b->active > b->peak_active) b->peak_active = b->active;
        pthread_mutex_unlock(&b->mu);
        tlb_run_one(b->tg, &b->r[i]);
        pthread_mutex_lock(&b->mu);
        b->active--;
        int fin = ++b->finished;
        progress(fin, b->n);
        pthread_mutex_unlock(&b->mu);
    }
    return NULL;
}

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

void *tlb_poll_metrics(void *arg) {
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
void tlb_spec_counts(const bench_target *t, double out[3]) {
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

