/* gw_model: the tokenizer and chat template a gateway serves, shared by
 * reference count between the loop and the tokenizer threads. */
#include "cm_chat.h"
#include "cm_error.h"
#include "gw.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

gw_model *gw_model_ref(gw_model *m) {
    if (m) __atomic_add_fetch(&m->refs, 1, __ATOMIC_RELAXED);
    return m;
}

void gw_model_unref(gw_model *m) {
    if (!m || __atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL)) return;
    cm_tok_free(m->tok);
    free(m->default_system);
    free(m);
}

int gw_model_make(cm_tokenizer *tok, const char *chat_template, int override, gw_model **out, char *err, size_t errlen) {
    *out = NULL;
    gw_model *m = calloc(1, sizeof *m);
    if (!m) {
        cm_tok_free(tok);
        snprintf(err, errlen, "out of memory");
        return LLM_ENOMEM;
    }
    m->refs = 1;
    m->tok = tok;
    m->fp = cm_tok_fingerprint(tok);
    m->override = override;
    m->chat_kind = chat_template ? cm_chat_by_name(chat_template) : cm_chat_for(tok);
    if (m->chat_kind < 0) {
        snprintf(err, errlen, "unknown chat template '%s' (chatml, llama2, llama3, mistral, gemma, harmony)", chat_template);
        gw_model_unref(m);
        return LLM_EINVAL;
    }
    m->default_system = cm_chat_default_system(cm_tok_chat_template(tok));
    *out = m;
    return 0;
}
