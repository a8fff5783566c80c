/* reconf.h: what a reconfiguration does, named once.
 *
 * The planner classifies a migration plan with it (plan_migration_new), a cost file and the
 * fitted cost model give figures per live kind, and the coordinator's loop, the run summary,
 * REST and /metrics count and time reconfigurations by it. The names are spelled two ways:
 * with '-' where the summary and cost files use them ("intra-stage"), with '_' where /metrics
 * labels and REST's keys do ("intra_stage").
 *
 * Parcae's simulator has its own accounting of transitions (enum plan_mig_kind in planner.h:
 * repartition, growth, restart), which is Parcae's, not ours. */
#ifndef ST_PLANNER_RECONF_H
#define ST_PLANNER_RECONF_H

/* The first PLAN_RECONF_NLIVE kinds are live migrations. dp-resharding is also counted apart:
 * a migration that changes dp is one of the three before it too. The rest recover from an
 * unannounced loss: from peers' in-memory copies, from the disk checkpoint, or from scratch
 * (no copy and no checkpoint survived: not a restore). PLAN_RECONF_NONE is a plan that
 * changes nothing. */
enum plan_reconf {
    PLAN_RECONF_NONE = -1,
    PLAN_RECONF_INTRA_STAGE = 0, /* layer ranges kept; every worker stays in its old stage
                                  * (survivors take over; at most optimizer-shard resharding) */
    PLAN_RECONF_INTER_STAGE,     /* layer ranges kept; some position is taken by a worker from
                                  * another stage, a spare or a new worker (weights + moments) */
    PLAN_RECONF_PIPELINE,        /* layer ranges change (pp or the split): repartition */
    PLAN_RECONF_DP_RESHARDING,   /* dp changes: ZeRO-1 optimizer shards move */
    PLAN_RECONF_CHECKPOINT_RESTORE,
    PLAN_RECONF_PEER_RESTORE,
    PLAN_RECONF_FRESH_START,
    PLAN_RECONF_NKINDS
};
#define PLAN_RECONF_NLIVE 4 /* intra-stage .. dp-resharding */

/* "intra-stage", "inter-stage", "pipeline", "dp-resharding", "checkpoint-restore",
 * "peer-restore", "fresh-start"; "none" for PLAN_RECONF_NONE; "?" out of range. */
const char *plan_reconf_name(enum plan_reconf k);
/* The same with '_' for '-' ("intra_stage"), as /metrics labels and REST keys spell them. */
const char *plan_reconf_label(enum plan_reconf k);

#endif
