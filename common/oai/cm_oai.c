#include "cm_oai.h"
#include "cm_error.h"
#include "cm_log.h"
#include "cm_grammar.h"
#include "cm_jsonschema.h"
#include "cm_tools.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* err already holds the message */
#define FAILED(name)                                                                               \
    do {                                                                                           \
        *param = name;                                                                             \
        goto fail;                                                                                 \
    } while (0)

#define BAD(name, ...)                                                                             \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        *param = name;                                                                             \
        rc = LLM_EINVAL;                                                                           \
        goto fail;                                                                                 \
    } while (0)

/* A number field in [lo, hi]; absent or null keeps *out. */
static int get_num(json_t *o, const char *name, double lo, double hi, double *out, char *err, size_t errlen) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) {
        snprintf(err, errlen, "'%s' must be a number", name);
        return LLM_EINVAL;
    }
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) {
        snprintf(err, errlen, "'%s' must be between %g and %g, got %g", name, lo, hi, d);
        return LLM_EINVAL;
    }
    *out = d;
    return 0;
}

static int get_int(json_t *o, const char *name, long long lo, long long hi, long long *out, char *err, size_t errlen) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) {
        snprintf(err, errlen, "'%s' must be an integer", name);
        return LLM_EINVAL;
    }
    long long d = json_integer_value(v);
    if (d < lo || d > hi) {
        snprintf(err, errlen, "'%s' must be between %lld and %lld, got %lld", name, lo, hi, d);
        return LLM_EINVAL;
    }
    *out = d;
    return 0;
}

static int get_bool(json_t *o, const char *name, int *out, char *err, size_t errlen) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        snprintf(err, errlen, "'%s' must be true or false", name);
        return LLM_EINVAL;
    }
    *out = json_is_true(v);
    return 0;
}

static int get_str(json_t *o, const char *name, size_t max, char **out, char *err, size_t errlen) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v) || json_string_length(v) > max) {
        snprintf(err, errlen, "'%s' must be a string of at most %zu bytes", name, max);
        return LLM_EINVAL;
    }
    *out = strndup(json_string_value(v), json_string_length(v));
    return *out ? 0 : LLM_ENOMEM;
}

static void defaults(cm_oai_completion *c) {
    memset(c, 0, sizeof *c);
    c->temperature = 1;
    c->top_p = 1;
    c->top_k = -1;
    c->repetition_penalty = 1;
    c->n = 1;
    c->logprobs = -1;
    c->prompt_logprobs = -1;
    c->add_generation_prompt = 1;
    c->enable_thinking = 1;
    c->context_overflow = -1;
}

int cm_oai_overflow_parse(const char *s) {
    static const char *const names[] = {"error", "truncate-left", "middle-out", "summarize"};
    for (int i = 0; s && i < 4; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

const char *cm_oai_overflow_name(int p) {
    return p == CM_OVERFLOW_TRUNCATE_LEFT ? "truncate-left"
           : p == CM_OVERFLOW_MIDDLE_OUT  ? "middle-out"
           : p == CM_OVERFLOW_SUMMARIZE   ? "summarize"
                                          : "error";
}

int cm_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        size_t l = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!l || i + l > n) return 0;
        uint32_t cp = l == 1 ? c : l == 2 ? c & 0x1f : l == 3 ? c & 0x0f : c & 0x07;
        for (size_t k = 1; k < l; k++) {
            if ((u[i + k] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (u[i + k] & 0x3f);
        }
        if ((l == 2 && cp < 0x80) || (l == 3 && cp < 0x800) || (l == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += l;
    }
    return 1;
}

/* A JSON Schema given as an object or as JSON text (vLLM takes both). */
static int schema_grammar(const json_t *v, const char *name, char **out, char *err, size_t errlen) {
    json_t *own = NULL;
    if (json_is_string(v)) {
        json_error_t je;
        if (!(own = json_loads(json_string_value(v), JSON_DECODE_ANY, &je))) {
            snprintf(err, errlen, "'%s' is not valid JSON: %s", name, je.text);
            return LLM_EINVAL;
        }
        v = own;
    }
    char e2[400];
    int rc = cm_schema_gbnf(v, out, e2, sizeof e2);
    json_decref(own);
    if (rc) snprintf(err, errlen, "'%s': %s", name, e2);
    return rc;
}

/* Structured outputs: at most one constraint, compiled to GBNF and checked
 * here, so a bad schema or grammar is a 400 before any worker sees it. */
static int parse_structured(json_t *o, cm_oai_completion *c, char *err, size_t errlen, const char **param) {
    int rc = 0, given = 0;
    const char *from = NULL;
    char *gb = NULL, e3[300];
    json_t *x;
#define ONE(name)                                                                                  \
    do {                                                                                           \
        if (given++) BAD(name, "'%s': only one structured-output constraint may be given (also '%s')", name, from); \
        from = name;                                                                               \
    } while (0)
    if ((x = json_object_get(o, "response_format")) && !json_is_null(x)) {
        json_t *ty = json_is_object(x) ? json_object_get(x, "type") : NULL;
        const char *t = json_is_string(ty) ? json_string_value(ty) : "";
        if (!strcmp(t, "json_object")) {
            ONE("response_format");
            if ((rc = cm_json_object_gbnf(&gb))) goto fail;
        } else if (!strcmp(t, "json_schema")) {
            ONE("response_format");
            json_t *js = json_object_get(x, "json_schema"), *sc = json_is_object(js) ? json_object_get(js, "schema") : NULL;
            if (!sc) BAD("response_format", "'response_format.json_schema.schema' is required");
            if ((rc = schema_grammar(sc, "response_format.json_schema.schema", &gb, err, errlen))) FAILED("response_format");
        } else if (strcmp(t, "text")) {
            BAD("response_format", "'response_format.type' must be text, json_object or json_schema");
        }
    }
    json_t *so = json_object_get(o, "structured_outputs");
    if (so && !json_is_null(so) && !json_is_object(so)) BAD("structured_outputs", "'structured_outputs' must be an object");
    struct { const char *name; json_t *v; char kind; } forms[] = {
        {"guided_json", json_object_get(o, "guided_json"), 'j'},
        {"guided_regex", json_object_get(o, "guided_regex"), 'r'},
        {"guided_choice", json_object_get(o, "guided_choice"), 'c'},
        {"guided_grammar", json_object_get(o, "guided_grammar"), 'g'},
        {"structured_outputs.json", so ? json_object_get(so, "json") : NULL, 'j'},
        {"structured_outputs.regex", so ? json_object_get(so, "regex") : NULL, 'r'},
        {"structured_outputs.choice", so ? json_object_get(so, "choice") : NULL, 'c'},
        {"structured_outputs.grammar", so ? json_object_get(so, "grammar") : NULL, 'g'},
        {"structured_outputs.json_object", so ? json_object_get(so, "json_object") : NULL, 'o'},
    };
    if (so) {
        const char *k;
        json_t *v;
        json_object_foreach(so, k, v) {
            static const char *const known[] = {"json", "regex", "choice", "grammar", "json_object", NULL};
            int ok = 0;
            for (const char *const *q = known; *q && !ok; q++) ok = !strcmp(*q, k);
            if (!ok && !json_is_null(v)) BAD("structured_outputs", "'structured_outputs.%.40s' is not supported", k);
        }
    }
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        json_t *v = forms[i].v;
        const char *name = forms[i].name, *pname = strchr(name, '.') ? "structured_outputs" : name;
        if (!v || json_is_null(v) || (forms[i].kind == 'o' && json_is_false(v))) continue;
        if (given++) BAD(pname, "'%s': only one structured-output constraint may be given (also '%s')", name, from);
        from = name;
        switch (forms[i].kind) {
        case 'j':
            if ((rc = schema_grammar(v, name, &gb, err, errlen))) FAILED(pname);
            break;
        case 'o':
            if (!json_is_true(v)) BAD(pname, "'%s' must be true or false", name);
            if ((rc = cm_json_object_gbnf(&gb))) goto fail;
            break;
        case 'r':
            if (!json_is_string(v)) BAD(pname, "'%s' must be a string", name);
            if ((rc = cm_regex_gbnf(json_string_value(v), json_string_length(v), &gb, e3, sizeof e3))) {
                snprintf(err, errlen, "'%s': %s", name, e3);
                FAILED(pname);
            }
            break;
        case 'g':
            if (!json_is_string(v)) BAD(pname, "'%s' must be a string of GBNF", name);
            gb = strndup(json_string_value(v), json_string_length(v));
            if (!gb) { rc = LLM_ENOMEM; goto fail; }
            break;
        case 'c': {
            size_t n = json_is_array(v) ? json_array_size(v) : 0;
            if (!n || n > 4096) BAD(pname, "'%s' must be an array of 1 to 4096 strings", name);
            const char **ch = malloc(sizeof *ch * n);
            if (!ch) { rc = LLM_ENOMEM; goto fail; }
            for (size_t k = 0; k < n; k++) {
                json_t *e = json_array_get(v, k);
                ch[k] = json_is_string(e) && json_string_length(e) && strlen(json_string_value(e)) == json_string_length(e)
                            ? json_string_value(e) : NULL;
                if (!ch[k]) {
                    free(ch);
                    BAD(pname, "'%s' must hold non-empty strings", name);
                }
            }
            rc = cm_choice_gbnf(ch, (int)n, &gb, err, errlen);
            free(ch);
            if (rc) FAILED(pname);
            break;
        }
        }
    }
#undef ONE
    if (gb) { /* every form is checked the same way: the worker will compile exactly this */
        cm_grammar *g;
        char e2[300];
        if (cm_grammar_parse(gb, strlen(gb), &g, e2, sizeof e2)) {
            const char *pname = strchr(from, '.') ? "structured_outputs" : from;
            free(gb);
            gb = NULL;
            BAD(pname, "'%s': %s", from, e2);
        }
        cm_grammar_free(g);
        c->grammar = gb;
        c->grammar_from = from;
    }
    return 0;
fail:
    free(gb);
    if (rc == LLM_ENOMEM) snprintf(err, errlen, "out of memory");
    return rc ? rc : LLM_EINVAL;
}

/* The fields completions and chat share. */
static int parse_sampling(json_t *o, cm_oai_completion *c, char *err, size_t errlen, const char **param) {
    int rc = 0;
    long long v;
    double d;
#define NUM(name, lo, hi, field)                                                                   \
    d = c->field;                                                                                  \
    if ((rc = get_num(o, name, lo, hi, &d, err, errlen))) FAILED(name);                            \
    c->field = d;
#define INT(name, lo, hi, field)                                                                   \
    v = c->field;                                                                                  \
    if ((rc = get_int(o, name, lo, hi, &v, err, errlen))) FAILED(name);                            \
    c->field = (int)v;
#define BOOL(name, field)                                                                          \
    if ((rc = get_bool(o, name, &c->field, err, errlen))) FAILED(name);
    NUM("temperature", 0, 2, temperature) /* OpenAI's range */
    NUM("top_p", 1e-9, 1, top_p)
    NUM("min_p", 0, 1, min_p)
    NUM("presence_penalty", -2, 2, presence_penalty)
    NUM("frequency_penalty", -2, 2, frequency_penalty)
    NUM("repetition_penalty", 1e-6, 100, repetition_penalty)
    INT("max_tokens", 0, INT32_MAX / 2, max_tokens) /* 0: scoring (completions with echo), checked by the caller */
    INT("prompt_logprobs", -1, CM_OAI_MAX_LOGPROBS, prompt_logprobs)
    INT("min_tokens", 0, INT32_MAX / 2, min_tokens)
    INT("top_k", -1, INT32_MAX, top_k)
    INT("n", 1, CM_OAI_MAX_N, n)
    INT("priority", -1000000, 1000000, priority)
    BOOL("stream", stream)
    BOOL("ignore_eos", ignore_eos)
#undef NUM
#undef INT
#undef BOOL
    if (c->top_k == 0) c->top_k = -1;
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) BAD("stream_options", "'stream_options' must be an object");
        if ((rc = get_bool(so, "include_usage", &c->include_usage, err, errlen))) FAILED("stream_options");
        if (!c->stream) BAD("stream_options", "'stream_options' is only allowed with 'stream': true");
    }
    if ((rc = parse_structured(o, c, err, errlen, param))) goto fail;
    /* fields we do not honour yet are refused by name, never ignored */
    static const char *const unsupported[] = {"functions", "function_call", "guided_whitespace_pattern", NULL};
    for (const char *const *u = unsupported; *u; u++) {
        json_t *x = json_object_get(o, *u);
        if (x && !json_is_null(x)) BAD(*u, "'%s' is not supported", *u);
    }
    json_t *bo = json_object_get(o, "best_of");
    if (bo && !json_is_null(bo) && !(json_is_integer(bo) && json_integer_value(bo) == c->n))
        BAD("best_of", "'best_of' other than n is not supported");
    json_t *sd = json_object_get(o, "seed");
    if (sd && !json_is_null(sd)) {
        if (!json_is_integer(sd)) BAD("seed", "'seed' must be an integer");
        c->has_seed = 1;
        c->seed = (uint64_t)json_integer_value(sd);
    }
    json_t *st = json_object_get(o, "stop");
    if (st && !json_is_null(st)) {
        size_t n = json_is_string(st) ? 1 : json_is_array(st) ? json_array_size(st) : (size_t)-1;
        if (n == (size_t)-1) BAD("stop", "'stop' must be a string or an array of strings");
        if (n > CM_OAI_MAX_STOP) BAD("stop", "at most %d stop strings", CM_OAI_MAX_STOP);
        for (size_t i = 0; i < n; i++) {
            json_t *s = json_is_string(st) ? st : json_array_get(st, i);
            if (!json_is_string(s) || json_string_length(s) == 0 || json_string_length(s) > CM_OAI_MAX_STOP_LEN)
                BAD("stop", "stop strings must be strings of 1 to %d bytes", CM_OAI_MAX_STOP_LEN);
            if (strlen(json_string_value(s)) != json_string_length(s)) BAD("stop", "stop strings must not contain NUL");
            c->stop[c->n_stop++] = strdup(json_string_value(s));
            if (!c->stop[c->n_stop - 1]) { rc = LLM_ENOMEM; goto fail; }
        }
    }
    json_t *si = json_object_get(o, "stop_token_ids");
    if (si && !json_is_null(si)) {
        if (!json_is_array(si) || json_array_size(si) > CM_OAI_MAX_STOP_IDS)
            BAD("stop_token_ids", "'stop_token_ids' must be an array of at most %d token ids", CM_OAI_MAX_STOP_IDS);
        for (size_t i = 0; i < json_array_size(si); i++) {
            json_t *t = json_array_get(si, i);
            if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
                BAD("stop_token_ids", "'stop_token_ids' must hold non-negative integers");
            c->stop_ids[c->n_stop_ids++] = (int32_t)json_integer_value(t);
        }
    }
    json_t *lb = json_object_get(o, "logit_bias");
    if (lb && !json_is_null(lb)) {
        if (!json_is_object(lb) || json_object_size(lb) > CM_OAI_MAX_BIAS)
            BAD("logit_bias", "'logit_bias' must be an object of at most %d entries", CM_OAI_MAX_BIAS);
        c->bias = malloc(sizeof *c->bias * (json_object_size(lb) + 1));
        if (!c->bias) { rc = LLM_ENOMEM; goto fail; }
        const char *k;
        json_t *bv;
        json_object_foreach(lb, k, bv) {
            char *end;
            long id = strtol(k, &end, 10);
            if (!*k || *end || id < 0 || id > INT32_MAX) BAD("logit_bias", "logit_bias key '%.32s' is not a token id", k);
            if (!json_is_number(bv) || !(fabs(json_number_value(bv)) <= 100))
                BAD("logit_bias", "logit_bias values must be numbers in [-100, 100]");
            c->bias[c->n_bias++] = (cm_oai_bias){(int32_t)id, (float)json_number_value(bv)};
        }
    }
    if ((rc = get_str(o, "model", 256, &c->model, err, errlen))) FAILED("model");
    if ((rc = get_str(o, "cache_salt", 256, &c->cache_salt, err, errlen))) FAILED("cache_salt");
    if ((rc = get_str(o, "user", 256, &c->user, err, errlen))) FAILED("user");
    if (c->max_tokens && c->min_tokens > c->max_tokens) BAD("min_tokens", "'min_tokens' must not exceed max_tokens");
    return 0;
fail:
    if (rc == LLM_ENOMEM) snprintf(err, errlen, "out of memory");
    return rc ? rc : LLM_EINVAL;
}

/* Every field OpenAI or vLLM defines is honoured (parsed above), harmless
 * at the value given, or refused by name; a field neither defines is
 * ignored, as vLLM does, with a debug line. */
static const char *const HONOURED[] = {
    "model", "temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "max_tokens",
    "min_tokens", "top_k", "n", "priority", "stream", "ignore_eos", "stream_options", "response_format",
    "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "best_of", "seed", "stop",
    "stop_token_ids", "logit_bias", "cache_salt", "user", "prompt_logprobs", "logprobs", "functions", "function_call",
    "guided_whitespace_pattern", NULL};
static const char *const COMPLETION_ONLY[] = {"prompt", "echo", "suffix", NULL};
static const char *const CHAT_ONLY[] = {"messages", "max_completion_tokens", "top_logprobs", "add_generation_prompt",
                                        "continue_final_message", "chat_template_kwargs", "tools",
                                        "tool_choice", "parallel_tool_calls", "context_overflow", NULL};
/* accepted only at this value (JSON), or, for NULL, at any value (identifiers, hints) */
static const struct { const char *name, *ok; } SETTLED[] = {
    {"metadata", NULL}, {"safety_identifier", NULL}, {"prompt_cache_key", NULL}, {"request_id", NULL},
    {"guided_decoding_backend", NULL}, {"service_tier", NULL}, {"store", "false"},
    {"skip_special_tokens", "true"}, {"spaces_between_special_tokens", "true"}, {"include_stop_str_in_output", "false"},
    {"use_beam_search", "false"}, {"length_penalty", "1"},
    {"return_tokens_as_token_ids", "false"}, {"add_special_tokens", "false"}, {"modalities", "[\"text\"]"},
    {"logits_processors", "[]"}, {"bad_words", "[]"}, {"allowed_token_ids", "null"}, {"truncate_prompt_tokens", "null"},
    {"audio", "null"}, {"prediction", "null"}, {"reasoning_effort", "null"}, {"verbosity", "null"},
    {"web_search_options", "null"}, {"documents", "null"}, {"chat_template", "null"},
    {"mm_processor_kwargs", "null"}, {"structural_tag", "null"}, {"kv_transfer_params", "null"}, {"vllm_xargs", "null"},
    {"thinking_token_budget", "null"}, {"echo", "false"}};

/* The list's own copy of k (static, so an error can name it after the body is freed), or NULL. */
static const char *in_names(const char *k, const char *const *l) {
    for (; *l; l++)
        if (!strcmp(k, *l)) return *l;
    return NULL;
}

static int check_fields(json_t *o, int chat, char *err, size_t errlen, const char **param) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (in_names(k, HONOURED) || in_names(k, chat ? CHAT_ONLY : COMPLETION_ONLY)) continue;
        int known = 0;
        for (size_t i = 0; i < sizeof SETTLED / sizeof SETTLED[0] && !known; i++) {
            if (strcmp(k, SETTLED[i].name)) continue;
            known = 1;
            if (!SETTLED[i].ok || json_is_null(v)) break;
            json_t *want = json_loads(SETTLED[i].ok, JSON_DECODE_ANY, NULL);
            int same = want && (json_equal(v, want) || (json_is_number(v) && json_is_number(want) &&
                                                        json_number_value(v) == json_number_value(want)));
            json_decref(want);
            if (!same) {
                *param = SETTLED[i].name;
                snprintf(err, errlen, "'%s' is not supported%s%s", SETTLED[i].name,
                         strcmp(SETTLED[i].ok, "null") ? " other than " : "", strcmp(SETTLED[i].ok, "null") ? SETTLED[i].ok : "");
                return LLM_EINVAL;
            }
        }
        const char *other = known ? NULL : in_names(k, chat ? COMPLETION_ONLY : CHAT_ONLY);
        if (!known && !other) CM_LOG(CM_LOG_DEBUG, "ignoring the unknown field '%.64s'", k);
        else if (!known) { /* the other endpoint's field */
            *param = other;
            snprintf(err, errlen, "'%.64s' is a %s field", k, chat ? "completions" : "chat completions");
            return LLM_EINVAL;
        }
    }
    return 0;
}

static json_t *load_object(const char *body, size_t len, char *err, size_t errlen) {
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je); /* \u0000 is valid JSON */
    if (!o) {
        snprintf(err, errlen, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(o)) {
        snprintf(err, errlen, "the body must be a JSON object");
        json_decref(o);
        return NULL;
    }
    return o;
}

int cm_oai_parse_completion(const char *body, size_t len, cm_oai_completion *c, char *err, size_t errlen,
                            const char **param) {
    defaults(c);
    *param = NULL;
    int rc = 0;
    json_t *o = load_object(body, len, err, errlen);
    if (!o) return LLM_EINVAL;
    json_t *p = json_object_get(o, "prompt");
    if (!p) BAD("prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0); /* a batch of one (text, or token ids) */
    if (json_is_string(p)) {
        c->prompt_len = json_string_length(p);
        c->prompt = malloc(c->prompt_len + 1);
        if (!c->prompt) { rc = LLM_ENOMEM; goto fail; }
        memcpy(c->prompt, json_string_value(p), c->prompt_len + 1);
    } else if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0))) {
        size_t n = json_array_size(p);
        if (n > CM_OAI_MAX_PROMPT_IDS) BAD("prompt", "the prompt has more than %d token ids", CM_OAI_MAX_PROMPT_IDS);
        c->prompt_ids = malloc(sizeof(int32_t) * n);
        if (!c->prompt_ids) { rc = LLM_ENOMEM; goto fail; }
        for (size_t i = 0; i < n; i++) {
            json_t *t = json_array_get(p, i);
            if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
                BAD("prompt", "prompt token %zu is not a non-negative integer", i);
            c->prompt_ids[i] = (int32_t)json_integer_value(t);
        }
        c->n_prompt_ids = (int)n;
    } else if (json_is_array(p) && json_array_size(p) > 1) { /* a batch: all strings, or all token-id lists */
        size_t n = json_array_size(p);
        if (n > CM_OAI_MAX_CHOICES) BAD("prompt", "at most %d prompts in one request", CM_OAI_MAX_CHOICES);
        int text = json_is_string(json_array_get(p, 0));
        c->batch = calloc(n, sizeof *c->batch);
        if (!c->batch) { rc = LLM_ENOMEM; goto fail; }
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(p, i);
            cm_oai_prompt *b = &c->batch[i];
            c->n_batch = (int)i + 1; /* counted before its allocations: a refusal mid-entry frees them too */
            if (text) {
                if (!json_is_string(e)) BAD("prompt", "prompt[%zu]: a batch is all strings or all token-id arrays", i);
                b->len = json_string_length(e);
                if (!(b->text = malloc(b->len + 1))) { rc = LLM_ENOMEM; goto fail; }
                memcpy(b->text, json_string_value(e), b->len + 1);
                continue;
            }
            size_t m = json_is_array(e) ? json_array_size(e) : 0;
            if (!m) BAD("prompt", "prompt[%zu]: a batch is all strings or all non-empty token-id arrays", i);
            if (m > CM_OAI_MAX_PROMPT_IDS) BAD("prompt", "prompt[%zu] has more than %d token ids", i, CM_OAI_MAX_PROMPT_IDS);
            if (!(b->ids = malloc(sizeof(int32_t) * m))) { rc = LLM_ENOMEM; goto fail; }
            for (size_t k = 0; k < m; k++) {
                json_t *t = json_array_get(e, k);
                if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
                    BAD("prompt", "prompt[%zu][%zu] is not a non-negative integer", i, k);
                b->ids[k] = (int32_t)json_integer_value(t);
            }
            b->n_ids = (int)m;
        }
    } else if (json_is_array(p)) {
        BAD("prompt", "'prompt' must not be empty");
    } else {
        BAD("prompt", "'prompt' must be a string or an array of token ids");
    }
    if ((rc = parse_sampling(o, c, err, errlen, param))) goto fail;
    if (c->n_batch && c->n_batch * c->n > CM_OAI_MAX_CHOICES)
        BAD("n", "%d prompts x n %d is more than %d choices", c->n_batch, c->n, CM_OAI_MAX_CHOICES);
    long long v = -1;
    if ((rc = get_int(o, "logprobs", 0, CM_OAI_MAX_LOGPROBS, &v, err, errlen))) FAILED("logprobs");
    c->logprobs = (int)v;
    if ((rc = get_bool(o, "echo", &c->echo, err, errlen))) FAILED("echo");
    json_t *sf = json_object_get(o, "suffix");
    if (sf && !json_is_null(sf)) BAD("suffix", "'suffix' is not supported");
    if ((rc = check_fields(o, 0, err, errlen, param))) goto fail;
    json_t *mt = json_object_get(o, "max_tokens");
    if (json_is_integer(mt) && json_integer_value(mt) == 0) { /* scoring: the prompt's logprobs, nothing generated */
        if (!c->echo) BAD("max_tokens", "'max_tokens' 0 is only allowed with 'echo': true (to score the prompt)");
        c->score_only = 1;
        c->max_tokens = 1;
    }
    if (c->stream && ((c->echo && c->logprobs >= 0) || c->prompt_logprobs >= 0))
        BAD(c->prompt_logprobs >= 0 ? "prompt_logprobs" : "echo",
            "the prompt's logprobs ('echo' with 'logprobs', or 'prompt_logprobs') are not streamed: use 'stream': false");
    json_decref(o);
    return 0;
fail:
    if (rc == LLM_ENOMEM) snprintf(err, errlen, "out of memory");
    json_decref(o);
    cm_oai_completion_free(c);
    return rc ? rc : LLM_EINVAL;
}

static int valid_name(const char *n) {
    size_t l = strlen(n);
    if (!l || l > 64) return 0;
    for (const char *q = n; *q; q++)
        if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || *q == '_' || *q == '-' || *q == '.'))
            return 0;
    return 1;
}

int cm_oai_tools_grammar(cm_oai_completion *c, int format, char *err, size_t errlen) {
    if (c->tool_choice != CM_TOOL_REQUIRED && c->tool_choice != CM_TOOL_NAMED) return 0;
    char *gb = NULL, e2[400];
    int rc = cm_tools_gbnf(c, format, &gb, e2, sizeof e2);
    if (rc) {
        snprintf(err, errlen, "%s", e2);
        return rc;
    }
    cm_grammar *g;
    if (cm_grammar_parse(gb, strlen(gb), &g, e2, sizeof e2)) {
        free(gb);
        snprintf(err, errlen, "the tools' grammar does not read: %s", e2);
        return LLM_EINVAL;
    }
    cm_grammar_free(g);
    free(c->grammar);
    c->grammar = gb;
    c->grammar_from = "tool_choice";
    c->tool_format = format;
    return 0;
}

/* tools, tool_choice, parallel_tool_calls; "required" and a named choice
 * become the request's grammar (cm_tools.h). */
static int parse_tools(json_t *o, cm_oai_completion *c, char *err, size_t errlen, const char **param) {
    int rc = 0;
    json_t *tools = json_object_get(o, "tools"), *tc = json_object_get(o, "tool_choice");
    static const char *const legacy[] = {"functions", "function_call", NULL};
    for (const char *const *l = legacy; *l; l++) {
        json_t *x = json_object_get(o, *l);
        if (x && !json_is_null(x)) BAD(*l, "'%s' is not supported: use 'tools' and 'tool_choice'", *l);
    }
    c->parallel_tool_calls = 1;
    if ((rc = get_bool(o, "parallel_tool_calls", &c->parallel_tool_calls, err, errlen))) FAILED("parallel_tool_calls");
    size_t n = tools && !json_is_null(tools) ? (json_is_array(tools) ? json_array_size(tools) : (size_t)-1) : 0;
    if (n == (size_t)-1 || n > CM_OAI_MAX_TOOLS) BAD("tools", "'tools' must be an array of at most %d tools", CM_OAI_MAX_TOOLS);
    if (n && !(c->tools = calloc(n, sizeof *c->tools))) { rc = LLM_ENOMEM; goto fail; }
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(tools, i), *ty = json_object_get(t, "type"), *f = json_object_get(t, "function");
        if (!json_is_string(ty) || strcmp(json_string_value(ty), "function") || !json_is_object(f))
            BAD("tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", i);
        json_t *fn = json_object_get(f, "name"), *fd = json_object_get(f, "description"), *fp = json_object_get(f, "parameters");
        if (!json_is_string(fn) || !valid_name(json_string_value(fn)))
            BAD("tools", "tools[%zu].function.name must be 1 to 64 of a-z A-Z 0-9 _ - .", i);
        for (size_t k = 0; k < i; k++)
            if (!strcmp(c->tools[k].name, json_string_value(fn))) BAD("tools", "two tools are named '%s'", json_string_value(fn));
        if (fd && !json_is_null(fd) && !json_is_string(fd)) BAD("tools", "tools[%zu].function.description must be a string", i);
        if (fp && !json_is_null(fp) && !json_is_object(fp)) BAD("tools", "tools[%zu].function.parameters must be a schema object", i);
        cm_oai_tool *d = &c->tools[c->n_tools++];
        d->name = strdup(json_string_value(fn));
        d->description = json_is_string(fd) ? strdup(json_string_value(fd)) : NULL;
        d->parameters = json_is_object(fp) ? json_dumps(fp, JSON_COMPACT) : NULL;
        if (!d->name || (json_is_string(fd) && !d->description) || (json_is_object(fp) && !d->parameters)) { rc = LLM_ENOMEM; goto fail; }
    }
    c->tool_choice = n ? CM_TOOL_AUTO : CM_TOOL_NONE;
    if (tc && !json_is_null(tc)) {
        const char *s = json_is_string(tc) ? json_string_value(tc) : NULL;
        json_t *nm = json_is_object(tc) ? json_object_get(json_object_get(tc, "function"), "name") : NULL;
        if (s && !strcmp(s, "none")) c->tool_choice = CM_TOOL_NONE;
        else if (s && !strcmp(s, "auto")) c->tool_choice = CM_TOOL_AUTO;
        else if (s && !strcmp(s, "required")) c->tool_choice = CM_TOOL_REQUIRED;
        else if (json_is_string(nm)) {
            c->tool_choice = CM_TOOL_NAMED;
            c->tool_named = -1;
            for (int k = 0; k < c->n_tools; k++)
                if (!strcmp(c->tools[k].name, json_string_value(nm))) c->tool_named = k;
            if (c->tool_named < 0) BAD("tool_choice", "'tool_choice' names '%.64s', which is not in 'tools'", json_string_value(nm));
        } else {
            BAD("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        }
        if (!n && c->tool_choice != CM_TOOL_NONE) BAD("tool_choice", "'tool_choice' needs 'tools'");
    }
    if (c->tool_choice == CM_TOOL_REQUIRED || c->tool_choice == CM_TOOL_NAMED) {
        if (c->grammar) BAD("tool_choice", "'tool_choice' %s together with '%s' is not supported",
                            c->tool_choice == CM_TOOL_NAMED ? "naming a function" : "required", c->grammar_from);
        if ((rc = cm_oai_tools_grammar(c, CM_TOOLS_HERMES, err, errlen))) FAILED("tools");
    }
    return 0;
fail:
    if (rc == LLM_ENOMEM) snprintf(err, errlen, "out of memory");
    return rc ? rc : LLM_EINVAL;
}

#define MAX_MESSAGES 4096
#define MAX_PARTS 1024 /* content parts in one message */

int cm_oai_parse_chat(const char *body, size_t len, cm_oai_completion *c, char *err, size_t errlen,
                      const char **param) {
    defaults(c);
    c->is_chat = 1;
    *param = NULL;
    int rc = 0;
    char *calls_json = NULL, *tcid_s = NULL; /* a message's, until it is stored */
    json_t *o = load_object(body, len, err, errlen);
    if (!o) return LLM_EINVAL;
    json_t *ms = json_object_get(o, "messages");
    if (!ms) BAD("messages", "'messages' is required");
    if (!json_is_array(ms) || json_array_size(ms) == 0) BAD("messages", "'messages' must be a non-empty array");
    if (json_array_size(ms) > MAX_MESSAGES) BAD("messages", "at most %d messages", MAX_MESSAGES);
    c->messages = calloc(json_array_size(ms), sizeof *c->messages);
    if (!c->messages) { rc = LLM_ENOMEM; goto fail; }
    for (size_t i = 0; i < json_array_size(ms); i++) {
        json_t *m = json_array_get(ms, i), *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_object(m)) BAD("messages", "messages[%zu] must be an object", i);
        if (!json_is_string(role)) BAD("messages", "messages[%zu].role must be a string", i);
        const char *r = json_string_value(role);
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer") && strcmp(r, "tool"))
            BAD("messages", "messages[%zu].role '%.32s' is not one of system, developer, user, assistant, tool", i, r);
        json_t *calls = !strcmp(r, "assistant") ? json_object_get(m, "tool_calls") : NULL;
        if (calls && !json_is_null(calls)) { /* an assistant's earlier calls: [{name, arguments}] for the prompt */
            if (!json_is_array(calls) || json_array_size(calls) > 64)
                BAD("messages", "messages[%zu].tool_calls must be an array of at most 64 calls", i);
            json_t *flat = json_array();
            for (size_t k = 0; k < json_array_size(calls); k++) {
                json_t *f = json_object_get(json_array_get(calls, k), "function");
                json_t *fn = json_object_get(f, "name"), *fa = json_object_get(f, "arguments");
                if (!json_is_string(fn) || !json_is_string(fa)) {
                    json_decref(flat);
                    BAD("messages", "messages[%zu].tool_calls[%zu] needs function.name and function.arguments (a string)", i, k);
                }
                json_t *args = json_loads(json_string_value(fa), JSON_DECODE_ANY, NULL);
                json_t *id = json_object_get(json_array_get(calls, k), "id");
                json_array_append_new(flat, json_pack("{s:O,s:o,s:O*}", "name", fn, "arguments", args ? args : json_incref(fa),
                                                      "id", json_is_string(id) ? id : NULL));
            }
            calls_json = json_dumps(flat, JSON_COMPACT);
            json_decref(flat);
            if (!calls_json) { rc = LLM_ENOMEM; goto fail; }
            if (!content || json_is_null(content)) content = NULL;
        }
        json_t *tcid = !strcmp(r, "tool") ? json_object_get(m, "tool_call_id") : NULL;
        if (tcid && !json_is_null(tcid) && !json_is_string(tcid)) BAD("messages", "messages[%zu].tool_call_id must be a string", i);
        if (json_is_string(tcid) && !(tcid_s = strdup(json_string_value(tcid)))) { rc = LLM_ENOMEM; goto fail; }
        char *text = NULL;
        if (json_is_string(content)) {
            /* a NUL (\u0000) cannot pass through the C-string templates: it becomes U+FFFD */
            size_t cl = json_string_length(content), nul = 0;
            const char *cs = json_string_value(content);
            for (size_t k = 0; k < cl; k++) nul += !cs[k];
            text = malloc(cl + 2 * nul + 1);
            for (size_t k = 0, o2 = 0; text && k <= cl; k++) {
                if (k < cl && !cs[k]) {
                    memcpy(text + o2, "\xef\xbf\xbd", 3);
                    o2 += 3;
                } else {
                    text[o2++] = k < cl ? cs[k] : 0;
                }
            }
        } else if (json_is_array(content)) {
            /* text parts, joined */
            size_t tot = 0;
            if (json_array_size(content) > MAX_PARTS)
                BAD("messages", "messages[%zu].content has more than %d parts", i, MAX_PARTS);
            for (size_t k = 0; k < json_array_size(content); k++) {
                json_t *part = json_array_get(content, k), *ty = json_object_get(part, "type");
                if (!json_is_string(ty) || strcmp(json_string_value(ty), "text"))
                    BAD("messages", "messages[%zu].content[%zu]: only text parts are supported", i, k);
                json_t *tx = json_object_get(part, "text");
                if (!json_is_string(tx)) BAD("messages", "messages[%zu].content[%zu].text must be a string", i, k);
                tot += json_string_length(tx);
            }
            text = malloc(tot + 1);
            if (text) {
                size_t o2 = 0;
                for (size_t k = 0; k < json_array_size(content); k++) {
                    json_t *tx = json_object_get(json_array_get(content, k), "text");
                    memcpy(text + o2, json_string_value(tx), json_string_length(tx));
                    o2 += json_string_length(tx);
                }
                text[o2] = 0;
            }
        } else if ((!content || json_is_null(content)) && !strcmp(r, "assistant")) {
            text = strdup("");
        } else {
            BAD("messages", "messages[%zu].content must be a string or an array of text parts", i);
        }
        if (!text) { rc = LLM_ENOMEM; goto fail; }
        if (!text[0] && strcmp(r, "assistant") && strcmp(r, "tool")) {
            free(text);
            BAD("messages", "messages[%zu].content is empty", i);
        }
        c->messages[c->n_messages].content = text;
        c->messages[c->n_messages].tool_calls = calls_json;
        c->messages[c->n_messages].tool_call_id = tcid_s;
        calls_json = tcid_s = NULL;
        c->messages[c->n_messages].role = strdup(!strcmp(r, "developer") ? "system" : r);
        c->n_messages++;
        if (!c->messages[c->n_messages - 1].role) { rc = LLM_ENOMEM; goto fail; }
    }
    if ((rc = parse_sampling(o, c, err, errlen, param))) goto fail;
    json_t *mt = json_object_get(o, "max_tokens");
    if (json_is_integer(mt) && json_integer_value(mt) == 0) BAD("max_tokens", "'max_tokens' must be at least 1");
    if (c->stream && c->prompt_logprobs >= 0)
        BAD("prompt_logprobs", "'prompt_logprobs' are not streamed: use 'stream': false");
    long long v = 0;
    if ((rc = get_int(o, "max_completion_tokens", 1, INT32_MAX / 2, &v, err, errlen))) FAILED("max_completion_tokens");
    if (v) c->max_tokens = (int)v;
    int lp = 0;
    if ((rc = get_bool(o, "logprobs", &lp, err, errlen))) FAILED("logprobs");
    v = 0;
    if ((rc = get_int(o, "top_logprobs", 0, CM_OAI_MAX_LOGPROBS, &v, err, errlen))) FAILED("top_logprobs");
    if (v && !lp) BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    c->logprobs = lp ? (int)v : -1;
    if ((rc = get_bool(o, "add_generation_prompt", &c->add_generation_prompt, err, errlen))) FAILED("add_generation_prompt");
    if ((rc = get_bool(o, "continue_final_message", &c->continue_final_message, err, errlen))) FAILED("continue_final_message");
    json_t *kw = json_object_get(o, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) { /* the template's switches we honour: enable_thinking */
        const char *kk;
        json_t *kv;
        if (!json_is_object(kw)) BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
        json_object_foreach(kw, kk, kv) {
            if (strcmp(kk, "enable_thinking"))
                BAD("chat_template_kwargs", "chat_template_kwargs.%.40s is not supported (enable_thinking)", kk);
            if (!json_is_boolean(kv)) BAD("chat_template_kwargs", "chat_template_kwargs.enable_thinking must be true or false");
            c->enable_thinking = json_is_true(kv);
        }
    }
    if (c->continue_final_message && c->add_generation_prompt) /* as vLLM: the two contradict each other */
        BAD("continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true: set "
            "'add_generation_prompt': false to continue the final message");
    if (c->continue_final_message && (!c->n_messages || strcmp(c->messages[c->n_messages - 1].role, "assistant")))
        BAD("continue_final_message", "'continue_final_message' needs the last message to be the assistant's");
    json_t *co = json_object_get(o, "context_overflow");
    if (co && !json_is_null(co) && (c->context_overflow = cm_oai_overflow_parse(json_string_value(co))) < 0)
        BAD("context_overflow", "'context_overflow' must be 'error', 'truncate-left', 'middle-out' or 'summarize'");
    if ((rc = parse_tools(o, c, err, errlen, param))) goto fail;
    if ((rc = check_fields(o, 1, err, errlen, param))) goto fail;
    json_decref(o);
    return 0;
fail:
    if (rc == LLM_ENOMEM) snprintf(err, errlen, "out of memory");
    free(calls_json);
    free(tcid_s);
    json_decref(o);
    cm_oai_completion_free(c);
    return rc ? rc : LLM_EINVAL;
}

static int dup_str(const char *s, char **out) {
    *out = NULL;
    return s && !(*out = strdup(s)) ? LLM_ENOMEM : 0;
}

int cm_oai_completion_copy_params(const cm_oai_completion *src, cm_oai_completion *d) {
    *d = *src;
    d->prompt = NULL, d->prompt_len = 0, d->prompt_ids = NULL, d->n_prompt_ids = 0, d->batch = NULL, d->n_batch = 0;
    d->messages = NULL, d->n_messages = 0, d->tools = NULL, d->n_tools = 0;
    d->model = d->cache_salt = d->user = d->grammar = NULL;
    d->bias = NULL;
    for (int i = 0; i < d->n_stop; i++) d->stop[i] = NULL;
    int rc = dup_str(src->model, &d->model) | dup_str(src->cache_salt, &d->cache_salt) | dup_str(src->user, &d->user) |
             dup_str(src->grammar, &d->grammar);
    for (int i = 0; i < src->n_stop; i++) rc |= dup_str(src->stop[i], &d->stop[i]);
    if (src->n_bias && (d->bias = malloc(sizeof *d->bias * (size_t)src->n_bias)))
        memcpy(d->bias, src->bias, sizeof *d->bias * (size_t)src->n_bias);
    else if (src->n_bias)
        rc = LLM_ENOMEM;
    if (rc) {
        cm_oai_completion_free(d);
        return LLM_ENOMEM;
    }
    return 0;
}

void cm_oai_gen_params(const cm_oai_completion *c, int max_tokens, cm_gen_params *p) {
    cm_gen_params_default(p);
    p->temperature = (float)c->temperature;
    p->top_p = (float)c->top_p;
    p->min_p = (float)c->min_p;
    p->top_k = c->top_k;
    p->presence_penalty = (float)c->presence_penalty;
    p->frequency_penalty = (float)c->frequency_penalty;
    p->repetition_penalty = (float)c->repetition_penalty;
    p->max_tokens = max_tokens;
    p->min_tokens = c->min_tokens;
    p->n = c->n;
    p->logprobs = c->logprobs;
    p->prompt_logprobs = c->prompt_logprobs >= 0 ? c->prompt_logprobs : c->echo && c->logprobs >= 0 ? c->logprobs : -1;
    p->ignore_eos = c->ignore_eos;
    p->has_seed = c->has_seed;
    p->seed = c->seed;
    p->priority = c->priority;
    p->cache_salt = c->cache_salt;
    p->stop = (const char *const *)c->stop;
    p->n_stop = c->n_stop;
    p->stop_ids = c->stop_ids;
    p->n_stop_ids = c->n_stop_ids;
    p->bias = c->bias;
    p->n_bias = c->n_bias;
    p->grammar = c->grammar;
}

void cm_oai_completion_free(cm_oai_completion *c) {
    for (int i = 0; i < c->n_tools; i++) {
        free(c->tools[i].name);
        free(c->tools[i].description);
        free(c->tools[i].parameters);
    }
    free(c->tools);
    for (int i = 0; i < c->n_batch; i++) {
        free(c->batch[i].text);
        free(c->batch[i].ids);
    }
    free(c->batch);
    for (int i = 0; i < c->n_messages; i++) {
        free(c->messages[i].role);
        free(c->messages[i].content);
        free(c->messages[i].tool_calls);
        free(c->messages[i].tool_call_id);
    }
    free(c->messages);
    free(c->model);
    free(c->prompt);
    free(c->prompt_ids);
    for (int i = 0; i < c->n_stop; i++) free(c->stop[i]);
    free(c->bias);
    free(c->cache_salt);
    free(c->user);
    free(c->grammar);
    memset(c, 0, sizeof *c);
}
