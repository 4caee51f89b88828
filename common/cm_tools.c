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

/* The tools as Hermes lists them: one JSON object a line. */
static char *tools_block(const cm_oai_completion *c) {
    json_t *lines = json_array();
    size_t total = 0;
    for (int i = 0; i < c->n_tools; i++) {
        const cm_oai_tool *t = &c->tools[i];
        json_t *params = t->parameters ? json_loads(t->parameters, 0, NULL) : json_object();
        json_t *f = json_pack("{s:s,s:{s:s,s:s,s:o}}", "type", "function", "function", "name", t->name, "description",
                              t->description ? t->description : "", "parameters", params ? params : json_object());
        char *s = f ? json_dumps(f, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
        json_decref(f);
        if (!s) {
            json_decref(lines);
            return NULL;
        }
        total += strlen(s) + 1;
        json_array_append_new(lines, json_string(s));
        free(s);
    }
    const char *head =
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
    const char *tail = "</tools>\n\nFor each function call, return a json object with function name and arguments "
                       "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                       "\"arguments\": <args-json-object>}\n</tool_call>";
    char *out = malloc(strlen(head) + total + strlen(tail) + 1);
    if (out) {
        strcpy(out, head);
        for (size_t i = 0; i < json_array_size(lines); i++) {
            strcat(out, json_string_value(json_array_get(lines, i)));
            strcat(out, "\n");
        }
        strcat(out, tail);
    }
    json_decref(lines);
    return out;
}

/* An assistant's calls ([{name, arguments}] as compact JSON) as tool_call blocks. */
static char *calls_text(const char *content, const char *calls) {
    json_t *a = json_loads(calls, 0, NULL);
    size_t cap = (content ? strlen(content) : 0) + strlen(calls) * 2 + 64 * (json_array_size(a) + 1);
    char *out = malloc(cap);
    if (!a || !out) {
        json_decref(a);
        free(out);
        return NULL;
    }
    out[0] = 0;
    if (content && content[0]) strcat(strcpy(out, content), "\n");
    for (size_t i = 0; i < json_array_size(a); i++) {
        char *s = json_dumps(json_array_get(a, i), JSON_COMPACT | JSON_ENSURE_ASCII);
        if (!s) continue;
        size_t l = strlen(out);
        snprintf(out + l, cap - l, "%s" OPEN "\n%s\n" CLOSE, i ? "\n" : "", s);
        free(s);
    }
    json_decref(a);
    return out;
}

int cm_tools_render(const cm_oai_completion *c, const char *default_system, cm_tools_prompt *p) {
    memset(p, 0, sizeof *p);
    p->msgs = calloc((size_t)c->n_messages + 1, sizeof *p->msgs);
    if (!p->msgs) return LLM_ENOMEM;
    int first_system = c->n_messages && !strcmp(c->messages[0].role, "system");
    if (c->n_tools && c->tool_choice != CM_TOOL_NONE) {
        char *block = tools_block(c);
        const char *sys = first_system ? c->messages[0].content : default_system;
        char *s = block ? keep(p, sys && sys[0] ? fmt("%s\n\n%s", sys, block) : fmt("%s", block)) : NULL;
        free(block);
        if (!s) goto oom;
        p->msgs[p->n++] = (cm_chat_msg){"system", s};
    } else if (first_system) {
        p->msgs[p->n++] = (cm_chat_msg){"system", c->messages[0].content};
    }
    for (int i = first_system; i < c->n_messages; i++) {
        const struct cm_oai_msg *m = &c->messages[i];
        if (!strcmp(m->role, "tool")) {
            char *s = keep(p, fmt("<tool_response>\n%s\n</tool_response>", m->content));
            if (!s) goto oom;
            p->msgs[p->n++] = (cm_chat_msg){"user", s};
        } else if (m->tool_calls) {
            char *s = keep(p, calls_text(m->content, m->tool_calls));
            if (!s) goto oom;
            p->msgs[p->n++] = (cm_chat_msg){"assistant", s};
        } else {
            p->msgs[p->n++] = (cm_chat_msg){m->role, m->content};
        }
    }
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

int cm_tools_gbnf(const cm_oai_completion *c, char **gbnf, char *err, size_t errlen) {
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
        alt = fmt("%s \"" OPEN "\\n{\\\"name\\\": %s, \\\"arguments\\\": \" s%d \"}\\n" CLOSE "\"",
                  first ? "" : " |", name, root);
        first = 0;
        alts = alt ? append(alts, alt) : (free(alts), NULL);
        defs = defs ? append(defs, rules) : NULL;
        free(alt);
        free(rules);
    }
    char *out = alts && defs ? fmt("%s%s\n%sroot ::= call%s\n", cm_json_base_gbnf(), alts, defs,
                                   c->parallel_tool_calls ? " (\"\\n\" call)*" : "") : NULL;
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

int cm_tools_parse(const cm_oai_tool *tools, int n_tools, const char *text, size_t len, unsigned long long seed,
                   json_t **calls, char **content) {
    *calls = NULL;
    *content = NULL;
    const char *p = text, *end = text + len;
    char *rest = malloc(len + 1);
    if (!rest) return LLM_ENOMEM;
    size_t rn = 0;
    json_t *arr = json_array();
    while (p < end) {
        const char *o = find(p, end, OPEN), *cl = o ? find(o + strlen(OPEN), end, CLOSE) : NULL;
        if (!o || !cl) break;
        json_t *j = json_loadb(o + strlen(OPEN), (size_t)(cl - o - strlen(OPEN)), 0, NULL);
        json_t *name = json_object_get(j, "name"), *args = json_object_get(j, "arguments");
        if (!args) args = json_object_get(j, "parameters");
        int known = 0;
        for (int i = 0; json_is_string(name) && i < n_tools && !known; i++) known = !strcmp(tools[i].name, json_string_value(name));
        if (known && (json_is_object(args) || json_is_string(args))) {
            char *a = json_is_string(args) ? strdup(json_string_value(args)) : json_dumps(args, JSON_COMPACT);
            char id[40];
            unsigned long long h = seed * 0x9e3779b97f4a7c15ull + json_array_size(arr) + 1;
            static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
            strcpy(id, "call_");
            for (int k = 0; k < 24; k++) {
                h ^= h >> 29, h *= 0xbf58476d1ce4e5b9ull, h ^= h >> 32;
                id[5 + k] = al[h % 62];
            }
            id[29] = 0;
            json_array_append_new(arr, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function", "name",
                                                 json_string_value(name), "arguments", a ? a : "{}"));
            free(a);
            memcpy(rest + rn, p, (size_t)(o - p)); /* the text before the call */
            rn += (size_t)(o - p);
        } else {
            memcpy(rest + rn, p, (size_t)(cl + strlen(CLOSE) - p)); /* not a call we know: it stays text */
            rn += (size_t)(cl + strlen(CLOSE) - p);
        }
        json_decref(j);
        p = cl + strlen(CLOSE);
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
