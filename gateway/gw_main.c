/* llmserve-gateway: the OpenAI API in front of worker groups.
 *
 * The modules, along a request's flow: gw_conf (flags), gw_http (the only
 * evhttp user), gw_auth, gw_limit, gw_oai (handlers; preparation on
 * gw_tokq's threads), gw_req (a request's life), gw_route, gw_pool (worker
 * sockets, heartbeats, ModelInfo, incarnations), gw_metrics. This file
 * parses the flags and turns signals into a drain (gw_life). */
#include "cm_error.h"
#include "cm_log.h"
#include "gw.h"
#include "gw_http.h"
#include "gw_life.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static void on_signal(evutil_socket_t sig, short what, void *arg) {
    (void)what;
    gw_drain(arg, (int)sig);
}

int main(int argc, char **argv) {
    gw *g = calloc(1, sizeof *g);
    if (!g) return 1;
    int ret = 1;
    char err[600] = "";
    struct event *sigs[2] = {0};
    int rc = gw_conf_parse(&g->conf, argc, argv);
    if (rc) {
        gw_conf_free(&g->conf);
        free(g);
        return rc == 1 ? 0 : 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if ((rc = gw_start(g, err, sizeof err))) {
        fprintf(stderr, "llmserve-gateway: %s\n", err);
        ret = rc == LLM_EINVAL ? 2 : 1;
        goto out;
    }
    sigs[0] = evsignal_new(g->base, SIGINT, on_signal, g);
    sigs[1] = evsignal_new(g->base, SIGTERM, on_signal, g);
    for (int i = 0; i < 2; i++)
        if (sigs[i]) event_add(sigs[i], NULL);
    CM_INFO("gateway on http://%s:%d, %d worker group(s), replies at %s; model %s", g->conf.host, gw_http_port(g->http),
            g->n_workers, g->reply, g->model ? g->served : "from the workers' handshake");
    event_base_dispatch(g->base);
    CM_INFO("gateway stopped");
    ret = 0;
out:
    for (int i = 0; i < 2; i++)
        if (sigs[i]) event_free(sigs[i]);
    gw_stop(g);
    free(g);
    nng_fini(); /* the closed sockets' queued messages are freed on nng's reaper thread: let it finish */
    return ret;
}
