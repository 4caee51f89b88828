/* Fuzz target: chat template selection and rendering (cm_chat). Byte 0
 * picks the family, byte 1 bit 0 add_generation_prompt; then messages, each
 * a role byte and its text, separated by 0x01; after a 0x02, the rest is a
 * model's template text (detected, and its default system prompt taken).
 * Rendering either succeeds with every message's text in the output, or
 * refuses an unknown role with LLM_EINVAL. The same text, read as a model's
 * output, is parsed for tool calls in each format (cm_tools): every call
 * found names a known tool and carries string arguments. */
#include "cm_chat.h"
#include "cm_error.h"
#include "cm_tools.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int kind = data[0] % CM_CHAT_COUNT, gen = data[1] & 1;
    char *s = malloc(size - 1);
    if (!s) return 0;
    memcpy(s, data + 2, size - 2);
    s[size - 2] = 0;
    size_t len = strlen(s); /* texts stop at a NUL, as C strings */
    char *tmpl = memchr(s, 2, len);
    if (tmpl) *tmpl++ = 0;
    static const char *roles[] = {"system", "user", "assistant", "tool", "ipython", "raw"};
    cm_chat_msg m[64];
    size_t n = 0;
    for (char *p = s; p && *p && n < 64;) {
        char *next = strchr(p, 1);
        if (next) *next++ = 0;
        m[n].role = roles[(unsigned char)p[0] % 6];
        m[n].content = p + 1;
        n++;
        p = next;
    }
    char *sys = tmpl ? cm_chat_default_system(tmpl) : NULL;
    int k2 = tmpl ? cm_chat_detect(tmpl) : kind;
    if (k2 < 0 || k2 >= CM_CHAT_COUNT) abort();
    char *out = NULL;
    int rc = cm_chat_render(kind, sys, m, n, gen, &out);
    if (rc == 0) {
        for (size_t i = 0; i < n; i++)
            if (!strstr(out, m[i].content)) { /* every message is in the prompt */
                fprintf(stderr, "fuzz_chat: message %zu missing from the rendered prompt\n", i);
                abort();
            }
        free(out);
    } else if (rc != LLM_EINVAL) {
        abort();
    }
    static const cm_oai_tool tools[2] = {{"get_weather", NULL, NULL}, {"add", NULL, NULL}};
    for (int f = CM_TOOLS_HERMES; f <= CM_TOOLS_MISTRAL; f++) {
        json_t *calls;
        char *content;
        if (cm_tools_parse(f, tools, 2, (const char *)data + 2, size - 2, 1, &calls, &content)) abort();
        for (size_t k = 0; k < json_array_size(calls); k++) {
            json_t *fn = json_object_get(json_array_get(calls, k), "function");
            const char *name = json_string_value(json_object_get(fn, "name"));
            if (!name || (strcmp(name, "get_weather") && strcmp(name, "add")) || !json_is_string(json_object_get(fn, "arguments")))
                abort();
        }
        json_decref(calls);
        free(content);
    }
    free(sys);
    free(s);
    return 0;
}
