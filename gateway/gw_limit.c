#include "gw_limit.h"
#include "cm_error.h"

#include <stdlib.h>
#include <string.h>

void gw_bucket_init(gw_bucket *b, double rate, double burst) {
    memset(b, 0, sizeof *b);
    b->rate = rate;
    b->burst = burst;
}

static void refill(gw_bucket *b, double now) {
    if (!b->started) {
        b->tokens = b->burst;
        b->last = now;
        b->started = 1;
    }
    if (now > b->last) b->tokens += (now - b->last) * b->rate;
    if (b->tokens > b->burst) b->tokens = b->burst;
    b->last = now;
}

double gw_bucket_wait(gw_bucket *b, double now, double amount) {
    refill(b, now);
    if (b->tokens >= amount) return 0;
    return b->rate > 0 ? (amount - b->tokens) / b->rate : 1e9;
}

void gw_bucket_take(gw_bucket *b, double now, double amount) {
    refill(b, now);
    b->tokens -= amount;
}

int gw_limits_init(gw_limits *l, double rps, double tpm, int n_keys) {
    memset(l, 0, sizeof *l);
    l->rps = rps;
    l->tpm = tpm;
    l->n_keys = n_keys;
    double rburst = rps > 1 ? rps : 1;
    gw_bucket_init(&l->rps_all, rps, rburst);
    gw_bucket_init(&l->tpm_all, tpm / 60.0, tpm);
    if (n_keys > 0) {
        l->rps_key = calloc((size_t)n_keys, sizeof *l->rps_key);
        l->tpm_key = calloc((size_t)n_keys, sizeof *l->tpm_key);
        if (!l->rps_key || !l->tpm_key) return LLM_ENOMEM;
        for (int i = 0; i < n_keys; i++) {
            gw_bucket_init(&l->rps_key[i], rps, rburst);
            gw_bucket_init(&l->tpm_key[i], tpm / 60.0, tpm);
        }
    }
    return 0;
}

void gw_limits_free(gw_limits *l) {
    free(l->rps_key);
    free(l->tpm_key);
    l->rps_key = l->tpm_key = NULL;
}

int gw_limits_fits(const gw_limits *l, double tokens) {
    return l->tpm <= 0 || tokens <= l->tpm;
}

double gw_limits_admit(gw_limits *l, double now, int key, double tokens) {
    gw_bucket *b[4];
    double amt[4];
    int n = 0;
    if (l->rps > 0) {
        b[n] = &l->rps_all, amt[n++] = 1;
        if (key >= 0 && key < l->n_keys) b[n] = &l->rps_key[key], amt[n++] = 1;
    }
    if (l->tpm > 0) {
        b[n] = &l->tpm_all, amt[n++] = tokens;
        if (key >= 0 && key < l->n_keys) b[n] = &l->tpm_key[key], amt[n++] = tokens;
    }
    double wait = 0;
    for (int i = 0; i < n; i++) {
        double w = gw_bucket_wait(b[i], now, amt[i]);
        if (w > wait) wait = w;
    }
    if (wait > 0) return wait;
    for (int i = 0; i < n; i++) gw_bucket_take(b[i], now, amt[i]);
    return 0;
}
