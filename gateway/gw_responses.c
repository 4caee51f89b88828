#include "gw_responses.h"
#include "gw_resp_in.h"
#include "cm_error.h"
#include "cm_log.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

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
    if (gw_resp_absent(v)) return def;
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
    int rc = gw_resp_translate(x->req, prev, &chat, &x->conv, err, sizeof err, &param);
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
    int del, items;
    char id[160];
} plook;

/* The input items of a stored record: its conversation as items, less this response's own output (the last
 * assistant turn), newest first (the API's default order). */
static json_t *stored_items(const char *rid, const json_t *msgs) {
    json_t *data = json_array(), *m;
    size_t i, n = json_array_size(msgs);
    char id[200];
    if (n && !strcmp(json_string_value(json_object_get(json_array_get(msgs, n - 1), "role")) ? json_string_value(json_object_get(json_array_get(msgs, n - 1), "role")) : "", "assistant")) n--;
    for (i = 0; i < n; i++) {
        m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *content = json_object_get(m, "content"), *tc;
        size_t k;
        snprintf(id, sizeof id, "msg_%.40s_%zu", rid + (strncmp(rid, "resp_", 5) ? 0 : 5), i);
        if (!role) continue;
        if (!strcmp(role, "tool")) {
            json_array_append_new(data, json_pack("{s:s,s:s,s:O,s:O,s:s}", "id", id, "type", "function_call_output",
                                                  "call_id", json_object_get(m, "tool_call_id"), "output", content,
                                                  "status", "completed"));
            continue;
        }
        int out = !strcmp(role, "assistant");
        if (json_is_string(content) && (json_string_length(content) || !json_object_get(m, "tool_calls"))) {
            json_t *part = out ? text_part(json_string_value(content))
                               : json_pack("{s:s,s:O}", "type", "input_text", "text", content);
            json_array_append_new(data, json_pack("{s:s,s:s,s:s,s:s,s:[o]}", "id", id, "type", "message", "role", role,
                                                  "status", "completed", "content", part));
        }
        json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
            const json_t *fn = json_object_get(tc, "function");
            snprintf(id, sizeof id, "fc_%.40s_%zu_%zu", rid + (strncmp(rid, "resp_", 5) ? 0 : 5), i, k);
            json_array_append_new(data, json_pack("{s:s,s:s,s:O,s:O,s:O,s:s}", "id", id, "type", "function_call", "call_id",
                                                  json_object_get(tc, "id"), "name", json_object_get(fn, "name"),
                                                  "arguments", json_object_get(fn, "arguments"), "status", "completed"));
        }
    }
    json_t *rev = json_array(); /* newest first */
    for (i = json_array_size(data); i-- > 0;) json_array_append(rev, json_array_get(data, i));
    json_decref(data);
    json_t *l = json_pack("{s:s,s:o,s:b}", "object", "list", "data", rev, "has_more", 0);
    size_t nn = json_array_size(rev);
    json_object_set_new(l, "first_id", nn ? json_incref(json_object_get(json_array_get(rev, 0), "id")) : json_null());
    json_object_set_new(l, "last_id", nn ? json_incref(json_object_get(json_array_get(rev, nn - 1), "id")) : json_null());
    return l;
}

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
        } else if (p->items) {
            json_t *l = stored_items(p->id, json_object_get(rec, "messages"));
            gw_http_json(p->c, 200, l);
            json_decref(l);
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
    const char *slash = strchr(id, '/');
    size_t il = slash ? (size_t)(slash - id) : strlen(id);
    if (il >= sizeof p->id || (slash && (strcmp(slash, "/input_items") || del))) {
        free(p);
        gw_http_error(r->conn, 404, slash ? "no such endpoint" : "Response not found.", NULL, "not_found");
        return;
    }
    p->c = r->conn;
    p->del = del;
    p->items = slash != NULL;
    snprintf(p->id, sizeof p->id, "%.*s", (int)il, id);
    snprintf(key, sizeof key, "%.64s:%s", tenant, p->id);
    gw_http_on_gone(r->conn, plook_gone, p);
    if (del) gw_rstore_del(st, key, on_look, p);
    else gw_rstore_get(st, key, on_look, p);
}
