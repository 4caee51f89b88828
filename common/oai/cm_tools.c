#include "cm_tools.h"
#include "cm_error.h"
#include "cm_jsonschema.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPEN "<tool_call>"
#define CLOSE "</tool_call>"

static char *fmt(const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(NULL, 0, f, ap);
    va_end(ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s) return NULL;
    va_start(ap, f);
    vsnprintf(s, (size_t)n + 1, f, ap);
    va_end(ap);
    return s;
}

static char *keep(cm_tools_prompt *p, char *s) {
    if (!s) return NULL;
    char **o = realloc(p->own, sizeof *o * (size_t)(p->n_own + 1));
    if (!o) {
        free(s);
        return NULL;
    }
    p->own = o;
    p->own[p->n_own++] = s;
    return s;
}

void cm_tools_free(cm_tools_prompt *p) {
    for (int i = 0; i < p->n_own; i++) free(p->own[i]);
    free(p->own);
    free(p->msgs);
    memset(p, 0, sizeof *p);
}

/* One tool as OpenAI sends it: {"type": "function", "function": {name, description, parameters}}. */
static json_t *tool_json(const cm_oai_tool *t) {
    json_t *params = t->parameters ? json_loads(t->parameters, 0, NULL) : NULL;
    return json_pack("{s:s,s:{s:s,s:s,s:o}}", "type", "function", "function", "name", t->name, "description",
                     t->description ? t->description : "", "parameters", params ? params : json_object());
}

/* The tools, each dumped with flags, each followed by sep; malloc'd. */
static char *tools_list(const cm_oai_completion *c, size_t flags, const char *sep) {
    char *out = strdup("");
    for (int i = 0; out && i < c->n_tools; i++) {
        json_t *f = tool_json(&c->tools[i]);
        char *s = f ? json_dumps(f, flags) : NULL;
        json_decref(f);
        char *n = s ? fmt("%s%s%s", out, s, sep) : NULL;
        free(s);
        free(out);
        out = n;
    }
    return out;
}

/* Hermes: one JSON object a line in the system prompt. */
static char *hermes_block(const cm_oai_completion *c) {
    char *lines = tools_list(c, JSON_COMPACT | JSON_ENSURE_ASCII, "\n");
    char *out = lines ? fmt("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n%s"
                            "</tools>\n\nFor each function call, return a json object with function name and arguments "
                            "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                            "\"arguments\": <args-json-object>}\n</tool_call>", lines) : NULL;
    free(lines);
    return out;
}

/* Llama 3.1: Meta's instruction and the tools, indented, before the first user message. */
static char *llama3_block(const cm_oai_completion *c) {
    char *list = tools_list(c, JSON_INDENT(4), "\n\n");
    char *out = list ? fmt("Given the following functions, please respond with a JSON for a function call with its proper "
                           "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function "
                           "name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n%s",
                           list) : NULL;
    free(list);
    return out;
}

/* Mistral's 9-character call ids: the last letters and digits of the id, padded. */
static void mistral_id(const char *id, char out[10]) {
    char alnum[10];
    int n = 0;
    for (const char *p = id ? id + strlen(id) : NULL; p && p > id && n < 9;) {
        char ch = *--p;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')) alnum[n++] = ch;
    }
    for (int i = 0; i < 9; i++) out[i] = i < n ? alnum[n - 1 - i] : '0';
    out[9] = 0;
}

/* An assistant's calls ([{name, arguments, id?}] as compact JSON) in the format's words. */
static char *calls_text(int format, const char *content, const char *calls) {
    json_t *a = json_loads(calls, 0, NULL);
    char *out = strdup(format == CM_TOOLS_HERMES && content && content[0] ? content : "");
    if (format == CM_TOOLS_MISTRAL) out = out ? (free(out), strdup("[TOOL_CALLS] [")) : NULL;
    for (size_t i = 0; a && out && i < json_array_size(a); i++) {
        json_t *x = json_array_get(a, i), *one;
        char id[10];
        if (format == CM_TOOLS_MISTRAL) {
            mistral_id(json_string_value(json_object_get(x, "id")), id);
            one = json_pack("{s:O,s:O,s:s}", "name", json_object_get(x, "name"), "arguments", json_object_get(x, "arguments"),
                            "id", id);
        } else {
            one = json_pack("{s:O,s:O}", "name", json_object_get(x, "name"), format == CM_TOOLS_LLAMA3 ? "parameters" : "arguments",
                            json_object_get(x, "arguments"));
        }
        char *j = one ? json_dumps(one, format == CM_TOOLS_HERMES ? JSON_COMPACT | JSON_ENSURE_ASCII : JSON_ENSURE_ASCII) : NULL;
        json_decref(one);
        char *n = NULL;
        if (j && format == CM_TOOLS_HERMES) n = fmt("%s%s" OPEN "\n%s\n" CLOSE, out, out[0] ? "\n" : "", j);
        else if (j) n = fmt("%s%s%s", out, i ? (format == CM_TOOLS_LLAMA3 ? "; " : ", ") : "", j);
        free(j);
        free(out);
        out = n;
    }
    if (format == CM_TOOLS_MISTRAL && out) {
        char *n = fmt("%s]</s>", out);
        free(out);
        out = n;
    }
    json_decref(a);
    return out;
}

int cm_tools_format(int chat_kind) {
    return chat_kind == CM_CHAT_LLAMA3 ? CM_TOOLS_LLAMA3 : chat_kind == CM_CHAT_MISTRAL ? CM_TOOLS_MISTRAL : CM_TOOLS_HERMES;
}

/* A tool result: Hermes's user turn, Llama's ipython turn, Mistral's [TOOL_RESULTS] (raw). */
static cm_chat_msg result_msg(cm_tools_prompt *p, int format, const struct cm_oai_msg *m) {
    if (format == CM_TOOLS_LLAMA3) return (cm_chat_msg){"ipython", m->content};
    if (format == CM_TOOLS_HERMES)
        return (cm_chat_msg){"user", keep(p, fmt("<tool_response>\n%s\n</tool_response>", m->content))};
    char id[10];
    mistral_id(m->tool_call_id, id);
    json_t *v = json_loads(m->content, JSON_DECODE_ANY, NULL);
    if (!v) v = json_string(m->content);
    char *cj = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : NULL;
    json_decref(v);
    char *s = cj ? fmt("[TOOL_RESULTS] {\"content\": %s, \"call_id\": \"%s\"}[/TOOL_RESULTS]", cj, id) : NULL;
    free(cj);
    return (cm_chat_msg){"raw", keep(p, s)};
}

int cm_tools_render(const cm_oai_completion *c, int format, const char *default_system, cm_tools_prompt *p) {
    memset(p, 0, sizeof *p);
    p->msgs = calloc((size_t)c->n_messages + 2, sizeof *p->msgs);
    if (!p->msgs) return LLM_ENOMEM;
    int first_system = c->n_messages && !strcmp(c->messages[0].role, "system");
    int tools = c->n_tools && c->tool_choice != CM_TOOL_NONE;
    int first_user = -1, last_user = -1;
    for (int i = first_system; i < c->n_messages; i++)
        if (!strcmp(c->messages[i].role, "user")) {
            if (first_user < 0) first_user = i;
            last_user = i;
        }
    char *block = NULL;
    if (tools) {
        block = format == CM_TOOLS_LLAMA3 ? llama3_block(c) : format == CM_TOOLS_MISTRAL ? tools_list(c, JSON_ENSURE_ASCII, ", ")
                                                                                       : hermes_block(c);
        if (!block) goto oom;
        if (format == CM_TOOLS_MISTRAL) { /* "a, b, " -> "[AVAILABLE_TOOLS] [a, b][/AVAILABLE_TOOLS]" */
            size_t l = strlen(block);
            if (l >= 2) block[l - 2] = 0;
            char *b = fmt("[AVAILABLE_TOOLS] [%s][/AVAILABLE_TOOLS]", block);
            free(block);
            if (!(block = b)) goto oom;
        }
        if (!keep(p, block)) goto oom;
    }
    if (tools && format == CM_TOOLS_HERMES) {
        const char *sys = first_system ? c->messages[0].content : default_system;
        char *s = keep(p, sys && sys[0] ? fmt("%s\n\n%s", sys, block) : fmt("%s", block));
        if (!s) goto oom;
        p->msgs[p->n++] = (cm_chat_msg){"system", s};
    } else if (first_system) {
        p->msgs[p->n++] = (cm_chat_msg){"system", c->messages[0].content};
    }
    if (tools && format == CM_TOOLS_LLAMA3 && first_user < 0) p->msgs[p->n++] = (cm_chat_msg){"user", block};
    for (int i = first_system; i < c->n_messages; i++) {
        const struct cm_oai_msg *m = &c->messages[i];
        cm_chat_msg out = {m->role, m->content};
        if (!strcmp(m->role, "tool")) {
            out = result_msg(p, format, m);
        } else if (m->tool_calls) {
            out.content = keep(p, calls_text(format, m->content, m->tool_calls));
            if (format == CM_TOOLS_MISTRAL) out.role = "raw";
        } else if (tools && format == CM_TOOLS_LLAMA3 && i == first_user) {
            out.content = keep(p, fmt("%s%s", block, m->content));
        } else if (tools && format == CM_TOOLS_MISTRAL && i == last_user) {
            p->msgs[p->n++] = (cm_chat_msg){"raw", block};
        }
        if (!out.content) goto oom;
        p->msgs[p->n++] = out;
    }
    if (tools && format == CM_TOOLS_MISTRAL && last_user < 0) p->msgs[p->n++] = (cm_chat_msg){"raw", block};
    return 0;
oom:
    cm_tools_free(p);
    return LLM_ENOMEM;
}

/* GBNF literal text of a JSON string value (the name inside quotes). */
static void lit_json_string(char *out, size_t cap, const char *name) {
    json_t *s = json_string(name);
    char *t = s ? json_dumps(s, JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : NULL;
    json_decref(s);
    size_t o = 0;
    for (const char *q = t ? t : "\"\""; *q && o + 3 < cap; q++) {
        if (*q == '"' || *q == '\\') out[o++] = '\\';
        out[o++] = *q;
    }
    out[o] = 0;
    free(t);
}

/* Appends to a malloc'd string (NULL on failure, the old one freed). */
static char *append(char *s, const char *add) {
    size_t a = s ? strlen(s) : 0, b = strlen(add);
    char *q = realloc(s, a + b + 1);
    if (!q) {
        free(s);
        return NULL;
    }
    memcpy(q + a, add, b + 1);
    return q;
}

int cm_tools_gbnf(const cm_oai_completion *c, int format, char **gbnf, char *err, size_t errlen) {
    *gbnf = NULL;
    char *alts = strdup("call ::="), *defs = strdup("");
    int next = 0, first = 1;
    for (int i = 0; alts && defs && i < c->n_tools; i++) {
        if (c->tool_choice == CM_TOOL_NAMED && i != c->tool_named) continue;
        const cm_oai_tool *t = &c->tools[i];
        json_t *schema = t->parameters ? json_loads(t->parameters, 0, NULL) : json_pack("{s:s}", "type", "object");
        char *rules = NULL, e2[300];
        int root;
        int rc = schema ? cm_schema_rules(schema, &next, &rules, &root, e2, sizeof e2) : LLM_ENOMEM;
        json_decref(schema);
        if (rc) {
            snprintf(err, errlen, "tools[%d].function.parameters: %s", i, rc == LLM_ENOMEM ? "out of memory" : e2);
            free(alts);
            free(defs);
            return rc;
        }
        char name[300], *alt;
        lit_json_string(name, sizeof name, t->name);
        if (format == CM_TOOLS_HERMES)
            alt = fmt("%s \"" OPEN "\\n{\\\"name\\\": %s, \\\"arguments\\\": \" s%d \"}\\n" CLOSE "\"",
                      first ? "" : " |", name, root);
        else
            alt = fmt("%s \"{\\\"name\\\": %s, \\\"%s\\\": \" s%d \"}\"", first ? "" : " |", name,
                      format == CM_TOOLS_LLAMA3 ? "parameters" : "arguments", root);
        first = 0;
        alts = alt ? append(alts, alt) : (free(alts), NULL);
        defs = defs ? append(defs, rules) : NULL;
        free(alt);
        free(rules);
    }
    /* several calls: Hermes's blocks a line apart, Llama's joined by "; ", Mistral's in one array */
    const char *sep = format == CM_TOOLS_HERMES ? "\\n" : format == CM_TOOLS_LLAMA3 ? "; " : ", ";
    char more[64] = "";
    if (c->parallel_tool_calls) snprintf(more, sizeof more, " (\"%s\" call)*", sep);
    char *out = alts && defs ? fmt("%s%s\n%sroot ::= %scall%s%s\n", cm_json_base_gbnf(), alts, defs,
                                   format == CM_TOOLS_MISTRAL ? "\"[\" " : "", more, format == CM_TOOLS_MISTRAL ? " \"]\"" : "")
                             : NULL;
    free(alts);
    free(defs);
    if (!out) {
        snprintf(err, errlen, "out of memory");
        return LLM_ENOMEM;
    }
    *gbnf = out;
    return 0;
}

/* Next block: [open, close) of the JSON inside <tool_call>...</tool_call>. */
static const char *find(const char *s, const char *end, const char *needle) {
    size_t l = strlen(needle);
    for (const char *q = s; q + l <= end; q++)
        if (!memcmp(q, needle, l)) return q;
    return NULL;
}

void cm_tools_call_id(unsigned long long seed, size_t k, char out[30]) {
    unsigned long long h = seed * 0x9e3779b97f4a7c15ull + k + 1;
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    memcpy(out, "call_", 5);
    for (int i = 0; i < 24; i++) {
        h ^= h >> 29, h *= 0xbf58476d1ce4e5b9ull, h ^= h >> 32;
        out[5 + i] = al[h % 62];
    }
    out[29] = 0;
}

/* Appends {id, type, function: {name, arguments}} when name is a tool's
 * and args an object or a string; 0 when it is not a call we know. */
static int add_call(json_t *arr, const cm_oai_tool *tools, int n_tools, json_t *name, json_t *args, unsigned long long seed) {
    int known = 0;
    for (int i = 0; json_is_string(name) && i < n_tools && !known; i++) known = !strcmp(tools[i].name, json_string_value(name));
    if (!known || !(json_is_object(args) || json_is_string(args))) return 0;
    char *a = json_is_string(args) ? strdup(json_string_value(args)) : json_dumps(args, JSON_COMPACT);
    char id[30];
    cm_tools_call_id(seed, json_array_size(arr), id);
    json_array_append_new(arr, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function", "name",
                                         json_string_value(name), "arguments", a ? a : "{}"));
    free(a);
    return 1;
}

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')) p++;
    return p;
}

/* Llama 3's and Mistral's: the output is the calls, JSON first thing (after
 * <|python_tag|> or [TOOL_CALLS], where the text keeps them), or it is all
 * content. Llama: objects joined by ";"; Mistral: one array. */
static int parse_json_calls(int format, const cm_oai_tool *tools, int n_tools, const char *text, size_t len,
                            unsigned long long seed, json_t **calls, char **content) {
    const char *p = skip_ws(text, text + len), *end = text + len;
    const char *tag = format == CM_TOOLS_LLAMA3 ? "<|python_tag|>" : "[TOOL_CALLS]";
    if ((size_t)(end - p) >= strlen(tag) && !memcmp(p, tag, strlen(tag))) p = skip_ws(p + strlen(tag), end);
    json_t *arr = json_array();
    int ok = p < end && *p == (format == CM_TOOLS_LLAMA3 ? '{' : '[');
    while (ok && p < end) {
        json_error_t e;
        json_t *j = json_loadb(p, (size_t)(end - p), JSON_DISABLE_EOF_CHECK, &e);
        if (!j) {
            ok = 0;
            break;
        }
        p += e.position;
        for (size_t k = 0; ok && k < (json_is_array(j) ? json_array_size(j) : 1); k++) {
            json_t *x = json_is_array(j) ? json_array_get(j, k) : j, *args = json_object_get(x, "arguments");
            if (format == CM_TOOLS_LLAMA3 && !args) args = json_object_get(x, "parameters");
            ok = json_is_object(x) && add_call(arr, tools, n_tools, json_object_get(x, "name"), args, seed);
        }
        json_decref(j);
        p = skip_ws(p, end);
        if (format == CM_TOOLS_MISTRAL || p >= end || *p != ';') break;
        p = skip_ws(p + 1, end);
    }
    if (!ok || !json_array_size(arr)) {
        json_decref(arr);
        return 0;
    }
    *calls = arr;
    const char *r = skip_ws(p, end);
    size_t rl = (size_t)(end - r);
    while (rl && (r[rl - 1] == ' ' || r[rl - 1] == '\n' || r[rl - 1] == '\t' || r[rl - 1] == '\r')) rl--;
    if (rl && (*content = malloc(rl + 1))) {
        memcpy(*content, r, rl);
        (*content)[rl] = 0;
    }
    return 0;
}

int cm_tools_parse(int format, const cm_oai_tool *tools, int n_tools, const char *text, size_t len,
                   unsigned long long seed, json_t **calls, char **content) {
    *calls = NULL;
    *content = NULL;
    if (format != CM_TOOLS_HERMES) return parse_json_calls(format, tools, n_tools, text, len, seed, calls, content);
    const char *p = text, *end = text + len;
    char *rest = malloc(len + 1);
    if (!rest) return LLM_ENOMEM;
    size_t rn = 0;
    json_t *arr = json_array();
    while (p < end) {
        const char *o = find(p, end, OPEN), *cl = NULL;
        size_t lc = strlen(CLOSE);
        if (!o) break;
        /* the block's JSON read as JSON (a closing tag inside a string is the string's, as the streamed parse
         * reads it), then the closing tag; what does not read so is found by the tag alone */
        const char *js = skip_ws(o + strlen(OPEN), end);
        json_error_t je;
        json_t *j = json_loadb(js, (size_t)(end - js), JSON_DISABLE_EOF_CHECK, &je);
        if (j) {
            const char *after = skip_ws(js + je.position, end);
            if ((size_t)(end - after) >= lc && !memcmp(after, CLOSE, lc)) cl = after;
            else if (after == end) cl = end, lc = 0; /* the output ended inside the block: a whole call still counts */
            else json_decref(j), j = NULL;
        }
        if (!j) {
            if (!(cl = find(o + strlen(OPEN), end, CLOSE))) cl = end, lc = 0;
            j = json_loadb(o + strlen(OPEN), (size_t)(cl - o - strlen(OPEN)), 0, NULL);
        }
        json_t *name = json_object_get(j, "name"), *args = json_object_get(j, "arguments");
        if (!args) args = json_object_get(j, "parameters");
        int ok = add_call(arr, tools, n_tools, name, args, seed);
        json_decref(j);
        if (ok) {
            memcpy(rest + rn, p, (size_t)(o - p)); /* the text before the call */
            rn += (size_t)(o - p);
        } else if (!lc) {
            break; /* an unfinished block stays text */
        } else {
            memcpy(rest + rn, p, (size_t)(cl + lc - p)); /* not a call we know: it stays text */
            rn += (size_t)(cl + lc - p);
        }
        p = cl + lc;
    }
    memcpy(rest + rn, p, (size_t)(end - p));
    rn += (size_t)(end - p);
    size_t a = 0;
    while (a < rn && (rest[a] == ' ' || rest[a] == '\n' || rest[a] == '\t' || rest[a] == '\r')) a++;
    while (rn > a && (rest[rn - 1] == ' ' || rest[rn - 1] == '\n' || rest[rn - 1] == '\t' || rest[rn - 1] == '\r')) rn--;
    if (json_array_size(arr)) {
        *calls = arr;
        if (rn > a) {
            memmove(rest, rest + a, rn - a);
            rest[rn - a] = 0;
            *content = rest;
        } else {
            free(rest);
        }
    } else {
        json_decref(arr);
        free(rest);
    }
    return 0;
}

/* ---- streaming (Hermes) ------------------------------------------------- */

enum { ST_TEXT = 0, ST_HEAD, ST_ARGS, ST_TAIL, ST_HOLD };

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Content [a, b): leading whitespace dropped until some content went out,
 * trailing whitespace held until more content follows (as the parse trims). */
static void content(cm_tools_stream *st, const char *t, size_t a, size_t b, cm_tools_emit emit, void *ctx) {
    if (!st->content_sent)
        while (a < b && is_ws(t[a])) a++;
    size_t e = b;
    while (e > a && is_ws(t[e - 1])) e--;
    if (e == a) { /* only whitespace: held with what was held */
        if (st->content_sent && b > a) {
            if (st->ws_b != a) st->ws_a = a;
            st->ws_b = b;
        }
        return;
    }
    cm_tools_event ev = {CM_TOOLS_EV_CONTENT, 0, NULL, 0, NULL};
    if (st->ws_b > st->ws_a) {
        ev.s = t + st->ws_a, ev.n = st->ws_b - st->ws_a;
        emit(ctx, &ev);
    }
    ev.s = t + a, ev.n = e - a;
    emit(ctx, &ev);
    st->content_sent = 1;
    st->ws_a = e, st->ws_b = b;
}

/* {"name": "NAME", "arguments": at t[0..n) (after <tool_call>): 1 with the
 * name's span and where the arguments begin, 0 when more text is needed,
 * -1 when the block is written otherwise. */
static int head(const char *t, size_t n, size_t *na, size_t *nb, size_t *args) {
    size_t i = 0;
#define WS() while (i < n && is_ws(t[i])) i++
#define LIT(s)                                                                                     \
    do {                                                                                           \
        for (const char *q = (s); *q; q++, i++) {                                                  \
            if (i >= n) return 0;                                                                  \
            if (t[i] != *q) return -1;                                                             \
        }                                                                                          \
    } while (0)
    WS();
    LIT("{");
    WS();
    LIT("\"name\"");
    WS();
    LIT(":");
    WS();
    LIT("\"");
    *na = i;
    while (i < n && t[i] != '"') {
        if (t[i] == '\\' || i - *na > 64) return -1; /* tool names have no escapes */
        i++;
    }
    if (i >= n) return 0;
    *nb = i++;
    WS();
    LIT(",");
    WS();
    LIT("\"arguments\"");
    WS();
    LIT(":");
    WS();
    if (i >= n) return 0;
    if (t[i] != '{') return -1;
    *args = i;
    return 1;
#undef WS
#undef LIT
}

int cm_tools_stream_feed(cm_tools_stream *st, const cm_oai_tool *tools, int n_tools, const char *t, size_t len, int final,
                         unsigned long long seed, cm_tools_emit emit, void *ctx) {
    const size_t lo = strlen(OPEN), lc = strlen(CLOSE);
    for (;;) {
        if (st->state == ST_TEXT) {
            const char *o = find(t + st->pos, t + len, OPEN);
            if (o) {
                content(st, t, st->pos, (size_t)(o - t), emit, ctx);
                st->call_at = (size_t)(o - t);
                st->pos = st->call_at + lo;
                st->state = ST_HEAD;
                continue;
            }
            size_t hold = 0; /* what could be the start of <tool_call> */
            for (size_t k = lo - 1; !final && k > 0 && !hold; k--)
                if (len - st->pos >= k && !memcmp(t + len - k, OPEN, k)) hold = k;
            content(st, t, st->pos, len - hold, emit, ctx);
            st->pos = len - hold;
            return 0;
        }
        if (st->state == ST_HEAD) {
            size_t na, nb, args;
            int h = head(t + st->pos, len - st->pos, &na, &nb, &args), known = 0;
            for (int i = 0; h == 1 && i < n_tools && !known; i++)
                known = strlen(tools[i].name) == nb - na && !memcmp(tools[i].name, t + st->pos + na, nb - na);
            if (h == 0 && !final) return 0;
            if (h != 1 || !known) {
                st->state = ST_HOLD;
                continue;
            }
            char id[30];
            cm_tools_call_id(seed, (size_t)st->n_calls, id);
            cm_tools_event ev = {CM_TOOLS_EV_CALL, st->n_calls, t + st->pos + na, nb - na, id};
            emit(ctx, &ev);
            st->n_calls++;
            st->pos += args;
            st->depth = st->in_str = st->esc = 0;
            st->state = ST_ARGS;
            continue;
        }
        if (st->state == ST_ARGS) { /* the object's bytes as they come, to its closing brace */
            size_t i = st->pos, end = 0;
            for (; i < len && !end; i++) {
                char c = t[i];
                if (st->in_str) {
                    if (st->esc) st->esc = 0;
                    else if (c == '\\') st->esc = 1;
                    else if (c == '"') st->in_str = 0;
                } else if (c == '"') {
                    st->in_str = 1;
                } else if (c == '{' || c == '[') {
                    st->depth++;
                } else if ((c == '}' || c == ']') && --st->depth == 0) {
                    end = i + 1;
                }
            }
            if (i > st->pos) {
                cm_tools_event ev = {CM_TOOLS_EV_ARGS, st->n_calls - 1, t + st->pos, i - st->pos, NULL};
                emit(ctx, &ev);
            }
            st->pos = i;
            if (!end) return 0;
            st->state = ST_TAIL;
            continue;
        }
        if (st->state == ST_TAIL) { /* the call's closing brace and </tool_call> */
            const char *c = find(t + st->pos, t + len, CLOSE);
            if (!c) return 0;
            st->pos = (size_t)(c - t) + lc;
            st->state = ST_TEXT;
            continue;
        }
        /* ST_HOLD: the block whole, read as the parse reads it */
        const char *c = find(t + st->call_at + lo, t + len, CLOSE);
        if (!c && !final) return 0;
        size_t b = c ? (size_t)(c - t) + lc : len;
        json_t *calls = NULL;
        char *rest = NULL;
        int rc = cm_tools_parse(CM_TOOLS_HERMES, tools, n_tools, t + st->call_at, b - st->call_at, 0, &calls, &rest);
        if (rc) return rc;
        if (calls) {
            json_t *f = json_object_get(json_array_get(calls, 0), "function");
            const char *name = json_string_value(json_object_get(f, "name")), *a = json_string_value(json_object_get(f, "arguments"));
            char id[30];
            cm_tools_call_id(seed, (size_t)st->n_calls, id);
            cm_tools_event ev = {CM_TOOLS_EV_CALL, st->n_calls, name, strlen(name), id};
            emit(ctx, &ev);
            ev = (cm_tools_event){CM_TOOLS_EV_ARGS, st->n_calls, a, strlen(a), NULL};
            emit(ctx, &ev);
            st->n_calls++;
        } else {
            content(st, t, st->call_at, b, emit, ctx);
        }
        json_decref(calls);
        free(rest);
        st->pos = b;
        st->state = ST_TEXT;
        if (!c) return 0;
    }
}
