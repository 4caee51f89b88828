#include "gw_responses.h"
#include "cm_error.h"
#include "cm_log.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* ---- the request ----------------------------------------------------------------- */

/* Fields honoured (or, for the identifiers and hints, harmless); any other that is not null is refused by name */
static const char *const KNOWN[] = {"model", "input", "instructions", "tools", "tool_choice", "text", "stream",
                                    "max_output_tokens", "temperature", "top_p", "previous_response_id", "store",
                                    "metadata", "parallel_tool_calls", "user", "safety_identifier", "prompt_cache_key",
                                    "service_tier", "truncation", "reasoning", "include", "background", "top_logprobs",
                                    "stream_options", "seed", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                                    "repetition_penalty", "structured_outputs", NULL};
/* passed to the chat request as they are (its parse checks them) */
static const char *const SAME[] = {"model", "temperature", "top_p", "parallel_tool_calls", "user", "seed", "top_k",
                                   "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                                   "structured_outputs", NULL}; /* (vLLM's: a regex, a choice, a grammar) */

#define BAD(p, ...)                                                                                \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        *param = (p);                                                                              \
        goto fail;                                                                                 \
    } while (0)

static int in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

static int absent(const json_t *v) { return !v || json_is_null(v); }

/* The text of a message's content: a string, or its text parts joined by newlines. NULL with *bad the first
 * part that is not text (its type). */
static char *text_of(const json_t *v, const char **bad) {
    *bad = NULL;
    if (json_is_string(v)) return strdup(json_string_value(v));
    if (!json_is_array(v)) {
        *bad = "?";
        return NULL;
    }
    size_t n = 1, i;
    json_t *p;
    json_array_foreach(v, i, p) {
        const char *t = json_string_value(json_object_get(p, "type"));
        const char *key = t && !strcmp(t, "refusal") ? "refusal" : "text";
        if (!t || (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text") && strcmp(t, "refusal")) ||
            !json_is_string(json_object_get(p, key))) {
            *bad = t ? t : "?";
            return NULL;
        }
        n += json_string_length(json_object_get(p, key)) + 1;
    }
    char *s = malloc(n), *o = s;
    if (!s) return NULL;
    json_array_foreach(v, i, p) {
        const char *t = json_string_value(json_object_get(p, "type"));
        const json_t *x = json_object_get(p, strcmp(t, "refusal") ? "text" : "refusal");
        if (i) *o++ = '\n';
        memcpy(o, json_string_value(x), json_string_length(x));
        o += json_string_length(x);
    }
    *o = 0;
    return s;
}

/* The input items as chat messages, appended to conv. */
static int input_items(const json_t *in, json_t *conv, char *err, size_t errlen, const char **param) {
    if (json_is_string(in)) {
        json_array_append_new(conv, json_pack("{s:s,s:O}", "role", "user", "content", in));
        return 0;
    }
    if (!json_is_array(in)) BAD("input", "input: a string or a list of input items");
    size_t i;
    json_t *it;
    json_array_foreach(in, i, it) {
        if (!json_is_object(it)) BAD("input", "input.%zu: an input item (an object)", i);
        const char *ty = json_string_value(json_object_get(it, "type")), *bad;
        const char *role = json_string_value(json_object_get(it, "role"));
        if (!ty || !strcmp(ty, "message")) {
            if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                          strcmp(role, "developer")))
                BAD("input", "input.%zu.role: 'user', 'assistant', 'system' or 'developer'", i);
            char *t = text_of(json_object_get(it, "content"), &bad);
            if (!t && bad)
                BAD("input", "input.%zu.content: '%.32s' content is not supported (text parts only: input_text, "
                    "output_text, refusal)", i, bad);
            if (!t) return LLM_ENOMEM;
            json_array_append_new(conv, json_pack("{s:s,s:s}", "role", strcmp(role, "developer") ? role : "system",
                                                  "content", t));
            free(t);
        } else if (!strcmp(ty, "function_call")) {
            const json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
            const json_t *args = json_object_get(it, "arguments");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args))
                BAD("input", "input.%zu: a function_call item has call_id, name and arguments (strings)", i);
            json_t *last = json_array_get(conv, json_array_size(conv) - 1), *calls;
            const char *lr = json_string_value(json_object_get(last, "role"));
            if (!lr || strcmp(lr, "assistant")) { /* the calls' own assistant turn */
                last = json_pack("{s:s,s:n}", "role", "assistant", "content");
                json_array_append_new(conv, last);
            }
            if (!(calls = json_object_get(last, "tool_calls"))) json_object_set_new(last, "tool_calls", calls = json_array());
            json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function", "function",
                                                   "name", name, "arguments", args));
        } else if (!strcmp(ty, "function_call_output")) {
            const json_t *id = json_object_get(it, "call_id");
            char *t = json_is_string(id) ? text_of(json_object_get(it, "output"), &bad) : NULL;
            if (!t)
                BAD("input", "input.%zu: a function_call_output item has call_id and output (a string or text parts)", i);
            json_array_append_new(conv, json_pack("{s:s,s:O,s:s}", "role", "tool", "tool_call_id", id, "content", t));
            free(t);
        } else if (!strcmp(ty, "reasoning")) {
            /* a past turn's reasoning: the chat templates leave it out of the prompt, and so does this */
        } else {
            BAD("input", "input.%zu: items of type '%.32s' are not supported (message, function_call, "
                "function_call_output, reasoning)", i, ty);
        }
    }
    return 0;
fail:
    return LLM_EINVAL;
}

/* Function tools as chat tools. */
static json_t *chat_tools(const json_t *v, char *err, size_t errlen, const char **param) {
    json_t *tools = json_array(), *t;
    size_t i;
    if (!json_is_array(v)) BAD("tools", "tools: a list");
    json_array_foreach(v, i, t) {
        const char *ty = json_string_value(json_object_get(t, "type"));
        if (!ty || strcmp(ty, "function") || !json_is_string(json_object_get(t, "name")))
            BAD("tools", "tools.%zu: function tools only (type 'function' with a name), not '%.32s'", i, ty ? ty : "?");
        json_t *fn = json_pack("{s:O}", "name", json_object_get(t, "name"));
        if (json_is_string(json_object_get(t, "description"))) json_object_set(fn, "description", json_object_get(t, "description"));
        const json_t *p = json_object_get(t, "parameters");
        json_object_set_new(fn, "parameters", json_is_object(p) ? json_incref((json_t *)p) : json_object());
        json_array_append_new(tools, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    }
    return tools;
fail:
    json_decref(tools);
    return NULL;
}

static json_t *chat_tool_choice(const json_t *v, char *err, size_t errlen, const char **param) {
    const char *s = json_string_value(v), *ty = json_string_value(json_object_get(v, "type"));
    if (s && (!strcmp(s, "auto") || !strcmp(s, "none") || !strcmp(s, "required"))) return json_string(s);
    if (ty && !strcmp(ty, "function") && json_is_string(json_object_get(v, "name")))
        return json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", json_object_get(v, "name"));
    snprintf(err, errlen, "tool_choice: 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}");
    *param = "tool_choice";
    return NULL;
}

/* text.format as the chat's response_format (the same grammar engine). */
static int text_format(const json_t *text, json_t *chat, char *err, size_t errlen, const char **param) {
    const char *k;
    json_t *v;
    if (!json_is_object(text)) BAD("text", "text: an object ({\"format\": ...})");
    json_object_foreach((json_t *)text, k, v) {
        if (!strcmp(k, "verbosity")) {
            if (!absent(v) && (!json_is_string(v) || strcmp(json_string_value(v), "medium")))
                BAD("text.verbosity", "text.verbosity: only 'medium' (this server does not steer length)");
        } else if (strcmp(k, "format")) {
            BAD("text", "text.%.32s: this field is not supported", k);
        }
    }
    const json_t *f = json_object_get(text, "format");
    if (absent(f)) return 0;
    const char *ty = json_string_value(json_object_get(f, "type"));
    if (ty && !strcmp(ty, "text")) return 0;
    if (ty && !strcmp(ty, "json_object")) {
        json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
        return 0;
    }
    if (ty && !strcmp(ty, "json_schema") && json_is_object(json_object_get(f, "schema"))) {
        const char *nm = json_string_value(json_object_get(f, "name"));
        json_t *js = json_pack("{s:s,s:O}", "name", nm ? nm : "response", "schema", json_object_get(f, "schema"));
        json_object_set_new(chat, "response_format", json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js));
        return 0;
    }
    BAD("text.format", "text.format: {type: text | json_object | json_schema (with a schema)}");
fail:
    return LLM_EINVAL;
}

/* The settled fields: accepted at these values only. */
static int settled(const json_t *o, char *err, size_t errlen, const char **param) {
    const json_t *v;
    if (!absent(v = json_object_get(o, "truncation")) && (!json_is_string(v) || strcmp(json_string_value(v), "disabled")))
        BAD("truncation", "truncation: only 'disabled' (a prompt over the context is refused)");
    if (!absent(v = json_object_get(o, "background")) && !json_is_false(v))
        BAD("background", "background: background responses are not supported");
    if (!absent(v = json_object_get(o, "include")) && (!json_is_array(v) || json_array_size(v)))
        BAD("include", "include: no extra output data is supported (an empty list)");
    if (!absent(v = json_object_get(o, "top_logprobs")) && !(json_is_integer(v) && !json_integer_value(v)))
        BAD("top_logprobs", "top_logprobs: not supported on /v1/responses (use /v1/chat/completions)");
    if (!absent(v = json_object_get(o, "reasoning"))) {
        if (!json_is_object(v)) BAD("reasoning", "reasoning: an object");
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x)
            if (!absent(x))
                BAD("reasoning", "reasoning.%.32s: not supported (a reasoning model thinks as its chat template says)", k);
    }
    if (!absent(v = json_object_get(o, "service_tier")) &&
        (!json_is_string(v) || (strcmp(json_string_value(v), "auto") && strcmp(json_string_value(v), "default"))))
        BAD("service_tier", "service_tier: 'auto' or 'default' (one tier here)");
    if (!absent(v = json_object_get(o, "stream_options"))) {
        const char *k;
        json_t *x;
        if (!json_is_object(v)) BAD("stream_options", "stream_options: an object");
        json_object_foreach((json_t *)v, k, x)
            if (strcmp(k, "include_obfuscation")) BAD("stream_options", "stream_options.%.32s: not supported", k);
    }
    if (!absent(v = json_object_get(o, "metadata")) && !json_is_object(v)) BAD("metadata", "metadata: an object");
    if (!absent(v = json_object_get(o, "store")) && !json_is_boolean(v)) BAD("store", "store: a boolean");
    if (!absent(v = json_object_get(o, "stream")) && !json_is_boolean(v)) BAD("stream", "stream: a boolean");
    if (!absent(v = json_object_get(o, "instructions")) && !json_is_string(v))
        BAD("instructions", "instructions: a string");
    if (!absent(v = json_object_get(o, "previous_response_id")) && !json_is_string(v))
        BAD("previous_response_id", "previous_response_id: a string");
    return 0;
fail:
    return LLM_EINVAL;
}

/* The chat request of o (a Responses request), and the conversation (chat messages, without the instructions)
 * that the stored response keeps: prev's (a stored record) and this input's. */
static int translate(const json_t *o, const json_t *prev, json_t **chat_out, json_t **conv_out, char *err,
                     size_t errlen, const char **param) {
    json_t *chat = json_object(), *conv = json_array(), *v, *msgs = NULL;
    const char *k;
    int rc = LLM_EINVAL;
    *chat_out = *conv_out = NULL;
    json_object_foreach((json_t *)o, k, v)
        if (!in_list(KNOWN, k) && !absent(v)) BAD(NULL, "%.64s: this field is not supported on /v1/responses", k);
    if (settled(o, err, errlen, param)) goto fail;
    for (const char *const *s = SAME; *s; s++)
        if (!absent(v = json_object_get(o, *s))) json_object_set(chat, *s, v);
    if (!absent(v = json_object_get(o, "max_output_tokens"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 1) BAD("max_output_tokens", "max_output_tokens: an integer of at least 1");
        json_object_set(chat, "max_tokens", v);
    }
    if (json_is_true(json_object_get(o, "stream"))) {
        json_object_set_new(chat, "stream", json_true());
        json_object_set_new(chat, "stream_options", json_pack("{s:b}", "include_usage", 1));
    }
    if (!absent(v = json_object_get(o, "text")) && text_format(v, chat, err, errlen, param)) goto fail;
    if (!absent(v = json_object_get(o, "tools"))) {
        json_t *t = chat_tools(v, err, errlen, param);
        if (!t) goto fail;
        json_object_set_new(chat, "tools", t);
    }
    if (!absent(v = json_object_get(o, "tool_choice"))) {
        json_t *t = chat_tool_choice(v, err, errlen, param);
        if (!t) goto fail;
        json_object_set_new(chat, "tool_choice", t);
    }
    if (prev) {
        const json_t *pm = json_object_get(prev, "messages");
        if (!json_is_array(pm)) BAD("previous_response_id", "previous_response_id: the stored response is unreadable");
        json_array_extend(conv, (json_t *)pm);
    }
    v = json_object_get(o, "input");
    if (absent(v)) BAD("input", "input: Field required (a string or a list of input items)");
    if ((rc = input_items(v, conv, err, errlen, param))) goto fail;
    rc = LLM_EINVAL;
    if (!json_array_size(conv)) BAD("input", "input: no message to answer");
    msgs = json_array();
    if (json_is_string(v = json_object_get(o, "instructions")))
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", v));
    json_array_extend(msgs, conv);
    json_object_set_new(chat, "messages", msgs);
    *chat_out = chat;
    *conv_out = conv;
    return 0;
fail:
    json_decref(chat);
    json_decref(conv);
    return rc;
}

int gw_resp_chat_body(const char *body, size_t len, const char *prev, size_t prev_len, char **out, char *err,
                      size_t errlen, const char **param) {
    *out = NULL;
    *param = NULL;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL), *p = prev ? json_loadb(prev, prev_len, 0, NULL) : NULL;
    json_t *chat = NULL, *conv = NULL;
    int rc = LLM_EINVAL;
    if (!json_is_object(o)) snprintf(err, errlen, "the body is not a JSON object");
    else if (!(rc = translate(o, p, &chat, &conv, err, errlen, param)) && !(*out = json_dumps(chat, JSON_COMPACT)))
        rc = LLM_ENOMEM;
    json_decref(chat);
    json_decref(conv);
    json_decref(p);
    json_decref(o);
    return rc;
}

/* ---- the reply ------------------------------------------------------------------- */

enum { IT_NONE, IT_REASONING, IT_MESSAGE, IT_CALL };

typedef struct {
    json_t *req;                  /* the Responses request */
    json_t *conv;                 /* the conversation (chat messages) this reply continues */
    gw_rstore *st;
    char key[200];                /* the store's key: tenant:id */
    char id[48], model[256];
    long long created;
    int store;
    /* streaming */
    int seq, started, errored;
    json_t *items;                /* output items done */
    int open;                     /* the open item's IT_ */
    char item_id[40], call_id[128], name[128];
    char *text;                   /* the open item's text (or arguments) */
    size_t tl, tcap;
    char finish[16];
    json_t *usage;                /* the chat's */
} resp;

static void rand_id(char *out, size_t n, const char *prefix) {
    unsigned char b[16] = {0};
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) { /* never on Linux for 16 bytes; still unique enough */
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        memcpy(b, &t, sizeof t < sizeof b ? sizeof t : sizeof b);
    }
    int o = snprintf(out, n, "%s", prefix);
    for (int i = 0; i < 16 && (size_t)o + 2 < n; i++) o += snprintf(out + o, n - (size_t)o, "%02x", b[i]);
}

static json_t *get_or(const json_t *o, const char *k, json_t *def) {
    const json_t *v = json_object_get(o, k);
    if (absent(v)) return def;
    json_decref(def);
    return json_incref((json_t *)v);
}

static json_t *usage_of(const json_t *u) {
    json_int_t in = json_integer_value(json_object_get(u, "prompt_tokens"));
    json_int_t out = json_integer_value(json_object_get(u, "completion_tokens"));
    json_int_t cached = json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    /* cache_write_tokens: a prompt's blocks enter the prefix cache as a side effect, not as a billed write: 0 */
    return json_pack("{s:I,s:{s:I,s:i},s:I,s:{s:i},s:I}", "input_tokens", in, "input_tokens_details", "cached_tokens",
                     cached, "cache_write_tokens", 0, "output_tokens", out, "output_tokens_details", "reasoning_tokens", 0, "total_tokens", in + out);
}

/* The Response object; output and usage taken (usage NULL: null). */
static json_t *response_obj(const resp *x, const char *status, json_t *output, json_t *usage, const char *incomplete,
                            const char *error) {
    const json_t *q = x->req;
    json_t *tools = json_array(), *t;
    size_t i;
    json_array_foreach(json_object_get(q, "tools"), i, t) json_array_append(tools, t);
    json_t *r = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o}", "id", x->id, "object", "response", "created_at",
                          (json_int_t)x->created, "status", status, "model", x->model, "output", output);
    json_object_set_new(r, "error", error ? json_pack("{s:s,s:s}", "code", "server_error", "message", error) : json_null());
    json_object_set_new(r, "incomplete_details", incomplete ? json_pack("{s:s}", "reason", incomplete) : json_null());
    json_object_set_new(r, "instructions", get_or(q, "instructions", json_null()));
    json_object_set_new(r, "max_output_tokens", get_or(q, "max_output_tokens", json_null()));
    json_object_set_new(r, "metadata", get_or(q, "metadata", json_object()));
    json_object_set_new(r, "parallel_tool_calls", get_or(q, "parallel_tool_calls", json_true()));
    json_object_set_new(r, "previous_response_id", get_or(q, "previous_response_id", json_null()));
    json_object_set_new(r, "reasoning", json_pack("{s:n,s:n}", "effort", "summary"));
    json_object_set_new(r, "store", json_boolean(x->store));
    json_object_set_new(r, "temperature", get_or(q, "temperature", json_real(1.0)));
    json_object_set_new(r, "text", get_or(q, "text", json_pack("{s:{s:s}}", "format", "type", "text")));
    json_object_set_new(r, "tool_choice", get_or(q, "tool_choice", json_string("auto")));
    json_object_set_new(r, "tools", tools);
    json_object_set_new(r, "top_p", get_or(q, "top_p", json_real(1.0)));
    json_object_set_new(r, "truncation", json_string("disabled"));
    json_object_set_new(r, "user", get_or(q, "user", json_null()));
    json_object_set_new(r, "background", json_false());
    json_object_set_new(r, "usage", usage ? usage : json_null());
    return r;
}

static json_t *reasoning_item(const char *id, const char *text, const char *status) {
    return json_pack("{s:s,s:s,s:[],s:[{s:s,s:s}],s:s}", "type", "reasoning", "id", id, "summary", "content", "type",
                     "reasoning_text", "text", text, "status", status);
}

static json_t *text_part(const char *text) {
    return json_pack("{s:s,s:s,s:[],s:[]}", "type", "output_text", "text", text, "annotations", "logprobs");
}

static json_t *message_item(const char *id, const char *text, const char *status) {
    json_t *m = json_pack("{s:s,s:s,s:s,s:s,s:[]}", "type", "message", "id", id, "status", status, "role", "assistant",
                          "content");
    if (text) json_array_append_new(json_object_get(m, "content"), text_part(text));
    return m;
}

static json_t *call_item(const char *id, const char *call_id, const char *name, const char *args, const char *status) {
    return json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "type", "function_call", "id", id, "call_id", call_id, "name", name,
                     "arguments", args, "status", status);
}

/* The assistant's chat message of the output items (for the conversation a continuation reads). */
static json_t *assistant_msg(const json_t *items) {
    json_t *m = json_pack("{s:s,s:n}", "role", "assistant", "content"), *it, *calls = json_array();
    size_t i;
    json_array_foreach(items, i, it) {
        const char *ty = json_string_value(json_object_get(it, "type"));
        if (!strcmp(ty, "message"))
            json_object_set(m, "content", json_object_get(json_array_get(json_object_get(it, "content"), 0), "text"));
        else if (!strcmp(ty, "function_call"))
            json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", json_object_get(it, "call_id"), "type",
                                                   "function", "function", "name", json_object_get(it, "name"),
                                                   "arguments", json_object_get(it, "arguments")));
    }
    if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    else if (json_is_null(json_object_get(m, "content"))) json_object_set_new(m, "content", json_string(""));
    json_decref(calls);
    return m;
}

/* ---- storing, then ending the reply ----------------------------------------------------- */

typedef struct {
    gw_conn *c;                   /* NULL once the client has gone */
    json_t *last;                 /* a stream's last event, sent once stored */
    char key[200];
} pput;

static void pput_gone(void *arg) { ((pput *)arg)->c = NULL; }

static void on_stored(void *arg, int rc, const char *val, size_t len) {
    pput *p = arg;
    (void)val, (void)len;
    if (rc) CM_WARN("response %s was not stored (%s): a continuation of it will not find it", p->key, cm_strerror(rc));
    if (p->c) {
        gw_http_on_gone(p->c, NULL, NULL);
        if (p->last) gw_http_stream_named(p->c, json_string_value(json_object_get(p->last, "type")), p->last);
        gw_http_release(p->c);
    }
    json_decref(p->last);
    free(p);
}

/* Holds the reply's end until the response is stored (last: a stream's last event). */
static void store_then_end(resp *x, gw_conn *c, json_t *response, json_t *last) {
    json_t *rec = json_pack("{s:O,s:O}", "response", response, "messages", x->conv);
    char *s = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    pput *p = s ? calloc(1, sizeof *p) : NULL;
    json_decref(rec);
    if (!p) {
        CM_WARN("response %s was not stored: out of memory", x->id);
        if (last) gw_http_stream_named(c, json_string_value(json_object_get(last, "type")), last);
        json_decref(last);
        free(s);
        return;
    }
    p->c = c;
    p->last = last;
    snprintf(p->key, sizeof p->key, "%s", x->key);
    gw_http_hold(c);
    gw_http_on_gone(c, pput_gone, p);
    gw_rstore_put(x->st, x->key, s, strlen(s), on_stored, p);
    free(s);
}

static const char *status_of(const char *finish, const char **incomplete) {
    *incomplete = finish && !strcmp(finish, "length") ? "max_output_tokens" : NULL;
    return *incomplete ? "incomplete" : "completed";
}

static json_t *on_reply(void *ctx, gw_conn *c, int status, const json_t *j) {
    resp *x = ctx;
    if (status != 200 || json_object_get(j, "error")) return NULL; /* OpenAI's error shape, as it is */
    const json_t *ch = json_array_get(json_object_get(j, "choices"), 0), *m = json_object_get(ch, "message"), *v, *tc;
    snprintf(x->model, sizeof x->model, "%s", json_string_value(json_object_get(j, "model")) ? json_string_value(json_object_get(j, "model")) : "");
    json_t *items = json_array();
    char id[40];
    size_t i;
    if ((v = json_object_get(m, "reasoning_content")) && json_string_length(v)) {
        rand_id(id, sizeof id, "rs_");
        json_array_append_new(items, reasoning_item(id, json_string_value(v), "completed"));
    }
    if ((v = json_object_get(m, "content")) && json_string_length(v)) {
        rand_id(id, sizeof id, "msg_");
        json_array_append_new(items, message_item(id, json_string_value(v), "completed"));
    }
    json_array_foreach(json_object_get(m, "tool_calls"), i, tc) {
        const json_t *fn = json_object_get(tc, "function");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        rand_id(id, sizeof id, "fc_");
        json_array_append_new(items, call_item(id, json_string_value(json_object_get(tc, "id")) ? json_string_value(json_object_get(tc, "id")) : id,
                                               json_string_value(json_object_get(fn, "name")) ? json_string_value(json_object_get(fn, "name")) : "",
                                               args ? args : "{}", "completed"));
    }
    json_array_append_new(x->conv, assistant_msg(items));
    const char *inc, *st = status_of(json_string_value(json_object_get(ch, "finish_reason")), &inc);
    json_t *r = response_obj(x, st, items, usage_of(json_object_get(j, "usage")), inc, NULL);
    if (x->store) store_then_end(x, c, r, NULL);
    return r;
}

static void ev(resp *x, gw_conn *c, const char *type, json_t *j) {
    json_object_set_new(j, "type", json_string(type));
    json_object_set_new(j, "sequence_number", json_integer(x->seq++));
    gw_http_stream_named(c, type, j);
    json_decref(j);
}

static void start(resp *x, gw_conn *c) {
    x->started = 1;
    ev(x, c, "response.created", json_pack("{s:o}", "response", response_obj(x, "in_progress", json_array(), NULL, NULL, NULL)));
    ev(x, c, "response.in_progress", json_pack("{s:o}", "response", response_obj(x, "in_progress", json_array(), NULL, NULL, NULL)));
}

static void add_text(resp *x, const char *s, size_t n) {
    if (x->tl + n + 1 > x->tcap) {
        size_t cap = (x->tl + n + 1) * 2;
        char *t = realloc(x->text, cap);
        if (!t) return;
        x->text = t;
        x->tcap = cap;
    }
    memcpy(x->text + x->tl, s, n);
    x->tl += n;
    x->text[x->tl] = 0;
}

static void close_item(resp *x, gw_conn *c) {
    if (x->open == IT_NONE) return;
    int idx = (int)json_array_size(x->items);
    const char *t = x->text ? x->text : "";
    json_t *item;
    if (x->open == IT_REASONING) {
        ev(x, c, "response.reasoning_text.done", json_pack("{s:s,s:i,s:i,s:s}", "item_id", x->item_id, "output_index", idx,
                                                           "content_index", 0, "text", t));
        ev(x, c, "response.content_part.done", json_pack("{s:s,s:i,s:i,s:{s:s,s:s}}", "item_id", x->item_id, "output_index",
                                                         idx, "content_index", 0, "part", "type", "reasoning_text", "text", t));
        item = reasoning_item(x->item_id, t, "completed");
    } else if (x->open == IT_MESSAGE) {
        ev(x, c, "response.output_text.done", json_pack("{s:s,s:i,s:i,s:s,s:[]}", "item_id", x->item_id, "output_index", idx,
                                                        "content_index", 0, "text", t, "logprobs"));
        ev(x, c, "response.content_part.done", json_pack("{s:s,s:i,s:i,s:o}", "item_id", x->item_id, "output_index", idx,
                                                         "content_index", 0, "part", text_part(t)));
        item = message_item(x->item_id, t, "completed");
    } else {
        ev(x, c, "response.function_call_arguments.done", json_pack("{s:s,s:i,s:s,s:s}", "item_id", x->item_id,
                                                                    "output_index", idx, "name", x->name, "arguments", t));
        item = call_item(x->item_id, x->call_id, x->name, t, "completed");
    }
    ev(x, c, "response.output_item.done", json_pack("{s:i,s:O}", "output_index", idx, "item", item));
    json_array_append_new(x->items, item);
    x->open = IT_NONE;
    x->tl = 0;
    if (x->text) x->text[0] = 0;
}

static void open_item(resp *x, gw_conn *c, int kind, const json_t *call) {
    close_item(x, c);
    int idx = (int)json_array_size(x->items);
    x->open = kind;
    json_t *item;
    if (kind == IT_REASONING) {
        rand_id(x->item_id, sizeof x->item_id, "rs_");
        item = json_pack("{s:s,s:s,s:[],s:[],s:s}", "type", "reasoning", "id", x->item_id, "summary", "content", "status",
                         "in_progress");
    } else if (kind == IT_MESSAGE) {
        rand_id(x->item_id, sizeof x->item_id, "msg_");
        item = message_item(x->item_id, NULL, "in_progress");
    } else {
        rand_id(x->item_id, sizeof x->item_id, "fc_");
        const char *cid = json_string_value(json_object_get(call, "id"));
        const char *nm = json_string_value(json_object_get(json_object_get(call, "function"), "name"));
        snprintf(x->call_id, sizeof x->call_id, "%s", cid ? cid : x->item_id);
        snprintf(x->name, sizeof x->name, "%s", nm ? nm : "");
        item = call_item(x->item_id, x->call_id, x->name, "", "in_progress");
    }
    ev(x, c, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", idx, "item", item));
    if (kind == IT_REASONING)
        ev(x, c, "response.content_part.added", json_pack("{s:s,s:i,s:i,s:{s:s,s:s}}", "item_id", x->item_id, "output_index",
                                                          idx, "content_index", 0, "part", "type", "reasoning_text", "text", ""));
    else if (kind == IT_MESSAGE)
        ev(x, c, "response.content_part.added", json_pack("{s:s,s:i,s:i,s:o}", "item_id", x->item_id, "output_index", idx,
                                                          "content_index", 0, "part", text_part("")));
}

static void on_event(void *ctx, gw_conn *c, const json_t *j) {
    resp *x = ctx;
    if (x->errored) return;
    if (!x->model[0] && json_is_string(json_object_get(j, "model")))
        snprintf(x->model, sizeof x->model, "%s", json_string_value(json_object_get(j, "model")));
    if (!x->started) start(x, c);
    const json_t *e = json_object_get(j, "error");
    if (e) {
        x->errored = 1;
        const char *msg = json_string_value(json_object_get(e, "message"));
        ev(x, c, "response.failed", json_pack("{s:o}", "response", response_obj(x, "failed", json_array(), NULL, NULL,
                                                                                 msg ? msg : "generation failed")));
        return;
    }
    const json_t *u = json_object_get(j, "usage"), *ch = json_array_get(json_object_get(j, "choices"), 0), *d, *v, *tc;
    if (json_is_object(u)) {
        json_decref(x->usage);
        x->usage = json_incref((json_t *)u);
    }
    if (!ch) return;
    d = json_object_get(ch, "delta");
    int idx;
    if ((v = json_object_get(d, "reasoning_content")) && json_string_length(v)) {
        if (x->open != IT_REASONING) open_item(x, c, IT_REASONING, NULL);
        idx = (int)json_array_size(x->items);
        add_text(x, json_string_value(v), json_string_length(v));
        ev(x, c, "response.reasoning_text.delta", json_pack("{s:s,s:i,s:i,s:O}", "item_id", x->item_id, "output_index", idx,
                                                            "content_index", 0, "delta", v));
    }
    if ((v = json_object_get(d, "content")) && json_string_length(v)) {
        if (x->open != IT_MESSAGE) open_item(x, c, IT_MESSAGE, NULL);
        idx = (int)json_array_size(x->items);
        add_text(x, json_string_value(v), json_string_length(v));
        ev(x, c, "response.output_text.delta", json_pack("{s:s,s:i,s:i,s:O,s:[]}", "item_id", x->item_id, "output_index", idx,
                                                         "content_index", 0, "delta", v, "logprobs"));
    }
    size_t i;
    json_array_foreach(json_object_get(d, "tool_calls"), i, tc) {
        if (json_is_string(json_object_get(tc, "id"))) open_item(x, c, IT_CALL, tc);
        v = json_object_get(json_object_get(tc, "function"), "arguments");
        if (x->open != IT_CALL || !json_string_length(v)) continue;
        idx = (int)json_array_size(x->items);
        add_text(x, json_string_value(v), json_string_length(v));
        ev(x, c, "response.function_call_arguments.delta", json_pack("{s:s,s:i,s:O}", "item_id", x->item_id, "output_index",
                                                                     idx, "delta", v));
    }
    if (json_is_string(v = json_object_get(ch, "finish_reason")))
        snprintf(x->finish, sizeof x->finish, "%s", json_string_value(v));
}

static void on_end(void *ctx, gw_conn *c) {
    resp *x = ctx;
    if (x->errored) return; /* response.failed was the last event */
    if (!x->started) start(x, c);
    close_item(x, c);
    const char *inc, *st = status_of(x->finish, &inc);
    json_t *r = response_obj(x, st, json_deep_copy(x->items), x->usage ? usage_of(x->usage) : NULL, inc, NULL);
    json_array_append_new(x->conv, assistant_msg(x->items));
    json_t *last = json_pack("{s:s,s:i,s:O}", "type", inc ? "response.incomplete" : "response.completed", "sequence_number",
                             x->seq++, "response", r);
    if (x->store) store_then_end(x, c, r, last);
    else {
        gw_http_stream_named(c, json_string_value(json_object_get(last, "type")), last);
        json_decref(last);
    }
    json_decref(r);
}

static void resp_free(void *ctx) {
    resp *x = ctx;
    json_decref(x->req);
    json_decref(x->conv);
    json_decref(x->items);
    json_decref(x->usage);
    free(x->text);
    free(x);
}

/* ---- the endpoints ------------------------------------------------------------------------ */

/* A request waiting for its previous response from the store. */
typedef struct {
    gw_conn *c;                   /* NULL once the client has gone */
    resp *x;                      /* the connection's filter: lives while c does */
    gw_http_req r;                /* its strings copied */
    char *path, *auth, *xkey, *peer, *body;
    gw_resp_generate gen;
    void *ctx;
} pget;

static void pget_free(pget *p) {
    free(p->path);
    free(p->auth);
    free(p->xkey);
    free(p->peer);
    free(p->body);
    free(p);
}

static void pget_gone(void *arg) { ((pget *)arg)->c = NULL; }

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

/* The chat request of x's, run. prev: the stored record or NULL. */
static void run(resp *x, gw_http_req *r, const json_t *prev, gw_resp_generate gen, void *ctx) {
    char err[400];
    const char *param = NULL;
    json_t *chat = NULL;
    int rc = translate(x->req, prev, &chat, &x->conv, err, sizeof err, &param);
    char *s = rc ? NULL : json_dumps(chat, JSON_COMPACT);
    json_decref(chat);
    if (rc || !s) {
        gw_http_error(r->conn, rc == LLM_EINVAL ? 400 : 500, rc == LLM_EINVAL ? err : "out of memory", param,
                      rc == LLM_EINVAL ? "invalid_value" : "internal_error");
        free(s);
        return;
    }
    gw_http_req a = *r;
    a.body = s;
    a.body_len = strlen(s);
    gen(ctx, &a);
    free(s);
}

static void on_prev(void *arg, int rc, const char *val, size_t len) {
    pget *p = arg;
    if (!p->c) {
        pget_free(p);
        return;
    }
    gw_http_on_gone(p->c, NULL, NULL);
    const char *pid = json_string_value(json_object_get(p->x->req, "previous_response_id"));
    char m[400];
    json_t *prev = rc ? NULL : json_loadb(val, len, 0, NULL);
    if (rc == LLM_ENOTFOUND) {
        snprintf(m, sizeof m, "Previous response with id '%.128s' not found.", pid ? pid : "");
        gw_http_error(p->c, 404, m, "previous_response_id", "previous_response_not_found");
    } else if (rc || !json_is_object(prev)) {
        snprintf(m, sizeof m, "the response store is unavailable (%s)", rc ? cm_strerror(rc) : "an unreadable record");
        gw_http_error(p->c, 503, m, "previous_response_id", "response_store_unavailable");
    } else {
        run(p->x, &p->r, prev, p->gen, p->ctx);
    }
    json_decref(prev);
    pget_free(p);
}

void gw_resp_create(gw_rstore *st, gw_http_req *r, const char *tenant, gw_resp_generate gen, void *ctx) {
    json_error_t je;
    json_t *o = json_loadb(r->body, r->body_len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(o)) {
        char m[300];
        snprintf(m, sizeof m, "the body is not a JSON object%s%s", o ? "" : ": ", o ? "" : je.text);
        json_decref(o);
        gw_http_error(r->conn, 400, m, NULL, "invalid_json");
        return;
    }
    resp *x = calloc(1, sizeof *x);
    if (!x || !(x->items = json_array())) {
        free(x);
        json_decref(o);
        gw_http_error(r->conn, 500, "out of memory", NULL, "internal_error");
        return;
    }
    x->req = o;
    x->st = st;
    x->store = !json_is_false(json_object_get(o, "store"));
    x->created = (long long)time(NULL);
    rand_id(x->id, sizeof x->id, "resp_");
    snprintf(x->key, sizeof x->key, "%.64s:%s", tenant, x->id);
    gw_http_filter f = {on_reply, on_event, on_end, resp_free, x};
    gw_http_set_filter(r->conn, &f); /* the connection owns x from here */
    const json_t *pid = json_object_get(o, "previous_response_id");
    if (!json_is_string(pid)) {
        run(x, r, NULL, gen, ctx);
        return;
    }
    pget *p = calloc(1, sizeof *p);
    char key[200];
    if (!p || !(p->body = malloc(r->body_len + 1))) {
        free(p);
        gw_http_error(r->conn, 500, "out of memory", NULL, "internal_error");
        return;
    }
    memcpy(p->body, r->body, r->body_len);
    p->body[r->body_len] = 0;
    p->c = r->conn;
    p->x = x;
    p->gen = gen;
    p->ctx = ctx;
    p->r = *r;
    p->r.path = p->path = dup_or_null(r->path);
    p->r.authorization = p->auth = dup_or_null(r->authorization);
    p->r.x_api_key = p->xkey = dup_or_null(r->x_api_key);
    p->r.peer = p->peer = dup_or_null(r->peer);
    p->r.body = p->body;
    snprintf(key, sizeof key, "%.64s:%.128s", tenant, json_string_value(pid));
    gw_http_on_gone(r->conn, pget_gone, p);
    gw_rstore_get(st, key, on_prev, p);
}

typedef struct {
    gw_conn *c;
    int del;
    char id[160];
} plook;

static void plook_gone(void *arg) { ((plook *)arg)->c = NULL; }

static void on_look(void *arg, int rc, const char *val, size_t len) {
    plook *p = arg;
    if (p->c) {
        gw_http_on_gone(p->c, NULL, NULL);
        json_t *rec = rc ? NULL : json_loadb(val, len, 0, NULL);
        char m[300];
        if (rc == LLM_ENOTFOUND) {
            snprintf(m, sizeof m, "Response with id '%.128s' not found.", p->id);
            gw_http_error(p->c, 404, m, NULL, "not_found");
        } else if (rc || (!p->del && !json_is_object(json_object_get(rec, "response")))) {
            snprintf(m, sizeof m, "the response store is unavailable (%s)", rc ? cm_strerror(rc) : "an unreadable record");
            gw_http_error(p->c, 503, m, NULL, "response_store_unavailable");
        } else if (p->del) {
            json_t *d = json_pack("{s:s,s:s,s:b}", "id", p->id, "object", "response.deleted", "deleted", 1);
            gw_http_json(p->c, 200, d);
            json_decref(d);
        } else {
            gw_http_json(p->c, 200, json_object_get(rec, "response"));
        }
        json_decref(rec);
    }
    free(p);
}

void gw_resp_lookup(gw_rstore *st, gw_http_req *r, const char *tenant, const char *id, int del) {
    char key[240];
    plook *p = calloc(1, sizeof *p);
    if (!p) {
        gw_http_error(r->conn, 500, "out of memory", NULL, "internal_error");
        return;
    }
    if (strlen(id) >= sizeof p->id || strchr(id, '/')) {
        free(p);
        gw_http_error(r->conn, 404, strchr(id, '/') ? "no such endpoint" : "Response not found.", NULL, "not_found");
        return;
    }
    p->c = r->conn;
    p->del = del;
    snprintf(p->id, sizeof p->id, "%s", id);
    snprintf(key, sizeof key, "%.64s:%s", tenant, id);
    gw_http_on_gone(r->conn, plook_gone, p);
    if (del) gw_rstore_del(st, key, on_look, p);
    else gw_rstore_get(st, key, on_look, p);
}
