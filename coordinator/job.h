/* job.h: the job driver (part of coordinator/'s public interface, included by coordinator.h).
 *
 * One idea: every way of running a job — `spottrain run` (a simulated fleet on this machine),
 * `spottrain coordinator --train` (workers started by anyone, or a fleet the spec's provider
 * acquires), `spottrain launch` (a cloud fleet, from a user's machine) and the in-cluster
 * Kubernetes mode — is the same sequence: spec -> coordinator -> planning loop (liveput on the
 * cost model built from the spec) -> fleet -> ticks -> summary. coord_job_run() owns that
 * sequence; the commands in cli/ only parse flags, print what the driver reports through
 * struct coord_job_ui, and map its result to an exit code.
 *
 * Which fleet it drives is explicit (enum coord_job_fleet), and so is what happens to that
 * fleet when the process is asked to stop (enum coord_job_on_stop): a command on a user's
 * machine (`run`, `launch`) stops the job and releases every instance; a server that may be
 * restarted (`coordinator`, its pod rescheduled) leaves job and fleet for its restart to adopt.
 *
 * Threads: coord_job_run() runs on the caller's thread until the job ends; the ui callbacks
 * are called on that thread. The caller's signal handler only sets *stop_flag. */
#ifndef ST_COORD_JOB_H
#define ST_COORD_JOB_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "coord-loop.h" /* coord_ckpt_*_fn, struct coord_loop_summary */

struct coord_loop_status;
struct coord_loop_summary;
struct coord_config;
struct cloud_config;

enum coord_job_fleet {
    COORD_JOB_FLEET_SIM = 0,  /* the sim provider replays spec.fleet.trace; each instance is a
                               * local `spottrain worker` process (`spottrain run`) */
    COORD_JOB_FLEET_JOINERS,  /* no provider: workers started by anyone join (`coordinator
                               * --train` with provider sim) */
    COORD_JOB_FLEET_PROVIDER, /* spec.fleet.provider acquires and releases instances (aws, gcp,
                               * azure, kubernetes: `launch`, `coordinator --train`) */
};

enum coord_job_on_stop {
    COORD_JOB_STOP_RELEASE = 0, /* stop the job's workers and release every instance */
    COORD_JOB_STOP_KEEP,        /* leave the job and its fleet running for a restart of the
                                 * coordinator on the same state directory to adopt */
};

/* What the driver tells the command that runs it. All optional; called on the driver's
 * thread. Pointers are valid only during the call. */
struct coord_job_ui {
    void *userdata;
    /* The coordinator listens: its gRPC and REST addresses ("" when off), the job id and the
     * state directory. */
    void (*on_started)(const char *grpc_addr, const char *rest_addr, const char *job_id,
                       const char *state_dir, void *userdata);
    /* One line per loop event, each exactly once, in order. */
    void (*on_event)(const char *line, void *userdata);
    /* Progress, about every progress_interval seconds and once at the end. */
    void (*on_progress)(const struct coord_loop_status *st, void *userdata);
    double progress_interval; /* seconds; 0 = 0.25 */
};

/* Extends a provider's configuration with what only the command knows (the cloud's
 * bootstrap, credentials found on this machine, ...). Called after the coordinator listens and
 * after the driver filled cfg from the spec, the job's identity and the coordinator's
 * address. Returns 0 or negative errno (the job does not start). */
typedef int coord_job_provider_setup_fn(void *userdata, struct cloud_config *cfg);

struct coord_job_config {
    const struct st_spec *spec;     /* required; copied */
    char spec_path[ST_SPEC_PATH_MAX]; /* the spec's file (sim workers read it); "" = spec->path */
    struct coord_config *coord;     /* required: listen, token, journal directory (borrowed) */
    char work_dir[ST_SPEC_PATH_MAX]; /* the job's files (sim token file, checkpoints unless
                                      * spec.checkpoint.dir applies); "" = coord->state_dir */
    enum coord_job_fleet fleet;
    enum coord_job_on_stop on_stop; /* when *stop_flag is raised */
    volatile sig_atomic_t *stop_flag; /* set by the caller's SIGINT/SIGTERM handler; may be NULL */
    char save_dir[ST_SPEC_PATH_MAX]; /* final checkpoint at the end; "" = none */
    const char *shapes;             /* forced shapes "STEP:DPxPP,..." (tests); NULL = planner */
    int steps;                      /* <= 0 = spec.training.steps */
    double time_scale;              /* <= 0 = spec.fleet.time_scale (sim); 1 otherwise */
    int worker_threads;             /* sim workers' --threads; <= 0 = 1 */
    char worker_exe[ST_SPEC_PATH_MAX]; /* sim workers' program; "" = this executable */
    double heartbeat_deadline;      /* <= 0 = the spec's (sim: 6 s) */
    /* Checkpoint store: the driver calls these, it never reads checkpoints itself (the
     * coordinator does not link migrate/). Required for restores and periodic checkpoints. */
    coord_ckpt_latest_fn *ckpt_latest;
    coord_ckpt_prune_fn *ckpt_prune;   /* NULL = keep every checkpoint */
    coord_ckpt_commit_fn *ckpt_commit;
    void *ckpt_userdata;
    coord_job_provider_setup_fn *provider_setup; /* PROVIDER fleets; may be NULL */
    void *provider_userdata;
    struct coord_job_ui ui;
};

/* Fills defaults (zeroes) into cfg. */
void coord_job_config_init(struct coord_job_config *cfg);

/* Runs the job until every step is done (and saved, with save_dir), the job gives up, or
 * *stop_flag is raised (then as cfg->on_stop says). Fills *ret_sum (may be NULL) with the
 * summary. Returns 0 when the job finished, 1 when it ended unfinished (stopped, given up),
 * -EINVAL for a configuration that cannot run (logged, nothing started: unknown provider,
 * unusable trace), or another negative errno when something could not start (logged). Every
 * worker process and instance the driver started is released before it returns, unless
 * on_stop is KEEP and the stop flag ended the run. */
int coord_job_run(const struct coord_job_config *cfg, struct coord_loop_summary *ret_sum);

#endif
