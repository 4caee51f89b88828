#include "wk_tier.h"
#include "wk_blocks.h"
#include "cm_error.h"
#include "cm_hash.h"
#include "cm_log.h"
#include "cm_time.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

static const char MAGIC[8] = {'L', 'L', 'M', 'S', 'K', 'V', 'B', '1'};

/* A block held in memory, on disk, or both (the disk tier is written through: what memory holds is on disk
 * too, unless a write failed, so a kill loses nothing the disk could keep). */
typedef struct {
    uint64_t key, parent, salt;
    int32_t hnext;             /* hash chain */
    int32_t prev[2], next[2];  /* neighbours in the memory [0] and disk [1] lists (prev: less recently used) */
    uint8_t in[2];             /* held in memory, on disk */
    uint8_t pending;           /* its file is being written (the slot stays till the writer answers) */
    uint8_t reading;           /* its file is being read into memory (the same) */
    uint8_t from_disk;         /* in memory because it was read back from disk (its hit is the disk's) */
    uint8_t used;              /* 0: a free slot */
    char *data;                /* in memory: the payload */
} ent;

typedef struct {
    int32_t head, tail; /* head: least recently used */
    uint64_t n, bytes;
} lru;

/* A block file to write, on the I/O thread: its names, then its tokens and payload in the same allocation; or
 * one to read (read set) into buf, a whole file. */
typedef struct job {
    struct job *next;
    uint64_t key, parent, salt;
    int ok, err, read;
    char *buf;
} job;

#define IO_QUEUE_BYTES ((size_t)64 << 20) /* writes queued at most; past it a block is not written */

struct wk_tier {
    wk_tier_opts o;
    char *dir;             /* disk_dir/<fingerprint>, or NULL */
    size_t file_bytes;     /* one block file */
    ent *e;
    int32_t *toks;         /* [cap][block_size] */
    int cap, n_used;
    int32_t free_slot;     /* free slots chained through hnext */
    int32_t *bucket;
    uint32_t bmask;
    lru l[2];              /* memory, disk */
    char *scratch;         /* one block file */
    wk_tier_stats st;
    /* the disk writer: the engine's thread queues, it writes, the engine's thread takes the answers */
    pthread_t io;
    int io_on, io_stop, io_busy;
    pthread_mutex_t mu;
    pthread_cond_t cv, idle;
    job *todo, *todo_tail, *done;
    size_t todo_bytes;
};

/* ---- index --------------------------------------------------------------- */

static void event(wk_tier *t, int type, int32_t i, int tier) {
    if (t->o.event) t->o.event(t->o.ctx, type, t->e[i].key, type == WK_EV_STORED ? t->e[i].parent : 0, tier);
}

static int same(const wk_tier *t, int32_t i, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok) {
    const ent *x = &t->e[i];
    return x->key == key && x->parent == parent && x->salt == salt &&
           !memcmp(t->toks + (size_t)i * t->o.block_size, tok, sizeof(int32_t) * (size_t)t->o.block_size);
}

/* The slot holding key, whatever its tokens, or -1. */
static int32_t by_key(const wk_tier *t, uint64_t key) {
    if (!t->bucket) return -1;
    for (int32_t i = t->bucket[key & t->bmask]; i >= 0; i = t->e[i].hnext)
        if (t->e[i].key == key) return i;
    return -1;
}

static int grow(wk_tier *t) {
    int cap = t->cap ? 2 * t->cap : 256;
    ent *e = realloc(t->e, sizeof *e * (size_t)cap);
    if (!e) return LLM_ENOMEM;
    t->e = e;
    int32_t *tk = realloc(t->toks, sizeof *tk * (size_t)cap * (size_t)t->o.block_size);
    if (!tk) return LLM_ENOMEM;
    t->toks = tk;
    uint32_t nb = 1;
    while (nb < 2u * (uint32_t)cap) nb <<= 1;
    int32_t *b = malloc(sizeof *b * nb);
    if (!b) return LLM_ENOMEM;
    free(t->bucket);
    t->bucket = b;
    t->bmask = nb - 1;
    for (uint32_t i = 0; i < nb; i++) b[i] = -1;
    for (int32_t i = 0; i < t->cap; i++) /* rehash the used slots */
        if (t->e[i].used) {
            uint32_t h = (uint32_t)(t->e[i].key & t->bmask);
            t->e[i].hnext = b[h];
            b[h] = i;
        }
    for (int32_t i = cap - 1; i >= t->cap; i--) {
        t->e[i] = (ent){0};
        t->e[i].hnext = t->free_slot;
        t->free_slot = i;
    }
    t->cap = cap;
    return 0;
}

/* List k: 0 memory, 1 disk. */
static void lru_unlink(wk_tier *t, int32_t i, int k) {
    ent *x = &t->e[i];
    lru *l = &t->l[k];
    if (x->prev[k] >= 0) t->e[x->prev[k]].next[k] = x->next[k];
    else l->head = x->next[k];
    if (x->next[k] >= 0) t->e[x->next[k]].prev[k] = x->prev[k];
    else l->tail = x->prev[k];
    l->n--;
    l->bytes -= k ? t->file_bytes : t->o.block_bytes;
    x->in[k] = 0;
}

static void lru_push(wk_tier *t, int32_t i, int k) {
    ent *x = &t->e[i];
    lru *l = &t->l[k];
    x->in[k] = 1;
    x->prev[k] = l->tail;
    x->next[k] = -1;
    if (l->tail >= 0) t->e[l->tail].next[k] = i;
    else l->head = i;
    l->tail = i;
    l->n++;
    l->bytes += k ? t->file_bytes : t->o.block_bytes;
}

static void touch(wk_tier *t, int32_t i) {
    for (int k = 0; k < 2; k++)
        if (t->e[i].in[k]) {
            lru_unlink(t, i, k);
            lru_push(t, i, k);
        }
}

/* A slot for a new block (not yet in a tier's list), or -1. */
static int32_t slot_new(wk_tier *t, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok) {
    if (t->free_slot < 0 && grow(t)) return -1;
    int32_t i = t->free_slot;
    t->free_slot = t->e[i].hnext;
    t->e[i] = (ent){.key = key, .parent = parent, .salt = salt, .prev = {-1, -1}, .next = {-1, -1}, .used = 1};
    memcpy(t->toks + (size_t)i * t->o.block_size, tok, sizeof(int32_t) * (size_t)t->o.block_size);
    uint32_t h = (uint32_t)(key & t->bmask);
    t->e[i].hnext = t->bucket[h];
    t->bucket[h] = i;
    t->n_used++;
    return i;
}

static void slot_free(wk_tier *t, int32_t i) {
    int32_t *p = &t->bucket[t->e[i].key & t->bmask];
    while (*p != i) p = &t->e[*p].hnext;
    *p = t->e[i].hnext;
    free(t->e[i].data);
    t->e[i] = (ent){0};
    t->e[i].hnext = t->free_slot;
    t->free_slot = i;
    t->n_used--;
}

/* ---- block files --------------------------------------------------------- */

static void put_u32(char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (char)(v >> (8 * i));
}
static void put_u64(char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void header(char *h, int bs, uint64_t fp, uint64_t key, uint64_t parent, uint64_t salt, size_t payload) {
    memset(h, 0, WK_TIER_HEADER);
    memcpy(h, MAGIC, 8);
    put_u32(h + 8, 1);
    put_u32(h + 12, (uint32_t)bs);
    put_u64(h + 16, fp);
    put_u64(h + 24, key);
    put_u64(h + 32, parent);
    put_u64(h + 40, salt);
    put_u64(h + 48, payload);
}

static uint64_t checksum(const void *h, const void *tok, size_t tok_len, const void *payload, size_t len) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, h, WK_TIER_HEADER); /* with its checksum field zero */
    XXH3_64bits_update(&st, tok, tok_len);
    XXH3_64bits_update(&st, payload, len);
    return XXH3_64bits_digest(&st);
}

/* The header fields that name the block and its shape, checked against this store. */
static int header_ok(const unsigned char *h, int block_size, size_t block_bytes, uint64_t fp) {
    return !memcmp(h, MAGIC, 8) && get_u32(h + 8) == 1 && get_u32(h + 12) == (uint32_t)block_size &&
           get_u64(h + 16) == fp && get_u64(h + 48) == (uint64_t)block_bytes;
}

int wk_tier_check_file(const void *buf, size_t len, int block_size, size_t block_bytes, uint64_t fingerprint) {
    const unsigned char *p = buf;
    size_t tl = sizeof(int32_t) * (size_t)block_size;
    if (block_size <= 0 || len != WK_TIER_HEADER + tl + block_bytes || !header_ok(p, block_size, block_bytes, fingerprint))
        return LLM_EIO;
    char h[WK_TIER_HEADER];
    memcpy(h, p, WK_TIER_HEADER);
    memset(h + 56, 0, 8);
    if (checksum(h, p + WK_TIER_HEADER, tl, p + WK_TIER_HEADER + tl, block_bytes) != get_u64(p + 56)) return LLM_EIO;
    int32_t *tok = malloc(tl);
    if (!tok) return LLM_ENOMEM;
    memcpy(tok, p + WK_TIER_HEADER, tl); /* the key names these tokens under this parent and salt */
    int ok = cm_block_key(get_u64(p + 32), get_u64(p + 40), tok, block_size) == get_u64(p + 24);
    free(tok);
    return ok ? 0 : LLM_EIO;
}

static void path_of(const wk_tier *t, uint64_t key, const char *ext, char *out, size_t n) {
    snprintf(out, n, "%s/%016" PRIx64 "%s", t->dir, key, ext);
}

static int32_t *job_tok(job *j) { return (int32_t *)(void *)(j + 1); }
static char *job_payload(const wk_tier *t, job *j) { return (char *)(job_tok(j) + t->o.block_size); }

/* Writes a block file (on the writer thread: reads only what does not change); 0, or LLM_EIO with *err the
 * errno and nothing left behind. */
static int write_file(const wk_tier *t, job *j, int *err) {
    char h[WK_TIER_HEADER], tmp[600], fin[600];
    size_t tl = sizeof(int32_t) * (size_t)t->o.block_size;
    const int32_t *tok = job_tok(j);
    const char *payload = job_payload(t, j);
    header(h, t->o.block_size, t->o.fingerprint, j->key, j->parent, j->salt, t->o.block_bytes);
    put_u64(h + 56, checksum(h, tok, tl, payload, t->o.block_bytes));
    path_of(t, j->key, ".tmp", tmp, sizeof tmp);
    path_of(t, j->key, ".kvb", fin, sizeof fin);
    errno = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) goto fail;
    struct iovec iov[3] = {{h, WK_TIER_HEADER}, {(void *)tok, tl}, {(void *)payload, t->o.block_bytes}};
    size_t want = t->file_bytes, done = 0;
    int k = 0;
    while (done < want) {
        ssize_t w = writev(fd, iov + k, 3 - k);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
        while (k < 3 && (size_t)w >= iov[k].iov_len) w -= (ssize_t)iov[k++].iov_len;
        if (k < 3) {
            iov[k].iov_base = (char *)iov[k].iov_base + w;
            iov[k].iov_len -= (size_t)w;
        }
    }
    if (close(fd) || done != want || rename(tmp, fin)) goto fail;
    return 0;
fail:
    *err = errno ? errno : EIO;
    unlink(tmp);
    return LLM_EIO;
}

/* Reads key's block file whole into buf (file_bytes) and checks it (any thread); 0 or LLM_EIO. */
static int read_file(const wk_tier *t, uint64_t key, char *buf) {
    char p[600];
    path_of(t, key, ".kvb", p, sizeof p);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    size_t got = 0;
    while (fd >= 0 && got < t->file_bytes) {
        ssize_t r = pread(fd, buf + got, t->file_bytes - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    struct stat sb;
    int whole = fd >= 0 && got == t->file_bytes && !fstat(fd, &sb) && (size_t)sb.st_size == t->file_bytes;
    if (fd >= 0) close(fd);
    return whole && !wk_tier_check_file(buf, t->file_bytes, t->o.block_size, t->o.block_bytes, t->o.fingerprint)
               ? 0
               : LLM_EIO;
}

/* The file in buf is slot i's block (the checks passed for its own header). */
static int file_is(const wk_tier *t, int32_t i, const char *buf) {
    const unsigned char *h = (const unsigned char *)buf;
    return same(t, i, get_u64(h + 24), get_u64(h + 32), get_u64(h + 40), (const int32_t *)(const void *)(h + WK_TIER_HEADER));
}

static void *writer(void *arg) {
    wk_tier *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->todo && !t->io_stop) pthread_cond_wait(&t->cv, &t->mu);
        if (!t->todo) break; /* stopping, and every queued block is written */
        job *j = t->todo;
        t->todo = j->next;
        if (!t->todo) t->todo_tail = NULL;
        t->todo_bytes -= t->file_bytes;
        t->io_busy = 1;
        pthread_mutex_unlock(&t->mu);
        j->ok = j->read ? read_file(t, j->key, j->buf) == 0 : write_file(t, j, &j->err) == 0;
        pthread_mutex_lock(&t->mu);
        j->next = t->done;
        t->done = j;
        t->io_busy = 0;
        if (!t->todo) pthread_cond_broadcast(&t->idle);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* Slot i leaves list k (its payload or its file goes); the slot itself when it is held nowhere now. 1 then. */
static int drop_from(wk_tier *t, int32_t i, int k) {
    lru_unlink(t, i, k);
    event(t, WK_EV_REMOVED, i, k ? WK_TIER_DISK : WK_TIER_RAM);
    if (k) {
        char p[600];
        path_of(t, t->e[i].key, ".kvb", p, sizeof p);
        unlink(p);
    } else {
        free(t->e[i].data);
        t->e[i].data = NULL;
    }
    if (t->e[i].in[0] || t->e[i].in[1] || t->e[i].pending || t->e[i].reading) return 0;
    slot_free(t, i);
    return 1;
}

static void refuse_file(wk_tier *t, int32_t i) {
    char p[600];
    path_of(t, t->e[i].key, ".kvb", p, sizeof p);
    CM_WARN("KV disk tier: %s is truncated or corrupt: dropped, the block is recomputed", p);
    t->st.corrupt++;
    drop_from(t, i, 1);
}

/* Slot i into memory with its payload d (taken). */
static void add_ram(wk_tier *t, int32_t i, char *d) {
    while (t->l[0].n && t->l[0].bytes + t->o.block_bytes > t->o.ram_bytes)
        t->st.dropped += (uint64_t)drop_from(t, t->l[0].head, 0);
    t->e[i].data = d;
    t->e[i].from_disk = 0; /* the reader sets it after, for what it brings */
    lru_push(t, i, 0);
    event(t, WK_EV_STORED, i, WK_TIER_RAM);
}

/* The I/O thread is IO_QUEUE_BYTES behind. */
static int queue_full(wk_tier *t) {
    pthread_mutex_lock(&t->mu);
    int full = t->todo_bytes + t->file_bytes > IO_QUEUE_BYTES;
    pthread_mutex_unlock(&t->mu);
    return full;
}

static void enqueue(wk_tier *t, job *j) {
    pthread_mutex_lock(&t->mu);
    if (t->todo_tail) t->todo_tail->next = j;
    else t->todo = j;
    t->todo_tail = j;
    t->todo_bytes += t->file_bytes;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* Slot i's file to the writer, from payload (copied); 0 or LLM_EIO (it will not be on disk). */
static int add_disk(wk_tier *t, int32_t i, const void *payload) {
    if (!t->dir || t->file_bytes > t->o.disk_bytes) return LLM_EIO;
    size_t tl = sizeof(int32_t) * (size_t)t->o.block_size;
    int full = queue_full(t);
    job *j = full ? NULL : malloc(sizeof *j + tl + t->o.block_bytes);
    if (!j) { /* the writer is that far behind (or no memory): this block is not written */
        t->st.write_errors++;
        return LLM_EIO;
    }
    *j = (job){.key = t->e[i].key, .parent = t->e[i].parent, .salt = t->e[i].salt};
    memcpy(job_tok(j), t->toks + (size_t)i * t->o.block_size, tl);
    memcpy(job_payload(t, j), payload, t->o.block_bytes);
    t->e[i].pending = 1;
    enqueue(t, j);
    return 0;
}

/* The writer's answers: a block written joins the disk tier (the oldest files go for room), one that failed
 * is counted and, held nowhere else, dropped. */
static void poll_io(wk_tier *t) {
    if (!t->io_on) return;
    pthread_mutex_lock(&t->mu);
    job *d = t->done;
    t->done = NULL;
    pthread_mutex_unlock(&t->mu);
    job *r = NULL; /* oldest first */
    while (d) {
        job *n = d->next;
        d->next = r;
        r = d;
        d = n;
    }
    while (r) {
        job *j = r;
        r = r->next;
        int32_t i = by_key(t, j->key);
        if (j->read) { /* a block read ahead: into memory, where the admission finds it */
            if (i >= 0 && t->e[i].reading) {
                t->e[i].reading = 0;
                char *mem = NULL;
                if (t->e[i].in[1] && (!j->ok || !file_is(t, i, j->buf))) refuse_file(t, i);
                else if (t->e[i].in[1] && !t->e[i].in[0] && (mem = malloc(t->o.block_bytes))) {
                    memcpy(mem, j->buf + WK_TIER_HEADER + sizeof(int32_t) * (size_t)t->o.block_size, t->o.block_bytes);
                    add_ram(t, i, mem);
                    t->e[i].from_disk = 1;
                } else if (!t->e[i].in[0] && !t->e[i].in[1] && !t->e[i].pending) {
                    slot_free(t, i);
                }
            }
            free(j->buf);
            free(j);
            continue;
        }
        if (i >= 0 && t->e[i].pending) {
            t->e[i].pending = 0;
            if (j->ok) {
                while (t->l[1].n && t->l[1].bytes + t->file_bytes > t->o.disk_bytes)
                    t->st.dropped += (uint64_t)drop_from(t, t->l[1].head, 1);
                lru_push(t, i, 1);
                event(t, WK_EV_STORED, i, WK_TIER_DISK);
            } else {
                if (!t->st.write_errors) {
                    char p[600];
                    path_of(t, j->key, ".tmp", p, sizeof p);
                    CM_WARN("KV disk tier: cannot write %s: %s (counted; the block is not kept on disk)", p,
                            strerror(j->err));
                }
                t->st.write_errors++;
                if (!t->e[i].in[0] && !t->e[i].in[1] && !t->e[i].reading) {
                    slot_free(t, i);
                    t->st.dropped++;
                }
            }
        }
        free(j);
    }
}

void wk_tier_flush(wk_tier *t) {
    if (!t->io_on) return;
    pthread_mutex_lock(&t->mu);
    while (t->todo || t->io_busy) pthread_cond_wait(&t->idle, &t->mu);
    pthread_mutex_unlock(&t->mu);
    poll_io(t);
}

/* ---- the store ------------------------------------------------------------ */

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

typedef struct {
    double mtime;
    int32_t slot;
} aged;

static int by_age(const void *a, const void *b) {
    double x = ((const aged *)a)->mtime, y = ((const aged *)b)->mtime;
    return x < y ? -1 : x > y;
}

/* Indexes the block files already in the directory, oldest first. */
static int scan(wk_tier *t) {
    DIR *d = opendir(t->dir);
    if (!d) return LLM_EIO;
    aged *a = NULL;
    int n = 0, cap = 0, bad = 0, rc = 0;
    size_t tl = sizeof(int32_t) * (size_t)t->o.block_size;
    unsigned char *h = malloc(WK_TIER_HEADER + tl);
    if (!h) rc = LLM_ENOMEM;
    struct dirent *de;
    while (!rc && (de = readdir(d))) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", t->dir, de->d_name);
        if (ends_with(de->d_name, ".tmp")) { /* a write a crash cut short */
            unlink(p);
            continue;
        }
        if (!ends_with(de->d_name, ".kvb")) continue;
        uint64_t named = strtoull(de->d_name, NULL, 16);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        struct stat sb;
        int ok = fd >= 0 && !fstat(fd, &sb) && (size_t)sb.st_size == t->file_bytes &&
                 pread(fd, h, WK_TIER_HEADER + tl, 0) == (ssize_t)(WK_TIER_HEADER + tl) &&
                 header_ok(h, t->o.block_size, t->o.block_bytes, t->o.fingerprint) && get_u64(h + 24) == named &&
                 by_key(t, named) < 0;
        if (fd >= 0) close(fd);
        if (ok) {
            int32_t *tok = (int32_t *)(void *)(h + WK_TIER_HEADER);
            ok = cm_block_key(get_u64(h + 32), get_u64(h + 40), tok, t->o.block_size) == named;
        }
        if (!ok) {
            unlink(p);
            bad++;
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            aged *na = realloc(a, sizeof *a * (size_t)cap);
            if (!na) {
                rc = LLM_ENOMEM;
                break;
            }
            a = na;
        }
        int32_t i = slot_new(t, named, get_u64(h + 32), get_u64(h + 40), (int32_t *)(void *)(h + WK_TIER_HEADER));
        if (i < 0) {
            rc = LLM_ENOMEM;
            break;
        }
        a[n++] = (aged){(double)sb.st_mtim.tv_sec + 1e-9 * (double)sb.st_mtim.tv_nsec, i};
    }
    closedir(d);
    if (!rc) {
        if (n) qsort(a, (size_t)n, sizeof *a, by_age);
        for (int k = 0; k < n; k++) lru_push(t, a[k].slot, 1);
        while (t->l[1].bytes > t->o.disk_bytes) drop_from(t, t->l[1].head, 1);
        t->st.corrupt += (uint64_t)bad;
        if (n || bad)
            CM_INFO("KV disk tier %s: %" PRIu64 " blocks found (%.1f MiB)%s%d unusable file(s) removed", t->dir,
                    t->l[1].n, (double)t->l[1].bytes / 1048576.0, bad ? ", " : "", bad);
    }
    free(a);
    free(h);
    return rc;
}

static int mkdir_p(const char *path) {
    char p[600];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0700) && errno != EEXIST) return -1;
            *s = '/';
        }
    return mkdir(p, 0700) && errno != EEXIST ? -1 : 0;
}

int wk_tier_create(const wk_tier_opts *o, wk_tier **out, char *err, size_t errlen) {
    *out = NULL;
    if (o->block_size <= 0 || !o->block_bytes || (!o->ram_bytes && !o->disk_dir)) {
        snprintf(err, errlen, "KV tiers: nothing to hold");
        return LLM_EINVAL;
    }
    wk_tier *t = calloc(1, sizeof *t);
    if (!t) return LLM_ENOMEM;
    t->o = *o;
    t->o.disk_dir = NULL;
    t->free_slot = -1;
    for (int k = 0; k < 2; k++) t->l[k] = (lru){-1, -1, 0, 0};
    t->file_bytes = WK_TIER_HEADER + sizeof(int32_t) * (size_t)o->block_size + o->block_bytes;
    int rc = grow(t);
    if (!rc && o->disk_dir) {
        size_t n = strlen(o->disk_dir) + 24;
        t->dir = malloc(n);
        t->scratch = malloc(t->file_bytes);
        if (!t->dir || !t->scratch) rc = LLM_ENOMEM;
        else {
            snprintf(t->dir, n, "%s/%016" PRIx64, o->disk_dir, o->fingerprint);
            char probe[600];
            snprintf(probe, sizeof probe, "%s/.probe", t->dir);
            int fd = -1;
            if (strlen(t->dir) > 500 || mkdir_p(t->dir) || (fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0600)) < 0) {
                snprintf(err, errlen, "--kv-offloading-dir: cannot write in %s: %s", t->dir,
                         strlen(t->dir) > 500 ? "path too long" : strerror(errno));
                rc = LLM_EIO;
            } else {
                close(fd);
                unlink(probe);
                rc = scan(t);
                if (rc) snprintf(err, errlen, "--kv-offloading-dir: cannot read %s: %s", t->dir, cm_strerror(rc));
            }
        }
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    pthread_cond_init(&t->idle, NULL);
    if (!rc && t->dir) {
        if (pthread_create(&t->io, NULL, writer, t)) {
            snprintf(err, errlen, "KV tiers: cannot start the disk writer thread");
            rc = LLM_ENOMEM;
        } else {
            t->io_on = 1;
        }
    }
    if (rc) {
        if (!err[0]) snprintf(err, errlen, "KV tiers: %s", cm_strerror(rc));
        wk_tier_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void wk_tier_free(wk_tier *t) {
    if (!t) return;
    if (t->io_on) { /* what is queued is written first: a stop keeps it */
        pthread_mutex_lock(&t->mu);
        t->io_stop = 1;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->io, NULL);
        while (t->done) {
            job *j = t->done;
            t->done = j->next;
            free(j);
        }
    }
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    pthread_cond_destroy(&t->idle);
    for (int i = 0; i < t->cap; i++) free(t->e[i].data);
    free(t->e);
    free(t->toks);
    free(t->bucket);
    free(t->scratch);
    free(t->dir);
    free(t);
}

void wk_tier_put(wk_tier *t, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok,
                 void (*fill)(void *ctx, void *dst), void *ctx) {
    poll_io(t);
    int ram = t->o.ram_bytes >= t->o.block_bytes;
    int32_t i = by_key(t, key);
    if (i >= 0 && !same(t, i, key, parent, salt, tok)) return; /* another block under its key: that one stays */
    if (i >= 0 && (t->e[i].in[0] || !ram) && (t->e[i].in[1] || t->e[i].pending || !t->dir)) { /* held where it can be */
        touch(t, i);
        return;
    }
    if (i < 0 && !ram && !t->dir) return;
    char *d = malloc(t->o.block_bytes);
    if (!d) return;
    fill(ctx, d);
    if (i >= 0) /* on disk, back into memory too (or in memory, where an earlier write failed) */
        touch(t, i);
    else if ((i = slot_new(t, key, parent, salt, tok)) < 0) {
        free(d);
        return;
    } else {
        t->st.puts++;
        t->st.bytes_out += t->o.block_bytes;
    }
    if (!t->e[i].in[1] && !t->e[i].pending && t->dir) add_disk(t, i, d);
    if (!t->e[i].in[0] && ram) {
        add_ram(t, i, d);
        d = NULL;
    }
    free(d);
    if (!t->e[i].in[0] && !t->e[i].in[1] && !t->e[i].pending && !t->e[i].reading) {
        slot_free(t, i);
        t->st.dropped++;
    }
}

int wk_tier_prefetch(wk_tier *t, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok) {
    poll_io(t);
    int32_t i = by_key(t, key);
    if (i < 0 || !same(t, i, key, parent, salt, tok)) return 0;
    ent *x = &t->e[i];
    if (x->in[0]) return 1;
    if (x->reading) return 2;
    if (!x->in[1]) return 0;
    if (!t->io_on || t->o.ram_bytes < t->o.block_bytes) return 1; /* no memory to read into: a load reads it */
    int full = queue_full(t);
    job *j = full ? NULL : calloc(1, sizeof *j);
    if (j) j->buf = malloc(t->file_bytes);
    if (!j || !j->buf) {
        if (j) free(j);
        return 1;
    }
    j->key = key;
    j->read = 1;
    x->reading = 1;
    enqueue(t, j);
    return 2;
}

int wk_tier_find(wk_tier *t, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok) {
    poll_io(t);
    int32_t i = by_key(t, key);
    if (i < 0 || !same(t, i, key, parent, salt, tok)) return 0;
    return t->e[i].in[0] ? WK_TIER_RAM : t->e[i].in[1] ? WK_TIER_DISK : 0;
}

static void count_load(wk_tier *t, double t0) {
    static const double edge[7] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10};
    double ms = (cm_now() - t0) * 1e3;
    int b = 0;
    while (b < 7 && ms > edge[b]) b++;
    t->st.load_ms_bucket[b]++;
    t->st.load_ms_sum += ms;
    t->st.bytes_in += t->o.block_bytes;
}

int wk_tier_load(wk_tier *t, uint64_t key, uint64_t parent, uint64_t salt, const int32_t *tok,
                 void (*store)(void *ctx, const void *src), void *ctx) {
    poll_io(t);
    int32_t i = by_key(t, key);
    if (i < 0 || !same(t, i, key, parent, salt, tok)) return LLM_ENOTFOUND;
    double t0 = cm_now();
    if (t->e[i].in[0]) { /* the pool holds it now: memory lets it go (the disk keeps its copy) */
        store(ctx, t->e[i].data);
        if (t->e[i].from_disk) t->st.disk_hits++;
        else t->st.ram_hits++;
        count_load(t, t0);
        if (t->e[i].in[1]) touch(t, i);
        drop_from(t, i, 0);
        return 0;
    }
    if (!t->e[i].in[1]) return LLM_ENOTFOUND;
    if (read_file(t, key, t->scratch) || !file_is(t, i, t->scratch)) {
        refuse_file(t, i);
        return LLM_EIO;
    }
    store(ctx, t->scratch + WK_TIER_HEADER + sizeof(int32_t) * (size_t)t->o.block_size);
    touch(t, i);
    t->st.disk_hits++;
    count_load(t, t0);
    return 0;
}

void wk_tier_each_key(wk_tier *t, void (*fn)(void *ctx, uint64_t key, int tier), void *ctx) {
    poll_io(t);
    for (int i = 0; i < t->cap; i++)
        for (int k = 0; k < 2; k++)
            if (t->e[i].in[k]) fn(ctx, t->e[i].key, k ? WK_TIER_DISK : WK_TIER_RAM);
}

void wk_tier_get_stats(wk_tier *t, wk_tier_stats *st) {
    poll_io(t);
    *st = t->st;
    st->ram_blocks = t->l[0].n;
    st->ram_bytes = t->l[0].bytes;
    st->disk_blocks = t->l[1].n;
    st->disk_bytes = t->l[1].bytes;
}
