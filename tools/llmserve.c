/* llmserve - the command-line front: one binary, one subcommand per tool. */
#include "cm_error.h"
#include "kernels.h"
#include "tl_common.h"
#include "wk_flags.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int tl_parse_int(const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "llmserve: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, s);
        return LLM_EINVAL;
    }
    *out = v;
    return 0;
}

int tl_parse_float(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "llmserve: %s expects a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
        return LLM_EINVAL;
    }
    *out = v;
    return 0;
}

int tl_parse_kv_dtype(const char *s, int *out) { return wk_parse_kv_dtype(s, out); }

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

static void usage(FILE *f) {
    fprintf(f, "usage: llmserve COMMAND [flags]\n\n"
               "commands:\n"
               "  serve        OpenAI-compatible server: a gateway and a worker group, supervised\n"
               "  generate     generate text from a prompt or a chat (streams to stdout)\n"
               "  perplexity   negative log-likelihood and perplexity of a text file\n"
               "  embed        sentence embeddings of texts (a BERT-family Hugging Face model)\n"
               "  quantize     a GGUF file into another of a lower precision (K-quants, Q8_0, Q4_0 ...)\n"
               "  imatrix      an importance matrix from a calibration text, for quantize --imatrix\n"
               "  eval         a model against its reference: perplexity, KL, top-1, tasks, size, speed\n"
               "  bench serve  load any OpenAI-compatible server: TTFT, TPOT, ITL, E2E, throughput\n"
               "  plan         KV-cache capacity: weights and KV per GPU, max tokens and sequences\n"
               "  cost         cost per 1k requests, self-hosting per million tokens, break-even\n\n"
               "'llmserve COMMAND --help' lists a command's flags.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("llmserve 0.1.0\n");
        return 0;
    }
    if (strcmp(argv[1], "serve") == 0) return tl_serve_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "generate") == 0) return tl_generate_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "perplexity") == 0) return tl_perplexity_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "embed") == 0) return tl_embed_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "quantize") == 0) return tl_quantize_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "eval") == 0) return tl_eval_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "imatrix") == 0) return tl_imatrix_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "plan") == 0) return tl_plan_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "bench") == 0) return tl_bench_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "cost") == 0) return tl_cost_main(argc - 1, argv + 1);
    fprintf(stderr, "llmserve: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
