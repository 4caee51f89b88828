/* gw_lora.h - LoRA adapters loaded and unloaded at run time, as vLLM's
 * POST /v1/load_lora_adapter {"lora_name", "lora_path"} and POST
 * /v1/unload_lora_adapter {"lora_name"}: the update goes to every
 * generation group (each loads the PEFT directory from its own file system,
 * on all its tensor-parallel ranks), and the client's answer waits for all
 * of them. The groups' adapter lists (gw_worker.loras) change with their
 * answers here, and with Health's lora_version everywhere else, so other
 * gateways learn of it within a heartbeat. */
#ifndef GW_LORA_H
#define GW_LORA_H

#include "gw.h"
#include "gw_http.h"
#include "pr_wire.h"

/* An authorized POST to either endpoint (unload: the second). */
void gw_lora_handle(gw *g, gw_http_req *r, int unload);
/* Group i's answer (gw_pool_ops.on_lora_result). */
void gw_lora_on_result(gw *g, int i, const Llmserve__LoraUpdateResult *r);
/* Answers every update still waiting with 503 and frees it (shutdown). */
void gw_lora_fail_all(gw *g);

#endif
