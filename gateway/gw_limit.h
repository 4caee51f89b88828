/* gw_limit.h - token-bucket rate limits, global and per API key, in
 * requests per second and tokens per minute. The clock is passed in, so
 * tests run the buckets on a fake one. */
#ifndef GW_LIMIT_H
#define GW_LIMIT_H

typedef struct {
    double tokens, rate, burst, last;
    int started;
} gw_bucket;

/* rate per second, burst the most it holds (it starts full). */
void gw_bucket_init(gw_bucket *b, double rate, double burst);
/* Seconds until amount fits (0: it fits now). Takes nothing. */
double gw_bucket_wait(gw_bucket *b, double now, double amount);
void gw_bucket_take(gw_bucket *b, double now, double amount);

typedef struct {
    double rps, tpm;
    gw_bucket rps_all, tpm_all;
    gw_bucket *rps_key, *tpm_key; /* one per configured API key */
    int n_keys;
} gw_limits;

int gw_limits_init(gw_limits *l, double rps, double tpm, int n_keys);
void gw_limits_free(gw_limits *l);
/* A request of `tokens` (prompt + max_tokens) by key (-1: none): 0 and the
 * buckets charged when every limit allows it, else the seconds to wait and
 * nothing charged. */
double gw_limits_admit(gw_limits *l, double now, int key, double tokens);
/* Whether a request of `tokens` could ever pass the per-minute limit. */
int gw_limits_fits(const gw_limits *l, double tokens);

#endif
