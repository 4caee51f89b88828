/* llmserve imatrix: an importance matrix for `llmserve quantize --imatrix`.
 *
 * The model reads a calibration text (windows of --ctx tokens, float
 * activations: the reference path) and, for every weight matrix, the mean
 * square of each input column over all the tokens is kept: a column that
 * carries large activations makes its weights' rounding errors count more
 * in the output, so the quantizer weighs them by it. Written as a GGUF file
 * of F32 vectors named as the weights ("blk.0.attn_q.weight": [k]) with
 * imatrix.chunks, imatrix.tokens and imatrix.dataset in its metadata. The
 * LM head's entry is "output.weight", or "token_embd.weight" when tied. */
#include "cm_error.h"
#include "cm_parse.h"
#include "cm_time.h"
#include "tl_common.h"
#include "wk_model.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: llmserve imatrix --model PATH --file TEXT --out IMATRIX.gguf [flags]\n"
               "  --model PATH       GGUF model (the one you will quantize, or any precision of it)\n"
               "  --file TEXT        calibration text ('-' for stdin): text like what the model will serve\n"
               "  --out PATH         where to write the importance matrix\n"
               "  --ctx N            window in tokens (default 512)\n"
               "  --max-tokens N     read at most N tokens of the text (default all)\n"
               "  --threads N        threads (default: all CPUs)\n");
}

typedef struct {
    const kn_weight *w;
    char name[64];
    double *sum; /* [k] */
} entry;

typedef struct {
    entry *e;
    int n;
    long long tokens;
} collector;

static void hook(void *ctx, const kn_weight *w, const float *x, int T) {
    collector *c = ctx;
    for (int i = 0; i < c->n; i++)
        if (c->e[i].w == w) {
            for (int t = 0; t < T; t++)
                for (int64_t j = 0; j < w->k; j++) {
                    double v = x[(size_t)t * (size_t)w->k + (size_t)j];
                    c->e[i].sum[j] += v * v;
                }
            return;
        }
}

static int add(collector *c, const kn_weight *w, const char *fmt, int l) {
    entry *e = &c->e[c->n];
    e->w = w;
    snprintf(e->name, sizeof e->name, fmt, l);
    e->sum = calloc((size_t)w->k, sizeof(double));
    if (!e->sum) return LLM_ENOMEM;
    c->n++;
    return 0;
}

static void put(FILE *f, const void *p, size_t n, int *bad) {
    if (n && fwrite(p, 1, n, f) != n) *bad = 1;
}
static void put_str(FILE *f, const char *s, int *bad) {
    uint64_t n = strlen(s);
    put(f, &n, 8, bad);
    put(f, s, n, bad);
}
static void put_u32(FILE *f, uint32_t v, int *bad) { put(f, &v, 4, bad); }
static void put_u64(FILE *f, uint64_t v, int *bad) { put(f, &v, 8, bad); }

static int write_gguf(const char *path, const collector *c, int chunks, const char *dataset) {
    FILE *f = fopen(path, "wb");
    if (!f) return LLM_EIO;
    int bad = 0;
    put(f, "GGUF", 4, &bad);
    put_u32(f, 3, &bad);
    put_u64(f, (uint64_t)c->n, &bad);
    put_u64(f, 4, &bad);
    put_str(f, "general.type", &bad);
    put_u32(f, 8, &bad); /* string */
    put_str(f, "imatrix", &bad);
    put_str(f, "imatrix.chunks", &bad);
    put_u32(f, 4, &bad);
    put_u32(f, (uint32_t)chunks, &bad);
    put_str(f, "imatrix.tokens", &bad);
    put_u32(f, 10, &bad); /* u64 */
    put_u64(f, (uint64_t)c->tokens, &bad);
    put_str(f, "imatrix.dataset", &bad);
    put_u32(f, 8, &bad);
    put_str(f, dataset, &bad);
    uint64_t off = 0;
    for (int i = 0; i < c->n; i++) {
        put_str(f, c->e[i].name, &bad);
        put_u32(f, 1, &bad);
        put_u64(f, (uint64_t)c->e[i].w->k, &bad);
        put_u32(f, 0, &bad); /* F32 */
        put_u64(f, off, &bad);
        off += ((uint64_t)c->e[i].w->k * 4 + 31) / 32 * 32;
    }
    static const uint8_t zeros[32];
    long here = ftell(f);
    if (here < 0) bad = 1;
    else put(f, zeros, (size_t)((32 - here % 32) % 32), &bad);
    for (int i = 0; i < c->n && !bad; i++) {
        int64_t k = c->e[i].w->k;
        for (int64_t j = 0; j < k; j++) {
            float v = c->tokens ? (float)(c->e[i].sum[j] / (double)c->tokens) : 0.f;
            put(f, &v, 4, &bad);
        }
        put(f, zeros, (size_t)((32 - (k * 4) % 32) % 32), &bad);
    }
    if (fclose(f)) bad = 1;
    return bad ? LLM_EIO : 0;
}

int tl_imatrix_main(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *out = NULL;
    long ctx = 512, max_tokens = 0, threads = 0;
    enum { O_MAXT = 1000 };
    static const struct option lo[] = {{"model", required_argument, 0, 'm'}, {"file", required_argument, 0, 'f'},
                                       {"out", required_argument, 0, 'o'},   {"ctx", required_argument, 0, 'c'},
                                       {"max-tokens", required_argument, 0, O_MAXT},
                                       {"threads", required_argument, 0, 'j'}, {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'f': file = optarg; break;
        case 'o': out = optarg; break;
        case 'c': if (cm_parse_long("--ctx", optarg, 16, 1 << 20, &ctx)) return 2; break;
        case O_MAXT: if (cm_parse_long("--max-tokens", optarg, 2, 1L << 30, &max_tokens)) return 2; break;
        case 'j': if (cm_parse_long("--threads", optarg, 1, 1024, &threads)) return 2; break;
        case 'h': help(stdout); return 0;
        default: help(stderr); return 2;
        }
    }
    if (!model || !file || !out || optind != argc) {
        fprintf(stderr, "llmserve: imatrix needs --model, --file and --out\n");
        help(stderr);
        return 2;
    }
    size_t len = 0;
    char *text = tl_read_file(file, &len);
    if (!text) {
        fprintf(stderr, "llmserve: %s: cannot read\n", file);
        return 1;
    }
    char err[512] = "";
    wk_model *m = NULL;
    wk_model_opts mo = {.model_path = model, .threads = (int)threads};
    collector col = {0};
    int32_t *toks = NULL;
    size_t nt = 0;
    float *logits = NULL;
    wk_kv *kv = NULL;
    int rc = wk_model_load(&mo, &m, err, sizeof err), ret = 1, chunks = 0;
    if (rc) {
        fprintf(stderr, "llmserve: %s\n", err[0] ? err : cm_strerror(rc));
        free(text);
        return 1;
    }
    if (m->cfg.n_expert) { /* each expert would need its own statistics, which the collector does not keep */
        fprintf(stderr, "llmserve imatrix: %s has experts (%u): an importance matrix of a mixture of experts is not "
                "supported yet\n", m->file->path, m->cfg.n_expert);
        ret = 2;
        goto out;
    }
    uint32_t L = m->cfg.n_layer;
    col.e = calloc(7 * (size_t)L + 1, sizeof *col.e);
    if (!col.e) { rc = LLM_ENOMEM; goto out; }
    for (uint32_t l = 0; l < L && !rc; l++) {
        wk_layer *y = &m->layers[l];
        if ((rc = add(&col, &y->wq, "blk.%d.attn_q.weight", (int)l)) || (rc = add(&col, &y->wk, "blk.%d.attn_k.weight", (int)l)) ||
            (rc = add(&col, &y->wv, "blk.%d.attn_v.weight", (int)l)) ||
            (rc = add(&col, &y->wo, "blk.%d.attn_output.weight", (int)l)) ||
            (rc = add(&col, &y->gate, "blk.%d.ffn_gate.weight", (int)l)) || (rc = add(&col, &y->up, "blk.%d.ffn_up.weight", (int)l)) ||
            (rc = add(&col, &y->down, "blk.%d.ffn_down.weight", (int)l)))
            break;
    }
    if (rc || (rc = add(&col, &m->output, m->cfg.tied ? "token_embd.weight" : "output.weight", 0))) goto out;
    m->act_hook = hook;
    m->act_hook_ctx = &col;
    kn_set_act_f32(1); /* the activations the reference path sees */
    if (ctx > (long)m->cfg.ctx_len) ctx = m->cfg.ctx_len;
    if ((rc = cm_tok_encode(m->tok, text, len, -1, 0, &toks, &nt))) goto out;
    if (max_tokens && nt > (size_t)max_tokens) nt = (size_t)max_tokens;
    /* every position's logits, so the LM head sees every token as the other matrices do */
    logits = malloc(sizeof(float) * m->cfg.vocab * (size_t)m->max_batch);
    if (!logits) { rc = LLM_ENOMEM; goto out; }
    if ((rc = wk_kv_create(m, (int)ctx, KN_KV_F16, &kv))) goto out;
    double t0 = cm_now();
    for (size_t w0 = 0; w0 < nt; w0 += (size_t)ctx, chunks++) {
        size_t wn = nt - w0 < (size_t)ctx ? nt - w0 : (size_t)ctx;
        kv->n = 0;
        for (size_t b0 = 0; b0 < wn; b0 += (size_t)m->max_batch) {
            int bn = (int)(wn - b0 < (size_t)m->max_batch ? wn - b0 : (size_t)m->max_batch);
            if ((rc = wk_forward(m, kv, toks + w0 + b0, bn, logits, 1))) goto out;
        }
        col.tokens += (long long)wn;
    }
    const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    if ((rc = write_gguf(out, &col, chunks, base))) {
        fprintf(stderr, "llmserve: imatrix: cannot write %s\n", out);
        goto out;
    }
    printf("%s: %d matrices, %lld tokens in %d windows of %ld (%.1f s)\n", out, col.n, col.tokens, chunks, ctx,
           cm_now() - t0);
    ret = 0;
out:
    kn_set_act_f32(0);
    if (rc) fprintf(stderr, "llmserve: imatrix: %s\n", cm_strerror(rc));
    for (int i = 0; i < col.n; i++) free(col.e[i].sum);
    free(col.e);
    free(text);
    free(toks);
    free(logits);
    wk_kv_free(kv);
    wk_model_free(m);
    return ret;
}
