/* Fuzz target: the files of a Hugging Face checkpoint from an untrusted
 * source. An input that starts with '{' is a tokenizer.json: it is refused
 * with an error or makes a tokenizer that encodes, exports and imports back;
 * anything else is a safetensors file: refused, or every tensor lies inside
 * the input with exactly the bytes its shape and dtype need. */
#include "cm_error.h"
#include "cm_safetensors.h"
#include "cm_tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[600] = "";
    if (size && data[0] == '{') {
        cm_tokenizer *t;
        if (cm_tok_from_hf_json_mem((const char *)data, size, &t, err, sizeof err)) return 0;
        static const char *texts[] = {"Hello, WORLD! naïve café 数据库 [CLS] x", "", "\xff\xfe bad utf-8 \xc3"};
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
            int32_t *ids;
            size_t n;
            if (cm_tok_encode(t, texts[i], strlen(texts[i]), 1, 1, &ids, &n) == 0) {
                for (size_t k = 0; k < n; k++)
                    if (ids[k] < 0 || ids[k] >= cm_tok_vocab(t)) abort();
                free(ids);
            }
        }
        uint8_t *x;
        size_t xl;
        if (cm_tok_export(t, &x, &xl) == 0) {
            cm_tokenizer *t2;
            if (cm_tok_import(x, xl, &t2, err, sizeof err)) {
                fprintf(stderr, "fuzz_hf: an exported tokenizer does not import: %s\n", err);
                abort();
            }
            cm_tok_free(t2);
            free(x);
        }
        cm_tok_free(t);
        return 0;
    }
    cm_safetensors *s;
    if (cm_st_open_mem(data, size, &s, err, sizeof err)) return 0;
    for (size_t i = 0; i < s->n_tensors; i++) {
        const cm_st_tensor *t = &s->tensors[i];
        if ((const uint8_t *)t->data < data || (const uint8_t *)t->data + t->nbytes > data + size) abort();
        uint64_t count = 1;
        for (int d = 0; d < 4; d++) count *= t->ne[d];
        if (t->nbytes && count == 0) abort();
        if (cm_st_find(s, t->name) == NULL) abort();
    }
    cm_st_close(s);
    return 0;
}
