/* cm_tools.h - tool calling: tools rendered into the prompt, the output
 * parsed back into OpenAI tool_calls, and tool_choice "required" or a named
 * function enforced with a grammar (cm_grammar) whose arguments follow each
 * function's parameters schema.
 *
 * The format is Hermes / Qwen 2.5's, which ChatML models (the default one
 * among them) follow: the tools as JSON inside <tools></tools> in the
 * system prompt, each call as {"name": ..., "arguments": {...}} inside
 * <tool_call></tool_call>, each result inside <tool_response></tool_response>
 * in a user turn. Other families get the same text as a generic fallback
 * (their native formats, Llama 3's JSON calls and Mistral's [TOOL_CALLS],
 * are not written yet). */
#ifndef CM_TOOLS_H
#define CM_TOOLS_H

#include "cm_chat.h"
#include "cm_oai.h"

#include <jansson.h>
#include <stddef.h>

/* The request's messages with the tools in the system prompt, assistant
 * tool calls and tool results written out, ready for cm_chat_render.
 * *msgs and every string in it are in *arena (free with cm_tools_free). */
typedef struct {
    cm_chat_msg *msgs;
    size_t n;
    char **own;
    int n_own;
} cm_tools_prompt;
int cm_tools_render(const cm_oai_completion *c, const char *default_system, cm_tools_prompt *out);
void cm_tools_free(cm_tools_prompt *p);

/* GBNF for tool_choice "required" (any tool) or a named one: one call, or
 * several when parallel_tool_calls. */
int cm_tools_gbnf(const cm_oai_completion *c, char **gbnf, char *err, size_t errlen);

/* The calls in a model's text: *calls an OpenAI tool_calls array (ids
 * made from seed) or NULL when there are none; *content what is left
 * outside the calls (NULL when nothing is). Calls to unknown functions and
 * unreadable JSON stay in the content. */
int cm_tools_parse(const cm_oai_tool *tools, int n_tools, const char *text, size_t len, unsigned long long seed,
                   json_t **calls, char **content);

#endif
