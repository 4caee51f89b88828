#include "gw_score.h"
#include "cm_error.h"
#include "cm_oai_resp.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

typedef struct {
    int rerank;
    int n_pairs;
    int (*pair)[2];               /* the two texts' places in the embeddings input, per pair */
    json_t *docs;                 /* rerank: the documents (for return_documents), or NULL */
    int top_n;                    /* rerank: how many results (0: all) */
} score;

#define BAD(p, ...)                                                                                \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        *param = (p);                                                                              \
        goto fail;                                                                                 \
    } while (0)

/* A string, or a list of strings, appended to input; its count, or -1 when it is neither (or empty). */
static int texts(const json_t *v, json_t *input, int objects_ok) {
    if (json_is_string(v)) {
        json_array_append(input, (json_t *)v);
        return 1;
    }
    if (!json_is_array(v) || !json_array_size(v)) return -1;
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
        const json_t *t = objects_ok && json_is_object(x) ? json_object_get(x, "text") : x; /* Jina's {"text": ...} */
        if (!json_is_string(t)) return -1;
        json_array_append(input, (json_t *)t);
    }
    return (int)json_array_size(v);
}

static double cosine(const json_t *a, const json_t *b) {
    size_t n = json_array_size(a);
    if (n != json_array_size(b) || !n) return 0;
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        double x = json_number_value(json_array_get(a, i)), y = json_number_value(json_array_get(b, i));
        ab += x * y, aa += x * x, bb += y * y;
    }
    return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 0;
}

typedef struct {
    int index;
    double s;
} scored;

static int by_score(const void *a, const void *b) {
    const scored *x = a, *y = b;
    return x->s < y->s ? 1 : x->s > y->s ? -1 : x->index - y->index;
}

static json_t *on_reply(void *ctx, gw_conn *c, int status, const json_t *j) {
    score *s = ctx;
    (void)c;
    if (status != 200 || json_object_get(j, "error")) return NULL; /* OpenAI's error shape, as vLLM's are */
    const json_t *data = json_object_get(j, "data");
    scored *r = calloc((size_t)s->n_pairs, sizeof *r);
    if (!r) return cm_oai_error_json(500, "out of memory", NULL, "internal_error");
    for (int i = 0; i < s->n_pairs; i++) {
        r[i].index = i;
        r[i].s = cosine(json_object_get(json_array_get(data, (size_t)s->pair[i][0]), "embedding"),
                        json_object_get(json_array_get(data, (size_t)s->pair[i][1]), "embedding"));
    }
    unsigned char rb[8] = {0};
    char id[40];
    if (getrandom(rb, sizeof rb, 0) < 0) rb[0] = (unsigned char)time(NULL);
    snprintf(id, sizeof id, "%s-%02x%02x%02x%02x%02x%02x%02x%02x", s->rerank ? "rerank" : "score", rb[0], rb[1], rb[2],
             rb[3], rb[4], rb[5], rb[6], rb[7]);
    json_int_t tokens = json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    json_t *out = json_array(), *body;
    if (!s->rerank) {
        for (int i = 0; i < s->n_pairs; i++)
            json_array_append_new(out, json_pack("{s:i,s:s,s:f}", "index", i, "object", "score", "score", r[i].s));
        body = json_pack("{s:s,s:s,s:I,s:O,s:o,s:{s:I,s:I}}", "id", id, "object", "list", "created", (json_int_t)time(NULL),
                         "model", json_object_get(j, "model"), "data", out, "usage", "prompt_tokens", tokens,
                         "total_tokens", tokens);
    } else {
        qsort(r, (size_t)s->n_pairs, sizeof *r, by_score);
        int n = s->top_n && s->top_n < s->n_pairs ? s->top_n : s->n_pairs;
        for (int i = 0; i < n; i++) {
            json_t *res = json_pack("{s:i,s:f}", "index", r[i].index, "relevance_score", r[i].s);
            if (s->docs) json_object_set_new(res, "document", json_pack("{s:O}", "text", json_array_get(s->docs, (size_t)r[i].index)));
            json_array_append_new(out, res);
        }
        body = json_pack("{s:s,s:O,s:{s:I},s:o}", "id", id, "model", json_object_get(j, "model"), "usage", "total_tokens",
                         tokens, "results", out);
    }
    free(r);
    return body;
}

static void score_free(void *ctx) {
    score *s = ctx;
    free(s->pair);
    json_decref(s->docs);
    free(s);
}

int gw_score_request(gw_conn *c, const char *body, size_t len, int rerank, char **out, char *err, size_t errlen,
                     const char **param) {
    *out = NULL;
    *param = NULL;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL), *input = json_array(), *v;
    score *s = calloc(1, sizeof *s);
    const char *k;
    if (!s) {
        snprintf(err, errlen, "out of memory");
        json_decref(o);
        json_decref(input);
        return LLM_ENOMEM;
    }
    s->rerank = rerank;
    if (!json_is_object(o)) BAD(NULL, "the body is not a JSON object");
    static const char *const known_score[] = {"model", "text_1", "text_2", "user", NULL};
    static const char *const known_rerank[] = {"model", "query", "documents", "top_n", "return_documents", "user", NULL};
    json_object_foreach(o, k, v) {
        const char *const *p = rerank ? known_rerank : known_score;
        while (*p && strcmp(*p, k)) p++;
        if (!*p && !json_is_null(v)) BAD(NULL, "%.64s: this field is not supported on /v1/%s", k, rerank ? "rerank" : "score");
    }
    if ((v = json_object_get(o, "model")) && !json_is_null(v) && !json_is_string(v)) BAD("model", "model: a string");
    int n1, n2;
    if (!rerank) {
        if ((n1 = texts(json_object_get(o, "text_1"), input, 0)) < 0) BAD("text_1", "text_1: a string or a non-empty list of strings");
        if ((n2 = texts(json_object_get(o, "text_2"), input, 0)) < 0) BAD("text_2", "text_2: a string or a non-empty list of strings");
        if (n1 != 1 && n1 != n2)
            BAD("text_1", "text_1 and text_2: one text against one or a list, or two lists of the same length (%d and %d)",
                n1, n2);
        s->n_pairs = n2;
    } else {
        if (!json_is_string(json_object_get(o, "query"))) BAD("query", "query: a string");
        texts(json_object_get(o, "query"), input, 0);
        n1 = 1;
        if ((n2 = texts(json_object_get(o, "documents"), input, 1)) < 0)
            BAD("documents", "documents: a non-empty list of strings (or of {\"text\": ...})");
        s->n_pairs = n2;
        v = json_object_get(o, "top_n");
        if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) >= 1)) BAD("top_n", "top_n: an integer of at least 1");
        s->top_n = json_is_integer(v) ? (int)(json_integer_value(v) < 1 << 30 ? json_integer_value(v) : 1 << 30) : 0;
        v = json_object_get(o, "return_documents");
        if (v && !json_is_null(v) && !json_is_boolean(v)) BAD("return_documents", "return_documents: a boolean");
        if (!json_is_false(v)) {
            s->docs = json_array();
            for (int i = 0; i < n2; i++) json_array_append(s->docs, json_array_get(input, (size_t)i + 1));
        }
    }
    if (!(s->pair = malloc((size_t)s->n_pairs * sizeof *s->pair))) BAD(NULL, "out of memory");
    for (int i = 0; i < s->n_pairs; i++) {
        s->pair[i][0] = n1 == 1 ? 0 : i;
        s->pair[i][1] = n1 + i;
    }
    json_t *e = json_pack("{s:O,s:s}", "input", input, "encoding_format", "float");
    if ((v = json_object_get(o, "model")) && json_is_string(v)) json_object_set(e, "model", v);
    if ((v = json_object_get(o, "user")) && json_is_string(v)) json_object_set(e, "user", v);
    *out = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    json_decref(input);
    json_decref(o);
    if (!*out) {
        score_free(s);
        snprintf(err, errlen, "out of memory");
        return LLM_ENOMEM;
    }
    gw_http_filter f = {on_reply, NULL, NULL, score_free, s};
    if (c) gw_http_set_filter(c, &f);
    else score_free(s); /* (the fuzzer: the body alone) */
    return 0;
fail:
    score_free(s);
    json_decref(input);
    json_decref(o);
    return LLM_EINVAL;
}
