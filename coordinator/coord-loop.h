/* coord-loop.h: the coordinator's planning loop (part of coordinator/'s public interface).
 *
 * One idea: the loop is a state machine ticked from one thread. Each tick it reads signals
 * (the cloud provider's grants, notices and losses; the coordinator's worker table; the
 * workers' notices relayed by hooks), and in the RUNNING phase decides — forecast, liveput,
 * migration plan — and orders the next epoch at a step boundary it controls: workers only run
 * the steps the loop has leased them (a Migrate with no transfers and no peers), so the
 * boundary of a reconfiguration is simply the lease already granted. When some state has no
 * live copy it falls back to the newest valid checkpoint. docs/live-migration.md has the
 * protocol and the failure cases.
 *
 * Threads: coord_loop_tick() from one thread; the hooks from coord_loop_hooks() run on the
 * coordinator's completion-queue thread and only touch the loop's own locked tables. */
#ifndef ST_COORD_LOOP_H
#define ST_COORD_LOOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "planner.h" /* struct plan_measured_costs: the fitted costs in the summary */
#include "reconf.h"  /* enum plan_reconf: what each reconfiguration was */

struct coord;
struct coord_hooks;
struct cloud_provider;
struct plan_cost;
struct coord_loop;

#define COORD_LOOP_MAX_FORCED 64
#define COORD_LOOP_MAX_RECORDS 256
#define COORD_LOOP_MAX_SHAPES 64

/* Finds the newest valid checkpoint under root: fills dir and *ret_step; returns 0, -ENOENT
 * when none is valid, or another negative errno. Injected by the caller (the coordinator does
 * not read checkpoints itself). */
typedef int coord_ckpt_latest_fn(void *userdata, const char *root, char *dir, size_t dirsz,
                                 uint64_t *ret_step);

/* Removes old checkpoints under root, keeping the newest `keep` committed ones. Injected by the
 * caller; returns the number removed or negative errno. */
typedef int coord_ckpt_prune_fn(void *userdata, const char *root, int keep);

/* Commits a checkpoint whose layer files every stage has written (the manifest, last: the
 * commit point) for `step` steps done, written by a (dp, pp) layout. Injected by the caller;
 * returns 0 or negative errno. */
typedef int coord_ckpt_commit_fn(void *userdata, const char *dir, uint64_t step, int dp,
                                 int pp);

/* A forced shape: from step `step` on, run (dp, pp) (tests and demos; bypasses the planner). */
struct coord_loop_forced {
    uint64_t step;
    int dp, pp;
};

struct coord_loop_config {
    struct st_spec spec;            /* the job (copied) */
    int steps;                      /* total steps; <= 0 = spec.training.steps */
    double time_scale;              /* wall seconds per trace second; <= 0 = spec's */
    char ckpt_root[ST_SPEC_PATH_MAX]; /* periodic checkpoints: ROOT/step-N; "" = none */
    double ckpt_interval;           /* wall seconds between checkpoints; 0 = none */
    char save_dir[ST_SPEC_PATH_MAX]; /* final checkpoint at the end; "" = none */
    struct cloud_provider *provider; /* borrowed; NULL = workers come and go by themselves */
    const struct plan_cost *cost;   /* borrowed; NULL = simple policy (fill the fleet) */
    const struct plan_measured_costs *migration_costs; /* borrowed; NULL = the cost model's own
                                       * migration figures (planner.migration_costs) */
    coord_ckpt_latest_fn *ckpt_latest; /* required for restores */
    coord_ckpt_prune_fn *ckpt_prune;   /* NULL = keep every checkpoint */
    coord_ckpt_commit_fn *ckpt_commit; /* required for periodic checkpoints */
    void *ckpt_userdata;
    struct coord_loop_forced forced[COORD_LOOP_MAX_FORCED]; /* sorted by step */
    int nforced;
    double reconfig_timeout;        /* wall seconds a reconfiguration may go without progress
                                     * (a participant's step or end); 0 = 30 */
    double lease_seconds;           /* steps leased ahead, in seconds of training; 0 = 0.5 */
    int expect_workers;             /* workers to wait for before the first epoch; 0 = 1 */
    double first_wait;              /* longest wait for them, seconds; 0 = 20 */
    bool hold_trace;                /* the provider replays a trace (sim): hold its clock at
                                     * time 0 until the first epoch runs. Real clouds' providers
                                     * keep their own time (reconcile, backoff) and are never
                                     * held. */
};

/* One reconfiguration, as the summary lists it. */
struct coord_loop_record {
    uint64_t epoch, at_step;
    enum plan_reconf kind;         /* the plan's class, or the recovery's kind */
    bool dp_reshard;               /* dp changed */
    int from_dp, from_pp, to_dp, to_pp;
    uint64_t planned_bytes;        /* the plan's bytes_moved */
    uint64_t moved_bytes;          /* payload bytes the workers' transport received */
    uint64_t prewarmed_bytes;      /* memory the new engines took from their warm reserves
                                    * (fleet.prewarm), over the positioned workers */
    double stall_seconds;          /* shared/DESIGN.md "One meaning of stall"; for a failed
                                    * epoch, until the epoch that replaced it made a step */
    double ordered_at;             /* wall seconds from the job's start to the order */
    /* The cost model's prediction, made when the reconfiguration was ordered (< 0 where the
     * loop has no cost model), whether it rested on measured migrations (this job's, or a cost
     * file's) rather than the prior alone, and what the plan moves as the model charges it.
     * A live migration's stall may be measured after the next reconfiguration was ordered
     * (the epoch ended before its later steps), so the record holds them till then. */
    double stall_predicted;
    bool stall_calibrated;
    struct plan_fit_move move;
    bool stall_compared;           /* the measured stall was compared with that prediction and
                                    * learnt (live migrations; the summary's cost_model counts
                                    * it): the summary shows the prediction only then */
    uint64_t steps_replayed;       /* restores: steps done before the loss, trained again */
    double seconds;                /* order to last "reconfigured" */
    /* Where the stall went, on the worker whose span set it (seconds, docs/live-migration.md):
     * waiting at the boundary for the order, the new communicator's handshake (which ends
     * when the slowest peer reached the boundary), the engine's reshape, the transfers, the
     * commit, and the rest: the stall less those, i.e. the first step beyond the median plus
     * anything done at the boundary before (a checkpoint snapshot, a peer copy). Zero where
     * the workers reported no parts (restores). */
    struct coord_loop_stall_parts {
        double wait, connect, reshape, transfer, commit, rest;
    } parts;
    /* The state that moved after the boundary (fleet.data_plane.overlap), the longest over
     * the positioned workers: how long its move took beside the first step, and how long
     * training waited for it (layer gates, the update, or the first pipeline message when
     * the move shared the communicator). 0 where nothing moved after the boundary. */
    double after_seconds, after_waited;
    /* The stall's inputs (shared/DESIGN.md): the longest span from a worker's last step
     * before the chain to the end of its first step in the new epoch, and the epoch's median
     * step time it subtracts, of the steps after the first or, where the epoch ended before
     * any was reported, of the first steps' own times (stall_step_from). All 0 where no
     * stall was measured (the job's start, an epoch replaced before its first step). */
    double stall_span, stall_step;
    enum coord_loop_step_from {
        COORD_LOOP_STEP_FROM_NONE = 0,
        COORD_LOOP_STEP_FROM_FIRST, /* the first steps' own times */
        COORD_LOOP_STEP_FROM_LATER, /* the steps after each worker's first */
    } stall_step_from;
    bool ok;
    char reason[96];
};

struct coord_loop_summary {
    uint64_t steps;                /* steps committed */
    uint64_t samples;              /* samples committed */
    double first_loss;             /* loss of the first step reported; NaN when unknown */
    double final_loss;             /* NaN when unknown */
    double wall_seconds;
    uint64_t count[PLAN_RECONF_NKINDS], bytes[PLAN_RECONF_NKINDS];
    double stall[PLAN_RECONF_NKINDS];
    uint64_t replayed[PLAN_RECONF_NKINDS]; /* steps replayed (restore kinds) */
    int nrecords;
    struct coord_loop_record records[COORD_LOOP_MAX_RECORDS];
    int nshapes;
    struct { int dp, pp; double seconds; } shapes[COORD_LOOP_MAX_SHAPES];
    double instance_hours;         /* trace-time instance hours the fleet was up */
    double spot_dollars, on_demand_dollars;
    double spot_price_live;        /* the cloud's last $/instance-hour; 0 = none answered */
    bool finished;                 /* every step done (and saved, with save_dir) */
    int worker_notices;            /* interruption notices workers read from their cloud
                                    * metadata endpoint and relayed */
    char error[320];               /* why the loop stopped the job early ("" when it did not):
                                    * e.g. planner.wait_limit passed without a fleet that can
                                    * host a shape the spec allows */
    /* The planner's fitted cost model against what happened (planner/fitted.c). Each
     * prediction is the one made when the epoch or migration was decided. Steps count only
     * where that prediction had measured steps behind it (not the spec's prior alone).
     * Migrations count all, and apart those whose prediction was calibrated (had measured
     * migrations behind it: plan_fit_stall_calibrated). */
    struct {
        uint64_t steps;
        double step_predicted, step_measured;   /* sums over those steps, seconds */
        uint64_t n[PLAN_RECONF_NLIVE];     /* live migrations per kind */
        double stall_predicted[PLAN_RECONF_NLIVE], stall_measured[PLAN_RECONF_NLIVE]; /* sums */
        uint64_t cal_n[PLAN_RECONF_NLIVE]; /* of those, calibrated */
        double cal_predicted[PLAN_RECONF_NLIVE], cal_measured[PLAN_RECONF_NLIVE];
        /* The migration costs fitted by the end (plan_fit_costs), for the next job's
         * planner.migration_costs; fitted_ok is false when no live migration was measured. */
        bool fitted_ok;
        struct plan_measured_costs fitted;
    } cost_model;
};

/* A short description of what the loop is doing, for status lines. */
struct coord_loop_status {
    uint64_t epoch, step, total;
    double loss, samples_per_s;
    int dp, pp;
    int alive, forecast;           /* instances alive; predicted for the next interval */
    char phase[24];
    char last_event[320];
    char waiting[200];             /* why the loop waits for workers ("" when it does not) */
};

/* Creates a loop. Returns 0 and *ret, -EINVAL for a bad config, -ENOMEM. Caller frees with
 * coord_loop_free() (after coord_free() of the coordinator it was attached to). */
int coord_loop_new(const struct coord_loop_config *cfg, struct coord_loop **ret);
/* Fills the hooks the loop needs (on_report, on_worker_lost, on_membership). */
void coord_loop_hooks(struct coord_loop *L, struct coord_hooks *h);
/* Attaches the coordinator (created with those hooks). Reads its journal state: a job that
 * already has an epoch resumes (the loop first waits for the workers to settle on their
 * lease). */
int coord_loop_attach(struct coord_loop *L, struct coord *c);
/* Sets the cloud provider the loop reads signals from (borrowed; NULL = none). The provider
 * usually needs the coordinator's address, so it is created after the loop. */
void coord_loop_set_provider(struct coord_loop *L, struct cloud_provider *p);
/* Replaces the root of periodic checkpoints (ROOT/step-N) the config gave; the job driver
 * calls it before attaching, once the journal names the job (an object-store root is
 * checkpoint.dir/JOB-ID). */
void coord_loop_set_ckpt_root(struct coord_loop *L, const char *root);
/* One tick at monotonic time now. Returns 1 when the job is over (finished or given up: see
 * the summary), 0 to go on, negative errno on an internal failure. */
int coord_loop_tick(struct coord_loop *L, double now);
/* Asks the loop to stop the job at the next tick (Ctrl-C). */
void coord_loop_cancel(struct coord_loop *L);
/* Copies the event after *cursor (0 = the first) into buf and advances *cursor: each event
 * of the loop is seen once, in order, whatever the caller's polling rate. Returns 1 when an
 * event was copied, 0 when none is new, -EINVAL. When the caller fell more than the ring's
 * 256 events behind, the first line copied says how many it missed. Same thread as ticks. */
int coord_loop_event_next(struct coord_loop *L, uint64_t *cursor, char *buf, size_t size);
void coord_loop_summary(struct coord_loop *L, struct coord_loop_summary *ret);
void coord_loop_status(struct coord_loop *L, struct coord_loop_status *ret);
struct coord_loop *coord_loop_free(struct coord_loop *L);

/* Parses "STEP:DPxPP,STEP:DPxPP,..." (steps increasing). Returns the count or -EINVAL. */
int coord_loop_parse_forced(const char *s, struct coord_loop_forced *ret, int max);

#endif
