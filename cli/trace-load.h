/* trace-load.h: internal to cli/ — reading a spot trace named on the command line, with the
 * errors printed the one way `predict` and `simulate` print them. */
#ifndef ST_CLI_TRACE_LOAD_H
#define ST_CLI_TRACE_LOAD_H

struct plan_trace;

/* Reads the trace file path (at most 64 MiB, any format plan_trace_parse() detects) into
 * *ret; caller frees with plan_trace_free(). On failure prints "spottrain CMD: cannot read
 * trace 'PATH': <strerror>" or "spottrain CMD: PATH:LINE:COL: ..." and returns
 * CLI_EXIT_INPUT, or CLI_EXIT_FAILURE when out of memory while parsing; else CLI_EXIT_OK. */
int cli__trace_load(const char *cmd, const char *path, struct plan_trace **ret);

/* cli__trace_load() for a spec's fleet.trace, read only to find its errors before a job
 * starts (`validate`, `run`): the same messages and return codes. */
int cli__trace_check(const char *cmd, const char *path);

#endif
