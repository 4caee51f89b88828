#include "wk_spec.h"
#include "cm_error.h"
#include "wk_cost.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

void wk_spec_config_default(wk_spec_config *c) {
    *c = (wk_spec_config){.method = WK_SPEC_NONE, .k = 4, .ngram_min = 1, .ngram_max = 4, .max_batch = 0, .cost_rule = 1};
}

int wk_spec_config_check(const wk_spec_config *c, char *err, size_t errlen) {
    if (c->method == WK_SPEC_NONE) return 0;
    if (c->k < 1 || c->k > WK_SPEC_MAX_K) {
        snprintf(err, errlen, "num_speculative_tokens must be 1..%d, not %d", WK_SPEC_MAX_K, c->k);
        return LLM_EINVAL;
    }
    if (c->ngram_min < 1 || c->ngram_max < c->ngram_min || c->ngram_max > 64) {
        snprintf(err, errlen, "prompt_lookup_min (%d) and prompt_lookup_max (%d) must satisfy 1 <= min <= max <= 64",
                 c->ngram_min, c->ngram_max);
        return LLM_EINVAL;
    }
    if (c->method == WK_SPEC_DRAFT && !c->model[0]) {
        snprintf(err, errlen, "speculative-config: method draft_model needs \"model\", the draft's model file");
        return LLM_EINVAL;
    }
    if (c->method != WK_SPEC_DRAFT && c->model[0]) {
        snprintf(err, errlen, "speculative-config: \"model\" goes with method draft_model, not ngram");
        return LLM_EINVAL;
    }
    if (c->max_batch < 0) {
        snprintf(err, errlen, "disable_by_batch_size must be >= 0 (0: never), not %d", c->max_batch);
        return LLM_EINVAL;
    }
    return 0;
}

static int get_int(json_t *v, const char *key, int *out, char *err, size_t errlen) {
    if (!json_is_integer(v) || json_integer_value(v) < -1000000 || json_integer_value(v) > 1000000) {
        snprintf(err, errlen, "speculative-config: \"%s\" must be an integer", key);
        return LLM_EINVAL;
    }
    *out = (int)json_integer_value(v);
    return 0;
}

int wk_spec_config_parse(wk_spec_config *c, const char *text, char *err, size_t errlen) {
    json_error_t je;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        if (o) snprintf(err, errlen, "speculative-config must be a JSON object");
        else snprintf(err, errlen, "speculative-config is not JSON: %s (at %d)", je.text, je.position);
        json_decref(o);
        return LLM_EINVAL;
    }
    wk_spec_config n;
    wk_spec_config_default(&n);
    int rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        if (!strcmp(key, "method")) {
            const char *m = json_string_value(v);
            if (m && !strcmp(m, "ngram")) n.method = WK_SPEC_NGRAM;
            else if (m && !strcmp(m, "draft_model")) n.method = WK_SPEC_DRAFT;
            else {
                snprintf(err, errlen, "speculative-config: method %s%s%s is not supported (ngram and draft_model are)",
                         m ? "'" : "", m ? m : "(not a string)", m ? "'" : "");
                rc = LLM_EINVAL;
            }
        } else if (!strcmp(key, "model")) {
            const char *m = json_string_value(v);
            if (!m || !m[0] || strlen(m) >= sizeof n.model) {
                snprintf(err, errlen, "speculative-config: \"model\" must be a file path (1 to %d bytes)",
                         (int)sizeof n.model - 1);
                rc = LLM_EINVAL;
            } else snprintf(n.model, sizeof n.model, "%s", m);
        } else if (!strcmp(key, "cost_rule")) {
            if (!json_is_boolean(v)) {
                snprintf(err, errlen, "speculative-config: \"cost_rule\" must be true or false");
                rc = LLM_EINVAL;
            } else n.cost_rule = json_is_true(v);
        } else if (!strcmp(key, "num_speculative_tokens")) rc = get_int(v, key, &n.k, err, errlen);
        else if (!strcmp(key, "prompt_lookup_max")) rc = get_int(v, key, &n.ngram_max, err, errlen);
        else if (!strcmp(key, "prompt_lookup_min")) rc = get_int(v, key, &n.ngram_min, err, errlen);
        else if (!strcmp(key, "disable_by_batch_size")) rc = get_int(v, key, &n.max_batch, err, errlen);
        else {
            snprintf(err, errlen, "speculative-config: unknown key \"%s\"", key);
            rc = LLM_EINVAL;
        }
        if (rc) break;
    }
    if (!rc && !json_object_get(o, "method")) {
        if (n.model[0]) n.method = WK_SPEC_DRAFT; /* vLLM's older spelling: a draft model alone */
        else {
            snprintf(err, errlen, "speculative-config: \"method\" is required (\"ngram\" or \"draft_model\")");
            rc = LLM_EINVAL;
        }
    }
    if (!rc && n.method == WK_SPEC_DRAFT &&
        (json_object_get(o, "prompt_lookup_max") || json_object_get(o, "prompt_lookup_min"))) {
        snprintf(err, errlen, "speculative-config: prompt_lookup_max/min go with method ngram, not draft_model");
        rc = LLM_EINVAL;
    }
    json_decref(o);
    if (!rc) rc = wk_spec_config_check(&n, err, errlen);
    if (!rc) *c = n;
    return rc;
}

int wk_spec_ngram(const int32_t *tok, int n, int nmin, int nmax, int k, int32_t *out) {
    if (k <= 0 || n < 2) return 0;
    for (int g = nmax < n - 1 ? nmax : n - 1; g >= nmin; g--) {
        const int32_t *suf = tok + n - g;
        /* earlier occurrences (start i < n - g), latest first; the first with k tokens after it, else the one
           with the most (an occurrence near the end, as in a run of one token, leaves few) */
        int best = -1, bm = 0;
        for (int i = n - g - 1; i >= 0 && bm < k; i--) {
            if (tok[i] != suf[0] || memcmp(tok + i, suf, sizeof(int32_t) * (size_t)g)) continue;
            int m = n - (i + g) < k ? n - (i + g) : k;
            if (m > bm) best = i + g, bm = m;
        }
        if (best >= 0) {
            memcpy(out, tok + best, sizeof(int32_t) * (size_t)bm);
            return bm;
        }
    }
    return 0;
}

int wk_spec_next_k(int k, int accepted, int kmax) {
    int nk = accepted >= k ? k + 1 : accepted + 1;
    return nk < 1 ? 1 : nk > kmax ? kmax : nk;
}

float wk_spec_floor(const wk_cost *c, int decodes, float draft_cost) {
    if (!wk_cost_known(c)) return 1.f;
    double f = wk_cost_predict(c, 0, 0), a = wk_cost_predict(c, 1, 0) - f, b = decodes;
    return (a > 0 && f + a * b > 0 ? (float)(a * b / (f + a * b)) : 0.f) + draft_cost;
}
