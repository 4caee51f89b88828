#include "gw_oai.h"
#include "cm_chat.h"
#include "cm_error.h"
#include "cm_log.h"
#include "gw_metrics.h"
#include "gw_pool.h"
#include "gw_req.h"
#include "gw_tokenize.h"
#include "cm_tools.h"
#include "gw_tokq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    gw_job job;
    gw_req *q;
    int chat;
    char *body;
    size_t len;
    char served[256];            /* snapshots: the job's thread reads nothing of gw */
    int max_len, vocab;
    int status;                  /* 0: ready to route */
    char err[640];
    const char *code;
} prep;

#define REFUSE(st, prm, cd, ...)                                                                   \
    do {                                                                                           \
        p->status = (st);                                                                          \
        q->param = (prm);                                                                          \
        p->code = (cd);                                                                            \
        snprintf(p->err, sizeof p->err, __VA_ARGS__);                                              \
        return;                                                                                    \
    } while (0)

static void too_long(prep *p, gw_req *q, size_t at_least, const char *what) {
    p->status = 400;
    q->param = p->chat ? "messages" : "prompt";
    p->code = "context_length_exceeded";
    snprintf(p->err, sizeof p->err,
             "This model's maximum context length is %d tokens. However, your %s resulted in more than %zu tokens. "
             "Please reduce the length of the %s.",
             p->max_len, what, at_least > (size_t)p->max_len ? at_least - 1 : (size_t)p->max_len, what);
}

/* On a tokenizer thread: everything about the request that needs no loop state. */
static void prep_run(gw_job *j) {
    prep *p = (prep *)j;
    gw_req *q = p->q;
    const gw_model *m = q->model;
    char perr[512];
    const char *param = NULL;
    int rc = p->chat ? cm_oai_parse_chat(p->body, p->len, &q->c, perr, sizeof perr, &param)
                     : cm_oai_parse_completion(p->body, p->len, &q->c, perr, sizeof perr, &param);
    free(p->body);
    p->body = NULL;
    if (rc) REFUSE(400, param, "invalid_value", "%s", perr);
    if (q->c.model && strcmp(q->c.model, p->served))
        REFUSE(404, "model", "model_not_found", "The model `%.128s` does not exist.", q->c.model);
    size_t nt = 0, limit = (size_t)p->max_len; /* the prompt alone may not fill the context */
    if (p->chat) {
        cm_tools_prompt tp; /* the messages with tools, calls and results written out (cm_tools.h) */
        char *text = NULL;
        int tf = cm_tools_format(m->chat_kind);
        q->c.tool_format = tf;
        if (tf != CM_TOOLS_HERMES && (rc = cm_oai_tools_grammar(&q->c, tf, perr, sizeof perr)))
            REFUSE(rc == LLM_ENOMEM ? 500 : 400, "tools", rc == LLM_ENOMEM ? "internal_error" : "invalid_value", "%s", perr);
        if (cm_tools_render(&q->c, tf, m->default_system, &tp)) REFUSE(500, NULL, "internal_error", "out of memory");
        rc = cm_chat_render(m->chat_kind, m->default_system, tp.msgs, tp.n, q->c.add_generation_prompt, &text);
        cm_tools_free(&tp);
        if (rc || !text) REFUSE(400, "messages", "invalid_value", "cannot render the messages with the %s chat template",
                                cm_chat_name(m->chat_kind));
        rc = cm_tok_encode_limit(m->tok, text, strlen(text), -1, 1, limit, &q->tok, &nt);
        free(text);
        if (rc == LLM_ERANGE) {
            too_long(p, q, nt, "messages");
            return;
        }
    } else if (q->c.n_batch) { /* each prompt as a request of its own; the parent counts their sum */
        if (!(q->prompts = calloc((size_t)q->c.n_batch, sizeof *q->prompts))) REFUSE(500, NULL, "internal_error", "out of memory");
        for (int i = 0; i < q->c.n_batch; i++) {
            const cm_oai_prompt *b = &q->c.batch[i];
            struct gw_prompt *pp = &q->prompts[i];
            size_t k = 0;
            if (b->text) {
                rc = cm_tok_encode_limit(m->tok, b->text, b->len, -1, 1, limit, &pp->tok, &k);
                if (rc == LLM_ERANGE) {
                    too_long(p, q, k, "prompt");
                    return;
                }
                if (rc) REFUSE(400, "prompt", "invalid_value", "prompt[%d] cannot be tokenized: %s", i, cm_strerror(rc));
                if (q->c.echo && (pp->echo = malloc(b->len + 1))) memcpy(pp->echo, b->text, b->len + 1), pp->echo_len = b->len;
            } else {
                for (int t = 0; t < b->n_ids; t++)
                    if (b->ids[t] >= p->vocab)
                        REFUSE(400, "prompt", "invalid_value", "prompt[%d] token id %d is outside the vocabulary (%d tokens)",
                               i, b->ids[t], p->vocab);
                if ((size_t)b->n_ids > limit) {
                    too_long(p, q, (size_t)b->n_ids + 1, "prompt");
                    return;
                }
                k = (size_t)b->n_ids;
                if (!(pp->tok = malloc(sizeof(int32_t) * k))) REFUSE(500, NULL, "internal_error", "out of memory");
                memcpy(pp->tok, b->ids, sizeof(int32_t) * k);
                if (q->c.echo && (pp->echo = cm_tok_decode(m->tok, pp->tok, k, 0))) pp->echo_len = strlen(pp->echo);
            }
            if (!k) REFUSE(400, "prompt", "invalid_value", "prompt[%d] is empty", i);
            int mt = q->c.max_tokens ? q->c.max_tokens : 16;
            if ((int64_t)k + mt > p->max_len)
                REFUSE(400, "max_tokens", "context_length_exceeded",
                       "This model's maximum context length is %d tokens. However, you requested %lld tokens (%zu in "
                       "prompt[%d], %d in the completion). Please reduce the length of the prompt or completion.",
                       p->max_len, (long long)k + mt, k, i, mt);
            pp->n_tok = (int)k;
            nt += k;
        }
    } else if (q->c.prompt) {
        rc = cm_tok_encode_limit(m->tok, q->c.prompt, q->c.prompt_len, -1, 1, limit, &q->tok, &nt);
        if (rc == LLM_ERANGE) {
            too_long(p, q, nt, "prompt");
            return;
        }
        if (!rc && q->c.echo && (q->echo = malloc(q->c.prompt_len + 1))) {
            memcpy(q->echo, q->c.prompt, q->c.prompt_len + 1);
            q->echo_len = q->c.prompt_len;
        }
    } else {
        nt = (size_t)q->c.n_prompt_ids;
        for (size_t i = 0; i < nt; i++)
            if (q->c.prompt_ids[i] >= p->vocab)
                REFUSE(400, "prompt", "invalid_value", "prompt token id %d is outside the vocabulary (%d tokens)",
                       q->c.prompt_ids[i], p->vocab);
        if (nt > limit) {
            too_long(p, q, nt + 1, "prompt");
            return;
        }
        q->tok = malloc(sizeof(int32_t) * (nt ? nt : 1));
        if (!q->tok) REFUSE(500, NULL, "internal_error", "out of memory");
        memcpy(q->tok, q->c.prompt_ids, sizeof(int32_t) * nt);
        if (q->c.echo && (q->echo = cm_tok_decode(m->tok, q->tok, nt, 0))) q->echo_len = strlen(q->echo);
    }
    if (rc) REFUSE(400, p->chat ? "messages" : "prompt", "invalid_value", "the prompt cannot be tokenized: %s", cm_strerror(rc));
    if (!nt) REFUSE(400, p->chat ? "messages" : "prompt", "invalid_value", "the prompt is empty");
    q->n_tok = (int)nt;
    /* what the worker would refuse after a 200, refused here before it */
    for (int i = 0; i < q->c.n_bias; i++)
        if (q->c.bias[i].id >= p->vocab)
            REFUSE(400, "logit_bias", "invalid_value", "logit_bias token id %d is outside the vocabulary (%d tokens)",
                   q->c.bias[i].id, p->vocab);
    for (int i = 0; i < q->c.n_stop_ids; i++)
        if (q->c.stop_ids[i] >= p->vocab)
            REFUSE(400, "stop_token_ids", "invalid_value", "stop token id %d is outside the vocabulary (%d tokens)",
                   q->c.stop_ids[i], p->vocab);
    int L = p->max_len;
    q->max_tokens = q->c.max_tokens ? q->c.max_tokens : p->chat ? L - (int)nt : 16;
    if (!q->c.n_batch && (int64_t)nt + q->max_tokens > L) /* a batch's prompts were checked one by one */
        REFUSE(400, p->chat ? "messages" : "max_tokens", "context_length_exceeded",
               "This model's maximum context length is %d tokens. However, you requested %lld tokens (%zu in the %s, %d in "
               "the completion). Please reduce the length of the %s or completion.",
               L, (long long)nt + q->max_tokens, nt, p->chat ? "messages" : "prompt", q->max_tokens,
               p->chat ? "messages" : "prompt");
    if (q->c.min_tokens > q->max_tokens)
        REFUSE(400, "min_tokens", "invalid_value", "'min_tokens' (%d) must not exceed max_tokens (%d)", q->c.min_tokens,
               q->max_tokens);
    if (q->c.n_batch) q->max_tokens *= q->c.n_batch; /* what the rate limits count: every prompt's */
}

/* Back on the loop. */
static void prep_done(gw_job *j) {
    prep *p = (prep *)j;
    gw_req *q = p->q;
    gw *g = q->g;
    g->preparing--;
    free(p->body);
    int status = p->status;
    char err[640];
    snprintf(err, sizeof err, "%s", p->err);
    const char *code = p->code;
    free(p);
    if (!q->conn) { /* the client left while its request was prepared */
        gw_req_finish(q, 499, "the client closed the connection", "client_closed");
        return;
    }
    if (status) {
        gw_req_finish(q, status, err, code);
        return;
    }
    if (g->draining) {
        gw_http_header(q->conn, "Connection", "close");
        gw_req_finish(q, 503, "the server is shutting down", "shutting_down");
        return;
    }
    double need = (double)q->n_tok + q->max_tokens;
    if (!gw_limits_fits(&g->lim, need)) {
        q->param = "max_tokens";
        snprintf(err, sizeof err, "this request needs %.0f tokens (prompt + max_tokens), more than --rate-limit-tpm %.0f allows",
                 need, g->conf.tpm);
        gw_req_finish(q, 400, err, "invalid_value");
        return;
    }
    double wait = gw_limits_admit(&g->lim, gw_now(), q->key, need);
    if (wait > 0) {
        char ra[32];
        snprintf(ra, sizeof ra, "%d", (int)ceil(wait));
        gw_http_header(q->conn, "Retry-After", ra);
        g->m.rate_limited++;
        gw_req_finish(q, 429, "rate limit reached; retry after the time in Retry-After", "rate_limit_exceeded");
        return;
    }
    gw_req_start(g, q);
}

static void prep_gone(void *arg) {
    gw_req *q = arg;
    q->conn = NULL; /* prep_done ends it */
    q->g->m.cancelled++;
}

static int authorized(gw *g, gw_http_req *r, int *key) {
    if (gw_auth_check(&g->auth, r->authorization, key)) return 1;
    static double last;
    static unsigned long quiet;
    double t = gw_now();
    if (t - last >= 1.0) { /* one line a second at most: a key scanner must not flood the log */
        CM_WARN("401: %s API key from %s on %s (%lu more since the last line)", r->authorization ? "wrong" : "no", r->peer,
                r->path, quiet);
        last = t;
        quiet = 0;
    } else {
        quiet++;
    }
    gw_http_error(r->conn, 401, "missing or invalid API key (Authorization: Bearer KEY)", NULL, "invalid_api_key");
    return 0;
}

static void handle_generate(gw *g, gw_http_req *r, int chat) {
    int key;
    if (!authorized(g, r, &key)) return;
    if (g->draining) {
        gw_http_header(r->conn, "Connection", "close");
        gw_http_error(r->conn, 503, "the server is shutting down", NULL, "shutting_down");
        return;
    }
    if (!g->model || !g->max_model_len) {
        g->m.overloaded++;
        gw_http_error(r->conn, 503, "no worker group is available", NULL, "no_workers");
        return;
    }
    gw_req *q = calloc(1, sizeof *q);
    prep *p = calloc(1, sizeof *p);
    char *body = malloc(r->body_len + 1);
    if (!q || !p || !body) {
        free(q);
        free(p);
        free(body);
        gw_http_error(r->conn, 500, "out of memory", NULL, "internal_error");
        return;
    }
    memcpy(body, r->body, r->body_len);
    body[r->body_len] = 0;
    q->g = g;
    q->conn = r->conn;
    q->worker = -1;
    q->key = key;
    q->t_arrive = gw_now();
    q->model = gw_model_ref(g->model);
    p->job.run = prep_run;
    p->job.done = prep_done;
    p->q = q;
    p->chat = chat;
    p->body = body;
    p->len = r->body_len;
    snprintf(p->served, sizeof p->served, "%s", g->served);
    p->max_len = g->max_model_len;
    p->vocab = cm_tok_vocab(g->model->tok);
    if (gw_tokq_submit(g->tokq, &p->job)) {
        free(body);
        free(p);
        g->m.overloaded++;
        gw_http_header(q->conn, "Retry-After", "1");
        gw_req_finish(q, 503, "the gateway is at capacity: too many requests waiting to be tokenized", "overloaded");
        return;
    }
    g->preparing++;
    gw_http_on_gone(r->conn, prep_gone, q);
}

static void handle_models(gw *g, gw_http_req *r) {
    int key;
    if (!authorized(g, r, &key)) return;
    json_t *data = json_array();
    if (g->served[0])
        json_array_append_new(data, json_pack("{s:s,s:s,s:I,s:s,s:i}", "id", g->served, "object", "model", "created",
                                              (json_int_t)time(NULL), "owned_by", "llmserve", "max_model_len",
                                              g->max_model_len));
    json_t *j = json_pack("{s:s,s:o}", "object", "list", "data", data);
    gw_http_json(r->conn, 200, j);
    json_decref(j);
}

static void handle_health(gw *g, gw_http_req *r) {
    int up = gw_pool_count_up(g);
    const char *st = g->draining ? "draining" : up ? "ok" : "unavailable";
    json_t *j = json_pack("{s:s,s:i,s:i}", "status", st, "workers_up", up, "workers", g->n_workers);
    gw_http_json(r->conn, up && !g->draining ? 200 : 503, j);
    json_decref(j);
}

static void handle_metrics(gw *g, gw_http_req *r) {
    size_t n = 0;
    char *t = gw_metrics_text(g, &n);
    gw_http_body(r->conn, t ? 200 : 500, "text/plain; version=0.0.4", t ? t : "", n);
    free(t);
}

void gw_oai_handle(void *ctx, gw_http_req *r) {
    gw *g = ctx;
    int get = r->method == GW_M_GET || r->method == GW_M_HEAD;
    if (!strcmp(r->path, "/v1/chat/completions") || !strcmp(r->path, "/v1/completions")) {
        if (r->method != GW_M_POST) gw_http_method_not_allowed(r->conn, "POST");
        else handle_generate(g, r, r->path[4] == 'c' && r->path[5] == 'h');
    } else if (!strcmp(r->path, "/v1/models")) {
        if (!get) gw_http_method_not_allowed(r->conn, "GET, HEAD");
        else handle_models(g, r);
    } else if (!strcmp(r->path, "/health") || !strcmp(r->path, "/ready")) {
        if (!get) gw_http_method_not_allowed(r->conn, "GET, HEAD");
        else handle_health(g, r);
    } else if (!strcmp(r->path, "/live")) { /* the loop answers: alive, draining or not, workers or not */
        if (!get) gw_http_method_not_allowed(r->conn, "GET, HEAD");
        else gw_http_body(r->conn, 200, "application/json", "{\"status\":\"ok\"}\n", 16);
    } else if (!strcmp(r->path, "/tokenize") || !strcmp(r->path, "/detokenize")) {
        int key;
        if (r->method != GW_M_POST) gw_http_method_not_allowed(r->conn, "POST");
        else if (authorized(g, r, &key)) gw_tokenize_handle(g, r, r->path[1] == 't' ? GW_TOK_TOKENIZE : GW_TOK_DETOKENIZE);
    } else if (!strcmp(r->path, "/tokenizer_info")) {
        int key;
        if (!get) gw_http_method_not_allowed(r->conn, "GET, HEAD");
        else if (authorized(g, r, &key)) gw_tokenize_handle(g, r, GW_TOK_INFO);
    } else if (!strcmp(r->path, "/metrics")) {
        if (!get) gw_http_method_not_allowed(r->conn, "GET, HEAD");
        else handle_metrics(g, r);
    } else {
        gw_http_error(r->conn, 404, "no such endpoint", NULL, "not_found");
    }
}
