/* hfq_test: AWQ / GPTQ layers into GGUF blocks (common/model/cm_hf_quant.c).
 *
 * Without arguments: small layers packed here by the formats' rules (GPTQ
 * v1 and v2 zeros, 4 and 8 bits, act-order g_idx; AWQ's column order) must
 * convert to blocks that dequantize to scales * (q - zeros) for every
 * element, and every malformed config and layer must be refused with a
 * message naming the problem.
 *
 * With arguments, from tests/e2e/run_hf_quant_e2e.sh:
 *   argv[1] a packed checkpoint (tests/ref/hf_quant.py pack)
 *   argv[2] the same unpacked to F32 by that script's numpy unpacker
 *   argv[3] the block type expected (Q4_0, Q4_1, Q8_0), argv[4] 1 when act-order
 * Checks: every converted tensor dequantizes to the unpacker's values
 * (exactly, but for Q4_1's fp16 minimum), the other tensors are equal, and
 * both models give the same logits and greedy tokens with float
 * activations. */
#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_hf_quant.h"
#include "cm_quant.h"
#include "tst.h"
#include "wk_model.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int parse(const char *json, cm_hfq_config *q, char *e, size_t el) {
    json_error_t je;
    json_t *c = json_loads(json, 0, &je);
    int rc = c ? cm_hfq_config_parse(c, q, e, el) : -1000;
    json_decref(c);
    return rc;
}

static void configs(void) {
    cm_hfq_config q;
    char e[300];
    CHECK_RC(parse("{\"model_type\": \"llama\"}", &q, e, sizeof e), 0);
    CHECK_INT(q.method, CM_HFQ_NONE);
    CHECK_RC(parse("{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                   "\"desc_act\": true}}", &q, e, sizeof e), 0);
    CHECK(q.method == CM_HFQ_GPTQ && q.bits == 4 && q.group == 128 && !q.zero_v2);
    CHECK_RC(parse("{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 8, \"group_size\": -1, "
                   "\"checkpoint_format\": \"gptq_v2\"}}", &q, e, sizeof e), 0);
    CHECK(q.bits == 8 && q.group == 0 && q.zero_v2);
    CHECK_RC(parse("{\"quantization_config\": {\"quant_method\": \"awq\", \"w_bit\": 4, \"q_group_size\": 64, "
                   "\"version\": \"GEMM\", \"zero_point\": true}}", &q, e, sizeof e), 0);
    CHECK(q.method == CM_HFQ_AWQ && q.group == 64 && q.zero_v2);
    static const struct { const char *qc, *says; } bad[] = {
        {"{\"quant_method\": \"bitsandbytes\"}", "bitsandbytes"},
        {"{\"bits\": 4}", "no quant_method"},
        {"{\"quant_method\": \"gptq\", \"bits\": 3}", "bits 3"},
        {"{\"quant_method\": \"awq\", \"bits\": 8}", "bits 8"},
        {"{\"quant_method\": \"gptq\", \"bits\": \"4\"}", "bits -2"},
        {"{\"quant_method\": \"gptq\", \"group_size\": 48}", "group_size 48"},
        {"{\"quant_method\": \"gptq\", \"group_size\": 0}", "group_size 0"},
        {"{\"quant_method\": \"gptq\", \"checkpoint_format\": \"marlin\"}", "marlin"},
        {"{\"quant_method\": \"awq\", \"version\": \"gemv\"}", "gemv"},
        {"{\"quant_method\": \"awq\", \"zero_point\": false}", "without zero points"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char j[300];
        snprintf(j, sizeof j, "{\"quantization_config\": %s}", bad[i].qc);
        e[0] = 0;
        int rc = parse(j, &q, e, sizeof e);
        CHECK(rc == LLM_EUNSUP || rc == LLM_EFORMAT);
        if (!strstr(e, bad[i].says)) fprintf(stderr, "config %s: '%s' does not say '%s'\n", bad[i].qc, e, bad[i].says);
        CHECK(strstr(e, bad[i].says) != NULL);
    }
}

/* ---- small layers packed by the formats' rules -------------------------- */
enum { K = 128, N = 16 };

typedef struct {
    cm_hfq_config cfg;
    int q[N][K], z[8][N], g_idx[K];
    float s[8][N];
    int G;
    uint32_t qw[K * N], qz[8 * N];
    uint16_t sc[8 * N];
    int32_t gi[K];
    cm_st_tensor t[CM_HFQ_NPARTS];
} layer;

static const int awq_order[8] = {0, 2, 4, 6, 1, 3, 5, 7};

static void make(layer *L, int method, int bits, int group, int v2, int act_order, int zero) {
    memset(L, 0, sizeof *L);
    L->cfg = (cm_hfq_config){method, bits, group, v2 || method == CM_HFQ_AWQ};
    int gs = group ? group : K, maxq = (1 << bits) - 1, pack = 32 / bits;
    L->G = K / gs;
    for (int k = 0; k < K; k++) /* act-order: inputs interleaved over the groups */
        L->g_idx[k] = act_order ? (k * 5 + 3) % K / gs : k / gs;
    for (int g = 0; g < L->G; g++)
        for (int n = 0; n < N; n++) {
            L->z[g][n] = zero >= 0 ? zero : (g * 3 + n * 5) % (maxq + 1);
            L->s[g][n] = cm_f16_to_f32(cm_f32_to_f16(0.01f * (float)(1 + (g + 2 * n) % 7)));
        }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) L->q[n][k] = (k * 7 + n * 3 + k / 5) % (maxq + 1);
    for (int g = 0; g < L->G; g++)
        for (int n = 0; n < N; n++) L->sc[g * N + n] = cm_f32_to_f16(L->s[g][n]);
    if (method == CM_HFQ_GPTQ) {
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++)
                L->qw[(k / pack) * N + n] |= (uint32_t)L->q[n][k] << (bits * (k % pack));
        for (int g = 0; g < L->G; g++)
            for (int n = 0; n < N; n++)
                L->qz[g * (N / pack) + n / pack] |= (uint32_t)((L->z[g][n] - !v2) & maxq) << (bits * (n % pack));
        for (int k = 0; k < K; k++) L->gi[k] = L->g_idx[k];
        L->t[CM_HFQ_QWEIGHT] = (cm_st_tensor){"q", CM_I32, "I32", 2, {N, K / pack, 1, 1}, L->qw, 0};
        L->t[CM_HFQ_QZEROS] = (cm_st_tensor){"z", CM_I32, "I32", 2, {N / pack, (uint64_t)L->G, 1, 1}, L->qz, 0};
        L->t[CM_HFQ_GIDX] = (cm_st_tensor){"g", CM_I32, "I32", 1, {K, 1, 1, 1}, L->gi, 0};
    } else {
        for (int k = 0; k < K; k++)
            for (int c = 0; c < N / 8; c++)
                for (int i = 0; i < 8; i++) L->qw[k * (N / 8) + c] |= (uint32_t)L->q[c * 8 + awq_order[i]][k] << (4 * i);
        for (int g = 0; g < L->G; g++)
            for (int c = 0; c < N / 8; c++)
                for (int i = 0; i < 8; i++) L->qz[g * (N / 8) + c] |= (uint32_t)L->z[g][c * 8 + awq_order[i]] << (4 * i);
        L->t[CM_HFQ_QWEIGHT] = (cm_st_tensor){"q", CM_I32, "I32", 2, {N / 8, K, 1, 1}, L->qw, 0};
        L->t[CM_HFQ_QZEROS] = (cm_st_tensor){"z", CM_I32, "I32", 2, {N / 8, (uint64_t)L->G, 1, 1}, L->qz, 0};
    }
    L->t[CM_HFQ_SCALES] = (cm_st_tensor){"s", CM_F16, "F16", 2, {N, (uint64_t)L->G, 1, 1}, L->sc, 0};
}

static int convert(layer *L, cm_tensor_ref *w, cm_tensor_ref *p, void **bw, void **bp, char *e, size_t el) {
    const cm_st_tensor *parts[CM_HFQ_NPARTS];
    for (int i = 0; i < CM_HFQ_NPARTS; i++) parts[i] = L->t[i].data ? &L->t[i] : NULL;
    return cm_hfq_convert(&L->cfg, parts, "blk.0.attn_q.weight", w, p, bw, bp, e, el);
}

/* Converts and checks every element against s * (q - z). */
static void check_layer(layer *L, int want_type, int act_order, const char *what) {
    cm_tensor_ref w, p;
    void *bw = NULL, *bp = NULL;
    char e[300] = "";
    int rc = convert(L, &w, &p, &bw, &bp, e, sizeof e);
    CHECK_RC(rc, 0);
    if (rc) {
        fprintf(stderr, "%s: %s\n", what, e);
        return;
    }
    CHECK_INT(w.type, want_type);
    CHECK(w.ne[0] == K && w.ne[1] == N);
    CHECK_INT(p.data != NULL, act_order);
    if (p.data) CHECK(!strcmp(p.name, "blk.0.attn_q.perm") && p.ne[0] == K && p.type == CM_I32);
    const int32_t *perm = p.data;
    size_t rb = cm_dtype_row_bytes(w.type, K);
    double worst = 0;
    int seen[K] = {0};
    for (int j = 0; j < K; j++) seen[perm ? perm[j] : j]++;
    for (int k = 0; k < K; k++) CHECK_INT(seen[k], 1);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            int k = perm ? perm[j] : j, g = L->g_idx[k];
            float want = L->s[g][n] * (float)(L->q[n][k] - L->z[g][n]);
            float got = cm_quant_at(w.type, (const uint8_t *)w.data + n * rb, j);
            double d = fabs((double)got - want);
            if (d > worst) worst = d;
        }
    /* Q4_1 keeps -s*z as fp16: 2^-11 of at most 15 * 0.07 */
    double tol = want_type == CM_Q4_1 ? 15 * 0.07 / 2048 : 0;
    if (worst > tol) fprintf(stderr, "%s: worst error %.3g\n", what, worst);
    CHECK(worst <= tol);
    free(bw);
    free(bp);
}

static void refused(layer *L, const char *says, const char *what) {
    cm_tensor_ref w, p;
    void *bw = (void *)1, *bp = (void *)1;
    char e[300] = "";
    int rc = convert(L, &w, &p, &bw, &bp, e, sizeof e);
    CHECK(rc == LLM_EFORMAT || rc == LLM_EUNSUP);
    CHECK(bw == NULL && bp == NULL);
    if (!strstr(e, says)) fprintf(stderr, "%s: '%s' does not say '%s'\n", what, e, says);
    CHECK(strstr(e, says) != NULL);
}

static void layers(void) {
    static layer L;
    make(&L, CM_HFQ_GPTQ, 4, 32, 0, 0, 8); /* symmetric v1: every zero 8 */
    check_layer(&L, CM_Q4_0, 0, "GPTQ 4-bit sym v1");
    make(&L, CM_HFQ_GPTQ, 4, 64, 1, 0, -1);
    check_layer(&L, CM_Q4_1, 0, "GPTQ 4-bit asym v2");
    make(&L, CM_HFQ_GPTQ, 4, 32, 0, 1, -1); /* v1 never stores zero 0 well: the generator avoids it below */
    for (int g = 0; g < L.G; g++)
        for (int n = 0; n < N; n++) L.z[g][n] = 1 + L.z[g][n] % 15;
    memset(L.qz, 0, sizeof L.qz);
    for (int g = 0; g < L.G; g++)
        for (int n = 0; n < N; n++) L.qz[g * (N / 8) + n / 8] |= (uint32_t)(L.z[g][n] - 1) << (4 * (n % 8));
    check_layer(&L, CM_Q4_1, 1, "GPTQ 4-bit act-order v1");
    make(&L, CM_HFQ_GPTQ, 8, 0, 0, 0, 128);
    check_layer(&L, CM_Q8_0, 0, "GPTQ 8-bit per channel");
    make(&L, CM_HFQ_GPTQ, 8, 32, 0, 1, 128);
    check_layer(&L, CM_Q8_0, 1, "GPTQ 8-bit act-order");
    make(&L, CM_HFQ_AWQ, 4, 32, 1, 0, -1);
    check_layer(&L, CM_Q4_1, 0, "AWQ g32");
    make(&L, CM_HFQ_AWQ, 4, 0, 1, 0, 8);
    check_layer(&L, CM_Q4_0, 0, "AWQ per channel, zeros 8");

    make(&L, CM_HFQ_GPTQ, 8, 32, 0, 0, -1);
    refused(&L, "asymmetric", "8-bit asym");
    make(&L, CM_HFQ_GPTQ, 4, 32, 0, 0, 8);
    L.gi[5] = 4;
    refused(&L, "g_idx[5] = 4", "g_idx out of range");
    make(&L, CM_HFQ_GPTQ, 4, 32, 0, 0, 8);
    L.gi[5] = 1; /* group 0 has 31 inputs, group 1 has 33 */
    refused(&L, "multiples of 32", "uneven act-order groups");
    make(&L, CM_HFQ_GPTQ, 4, 32, 0, 0, 8);
    L.t[CM_HFQ_SCALES].ne[1] = 3;
    refused(&L, "do not fit", "scales shape");
    make(&L, CM_HFQ_GPTQ, 4, 64, 0, 0, 8);
    L.t[CM_HFQ_QWEIGHT].ne[1] = 3; /* 24 inputs: not whole blocks */
    refused(&L, "do not fit", "inputs not a multiple of 32");
    make(&L, CM_HFQ_GPTQ, 4, 32, 0, 0, 8);
    L.t[CM_HFQ_QWEIGHT].type = CM_F32;
    refused(&L, "must be I32", "qweight dtype");
    make(&L, CM_HFQ_GPTQ, 4, 32, 0, 0, 8);
    L.t[CM_HFQ_QZEROS].data = NULL;
    refused(&L, "has no qzeros", "missing qzeros");
    make(&L, CM_HFQ_AWQ, 4, 32, 1, 0, -1);
    L.t[CM_HFQ_GIDX] = (cm_st_tensor){"g", CM_I32, "I32", 1, {K, 1, 1, 1}, L.gi, 0};
    refused(&L, "g_idx", "AWQ with g_idx");
    make(&L, CM_HFQ_AWQ, 4, 32, 1, 0, -1);
    L.sc[7] = 0x7e00; /* NaN */
    refused(&L, "not a finite fp16", "NaN scale");

    char base[256];
    CHECK_INT(cm_hfq_part("model.layers.3.mlp.down_proj.qweight", base, sizeof base), CM_HFQ_QWEIGHT);
    CHECK(!strcmp(base, "model.layers.3.mlp.down_proj.weight"));
    CHECK_INT(cm_hfq_part("model.layers.3.self_attn.q_proj.g_idx", base, sizeof base), CM_HFQ_GIDX);
    CHECK_INT(cm_hfq_part("model.layers.3.self_attn.q_proj.weight", base, sizeof base), -1);
    CHECK_INT(cm_hfq_part(".scales", base, sizeof base), -1);
}

/* ---- a packed checkpoint against its numpy unpacking -------------------- */
static void checkpoint(const char *qdir, const char *rdir, const char *type, int act_order) {
    char err[600] = "";
    cm_model_file *a = NULL, *b = NULL;
    CHECK_RC(cm_model_open(qdir, &a, err, sizeof err), 0);
    if (!a) fprintf(stderr, "%s\n", err);
    CHECK_RC(cm_model_open(rdir, &b, err, sizeof err), 0);
    if (!a || !b) return;
    int converted = 0, perms = 0, plain = 0;
    double worst = 0;
    for (size_t i = 0; i < a->n_tensors; i++) {
        const cm_tensor_ref *t = &a->tensors[i];
        if (t->type == CM_I32) {
            perms++;
            continue;
        }
        const cm_tensor_ref *r = cm_model_tensor(b, t->name);
        CHECK(r != NULL && r->type == CM_F32 && r->ne[0] == t->ne[0] && r->ne[1] == t->ne[1]);
        if (!r || r->type != CM_F32 || r->ne[0] != t->ne[0] || r->ne[1] != t->ne[1]) continue;
        const float *ref = r->data;
        uint64_t k = t->ne[0], rows = t->n_dims > 1 ? t->ne[1] : 1;
        if (!cm_quant_known(t->type)) { /* F16 beside the F32 unpacking of the same values */
            plain++;
            int same = 1;
            for (uint64_t j = 0; j < k * rows; j++) same &= cm_f16_to_f32(((const uint16_t *)t->data)[j]) == ref[j];
            CHECK(t->type == CM_F16 && same);
            continue;
        }
        converted++;
        CHECK(!strcmp(cm_dtype_name(t->type), type));
        char pn[80];
        snprintf(pn, sizeof pn, "%.*s.perm", (int)strlen(t->name) - 7, t->name);
        const cm_tensor_ref *p = cm_model_tensor(a, pn);
        CHECK_INT(p != NULL, act_order);
        const int32_t *perm = p ? p->data : NULL;
        size_t rb = cm_dtype_row_bytes(t->type, k);
        for (uint64_t n = 0; n < rows; n++) {
            float rmax = 0;
            for (uint64_t j = 0; j < k; j++) rmax = fmaxf(rmax, fabsf(ref[n * k + j]));
            for (uint64_t j = 0; j < k; j++) {
                float got = cm_quant_at(t->type, (const uint8_t *)t->data + n * rb, (int64_t)j);
                double d = fabs((double)got - ref[n * k + (perm ? (uint64_t)perm[j] : j)]) / (rmax > 0 ? rmax : 1);
                if (d > worst) worst = d;
            }
        }
    }
    printf("hfq_test: %s: %d layers as %s (%d act-order), %d other tensors equal; worst error %.2e of a row's "
           "largest weight\n", qdir, converted, type, perms, plain, worst);
    CHECK(converted >= 7);
    CHECK_INT(perms, act_order ? converted : 0);
    CHECK(plain >= 3);
    CHECK(worst <= (strcmp(type, "Q4_1") ? 1e-7 : 1e-3)); /* Q4_1: -s*z rounded to fp16 */
    cm_model_close(a);
    cm_model_close(b);

    /* the two as models: logits and greedy tokens with float activations */
    kn_set_act_f32(1);
    wk_model *g = NULL, *h = NULL;
    wk_model_opts og = {.model_path = qdir, .threads = 2, .max_batch = 16};
    wk_model_opts oh = {.model_path = rdir, .threads = 2, .max_batch = 16};
    CHECK_RC(wk_model_load(&og, &g, err, sizeof err), 0);
    if (!g) fprintf(stderr, "%s\n", err);
    CHECK_RC(wk_model_load(&oh, &h, err, sizeof err), 0);
    if (!g || !h) return;
    CHECK_INT(g->perm_k ? 1 : 0, act_order);
    if (act_order) { /* q/k/v and gate/up read one input each: one order (one gather) per input */
        int distinct = 0;
        for (uint32_t l = 0; l < g->cfg.n_layer; l++) {
            const wk_layer *L = &g->layers[l];
            CHECK(L->wq.perm && L->wq.perm == L->wk.perm && L->wk.perm == L->wv.perm && L->gate.perm == L->up.perm);
            distinct += 1 + (L->wo.perm != L->wq.perm) + (L->gate.perm != L->wq.perm) + (L->down.perm != L->gate.perm);
        }
        CHECK_INT(distinct, 4 * (int)g->cfg.n_layer);
    }
    static const char *prompt = "The capital of France is";
    int32_t *ids = NULL;
    size_t nt = 0;
    CHECK_RC(cm_tok_encode(h->tok, prompt, strlen(prompt), -1, 1, &ids, &nt), 0);
    int V = (int)g->cfg.vocab, equal = 0, steps = 8;
    float *lg = malloc(sizeof(float) * (size_t)V), *lh = malloc(sizeof(float) * (size_t)V);
    wk_kv *kg = NULL, *kh = NULL;
    CHECK_RC(wk_kv_create(g, 64, KN_KV_F32, &kg), 0);
    CHECK_RC(wk_kv_create(h, 64, KN_KV_F32, &kh), 0);
    CHECK_RC(wk_forward(g, kg, ids, (int)nt, lg, 0), 0);
    CHECK_RC(wk_forward(h, kh, ids, (int)nt, lh, 0), 0);
    double rel_worst = 0;
    for (int s = 0; s < steps; s++) {
        int ag = 0, ah = 0;
        double d = 0, r = 0;
        for (int v = 0; v < V; v++) {
            d += ((double)lg[v] - lh[v]) * ((double)lg[v] - lh[v]);
            r += (double)lh[v] * lh[v];
            if (lg[v] > lg[ag]) ag = v;
            if (lh[v] > lh[ah]) ah = v;
        }
        if (sqrt(d / r) > rel_worst) rel_worst = sqrt(d / r);
        equal += ag == ah;
        int32_t t = ah;
        CHECK_RC(wk_forward(g, kg, &t, 1, lg, 0), 0);
        CHECK_RC(wk_forward(h, kh, &t, 1, lh, 0), 0);
    }
    printf("hfq_test: %s: logits rel-L2 at most %.2e against the unpacked F32; %d/%d greedy tokens equal\n", qdir,
           rel_worst, equal, steps);
    CHECK(rel_worst < (strcmp(type, "Q4_1") ? 1e-4 : 5e-3));
    CHECK(equal >= steps - 1);
    wk_kv_free(kg);
    wk_kv_free(kh);
    free(ids);
    free(lg);
    free(lh);
    wk_model_free(g);
    wk_model_free(h);
    kn_set_act_f32(0);
}

int main(int argc, char **argv) {
    if (argc == 1) {
        configs();
        layers();
        return tst_done("hfq_test");
    }
    if (argc < 5 || access(argv[1], R_OK) || access(argv[2], R_OK)) {
        printf("hfq_test: checkpoints absent; skipped\n");
        return TST_SKIP;
    }
    kn_init();
    checkpoint(argv[1], argv[2], argv[3], atoi(argv[4]));
    return tst_done("hfq_test");
}
