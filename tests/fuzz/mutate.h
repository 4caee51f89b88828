/* mutate.h - the deterministic mutations both replay drivers apply to their
 * seeds (replay.c: wire messages built in code; replay_files.c: committed
 * corpora): bit flips, random bytes, truncation, splices of another seed, a
 * piece repeated to tens of kilobytes, huge length fields, small counts. */
#ifndef FUZZ_MUTATE_H
#define FUZZ_MUTATE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint8_t *b;
    size_t n;
} fuzz_seed;

static uint64_t fuzz_rng = 0x9e3779b97f4a7c15ull;

static inline uint32_t fuzz_rnd(void) {
    fuzz_rng ^= fuzz_rng << 13;
    fuzz_rng ^= fuzz_rng >> 7;
    fuzz_rng ^= fuzz_rng << 17;
    return (uint32_t)(fuzz_rng >> 16);
}

/* A mutant of a random seed in buf (capacity cap); returns its length. */
static inline size_t fuzz_mutate(uint8_t *buf, size_t cap, const fuzz_seed *seeds, int ns) {
    const fuzz_seed *s = &seeds[fuzz_rnd() % (uint32_t)ns];
    size_t n = s->n < cap ? s->n : cap;
    memcpy(buf, s->b, n);
    int ops = 1 + (int)(fuzz_rnd() % 4);
    for (int k = 0; k < ops; k++) {
        switch (fuzz_rnd() % 7) {
        case 0: if (n) buf[fuzz_rnd() % n] ^= (uint8_t)(1u << (fuzz_rnd() % 8)); break;
        case 1: if (n) buf[fuzz_rnd() % n] = (uint8_t)fuzz_rnd(); break;
        case 2: n = n ? fuzz_rnd() % n : 0; break; /* truncate */
        case 3: { /* splice a piece of another seed */
            const fuzz_seed *o = &seeds[fuzz_rnd() % (uint32_t)ns];
            size_t at = n ? fuzz_rnd() % n : 0, len = fuzz_rnd() % (o->n + 1);
            if (at + len < cap) {
                memcpy(buf + at, o->b + (o->n - len), len);
                if (at + len > n) n = at + len;
            }
            break;
        }
        case 4: /* a piece repeated: long inputs, where quadratic paths show */
            if (n > 1 && fuzz_rnd() % 8 == 0) {
                size_t from = fuzz_rnd() % n, len = 1 + fuzz_rnd() % (n - from < 64 ? n - from : 64);
                while (n + len <= cap && n < (32u << 10)) {
                    memmove(buf + n, buf + from, len);
                    n += len;
                }
            }
            break;
        case 5: /* a huge length or count */
            if (n > 8) memset(buf + fuzz_rnd() % (n - 7), 0xff, 4 + fuzz_rnd() % 4);
            break;
        default: /* a small integer where a count may be */
            if (n > 4) buf[fuzz_rnd() % n] = (uint8_t)(fuzz_rnd() % 4);
        }
    }
    return n;
}

#endif
