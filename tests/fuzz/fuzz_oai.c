/* Fuzz target: OpenAI request bodies (cm_oai), as the gateway reads them.
 * Byte 0 picks /v1/completions ('c') or /v1/chat/completions (anything
 * else); the rest is the body. A body is parsed or refused with LLM_EINVAL
 * (or LLM_ENOMEM) and a message; a parsed one has every field in range. */
#include "cm_error.h"
#include "cm_oai.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPECT(c)                                                                                  \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_oai: %s does not hold\n", #c);                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    cm_oai_completion c;
    char err[512] = "";
    const char *param = NULL;
    const char *body = (const char *)data + 1;
    int rc = data[0] == 'c' ? cm_oai_parse_completion(body, size - 1, &c, err, sizeof err, &param)
                            : cm_oai_parse_chat(body, size - 1, &c, err, sizeof err, &param);
    if (rc) {
        EXPECT(rc == LLM_EINVAL || rc == LLM_ENOMEM);
        EXPECT(err[0] && strlen(err) < sizeof err);
        return 0;
    }
    EXPECT(c.n >= 1 && c.n <= CM_OAI_MAX_N);
    EXPECT(c.n_stop >= 0 && c.n_stop <= CM_OAI_MAX_STOP);
    EXPECT(c.n_stop_ids >= 0 && c.n_stop_ids <= CM_OAI_MAX_STOP_IDS);
    EXPECT(c.n_bias >= 0 && c.n_bias <= CM_OAI_MAX_BIAS);
    EXPECT(c.logprobs >= -1 && c.logprobs <= CM_OAI_MAX_LOGPROBS);
    EXPECT(c.max_tokens >= 0 && c.min_tokens >= 0);
    EXPECT(c.temperature >= 0 && c.top_p >= 0 && c.top_p <= 1);
    size_t acc = 0;
    for (int i = 0; i < c.n_stop; i++) acc += strlen(c.stop[i]);
    for (int i = 0; i < c.n_bias; i++) EXPECT(c.bias[i].id >= 0);
    for (int i = 0; i < c.n_prompt_ids; i++) EXPECT(c.prompt_ids[i] >= 0);
    if (c.prompt) EXPECT(strlen(c.prompt) <= c.prompt_len);
    for (int i = 0; i < c.n_messages; i++) acc += strlen(c.messages[i].role) + strlen(c.messages[i].content);
    if (c.is_chat) EXPECT(c.n_messages > 0);
    volatile size_t sink = acc;
    (void)sink;
    cm_oai_completion_free(&c);
    return 0;
}
