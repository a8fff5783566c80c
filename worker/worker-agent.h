/* worker-agent.h: the worker's control-plane client (part of worker/'s public interface,
 * included by worker.h).
 *
 * One idea: the agent owns the conversation with the coordinator — Join with the worker's
 * persistent UUID, one Watch stream of commands, periodic Reports that double as heartbeats
 * and carry acknowledgements — and reconnects with backoff whenever the coordinator goes
 * away. What a command *does* is not its business: each new command is handed to the
 * on_command callback (the engine, next issue), whose return value becomes the ack. A command
 * id already applied is acknowledged again without calling back, so redelivery is harmless.
 *
 * Threads: worker_agent_start() starts a session thread (Join, Reports, reconnects) and, per
 * connection, a watch thread that calls on_command. worker_agent_progress()/notice() may be
 * called from any thread. */
#ifndef ST_WORKER_AGENT_H
#define ST_WORKER_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"       /* ST_UUID_STR_LEN, ST_SPEC_PATH_MAX */
#include "control.pb-c.h" /* Spottrain__V1__Command */

struct worker_agent;

struct worker_agent_config {
    char coordinator[128];    /* HOST:PORT of the coordinator's gRPC endpoint (required) */
    char token[256];          /* bearer token; "" = none */
    char id[ST_UUID_STR_LEN]; /* worker UUID; "" = load from state_dir or create */
    char job_id[ST_UUID_STR_LEN]; /* the job this worker was started for (a cloud instance's
                                     bootstrap); a coordinator running another job is refused
                                     for good; "" = any */
    char state_dir[ST_SPEC_PATH_MAX]; /* keeps the UUID across restarts; "" = none */
    char data_addr[128];      /* this worker's data-plane HOST:PORT ("" = none yet) */
    char instance_id[64];
    char zone[32];
    char instance_type[64];
    int gpus;
    double rpc_timeout;       /* seconds per unary call; 0 = 5 */
    double backoff_max;       /* seconds between reconnect attempts, at most; 0 = 2 */
    /* TLS (PEM files, read by worker_agent_new): tls_ca set = connect over TLS and trust only
     * certificates chaining to it; tls_cert + tls_key = present a client certificate (for a
     * coordinator with a client CA). All "" = plaintext. */
    char tls_ca[ST_SPEC_PATH_MAX];
    char tls_cert[ST_SPEC_PATH_MAX];
    char tls_key[ST_SPEC_PATH_MAX];
};

/* Called on the watch thread for every command not applied yet. Returns 0 when applied (ack
 * ok), negative errno when not (ack with the error text written to err). Blocking here
 * delays later commands but not heartbeats. */
typedef int worker_command_fn(struct worker_agent *a, const Spottrain__V1__Command *cmd,
                              char *err, size_t errsz, void *userdata);

struct worker_agent_ops {
    worker_command_fn *on_command; /* NULL = acknowledge everything */
    void *userdata;
};

/* Fills defaults (zeroes). */
void worker_agent_config_init(struct worker_agent_config *cfg);

/* Loads the worker UUID from state_dir/worker-id, or creates and saves a new one. When
 * want_id is a UUID it is used (and saved). Returns 0 and fills ret_id; -EINVAL for a bad
 * want_id or a corrupt id file, or the errno of the file operation. */
int worker_agent_id_load(const char *state_dir, const char *want_id,
                         char ret_id[ST_UUID_STR_LEN]);

/* Validates the config, reads the TLS files, and creates the agent (nothing connects yet).
 * Returns 0 and *ret_a; -EINVAL for a bad config (a cert without its key, TLS files without
 * tls_ca, a file that is not PEM), or the negative errno of reading a TLS file (logged with
 * the path). Caller frees with worker_agent_free(). ops may be NULL; it is copied. */
int worker_agent_new(const struct worker_agent_config *cfg, const struct worker_agent_ops *ops,
                     struct worker_agent **ret_a);

/* Starts the session thread. Returns 0 or negative errno. */
int worker_agent_start(struct worker_agent *a);

/* Waits until the agent finished (Stop applied and reported: returns 1; a fatal error such
 * as a rejected token: the negative errno) or timeout seconds passed (returns 0;
 * timeout < 0 waits forever). */
int worker_agent_wait(struct worker_agent *a, double timeout);

/* Asks the threads to end and joins them. Idempotent. */
void worker_agent_stop(struct worker_agent *a);

/* worker_agent_stop() then frees. NULL-safe; returns NULL. */
struct worker_agent *worker_agent_free(struct worker_agent *a);

/* Progress carried by the next Report: the epoch the worker runs in (0: none; not the newest
 * epoch ordered, which it may not have entered yet), last completed step, its loss (NAN when
 * this worker computes none: every pipeline stage but the last; the Report then says
 * no_loss), cumulative samples committed, wall seconds of that step, and stall seconds to
 * add. */
void worker_agent_progress(struct worker_agent *a, uint64_t epoch, uint64_t step, double loss,
                           uint64_t samples, double step_seconds, double stall_seconds);
/* Asks the session thread to send the next Report now instead of at the next interval
 * (the runner calls it when it waits for the coordinator to extend its step lease). */
void worker_agent_report_now(struct worker_agent *a);
/* Queues a notice ("terminate", "rebalance") for the next Report (at most 64 pending;
 * -ENOBUFS beyond: the coordinator has not taken a Report for that long). detail is for
 * people (255 characters kept); figures (copied; NULL: none) is what the coordinator reads. */
int worker_agent_notice(struct worker_agent *a, const char *kind, double at,
                        const char *detail, const struct st_notice_figures *figures);
/* The same for a notice whose newest one says all the older ones of its kind did (the
 * runner's "peer-copy": the generations it holds): it replaces a queued one of its kind, so a
 * coordinator slow to take Reports cannot make these crowd out the others. */
int worker_agent_notice_latest(struct worker_agent *a, const char *kind, double at,
                               const char *detail, const struct st_notice_figures *figures);
/* Notices queued and not yet delivered. */
size_t worker_agent_notices_pending(struct worker_agent *a);

/* The worker's UUID; the epoch of the last Configure applied (0 = none); whether a session
 * is established (joined and watching). */
const char *worker_agent_id(const struct worker_agent *a);
uint64_t worker_agent_epoch(struct worker_agent *a);
/* The job's id as the coordinator's last JoinResponse gave it ("" before the first Join); the
 * data plane binds it into every connection's proof. */
void worker_agent_job_id(struct worker_agent *a, char ret_id[ST_UUID_STR_LEN]);
bool worker_agent_connected(struct worker_agent *a);

#endif
