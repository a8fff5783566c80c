/* fuzz-profile.c: libFuzzer target for Parcae cost profiles (plan_cost_from_profile), which
 * `spottrain simulate` and `spottrain plan` read.
 *
 * The first byte picks the model name the caller asks for (none = the profile's default, or
 * one of the names in anchors/parcae-cost-profiles.json); the rest is the profile. A profile
 * that loads must answer the questions the planner asks of it without crashing: throughput
 * of every shape, the best shape for some instance counts, p2p and restart times. */
#include <math.h>
#include <string.h>

#include "fuzz.h"
#include "planner.h"

static const char *const models[] = {NULL, "gpt-1.5b_gbs128_mbs1", "gpt-6.7b", "x"};

static int one(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    const char *model = models[data[0] % ST_ARRAY_SIZE(models)];
    struct plan_cost *c = NULL;
    struct st_error e;
    memset(&e, 0, sizeof(e));
    int r = plan_cost_from_profile("fuzz.json", (const char *)data + 1, size - 1, model, &c, &e);
    if (fuzz_parse_refused(r, &e))
        return r;
    for (int dp = 1; dp <= 8; dp++)
        for (int pp = 1; pp <= 8; pp++) {
            double t = plan_cost_throughput(c, dp, pp);
            FUZZ_CHECK(!isnan(t));
            (void)plan_cost_shape_allowed(c, dp, pp);
            (void)plan_cost_restart_ms(c, dp, pp, dp % 2 == 0);
        }
    for (int n = 0; n <= 64; n += 7) {
        struct plan_shape s = plan_cost_best_shape(c, n);
        FUZZ_CHECK(s.dp >= 0 && s.pp >= 0 && (long long)s.dp * s.pp <= n);
    }
    (void)plan_cost_p2p_ms(c, 1e6);
    plan_cost_free(c);
    return 0;
}

FUZZ_INIT_QUIET()

FUZZ_TARGET(one)
