/* cli.h: the public header of cli/ — the `spottrain` command's subcommand table.
 *
 * Each subcommand lives in cli/cmd-<name>.c and exports `int cli_cmd_<name>(int argc,
 * char **argv)`, where argv[0] is the subcommand name (getopt_long ready). A subcommand
 * returns an exit code: CLI_EXIT_OK, CLI_EXIT_INPUT for invalid input (bad flags, bad spec,
 * bad trace) or CLI_EXIT_FAILURE for a runtime failure. `--help` prints usage to stdout and
 * returns CLI_EXIT_OK. */
#ifndef ST_CLI_H
#define ST_CLI_H

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

struct st_spec;
/* Makes the spec's token file from its data.synth block when the file is missing (creating its
 * folder), and says so on stderr as "spottrain NAME: wrote synthetic corpus ...". A missing
 * file without data.synth is an error when `required`, else left for the reader to report.
 * Returns CLI_EXIT_OK, CLI_EXIT_INPUT or CLI_EXIT_FAILURE. Called by `train` and `run`. */
int cli_ensure_data(const char *name, const struct st_spec *spec, bool required);

/* Prints the usage text of a subcommand to f. */
void cli_print_usage(const char *name, FILE *f);

#endif
