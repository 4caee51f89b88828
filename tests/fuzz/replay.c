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
    uint8_t buf[4096];
    for (long it = 0; it < iters; it++) {
        size_t n = fuzz_mutate(buf, sizeof buf, seeds, ns);
        LLVMFuzzerTestOneInput(buf, n);
    }
    for (int i = 0; i < ns; i++) free(seeds[i].b);
    printf("fuzz replay: %ld inputs, no crash\n", iters);
    return 0;
}
