/* pr_wire.h - framing of the protobuf-c messages on NNG sockets.
 *
 * Every message is one Envelope carrying PR_VERSION. Decoding checks the
 * size limit, the protobuf encoding, the version and that a body is present,
 * so callers only ever see well-formed envelopes of their own version. */
#ifndef PR_WIRE_H
#define PR_WIRE_H

#include "llmserve.pb-c.h"

#include <nng/nng.h>
#include <stddef.h>
#include <stdint.h>

#define PR_VERSION 2 /* 2: incarnations, ModelInfo (stateless gateways) */
#define PR_MAX_MSG (16u << 20) /* bytes; also the sockets' NNG_OPT_RECVMAXSZ */

typedef Llmserve__Envelope pr_env;

/* buf[0..len) -> *out (free with pr_free). LLM_ETRUNC / LLM_EFORMAT for a
 * malformed message, LLM_EUNSUP for another version (*peer_version set),
 * LLM_ERANGE for an oversized one. */
int pr_decode(const void *buf, size_t len, pr_env **out, uint32_t *peer_version, char *err, size_t errlen);
void pr_free(pr_env *e);

/* Packs env (its version is set here) and sends it. flags: 0 or
 * NNG_FLAG_NONBLOCK. Returns 0, LLM_EAGAIN (would block), LLM_ETIMEDOUT,
 * or LLM_EIO. */
int pr_send(nng_socket s, pr_env *env, int flags);
/* Receives one message; same decoding rules as pr_decode. LLM_EAGAIN /
 * LLM_ETIMEDOUT when nothing came. */
int pr_recv(nng_socket s, pr_env **out, int flags, uint32_t *peer_version, char *err, size_t errlen);

/* The shared secret of a deployment (--rpc-secret-file): once set, every
 * message sent carries it and every message received must carry the same
 * (compared in constant time), else pr_decode refuses it with LLM_EAUTH.
 * Reads the file's first line (surrounding whitespace trimmed, 16 to 1024
 * bytes); a file others can read is refused (pr_secret_mode_ok).
 * Process-wide; 0 or LLM_E*. */
int pr_load_secret_file(const char *path, char *err, size_t errlen);
/* The rule a secret file's permissions must meet: nothing for others; group
 * read only when the group is one of this process's own (a Kubernetes Secret
 * mounted with defaultMode 0400 under a pod's fsGroup is 0440, group
 * fsGroup, which the container's process holds) and never group write. */
int pr_secret_mode_ok(unsigned mode, unsigned gid);
int pr_set_secret(const void *secret, size_t len);
/* The secret (length 0 when none is set), for channels that are not
 * Envelopes (the TP group's join). */
size_t pr_secret(const uint8_t **s);
/* 1 when s matches the secret (or none is set), in constant time. */
int pr_secret_check(const void *s, size_t len);

/* An empty Envelope at this protocol version, for building messages on the
 * stack: the caller sets body_case and points the body at its message. */
void pr_env_init(pr_env *e);

/* Maps an NNG error to LLM_E*. */
int pr_nng_err(int rv);

#endif
