#include "cm_chat.h"
#include "cm_error.h"
#include "cm_tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *names[CM_CHAT_COUNT] = {"chatml", "llama2", "llama3", "mistral", "gemma", "harmony"};

int cm_chat_detect(const char *t) {
    if (!t) return CM_CHAT_CHATML;
    if (strstr(t, "<|channel|>")) return CM_CHAT_HARMONY;
    if (strstr(t, "<|im_start|>")) return CM_CHAT_CHATML;
    if (strstr(t, "<|start_header_id|>")) return CM_CHAT_LLAMA3;
    if (strstr(t, "<start_of_turn>")) return CM_CHAT_GEMMA;
    if (strstr(t, "<<SYS>>")) return CM_CHAT_LLAMA2;
    if (strstr(t, "[INST]")) return CM_CHAT_MISTRAL;
    return CM_CHAT_CHATML;
}

int cm_chat_for(const cm_tokenizer *t) {
    const char *tmpl = cm_tok_chat_template(t);
    if (tmpl) return cm_chat_detect(tmpl);
    static const struct { const char *marker; int kind; } by_vocab[] = {
        {"<|channel|>", CM_CHAT_HARMONY}, {"<|im_start|>", CM_CHAT_CHATML}, {"<|start_header_id|>", CM_CHAT_LLAMA3},
        {"<start_of_turn>", CM_CHAT_GEMMA}};
    for (size_t i = 0; i < sizeof by_vocab / sizeof *by_vocab; i++) {
        int32_t id = cm_tok_lookup(t, by_vocab[i].marker);
        /* harmony's markers are user-defined tokens (shown in the output: cm_tok_build) */
        if (id >= 0 && (cm_tok_type(t, id) == CM_TT_CONTROL || (i == 0 && cm_tok_type(t, id) == CM_TT_USER)))
            return by_vocab[i].kind;
    }
    return CM_CHAT_CHATML;
}

int cm_chat_by_name(const char *name) {
    for (int i = 0; i < CM_CHAT_COUNT; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

const char *cm_chat_name(int kind) {
    return kind >= 0 && kind < CM_CHAT_COUNT ? names[kind] : "unknown";
}

char *cm_chat_default_system(const char *t) {
    static const char open[] = "<|im_start|>system\n";
    if (!t) return NULL;
    const char *p = strstr(t, open);
    if (!p) return NULL;
    p += sizeof open - 1;
    const char *e = strstr(p, "<|im_end|>");
    /* only a literal prompt: a template that interpolates the message has Jinja here */
    if (!e || memchr(p, '{', (size_t)(e - p)) || memchr(p, '\'', (size_t)(e - p))) return NULL;
    char *s = malloc((size_t)(e - p) + 1);
    if (!s) return NULL;
    memcpy(s, p, (size_t)(e - p));
    s[e - p] = 0;
    return s;
}

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (need < 0 || b->oom) { b->oom = 1; return; }
    if (b->n + (size_t)need + 1 > b->cap) {
        size_t nc = (b->n + (size_t)need + 1) * 2;
        char *ns = realloc(b->s, nc);
        if (!ns) { b->oom = 1; return; }
        b->s = ns;
        b->cap = nc;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    b->n += (size_t)need;
}

int cm_chat_render(int kind, const char *def_sys, const cm_chat_msg *m, size_t n, int gen, char **out) {
    sbuf b = {0};
    *out = NULL;
    for (size_t i = 0; i < n; i++) /* and tool turns where the family has them: Llama 3's ipython, Mistral's raw text */
        if (!m[i].role || !m[i].content ||
            (strcmp(m[i].role, "system") && strcmp(m[i].role, "user") && strcmp(m[i].role, "assistant") &&
             !(kind == CM_CHAT_LLAMA3 && !strcmp(m[i].role, "ipython")) && !(kind == CM_CHAT_MISTRAL && !strcmp(m[i].role, "raw"))))
            return LLM_EINVAL;
    int has_sys = n > 0 && strcmp(m[0].role, "system") == 0;
    const char *sys = has_sys ? m[0].content : def_sys;
    size_t first = has_sys ? 1 : 0;
    add(&b, "%s", "");
    switch (kind) {
    case CM_CHAT_CHATML:
        if (sys) add(&b, "<|im_start|>system\n%s<|im_end|>\n", sys);
        for (size_t i = first; i < n; i++) add(&b, "<|im_start|>%s\n%s<|im_end|>\n", m[i].role, m[i].content);
        if (gen) add(&b, "<|im_start|>assistant\n");
        break;
    case CM_CHAT_LLAMA3:
        add(&b, "<|begin_of_text|>");
        if (sys) add(&b, "<|start_header_id|>system<|end_header_id|>\n\n%s<|eot_id|>", sys);
        for (size_t i = first; i < n; i++)
            add(&b, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", m[i].role, m[i].content);
        if (gen) add(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case CM_CHAT_GEMMA: { /* no system role: it prefixes the first user turn, or is one */
        int attach = sys && first < n && !strcmp(m[first].role, "user");
        if (sys && !attach) add(&b, "<start_of_turn>user\n%s<end_of_turn>\n", sys);
        for (size_t i = first; i < n; i++) {
            int user = strcmp(m[i].role, "assistant") != 0; /* a later system message is a user turn */
            int with = attach && i == first;
            add(&b, "<start_of_turn>%s\n%s%s%s<end_of_turn>\n", user ? "user" : "model", with ? sys : "",
                with ? "\n\n" : "", m[i].content);
        }
        if (gen) add(&b, "<start_of_turn>model\n");
        break;
    }
    case CM_CHAT_LLAMA2:
    case CM_CHAT_MISTRAL: { /* the same: a system prompt goes with the first user turn */
        int attach = sys && first < n && !strcmp(m[first].role, "user"), started = 0;
        if (sys && !attach) {
            if (kind == CM_CHAT_LLAMA2) add(&b, "<s>[INST] <<SYS>>\n%s\n<</SYS>>\n\n [/INST]", sys);
            else add(&b, "<s>[INST] %s [/INST]", sys);
            started = 1;
        }
        for (size_t i = first; i < n; i++) {
            if (!strcmp(m[i].role, "raw")) { /* Mistral's tool blocks, written out by cm_tools */
                add(&b, "%s%s", started ? "" : "<s>", m[i].content);
            } else if (strcmp(m[i].role, "assistant") != 0) {
                if (kind == CM_CHAT_LLAMA2 && attach && i == first)
                    add(&b, "<s>[INST] <<SYS>>\n%s\n<</SYS>>\n\n%s [/INST]", sys, m[i].content);
                else if (kind == CM_CHAT_MISTRAL && attach && i == first)
                    add(&b, "<s>[INST] %s\n\n%s [/INST]", sys, m[i].content);
                else
                    add(&b, "%s[INST] %s [/INST]", started ? "" : "<s>", m[i].content);
            } else {
                add(&b, "%s %s</s>", started ? "" : "<s>", m[i].content);
            }
            started = 1;
        }
        break;
    }
    case CM_CHAT_HARMONY: { /* as gpt-oss's own template writes it: the system header, the system prompt as
                              * the developer's instructions, earlier replies on the final channel */
        char date[16] = "";
        time_t now = time(NULL);
        struct tm tmv;
        if (gmtime_r(&now, &tmv)) strftime(date, sizeof date, "%Y-%m-%d", &tmv);
        add(&b, "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                "Knowledge cutoff: 2024-06\nCurrent date: %s\n\nReasoning: medium\n\n# Valid channels: analysis, "
                "commentary, final. Channel must be included for every message.<|end|>", date);
        if (sys) add(&b, "<|start|>developer<|message|># Instructions\n\n%s<|end|>", sys);
        for (size_t i = first; i < n; i++) {
            if (!strcmp(m[i].role, "assistant")) add(&b, "<|start|>assistant<|channel|>final<|message|>%s<|end|>", m[i].content);
            else if (!strcmp(m[i].role, "system")) add(&b, "<|start|>developer<|message|># Instructions\n\n%s<|end|>", m[i].content);
            else add(&b, "<|start|>user<|message|>%s<|end|>", m[i].content);
        }
        if (gen) add(&b, "<|start|>assistant");
        break;
    }
    default:
        free(b.s);
        return LLM_EINVAL;
    }
    if (b.oom) {
        free(b.s);
        return LLM_ENOMEM;
    }
    *out = b.s;
    return 0;
}

int cm_chat_render_open(int kind, const char *def_sys, const cm_chat_msg *m, size_t n, char **out) {
    *out = NULL;
    if (!n || !m[n - 1].role || strcmp(m[n - 1].role, "assistant") || !m[n - 1].content) return LLM_EINVAL;
    /* the family's own rendering with a mark in place of the last content, cut there: whatever the family
     * closes a turn with goes, and the content follows as it was */
    static const char mark[] = "\x01llmserve-open-turn\x01";
    cm_chat_msg *c = malloc(sizeof *c * n);
    if (!c) return LLM_ENOMEM;
    memcpy(c, m, sizeof *c * n);
    c[n - 1].content = mark;
    char *text = NULL;
    int rc = cm_chat_render(kind, def_sys, c, n, 0, &text);
    free(c);
    if (rc) return rc;
    char *at = NULL;
    for (char *p = strstr(text, mark); p; p = strstr(p + 1, mark)) at = p;
    size_t head = at ? (size_t)(at - text) : 0, cl = strlen(m[n - 1].content);
    char *o = at ? malloc(head + cl + 1) : NULL;
    if (o) {
        memcpy(o, text, head);
        memcpy(o + head, m[n - 1].content, cl + 1);
    }
    free(text);
    if (!o) return at ? LLM_ENOMEM : LLM_EINVAL;
    *out = o;
    return 0;
}

int cm_chat_no_thinking(int kind, char **text) {
    static const char empty[] = "<think>\n\n</think>\n\n";
    if (kind != CM_CHAT_CHATML) return LLM_EINVAL;
    size_t n = strlen(*text);
    char *t = realloc(*text, n + sizeof empty);
    if (!t) return LLM_ENOMEM;
    memcpy(t + n, empty, sizeof empty);
    *text = t;
    return 0;
}
