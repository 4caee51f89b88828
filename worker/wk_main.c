/* llmserve-worker: one model replica serving gateways over NNG. */
#include "cm_error.h"
#include "cm_log.h"
#include "cm_model.h"
#include "cm_parse.h"
#include "wk_flags.h"
#include "pr_wire.h"
#include "wk_server.h"
#include "wk_tp.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { /* the first drains, a second stops at once */
    (void)sig;
    stop_flag = stop_flag + 1;
}

static void help(FILE *f) {
    fprintf(f,
            "usage: llmserve-worker [flags]\n"
            "  --model PATH              GGUF model (default $LLMSERVE_MODEL or " DEFAULT_MODEL ")\n"
            "  --listen ADDR             tcp://HOST:PORT or ipc://PATH (default tcp://127.0.0.1:7600)\n"
            "  --tensor-parallel-size N  split the model over N rank processes (default 1)\n"
            "  --pipeline-parallel-size P  split the layers into P stages, each --tensor-parallel-size ranks, which\n"
            "                            pass each step's hidden rows on (CPU; --ranks-per-node equal to the TP size\n"
            "                            puts a stage on each host; default 1)\n"
            "  --rank R                  (internal / multi-host) join a group as rank R\n"
            "  --ranks-per-node K        ranks on each host (default: all of them on this one); this process runs\n"
            "                            the first of its host's and starts the other K-1\n"
            "  --node-index N            this host's place in a multi-host group: its ranks are N*K..N*K+K-1\n"
            "                            (LeaderWorkerSet's LWS_WORKER_INDEX)\n"
            "  --group-address ADDR      the group's control channel (default: ipc in /tmp)\n"
            "  --join-timeout S          how long the group waits for all its ranks to join (pods still pending or\n"
            "                            pulling images), before the load (default 1800; 0: no limit)\n"
            "  --collective-timeout S    a rank that does not arrive at a step's collective within S is taken as\n"
            "                            hung and the group ends; an idle group's rank 0 keeps the others within it\n"
            "                            (default 120; 0: no limit)\n"
            "  --load-timeout S          the model must load (and warm up) within S (the group's join aside), else the\n"
            "                            probes answer 503 and the process exits 1 (default 0: no limit)\n"
            "  --threads N               CPU threads per rank (default: all CPUs / N)\n"
            "  --worker-id ID            name in Health and logs (default: hostname:pid)\n"
            "  --served-model-name NAME  model name reported to gateways (default: file name)\n"
            "  --heartbeat-timeout MS    drop a silent gateway after MS (default 5000)\n"
            "  --max-waiting N           queued requests before refusing new ones (default 1024)\n"
            "  --shutdown-timeout S      on SIGTERM, let running requests finish for up to S seconds (default 30)\n"
            "  --rpc-secret-file PATH    a secret shared with the gateways: messages without it are refused (chmod 600)\n"
            "  --health-port N           HTTP probes on N: /live, /ready, /health, and /metrics (default 0: none)\n"
            "  --health-host HOST        the probes' address (default 0.0.0.0: the kubelet calls the pod's address)\n"
            "  --no-warmup               take requests without running one short request first\n"
            "  --kv-transfer-config JSON disaggregated prefill and decode, vLLM's spelling: '{\"kv_role\":\n"
            "                            \"kv_producer\"}' prefills and sends the prompt's KV to the decode group the\n"
            "                            gateway names; \"kv_consumer\" decodes and adopts KV sent to it (kept in a\n"
            "                            memory tier of kv_buffer_size bytes, default 1e9, or --kv-offloading-size);\n"
            "                            \"kv_both\" (the default) does both itself\n"
            "  --log-level L             error|warn|info|debug (default info)\n"
            "  -h, --help\n" WK_ENGINE_FLAGS_HELP WK_MODEL_FLAGS_HELP);
}

static int run(int argc, char **argv) {
    const char *model = getenv("LLMSERVE_MODEL") ? getenv("LLMSERVE_MODEL") : DEFAULT_MODEL;
    const char *listen = "tcp://127.0.0.1:7600", *group = NULL, *worker_id = NULL, *served = NULL;
    int tp = 1, pp = 1, rank = -1, threads = 0, hb = 5000, max_waiting = 1024, shutdown_s = 30, health_port = 0, warmup = 1;
    const char *health_host = "0.0.0.0";
    int per_node = 0, node_index = -1, kv_role = WK_KV_BOTH;
    size_t kv_buffer = 1000000000; /* vLLM's kv_buffer_size default */
    double join_s = 1800, coll_s = WK_COMM_TIMEOUT_S, load_s = 0;
    wk_engine_opts eo;
    wk_engine_opts_default(&eo);
    cm_log_set_level(CM_LOG_INFO);
    enum { O_MODEL = 1, O_LISTEN, O_TP, O_RANK, O_GROUP, O_THREADS, O_WID, O_NAME, O_HB, O_MAXW, O_LOG, O_SHUT, O_SECRET, O_HPORT, O_HHOST,
           O_NOWARM, O_PERNODE, O_NODEIDX, O_JOINT, O_COLLT, O_LOADT, O_KVXFER, O_PP };
    static const struct option lo[] = {{"model", required_argument, 0, O_MODEL},
                                       {"listen", required_argument, 0, O_LISTEN},
                                       {"tensor-parallel-size", required_argument, 0, O_TP},
                                       {"pipeline-parallel-size", required_argument, 0, O_PP},
                                       {"rank", required_argument, 0, O_RANK},
                                       {"group-address", required_argument, 0, O_GROUP},
                                       {"threads", required_argument, 0, O_THREADS},
                                       {"worker-id", required_argument, 0, O_WID},
                                       {"served-model-name", required_argument, 0, O_NAME},
                                       {"heartbeat-timeout", required_argument, 0, O_HB},
                                       {"max-waiting", required_argument, 0, O_MAXW},
                                       {"log-level", required_argument, 0, O_LOG},
                                       {"shutdown-timeout", required_argument, 0, O_SHUT},
                                       {"rpc-secret-file", required_argument, 0, O_SECRET},
                                       {"health-port", required_argument, 0, O_HPORT},
                                       {"health-host", required_argument, 0, O_HHOST},
                                       {"no-warmup", no_argument, 0, O_NOWARM},
                                       {"ranks-per-node", required_argument, 0, O_PERNODE},
                                       {"node-index", required_argument, 0, O_NODEIDX},
                                       {"join-timeout", required_argument, 0, O_JOINT},
                                       {"collective-timeout", required_argument, 0, O_COLLT},
                                       {"load-timeout", required_argument, 0, O_LOADT},
                                       {"kv-transfer-config", required_argument, 0, O_KVXFER},
                                       {"help", no_argument, 0, 'h'},
                                       WK_ENGINE_LONGOPTS,
                                       WK_MODEL_LONGOPTS,
                                       {0, 0, 0, 0}};
    wk_load_flags lf = {0};
    int c, lvl;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case O_MODEL: model = optarg; break;
        case O_LISTEN: listen = optarg; break;
        case O_TP: bad = cm_parse_int("--tensor-parallel-size", optarg, 1, 64, &tp); break;
        case O_PP: bad = cm_parse_int("--pipeline-parallel-size", optarg, 1, 64, &pp); break;
        case O_RANK: bad = cm_parse_int("--rank", optarg, 0, 63, &rank); break;
        case O_GROUP: group = optarg; break;
        case O_THREADS: bad = cm_parse_int("--threads", optarg, 1, 1024, &threads); break;
        case O_WID: worker_id = optarg; break;
        case O_NAME: served = optarg; break;
        case O_HB: bad = cm_parse_int("--heartbeat-timeout", optarg, 100, 3600000, &hb); break;
        case O_MAXW: bad = cm_parse_int("--max-waiting", optarg, 1, 1 << 20, &max_waiting); break;
        case O_SHUT: bad = cm_parse_int("--shutdown-timeout", optarg, 0, 86400, &shutdown_s); break;
        case O_HPORT: bad = cm_parse_int("--health-port", optarg, 0, 65535, &health_port); break;
        case O_HHOST: health_host = optarg; break;
        case O_NOWARM: warmup = 0; break;
        case O_PERNODE: bad = cm_parse_int("--ranks-per-node", optarg, 1, 64, &per_node); break;
        case O_NODEIDX: bad = cm_parse_int("--node-index", optarg, 0, 63, &node_index); break;
        case O_JOINT: bad = cm_parse_double("--join-timeout", optarg, 0, 86400, &join_s); break;
        case O_COLLT: bad = cm_parse_double("--collective-timeout", optarg, 0, 86400, &coll_s); break;
        case O_LOADT: bad = cm_parse_double("--load-timeout", optarg, 0, 86400, &load_s); break;
        case O_KVXFER: {
            char e2[256];
            if ((bad = wk_kv_transfer_config_parse(optarg, &kv_role, &kv_buffer, e2, sizeof e2) != 0))
                fprintf(stderr, "llmserve-worker: %s\n", e2);
            break;
        }
        case O_SECRET: {
            char e2[512];
            if (pr_load_secret_file(optarg, e2, sizeof e2)) {
                fprintf(stderr, "llmserve-worker: %s\n", e2);
                bad = 1;
            }
            break;
        }
        case O_LOG:
            if (cm_log_parse_level(optarg, &lvl)) {
                fprintf(stderr, "llmserve-worker: --log-level expects error|warn|info|debug\n");
                bad = 1;
            } else {
                cm_log_set_level(lvl);
            }
            break;
        case 'h': help(stdout); return 0;
        default:
            if (c >= WK_MODEL_FLAG_BASE) {
                bad = wk_model_flag(&lf, c, optarg) != 0;
                break;
            }
            if (c >= WK_FLAG_BASE) {
                bad = wk_engine_flag(&eo, c, optarg) != 0;
                break;
            }
            help(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "llmserve-worker: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (pp > 1) { /* refused what would cross the stages */
        if (eo.spec.method == WK_SPEC_DRAFT || kv_role != WK_KV_BOTH || eo.kv_offload_bytes || eo.kv_offload_dir) {
            fprintf(stderr, "llmserve-worker: --pipeline-parallel-size runs without %s for now\n",
                    eo.spec.method == WK_SPEC_DRAFT ? "a draft model (speculative decoding by method draft_model "
                                                      "runs on one rank; method ngram runs on the stages)"
                    : kv_role != WK_KV_BOTH        ? "--kv-transfer-config (each stage would send its layers' blocks)"
                                                      : "--kv-offloading-size / --kv-offloading-dir (each stage holds "
                                                        "its layers' blocks)");
            return 2;
        }
    }
    int world = tp * pp; /* the group: ranks = stage x tp + tp_rank */
    if (node_index >= 0) {
        if (!per_node) {
            fprintf(stderr, "llmserve-worker: --node-index goes with --ranks-per-node\n");
            return 2;
        }
        if (rank < 0) rank = node_index * per_node; /* a rank its host's first one started names itself */
    }
    if (per_node && world % per_node) {
        fprintf(stderr, "llmserve-worker: --ranks-per-node %d does not divide the group's %d ranks "
                        "(--tensor-parallel-size x --pipeline-parallel-size)\n", per_node, world);
        return 2;
    }
    /* in a LeaderWorkerSet the group's pod count comes from LWS: a size that disagrees with the flags would
     * leave ranks missing (the join waits --join-timeout) or pods with no rank */
    const char *lws = getenv("LWS_GROUP_SIZE");
    if (lws && node_index >= 0) {
        int pods = 0;
        if (cm_parse_int("LWS_GROUP_SIZE", lws, 1, 64, &pods)) return 2;
        if (pods * per_node != world) {
            fprintf(stderr, "llmserve-worker: LWS_GROUP_SIZE %d pods x --ranks-per-node %d is not the group's "
                            "%d ranks (--tensor-parallel-size x --pipeline-parallel-size)\n", pods, per_node, world);
            return 2;
        }
    }
    if (eo.spec.method == WK_SPEC_DRAFT && world > 1) {
        fprintf(stderr, "llmserve-worker: draft_model speculation runs on one rank; with --tensor-parallel-size %d use "
                        "method ngram\n", world);
        return 2;
    }
    if (kv_role != WK_KV_BOTH && world > 1) {
        fprintf(stderr, "llmserve-worker: --kv-transfer-config %s runs on one rank for now (each rank would send its "
                        "shard of a block to its peer rank); not with --tensor-parallel-size %d\n", wk_kv_role_name(kv_role), world);
        return 2;
    }
    if (kv_role == WK_KV_CONSUMER && !eo.kv_offload_bytes) eo.kv_offload_bytes = kv_buffer; /* where adopted KV waits */
    /* a producer's prefill alone runs whole chunks (--max-num-batched-tokens); the time target keeps the steps
     * short only while it decodes streams (a gateway's --idle-decode) */
    if (kv_role == WK_KV_PRODUCER) eo.step_decoding_only = 1;
    if ((eo.kv_offload_bytes || eo.kv_offload_dir) && world > 1) {
        fprintf(stderr, "llmserve-worker: --kv-offloading-size / --kv-offloading-dir run on one rank for now (each rank "
                        "would keep its shard of a block); not with --tensor-parallel-size %d\n", world);
        return 2;
    }
    if (eo.kv_offload_disk_bytes && !eo.kv_offload_dir) {
        fprintf(stderr, "llmserve-worker: --kv-offloading-disk-size bounds the disk tier of --kv-offloading-dir, "
                        "which is not given\n");
        return 2;
    }
    if (rank >= world) {
        fprintf(stderr, "llmserve-worker: --rank %d is outside the group's %d ranks\n", rank, world);
        return 2;
    }
    char wid[256], name[256];
    if (!worker_id) {
        char host[128] = "worker";
        gethostname(host, sizeof host - 1);
        snprintf(wid, sizeof wid, "%s:%d", host, (int)getpid());
        worker_id = wid;
    }
    wk_model_opts mo = {.model_path = model, .max_batch = eo.max_num_batched_tokens, .pp_size = pp};
    if (wk_model_flags_apply(&lf, &mo)) return 2;
    if (kv_role != WK_KV_BOTH && mo.device != WK_DEV_CPU) {
        fprintf(stderr, "llmserve-worker: --kv-transfer-config %s: KV transfers are built for the CPU backend only (a "
                        "device cache would stage its blocks through pinned host memory, not built yet)\n",
                wk_kv_role_name(kv_role));
        return 2;
    }
    if (!served) {
        cm_model_served_name(model, mo.model_config, name, sizeof name);
        served = name;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    char err[512] = "";
    wk_health *health = NULL; /* from the start: a long load is alive until --load-timeout, not a dead pod */
    if (wk_health_start(health_host, health_port, 30000, &health, err, sizeof err) ||
        wk_health_load_deadline(health, load_s, 0)) {
        wk_health_stop(health);
        fprintf(stderr, "llmserve-worker: %s\n", err[0] ? err : "cannot start the load's watchdog");
        return 1;
    }
    cm_model_file *probe = NULL; /* an embedding model (BERT) runs the encoder instead of the engine */
    int encoder = model && !mo.model_config && cm_model_open(model, &probe, NULL, 0) == 0 && probe->cfg.encoder;
    int layers = probe ? (int)probe->cfg.n_layer : 0;
    cm_model_close(probe);
    if (wk_model_pp_check(pp, layers, err, sizeof err)) {
        fprintf(stderr, "llmserve-worker: %s\n", err);
        wk_health_stop(health);
        return 2;
    }
    if (encoder) {
        if (world > 1 || eo.spec.method != WK_SPEC_NONE || mo.device != WK_DEV_CPU || eo.kv_offload_bytes ||
            eo.kv_offload_dir || kv_role != WK_KV_BOTH) {
            fprintf(stderr, "llmserve-worker: %s is an embedding model: it runs on the CPU, one rank, without "
                            "speculative decoding or a KV cache to offload or transfer\n", model);
            wk_health_stop(health);
            return 2;
        }
        wk_encoder *enc = NULL;
        wk_encoder_opts xo = {.model_path = model, .threads = threads, .max_tokens = eo.max_num_batched_tokens};
        int rc = wk_encoder_load(&xo, &enc, err, sizeof err);
        if (rc) {
            fprintf(stderr, "llmserve-worker: %s\n", err[0] ? err : cm_strerror(rc));
            wk_health_stop(health);
            return rc == LLM_ENOMEM || rc == LLM_EIO ? 1 : 2;
        }
        CM_INFO("embedding model %s: %s, %u layers, dim %u, %u heads, vocab %u, inputs up to %d tokens, %s pooling%s, "
                "isa %s, %d threads, %d tokens a step", enc->file->path, enc->cfg.arch, enc->cfg.n_layer, enc->cfg.dim,
                enc->cfg.n_head, enc->cfg.vocab, wk_encoder_max_len(enc),
                enc->cfg.pooling == CM_POOL_MEAN ? "mean" : enc->cfg.pooling == CM_POOL_CLS ? "CLS" : "last-token",
                enc->cfg.normalize ? ", normalised" : "", kn_isa_name(), kn_pool_size(enc->pool), enc->max_tokens);
        wk_server_opts so = {listen, worker_id, served, hb, max_waiting, 8192, 1, shutdown_s * 1000, health, warmup, 0};
        rc = wk_server_run_embed(enc, &so, &stop_flag, err, sizeof err);
        if (rc) fprintf(stderr, "llmserve-worker: %s\n", err);
        wk_encoder_free(enc);
        wk_health_stop(health);
        return rc ? 1 : 0;
    }
    wk_tp *group_h = NULL;
    int my_rank = rank < 0 ? 0 : rank;
    if (world > 1) {
        wk_health_load_deadline(health, load_s, 1); /* the join has its own deadline */
        /* rank 0 starts ranks 1..world-1 (unless they join on their own with --rank) */
        /* without --ranks-per-node the whole group is on this host: started bare, this process starts it */
        int local = per_node ? per_node : world;
        int spawn = per_node ? (my_rank % per_node == 0 ? per_node : 1) : (rank < 0 ? world : 1);
        wk_tp_opts to = {.size = world,
                         .rank = my_rank,
                         .group_addr = group,
                         .spawn = spawn,
                         /* GPU TP over NCCL; GPU pipeline stages (one GPU each) pass host-staged rows on the
                          * CPU wires */
                         .use_nccl = lf.device == WK_DEV_CUDA && pp == 1,
                         .use_tcp = (lf.device != WK_DEV_CUDA || pp > 1) && per_node && per_node < world, /* hosts share no memory */
                         .device = my_rank % local,
                         .join_timeout_s = join_s,
                         .collective_timeout_s = coll_s,
                         .load_timeout_s = load_s,
                         .pp = pp,
                         .per_node = per_node};
        int rc = wk_tp_start(&to, argc, argv, &group_h, err, sizeof err);
        if (rc) {
            fprintf(stderr, "llmserve-worker: tensor parallel group: %s\n", err);
            wk_health_stop(health);
            return 1;
        }
    }
    if (world > 1) wk_health_load_deadline(health, load_s, 0); /* the clock again, from the group's forming */
    int per_rank = threads ? threads : (int)(sysconf(_SC_NPROCESSORS_ONLN) / world);
    if (per_rank < 1) per_rank = 1;
    mo.threads = per_rank;
    wk_model *m = NULL;
    int rc = wk_model_load_tp(&mo, group_h, &m, err, sizeof err);
    if (rc) {
        fprintf(stderr, "llmserve-worker: %s\n", err[0] ? err : cm_strerror(rc));
        wk_tp_free(group_h);
        wk_health_stop(health);
        /* a file or flags that cannot load (format, unsupported, not found) exit 2: restarting cannot help,
           and the supervisor stops; memory, I/O and the group's sockets may do better next time */
        return rc == LLM_ENOMEM || rc == LLM_EIO || rc == LLM_EDEVICE || rc == LLM_EAGAIN || rc == LLM_ETIMEDOUT ? 1 : 2;
    }
    CM_INFO("model %s: %s, %u layers, dim %u, %u/%u heads, vocab %u, ctx %u, isa %s (%s), %d threads, rank %d of %d",
            m->file->path, m->cfg.arch, m->cfg.n_layer, m->cfg.dim, m->cfg.n_head, m->cfg.n_kv_head, m->cfg.vocab,
            m->cfg.ctx_len, kn_isa_name(), kn_isa_reason(), kn_pool_size(m->pool), my_rank, world);
    if (pp > 1)
        CM_INFO("pipeline stage %d of %d: layers %d..%d%s%s", m->pp_rank, pp, m->layer0, m->layer1 - 1,
                m->pp_rank == 0 ? ", the embeddings" : "", m->pp_rank == pp - 1 ? ", the LM head" : "");
    wk_model *dm = NULL;
    if (eo.spec.method == WK_SPEC_DRAFT) { /* the draft: same device, threads and batch capacity */
        if ((rc = wk_draft_model_load(&mo, m, &eo.spec, &dm, err, sizeof err))) {
            fprintf(stderr, "llmserve-worker: %s\n", err);
            wk_model_free(m);
            wk_tp_free(group_h);
            wk_health_stop(health);
            return 2; /* a flag's value: the supervisor does not retry it */
        }
        eo.draft = dm;
    }
    int ret = 0;
    if (my_rank > 0) {
        wk_health_set_state(health, WK_H_READY); /* loaded and joined: it follows rank 0 from here */
        rc = wk_tp_follow(group_h, m, &eo, &stop_flag, err, sizeof err);
        if (rc) {
            fprintf(stderr, "llmserve-worker rank %d: %s\n", my_rank, err);
            ret = 1;
        }
    } else {
        wk_engine *e = NULL;
        rc = wk_engine_create(m, &eo, &e, err, sizeof err);
        if (!rc && group_h) rc = wk_tp_attach(group_h, e, err, sizeof err);
        if (rc) {
            fprintf(stderr, "llmserve-worker: %s\n", err[0] ? err : cm_strerror(rc));
            ret = 1;
        } else {
            wk_server_opts so = {listen, worker_id, served, hb, max_waiting, 8192, tp, shutdown_s * 1000, health, warmup,
                                 kv_role};
            rc = wk_server_run(e, &so, &stop_flag, err, sizeof err);
            if (rc) {
                fprintf(stderr, "llmserve-worker: %s\n", err);
                ret = 1;
            }
        }
        wk_engine_free(e);
    }
    wk_tp_free(group_h); /* rank 0: stops the followers */
    wk_model_free(dm);
    wk_model_free(m);
    wk_health_stop(health);
    return ret;
}

int main(int argc, char **argv) {
    int rc = run(argc, argv);
    /* every socket is closed by now; nng frees their queued messages on its reaper thread, which a process
     * exiting at once leaves half done (a leak checker reports them): finish it */
    nng_fini();
    return rc;
}
