/* kn_pool.c - a fixed thread pool created once per process.
 *
 * kn_pool_run costs a generation bump and a spin on a counter: workers spin
 * briefly between tasks (a decode step issues a few hundred of them in a few
 * milliseconds), then sleep on a condition variable when idle. */
#include "cm_error.h"
#include "kn_int.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

/* Spin with pause first (a decode step's tasks are microseconds apart), then
 * yield (on an oversubscribed machine a pure spinner steals the core the
 * thread it waits for needs) for at most YIELD_NS, then sleep: the serial
 * part between steps (sampling, scheduling, the RPC) must not cost the
 * other threads' cores for long. */
#define SPIN_PAUSE 4096
#define YIELD_NS 2000000LL

static long long mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

typedef struct {
    kn_pool *pool;
    int id;
} worker_arg;

struct kn_pool {
    int n;
    pthread_t *th;
    worker_arg *args;
    _Atomic unsigned gen;
    _Atomic int pending;
    _Atomic int sleepers;
    _Atomic int stop;
    kn_task_fn fn;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void *worker(void *p) {
    worker_arg *wa = p;
    kn_pool *pool = wa->pool;
    unsigned seen = 0;
    for (;;) {
        int spins = 0;
        long long t0 = 0;
        while (atomic_load_explicit(&pool->gen, memory_order_acquire) == seen &&
               !atomic_load(&pool->stop)) {
            if (++spins < SPIN_PAUSE) {
                CPU_RELAX();
                continue;
            }
            if (spins == SPIN_PAUSE) t0 = mono_ns();
            if ((spins & 15) || mono_ns() - t0 < YIELD_NS) {
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&pool->mu);
            atomic_fetch_add(&pool->sleepers, 1);
            while (atomic_load(&pool->gen) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cv, &pool->mu);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = atomic_load_explicit(&pool->gen, memory_order_acquire);
        pool->fn(pool->ctx, wa->id, pool->n);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
}

int kn_pool_create(int n, kn_pool **out) {
    *out = NULL;
    if (n < 1 || n > 1024) return LLM_EINVAL;
    kn_pool *p = calloc(1, sizeof *p);
    if (!p) return LLM_ENOMEM;
    p->n = n;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->th = calloc((size_t)n, sizeof *p->th);
    p->args = calloc((size_t)n, sizeof *p->args);
    if (!p->th || !p->args) goto fail;
    for (int i = 1; i < n; i++) {
        p->args[i] = (worker_arg){p, i};
        if (pthread_create(&p->th[i], NULL, worker, &p->args[i]) != 0) {
            p->n = i; /* destroy joins only the threads that exist */
            goto fail;
        }
    }
    *out = p;
    return 0;
fail:
    kn_pool_destroy(p);
    return LLM_ENOMEM;
}

void kn_pool_destroy(kn_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; p->th && i < p->n; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->th);
    free(p->args);
    free(p);
}

int kn_pool_size(const kn_pool *p) {
    return p ? p->n : 1;
}

void kn_pool_run(kn_pool *p, kn_task_fn fn, void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: pairs with the sleepers check below */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n);
    for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spins++) {
        if (spins < SPIN_PAUSE) CPU_RELAX();
        else sched_yield();
    }
}
