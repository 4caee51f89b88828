/* The NCCL backend of wk_comm (built with CUDA). Buffers are device memory,
 * except that broadcast also takes host memory (the step plan) and stages it
 * through the device. The communicator is non-blocking: a call may return
 * ncclInProgress before NCCL has put its work on the stream (the stream then
 * looks idle and a reader would see stale data), so every call is followed
 * by polling ncclCommGetAsyncError until it is enqueued. A collective on
 * device buffers is ordered on the compute stream with two events (NCCL's
 * stream waits for the kernels before it, the compute stream for NCCL) and
 * the host does not wait for it; settle, once a step before the host reads
 * a result, waits for the last one within the deadline, watching NCCL's
 * asynchronous error, so a dead peer ends in ncclCommAbort and LLM_EIO on
 * this rank instead of a hang. */
#include "wk_comm.h"
#include "cm_error.h"
#include "cm_log.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ready;  /* recorded on the compute stream: NCCL's stream waits for it */
    cudaEvent_t done;   /* recorded on NCCL's stream after a collective: the compute stream waits for it */
    int device;
    char *tmp;        /* device staging */
    size_t tmp_cap;
    float *one;       /* barrier scratch */
} nccl_impl;

_Static_assert(sizeof(ncclUniqueId) == WK_NCCL_ID_BYTES, "NCCL unique id size");

static double since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

static int give_up(wk_comm *c, const char *why) {
    nccl_impl *n = c->impl;
    CM_ERR("NCCL: %s; aborting the communicator", why);
    ncclCommAbort(n->comm);
    n->comm = NULL;
    return LLM_EIO;
}

/* NCCL's asynchronous state: 0 when ncclSuccess, 1 while ncclInProgress, else the communicator is aborted. */
static int async_state(wk_comm *c, int *busy) {
    nccl_impl *n = c->impl;
    ncclResult_t ae = ncclSuccess;
    if (ncclCommGetAsyncError(n->comm, &ae) != ncclSuccess) ae = ncclSystemError;
    *busy = ae == ncclInProgress;
    if (ae == ncclSuccess || ae == ncclInProgress) return 0;
    return give_up(c, ncclGetErrorString(ae));
}

/* After an NCCL call: on ncclInProgress, wait (within the deadline) until NCCL has enqueued the work. */
static int enqueued(wk_comm *c, ncclResult_t r) {
    if (r == ncclSuccess) return 0;
    if (r != ncclInProgress) {
        CM_ERR("NCCL: %s", ncclGetErrorString(r));
        return LLM_EDEVICE;
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int busy = 1, rc;;) {
        if ((rc = async_state(c, &busy))) return rc;
        if (!busy) return 0;
        if (c->timeout_s > 0 && since(&t0) > c->timeout_s) return give_up(c, "a collective was never enqueued");
        sched_yield();
    }
}

/* NCCL's stream waits for the kernels already launched on the compute stream. */
static int after_compute(nccl_impl *n) {
    if (cudaEventRecord(n->ready, cudaStreamLegacy) != cudaSuccess ||
        cudaStreamWaitEvent(n->stream, n->ready, 0) != cudaSuccess)
        return LLM_EDEVICE;
    return 0;
}

/* Kernels launched from now on wait for what NCCL's stream holds. */
static int before_compute(nccl_impl *n) {
    if (cudaEventRecord(n->done, n->stream) != cudaSuccess ||
        cudaStreamWaitEvent(cudaStreamLegacy, n->done, 0) != cudaSuccess)
        return LLM_EDEVICE;
    return 0;
}

/* The host waits until NCCL's stream is done: polled, with NCCL's asynchronous error and the deadline. */
static int nccl_settle(wk_comm *c) {
    nccl_impl *n = c->impl;
    if (!n->comm) return LLM_EIO;
    if (cudaEventRecord(n->done, n->stream) != cudaSuccess) return LLM_EDEVICE;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long spins = 0;; spins++) {
        cudaError_t q = cudaEventQuery(n->done);
        if (q == cudaSuccess) return 0;
        if (q != cudaErrorNotReady) {
            CM_ERR("NCCL stream: %s", cudaGetErrorString(q));
            return LLM_EDEVICE;
        }
        int busy, rc;
        if ((rc = async_state(c, &busy))) return rc;
        if (c->timeout_s > 0 && since(&t0) > c->timeout_s) {
            char why[128];
            snprintf(why, sizeof why, "a collective did not finish in %.0f s (a dead or hung rank?)", c->timeout_s);
            return give_up(c, why);
        }
        if (spins < 2000) {
            sched_yield(); /* a step's last collective is usually microseconds from done */
        } else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

static int tmp_grow(nccl_impl *n, size_t bytes) {
    if (bytes <= n->tmp_cap) return 0;
    if (n->tmp) cudaFree(n->tmp);
    n->tmp = NULL;
    n->tmp_cap = 0;
    if (cudaMalloc((void **)&n->tmp, bytes) != cudaSuccess) return LLM_ENOMEM;
    n->tmp_cap = bytes;
    return 0;
}

static int nccl_all_reduce(wk_comm *c, float *buf, size_t count) {
    nccl_impl *n = c->impl;
    int rc;
    if (!n->comm) return LLM_EIO;
    if ((rc = after_compute(n)) ||
        (rc = enqueued(c, ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, n->comm, n->stream))))
        return rc;
    return before_compute(n);
}

/* Uneven widths: each rank's block is broadcast from its owner into the
 * staging area, then copied into its columns of out. */
static int nccl_all_gather_cols(wk_comm *c, const float *in, int rows, const int *width, float *out) {
    nccl_impl *n = c->impl;
    if (!n->comm) return LLM_EIO;
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += (size_t)width[r];
    int rc = tmp_grow(n, sizeof(float) * total * (size_t)rows);
    if (rc || (rc = after_compute(n))) return rc;
    ncclGroupStart();
    size_t off = 0;
    for (int r = 0; r < c->size; r++) {
        size_t cnt = (size_t)width[r] * (size_t)rows;
        const void *src = r == c->rank ? (const void *)in : (const void *)(n->tmp + off * sizeof(float));
        ncclBroadcast(src, n->tmp + off * sizeof(float), cnt, ncclFloat, r, n->comm, n->stream);
        off += cnt;
    }
    if ((rc = enqueued(c, ncclGroupEnd()))) return rc;
    if (!out) return before_compute(n);
    off = 0;
    size_t col = 0;
    for (int r = 0; r < c->size; r++) {
        if (cudaMemcpy2DAsync(out + col, total * sizeof(float), n->tmp + off * sizeof(float),
                              (size_t)width[r] * sizeof(float), (size_t)width[r] * sizeof(float), (size_t)rows,
                              cudaMemcpyDeviceToDevice, n->stream) != cudaSuccess)
            return LLM_EDEVICE;
        off += (size_t)width[r] * (size_t)rows;
        col += (size_t)width[r];
    }
    return before_compute(n);
}

static int nccl_broadcast(wk_comm *c, void *buf, size_t bytes, int root) {
    nccl_impl *n = c->impl;
    if (!n->comm) return LLM_EIO;
    struct cudaPointerAttributes at;
    int host = cudaPointerGetAttributes(&at, buf) != cudaSuccess || at.type == cudaMemoryTypeUnregistered ||
               at.type == cudaMemoryTypeHost;
    cudaGetLastError(); /* clear a failed attribute query */
    int rc;
    if (!host) {
        if ((rc = after_compute(n)) || (rc = enqueued(c, ncclBroadcast(buf, buf, bytes, ncclChar, root, n->comm, n->stream))))
            return rc;
        return before_compute(n);
    }
    if ((rc = tmp_grow(n, bytes ? bytes : 1))) return rc;
    if (c->rank == root && cudaMemcpyAsync(n->tmp, buf, bytes, cudaMemcpyHostToDevice, n->stream) != cudaSuccess)
        return LLM_EDEVICE;
    if ((rc = enqueued(c, ncclBroadcast(n->tmp, n->tmp, bytes, ncclChar, root, n->comm, n->stream)))) return rc;
    /* the deadline first: a copy into pageable host memory blocks inside CUDA until the broadcast is done,
     * so waiting for it there would hang with a dead root instead of returning LLM_EIO */
    if ((rc = nccl_settle(c))) return rc;
    if (c->rank != root && cudaMemcpy(buf, n->tmp, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return LLM_EDEVICE;
    return 0;
}

static int nccl_barrier(wk_comm *c) {
    nccl_impl *n = c->impl;
    int rc = nccl_all_reduce(c, n->one, 1);
    return rc ? rc : nccl_settle(c);
}

static void nccl_destroy(wk_comm *c) {
    nccl_impl *n = c->impl;
    if (n) {
        if (n->comm) ncclCommDestroy(n->comm);
        if (n->tmp) cudaFree(n->tmp);
        if (n->one) cudaFree(n->one);
        if (n->ready) cudaEventDestroy(n->ready);
        if (n->done) cudaEventDestroy(n->done);
        if (n->stream) cudaStreamDestroy(n->stream);
        free(n);
    }
    free(c);
}

static int nccl_reserve(wk_comm *c, size_t bytes) {
    nccl_impl *n = c->impl;
    return tmp_grow(n, bytes);
}

static const wk_comm_ops nccl_ops = {nccl_all_reduce, nccl_all_gather_cols, nccl_broadcast, nccl_barrier,
                                     nccl_destroy, nccl_settle, nccl_reserve};

int wk_comm_nccl_unique_id(uint8_t id[WK_NCCL_ID_BYTES]) {
    ncclUniqueId u;
    if (ncclGetUniqueId(&u) != ncclSuccess) return LLM_EDEVICE;
    memcpy(id, &u, sizeof u);
    return 0;
}

static pthread_once_t connect_once = PTHREAD_ONCE_INIT;
static void connect_at_init(void) { setenv("NCCL_RUNTIME_CONNECT", "0", 0); }

int wk_comm_nccl_create(const uint8_t id[WK_NCCL_ID_BYTES], int rank, int size, int device, double init_timeout_s,
                        wk_comm **out) {
    *out = NULL;
    wk_comm *c = calloc(1, sizeof *c);
    nccl_impl *n = calloc(1, sizeof *n);
    if (!c || !n) {
        free(c);
        free(n);
        return LLM_ENOMEM;
    }
    c->rank = rank;
    c->size = size;
    c->timeout_s = WK_COMM_TIMEOUT_S;
    c->ops = &nccl_ops;
    c->impl = n;
    n->device = device;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    if (cudaSetDevice(device) != cudaSuccess || cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void **)&n->one, sizeof(float)) != cudaSuccess ||
        cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming) != cudaSuccess) {
        nccl_destroy(c);
        return LLM_EDEVICE;
    }
    /* NCCL 2.22+ connects its channels (and allocates their buffers) at the first collective of each kind
     * unless told not to: all of it at init, before the KV pool is sized from the memory left (a user's own
     * setting wins) */
    pthread_once(&connect_once, connect_at_init);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* init and collectives return at once: enqueued() and settle poll */
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, size, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        CM_ERR("ncclCommInitRank: %s", ncclGetErrorString(r));
        n->comm = NULL;
        nccl_destroy(c);
        return LLM_EDEVICE;
    }
    ncclResult_t st = ncclInProgress;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (st == ncclInProgress) {
        if (ncclCommGetAsyncError(n->comm, &st) != ncclSuccess) st = ncclSystemError;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (st == ncclInProgress && init_timeout_s > 0 &&
            (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 > init_timeout_s) {
            CM_ERR("NCCL communicator init: not every rank arrived within %.0f s (--join-timeout)", init_timeout_s);
            st = ncclSystemError;
        }
        if (st == ncclInProgress) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    if (st != ncclSuccess) {
        CM_ERR("NCCL communicator init: %s", ncclGetErrorString(st));
        ncclCommAbort(n->comm);
        n->comm = NULL;
        nccl_destroy(c);
        return LLM_EDEVICE;
    }
    *out = c;
    return 0;
}
