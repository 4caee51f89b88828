#include "pr_wire.h"
#include "cm_error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void pr_env_init(pr_env *e) {
    llmserve__envelope__init(e);
    e->version = PR_VERSION;
}

int pr_nng_err(int rv) {
    switch (rv) {
    case 0: return 0;
    case NNG_EAGAIN: return LLM_EAGAIN;
    case NNG_ETIMEDOUT: return LLM_ETIMEDOUT;
    case NNG_ENOMEM: return LLM_ENOMEM;
    case NNG_EINVAL: return LLM_EINVAL;
    default: return LLM_EIO;
    }
}

static uint8_t secret[1024];
static size_t secret_len;

int pr_set_secret(const void *s, size_t len) {
    if (len > sizeof secret) return LLM_ERANGE;
    memcpy(secret, s, len);
    secret_len = len;
    return 0;
}

/* Whether gid is one of this process's groups (its own or a supplementary one). */
static int own_group(gid_t gid) {
    if (gid == getegid()) return 1;
    gid_t gs[256];
    int n = getgroups(256, gs);
    for (int i = 0; i < n; i++)
        if (gs[i] == gid) return 1;
    return 0;
}

int pr_secret_mode_ok(unsigned mode, unsigned gid) {
    if (mode & 007) return 0;                               /* anyone on the host */
    if ((mode & 070) && (mode & 020 || !own_group((gid_t)gid))) return 0; /* a group we are not in, or one that may write */
    return 1;
}

int pr_load_secret_file(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "--rpc-secret-file %s: %s", path, fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0) close(fd);
        return LLM_EIO;
    }
    if (!pr_secret_mode_ok(st.st_mode, st.st_gid)) {
        snprintf(err, errlen, "--rpc-secret-file %s: readable by others (mode %03o, group %u): chmod 600 it, or 640 "
                 "with a group of this process's own", path, (unsigned)(st.st_mode & 0777), (unsigned)st.st_gid);
        close(fd);
        return LLM_EINVAL;
    }
    char buf[2048];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0) n = 0;
    buf[n] = 0;
    char *p = buf;
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
    size_t l = strcspn(p, "\r\n");
    while (l && (p[l - 1] == ' ' || p[l - 1] == '\t')) l--;
    if (l < 16 || l > sizeof secret) {
        snprintf(err, errlen, "--rpc-secret-file %s: the secret must be 16 to %zu bytes on its first line, not %zu",
                 path, sizeof secret, l);
        return LLM_EINVAL;
    }
    return pr_set_secret(p, l);
}

size_t pr_secret(const uint8_t **s) {
    *s = secret;
    return secret_len;
}

/* Constant time in the secret's length: no early exit on the first difference. */
int pr_secret_check(const void *s, size_t len) {
    if (!secret_len) return 1;
    if (len != secret_len) return 0;
    const uint8_t *b = s;
    uint8_t d = 0;
    for (size_t i = 0; i < secret_len; i++) d |= (uint8_t)(b[i] ^ secret[i]);
    return d == 0;
}

static int secret_ok(const pr_env *e) {
    if (!secret_len) return 1;
    return e->has_secret && pr_secret_check(e->secret.data, e->secret.len);
}

int pr_decode(const void *buf, size_t len, pr_env **out, uint32_t *peer_version, char *err, size_t errlen) {
    *out = NULL;
    if (peer_version) *peer_version = 0;
    if (len > PR_MAX_MSG) {
        snprintf(err, errlen, "message of %zu bytes exceeds the limit of %u", len, PR_MAX_MSG);
        return LLM_ERANGE;
    }
    pr_env *e = llmserve__envelope__unpack(NULL, len, buf);
    if (!e) {
        snprintf(err, errlen, "malformed message (%zu bytes)", len);
        return LLM_EFORMAT;
    }
    if (e->version != PR_VERSION) {
        if (peer_version) *peer_version = e->version;
        snprintf(err, errlen, "peer speaks protocol version %u, this side version %u", e->version, PR_VERSION);
        llmserve__envelope__free_unpacked(e, NULL);
        return LLM_EUNSUP;
    }
    if (!secret_ok(e)) {
        snprintf(err, errlen, "message without the shared secret (--rpc-secret-file)");
        llmserve__envelope__free_unpacked(e, NULL);
        return LLM_EAUTH;
    }
    if (e->body_case == LLMSERVE__ENVELOPE__BODY__NOT_SET) {
        snprintf(err, errlen, "message without a body");
        llmserve__envelope__free_unpacked(e, NULL);
        return LLM_EFORMAT;
    }
    *out = e;
    return 0;
}

void pr_free(pr_env *e) {
    if (e) llmserve__envelope__free_unpacked(e, NULL);
}

#if !defined(__SANITIZE_ADDRESS__) && defined(__has_feature)
#if __has_feature(address_sanitizer)
#define __SANITIZE_ADDRESS__ 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
/* A message nng_sendmsg accepted belongs to nng. nng before 1.7 loses one
 * when a socket closes while a pipe's send is being cancelled (upstream
 * issue 1713: the transport's pipe_send returns on a cancelled aio without
 * freeing it); Debian ships 1.5.2, so the leak checker would now and then
 * report the worker's or gateway's last message to a closing peer. Only
 * allocations made inside pr_send are excused: pr_send frees a message
 * nng refused, so what leaks from here was nng's to free. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:pr_send\n"; }
#endif

int pr_send(nng_socket s, pr_env *env, int flags) {
    env->version = PR_VERSION;
    if (secret_len) {
        env->has_secret = 1;
        env->secret.data = secret;
        env->secret.len = secret_len;
    }
    size_t n = llmserve__envelope__get_packed_size(env);
    if (n > PR_MAX_MSG) return LLM_ERANGE;
    nng_msg *m;
    int rv = nng_msg_alloc(&m, n);
    if (rv) return pr_nng_err(rv);
    llmserve__envelope__pack(env, nng_msg_body(m));
    rv = nng_sendmsg(s, m, flags);
    if (rv) {
        nng_msg_free(m);
        return pr_nng_err(rv);
    }
    return 0;
}

int pr_recv(nng_socket s, pr_env **out, int flags, uint32_t *peer_version, char *err, size_t errlen) {
    *out = NULL;
    nng_msg *m;
    int rv = nng_recvmsg(s, &m, flags);
    if (rv) return pr_nng_err(rv);
    int rc = pr_decode(nng_msg_body(m), nng_msg_len(m), out, peer_version, err, errlen);
    nng_msg_free(m);
    return rc;
}
