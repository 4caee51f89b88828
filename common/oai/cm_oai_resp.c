#include "cm_oai_resp.h"
#include "cm_error.h"
#include "cm_tools.h"
#include "cm_unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_t *cm_oai_jbytes(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    char *buf = malloc(n * 3 + 1);
    size_t o = 0;
    for (size_t i = 0; buf && i < n;) {
        uint32_t cp;
        int l = cm_utf8_decode(s + i, n - i, &cp);
        o += (size_t)cm_utf8_encode(cp, buf + o);
        i += (size_t)l;
    }
    j = json_stringn(buf ? buf : "", o);
    free(buf);
    return j;
}

const char *cm_oai_error_type(int status) {
    return status == 401   ? "authentication_error"
           : status == 403 ? "permission_error"
           : status == 404 ? "not_found_error"
           : status == 429 ? "rate_limit_error"
           : status >= 500 ? "server_error"
                           : "invalid_request_error";
}

json_t *cm_oai_error_json(int status, const char *msg, const char *param, const char *code) {
    return json_pack("{s:{s:s,s:s,s:s?,s:s?}}", "error", "message", msg ? msg : "", "type", cm_oai_error_type(status),
                     "param", param, "code", code);
}

const char *cm_oai_finish_name(int f) {
    switch (f) {
    case CM_OAI_FINISH_STOP: return "stop";
    case CM_OAI_FINISH_LENGTH: return "length";
    case CM_OAI_FINISH_ABORT: return "abort";
    default: return NULL;
    }
}

static int put_text(cm_oai_choice *c, const char *s, size_t n) {
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 64;
        while (cap < c->len + n + 1) cap *= 2;
        char *t = realloc(c->text, cap);
        if (!t) return LLM_ENOMEM;
        c->text = t;
        c->cap = cap;
    }
    memcpy(c->text + c->len, s, n);
    c->len += n;
    c->text[c->len] = 0;
    return 0;
}

void cm_oai_result_init(cm_oai_result *r, const cm_oai_completion *req, const char *id, const char *model, long created,
                        const char *echo_text, size_t echo_len) {
    memset(r, 0, sizeof *r);
    r->id = id;
    r->model = model;
    r->created = created;
    r->is_chat = req->is_chat;
    r->n = req->n > 0 && req->n <= CM_OAI_MAX_N ? req->n : 1;
    r->logprobs = req->logprobs;
    r->prompt_logprobs = req->prompt_logprobs;
    r->score_only = req->score_only;
    if (req->is_chat && req->n_tools && req->tool_choice != CM_TOOL_NONE) r->tools = req->tools, r->n_tools = req->n_tools, r->tool_format = req->tool_format;
    r->reasoning = req->is_chat ? req->reasoning : CM_REASON_NONE;
    r->stop = req->stop;
    r->n_stop = req->n_stop;
    for (int i = 0; i < CM_OAI_MAX_N; i++) cm_reason_init(&r->ch[i].hs, r->reasoning);
    r->echo = req->echo && echo_text;
    for (int i = 0; i < r->n && r->echo; i++) {
        r->ch[i].offset = echo_len;
        r->ch[i].lp_text0 = echo_len;
        put_text(&r->ch[i], echo_text, echo_len);
    }
}

void cm_oai_result_free(cm_oai_result *r) {
    for (int i = 0; i < CM_OAI_MAX_N; i++) {
        free(r->ch[i].text);
        free(r->ch[i].lp);
        free(r->ch[i].lp_offset);
    }
    memset(r->ch, 0, sizeof r->ch);
    free(r->plp);
    r->plp = NULL;
    r->n_plp = 0;
}

int cm_oai_result_prompt(cm_oai_result *r, const int32_t *prompt, int n, const cm_oai_lp *lp, int n_lp) {
    free(r->plp);
    r->plp = n_lp ? malloc(sizeof *r->plp * (size_t)n_lp) : NULL;
    if (n_lp && !r->plp) return LLM_ENOMEM;
    if (n_lp) memcpy(r->plp, lp, sizeof *lp * (size_t)n_lp);
    r->n_plp = n_lp;
    r->prompt = prompt;
    r->n_prompt = n;
    return 0;
}

/* The bytes a token adds to the text (control tokens add none). */
static size_t piece_len(const cm_tokenizer *tok, int32_t id) {
    const char *p;
    size_t l = 0;
    if (!tok || cm_tok_piece(tok, id, 0, &p, &l)) return 0;
    return l;
}

int cm_oai_result_add(cm_oai_result *r, int index, const char *text, size_t len, const cm_oai_lp *lp, int n_lp,
                      const cm_tokenizer *tok) {
    if (index < 0 || index >= r->n) return LLM_EINVAL;
    cm_oai_choice *c = &r->ch[index];
    if (len && put_text(c, text, len)) return LLM_ENOMEM;
    if (r->logprobs < 0 || !lp) return 0;
    if (c->n_lp + (size_t)n_lp > c->cap_lp) {
        size_t cap = c->cap_lp ? c->cap_lp : 16;
        while (cap < c->n_lp + (size_t)n_lp) cap *= 2;
        cm_oai_lp *a = realloc(c->lp, sizeof *a * cap);
        if (!a) return LLM_ENOMEM;
        c->lp = a;
        size_t *o = realloc(c->lp_offset, sizeof *o * cap);
        if (!o) return LLM_ENOMEM;
        c->lp_offset = o;
        c->cap_lp = cap;
    }
    for (int i = 0; i < n_lp; i++) {
        c->lp[c->n_lp] = lp[i];
        c->lp_offset[c->n_lp++] = c->offset;
        c->offset += piece_len(tok, lp[i].token);
    }
    return 0;
}

int cm_oai_result_done(const cm_oai_result *r) {
    for (int i = 0; i < r->n; i++)
        if (!r->ch[i].finish) return 0;
    return 1;
}

static json_t *token_json(const cm_tokenizer *tok, int32_t id) {
    const char *p;
    size_t l;
    if (!tok || cm_tok_piece(tok, id, 1, &p, &l)) return json_string("");
    return cm_oai_jbytes(p, l);
}

/* A token's bytes as OpenAI gives them (a list of integers): what its text
 * is made of even when it is part of a character. */
static json_t *token_bytes(const cm_tokenizer *tok, int32_t id) {
    const char *p;
    size_t l;
    json_t *a = json_array();
    if (tok && !cm_tok_piece(tok, id, 1, &p, &l))
        for (size_t i = 0; i < l; i++) json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

/* Logprobs of n entries in the request's API shape. */
static json_t *logprobs_json(const cm_oai_result *r, const cm_oai_lp *lp, const size_t *offs, size_t n,
                             const cm_tokenizer *tok) {
    if (r->is_chat) {
        json_t *content = json_array();
        for (size_t i = 0; i < n; i++) {
            json_t *tops = json_array();
            for (int k = 0; k < lp[i].n_top; k++)
                json_array_append_new(tops, json_pack("{s:o,s:f,s:o}", "token", token_json(tok, lp[i].top[k].id), "logprob",
                                                      (double)lp[i].top[k].logprob, "bytes", token_bytes(tok, lp[i].top[k].id)));
            json_array_append_new(content, json_pack("{s:o,s:f,s:o,s:o}", "token", token_json(tok, lp[i].token), "logprob",
                                                     (double)lp[i].logprob, "bytes", token_bytes(tok, lp[i].token),
                                                     "top_logprobs", tops));
        }
        return json_pack("{s:o,s:n}", "content", content, "refusal"); /* the spec requires refusal (null) */
    }
    json_t *toks = json_array(), *vals = json_array(), *tops = json_array(), *o = json_array();
    if (r->echo && r->prompt && r->n_prompt) { /* the prompt's tokens first: the first has no logprob */
        size_t at = 0;
        for (int i = 0; i < r->n_prompt; i++) {
            const cm_oai_lp *p = i && i - 1 < r->n_plp ? &r->plp[i - 1] : NULL;
            json_array_append_new(toks, token_json(tok, r->prompt[i]));
            json_array_append_new(vals, p ? json_real(p->logprob) : json_null());
            json_t *top = p ? json_object() : json_null();
            for (int k = 0; p && k < p->n_top; k++) {
                json_t *ks = token_json(tok, p->top[k].id);
                const char *key = json_string_value(ks);
                if (key && !json_object_get(top, key)) json_object_set_new(top, key, json_real(p->top[k].logprob));
                json_decref(ks);
            }
            if (p) { /* the prompt's own token is among the alternatives, as OpenAI's echo gives it */
                json_t *ks = token_json(tok, r->prompt[i]);
                const char *key = json_string_value(ks);
                if (key && !json_object_get(top, key)) json_object_set_new(top, key, json_real(p->logprob));
                json_decref(ks);
            }
            json_array_append_new(tops, top);
            json_array_append_new(o, json_integer((json_int_t)at));
            at += piece_len(tok, r->prompt[i]);
        }
        if (r->score_only) n = 0;
    }
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(toks, token_json(tok, lp[i].token));
        json_array_append_new(vals, json_real(lp[i].logprob));
        json_t *top = json_object();
        for (int k = 0; k < lp[i].n_top; k++) {
            json_t *ks = token_json(tok, lp[i].top[k].id);
            const char *key = json_string_value(ks);
            if (key && !json_object_get(top, key)) json_object_set_new(top, key, json_real(lp[i].top[k].logprob));
            json_decref(ks);
        }
        json_array_append_new(tops, top);
        json_array_append_new(o, json_integer((json_int_t)offs[i]));
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", toks, "token_logprobs", vals, "top_logprobs", tops, "text_offset", o);
}

json_t *cm_oai_usage_json(const cm_oai_result *r) {
    int out = 0;
    for (int i = 0; i < r->n && !r->score_only; i++) out += r->ch[i].completion_tokens;
    json_t *u = json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", r->prompt_tokens, "completion_tokens", out,
                          "total_tokens", r->prompt_tokens + out, "prompt_tokens_details", "cached_tokens", r->cached_tokens);
    if (u && r->trim_policy) { /* llmserve's: the history did not fit the context and was trimmed */
        json_t *t = json_pack("{s:s,s:i,s:i}", "policy", cm_oai_overflow_name(r->trim_policy), "dropped_messages",
                              r->trim_messages, "dropped_tokens", r->trim_tokens);
        if (t && r->trim_policy == CM_OVERFLOW_SUMMARIZE) {
            json_object_set_new(t, "summary_tokens", json_integer(r->trim_summary_tokens));
            json_object_set_new(t, "summary_cached", json_boolean(r->trim_summary_cached));
        }
        json_object_set_new(u, "context_trimming", t);
    }
    return u;
}

static json_t *chunk_envelope(const cm_oai_result *r, json_t *choices);

/* vLLM's stop_reason: the stop string that matched, the stop token id, or null. */
static json_t *stop_reason_json(const cm_oai_result *r, const cm_oai_choice *c) {
    if (c->stop_kind == CM_OAI_STOP_STRING && c->stop_val >= 0 && c->stop_val < r->n_stop && r->stop)
        return json_string(r->stop[c->stop_val]);
    if (c->stop_kind == CM_OAI_STOP_TOKEN) return json_integer(c->stop_val);
    return json_null();
}

/* Tool call ids: from the response id and the choice, so a response reads the same twice. */
static unsigned long long call_seed(const cm_oai_result *r, int index) {
    unsigned long long h = 1469598103934665603ull;
    for (const char *p = r->id ? r->id : ""; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h ^ (unsigned long long)index;
}

/* A chat choice's text as the reasoning parser splits it (whole; final: the end has come): the reasoning and
 * the content. Without a parser the content is the text as it is. Tool calls are read from the content. */
static void split(const cm_oai_result *r, const cm_oai_choice *c, int final, cm_hbuf *rb, cm_hbuf *cb) {
    memset(rb, 0, sizeof *rb);
    memset(cb, 0, sizeof *cb);
    if (!r->reasoning) {
        cb->s = (char *)(c->text ? c->text : "");
        cb->n = c->len;
        return;
    }
    cm_harmony h;
    cm_reason_init(&h, r->reasoning);
    cm_harmony_feed(&h, c->text ? c->text : "", c->len, final, rb, cb);
}

static void split_free(const cm_oai_result *r, cm_hbuf *rb, cm_hbuf *cb) {
    if (!r->reasoning) return;
    cm_hbuf_free(rb);
    cm_hbuf_free(cb);
}

json_t *cm_oai_tool_chunks_json(const cm_oai_result *r, int index, const cm_tokenizer *tok) {
    (void)tok;
    json_t *out = json_array();
    if (index < 0 || index >= r->n) return out;
    const cm_oai_choice *c = &r->ch[index];
    json_t *calls = NULL;
    char *rest = NULL;
    cm_hbuf rb, cb;
    split(r, c, 1, &rb, &cb);
    cm_tools_parse(r->tool_format, r->tools, r->n_tools, cb.s ? cb.s : "", cb.n, call_seed(r, index), &calls, &rest);
    json_t *delta = json_pack("{s:s}", "role", "assistant");
    if (rb.n) json_object_set_new(delta, "reasoning_content", cm_oai_jbytes(rb.s, rb.n));
    if (!calls || rest) json_object_set_new(delta, "content", calls ? cm_oai_jbytes(rest, strlen(rest))
                                                                    : cm_oai_jbytes(cb.s ? cb.s : "", cb.n));
    free(rest);
    split_free(r, &rb, &cb);
    json_t *one = json_array();
    json_array_append_new(one, json_pack("{s:i,s:o,s:n,s:n}", "index", index, "delta", delta, "logprobs", "finish_reason"));
    json_array_append_new(out, chunk_envelope(r, one));
    for (size_t k = 0; calls && k < json_array_size(calls); k++) {
        json_t *tc = json_deep_copy(json_array_get(calls, k));
        json_object_set_new(tc, "index", json_integer((json_int_t)k));
        json_t *d = json_pack("{s:[o]}", "tool_calls", tc), *ch = json_array();
        json_array_append_new(ch, json_pack("{s:i,s:o,s:n,s:n}", "index", index, "delta", d, "logprobs", "finish_reason"));
        json_array_append_new(out, chunk_envelope(r, ch));
    }
    json_t *fin = json_array();
    json_array_append_new(fin, json_pack("{s:i,s:{},s:n,s:s?}", "index", index, "delta", "logprobs", "finish_reason",
                                         calls ? "tool_calls" : cm_oai_finish_name(c->finish)));
    json_array_append_new(out, chunk_envelope(r, fin));
    json_decref(calls);
    return out;
}

/* vLLM's prompt_logprobs: null for the first token, then for each token a
 * map from token id to {logprob, rank, decoded_token}: the token itself and
 * its top alternatives. */
static json_t *prompt_logprobs_json(const cm_oai_result *r, const cm_tokenizer *tok) {
    if (r->prompt_logprobs < 0 || !r->prompt) return NULL;
    json_t *a = json_array();
    json_array_append_new(a, json_null());
    for (int i = 1; i < r->n_prompt; i++) {
        const cm_oai_lp *p = i - 1 < r->n_plp ? &r->plp[i - 1] : NULL;
        if (!p) {
            json_array_append_new(a, json_null());
            continue;
        }
        json_t *m = json_object();
        char key[16];
        snprintf(key, sizeof key, "%d", (int)r->prompt[i]);
        json_object_set_new(m, key, json_pack("{s:f,s:i,s:o}", "logprob", (double)p->logprob, "rank", p->rank,
                                              "decoded_token", token_json(tok, r->prompt[i])));
        for (int k = 0; k < p->n_top && k < r->prompt_logprobs; k++) {
            snprintf(key, sizeof key, "%d", (int)p->top[k].id);
            if (!json_object_get(m, key))
                json_object_set_new(m, key, json_pack("{s:f,s:i,s:o}", "logprob", (double)p->top[k].logprob, "rank", k + 1,
                                                      "decoded_token", token_json(tok, p->top[k].id)));
        }
        json_array_append_new(a, m);
    }
    return a;
}

json_t *cm_oai_response_json(const cm_oai_result *r, const cm_tokenizer *tok) {
    json_t *choices = json_array();
    for (int i = 0; i < r->n; i++) {
        const cm_oai_choice *c = &r->ch[i];
        json_t *text = cm_oai_jbytes(c->text ? c->text : "", c->len);
        json_t *lp = r->logprobs >= 0 ? logprobs_json(r, c->lp, c->lp_offset, c->n_lp, tok) : json_null();
        json_t *calls = NULL, *reasoning = NULL;
        char *rest = NULL;
        cm_hbuf rb, cb;
        if (r->is_chat) { /* the reasoning apart from the content; calls are read from the content */
            split(r, c, 1, &rb, &cb);
            if (r->reasoning) {
                json_decref(text);
                text = cm_oai_jbytes(cb.s ? cb.s : "", cb.n);
                reasoning = rb.n ? cm_oai_jbytes(rb.s, rb.n) : NULL;
            }
            if (r->tools)
                cm_tools_parse(r->tool_format, r->tools, r->n_tools, cb.s ? cb.s : "", cb.n, call_seed(r, i), &calls, &rest);
            split_free(r, &rb, &cb);
        }
        if (calls) { /* the content is what is left around the calls, or null */
            json_decref(text);
            text = rest ? cm_oai_jbytes(rest, strlen(rest)) : json_null();
            free(rest);
        }
        if (r->is_chat)
            json_array_append_new(choices, json_pack("{s:i,s:{s:s,s:o,s:n,s:o*,s:o*},s:o,s:s?,s:o}", "index", i, "message",
                                                     "role", "assistant", "content", text, "refusal",
                                                     "reasoning_content", reasoning,
                                                     "tool_calls", calls, "logprobs", lp,
                                                     "finish_reason", calls ? "tool_calls" : cm_oai_finish_name(c->finish),
                                                     "stop_reason", stop_reason_json(r, c)));
        else {
            if (r->score_only) { /* nothing was asked for beyond the echo: the one generated token goes */
                json_decref(text);
                text = cm_oai_jbytes(c->text ? c->text : "", c->len >= c->lp_text0 ? c->lp_text0 : c->len);
            }
            json_t *ch = json_pack("{s:i,s:o,s:o,s:s?,s:o}", "index", i, "text", text, "logprobs", lp, "finish_reason",
                                   r->score_only ? "length" : cm_oai_finish_name(c->finish), "stop_reason",
                                   stop_reason_json(r, c));
            json_t *pl = prompt_logprobs_json(r, tok);
            if (pl) json_object_set_new(ch, "prompt_logprobs", pl);
            json_array_append_new(choices, ch);
        }
    }
    json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", r->id, "object", r->is_chat ? "chat.completion" : "text_completion",
                          "created", (json_int_t)r->created, "model", r->model, "choices", choices, "usage", cm_oai_usage_json(r));
    json_t *pl = r->is_chat ? prompt_logprobs_json(r, tok) : NULL;
    if (pl) json_object_set_new(j, "prompt_logprobs", pl);
    return j;
}

static json_t *chunk_envelope(const cm_oai_result *r, json_t *choices) {
    return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", r->id, "object",
                     r->is_chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)r->created, "model",
                     r->model, "choices", choices);
}

json_t *cm_oai_chunk_json(cm_oai_result *r, int index, const char *text, size_t len, const cm_oai_lp *lp, int n_lp,
                          int finish, const cm_tokenizer *tok) {
    if (index < 0 || index >= r->n) return NULL;
    cm_oai_choice *c = &r->ch[index];
    if (finish) c->finish = finish;
    if (!len && !finish && c->role_sent && !(lp && n_lp && r->logprobs >= 0)) return NULL;
    json_t *lpj = json_null();
    if (lp && n_lp && r->logprobs >= 0) {
        size_t offs[64], *op = (size_t)n_lp <= 64 ? offs : malloc(sizeof *op * (size_t)n_lp);
        for (int i = 0; op && i < n_lp; i++) {
            op[i] = c->offset;
            c->offset += piece_len(tok, lp[i].token);
        }
        if (op) lpj = logprobs_json(r, lp, op, (size_t)n_lp, tok);
        if (op != offs) free(op);
    }
    json_t *choice;
    if (r->is_chat && r->reasoning) { /* the piece as the splitter settles it: reasoning, content, or held */
        cm_hbuf rb = {0}, cb = {0};
        cm_harmony_feed(&c->hs, text ? text : "", len, finish != CM_OAI_FINISH_NONE, &rb, &cb);
        if (!rb.n && !cb.n && !finish && c->role_sent && json_is_null(lpj)) {
            json_decref(lpj);
            return NULL;
        }
        json_t *delta = json_object();
        if (!c->role_sent) json_object_set_new(delta, "role", json_string("assistant"));
        if (rb.n) json_object_set_new(delta, "reasoning_content", cm_oai_jbytes(rb.s, rb.n));
        if (cb.n || !rb.n) json_object_set_new(delta, "content", cm_oai_jbytes(cb.s ? cb.s : "", cb.n));
        cm_hbuf_free(&rb);
        cm_hbuf_free(&cb);
        choice = json_pack("{s:i,s:o,s:o,s:s?}", "index", index, "delta", delta, "logprobs", lpj, "finish_reason",
                           cm_oai_finish_name(finish));
    } else if (r->is_chat) {
        json_t *delta = json_object();
        if (!c->role_sent) json_object_set_new(delta, "role", json_string("assistant"));
        json_object_set_new(delta, "content", cm_oai_jbytes(text ? text : "", len));
        choice = json_pack("{s:i,s:o,s:o,s:s?}", "index", index, "delta", delta, "logprobs", lpj, "finish_reason",
                           cm_oai_finish_name(finish));
    } else {
        choice = json_pack("{s:i,s:o,s:o,s:s?}", "index", index, "text", cm_oai_jbytes(text ? text : "", len), "logprobs",
                           lpj, "finish_reason", cm_oai_finish_name(finish));
    }
    c->role_sent = 1;
    if (finish) json_object_set_new(choice, "stop_reason", stop_reason_json(r, c));
    json_t *arr = json_array();
    json_array_append_new(arr, choice);
    return chunk_envelope(r, arr);
}

int cm_oai_tools_stream(const cm_oai_result *r) { return r->tools && r->tool_format == CM_TOOLS_HERMES; }

typedef struct {
    cm_oai_result *r;
    int index;
    json_t *out;
} tool_stream_ctx;

/* One delta chunk: the role with the choice's first. */
static void tool_delta(tool_stream_ctx *x, json_t *delta, const char *finish) {
    cm_oai_choice *c = &x->r->ch[x->index];
    if (!c->role_sent) json_object_set_new(delta, "role", json_string("assistant"));
    c->role_sent = 1;
    json_t *one = json_array();
    json_array_append_new(one, json_pack("{s:i,s:o,s:n,s:s?}", "index", x->index, "delta", delta, "logprobs", "finish_reason",
                                         finish));
    json_array_append_new(x->out, chunk_envelope(x->r, one));
}

static void on_tool_event(void *ctx, const cm_tools_event *ev) {
    tool_stream_ctx *x = ctx;
    json_t *d;
    if (ev->kind == CM_TOOLS_EV_CONTENT) {
        d = json_pack("{s:o}", "content", cm_oai_jbytes(ev->s, ev->n));
    } else if (ev->kind == CM_TOOLS_EV_CALL) {
        d = json_pack("{s:[{s:i,s:s,s:s,s:{s:o,s:s}}]}", "tool_calls", "index", ev->call, "id", ev->id, "type", "function",
                      "function", "name", cm_oai_jbytes(ev->s, ev->n), "arguments", "");
    } else {
        d = json_pack("{s:[{s:i,s:{s:o}}]}", "tool_calls", "index", ev->call, "function", "arguments",
                      cm_oai_jbytes(ev->s, ev->n));
    }
    if (d) tool_delta(x, d, NULL);
}

json_t *cm_oai_tool_stream_json(cm_oai_result *r, int index, int final) {
    json_t *out = json_array();
    if (index < 0 || index >= r->n) return out;
    cm_oai_choice *c = &r->ch[index];
    tool_stream_ctx x = {r, index, out};
    cm_hbuf rb, cb;
    split(r, c, final, &rb, &cb); /* the reasoning goes out as it settles; calls are read from the content */
    if (rb.n > c->reason_sent) {
        tool_delta(&x, json_pack("{s:o}", "reasoning_content", cm_oai_jbytes(rb.s + c->reason_sent, rb.n - c->reason_sent)),
                   NULL);
        c->reason_sent = rb.n;
    }
    cm_tools_stream_feed(&c->ts, r->tools, r->n_tools, cb.s ? cb.s : "", cb.n, final, call_seed(r, index), on_tool_event,
                         &x);
    split_free(r, &rb, &cb);
    if (final) tool_delta(&x, json_object(), c->ts.n_calls ? "tool_calls" : cm_oai_finish_name(c->finish));
    return out;
}

json_t *cm_oai_usage_chunk_json(const cm_oai_result *r) {
    json_t *j = chunk_envelope(r, json_array());
    json_object_set_new(j, "usage", cm_oai_usage_json(r));
    return j;
}
