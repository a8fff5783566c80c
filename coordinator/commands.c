/* commands.c: the commands the coordinator sends its workers (Configure, Migrate, Lease,
 * Checkpoint, Stop), each journaled in the transaction that decides it and pushed on the
 * worker's stream after the commit; a reconnecting worker gets what it has not acknowledged
 * again (coord__watch_fill). The journal keeps every command without the epoch's data-plane
 * secret; the bytes on the stream carry it (dp-secret.c). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "coord-internal.h"

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
    if (ST_GROW(o->v, o->n, o->cap, 8) < 0)
        return -ENOMEM;
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

bool coord__job_accepts_commands(const struct coord *c) {
    return c->job.state == COORD_JOB_PENDING || c->job.state == COORD_JOB_RUNNING;
}

int coord__configure_locked(struct coord *c, int dp, int pp, const struct coord_assignment *a,
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
    if (!coord__job_accepts_commands(c))
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
        if (!wks[i] || !coord__worker_live(wks[i]->pub.state) || a[i].stage < 0 ||
            a[i].stage >= pp || a[i].replica < 0 || a[i].replica >= dp || a[i].layer_begin < 0 ||
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
        if (assigned || !coord__worker_live(wk->pub.state) || wk->pub.state == COORD_WORKER_SPARE)
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
        if (!assigned && coord__worker_live(wk->pub.state)) {
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
    int r = coord__configure_locked(c, dp, pp, assign, n, rendezvous, NULL, start_step, reason,
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
        r = coord__configure_locked(c, dp, pp, assign, n, rdv, setup, start_step, reason,
                                    ret_epoch);
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
    if (!coord__job_accepts_commands(c)) {
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
    if (!coord__job_accepts_commands(c)) {
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
        if (only_active ? wk->pub.state != COORD_WORKER_ACTIVE : !coord__worker_live(wk->pub.state))
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
    if (!coord__job_accepts_commands(c)) {
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
