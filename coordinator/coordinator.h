/* coordinator.h: the public header of coordinator/ — the job's one stateful process.
 *
 * One idea: every change of job state (a worker joins, a command is issued, an ack arrives, a
 * worker is lost, an epoch begins) is committed to the SQLite journal *before* it is visible
 * to anyone, under one lock. Workers talk gRPC (proto/control.proto), people talk REST; both
 * read the same in-memory tables, so a `kill -9` followed by a restart on the same state
 * directory resumes exactly what was committed.
 *
 * Threads: coord_start() starts one gRPC completion-queue thread (all RPCs, liveness ticks,
 * hook calls) and libmicrohttpd's own thread (REST). Every function below takes the
 * coordinator lock itself and may be called from any thread, including from inside a hook:
 * hooks run on the completion-queue thread with the lock *released*.
 *
 * Driving workers (the planner loop of the end-to-end issue lives in coordinator/ too):
 *   - read the worker table with coord_workers_get();
 *   - decide a shape and call coord_configure() with one assignment per worker: it opens a
 *     new epoch, journals one Configure per worker (with every peer's data-plane address) and
 *     pushes them on the workers' Watch streams;
 *   - order transfers with coord_migrate(), durable checkpoints with coord_checkpoint(),
 *     and the end with coord_stop();
 *   - learn what happens through struct coord_hooks (joins, losses, reports, notices, acks,
 *     ticks).
 * Without an on_membership hook, a built-in policy keeps the job configured: when the set of
 * live workers changes it assigns dp x pp with pp from spec.planner.pp (else 1) and
 * dp = live / pp (capped by spec.fleet.max / pp), even layer split; extra workers are spares. */
#ifndef ST_COORDINATOR_H
#define ST_COORDINATOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h" /* struct st_spec, ST_UUID_STR_LEN */
#include "reconf.h" /* enum plan_reconf: the kinds /metrics and REST count */

struct coord;

#define COORD_ADDR_MAX 128
#define COORD_MAX_MESSAGE_DEFAULT (4 << 20) /* bytes; larger gRPC messages: RESOURCE_EXHAUSTED */
#define COORD_EVENTS_KEEP_DEFAULT 10000     /* newest events kept in the journal */

enum coord_worker_state {
    COORD_WORKER_JOINED = 0, /* known and alive, no role in the current epoch yet */
    COORD_WORKER_ACTIVE,     /* has a role (stage, replica) in the current epoch */
    COORD_WORKER_SPARE,      /* alive, deliberately left out of the current epoch */
    COORD_WORKER_LOST,       /* silent past the heartbeat deadline */
    COORD_WORKER_STOPPED,    /* acknowledged Stop */
    COORD_WORKER_NSTATES
};

enum coord_job_state {
    COORD_JOB_PENDING = 0, /* no epoch configured yet */
    COORD_JOB_RUNNING,
    COORD_JOB_STOPPING, /* Stop sent, waiting for acks */
    COORD_JOB_STOPPED
};


/* One row of the worker table (a copy; the caller owns the array). */
struct coord_worker {
    char id[ST_UUID_STR_LEN];
    char instance_id[64];
    char zone[32];
    char instance_type[64];
    int gpus;
    char data_addr[COORD_ADDR_MAX];
    enum coord_worker_state state;
    uint64_t epoch;      /* epoch of its last Configure; 0 = never configured */
    int stage, replica;  /* role in that epoch; -1 when none */
    int layer_begin, layer_end;
    uint64_t acked_command; /* highest command id it acknowledged */
    uint64_t step;          /* last step it reported */
    double loss;            /* loss of that step */
    double joined;          /* wall-clock seconds (Unix) of its first Join */
    double last_seen_ago;   /* seconds since its last RPC */
    bool watching;          /* has an open Watch stream */
    int order;              /* join order, stable across restarts */
};

/* One worker's role in a coord_configure() call. */
struct coord_assignment {
    char worker_id[ST_UUID_STR_LEN];
    int stage, replica;
    int layer_begin, layer_end; /* [begin, end) */
};

/* A Migrate transfer (proto Transfer). */
struct coord_transfer {
    char src_worker_id[ST_UUID_STR_LEN];
    char dst_worker_id[ST_UUID_STR_LEN];
    int layer;
    enum st_state_kind kind;
    uint64_t offset, count; /* elements */
    bool from_copy;         /* src sends from its peer copy of a lost worker (peer restore) */
};

/* A notice a worker relayed in a Report. */
struct coord_notice {
    const char *kind;   /* "terminate", "rebalance", ... */
    double at;          /* Unix seconds when it takes effect */
    const char *detail; /* for people: nothing parses it */
    struct st_notice_figures figures; /* what the coordinator acts on (zero: none sent) */
};

/* A Report as hooks see it; pointers valid only during the hook call. */
struct coord_report {
    const char *worker_id;
    uint64_t epoch, step, samples;
    double loss, step_seconds, stall_seconds;
    const char *state;
    const struct coord_notice *notices;
    size_t nnotices;
};

/* Hooks (all optional). Called on the completion-queue thread with the coordinator lock
 * released, so they may call any coord_* function. They must not block for long: RPCs wait. */
struct coord_hooks {
    void *userdata;
    /* A worker joined or re-joined (rejoined = its id was known). */
    void (*on_worker_joined)(struct coord *c, const struct coord_worker *w, bool rejoined,
                             void *userdata);
    /* A worker was declared lost (silence past the heartbeat deadline). */
    void (*on_worker_lost)(struct coord *c, const struct coord_worker *w, void *userdata);
    /* The set of live workers changed (after the settle delay). When set, the built-in
     * policy is off and this hook decides (typically calls coord_configure()). */
    void (*on_membership)(struct coord *c, void *userdata);
    /* Every Report, after it was applied. */
    void (*on_report)(struct coord *c, const struct coord_report *r, void *userdata);
    /* A command was acknowledged (ok = the worker applied it). */
    void (*on_ack)(struct coord *c, const char *worker_id, uint64_t command_id, bool ok,
                   const char *error, void *userdata);
    /* Periodic, every config.tick seconds. */
    void (*on_tick)(struct coord *c, double now, void *userdata);
};

struct coord_config {
    const struct st_spec *spec;     /* required; copied */
    char listen[COORD_ADDR_MAX];      /* gRPC HOST:PORT; "" = spec.coordinator.listen */
    char status_listen[COORD_ADDR_MAX]; /* REST HOST:PORT; "" = spec.status.listen; "-" = off */
    char token[256];                  /* bearer token; "" = no authentication */
    char state_dir[ST_SPEC_PATH_MAX]; /* journal directory (created); required */
    double heartbeat_deadline;        /* seconds; 0 = spec.coordinator.heartbeat_deadline */
    double settle;                    /* seconds membership must be stable before re-planning;
                                         0 = min(1, deadline / 4) */
    double tick;                      /* seconds between on_tick calls; 0 = 0.25 */
    size_t max_message;               /* bytes; 0 = COORD_MAX_MESSAGE_DEFAULT */
    /* TLS for gRPC and REST: PEM files; "" = spec.coordinator.tls.*. cert + key turn TLS on;
     * client_ca also requires client certificates chaining to it (mutual TLS). "-" in
     * tls_cert turns TLS off whatever the spec says. */
    char tls_cert[ST_SPEC_PATH_MAX];
    char tls_key[ST_SPEC_PATH_MAX];
    char tls_client_ca[ST_SPEC_PATH_MAX];
    int events_keep;                  /* newest events the journal keeps; 0 = spec's value */
};

/* Fills defaults (everything "" / 0). */
void coord_config_init(struct coord_config *cfg);

/* Opens (or creates) the journal in cfg->state_dir and loads the job it holds, or creates a
 * new job from the spec. Does not listen yet. Returns 0 and *ret_c, -EINVAL for a bad config,
 * -EEXIST when the state directory holds a different job (name mismatch), -EIO/-EACCES/
 * -ENOTDIR... for an unusable state directory or a corrupt journal (logged with the path).
 * hooks may be NULL; it is copied. Caller frees with coord_free(). */
int coord_new(const struct coord_config *cfg, const struct coord_hooks *hooks,
              struct coord **ret_c);

/* Binds the gRPC and REST ports and starts serving. Returns 0, or negative errno (port in
 * use, bad address) with nothing left running. */
int coord_start(struct coord *c);

/* The bound addresses ("127.0.0.1:41234"), valid after coord_start(); "" when off. */
const char *coord_grpc_addr(const struct coord *c);
const char *coord_rest_addr(const struct coord *c);

/* Stops serving: ends every RPC, joins the threads, flushes the journal. Idempotent; safe to
 * call from another thread than the one that calls coord_free() (never from a hook). */
void coord_shutdown(struct coord *c);

/* coord_shutdown() if needed, then releases everything. NULL-safe; returns NULL. */
struct coord *coord_free(struct coord *c);

/* ---- reading state ------------------------------------------------------------------ */

/* Copies the worker table (ordered by join order). Caller frees *ret_workers with st_free().
 * Returns 0 or -ENOMEM. */
int coord_workers_get(struct coord *c, struct coord_worker **ret_workers, size_t *ret_n);

/* Job identity and progress. Any pointer may be NULL. */
void coord_job_get(struct coord *c, char ret_job_id[ST_UUID_STR_LEN], uint64_t *ret_epoch,
                   int *ret_dp, int *ret_pp, enum coord_job_state *ret_state, uint64_t *ret_step);

/* ---- driving workers ---------------------------------------------------------------- */

/* Opens epoch current+1 with shape dp x pp and sends each assigned worker a Configure with
 * its role, every peer's data-plane address and `rendezvous` (NULL = "tcp"); start_step is the
 * step the new epoch begins at. Workers of the table that are alive and not assigned become
 * SPARE. Everything is journaled in one transaction before anything is sent.
 * Returns 0 and *ret_epoch (may be NULL); -EINVAL when an assignment names an unknown or lost
 * worker, a stage/replica outside dp x pp, a duplicate role or worker, or an empty layer
 * range; -ESHUTDOWN when the job is stopping. Nothing changes on error. */
int coord_configure(struct coord *c, int dp, int pp, const struct coord_assignment *assign,
                    size_t n, const char *rendezvous, uint64_t start_step, const char *reason,
                    uint64_t *ret_epoch);

/* How workers enter an epoch (proto ReconfigureMode). */
enum coord_reconf_mode {
    COORD_RECONF_INIT = 1,         /* a fresh model at step 0 */
    COORD_RECONF_RESTORE = 2,      /* load `dir` (a checkpoint) into the new shape */
    COORD_RECONF_MIGRATE = 3,      /* live migration: the epoch's Migrate moves the state */
    COORD_RECONF_PEER_RESTORE = 4, /* roll back to a peer copy; the Migrate brings the rest */
};

#define COORD_MAX_STAGES 1024

/* The typed part of an epoch's Configure: mode, stage boundaries, checkpoint directory. */
struct coord_epoch_setup {
    enum coord_reconf_mode mode;
    int split[COORD_MAX_STAGES + 1]; /* pp + 1 layer indices, split[0] = 0 */
    char dir[ST_SPEC_PATH_MAX];      /* RESTORE only */
};

/* coord_configure() with the epoch's setup as typed Configure fields (mode, split,
 * restore_dir). For workers of the previous release the same is also written into
 * `rendezvous` as "tcp;mode=..;split=..;dir=..". Same returns as coord_configure(). */
int coord_configure_epoch(struct coord *c, int dp, int pp, const struct coord_assignment *assign,
                          size_t n, const struct coord_epoch_setup *setup, uint64_t start_step,
                          const char *reason, uint64_t *ret_epoch);

/* Sends worker `worker_id` a Migrate (in the current epoch) with its transfers, to run at
 * step boundary at_step. Returns 0 and the command id (may be NULL); -ENOENT unknown worker,
 * -EINVAL bad transfer (unknown worker ids, count 0). */
int coord_migrate(struct coord *c, const char *worker_id, const struct coord_transfer *t,
                  size_t n, uint64_t at_step, uint64_t *ret_command_id);

/* A step lease for several workers at once: the transfer-less Migrate (at_step) that
 * coord_migrate(c, id, NULL, 0, at_step, NULL) sends, to each of ids[0..n), journaled in one
 * transaction (one wait for the disk instead of n) and delivered after it. Ids the table does
 * not hold are skipped. Returns the number of workers addressed, or negative errno (nothing
 * sent: -EINVAL bad arguments, -ESHUTDOWN the job takes no commands, the journal's error). */
int coord_grant_lease(struct coord *c, const char *const *ids, size_t n, uint64_t at_step);

/* A member of a migration's communicator (Migrate.peers): rank = index in the list. stage -1
 * marks a worker that only sends (it holds state but gets no position). */
struct coord_peer {
    char worker_id[ST_UUID_STR_LEN];
    int stage, replica;
};

/* coord_migrate() with the epoch's communicator: the coordinator fills each peer's data-plane
 * address from its table. copy_epoch, when not 0, makes it a peer restore: every participant
 * takes its state from its peer copies of (copy_epoch, at_step), never from its engine
 * (Migrate.peer_copy_epoch). first_lease (0 = none) is the new epoch's first step lease, which a
 * worker taking a position may train up to right after the migration (Migrate.lease); the
 * caller must treat it as granted. Returns 0 and the command id (may be NULL), -ENOENT
 * (unknown worker), -EINVAL (bad transfer or peer, duplicate peer, a peer without a data
 * address, a first_lease not past at_step). */
int coord_migrate_peers(struct coord *c, const char *worker_id, const struct coord_transfer *t,
                        size_t n, uint64_t at_step, const struct coord_peer *peers,
                        size_t npeers, uint64_t copy_epoch, uint64_t first_lease,
                        uint64_t *ret_command_id);

/* Sends a Checkpoint (dir, at_step) to every ACTIVE worker. Returns the number of workers
 * addressed, or negative errno. */
int coord_checkpoint(struct coord *c, const char *dir, uint64_t at_step);

/* Stops the job: state STOPPING, a Stop to every live worker, an event. Idempotent.
 * The job becomes STOPPED when no live worker is left without having acknowledged it. */
int coord_stop(struct coord *c, const char *reason);

/* Records an event (kind: short word, message: free text; worker_id may be NULL) in the
 * journal; it shows in /v1/events at once and is on disk after the next commit or tick (a
 * crash may lose the last tick's events). Returns the event's sequence number or negative
 * errno. */
int64_t coord_event(struct coord *c, const char *kind, const char *worker_id, const char *fmt,
                    ...) ST_PRINTF(4, 5);

/* Replaces the JSON object served as "detail" by GET /v1/plan (the planner's reasoning).
 * json must be a JSON object text; NULL clears. Returns 0 or -EINVAL. */
int coord_plan_detail_set(struct coord *c, const char *json);

/* ---- the planner's decisions ---------------------------------------------------------- */

/* One consultation of the planner, as GET /v1/job's "planner" object shows it. */
struct coord_planner_decision {
    int dp, pp;                    /* the shape that starts (or stays); 0x0 = none fits */
    uint64_t at_step;              /* the training step (boundary) it was made at */
    double expected_samples_per_s; /* the cost model's throughput of that shape */
    double decide_seconds;         /* time plan_decide took */
    char reason[200];              /* one line: why */
};

/* Records a decision of the planning loop: counts it (spottrain_planner_decisions_total,
 * spottrain_planner_decide_seconds), keeps it as the latest (GET /v1/job "planner") and
 * journals it as a "decision" event. predictor: the forecaster's name. */
void coord_planner_record(struct coord *c, const char *predictor,
                          const struct coord_planner_decision *d);

/* ---- metrics the end-to-end loop feeds (all start at 0 so /metrics names are stable) --- */

/* Counts one reconfiguration once the epoch that ended it made its first step (shared/DESIGN.md
 * "One meaning of stall"): bytes counted on the wire, its stall, and for a restore the steps
 * done before the loss that are trained again. Shown per kind in GET /v1/job "migrations" and
 * /metrics. A negative or non-finite stall is ignored (the call changes nothing). */
void coord_metrics_add_migration(struct coord *c, enum plan_reconf kind,
                                 uint64_t bytes, double stall_seconds, uint64_t steps_replayed);
void coord_metrics_set_instances(struct coord *c, double predicted, double actual);
/* The planner's cost model against what happened (planner/fitted.c), as sums whose means are
 * sum / count: the step time predicted when each epoch was decided and the one its steps then
 * measured (only steps whose prediction had measured steps behind it), and per kind of live
 * migration (dp-resharding counted apart too, as in the summary) the stall predicted when it
 * was ordered and the one measured. The loop sets the whole of it whenever it changes; GET
 * /v1/job "cost_model" and /metrics (spottrain_cost_model_*) show it. The arrays are indexed
 * by the live kinds of enum plan_reconf. */
struct coord_cost_model {
    uint64_t steps;
    double step_predicted, step_measured;
    uint64_t n[PLAN_RECONF_NLIVE];
    double stall_predicted[PLAN_RECONF_NLIVE], stall_measured[PLAN_RECONF_NLIVE];
    /* The same over the migrations whose prediction rested on measured migrations (this
     * job's or a cost file's), not on the spec's prior alone. */
    uint64_t cal_n[PLAN_RECONF_NLIVE];
    double cal_predicted[PLAN_RECONF_NLIVE], cal_measured[PLAN_RECONF_NLIVE];
};
void coord_metrics_set_cost_model(struct coord *c, const struct coord_cost_model *cm);
void coord_metrics_add_spend(struct coord *c, double dollars);
/* The same for a fleet whose provider answers a live spot price (aws: DescribeSpotPriceHistory):
 * instance-hours at that $/instance-hour; the price shows in GET /v1/job spot_price_per_hour
 * and /metrics spottrain_spot_price_dollars_per_hour. The loop calls it instead of add_spend. */
void coord_metrics_add_spend_live(struct coord *c, double hours, double price_per_hour);
/* Instances alive now that are under an interruption notice (only the planning loop knows:
 * it is the one polling the provider). Shown with coord_metrics_set_instances()'s counts in
 * /metrics, /v1/history and the status page. Negative values are ignored. */
void coord_metrics_set_noticed(struct coord *c, int noticed);
/* Why the planning loop waits for workers (GET /v1/job "waiting_reason", the
 * spottrain_waiting gauge of /metrics); "" when it does not wait. Copied. */
void coord_set_waiting(struct coord *c, const char *reason);

/* ---- helpers shared by the CLI commands --------------------------------------------- */

/* Reads a bearer token file: one line of printable ASCII (1..255 bytes, no spaces), trailing
 * newline and whitespace ignored. Returns 0 and fills buf, -EINVAL (with why filled) for an
 * empty or malformed token, or the negative errno of reading the file. */
int coord_token_read(const char *path, char *buf, size_t size, char *why, size_t whysz);

/* ---- names ---------------------------------------------------------------------------- */

const char *coord_worker_state_name(enum coord_worker_state s);
const char *coord_job_state_name(enum coord_job_state s);

#include "coord-loop.h" /* the planning loop (end-to-end issue) */
#include "job.h"       /* the job driver: every command runs a job through it */

#endif
