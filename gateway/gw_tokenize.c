#include "gw_tokenize.h"
#include "cm_chat.h"
#include "cm_error.h"
#include "cm_oai.h"
#include "cm_oai_resp.h"
#include "cm_tools.h"
#include "gw_tokq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DETOKENIZE (1 << 20) /* token ids in one /detokenize */

typedef struct {
    gw_job job;
    gw *g;
    gw_conn *conn;     /* NULL once the client left */
    gw_model *m;       /* held */
    char *body;
    size_t len;
    int which, max_len, status;
    json_t *reply;
    const char *param;
    char err[512];
} tjob;

#define FAIL(st, prm, ...)                                                                         \
    do {                                                                                           \
        j->status = (st);                                                                          \
        j->param = (prm);                                                                          \
        snprintf(j->err, sizeof j->err, __VA_ARGS__);                                              \
        goto done;                                                                                 \
    } while (0)

static json_t *piece_json(const cm_tokenizer *t, int32_t id) {
    const char *p;
    size_t l = 0;
    if (cm_tok_piece(t, id, 1, &p, &l)) return json_null();
    return cm_oai_jbytes(p, l);
}

static void tokenize(tjob *j, json_t *o) {
    const cm_tokenizer *t = j->m->tok;
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;
    cm_oai_completion c = {0};
    json_t *v, *strs = NULL;
    int add = -1, want_strs = 0, rc;
    if ((v = json_object_get(o, "add_special_tokens")) && !json_is_null(v)) {
        if (!json_is_boolean(v)) FAIL(400, "add_special_tokens", "'add_special_tokens' must be true or false");
        add = json_is_true(v) ? -1 : 0; /* true: the BOS the metadata asks for */
    }
    if ((v = json_object_get(o, "return_token_strs")) && !json_is_null(v)) {
        if (!json_is_boolean(v)) FAIL(400, "return_token_strs", "'return_token_strs' must be true or false");
        want_strs = json_is_true(v);
    }
    static const char *const refused[] = {"chat_template", "mm_processor_kwargs", NULL};
    for (const char *const *r = refused; *r; r++)
        if ((v = json_object_get(o, *r)) && !json_is_null(v)) FAIL(400, *r, "'%s' is not supported", *r);
    json_t *prompt = json_object_get(o, "prompt"), *msgs = json_object_get(o, "messages");
    if (!!prompt == !!msgs) FAIL(400, prompt ? "messages" : "prompt", "give either 'prompt' or 'messages'");
    if (prompt) {
        if (!json_is_string(prompt)) FAIL(400, "prompt", "'prompt' must be a string");
        if ((v = json_object_get(o, "chat_template_kwargs")) && !json_is_null(v))
            FAIL(400, "chat_template_kwargs", "'chat_template_kwargs' goes with 'messages'");
        rc = cm_tok_encode(t, json_string_value(prompt), json_string_length(prompt), add, 1, &ids, &n);
    } else {
        const char *param = NULL;
        char perr[400];
        if ((rc = cm_oai_parse_chat(j->body, j->len, &c, perr, sizeof perr, &param))) FAIL(400, param, "%s", perr);
        cm_tools_prompt tp;
        if (cm_tools_render(&c, cm_tools_format(j->m->chat_kind), j->m->default_system, &tp)) FAIL(500, NULL, "out of memory");
        rc = c.continue_final_message ? cm_chat_render_open(j->m->chat_kind, j->m->default_system, tp.msgs, tp.n, &text)
                                      : cm_chat_render(j->m->chat_kind, j->m->default_system, tp.msgs, tp.n,
                                                       c.add_generation_prompt, &text);
        if (!rc && !c.enable_thinking && c.add_generation_prompt) rc = cm_chat_no_thinking(j->m->chat_kind, &text);
        cm_tools_free(&tp);
        if (rc || !text) FAIL(400, "messages", "cannot render the messages with the %s chat template", cm_chat_name(j->m->chat_kind));
        rc = cm_tok_encode(t, text, strlen(text), add, 1, &ids, &n);
    }
    if (rc) FAIL(400, prompt ? "prompt" : "messages", "the text cannot be tokenized: %s", cm_strerror(rc));
    json_t *toks = json_array();
    if (want_strs) strs = json_array();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(toks, json_integer(ids[i]));
        if (strs) json_array_append_new(strs, piece_json(t, ids[i]));
    }
    j->reply = json_pack("{s:I,s:i,s:o,s:o}", "count", (json_int_t)n, "max_model_len", j->max_len, "tokens", toks,
                         "token_strs", strs ? strs : json_null());
done:
    cm_oai_completion_free(&c);
    free(text);
    free(ids);
}

static void detokenize(tjob *j, json_t *o) {
    const cm_tokenizer *t = j->m->tok;
    json_t *toks = json_object_get(o, "tokens");
    int32_t *ids = NULL;
    if (!json_is_array(toks)) FAIL(400, "tokens", "'tokens' must be an array of token ids");
    size_t n = json_array_size(toks);
    if (n > MAX_DETOKENIZE) FAIL(400, "tokens", "at most %d token ids", MAX_DETOKENIZE);
    ids = malloc(sizeof *ids * (n ? n : 1));
    if (!ids) FAIL(500, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(toks, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= cm_tok_vocab(t))
            FAIL(400, "tokens", "tokens[%zu] is not a token id of this vocabulary (0..%d)", i, cm_tok_vocab(t) - 1);
        ids[i] = (int32_t)json_integer_value(e);
    }
    char *s = cm_tok_decode(t, ids, n, 0);
    if (!s) FAIL(500, NULL, "out of memory");
    j->reply = json_pack("{s:o}", "prompt", cm_oai_jbytes(s, strlen(s)));
    free(s);
done:
    free(ids);
}

static void info(tjob *j) {
    const cm_tokenizer *t = j->m->tok;
    const char *tmpl = cm_tok_chat_template(t);
    int32_t bos = cm_tok_bos(t), eos = cm_tok_eos(t), unk = cm_tok_unk(t);
    j->reply = json_pack("{s:s,s:i,s:i,s:o,s:o,s:o,s:n,s:o,s:s,s:s}", "tokenizer_class", "llmserve",
                         "model_max_length", j->max_len, "vocab_size", cm_tok_vocab(t),
                         "bos_token", bos >= 0 ? piece_json(t, bos) : json_null(),
                         "eos_token", eos >= 0 ? piece_json(t, eos) : json_null(),
                         "unk_token", unk >= 0 ? piece_json(t, unk) : json_null(), "pad_token",
                         "chat_template", tmpl ? json_string(tmpl) : json_null(),
                         "chat_template_family", cm_chat_name(j->m->chat_kind),
                         "kind", cm_tok_kind(t) == CM_TOK_SPM ? "sentencepiece" : "byte-level-bpe");
}

static void run(gw_job *jb) {
    tjob *j = (tjob *)jb;
    if (j->which == GW_TOK_INFO) {
        info(j);
        return;
    }
    json_error_t je;
    json_t *o = json_loadb(j->body, j->len, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        j->status = 400;
        snprintf(j->err, sizeof j->err, o ? "the body must be a JSON object" : "the body is not valid JSON: %s", je.text);
    } else {
        json_t *mv = json_object_get(o, "model");
        if (mv && !json_is_null(mv) && !json_is_string(mv)) {
            j->status = 400, j->param = "model";
            snprintf(j->err, sizeof j->err, "'model' must be a string");
        } else if (j->which == GW_TOK_TOKENIZE) {
            tokenize(j, o);
        } else {
            detokenize(j, o);
        }
    }
    json_decref(o);
}

static void finish(gw_job *jb) {
    tjob *j = (tjob *)jb;
    if (j->conn) {
        if (j->status) gw_http_error(j->conn, j->status, j->err, j->param, j->status >= 500 ? "internal_error" : "invalid_value");
        else if (j->reply) gw_http_json(j->conn, 200, j->reply);
        else gw_http_error(j->conn, 500, "out of memory", NULL, "internal_error");
    }
    json_decref(j->reply);
    gw_model_unref(j->m);
    free(j->body);
    free(j);
}

static void gone(void *arg) { ((tjob *)arg)->conn = NULL; }

void gw_tokenize_handle(gw *g, gw_http_req *r, int which) {
    if (!g->model) {
        gw_http_error(r->conn, 503, "no worker group is available (the tokenizer comes from one)", NULL, "no_workers");
        return;
    }
    tjob *j = calloc(1, sizeof *j);
    char *body = which == GW_TOK_INFO ? NULL : malloc(r->body_len + 1);
    if (!j || (which != GW_TOK_INFO && !body)) {
        free(j);
        free(body);
        gw_http_error(r->conn, 500, "out of memory", NULL, "internal_error");
        return;
    }
    if (body) {
        memcpy(body, r->body, r->body_len);
        body[r->body_len] = 0;
    }
    *j = (tjob){{NULL, run, finish}, g, r->conn, gw_model_ref(g->model), body, r->body_len, which, g->max_model_len, 0, NULL,
                NULL, ""};
    if (gw_tokq_submit(g->tokq, &j->job)) {
        gw_model_unref(j->m);
        free(body);
        free(j);
        gw_http_header(r->conn, "Retry-After", "1");
        gw_http_error(r->conn, 503, "the gateway is at capacity: too many requests waiting to be tokenized", NULL, "overloaded");
        return;
    }
    gw_http_on_gone(r->conn, gone, j);
}
