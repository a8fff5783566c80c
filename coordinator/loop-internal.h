/* loop-internal.h: the planning loop's state, shared by its files (coordinator/loop*.c).
 *
 *   loop.c        the loop itself: the provider's signals, the workers' table, the phases
 *   loop-shape.c  the shape to run: forced, the liveput planner's, or the simple policy's
 *   loop-order.c  ordering an epoch: a fresh start or disk restore, a live migration, a peer
 *                 restore after an unannounced loss
 *   loop-hooks.c  what workers' reports and notices tell it (the completion-queue thread)
 *   loop-cost.c   the fitted cost model's bookkeeping: measured steps and migrations in,
 *                 predictions out, and the summary's predicted-against-measured figures
 *   loop-stall.c  what a reconfiguration cost: its record, and the stall of a chain of them
 *
 * Nothing here is public: coord-loop.h is the loop's interface. */
#ifndef ST_COORD_LOOP_INTERNAL_H
#define ST_COORD_LOOP_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cloud.h"
#include "common.h"
#include "coord-loop.h"
#include "coordinator.h"
#include "planner.h"

#define LOOP_MAGIC 0x4c4f4f50u /* "LOOP" */
#define LOOP_MAX_HIST 4096
#define LOOP_SPARE_STAGE (-1)
#define LOOP_EVENTS 256 /* events kept for coord_loop_event_next() */
#define LOOP_FAILED_GRACE 1.0 /* seconds a failed step waits for its cause to be known dead */
#define LOOP_COPIES_SETTLE 2.0 /* seconds a loss waits for the survivors' copies to be heard */

enum loop_phase {
    PH_WAIT_FIRST = 0, /* no epoch yet: waiting for the first workers */
    PH_RESYNC,         /* after a coordinator restart: learning where the workers stopped */
    PH_RUNNING,
    PH_RECONF,         /* an epoch was ordered; waiting for its participants */
    PH_FINISH_SAVE,    /* every step done; the final checkpoint was ordered */
    PH_STOPPING,
    PH_DONE,
};

/* What the loop learned about one worker from its notices (hooks). */
/* Steps after a worker's first in an epoch whose times the epoch's stall waits for (its
 * median step time: loop__stall_done). */
#define LOOP_LATER_STEPS 3

/* Final saves (--save) a worker may fail to write before the job stops unfinished. */
#define COORD_LOOP_SAVE_TRIES 3

struct lworker {
    char id[ST_UUID_STR_LEN];
    bool terminate;            /* relayed a cloud interruption notice */
    double terminate_at;       /* st_now() when it first did */
    uint64_t reconf_epoch;     /* last epoch it reported "reconfigured" for */
    uint64_t reconf_fail_epoch;
    uint64_t recv, sent;       /* bytes of that reconfiguration */
    uint64_t replayed;         /* steps its rollback to a peer copy undid */
    double stall;
    /* The figures of its last two "reconfigured" notices, by epoch: an epoch's stall is known
     * steps after its first (loop__stall_done), when the next may have been reported already. */
    struct lreconf {
        uint64_t epoch;        /* 0: none */
        uint64_t prewarmed;    /* bytes its new engine took from its warm reserve */
        struct coord_loop_stall_parts parts; /* rest unused */
        double deferred, waited; /* its state after the boundary: moving, waited for */
    } rh[2];
    uint64_t fail_epoch;       /* epoch in which a step or checkpoint failed; 0 = none */
    char fail_why[160];        /* its step-failed notice's detail */
    double step_seconds;       /* wall seconds of its last step */
    uint64_t meas_epoch;       /* epoch whose step times it reports are measured (the first
                                * report of an epoch is not: warm-up counts in the stall) */
    uint64_t step;             /* steps done, as last reported (not the table's maximum:
                                * a restore moves it back) */
    bool reported;             /* it reported to this loop (since the coordinator started) */
    uint64_t report_epoch;     /* the epoch its last report was of */
    double report_at;          /* st_now() of its last report */
    double loss;
    uint64_t ckpt_step;        /* last checkpoint written */
    char ckpt_dir[ST_SPEC_PATH_MAX];
    uint64_t ckw_step;         /* last background checkpoint whose layers it wrote */
    int ckw_stage;
    double ckw_seconds;        /* how long writing those layers took */
    char ckw_dir[ST_SPEC_PATH_MAX];
    uint64_t pc_epoch[2], pc_step[2]; /* its peer-copy generations (epoch, step; 0 = none) */
    /* Its first steps of the last two epochs it reported one of, newest first, and the steps
     * after each: an epoch's stall waits for those (loop__stall_done), and the next epoch may
     * have begun by then. */
    struct lfirst {
        uint64_t epoch;        /* 0: none */
        uint64_t step;         /* the first step's number */
        double seconds;        /* end of its last step before the epoch to the end of this */
        double step_seconds;   /* that step's own time */
        double later[LOOP_LATER_STEPS]; /* the times of steps after it, as reported */
        int nlater;
        uint64_t later_step;   /* the step of later[nlater - 1] */
    } fh[2];
};

/* A cloud instance as the provider reported it. */
struct linst {
    char name[CLOUD_NAME_MAX];
    char node[CLOUD_NAME_MAX]; /* the node name events use; "" until a signal names it */
    bool noticed, dead;
    double deadline;
};

/* A worker as one tick sees it. */
struct wv {
    struct coord_worker w;
    uint64_t step;             /* steps done (last report) */
    double loss;
    bool dead, leaving, failed, positioned;
    bool reported;             /* its step is from a report of the current epoch to this loop */
    double relayed_at;         /* st_now() when it relayed a notice the provider did not see */
    double step_seconds;       /* wall seconds of its last step (0: none reported) */
};

struct reconf {
    uint64_t epoch, at;
    bool restore;
    char (*pos)[ST_UUID_STR_LEN]; /* worker at each new position s*dp + r */
    double started;
    /* st_now() the reconfiguration last moved: ordered, a participant reported a step (it
     * trains toward the boundary, or its first step after it) or its end. It times out after
     * reconfig_timeout without any: a lease of slow steps ahead, or a first step that waits
     * for moments after the boundary, is not a hang. */
    double alive;
    uint64_t progress;  /* participants' steps plus those done, as of alive */
    size_t npart;
    char (*part)[ST_UUID_STR_LEN];
    struct coord_loop_record rec;
    int dp, pp;
    int split[PLAN_MIG_MAX_STAGES + 1];
    uint64_t first_lease;      /* the new epoch's first lease, sent with a migration's
                                * orders (Migrate.lease); 0 = none */
    double pred_step;          /* the fitted model's, when ordered (the stall's: rec) */
    bool calibrated;           /* pred_step had measured steps behind it */
    char why[240];             /* the event line's tail: why this epoch (set at the order) */
};

struct coord_loop {
    uint32_t magic;
    struct coord_loop_config cfg;
    struct coord *c;
    pthread_mutex_t lock; /* lw, events from hooks */
    struct lworker *lw;
    size_t nlw, caplw;
    bool membership;

    struct linst *inst;
    size_t ninst, capinst;

    enum loop_phase phase;
    uint64_t epoch;
    int dp, pp;
    int split[PLAN_MIG_MAX_STAGES + 1];
    uint64_t lease, total;
    int nlayers;
    uint64_t layer_params[PLAN_MIG_MAX_LAYERS];
    struct reconf rc;
    int restore_tries;        /* failed reconfigurations since progress past fail_at */
    uint64_t fail_at;         /* highest boundary a reconfiguration failed at */
    bool need_restore;        /* a restore is owed once workers are available */

    double t0, last_tick, next_plan, last_ckpt, last_grant, shape_since;
    double resync_since, resync_changed;
    uint64_t resync_step;
    int hist[LOOP_MAX_HIST];
    int nhist;
    int planned_avail;        /* available workers at the last decision */
    double rate_t;
    uint64_t rate_step;
    uint64_t last_ckpt_step;
    bool ckpt_pending;        /* a periodic checkpoint waits for its stages' layer files */
    uint64_t ckpt_pend_step;
    uint64_t ckpt_top;         /* the highest step a periodic checkpoint was committed at */
    int ckpt_pend_dp, ckpt_pend_pp;
    char ckpt_pend_dir[ST_SPEC_PATH_MAX + 32];
    double steps_per_s;
    bool save_ordered, cancel;
    int save_failures;        /* final saves (--save) a worker failed to write, lost nobody */
    double stop_at;
    int forecast;

    struct coord_loop_summary sum;
    struct coord_loop_status st;

    /* Events not yet taken by coord_loop_event_next(): a ring, newest overwrite oldest. */
    char events[LOOP_EVENTS][320];
    uint64_t nevents;         /* events ever recorded; event k sits at k % LOOP_EVENTS */
    enum plan_predictor predictor;
    uint64_t decisions;       /* planner consultations */

    /* The last epoch that ran (made steps possible): peer copies are of its layout. */
    uint64_t run_epoch;
    int run_dp, run_pp;
    int run_split[PLAN_MIG_MAX_STAGES + 1];
    char (*run_pos)[ST_UUID_STR_LEN]; /* run_dp * run_pp */
    char (*prev_pos)[ST_UUID_STR_LEN]; /* the positions of the epoch that ran before it */
    int prev_n;
    uint64_t max_step;        /* highest step a positioned worker reported since run_epoch */
    uint64_t peer_failed_at;  /* step of the last peer restore that failed; replays it never */
    bool peer_refused;        /* a worker said the copies do not fit */
    bool peer_refused_said;   /* and the event said so (once) */
    uint64_t peer_refused_need; /* bytes per worker they would have needed */
    /* Stall bookkeeping: records [chain, stall_rec] wait for the first step of the epoch that
     * ended them (stall_rec, ok); -1 = nothing pending. */
    int chain, stall_rec;
    char stall_why[240];      /* stall_rec's rc.why: the next order may come before its step */
    /* Wall seconds the provider's (trace) clock was held before the first epoch ran: the
     * trace's events start with training, however long the workers took to come up, so a
     * run replays the same trace against the same steps whatever the machine's load. */
    double hold;
    double prov_t0;           /* st_now() when the (started) provider was set: trace time 0 */
    double failed_since;      /* a positioned worker's step failed, none known dead; 0 = no */
    /* The running epoch's watchdog (phase_running): the positioned workers' steps summed, and
     * st_now() that sum last changed, in epoch run_seen. */
    uint64_t run_progress;
    double run_alive;
    uint64_t run_seen;
    double lost_since;        /* a positioned worker known dead, no recovery ordered; 0 = no */
    /* Which shapes may run (the planner's rules, shared with validate) and the wait for a
     * fleet that can host one. */
    struct plan_rules rules;        /* the spec's rules, pins included */
    struct plan_rules rules_forced; /* the same without pins: forced shapes override them */
    struct plan_feasibility feas;
    double wait_since;              /* loop time the current wait began; 0 = not waiting */
    bool wait_told;                 /* its event was recorded */
    char waiting[200];              /* status line while waiting; "" otherwise */

    /* The cost model fitted online (planner/fitted.c); NULL without cfg.cost. */
    struct plan_fit *fit;
    uint64_t ep_epoch;        /* epoch whose steps are being measured (L->lock) */
    double ep_step_sum;       /* step seconds reported in it, one per worker and step (L->lock) */
    uint64_t ep_steps;
    double ep_fed_sum;        /* the part of those already fed to the fit */
    uint64_t ep_fed;
    double ep_pred;           /* its step time as predicted when decided */
    bool ep_calibrated;
    bool fit_has_steps;
};

/* ---- loop.c ---------------------------------------------------------------------------- */

/* An event: the status block's "last:" line, the events GET /v1/job lists, the log and the
 * coordinator's event stream. */
void loop__event(struct coord_loop *L, const char *fmt, ...) ST_PRINTF(2, 3);
/* Bytes as a person reads them in an event line: "0.88 MB", "512 bytes". Returns buf. */
const char *loop__fmt_bytes(char *buf, size_t size, uint64_t b);
/* Seconds of stall or writing: "3 ms" under a second, "1.64 s" above. Returns buf. */
const char *loop__fmt_secs(char *buf, size_t size, double s);
/* Whether an event names kind k "<kind> migration" (the live ones) or by itself. */
bool loop__kind_is_migration(enum plan_reconf k);
/* What the loop is doing, for the status block's "last:" line only: an order whose outcome
 * loop__event() reports once, with its cost, when it is known (one line per event). */
void loop__set_status(struct coord_loop *L, const char *fmt, ...) ST_PRINTF(2, 3);
/* Adds the time since the last call to the running shape's entry in the summary. */
void loop__shape_time(struct coord_loop *L, double now);
/* The provider's clock at wall time now (the trace's time: wall time less what was held). */
double loop__trace_now(const struct coord_loop *L, double now);
/* The loop's record of cloud instance `name`, or NULL when the provider never reported it. */
struct linst *loop__inst_find(struct coord_loop *L, const char *name);

/* ---- loop-shape.c ---------------------------------------------------------------------- */

/* The shape (*ret_dp x *ret_pp) for n available workers at boundary `at`: forced, else the
 * liveput planner, else the simple policy; always engine-feasible. why says why in words. */
void loop__choose_shape(struct coord_loop *L, int n, uint64_t at, const struct wv *v,
                        size_t nv, double now, int *ret_dp, int *ret_pp, char *why,
                        size_t whysz);
/* The last forced shape at or before `step`, or NULL. */
const struct coord_loop_forced *loop__forced_at(const struct coord_loop *L, uint64_t step);
/* The first forced change of shape strictly after `step`, or 0. */
uint64_t loop__forced_next(const struct coord_loop *L, uint64_t step);
/* The stage boundaries of pp stages over the model's layers (ret: pp + 1 entries). */
int loop__split_for(struct coord_loop *L, int pp, int *ret);

/* ---- loop-order.c ---------------------------------------------------------------------- */

struct peer_src; /* a peer restore's sources (loop-order.c) */
/* Orders a fresh start (mode=init at step 0) or a restore from the newest checkpoint onto
 * the available workers. */
int loop__start_restore(struct coord_loop *L, const struct wv *v, size_t nv, double now,
                        const char *reason);
/* Orders a live migration to (dp, pp) at the lease boundary (ps NULL), falling back to a
 * restore when some state has no live copy; with ps, a peer restore (-ENODATA: some state
 * has no copy, nothing ordered). */
int loop__start_migrate(struct coord_loop *L, const struct wv *v, size_t nv, int dp, int pp,
                        double now, const char *reason, const struct peer_src *ps);
/* After an unannounced loss: a restore from the peer copies of the last running epoch, when
 * one step's copies survive for every position. 0 when ordered, -ENODATA when no copy
 * serves (the caller restores from disk), or another negative errno. */
int loop__start_peer_restore(struct coord_loop *L, const struct wv *v, size_t nv, double now,
                             const char *reason);
/* Whether a peer restore may be planned now after a loss: every surviving positioned worker
 * reported since the loss was seen, or LOOP_COPIES_SETTLE passed. */
bool loop__copies_heard(struct coord_loop *L, const struct wv *v, size_t nv, double now);
/* Steps in a lease window: about lease_seconds ahead of the slowest positioned worker. */
uint64_t loop__lease_window(struct coord_loop *L, const struct wv *v, size_t nv);

/* ---- loop-stall.c ---------------------------------------------------------------------- */

/* The reconfiguration being ordered (L->rc) ended, ok or failed, having moved `moved` wire
 * bytes: its record and counts into the summary; its stall waits for loop__stall_done. */
void loop__record_done(struct coord_loop *L, bool ok, uint64_t moved, double now);
/* The stall of the chain of reconfigurations that led to the running epoch, once its
 * positioned workers of v[0..nv) reported their first and later steps (settle: the epoch ends,
 * take what came). Does nothing before then, or when no chain waits for its stall. */
void loop__stall_done(struct coord_loop *L, const struct wv *v, size_t nv, bool settle);

/* ---- loop-hooks.c ----------------------------------------------------------------------- */

/* The loop's record of worker id, made (zeroed) on first use; NULL when out of memory.
 * Under L->lock on the hooks' thread; the loop's thread reads and writes it between. */
struct lworker *loop__lw_get(struct coord_loop *L, const char *id);

/* ---- loop-cost.c ------------------------------------------------------------------------ */

/* The cost model decisions are taken on: the fitted one, unless the spec says
 * planner.learn: false (then the spec's fleet figures). */
const struct plan_cost *loop__decide_cost(const struct coord_loop *L);
/* Feeds the steps measured since the last call (their mean) to the fit. */
void loop__cm_feed(struct coord_loop *L);
/* Adds the measured epoch's steps to S's predicted-against-measured figures. */
void loop__cm_account(const struct coord_loop *L, struct coord_loop_summary *S);
/* Shows the cost model against what happened in GET /v1/job and /metrics. */
void loop__cm_publish(struct coord_loop *L);
/* The running epoch ends (a reconfiguration is ordered): account and feed its steps. */
void loop__cm_epoch_end(struct coord_loop *L);
/* Predictions for the reconfiguration being ordered (L->rc); plan NULL: it moves nothing. */
void loop__cm_predict(struct coord_loop *L, int dp, int pp, const struct plan_migration *plan);
/* Epoch L->epoch runs from now: measure its steps against pred. */
void loop__cm_epoch_begin(struct coord_loop *L, double pred, bool calibrated);
/* A live migration finished: compare (in the summary and on rec) and learn. */
void loop__cm_migration(struct coord_loop *L, struct coord_loop_record *rec, uint64_t moved,
                        double stall);

#endif
