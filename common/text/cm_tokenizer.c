/* cm_tokenizer.c - encoding and decoding: specials split out by a trie,
 * the pre-tokenizers, byte-level BPE and SentencePiece BPE over one merge
 * heap, streaming detokenization. Making and exporting tokenizers is
 * cm_tok_build.c; what both share is cm_tok_int.h. */
#include "cm_tok_int.h"
#include "cm_error.h"
#include "cm_log.h"
#include "cm_unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- byte-level mapping (GPT-2 bytes_to_unicode) ------------------------ */

uint32_t cm_tok_byte_cp[256];
int16_t cm_tok_cp_byte[512];

void cm_tok_init_byte_map(void) {
    static int done;
    if (done) return;
    int n = 0;
    for (int i = 0; i < 512; i++) cm_tok_cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        cm_tok_byte_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        cm_tok_cp_byte[cm_tok_byte_cp[b]] = (int16_t)b;
    }
    done = 1;
}

/* ---- output vector ---------------------------------------------------- */

typedef struct {
    int32_t *v;
    size_t n, cap;
    size_t limit;        /* more ids than this: stop (over) */
    int oom, over;
} ivec;

static void push(ivec *o, int32_t id) {
    if (o->over) return;
    if (o->n >= o->limit) {
        o->over = 1;
        return;
    }
    if (o->n == o->cap) {
        size_t nc = o->cap ? o->cap * 2 : 64;
        int32_t *nv = realloc(o->v, nc * sizeof *nv);
        if (!nv) { o->oom = 1; return; }
        o->v = nv;
        o->cap = nc;
    }
    o->v[o->n++] = id;
}

/* ---- merge heap (shared by BPE and SPM) -------------------------------- */

typedef struct {
    float key;        /* smaller first: rank for BPE, -score for SPM */
    int32_t pos;      /* left symbol index: ties go leftmost */
    int32_t lid, rid; /* BPE: symbol ids at push; SPM: symbol lengths at push */
} hent;

typedef struct {
    hent *a;
    size_t n, cap;
} heap;

static int hless(const hent *x, const hent *y) {
    return x->key < y->key || (x->key == y->key && x->pos < y->pos);
}

static int hpush(heap *h, hent e) {
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 64;
        hent *na = realloc(h->a, nc * sizeof *na);
        if (!na) return LLM_ENOMEM;
        h->a = na;
        h->cap = nc;
    }
    size_t i = h->n++;
    while (i && hless(&e, &h->a[(i - 1) / 2])) { h->a[i] = h->a[(i - 1) / 2]; i = (i - 1) / 2; }
    h->a[i] = e;
    return 0;
}

static hent hpop(heap *h) {
    hent top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && hless(&h->a[c + 1], &h->a[c])) c++;
        if (!hless(&h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n) h->a[i] = last;
    return top;
}

/* ---- byte-level BPE ------------------------------------------------------ */

typedef struct {
    int32_t *id, *prev, *next;
    int32_t *start, *len; /* SPM: byte span of each symbol */
    size_t cap;
    heap h;
} work;

static int work_reserve(work *w, size_t n) {
    if (n <= w->cap) return 0;
    size_t nc = n * 2;
    int32_t *a = realloc(w->id, nc * 4), *b, *c, *d, *e;
    if (!a) return LLM_ENOMEM;
    w->id = a;
    if (!(b = realloc(w->prev, nc * 4))) return LLM_ENOMEM;
    w->prev = b;
    if (!(c = realloc(w->next, nc * 4))) return LLM_ENOMEM;
    w->next = c;
    if (!(d = realloc(w->start, nc * 4))) return LLM_ENOMEM;
    w->start = d;
    if (!(e = realloc(w->len, nc * 4))) return LLM_ENOMEM;
    w->len = e;
    w->cap = nc;
    return 0;
}

static void bpe_try(const cm_tokenizer *t, work *w, int32_t i) {
    if (i < 0 || w->next[i] < 0) return;
    int64_t h = find_merge(t, w->id[i], w->id[w->next[i]]);
    if (h < 0) return;
    hent e = {(float)t->mrank[h], i, w->id[i], w->id[w->next[i]]};
    hpush(&w->h, e);
}

static int bpe_word(const cm_tokenizer *t, work *w, const unsigned char *s, size_t n, ivec *out) {
    if (work_reserve(w, n)) return LLM_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        w->id[i] = t->byte_tok[s[i]] >= 0 ? t->byte_tok[s[i]] : t->unk;
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    w->h.n = 0;
    for (size_t i = 0; i + 1 < n; i++) bpe_try(t, w, (int32_t)i);
    while (w->h.n) {
        hent e = hpop(&w->h);
        int32_t l = e.pos, r = w->next[l];
        if (w->id[l] != e.lid || r < 0 || w->id[r] != e.rid || w->id[l] < 0) continue; /* stale */
        int64_t h = find_merge(t, w->id[l], w->id[r]);
        w->id[l] = t->mres[h];
        w->next[l] = w->next[r];
        if (w->next[r] >= 0) w->prev[w->next[r]] = l;
        w->id[r] = -2; /* dead */
        bpe_try(t, w, w->prev[l]);
        bpe_try(t, w, l);
    }
    for (int32_t i = 0; i >= 0 && (size_t)i < n; i = w->next[i])
        if (w->id[i] >= 0) push(out, w->id[i]);
    return 0;
}

/* ---- pre-tokenizers: the regexes of GPT-2, Llama 3 and Qwen2, by hand --- */

enum { C_L = 1, C_N = 2, C_S = 4, C_O = 8 };

static int cls(uint32_t cp) {
    if (cm_uni_is_letter(cp)) return C_L;
    if (cm_uni_is_number(cp)) return C_N;
    if (cm_uni_is_space(cp)) return C_S;
    return C_O;
}

static size_t match_contraction(const uint32_t *c, size_t i, size_t n, int icase) {
    if (c[i] != '\'' || i + 1 >= n) return 0;
    uint32_t a = c[i + 1], b = i + 2 < n ? c[i + 2] : 0;
    if (icase) {
        if (a < 128) a |= 0x20;
        if (b < 128 && b) b |= 0x20;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

static size_t run(const int *k, size_t i, size_t n, int mask) {
    size_t j = i;
    while (j < n && (k[j] & mask)) j++;
    return j;
}

/* whitespace: \s+(?!\S)|\s+ */
static size_t match_space(const int *k, size_t i, size_t n) {
    size_t e = run(k, i, n, C_S);
    if (e == n || e - i == 1) return e;
    return e - 1;
}

/* Length in code points of the pre-token starting at i. */
static size_t next_gpt2(const uint32_t *c, const int *k, size_t i, size_t n) {
    size_t m = match_contraction(c, i, n, 0);
    if (m) return m;
    size_t j = i + (c[i] == ' ' && i + 1 < n && !(k[i + 1] & C_S));
    if (k[j] & (C_L | C_N | C_O)) return run(k, j, n, k[j]) - i; /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+' */
    return match_space(k, i, n) - i;
}

static int is_nl(uint32_t cp) {
    return cp == '\r' || cp == '\n';
}

static size_t next_llama3(const uint32_t *c, const int *k, size_t i, size_t n, int max_digits) {
    size_t m = match_contraction(c, i, n, 1);
    if (m) return m;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    size_t j = i + (!(k[i] & (C_L | C_N)) && !is_nl(c[i]) && i + 1 < n && (k[i + 1] & C_L));
    if (k[j] & C_L) return run(k, j, n, C_L) - i;
    if (k[i] & C_N) { /* \p{N}{1,max} */
        size_t e = run(k, i, n, C_N);
        return e - i > (size_t)max_digits ? (size_t)max_digits : e - i;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    j = i + (c[i] == ' ' && i + 1 < n && (k[i + 1] & C_O));
    if (k[j] & C_O) {
        size_t e = run(k, j, n, C_O);
        while (e < n && is_nl(c[e])) e++;
        return e - i;
    }
    /* \s*[\r\n]+ */
    size_t e = run(k, i, n, C_S), last = n;
    for (size_t p = i; p < e; p++)
        if (is_nl(c[p])) last = p;
    if (last != n) return last + 1 - i;
    return match_space(k, i, n) - i;
}

static int encode_bpe_text(const cm_tokenizer *t, work *w, const char *s, size_t len, ivec *out) {
    uint32_t *cp = malloc((len + 1) * sizeof *cp);
    int *k = malloc((len + 1) * sizeof *k);
    size_t *off = malloc((len + 1) * sizeof *off);
    int rc = 0;
    if (!cp || !k || !off) { rc = LLM_ENOMEM; goto done; }
    size_t n = 0;
    for (size_t i = 0; i < len; n++) {
        off[n] = i;
        i += (size_t)cm_utf8_decode(s + i, len - i, &cp[n]);
        k[n] = cls(cp[n]);
    }
    off[n] = len;
    if (t->pre == CM_PRE_SMOLLM) /* digits split individually first, then GPT-2 */
        for (size_t i = 0; i < n; i++)
            if (k[i] == C_N) k[i] = 16;
    size_t seg = n; /* smollm: each digit is a piece and ends the text before it */
    if (t->pre == CM_PRE_SMOLLM) seg = 0;
    for (size_t i = 0; i < n && !rc && !out->over;) {
        size_t m;
        if (k[i] == 16) {
            m = 1;
        } else {
            if (t->pre == CM_PRE_SMOLLM && seg <= i) /* the next digit; each byte is passed once */
                for (seg = i; seg < n && k[seg] != 16;) seg++;
            if (t->pre == CM_PRE_LLAMA3) m = next_llama3(cp, k, i, seg, 3);
            else if (t->pre == CM_PRE_QWEN2) m = next_llama3(cp, k, i, seg, 1);
            else m = next_gpt2(cp, k, i, seg);
        }
        if (m == 0) m = 1;
        if (i + m > n) m = n - i;
        rc = bpe_word(t, w, (const unsigned char *)s + off[i], off[i + m] - off[i], out);
        i += m;
    }
done:
    free(cp);
    free(k);
    free(off);
    return rc;
}

/* ---- SentencePiece BPE --------------------------------------------------- */

static void spm_try(const cm_tokenizer *t, work *w, const char *s, int32_t i) {
    if (i < 0 || w->next[i] < 0) return;
    int32_t r = w->next[i];
    int32_t id = find_text(t, s + w->start[i], (size_t)(w->len[i] + w->len[r]));
    if (id < 0) return;
    hent e = {-t->score[id], i, w->len[i], w->len[r]};
    hpush(&w->h, e);
}

static int encode_spm_text(const cm_tokenizer *t, work *w, const char *text, size_t len, int prefix,
                           ivec *out) {
    /* escape: ' ' -> U+2581, optional leading one */
    char *s = malloc(len * 3 + 4);
    if (!s) return LLM_ENOMEM;
    size_t n = 0;
    if (prefix) { memcpy(s, SPM_SPACE, 3); n = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(s + n, SPM_SPACE, 3); n += 3; }
        else s[n++] = text[i];
    }
    if (work_reserve(w, n + 1)) { free(s); return LLM_ENOMEM; }
    int32_t ns = 0;
    for (size_t i = 0; i < n; ns++) {
        uint32_t cp;
        int l = cm_utf8_decode(s + i, n - i, &cp);
        w->start[ns] = (int32_t)i;
        w->len[ns] = l;
        w->prev[ns] = ns - 1;
        w->next[ns] = ns + 1;
        i += (size_t)l;
    }
    if (ns) w->next[ns - 1] = -1;
    w->h.n = 0;
    for (int32_t i = 0; i + 1 < ns; i++) spm_try(t, w, s, i);
    while (w->h.n) {
        hent e = hpop(&w->h);
        int32_t l = e.pos, r = w->next[l];
        if (w->len[l] != e.lid || r < 0 || w->len[r] != e.rid) continue; /* stale */
        w->len[l] += w->len[r];
        w->len[r] = 0;
        w->next[l] = w->next[r];
        if (w->next[r] >= 0) w->prev[w->next[r]] = l;
        spm_try(t, w, s, w->prev[l]);
        spm_try(t, w, s, l);
    }
    for (int32_t i = 0; ns && i >= 0; i = w->next[i]) {
        int32_t id = find_text(t, s + w->start[i], (size_t)w->len[i]);
        if (id >= 0) { push(out, id); continue; }
        for (int32_t b = 0; b < w->len[i]; b++) { /* byte fallback */
            int32_t bt = t->byte_tok[(unsigned char)s[w->start[i] + b]];
            push(out, bt >= 0 ? bt : t->unk);
        }
    }
    free(s);
    return 0;
}

/* ---- WordPiece (BERT) ---------------------------------------------------- */

static int is_cjk(uint32_t c) { /* what BERT calls a Chinese character: the CJK ideograph blocks */
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static int wpm_space(uint32_t c) { return c == '\t' || c == '\n' || c == '\r' || cm_uni_is_space(c); }

static int wpm_punct(uint32_t c) {
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126) ||
           (c >= 0x80 && cm_uni_is_punct(c));
}

/* One word (code points w[0..n)): the greedy longest match from the left,
 * continuing pieces with the prefix; a word with a piece that matches
 * nothing, or longer than wp_max_chars, is one [UNK]. Candidates longer than
 * the longest token are never looked up, so a word costs O(n x longest). */
static void wpm_word(const cm_tokenizer *t, const uint32_t *w, size_t n, char *buf, size_t *off, ivec *out) {
    if (n > t->wp_max_chars) {
        push(out, t->unk);
        return;
    }
    size_t nb = 0, start_out = out->n;
    for (size_t i = 0; i < n; i++) { /* byte offset of each character, then the bytes */
        off[i] = nb;
        nb += (size_t)cm_utf8_encode(w[i], buf + t->wp_prefix_len + nb);
    }
    off[n] = nb;
    char *bytes = buf + t->wp_prefix_len;
    for (size_t i = 0; i < n;) {
        int32_t id = -1;
        size_t j = n;
        for (; j > i; j--) {
            size_t l = off[j] - off[i];
            if (l + (i ? t->wp_prefix_len : 0) > t->max_token_bytes) continue;
            if (i) {
                char *p = bytes + off[i] - t->wp_prefix_len; /* the prefix goes just before the piece */
                char save[8];
                memcpy(save, p, t->wp_prefix_len);
                memcpy(p, t->wp_prefix, t->wp_prefix_len);
                id = find_text(t, p, l + t->wp_prefix_len);
                memcpy(p, save, t->wp_prefix_len);
            } else {
                id = find_text(t, bytes, l);
            }
            if (id >= 0) break;
        }
        if (id < 0) {
            out->n = out->n < start_out ? out->n : start_out; /* the whole word is unknown */
            push(out, t->unk);
            return;
        }
        push(out, id);
        i = j;
    }
}

static int encode_wpm_text(const cm_tokenizer *t, const char *s, size_t len, ivec *out) {
    /* each code point normalizes to at most 2 spaces + 3 (decomposed) x 2 (lowercased) */
    uint32_t *cp = malloc(sizeof *cp * (len * 8 + 1));
    size_t *off = malloc(sizeof *off * (t->wp_max_chars + 2));
    char *buf = malloc(t->wp_prefix_len + 4 * (size_t)t->wp_max_chars + 8);
    if (!cp || !off || !buf) {
        free(cp); free(off); free(buf);
        return LLM_ENOMEM;
    }
    size_t n = 0;
    unsigned f = t->wp_flags;
    for (size_t i = 0; i < len;) {
        uint32_t c, a[4], b[4];
        i += (size_t)cm_utf8_decode(s + i, len - i, &c);
        if (f & CM_WPM_CLEAN) {
            if (c == 0 || c == 0xFFFD || (c != '\t' && c != '\n' && c != '\r' && cm_uni_is_other(c))) continue;
            if (wpm_space(c)) c = ' ';
        }
        int cjk = (f & CM_WPM_CHINESE) && is_cjk(c);
        if (cjk) cp[n++] = ' ';
        int na = 1;
        a[0] = c;
        if (f & CM_WPM_STRIP) na = cm_uni_strip_accents(c, a);
        for (int k = 0; k < na; k++) {
            int nl = 1;
            b[0] = a[k];
            if (f & CM_WPM_LOWER) nl = cm_uni_lower(a[k], b);
            for (int m = 0; m < nl; m++) cp[n++] = b[m];
        }
        if (cjk) cp[n++] = ' ';
    }
    /* words: split at whitespace (dropped) and around each punctuation mark */
    for (size_t i = 0; i < n && !out->over && !out->oom;) {
        if (wpm_space(cp[i])) { i++; continue; }
        size_t j = i + 1;
        if (!wpm_punct(cp[i]))
            while (j < n && !wpm_space(cp[j]) && !wpm_punct(cp[j])) j++;
        wpm_word(t, cp + i, j - i, buf, off, out);
        i = j;
    }
    free(cp); free(off); free(buf);
    return 0;
}

/* ---- Unigram -------------------------------------------------------------- */

void cm_tok_unigram_ready(cm_tokenizer *t) {
    float mn = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->type[i] == CM_TT_NORMAL && t->score[i] < mn) mn = t->score[i];
    t->uni_unk_score = (double)mn - 10.0; /* what Hugging Face's Unigram gives a character no piece covers */
}

/* One word by Viterbi: the segmentation with the highest sum of piece log
 * probabilities (ties keep the first found, the shorter piece); a character
 * no piece starts with costs the unknown score; neighbouring unknowns are one
 * [UNK] (or their bytes, with byte fallback). O(length x longest piece). */
static int uni_word(const cm_tokenizer *t, const char *s, size_t n, double *best, int32_t *from, int32_t *id, ivec *out) {
    for (size_t i = 0; i <= n; i++) from[i] = -1;
    best[0] = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t ml = (size_t)cm_utf8_decode(s + i, n - i, &cp);
        if (i == 0 || from[i] >= 0) {
            int single = 0;
            for (size_t e = i + 1; e <= n && e - i <= t->max_token_bytes; e++) {
                if (e < n && ((unsigned char)s[e] & 0xc0) == 0x80) continue; /* not a character boundary */
                int32_t k = find_text(t, s + i, e - i);
                if (k < 0) continue;
                double sc = best[i] + t->score[k];
                if (from[e] < 0 || sc > best[e]) best[e] = sc, from[e] = (int32_t)i, id[e] = k;
                if (e - i == ml) single = 1;
            }
            if (!single) {
                double sc = best[i] + t->uni_unk_score;
                if (from[i + ml] < 0 || sc > best[i + ml]) best[i + ml] = sc, from[i + ml] = (int32_t)i, id[i + ml] = t->unk;
            }
        }
        i += ml;
    }
    /* back from the end: the pieces in reverse, written forwards below */
    size_t m = 0, e = n;
    int32_t *ends = (int32_t *)(id + n + 1); /* the caller sized id for two uses */
    while (e > 0) {
        ends[m++] = (int32_t)e;
        e = (size_t)from[e];
    }
    for (size_t k = m; k-- > 0;) {
        size_t b = k + 1 < m ? (size_t)ends[k + 1] : 0, en = (size_t)ends[k];
        if (id[en] != t->unk) {
            push(out, id[en]);
            continue;
        }
        while (k > 0 && id[ends[k - 1]] == t->unk) en = (size_t)ends[--k]; /* fuse the unknowns */
        int32_t whole = find_text(t, s + b, en - b);
        if (whole >= 0 && whole != t->unk) push(out, whole);
        else if (t->uni_byte_fallback)
            for (size_t q = b; q < en; q++) push(out, t->byte_tok[(unsigned char)s[q]] >= 0 ? t->byte_tok[(unsigned char)s[q]] : t->unk);
        else push(out, t->unk);
    }
    return 0;
}

/* Metaspace (spaces become U+2581, one prepended unless there is one) then
 * each word (split before each U+2581) by Viterbi. */
static int encode_uni_text(const cm_tokenizer *t, const char *text, size_t len, int first, ivec *out) {
    size_t cap = len * 3 + 4;
    char *s = malloc(cap);
    double *best = malloc(sizeof *best * (cap + 1));
    int32_t *from = malloc(sizeof *from * (cap + 1)), *id = malloc(sizeof *id * 2 * (cap + 1));
    if (!s || !best || !from || !id) {
        free(s); free(best); free(from); free(id);
        return LLM_ENOMEM;
    }
    size_t n = 0;
    int prepend = t->uni_prepend == 1 || (t->uni_prepend == 2 && first);
    if (prepend && !(len && text[0] == ' ')) { memcpy(s, SPM_SPACE, 3); n = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(s + n, SPM_SPACE, 3); n += 3; }
        else s[n++] = text[i];
    }
    for (size_t i = 0; i < n && !out->over;) {
        size_t j = i + 1;
        if (t->uni_split) {
            if (n - i >= 3 && !memcmp(s + i, SPM_SPACE, 3)) j = i + 3;
            while (j < n && !(n - j >= 3 && !memcmp(s + j, SPM_SPACE, 3))) j++;
        } else {
            j = n;
        }
        uni_word(t, s + i, j - i, best, from, id, out);
        i = j;
    }
    free(s); free(best); free(from); free(id);
    return 0;
}

/* ---- encode ------------------------------------------------------------ */

/* The longest special token at s (user-defined ones always, control ones
 * when parse_special), or -1. */
static int32_t match_special(const cm_tokenizer *t, const char *s, size_t n, int parse_special) {
    int32_t node = 0, best = -1;
    for (size_t k = 0; k < n; k++) {
        node = trie_next(t, node, (unsigned char)s[k]);
        if (node < 0) break;
        int32_t id = t->trie_id[node];
        if (id >= 0 && (parse_special || t->type[id] == CM_TT_USER)) best = id;
    }
    return best;
}

int cm_tok_encode(const cm_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                  int32_t **ids, size_t *n) {
    return cm_tok_encode_limit(t, text, len, add_bos, parse_special, SIZE_MAX, ids, n);
}

int cm_tok_encode_limit(const cm_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                        size_t max_ids, int32_t **ids, size_t *n) {
    ivec out = {.limit = max_ids};
    work w = {0};
    int rc = 0, prev_special = 1;
    *ids = NULL;
    *n = 0;
    if (add_bos < 0) add_bos = t->add_bos;
    /* no token stands for more than max_token_bytes: a text that long is over
     * the limit whatever it says, and is refused before any work */
    size_t least = t->max_token_bytes && t->kind != CM_TOK_WPM && t->kind != CM_TOK_UNI
                       ? len / t->max_token_bytes /* WordPiece, Unigram: a long unknown run is one [UNK] */
                       : 0;
    if (max_ids != SIZE_MAX && least > max_ids) {
        *n = least;
        return LLM_ERANGE;
    }
    if (add_bos && t->bos >= 0) push(&out, t->bos);
    size_t i = 0, frag = 0;
    while (i <= len && !rc && !out.over) {
        int32_t sp = i < len && t->n_specials ? match_special(t, text + i, len - i, parse_special) : -1;
        if (sp < 0 && i < len) { i++; continue; }
        if (i > frag) { /* raw text [frag, i) */
            if (t->kind == CM_TOK_BPE) rc = encode_bpe_text(t, &w, text + frag, i - frag, &out);
            else if (t->kind == CM_TOK_WPM) rc = encode_wpm_text(t, text + frag, i - frag, &out);
            else if (t->kind == CM_TOK_UNI) rc = encode_uni_text(t, text + frag, i - frag, frag == 0, &out);
            else rc = encode_spm_text(t, &w, text + frag, i - frag, t->add_space_prefix && prev_special, &out);
            prev_special = 0;
        }
        if (sp < 0) break;
        push(&out, sp);
        prev_special = 1;
        i += t->text_len[sp];
        frag = i;
    }
    if (!rc && add_bos && (t->kind == CM_TOK_WPM || t->add_eos) && t->eos >= 0) push(&out, t->eos); /* [CLS] text [SEP] */
    free(w.id); free(w.prev); free(w.next); free(w.start); free(w.len); free(w.h.a);
    if (!rc && out.oom) rc = LLM_ENOMEM;
    if (!rc && out.over) {
        rc = LLM_ERANGE;
        *n = out.n + 1;
    }
    if (rc) {
        free(out.v);
        return rc;
    }
    *ids = out.v;
    *n = out.n;
    return 0;
}

/* ---- decode ------------------------------------------------------------ */

int cm_tok_piece(const cm_tokenizer *t, int32_t id, int render_special, const char **bytes, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return LLM_ERANGE;
    if (t->type[id] == CM_TT_CONTROL && !render_special) {
        *bytes = "";
        *len = 0;
        return 0;
    }
    *bytes = t->piece[id];
    *len = t->piece_len[id];
    return 0;
}

char *cm_tok_decode(const cm_tokenizer *t, const int32_t *ids, size_t n, int render_special) {
    size_t cap = 64, o = 0;
    char *s = malloc(cap);
    for (size_t i = 0; s && i < n; i++) {
        const char *p;
        size_t l;
        if (cm_tok_piece(t, ids[i], render_special, &p, &l)) continue;
        if (((t->kind == CM_TOK_SPM && t->add_space_prefix) || t->kind == CM_TOK_WPM || (t->kind == CM_TOK_UNI && t->uni_prepend)) &&
            o == 0 && l && p[0] == ' ') {
            p++;
            l--;
        }
        if (o + l + 1 > cap) {
            while (o + l + 1 > cap) cap *= 2;
            char *ns = realloc(s, cap);
            if (!ns) { free(s); return NULL; }
            s = ns;
        }
        memcpy(s + o, p, l);
        o += l;
    }
    if (s) s[o] = 0;
    return s;
}

void cm_detok_init(cm_detok *d, const cm_tokenizer *t) {
    d->npend = 0;
    d->first = (t->kind == CM_TOK_SPM && t->add_space_prefix) || t->kind == CM_TOK_WPM ||
               (t->kind == CM_TOK_UNI && t->uni_prepend);
}

size_t cm_detok_push(cm_detok *d, const cm_tokenizer *t, int32_t id, char *out, size_t cap) {
    const char *p;
    size_t l, o = 0;
    if (cm_tok_piece(t, id, 0, &p, &l) || l == 0) return 0;
    if (d->first) {
        if (p[0] == ' ') { p++; l--; }
        d->first = 0;
    }
    /* pending bytes first, then the piece; emit the complete prefix */
    for (size_t i = 0; i < l; i++) {
        if (d->npend == sizeof d->pend) { /* never a valid partial: flush as is */
            size_t m = d->npend < cap - o ? d->npend : cap - o;
            memcpy(out + o, d->pend, m);
            o += m;
            d->npend = 0;
        }
        d->pend[d->npend++] = p[i];
    }
    size_t c = cm_utf8_complete_prefix(d->pend, d->npend);
    if (c > cap - o) c = cap - o;
    memcpy(out + o, d->pend, c);
    memmove(d->pend, d->pend + c, d->npend - c);
    d->npend -= c;
    return o + c;
}

size_t cm_detok_flush(cm_detok *d, char *out, size_t cap) {
    size_t c = d->npend < cap ? d->npend : cap;
    memcpy(out, d->pend, c);
    d->npend = 0;
    return c;
}

/* ---- accessors --------------------------------------------------------- */

int32_t cm_tok_vocab(const cm_tokenizer *t) { return t->n_vocab; }
int32_t cm_tok_bos(const cm_tokenizer *t) { return t->bos; }
int32_t cm_tok_eos(const cm_tokenizer *t) { return t->eos; }
int32_t cm_tok_unk(const cm_tokenizer *t) { return t->unk; }
int cm_tok_kind(const cm_tokenizer *t) { return t->kind; }
int cm_tok_pre(const cm_tokenizer *t) { return t->pre; }
const char *cm_tok_chat_template(const cm_tokenizer *t) { return t->chat_template; }

int cm_tok_type(const cm_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? t->type[id] : 0;
}

int cm_tok_is_eog(const cm_tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return 1;
    return 0;
}

int32_t cm_tok_lookup(const cm_tokenizer *t, const char *s) {
    return find_text(t, s, strlen(s));
}
