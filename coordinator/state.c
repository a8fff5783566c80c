/* state.c: the coordinator's job state machine — worker table, epochs, commands, liveness and
 * the built-in membership policy — and the public coord_* API.
 *
 * One idea: every mutation is "compute, journal in one transaction, then apply to memory and
 * push to streams". If the journal write fails, memory is untouched and the caller gets the
 * error; if the process dies after the commit, a restart reads the same state back and
 * redelivers whatever the workers had not acknowledged. */
#include <inttypes.h>
#include <math.h>
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

static bool is_live(enum coord_worker_state s) {
    return s == COORD_WORKER_JOINED || s == COORD_WORKER_ACTIVE || s == COORD_WORKER_SPARE;
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

/* ---- commands --------------------------------------------------------------------------- */

struct outbox {
    struct coord_outgoing *v;
    size_t n, cap;
};

static void outbox_done(struct outbox *o) {
    for (size_t i = 0; i < o->n; i++)
        coord__dp_free_packed(o->v[i].data, o->v[i].len);
    st_free(o->v);
    memset(o, 0, sizeof(*o));
}

/* Packs cmd (id and epoch set by the caller), journals it and keeps the bytes for delivery
 * after the commit. The journal gets it without the data-plane secret; the bytes delivered
 * carry it (dp-secret.c). */
static int issue(struct coord *c, struct coord_wk *wk, const char *kind,
                 Spottrain__V1__Command *cmd, struct outbox *o) {
    void *body = NULL, *data = NULL;
    size_t blen = 0, len = 0;
    int r = 0;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 8;
        struct coord_outgoing *v = st_realloc(o->v, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        o->v = v;
        o->cap = cap;
    }
    TRY_GOTO(coord__dp_pack(c, cmd, false, &body, &blen), r, out);
    TRY_GOTO(coord__dp_pack(c, cmd, true, &data, &len), r, out);
    TRY_GOTO(coord__journal_command_add(c->journal, wk->pub.id, cmd->id, cmd->epoch, kind, body,
                                        blen, st_wall()), r, out);
    o->v[o->n++] = (struct coord_outgoing){.wk = wk, .data = data, .len = len};
    data = NULL;
out:
    st_free(body);
    coord__dp_free_packed(data, len);
    return r;
}

/* After a commit: push each command on its worker's stream (if one is open). */
static void outbox_deliver(struct coord *c, struct outbox *o) {
    for (size_t i = 0; i < o->n; i++) {
        struct coord_wk *wk = o->v[i].wk;
        c->commands_sent++;
        if (wk->watch)
            (void)coord__watch_push(c, wk->watch, o->v[i].data, o->v[i].len);
    }
}

struct fill_ctx {
    struct coord *c;
    struct coord_watch *w;
};

/* A redelivery: the journaled body gets its epoch's secret back on the way out. */
static int fill_one(const struct coord_command_row *row, void *userdata) {
    struct fill_ctx *f = userdata;
    void *data = NULL;
    size_t len = 0;
    TRY(coord__dp_repack(f->c, row->body, row->len, &data, &len));
    int r = coord__watch_push(f->c, f->w, data, len);
    coord__dp_free_packed(data, len);
    return r;
}

int coord__watch_fill(struct coord *c, struct coord_wk *wk, struct coord_watch *w) {
    struct fill_ctx f = {c, w};
    return coord__journal_commands_redeliver(c->journal, wk->pub.id, fill_one, &f);
}

static bool job_accepts_commands(const struct coord *c) {
    return c->job.state == COORD_JOB_PENDING || c->job.state == COORD_JOB_RUNNING;
}

static int configure_locked(struct coord *c, int dp, int pp, const struct coord_assignment *a,
                            size_t n, const char *rendezvous,
                            const struct coord_epoch_setup *setup, uint64_t start_step,
                            const char *reason, uint64_t *ret_epoch) {
    uint32_t split[COORD_MAX_STAGES + 1];
    struct outbox o = {0};
    struct coord_wk **wks = NULL;
    Spottrain__V1__Peer *peers = NULL;
    Spottrain__V1__Peer **peerp = NULL;
    int r = 0;
    bool in_tx = false;

    if (dp < 1 || pp < 1 || (size_t)dp * (size_t)pp != n || n > COORD_MAX_PEERS || !a)
        return -EINVAL;
    if (!job_accepts_commands(c))
        return -ESHUTDOWN;
    wks = st_calloc(n, sizeof(*wks));
    peers = st_calloc(n, sizeof(*peers));
    peerp = st_calloc(n, sizeof(*peerp));
    if (!wks || !peers || !peerp) {
        r = -ENOMEM;
        goto out;
    }
    /* Validate everything before touching anything. */
    for (size_t i = 0; i < n; i++) {
        wks[i] = coord__worker_find(c, a[i].worker_id);
        if (!wks[i] || !is_live(wks[i]->pub.state) || a[i].stage < 0 || a[i].stage >= pp ||
            a[i].replica < 0 || a[i].replica >= dp || a[i].layer_begin < 0 ||
            a[i].layer_end <= a[i].layer_begin) {
            r = -EINVAL;
            goto out;
        }
        for (size_t k = 0; k < i; k++)
            if (wks[k] == wks[i] ||
                (a[k].stage == a[i].stage && a[k].replica == a[i].replica)) {
                r = -EINVAL;
                goto out;
            }
        spottrain__v1__peer__init(&peers[i]);
        peers[i].worker_id = (char *)wks[i]->pub.id;
        peers[i].data_addr = wks[i]->pub.data_addr;
        peers[i].stage = (uint32_t)a[i].stage;
        peers[i].replica = (uint32_t)a[i].replica;
        peers[i].zone = wks[i]->pub.zone;
        peerp[i] = &peers[i];
    }
    uint64_t epoch = c->job.epoch + 1;
    TRY_GOTO(coord__journal_begin(c->journal), r, out);
    in_tx = true;
    Spottrain__V1__Shape shape = SPOTTRAIN__V1__SHAPE__INIT;
    shape.dp = (uint32_t)dp;
    shape.pp = (uint32_t)pp;
    for (size_t i = 0; i < n; i++) {
        Spottrain__V1__Configure cf = SPOTTRAIN__V1__CONFIGURE__INIT;
        cf.shape = &shape;
        cf.stage = (uint32_t)a[i].stage;
        cf.replica = (uint32_t)a[i].replica;
        cf.layer_begin = (uint32_t)a[i].layer_begin;
        cf.layer_end = (uint32_t)a[i].layer_end;
        cf.n_peers = n;
        cf.peers = peerp;
        cf.rendezvous = (char *)(rendezvous ? rendezvous : "tcp");
        cf.start_step = start_step;
        if (setup) {
            cf.mode = (Spottrain__V1__ReconfigureMode)setup->mode;
            for (int k = 0; k <= pp; k++)
                split[k] = (uint32_t)setup->split[k];
            cf.n_split = (size_t)pp + 1;
            cf.split = split;
            cf.restore_dir = (char *)(setup->mode == COORD_RECONF_RESTORE ? setup->dir : "");
        }
        Spottrain__V1__Command cmd = SPOTTRAIN__V1__COMMAND__INIT;
        cmd.id = wks[i]->next_command;
        cmd.epoch = epoch;
        cmd.body_case = SPOTTRAIN__V1__COMMAND__BODY_CONFIGURE;
        cmd.configure = &cf;
        TRY_GOTO(issue(c, wks[i], "configure", &cmd, &o), r, out);
        struct coord_worker row = wks[i]->pub;
        row.state = COORD_WORKER_ACTIVE;
        row.epoch = epoch;
        row.stage = a[i].stage;
        row.replica = a[i].replica;
        row.layer_begin = a[i].layer_begin;
        row.layer_end = a[i].layer_end;
        TRY_GOTO(coord__journal_worker_save(c->journal, &row, cmd.id + 1), r, out);
    }
    /* Live workers left out become spares. */
    for (size_t k = 0; k < c->nworkers; k++) {
        struct coord_wk *wk = c->workers[k];
        bool assigned = false;
        for (size_t i = 0; i < n && !assigned; i++)
            assigned = wks[i] == wk;
        if (assigned || !is_live(wk->pub.state) || wk->pub.state == COORD_WORKER_SPARE)
            continue;
        struct coord_worker row = wk->pub;
        row.state = COORD_WORKER_SPARE;
        row.stage = row.replica = -1;
        row.layer_begin = row.layer_end = 0;
        TRY_GOTO(coord__journal_worker_save(c->journal, &row, wk->next_command), r, out);
    }
    struct coord_job_row job = c->job;
    job.epoch = epoch;
    job.dp = dp;
    job.pp = pp;
    job.state = COORD_JOB_RUNNING;
    TRY_GOTO(coord__journal_job_save(c->journal, &job), r, out);
    TRY_GOTO(coord__journal_epoch_add(c->journal, epoch, dp, pp, reason, st_wall()), r, out);
    if (coord__event_locked(c, "epoch", NULL, "epoch %llu: dp=%d pp=%d (%s)",
                            (unsigned long long)epoch, dp, pp, reason ? reason : "") < 0) {
        r = -EIO;
        goto out;
    }
    TRY_GOTO(coord__journal_commit(c->journal), r, out);
    in_tx = false;

    /* Committed: apply to memory, then deliver. */
    c->job = job;
    coord__history_shape(&c->history, st_wall(), epoch, dp, pp, start_step);
    for (size_t i = 0; i < n; i++) {
        struct coord_worker *p = &wks[i]->pub;
        p->state = COORD_WORKER_ACTIVE;
        p->epoch = epoch;
        p->stage = a[i].stage;
        p->replica = a[i].replica;
        p->layer_begin = a[i].layer_begin;
        p->layer_end = a[i].layer_end;
        wks[i]->next_command++;
    }
    for (size_t k = 0; k < c->nworkers; k++) {
        struct coord_wk *wk = c->workers[k];
        bool assigned = false;
        for (size_t i = 0; i < n && !assigned; i++)
            assigned = wks[i] == wk;
        if (!assigned && is_live(wk->pub.state)) {
            wk->pub.state = COORD_WORKER_SPARE;
            wk->pub.stage = wk->pub.replica = -1;
            wk->pub.layer_begin = wk->pub.layer_end = 0;
        }
    }
    c->waiting_logged = false;
    outbox_deliver(c, &o);
    if (ret_epoch)
        *ret_epoch = epoch;
out:
    if (in_tx)
        coord__journal_rollback(c->journal);
    outbox_done(&o);
    st_free(wks);
    st_free(peers);
    st_free(peerp);
    return r;
}

int coord_configure(struct coord *c, int dp, int pp, const struct coord_assignment *assign,
                    size_t n, const char *rendezvous, uint64_t start_step, const char *reason,
                    uint64_t *ret_epoch) {
    if (!c || c->magic != COORD_MAGIC)
        return -EINVAL;
    if (rendezvous && strlen(rendezvous) > 4096)
        return -EINVAL;
    pthread_mutex_lock(&c->lock);
    int r = configure_locked(c, dp, pp, assign, n, rendezvous, NULL, start_step, reason,
                             ret_epoch);
    pthread_mutex_unlock(&c->lock);
    return r;
}

static const char *reconf_mode_name(enum coord_reconf_mode m) {
    switch (m) {
    case COORD_RECONF_INIT: return "init";
    case COORD_RECONF_RESTORE: return "restore";
    case COORD_RECONF_MIGRATE: return "migrate";
    case COORD_RECONF_PEER_RESTORE: return "peer-restore";
    }
    return NULL;
}

int coord_configure_epoch(struct coord *c, int dp, int pp, const struct coord_assignment *assign,
                          size_t n, const struct coord_epoch_setup *setup, uint64_t start_step,
                          const char *reason, uint64_t *ret_epoch) {
    if (!c || c->magic != COORD_MAGIC || !setup || !reconf_mode_name(setup->mode) || pp < 1 ||
        pp > COORD_MAX_STAGES || setup->split[0] != 0 || memchr(setup->dir, 0,
                                                                 sizeof(setup->dir)) == NULL)
        return -EINVAL;
    for (int k = 1; k <= pp; k++)
        if (setup->split[k] <= setup->split[k - 1])
            return -EINVAL;
    /* The same for workers of the previous release, which read only the string. */
    char *rdv = st_malloc(8192);
    if (!rdv)
        return -ENOMEM;
    size_t k = (size_t)snprintf(rdv, 8192, "tcp;mode=%s;split=", reconf_mode_name(setup->mode));
    for (int sgi = 0; sgi <= pp && k < 8192; sgi++)
        k += (size_t)snprintf(rdv + k, 8192 - k, "%s%d", sgi ? "," : "", setup->split[sgi]);
    if (setup->mode == COORD_RECONF_RESTORE && k < 8192)
        k += (size_t)snprintf(rdv + k, 8192 - k, ";dir=%s", setup->dir);
    int r = -EINVAL;
    if (k < 4096) {
        pthread_mutex_lock(&c->lock);
        r = configure_locked(c, dp, pp, assign, n, rdv, setup, start_step, reason, ret_epoch);
        pthread_mutex_unlock(&c->lock);
    }
    st_free(rdv);
    return r;
}

/* Journals Migrate mg as wk's next command (inside the caller's transaction) and keeps it
 * for delivery after the commit; the caller bumps wk->next_command once committed. */
static int issue_migrate(struct coord *c, struct coord_wk *wk, Spottrain__V1__Migrate *mg,
                         struct outbox *o) {
    Spottrain__V1__Command cmd = SPOTTRAIN__V1__COMMAND__INIT;
    cmd.id = wk->next_command;
    cmd.epoch = c->job.epoch;
    cmd.body_case = SPOTTRAIN__V1__COMMAND__BODY_MIGRATE;
    cmd.migrate = mg;
    TRY(issue(c, wk, "migrate", &cmd, o));
    return coord__journal_worker_save(c->journal, &wk->pub, cmd.id + 1);
}

int coord_migrate(struct coord *c, const char *worker_id, const struct coord_transfer *t,
                  size_t n, uint64_t at_step, uint64_t *ret_command_id) {
    return coord_migrate_peers(c, worker_id, t, n, at_step, NULL, 0, 0, 0, ret_command_id);
}

/* See coordinator.h. */
int coord_migrate_peers(struct coord *c, const char *worker_id, const struct coord_transfer *t,
                        size_t n, uint64_t at_step, const struct coord_peer *peers,
                        size_t npeers, uint64_t copy_epoch, uint64_t first_lease,
                        uint64_t *ret_command_id) {
    struct outbox o = {0};
    Spottrain__V1__Transfer *tr = NULL;
    Spottrain__V1__Transfer **trp = NULL;
    Spottrain__V1__Peer *pv = NULL;
    Spottrain__V1__Peer **pp = NULL;
    int r = 0;
    bool in_tx = false;

    if (!c || c->magic != COORD_MAGIC || !worker_id || (n > 0 && !t) || n > COORD_MAX_TRANSFERS ||
        (npeers > 0 && !peers) || npeers > COORD_MAX_PEERS ||
        (first_lease && first_lease <= at_step))
        return -EINVAL;
    pthread_mutex_lock(&c->lock);
    struct coord_wk *wk = coord__worker_find(c, worker_id);
    if (!wk) {
        r = -ENOENT;
        goto out;
    }
    if (!job_accepts_commands(c)) {
        r = -ESHUTDOWN;
        goto out;
    }
    tr = st_calloc(n + 1, sizeof(*tr));
    trp = st_calloc(n + 1, sizeof(*trp));
    pv = st_calloc(npeers + 1, sizeof(*pv));
    pp = st_calloc(npeers + 1, sizeof(*pp));
    if (!tr || !trp || !pv || !pp) {
        r = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (!coord__worker_find(c, t[i].src_worker_id) ||
            !coord__worker_find(c, t[i].dst_worker_id) || t[i].count == 0 || t[i].layer < 0 ||
            (unsigned)t[i].kind >= ST_STATE_NKINDS) {
            r = -EINVAL;
            goto out;
        }
        spottrain__v1__transfer__init(&tr[i]);
        tr[i].src_worker_id = (char *)t[i].src_worker_id;
        tr[i].dst_worker_id = (char *)t[i].dst_worker_id;
        tr[i].layer = (uint32_t)t[i].layer;
        tr[i].kind = (Spottrain__V1__StateKind)t[i].kind;
        tr[i].offset = t[i].offset;
        tr[i].count = t[i].count;
        tr[i].from_peer_copy = t[i].from_copy;
        trp[i] = &tr[i];
    }
    /* The migration's communicator: addresses from the table (the worker's last Join). */
    for (size_t i = 0; i < npeers; i++) {
        struct coord_wk *pw = coord__worker_find(c, peers[i].worker_id);
        if (!pw || !pw->pub.data_addr[0] || peers[i].stage < -1 || peers[i].replica < -1) {
            r = -EINVAL;
            goto out;
        }
        for (size_t k = 0; k < i; k++)
            if (!strcmp(peers[k].worker_id, peers[i].worker_id)) {
                r = -EINVAL;
                goto out;
            }
        spottrain__v1__peer__init(&pv[i]);
        pv[i].worker_id = pw->pub.id;
        pv[i].data_addr = pw->pub.data_addr;
        pv[i].stage = (uint32_t)peers[i].stage;     /* -1 (send only) becomes 0xffffffff */
        pv[i].replica = (uint32_t)peers[i].replica;
        pp[i] = &pv[i];
    }
    Spottrain__V1__Migrate mg = SPOTTRAIN__V1__MIGRATE__INIT;
    mg.n_transfers = n;
    mg.transfers = trp;
    mg.at_step = at_step;
    mg.n_peers = npeers;
    mg.peers = pp;
    mg.peer_copy_epoch = copy_epoch;
    mg.lease = first_lease;
    uint64_t id = wk->next_command;
    TRY_GOTO(coord__journal_begin(c->journal), r, out);
    in_tx = true;
    TRY_GOTO(issue_migrate(c, wk, &mg, &o), r, out);
    TRY_GOTO(coord__journal_commit(c->journal), r, out);
    in_tx = false;
    wk->next_command++;
    outbox_deliver(c, &o);
    if (ret_command_id)
        *ret_command_id = id;
out:
    if (in_tx)
        coord__journal_rollback(c->journal);
    pthread_mutex_unlock(&c->lock);
    outbox_done(&o);
    st_free(tr);
    st_free(trp);
    st_free(pv);
    st_free(pp);
    return r;
}

/* See coordinator.h. The loop grants every positioned worker a lease several times a second;
 * one transaction for all of them keeps the journal's fsyncs (and the lock REST waits on) to
 * one per grant. */
int coord_grant_lease(struct coord *c, const char *const *ids, size_t n, uint64_t at_step) {
    struct outbox o = {0};
    struct coord_wk **sent = NULL;
    size_t nsent = 0;
    int r = 0;
    bool in_tx = false;
    if (!c || c->magic != COORD_MAGIC || (n > 0 && !ids))
        return -EINVAL;
    if (n == 0)
        return 0;
    sent = st_calloc(n, sizeof(*sent));
    if (!sent)
        return -ENOMEM;
    pthread_mutex_lock(&c->lock);
    if (!job_accepts_commands(c)) {
        r = -ESHUTDOWN;
        goto out;
    }
    TRY_GOTO(coord__journal_begin(c->journal), r, out);
    in_tx = true;
    for (size_t i = 0; i < n; i++) {
        struct coord_wk *wk = ids[i] ? coord__worker_find(c, ids[i]) : NULL;
        bool dup = false;
        for (size_t k = 0; k < nsent && !dup; k++)
            dup = sent[k] == wk;
        if (!wk || dup)
            continue;
        Spottrain__V1__Migrate mg = SPOTTRAIN__V1__MIGRATE__INIT;
        mg.at_step = at_step;
        TRY_GOTO(issue_migrate(c, wk, &mg, &o), r, out);
        sent[nsent++] = wk;
    }
    TRY_GOTO(coord__journal_commit(c->journal), r, out);
    in_tx = false;
    for (size_t k = 0; k < nsent; k++)
        sent[k]->next_command++;
    outbox_deliver(c, &o);
    r = (int)nsent;
out:
    if (in_tx)
        coord__journal_rollback(c->journal);
    pthread_mutex_unlock(&c->lock);
    outbox_done(&o);
    st_free(sent);
    return r;
}

/* Sends one command body kind to every worker matching `want`; journaled in one transaction. */
static int broadcast_locked(struct coord *c, bool only_active, const char *kind,
                            Spottrain__V1__Command *proto, struct outbox *o) {
    int count = 0;
    for (size_t k = 0; k < c->nworkers; k++) {
        struct coord_wk *wk = c->workers[k];
        if (only_active ? wk->pub.state != COORD_WORKER_ACTIVE : !is_live(wk->pub.state))
            continue;
        proto->id = wk->next_command;
        proto->epoch = c->job.epoch;
        TRY(issue(c, wk, kind, proto, o));
        TRY(coord__journal_worker_save(c->journal, &wk->pub, proto->id + 1));
        count++;
    }
    return count;
}

static void bump_next_ids(struct coord *c, struct outbox *o) {
    for (size_t i = 0; i < o->n; i++)
        o->v[i].wk->next_command++;
}

int coord_checkpoint(struct coord *c, const char *dir, uint64_t at_step) {
    struct outbox o = {0};
    int r;
    if (!c || c->magic != COORD_MAGIC || !dir || strlen(dir) >= ST_SPEC_PATH_MAX)
        return -EINVAL;
    pthread_mutex_lock(&c->lock);
    if (!job_accepts_commands(c)) {
        r = -ESHUTDOWN;
        goto out;
    }
    Spottrain__V1__Checkpoint ck = SPOTTRAIN__V1__CHECKPOINT__INIT;
    ck.dir = (char *)dir;
    ck.at_step = at_step;
    Spottrain__V1__Command cmd = SPOTTRAIN__V1__COMMAND__INIT;
    cmd.body_case = SPOTTRAIN__V1__COMMAND__BODY_CHECKPOINT;
    cmd.checkpoint = &ck;
    TRY_GOTO(coord__journal_begin(c->journal), r, out);
    r = broadcast_locked(c, true, "checkpoint", &cmd, &o);
    if (r >= 0) {
        int rc = coord__journal_commit(c->journal);
        if (rc < 0)
            r = rc;
    }
    if (r < 0) {
        coord__journal_rollback(c->journal);
        goto out;
    }
    bump_next_ids(c, &o);
    outbox_deliver(c, &o);
out:
    pthread_mutex_unlock(&c->lock);
    outbox_done(&o);
    return r;
}

static int stop_locked(struct coord *c, const char *reason) {
    struct outbox o = {0};
    int r;
    if (c->job.state == COORD_JOB_STOPPING || c->job.state == COORD_JOB_STOPPED)
        return 0;
    Spottrain__V1__Stop sp = SPOTTRAIN__V1__STOP__INIT;
    sp.reason = (char *)(reason ? reason : "stopped");
    Spottrain__V1__Command cmd = SPOTTRAIN__V1__COMMAND__INIT;
    cmd.body_case = SPOTTRAIN__V1__COMMAND__BODY_STOP;
    cmd.stop = &sp;
    struct coord_job_row job = c->job;
    TRY(coord__journal_begin(c->journal));
    r = broadcast_locked(c, false, "stop", &cmd, &o);
    if (r >= 0) {
        job.state = r > 0 ? COORD_JOB_STOPPING : COORD_JOB_STOPPED;
        int rc = coord__journal_job_save(c->journal, &job);
        if (rc >= 0 && coord__event_locked(c, job.state == COORD_JOB_STOPPED ? "job_stopped"
                                                                            : "job_stopping",
                                           NULL, "%s", sp.reason) < 0)
            rc = -EIO;
        if (rc >= 0)
            rc = coord__journal_commit(c->journal);
        if (rc < 0)
            r = rc;
    }
    if (r < 0) {
        coord__journal_rollback(c->journal);
        outbox_done(&o);
        return r;
    }
    c->job = job;
    bump_next_ids(c, &o);
    outbox_deliver(c, &o);
    outbox_done(&o);
    return 0;
}

int coord_stop(struct coord *c, const char *reason) {
    if (!c || c->magic != COORD_MAGIC)
        return -EINVAL;
    pthread_mutex_lock(&c->lock);
    int r = stop_locked(c, reason);
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
        if (is_live(c->workers[k]->pub.state))
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
        if (is_live(c->workers[k]->pub.state))
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
        if (!is_live(wk->pub.state))
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
        int r = configure_locked(c, dp, pp, a, n, "tcp", NULL, c->job.step, "membership changed",
                                 NULL);
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
        if (!is_live(wk->pub.state) || now - wk->last_seen <= deadline)
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
        job_accepts_commands(c)) {
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

int coord_plan_detail_set(struct coord *c, const char *json) {
    if (!c || c->magic != COORD_MAGIC)
        return -EINVAL;
    char *copy = NULL;
    if (json) {
        /* Checked here so /v1/plan always serves valid JSON. */
        size_t len = strlen(json);
        if (len == 0 || len > (1u << 20))
            return -EINVAL;
        const char *p = json;
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')
            p++;
        if (*p != '{')
            return -EINVAL;
        copy = st_strdup(json);
        if (!copy)
            return -ENOMEM;
    }
    pthread_mutex_lock(&c->lock);
    st_free(c->plan_detail);
    c->plan_detail = copy;
    pthread_mutex_unlock(&c->lock);
    return 0;
}

void coord_metrics_add_migration(struct coord *c, enum plan_reconf kind,
                                 uint64_t bytes, double stall_seconds, uint64_t steps_replayed) {
    if (!c || c->magic != COORD_MAGIC || !coord__counted_kind(kind) ||
        !isfinite(stall_seconds) || stall_seconds < 0)
        return;
    pthread_mutex_lock(&c->lock);
    c->mig_count[kind]++;
    c->mig_bytes[kind] += bytes;
    c->mig_stall[kind] += stall_seconds;
    c->mig_replayed[kind] += steps_replayed;
    coord__history_migration(&c->history, st_wall(), c->job.epoch, c->job.step, c->job.dp,
                             c->job.pp, kind, bytes, stall_seconds);
    pthread_mutex_unlock(&c->lock);
}

void coord_metrics_set_cost_model(struct coord *c, const struct coord_cost_model *cm) {
    if (!c || c->magic != COORD_MAGIC || !cm)
        return;
    pthread_mutex_lock(&c->lock);
    c->cost_model = *cm;
    pthread_mutex_unlock(&c->lock);
}

void coord_metrics_set_instances(struct coord *c, double predicted, double actual) {
    if (!c || c->magic != COORD_MAGIC || !isfinite(predicted) || !isfinite(actual))
        return;
    pthread_mutex_lock(&c->lock);
    c->predicted = predicted;
    c->actual = actual;
    coord__history_instances(&c->history, st_wall(), (int)actual, c->noticed, predicted);
    pthread_mutex_unlock(&c->lock);
}

double coord__on_demand_dollars(const struct coord *c) {
    const struct st_spec_fleet *f = &c->spec.fleet;
    if (c->spot_price_live > 0) /* spend no longer follows the spec's spot price */
        return c->od_spend;
    return f->spot_price > 0 ? c->spend * f->on_demand_price / f->spot_price : 0.0;
}

/* See coordinator.h. */
void coord_metrics_set_noticed(struct coord *c, int noticed) {
    if (!c || c->magic != COORD_MAGIC || noticed < 0)
        return;
    pthread_mutex_lock(&c->lock);
    c->noticed = noticed;
    coord__history_instances(&c->history, st_wall(), (int)c->actual, noticed, c->predicted);
    pthread_mutex_unlock(&c->lock);
}

void coord_planner_record(struct coord *c, const char *predictor,
                          const struct coord_planner_decision *d) {
    if (!c || c->magic != COORD_MAGIC || !predictor || !d)
        return;
    pthread_mutex_lock(&c->lock);
    snprintf(c->planner_predictor, sizeof(c->planner_predictor), "%s", predictor);
    c->planner_decisions++;
    if (isfinite(d->decide_seconds) && d->decide_seconds > 0)
        c->planner_decide_seconds += d->decide_seconds;
    c->planner_last = *d;
    pthread_mutex_unlock(&c->lock);
    (void)coord_event(c, "decision", NULL, "%dx%d at step %" PRIu64 ": %s", d->dp, d->pp,
                      d->at_step, d->reason);
}

void coord_set_waiting(struct coord *c, const char *reason) {
    if (!c || c->magic != COORD_MAGIC || !reason)
        return;
    pthread_mutex_lock(&c->lock);
    snprintf(c->waiting_reason, sizeof(c->waiting_reason), "%s", reason);
    pthread_mutex_unlock(&c->lock);
}

/* See coordinator.h. */
void coord_metrics_add_spend_live(struct coord *c, double hours, double price_per_hour) {
    if (!c || c->magic != COORD_MAGIC || !isfinite(hours) || hours < 0 ||
        !isfinite(price_per_hour) || price_per_hour <= 0)
        return;
    pthread_mutex_lock(&c->lock);
    if (c->spot_price_live <= 0) /* first live price: carry on from the spec-priced total */
        c->od_spend = coord__on_demand_dollars(c);
    c->spot_price_live = price_per_hour;
    c->spend += hours * price_per_hour;
    c->od_spend += hours * c->spec.fleet.on_demand_price;
    coord__history_cost(&c->history, st_wall(), c->spend, coord__on_demand_dollars(c));
    pthread_mutex_unlock(&c->lock);
}

void coord_metrics_add_spend(struct coord *c, double dollars) {
    if (!c || c->magic != COORD_MAGIC || !isfinite(dollars) || dollars < 0)
        return;
    pthread_mutex_lock(&c->lock);
    c->spend += dollars;
    coord__history_cost(&c->history, st_wall(), c->spend, coord__on_demand_dollars(c));
    pthread_mutex_unlock(&c->lock);
}
