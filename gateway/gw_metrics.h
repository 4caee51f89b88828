/* gw_metrics.h - Prometheus text: the gateway's own counters and
 * histograms (llmserve:), each worker group's numbers (llmserve:...{worker}),
 * and the gauges the Gateway API Inference Extension's model-server protocol
 * and llm-d's endpoint picker read, under vLLM's names (vllm:), summed over
 * the groups behind this gateway. A group that stopped answering counts
 * zero, never its last values. */
#ifndef GW_METRICS_H
#define GW_METRICS_H

#include "gw.h"

struct evbuffer;

void gw_metrics_init(gw_metrics *m);
/* Counts a reply's status into its class. */
void gw_metrics_status(gw_metrics *m, int status);
/* The whole exposition into a malloc'd string. */
char *gw_metrics_text(const gw *g, size_t *len);

#endif
