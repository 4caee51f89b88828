/* End-to-end checks of the forward pass.
 *  1. The default model (fetched by setup) against tests/data/smollm2_golden.json,
 *     made by an independent numpy forward (tests/ref/llama_ref.py): the prompt's
 *     logits agree within tolerance and 32 greedy tokens are identical.
 *  2. A tiny llama2.c checkpoint generated here (random weights) loads and runs,
 *     and its logits match a float64 forward written in this file; batched
 *     prefill equals token-by-token decode; truncated checkpoints are refused.
 *  3. With ../shared present: stories260K's reference perplexity.
 *  4. Dummy weights (--load-format dummy) of presets and config.json shapes.
 *  5. The CUDA step metadata (host code).
 *  6. The FP8 KV cache against the F16 one on the default model. */
#include "cm_error.h"
#include "tst.h"
#include "wk_cuda.h"
#include "wk_model.h"
#include "wk_sampler.h"

#include "cm_dtype.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double rel_l2(const float *a, const double *b, int n) {
    double d = 0, s = 0;
    for (int i = 0; i < n; i++) {
        d += (a[i] - b[i]) * (a[i] - b[i]);
        s += b[i] * b[i];
    }
    return sqrt(d / s);
}

static size_t golden_cases = (size_t)-1; /* MODEL_TEST_GOLDEN_CASES: the first N prompts only (qemu) */

static void golden(const char *model, const char *path) {
    if (access(model, R_OK) != 0) {
        printf("golden: %s absent (run tools/setup.sh); skipped\n", model);
        return;
    }
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    CHECK(doc != NULL);
    if (!doc) return;
    char err[512] = "";
    wk_model *m = NULL;
    wk_model_opts o = {.model_path = model, .threads = 2, .max_batch = 16}; /* chunk 16: prompts span several prefill chunks */
    CHECK_RC(wk_model_load(&o, &m, err, sizeof err), 0);
    if (!m) { fprintf(stderr, "%s\n", err); json_decref(doc); return; }
    int V = (int)m->cfg.vocab;
    float *lg = malloc(sizeof(float) * (size_t)V);
    double *ref = malloc(sizeof(double) * (size_t)V);
    size_t ci;
    json_t *c;
    json_array_foreach(json_object_get(doc, "cases"), ci, c) {
        if (ci >= golden_cases) break;
        json_t *pid = json_object_get(c, "prompt_ids"), *gr = json_object_get(c, "greedy"),
               *fl = json_object_get(c, "first_logits"), *tl = json_object_get(c, "top_logits");
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        int np = (int)json_array_size(pid), ng = (int)json_array_size(gr);
        /* the whole first row, or (a large vocabulary) its largest entries as [id, logit] pairs */
        int nsel = fl ? V : (int)json_array_size(tl);
        CHECK(fl ? json_array_size(fl) == (size_t)V : nsel > 0);
        int32_t *sel = malloc(sizeof(int32_t) * (size_t)nsel);
        float *lsel = malloc(sizeof(float) * (size_t)nsel);
        for (int i = 0; i < nsel; i++) {
            sel[i] = fl ? i : (int32_t)json_integer_value(json_array_get(json_array_get(tl, (size_t)i), 0));
            ref[i] = json_real_value(fl ? json_array_get(fl, (size_t)i) : json_array_get(json_array_get(tl, (size_t)i), 1));
            if (sel[i] < 0 || sel[i] >= V) sel[i] = 0;
        }
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)(np + ng));
        for (int i = 0; i < np; i++) toks[i] = (int32_t)json_integer_value(json_array_get(pid, (size_t)i));
        /* our tokenizer must agree with the reference one on the prompt */
        int32_t *ids;
        size_t n;
        CHECK_RC(cm_tok_encode(m->tok, prompt, strlen(prompt), -1, 1, &ids, &n), 0);
        CHECK_INT(n, np);
        for (int i = 0; i < np && i < (int)n; i++) CHECK_INT(ids[i], toks[i]);
        free(ids);
        wk_kv *kv, *kv16;
        CHECK_RC(wk_kv_create(m, np + ng + 1, KN_KV_F32, &kv), 0);
        CHECK_RC(wk_kv_create(m, np + ng + 1, KN_KV_F16, &kv16), 0);
        /* production path (int8 activation blocks as llama.cpp's Q8_1, F16 KV
         * cache) against the float-activation reference: the quantization
         * noise shows (4-10% measured on these prompts), so this bound is loose.
         * Over a large vocabulary's top logits alone (Gemma) it is a larger share
         * and jumps with the rounding order of anything upstream (an int8 block
         * rounds the other way): 0.03-0.28 measured on the same prompt across
         * ISAs and attention kernels, every time with the reference's greedy
         * tokens; there the bound is wider and the first token must agree. */
        CHECK_RC(wk_forward(m, kv16, toks, np, lg, 0), 0);
        for (int i = 0; i < nsel; i++) lsel[i] = lg[sel[i]];
        double ef = rel_l2(lsel, ref, nsel);
        CHECK(ef < (fl ? 0.15 : 0.35));
        if (!fl && ng) CHECK_INT(wk_argmax(lg, V), json_integer_value(json_array_get(gr, 0)));
        /* reference mode (float activations, F32 KV cache): must match the
         * float64 numpy forward tightly and reproduce its greedy tokens */
        kn_set_act_f32(1);
        CHECK_RC(wk_forward(m, kv, toks, np, lg, 0), 0);
        for (int i = 0; i < nsel; i++) lsel[i] = lg[sel[i]];
        double e = rel_l2(lsel, ref, nsel);
        CHECK(e < 5e-4); /* fp32 against float64: 1e-6 on short prompts, 2e-4 over Gemma's 544 positions */
        int same = 0;
        for (int i = 0; i < ng; i++) {
            int32_t t = wk_argmax(lg, V);
            int32_t want = (int32_t)json_integer_value(json_array_get(gr, (size_t)i));
            if (t != want) {
                fprintf(stderr, "golden '%.30s': token %d is %d, reference %d\n", prompt, i, t, want);
                break;
            }
            same++;
            CHECK_RC(wk_forward(m, kv, &t, 1, lg, 0), 0);
        }
        CHECK_INT(same, ng);
        kn_set_act_f32(0);
        printf("golden '%.24s...': reference mode: logits rel-L2 %.2e, %d/%d greedy tokens equal; int8 path: rel-L2 %.2e\n",
               prompt, e, same, ng, ef);
        wk_kv_free(kv);
        wk_kv_free(kv16);
        free(toks);
        free(sel);
        free(lsel);
    }
    free(lg);
    free(ref);
    wk_model_free(m);
    json_decref(doc);
}

/* ---- a tiny llama2.c model written here ------------------------------- */

enum { TD = 64, TH = 96, TL = 2, TNH = 4, TNKV = 2, TV = 40, TS = 32, THD = TD / TNH };

typedef struct {
    float emb[TV][TD], an[TL][TD], wq[TL][TD][TD], wk[TL][TNKV * THD][TD], wv[TL][TNKV * THD][TD],
        wo[TL][TD][TD], fn[TL][TD], w1[TL][TH][TD], w2[TL][TD][TH], w3[TL][TH][TD], on[TD],
        fr[TS][THD / 2], fi[TS][THD / 2], cls[TV][TD];
} tiny_w;

static uint64_t trng = 42;
static float tr(void) {
    trng = trng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((trng >> 40) & 0xffffff) / 16777216.f * 2.f - 1.f;
}

static void write_tiny(const char *bin, const char *tokp, tiny_w *w, size_t *size) {
    float *f = (float *)w;
    for (size_t i = 0; i < sizeof *w / 4; i++) f[i] = tr() * 0.3f;
    for (int l = 0; l < TL; l++)
        for (int i = 0; i < TD; i++) w->an[l][i] = w->fn[l][i] = 1.f + 0.1f * tr();
    for (int i = 0; i < TD; i++) w->on[i] = 1.f;
    int32_t hdr[7] = {TD, TH, TL, TNH, TNKV, -TV, TS}; /* negative vocab: untied classifier */
    FILE *fp = fopen(bin, "wb");
    fwrite(hdr, 4, 7, fp);
    fwrite(w, sizeof *w, 1, fp);
    fclose(fp);
    *size = 28 + sizeof *w;
    fp = fopen(tokp, "wb");
    int32_t maxlen = 6;
    fwrite(&maxlen, 4, 1, fp);
    const char *pieces[TV] = {"<unk>", "<s>", "</s>", "<0x0A>", " ", "th", "he", " t", "in", "er", "an", " a", "on", "re"};
    char one[TV][2];
    for (int i = 14; i < TV; i++) {
        one[i][0] = (char)('a' + i - 14);
        one[i][1] = 0;
        pieces[i] = one[i];
    }
    for (int i = 0; i < TV; i++) {
        float score = -(float)i;
        int32_t len = (int32_t)strlen(pieces[i]);
        fwrite(&score, 4, 1, fp);
        fwrite(&len, 4, 1, fp);
        fwrite(pieces[i], 1, (size_t)len, fp);
    }
    fclose(fp);
}

static void rms(double *o, const double *x, const float *w, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    ss = 1 / sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; i++) o[i] = x[i] * ss * w[i];
}

static void mv(double *o, const float *W, const double *x, int n, int k) {
    for (int r = 0; r < n; r++) {
        double s = 0;
        for (int i = 0; i < k; i++) s += (double)W[(size_t)r * k + i] * x[i];
        o[r] = s;
    }
}

/* float64 forward of the tiny model, written from the architecture. */
static void tiny_ref(const tiny_w *w, const int32_t *tok, int T, double *logits) {
    static double kc[TL][TS][TNKV * THD], vc[TL][TS][TNKV * THD];
    for (int t = 0; t < T; t++) {
        double x[TD], h[TD], q[TD], k[TNKV * THD], v[TNKV * THD], att[TD], o[TD], g[TH], u[TH];
        for (int i = 0; i < TD; i++) x[i] = w->emb[tok[t]][i];
        for (int l = 0; l < TL; l++) {
            rms(h, x, w->an[l], TD);
            mv(q, &w->wq[l][0][0], h, TD, TD);
            mv(k, &w->wk[l][0][0], h, TNKV * THD, TD);
            mv(v, &w->wv[l][0][0], h, TNKV * THD, TD);
            for (int hh = 0; hh < TNH; hh++)
                for (int i = 0; i < THD / 2; i++) {
                    double a = t * pow(10000.0, -2.0 * i / THD), c = cos(a), sn = sin(a);
                    double *p = q + hh * THD + 2 * i, p0 = p[0];
                    p[0] = p0 * c - p[1] * sn;
                    p[1] = p0 * sn + p[1] * c;
                    if (hh < TNKV) {
                        double *r = k + hh * THD + 2 * i, r0 = r[0];
                        r[0] = r0 * c - r[1] * sn;
                        r[1] = r0 * sn + r[1] * c;
                    }
                }
            memcpy(kc[l][t], k, sizeof k);
            memcpy(vc[l][t], v, sizeof v);
            for (int hh = 0; hh < TNH; hh++) {
                int kvh = hh / (TNH / TNKV);
                double s[TS], mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    s[j] = 0;
                    for (int i = 0; i < THD; i++) s[j] += q[hh * THD + i] * kc[l][j][kvh * THD + i];
                    s[j] /= sqrt((double)THD);
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= t; j++) sum += (s[j] = exp(s[j] - mx));
                for (int i = 0; i < THD; i++) {
                    double a = 0;
                    for (int j = 0; j <= t; j++) a += s[j] / sum * vc[l][j][kvh * THD + i];
                    att[hh * THD + i] = a;
                }
            }
            mv(o, &w->wo[l][0][0], att, TD, TD);
            for (int i = 0; i < TD; i++) x[i] += o[i];
            rms(h, x, w->fn[l], TD);
            mv(g, &w->w1[l][0][0], h, TH, TD);
            mv(u, &w->w3[l][0][0], h, TH, TD);
            for (int i = 0; i < TH; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            mv(o, &w->w2[l][0][0], g, TD, TH);
            for (int i = 0; i < TD; i++) x[i] += o[i];
        }
        rms(h, x, w->on, TD);
        mv(logits + (size_t)t * TV, &w->cls[0][0], h, TV, TD);
    }
}

static void tiny(void) {
    char bin[] = "/tmp/llmserve_tinyXXXXXX", tokp[64];
    int fd = mkstemp(bin);
    close(fd);
    snprintf(tokp, sizeof tokp, "%s.tok", bin);
    tiny_w *w = malloc(sizeof *w);
    size_t size;
    write_tiny(bin, tokp, w, &size);
    char err[512] = "";
    wk_model *m = NULL;
    wk_model_opts o = {.model_path = bin, .tokenizer_path = tokp, .threads = 2, .max_batch = 5};
    CHECK_RC(wk_model_load(&o, &m, err, sizeof err), 0);
    if (!m) { fprintf(stderr, "%s\n", err); free(w); return; }
    CHECK(!m->cfg.tied);
    int32_t toks[12] = {0};
    int32_t *enc;
    size_t n;
    CHECK_RC(cm_tok_encode(m->tok, "the tin ant", 11, -1, 0, &enc, &n), 0);
    CHECK(n >= 4 && n <= 12 && enc[0] == 1);
    for (size_t i = 0; i < n; i++) toks[i] = enc[i];
    char *back = cm_tok_decode(m->tok, enc, n, 0);
    CHECK(back && strcmp(back, "the tin ant") == 0);
    free(back);
    free(enc);
    int T = (int)n;
    float *all = malloc(sizeof(float) * (size_t)(T * TV)), *one = malloc(sizeof(float) * TV);
    double *ref = calloc((size_t)(T * TV), sizeof(double));
    wk_kv *kv;
    CHECK_RC(wk_kv_create(m, TS, KN_KV_F16, &kv), 0); /* F16 cache: fp16 rounding of K/V */
    CHECK_RC(wk_forward(m, kv, toks, T, all, 1), 0);
    tiny_ref(w, toks, T, ref);
    double e16 = rel_l2(all, ref, T * TV);
    CHECK(e16 < 2e-3);
    wk_kv_free(kv);
    CHECK_RC(wk_kv_create(m, TS, 7, &kv), LLM_EINVAL);
    CHECK_RC(wk_kv_create(m, TS, KN_KV_F32, &kv), 0);
    CHECK_RC(wk_forward(m, kv, toks, T, all, 1), 0); /* prefill in chunks of 5 */
    CHECK(rel_l2(all, ref, T * TV) < 1e-5);
    kv->n = 0;
    double dmax = 0;
    for (int t = 0; t < T; t++) {
        CHECK_RC(wk_forward(m, kv, toks + t, 1, one, 0), 0);
        for (int i = 0; i < TV; i++) dmax = fmax(dmax, fabs(one[i] - all[t * TV + i]));
    }
    CHECK(dmax < 1e-5); /* decode == prefill */
    printf("tiny llama2.c: logits rel-L2 %.2e vs float64 forward (F16 KV %.2e), decode-vs-prefill max diff %.2e\n",
           rel_l2(all, ref, T * TV), e16, dmax);
    /* bad input: out-of-vocabulary token, overflowing the cache */
    int32_t bad = TV;
    CHECK_RC(wk_forward(m, kv, &bad, 1, one, 0), LLM_EINVAL);
    kv->n = TS - 1;
    CHECK_RC(wk_forward(m, kv, toks, 2, one, 0), LLM_ERANGE);
    wk_kv_free(kv);
    wk_model_free(m);
    /* truncated checkpoint */
    CHECK(truncate(bin, (off_t)(size - 100)) == 0);
    CHECK_RC(wk_model_load(&o, &m, err, sizeof err), LLM_ETRUNC);
    printf("truncated llama2.c -> %s\n", err);
    free(all); free(one); free(ref); free(w);
    unlink(bin);
    unlink(tokp);
}

static void stories(const char *dir) {
    char bin[1024], tokp[1024];
    snprintf(bin, sizeof bin, "%s/stories260K.bin", dir);
    snprintf(tokp, sizeof tokp, "%s/tok512.bin", dir);
    if (access(bin, R_OK) != 0) {
        printf("stories260K: not present; skipped\n");
        return;
    }
    char err[512];
    wk_model *m = NULL;
    wk_model_opts o = {.model_path = bin, .tokenizer_path = tokp, .threads = 2};
    CHECK_RC(wk_model_load(&o, &m, err, sizeof err), 0);
    if (!m) return;
    const char *s = "One day, a clever fox found a shiny key under the old oak tree.";
    int32_t *ids;
    size_t n;
    CHECK_RC(cm_tok_encode(m->tok, s, strlen(s), -1, 0, &ids, &n), 0);
    CHECK_INT(n, 35);
    float *lg = malloc(sizeof(float) * n * 512);
    wk_kv *kv;
    CHECK_RC(wk_kv_create(m, 512, KN_KV_F16, &kv), 0); /* the production cache type */
    CHECK_RC(wk_forward(m, kv, ids, (int)n, lg, 1), 0);
    double nll = 0;
    for (size_t t = 0; t + 1 < n; t++) {
        double mx = -1e300, sum = 0;
        for (int j = 0; j < 512; j++) mx = fmax(mx, lg[t * 512 + j]);
        for (int j = 0; j < 512; j++) sum += exp(lg[t * 512 + j] - mx);
        nll -= lg[t * 512 + (size_t)ids[t + 1]] - mx - log(sum);
    }
    CHECK_NEAR(nll, 54.404121, 0.01);
    /* greedy continuation, as documented beside the model */
    const char *p = "Once upon a time";
    free(ids);
    cm_tok_encode(m->tok, p, strlen(p), -1, 0, &ids, &n);
    kv->n = 0;
    int32_t out[64];
    int no = 0;
    CHECK_RC(wk_forward(m, kv, ids, (int)n, lg, 0), 0);
    for (; no < 30; no++) {
        out[no] = wk_argmax(lg, 512);
        wk_forward(m, kv, &out[no], 1, lg, 0);
    }
    char *text = cm_tok_decode(m->tok, out, (size_t)no, 0);
    CHECK(text && strncmp(text, ", there was a little girl named Lily. She loved to play outside", 60) == 0);
    printf("stories260K: nll %.6f (reference 54.404121); greedy: Once upon a time%s\n", nll, text);
    free(text);
    free(ids);
    free(lg);
    wk_kv_free(kv);
    wk_model_free(m);
}

/* Runs T tokens of a dummy model of config `spec`; logits of the last one into out[vocab]. */
static int dummy_logits(const char *spec, int type, uint64_t seed, float *out, int *n_tensors) {
    wk_model_opts o = {.threads = 2, .max_batch = 16, .model_config = spec, .dummy_type = type, .seed = seed};
    wk_model *m = NULL;
    char err[512] = "";
    int rc = wk_model_load(&o, &m, err, sizeof err);
    if (rc) {
        printf("dummy %s: %s\n", spec, err);
        return rc;
    }
    *n_tensors = (int)m->file->n_tensors;
    wk_kv *kv = NULL;
    int32_t toks[5] = {1, 40, 77, 3, 299};
    CHECK_RC(wk_kv_create(m, 64, KN_KV_F16, &kv), 0);
    if (kv) CHECK_RC(wk_forward(m, kv, toks, 5, out, 0), 0);
    wk_kv_free(kv);
    wk_model_free(m);
    return 0;
}

/* 4. --load-format dummy: presets and config.json give the real shape; random
 *    weights of every supported type load and run, finite, seeded. */
static void dummy(void) {
    cm_model_config c;
    char err[512] = "";
    CHECK_RC(cm_model_preset("llama-3-8b", &c), 0);
    CHECK(c.n_layer == 32 && c.n_kv_head == 8 && c.head_dim == 128 && c.hidden == 14336 && c.vocab == 128256);
    CHECK_NEAR(c.rope_theta, 500000, 0);
    CHECK_RC(cm_model_preset("Qwen2.5-7B", &c), 0);
    CHECK(c.qkv_bias == 1 && c.rope_type == CM_ROPE_NEOX && c.n_kv_head == 4 && c.vocab == 152064);
    CHECK_RC(cm_model_preset("llama-3-70b", &c), 0);
    CHECK(c.n_layer == 80 && c.dim == 8192 && c.n_head == 64);
    CHECK_RC(cm_model_config_resolve("llama-9-1t", &c, err, sizeof err), LLM_ENOTFOUND);
    CHECK(strstr(err, "llama-3-8b") != NULL);
    char dir[] = "/tmp/llmserve_dummyXXXXXX", llama[96], qwen[96], bad[96], notjson[96];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(llama, sizeof llama, "%s/llama.json", dir);
    snprintf(qwen, sizeof qwen, "%s/qwen.json", dir);
    snprintf(bad, sizeof bad, "%s/bad.json", dir);
    snprintf(notjson, sizeof notjson, "%s/not.json", dir);
    FILE *f = fopen(llama, "w");
    fprintf(f, "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 128, "
               "\"vocab_size\": 300, \"max_position_embeddings\": 256, \"rope_theta\": 10000.0}");
    fclose(f);
    f = fopen(qwen, "w");
    fprintf(f, "{\"model_type\": \"qwen2\", \"num_hidden_layers\": 1, \"hidden_size\": 64, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"intermediate_size\": 96, "
               "\"vocab_size\": 320, \"tie_word_embeddings\": true}");
    fclose(f);
    f = fopen(bad, "w");
    fprintf(f, "{\"hidden_size\": 64}");
    fclose(f);
    f = fopen(notjson, "w");
    fprintf(f, "hidden_size = 64");
    fclose(f);
    CHECK_RC(cm_model_config_resolve(llama, &c, err, sizeof err), 0);
    CHECK(c.n_layer == 2 && c.head_dim == 16 && c.n_kv_head == 2 && c.vocab == 300 && !c.qkv_bias);
    CHECK_RC(cm_model_config_json(bad, &c, err, sizeof err), LLM_EFORMAT);
    CHECK(strstr(err, "num_hidden_layers") != NULL);
    CHECK_RC(cm_model_config_json(notjson, &c, err, sizeof err), LLM_EFORMAT);
    static const int types[] = {CM_F32, CM_F16, CM_BF16, CM_Q8_0, CM_Q4_0, CM_Q4_1};
    float a[300], b[300];
    int nt = 0;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        CHECK_RC(dummy_logits(llama, types[t], 7, a, &nt), 0);
        CHECK_RC(nt, 3 + 9 * 2); /* embeddings, final norm, LM head; 9 tensors a layer */
        double mean = 0, sd = 0;
        int finite = 1;
        for (int i = 0; i < 300; i++) {
            finite &= isfinite(a[i]) != 0;
            mean += a[i] / 300.0;
        }
        for (int i = 0; i < 300; i++) sd += (a[i] - mean) * (a[i] - mean) / 300.0;
        CHECK(finite);
        CHECK(sqrt(sd) > 1e-3); /* the logits carry signal, not a constant */
        CHECK_RC(dummy_logits(llama, types[t], 7, b, &nt), 0);
        CHECK(memcmp(a, b, sizeof a) == 0); /* same seed, same weights */
        CHECK_RC(dummy_logits(llama, types[t], 8, b, &nt), 0);
        CHECK(memcmp(a, b, sizeof a) != 0);
    }
    float q[320];
    CHECK_RC(dummy_logits(qwen, CM_F16, 1, q, &nt), 0);
    CHECK_RC(nt, 2 + 12); /* tied: no LM head; q/k/v biases */
    CHECK(isfinite(q[0]) && isfinite(q[319]));
    /* --device cuda refuses at load, by name, what its kernels cannot compute (head_dim 16 here), and says so
     * whether or not this machine has a GPU */
    {
        wk_model_opts go = {.threads = 1, .max_batch = 4, .model_config = llama, .dummy_type = CM_F32, .seed = 1,
                            .device = WK_DEV_CUDA, .dummy_on_host = 1};
        wk_model *mg = NULL;
        CHECK_RC(wk_model_load(&go, &mg, err, sizeof err), LLM_EUNSUP);
#ifdef LLMSERVE_HAVE_CUDA
        CHECK(strstr(err, "head_dim 16 is not supported") != NULL);
#else
        CHECK(strstr(err, "no CUDA backend") != NULL);
#endif
        wk_model_free(mg);
    }
    /* the stand-in tokenizer: any text encodes to byte tokens and decodes back */
    cm_tokenizer *tk;
    CHECK_RC(cm_tok_synthetic(300, &tk), 0);
    int32_t *ids = NULL;
    size_t n = 0;
    const char *text = "h\xc3\xa9llo <s> w";
    CHECK_RC(cm_tok_encode(tk, text, strlen(text), 1, 0, &ids, &n), 0);
    CHECK(n >= strlen(text) && ids[0] == 1);
    char *back = cm_tok_decode(tk, ids + 1, n - 1, 0);
    CHECK(back && strcmp(back, text) == 0);
    free(back);
    free(ids);
    cm_tok_free(tk);
    CHECK_RC(cm_tok_synthetic(100, &tk), LLM_EINVAL);
    unlink(llama);
    unlink(qwen);
    unlink(bad);
    unlink(notjson);
    rmdir(dir);
}

/* 5. The GPU step's metadata, built on the host: slots, positions, rows that
 *    want logits and the cut block tables of a mixed step (a decode, a
 *    prefill chunk over a cached prefix, a fresh prompt), block size 4. */
static void step_meta(void) {
    wk_cache c = {.block_size = 4, .block_shift = 2};
    int32_t t0[1] = {11}, t1[3] = {21, 22, 23}, t2[2] = {31, 32};
    int32_t b0[3] = {7, 2, 9}, b1[4] = {5, 6, 1, 8}, b2[1] = {4};
    wk_batch_seq s[3] = {{t0, 1, 9, b0, 0, 0}, {t1, 3, 5, b1, 2, 0}, {t2, 2, 0, b2, 2, 0}};
    size_t n = wk_step_meta_size(&c, 3, s, 6);
    CHECK_RC((int)n, 5 * 6 + 3 + 3 + 2 + 1); /* seq 0: positions 0..9 -> 3 blocks; seq 1: 0..7 -> 2; seq 2: 1 */
    int32_t m[64];
    memset(m, 0x55, sizeof m);
    CHECK_RC(wk_step_meta(&c, 3, s, 6, m), 2); /* seq 0's token and seq 1's last want logits; seq 2 none */
    int32_t ids[6] = {11, 21, 22, 23, 31, 32}, pos[6] = {9, 5, 6, 7, 0, 1}, rseq[6] = {0, 1, 1, 1, 2, 2};
    /* slot = block of the position * 4 + offset: 9 -> b0[2]=9 -> 37; 5,6,7 -> b1[1]=6 -> 25,26,27; 0,1 -> b2[0]=4 -> 16,17 */
    int32_t slot[6] = {37, 25, 26, 27, 16, 17}, lrows[2] = {0, 3}, soff[3] = {0, 3, 5}, blk[6] = {7, 2, 9, 5, 6, 4};
    CHECK(memcmp(m, ids, sizeof ids) == 0 && memcmp(m + 6, pos, sizeof pos) == 0);
    CHECK(memcmp(m + 12, rseq, sizeof rseq) == 0 && memcmp(m + 18, slot, sizeof slot) == 0);
    CHECK(memcmp(m + 24, lrows, sizeof lrows) == 0 && memcmp(m + 30, soff, sizeof soff) == 0);
    CHECK(memcmp(m + 33, blk, sizeof blk) == 0);
    CHECK(m[39] == 0x55555555); /* nothing written past the size */
}

/* 6. The FP8 (E4M3) KV cache on the real model: every position's logits
 *    close to the F16 cache's, and the same next-token choice nearly always. */
static void fp8_kv(const char *model) {
    if (access(model, R_OK) != 0) return;
    char err[512] = "";
    wk_model *m = NULL;
    wk_model_opts o = {.model_path = model, .threads = 2, .max_batch = 64};
    CHECK_RC(wk_model_load(&o, &m, err, sizeof err), 0);
    if (!m) return;
    const char *text = "The history of the river valley begins with the glaciers that carved it. When the ice "
                       "retreated, the water found the softest rock and cut a channel that later towns would follow.";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_RC(cm_tok_encode(m->tok, text, strlen(text), 1, 0, &ids, &n), 0);
    int V = (int)m->cfg.vocab, same = 0;
    float *a = malloc(sizeof(float) * n * (size_t)V), *b = malloc(sizeof(float) * n * (size_t)V);
    wk_kv *k16 = NULL, *k8 = NULL;
    CHECK_RC(wk_kv_create(m, (int)n, KN_KV_F16, &k16), 0);
    CHECK_RC(wk_kv_create(m, (int)n, KN_KV_FP8, &k8), 0);
    CHECK_RC(wk_forward(m, k16, ids, (int)n, a, 1), 0);
    CHECK_RC(wk_forward(m, k8, ids, (int)n, b, 1), 0);
    double worst = 0, mean = 0;
    for (size_t t = 0; t < n; t++) {
        double d = 0, s2 = 0;
        int ba = 0, bb = 0;
        for (int i = 0; i < V; i++) {
            float x = a[t * (size_t)V + i], y = b[t * (size_t)V + i];
            d += (double)(x - y) * (x - y);
            s2 += (double)x * x;
            if (x > a[t * (size_t)V + ba]) ba = i;
            if (y > b[t * (size_t)V + bb]) bb = i;
        }
        if (sqrt(d / s2) > worst) worst = sqrt(d / s2);
        mean += sqrt(d / s2) / (double)n;
        same += ba == bb;
    }
    printf("fp8 KV cache vs f16 over %zu positions: logits rel-L2 mean %.2e, worst %.2e; same argmax at %d\n", n, mean,
           worst, same);
    CHECK(mean < 0.1); /* E4M3 keeps 3 mantissa bits: a few percent per position, more where attention is sharp */
    CHECK(worst < 0.4);
    CHECK(same >= (int)n * 9 / 10);
    CHECK_RC((int)kn_kv_elem_bytes(KN_KV_FP8), 1);
    wk_kv_free(k16);
    wk_kv_free(k8);
    free(a);
    free(b);
    free(ids);
    wk_model_free(m);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: model_test MODEL GOLDEN [STORIES_DIR [GEMMA3 GEMMA3_GOLDEN]]\n");
        return 2;
    }
    const char *gc = getenv("MODEL_TEST_GOLDEN_CASES");
    if (gc && atoi(gc) > 0) golden_cases = (size_t)atoi(gc);
    tiny();
    dummy();
    step_meta();
    golden(argv[1], argv[2]);
    fp8_kv(argv[1]);
    if (argc > 3) stories(argv[3]);
    if (argc > 5) golden(argv[4], argv[5]); /* Gemma 3 270M Q4_K_M: K-quants, GeGLU, sliding windows */
    return tst_done("model_test");
}
