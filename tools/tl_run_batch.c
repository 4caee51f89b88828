/* llmserve batch -i IN.jsonl -o OUT.jsonl MODEL [serve flags]: an OpenAI
 * batch file run offline, as vLLM's run_batch does: every line
 * {"custom_id", "method": "POST", "url", "body"} (url /v1/chat/completions,
 * /v1/completions, /v1/embeddings or /v1/responses, mixed as they like), every
 * output line {"id", "custom_id", "response": {"status_code", "request_id",
 * "body"}, "error"} in input order. The requests run through a private
 * `llmserve serve` on a loopback port (so chat templates, tools, grammar and
 * reasoning parsers are the server's own), --concurrency at once; the file
 * is checked whole before the model is loaded. */
#include "cm_error.h"
#include "tl_common.h"

#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

static const char *const URLS[] = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", NULL};

typedef struct {
    char *custom_id, *url, *body;
    int status;
    char *reply;                 /* the answer's body */
    size_t reply_len;
} bline;

typedef struct {
    bline *l;
    int n, next, port;
    pthread_mutex_t mu;
} pool;

/* One request over a fresh connection (Connection: close): the status (0: no answer) and the body. */
static int post(int port, const char *url, const char *body, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return 0;
    }
    size_t bl = strlen(body);
    char head[512];
    int hl = snprintf(head, sizeof head, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n", url, bl);
    if (write(fd, head, (size_t)hl) != hl || write(fd, body, bl) != (ssize_t)bl) {
        close(fd);
        return 0;
    }
    size_t cap = 1 << 14, n = 0;
    char *buf = malloc(cap);
    ssize_t r;
    while (buf && (r = read(fd, buf + n, cap - n - 1)) > 0) {
        n += (size_t)r;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) break;
            buf = nb;
        }
    }
    close(fd);
    if (!buf) return 0;
    buf[n] = 0;
    int status = 0;
    char *sep = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1 || !sep) {
        free(buf);
        return 0;
    }
    *out_len = n - (size_t)(sep + 4 - buf);
    memmove(buf, sep + 4, *out_len + 1);
    *out = buf;
    return status;
}

static void *worker(void *arg) {
    pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int i = p->next < p->n ? p->next++ : -1;
        pthread_mutex_unlock(&p->mu);
        if (i < 0) return NULL;
        bline *l = &p->l[i];
        for (int tries = 0; tries < 30; tries++) { /* a 429/503 (queue full, a group restarting): again, a moment later */
            free(l->reply);
            l->status = post(p->port, l->url, l->body, &l->reply, &l->reply_len);
            if (l->status && l->status != 429 && l->status != 503) break;
            sleep(1);
        }
    }
}

/* The input, checked whole: NULL with the first bad line said. */
static bline *read_input(const char *path, int *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "llmserve batch: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    bline *l = NULL;
    int k = 0, cap = 0, no = 0;
    char *buf = NULL;
    size_t bcap = 0;
    ssize_t len;
    json_t *seen = json_object();
    while ((len = getline(&buf, &bcap, f)) >= 0) {
        no++;
        while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) buf[--len] = 0;
        if (!len) continue;
        json_t *o = json_loadb(buf, (size_t)len, JSON_REJECT_DUPLICATES, NULL);
        const char *cid = json_string_value(json_object_get(o, "custom_id"));
        const char *m = json_string_value(json_object_get(o, "method")), *url = json_string_value(json_object_get(o, "url"));
        const json_t *body = json_object_get(o, "body");
        const char *const *u = URLS;
        while (url && *u && strcmp(*u, url)) u++;
        const char *why = !json_is_object(o) ? "not a JSON object" : !cid ? "custom_id: a string is required"
                          : json_object_get(seen, cid) ? "custom_id: used twice"
                          : !m || strcmp(m, "POST") ? "method: only POST"
                          : !url || !*u ? "url: /v1/chat/completions, /v1/completions, /v1/embeddings or /v1/responses"
                          : !json_is_object(body) ? "body: a JSON object is required"
                          : json_is_true(json_object_get(body, "stream")) ? "body.stream: a batch does not stream" : NULL;
        if (why) {
            fprintf(stderr, "llmserve batch: %s line %d: %s\n", path, no, why);
            json_decref(o);
            goto fail;
        }
        json_object_set_new(seen, cid, json_true());
        if (k == cap) {
            bline *nl = realloc(l, (size_t)(cap = cap ? cap * 2 : 64) * sizeof *l);
            if (!nl) {
                json_decref(o);
                goto fail;
            }
            l = nl;
        }
        memset(&l[k], 0, sizeof l[k]);
        l[k].custom_id = strdup(cid);
        l[k].url = strdup(url);
        l[k].body = json_dumps(body, JSON_COMPACT);
        k++;
        json_decref(o);
    }
    free(buf);
    fclose(f);
    json_decref(seen);
    *n = k;
    if (!k) fprintf(stderr, "llmserve batch: %s has no requests\n", path);
    return k ? l : NULL;
fail:
    for (int i = 0; i < k; i++) free(l[i].custom_id), free(l[i].url), free(l[i].body);
    free(l);
    free(buf);
    fclose(f);
    json_decref(seen);
    return NULL;
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t al = sizeof a;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int port = fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &al)
                   ? ntohs(a.sin_port) : -1;
    if (fd >= 0) close(fd);
    return port;
}

static void usage(FILE *f) {
    fprintf(f, "usage: llmserve batch -i IN.jsonl -o OUT.jsonl [--concurrency N] MODEL [serve flags]\n"
               "  every input line {\"custom_id\", \"method\": \"POST\", \"url\", \"body\"} (url: /v1/chat/completions,\n"
               "  /v1/completions, /v1/embeddings or /v1/responses); every output line {\"id\", \"custom_id\",\n"
               "  \"response\": {\"status_code\", \"request_id\", \"body\"}, \"error\"} in input order.\n"
               "  --concurrency N   requests at once (default 16)\n"
               "  the rest goes to `llmserve serve` (the model, --threads, --kv-cache-memory, ...)\n");
}

int tl_run_batch_main(int argc, char **argv) {
    const char *in = NULL, *outp = NULL;
    int conc = 16, k = 0;
    char **rest = calloc((size_t)argc + 8, sizeof *rest);
    if (!rest) return 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            free(rest);
            return 0;
        }
        if ((!strcmp(argv[i], "-i") || !strcmp(argv[i], "--input-file")) && i + 1 < argc) in = argv[++i];
        else if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output-file")) && i + 1 < argc) outp = argv[++i];
        else if (!strcmp(argv[i], "--concurrency") && i + 1 < argc) conc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--port") || !strcmp(argv[i], "--host")) {
            fprintf(stderr, "llmserve batch: %s: the server is private to the run (a loopback port of its own)\n", argv[i]);
            free(rest);
            return 2;
        } else rest[k++] = argv[i];
    }
    if (!in || !outp || conc < 1 || conc > 4096) {
        usage(stderr);
        free(rest);
        return 2;
    }
    int n = 0;
    bline *l = read_input(in, &n);
    FILE *out = l ? fopen(outp, "w") : NULL;
    if (l && !out) fprintf(stderr, "llmserve batch: %s: %s\n", outp, strerror(errno));
    int port = free_port(), rc = 1;
    pid_t child = -1;
    if (!out || port < 0) goto done;
    char ps[16], self[4096];
    snprintf(ps, sizeof ps, "%d", port);
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) goto done;
    self[sl] = 0;
    char **av = calloc((size_t)k + 8, sizeof *av);
    int m = 0;
    av[m++] = self;
    av[m++] = "serve";
    for (int i = 0; i < k; i++) av[m++] = rest[i];
    av[m++] = "--host";
    av[m++] = "127.0.0.1";
    av[m++] = "--port";
    av[m++] = ps;
    av[m] = NULL;
    if ((child = fork()) == 0) {
        dup2(2, 1); /* the server's lines on stderr: stdout is the user's */
        execv(self, av);
        _exit(127);
    }
    free(av);
    /* up when a probe answers; the server's own startup wait bounds it, and its exit ends it */
    int up = 0, st;
    for (int t = 0; t < 36000 && !up; t++) {
        if (waitpid(child, &st, WNOHANG) == child) {
            child = -1;
            fprintf(stderr, "llmserve batch: the server stopped before it was ready (see above)\n");
            goto done;
        }
        char *r = NULL;
        size_t rl;
        int s = post(port, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":1}", &r, &rl);
        free(r);
        up = s == 200 || s == 400 || s == 404; /* the model answers (or says what it serves) */
        if (!up) usleep(100000);
    }
    pool p = {l, n, 0, port, PTHREAD_MUTEX_INITIALIZER};
    pthread_t *th = calloc((size_t)conc, sizeof *th);
    int started = 0;
    for (int i = 0; th && i < conc && i < n; i++) started += !pthread_create(&th[i], NULL, worker, &p);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    free(th);
    int ok = 0;
    for (int i = 0; i < n; i++) {
        unsigned char rb[12] = {0};
        char id[40];
        if (getrandom(rb, sizeof rb, 0) < 0) rb[0] = (unsigned char)i;
        int o = snprintf(id, sizeof id, "batch_req_");
        for (int b = 0; b < 12; b++) o += snprintf(id + o, sizeof id - (size_t)o, "%02x", rb[b]);
        json_t *body = l[i].reply ? json_loadb(l[i].reply, l[i].reply_len, 0, NULL) : NULL;
        json_t *line = json_pack("{s:s,s:s}", "id", id, "custom_id", l[i].custom_id);
        if (l[i].status) {
            const char *rid = json_string_value(json_object_get(body, "id"));
            json_object_set_new(line, "response", json_pack("{s:i,s:s,s:o}", "status_code", l[i].status, "request_id",
                                                            rid ? rid : "", "body", body ? body : json_object()));
            json_object_set_new(line, "error", json_null());
        } else {
            json_decref(body);
            json_object_set_new(line, "response", json_null());
            json_object_set_new(line, "error", json_pack("{s:s,s:s}", "code", "no_answer", "message",
                                                         "the server did not answer"));
        }
        ok += l[i].status >= 200 && l[i].status < 300;
        char *s = json_dumps(line, JSON_COMPACT);
        json_decref(line);
        if (!s || fprintf(out, "%s\n", s) < 0) {
            free(s);
            fprintf(stderr, "llmserve batch: %s: %s\n", outp, strerror(errno));
            goto done;
        }
        free(s);
    }
    fprintf(stderr, "llmserve batch: %d requests, %d answered 2xx, %d otherwise -> %s\n", n, ok, n - ok, outp);
    rc = 0;
done:
    if (child > 0) {
        kill(child, SIGTERM);
        waitpid(child, NULL, 0);
    }
    if (out && fclose(out) && !rc) rc = 1;
    for (int i = 0; i < n && l; i++) free(l[i].custom_id), free(l[i].url), free(l[i].body), free(l[i].reply);
    free(l);
    free(rest);
    return rc;
}
