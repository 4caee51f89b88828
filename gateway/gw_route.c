#include "gw_route.h"

#include "cm_hash.h"
#include "gw_keyset.h"
#include "gw_pool.h"

#include <stdlib.h>

/* Group i may take the request: routable, not excluded, holding its adapter. */
static int can(gw *g, int i, int exclude, const char *lora, int roles) {
    return gw_pool_routable(g, i) && i != exclude && (roles & GW_ROLE_BIT(g->w[i].kv_role)) &&
           (!lora || gw_pool_has_lora(g->w[i].loras, lora));
}

int gw_route(gw *g, const int32_t *tok, int n, uint64_t salt, int exclude, const char *lora, int roles, int *hit_tokens) {
    *hit_tokens = 0;
    int best = -1;
    double best_score = 0;
    int up = 0;
    for (int i = 0; i < g->n_workers; i++) up += can(g, i, exclude, lora, roles);
    if (!up) return -1;
    if (g->conf.routing == GW_ROUTE_ROUND_ROBIN) {
        for (int k = 0; k < g->n_workers; k++) {
            int i = (g->rr + k) % g->n_workers;
            if (can(g, i, exclude, lora, roles)) {
                g->rr = i + 1;
                return i;
            }
        }
        return -1;
    }
    /* the prompt's block keys, computed once (block size from the workers) */
    int bs = 0;
    for (int i = 0; i < g->n_workers; i++)
        if (gw_pool_routable(g, i) && g->w[i].block_size > 0) bs = g->w[i].block_size;
    int nb = g->conf.routing == GW_ROUTE_PREFIX && bs > 0 ? (n - 1) / bs : 0;
    uint64_t *keys = nb ? malloc(sizeof *keys * (size_t)nb) : NULL;
    if (!keys) nb = 0;
    uint64_t parent = CM_BLOCK_ROOT;
    for (int b = 0; b < nb; b++) keys[b] = parent = cm_block_key(parent, salt, tok + (size_t)b * bs, bs);
    for (int k = 0; k < g->n_workers; k++) {
        int i = (g->rr + k) % g->n_workers; /* ties go round the ring */
        gw_worker *w = &g->w[i];
        if (!can(g, i, exclude, lora, roles)) continue;
        /* the chain of blocks the group holds: in its pool, or in a lower tier it loads from (worth less) */
        int hit = 0;
        double worth = 0;
        for (; hit < nb; hit++) {
            if (gw_keyset_has(&w->cached, keys[hit])) worth += 1;
            else if (gw_keyset_has(&w->lower[0], keys[hit])) worth += g->conf.tier_weight[0];
            else if (gw_keyset_has(&w->lower[1], keys[hit])) worth += g->conf.tier_weight[1];
            else break;
        }
        double load = (double)(w->inflight + w->waiting);
        double score = worth * bs - g->conf.lambda * load;
        if (best < 0 || score > best_score) {
            best = i;
            best_score = score;
            *hit_tokens = hit * bs;
        }
    }
    free(keys);
    if (best >= 0) g->rr = best + 1;
    return best;
}
