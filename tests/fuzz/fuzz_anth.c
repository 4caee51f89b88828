/* Fuzz target: Anthropic Messages request bodies (gw_anthropic.c), as the
 * gateway rewrites them into chat requests. Byte 0 picks count_tokens ('n')
 * or /v1/messages (anything else); the rest is the body. A body is rewritten
 * or refused with LLM_EINVAL and a message; a rewritten one is a JSON object
 * the chat parser then reads (or refuses) as it reads any request. */
#include "cm_error.h"
#include "cm_oai.h"
#include "gw_anthropic.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPECT(c)                                                                                  \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_anth: %s does not hold\n", #c);                                  \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    char err[400] = "", *out = NULL;
    const char *param = NULL;
    size_t n = 0;
    int count = data[0] == 'n';
    int rc = gw_anth_request((const char *)data + 1, size - 1, count, &out, &n, err, sizeof err, &param);
    if (rc) {
        EXPECT(rc == LLM_EINVAL || rc == LLM_ENOMEM);
        EXPECT(!out && err[0] && strlen(err) < sizeof err);
        EXPECT(!param || strlen(param) < 64); /* the caller reads it after the body is gone: it must outlive it */
        return 0;
    }
    EXPECT(out && n == strlen(out));
    json_t *j = json_loadb(out, n, 0, NULL);
    EXPECT(json_is_object(j) && json_is_array(json_object_get(j, "messages")));
    json_decref(j);
    cm_oai_completion c;
    char e2[512] = "";
    const char *p2 = NULL;
    if (!cm_oai_parse_chat(out, n, &c, e2, sizeof e2, &p2)) cm_oai_completion_free(&c);
    free(out);
    return 0;
}
