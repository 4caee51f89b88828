/* llmserve quantize: a GGUF file into another of a lower precision.
 *
 * Metadata is copied as it is (general.file_type and
 * general.quantization_version rewritten); every 2-D weight matrix goes to
 * the target type; vectors (norms, biases) stay as they are. As llama.cpp
 * does, the token embedding and the LM head keep a safer type (--output-type,
 * default Q6_K, Q8_0 where a row is not whole super-blocks), the "_M" mixes
 * keep attn_v and ffn_down a step higher, and a K-quant falls back to a
 * 32-block type for a tensor whose rows are not whole 256-blocks (Gemma 3
 * 270M's dim 640). A quantized source is dequantized first (requantizing
 * compounds the errors: a warning says so). An importance matrix (llmserve
 * imatrix) weighs each column's error by its mean squared activation. */
#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_gguf.h"
#include "cm_parse.h"
#include "cm_quant.h"
#include "cm_quantize.h"
#include "kernels.h"
#include "tl_common.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* llama.cpp's general.file_type numbers (llama_ftype) */
static const struct {
    const char *name;
    int type, ftype, mix; /* mix: attn_v / ffn_down a step up */
} kinds[] = {
    {"F32", CM_F32, 0, 0},     {"F16", CM_F16, 1, 0},       {"BF16", CM_BF16, 32, 0},   {"Q8_0", CM_Q8_0, 7, 0},
    {"Q6_K", CM_Q6_K, 18, 0},  {"Q5_K_M", CM_Q5_K, 17, 1},  {"Q5_K_S", CM_Q5_K, 16, 0}, {"Q5_1", CM_Q5_1, 9, 0},
    {"Q5_0", CM_Q5_0, 8, 0},   {"Q4_K_M", CM_Q4_K, 15, 1},  {"Q4_K_S", CM_Q4_K, 14, 0}, {"Q4_1", CM_Q4_1, 3, 0},
    {"Q4_0", CM_Q4_0, 2, 0},   {"Q3_K_M", CM_Q3_K, 12, 1},  {"Q3_K_S", CM_Q3_K, 11, 0}, {"Q2_K", CM_Q2_K, 10, 1},
};
#define N_KINDS ((int)(sizeof kinds / sizeof *kinds))

static void help(FILE *f) {
    fprintf(f, "usage: llmserve quantize IN.gguf OUT.gguf --type T [flags]\n"
               "  --type T           F32 F16 BF16 Q8_0 Q6_K Q5_K_M Q5_K_S Q5_1 Q5_0 Q4_K_M Q4_K_S Q4_1 Q4_0\n"
               "                     Q3_K_M Q3_K_S Q2_K\n"
               "  --output-type T    token embedding and LM head (default Q6_K, or Q8_0 where rows are not\n"
               "                     whole 256-blocks; the target itself for F32/F16/BF16/Q8_0)\n"
               "  --imatrix FILE     importance matrix from 'llmserve imatrix': weighs each column's error\n"
               "  --threads N        threads (default: all CPUs)\n"
               "The _M mixes keep attn_v and ffn_down a step higher (Q4_K_M, Q5_K_M: Q6_K; Q3_K_M: Q5_K and\n"
               "Q4_K; Q2_K: Q3_K). A K-quant tensor whose rows are not whole 256-blocks falls back to Q5_0\n"
               "(Q2_K..Q4_K), Q5_1 (Q5_K) or Q8_0 (Q6_K).\n");
}

static int by_name(const char *s) {
    for (int i = 0; i < N_KINDS; i++)
        if (!strcasecmp(s, kinds[i].name)) return i;
    return -1;
}

static int ends_with(cm_str s, const char *suf) {
    size_t n = strlen(suf);
    return s.len >= n && !memcmp(s.ptr + s.len - n, suf, n);
}

static int contains(cm_str s, const char *sub) {
    size_t n = strlen(sub);
    for (size_t i = 0; i + n <= s.len; i++)
        if (!memcmp(s.ptr + i, sub, n)) return 1;
    return 0;
}

/* The type tensor t gets. A MoE router (ffn_gate_inp) keeps its own, as llama.cpp keeps it: tiny, and its
 * rounding would move tokens between experts. */
static int pick_type(const cm_gguf_tensor *t, int kind, int out_type) {
    if (t->n_dims < 2 || !ends_with(t->name, ".weight") || t->ne[0] % 32 || ends_with(t->name, ".ffn_gate_inp.weight"))
        return t->type;
    if (!(t->type == CM_F32 || t->type == CM_F16 || t->type == CM_BF16 || cm_quant_known(t->type))) return t->type;
    int type = kinds[kind].type;
    if (cm_str_eq(t->name, "token_embd.weight") || cm_str_eq(t->name, "output.weight")) type = out_type;
    else if (kinds[kind].mix && (ends_with(t->name, ".attn_v.weight") || contains(t->name, ".ffn_down"))) {
        /* ffn_down: a dense layer's, the merged experts' (ffn_down_exps) and each expert's (ffn_down.E) */
        int v = ends_with(t->name, ".attn_v.weight");
        type = type == CM_Q4_K || type == CM_Q5_K ? CM_Q6_K : type == CM_Q3_K ? (v ? CM_Q5_K : CM_Q4_K) : CM_Q3_K;
    }
    if (cm_dtype_block(type) == 256 && t->ne[0] % 256)
        type = type == CM_Q6_K ? CM_Q8_0 : type == CM_Q5_K ? CM_Q5_1 : CM_Q5_0;
    return type;
}

/* Row r of a tensor as floats. */
static void read_row(const cm_gguf_tensor *t, int64_t r, float *out) {
    int64_t k = (int64_t)t->ne[0];
    const uint8_t *row = (const uint8_t *)t->data + (size_t)r * cm_dtype_row_bytes(t->type, (uint64_t)k);
    if (t->type == CM_F32) memcpy(out, row, sizeof(float) * (size_t)k);
    else if (t->type == CM_F16 || t->type == CM_BF16)
        for (int64_t i = 0; i < k; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * i, 2);
            out[i] = t->type == CM_F16 ? cm_f16_to_f32(h) : cm_bf16_to_f32(h);
        }
    else
        for (int64_t b = 0; b < k / 32; b++) {
            uint8_t u[32];
            float d[2], m[2];
            cm_unpack32(t->type, row, b, u, d, m);
            for (int i = 0; i < 32; i++) out[32 * b + i] = d[i / 16] * (float)u[i] + m[i / 16];
        }
}

typedef struct {
    const cm_gguf_tensor *t;
    int type;
    const float *imp;
    uint8_t *out;
    size_t row_bytes;
    int64_t rows;
    int failed;
} qjob;

static void q_task(void *p, int ith, int nth) {
    qjob *j = p;
    int64_t k = (int64_t)j->t->ne[0], r0 = j->rows * ith / nth, r1 = j->rows * (ith + 1) / nth;
    float *x = malloc(sizeof(float) * (size_t)k);
    if (!x) {
        j->failed = 1;
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        read_row(j->t, r, x);
        if (cm_quantize_row(j->type, x, k, j->imp, j->out + (size_t)r * j->row_bytes)) j->failed = 1;
    }
    free(x);
}

static void wr(FILE *f, const void *p, size_t n, int *bad) {
    if (n && fwrite(p, 1, n, f) != n) *bad = 1;
}
static void wr_u32(FILE *f, uint32_t v, int *bad) { wr(f, &v, 4, bad); }
static void wr_u64(FILE *f, uint64_t v, int *bad) { wr(f, &v, 8, bad); }
static void wr_str(FILE *f, const char *s, size_t n, int *bad) {
    wr_u64(f, n, bad);
    wr(f, s, n, bad);
}

/* Bytes of the file the KV pair i occupies (its key's length prefix to the next pair, or to the first
 * tensor's record). */
static const uint8_t *kv_end(const cm_gguf *g, uint64_t i) {
    if (i + 1 < g->n_kv) return (const uint8_t *)g->kv[i + 1].key.ptr - 8;
    if (g->n_tensors) return (const uint8_t *)g->tensors[0].name.ptr - 8;
    return NULL;
}

int tl_quantize_main(int argc, char **argv) {
    const char *kind_s = NULL, *out_s = NULL, *imat_path = NULL;
    long threads = 0;
    static const struct option lo[] = {{"type", required_argument, 0, 't'}, {"output-type", required_argument, 0, 'o'},
                                       {"imatrix", required_argument, 0, 'i'}, {"threads", required_argument, 0, 'j'},
                                       {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 't': kind_s = optarg; break;
        case 'o': out_s = optarg; break;
        case 'i': imat_path = optarg; break;
        case 'j': if (cm_parse_long("--threads", optarg, 1, 1024, &threads)) return 2; break;
        case 'h': help(stdout); return 0;
        default: help(stderr); return 2;
        }
    }
    if (argc - optind != 2 || !kind_s) {
        fprintf(stderr, "llmserve: quantize needs IN.gguf OUT.gguf and --type\n");
        help(stderr);
        return 2;
    }
    const char *in = argv[optind], *out = argv[optind + 1];
    int kind = by_name(kind_s), out_kind = out_s ? by_name(out_s) : -1;
    if (kind < 0 || (out_s && out_kind < 0)) {
        fprintf(stderr, "llmserve: quantize: unknown type '%s'\n", kind < 0 ? kind_s : out_s);
        help(stderr);
        return 2;
    }
    int target = kinds[kind].type;
    int dense = target == CM_F32 || target == CM_F16 || target == CM_BF16 || target == CM_Q8_0;
    char err[512];
    cm_gguf *g = NULL, *im = NULL;
    if (cm_gguf_open(in, &g, err, sizeof err)) {
        fprintf(stderr, "llmserve: %s\n", err);
        return 1;
    }
    if (imat_path && cm_gguf_open(imat_path, &im, err, sizeof err)) {
        fprintf(stderr, "llmserve: --imatrix: %s\n", err);
        cm_gguf_close(g);
        return 1;
    }
    char *ri = realpath(in, NULL), *ro = realpath(out, NULL);
    int same = ri && ro && !strcmp(ri, ro);
    free(ri);
    free(ro);
    if (same) { /* never write over the file we read */
        fprintf(stderr, "llmserve: quantize: OUT is IN\n");
        cm_gguf_close(g);
        cm_gguf_close(im);
        return 2;
    }
    kn_pool *pool = NULL;
    if (kn_pool_create(threads > 0 ? (int)threads : (int)sysconf(_SC_NPROCESSORS_ONLN), &pool)) {
        fprintf(stderr, "llmserve: quantize: no threads\n");
        cm_gguf_close(g);
        return 1;
    }
    /* types, sizes, offsets */
    uint64_t align = 32, n = g->n_tensors;
    cm_gguf_get_u64(g, "general.alignment", &align);
    if (!align || align > (1u << 20) || (align & (align - 1))) align = 32;
    int *type = malloc(sizeof(int) * (n ? n : 1));
    uint64_t *off = malloc(sizeof(uint64_t) * (n ? n : 1)), pos = 0;
    int rc = 1, bad = 0, requant = 0, nq = 0;
    FILE *f = NULL;
    uint8_t *buf = NULL;
    float *wimp = NULL;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    if (!type || !off) goto done;
    for (uint64_t i = 0; i < n; i++) {
        const cm_gguf_tensor *t = &g->tensors[i];
        int ot = out_kind >= 0 ? kinds[out_kind].type : dense ? target : CM_Q6_K;
        type[i] = pick_type(t, kind, ot);
        if (type[i] != t->type) nq++;
        if (type[i] != t->type && cm_quant_known(t->type)) requant = 1;
        if (!cm_quantize_supported(type[i]) && type[i] != t->type) {
            fprintf(stderr, "llmserve: quantize: %.*s cannot become %s\n", (int)t->name.len, t->name.ptr,
                    cm_dtype_name(type[i]));
            goto done;
        }
        uint64_t el = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) el *= t->ne[d];
        off[i] = pos;
        pos += (type[i] == t->type ? t->nbytes : cm_dtype_row_bytes(type[i], t->ne[0]) * (el / t->ne[0]));
        pos = (pos + align - 1) / align * align;
    }
    if (requant)
        fprintf(stderr, "llmserve: quantize: warning: %s holds quantized tensors; requantizing them compounds "
                        "both roundings (quantize from F16/BF16/F32 where you can)\n", in);
    if (!(f = fopen(tmp, "wb"))) {
        fprintf(stderr, "llmserve: quantize: cannot write %s\n", tmp);
        goto done;
    }
    /* header and metadata: the source's pairs as they are but the two we rewrite */
    uint64_t kept = 0;
    for (uint64_t i = 0; i < g->n_kv; i++)
        kept += !cm_str_eq(g->kv[i].key, "general.file_type") && !cm_str_eq(g->kv[i].key, "general.quantization_version");
    wr(f, "GGUF", 4, &bad);
    wr_u32(f, 3, &bad);
    wr_u64(f, n, &bad);
    wr_u64(f, kept + 2, &bad);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (cm_str_eq(g->kv[i].key, "general.file_type") || cm_str_eq(g->kv[i].key, "general.quantization_version"))
            continue;
        const uint8_t *s = (const uint8_t *)g->kv[i].key.ptr - 8, *e = kv_end(g, i);
        if (!e) { /* the last pair of a file without tensors: nothing to quantize */
            fprintf(stderr, "llmserve: quantize: %s has no tensors\n", in);
            goto done;
        }
        wr(f, s, (size_t)(e - s), &bad);
    }
    wr_str(f, "general.file_type", 17, &bad);
    wr_u32(f, 4 /* u32 */, &bad);
    wr_u32(f, (uint32_t)kinds[kind].ftype, &bad);
    wr_str(f, "general.quantization_version", 28, &bad);
    wr_u32(f, 4, &bad);
    wr_u32(f, 2, &bad);
    for (uint64_t i = 0; i < n; i++) {
        const cm_gguf_tensor *t = &g->tensors[i];
        wr_str(f, t->name.ptr, t->name.len, &bad);
        wr_u32(f, t->n_dims, &bad);
        for (uint32_t d = 0; d < t->n_dims; d++) wr_u64(f, t->ne[d], &bad);
        wr_u32(f, (uint32_t)type[i], &bad);
        wr_u64(f, off[i], &bad);
    }
    long here = ftell(f);
    static const uint8_t zeros[4096];
    if (here < 0) bad = 1;
    else wr(f, zeros, (size_t)((align - (uint64_t)here % align) % align), &bad);
    /* data */
    uint64_t written = 0, in_bytes = 0, n_weights = 0;
    for (uint64_t i = 0; i < n && !bad; i++) {
        const cm_gguf_tensor *t = &g->tensors[i];
        uint64_t el = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) el *= t->ne[d];
        size_t bytes = (size_t)(i + 1 < n ? off[i + 1] : pos) - (size_t)off[i];
        in_bytes += t->nbytes;
        if (type[i] == t->type) {
            wr(f, t->data, (size_t)t->nbytes, &bad);
            wr(f, zeros, bytes - (size_t)t->nbytes, &bad);
        } else {
            n_weights += el;
            size_t rb = cm_dtype_row_bytes(type[i], t->ne[0]), need = rb * (size_t)(el / t->ne[0]);
            uint8_t *nb = realloc(buf, need);
            if (!nb) goto done;
            buf = nb;
            const float *imp = NULL;
            if (im) { /* each column's mean squared activation, floored so no column counts for nothing */
                char nm[256];
                snprintf(nm, sizeof nm, "%.*s", (int)t->name.len, t->name.ptr);
                const cm_gguf_tensor *it = cm_gguf_find_tensor(im, nm);
                if (it && it->type == CM_F32 && it->n_dims == 1 && it->ne[0] == t->ne[0]) {
                    float *nw = realloc(wimp, sizeof(float) * (size_t)t->ne[0]);
                    if (!nw) goto done;
                    wimp = nw;
                    double mean = 0;
                    for (uint64_t c2 = 0; c2 < t->ne[0]; c2++) mean += ((const float *)it->data)[c2] / (double)t->ne[0];
                    for (uint64_t c2 = 0; c2 < t->ne[0]; c2++) {
                        float v = ((const float *)it->data)[c2];
                        wimp[c2] = (v >= 0 && v < 1e30f ? v : 0) + (float)(1e-3 * mean) + 1e-12f;
                    }
                    imp = wimp;
                } else if (it)
                    fprintf(stderr, "llmserve: quantize: --imatrix entry %s has the wrong shape: ignored\n", nm);
            }
            qjob j = {t, type[i], imp, buf, rb, (int64_t)(el / t->ne[0]), 0};
            kn_pool_run(pool, q_task, &j);
            if (j.failed) {
                fprintf(stderr, "llmserve: quantize: %.*s: out of memory\n", (int)t->name.len, t->name.ptr);
                goto done;
            }
            wr(f, buf, need, &bad);
            wr(f, zeros, bytes - need, &bad);
        }
        written += bytes;
    }
    if (bad || fclose(f)) {
        f = NULL;
        fprintf(stderr, "llmserve: quantize: writing %s failed\n", tmp);
        unlink(tmp);
        goto done;
    }
    f = NULL;
    if (rename(tmp, out)) {
        fprintf(stderr, "llmserve: quantize: cannot rename %s to %s\n", tmp, out);
        unlink(tmp);
        goto done;
    }
    printf("%s: %d of %llu tensors to %s%s; tensor data %.1f MB -> %.1f MB\n", out, nq, (unsigned long long)n,
           kinds[kind].name, im ? " (importance-weighted)" : "", (double)in_bytes / 1e6, (double)written / 1e6);
    rc = 0;
done:
    if (f) {
        fclose(f);
        unlink(tmp);
    }
    free(buf);
    free(wimp);
    free(type);
    free(off);
    kn_pool_destroy(pool);
    cm_gguf_close(g);
    cm_gguf_close(im);
    return rc;
}
