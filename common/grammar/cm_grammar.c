/* cm_grammar.c - reading GBNF into the element array of cm_grammar_int.h. */
#include "cm_grammar_int.h"
#include "cm_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 256     /* nested groups */
#define MAX_REPEAT 4096   /* m and n of {m,n} */

typedef struct {
    g_el *v;
    int n, cap;
} seq;

typedef struct {
    cm_grammar *g;
    const char *s, *p, *end;
    char *err;
    size_t errlen;
    int failed, depth, anon;
} rd;

static void where(const rd *r, const char *at, int *line, int *col) {
    *line = 1, *col = 1;
    for (const char *q = r->s; q < at && q < r->end; q++) {
        if (*q == '\n') (*line)++, *col = 1;
        else (*col)++;
    }
}

static int fail(rd *r, const char *fmt, ...) {
    if (r->failed) return LLM_EINVAL;
    r->failed = 1;
    int line, col;
    where(r, r->p, &line, &col);
    int k = snprintf(r->err, r->errlen, "grammar %d:%d: ", line, col);
    if (k < 0 || (size_t)k >= r->errlen) return LLM_EINVAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err + k, r->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    return LLM_EINVAL;
}

static int seq_push(rd *r, seq *s, g_el e) {
    if (s->n >= CM_GRAMMAR_MAX_ELEMENTS) return fail(r, "the grammar expands to more than %d elements", CM_GRAMMAR_MAX_ELEMENTS);
    if (g_grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v)) return fail(r, "out of memory");
    s->v[s->n++] = e;
    return 0;
}

static int new_class(rd *r, const uint8_t set[32]) {
    cm_grammar *g = r->g;
    for (int i = g->n_cls - 1; i >= 0 && i >= g->n_cls - 64; i--) /* recent classes repeat (literals' bytes) */
        if (!memcmp(g->cls[i], set, 32)) return i;
    if (g_grow((void **)&g->cls, &g->cap_cls, g->n_cls + 1, sizeof *g->cls)) return fail(r, "out of memory");
    memcpy(g->cls[g->n_cls], set, 32);
    return g->n_cls++;
}

static int byte_el(rd *r, seq *s, unsigned lo, unsigned hi) {
    uint8_t set[32] = {0};
    for (unsigned b = lo; b <= hi; b++) set[b >> 3] |= (uint8_t)(1u << (b & 7));
    int c = new_class(r, set);
    return c < 0 ? c : seq_push(r, s, (g_el){G_CHARS, (uint32_t)c});
}

static int new_rule(rd *r, const char *name, size_t len) {
    cm_grammar *g = r->g;
    if (g->n_rules >= (1 << 24)) return fail(r, "too many rules");
    if (g_grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules)) return fail(r, "out of memory");
    g_rule *ru = &g->rules[g->n_rules];
    memset(ru, 0, sizeof *ru);
    ru->name = name ? strndup(name, len) : NULL;
    if (name && !ru->name) return fail(r, "out of memory");
    where(r, r->p, &ru->line, &ru->col);
    return g->n_rules++;
}

static int rule_by_name(rd *r, const char *name, size_t len) {
    cm_grammar *g = r->g;
    for (int i = 0; i < g->n_rules; i++)
        if (g->rules[i].name && strlen(g->rules[i].name) == len && !memcmp(g->rules[i].name, name, len)) return i;
    return new_rule(r, name, len);
}

/* Appends an alternative's elements and its G_END to the grammar. */
static int add_alt(rd *r, int rule, const g_el *v, int n) {
    cm_grammar *g = r->g;
    if (g->n_el + n + 1 > CM_GRAMMAR_MAX_ELEMENTS) return fail(r, "the grammar expands to more than %d elements", CM_GRAMMAR_MAX_ELEMENTS);
    if (g_grow((void **)&g->el, &g->cap_el, g->n_el + n + 1, sizeof *g->el)) return fail(r, "out of memory");
    g_rule *ru = &g->rules[rule];
    if (g_grow((void **)&ru->alts, &ru->cap_alts, ru->n_alts + 1, sizeof *ru->alts)) return fail(r, "out of memory");
    ru->alts[ru->n_alts++] = g->n_el;
    if (n) memcpy(g->el + g->n_el, v, sizeof *v * (size_t)n);
    g->n_el += n;
    g->el[g->n_el++] = (g_el){G_END, 0};
    return 0;
}

/* ---- lexing ------------------------------------------------------------ */

static void skip_space(rd *r) {
    while (r->p < r->end) {
        if (*r->p == '#') {
            while (r->p < r->end && *r->p != '\n') r->p++;
        } else if (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r') {
            r->p++;
        } else {
            break;
        }
    }
}

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

static size_t name_len(const rd *r, const char *at) {
    const char *q = at;
    while (q < r->end && is_name_char(*q)) q++;
    return (size_t)(q - at);
}

/* After a name: whether `::=` follows (a new rule starts). */
static int defines_here(const rd *r, const char *at) {
    const char *q = at + name_len(r, at);
    while (q < r->end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')) q++;
    return r->end - q >= 3 && !memcmp(q, "::=", 3);
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One code point of a literal or class, escapes decoded; -1 on error. */
static long read_char(rd *r) {
    if (r->p >= r->end) return fail(r, "unexpected end of grammar"), -1;
    unsigned char c = (unsigned char)*r->p;
    if (c == '\\') {
        if (++r->p >= r->end) return fail(r, "unexpected end after '\\'"), -1;
        char e = *r->p++;
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            long v = 0;
            for (int i = 0; i < digits; i++) {
                int h = r->p < r->end ? hexval(*r->p) : -1;
                if (h < 0) return fail(r, "'\\%c' needs %d hex digits", e, digits), -1;
                v = v * 16 + h;
                r->p++;
            }
            if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return fail(r, "escape U+%lX is not a character", v), -1;
            return v;
        }
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '0': return 0;
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': case '.': return e;
        default: return fail(r, "unknown escape '\\%c'", e), -1;
        }
    }
    /* a UTF-8 character as written */
    int l = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!l || r->end - r->p < l) return fail(r, "the grammar is not valid UTF-8"), -1;
    long cp = l == 1 ? c : l == 2 ? c & 0x1f : l == 3 ? c & 0x0f : c & 0x07;
    for (int k = 1; k < l; k++) {
        unsigned char d = (unsigned char)r->p[k];
        if ((d & 0xc0) != 0x80) return fail(r, "the grammar is not valid UTF-8"), -1;
        cp = cp << 6 | (d & 0x3f);
    }
    if ((l == 2 && cp < 0x80) || (l == 3 && cp < 0x800) || (l == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return fail(r, "the grammar is not valid UTF-8"), -1;
    r->p += l;
    return cp;
}

static int utf8_encode(uint32_t cp, uint8_t *b) {
    if (cp < 0x80) return b[0] = (uint8_t)cp, 1;
    if (cp < 0x800) return b[0] = (uint8_t)(0xc0 | cp >> 6), b[1] = (uint8_t)(0x80 | (cp & 0x3f)), 2;
    if (cp < 0x10000) {
        b[0] = (uint8_t)(0xe0 | cp >> 12), b[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f)), b[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    b[0] = (uint8_t)(0xf0 | cp >> 18), b[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f));
    b[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f)), b[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* ---- classes: code point ranges to UTF-8 byte sequences ---------------- */

typedef struct {
    uint32_t lo, hi;
} cp_range;

/* Emits the byte-range sequences that together encode exactly [lo, hi]
 * (lo, hi on one side of every length boundary and surrogate-free), the
 * split RE2 uses: until every byte position is a plain range. */
static int utf8_seqs(rd *r, int rule, uint32_t lo, uint32_t hi) {
    if (lo > hi) return 0;
    static const uint32_t bounds[] = {0x7f, 0x7ff, 0xffff};
    for (int i = 0; i < 3; i++)
        if (lo <= bounds[i] && hi > bounds[i]) {
            int rc = utf8_seqs(r, rule, lo, bounds[i]);
            return rc ? rc : utf8_seqs(r, rule, bounds[i] + 1, hi);
        }
    uint8_t a[4], b[4];
    int n = utf8_encode(lo, a);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                int rc = utf8_seqs(r, rule, lo, lo | m);
                return rc ? rc : utf8_seqs(r, rule, (lo | m) + 1, hi);
            }
            if ((hi & m) != m) {
                int rc = utf8_seqs(r, rule, lo, (hi & ~m) - 1);
                return rc ? rc : utf8_seqs(r, rule, hi & ~m, hi);
            }
        }
    }
    utf8_encode(hi, b);
    seq s = {0};
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = byte_el(r, &s, a[i], b[i]);
    if (!rc) rc = add_alt(r, rule, s.v, s.n);
    free(s.v);
    return rc;
}

/* Appends one element matching any code point in the ranges: a byte class
 * when they are all ASCII, else a rule of UTF-8 sequences. */
static int class_el(rd *r, seq *out, cp_range *rg, int n) {
    int ascii_only = 1;
    uint8_t set[32] = {0};
    for (int i = 0; i < n; i++) {
        for (uint32_t c = rg[i].lo; c <= rg[i].hi && c < 0x80; c++) set[c >> 3] |= (uint8_t)(1u << (c & 7));
        if (rg[i].hi >= 0x80) ascii_only = 0;
    }
    if (ascii_only) {
        int c = new_class(r, set);
        return c < 0 ? c : seq_push(r, out, (g_el){G_CHARS, (uint32_t)c});
    }
    int rule = new_rule(r, NULL, 0);
    if (rule < 0) return rule;
    int any = 0;
    for (int i = 0; i < 16; i++) any |= set[i];
    if (any) {
        int c = new_class(r, set);
        if (c < 0) return c;
        g_el e = {G_CHARS, (uint32_t)c};
        if (add_alt(r, rule, &e, 1)) return LLM_EINVAL;
    }
    for (int i = 0; i < n; i++) {
        uint32_t lo = rg[i].lo < 0x80 ? 0x80 : rg[i].lo, hi = rg[i].hi;
        if (lo > hi) continue;
        int rc = 0; /* surrogates are not characters: around them */
        if (lo < 0xd800 && hi > 0xdfff) rc = utf8_seqs(r, rule, lo, 0xd7ff), rc = rc ? rc : utf8_seqs(r, rule, 0xe000, hi);
        else if (lo >= 0xd800 && lo <= 0xdfff) rc = utf8_seqs(r, rule, 0xe000, hi);
        else if (hi >= 0xd800 && hi <= 0xdfff) rc = utf8_seqs(r, rule, lo, 0xd7ff);
        else rc = utf8_seqs(r, rule, lo, hi);
        if (rc) return rc;
    }
    return seq_push(r, out, (g_el){G_RULE, (uint32_t)rule});
}

static int cmp_range(const void *a, const void *b) {
    const cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* [...] after the '[' */
static int read_class(rd *r, seq *out) {
    int neg = 0, n = 0, cap = 0, rc = 0;
    cp_range *rg = NULL, *tmp = NULL;
    if (r->p < r->end && *r->p == '^') neg = 1, r->p++;
    for (;;) {
        if (r->p >= r->end) { rc = fail(r, "unterminated character class"); goto done; }
        if (*r->p == ']') { r->p++; break; }
        long lo = read_char(r), hi = lo;
        if (lo < 0) { rc = LLM_EINVAL; goto done; }
        if (r->end - r->p >= 2 && r->p[0] == '-' && r->p[1] != ']') {
            r->p++;
            hi = read_char(r);
            if (hi < 0) { rc = LLM_EINVAL; goto done; }
            if (hi < lo) { rc = fail(r, "class range out of order"); goto done; }
        }
        if (g_grow((void **)&rg, &cap, n + 1, sizeof *rg)) { rc = fail(r, "out of memory"); goto done; }
        rg[n++] = (cp_range){(uint32_t)lo, (uint32_t)hi};
    }
    if (n) { /* merge */
        qsort(rg, (size_t)n, sizeof *rg, cmp_range);
        int w = 0;
        for (int i = 1; i < n; i++) {
            if (rg[i].lo <= rg[w].hi + 1) {
                if (rg[i].hi > rg[w].hi) rg[w].hi = rg[i].hi;
            } else {
                rg[++w] = rg[i];
            }
        }
        n = w + 1;
    }
    if (neg) { /* the complement in [0, 0x10FFFF] */
        tmp = malloc(sizeof *tmp * (size_t)(n + 1));
        if (!tmp) { rc = fail(r, "out of memory"); goto done; }
        int m = 0;
        uint32_t from = 0;
        for (int i = 0; i < n; i++) {
            if (rg[i].lo > from) tmp[m++] = (cp_range){from, rg[i].lo - 1};
            from = rg[i].hi + 1;
        }
        if (from <= 0x10ffff) tmp[m++] = (cp_range){from, 0x10ffff};
        free(rg);
        rg = tmp, tmp = NULL, n = m;
    }
    if (!n) { rc = fail(r, "the character class matches nothing"); goto done; }
    rc = class_el(r, out, rg, n);
done:
    free(rg);
    free(tmp);
    return rc;
}

/* ---- the grammar ------------------------------------------------------ */

static int read_alternates(rd *r, int rule);

/* Wraps out->v[from..n) into one element (a rule when several). */
static int as_one(rd *r, seq *out, int from, g_el *one) {
    if (out->n - from == 1) {
        *one = out->v[from];
        out->n = from;
        return 0;
    }
    int rule = new_rule(r, NULL, 0);
    if (rule < 0 || add_alt(r, rule, out->v + from, out->n - from)) return LLM_EINVAL;
    out->n = from;
    *one = (g_el){G_RULE, (uint32_t)rule};
    return 0;
}

/* x repeated min..max times (max -1: unbounded), appended to out. */
static int repeat(rd *r, seq *out, g_el x, int min, int max) {
    for (int i = 0; i < min; i++)
        if (seq_push(r, out, x)) return LLM_EINVAL;
    if (max < 0) { /* S ::= x S | () */
        int s = new_rule(r, NULL, 0);
        if (s < 0) return s;
        g_el alt[2] = {x, {G_RULE, (uint32_t)s}};
        if (add_alt(r, s, alt, 2) || add_alt(r, s, NULL, 0)) return LLM_EINVAL;
        return seq_push(r, out, (g_el){G_RULE, (uint32_t)s});
    }
    int prev = -1; /* O_k ::= x O_{k-1} | () */
    for (int k = 0; k < max - min; k++) {
        int o = new_rule(r, NULL, 0);
        if (o < 0) return o;
        g_el alt[2] = {x, {G_RULE, prev < 0 ? 0u : (uint32_t)prev}};
        if (add_alt(r, o, alt, prev < 0 ? 1 : 2) || add_alt(r, o, NULL, 0)) return LLM_EINVAL;
        prev = o;
    }
    return prev < 0 ? 0 : seq_push(r, out, (g_el){G_RULE, (uint32_t)prev});
}

static int read_count(rd *r, int *v) {
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return fail(r, "expected a number in {}");
    long n = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        n = n * 10 + (*r->p++ - '0');
        if (n > MAX_REPEAT) return fail(r, "a repetition count above %d", MAX_REPEAT);
    }
    *v = (int)n;
    return 0;
}

static int read_postfix(rd *r, seq *out, int atom) {
    skip_space(r);
    if (r->p >= r->end || (*r->p != '*' && *r->p != '+' && *r->p != '?' && *r->p != '{')) return 0;
    char op = *r->p++;
    int min = 0, max = -1;
    if (op == '+') min = 1;
    else if (op == '?') max = 1;
    else if (op == '{') {
        skip_space(r);
        if (read_count(r, &min)) return LLM_EINVAL;
        skip_space(r);
        max = min;
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            skip_space(r);
            max = -1;
            if (r->p < r->end && *r->p != '}' && read_count(r, &max)) return LLM_EINVAL;
            skip_space(r);
        }
        if (r->p >= r->end || *r->p != '}') return fail(r, "expected '}'");
        r->p++;
        if (max >= 0 && max < min) return fail(r, "{%d,%d}: the maximum is below the minimum", min, max);
    }
    g_el x;
    if (as_one(r, out, atom, &x)) return LLM_EINVAL;
    if (repeat(r, out, x, min, max)) return LLM_EINVAL;
    skip_space(r);
    if (r->p < r->end && (*r->p == '*' || *r->p == '+' || *r->p == '?')) return fail(r, "a repetition of a repetition needs ( )");
    return 0;
}

static int read_sequence(rd *r, seq *out) {
    for (;;) {
        skip_space(r);
        if (r->p >= r->end || *r->p == '|' || *r->p == ')') return 0;
        int atom = out->n;
        char c = *r->p;
        if (c == '"') {
            r->p++;
            while (r->p < r->end && *r->p != '"') {
                long cp = read_char(r);
                if (cp < 0) return LLM_EINVAL;
                uint8_t b[4];
                int n = utf8_encode((uint32_t)cp, b);
                for (int i = 0; i < n; i++)
                    if (byte_el(r, out, b[i], b[i])) return LLM_EINVAL;
            }
            if (r->p >= r->end) return fail(r, "unterminated literal");
            r->p++;
            if (out->n == atom) { /* "" matches the empty string: nothing to add, nothing to repeat */
                skip_space(r);
                if (r->p < r->end && strchr("*+?{", *r->p)) return fail(r, "a repetition of \"\"");
                continue;
            }
        } else if (c == '[') {
            r->p++;
            if (read_class(r, out)) return LLM_EINVAL;
        } else if (c == '.') {
            r->p++;
            cp_range any = {0, 0x10ffff};
            if (class_el(r, out, &any, 1)) return LLM_EINVAL;
        } else if (c == '(') {
            r->p++;
            if (++r->depth > MAX_DEPTH) return fail(r, "groups nested deeper than %d", MAX_DEPTH);
            int rule = new_rule(r, NULL, 0);
            if (rule < 0 || read_alternates(r, rule)) return LLM_EINVAL;
            r->depth--;
            skip_space(r);
            if (r->p >= r->end || *r->p != ')') return fail(r, "expected ')'");
            r->p++;
            if (seq_push(r, out, (g_el){G_RULE, (uint32_t)rule})) return LLM_EINVAL;
        } else if (is_name_char(c)) {
            if (defines_here(r, r->p)) return 0; /* the next rule */
            size_t l = name_len(r, r->p);
            int rule = rule_by_name(r, r->p, l);
            if (rule < 0) return rule;
            r->p += l;
            if (seq_push(r, out, (g_el){G_RULE, (uint32_t)rule})) return LLM_EINVAL;
        } else {
            return fail(r, "unexpected '%c'", c);
        }
        if (read_postfix(r, out, atom)) return LLM_EINVAL;
    }
}

static int read_alternates(rd *r, int rule) {
    for (;;) {
        seq s = {0};
        int rc = read_sequence(r, &s);
        if (!rc) rc = add_alt(r, rule, s.v, s.n);
        free(s.v);
        if (rc) return LLM_EINVAL;
        skip_space(r);
        if (r->p < r->end && *r->p == '|') {
            r->p++;
            continue;
        }
        return 0;
    }
}

/* ---- checks ------------------------------------------------------------ */

static void nullable_rules(const cm_grammar *g, uint8_t *nul) {
    memset(nul, 0, (size_t)g->n_rules);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < g->n_rules; i++) {
            if (nul[i]) continue;
            for (int a = 0; a < g->rules[i].n_alts && !nul[i]; a++) {
                int p = g->rules[i].alts[a], ok = 1;
                for (; g->el[p].kind != G_END; p++)
                    if (g->el[p].kind == G_CHARS || !nul[g->el[p].arg]) { ok = 0; break; }
                if (ok) nul[i] = 1, changed = 1;
            }
        }
    }
}

/* A rule that can reach itself without consuming a byte would make the
 * matcher's expansion endless: found by a depth-first walk of "may start
 * with" edges (iterative, the grammar is untrusted). */
static int left_recursion(rd *r, const uint8_t *nul) {
    cm_grammar *g = r->g;
    int n = g->n_rules, rc = 0;
    uint8_t *color = calloc((size_t)n, 1);
    struct fr { int rule, alt, pos; } *st = malloc(sizeof *st * (size_t)(n + 1));
    if (!color || !st) { rc = fail(r, "out of memory"); goto done; }
    for (int s0 = 0; s0 < n; s0++) {
        if (color[s0]) continue;
        int sp = 0;
        st[sp++] = (struct fr){s0, 0, -1};
        color[s0] = 1;
        while (sp) {
            struct fr *f = &st[sp - 1];
            g_rule *ru = &g->rules[f->rule];
            if (f->pos < 0) {
                if (f->alt >= ru->n_alts) { color[f->rule] = 2; sp--; continue; }
                f->pos = ru->alts[f->alt];
            }
            g_el e = g->el[f->pos];
            if (e.kind != G_RULE) { f->alt++, f->pos = -1; continue; }
            f->pos = nul[e.arg] ? f->pos + 1 : -1;
            if (f->pos < 0) f->alt++;
            if (color[e.arg] == 1) {
                rc = fail(r, "left recursion through rule '%s'", g->rules[e.arg].name ? g->rules[e.arg].name : "(group)");
                goto done;
            }
            if (!color[e.arg]) {
                color[e.arg] = 1;
                st[sp++] = (struct fr){(int)e.arg, 0, -1};
            }
        }
    }
done:
    free(color);
    free(st);
    return rc;
}

int cm_grammar_parse(const char *text, size_t len, cm_grammar **out, char *err, size_t errlen) {
    *out = NULL;
    if (errlen) err[0] = 0;
    if (len > CM_GRAMMAR_MAX_TEXT) {
        snprintf(err, errlen, "the grammar is longer than %d bytes", CM_GRAMMAR_MAX_TEXT);
        return LLM_EINVAL;
    }
    cm_grammar *g = calloc(1, sizeof *g);
    if (!g) return LLM_ENOMEM;
    rd r = {g, text, text, text + len, err, errlen, 0, 0, 0};
    g->root = -1;
    int outer = -1;
    uint8_t *nul = NULL;
    for (;;) {
        skip_space(&r);
        if (r.p >= r.end) break;
        size_t l = name_len(&r, r.p);
        if (!l || !defines_here(&r, r.p)) { fail(&r, "expected a rule: name ::= ..."); goto fail; }
        int rule = rule_by_name(&r, r.p, l);
        if (rule < 0) goto fail;
        if (g->rules[rule].defined) { fail(&r, "rule '%s' is defined twice", g->rules[rule].name); goto fail; }
        g->rules[rule].defined = 1;
        r.p += l;
        skip_space(&r);
        r.p += 3; /* ::= */
        if (read_alternates(&r, rule)) goto fail;
        skip_space(&r);
        if (r.p < r.end && *r.p == ')') { fail(&r, "unbalanced ')'"); goto fail; }
    }
    for (int i = 0; i < g->n_rules; i++) {
        if (g->rules[i].name && !g->rules[i].defined) {
            snprintf(err, errlen, "grammar %d:%d: rule '%s' is not defined", g->rules[i].line, g->rules[i].col, g->rules[i].name);
            goto fail;
        }
        if (g->rules[i].name && !strcmp(g->rules[i].name, "root") && g->root < 0) g->root = i;
        if (g->rules[i].name && !strcmp(g->rules[i].name, CM_GRAMMAR_OUTER_ROOT)) outer = i;
    }
    if (outer >= 0) g->root = outer; /* a wrapper around the grammar's own root (cm_grammar_after) */
    if (g->root < 0) {
        snprintf(err, errlen, "the grammar has no 'root' rule");
        goto fail;
    }
    nul = malloc((size_t)g->n_rules);
    if (!nul) goto fail;
    nullable_rules(g, nul);
    if (left_recursion(&r, nul)) goto fail;
    free(nul);
    *out = g;
    return 0;
fail:
    free(nul);
    if (errlen && !err[0]) snprintf(err, errlen, "out of memory");
    cm_grammar_free(g);
    return LLM_EINVAL;
}

int cm_grammar_rules(const cm_grammar *g) { return g->n_rules; }
int cm_grammar_elements(const cm_grammar *g) { return g->n_el; }

/* ---- a grammar that starts after a reasoning block ---------------------------------------------- */

/* Appends printf-style text to *b (len *n, capacity *cap). */
static int app(char **b, size_t *n, size_t *cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int app(char **b, size_t *n, size_t *cap, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(*b ? *b + *n : NULL, *b ? *cap - *n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return LLM_ENOMEM;
        if (*b && *n + (size_t)k < *cap) {
            *n += (size_t)k;
            return 0;
        }
        size_t nc = (*cap + (size_t)k + 256) * 2;
        char *nb = realloc(*b, nc);
        if (!nb) return LLM_ENOMEM;
        *b = nb;
        *cap = nc;
    }
}

int cm_grammar_after(const char *gbnf, size_t len, const char *open, const char *close, char **out) {
    *out = NULL;
    size_t m = strlen(close);
    if (!m || m > 32 || (open && strlen(open) > 32)) return LLM_EINVAL;
    for (size_t i = 0; i < m; i++)
        if ((unsigned char)close[i] < 0x20 || (unsigned char)close[i] > 0x7e) return LLM_EINVAL;
    /* KMP: fail[i] the longest proper border of close[0..i) */
    int fail[33] = {0};
    for (size_t i = 1, k = 0; i < m; i++) {
        while (k && close[i] != close[k]) k = (size_t)fail[k];
        if (close[i] == close[k]) k++;
        fail[i + 1] = (int)k;
    }
    char set[33] = "";
    size_t ns = 0;
    for (size_t i = 0; i < m; i++)
        if (!memchr(set, close[i], ns)) set[ns++] = close[i];
    char *b = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    /* state i: i bytes of close matched; each byte of close's alphabet goes where KMP says, any other to 0 */
    for (size_t i = 0; i < m && !rc; i++) {
        rc = app(&b, &n, &cap, "llmserve-after-%zu ::= [^", i);
        for (size_t c = 0; c < ns && !rc; c++) rc = app(&b, &n, &cap, "\\x%02X", (unsigned char)set[c]);
        if (!rc) rc = app(&b, &n, &cap, "] llmserve-after-0");
        for (size_t c = 0; c < ns && !rc; c++) {
            size_t k = i;
            while (k && close[k] != set[c]) k = (size_t)fail[k];
            if (close[k] == set[c]) k++;
            if (k == m) rc = app(&b, &n, &cap, " | \"\\x%02X\"", (unsigned char)set[c]);
            else rc = app(&b, &n, &cap, " | \"\\x%02X\" llmserve-after-%zu", (unsigned char)set[c], k);
        }
        if (!rc) rc = app(&b, &n, &cap, "\n");
    }
    if (!rc) rc = app(&b, &n, &cap, "%s ::= [ \\t\\n]* ", CM_GRAMMAR_OUTER_ROOT);
    if (!rc && open) { /* the block is optional: the model may answer at once */
        rc = app(&b, &n, &cap, "(\"");
        for (const char *o = open; !rc && *o; o++) rc = app(&b, &n, &cap, "\\x%02X", (unsigned char)*o);
        if (!rc) rc = app(&b, &n, &cap, "\" llmserve-after-0 [ \\t\\n]*)? root\n");
    } else if (!rc) {
        rc = app(&b, &n, &cap, "llmserve-after-0 [ \\t\\n]* root\n");
    }
    if (!rc && len > (size_t)INT32_MAX) rc = LLM_EINVAL;
    if (!rc) rc = app(&b, &n, &cap, "%.*s", (int)len, gbnf);
    if (rc) {
        free(b);
        return rc;
    }
    *out = b;
    return 0;
}
