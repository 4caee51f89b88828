/* engine_spec_test: speculative decoding in the engine (n-gram and draft
 * model), against the same engine without it: the same outputs under
 * greedy decoding and with sampling, the first token never drafted, and
 * the distribution of sampled tokens unchanged (a chi-squared test on tiny
 * generated models). argv[1]: the GGUF model (skips when absent). */
#include "engine_tst.h"

#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Speculative decoding (n-gram drafts) changes no token: greedy and seeded
 * sampling give the same output, text, logprobs and finish with and without
 * it, all at once or alone, through the batch-size switch (requests of
 * different lengths leave, so steps go from plain to speculating), and
 * starved of blocks (preemption) with prefix caching on. The corpus repeats
 * itself, so drafts are taken often: the test checks they were. */
enum { SPEC_N = 12 };
static void spec_run(int spec, int k, int max_batch, int alone, int n_blocks, int sample, result *res,
                     wk_engine_stats *st) {
    static int32_t p[SPEC_N][300];
    char err[256];
    wk_engine_opts o;
    opts(&o, 256, 32);
    o.max_model_len = 512;
    if (n_blocks) o.n_blocks = n_blocks;
    if (spec) {
        o.spec.method = spec;
        o.spec.k = k;
        o.spec.max_batch = max_batch;
    }
    if (spec == WK_SPEC_DRAFT) { /* the model drafting for itself: right, never faster, so the cost rule is off */
        snprintf(o.spec.model, sizeof o.spec.model, "%s", model->file->path);
        o.spec.cost_rule = 0;
        o.draft = model;
    }
    wk_engine *e;
    memset(res, 0, sizeof(result) * SPEC_N);
    memset(st, 0, sizeof *st);
    CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), 0);
    if (!e) return;
    for (int i = 0; i < SPEC_N; i++) {
        int len = 24 + (i * 53) % 220;
        prompt(i * 29, len, p[i]);
        wk_params gp = greedy(16 + (i * 7) % 48);
        if (sample) {
            gp.s.temperature = 0.8f;
            gp.s.top_p = 0.95f;
            gp.has_seed = 1;
            gp.seed = 1000 + (uint64_t)i;
            gp.s.frequency_penalty = i % 3 ? 0.f : 0.3f;
        }
        if (i % 4 == 1) gp.logprobs = 2;
        if (i % 6 == 3) gp.n = 2; /* two choices forked from one prefill, each speculating on its own */
        if (i % 6 == 5) {         /* structured output: drafts the grammar refuses are simply not drawn */
            static const char *gbnf = "root ::= [a-zA-Z ,.]+";
            gp.grammar = gbnf;
            gp.grammar_len = strlen(gbnf);
        }
        if (i % 5 == 2) { /* a stop string: the text of the prompt's own fourth and fifth tokens */
            static char stop[SPEC_N][64];
            const char *a, *b;
            size_t la, lb;
            cm_tok_piece(model->tok, p[i][3], 0, &a, &la);
            cm_tok_piece(model->tok, p[i][4], 0, &b, &lb);
            if (la + lb < sizeof stop[i] && la + lb > 2) {
                memcpy(stop[i], a, la);
                memcpy(stop[i] + la, b, lb);
                stop[i][la + lb] = 0;
                gp.stop[0] = stop[i];
                gp.n_stop = 1;
            }
        }
        CHECK_RC(wk_engine_add(e, (uint64_t)i, p[i], len, &gp, err, sizeof err), 0);
        if (alone) run_all(e, res);
    }
    run_all(e, res);
    wk_engine_get_stats(e, st);
    CHECK_INT(st->requests_finished, SPEC_N);
    CHECK_INT(st->blocks_free, st->blocks_total); /* rolled-back blocks all came back */
    wk_engine_free(e);
}

static int spec_same(const result *a, const result *b, const char *what) {
    int same = 0;
    for (int i = 0; i < SPEC_N; i++) {
        int eq = 1;
        for (int c = 0; c < (i % 6 == 3 ? 2 : 1); c++)
            eq = eq && a[i].n[c] > 0 && a[i].n[c] == b[i].n[c] &&
                 !memcmp(a[i].tok[c], b[i].tok[c], sizeof(int32_t) * (size_t)a[i].n[c]) &&
                 a[i].tlen[c] == b[i].tlen[c] && !memcmp(a[i].text[c], b[i].text[c], a[i].tlen[c]) &&
                 a[i].finish[c] == b[i].finish[c];
        int nl = a[i].n[0] < 64 ? a[i].n[0] : 64;
        for (int t = 0; eq && t < nl && i % 4 == 1; t++)
            eq = a[i].lp[0][t].token == b[i].lp[0][t].token && a[i].lp[0][t].logprob == b[i].lp[0][t].logprob &&
                 a[i].lp[0][t].n_top == b[i].lp[0][t].n_top;
        if (!eq) {
            fprintf(stderr, "  %s: request %d differs (%d vs %d tokens)\n", what, i, a[i].n[0], b[i].n[0]);
            for (int c = 0; c < (i % 6 == 3 ? 2 : 1); c++) {
                int t = 0;
                while (t < a[i].n[c] && t < b[i].n[c] && a[i].tok[c][t] == b[i].tok[c][t]) t++;
                fprintf(stderr, "    choice %d: first difference at token %d of %d/%d (%d vs %d), finish %d/%d, text %zu/%zu bytes\n",
                        c, t, a[i].n[c], b[i].n[c], t < a[i].n[c] ? a[i].tok[c][t] : -1, t < b[i].n[c] ? b[i].tok[c][t] : -1,
                        a[i].finish[c], b[i].finish[c], a[i].tlen[c], b[i].tlen[c]);
            }
        }
        same += eq;
    }
    return same;
}

static void test_speculative(void) {
    static result ref[SPEC_N], got[SPEC_N];
    wk_engine_stats st;
    for (int sample = 0; sample < 2; sample++) {
        spec_run(0, 0, 0, 0, 0, sample, ref, &st);
        CHECK(st.spec_drafts == 0);
        /* prompt lookup; then a draft model: the default model drafting for itself, with its own cache
           (its greedy drafts are the target's own choices but where a grammar, a penalty or sampling
           decides otherwise) */
        static const struct { int method, k, max_batch, alone, n_blocks; const char *what; } cases[] = {
            {WK_SPEC_NGRAM, 4, 0, 0, 0, "all at once, k=4"},
            {WK_SPEC_NGRAM, 3, 0, 1, 0, "one at a time, k=3"},
            {WK_SPEC_NGRAM, 4, 3, 0, 0, "at most 3 decoding"},
            {WK_SPEC_NGRAM, 5, 0, 0, 34, "starved of blocks, k=5"},
            {WK_SPEC_DRAFT, 4, 0, 0, 0, "draft model, all at once, k=4"},
            {WK_SPEC_DRAFT, 2, 0, 1, 0, "draft model, one at a time, k=2"},
            {WK_SPEC_DRAFT, 3, 3, 0, 0, "draft model, at most 3 decoding (plain steps between)"},
            {WK_SPEC_DRAFT, 5, 0, 0, 34, "draft model, starved of blocks, k=5"},
        };
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            /* under AddressSanitizer (5x slower) the sampled pass runs two cases, one of each method: the
               sampler's paths under speculation are the same in all, the engine's all ran greedy */
            if (UNDER_ASAN && sample && c != 0 && c != 7) continue;
            spec_run(cases[c].method, cases[c].k, cases[c].max_batch, cases[c].alone, cases[c].n_blocks, sample, got,
                     &st);
            CHECK_INT(spec_same(ref, got, cases[c].what), SPEC_N);
            CHECK(st.spec_drafts > 0);
            CHECK(st.spec_accepted_tokens > 0);
            CHECK(st.spec_accepted_tokens <= st.spec_draft_tokens);
            if (cases[c].method == WK_SPEC_NGRAM) CHECK(st.spec_accepted_pos[0] >= st.spec_accepted_pos[1]);
            if (cases[c].method == WK_SPEC_DRAFT && !sample) CHECK(st.spec_accepted_tokens * 10 >= st.spec_draft_tokens * 8);
            if (cases[c].n_blocks) CHECK(st.preemptions > 0);
            fprintf(stderr, "  speculative %s, %s: %llu proposals, %llu of %llu drafts taken, %llu steps\n",
                    sample ? "sampled" : "greedy", cases[c].what, (unsigned long long)st.spec_drafts,
                    (unsigned long long)st.spec_accepted_tokens, (unsigned long long)st.spec_draft_tokens,
                    (unsigned long long)st.steps);
        }
    }
}

/* A prompt whose last token is left alone for a step (the chunk before took the budget) looks like a
   decode: it must not draft, since the plain path samples the first token and forks the n > 1 choices
   (found as a rare loss of choice 1 under preemption; deterministic here). */
static void test_spec_first_token(void) {
    static result plain[1], spec[1];
    static int32_t p[49];
    prompt(0, 49, p);
    for (int method = 0; method <= WK_SPEC_DRAFT; method += WK_SPEC_DRAFT) {
        char err[256];
        wk_engine_opts o;
        opts(&o, 48, 8);
        o.max_step_ms = 0; /* chunks by tokens only: 48, then the last one */
        if (method) {
            o.spec.method = WK_SPEC_DRAFT;
            o.spec.k = 3;
            o.spec.cost_rule = 0;
            snprintf(o.spec.model, sizeof o.spec.model, "%s", model->file->path);
            o.draft = model;
        }
        wk_engine *e;
        result *res = method ? spec : plain;
        memset(res, 0, sizeof(result));
        CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), 0);
        if (!e) return;
        wk_params gp = greedy(8);
        gp.n = 2;
        CHECK_RC(wk_engine_add(e, 0, p, 49, &gp, err, sizeof err), 0);
        run_all(e, res);
        wk_engine_stats st;
        wk_engine_get_stats(e, &st);
        if (method) CHECK(st.spec_drafts > 0);
        wk_engine_free(e);
    }
    for (int c = 0; c < 2; c++) {
        CHECK_INT(spec[0].n[c], 8);
        CHECK(!memcmp(spec[0].tok[c], plain[0].tok[c], sizeof(int32_t) * 8));
        CHECK_INT(spec[0].finish[c], WK_FINISH_LENGTH);
    }
}

/* ---- speculative sampling keeps the target's distribution ----------------- */

/* draws per run: fewer under ThreadSanitizer (there for the draft's races; the test keeps its meaning, with
   less power) */
#define DIST_R (UNDER_TSAN ? 800 : 4000)
enum { DIST_V = 288, DIST_AT = 3 };

/* DIST_R seeded requests of one fixed prompt on target (drafted by draft, or plain): the histogram of
   the DIST_AT-th generated token. */
static void dist_run(wk_model *target, wk_model *draft, uint64_t seed0, int *hist, wk_engine_stats *st) {
    static int n_got[4000];
    char err[256];
    wk_engine_opts o;
    opts(&o, 256, 256);
    o.max_model_len = 64;
    o.kv_cache_bytes = (size_t)64 << 20;
    if (draft) {
        o.spec.method = WK_SPEC_DRAFT;
        o.spec.k = 3;
        o.spec.cost_rule = 0;
        snprintf(o.spec.model, sizeof o.spec.model, "%s", draft->file->path);
        o.draft = draft;
    }
    wk_engine *e;
    memset(n_got, 0, sizeof n_got);
    memset(hist, 0, sizeof(int) * DIST_V);
    CHECK_RC(wk_engine_create(target, &o, &e, err, sizeof err), 0);
    if (!e) return;
    static const int32_t pr[6] = {1, 270, 281, 263, 275, 266};
    for (int i = 0; i < DIST_R; i++) {
        wk_params gp = greedy(DIST_AT + 1);
        gp.s.temperature = 0.3f;
        gp.has_seed = 1;
        gp.seed = seed0 + (uint64_t)i;
        CHECK_RC(wk_engine_add(e, (uint64_t)i, pr, 6, &gp, err, sizeof err), 0);
    }
    while (wk_engine_has_work(e)) {
        int rc = wk_engine_step(e);
        CHECK(rc >= 0);
        if (rc < 0) break;
        const wk_output *out;
        int n = wk_engine_outputs(e, &out);
        for (int i = 0; i < n; i++)
            for (int k = 0; k < out[i].n_tokens; k++)
                if (++n_got[out[i].id] == DIST_AT && out[i].tokens[k] >= 0 && out[i].tokens[k] < DIST_V)
                    hist[out[i].tokens[k]]++;
    }
    wk_engine_get_stats(e, st);
    CHECK_INT(st->requests_finished, DIST_R);
    wk_engine_free(e);
}

/* Pearson's chi-square of homogeneity of two histograms of equal totals (bins with fewer than 10 draws
   in both together pooled); *df its degrees of freedom. */
static double chi2(const int *a, const int *b, int *df) {
    double x = 0;
    int bins = 0, pa = 0, pb = 0;
    for (int i = 0; i <= DIST_V; i++) {
        int u = i < DIST_V ? a[i] : pa, v = i < DIST_V ? b[i] : pb;
        if (i < DIST_V && u + v < 10) {
            pa += u, pb += v;
            continue;
        }
        if (u + v == 0) continue;
        x += (double)(u - v) * (u - v) / (u + v); /* equal totals: sum (u - e)^2/e + (v - e)^2/e, e = (u + v)/2 */
        bins++;
    }
    *df = bins - 1;
    return x;
}

/* The 0.1% point of chi-square with df degrees (Wilson-Hilferty). */
static double chi2_crit(int df) {
    double h = 2.0 / (9.0 * df), c = 1 - h + 3.090 * sqrt(h);
    return df * c * c * c;
}

static void test_spec_distribution(void) {
    /* a generated target and a generated draft of other weights: most drafts are rejected, so the residual
       draws after a rejection decide the output */
    char dir[] = "/tmp/llmserve-specdist-XXXXXX", cfg[64];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    FILE *f = fopen(cfg, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(f, "{\"num_hidden_layers\": 2, \"hidden_size\": 64, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
               "\"intermediate_size\": 128, \"vocab_size\": %d, \"max_position_embeddings\": 128}", DIST_V);
    fclose(f);
    wk_model *t = NULL, *d = NULL;
    char err[256];
    wk_model_opts to = {.threads = 2, .max_batch = 256, .model_config = cfg, .dummy_type = CM_F32, .seed = 11};
    wk_model_opts dop = to;
    dop.seed = 12;
    CHECK_RC(wk_model_load(&to, &t, err, sizeof err), 0);
    CHECK_RC(wk_model_load(&dop, &d, err, sizeof err), 0);
    unlink(cfg);
    rmdir(dir);
    if (!t || !d) {
        wk_model_free(t);
        wk_model_free(d);
        return;
    }
    { /* a draft must speak the target's tokens */
        wk_engine_opts o;
        opts(&o, 256, 8);
        o.spec.method = WK_SPEC_DRAFT;
        snprintf(o.spec.model, sizeof o.spec.model, "%s", t->file->path);
        o.draft = t;
        wk_engine *e = NULL;
        err[0] = 0;
        CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), LLM_EINVAL);
        CHECK(e == NULL && strstr(err, "does not share the target's tokenizer") && strstr(err, "vocabulary 288"));
        o.draft = NULL;
        CHECK_RC(wk_engine_create(model, &o, &e, err, sizeof err), LLM_EINVAL);
        CHECK(e == NULL && strstr(err, "needs the draft model"));
    }
    static int plain[DIST_V], spec[DIST_V], self[DIST_V], other[DIST_V];
    wk_engine_stats st, sd, ss;
    dist_run(t, NULL, 1, plain, &st);
    dist_run(t, d, 1000000, spec, &sd);   /* other seeds: independent draws */
    dist_run(t, t, 2000000, self, &ss);   /* drafting for itself */
    dist_run(d, NULL, 3000000, other, &st); /* the draft's own distribution: what a lossy scheme would drift to */
    int df1, df2, df3;
    double x1 = chi2(plain, spec, &df1), x2 = chi2(plain, self, &df2), x3 = chi2(plain, other, &df3);
    fprintf(stderr,
            "  speculative sampling, %d draws of token %d: chi-square plain vs other draft %.1f (df %d, 0.1%% point %.1f; "
            "%llu of %llu drafts taken), vs itself %.1f (df %d, %.1f; %llu of %llu), plain vs the draft model plain "
            "%.1f (df %d)\n",
            DIST_R, DIST_AT, x1, df1, chi2_crit(df1), (unsigned long long)sd.spec_accepted_tokens,
            (unsigned long long)sd.spec_draft_tokens, x2, df2, chi2_crit(df2), (unsigned long long)ss.spec_accepted_tokens,
            (unsigned long long)ss.spec_draft_tokens, x3, df3);
    CHECK(sd.spec_drafts > 0 && ss.spec_drafts > 0);
    CHECK(sd.spec_accepted_tokens * 2 < sd.spec_draft_tokens); /* the other draft is mostly wrong */
    /* itself: its greedy draft is taken when the target's draw at temperature 0.3 is its argmax */
    CHECK(ss.spec_accepted_tokens > 5 * sd.spec_accepted_tokens);
    CHECK(df1 > 5 && x1 < chi2_crit(df1));
    CHECK(df2 > 5 && x2 < chi2_crit(df2));
    CHECK(x3 > chi2_crit(df3)); /* the test can tell two distributions apart */
    wk_model_free(d);
    wk_model_free(t);
}

int main(int argc, char **argv) {
    int rc = engine_tst_begin(argc, argv, "engine_spec_test");
    if (rc) return rc;
    if (argc > 2 && !strcmp(argv[2], "distribution")) { /* one test alone, while working on it */
        test_spec_distribution();
    } else {
        test_spec_distribution(); /* tiny generated models: quick under TSan too, where the draft's pool runs */
        test_spec_first_token();
        if (!UNDER_TSAN) test_speculative();
    }
    engine_tst_end();
    return tst_done("engine_spec_test");
}
