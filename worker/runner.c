/* runner.c: a worker process under a coordinator — agent + engine + data plane + notices.
 *
 * The one idea: only this thread touches the engine and the epoch's communicator (the peer
 * copies' exchange runs on a thread of its own, on a side channel of its own: struct peerbg).
 * The agent's watch thread copies every command into a queue; this thread drains it before
 * every step and decides: train step `done` when the lease allows, write a checkpoint due at
 * `done`, or reconfigure when the next epoch's order is complete and `done` is its boundary.
 * Every wait
 * is bounded (reconfig_timeout, the data plane's timeout), and a failure is reported as a
 * notice and leaves the worker waiting for the coordinator's next order — never hanging. */
#include <errno.h>
#include <limits.h> /* INT_MAX */
#include <math.h>
#include <pthread.h>
#include <signal.h> /* raise: SPOTTRAIN_TEST_LEAVE_KILLED */
#include <stdatomic.h>
#include <stddef.h> /* offsetof */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h> /* nanosleep */

#include "check.h" /* TRY, TRY_GOTO */
#include "common.h"
#include "kernels.h" /* kern_layer_tensor: checkpoint tensor names */
#include "migrate.h"
#include "migrate-execute.h"
#include "worker.h"
#include "worker-peer.h" /* peer copies */
#include "worker-reserve.h" /* fleet.prewarm */
#include "worker-runner.h"

#define RUNNER_MAX_QUEUE 4096
#define RUNNER_MAX_CKPTS 16

/* A checkpoint being written in the background: a snapshot of this stage's layers (PARAM and
 * the full moments, gathered from the stage's replicas at the boundary) that a thread writes
 * as layer files; the coordinator commits the manifest once every stage reported. */
struct bgckpt {
    pthread_t th;
    bool running;
    struct runner *R;
    char dir[ST_SPEC_PATH_MAX];
    uint64_t step;
    int stage, pp, lo, hi;     /* layers [lo, hi) */
    float **snap;              /* per layer: param | m | v, 3 * n floats */
    size_t *n;
    int result;
};

/* Peer copies of one epoch on its side channel (MIG_EPOCH_SIDE): what building the channel
 * needs, taken when the epoch's communicator came up; the channel itself, built at the epoch's
 * first copy; and the exchange in flight, which a thread of its own runs while training goes
 * on (fault_tolerance.peer_copy_background). The thread touches only `g` and `side`; the
 * runner thread waits for it (peer_settle) before it keeps the generation, starts another, or
 * frees the channel. */
struct peerbg {
    uint64_t epoch;             /* epoch of everything below; 0 = none */
    int npos, pos;              /* the layout's positions, ours */
    char (*addr)[MIG_ADDR_MAX]; /* data-plane address per position */
    struct mig_auth auth;       /* the epoch's secret (wiped with the rest) */
    struct mig_comm *side;      /* built at the epoch's first copy; NULL = not yet */
    bool broken;                /* the channel failed in this epoch: no more copies in it */
    pthread_t th;
    bool running;               /* th was started and not joined */
    _Atomic bool finished;      /* th is done with g (set by th) */
    struct worker_peer_gen g;   /* the generation being exchanged */
    int result;
    double t0, t_end;           /* st_now() when the exchange started / ended (set by th) */
    double blocked;             /* seconds the runner spent on it (snapshot, waiting) */
};

/* What a live migration's "reconfigured" notice says (docs/live-migration.md, the stall's
 * parts); told at the end of the migration, or, when its state moves after the boundary,
 * once it is in, with every byte of it as the transport counted them. */
struct reconf_note {
    uint64_t epoch, step, replayed, sent, recv;
    int stage, replica;
    double seconds, stall, wait, connect, reshape, transfer, commit, deferred;
    double waited; /* of deferred, seconds training waited for it (gates, the join) */
    size_t fresh;
    size_t prewarmed; /* bytes a new engine took from the warm reserve (fleet.prewarm) */
};

/* State after the boundary (fleet.data_plane.overlap, Migrate.defer_moments): a live migration's
 * transfers move on the new epoch's communicator on a thread of their own while the first step
 * computes: the parameters first, layer by layer in layer order (the tied copies of wte that later
 * stages' heads read last), then the optimizer moments. Each forward pass waits at the engine's
 * layer gate until the layer it is about to read is in (params_below; a head for all the
 * parameters); the engine's gate (worker_engine_set_gate) waits for the whole move before the step
 * first uses the communicator or the moments. The thread touches only the comm and the buffers
 * `ptrs` names (the old position's, which the engine holds for it, and the new one's); the runner
 * thread waits for it (defer_settle) before anything else can: the gate, a checkpoint, the next
 * reconfiguration, a failure. */
struct deferbg {
    pthread_t th;
    bool running;              /* th was started and not joined */
    _Atomic bool finished;     /* th is done (set by th, under lock) */
    struct mig_comm *comm;     /* what the move runs on: R->move, or else R->comm */
    bool own;                  /* comm is the epoch's move channel */
    struct worker_engine *eng; /* a reshaped engine whose kept moments the thread copies */
    size_t copied;             /* bytes of those */
    struct mig_xfer *x;        /* the parameters by layer, tied copies last; moments */
    float **ptrs;              /* per transfer: this rank's buffer (NULL: not ours) */
    size_t n, nparam;          /* transfers; x[0..nparam) are parameters */
    size_t ntied;              /* x[nparam-ntied..nparam) are tied copies of wte */
    double tied_delay;         /* tests: seconds slept before those (cfg.tied_delay) */
    int params_below;          /* every parameter of a layer below this is in (th, lock) */
    int result;
    double t0, t_end;          /* st_now() when the batch started / ended (set by th) */
    bool early;                /* we were early at the boundary (a spare): the move counts
                                * from our peers' first bytes on comm, not from t0 */
    double waited;             /* seconds the runner thread waited for it within its steps'
                                * own time (gate_count; runner thread) */
    uint64_t sent0, recv0;     /* comm's counters when the thread started */
    struct reconf_note note;   /* told when everything is in */
    /* Not cleared between migrations (defer_free): made with the runner. */
    pthread_mutex_t lock;      /* guards params_below and finished, for cond */
    pthread_cond_t cond;       /* params_below rose, or th finished */
};

/* The next epoch's communicators, built ahead of its boundary (mig_comm_new_ahead): a live
 * migration's order arrives a lease ahead, and while we train up to its boundary a thread of
 * our own runs the handshakes with every participant (a spare that joins, already waiting in
 * its own build, and the workers training beside us), so that the boundary finds them done
 * and the stall holds the transfers and the hand-off only. The thread touches the endpoint
 * (under its lock) and this struct; the runner thread takes the comms at the boundary
 * (ahead_take) or drops them (ahead_drop: a failure, an order of another epoch, the end). */
struct aheadbg {
    pthread_t th;
    bool running;              /* th was started and not joined */
    uint64_t epoch;            /* whose comms are (being) built; 0: none */
    uint64_t tried;            /* the last epoch ahead_start looked at (never twice) */
    _Atomic bool stop;         /* ahead_drop, or the boundary's wait ran out: give up */
    bool finished;             /* th is done (under lock) */
    struct mig_endpoint *ep;
    int rank, n;
    char (*addr)[MIG_ADDR_MAX]; /* the n participants' data addresses (the order may go) */
    struct mig_auth auth;
    bool move;                 /* the epoch's move channel too, after the main comm */
    double wait;               /* seconds the build waits for the peers */
    struct mig_comm *comm, *mc;
    int result;
    double t0, t_end;          /* st_now() when th started / finished */
    /* Made with the runner. */
    pthread_mutex_t lock;      /* guards finished, result, t_end, for cond */
    pthread_cond_t cond;
};

struct runner {
    struct worker_runner_config cfg;
    struct worker_train_config tc;
    struct worker_agent *agent;
    struct mig_endpoint *ep;
    struct st_tokens *tokens;
    int nlayers;

    pthread_mutex_t lock; /* guards queue */
    pthread_cond_t cond;
    Spottrain__V1__Command *queue[RUNNER_MAX_QUEUE];
    size_t nqueue;

    /* runner-thread state */
    uint64_t epoch;           /* epoch in force (0 = none) */
    struct mig_comm *comm;
    struct mig_comm *move;    /* the epoch's move channel, when its migration built one */
    struct worker_engine *eng;
    uint64_t done;            /* steps completed */
    uint64_t lease;           /* may run steps < lease */
    uint64_t lease_reported;  /* lease we last asked the agent to report progress at */
    bool failed;              /* engine state undefined: waits for a restore */
    bool stop;
    Spottrain__V1__Command *pcfg; /* Configure of a newer epoch, waiting */
    Spottrain__V1__Command *pmig; /* Migrate of a newer epoch, waiting */
    double pending_since;     /* st_now() when pcfg/pmig first arrived */
    double blocked_since;     /* st_now() when training first waited on a boundary; 0 = not */
    struct { char dir[ST_SPEC_PATH_MAX]; uint64_t at; } ckpt[RUNNER_MAX_CKPTS];
    int nckpt;
    double last_loss;
    bool noticed;             /* a cloud notice was relayed */
    bool told_left;           /* state_left was called: the state left after the notice */
    struct bgckpt bg;
    double next_notice_poll;
    struct worker_peer_store peers; /* in-memory copies: ours and our predecessor's */
    struct peerbg pc;         /* the epoch's side channel and the exchange in flight */
    uint64_t peer_refused;    /* epoch whose copies did not fit the memory budget */
    double last_step_end;     /* st_now() at the end of the last step (any epoch); 0 = none */
    uint64_t first_epoch;     /* epoch whose first step is still to be reported; 0 = none */
    double first_from;        /* st_now() the stall of first_epoch counts from */
    uint64_t rolled_back;     /* steps the last peer-copy rollback undid (to be replayed) */
    double pc_reported;       /* st_now() a copy last asked for an immediate Report */
    uint64_t prepared;        /* epoch whose reshape the engine was asked to make ready */
    struct deferbg df;        /* a migration's moments still moving after its boundary */
    struct aheadbg ah;        /* the next epoch's comms, built while we train up to it */
    double gate_waited;       /* seconds the step in progress waited at the move's gates */
    bool early_first;         /* the epoch's first step is a rank's that was early at its
                                 boundary: its own time counts from its peers' first bytes */
    bool stalled;             /* cfg.stall_step was held once */
};

/* ---- rendezvous ---------------------------------------------------------------------------- */

/* See worker-runner.h. */
int worker_configure_setup(const Spottrain__V1__Configure *cf, char *mode, size_t modesz,
                           int *ret_split, int max, int *ret_nsplit, char *dir, size_t dirsz) {
    static const char *const names[] = {
        [SPOTTRAIN__V1__RECONFIGURE_MODE__RECONFIGURE_MODE_INIT] = "init",
        [SPOTTRAIN__V1__RECONFIGURE_MODE__RECONFIGURE_MODE_RESTORE] = "restore",
        [SPOTTRAIN__V1__RECONFIGURE_MODE__RECONFIGURE_MODE_MIGRATE] = "migrate",
        [SPOTTRAIN__V1__RECONFIGURE_MODE__RECONFIGURE_MODE_PEER_RESTORE] = "peer-restore",
    };
    if (!cf || !mode || !ret_split || !ret_nsplit || !dir || max < 2)
        return -EINVAL;
    if (cf->mode == SPOTTRAIN__V1__RECONFIGURE_MODE__RECONFIGURE_MODE_UNSPECIFIED)
        return worker_rendezvous_parse(cf->rendezvous, mode, modesz, ret_split, max, ret_nsplit,
                                       dir, dirsz); /* a coordinator of the previous release */
    if ((unsigned)cf->mode >= ST_ARRAY_SIZE(names) || !names[cf->mode] || cf->n_split < 2 ||
        cf->n_split > (size_t)max || strlen(names[cf->mode]) >= modesz ||
        !cf->restore_dir || strlen(cf->restore_dir) >= dirsz)
        return -EINVAL;
    if (cf->mode == SPOTTRAIN__V1__RECONFIGURE_MODE__RECONFIGURE_MODE_RESTORE &&
        !cf->restore_dir[0])
        return -EINVAL;
    for (size_t k = 0; k < cf->n_split; k++) {
        if (cf->split[k] > 1000000 || (k > 0 && cf->split[k] <= cf->split[k - 1]))
            return -EINVAL;
        ret_split[k] = (int)cf->split[k];
    }
    if (ret_split[0] != 0)
        return -EINVAL;
    snprintf(mode, modesz, "%s", names[cf->mode]);
    snprintf(dir, dirsz, "%s", cf->restore_dir);
    *ret_nsplit = (int)cf->n_split;
    return 0;
}

/* See worker-runner.h. */
int worker_rendezvous_parse(const char *s, char *mode, size_t modesz, int *ret_split, int max,
                            int *ret_nsplit, char *dir, size_t dirsz) {
    if (!s || !mode || !ret_split || !ret_nsplit || !dir || max < 2)
        return -EINVAL;
    if (strncmp(s, "tcp;", 4) != 0)
        return -EINVAL;
    mode[0] = '\0';
    dir[0] = '\0';
    int nsplit = 0;
    const char *p = s + 4;
    while (*p) {
        if (!strncmp(p, "dir=", 4)) {
            if (strlen(p + 4) >= dirsz || !p[4])
                return -EINVAL;
            snprintf(dir, dirsz, "%s", p + 4);
            break;
        }
        const char *end = strchr(p, ';');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (!strncmp(p, "mode=", 5)) {
            if (len - 5 >= modesz || len == 5)
                return -EINVAL;
            memcpy(mode, p + 5, len - 5);
            mode[len - 5] = '\0';
        } else if (!strncmp(p, "split=", 6)) {
            const char *q = p + 6;
            nsplit = 0;
            while (q < p + len) {
                char *e;
                long v = strtol(q, &e, 10);
                if (e == q || v < 0 || v > 1000000 || nsplit >= max)
                    return -EINVAL;
                ret_split[nsplit++] = (int)v;
                q = e;
                if (q < p + len) {
                    if (*q != ',')
                        return -EINVAL;
                    q++;
                }
            }
        } else {
            return -EINVAL;
        }
        p += len;
        if (*p == ';')
            p++;
    }
    if (strcmp(mode, "init") && strcmp(mode, "migrate") && strcmp(mode, "restore") &&
        strcmp(mode, "peer-restore"))
        return -EINVAL;
    if (nsplit < 2 || (!strcmp(mode, "restore") && !dir[0]))
        return -EINVAL;
    for (int i = 1; i < nsplit; i++)
        if (ret_split[i] <= ret_split[i - 1])
            return -EINVAL;
    *ret_nsplit = nsplit;
    return 0;
}

/* Waits on c, with m held, for at most ms milliseconds (a wake-up, a timeout or a spurious
 * return: the caller looks again). */
static void cond_wait_ms(pthread_cond_t *c, pthread_mutex_t *m, long ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ms * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    (void)pthread_cond_timedwait(c, m, &ts);
}

/* ---- command queue (watch thread -> runner thread) ----------------------------------------- */

static int on_command(struct worker_agent *a, const Spottrain__V1__Command *cmd, char *err,
                      size_t errsz, void *userdata) {
    struct runner *R = userdata;
    (void)a;
    /* The coordinator gives an epoch's order only once the one before is running or has
     * failed: a communicator of an older epoch still being built (a peer died before it
     * connected) will never come up, so the runner thread stops waiting for it now rather
     * than at the data plane's timeout. */
    mig_endpoint_abandon(R->ep, cmd->epoch);
    size_t len = spottrain__v1__command__get_packed_size(cmd);
    uint8_t *buf = st_malloc(len ? len : 1);
    if (!buf)
        return -ENOMEM;
    spottrain__v1__command__pack(cmd, buf);
    Spottrain__V1__Command *copy = spottrain__v1__command__unpack(NULL, len, buf);
    st_free(buf);
    if (!copy)
        return -ENOMEM;
    pthread_mutex_lock(&R->lock);
    int r = 0;
    if (R->nqueue == RUNNER_MAX_QUEUE) {
        snprintf(err, errsz, "command queue full");
        r = -ENOBUFS;
        spottrain__v1__command__free_unpacked(copy, NULL);
    } else {
        R->queue[R->nqueue++] = copy;
        pthread_cond_broadcast(&R->cond);
    }
    pthread_mutex_unlock(&R->lock);
    return r;
}

static void cmd_free(Spottrain__V1__Command **c) {
    if (*c)
        spottrain__v1__command__free_unpacked(*c, NULL);
    *c = NULL;
}

/* ---- reporting ------------------------------------------------------------------------------ */

/* A notice's figures, in place: notice(R, "step-failed", FIG(.epoch = e, .step = s), ...). */
#define FIG(...) (&(const struct st_notice_figures){__VA_ARGS__})

/* A notice for the next Report: its kind, the figures the coordinator reads (NULL: none) and
 * words for people (the log and the job's events; nothing parses them). */
static void vnotice(struct runner *R, bool latest, const char *kind,
                    const struct st_notice_figures *fig, const char *fmt, va_list ap) {
    char detail[256]; /* the coordinator takes 255 characters */
    vsnprintf(detail, sizeof(detail), fmt, ap);
    st_log(ST_LOG_INFO, "runner", "%s: %s", kind, detail);
    if ((latest ? worker_agent_notice_latest : worker_agent_notice)(R->agent, kind, st_wall(),
                                                                     detail, fig) < 0)
        st_log(ST_LOG_WARN, "runner", "Cannot queue notice '%s' (%zu undelivered), ignoring",
               kind, worker_agent_notices_pending(R->agent));
}

static void notice(struct runner *R, const char *kind, const struct st_notice_figures *fig,
                   const char *fmt, ...) ST_PRINTF(4, 5);
static void notice(struct runner *R, const char *kind, const struct st_notice_figures *fig,
                   const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vnotice(R, false, kind, fig, fmt, ap);
    va_end(ap);
}

/* A notice whose newest one supersedes a queued one of its kind (worker_agent_notice_latest). */
static void notice_latest(struct runner *R, const char *kind,
                          const struct st_notice_figures *fig, const char *fmt, ...)
    ST_PRINTF(4, 5);
static void notice_latest(struct runner *R, const char *kind,
                          const struct st_notice_figures *fig, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vnotice(R, true, kind, fig, fmt, ap);
    va_end(ap);
}

static void progress(struct runner *R, double step_seconds, double stall) {
    /* NAN (stages before the last compute no loss) travels as no_loss = true, so the
     * coordinator never takes a 0 for the job's loss. */
    worker_agent_progress(R->agent, R->epoch, R->done, R->last_loss,
                          R->done * (uint64_t)R->tc.global_batch, step_seconds, stall);
}

/* ---- peer copies ------------------------------------------------------------------------- */

/* Generation g was exchanged: keep it and tell the coordinator both generations we hold now
 * (the newest notice alone says everything: notices may be dropped when the agent's queue is
 * full between two Reports). seconds: the exchange; blocked: what training waited for it. */
static void peer_kept(struct runner *R, struct worker_peer_gen *g, double seconds,
                      double blocked) {
    uint64_t epoch = g->epoch, step = g->step;
    worker__peer_keep(&R->peers, g);
    const struct worker_peer_gen *o = &R->peers.gen[0];
    if (o->valid && o->step == step && o->epoch == epoch)
        o = &R->peers.gen[1];
    struct st_notice_figures f = {.epoch = epoch, .step = step,
                                  .prev_epoch = o->valid ? o->epoch : 0,
                                  .prev_step = o->valid ? o->step : 0,
                                  .seconds = seconds, .blocked = blocked};
    notice_latest(R, "peer-copy", &f, "epoch=%llu step=%llu prev_epoch=%llu prev_step=%llu "
                  "seconds=%.6f blocked=%.6f", (unsigned long long)f.epoch,
                  (unsigned long long)f.step, (unsigned long long)f.prev_epoch,
                  (unsigned long long)f.prev_step, seconds, blocked);
    if (st_now() - R->pc_reported >= 0.1) {
        R->pc_reported = st_now();
        worker_agent_report_now(R->agent); /* the queue drains; the view stays fresh */
    }
}

static void *peer_main(void *arg) {
    struct peerbg *b = arg;
    b->result = worker__peer_swap(&b->g, b->side);
    /* A failed exchange ends our copies in this epoch (peer_finish), so it ends the side
     * channel's every stream now: a neighbour whose half of this exchange completed starts
     * the next one and would wait for us until its no-progress timeout, with training
     * blocked on it at the copy after; its peers' steps then time out too (found by
     * run-peer-cut under ASan, loaded: the epoch failed and restored from disk). */
    if (b->result < 0 && b->result != -ECANCELED)
        (void)mig_comm_shut(b->side);
    b->t_end = st_now();
    atomic_store(&b->finished, true);
    return NULL;
}

/* An exchange is over (b->result): keeps its generation when both directions completed. A
 * failed or cancelled exchange leaves the side channel's streams out of step: no more copies
 * in this epoch. The generations kept before are untouched either way. */
static void peer_finish(struct runner *R) {
    struct peerbg *b = &R->pc;
    if (b->result >= 0) {
        peer_kept(R, &b->g, b->t_end - b->t0, b->blocked);
        return;
    }
    b->broken = true;
    if (b->result == -ECANCELED)
        st_log(ST_LOG_INFO, "runner", "Peer copy of step %llu (epoch %llu) cancelled: the epoch "
               "ends", (unsigned long long)b->g.step, (unsigned long long)b->g.epoch);
    else
        notice(R, "peer-copy-failed", FIG(.epoch = b->g.epoch, .step = b->g.step),
               "epoch=%llu step=%llu: %s", (unsigned long long)b->g.epoch,
               (unsigned long long)b->g.step, st_strerror(b->result));
    worker__peer_gen_free(&b->g);
}

/* Ends the exchange in flight, if any: waits for it (cancelling it first when `cancel`; it
 * then ends within 50 ms) and finishes it. */
static void peer_settle(struct runner *R, bool cancel) {
    struct peerbg *b = &R->pc;
    if (!b->running)
        return;
    if (cancel && !atomic_load(&b->finished))
        mig_comm_cancel(b->side);
    pthread_join(b->th, NULL);
    b->running = false;
    atomic_store(&b->finished, false);
    peer_finish(R);
}

/* The epoch is over for the peer copies: ends the exchange in flight, frees the side channel
 * and forgets what building it needed. */
static void peer_side_drop(struct runner *R) {
    struct peerbg *b = &R->pc;
    peer_settle(R, true);
    b->side = mig_comm_free(b->side);
    st_free(b->addr);
    mig_auth_clear(&b->auth);
    memset(b, 0, offsetof(struct peerbg, th));
}

/* A new epoch's communicator is up: remembers what its side channel needs (peers[i] is comm
 * rank i; lay->ranks maps positions to those), to be built at the epoch's first copy. */
static int peer_side_set(struct runner *R, uint64_t epoch, const struct worker_layout *lay,
                         int stage, int replica, Spottrain__V1__Peer **peers, size_t n,
                         const ProtobufCBinaryData *secret, bool tls) {
    struct peerbg *b = &R->pc;
    peer_side_drop(R);
    int np = lay->dp * lay->pp;
    if (np < 2 || !secret || secret->len != MIG_KEY_BYTES || !secret->data)
        return 0; /* nothing to copy to, or nothing to build with (no copies then) */
    b->addr = st_calloc((size_t)np, sizeof(*b->addr));
    if (!b->addr)
        return -ENOMEM;
    for (int p = 0; p < np; p++) {
        if (lay->ranks[p] < 0 || (size_t)lay->ranks[p] >= n) {
            peer_side_drop(R);
            return -EINVAL;
        }
        snprintf(b->addr[p], sizeof(b->addr[p]), "%s", peers[lay->ranks[p]]->data_addr);
    }
    memcpy(b->auth.key, secret->data, MIG_KEY_BYTES);
    worker_agent_job_id(R->agent, b->auth.job_id);
    b->auth.tls = tls;
    b->npos = np;
    b->pos = stage * lay->dp + replica;
    b->epoch = epoch;
    return 0;
}

/* ---- state after the boundary ---------------------------------------------------------------- */

static void fail_state(struct runner *R);

static void tell_reconfigured(struct runner *R, const struct reconf_note *n) {
    /* Where the time went, for the stall breakdown (docs/live-migration.md): waiting at the
     * boundary for the order, the communicator's handshake (it ends when the slowest peer
     * reached the boundary too), the engine's reshape (or the making of a new one, before the
     * handshake), the transfers, the commit; the bytes of work buffers the commit had to
     * allocate (fresh: none prepared them); and the seconds the state moved after the
     * boundary (deferred), overlapped with the first step, of which training waited for it
     * (waited: at the layer gates and the update's gate, or at the first pipeline message
     * when the move shares the communicator). */
    struct st_notice_figures f = {
        .epoch = n->epoch, .step = n->step, .sent = n->sent, .recv = n->recv,
        .replayed = n->replayed, .prewarmed = n->prewarmed, .seconds = n->seconds,
        .stall = n->stall, .wait = n->wait, .connect = n->connect, .reshape = n->reshape,
        .transfer = n->transfer, .commit = n->commit, .deferred = n->deferred,
        .waited = n->waited};
    notice(R, "reconfigured", &f, "epoch=%llu mode=migrate step=%llu stage=%d replica=%d "
           "sent=%llu recv=%llu replayed=%llu seconds=%.6f stall=%.6f wait=%.6f connect=%.6f "
           "reshape=%.6f transfer=%.6f commit=%.6f fresh=%zu deferred=%.6f waited=%.6f "
           "prewarmed=%zu",
           (unsigned long long)n->epoch, (unsigned long long)n->step, n->stage, n->replica,
           (unsigned long long)n->sent, (unsigned long long)n->recv,
           (unsigned long long)n->replayed, n->seconds, n->stall, n->wait, n->connect,
           n->reshape, n->transfer, n->commit, n->fresh, n->deferred, n->waited, n->prewarmed);
}

static int defer_buf(void *userdata, const struct mig_xfer *x, bool send, float **ret) {
    const struct deferbg *d = userdata;
    (void)send;
    float *p = d->ptrs[x - d->x];
    if (!p)
        return -EINVAL;
    *ret = p;
    return 0;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static void defer_announce(struct deferbg *d, int params_below, bool finished) {
    pthread_mutex_lock(&d->lock);
    d->params_below = params_below;
    if (finished)
        atomic_store(&d->finished, true);
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
}

static void *defer_main(void *arg) {
    struct deferbg *d = arg;
    int r = 0;
    /* The parameters, a batch per layer, each announced as soon as it is in; the tied copies
     * of layer 0 come last and are announced with the end of the parameters. */
    size_t tied = d->nparam - d->ntied;
    for (size_t i = 0, j; r >= 0 && i < d->nparam; i = j) {
        for (j = i; j < d->nparam && d->x[j].layer == d->x[i].layer && (j < tied) == (i < tied);
             j++)
            ;
        if (i == tied && d->tied_delay > 0)
            sleep_s(d->tied_delay);
        r = mig_execute(d->comm, d->x + i, j - i, defer_buf, d, NULL);
        if (r >= 0 && (int)d->x[i].layer + 1 > d->params_below)
            defer_announce(d, (int)d->x[i].layer + 1, false);
    }
    if (r >= 0) {
        defer_announce(d, INT_MAX, false);
        if (d->eng)
            d->copied = worker_engine_copy_kept_moments(d->eng);
        r = mig_execute(d->comm, d->x + d->nparam, d->n - d->nparam, defer_buf, d, NULL);
    }
    d->result = r;
    /* A failed batch leaves the epoch's streams out of step: end them all now, so that every
     * peer's call with us fails at once rather than at its no-progress timeout. */
    if (r < 0 && r != -ECANCELED)
        (void)mig_comm_shut(d->comm);
    d->t_end = st_now();
    defer_announce(d, d->params_below, true);
    return NULL;
}

static void defer_free(struct runner *R) {
    struct deferbg *d = &R->df;
    st_free(d->x);
    st_free(d->ptrs);
    memset(d, 0, offsetof(struct deferbg, note));
}

/* The move after the boundary failed (r): says so, naming its channel. */
static void defer_failed(struct runner *R, int r) {
    struct deferbg *d = &R->df;
    notice(R, "reconfig-failed", FIG(.epoch = d->note.epoch),
           "epoch=%llu the transfers after the boundary%s: %s",
           (unsigned long long)d->note.epoch, d->own ? " (move channel)" : "",
           st_strerror(r));
}

/* The earliest time one of the epoch's comms (main, move: NULL-safe) received a byte; 0 when
 * neither has yet. */
static double first_heard(const struct mig_comm *a, const struct mig_comm *b) {
    double x = mig_comm_heard_at(a), y = mig_comm_heard_at(b);
    return x > 0 && (y <= 0 || x < y) ? x : y;
}

/* Where the epoch's first step starts counting its own time, for a step that started at t0:
 * for a worker that was early at the boundary, not before its peers' first bytes. */
static double own_from(const struct runner *R, double t0) {
    double h = R->early_first ? first_heard(R->comm, R->move) : 0;
    return h > t0 ? h : t0;
}

/* A wait at the move's gates that began at t ended now: its part within the step's own time
 * counts in gate_waited (a wait of an early worker's before its peers sent is not: that is the
 * migration's, in its stall). Returns that part. */
static double gate_count(struct runner *R, double t) {
    double now = st_now(), from = own_from(R, t);
    double w = now > from ? now - from : 0.0;
    R->gate_waited += w;
    return w;
}

/* Waits for the moments in flight, if any: tells the migration's "reconfigured" once they
 * are in, or "reconfig-failed". Returns the batch's result (0 when none ran). The engine
 * lets the old position's buffers go either way. */
static int defer_settle(struct runner *R) {
    struct deferbg *d = &R->df;
    if (!d->running)
        return 0;
    double t = st_now();
    pthread_join(d->th, NULL);
    d->waited += gate_count(R, t);
    int r = d->result;
    if (R->eng) {
        worker_engine_set_gate(R->eng, NULL, NULL, NULL);
        worker_engine_hold_old(R->eng, false);
    }
    if (r >= 0) {
        uint64_t sent = 0, recv = 0;
        mig_comm_stats(d->comm, &sent, &recv);
        d->note.sent += sent - d->sent0;
        d->note.recv += recv - d->recv0;
        /* An early worker started the batch before its peers reached the boundary: the
         * time until their first bytes is its wait for them, not the move's. */
        double from = d->t0, heard = d->early ? mig_comm_heard_at(d->comm) : 0;
        if (heard > from)
            from = heard;
        d->note.deferred = d->t_end > from ? d->t_end - from : 0.0;
        d->note.waited = d->waited;
        tell_reconfigured(R, &d->note);
    } else {
        defer_failed(R, r);
    }
    defer_free(R);
    return r;
}

/* Settles the moments in flight before something else uses the engine or the communicator:
 * a failed batch leaves our state undefined, so the epoch fails as with a failed step. */
static void defer_wait(struct runner *R) {
    if (R->df.running && defer_settle(R) < 0)
        fail_state(R);
}

/* The engine's gate (worker_engine_set_gate): the step waits here for the whole move. */
static int defer_gate(void *userdata) {
    return defer_settle(userdata);
}

/* The engine's layer gate: a forward pass waits here for the parameters of layer. A move
 * that ended without them settles (a failure fails the step). */
static int defer_layer_gate(void *userdata, int layer) {
    struct runner *R = userdata;
    struct deferbg *d = &R->df;
    double t = st_now();
    pthread_mutex_lock(&d->lock);
    while (d->params_below <= layer && !atomic_load(&d->finished))
        pthread_cond_wait(&d->cond, &d->lock);
    bool in = d->params_below > layer;
    pthread_mutex_unlock(&d->lock);
    d->waited += gate_count(R, t);
    return in ? 0 : defer_settle(R);
}

/* Ends the moments in flight: cancelled (the batch ends within 50 ms), joined, forgotten.
 * Before the engine or the communicator they use goes. A batch that had failed by itself
 * first (a cut, a lost peer) is still told, as defer_settle tells it: the step may have failed
 * first on what the same fault did to the communicator. */
static void defer_cancel(struct runner *R) {
    struct deferbg *d = &R->df;
    if (!d->running)
        return;
    if (!atomic_load(&d->finished))
        mig_comm_cancel(d->comm);
    pthread_join(d->th, NULL);
    if (d->result < 0 && d->result != -ECANCELED)
        defer_failed(R, d->result);
    if (R->eng) {
        worker_engine_set_gate(R->eng, NULL, NULL, NULL);
        worker_engine_hold_old(R->eng, false);
    }
    defer_free(R);
}

/* ---- the next epoch's comms, built ahead (struct aheadbg) ---------------------------------- */

static void *ahead_main(void *arg) {
    struct aheadbg *a = arg;
    const char **addrs = st_calloc((size_t)a->n, sizeof(*addrs));
    int r = -ENOMEM;
    if (addrs) {
        for (int i = 0; i < a->n; i++)
            addrs[i] = a->addr[i];
        r = mig_comm_new_ahead(a->ep, a->epoch, a->rank, a->n, addrs, &a->auth, a->wait,
                               &a->stop, &a->comm);
        if (r >= 0 && a->move)
            r = mig_comm_new_ahead(a->ep, a->epoch | MIG_EPOCH_MOVE, a->rank, a->n, addrs,
                                   &a->auth, a->wait, &a->stop, &a->mc);
    }
    st_free(addrs);
    pthread_mutex_lock(&a->lock);
    a->result = r;
    a->t_end = st_now();
    a->finished = true;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->lock);
    return NULL;
}

/* Stops the build (within 50 ms), joins it, and closes what it built: our peers' halves fail
 * at once rather than wait. */
static void ahead_drop(struct runner *R) {
    struct aheadbg *a = &R->ah;
    if (a->running) {
        atomic_store(&a->stop, true);
        pthread_join(a->th, NULL);
        a->running = false;
    }
    a->comm = mig_comm_free(a->comm);
    a->mc = mig_comm_free(a->mc);
    st_free(a->addr);
    a->addr = NULL;
    mig_auth_clear(&a->auth);
    a->epoch = 0;
}

/* ---- epochs --------------------------------------------------------------------------------- */

static void drop_state(struct runner *R) {
    ahead_drop(R);
    defer_cancel(R);
    peer_side_drop(R);
    R->eng = worker_engine_free(R->eng);
    R->comm = mig_comm_free(R->comm);
    R->move = mig_comm_free(R->move);
}

/* After a failed step or reconfiguration: closes our connections (the peers fail fast too)
 * and drops the engine, whose contents are undefined now. What survives is on disk and in
 * the peer copies (R->peers), which a failure never touches: a restore starts from those. */
static void fail_state(struct runner *R) {
    ahead_drop(R);
    defer_cancel(R);
    peer_side_drop(R);
    R->failed = true;
    R->comm = mig_comm_free(R->comm);
    R->move = mig_comm_free(R->move);
    R->eng = worker_engine_free(R->eng);
}

/* A new epoch starts: its stall runs from the end of our last step (or from the order when we
 * never made one) to the end of its first step, which we report at once. An epoch that made
 * no step (it failed, or was replaced first) passes its starting point on to the next. The
 * coordinator only takes the span of workers that trained in the epoch before (a spare's last
 * step may be old). */
static void epoch_started(struct runner *R, uint64_t epoch, double ordered) {
    if (R->first_epoch == 0 || R->first_from <= 0)
        R->first_from = R->last_step_end > 0 ? R->last_step_end : ordered;
    R->first_epoch = epoch;
    R->early_first = false; /* the caller says otherwise after */
}

/* Relays the connections our data plane refused to the coordinator, one notice each (it
 * counts them and records an event naming the peer). */
static void relay_auth_failures(struct runner *R) {
    struct mig_auth_failure f[MIG_AUTH_FAILURES_KEPT];
    size_t n = mig_endpoint_auth_failures(R->ep, f, ST_ARRAY_SIZE(f));
    for (size_t i = 0; i < n; i++)
        notice(R, "data-auth-failed", FIG(.epoch = f[i].epoch),
               "peer=%s epoch=%llu why=%s", f[i].peer,
               (unsigned long long)f[i].epoch, f[i].why);
}

/* Tests (boundary_delay, stall_step): holds this worker for `seconds`, as a slow peer, a hung
 * handshake or a stuck step would. The hold ends early when the coordinator moves on (an
 * order of an epoch after `epoch` came: it gave this one up), as such a handshake is
 * abandoned. */
static void hold_until_moved_on(struct runner *R, uint64_t epoch, double seconds) {
    double until = st_now() + seconds;
    while (mig_endpoint_abandoned(R->ep) <= epoch) {
        double left = until - st_now();
        if (left <= 0)
            break;
        sleep_s(ST_MIN(left, 0.05));
    }
}

/* Builds the communicator of `epoch` from peers (rank i = peers[i]); own rank by worker id.
 * secret is the epoch's data-plane secret from its Configure or Migrate: without one (a
 * coordinator that predates it) no comm is built. tls (fleet.data_plane.tls) comes from the
 * same command as the secret. */
static int comm_build(struct runner *R, uint64_t epoch, Spottrain__V1__Peer **peers, size_t n,
                      const ProtobufCBinaryData *secret, bool tls, double wait,
                      struct mig_comm **ret, int *ret_rank) {
    struct mig_auth auth;
    if (!secret || secret->len != MIG_KEY_BYTES || !secret->data)
        return st_log_errno(-EACCES, "Epoch %llu: the order carries no data-plane secret",
                            (unsigned long long)epoch);
    const char **addrs = st_calloc(n ? n : 1, sizeof(*addrs));
    if (!addrs)
        return -ENOMEM;
    int me = -1;
    for (size_t i = 0; i < n; i++) {
        addrs[i] = peers[i]->data_addr;
        if (!strcmp(peers[i]->worker_id, worker_agent_id(R->agent)))
            me = (int)i;
    }
    memset(&auth, 0, sizeof(auth));
    memcpy(auth.key, secret->data, MIG_KEY_BYTES);
    worker_agent_job_id(R->agent, auth.job_id);
    auth.tls = tls;
    int r = -EINVAL;
    struct mig_comm *c = NULL;
    if (me >= 0)
        r = mig_comm_new_auth("tcp", R->ep, epoch, me, (int)n, addrs, &auth, wait, &c);
    /* The data it then moves has the usual no-progress limit, however long it waited. */
    if (r >= 0 && wait != R->cfg.timeout && (r = mig_comm_set_timeout(c, R->cfg.timeout)) < 0)
        c = mig_comm_free(c);
    mig_auth_clear(&auth);
    st_free(addrs);
    relay_auth_failures(R); /* strangers met while building, refused or not */
    if (r >= 0) {
        *ret = c;
        *ret_rank = me;
    }
    return r;
}

/* The peer-copy ring of lay from the zones the Configure's peers name (every position's). */
static int layout_ring(struct worker_layout *lay, const Spottrain__V1__Configure *cf) {
    int n = lay->dp * lay->pp;
    const char *zones[WORKER_MAX_RANKS] = {NULL};
    for (size_t i = 0; i < cf->n_peers; i++) {
        const Spottrain__V1__Peer *p = cf->peers[i];
        if (p->stage == WORKER_RUNNER_SPARE_STAGE || (int)p->stage >= lay->pp ||
            (int)p->replica >= lay->dp)
            continue;
        zones[p->stage * (uint32_t)lay->dp + p->replica] = p->zone;
    }
    int r = st_peer_ring(n, zones, lay->peer_next);
    if (r < 0)
        return r;
    lay->peer_ring_set = true;
    return worker_layout_check(lay, lay->stage_lo[lay->pp]);
}

/* Layout of (dp, pp) with the given split; ranks from the peers' (stage, replica), the peer
 * ring from the Configure's. */
static int layout_build(struct runner *R, int dp, int pp, const int *split, int nsplit,
                        Spottrain__V1__Peer **peers, size_t n,
                        const Spottrain__V1__Configure *cf, struct worker_layout *ret) {
    if (nsplit != pp + 1 || split[0] != 0 || split[pp] != R->nlayers)
        return -EINVAL;
    TRY(worker_layout_init(ret, dp, pp, split, R->nlayers));
    bool seen[WORKER_MAX_RANKS] = {false};
    for (size_t i = 0; i < n; i++) {
        if (peers[i]->stage == WORKER_RUNNER_SPARE_STAGE)
            continue;
        if ((int)peers[i]->stage >= pp || (int)peers[i]->replica >= dp)
            return -EINVAL;
        int pos = (int)peers[i]->stage * dp + (int)peers[i]->replica;
        if (seen[pos])
            return -EINVAL;
        seen[pos] = true;
        ret->ranks[pos] = (int)i;
    }
    for (int p = 0; p < dp * pp; p++)
        if (!seen[p])
            return -EINVAL;
    return layout_ring(ret, cf);
}

/* ---- the warm reserve (fleet.prewarm) ------------------------------------------------------ */

/* A worker without state faults in, on a thread of its own, the memory of the
 * largest position it could be given (the whole model on one worker: every other position's
 * state is a part of it, and its work buffers hold as many activations as any stage's in
 * flight), at most half the memory the host (or the container's limit) leaves, so that
 * taking a position costs no page faults at the boundary. The engine made next carves its
 * buffers from it. */
static void reserve_open(struct runner *R) {
    if (!R->cfg.spec.fleet.prewarm || R->eng)
        return;
    int lo[2] = {0, R->nlayers};
    struct worker_layout lay;
    uint64_t need = 0;
    if (worker_layout_init(&lay, 1, 1, lo, R->nlayers) < 0 ||
        worker_engine_position_bytes(&R->tc, &lay, 0, 0, &need) < 0)
        return; /* a position a worker cannot take alone: no reserve, nothing lost */
    need += need / 64 + ((uint64_t)1 << 20); /* each buffer is rounded up to pages */
    need = ST_MIN(need, worker_reserve_headroom(NULL) / 2);
    if (need < WORKER_RESERVE_MIN || need > SIZE_MAX || worker_reserve_open((size_t)need) < 0)
        return; /* no room for one (a host or container near its limit) */
    st_log(ST_LOG_INFO, "runner", "Warm reserve: faulting in %.1f MiB for the next engine",
           (double)need / (1 << 20));
}

/* Ends the reserve once an engine is made from it (or none will be): unmaps what it did not
 * give. Returns the bytes it gave (0: none was open). */
static size_t reserve_close(void) {
    if (!worker_reserve_is_open())
        return 0;
    worker_reserve_close();
    struct worker_reserve_stats st;
    worker_reserve_stats(&st);
    st_log(ST_LOG_INFO, "runner", "Warm reserve: %.1f of %.1f MiB faulted in ahead, %.1f MiB "
           "given to the engine", (double)st.faulted / (1 << 20), (double)st.bytes / (1 << 20),
           (double)st.given / (1 << 20));
    return st.given;
}

/* mode=init / mode=restore: a fresh engine on the Configure's peers. */
static int apply_fresh(struct runner *R, const Spottrain__V1__Command *cmd, const char *mode,
                       const int *split, int nsplit, const char *dir) {
    const Spottrain__V1__Configure *cf = cmd->configure;
    struct worker_layout lay;
    struct mig_comm *comm = NULL;
    struct worker_engine *eng = NULL;
    int rank, r;
    double t0 = st_now();

    drop_state(R); /* the old epoch is over whatever happens */
    R->failed = true;
    if (!cf->shape)
        return -EINVAL;
    TRY(layout_build(R, (int)cf->shape->dp, (int)cf->shape->pp, split, nsplit, cf->peers,
                     cf->n_peers, cf, &lay));
    TRY_GOTO(comm_build(R, cmd->epoch, cf->peers, cf->n_peers, &cf->data_plane_secret,
                        cf->data_plane_tls, R->cfg.timeout, &comm, &rank), r, out);
    TRY_GOTO(worker_engine_new(&R->tc, &lay, (int)cf->stage, (int)cf->replica, comm, R->tokens,
                               &eng), r, out);
    uint64_t step = 0;
    if (!strcmp(mode, "restore")) {
        TRY_GOTO(worker_engine_load(eng, dir, &step), r, out);
        if (step != cf->start_step) {
            r = st_log_errno(-EINVAL, "Checkpoint '%s' is at step %llu, the coordinator said "
                             "%llu", dir, (unsigned long long)step,
                             (unsigned long long)cf->start_step);
            goto out;
        }
    } else if (cf->start_step != 0) {
        r = st_log_errno(-EINVAL, "mode=init at step %llu (only 0 is possible)",
                         (unsigned long long)cf->start_step);
        goto out;
    }
    TRY_GOTO(worker_engine_ready(eng), r, out); /* in the stall, not in the first step */
    TRY_GOTO(peer_side_set(R, cmd->epoch, &lay, (int)cf->stage, (int)cf->replica, cf->peers,
                           cf->n_peers, &cf->data_plane_secret, cf->data_plane_tls), r, out);
    R->eng = eng;
    R->move = mig_comm_free(R->move);
    R->comm = comm;
    eng = NULL;
    comm = NULL;
    R->epoch = cmd->epoch;
    R->done = step;
    R->lease = step;
    R->failed = false;
    R->nckpt = 0;
    epoch_started(R, cmd->epoch, t0);
    progress(R, 0.0, st_now() - t0); /* before the notice: the same Report carries both */
    double took = st_now() - t0;
    notice(R, "reconfigured",
           FIG(.epoch = cmd->epoch, .step = step, .seconds = took, .stall = took),
           "epoch=%llu mode=%s step=%llu stage=%u replica=%u sent=0 recv=0 seconds=%.6f "
           "stall=%.6f", (unsigned long long)cmd->epoch, mode, (unsigned long long)step,
           cf->stage, cf->replica, took, took);
out:
    reserve_close(); /* the engine is made from it, or none will be */
    worker_engine_free(eng);
    mig_comm_free(comm);
    return r;
}

struct bufctx {
    struct worker_engine *eng;
    bool reshaped;  /* OLD view holds the sending side */
    const struct mig_xfer *base;      /* the transfer list */
    const bool *from_copy;            /* per transfer: send from the held peer copy */
    bool restore;                     /* a peer restore: every send comes from copy */
    const struct worker_peer_gen *copy; /* its generation here; NULL = we hold none */
};

static int xfer_buf(void *userdata, const struct mig_xfer *x, bool send, float **ret) {
    struct bufctx *b = userdata;
    struct worker_layer_bufs L;
    if (send && b->restore) {
        /* Our own state as the plan knows it is our copy, not the engine (try_reconfigure). */
        if (!b->copy)
            return -ENODATA;
        return b->from_copy && b->from_copy[x - b->base] ? worker__peer_held_buf(b->copy, x, ret)
                                                         : worker__peer_own_buf(b->copy, x, ret);
    }
    if (send && b->from_copy && b->from_copy[x - b->base])
        return -ENODATA; /* only a peer restore sends from copies */
    enum worker_view view = send && b->reshaped ? WORKER_VIEW_OLD : WORKER_VIEW_CURRENT;
    TRY(worker_engine_layer(b->eng, view, (int)x->layer, &L));
    float *p;
    if (x->kind == ST_STATE_PARAM) {
        if (x->offset + x->count > L.n)
            return -ERANGE;
        p = L.param + x->offset;
    } else {
        float *base = x->kind == ST_STATE_ADAM_M ? L.adam_m : L.adam_v;
        if (!base || x->offset < L.shard_lo || x->offset + x->count > L.shard_hi)
            return -ERANGE;
        p = base + (x->offset - L.shard_lo);
    }
    *ret = p;
    return 0;
}

/* The communicator of a migration: Migrate.peers (new positions first, then send-only
 * participants with stage WORKER_RUNNER_SPARE_STAGE), or, when the Migrate carries none, the
 * Configure's peers (a migration where every participant takes a position). */
struct peerlist {
    Spottrain__V1__Peer **p;
    size_t n;
};

static size_t mig_npeers(const Spottrain__V1__Migrate *m) {
    return m->n_peers;
}

static struct peerlist order_peers(const Spottrain__V1__Command *cfg,
                                   const Spottrain__V1__Command *mig) {
    struct peerlist pl = {NULL, 0};
    if (mig && mig->migrate->n_peers > 0) {
        pl.p = mig->migrate->peers;
        pl.n = mig->migrate->n_peers;
    } else if (cfg) {
        pl.p = cfg->configure->peers;
        pl.n = cfg->configure->n_peers;
    }
    return pl;
}

/* Maps the Migrate's transfers (worker ids) onto comm ranks (index in peers); -EINVAL for a
 * worker not in peers or a layer the model does not have. */
static int xfers_build(const Spottrain__V1__Migrate *m, struct peerlist pl, int nlayers,
                       struct mig_xfer **ret, bool **ret_copy, size_t *ret_n) {
    struct mig_xfer *x = st_calloc(m->n_transfers + 1, sizeof(*x));
    bool *fc = st_calloc(m->n_transfers + 1, sizeof(*fc));
    if (!x || !fc) {
        st_free(x);
        st_free(fc);
        return -ENOMEM;
    }
    for (size_t i = 0; i < m->n_transfers; i++) {
        const Spottrain__V1__Transfer *t = m->transfers[i];
        x[i].src = x[i].dst = -1;
        for (size_t k = 0; k < pl.n; k++) {
            if (!strcmp(pl.p[k]->worker_id, t->src_worker_id))
                x[i].src = (int)k;
            if (!strcmp(pl.p[k]->worker_id, t->dst_worker_id))
                x[i].dst = (int)k;
        }
        x[i].layer = t->layer;
        x[i].kind = (uint32_t)t->kind;
        x[i].offset = t->offset;
        x[i].count = t->count;
        fc[i] = t->from_peer_copy;
        if (x[i].src < 0 || x[i].dst < 0 || t->layer >= (uint32_t)nlayers) {
            st_free(x);
            st_free(fc);
            return -EINVAL;
        }
    }
    *ret = x;
    *ret_copy = fc;
    *ret_n = m->n_transfers;
    return 0;
}

/* Payload bytes a and b (NULL: none) sent and received so far, together. */
static void comm_bytes(struct mig_comm *a, struct mig_comm *b, uint64_t *sent, uint64_t *recv) {
    uint64_t s = 0, r = 0;
    *sent = *recv = 0;
    mig_comm_stats(a, sent, recv);
    if (b) {
        mig_comm_stats(b, &s, &r);
        *sent += s;
        *recv += r;
    }
}

/* Whether the migration's new epoch is a pipeline: a position of a stage after the first
 * among its peers (send-only participants have stage 0xffffffff). */
static bool into_pipeline(struct peerlist pl) {
    for (size_t i = 0; i < pl.n; i++)
        if (pl.p[i]->stage != UINT32_MAX && pl.p[i]->stage > 0)
            return true;
    return false;
}

/* Whether x moves parameters into the last stage's tied copy of wte (layer 0 into a stage
 * after the first: only stage 0 holds layer 0 as its own). */
static bool tied_copy(struct peerlist pl, const struct mig_xfer *x) {
    uint32_t s = (size_t)x->dst < pl.n ? pl.p[x->dst]->stage : 0;
    return x->kind == ST_STATE_PARAM && x->layer == 0 && s != WORKER_RUNNER_SPARE_STAGE && s > 0;
}

/* The data-plane secret of a migration's epoch: the Migrate carries it for send-only
 * participants, the Configure for all; *tls with it. */
static const ProtobufCBinaryData *order_secret(const Spottrain__V1__Command *cfg,
                                               const Spottrain__V1__Command *mig, bool *tls) {
    const Spottrain__V1__Migrate *m = mig->migrate;
    *tls = m->data_plane_tls;
    if (m->data_plane_secret.len == 0 && cfg) {
        *tls = cfg->configure->data_plane_tls;
        return &cfg->configure->data_plane_secret;
    }
    return &m->data_plane_secret;
}

/* Into a pipeline, the new epoch's first step sends its messages on the communicator while
 * the state still moves after the boundary: the move gets a channel of its own, so the step
 * waits only for what it reads (the layer gate, the update's gate) rather than for every byte
 * of the move at its first message. Every participant decides alike, from the Migrate alone,
 * and all of them build it (a collective), those that move nothing too. */
static bool wants_move(const struct runner *R, const Spottrain__V1__Migrate *m,
                       struct peerlist pl, bool restore) {
    return m->defer_moments && !restore && pl.n > 1 && into_pipeline(pl) && !R->cfg.shared_move;
}

/* Starts building the comms of mig's epoch ahead of its boundary (struct aheadbg), once per
 * epoch; called while we train up to that boundary. Nothing when it cannot (no secret, an
 * address too long, no thread): the boundary builds them as before. */
static void ahead_start(struct runner *R, const Spottrain__V1__Command *cfg,
                        const Spottrain__V1__Command *mig) {
    struct aheadbg *a = &R->ah;
    bool tls;
    const ProtobufCBinaryData *secret = order_secret(cfg, mig, &tls);
    struct peerlist pl = order_peers(cfg, mig);
    if (R->cfg.connect_at_boundary || a->tried == mig->epoch || a->running)
        return;
    /* Whatever follows, once per epoch: what fails here fails again, and the boundary
     * builds the comms itself. */
    a->tried = mig->epoch;
    if (secret->len != MIG_KEY_BYTES || !secret->data || pl.n < 2 || pl.n > INT_MAX)
        return;
    int me = -1;
    for (size_t i = 0; i < pl.n; i++) {
        if (strlen(pl.p[i]->data_addr) >= MIG_ADDR_MAX)
            return;
        if (!strcmp(pl.p[i]->worker_id, worker_agent_id(R->agent)))
            me = (int)i;
    }
    if (me < 0 || !(a->addr = st_calloc(pl.n, sizeof(*a->addr))))
        return;
    for (size_t i = 0; i < pl.n; i++)
        snprintf(a->addr[i], sizeof(a->addr[i]), "%s", pl.p[i]->data_addr);
    memset(&a->auth, 0, sizeof(a->auth));
    memcpy(a->auth.key, secret->data, MIG_KEY_BYTES);
    worker_agent_job_id(R->agent, a->auth.job_id);
    a->auth.tls = tls;
    a->epoch = mig->epoch;
    a->ep = R->ep;
    a->rank = me;
    a->n = (int)pl.n;
    a->move = wants_move(R, mig->migrate, pl, false);
    /* The peers may be as far as a spare still making its engine: as the spare's own wait. */
    a->wait = R->cfg.timeout + R->cfg.reconfig_timeout;
    a->comm = a->mc = NULL;
    a->finished = false;
    a->result = 0;
    atomic_store(&a->stop, false);
    a->t0 = st_now();
    if (pthread_create(&a->th, NULL, ahead_main, a) != 0) {
        ahead_drop(R);
        return;
    }
    a->running = true;
    st_log(ST_LOG_DEBUG, "runner", "Epoch %llu: connecting to its %d participants ahead of "
           "step %llu", (unsigned long long)a->epoch, a->n,
           (unsigned long long)mig->migrate->at_step);
}

/* At the boundary: the comms built ahead, once the build is over; it may still wait for the
 * slowest peer to get its order, as a build at the boundary would, and as long (the data
 * plane's timeout from now). The comms then count the epoch as the endpoint's current one and
 * have the usual no-progress limit. Whatever the outcome, nothing is left built ahead. */
static int ahead_take(struct runner *R, struct mig_comm **comm, struct mig_comm **move,
                      int *rank) {
    struct aheadbg *a = &R->ah;
    double t_take = st_now(), until = t_take + R->cfg.timeout;
    bool late = false;
    pthread_mutex_lock(&a->lock);
    while (!a->finished) {
        if (!late && st_now() >= until) {
            atomic_store(&a->stop, true); /* it returns within 50 ms */
            late = true;
        }
        cond_wait_ms(&a->cond, &a->lock, 20);
    }
    int r = a->result;
    pthread_mutex_unlock(&a->lock);
    pthread_join(a->th, NULL);
    a->running = false;
    if (late && r == -ECANCELED) {
        st_log(ST_LOG_ERR, "runner", "Epoch %llu: the peers did not all connect within %.3g s "
               "of the boundary", (unsigned long long)a->epoch, R->cfg.timeout);
        r = -ETIMEDOUT;
    }
    /* Given up while we were held before the boundary (a built comm does not look): a build
     * at the boundary would have been refused so, and we must not move state for it. */
    if (r >= 0 && mig_endpoint_abandoned(R->ep) > a->epoch) {
        st_log(ST_LOG_WARN, "runner", "Epoch %llu: given up before its boundary; its comms, "
               "built ahead, are closed", (unsigned long long)a->epoch);
        r = -ECANCELED;
    }
    if (r >= 0)
        st_log(ST_LOG_INFO, "runner", "Epoch %llu: its comms were built ahead in %.6f s, "
               "%.6f s before the boundary", (unsigned long long)a->epoch, a->t_end - a->t0,
               ST_MAX(0.0, t_take - a->t_end));
    if (r >= 0 && (r = mig_comm_set_timeout(a->comm, R->cfg.timeout)) >= 0 &&
        (!a->mc || (r = mig_comm_set_timeout(a->mc, R->cfg.timeout)) >= 0)) {
        mig_comm_enter(a->comm);
        mig_comm_enter(a->mc);
        *comm = a->comm;
        *move = a->mc;
        *rank = a->rank;
        a->comm = a->mc = NULL;
    }
    ahead_drop(R);
    return r;
}

/* mode=migrate at the boundary: reshape (or create) the engine on the migration's comm, move
 * the transfers, commit. cfg is NULL for a send-only participant. A peer restore
 * (Migrate.peer_copy_epoch) creates the engine and fills it from pg, our generation of the
 * copies it names (NULL: we hold none; then we send nothing and take only transfers). */
static int apply_migrate(struct runner *R, const Spottrain__V1__Command *cfg,
                         const Spottrain__V1__Command *mig, const int *split, int nsplit,
                         const struct worker_peer_gen *pg) {
    const Spottrain__V1__Migrate *m = mig->migrate;
    bool restore = m->peer_copy_epoch > 0;
    struct mig_comm *comm = NULL, *move = NULL;
    struct mig_xfer *x = NULL, *xd = NULL;
    bool *fc = NULL;
    size_t nx = 0;
    struct worker_layout lay;
    struct mig_exec_stats st;
    uint64_t wsent0 = 0, wrecv0 = 0, wsent = 0, wrecv = 0;
    bool reshaped = false, created = false;
    size_t prewarmed = 0;
    int rank, r;
    double t0 = st_now();

    struct peerlist pl = order_peers(cfg, mig);
    memset(&st, 0, sizeof(st));
    TRY_GOTO(xfers_build(m, pl, R->nlayers, &x, &fc, &nx), r, out);
    bool tls;
    const ProtobufCBinaryData *secret = order_secret(cfg, mig, &tls);
    if (cfg) {
        const Spottrain__V1__Configure *cf = cfg->configure;
        if (!cf->shape)
            TRY_GOTO(-EINVAL, r, out);
        TRY_GOTO(layout_build(R, (int)cf->shape->dp, (int)cf->shape->pp, split, nsplit,
                              pl.p, pl.n, cf, &lay), r, out);
        if (!R->eng || R->failed || restore) {
            /* A new engine (a spare taking a position, a restore) is made before the comm:
             * a spare has its order a lease ahead of the boundary, and makes its memory, work
             * buffers included, while the others train up to it; the handshake below waits
             * for them. */
            R->eng = worker_engine_free(R->eng);
            TRY_GOTO(worker_engine_new_detached(&R->tc, &lay, (int)cf->stage, (int)cf->replica,
                                                R->tokens, &R->eng), r, out);
            created = true;
            /* A peer restore keeps what our copy and our new position share, as a reshape of
             * the copy's engine would; the rest arrives in the transfers. */
            if (pg)
                TRY_GOTO(worker__peer_fill(pg, R->eng), r, out);
            else
                TRY_GOTO(worker_engine_set_opt_step(R->eng, (int)m->at_step), r, out);
            TRY_GOTO(worker_engine_ready(R->eng), r, out);
            prewarmed = reserve_close();
        }
    } else if (restore ? !pg : !R->eng || R->failed) {
        /* Nothing to send from: only a send-only participant that holds state is asked. */
        TRY_GOTO(-ENODATA, r, out);
    }
    double t_made = st_now();
    /* A worker that did not train up to the boundary (a spare, whose order came a lease
     * ahead) is early: its peers may be that far from it, a lease of their slowest steps, so
     * it waits reconfig_timeout longer for them (a failed epoch frees it sooner: the next
     * order abandons this handshake). One that did is within a step of the others. Tests
     * hold the others back (boundary_delay) to walk the spare's long wait. */
    bool early = created && !restore;
    if (!early && !restore && R->cfg.boundary_delay > 0)
        hold_until_moved_on(R, mig->epoch, R->cfg.boundary_delay);
    if (R->ah.epoch == mig->epoch) {
        /* Built while we trained up to here (ahead_start): what is left is the wait for the
         * slowest peer's handshake, if it came late. */
        TRY_GOTO(ahead_take(R, &comm, &move, &rank), r, out);
        relay_auth_failures(R);
    } else {
        TRY_GOTO(comm_build(R, mig->epoch, pl.p, pl.n, secret, tls,
                            R->cfg.timeout + (early ? R->cfg.reconfig_timeout : 0), &comm,
                            &rank), r, out);
        if (wants_move(R, m, pl, restore)) {
            int mrank;
            TRY_GOTO(comm_build(R, mig->epoch | MIG_EPOCH_MOVE, pl.p, pl.n, secret, tls,
                                R->cfg.timeout, &move, &mrank), r, out);
        }
    }
    if (early) {
        /* Those that train up to the boundary may have connected ahead of it, and send only
         * once there: as far as a lease of their slowest steps, which we wait for as we
         * would have in the handshake. */
        TRY_GOTO(mig_comm_set_first_wait(comm, R->cfg.timeout + R->cfg.reconfig_timeout), r,
                 out);
        if (move)
            TRY_GOTO(mig_comm_set_first_wait(move, R->cfg.timeout + R->cfg.reconfig_timeout),
                     r, out);
    }
    double t_comm = st_now();
    if (created) {
        TRY_GOTO(worker_engine_attach(R->eng, comm), r, out);
    } else if (cfg) {
        const Spottrain__V1__Configure *cf = cfg->configure;
        /* The moments we keep but whose shard changes are copied after the boundary too. */
        if (m->defer_moments && !restore)
            worker_engine_reshape_moments_later(R->eng);
        TRY_GOTO(worker_engine_reshape_begin(R->eng, &lay, (int)cf->stage, (int)cf->replica,
                                             comm), r, out);
        reshaped = true;
    }
    struct bufctx b = {R->eng, reshaped, x, fc, restore, pg};
    /* A peer restore may hand us a range of the copy we hold ourselves (we take over the lost
     * worker's position): copy it locally; the transport only moves between two ranks. */
    size_t keep = 0;
    for (size_t i = 0; i < nx; i++) {
        if (!(restore && x[i].src == rank && x[i].dst == rank)) {
            x[keep] = x[i];
            fc[keep] = fc[i];
            keep++;
            continue;
        }
        float *from, *to;
        TRY_GOTO(xfer_buf(&b, &x[i], true, &from), r, out);
        struct bufctx nb = {R->eng, false, NULL, NULL, false, NULL};
        TRY_GOTO(xfer_buf(&nb, &x[i], false, &to), r, out);
        memcpy(to, from, (size_t)x[i].count * sizeof(float));
    }
    nx = keep;
    /* State after the boundary (struct deferbg): every participant orders the list alike,
     * the parameters' transfers by layer (stable; the later stages' tied copies of wte after
     * every layer), then the optimizer moments' in the Migrate's order, so each connection carries them in the same order at both ends
     * whether a participant runs them in one batch or in several. Nothing is left for the
     * boundary itself. */
    size_t nd = 0, nparam = 0, ntied = 0;
    if (m->defer_moments && !restore) {
        xd = st_calloc(nx ? nx : 1, sizeof(*xd));
        if (!xd)
            TRY_GOTO(-ENOMEM, r, out);
        uint32_t top = 0;
        for (size_t i = 0; i < nx; i++)
            if (x[i].kind == ST_STATE_PARAM && x[i].layer > top)
                top = x[i].layer;
        for (uint32_t l = 0; l <= top; l++)
            for (size_t i = 0; i < nx; i++)
                if (x[i].kind == ST_STATE_PARAM && x[i].layer == l && !tied_copy(pl, &x[i]))
                    xd[nd++] = x[i];
        /* A later stage's tied copy of wte last: its head reads it after every layer of the
         * stage (WORKER_ENGINE_TIED_LAYER at the gate), the stage's first layer at once. */
        for (size_t i = 0; i < nx; i++)
            if (x[i].kind == ST_STATE_PARAM && tied_copy(pl, &x[i]))
                xd[nd++] = x[i], ntied++;
        nparam = nd;
        for (size_t i = 0; i < nx; i++)
            if (x[i].kind != ST_STATE_PARAM)
                xd[nd++] = x[i];
        nx = 0;
    }
    /* The figures are the transport's: payload bytes that crossed the wire in this epoch's
     * communicator (and its move channel), not the transfer list's sum. */
    comm_bytes(comm, move, &wsent0, &wrecv0);
    double t_reshape = st_now();
    TRY_GOTO(mig_execute(comm, x, nx, xfer_buf, &b, &st), r, out);
    struct bufctx bd = {R->eng, reshaped, xd, NULL, false, NULL};
    struct mig_comm *mc = move ? move : comm; /* what the state after the boundary moves on */
    if (nd > 0 && !cfg) {
        /* We leave: nothing to overlap with, so the second batch runs here. */
        TRY_GOTO(mig_execute(mc, xd, nd, xfer_buf, &bd, NULL), r, out);
    } else if (nd > 0 || (reshaped && m->defer_moments)) {
        /* Our buffers now, while the old view is the reshape's: the commit below makes it the
         * engine's held old buffers, which the thread then reads. */
        struct deferbg *d = &R->df;
        d->ptrs = st_calloc(nd ? nd : 1, sizeof(*d->ptrs));
        if (!d->ptrs)
            TRY_GOTO(-ENOMEM, r, out);
        for (size_t i = 0; i < nd; i++)
            if (xd[i].src == rank || xd[i].dst == rank)
                TRY_GOTO(xfer_buf(&bd, &xd[i], xd[i].src == rank, &d->ptrs[i]), r, out);
        d->x = xd;
        d->n = nd;
        d->nparam = nparam;
        d->ntied = ntied;
        d->tied_delay = R->cfg.tied_delay;
        d->params_below = 0;
        xd = NULL;
        d->eng = reshaped ? R->eng : NULL;
        d->comm = mc;
        d->early = early;
        d->own = mc != comm;
        comm_bytes(comm, move, &wsent, &wrecv); /* the thread counts its own */
        mig_comm_stats(mc, &d->sent0, &d->recv0);
        d->t0 = st_now();
        atomic_store(&d->finished, false);
        if (reshaped)
            worker_engine_hold_old(R->eng, true);
        if (pthread_create(&d->th, NULL, defer_main, d) == 0) {
            d->running = true;
            worker_engine_set_gate(R->eng, defer_gate, defer_layer_gate, R);
            /* On a channel of its own the move does not hold up the pipeline's messages. */
            worker_engine_gate_messages(R->eng, mc == comm);
        } else {
            (void)worker_engine_copy_kept_moments(R->eng);
            worker_engine_hold_old(R->eng, false);
            r = mig_execute(mc, d->x, d->n, defer_buf, d, NULL);
            defer_free(R);
            if (r < 0)
                goto out;
        }
    }
    if (!R->df.running)
        comm_bytes(comm, move, &wsent, &wrecv);
    double t_xfer = st_now();
    if (reshaped)
        TRY_GOTO(worker_engine_reshape_commit(R->eng), r, out);
    reshaped = false;
    /* The step's buffers now, inside the stall (the commit part), not in the first step,
     * whose time the stall subtracts (a new engine made them before the handshake). */
    size_t fresh = 0;
    if (cfg) {
        TRY_GOTO(worker_engine_ready(R->eng), r, out);
        fresh = created ? 0 : worker_engine_work_fresh(R->eng);
    }
    peer_side_drop(R); /* the old epoch's copies end with its communicator */
    if (cfg)
        TRY_GOTO(peer_side_set(R, mig->epoch, &lay, (int)cfg->configure->stage,
                               (int)cfg->configure->replica, pl.p, pl.n, secret, tls), r, out);
    R->comm = mig_comm_free(R->comm);
    R->comm = comm; /* a send-only worker keeps it open too: its peers may still be reading */
    comm = NULL;
    R->move = mig_comm_free(R->move);
    R->move = move; /* the same; the thread, if any, runs on it */
    move = NULL;
    if (!cfg) {
        R->eng = worker_engine_free(R->eng); /* gave everything away: now a spare */
        if (!R->noticed)
            reserve_open(R); /* a spare that may be given a position again */
    }
    if (!cfg && R->noticed && R->cfg.leave_killed) {
        st_log(ST_LOG_NOTICE, "runner", "Test: our state has left; gone now, before we tell "
               "anyone (SPOTTRAIN_TEST_LEAVE_KILLED)");
        raise(SIGKILL);
    }
    if (!cfg && R->noticed && !R->told_left && R->cfg.state_left) {
        R->told_left = true;
        R->cfg.state_left(R->cfg.notice_userdata);
    }
    R->epoch = mig->epoch;
    R->done = m->at_step;
    /* The new epoch's first lease came with the order: train on at once rather than a round
     * trip later, when the coordinator has heard every participant. */
    R->lease = cfg && m->lease > m->at_step ? m->lease : m->at_step;
    R->failed = false;
    R->nckpt = 0;
    if (cfg)
        epoch_started(R, mig->epoch, t0);
    R->early_first = early;
    double t_end = st_now();
    double stall = t_end - (R->blocked_since > 0 ? R->blocked_since : t0);
    progress(R, 0.0, stall); /* before the notice: the same Report carries both */
    struct reconf_note note = {
        .epoch = mig->epoch,
        .step = m->at_step,
        .replayed = R->rolled_back,
        .sent = wsent - wsent0,
        .recv = wrecv - wrecv0,
        .stage = cfg ? (int)cfg->configure->stage : -1,
        .replica = cfg ? (int)cfg->configure->replica : -1,
        .seconds = st.seconds,
        .stall = stall,
        .wait = R->blocked_since > 0 ? t0 - R->blocked_since : 0.0,
        .connect = t_comm - t_made,
        .reshape = (t_made - t0) + (t_reshape - t_comm),
        .transfer = t_xfer - t_reshape,
        .commit = t_end - t_xfer,
        .fresh = fresh,
        .prewarmed = prewarmed,
    };
    if (R->df.running)
        R->df.note = note; /* told with the moments' bytes once they are in */
    else
        tell_reconfigured(R, &note);
out:
    if (r < 0) {
        defer_cancel(R); /* its buffers go with the reshape's */
        defer_free(R);   /* or what was made for a batch that never started */
        if (reshaped)
            worker_engine_reshape_abort(R->eng);
        if (created)
            R->eng = worker_engine_free(R->eng);
        reserve_close();
        /* The epoch is broken. Whatever we applied of it goes with the engine: what survives
         * is on disk and in our peer copies, and the restore that follows starts from those. */
        fail_state(R);
        R->epoch = mig->epoch;
    }
    mig_comm_free(move);
    mig_comm_free(comm);
    st_free(x);
    st_free(xd);
    st_free(fc);
    return r;
}

/* ---- the loop ----------------------------------------------------------------------------- */

static void take_commands(struct runner *R) {
    Spottrain__V1__Command *q[RUNNER_MAX_QUEUE];
    pthread_mutex_lock(&R->lock);
    size_t n = R->nqueue;
    memcpy(q, R->queue, n * sizeof(*q));
    R->nqueue = 0;
    pthread_mutex_unlock(&R->lock);
    for (size_t i = 0; i < n; i++) {
        Spottrain__V1__Command *c = q[i];
        switch (c->body_case) {
        case SPOTTRAIN__V1__COMMAND__BODY_STOP:
            R->stop = true;
            break;
        case SPOTTRAIN__V1__COMMAND__BODY_CONFIGURE:
            if (c->epoch > R->epoch) {
                if (R->pcfg && R->pcfg->epoch > c->epoch)
                    break;
                if (R->pmig && R->pmig->epoch < c->epoch)
                    cmd_free(&R->pmig);
                cmd_free(&R->pcfg);
                R->pcfg = c;
                R->pending_since = st_now();
                c = NULL;
            }
            break;
        case SPOTTRAIN__V1__COMMAND__BODY_MIGRATE: {
            const Spottrain__V1__Migrate *m = c->migrate;
            if (c->epoch == R->epoch && mig_npeers(m) == 0 && m->n_transfers == 0) {
                if (m->at_step > R->lease)
                    R->lease = m->at_step;
            } else if (c->epoch > R->epoch) {
                if (R->pmig && R->pmig->epoch > c->epoch)
                    break;
                cmd_free(&R->pmig);
                if (R->pcfg && R->pcfg->epoch < c->epoch)
                    cmd_free(&R->pcfg);
                R->pmig = c;
                if (!R->pending_since)
                    R->pending_since = st_now();
                c = NULL;
            }
            break;
        }
        case SPOTTRAIN__V1__COMMAND__BODY_CHECKPOINT:
            if (c->epoch == R->epoch && R->nckpt < RUNNER_MAX_CKPTS) {
                snprintf(R->ckpt[R->nckpt].dir, sizeof(R->ckpt[0].dir), "%s",
                         c->checkpoint->dir);
                R->ckpt[R->nckpt].at = c->checkpoint->at_step;
                R->nckpt++;
            }
            break;
        default:
            break;
        }
        cmd_free(&c);
    }
}

static void poll_notice(struct runner *R) {
    if (!R->cfg.poll_notice || R->noticed || st_now() < R->next_notice_poll)
        return;
    R->next_notice_poll = st_now() + R->cfg.notice_interval;
    char kind[32];
    double at = 0;
    int r = R->cfg.poll_notice(R->cfg.notice_userdata, kind, sizeof(kind), &at);
    if (r > 0 && !strcmp(kind, "terminate")) {
        R->noticed = true;
        if (worker_agent_notice(R->agent, "terminate", at, "instance-action", NULL) < 0)
            st_log(ST_LOG_WARN, "runner", "Cannot relay the interruption notice, ignoring");
        st_log(ST_LOG_NOTICE, "runner", "Interruption notice: terminate at %.0f", at);
    }
}

/* Acts on a complete pending reconfiguration, if its time has come. Returns true when it
 * consumed it. */
static bool try_reconfigure(struct runner *R) {
    char mode[16], dir[ST_SPEC_PATH_MAX];
    int split[WORKER_MAX_STAGES + 1], nsplit = 0;
    if (R->ah.epoch && (!R->pmig || R->pmig->epoch != R->ah.epoch))
        ahead_drop(R); /* its order was replaced or given up */
    if (!R->pcfg && !R->pmig)
        return false;
    if (R->pcfg && worker_configure_setup(R->pcfg->configure, mode, sizeof(mode), split,
                                          (int)ST_ARRAY_SIZE(split), &nsplit, dir,
                                          sizeof(dir)) < 0) {
        notice(R, "reconfig-failed", FIG(.epoch = R->pcfg->epoch),
               "epoch=%llu bad rendezvous '%s'",
               (unsigned long long)R->pcfg->epoch, R->pcfg->configure->rendezvous);
        cmd_free(&R->pcfg);
        R->pending_since = 0;
        return true;
    }
    bool peer_mode = R->pcfg && !strcmp(mode, "peer-restore");
    if (R->pcfg && strcmp(mode, "migrate") != 0 && !peer_mode) {
        int r = apply_fresh(R, R->pcfg, mode, split, nsplit, dir);
        if (r < 0)
            notice(R, "reconfig-failed", FIG(.epoch = R->pcfg->epoch),
                   "epoch=%llu mode=%s: %s", (unsigned long long)R->pcfg->epoch, mode,
                   st_strerror(r));
        else if (R->pmig && R->pmig->epoch <= R->epoch)
            cmd_free(&R->pmig);
        R->epoch = R->pcfg->epoch;
        cmd_free(&R->pcfg);
        R->pending_since = 0;
        R->blocked_since = 0;
        return true;
    }
    /* mode=migrate needs the Migrate; an assigned worker needs the Configure as well. */
    bool expired = st_now() - R->pending_since > R->cfg.reconfig_timeout;
    if (!R->pmig || (R->pcfg && R->pcfg->epoch != R->pmig->epoch)) {
        if (expired) {
            uint64_t e = R->pcfg ? R->pcfg->epoch : R->pmig->epoch;
            notice(R, "reconfig-failed", FIG(.epoch = e),
                   "epoch=%llu: the migration order did not arrive", (unsigned long long)e);
            cmd_free(&R->pcfg);
            cmd_free(&R->pmig);
            R->pending_since = 0;
        }
        return false;
    }
    bool assigned = mig_npeers(R->pmig->migrate) == 0; /* without peers, only positions */
    struct peerlist pl = order_peers(R->pcfg, R->pmig);
    for (size_t k = 0; k < pl.n && mig_npeers(R->pmig->migrate) > 0; k++)
        if (!strcmp(pl.p[k]->worker_id, worker_agent_id(R->agent)))
            assigned = pl.p[k]->stage != WORKER_RUNNER_SPARE_STAGE;
    if (assigned && !R->pcfg) {
        if (expired) {
            notice(R, "reconfig-failed", FIG(.epoch = R->pmig->epoch),
                   "epoch=%llu: no Configure for an assigned worker",
                   (unsigned long long)R->pmig->epoch);
            cmd_free(&R->pmig);
            R->pending_since = 0;
        }
        return false;
    }
    /* The moments of the migration before (still moving if no step came between) are in
     * before anything below looks at our state. */
    defer_wait(R);
    uint64_t at = R->pmig->migrate->at_step, copy_epoch = R->pmig->migrate->peer_copy_epoch;
    const struct worker_peer_gen *g = NULL;
    const char *refuse = NULL;
    char why[120];
    R->rolled_back = 0;
    if (copy_epoch > 0) {
        /* A peer restore. The state the plan assumes we hold is our copy of step `at` of the
         * copies' epoch, never our engine: a failed epoch may have reshaped it (we committed
         * our half of a migration whose other half failed) or left it mid-step. So the engine
         * goes, and apply_migrate() builds a new one from the copy; the steps since are
         * replayed, and data order is a function of the step, so they come out the same. */
        g = worker__peer_get(&R->peers, copy_epoch, at);
        if (!g && worker__peer_holds(&R->peers, copy_epoch)) {
            /* We were a position of that epoch but no longer hold that step (the
             * coordinator's view of our copies lags): starting from anything else would
             * change the bits. */
            snprintf(why, sizeof(why), "no peer copy of step %llu of epoch %llu here",
                     (unsigned long long)at, (unsigned long long)copy_epoch);
            refuse = why;
        } else {
            if (g && R->done > at)
                R->rolled_back = R->done - at;
            if (R->eng)
                st_log(ST_LOG_NOTICE, "runner", "Peer restore: from %s of step %llu (epoch %llu), "
                       "not the engine at step %llu", g ? "our copy" : "nothing of ours",
                       (unsigned long long)at, (unsigned long long)copy_epoch,
                       (unsigned long long)R->done);
            drop_state(R);
            R->failed = false;
        }
    } else if (peer_mode) {
        refuse = "a peer restore that names no copies"; /* a coordinator of another release */
    } else if (R->failed && R->epoch + 1 == R->pmig->epoch) {
        /* A live migration planned on our state of the epoch we failed in (the order crossed
         * our failure; after a failed epoch the coordinator orders only restores): that state
         * is gone, and a new engine in its place would silently change the bits. Refuse; the
         * coordinator restores instead. */
        refuse = "our state was lost in a failed step";
    } else if (R->eng && (R->failed || R->epoch + 1 != R->pmig->epoch)) {
        /* State counts only if it is the previous epoch's: a worker left out of an epoch (a
         * spare during a restore) holds stale state the plan knows nothing about. */
        drop_state(R);
        R->failed = false;
    }
    if (refuse) {
        notice(R, "reconfig-failed", FIG(.epoch = R->pmig->epoch), "epoch=%llu: %s",
               (unsigned long long)R->pmig->epoch, refuse);
        fail_state(R);
        cmd_free(&R->pcfg);
        cmd_free(&R->pmig);
        R->pending_since = 0;
        return true;
    }
    bool have_state = R->eng != NULL;
    if (have_state && R->done < at) {
        /* Meanwhile a thread of ours connects to the epoch's participants (struct aheadbg). */
        if (copy_epoch == 0 && !R->failed && R->epoch + 1 == R->pmig->epoch)
            ahead_start(R, R->pcfg, R->pmig);
        /* Train up to the boundary first; meanwhile the engine makes our new position's
         * memory ready on a thread of its own (worker_engine_reshape_prepare), so the
         * boundary finds it allocated and faulted in. Only an optimization: a failure here
         * leaves the reshape to allocate at the boundary, as it would have. */
        if (R->pcfg && R->prepared != R->pmig->epoch && !R->failed &&
            R->epoch + 1 == R->pmig->epoch && R->pcfg->configure->shape) {
            const Spottrain__V1__Configure *cf = R->pcfg->configure;
            struct worker_layout lay;
            R->prepared = R->pmig->epoch;
            if (layout_build(R, (int)cf->shape->dp, (int)cf->shape->pp, split, nsplit, pl.p,
                             pl.n, cf, &lay) == 0) {
                int r = worker_engine_reshape_prepare(R->eng, &lay, (int)cf->stage,
                                                      (int)cf->replica);
                if (r < 0)
                    st_log(ST_LOG_WARN, "runner", "Epoch %llu: could not prepare the "
                           "reshape ahead of step %llu: %s", (unsigned long long)R->pmig->epoch,
                           (unsigned long long)at, st_strerror(r));
            }
        }
        return false;
    }
    if (have_state && R->done > at) {
        notice(R, "reconfig-failed", FIG(.epoch = R->pmig->epoch),
               "epoch=%llu: boundary %llu already passed (at %llu)",
               (unsigned long long)R->pmig->epoch, (unsigned long long)at,
               (unsigned long long)R->done);
        cmd_free(&R->pcfg);
        cmd_free(&R->pmig);
        R->pending_since = 0;
        return true;
    }
    /* A live migration starts once the copy of its boundary is complete on our side: if the
     * migration fails, the restore starts from that copy. */
    if (copy_epoch == 0 && have_state && !R->failed)
        peer_settle(R, false);
    int r = apply_migrate(R, R->pcfg, R->pmig, split, nsplit, g);
    if (r < 0)
        notice(R, "reconfig-failed", FIG(.epoch = R->pmig->epoch),
               "epoch=%llu mode=migrate: %s", (unsigned long long)R->pmig->epoch,
               st_strerror(r));
    cmd_free(&R->pcfg);
    cmd_free(&R->pmig);
    R->pending_since = 0;
    R->blocked_since = 0;
    return true;
}

static void bg_free(struct bgckpt *b) {
    for (int i = 0; b->snap && i < b->hi - b->lo; i++)
        st_free(b->snap[i]);
    st_free(b->snap);
    st_free(b->n);
    b->snap = NULL;
    b->n = NULL;
}

/* Waits for the background writer (if any) and releases its snapshot. */
static void bg_join(struct runner *R) {
    if (R->bg.running) {
        pthread_join(R->bg.th, NULL);
        R->bg.running = false;
    }
    bg_free(&R->bg);
}

static void *bg_main(void *arg) {
    struct bgckpt *b = arg;
    struct runner *R = b->R;
    struct mig_ckpt_writer *w = NULL;
    double t0 = st_now();
    int r = mig_ckpt_writer_new(b->dir, &w);
    for (int i = 0; r >= 0 && i < b->hi - b->lo; i++) {
        int layer = b->lo + i;
        struct mig_tensor t[3 * KERN_MAX_TENSORS];
        char names[KERN_MAX_TENSORS][KERN_TENSOR_NAME_MAX];
        int nt = kern_layer_tensor_count(&R->tc.model, layer);
        if (nt <= 0 || nt > KERN_MAX_TENSORS) {
            r = -EINVAL;
            break;
        }
        for (int k = 0; k < nt; k++) {
            struct kern_tensor_info ti;
            kern_layer_tensor(&R->tc.model, layer, k, &ti);
            memcpy(names[k], ti.name, sizeof(names[k]));
            for (int kind = 0; kind < 3; kind++) {
                struct mig_tensor *x = &t[3 * k + kind];
                x->name = names[k];
                x->kind = (enum st_state_kind)kind;
                x->count = ti.numel;
                x->data = b->snap[i] + (size_t)kind * b->n[i] + ti.offset;
            }
        }
        r = mig_ckpt_write_layer(w, layer, t, (size_t)(3 * nt));
    }
    mig_ckpt_writer_free(w);
    b->result = r;
    if (r < 0)
        notice(R, "ckpt-failed", FIG(.step = b->step),
               "step=%llu: writing '%s': %s", (unsigned long long)b->step,
               b->dir, st_strerror(r));
    else {
        struct st_notice_figures f = {.step = b->step, .stage = b->stage,
                                      .seconds = st_now() - t0};
        snprintf(f.dir, sizeof(f.dir), "%s", b->dir);
        notice(R, "ckpt-written", &f, "step=%llu stage=%d pp=%d seconds=%.6f dir=%s",
               (unsigned long long)b->step, b->stage, b->pp, f.seconds, b->dir);
    }
    return NULL;
}

/* At the boundary: gathers this stage's moments (collective over the stage's replicas) into a
 * snapshot; replica 0 hands it to a background writer. Training resumes right after. */
static int bg_start(struct runner *R, const char *dir) {
    bg_join(R); /* one writer at a time */
    struct bgckpt *b = &R->bg;
    const struct worker_layout *lay = worker_engine_layout(R->eng);
    int s = worker_engine_stage(R->eng), rep = worker_engine_replica(R->eng), dp = lay->dp;
    int group[WORKER_MAX_RANKS];
    size_t counts[WORKER_MAX_RANKS];
    int r = 0;
    memset(b, 0, sizeof(*b));
    b->R = R;
    snprintf(b->dir, sizeof(b->dir), "%s", dir);
    b->step = R->done;
    b->stage = s;
    b->pp = lay->pp;
    b->lo = lay->stage_lo[s];
    b->hi = lay->stage_lo[s + 1];
    b->snap = st_calloc((size_t)(b->hi - b->lo), sizeof(*b->snap));
    b->n = st_calloc((size_t)(b->hi - b->lo), sizeof(*b->n));
    if (!b->snap || !b->n)
        TRY_GOTO(-ENOMEM, r, out);
    for (int k = 0; k < dp; k++)
        group[k] = lay->ranks[s * dp + k];
    for (int i = 0; i < b->hi - b->lo; i++) {
        struct worker_layer_bufs L;
        TRY_GOTO(worker_engine_layer(R->eng, WORKER_VIEW_CURRENT, b->lo + i, &L), r, out);
        float *x = st_malloc(3 * L.n * sizeof(float));
        if (!x)
            TRY_GOTO(-ENOMEM, r, out);
        b->snap[i] = x;
        b->n[i] = L.n;
        memcpy(x, L.param, L.n * sizeof(float));
        if (dp == 1) {
            memcpy(x + L.n, L.adam_m, L.n * sizeof(float));
            memcpy(x + 2 * L.n, L.adam_v, L.n * sizeof(float));
            continue;
        }
        for (int k = 0; k < dp; k++) {
            size_t lo, hi;
            worker_shard(L.n, dp, k, &lo, &hi);
            counts[k] = hi - lo;
        }
        TRY_GOTO(mig_allgather(R->comm, group, dp, L.adam_m, x + L.n, counts, MIG_F32), r, out);
        TRY_GOTO(mig_allgather(R->comm, group, dp, L.adam_v, x + 2 * L.n, counts, MIG_F32), r,
                 out);
    }
    if (rep != 0) {
        bg_free(b); /* replica 0 of the stage writes */
        return 0;
    }
    if (pthread_create(&b->th, NULL, bg_main, b) != 0)
        TRY_GOTO(-EAGAIN, r, out);
    b->running = true;
out:
    if (r < 0)
        bg_free(b);
    return r;
}

static void run_checkpoints(struct runner *R) {
    int keep = 0;
    for (int i = 0; i < R->nckpt; i++) {
        if (R->ckpt[i].at > R->done) {
            R->ckpt[keep++] = R->ckpt[i];
            continue;
        }
        defer_wait(R); /* the moments are in the checkpoint: all of them */
        if (R->ckpt[i].at < R->done || !R->eng || R->failed) {
            st_log(ST_LOG_WARN, "runner", "Checkpoint at step %llu missed (at %llu), ignoring",
                   (unsigned long long)R->ckpt[i].at, (unsigned long long)R->done);
            continue;
        }
        double t0 = st_now();
        if (R->done < (uint64_t)R->tc.total_steps) {
            /* Periodic: snapshot now, write in the background, the coordinator commits. */
            int r = bg_start(R, R->ckpt[i].dir);
            if (r < 0) {
                fail_state(R);
                notice(R, "step-failed", FIG(.epoch = R->epoch, .step = R->done),
                       "epoch=%llu checkpoint step=%llu: %s", (unsigned long long)R->epoch,
                       (unsigned long long)R->done, st_strerror(r));
            } else {
                progress(R, 0.0, st_now() - t0);
            }
            continue;
        }
        /* The final one (--save): written and committed here, before Stop. */
        int r = worker_engine_save(R->eng, R->ckpt[i].dir, R->done);
        if (r < 0) {
            R->failed = true;
            notice(R, "step-failed", FIG(.epoch = R->epoch, .step = R->done),
                   "epoch=%llu checkpoint step=%llu: %s", (unsigned long long)R->epoch,
                   (unsigned long long)R->done, st_strerror(r));
        } else {
            struct st_notice_figures f = {.step = R->done, .seconds = st_now() - t0};
            snprintf(f.dir, sizeof(f.dir), "%s", R->ckpt[i].dir);
            notice(R, "checkpointed", &f, "step=%llu seconds=%.6f dir=%s",
                   (unsigned long long)R->done, f.seconds, R->ckpt[i].dir);
            progress(R, 0.0, st_now() - t0);
        }
    }
    R->nckpt = keep;
}

/* Every peer_copy_every steps: a new generation of peer copies (worker-peer.h), unless the
 * epoch's copies do not fit the memory budget (then no copies at all in this epoch, said once:
 * every worker takes the same decision from the layout, so nobody waits on a refusing peer).
 * The runner snapshots its state at the step boundary; the exchange runs on the epoch's side
 * channel, on a thread of its own while the next steps train (or here, with
 * peer_copy_background false). A failed exchange does not fail the epoch: a lost peer fails
 * the next step anyway, and the generations kept before still serve a restore. */
static void peer_copy(struct runner *R) {
    const struct st_spec_fault_tolerance *ft = &R->cfg.spec.fault_tolerance;
    struct peerbg *b = &R->pc;
    if (ft->peer_copy_every <= 0 || !R->eng || R->failed || worker_engine_stage(R->eng) < 0 ||
        R->done % (uint64_t)ft->peer_copy_every != 0 || R->done >= (uint64_t)R->tc.total_steps)
        return;
    const struct worker_layout *lay = worker_engine_layout(R->eng);
    if (lay->dp * lay->pp < 2 || R->peer_refused == R->epoch)
        return;
    uint64_t need = worker__peer_need_max(&R->tc, lay);
    if (need > ft->peer_copy_memory) {
        R->peer_refused = R->epoch;
        st_log(ST_LOG_ERR, "runner", "Peer copies of a %dx%d layout need %llu bytes per worker, "
               "more than fault_tolerance.peer_copy_memory (%llu): none in epoch %llu; a loss "
               "restores from the disk checkpoint", lay->dp, lay->pp, (unsigned long long)need,
               (unsigned long long)ft->peer_copy_memory, (unsigned long long)R->epoch);
        notice(R, "peer-copy-refused", FIG(.epoch = R->epoch, .need = need),
               "epoch=%llu need=%llu budget=%llu",
               (unsigned long long)R->epoch, (unsigned long long)need,
               (unsigned long long)ft->peer_copy_memory);
        return;
    }
    if (b->epoch != R->epoch || b->broken)
        return; /* no side channel in this epoch (no secret), or it failed */
    double t0 = st_now();
    /* The exchange in flight ends by itself first (bounded by the data plane's no-progress
     * timeout): every worker starts them at the same steps, so each pair of neighbours always
     * exchanges the same generation. A lost peer fails our steps first, and that cancels it. */
    peer_settle(R, false);
    if (b->broken)
        return;
    int r = 0;
    if (!b->side) {
        /* Collective: every position reaches its first copy at the same step. */
        const char *addrs[WORKER_MAX_RANKS];
        for (int p = 0; p < b->npos; p++)
            addrs[p] = b->addr[p];
        r = mig_comm_new_auth("tcp", R->ep, R->epoch | MIG_EPOCH_SIDE, b->pos, b->npos, addrs,
                              &b->auth, R->cfg.timeout, &b->side);
        relay_auth_failures(R);
    }
    if (r >= 0)
        r = worker__peer_take(&R->tc, R->eng, R->epoch, R->done, &b->g);
    if (r < 0) {
        b->broken = true;
        if (b->side)
            (void)mig_comm_shut(b->side); /* as peer_main: our neighbours must not wait */
        notice(R, "peer-copy-failed", FIG(.epoch = R->epoch, .step = R->done),
               "epoch=%llu step=%llu: %s", (unsigned long long)R->epoch,
               (unsigned long long)R->done, st_strerror(r));
        return;
    }
    b->t0 = st_now();
    b->blocked = b->t0 - t0;
    atomic_store(&b->finished, false);
    if (ft->peer_copy_background && pthread_create(&b->th, NULL, peer_main, b) == 0) {
        b->running = true;
        return;
    }
    peer_main(b); /* at the boundary: asked for, or no thread to spare */
    atomic_store(&b->finished, false);
    b->blocked = st_now() - t0;
    peer_finish(R);
}

static bool can_step(struct runner *R) {
    if (!R->eng || R->failed || R->done >= R->lease || R->done >= (uint64_t)R->tc.total_steps ||
        worker_engine_stage(R->eng) < 0)
        return false;
    if (R->pmig && R->pmig->migrate->at_step <= R->done)
        return false;
    return true;
}

static int runner_loop(struct runner *R) {
    while (!R->stop) {
        /* Strangers on the data port are refused while we train, not only at the next epoch. */
        (void)mig_endpoint_service(R->ep);
        relay_auth_failures(R);
        take_commands(R);
        if (R->stop)
            break;
        poll_notice(R);
        if (R->pc.running && atomic_load(&R->pc.finished))
            peer_settle(R, false); /* an exchange is done: keep it and tell at once */
        if (R->df.running && atomic_load(&R->df.finished))
            defer_wait(R); /* a migration's moments are in: tell at once */
        run_checkpoints(R); /* a checkpoint at a boundary is taken before reshaping there */
        if (try_reconfigure(R))
            continue;
        if (R->cfg.stall_step > 0 && !R->stalled && R->done + 1 == R->cfg.stall_step &&
            can_step(R)) {
            R->stalled = true; /* tests: this step hangs until the coordinator moves on */
            hold_until_moved_on(R, R->epoch, 3600);
            continue;
        }
        if (can_step(R)) {
            double t0 = st_now(), loss = NAN;
            R->gate_waited = 0;
            int r = worker_engine_step(R->eng, R->done, &loss);
            if (r < 0) {
                fail_state(R); /* closing our connections makes the peers fail fast too */
                notice(R, "step-failed", FIG(.epoch = R->epoch, .step = R->done),
                       "epoch=%llu step=%llu: %s", (unsigned long long)R->epoch,
                       (unsigned long long)R->done, st_strerror(r));
                continue;
            }
            R->done++;
            R->last_loss = loss;
            R->last_step_end = st_now();
            progress(R, R->last_step_end - t0, 0.0);
            if (R->first_epoch == R->epoch) {
                /* The end of this epoch's first step ends its stall: say so at once. Its
                 * own time (the stall subtracts it where the epoch ends before three later
                 * steps are reported, coordinator/loop-stall.c) leaves out
                 * what it waited at the move's gates for state still moving: that wait is
                 * stall. A worker early at the boundary (a spare) starts its first step as
                 * soon as its migration is set up, while its peers, their handshakes done
                 * ahead, still train up to the boundary: its own time counts from their
                 * first bytes, when they got there. */
                double from = own_from(R, t0);
                struct st_notice_figures f = {
                    .epoch = R->epoch, .step = R->done,
                    .seconds = R->last_step_end - R->first_from,
                    .step_seconds = ST_MAX(0.0, R->last_step_end - from - R->gate_waited)};
                notice(R, "first-step", &f, "epoch=%llu step=%llu seconds=%.6f "
                       "step_seconds=%.6f gate_waited=%.6f heard_after=%.6f",
                       (unsigned long long)R->epoch, (unsigned long long)R->done, f.seconds,
                       f.step_seconds, R->gate_waited, from - t0);
                R->early_first = false;
                R->first_epoch = 0;
                R->first_from = 0;
                worker_agent_report_now(R->agent);
            }
            peer_copy(R);
            continue;
        }
        if ((R->pmig || R->pcfg) && !R->blocked_since)
            R->blocked_since = st_now();
        if (R->eng && !R->failed && R->done >= R->lease && R->done < (uint64_t)R->tc.total_steps &&
            R->lease != R->lease_reported) {
            R->lease_reported = R->lease; /* tell the coordinator at once we wait on it */
            worker_agent_report_now(R->agent);
        }
        int w = worker_agent_wait(R->agent, 0);
        if (w != 0) {
            if (w < 0)
                return w;
            break; /* Stop applied */
        }
        pthread_mutex_lock(&R->lock);
        if (R->nqueue == 0) {
            cond_wait_ms(&R->cond, &R->lock, 20);
        }
        pthread_mutex_unlock(&R->lock);
    }
    return 0;
}

/* See worker-runner.h. */
void worker_runner_config_init(struct worker_runner_config *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    worker_agent_config_init(&cfg->agent);
    st_spec_defaults(&cfg->spec);
}

/* See worker-runner.h. */
int worker_runner_run(const struct worker_runner_config *cfg) {
    struct runner *R = NULL;
    int r = 0;
    bool locks = false;

    if (!cfg)
        return -EINVAL;
    R = st_calloc(1, sizeof(*R));
    if (!R)
        return -ENOMEM;
    R->cfg = *cfg;
    if (R->cfg.timeout <= 0)
        R->cfg.timeout = 8;
    if (R->cfg.reconfig_timeout <= 0)
        R->cfg.reconfig_timeout = 60;
    if (R->cfg.notice_interval <= 0)
        R->cfg.notice_interval = 0.2;
    if (R->cfg.steps > 0)
        R->cfg.spec.training.steps = R->cfg.steps;
    R->last_loss = NAN;
    kern_set_threads(R->cfg.threads > 0 ? R->cfg.threads : 1);
    pthread_mutex_init(&R->lock, NULL);
    pthread_cond_init(&R->cond, NULL);
    pthread_mutex_init(&R->df.lock, NULL);
    pthread_cond_init(&R->df.cond, NULL);
    pthread_mutex_init(&R->ah.lock, NULL);
    pthread_cond_init(&R->ah.cond, NULL);
    locks = true;
    r = worker_train_config_from_spec(&R->cfg.spec, &R->tc);
    if (r < 0) {
        r = st_log_errno(r, "The job's model or batch sizes are not trainable");
        goto out;
    }
    R->nlayers = kern_num_layers(&R->tc.model);
    struct st_error terr;
    memset(&terr, 0, sizeof(terr));
    r = st_tokens_open(R->cfg.spec.data.train, R->tc.model.vocab, &R->tokens, &terr);
    if (r < 0) {
        r = st_log_errno(r, "Cannot use data '%s': %s", R->cfg.spec.data.train,
                         terr.message[0] ? terr.message : st_strerror(r));
        goto out;
    }
    r = mig_endpoint_new(R->cfg.bind_host[0] ? R->cfg.bind_host : "127.0.0.1", R->cfg.port,
                         &R->ep);
    if (r < 0) {
        r = st_log_errno(r, "Cannot listen for the data plane on '%s:%d': %s",
                         R->cfg.bind_host[0] ? R->cfg.bind_host : "127.0.0.1", R->cfg.port,
                         st_strerror(r));
        goto out;
    }
    snprintf(R->cfg.agent.data_addr, sizeof(R->cfg.agent.data_addr), "%s",
             R->cfg.advertise_addr[0] ? R->cfg.advertise_addr : mig_endpoint_addr(R->ep));
    struct worker_agent_ops ops = {on_command, R};
    TRY_GOTO(worker_agent_new(&R->cfg.agent, &ops, &R->agent), r, out);
    reserve_open(R); /* before the agent starts: the first order may follow at once */
    TRY_GOTO(worker_agent_start(R->agent), r, out);
    st_log(ST_LOG_INFO, "runner", "Worker %s: data plane %s (advertised as %s), coordinator %s",
           worker_agent_id(R->agent), mig_endpoint_addr(R->ep), R->cfg.agent.data_addr,
           R->cfg.agent.coordinator);
    r = runner_loop(R);
    if (r >= 0) {
        /* Let the Stop's ack go out before leaving (bounded). */
        double until = st_now() + 5.0;
        while (st_now() < until && worker_agent_wait(R->agent, 0.1) == 0)
            ;
    }
out:
    reserve_close();
    bg_join(R);
    peer_side_drop(R); /* before the store and the agent: it may keep and tell */
    worker__peer_store_done(&R->peers);
    if (R->agent)
        R->agent = worker_agent_free(R->agent);
    drop_state(R);
    mig_endpoint_free(R->ep);
    st_tokens_free(R->tokens);
    cmd_free(&R->pcfg);
    cmd_free(&R->pmig);
    for (size_t i = 0; i < R->nqueue; i++)
        cmd_free(&R->queue[i]);
    if (locks) {
        pthread_mutex_destroy(&R->lock);
        pthread_cond_destroy(&R->cond);
        pthread_mutex_destroy(&R->df.lock);
        pthread_cond_destroy(&R->df.cond);
        pthread_mutex_destroy(&R->ah.lock);
        pthread_cond_destroy(&R->ah.cond);
    }
    st_free(R);
    return r;
}
