/* Fuzz target: the gateway's HTTP handling through a real socket.
 *
 * The whole gateway (gw_life: HTTP with its deadlines and header checks,
 * auth, limits, the handlers, the tokenizer threads, routing) listens on a
 * loopback port. Each input is raw bytes written to a fresh connection; the
 * client then shuts its write side and reads until the gateway closes.
 * What must hold, for every input:
 *   - the reply is empty or starts with an HTTP/1.x status line, and no
 *     reply on the connection is a 500;
 *   - the gateway closes the connection within a bound once its client has
 *     stopped sending (no input holds a connection open);
 *   - once the client has gone, no connection, request, tokenizer job or
 *     file descriptor is left behind.
 * No worker runs (its address is a path nobody listens at): the harness
 * stands in for a worker's handshake with a context length, so a request is
 * parsed, templated and tokenized as for real, then refused at routing with
 * 503 no_workers. The tokenizer and template are LLMSERVE_FUZZ_MODEL's, or
 * the synthetic ones of dummy weights. Requests need the key "fuzzkey". */
#include "cm_log.h"
#include "cm_time.h"
#include "gw.h"
#include "gw_http.h"
#include "gw_life.h"
#include "gw_tokq.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define REPLY_CAP (1u << 20)
#define CLOSE_BOUND_S 10.0

static gw *G;
static int base_fds; /* open descriptors with the gateway idle */
static struct sockaddr_in addr;
static char *reply;

static void fail(const char *why, const uint8_t *reply_bytes, size_t n) {
    fprintf(stderr, "fuzz_http: %s\n--- reply (%zu bytes) ---\n%.*s\n", why, n, (int)(n < 2000 ? n : 2000),
            (const char *)reply_bytes);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *model = getenv("LLMSERVE_FUZZ_MODEL");
    char *args[32];
    int n = 0;
    args[n++] = "fuzz_http";
    args[n++] = "--host=127.0.0.1";
    args[n++] = "--port=0";
    args[n++] = "--workers=ipc:///nonexistent/llmserve-fuzz-http";
    args[n++] = "--api-key=fuzzkey";
    args[n++] = "--header-timeout=2";
    args[n++] = "--body-timeout=2";
    args[n++] = "--tokenizer-threads=1";
    args[n++] = "--log-level=error";
    if (model && *model) {
        static char m[4200];
        snprintf(m, sizeof m, "--model=%s", model);
        args[n++] = m;
    } else {
        args[n++] = "--load-format=dummy";
        args[n++] = "--model-config=smollm2-135m";
    }
    args[n] = NULL;
    G = calloc(1, sizeof *G);
    reply = malloc(REPLY_CAP);
    char err[600] = "";
    if (!G || !reply || gw_conf_parse(&G->conf, n, args) || gw_start(G, err, sizeof err)) {
        fprintf(stderr, "fuzz_http: cannot start the gateway: %s\n", err);
        return 1;
    }
    int port = gw_http_port(G->http);
    if (port <= 0) {
        fprintf(stderr, "fuzz_http: the gateway's port is unknown\n");
        return 1;
    }
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fprintf(stderr, "fuzz_http: gateway on 127.0.0.1:%d, tokenizer of %s\n", port, model && *model ? model : "dummy weights");
    return 0;
}

/* Every status line in the reply: HTTP/1.x NNN, never 500. Replies to
 * pipelined requests follow each other, so each line that starts a reply
 * is checked; a body that happens to hold "HTTP/1.1 " is checked too,
 * which only makes the check stricter. */
static void check_reply(const char *r, size_t n) {
    if (!n) return;
    if (n < 12 || (memcmp(r, "HTTP/1.1 ", 9) && memcmp(r, "HTTP/1.0 ", 9))) fail("the reply is not HTTP", (const uint8_t *)r, n);
    for (size_t i = 0; i + 12 <= n; i++) {
        if (memcmp(r + i, "HTTP/1.", 7) || (i && r[i - 1] != '\n')) continue;
        int st = (r[i + 9] - '0') * 100 + (r[i + 10] - '0') * 10 + (r[i + 11] - '0');
        if (st < 100 || st > 599) fail("a status line without a status", (const uint8_t *)r, n);
        if (st == 500) fail("a 500: the gateway failed inside", (const uint8_t *)r, n);
    }
}

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static void list_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[300], l[300];
        snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(p, l, sizeof l - 1);
        if (n > 0) fprintf(stderr, "  fd %s -> %.*s\n", e->d_name, (int)n, l);
    }
    closedir(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!G) abort();
    G->max_model_len = 8192; /* a worker's handshake would say so */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) abort();
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
    if (connect(s, (struct sockaddr *)&addr, sizeof addr) && errno != EINPROGRESS && errno != EINTR) {
        perror("fuzz_http: connect"); /* libFuzzer's timer interrupts a blocking one: this one does not block */
        abort();
    }
    struct pollfd pc = {s, POLLOUT, 0};
    for (int i = 0; i < 5000 && poll(&pc, 1, 1) != 1; i++) event_base_loop(G->base, EVLOOP_NONBLOCK);
    size_t off = 0, rn = 0;
    int shut = 0;
    double t0 = cm_now();
    for (;;) {
        int progress = 0;
        if (off < size) {
            ssize_t w = send(s, data + off, size - off, MSG_NOSIGNAL);
            if (w > 0) {
                off += (size_t)w;
                progress = 1;
            } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                off = size; /* the gateway has closed: what it said is still to read */
            }
        }
        if (off == size && !shut) {
            shutdown(s, SHUT_WR);
            shut = 1;
        }
        event_base_loop(G->base, EVLOOP_NONBLOCK);
        char buf[16384];
        ssize_t r = recv(s, buf, sizeof buf, 0);
        if (r == 0) break;
        if (r < 0 && errno == ECONNRESET) break;
        if (r > 0) {
            size_t k = (size_t)r < REPLY_CAP - rn ? (size_t)r : REPLY_CAP - rn;
            memcpy(reply + rn, buf, k);
            rn += k;
            progress = 1;
        }
        if (cm_now() - t0 > CLOSE_BOUND_S) fail("the gateway kept the connection open after its client stopped sending",
                                               (const uint8_t *)reply, rn);
        if (!progress) {
            struct pollfd p = {s, POLLIN, 0};
            poll(&p, 1, 1); /* the loop's own events are polled on the next pass */
        }
    }
    close(s);
    check_reply(reply, rn);
    /* the client is gone: what it left must go too */
    t0 = cm_now();
    while (gw_http_open_connections(G->http) || G->req_list || gw_tokq_queued(G->tokq)) {
        if (cm_now() - t0 > CLOSE_BOUND_S) {
            char why[200];
            snprintf(why, sizeof why, "left behind after the client went: %d connections, %s, %d preparing",
                     gw_http_open_connections(G->http), G->req_list ? "requests" : "no requests", gw_tokq_queued(G->tokq));
            fail(why, (const uint8_t *)reply, rn);
        }
        event_base_loop(G->base, EVLOOP_NONBLOCK);
        usleep(200);
    }
    int fds = count_fds();
    if (!base_fds) base_fds = fds; /* after the first input: NNG's and the tokenizer's are open by then */
    for (t0 = cm_now(); fds > base_fds + 4 && cm_now() - t0 < 2.0; fds = count_fds()) {
        event_base_loop(G->base, EVLOOP_NONBLOCK); /* NNG's redials and libFuzzer's corpus writes come and go */
        usleep(1000);
    }
    if (fds > base_fds + 4) {
        char why[160];
        snprintf(why, sizeof why, "file descriptors leak: %d open, %d after the first input", fds, base_fds);
        list_fds();
        fail(why, (const uint8_t *)reply, rn);
    }
    return 0;
}
