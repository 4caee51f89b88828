/* engine_test: continuous batching, paged KV and prefix caching on the real
 * default model. Every comparison is between two real runs of the engine:
 * batched against alone, cached against uncached, starved of blocks against
 * roomy, one choice against several. argv[1]: the GGUF model (skips when
 * absent). */
#include "engine_tst.h"

#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_log.h"
#include "wk_cost.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <string.h>
#include <unistd.h>

/* Request i's parameters: greedy, or (sampled) seeded draws of several kinds, which a step runs over the
 * model's threads at once (wk_step.c draw_all): each must be its draws alone. */
static wk_params params_of(int i, int sampled, int gen) {
    wk_params gp = greedy(gen);
    if (!sampled) return gp;
    gp.s.temperature = 0.7f + 0.05f * (float)(i % 5);
    gp.has_seed = 1;
    gp.seed = 1000u + (uint64_t)i;
    if (i % 2) gp.s.top_p = 0.9f;
    if (i % 3 == 1) gp.s.top_k = 40;
    if (i % 4 == 2) gp.s.presence_penalty = 0.5f, gp.s.repetition_penalty = 1.1f;
    if (i % 5 == 3) gp.s.min_p = 0.05f;
    if (i % 6 == 4) gp.logprobs = 2;
    gp.ignore_eos = 1;
    return gp;
}

static void test_batched_equals_alone(int sampled) {
    enum { N = 32, GEN = 12 };
    static result alone[N], together[N];
    static int32_t p[N][400];
    int len[N];
    for (int i = 0; i < N; i++) {
        len[i] = 1 + (i * 37) % 300;
        prompt(i * 13, len[i], p[i]);
    }
    char err[256];
    wk_engine_opts o;
    wk_engine *e;
    memset(alone, 0, sizeof alone);
    memset(together, 0, sizeof together);
    /* alone: one request at a time, roomy budget */
    opts(&o, 512, 1);
    o.prefix_caching = 0;
    CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), 0);
    for (int i = 0; i < N; i++) {
        wk_params gp = params_of(i, sampled, GEN);
        CHECK_RC(wk_engine_add(e, (uint64_t)i, p[i], len[i], &gp, err, sizeof err), 0);
        run_all(e, alone);
    }
    wk_engine_free(e);
    /* together: all at once, a 64-token budget forces chunked prefill next to decodes */
    opts(&o, 64, 64);
    o.prefix_caching = 0;
    CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), 0);
    for (int i = 0; i < N; i++) {
        wk_params gp = params_of(i, sampled, GEN);
        CHECK_RC(wk_engine_add(e, (uint64_t)i, p[i], len[i], &gp, err, sizeof err), 0);
    }
    run_all(e, together);
    wk_engine_stats st;
    wk_engine_get_stats(e, &st);
    wk_engine_free(e);
    int same = 0;
    for (int i = 0; i < N; i++) {
        CHECK_INT(together[i].n[0], GEN);
        CHECK_INT(together[i].finish[0], WK_FINISH_LENGTH);
        int eq = alone[i].n[0] == together[i].n[0] &&
                 !memcmp(alone[i].tok[0], together[i].tok[0], sizeof(int32_t) * (size_t)GEN);
        if (!eq) fprintf(stderr, "  prompt %d (%d tokens): batched output differs from alone\n", i, len[i]);
        same += eq;
    }
    CHECK_INT(same, N);
    CHECK(st.steps > (uint64_t)(N * GEN) / 64); /* it really ran many requests per step */
    fprintf(stderr, "  batched == alone (%s): %d/%d prompts, %llu steps, draws over %d threads\n",
            sampled ? "seeded draws: temperature, top-p, top-k, min-p, penalties, logprobs" : "greedy", same, N,
            (unsigned long long)st.steps, kn_pool_size(model->pool));
}

/* Priorities: lower first, strictly while starve_ms is 0; a lower priority that has waited starve_ms goes
 * first (batch work passed by interactive work, never stopped by it). One seat, so the order of the requests'
 * ends is the order of their admissions. */
static int first_done(wk_engine *e) {
    for (int guard = 0; guard < 10000; guard++) {
        if (wk_engine_step(e) < 0) return -1;
        const wk_output *out;
        int n = wk_engine_outputs(e, &out);
        for (int i = 0; i < n; i++)
            if (out[i].last) return (int)out[i].id;
    }
    return -1;
}

static void test_starvation(void) {
    int32_t p[2][16];
    prompt(100, 16, p[0]);
    prompt(300, 16, p[1]);
    char err[256];
    for (int aged = 0; aged < 2; aged++) {
        wk_engine_opts o;
        wk_engine *e;
        opts(&o, 512, 1);
        o.starve_ms = aged ? 1 : 0;
        CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), 0);
        wk_params lo = greedy(3), hi = greedy(3);
        lo.priority = 1; /* a batch request, queued first */
        CHECK_RC(wk_engine_add(e, 7, p[0], 16, &lo, err, sizeof err), 0);
        usleep(5000);
        CHECK_RC(wk_engine_add(e, 8, p[1], 16, &hi, err, sizeof err), 0);
        CHECK_INT(first_done(e), aged ? 7 : 8);
        CHECK_INT(first_done(e), aged ? 8 : 7);
        wk_engine_stats st;
        wk_engine_get_stats(e, &st);
        CHECK_INT(st.starved, aged ? 1 : 0);
        wk_engine_free(e);
    }
}

static void test_prefix_cache(void) {
    enum { PRE = 1000, SUF = 24 };
    static int32_t a[PRE + SUF], b[PRE + SUF];
    prompt(0, PRE, a);
    memcpy(b, a, sizeof(int32_t) * PRE);
    prompt(5000, SUF, a + PRE);
    prompt(7000, SUF, b + PRE);
    static result res[2][3];
    uint64_t computed[2];
    char err[256];
    for (int caching = 0; caching < 2; caching++) {
        wk_engine_opts o;
        opts(&o, 512, 8);
        o.prefix_caching = caching;
        wk_engine *e;
        CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), 0);
        memset(res[caching], 0, sizeof res[caching]);
        wk_params gp = greedy(8);
        CHECK_RC(wk_engine_add(e, 0, a, PRE + SUF, &gp, err, sizeof err), 0);
        run_all(e, res[caching]);
        wk_engine_stats s0, s1;
        wk_engine_get_stats(e, &s0);
        CHECK_RC(wk_engine_add(e, 1, b, PRE + SUF, &gp, err, sizeof err), 0);
        run_all(e, res[caching]);
        wk_engine_get_stats(e, &s1);
        /* tokens computed for b: prefill + 7 decode steps (the last token is never fed back) */
        computed[caching] = s1.tokens_computed - s0.tokens_computed;
        if (caching) {
            CHECK_INT(res[1][1].cached, PRE / 16 * 16);
            CHECK_INT(s1.prefix_hits, PRE / 16 * 16);
            CHECK_INT(s1.prefix_queries, 2 * (PRE + SUF));
            wk_kv_event ev[4096];
            int ne = wk_engine_events(e, ev, 4096), stored = 0;
            for (int i = 0; i < ne; i++) stored += ev[i].type == WK_EV_STORED;
            CHECK(stored >= (PRE + SUF) / 16);
        } else {
            CHECK_INT(res[0][1].cached, 0);
        }
        wk_engine_free(e);
    }
    CHECK_INT(computed[0], PRE + SUF + 7);
    CHECK_INT(computed[1], PRE + SUF - PRE / 16 * 16 + 7);
    /* reusing cached K/V changes nothing in the output */
    CHECK(!memcmp(res[0][1].tok[0], res[1][1].tok[0], sizeof(int32_t) * 8));
    fprintf(stderr, "  prefix cache: second request computed %llu tokens with caching, %llu without\n",
            (unsigned long long)computed[1], (unsigned long long)computed[0]);
}

static void test_preemption(void) {
    enum { N = 8, GEN = 40 };
    static int32_t p[N][200];
    static result roomy[N], tight[N];
    memset(roomy, 0, sizeof roomy);
    memset(tight, 0, sizeof tight);
    char err[256];
    for (int pass = 0; pass < 2; pass++) {
        wk_engine_opts o;
        opts(&o, 256, 16);
        o.max_model_len = 256;
        o.prefix_caching = 0;
        if (pass) o.n_blocks = 24; /* 384 tokens for 8 sequences of up to 190 */
        wk_engine *e;
        CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), 0);
        for (int i = 0; i < N; i++) {
            prompt(i * 101, 100 + i * 6, p[i]);
            wk_params gp = greedy(GEN);
            CHECK_RC(wk_engine_add(e, (uint64_t)i, p[i], 100 + i * 6, &gp, err, sizeof err), 0);
        }
        run_all(e, pass ? tight : roomy);
        wk_engine_stats st;
        wk_engine_get_stats(e, &st);
        if (pass) {
            CHECK(st.preemptions > 0);
            fprintf(stderr, "  preemption: %llu preemptions, all %d requests finished\n",
                    (unsigned long long)st.preemptions, (int)st.requests_finished);
        }
        CHECK_INT(st.requests_finished, N);
        CHECK_INT(st.blocks_free, st.blocks_total);
        wk_engine_free(e);
    }
    for (int i = 0; i < N; i++) {
        CHECK_INT(tight[i].n[0], GEN);
        CHECK(!memcmp(roomy[i].tok[0], tight[i].tok[0], sizeof(int32_t) * GEN));
    }
}

static void test_sampling(void) {
    char err[256];
    wk_engine_opts o;
    opts(&o, 128, 16);
    wk_engine *e;
    CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), 0);
    static result r[MAXR];
    memset(r, 0, sizeof r);
    int32_t p[64];
    prompt(40, 20, p);

    /* 1: greedy reference text */
    wk_params gp = greedy(24);
    CHECK_RC(wk_engine_add(e, 1, p, 20, &gp, err, sizeof err), 0);
    run_all(e, r);
    CHECK(r[1].tlen[0] > 8);

    /* 2: a stop string that spans two tokens of that text: output is the text before it */
    size_t cut = 0, acc = 0;
    for (int t = 0; t + 1 < r[1].n[0]; t++) {
        const char *pc;
        size_t pl;
        cm_tok_piece(model->tok, r[1].tok[0][t], 0, &pc, &pl);
        acc += pl;
        if (acc >= 4 && pl >= 2) { cut = acc; break; } /* boundary after token t */
    }
    CHECK(cut >= 2 && cut + 2 <= r[1].tlen[0]);
    char stop[8];
    memcpy(stop, r[1].text[0] + cut - 2, 4); /* two bytes before the boundary, two after */
    stop[4] = 0;
    const char *first = strstr(r[1].text[0], stop);
    wk_params sp = greedy(24);
    sp.n_stop = 1;
    sp.stop[0] = stop;
    CHECK_RC(wk_engine_add(e, 2, p, 20, &sp, err, sizeof err), 0);
    run_all(e, r);
    CHECK_INT(r[2].finish[0], WK_FINISH_STOP);
    CHECK_INT(r[2].tlen[0], (size_t)(first - r[1].text[0]));
    CHECK(!memcmp(r[2].text[0], r[1].text[0], r[2].tlen[0]));

    /* 3..5: a seeded sample is the same alone and in two different mixes */
    wk_params tp;
    wk_params_default(&tp);
    tp.s.temperature = 0.9f;
    tp.max_tokens = 20;
    tp.has_seed = 1;
    tp.seed = 1234;
    tp.ignore_eos = 1;
    CHECK_RC(wk_engine_add(e, 3, p, 20, &tp, err, sizeof err), 0);
    run_all(e, r);
    int32_t q[300];
    prompt(900, 250, q);
    wk_params other = tp;
    other.seed = 99;
    CHECK_RC(wk_engine_add(e, 10, q, 250, &other, err, sizeof err), 0);
    CHECK_RC(wk_engine_add(e, 4, p, 20, &tp, err, sizeof err), 0);
    CHECK_RC(wk_engine_add(e, 11, q + 30, 60, &gp, err, sizeof err), 0);
    run_all(e, r);
    CHECK_RC(wk_engine_add(e, 12, q, 7, &gp, err, sizeof err), 0);
    wk_engine_step(e);
    CHECK_RC(wk_engine_add(e, 5, p, 20, &tp, err, sizeof err), 0);
    run_all(e, r);
    CHECK(!memcmp(r[3].tok[0], r[4].tok[0], sizeof(int32_t) * 20));
    CHECK(!memcmp(r[3].tok[0], r[5].tok[0], sizeof(int32_t) * 20));
    /* and a different seed gives a different sample */
    wk_params tp2 = tp;
    tp2.seed = 4321;
    CHECK_RC(wk_engine_add(e, 6, p, 20, &tp2, err, sizeof err), 0);
    run_all(e, r);
    CHECK(memcmp(r[3].tok[0], r[6].tok[0], sizeof(int32_t) * 20) != 0);

    /* 7: n = 3 greedy: three choices from one prefill, each equal to n = 1 */
    wk_params np = greedy(24);
    np.n = 3;
    CHECK_RC(wk_engine_add(e, 7, p, 20, &np, err, sizeof err), 0);
    run_all(e, r);
    for (int c = 0; c < 3; c++) {
        CHECK_INT(r[7].n[c], 24);
        CHECK(!memcmp(r[7].tok[c], r[1].tok[0], sizeof(int32_t) * 24));
    }
    /* 8: n = 3 sampled: choices differ, and the request reproduces */
    wk_params ns = tp;
    ns.n = 3;
    CHECK_RC(wk_engine_add(e, 8, p, 20, &ns, err, sizeof err), 0);
    CHECK_RC(wk_engine_add(e, 9, p, 20, &ns, err, sizeof err), 0);
    run_all(e, r);
    CHECK(memcmp(r[8].tok[0], r[8].tok[1], sizeof(int32_t) * 20) || memcmp(r[8].tok[1], r[8].tok[2], sizeof(int32_t) * 20));
    for (int c = 0; c < 3; c++) CHECK(!memcmp(r[8].tok[c], r[9].tok[c], sizeof(int32_t) * 20));

    /* 13: logprobs: top alternatives sorted, at most probability 1 in all, greedy picks the top one */
    wk_params lp = greedy(10);
    lp.logprobs = 5;
    CHECK_RC(wk_engine_add(e, 13, p, 20, &lp, err, sizeof err), 0);
    run_all(e, r);
    for (int t = 0; t < 10; t++) {
        const wk_token_lp *l = &r[13].lp[0][t];
        CHECK_INT(l->n_top, 5);
        CHECK_INT(l->token, r[13].tok[0][t]);
        CHECK_INT(l->top[0].id, l->token);
        CHECK_NEAR(l->top[0].logprob, l->logprob, 1e-6);
        double mass = 0;
        for (int k = 0; k < 5; k++) {
            CHECK(l->top[k].logprob <= 1e-6);
            if (k) CHECK(l->top[k].logprob <= l->top[k - 1].logprob);
            mass += exp(l->top[k].logprob);
        }
        CHECK(mass <= 1 + 1e-4 && mass > 0);
    }

    /* 14: logit_bias +100 on one token makes greedy emit only it */
    wk_bias bias = {1234, 100};
    wk_params bp = greedy(5);
    bp.s.n_bias = 1;
    bp.s.bias = &bias;
    CHECK_RC(wk_engine_add(e, 14, p, 20, &bp, err, sizeof err), 0);
    run_all(e, r);
    for (int t = 0; t < 5; t++) CHECK_INT(r[14].tok[0][t], 1234);

    /* 15, 16: stop_token_ids end at that token; min_tokens holds it off */
    wk_params st = greedy(10);
    int32_t stop_id = r[1].tok[0][2];
    st.n_stop_ids = 1;
    st.stop_ids = &stop_id;
    CHECK_RC(wk_engine_add(e, 15, p, 20, &st, err, sizeof err), 0);
    st.min_tokens = 6;
    CHECK_RC(wk_engine_add(e, 16, p, 20, &st, err, sizeof err), 0);
    run_all(e, r);
    CHECK_INT(r[15].finish[0], WK_FINISH_STOP);
    CHECK(r[15].n[0] <= 3 && r[15].tok[0][r[15].n[0] - 1] == stop_id);
    CHECK(r[16].n[0] >= 6);
    for (int t = 0; t < 5; t++) CHECK(r[16].tok[0][t] != stop_id);

    /* 17: a strong repetition / frequency penalty changes a repetitive greedy output */
    wk_params rp = greedy(24);
    rp.s.repetition_penalty = 1.8f;
    rp.s.frequency_penalty = 1.5f;
    CHECK_RC(wk_engine_add(e, 17, p, 20, &rp, err, sizeof err), 0);
    run_all(e, r);
    CHECK(memcmp(r[17].tok[0], r[1].tok[0], sizeof(int32_t) * 24) != 0);

    wk_engine_stats s;
    wk_engine_get_stats(e, &s);
    CHECK_INT(s.blocks_free, s.blocks_total);
    CHECK_INT(s.running + s.waiting, 0);
    wk_engine_free(e);
}

static void test_abort_and_errors(void) {
    char err[256];
    wk_engine_opts o;
    opts(&o, 64, 8);
    o.max_model_len = 512;
    wk_engine *e;
    CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), 0);
    static result r[MAXR];
    memset(r, 0, sizeof r);
    int32_t p[600];
    prompt(0, 600, p);
    wk_params gp = greedy(100);
    for (int i = 0; i < 6; i++) CHECK_RC(wk_engine_add(e, (uint64_t)i, p + i * 7, 150, &gp, err, sizeof err), 0);
    CHECK_RC(wk_engine_add(e, 3, p, 10, &gp, err, sizeof err), LLM_EAGAIN); /* duplicate id */
    for (int s = 0; s < 5; s++) CHECK(wk_engine_step(e) > 0);
    collect(e, r);
    wk_engine_stats st;
    wk_engine_get_stats(e, &st);
    CHECK(st.blocks_free < st.blocks_total);
    /* abort one mid-prefill or mid-decode, the rest, and one unknown */
    for (int i = 0; i < 6; i++) CHECK_RC(wk_engine_abort(e, (uint64_t)i), 0);
    CHECK_RC(wk_engine_abort(e, 77), LLM_ENOTFOUND);
    collect(e, r);
    for (int i = 0; i < 6; i++) CHECK_INT(r[i].finish[0], WK_FINISH_ABORT);
    wk_engine_get_stats(e, &st);
    CHECK_INT(st.blocks_free, st.blocks_total);
    CHECK_INT(st.running + st.waiting, 0);
    CHECK(!wk_engine_has_work(e));
    /* refusals */
    CHECK_RC(wk_engine_add(e, 20, p, 512, &gp, err, sizeof err), LLM_ERANGE);
    CHECK(strstr(err, "512") != NULL);
    wk_params big = greedy(400);
    CHECK_RC(wk_engine_add(e, 21, p, 200, &big, err, sizeof err), LLM_ERANGE);
    CHECK_RC(wk_engine_add(e, 22, p, 0, &gp, err, sizeof err), LLM_EINVAL);
    int32_t badtok[2] = {5, 1 << 20};
    CHECK_RC(wk_engine_add(e, 23, badtok, 2, &gp, err, sizeof err), LLM_EINVAL);
    wk_params bad = greedy(5);
    bad.s.top_p = 0;
    CHECK_RC(wk_engine_add(e, 24, p, 5, &bad, err, sizeof err), LLM_EINVAL);
    bad = greedy(5);
    bad.n = 99;
    CHECK_RC(wk_engine_add(e, 25, p, 5, &bad, err, sizeof err), LLM_EINVAL);
    bad = greedy(5);
    bad.s.temperature = NAN;
    CHECK_RC(wk_engine_add(e, 26, p, 5, &bad, err, sizeof err), LLM_EINVAL);
    /* the engine still serves after all that */
    CHECK_RC(wk_engine_add(e, 30, p, 5, &gp, err, sizeof err), 0);
    run_all(e, r);
    /* the request's last output says so once, whatever number of choices ever ran: three choices
       aborted before they forked (one ran), and two that ran to their ends */
    for (int i = 0; i < 6; i++) CHECK(r[i].last == 1 && r[i].after_last == 0);
    CHECK(r[30].last == 1 && r[30].after_last == 0);
    wk_params three = greedy(8);
    three.n = 3;
    three.s.temperature = 1;
    CHECK_RC(wk_engine_add(e, 31, p, 20, &three, err, sizeof err), 0);
    CHECK_RC(wk_engine_abort(e, 31), 0);
    collect(e, r);
    CHECK(r[31].finish[0] == WK_FINISH_ABORT && r[31].last == 1 && r[31].after_last == 0);
    wk_params two = greedy(6);
    two.n = 2;
    two.s.temperature = 1;
    CHECK_RC(wk_engine_add(e, 32, p, 20, &two, err, sizeof err), 0);
    run_all(e, r);
    CHECK(r[32].finish[0] && r[32].finish[1] && r[32].last == 1 && r[32].after_last == 0);
    CHECK_INT(r[30].n[0], 100);
    wk_engine_free(e);
    /* a pool smaller than one max-length sequence is refused at start */
    opts(&o, 64, 8);
    o.n_blocks = 4;
    CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), LLM_ERANGE);
}

/* A request moved from a lost worker resumes after the output it delivered:
 * the rest of a greedy run (penalties and the stop-string hold included) is
 * what the unbroken run produced, byte for byte, under a grammar too; an
 * output that had already ended ends at once; bad resumes are refused. */
static void test_resume(void) {
    enum { GEN = 40 };
    char err[256];
    wk_engine_opts o;
    opts(&o, 64, 8);
    wk_engine *e;
    CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), 0);
    static result r[MAXR];
    memset(r, 0, sizeof r);
    int32_t p[200 + GEN];
    prompt(5, 60, p);
    wk_params gp = greedy(GEN);
    gp.s.frequency_penalty = 0.7f; /* the resumed tokens must count as output */
    gp.n_stop = 1;
    gp.stop[0] = "@#@#@"; /* never met: the last 4 bytes are held back each step */
    /* the unbroken run, noting how much text had gone out with each token */
    size_t text_at[GEN + 1] = {0};
    CHECK_RC(wk_engine_add(e, 0, p, 60, &gp, err, sizeof err), 0);
    while (wk_engine_has_work(e)) {
        CHECK(wk_engine_step(e) >= 0);
        collect(e, r);
        if (r[0].n[0] <= GEN) text_at[r[0].n[0]] = r[0].tlen[0];
    }
    CHECK_INT(r[0].n[0], GEN);
    for (int k = 1; k <= GEN; k++)
        if (!text_at[k]) text_at[k] = text_at[k - 1];
    int ks[] = {1, 9, 27};
    for (int i = 0; i < 3; i++) {
        int k = ks[i], id = 1 + i;
        memcpy(p + 60, r[0].tok[0], sizeof(int32_t) * (size_t)k);
        wk_params rp = gp;
        rp.n_resume = k;
        rp.resume_text = text_at[k];
        CHECK_RC(wk_engine_add(e, (uint64_t)id, p, 60 + k, &rp, err, sizeof err), 0);
        run_all(e, r);
        CHECK_INT(r[id].n[0], GEN - k);
        CHECK(!memcmp(r[id].tok[0], r[0].tok[0] + k, sizeof(int32_t) * (size_t)(GEN - k)));
        CHECK_INT(r[id].tlen[0] + text_at[k], r[0].tlen[0]);
        CHECK(!memcmp(r[id].text[0], r[0].text[0] + text_at[k], r[id].tlen[0]));
        CHECK_INT(r[id].finish[0], WK_FINISH_LENGTH);
    }
    /* an output that had ended: at max_tokens, or on a stop id */
    memcpy(p + 60, r[0].tok[0], sizeof(int32_t) * GEN);
    wk_params rp = gp;
    rp.n_resume = GEN;
    rp.resume_text = text_at[GEN];
    CHECK_RC(wk_engine_add(e, 10, p, 60 + GEN, &rp, err, sizeof err), 0);
    CHECK(!wk_engine_has_work(e));
    collect(e, r);
    CHECK_INT(r[10].finish[0], WK_FINISH_LENGTH);
    CHECK_INT(r[10].n[0], 0);
    int32_t stop_id = r[0].tok[0][5];
    rp = gp;
    rp.n_stop_ids = 1;
    rp.stop_ids = &stop_id;
    rp.n_resume = 6;
    rp.resume_text = 0;
    CHECK_RC(wk_engine_add(e, 11, p, 66, &rp, err, sizeof err), 0);
    CHECK(!wk_engine_has_work(e));
    collect(e, r);
    CHECK_INT(r[11].finish[0], WK_FINISH_STOP);
    CHECK_INT(r[11].n[0], 0);
    /* refused: text past the output's, n > 1, no prompt before it */
    rp = gp;
    rp.n_resume = 3;
    rp.resume_text = 100000;
    CHECK_RC(wk_engine_add(e, 12, p, 63, &rp, err, sizeof err), LLM_EINVAL);
    CHECK(strstr(err, "resume_text_bytes") != NULL);
    rp.resume_text = 0;
    rp.n = 2;
    CHECK_RC(wk_engine_add(e, 13, p, 63, &rp, err, sizeof err), LLM_EINVAL);
    rp.n = 1;
    rp.n_resume = 63;
    CHECK_RC(wk_engine_add(e, 14, p, 63, &rp, err, sizeof err), LLM_EINVAL);
    CHECK(!wk_engine_has_work(e));
    /* under a grammar: the parse advances over the resumed tokens */
    static const char *gbnf = "root ::= \"Once upon a time, in a land far away, there lived a \" [a-z]+ \".\"";
    wk_params gg = greedy(60);
    gg.ignore_eos = 0;
    gg.grammar = gbnf;
    gg.grammar_len = strlen(gbnf);
    CHECK_RC(wk_engine_add(e, 20, p, 30, &gg, err, sizeof err), 0);
    run_all(e, r);
    CHECK_INT(r[20].finish[0], WK_FINISH_STOP);
    CHECK(r[20].n[0] > 6);
    CHECK(!strncmp(r[20].text[0], "Once upon a time, in a land", 27));
    int k = 4, n20 = r[20].n[0];
    memcpy(p + 30, r[20].tok[0], sizeof(int32_t) * (size_t)k);
    wk_params gr = gg;
    gr.n_resume = k;
    CHECK_RC(wk_engine_add(e, 21, p, 30 + k, &gr, err, sizeof err), 0);
    run_all(e, r);
    CHECK_INT(r[21].finish[0], WK_FINISH_STOP);
    CHECK_INT(r[21].n[0] + k, n20);
    CHECK(!memcmp(r[21].tok[0], r[20].tok[0] + k, sizeof(int32_t) * (size_t)(n20 - k)));
    CHECK_INT(r[21].tlen[0], r[20].tlen[0]); /* resume_text 0: the whole text comes again */
    int32_t *z;
    size_t nz;
    CHECK_RC(cm_tok_encode(model->tok, "zebra", 5, 0, 0, &z, &nz), 0);
    p[30] = z[0]; /* the grammar's output starts "Once" */
    free(z);
    gr.n_resume = 1;
    CHECK_RC(wk_engine_add(e, 22, p, 31, &gr, err, sizeof err), LLM_EINVAL);
    CHECK(strstr(err, "grammar") != NULL);
    CHECK(!wk_engine_has_work(e));
    /* a stop id whose text the grammar does not take ends a whole output (it once failed the step) */
    CHECK_RC(cm_tok_encode(model->tok, "}", 1, 0, 0, &z, &nz), 0);
    int32_t brace = z[0];
    free(z);
    static const char *yes = "root ::= \"yes\" \"!\"*"; /* whole after \"yes\", more allowed */
    wk_params gy = greedy(20);
    gy.ignore_eos = 0;
    gy.grammar = yes;
    gy.grammar_len = strlen(yes);
    gy.n_stop_ids = 1;
    gy.stop_ids = &brace;
    wk_bias force = {brace, 100};
    gy.s.n_bias = 1;
    gy.s.bias = &force;
    CHECK_RC(wk_engine_add(e, 23, p, 30, &gy, err, sizeof err), 0);
    run_all(e, r);
    CHECK_INT(r[23].finish[0], WK_FINISH_STOP);
    CHECK(r[23].tlen[0] == 3 && !memcmp(r[23].text[0], "yes", 3));
    CHECK_INT(r[23].tok[0][r[23].n[0] - 1], brace);
    wk_engine_free(e);
    fprintf(stderr, "  resume: after 1, 9, 27 of %d tokens the rest is the unbroken run's; ended outputs end at once\n", GEN);
}

static void *touch_from_another_thread(void *e) {
    wk_engine_abort(e, 1);
    return NULL;
}

/* The engine has one owner thread: a call from a second one stops the
 * process (in a child here) instead of corrupting it quietly. */
static void test_one_owner(void) {
#if defined(__SANITIZE_THREAD__)
    puts("one owner: skipped under ThreadSanitizer (it cannot start a thread in a forked child)");
    return;
#endif
    wk_engine_opts o;
    opts(&o, 64, 4);
    wk_engine *e;
    char err[256];
    CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), 0);
    wk_engine_abort(e, 1); /* an unknown id: this thread is now the owner */
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        pthread_t t;
        pthread_create(&t, NULL, touch_from_another_thread, e);
        pthread_join(t, NULL);
        _exit(0); /* not reached when the check works */
    }
    int st = 0;
    waitpid(p, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    wk_engine_free(e);
}

/* The step cost model on synthetic steps of a known cost: it learns the
 * three coefficients, and the chunk it sizes keeps the target. */
static void test_cost_model(void) {
    const double f = 6, a = 0.7, b = 1.6; /* ms; ms a token; ms per 1,000 attended positions */
    wk_cost c;
    wk_cost_init(&c);
    CHECK(!wk_cost_known(&c));
    CHECK_INT(wk_cost_max_chunk(&c, 100, 0, 0, 0, 16, 512), 512); /* unknown: the caller's cold cap applies */
    uint64_t r = 88172645463325252ull;
    for (int i = 0; i < 200; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        double tok = i % 3 ? 1 + (double)(r % 4) : 32 + (double)(r % 400), p = (double)((r >> 20) % 1500);
        double att = wk_cost_attended(p, tok), noise = 1 + ((double)(r % 1000) / 1000 - 0.5) * 0.1;
        wk_cost_observe(&c, tok, att, (f + a * tok + b * att * 1e-3) * noise);
    }
    CHECK(wk_cost_known(&c));
    double want = f + a * 200 + b * wk_cost_attended(1000, 200) * 1e-3;
    double got = wk_cost_predict(&c, 200, wk_cost_attended(1000, 200));
    printf("cost model: 200 tokens at 1000 predicted %.1f ms, true %.1f ms\n", got, want);
    CHECK(fabs(got - want) / want < 0.1);
    int n = wk_cost_max_chunk(&c, 150, 0, 0, 1000, 16, 512);
    double at = f + a * n + b * wk_cost_attended(1000, n) * 1e-3;
    printf("cost model: the chunk for 150 ms at position 1000 is %d tokens (true cost %.1f ms)\n", n, at);
    CHECK(n > 16 && n < 512 && at < 150 * 1.1 && at > 150 * 0.8);
    CHECK_INT(wk_cost_max_chunk(&c, 1, 0, 0, 0, 16, 512), 16); /* nothing fits: the least */
}

/* The cost model on the steps a busy worker sees (a warm-up, then mostly
 * decodes, a prompt now and then) with one step in ten preempted for up to
 * ten times its cost: what it predicts for a prompt far beyond those steps
 * stays near the truth. An unconstrained least-squares fit predicted 30 s
 * for a 241-token prompt here and refused it for its deadline (a CI run). */
static void test_cost_model_noisy(void) {
    const double f = 4, a = 0.6, b = 4;
    wk_cost c;
    wk_cost_init(&c);
    uint64_t r = 0x9e3779b97f4a7c15ull;
    const double want = f + a * 241 + b * wk_cost_attended(0, 241) * 1e-3;
    double worst = 0, least = 1e30;
    for (int i = 0; i < 3000; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        double tok, p;
        if (i == 0 || i == 5) tok = i ? 64 : 32, p = 0; /* the warm-up's two prompts */
        else if (i % 97 == 0) tok = 32 + (double)(r % 300), p = 0;
        else tok = 1 + (double)(r % 4), p = (double)(i % 700);
        double att = wk_cost_attended(p, tok), ms = f + a * tok + b * att * 1e-3;
        if (i > 1 && r % 10 == 0) ms *= 1 + (double)(r >> 40 & 1023) / 1024 * 9; /* preempted */
        wk_cost_observe(&c, tok, att, ms);
        if (!wk_cost_known(&c)) continue;
        double got = wk_cost_predict(&c, 241, wk_cost_attended(0, 241));
        if (got > worst) worst = got;
        if (i > 100 && got < least) least = got;
    }
    double got = wk_cost_predict(&c, 241, wk_cost_attended(0, 241));
    printf("cost model, noisy: 241 tokens predicted %.1f ms at the end, %.1f..%.1f after 100 steps, %.1f at worst, "
           "true %.1f ms\n", got, least, worst, worst, want);
    CHECK(worst < 3 * want);
    CHECK(least > want / 3);
    CHECK(got < 2 * want && got > want / 2);
}

/* With a time target the scheduler cuts a long prompt into chunks sized to
 * it, and a running stream still gets a token every step. */
static void test_step_budget(void) {
    wk_engine_opts o;
    opts(&o, 512, 8);
    o.max_step_ms = 20; /* far below what 512 prompt tokens cost on any CPU */
    wk_engine *e;
    char err[256];
    CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), 0);
    static result res[3];
    memset(res, 0, sizeof res);
    int32_t p1[16], p2[1500];
    prompt(0, 16, p1);
    prompt(100, 1500, p2);
    wk_params g = greedy(400);
    CHECK_RC(wk_engine_add(e, 1, p1, 16, &g, err, sizeof err), 0);
    while (res[1].n[0] < 2 && wk_engine_step(e) >= 0) collect(e, res);
    g = greedy(1);
    CHECK_RC(wk_engine_add(e, 2, p2, 1500, &g, err, sizeof err), 0);
    int steps = 0, advanced = 0, most = 0;
    while (!res[2].finish[0] && steps < 2000) {
        int before = res[1].n[0];
        int rc = wk_engine_step(e);
        CHECK(rc >= 0);
        if (rc < 0) break;
        collect(e, res);
        steps++;
        advanced += res[1].n[0] == before + 1;
        wk_engine_stats st;
        wk_engine_get_stats(e, &st);
        if (rc > most) most = rc;
    }
    printf("step budget: a 1500-token prompt took %d steps (largest %d tokens) at a 20 ms target; the stream "
           "advanced in %d of them\n", steps, most, advanced);
    CHECK(res[2].finish[0] == WK_FINISH_LENGTH);
    CHECK(steps > 1500 / 512 + 1); /* cut finer than the token budget alone would */
    CHECK_INT(advanced, steps);    /* every step, including those of the prompt */
    CHECK(wk_engine_prefill_estimate_ms(e, 1500) > 0);
    wk_engine_free(e);
}

/* Disaggregated prefill and decode, engine to engine: a prefill engine's blocks exported and adopted by a
 * decode engine's memory tier; the request resumed there after its first token finds the prompt cached and
 * goes on exactly as the unbroken run, greedy and seeded. A block whose key does not match its tokens is
 * refused; an engine without a memory tier adopts nothing. */
static void test_kv_transfer(void) {
    enum { N = 500, GEN = 24, NB = N / 16 };
    char err[256];
    static int32_t p[N + GEN];
    prompt(300, N, p);
    for (int seeded = 0; seeded < 2; seeded++) {
        wk_params gp = greedy(GEN);
        if (seeded) gp.s.temperature = 0.8f, gp.s.top_p = 0.95f, gp.seed = 11, gp.has_seed = 1;
        static result r[4];
        memset(r, 0, sizeof r);
        wk_engine_opts o;
        opts(&o, 256, 4);
        wk_engine *pre, *dec, *plain;
        CHECK_RC(wk_engine_create(model, &o, &plain, err, sizeof err), 0);
        CHECK_RC(wk_engine_create(model, &o, &pre, err, sizeof err), 0);
        o.kv_offload_bytes = (size_t)64 << 20;
        CHECK_RC(wk_engine_create(model, &o, &dec, err, sizeof err), 0);
        CHECK(wk_engine_kv_fingerprint(pre) == wk_engine_kv_fingerprint(dec));
        /* the unbroken run, and the prefill: its first token only */
        CHECK_RC(wk_engine_add(plain, 0, p, N, &gp, err, sizeof err), 0);
        run_all(plain, r);
        wk_params pp = gp;
        pp.max_tokens = 1;
        CHECK_RC(wk_engine_add(pre, 1, p, N, &pp, err, sizeof err), 0);
        run_all(pre, r);
        CHECK_INT(r[1].n[0], 1);
        CHECK_INT(r[1].tok[0][0], r[0].tok[0][0]);
        size_t bb = wk_engine_kv_block_bytes(pre);
        wk_kv_block *blk = calloc(NB + 1, sizeof *blk);
        char *pay = malloc(bb * (NB + 1));
        int got = wk_engine_kv_export(pre, 0, p, N, 0, NB + 1, blk, pay);
        CHECK_INT(got, NB);
        CHECK_INT(wk_engine_kv_export(pre, 0, p, N, 10, NB + 1, blk, pay), NB - 10); /* a later look: the rest */
        got = wk_engine_kv_export(pre, 0, p, N, 0, NB + 1, blk, pay);
        wk_kv_block bad = blk[3];
        bad.key ^= 1;
        CHECK_RC(wk_engine_kv_import(dec, &bad, 0, pay + 3 * bb), LLM_EINVAL);
        CHECK_RC(wk_engine_kv_import(dec, &blk[0], 7, pay), LLM_EINVAL); /* another salt: another key */
        CHECK_RC(wk_engine_kv_import(plain, &blk[0], 0, pay), LLM_EUNSUP);
        for (int i = 0; i < got; i++) CHECK_RC(wk_engine_kv_import(dec, &blk[i], 0, pay + (size_t)i * bb), 0);
        /* the decode side: the prompt and the first token, resumed */
        p[N] = r[1].tok[0][0];
        wk_params dp = gp;
        dp.n_resume = 1;
        dp.resume_text = r[1].tlen[0];
        CHECK_RC(wk_engine_add(dec, 2, p, N + 1, &dp, err, sizeof err), 0);
        run_all(dec, r);
        CHECK_INT(r[2].cached, NB * 16);
        CHECK_INT(r[2].n[0], GEN - 1);
        CHECK(!memcmp(r[2].tok[0], r[0].tok[0] + 1, sizeof(int32_t) * (GEN - 1)));
        wk_tier_stats ts;
        CHECK_RC(wk_engine_tier_stats(dec, &ts), 0);
        CHECK_INT(ts.ram_hits, NB);
        free(blk);
        free(pay);
        wk_engine_free(plain);
        wk_engine_free(pre);
        wk_engine_free(dec);
    }
    fprintf(stderr, "  kv transfer: %d blocks adopted; greedy and seeded runs continue as unbroken ones\n", NB);
}

int main(int argc, char **argv) {
    int rc = engine_tst_begin(argc, argv, "engine_test");
    if (rc) return rc;
    test_one_owner();
    test_cost_model();
    test_cost_model_noisy();
    test_step_budget();
    test_abort_and_errors();
    test_resume();
    test_kv_transfer();
    test_sampling();
    test_prefix_cache();
    test_starvation();
    if (!UNDER_TSAN) { /* under ThreadSanitizer, 20 times slower: the thread pool's races show in the tests above */
        test_preemption();
        test_batched_equals_alone(0);
        test_batched_equals_alone(1);
    }
    engine_tst_end();
    return tst_done("engine_test");
}
