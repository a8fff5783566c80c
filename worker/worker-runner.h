/* worker-runner.h: the worker process under a coordinator (part of worker/'s public interface).
 *
 * One idea: one thread owns the engine and the data plane and turns the coordinator's commands
 * into actions at step boundaries. The agent's watch thread only queues commands; the runner
 * thread trains while the coordinator's step lease allows, writes checkpoints and reshapes at
 * the boundary each command names, and tells the coordinator what happened through Reports
 * (progress) and notices ("reconfigured", "reconfig-failed", "step-failed", "checkpointed",
 * and the cloud's own "terminate"). docs/live-migration.md describes the protocol.
 *
 * The Configure of an epoch carries, in its rendezvous string,
 *     tcp;mode=init|migrate|restore;split=B0,B1,...,Bpp[;dir=PATH]
 * (stage boundaries of the new layout; dir = the checkpoint of a restore, always last).
 * mode=init and mode=restore act at once, on the Configure's peer list (rank = position);
 * mode=migrate waits for the epoch's Migrate, whose peer list is the communicator of the
 * migration (new positions first, then workers that only send), and runs its transfers at
 * the Migrate's at_step. A Migrate of the current epoch with no peers and no transfers is a
 * step lease: train steps < at_step. */
#ifndef ST_WORKER_RUNNER_H
#define ST_WORKER_RUNNER_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"       /* struct st_spec */
#include "worker-agent.h" /* struct worker_agent_config */

#define WORKER_RUNNER_SPARE_STAGE 0xffffffffu /* Peer.stage of a send-only participant */

/* Polls the cloud's interruption notice once. Returns 1 and fills kind ("terminate",
 * "rebalance", ...) and *ret_at (Unix seconds of the action) when a notice is present, 0 when
 * none, negative errno on a failed poll (retried later). */
typedef int worker_notice_poll_fn(void *userdata, char *kind, size_t kindsz, double *ret_at);

/* Called on the runner thread, once, when a migration after the cloud's notice has moved all
 * of this worker's state away (it is a spare now): the cloud may take the instance at once
 * (Azure: acknowledge the Scheduled Event). Gets notice_userdata. */
typedef void worker_state_left_fn(void *userdata);

struct worker_runner_config {
    struct worker_agent_config agent; /* data_addr is replaced by advertise_addr, or else by
                                         the endpoint's address */
    char bind_host[64];               /* data-plane listen host; "" = 127.0.0.1 */
    int port;                         /* data-plane port; 0 = any */
    char advertise_addr[64];          /* HOST:PORT peers dial (a NAT, a proxy); "" = the
                                         endpoint's own address */
    struct st_spec spec;              /* the job (model, data, training); copied */
    int steps;                        /* total steps (LR schedule and end); <= 0 = spec's */
    int threads;                      /* kernel threads; 0 = 1 */
    double timeout;                   /* data-plane no-progress limit, seconds; 0 = 8 */
    double reconfig_timeout;          /* longest wait for the parts of one reconfiguration,
                                         seconds; 0 = 60. A worker that reaches a migration's
                                         handshake without training up to its boundary (a
                                         spare) waits for its peers this much longer than
                                         timeout: they may be that far from the boundary */
    double boundary_delay;            /* tests: a worker that trained up to a migration's
                                         boundary waits this long (or until an order of a
                                         later epoch comes), seconds, before its
                                         handshake (SPOTTRAIN_TEST_BOUNDARY_DELAY) */
    uint64_t stall_step;              /* tests: before step N (1-based) the worker holds, once,
                                         reporting as usual, until an order of a later epoch
                                         comes (SPOTTRAIN_TEST_STALL_STEP); 0 = never */
    bool leave_killed;                /* tests: a noticed worker that leaves a live migration
                                         SIGKILLs itself once its state is sent, before it
                                         tells anyone, as a VM deleted the moment its worker
                                         acknowledges (SPOTTRAIN_TEST_LEAVE_KILLED=1) */
    bool connect_at_boundary;         /* benches: a live migration's comms are built at its
                                         boundary, as before they were built ahead of it
                                         (SPOTTRAIN_TEST_CONNECT_AT_BOUNDARY=1) */
    bool shared_move;                 /* benches: a migration into a pipeline moves its state
                                         after the boundary on the main communicator, as
                                         before the move channel, and the first pipeline
                                         message waits for all of it
                                         (SPOTTRAIN_TEST_SHARED_MOVE=1; every worker of the
                                         job must agree) */
    double tied_delay;                /* tests: a live migration's move after the boundary
                                         waits this long, seconds, before the tied copies of
                                         wte, which it moves last, so the head's gate must
                                         wait for them (SPOTTRAIN_TEST_TIED_DELAY) */
    worker_notice_poll_fn *poll_notice; /* NULL = no cloud notices */
    void *notice_userdata;
    worker_state_left_fn *state_left;   /* NULL = nothing to tell */
    double notice_interval;           /* seconds between polls; 0 = 0.2 */
};

/* Fills defaults (zeroes, spec defaults). */
void worker_runner_config_init(struct worker_runner_config *cfg);

/* Runs a worker until the coordinator stops it (returns 0), SIGTERM/SIGINT arrives when
 * `signals` is non-NULL and one of its members is pending (returns 0), or a fatal error
 * (negative errno, logged: data unreadable, token refused, endpoint unavailable). Blocks. */
int worker_runner_run(const struct worker_runner_config *cfg);

/* The epoch's setup from a Configure: its typed fields (mode, split, restore_dir), or, when
 * mode is unset (a coordinator of the previous release), the legacy "tcp;mode=..;split=..;
 * dir=.." rendezvous string through worker_rendezvous_parse(). Same outputs and returns. */
int worker_configure_setup(const Spottrain__V1__Configure *cf, char *mode, size_t modesz,
                           int *ret_split, int max, int *ret_nsplit, char *dir, size_t dirsz);

/* Parses a rendezvous string (format above). Writes the mode ("init", "migrate", "restore")
 * into mode, the pp+1 boundaries into ret_split (at most max entries) and their count into
 * *ret_nsplit, and the checkpoint directory into dir ("" when none). Returns 0 or -EINVAL. */
int worker_rendezvous_parse(const char *s, char *mode, size_t modesz, int *ret_split,
                            int max, int *ret_nsplit, char *dir, size_t dirsz);

#endif
