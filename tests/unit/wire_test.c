/* proto/pr_wire's shared secret: the permission rule a secret file must
 * meet, on real files (the rule alone, then pr_load_secret_file), the way
 * a Kubernetes Secret is mounted (0440, the pod's fsGroup) and the ways a
 * file leaks (other-readable, a group the process is not in, group-write),
 * and a message carrying the secret against one without it. */
#include "pr_wire.h"
#include "cm_error.h"
#include "tst.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[] = "/tmp/llmserve-wire-XXXXXX";

static int load(const char *name, unsigned mode, long gid, char *err, size_t errlen) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return LLM_EIO;
    fputs("  correct-horse-battery-staple-42\n", f);
    fclose(f);
    if (gid >= 0 && chown(path, (uid_t)-1, (gid_t)gid)) return LLM_EIO;
    chmod(path, mode);
    err[0] = 0;
    int rc = pr_load_secret_file(path, err, errlen);
    unlink(path);
    return rc;
}

/* A group this process is not in, or -1 when it cannot tell one. */
static long foreign_group(void) {
    gid_t gs[256];
    int n = getgroups(256, gs);
    for (long g = 54321; g < 54400; g++) {
        int mine = (gid_t)g == getegid();
        for (int i = 0; i < n; i++) mine |= gs[i] == (gid_t)g;
        if (!mine) return g;
    }
    return -1;
}

int main(void) {
    gid_t own = getegid();
    long other = foreign_group();
    /* the rule alone */
    CHECK(pr_secret_mode_ok(0600, own));
    CHECK(pr_secret_mode_ok(0400, own));
    CHECK(pr_secret_mode_ok(0440, own));  /* a Secret under fsGroup: group read, the process's group */
    CHECK(pr_secret_mode_ok(0640, own));
    CHECK(!pr_secret_mode_ok(0644, own)); /* anyone on the host */
    CHECK(!pr_secret_mode_ok(0604, own));
    CHECK(!pr_secret_mode_ok(0660, own)); /* group write */
    if (other >= 0) CHECK(!pr_secret_mode_ok(0640, (unsigned)other)); /* a group it is not in */

    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char err[512];
    CHECK_RC(load("own.secret", 0600, -1, err, sizeof err), 0);
    CHECK_RC(load("fsgroup.secret", 0440, (long)own, err, sizeof err), 0);
    CHECK_RC(load("world.secret", 0644, -1, err, sizeof err), LLM_EINVAL);
    CHECK(strstr(err, "readable by others") && strstr(err, "mode 644"));
    CHECK_RC(load("gw.secret", 0660, (long)own, err, sizeof err), LLM_EINVAL);
    if (other >= 0 && geteuid() == 0) { /* only root can give a file a group it is not in */
        CHECK_RC(load("foreign.secret", 0640, other, err, sizeof err), LLM_EINVAL);
        CHECK(strstr(err, "group") != NULL);
    } else {
        printf("skip: a file of a foreign group needs root\n");
    }

    /* the secret set: a message that carries it decodes, one without it does not */
    CHECK_RC(load("own.secret", 0600, -1, err, sizeof err), 0);
    const uint8_t *s;
    size_t n = pr_secret(&s);
    CHECK_INT(n, strlen("correct-horse-battery-staple-42"));
    CHECK(pr_secret_check("correct-horse-battery-staple-42", n));
    CHECK(!pr_secret_check("correct-horse-battery-staple-43", n));
    CHECK(!pr_secret_check("short", 5));
    rmdir(dir);
    return tst_done("wire_test");
}
