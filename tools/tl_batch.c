/* llmserve generate --batch FILE.jsonl: every line an OpenAI completions
 * request body, all of them run through the engine at once (continuous
 * batching); every output line the OpenAI completion response (or error)
 * for its input line, in input order, written as soon as it and all lines
 * before it are done. */
#include "cm_error.h"
#include "cm_time.h"
#include "cm_log.h"
#include "cm_oai.h"
#include "cm_oai_resp.h"
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
    int state;                /* 0 running, 1 done, 2 error */
    json_t *error;
    cm_oai_completion req;
    cm_oai_result res;        /* the response, collected as the engine produces it */
    char id[32];
    int32_t *ids;             /* the prompt's tokens (its logprobs are reported against them) */
    int n_ids;
} line;

static json_t *error_obj(const char *msg, const char *param, int rc) {
    return cm_oai_error_json(rc == LLM_ENOMEM ? 500 : 400, msg, param,
                             rc == LLM_ERANGE ? "context_length_exceeded" : "invalid_value");
}

static int finish_code(int f) {
    return f == WK_FINISH_STOP ? CM_OAI_FINISH_STOP : f == WK_FINISH_LENGTH ? CM_OAI_FINISH_LENGTH
           : f ? CM_OAI_FINISH_ABORT : CM_OAI_FINISH_NONE;
}

static void lp_of(cm_oai_lp *d, const wk_token_lp *l) {
    d->token = l->token;
    d->logprob = l->logprob;
    d->n_top = l->n_top < CM_OAI_MAX_LOGPROBS ? l->n_top : CM_OAI_MAX_LOGPROBS;
    for (int k = 0; k < d->n_top; k++) d->top[k] = (cm_oai_top){l->top[k].id, l->top[k].logprob};
}

static void on_output(const wk_engine *e, line *ln, const wk_output *o) {
    const cm_tokenizer *tok = wk_engine_model(e)->tok;
    cm_oai_lp lp[64];
    int n_lp = 0;
    for (int i = 0; o->logprobs && i < o->n_tokens && i < 64; i++, n_lp++) lp_of(&lp[i], &o->logprobs[i]);
    if (o->n_prompt_logprobs) { /* once, with choice 0's first output (echo with logprobs, prompt_logprobs) */
        cm_oai_lp *pl = malloc(sizeof *pl * (size_t)o->n_prompt_logprobs);
        for (int i = 0; pl && i < o->n_prompt_logprobs; i++) lp_of(&pl[i], &o->prompt_logprobs[i]);
        if (pl && o->n_prompt_logprobs < ln->n_ids) cm_oai_result_prompt(&ln->res, ln->ids, ln->n_ids, pl, o->n_prompt_logprobs);
        free(pl);
    }
    cm_oai_result_add(&ln->res, o->index, o->text, o->text_len, n_lp ? lp : NULL, n_lp, tok);
    cm_oai_choice *c = &ln->res.ch[o->index];
    if (o->finish) c->finish = finish_code(o->finish);
    if (o->finish && o->stop_str >= 0) c->stop_kind = CM_OAI_STOP_STRING, c->stop_val = o->stop_str;
    else if (o->finish && o->stop_tok >= 0) c->stop_kind = CM_OAI_STOP_TOKEN, c->stop_val = o->stop_tok;
    c->completion_tokens = o->completion_tokens;
    ln->res.prompt_tokens = o->prompt_tokens;
    ln->res.cached_tokens = o->cached_tokens;
}

static void free_line(line *ln) {
    cm_oai_result_free(&ln->res);
    json_decref(ln->error);
    cm_oai_completion_free(&ln->req);
    free(ln->ids);
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
    double t0 = cm_now();
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
                cm_gen_params gp;
                cm_oai_gen_params(&ln->req, ln->req.max_tokens ? ln->req.max_tokens : 16 /* OpenAI's default */, &gp);
                prc = wk_params_from_gen(&gp, &p, err, sizeof err);
                if (!prc) prc = wk_engine_add(e, (uint64_t)n, ids, (int)nt, &p, err, sizeof err);
                param = prc == LLM_ERANGE ? "max_tokens" : NULL;
            }
            if (!prc && (ln->ids = malloc(sizeof *ln->ids * (nt ? nt : 1)))) {
                memcpy(ln->ids, ids, sizeof *ids * nt);
                ln->n_ids = (int)nt;
            }
            char *pt = !prc && ln->req.echo && !ln->req.prompt ? cm_tok_decode(m->tok, ids, nt, 0) : NULL;
            free(own);
            if (!prc) {
                snprintf(ln->id, sizeof ln->id, "cmpl-batch-%d", n);
                const char *src = ln->req.prompt ? ln->req.prompt : pt;
                cm_oai_result_init(&ln->res, &ln->req, ln->id, model_name, created, src,
                                   ln->req.prompt ? ln->req.prompt_len : pt ? strlen(pt) : 0);
            }
            free(pt);
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
            if (cm_oai_result_done(&ln->res)) ln->state = 1;
        }
        while (printed < n && lines[printed].state) {
            line *ln = &lines[printed];
            json_t *j = ln->error;
            if (ln->state == 1) {
                j = cm_oai_response_json(&ln->res, m->tok);
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
    double dt = cm_now() - t0;
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
