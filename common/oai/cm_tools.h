/* cm_tools.h - tool calling: tools rendered into the prompt, the output
 * parsed back into OpenAI tool_calls, and tool_choice "required" or a named
 * function enforced with a grammar (cm_grammar) whose arguments follow each
 * function's parameters schema. Three formats, by the model's template
 * family:
 *
 * - Hermes / Qwen 2.5 (ChatML models, the default one among them; the
 *   generic fallback for the other families): the tools as JSON lines
 *   inside <tools></tools> in the system prompt, each call as
 *   {"name": ..., "arguments": {...}} inside <tool_call></tool_call>, each
 *   result inside <tool_response></tool_response> in a user turn.
 * - Llama 3.1 / 3.2 JSON tool calling (Meta's template, tools in the first
 *   user message): the tools as indented JSON after Meta's instruction, a
 *   call as {"name": ..., "parameters": {...}} (several joined by "; ",
 *   an optional <|python_tag|> first), results as ipython turns.
 * - Mistral (v3 tokenizers' control tokens): [AVAILABLE_TOOLS] [...]
 *   [/AVAILABLE_TOOLS] before the last user turn, calls as [TOOL_CALLS]
 *   [{"name": ..., "arguments": {...}, "id": 9 chars}], results as
 *   [TOOL_RESULTS] {"content": ..., "call_id": ...}[/TOOL_RESULTS]. */
#ifndef CM_TOOLS_H
#define CM_TOOLS_H

#include "cm_chat.h"
#include "cm_oai.h"

#include <jansson.h>
#include <stddef.h>

enum { CM_TOOLS_HERMES = 0, CM_TOOLS_LLAMA3, CM_TOOLS_MISTRAL };
/* The format for a chat template family (CM_CHAT_*). */
int cm_tools_format(int chat_kind);

/* The request's messages with the tools in the system prompt, assistant
 * tool calls and tool results written out, ready for cm_chat_render.
 * *msgs and every string in it are in *arena (free with cm_tools_free). */
typedef struct {
    cm_chat_msg *msgs;
    size_t n;
    char **own;
    int n_own;
} cm_tools_prompt;
int cm_tools_render(const cm_oai_completion *c, int format, const char *default_system, cm_tools_prompt *out);
void cm_tools_free(cm_tools_prompt *p);

/* GBNF for tool_choice "required" (any tool) or a named one: one call, or
 * several when parallel_tool_calls. */
int cm_tools_gbnf(const cm_oai_completion *c, int format, char **gbnf, char *err, size_t errlen);

/* The calls in a model's text: *calls an OpenAI tool_calls array (ids
 * made from seed) or NULL when there are none; *content what is left
 * outside the calls (NULL when nothing is). Calls to unknown functions and
 * unreadable JSON stay in the content. */
int cm_tools_parse(int format, const cm_oai_tool *tools, int n_tools, const char *text, size_t len,
                   unsigned long long seed, json_t **calls, char **content);

/* The id of a response's k-th call (0-based) from its seed: "call_" and 24 letters and digits. */
void cm_tools_call_id(unsigned long long seed, size_t k, char out[30]);

/* Hermes calls streamed as they are written, as OpenAI's deltas: the
 * content before a call, then the call's id and name once its name is
 * whole, then its arguments piece by piece. Feed the whole text so far
 * each time (it only grows); final once it has ended. A block that does not
 * begin {"name": ..., "arguments": {...} is held to its end and then read
 * as cm_tools_parse reads it. Content is trimmed as the parse trims it. */
enum { CM_TOOLS_EV_CONTENT = 1, CM_TOOLS_EV_CALL, CM_TOOLS_EV_ARGS };
typedef struct {
    int kind;                /* CM_TOOLS_EV_* */
    int call;                /* the call's index (CALL, ARGS) */
    const char *s;           /* CONTENT / ARGS text, CALL the name */
    size_t n;
    const char *id;          /* CALL */
} cm_tools_event;
typedef struct {
    int state, n_calls, content_sent, depth, in_str, esc;
    size_t pos, call_at, ws_a, ws_b;
} cm_tools_stream;
typedef void (*cm_tools_emit)(void *ctx, const cm_tools_event *ev);
int cm_tools_stream_feed(cm_tools_stream *st, const cm_oai_tool *tools, int n_tools, const char *text, size_t len,
                         int final, unsigned long long seed, cm_tools_emit emit, void *ctx);

#endif
