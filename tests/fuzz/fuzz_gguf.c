/* Fuzz target: model files from an untrusted source: GGUF (header,
 * metadata, tensor table, the tokenizer in it, the model config) and
 * llama2.c checkpoints, through cm_model_open_mem as the worker loads them.
 * Every input is refused with an error that names it, or opens into tensors
 * that all lie inside the input. */
#include "cm_error.h"
#include "cm_gguf.h"
#include "cm_model.h"
#include "cm_tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[600] = "";
    cm_gguf *g;
    if (cm_gguf_open_mem(data, size, &g, err, sizeof err) == 0) {
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const cm_gguf_tensor *t = &g->tensors[i];
            if ((const uint8_t *)t->data < data || (const uint8_t *)t->data + t->nbytes > data + size) abort();
        }
        cm_tokenizer *tok;
        if (cm_tok_from_gguf(g, &tok, err, sizeof err) == 0) {
            int32_t *ids;
            size_t n;
            if (cm_tok_encode(tok, "Hello world <s> 123", 19, 1, 1, &ids, &n) == 0) free(ids);
            uint8_t *x;
            size_t xl;
            if (cm_tok_export(tok, &x, &xl) == 0) { /* its export reads back */
                cm_tokenizer *t2;
                if (cm_tok_import(x, xl, &t2, err, sizeof err)) {
                    fprintf(stderr, "fuzz_gguf: an exported tokenizer does not import: %s\n", err);
                    abort();
                }
                cm_tok_free(t2);
                free(x);
            }
            cm_tok_free(tok);
        }
        cm_gguf_close(g);
    }
    cm_model_file *m;
    int rc = cm_model_open_mem(data, size, "fuzz-input", &m, err, sizeof err);
    if (rc == 0) {
        for (size_t i = 0; i < m->n_tensors; i++) {
            const cm_tensor_ref *t = &m->tensors[i];
            if (t->data && ((const uint8_t *)t->data < data || (const uint8_t *)t->data + t->nbytes > data + size)) {
                fprintf(stderr, "fuzz_gguf: tensor %s lies outside the file\n", t->name);
                abort();
            }
        }
        cm_model_close(m);
    } else if (!strstr(err, "fuzz-input")) {
        fprintf(stderr, "fuzz_gguf: an error that does not name the file: %s\n", err);
        abort();
    }
    return 0;
}
