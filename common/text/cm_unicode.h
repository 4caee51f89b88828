/* cm_unicode.h - the few Unicode facts the tokenizer needs. */
#ifndef CM_UNICODE_H
#define CM_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* Decodes one UTF-8 sequence at s[0..n); returns its length (1..4) and the
 * code point, or length 1 and U+FFFD for an invalid or truncated sequence
 * (so every byte is consumed exactly once). */
int cm_utf8_decode(const char *s, size_t n, uint32_t *cp);
/* Encodes cp into out (4 bytes room); returns the length. */
int cm_utf8_encode(uint32_t cp, char *out);
/* Length of the longest prefix of s[0..n) that ends on a complete UTF-8
 * character (an invalid byte counts as complete). */
size_t cm_utf8_complete_prefix(const char *s, size_t n);

int cm_uni_is_letter(uint32_t cp); /* \p{L} */
int cm_uni_is_number(uint32_t cp); /* \p{N} */
int cm_uni_is_space(uint32_t cp);  /* \s: Unicode White_Space */
int cm_uni_is_punct(uint32_t cp);  /* \p{P} */
int cm_uni_is_other(uint32_t cp);  /* \p{C}: control, format, surrogate, private use, unassigned */
int cm_uni_is_mark_nonspacing(uint32_t cp); /* \p{Mn} */
/* BERT's normalizer, one code point at a time (out has room for 4):
 * the canonical decomposition (NFD) without nonspacing marks, and the
 * lowercase (full mapping, no context). Return how many code points came out. */
int cm_uni_strip_accents(uint32_t cp, uint32_t out[4]);
int cm_uni_lower(uint32_t cp, uint32_t out[4]);

#endif
