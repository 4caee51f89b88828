/* cm_oai_resp.h - OpenAI responses, stream chunks and errors, built from
 * neutral result structs.
 *
 * The gateway (HTTP, SSE) and `llmserve generate --batch` (JSONL) both
 * collect a request's output here and format it here, so the two cannot
 * drift: the same text_offset rule, the same echo, the same logprobs shapes
 * (completions: tokens / token_logprobs / top_logprobs / text_offset; chat:
 * content[] with top_logprobs[]). Text may be any bytes: invalid UTF-8
 * becomes U+FFFD in the JSON. */
#ifndef CM_OAI_RESP_H
#define CM_OAI_RESP_H

#include "cm_oai.h"
#include "cm_tokenizer.h"
#include "cm_harmony.h"
#include "cm_tools.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

enum { CM_OAI_FINISH_NONE = 0, CM_OAI_FINISH_STOP, CM_OAI_FINISH_LENGTH, CM_OAI_FINISH_ABORT };

typedef struct {
    int32_t id;
    float logprob;
} cm_oai_top;

/* One generated token's logprob and its alternatives. */
typedef struct {
    int32_t token;
    float logprob;
    int n_top;
    cm_oai_top top[CM_OAI_MAX_LOGPROBS];
    int rank;                    /* 1: the most likely token; 0: not known */
} cm_oai_lp;

typedef struct {
    char *text;                  /* whole text so far (non-streaming), with the echoed prompt first */
    size_t len, cap;
    cm_oai_lp *lp;               /* every token's logprobs (non-streaming, logprobs requested) */
    size_t *lp_offset;           /* [n_lp] text_offset of each */
    size_t n_lp, cap_lp;
    size_t offset;               /* where the next token's text starts: bytes of echo + pieces so far */
    size_t lp_text0;             /* bytes of the echoed prompt at the start of text */
    int finish;                  /* CM_OAI_FINISH_* */
    int completion_tokens;
    int role_sent;               /* streaming chat: the first delta (with the role) went out */
    cm_tools_stream ts;          /* streaming with tools (Hermes): what of the text went out as deltas */
    cm_harmony hs;               /* streaming a harmony reply: where its text so far ends */
    size_t reason_sent;          /* streaming with tools and a reasoning parser: reasoning bytes sent */
    int stop_kind, stop_val;     /* what stopped it (CM_OAI_STOP_*): the request's stop string (index) or stop token */
} cm_oai_choice;

/* vLLM's stop_reason: the stop string or stop_token_ids entry that ended a choice (null: EOS, length, ...) */
enum { CM_OAI_STOP_NONE = 0, CM_OAI_STOP_STRING = 1, CM_OAI_STOP_TOKEN = 2 };

typedef struct {
    const char *id, *model;      /* borrowed: live as long as the result */
    long created;
    int is_chat, n, logprobs, echo;
    int prompt_tokens, cached_tokens;
    int trim_policy;             /* CM_OVERFLOW_* when the history was trimmed to fit, else 0 */
    int trim_messages, trim_tokens; /* what it dropped */
    int trim_summary_tokens, trim_summary_cached; /* summarize: the summary put in its place */
    int prompt_logprobs, score_only; /* the request's */
    const int32_t *prompt;       /* borrowed: the prompt's token ids, for its logprobs */
    int n_prompt;
    cm_oai_lp *plp;              /* prompt tokens 1..n_prompt-1 (owned) */
    int n_plp;
    const cm_oai_tool *tools;    /* borrowed from the request: when set, outputs are parsed for tool calls */
    int n_tools, tool_format;     /* CM_TOOLS_* */
    char *const *stop;           /* borrowed: the request's stop strings (stop_reason names the one that matched) */
    int n_stop;
    int reasoning;               /* CM_REASON_*: chat replies split, the reasoning (harmony's analysis channel, think
                                  * tags) into the message's reasoning_content (vLLM's field), the rest its content */
    cm_oai_choice ch[CM_OAI_MAX_N];
} cm_oai_result;

/* Ready for req's choices. echo (completions): each choice starts with the
 * prompt's text, given here as bytes. */
void cm_oai_result_init(cm_oai_result *r, const cm_oai_completion *req, const char *id, const char *model, long created,
                        const char *echo_text, size_t echo_len);
void cm_oai_result_free(cm_oai_result *r);
/* Non-streaming: adds a choice's new text and its tokens' logprobs. */
int cm_oai_result_add(cm_oai_result *r, int index, const char *text, size_t len, const cm_oai_lp *lp, int n_lp,
                      const cm_tokenizer *tok);
int cm_oai_result_done(const cm_oai_result *r); /* every choice has a finish reason */
/* The prompt's logprobs (tokens 1..n-1 of prompt[0..n)), copied: echo with
 * logprobs puts them before the generated tokens', prompt_logprobs in
 * vLLM's shape; score_only (max_tokens 0) leaves the generated token out. */
int cm_oai_result_prompt(cm_oai_result *r, const int32_t *prompt, int n, const cm_oai_lp *lp, int n_lp);

/* The whole response object (chat.completion or text_completion). */
json_t *cm_oai_response_json(const cm_oai_result *r, const cm_tokenizer *tok);
/* A stream chunk for one choice's new output, or NULL when there is
 * nothing to say yet (no text, no finish, role already sent). Advances the
 * choice's offset and role state; finish is CM_OAI_FINISH_*. */
json_t *cm_oai_chunk_json(cm_oai_result *r, int index, const char *text, size_t len, const cm_oai_lp *lp, int n_lp,
                          int finish, const cm_tokenizer *tok);
/* A choice held back because tools may be called (its text is collected
 * even when streaming), as the stream chunks it makes: the content, the
 * tool calls (each whole, arguments in one piece), the finish. A new array. */
json_t *cm_oai_tool_chunks_json(const cm_oai_result *r, int index, const cm_tokenizer *tok);
/* Streaming with tools: 1 when the calls go out as they are written (the
 * Hermes format), 0 when the text is held to the end (cm_oai_tool_chunks_json). */
int cm_oai_tools_stream(const cm_oai_result *r);
/* The chunks the choice's text so far makes (content, a call's id and
 * name, argument pieces); final: the rest, and the finish (tool_calls when
 * a call was made). A new array. */
json_t *cm_oai_tool_stream_json(cm_oai_result *r, int index, int final);
/* The final usage chunk (stream_options.include_usage): empty choices. */
json_t *cm_oai_usage_chunk_json(const cm_oai_result *r);
json_t *cm_oai_usage_json(const cm_oai_result *r);

/* {"error": {message, type, param, code}}; type follows the HTTP status. */
json_t *cm_oai_error_json(int status, const char *msg, const char *param, const char *code);
const char *cm_oai_error_type(int status);
const char *cm_oai_finish_name(int finish); /* NULL for none */
/* A JSON string of arbitrary bytes. */
json_t *cm_oai_jbytes(const char *s, size_t n);

#endif
