/* tl_common.c - the helpers the llmserve subcommands share. */
#include "tl_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *tl_read_file(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16;
    char *text = malloc(cap);
    *len = 0;
    for (size_t r; text && (r = fread(text + *len, 1, cap - *len, f)) > 0;) {
        *len += r;
        if (*len == cap) {
            char *nt = realloc(text, cap *= 2);
            if (!nt) free(text);
            text = nt;
        }
    }
    int bad = ferror(f);
    if (f != stdin) fclose(f);
    if (bad) {
        free(text);
        return NULL;
    }
    return text;
}
