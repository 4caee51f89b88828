/* gw_http.h - the gateway's HTTP/1.1 server: the only file that touches
 * libevent's evhttp.
 *
 * Handlers get a parsed request and a gw_conn, and answer through it: a JSON
 * body, an OpenAI error, or a stream (begin / event / end as SSE). Each
 * answer that ends the reply also ends the gw_conn: it must not be used
 * after. A client that goes away first is reported once through the
 * on_gone callback, after which the gw_conn is gone too.
 *
 * What the HTTP layer refuses before any handler runs (answers in OpenAI's
 * error shape with the standard reason phrase): two Content-Length headers,
 * a Content-Length that is not plain digits, Content-Length together with
 * Transfer-Encoding, a NUL byte or a bare CR in the header, HTTP/1.1 without
 * Host (400); a body over the limit (413, by evhttp). Each connection must
 * deliver its whole header within header_timeout and its body within
 * body_timeout after that; at most max_connections are open (the listener
 * pauses at the cap, and for a moment when accept() runs out of file
 * descriptors, instead of spinning). */
#ifndef GW_HTTP_H
#define GW_HTTP_H

#include <event2/event.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gw_http gw_http;
typedef struct gw_conn gw_conn;

enum { GW_M_GET = 1, GW_M_POST, GW_M_HEAD, GW_M_DELETE, GW_M_OTHER };

typedef struct {
    int method;
    const char *path;            /* without the query */
    const char *authorization;   /* header value or NULL */
    const char *x_api_key;       /* Anthropic's key header, or NULL */
    const char *content_type;    /* or NULL */
    const char *body;            /* not NUL-terminated */
    size_t body_len;
    const char *peer;            /* client address */
    gw_conn *conn;
} gw_http_req;

typedef struct {
    const char *host;
    int port;
    size_t max_body;
    double header_timeout, body_timeout;
    int max_connections;         /* 0: the file descriptor limit less a reserve */
    void (*handler)(void *ctx, gw_http_req *r);
    void (*on_status)(void *ctx, int status); /* every reply's status, once */
    void *ctx;
    const struct gw_cors *cors;  /* CORS (gw_cors.h): preflights answered, Allow-Origin on replies; NULL: none */
} gw_http_opts;

int gw_http_create(struct event_base *base, const gw_http_opts *o, gw_http **out, char *err, size_t errlen);

/* Another API's shapes at the edge of one reply (gw_anthropic.c): every JSON reply passes through reply
 * (status, the OpenAI-shaped body; a new body to send, or NULL to send it as it is), every stream event through
 * event (which writes what it makes with gw_http_stream_named), and the stream's end through end (instead of
 * data: [DONE]); free with the connection. */
typedef struct {
    json_t *(*reply)(void *ctx, gw_conn *c, int status, const json_t *j);
    void (*event)(void *ctx, gw_conn *c, const json_t *j);
    void (*end)(void *ctx, gw_conn *c);
    void (*free)(void *ctx);
    void *ctx;
} gw_http_filter;
void gw_http_set_filter(gw_conn *c, const gw_http_filter *f);
/* Inside a filter's reply or end: the reply's end (the body, or the stream's end) waits until gw_http_release,
 * so that the filter can first finish something of its own (a response stored where another gateway reads it).
 * Whoever answered sees the reply ended; the gw_conn lives on for the filter, and the client going away meanwhile
 * calls what the filter sets with gw_http_on_gone (after it holds). */
void gw_http_hold(gw_conn *c);
void gw_http_release(gw_conn *c);
/* An SSE event with a name (event: NAME), unfiltered. */
void gw_http_stream_named(gw_conn *c, const char *event, const json_t *j);
void gw_http_free(gw_http *h);
int gw_http_open_connections(const gw_http *h);
/* Replies streaming now: begun and not yet ended (by their end or the client's). */
int gw_http_open_streams(const gw_http *h);
/* Connections accepted since the start. */
uint64_t gw_http_accepted(const gw_http *h);
/* The port it listens on (the one the kernel chose for port 0), or -1. */
int gw_http_port(const gw_http *h);

/* A header for the reply (before it starts). */
void gw_http_header(gw_conn *c, const char *name, const char *value);
/* Ends the reply with JSON (j borrowed). */
void gw_http_json(gw_conn *c, int status, const json_t *j);
/* Ends the reply with an OpenAI error body. */
void gw_http_error(gw_conn *c, int status, const char *msg, const char *param, const char *code);
void gw_http_body(gw_conn *c, int status, const char *ctype, const char *data, size_t len);
/* 405 with Allow. */
void gw_http_method_not_allowed(gw_conn *c, const char *allow);

/* SSE: 200 text/event-stream, then "data: JSON\n\n" events, then
 * "data: [DONE]\n\n" and the end (which ends the gw_conn). */
void gw_http_stream_begin(gw_conn *c);
void gw_http_stream_event(gw_conn *c, const json_t *j);
void gw_http_stream_end(gw_conn *c);
int gw_http_streaming(const gw_conn *c);
/* Bytes written to the client's socket buffer but not yet sent. */
size_t gw_http_backlog(const gw_conn *c);

/* Calls cb(arg) once if the client goes away before the reply ends. */
void gw_http_on_gone(gw_conn *c, void (*cb)(void *), void *arg);
/* A client waiting for a non-streamed reply writes nothing, so its hang-up
 * is seen only by looking: 1 when it has gone (on_gone was called and the
 * connection closed), else 0. */
int gw_http_check_gone(gw_conn *c);

/* The standard reason phrase of a status. */
const char *gw_http_reason(int status);

#endif
