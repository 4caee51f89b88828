#include "gw_anthropic.h"
#include "cm_error.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the request ---------------------------------------------------------- */

/* Anthropic's request fields honoured; any other (thinking, service_tier, container, mcp_servers, ...) that is
 * not null is refused by name */
static const char *const KNOWN[] = {"model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p",
                                    "top_k", "stream", "tools", "tool_choice", "metadata", NULL};

#define BAD(p, ...)                                                                                \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        *param = (p);                                                                              \
        goto fail;                                                                                 \
    } while (0)

static int known(const char *k) {
    for (const char *const *p = KNOWN; *p; p++)
        if (!strcmp(*p, k)) return 1;
    return 0;
}

/* A string, or text blocks joined by newlines (a block's cache_control is a hint). NULL when neither. */
static char *text_of(const json_t *v, const char **bad) {
    *bad = NULL;
    if (json_is_string(v)) return strdup(json_string_value(v));
    if (!json_is_array(v)) return NULL;
    size_t n = 0, i;
    json_t *b;
    json_array_foreach(v, i, b) {
        const char *t = json_string_value(json_object_get(b, "type"));
        if (!t || strcmp(t, "text") || !json_is_string(json_object_get(b, "text"))) {
            *bad = t ? t : "?";
            return NULL;
        }
        n += json_string_length(json_object_get(b, "text")) + 1;
    }
    char *s = malloc(n + 1), *o = s;
    if (!s) return NULL;
    json_array_foreach(v, i, b) {
        const json_t *t = json_object_get(b, "text");
        if (i) *o++ = '\n';
        memcpy(o, json_string_value(t), json_string_length(t));
        o += json_string_length(t);
    }
    *o = 0;
    return s;
}

int gw_anth_request(const char *body, size_t len, int count, char **out, size_t *out_len, char *err, size_t errlen,
                    const char **param) {
    *out = NULL;
    *param = NULL;
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je), *r = json_object(), *msgs = json_array(), *v;
    const char *k, *bad;
    char *t = NULL;
    if (!json_is_object(o)) BAD(NULL, "the body is not a JSON object%s%s", o ? "" : ": ", o ? "" : je.text);
    json_object_foreach(o, k, v)
        if (!known(k) && !json_is_null(v)) BAD(NULL, "%.64s: this field is not supported", k); /* (k dies with o) */
    if ((v = json_object_get(o, "model")) && !json_is_string(v)) BAD("model", "model: must be a string");
    if (v) json_object_set(r, "model", v);
    v = json_object_get(o, "max_tokens");
    if (!count && !(json_is_integer(v) && json_integer_value(v) >= 1)) BAD("max_tokens", "max_tokens: Field required (an integer of at least 1)");
    if (!count) json_object_set(r, "max_tokens", v);
    static const char *const num[] = {"temperature", "top_p", "top_k", NULL};
    for (const char *const *n = num; !count && *n; n++)
        if ((v = json_object_get(o, *n)) && !json_is_null(v)) json_object_set(r, *n, v); /* the chat parse checks them */
    if (!count && (v = json_object_get(o, "stop_sequences")) && !json_is_null(v)) json_object_set(r, "stop", v);
    if (!count && json_is_true(json_object_get(o, "stream"))) {
        json_object_set_new(r, "stream", json_true());
        json_object_set_new(r, "stream_options", json_pack("{s:b}", "include_usage", 1)); /* for message_delta's usage */
    }
    if ((v = json_object_get(o, "system")) && !json_is_null(v)) {
        if (!(t = text_of(v, &bad))) BAD("system", "system: a string or text blocks (not '%.32s')", bad ? bad : "this");
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", t));
        free(t), t = NULL;
    }
    json_t *ms = json_object_get(o, "messages"), *m;
    size_t i;
    if (!json_is_array(ms) || !json_array_size(ms)) BAD("messages", "messages: Field required (a non-empty list)");
    json_array_foreach(ms, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *c = json_object_get(m, "content");
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant")))
            BAD("messages", "messages.%zu.role: 'user' or 'assistant'", i);
        if (json_is_string(c)) {
            json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", role, "content", c));
            continue;
        }
        if (!json_is_array(c)) BAD("messages", "messages.%zu.content: a string or a list of content blocks", i);
        /* blocks: text joined; tool_use into the assistant's tool_calls; each tool_result a tool message first */
        json_t *calls = json_array(), *b;
        size_t tl = 0, j;
        int results = 0;
        char *text = calloc(1, 1);
        json_array_foreach(c, j, b) {
            const char *bt = json_string_value(json_object_get(b, "type"));
            bt = bt ? bt : "?";
            if (!strcmp(bt, "text") && json_is_string(json_object_get(b, "text"))) {
                const json_t *x = json_object_get(b, "text");
                char *nt = realloc(text, tl + json_string_length(x) + 2);
                if (!nt) break;
                text = nt;
                if (tl) text[tl++] = '\n';
                memcpy(text + tl, json_string_value(x), json_string_length(x));
                tl += json_string_length(x);
                text[tl] = 0;
            } else if (!strcmp(bt, "tool_use") && !strcmp(role, "assistant") &&
                       json_is_string(json_object_get(b, "id")) && json_is_string(json_object_get(b, "name"))) {
                const json_t *in = json_object_get(b, "input");
                char *args = in ? json_dumps(in, JSON_COMPACT | JSON_ENCODE_ANY) : strdup("{}");
                json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:s}}", "id", json_object_get(b, "id"), "type",
                                                       "function", "function", "name", json_object_get(b, "name"),
                                                       "arguments", args ? args : "{}"));
                free(args);
            } else if (!strcmp(bt, "tool_result") && !strcmp(role, "user") &&
                       json_is_string(json_object_get(b, "tool_use_id"))) {
                json_t *rc = json_object_get(b, "content");
                char *rt = rc ? text_of(rc, &bad) : strdup("");
                if (!rt) {
                    free(text);
                    json_decref(calls);
                    BAD("messages", "messages.%zu.content.%zu: a tool_result's content is a string or text blocks", i, j);
                }
                /* OpenAI's tool message has no error flag: the text says it */
                int is_err = json_is_true(json_object_get(b, "is_error"));
                results++;
                char *full = malloc(strlen(rt) + 8);
                if (full) snprintf(full, strlen(rt) + 8, "%s%s", is_err ? "Error: " : "", rt);
                json_array_append_new(msgs, json_pack("{s:s,s:O,s:s}", "role", "tool", "tool_call_id",
                                                      json_object_get(b, "tool_use_id"), "content", full ? full : rt));
                free(full);
                free(rt);
            } else {
                free(text);
                json_decref(calls);
                BAD("messages", "messages.%zu.content.%zu: content blocks of type '%.32s' are not supported here (text, "
                    "tool_use from the assistant, tool_result from the user)", i, j, bt);
            }
        }
        if (json_array_size(calls)) /* the assistant's text (or null) and its calls */
            json_array_append_new(msgs, json_pack("{s:s,s:o,s:O}", "role", role, "content",
                                                  tl ? json_string(text) : json_null(), "tool_calls", calls));
        else if (tl || !results) /* a user turn of tool results alone is those tool messages */
            json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", role, "content", text ? text : ""));
        free(text);
        json_decref(calls);
    }
    json_object_set(r, "messages", msgs);
    if ((v = json_object_get(o, "tools")) && !json_is_null(v)) {
        if (!json_is_array(v)) BAD("tools", "tools: a list");
        json_t *tools = json_array(), *tool;
        json_array_foreach(v, i, tool) {
            const char *ty = json_string_value(json_object_get(tool, "type"));
            if ((ty && strcmp(ty, "custom")) || !json_is_string(json_object_get(tool, "name"))) {
                json_decref(tools);
                BAD("tools", "tools.%zu: client tools (name, description, input_schema) only, not '%.32s'", i, ty ? ty : "?");
            }
            json_t *fn = json_pack("{s:O}", "name", json_object_get(tool, "name"));
            if (json_is_string(json_object_get(tool, "description"))) json_object_set(fn, "description", json_object_get(tool, "description"));
            json_t *schema = json_object_get(tool, "input_schema");
            json_object_set_new(fn, "parameters", json_is_object(schema) ? json_incref(schema) : json_object());
            json_array_append_new(tools, json_pack("{s:s,s:o}", "type", "function", "function", fn));
        }
        json_object_set_new(r, "tools", tools);
    }
    if (!count && (v = json_object_get(o, "tool_choice")) && !json_is_null(v)) {
        const char *ty = json_string_value(json_object_get(v, "type"));
        json_t *tc = NULL;
        if (ty && !strcmp(ty, "auto")) tc = json_string("auto");
        else if (ty && !strcmp(ty, "any")) tc = json_string("required");
        else if (ty && !strcmp(ty, "none")) tc = json_string("none");
        else if (ty && !strcmp(ty, "tool") && json_is_string(json_object_get(v, "name")))
            tc = json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", json_object_get(v, "name"));
        if (!tc) BAD("tool_choice", "tool_choice: {type: auto | any | tool (with name) | none}");
        json_object_set_new(r, "tool_choice", tc);
        if (json_is_true(json_object_get(v, "disable_parallel_tool_use")))
            json_object_set_new(r, "parallel_tool_calls", json_false());
    }
    json_decref(msgs);
    char *s = json_dumps(r, JSON_COMPACT);
    json_decref(r);
    json_decref(o);
    if (!s) return LLM_ENOMEM;
    *out = s;
    *out_len = strlen(s);
    return 0;
fail:
    free(t);
    json_decref(msgs);
    json_decref(r);
    json_decref(o);
    return LLM_EINVAL;
}

/* ---- the replies ------------------------------------------------------------ */

typedef struct {
    int count;
    int started, errored;
    int open;                 /* the open content block's index, -1: none */
    int kind;                 /* its kind: 0 text, 1 tool_use, 2 thinking */
    int blocks;               /* blocks started */
    int in_tokens, out_tokens;
    const char *stop;         /* stop_reason, once the finish came */
    char *stop_seq;           /* the stop sequence that ended it, or NULL */
} anth;

static const char *error_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

static json_t *error_json(int status, const char *msg) {
    return json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type", error_type(status), "message", msg ? msg : "");
}

void gw_anth_error(gw_conn *c, int status, const char *msg) {
    json_t *j = error_json(status, msg);
    char *s = json_dumps(j, JSON_COMPACT);
    gw_http_body(c, status, "application/json", s ? s : "{}", s ? strlen(s) : 2);
    free(s);
    json_decref(j);
}

static const char *stop_reason(const char *finish, const json_t *stop) {
    if (json_is_string(stop)) return "stop_sequence"; /* vLLM's stop_reason: the stop string that matched */
    if (!finish) return "end_turn";
    if (!strcmp(finish, "length")) return "max_tokens";
    if (!strcmp(finish, "tool_calls")) return "tool_use";
    return "end_turn";
}

/* "chatcmpl-X" -> "msg_X" */
static json_t *msg_id(const json_t *oai) {
    const char *id = json_string_value(json_object_get(oai, "id"));
    const char *dash = id ? strchr(id, '-') : NULL;
    char b[160];
    snprintf(b, sizeof b, "msg_%s", dash ? dash + 1 : id ? id : "0");
    return json_string(b);
}

static json_t *usage(const json_t *u) {
    return json_pack("{s:I,s:I}", "input_tokens", json_integer_value(json_object_get(u, "prompt_tokens")), "output_tokens",
                     json_integer_value(json_object_get(u, "completion_tokens")));
}

static json_t *on_reply(void *ctx, gw_conn *c, int status, const json_t *j) {
    anth *a = ctx;
    const json_t *e = json_object_get(j, "error");
    if (status != 200 || e) return error_json(status == 200 ? 500 : status, json_string_value(json_object_get(e, "message")));
    if (a->count) return json_pack("{s:O}", "input_tokens", json_object_get(j, "count"));
    const json_t *ch = json_array_get(json_object_get(j, "choices"), 0), *m = json_object_get(ch, "message");
    json_t *content = json_array(), *tc, *x;
    size_t i;
    if ((x = json_object_get(m, "reasoning_content")) && json_string_length(x))
        json_array_append_new(content, json_pack("{s:s,s:O,s:s}", "type", "thinking", "thinking", x, "signature", ""));
    if ((x = json_object_get(m, "content")) && json_string_length(x))
        json_array_append_new(content, json_pack("{s:s,s:O}", "type", "text", "text", x));
    json_array_foreach(json_object_get(m, "tool_calls"), i, tc) {
        const json_t *fn = json_object_get(tc, "function");
        json_t *input = json_loads(json_string_value(json_object_get(fn, "arguments")) ? json_string_value(json_object_get(fn, "arguments")) : "{}", 0, NULL);
        json_array_append_new(content, json_pack("{s:s,s:O,s:O,s:o}", "type", "tool_use", "id", json_object_get(tc, "id"),
                                                 "name", json_object_get(fn, "name"), "input", input ? input : json_object()));
    }
    const json_t *sr = json_object_get(ch, "stop_reason");
    return json_pack("{s:o,s:s,s:s,s:O,s:o,s:s,s:O,s:o}", "id", msg_id(j), "type", "message", "role", "assistant", "model",
                     json_object_get(j, "model"), "content", content, "stop_reason",
                     stop_reason(json_string_value(json_object_get(ch, "finish_reason")), sr), "stop_sequence",
                     json_is_string(sr) ? sr : json_null(), "usage", usage(json_object_get(j, "usage")));
}

static void ev(gw_conn *c, const char *name, json_t *j) {
    gw_http_stream_named(c, name, j);
    json_decref(j);
}

static void close_block(anth *a, gw_conn *c) {
    if (a->open < 0) return;
    ev(c, "content_block_stop", json_pack("{s:s,s:i}", "type", "content_block_stop", "index", a->open));
    a->open = -1;
}

static void open_block(anth *a, gw_conn *c, int kind, json_t *block) {
    close_block(a, c);
    a->open = a->blocks++;
    a->kind = kind;
    ev(c, "content_block_start", json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", a->open,
                                           "content_block", block));
}

static void start(anth *a, gw_conn *c, const json_t *first) {
    a->started = 1;
    ev(c, "message_start", json_pack("{s:s,s:{s:o,s:s,s:s,s:O*,s:[],s:n,s:n,s:{s:i,s:i}}}", "type", "message_start",
                                     "message", "id", msg_id(first), "type", "message", "role", "assistant", "model",
                                     json_object_get(first, "model"), "content", "stop_reason", "stop_sequence", "usage",
                                     "input_tokens", 0, "output_tokens", 0));
    ev(c, "ping", json_pack("{s:s}", "type", "ping"));
}

static void on_event(void *ctx, gw_conn *c, const json_t *j) {
    anth *a = ctx;
    const json_t *e = json_object_get(j, "error");
    if (e) {
        a->errored = 1;
        ev(c, "error", error_json(500, json_string_value(json_object_get(e, "message"))));
        return;
    }
    const json_t *u = json_object_get(j, "usage"), *ch = json_array_get(json_object_get(j, "choices"), 0);
    if (u) {
        a->in_tokens = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
        a->out_tokens = (int)json_integer_value(json_object_get(u, "completion_tokens"));
    }
    if (!ch) return;
    if (!a->started) start(a, c, j);
    const json_t *d = json_object_get(ch, "delta"), *x, *tc;
    if ((x = json_object_get(d, "reasoning_content")) && json_string_length(x)) {
        if (a->open < 0 || a->kind != 2) open_block(a, c, 2, json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", ""));
        ev(c, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:O}}", "type", "content_block_delta", "index", a->open, "delta",
                                               "type", "thinking_delta", "thinking", x));
    }
    if ((x = json_object_get(d, "content")) && json_string_length(x)) {
        if (a->open < 0 || a->kind != 0) open_block(a, c, 0, json_pack("{s:s,s:s}", "type", "text", "text", ""));
        ev(c, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:O}}", "type", "content_block_delta", "index", a->open, "delta",
                                               "type", "text_delta", "text", x));
    }
    size_t i;
    json_array_foreach(json_object_get(d, "tool_calls"), i, tc) {
        const json_t *fn = json_object_get(tc, "function");
        if (json_object_get(tc, "id"))
            open_block(a, c, 1, json_pack("{s:s,s:O,s:O,s:{}}", "type", "tool_use", "id", json_object_get(tc, "id"), "name",
                                          json_object_get(fn, "name"), "input"));
        if ((x = json_object_get(fn, "arguments")) && json_string_length(x) && a->open >= 0 && a->kind == 1)
            ev(c, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:O}}", "type", "content_block_delta", "index", a->open,
                                                   "delta", "type", "input_json_delta", "partial_json", x));
    }
    if ((x = json_object_get(ch, "finish_reason")) && json_is_string(x)) {
        const json_t *sr = json_object_get(ch, "stop_reason");
        a->stop = stop_reason(json_string_value(x), sr);
        if (json_is_string(sr) && !a->stop_seq) a->stop_seq = strdup(json_string_value(sr));
    }
}

static void on_end(void *ctx, gw_conn *c) {
    anth *a = ctx;
    if (a->errored) return;
    if (!a->started) start(a, c, json_object());
    close_block(a, c);
    ev(c, "message_delta", json_pack("{s:s,s:{s:s,s:s?},s:{s:i,s:i}}", "type", "message_delta", "delta", "stop_reason",
                                     a->stop ? a->stop : "end_turn", "stop_sequence", a->stop_seq, "usage", "input_tokens",
                                     a->in_tokens, "output_tokens", a->out_tokens));
    ev(c, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static void anth_free(void *ctx) {
    anth *a = ctx;
    free(a->stop_seq);
    free(a);
}

int gw_anth_attach(gw_conn *c, int count) {
    anth *a = calloc(1, sizeof *a);
    if (!a) return LLM_ENOMEM;
    a->count = count;
    a->open = -1;
    gw_http_filter f = {on_reply, on_event, on_end, anth_free, a};
    gw_http_set_filter(c, &f);
    return 0;
}
