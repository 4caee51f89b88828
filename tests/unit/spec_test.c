/* spec_test: speculative decoding's proposer and configuration (wk_spec).
 * The engine's use of them (identical outputs with and without drafts) is
 * engine_test's test_speculative. */
#include "cm_error.h"
#include "tst.h"
#include "wk_cost.h"
#include "wk_spec.h"

#include <math.h>

#include <string.h>

static int ngram(const int32_t *tok, int n, int nmin, int nmax, int k, int32_t *out) {
    memset(out, 0xff, sizeof(int32_t) * WK_SPEC_MAX_K);
    return wk_spec_ngram(tok, n, nmin, nmax, k, out);
}

static void test_ngram(void) {
    int32_t out[WK_SPEC_MAX_K];
    /* the suffix "3 4" occurred at 2..3: propose what followed it */
    int32_t a[] = {1, 2, 3, 4, 5, 6, 7, 3, 4};
    CHECK_INT(ngram(a, 9, 1, 3, 3, out), 3);
    CHECK(out[0] == 5 && out[1] == 6 && out[2] == 7);
    CHECK_INT(out[3], -1); /* nothing written past k */
    /* k caps it; a draft never runs past the sequence's end */
    CHECK_INT(ngram(a, 9, 1, 3, 1, out), 1);
    CHECK_INT(out[0], 5);
    int32_t b[] = {9, 8, 7, 9, 8};
    CHECK_INT(ngram(b, 5, 1, 2, 8, out), 3); /* "9 8" at 0: 7 9 8 follow, then the end */
    CHECK(out[0] == 7 && out[1] == 9 && out[2] == 8);
    /* the longest suffix wins over a more recent shorter one: "1 2 3" at 0, "3" alone later */
    int32_t c[] = {1, 2, 3, 10, 11, 3, 20, 1, 2, 3};
    CHECK_INT(ngram(c, 10, 1, 3, 2, out), 2);
    CHECK(out[0] == 10 && out[1] == 11);
    /* with max 1 only the last token matches, at its latest earlier place (5) */
    CHECK_INT(ngram(c, 10, 1, 1, 2, out), 2);
    CHECK(out[0] == 20 && out[1] == 1);
    /* the latest of several occurrences */
    int32_t d[] = {5, 1, 5, 2, 5, 3, 5};
    CHECK_INT(ngram(d, 7, 1, 1, 1, out), 1);
    CHECK_INT(out[0], 3);
    /* min: a suffix shorter than min is not enough */
    CHECK_INT(ngram(a, 9, 3, 4, 3, out), 0);
    /* no earlier occurrence, too short, k 0 */
    int32_t e[] = {1, 2, 3, 4};
    CHECK_INT(ngram(e, 4, 1, 4, 4, out), 0);
    CHECK_INT(ngram(e, 1, 1, 4, 4, out), 0);
    CHECK_INT(ngram(a, 9, 1, 3, 0, out), 0);
    /* a run of one token predicts more of it (the match may overlap the suffix) */
    int32_t f[] = {4, 4, 4, 4};
    CHECK_INT(ngram(f, 4, 1, 2, 4, out), 2);
    CHECK(out[0] == 4 && out[1] == 4);
}

static void test_next_k(void) {
    CHECK_INT(wk_spec_next_k(4, 4, 8), 5); /* all taken: one more */
    CHECK_INT(wk_spec_next_k(8, 8, 8), 8); /* within the limit */
    CHECK_INT(wk_spec_next_k(4, 1, 8), 2); /* one past what was taken */
    CHECK_INT(wk_spec_next_k(4, 0, 8), 1); /* never below one */
}

/* The cost rule's floor from a fit of steps that cost exactly 4 ms + 3 ms a token (a small model on a
 * CPU: nearly compute-bound) and 20 ms + 0.05 ms a token (a GPU: bound by reading the weights). */
static void test_floor(void) {
    wk_cost c;
    wk_cost_init(&c);
    CHECK(wk_spec_floor(&c, 1, 0.f) >= 1.f); /* nothing measured: no draft may run on the rule */
    wk_cost_observe(&c, 1, 0, 7);
    wk_cost_observe(&c, 1, 0, 7);
    CHECK(wk_spec_floor(&c, 1, 0.f) >= 1.f); /* decodes alone do not tell a token's cost */
    for (int i = 0; i < 6; i++) {
        wk_cost_observe(&c, 64, 0, 4 + 3 * 64);
        wk_cost_observe(&c, 1, 0, 7);
    }
    CHECK(fabsf(wk_spec_floor(&c, 1, 0.f) - 3.f / 7.f) < 0.02f);    /* a*B / (F + a*B) */
    CHECK(fabsf(wk_spec_floor(&c, 8, 0.f) - 24.f / 28.f) < 0.02f);  /* more decodes: compute-bound */
    CHECK(fabsf(wk_spec_floor(&c, 1, 0.25f) - (3.f / 7.f + 0.25f)) < 0.02f); /* a draft model's own cost */
    wk_cost_init(&c);
    for (int i = 0; i < 6; i++) {
        wk_cost_observe(&c, 256, 0, 20 + 0.05 * 256);
        wk_cost_observe(&c, 1, 0, 20.05);
    }
    CHECK(wk_spec_floor(&c, 1, 0.f) < 0.01f);                   /* a drafted token is nearly free */
    CHECK(fabsf(wk_spec_floor(&c, 64, 0.f) - 3.2f / 23.2f) < 0.02f);
}

static void test_config(void) {
    char err[256];
    wk_spec_config c;
    wk_spec_config_default(&c);
    CHECK_INT(c.method, WK_SPEC_NONE);
    CHECK_RC(wk_spec_config_check(&c, err, sizeof err), 0);
    CHECK_RC(wk_spec_config_parse(&c, "{\"method\": \"ngram\", \"num_speculative_tokens\": 6, \"prompt_lookup_max\": 5, "
                                      "\"prompt_lookup_min\": 2, \"disable_by_batch_size\": 0}", err, sizeof err), 0);
    CHECK(c.method == WK_SPEC_NGRAM && c.k == 6 && c.ngram_max == 5 && c.ngram_min == 2 && c.max_batch == 0);
    CHECK_RC(wk_spec_config_parse(&c, "{\"method\": \"ngram\"}", err, sizeof err), 0);
    CHECK(c.k == 4 && c.ngram_min == 1 && c.ngram_max == 4 && c.max_batch == 0 && c.cost_rule == 1); /* the defaults */
    CHECK_RC(wk_spec_config_parse(&c, "{\"method\": \"draft_model\", \"model\": \"d.gguf\", \"num_speculative_tokens\": 3, "
                                      "\"cost_rule\": false}", err, sizeof err), 0);
    CHECK(c.method == WK_SPEC_DRAFT && c.k == 3 && !strcmp(c.model, "d.gguf") && c.cost_rule == 0);
    CHECK_RC(wk_spec_config_parse(&c, "{\"model\": \"e.gguf\"}", err, sizeof err), 0); /* vLLM's older form */
    CHECK(c.method == WK_SPEC_DRAFT && !strcmp(c.model, "e.gguf") && c.k == 4 && c.cost_rule == 1);
    static const struct { const char *json, *says; } bad[] = {
        {"{\"method\": \"eagle\", \"model\": \"x.gguf\"}", "not supported"},
        {"{\"method\": \"draft_model\"}", "needs \"model\""},
        {"{\"method\": \"ngram\", \"model\": \"x.gguf\"}", "goes with method draft_model"},
        {"{\"method\": \"draft_model\", \"model\": \"\"}", "file path"},
        {"{\"method\": \"draft_model\", \"model\": 7}", "file path"},
        {"{\"model\": \"x.gguf\", \"prompt_lookup_max\": 3}", "go with method ngram"},
        {"{\"method\": \"ngram\", \"cost_rule\": 0}", "true or false"},
        {"{\"method\": 3}", "not supported"},
        {"{\"num_speculative_tokens\": 4}", "required"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 0}", "num_speculative_tokens"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 99}", "num_speculative_tokens"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": \"4\"}", "integer"},
        {"{\"method\": \"ngram\", \"prompt_lookup_min\": 5, \"prompt_lookup_max\": 2}", "prompt_lookup"},
        {"{\"method\": \"ngram\", \"prompt_lookup_min\": 0}", "prompt_lookup"},
        {"{\"method\": \"ngram\", \"disable_by_batch_size\": -1}", "disable_by_batch_size"},
        {"{\"method\": \"ngram\", \"acceptance_method\": \"typical\"}", "unknown key"},
        {"{\"method\": \"ngram\", \"method\": \"ngram\"}", "not JSON"},
        {"[1, 2]", "JSON object"},
        {"{\"method\": ", "not JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        wk_spec_config keep = c;
        err[0] = 0;
        CHECK_RC(wk_spec_config_parse(&c, bad[i].json, err, sizeof err), LLM_EINVAL);
        if (!strstr(err, bad[i].says)) fprintf(stderr, "  %s: message '%s' lacks '%s'\n", bad[i].json, err, bad[i].says);
        CHECK(strstr(err, bad[i].says) != NULL);
        CHECK(!memcmp(&keep, &c, sizeof c)); /* a refused config changes nothing */
    }
}

int main(void) {
    test_ngram();
    test_next_k();
    test_floor();
    test_config();
    return tst_done("spec_test");
}
