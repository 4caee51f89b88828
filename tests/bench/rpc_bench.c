/* llmserve-rpc-bench: what the RPC adds to every streamed token.
 *
 *   llmserve-rpc-bench --worker build/llmserve-worker [--model PATH]
 *       [--tp 1] [--concurrency 1] [--requests 8] [--gen 128] [--threads N]
 *
 * Starts a real worker process on loopback, streams greedy requests through
 * NNG + protobuf, and reports per chunk: transport latency (receive time
 * minus the worker's send stamp, same host clock), inter-token latency at
 * the client, and the worker's own step time (its Stats p50 / p99). */
#include "cm_error.h"
#include "pr_wire.h"

#include <arpa/inet.h>
#include <getopt.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, int n, double p) {
    if (!n) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

int main(int argc, char **argv) {
    const char *worker = "build/llmserve-worker", *model = "models/SmolLM2-135M-Instruct.Q4_1.gguf", *threads = NULL;
    int tp = 1, conc = 1, requests = 8, gen = 128;
    static const struct option lo[] = {{"worker", required_argument, 0, 'w'}, {"model", required_argument, 0, 'm'},
                                       {"tp", required_argument, 0, 't'},     {"concurrency", required_argument, 0, 'c'},
                                       {"requests", required_argument, 0, 'r'}, {"gen", required_argument, 0, 'g'},
                                       {"threads", required_argument, 0, 'T'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'w': worker = optarg; break;
        case 'm': model = optarg; break;
        case 't': tp = atoi(optarg); break;
        case 'c': conc = atoi(optarg); break;
        case 'r': requests = atoi(optarg); break;
        case 'g': gen = atoi(optarg); break;
        case 'T': threads = optarg; break;
        default: return 2;
        }
    }
    if (tp < 1 || conc < 1 || requests < 1 || gen < 1 || conc > requests) return 2;
    signal(SIGPIPE, SIG_IGN);
    char addr[64], tps[16];
    snprintf(addr, sizeof addr, "tcp://127.0.0.1:%d", 20000 + (int)(getpid() % 12000));
    snprintf(tps, sizeof tps, "%d", tp);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char *av[20];
        int n = 0;
        av[n++] = (char *)worker;
        av[n++] = "--model";
        av[n++] = (char *)model;
        av[n++] = "--listen";
        av[n++] = addr;
        av[n++] = "--tensor-parallel-size";
        av[n++] = tps;
        av[n++] = "--kv-cache-memory";
        av[n++] = "512MiB";
        av[n++] = "--max-model-len";
        av[n++] = "2048";
        av[n++] = "--log-level";
        av[n++] = "warn";
        if (threads) {
            av[n++] = "--threads";
            av[n++] = (char *)threads;
        }
        av[n] = NULL;
        execv(worker, av);
        _exit(127);
    }
    nng_socket pull, push;
    nng_listener l;
    nng_sockaddr sa;
    char reply[64];
    if (nng_pull0_open(&pull) || nng_listen(pull, "tcp://127.0.0.1:0", &l, 0) ||
        nng_listener_get_addr(l, NNG_OPT_LOCADDR, &sa) || nng_push0_open(&push) ||
        nng_dial(push, addr, NULL, NNG_FLAG_NONBLOCK)) {
        fprintf(stderr, "sockets failed\n");
        return 1;
    }
    snprintf(reply, sizeof reply, "tcp://127.0.0.1:%u", ntohs(sa.s_in.sa_port));
    nng_socket_set_ms(pull, NNG_OPT_RECVTIMEO, 100);
    Llmserve__Hello h = LLMSERVE__HELLO__INIT;
    h.gateway_id = "bench";
    h.reply_address = reply;
    pr_env he;
    pr_env_init(&he);
    he.body_case = LLMSERVE__ENVELOPE__BODY_HELLO;
    he.hello = &h;
    int up = 0;
    for (double t0 = mono(); !up && mono() - t0 < 120;) {
        pr_send(push, &he, NNG_FLAG_NONBLOCK);
        pr_env *e;
        char err[128];
        if (!pr_recv(pull, &e, 0, NULL, err, sizeof err)) {
            up = e->body_case == LLMSERVE__ENVELOPE__BODY_HEALTH;
            pr_free(e);
        }
    }
    if (!up) {
        fprintf(stderr, "worker did not come up\n");
        kill(pid, SIGKILL);
        return 1;
    }
    int32_t prompt[32];
    for (int i = 0; i < 32; i++) prompt[i] = 1000 + i * 37;
    int cap = requests * (gen + 2);
    double *lat = malloc(sizeof(double) * (size_t)cap), *itl = malloc(sizeof(double) * (size_t)cap);
    double *last = calloc((size_t)requests, sizeof(double));
    int nl = 0, ni = 0, sent = 0, done = 0;
    Llmserve__SamplingParams sp = LLMSERVE__SAMPLING_PARAMS__INIT;
    sp.has_temperature = sp.has_max_tokens = sp.has_ignore_eos = 1;
    sp.temperature = 0;
    sp.max_tokens = gen;
    sp.ignore_eos = 1;
    double t_start = mono(), hb = mono();
    while (done < requests) {
        while (sent < requests && sent - done < conc) {
            prompt[0] = 2000 + sent; /* no prefix sharing between requests */
            Llmserve__Generate g = LLMSERVE__GENERATE__INIT;
            g.request_id = (uint64_t)sent;
            g.n_token_ids = 32;
            g.token_ids = prompt;
            g.params = &sp;
            g.gateway_id = "bench";
            pr_env e;
            pr_env_init(&e);
            e.body_case = LLMSERVE__ENVELOPE__BODY_GENERATE;
            e.generate = &g;
            pr_send(push, &e, 0);
            sent++;
        }
        if (mono() - hb > 0.5) {
            pr_send(push, &he, NNG_FLAG_NONBLOCK);
            hb = mono();
        }
        pr_env *e;
        char err[128];
        if (pr_recv(pull, &e, 0, NULL, err, sizeof err)) continue;
        if (e->body_case == LLMSERVE__ENVELOPE__BODY_CHUNK) {
            Llmserve__TokenChunk *ch = e->chunk;
            uint64_t now_ns = wall_ns();
            double t = mono();
            if (ch->has_sent_unix_ns && now_ns > ch->sent_unix_ns && nl < cap) lat[nl++] = (double)(now_ns - ch->sent_unix_ns) * 1e-6;
            uint64_t r = ch->request_id;
            if (r < (uint64_t)requests) {
                if (last[r] > 0 && ni < cap) itl[ni++] = (t - last[r]) * 1e3;
                last[r] = t;
            }
            if (ch->has_finish && ch->finish) done++;
        }
        pr_free(e);
    }
    double wall = mono() - t_start;
    /* the worker's own step times */
    Llmserve__StatsRequest sr = LLMSERVE__STATS_REQUEST__INIT;
    sr.gateway_id = "bench";
    pr_env se;
    pr_env_init(&se);
    se.body_case = LLMSERVE__ENVELOPE__BODY_STATS_REQUEST;
    se.stats_request = &sr;
    pr_send(push, &se, 0);
    double p50 = 0, p99 = 0;
    for (double t0 = mono(); mono() - t0 < 10;) {
        pr_env *e;
        char err[128];
        if (pr_recv(pull, &e, 0, NULL, err, sizeof err)) continue;
        int got = e->body_case == LLMSERVE__ENVELOPE__BODY_STATS;
        if (got) {
            p50 = e->stats->step_ms_p50;
            p99 = e->stats->step_ms_p99;
        }
        pr_free(e);
        if (got) break;
    }
    printf("tp %d, concurrency %d, %d requests x %d tokens in %.2f s (%.1f tok/s)\n", tp, conc, requests, gen, wall,
           requests * gen / wall);
    printf("  transport per chunk (worker send -> client receive): p50 %.3f ms, p99 %.3f ms\n", pct(lat, nl, 0.5),
           pct(lat, nl, 0.99));
    printf("  inter-token latency at the client:                   p50 %.2f ms, p99 %.2f ms\n", pct(itl, ni, 0.5),
           pct(itl, ni, 0.99));
    printf("  worker step time (Stats):                            p50 %.2f ms, p99 %.2f ms\n", p50, p99);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    nng_close(pull);
    nng_close(push);
    free(lat);
    free(itl);
    free(last);
    return 0;
}
