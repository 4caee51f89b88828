/* Deterministic mutation driver for fuzz targets, for builds without
 * libFuzzer: argv[1] = iterations (default 200000). Seeds are valid messages
 * of every kind; each iteration flips bits, truncates, duplicates or splices
 * them and feeds the result to the target (under ASan in CI). */
#include "pr_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mutate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static fuzz_seed pack(pr_env *e) {
    fuzz_seed s;
    s.n = llmserve__envelope__get_packed_size(e);
    s.b = malloc(s.n);
    llmserve__envelope__pack(e, s.b);
    return s;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 200000;
    fuzz_seed seeds[8];
    int ns = 0;
    pr_env e;
    Llmserve__Hello h = LLMSERVE__HELLO__INIT;
    h.gateway_id = "gw-1";
    h.reply_address = "tcp://127.0.0.1:9000";
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_HELLO;
    e.hello = &h;
    seeds[ns++] = pack(&e);
    int32_t toks[6] = {1, 2, 3, 40000, 5, 6};
    char *stops[2] = {"\n\n", "END"};
    int32_t bid[2] = {5, 7};
    float bval[2] = {1.5f, -100};
    Llmserve__SamplingParams sp = LLMSERVE__SAMPLING_PARAMS__INIT;
    sp.has_temperature = 1;
    sp.temperature = 0.7f;
    sp.n_stop = 2;
    sp.stop = stops;
    sp.n_logit_bias_ids = sp.n_logit_bias_values = 2;
    sp.logit_bias_ids = bid;
    sp.logit_bias_values = bval;
    Llmserve__Generate g = LLMSERVE__GENERATE__INIT;
    g.request_id = 77;
    g.n_token_ids = 6;
    g.token_ids = toks;
    g.params = &sp;
    g.gateway_id = "gw-1";
    g.cache_salt = "tenant";
    g.kv_push_address = "tcp://10.0.0.6:7600"; /* a prefill for another group */
    g.has_kv_transfer_id = 1;
    g.kv_transfer_id = 0x1234abcd;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_GENERATE;
    e.generate = &g;
    seeds[ns++] = pack(&e);
    Llmserve__TopLogprob tl = LLMSERVE__TOP_LOGPROB__INIT, *tlp = &tl;
    Llmserve__TokenLogprob lp = LLMSERVE__TOKEN_LOGPROB__INIT, *lpp = &lp;
    lp.n_top = 1;
    lp.top = &tlp;
    Llmserve__Usage us = LLMSERVE__USAGE__INIT;
    Llmserve__TokenChunk ch = LLMSERVE__TOKEN_CHUNK__INIT;
    ch.request_id = 77;
    ch.seq = 3;
    ch.n_token_ids = 2;
    ch.token_ids = toks;
    ch.has_text = 1;
    ch.text.data = (uint8_t *)"hi there";
    ch.text.len = 8;
    ch.n_logprobs = 1;
    ch.logprobs = &lpp;
    ch.usage = &us;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_CHUNK;
    e.chunk = &ch;
    seeds[ns++] = pack(&e);
    Llmserve__KvEvent ev = LLMSERVE__KV_EVENT__INIT, *evp = &ev;
    ev.kind = LLMSERVE__KV_EVENT__KIND__STORED;
    ev.key = 123456789;
    Llmserve__KvEvents kv = LLMSERVE__KV_EVENTS__INIT;
    kv.n_events = 1;
    kv.events = &evp;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_KV_EVENTS;
    e.kv_events = &kv;
    seeds[ns++] = pack(&e);
    uint8_t payload[96];
    for (size_t i = 0; i < sizeof payload; i++) payload[i] = (uint8_t)(i * 37);
    Llmserve__KvBlock kb[2] = {LLMSERVE__KV_BLOCK__INIT, LLMSERVE__KV_BLOCK__INIT}, *kbp[2] = {&kb[0], &kb[1]};
    for (int i = 0; i < 2; i++) {
        kb[i].key = 1000 + (uint64_t)i;
        kb[i].has_parent = kb[i].has_salt = kb[i].has_payload = 1;
        kb[i].parent = (uint64_t)i;
        kb[i].n_token_ids = 6;
        kb[i].token_ids = toks;
        kb[i].payload.data = payload;
        kb[i].payload.len = sizeof payload;
    }
    Llmserve__KvTransfer xt = LLMSERVE__KV_TRANSFER__INIT;
    xt.transfer_id = 0x1234abcd;
    xt.has_fingerprint = xt.has_last = xt.has_block_count = xt.has_sent_unix_ns = 1;
    xt.fingerprint = 99;
    xt.n_blocks = 2;
    xt.blocks = kbp;
    xt.last = 1;
    xt.block_count = 2;
    xt.sent_unix_ns = 1;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_KV_TRANSFER;
    e.kv_transfer = &xt;
    seeds[ns++] = pack(&e);
    uint8_t buf[4096];
    for (long it = 0; it < iters; it++) {
        size_t n = fuzz_mutate(buf, sizeof buf, seeds, ns);
        LLVMFuzzerTestOneInput(buf, n);
    }
    for (int i = 0; i < ns; i++) free(seeds[i].b);
    printf("fuzz replay: %ld inputs, no crash\n", iters);
    return 0;
}
