#include "cm_hash.h"

#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

uint64_t cm_block_key(uint64_t parent, uint64_t salt, const int32_t *tokens, int n) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    uint8_t head[16];
    for (int i = 0; i < 8; i++) {
        head[i] = (uint8_t)(parent >> (8 * i));
        head[8 + i] = (uint8_t)(salt >> (8 * i));
    }
    XXH3_64bits_update(&st, head, sizeof head);
    uint8_t buf[256];
    size_t nb = 0;
    for (int i = 0; i < n; i++) {
        uint32_t t = (uint32_t)tokens[i];
        for (int b = 0; b < 4; b++) buf[nb++] = (uint8_t)(t >> (8 * b));
        if (nb == sizeof buf) {
            XXH3_64bits_update(&st, buf, nb);
            nb = 0;
        }
    }
    XXH3_64bits_update(&st, buf, nb);
    return XXH3_64bits_digest(&st);
}

uint64_t cm_salt_of(const char *s, size_t len) {
    return s && len ? XXH3_64bits(s, len) : 0;
}

uint64_t cm_salt_lora(uint64_t salt, const char *lora) {
    return lora && *lora ? XXH3_64bits_withSeed(lora, strlen(lora), salt ^ 0x6c6f7261ull) | 1 : salt;
}
