/* llmserve serve [MODEL]: one gateway and one worker group on this machine,
 * supervised. A child that dies is restarted (with backoff); SIGINT or
 * SIGTERM stops both. Flags follow vLLM's `vllm serve`. */
#include "cm_parse.h"
#include "cm_time.h"
#include "gw_conf.h"
#include "tl_common.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static volatile sig_atomic_t stop_flag;
static void on_signal(int s) {
    (void)s;
    stop_flag = stop_flag + 1;
}

typedef struct {
    const char *name;
    char *argv[64];
    int argc;
    pid_t pid;
    double started, backoff;
    int restarts;
} child;

static void arg(child *c, const char *a) {
    if (c->argc < 62) c->argv[c->argc++] = (char *)a;
    c->argv[c->argc] = NULL;
}

static pid_t spawn(child *c) {
    pid_t p = fork();
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlive the supervisor */
        execv(c->argv[0], c->argv);
        fprintf(stderr, "llmserve serve: cannot run %s: %s\n", c->argv[0], strerror(errno));
        _exit(127);
    }
    c->started = cm_now();
    c->pid = p;
    return p;
}

/* Worker-only flags (all take a value); every gateway flag marked for
 * serve in gw_conf's table goes to the gateway; a few go to both. */
static const char *wflags[] = {"device", "tensor-parallel-size", "threads", "max-model-len", "max-num-seqs",
                               "max-num-batched-tokens", "max-step-ms", "block-size", "kv-cache-memory", "gpu-memory-utilization",
                               "kv-cache-dtype", "quantization", "rope-scaling", "dtype", "dummy-seed", "load-format", "model-config",
                               "speculative-config", "num-speculative-tokens", "ngram-prompt-lookup-max",
                               "ngram-prompt-lookup-min", "speculative-disable-by-batch-size", "lora-modules", "max-loras",
                               "max-lora-rank", "kv-offloading-size", "kv-offloading-dir", "kv-offloading-disk-size", NULL};
static const char *both[] = {"served-model-name", "log-level", "shutdown-timeout", "rpc-secret-file", NULL};

static int in(const char *const *set, const char *name) {
    for (; *set; set++)
        if (!strcmp(*set, name)) return 1;
    return 0;
}

static void help(FILE *f) {
    fprintf(f,
            "usage: llmserve serve [MODEL] [flags]\n"
            "Starts an OpenAI-compatible server: one llmserve-gateway and one llmserve-worker group,\n"
            "restarting either if it dies. SIGTERM or Ctrl-C drains: the gateway stops taking requests\n"
            "and lets running ones finish (--shutdown-timeout), then the worker stops; a second signal\n"
            "stops at once.\n"
            "  MODEL                        GGUF file (default " DEFAULT_MODEL ")\n"
            "  --device cpu|cuda            (default cpu)\n"
            "  --tensor-parallel-size N     rank processes per replica (default 1)\n"
            "  --threads N                  CPU threads per rank\n"
            "  --max-model-len N, --max-num-seqs N, --max-num-batched-tokens N, --max-step-ms MS,\n"
            "  --block-size N,"
            " --kv-cache-memory SIZE, --gpu-memory-utilization F, --kv-cache-dtype T, --quantization Q,\n"
            "  --dtype T, --load-format dummy --model-config SPEC, --dummy-seed N,\n"
            "  --enable-prefix-caching / --no-enable-prefix-caching, --enable-expert-parallel,\n"
            "  --enable-lora, --lora-modules NAME=PATH, --max-loras N, --max-lora-rank N,\n"
            "  --speculative-config JSON, --num-speculative-tokens K, --ngram-prompt-lookup-max N,\n"
            "  --ngram-prompt-lookup-min M, --speculative-disable-by-batch-size B    engine flags, as in vLLM\n"
            "  --kv-offloading-size SIZE, --kv-offloading-dir DIR, --kv-offloading-disk-size SIZE\n"
            "                               KV tiers under the cache: host memory, then disk (llmserve-worker --help)\n"
            "  --served-model-name NAME, --log-level L, --shutdown-timeout S, --rpc-secret-file PATH    both\n"
            "  --embedding-model DIR        also serve /v1/embeddings with this Hugging Face embedding model\n"
            "                               (its own worker group; e.g. models/all-MiniLM-L6-v2)\n"
            "gateway flags:\n");
    for (int i = 0; i < gw_n_flags; i++)
        if (gw_flags[i].serve && !in(both, gw_flags[i].name))
            fprintf(f, "  --%s%s%s\n", gw_flags[i].name, gw_flags[i].arg ? " " : "", gw_flags[i].arg ? gw_flags[i].arg : "");
}

static void stop_child(child *c, int sig) {
    if (c->pid > 0) kill(c->pid, sig);
}

/* Waits up to secs for c to exit; then SIGKILL. */
static void reap(child *c, double secs) {
    if (c->pid <= 0) return;
    int st;
    for (int t = 0; t < (int)(secs * 20) && waitpid(c->pid, &st, WNOHANG) == 0; t++) {
        if (stop_flag > 1) break; /* a second signal: no more waiting */
        usleep(50000);
    }
    if (waitpid(c->pid, &st, WNOHANG) == 0) {
        kill(c->pid, SIGKILL);
        waitpid(c->pid, &st, 0);
    }
    c->pid = 0;
}

int tl_serve_main(int argc, char **argv) {
    char exe[PATH_MAX], dir[PATH_MAX], wbin[PATH_MAX + 32], gbin[PATH_MAX + 32], ipc[128], eipc[128];
    static char workers[300];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 1;
    exe[n] = 0;
    snprintf(dir, sizeof dir, "%s", exe);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    snprintf(wbin, sizeof wbin, "%s/llmserve-worker", dir);
    snprintf(gbin, sizeof gbin, "%s/llmserve-gateway", dir);
    snprintf(ipc, sizeof ipc, "ipc:///tmp/llmserve-serve-%d.ipc", (int)getpid());
    snprintf(eipc, sizeof eipc, "ipc:///tmp/llmserve-serve-%d-embed.ipc", (int)getpid());
    child w = {.name = "worker"}, g = {.name = "gateway"}, ew = {.name = "embedding worker"};
    arg(&w, wbin);
    arg(&g, gbin);
    arg(&ew, wbin);
    arg(&w, "--listen");
    arg(&w, ipc);
    arg(&ew, "--listen");
    arg(&ew, eipc);
    arg(&g, "--workers");
    arg(&g, workers); /* filled below: the chat group, and the embedding group when there is one */
    const char *embed_model = NULL;
    const char *model = getenv("LLMSERVE_MODEL") ? getenv("LLMSERVE_MODEL") : DEFAULT_MODEL;
    static struct option lo[96];
    static const char *names[96];
    int k = 0;
    for (const char **f = wflags; *f; f++, k++) {
        lo[k] = (struct option){*f, required_argument, 0, 1000 + k};
        names[k] = *f;
    }
    for (int i = 0; i < gw_n_flags && k < 90; i++) {
        if (!gw_flags[i].serve || in(wflags, gw_flags[i].name)) continue;
        lo[k] = (struct option){gw_flags[i].name, gw_flags[i].arg ? required_argument : no_argument, 0, 1000 + k};
        names[k++] = gw_flags[i].name;
    }
    lo[k++] = (struct option){"embedding-model", required_argument, 0, 4002};
    lo[k++] = (struct option){"enable-prefix-caching", no_argument, 0, 4000};
    lo[k++] = (struct option){"no-enable-prefix-caching", no_argument, 0, 4001};
    lo[k++] = (struct option){"enable-expert-parallel", no_argument, 0, 4003};
    lo[k++] = (struct option){"enable-lora", no_argument, 0, 4004};
    lo[k++] = (struct option){"help", no_argument, 0, 'h'};
    lo[k] = (struct option){0, 0, 0, 0};
    static char flagbuf[96][48];
    int c, nf = 0, dummy = 0;
    double shutdown_s = 30;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (c == 'h') {
            help(stdout);
            return 0;
        }
        if (c == '?' || nf == 96) {
            help(stderr);
            return 2;
        }
        if (c == 4002) {
            embed_model = optarg;
            continue;
        }
        if (c >= 4000) { /* engine switches */
            arg(&w, c == 4000 ? "--enable-prefix-caching" : c == 4001 ? "--no-enable-prefix-caching"
                    : c == 4003 ? "--enable-expert-parallel" : "--enable-lora");
            continue;
        }
        const char *name = names[c - 1000];
        snprintf(flagbuf[nf], sizeof flagbuf[nf], "--%s", name);
        int to_w = in(wflags, name) || in(both, name), to_g = !in(wflags, name);
        if (!strcmp(name, "load-format") && !strcmp(optarg, "dummy")) dummy = 1;
        if (!strcmp(name, "shutdown-timeout") && cm_parse_double("--shutdown-timeout", optarg, 0, 86400, &shutdown_s)) return 2;
        if (to_w) {
            arg(&w, flagbuf[nf]);
            if (optarg) arg(&w, optarg);
        }
        if ((in(both, name) && strcmp(name, "served-model-name")) || !strcmp(name, "threads")) { /* the embedding group's too */
            arg(&ew, flagbuf[nf]);
            if (optarg) arg(&ew, optarg);
        }
        if (to_g) {
            arg(&g, flagbuf[nf]);
            if (optarg) arg(&g, optarg);
        }
        nf++;
    }
    if (optind < argc) model = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "llmserve serve: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!dummy && access(model, R_OK)) {
        fprintf(stderr, "llmserve serve: cannot read model %s (tools/setup.sh fetches the default one)\n", model);
        return 1;
    }
    if (!dummy) { /* the gateway needs no model file: the worker's handshake carries the tokenizer */
        arg(&w, "--model");
        arg(&w, model);
    }
    if (embed_model && access(embed_model, R_OK)) {
        fprintf(stderr, "llmserve serve: cannot read embedding model %s (tools/setup.sh fetches all-MiniLM-L6-v2)\n",
                embed_model);
        return 1;
    }
    snprintf(workers, sizeof workers, "%s%s%s", ipc, embed_model ? "," : "", embed_model ? eipc : "");
    arg(&ew, "--model");
    arg(&ew, embed_model ? embed_model : "");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    fprintf(stderr, "llmserve serve: %s; worker group on %s, gateway for the OpenAI API\n", dummy ? "dummy weights" : model,
            ipc);
    if (embed_model) fprintf(stderr, "llmserve serve: embedding model %s on %s (/v1/embeddings)\n", embed_model, eipc);
    spawn(&w);
    if (embed_model) spawn(&ew);
    spawn(&g);
    child *kids[3] = {&w, &g, &ew};
    int refused = 0;
    while (!stop_flag) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < 3; i++) {
            child *ch = kids[i];
            if (ch->pid != p || stop_flag) continue;
            double up = cm_now() - ch->started;
            ch->backoff = up > 30 ? 0.5 : ch->backoff ? (ch->backoff * 2 > 30 ? 30 : ch->backoff * 2) : 0.5;
            /* exit 2: a flag or a model file the child refuses; on its first start (a large model's load can
               take minutes before it fails) or within seconds of a restart, stop rather than loop */
            if (WIFEXITED(st) && (WEXITSTATUS(st) == 2 || WEXITSTATUS(st) == 127) && (up < 5 || !ch->restarts)) {
                fprintf(stderr, "llmserve serve: the %s refused its arguments or its model (exit %d); stopping\n", ch->name,
                        WEXITSTATUS(st));
                stop_flag = 1;
                refused = 1;
                break;
            }
            fprintf(stderr, "llmserve serve: the %s (pid %d) %s %d; restarting in %.1f s\n", ch->name, (int)p,
                    WIFSIGNALED(st) ? "was killed by signal" : "exited with", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st),
                    ch->backoff);
            struct timespec d = {(time_t)ch->backoff, (long)((ch->backoff - (double)(time_t)ch->backoff) * 1e9)};
            nanosleep(&d, NULL);
            if (!stop_flag) {
                ch->restarts++;
                spawn(ch);
            }
        }
    }
    /* drain: the gateway first (its streams still need the worker), then the worker */
    fprintf(stderr, "llmserve serve: draining (up to %.0f s; a second signal stops at once)\n", shutdown_s);
    stop_child(&g, SIGTERM);
    reap(&g, shutdown_s + 5);
    stop_child(&w, SIGTERM);
    stop_child(&ew, SIGTERM);
    reap(&w, stop_flag > 1 ? 0.5 : 15);
    reap(&ew, stop_flag > 1 ? 0.5 : 15);
    fprintf(stderr, "llmserve serve: stopped\n");
    return refused ? 2 : 0;
}
