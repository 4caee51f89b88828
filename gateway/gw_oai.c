#include "gw_oai.h"
#include "cm_time.h"
#include "cm_chat.h"
#include "cm_harmony.h"
#include "cm_grammar.h"
#include "cm_error.h"
#include "cm_log.h"
#include "gw_metrics.h"
#include "gw_admit.h"
#include "gw_anthropic.h"
#include "gw_responses.h"
#include "gw_score.h"
#include "gw_models.h"
#include "gw_batch.h"
#include "gw_embed.h"
#include "gw_lora.h"
#include "gw_pool.h"
#include "gw_req.h"
#include "gw_tokenize.h"
#include "cm_tools.h"
#include "gw_tokq.h"

#include <math.h>
#include <xxhash.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A chat or completion's own state (q->x), beside what every request has. */
typedef struct {
    /* --semantic-cache: the keys, the last user turn for the embedding model, its vector */
    int cache_on, cache_hit;
    uint64_t cache_scope, cache_exact;
    int32_t *cache_etok;
    int cache_en;
    float *cache_vec;
    char *ctext;                 /* a streamed answer's text, kept to be stored */
    size_t clen, ccap;
    int trim_policy, trim_messages, trim_tokens; /* the history was trimmed to fit */
    /* context_overflow summarize: the prompt asking for the summary, where it goes, its cache key */
    int32_t *summ_tok;
    int summ_n, summ_head, summ_from, summ_room, summ_tokens, summ_cached;
    uint64_t summ_key;
    gw_prompt *prompts;          /* completions with a list of prompts: each, tokenized (gw_batch) */
} gen;

static gen *gx(const gw_req *q) { return q->x; }

static void gen_release(gw_req *q) {
    gen *x = q->x;
    if (!x) return;
    free(x->cache_etok);
    free(x->cache_vec);
    free(x->ctext);
    free(x->summ_tok);
    gw_prompts_free(x->prompts, q->c.n_batch);
    free(x);
    q->x = NULL;
}

typedef struct {
    gw_prep b;
    int chat;
    /* --semantic-cache: on, the tenant, and the embedding model (held) whose tokens the question needs */
    int cache, cache_sampled, emax_len;
    char tenant[64];
    gw_model *emodel;
    int overflow;                /* --context-overflow */
    int reasoning;               /* --reasoning-parser: CM_REASON_R1, _QWEN3, or NONE */
} prep;

#define REFUSE(st, prm, cd, ...)                                                                   \
    do {                                                                                           \
        gw_prep_refuse(&p->b, st, prm, cd, __VA_ARGS__);                                           \
        return;                                                                                    \
    } while (0)

static void too_long(prep *p, gw_req *q, size_t at_least, const char *what) {
    gw_prep_refuse(&p->b, 400, p->chat ? "messages" : "prompt", "context_length_exceeded",
             "This model's maximum context length is %d tokens. However, your %s resulted in more than %zu tokens. "
             "Please reduce the length of the %s.",
             p->b.max_len, what, at_least > (size_t)p->b.max_len ? at_least - 1 : (size_t)p->b.max_len, what);
}

/* --semantic-cache, on the tokenizer thread: whether the request may be
 * answered from the cache, and its keys. Eligible: chat, one choice, no
 * logprobs, the last message a user's, greedy (or --semantic-cache-sampled).
 * The scope hashes everything else that could change the answer: the
 * tenant, the model, every other field of the body (sampling, max_tokens,
 * stop, tools, tool_choice, response_format: a request with another schema
 * never shares answers) but the stream options and user, and the earlier
 * messages. */
static void cache_keys(prep *p, gw_req *q, const char *body, size_t len) {
    const cm_oai_completion *c = &q->c;
    if (!p->cache || !c->is_chat || c->n != 1 || c->logprobs >= 0 || c->prompt_logprobs >= 0 || !c->n_messages ||
        (c->temperature > 0 && !p->cache_sampled))
        return;
    const struct cm_oai_msg *last = &c->messages[c->n_messages - 1];
    if (!last->role || strcmp(last->role, "user") || !last->content || !last->content[0]) return;
    json_t *o = json_loadb(body, len, JSON_ALLOW_NUL, NULL);
    json_t *msgs = json_incref(json_object_get(o, "messages"));
    if (!json_is_object(o) || !json_is_array(msgs)) {
        json_decref(msgs);
        json_decref(o);
        return;
    }
    static const char *const out_of_scope[] = {"messages", "stream", "stream_options", "user", "model", NULL};
    for (const char *const *k = out_of_scope; *k; k++) json_object_del(o, *k);
    json_array_remove(msgs, json_array_size(msgs) - 1);
    char *params = json_dumps(o, JSON_SORT_KEYS | JSON_COMPACT | JSON_ENCODE_ANY);
    char *ctx = json_dumps(msgs, JSON_SORT_KEYS | JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(msgs);
    json_decref(o);
    XXH3_state_t *st = XXH3_createState();
    if (params && ctx && st) {
        XXH3_64bits_reset(st);
        XXH3_64bits_update(st, p->tenant, strlen(p->tenant) + 1);
        const char *mn = q->c.model && q->c.model[0] ? q->c.model : p->b.served; /* an adapter's answers are its own */
        XXH3_64bits_update(st, mn, strlen(mn) + 1);
        XXH3_64bits_update(st, params, strlen(params) + 1);
        XXH3_64bits_update(st, ctx, strlen(ctx));
        gx(q)->cache_scope = XXH3_64bits_digest(st);
        gx(q)->cache_exact = gw_cache_exact_key(last->content, strlen(last->content));
        gx(q)->cache_on = 1;
    }
    XXH3_freeState(st);
    free(params);
    free(ctx);
    if (!gx(q)->cache_on || !p->emodel) return;
    /* the question for the embedding model: [CLS] ... [SEP], its first tokens when it is longer than the model takes */
    size_t n = 0;
    int32_t *ids = NULL;
    if (cm_tok_encode(p->emodel->tok, last->content, strlen(last->content), 1, 1, &ids, &n) || !n) return;
    if (n > (size_t)p->emax_len) {
        ids[p->emax_len - 1] = ids[n - 1];
        n = (size_t)p->emax_len;
    }
    gx(q)->cache_etok = ids;
    gx(q)->cache_en = (int)n;
}

/* msgs[0..n) rendered with the tools and the chat template, then tokenized
 * with limit. LLM_EFORMAT when the template cannot render them. */
static int render_tokens(const gw_model *m, gw_req *q, struct cm_oai_msg *msgs, int n, size_t limit, int32_t **ids,
                         size_t *nt) {
    cm_tools_prompt tp; /* the messages with tools, calls and results written out (cm_tools.h) */
    char *text = NULL;
    struct cm_oai_msg *all = q->c.messages;
    int n_all = q->c.n_messages;
    q->c.messages = msgs, q->c.n_messages = n;
    int rc = cm_tools_render(&q->c, q->c.tool_format, m->default_system, &tp);
    q->c.messages = all, q->c.n_messages = n_all;
    if (rc) return LLM_ENOMEM;
    rc = q->c.continue_final_message ? cm_chat_render_open(m->chat_kind, m->default_system, tp.msgs, tp.n, &text)
                                     : cm_chat_render(m->chat_kind, m->default_system, tp.msgs, tp.n, q->c.add_generation_prompt, &text);
    if (!rc && !q->c.enable_thinking && q->c.add_generation_prompt) rc = cm_chat_no_thinking(m->chat_kind, &text);
    cm_tools_free(&tp);
    if (rc || !text) return LLM_EFORMAT;
    rc = cm_tok_encode_limit(m->tok, text, strlen(text), -1, 1, limit, ids, nt);
    free(text);
    return rc;
}

/* The history does not fit budget tokens: drop whole turns (a user message
 * and what follows it up to the next one) until it does. Kept always: the
 * leading system / developer messages and the last turn; with middle-out
 * the first turn too. The fewest turns that make it fit are found by
 * bisection (a render and a tokenization each), not one at a time. */
static void trim(prep *p, gw_req *q, const gw_model *m, int policy, size_t budget) {
    struct cm_oai_msg *ms = q->c.messages, *keep = NULL;
    int n = q->c.n_messages, k0 = 0, users[4096], nu = 0;
    while (k0 < n && (!strcmp(ms[k0].role, "system") || !strcmp(ms[k0].role, "developer"))) k0++;
    for (int i = k0; i < n && nu < 4096; i++)
        if (!strcmp(ms[i].role, "user")) users[nu++] = i;
    /* droppable turns: [start of turn t, start of turn t+1) for t in [t0, nu-1); the first turn starts at k0 */
    int t0 = policy == CM_OVERFLOW_TRUNCATE_LEFT ? 0 : 1, nd = nu - 1 - t0;
    size_t full = 0;
    int32_t *ids = NULL;
    render_tokens(m, q, ms, n, SIZE_MAX, &ids, &full); /* what the whole history would take, for usage */
    free(ids);
    ids = NULL;
    if (nd < 1 || !(keep = malloc(sizeof *keep * (size_t)n))) {
        gw_prep_refuse(&p->b, nd < 1 ? 400 : 500, "messages", nd < 1 ? "context_length_exceeded" : "internal_error", nd < 1 ? "The messages take %zu tokens, more than the %zu this model's context "
                 "leaves for them, and there is no earlier turn to drop (context_overflow %s keeps the system prompt%s "
                 "and the last turn)" : "out of memory", full, budget, cm_oai_overflow_name(policy),
                 policy != CM_OVERFLOW_TRUNCATE_LEFT ? ", the first turn" : "");
        return;
    }
    /* the history without droppable turns [0, d): the kept head, then from the start of turn t0 + d on */
    int lo = 1, hi = nd, best = -1;
    size_t best_nt = 0;
    int32_t *best_ids = NULL;
    while (lo <= hi) {
        int d = (lo + hi) / 2, head = t0 == 0 ? k0 : users[t0], from = users[t0 + d], kn = 0;
        for (int i = 0; i < head; i++) keep[kn++] = ms[i];
        for (int i = from; i < n; i++) keep[kn++] = ms[i];
        size_t nt = 0;
        int rc = render_tokens(m, q, keep, kn, budget, &ids, &nt);
        if (rc == 0) {
            free(best_ids);
            best_ids = ids, best = d, best_nt = nt;
            hi = d - 1;
        } else {
            lo = d + 1;
        }
        ids = NULL;
    }
    free(keep);
    if (best < 0) {
        gw_prep_refuse(&p->b, 400, "messages", "context_length_exceeded", "The messages take %zu tokens, more than the %zu this model's context leaves for "
                 "them, even with every earlier turn dropped (context_overflow %s)", full, budget,
                 cm_oai_overflow_name(policy));
        return;
    }
    q->tok = best_ids;
    q->n_tok = (int)best_nt;
    gx(q)->trim_policy = policy;
    gx(q)->summ_head = t0 == 0 ? k0 : users[t0];
    gx(q)->summ_from = users[t0 + best];
    gx(q)->trim_messages = gx(q)->summ_from - gx(q)->summ_head;
    gx(q)->trim_tokens = full > best_nt ? (int)(full - best_nt) : 0;
}

static const char SUMMARY_SYSTEM[] =
    "You summarize conversations. Write a short summary of the conversation below: its facts, names, numbers, "
    "decisions and open questions, in a few sentences. Write only the summary.";
#define SUMMARY_INTRO "Summary of the earlier conversation: "

/* context_overflow summarize, on the tokenizer thread: the dropped turns as
 * a transcript, and the prompt that asks the served model to summarize
 * them (the transcript's newest part when all of it would not fit). Without
 * one, the request goes on as middle-out. */
static void summary_prompt(prep *p, gw_req *q, const gw_model *m) {
    size_t cap = 1024, len = 0;
    char *tr = malloc(cap);
    for (int i = gx(q)->summ_head; tr && i < gx(q)->summ_from; i++) {
        const struct cm_oai_msg *ms = &q->c.messages[i];
        const char *body = ms->content ? ms->content : ms->tool_calls ? ms->tool_calls : "";
        size_t need = strlen(ms->role) + strlen(body) + 32;
        if (len + need > cap) {
            while (len + need > cap) cap *= 2;
            char *nt = realloc(tr, cap);
            if (!nt) { free(tr); tr = NULL; break; }
            tr = nt;
        }
        len += (size_t)snprintf(tr + len, cap - len, "%s%s: %s\n", ms->tool_calls && !ms->content ? "(tool call) " : "",
                                ms->role, body);
    }
    if (!tr) return;
    gx(q)->summ_key = XXH3_64bits(tr, len) ^ m->fp;
    if (!gx(q)->summ_key) gx(q)->summ_key = 1;
    const char *from = tr;
    for (int tries = 0; tries < 6; tries++) { /* halve the transcript, from its old end, until it fits */
        cm_chat_msg cm[2] = {{"system", SUMMARY_SYSTEM}, {"user", from}};
        char *text = NULL;
        size_t nt = 0;
        if (cm_chat_render(m->chat_kind, NULL, cm, 2, 1, &text) || !text) break;
        int rc = cm_tok_encode_limit(m->tok, text, strlen(text), -1, 1, (size_t)(p->b.max_len - gx(q)->summ_room), &gx(q)->summ_tok,
                                     &nt);
        free(text);
        if (rc == 0) {
            gx(q)->summ_n = (int)nt;
            break;
        }
        if (rc != LLM_ERANGE) break;
        from += strlen(from) / 2;
        while ((*from & 0xc0) == 0x80) from++; /* a character boundary */
    }
    free(tr);
}

/* On a tokenizer thread: everything about the request that needs no loop state. */
static void prep_run(gw_job *j) {
    prep *p = (prep *)j;
    gw_req *q = p->b.q;
    const gw_model *m = q->model;
    char perr[512];
    const char *param = NULL;
    int rc = p->chat ? cm_oai_parse_chat(p->b.body, p->b.len, &q->c, perr, sizeof perr, &param)
                     : cm_oai_parse_completion(p->b.body, p->b.len, &q->c, perr, sizeof perr, &param);
    if (!rc) cache_keys(p, q, p->b.body, p->b.len);
    free(p->b.body);
    p->b.body = NULL;
    if (rc) REFUSE(400, param, "invalid_value", "%s", perr);
    if (q->c.model && strcmp(q->c.model, p->b.served) && p->b.eserved[0] && !strcmp(q->c.model, p->b.eserved))
        REFUSE(400, "model", "invalid_value", "The model `%.128s` is an embedding model: it serves /v1/embeddings, not "
               "%s.", q->c.model, p->chat ? "chat completions" : "completions");
    q->lora = q->c.model && strcmp(q->c.model, p->b.served) && gw_pool_has_lora(p->b.loras, q->c.model);
    if (q->c.model && strcmp(q->c.model, p->b.served) && !q->lora)
        REFUSE(404, "model", "model_not_found", "The model `%.128s` does not exist.", q->c.model);
    size_t nt = 0, limit = (size_t)p->b.max_len; /* the prompt alone may not fill the context */
    if (p->chat) {
        int tf = cm_tools_format(m->chat_kind);
        q->c.tool_format = tf;
        q->c.reasoning = m->chat_kind == CM_CHAT_HARMONY ? CM_REASON_HARMONY : p->reasoning;
        int tools_on = q->c.n_tools && q->c.tool_choice != CM_TOOL_NONE;
        if (q->c.reasoning == CM_REASON_HARMONY && tools_on)
            REFUSE(400, "tools", "invalid_value", "tools: function calling in the harmony format (gpt-oss's commentary "
                   "channel) is not implemented");
        if (!q->c.enable_thinking && !(q->c.reasoning == CM_REASON_QWEN3 && m->chat_kind == CM_CHAT_CHATML))
            REFUSE(400, "chat_template_kwargs", "invalid_value", "chat_template_kwargs.enable_thinking false is honoured "
                   "with --reasoning-parser qwen3 on a ChatML template (Qwen3's), not here");
        if (tf != CM_TOOLS_HERMES && (rc = cm_oai_tools_grammar(&q->c, tf, perr, sizeof perr)))
            REFUSE(rc == LLM_ENOMEM ? 500 : 400, "tools", rc == LLM_ENOMEM ? "internal_error" : "invalid_value", "%s", perr);
        /* a thinking model: the answer after its reasoning is held to the grammar (structured output, forced tool
         * calls), the reasoning is free; calls are read from the content (cm_oai_resp.c) */
        int thinks = (q->c.reasoning == CM_REASON_R1 || q->c.reasoning == CM_REASON_QWEN3) && q->c.enable_thinking;
        if (thinks && q->c.grammar) {
            char *w = NULL;
            rc = cm_grammar_after(q->c.grammar, strlen(q->c.grammar), q->c.reasoning == CM_REASON_QWEN3 ? "<think>" : NULL,
                                  "</think>", &w);
            if (rc) REFUSE(500, NULL, "internal_error", "out of memory");
            free(q->c.grammar);
            q->c.grammar = w;
        }
        int policy = q->c.context_overflow >= 0 ? q->c.context_overflow : p->overflow;
        if (policy != CM_OVERFLOW_ERROR) { /* the budget leaves room for the answer */
            int L = p->b.max_len, room = q->c.max_tokens ? q->c.max_tokens : (L / 4 < 256 ? L / 4 : 256);
            if (room >= L) REFUSE(400, "max_tokens", "context_length_exceeded", "'max_tokens' (%d) leaves no room for any "
                                  "prompt in this model's context of %d tokens", room, L);
            rc = render_tokens(m, q, q->c.messages, q->c.n_messages, (size_t)(L - room), &q->tok, &nt);
            if (rc == LLM_ERANGE) {
                /* summarize: the kept turns leave room for the summary too */
                gx(q)->summ_room = policy == CM_OVERFLOW_SUMMARIZE ? ((L - room) / 4 < 256 ? (L - room) / 4 : 256) : 0;
                trim(p, q, m, policy, (size_t)(L - room - gx(q)->summ_room));
                if (p->b.status) return;
                if (policy == CM_OVERFLOW_SUMMARIZE) summary_prompt(p, q, m);
                nt = (size_t)q->n_tok;
                rc = 0;
            }
        } else {
            rc = render_tokens(m, q, q->c.messages, q->c.n_messages, limit, &q->tok, &nt);
            if (rc == LLM_ERANGE) {
                too_long(p, q, nt, "messages");
                return;
            }
        }
        if (rc == LLM_EFORMAT) REFUSE(400, "messages", "invalid_value", "cannot render the messages with the %s chat template",
                                      cm_chat_name(m->chat_kind));
        if (rc == LLM_ENOMEM) REFUSE(500, NULL, "internal_error", "out of memory");
    } else if (q->c.n_batch) { /* each prompt as a request of its own; the parent counts their sum */
        if (!(gx(q)->prompts = calloc((size_t)q->c.n_batch, sizeof *gx(q)->prompts))) REFUSE(500, NULL, "internal_error", "out of memory");
        for (int i = 0; i < q->c.n_batch; i++) {
            const cm_oai_prompt *b = &q->c.batch[i];
            gw_prompt *pp = &gx(q)->prompts[i];
            size_t k = 0;
            if (b->text) {
                rc = cm_tok_encode_limit(m->tok, b->text, b->len, -1, 1, limit, &pp->tok, &k);
                if (rc == LLM_ERANGE) {
                    too_long(p, q, k, "prompt");
                    return;
                }
                if (rc) REFUSE(400, "prompt", "invalid_value", "prompt[%d] cannot be tokenized: %s", i, cm_strerror(rc));
                if (q->c.echo && (pp->echo = malloc(b->len + 1))) memcpy(pp->echo, b->text, b->len + 1), pp->echo_len = b->len;
            } else {
                for (int t = 0; t < b->n_ids; t++)
                    if (b->ids[t] >= p->b.vocab)
                        REFUSE(400, "prompt", "invalid_value", "prompt[%d] token id %d is outside the vocabulary (%d tokens)",
                               i, b->ids[t], p->b.vocab);
                if ((size_t)b->n_ids > limit) {
                    too_long(p, q, (size_t)b->n_ids + 1, "prompt");
                    return;
                }
                k = (size_t)b->n_ids;
                if (!(pp->tok = malloc(sizeof(int32_t) * k))) REFUSE(500, NULL, "internal_error", "out of memory");
                memcpy(pp->tok, b->ids, sizeof(int32_t) * k);
                if (q->c.echo && (pp->echo = cm_tok_decode(m->tok, pp->tok, k, 0))) pp->echo_len = strlen(pp->echo);
            }
            if (!k) REFUSE(400, "prompt", "invalid_value", "prompt[%d] is empty", i);
            int mt = q->c.max_tokens ? q->c.max_tokens : 16;
            if ((int64_t)k + mt > p->b.max_len)
                REFUSE(400, "max_tokens", "context_length_exceeded",
                       "This model's maximum context length is %d tokens. However, you requested %lld tokens (%zu in "
                       "prompt[%d], %d in the completion). Please reduce the length of the prompt or completion.",
                       p->b.max_len, (long long)k + mt, k, i, mt);
            pp->n_tok = (int)k;
            nt += k;
        }
    } else if (q->c.prompt) {
        rc = cm_tok_encode_limit(m->tok, q->c.prompt, q->c.prompt_len, -1, 1, limit, &q->tok, &nt);
        if (rc == LLM_ERANGE) {
            too_long(p, q, nt, "prompt");
            return;
        }
        if (!rc && q->c.echo && (q->echo = malloc(q->c.prompt_len + 1))) {
            memcpy(q->echo, q->c.prompt, q->c.prompt_len + 1);
            q->echo_len = q->c.prompt_len;
        }
    } else {
        nt = (size_t)q->c.n_prompt_ids;
        for (size_t i = 0; i < nt; i++)
            if (q->c.prompt_ids[i] >= p->b.vocab)
                REFUSE(400, "prompt", "invalid_value", "prompt token id %d is outside the vocabulary (%d tokens)",
                       q->c.prompt_ids[i], p->b.vocab);
        if (nt > limit) {
            too_long(p, q, nt + 1, "prompt");
            return;
        }
        q->tok = malloc(sizeof(int32_t) * (nt ? nt : 1));
        if (!q->tok) REFUSE(500, NULL, "internal_error", "out of memory");
        memcpy(q->tok, q->c.prompt_ids, sizeof(int32_t) * nt);
        if (q->c.echo && (q->echo = cm_tok_decode(m->tok, q->tok, nt, 0))) q->echo_len = strlen(q->echo);
    }
    if (rc) REFUSE(400, p->chat ? "messages" : "prompt", "invalid_value", "the prompt cannot be tokenized: %s", cm_strerror(rc));
    if (!nt) REFUSE(400, p->chat ? "messages" : "prompt", "invalid_value", "the prompt is empty");
    q->n_tok = (int)nt;
    /* what the worker would refuse after a 200, refused here before it */
    for (int i = 0; i < q->c.n_bias; i++)
        if (q->c.bias[i].id >= p->b.vocab)
            REFUSE(400, "logit_bias", "invalid_value", "logit_bias token id %d is outside the vocabulary (%d tokens)",
                   q->c.bias[i].id, p->b.vocab);
    for (int i = 0; i < q->c.n_stop_ids; i++)
        if (q->c.stop_ids[i] >= p->b.vocab)
            REFUSE(400, "stop_token_ids", "invalid_value", "stop token id %d is outside the vocabulary (%d tokens)",
                   q->c.stop_ids[i], p->b.vocab);
    int L = p->b.max_len;
    q->max_tokens = q->c.max_tokens ? q->c.max_tokens : p->chat ? L - (int)nt : 16;
    if (!q->c.n_batch && (int64_t)nt + q->max_tokens > L) /* a batch's prompts were checked one by one */
        REFUSE(400, p->chat ? "messages" : "max_tokens", "context_length_exceeded",
               "This model's maximum context length is %d tokens. However, you requested %lld tokens (%zu in the %s, %d in "
               "the completion). Please reduce the length of the %s or completion.",
               L, (long long)nt + q->max_tokens, nt, p->chat ? "messages" : "prompt", q->max_tokens,
               p->chat ? "messages" : "prompt");
    if (q->c.min_tokens > q->max_tokens)
        REFUSE(400, "min_tokens", "invalid_value", "'min_tokens' (%d) must not exceed max_tokens (%d)", q->c.min_tokens,
               q->max_tokens);
    if (q->c.n_batch) q->max_tokens *= q->c.n_batch; /* what the rate limits count: every prompt's */
}

/* Rate limits, then a worker group. */
static void start_summary(gw *g, gw_req *q);
static void summary_done(gw *g, gw_req *q, const char *text, size_t len);
static void cache_store(gw *g, gw_req *q);

/* A chat or completion's end: its answer to the semantic cache. */
static void generate_end(gw_req *q, int status, const char *msg, const char *code) {
    (void)msg;
    (void)code;
    if (status == 200 && gx(q)->cache_on) cache_store(q->g, q);
}

/* Its answer's start, with what trimming did to the history. */
static void generate_begin(gw_req *q) {
    gen *x = q->x;
    gw_req_generate_begin(q);
    q->res.trim_policy = x->trim_policy, q->res.trim_messages = x->trim_messages, q->res.trim_tokens = x->trim_tokens;
    q->res.trim_summary_tokens = x->summ_tokens, q->res.trim_summary_cached = x->summ_cached;
}

/* A streamed answer's text, kept for the cache to store when it ends well. */
static void generate_text(gw_req *q, const char *txt, size_t tl) {
    gen *x = q->x;
    if (!x->cache_on) return;
    if (x->clen + tl + 1 > x->ccap) {
        size_t cap = x->ccap ? x->ccap : 256;
        while (cap < x->clen + tl + 1) cap *= 2;
        char *nt = realloc(x->ctext, cap);
        if (!nt) {
            x->cache_on = 0;
            return;
        }
        x->ctext = nt, x->ccap = cap;
    }
    memcpy(x->ctext + x->clen, txt, tl);
    x->clen += tl;
}

/* A summary request's end: the request it serves goes on, with the summary or without. */
static void summary_end(gw_req *k, int status, const char *msg, const char *code) {
    (void)msg;
    (void)code;
    gw_req *q = k->x;
    if (!q) return;
    k->x = NULL;
    const cm_oai_choice *ch = &k->res.ch[0];
    summary_done(q->g, q, status == 200 && k->res.n == 1 && ch->text ? ch->text : NULL, status == 200 ? ch->len : 0);
}

static const gw_req_ops generate_ops = {.pick = gw_req_generate_pick,
                                        .send = gw_req_generate_send,
                                        .begin = generate_begin,
                                        .on_text = generate_text,
                                        .on_end = generate_end,
                                        .release = gen_release,
                                        .none = "no worker group is available",
                                        .tokens = 1};
/* A summary the gateway asks for itself: q->x is the request it serves (not owned). */
static const gw_req_ops summary_ops = {.pick = gw_req_generate_pick,
                                       .send = gw_req_generate_send,
                                       .begin = gw_req_generate_begin,
                                       .on_end = summary_end,
                                       .none = "no worker group is available",
                                       .tokens = 1};

static void admit(gw *g, gw_req *q) {
    if (!q->conn) { /* the client left while the cache or the summary was asked */
        gw_req_finish(q, 499, "the client closed the connection", "client_closed");
        return;
    }
    if (gx(q)->summ_n) { /* context_overflow summarize: the summary first */
        start_summary(g, q);
        return;
    }
    if (gw_admit_limits(g, q, (double)q->n_tok + q->max_tokens, "max_tokens", "prompt + max_tokens")) return;
    if (q->c.n_batch) { /* a completion with a list of prompts: the batch's own ops and state from here */
        gw_prompt *pr = gx(q)->prompts;
        gx(q)->prompts = NULL;
        gen_release(q);
        gw_batch_start(g, q, pr);
        return;
    }
    gw_req_start(g, q);
}

/* The summary of q's dropped turns: from the gateway's last 256, else
 * asked of the served model as a request of its own (greedy, at most
 * summ_room tokens), which calls gw_oai_summary_done when it ends. */
static void start_summary(gw *g, gw_req *q) {
    const char *hit = gw_sums_get(&g->sums, gx(q)->summ_key);
    int n = gx(q)->summ_n;
    gx(q)->summ_n = 0; /* asked once */
    if (hit) {
        gx(q)->summ_cached = 1;
        summary_done(g, q, hit, strlen(hit));
        return;
    }
    gw_req *k = calloc(1, sizeof *k);
    if (!k) {
        summary_done(g, q, NULL, 0);
        return;
    }
    k->g = g;
    k->worker = -1;
    k->key = q->key;
    k->t_arrive = cm_now();
    k->model = gw_model_ref(q->model);
    k->tok = gx(q)->summ_tok, k->n_tok = n;
    gx(q)->summ_tok = NULL;
    k->max_tokens = gx(q)->summ_room > 24 ? gx(q)->summ_room - 16 : 8; /* the intro line takes the rest */
    k->c.is_chat = 1, k->c.n = 1, k->c.top_p = 1, k->c.top_k = -1, k->c.repetition_penalty = 1;
    k->c.logprobs = k->c.prompt_logprobs = -1;
    k->x = q;
    k->ops = &summary_ops;
    gw_req_start(g, k); /* a refusal ends it, which calls gw_oai_summary_done */
}

/* context_overflow summarize: the summary arrived (text NULL: it did not);
 * the request goes on with it in place of the turns it stands for, or with
 * them dropped. */
static void summary_done(gw *g, gw_req *q, const char *text, size_t len) {
    if (!q->conn) {
        gw_req_finish(q, 499, "the client closed the connection", "client_closed");
        return;
    }
    const gw_model *m = q->model;
    while (len && (text[len - 1] == ' ' || text[len - 1] == '\n')) len--;
    char *content = text && len ? malloc(sizeof SUMMARY_INTRO + len) : NULL;
    struct cm_oai_msg *keep = content ? calloc((size_t)q->c.n_messages + 1, sizeof *keep) : NULL;
    int L = g->max_model_len, kn = 0, ok = 0;
    if (keep) {
        memcpy(content, SUMMARY_INTRO, sizeof SUMMARY_INTRO - 1);
        memcpy(content + sizeof SUMMARY_INTRO - 1, text, len);
        content[sizeof SUMMARY_INTRO - 1 + len] = 0;
        if (!gx(q)->summ_cached) { /* kept for the next request of this conversation */
            gw_sums_put(&g->sums, gx(q)->summ_key, text, len); /* without memory: asked again next time */
        }
        for (int i = 0; i < gx(q)->summ_head; i++) keep[kn++] = q->c.messages[i];
        keep[kn++] = (struct cm_oai_msg){"system", content, NULL, NULL};
        for (int i = gx(q)->summ_from; i < q->c.n_messages; i++) keep[kn++] = q->c.messages[i];
        int32_t *ids = NULL;
        size_t nt = 0;
        /* on the loop: one render and tokenization of at most the context (milliseconds) */
        if (!render_tokens(m, q, keep, kn, (size_t)(L - (q->c.max_tokens ? q->c.max_tokens : 1)), &ids, &nt)) {
            gx(q)->summ_tokens = (int)nt - q->n_tok;
            free(q->tok);
            q->tok = ids;
            q->n_tok = (int)nt;
            if (!q->c.max_tokens) q->max_tokens = L - (int)nt;
            ok = 1;
        }
    }
    if (!ok) { /* no summary: the turns stay dropped, and the usage says middle-out */
        CM_WARN("request %s: no summary of its %d dropped messages; they are dropped", q->id[0] ? q->id : "-",
                gx(q)->trim_messages);
        gx(q)->trim_policy = CM_OVERFLOW_MIDDLE_OUT;
        gx(q)->summ_cached = 0;
    }
    free(content);
    free(keep);
    admit(g, q);
}

/* A cached answer, as the worker would have given it: the same response
 * object or stream of chunks, usage with every prompt token cached, and
 * headers that say it came from the cache. */
static void cache_answer(gw *g, gw_req *q, const gw_cache_hit *h) {
    const gw_centry *e = h->e;
    char sim[32];
    snprintf(sim, sizeof sim, "%.4f", (double)h->similarity);
    gw_http_header(q->conn, "x-llmserve-cache", h->exact ? "exact" : "semantic");
    gw_http_header(q->conn, "x-llmserve-cache-similarity", sim);
    gx(q)->cache_hit = 1;
    snprintf(q->id, sizeof q->id, "chatcmpl-%s%llxc", g->id, (unsigned long long)(++g->next_rid));
    cm_oai_result_init(&q->res, &q->c, q->id, q->lora ? q->c.model : g->served, (long)time(NULL), NULL, 0);
    q->res.prompt_tokens = q->res.cached_tokens = q->n_tok;
    const cm_tokenizer *tok = q->model ? q->model->tok : NULL;
    if (q->c.stream && !q->res.tools) {
        gw_http_stream_begin(q->conn);
        json_t *a = cm_oai_chunk_json(&q->res, 0, e->text, e->len, NULL, 0, CM_OAI_FINISH_NONE, tok);
        json_t *b = cm_oai_chunk_json(&q->res, 0, "", 0, NULL, 0, e->finish, tok);
        if (a) gw_http_stream_event(q->conn, a);
        if (b) gw_http_stream_event(q->conn, b);
        json_decref(a);
        json_decref(b);
    } else {
        if (q->c.stream) gw_http_stream_begin(q->conn);
        cm_oai_result_add(&q->res, 0, e->text, e->len, NULL, 0, tok);
    }
    q->res.ch[0].finish = e->finish;
    q->res.ch[0].completion_tokens = e->completion_tokens;
    g->cache.saved_prompt_tokens += (uint64_t)q->n_tok;
    g->cache.saved_completion_tokens += (uint64_t)e->completion_tokens;
    gw_req_finish(q, 200, NULL, NULL);
}

/* --semantic-cache: the question's vector arrived (vec NULL: it did not, in
 * time); a hit answers, else the request goes on to a worker group. */
static void cache_vector(gw *g, gw_req *q, const float *vec, int dim) {
    if (vec && dim == g->cache.dim && q->conn) {
        gw_cache_hit h;
        free(gx(q)->cache_vec);
        if ((gx(q)->cache_vec = malloc(sizeof(float) * (size_t)dim))) memcpy(gx(q)->cache_vec, vec, sizeof(float) * (size_t)dim);
        if (gw_cache_get_similar(&g->cache, gx(q)->cache_scope, vec, cm_now(), &h)) {
            cache_answer(g, q, &h);
            return;
        }
    } else if (q->conn) {
        g->cache.misses++; /* no vector in time: a miss, and stored without one */
    }
    admit(g, q);
}

/* A request ended with 200: its answer is stored when it may be reused. */
static void cache_store(gw *g, gw_req *q) {
    if (!gx(q)->cache_on || gx(q)->cache_hit || q->res.n != 1 || !g->conf.scache) return;
    const cm_oai_choice *ch = &q->res.ch[0];
    if (ch->finish != CM_OAI_FINISH_STOP && ch->finish != CM_OAI_FINISH_LENGTH) return;
    const char *text = q->c.stream && !q->res.tools ? gx(q)->ctext : ch->text;
    size_t len = q->c.stream && !q->res.tools ? gx(q)->clen : ch->len;
    if (!text) text = "", len = 0;
    gw_cache_put(&g->cache, gx(q)->cache_scope, gx(q)->cache_exact, gx(q)->cache_vec, text, len, ch->finish, ch->completion_tokens,
                 cm_now());
}

/* Back on the loop. */
static void prep_done(gw_job *j) {
    prep *p = (prep *)j;
    gw_model_unref(p->emodel);
    gw_req *q = gw_admit_prepared(&p->b);
    if (!q) return;
    gw *g = q->g;
    if (gx(q)->cache_on && g->conf.scache) {
        gw_cache_hit h;
        if (gw_cache_get_exact(&g->cache, gx(q)->cache_scope, gx(q)->cache_exact, cm_now(), &h)) {
            cache_answer(g, q, &h);
            return;
        }
        /* the embedding group answers with the question's vector, then cache_vector goes on */
        if (gx(q)->cache_etok && g->cache.dim && !gw_embed_probe(g, q, gx(q)->cache_etok, gx(q)->cache_en, cache_vector)) return;
        g->cache.misses++;
    }
    admit(g, q);
}

static void prep_gone(void *arg) {
    gw_req *q = arg;
    q->conn = NULL; /* prep_done ends it */
    q->g->m.cancelled++;
}

void gw_oai_generate(gw *g, gw_http_req *r, int chat) {
    int key;
    if (!gw_admit_authorized(g, r, &key) || !gw_admit_open(g, r)) return;
    if (!g->model && g->emodel) { /* no generative model here at all: not a transient state */
        char m[400];
        snprintf(m, sizeof m, "this server serves only the embedding model `%.128s` (/v1/embeddings); %s needs a "
                 "generative model", g->eserved, chat ? "/v1/chat/completions" : "/v1/completions");
        gw_http_error(r->conn, 400, m, "model", "invalid_value");
        return;
    }
    if (!g->model || !g->max_model_len) {
        g->m.overloaded++;
        gw_http_error(r->conn, 503, "no worker group is available", NULL, "no_workers");
        return;
    }
    prep *p = calloc(1, sizeof *p);
    gw_req *q = gw_admit_new(g, r, key, g->model, &p->b);
    if (!q) return;
    q->ops = &generate_ops;
    if (!(q->x = calloc(1, sizeof(gen)))) {
        free(p->b.body);
        free(p);
        gw_req_finish(q, 500, "out of memory", "internal_error");
        return;
    }
    p->b.job.run = prep_run;
    p->b.job.done = prep_done;
    p->chat = chat;
    snprintf(p->b.served, sizeof p->b.served, "%s", g->served);
    snprintf(p->b.eserved, sizeof p->b.eserved, "%s", g->eserved);
    snprintf(p->b.loras, sizeof p->b.loras, "%s", g->loras);
    p->b.max_len = g->max_model_len;
    p->overflow = cm_oai_overflow_parse(g->conf.context_overflow);
    p->reasoning = g->conf.reasoning_parser ? cm_reason_parser(g->conf.reasoning_parser) : CM_REASON_NONE;
    if ((p->cache = g->conf.scache)) {
        p->cache_sampled = g->conf.scache_sampled;
        snprintf(p->tenant, sizeof p->tenant, "%s", gw_auth_tag(&g->auth, key));
        if (g->emodel && g->emax_len && g->cache.dim == g->edim) {
            p->emodel = gw_model_ref(g->emodel);
            p->emax_len = g->emax_len;
        }
    }
    p->b.vocab = cm_tok_vocab(g->model->tok);
    gw_admit_submit(g, &p->b, prep_gone);
}
