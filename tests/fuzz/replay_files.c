/* Deterministic mutation driver for the file-seeded fuzz targets, for
 * builds without libFuzzer (every ctest run, under ASan in CI):
 *   replay_<target> CORPUS_DIR [ITERATIONS]
 * Runs every seed as it is, then ITERATIONS mutants: bit flips, random
 * bytes, truncation, splices of another seed, a seed repeated to tens of
 * kilobytes (long inputs are where quadratic paths show) and huge length
 * fields. A target that needs something this machine lacks (a model file)
 * makes LLVMFuzzerInitialize return nonzero: the run is skipped (77). */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "mutate.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

#define MAX_SEEDS 256
#define MAX_SEED (1u << 20)
#define MAX_FUZZ_INPUT (256u << 10)

/* The input being run: a failure writes it to fuzz-crash-input (cwd) to
 * replay by hand or add to the corpus. */
static const uint8_t *cur;
static size_t cur_n;

static void on_crash(int sig) {
    int fd = open("fuzz-crash-input", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        (void)!write(fd, cur, cur_n);
        close(fd);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void run(const uint8_t *b, size_t n) {
    uint8_t *exact = malloc(n ? n : 1); /* exact size: ASan sees any over-read */
    memcpy(exact, b, n);
    cur = exact;
    cur_n = n;
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR [ITERATIONS]\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize && LLVMFuzzerInitialize(&argc, &argv)) return 77;
    long iters = argc > 2 ? atol(argv[2]) : 20000;
    static fuzz_seed seeds[MAX_SEEDS];
    int ns = 0;
    DIR *d = opendir(argv[1]);
    if (!d) {
        fprintf(stderr, "%s: cannot open the corpus %s\n", argv[0], argv[1]);
        return 2;
    }
    for (struct dirent *de; (de = readdir(d)) && ns < MAX_SEEDS;) {
        if (de->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[1], de->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        uint8_t *b = malloc(MAX_SEED);
        size_t n = b ? fread(b, 1, MAX_SEED, f) : 0;
        fclose(f);
        if (!b) continue;
        seeds[ns++] = (fuzz_seed){b, n};
    }
    closedir(d);
    if (!ns) {
        fprintf(stderr, "%s: no seeds in %s\n", argv[0], argv[1]);
        return 2;
    }
    signal(SIGABRT, on_crash);
    signal(SIGSEGV, on_crash);
    uint8_t *buf = malloc(MAX_FUZZ_INPUT);
    for (int i = 0; i < ns; i++) run(seeds[i].b, seeds[i].n); /* each seed as it is */
    for (long it = 0; it < iters; it++) run(buf, fuzz_mutate(buf, MAX_FUZZ_INPUT, seeds, ns));
    for (int i = 0; i < ns; i++) free(seeds[i].b);
    free(buf);
    printf("%s: %d seeds and %ld mutants, no crash\n", argv[0], ns, iters);
    return 0;
}
