#include "gw_embed.h"
#include "cm_time.h"
#include "cm_error.h"
#include "cm_log.h"
#include "gw_metrics.h"
#include "gw_admit.h"
#include "gw_pool.h"
#include "gw_tokq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_INPUTS 2048

/* An embedding request's own state (q->x): its inputs' tokens and the vectors' encoding. */
typedef struct {
    int b64;                     /* base64 vectors */
    int n_inputs;
    int32_t **in_tok;            /* [n_inputs] */
    int *in_len;
} emb;

static emb *ex(const gw_req *q) { return q->x; }

static void emb_release(gw_req *q) {
    emb *x = q->x;
    if (!x) return;
    for (int i = 0; x->in_tok && i < x->n_inputs; i++) free(x->in_tok[i]);
    free(x->in_tok);
    free(x->in_len);
    free(x);
    q->x = NULL;
}

typedef struct {
    gw_prep b;
    int dim;
} eprep;

#define EFAIL(st, prm, cd, ...)                                                                    \
    do {                                                                                           \
        gw_prep_refuse(&p->b, st, prm, cd, __VA_ARGS__);                                           \
        goto done;                                                                                 \
    } while (0)

/* n: the input's length, or (at_least) where the tokenizer stopped counting. */
static void too_long(eprep *p, gw_req *q, int i, size_t n, int at_least) {
    gw_prep_refuse(&p->b, 400, "input", "context_length_exceeded",
             "This model's maximum context length is %d tokens, however you requested %s%zu tokens in input[%d]. "
             "Please reduce your input.", p->b.max_len, at_least ? "at least " : "", n, i);
}

/* One input of token ids: checked against the vocabulary and the length. */
static int ids_input(eprep *p, gw_req *q, int i, json_t *a) {
    size_t n = json_array_size(a);
    if (!n) {
        gw_prep_refuse(&p->b, 400, "input", "invalid_value", "input[%d] is an empty list of tokens", i);
        return -1;
    }
    if (n > (size_t)p->b.max_len) {
        too_long(p, q, i, n, 0);
        return -1;
    }
    if (!(ex(q)->in_tok[i] = malloc(sizeof(int32_t) * n))) return -1;
    for (size_t k = 0; k < n; k++) {
        json_t *v = json_array_get(a, k);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= p->b.vocab) {
            gw_prep_refuse(&p->b, 400, "input", "invalid_value", "input[%d][%zu] is not a token id of the model (0 to %d)", i, k, p->b.vocab - 1);
            return -1;
        }
        ex(q)->in_tok[i][k] = (int32_t)id;
    }
    ex(q)->in_len[i] = (int)n;
    return 0;
}

static int text_input(eprep *p, gw_req *q, int i, json_t *s) {
    size_t n = 0, len = json_string_length(s);
    if (!len) {
        gw_prep_refuse(&p->b, 400, "input", "invalid_value", "input[%d] is an empty string", i);
        return -1;
    }
    int rc = cm_tok_encode_limit(q->model->tok, json_string_value(s), len, 1, 1, (size_t)p->b.max_len, &ex(q)->in_tok[i], &n);
    if (rc == LLM_ERANGE) {
        too_long(p, q, i, n, 1);
        return -1;
    }
    if (rc) {
        gw_prep_refuse(&p->b, rc == LLM_ENOMEM ? 500 : 400, "input", "invalid_value", "input[%d] cannot be tokenized: %s", i, cm_strerror(rc));
        return -1;
    }
    ex(q)->in_len[i] = (int)n;
    return 0;
}

/* On a tokenizer thread: parse, check, tokenize. */
static void eprep_run(gw_job *j) {
    eprep *p = (eprep *)j;
    gw_req *q = p->b.q;
    json_error_t je;
    json_t *o = json_loadb(p->b.body, p->b.len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je), *v; /* texts may hold U+0000 */
    free(p->b.body);
    p->b.body = NULL;
    if (!json_is_object(o)) EFAIL(400, NULL, "invalid_value", "the body is not a JSON object%s%s", o ? "" : ": ", o ? "" : je.text);
    const char *k;
    json_object_foreach(o, k, v) {
        static const char *const known[] = {"input", "model", "encoding_format", "dimensions", "user", NULL};
        int ok = 0;
        for (const char *const *n = known; *n && !ok; n++) ok = !strcmp(k, *n);
        if (!ok) EFAIL(400, NULL, "invalid_value", "Unrecognized request argument supplied: %.64s", k); /* OpenAI's words */
    }
    if ((v = json_object_get(o, "model")) && !json_is_null(v)) {
        if (!json_is_string(v)) EFAIL(400, "model", "invalid_value", "'model' must be a string");
        const char *m = json_string_value(v);
        if (strcmp(m, p->b.eserved)) {
            if (p->b.served[0] && !strcmp(m, p->b.served))
                EFAIL(400, "model", "invalid_value", "The model `%.128s` does not support embeddings: it is a generative "
                      "model (the embedding model here is `%.128s`).", m, p->b.eserved);
            EFAIL(404, "model", "model_not_found", "The model `%.128s` does not exist.", m);
        }
    }
    if ((v = json_object_get(o, "encoding_format")) && !json_is_null(v)) {
        const char *f = json_string_value(v);
        if (!f || (strcmp(f, "float") && strcmp(f, "base64")))
            EFAIL(400, "encoding_format", "invalid_value", "'encoding_format' must be 'float' or 'base64'");
        ex(q)->b64 = !strcmp(f, "base64");
    }
    if ((v = json_object_get(o, "dimensions")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1)
            EFAIL(400, "dimensions", "invalid_value", "'dimensions' must be a positive integer");
        if (json_integer_value(v) != p->dim)
            EFAIL(400, "dimensions", "invalid_value", "The model `%.128s` does not support 'dimensions' other than its own %d "
                  "(it was not trained to shorten its vectors)", p->b.eserved, p->dim);
    }
    if ((v = json_object_get(o, "user")) && !json_is_null(v) && !json_is_string(v))
        EFAIL(400, "user", "invalid_value", "'user' must be a string");
    json_t *in = json_object_get(o, "input");
    if (!in || json_is_null(in)) EFAIL(400, "input", "invalid_value", "'input' is required");
    int n;
    int flat_ids = 0; /* a single list of token ids */
    if (json_is_string(in)) {
        n = 1;
    } else if (json_is_array(in)) {
        json_t *first = json_array_get(in, 0);
        n = (int)(json_array_size(in) > MAX_INPUTS + 1 ? MAX_INPUTS + 1 : json_array_size(in));
        if (!n) EFAIL(400, "input", "invalid_value", "'input' is an empty list");
        flat_ids = json_is_integer(first);
        if (flat_ids) n = 1;
        else if (n > MAX_INPUTS) EFAIL(400, "input", "invalid_value", "'input' holds more than %d items", MAX_INPUTS);
    } else {
        EFAIL(400, "input", "invalid_value", "'input' must be a string, a list of strings, a list of token ids or a "
              "list of such lists");
    }
    ex(q)->n_inputs = n;
    ex(q)->in_tok = calloc((size_t)n, sizeof *ex(q)->in_tok);
    ex(q)->in_len = calloc((size_t)n, sizeof *ex(q)->in_len);
    if (!ex(q)->in_tok || !ex(q)->in_len) EFAIL(500, NULL, "internal_error", "out of memory");
    for (int i = 0; i < n; i++) {
        json_t *it = json_is_string(in) ? in : flat_ids ? in : json_array_get(in, (size_t)i);
        int rc;
        if (json_is_string(it)) {
            rc = text_input(p, q, i, it);
        } else if (json_is_array(it)) {
            rc = ids_input(p, q, i, it);
        } else {
            EFAIL(400, "input", "invalid_value", "input[%d] must be a string or a list of token ids", i);
        }
        if (rc) {
            if (!p->b.status) EFAIL(500, NULL, "internal_error", "out of memory");
            goto done;
        }
        q->n_tok += ex(q)->in_len[i];
    }
done:
    json_decref(o);
}

/* Back on the loop. */
static void eprep_done(gw_job *j) {
    gw_req *q = gw_admit_prepared((gw_prep *)j);
    if (!q) return;
    gw *g = q->g;
    if (gw_admit_limits(g, q, (double)q->n_tok, "input", "its inputs")) return;
    gw_req_start(g, q);
}

static void eprep_gone(void *arg) {
    gw_req *q = arg;
    q->conn = NULL;
    q->g->m.cancelled++;
}

static int embed_pick(gw *g, gw_req *q, int exclude, int *hit) {
    (void)q;
    *hit = 0;
    return gw_embed_pick(g, exclude);
}

/* An embedding request: the least loaded embedding group, an Embed message, one answer. */
static const gw_req_ops embed_ops = {.pick = embed_pick,
                                     .send = gw_embed_send,
                                     .release = emb_release,
                                     .id_prefix = "embd",
                                     .none = "no embedding worker group is available"};

void gw_embed_handle(gw *g, gw_http_req *r, int key) {
    if (!gw_admit_open(g, r)) return;
    if (!g->emodel || !g->emax_len) {
        g->m.overloaded++;
        gw_http_error(r->conn, 503, g->emodel ? "no embedding worker group is available"
                                              : "no embedding model is served here (start one with --embedding-model)",
                      NULL, "no_workers");
        return;
    }
    eprep *p = calloc(1, sizeof *p);
    gw_req *q = gw_admit_new(g, r, key, g->emodel, &p->b);
    if (!q) return;
    q->ops = &embed_ops;
    if (!(q->x = calloc(1, sizeof(emb)))) {
        free(p->b.body);
        free(p);
        gw_req_finish(q, 500, "out of memory", "internal_error");
        return;
    }
    p->b.job.run = eprep_run;
    p->b.job.done = eprep_done;
    snprintf(p->b.eserved, sizeof p->b.eserved, "%s", g->eserved);
    snprintf(p->b.served, sizeof p->b.served, "%s", g->served);
    p->b.max_len = g->emax_len;
    p->b.vocab = cm_tok_vocab(g->emodel->tok);
    p->dim = g->edim;
    gw_admit_submit(g, &p->b, eprep_gone);
}

int gw_embed_pick(gw *g, int exclude) {
    int best = -1;
    for (int i = 0; i < g->n_workers; i++) {
        if (i == exclude || !gw_pool_routable_embed(g, i)) continue;
        if (best < 0 || g->w[i].inflight < g->w[best].inflight) best = i;
    }
    return best;
}

int gw_embed_send(gw *g, gw_req *q, int wi) {
    Llmserve__EmbedInput *in = calloc((size_t)ex(q)->n_inputs, sizeof *in);
    Llmserve__EmbedInput **inp = calloc((size_t)ex(q)->n_inputs, sizeof *inp);
    if (!in || !inp) {
        free(in);
        free(inp);
        return LLM_ENOMEM;
    }
    for (int i = 0; i < ex(q)->n_inputs; i++) {
        llmserve__embed_input__init(&in[i]);
        in[i].n_token_ids = (size_t)ex(q)->in_len[i];
        in[i].token_ids = ex(q)->in_tok[i];
        inp[i] = &in[i];
    }
    Llmserve__Embed m = LLMSERVE__EMBED__INIT;
    m.request_id = q->rid;
    m.gateway_id = g->id;
    m.reply_address = g->reply;
    m.n_inputs = (size_t)ex(q)->n_inputs;
    m.inputs = inp;
    m.has_deadline_ms = (m.deadline_ms = gw_req_deadline_ms(q, g->conf.request_timeout)) != 0;
    pr_env e;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_EMBED;
    e.embed = &m;
    int rc = gw_req_send_env(q, wi, &e);
    free(in);
    free(inp);
    return rc;
}

static const char b64c[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The vector's float32 bytes (little-endian, as this machine and the openai
 * client's numpy decoding have them), base64. */
static json_t *b64_vector(const float *v, int n) {
    const unsigned char *s = (const unsigned char *)v;
    size_t len = (size_t)n * 4, o = 0;
    char *out = malloc((len + 2) / 3 * 4 + 1);
    if (!out) return NULL;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t x = (uint32_t)s[i] << 16 | (i + 1 < len ? (uint32_t)s[i + 1] << 8 : 0) | (i + 2 < len ? s[i + 2] : 0);
        out[o++] = b64c[x >> 18 & 63];
        out[o++] = b64c[x >> 12 & 63];
        out[o++] = i + 1 < len ? b64c[x >> 6 & 63] : '=';
        out[o++] = i + 2 < len ? b64c[x & 63] : '=';
    }
    json_t *j = json_stringn(out, o);
    free(out);
    return j;
}

/* The cache's question went unanswered in time: a miss without a vector. */
static void probe_timeout(evutil_socket_t fd, short what, void *arg) {
    gw_req *q = arg;
    (void)fd;
    (void)what;
    gw *g = q->g;
    gw_req_leave(q, 1);
    q->worker = -1;
    gw_req_delist(g, q);
    gw_probe_fn done = q->probe_done;
    q->probe_done = NULL;
    done(g, q, NULL, 0);
}

int gw_embed_probe(gw *g, gw_req *q, const int32_t *tok, int n, gw_probe_fn done) {
    int wi = gw_embed_pick(g, -1);
    if (wi < 0) return LLM_EAGAIN;
    /* one second at most: a cache that makes requests wait for a busy embedding group is not worth it */
    if (gw_req_probe_enlist(g, q, probe_timeout, 1.0)) return LLM_ENOMEM;
    Llmserve__EmbedInput in = LLMSERVE__EMBED_INPUT__INIT, *inp = &in;
    in.n_token_ids = (size_t)n;
    in.token_ids = (int32_t *)tok;
    Llmserve__Embed m = LLMSERVE__EMBED__INIT;
    m.request_id = q->rid;
    m.gateway_id = g->id;
    m.reply_address = g->reply;
    m.n_inputs = 1;
    m.inputs = &inp;
    pr_env e;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_EMBED;
    e.embed = &m;
    if (gw_pool_send(g, wi, &e)) {
        gw_req_delist(g, q);
        return LLM_EAGAIN;
    }
    q->probe_done = done;
    gw_req_join(q, wi);
    return 0;
}

void gw_embed_on_result(gw *g, const Llmserve__EmbedResult *r) {
    gw_req *q = cm_idmap_get(&g->reqs, r->request_id);
    if (q && q->probe_done) { /* the cache's question */
        gw_req_leave(q, 0);
        q->worker = -1;
        gw_req_delist(g, q);
        gw_probe_fn done = q->probe_done;
        q->probe_done = NULL;
        int ok = !r->has_error_code && !r->error && r->dim > 0 && r->n_embedding == r->dim;
        done(g, q, ok ? r->embedding : NULL, ok ? (int)r->dim : 0);
        return;
    }
    if (!q || q->ops != &embed_ops) return; /* ended meanwhile, or a stale answer for an id moved on */
    q->on_worker = 0;
    if (r->has_error_code || r->error) {
        int c = r->has_error_code ? r->error_code : LLM_EIO;
        gw_req_worker_error(q, c, r->error ? r->error : cm_strerror(c));
        return;
    }
    int D = (int)r->dim;
    if (D < 1 || r->n_embedding != (size_t)ex(q)->n_inputs * (size_t)D) {
        gw_req_finish(q, 502, "the worker group's answer does not match the request", "bad_gateway");
        return;
    }
    json_t *data = json_array();
    for (int i = 0; data && i < ex(q)->n_inputs; i++) {
        const float *v = r->embedding + (size_t)i * D;
        json_t *vec;
        if (ex(q)->b64) {
            vec = b64_vector(v, D);
        } else {
            vec = json_array();
            for (int d = 0; vec && d < D; d++) json_array_append_new(vec, json_real(v[d]));
        }
        json_array_append_new(data, json_pack("{s:s,s:i,s:o*}", "object", "embedding", "index", i, "embedding", vec));
    }
    int pt = r->has_prompt_tokens ? r->prompt_tokens : q->n_tok;
    q->body = json_pack("{s:s,s:o*,s:s,s:{s:i,s:i}}", "object", "list", "data", data, "model", g->eserved, "usage",
                        "prompt_tokens", pt, "total_tokens", pt);
    if (!q->body) {
        gw_req_finish(q, 500, "out of memory", "internal_error");
        return;
    }
    gw_req_finish(q, 200, NULL, NULL);
}
