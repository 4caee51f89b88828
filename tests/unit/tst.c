#include "tst.h"

int tst_failures, tst_checks;

int tst_done(const char *name) {
    printf("%s: %d checks, %d failed\n", name, tst_checks, tst_failures);
    return tst_failures ? 1 : 0;
}
