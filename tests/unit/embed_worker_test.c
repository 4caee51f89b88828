/* embed_worker_test: a real llmserve-worker serving an embedding model
 * (all-MiniLM-L6-v2), driven through real NNG sockets with the messages a
 * gateway sends.
 *   argv[1] llmserve-worker binary, argv[2] the model directory (skips when absent)
 * Health and ModelInfo say TASK_EMBED and the width; every result equals
 * the in-process encoder's bit for bit, alone and with 24 requests in flight
 * (continuous batching mixes them in steps); a Generate, token ids outside
 * the vocabulary, an input too long, too many inputs and a duplicate id are
 * refused by name; a cancelled request never answers and the worker goes
 * on serving. */
#include "cm_error.h"
#include "cm_log.h"
#include "pr_wire.h"
#include "tst.h"
#include "wk_bert.h"

#include <arpa/inet.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_REQ 64

typedef struct {
    nng_socket pull, push;
    char reply[128], id[32];
    int health, task, dim, tok_bytes;
    uint64_t rid[MAX_REQ];
    int got[MAX_REQ], code[MAX_REQ], tokens[MAX_REQ], generate_refused;
    float *emb[MAX_REQ];
    size_t n_emb[MAX_REQ];
} client;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int client_open(client *c, const char *addr) {
    memset(c, 0, sizeof *c);
    snprintf(c->id, sizeof c->id, "embed-test-%d", (int)getpid());
    nng_listener l;
    nng_sockaddr sa;
    int rv = nng_pull0_open(&c->pull);
    if (!rv) rv = nng_socket_set_size(c->pull, NNG_OPT_RECVMAXSZ, PR_MAX_MSG);
    if (!rv) rv = nng_listen(c->pull, "tcp://127.0.0.1:0", &l, 0);
    if (!rv) rv = nng_listener_get_addr(l, NNG_OPT_LOCADDR, &sa);
    if (!rv) snprintf(c->reply, sizeof c->reply, "tcp://127.0.0.1:%u", ntohs(sa.s_in.sa_port));
    if (!rv) rv = nng_push0_open(&c->push);
    if (!rv) rv = nng_socket_set_ms(c->push, NNG_OPT_SENDTIMEO, 2000);
    if (!rv) rv = nng_socket_set_ms(c->push, NNG_OPT_RECONNMINT, 20);
    if (!rv) rv = nng_dial(c->push, addr, NULL, NNG_FLAG_NONBLOCK);
    return rv ? LLM_EIO : 0;
}

static int send_env(client *c, pr_env *e) { return pr_send(c->push, e, 0); }

static void hello(client *c) {
    Llmserve__Hello h = LLMSERVE__HELLO__INIT;
    h.gateway_id = c->id;
    h.reply_address = c->reply;
    pr_env e;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_HELLO;
    e.hello = &h;
    send_env(c, &e);
}

static int slot_of(client *c, uint64_t rid) {
    for (int i = 0; i < MAX_REQ; i++)
        if (c->rid[i] == rid) return i;
    return -1;
}

static void pump(client *c, double secs) {
    double end = now() + secs, last_hello = 0;
    do {
        if (now() - last_hello > 0.5) {
            hello(c);
            last_hello = now();
        }
        nng_socket_set_ms(c->pull, NNG_OPT_RECVTIMEO, 50);
        pr_env *e;
        char err[128];
        if (pr_recv(c->pull, &e, 0, NULL, err, sizeof err)) continue;
        if (e->body_case == LLMSERVE__ENVELOPE__BODY_HEALTH) {
            c->health++;
            c->task = e->health->has_task ? (int)e->health->task : -1;
            c->dim = (int)e->health->embedding_dim;
        } else if (e->body_case == LLMSERVE__ENVELOPE__BODY_MODEL_INFO) {
            c->tok_bytes = (int)e->model_info->tokenizer_gguf.len;
        } else if (e->body_case == LLMSERVE__ENVELOPE__BODY_CHUNK) {
            c->generate_refused = e->chunk->has_error_code ? e->chunk->error_code : 1;
        } else if (e->body_case == LLMSERVE__ENVELOPE__BODY_EMBED_RESULT) {
            Llmserve__EmbedResult *r = e->embed_result;
            int i = slot_of(c, r->request_id);
            if (i >= 0) {
                c->got[i]++;
                c->code[i] = r->has_error_code ? r->error_code : 0;
                c->tokens[i] = r->prompt_tokens;
                free(c->emb[i]);
                c->emb[i] = malloc(sizeof(float) * (r->n_embedding + 1));
                if (r->n_embedding) memcpy(c->emb[i], r->embedding, sizeof(float) * r->n_embedding);
                c->n_emb[i] = r->n_embedding;
            }
        }
        pr_free(e);
    } while (now() < end);
}

static void embed(client *c, int slot, uint64_t rid, int n, int32_t *const *tok, const int *len) {
    Llmserve__EmbedInput in[2100], *inp[2100];
    for (int i = 0; i < n; i++) {
        llmserve__embed_input__init(&in[i]);
        in[i].n_token_ids = (size_t)len[i];
        in[i].token_ids = tok[i];
        inp[i] = &in[i];
    }
    Llmserve__Embed m = LLMSERVE__EMBED__INIT;
    m.request_id = rid;
    m.gateway_id = c->id;
    m.reply_address = c->reply;
    m.n_inputs = (size_t)n;
    m.inputs = inp;
    c->rid[slot] = rid;
    c->got[slot] = 0;
    pr_env e;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_EMBED;
    e.embed = &m;
    CHECK_RC(send_env(c, &e), 0);
}

static int wait_got(client *c, int slot, double secs) {
    double end = now() + secs;
    while (!c->got[slot] && now() < end) pump(c, 0.05);
    return c->got[slot];
}

static const char *texts[] = {
    "The quick brown fox jumps over the lazy dog.", "What is the capital of France?",
    "Paris is the capital and most populous city of France.", "How do I reset my password?",
    "I forgot my password, how can I change it?", "Sentence embeddings map text to vectors.",
    "数据库 and 東京; naïve café", "A", "Numbers: 3.14159, 1,000,000 and $19.99",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
};
#define NT ((int)(sizeof texts / sizeof texts[0]))

int main(int argc, char **argv) {
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s/config.json", argc > 2 ? argv[2] : "");
    if (argc < 3 || access(cfg, R_OK) != 0) {
        printf("embed_worker_test: embedding model not found (tools/setup.sh fetches it); skipped\n");
        return TST_SKIP;
    }
    cm_log_set_level(CM_LOG_WARN);
    signal(SIGPIPE, SIG_IGN);
    char err[600];
    wk_encoder *enc = NULL;
    wk_encoder_opts eo = {.model_path = argv[2], .threads = 1};
    if (wk_encoder_load(&eo, &enc, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int D = (int)enc->cfg.dim, ml = wk_encoder_max_len(enc);
    int32_t *tok[NT];
    int len[NT];
    float *ref = malloc(sizeof(float) * (size_t)(NT * D));
    for (int i = 0; i < NT; i++) {
        size_t n;
        CHECK_RC(cm_tok_encode(enc->tok, texts[i], strlen(texts[i]), 1, 1, &tok[i], &n), 0);
        len[i] = (int)n;
        CHECK_RC(wk_encode(enc, 1, (const int32_t *const *)&tok[i], &len[i], ref + (size_t)i * D), 0);
    }
    char addr[64];
    snprintf(addr, sizeof addr, "tcp://127.0.0.1:%d", 20000 + (int)(getpid() % 12000) + 7);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(argv[1], argv[1], "--model", argv[2], "--listen", addr, "--threads", "2", "--log-level", "warn",
              "--heartbeat-timeout", "3000", (char *)NULL);
        _exit(127);
    }
    client c;
    CHECK_RC(client_open(&c, addr), 0);
    double end = now() + 120;
    while (!c.health && now() < end) pump(&c, 0.2);
    CHECK(c.health > 0);
    CHECK_INT(c.task, LLMSERVE__TASK__TASK_EMBED);
    CHECK_INT(c.dim, D);
    {   /* ModelInfo carries the WordPiece tokenizer for gateways */
        Llmserve__ModelInfoRequest r = LLMSERVE__MODEL_INFO_REQUEST__INIT;
        r.gateway_id = c.id;
        pr_env e;
        pr_env_init(&e);
        e.body_case = LLMSERVE__ENVELOPE__BODY_MODEL_INFO_REQUEST;
        e.model_info_request = &r;
        send_env(&c, &e);
        for (int k = 0; k < 40 && !c.tok_bytes; k++) pump(&c, 0.05);
        CHECK(c.tok_bytes > 100000);
    }
    /* one request of all texts */
    embed(&c, 0, 1, NT, tok, len);
    CHECK(wait_got(&c, 0, 60));
    CHECK_INT(c.code[0], 0);
    CHECK_INT(c.n_emb[0], NT * D);
    int tsum = 0;
    for (int i = 0; i < NT; i++) tsum += len[i];
    CHECK_INT(c.tokens[0], tsum);
    if (c.n_emb[0] == (size_t)(NT * D)) CHECK(memcmp(c.emb[0], ref, sizeof(float) * (size_t)(NT * D)) == 0);
    /* 24 requests in flight: each one text, or three */
    for (int r = 0; r < 24; r++) {
        int k = r % NT, n = r % 3 == 0 ? 3 : 1;
        int32_t *tk[3] = {tok[k], tok[(k + 1) % NT], tok[(k + 2) % NT]};
        int ln[3] = {len[k], len[(k + 1) % NT], len[(k + 2) % NT]};
        embed(&c, 1 + r, 100 + (uint64_t)r, n, tk, ln);
    }
    int all = 0;
    for (int r = 0; r < 24; r++) all += wait_got(&c, 1 + r, 60);
    CHECK_INT(all, 24);
    int exact = 0;
    for (int r = 0; r < 24; r++) {
        int k = r % NT, n = r % 3 == 0 ? 3 : 1, ok = c.code[1 + r] == 0 && c.n_emb[1 + r] == (size_t)(n * D);
        for (int j = 0; ok && j < n; j++)
            ok = !memcmp(c.emb[1 + r] + (size_t)j * D, ref + (size_t)((k + j) % NT) * D, sizeof(float) * (size_t)D);
        exact += ok;
    }
    CHECK_INT(exact, 24);
    /* refusals, by name */
    int32_t bad[3] = {101, 99999999, 102}, *bp = bad, bl = 3;
    embed(&c, 30, 300, 1, &bp, &bl);
    CHECK(wait_got(&c, 30, 10));
    CHECK_INT(c.code[30], LLM_EINVAL);
    int32_t *longt = calloc((size_t)ml + 8, sizeof *longt);
    int ll = ml + 1;
    embed(&c, 31, 301, 1, &longt, &ll);
    CHECK(wait_got(&c, 31, 10));
    CHECK_INT(c.code[31], LLM_ERANGE);
    int32_t **many = malloc(sizeof *many * 2049);
    int *ml1 = malloc(sizeof *ml1 * 2049);
    for (int i = 0; i < 2049; i++) many[i] = tok[7], ml1[i] = len[7];
    embed(&c, 32, 302, 2049, many, ml1);
    CHECK(wait_got(&c, 32, 10));
    CHECK_INT(c.code[32], LLM_EINVAL);
    {   /* a Generate to an embedding group */
        int32_t g[2] = {101, 102};
        Llmserve__Generate m = LLMSERVE__GENERATE__INIT;
        m.request_id = 400;
        m.n_token_ids = 2;
        m.token_ids = g;
        m.gateway_id = c.id;
        pr_env e;
        pr_env_init(&e);
        e.body_case = LLMSERVE__ENVELOPE__BODY_GENERATE;
        e.generate = &m;
        send_env(&c, &e);
        for (int k = 0; k < 100 && !c.generate_refused; k++) pump(&c, 0.05);
        CHECK_INT(c.generate_refused, LLM_EUNSUP);
    }
    /* a big request cancelled at once never answers; the next one does */
    for (int i = 0; i < 2048; i++) many[i] = tok[9], ml1[i] = len[9];
    embed(&c, 33, 303, 2048, many, ml1);
    Llmserve__Cancel cn = LLMSERVE__CANCEL__INIT;
    cn.request_id = 303;
    cn.gateway_id = c.id;
    pr_env e;
    pr_env_init(&e);
    e.body_case = LLMSERVE__ENVELOPE__BODY_CANCEL;
    e.cancel = &cn;
    send_env(&c, &e);
    embed(&c, 34, 304, 1, &tok[1], &len[1]);
    CHECK(wait_got(&c, 34, 60));
    CHECK(c.n_emb[34] == (size_t)D && !memcmp(c.emb[34], ref + D, sizeof(float) * (size_t)D));
    pump(&c, 1.0);
    CHECK_INT(c.got[33], 0);
    kill(pid, SIGTERM);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    nng_close(c.pull);
    nng_close(c.push);
    for (int i = 0; i < NT; i++) free(tok[i]);
    for (int i = 0; i < MAX_REQ; i++) free(c.emb[i]);
    free(ref);
    free(longt);
    free(many);
    free(ml1);
    wk_encoder_free(enc);
    return tst_done("embed_worker_test");
}
