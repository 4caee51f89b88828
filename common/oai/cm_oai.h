/* cm_oai.h - OpenAI request bodies, parsed and checked.
 *
 * Both the gateway (HTTP bodies) and the offline tools (JSONL files) read
 * completion requests through here, so a parameter means the same thing
 * everywhere. Bodies are untrusted: every field is type-checked and
 * range-checked, and an error names the offending parameter (for the
 * OpenAI error body's "param"). A field OpenAI or vLLM define that is not
 * honoured is refused by name (unless it holds the one value that changes
 * nothing), as is the other endpoint's field; a name neither defines is
 * ignored (logged at debug), as vLLM does.
 * Beyond OpenAI's fields, vLLM's extras are understood: top_k, min_p,
 * repetition_penalty, min_tokens, ignore_eos, stop_token_ids, priority,
 * cache_salt; and structured outputs: response_format (json_object,
 * json_schema), vLLM's guided_json / guided_regex / guided_choice /
 * guided_grammar and structured_outputs {json, regex, choice, grammar,
 * json_object}, compiled to GBNF (cm_jsonschema.h). */
#ifndef CM_OAI_H
#define CM_OAI_H

#include "cm_gen.h"

#include <stddef.h>
#include <stdint.h>

#define CM_OAI_MAX_STOP 16
#define CM_OAI_MAX_STOP_LEN 256
#define CM_OAI_MAX_STOP_IDS 64
#define CM_OAI_MAX_BIAS 1024
#define CM_OAI_MAX_N 16
#define CM_OAI_MAX_LOGPROBS 20
#define CM_OAI_MAX_PROMPT_IDS (1 << 20)
#define CM_OAI_MAX_CHOICES 256   /* prompts x n in one request */

/* One prompt of a batch: text, or token ids. */
typedef struct {
    char *text;
    size_t len;
    int32_t *ids;
    int n_ids;
} cm_oai_prompt;

typedef cm_gen_bias cm_oai_bias;

#define CM_OAI_MAX_TOOLS 128
enum { CM_TOOL_AUTO = 0, CM_TOOL_NONE, CM_TOOL_REQUIRED, CM_TOOL_NAMED };

/* A function the model may call. */
typedef struct cm_oai_tool {
    char *name;                  /* [A-Za-z0-9_.-]{1,64} */
    char *description;           /* or NULL */
    char *parameters;            /* its JSON Schema as compact JSON, or NULL (any object) */
} cm_oai_tool;

typedef struct {
    char *model;                 /* NULL when absent */
    char *prompt;                /* text prompt (NUL-terminated), or NULL when ids are given */
    size_t prompt_len;
    int32_t *prompt_ids;         /* token id prompt */
    int n_prompt_ids;
    cm_oai_prompt *batch;        /* prompt as a list of 2 or more prompts (then prompt and prompt_ids are unset) */
    int n_batch;
    int max_tokens;              /* 0: absent (the caller picks the default) */
    int min_tokens;
    double temperature, top_p, min_p;
    int top_k;                   /* -1: off */
    double presence_penalty, frequency_penalty, repetition_penalty;
    int n;
    int logprobs;                /* -1: none */
    int prompt_logprobs;         /* -1: none; vLLM's extra (0..CM_OAI_MAX_LOGPROBS alternatives) */
    int score_only;              /* completions max_tokens 0 with echo: the prompt scored, nothing generated */
    int echo, stream, include_usage, ignore_eos;
    int has_seed;
    uint64_t seed;
    int priority;
    char *stop[CM_OAI_MAX_STOP];
    int n_stop;
    int32_t stop_ids[CM_OAI_MAX_STOP_IDS];
    int n_stop_ids;
    cm_oai_bias *bias;
    int n_bias;
    char *cache_salt;
    char *user;
    /* structured outputs: the GBNF the output must match (checked: it compiles), or NULL */
    char *grammar;
    const char *grammar_from; /* the field that asked for it (static) */
    /* chat completions */
    int is_chat;
    struct cm_oai_msg {
        char *role, *content;
        char *tool_calls;        /* an assistant's calls, as compact JSON [{name, arguments, id?}], or NULL */
        char *tool_call_id;      /* a tool result's, or NULL */
    } *messages;
    int n_messages;
    int add_generation_prompt;
    int continue_final_message;  /* vLLM's: the last message (the assistant's) left open, continued by the reply */
    int context_overflow;        /* CM_OVERFLOW_*, or -1: the server's --context-overflow (llmserve's field) */
    cm_oai_tool *tools;
    int n_tools;
    int tool_choice;             /* CM_TOOL_*; AUTO when tools are given, NONE when not */
    int tool_named;              /* CM_TOOL_NAMED: the index in tools */
    int parallel_tool_calls;     /* default 1 */
    int tool_format;             /* CM_TOOLS_* (cm_tools.h): the model's family, set by the caller after parsing */
    int reasoning;               /* CM_REASON_* (cm_harmony.h): how a chat reply splits into reasoning and content
                                  * (harmony models, --reasoning-parser); set by the caller */
    int enable_thinking;         /* chat_template_kwargs.enable_thinking: 1 (default) or 0 */
} cm_oai_completion;

/* A chat history longer than the context: refuse (400), drop the oldest
 * turns, drop the turns after the first exchange, or put the served
 * model's summary of those in their place; the system prompt and the
 * newest turns always stay. */
enum { CM_OVERFLOW_ERROR = 0, CM_OVERFLOW_TRUNCATE_LEFT = 1, CM_OVERFLOW_MIDDLE_OUT = 2, CM_OVERFLOW_SUMMARIZE = 3 };
/* "error" | "truncate-left" | "middle-out" | "summarize" -> CM_OVERFLOW_*, or -1. */
int cm_oai_overflow_parse(const char *s);
const char *cm_oai_overflow_name(int policy);

/* Parses a /v1/completions body. On error returns LLM_EINVAL with a message
 * in err and the parameter's name in *param (NULL when it is the body). */
int cm_oai_parse_completion(const char *body, size_t len, cm_oai_completion *out, char *err, size_t errlen,
                            const char **param);
/* Parses a /v1/chat/completions body: messages (content a string or an
 * array of text parts), max_completion_tokens / max_tokens, logprobs (bool)
 * + top_logprobs, and the same sampling fields. */
int cm_oai_parse_chat(const char *body, size_t len, cm_oai_completion *out, char *err, size_t errlen,
                      const char **param);
void cm_oai_completion_free(cm_oai_completion *c);
/* The request's generation parameters (pointers into c): the one mapping
 * from OpenAI's fields. max_tokens as the caller settled it (a default, the
 * context); echo with logprobs scores the prompt as prompt_logprobs does. */
void cm_oai_gen_params(const cm_oai_completion *c, int max_tokens, cm_gen_params *out);
/* A deep copy of everything but the prompt(s) and messages: one prompt of a
 * batch runs as a request of its own with these parameters. */
/* tool_choice required or named: the request's grammar, for a tool format
 * (CM_TOOLS_*; parsing makes the Hermes one), replacing the one it has. */
int cm_oai_tools_grammar(cm_oai_completion *c, int format, char *err, size_t errlen);
int cm_oai_completion_copy_params(const cm_oai_completion *src, cm_oai_completion *dst);
/* Whether s[0..n) is valid UTF-8. */
int cm_utf8_valid(const char *s, size_t n);

#endif
