#include "gw_http.h"
#include "cm_log.h"
#include "cm_oai_resp.h"
#include "gw_map.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <event2/http_struct.h>
#include <event2/keyvalq_struct.h>
#include <sys/queue.h>
#include <event2/listener.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Where a connection is in reading its current request. */
enum { P_IDLE = 0, P_HEADER, P_BODY, P_HANDLING, P_DISCARD, P_CLOSING };

/* A body refused as too large is read and thrown away, so that the client
 * reads the 413 rather than a reset: at most this much, or until the body
 * deadline, then the connection closes. */
#define GW_DISCARD_MAX (64u << 20)

typedef struct cstate {
    struct cstate *prev, *next;
    gw_http *h;
    struct bufferevent *bev;     /* the filter evhttp reads through */
    int phase, lines, linelen, cr, bad;
    double deadline;
    char key[16];                /* the current header line's name, lower case (Content-Length spotting) */
    int keylen, in_value, is_cl;
    uint64_t clen;               /* the largest Content-Length in this header */
    uint64_t discard_left;       /* P_DISCARD: bytes still to throw away */
    int ours;                    /* a reply of ours is being written (set by the handler's answer, cleared at its end) */
    int swallow;                 /* evhttp's own error reply is being thrown away: ours went out instead */
    struct event *flush;         /* moves queued output on, after evhttp turned writing on */
} cstate;

struct gw_conn {
    gw_http *h;
    struct evhttp_request *req;
    struct evhttp_connection *evc;
    int streaming;
    void (*gone)(void *);
    void *arg;
};

struct gw_http {
    struct event_base *base;
    struct evhttp *http;
    struct evconnlistener *lst;
    gw_http_opts o;
    int open, max_conn, paused_cap, paused_fd;
    struct event *tick, *resume;
    gw_map cons;                 /* filter bufferevent -> cstate */
    cstate *list;
    double emfile_logged;
    unsigned long emfile_count;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *gw_http_reason(int s) {
    switch (s) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return s < 300 ? "OK" : s < 500 ? "Bad Request" : "Internal Server Error";
    }
}

/* ---- connections: the raw bytes, deadlines and the cap ------------------- */

static void listener_pause(gw_http *h, int on) {
    if (!h->lst) return;
    if (on) evconnlistener_disable(h->lst);
    else if (!h->paused_cap && !h->paused_fd) evconnlistener_enable(h->lst);
}

/* A 413 in OpenAI's JSON shape, written to the socket by the filter: evhttp
 * would answer the same Content-Length with an HTML page. */
static void refuse_too_large(cstate *cs) {
    struct bufferevent *u = bufferevent_get_underlying(cs->bev);
    int fd = u ? bufferevent_getfd(u) : -1;
    char msg[128], head[256];
    snprintf(msg, sizeof msg, "the request body (%llu bytes) is larger than --max-body-bytes %zu",
             (unsigned long long)cs->clen, cs->h->o.max_body);
    json_t *j = cm_oai_error_json(413, msg, NULL, "request_too_large");
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    size_t bl = body ? strlen(body) : 0;
    int hl = snprintf(head, sizeof head, "HTTP/1.1 413 %s\r\nContent-Type: application/json\r\nServer: llmserve\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n", gw_http_reason(413), bl + 1);
    if (fd >= 0 && body) { /* small: the socket's buffer takes it whole */
        (void)!send(fd, head, (size_t)hl, MSG_NOSIGNAL);
        (void)!send(fd, body, bl, MSG_NOSIGNAL);
        (void)!send(fd, "\n", 1, MSG_NOSIGNAL);
        shutdown(fd, SHUT_WR);
    }
    free(body);
    if (cs->h->o.on_status) cs->h->o.on_status(cs->h->o.ctx, 413);
    cs->phase = P_DISCARD;
    cs->discard_left = cs->clen < GW_DISCARD_MAX ? cs->clen : GW_DISCARD_MAX;
    cs->deadline = now_s() + cs->h->o.body_timeout;
}

/* One byte of a header line: spots Content-Length and reads its digits
 * (its form is checked later, by bad_header). */
static void header_byte(cstate *cs, unsigned char c) {
    if (!cs->in_value) {
        if (c == ':') {
            cs->in_value = 1;
            cs->is_cl = cs->keylen == 14 && !memcmp(cs->key, "content-length", 14);
            if (cs->is_cl) cs->clen = 0;
        } else if (cs->keylen < (int)sizeof cs->key) {
            cs->key[cs->keylen++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        } else {
            cs->keylen = (int)sizeof cs->key + 1; /* too long to be Content-Length */
        }
    } else if (cs->is_cl && c >= '0' && c <= '9') {
        cs->clen = cs->clen > (UINT64_MAX - 9) / 10 ? UINT64_MAX : cs->clen * 10 + (uint64_t)(c - '0');
    }
}

/* Sees every byte a client sends before evhttp does: times the header and
 * the body, marks headers with a NUL byte or a bare CR, which evhttp would
 * cut silently, and answers a Content-Length over the limit itself. O(1)
 * per byte, only while a header is being read. */
static enum bufferevent_filter_result in_filter(struct evbuffer *src, struct evbuffer *dst, ev_ssize_t lim,
                                                enum bufferevent_flush_mode mode, void *ctx) {
    cstate *cs = ctx;
    (void)lim;
    (void)mode;
    if (!cs->h || cs->phase == P_CLOSING) {
        evbuffer_drain(src, evbuffer_get_length(src));
        return BEV_OK;
    }
    size_t used = 0; /* bytes of src scanned, up to the header's end */
    if (cs->phase == P_IDLE || cs->phase == P_HEADER) {
        int nv = evbuffer_peek(src, -1, NULL, NULL, 0);
        struct evbuffer_iovec v[64];
        nv = evbuffer_peek(src, -1, NULL, v, nv < 64 ? nv : 64);
        for (int i = 0; i < nv && (cs->phase == P_IDLE || cs->phase == P_HEADER); i++) {
            const unsigned char *p = v[i].iov_base;
            for (size_t k = 0; k < v[i].iov_len; k++) {
                unsigned char c = p[k];
                used++;
                if (cs->phase == P_IDLE) {
                    cs->phase = P_HEADER;
                    cs->deadline = now_s() + cs->h->o.header_timeout;
                    cs->lines = cs->linelen = cs->cr = cs->bad = 0;
                    cs->keylen = cs->in_value = cs->is_cl = 0;
                    cs->clen = 0;
                }
                if (c == '\n') {
                    if (cs->linelen == 0 && cs->lines > 0) { /* the empty line: the header is whole */
                        cs->phase = P_BODY;
                        cs->deadline = now_s() + cs->h->o.body_timeout;
                        break;
                    }
                    if (cs->linelen) cs->lines++;
                    cs->linelen = cs->cr = 0;
                    cs->keylen = cs->in_value = cs->is_cl = 0;
                    continue;
                }
                if (cs->cr) cs->bad = 1; /* CR not before LF */
                cs->cr = c == '\r';
                if (c == 0) cs->bad = 1;
                if (c != '\r') {
                    cs->linelen++;
                    if (cs->lines > 0) header_byte(cs, c); /* not on the request line */
                }
            }
        }
        if (cs->phase == P_BODY && cs->clen > cs->h->o.max_body) {
            refuse_too_large(cs);
            evbuffer_drain(src, used); /* evhttp never sees the header's end */
        }
    }
    if (cs->phase == P_DISCARD) {
        size_t n = evbuffer_get_length(src);
        if (n > cs->discard_left) n = (size_t)cs->discard_left;
        evbuffer_drain(src, evbuffer_get_length(src));
        cs->discard_left -= n;
        if (cs->discard_left == 0) {
            cs->phase = P_CLOSING;
            bufferevent_trigger_event(cs->bev, BEV_EVENT_READING | BEV_EVENT_EOF, BEV_TRIG_DEFER_CALLBACKS);
        }
        return BEV_OK;
    }
    evbuffer_add_buffer(dst, src);
    return BEV_OK;
}

/* Moves src out: straight to the socket when nothing is queued before it,
 * the rest behind in dst. evhttp closes a connection (shutdown(SHUT_WR) on
 * the socket) as soon as the filter's own buffer is empty, so a reply left
 * in the socket bufferevent's buffer behind a "Connection: close" would be
 * lost. */
static void write_through(cstate *cs, struct evbuffer *src, struct evbuffer *dst) {
    struct bufferevent *u = bufferevent_get_underlying(cs->bev);
    int fd = u ? bufferevent_getfd(u) : -1;
    if (fd >= 0 && evbuffer_get_length(dst) == 0)
        while (evbuffer_get_length(src) && evbuffer_write(src, fd) > 0) {
        }
    evbuffer_add_buffer(dst, src);
}

/* evhttp answers a request it refuses before any handler runs (a header it
 * cannot parse, a chunked body over the limit, an Expect it does not know,
 * a method it does not know) with an HTML page in the request's own HTTP
 * version, "HTTP/1.5" included. Output that is not a reply of ours and
 * starts with a final status line is such a page: the same status goes out
 * instead in OpenAI's JSON shape, as HTTP/1.1, and evhttp's bytes are
 * thrown away (it closes the connection after them). 1 when it was. */
static int own_error(cstate *cs, struct evbuffer *src, struct evbuffer *dst) {
    char line[64];
    ev_ssize_t n = evbuffer_copyout(src, line, sizeof line - 1);
    if (n < 12 || memcmp(line, "HTTP/", 5)) return 0;
    line[n] = 0;
    const char *sp = strchr(line, ' '); /* the version is the request's, "1.-1" or 1.999… included */
    if (!sp || sp - line + 4 > n) return 0;
    int st = 0;
    for (int i = 1; i <= 3; i++) st = st * 10 + (sp[i] >= '0' && sp[i] <= '9' ? sp[i] - '0' : 1000);
    if (st < 200 || st > 599) return 0; /* 100 Continue goes out as it is */
    const char *msg = "malformed HTTP request", *code = "bad_request";
    char big[160];
    if (st == 413) {
        snprintf(big, sizeof big, "the request body is larger than --max-body-bytes %zu", cs->h->o.max_body);
        msg = big;
        code = "request_too_large";
    } else if (st == 417) {
        msg = "unsupported Expect header (only 100-continue is)";
        code = "expectation_failed";
    } else if (st == 501) {
        msg = "unsupported HTTP method";
        code = "not_implemented";
    }
    json_t *j = cm_oai_error_json(st, msg, NULL, code);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    size_t bl = body ? strlen(body) : 0;
    evbuffer_drain(src, evbuffer_get_length(src));
    cs->swallow = 1;
    struct evbuffer *out = evbuffer_new();
    if (out) {
        evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nServer: llmserve\r\n"
                            "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n", st, gw_http_reason(st), bl + 1,
                            body ? body : "");
        write_through(cs, out, dst);
        evbuffer_free(out);
    }
    free(body);
    if (cs->h->o.on_status) cs->h->o.on_status(cs->h->o.ctx, st);
    return 1;
}

/* Every reply byte: ours through write_through; evhttp's own error pages
 * replaced (own_error). */
static enum bufferevent_filter_result out_filter(struct evbuffer *src, struct evbuffer *dst, ev_ssize_t lim,
                                                 enum bufferevent_flush_mode mode, void *ctx) {
    cstate *cs = ctx;
    (void)lim;
    (void)mode;
    if (cs->swallow) {
        evbuffer_drain(src, evbuffer_get_length(src));
        return BEV_OK;
    }
    if (!cs->ours && cs->h && own_error(cs, src, dst)) return BEV_OK;
    write_through(cs, src, dst);
    return BEV_OK;
}

static void cstate_free(void *ctx) {
    cstate *cs = ctx;
    gw_http *h = cs->h;
    if (cs->flush) event_free(cs->flush);
    if (!h) { /* the server went first (gw_http_free): only the state is left */
        free(cs);
        return;
    }
    gw_map_del(&h->cons, (uint64_t)(uintptr_t)cs->bev);
    if (cs->prev) cs->prev->next = cs->next;
    else h->list = cs->next;
    if (cs->next) cs->next->prev = cs->prev;
    free(cs);
    h->open--;
    if (h->paused_cap && h->open < h->max_conn) {
        h->paused_cap = 0;
        listener_pause(h, 0);
    }
}

static void on_flush(evutil_socket_t fd, short what, void *arg) {
    cstate *cs = arg;
    (void)fd;
    (void)what;
    bufferevent_flush(cs->bev, EV_WRITE, BEV_NORMAL);
}

/* A filter moves output on only while writing is on, and evhttp queues a
 * reply before it turns writing on: so every addition schedules a flush
 * that runs once the current callback (evhttp's) has returned. */
static void on_output_added(struct evbuffer *b, const struct evbuffer_cb_info *info, void *arg) {
    cstate *cs = arg;
    (void)b;
    if (info->n_added && cs->flush) event_active(cs->flush, EV_WRITE, 1);
}

/* evhttp asks for each new connection's bufferevent: ours reads through
 * in_filter, and its free tells us the connection closed. */
static struct bufferevent *make_bev(struct event_base *base, void *arg) {
    gw_http *h = arg;
    cstate *cs = calloc(1, sizeof *cs);
    struct bufferevent *u = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    struct bufferevent *f = u && cs ? bufferevent_filter_new(u, in_filter, out_filter, BEV_OPT_CLOSE_ON_FREE, cstate_free, cs) : NULL;
    if (!f) {
        if (u) bufferevent_free(u);
        free(cs);
        return NULL;
    }
    cs->h = h;
    cs->bev = f;
    cs->flush = event_new(base, -1, 0, on_flush, cs);
    evbuffer_add_cb(bufferevent_get_output(f), on_output_added, cs);
    cs->next = h->list;
    if (h->list) h->list->prev = cs;
    h->list = cs;
    gw_map_put(&h->cons, (uint64_t)(uintptr_t)f, cs);
    if (++h->open >= h->max_conn && !h->paused_cap) { /* the kernel's backlog holds the rest */
        h->paused_cap = 1;
        listener_pause(h, 1);
        CM_WARN("--max-connections %d reached: not accepting until one closes", h->max_conn);
    }
    return f;
}

static void on_tick(evutil_socket_t fd, short what, void *arg) {
    gw_http *h = arg;
    (void)fd;
    (void)what;
    double t = now_s();
    for (cstate *cs = h->list; cs; cs = cs->next) {
        if ((cs->phase != P_HEADER && cs->phase != P_BODY && cs->phase != P_DISCARD) || t < cs->deadline) continue;
        CM_DEBUG("closing a connection: its %s took longer than its deadline",
                 cs->phase == P_HEADER ? "header" : cs->phase == P_BODY ? "body" : "refused body");
        cs->phase = P_CLOSING;
        /* as evhttp's own read timeout does: it frees the connection (deferred: not inside this walk) */
        bufferevent_trigger_event(cs->bev, BEV_EVENT_READING | BEV_EVENT_TIMEOUT, BEV_TRIG_DEFER_CALLBACKS);
    }
}

static void on_resume(evutil_socket_t fd, short what, void *arg) {
    gw_http *h = arg;
    (void)fd;
    (void)what;
    h->paused_fd = 0;
    listener_pause(h, 0);
}

/* accept() failed: out of file descriptors (or memory) must not spin the
 * loop at 100%: pause the listener 100 ms, log once every 10 s. */
static gw_http *the_http; /* the listener's callback argument is evhttp's own; one server per process */

static void on_accept_error(struct evconnlistener *l, void *arg) {
    gw_http *h = the_http;
    int e = EVUTIL_SOCKET_ERROR();
    (void)l;
    (void)arg;
    h->emfile_count++;
    double t = now_s();
    if (t - h->emfile_logged >= 10) {
        CM_WARN("accept failed (%s), %lu times since the last report: pausing new connections for 100 ms",
                evutil_socket_error_to_string(e), h->emfile_count);
        h->emfile_logged = t;
        h->emfile_count = 0;
    }
    h->paused_fd = 1;
    listener_pause(h, 1);
    struct timeval tv = {0, 100000};
    evtimer_add(h->resume, &tv);
}

/* ---- replies ------------------------------------------------------------- */

static cstate *conn_state(const gw_conn *c) {
    struct bufferevent *b = c->evc ? evhttp_connection_get_bufferevent(c->evc) : NULL;
    return b ? gw_map_get(&c->h->cons, (uint64_t)(uintptr_t)b) : NULL;
}

/* What goes out from here to the reply's end is ours, not evhttp's. */
static void mark_ours(const gw_conn *c) {
    cstate *cs = conn_state(c);
    if (cs) cs->ours = 1;
}

static void conn_end(gw_conn *c) {
    if (c->evc) evhttp_connection_set_closecb(c->evc, NULL, NULL);
    free(c);
}

void gw_http_header(gw_conn *c, const char *name, const char *value) {
    evhttp_add_header(evhttp_request_get_output_headers(c->req), name, value);
}

void gw_http_body(gw_conn *c, int status, const char *ctype, const char *data, size_t len) {
    struct evbuffer *b = evbuffer_new();
    if (b && len) evbuffer_add(b, data, len);
    struct evkeyvalq *oh = evhttp_request_get_output_headers(c->req);
    evhttp_add_header(oh, "Content-Type", ctype);
    evhttp_add_header(oh, "Server", "llmserve");
    if (c->h->o.on_status) c->h->o.on_status(c->h->o.ctx, status);
    mark_ours(c);
    /* the reply may be written, and the connection freed, inside the send */
    struct evhttp_request *req = c->req;
    conn_end(c);
    evhttp_send_reply(req, status, gw_http_reason(status), b);
    if (b) evbuffer_free(b);
}

void gw_http_json(gw_conn *c, int status, const json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    size_t n = s ? strlen(s) : 0;
    char *body = malloc(n + 2);
    if (body) {
        if (s) memcpy(body, s, n);
        body[n++] = '\n';
    }
    gw_http_body(c, status, "application/json", body ? body : "", body ? n : 0);
    free(body);
    free(s);
}

void gw_http_error(gw_conn *c, int status, const char *msg, const char *param, const char *code) {
    json_t *j = cm_oai_error_json(status, msg, param, code);
    gw_http_json(c, status, j);
    json_decref(j);
}

void gw_http_method_not_allowed(gw_conn *c, const char *allow) {
    gw_http_header(c, "Allow", allow);
    gw_http_error(c, 405, "method not allowed on this path", NULL, "method_not_allowed");
}

void gw_http_stream_begin(gw_conn *c) {
    struct evkeyvalq *oh = evhttp_request_get_output_headers(c->req);
    evhttp_add_header(oh, "Content-Type", "text/event-stream");
    evhttp_add_header(oh, "Cache-Control", "no-cache");
    evhttp_add_header(oh, "Server", "llmserve");
    mark_ours(c);
    evhttp_send_reply_start(c->req, 200, "OK");
    c->streaming = 1;
}

void gw_http_stream_event(gw_conn *c, const json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    struct evbuffer *b = evbuffer_new();
    if (b) {
        evbuffer_add_printf(b, "data: %s\n\n", s ? s : "{}");
        evhttp_send_reply_chunk(c->req, b);
        evbuffer_free(b);
    }
    free(s);
}

void gw_http_stream_end(gw_conn *c) {
    struct evbuffer *b = evbuffer_new();
    if (b) {
        evbuffer_add_printf(b, "data: [DONE]\n\n");
        evhttp_send_reply_chunk(c->req, b);
        evbuffer_free(b);
    }
    if (c->h->o.on_status) c->h->o.on_status(c->h->o.ctx, 200);
    struct evhttp_request *req = c->req;
    conn_end(c);
    evhttp_send_reply_end(req);
}

int gw_http_streaming(const gw_conn *c) { return c->streaming; }

size_t gw_http_backlog(const gw_conn *c) {
    struct bufferevent *b = evhttp_connection_get_bufferevent(c->evc);
    if (!b) return 0;
    size_t n = evbuffer_get_length(bufferevent_get_output(b));
    struct bufferevent *u = bufferevent_get_underlying(b);
    if (u) n += evbuffer_get_length(bufferevent_get_output(u));
    return n;
}

/* ---- the client going away --------------------------------------------- */

static void on_close(struct evhttp_connection *evc, void *arg) {
    gw_conn *c = arg;
    (void)evc;
    /* evhttp detaches a request whose reply is unfinished and leaves it to
     * us: free it, or it leaks with its whole body. At evhttp_free (no
     * detach) the connection frees it itself. */
    if (c->req && !evhttp_request_get_connection(c->req)) {
        evhttp_request_set_on_complete_cb(c->req, NULL, NULL);
        evhttp_request_free(c->req);
    }
    c->evc = NULL;
    c->req = NULL;
    if (c->gone) c->gone(c->arg);
    free(c);
}

void gw_http_on_gone(gw_conn *c, void (*cb)(void *), void *arg) {
    c->gone = cb;
    c->arg = arg;
}

int gw_http_check_gone(gw_conn *c) {
    struct bufferevent *b = evhttp_connection_get_bufferevent(c->evc);
    int fd = b ? bufferevent_getfd(b) : -1;
    if (fd < 0) return 0;
    char x;
    ssize_t r = recv(fd, &x, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) return 0;
    evhttp_connection_set_closecb(c->evc, NULL, NULL);
    evhttp_request_set_on_complete_cb(c->req, NULL, NULL);
    if (c->gone) c->gone(c->arg);
    evhttp_connection_free(c->evc); /* frees the request with it */
    free(c);
    return 1;
}

/* ---- requests ------------------------------------------------------------ */

static void on_complete(struct evhttp_request *req, void *arg) {
    gw_http *h = arg;
    struct evhttp_connection *evc = evhttp_request_get_connection(req);
    cstate *cs = evc ? gw_map_get(&h->cons, (uint64_t)(uintptr_t)evhttp_connection_get_bufferevent(evc)) : NULL;
    if (cs && cs->phase == P_HANDLING) cs->phase = P_IDLE; /* keep-alive: the next request's header starts its clock */
    if (cs) cs->ours = 0; /* all of it has passed out_filter: evhttp calls this once its buffer is empty */
    if (evc) { /* idle between requests: evhttp's inactivity timeout again */
        double t = h->o.header_timeout;
        struct timeval tv = {(time_t)t, (suseconds_t)((t - (double)(time_t)t) * 1e6)};
        evhttp_connection_set_timeout_tv(evc, &tv);
    }
}

/* The header checks evhttp does not make. NULL when fine. */
static const char *bad_header(struct evhttp_request *req, const cstate *cs) {
    if (cs && cs->bad) return "malformed header: a NUL byte or a CR not followed by LF";
    struct evkeyvalq *in = evhttp_request_get_input_headers(req);
    struct evkeyval *kv;
    int ncl = 0, te = 0;
    TAILQ_FOREACH(kv, in, next) {
        if (!strcasecmp(kv->key, "Content-Length")) {
            ncl++;
            if (!kv->value[0] || strspn(kv->value, "0123456789") != strlen(kv->value))
                return "Content-Length must be a plain decimal number";
        } else if (!strcasecmp(kv->key, "Transfer-Encoding")) {
            te = 1;
        }
    }
    if (ncl > 1) return "more than one Content-Length header";
    if (ncl && te) return "Content-Length together with Transfer-Encoding";
    if (req->major == 1 && req->minor >= 1 && !evhttp_find_header(in, "Host")) return "HTTP/1.1 request without Host";
    return NULL;
}

static void on_request(struct evhttp_request *req, void *arg) {
    gw_http *h = arg;
    struct evhttp_connection *evc = evhttp_request_get_connection(req);
    cstate *cs = gw_map_get(&h->cons, (uint64_t)(uintptr_t)evhttp_connection_get_bufferevent(evc));
    if (cs) cs->phase = P_HANDLING;
    gw_conn *c = calloc(1, sizeof *c);
    if (!c) {
        evhttp_send_error(req, 500, "Internal Server Error");
        return;
    }
    c->h = h;
    c->req = req;
    c->evc = evc;
    evhttp_request_set_on_complete_cb(req, on_complete, h);
    evhttp_connection_set_closecb(evc, on_close, c);
    /* while it is answered the request's own deadlines govern (gw_req): a
     * stream may wait for its first token longer than a header may take */
    struct timeval day = {86400, 0};
    evhttp_connection_set_timeout_tv(evc, &day);
    int major = (signed char)req->major, minor = (signed char)req->minor; /* char: unsigned on ARM */
    if (major != 1 || minor < 0 || minor > 1) { /* evhttp takes any 1.x, "1.-110" too, and would answer in it */
        char v[64];
        snprintf(v, sizeof v, "HTTP/%d.%d is not supported: HTTP/1.1 or HTTP/1.0", major, minor);
        req->major = 1; /* the reply's own version */
        req->minor = 1;
        gw_http_header(c, "Connection", "close");
        gw_http_error(c, 505, v, NULL, "http_version_not_supported");
        return;
    }
    const char *bad = bad_header(req, cs);
    if (bad) {
        gw_http_header(c, "Connection", "close");
        gw_http_error(c, 400, bad, NULL, "bad_request");
        return;
    }
    const char *uri = evhttp_request_get_uri(req);
    char path[512];
    snprintf(path, sizeof path, "%s", uri ? uri : "/");
    path[strcspn(path, "?#")] = 0;
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    char *peer = NULL;
    ev_uint16_t port = 0;
    evhttp_connection_get_peer(evc, &peer, &port);
    gw_http_req r = {.method = m == EVHTTP_REQ_GET ? GW_M_GET : m == EVHTTP_REQ_POST ? GW_M_POST
                               : m == EVHTTP_REQ_HEAD ? GW_M_HEAD : GW_M_OTHER,
                     .path = path,
                     .authorization = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization"),
                     .body = len ? (const char *)evbuffer_pullup(in, -1) : "",
                     .body_len = len,
                     .peer = peer ? peer : "-",
                     .conn = c};
    h->o.handler(h->o.ctx, &r);
}

int gw_http_create(struct event_base *base, const gw_http_opts *o, gw_http **out, char *err, size_t errlen) {
    *out = NULL;
    gw_http *h = calloc(1, sizeof *h);
    if (!h) return -1;
    h->base = base;
    h->o = *o;
    h->max_conn = o->max_connections;
    if (h->max_conn <= 0) {
        struct rlimit rl;
        long lim = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (long)rl.rlim_cur : 4096;
        h->max_conn = lim > 128 ? (int)(lim - 64) : (int)(lim > 32 ? lim / 2 : 16); /* a reserve for workers' sockets, files */
    }
    h->http = evhttp_new(base);
    if (!h->http) goto fail;
    evhttp_set_max_body_size(h->http, (ev_ssize_t)o->max_body);
    evhttp_set_max_headers_size(h->http, 64 * 1024);
    struct timeval ht = {(time_t)o->header_timeout, (suseconds_t)((o->header_timeout - (double)(time_t)o->header_timeout) * 1e6)};
    evhttp_set_timeout_tv(h->http, &ht); /* idle keep-alive connections; our deadlines cover slow senders */
    evhttp_set_allowed_methods(h->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT |
                                            EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
    evhttp_set_bevcb(h->http, make_bev, h);
    evhttp_set_gencb(h->http, on_request, h);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(h->http, o->host, (ev_uint16_t)o->port);
    if (!bs) {
        snprintf(err, errlen, "cannot bind %s:%d: %s", o->host, o->port, strerror(errno));
        goto fail;
    }
    h->lst = evhttp_bound_socket_get_listener(bs);
    the_http = h;
    evconnlistener_set_error_cb(h->lst, on_accept_error);
    h->tick = event_new(base, -1, EV_PERSIST, on_tick, h);
    h->resume = evtimer_new(base, on_resume, h);
    if (!h->tick || !h->resume) goto fail;
    struct timeval q = {0, 250000};
    event_add(h->tick, &q);
    *out = h;
    return 0;
fail:
    gw_http_free(h);
    return -1;
}

void gw_http_free(gw_http *h) {
    if (!h) return;
    if (h->http) evhttp_free(h->http);
    /* evhttp_free closes the connections, but libevent frees their
     * bufferevents (and calls cstate_free) later, as late as event_base_free:
     * cut the states loose from the server that is about to go */
    for (cstate *cs = h->list, *next; cs; cs = next) {
        next = cs->next;
        if (cs->flush) event_free(cs->flush);
        cs->flush = NULL;
        cs->h = NULL;
        cs->prev = cs->next = NULL;
    }
    h->list = NULL;
    if (h->tick) event_free(h->tick);
    if (h->resume) event_free(h->resume);
    gw_map_free(&h->cons);
    free(h);
}

int gw_http_open_connections(const gw_http *h) { return h->open; }

int gw_http_port(const gw_http *h) {
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    if (getsockname(evconnlistener_get_fd(h->lst), (struct sockaddr *)&a, &al)) return -1;
    if (a.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&a)->sin_port);
    if (a.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
    return -1;
}
