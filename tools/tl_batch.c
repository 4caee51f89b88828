/* llmserve generate --batch FILE.jsonl: every line an OpenAI completions
 * request body, all of them run through the engine at once (continuous
 * batching); every output line the OpenAI completion response (or error)
 * for its input line, in input order, written as soon as it and all lines
 * before it are done. */
#include "cm_error.h"
#include "cm_log.h"
#include "cm_oai.h"
#include "cm_hash.h"
#include "cm_unicode.h"
#include "tl_common.h"
#include "wk_engine.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    char *text;
    size_t len, cap;
    int finish, completion_tokens;
    size_t tok_offset;        /* where the next token's text starts (logprobs text_offset) */
    json_t *lp_tokens, *lp_values, *lp_top, *lp_offsets; /* NULL without logprobs */
} choice;

typedef struct {
    int state;                /* 0 running, 1 done, 2 error */
    json_t *error;
    cm_oai_completion req;
    choice ch[CM_OAI_MAX_N];
    int prompt_tokens, cached_tokens;
} line;

/* A JSON string of arbitrary bytes: invalid UTF-8 becomes U+FFFD. */
static json_t *jstr(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    char *buf = malloc(n * 3 + 1);
    if (!buf) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = cm_utf8_decode(s + i, n - i, &cp);
        o += (size_t)cm_utf8_encode(cp, buf + o);
        i += (size_t)l;
    }
    j = json_stringn(buf, o);
    free(buf);
    return j;
}

static json_t *error_obj(const char *msg, const char *param, int rc) {
    return json_pack("{s:{s:s,s:s,s:s?,s:s}}", "error", "message", msg, "type",
                     rc == LLM_ENOMEM ? "server_error" : "invalid_request_error", "param", param, "code",
                     rc == LLM_ERANGE ? "context_length_exceeded" : "invalid_value");
}

static int append(choice *c, const char *s, size_t n) {
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 64;
        while (cap < c->len + n + 1) cap *= 2;
        char *t = realloc(c->text, cap);
        if (!t) return LLM_ENOMEM;
        c->text = t;
        c->cap = cap;
    }
    memcpy(c->text + c->len, s, n);
    c->len += n;
    return 0;
}

static json_t *piece_json(const cm_tokenizer *tok, int32_t id) {
    const char *p;
    size_t l;
    if (cm_tok_piece(tok, id, 1, &p, &l)) return json_string("");
    return jstr(p, l);
}

static void on_output(const wk_engine *e, line *ln, const wk_output *o) {
    const cm_tokenizer *tok = wk_engine_model(e)->tok;
    choice *c = &ln->ch[o->index];
    if (c->lp_tokens && o->logprobs) {
        /* text_offset: where each token's text starts in the choice text */
        for (int i = 0; i < o->n_tokens; i++) {
            const wk_token_lp *lp = &o->logprobs[i];
            json_array_append_new(c->lp_tokens, piece_json(tok, lp->token));
            json_array_append_new(c->lp_values, json_real(lp->logprob));
            json_t *top = json_object();
            for (int k = 0; k < lp->n_top; k++) {
                const char *p;
                size_t l;
                char key[256];
                if (cm_tok_piece(tok, lp->top[k].id, 1, &p, &l)) continue;
                json_t *ks = jstr(p, l);
                snprintf(key, sizeof key, "%s", ks ? json_string_value(ks) : "");
                json_decref(ks);
                if (!json_object_get(top, key)) json_object_set_new(top, key, json_real(lp->top[k].logprob));
            }
            json_array_append_new(c->lp_top, top);
            json_array_append_new(c->lp_offsets, json_integer((json_int_t)c->tok_offset));
            const char *p;
            size_t l = 0;
            if (!cm_tok_piece(tok, lp->token, 0, &p, &l)) c->tok_offset += l;
        }
    }
    append(c, o->text, o->text_len);
    if (o->finish) c->finish = o->finish;
    c->completion_tokens = o->completion_tokens;
    ln->prompt_tokens = o->prompt_tokens;
    ln->cached_tokens = o->cached_tokens;
}

static json_t *response(const line *ln, int idx, const char *model, long created) {
    json_t *choices = json_array();
    int completion = 0;
    for (int i = 0; i < ln->req.n; i++) {
        const choice *c = &ln->ch[i];
        json_t *lp = json_null();
        if (c->lp_tokens)
            lp = json_pack("{s:O,s:O,s:O,s:O}", "tokens", c->lp_tokens, "token_logprobs", c->lp_values, "top_logprobs",
                           c->lp_top, "text_offset", c->lp_offsets);
        json_array_append_new(choices, json_pack("{s:i,s:o,s:o,s:s?}", "index", i, "text", jstr(c->text ? c->text : "", c->len),
                                                 "logprobs", lp, "finish_reason", wk_finish_name(c->finish)));
    }
    for (int i = 0; i < ln->req.n; i++) completion += ln->ch[i].completion_tokens;
    char id[64];
    snprintf(id, sizeof id, "cmpl-batch-%d", idx);
    return json_pack("{s:s,s:s,s:I,s:s,s:o,s:{s:i,s:i,s:i,s:{s:i}}}", "id", id, "object", "text_completion", "created",
                     (json_int_t)created, "model", model, "choices", choices, "usage", "prompt_tokens", ln->prompt_tokens,
                     "completion_tokens", completion, "total_tokens", ln->prompt_tokens + completion,
                     "prompt_tokens_details", "cached_tokens", ln->cached_tokens);
}

static void free_line(line *ln) {
    for (int i = 0; i < CM_OAI_MAX_N; i++) {
        free(ln->ch[i].text);
        json_decref(ln->ch[i].lp_tokens);
        json_decref(ln->ch[i].lp_values);
        json_decref(ln->ch[i].lp_top);
        json_decref(ln->ch[i].lp_offsets);
    }
    json_decref(ln->error);
    cm_oai_completion_free(&ln->req);
}

/* Converts a parsed request to engine parameters (pointers into req). */
static void to_params(const cm_oai_completion *r, wk_params *p) {
    wk_params_default(p);
    p->s.temperature = (float)r->temperature;
    p->s.top_p = (float)r->top_p;
    p->s.min_p = (float)r->min_p;
    p->s.top_k = r->top_k;
    p->s.presence_penalty = (float)r->presence_penalty;
    p->s.frequency_penalty = (float)r->frequency_penalty;
    p->s.repetition_penalty = (float)r->repetition_penalty;
    p->s.n_bias = r->n_bias;
    p->s.bias = (const wk_bias *)r->bias;
    p->max_tokens = r->max_tokens ? r->max_tokens : 16; /* the OpenAI completions default */
    p->min_tokens = r->min_tokens;
    p->n = r->n;
    p->logprobs = r->logprobs;
    p->ignore_eos = r->ignore_eos;
    p->has_seed = r->has_seed;
    p->seed = r->seed;
    p->priority = r->priority;
    p->cache_salt = r->cache_salt ? cm_salt_of(r->cache_salt, strlen(r->cache_salt)) : 0;
    p->n_stop = r->n_stop;
    for (int i = 0; i < r->n_stop; i++) p->stop[i] = r->stop[i];
    p->n_stop_ids = r->n_stop_ids;
    p->stop_ids = r->stop_ids;
}

int tl_batch_run(wk_model *m, const wk_engine_opts *eo, const char *path, const char *model_name) {
    FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
    if (!f) {
        fprintf(stderr, "llmserve: cannot open %s\n", path);
        return 1;
    }
    char err[512] = "";
    wk_engine *e = NULL;
    int rc = wk_engine_create(m, eo, &e, err, sizeof err);
    if (rc) {
        fprintf(stderr, "llmserve: %s\n", err[0] ? err : cm_strerror(rc));
        if (f != stdin) fclose(f);
        return 1;
    }
    line *lines = NULL;
    int n = 0, cap = 0, ret = 1, printed = 0;
    char *buf = NULL;
    size_t bcap = 0;
    ssize_t got;
    long created = (long)time(NULL);
    _Static_assert(sizeof(cm_oai_bias) == sizeof(wk_bias), "bias layouts agree");
    double t0 = tl_now();
    while ((got = getline(&buf, &bcap, f)) >= 0) {
        size_t l = (size_t)got;
        while (l && (buf[l - 1] == '\n' || buf[l - 1] == '\r')) l--;
        size_t s = 0;
        while (s < l && (buf[s] == ' ' || buf[s] == '\t')) s++;
        if (s == l) continue; /* blank lines carry no request */
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            line *nl = realloc(lines, sizeof *lines * (size_t)cap);
            if (!nl) goto out;
            lines = nl;
        }
        line *ln = &lines[n];
        memset(ln, 0, sizeof *ln);
        const char *param = NULL;
        int prc = cm_oai_parse_completion(buf + s, l - s, &ln->req, err, sizeof err, &param);
        if (!prc) {
            int32_t *ids = ln->req.prompt_ids;
            size_t nt = (size_t)ln->req.n_prompt_ids;
            int32_t *own = NULL;
            if (ln->req.prompt) {
                prc = cm_tok_encode(m->tok, ln->req.prompt, ln->req.prompt_len, -1, 1, &own, &nt);
                ids = own;
                if (prc) snprintf(err, sizeof err, "cannot tokenize the prompt: %s", cm_strerror(prc));
            }
            if (!prc) {
                wk_params p;
                to_params(&ln->req, &p);
                prc = wk_engine_add(e, (uint64_t)n, ids, (int)nt, &p, err, sizeof err);
                param = prc == LLM_ERANGE ? "max_tokens" : NULL;
            }
            free(own);
            if (!prc) {
                for (int i = 0; i < ln->req.n; i++) {
                    choice *c = &ln->ch[i];
                    if (ln->req.echo) {
                        char *pt = ln->req.prompt ? NULL : cm_tok_decode(m->tok, ids, nt, 0);
                        const char *src = ln->req.prompt ? ln->req.prompt : pt ? pt : "";
                        append(c, src, ln->req.prompt ? ln->req.prompt_len : strlen(src));
                        free(pt);
                    }
                    if (ln->req.logprobs >= 0) {
                        c->lp_tokens = json_array();
                        c->lp_values = json_array();
                        c->lp_top = json_array();
                        c->lp_offsets = json_array();
                    }
                }
            }
        }
        if (prc) {
            ln->state = 2;
            ln->error = error_obj(err, param, prc);
        }
        n++;
    }
    uint64_t completion_total = 0;
    for (;;) {
        const wk_output *outs;
        int no = wk_engine_outputs(e, &outs);
        for (int i = 0; i < no; i++) {
            line *ln = &lines[outs[i].id];
            on_output(e, ln, &outs[i]);
        }
        /* a line is done when every choice has finished */
        for (int i = printed; i < n; i++) {
            line *ln = &lines[i];
            if (ln->state) continue;
            int done = 1;
            for (int k = 0; k < ln->req.n; k++) done &= ln->ch[k].finish != 0;
            if (done) ln->state = 1;
        }
        while (printed < n && lines[printed].state) {
            line *ln = &lines[printed];
            json_t *j = ln->error;
            if (ln->state == 1) {
                j = response(ln, printed, model_name, created);
                ln->error = j;
            }
            char *txt = json_dumps(j, JSON_COMPACT);
            if (txt) {
                fputs(txt, stdout);
                fputc('\n', stdout);
                free(txt);
            }
            fflush(stdout);
            free_line(ln);
            printed++;
        }
        if (!wk_engine_has_work(e)) break;
        int s = wk_engine_step(e);
        if (s < 0) {
            fprintf(stderr, "llmserve: engine step failed: %s\n", cm_strerror(s));
            goto out;
        }
    }
    double dt = tl_now() - t0;
    wk_engine_stats st;
    wk_engine_get_stats(e, &st);
    completion_total = st.tokens_generated;
    fprintf(stderr,
            "llmserve: %d requests in %.2f s: %llu tokens generated (%.1f tok/s), %llu computed in %llu steps, "
            "prefix cache hits %llu of %llu prompt tokens, %llu preemptions\n",
            n, dt, (unsigned long long)completion_total, dt > 0 ? (double)completion_total / dt : 0.0,
            (unsigned long long)st.tokens_computed, (unsigned long long)st.steps, (unsigned long long)st.prefix_hits,
            (unsigned long long)st.prefix_queries, (unsigned long long)st.preemptions);
    ret = 0;
out:
    for (int i = printed; i < n; i++) free_line(&lines[i]);
    free(buf);
    free(lines);
    wk_engine_free(e);
    if (f != stdin) fclose(f);
    return ret;
}
