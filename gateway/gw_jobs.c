#include "gw_jobs.h"
#include "cm_error.h"
#include "cm_log.h"
#include "gw_files.h"
#include "cm_idmap.h"

#include <dirent.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define MAX_LINES 50000
#define WINDOW_S (24 * 3600)

static const char *const ENDPOINTS[] = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", NULL};

enum { L_TODO, L_FLIGHT, L_DONE };

typedef struct {
    char *custom_id;
    char *body;                  /* the request body as sent (priority added) */
    int state, tries;
} line;

struct call;

typedef struct job {
    struct job *next;
    char id[64], out_id[64], err_id[64];
    json_t *obj;                 /* the Batch object as stored */
    line *lines;
    int n, cursor, inflight, ok, failed, lock_fd, out_fd, err_fd, cancelling, dirty;
} job;

typedef struct call {
    struct call *prev, *next;
    struct gw_jobs *js;
    job *j;
    int li, slot;                /* its line; the connection it went on */
    struct evhttp_request *req;
} call;

struct gw_jobs {
    struct event_base *base;
    char dir[4096], host[256], token[128];
    int port, concurrency, inflight;
    job *jobs;
    call *calls;
    struct evhttp_connection **conn; /* one kept-alive connection to ourselves per request in flight */
    call **on;                   /* what each carries now, or NULL */
    struct event *tick;
    cm_idmap ended;              /* batches seen finished (XXH3 of the id): the look each second skips them */
    double retry_at;             /* after a 429/503: no new sends before this */
    gw_jobs_stats st;
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void path_of(const gw_jobs *js, const char *id, const char *ext, char *out, size_t n) {
    snprintf(out, n, "%s/%s%s", js->dir, id, ext);
}

static int save(gw_jobs *js, const char *id, json_t *obj) {
    char p[4200];
    char *s = json_dumps(obj, JSON_COMPACT);
    path_of(js, id, ".json", p, sizeof p);
    int rc = s ? gw_files_write_atomic(p, s, strlen(s)) : LLM_ENOMEM;
    if (rc) CM_WARN("batch %s: cannot write its state (%s)", id, strerror(errno));
    free(s);
    return rc;
}

/* The Batch object as the API shows it: without the fields it keeps for itself. */
static json_t *shown(const json_t *obj, int cancel_marked) {
    json_t *o = json_deep_copy(obj);
    json_object_del(o, "owner");
    json_object_del(o, "_output");
    json_object_del(o, "_error");
    const char *st = json_string_value(json_object_get(o, "status"));
    if (cancel_marked && st && !strcmp(st, "in_progress")) json_object_set_new(o, "status", json_string("cancelling"));
    return o;
}

static void counts(job *j) {
    json_object_set_new(j->obj, "request_counts", json_pack("{s:i,s:i,s:i}", "total", j->n, "completed", j->ok, "failed",
                                                            j->failed));
}

/* ---- lines ----------------------------------------------------------------------------------- */

/* The lines of an input file: NULL with err for the first bad one. */
static line *read_lines(const char *path, const char *endpoint, int *n, char *err, size_t errlen, int *bad_line) {
    FILE *f = fopen(path, "rb");
    line *ls = NULL;
    int cap = 0, k = 0, no = 0;
    char *buf = NULL;
    size_t bcap = 0;
    ssize_t len;
    json_t *seen = json_object();
    *bad_line = 0;
    if (!f) {
        snprintf(err, errlen, "the input file cannot be read");
        json_decref(seen);
        return NULL;
    }
    while ((len = getline(&buf, &bcap, f)) >= 0) {
        no++;
        while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' ')) buf[--len] = 0;
        if (!len) continue;
        json_t *o = json_loadb(buf, (size_t)len, JSON_REJECT_DUPLICATES, NULL);
        const char *cid = json_string_value(json_object_get(o, "custom_id"));
        const char *m = json_string_value(json_object_get(o, "method"));
        const char *url = json_string_value(json_object_get(o, "url"));
        json_t *body = json_object_get(o, "body");
        const char *why = !json_is_object(o) ? "not a JSON object"
                          : !cid ? "custom_id: a string is required"
                          : json_object_get(seen, cid) ? "custom_id: used twice in the file"
                          : !m || strcmp(m, "POST") ? "method: only POST"
                          : !url || strcmp(url, endpoint) ? "url: must be the batch's endpoint"
                          : !json_is_object(body) ? "body: a JSON object is required"
                          : json_is_true(json_object_get(body, "stream")) ? "body.stream: a batch does not stream"
                          : k >= MAX_LINES ? "too many requests in one batch (at most 50000)" : NULL;
        if (why) {
            snprintf(err, errlen, "line %d: %s", no, why);
            *bad_line = no;
            json_decref(o);
            goto fail;
        }
        json_object_set_new(seen, cid, json_true());
        /* batch work yields to interactive work: priority 1 unless the line sets one (embeddings have none) */
        if (strcmp(endpoint, "/v1/embeddings") && !json_object_get(body, "priority"))
            json_object_set_new(body, "priority", json_integer(1));
        if (k == cap) {
            cap = cap ? cap * 2 : 64;
            line *nl = realloc(ls, (size_t)cap * sizeof *ls);
            if (!nl) {
                json_decref(o);
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
            ls = nl;
        }
        ls[k].custom_id = strdup(cid);
        ls[k].body = json_dumps(body, JSON_COMPACT);
        ls[k].state = L_TODO;
        ls[k].tries = 0;
        k++;
        json_decref(o);
    }
    if (!k) {
        snprintf(err, errlen, "the input file has no requests");
        goto fail;
    }
    free(buf);
    fclose(f);
    json_decref(seen);
    *n = k;
    return ls;
fail:
    for (int i = 0; i < k; i++) free(ls[i].custom_id), free(ls[i].body);
    free(ls);
    free(buf);
    fclose(f);
    json_decref(seen);
    return NULL;
}

/* Marks done the lines an output or error file already holds; a torn last line is cut off. */
static int read_done(job *j, const char *path) {
    int fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    FILE *f = fdopen(dup(fd), "rb");
    char *buf = NULL;
    size_t cap = 0;
    ssize_t len;
    off_t good = 0, at = 0;
    int n = 0;
    json_t *byid = json_object();
    for (int i = 0; i < j->n; i++) json_object_set_new(byid, j->lines[i].custom_id, json_integer(i));
    while (f && (len = getline(&buf, &cap, f)) >= 0) {
        at += len;
        json_t *o = len && buf[len - 1] == '\n' ? json_loadb(buf, (size_t)len, 0, NULL) : NULL;
        if (!o) break;
        json_t *li = json_object_get(byid, json_string_value(json_object_get(o, "custom_id")) ? json_string_value(json_object_get(o, "custom_id")) : "");
        if (li && j->lines[json_integer_value(li)].state != L_DONE) {
            j->lines[json_integer_value(li)].state = L_DONE;
            n++;
        }
        good = at;
        json_decref(o);
    }
    if (ftruncate(fd, good)) CM_WARN("batch %s: cannot cut a torn line from %s", j->id, path);
    free(buf);
    if (f) fclose(f);
    json_decref(byid);
    return n >= 0 ? fd : -1;
}

static void job_free(job *j) {
    for (int i = 0; i < j->n; i++) free(j->lines[i].custom_id), free(j->lines[i].body);
    free(j->lines);
    if (j->out_fd >= 0) close(j->out_fd);
    if (j->err_fd >= 0) close(j->err_fd);
    if (j->lock_fd >= 0) close(j->lock_fd); /* releases the flock */
    json_decref(j->obj);
    free(j);
}

/* Takes a batch to run: its lock (LLM_EAGAIN when another gateway holds it), its lines, what is done. */
static int adopt(gw_jobs *js, const char *id, json_t *obj) {
    char p[4200], err[200];
    path_of(js, id, ".lock", p, sizeof p);
    int lfd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lfd < 0) return LLM_EIO;
    if (flock(lfd, LOCK_EX | LOCK_NB)) {
        close(lfd);
        return LLM_EAGAIN;
    }
    json_t *fresh = NULL;
    path_of(js, id, ".json", p, sizeof p);
    if (!obj) obj = fresh = json_load_file(p, 0, NULL); /* again, under the lock: it may have finished meanwhile */
    const char *st = json_string_value(json_object_get(obj, "status"));
    if (!st || (strcmp(st, "in_progress") && strcmp(st, "cancelling") && strcmp(st, "finalizing"))) {
        json_decref(fresh);
        close(lfd);
        return LLM_EAGAIN;
    }
    job *j = calloc(1, sizeof *j);
    if (!j) {
        json_decref(fresh);
        close(lfd);
        return LLM_ENOMEM;
    }
    j->lock_fd = lfd;
    j->out_fd = j->err_fd = -1;
    j->obj = fresh ? fresh : json_incref(obj);
    snprintf(j->id, sizeof j->id, "%s", id);
    snprintf(j->out_id, sizeof j->out_id, "%s", json_string_value(json_object_get(obj, "_output")) ? json_string_value(json_object_get(obj, "_output")) : "");
    snprintf(j->err_id, sizeof j->err_id, "%s", json_string_value(json_object_get(obj, "_error")) ? json_string_value(json_object_get(obj, "_error")) : "");
    const char *in = json_string_value(json_object_get(obj, "input_file_id"));
    int bad;
    gw_file_data_path(js->dir, in ? in : "", p, sizeof p);
    j->lines = read_lines(p, json_string_value(json_object_get(obj, "endpoint")) ? json_string_value(json_object_get(obj, "endpoint")) : "",
                          &j->n, err, sizeof err, &bad);
    if (!j->lines) {
        CM_WARN("batch %s: its input can no longer be read (%s)", id, err);
        job_free(j);
        return LLM_EIO;
    }
    gw_file_data_path(js->dir, j->out_id, p, sizeof p);
    j->out_fd = read_done(j, p);
    int before = 0;
    for (int i = 0; i < j->n; i++) before += j->lines[i].state == L_DONE;
    j->ok = before;
    gw_file_data_path(js->dir, j->err_id, p, sizeof p);
    j->err_fd = read_done(j, p);
    for (int i = 0; i < j->n; i++) j->failed += j->lines[i].state == L_DONE;
    j->failed -= before;
    if (j->out_fd < 0 || j->err_fd < 0) {
        CM_WARN("batch %s: cannot open its output files: %s", id, strerror(errno));
        job_free(j);
        return LLM_EIO;
    }
    j->cancelling = st && !strcmp(st, "cancelling");
    j->next = js->jobs;
    js->jobs = j;
    counts(j);
    if (fresh || before + j->failed) CM_INFO("batch %s: running here (%d of %d requests already done)", id, j->ok + j->failed, j->n);
    return 0;
}

/* ---- running ------------------------------------------------------------------------------------ */

static void dispatch(gw_jobs *js);

static void call_unlink(gw_jobs *js, call *c) {
    if (c->prev) c->prev->next = c->next;
    else js->calls = c->next;
    if (c->next) c->next->prev = c->prev;
}

/* Appends one result line. */
static void result(gw_jobs *js, job *j, int li, int status, const char *body, size_t len) {
    char rid[64];
    gw_files_new_id(rid, sizeof rid, "batch_req_");
    json_t *b = len ? json_loadb(body, len, 0, NULL) : NULL;
    json_t *o = json_pack("{s:s,s:s,s:{s:i,s:s,s:o},s:n}", "id", rid, "custom_id", j->lines[li].custom_id, "response",
                          "status_code", status, "request_id",
                          json_string_value(json_object_get(b, "id")) ? json_string_value(json_object_get(b, "id")) : "",
                          "body", b ? b : json_object(), "error");
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    int ok = status >= 200 && status < 300;
    size_t n = s ? strlen(s) : 0;
    if (s) s[n++] = '\n'; /* (json_dumps' NUL replaced: one write, O_APPEND) */
    if (!s || write(ok ? j->out_fd : j->err_fd, s, n) != (ssize_t)n)
        CM_WARN("batch %s: cannot write a result (%s): the request runs again", j->id, strerror(errno));
    else {
        j->lines[li].state = L_DONE;
        if (ok) j->ok++, js->st.completed++;
        else j->failed++, js->st.failed++;
    }
    if (j->lines[li].state != L_DONE) { /* again, after a pause */
        j->lines[li].state = L_TODO;
        if (j->cursor > li) j->cursor = li;
        js->retry_at = now_s() + 1.0;
    }
    free(s);
    j->dirty = 1;
}

static void on_done(struct evhttp_request *req, void *arg) {
    call *c = arg;
    gw_jobs *js = c->js;
    job *j = c->j;
    int status = req ? evhttp_request_get_response_code(req) : 0;
    js->inflight--;
    j->inflight--;
    js->on[c->slot] = NULL;
    call_unlink(js, c);
    if (status == 429 || status == 503 || status == 0) { /* later, not the line's answer */
        j->lines[c->li].state = L_TODO;
        js->st.retried++;
        js->retry_at = now_s() + 1.0;
        if (j->cursor > c->li) j->cursor = c->li;
    } else {
        struct evbuffer *b = evhttp_request_get_input_buffer(req);
        size_t n = evbuffer_get_length(b);
        result(js, j, c->li, status, (const char *)evbuffer_pullup(b, -1), n);
    }
    free(c);
    dispatch(js);
}

static int send_line(gw_jobs *js, job *j, int li) {
    int slot = 0;
    while (slot < js->concurrency && js->on[slot]) slot++;
    if (slot == js->concurrency) return LLM_EAGAIN;
    if (!js->conn[slot] && !(js->conn[slot] = evhttp_connection_base_new(js->base, NULL, js->host, (ev_uint16_t)js->port)))
        return LLM_ENOMEM;
    evhttp_connection_set_timeout(js->conn[slot], 3600);
    call *c = calloc(1, sizeof *c);
    if (!c) return LLM_ENOMEM;
    c->js = js;
    c->j = j;
    c->li = li;
    c->slot = slot;
    if (!(c->req = evhttp_request_new(on_done, c))) {
        free(c);
        return LLM_ENOMEM;
    }
    struct evkeyvalq *h = evhttp_request_get_output_headers(c->req);
    char auth[200];
    snprintf(auth, sizeof auth, "Bearer %s", js->token);
    evhttp_add_header(h, "Host", js->host);
    evhttp_add_header(h, "Content-Type", "application/json");
    evhttp_add_header(h, "Authorization", auth);
    evbuffer_add(evhttp_request_get_output_buffer(c->req), j->lines[li].body, strlen(j->lines[li].body));
    const char *url = json_string_value(json_object_get(j->obj, "endpoint"));
    if (evhttp_make_request(js->conn[slot], c->req, EVHTTP_REQ_POST, url) != 0) { /* frees the request */
        free(c);
        return LLM_EIO;
    }
    js->on[slot] = c;
    c->next = js->calls;
    if (js->calls) js->calls->prev = c;
    js->calls = c;
    j->lines[li].state = L_FLIGHT;
    j->lines[li].tries++;
    j->inflight++;
    js->inflight++;
    return 0;
}

/* Ends a batch: its output and error files published, its final state written, its lock let go. */
static void finish_job(gw_jobs *js, job *j, const char *status) {
    char fn[160];
    long long t = (long long)time(NULL);
    close(j->out_fd), close(j->err_fd);
    j->out_fd = j->err_fd = -1;
    snprintf(fn, sizeof fn, "%s_output.jsonl", j->id);
    const char *owner = json_string_value(json_object_get(j->obj, "owner"));
    if (j->ok && !gw_file_publish(js->dir, j->out_id, fn, "batch_output", owner ? owner : "-"))
        json_object_set_new(j->obj, "output_file_id", json_string(j->out_id));
    snprintf(fn, sizeof fn, "%s_error.jsonl", j->id);
    if (j->failed && !gw_file_publish(js->dir, j->err_id, fn, "batch_output", owner ? owner : "-"))
        json_object_set_new(j->obj, "error_file_id", json_string(j->err_id));
    char p[4200];
    if (!j->ok) gw_file_data_path(js->dir, j->out_id, p, sizeof p), unlink(p); /* nothing in it: no file */
    if (!j->failed) gw_file_data_path(js->dir, j->err_id, p, sizeof p), unlink(p);
    counts(j);
    json_object_set_new(j->obj, "status", json_string(status));
    json_object_set_new(j->obj, "finalizing_at", json_integer(t));
    json_object_set_new(j->obj, !strcmp(status, "completed") ? "completed_at" : !strcmp(status, "expired") ? "expired_at"
                                                                                                        : "cancelled_at",
                        json_integer(t));
    save(js, j->id, j->obj);
    path_of(js, j->id, ".cancel", p, sizeof p);
    unlink(p);
    CM_INFO("batch %s %s: %d completed, %d failed, of %d", j->id, status, j->ok, j->failed, j->n);
    for (job **pp = &js->jobs; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    path_of(js, j->id, ".lock", p, sizeof p);
    unlink(p);
    job_free(j);
}

static void dispatch(gw_jobs *js) {
    if (now_s() < js->retry_at) return; /* the tick comes back */
    for (int progress = 1; progress && js->inflight < js->concurrency;) {
        progress = 0;
        for (job *j = js->jobs; j && js->inflight < js->concurrency; j = j->next) {
            if (j->cancelling) continue;
            while (j->cursor < j->n && j->lines[j->cursor].state != L_TODO) j->cursor++;
            if (j->cursor >= j->n) continue;
            if (send_line(js, j, j->cursor)) return;
            progress = 1;
        }
    }
    for (job *j = js->jobs, *nx; j; j = nx) { /* the ones with nothing left */
        nx = j->next;
        int left = j->n - j->ok - j->failed; /* (every line done is counted in one of the two) */
        if (!j->inflight && (j->cancelling || !left)) finish_job(js, j, j->cancelling ? "cancelled" : "completed");
    }
}

/* Each second: progress saved, cancels and expiries seen, unfinished batches of stopped gateways adopted. */
static void on_tick(evutil_socket_t fd, short what, void *arg) {
    gw_jobs *js = arg;
    (void)fd, (void)what;
    char p[4200];
    long long t = (long long)time(NULL);
    for (job *j = js->jobs, *nx; j; j = nx) {
        nx = j->next;
        path_of(js, j->id, ".cancel", p, sizeof p);
        if (!j->cancelling && !access(p, F_OK)) {
            j->cancelling = 1;
            json_object_set_new(j->obj, "status", json_string("cancelling"));
            json_object_set_new(j->obj, "cancelling_at", json_integer(t));
            j->dirty = 1;
        }
        if (t > json_integer_value(json_object_get(j->obj, "expires_at")) && !j->inflight) {
            finish_job(js, j, "expired");
            continue;
        }
        if (j->dirty) {
            counts(j);
            save(js, j->id, j->obj);
            j->dirty = 0;
        }
    }
    DIR *d = opendir(js->dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 12 || strncmp(e->d_name, "batch_", 6) || strcmp(e->d_name + n - 5, ".json")) continue;
        char id[80];
        snprintf(id, sizeof id, "%.*s", (int)(n - 5), e->d_name);
        int mine = 0;
        for (job *j = js->jobs; j && !mine; j = j->next) mine = !strcmp(j->id, id);
        uint64_t h = XXH3_64bits(id, strlen(id));
        if (mine || cm_idmap_get(&js->ended, h)) continue;
        path_of(js, id, ".json", p, sizeof p);
        json_t *o = json_load_file(p, 0, NULL);
        const char *st = json_string_value(json_object_get(o, "status"));
        if (st && (!strcmp(st, "in_progress") || !strcmp(st, "cancelling") || !strcmp(st, "finalizing"))) adopt(js, id, NULL);
        else if (st) cm_idmap_put(&js->ended, h, js); /* finished for good (a failed put only costs a look) */
        json_decref(o);
    }
    if (d) closedir(d);
    dispatch(js);
}

/* ---- the endpoints ---------------------------------------------------------------------------------- */

static void create(gw_jobs *js, gw_http_req *r, const char *tenant) {
    json_t *o = json_loadb(r->body, r->body_len, JSON_REJECT_DUPLICATES, NULL), *v;
    const char *k, *in, *ep, *bad = NULL, *param = NULL;
    char msg[400];
    if (!json_is_object(o)) {
        json_decref(o);
        gw_http_error(r->conn, 400, "the body is not a JSON object", NULL, "invalid_json");
        return;
    }
    json_object_foreach(o, k, v) {
        if (strcmp(k, "input_file_id") && strcmp(k, "endpoint") && strcmp(k, "completion_window") && strcmp(k, "metadata") &&
            !json_is_null(v)) {
            snprintf(msg, sizeof msg, "%.64s: this field is not supported on /v1/batches", k);
            bad = msg;
        }
    }
    in = json_string_value(json_object_get(o, "input_file_id"));
    ep = json_string_value(json_object_get(o, "endpoint"));
    v = json_object_get(o, "completion_window");
    const char *const *e = ENDPOINTS;
    while (ep && *e && strcmp(*e, ep)) e++;
    json_t *meta = in ? gw_file_meta(js->dir, in, tenant) : NULL;
    if (bad) {
        /* said */
    } else if (!in) bad = "input_file_id: Field required", param = "input_file_id";
    else if (!meta) snprintf(msg, sizeof msg, "No such File object: %.80s", in), bad = msg, param = "input_file_id";
    else if (!ep || !*e)
        bad = "endpoint: /v1/chat/completions, /v1/completions, /v1/embeddings or /v1/responses", param = "endpoint";
    else if (!json_is_string(v) || strcmp(json_string_value(v), "24h")) bad = "completion_window: '24h'", param = "completion_window";
    else if ((v = json_object_get(o, "metadata")) && !json_is_null(v) && !json_is_object(v)) bad = "metadata: an object", param = "metadata";
    if (bad) {
        gw_http_error(r->conn, in && !meta && param && !strcmp(param, "input_file_id") ? 404 : 400, bad, param,
                      "invalid_value");
        json_decref(meta);
        json_decref(o);
        return;
    }
    json_decref(meta);
    char id[64], out_id[64], err_id[64], p[4200], err[300];
    long long t = (long long)time(NULL);
    gw_files_new_id(id, sizeof id, "batch_");
    gw_files_new_id(out_id, sizeof out_id, "file-");
    gw_files_new_id(err_id, sizeof err_id, "file-");
    json_t *b = json_pack("{s:s,s:s,s:s,s:O,s:s,s:s,s:n,s:n,s:n,s:I,s:I,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:{s:i,s:i,s:i},s:O?,"
                          "s:s,s:s,s:s}",
                          "id", id, "object", "batch", "endpoint", ep, "input_file_id", json_object_get(o, "input_file_id"),
                          "completion_window", "24h", "status", "validating", "errors", "output_file_id", "error_file_id",
                          "created_at", (json_int_t)t, "expires_at", (json_int_t)(t + WINDOW_S), "in_progress_at",
                          "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at", "cancelled_at",
                          "request_counts", "total", 0, "completed", 0, "failed", 0, "metadata",
                          json_object_get(o, "metadata"), "owner", tenant, "_output", out_id, "_error", err_id);
    int bad_line, n = 0;
    gw_file_data_path(js->dir, in, p, sizeof p);
    line *ls = read_lines(p, ep, &n, err, sizeof err, &bad_line);
    json_decref(o); /* (in and ep were its) */
    if (!ls) { /* validation failed: the batch exists, failed, with the reason (as OpenAI reports it) */
        json_object_set_new(b, "status", json_string("failed"));
        json_object_set_new(b, "failed_at", json_integer(t));
        json_t *e1 = json_pack("{s:s,s:s,s:s}", "code", "invalid_request", "message", err, "param", "input_file_id");
        if (bad_line) json_object_set_new(e1, "line", json_integer(bad_line));
        json_object_set_new(b, "errors", json_pack("{s:s,s:[o]}", "object", "list", "data", e1));
    } else {
        for (int i = 0; i < n; i++) free(ls[i].custom_id), free(ls[i].body);
        free(ls);
        json_object_set_new(b, "status", json_string("in_progress"));
        json_object_set_new(b, "in_progress_at", json_integer(t));
        json_object_set_new(b, "request_counts", json_pack("{s:i,s:i,s:i}", "total", n, "completed", 0, "failed", 0));
    }
    if (save(js, id, b)) {
        gw_http_error(r->conn, 500, "the batch could not be stored", NULL, "internal_error");
        json_decref(b);
        return;
    }
    if (ls && adopt(js, id, b)) CM_WARN("batch %s: accepted, but not started here (the next look adopts it)", id);
    json_t *s = shown(b, 0);
    gw_http_json(r->conn, 200, s);
    json_decref(s);
    json_decref(b);
    dispatch(js);
}

static json_t *load(gw_jobs *js, const char *id, const char *tenant) {
    char p[4200];
    size_t n = strlen(id);
    if (n < 7 || n > 64 || strncmp(id, "batch_", 6) || strspn(id + 6, "0123456789abcdef") != n - 6) return NULL;
    path_of(js, id, ".json", p, sizeof p);
    json_t *o = json_load_file(p, 0, NULL);
    if (!json_is_object(o) || !json_is_string(json_object_get(o, "owner")) ||
        strcmp(json_string_value(json_object_get(o, "owner")), tenant)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static int marked(gw_jobs *js, const char *id) {
    char p[4200];
    path_of(js, id, ".cancel", p, sizeof p);
    return !access(p, F_OK);
}

static int by_created(const void *a, const void *b) {
    json_int_t x = json_integer_value(json_object_get(*(json_t *const *)a, "created_at"));
    json_int_t y = json_integer_value(json_object_get(*(json_t *const *)b, "created_at"));
    return x < y ? 1 : x > y ? -1 : 0;
}

static void list(gw_jobs *js, gw_http_req *r, const char *tenant) {
    DIR *d = opendir(js->dir);
    struct dirent *e;
    json_t **all = NULL;
    size_t n = 0, cap = 0;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 12 || strncmp(e->d_name, "batch_", 6) || strcmp(e->d_name + l - 5, ".json")) continue;
        char id[80];
        snprintf(id, sizeof id, "%.*s", (int)(l - 5), e->d_name);
        json_t *o = load(js, id, tenant);
        if (!o) continue;
        if (n == cap) {
            json_t **na = realloc(all, (cap = cap ? cap * 2 : 16) * sizeof *all);
            if (!na) {
                json_decref(o);
                break;
            }
            all = na;
        }
        all[n] = shown(o, marked(js, id));
        json_decref(o);
        n++;
    }
    if (d) closedir(d);
    if (n) qsort(all, n, sizeof *all, by_created);
    json_t *data = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(data, all[i]);
    free(all);
    json_t *j = json_pack("{s:s,s:o,s:b}", "object", "list", "data", data, "has_more", 0);
    json_object_set_new(j, "first_id", json_array_size(data) ? json_incref(json_object_get(json_array_get(data, 0), "id")) : json_null());
    json_object_set_new(j, "last_id", json_array_size(data) ? json_incref(json_object_get(json_array_get(data, json_array_size(data) - 1), "id")) : json_null());
    gw_http_json(r->conn, 200, j);
    json_decref(j);
}

void gw_jobs_handle(gw_jobs *js, gw_http_req *r, const char *tenant, const char *rest) {
    if (!*rest) {
        if (r->method == GW_M_POST) create(js, r, tenant);
        else if (r->method == GW_M_GET || r->method == GW_M_HEAD) list(js, r, tenant);
        else gw_http_method_not_allowed(r->conn, "GET, HEAD, POST");
        return;
    }
    char id[80];
    const char *slash = rest[0] == '/' ? strchr(rest + 1, '/') : NULL;
    size_t il = slash ? (size_t)(slash - rest - 1) : strlen(rest + 1);
    int cancel = slash && !strcmp(slash, "/cancel");
    if (rest[0] != '/' || il >= sizeof id || (slash && !cancel)) {
        gw_http_error(r->conn, 404, "no such endpoint", NULL, "not_found");
        return;
    }
    memcpy(id, rest + 1, il);
    id[il] = 0;
    json_t *o = load(js, id, tenant);
    char msg[200];
    if (!o) {
        snprintf(msg, sizeof msg, "No such Batch object: %.80s", id);
        gw_http_error(r->conn, 404, msg, "batch_id", "not_found");
        return;
    }
    if (!cancel) {
        if (r->method != GW_M_GET && r->method != GW_M_HEAD) gw_http_method_not_allowed(r->conn, "GET, HEAD");
        else {
            json_t *s = shown(o, marked(js, id));
            gw_http_json(r->conn, 200, s);
            json_decref(s);
        }
    } else if (r->method != GW_M_POST) {
        gw_http_method_not_allowed(r->conn, "POST");
    } else {
        const char *st = json_string_value(json_object_get(o, "status"));
        if (!st || (strcmp(st, "in_progress") && strcmp(st, "validating") && strcmp(st, "cancelling"))) {
            snprintf(msg, sizeof msg, "Cannot cancel a batch with status '%.32s'.", st ? st : "?");
            gw_http_error(r->conn, 409, msg, NULL, "invalid_state");
        } else {
            char p[4200];
            path_of(js, id, ".cancel", p, sizeof p);
            int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
            if (fd >= 0) close(fd);
            json_t *s = shown(o, 1);
            gw_http_json(r->conn, fd >= 0 ? 200 : 500, s);
            json_decref(s);
            on_tick(-1, 0, js); /* one of ours: seen at once */
        }
    }
    json_decref(o);
}

/* ---- the rest ------------------------------------------------------------------------------------------ */

int gw_jobs_start(struct event_base *base, const char *dir, const char *host, int port, const char *token,
                  int concurrency, gw_jobs **out, char *err, size_t errlen) {
    *out = NULL;
    int rc = gw_files_init(dir, err, errlen);
    if (rc) return rc;
    gw_jobs *js = calloc(1, sizeof *js);
    if (!js) return LLM_ENOMEM;
    js->base = base;
    snprintf(js->dir, sizeof js->dir, "%s", dir);
    snprintf(js->host, sizeof js->host, "%s",
             !host || !*host || !strcmp(host, "0.0.0.0") ? "127.0.0.1" : !strcmp(host, "::") ? "::1" : host);
    snprintf(js->token, sizeof js->token, "%s", token);
    js->port = port;
    js->concurrency = concurrency < 1 ? 1 : concurrency;
    js->conn = calloc((size_t)js->concurrency, sizeof *js->conn);
    js->on = calloc((size_t)js->concurrency, sizeof *js->on);
    js->tick = event_new(base, -1, EV_PERSIST, on_tick, js);
    struct timeval sec = {1, 0};
    if (!js->conn || !js->on || !js->tick || event_add(js->tick, &sec)) {
        if (js->tick) event_free(js->tick);
        free(js->conn);
        free(js->on);
        free(js);
        return LLM_ENOMEM;
    }
    *out = js;
    return 0;
}

void gw_jobs_stats_get(const gw_jobs *js, gw_jobs_stats *st) {
    *st = js->st;
    st->running = st->pending = 0;
    for (const job *j = js->jobs; j; j = j->next) {
        st->running++;
        st->pending += j->n - j->ok - j->failed;
    }
}

void gw_jobs_free(gw_jobs *js) {
    if (!js) return;
    for (int i = 0; i < js->concurrency; i++)
        if (js->conn[i]) evhttp_connection_free(js->conn[i]); /* its request with it, without its callback */
    while (js->calls) {
        call *c = js->calls;
        js->calls = c->next;
        free(c);
    }
    free(js->conn);
    free(js->on);
    while (js->jobs) {
        job *j = js->jobs;
        js->jobs = j->next;
        if (j->dirty) {
            counts(j);
            save(js, j->id, j->obj);
        }
        job_free(j); /* its lock goes: the next gateway to look adopts it */
    }
    event_free(js->tick);
    cm_idmap_free(&js->ended);
    free(js);
}
