/* route_test: prefix-aware routing over hand-made groups (scores, load, salts, exclusions, LoRA adapters),
 * the KV tiers' worth, and disaggregated prefill's decision per request. */
#include "cm_hash.h"
#include "gw.h"
#include "gw_keyset.h"
#include "gw_pool.h"
#include "gw_req.h"
#include "gw_route.h"
#include "tst.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Two groups; B holds the first 3 blocks of the prompt in its cache. */
static void route(void) {
    gw *g = calloc(1, sizeof *g);
    g->n_workers = 2;
    g->conf.routing = GW_ROUTE_PREFIX;
    g->conf.lambda = 8;
    for (int i = 0; i < 2; i++) {
        g->w[i].alive = g->w[i].ready = g->w[i].accepted = 1;
        g->w[i].block_size = 4;
    }
    int32_t tok[20];
    for (int i = 0; i < 20; i++) tok[i] = 100 + i;
    uint64_t parent = CM_BLOCK_ROOT;
    for (int b = 0; b < 3; b++) gw_keyset_add(&g->w[1].cached, parent = cm_block_key(parent, 0, tok + 4 * b, 4));
    int hit;
    CHECK_INT(gw_route(g, tok, 20, 0, -1, NULL, GW_ROLES_DECODE, &hit), 1);
    CHECK_INT(hit, 12);
    g->w[1].inflight = 1; /* 12 cached tokens - 8 x 1 queued = 4 > 0 */
    CHECK_INT(gw_route(g, tok, 20, 0, -1, NULL, GW_ROLES_DECODE, &hit), 1);
    g->w[1].inflight = 2; /* 12 - 16 < 0: the idle group wins, balance over affinity */
    CHECK_INT(gw_route(g, tok, 20, 0, -1, NULL, GW_ROLES_DECODE, &hit), 0);
    CHECK_INT(hit, 0);
    CHECK_INT(gw_route(g, tok, 20, 7, -1, NULL, GW_ROLES_DECODE, &hit), 0); /* another cache salt: no hit anywhere */
    g->w[1].inflight = 0;
    g->w[1].ready = 0; /* draining: never picked */
    CHECK_INT(gw_route(g, tok, 20, 0, -1, NULL, GW_ROLES_DECODE, &hit), 0);
    CHECK_INT(gw_route(g, tok, 20, 0, 0, NULL, GW_ROLES_DECODE, &hit), -1); /* the only routable group excluded */
    g->w[1].ready = 1;
    g->w[0].accepted = 0; /* serves another model */
    CHECK_INT(gw_route(g, tok, 20, 0, 1, NULL, GW_ROLES_DECODE, &hit), -1);
    g->w[0].accepted = 1;
    g->conf.routing = GW_ROUTE_ROUND_ROBIN;
    int a = gw_route(g, tok, 20, 0, -1, NULL, GW_ROLES_DECODE, &hit), b = gw_route(g, tok, 20, 0, -1, NULL, GW_ROLES_DECODE, &hit);
    CHECK(a != b);
    /* a LoRA adapter's request goes only to a group that holds it, whatever the others' cache or load */
    snprintf(g->w[1].loras, sizeof g->w[1].loras, "\nsql\nchat-v2\n");
    g->w[1].inflight = 5;
    for (int k = 0; k < 3; k++) CHECK_INT(gw_route(g, tok, 20, 0, -1, "chat-v2", GW_ROLES_DECODE, &hit), 1);
    CHECK_INT(gw_route(g, tok, 20, 0, -1, "chat", GW_ROLES_DECODE, &hit), -1); /* a name's prefix is not the name */
    CHECK_INT(gw_route(g, tok, 20, 0, 1, "sql", GW_ROLES_DECODE, &hit), -1);
    CHECK(gw_pool_has_lora(g->w[1].loras, "sql") && !gw_pool_has_lora(g->w[1].loras, "ql") &&
          !gw_pool_has_lora("", "sql"));
    g->w[1].inflight = 0;
    g->w[1].loras[0] = 0;
    for (int i = 0; i < 2; i++) free(g->w[i].cached.k);
    free(g);
}

/* Disaggregated prefill: the decision per request. A consumer group that lacks a long part of the prompt gets
 * it prefilled by a producer first; a short uncached part, a kv_both decode group, n > 1, prompt scoring or a
 * resumed request runs where it decodes; a producer decodes only when nothing else is up. */
static void route_pd(void) {
    gw *g = calloc(1, sizeof *g);
    g->n_workers = 2;
    g->conf.routing = GW_ROUTE_PREFIX;
    g->conf.lambda = 8;
    g->conf.max_local_prefill = 64;
    for (int i = 0; i < 2; i++) {
        g->w[i].alive = g->w[i].ready = g->w[i].accepted = 1;
        g->w[i].block_size = 16;
    }
    g->w[0].kv_role = LLMSERVE__KV_ROLE__KV_PRODUCER;
    g->w[1].kv_role = LLMSERVE__KV_ROLE__KV_CONSUMER;
    static int32_t tok[400];
    for (int i = 0; i < 400; i++) tok[i] = 500 + i;
    gw_req q;
    memset(&q, 0, sizeof q);
    q.tok = tok;
    q.n_tok = 400;
    q.max_tokens = 32;
    q.c.n = 1;
    q.c.prompt_logprobs = q.c.logprobs = -1;
    int hit;
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 0); /* prefilled by the producer ... */
    CHECK_INT(q.pd_decode, 2);                           /* ... for the consumer */
    q.n_tok = 64; /* 64 uncached: at the bound, prefilled where it decodes */
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 1);
    CHECK_INT(q.pd_decode, 0);
    q.n_tok = 400;
    uint64_t parent = CM_BLOCK_ROOT; /* the consumer holds all but 48 of it: local */
    for (int b = 0; b < 22; b++) gw_keyset_add(&g->w[1].cached, parent = cm_block_key(parent, 0, tok + 16 * b, 16));
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 1);
    CHECK_INT(q.pd_decode, 0);
    gw_keyset_clear(&g->w[1].cached);
    q.c.n = 2; /* several choices, prompt scoring, a resume, max_tokens 1: never split */
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 1);
    q.c.n = 1;
    q.c.prompt_logprobs = 0;
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 1);
    q.c.prompt_logprobs = -1;
    q.got_token = 1;
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 1);
    CHECK_INT(q.pd_decode, 0);
    q.got_token = 0;
    q.max_tokens = 1;
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 1);
    q.max_tokens = 32;
    g->w[1].kv_role = LLMSERVE__KV_ROLE__KV_BOTH; /* a group that did not ask for KV adopts none */
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 1);
    CHECK_INT(q.pd_decode, 0);
    g->w[1].kv_role = LLMSERVE__KV_ROLE__KV_CONSUMER;
    CHECK_INT(gw_req_generate_pick(g, &q, 0, &hit), 1); /* the producer excluded (it failed): local */
    CHECK_INT(q.pd_decode, 0);
    g->w[1].alive = 0; /* no decode group up: the producer serves it whole */
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 0);
    CHECK_INT(q.pd_decode, 0);
    g->w[1].alive = 1;
    g->w[0].alive = 0; /* no producer up: the consumer prefills for itself */
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 1);
    CHECK_INT(q.pd_decode, 0);
    /* --idle-prefill-min-length: a short prompt goes to the producer too while the consumer decodes and the
     * producer has no long prompt to compute */
    g->w[0].alive = 1;
    g->conf.idle_prefill_min = 16;
    q.g = g;
    q.n_tok = 48;
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 1); /* the consumer has nothing in flight: local */
    CHECK_INT(q.pd_decode, 0);
    g->w[1].inflight = 3;
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 0); /* it decodes: the free producer prefills */
    CHECK_INT(q.pd_decode, 2);
    CHECK_INT(q.pd_tokens, 48);
    gw_req_join(&q, 0); /* on the producer: 48 of its 64 short-prompt tokens taken */
    CHECK_INT(g->w[0].prefill_tokens, 48);
    gw_req r = q;
    r.joined = 0;
    r.n_tok = 40; /* 48 + 40 > 64: local */
    CHECK_INT(gw_req_generate_pick(g, &r, -1, &hit), 1);
    CHECK_INT(r.pd_decode, 0);
    r.n_tok = 16; /* 48 + 16: still free */
    CHECK_INT(gw_req_generate_pick(g, &r, -1, &hit), 0);
    CHECK_INT(r.pd_decode, 2);
    r.n_tok = 400; /* a long prompt is sent whatever the producer holds */
    CHECK_INT(gw_req_generate_pick(g, &r, -1, &hit), 0);
    gw_req_leave(&q, 0);
    CHECK_INT(g->w[0].prefill_tokens, 0);
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 0);
    g->w[0].waiting = 1; /* requests queued there (another gateway's): local */
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 1);
    g->w[0].waiting = 0;
    g->w[0].running = 1; /* one running that is not this gateway's (it could be long): local */
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 1);
    g->w[0].running = 0;
    q.n_tok = 8; /* under the minimum: local */
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 1);
    q.n_tok = 48;
    g->conf.idle_prefill_min = 0; /* off */
    CHECK_INT(gw_req_generate_pick(g, &q, -1, &hit), 1);
    CHECK_INT(q.pd_decode, 0);
    free(g->w[1].cached.k);
    free(g);
}

/* The tiers a group holds a prefix in: its pool beats its memory tier, which beats its disk tier, which beats
 * a miss; a chain continues across tiers (the worker loads the rest from below). */
static void route_tiers(void) {
    gw *g = calloc(1, sizeof *g);
    g->n_workers = 3;
    g->conf.routing = GW_ROUTE_PREFIX;
    g->conf.lambda = 2;
    g->conf.tier_weight[0] = 0.8;
    g->conf.tier_weight[1] = 0.5;
    for (int i = 0; i < 3; i++) {
        g->w[i].alive = g->w[i].ready = g->w[i].accepted = 1;
        g->w[i].block_size = 4;
    }
    int32_t tok[20];
    for (int i = 0; i < 20; i++) tok[i] = 300 + i;
    uint64_t key[4], parent = CM_BLOCK_ROOT;
    for (int b = 0; b < 4; b++) key[b] = parent = cm_block_key(parent, 0, tok + 4 * b, 4);
    for (int b = 0; b < 4; b++) { /* group 0: all in its pool; 1: in memory; 2: on disk */
        gw_keyset_add(&g->w[0].cached, key[b]);
        gw_keyset_add(&g->w[1].lower[0], key[b]);
        gw_keyset_add(&g->w[2].lower[1], key[b]);
    }
    int hit;
    CHECK_INT(gw_route(g, tok, 20, 0, -1, NULL, GW_ROLES_DECODE, &hit), 0);
    CHECK_INT(hit, 16);
    CHECK_INT(gw_route(g, tok, 20, 0, 0, NULL, GW_ROLES_DECODE, &hit), 1); /* without the pool's holder: memory before disk */
    CHECK_INT(hit, 16);
    gw_keyset_del(&g->w[1].lower[0], key[2]); /* memory tier's chain cut after 2 blocks: 6.4 < disk's 8 */
    CHECK_INT(gw_route(g, tok, 20, 0, 0, NULL, GW_ROLES_DECODE, &hit), 2);
    CHECK_INT(hit, 16);
    gw_keyset_add(&g->w[1].cached, key[2]); /* the pool holds block 2 and memory the rest: 4*(0.8+0.8+1+0.8) */
    CHECK_INT(gw_route(g, tok, 20, 0, 0, NULL, GW_ROLES_DECODE, &hit), 1);
    g->w[2].inflight = 1;
    g->w[1].inflight = 1;
    /* a disk hit still beats a miss at the same load: group 0 gone, a fresh group without the prefix */
    gw_keyset_clear(&g->w[1].cached);
    gw_keyset_clear(&g->w[1].lower[0]);
    CHECK_INT(gw_route(g, tok, 20, 0, 0, NULL, GW_ROLES_DECODE, &hit), 2);
    CHECK_INT(hit, 16);
    for (int i = 0; i < 3; i++) {
        free(g->w[i].cached.k);
        free(g->w[i].lower[0].k);
        free(g->w[i].lower[1].k);
    }
    free(g);
}

int main(void) {
    route();
    route_tiers();
    route_pd();
    return tst_done("route_test");
}
