/* llmserve generate: prompt or chat in, streamed text out, speed on stderr. */
#include "cm_chat.h"
#include "cm_error.h"
#include "cm_log.h"
#include "cm_parse.h"
#include "cm_time.h"
#include "tl_common.h"
#include "wk_flags.h"
#include "wk_model.h"
#include "wk_sampler.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct {
    const char *model, *tokenizer, *prompt, *system, *tmpl_name, *batch;
    long n, threads, ctx, top_k, seed;
    double temperature, top_p;
    int chat, interactive, ignore_eos, print_ids, kv_type;
} gen_opts;

static void help(FILE *f) {
    fprintf(f,
            "usage: llmserve generate [flags]\n"
            "  --model PATH          GGUF file or llama2.c .bin (default $LLMSERVE_MODEL or " DEFAULT_MODEL ")\n"
            "  --tokenizer PATH      tokenizer.bin for a llama2.c model\n"
            "  --prompt TEXT         the prompt (default: read stdin)\n"
            "  --chat                wrap the prompt in the model's chat template as a user turn\n"
            "  --system TEXT         system prompt for --chat / --interactive\n"
            "  --chat-template NAME  chatml|llama2|llama3|mistral|gemma|harmony (default: from the model)\n"
            "  -i, --interactive     chat in a loop, one user line per turn\n"
            "  -n, --max-tokens N    tokens to generate (default 128)\n"
            "  --temperature T       0 = greedy (default 0.8)\n"
            "  --top-p P             nucleus sampling (default 0.95)\n"
            "  --top-k K             0 = off (default 40)\n"
            "  --seed S              RNG seed (default: from the clock)\n"
            "  --threads N           threads (default: all CPUs)\n"
            "  --ctx N               context length (default: prompt + n, at most the model's)\n"
            "  --ignore-eos          keep generating past end-of-sequence\n"
            "  --print-ids           print generated token ids on stderr\n"
            "  --batch FILE.jsonl    run a file of OpenAI completions request bodies (one per line; - for\n"
            "                        stdin) through the batching engine; prints one completion response\n"
            "                        per line, in input order\n"
            "  --log-level L         error|warn|info|debug (default warn)\n"
            WK_ENGINE_FLAGS_HELP WK_MODEL_FLAGS_HELP);
}

typedef struct {
    wk_model *m;
    wk_kv *kv;
    int32_t *cached;   /* tokens whose K/V are in kv, so a chat turn reuses its prefix */
    int ncached;
    float *logits;
    wk_sampler s;
} session;

/* Feeds tokens (reusing the cached common prefix), generates up to n tokens
 * streaming text, appends generated ids to the cache. */
static int run_turn(session *ss, const gen_opts *o, const int32_t *toks, int nt, int *n_prefill,
                    double *t_prefill, int *n_decode, double *t_decode) {
    wk_model *m = ss->m;
    int common = 0;
    while (common < nt && common < ss->ncached && common < ss->kv->n && toks[common] == ss->cached[common]) common++;
    if (common == nt) common--; /* need at least one token to produce logits */
    if (nt + 1 > ss->kv->ctx) {
        fprintf(stderr, "llmserve: prompt of %d tokens does not fit the context of %d tokens\n", nt, ss->kv->ctx);
        return LLM_ERANGE;
    }
    ss->kv->n = common;
    ss->ncached = common;
    double t0 = cm_now();
    int rc = wk_forward(m, ss->kv, toks + common, nt - common, ss->logits, 0);
    if (rc) return rc;
    memcpy(ss->cached + common, toks + common, sizeof(int32_t) * (size_t)(nt - common));
    ss->ncached = nt;
    *t_prefill += cm_now() - t0;
    *n_prefill += nt - common;
    cm_detok dt;
    cm_detok_init(&dt, m->tok);
    char buf[256];
    t0 = cm_now();
    for (long i = 0; i < o->n; i++) {
        int32_t id = wk_sample(&ss->s, ss->logits);
        if (o->print_ids) fprintf(stderr, "%d ", id);
        if (!o->ignore_eos && cm_tok_is_eog(m->tok, id)) break;
        size_t w = cm_detok_push(&dt, m->tok, id, buf, sizeof buf);
        fwrite(buf, 1, w, stdout);
        fflush(stdout);
        if (ss->kv->n >= ss->kv->ctx) {
            fprintf(stderr, "\nllmserve: context of %d tokens is full\n", ss->kv->ctx);
            break;
        }
        ss->cached[ss->ncached++] = id;
        if ((rc = wk_forward(m, ss->kv, &id, 1, ss->logits, 0))) return rc;
        (*n_decode)++;
    }
    *t_decode += cm_now() - t0;
    size_t w = cm_detok_flush(&dt, buf, sizeof buf);
    fwrite(buf, 1, w, stdout);
    if (o->print_ids) fprintf(stderr, "\n");
    return 0;
}

static char *read_all(FILE *f) {
    size_t cap = 4096, n = 0;
    char *s = malloc(cap);
    for (size_t r; s && (r = fread(s + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (cap - n - 1 == 0) {
            char *ns = realloc(s, cap *= 2);
            if (!ns) { free(s); return NULL; }
            s = ns;
        }
    }
    if (s) s[n] = 0;
    return s;
}

int tl_generate_main(int argc, char **argv) {
    gen_opts o = {.kv_type = KN_KV_F16, .n = 128, .temperature = 0.8, .top_p = 0.95, .top_k = 40, .seed = -1};
    o.model = getenv("LLMSERVE_MODEL") ? getenv("LLMSERVE_MODEL") : DEFAULT_MODEL;
    enum { O_TOK = 256, O_PROMPT, O_CHAT, O_SYS, O_TMPL, O_TEMP, O_TOPP, O_TOPK, O_SEED, O_THREADS, O_CTX,
           O_IGN, O_IDS, O_LOG, O_MODEL, O_BATCH };
    static const struct option lo[] = {
        {"model", required_argument, 0, O_MODEL}, {"tokenizer", required_argument, 0, O_TOK},
        {"prompt", required_argument, 0, O_PROMPT}, {"chat", no_argument, 0, O_CHAT},
        {"system", required_argument, 0, O_SYS}, {"chat-template", required_argument, 0, O_TMPL},
        {"interactive", no_argument, 0, 'i'}, {"max-tokens", required_argument, 0, 'n'},
        {"temperature", required_argument, 0, O_TEMP}, {"top-p", required_argument, 0, O_TOPP},
        {"top-k", required_argument, 0, O_TOPK}, {"seed", required_argument, 0, O_SEED},
        {"threads", required_argument, 0, O_THREADS}, {"ctx", required_argument, 0, O_CTX},
        {"ignore-eos", no_argument, 0, O_IGN}, {"print-ids", no_argument, 0, O_IDS},
        {"batch", required_argument, 0, O_BATCH}, {"log-level", required_argument, 0, O_LOG},
        {"help", no_argument, 0, 'h'}, WK_ENGINE_LONGOPTS, WK_MODEL_LONGOPTS, {0, 0, 0, 0}};
    wk_load_flags lf = {0};
    wk_engine_opts eo;
    wk_engine_opts_default(&eo);
    int c, lvl;
    optind = 1;
    while ((c = getopt_long(argc, argv, "in:h", lo, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case O_MODEL: o.model = optarg; break;
        case O_TOK: o.tokenizer = optarg; break;
        case O_PROMPT: o.prompt = optarg; break;
        case O_CHAT: o.chat = 1; break;
        case O_SYS: o.system = optarg; break;
        case O_TMPL: o.tmpl_name = optarg; break;
        case 'i': o.interactive = o.chat = 1; break;
        case 'n': bad = cm_parse_long("--max-tokens", optarg, 0, 1 << 24, &o.n); break;
        case O_TEMP: bad = cm_parse_double("--temperature", optarg, 0, 100, &o.temperature); break;
        case O_TOPP: bad = cm_parse_double("--top-p", optarg, 0, 1, &o.top_p); break;
        case O_TOPK: bad = cm_parse_long("--top-k", optarg, 0, 1 << 24, &o.top_k); break;
        case O_SEED: bad = cm_parse_long("--seed", optarg, 0, 0x7fffffffffffffffL, &o.seed); break;
        case O_THREADS: bad = cm_parse_long("--threads", optarg, 1, 1024, &o.threads); break;
        case O_CTX: bad = cm_parse_long("--ctx", optarg, 2, 1 << 24, &o.ctx); break;
        case O_IGN: o.ignore_eos = 1; break;
        case O_BATCH: o.batch = optarg; break;
        case O_IDS: o.print_ids = 1; break;
        case O_LOG:
            if (cm_log_parse_level(optarg, &lvl)) {
                fprintf(stderr, "llmserve: --log-level expects error|warn|info|debug\n");
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
                o.kv_type = eo.kv_type;
                break;
            }
            help(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "llmserve: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!o.batch && eo.spec.method != WK_SPEC_NONE) { /* the single-prompt loop is not the batching engine */
        fprintf(stderr, "llmserve: speculative decoding runs in the batching engine: use it with --batch, "
                        "llmserve serve or llmserve-worker\n");
        return 2;
    }
    int tmpl_kind = -1;
    if (o.tmpl_name && (tmpl_kind = cm_chat_by_name(o.tmpl_name)) < 0) {
        fprintf(stderr, "llmserve: unknown chat template '%s'\n", o.tmpl_name);
        return 2;
    }
    char err[512] = "";
    wk_model *m = NULL;
    wk_model_opts mo = {.model_path = o.model, .tokenizer_path = o.tokenizer, .threads = (int)o.threads, .max_batch = o.batch ? eo.max_num_batched_tokens : 0};
    if (wk_model_flags_apply(&lf, &mo)) return 2;
    int rc = wk_model_load(&mo, &m, err, sizeof err);
    if (rc) {
        fprintf(stderr, "llmserve: %s\n", err[0] ? err : cm_strerror(rc));
        return 1;
    }
    if (o.batch) {
        const char *base = strrchr(o.model, '/') ? strrchr(o.model, '/') + 1 : o.model;
        char name[256];
        snprintf(name, sizeof name, "%s", base);
        char *dot = strrchr(name, '.');
        if (dot && (!strcmp(dot, ".gguf") || !strcmp(dot, ".bin"))) *dot = 0;
        int r = tl_batch_run(m, &eo, o.batch, name);
        wk_model_free(m);
        return r;
    }
    CM_INFO("model %s: %s, %u layers, dim %u, %u/%u heads, vocab %u, ctx %u, isa %s (%s), %d threads", o.model,
            m->cfg.arch, m->cfg.n_layer, m->cfg.dim, m->cfg.n_head, m->cfg.n_kv_head, m->cfg.vocab,
            m->cfg.ctx_len, kn_isa_name(), kn_isa_reason(), kn_pool_size(m->pool));
    if (tmpl_kind < 0) tmpl_kind = cm_chat_for(m->tok);
    char *def_sys = cm_chat_default_system(cm_tok_chat_template(m->tok));
    const char *sys = o.system ? o.system : def_sys;

    session ss = {.m = m};
    char *input = NULL, *text = NULL;
    int32_t *toks = NULL;
    size_t nt = 0;
    int n_prefill = 0, n_decode = 0, ret = 1;
    double t_prefill = 0, t_decode = 0;
    uint64_t seed = o.seed >= 0 ? (uint64_t)o.seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if (wk_sampler_init(&ss.s, (int)m->cfg.vocab, (float)o.temperature, (float)o.top_p, (int)o.top_k, seed)) goto out;
    ss.logits = malloc(sizeof(float) * m->cfg.vocab);
    if (!ss.logits) goto out;

    if (!o.interactive) {
        if (!o.prompt) {
            input = read_all(stdin);
            if (!input) goto out;
        }
        const char *p = o.prompt ? o.prompt : input;
        if (o.chat) {
            cm_chat_msg msgs[2] = {{"system", sys ? sys : ""}, {"user", p}};
            if (cm_chat_render(tmpl_kind, NULL, sys ? msgs : msgs + 1, sys ? 2 : 1, 1, &text)) goto out;
            p = text;
        }
        if ((rc = cm_tok_encode(m->tok, p, strlen(p), -1, o.chat, &toks, &nt))) {
            fprintf(stderr, "llmserve: cannot tokenize the prompt: %s\n", cm_strerror(rc));
            goto out;
        }
        if (nt == 0) {
            fprintf(stderr, "llmserve: the prompt is empty and the model adds no BOS token\n");
            goto out;
        }
        long ctx = o.ctx ? o.ctx : (long)nt + o.n + 1;
        if (ctx > (long)m->cfg.ctx_len) ctx = m->cfg.ctx_len;
        if ((long)nt >= ctx) {
            fprintf(stderr, "llmserve: prompt of %zu tokens is longer than the context (%ld tokens)\n", nt, ctx);
            goto out;
        }
        if ((rc = wk_kv_create(m, (int)ctx, o.kv_type, &ss.kv)) || !(ss.cached = malloc(sizeof(int32_t) * (size_t)ctx))) {
            fprintf(stderr, "llmserve: cannot allocate a KV cache of %ld tokens\n", ctx);
            goto out;
        }
        if (!o.chat) fputs(p, stdout);
        if ((rc = run_turn(&ss, &o, toks, (int)nt, &n_prefill, &t_prefill, &n_decode, &t_decode))) {
            fprintf(stderr, "llmserve: generation failed: %s\n", cm_strerror(rc));
            goto out;
        }
        fputs("\n", stdout);
    } else {
        long ctx = o.ctx ? o.ctx : (m->cfg.ctx_len < 4096 ? (long)m->cfg.ctx_len : 4096);
        if (wk_kv_create(m, (int)ctx, o.kv_type, &ss.kv) || !(ss.cached = malloc(sizeof(int32_t) * (size_t)ctx))) goto out;
        size_t nmsg = 0, capmsg = 16;
        cm_chat_msg *msgs = calloc(capmsg, sizeof *msgs);
        if (!msgs) goto out;
        if (sys) msgs[nmsg++] = (cm_chat_msg){"system", strdup(sys)};
        char line[8192];
        fprintf(stderr, "llmserve: chatting with %s (%s template); an empty line or Ctrl-D ends.\n", o.model,
                cm_chat_name(tmpl_kind));
        for (;;) {
            fprintf(stderr, "> ");
            if (!fgets(line, sizeof line, stdin)) break;
            line[strcspn(line, "\n")] = 0;
            if (!line[0]) break;
            if (nmsg + 2 > capmsg) {
                cm_chat_msg *nm = realloc(msgs, sizeof *msgs * (capmsg *= 2));
                if (!nm) break;
                msgs = nm;
            }
            msgs[nmsg++] = (cm_chat_msg){"user", strdup(line)};
            free(text);
            free(toks);
            text = NULL;
            toks = NULL;
            if (cm_chat_render(tmpl_kind, NULL, msgs, nmsg, 1, &text) ||
                cm_tok_encode(m->tok, text, strlen(text), -1, 1, &toks, &nt))
                break;
            if (run_turn(&ss, &o, toks, (int)nt, &n_prefill, &t_prefill, &n_decode, &t_decode)) break;
            fputs("\n", stdout);
            /* the reply as the template will render it next turn */
            char *reply = cm_tok_decode(m->tok, ss.cached + nt, (size_t)(ss.ncached - (int)nt), 0);
            msgs[nmsg++] = (cm_chat_msg){"assistant", reply ? reply : strdup("")};
        }
        for (size_t i = 0; i < nmsg; i++) free((void *)msgs[i].content);
        free(msgs);
    }
    fprintf(stderr, "llmserve: prefill %d tokens at %.1f tok/s, decode %d tokens at %.1f tok/s (%d threads, %s)\n",
            n_prefill, t_prefill > 0 ? n_prefill / t_prefill : 0.0, n_decode, t_decode > 0 ? n_decode / t_decode : 0.0,
            kn_pool_size(m->pool), kn_isa_name());
    ret = 0;
out:
    free(def_sys);
    free(input);
    free(text);
    free(toks);
    free(ss.cached);
    free(ss.logits);
    wk_sampler_free(&ss.s);
    wk_kv_free(ss.kv);
    wk_model_free(m);
    return ret;
}
