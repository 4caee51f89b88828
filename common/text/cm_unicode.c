#include "cm_unicode.h"
#include "cm_unicode_data.h"

int cm_utf8_decode(const char *str, size_t n, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)str;
    unsigned c = s[0];
    int len;
    uint32_t v, min;
    if (c < 0x80) { *cp = c; return 1; }
    if ((c & 0xe0) == 0xc0) { len = 2; v = c & 0x1f; min = 0x80; }
    else if ((c & 0xf0) == 0xe0) { len = 3; v = c & 0x0f; min = 0x800; }
    else if ((c & 0xf8) == 0xf0) { len = 4; v = c & 0x07; min = 0x10000; }
    else goto bad;
    if ((size_t)len > n) goto bad;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) goto bad;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) goto bad;
    *cp = v;
    return len;
bad:
    *cp = 0xfffd;
    return 1;
}

int cm_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = (unsigned char)(0xc0 | (cp >> 6)); o[1] = (unsigned char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

size_t cm_utf8_complete_prefix(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    /* look back at most 3 bytes for the start of a trailing partial sequence */
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned c = s[n - back];
        if ((c & 0xc0) == 0x80) continue; /* continuation byte */
        int need = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 1;
        return (size_t)need > back ? n - back : n;
    }
    return n;
}

static int in_ranges(const uint32_t (*r)[2], int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid][0]) hi = mid - 1;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

int cm_uni_is_letter(uint32_t cp) {
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return in_ranges(cm_uni_letter, (int)(sizeof cm_uni_letter / sizeof cm_uni_letter[0]), cp);
}

int cm_uni_is_number(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return in_ranges(cm_uni_number, (int)(sizeof cm_uni_number / sizeof cm_uni_number[0]), cp);
}

int cm_uni_is_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

#define NRANGES(t) ((int)(sizeof t / sizeof t[0]))

int cm_uni_is_punct(uint32_t cp) { return in_ranges(cm_uni_punct, NRANGES(cm_uni_punct), cp); }
int cm_uni_is_other(uint32_t cp) { return in_ranges(cm_uni_other, NRANGES(cm_uni_other), cp); }
int cm_uni_is_mark_nonspacing(uint32_t cp) { return in_ranges(cm_uni_mn, NRANGES(cm_uni_mn), cp); }

/* A row of a generated {cp, offset, length} map, or -1. */
static int map_find(const uint32_t (*m)[3], int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < m[mid][0]) hi = mid - 1;
        else if (cp > m[mid][0]) lo = mid + 1;
        else return mid;
    }
    return -1;
}

int cm_uni_strip_accents(uint32_t cp, uint32_t out[4]) {
    if (cp < 0x80) {
        out[0] = cp;
        return 1;
    }
    if (cp >= 0xAC00 && cp <= 0xD7A3) { /* Hangul syllable: L V (T) jamo, by the Unicode rule */
        uint32_t s = cp - 0xAC00, t = s % 28;
        out[0] = 0x1100 + s / (21 * 28);
        out[1] = 0x1161 + (s % (21 * 28)) / 28;
        if (t) out[2] = 0x11A7 + t;
        return t ? 3 : 2;
    }
    if (cm_uni_is_mark_nonspacing(cp)) return 0;
    int r = map_find(cm_uni_strip_map, NRANGES(cm_uni_strip_map), cp);
    if (r < 0) {
        out[0] = cp;
        return 1;
    }
    for (uint32_t i = 0; i < cm_uni_strip_map[r][2]; i++) out[i] = cm_uni_strip_map_pool[cm_uni_strip_map[r][1] + i];
    return (int)cm_uni_strip_map[r][2];
}

int cm_uni_lower(uint32_t cp, uint32_t out[4]) {
    if (cp < 0x80) {
        out[0] = cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
        return 1;
    }
    int r = map_find(cm_uni_lower_map, NRANGES(cm_uni_lower_map), cp);
    if (r < 0) {
        out[0] = cp;
        return 1;
    }
    for (uint32_t i = 0; i < cm_uni_lower_map[r][2]; i++) out[i] = cm_uni_lower_map_pool[cm_uni_lower_map[r][1] + i];
    return (int)cm_uni_lower_map[r][2];
}
