#include "gw_tokq.h"
#include "cm_error.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct gw_tokq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    gw_job *head, *tail, *done;  /* waiting (FIFO); finished (for the loop) */
    int queued, max_queued, stop, n_threads;
    pthread_t *threads;
    int pipe_fd[2];              /* a byte wakes the loop */
    struct event *ev;
};

static void *worker(void *arg) {
    gw_tokq *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
        if (!q->head) break;
        gw_job *j = q->head;
        q->head = j->next;
        if (!q->head) q->tail = NULL;
        pthread_mutex_unlock(&q->mu);
        j->run(j);
        pthread_mutex_lock(&q->mu);
        j->next = q->done;
        q->done = j;
        char b = 1;
        if (write(q->pipe_fd[1], &b, 1) < 0) { /* full: the loop is already due to wake */
        }
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static void drain_done(gw_tokq *q) {
    pthread_mutex_lock(&q->mu);
    gw_job *d = q->done;
    q->done = NULL;
    pthread_mutex_unlock(&q->mu);
    /* oldest first */
    gw_job *r = NULL;
    while (d) {
        gw_job *n = d->next;
        d->next = r;
        r = d;
        d = n;
    }
    while (r) {
        gw_job *n = r->next;
        pthread_mutex_lock(&q->mu);
        q->queued--;
        pthread_mutex_unlock(&q->mu);
        r->done(r);
        r = n;
    }
}

static void on_wake(evutil_socket_t fd, short what, void *arg) {
    char buf[256];
    (void)what;
    while (read(fd, buf, sizeof buf) > 0) {
    }
    drain_done(arg);
}

int gw_tokq_create(struct event_base *base, int threads, int max_queued, gw_tokq **out) {
    *out = NULL;
    gw_tokq *q = calloc(1, sizeof *q);
    if (!q) return LLM_ENOMEM;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->max_queued = max_queued;
    q->pipe_fd[0] = q->pipe_fd[1] = -1;
    if (pipe(q->pipe_fd)) goto fail;
    for (int i = 0; i < 2; i++) fcntl(q->pipe_fd[i], F_SETFL, O_NONBLOCK);
    q->ev = event_new(base, q->pipe_fd[0], EV_READ | EV_PERSIST, on_wake, q);
    if (!q->ev) goto fail;
    event_add(q->ev, NULL);
    q->threads = calloc((size_t)threads, sizeof *q->threads);
    if (!q->threads) goto fail;
    for (; q->n_threads < threads; q->n_threads++)
        if (pthread_create(&q->threads[q->n_threads], NULL, worker, q)) goto fail;
    *out = q;
    return 0;
fail:
    gw_tokq_free(q);
    return LLM_ENOMEM;
}

int gw_tokq_submit(gw_tokq *q, gw_job *j) {
    pthread_mutex_lock(&q->mu);
    if (q->queued >= q->max_queued || q->stop) {
        pthread_mutex_unlock(&q->mu);
        return LLM_EAGAIN;
    }
    j->next = NULL;
    if (q->tail) q->tail->next = j;
    else q->head = j;
    q->tail = j;
    q->queued++;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

int gw_tokq_queued(gw_tokq *q) {
    pthread_mutex_lock(&q->mu);
    int n = q->queued;
    pthread_mutex_unlock(&q->mu);
    return n;
}

void gw_tokq_free(gw_tokq *q) {
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < q->n_threads; i++) pthread_join(q->threads[i], NULL);
    drain_done(q);
    if (q->ev) event_free(q->ev);
    for (int i = 0; i < 2; i++)
        if (q->pipe_fd[i] >= 0) close(q->pipe_fd[i]);
    free(q->threads);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}
