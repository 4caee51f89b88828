/* tl_bench_data.c - llmserve bench serve's requests: random prompts,
 * shared prefixes, or a ShareGPT file. */
#include "cm_error.h"
#include "cm_model.h"
#include "cm_parse.h"
#include "cm_time.h"
#include "cm_tokenizer.h"
#include "tl_common.h"
#include "tl_plan.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "tl_bench_int.h"

/* ShareGPT: [{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}, ...].
 * The first human turn is the prompt; the reply's length (4 bytes a token,
 * without a tokenizer) is the output length. */
int tlb_load_sharegpt(const char *path, int want, char ***prompts, int **outs, int *n, char *err, size_t errlen) {
    json_error_t je;
    json_t *a = json_load_file(path, 0, &je);
    if (!a) {
        snprintf(err, errlen, "%s: not valid JSON: %s (line %d)", path, je.text, je.line);
        return LLM_EFORMAT;
    }
    if (!json_is_array(a)) {
        snprintf(err, errlen, "%s: a ShareGPT file is a JSON array of {\"conversations\": [...]}", path);
        json_decref(a);
        return LLM_EFORMAT;
    }
    *prompts = calloc(json_array_size(a) + 1, sizeof **prompts);
    *outs = calloc(json_array_size(a) + 1, sizeof **outs);
    *n = 0;
    size_t i;
    json_t *e;
    json_array_foreach(a, i, e) {
        json_t *cv = json_object_get(e, "conversations");
        json_t *h = json_array_get(cv, 0), *g = json_array_get(cv, 1);
        const char *hf = json_string_value(json_object_get(h, "from")), *gf = json_string_value(json_object_get(g, "from"));
        const char *hv = json_string_value(json_object_get(h, "value")), *gv = json_string_value(json_object_get(g, "value"));
        if (!hf || !gf || !hv || !gv || strcmp(hf, "human") || strcmp(gf, "gpt") || strlen(hv) < 4) continue;
        (*prompts)[*n] = strdup(hv);
        int ol = (int)(strlen(gv) / 4);
        (*outs)[*n] = ol < 4 ? 4 : ol > 2048 ? 2048 : ol;
        (*n)++;
        if (*n >= want) break;
    }
    json_decref(a);
    if (!*n) {
        snprintf(err, errlen, "%s: no conversation starts with a human turn followed by a gpt turn", path);
        free(*prompts);
        free(*outs);
        *prompts = NULL;
        *outs = NULL;
        return LLM_EFORMAT;
    }
    return 0;
}

/* The request bodies of one run: random words (text works on both endpoints
 * and every server), a shared prefix per group, ShareGPT turns, or a mix of
 * two classes (random words of two sizes), reported apart. */
int tlb_build_requests(const bench_opts *o, uint64_t seed, bench_req *r, int total) {
    static const char *words[] = {"river", "stone", "light", "market", "engine", "garden", "signal", "forest", "paper",
                                  "window", "silver", "ocean", "winter", "thread", "bridge", "planet"};
    tl_bench_seed(seed);
    int prefix = !strcmp(o->dataset, "prefix-repetition"), mixed = !strcmp(o->dataset, "mixed");
    char **prefixes = calloc((size_t)o->n_px, sizeof *prefixes);
    if (!prefixes) return LLM_ENOMEM;
    for (int p = 0; p < o->n_px; p++) {
        prefixes[p] = malloc((size_t)o->px_len * 8 + 1);
        if (!prefixes[p]) continue;
        size_t off = 0;
        for (int w = 0; w < o->px_len; w++)
            off += (size_t)sprintf(prefixes[p] + off, "%s ", words[(size_t)(tl_bench_urand() * 16)]);
        prefixes[p][off] = 0;
    }
    int rc = 0;
    for (int i = 0; i < total && !rc; i++) {
        int il = prefix ? (int)o->sx_len : (int)((double)o->in_len * (1 - o->range + 2 * o->range * tl_bench_urand()));
        int ol = prefix ? (int)o->px_out : (int)((double)o->out_len * (1 - o->range + 2 * o->range * tl_bench_urand()));
        r[i].cls = mixed && tl_bench_urand() < o->long_frac; /* a long prompt among chat-sized ones */
        if (r[i].cls) {
            il = (int)((double)o->long_in * (1 - o->range + 2 * o->range * tl_bench_urand()));
            ol = (int)o->long_out;
        }
        if (il < 1) il = 1;
        if (ol < 1) ol = 1;
        char *text;
        if (o->sg) {
            text = strdup(o->sg[i % o->n_sg]);
            ol = o->sg_out[i % o->n_sg];
        } else {
            const char *px = prefix ? prefixes[i % o->n_px] : NULL;
            text = malloc((size_t)il * 8 + (px ? strlen(px) : 0) + 1);
            if (text) {
                size_t off = px ? (size_t)sprintf(text, "%s", px) : 0;
                for (int w = 0; w < il; w++)
                    off += (size_t)sprintf(text + off, "%s ", words[(size_t)(tl_bench_urand() * 16)]);
                text[off] = 0;
            }
        }
        r[i].prompt = text ? strdup(text) : NULL;
        json_t *j = !text   ? NULL
                    : o->chat ? json_pack("{s:[{s:s,s:s}]}", "messages", "role", "user", "content", text)
                              : json_pack("{s:s}", "prompt", text);
        free(text);
        if (!j) {
            rc = LLM_ENOMEM;
            break;
        }
        json_object_set_new(j, "max_tokens", json_integer(ol));
        json_object_set_new(j, "stream", json_true());
        json_object_set_new(j, "stream_options", json_pack("{s:b}", "include_usage", 1));
        json_object_set_new(j, "temperature", json_real(0));
        if (o->model) json_object_set_new(j, "model", json_string(o->model));
        if (o->ignore_eos) json_object_set_new(j, "ignore_eos", json_true());
        r[i].body = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        if (!r[i].body) rc = LLM_ENOMEM;
    }
    for (int p = 0; p < o->n_px; p++) free(prefixes[p]);
    free(prefixes);
    return rc;
}

