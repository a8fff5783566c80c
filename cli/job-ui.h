/* job-ui.h: internal to cli/ — what `run` and `launch` share around the job driver: one
 * allocation holding the driver's configuration and summary, the state directory, the run
 * under SIGINT/SIGTERM, and the closing summary with its --json-summary file.
 *
 * Who calls: cmd-run.c and cmd-launch.c. `coordinator --train` keeps its own (a server: its
 * caller owns the coordinator config, it ignores SIGHUP and prints a one-line result). */
#ifndef ST_CLI_JOB_UI_H
#define ST_CLI_JOB_UI_H

#include <stdbool.h>
#include <stddef.h>

#include "cli.h" /* struct cli_job_ui, CLI_EXIT_* */
#include "coordinator.h" /* struct coord_config, coord_job_config, coord_loop_summary */

/* One job run by a command. cc, jc and sum are large, so they come from one st_calloc. */
struct cli_job {
    const char *cmd;                /* "run", "launch": the name in every message */
    struct coord_config cc;         /* jc.coord points here */
    struct coord_job_config jc;
    struct coord_loop_summary sum;  /* written by cli__job_run() */
    struct cli_job_ui ui;           /* jc.ui prints through it */
};

/* Allocates a job for command cmd (a string literal, borrowed) with cc and jc initialised:
 * jc's spec, spec_path, coord, save_dir (save may be NULL), stop flag, checkpoint store and
 * ui (cli_job_ui_init with prefix "") are set; the caller sets the fleet and what differs.
 * spec and spec_path are borrowed for the job's life. On allocation failure prints
 * "spottrain CMD: out of memory" and returns NULL. Caller frees with st_free(). */
struct cli_job *cli__job_new(const char *cmd, const struct st_spec *spec, const char *spec_path,
                             const char *save);

/* Makes the state directory into state[statesz]: dir with its parents (mode 0700), or, when
 * dir is NULL, a fresh $TMPDIR/spottrain-CMD-XXXXXX. what names dir in the error
 * "spottrain CMD: cannot create WHAT 'DIR'": `run` says "--state-dir" (the user gave it),
 * `launch` says "the state directory" (it may be the default it chose). Returns CLI_EXIT_OK,
 * CLI_EXIT_INPUT (dir cannot be made) or CLI_EXIT_FAILURE (no temporary directory). */
int cli__job_state_dir(const char *cmd, const char *dir, const char *what, char *state,
                       size_t statesz);

/* Checks, before anything starts, that what the job writes at its end can be written: save
 * (NULL: none) with mig_ckpt_check_dest when it is a store URL, or a local directory and
 * local_save (the workers run here: `run`; a cloud fleet's workers write a local path on their
 * own disks, which is not ours to make); json (NULL: none), the --json-summary file, must be
 * creatable or writable. Prints "spottrain CMD: cannot use --save 'DIR': WHY" or "spottrain
 * CMD: cannot write --json-summary 'FILE': WHY" and returns CLI_EXIT_INPUT (CLI_EXIT_FAILURE
 * when out of memory); else CLI_EXIT_OK. */
int cli__job_check_outputs(const char *cmd, const char *save, bool local_save, const char *json);

/* Checks that the file path a flag names can be created or written: prints "spottrain CMD:
 * cannot write FLAG 'PATH': WHY" and returns CLI_EXIT_INPUT, else CLI_EXIT_OK. */
int cli__job_check_file(const char *cmd, const char *flag, const char *path);

/* Catches SIGINT and SIGTERM into the job's stop flag, ignores SIGPIPE (a worker or REST
 * client gone mid-write is not our death) and runs the driver into j->sum. A negative result
 * is printed as "spottrain CMD: <strerror>" and returned for the caller to map to an exit
 * code; else the driver's 0 (finished) or 1 (stopped, gave up). */
int cli__job_run(struct cli_job *j);

/* Whether SIGINT or SIGTERM arrived during cli__job_run(). */
bool cli__job_stopped(void);

/* Prints the summary table and writes --json-summary (json may be NULL) for a driver result
 * r >= 0. Returns CLI_EXIT_OK when r is 0, else CLI_EXIT_FAILURE, as cli__job_json() says. */
int cli__job_summary(struct cli_job *j, int r, const char *json);

/* Writes the summary JSON to json (NULL: nothing). On failure prints "spottrain CMD: cannot
 * write 'PATH': <strerror>" and returns CLI_EXIT_FAILURE; else returns code unchanged. */
int cli__job_json(const struct cli_job *j, const char *json, int code);

/* Writes the migration costs the job fitted (the summary's cost_model.fitted) to path (NULL:
 * nothing) as a cost file that planner.migration_costs reads, so a later job starts from
 * them, and prints "costs: PATH (...)". Without a measured live migration it writes nothing
 * and says so. On a failed write prints "spottrain CMD: cannot write --save-costs 'PATH':
 * WHY" and returns CLI_EXIT_FAILURE; else returns code unchanged. */
int cli__job_save_costs(const struct cli_job *j, const char *path, int code);

#endif
