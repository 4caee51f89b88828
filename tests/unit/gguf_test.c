/* GGUF reader: valid files of both versions with every metadata type, and
 * truncated, corrupted and hostile ones, which must give errors, never a
 * crash or a read past the end (the buffers are exact-size heap copies, so
 * an ASan build catches any over-read). */
#include "cm_dtype.h"
#include "cm_error.h"
#include "cm_gguf.h"
#include "cm_model.h"
#include "tst.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void str(buf *b, const char *s) { u64(b, strlen(s)); put(b, s, strlen(s)); }
static void key(buf *b, const char *k, uint32_t type) { str(b, k); u32(b, type); }

typedef struct {
    uint32_t version, ndims_override, type_override;
    uint64_t n_kv_override, n_tensors_override, off_override, dup;
} variant;

/* A small model-like file: every scalar type, two arrays, two tensors. */
static buf make(variant v) {
    buf b = {0};
    u32(&b, 0x46554747u);
    u32(&b, v.version ? v.version : 3);
    u64(&b, v.n_tensors_override ? v.n_tensors_override : 2);
    u64(&b, v.n_kv_override ? v.n_kv_override : 16);
    key(&b, "general.architecture", CM_GGUF_STRING); str(&b, "llama");
    key(&b, "general.alignment", CM_GGUF_U32); u32(&b, 64);
    uint8_t u8v = 200; key(&b, "t.u8", CM_GGUF_U8); put(&b, &u8v, 1);
    int8_t i8v = -5; key(&b, "t.i8", CM_GGUF_I8); put(&b, &i8v, 1);
    uint16_t u16v = 60000; key(&b, "t.u16", CM_GGUF_U16); put(&b, &u16v, 2);
    int16_t i16v = -30000; key(&b, "t.i16", CM_GGUF_I16); put(&b, &i16v, 2);
    key(&b, "t.u32", CM_GGUF_U32); u32(&b, 4000000000u);
    int32_t i32v = -2000000000; key(&b, "t.i32", CM_GGUF_I32); put(&b, &i32v, 4);
    float f = 1.5f; key(&b, "t.f32", CM_GGUF_F32); put(&b, &f, 4);
    uint8_t bl = 1; key(&b, "t.bool", CM_GGUF_BOOL); put(&b, &bl, 1);
    key(&b, "t.u64", CM_GGUF_U64); u64(&b, 1ull << 40);
    int64_t i64v = -(1ll << 40); key(&b, "t.i64", CM_GGUF_I64); put(&b, &i64v, 8);
    double d = 2.25; key(&b, "t.f64", CM_GGUF_F64); put(&b, &d, 8);
    key(&b, "t.arr_i32", CM_GGUF_ARRAY); u32(&b, CM_GGUF_I32); u64(&b, 3);
    for (int32_t i = 1; i <= 3; i++) put(&b, &i, 4);
    key(&b, "t.arr_str", CM_GGUF_ARRAY); u32(&b, CM_GGUF_STRING); u64(&b, 2); str(&b, "ab"); str(&b, "");
    key(&b, "t.str", CM_GGUF_STRING); str(&b, "héllo");
    /* tensors: a [32,2] F32 and a [64,1] Q4_0 */
    str(&b, "a.weight"); u32(&b, v.ndims_override ? v.ndims_override : 2); u64(&b, 32); u64(&b, 2);
    for (uint32_t i = 2; i < v.ndims_override; i++) u64(&b, 1);
    u32(&b, v.type_override ? v.type_override : CM_F32); u64(&b, v.off_override ? v.off_override : 0);
    str(&b, v.dup ? "a.weight" : "b.weight"); u32(&b, 1); u64(&b, 64); u32(&b, CM_Q4_0); u64(&b, 256);
    while (b.n % 64) put(&b, "", 1);
    for (int i = 0; i < 64; i++) { float x = (float)i; put(&b, &x, 4); }
    cm_block_q4_0 q[2];
    memset(q, 0x11, sizeof q);
    put(&b, q, sizeof q);
    return b;
}

/* Opens an exact-size heap copy, so reading past its end is an ASan error. */
static int open_copy(const uint8_t *p, size_t n, cm_gguf **g, char *err, size_t errlen) {
    uint8_t *c = malloc(n ? n : 1);
    memcpy(c, p, n);
    int rc = cm_gguf_open_mem(c, n, g, err, errlen);
    if (rc == 0) {
        /* every tensor must lie inside the buffer */
        for (uint64_t i = 0; i < (*g)->n_tensors; i++) {
            const cm_gguf_tensor *t = &(*g)->tensors[i];
            CHECK((const uint8_t *)t->data >= c && (const uint8_t *)t->data + t->nbytes <= c + n);
        }
        cm_gguf_close(*g);
        *g = NULL;
    }
    free(c);
    return rc;
}

static void valid(uint32_t version) {
    buf b = make((variant){.version = version});
    cm_gguf *g;
    char err[256];
    CHECK_RC(cm_gguf_open_mem(b.p, b.n, &g, err, sizeof err), 0);
    if (!g) return;
    uint32_t u;
    uint64_t u6;
    float f;
    int bl;
    cm_str s;
    CHECK_INT(g->version, version);
    CHECK_INT(g->alignment, 64);
    CHECK_RC(cm_gguf_get_u32(g, "t.u8", &u), 0); CHECK_INT(u, 200);
    CHECK_RC(cm_gguf_get_u32(g, "t.u16", &u), 0); CHECK_INT(u, 60000);
    CHECK_RC(cm_gguf_get_u32(g, "t.u32", &u), 0); CHECK_INT(u, 4000000000u);
    CHECK_RC(cm_gguf_get_u32(g, "t.u64", &u), LLM_EFORMAT); /* does not fit */
    CHECK_RC(cm_gguf_get_u64(g, "t.u64", &u6), 0); CHECK_INT(u6, 1ull << 40);
    CHECK_RC(cm_gguf_get_u32(g, "t.i8", &u), LLM_EFORMAT); /* negative */
    CHECK_INT(cm_gguf_find(g, "t.i16")->v.i, -30000);
    CHECK_INT(cm_gguf_find(g, "t.i32")->v.i, -2000000000);
    CHECK_INT(cm_gguf_find(g, "t.i64")->v.i, -(1ll << 40));
    CHECK_RC(cm_gguf_get_f32(g, "t.f32", &f), 0); CHECK_NEAR(f, 1.5, 0);
    CHECK_RC(cm_gguf_get_f32(g, "t.f64", &f), 0); CHECK_NEAR(f, 2.25, 0);
    CHECK_RC(cm_gguf_get_bool(g, "t.bool", &bl), 0); CHECK_INT(bl, 1);
    CHECK_RC(cm_gguf_get_str(g, "t.str", &s), 0); CHECK(cm_str_eq(s, "héllo"));
    CHECK_RC(cm_gguf_get_str(g, "t.u8", &s), LLM_EFORMAT);
    CHECK_RC(cm_gguf_get_str(g, "missing", &s), LLM_ENOTFOUND);
    int at;
    uint64_t an;
    const void *ad;
    CHECK_RC(cm_gguf_get_arr(g, "t.arr_i32", &at, &an, &ad), 0);
    CHECK_INT(an, 3);
    int32_t third;
    memcpy(&third, (const char *)ad + 8, 4);
    CHECK_INT(third, 3);
    cm_str *ss;
    CHECK_RC(cm_gguf_arr_strings(cm_gguf_find(g, "t.arr_str"), &ss), 0);
    CHECK(cm_str_eq(ss[0], "ab") && ss[1].len == 0);
    free(ss);
    const cm_gguf_tensor *a = cm_gguf_find_tensor(g, "a.weight"), *q = cm_gguf_find_tensor(g, "b.weight");
    CHECK(a && q);
    if (a && q) {
        CHECK_INT(a->nbytes, 256);
        CHECK_INT(q->nbytes, 36);
        CHECK_INT(((uintptr_t)a->data - (uintptr_t)b.p) % 64, 0);
        float x;
        memcpy(&x, (const char *)a->data + 4 * 63, 4);
        CHECK_NEAR(x, 63, 0);
    }
    cm_gguf_close(g);
    /* every truncation fails cleanly */
    int bad = 0;
    for (size_t n = 0; n < b.n; n++) {
        char e2[256] = "";
        if (open_copy(b.p, n, &g, e2, sizeof e2) == 0) bad++;
        else if (!e2[0]) bad++; /* an error always says something */
    }
    CHECK_INT(bad, 0);
    free(b.p);
}

static void hostile(void) {
    struct { const char *what; variant v; int want; } cases[] = {
        {"version 1", {.version = 1}, LLM_EUNSUP},
        {"version 4", {.version = 4}, LLM_EUNSUP},
        {"huge kv count", {.n_kv_override = 0xffffffffffffull}, LLM_EFORMAT},
        {"kv count one too many", {.n_kv_override = 17}, 0 /* any error */},
        {"huge tensor count", {.n_tensors_override = 1ull << 60}, LLM_EFORMAT},
        {"five dims", {.ndims_override = 5}, LLM_EFORMAT},
        {"unknown tensor type", {.type_override = 99}, LLM_EUNSUP},
        {"tensor type with wrong block", {.type_override = CM_Q4_K}, LLM_EFORMAT},
        {"misaligned offset", {.off_override = 3}, LLM_EFORMAT},
        {"offset past the end", {.off_override = 1ull << 40}, LLM_ETRUNC},
        {"duplicate tensor", {.dup = 1}, LLM_EFORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        buf b = make(cases[i].v);
        cm_gguf *g;
        char err[256] = "";
        int rc = open_copy(b.p, b.n, &g, err, sizeof err);
        if (cases[i].want) CHECK_RC(rc, cases[i].want);
        else CHECK(rc < 0);
        CHECK(err[0] != 0);
        printf("hostile %-28s -> %s\n", cases[i].what, err);
        free(b.p);
    }
    /* a string length that points far past the end */
    buf b = make((variant){0});
    uint64_t huge = 1ull << 62;
    memcpy(b.p + 24, &huge, 8); /* first key's length */
    cm_gguf *g;
    char err[256];
    CHECK_RC(open_copy(b.p, b.n, &g, err, sizeof err), LLM_ETRUNC);
    /* bad magic */
    b.p[0] = 'X';
    CHECK_RC(open_copy(b.p, b.n, &g, err, sizeof err), LLM_EFORMAT);
    free(b.p);
}

/* Random byte corruption: any outcome but a crash or an over-read. */
static void corrupt(void) {
    buf b = make((variant){0});
    uint64_t s = 12345;
    int ok = 0, fail = 0;
    for (int it = 0; it < 20000; it++) {
        uint8_t *c = malloc(b.n);
        memcpy(c, b.p, b.n);
        int flips = 1 + it % 4;
        for (int k = 0; k < flips; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(s >> 33) % b.n;
            c[pos] = (uint8_t)(s >> 13);
        }
        cm_gguf *g;
        char err[256];
        if (open_copy(c, b.n, &g, err, sizeof err) == 0) ok++;
        else fail++;
        free(c);
    }
    printf("corruption: %d opened, %d refused\n", ok, fail);
    CHECK(fail > 0);
    free(b.p);
}

static void files(void) {
    cm_model_file *m;
    char err[512] = "";
    CHECK_RC(cm_model_open("/nonexistent/model.gguf", &m, err, sizeof err), LLM_EIO);
    CHECK(strstr(err, "/nonexistent/model.gguf") != NULL);
    char path[] = "/tmp/llmserve_gguf_testXXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK(write(fd, "garbage, not a model at all", 27) == 27);
    close(fd);
    CHECK(cm_model_open(path, &m, err, sizeof err) < 0);
    printf("garbage file -> %s\n", err);
    /* a valid GGUF with an unknown architecture */
    buf b = make((variant){0});
    memcpy(b.p + 24 + 8 + 20 + 4 + 8, "xxxxx", 5); /* "llama" -> "xxxxx" */
    fd = open(path, O_WRONLY | O_TRUNC);
    CHECK(write(fd, b.p, b.n) == (ssize_t)b.n);
    close(fd);
    CHECK_RC(cm_model_open(path, &m, err, sizeof err), LLM_EUNSUP);
    CHECK(strstr(err, "unknown architecture 'xxxxx'") != NULL);
    printf("unknown arch -> %s\n", err);
    unlink(path);
    free(b.p);
}

/* 200,000 one-element tensors: the names are checked for duplicates in
 * linear time (pairwise took minutes), and a duplicate at the very end is
 * still found. */
static void many_tensors(void) {
    enum { N = 200000 };
    for (int dup = 0; dup < 2; dup++) {
        buf b = {0};
        u32(&b, 0x46554747u);
        u32(&b, 3);
        u64(&b, N);
        u64(&b, 1);
        key(&b, "general.architecture", CM_GGUF_STRING); str(&b, "llama");
        char name[32];
        for (int i = 0; i < N; i++) {
            snprintf(name, sizeof name, "t.%d", dup && i == N - 1 ? 7 : i);
            str(&b, name); u32(&b, 1); u64(&b, 8); u32(&b, CM_F32); u64(&b, (uint64_t)i * 32);
        }
        while (b.n % 32) put(&b, "", 1);
        uint8_t z[32] = {0};
        for (int i = 0; i < N; i++) put(&b, z, 32);
        cm_gguf *g;
        char err[256] = "";
        double t0 = tst_now();
        int rc = cm_gguf_open_mem(b.p, b.n, &g, err, sizeof err);
        double dt = tst_now() - t0;
        printf("%d tensors%s: opened in %.3f s (rc %d%s%s)\n", N, dup ? " with one duplicate" : "", dt, rc,
               rc ? ": " : "", err);
        CHECK(dt < 20); /* a stall guard, not a benchmark: pairwise checking took over a minute */
        if (dup) {
            CHECK_RC(rc, LLM_EFORMAT);
            CHECK(strstr(err, "duplicate tensor name 't.7'") != NULL);
        } else {
            CHECK_RC(rc, 0);
            if (!rc) {
                CHECK(g->n_tensors == N);
                cm_gguf_close(g);
            }
        }
        free(b.p);
    }
}

/* A FIFO (or any non-regular path) is refused at once: open() without
 * O_NONBLOCK waits forever for a writer. Errors name the file. */
static void special_paths(void) {
    char dir[] = "/tmp/llmserve_gguf_fifoXXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char fifo[64];
    snprintf(fifo, sizeof fifo, "%s/model.gguf", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    char err[512] = "";
    cm_model_file *m;
    cm_gguf *g;
    CHECK_RC(cm_model_open(fifo, &m, err, sizeof err), LLM_EIO);
    CHECK(strstr(err, fifo) && strstr(err, "not a regular file"));
    printf("fifo -> %s\n", err);
    CHECK_RC(cm_gguf_open(fifo, &g, err, sizeof err), LLM_EIO);
    CHECK(strstr(err, fifo) && strstr(err, "not a regular file"));
    CHECK(cm_model_open(dir, &m, err, sizeof err) < 0 && strstr(err, dir));
    printf("directory -> %s\n", err);
    CHECK_RC(cm_gguf_open("/dev/null", &g, err, sizeof err), LLM_EIO);
    CHECK(strstr(err, "/dev/null") != NULL);
    unlink(fifo);
    rmdir(dir);
}

int main(void) {
    valid(3);
    valid(2);
    hostile();
    corrupt();
    files();
    many_tensors();
    special_paths();
    return tst_done("gguf_test");
}
