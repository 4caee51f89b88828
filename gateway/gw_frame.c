/* gw_frame.c - HTTP/1.1 request framing ahead of evhttp; see gw_frame.h. */
#include "gw_frame.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* A refused body is read and thrown away, so that the client reads the
 * answer rather than a reset: at most this much, then the connection closes. */
#define GF_DISCARD_MAX (64u << 20)
#define GF_MAX_EXT 4096 /* one chunk's extensions */

enum { F_NONE = 0, F_CL, F_TE, F_EXPECT };
enum { CK_SIZE = 0, CK_BWS, CK_EXT, CK_SIZE_LF, CK_DATA, CK_DATA_CR, CK_DATA_LF, CK_TRAILER };
enum { BAD_CHAR = 1, BAD_FOLD };

void gw_frame_init(gw_frame *f, size_t max_body) {
    memset(f, 0, sizeof *f);
    f->max_body = max_body;
}

void gw_frame_free(gw_frame *f) {
    if (f->head) evbuffer_free(f->head);
    if (f->body) evbuffer_free(f->body);
    f->head = f->body = NULL;
}

static void set_phase(gw_frame *f, int p) {
    f->phase = p;
    f->gen++;
}

static int refuse(gw_frame *f, int st, const char *code, uint64_t discard, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->err_msg, sizeof f->err_msg, fmt, ap);
    va_end(ap);
    f->err_status = st;
    f->err_code = code;
    f->want_continue = 0;
    if (f->head) evbuffer_drain(f->head, evbuffer_get_length(f->head));
    if (f->body) evbuffer_drain(f->body, evbuffer_get_length(f->body));
    f->discard_left = discard < GF_DISCARD_MAX ? discard : GF_DISCARD_MAX;
    set_phase(f, f->discard_left ? GF_DISCARD : GF_CLOSED);
    return st;
}

static int bad(gw_frame *f, const char *msg) { return refuse(f, 400, "bad_request", 0, "%s", msg); }

static void header_start(gw_frame *f) {
    f->lines = f->linelen = f->cr = f->bad = 0;
    f->keylen = f->in_value = f->field = 0;
    f->cl_bad = f->n_cl = f->n_te = f->expect100 = 0;
    f->clen = 0;
    f->telen = f->evlen = f->te_long = 0;
    f->mlen = f->msp = 0;
    f->line_at = 0;
    set_phase(f, GF_HEADER);
}

/* One byte of a header field line (not the request line). */
static void field_byte(gw_frame *f, unsigned char c) {
    if (!f->in_value) {
        if (c == ':') {
            f->in_value = 1;
            f->vstate = 0;
            if (f->keylen == 14 && !memcmp(f->key, "content-length", 14)) {
                f->field = F_CL;
                f->n_cl++;
                f->clen = 0;
            } else if (f->keylen == 17 && !memcmp(f->key, "transfer-encoding", 17)) {
                f->field = F_TE;
                if (++f->n_te > 1 && f->telen < (int)sizeof f->te - 1) f->te[f->telen++] = ',';
            } else if (f->keylen == 6 && !memcmp(f->key, "expect", 6)) {
                f->field = F_EXPECT;
                f->evlen = 0;
            }
        } else if (f->keylen < (int)sizeof f->key) {
            f->key[f->keylen++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        } else {
            f->keylen = (int)sizeof f->key + 1; /* longer than any name we look for */
        }
        return;
    }
    int ows = c == ' ' || c == '\t';
    switch (f->field) {
    case F_CL: /* OWS 1*DIGIT OWS */
        if (c >= '0' && c <= '9') {
            if (f->vstate == 2) f->cl_bad = 1;
            f->vstate = 1;
            f->clen = f->clen > (UINT64_MAX - 9) / 10 ? UINT64_MAX : f->clen * 10 + (uint64_t)(c - '0');
        } else if (ows) {
            if (f->vstate == 1) f->vstate = 2;
        } else {
            f->cl_bad = 1;
        }
        break;
    case F_TE:
        if (f->telen < (int)sizeof f->te - 1) f->te[f->telen++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        else f->te_long = 1;
        break;
    case F_EXPECT:
        if (!ows && f->evlen < (int)sizeof f->ev - 1) f->ev[f->evlen++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        break;
    }
}

/* The end of a field line whose bytes are [line_at, end) in head. */
static void field_end(gw_frame *f, size_t end) {
    if (f->field == F_CL && f->vstate == 0) f->cl_bad = 1; /* empty */
    if (f->field == F_TE) {
        if (f->n_te <= 4) {
            f->te_at[f->n_te - 1][0] = f->line_at;
            f->te_at[f->n_te - 1][1] = end;
        }
    }
    if (f->field == F_EXPECT) {
        f->ev[f->evlen] = 0;
        f->expect100 = !strcmp(f->ev, "100-continue");
    }
    f->keylen = f->in_value = f->field = 0;
}

/* The i-th element of the Transfer-Encoding list, trimmed: its length, or
 * -1 past the last. Empty elements are skipped (RFC 9110 §5.6.1). */
static int te_elem(const gw_frame *f, int i, const char **at) {
    int k = 0, p = 0;
    while (p <= f->telen) {
        int q = p;
        while (q < f->telen && f->te[q] != ',') q++;
        int a = p, b = q;
        while (a < b && (f->te[a] == ' ' || f->te[a] == '\t')) a++;
        while (b > a && (f->te[b - 1] == ' ' || f->te[b - 1] == '\t')) b--;
        if (b > a) {
            if (k == i) {
                *at = f->te + a;
                return b - a;
            }
            k++;
        }
        p = q + 1;
    }
    return -1;
}

static int is_chunked(const char *s, int n) { return n == 7 && !memcmp(s, "chunked", 7); }

/* The methods evhttp is set to take (gw_http_create); a request line of
 * another well-formed method is a 501 here. */
static int method_served(const char *m) {
    static const char *const ok[] = {"GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        if (!strcmp(m, ok[i])) return 1;
    return 0;
}

/* The header is whole (in head): refuse it, hold it for its chunked body,
 * or hand it on. */
static int header_done(gw_frame *f, struct evbuffer *dst) {
    if (f->bad == BAD_FOLD) return bad(f, "obsolete line folding in a header (RFC 9112 §5.2)");
    if (f->bad) return bad(f, "malformed header: a NUL byte or a CR not followed by LF");
    if (f->n_cl > 1) return bad(f, "more than one Content-Length header");
    if (f->cl_bad) return bad(f, "Content-Length must be a plain decimal number");
    f->method[f->mlen] = 0;
    if (f->msp && !method_served(f->method))
        return refuse(f, 501, "not_implemented", 0, "unsupported HTTP method %s", f->method);
    if (f->n_te) {
        if (f->n_cl) return bad(f, "Content-Length together with Transfer-Encoding");
        if (f->n_te > 4) return bad(f, "more than four Transfer-Encoding headers");
        const char *s, *last = NULL;
        int n, ln = -1, i;
        for (i = 0; (n = te_elem(f, i, &s)) >= 0; i++) {
            last = s;
            ln = n;
        }
        if (!last || !is_chunked(last, ln))
            return bad(f, "Transfer-Encoding must end with chunked in a request (RFC 9112 §6.3)");
        for (int k = 0; k < i - 1; k++)
            if (n = te_elem(f, k, &s), is_chunked(s, n)) return bad(f, "Transfer-Encoding names chunked more than once");
        if (i > 1) {
            n = te_elem(f, 0, &s);
            return refuse(f, 501, "not_implemented", 0,
                          "Transfer-Encoding %.*s is not supported: send the body chunked or with a Content-Length",
                          n > 40 ? 40 : n, s);
        }
        if (f->te_long) return refuse(f, 501, "not_implemented", 0, "Transfer-Encoding is too long to be supported");
        if (!f->body && !(f->body = evbuffer_new())) return refuse(f, 500, "internal_error", 0, "out of memory");
        f->ck = CK_SIZE;
        f->ck_digits = f->ck_ext = 0;
        f->ck_left = 0;
        f->want_continue = f->expect100;
        set_phase(f, GF_CHUNKED);
        return 0;
    }
    if (f->clen > f->max_body)
        return refuse(f, 413, "request_too_large", f->clen,
                      "the request body (%llu bytes) is larger than --max-body-bytes %zu",
                      (unsigned long long)f->clen, f->max_body);
    evbuffer_add_buffer(dst, f->head);
    f->handed++;
    f->body_left = f->clen;
    set_phase(f, f->clen ? GF_BODY : GF_IDLE);
    return 0;
}

/* Header bytes: held in head until the empty line. */
static int feed_header(gw_frame *f, struct evbuffer *src, struct evbuffer *dst) {
    if (!f->head && !(f->head = evbuffer_new())) return refuse(f, 500, "internal_error", 0, "out of memory");
    if (f->phase == GF_IDLE) header_start(f);
    size_t have = evbuffer_get_length(f->head), skip = 0, keep = 0;
    int done = 0;
    struct evbuffer_ptr at;
    struct evbuffer_iovec v[16];
    evbuffer_ptr_set(src, &at, 0, EVBUFFER_PTR_SET);
    int nv = evbuffer_peek(src, -1, &at, v, 16);
    if (nv > 16) nv = 16; /* the rest on the next round */
    for (int i = 0; i < nv && !done; i++) {
        const unsigned char *p = v[i].iov_base;
        for (size_t k = 0; k < v[i].iov_len; k++) {
            unsigned char c = p[k];
            if (f->lines == 0 && f->linelen == 0 && have + keep == 0 && (c == '\r' || c == '\n')) {
                skip++; /* empty lines before the request line are ignored (RFC 9112 §2.2) */
                continue;
            }
            keep++;
            if (c == '\n') {
                size_t end = have + keep;
                if (f->linelen == 0 && f->lines > 0) {
                    f->hdr_end = f->line_at; /* the empty line: the header is whole */
                    done = 1;
                    break;
                }
                if (f->lines > 0) field_end(f, end);
                f->lines++;
                f->linelen = f->cr = 0;
                f->line_at = end;
                continue;
            }
            if (f->cr) f->bad = BAD_CHAR; /* a CR not before LF */
            f->cr = c == '\r';
            if (c == 0) f->bad = BAD_CHAR;
            if (c == '\r') continue;
            if (f->lines > 0 && f->linelen == 0 && (c == ' ' || c == '\t')) f->bad = BAD_FOLD;
            f->linelen++;
            if (f->lines > 0) field_byte(f, c);
            else if (!f->msp && c == ' ') f->msp = 1;
            else if (!f->msp && f->mlen < (int)sizeof f->method - 1) f->method[f->mlen++] = (char)c;
        }
    }
    evbuffer_drain(src, skip);
    evbuffer_remove_buffer(src, f->head, keep);
    if (evbuffer_get_length(f->head) > GF_MAX_HEADER)
        return refuse(f, 431, "header_too_large", 0, "the request header is larger than %u KiB", GF_MAX_HEADER >> 10);
    return done ? header_done(f, dst) : 0;
}

/* The chunked body is whole: the header without its Transfer-Encoding
 * lines, a Content-Length, the decoded body. */
static void chunked_done(gw_frame *f, struct evbuffer *dst) {
    size_t pos = 0;
    for (int i = 0; i < f->n_te; i++) {
        evbuffer_remove_buffer(f->head, dst, f->te_at[i][0] - pos);
        evbuffer_drain(f->head, f->te_at[i][1] - f->te_at[i][0]);
        pos = f->te_at[i][1];
    }
    evbuffer_remove_buffer(f->head, dst, f->hdr_end - pos);
    evbuffer_drain(f->head, evbuffer_get_length(f->head));
    evbuffer_add_printf(dst, "Content-Length: %zu\r\n\r\n", evbuffer_get_length(f->body));
    evbuffer_add_buffer(dst, f->body);
    f->handed++;
    set_phase(f, GF_IDLE);
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The end of a chunk-size line. */
static int size_line_end(gw_frame *f) {
    uint64_t have = evbuffer_get_length(f->body);
    if (f->ck_left > f->max_body - have)
        return refuse(f, 413, "request_too_large", f->ck_left,
                      "the request body is larger than --max-body-bytes %zu", f->max_body);
    f->ck = f->ck_left ? CK_DATA : CK_TRAILER;
    f->ck_digits = f->ck_ext = 0;
    f->linelen = f->tr_bytes = 0;
    return 0;
}

/* One byte of a chunked body's framing (everything but chunk data). */
static int chunk_byte(gw_frame *f, unsigned char c, struct evbuffer *dst) {
    switch (f->ck) {
    case CK_SIZE: {
        int h = hexval(c);
        if (h >= 0) {
            if (++f->ck_digits > 16)
                return refuse(f, 413, "request_too_large", 0, "a chunk is larger than --max-body-bytes %zu", f->max_body);
            f->ck_left = f->ck_left * 16 + (uint64_t)h;
            return 0;
        }
        if (!f->ck_digits) return bad(f, "malformed chunk size: it must start with a hexadecimal digit");
        if (c == ';') f->ck = CK_EXT;
        else if (c == ' ' || c == '\t') f->ck = CK_BWS;
        else if (c == '\r') f->ck = CK_SIZE_LF;
        else if (c == '\n') return size_line_end(f);
        else return bad(f, "malformed chunk size: a hexadecimal number, then ';' extensions or CRLF");
        return 0;
    }
    case CK_BWS:
        if (c == ' ' || c == '\t') return 0;
        if (c == ';') f->ck = CK_EXT;
        else if (c == '\r') f->ck = CK_SIZE_LF;
        else if (c == '\n') return size_line_end(f);
        else return bad(f, "malformed chunk size: a hexadecimal number, then ';' extensions or CRLF");
        return 0;
    case CK_EXT:
        if (c == '\n') return size_line_end(f);
        if (c == '\r') f->ck = CK_SIZE_LF;
        else if (c == 0) return bad(f, "a NUL byte in a chunk extension");
        else if (++f->ck_ext > GF_MAX_EXT) return bad(f, "a chunk's extensions are longer than 4 KiB");
        return 0;
    case CK_SIZE_LF:
        if (c == '\n') return size_line_end(f);
        return bad(f, "malformed chunk size line: a CR not followed by LF");
    case CK_DATA_CR:
        if (c == '\r') f->ck = CK_DATA_LF;
        else if (c == '\n') f->ck = CK_SIZE;
        else return bad(f, "chunk data longer than its size (no CRLF after it)");
        return 0;
    case CK_DATA_LF:
        if (c == '\n') f->ck = CK_SIZE;
        else return bad(f, "chunk data longer than its size (no CRLF after it)");
        return 0;
    case CK_TRAILER: /* trailer fields, thrown away, then the empty line */
        if (c == '\n') {
            if (f->linelen == 0) {
                chunked_done(f, dst);
                return 0;
            }
            f->linelen = 0;
            return 0;
        }
        if (c == 0) return bad(f, "a NUL byte in a trailer");
        if (c != '\r') f->linelen++;
        if (++f->tr_bytes > (int)GF_MAX_HEADER)
            return refuse(f, 431, "header_too_large", 0, "the trailer is larger than %u KiB", GF_MAX_HEADER >> 10);
        return 0;
    }
    return 0;
}

static int feed_chunked(gw_frame *f, struct evbuffer *src, struct evbuffer *dst) {
    while (f->phase == GF_CHUNKED && evbuffer_get_length(src)) {
        if (f->ck == CK_DATA) {
            size_t n = evbuffer_get_length(src);
            if (n > f->ck_left) n = (size_t)f->ck_left;
            evbuffer_remove_buffer(src, f->body, n);
            if (!(f->ck_left -= n)) f->ck = CK_DATA_CR;
            continue;
        }
        unsigned char b[256];
        ev_ssize_t n = evbuffer_copyout(src, b, sizeof b), i = 0;
        int st = 0;
        while (i < n && !st && f->phase == GF_CHUNKED && f->ck != CK_DATA) st = chunk_byte(f, b[i++], dst);
        evbuffer_drain(src, (size_t)i);
        if (st) return st;
    }
    return 0;
}

int gw_frame_feed(gw_frame *f, struct evbuffer *src, struct evbuffer *dst) {
    int st = 0;
    while (evbuffer_get_length(src)) {
        int r = 0;
        switch (f->phase) {
        case GF_IDLE:
        case GF_HEADER:
            r = feed_header(f, src, dst);
            break;
        case GF_BODY: {
            size_t n = evbuffer_get_length(src);
            if (n > f->body_left) n = (size_t)f->body_left;
            evbuffer_remove_buffer(src, dst, n);
            if (!(f->body_left -= n)) set_phase(f, GF_IDLE);
            break;
        }
        case GF_CHUNKED:
            r = feed_chunked(f, src, dst);
            break;
        case GF_DISCARD: {
            size_t n = evbuffer_get_length(src);
            if (n > f->discard_left) n = (size_t)f->discard_left;
            evbuffer_drain(src, n);
            if (!(f->discard_left -= n)) set_phase(f, GF_CLOSED);
            break;
        }
        default:
            evbuffer_drain(src, evbuffer_get_length(src));
        }
        if (r && !st) st = r;
    }
    return st;
}
