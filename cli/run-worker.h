/* run-worker.h: `spottrain worker ... --job JOB.yaml` — a training worker under a coordinator
 * (the worker/ runner with the cloud's notice client); cmd-worker.c hands `--job` over to it,
 * and `spottrain run` starts its workers that way. */
#ifndef ST_CLI_RUN_WORKER_H
#define ST_CLI_RUN_WORKER_H

/* Runs `spottrain worker` with --job: the same flags as the agent-only worker plus
 *   --job JOB.yaml   the job to train (model, data, optimizer)
 *   --steps N        total steps (replaces training.steps, as `train --steps` does)
 *   --threads K      kernel threads (default 1)
 *   --timeout S      data-plane no-progress limit (default 8 s)
 *   --tls-ca F, --tls-cert F, --tls-key F   as for the agent-only worker
 * argv[0] is the subcommand name. Returns an exit code (CLI_EXIT_*). */
int cli_worker_job_main(int argc, char **argv);

#endif
