/* coordinator-train.h: `spottrain coordinator --train` — the standalone coordinator driving the
 * job with the planning loop (coordinator/loop.c) instead of the built-in policy. */
#ifndef ST_CLI_COORDINATOR_TRAIN_H
#define ST_CLI_COORDINATOR_TRAIN_H

#include <signal.h>

#include "common.h"
#include "coordinator.h"
#include <stddef.h>
#include <stdint.h>

/* Newest valid checkpoint under root (mig_ckpt_latest) and its step: the loop's
 * coord_ckpt_latest_fn. */
int cli_ckpt_latest(void *userdata, const char *root, char *dir, size_t dirsz,
                    uint64_t *ret_step);

/* Removes ROOT/step-N directories beyond the newest `keep` committed ones (manifest.json
 * present); newer uncommitted ones (still being written) stay. The loop's coord_ckpt_prune_fn.
 * Returns the number removed or negative errno. */
int cli_ckpt_prune(void *userdata, const char *root, int keep);

/* Commits a checkpoint the workers wrote in the background: manifest.json for the job's model
 * (userdata: the const struct st_spec *) at `step`. The loop's coord_ckpt_commit_fn. */
int cli_ckpt_commit(void *userdata, const char *dir, uint64_t step, int dp, int pp);

/* Runs the coordinator described by cfg (spec, listen addresses, token, state directory)
 * with the planning loop until every step of the job is done (then Stop, exit 0), the job
 * gives up (exit 1), or a signal of `set` arrives (SIGTERM/SIGINT: clean shutdown, exit 0; the
 * job is not stopped, so a restart resumes it). Workers come and go by themselves (no cloud
 * provider). save: final checkpoint directory or NULL. The signals of set must be blocked.
 * Prints the listening line of `spottrain coordinator`. Returns an exit code. */
int cli_coordinator_train(struct coord_config *cfg, const struct st_spec *spec,
                          const char *save, const sigset_t *set);

#endif
