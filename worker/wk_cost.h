/* wk_cost.h - what a step costs, learned online, so the scheduler can size
 * prefill chunks to a time target (--max-step-ms) on whatever device it
 * runs, and a prompt that cannot meet its deadline is refused up front. A
 * step is modelled as
 *     ms = fixed + a * tokens + b * attended
 * where attended is the sum, over the step's tokens, of the positions each
 * attends to (attention grows with the context: on a CPU a token at
 * position 1,800 costs several times one at 0).
 *
 * The three coefficients are a non-negative least-squares fit over
 * exponentially weighted sums of the steps seen. Both callers extrapolate
 * far beyond those steps (a 2,000-token prompt from steps of four decodes),
 * which an unconstrained fit does badly: two nearly collinear regressors
 * (tokens and attended grow together) take large coefficients of opposite
 * sign, and one slow step swings a prediction by 100x. Hence the
 * constraint, and a residual beyond a few typical ones (a step the OS
 * preempted) is clipped before it counts (Huber). Steps of prompt tokens
 * forget old evidence faster than decodes (the machine's load changes, and
 * they are the ones that say what a token costs). */
#ifndef WK_COST_H
#define WK_COST_H

typedef struct wk_cost {
    double theta[3];   /* fixed, a, b (b per 1,000 attended positions), all >= 0 */
    double A[3][3];    /* weighted sums of x x' and of x ms, x = (1, tokens, attended) */
    double y[3];
    double scale;      /* the typical |residual|, relative to the prediction */
    int n, excited;    /* observations; those with many tokens */
} wk_cost;

void wk_cost_init(wk_cost *c);
void wk_cost_observe(wk_cost *c, double tokens, double attended, double ms);
/* 1 once a step with prompt tokens has been seen. */
int wk_cost_known(const wk_cost *c);
/* Predicted ms; 0 while unknown. */
double wk_cost_predict(const wk_cost *c, double tokens, double attended);
/* Positions attended by n tokens computed from position p: p + (p+1) + ... */
double wk_cost_attended(double p, double n);
/* The largest chunk n in [lo, hi] of prompt tokens from position p that,
 * added to a step of (tokens, attended), keeps the prediction within
 * target_ms; lo when none does, hi while the cost is unknown. */
int wk_cost_max_chunk(const wk_cost *c, double target_ms, double tokens, double attended, double p, int lo, int hi);

#endif
