#include "cm_gen.h"

#include <string.h>

void cm_gen_params_default(cm_gen_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = p->top_p = p->repetition_penalty = 1.f;
    p->top_k = -1;
    p->n = 1;
    p->logprobs = p->prompt_logprobs = -1;
}
