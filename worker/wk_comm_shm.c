/* The CPU shared-memory backend of wk_comm: one POSIX shared-memory segment
 * with a header (a sense-counting barrier, the group's pids, a dead flag)
 * and one data slot per rank. Large operations go through the slots in
 * chunks. Waiting spins, then yields, and every few thousand turns checks
 * that every peer is alive and the wait is within the comm's deadline: a
 * dead peer or a wait past it sets the dead flag, and every rank's next
 * wait fails with LLM_EIO. */
#include "wk_comm.h"
#include "cm_error.h"
#include "cm_log.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#define MAX_RANKS 64
#define SLOT_BYTES ((size_t)8 << 20)

typedef struct {
    uint32_t magic, size;
    _Atomic uint32_t count, gen, dead;
    _Atomic int32_t pid[MAX_RANKS];
} shm_hdr;

typedef struct {
    shm_hdr *h;
    char *slots;       /* [size][SLOT_BYTES] */
    size_t map_bytes;
    char name[64];
    int owner;
    uint8_t child[MAX_RANKS];
} shm_impl;

#define HDR_BYTES 4096
#define MAGIC 0x6c6d7368u

/* A process that exited but is not yet reaped (its parent is another rank, as in a stage's comm of ranks
 * one driver started) still answers kill(): its state in /proc says Z. */
static int zombie(pid_t p) {
    char path[48], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)p);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *e = strrchr(buf, ')'); /* the name may hold spaces and parentheses: the state follows the last */
    return e && e[1] == ' ' && (e[2] == 'Z' || e[2] == 'X');
}

static int peer_dead(wk_comm *c) {
    shm_impl *s = c->impl;
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank) continue;
        pid_t p = atomic_load(&s->h->pid[r]);
        if (p <= 0) continue;
        if (s->child[r]) { /* our child: a zombie still answers kill(), so reap */
            int st;
            if (waitpid(p, &st, WNOHANG) == p) return r + 1;
        } else if ((kill(p, 0) != 0 && errno == ESRCH) || zombie(p)) {
            return r + 1;
        }
    }
    return 0;
}

static int shm_barrier(wk_comm *c) {
    shm_impl *s = c->impl;
    shm_hdr *h = s->h;
    if (atomic_load(&h->dead)) return LLM_EIO;
    uint32_t g = atomic_load(&h->gen);
    if (atomic_fetch_add(&h->count, 1) == (uint32_t)c->size - 1) {
        atomic_store(&h->count, 0);
        atomic_fetch_add(&h->gen, 1);
        return 0;
    }
    struct timespec t0 = {0, 0}, t;
    for (uint64_t spin = 0; atomic_load_explicit(&h->gen, memory_order_acquire) == g; spin++) {
        if (spin < 20000) {
            CPU_RELAX();
            continue;
        }
        if (spin == 20000) clock_gettime(CLOCK_MONOTONIC, &t0);
        if (spin % 64 == 0) {
            if (atomic_load(&h->dead)) return LLM_EIO;
            int d = peer_dead(c);
            if (d) {
                CM_ERR("rank %d of the tensor-parallel group died", d - 1);
                atomic_store(&h->dead, 1);
                return LLM_EIO;
            }
            clock_gettime(CLOCK_MONOTONIC, &t);
            if (c->timeout_s > 0 && (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 > c->timeout_s) {
                CM_ERR("a tensor-parallel collective did not finish in %.0f s (a hung rank?); the group ends",
                       c->timeout_s);
                atomic_store(&h->dead, 1);
                return LLM_EIO;
            }
        }
        if (spin < 200000) sched_yield();
        else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
    return atomic_load(&h->dead) ? LLM_EIO : 0;
}

static char *slot(wk_comm *c, int r) {
    return ((shm_impl *)c->impl)->slots + (size_t)r * SLOT_BYTES;
}

static int shm_all_reduce(wk_comm *c, float *buf, size_t n) {
    size_t per = SLOT_BYTES / sizeof(float);
    for (size_t off = 0; off < n; off += per) {
        size_t m = n - off < per ? n - off : per;
        memcpy(slot(c, c->rank), buf + off, m * sizeof(float));
        int rc = shm_barrier(c);
        if (rc) return rc;
        /* every rank adds in rank order: identical results everywhere */
        const float *s0 = (const float *)slot(c, 0);
        for (size_t i = 0; i < m; i++) {
            float acc = s0[i];
            for (int r = 1; r < c->size; r++) acc += ((const float *)slot(c, r))[i];
            buf[off + i] = acc;
        }
        if ((rc = shm_barrier(c))) return rc;
    }
    return 0;
}

static int shm_all_gather_cols(wk_comm *c, const float *in, int rows, const int *width, float *out) {
    int total = 0, mine = width[c->rank], off_mine = 0;
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank) off_mine = total;
        total += width[r];
    }
    (void)off_mine;
    int maxw = 0;
    for (int r = 0; r < c->size; r++) maxw = width[r] > maxw ? width[r] : maxw;
    int per = maxw ? (int)(SLOT_BYTES / (sizeof(float) * (size_t)maxw)) : rows;
    if (per < 1) return LLM_ERANGE;
    for (int r0 = 0; r0 < rows; r0 += per) {
        int m = rows - r0 < per ? rows - r0 : per;
        memcpy(slot(c, c->rank), in + (size_t)r0 * mine, sizeof(float) * (size_t)m * (size_t)mine);
        int rc = shm_barrier(c);
        if (rc) return rc;
        for (int r = 0, col = 0; out && r < c->size; col += width[r], r++) {
            const float *src = (const float *)slot(c, r);
            for (int i = 0; i < m; i++)
                memcpy(out + (size_t)(r0 + i) * total + col, src + (size_t)i * width[r], sizeof(float) * (size_t)width[r]);
        }
        if ((rc = shm_barrier(c))) return rc;
    }
    return 0;
}

static int shm_broadcast(wk_comm *c, void *buf, size_t bytes, int root) {
    for (size_t off = 0; off < bytes; off += SLOT_BYTES) {
        size_t m = bytes - off < SLOT_BYTES ? bytes - off : SLOT_BYTES;
        if (c->rank == root) memcpy(slot(c, root), (char *)buf + off, m);
        int rc = shm_barrier(c);
        if (rc) return rc;
        if (c->rank != root) memcpy((char *)buf + off, slot(c, root), m);
        if ((rc = shm_barrier(c))) return rc;
    }
    return 0;
}

static void shm_destroy(wk_comm *c) {
    shm_impl *s = c->impl;
    if (s) {
        if (s->h) munmap(s->h, s->map_bytes);
        if (s->owner) shm_unlink(s->name);
        free(s);
    }
    free(c);
}

static const wk_comm_ops shm_ops = {shm_all_reduce, shm_all_gather_cols, shm_broadcast, shm_barrier, shm_destroy,
                                    NULL, NULL};

static int map(shm_impl *s, int fd, int size) {
    s->map_bytes = HDR_BYTES + (size_t)size * SLOT_BYTES;
    void *p = mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return LLM_EIO;
    s->h = p;
    s->slots = (char *)p + HDR_BYTES;
    return 0;
}

/* A comm on this backend with its (empty) state, or NULL. */
static wk_comm *shm_new(void) {
    wk_comm *c = calloc(1, sizeof *c);
    shm_impl *s = calloc(1, sizeof *s);
    if (!c || !s) {
        free(c);
        free(s);
        return NULL;
    }
    c->impl = s;
    c->ops = &shm_ops;
    return c;
}

int wk_comm_shm_create(int size, char *name_out, size_t name_len, wk_comm **out) {
    *out = NULL;
    if (size < 1 || size > MAX_RANKS) return LLM_EINVAL;
    wk_comm *c = shm_new();
    if (!c) return LLM_ENOMEM;
    shm_impl *s = c->impl;
    c->size = size;
    c->timeout_s = WK_COMM_TIMEOUT_S;
    static _Atomic unsigned seq; /* a process may create several (a group's segment, its stage's) */
    snprintf(s->name, sizeof s->name, "/llmserve-tp-%d-%lx-%u", (int)getpid(), (long)time(NULL), atomic_fetch_add(&seq, 1));
    int fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        shm_destroy(c);
        return LLM_EIO;
    }
    s->owner = 1;
    int rc = ftruncate(fd, (off_t)(HDR_BYTES + (size_t)size * SLOT_BYTES)) ? LLM_EIO : map(s, fd, size);
    close(fd);
    if (rc) {
        shm_destroy(c);
        return rc;
    }
    s->h->magic = MAGIC;
    s->h->size = (uint32_t)size;
    snprintf(name_out, name_len, "%s", s->name);
    *out = c;
    return 0;
}

int wk_comm_shm_attach(const char *name, int rank, wk_comm **out) {
    *out = NULL;
    wk_comm *c = shm_new();
    if (!c) return LLM_ENOMEM;
    shm_impl *s = c->impl;
    c->rank = rank;
    snprintf(s->name, sizeof s->name, "%s", name);
    int fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0) {
        shm_destroy(c);
        return LLM_EIO;
    }
    struct stat st;
    shm_hdr tmp;
    int rc = LLM_EFORMAT;
    if (!fstat(fd, &st) && (size_t)st.st_size >= HDR_BYTES && pread(fd, &tmp, sizeof tmp, 0) == (ssize_t)sizeof tmp &&
        tmp.magic == MAGIC && tmp.size >= 1 && tmp.size <= MAX_RANKS && rank < (int)tmp.size &&
        (size_t)st.st_size == HDR_BYTES + (size_t)tmp.size * SLOT_BYTES)
        rc = map(s, fd, (int)tmp.size);
    close(fd);
    if (rc) {
        shm_destroy(c);
        return rc;
    }
    c->size = (int)s->h->size;
    c->timeout_s = WK_COMM_TIMEOUT_S;
    *out = c;
    return 0;
}

void wk_comm_shm_set_pid(wk_comm *c, int rank, pid_t pid, int is_child) {
    shm_impl *s = c->impl;
    atomic_store(&s->h->pid[rank], pid);
    s->child[rank] = (uint8_t)(is_child != 0);
}
