/* wk_server.h - the worker's RPC loop: NNG pipelines in front of the engine.
 *
 * One PULL socket at --listen takes Hello / Generate / Cancel /
 * StatsRequest from any number of gateways. Each gateway announces its own
 * PULL address in Hello; the worker dials it with a PUSH socket and sends
 * that gateway its TokenChunks, Health answers and KvEvents. One thread runs
 * everything: receive what arrived, run one engine step, send what it
 * produced, so a cancel takes effect at the next step.
 *
 * Liveness: gateways repeat Hello every second; one silent for
 * heartbeat_timeout_ms is dropped and its requests are aborted. The worker
 * answers every Hello with Health, which is how gateways notice a dead
 * worker; each Health carries the process's random incarnation, so a
 * restarted worker on the same address is told apart from the old one, and
 * the tokenizer's fingerprint: a gateway that lacks it asks ModelInfo, which
 * carries the whole tokenizer (gateways need no model file). Back-pressure: at most max_waiting requests wait; more are refused
 * at once (LLM_EAGAIN, "overloaded"). A gateway that stops reading until its
 * send buffer is full loses its requests (aborted), not the worker's memory. */
#ifndef WK_SERVER_H
#define WK_SERVER_H

#include "wk_bert.h"
#include "wk_engine.h"
#include "wk_health.h"

#include <signal.h>

typedef struct {
    const char *listen;          /* tcp://HOST:PORT or ipc://PATH */
    const char *worker_id;
    const char *model_name;
    int heartbeat_timeout_ms;    /* default 5000 */
    int max_waiting;             /* default 1024 */
    int send_buffer;             /* messages per gateway, default 8192 */
    int tp_size;
    int shutdown_timeout_ms;     /* drain limit after *stop (default 30000; 0: abort at once) */
    wk_health *health;           /* probes (--health-port), or NULL: told of each pass and of ready/draining */
    int warmup;                  /* run one short request through the engine before taking any */
    int kv_role;                 /* WK_KV_*: disaggregated prefill and decode (--kv-transfer-config); Health says it */
} wk_server_opts;

/* --kv-transfer-config (vLLM's names): what a group takes in disaggregated prefill and decode. */
enum { WK_KV_BOTH = 0, WK_KV_PRODUCER = 1, WK_KV_CONSUMER = 2 };
/* '{"kv_role": "kv_producer|kv_consumer|kv_both", "kv_buffer_size": BYTES}': any other key is refused by name.
 * *buffer is left alone when the text does not set it. 0 or LLM_EINVAL with the reason. */
int wk_kv_transfer_config_parse(const char *text, int *role, size_t *buffer, char *err, size_t errlen);
const char *wk_kv_role_name(int role);

/* Warms the engine up first when asked (one short request: the device's
 * first kernels and the step cost model are ready before any client waits
 * on them), then listens. Serves until *stop becomes non-zero, then drains: Health says not ready,
 * new requests are refused (retryable), running ones finish within
 * shutdown_timeout_ms and are then aborted; *stop > 1 ends the drain at
 * once. 0 after a drain, or an error (binding the address, the engine). */
int wk_server_run(wk_engine *e, const wk_server_opts *o, volatile sig_atomic_t *stop, char *err, size_t errlen);
/* The same for an embedding group: Embed requests (continuous batching,
 * wk_embed.h) answered with EmbedResult; Health and ModelInfo say
 * TASK_EMBED and the vectors' length; a Generate is refused. */
int wk_server_run_embed(wk_encoder *enc, const wk_server_opts *o, volatile sig_atomic_t *stop, char *err,
                        size_t errlen);

#endif
