/* gw_map.h - a map from 64-bit keys (request ids, pointers) to pointers:
 * open addressing with linear probing and backward-shift deletion, O(1)
 * expected per operation. Key 0 is reserved. */
#ifndef GW_MAP_H
#define GW_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t *k;
    void **v;
    size_t cap, n;
} gw_map;

int gw_map_put(gw_map *m, uint64_t key, void *val); /* replaces; LLM_ENOMEM */
void *gw_map_get(const gw_map *m, uint64_t key);
void *gw_map_del(gw_map *m, uint64_t key);          /* the value removed, or NULL */
void gw_map_free(gw_map *m);

#endif
