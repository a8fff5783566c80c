/* run-worker.h: `spottrain worker ... --job JOB.yaml` — a training worker under a coordinator
 * (the worker/ runner with the cloud's notice client); cmd-worker.c hands `--job` over to it,
 * and `spottrain run` starts its workers that way. */
#ifndef ST_CLI_RUN_WORKER_H
#define ST_CLI_RUN_WORKER_H

#include <stdbool.h>

/* Runs `spottrain worker` with --job: the same flags as the agent-only worker plus
 *   --job JOB.yaml   the job to train (model, data, optimizer)
 *   --steps N        total steps (replaces training.steps, as `train --steps` does)
 *   --threads K      kernel threads (default 1)
 *   --timeout S      data-plane no-progress limit (default 8 s)
 *   --tls-ca F, --tls-cert F, --tls-key F   as for the agent-only worker
 * argv[0] is the subcommand name. Returns an exit code (CLI_EXIT_*). */
int cli_worker_job_main(int argc, char **argv);

/* ---- what the agent-only and the training worker share (cmd-worker.c) ------------------- */

#include <getopt.h> /* struct option */

struct worker_agent_config;

/* The option-table rows of the flags both workers take; their short codes are the ones
 * cli__worker_agent_flag() parses and the per-worker flags each switch handles. */
#define CLI_WORKER_AGENT_OPTIONS                                                           \
    {"coordinator", required_argument, NULL, 'c'},                                         \
    {"token-file", required_argument, NULL, 't'},                                          \
    {"id", required_argument, NULL, 'i'},                                                  \
    {"job-id", required_argument, NULL, 'J'},                                              \
    {"state-dir", required_argument, NULL, 'd'},                                           \
    {"data-addr", required_argument, NULL, 'a'},                                           \
    {"zone", required_argument, NULL, 'z'},                                                \
    {"instance-id", required_argument, NULL, 'I'},                                         \
    {"instance-type", required_argument, NULL, 'T'},                                       \
    {"gpus", required_argument, NULL, 'g'},                                                \
    {"tls-ca", required_argument, NULL, 'A'},                                              \
    {"tls-cert", required_argument, NULL, 'C'},                                            \
    {"tls-key", required_argument, NULL, 'K'}

/* Parses getopt's opt with value v when it is one of the flags both workers read the same
 * way: --coordinator, --id, --job-id, --state-dir into *a, --token-file into *ret_token_file
 * and --id into *ret_want_id (both borrowed from argv). Returns 0 when parsed, 1 when opt is
 * another flag (the caller's switch handles it), -EINVAL after printing the usage error. */
int cli__worker_agent_flag(struct worker_agent_config *a, int opt, const char *v,
                           const char **ret_token_file, const char **ret_want_id);

/* The checks after parsing: --coordinator given, --tls-cert with --tls-key and --tls-ca.
 * job_missing is the training worker's "--job is required", checked between the two so each
 * worker reports the first problem as it always has; the agent-only worker passes false.
 * Prints the usage error and returns CLI_EXIT_INPUT, else CLI_EXIT_OK. */
int cli__worker_agent_check(const struct worker_agent_config *a, bool job_missing);

/* The worker's identity: the join token from token_file (may be NULL) into a->token, the
 * worker id from a->state_dir (made when missing; want_id may be NULL) into a->id, and the
 * log role. Prints why and returns CLI_EXIT_INPUT or CLI_EXIT_FAILURE, else CLI_EXIT_OK. */
int cli__worker_agent_identity(struct worker_agent_config *a, const char *token_file,
                               const char *want_id);

#endif
