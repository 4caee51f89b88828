/* grammar_test - the grammar reader and matcher (cm_grammar), the schema,
 * choice and regex compilers (cm_jsonschema), and token masks against a
 * brute-force reference on a real vocabulary.
 *
 * Accept/reject tables for each feature; then a fuzz: random schemas, and
 * for each, random walks that pick any byte the grammar allows until it is
 * complete. Every walk must parse as JSON and validate against its schema
 * (a small reference validator below, independent of the compiler), and
 * texts the validator rejects must be rejected by the grammar.
 * argv[1]: a GGUF model for the vocabulary (that part skips without it). */
#include "cm_error.h"
#include "cm_grammar.h"
#include "cm_jsonschema.h"
#include "cm_tokenizer.h"
#include "tst.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* 1: whole text accepted; 0: rejected; -1: the grammar did not read */
static int matches(cm_grammar *g, const char *text) {
    cm_gstate *s;
    if (cm_gstate_new(g, &s)) return -1;
    int ok = cm_gstate_feed(s, text, strlen(text)) == 0 && cm_gstate_complete(s);
    cm_gstate_free(s);
    return ok;
}

static void table(const char *gbnf, const char *const *yes, const char *const *no) {
    cm_grammar *g;
    char err[256];
    int rc = cm_grammar_parse(gbnf, strlen(gbnf), &g, err, sizeof err);
    CHECK_RC(rc, 0);
    if (rc) {
        fprintf(stderr, "  grammar: %s\n  error: %s\n", gbnf, err);
        return;
    }
    for (; yes && *yes; yes++)
        if (matches(g, *yes) != 1) tst_failures++, fprintf(stderr, "  should accept %s\n  in %s\n", *yes, gbnf);
    for (; no && *no; no++)
        if (matches(g, *no) != 0) tst_failures++, fprintf(stderr, "  should reject %s\n  in %s\n", *no, gbnf);
    tst_checks++;
    cm_grammar_free(g);
}

static void refused(const char *gbnf, const char *want) {
    cm_grammar *g = NULL;
    char err[256] = "";
    CHECK_RC(cm_grammar_parse(gbnf, strlen(gbnf), &g, err, sizeof err), LLM_EINVAL);
    CHECK(g == NULL);
    if (!strstr(err, want)) tst_failures++, fprintf(stderr, "  %s: error '%s' lacks '%s'\n", gbnf, err, want);
}

static void test_gbnf(void) {
    table("root ::= \"ab\" | \"c\"", (const char *[]){"ab", "c", NULL}, (const char *[]){"", "a", "abc", "b", NULL});
    table("root ::= [a-c]+ \"!\"?", (const char *[]){"a", "abcba!", NULL}, (const char *[]){"", "!", "ad", "a!!", NULL});
    table("root ::= x{2,3} \n x ::= \"xy\"", (const char *[]){"xyxy", "xyxyxy", NULL},
          (const char *[]){"xy", "xyxyxyxy", "xyx", NULL});
    table("root ::= [0-9]{3,}", (const char *[]){"123", "12345678", NULL}, (const char *[]){"12", "1a3", NULL});
    table("root ::= (\"a\" | \"b\")* \"c\"  # comment\n", (const char *[]){"c", "abbac", NULL},
          (const char *[]){"ab", "ca", NULL});
    /* classes are code points: multibyte characters match whole, and only whole */
    table("root ::= [^a]", (const char *[]){"b", "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98\x80", NULL},
          (const char *[]){"a", "\xc3", "\xed\xa0\x80", "\xc0\x80", "bb", NULL});
    table("root ::= [\\u00e0-\\u00ff\\x41]", (const char *[]){"\xc3\xa0", "\xc3\xbf", "A", NULL},
          (const char *[]){"\xc3\x9f", "B", NULL});
    table("root ::= \"\xc3\xa9t\xc3\xa9\" | \"\\u65e5\"", (const char *[]){"\xc3\xa9t\xc3\xa9", "\xe6\x97\xa5", NULL},
          (const char *[]){"ete", NULL});
    table("root ::= . .", (const char *[]){"ab", "\xe6\x97\xa5x", NULL}, (const char *[]){"a", "abc", NULL});
    table("root ::= \"\\\"\\\\\\n\\t\\x7e\"", (const char *[]){"\"\\\n\t~", NULL}, (const char *[]){"\"\\", NULL});
    table("root ::= list\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [0-9] | list",
          (const char *[]){"[]", "[1,[2,[]],3]", NULL}, (const char *[]){"[", "[1,]", "[[1]", NULL});
    table("root ::= a\na ::= \"x\" b | \"\"\nb ::= a \"y\"", (const char *[]){"", "xy", "xxyy", NULL},
          (const char *[]){"x", "xyy", NULL});
    table("root ::= \"\" | \"a\"", (const char *[]){"", "a", NULL}, NULL);
    refused("root ::= root \"a\" | \"b\"", "left recursion");
    refused("root ::= a\na ::= \"x\"? a", "left recursion");
    refused("root ::= missing", "'missing' is not defined");
    refused("a ::= \"x\"", "no 'root'");
    refused("root ::= \"x", "unterminated literal");
    refused("root ::= [a-", "unterminated");
    refused("root ::= [z-a]", "out of order");
    refused("root ::= \"\\q\"", "unknown escape");
    refused("root ::= (\"a\"", "expected ')'");
    refused("root ::= \"a\"{3,2}", "below the minimum");
    refused("root ::= \"a\"{99999}", "above");
    refused("root ::= \"a\"\nroot ::= \"b\"", "defined twice");
    refused("root ::= \"\\ud800\"", "not a character");
    refused("root ::= \"\xff\"", "UTF-8");
    /* a long repetition does not deepen the stacks (tail calls) */
    cm_grammar *g;
    char err[200];
    CHECK_RC(cm_grammar_parse("root ::= \"a\"*", 13, &g, err, sizeof err), 0);
    cm_gstate *s;
    CHECK_RC(cm_gstate_new(g, &s), 0);
    for (int i = 0; i < 200000; i++)
        if (cm_gstate_feed(s, "a", 1)) { CHECK(0); break; }
    CHECK(cm_gstate_complete(s) && !cm_gstate_done(s));
    CHECK(!cm_gstate_allows(s, "b", 1) && cm_gstate_allows(s, "aa", 2));
    cm_gstate *c;
    CHECK_RC(cm_gstate_clone(s, &c), 0);
    CHECK_RC(cm_gstate_feed(c, "b", 1), LLM_EINVAL); /* refused, and the state is unchanged */
    CHECK_RC(cm_gstate_feed(c, "a", 1), 0);
    cm_gstate_free(c);
    cm_gstate_free(s);
    cm_grammar_free(g);
}

/* ---- a reference JSON Schema validator (the subset the fuzz generates) -- */

static size_t utf8_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xc0) != 0x80;
    return c;
}

static int valid(const json_t *v, const json_t *s, const json_t *root) {
    if (json_is_true(s)) return 1;
    const json_t *x;
    if ((x = json_object_get(s, "$ref"))) {
        const char *r = json_string_value(x);
        return valid(v, strcmp(r, "#") ? json_object_get(json_object_get(root, "$defs"), r + 8) : root, root);
    }
    if ((x = json_object_get(s, "const"))) return json_equal(v, x);
    if ((x = json_object_get(s, "enum"))) {
        for (size_t i = 0; i < json_array_size(x); i++)
            if (json_equal(v, json_array_get(x, i))) return 1;
        return 0;
    }
    if ((x = json_object_get(s, "anyOf"))) {
        for (size_t i = 0; i < json_array_size(x); i++)
            if (valid(v, json_array_get(x, i), root)) return 1;
        return 0;
    }
    x = json_object_get(s, "type");
    const char *t = x ? json_string_value(x) : NULL;
    if (!t) return 1;
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "integer")) return json_is_integer(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "string")) {
        if (!json_is_string(v)) return 0;
        size_t n = utf8_chars(json_string_value(v), json_string_length(v));
        const json_t *lo = json_object_get(s, "minLength"), *hi = json_object_get(s, "maxLength"),
                     *f = json_object_get(s, "format");
        if (lo && n < (size_t)json_integer_value(lo)) return 0;
        if (hi && n > (size_t)json_integer_value(hi)) return 0;
        if (f && !strcmp(json_string_value(f), "uuid")) {
            const char *u = json_string_value(v);
            if (strlen(u) != 36) return 0;
            for (int i = 0; i < 36; i++)
                if ((i == 8 || i == 13 || i == 18 || i == 23) ? u[i] != '-' : !strchr("0123456789abcdefABCDEF", u[i])) return 0;
        }
        if (f && !strcmp(json_string_value(f), "date")) {
            int y, m, d;
            char tail;
            if (sscanf(json_string_value(v), "%4d-%2d-%2d%c", &y, &m, &d, &tail) != 3 || m < 1 || m > 12 || d < 1 || d > 31)
                return 0;
        }
        return 1;
    }
    if (!strcmp(t, "array")) {
        if (!json_is_array(v)) return 0;
        const json_t *lo = json_object_get(s, "minItems"), *hi = json_object_get(s, "maxItems"),
                     *it = json_object_get(s, "items");
        if (lo && json_array_size(v) < (size_t)json_integer_value(lo)) return 0;
        if (hi && json_array_size(v) > (size_t)json_integer_value(hi)) return 0;
        for (size_t i = 0; it && i < json_array_size(v); i++)
            if (!valid(json_array_get(v, i), it, root)) return 0;
        return 1;
    }
    if (!strcmp(t, "object")) {
        if (!json_is_object(v)) return 0;
        const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_object_get(v, json_string_value(json_array_get(req, i)))) return 0;
        const char *k;
        json_t *pv;
        json_object_foreach((json_t *)v, k, pv) {
            const json_t *ps = json_object_get(props, k);
            if (!ps && props) return 0; /* additionalProperties false (or absent: our default) */
            if (ps && !valid(pv, ps, root)) return 0;
        }
        return 1;
    }
    return 0;
}

/* ---- random schemas ------------------------------------------------------ */

static json_t *rand_schema(int depth);

static json_t *rand_scalar(void) {
    switch (rnd() % 10) {
    case 0: return json_pack("{s:s}", "type", "integer");
    case 1: return json_pack("{s:s}", "type", "number");
    case 2: return json_pack("{s:s}", "type", "boolean");
    case 3: return json_pack("{s:s}", "type", "null");
    case 4: return json_pack("{s:s, s:i, s:i}", "type", "string", "minLength", (int)(rnd() % 3), "maxLength", 3 + (int)(rnd() % 5));
    case 5: return json_pack("{s:s, s:s}", "type", "string", "format", rnd() % 2 ? "uuid" : "date");
    case 6: return json_pack("{s:[s, i, n, b, s]}", "enum", "red", 42, 1, "caf\xc3\xa9 \"q\"");
    case 7: return json_pack("{s:{s:[i,i]}}", "const", "xy", 1, 2);
    default: return json_pack("{s:s, s:s}", "type", "string", "description", "free text");
    }
}

static json_t *rand_schema(int depth) {
    unsigned k = depth >= 3 ? 0 : (unsigned)(rnd() % 5);
    if (k <= 1) return rand_scalar();
    if (k == 2) { /* object */
        json_t *props = json_object(), *req = json_array();
        int n = 1 + (int)(rnd() % 4);
        for (int i = 0; i < n; i++) {
            char name[16];
            snprintf(name, sizeof name, i == 2 ? "k\"%d\xc3\xa9" : "key%d", i);
            json_object_set_new(props, name, rand_schema(depth + 1));
            if (rnd() % 2) json_array_append_new(req, json_string(name));
        }
        json_t *o = json_pack("{s:s, s:o, s:o}", "type", "object", "properties", props, "required", req);
        if (rnd() % 2) json_object_set_new(o, "additionalProperties", json_false());
        return o;
    }
    if (k == 3) { /* array */
        json_t *a = json_pack("{s:s, s:o}", "type", "array", "items", rand_schema(depth + 1));
        int lo = (int)(rnd() % 3);
        if (rnd() % 2) json_object_set_new(a, "minItems", json_integer(lo));
        if (rnd() % 2) json_object_set_new(a, "maxItems", json_integer(lo + (int)(rnd() % 3)));
        return a;
    }
    return json_pack("{s:[o,o]}", "anyOf", rand_schema(depth + 1), rand_schema(depth + 1));
}

/* A random sentence of the grammar, byte by byte; NULL when it ran long. */
static char *walk_bytes(cm_grammar *g) {
    cm_gstate *s;
    if (cm_gstate_new(g, &s)) return NULL;
    size_t cap = 8192, n = 0;
    char *out = malloc(cap);
    while (out && n + 1 < cap) {
        if (cm_gstate_done(s) || (cm_gstate_complete(s) && rnd() % 4 == 0)) break;
        unsigned char ok[256];
        int m = 0, closing = -1;
        for (int b = 0; b < 256; b++) {
            unsigned char c = (unsigned char)b;
            if (cm_gstate_allows(s, &c, 1)) {
                ok[m++] = c;
                if ((c == '"' || c == '}' || c == ']') && (closing < 0 || rnd() % 2)) closing = c;
            }
        }
        if (!m) break; /* complete, nothing may follow */
        unsigned char c = n > 200 && closing >= 0 && rnd() % 4 ? (unsigned char)closing : ok[rnd() % (unsigned)m];
        if (cm_gstate_feed(s, &c, 1)) break;
        out[n++] = (char)c;
    }
    int complete = cm_gstate_complete(s);
    cm_gstate_free(s);
    if (!out || !complete) {
        free(out);
        return NULL;
    }
    out[n] = 0;
    return out;
}

static cm_grammar *compile(const json_t *schema, char *err, size_t errlen) {
    char *gbnf;
    if (cm_schema_gbnf(schema, &gbnf, err, errlen)) return NULL;
    cm_grammar *g = NULL;
    if (cm_grammar_parse(gbnf, strlen(gbnf), &g, err, errlen)) fprintf(stderr, "%s\n", gbnf);
    free(gbnf);
    return g;
}

static void schema_table(const char *schema, const char *const *yes, const char *const *no) {
    json_t *s = json_loads(schema, JSON_DECODE_ANY, NULL);
    CHECK(s != NULL);
    char err[300];
    cm_grammar *g = s ? compile(s, err, sizeof err) : NULL;
    CHECK(g != NULL);
    if (!g) {
        fprintf(stderr, "  schema %s: %s\n", schema, err);
        json_decref(s);
        return;
    }
    for (; yes && *yes; yes++)
        if (matches(g, *yes) != 1) tst_failures++, fprintf(stderr, "  should accept %s\n  for %s\n", *yes, schema);
    for (; no && *no; no++)
        if (matches(g, *no) != 0) tst_failures++, fprintf(stderr, "  should reject %s\n  for %s\n", *no, schema);
    tst_checks++;
    cm_grammar_free(g);
    json_decref(s);
}

static void schema_refused(const char *schema, const char *want) {
    json_t *s = json_loads(schema, JSON_DECODE_ANY, NULL);
    char *gbnf = NULL, err[300] = "";
    CHECK_RC(cm_schema_gbnf(s, &gbnf, err, sizeof err), LLM_EINVAL);
    CHECK(gbnf == NULL);
    if (!strstr(err, want)) tst_failures++, fprintf(stderr, "  %s: error '%s' lacks '%s'\n", schema, err, want);
    free(gbnf);
    json_decref(s);
}

static void test_schemas(void) {
    schema_table("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},"
                 "\"required\":[\"name\"]}",
                 (const char *[]){"{\"name\":\"x\"}", "{\"name\": \"x\", \"age\": 3}", "{ \"name\":\"\\u00e9\\n\",\"age\":-12}",
                                  "{\n  \"name\": \"a\",\n  \"age\": 0\n}", NULL},
                 (const char *[]){"{}", "{\"age\":3}", "{\"age\":3,\"name\":\"x\"}", "{\"name\":\"x\",\"other\":1}",
                                  "{\"name\":\"x\",\"age\":3.5}", "{\"name\":\"x\",\"age\":012}", "{\"name\":x}",
                                  "{\"name\":\"\n\"}", "{\"name\":\"x\"} ", NULL});
    schema_table("{\"type\":\"array\",\"items\":{\"enum\":[\"a\",1,null]},\"minItems\":1,\"maxItems\":3}",
                 (const char *[]){"[\"a\"]", "[1, null, \"a\"]", NULL},
                 (const char *[]){"[]", "[1,1,1,1]", "[2]", "[\"b\"]", NULL});
    schema_table("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"boolean\"},{\"type\":\"null\"}],\"items\":false}",
                 (const char *[]){"[]", "[true]", "[false,null]", NULL}, (const char *[]){"[null]", "[true,null,1]", NULL});
    schema_table("{\"type\":\"array\",\"minItems\":2}", (const char *[]){"[1,{\"a\":[]}]", "[1,2,3,4,5]", NULL},
                 (const char *[]){"[]", "[1]", NULL});
    schema_table("{\"anyOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"number\"}]}",
                 (const char *[]){"\"ab\"", "\"\xc3\xa9\xc3\xa9\"", "1.5e3", "-0.25", NULL},
                 (const char *[]){"\"abc\"", "true", "1.", ".5", "01", NULL});
    schema_table("{\"type\":[\"string\",\"null\"],\"format\":\"date-time\"}",
                 (const char *[]){"\"2024-02-29T23:59:60Z\"", "\"2024-01-01T00:00:00.123+05:30\"", "null", NULL},
                 (const char *[]){"\"2024-13-01T00:00:00Z\"", "\"2024-01-01\"", NULL});
    schema_table("{\"type\":\"string\",\"format\":\"uuid\"}", (const char *[]){"\"123e4567-e89b-12d3-a456-426614174000\"", NULL},
                 (const char *[]){"\"123e4567e89b12d3a456426614174000\"", NULL});
    schema_table("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                 "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},"
                 "\"$ref\":\"#/$defs/node\"}",
                 (const char *[]){"{\"v\":1,\"next\":null}", "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}", NULL},
                 (const char *[]){"{\"v\":1}", "{\"v\":1,\"next\":{\"v\":2}}", NULL});
    schema_table("{\"type\":\"object\",\"properties\":{\"a\":{\"const\":1}},\"additionalProperties\":{\"type\":\"boolean\"}}",
                 (const char *[]){"{}", "{\"a\":1}", "{\"a\":1,\"x\":true}", "{\"x\":false,\"y\":true}", NULL},
                 (const char *[]){"{\"a\":2}", "{\"x\":1}", NULL});
    schema_table("{\"type\":\"object\"}", (const char *[]){"{}", "{\"any\":[1,{\"b\":null}]}", NULL}, (const char *[]){"[]", NULL});
    schema_table("true", (const char *[]){"1", "\"s\"", "[]", "{}", NULL}, NULL);
    schema_refused("{\"type\":\"integer\",\"minimum\":3}", "unsupported JSON Schema keyword 'minimum'");
    schema_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"x\"}}}",
                   "'pattern' (at /properties/a)");
    schema_refused("{\"type\":\"string\",\"format\":\"email\"}", "unsupported string format 'email'");
    schema_refused("{\"$ref\":\"#/$defs/missing\"}", "points at nothing");
    schema_refused("{\"$ref\":\"http://example.com/s\"}", "is not supported");
    schema_refused("{\"$ref\":\"#/$defs/\"}", "names no definition");
    schema_refused("{\"$ref\":\"#\"}", "left recursion");
    schema_refused("{\"$defs\":{\"a\":{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#/$defs/b\"}]},\"b\":{\"allOf\":[{\"$ref\":\"#/$defs/a\"}]}},\"$ref\":\"#/$defs/a\"}", "left recursion");
    schema_refused("{\"type\":\"object\",\"required\":[\"a\"]}", "'a' is not in 'properties'");
    schema_refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "below 'minItems'");
    schema_refused("{\"type\":\"wat\"}", "unknown type 'wat'");
    schema_refused("{\"allOf\":[{},{}]}", "allOf");
    schema_refused("false", "matches nothing");

    /* choices and regexes */
    char *gb, err[200];
    const char *ch[] = {"yes", "no", "a \"quoted\" one"};
    CHECK_RC(cm_choice_gbnf(ch, 3, &gb, err, sizeof err), 0);
    table(gb, (const char *[]){"yes", "no", "a \"quoted\" one", NULL}, (const char *[]){"y", "yesno", "", NULL});
    free(gb);
    static const struct { const char *re; const char *yes[4], *no[4]; } rx[] = {
        {"^\\d{3}-[A-Z]+$", {"123-AB", "000-Z"}, {"12-AB", "123-", "123-ab"}},
        {"(cat|dog)s?", {"cat", "dogs"}, {"cats!", "bird"}},
        {"[^\\s]+@(?:[a-z]+\\.)+com", {"me@x.com", "a.b@c.d.com"}, {"me @x.com", "me@.com"}},
        {"a.c|\\.", {"abc", "a\xc3\xa9" "c", "."}, {"ac", "a\nc", "x"}},
        {"(?P<n>[-+]?[0-9]*)x{2}", {"-12xx", "xx"}, {"x", "--1xx"}},
    };
    for (size_t i = 0; i < sizeof rx / sizeof rx[0]; i++) {
        CHECK_RC(cm_regex_gbnf(rx[i].re, strlen(rx[i].re), &gb, err, sizeof err), 0);
        if (gb) table(gb, rx[i].yes, rx[i].no);
        free(gb);
    }
    static const char *const rx_bad[][2] = {{"(a)\\1", "backreferences"}, {"(?=a)", "lookaround"}, {"a^b", "at the ends"},
                                            {"a++", "possessive"}, {"\\bword", "assertion"}, {"(a", "missing ')'"}};
    for (size_t i = 0; i < sizeof rx_bad / sizeof rx_bad[0]; i++) {
        gb = NULL;
        CHECK_RC(cm_regex_gbnf(rx_bad[i][0], strlen(rx_bad[i][0]), &gb, err, sizeof err), LLM_EINVAL);
        if (!strstr(err, rx_bad[i][1])) tst_failures++, fprintf(stderr, "  regex %s: '%s'\n", rx_bad[i][0], err);
        free(gb);
    }
}

static void test_fuzz(int rounds) {
    int walks = 0, long_walks = 0, bad = 0;
    for (int r = 0; r < rounds; r++) {
        json_t *s = rand_schema(0);
        char err[300];
        cm_grammar *g = compile(s, err, sizeof err);
        if (!g) {
            char *t = json_dumps(s, JSON_COMPACT);
            fprintf(stderr, "  schema %s did not compile: %s\n", t, err);
            free(t);
            tst_failures++;
            json_decref(s);
            continue;
        }
        for (int w = 0; w < 8; w++) {
            char *text = walk_bytes(g);
            if (!text) { long_walks++; continue; }
            walks++;
            json_error_t je;
            json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
            if (!v || !valid(v, s, s)) {
                if (bad++ < 5) {
                    char *t = json_dumps(s, JSON_COMPACT);
                    fprintf(stderr, "  walk %s\n  is %s for %s\n", text, v ? "invalid" : je.text, t);
                    free(t);
                }
            }
            /* a mutation the validator rejects must be rejected by the grammar */
            size_t n = strlen(text);
            if (v && n > 1) {
                char *m = strdup(text);
                m[rnd() % n] = "{}[]\",:0a \\"[rnd() % 11];
                json_t *mv = json_loads(m, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
                if ((!mv || !valid(mv, s, s)) && matches(g, m) == 1) {
                    if (bad++ < 5) fprintf(stderr, "  the grammar accepts %s\n", m);
                }
                json_decref(mv);
                free(m);
            }
            json_decref(v);
            free(text);
        }
        cm_grammar_free(g);
        json_decref(s);
    }
    printf("fuzz: %d schemas, %d walks validated, %d ran long, %d bad\n", rounds, walks, long_walks, bad);
    CHECK_INT(bad, 0);
    CHECK(walks > rounds * 4);
}

/* Masks against brute force (each token's bytes fed on their own), along
 * random walks of a schema's grammar, and what they cost. */
static void test_masks(const char *model) {
    cm_gguf *gg;
    cm_tokenizer *tok;
    char err[256];
    if (access(model, R_OK) || cm_gguf_open(model, &gg, err, sizeof err)) {
        printf("masks: model %s not found, skipped (tools/setup.sh fetches it)\n", model);
        return;
    }
    CHECK_RC(cm_tok_from_gguf(gg, &tok, err, sizeof err), 0);
    cm_vtrie *v;
    double t0 = now_ms();
    CHECK_RC(cm_vtrie_build(tok, &v), 0);
    printf("masks: vocabulary trie of %d tokens built in %.1f ms\n", cm_vtrie_vocab(v), now_ms() - t0);
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":20},"
                         "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":3},"
                         "\"n\":{\"type\":\"number\"}},\"required\":[\"name\",\"tags\"]}";
    json_t *s = json_loads(schema, 0, NULL);
    t0 = now_ms();
    cm_grammar *g = compile(s, err, sizeof err);
    printf("masks: schema compiled in %.2f ms (%d rules, %d elements)\n", now_ms() - t0, g ? cm_grammar_rules(g) : 0,
           g ? cm_grammar_elements(g) : 0);
    CHECK(g != NULL);
    int V = cm_vtrie_vocab(v), words = (V + 63) / 64, mism = 0, steps = 0;
    uint64_t *bits = malloc(sizeof *bits * (size_t)words);
    double walk_ms = 0, cached_ms = 0;
    int n_cached = 0;
    for (int rep = 0; g && rep < 3; rep++) {
        cm_gstate *st;
        CHECK_RC(cm_gstate_new(g, &st), 0);
        for (int step = 0; step < 40 && !cm_gstate_done(st); step++) {
            uint64_t w0, h0, w1, h1;
            cm_grammar_mask_stats(g, &w0, &h0);
            double a = now_ms();
            CHECK_RC(cm_gstate_mask(st, v, bits), 0);
            double dt = now_ms() - a;
            cm_grammar_mask_stats(g, &w1, &h1);
            if (h1 > h0) cached_ms += dt, n_cached++;
            else walk_ms += dt;
            steps++;
            int allowed[64], na = 0;
            for (int id = 0; id < V; id++) {
                size_t l;
                const uint8_t *b = cm_vtrie_bytes(v, id, &l);
                int want = b && cm_gstate_allows(st, b, l), got = (int)(bits[id >> 6] >> (id & 63) & 1);
                if (want != got && mism++ < 5) fprintf(stderr, "  token %d: mask %d, brute force %d\n", id, got, want);
                if (got && na < 64 && (rnd() % 8 == 0 || na == 0)) allowed[na++] = id;
            }
            if (!na) break;
            size_t l;
            const uint8_t *b = cm_vtrie_bytes(v, allowed[rnd() % (unsigned)na], &l);
            CHECK_RC(cm_gstate_feed(st, b, l), 0);
        }
        cm_gstate_free(st);
    }
    uint64_t walks, hits;
    if (g) cm_grammar_mask_stats(g, &walks, &hits);
    else walks = hits = 0;
    printf("masks: %d steps against brute force, %d mismatches; %llu trie walks (%.2f ms each), %llu cached (%.3f ms each)\n",
           steps, mism, (unsigned long long)walks, walks ? walk_ms / (double)walks : 0, (unsigned long long)hits,
           n_cached ? cached_ms / n_cached : 0);
    CHECK_INT(mism, 0);
    CHECK(steps > 30);
    free(bits);
    cm_grammar_free(g);
    json_decref(s);
    cm_vtrie_free(v);
    cm_tok_free(tok);
    cm_gguf_close(gg);
}

/* cm_grammar_after: the answer's grammar after a reasoning block: any text up to the first close, which
 * ends it wherever it appears (a prefix of it, or a stray open byte, does not), then the grammar. */
static void test_after(void) {
    static const char base[] = "root ::= \"{\" [a-z]* \"}\"\n";
    char *qwen = NULL, *r1 = NULL;
    CHECK_RC(cm_grammar_after(base, strlen(base), "<think>", "</think>", &qwen), 0);
    CHECK_RC(cm_grammar_after(base, strlen(base), NULL, "</think>", &r1), 0);
    const char *qy[] = {"{ab}", "\n{ab}", "<think>hi</think>{ab}", "<think>hi</think>\n\n{ab}", "<think></think>{}",
                        "<think>a<</think>{x}", "<think></thi</thin</think>{x}", "<think>\xc3\xa9t\xc3\xa9 </ think></think>{x}",
                        "<think><think></think>{x}", NULL};
    const char *qn[] = {"<think>x</think>y", "<think>x</think>{x}</think>", "<think>{x}", "<think>x</think >{x}",
                        "{ab}</think>", "y{ab}", NULL};
    table(qwen, qy, qn);
    const char *ry[] = {"plan</think>{a}", "</think>\n{a}", "a</t</think>{}", NULL};
    const char *rn[] = {"{a}", "<think>x</think>", "x</think>{a}</think>", NULL};
    table(r1, ry, rn);
    /* a long reasoning: right recursion runs as tail calls, the stack stays flat */
    cm_grammar *g;
    char err[200];
    cm_gstate *st;
    CHECK_RC(cm_grammar_parse(r1, strlen(r1), &g, err, sizeof err), 0);
    CHECK_RC(cm_gstate_new(g, &st), 0);
    int ok = 1;
    for (int i = 0; i < 20000 && ok; i++) ok = !cm_gstate_feed(st, i % 7 ? "word " : "<th ", i % 7 ? 5 : 4);
    CHECK(ok && !cm_gstate_complete(st));
    CHECK_RC(cm_gstate_feed(st, "</think>{ok}", 12), 0);
    CHECK(cm_gstate_complete(st));
    cm_gstate_free(st);
    cm_grammar_free(g);
    char *bad = NULL;
    CHECK_RC(cm_grammar_after(base, strlen(base), NULL, "", &bad), LLM_EINVAL);
    CHECK_RC(cm_grammar_after(base, strlen(base), NULL, "\n</x>", &bad), LLM_EINVAL); /* printable ASCII only */
    free(qwen);
    free(r1);
}

int main(int argc, char **argv) {
    test_after();
    test_gbnf();
    test_schemas();
    test_fuzz(300);
    test_masks(argc > 1 ? argv[1] : "");
    printf("grammar_test: %d checks, %d failed\n", tst_checks, tst_failures);
    return tst_failures ? 1 : 0;
}
