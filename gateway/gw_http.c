#include "gw_http.h"
#include "gw_cors.h"
#include "cm_log.h"
#include "cm_time.h"
#include "cm_oai_resp.h"
#include "gw_frame.h"
#include "cm_idmap.h"

#include <errno.h>
#include <malloc.h>
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

#define GW_TRIM_BODY (1u << 20) /* a body this large is followed by a heap trim */

typedef struct cstate {
    struct cstate *prev, *next;
    gw_http *h;
    struct bufferevent *bev;     /* the filter evhttp reads through */
    gw_frame fr;                 /* where each request begins and ends (gw_frame.h) */
    unsigned gen;                /* fr.gen when the deadline was set */
    double deadline;             /* of the header or body being read, while not busy */
    unsigned answered;           /* requests answered (on_complete); fr.handed - answered are with evhttp */
    int refused, shut;           /* fr's refusal went out; the socket's write side is shut after it */
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
    gw_http_filter filter;         /* another API's shapes at the edge, or all NULL */
    int held;                      /* gw_http_hold: 1 asked, 2 a reply waits for gw_http_release */
    int held_status;               /* the held body's (0: a held stream end) */
    char *held_body;
    size_t held_len;
};

struct gw_http {
    struct event_base *base;
    struct evhttp *http;
    struct evconnlistener *lst;
    gw_http_opts o;
    int open, max_conn, paused_cap, paused_fd;
    int streams;                   /* replies streaming now (gw_http_stream_begin to their end) */
    uint64_t accepted;
    struct event *tick, *resume, *trim;
    cm_idmap cons;                 /* filter bufferevent -> cstate */
    cstate *list;
    double emfile_logged;
    unsigned long emfile_count;
};

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

/* Requests handed on and not yet answered: evhttp reads no more of this
 * connection until they are, and a refusal must wait behind their replies. */
static int busy(const cstate *cs) { return cs->fr.handed != cs->answered; }

static double phase_timeout(const cstate *cs) {
    return cs->fr.phase == GF_HEADER ? cs->h->o.header_timeout : cs->h->o.body_timeout;
}

/* The connection is to close once the refusal is out and the refused body
 * thrown away: evhttp frees it as on a hang-up (deferred: not inside a
 * filter or a walk). */
static void close_if_done(cstate *cs) {
    if (cs->refused && cs->shut && cs->fr.phase == GF_CLOSED) {
        cs->refused = 2; /* once */
        bufferevent_trigger_event(cs->bev, BEV_EVENT_READING | BEV_EVENT_EOF, BEV_TRIG_DEFER_CALLBACKS);
    }
}

/* The framer's refusal (a 400, 413, 431 or 501 in OpenAI's JSON shape,
 * with Connection: close), after any reply still going out on this
 * connection: straight to the socket when nothing is queued before it, and
 * the write side shut behind it so the client reads it rather than a reset
 * while the rest of its body is thrown away; else queued behind, and shut
 * by the tick once it has gone. */
static void send_refusal(cstate *cs) {
    struct bufferevent *u = bufferevent_get_underlying(cs->bev);
    int fd = u ? bufferevent_getfd(u) : -1;
    json_t *j = cm_oai_error_json(cs->fr.err_status, cs->fr.err_msg, NULL, cs->fr.err_code);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    struct evbuffer *out = evbuffer_new();
    cs->refused = 1;
    if (out && body) {
        evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nServer: llmserve\r\n"
                            "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n", cs->fr.err_status,
                            gw_http_reason(cs->fr.err_status), strlen(body) + 1, body);
        if (fd >= 0 && u && evbuffer_get_length(bufferevent_get_output(u)) == 0) {
            while (evbuffer_get_length(out) && evbuffer_write(out, fd) > 0) {
            }
        }
        if (evbuffer_get_length(out) == 0 && fd >= 0) {
            shutdown(fd, SHUT_WR);
            cs->shut = 1;
        } else if (u) {
            evbuffer_add_buffer(bufferevent_get_output(u), out);
            bufferevent_enable(u, EV_WRITE);
        }
    } else if (fd >= 0) { /* out of memory: no answer, only the close */
        shutdown(fd, SHUT_WR);
        cs->shut = 1;
    }
    if (out) evbuffer_free(out);
    free(body);
    if (cs->h->o.on_status) cs->h->o.on_status(cs->h->o.ctx, cs->fr.err_status);
    close_if_done(cs);
}

static void send_continue(cstate *cs) {
    struct bufferevent *u = bufferevent_get_underlying(cs->bev);
    int fd = u ? bufferevent_getfd(u) : -1;
    cs->fr.want_continue = 0;
    if (fd >= 0 && evbuffer_get_length(bufferevent_get_output(u)) == 0)
        (void)!send(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25, MSG_NOSIGNAL);
}

/* Sees every byte a client sends before evhttp does: gw_frame finds each
 * request's bounds and refuses what evhttp would get wrong; evhttp reads
 * only whole, checked headers and their bodies. A refusal waits for the
 * answer in progress on this connection, if any (pipelining). */
static enum bufferevent_filter_result in_filter(struct evbuffer *src, struct evbuffer *dst, ev_ssize_t lim,
                                                enum bufferevent_flush_mode mode, void *ctx) {
    cstate *cs = ctx;
    (void)lim;
    (void)mode;
    if (!cs->h) {
        evbuffer_drain(src, evbuffer_get_length(src));
        return BEV_OK;
    }
    int st = gw_frame_feed(&cs->fr, src, dst);
    if (cs->fr.gen != cs->gen) { /* a header or body began: its clock starts */
        cs->gen = cs->fr.gen;
        cs->deadline = cm_now() + phase_timeout(cs);
    }
    if (st && !busy(cs)) send_refusal(cs);
    else if (cs->fr.want_continue && !busy(cs)) send_continue(cs);
    close_if_done(cs);
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
    gw_frame_free(&cs->fr);
    if (!h) { /* the server went first (gw_http_free): only the state is left */
        free(cs);
        return;
    }
    cm_idmap_del(&h->cons, (uint64_t)(uintptr_t)cs->bev);
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
    /* A filter calls the write callback only right after it moved bytes.
     * While writing is on (a stream), evhttp's last chunk moves out the
     * moment it is added, before evhttp sets the "all written" callback
     * that ends the request (evhttp_send_reply_end adds, then sets): that
     * callback would never run, and the keep-alive connection would never
     * read its next request. Output empty with writing on is exactly the
     * moment a socket bufferevent would call it: say so. */
    if (evbuffer_get_length(bufferevent_get_output(cs->bev)) == 0 && (bufferevent_get_enabled(cs->bev) & EV_WRITE))
        bufferevent_trigger(cs->bev, EV_WRITE, 0);
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
    gw_frame_init(&cs->fr, h->o.max_body);
    cs->flush = event_new(base, -1, 0, on_flush, cs);
    evbuffer_add_cb(bufferevent_get_output(f), on_output_added, cs);
    cs->next = h->list;
    if (h->list) h->list->prev = cs;
    h->list = cs;
    cm_idmap_put(&h->cons, (uint64_t)(uintptr_t)f, cs);
    h->accepted++;
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
    double t = cm_now();
    for (cstate *cs = h->list; cs; cs = cs->next) {
        if (cs->refused == 1 && !cs->shut) { /* a refusal queued behind a reply: shut once it has gone */
            struct bufferevent *u = bufferevent_get_underlying(cs->bev);
            if (u && evbuffer_get_length(bufferevent_get_output(u)) == 0) {
                shutdown(bufferevent_getfd(u), SHUT_WR);
                cs->shut = 1;
                close_if_done(cs);
            }
        }
        /* while a request is answered its own deadlines govern (gw_req); a
         * pipelined one behind it waits without a clock */
        int p = cs->fr.phase;
        if (busy(cs) || (p != GF_HEADER && p != GF_BODY && p != GF_CHUNKED && p != GF_DISCARD) || t < cs->deadline)
            continue;
        CM_DEBUG("closing a connection: its %s took longer than its deadline",
                 p == GF_HEADER ? "header" : p == GF_DISCARD ? "refused body" : "body");
        cs->fr.phase = GF_CLOSED;
        /* as evhttp's own read timeout does: it frees the connection (deferred: not inside this walk) */
        bufferevent_trigger_event(cs->bev, BEV_EVENT_READING | BEV_EVENT_TIMEOUT, BEV_TRIG_DEFER_CALLBACKS);
    }
}

/* A large body's buffers (the request's, the tokenizer thread's parse) are
 * freed by now: glibc keeps freed heap pages resident until trimmed, so
 * without this the gateway stays at the peak of its largest bodies. A walk
 * of the heaps, once per large body: far below the cost of reading one. */
static void on_trim(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    (void)arg;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
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
    double t = cm_now();
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
    return b ? cm_idmap_get(&c->h->cons, (uint64_t)(uintptr_t)b) : NULL;
}

/* What goes out from here to the reply's end is ours, not evhttp's. */
static void mark_ours(const gw_conn *c) {
    cstate *cs = conn_state(c);
    if (cs) cs->ours = 1;
}

/* The gw_conn's one end, whichever way the reply or the client ended. */
static void conn_free(gw_conn *c) {
    if (c->streaming) c->h->streams--;
    if (c->filter.free) c->filter.free(c->filter.ctx);
    free(c->held_body);
    free(c);
}

void gw_http_set_filter(gw_conn *c, const gw_http_filter *f) {
    if (c->filter.free) c->filter.free(c->filter.ctx);
    c->filter = *f;
}

static void conn_end(gw_conn *c) {
    if (c->evc) evhttp_connection_set_closecb(c->evc, NULL, NULL);
    conn_free(c);
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
    json_t *f = c->filter.reply ? c->filter.reply(c->filter.ctx, c, status, j) : NULL;
    char *s = json_dumps(f ? f : j, JSON_COMPACT);
    json_decref(f);
    size_t n = s ? strlen(s) : 0;
    char *body = malloc(n + 2);
    if (body) {
        if (s) memcpy(body, s, n);
        body[n++] = '\n';
    }
    if (c->held) { /* the filter sends it at gw_http_release */
        c->held = 2;
        c->held_status = status;
        c->held_body = body;
        c->held_len = body ? n : 0;
        free(s);
        return;
    }
    gw_http_body(c, status, "application/json", body ? body : "", body ? n : 0);
    free(body);
    free(s);
}

void gw_http_hold(gw_conn *c) {
    c->held = 1;
    c->gone = NULL; /* whoever answered is done with it */
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
    c->h->streams++;
}

void gw_http_stream_named(gw_conn *c, const char *event, const json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    struct evbuffer *b = evbuffer_new();
    if (b) {
        if (event) evbuffer_add_printf(b, "event: %s\n", event);
        evbuffer_add_printf(b, "data: %s\n\n", s ? s : "{}");
        evhttp_send_reply_chunk(c->req, b);
        evbuffer_free(b);
    }
    free(s);
}

void gw_http_stream_event(gw_conn *c, const json_t *j) {
    if (c->filter.event) c->filter.event(c->filter.ctx, c, j);
    else gw_http_stream_named(c, NULL, j);
}

static void stream_close(gw_conn *c);

void gw_http_stream_end(gw_conn *c) {
    if (c->filter.end) c->filter.end(c->filter.ctx, c);
    if (c->held) {
        c->held = 2;
        c->held_status = 0;
        return;
    }
    stream_close(c);
}

void gw_http_release(gw_conn *c) {
    if (c->held != 2) {
        c->held = 0;
        return;
    }
    c->held = 0;
    if (c->held_status) {
        char *b = c->held_body;
        c->held_body = NULL;
        gw_http_body(c, c->held_status, "application/json", b ? b : "", b ? c->held_len : 0);
        free(b);
    } else {
        stream_close(c);
    }
}

static void stream_close(gw_conn *c) {
    struct evbuffer *b = c->filter.end ? NULL : evbuffer_new();
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
    conn_free(c);
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
    conn_free(c);
    return 1;
}

/* ---- requests ------------------------------------------------------------ */

static void on_complete(struct evhttp_request *req, void *arg) {
    gw_http *h = arg;
    struct evhttp_connection *evc = evhttp_request_get_connection(req);
    cstate *cs = evc ? cm_idmap_get(&h->cons, (uint64_t)(uintptr_t)evhttp_connection_get_bufferevent(evc)) : NULL;
    if (evbuffer_get_length(evhttp_request_get_input_buffer(req)) >= GW_TRIM_BODY) {
        /* after the request and its buffers are freed, in a later round of the loop */
        struct timeval soon = {0, 50000};
        evtimer_add(h->trim, &soon);
    }
    if (cs) {
        cs->ours = 0; /* all of it has passed out_filter: evhttp calls this once its buffer is empty */
        cs->answered++;
        cs->deadline = cm_now() + phase_timeout(cs); /* a pipelined header or body's clock starts now */
        if (!busy(cs) && cs->fr.err_status && !cs->refused) send_refusal(cs); /* a pipelined request was refused */
        else if (!busy(cs) && cs->fr.want_continue) send_continue(cs);
    }
    if (evc) { /* idle between requests: evhttp's inactivity timeout again */
        double t = h->o.header_timeout;
        struct timeval tv = {(time_t)t, (suseconds_t)((t - (double)(time_t)t) * 1e6)};
        evhttp_connection_set_timeout_tv(evc, &tv);
    }
}

/* The header checks evhttp does not make. NULL when fine. */
/* A request with an Origin: a preflight is answered here (1); any other from an allowed origin gets its
 * Access-Control headers on whatever reply it gets (0). */
static int cors(gw_http *h, gw_conn *c, struct evhttp_request *req) {
    struct evkeyvalq *in = evhttp_request_get_input_headers(req);
    const char *origin = evhttp_find_header(in, "Origin");
    if (!origin) return 0;
    const char *method = evhttp_find_header(in, "Access-Control-Request-Method");
    int vary;
    const char *allow = gw_cors_allow_origin(h->o.cors, origin, &vary);
    if (evhttp_request_get_command(req) == EVHTTP_REQ_OPTIONS && method) {
        char methods[256], headers[1024], why[64];
        if (gw_cors_preflight(h->o.cors, origin, method, evhttp_find_header(in, "Access-Control-Request-Headers"), methods,
                              sizeof methods, headers, sizeof headers, why, sizeof why)) {
            gw_http_body(c, 400, "text/plain; charset=utf-8", why, strlen(why));
            return 1;
        }
        gw_http_header(c, "Access-Control-Allow-Origin", allow);
        if (vary) gw_http_header(c, "Vary", "Origin");
        if (h->o.cors->credentials) gw_http_header(c, "Access-Control-Allow-Credentials", "true");
        gw_http_header(c, "Access-Control-Allow-Methods", methods);
        if (headers[0]) gw_http_header(c, "Access-Control-Allow-Headers", headers);
        gw_http_header(c, "Access-Control-Max-Age", "600");
        gw_http_body(c, 200, "text/plain; charset=utf-8", "OK", 2);
        return 1;
    }
    if (!gw_cors_origin_ok(h->o.cors, origin)) return 0;
    gw_http_header(c, "Access-Control-Allow-Origin", allow);
    if (vary) gw_http_header(c, "Vary", "Origin");
    if (h->o.cors->credentials) gw_http_header(c, "Access-Control-Allow-Credentials", "true");
    return 0;
}

static const char *bad_header(struct evhttp_request *req) {
    struct evkeyvalq *in = evhttp_request_get_input_headers(req);
    if (req->major == 1 && req->minor >= 1 && !evhttp_find_header(in, "Host")) return "HTTP/1.1 request without Host";
    return NULL;
}

static void on_request(struct evhttp_request *req, void *arg) {
    gw_http *h = arg;
    struct evhttp_connection *evc = evhttp_request_get_connection(req);
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
    const char *bad = bad_header(req);
    if (bad) {
        gw_http_header(c, "Connection", "close");
        gw_http_error(c, 400, bad, NULL, "bad_request");
        return;
    }
    if (h->o.cors && cors(h, c, req)) return;
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
                               : m == EVHTTP_REQ_HEAD ? GW_M_HEAD
                               : m == EVHTTP_REQ_DELETE ? GW_M_DELETE : GW_M_OTHER,
                     .path = path,
                     .authorization = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization"),
                     .x_api_key = evhttp_find_header(evhttp_request_get_input_headers(req), "x-api-key"),
                     .content_type = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type"),
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
    h->trim = evtimer_new(base, on_trim, h);
    if (!h->tick || !h->resume || !h->trim) goto fail;
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
    if (h->trim) event_free(h->trim);
    cm_idmap_free(&h->cons);
    free(h);
}

int gw_http_open_connections(const gw_http *h) { return h->open; }

int gw_http_open_streams(const gw_http *h) { return h->streams; }

uint64_t gw_http_accepted(const gw_http *h) { return h->accepted; }

int gw_http_port(const gw_http *h) {
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    if (getsockname(evconnlistener_get_fd(h->lst), (struct sockaddr *)&a, &al)) return -1;
    if (a.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&a)->sin_port);
    if (a.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
    return -1;
}
