/* tst.h - assertion macros for the unit tests: on failure they print both
 * values (and the error string for return codes) and count the failure. */
#ifndef TST_H
#define TST_H

#include <stddef.h>

#include <math.h>
#include <stdio.h>

extern int tst_failures, tst_checks;

#define TST_SKIP 77

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        tst_checks++;                                                                              \
        if (!(cond)) {                                                                             \
            tst_failures++;                                                                        \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_INT(a, b)                                                                            \
    do {                                                                                           \
        long long _a = (long long)(a), _b = (long long)(b);                                        \
        tst_checks++;                                                                              \
        if (_a != _b) {                                                                            \
            tst_failures++;                                                                        \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld vs %lld\n", __FILE__, __LINE__, #a, #b,  \
                    _a, _b);                                                                       \
        }                                                                                          \
    } while (0)

/* rc is an LLM_E* code; prints its name on mismatch */
#define CHECK_RC(rc, want)                                                                         \
    do {                                                                                           \
        int _r = (rc), _w = (want);                                                                \
        tst_checks++;                                                                              \
        if (_r != _w) {                                                                            \
            tst_failures++;                                                                        \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d (%s)\n", __FILE__, __LINE__,  \
                    #rc, _r, cm_strerror(_r), _w, cm_strerror(_w));                                \
        }                                                                                          \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double _a = (double)(a), _b = (double)(b);                                                 \
        tst_checks++;                                                                              \
        if (!(fabs(_a - _b) <= (tol))) {                                                           \
            tst_failures++;                                                                        \
            fprintf(stderr, "%s:%d: %s ~ %s failed: %.9g vs %.9g (tol %g)\n", __FILE__, __LINE__,  \
                    #a, #b, _a, _b, (double)(tol));                                                \
        }                                                                                          \
    } while (0)

/* Relative L2 error of got against want (NaN in got: 1e9, never passes). */
double tst_rel_l2(const float *got, const float *want, size_t n);

/* Monotonic seconds: for printed figures and stall guards, not benchmarks. */
double tst_now(void);

/* Prints the summary line ctest logs and returns the exit code. */
int tst_done(const char *name);

#endif
