/* gw_pool.h - the worker groups behind a gateway: NNG sockets, the Hello /
 * Health heartbeat, backoff for dead groups, DNS discovery, the ModelInfo
 * handshake that hands the gateway its tokenizer, and incarnations.
 *
 * A group is routable when it is alive (Health within GW_LIVENESS_S), ready
 * (not loading or draining) and accepted (same model name and tokenizer as
 * this gateway serves). When a group stops answering, or answers as a new
 * incarnation, every request it held is handed up at once
 * (gw_pool_ops.on_lost): within the heartbeat window, never an idle
 * timeout. */
#ifndef GW_POOL_H
#define GW_POOL_H

#include "gw.h"

#define GW_LIVENESS_S 3.0
/* A gateway keeps the model it serves while an accepted group is alive and
 * this long after the last one was: a group with another tokenizer is
 * refused meanwhile, and only then may the gateway follow it (a whole
 * cluster moved to a new model under the same name). */
#define GW_MODEL_HOLD_S 30.0

/* What the pool hands up, registered by its owner (gw_life), as gw_http
 * takes its handler: the pool never names the modules above it. */
typedef struct gw_pool_ops {
    void (*on_chunk)(gw *g, const Llmserve__TokenChunk *c);         /* a generation's tokens or its end */
    void (*on_embed_result)(gw *g, const Llmserve__EmbedResult *r); /* an embedding request's vectors or error */
    void (*on_lost)(gw *g, int i, const char *why);                 /* group i died, restarted or changed: every
                                                                     * request it held moves or ends now */
    void (*on_lora_result)(gw *g, int i, const Llmserve__LoraUpdateResult *r); /* group i did a LoraUpdate
                                                                     * (its adapter list is taken already) */
} gw_pool_ops;

int gw_pool_start(gw *g, const gw_pool_ops *ops, char *err, size_t errlen);
void gw_pool_stop(gw *g);
int gw_pool_routable(const gw *g, int i);          /* a generation group */
int gw_pool_routable_embed(const gw *g, int i);    /* an embedding group */
/* Sends an envelope to group i without blocking: 0 or LLM_EAGAIN / LLM_EIO. */
int gw_pool_send(gw *g, int i, pr_env *e);
void gw_pool_cancel(gw *g, int i, uint64_t rid);
int gw_pool_count_up(const gw *g);
/* Groups of --workers not yet settled (their model accepted or refused): still loading, or not reached yet.
 * 0 with --workers-dns (a group found later is a scale-up, not a start). */
int gw_pool_count_loading(const gw *g);

/* NAME is on a "\nNAME\nNAME\n" list (gw_worker.loras, gw.loras). */
int gw_pool_has_lora(const char *list, const char *name);

#endif
