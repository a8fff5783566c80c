/* fuzz-situation.c: libFuzzer target for `spottrain plan` situation files
 * (plan_situation_parse).
 *
 * Any bytes give a situation whose parts agree with each other (every worker's role inside
 * the current shape, workers listed before new ones, a cost exactly when there is no target)
 * or -EINVAL naming a field or a line; never a crash, leak or undefined behaviour. */
#include <string.h>

#include "fuzz.h"
#include "planner.h"

static int one(const uint8_t *data, size_t size) {
    struct plan_situation_file s;
    struct st_error e;
    memset(&e, 0, sizeof(e));
    int r = plan_situation_parse("fuzz.json", (const char *)data, size, &s, &e);
    if (r == -EINVAL) {
        FUZZ_CHECK(e.message[0] != '\0' && (e.field[0] != '\0' || e.line > 0));
        return r;
    }
    if (r < 0)
        return r;
    FUZZ_CHECK(s.nlayers >= 1 && s.np);
    FUZZ_CHECK(s.nold <= s.nw && s.nw <= PLAN_MIG_MAX_WORKERS);
    FUZZ_CHECK(s.old_layout.pp >= 1 && s.old_layout.pp <= s.nlayers);
    for (uint32_t i = 0; i < s.nw; i++) {
        const struct plan_mig_worker *w = &s.w[i];
        FUZZ_CHECK(w->id[0] != '\0');
        if (i >= s.nold)
            FUZZ_CHECK(w->stage == -1 && w->alive);
        if (w->stage >= 0)
            FUZZ_CHECK((uint32_t)w->stage < s.old_layout.pp &&
                       (uint32_t)w->replica < s.old_layout.dp);
        FUZZ_CHECK(w->leaving ? s.notice_s[i] >= 0 : s.notice_s[i] == -1);
    }
    FUZZ_CHECK(s.have_target == (s.cost_kind == PLAN_SIT_COST_NONE));
    FUZZ_CHECK(s.cost_kind != PLAN_SIT_COST_PROFILE || s.cost_profile);
    FUZZ_CHECK(s.lookahead >= 1 && s.lookahead <= PLAN_MAX_LOOKAHEAD);
    plan_situation_file_done(&s);
    return 0;
}

FUZZ_INIT_QUIET()

FUZZ_TARGET(one)
