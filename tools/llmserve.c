/* llmserve - the command-line front: one binary, one subcommand per tool,
 * found in a table. */
#include "tl_common.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name, *shown; /* shown: the usage line's left column */
    int (*main)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"serve", "serve", tl_serve_main, "OpenAI-compatible server: a gateway and a worker group, supervised"},
    {"batch", "batch", tl_run_batch_main, "an OpenAI batch file run offline (vLLM's run_batch): -i IN.jsonl -o OUT.jsonl"},
    {"generate", "generate", tl_generate_main, "generate text from a prompt or a chat (streams to stdout)"},
    {"perplexity", "perplexity", tl_perplexity_main, "negative log-likelihood and perplexity of a text file"},
    {"embed", "embed", tl_embed_main, "sentence embeddings of texts (a BERT-family Hugging Face model)"},
    {"quantize", "quantize", tl_quantize_main, "a GGUF file into another of a lower precision (K-quants, Q8_0, Q4_0 ...)"},
    {"imatrix", "imatrix", tl_imatrix_main, "an importance matrix from a calibration text, for quantize --imatrix"},
    {"eval", "eval", tl_eval_main, "a model against its reference: perplexity, KL, top-1, tasks, size, speed"},
    {"bench", "bench serve", tl_bench_main, "load any OpenAI-compatible server: TTFT, TPOT, ITL, E2E, throughput"},
    {"plan", "plan", tl_plan_main, "KV-cache capacity: weights and KV per GPU, max tokens and sequences"},
    {"cost", "cost", tl_cost_main, "cost per 1k requests, self-hosting per million tokens, break-even"},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

static void usage(FILE *f) {
    fprintf(f, "usage: llmserve COMMAND [flags]\n\ncommands:\n");
    for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-12s %s\n", commands[i].shown, commands[i].help);
    fprintf(f, "\n'llmserve COMMAND --help' lists a command's flags.\n");
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
    for (int i = 0; i < N_COMMANDS; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].main(argc - 1, argv + 1);
    fprintf(stderr, "llmserve: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
