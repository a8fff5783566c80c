/* state.c: the coordinator's job state machine — worker table, epochs, liveness and the
 * built-in membership policy — and the public coord_* API; the commands it sends are in
 * commands.c, the figures the loop and the job driver hand it to show in published.c.
 *
 * One idea: every mutation is "compute, journal in one transaction, then apply to memory and
 * push to streams". If the journal write fails, memory is untouched and the caller gets the
 * error; if the process dies after the commit, a restart reads the same state back and
 * redelivers whatever the workers had not acknowledged. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "coord-internal.h"

static const char *const worker_state_names[] = {"joined", "active", "spare", "lost",
                                                 "stopped"};
static const char *const job_state_names[] = {"pending", "running", "stopping", "stopped"};

const char *coord_worker_state_name(enum coord_worker_state s) {
    return (unsigned)s < ST_ARRAY_SIZE(worker_state_names) ? worker_state_names[s] : "unknown";
}

const char *coord_job_state_name(enum coord_job_state s) {
    return (unsigned)s < ST_ARRAY_SIZE(job_state_names) ? job_state_names[s] : "unknown";
}

void coord_config_init(struct coord_config *cfg) {
    memset(cfg, 0, sizeof(*cfg));
}

struct coord_wk *coord__worker_find(struct coord *c, const char *id) {
    for (size_t i = 0; i < c->nworkers; i++)
        if (strcmp(c->workers[i]->pub.id, id) == 0)
            return c->workers[i];
    return NULL;
}

double coord__deadline(const struct coord *c) {
    return c->cfg.heartbeat_deadline;
}

double coord__heartbeat_interval(const struct coord *c) {
    return coord__deadline(c) / 4.0;
}

void coord__worker_copy(const struct coord *c, const struct coord_wk *wk,
                        struct coord_worker *out) {
    (void)c;
    *out = wk->pub;
    out->last_seen_ago = st_now() - wk->last_seen;
    out->watching = wk->watch != NULL;
}

void coord__count_states(const struct coord *c, size_t counts[COORD_WORKER_NSTATES]) {
    for (size_t s = 0; s < COORD_WORKER_NSTATES; s++)
        counts[s] = 0;
    for (size_t i = 0; i < c->nworkers; i++)
        counts[c->workers[i]->pub.state]++;
}

void coord__note(struct coord *c, enum coord_note_type type, const struct coord_worker *w) {
    if (c->nnotes == c->capnotes) {
        size_t cap = c->capnotes ? c->capnotes * 2 : 16;
        struct coord_note *n = st_realloc(c->notes, cap * sizeof(*n));
        if (!n) {
            st_log(ST_LOG_WARN, "coord", "Out of memory queueing a hook call, ignoring");
            return;
        }
        c->notes = n;
        c->capnotes = cap;
    }
    struct coord_note *n = &c->notes[c->nnotes++];
    memset(n, 0, sizeof(*n));
    n->type = type;
    if (w)
        n->w = *w;
}

void coord__run_notes(struct coord *c) {
    for (;;) {
        struct coord_note n;
        pthread_mutex_lock(&c->lock);
        if (c->nnotes == 0) {
            pthread_mutex_unlock(&c->lock);
            return;
        }
        n = c->notes[0];
        memmove(c->notes, c->notes + 1, (c->nnotes - 1) * sizeof(*c->notes));
        c->nnotes--;
        pthread_mutex_unlock(&c->lock);
        const struct coord_hooks *h = &c->hooks;
        switch (n.type) {
        case COORD_NOTE_JOINED:
        case COORD_NOTE_REJOINED:
            if (h->on_worker_joined)
                h->on_worker_joined(c, &n.w, n.type == COORD_NOTE_REJOINED, h->userdata);
            break;
        case COORD_NOTE_LOST:
            if (h->on_worker_lost)
                h->on_worker_lost(c, &n.w, h->userdata);
            break;
        case COORD_NOTE_MEMBERSHIP:
            if (h->on_membership)
                h->on_membership(c, h->userdata);
            break;
        case COORD_NOTE_ACK:
            if (h->on_ack)
                h->on_ack(c, n.w.id, n.command_id, n.ok, n.error, h->userdata);
            break;
        }
    }
}

static int64_t event_v(struct coord *c, const char *kind, const char *worker_id, const char *fmt,
                       va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    int64_t seq = coord__journal_event_add(c->journal, st_wall(), kind, worker_id, msg);
    if (seq < 0)
        st_log(ST_LOG_WARN, "coord", "Could not journal event '%s': %s, ignoring", kind,
               st_strerror((int)seq));
    else
        st_log(ST_LOG_INFO, "coord", "event %lld %s%s%s: %s", (long long)seq, kind,
               worker_id ? " " : "", worker_id ? worker_id : "", msg);
    return seq;
}

int64_t coord__event_locked(struct coord *c, const char *kind, const char *worker_id,
                            const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int64_t r = event_v(c, kind, worker_id, fmt, ap);
    va_end(ap);
    return r;
}

int64_t coord_event(struct coord *c, const char *kind, const char *worker_id, const char *fmt,
                    ...) {
    if (!c || c->magic != COORD_MAGIC || !kind || !*kind || !fmt)
        return -EINVAL;
    va_list ap;
    pthread_mutex_lock(&c->lock);
    /* An event stands alone: it waits for the next commit or the tick's flush (a crash may
     * lose the last tick's events, never a command or a state change). */
    int64_t r = coord__journal_begin(c->journal);
    if (r >= 0) {
        va_start(ap, fmt);
        r = event_v(c, kind, worker_id, fmt, ap);
        va_end(ap);
        if (r >= 0 && coord__journal_commit_later(c->journal) < 0)
            r = -EIO;
        if (r < 0)
            coord__journal_rollback(c->journal);
    }
    pthread_mutex_unlock(&c->lock);
    return r;
}

/* ---- RPC effects ------------------------------------------------------------------------- */

static void mark_dirty(struct coord *c) {
    c->membership_dirty = true;
    c->membership_at = st_now();
}

int coord__apply_join(struct coord *c, const Spottrain__V1__JoinRequest *req,
                      bool *ret_rejoined) {
    struct coord_wk *wk = coord__worker_find(c, req->worker_id);
    bool rejoined = wk != NULL;
    struct coord_worker row;
    int r;

    if (!wk && c->nworkers >= COORD_MAX_WORKERS)
        return -EUSERS;
    if (wk) {
        row = wk->pub;
    } else {
        memset(&row, 0, sizeof(row));
        snprintf(row.id, sizeof(row.id), "%s", req->worker_id);
        row.state = COORD_WORKER_JOINED;
        row.stage = row.replica = -1;
        row.joined = st_wall();
        row.order = c->next_order;
    }
    snprintf(row.instance_id, sizeof(row.instance_id), "%s", req->instance_id);
    snprintf(row.zone, sizeof(row.zone), "%s", req->zone);
    snprintf(row.instance_type, sizeof(row.instance_type), "%s", req->instance_type);
    row.gpus = (int)req->gpus;
    snprintf(row.data_addr, sizeof(row.data_addr), "%s", req->data_addr);
    bool returned = false;
    if (row.state == COORD_WORKER_LOST || row.state == COORD_WORKER_STOPPED) {
        /* It comes back with no role; the policy decides again. */
        returned = true;
        row.state = COORD_WORKER_JOINED;
        row.stage = row.replica = -1;
        row.layer_begin = row.layer_end = 0;
    }
    bool changed = !wk || returned || memcmp(&row, &wk->pub, sizeof(row)) != 0;
    /* A new worker's memory is taken before the commit: once the journal holds the worker,
     * memory must too (an allocation failure after the commit left the two apart; found by
     * the proto fuzz target). */
    struct coord_wk *fresh = NULL;
    if (!wk) {
        if (c->nworkers == c->capworkers) {
            size_t cap = c->capworkers ? c->capworkers * 2 : 16;
            struct coord_wk **v = st_realloc(c->workers, cap * sizeof(*v));
            if (!v)
                return -ENOMEM;
            c->workers = v;
            c->capworkers = cap;
        }
        fresh = st_calloc(1, sizeof(*fresh));
        if (!fresh)
            return -ENOMEM;
    }
    if (changed) {
        r = coord__journal_begin(c->journal);
        if (r >= 0)
            r = coord__journal_worker_save(c->journal, &row, wk ? wk->next_command : 1);
        if (r >= 0 && coord__event_locked(c, !wk ? "worker_joined" : returned ? "worker_returned"
                                                                              : "worker_rejoined",
                                          row.id, "instance '%s' zone '%s' data '%s'",
                                          row.instance_id, row.zone, row.data_addr) < 0)
            r = -EIO;
        if (r >= 0)
            r = coord__journal_commit(c->journal);
        if (r < 0) {
            coord__journal_rollback(c->journal);
            st_free(fresh);
            return r;
        }
    }
    if (!wk) {
        wk = fresh;
        wk->next_command = 1;
        c->workers[c->nworkers++] = wk;
        c->next_order++;
    }
    wk->pub = row;
    wk->last_seen = st_now();
    if (!rejoined || returned)
        mark_dirty(c);
    struct coord_worker copy;
    coord__worker_copy(c, wk, &copy);
    coord__note(c, rejoined ? COORD_NOTE_REJOINED : COORD_NOTE_JOINED, &copy);
    *ret_rejoined = rejoined;
    return 0;
}

static void maybe_stopped(struct coord *c) {
    if (c->job.state != COORD_JOB_STOPPING)
        return;
    for (size_t k = 0; k < c->nworkers; k++)
        if (coord__worker_live(c->workers[k]->pub.state))
            return;
    struct coord_job_row job = c->job;
    job.state = COORD_JOB_STOPPED;
    if (coord__journal_begin(c->journal) < 0)
        return;
    if (coord__journal_job_save(c->journal, &job) < 0 ||
        coord__event_locked(c, "job_stopped", NULL, "every worker stopped or lost") < 0 ||
        coord__journal_commit(c->journal) < 0) {
        coord__journal_rollback(c->journal);
        return;
    }
    c->job = job;
}

int coord__apply_report(struct coord *c, const Spottrain__V1__ReportRequest *req) {
    struct coord_wk *wk = coord__worker_find(c, req->worker_id);
    int r = 0;
    if (!wk)
        return -ENOENT;
    if (wk->pub.state == COORD_WORKER_LOST || wk->pub.state == COORD_WORKER_STOPPED)
        return -ENOENT; /* must Join again to get a role */
    wk->last_seen = st_now();
    c->reports++;
    if (req->step > wk->pub.step || (req->step == wk->pub.step && req->step > 0)) {
        wk->pub.step = req->step;
        wk->pub.loss = !req->no_loss ? req->loss : 0.0;
    }
    if (req->step > c->job.step) {
        c->job.step = req->step;
        c->job_dirty = true;
    }
    /* Only a worker that computes the loss may set it (the others report none, not 0), and
     * the newest step wins whichever replica reports first. A newer epoch may restart from an
     * older step (a checkpoint restore), so its losses replace those of the epoch it ended. */
    if (!req->no_loss && req->step > 0 &&
        (req->epoch > c->loss_epoch || (req->epoch == c->loss_epoch && req->step > c->loss_step))) {
        c->loss_epoch = req->epoch;
        c->loss_step = req->step;
        c->job.loss = req->loss;
        c->job_dirty = true;
        if (req->step_seconds > 0) /* 0: not timed (a restored step); keep the last rate */
            c->samples_per_second = c->spec.training.global_batch / req->step_seconds;
        coord__history_loss(&c->history, st_wall(), req->step, req->loss,
                            c->samples_per_second);
    }
    if (req->samples > c->job.samples) {
        c->job.samples = req->samples;
        c->job_dirty = true;
    }
    c->stall_total += req->stall_seconds;

    if (req->n_acks == 0 && req->n_notices == 0)
        return 0;
    TRY(coord__journal_begin(c->journal));
    uint64_t acked = wk->pub.acked_command;
    bool stopped = false;
    size_t failed = 0;
    for (size_t i = 0; i < req->n_acks && r >= 0; i++) {
        const Spottrain__V1__CommandAck *a = req->acks[i];
        if (a->id >= wk->next_command)
            continue; /* never issued: ignore rather than trust */
        r = coord__journal_command_ack(c->journal, wk->pub.id, a->id, a->ok, a->error,
                                       st_wall());
        if (r > 0) {
            if (a->id > acked)
                acked = a->id;
            if (!a->ok) {
                failed++;
                r = coord__event_locked(c, "command_failed", wk->pub.id, "command %llu: %s",
                                        (unsigned long long)a->id, a->error) < 0 ? -EIO : 1;
            }
        }
    }
    uint64_t dp_refused = 0;
    for (size_t i = 0; i < req->n_notices && r >= 0; i++) {
        const Spottrain__V1__Notice *n = req->notices[i];
        if (coord__event_locked(c, "notice", wk->pub.id, "%s at %.0f %s", n->kind, n->at,
                                n->detail) < 0)
            r = -EIO;
        /* The event above names the refused peer's address (the detail says "peer=..."). */
        if (!strcmp(n->kind, COORD_NOTICE_DP_AUTH))
            dp_refused++;
    }
    if (r >= 0 && c->job.state == COORD_JOB_STOPPING && !strcmp(req->state, "stopped"))
        stopped = true;
    struct coord_worker row = wk->pub;
    row.acked_command = acked;
    if (stopped)
        row.state = COORD_WORKER_STOPPED;
    if (r >= 0)
        r = coord__journal_worker_save(c->journal, &row, wk->next_command);
    /* Acks and notices wait for the next commit or the tick's flush: an ack lost in a crash
     * only has its command delivered again, which the worker skips by its id, and a notice is
     * an event for people to read. A failed command or a stop is committed now. */
    bool later = !stopped && failed == 0;
    if (r >= 0)
        r = later ? coord__journal_commit_later(c->journal) : coord__journal_commit(c->journal);
    if (r < 0) {
        coord__journal_rollback(c->journal);
        return r;
    }
    c->dp_auth_failures += dp_refused; /* after the commit: counted once, as journaled */
    wk->pub.acked_command = row.acked_command;
    wk->pub.state = row.state;
    for (size_t i = 0; i < req->n_acks; i++) {
        struct coord_note *n;
        coord__note(c, COORD_NOTE_ACK, &wk->pub);
        if (c->nnotes == 0)
            break;
        n = &c->notes[c->nnotes - 1];
        n->command_id = req->acks[i]->id;
        n->ok = req->acks[i]->ok;
        snprintf(n->error, sizeof(n->error), "%s", req->acks[i]->error);
    }
    if (stopped)
        maybe_stopped(c);
    return 0;
}

/* ---- tick: liveness, policy, flush ----------------------------------------------------- */

/* The built-in policy: pp pinned or 1, dp = live / pp (bounded), workers in join order. */
static void builtin_policy(struct coord *c) {
    size_t live = 0;
    for (size_t k = 0; k < c->nworkers; k++)
        if (coord__worker_live(c->workers[k]->pub.state))
            live++;
    int layers = c->spec.model.layers > 0 ? c->spec.model.layers : 1;
    int pp = c->spec.planner.pp > 0 ? c->spec.planner.pp : 1;
    if (pp > layers)
        pp = layers;
    size_t cap = c->spec.fleet.max > 0 ? (size_t)c->spec.fleet.max : live;
    size_t usable = ST_MIN(live, cap);
    int dp = (int)(usable / (size_t)pp);
    if (c->spec.planner.dp > 0 && dp > c->spec.planner.dp)
        dp = c->spec.planner.dp;
    if (dp < 1) {
        if (!c->waiting_logged)
            coord__event_locked(c, "waiting", NULL, "%zu live worker(s), need %d for pp=%d",
                                live, pp, pp);
        c->waiting_logged = true;
        return;
    }
    size_t n = (size_t)dp * (size_t)pp;
    struct coord_assignment *a = st_calloc(n, sizeof(*a));
    if (!a)
        return;
    size_t i = 0;
    bool same = c->job.dp == dp && c->job.pp == pp && c->job.epoch > 0;
    for (size_t k = 0; k < c->nworkers && i < n; k++) {
        struct coord_wk *wk = c->workers[k];
        if (!coord__worker_live(wk->pub.state))
            continue;
        int stage = (int)(i % (size_t)pp), replica = (int)(i / (size_t)pp);
        snprintf(a[i].worker_id, sizeof(a[i].worker_id), "%s", wk->pub.id);
        a[i].stage = stage;
        a[i].replica = replica;
        a[i].layer_begin = stage * layers / pp;
        a[i].layer_end = (stage + 1) * layers / pp;
        if (wk->pub.state != COORD_WORKER_ACTIVE || wk->pub.epoch != c->job.epoch ||
            wk->pub.stage != stage || wk->pub.replica != replica)
            same = false;
        i++;
    }
    /* Someone active in the current epoch who is no longer in it also means a change. */
    for (size_t k = 0; k < c->nworkers && same; k++) {
        struct coord_wk *wk = c->workers[k];
        bool in = false;
        for (size_t x = 0; x < n && !in; x++)
            in = strcmp(a[x].worker_id, wk->pub.id) == 0;
        if (!in && wk->pub.state == COORD_WORKER_ACTIVE)
            same = false;
        if (!in && wk->pub.state == COORD_WORKER_LOST && wk->pub.epoch == c->job.epoch &&
            wk->pub.stage >= 0)
            same = false;
    }
    if (!same) {
        int r = coord__configure_locked(c, dp, pp, a, n, "tcp", NULL, c->job.step,
                                        "membership changed", NULL);
        if (r < 0)
            st_log(ST_LOG_WARN, "coord", "Re-configuring after a membership change failed: %s,"
                   " retrying at the next tick", st_strerror(r));
        else
            c->membership_dirty = false;
    } else {
        /* Same epoch; newcomers that do not fit are spares. */
        bool ok = coord__journal_begin(c->journal) >= 0;
        for (size_t k = 0; k < c->nworkers && ok; k++) {
            struct coord_wk *wk = c->workers[k];
            if (wk->pub.state != COORD_WORKER_JOINED)
                continue;
            struct coord_worker row = wk->pub;
            row.state = COORD_WORKER_SPARE;
            ok = coord__journal_worker_save(c->journal, &row, wk->next_command) >= 0;
        }
        if (ok && coord__journal_commit(c->journal) >= 0) {
            for (size_t k = 0; k < c->nworkers; k++)
                if (c->workers[k]->pub.state == COORD_WORKER_JOINED)
                    c->workers[k]->pub.state = COORD_WORKER_SPARE;
            c->membership_dirty = false;
        } else {
            coord__journal_rollback(c->journal);
        }
    }
    st_free(a);
}

void coord__tick(struct coord *c, double now) {
    double deadline = coord__deadline(c);
    /* While a commit waits for the disk the lock is held and no Report is heard: that silence
     * is the coordinator's, not the workers'. Each worker's clock moves on by it, so a disk
     * that stalls for seconds (a loaded machine's, a throttled cloud volume) does not get
     * live workers declared lost. */
    double waited = coord__journal_waited(c->journal), deaf = waited - c->deaf_counted;
    c->deaf_counted = waited;
    if (deaf > 0)
        for (size_t k = 0; k < c->nworkers; k++)
            c->workers[k]->last_seen = ST_MIN(now, c->workers[k]->last_seen + deaf);
    for (size_t k = 0; k < c->nworkers; k++) {
        struct coord_wk *wk = c->workers[k];
        if (!coord__worker_live(wk->pub.state) || now - wk->last_seen <= deadline)
            continue;
        struct coord_worker row = wk->pub;
        row.state = COORD_WORKER_LOST;
        if (coord__journal_begin(c->journal) < 0)
            continue;
        if (coord__journal_worker_save(c->journal, &row, wk->next_command) < 0 ||
            coord__event_locked(c, "worker_lost", row.id, "silent for %.1f s (deadline %.1f s)",
                                now - wk->last_seen, deadline) < 0 ||
            coord__journal_commit(c->journal) < 0) {
            coord__journal_rollback(c->journal);
            continue;
        }
        wk->pub.state = COORD_WORKER_LOST;
        if (wk->watch)
            coord__watch_end(c, wk->watch, GRPC_STATUS_UNAVAILABLE, "declared lost");
        struct coord_worker copy;
        coord__worker_copy(c, wk, &copy);
        coord__note(c, COORD_NOTE_LOST, &copy);
        mark_dirty(c);
    }
    maybe_stopped(c);
    if (c->membership_dirty && now - c->membership_at >= c->cfg.settle &&
        coord__job_accepts_commands(c)) {
        if (c->hooks.on_membership) {
            c->membership_dirty = false;
            coord__note(c, COORD_NOTE_MEMBERSHIP, NULL);
        } else {
            builtin_policy(c);
        }
    }
    if (c->job_dirty && now - c->last_flush >= 1.0) {
        /* Progress (step, loss): committed by the flush below, with the tick's acks. */
        if (coord__journal_begin(c->journal) >= 0) {
            if (coord__journal_job_save(c->journal, &c->job) >= 0 &&
                coord__journal_commit_later(c->journal) >= 0)
                c->job_dirty = false;
            else
                coord__journal_rollback(c->journal);
        }
        c->last_flush = now;
    }
    /* The acks of the last tick (and anything written since), durable in one commit. */
    (void)coord__journal_flush(c->journal, 0);
}

/* ---- lifecycle -------------------------------------------------------------------------- */

static int load_worker(const struct coord_worker *w, uint64_t next_command, void *userdata) {
    struct coord *c = userdata;
    if (c->nworkers == c->capworkers) {
        size_t cap = c->capworkers ? c->capworkers * 2 : 16;
        struct coord_wk **v = st_realloc(c->workers, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        c->workers = v;
        c->capworkers = cap;
    }
    struct coord_wk *wk = st_calloc(1, sizeof(*wk));
    if (!wk)
        return -ENOMEM;
    wk->pub = *w;
    wk->next_command = next_command ? next_command : 1;
    /* A restart is not the workers' fault: they get a full deadline to come back (counted
     * again from coord_start(), when they can first reach us). */
    wk->last_seen = st_now();
    c->workers[c->nworkers++] = wk;
    if (w->order >= c->next_order)
        c->next_order = w->order + 1;
    return 0;
}

int coord_new(const struct coord_config *cfg, const struct coord_hooks *hooks,
              struct coord **ret_c) {
    struct coord *c = NULL;
    int r;

    if (!cfg || !cfg->spec || !ret_c || !cfg->state_dir[0])
        return -EINVAL;
    c = st_calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->magic = COORD_MAGIC;
    c->cfg = *cfg;
    c->spec = *cfg->spec;
    c->cfg.spec = &c->spec;
    if (hooks)
        c->hooks = *hooks;
    pthread_mutex_init(&c->lock, NULL);
    coord__history_init(&c->history);
    if (!c->cfg.listen[0])
        snprintf(c->cfg.listen, sizeof(c->cfg.listen), "%s", c->spec.coordinator.listen);
    if (!c->cfg.status_listen[0])
        snprintf(c->cfg.status_listen, sizeof(c->cfg.status_listen), "%s",
                 c->spec.status.listen[0] ? c->spec.status.listen : "-");
    if (c->cfg.heartbeat_deadline <= 0)
        c->cfg.heartbeat_deadline = c->spec.coordinator.heartbeat_deadline > 0
                                        ? c->spec.coordinator.heartbeat_deadline
                                        : 30.0;
    if (c->cfg.settle <= 0)
        c->cfg.settle = ST_MIN(1.0, c->cfg.heartbeat_deadline / 4.0);
    if (c->cfg.tick <= 0)
        c->cfg.tick = 0.25;
    if (c->cfg.max_message == 0)
        c->cfg.max_message = COORD_MAX_MESSAGE_DEFAULT;
    if (coord__parse_hostport(c->cfg.listen, NULL, COORD_ADDR_MAX, NULL) < 0) {
        r = st_log_errno(-EINVAL, "Bad gRPC listen address '%s' (want HOST:PORT)",
                         c->cfg.listen);
        goto out;
    }
    if (strcmp(c->cfg.status_listen, "-") != 0 &&
        coord__parse_hostport(c->cfg.status_listen, NULL, COORD_ADDR_MAX, NULL) < 0) {
        r = st_log_errno(-EINVAL, "Bad status listen address '%s' (want HOST:PORT)",
                         c->cfg.status_listen);
        goto out;
    }
    TRY_GOTO(coord__tls_load(c), r, out);
    if (c->cfg.events_keep <= 0)
        c->cfg.events_keep = c->spec.coordinator.events_keep > 0
                                 ? c->spec.coordinator.events_keep
                                 : COORD_EVENTS_KEEP_DEFAULT;
    TRY_GOTO(coord__journal_open(c->cfg.state_dir, &c->journal), r, out);
    coord__journal_events_keep(c->journal, c->cfg.events_keep);
    r = coord__journal_job_load(c->journal, &c->job);
    if (r == -ENOENT) {
        memset(&c->job, 0, sizeof(c->job));
        st_uuid_new(c->job.id);
        TRY_GOTO(coord__dp_key_load(c), r, out);
        snprintf(c->job.name, sizeof(c->job.name), "%s", c->spec.name);
        c->job.state = COORD_JOB_PENDING;
        c->job.created = st_wall();
        TRY_GOTO(coord__journal_begin(c->journal), r, out);
        r = coord__journal_job_save(c->journal, &c->job);
        if (r >= 0 && coord__event_locked(c, "job_created", NULL, "job '%s' id %s",
                                          c->job.name, c->job.id) < 0)
            r = -EIO;
        if (r >= 0)
            r = coord__journal_commit(c->journal);
        if (r < 0) {
            coord__journal_rollback(c->journal);
            goto out;
        }
    } else if (r < 0) {
        goto out;
    } else {
        if (strcmp(c->job.name, c->spec.name) != 0) {
            r = st_log_errno(-EEXIST,
                             "State directory '%s' holds job '%s', the spec is job '%s' "
                             "(hint: use another --state-dir)",
                             c->cfg.state_dir, c->job.name, c->spec.name);
            goto out;
        }
        TRY_GOTO(coord__journal_workers_load(c->journal, load_worker, c), r, out);
        TRY_GOTO(coord__dp_key_load(c), r, out);
        coord__event_locked(c, "job_resumed", NULL, "epoch %llu, %zu worker(s) known",
                            (unsigned long long)c->job.epoch, c->nworkers);
        if (c->job.epoch > 0)
            coord__history_shape(&c->history, st_wall(), c->job.epoch, c->job.dp, c->job.pp,
                                 c->job.step);
    }
    c->last_tick = c->last_flush = st_now();
    *ret_c = c;
    return 0;
out:
    coord_free(c);
    return r;
}

int coord_start(struct coord *c) {
    int r;
    if (!c || c->magic != COORD_MAGIC || c->cq_started)
        return -EINVAL;
    TRY(coord__grpc_start(c));
    /* The workers a restart loaded from the journal get their full deadline from now, when
     * they can first reach us: a slow start (a big journal, a loaded machine, the job
     * driver's set-up between coord_new and here) must not eat into it. */
    pthread_mutex_lock(&c->lock);
    double now = st_now();
    for (size_t k = 0; k < c->nworkers; k++)
        c->workers[k]->last_seen = ST_MAX(c->workers[k]->last_seen, now);
    pthread_mutex_unlock(&c->lock);
    r = coord__rest_start(c);
    if (r < 0) {
        coord__grpc_stop(c);
        return r;
    }
    return 0;
}

const char *coord_grpc_addr(const struct coord *c) {
    return c ? c->grpc_addr : "";
}

const char *coord_rest_addr(const struct coord *c) {
    return c ? c->rest_addr : "";
}

void coord_shutdown(struct coord *c) {
    if (!c || c->magic != COORD_MAGIC || c->shut)
        return;
    coord__rest_stop(c);
    coord__grpc_stop(c);
    pthread_mutex_lock(&c->lock);
    if (c->journal && c->job_dirty && coord__journal_job_save(c->journal, &c->job) >= 0)
        c->job_dirty = false;
    pthread_mutex_unlock(&c->lock);
    c->shut = true;
}

struct coord *coord_free(struct coord *c) {
    if (!c)
        return NULL;
    coord_shutdown(c);
    for (size_t k = 0; k < c->nworkers; k++)
        st_free(c->workers[k]);
    st_free(c->workers);
    st_free(c->notes);
    st_free(c->plan_detail);
    coord__tls_free(c);
    coord__dp_key_free(c);
    coord__journal_close(c->journal);
    pthread_mutex_destroy(&c->lock);
    c->magic = 0;
    st_free(c);
    return NULL;
}

int coord_workers_get(struct coord *c, struct coord_worker **ret_workers, size_t *ret_n) {
    if (!c || c->magic != COORD_MAGIC || !ret_workers || !ret_n)
        return -EINVAL;
    pthread_mutex_lock(&c->lock);
    struct coord_worker *v = st_calloc(c->nworkers + 1, sizeof(*v));
    if (!v) {
        pthread_mutex_unlock(&c->lock);
        return -ENOMEM;
    }
    for (size_t k = 0; k < c->nworkers; k++)
        coord__worker_copy(c, c->workers[k], &v[k]);
    *ret_n = c->nworkers;
    pthread_mutex_unlock(&c->lock);
    *ret_workers = v;
    return 0;
}

void coord_job_get(struct coord *c, char ret_job_id[ST_UUID_STR_LEN], uint64_t *ret_epoch,
                   int *ret_dp, int *ret_pp, enum coord_job_state *ret_state,
                   uint64_t *ret_step) {
    if (!c || c->magic != COORD_MAGIC)
        return;
    pthread_mutex_lock(&c->lock);
    if (ret_job_id)
        memcpy(ret_job_id, c->job.id, ST_UUID_STR_LEN);
    if (ret_epoch)
        *ret_epoch = c->job.epoch;
    if (ret_dp)
        *ret_dp = c->job.dp;
    if (ret_pp)
        *ret_pp = c->job.pp;
    if (ret_state)
        *ret_state = c->job.state;
    if (ret_step)
        *ret_step = c->job.step;
    pthread_mutex_unlock(&c->lock);
}
