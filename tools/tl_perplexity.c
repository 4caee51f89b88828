/* llmserve perplexity: NLL and perplexity of a text under a model.
 *
 * The text is tokenized once (with BOS when the model adds one) and cut into
 * windows of --ctx tokens; in each window every token after the first is
 * predicted from those before it in the window. */
#include "cm_error.h"
#include "cm_parse.h"
#include "cm_time.h"
#include "tl_common.h"
#include "wk_flags.h"
#include "wk_model.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: llmserve perplexity --model PATH --file TEXT [flags]\n"
               "  --model PATH      GGUF file or llama2.c .bin\n"
               "  --tokenizer PATH  tokenizer.bin for a llama2.c model\n"
               "  --file PATH       the text to score ('-' for stdin)\n"
               "  --ctx N           window length in tokens (default 512, at most the model's)\n"
               "  --threads N       threads (default: all CPUs)\n"
               "  --kv-cache-dtype T auto|f16|f32 (default auto = f16)\n");
}

int tl_perplexity_main(int argc, char **argv) {
    const char *model = getenv("LLMSERVE_MODEL"), *tokp = NULL, *file = NULL;
    long ctx = 512, threads = 0;
    int kv_type = KN_KV_F16;
    static const struct option lo[] = {{"model", required_argument, 0, 'm'}, {"tokenizer", required_argument, 0, 't'},
                                       {"file", required_argument, 0, 'f'}, {"ctx", required_argument, 0, 'c'},
                                       {"threads", required_argument, 0, 'j'}, {"help", no_argument, 0, 'h'},
                                       {"kv-cache-dtype", required_argument, 0, 'k'},
                                       {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 't': tokp = optarg; break;
        case 'f': file = optarg; break;
        case 'c': if (cm_parse_long("--ctx", optarg, 2, 1 << 24, &ctx)) return 2; break;
        case 'j': if (cm_parse_long("--threads", optarg, 1, 1024, &threads)) return 2; break;
        case 'k': if (wk_parse_kv_dtype(optarg, &kv_type)) return 2; break;
        case 'h': help(stdout); return 0;
        default: help(stderr); return 2;
        }
    }
    if (!model || !file) {
        fprintf(stderr, "llmserve: perplexity needs --model and --file\n");
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
    wk_model_opts mo = {.model_path = model, .tokenizer_path = tokp, .threads = (int)threads};
    int rc = wk_model_load(&mo, &m, err, sizeof err), ret = 1;
    int32_t *toks = NULL;
    size_t nt = 0;
    float *logits = NULL;
    wk_kv *kv = NULL;
    if (rc) {
        fprintf(stderr, "llmserve: %s\n", err[0] ? err : cm_strerror(rc));
        free(text);
        return 1;
    }
    if (ctx > (long)m->cfg.ctx_len) ctx = m->cfg.ctx_len;
    if ((rc = cm_tok_encode(m->tok, text, len, -1, 0, &toks, &nt)) || nt < 2) {
        fprintf(stderr, "llmserve: %s\n", rc ? cm_strerror(rc) : "the text has fewer than 2 tokens");
        goto out;
    }
    int V = (int)m->cfg.vocab, B = m->max_batch;
    logits = malloc(sizeof(float) * (size_t)V * (size_t)B);
    if (!logits || wk_kv_create(m, (int)ctx, kv_type, &kv)) goto out;
    double nll = 0, t0 = cm_now();
    size_t scored = 0;
    for (size_t w0 = 0; w0 + 1 < nt; w0 += (size_t)ctx) {
        size_t wn = nt - w0 < (size_t)ctx ? nt - w0 : (size_t)ctx;
        kv->n = 0;
        for (size_t b0 = 0; b0 < wn; b0 += (size_t)B) {
            int bn = (int)(wn - b0 < (size_t)B ? wn - b0 : (size_t)B);
            if ((rc = wk_forward(m, kv, toks + w0 + b0, bn, logits, 1))) goto out;
            for (int i = 0; i < bn; i++) {
                size_t pos = b0 + (size_t)i; /* logits at pos predict pos+1 */
                if (pos + 1 >= wn) break;
                const float *lg = logits + (size_t)i * (size_t)V;
                double mx = lg[0], sum = 0;
                for (int j = 1; j < V; j++) mx = lg[j] > mx ? lg[j] : mx;
                for (int j = 0; j < V; j++) sum += exp((double)lg[j] - mx);
                nll -= (double)lg[toks[w0 + pos + 1]] - mx - log(sum);
                scored++;
            }
        }
    }
    double dt = cm_now() - t0;
    printf("tokens: %zu\nscored: %zu\nnll: %.6f\nperplexity: %.6f\n", nt, scored, nll, exp(nll / (double)scored));
    fprintf(stderr, "llmserve: %.1f tok/s\n", (double)nt / dt);
    ret = 0;
out:
    if (rc) fprintf(stderr, "llmserve: %s\n", cm_strerror(rc));
    free(text);
    free(toks);
    free(logits);
    wk_kv_free(kv);
    wk_model_free(m);
    return ret;
}
