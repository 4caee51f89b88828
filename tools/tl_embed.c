/* llmserve embed: sentence embeddings of texts, one JSON line each.
 *
 * Each line of the input (or each --text) is tokenized with the model's
 * tokenizer, wrapped in [CLS] ... [SEP], and embedded; all of them go
 * through the encoder in batches, as a server would run them. Output:
 * {"index": i, "tokens": [...], "embedding": [...]} per text, in order. */
#include "cm_error.h"
#include "cm_parse.h"
#include "tl_common.h"
#include "wk_bert.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: llmserve embed --model DIR (--text T ... | --file F) [flags]\n"
               "  --model DIR       a Hugging Face embedding model (config.json, model.safetensors,\n"
               "                    tokenizer.json; sentence-transformers pooling)\n"
               "  --text T          a text to embed (repeatable)\n"
               "  --file F          one text per line ('-' for stdin)\n"
               "  --threads N       threads (default: all CPUs)\n"
               "  --max-tokens N    tokens per encoder step (default 2048)\n"
               "  --one-by-one      run each text alone, not batched (to compare)\n");
}

static int add_text(char ***texts, int *n, int *cap, const char *s, size_t len) {
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        char **nt = realloc(*texts, sizeof *nt * (size_t)nc);
        if (!nt) return LLM_ENOMEM;
        *texts = nt;
        *cap = nc;
    }
    char *c = malloc(len + 1);
    if (!c) return LLM_ENOMEM;
    memcpy(c, s, len);
    c[len] = 0;
    (*texts)[(*n)++] = c;
    return 0;
}

int tl_embed_main(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    long threads = 0, max_tokens = 0;
    int one = 0, n = 0, cap = 0, ret = 1;
    char **texts = NULL;
    static const struct option lo[] = {{"model", required_argument, 0, 'm'}, {"text", required_argument, 0, 't'},
                                       {"file", required_argument, 0, 'f'}, {"threads", required_argument, 0, 'j'},
                                       {"max-tokens", required_argument, 0, 'b'}, {"one-by-one", no_argument, 0, 'o'},
                                       {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 't': if (add_text(&texts, &n, &cap, optarg, strlen(optarg))) return 1; break;
        case 'f': file = optarg; break;
        case 'j': if (cm_parse_long("--threads", optarg, 1, 1024, &threads)) return 2; break;
        case 'b': if (cm_parse_long("--max-tokens", optarg, 1, 1 << 20, &max_tokens)) return 2; break;
        case 'o': one = 1; break;
        case 'h': help(stdout); return 0;
        default: help(stderr); return 2;
        }
    }
    if (!model || (!n && !file) || optind < argc) {
        fprintf(stderr, "llmserve: embed needs --model and --text or --file\n");
        return 2;
    }
    if (file) {
        FILE *f = strcmp(file, "-") == 0 ? stdin : fopen(file, "rb");
        if (!f) {
            fprintf(stderr, "llmserve: %s: cannot open\n", file);
            return 1;
        }
        char *line = NULL;
        size_t lcap = 0;
        ssize_t r;
        while ((r = getline(&line, &lcap, f)) > 0) {
            if (line[r - 1] == '\n') r--;
            if (add_text(&texts, &n, &cap, line, (size_t)r)) break;
        }
        free(line);
        if (f != stdin) fclose(f);
    }
    char err[600] = "";
    wk_encoder *e = NULL;
    wk_encoder_opts eo = {.model_path = model, .threads = (int)threads, .max_tokens = (int)max_tokens};
    int rc = wk_encoder_load(&eo, &e, err, sizeof err);
    int32_t **toks = calloc((size_t)(n ? n : 1), sizeof *toks);
    int *len = calloc((size_t)(n ? n : 1), sizeof *len);
    float *out = NULL;
    if (rc) {
        fprintf(stderr, "llmserve: %s\n", err[0] ? err : cm_strerror(rc));
        goto done;
    }
    int D = (int)e->cfg.dim;
    out = malloc(sizeof(float) * (size_t)D * (size_t)(n ? n : 1));
    if (!toks || !len || !out) goto done;
    for (int i = 0; i < n; i++) {
        size_t nt;
        if ((rc = cm_tok_encode(e->tok, texts[i], strlen(texts[i]), 1, 1, &toks[i], &nt))) {
            fprintf(stderr, "llmserve: text %d: cannot tokenize: %s\n", i, cm_strerror(rc));
            goto done;
        }
        len[i] = (int)nt;
        if (len[i] > wk_encoder_max_len(e)) {
            fprintf(stderr, "llmserve: text %d has %d tokens; the model takes at most %d\n", i, len[i],
                    wk_encoder_max_len(e));
            goto done;
        }
    }
    if (one) {
        for (int i = 0; i < n && !rc; i++)
            rc = wk_encode(e, 1, (const int32_t *const *)&toks[i], &len[i], out + (size_t)i * D);
    } else {
        rc = wk_encode(e, n, (const int32_t *const *)toks, len, out);
    }
    if (rc) {
        fprintf(stderr, "llmserve: embed: %s\n", cm_strerror(rc));
        goto done;
    }
    for (int i = 0; i < n; i++) {
        printf("{\"index\": %d, \"tokens\": [", i);
        for (int j = 0; j < len[i]; j++) printf("%s%d", j ? ", " : "", toks[i][j]);
        printf("], \"embedding\": [");
        for (int d = 0; d < D; d++) printf("%s%.8g", d ? ", " : "", out[(size_t)i * D + d]);
        printf("]}\n");
    }
    ret = 0;
done:
    for (int i = 0; i < n; i++) {
        free(texts[i]);
        if (toks) free(toks[i]);
    }
    free(texts);
    free(toks);
    free(len);
    free(out);
    wk_encoder_free(e);
    return ret;
}
