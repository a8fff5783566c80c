/* reconf.c: the names of enum plan_reconf (reconf.h), both spellings in one table. */
#include "reconf.h"

static const struct {
    const char *name, *label;
} kinds[PLAN_RECONF_NKINDS] = {
    {"intra-stage", "intra_stage"},
    {"inter-stage", "inter_stage"},
    {"pipeline", "pipeline"},
    {"dp-resharding", "dp_resharding"},
    {"checkpoint-restore", "checkpoint_restore"},
    {"peer-restore", "peer_restore"},
    {"fresh-start", "fresh_start"},
};

const char *plan_reconf_name(enum plan_reconf k) {
    if (k == PLAN_RECONF_NONE)
        return "none";
    return (unsigned)k < PLAN_RECONF_NKINDS ? kinds[k].name : "?";
}

const char *plan_reconf_label(enum plan_reconf k) {
    if (k == PLAN_RECONF_NONE)
        return "none";
    return (unsigned)k < PLAN_RECONF_NKINDS ? kinds[k].label : "?";
}
