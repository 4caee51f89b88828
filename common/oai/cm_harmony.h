/* cm_harmony.h - a reply split into its reasoning and its content: OpenAI's
 * harmony format (gpt-oss), or the think tags of a --reasoning-parser.
 *
 * The chat prompt ends with <|start|>assistant (cm_chat.c); the model then
 * writes messages on channels,
 *
 *   <|channel|>analysis<|message|>...<|end|>
 *   <|start|>assistant<|channel|>final<|message|>...
 *
 * (the structural tokens are shown in the output text for harmony vocabularies:
 * cm_tok_build.c). The analysis channel is the reasoning (vLLM's
 * reasoning_content); final and commentary are the content. Headers and
 * markers never reach either. A reply that does not begin with a channel
 * header is all content (a model not following the format, or one held to a
 * grammar). Text may arrive in pieces of any size: a possible marker's start
 * is held until the next piece settles it. */
#ifndef CM_HARMONY_H
#define CM_HARMONY_H

#include <stddef.h>

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} cm_hbuf;

/* What splits a reply: nothing, harmony (gpt-oss, by its chat template), or a --reasoning-parser's think tags:
 * deepseek_r1 (the reply starts in the reasoning, its template opened <think>; </think> ends it) or qwen3 (a
 * reply that starts with <think> reasons until </think>; one that does not is all content). */
enum { CM_REASON_NONE = 0, CM_REASON_HARMONY, CM_REASON_R1, CM_REASON_QWEN3 };
/* vLLM's --reasoning-parser names ("deepseek_r1", "qwen3") -> CM_REASON_*, or -1. */
int cm_reason_parser(const char *name);

typedef struct {
    int kind;            /* CM_REASON_* */
    int state;           /* where the text so far ends: before anything, in a header, in a message */
    int reasoning;       /* the current message is on the analysis channel */
    char hold[256];      /* the header so far, or a marker's possible start */
    size_t n_hold;
} cm_harmony;

void cm_harmony_init(cm_harmony *h); /* harmony */
void cm_reason_init(cm_harmony *h, int kind);
/* Adds the next piece of the reply; what it settles goes to reasoning and
 * content (appended, NUL-terminated). final: the reply has ended (whatever is
 * held is settled). 0, or LLM_ENOMEM (then either buffer's oom is set). */
int cm_harmony_feed(cm_harmony *h, const char *s, size_t n, int final, cm_hbuf *reasoning, cm_hbuf *content);
void cm_hbuf_free(cm_hbuf *b);

#endif
