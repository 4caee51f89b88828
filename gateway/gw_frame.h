/* gw_frame.h - HTTP/1.1 request framing, ahead of evhttp (gw_http's input
 * filter). Part of gw_http: no other module includes it.
 *
 * It finds where each request on a connection begins and ends, so that
 * every request is checked, pipelined ones too, and it answers what evhttp
 * gets wrong: empty lines before a request line are skipped (RFC 9112 §2.2);
 * a chunked body is decoded here (chunk extensions and trailers allowed,
 * RFC 9112 §7.1) and handed on with a Content-Length instead of the
 * Transfer-Encoding; a malformed chunk size is a 400, not evhttp's 413; a
 * transfer coding other than chunked is a 501, as nginx answers; a NUL byte
 * or a bare CR in a header, Content-Length together with Transfer-Encoding,
 * two Content-Lengths, one that is not plain digits, a header over 64 KiB
 * (431), a body over the limit (413), and a method the gateway does not
 * serve (CONNECT, TRACE, ...: 501) are refused before evhttp sees the
 * request. O(1) per header or chunk-size byte; body bytes move in bulk. */
#ifndef GW_FRAME_H
#define GW_FRAME_H

#include <event2/buffer.h>
#include <stddef.h>
#include <stdint.h>

/* Where the connection is in reading its current request. */
enum {
    GF_IDLE = 0, /* between requests: no byte of the next one yet */
    GF_HEADER,   /* reading a header (held back until it is whole) */
    GF_BODY,     /* a Content-Length body passing through */
    GF_CHUNKED,  /* a chunked body being decoded (the header held back with it) */
    GF_DISCARD,  /* a refused body being thrown away (discard_left more) */
    GF_CLOSED    /* refused: everything more is thrown away */
};

#define GF_MAX_HEADER (64u << 10)

typedef struct {
    size_t max_body;
    int phase;
    unsigned gen;                /* counts phase changes (a caller's deadline restarts on each) */
    unsigned handed;             /* requests handed on whole (their header, and a chunked body decoded) */
    /* the header being read */
    struct evbuffer *head;       /* its bytes so far */
    int lines, linelen, cr, bad;
    char key[24];                /* the current field's name, lower case */
    int keylen, in_value, field, vstate, cl_bad, n_cl, n_te, expect100;
    uint64_t clen;
    char te[128];                /* the Transfer-Encoding values, lower case, joined by ',' */
    int telen, te_long;
    char ev[16];                 /* the Expect value, lower case, without blanks */
    int evlen;
    char method[12];             /* the request line's method, while it is read */
    int mlen, msp;               /* its length; 1 once the space after it was seen */
    size_t line_at;              /* offset in head of the current line */
    size_t hdr_end;              /* offset in head of the empty line */
    size_t te_at[4][2];          /* the Transfer-Encoding lines' [start, end) in head */
    /* a body */
    uint64_t body_left;          /* GF_BODY: bytes still to pass */
    uint64_t discard_left;       /* GF_DISCARD: bytes still to throw away */
    struct evbuffer *body;       /* GF_CHUNKED: the decoded body */
    int ck, ck_digits, ck_ext, tr_bytes;
    uint64_t ck_left;
    int want_continue;           /* a held chunked header asked for 100 Continue: the caller sends it, clears this */
    /* a refusal */
    int err_status;
    char err_msg[160];
    const char *err_code;
} gw_frame;

void gw_frame_init(gw_frame *f, size_t max_body);
void gw_frame_free(gw_frame *f);
/* Takes every byte of src; appends to dst what evhttp is to parse. 0, or
 * the status of a refusal (err_status, err_msg, err_code set; phase is then
 * GF_DISCARD or GF_CLOSED, and the caller answers and closes). */
int gw_frame_feed(gw_frame *f, struct evbuffer *src, struct evbuffer *dst);

#endif
