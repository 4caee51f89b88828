/* pr_params.h - generation parameters on the wire: the one converter each
 * way between cm_gen_params (common/base/cm_gen.h) and SamplingParams. The
 * gateway sends with to_wire, the worker reads with from_wire; nothing
 * else maps the fields. */
#ifndef PR_PARAMS_H
#define PR_PARAMS_H

#include "cm_gen.h"
#include "llmserve.pb-c.h"

#include <stddef.h>

/* Fills sp from p (strings and arrays borrowed from p). logit_bias splits
 * into two arrays: *ids and *vals are allocated (free both; NULL when
 * none). 0 or LLM_ENOMEM. */
int pr_params_to_wire(const cm_gen_params *p, Llmserve__SamplingParams *sp, int32_t **ids, float **vals);
/* Fills p from sp (NULL: the defaults); pointers borrow from sp, and the
 * logit_bias pairs go to bias[max_bias]. 0, or LLM_EINVAL with err set for
 * more pairs than fit or unequal id and value counts. */
int pr_params_from_wire(const Llmserve__SamplingParams *sp, cm_gen_params *p, cm_gen_bias *bias, int max_bias, char *err,
                        size_t errlen);

#endif
