/* The gateway's modules on their own: token buckets on a fake clock, API
 * keys (files, trimming, refusal of an empty file, every key checked), the
 * id map, the flag table (routing is route_test's), and the
 * OpenAI response JSON (shared with generate --batch) against goldens. */
#include "cm_error.h"
#include "cm_hash.h"
#include "cm_oai.h"
#include "cm_oai_resp.h"
#include "cm_grammar.h"
#include "cm_tools.h"
#include "cm_harmony.h"
#include "cm_chat.h"
#include "gw.h"
#include "gw_auth.h"
#include "gw_conf.h"
#include "gw_limit.h"
#include "cm_idmap.h"
#include "gw_pool.h"
#include "gw_route.h"
#include "gw_cache.h"
#include "tst.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void limits(void) {
    gw_bucket b;
    gw_bucket_init(&b, 2, 4); /* 2 a second, bursts of 4 */
    double t = 100;
    for (int i = 0; i < 4; i++) {
        CHECK(gw_bucket_wait(&b, t, 1) == 0);
        gw_bucket_take(&b, t, 1);
    }
    CHECK_NEAR(gw_bucket_wait(&b, t, 1), 0.5, 1e-9);
    CHECK(gw_bucket_wait(&b, t + 0.5, 1) == 0);
    CHECK_NEAR(gw_bucket_wait(&b, t + 1000, 5), 0.5, 1e-9); /* never more than the burst */

    gw_limits l;
    CHECK_RC(gw_limits_init(&l, 1, 600, 2), 0); /* 1 rps, 600 tokens a minute, two keys */
    CHECK(gw_limits_admit(&l, 0, 0, 100) == 0);
    CHECK(gw_limits_admit(&l, 0, 1, 100) > 0); /* the global bucket is empty: nothing charged */
    CHECK(gw_limits_admit(&l, 1.0, 1, 100) == 0);
    CHECK(!gw_limits_fits(&l, 601) && gw_limits_fits(&l, 600));
    gw_limits_free(&l);
    /* a refusal charges nothing: the per-key bucket is untouched */
    CHECK_RC(gw_limits_init(&l, 0, 60, 1), 0);
    CHECK(gw_limits_admit(&l, 0, 0, 50) == 0);
    CHECK_NEAR(gw_limits_admit(&l, 0, 0, 20), 10, 1e-9); /* 10 missing at 1 token/s */
    CHECK(gw_limits_admit(&l, 10, 0, 20) == 0);
    gw_limits_free(&l);
}

static void auth(void) {
    gw_auth a = {0};
    int who;
    CHECK(gw_auth_check(&a, NULL, &who) && who == -1); /* no keys: open */
    char path[] = "/tmp/gw_auth_testXXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    char longkey[400];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = 0;
    fprintf(f, "# comment\n\n  alpha  \t\r\nbeta\n%s\n", longkey);
    fclose(f);
    char err[256];
    CHECK_RC(gw_auth_load_file(&a, path, err, sizeof err), 0);
    CHECK_INT(a.n, 3);
    CHECK(gw_auth_check(&a, "Bearer alpha", &who) && who == 0);
    CHECK(gw_auth_check(&a, "Bearer beta  ", &who) && who == 1);
    char hdr[420];
    snprintf(hdr, sizeof hdr, "Bearer %s", longkey);
    CHECK(gw_auth_check(&a, hdr, &who) && who == 2); /* long keys are whole, not cut at 255 */
    hdr[strlen(hdr) - 1] = 0;
    CHECK(!gw_auth_check(&a, hdr, &who));
    CHECK(!gw_auth_check(&a, "Bearer alph", &who));
    CHECK(!gw_auth_check(&a, "Bearer alphaX", &who));
    CHECK(!gw_auth_check(&a, "alpha", &who));
    CHECK(!gw_auth_check(&a, NULL, &who) && who == -1);
    CHECK(strcmp(gw_auth_tag(&a, 0), "alpha") && gw_auth_tag(&a, 0)[0] == '#'); /* logs carry a tag, never the key */
    gw_auth_free(&a);
    f = fopen(path, "w");
    fprintf(f, "# only comments\n\n");
    fclose(f);
    CHECK_RC(gw_auth_load_file(&a, path, err, sizeof err), LLM_EINVAL); /* refuses to run open */
    CHECK(strstr(err, "no API key") != NULL);
    gw_auth_free(&a);
    unlink(path);
    CHECK_RC(gw_auth_add(&a, " \t", 2), LLM_EINVAL);
    gw_auth_free(&a);
}

static void map(void) {
    cm_idmap m = {0};
    int vals[3000];
    for (int i = 0; i < 3000; i++) CHECK_RC(cm_idmap_put(&m, (uint64_t)i * 7919 + 1, &vals[i]), 0);
    int bad = 0;
    for (int i = 0; i < 3000; i += 2) bad += cm_idmap_del(&m, (uint64_t)i * 7919 + 1) != &vals[i];
    for (int i = 0; i < 3000; i++) bad += cm_idmap_get(&m, (uint64_t)i * 7919 + 1) != (i % 2 ? &vals[i] : NULL);
    CHECK_INT(bad, 0);
    CHECK_INT(m.n, 1500);
    /* key 0 is a key like any other */
    CHECK(cm_idmap_get(&m, 0) == NULL && cm_idmap_put(&m, 0, vals) == 0 && cm_idmap_get(&m, 0) == vals);
    CHECK(cm_idmap_get(&m, 1) == NULL && cm_idmap_del(&m, 0) == vals && cm_idmap_get(&m, 0) == NULL);
    cm_idmap_free(&m);
}

/* The summaries' ring: the newest GW_SUMS kept, the oldest out first, a key's first text kept. */
static void sums(void) {
    gw_sums s = {0};
    char t[32];
    for (int i = 0; i < GW_SUMS + 44; i++) {
        int n = snprintf(t, sizeof t, "summary %d", i);
        CHECK_RC(gw_sums_put(&s, (uint64_t)i, t, (size_t)n), 0); /* key 0 too */
    }
    CHECK_RC(gw_sums_put(&s, GW_SUMS + 43, "other", 5), 0);
    int bad = 0;
    for (int i = 0; i < GW_SUMS + 44; i++) {
        const char *v = gw_sums_get(&s, (uint64_t)i);
        snprintf(t, sizeof t, "summary %d", i);
        bad += i < 44 ? v != NULL : !v || strcmp(v, t) != 0;
    }
    CHECK_INT(bad, 0);
    CHECK_INT((int)s.map.n + s.map.has_zero, GW_SUMS);
    gw_sums_free(&s);
}


static void conf(void) {
    gw_conf c;
    char *ok[] = {"gw", "--port", "9000", "--api-key", "a", "--api-key", "b", "--routing", "least-load", "--no-log-requests"};
    CHECK_INT(gw_conf_parse(&c, 10, ok), 0);
    CHECK_INT(c.port, 9000);
    CHECK_INT(c.n_api_keys, 2);
    CHECK_INT(c.routing, GW_ROUTE_LEAST_LOAD);
    CHECK_INT(c.log_requests, 0);
    CHECK(c.shutdown_timeout == 30 && c.max_body == 8388608); /* defaults from the table */
    gw_conf_free(&c);
    char *bad[] = {"gw", "--idle-timeout", "soon"};
    fprintf(stderr, "(the next line is the refusal under test)\n");
    CHECK_INT(gw_conf_parse(&c, 3, bad), 2);
    gw_conf_free(&c);
    CHECK(gw_conf_find("idle-timeout") && !gw_conf_find("no-such-flag"));
}

/* The response JSON, chat and completions, streamed and whole, against
 * goldens: both the gateway and generate --batch emit exactly these. */
static void responses(void) {
    cm_tokenizer *t;
    CHECK_RC(cm_tok_synthetic(300, &t), 0);
    cm_oai_completion req;
    char err[256];
    const char *param;
    const char body[] = "{\"prompt\":\"hi\",\"logprobs\":1,\"n\":1}";
    CHECK_RC(cm_oai_parse_completion(body, sizeof body - 1, &req, err, sizeof err, &param), 0);
    cm_oai_result r;
    cm_oai_result_init(&r, &req, "cmpl-1", "m", 7, NULL, 0);
    r.prompt_tokens = 2;
    cm_oai_lp lp[2] = {{3 + 'a', -0.5f, 1, {{3 + 'b', -1.0f}}, 0}, {3 + 'c', -0.25f, 0, {{0}}, 0}};
    CHECK_RC(cm_oai_result_add(&r, 0, "ac", 2, lp, 2, t), 0);
    r.ch[0].finish = CM_OAI_FINISH_LENGTH;
    r.ch[0].completion_tokens = 2;
    CHECK(cm_oai_result_done(&r));
    json_t *j = cm_oai_response_json(&r, t);
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    const char *want =
        "{\"choices\":[{\"finish_reason\":\"length\",\"index\":0,\"logprobs\":{\"text_offset\":[0,1],\"token_logprobs\":[-0.5,"
        "-0.25],\"tokens\":[\"a\",\"c\"],\"top_logprobs\":[{\"b\":-1.0},{}]},\"stop_reason\":null,\"text\":\"ac\"}],"
        "\"created\":7,\"id\":\"cmpl-1\","
        "\"model\":\"m\",\"object\":\"text_completion\",\"usage\":{\"completion_tokens\":2,\"prompt_tokens\":2,"
        "\"prompt_tokens_details\":{\"cached_tokens\":0},\"total_tokens\":4}}";
    CHECK(s && !strcmp(s, want));
    if (s && strcmp(s, want)) fprintf(stderr, "got  %s\nwant %s\n", s, want);
    free(s);
    json_decref(j);
    cm_oai_result_free(&r);
    /* echo: the text starts with the prompt and offsets count it */
    req.echo = 1;
    req.logprobs = -1;
    cm_oai_result_init(&r, &req, "cmpl-2", "m", 7, "hi", 2);
    cm_oai_result_add(&r, 0, "!", 1, NULL, 0, t);
    CHECK(r.ch[0].len == 3 && !memcmp(r.ch[0].text, "hi!", 3));
    cm_oai_result_free(&r);
    cm_oai_completion_free(&req);
    /* a streamed chat: the role once, then content deltas, the finish, usage */
    const char cbody[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true,"
                         "\"stream_options\":{\"include_usage\":true}}";
    CHECK_RC(cm_oai_parse_chat(cbody, sizeof cbody - 1, &req, err, sizeof err, &param), 0);
    cm_oai_result_init(&r, &req, "chatcmpl-3", "m", 9, NULL, 0);
    const char *gold[] = {
        "{\"choices\":[{\"delta\":{\"content\":\"He\",\"role\":\"assistant\"},\"finish_reason\":null,\"index\":0,\"logprobs\":null}],"
        "\"created\":9,\"id\":\"chatcmpl-3\",\"model\":\"m\",\"object\":\"chat.completion.chunk\"}",
        "{\"choices\":[{\"delta\":{\"content\":\"y\"},\"finish_reason\":\"stop\",\"index\":0,\"logprobs\":null,"
        "\"stop_reason\":null}],"
        "\"created\":9,\"id\":\"chatcmpl-3\",\"model\":\"m\",\"object\":\"chat.completion.chunk\"}"};
    json_t *c1 = cm_oai_chunk_json(&r, 0, "He", 2, NULL, 0, 0, t);
    CHECK(cm_oai_chunk_json(&r, 0, "", 0, NULL, 0, 0, t) == NULL); /* nothing new: no event */
    json_t *c2 = cm_oai_chunk_json(&r, 0, "y", 1, NULL, 0, CM_OAI_FINISH_STOP, t);
    json_t *cs[2] = {c1, c2};
    for (int i = 0; i < 2; i++) {
        s = json_dumps(cs[i], JSON_COMPACT | JSON_SORT_KEYS);
        CHECK(s && !strcmp(s, gold[i]));
        if (s && strcmp(s, gold[i])) fprintf(stderr, "got  %s\nwant %s\n", s, gold[i]);
        free(s);
        json_decref(cs[i]);
    }
    r.prompt_tokens = 5;
    r.ch[0].completion_tokens = 2;
    j = cm_oai_usage_chunk_json(&r);
    CHECK(json_array_size(json_object_get(j, "choices")) == 0 &&
          json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")) == 7);
    json_decref(j);
    /* invalid UTF-8 from a model still makes valid JSON */
    j = cm_oai_jbytes("a\xff" "b", 3);
    CHECK(j && !strcmp(json_string_value(j), "a\xef\xbf\xbd" "b"));
    json_decref(j);
    j = cm_oai_error_json(429, "slow down", NULL, "rate_limit_exceeded");
    s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    CHECK(s && !strcmp(s, "{\"error\":{\"code\":\"rate_limit_exceeded\",\"message\":\"slow down\",\"param\":null,"
                          "\"type\":\"rate_limit_error\"}}"));
    free(s);
    json_decref(j);
    cm_oai_result_free(&r);
    cm_oai_completion_free(&req);
    /* fields not honoured are refused by name; \u0000 is accepted */
    struct { const char *body, *param; } refused[] = {
        {"{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", "stream_options"},
        {"{\"prompt\":\"x\",\"response_format\":{\"type\":\"structural_tag\"}}", "response_format"},
        {"{\"prompt\":\"x\",\"guided_whitespace_pattern\":\" \"}", "guided_whitespace_pattern"},
        {"{\"prompt\":\"x\",\"structured_outputs\":{\"structural_tag\":{}}}", "structured_outputs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"auto\"}", "tool_choice"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}", "tools"},
        {"{\"prompt\":\"x\",\"guided_json\":{\"type\":\"integer\",\"minimum\":1}}", "guided_json"},
        {"{\"prompt\":\"x\",\"guided_json\":{},\"guided_regex\":\"a\"}", "guided_regex"},
        {"{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens"},
        {"{\"prompt\":\"x\",\"use_beam_search\":true}", "use_beam_search"},
        {"{\"prompt\":\"x\",\"truncate_prompt_tokens\":5}", "truncate_prompt_tokens"},
        {"{\"prompt\":\"x\",\"messages\":[]}", "messages"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"echo\":true}", "echo"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"high\"}", "reasoning_effort"},
        /* OpenAI's ranges */
        {"{\"prompt\":\"x\",\"temperature\":5}", "temperature"},
        {"{\"prompt\":\"x\",\"top_p\":1.5}", "top_p"},
        {"{\"prompt\":\"x\",\"presence_penalty\":-3}", "presence_penalty"},
        {"{\"prompt\":\"x\",\"frequency_penalty\":2.5}", "frequency_penalty"},
        {"{\"prompt\":\"x\",\"logit_bias\":{\"5\":101}}", "logit_bias"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"custom\":1}}", "chat_template_kwargs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}}",
         "chat_template_kwargs"},
        /* continue_final_message: without add_generation_prompt false, or with no assistant message last */
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\"}],"
         "\"continue_final_message\":true}", "continue_final_message"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"continue_final_message\":true,"
         "\"add_generation_prompt\":false}", "continue_final_message"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        int chat = refused[i].body[2] == 'm';
        int rc = chat ? cm_oai_parse_chat(refused[i].body, strlen(refused[i].body), &req, err, sizeof err, &param)
                      : cm_oai_parse_completion(refused[i].body, strlen(refused[i].body), &req, err, sizeof err, &param);
        CHECK_RC(rc, LLM_EINVAL);
        CHECK(param && !strcmp(param, refused[i].param));
    }
    /* continue_final_message: the prompt ends with the assistant's text, left open in every family */
    const char cont[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":"
                        "\"The answer is\"}],\"continue_final_message\":true,\"add_generation_prompt\":false}";
    CHECK_RC(cm_oai_parse_chat(cont, sizeof cont - 1, &req, err, sizeof err, &param), 0);
    CHECK(req.continue_final_message && !req.add_generation_prompt);
    cm_oai_completion_free(&req);
    static const char *const open_ends[] = {"<|im_start|>assistant\nThe answer is", "[/INST] The answer is",
                                            "<|start_header_id|>assistant<|end_header_id|>\n\nThe answer is",
                                            "[/INST] The answer is", "<start_of_turn>model\nThe answer is",
                                            "<|start|>assistant<|channel|>final<|message|>The answer is"};
    cm_chat_msg cm2[2] = {{"user", "Hi"}, {"assistant", "The answer is"}};
    for (int k = 0; k < CM_CHAT_COUNT; k++) {
        char *ot = NULL;
        CHECK_RC(cm_chat_render_open(k, NULL, cm2, 2, &ot), 0);
        size_t tl = ot ? strlen(ot) : 0, el = strlen(open_ends[k]);
        if (!(tl >= el && !strcmp(ot + tl - el, open_ends[k]))) fprintf(stderr, "open turn, %s: '%s'\n", cm_chat_name(k), ot);
        CHECK(tl >= el && !strcmp(ot + tl - el, open_ends[k]));
        free(ot);
    }
    char *t0 = NULL;
    CHECK_RC(cm_chat_render_open(CM_CHAT_CHATML, NULL, cm2, 1, &t0), LLM_EINVAL); /* the user's last */
    /* structured outputs become a grammar the gateway has read */
    const char so[] = "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
                      "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}}}";
    CHECK_RC(cm_oai_parse_completion(so, sizeof so - 1, &req, err, sizeof err, &param), 0);
    CHECK(req.grammar && strstr(req.grammar, "root ::=") && !strcmp(req.grammar_from, "response_format"));
    cm_oai_completion_free(&req);
    /* harmless at their defaults, and fields nobody defines, are accepted */
    const char ok_fields[] = "{\"prompt\":\"x\",\"use_beam_search\":false,\"length_penalty\":1.0,\"metadata\":{\"a\":\"b\"},"
                             "\"store\":false,\"x_custom\":7}";
    CHECK_RC(cm_oai_parse_completion(ok_fields, sizeof ok_fields - 1, &req, err, sizeof err, &param), 0);
    cm_oai_completion_free(&req);
    const char nul[] = "{\"prompt\":\"a\\u0000b\"}";
    CHECK_RC(cm_oai_parse_completion(nul, sizeof nul - 1, &req, err, sizeof err, &param), 0);
    CHECK(req.prompt_len == 3 && req.prompt[1] == 0);
    cm_oai_completion_free(&req);
    const char nulc[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}";
    CHECK_RC(cm_oai_parse_chat(nulc, sizeof nulc - 1, &req, err, sizeof err, &param), 0);
    CHECK(!strcmp(req.messages[0].content, "a\xef\xbf\xbd" "b"));
    cm_oai_completion_free(&req);
    cm_tok_free(t);
}

/* Tool calls: parsed out of a model's text, rendered into the prompt, and
 * enforced by a grammar that accepts a valid call and nothing else. */
/* Does GBNF text accept x whole? */
static int grammar_takes(const char *gbnf, const char *x) {
    cm_grammar *g = NULL;
    char err[200];
    if (cm_grammar_parse(gbnf, strlen(gbnf), &g, err, sizeof err)) return -1;
    cm_gstate *st;
    int ok = !cm_gstate_new(g, &st) && cm_gstate_feed(st, x, strlen(x)) == 0 && cm_gstate_complete(st);
    cm_gstate_free(st);
    cm_grammar_free(g);
    return ok;
}

/* Llama 3.1's and Mistral's native formats: the prompt as their templates
 * write it, the calls parsed back, the grammar in their shape. */
static void test_tool_formats(void) {
    const char body[] = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"weather?\"},"
                        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_abcdefghijkl\",\"type\":\"function\","
                        "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Rome\\\"}\"}}]},"
                        "{\"role\":\"tool\",\"tool_call_id\":\"call_abcdefghijkl\",\"content\":\"sunny\"},"
                        "{\"role\":\"user\",\"content\":\"and Oslo?\"}],\"tools\":[{\"type\":\"function\",\"function\":"
                        "{\"name\":\"get_weather\",\"description\":\"Weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
                        "{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}],\"tool_choice\":\"required\"}";
    cm_oai_completion c;
    char err[300], *text = NULL;
    const char *param;
    CHECK_RC(cm_oai_parse_chat(body, sizeof body - 1, &c, err, sizeof err, &param), 0);
    cm_tools_prompt tp;
    /* Llama 3.1: the tools before the first user message, the call as JSON with "parameters", the result an ipython turn */
    CHECK_INT(cm_tools_format(CM_CHAT_LLAMA3), CM_TOOLS_LLAMA3);
    CHECK_RC(cm_tools_render(&c, CM_TOOLS_LLAMA3, NULL, &tp), 0);
    CHECK_RC(cm_chat_render(CM_CHAT_LLAMA3, NULL, tp.msgs, tp.n, 1, &text), 0);
    const char *want_l =
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function "
        "call with its proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
        "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n{\n    \"type\": \"function\",\n"
        "    \"function\": {\n        \"name\": \"get_weather\",\n        \"description\": \"Weather\",\n        \"parameters\": "
        "{\n            \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n                    "
        "\"type\": \"string\"\n                }\n            },\n            \"required\": [\n                \"city\"\n"
        "            ]\n        }\n    }\n}\n\nweather?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>"
        "\n\nsunny<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nand Oslo?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n";
    CHECK(text && !strcmp(text, want_l));
    if (text && strcmp(text, want_l)) fprintf(stderr, "llama3 tools prompt:\n%s\n", text);
    free(text);
    cm_tools_free(&tp);
    /* Mistral: [AVAILABLE_TOOLS] before the last user turn, [TOOL_CALLS] with 9-character ids, [TOOL_RESULTS] */
    CHECK_INT(cm_tools_format(CM_CHAT_MISTRAL), CM_TOOLS_MISTRAL);
    CHECK_RC(cm_tools_render(&c, CM_TOOLS_MISTRAL, NULL, &tp), 0);
    CHECK_RC(cm_chat_render(CM_CHAT_MISTRAL, NULL, tp.msgs, tp.n, 1, &text), 0);
    const char *want_m =
        "<s>[INST] Be brief.\n\nweather? [/INST][TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}, "
        "\"id\": \"defghijkl\"}]</s>[TOOL_RESULTS] {\"content\": \"sunny\", \"call_id\": \"defghijkl\"}[/TOOL_RESULTS]"
        "[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\", "
        "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]"
        "[/AVAILABLE_TOOLS][INST] and Oslo? [/INST]";
    CHECK(text && !strcmp(text, want_m));
    if (text && strcmp(text, want_m)) fprintf(stderr, "mistral tools prompt:\n%s\n", text);
    free(text);
    cm_tools_free(&tp);
    /* the grammars, in each format's shape */
    CHECK_RC(cm_oai_tools_grammar(&c, CM_TOOLS_LLAMA3, err, sizeof err), 0);
    CHECK_INT(grammar_takes(c.grammar, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"), 1);
    CHECK_INT(grammar_takes(c.grammar, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; "
                                       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Bergen\"}}"), 1);
    CHECK_INT(grammar_takes(c.grammar, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"), 0);
    CHECK_RC(cm_oai_tools_grammar(&c, CM_TOOLS_MISTRAL, err, sizeof err), 0);
    CHECK_INT(grammar_takes(c.grammar, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"), 1);
    CHECK_INT(grammar_takes(c.grammar, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, "
                                       "{\"name\": \"get_weather\", \"arguments\": {}}]"), 0); /* city is required */
    CHECK_INT(grammar_takes(c.grammar, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"), 0);
    /* the outputs parsed back */
    json_t *calls;
    char *content;
    const char *lo = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; "
                     "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bergen\"}}";
    CHECK_RC(cm_tools_parse(CM_TOOLS_LLAMA3, c.tools, c.n_tools, lo, strlen(lo), 3, &calls, &content), 0);
    CHECK(json_array_size(calls) == 2 && !content);
    json_t *f = json_object_get(json_array_get(calls, 1), "function");
    CHECK(f && !strcmp(json_string_value(json_object_get(f, "arguments")), "{\"city\":\"Bergen\"}"));
    json_decref(calls);
    const char *prose = "The weather in Oslo is {\"name\": \"get_weather\"} fine";
    CHECK_RC(cm_tools_parse(CM_TOOLS_LLAMA3, c.tools, c.n_tools, prose, strlen(prose), 3, &calls, &content), 0);
    CHECK(!calls && !content);
    const char *mo = " [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}, \"id\": \"a1b2c3d4e\"}]";
    CHECK_RC(cm_tools_parse(CM_TOOLS_MISTRAL, c.tools, c.n_tools, mo, strlen(mo), 3, &calls, &content), 0);
    CHECK(json_array_size(calls) == 1 && !content);
    json_decref(calls);
    const char *mu = "[TOOL_CALLS] [{\"name\": \"unknown\", \"arguments\": {}}]";
    CHECK_RC(cm_tools_parse(CM_TOOLS_MISTRAL, c.tools, c.n_tools, mu, strlen(mu), 3, &calls, &content), 0);
    CHECK(!calls && !content);
    cm_oai_completion_free(&c);
}

typedef struct {
    char content[1024], args[8][512], names[8][70], ids[8][30];
    size_t nc;
    int calls, bad;
} tool_events;

static void on_tool_ev(void *ctx, const cm_tools_event *ev) {
    tool_events *e = ctx;
    if (ev->kind == CM_TOOLS_EV_CONTENT) {
        if (e->nc + ev->n < sizeof e->content) memcpy(e->content + e->nc, ev->s, ev->n), e->nc += ev->n;
    } else if (ev->kind == CM_TOOLS_EV_CALL) {
        if (ev->call != e->calls || ev->call >= 8 || ev->n >= 70) { e->bad = 1; return; }
        memcpy(e->names[ev->call], ev->s, ev->n);
        snprintf(e->ids[ev->call], 30, "%s", ev->id);
        e->calls++;
    } else {
        if (ev->call < 0 || ev->call >= e->calls) { e->bad = 1; return; }
        size_t l = strlen(e->args[ev->call]);
        if (l + ev->n < 512) memcpy(e->args[ev->call] + l, ev->s, ev->n);
    }
}

/* Hermes calls streamed as written: whatever the chunking, the deltas add
 * up to what the whole-text parse finds (content, names, ids, arguments). */
static void test_tool_stream(void) {
    cm_oai_tool tools[2] = {{"get_weather", NULL, NULL}, {"add", NULL, NULL}};
    const char *texts[] = {
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par\\\"is}\"}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": [1, {\"b\": \"}\"}]}}\n</tool_call>",
        "Hello <tool world, <tool_cal and more",
        "A\n<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>\nB",
        "<tool_call>{\"arguments\": {\"x\": 2}, \"name\": \"add\"}</tool_call>",
        "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}",
        "text then <tool_",
        "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>\n\nDone.",
        /* the closing tag inside the arguments is the arguments' text, streamed or not */
        "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"s\": \"a</tool_call>b\"}}\n</tool_call>",
    };
    unsigned rng = 12345;
    for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
        const char *t = texts[k];
        size_t len = strlen(t);
        json_t *calls;
        char *content;
        CHECK_RC(cm_tools_parse(CM_TOOLS_HERMES, tools, 2, t, len, 99, &calls, &content), 0);
        if (strstr(t, "a</tool_call>b"))
            CHECK(json_array_size(calls) == 1 && !content &&
                  strstr(json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments")),
                         "a</tool_call>b"));
        for (int split = 0; split < 20; split++) {
            tool_events e;
            memset(&e, 0, sizeof e);
            cm_tools_stream st;
            memset(&st, 0, sizeof st);
            for (size_t at = 0; at < len;) {
                size_t step = split == 0 ? 1 : 1 + (rng = rng * 1103515245u + 12345u) % 9;
                at = at + step > len ? len : at + step;
                CHECK_RC(cm_tools_stream_feed(&st, tools, 2, t, at, 0, 99, on_tool_ev, &e), 0);
            }
            CHECK_RC(cm_tools_stream_feed(&st, tools, 2, t, len, 1, 99, on_tool_ev, &e), 0);
            int ok = !e.bad && (size_t)e.calls == json_array_size(calls) &&
                     !strcmp(e.content, content ? content : (calls ? "" : t));
            for (int c = 0; ok && c < e.calls; c++) {
                json_t *x = json_array_get(calls, (size_t)c), *f = json_object_get(x, "function");
                json_t *want = json_loads(json_string_value(json_object_get(f, "arguments")), 0, NULL),
                       *got = json_loads(e.args[c], 0, NULL);
                ok = !strcmp(e.names[c], json_string_value(json_object_get(f, "name"))) &&
                     !strcmp(e.ids[c], json_string_value(json_object_get(x, "id"))) && json_equal(want, got);
                json_decref(want);
                json_decref(got);
            }
            CHECK(ok);
            if (!ok) fprintf(stderr, "  text %zu split %d: content '%s' vs '%s', %d calls\n", k, split, e.content,
                             content ? content : "(null)", e.calls);
        }
        json_decref(calls);
        free(content);
    }
}

static void test_tools(void) {
    cm_oai_tool tools[2] = {{"get_weather", "w", "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
                                                 "\"required\":[\"city\"],\"additionalProperties\":false}"},
                            {"add", NULL, NULL}};
    json_t *calls;
    char *content;
    const char *t = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
                    "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call><tool_call>\n{\"name\": \"add\", \"arguments\": "
                    "\"{\\\"a\\\": 1}\"}\n</tool_call> <tool_call>{\"name\": \"add\"";
    CHECK_RC(cm_tools_parse(CM_TOOLS_HERMES, tools, 2, t, strlen(t), 7, &calls, &content), 0);
    CHECK(json_array_size(calls) == 2);
    json_t *f0 = json_object_get(json_array_get(calls, 0), "function"), *f1 = json_object_get(json_array_get(calls, 1), "function");
    CHECK(f0 && !strcmp(json_string_value(json_object_get(f0, "name")), "get_weather") &&
          !strcmp(json_string_value(json_object_get(f0, "arguments")), "{\"city\":\"Paris\"}"));
    CHECK(f1 && !strcmp(json_string_value(json_object_get(f1, "arguments")), "{\"a\": 1}"));
    const char *id0 = json_string_value(json_object_get(json_array_get(calls, 0), "id")),
               *id1 = json_string_value(json_object_get(json_array_get(calls, 1), "id"));
    CHECK(id0 && id1 && strlen(id0) == 29 && !strncmp(id0, "call_", 5) && strcmp(id0, id1));
    /* the unknown function's block and the unterminated one stay text */
    CHECK(content && strstr(content, "Let me check.") && strstr(content, "nope") && strstr(content, "{\"name\": \"add\"") &&
          !strstr(content, "Paris"));
    json_decref(calls);
    free(content);
    CHECK_RC(cm_tools_parse(CM_TOOLS_HERMES, tools, 2, "plain text", 10, 1, &calls, &content), 0);
    CHECK(!calls && !content);
    /* the prompt: tools in the system message, an earlier call and its result written out */
    cm_oai_completion c;
    char err[300];
    const char *param;
    const char body[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},{\"role\":\"assistant\",\"content\":null,"
                        "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                        "\"arguments\":\"{\\\"city\\\":\\\"Rome\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\","
                        "\"content\":\"sunny\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}],"
                        "\"tool_choice\":\"required\",\"parallel_tool_calls\":false}";
    CHECK_RC(cm_oai_parse_chat(body, sizeof body - 1, &c, err, sizeof err, &param), 0);
    CHECK(c.n_tools == 1 && c.tool_choice == CM_TOOL_REQUIRED && !c.parallel_tool_calls && c.grammar);
    cm_tools_prompt tp;
    CHECK_RC(cm_tools_render(&c, CM_TOOLS_HERMES, "Be brief.", &tp), 0);
    CHECK(tp.n == 4 && !strcmp(tp.msgs[0].role, "system") && strstr(tp.msgs[0].content, "Be brief.") &&
          strstr(tp.msgs[0].content, "<tools>") && strstr(tp.msgs[0].content, "\"get_weather\""));
    CHECK(tp.n == 4 && strstr(tp.msgs[2].content, "<tool_call>") && strstr(tp.msgs[2].content, "Rome") &&
          !strcmp(tp.msgs[3].role, "user") && strstr(tp.msgs[3].content, "<tool_response>\nsunny\n</tool_response>"));
    cm_tools_free(&tp);
    cm_grammar *g = NULL;
    CHECK_RC(cm_grammar_parse(c.grammar, strlen(c.grammar), &g, err, sizeof err), 0);
    const char *good = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    const char *bad[] = {"<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>", "Sure!", good - 0 + 1,
                         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 5}}\n</tool_call>"};
    cm_gstate *st;
    for (int k = -1; g && k < 4; k++) {
        const char *x = k < 0 ? good : bad[k];
        CHECK_RC(cm_gstate_new(g, &st), 0);
        int ok = cm_gstate_feed(st, x, strlen(x)) == 0 && cm_gstate_complete(st);
        CHECK(ok == (k < 0));
        if (k < 0) CHECK(cm_gstate_done(st)); /* one call: nothing may follow */
        cm_gstate_free(st);
    }
    cm_grammar_free(g);
    cm_oai_completion_free(&c);
}

/* The response cache: exact keys normalise whitespace and case, scopes
 * never mix, the nearest vector wins only past the threshold, TTL and the
 * size bound evict, a put replaces its exact key. */
static void cache(void) {
    CHECK(gw_cache_exact_key("What is  the capital?", 21) == gw_cache_exact_key("  what is the CAPITAL?\n", 23));
    CHECK(gw_cache_exact_key("what is the capital", 19) != gw_cache_exact_key("what is the capital?", 20));
    CHECK(gw_cache_exact_key("a b", 3) != gw_cache_exact_key("ab", 2));
    gw_cache c;
    gw_cache_init(&c, 3, 10, 0.9f, 4);
    float v1[4] = {1, 0, 0, 0}, v2[4] = {0.96f, 0.28f, 0, 0}, v3[4] = {0, 1, 0, 0};
    gw_cache_hit h;
    CHECK_INT(gw_cache_put(&c, 7, 100, v1, "one", 3, 1, 5, 0.0), 0);
    CHECK_INT(gw_cache_get_exact(&c, 7, 100, 1.0, &h), 1);
    CHECK(h.e && h.exact && !strcmp(h.e->text, "one") && h.e->completion_tokens == 5);
    CHECK_INT(gw_cache_get_exact(&c, 8, 100, 1.0, &h), 0);     /* another scope: nothing */
    CHECK_INT(gw_cache_get_similar(&c, 8, v1, 1.0, &h), 0);
    CHECK_INT(gw_cache_get_similar(&c, 7, v2, 1.0, &h), 1);    /* cosine 0.96 >= 0.9 */
    CHECK(h.e && !h.exact && fabsf(h.similarity - 0.96f) < 1e-5f);
    CHECK_INT(gw_cache_get_similar(&c, 7, v3, 1.0, &h), 0);    /* orthogonal: a miss */
    CHECK(c.misses == 2 && c.hits_semantic == 1 && c.hits_exact == 1); /* an exact lookup alone counts no miss */
    float v4[4] = {0.87f, 0.49f, 0, 0};                        /* 0.87: within 0.05 of 0.9, a near miss */
    CHECK_INT(gw_cache_get_similar(&c, 7, v4, 1.0, &h), 0);
    CHECK_INT(c.near_misses, 1);
    CHECK_INT(gw_cache_put(&c, 7, 100, v1, "uno", 3, 1, 5, 2.0), 0); /* replaces */
    CHECK_INT(c.n, 1);
    CHECK(gw_cache_get_exact(&c, 7, 100, 3.0, &h) && !strcmp(h.e->text, "uno"));
    CHECK_INT(gw_cache_put(&c, 7, 101, NULL, "two", 3, 1, 1, 3.0), 0); /* no vector: exact only */
    CHECK_INT(gw_cache_put(&c, 9, 102, v3, "three", 5, 2, 1, 4.0), 0);
    CHECK_INT(gw_cache_get_exact(&c, 7, 100, 5.0, &h), 1);      /* touched: the newest now */
    CHECK_INT(gw_cache_put(&c, 9, 103, v3, "four", 4, 1, 1, 5.0), 0); /* a fourth: the least recent goes (101) */
    CHECK_INT(c.n, 3);
    CHECK_INT(c.evictions, 1);
    CHECK_INT(gw_cache_get_exact(&c, 7, 101, 5.0, &h), 0);
    CHECK_INT(gw_cache_get_exact(&c, 7, 100, 5.0, &h), 1);
    CHECK_INT(gw_cache_get_exact(&c, 9, 102, 14.5, &h), 0);     /* past the TTL of 10 s */
    CHECK(c.expired >= 1 && c.n == 2);
    CHECK_INT(gw_cache_get_similar(&c, 9, v3, 16.0, &h), 0);   /* expired on the way */
    CHECK_INT(c.n, 1);
    gw_cache_free(&c);
    CHECK_INT(c.n, 0);
}

/* gpt-oss's harmony replies: the analysis channel is the reasoning, final (and commentary) the content, the
 * markers neither; fed whole or in pieces of any size, the same split */
static void reason_split(int kind, const char *text, size_t piece, char **reasoning, char **content) {
    cm_harmony h;
    cm_hbuf r = {0}, c = {0};
    cm_reason_init(&h, kind);
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i += piece)
        CHECK_RC(cm_harmony_feed(&h, text + i, n - i < piece ? n - i : piece, 0, &r, &c), 0);
    CHECK_RC(cm_harmony_feed(&h, "", 0, 1, &r, &c), 0);
    *reasoning = strdup(r.s ? r.s : "");
    *content = strdup(c.s ? c.s : "");
    cm_hbuf_free(&r);
    cm_hbuf_free(&c);
}

static void test_harmony(void) {
    static const struct { const char *text, *reasoning, *content; } cases[] = {
        {"<|channel|>analysis<|message|>The user greets. Answer <b>x</b> < 3.<|end|><|start|>assistant<|channel|>final"
         "<|message|>Hello! 2 <| 3, a <|ret token<|return|>",
         "The user greets. Answer <b>x</b> < 3.", "Hello! 2 <| 3, a <|ret token"},
        {"<|channel|>final<|message|>only an answer", "", "only an answer"},
        {"no channels at all, <|end|>kept?", "", "no channels at all, "}, /* plain text: a marker still ends it */
        {"<|channel|>analysis<|message|>thinking, then cut off", "thinking, then cut off", ""},
        {"<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json"
         "<|message|>{\"x\": 1}<|call|>", "a", "{\"x\": 1}"},
        {"<|chan", "", "<|chan"}, /* a marker's start that never completes is text */
        {"", "", ""},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (size_t piece = 1; piece <= 300; piece = piece < 8 ? piece + 1 : piece * 5) {
            char *r, *c;
            reason_split(CM_REASON_HARMONY, cases[k].text, piece, &r, &c);
            if (strcmp(r, cases[k].reasoning) || strcmp(c, cases[k].content))
                fprintf(stderr, "harmony case %zu piece %zu: reasoning '%s' content '%s'\n", k, piece, r, c);
            CHECK(!strcmp(r, cases[k].reasoning) && !strcmp(c, cases[k].content));
            free(r);
            free(c);
        }
    /* --reasoning-parser's think tags: deepseek_r1 starts in the reasoning (its template opened <think>), qwen3
     * only when the reply starts with <think> */
    static const struct { int kind; const char *text, *reasoning, *content; } think[] = {
        {CM_REASON_R1, "Let me think. 2 < 3.</think>\n\nThe answer is 4.", "Let me think. 2 < 3.", "\n\nThe answer is 4."},
        {CM_REASON_R1, "<think>\nhmm</think>ok", "\nhmm", "ok"},
        {CM_REASON_R1, "cut off in thought </thin", "cut off in thought </thin", ""},
        {CM_REASON_QWEN3, "<think>\nWhy <b>?\n</think>\n\nBecause.</think>", "\nWhy <b>?\n", "\n\nBecause.</think>"},
        {CM_REASON_QWEN3, "No thinking here, <think> later is text", "", "No thinking here, <think> later is text"},
        {CM_REASON_QWEN3, "<thi", "", "<thi"},
    };
    for (size_t k = 0; k < sizeof think / sizeof think[0]; k++)
        for (size_t piece = 1; piece <= 64; piece = piece < 8 ? piece + 1 : piece * 4) {
            char *r, *c;
            reason_split(think[k].kind, think[k].text, piece, &r, &c);
            if (strcmp(r, think[k].reasoning) || strcmp(c, think[k].content))
                fprintf(stderr, "think case %zu piece %zu: reasoning '%s' content '%s'\n", k, piece, r, c);
            CHECK(!strcmp(r, think[k].reasoning) && !strcmp(c, think[k].content));
            free(r);
            free(c);
        }
    CHECK_INT(cm_reason_parser("deepseek_r1"), CM_REASON_R1);
    CHECK_INT(cm_reason_parser("qwen3"), CM_REASON_QWEN3);
    CHECK_INT(cm_reason_parser("granite"), -1);
    char *nt = strdup("<|im_start|>assistant\n");
    CHECK_RC(cm_chat_no_thinking(CM_CHAT_CHATML, &nt), 0);
    CHECK(nt && !strcmp(nt, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    CHECK_RC(cm_chat_no_thinking(CM_CHAT_LLAMA3, &nt), LLM_EINVAL);
    free(nt);
    /* the prompt as gpt-oss's template writes it: system header, the system prompt as the developer's
     * instructions, earlier replies on the final channel, then the reply's start */
    cm_chat_msg m[3] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}};
    char *text = NULL;
    CHECK_RC(cm_chat_render(CM_CHAT_HARMONY, NULL, m, 3, 1, &text), 0);
    CHECK(text && !strncmp(text, "<|start|>system<|message|>You are ChatGPT", 41));
    CHECK(text && strstr(text, "Reasoning: medium\n\n# Valid channels: analysis, commentary, final."));
    const char *tail = "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|><|start|>user<|message|>Hi<|end|>"
                       "<|start|>assistant<|channel|>final<|message|>Hello.<|end|><|start|>assistant";
    CHECK(text && strlen(text) > strlen(tail) && !strcmp(text + strlen(text) - strlen(tail), tail));
    free(text);
    CHECK_INT(cm_chat_detect("{% for m in messages %}<|start|>{{ m.role }}<|channel|>final{% endfor %}"), CM_CHAT_HARMONY);
    /* a chat response: reasoning_content beside the content, in the message and in the stream's deltas */
    cm_oai_completion req;
    memset(&req, 0, sizeof req);
    req.is_chat = 1;
    req.n = 1;
    req.reasoning = CM_REASON_HARMONY;
    req.logprobs = -1;
    cm_oai_result res;
    cm_oai_result_init(&res, &req, "chatcmpl-1", "m", 0, NULL, 0);
    const char *out = "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>ans";
    CHECK_RC(cm_oai_result_add(&res, 0, out, strlen(out), NULL, 0, NULL), 0);
    res.ch[0].finish = CM_OAI_FINISH_STOP;
    json_t *j = cm_oai_response_json(&res, NULL);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    CHECK(!strcmp(json_string_value(json_object_get(msg, "content")), "ans"));
    CHECK(!strcmp(json_string_value(json_object_get(msg, "reasoning_content")), "think"));
    json_decref(j);
    cm_oai_result_free(&res);
    cm_oai_result_init(&res, &req, "chatcmpl-2", "m", 0, NULL, 0);
    char rs[64] = "", cs[64] = "";
    for (size_t i = 0, n = strlen(out); i <= n; i += 7) {
        int fin = i + 7 > n;
        json_t *ch = cm_oai_chunk_json(&res, 0, out + i, fin ? n - i : 7, NULL, 0, fin ? CM_OAI_FINISH_STOP : 0, NULL);
        json_t *d = ch ? json_object_get(json_array_get(json_object_get(ch, "choices"), 0), "delta") : NULL;
        const char *a = json_string_value(json_object_get(d, "reasoning_content")), *b = json_string_value(json_object_get(d, "content"));
        if (a) strncat(rs, a, sizeof rs - strlen(rs) - 1);
        if (b) strncat(cs, b, sizeof cs - strlen(cs) - 1);
        json_decref(ch);
    }
    CHECK(!strcmp(rs, "think") && !strcmp(cs, "ans"));
    cm_oai_result_free(&res);
}

/* A thinking model's tool call: the reasoning (which may mention <tool_call>) apart, the call read from the
 * content, whole and streamed (Hermes, in 7-byte pieces). */
static void test_reasoning_tools(void) {
    cm_oai_tool tools[1] = {{"add", NULL, NULL}};
    cm_oai_completion req;
    memset(&req, 0, sizeof req);
    req.is_chat = 1;
    req.n = 1;
    req.logprobs = -1;
    req.reasoning = CM_REASON_QWEN3;
    req.tools = tools;
    req.n_tools = 1;
    req.tool_choice = CM_TOOL_REQUIRED;
    req.tool_format = CM_TOOLS_HERMES;
    const char *out = "<think>I should call add. <tool_call> not yet</think>\n<tool_call>\n{\"name\": \"add\", "
                      "\"arguments\": {\"a\": 1}}\n</tool_call>";
    cm_oai_result res;
    cm_oai_result_init(&res, &req, "chatcmpl-9", "m", 0, NULL, 0);
    CHECK_RC(cm_oai_result_add(&res, 0, out, strlen(out), NULL, 0, NULL), 0);
    res.ch[0].finish = CM_OAI_FINISH_STOP;
    json_t *j = cm_oai_response_json(&res, NULL);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0), *msg = json_object_get(ch, "message");
    json_t *calls = json_object_get(msg, "tool_calls");
    CHECK(json_array_size(calls) == 1 && json_is_null(json_object_get(msg, "content")));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "name")) ?
                      json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"), "name")) : "",
                  "add"));
    CHECK(json_string_value(json_object_get(msg, "reasoning_content")) &&
          !strcmp(json_string_value(json_object_get(msg, "reasoning_content")), "I should call add. <tool_call> not yet"));
    CHECK(!strcmp(json_string_value(json_object_get(ch, "finish_reason")), "tool_calls"));
    json_decref(j);
    cm_oai_result_free(&res);
    /* streamed */
    cm_oai_result_init(&res, &req, "chatcmpl-10", "m", 0, NULL, 0);
    char rs[128] = "", args[128] = "", name[32] = "";
    int n_calls = 0;
    for (size_t i = 0, n = strlen(out); i <= n; i += 7) {
        int fin = i + 7 > n;
        CHECK_RC(cm_oai_result_add(&res, 0, out + i, fin ? n - i : 7, NULL, 0, NULL), 0);
        if (fin) res.ch[0].finish = CM_OAI_FINISH_STOP;
        json_t *a = cm_oai_tool_stream_json(&res, 0, fin);
        for (size_t k = 0; k < json_array_size(a); k++) {
            json_t *d = json_object_get(json_array_get(json_object_get(json_array_get(a, k), "choices"), 0), "delta");
            const char *r = json_string_value(json_object_get(d, "reasoning_content"));
            if (r) strncat(rs, r, sizeof rs - strlen(rs) - 1);
            CHECK(!json_string_length(json_object_get(d, "content")));
            json_t *tc = json_array_get(json_object_get(d, "tool_calls"), 0), *fn = json_object_get(tc, "function");
            if (json_object_get(tc, "id")) n_calls++, snprintf(name, sizeof name, "%s", json_string_value(json_object_get(fn, "name")));
            if (json_string_value(json_object_get(fn, "arguments")))
                strncat(args, json_string_value(json_object_get(fn, "arguments")), sizeof args - strlen(args) - 1);
        }
        json_decref(a);
    }
    CHECK(!strcmp(rs, "I should call add. <tool_call> not yet"));
    CHECK(n_calls == 1 && !strcmp(name, "add"));
    json_t *aj = json_loads(args, 0, NULL);
    CHECK(json_integer_value(json_object_get(aj, "a")) == 1);
    json_decref(aj);
    cm_oai_result_free(&res);
}

int main(void) {
    test_reasoning_tools();
    cache();
    limits();
    auth();
    map();
    sums();
    conf();
    responses();
    test_tools();
    test_tool_formats();
    test_tool_stream();
    test_harmony();
    return tst_done("gateway_test");
}
