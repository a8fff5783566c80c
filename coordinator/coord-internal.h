/* coord-internal.h: internal to coordinator/ — the coordinator object shared by state.c
 * (tables, liveness, policy), commands.c (the commands it sends), published.c (the figures
 * the loop and the job driver hand it to show), grpc-server.c (RPCs), rest.c (HTTP) and
 * validate.c (message checks).
 *
 * One idea: one lock (c->lock) guards every table and the journal; the gRPC thread and the
 * HTTP thread take it per request, and hooks are queued as notes under the lock and run
 * after it is released. */
#ifndef ST_COORD_INTERNAL_H
#define ST_COORD_INTERNAL_H

#include <grpc/grpc.h>
#include <pthread.h>

#include "control.pb-c.h" /* Spottrain__V1__* messages */
#include "coordinator.h"
#include "history.h" /* struct coord_history: the series of /v1/history */
#include "journal.h"

#define COORD_MAGIC 0x434f4f52u /* "COOR" */
#define COORD_MAX_WORKERS 100000
#define COORD_MAX_TRANSFERS 1000000
#define COORD_MAX_NOTICES 64
#define COORD_MAX_ACKS 1024
#define COORD_MAX_PEERS 65536
#define COORD_DP_KEY_BYTES 32    /* master key and per-epoch data-plane secret */
#define COORD_NOTICE_DP_AUTH "data-auth-failed" /* a worker's data plane refused a connection */

struct coord_watch;

/* A worker in memory: the public row plus what only the server needs. */
struct coord_wk {
    struct coord_worker pub;    /* pub.last_seen_ago is computed on copy */
    double last_seen;           /* st_now() of its last authenticated RPC */
    uint64_t next_command;      /* id the next command gets */
    struct coord_watch *watch;  /* open Watch stream, or NULL */
};

enum coord_note_type { COORD_NOTE_JOINED, COORD_NOTE_REJOINED, COORD_NOTE_LOST,
                       COORD_NOTE_MEMBERSHIP, COORD_NOTE_ACK };

/* A hook call waiting for the lock to be released. */
struct coord_note {
    enum coord_note_type type;
    struct coord_worker w;
    uint64_t command_id;
    bool ok;
    char error[128];
};

/* A packed command waiting to be pushed on a worker's stream after its commit. */
struct coord_outgoing {
    struct coord_wk *wk;
    void *data;
    size_t len;
};


/* /metrics and REST count each reconfiguration once, by what it was (the plan's class or the
 * restore's kind). dp-resharding, which the run summary counts apart as well, is not one of
 * them. */
static inline bool coord__counted_kind(enum plan_reconf k) {
    return (unsigned)k < PLAN_RECONF_NKINDS && k != PLAN_RECONF_DP_RESHARDING;
}
struct coord {
    uint32_t magic;
    struct coord_config cfg;
    struct st_spec spec;
    struct coord_hooks hooks;
    pthread_mutex_t lock;
    struct coord_journal *journal;

    struct coord_job_row job;
    bool job_dirty;              /* progress not yet flushed to the journal */
    struct coord_wk **workers;   /* join order */
    size_t nworkers, capworkers;
    int next_order;
    bool membership_dirty;
    double membership_at;        /* st_now() of the last membership change */
    bool waiting_logged;         /* "not enough workers" event already recorded */

    struct coord_note *notes;
    size_t nnotes, capnotes;

    /* metrics (memory only; the journal keeps the job's progress), per coord__counted_kind() */
    uint64_t mig_count[PLAN_RECONF_NKINDS], mig_bytes[PLAN_RECONF_NKINDS];
    double mig_stall[PLAN_RECONF_NKINDS];      /* seconds */
    uint64_t mig_replayed[PLAN_RECONF_NKINDS]; /* steps trained again after a restore */
    struct coord_cost_model cost_model;          /* coord_metrics_set_cost_model */
    double stall_total, predicted, actual, spend;
    double spot_price_live;      /* $/instance-hour the cloud answers now; 0 = none */
    double od_spend;             /* on-demand dollars, tracked once a live price is in use */
    uint64_t reports, rejected_auth, rejected_invalid, commands_sent;
    char *plan_detail;           /* JSON object text or NULL */
    int noticed;                 /* instances alive under a notice (coord_metrics_set_noticed) */
    /* The job's loss is that of the newest step a loss-computing worker (the last pipeline
     * stage) reported: job.loss holds it; these say which (epoch, step) it belongs to. */
    uint64_t loss_epoch, loss_step;
    double samples_per_second;   /* global batch / step seconds of that report; 0 = none yet */
    struct coord_history history; /* history.c */
    /* the planner (coord_planner_record) */
    char planner_predictor[32];  /* "" until the first decision */
    uint64_t planner_decisions;
    double planner_decide_seconds;
    struct coord_planner_decision planner_last;
    char waiting_reason[200];    /* coord_set_waiting; "" while not waiting */

    /* gRPC */
    grpc_server *server;
    grpc_completion_queue *cq;
    void *m_join, *m_watch, *m_report;
    pthread_t cq_thread;
    bool cq_started;
    bool shutting_down;
    bool shut;
    double last_tick, last_flush;
    double deaf_counted; /* coord__journal_waited() as the last tick credited it */
    char grpc_addr[COORD_ADDR_MAX];

    /* REST */
    struct MHD_Daemon *mhd;
    char rest_addr[COORD_ADDR_MAX];

    /* TLS (tls.c): PEM texts, NULL when TLS is off; tls_ca_pem NULL = no client certs */
    char *tls_cert_pem, *tls_key_pem, *tls_ca_pem;

    /* data-plane secrets (dp-secret.c): the master key every epoch's secret derives from */
    unsigned char dp_master[COORD_DP_KEY_BYTES];
    bool dp_loaded;
    uint64_t dp_auth_failures;   /* connections the workers' data planes refused */
};

/* ---- state.c (all called with c->lock held unless said otherwise) ------------------- */

/* Joined, active or spare: a worker the job can still command. */
static inline bool coord__worker_live(enum coord_worker_state s) {
    return s == COORD_WORKER_JOINED || s == COORD_WORKER_ACTIVE || s == COORD_WORKER_SPARE;
}
struct coord_wk *coord__worker_find(struct coord *c, const char *id);
/* Heartbeat deadline in seconds and the Report interval it implies. */
double coord__deadline(const struct coord *c);
double coord__heartbeat_interval(const struct coord *c);
/* Queues a hook call. */
void coord__note(struct coord *c, enum coord_note_type type, const struct coord_worker *w);
/* Runs queued hooks; called WITHOUT the lock (takes it to pop notes). */
void coord__run_notes(struct coord *c);
/* Applies a validated Join; fills the response fields. */
int coord__apply_join(struct coord *c, const Spottrain__V1__JoinRequest *req, bool *ret_rejoined);
/* Applies a validated Report of a known worker: -ENOENT when unknown. */
int coord__apply_report(struct coord *c, const Spottrain__V1__ReportRequest *req);
/* Liveness, settle-then-replan, progress flush, stopped detection. Called on the cq thread. */
void coord__tick(struct coord *c, double now);
/* Public-row copy with last_seen_ago filled in. */
void coord__worker_copy(const struct coord *c, const struct coord_wk *wk, struct coord_worker *out);
/* Counts workers by state into counts[COORD_WORKER_NSTATES]. */
void coord__count_states(const struct coord *c, size_t counts[COORD_WORKER_NSTATES]);
/* published.c: what the instance-hours spent so far would have cost on demand: spend scaled
 * by the spec's on-demand / spot price ratio (0 without a spot price, when nothing is spent
 * either). */
double coord__on_demand_dollars(const struct coord *c);
/* Event with the lock held. */
int64_t coord__event_locked(struct coord *c, const char *kind, const char *worker_id,
                            const char *fmt, ...) ST_PRINTF(4, 5);

/* ---- commands.c (c->lock held) ------------------------------------------------------ */

/* Appends the redelivery set (last Configure + unacked) to a fresh stream. */
int coord__watch_fill(struct coord *c, struct coord_wk *wk, struct coord_watch *w);
/* The job is pending or running: it takes new commands. */
bool coord__job_accepts_commands(const struct coord *c);
/* Journals and sends epoch (dp, pp)'s Configure to the workers of a[n] (coord_configure_epoch
 * with the lock held; the built-in policy's tick calls it too). */
int coord__configure_locked(struct coord *c, int dp, int pp, const struct coord_assignment *a,
                            size_t n, const char *rendezvous,
                            const struct coord_epoch_setup *setup, uint64_t start_step,
                            const char *reason, uint64_t *ret_epoch);

/* ---- grpc-server.c ------------------------------------------------------------------ */

int coord__grpc_start(struct coord *c);
void coord__grpc_stop(struct coord *c);
/* Queues a packed Command (copied) on a stream and starts writing it; lock held. */
int coord__watch_push(struct coord *c, struct coord_watch *w, const void *data, size_t len);
/* Ends a stream with a status (superseded, stop); lock held. */
void coord__watch_end(struct coord *c, struct coord_watch *w, grpc_status_code code,
                      const char *why);
/* True when "authorization: Bearer <token>" matches (constant-time compare). */
bool coord__auth_ok(const struct coord *c, const grpc_metadata_array *md);

/* ---- rest.c -------------------------------------------------------------------------- */

int coord__rest_start(struct coord *c);
void coord__rest_stop(struct coord *c);
/* The Prometheus text of /metrics (lock held). Caller frees with st_free(). */
char *coord__metrics_text(struct coord *c);

/* One REST request as plain data: what libmicrohttpd's callback hands to coord__rest_handle,
 * and what tests/fuzz/fuzz-rest.c builds from its input. */
struct coord_rest_kv {
    const char *name, *value;
};
struct coord_rest_request {
    const char *method;                  /* "GET", "POST", ... as sent */
    const char *url;                     /* the path, without the query string */
    const struct coord_rest_kv *args;    /* decoded query arguments, in order */
    size_t nargs;
    const struct coord_rest_kv *headers; /* request headers, in order */
    size_t nheaders;
    const char *body;                    /* may be NULL: no route reads a body yet */
    size_t body_len;                     /* bytes of body received (over 65536: refused) */
    bool client_cert_ok;                 /* a verified TLS client certificate came with it */
};
struct coord_rest_reply {
    unsigned status;          /* HTTP status */
    const char *content_type; /* static string */
    const char *allow;        /* the Allow header (405), static, or NULL */
    bool asset;               /* body is a compiled-in page or icon: not freed, no-frame headers */
    char *body;               /* malloc()ed (libmicrohttpd frees it with free()) unless asset */
    size_t len;
};
/* Answers one request: routes, authentication, limits. Takes the lock itself (not held on
 * entry). Returns 0 with ret_reply filled (release it with coord__rest_reply_done, or hand
 * its body to libmicrohttpd), -ENOMEM when the answer could not be built, -EINVAL on bad
 * arguments. Callers: rest.c's on_request, tests/fuzz/fuzz-rest.c. */
int coord__rest_handle(struct coord *c, const struct coord_rest_request *rq,
                       struct coord_rest_reply *ret_reply);
void coord__rest_reply_done(struct coord_rest_reply *r);

/* ---- page.c (generated from status-page.html and status-icon.svg by embed.py) -------- */

extern const unsigned char coord__page_html[], coord__page_icon[];
extern const size_t coord__page_html_len, coord__page_icon_len;

/* ---- tls.c -------------------------------------------------------------------------- */

/* Resolves cfg.tls_* against spec.coordinator.tls (an empty field takes the spec's), checks
 * that cert and key come together and client_ca only with them, and reads the PEM files.
 * Returns 0 (TLS off when no cert), -EINVAL for a bad pairing or a file that is not PEM, or
 * the negative errno of reading a file; logged with the path. */
int coord__tls_load(struct coord *c);
/* Releases the PEM texts (the key wiped first). Idempotent. */
void coord__tls_free(struct coord *c);

/* ---- dp-secret.c -------------------------------------------------------------------- */

/* Reads state_dir/data-plane.key, or creates it (0600, 32 random bytes) on a new state
 * directory. Returns 0, -EBADMSG for a key file of the wrong size, or the negative errno of
 * the file operation; logged with the path, never with the key. */
int coord__dp_key_load(struct coord *c);
/* Wipes the master key. Idempotent. */
void coord__dp_key_free(struct coord *c);
/* The data-plane secret of epoch into out: HMAC-SHA256(master, label | job id | epoch).
 * Returns 0, -EINVAL before the key is loaded, -EIO when the crypto library fails. */
int coord__dp_secret(const struct coord *c, uint64_t epoch,
                     unsigned char out[COORD_DP_KEY_BYTES]);
/* Packs cmd; with_secret fills the epoch's secret into a Configure, or into a Migrate that
 * builds a communicator (the journal's copy is packed without it). The caller's cmd is left
 * as it was. Caller frees *ret_data with coord__dp_free_packed(). */
int coord__dp_pack(const struct coord *c, Spottrain__V1__Command *cmd, bool with_secret,
                   void **ret_data, size_t *ret_len);
/* A journaled command body as it goes out on a redelivery: unpacked, secret filled, packed.
 * -EBADMSG for a body that does not decode. Caller frees with coord__dp_free_packed(). */
int coord__dp_repack(const struct coord *c, const void *body, size_t len, void **ret_data,
                     size_t *ret_len);
/* Wipes and frees a packed command that may hold a secret. NULL-safe. */
void coord__dp_free_packed(void *data, size_t len);

/* ---- validate.c ---------------------------------------------------------------------- */

/* Checks a decoded message before it may touch state: ids are UUIDs, strings bounded and
 * printable, counts bounded, numbers finite. Returns 0 or -EINVAL with a reason in why. */
int coord__validate_join(const Spottrain__V1__JoinRequest *m, char *why, size_t whysz);
int coord__validate_watch(const Spottrain__V1__WatchRequest *m, char *why, size_t whysz);
int coord__validate_report(const Spottrain__V1__ReportRequest *m, char *why, size_t whysz);
/* A notice's figures from its proto, validated by coord__validate_report (the dir fits); all
 * zero when m is NULL (sent without figures). grpc-server.c gives them to on_report. */
void coord__notice_figures(struct st_notice_figures *f, const Spottrain__V1__NoticeFigures *m);
/* Checks "HOST:PORT" (port 0..65535, host non-empty). */
int coord__parse_hostport(const char *s, char *ret_host, size_t hostsz, int *ret_port);

#endif
