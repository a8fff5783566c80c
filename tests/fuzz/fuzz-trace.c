/* fuzz-trace.c: libFuzzer target for availability traces (plan_trace_parse: events CSV,
 * counts CSV, `seconds,N`, replay JSONL), as `spottrain simulate` and the sim provider read
 * them.
 *
 * Any bytes give a trace whose counts are consistent, or -EINVAL with a message; never a
 * crash, leak or undefined behaviour. */
#include <string.h>

#include "fuzz.h"
#include "planner.h"

static int one(const uint8_t *data, size_t size) {
    struct plan_trace *t = NULL;
    struct st_error e;
    memset(&e, 0, sizeof(e));
    int r = plan_trace_parse("fuzz.trace", (const char *)data, size, &t, &e);
    if (fuzz_parse_refused(r, &e))
        return r;
    FUZZ_CHECK(t && t->nintervals >= 0);
    for (int i = 0; i < t->nintervals; i++) {
        FUZZ_CHECK(t->iv[i].n_before >= 0 && t->iv[i].n_in >= 0 && t->iv[i].n_out >= 0);
        FUZZ_CHECK(plan_trace_n_after(t, i) >= 0);
    }
    plan_trace_free(t);
    return 0;
}

FUZZ_INIT_QUIET()

FUZZ_TARGET(one)
