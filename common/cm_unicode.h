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

#endif
