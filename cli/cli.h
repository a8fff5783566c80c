/* cli.h: the public header of cli/ — the `spottrain` command's subcommand table.
 *
 * Each subcommand lives in cli/cmd-<name>.c and exports `int cli_cmd_<name>(int argc,
 * char **argv)`, where argv[0] is the subcommand name (getopt_long ready). A subcommand
 * returns an exit code: CLI_EXIT_OK, CLI_EXIT_INPUT for invalid input (bad flags, bad spec,
 * bad trace) or CLI_EXIT_FAILURE for a runtime failure. `--help` prints usage to stdout and
 * returns CLI_EXIT_OK. */
#ifndef ST_CLI_H
#define ST_CLI_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#define CLI_EXIT_OK 0
#define CLI_EXIT_FAILURE 1
#define CLI_EXIT_INPUT 2

typedef int cli_cmd_fn(int argc, char **argv);

struct cli_command {
    const char *name;
    const char *summary; /* one line for `spottrain --help` */
    const char *usage;   /* full text for `spottrain help NAME` and `NAME --help` */
    cli_cmd_fn *fn;
};

/* Declarations from commands.def: one X(name, summary, usage) line per subcommand. */
#define X(name, summary, usage) int cli_cmd_##name(int argc, char **argv);
#include "commands.def"
#undef X

/* Looks a subcommand up by name; NULL when unknown. */
const struct cli_command *cli_command_find(const char *name);

/* Prints "spottrain NAME: message" and a hint to stderr; returns CLI_EXIT_INPUT. */
int cli_usage_error(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The end of a getopt_long switch whose table maps --help to 'h': prints the usage and returns
 * CLI_EXIT_OK for 'h', else says "unknown or incomplete option '...'" (the argv[optind - 1]
 * getopt stopped at) and returns CLI_EXIT_INPUT. */
int cli_opt_help_or_unknown(const char *name, int c, char **argv);

struct st_spec;
/* Makes the spec's token file from its data.synth block when the file is missing (creating its
 * folder), and says so on stderr as "spottrain NAME: wrote synthetic corpus ...". A missing
 * file without data.synth is an error when `required`, else left for the reader to report.
 * Returns CLI_EXIT_OK, CLI_EXIT_INPUT or CLI_EXIT_FAILURE. Called by `train` and `run`. */
int cli_ensure_data(const char *name, const struct st_spec *spec, bool required);

/* Loads a job spec for subcommand `name`, printing every error as file:line:column: field:
 * message (and "... and N more"). Returns CLI_EXIT_OK, CLI_EXIT_INPUT (bad or unreadable
 * spec) or CLI_EXIT_FAILURE (out of memory). The one spec loader of the commands. */
int cli_spec_load(const char *name, const char *path, struct st_spec *ret_spec);

/* Refuses a spec no (dp, pp) shape can run (plan_feasible): prints one line
 * "path:line:column: field: message" on stderr, naming the field to change and the nearest
 * workable shapes. Returns CLI_EXIT_OK, CLI_EXIT_INPUT (infeasible) or CLI_EXIT_FAILURE.
 * Called by cli_spec_load() and `validate`. */
int cli_spec_feasible(const char *path, const struct st_spec *spec);

/* ---- running a job through the driver (job-ui.c) ------------------------------------------ */

#include <stdint.h>

#include "coordinator.h" /* struct coord_job_config, coord_loop_status, coord_loop_summary */

/* The checkpoint store the job driver is handed: migrate/'s latest and prune, and the
 * manifest commit that needs worker/'s model description (userdata: const struct st_spec *). */
int cli_ckpt_latest(void *userdata, const char *root, char *dir, size_t dirsz,
                    uint64_t *ret_step);
int cli_ckpt_prune(void *userdata, const char *root, int keep);
int cli_ckpt_commit(void *userdata, const char *dir, uint64_t step, int dp, int pp);
/* Sets jc's checkpoint callbacks to the three above (spec borrowed). */
void cli_job_ckpt_store(struct coord_job_config *jc, const struct st_spec *spec);

/* How a command shows a running job: events one line each, once; on a terminal a status block
 * redrawn in place below them, elsewhere a progress line every 2 s. */
struct cli_job_ui {
    const char *cmd;      /* "run", "coordinator", "launch" */
    const char *prefix;   /* put before each line ("" or "coordinator: ") */
    bool tty;
    int drawn;            /* lines of the status block on screen */
    bool have_status;
    struct coord_loop_status last;
    double last_line;
    char rest[128];       /* the REST address, once started */
    /* On a terminal, while the job runs, our stderr (and the sim's workers', which inherit
     * it) goes through a pipe whose reader prints each line above the status block, so that
     * no log line lands inside the block and leaves a stale copy of it (job-ui.c). */
    pthread_mutex_t lock; /* the block and the terminal, between the driver and the reader */
    int err_fd;           /* the terminal's stderr while captured; -1 = not captured */
    int pipe_rd;
    pthread_t reader;
    _Atomic bool reader_done;
};
/* Fills u and the driver's ui callbacks (*ret) that print through it. */
void cli_job_ui_init(struct cli_job_ui *u, const char *cmd, const char *prefix,
                     struct coord_job_ui *ret);
/* Draws the status block (terminal) or one progress line. */
void cli_job_ui_draw(struct cli_job_ui *u, const struct coord_loop_status *st);
/* Before the summary: erases the status block (terminal) or prints the last progress line. */
void cli_job_ui_finish(struct cli_job_ui *u);
/* The closing summary table. */
void cli_job_print_summary(FILE *f, const struct coord_loop_summary *s, const struct st_spec *sp);
/* The summary as JSON (`--json-summary`). Returns 0 or negative errno. */
int cli_job_write_json(const char *path, const struct coord_loop_summary *s);

/* Prints the usage text of a subcommand to f. */
void cli_print_usage(const char *name, FILE *f);

#endif
