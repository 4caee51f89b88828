/* cm_chat.h - chat templates, built in and chosen from model metadata.
 *
 * We do not run Jinja: the families' formats are written out here and the
 * model's template text only selects one (and supplies a default system
 * prompt where the template embeds one, as SmolLM2's does). */
#ifndef CM_CHAT_H
#define CM_CHAT_H

#include <stddef.h>

enum { CM_CHAT_CHATML = 0, CM_CHAT_LLAMA2, CM_CHAT_LLAMA3, CM_CHAT_MISTRAL, CM_CHAT_GEMMA,
       CM_CHAT_HARMONY, /* OpenAI's harmony (gpt-oss): replies come as channels, split by cm_harmony.h */
       CM_CHAT_COUNT };

typedef struct {
    const char *role;    /* system | user | assistant; ipython (llama3), raw (mistral: text as is) */
    const char *content;
} cm_chat_msg;

/* Family from a template's text (NULL: ChatML). */
int cm_chat_detect(const char *tmpl);
struct cm_tokenizer;
/* The model's format: from its chat template when the metadata has one, else
 * from the turn markers its vocabulary holds as control tokens (a GGUF made
 * from a base model often carries none: Gemma's <start_of_turn>, Llama 3's
 * <|start_header_id|>), else chatml. */
int cm_chat_for(const struct cm_tokenizer *t);
/* Family by name ("chatml", "llama2", "llama3", "mistral", "gemma", "harmony"); -1 if unknown. */
int cm_chat_by_name(const char *name);
const char *cm_chat_name(int kind);
/* Renders messages; default_system (may be NULL) is used when the first
 * message is not a system one. *out is malloc'd. LLM_EINVAL on an unknown role. */
int cm_chat_render(int kind, const char *default_system, const cm_chat_msg *m, size_t n,
                   int add_generation_prompt, char **out);
/* The same with the last message, the assistant's, left open (vLLM's continue_final_message): the prompt
 * ends with its content, which the reply continues. LLM_EINVAL when the last message is not the assistant's. */
int cm_chat_render_open(int kind, const char *default_system, const cm_chat_msg *m, size_t n, char **out);
/* chat_template_kwargs.enable_thinking false, as Qwen3's template writes it: an empty think block after the
 * generation prompt of a ChatML rendering (*text grows). LLM_EINVAL for other families. */
int cm_chat_no_thinking(int kind, char **text);
/* The default system prompt embedded in a ChatML template, malloc'd, or NULL. */
char *cm_chat_default_system(const char *tmpl);

#endif
