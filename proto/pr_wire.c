#include "pr_wire.h"
#include "cm_error.h"

#include <stdio.h>
#include <stdlib.h>

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

int pr_send(nng_socket s, pr_env *env, int flags) {
    env->version = PR_VERSION;
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
