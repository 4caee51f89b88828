/* llmserve bench serve: load against any OpenAI-compatible server, with
 * vLLM's `vllm bench serve` flags and result keys. One thread per request
 * slot (--max-concurrency), arrivals from a Poisson (gamma with
 * --burstiness) process, streaming so TTFT and inter-token latencies are
 * seen as the client sees them. Token counts come from the server's usage
 * (or, when a server sends none, one token per streamed chunk).
 * --sweep runs one point per value and finds the capacity knee. */
#include "cm_error.h"
#include "cm_model.h"
#include "cm_parse.h"
#include "cm_time.h"
#include "cm_tokenizer.h"
#include "tl_common.h"
#include "tl_plan.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "tl_bench_int.h"

/* "http://host:port/prefix" -> host, port, path prefix + endpoint. */
static int parse_target(const char *base, const char *endpoint, const char *api_key, bench_target *t) {
    memset(t, 0, sizeof *t);
    if (!strncmp(base, "https://", 8)) {
        fprintf(stderr, "llmserve bench: https is not supported; put the server behind plain http for the bench\n");
        return 2;
    }
    const char *hp = strstr(base, "://") ? strstr(base, "://") + 3 : base;
    size_t hl = strcspn(hp, ":/");
    const char *rest = hp + hl, *port = "80";
    size_t pl = 2;
    if (*rest == ':') {
        port = rest + 1;
        pl = strcspn(port, "/");
        rest = port + pl;
    }
    size_t bl = strlen(rest);
    while (bl && rest[bl - 1] == '/') bl--;
    if (!hl || hl >= sizeof t->host || !pl || pl >= sizeof t->port || strspn(port, "0123456789") < pl ||
        bl + strlen(endpoint) >= sizeof t->path || endpoint[0] != '/') {
        fprintf(stderr, "llmserve bench: bad --base-url '%s' or --endpoint '%s'\n", base, endpoint);
        return 2;
    }
    memcpy(t->host, hp, hl);
    memcpy(t->port, port, pl);
    snprintf(t->path, sizeof t->path, "%.*s%s", (int)bl, rest, endpoint);
    if (api_key && (strlen(api_key) > 250 || strpbrk(api_key, "\r\n"))) {
        fprintf(stderr, "llmserve bench: --api-key must be one line of at most 250 characters\n");
        return 2;
    }
    if (api_key) snprintf(t->auth, sizeof t->auth, "Authorization: Bearer %s\r\n", api_key);
    return 0;
}

static int parse_lists(bench_opts *o, const char *pcts, const char *metrics) {
    o->np = 0;
    for (const char *p = pcts; *p;) {
        char *end;
        double x = strtod(p, &end);
        if (end == p || (*end && *end != ',') || !(x > 0 && x <= 100) || o->np == 16) {
            fprintf(stderr, "llmserve bench: --metric-percentiles expects up to 16 numbers in (0, 100], like 50,90,99\n");
            return 2;
        }
        o->pcts[o->np++] = x;
        p = *end ? end + 1 : end;
    }
    memset(o->show, 0, sizeof o->show);
    for (const char *p = metrics; *p;) {
        size_t l = strcspn(p, ",");
        int m = 0;
        while (m < N_METRICS && (strlen(tlb_metric_names[m]) != l || strncmp(p, tlb_metric_names[m], l))) m++;
        if (m == N_METRICS) {
            fprintf(stderr, "llmserve bench: --percentile-metrics expects a list of ttft,tpot,itl,e2el\n");
            return 2;
        }
        o->show[m] = 1;
        p += l + (p[l] == ',');
    }
    for (const char *p = o->goodput; p && *p;) {
        p += strspn(p, " ");
        if (!*p) break;
        int m = 0;
        while (m < N_METRICS && (strncmp(p, tlb_metric_names[m], strlen(tlb_metric_names[m])) || p[strlen(tlb_metric_names[m])] != ':'))
            m++;
        char *end = NULL;
        double ms = m < N_METRICS && m != M_ITL ? strtod(p + strlen(tlb_metric_names[m]) + 1, &end) : 0;
        if (!end || !(ms > 0) || (*end && *end != ' ')) {
            fprintf(stderr, "llmserve bench: --goodput expects \"ttft:MS tpot:MS e2el:MS\" (any of them), got '%s'\n",
                    o->goodput);
            return 2;
        }
        o->g[m] = ms / 1e3;
        p = end;
    }
    return 0;
}

static void usage(void) {
    printf("usage: llmserve bench serve [flags]\n"
           "  --base-url URL              server (default http://127.0.0.1:8000)\n"
           "  --endpoint PATH             /v1/completions (default) or /v1/chat/completions\n"
           "  --model NAME                model field of the requests\n"
           "  --api-key KEY               sent as a bearer token\n"
           "  --tokenizer GGUF            count prompt and output tokens with this model's tokenizer\n"
           "                              (default: the server's usage, else one token per streamed chunk)\n"
           "  --dataset-name NAME         random (default), prefix-repetition, sharegpt, or mixed: random\n"
           "                              requests with a share of long prompts, TTFT and ITL reported per class\n"
           "  --dataset-path FILE         ShareGPT JSON for --dataset-name sharegpt\n"
           "  --num-prompts N             requests per run (default 100)\n"
           "  --random-input-len N        words per random prompt (default 256)\n"
           "  --random-output-len N       max_tokens per request (default 128)\n"
           "  --random-range-ratio F      lengths drawn in [1-F, 1+F] x the mean (default 0)\n"
           "  --prefix-repetition-prefix-len N, -suffix-len N, -num-prefixes N, -output-len N (256, 256, 10, 128)\n"
           "  --mixed-long-fraction F     mixed: the share of long prompts (default 0.1)\n"
           "  --mixed-long-input-len N    mixed: their words (default 2048; --random-range-ratio applies)\n"
           "  --mixed-long-output-len N   mixed: their max_tokens (default 16)\n"
           "  --request-rate R|inf        arrivals per second (default inf: all at once)\n"
           "  --burstiness F              gamma shape of the arrivals; 1 is Poisson (default 1)\n"
           "  --max-concurrency N         requests in flight at most (default: no limit)\n"
           "  --num-warmups N             requests sent one at a time first, not counted (default 0)\n"
           "  --seed N                    prompts and arrivals (default 0)\n"
           "  --ignore-eos                generate max_tokens whatever the model says\n"
           "  --percentile-metrics LIST   metrics printed with percentiles (default ttft,tpot,itl,e2el)\n"
           "  --metric-percentiles LIST   percentiles (default 50,90,99)\n"
           "  --goodput \"ttft:MS tpot:MS e2el:MS\"  SLOs a request must meet to count as good\n"
           "  --save-result               write the result JSON (a name like vLLM's)\n"
           "  --result-dir DIR            where result files go (default .)\n"
           "  --result-filename F         the result JSON's name (a sweep: the base of its files)\n"
           "  --sweep max-concurrency=1,2,4,...|request-rate=1,2,4,...\n"
           "                              one run per value; a table, the knee, a plot (SVG; PNG if a converter)\n"
           "  --sweep-metric M            latency of the knee and plot: ttft, tpot, itl or e2el (default e2el)\n"
           "  --sweep-min-gain F          knee: the next point gains less than F of throughput (default 0.10)\n"
           "  --sweep-slo MS              knee: the largest point whose p99 of --sweep-metric is within MS\n"
           "Ctrl-C stops: what finished is reported, the rest is not counted (exit 130).\n");
}

/* llmserve bench plot SWEEP.json OUT.svg: redraws a saved sweep. */
static int plot_main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: llmserve bench plot SWEEP.json OUT.svg\n");
        return 2;
    }
    json_error_t je;
    json_t *sw = json_load_file(argv[2], 0, &je), *pts = json_object_get(sw, "points");
    const char *param = json_string_value(json_object_get(sw, "sweep")),
               *mn = json_string_value(json_object_get(sw, "latency_metric"));
    size_t n = json_array_size(pts);
    if (!sw || !param || !mn || n == 0 || n > 64 || strlen(mn) > 8) {
        fprintf(stderr, "llmserve bench plot: %s is not a sweep result of llmserve bench serve --sweep\n", argv[2]);
        json_decref(sw);
        return 2;
    }
    double val[64], thr[64], lat[64];
    char key[32];
    snprintf(key, sizeof key, "p99_%s_ms", mn);
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_array_get(pts, i);
        val[i] = tlb_num_of(p, "sweep_value");
        thr[i] = tlb_num_of(p, "output_throughput");
        lat[i] = tlb_num_of(p, key);
    }
    int knee = json_is_true(json_object_get(sw, "knee_reached")) || tlb_num_of(sw, "slo_ms") > 0
                   ? (int)json_integer_value(json_object_get(sw, "knee_index"))
                   : -1;
    const char *model = json_string_value(json_object_get(json_array_get(pts, 0), "model_id"));
    char title[200];
    snprintf(title, sizeof title, "%.120s: throughput vs p99 %s, sweep of %s", model ? model : "server", mn, param);
    FILE *f = fopen(argv[3], "w");
    int bad = !f || tl_bench_svg(f, title, param, val, thr, lat, (int)n, mn, knee, tlb_num_of(sw, "slo_ms"));
    if (f && fclose(f)) bad = 1;
    json_decref(sw);
    if (bad) fprintf(stderr, "llmserve bench plot: cannot write %s\n", argv[3]);
    return bad;
}

int tl_bench_main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "plot")) return plot_main(argc, argv);
    if (argc < 2 || strcmp(argv[1], "serve")) {
        fprintf(stderr, "usage: llmserve bench serve [flags]   (--help for the flags)\n"
                        "       llmserve bench plot SWEEP.json OUT.svg\n");
        return 2;
    }
    argc--;
    argv++;
    bench_opts o = {.endpoint = "/v1/completions", .dataset = "random", .rate = INFINITY, .burst = 1,
                    .min_gain = 0.10, .num = 100, .in_len = 256, .out_len = 128, .px_len = 256, .sx_len = 256,
                    .n_px = 10, .px_out = 128, .sweep_metric = M_E2EL, .long_frac = 0.1, .long_in = 2048,
                    .long_out = 16};
    const char *base = "http://127.0.0.1:8000", *api_key = NULL, *pcts = "50,90,99", *pmetrics = "ttft,tpot,itl,e2el",
               *dataset_path = NULL;
    enum { O_PXL = 256, O_SXL, O_NPX, O_PXO, O_DSP, O_PM, O_RD, O_SW, O_SWM, O_SWG, O_SWS, O_TOK, O_MLF, O_MLI, O_MLO };
    const char *tok_path = NULL;
    static const struct option lo[] = {
        {"base-url", 1, 0, 'u'}, {"endpoint", 1, 0, 'e'}, {"model", 1, 0, 'm'}, {"dataset-name", 1, 0, 'd'},
        {"num-prompts", 1, 0, 'n'}, {"random-input-len", 1, 0, 'i'}, {"random-output-len", 1, 0, 'o'},
        {"random-range-ratio", 1, 0, 'R'}, {"request-rate", 1, 0, 'r'}, {"burstiness", 1, 0, 'b'},
        {"max-concurrency", 1, 0, 'c'}, {"num-warmups", 1, 0, 'w'}, {"seed", 1, 0, 's'}, {"ignore-eos", 0, 0, 'E'},
        {"metric-percentiles", 1, 0, 'p'}, {"goodput", 1, 0, 'g'}, {"save-result", 0, 0, 'S'},
        {"result-filename", 1, 0, 'f'}, {"api-key", 1, 0, 'k'}, {"prefix-repetition-prefix-len", 1, 0, O_PXL},
        {"prefix-repetition-suffix-len", 1, 0, O_SXL}, {"prefix-repetition-num-prefixes", 1, 0, O_NPX},
        {"prefix-repetition-output-len", 1, 0, O_PXO}, {"dataset-path", 1, 0, O_DSP},
        {"percentile-metrics", 1, 0, O_PM}, {"result-dir", 1, 0, O_RD}, {"sweep", 1, 0, O_SW},
        {"sweep-metric", 1, 0, O_SWM}, {"sweep-min-gain", 1, 0, O_SWG}, {"sweep-slo", 1, 0, O_SWS},
        {"tokenizer", 1, 0, O_TOK}, {"mixed-long-fraction", 1, 0, O_MLF}, {"mixed-long-input-len", 1, 0, O_MLI},
        {"mixed-long-output-len", 1, 0, O_MLO},
        {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int c, bad = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'u': base = optarg; break;
        case 'e': o.endpoint = optarg; break;
        case 'm': o.model = optarg; break;
        case 'd': o.dataset = optarg; break;
        case 'n': bad |= cm_parse_long("--num-prompts", optarg, 1, 1000000, &o.num); break;
        case 'i': bad |= cm_parse_long("--random-input-len", optarg, 1, 1000000, &o.in_len); break;
        case 'o': bad |= cm_parse_long("--random-output-len", optarg, 1, 1000000, &o.out_len); break;
        case 'R': bad |= cm_parse_double("--random-range-ratio", optarg, 0, 0.999, &o.range); break;
        case 'r':
            if (!strcmp(optarg, "inf")) o.rate = INFINITY;
            else bad |= cm_parse_double("--request-rate", optarg, 1e-6, 1e9, &o.rate);
            break;
        case 'b': bad |= cm_parse_double("--burstiness", optarg, 1e-3, 1e3, &o.burst); break;
        case 'c': bad |= cm_parse_long("--max-concurrency", optarg, 1, 100000, &o.max_conc); break;
        case 'w': bad |= cm_parse_long("--num-warmups", optarg, 0, 10000, &o.warm); break;
        case 's': bad |= cm_parse_long("--seed", optarg, 0, 1L << 40, &o.seed); break;
        case 'E': o.ignore_eos = 1; break;
        case 'p': pcts = optarg; break;
        case 'g': o.goodput = optarg; break;
        case 'S': o.save = 1; break;
        case 'f': o.result_file = optarg; break;
        case 'k': api_key = optarg; break;
        case O_PXL: bad |= cm_parse_long("--prefix-repetition-prefix-len", optarg, 0, 1000000, &o.px_len); break;
        case O_SXL: bad |= cm_parse_long("--prefix-repetition-suffix-len", optarg, 1, 1000000, &o.sx_len); break;
        case O_NPX: bad |= cm_parse_long("--prefix-repetition-num-prefixes", optarg, 1, 100000, &o.n_px); break;
        case O_PXO: bad |= cm_parse_long("--prefix-repetition-output-len", optarg, 1, 1000000, &o.px_out); break;
        case O_DSP: dataset_path = optarg; break;
        case O_PM: pmetrics = optarg; break;
        case O_RD: o.result_dir = optarg; break;
        case O_SW: o.sweep = optarg; break;
        case O_SWM: {
            int m = 0;
            while (m < N_METRICS && strcmp(optarg, tlb_metric_names[m])) m++;
            if (m == N_METRICS) {
                fprintf(stderr, "llmserve bench: --sweep-metric expects ttft, tpot, itl or e2el\n");
                bad = 1;
            }
            o.sweep_metric = m < N_METRICS ? m : M_E2EL;
            break;
        }
        case O_SWG: bad |= cm_parse_double("--sweep-min-gain", optarg, 0, 10, &o.min_gain); break;
        case O_SWS: bad |= cm_parse_double("--sweep-slo", optarg, 1e-3, 1e9, &o.slo); break;
        case O_TOK: tok_path = optarg; break;
        case O_MLF: bad |= cm_parse_double("--mixed-long-fraction", optarg, 0, 1, &o.long_frac); break;
        case O_MLI: bad |= cm_parse_long("--mixed-long-input-len", optarg, 1, 1000000, &o.long_in); break;
        case O_MLO: bad |= cm_parse_long("--mixed-long-output-len", optarg, 1, 1000000, &o.long_out); break;
        case 'h': usage(); return 0;
        default: return 2;
        }
    }
    if (bad || optind < argc) {
        if (optind < argc) fprintf(stderr, "llmserve bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (parse_target(base, o.endpoint, api_key, &o.tg) || parse_lists(&o, pcts, pmetrics)) return 2;
    o.chat = strstr(o.endpoint, "chat") != NULL;
    if (strcmp(o.dataset, "random") && strcmp(o.dataset, "prefix-repetition") && strcmp(o.dataset, "sharegpt") &&
        strcmp(o.dataset, "mixed")) {
        fprintf(stderr, "llmserve bench: --dataset-name must be random, prefix-repetition, sharegpt or mixed\n");
        return 2;
    }
    if (o.result_dir) {
        struct stat st;
        if (mkdir(o.result_dir, 0755) && errno != EEXIST) {
            fprintf(stderr, "llmserve bench: cannot create --result-dir %s: %s\n", o.result_dir, strerror(errno));
            return 2;
        }
        if (stat(o.result_dir, &st) || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "llmserve bench: --result-dir %s is not a directory\n", o.result_dir);
            return 2;
        }
    }
    if (!strcmp(o.dataset, "sharegpt")) {
        char err[512];
        if (!dataset_path) {
            fprintf(stderr, "llmserve bench: --dataset-name sharegpt needs --dataset-path FILE\n");
            return 2;
        }
        if (tlb_load_sharegpt(dataset_path, (int)(o.num + o.warm), &o.sg, &o.sg_out, &o.n_sg, err, sizeof err)) {
            fprintf(stderr, "llmserve bench: %s\n", err);
            return 2;
        }
    }
    cm_model_file *tok_file = NULL;
    if (tok_path) { /* the model's GGUF: its tokenizer counts prompt and output tokens on this side */
        char err[512];
        int trc = cm_model_open(tok_path, &tok_file, err, sizeof err);
        if (!trc && tok_file->format != CM_FMT_GGUF) {
            snprintf(err, sizeof err, "%s: --tokenizer takes a GGUF model file", tok_path);
            trc = LLM_EFORMAT;
        }
        if (!trc && (trc = cm_tok_from_gguf(tok_file->gguf, &o.tok, err, sizeof err)) == 0) tlb_keep_text = 1;
        if (trc) {
            fprintf(stderr, "llmserve bench: --tokenizer %s\n", err);
            cm_model_close(tok_file);
            return 2;
        }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = tlb_on_int;
    sigaction(SIGINT, &sa, NULL);
    int rc;
    if (o.sweep) rc = tlb_run_sweep(&o);
    else {
        json_t *res;
        int done = tlb_run_point(&o, o.rate, o.max_conc, (uint64_t)o.seed, &res);
        json_decref(res);
        rc = tlb_stop ? 130 : done > 0 ? 0 : 1;
    }
    for (int i = 0; i < o.n_sg; i++) free(o.sg[i]);
    free(o.sg);
    free(o.sg_out);
    cm_tok_free(o.tok);
    cm_model_close(tok_file);
    return rc;
}

