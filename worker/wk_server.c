/* wk_server.c - the worker's loop: take what arrived, run one backend
 * step, send what it produced; and the drain on SIGTERM. The parts are in
 * wk_srv.h's files. */
#include "wk_server.h"

#include "cm_error.h"
#include "cm_log.h"
#include "wk_srv.h"

#include <nng/protocol/pipeline0/pull.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* Either a generation engine (e) or an embedding queue (eq). */
static int serve(wk_engine *e, wk_embed *eq, const wk_server_opts *o, volatile sig_atomic_t *stop, char *err,
                 size_t errlen) {
    if (o->warmup && e) {
        double t0 = (double)now_ms();
        int rc = wk_srv_warm_up(e, err, errlen);
        if (rc) return rc;
        CM_INFO("warmed up in %.0f ms", (double)now_ms() - t0);
    }
    server *s = calloc(1, sizeof *s);
    if (!s) return LLM_ENOMEM;
    s->be = e ? &wk_srv_generate_backend : &wk_srv_embed_backend;
    s->e = e;
    s->eq = eq;
    s->o = o;
    const cm_tokenizer *tok;
    if (e) {
        const wk_model *m = wk_engine_model(e);
        s->max_model_len = wk_engine_options(e)->max_model_len;
        s->block_size = wk_engine_options(e)->block_size;
        s->vocab = (int)m->cfg.vocab;
        tok = m->tok;
    } else {
        s->max_model_len = wk_encoder_max_len(eq->enc);
        s->vocab = (int)eq->enc->cfg.vocab;
        s->embed_dim = (int)eq->enc->cfg.dim;
        tok = eq->enc->tok;
    }
    s->tp = o->tp_size > 0 ? o->tp_size : 1;
    if (getrandom(&s->incarnation, sizeof s->incarnation, 0) != sizeof s->incarnation)
        s->incarnation = (uint64_t)now_ms() * 2654435761u ^ (uint64_t)getpid();
    if (tok && cm_tok_export(tok, &s->tok_gguf, &s->tok_len) == 0) s->tok_fp = cm_tok_fingerprint(tok);
    int rv = nng_pull0_open(&s->pull);
    if (!rv) rv = nng_socket_set_size(s->pull, NNG_OPT_RECVMAXSZ, PR_MAX_MSG);
    if (!rv) rv = nng_socket_set_int(s->pull, NNG_OPT_RECVBUF, 1024);
    if (!rv) rv = nng_listen(s->pull, o->listen, NULL, 0);
    if (rv) {
        snprintf(err, errlen, "cannot listen on %s: %s", o->listen, nng_strerror(rv));
        if (s->pull.id) nng_close(s->pull);
        free(s->tok_gguf);
        free(s);
        return LLM_EIO;
    }
    CM_INFO("worker %s listening on %s (incarnation %016llx, tokenizer %016llx, %zu bytes for gateways)", o->worker_id,
            o->listen, (unsigned long long)s->incarnation, (unsigned long long)s->tok_fp, s->tok_len);
    if (wk_srv_kv_start(s)) {
        snprintf(err, errlen, "out of memory");
        nng_close(s->pull);
        free(s->tok_gguf);
        free(s);
        return LLM_ENOMEM;
    }
    pthread_mutex_init(&s->mu, NULL);
    wk_srv_fill_stats(s, &s->snap, s->spec_pos_snap);
    s->last_progress = now_ms();
    pthread_cond_init(&s->rx_cv, NULL);
    pthread_t hb;
    int have_hb = pthread_create(&hb, NULL, wk_srv_heartbeat, s) == 0;
    if (pthread_create(&s->rx, NULL, wk_srv_receiver, s)) {
        snprintf(err, errlen, "cannot start the receiving thread");
        s->hb_stop = 1;
        if (have_hb) pthread_join(hb, NULL);
        nng_close(s->pull);
        free(s->tok_gguf);
        free(s);
        return LLM_ENOMEM;
    }
    int64_t last_check = now_ms(), drain_until = 0, last_metrics = 0;
    static char mtext[16384]; /* the loop's own: one server a process */
    wk_health_set_state(o->health, WK_H_READY);
    for (;;) {
        wk_health_beat(o->health);
        if (*stop && !s->draining) { /* SIGTERM: finish what runs, take nothing new */
            pthread_mutex_lock(&s->mu);
            s->draining = 1;
            pthread_mutex_unlock(&s->mu);
            wk_health_set_state(o->health, WK_H_DRAINING);
            int64_t ms = o->shutdown_timeout_ms >= 0 ? o->shutdown_timeout_ms : 30000;
            drain_until = now_ms() + ms;
            CM_INFO("draining: %d requests running, up to %lld ms (a second signal stops at once)", s->live, (long long)ms);
        }
        if (s->draining && (s->live == 0 || now_ms() >= drain_until || *stop > 1)) {
            if (s->live) { /* out of time: the rest end as aborted, which their clients see */
                CM_WARN("drain timeout: aborting %d requests", s->live);
                pthread_mutex_lock(&s->mu);
                for (int i = 0; i < s->n_slots; i++)
                    if (s->slots[i].used) s->be->end(s, &s->slots[i], WK_END_SHUTDOWN, NULL);
                s->be->flush(s);
                pthread_mutex_unlock(&s->mu);
            }
            break;
        }
        /* everything that arrived; wait a little only when idle */
        int idle = !s->be->has_work(s);
        pthread_mutex_lock(&s->mu);
        wk_srv_drain_queue(s, idle);
        if (now_ms() - last_check >= 100) {
            wk_srv_check_timeouts(s);
            last_check = now_ms();
        }
        wk_srv_apply_drops(s);
        /* what those messages ended (cancels: a guest moved off a prefill group, whose KV transfer's last message
         * its decode group waits for) goes out now, not after the step they would otherwise wait through */
        if (s->be->has_work(s)) s->be->flush(s);
        pthread_mutex_unlock(&s->mu);
        if (!s->be->has_work(s) && s->be->idle && s->be->idle(s) < 0) {
            snprintf(err, errlen, "a rank of the tensor-parallel group failed while idle");
            wk_srv_tell_going(s, err);
            break;
        } else if (s->be->has_work(s)) {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            int rc = s->be->step(s);
            clock_gettime(CLOCK_MONOTONIC, &b);
            if (rc < 0) {
                snprintf(err, errlen, "engine step failed: %s", cm_strerror(rc));
                wk_srv_tell_going(s, err);
                break;
            }
            s->step_ms[s->step_at] = (float)((double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) * 1e-6);
            s->step_at = (s->step_at + 1) % 1024;
            s->n_step++;
        }
        pthread_mutex_lock(&s->mu);
        s->be->flush(s);
        wk_srv_apply_drops(s);
        wk_srv_fill_stats(s, &s->snap, s->spec_pos_snap);
        s->last_progress = now_ms();
        size_t mlen = 0;
        if (wk_health_serving(o->health) && s->last_progress - last_metrics >= 500) {
            mlen = wk_srv_metrics_text(s, &s->snap, mtext, sizeof mtext);
            last_metrics = s->last_progress;
        }
        pthread_mutex_unlock(&s->mu);
        if (mlen) wk_health_set_metrics(o->health, mtext, mlen);
    }
    s->hb_stop = 1;
    s->rx_stop = 1;
    if (have_hb) pthread_join(hb, NULL);
    pthread_join(s->rx, NULL);
    for (rxmsg *q = s->rx_head, *next; q; q = next) {
        next = q->next;
        pr_free(q->env);
        free(q);
    }
    wk_srv_free_held(s);
    wk_srv_kv_stop(s);
    pthread_cond_destroy(&s->rx_cv);
    pthread_mutex_destroy(&s->mu);
    for (int g = 0; g < MAX_GATEWAYS; g++)
        if (s->gw[g].used) {
            nng_close(s->gw[g].push);
            cm_idmap_free(&s->gw[g].reqs);
        }
    wk_srv_close_lingering(s, INT64_MAX);
    nng_close(s->pull);
    free(s->slots);
    free(s->tok_gguf);
    int drained = s->draining;
    free(s);
    return drained ? 0 : LLM_EIO;
}

int wk_server_run(wk_engine *e, const wk_server_opts *o, volatile sig_atomic_t *stop, char *err, size_t errlen) {
    return serve(e, NULL, o, stop, err, errlen);
}

int wk_server_run_embed(wk_encoder *enc, const wk_server_opts *o, volatile sig_atomic_t *stop, char *err,
                        size_t errlen) {
    wk_embed q;
    int rc = wk_embed_init(&q, enc);
    if (rc) return rc;
    if (o->warmup) { /* one short input first: page faults in the weights are not the first client's */
        int32_t t[4] = {0, 1, 2, 3}, *tp = t, n = 4;
        char e2[200];
        double t0 = (double)now_ms();
        if (wk_embed_add(&q, 1, 0, 1, (const int32_t *const *)&tp, &n, e2, sizeof e2) == 0 && wk_embed_step(&q) == 0)
            CM_INFO("warmed up in %.0f ms", (double)now_ms() - t0);
        for (wk_ejob *j = wk_embed_take_done(&q), *nx; j; j = nx) {
            nx = j->next;
            wk_ejob_free(j);
        }
    }
    rc = serve(NULL, &q, o, stop, err, errlen);
    wk_embed_free(&q);
    return rc;
}
