/* rstore_test: the memory kind of the response store (gw_rstore.h), on a
 * real event loop: callbacks come later, never inside the call; a get finds
 * what a put stored and nothing else; the entry bound and the byte bound
 * evict the oldest first; entries expire after the TTL; a delete says
 * whether it found the key; URLs are checked at open (Redis itself is
 * exercised against a real redis-server by test_responses_cluster.py). */
#include "cm_error.h"
#include "gw_rstore.h"
#include "tst.h"

#include <event2/event.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int calls, rc;
    char val[256];
} res;

static void cb(void *arg, int rc, const char *val, size_t len) {
    res *r = arg;
    r->calls++;
    r->rc = rc;
    r->val[0] = 0;
    if (val && len < sizeof r->val) memcpy(r->val, val, len), r->val[len] = 0;
}

static struct event_base *base;

/* Runs the loop until r has its answer. */
static void settle(res *r) {
    for (int i = 0; i < 100 && !r->calls; i++) event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
}

static int get(gw_rstore *s, const char *k, char *out) {
    res r = {0};
    gw_rstore_get(s, k, cb, &r);
    CHECK_INT(r.calls, 0); /* never inside the call */
    settle(&r);
    CHECK_INT(r.calls, 1);
    if (out) strcpy(out, r.val);
    return r.rc;
}

static int put(gw_rstore *s, const char *k, const char *v) {
    res r = {0};
    gw_rstore_put(s, k, v, strlen(v), cb, &r);
    CHECK_INT(r.calls, 0);
    settle(&r);
    CHECK_INT(r.calls, 1);
    return r.rc;
}

int main(void) {
    base = event_base_new();
    char err[300], v[256];
    gw_rstore *s = NULL;
    /* URLs */
    CHECK_RC(gw_rstore_open(base, "mongodb://x", 60, 3, 1 << 20, 1, &s, err, sizeof err), LLM_EINVAL);
    CHECK(strstr(err, "--response-store") != NULL && s == NULL);
#ifdef LLMSERVE_HIREDIS
    CHECK_RC(gw_rstore_open(base, "redis://:pw@host:99999", 60, 3, 1 << 20, 1, &s, err, sizeof err), LLM_EINVAL);
    CHECK_RC(gw_rstore_open(base, "redis://host/x", 60, 3, 1 << 20, 1, &s, err, sizeof err), LLM_EINVAL);
    CHECK_RC(gw_rstore_open(base, "redis:///0", 60, 3, 1 << 20, 1, &s, err, sizeof err), LLM_EINVAL);
    CHECK_RC(gw_rstore_open(base, "redis://:pw@10.0.0.1:6380/3", 60, 3, 1 << 20, 1, &s, err, sizeof err), 0);
    CHECK(s && !strcmp(gw_rstore_kind(s), "redis"));
    gw_rstore_free(s); /* never connected: nothing pending */
#endif
    /* the entry bound: 3 */
    CHECK_RC(gw_rstore_open(base, NULL, 60, 3, 1 << 20, 1, &s, err, sizeof err), 0);
    CHECK(!strcmp(gw_rstore_kind(s), "memory"));
    CHECK_RC(get(s, "t:a", NULL), LLM_ENOTFOUND);
    CHECK_RC(put(s, "t:a", "A"), 0);
    CHECK_RC(get(s, "t:a", v), 0);
    CHECK(!strcmp(v, "A"));
    CHECK_RC(get(s, "u:a", NULL), LLM_ENOTFOUND); /* another tenant's key */
    CHECK_RC(put(s, "t:b", "B"), 0);
    CHECK_RC(put(s, "t:c", "C"), 0);
    CHECK_RC(put(s, "t:a", "A2"), 0); /* replaced: a is now the newest */
    CHECK_RC(put(s, "t:d", "D"), 0);  /* evicts b, the oldest */
    CHECK_RC(get(s, "t:b", NULL), LLM_ENOTFOUND);
    CHECK_RC(get(s, "t:a", v), 0);
    CHECK(!strcmp(v, "A2"));
    gw_rstore_stats st;
    gw_rstore_stats_get(s, &st);
    CHECK_INT(st.entries, 3);
    CHECK_INT(st.evicted, 1);
    res r = {0};
    gw_rstore_del(s, "t:c", cb, &r);
    settle(&r);
    CHECK_RC(r.rc, 0);
    r.calls = 0;
    gw_rstore_del(s, "t:c", cb, &r);
    settle(&r);
    CHECK_RC(r.rc, LLM_ENOTFOUND);
    /* freed with an answer pending: it is answered (from the free), once */
    r.calls = 0;
    gw_rstore_get(s, "t:a", cb, &r);
    gw_rstore_free(s);
    CHECK_INT(r.calls, 1);
    /* the byte bound: 64 bytes of key + value */
    CHECK_RC(gw_rstore_open(base, "memory", 60, 100, 64, 1, &s, err, sizeof err), 0);
    CHECK_RC(put(s, "k1", "0123456789012345678901234567"), 0); /* 30 bytes */
    CHECK_RC(put(s, "k2", "0123456789012345678901234567"), 0); /* 60 */
    CHECK_RC(put(s, "k3", "0123456789"), 0);                   /* 72 > 64: k1 goes */
    CHECK_RC(get(s, "k1", NULL), LLM_ENOTFOUND);
    CHECK_RC(get(s, "k2", NULL), 0);
    char big[100];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    CHECK_RC(put(s, "k4", big), LLM_ERANGE); /* larger than the whole store: refused, nothing evicted */
    CHECK_RC(get(s, "k3", NULL), 0);
    gw_rstore_free(s);
    /* the TTL */
    CHECK_RC(gw_rstore_open(base, "memory", 0.2, 100, 1 << 20, 1, &s, err, sizeof err), 0);
    CHECK_RC(put(s, "e", "E"), 0);
    CHECK_RC(get(s, "e", NULL), 0);
    usleep(300000);
    CHECK_RC(get(s, "e", NULL), LLM_ENOTFOUND);
    gw_rstore_stats_get(s, &st);
    CHECK_INT(st.entries, 0);
    gw_rstore_free(s);
    event_base_free(base);
    return tst_done("rstore_test");
}
