/* Fuzz target: the grammar reader and matcher (cm_grammar) and the schema
 * and regex compilers (cm_jsonschema). Byte 0 picks the input: 0 GBNF, 1 a
 * JSON Schema, 2 a regex; the text runs to the first 0x00, the bytes after
 * it are fed to a parse one at a time. What must hold: the compilers' GBNF
 * always reads (short of the size limits); a refused byte leaves the parse
 * as it was; allows() agrees with feed(); a clone follows the same path;
 * nothing leaks or reads out of bounds (ASan). */
#include "cm_error.h"
#include "cm_grammar.h"
#include "cm_jsonschema.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 65536) return 0;
    int mode = data[0] % 3;
    const uint8_t *text = data + 1, *sep = memchr(text, 0, size - 1);
    size_t tl = sep ? (size_t)(sep - text) : size - 1;
    const uint8_t *feed = sep ? sep + 1 : data + size;
    size_t fl = (size_t)(data + size - feed);
    char *gbnf = NULL, err[400];
    int generated = 0;
    if (mode == 0) {
        gbnf = malloc(tl + 1);
        if (!gbnf) return 0;
        memcpy(gbnf, text, tl);
        gbnf[tl] = 0;
    } else if (mode == 1) {
        json_t *s = json_loadb((const char *)text, tl, JSON_DECODE_ANY, NULL);
        if (!s) return 0;
        int rc = cm_schema_gbnf(s, &gbnf, err, sizeof err);
        json_decref(s);
        if (rc) {
            if (rc != LLM_EINVAL && rc != LLM_ENOMEM) abort();
            return 0;
        }
        generated = 1;
    } else {
        int rc = cm_regex_gbnf((const char *)text, tl, &gbnf, err, sizeof err);
        if (rc) {
            if (rc != LLM_EINVAL && rc != LLM_ENOMEM) abort();
            return 0;
        }
    }
    cm_grammar *g = NULL;
    int rc = cm_grammar_parse(gbnf, strlen(gbnf), &g, err, sizeof err);
    if (rc && generated && !strstr(err, "more than") && !strstr(err, "too large")) {
        fprintf(stderr, "fuzz_grammar: the schema compiler wrote GBNF that does not read: %s\n%s\n", err, gbnf);
        abort();
    }
    free(gbnf);
    if (rc) return 0;
    cm_gstate *s = NULL, *c = NULL;
    if (cm_gstate_new(g, &s) || cm_gstate_clone(s, &c)) goto done;
    for (size_t i = 0; i < fl && i < 4096; i++) {
        int allows = cm_gstate_allows(s, feed + i, 1), was = cm_gstate_complete(s), done = cm_gstate_done(s);
        int r1 = cm_gstate_feed(s, feed + i, 1), r2 = cm_gstate_feed(c, feed + i, 1);
        if (r1 == LLM_ENOMEM || r2 == LLM_ENOMEM) break;
        if ((r1 == 0) != allows || r1 != r2) abort();
        if (r1 && (cm_gstate_complete(s) != was || cm_gstate_done(s) != done)) abort(); /* unchanged */
        if (!r1 && cm_gstate_complete(s) != cm_gstate_complete(c)) abort();
        if (done && !r1) abort(); /* nothing may follow a finished parse */
    }
done:
    cm_gstate_free(s);
    cm_gstate_free(c);
    cm_grammar_free(g);
    return 0;
}
