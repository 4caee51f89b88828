/* cm_hash.h - the prefix-cache block key, shared by workers (which cache
 * blocks under it) and gateways (which route by it): both must compute
 * exactly the same value for the same tokens. */
#ifndef CM_HASH_H
#define CM_HASH_H

#include <stddef.h>
#include <stdint.h>

/* Parent key of a sequence's first block. */
#define CM_BLOCK_ROOT 0x6c6c6d7365727665ull

/* Key of a full block: XXH3-64 over (parent key, salt, the block's token ids
 * as little-endian int32). salt isolates tenants (cache_salt) and anything
 * else that changes the K/V of the same tokens (LoRA, a model revision). */
uint64_t cm_block_key(uint64_t parent, uint64_t salt, const int32_t *tokens, int n);

/* 64-bit salt of a cache_salt string (0 for none / empty). */
uint64_t cm_salt_of(const char *s, size_t len);
/* The salt of a request of LoRA adapter `lora` (NULL: salt itself): its K/V are the adapter's, so no prefix
 * is shared with the base model's or another adapter's. Gateway (routing) and worker (cache) agree on it. */
uint64_t cm_salt_lora(uint64_t salt, const char *lora);

#endif
