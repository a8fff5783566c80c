/* fuzz-decisions.c: libFuzzer target for Parcae decisions files (plan_decisions_parse), which
 * `spottrain simulate --policy parcae` reads.
 *
 * Any bytes give decisions with non-negative counts and shapes, or -EINVAL with a message. */
#include <string.h>

#include "fuzz.h"
#include "planner.h"

static int one(const uint8_t *data, size_t size) {
    struct plan_decisions *d = NULL;
    struct st_error e;
    memset(&e, 0, sizeof(e));
    int r = plan_decisions_parse("fuzz.json", (const char *)data, size, &d, &e);
    if (fuzz_parse_refused(r, &e))
        return r;
    FUZZ_CHECK(d && d->n >= 0);
    for (int i = 0; i < d->n; i++)
        for (int k = 0; k < 3; k++)
            FUZZ_CHECK(d->intervals[i][k] >= 0 && d->shapes[i][k][0] >= 0 &&
                       d->shapes[i][k][1] >= 0);
    plan_decisions_free(d);
    return 0;
}

FUZZ_INIT_QUIET()

FUZZ_TARGET(one)
