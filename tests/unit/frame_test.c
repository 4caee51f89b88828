/* gw_frame on its own: each case's bytes are fed whole, one byte at a
 * time and in pseudo-random pieces, and every way must give the same
 * refusal (or none) and the same bytes for evhttp: the header with the
 * chunked body decoded behind a Content-Length, pipelined requests each
 * framed on their own. */
#include "gw_frame.h"
#include "tst.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *what;
    const char *in;
    size_t len;     /* 0: strlen(in) */
    int status;     /* the refusal, or 0 */
    const char *out; /* what evhttp reads (checked when status is 0) */
    unsigned handed; /* requests handed on */
} fcase;

#define H "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"

static const fcase CASES[] = {
    {"a GET", "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 0, 0, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 1},
    {"a Content-Length body", H "Content-Length: 5\r\n\r\nhello", 0, 0, H "Content-Length: 5\r\n\r\nhello", 1},
    {"empty lines before the request line", "\r\n\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n", 0, 0,
     "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 1},
    {"pipelined: a body, then a GET", H "Content-Length: 2\r\n\r\nhiGET / HTTP/1.1\r\nHost: y\r\n\r\n", 0, 0,
     H "Content-Length: 2\r\n\r\nhiGET / HTTP/1.1\r\nHost: y\r\n\r\n", 2},
    {"chunked, decoded behind a Content-Length", H "Transfer-Encoding: chunked\r\nX-A: 1\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
     0, 0, H "X-A: 1\r\nContent-Length: 11\r\n\r\nhello world", 1},
    {"a chunk extension (7;ext=1)", H "Transfer-Encoding: chunked\r\n\r\n7;ext=1\r\nabcdefg\r\n0;last\r\n\r\n", 0, 0,
     H "Content-Length: 7\r\n\r\nabcdefg", 1},
    {"extensions with blanks and quotes", H "Transfer-Encoding: chunked\r\n\r\n3 ; a = \"b;c\"\r\nabc\r\n0\r\n\r\n", 0, 0,
     H "Content-Length: 3\r\n\r\nabc", 1},
    {"upper-case hex, a trailer", H "Transfer-Encoding: chunked\r\n\r\nA\r\n0123456789\r\n0\r\nX-Sum: 9\r\n\r\n", 0, 0,
     H "Content-Length: 10\r\n\r\n0123456789", 1},
    {"Transfer-Encoding: Chunked, then a pipelined GET", H "Transfer-Encoding: Chunked\r\n\r\n1\r\nz\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: y\r\n\r\n",
     0, 0, H "Content-Length: 1\r\n\r\nzGET / HTTP/1.1\r\nHost: y\r\n\r\n", 2},
    {"bare LF line ends", "POST / HTTP/1.1\nHost: x\nTransfer-Encoding: chunked\n\n2\nok\n0\n\n", 0, 0,
     "POST / HTTP/1.1\nHost: x\nContent-Length: 2\r\n\r\nok", 1},
    {"Content-Length with blanks", H "Content-Length:  3 \r\n\r\nabc", 0, 0, H "Content-Length:  3 \r\n\r\nabc", 1},
    {"a malformed chunk size", H "Transfer-Encoding: chunked\r\n\r\nzz\r\n", 0, 400, NULL, 0},
    {"junk after a chunk size", H "Transfer-Encoding: chunked\r\n\r\n5x\r\nhello\r\n0\r\n\r\n", 0, 400, NULL, 0},
    {"an empty chunk size", H "Transfer-Encoding: chunked\r\n\r\n\r\n", 0, 400, NULL, 0},
    {"chunk data past its size", H "Transfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n", 0, 400, NULL, 0},
    {"a chunk size over the limit", H "Transfer-Encoding: chunked\r\n\r\n100001\r\n", 0, 413, NULL, 0},
    {"a chunk size of 17 hex digits", H "Transfer-Encoding: chunked\r\n\r\n10000000000000000\r\n", 0, 413, NULL, 0},
    {"gzip, chunked", H "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 0, 501, NULL, 0},
    {"gzip and chunked on two lines", H "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 0, 501, NULL, 0},
    {"chunked, gzip", H "Transfer-Encoding: chunked, gzip\r\n\r\n", 0, 400, NULL, 0},
    {"chunked twice", H "Transfer-Encoding: chunked, chunked\r\n\r\n", 0, 400, NULL, 0},
    {"Transfer-Encoding with Content-Length", H "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 0, 400, NULL, 0},
    {"two Content-Lengths", H "Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 0, 400, NULL, 0},
    {"Content-Length +3", H "Content-Length: +3\r\n\r\nabc", 0, 400, NULL, 0},
    {"Content-Length 1 2", H "Content-Length: 1 2\r\n\r\nabc", 0, 400, NULL, 0},
    {"an empty Content-Length", H "Content-Length:\r\n\r\n", 0, 400, NULL, 0},
    {"a body over the limit", H "Content-Length: 1048577\r\n\r\n", 0, 413, NULL, 0},
    {"a NUL byte in a header", "GET / HTTP/1.1\r\nHost: x\r\nX: a\0b\r\n\r\n", 35, 400, NULL, 0},
    {"a bare CR in a header", "GET / HTTP/1.1\r\nHost: x\rY\r\n\r\n", 0, 400, NULL, 0},
    {"an obs-fold line", "GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n", 0, 400, NULL, 0},
    {"CONNECT", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n", 0, 501, NULL, 0},
    {"TRACE", "TRACE / HTTP/1.1\r\nHost: x\r\n\r\n", 0, 501, NULL, 0},
    {"a request line without a version goes on to evhttp", "GARBAGE\r\n\r\n", 0, 0, "GARBAGE\r\n\r\n", 1},
    {"a refusal after a good request", "GET / HTTP/1.1\r\nHost: x\r\n\r\nCONNECT h:1 HTTP/1.1\r\nHost: h\r\n\r\n", 0, 501,
     "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 1},
};

/* Feeds c in pieces of the sizes step() gives; the status, what came out, and the count handed on. */
static int feed(const fcase *c, size_t (*step)(size_t at, unsigned *st), struct evbuffer *out, gw_frame *f) {
    size_t len = c->len ? c->len : strlen(c->in);
    struct evbuffer *src = evbuffer_new();
    unsigned st = 12345;
    int status = 0;
    gw_frame_init(f, 1u << 20);
    for (size_t at = 0; at < len;) {
        size_t n = step(at, &st);
        if (n > len - at) n = len - at;
        evbuffer_add(src, c->in + at, n);
        at += n;
        int r = gw_frame_feed(f, src, out);
        CHECK_INT(evbuffer_get_length(src), 0); /* it takes every byte */
        if (r && !status) status = r;
    }
    evbuffer_free(src);
    return status;
}

static size_t whole(size_t at, unsigned *st) { (void)at; (void)st; return (size_t)-1; }
static size_t bytes(size_t at, unsigned *st) { (void)at; (void)st; return 1; }
static size_t pieces(size_t at, unsigned *st) {
    (void)at;
    *st = *st * 1103515245u + 12345u;
    return 1 + (*st >> 16) % 7;
}

int main(void) {
    size_t (*steps[3])(size_t, unsigned *) = {whole, bytes, pieces};
    const char *names[3] = {"whole", "byte by byte", "in pieces"};
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        const fcase *c = &CASES[i];
        for (int s = 0; s < 3; s++) {
            gw_frame f;
            struct evbuffer *out = evbuffer_new();
            int st = feed(c, steps[s], out, &f);
            size_t n = evbuffer_get_length(out);
            char *got = calloc(1, n + 1);
            evbuffer_copyout(out, got, n);
            int ok = st == c->status && f.handed == c->handed &&
                     (!c->out || (n == strlen(c->out) && !memcmp(got, c->out, n)));
            if (st) ok = ok && f.err_msg[0] && f.err_code && (f.phase == GF_CLOSED || f.phase == GF_DISCARD);
            CHECK(ok);
            if (!ok)
                fprintf(stderr, "  %s, fed %s: status %d (want %d) handed %u (want %u) '%s'\n  out: '%s'\n", c->what,
                        names[s], st, c->status, f.handed, c->handed, f.err_msg, got);
            free(got);
            evbuffer_free(out);
            gw_frame_free(&f);
        }
    }
    /* chunks of 512 KiB each add up past a 1 MiB limit on the third: 413, and nothing was handed on */
    {
        gw_frame f;
        gw_frame_init(&f, 1u << 20);
        struct evbuffer *src = evbuffer_new(), *out = evbuffer_new();
        evbuffer_add_printf(src, H "Transfer-Encoding: chunked\r\n\r\n");
        int st = 0;
        char *blk = calloc(1, 512 << 10);
        for (int k = 0; k < 3 && !st; k++) {
            evbuffer_add_printf(src, "80000\r\n");
            if ((st = gw_frame_feed(&f, src, out))) break;
            evbuffer_add(src, blk, 512 << 10);
            evbuffer_add(src, "\r\n", 2);
            st = gw_frame_feed(&f, src, out);
        }
        CHECK_INT(st, 413);
        CHECK_INT(evbuffer_get_length(out), 0);
        CHECK_INT(f.handed, 0);
        free(blk);
        evbuffer_free(src);
        evbuffer_free(out);
        gw_frame_free(&f);
    }
    /* a refused body is thrown away up to its length, then everything is */
    {
        gw_frame f;
        gw_frame_init(&f, 16);
        struct evbuffer *src = evbuffer_new(), *out = evbuffer_new();
        evbuffer_add_printf(src, H "Content-Length: 20\r\n\r\n0123456789");
        CHECK_INT(gw_frame_feed(&f, src, out), 413);
        CHECK_INT(f.phase, GF_DISCARD);
        evbuffer_add_printf(src, "0123456789GET / HTTP/1.1\r\n\r\n");
        CHECK_INT(gw_frame_feed(&f, src, out), 0);
        CHECK_INT(f.phase, GF_CLOSED);
        CHECK_INT(evbuffer_get_length(out), 0);
        evbuffer_free(src);
        evbuffer_free(out);
        gw_frame_free(&f);
    }
    /* Expect: 100-continue on a chunked request: the caller is asked to send it (evhttp never sees the header in time) */
    {
        gw_frame f;
        gw_frame_init(&f, 1024);
        struct evbuffer *src = evbuffer_new(), *out = evbuffer_new();
        evbuffer_add_printf(src, H "Expect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n");
        CHECK_INT(gw_frame_feed(&f, src, out), 0);
        CHECK_INT(f.want_continue, 1);
        CHECK_INT(f.phase, GF_CHUNKED);
        evbuffer_free(src);
        evbuffer_free(out);
        gw_frame_free(&f);
    }
    /* a header over 64 KiB: 431 */
    {
        gw_frame f;
        gw_frame_init(&f, 1024);
        struct evbuffer *src = evbuffer_new(), *out = evbuffer_new();
        evbuffer_add_printf(src, "GET / HTTP/1.1\r\n");
        for (int k = 0; k < 700; k++) evbuffer_add_printf(src, "X-%d: %0100d\r\n", k, k);
        CHECK_INT(gw_frame_feed(&f, src, out), 431);
        evbuffer_free(src);
        evbuffer_free(out);
        gw_frame_free(&f);
    }
    return tst_done("frame_test");
}
