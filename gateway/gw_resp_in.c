#include "gw_resp_in.h"
#include "cm_error.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
            if (!gw_resp_absent(v) && (!json_is_string(v) || strcmp(json_string_value(v), "medium")))
                BAD("text.verbosity", "text.verbosity: only 'medium' (this server does not steer length)");
        } else if (strcmp(k, "format")) {
            BAD("text", "text.%.32s: this field is not supported", k);
        }
    }
    const json_t *f = json_object_get(text, "format");
    if (gw_resp_absent(f)) return 0;
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
    if (!gw_resp_absent(v = json_object_get(o, "truncation")) && (!json_is_string(v) || strcmp(json_string_value(v), "disabled")))
        BAD("truncation", "truncation: only 'disabled' (a prompt over the context is refused)");
    if (!gw_resp_absent(v = json_object_get(o, "background")) && !json_is_false(v))
        BAD("background", "background: background responses are not supported");
    if (!gw_resp_absent(v = json_object_get(o, "include")) && (!json_is_array(v) || json_array_size(v)))
        BAD("include", "include: no extra output data is supported (an empty list)");
    if (!gw_resp_absent(v = json_object_get(o, "top_logprobs")) && !(json_is_integer(v) && !json_integer_value(v)))
        BAD("top_logprobs", "top_logprobs: not supported on /v1/responses (use /v1/chat/completions)");
    if (!gw_resp_absent(v = json_object_get(o, "reasoning"))) {
        if (!json_is_object(v)) BAD("reasoning", "reasoning: an object");
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x)
            if (!gw_resp_absent(x))
                BAD("reasoning", "reasoning.%.32s: not supported (a reasoning model thinks as its chat template says)", k);
    }
    if (!gw_resp_absent(v = json_object_get(o, "service_tier")) &&
        (!json_is_string(v) || (strcmp(json_string_value(v), "auto") && strcmp(json_string_value(v), "default"))))
        BAD("service_tier", "service_tier: 'auto' or 'default' (one tier here)");
    if (!gw_resp_absent(v = json_object_get(o, "stream_options"))) {
        const char *k;
        json_t *x;
        if (!json_is_object(v)) BAD("stream_options", "stream_options: an object");
        json_object_foreach((json_t *)v, k, x)
            if (strcmp(k, "include_obfuscation")) BAD("stream_options", "stream_options.%.32s: not supported", k);
    }
    if (!gw_resp_absent(v = json_object_get(o, "metadata")) && !json_is_object(v)) BAD("metadata", "metadata: an object");
    if (!gw_resp_absent(v = json_object_get(o, "store")) && !json_is_boolean(v)) BAD("store", "store: a boolean");
    if (!gw_resp_absent(v = json_object_get(o, "stream")) && !json_is_boolean(v)) BAD("stream", "stream: a boolean");
    if (!gw_resp_absent(v = json_object_get(o, "instructions")) && !json_is_string(v))
        BAD("instructions", "instructions: a string");
    if (!gw_resp_absent(v = json_object_get(o, "previous_response_id")) && !json_is_string(v))
        BAD("previous_response_id", "previous_response_id: a string");
    return 0;
fail:
    return LLM_EINVAL;
}

/* The chat request of o (a Responses request), and the conversation (chat messages, without the instructions)
 * that the stored response keeps: prev's (a stored record) and this input's. */
int gw_resp_translate(const json_t *o, const json_t *prev, json_t **chat_out, json_t **conv_out, char *err,
                      size_t errlen, const char **param) {
    json_t *chat = json_object(), *conv = json_array(), *v, *msgs = NULL;
    const char *k;
    int rc = LLM_EINVAL;
    *chat_out = *conv_out = NULL;
    json_object_foreach((json_t *)o, k, v)
        if (!in_list(KNOWN, k) && !gw_resp_absent(v)) BAD(NULL, "%.64s: this field is not supported on /v1/responses", k);
    if (settled(o, err, errlen, param)) goto fail;
    for (const char *const *s = SAME; *s; s++)
        if (!gw_resp_absent(v = json_object_get(o, *s))) json_object_set(chat, *s, v);
    if (!gw_resp_absent(v = json_object_get(o, "max_output_tokens"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 1) BAD("max_output_tokens", "max_output_tokens: an integer of at least 1");
        json_object_set(chat, "max_tokens", v);
    }
    if (json_is_true(json_object_get(o, "stream"))) {
        json_object_set_new(chat, "stream", json_true());
        json_object_set_new(chat, "stream_options", json_pack("{s:b}", "include_usage", 1));
    }
    if (!gw_resp_absent(v = json_object_get(o, "text")) && text_format(v, chat, err, errlen, param)) goto fail;
    if (!gw_resp_absent(v = json_object_get(o, "tools"))) {
        json_t *t = chat_tools(v, err, errlen, param);
        if (!t) goto fail;
        json_object_set_new(chat, "tools", t);
    }
    if (!gw_resp_absent(v = json_object_get(o, "tool_choice"))) {
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
    if (gw_resp_absent(v)) BAD("input", "input: Field required (a string or a list of input items)");
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
    else if (!(rc = gw_resp_translate(o, p, &chat, &conv, err, errlen, param)) && !(*out = json_dumps(chat, JSON_COMPACT)))
        rc = LLM_ENOMEM;
    json_decref(chat);
    json_decref(conv);
    json_decref(p);
    json_decref(o);
    return rc;
}

