/* gw_models.c - GET /v1/models and /v1/models/{id}: the served model, its LoRA adapters (as vLLM lists
 * them) and the embedding model. */
#include "gw_models.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* /v1/models' entries for the LoRA adapters, as vLLM lists them: each its own model, its parent the base. */
static void list_loras(gw *g, json_t *data) {
    for (const char *p = g->loras; *p;) {
        const char *e = strchr(p + 1, '\n');
        if (*p != '\n' || !e) break;
        if (e > p + 1) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(e - p - 1), p + 1);
            json_array_append_new(data, json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:i}", "id", name, "object", "model",
                                                  "created", (json_int_t)time(NULL), "owned_by", "llmserve", "root", name,
                                                  "parent", g->served, "max_model_len", g->max_model_len));
        }
        p = e;
        if (!p[1]) break;
    }
}

/* A path's %XX escapes decoded (a model name may hold '/' or spaces); 0 on a bad escape. */
static int unescape(const char *s, char *out, size_t len) {
    size_t o = 0;
    for (; *s && o + 1 < len; s++) {
        if (*s != '%') {
            out[o++] = *s;
            continue;
        }
        unsigned v;
        if (!isxdigit((unsigned char)s[1]) || !isxdigit((unsigned char)s[2]) || sscanf(s + 1, "%2x", &v) != 1 || !v) return 0;
        out[o++] = (char)v;
        s += 2;
    }
    out[o] = 0;
    return !*s;
}

/* /v1/models, or /v1/models/{id} (OpenAI's retrieve: the one entry, 404 naming the model when none). */
void gw_models_handle(gw *g, gw_http_req *r, const char *id) {
    char want[256];
    if (id && !unescape(id, want, sizeof want)) {
        gw_http_error(r->conn, 400, "the model id in the path is not well escaped", "model", "invalid_value");
        return;
    }
    json_t *data = json_array();
    if (g->served[0])
        json_array_append_new(data, json_pack("{s:s,s:s,s:I,s:s,s:i}", "id", g->served, "object", "model", "created",
                                              (json_int_t)time(NULL), "owned_by", "llmserve", "max_model_len",
                                              g->max_model_len));
    if (g->served[0]) list_loras(g, data);
    if (g->eserved[0] && g->emax_len) /* the embedding model: /v1/embeddings */
        json_array_append_new(data, json_pack("{s:s,s:s,s:I,s:s,s:i,s:i}", "id", g->eserved, "object", "model", "created",
                                              (json_int_t)time(NULL), "owned_by", "llmserve", "max_model_len",
                                              g->emax_len, "embedding_dimensions", g->edim));
    if (id) {
        for (size_t i = 0; i < json_array_size(data); i++) {
            json_t *m = json_array_get(data, i);
            if (!strcmp(json_string_value(json_object_get(m, "id")), want)) {
                gw_http_json(r->conn, 200, m);
                json_decref(data);
                return;
            }
        }
        json_decref(data);
        char msg[400];
        snprintf(msg, sizeof msg, "The model `%.200s` does not exist.", want);
        gw_http_error(r->conn, 404, msg, "model", "model_not_found");
        return;
    }
    json_t *j = json_pack("{s:s,s:o}", "object", "list", "data", data);
    gw_http_json(r->conn, 200, j);
    json_decref(j);
}

