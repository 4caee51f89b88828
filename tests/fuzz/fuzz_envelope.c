/* Fuzz target: decoding of wire messages from an untrusted peer.
 *
 * Built two ways: with clang's libFuzzer (LLMSERVE_FUZZ=ON, tools/setup.sh
 * runs it briefly) and, everywhere, linked with replay.c into a ctest that
 * mutates valid messages deterministically under the same checks. Every
 * input must either be refused with an error code or decode into an
 * envelope whose fields the worker can read safely. */
#include "cm_error.h"
#include "pr_wire.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Touches every field the worker reads, as the worker reads them. */
static size_t walk(const pr_env *e) {
    size_t acc = 0;
    switch (e->body_case) {
    case LLMSERVE__ENVELOPE__BODY_HELLO: acc += strlen(e->hello->gateway_id) + strlen(e->hello->reply_address); break;
    case LLMSERVE__ENVELOPE__BODY_GENERATE: {
        const Llmserve__Generate *g = e->generate;
        acc += strlen(g->gateway_id) + (g->cache_salt ? strlen(g->cache_salt) : 0);
        acc += g->kv_push_address ? strlen(g->kv_push_address) : 0;
        for (size_t i = 0; i < g->n_token_ids; i++) acc += (size_t)(uint32_t)g->token_ids[i];
        if (g->params) {
            const Llmserve__SamplingParams *p = g->params;
            for (size_t i = 0; i < p->n_stop; i++) acc += strlen(p->stop[i]);
            for (size_t i = 0; i < p->n_stop_token_ids; i++) acc += (size_t)(uint32_t)p->stop_token_ids[i];
            for (size_t i = 0; i < p->n_logit_bias_ids; i++) acc += (size_t)(uint32_t)p->logit_bias_ids[i];
            for (size_t i = 0; i < p->n_logit_bias_values; i++) acc += (size_t)(p->logit_bias_values[i] != 0);
        }
        break;
    }
    case LLMSERVE__ENVELOPE__BODY_CANCEL: acc += strlen(e->cancel->gateway_id); break;
    case LLMSERVE__ENVELOPE__BODY_KV_TRANSFER: { /* as wk_srv_kv_on_transfer reads a block */
        const Llmserve__KvTransfer *t = e->kv_transfer;
        for (size_t i = 0; i < t->n_blocks; i++) {
            const Llmserve__KvBlock *b = t->blocks[i];
            for (size_t k = 0; k < b->n_token_ids; k++) acc += (size_t)(uint32_t)b->token_ids[k];
            if (b->has_payload && b->payload.len) acc += b->payload.data[b->payload.len - 1];
            acc += (size_t)b->key;
        }
        break;
    }
    case LLMSERVE__ENVELOPE__BODY_CHUNK: {
        const Llmserve__TokenChunk *c = e->chunk;
        acc += c->n_token_ids + c->text.len + (c->error ? strlen(c->error) : 0);
        for (size_t i = 0; i < c->n_logprobs; i++) acc += c->logprobs[i]->n_top;
        if (c->usage) acc += (size_t)c->usage->completion_tokens;
        break;
    }
    case LLMSERVE__ENVELOPE__BODY_STATS_REQUEST: acc += strlen(e->stats_request->gateway_id); break;
    case LLMSERVE__ENVELOPE__BODY_KV_EVENTS:
        for (size_t i = 0; i < e->kv_events->n_events; i++) acc += (size_t)e->kv_events->events[i]->key;
        break;
    case LLMSERVE__ENVELOPE__BODY_HEALTH:
        acc += strlen(e->health->worker_id) + (e->health->model ? strlen(e->health->model) : 0);
        break;
    case LLMSERVE__ENVELOPE__BODY_ERROR: acc += strlen(e->error->message); break;
    default: break;
    }
    return acc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pr_env *e;
    char err[256];
    uint32_t pv;
    int rc = pr_decode(data, size, &e, &pv, err, sizeof err);
    if (rc == 0) {
        volatile size_t sink = walk(e);
        (void)sink;
        /* and re-encodes (protobuf-c keeps unknown fields, some in forms its
         * own decoder refuses, e.g. a non-minimal tag 0, so no round trip) */
        size_t n = llmserve__envelope__get_packed_size(e);
        uint8_t *buf = malloc(n ? n : 1);
        if (buf) llmserve__envelope__pack(e, buf);
        free(buf);
        pr_free(e);
    } else if (rc != LLM_EFORMAT && rc != LLM_EUNSUP && rc != LLM_ERANGE && rc != LLM_ETRUNC) {
        fprintf(stderr, "unexpected refusal %d: %s\n", rc, err);
        abort(); /* only the documented refusals */
    }
    return 0;
}
