/* cm_idmap.h - the one id map: 64-bit keys (request ids, pointers, hashes)
 * to pointers, as nng's id hash serves its sockets and pipes. Open
 * addressing with linear probing and backward-shift deletion, O(1) expected
 * per operation. Every key is allowed, 0 too; a NULL value is stored like
 * any other, so get cannot tell it from absence. */
#ifndef CM_IDMAP_H
#define CM_IDMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t *k;
    void **v;
    size_t cap, n;
    void *zero;                  /* key 0's value, when has_zero */
    int has_zero;
} cm_idmap;

int cm_idmap_put(cm_idmap *m, uint64_t key, void *val); /* replaces; LLM_ENOMEM */
void *cm_idmap_get(const cm_idmap *m, uint64_t key);
void *cm_idmap_del(cm_idmap *m, uint64_t key);          /* the value removed, or NULL */
void cm_idmap_free(cm_idmap *m);

#endif
