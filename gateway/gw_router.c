/* gw_router.c - every path the gateway answers, and the small handlers
 * (health, metrics, the APIs rewritten onto the chat and embeddings paths:
 * Anthropic's Messages, OpenAI's Responses, score and rerank; files and
 * batch jobs). The completions and chat flow is gw_oai.c's. */
#include "gw_router.h"
#include "cm_error.h"
#include "cm_time.h"
#include "gw_admit.h"
#include "gw_anthropic.h"
#include "gw_embed.h"
#include "gw_files.h"
#include "gw_jobs.h"
#include "gw_lora.h"
#include "gw_metrics.h"
#include "gw_models.h"
#include "gw_oai.h"
#include "gw_pool.h"
#include "gw_responses.h"
#include "gw_score.h"
#include "gw_tokenize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Anthropic's Messages API: the request rewritten as a chat one and the replies rewritten back
 * (gw_anthropic.h); x-api-key is a key as Authorization: Bearer is. */
static void handle_messages(gw *g, gw_http_req *r, int count) {
    if (gw_anth_attach(r->conn, count)) {
        gw_http_error(r->conn, 500, "out of memory", NULL, "internal_error");
        return;
    }
    char err[400], auth[600], *body = NULL;
    const char *param = NULL;
    size_t len = 0;
    if (gw_anth_request(r->body, r->body_len, count, &body, &len, err, sizeof err, &param)) {
        gw_http_error(r->conn, 400, err, param, "invalid_value"); /* in Anthropic's shape, by the filter */
        return;
    }
    gw_http_req a = *r;
    if (!a.authorization && a.x_api_key) {
        snprintf(auth, sizeof auth, "Bearer %.500s", a.x_api_key);
        a.authorization = auth;
    }
    a.body = body;
    a.body_len = len;
    int key;
    if (!count) gw_oai_generate(g, &a, 1);
    else if (gw_admit_authorized(g, &a, &key)) gw_tokenize_handle(g, &a, GW_TOK_TOKENIZE);
    free(body);
}

/* The Responses API (gw_responses.h): its chat requests run as /v1/chat/completions ones. */
static void generate_chat(void *ctx, gw_http_req *r) { gw_oai_generate(ctx, r, 1); }

static void handle_responses(gw *g, gw_http_req *r) {
    int key;
    const char *id = r->path[13] ? r->path + 14 : NULL;
    if (!id && r->method != GW_M_POST) gw_http_method_not_allowed(r->conn, "POST");
    else if (id && r->method != GW_M_GET && r->method != GW_M_HEAD && r->method != GW_M_DELETE)
        gw_http_method_not_allowed(r->conn, "GET, HEAD, DELETE");
    else if (!gw_admit_authorized(g, r, &key)) return;
    else if (!id) gw_resp_create(g->rstore, r, gw_auth_tag(&g->auth, key), generate_chat, g);
    else gw_resp_lookup(g->rstore, r, gw_auth_tag(&g->auth, key), id, r->method == GW_M_DELETE);
}

/* vLLM's /v1/score and /v1/rerank over the embedding model (gw_score.h): one embeddings request, its reply
 * rewritten. */
static void handle_score(gw *g, gw_http_req *r, int rerank) {
    int key;
    if (r->method != GW_M_POST) {
        gw_http_method_not_allowed(r->conn, "POST");
        return;
    }
    if (!gw_admit_authorized(g, r, &key)) return;
    char err[400], *body = NULL;
    const char *param = NULL;
    int rc = gw_score_request(r->conn, r->body, r->body_len, rerank, &body, err, sizeof err, &param);
    if (rc) {
        gw_http_error(r->conn, rc == LLM_EINVAL ? 400 : 500, err, param, rc == LLM_EINVAL ? "invalid_value" : "internal_error");
        return;
    }
    gw_http_req a = *r;
    a.body = body;
    a.body_len = strlen(body);
    gw_embed_handle(g, &a, key);
    free(body);
}

/* Ready (200) once a group is up and, at the start, every group of --workers has settled (its model accepted
 * or refused), so a client is not told ready while a model one of them serves is still loading; a group not
 * there within --startup-wait no longer holds it. After that, while any group is up. */
static void handle_health(gw *g, gw_http_req *r) {
    int up = gw_pool_count_up(g), loading = 0;
    if (!g->ready_once && cm_now() - g->started < g->conf.startup_wait) loading = gw_pool_count_loading(g);
    if (up && !loading && !g->draining) g->ready_once = 1;
    const char *st = g->draining ? "draining" : loading && up ? "loading" : up ? "ok" : "unavailable";
    json_t *j = json_pack("{s:s,s:i,s:i,s:i}", "status", st, "workers_up", up, "workers", g->n_workers,
                          "workers_loading", loading);
    gw_http_json(r->conn, up && !loading && !g->draining ? 200 : 503, j);
    json_decref(j);
}

static void handle_metrics(gw *g, gw_http_req *r) {
    size_t n = 0;
    char *t = gw_metrics_text(g, &n);
    gw_http_body(r->conn, t ? 200 : 500, "text/plain; version=0.0.4", t ? t : "", n);
    free(t);
}

void gw_router_handle(void *ctx, gw_http_req *r) {
    gw *g = ctx;
    int get = r->method == GW_M_GET || r->method == GW_M_HEAD;
    if (!strcmp(r->path, "/v1/chat/completions") || !strcmp(r->path, "/v1/completions")) {
        if (r->method != GW_M_POST) gw_http_method_not_allowed(r->conn, "POST");
        else gw_oai_generate(g, r, r->path[4] == 'c' && r->path[5] == 'h');
    } else if (!strcmp(r->path, "/v1/messages") || !strcmp(r->path, "/v1/messages/count_tokens")) {
        if (r->method != GW_M_POST) gw_http_method_not_allowed(r->conn, "POST");
        else handle_messages(g, r, r->path[12] == '/');
    } else if (!strcmp(r->path, "/v1/responses") || (!strncmp(r->path, "/v1/responses/", 14) && r->path[14])) {
        handle_responses(g, r);
    } else if (!strcmp(r->path, "/v1/files") || !strncmp(r->path, "/v1/files/", 10) || !strcmp(r->path, "/v1/batches") ||
               !strncmp(r->path, "/v1/batches/", 12)) {
        int key;
        char m[400];
        if (!gw_admit_authorized(g, r, &key)) return;
        snprintf(m, sizeof m, "files and batches are off on this gateway: %s", g->files_off);
        if (!g->jobs) gw_http_error(r->conn, 503, m, NULL, "files_unavailable");
        else if (r->path[4] == 'f') gw_files_handle(g->files_dir, r, gw_auth_tag(&g->auth, key), r->path + 9);
        else gw_jobs_handle(g->jobs, r, gw_auth_tag(&g->auth, key), r->path + 11);
    } else if (!strcmp(r->path, "/v1/score") || !strcmp(r->path, "/score")) {
        handle_score(g, r, 0);
    } else if (!strcmp(r->path, "/v1/rerank") || !strcmp(r->path, "/rerank") || !strcmp(r->path, "/v2/rerank")) {
        handle_score(g, r, 1);
    } else if (!strcmp(r->path, "/v1/embeddings")) {
        int key;
        if (r->method != GW_M_POST) gw_http_method_not_allowed(r->conn, "POST");
        else if (gw_admit_authorized(g, r, &key)) gw_embed_handle(g, r, key);
    } else if (!strcmp(r->path, "/v1/models") || (!strncmp(r->path, "/v1/models/", 11) && r->path[11])) {
        int key;
        if (!get) gw_http_method_not_allowed(r->conn, "GET, HEAD");
        else if (gw_admit_authorized(g, r, &key)) gw_models_handle(g, r, r->path[10] ? r->path + 11 : NULL);
    } else if (!strcmp(r->path, "/health") || !strcmp(r->path, "/ready")) {
        if (!get) gw_http_method_not_allowed(r->conn, "GET, HEAD");
        else handle_health(g, r);
    } else if (!strcmp(r->path, "/live")) { /* the loop answers: alive, draining or not, workers or not */
        if (!get) gw_http_method_not_allowed(r->conn, "GET, HEAD");
        else gw_http_body(r->conn, 200, "application/json", "{\"status\":\"ok\"}\n", 16);
    } else if (!strcmp(r->path, "/tokenize") || !strcmp(r->path, "/detokenize")) {
        int key;
        if (r->method != GW_M_POST) gw_http_method_not_allowed(r->conn, "POST");
        else if (gw_admit_authorized(g, r, &key)) gw_tokenize_handle(g, r, r->path[1] == 't' ? GW_TOK_TOKENIZE : GW_TOK_DETOKENIZE);
    } else if (!strcmp(r->path, "/tokenizer_info")) {
        int key;
        if (!get) gw_http_method_not_allowed(r->conn, "GET, HEAD");
        else if (gw_admit_authorized(g, r, &key)) gw_tokenize_handle(g, r, GW_TOK_INFO);
    } else if (!strcmp(r->path, "/v1/load_lora_adapter") || !strcmp(r->path, "/v1/unload_lora_adapter")) {
        int key;
        if (r->method != GW_M_POST) gw_http_method_not_allowed(r->conn, "POST");
        else if (gw_admit_authorized(g, r, &key)) gw_lora_handle(g, r, r->path[4] == 'u');
    } else if (!strcmp(r->path, "/metrics")) {
        if (!get) gw_http_method_not_allowed(r->conn, "GET, HEAD");
        else handle_metrics(g, r);
    } else {
        gw_http_error(r->conn, 404, "no such endpoint", NULL, "not_found");
    }
}
