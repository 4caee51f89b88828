/* gw_keyset.h - a set of 64-bit keys (open addressing, linear probing,
 * backward-shift deletion): each worker group's cached prefix-block keys,
 * filled from its KvEvents (gw_pool) and read by the router (gw_route). */
#ifndef GW_KEYSET_H
#define GW_KEYSET_H

#include <stdint.h>

typedef struct {
    uint64_t *k; /* 0 = empty (key 0 is stored as 1) */
    uint32_t cap, n;
} gw_keyset;

/* Adding can fail only for memory; the set then stays as it was (a key the router misses). */
void gw_keyset_add(gw_keyset *s, uint64_t k);
void gw_keyset_del(gw_keyset *s, uint64_t k);
int gw_keyset_has(const gw_keyset *s, uint64_t k);
void gw_keyset_clear(gw_keyset *s);

#endif
