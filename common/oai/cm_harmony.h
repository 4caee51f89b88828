/* cm_harmony.h - a reply in OpenAI's harmony format (gpt-oss) split into its
 * reasoning and its content.
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

typedef struct {
    int state;           /* where the text so far ends: before anything, in a header, in a message */
    int reasoning;       /* the current message is on the analysis channel */
    char hold[256];      /* the header so far, or a marker's possible start */
    size_t n_hold;
} cm_harmony;

void cm_harmony_init(cm_harmony *h);
/* Adds the next piece of the reply; what it settles goes to reasoning and
 * content (appended, NUL-terminated). final: the reply has ended (whatever is
 * held is settled). 0, or LLM_ENOMEM (then either buffer's oom is set). */
int cm_harmony_feed(cm_harmony *h, const char *s, size_t n, int final, cm_hbuf *reasoning, cm_hbuf *content);
void cm_hbuf_free(cm_hbuf *b);

#endif
