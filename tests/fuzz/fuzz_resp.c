/* Fuzz target: Responses API request bodies (gw_responses.c), as the gateway
 * rewrites them into chat requests; and /v1/score ('s') and /v1/rerank ('r')
 * bodies (gw_score.c), rewritten into embeddings requests. Byte 0 'p': the bytes up to the first
 * NUL are a stored record (previous_response_id's conversation, as a
 * store gives it back, which may be anything) and the rest the body; any
 * other byte 0: the rest is the body. A body is rewritten or refused with
 * LLM_EINVAL and a message; a rewritten one is a JSON object with messages
 * that the chat parser then reads (or refuses) as it reads any request. */
#include "cm_error.h"
#include "cm_oai.h"
#include "gw_responses.h"
#include "gw_score.h"

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
