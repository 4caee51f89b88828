/* tp_test: tensor parallelism inside one process tree, on the default
 * model and on a generated one: ranks 1..n-1 forked children over the
 * shared-memory comm, rank 0 the driver, against TP=1; more ranks than KV
 * heads (each KV head replicated on ranks that split its query heads); a
 * TP size that fits neither refused by name; pipeline stages, of one rank and
 * of two (PP x TP), bit-identical.
 *   argv[1] the default model (skips when absent) */
#include "cm_error.h"
#include "cm_log.h"
#include "cm_time.h"
#include "tst.h"
#include "wk_comm.h"
#include "wk_model.h"
#include "wk_sampler.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *model_path;
static wk_model *model;
static int32_t prompt0[64];
static int n_prompt0;
static int expert_parallel; /* the ranks' --enable-expert-parallel */
static int pp_stages;       /* the ranks in this many pipeline stages (--pipeline-parallel-size), each a TP group
                             * of the rest; 0: one TP group */

/* Rank r's comms in a group of n ranks over world (shared memory): one TP group, or pipeline stages whose
 * wires are split from it (each stage's TP comm, the pairs between the stages' first ranks and the ring
 * back), as wk_tp forms them. */
static int rank_comms(wk_comm *world, int n, int r, wk_model_opts *o, wk_comm_pipe *pc) {
    memset(pc, 0, sizeof *pc);
    if (pp_stages < 2) {
        o->comm = world;
        return 0;
    }
    o->pp_size = pp_stages;
    o->pp_rank = r / (n / pp_stages);
    int rc = wk_comm_pipeline(world, pp_stages, 0, 0, pc);
    o->comm = pc->stage;
    o->pipe = pc;
    return rc;
}

/* In-process TP=2 over the shared-memory comm (rank 1 a forked child)
 * against TP=1: logits close in the int8 path, identical greedy tokens in
 * reference (float activation) mode, where only summation order differs. */
/* The same forward over n ranks (n-1 forked children over shared memory):
 * the prompt's logits and n_gen greedy tokens. cfg: dummy weights of that
 * shape instead of the model file. */
static void tpn_logits(int n, const char *cfg, int act_f32, const int32_t *prompt, int np, int32_t *greedy_out,
                       float *logits_out, int n_gen, double *ms) {
    enum { CTX = 256 };
    char name[64];
    wk_comm *comm;
    kn_set_act_f32(act_f32);
    CHECK_RC(wk_comm_shm_create(n, name, sizeof name, &comm), 0);
    wk_comm_shm_set_pid(comm, 0, getpid(), 0);
    pid_t child[8];
    for (int r = 1; r < n; r++) {
        child[r] = fork();
        if (child[r] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            wk_comm *c1;
            if (wk_comm_shm_attach(name, r, &c1)) _exit(2);
            wk_comm_shm_set_pid(c1, r, getpid(), 0);
            wk_model *m1;
            char e1[256];
            wk_model_opts o1 = {.model_path = cfg ? NULL : model_path, .model_config = cfg, .threads = 1,
                                .max_batch = 64, .expert_parallel = expert_parallel};
            wk_comm_pipe pc1;
            if (rank_comms(c1, n, r, &o1, &pc1)) _exit(6);
            if (wk_model_load(&o1, &m1, e1, sizeof e1)) {
                fprintf(stderr, "rank %d: %s\n", r, e1);
                _exit(3);
            }
            wk_cache *cache;
            if (wk_cache_create(m1, act_f32 ? KN_KV_F32 : KN_KV_F16, 16, CTX / 16, &cache)) _exit(4);
            for (;;) {
                int stop;
                if (wk_forward_follow(m1, cache, &stop)) _exit(5);
                if (stop) break;
            }
            _exit(0);
        }
        wk_comm_shm_set_pid(comm, r, child[r], 1);
    }
    wk_model *m0;
    char err[256];
    wk_model_opts o0 = {.model_path = cfg ? NULL : model_path, .model_config = cfg, .threads = 1, .max_batch = 64,
                        .expert_parallel = n > 1 && expert_parallel};
    wk_comm_pipe pc0;
    CHECK_RC(rank_comms(comm, n, 0, &o0, &pc0), 0);
    CHECK_RC(wk_model_load(&o0, &m0, err, sizeof err), 0);
    wk_kv *kv;
    CHECK_RC(wk_kv_create(m0, CTX, act_f32 ? KN_KV_F32 : KN_KV_F16, &kv), 0);
    float *lg = malloc(sizeof(float) * m0->cfg.vocab);
    double t0 = cm_now();
    CHECK_RC(wk_forward(m0, kv, prompt, np, lg, 0), 0);
    memcpy(logits_out, lg, sizeof(float) * m0->cfg.vocab);
    for (int i = 0; i < n_gen; i++) {
        int32_t t = wk_argmax(lg, (int)m0->cfg.vocab);
        greedy_out[i] = t;
        CHECK_RC(wk_forward(m0, kv, &t, 1, lg, 0), 0);
    }
    *ms = (cm_now() - t0) * 1e3;
    CHECK_RC(wk_forward_shutdown(m0), 0);
    for (int r = 1; r < n; r++) {
        int st;
        waitpid(child[r], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    free(lg);
    wk_kv_free(kv);
    wk_model_free(m0);
    wk_comm_pipe_free(&pc0);
    wk_comm_free(comm);
    kn_set_act_f32(0);
}

static void tp_logits(int act_f32, int32_t *greedy_out, float *logits_out, int n_gen, double *ms) {
    tpn_logits(2, NULL, act_f32, prompt0, n_prompt0, greedy_out, logits_out, n_gen, ms);
}

static void tp1_logits(int act_f32, int32_t *greedy_out, float *logits_out, int n_gen, double *ms) {
    kn_set_act_f32(act_f32);
    wk_kv *kv;
    CHECK_RC(wk_kv_create(model, 256, act_f32 ? KN_KV_F32 : KN_KV_F16, &kv), 0);
    float *lg = malloc(sizeof(float) * model->cfg.vocab);
    double t0 = cm_now();
    CHECK_RC(wk_forward(model, kv, prompt0, n_prompt0, lg, 0), 0);
    memcpy(logits_out, lg, sizeof(float) * model->cfg.vocab);
    for (int i = 0; i < n_gen; i++) {
        int32_t t = wk_argmax(lg, (int)model->cfg.vocab);
        greedy_out[i] = t;
        CHECK_RC(wk_forward(model, kv, &t, 1, lg, 0), 0);
    }
    *ms = (cm_now() - t0) * 1e3;
    free(lg);
    wk_kv_free(kv);
    kn_set_act_f32(0);
}

static void test_tp_in_process(void) {
    #if defined(__SANITIZE_THREAD__)
    enum { GEN = 4 }; /* the races are in the first steps as in the last */
#else
    enum { GEN = 24 };
#endif
    size_t V = model->cfg.vocab;
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    int32_t ga[GEN], gb[GEN];
    double ms1, ms2;
    for (int mode = 0; mode < 2; mode++) {
        tp1_logits(mode, ga, a, GEN, &ms1);
        tp_logits(mode, gb, b, GEN, &ms2);
        double num = 0, den = 0;
        for (size_t i = 0; i < V; i++) {
            num += (double)(a[i] - b[i]) * (a[i] - b[i]);
            den += (double)a[i] * a[i];
        }
        double rel = sqrt(num / den);
        int same = 0;
        while (same < GEN && ga[same] == gb[same]) same++;
        fprintf(stderr, "  TP=2 vs TP=1 (%s activations): prompt logits rel-L2 %.2e, greedy equal for %d/%d tokens; "
                        "%.1f ms vs %.1f ms for prompt + %d tokens (1 thread per rank)\n",
                mode ? "float" : "int8", rel, same, GEN, ms2, ms1, GEN);
        /* float: the sharded math is the same math (1e-6); int8: the first
         * token agrees and the logits stay within the int8 path's own noise
         * (it differs from float activations by a similar 2-10%) */
        CHECK(rel < (mode ? 1e-5 : 0.2));
        if (mode) CHECK_INT(same, GEN);
        else CHECK(same >= 1);
    }
    free(a);
    free(b);
}

/* A config.json of a generated model over n ranks against one: float activations, so only the order of
 * the sums differs; logits to 1e-5 and every greedy token equal. Leaves the file for the caller. */
static void same_as_one(const char *cfg, const char *json, int n, const char *what) {
    FILE *f = fopen(cfg, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(json, f);
    fclose(f);
    enum { GEN = 8 };
    const int32_t prompt[] = {1, 17, 42, 99, 256, 7, 300, 11};
    float a[512], b[512];
    int32_t ga[GEN], gb[GEN];
    double ms1, msn;
    tpn_logits(1, cfg, 1, prompt, 8, ga, a, GEN, &ms1);
    tpn_logits(n, cfg, 1, prompt, 8, gb, b, GEN, &msn);
    double num = 0, den = 0;
    for (int i = 0; i < 512; i++) {
        num += (double)(a[i] - b[i]) * (a[i] - b[i]);
        den += (double)a[i] * a[i];
    }
    int same = 0;
    while (same < GEN && ga[same] == gb[same]) same++;
    fprintf(stderr, "  %s vs TP=1: logits rel-L2 %.2e, greedy equal for %d/%d\n", what, sqrt(num / den), same, GEN);
    CHECK(sqrt(num / den) < 1e-5);
    CHECK_INT(same, GEN);
}

/* More ranks than KV heads: 2 KV heads over TP=4, each replicated on two
 * ranks that split its query heads (70B's 8 KV heads over TP=16). The
 * sharded math is the same math: float activations agree with TP=1. */
static void test_tp_replicated_kv(void) {
    const char *cfg = "/tmp/llmserve-worker-test-kv2.json";
    same_as_one(cfg, "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 256, \"intermediate_size\": 512, "
                "\"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"vocab_size\": 512, "
                "\"max_position_embeddings\": 1024, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0}\n",
                4, "TP=4 over 2 KV heads (each on 2 ranks)");
    /* a TP size that neither divides the KV heads nor splits their query heads is refused by name */
    wk_model *m;
    char err[300] = "";
    wk_comm *comm;
    char name[64];
    CHECK_RC(wk_comm_shm_create(3, name, sizeof name, &comm), 0);
    wk_model_opts o = {.model_config = cfg, .threads = 1, .max_batch = 16, .comm = comm};
    CHECK(wk_model_load(&o, &m, err, sizeof err) == LLM_EUNSUP && strstr(err, "KV heads"));
    wk_comm_free(comm);
    remove(cfg);
}

/* Experts under tensor parallelism: each expert's FFN columns split over the ranks as a dense FFN's, the
 * router on every rank (Qwen3-MoE's shape: per-head q/k norms, 8 experts, 2 a token). */
static void test_tp_moe(void) {
    const char *cfg = "/tmp/llmserve-worker-test-moe.json";
    same_as_one(cfg, "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 256, \"intermediate_size\": 512, "
                "\"moe_intermediate_size\": 128, \"num_experts\": 8, \"num_experts_per_tok\": 2, \"head_dim\": 64, "
                "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"vocab_size\": 512, "
                "\"max_position_embeddings\": 1024, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0}\n",
                2, "qwen3_moe (8 experts, 2 a token) over TP=2");
    /* expert parallelism: experts whole, 4 or 2 a rank, attention split as before: the same tokens */
    expert_parallel = 1;
    same_as_one(cfg, "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 256, \"intermediate_size\": 512, "
                "\"moe_intermediate_size\": 128, \"num_experts\": 8, \"num_experts_per_tok\": 2, \"head_dim\": 64, "
                "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"vocab_size\": 512, "
                "\"max_position_embeddings\": 1024, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0}\n",
                2, "qwen3_moe, --enable-expert-parallel over 2 ranks (4 experts each)");
    same_as_one(cfg, "{\"model_type\": \"mixtral\", \"hidden_size\": 256, \"intermediate_size\": 96, "
                "\"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"num_attention_heads\": 4, "
                "\"num_key_value_heads\": 4, \"num_hidden_layers\": 2, \"vocab_size\": 512, "
                "\"max_position_embeddings\": 1024, \"rms_norm_eps\": 1e-5, \"rope_theta\": 1000000.0}\n",
                4, "mixtral (experts 96 wide), --enable-expert-parallel over 4 ranks (2 experts each)");
    expert_parallel = 0;
    /* refused by name: on a dense model, and with more ranks than experts */
    wk_model *m;
    char err[300] = "", name[64];
    wk_comm *comm;
    CHECK_RC(wk_comm_shm_create(2, name, sizeof name, &comm), 0);
    wk_model_opts o = {.model_path = model_path, .threads = 1, .max_batch = 16,
                       .comm = comm, .expert_parallel = 1};
    CHECK(wk_model_load(&o, &m, err, sizeof err) == LLM_EUNSUP && strstr(err, "--enable-expert-parallel"));
    wk_comm_free(comm);
    remove(cfg);
}

/* Pipeline parallelism: the layers in stages, the hidden rows passed on and the logits sent back to rank
 * 0. Each layer's math is the same math on the same rows, so the tokens and the logits are bit-identical
 * to one process: the default model in two stages (int8 activations), a generated one of 5 layers in three
 * (2 + 2 + 1); stages of two ranks each (PP x TP) bit-identical to one TP=2 group; more stages than layers
 * refused by name. */
static void test_pp(void) {
    enum { GEN = 12 };
    size_t V = model->cfg.vocab;
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    int32_t ga[GEN], gb[GEN];
    double ms1, ms2;
    tp1_logits(0, ga, a, GEN, &ms1);
    pp_stages = 2;
    tpn_logits(2, NULL, 0, prompt0, n_prompt0, gb, b, GEN, &ms2);
    int same = 0, bits = !memcmp(a, b, sizeof(float) * V);
    while (same < GEN && ga[same] == gb[same]) same++;
    fprintf(stderr, "  PP=2 vs one process: prompt logits %s, greedy equal for %d/%d; %.1f ms vs %.1f ms for prompt + "
                    "%d tokens (1 thread a stage)\n", bits ? "bit-identical" : "DIFFER", same, GEN, ms2, ms1, GEN);
    CHECK(bits);
    CHECK_INT(same, GEN);
    /* PP=2 x TP=2 (four ranks: two stages of two) against TP=2: the default model, int8 activations */
    pp_stages = 0;
    tpn_logits(2, NULL, 0, prompt0, n_prompt0, ga, a, GEN, &ms1);
    pp_stages = 2;
    tpn_logits(4, NULL, 0, prompt0, n_prompt0, gb, b, GEN, &ms2);
    bits = !memcmp(a, b, sizeof(float) * V);
    for (same = 0; same < GEN && ga[same] == gb[same];) same++;
    fprintf(stderr, "  PP=2 x TP=2 vs TP=2: prompt logits %s, greedy equal for %d/%d; %.1f ms vs %.1f ms\n",
            bits ? "bit-identical" : "DIFFER", same, GEN, ms2, ms1);
    CHECK(bits);
    CHECK_INT(same, GEN);
    const char *cfg = "/tmp/llmserve-worker-test-pp5.json";
    FILE *f = fopen(cfg, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 256, \"intermediate_size\": 512, "
              "\"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"num_hidden_layers\": 5, \"vocab_size\": 512, "
              "\"max_position_embeddings\": 1024, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0}\n", f);
        fclose(f);
        const int32_t prompt[] = {1, 17, 42, 99, 256, 7, 300, 11};
        /* three stages of one rank against one process; three stages of two ranks (PP=3 x TP=2: six
         * processes) against one TP=2 group: each stage's all-reduces sum the same two shares in the same
         * order, so the logits are the TP group's bits */
        for (int tp = 1; tp <= 2; tp++) {
            float la[512], lb[512];
            int32_t ta[8], tb[8];
            pp_stages = 0;
            tpn_logits(tp, cfg, 1, prompt, 8, ta, la, 8, &ms1);
            pp_stages = 3;
            tpn_logits(3 * tp, cfg, 1, prompt, 8, tb, lb, 8, &ms2);
            CHECK(!memcmp(la, lb, sizeof la));
            CHECK(!memcmp(ta, tb, sizeof ta));
        }
        wk_model *m;
        char err[300] = "", name[64];
        wk_comm *comm;
        CHECK_RC(wk_comm_shm_create(6, name, sizeof name, &comm), 0);
        wk_model_opts o = {.model_config = cfg, .threads = 1, .max_batch = 16, .pp_size = 6};
        CHECK(wk_model_load(&o, &m, err, sizeof err) == LLM_EUNSUP && strstr(err, "--pipeline-parallel-size 6"));
        wk_comm_free(comm);
        remove(cfg);
    }
    pp_stages = 0;
    free(a);
    free(b);
}

int main(int argc, char **argv) {
    if (argc < 2 || access(argv[1], R_OK) != 0) {
        fprintf(stderr, "tp_test: model %s not found; run tools/setup.sh to fetch it\n", argc > 1 ? argv[1] : "?");
        return TST_SKIP;
    }
    model_path = argv[1];
    cm_log_set_level(CM_LOG_WARN);
    char err[256];
    wk_model_opts mo = {.model_path = model_path, .threads = 1, .max_batch = 512};
    if (wk_model_load(&mo, &model, err, sizeof err)) {
        fprintf(stderr, "tp_test: %s\n", err);
        return 1;
    }
    const char *txt = "The capital of France is";
    int32_t *ids;
    size_t n;
    CHECK_RC(cm_tok_encode(model->tok, txt, strlen(txt), -1, 0, &ids, &n), 0);
    memcpy(prompt0, ids, sizeof(int32_t) * n);
    n_prompt0 = (int)n;
    free(ids);
    test_tp_in_process();
    test_tp_replicated_kv();
    test_tp_moe();
    test_pp();
    wk_model_free(model);
    return tst_done("tp_test");
}
