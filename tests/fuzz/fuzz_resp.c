/* Fuzz target: Responses API request bodies (gw_responses.c), as the gateway
 * rewrites them into chat requests; and /v1/score ('s') and /v1/rerank ('r')
 * bodies (gw_score.c), rewritten into embeddings requests; and /v1/files
 * uploads ('m': a Content-Type line, then a multipart/form-data body;
 * gw_files.c). Byte 0 'p': the bytes up to the first
 * NUL are a stored record (previous_response_id's conversation, as a
 * store gives it back, which may be anything) and the rest the body; any
 * other byte 0: the rest is the body. A body is rewritten or refused with
 * LLM_EINVAL and a message; a rewritten one is a JSON object with messages
 * that the chat parser then reads (or refuses) as it reads any request. */
#include "cm_error.h"
#include "cm_oai.h"
#include "gw_resp_in.h"
#include "gw_score.h"
#include "gw_files.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPECT(c)                                                                                  \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_resp: %s does not hold\n", #c);                                  \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    const char *body = (const char *)data + 1, *prev = NULL;
    if (data[0] == 'm') {
        const char *nl = memchr(body, '\n', size - 1);
        if (!nl) return 0;
        char ctype[300];
        size_t cl = (size_t)(nl - body) < sizeof ctype - 1 ? (size_t)(nl - body) : sizeof ctype - 1;
        memcpy(ctype, body, cl);
        ctype[cl] = 0;
        const char *b = nl + 1, *end = (const char *)data + size;
        gw_form f;
        char err[300] = "";
        if (gw_files_form(ctype, b, (size_t)(end - b), &f, err, sizeof err)) {
            EXPECT(err[0]);
            return 0;
        }
        EXPECT(f.file >= b && f.file + f.file_len <= end && strlen(f.filename) < sizeof f.filename);
        EXPECT(!f.purpose || (f.purpose >= b && f.purpose + f.purpose_len <= end));
        return 0;
    }
    if (data[0] == 's' || data[0] == 'r') {
        char err[400] = "", *out = NULL;
        const char *param = NULL;
        int rc = gw_score_request(NULL, body, size - 1, data[0] == 'r', &out, err, sizeof err, &param);
        EXPECT(rc == 0 || rc == LLM_EINVAL || rc == LLM_ENOMEM);
        EXPECT(rc ? !out && err[0] && (!param || strlen(param) < 64) : out != NULL);
        json_t *j = out ? json_loads(out, 0, NULL) : NULL;
        EXPECT(!out || json_array_size(json_object_get(j, "input")) >= 2);
        json_decref(j);
        free(out);
        return 0;
    }
    size_t len = size - 1, plen = 0;
    if (data[0] == 'p') {
        const char *nul = memchr(body, 0, len);
        if (!nul) return 0;
        prev = body;
        plen = (size_t)(nul - body);
        body = nul + 1;
        len -= plen + 1;
    }
    char err[400] = "", *out = NULL;
    const char *param = NULL;
    int rc = gw_resp_chat_body(body, len, prev, plen, &out, err, sizeof err, &param);
    if (rc) {
        EXPECT(rc == LLM_EINVAL || rc == LLM_ENOMEM);
        EXPECT(!out && err[0] && strlen(err) < sizeof err);
        EXPECT(!param || strlen(param) < 64); /* a static name: it outlives the body */
        return 0;
    }
    EXPECT(out);
    json_t *j = json_loads(out, 0, NULL);
    EXPECT(json_is_object(j) && json_array_size(json_object_get(j, "messages")));
    json_decref(j);
    cm_oai_completion c;
    char e2[512] = "";
    const char *p2 = NULL;
    if (!cm_oai_parse_chat(out, strlen(out), &c, e2, sizeof e2, &p2)) cm_oai_completion_free(&c);
    free(out);
    return 0;
}
