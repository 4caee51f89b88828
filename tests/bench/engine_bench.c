/* llmserve-engine-bench: offline throughput of the batching engine and the
 * time to first token with and without a cached prefix.
 *
 *   llmserve-engine-bench [--model PATH] [--concurrency 1,4,16,32,64]
 *       [--prompt-len 128] [--gen 128] [--repeats 3] [--system-len 1000]
 *       [--threads N] [engine flags]
 *
 * Throughput: at each concurrency c, c requests (different real-text
 * prompts, ignore_eos, gen tokens each) are submitted at once and run to
 * the end; generated tokens / wall time, median of the repeats, and the
 * ratio to c = 1 measured in the same run. TTFT: a request whose
 * system-len-token prefix is already cached (an earlier request with the
 * same prefix finished) against one whose prefix is not (a different
 * prefix each time), medians.
 *
 * With --json-schema FILE: at each concurrency the same requests also run
 * under that schema (structured outputs, temperature --temperature, 1 by
 * default for both modes), interleaved with plain runs, and the table adds
 * the median time of a pure decode step of all c sequences in each mode
 * (steps that computed exactly c tokens; the first gen/3 of each run, so
 * that both modes are compared at the same positions although an output
 * under a schema may end early): the mask's cost per step. */
#include "cm_error.h"
#include "cm_jsonschema.h"
#include "cm_log.h"
#include "wk_engine.h"
#include "wk_flags.h"

#include "bn_util.h"
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static const char *para =
    "Rivers shape the land they cross. Over thousands of years a river cuts valleys, carries silt to the sea and "
    "builds deltas where cities later grow. Engineers have dammed rivers for power and irrigation, and ecologists "
    "now study how those dams change fish migration, sediment and the health of wetlands downstream. ";

static int32_t *corpus;
static size_t n_corpus;

static void make_prompt(uint64_t seed, int len, int32_t *out) {
    size_t off = (size_t)(seed * 2654435761u) % n_corpus;
    for (int i = 0; i < len; i++) out[i] = corpus[(off + (size_t)i * (1 + seed % 3)) % n_corpus];
}

static double *dsteps, *dsample; /* pure decode steps of `dwant` sequences: their ms, and the ms outside the forward pass */
static int n_dsteps, cap_dsteps, dwant, dkeep; /* the first dkeep such steps of a run (the same positions in both modes) */

/* Runs until every request finished; returns the first-token time of request `watch` (relative to t0). */
static double drain(wk_engine *e, uint64_t watch, double t0) {
    double first = -1;
    while (wk_engine_has_work(e)) {
        double a = bn_now();
        int rc = wk_engine_step(e);
        if (rc < 0) {
            fprintf(stderr, "engine step failed\n");
            exit(1);
        }
        if (dwant && rc == dwant && n_dsteps < dkeep) {
            if (n_dsteps == cap_dsteps) {
                cap_dsteps = cap_dsteps ? cap_dsteps * 2 : 1024;
                dsteps = realloc(dsteps, sizeof *dsteps * (size_t)cap_dsteps);
                dsample = realloc(dsample, sizeof *dsample * (size_t)cap_dsteps);
                if (!dsteps || !dsample) exit(1);
            }
            wk_engine_stats st;
            wk_engine_get_stats(e, &st);
            double ms = (bn_now() - a) * 1e3;
            dsteps[n_dsteps] = ms;
            dsample[n_dsteps] = ms - st.last_forward_ms;
            n_dsteps++;
        }
        const wk_output *o;
        int n = wk_engine_outputs(e, &o);
        for (int i = 0; i < n; i++)
            if (o[i].id == watch && first < 0 && o[i].n_tokens) first = bn_now() - t0;
    }
    return first;
}

int main(int argc, char **argv) {
    const char *model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf", *conc = "1,4,16,32,64";
    int prompt_len = 128, gen = 128, repeats = 3, sys_len = 1000, threads = 0;
    const char *schema_path = NULL;
    double temperature = -1;
    wk_engine_opts eo;
    wk_engine_opts_default(&eo);
    enum { O_MODEL = 1, O_CONC, O_PL, O_GEN, O_REP, O_SYS, O_THR, O_SCHEMA, O_TEMP };
    static const struct option lo[] = {{"model", required_argument, 0, O_MODEL},
                                       {"concurrency", required_argument, 0, O_CONC},
                                       {"prompt-len", required_argument, 0, O_PL},
                                       {"gen", required_argument, 0, O_GEN},
                                       {"repeats", required_argument, 0, O_REP},
                                       {"system-len", required_argument, 0, O_SYS},
                                       {"threads", required_argument, 0, O_THR},
                                       {"json-schema", required_argument, 0, O_SCHEMA},
                                       {"temperature", required_argument, 0, O_TEMP},
                                       {"help", no_argument, 0, 'h'},
                                       WK_ENGINE_LONGOPTS,
                                       WK_MODEL_LONGOPTS,
                                       {0, 0, 0, 0}};
    wk_load_flags lf = {0};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case O_MODEL: model_path = optarg; break;
        case O_CONC: conc = optarg; break;
        case O_PL: prompt_len = atoi(optarg); break;
        case O_GEN: gen = atoi(optarg); break;
        case O_REP: repeats = atoi(optarg); break;
        case O_SYS: sys_len = atoi(optarg); break;
        case O_THR: threads = atoi(optarg); break;
        case O_SCHEMA: schema_path = optarg; break;
        case O_TEMP: temperature = atof(optarg); break;
        case 'h':
            printf("usage: llmserve-engine-bench [--model PATH] [--concurrency LIST] [--prompt-len N] [--gen N]\n"
                   "       [--repeats N] [--system-len N] [--threads N] [--json-schema FILE [--temperature T]]\n%s%s",
                   WK_ENGINE_FLAGS_HELP,
                   WK_MODEL_FLAGS_HELP);
            return 0;
        default:
            if (c >= WK_MODEL_FLAG_BASE && !wk_model_flag(&lf, c, optarg)) break;
            if (c >= WK_FLAG_BASE && c < WK_MODEL_FLAG_BASE && !wk_engine_flag(&eo, c, optarg)) break;
            return 2;
        }
    }
    if (prompt_len < 1 || gen < 1 || repeats < 1 || sys_len < 1 || repeats > 99) {
        fprintf(stderr, "bad --prompt-len/--gen/--repeats/--system-len\n");
        return 2;
    }
    char err[512] = "";
    char *gbnf = NULL;
    if (schema_path) {
        json_error_t je;
        json_t *sc = json_load_file(schema_path, 0, &je);
        if (!sc) {
            fprintf(stderr, "%s: %s\n", schema_path, je.text);
            return 2;
        }
        int rc = cm_schema_gbnf(sc, &gbnf, err, sizeof err);
        json_decref(sc);
        if (rc) {
            fprintf(stderr, "%s: %s\n", schema_path, err);
            return 2;
        }
        if (temperature < 0) temperature = 1;
    }
    if (temperature < 0) temperature = 0;
    wk_model *m;
    wk_model_opts mo = {.model_path = model_path, .threads = threads, .max_batch = eo.max_num_batched_tokens};
    if (wk_model_flags_apply(&lf, &mo)) return 2;
    if (wk_model_load(&mo, &m, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    wk_model *dm = NULL;
    if (eo.spec.method == WK_SPEC_DRAFT) {
        if (wk_draft_model_load(&mo, m, &eo.spec, &dm, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        eo.draft = dm;
    }
    size_t n1;
    int32_t *one;
    if (cm_tok_encode(m->tok, para, strlen(para), 0, 0, &one, &n1)) return 1;
    n_corpus = n1 * 64;
    corpus = malloc(sizeof(int32_t) * n_corpus);
    for (size_t i = 0; i < n_corpus; i++) corpus[i] = one[(i * 31 + i / n1) % n1];
    free(one);
    int maxp = prompt_len > sys_len + 32 ? prompt_len : sys_len + 32;
    int32_t *p = malloc(sizeof(int32_t) * (size_t)maxp);
    printf("model %s, %d threads, isa %s (%s), prompt %d tokens, %d generated per request, budget %d tokens/step\n",
           m->file->path, kn_pool_size(m->pool), kn_isa_name(), kn_isa_reason(), prompt_len, gen, eo.max_num_batched_tokens);
    if (gbnf) printf("structured outputs: %s, temperature %g; decode step: median ms of a step decoding all c sequences\n",
                     schema_path, temperature);
    printf("%-12s %10s %12s %10s %14s", "concurrency", "tok/s", "vs c=1", "wall s", "step ms (med)");
    if (gbnf) printf(" %12s %12s %10s %9s %9s", "decode plain", "decode schema", "schema/plain", "samp pl", "samp sch");
    printf("\n");
    double base = 0;
    uint64_t seed = 1;
    for (const char *s = conc; *s;) {
        int cc = atoi(s);
        if (cc < 1) break;
        double tps[100], wall[100], stepms[100], dec[2] = {0, 0};
        double *dmode[2] = {NULL, NULL}, *smode[2] = {NULL, NULL}, samp[2] = {0, 0};
        uint64_t sp_props = 0, sp_drafts = 0, sp_acc = 0; /* speculation, over the repeats */
        int ndmode[2] = {0, 0};
        for (int r = 0; r < repeats * (gbnf ? 2 : 1); r++) {
            /* plain and schema runs alternate, in turn first (P S S P P S ...): the machine's noise and any
               order effect fall on both alike */
            int under = gbnf && ((r & 1) ^ ((r >> 1) & 1));
            int slot = gbnf ? r / 2 : r;
            if (gbnf && (r & 1)) seed -= (uint64_t)cc; /* the second of a pair: the first's prompts and seeds */
            dwant = cc;
            dkeep = gen / 3; /* an output under a schema may end early: the steps compared are at the same positions */
            n_dsteps = 0;
            wk_engine_opts o = eo;
            if (o.max_num_seqs < cc) o.max_num_seqs = cc;
            wk_engine *e;
            if (wk_engine_create(m, &o, &e, err, sizeof err)) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
            for (int i = 0; i < cc; i++) {
                wk_params wp;
                wk_params_default(&wp);
                wp.s.temperature = (float)temperature;
                wp.has_seed = 1;
                wp.seed = seed;
                wp.max_tokens = gen;
                wp.ignore_eos = 1;
                wp.lora = m->n_loras ? i % m->n_loras + 1 : 0; /* --lora-modules: the requests take turns */
                if (under) {
                    wp.grammar = gbnf;
                    wp.grammar_len = strlen(gbnf);
                }
                make_prompt(seed++, prompt_len, p);
                if (wk_engine_add(e, (uint64_t)i, p, prompt_len, &wp, err, sizeof err)) {
                    fprintf(stderr, "%s\n", err);
                    return 1;
                }
            }
            double t0 = bn_now();
            drain(e, (uint64_t)-1, t0);
            double w = bn_now() - t0;
            wk_engine_stats st;
            wk_engine_get_stats(e, &st);
            sp_props += st.spec_drafts;
            sp_drafts += st.spec_draft_tokens;
            sp_acc += st.spec_accepted_tokens;
            if (!under) {
                wall[slot] = w;
                tps[slot] = (double)st.tokens_generated / w;
                stepms[slot] = 1e3 * w / (double)st.steps;
            }
            int mi = under ? 1 : 0;
            dmode[mi] = realloc(dmode[mi], sizeof(double) * (size_t)(ndmode[mi] + n_dsteps + 1));
            smode[mi] = realloc(smode[mi], sizeof(double) * (size_t)(ndmode[mi] + n_dsteps + 1));
            if (!dmode[mi] || !smode[mi]) return 1;
            memcpy(dmode[mi] + ndmode[mi], dsteps, sizeof(double) * (size_t)n_dsteps);
            memcpy(smode[mi] + ndmode[mi], dsample, sizeof(double) * (size_t)n_dsteps);
            ndmode[mi] += n_dsteps;
            wk_engine_free(e);
        }
        dwant = 0;
        for (int k = 0; k < 2; k++)
            if (ndmode[k]) dec[k] = bn_median(dmode[k], ndmode[k]), samp[k] = bn_median(smode[k], ndmode[k]);
        double t = bn_median(tps, repeats);
        if (!base) base = t;
        printf("%-12d %10.1f %11.2fx %10.2f %14.1f", cc, t, t / base, bn_median(wall, repeats), bn_median(stepms, repeats));
        if (gbnf) printf(" %12.2f %12.2f %+9.1f%% %9.2f %9.2f  (%d / %d steps)", dec[0], dec[1],
                         dec[0] > 0 ? (dec[1] / dec[0] - 1) * 100 : 0, samp[0], samp[1], ndmode[0], ndmode[1]);
        if (sp_props)
            printf("  speculation: %llu proposals, %llu of %llu drafts taken (%.0f%%), mean acceptance length %.2f",
                   (unsigned long long)sp_props, (unsigned long long)sp_acc, (unsigned long long)sp_drafts,
                   100.0 * (double)sp_acc / (double)sp_drafts, 1.0 + (double)sp_acc / (double)sp_props);
        printf("\n");
        for (int k = 0; k < 2; k++) free(dmode[k]), free(smode[k]);
        fflush(stdout);
        s = strchr(s, ',');
        if (!s) break;
        s++;
    }
    /* TTFT with a cached vs an uncached system prompt of sys_len tokens */
    double cached[100], uncached[100];
    wk_engine_opts o = eo;
    wk_engine *e;
    if (wk_engine_create(m, &o, &e, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    wk_params wp;
    wk_params_default(&wp);
    wp.s.temperature = 0;
    wp.max_tokens = 1;
    for (int r = 0; r < repeats + 1; r++) {
        /* uncached: a system prompt never seen before */
        make_prompt(1000 + (uint64_t)r, sys_len, p);
        make_prompt(5000 + (uint64_t)r, 32, p + sys_len);
        double t0 = bn_now();
        wk_engine_add(e, 1, p, sys_len + 32, &wp, err, sizeof err);
        double u = drain(e, 1, t0);
        /* cached: the same system prompt, another user turn */
        make_prompt(9000 + (uint64_t)r, 32, p + sys_len);
        t0 = bn_now();
        wk_engine_add(e, 2, p, sys_len + 32, &wp, err, sizeof err);
        double cc = drain(e, 2, t0);
        if (r) { /* the first round warms up */
            uncached[r - 1] = u;
            cached[r - 1] = cc;
        }
    }
    double mu = bn_median(uncached, repeats), mc = bn_median(cached, repeats);
    printf("TTFT, %d-token system prompt + 32: uncached %.1f ms, cached %.1f ms (%.1fx faster, cached/uncached %.2f)\n",
           sys_len, mu * 1e3, mc * 1e3, mu / mc, mc / mu);
    wk_engine_free(e);
    free(p);
    free(corpus);
    free(gbnf);
    free(dsteps);
    free(dsample);
    wk_model_free(dm);
    wk_model_free(m);
    return 0;
}
