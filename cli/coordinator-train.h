/* coordinator-train.h: `spottrain coordinator --train` — the standalone coordinator running
 * its job through the job driver (coordinator/job.h). */
#ifndef ST_CLI_COORDINATOR_TRAIN_H
#define ST_CLI_COORDINATOR_TRAIN_H

#include "common.h"
#include "coordinator.h"

/* Runs the coordinator described by cfg (spec, listen addresses, token, state directory)
 * with the planning loop until every step of the job is done (then Stop, exit 0), the job
 * gives up (exit 1), or SIGTERM/SIGINT arrives (exit 0; the job and its fleet are left for a
 * restart on the same state directory to adopt). With provider sim, workers come and go by
 * themselves; with a cloud or kubernetes provider, the provider acquires them. save: final
 * checkpoint directory or NULL. Prints the listening line of `spottrain coordinator` and one
 * line per event. kubeconfig: the kubernetes provider's kubeconfig file, or NULL ($KUBECONFIG,
 * else the in-cluster service account). shapes: forced shapes "STEP:DPxPP,..." (checked by
 * the caller; tests that need a given migration at a given step), or NULL for the planner.
 * Returns an exit code. */
int cli_coordinator_train(struct coord_config *cfg, const struct st_spec *spec,
                          const char *save, const char *kubeconfig, const char *shapes);

#endif
