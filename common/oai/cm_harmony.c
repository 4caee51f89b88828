#include "cm_harmony.h"
#include "cm_error.h"

#include <stdlib.h>
#include <string.h>

enum { HM_START = 0, HM_HEADER, HM_BODY };

/* a header longer than this is not one: the reply is plain text */
#define HM_MAX_HEADER 200

static const char *const MARKERS[] = {"<|end|>", "<|return|>", "<|call|>", "<|start|>", "<|channel|>", NULL};

void cm_harmony_init(cm_harmony *h) { cm_reason_init(h, CM_REASON_HARMONY); }

void cm_reason_init(cm_harmony *h, int kind) {
    memset(h, 0, sizeof *h);
    h->kind = kind;
}

int cm_reason_parser(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "deepseek_r1")) return CM_REASON_R1;
    if (!strcmp(name, "qwen3")) return CM_REASON_QWEN3;
    return -1;
}

static void put(cm_hbuf *b, const char *s, size_t n) {
    if (!n || b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2;
        char *ns = realloc(b->s, nc);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = nc;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

/* 2: s[0..n) begins with marker m; 1: s[0..n) is a proper prefix of m; 0: neither */
static int match(const char *s, size_t n, const char *m) {
    size_t ml = strlen(m);
    if (n >= ml) return memcmp(s, m, ml) ? 0 : 2;
    return memcmp(s, m, n) ? 0 : 1;
}

static const char *find(const char *s, size_t n, const char *m) {
    size_t ml = strlen(m);
    for (size_t i = 0; i + ml <= n; i++)
        if (!memcmp(s + i, m, ml)) return s + i;
    return NULL;
}

static int hold(cm_harmony *h, const char *s, size_t n) {
    if (n > sizeof h->hold) return 0;
    memmove(h->hold, s, n);
    h->n_hold = n;
    return 1;
}

enum { HM_DONE = 3 }; /* think tags: after </think>, content to the end */

/* <think> ... </think>: deepseek_r1 starts in the reasoning (a <think> it writes anyway is dropped), qwen3 only
 * when the reply starts with <think>. */
static void think_feed(cm_harmony *h, const char *w, size_t len, int final, cm_hbuf *R, cm_hbuf *C) {
    size_t i = 0;
    while (i < len) {
        const char *p = w + i;
        size_t left = len - i;
        if (h->state == HM_START) {
            int mk = match(p, left, "<think>");
            if (mk == 1 && !final && hold(h, p, left)) return;
            if (mk == 2) i += 7;
            h->reasoning = mk == 2 || h->kind == CM_REASON_R1;
            h->state = h->reasoning ? HM_BODY : HM_DONE;
            continue;
        }
        if (h->state == HM_DONE) {
            put(C, p, left);
            return;
        }
        const char *lt = memchr(p, '<', left);
        size_t tl = lt ? (size_t)(lt - p) : left;
        put(R, p, tl);
        if (!lt) return;
        i += tl;
        left -= tl;
        int mk = match(lt, left, "</think>");
        if (mk == 2) {
            h->state = HM_DONE;
            h->reasoning = 0;
            i += 8;
        } else if (mk == 1 && !final && hold(h, lt, left)) {
            return;
        } else {
            put(R, lt, 1);
            i++;
        }
    }
}

void cm_hbuf_free(cm_hbuf *b) {
    free(b->s);
    memset(b, 0, sizeof *b);
}

int cm_harmony_feed(cm_harmony *h, const char *s, size_t n, int final, cm_hbuf *R, cm_hbuf *C) {
    size_t len = h->n_hold + n;
    char *w = malloc(len + 1);
    if (!w) return LLM_ENOMEM;
    memcpy(w, h->hold, h->n_hold);
    if (n) memcpy(w + h->n_hold, s, n);
    h->n_hold = 0;
    size_t i = 0;
    if (h->kind != CM_REASON_HARMONY) {
        think_feed(h, w, len, final, R, C);
        i = len;
    }
    while (i < len) {
        const char *p = w + i;
        size_t left = len - i;
        if (h->state == HM_START) { /* a channel header first, or plain text throughout */
            int mk = match(p, left, "<|channel|>");
            if (mk == 1 && !final && hold(h, p, left)) break;
            h->state = mk == 2 ? HM_HEADER : HM_BODY;
            h->reasoning = 0;
            continue;
        }
        if (h->state == HM_HEADER) {
            const char *msg = find(p, left, "<|message|>");
            size_t hl = msg ? (size_t)(msg - p) : left;
            if (hl > HM_MAX_HEADER) { /* not a header: text */
                h->state = HM_BODY;
                h->reasoning = 0;
                continue;
            }
            if (!msg) {
                if (!final) hold(h, p, left); /* a header without its message at the end is dropped */
                i = len;
                break;
            }
            const char *ch = find(p, hl, "<|channel|>");
            size_t cl = 0;
            if (ch) {
                ch += 11;
                while (ch + cl < msg && ch[cl] != '<' && ch[cl] != ' ') cl++;
            }
            h->reasoning = ch && cl == 8 && !memcmp(ch, "analysis", 8);
            h->state = HM_BODY;
            i += hl + 11;
            continue;
        }
        /* a message's text, up to the next marker */
        const char *lt = memchr(p, '<', left);
        size_t tl = lt ? (size_t)(lt - p) : left;
        put(h->reasoning ? R : C, p, tl);
        i += tl;
        if (!lt) break;
        left -= tl;
        int partial = 0, whole = -1;
        for (int k = 0; MARKERS[k]; k++) {
            int mk = match(lt, left, MARKERS[k]);
            if (mk == 2) whole = k;
            partial |= mk == 1;
        }
        if (whole >= 0) { /* a message's end (consumed) or the next header (kept for it) */
            h->state = HM_HEADER;
            if (whole < 3) i += strlen(MARKERS[whole]);
            continue;
        }
        if (partial && !final && hold(h, lt, left)) break;
        put(h->reasoning ? R : C, lt, 1);
        i++;
    }
    if (final && h->n_hold) { /* settled now: a held marker's start is text */
        if (h->state != HM_HEADER) put(h->reasoning ? R : C, h->hold, h->n_hold);
        h->n_hold = 0;
    }
    free(w);
    return R->oom || C->oom ? LLM_ENOMEM : 0;
}
