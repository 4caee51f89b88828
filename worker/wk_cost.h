/* wk_cost.h - what a step costs, learned online, so the scheduler can size
 * prefill chunks to a time target (--max-step-ms) on whatever device it
 * runs. A step is modelled as
 *     ms = fixed + a * tokens + b * attended
 * where attended is the sum, over the step's tokens, of the positions each
 * attends to (attention grows with the context: on a CPU a token at
 * position 1,800 costs several times one at 0). The three coefficients are
 * fitted by recursive least squares; steps of prompt tokens forget old
 * evidence (the machine's load changes), steps of a few decodes do not (they
 * say little about the per-token part). */
#ifndef WK_COST_H
#define WK_COST_H

typedef struct {
    double theta[3];   /* fixed, a, b (b per 1,000 attended positions) */
    double P[3][3];
    int n, excited;    /* observations; those with many tokens */
} wk_cost;

void wk_cost_init(wk_cost *c);
void wk_cost_observe(wk_cost *c, double tokens, double attended, double ms);
/* 1 once a step with prompt tokens has been seen. */
int wk_cost_known(const wk_cost *c);
/* Predicted ms (coefficients clamped at 0); 0 while unknown. */
double wk_cost_predict(const wk_cost *c, double tokens, double attended);
/* Positions attended by n tokens computed from position p: p + (p+1) + ... */
double wk_cost_attended(double p, double n);
/* The largest chunk n in [lo, hi] of prompt tokens from position p that,
 * added to a step of (tokens, attended), keeps the prediction within
 * target_ms; lo when none does, hi while the cost is unknown. */
int wk_cost_max_chunk(const wk_cost *c, double target_ms, double tokens, double attended, double p, int lo, int hi);

#endif
