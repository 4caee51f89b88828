#include "tst.h"

#include <math.h>
#include <time.h>

int tst_failures, tst_checks;

double tst_rel_l2(const float *got, const float *want, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        if (got[i] != got[i]) return 1e9;
        d += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        s += (double)want[i] * want[i];
    }
    return s > 0 ? sqrt(d / s) : sqrt(d);
}

double tst_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tst_done(const char *name) {
    printf("%s: %d checks, %d failed\n", name, tst_checks, tst_failures);
    return tst_failures ? 1 : 0;
}
