/* Fuzz target: the files of a Hugging Face checkpoint from an untrusted
 * source. An input that starts with '{' is a tokenizer.json: it is refused
 * with an error or makes a tokenizer that encodes, exports and imports back;
 * anything else is a safetensors file: refused, or every tensor lies inside
 * the input with exactly the bytes its shape and dtype need; its AWQ / GPTQ
 * layers ("x.qweight", "x.qzeros", "x.scales", "x.g_idx") are converted
 * under each config: refused, or blocks of the size their shape needs and a
 * permutation of the inputs. */
#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_hf_quant.h"
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
    /* every quantized layer the file holds, under GPTQ and AWQ configs */
    static const cm_hfq_config cfgs[] = {{CM_HFQ_GPTQ, 4, 32, 0}, {CM_HFQ_GPTQ, 8, 0, 1}, {CM_HFQ_GPTQ, 4, 64, 1},
                                         {CM_HFQ_AWQ, 4, 32, 1}, {CM_HFQ_AWQ, 4, 0, 1}};
    for (size_t i = 0; i < s->n_tensors; i++) {
        char base[256], b2[256];
        if (cm_hfq_part(s->tensors[i].name, base, sizeof base) != CM_HFQ_QWEIGHT) continue;
        const cm_st_tensor *parts[CM_HFQ_NPARTS] = {0};
        for (size_t j = 0; j < s->n_tensors; j++) {
            int p = cm_hfq_part(s->tensors[j].name, b2, sizeof b2);
            if (p >= 0 && !strcmp(b2, base)) parts[p] = &s->tensors[j];
        }
        for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
            cm_tensor_ref w, perm;
            void *bw, *bp;
            if (cm_hfq_convert(&cfgs[c], parts, "blk.0.attn_q.weight", &w, &perm, &bw, &bp, err, sizeof err)) {
                if (bw || bp || !err[0]) abort();
                continue;
            }
            if (w.nbytes != cm_dtype_row_bytes(w.type, w.ne[0]) * w.ne[1]) abort();
            if (perm.data) {
                uint8_t *seen = calloc(w.ne[0], 1);
                for (uint64_t k = 0; k < w.ne[0]; k++) {
                    int32_t v = ((const int32_t *)perm.data)[k];
                    if (v < 0 || (uint64_t)v >= w.ne[0] || seen[v]++) abort();
                }
                free(seen);
            }
            free(bw);
            free(bp);
        }
    }
    cm_st_close(s);
    return 0;
}
