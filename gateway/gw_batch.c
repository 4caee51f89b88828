#include "gw_batch.h"
#include "gw_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
    gw_prompt *prompts;          /* [n_kids], each taken by its part when it starts */
    gw_req **kids;               /* the parts still running; NULL once each ended */
    int n_kids, kids_left, starting;
    json_t *choices;             /* the response's choices, by index (not streamed) */
    int sum_prompt, sum_completion, sum_cached;
    int kid_status;              /* a part failed while the whole was starting them */
    char kid_msg[256];
    const char *kid_code;
    const char *kid_param;
} batch;

void gw_prompts_free(gw_prompt *p, int n) {
    for (int i = 0; p && i < n; i++) {
        free(p[i].tok);
        free(p[i].echo);
    }
    free(p);
}

static json_t *batch_usage(const batch *b) {
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", b->sum_prompt, "completion_tokens", b->sum_completion,
                     "total_tokens", b->sum_prompt + b->sum_completion, "prompt_tokens_details", "cached_tokens",
                     b->sum_cached);
}

/* The whole's response: its parts' choices, and their usage summed. */
static json_t *batch_json(const gw_req *q, json_t *choices) { /* takes choices */
    const batch *b = q->x;
    return json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", q->id, "object", "text_completion", "created",
                     (json_int_t)q->res.created, "model", q->g->served, "choices", choices, "usage", batch_usage(b));
}

/* The whole ends: its answer prepared, or what still runs ended soon, unseen. */
static void whole_end(gw_req *q, int status, const char *msg, const char *code) {
    (void)msg;
    (void)code;
    batch *b = q->x;
    for (int i = 0; i < b->n_kids; i++)
        if (b->kids[i]) {
            gw_req *k = b->kids[i];
            k->up = NULL;
            gw_req_end_soon(k, 499, "the rest of its batch ended", "client_closed");
            b->kids[i] = NULL;
        }
    if (status != 200) return;
    if (!q->c.stream) q->body = batch_json(q, json_incref(b->choices));
    else if (q->c.include_usage) q->body = batch_json(q, json_array()); /* the stream's usage chunk */
}

static void whole_release(gw_req *q) {
    batch *b = q->x;
    if (!b) return;
    gw_prompts_free(b->prompts, b->n_kids);
    free(b->kids);
    json_decref(b->choices);
    free(b);
    q->x = NULL;
}

static const gw_req_ops whole_ops = {.on_end = whole_end, .release = whole_release, .tokens = 1};

/* A part ends: its whole takes its choices and usage, or its error. */
static void part_end(gw_req *kid, int status, const char *msg, const char *code) {
    gw_req *par = kid->up;
    if (!par) return; /* the whole ended first */
    kid->up = NULL;
    batch *b = par->x;
    for (int i = 0; i < b->n_kids; i++)
        if (b->kids[i] == kid) b->kids[i] = NULL;
    if (status != 200) {
        if (b->starting) { /* the whole ends once every part has been started (or not) */
            if (!b->kid_status) {
                b->kid_status = status;
                snprintf(b->kid_msg, sizeof b->kid_msg, "%s", msg ? msg : "");
                b->kid_code = code;
                b->kid_param = kid->param;
            }
            return;
        }
        par->param = kid->param;
        gw_req_finish(par, status, msg, code);
        return;
    }
    b->sum_prompt += kid->res.prompt_tokens;
    b->sum_cached += kid->res.cached_tokens;
    for (int i = 0; i < kid->res.n && !kid->c.score_only; i++) b->sum_completion += kid->res.ch[i].completion_tokens;
    if (!par->c.stream) { /* its choices, renumbered into the whole's */
        json_t *j = cm_oai_response_json(&kid->res, kid->model ? kid->model->tok : NULL);
        json_t *ch = json_object_get(j, "choices");
        for (size_t i = 0; i < json_array_size(ch); i++) {
            json_t *c = json_array_get(ch, i);
            json_object_set_new(c, "index", json_integer(kid->base + (int)i));
            json_array_set(b->choices, (size_t)kid->base + i, c);
        }
        json_decref(j);
    }
    if (--b->kids_left == 0 && !b->starting) gw_req_finish(par, 200, NULL, NULL);
}

static const gw_req_ops part_ops = {.pick = gw_req_generate_pick,
                                    .send = gw_req_generate_send,
                                    .begin = gw_req_generate_begin,
                                    .on_end = part_end,
                                    .none = "no worker group is available",
                                    .tokens = 1,
                                    .part = 1};

void gw_batch_start(gw *g, gw_req *q, gw_prompt *prompts) {
    int P = q->c.n_batch, n = q->c.n;
    batch *b = calloc(1, sizeof *b);
    q->ops = &whole_ops;
    q->x = b;
    if (!b) {
        gw_prompts_free(prompts, P);
        gw_req_finish(q, 500, "out of memory", "internal_error");
        return;
    }
    b->prompts = prompts;
    b->n_kids = P;
    snprintf(q->id, sizeof q->id, "cmpl-%s%llxb", g->id, (unsigned long long)(g->next_rid + 1));
    q->res.created = (long)time(NULL);
    b->kids = calloc((size_t)P, sizeof *b->kids);
    b->choices = json_array();
    for (int i = 0; b->choices && i < P * n; i++) json_array_append_new(b->choices, json_null());
    if (!b->kids || !b->choices || gw_req_enlist(g, q)) {
        gw_req_finish(q, 500, "out of memory", "internal_error");
        return;
    }
    if (q->c.stream) gw_http_stream_begin(q->conn);
    b->starting = 1;
    for (int i = 0; i < P && !b->kid_status; i++) {
        gw_req *k = calloc(1, sizeof *k);
        if (!k || cm_oai_completion_copy_params(&q->c, &k->c)) {
            free(k);
            b->kid_status = 500;
            snprintf(b->kid_msg, sizeof b->kid_msg, "out of memory");
            b->kid_code = "internal_error";
            break;
        }
        k->g = g;
        k->ops = &part_ops;
        k->up = q;
        k->base = i * n;
        k->worker = -1;
        k->lora = q->lora;
        k->key = q->key;
        k->t_arrive = q->t_arrive;
        k->model = gw_model_ref(q->model);
        k->tok = prompts[i].tok, k->n_tok = prompts[i].n_tok;
        k->echo = prompts[i].echo, k->echo_len = prompts[i].echo_len;
        prompts[i].tok = NULL, prompts[i].echo = NULL;
        k->max_tokens = q->max_tokens / P;
        snprintf(k->id, sizeof k->id, "%s", q->id);
        b->kids[i] = k;
        b->kids_left++;
        gw_req_start(g, k); /* a refusal comes back through part_end */
    }
    b->starting = 0;
    if (b->kid_status) {
        q->param = b->kid_param;
        gw_req_finish(q, b->kid_status, b->kid_msg, b->kid_code);
    } else if (!b->kids_left) {
        gw_req_finish(q, 200, NULL, NULL);
    }
}
