#define _GNU_SOURCE /* qsort_r */
/* cm_gmatch.c - running a grammar: parse states, the vocabulary trie and
 * token masks. The representation is in cm_grammar_int.h; the costs are in
 * cm_grammar.h. */
#include "cm_grammar_int.h"
#include "cm_error.h"

#include <stdlib.h>
#include <string.h>

#define MASK_CACHE 128       /* masks kept per grammar (each vocab/8 bytes) */
#define COMPACT_AT 65536     /* nodes in a state before the dead ones are dropped */

/* A stack of the pushdown automaton, as shared-tail nodes: pos is the next
 * element to match (a G_CHARS at the top, a return position below), parent
 * the rest of the stack (-1: none). Nodes are hash-consed, so two equal
 * stacks are one id and h identifies a stack's contents. */
typedef struct {
    int32_t pos, parent;
    uint64_t h;
} gnode;

struct cm_gstate {
    cm_grammar *g;
    gnode *nd;
    int n_nd, cap_nd;
    int32_t *ht; /* hash-cons table of node ids; -1 empty; ids >= n_nd are stale (truncated) */
    int ht_cap, ht_used;
    int32_t *set; /* the stacks alive: top node ids */
    int n_set, cap_set, accept;
    /* scratch */
    int32_t *work; /* (pos, parent) pairs to expand */
    int cap_work;
    uint64_t *seen; /* visited (pos, parent) pairs of one expansion, tagged by stamp */
    uint32_t *seen_stamp;
    int seen_cap;
    uint32_t stamp;
    int n_seen;
    int32_t *tmp; /* sets under construction */
    int n_tmp, cap_tmp;
};

struct cm_vtrie {
    int32_t vocab;
    int n_nodes;
    int32_t *child0, *n_child; /* children of node i: child0[i] .. child0[i] + n_child[i] - 1 */
    uint8_t *byte;             /* the byte that leads to node i */
    int32_t *tok0, *n_tok;     /* tokens ending at node i: toks[tok0[i] ..] */
    int32_t *toks;
    uint32_t *off; /* token id's bytes: bytes[off[id] .. off[id + 1]) */
    uint8_t *bytes;
    int32_t *sorted;           /* the tokens by bytes: node i's subtree is sorted[lo[i] .. hi[i]) */
    int32_t *lo, *hi;
    uint64_t *sub;             /* [4 * i]: every byte below node i (its children's and deeper), 256 bits */
};

struct g_mask {
    uint64_t key;
    int n, accept;
    uint64_t *tops; /* sorted stack hashes */
    const cm_vtrie *v;
    uint64_t *bits;
    uint64_t used;
};

static uint64_t mix(uint64_t a, uint64_t b) {
    uint64_t z = a * 0x9e3779b97f4a7c15ull ^ (b + 0xbf58476d1ce4e5b9ull + (a << 6) + (a >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- nodes -------------------------------------------------------------- */

static int ht_rebuild(cm_gstate *s, int cap) {
    int32_t *t = malloc(sizeof *t * (size_t)cap);
    if (!t) return LLM_ENOMEM;
    memset(t, 0xff, sizeof *t * (size_t)cap);
    for (int i = 0; i < s->n_nd; i++) {
        size_t k = (size_t)s->nd[i].h & (size_t)(cap - 1);
        while (t[k] >= 0) k = (k + 1) & (size_t)(cap - 1);
        t[k] = i;
    }
    free(s->ht);
    s->ht = t;
    s->ht_cap = cap;
    s->ht_used = s->n_nd;
    return 0;
}

/* The node (pos, parent), made once; -1 when out of memory. */
static int32_t node(cm_gstate *s, int32_t pos, int32_t parent) {
    uint64_t h = mix((uint64_t)pos + 1, parent < 0 ? 0x5bd1e995u : s->nd[parent].h);
    size_t m = (size_t)(s->ht_cap - 1), k = (size_t)h & m, slot = (size_t)-1;
    for (;; k = (k + 1) & m) {
        int32_t id = s->ht[k];
        if (id < 0) break;
        if (id >= s->n_nd) { /* stale: usable, but an equal node may sit further on */
            if (slot == (size_t)-1) slot = k;
            continue;
        }
        if (s->nd[id].h == h && s->nd[id].pos == pos && s->nd[id].parent == parent) return id;
    }
    if (slot == (size_t)-1) slot = k;
    if (g_grow((void **)&s->nd, &s->cap_nd, s->n_nd + 1, sizeof *s->nd)) return -1;
    int32_t id = s->n_nd++;
    s->nd[id] = (gnode){pos, parent, h};
    if (s->ht[slot] < 0) s->ht_used++;
    s->ht[slot] = id;
    if (s->ht_used * 2 > s->ht_cap && ht_rebuild(s, s->ht_cap * 2)) return -1;
    return id;
}

/* ---- expansion ---------------------------------------------------------- */

static void seen_reset(cm_gstate *s) {
    s->n_seen = 0;
    if (++s->stamp == 0) {
        memset(s->seen_stamp, 0, sizeof *s->seen_stamp * (size_t)s->seen_cap);
        s->stamp = 1;
    }
}

static int seen_insert(cm_gstate *s, uint64_t key) {
    size_t m = (size_t)(s->seen_cap - 1), k = (size_t)mix(key, 7) & m;
    for (;; k = (k + 1) & m) {
        if (s->seen_stamp[k] != s->stamp) {
            s->seen_stamp[k] = s->stamp;
            s->seen[k] = key;
            s->n_seen++;
            return 1;
        }
        if (s->seen[k] == key) return 0;
    }
}

/* 1 when (pos, parent) is new in this expansion (0 too when out of memory:
 * then a stack may be expanded twice, which is harmless). */
static int first_visit(cm_gstate *s, int32_t pos, int32_t parent) {
    uint64_t key = (uint64_t)(uint32_t)pos << 32 | (uint32_t)parent;
    if (2 * (s->n_seen + 1) > s->seen_cap) { /* grow, keeping this expansion's entries */
        int cap = s->seen_cap * 2;
        uint64_t *old = s->seen, *nk = malloc(sizeof *nk * (size_t)cap);
        uint32_t *ost = s->seen_stamp, *ns = calloc((size_t)cap, sizeof *ns);
        if (!nk || !ns) {
            free(nk);
            free(ns);
            return 1;
        }
        int oc = s->seen_cap;
        uint32_t stamp = s->stamp;
        s->seen = nk, s->seen_stamp = ns, s->seen_cap = cap, s->n_seen = 0, s->stamp = 1;
        for (int i = 0; i < oc; i++)
            if (ost[i] == stamp) seen_insert(s, old[i]);
        free(old);
        free(ost);
    }
    return seen_insert(s, key);
}

static int push_work(cm_gstate *s, int *n, int32_t pos, int32_t parent) {
    if (g_grow((void **)&s->work, &s->cap_work, 2 * (*n + 1), sizeof *s->work)) return LLM_ENOMEM;
    s->work[2 * *n] = pos;
    s->work[2 * *n + 1] = parent;
    (*n)++;
    return 0;
}

/* Expands "match from pos, then return to parent" until every stack has a
 * G_CHARS on top; the tops go to s->tmp, *accept is set when the whole
 * input can end here. */
static int expand(cm_gstate *s, int32_t pos0, int32_t parent0, int *accept) {
    const cm_grammar *g = s->g;
    int n = 0;
    if (push_work(s, &n, pos0, parent0)) return LLM_ENOMEM;
    while (n) {
        n--;
        int32_t pos = s->work[2 * n], parent = s->work[2 * n + 1];
        if (!first_visit(s, pos, parent)) continue;
        g_el e = g->el[pos];
        if (e.kind == G_END) {
            if (parent < 0) *accept = 1;
            else if (push_work(s, &n, s->nd[parent].pos, s->nd[parent].parent)) return LLM_ENOMEM;
        } else if (e.kind == G_CHARS) {
            int32_t id = node(s, pos, parent);
            if (id < 0 || g_grow((void **)&s->tmp, &s->cap_tmp, s->n_tmp + 1, sizeof *s->tmp)) return LLM_ENOMEM;
            s->tmp[s->n_tmp++] = id;
        } else {
            const g_rule *ru = &g->rules[e.arg];
            int32_t ret = parent;
            if (g->el[pos + 1].kind != G_END && (ret = node(s, pos + 1, parent)) < 0) return LLM_ENOMEM; /* else a tail call */
            for (int a = ru->n_alts - 1; a >= 0; a--)
                if (push_work(s, &n, ru->alts[a], ret)) return LLM_ENOMEM;
        }
    }
    return 0;
}

/* The stacks s->tmp[from..from+n) after byte b, appended to s->tmp (which
 * may move meanwhile: read by index). */
static int advance(cm_gstate *s, int from, int n, unsigned b, int *accept) {
    seen_reset(s);
    *accept = 0;
    for (int i = 0; i < n; i++) {
        gnode t = s->nd[s->tmp[from + i]];
        if (!g_has(s->g->cls[s->g->el[t.pos].arg], b)) continue;
        int rc = expand(s, t.pos + 1, t.parent, accept);
        if (rc) return rc;
    }
    return 0;
}

/* ---- states ------------------------------------------------------------- */

static int state_init(cm_gstate *s, cm_grammar *g) {
    memset(s, 0, sizeof *s);
    s->g = g;
    s->seen_cap = 1024;
    s->seen = malloc(sizeof *s->seen * (size_t)s->seen_cap);
    s->seen_stamp = calloc((size_t)s->seen_cap, sizeof *s->seen_stamp);
    if (!s->seen || !s->seen_stamp || ht_rebuild(s, 1024)) return LLM_ENOMEM;
    return 0;
}

void cm_gstate_free(cm_gstate *s) {
    if (!s) return;
    free(s->nd);
    free(s->ht);
    free(s->set);
    free(s->work);
    free(s->seen);
    free(s->seen_stamp);
    free(s->tmp);
    free(s);
}

/* s->tmp[from..n_tmp) becomes the state's set. */
static int take_set(cm_gstate *s, int from, int accept) {
    int n = s->n_tmp - from;
    if (g_grow((void **)&s->set, &s->cap_set, n, sizeof *s->set)) return LLM_ENOMEM;
    if (n) memcpy(s->set, s->tmp + from, sizeof *s->set * (size_t)n); /* n may be 0 with both NULL */
    s->n_set = n;
    s->accept = accept;
    s->n_tmp = from;
    return 0;
}

int cm_gstate_new(cm_grammar *g, cm_gstate **out) {
    *out = NULL;
    cm_gstate *s = calloc(1, sizeof *s);
    if (!s) return LLM_ENOMEM;
    int rc = state_init(s, g), accept = 0;
    if (!rc) {
        seen_reset(s);
        const g_rule *root = &g->rules[g->root];
        for (int a = 0; a < root->n_alts && !rc; a++) rc = expand(s, root->alts[a], -1, &accept);
    }
    if (!rc) rc = take_set(s, 0, accept);
    if (rc) {
        cm_gstate_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int cm_gstate_clone(const cm_gstate *s, cm_gstate **out) {
    *out = NULL;
    cm_gstate *c = calloc(1, sizeof *c);
    if (!c) return LLM_ENOMEM;
    int rc = state_init(c, s->g);
    if (!rc) rc = g_grow((void **)&c->nd, &c->cap_nd, s->n_nd, sizeof *c->nd);
    if (!rc) rc = g_grow((void **)&c->set, &c->cap_set, s->n_set, sizeof *c->set);
    if (rc) {
        cm_gstate_free(c);
        return LLM_ENOMEM;
    }
    if (s->n_nd) memcpy(c->nd, s->nd, sizeof *c->nd * (size_t)s->n_nd);
    c->n_nd = s->n_nd;
    if (s->n_set) memcpy(c->set, s->set, sizeof *c->set * (size_t)s->n_set);
    c->n_set = s->n_set;
    c->accept = s->accept;
    int cap = 1024;
    while (cap < 2 * c->n_nd + 2) cap *= 2;
    if (ht_rebuild(c, cap)) {
        cm_gstate_free(c);
        return LLM_ENOMEM;
    }
    *out = c;
    return 0;
}

/* Drops the nodes no live stack reaches (a long output leaves many). */
static int compact(cm_gstate *s) {
    int32_t *map = malloc(sizeof *map * (size_t)s->n_nd);
    if (!map) return LLM_ENOMEM;
    memset(map, 0xff, sizeof *map * (size_t)s->n_nd);
    int live = 0;
    for (int i = 0; i < s->n_set; i++)
        for (int32_t id = s->set[i]; id >= 0 && map[id] == -1; id = s->nd[id].parent) map[id] = -2;
    for (int i = 0; i < s->n_nd; i++) /* parents precede children: renumber in order */
        if (map[i] == -2) {
            gnode n = s->nd[i];
            n.parent = n.parent < 0 ? -1 : map[n.parent];
            s->nd[live] = n;
            map[i] = live++;
        }
    for (int i = 0; i < s->n_set; i++) s->set[i] = map[s->set[i]];
    s->n_nd = live;
    free(map);
    int cap = 1024;
    while (cap < 2 * live + 2) cap *= 2;
    return ht_rebuild(s, cap);
}

/* Runs bytes from the current set; on success the new set is s->tmp[0..)
 * and *accept says whether the input may end. */
static int run(cm_gstate *s, const uint8_t *b, size_t n, int *accept) {
    *accept = s->accept;
    if (g_grow((void **)&s->tmp, &s->cap_tmp, s->n_set, sizeof *s->tmp)) return LLM_ENOMEM;
    if (s->n_set) memcpy(s->tmp, s->set, sizeof *s->tmp * (size_t)s->n_set);
    s->n_tmp = s->n_set;
    for (size_t i = 0; i < n; i++) {
        int cur = s->n_tmp, rc = advance(s, 0, cur, b[i], accept);
        if (rc) return rc;
        int next = s->n_tmp - cur;
        if (!next && (!*accept || i + 1 < n)) return LLM_EINVAL;
        if (next) memmove(s->tmp, s->tmp + cur, sizeof *s->tmp * (size_t)next); /* the new set replaces the old */
        s->n_tmp = next;
    }
    return 0;
}

int cm_gstate_feed(cm_gstate *s, const void *bytes, size_t n) {
    int mark = s->n_nd, accept = 0, rc = run(s, bytes, n, &accept);
    if (rc) {
        s->n_nd = mark; /* the failed attempt's nodes are garbage */
        s->n_tmp = 0;
        return rc;
    }
    if ((rc = take_set(s, 0, accept))) return rc;
    if (s->n_nd > COMPACT_AT) return compact(s);
    return 0;
}

int cm_gstate_allows(cm_gstate *s, const void *bytes, size_t n) {
    int mark = s->n_nd, accept = 0, rc = run(s, bytes, n, &accept);
    s->n_nd = mark;
    s->n_tmp = 0;
    return rc == 0;
}

int cm_gstate_complete(const cm_gstate *s) { return s->accept; }
int cm_gstate_done(const cm_gstate *s) { return s->accept && s->n_set == 0; }
cm_grammar *cm_gstate_grammar(const cm_gstate *s) { return s->g; }

/* ---- the vocabulary trie ------------------------------------------------ */

void cm_vtrie_free(cm_vtrie *v) {
    if (!v) return;
    free(v->child0);
    free(v->n_child);
    free(v->byte);
    free(v->tok0);
    free(v->n_tok);
    free(v->toks);
    free(v->off);
    free(v->bytes);
    free(v->sorted);
    free(v->lo);
    free(v->hi);
    free(v->sub);
    free(v);
}

int32_t cm_vtrie_vocab(const cm_vtrie *v) { return v->vocab; }

const uint8_t *cm_vtrie_bytes(const cm_vtrie *v, int32_t id, size_t *len) {
    if (id < 0 || id >= v->vocab || v->off[id + 1] == v->off[id]) {
        *len = 0;
        return NULL;
    }
    *len = v->off[id + 1] - v->off[id];
    return v->bytes + v->off[id];
}

static int cmp_tok(const void *a, const void *b, void *ctx) { /* by bytes, then id */
    const cm_vtrie *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y], l = lx < ly ? lx : ly;
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], l);
    if (c) return c;
    return lx != ly ? (lx < ly ? -1 : 1) : (x > y) - (x < y);
}

/* Sorted by bytes, the tokens under one trie node are a contiguous run, so
 * the trie is built level by level from runs: node i's children are the
 * distinct next bytes of its run, numbered consecutively (breadth first). */
int cm_vtrie_build(const cm_tokenizer *t, cm_vtrie **out) {
    *out = NULL;
    cm_vtrie *v = calloc(1, sizeof *v);
    if (!v) return LLM_ENOMEM;
    int32_t V = cm_tok_vocab(t);
    v->vocab = V;
    size_t total = 0;
    for (int32_t i = 0; i < V; i++) {
        const char *p;
        size_t l = 0;
        if (cm_tok_type(t, i) != CM_TT_CONTROL && !cm_tok_piece(t, i, 0, &p, &l)) total += l;
    }
    v->off = malloc(sizeof *v->off * ((size_t)V + 1));
    v->bytes = malloc(total + 1);
    int32_t *order = malloc(sizeof *order * ((size_t)V + 1));
    struct run { int32_t node, lo, hi, depth; } *q = malloc(sizeof *q * (total + 2));
    size_t cap_nodes = total + 2;
    v->child0 = malloc(sizeof(int32_t) * cap_nodes);
    v->n_child = calloc(cap_nodes, sizeof(int32_t));
    v->byte = calloc(cap_nodes, 1);
    v->tok0 = malloc(sizeof(int32_t) * cap_nodes);
    v->n_tok = calloc(cap_nodes, sizeof(int32_t));
    v->toks = malloc(sizeof(int32_t) * ((size_t)V + 1));
    v->lo = malloc(sizeof(int32_t) * cap_nodes);
    v->hi = malloc(sizeof(int32_t) * cap_nodes);
    if (!v->off || !v->bytes || !order || !q || !v->child0 || !v->n_child || !v->byte || !v->tok0 || !v->n_tok || !v->toks ||
        !v->lo || !v->hi) {
        free(order);
        free(q);
        cm_vtrie_free(v);
        return LLM_ENOMEM;
    }
    size_t o = 0;
    int n = 0;
    for (int32_t i = 0; i < V; i++) {
        v->off[i] = (uint32_t)o;
        const char *p;
        size_t l = 0;
        if (cm_tok_type(t, i) == CM_TT_CONTROL || cm_tok_piece(t, i, 0, &p, &l) || !l) continue;
        memcpy(v->bytes + o, p, l);
        o += l;
        order[n++] = i;
    }
    v->off[V] = (uint32_t)o;
    qsort_r(order, (size_t)n, sizeof *order, cmp_tok, v);
    /* breadth first: the queue holds runs [lo, hi) of order sharing depth bytes */
    int head = 0, tail = 0, nodes = 1, ntok = 0;
    q[tail++] = (struct run){0, 0, n, 0};
    while (head < tail) {
        struct run r = q[head++];
        int lo = r.lo;
        v->lo[r.node] = r.lo;
        v->hi[r.node] = r.hi;
        v->tok0[r.node] = ntok;
        while (lo < r.hi && v->off[order[lo] + 1] - v->off[order[lo]] == (uint32_t)r.depth) v->toks[ntok++] = order[lo++];
        v->n_tok[r.node] = ntok - v->tok0[r.node];
        v->child0[r.node] = nodes;
        while (lo < r.hi) {
            uint8_t b = v->bytes[v->off[order[lo]] + (uint32_t)r.depth];
            int hi = lo;
            while (hi < r.hi && v->bytes[v->off[order[hi]] + (uint32_t)r.depth] == b) hi++;
            v->byte[nodes] = b;
            q[tail++] = (struct run){nodes++, lo, hi, r.depth + 1};
            v->n_child[r.node]++;
            lo = hi;
        }
    }
    v->n_nodes = nodes;
    free(q);
    v->sorted = order;
    /* the bytes below each node, children before parents (breadth-first ids grow downward) */
    v->sub = calloc((size_t)nodes * 4, sizeof *v->sub);
    if (!v->sub) {
        cm_vtrie_free(v);
        return LLM_ENOMEM;
    }
    for (int i = nodes - 1; i >= 0; i--)
        for (int c = v->child0[i]; c < v->child0[i] + v->n_child[i]; c++) {
            for (int w = 0; w < 4; w++) v->sub[4 * i + w] |= v->sub[4 * c + w];
            v->sub[4 * i + v->byte[c] / 64] |= 1ull << (v->byte[c] % 64);
        }
    *out = v;
    return 0;
}

/* ---- masks -------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Depth first over the trie from the root with the state's set; a token is
 * allowed where the walk reaches its node with a stack alive, or with the
 * input able to end there. */
/* The bytes on which the stacks s->tmp[set0..set0+n) lead back to themselves, the same stacks (a
 * state that loops, such as the inside of a JSON string): 256 bits. */
static int loop_bytes(cm_gstate *s, int set0, int n, uint64_t lb[4]) {
    memset(lb, 0, sizeof(uint64_t) * 4);
    for (unsigned c = 0; c < 256; c++) {
        int any = 0;
        for (int i = 0; i < n && !any; i++) any = g_has(s->g->cls[s->g->el[s->nd[s->tmp[set0 + i]].pos].arg], c);
        if (!any) continue;
        int start = s->n_tmp, mark = s->n_nd, accept = 0, rc = advance(s, set0, n, c, &accept);
        if (rc) return rc;
        if (s->n_tmp - start == n && !memcmp(s->tmp + start, s->tmp + set0, sizeof *s->tmp * (size_t)n))
            lb[c / 64] |= 1ull << (c % 64);
        s->n_tmp = start;
        s->n_nd = mark;
    }
    return 0;
}

static int walk(cm_gstate *s, const cm_vtrie *v, uint64_t *bits) {
    /* loop: 1 when lb holds the loop bytes of the frame's stacks (0: not yet known) */
    struct fr { int32_t node, next, set0, nset, mark, loop; uint64_t lb[4]; } *st = NULL;
    int cap = 0, sp = 0, rc = 0;
    int V = v->vocab;
    memset(bits, 0, sizeof *bits * (size_t)((V + 63) / 64));
    s->n_tmp = 0;
    if (g_grow((void **)&s->tmp, &s->cap_tmp, s->n_set, sizeof *s->tmp)) return LLM_ENOMEM;
    if (s->n_set) memcpy(s->tmp, s->set, sizeof *s->tmp * (size_t)s->n_set);
    s->n_tmp = s->n_set;
    int mark0 = s->n_nd;
    if (g_grow((void **)&st, &cap, 1, sizeof *st)) return LLM_ENOMEM;
    st[sp++] = (struct fr){0, 0, 0, s->n_set, s->n_nd, 0, {0, 0, 0, 0}};
    while (sp) {
        struct fr *f = &st[sp - 1];
        if (f->next >= v->n_child[f->node]) { /* done below this node: its sets and nodes go */
            s->n_tmp = f->set0;
            s->n_nd = f->mark;
            sp--;
            continue;
        }
        int32_t child = v->child0[f->node] + f->next++;
        unsigned b = v->byte[child];
        int any = 0;
        for (int i = 0; i < f->nset && !any; i++)
            any = g_has(s->g->cls[s->g->el[s->nd[s->tmp[f->set0 + i]].pos].arg], b);
        if (!any) continue;
        int start = s->n_tmp, mark = s->n_nd, accept = 0;
        if ((rc = advance(s, f->set0, f->nset, b, &accept))) break;
        int alive = s->n_tmp - start;
        int same = alive == f->nset && !memcmp(s->tmp + start, s->tmp + f->set0, sizeof *s->tmp * (size_t)alive);
        if (same && v->n_child[child]) {
            /* b led back to the same stacks: when every byte below the child does too, every token below is
               allowed, and the subtree is marked without walking it (a string's inside, most of a vocabulary) */
            if (!f->loop) {
                s->n_tmp = start; /* the child's stacks are the frame's own: nothing of them is needed */
                s->n_nd = mark;
                if ((rc = loop_bytes(s, f->set0, f->nset, f->lb))) break;
                f->loop = 1;
                if ((rc = advance(s, f->set0, f->nset, b, &accept))) break;
            }
            const uint64_t *sb = v->sub + 4 * (size_t)child;
            if (!(sb[0] & ~f->lb[0]) && !(sb[1] & ~f->lb[1]) && !(sb[2] & ~f->lb[2]) && !(sb[3] & ~f->lb[3])) {
                for (int k = v->lo[child]; k < v->hi[child]; k++) {
                    int32_t id = v->sorted[k];
                    bits[id >> 6] |= 1ull << (id & 63);
                }
                s->n_tmp = start;
                s->n_nd = mark;
                continue;
            }
        }
        if (alive || accept)
            for (int k = 0; k < v->n_tok[child]; k++) {
                int32_t id = v->toks[v->tok0[child] + k];
                bits[id >> 6] |= 1ull << (id & 63);
            }
        if (alive && v->n_child[child]) {
            if ((rc = g_grow((void **)&st, &cap, sp + 1, sizeof *st))) break;
            f = &st[sp - 1];
            st[sp] = (struct fr){child, 0, start, alive, mark, same && f->loop, {0, 0, 0, 0}};
            if (same && f->loop) memcpy(st[sp].lb, f->lb, sizeof st[sp].lb);
            sp++;
        } else {
            s->n_tmp = start;
            s->n_nd = mark;
        }
    }
    free(st);
    s->n_tmp = 0;
    s->n_nd = mark0;
    return rc;
}

int cm_gstate_mask(cm_gstate *s, const cm_vtrie *v, uint64_t *bits) {
    cm_grammar *g = s->g;
    size_t words = (size_t)(v->vocab + 63) / 64;
    uint64_t *tops = malloc(sizeof *tops * (size_t)(s->n_set + 1));
    if (!tops) return LLM_ENOMEM;
    for (int i = 0; i < s->n_set; i++) tops[i] = s->nd[s->set[i]].h;
    qsort(tops, (size_t)s->n_set, sizeof *tops, cmp_u64);
    uint64_t key = mix((uint64_t)s->accept, (uint64_t)s->n_set);
    for (int i = 0; i < s->n_set; i++) key = mix(key, tops[i]);
    g->clock++;
    for (int i = 0; i < g->n_masks; i++) {
        g_mask *m = g->masks[i];
        if (m->key == key && m->v == v && m->n == s->n_set && m->accept == s->accept &&
            !memcmp(m->tops, tops, sizeof *tops * (size_t)m->n)) {
            memcpy(bits, m->bits, sizeof *bits * words);
            m->used = g->clock;
            g->hits++;
            free(tops);
            return 0;
        }
    }
    int rc = walk(s, v, bits);
    g->walks++;
    if (rc) {
        free(tops);
        return rc;
    }
    g_mask *m = NULL;
    if (g->n_masks < MASK_CACHE) {
        if (!g_grow((void **)&g->masks, &g->cap_masks, g->n_masks + 1, sizeof *g->masks) && (m = calloc(1, sizeof *m))) {
            m->bits = malloc(sizeof *bits * words);
            if (!m->bits) {
                free(m);
                m = NULL;
            } else {
                g->masks[g->n_masks++] = m;
            }
        }
    } else { /* the least recently used goes */
        m = g->masks[0];
        for (int i = 1; i < g->n_masks; i++)
            if (g->masks[i]->used < m->used) m = g->masks[i];
        free(m->tops);
    }
    if (!m) {
        free(tops);
        return 0; /* no room to cache: the mask itself is fine */
    }
    m->key = key, m->v = v, m->n = s->n_set, m->accept = s->accept, m->tops = tops, m->used = g->clock;
    memcpy(m->bits, bits, sizeof *bits * words);
    return 0;
}

void cm_grammar_mask_stats(const cm_grammar *g, uint64_t *walks, uint64_t *hits) {
    *walks = g->walks;
    *hits = g->hits;
}

void cm_grammar_free(cm_grammar *g) {
    if (!g) return;
    for (int i = 0; i < g->n_rules; i++) {
        free(g->rules[i].name);
        free(g->rules[i].alts);
    }
    for (int i = 0; i < g->n_masks; i++) {
        free(g->masks[i]->tops);
        free(g->masks[i]->bits);
        free(g->masks[i]);
    }
    free(g->masks);
    free(g->rules);
    free(g->el);
    free(g->cls);
    free(g);
}
