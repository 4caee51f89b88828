/* cm_jsonschema.c - constraints to GBNF (see cm_jsonschema.h). Each
 * subschema becomes one rule; $refs are memoized by pointer, so recursive
 * schemas become recursive rules. */
#include "cm_jsonschema.h"
#include "cm_error.h"
#include "cm_grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_RULES 20000

/* the rules every JSON grammar shares */
static const char BASE[] =
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n"
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-CefEF] hex{3} | [dD] [0-7] hex{2}))\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "number ::= integer (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n"
    "value ::= object | array | string | number | boolean | null\n"
    "member ::= string ws \":\" ws value ws\n"
    "object ::= \"{\" ws (member (\",\" ws member)*)? \"}\"\n"
    "array ::= \"[\" ws (value ws (\",\" ws value ws)*)? \"]\"\n"
    "d2 ::= [0-9]{2}\n"
    "date ::= [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])\n"
    "time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" ([0-5] [0-9] | \"60\") (\".\" [0-9]{1,9})? "
    "(\"Z\" | \"z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n"
    "hex ::= [0-9a-fA-F]\n"
    "uuid ::= hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}\n"
    "octet ::= \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9]{2} | [1-9] [0-9] | [0-9]\n"
    "ipv4 ::= octet \".\" octet \".\" octet \".\" octet\n";

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) { b->oom = 1; return; }
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *q = realloc(b->s, cap);
        if (!q) { b->oom = 1; return; }
        b->s = q, b->cap = cap;
    }
}

/* text as a GBNF literal */
static void put_lit(buf *b, const char *t, size_t n) {
    put(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c == '"' || c == '\\') put(b, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) put(b, "\\x%02x", c);
        else put(b, "%c", c);
    }
    put(b, "\"");
}

typedef struct {
    const json_t *root;
    buf out;
    int n_rules, depth;
    int guards; /* brackets opened on the way here: "[" or "{" is read before any element */
    struct ref { char *ptr; int rule, open; } *refs; /* open: guards when its body began, -1 once written */
    int n_refs, cap_refs;
    char *err;
    size_t errlen;
    int failed;
    char path[512];
} gen;

static int bad(gen *g, const char *fmt, ...) {
    if (g->failed) return -1;
    g->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(g->err, g->errlen, fmt, ap);
    va_end(ap);
    if (k >= 0 && (size_t)k < g->errlen) snprintf(g->err + k, g->errlen - (size_t)k, " (at %s)", g->path[0] ? g->path : "/");
    return -1;
}

static int new_rule(gen *g) {
    if (g->n_rules >= MAX_RULES) return bad(g, "the schema needs more than %d rules", MAX_RULES);
    return g->n_rules++;
}

static int schema(gen *g, const json_t *s);

/* Generates s under path + "/" + seg; returns its rule. */
static int sub(gen *g, const json_t *s, const char *seg) {
    size_t at = strlen(g->path);
    snprintf(g->path + at, sizeof g->path - at, "/%s", seg);
    int r = schema(g, s);
    g->path[at] = 0;
    return r;
}

static const char *const ANNOTATIONS[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "$anchor",
                                          "contentMediaType", "contentEncoding", "discriminator", NULL};
static const char *const KNOWN[] = {"type", "properties", "required", "additionalProperties", "enum", "const", "items",
                                    "prefixItems", "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref",
                                    "minLength", "maxLength", "format", NULL};

static int in_list(const char *k, const char *const *l) {
    for (; *l; l++)
        if (!strcmp(k, *l)) return 1;
    return 0;
}

static int literal_rule(gen *g, const json_t *const *vals, size_t n) {
    int r = new_rule(g);
    if (r < 0) return r;
    put(&g->out, "s%d ::=", r);
    for (size_t i = 0; i < n; i++) {
        char *t = json_dumps(vals[i], JSON_COMPACT | JSON_ENCODE_ANY);
        if (!t) return bad(g, "out of memory");
        put(&g->out, "%s ", i ? " |" : "");
        put_lit(&g->out, t, strlen(t));
        free(t);
    }
    put(&g->out, "\n");
    return r;
}

static int get_count(gen *g, const json_t *s, const char *k, long long *v) {
    const json_t *x = json_object_get(s, k);
    if (!x) return 0;
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 4096)
        return bad(g, "'%s' must be an integer from 0 to 4096", k);
    *v = json_integer_value(x);
    return 0;
}

static int string_rule(gen *g, const json_t *s) {
    long long lo = 0, hi = -1;
    if (get_count(g, s, "minLength", &lo) || get_count(g, s, "maxLength", &hi)) return -1;
    if (hi >= 0 && hi < lo) return bad(g, "'maxLength' is below 'minLength'");
    const json_t *f = json_object_get(s, "format");
    int r = new_rule(g);
    if (r < 0) return r;
    if (f) {
        static const char *const formats[] = {"date", "time", "date-time", "uuid", "ipv4", NULL};
        if (!json_is_string(f) || !in_list(json_string_value(f), formats))
            return bad(g, "unsupported string format '%s' (supported: date, time, date-time, uuid, ipv4)",
                       json_is_string(f) ? json_string_value(f) : "?");
        if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
            return bad(g, "'format' together with minLength or maxLength is not supported");
        const char *fv = json_string_value(f);
        put(&g->out, "s%d ::= \"\\\"\" %s \"\\\"\"\n", r, !strcmp(fv, "date-time") ? "date \"T\" time" : fv);
        return r;
    }
    if (hi < 0) put(&g->out, "s%d ::= \"\\\"\" char{%lld,} \"\\\"\"\n", r, lo);
    else put(&g->out, "s%d ::= \"\\\"\" char{%lld,%lld} \"\\\"\"\n", r, lo, hi);
    return r;
}

/* Arrays: more(k), "k elements written", offers a comma and element k
 * (prefixItems first, then items) while the maximum allows and an end once
 * the minimum is met; past max(prefixItems, minItems) every more(k) is the
 * same unbounded repetition, so the rules stop there. */
static int array_body(gen *g, const json_t *s) {
    long long lo = 0, hi = -1;
    if (get_count(g, s, "minItems", &lo) || get_count(g, s, "maxItems", &hi)) return -1;
    if (hi >= 0 && hi < lo) return bad(g, "'maxItems' is below 'minItems'");
    const json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    char item[24] = "value";
    int closed = 0;
    if (items && json_is_boolean(items)) {
        closed = json_is_false(items);
    } else if (items) {
        int it = sub(g, items, "items");
        if (it < 0) return -1;
        snprintf(item, sizeof item, "s%d", it);
    }
    int np = 0;
    char pre[64][24];
    if (prefix) {
        if (!json_is_array(prefix) || json_array_size(prefix) > 64)
            return bad(g, "'prefixItems' must be an array of at most 64 schemas");
        for (size_t i = 0; i < json_array_size(prefix); i++) {
            char seg[48];
            snprintf(seg, sizeof seg, "prefixItems/%zu", i);
            int p = sub(g, json_array_get(prefix, i), seg);
            if (p < 0) return -1;
            snprintf(pre[np++], sizeof pre[0], "s%d", p);
        }
    }
    if (closed && (hi < 0 || hi > np)) hi = np;
    if (hi >= 0 && lo > hi) return bad(g, "'minItems' exceeds what prefixItems and items allow");
#define ELEM(k) ((k) < np ? pre[k] : item)
    long long K = hi >= 0 ? hi : (np > lo ? np : lo);
    if (K < 1) K = 1;
    if (K > 4096) return bad(g, "arrays of more than 4096 bounded items are not supported");
    int base = g->n_rules;
    for (long long k = 1; k <= K; k++)
        if (new_rule(g) < 0) return -1;
    for (long long k = 1; k <= K; k++) {
        int alts = 0;
        put(&g->out, "s%lld ::=", base + k - 1);
        if (hi >= 0 ? k < hi : k < K) put(&g->out, " \",\" ws %s ws s%lld", ELEM(k), base + k), alts++;
        else if (hi < 0) put(&g->out, " (\",\" ws %s ws)*", item), alts++; /* covers the end too */
        if (k >= lo && !(hi < 0 && k == K)) put(&g->out, "%s \"\"", alts ? " |" : "");
        put(&g->out, "\n");
    }
    int r = new_rule(g);
    if (r < 0) return r;
    put(&g->out, "s%d ::=", r);
    if (!lo) put(&g->out, " \"[\" ws \"]\"");
    if (hi != 0) put(&g->out, "%s \"[\" ws %s ws s%d \"]\"", lo ? "" : " |", ELEM(0), base);
    put(&g->out, "\n");
#undef ELEM
    return r;
}

static int object_body(gen *g, const json_t *s) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
                 *ap = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return bad(g, "'properties' must be an object");
    if (req && !json_is_array(req)) return bad(g, "'required' must be an array of names");
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        const json_t *n = json_array_get(req, i);
        if (!json_is_string(n)) return bad(g, "'required' must be an array of names");
        if (!props || !json_object_get(props, json_string_value(n)))
            return bad(g, "required property '%s' is not in 'properties'", json_string_value(n));
    }
    char extra[24] = "";
    if (ap && !json_is_boolean(ap)) {
        int a = sub(g, ap, "additionalProperties");
        if (a < 0) return -1;
        snprintf(extra, sizeof extra, "s%d", a);
    } else if ((ap && json_is_true(ap)) || (!ap && !props)) {
        snprintf(extra, sizeof extra, "value");
    }
    size_t n = props ? json_object_size(props) : 0;
    if (n > 1024) return bad(g, "more than 1024 properties");
    int *val = calloc(n + 1, sizeof *val);
    const char **names = calloc(n + 1, sizeof *names);
    int *required = calloc(n + 1, sizeof *required);
    int r = -1;
    if (!val || !names || !required) { bad(g, "out of memory"); goto done; }
    size_t i = 0;
    const char *k;
    json_t *v;
    if (props)
        json_object_foreach((json_t *)props, k, v) { /* jansson keeps insertion order */
            char seg[300];
            snprintf(seg, sizeof seg, "properties/%.280s", k);
            names[i] = k;
            if ((val[i] = sub(g, v, seg)) < 0) goto done;
            for (size_t q = 0; req && q < json_array_size(req); q++)
                if (!strcmp(json_string_value(json_array_get(req, q)), k)) required[i] = 1;
            i++;
        }
    /* after(j): something was written, properties j.. may follow; first(j): nothing yet */
    int after0 = g->n_rules;
    for (size_t j = 0; j <= n; j++)
        if (new_rule(g) < 0) goto done;
    int first0 = g->n_rules;
    for (size_t j = 0; j <= n; j++)
        if (new_rule(g) < 0) goto done;
    for (size_t j = 0; j < n; j++) {
        json_t *ks = json_string(names[j]);
        char *key = ks ? json_dumps(ks, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!key) { bad(g, "out of memory"); goto done; }
        for (int f = 0; f < 2; f++) {
            put(&g->out, "s%d ::= %s", (int)((f ? first0 : after0) + j), f ? "" : "\",\" ws ");
            put_lit(&g->out, key, strlen(key));
            put(&g->out, " ws \":\" ws s%d ws s%d", val[j], (int)(after0 + j + 1));
            if (!required[j]) put(&g->out, " | s%d", (int)((f ? first0 : after0) + j + 1));
            put(&g->out, "\n");
        }
        free(key);
    }
    if (extra[0]) {
        put(&g->out, "s%d ::= (\",\" ws string ws \":\" ws %s ws)*\n", (int)(after0 + n), extra);
        put(&g->out, "s%d ::= (string ws \":\" ws %s ws s%d)?\n", (int)(first0 + n), extra, (int)(after0 + n));
    } else {
        put(&g->out, "s%d ::= \"\"\n", (int)(after0 + n));
        put(&g->out, "s%d ::= \"\"\n", (int)(first0 + n));
    }
    if ((r = new_rule(g)) < 0) goto done;
    put(&g->out, "s%d ::= \"{\" ws s%d \"}\"\n", r, first0);
done:
    free(val);
    free(names);
    free(required);
    return g->failed ? -1 : r;
}

/* An element of an array or an object comes after its bracket, so a $ref
 * back to itself from inside one reads something first; one reached again
 * with no bracket between (through $ref, anyOf, oneOf, allOf) would be a
 * rule that expands to itself before reading anything. */
static int guarded(gen *g, int (*body)(gen *, const json_t *), const json_t *s) {
    g->guards++;
    int r = body(g, s);
    g->guards--;
    return r;
}
static int array_rule(gen *g, const json_t *s) { return guarded(g, array_body, s); }
static int object_rule(gen *g, const json_t *s) { return guarded(g, object_body, s); }

static int ref_rule(gen *g, const char *ref) {
    for (int i = 0; i < g->n_refs; i++) {
        if (strcmp(g->refs[i].ptr, ref)) continue;
        if (g->refs[i].open == g->guards)
            return bad(g, "'$ref' '%s' refers back to itself before any value is read (left recursion)", ref);
        return g->refs[i].rule;
    }
    const char *name = NULL;
    const json_t *defs = NULL;
    if (!strncmp(ref, "#/$defs/", 8)) defs = json_object_get(g->root, "$defs"), name = ref + 8;
    else if (!strncmp(ref, "#/definitions/", 14)) defs = json_object_get(g->root, "definitions"), name = ref + 14;
    else if (!strcmp(ref, "#")) name = "";
    else return bad(g, "'$ref' '%s' is not supported (only #, #/$defs/... and #/definitions/...)", ref);
    if (ref[1] && !name[0]) return bad(g, "'$ref' '%s' names no definition", ref);
    if (strchr(name, '/') || strchr(name, '~')) return bad(g, "'$ref' '%s': nested or escaped pointers are not supported", ref);
    const json_t *target = name[0] ? json_object_get(defs, name) : g->root;
    if (!target) return bad(g, "'$ref' '%s' points at nothing", ref);
    if (g->n_refs >= 4096) return bad(g, "too many $refs");
    int r = new_rule(g);
    if (r < 0) return r;
    if (g->n_refs >= g->cap_refs) {
        int cap = g->cap_refs ? g->cap_refs * 2 : 16;
        struct ref *q = realloc(g->refs, sizeof *q * (size_t)cap);
        if (!q) return bad(g, "out of memory");
        g->refs = q, g->cap_refs = cap;
    }
    g->refs[g->n_refs].ptr = strdup(ref);
    if (!g->refs[g->n_refs].ptr) return bad(g, "out of memory");
    int at = g->n_refs++;
    g->refs[at].rule = r, g->refs[at].open = g->guards; /* before the body: a recursive ref finds it */
    int body = sub(g, target, ref + 1);
    g->refs[at].open = -1;
    if (body < 0) return -1;
    put(&g->out, "s%d ::= s%d\n", r, body);
    return r;
}

static int type_rule(gen *g, const json_t *s, const char *t) {
    if (!strcmp(t, "string")) return string_rule(g, s);
    if (!strcmp(t, "object")) return object_rule(g, s);
    if (!strcmp(t, "array")) return array_rule(g, s);
    static const char *const simple[] = {"number", "integer", "boolean", "null", NULL};
    if (!in_list(t, simple)) return bad(g, "unknown type '%s'", t);
    int r = new_rule(g);
    if (r < 0) return r;
    put(&g->out, "s%d ::= %s\n", r, t);
    return r;
}

static int alternatives(gen *g, const json_t *list, const char *kw) {
    if (!json_is_array(list) || !json_array_size(list)) return bad(g, "'%s' must be a non-empty array of schemas", kw);
    int *alt = malloc(sizeof *alt * json_array_size(list)), r = -1;
    if (!alt) return bad(g, "out of memory");
    for (size_t i = 0; i < json_array_size(list); i++) {
        char seg[40];
        snprintf(seg, sizeof seg, "%s/%zu", kw, i);
        if ((alt[i] = sub(g, json_array_get(list, i), seg)) < 0) goto done;
    }
    if ((r = new_rule(g)) < 0) goto done;
    put(&g->out, "s%d ::=", r);
    for (size_t i = 0; i < json_array_size(list); i++) put(&g->out, "%s s%d", i ? " |" : "", alt[i]);
    put(&g->out, "\n");
done:
    free(alt);
    return r;
}

static int schema(gen *g, const json_t *s) {
    if (g->failed) return -1;
    if (++g->depth > MAX_DEPTH) return bad(g, "the schema nests deeper than %d", MAX_DEPTH);
    int r = -1;
    if (json_is_boolean(s)) {
        if (json_is_false(s)) { bad(g, "the schema 'false' matches nothing"); goto out; }
        if ((r = new_rule(g)) >= 0) put(&g->out, "s%d ::= value\n", r);
        goto out;
    }
    if (!json_is_object(s)) { bad(g, "a schema must be an object or a boolean"); goto out; }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (in_list(k, ANNOTATIONS) || in_list(k, KNOWN)) continue;
        if (!strcmp(k, "uniqueItems") && json_is_false(v)) continue;
        bad(g, "unsupported JSON Schema keyword '%s'", k);
        goto out;
    }
    const json_t *x;
    if ((x = json_object_get(s, "$ref"))) {
        if (!json_is_string(x)) { bad(g, "'$ref' must be a string"); goto out; }
        r = ref_rule(g, json_string_value(x));
    } else if ((x = json_object_get(s, "const"))) {
        r = literal_rule(g, &x, 1);
    } else if ((x = json_object_get(s, "enum"))) {
        if (!json_is_array(x) || !json_array_size(x)) { bad(g, "'enum' must be a non-empty array"); goto out; }
        const json_t **vals = malloc(sizeof *vals * json_array_size(x));
        if (!vals) { bad(g, "out of memory"); goto out; }
        for (size_t i = 0; i < json_array_size(x); i++) vals[i] = json_array_get(x, i);
        r = literal_rule(g, vals, json_array_size(x));
        free(vals);
    } else if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf"))) {
        r = alternatives(g, x, json_object_get(s, "anyOf") ? "anyOf" : "oneOf");
    } else if ((x = json_object_get(s, "allOf"))) {
        if (!json_is_array(x) || json_array_size(x) != 1) { bad(g, "'allOf' of more than one schema is not supported"); goto out; }
        r = sub(g, json_array_get(x, 0), "allOf/0");
    } else if ((x = json_object_get(s, "type"))) {
        if (json_is_string(x)) {
            r = type_rule(g, s, json_string_value(x));
        } else if (json_is_array(x) && json_array_size(x)) {
            int alt[8], n = 0;
            if (json_array_size(x) > 8) { bad(g, "'type' lists more than 8 types"); goto out; }
            for (size_t i = 0; i < json_array_size(x); i++) {
                const json_t *t = json_array_get(x, i);
                if (!json_is_string(t)) { bad(g, "'type' must be a string or an array of strings"); goto out; }
                if ((alt[n++] = type_rule(g, s, json_string_value(t))) < 0) goto out;
            }
            if ((r = new_rule(g)) < 0) goto out;
            put(&g->out, "s%d ::=", r);
            for (int i = 0; i < n; i++) put(&g->out, "%s s%d", i ? " |" : "", alt[i]);
            put(&g->out, "\n");
        } else {
            bad(g, "'type' must be a string or an array of strings");
        }
    } else if (json_object_get(s, "properties") || json_object_get(s, "required") || json_object_get(s, "additionalProperties")) {
        r = object_rule(g, s);
    } else if (json_object_get(s, "items") || json_object_get(s, "prefixItems")) {
        r = array_rule(g, s);
    } else {
        if ((r = new_rule(g)) >= 0) put(&g->out, "s%d ::= value\n", r);
    }
out:
    g->depth--;
    return g->failed ? -1 : r;
}

int cm_schema_rules(const json_t *s, int *next_rule, char **rules, int *root, char *err, size_t errlen) {
    *rules = NULL;
    gen g = {0};
    g.root = s, g.err = err, g.errlen = errlen, g.n_rules = *next_rule;
    int r = schema(&g, s);
    for (int i = 0; i < g.n_refs; i++) free(g.refs[i].ptr);
    free(g.refs);
    if (r < 0 || g.out.oom || g.out.n > CM_GRAMMAR_MAX_TEXT) {
        if (!g.failed) snprintf(err, errlen, g.out.oom ? "out of memory" : "the schema's grammar is too large");
        free(g.out.s);
        return g.out.oom ? LLM_ENOMEM : LLM_EINVAL;
    }
    *rules = g.out.s ? g.out.s : strdup("");
    *root = r;
    *next_rule = g.n_rules;
    return *rules ? 0 : LLM_ENOMEM;
}

const char *cm_json_base_gbnf(void) { return BASE; }

int cm_schema_gbnf(const json_t *s, char **gbnf, char *err, size_t errlen) {
    *gbnf = NULL;
    int next = 0, root;
    char *rules;
    int rc = cm_schema_rules(s, &next, &rules, &root, err, errlen);
    if (rc) return rc;
    buf b = {0};
    put(&b, "%s%sroot ::= s%d\n", BASE, rules, root);
    free(rules);
    if (b.oom || b.n > CM_GRAMMAR_MAX_TEXT) {
        snprintf(err, errlen, b.oom ? "out of memory" : "the schema's grammar is too large");
        free(b.s);
        return b.oom ? LLM_ENOMEM : LLM_EINVAL;
    }
    *gbnf = b.s;
    return 0;
}

int cm_json_object_gbnf(char **gbnf) {
    buf b = {0};
    put(&b, "%sroot ::= object\n", BASE);
    if (b.oom) {
        free(b.s);
        return LLM_ENOMEM;
    }
    *gbnf = b.s;
    return 0;
}

int cm_choice_gbnf(const char *const *choices, int n, char **gbnf, char *err, size_t errlen) {
    *gbnf = NULL;
    if (n <= 0) {
        snprintf(err, errlen, "the choice list is empty");
        return LLM_EINVAL;
    }
    buf b = {0};
    put(&b, "root ::=");
    for (int i = 0; i < n; i++) {
        put(&b, "%s ", i ? " |" : "");
        put_lit(&b, choices[i], strlen(choices[i]));
    }
    put(&b, "\n");
    if (b.oom) {
        free(b.s);
        return LLM_ENOMEM;
    }
    *gbnf = b.s;
    return 0;
}

/* ---- regular expressions ------------------------------------------------ */

typedef struct {
    const char *p, *end;
    buf out;
    char *err;
    size_t errlen;
    int failed, depth;
} rx;

static int rx_bad(rx *r, const char *fmt, ...) {
    if (r->failed) return -1;
    r->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, r->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* one code point c inside a GBNF class */
static void class_char(buf *b, unsigned c) {
    if (c == ']' || c == '\\' || c == '-' || c == '^' || c == '[') put(b, "\\%c", c);
    else if (c < 0x20 || c == 0x7f) put(b, "\\x%02x", c);
    else put(b, "%c", c);
}

static const char *rx_shorthand(char c) {
    switch (c) {
    case 'd': return "0-9";
    case 'w': return "a-zA-Z0-9_";
    case 's': return " \\t\\n\\r\\x0b\\x0c";
    default: return NULL;
    }
}

static int rx_escape_char(rx *r, char e, unsigned *c) {
    switch (e) {
    case 'n': *c = '\n'; return 0;
    case 't': *c = '\t'; return 0;
    case 'r': *c = '\r'; return 0;
    case 'f': *c = '\f'; return 0;
    case 'v': *c = '\v'; return 0;
    default:
        if ((e >= '0' && e <= '9') || e == 'k') return rx_bad(r, "regex: backreferences are not supported");
        if (e == 'b' || e == 'B' || e == 'A' || e == 'z' || e == 'Z') return rx_bad(r, "regex: the assertion '\\%c' is not supported", e);
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) return rx_bad(r, "regex: the escape '\\%c' is not supported", e);
        *c = (unsigned char)e;
        return 0;
    }
}

/* a UTF-8 sequence copied as it is (GBNF reads UTF-8) */
static size_t rx_utf8_len(unsigned char c) { return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4; }

static int rx_class(rx *r) {
    put(&r->out, "[");
    if (r->p < r->end && *r->p == '^') put(&r->out, "^"), r->p++;
    int first = 1, prev = 0; /* prev: a character was just written (a '-' may follow as a range) */
    for (;;) {
        if (r->p >= r->end) return rx_bad(r, "regex: unterminated [");
        char c = *r->p;
        if (c == ']' && !first) { r->p++; break; }
        first = 0;
        int was = prev;
        prev = 1;
        if (c == '[' && r->p + 1 < r->end && r->p[1] == ':') return rx_bad(r, "regex: POSIX classes [:name:] are not supported");
        if (c == '\\') {
            if (++r->p >= r->end) return rx_bad(r, "regex: trailing '\\'");
            char e = *r->p++;
            const char *sh = rx_shorthand(e);
            if (sh) { put(&r->out, "%s", sh); prev = 0; continue; }
            if (e == 'D' || e == 'W' || e == 'S') return rx_bad(r, "regex: '\\%c' inside [] is not supported", e);
            unsigned u;
            if (rx_escape_char(r, e, &u)) return -1;
            class_char(&r->out, u);
        } else if (c == '-' ) {
            int range = was && r->p + 1 < r->end && r->p[1] != ']';
            put(&r->out, range ? "-" : "\\-");
            prev = !range;
            r->p++;
        } else {
            size_t l = rx_utf8_len((unsigned char)c);
            if ((size_t)(r->end - r->p) < l) return rx_bad(r, "regex: not valid UTF-8");
            if (l == 1) class_char(&r->out, (unsigned char)c);
            else put(&r->out, "%.*s", (int)l, r->p);
            r->p += l;
        }
    }
    put(&r->out, "]");
    return 0;
}

static int rx_alt(rx *r);

static int rx_atom(rx *r) {
    char c = *r->p;
    if (c == '(') {
        r->p++;
        if (r->p < r->end && *r->p == '?') {
            if (r->end - r->p >= 2 && r->p[1] == ':') r->p += 2;
            else if (r->end - r->p >= 3 && (r->p[1] == 'P' || r->p[1] == '<') && r->p[1 + (r->p[1] == 'P')] == '<' &&
                     r->p[2 + (r->p[1] == 'P')] != '=' && r->p[2 + (r->p[1] == 'P')] != '!') { /* a named group */
                const char *q = memchr(r->p, '>', (size_t)(r->end - r->p));
                if (!q) return rx_bad(r, "regex: unterminated group name");
                r->p = q + 1;
            } else {
                return rx_bad(r, "regex: lookaround and inline flags ((?...)) are not supported");
            }
        }
        if (++r->depth > 128) return rx_bad(r, "regex: groups nested deeper than 128");
        put(&r->out, "(");
        if (rx_alt(r)) return -1;
        r->depth--;
        if (r->p >= r->end || *r->p != ')') return rx_bad(r, "regex: missing ')'");
        r->p++;
        put(&r->out, ")");
        return 0;
    }
    if (c == '[') {
        r->p++;
        return rx_class(r);
    }
    if (c == '.') {
        r->p++;
        put(&r->out, "[^\\n]");
        return 0;
    }
    if (c == '^' || c == '$') return rx_bad(r, "regex: '%c' is only supported at the ends", c);
    if (c == '*' || c == '+' || c == '?' || c == '{') return rx_bad(r, "regex: '%c' with nothing to repeat", c);
    if (c == '\\') {
        if (++r->p >= r->end) return rx_bad(r, "regex: trailing '\\'");
        char e = *r->p++;
        const char *sh = rx_shorthand(e);
        if (sh) { put(&r->out, "[%s]", sh); return 0; }
        if (e == 'D' || e == 'W' || e == 'S') { put(&r->out, "[^%s]", rx_shorthand((char)(e + 32))); return 0; }
        unsigned u;
        if (rx_escape_char(r, e, &u)) return -1;
        char ch = (char)u;
        put_lit(&r->out, &ch, 1);
        return 0;
    }
    size_t l = rx_utf8_len((unsigned char)c);
    if ((size_t)(r->end - r->p) < l) return rx_bad(r, "regex: not valid UTF-8");
    put_lit(&r->out, r->p, l);
    r->p += l;
    return 0;
}

static int rx_seq(rx *r) {
    int any = 0;
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        if (*r->p == '$' && r->p + 1 == r->end) { r->p++; break; }
        put(&r->out, "%s(", any ? " " : "");
        if (rx_atom(r)) return -1;
        put(&r->out, ")");
        any = 1;
        if (r->p >= r->end) break;
        char q = *r->p;
        if (q == '*' || q == '+' || q == '?') {
            put(&r->out, "%c", q);
            r->p++;
        } else if (q == '{') {
            const char *e = memchr(r->p, '}', (size_t)(r->end - r->p));
            if (!e || e - r->p > 24) return rx_bad(r, "regex: bad {m,n}");
            put(&r->out, "%.*s", (int)(e - r->p + 1), r->p);
            r->p = e + 1;
        } else {
            continue;
        }
        if (r->p < r->end && *r->p == '?') r->p++; /* lazy: the same language */
        else if (r->p < r->end && *r->p == '+') return rx_bad(r, "regex: possessive quantifiers are not supported");
    }
    if (!any) put(&r->out, "\"\"");
    return 0;
}

static int rx_alt(rx *r) {
    for (;;) {
        if (rx_seq(r)) return -1;
        if (r->p < r->end && *r->p == '|') {
            r->p++;
            put(&r->out, " | ");
            continue;
        }
        return 0;
    }
}

int cm_regex_gbnf(const char *re, size_t len, char **gbnf, char *err, size_t errlen) {
    *gbnf = NULL;
    rx r = {re, re + len, {0}, err, errlen, 0, 0};
    if (r.p < r.end && *r.p == '^') r.p++;
    put(&r.out, "root ::= ");
    int rc = rx_alt(&r);
    if (!rc && r.p < r.end) rc = rx_bad(&r, "regex: unbalanced ')'");
    put(&r.out, "\n");
    if (rc || r.out.oom) {
        if (!r.failed) snprintf(err, errlen, "out of memory");
        free(r.out.s);
        return r.out.oom ? LLM_ENOMEM : LLM_EINVAL;
    }
    *gbnf = r.out.s;
    return 0;
}
