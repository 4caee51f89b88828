/* gw_route.h - prefix-aware routing. The prompt's full blocks are keyed
 * exactly as workers key them (cm_block_key chain); each group's cached
 * keys come from its KvEvents, with the tier that holds each; the score is
 * the cached prefix's tokens (one in the pool counts 1, one in the memory or
 * disk tier --route-memory-tier-weight or --route-disk-tier-weight) minus
 * lambda times load (in flight + waiting). Only routable groups are picked;
 * ties go round the ring so equal groups share the load. */
#ifndef GW_ROUTE_H
#define GW_ROUTE_H

#include "gw.h"

/* A group for a prompt, or -1 when none is routable (exclude: a group not
 * to pick, or -1; lora: an adapter the group must hold, or NULL; roles: the
 * kv_roles it may have, GW_ROLE_BIT bits).
 * *hit_tokens: the cached prefix it holds. */
int gw_route(gw *g, const int32_t *tok, int n, uint64_t salt, int exclude, const char *lora, int roles, int *hit_tokens);

/* Which groups a route may pick, by their kv_role (Health): GW_ROLE_BIT(role) bits. */
#define GW_ROLE_BIT(r) (1 << (r))
#define GW_ROLES_DECODE (GW_ROLE_BIT(LLMSERVE__KV_ROLE__KV_BOTH) | GW_ROLE_BIT(LLMSERVE__KV_ROLE__KV_CONSUMER))
#define GW_ROLES_PREFILL GW_ROLE_BIT(LLMSERVE__KV_ROLE__KV_PRODUCER)

#endif
