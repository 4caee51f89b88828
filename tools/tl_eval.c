/* llmserve eval: what a quantization (or a kernel change) costs, measured.
 *
 * A model A against a reference B (the same model at a higher precision, or
 * A itself with float activations: --ref-act-f32). Over the windows of a
 * text, each position's next-token distributions of both: the perplexity of
 * each, the KL divergence KL(B || A) (mean and 99th percentile over the
 * positions) and how often their top tokens agree; then a small task set of
 * our own (arithmetic, facts, short code completions: greedy, exact match on
 * the answer), the file size and bits per weight, and prefill and decode
 * speed. --check-kl and --check-top1 make it a regression test: on a fixed
 * text the figures are reproducible run to run on one instruction set. */
#include "cm_error.h"
#include "cm_gguf.h"
#include "cm_parse.h"
#include "cm_safetensors.h"
#include "cm_time.h"
#include "tl_common.h"
#include "wk_flags.h"
#include "wk_model.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void help(FILE *f) {
    fprintf(f, "usage: llmserve eval --model A [--ref B] --file TEXT [flags]\n"
               "  --model A          the model under test (GGUF)\n"
               "  --ref B            its reference, the same model at a higher precision (default: A)\n"
               "  --ref-act-f32      run the reference with float activations; with B = A this measures\n"
               "                     what the int8 activation blocks alone cost\n"
               "  --act-f32          run A with float activations too\n"
               "  --file TEXT        text for perplexity, KL and top-1 ('-' for stdin)\n"
               "  --ctx N            window in tokens (default 256)\n"
               "  --max-tokens N     score at most N tokens of the text (default all)\n"
               "  --kv-cache-dtype T A's KV cache: f16 (default), bf16, f32, fp8 (the reference keeps f16)\n"
               "  --no-tasks         skip the task set\n"
               "  --no-speed         skip the prefill / decode timing\n"
               "  --threads N        threads (default: all CPUs)\n"
               "  --json             one JSON object on stdout instead of the table\n"
               "  --check-kl X       exit 1 when the mean KL is above X\n"
               "  --check-top1 Y     exit 1 when the top-1 agreement is below Y\n");
}

/* ---- the task set: greedy continuations, exact match on the answer ------ */
static const char *ARITH =
    "Q: What is 2 + 3?\nA: 5\nQ: What is 7 + 6?\nA: 13\nQ: What is 10 - 4?\nA: 6\nQ: What is ";
static const struct {
    const char *kind, *prompt, *answers[3]; /* any answer at the start of the continuation's first line */
} tasks[] = {
    {"arith", "4 + 4?\nA:", {"8"}},          {"arith", "9 + 1?\nA:", {"10"}},        {"arith", "12 + 5?\nA:", {"17"}},
    {"arith", "20 - 7?\nA:", {"13"}},        {"arith", "3 + 6?\nA:", {"9"}},         {"arith", "15 + 15?\nA:", {"30"}},
    {"arith", "8 - 5?\nA:", {"3"}},          {"arith", "11 + 11?\nA:", {"22"}},
    {"fact", "The capital of France is", {"Paris"}},
    {"fact", "The capital of Japan is", {"Tokyo"}},
    {"fact", "The capital of Italy is", {"Rome"}},
    {"fact", "The capital of Germany is", {"Berlin"}},
    {"fact", "The largest planet in the solar system is", {"Jupiter"}},
    {"fact", "Water is made of hydrogen and", {"oxygen"}},
    {"fact", "The chemical symbol for gold is", {"Au"}},
    {"fact", "Romeo and Juliet was written by", {"William Shakespeare", "Shakespeare"}},
    {"code", "def add(a, b):\n    return", {"a + b", "a+b"}},
    {"code", "def square(x):\n    return", {"x * x", "x**2", "x ** 2"}},
    {"code", "def is_even(n):\n    return", {"n % 2 == 0", "n%2 == 0", "n % 2 ==0"}},
    {"code", "def greet(name):\n    return \"Hello, \" +", {"name"}},
    {"code", "numbers = [1, 2, 3]\ntotal = sum(", {"numbers"}},
    {"code", "# print the numbers 0 to 9\nfor i in range(", {"10)"}},
    {"code", "import math\nprint(math.sqrt(16))  # prints", {"4"}},
    {"code", "x = [3, 1, 2]\nx.sort()\nprint(x)  # prints", {"[1, 2, 3]"}},
};
#define N_TASKS ((int)(sizeof tasks / sizeof *tasks))

typedef struct {
    const char *path;
    wk_model *m;
    wk_kv *kv;
    int act_f32, kv_type;
    double size_mb, bpw, nll, prefill_tps, decode_tps;
    int tasks_ok, tasks_by[3][2]; /* arith, fact, code: passed, run */
} side;

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static double lse(const float *x, int n) {
    double mx = x[0], s = 0;
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
    return mx + log(s);
}

/* The file's size (a directory's: its safetensors files') and its weight
 * matrices' bits per element as stored (an AWQ / GPTQ layer's qweight,
 * qzeros and scales together). */
static void size_of(side *s) {
    struct stat st;
    s->size_mb = stat(s->path, &st) ? 0 : (double)st.st_size / 1e6;
    cm_model_file *m = NULL;
    char err[600];
    if (cm_model_open(s->path, &m, err, sizeof err)) return;
    double bytes = 0, el = 0;
    for (size_t i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].n_dims >= 2) {
            double e = 1;
            for (uint32_t d = 0; d < m->tensors[i].n_dims; d++) e *= (double)m->tensors[i].ne[d];
            el += e, bytes += (double)m->tensors[i].nbytes;
        }
    if (m->format == CM_FMT_HF) {
        s->size_mb = 0, bytes = 0;
        for (int f = 0; f < m->n_st; f++) {
            s->size_mb += (double)m->st[f]->size / 1e6;
            for (size_t i = 0; i < m->st[f]->n_tensors; i++)
                if (m->st[f]->tensors[i].n_dims >= 2) bytes += (double)m->st[f]->tensors[i].nbytes;
        }
    }
    s->bpw = el > 0 ? 8 * bytes / el : 0;
    cm_model_close(m);
}

static int forward(side *s, const int32_t *t, int n, float *lg, int all) {
    kn_set_act_f32(s->act_f32);
    int rc = wk_forward(s->m, s->kv, t, n, lg, all);
    kn_set_act_f32(0);
    return rc;
}

/* Greedy continuation of a prompt, up to max tokens or the end of its first line. */
static int complete(side *s, const char *prompt, int max, char *out, size_t cap, float *lg) {
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = cm_tok_encode(s->m->tok, prompt, strlen(prompt), -1, 0, &ids, &n);
    if (rc) return rc;
    s->kv->n = 0;
    if (n + (size_t)max + 1 > (size_t)s->kv->ctx) {
        free(ids);
        return LLM_ERANGE;
    }
    rc = forward(s, ids, (int)n, lg, 0);
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < max && !rc; i++) {
        int32_t t = argmax(lg, (int)s->m->cfg.vocab);
        if (cm_tok_is_eog(s->m->tok, t)) break;
        const char *p;
        size_t pl;
        if (!cm_tok_piece(s->m->tok, t, 0, &p, &pl) && len + pl + 1 < cap) {
            memcpy(out + len, p, pl);
            out[len += pl] = 0;
        }
        if (strchr(out, '\n') && strspn(out, " \n") < strlen(out)) break; /* the first line is complete */
        rc = forward(s, &t, 1, lg, 0);
    }
    free(ids);
    return rc;
}

static int run_tasks(side *s, float *lg) {
    char prompt[512], out[256];
    for (int i = 0; i < N_TASKS; i++) {
        snprintf(prompt, sizeof prompt, "%s%s", strcmp(tasks[i].kind, "arith") ? "" : ARITH, tasks[i].prompt);
        int rc = complete(s, prompt, 16, out, sizeof out, lg);
        if (rc) return rc;
        const char *a = out + strspn(out, " \t\n"); /* the first line of the continuation */
        size_t line = strcspn(a, "\n");
        int ok = 0;
        for (int j = 0; j < 3 && tasks[i].answers[j] && !ok; j++) {
            size_t al = strlen(tasks[i].answers[j]);
            ok = al <= line && !strncmp(a, tasks[i].answers[j], al) &&
                 (al == line || !(a[al] >= '0' && a[al] <= '9')); /* "13" is not "130" */
        }
        int k = !strcmp(tasks[i].kind, "arith") ? 0 : !strcmp(tasks[i].kind, "fact") ? 1 : 2;
        s->tasks_by[k][0] += ok;
        s->tasks_by[k][1]++;
        s->tasks_ok += ok;
    }
    return 0;
}

/* Prefill of a 128-token chunk of the text, then 32 decode steps (the production path unless
 * --act-f32), best of two. */
static int speed(side *s, const int32_t *toks, size_t nt, float *lg) {
    int np = nt < 128 ? (int)nt : 128;
    double bp = 1e9, bd = 1e9;
    for (int rep = 0; rep < 2; rep++) {
        s->kv->n = 0;
        double t0 = cm_now();
        int rc = forward(s, toks, np, lg, 0);
        double t1 = cm_now();
        for (int i = 0; i < 32 && !rc; i++) {
            int32_t t = argmax(lg, (int)s->m->cfg.vocab);
            rc = forward(s, &t, 1, lg, 0);
        }
        if (rc) return rc;
        double t2 = cm_now();
        bp = fmin(bp, t1 - t0), bd = fmin(bd, t2 - t1);
    }
    s->prefill_tps = np / bp;
    s->decode_tps = 32 / bd;
    return 0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int tl_eval_main(int argc, char **argv) {
    const char *file = NULL;
    side A = {0}, B = {0};
    A.kv_type = B.kv_type = KN_KV_F16;
    long ctx = 256, max_tokens = 0, threads = 0;
    double check_kl = -1, check_top1 = -1;
    int tasks_on = 1, speed_on = 1, json = 0;
    enum { O_REF = 1000, O_RF32, O_AF32, O_NOTASK, O_NOSPEED, O_JSON, O_CKL, O_CT1, O_MAXT, O_KV };
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'},  {"ref", required_argument, 0, O_REF},   {"ref-act-f32", no_argument, 0, O_RF32},
        {"act-f32", no_argument, 0, O_AF32},   {"file", required_argument, 0, 'f'},    {"ctx", required_argument, 0, 'c'},
        {"max-tokens", required_argument, 0, O_MAXT}, {"no-tasks", no_argument, 0, O_NOTASK},
        {"no-speed", no_argument, 0, O_NOSPEED}, {"threads", required_argument, 0, 'j'}, {"json", no_argument, 0, O_JSON},
        {"check-kl", required_argument, 0, O_CKL}, {"check-top1", required_argument, 0, O_CT1},
        {"kv-cache-dtype", required_argument, 0, O_KV}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': A.path = optarg; break;
        case O_REF: B.path = optarg; break;
        case O_RF32: B.act_f32 = 1; break;
        case O_AF32: A.act_f32 = 1; break;
        case 'f': file = optarg; break;
        case 'c': if (cm_parse_long("--ctx", optarg, 16, 1 << 20, &ctx)) return 2; break;
        case O_MAXT: if (cm_parse_long("--max-tokens", optarg, 2, 1L << 30, &max_tokens)) return 2; break;
        case O_NOTASK: tasks_on = 0; break;
        case O_NOSPEED: speed_on = 0; break;
        case 'j': if (cm_parse_long("--threads", optarg, 1, 1024, &threads)) return 2; break;
        case O_JSON: json = 1; break;
        case O_KV: if (wk_parse_kv_dtype(optarg, &A.kv_type)) return 2; break;
        case O_CKL: if (cm_parse_double("--check-kl", optarg, 0, 1e9, &check_kl)) return 2; break;
        case O_CT1: if (cm_parse_double("--check-top1", optarg, 0, 1, &check_top1)) return 2; break;
        case 'h': help(stdout); return 0;
        default: help(stderr); return 2;
        }
    }
    if (!A.path || !file || optind != argc) {
        fprintf(stderr, "llmserve: eval needs --model and --file\n");
        help(stderr);
        return 2;
    }
    if (!B.path) B.path = A.path;
    size_t len = 0;
    char *text = tl_read_file(file, &len), err[512] = "";
    if (!text) {
        fprintf(stderr, "llmserve: %s: cannot read\n", file);
        return 1;
    }
    int ret = 1, rc = 0;
    int32_t *toks = NULL;
    size_t nt = 0;
    float *la = NULL, *lb = NULL;
    double *kls = NULL;
    side *sides[2] = {&A, &B};
    for (int i = 0; i < 2; i++) {
        wk_model_opts mo = {.model_path = sides[i]->path, .threads = (int)threads, .max_batch = 64};
        if ((rc = wk_model_load(&mo, &sides[i]->m, err, sizeof err))) {
            fprintf(stderr, "llmserve: %s\n", err[0] ? err : cm_strerror(rc));
            goto out;
        }
        size_of(sides[i]);
    }
    int V = (int)A.m->cfg.vocab;
    if (B.m->cfg.vocab != A.m->cfg.vocab || cm_tok_fingerprint(A.m->tok) != cm_tok_fingerprint(B.m->tok)) {
        fprintf(stderr, "llmserve: eval: %s and %s have different tokenizers: not the same model\n", A.path, B.path);
        goto out;
    }
    if (ctx > (long)A.m->cfg.ctx_len) ctx = A.m->cfg.ctx_len;
    if ((rc = cm_tok_encode(A.m->tok, text, len, -1, 0, &toks, &nt)) || nt < 2) {
        fprintf(stderr, "llmserve: %s\n", rc ? cm_strerror(rc) : "the text has fewer than 2 tokens");
        goto out;
    }
    if (max_tokens && nt > (size_t)max_tokens) nt = (size_t)max_tokens;
    int CH = A.m->max_batch < B.m->max_batch ? A.m->max_batch : B.m->max_batch;
    la = malloc(sizeof(float) * (size_t)V * (size_t)CH);
    lb = malloc(sizeof(float) * (size_t)V * (size_t)CH);
    kls = malloc(sizeof(double) * nt);
    if (!la || !lb || !kls || (rc = wk_kv_create(A.m, (int)ctx, A.kv_type, &A.kv)) ||
        (rc = wk_kv_create(B.m, (int)ctx, B.kv_type, &B.kv)))
        goto out;
    double t0 = cm_now();
    size_t scored = 0, agree = 0;
    double kl_sum = 0;
    for (size_t w0 = 0; w0 + 1 < nt; w0 += (size_t)ctx) {
        size_t wn = nt - w0 < (size_t)ctx ? nt - w0 : (size_t)ctx;
        A.kv->n = B.kv->n = 0;
        for (size_t b0 = 0; b0 < wn; b0 += (size_t)CH) {
            int bn = (int)(wn - b0 < (size_t)CH ? wn - b0 : (size_t)CH);
            if ((rc = forward(&A, toks + w0 + b0, bn, la, 1)) || (rc = forward(&B, toks + w0 + b0, bn, lb, 1))) goto out;
            for (int i = 0; i < bn && b0 + (size_t)i + 1 < wn; i++) {
                const float *xa = la + (size_t)i * V, *xb = lb + (size_t)i * V;
                int32_t next = toks[w0 + b0 + (size_t)i + 1];
                double za = lse(xa, V), zb = lse(xb, V), kl = 0;
                for (int j = 0; j < V; j++) {
                    double pb = exp((double)xb[j] - zb);
                    if (pb > 0) kl += pb * (((double)xb[j] - zb) - ((double)xa[j] - za));
                }
                kls[scored++] = kl > 0 ? kl : 0;
                kl_sum += kl > 0 ? kl : 0;
                A.nll -= (double)xa[next] - za;
                B.nll -= (double)xb[next] - zb;
                agree += argmax(xa, V) == argmax(xb, V);
            }
        }
    }
    double t_score = cm_now() - t0;
    qsort(kls, scored, sizeof *kls, cmp_d);
    double kl_mean = kl_sum / (double)scored, kl_p99 = kls[(size_t)(0.99 * (double)(scored - 1))];
    double top1 = (double)agree / (double)scored;
    for (int i = 0; i < 2 && (tasks_on || speed_on); i++) {
        wk_kv_free(sides[i]->kv);
        sides[i]->kv = NULL;
        if ((rc = wk_kv_create(sides[i]->m, 512, sides[i]->kv_type, &sides[i]->kv))) goto out;
        if (tasks_on && (rc = run_tasks(sides[i], la))) goto out;
        if (speed_on && (rc = speed(sides[i], toks, nt, la))) goto out;
    }
    if (json) {
        printf("{\"text_tokens\": %zu, \"scored\": %zu, \"ctx\": %ld, \"kl_mean\": %.6g, \"kl_p99\": %.6g, \"top1\": %.6f",
               nt, scored, ctx, kl_mean, kl_p99, top1);
        for (int i = 0; i < 2; i++) {
            side *s = sides[i];
            printf(", \"%s\": {\"path\": \"%s\", \"act_f32\": %s, \"size_mb\": %.2f, \"bits_per_weight\": %.3f, "
                   "\"perplexity\": %.4f",
                   i ? "ref" : "model", s->path, s->act_f32 ? "true" : "false", s->size_mb, s->bpw,
                   exp(s->nll / (double)scored));
            if (tasks_on)
                printf(", \"tasks\": %d, \"tasks_of\": %d, \"arith\": %d, \"fact\": %d, \"code\": %d", s->tasks_ok, N_TASKS,
                       s->tasks_by[0][0], s->tasks_by[1][0], s->tasks_by[2][0]);
            if (speed_on) printf(", \"prefill_tok_s\": %.1f, \"decode_tok_s\": %.1f", s->prefill_tps, s->decode_tps);
            printf("}");
        }
        printf(", \"isa\": \"%s\"}\n", kn_isa_name());
    } else {
        printf("eval: %zu positions of %s in windows of %ld (%.1f s); %s, %d threads\n", scored, file, ctx, t_score,
               kn_isa_name(), kn_pool_size(A.m->pool));
        printf("%-50s %8s %6s %9s %9s %9s %9s %9s %7s %7s\n", "model", "size MB", "bits/w", "prefill/s", "decode/s", "PPL",
               "KL mean", "KL p99", "top-1", "tasks");
        for (int i = 0; i < 2; i++) {
            side *s = sides[i];
            char name[64], tk[16] = "-", pf[16] = "-", dc[16] = "-";
            const char *base = strrchr(s->path, '/') ? strrchr(s->path, '/') + 1 : s->path;
            snprintf(name, sizeof name, "%s%.36s%s%s", i ? "ref: " : "", base, s->act_f32 ? " (f32 act)" : "",
                     s->kv_type == KN_KV_FP8 ? " (fp8 KV)" : s->kv_type == KN_KV_BF16 ? " (bf16 KV)" : s->kv_type == KN_KV_F32 ? " (f32 KV)" : "");
            if (tasks_on) snprintf(tk, sizeof tk, "%d/%d", s->tasks_ok, N_TASKS);
            if (speed_on) snprintf(pf, sizeof pf, "%.0f", s->prefill_tps), snprintf(dc, sizeof dc, "%.1f", s->decode_tps);
            if (i == 0)
                printf("%-50s %8.1f %6.2f %9s %9s %9.3f %9.5f %9.4f %6.1f%% %7s\n", name, s->size_mb, s->bpw, pf, dc,
                       exp(s->nll / (double)scored), kl_mean, kl_p99, 100 * top1, tk);
            else
                printf("%-50s %8.1f %6.2f %9s %9s %9.3f %9s %9s %7s %7s\n", name, s->size_mb, s->bpw, pf, dc,
                       exp(s->nll / (double)scored), "-", "-", "-", tk);
        }
    }
    ret = 0;
    if (check_kl >= 0 && !(kl_mean <= check_kl)) {
        fprintf(stderr, "llmserve: eval: KL mean %.6g is above --check-kl %g\n", kl_mean, check_kl);
        ret = 1;
    }
    if (check_top1 >= 0 && !(top1 >= check_top1)) {
        fprintf(stderr, "llmserve: eval: top-1 agreement %.4f is below --check-top1 %g\n", top1, check_top1);
        ret = 1;
    }
out:
    if (rc) fprintf(stderr, "llmserve: eval: %s\n", cm_strerror(rc));
    for (int i = 0; i < 2; i++) {
        wk_kv_free(sides[i]->kv);
        wk_model_free(sides[i]->m);
    }
    free(text);
    free(toks);
    free(la);
    free(lb);
    free(kls);
    return ret;
}
