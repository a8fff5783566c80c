/* loop-order.c: ordering an epoch (loop-internal.h): a fresh start or a restore from the newest
 * checkpoint, a live migration at the lease boundary, and a peer restore from the copies of
 * the last running epoch after an unannounced loss. Each one plans who takes which position,
 * journals and sends its orders, and leaves the loop waiting for its participants (loop.c's
 * phases). */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "loop-internal.h"

/* The typed Configure fields of an epoch: how workers enter it and its stage boundaries. */
static void epoch_setup(struct coord_epoch_setup *es, enum coord_reconf_mode mode,
                        const int *split, int pp, const char *dir) {
    memset(es, 0, sizeof(*es));
    es->mode = mode;
    for (int s = 0; s <= pp && s <= COORD_MAX_STAGES; s++)
        es->split[s] = split[s];
    if (dir)
        snprintf(es->dir, sizeof(es->dir), "%s", dir);
}

/* Remembers the workers that take part in the epoch being ordered. */
static int rc_set_participants(struct coord_loop *L, char (*ids)[ST_UUID_STR_LEN], size_t n) {
    st_free(L->rc.part);
    L->rc.part = st_calloc(n + 1, sizeof(*L->rc.part));
    if (!L->rc.part)
        return -ENOMEM;
    memcpy(L->rc.part, ids, n * sizeof(*ids));
    L->rc.npart = n;
    return 0;
}

/* Remembers which worker takes each new position of the epoch being ordered. */
static int rc_set_positions(struct coord_loop *L, const struct coord_assignment *as, size_t n) {
    st_free(L->rc.pos);
    L->rc.pos = st_calloc(n + 1, sizeof(*L->rc.pos));
    if (!L->rc.pos)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        snprintf(L->rc.pos[as[i].stage * L->rc.dp + as[i].replica], sizeof(L->rc.pos[0]), "%s",
                 as[i].worker_id);
    return 0;
}

/* The epoch being ordered (L->rc), from `at` with dp x pp over split, with its participants
 * and who takes each position; its record (L->rc.rec) and first lease are the caller's. */
static int rc_open(struct coord_loop *L, uint64_t epoch, uint64_t at, bool restore, int dp,
                   int pp, const int *split, double now, char (*ids)[ST_UUID_STR_LEN],
                   size_t nids, const struct coord_assignment *as, size_t nas) {
    L->rc.epoch = epoch;
    L->rc.at = at;
    L->rc.restore = restore;
    L->rc.started = now;
    L->rc.alive = now;
    L->rc.progress = 0;
    L->rc.dp = dp;
    L->rc.pp = pp;
    memcpy(L->rc.split, split, sizeof(L->rc.split));
    TRY(rc_set_participants(L, ids, nids));
    return rc_set_positions(L, as, nas);
}

/* The order a restore gives out positions in: by instance id (shorter first, so vm-9 comes
 * before vm-10), then by worker id. */
static bool wv_before(const struct wv *a, const struct wv *b) {
    size_t la = strlen(a->w.instance_id), lb = strlen(b->w.instance_id);
    if (la != lb)
        return la < lb;
    int c = strcmp(a->w.instance_id, b->w.instance_id);
    return c ? c < 0 : strcmp(a->w.id, b->w.id) < 0;
}

/* Orders a fresh start (mode=init at step 0) or a restore from the newest checkpoint onto the
 * available workers. */
int loop__start_restore(struct coord_loop *L, const struct wv *v, size_t nv, double now,
                        const char *reason) {
    char (*ids)[ST_UUID_STR_LEN] = NULL;
    struct coord_assignment *as = NULL;
    int r = 0, n = 0;
    for (size_t i = 0; i < nv; i++)
        n += !v[i].dead && !v[i].leaving && v[i].w.state != COORD_WORKER_STOPPED;
    int dp = 0, pp = 0;
    char why[200];
    uint64_t step = 0;
    char dir[ST_SPEC_PATH_MAX] = "";
    bool restore = L->epoch > 0 || L->need_restore;
    if (restore && L->cfg.ckpt_latest && L->cfg.ckpt_root[0]) {
        int k = L->cfg.ckpt_latest(L->cfg.ckpt_userdata, L->cfg.ckpt_root, dir, sizeof(dir),
                                   &step);
        if (k < 0) {
            dir[0] = '\0';
            step = 0;
        }
    }
    loop__choose_shape(L, n, step, v, nv, now, &dp, &pp, why, sizeof(why));
    if (dp < 1) {
        L->need_restore = restore;
        L->phase = PH_WAIT_FIRST;
        return 0; /* nobody to run on yet */
    }
    int split[PLAN_MIG_MAX_STAGES + 1];
    TRY(loop__split_for(L, pp, split));
    as = st_calloc((size_t)(dp * pp), sizeof(*as));
    ids = st_calloc((size_t)(dp * pp), sizeof(*ids));
    if (!as || !ids)
        TRY_GOTO(-ENOMEM, r, out);
    /* Positions in instance-name order (the cloud's launch order; worker id without one):
     * deterministic whatever order the workers joined in. */
    size_t *ord = st_calloc(nv + 1, sizeof(*ord));
    if (!ord)
        TRY_GOTO(-ENOMEM, r, out);
    for (size_t i = 0; i < nv; i++)
        ord[i] = i;
    for (size_t i = 1; i < nv; i++)
        for (size_t j = i; j > 0 && wv_before(&v[ord[j]], &v[ord[j - 1]]); j--) {
            size_t t = ord[j];
            ord[j] = ord[j - 1];
            ord[j - 1] = t;
        }
    int k = 0;
    for (size_t oi = 0; oi < nv && k < dp * pp; oi++) {
        size_t i = ord[oi];
        if (v[i].dead || v[i].leaving || v[i].w.state == COORD_WORKER_STOPPED)
            continue;
        int s = k / dp, rep = k % dp;
        snprintf(as[k].worker_id, sizeof(as[k].worker_id), "%s", v[i].w.id);
        as[k].stage = s;
        as[k].replica = rep;
        as[k].layer_begin = split[s];
        as[k].layer_end = split[s + 1];
        snprintf(ids[k], sizeof(ids[k]), "%s", v[i].w.id);
        k++;
    }
    st_free(ord);
    struct coord_epoch_setup *es = st_malloc(sizeof(*es));
    if (!es)
        TRY_GOTO(-ENOMEM, r, out);
    epoch_setup(es, dir[0] ? COORD_RECONF_RESTORE : COORD_RECONF_INIT, split, pp,
                dir[0] ? dir : NULL);
    uint64_t epoch = 0;
    char rs[200];
    snprintf(rs, sizeof(rs), "%s: %s", dir[0] ? "restore" : (restore ? "restart" : "start"),
             reason);
    r = coord_configure_epoch(L->c, dp, pp, as, (size_t)(dp * pp), es, step, rs, &epoch);
    st_free(es);
    if (r < 0)
        goto out;
    loop__cm_epoch_end(L);
    loop__shape_time(L, now);
    memset(&L->rc.rec, 0, sizeof(L->rc.rec));
    L->rc.rec.ordered_at = now - L->t0;
    L->rc.rec.epoch = epoch;
    L->rc.rec.at_step = step;
    /* Without a checkpoint a "restore" starts from scratch: a fresh start, not a restore. The
     * first epoch is neither (not counted). */
    L->rc.rec.kind = dir[0] ? PLAN_RECONF_CHECKPOINT_RESTORE : PLAN_RECONF_FRESH_START;
    L->rc.rec.steps_replayed = restore && L->max_step > step ? L->max_step - step : 0;
    loop__cm_predict(L, dp, pp, NULL);
    L->rc.rec.from_dp = L->epoch ? L->dp : 0;
    L->rc.rec.from_pp = L->epoch ? L->pp : 0;
    L->rc.rec.to_dp = dp;
    L->rc.rec.to_pp = pp;
    snprintf(L->rc.rec.reason, sizeof(L->rc.rec.reason), "%s", reason);
    L->rc.first_lease = 0; /* a fresh engine is not timed: the loop's first grant will do */
    TRY_GOTO(rc_open(L, epoch, step, restore, dp, pp, split, now, ids, (size_t)k, as, (size_t)k),
             r, out);
    L->phase = PH_RECONF;
    L->need_restore = false;
    /* The event line waits for the outcome (phase_reconf), which knows the cost. */
    if (dir[0])
        snprintf(L->rc.why, sizeof(L->rc.why), "from the checkpoint at step %" PRIu64
                 ", because %s; %s", step, reason, why);
    else if (restore)
        snprintf(L->rc.why, sizeof(L->rc.why), "from scratch (no checkpoint), because %s; %s",
                 reason, why);
    else
        snprintf(L->rc.why, sizeof(L->rc.why), "%s; %s", reason, why);
    loop__set_status(L, "epoch %" PRIu64 ": %s %dx%d at step %" PRIu64 " ordered", epoch,
                     dir[0] ? "restore" : (restore ? "restart from scratch" : "start"), dp, pp,
                     step);
out:
    st_free(as);
    st_free(ids);
    return r;
}

/* Sends one participant its part of the migration with the epoch's communicator; copy_epoch
 * (not 0) makes it a peer restore from the copies of (copy_epoch, at); a worker taking a
 * position also gets the new epoch's first lease (L->rc.first_lease). */
static int order_migrate(struct coord_loop *L, const char *id, const struct coord_transfer *t,
                         size_t n, uint64_t at, const struct coord_peer *peers, size_t npeers,
                         uint64_t copy_epoch, bool positioned) {
    return coord_migrate_peers(L->c, id, t, n, at, peers, npeers, copy_epoch,
                               positioned ? L->rc.first_lease : 0, NULL);
}

/* Steps in a lease window: about lease_seconds ahead of the slowest positioned worker, by its
 * reported step time, capped by the rate actually observed. */
uint64_t loop__lease_window(struct coord_loop *L, const struct wv *v, size_t nv) {
    double slowest = 0;
    pthread_mutex_lock(&L->lock);
    for (size_t i = 0; i < nv; i++) {
        struct lworker *lw = v[i].positioned ? loop__lw_get(L, v[i].w.id) : NULL;
        if (lw)
            slowest = ST_MAX(slowest, lw->step_seconds);
    }
    pthread_mutex_unlock(&L->lock);
    uint64_t w = slowest > 0 ? (uint64_t)ceil(L->cfg.lease_seconds / slowest) : 4;
    /* A step's own time misses what happens between steps (other processes on the same
     * cores, reports): also cap by the rate actually observed, which may at most double
     * per window, so the lease stays about lease_seconds ahead in wall time. */
    if (L->steps_per_s > 0)
        w = ST_MIN(w, (uint64_t)ceil(2 * L->steps_per_s * L->cfg.lease_seconds) + 4);
    return ST_MIN(ST_MAX(w, 4), 100000);
}

/* The first lease of a migration's new epoch (dp x pp from step at), sent with its orders so
 * the workers train on right after the transfers: without it they would wait at `at` until
 * the loop heard every "reconfigured" and granted one, a round trip through Reports, a loop
 * tick and the Watch stream that was most of a migration's stall (docs/live-migration.md).
 * About lease_seconds of the new shape's steps: the running window, shortened when the
 * fitted model (with measured steps behind it) says the new shape's steps are slower, so a
 * notice right after still waits at most about lease_seconds for its boundary; never past a
 * forced shape's step or the last step. */
static uint64_t first_lease(struct coord_loop *L, const struct wv *v, size_t nv, int dp, int pp,
                            uint64_t at) {
    uint64_t w = loop__lease_window(L, v, nv);
    double pred = L->fit && L->fit_has_steps ? plan_fit_step_seconds(L->fit, dp, pp) : 0;
    if (pred > 0 && isfinite(pred))
        w = ST_MIN(w, ST_MAX((uint64_t)ceil(L->cfg.lease_seconds / pred), 1));
    uint64_t to = ST_MIN(L->total, at + w);
    uint64_t fnext = loop__forced_next(L, at);
    if (fnext && to > fnext)
        to = fnext;
    return to > at ? to : 0;
}

/* A peer restore's sources: the step every survivor rolls back to, and for each worker of the
 * view the position it held in the last running epoch (-1 = none), the dead ones included:
 * their state is sent by their successor in the copies' ring (st_peer_ring over the epoch's
 * zones), from its peer copy. */
struct peer_src {
    uint64_t step;
    int *pos;          /* [nv] position s*dp + r in the run layout, -1 = none */
    size_t *succ;      /* [nv] for a dead positioned worker: the view index of its successor */
};

/* Orders a live migration to (dp, pp) at the lease boundary; falls back to a restore when
 * some state has no live copy. With ps, a peer restore instead: from the run layout at step
 * ps->step, dead workers' state coming from their successors' copies; -ENODATA (nothing
 * ordered) when the planner finds some state without a copy. */
int loop__start_migrate(struct coord_loop *L, const struct wv *v, size_t nv, int dp, int pp,
                        double now, const char *reason, const struct peer_src *ps) {
    struct plan_mig_worker *pw = st_calloc(nv + 1, sizeof(*pw));
    struct plan_mig_layout *ol = st_calloc(1, sizeof(*ol)), *nl = st_calloc(1, sizeof(*nl));
    struct plan_migration *plan = NULL;
    struct coord_assignment *as = NULL;
    struct coord_transfer *tr = NULL;
    struct coord_peer *peers = NULL;
    char (*ids)[ST_UUID_STR_LEN] = NULL;
    uint32_t *src = NULL; /* per transfer: the worker that sends it (peer restore: remapped) */
    bool *sends = NULL;
    int r = 0;
    char err[256] = "";
    int odp = ps ? L->run_dp : L->dp, opp = ps ? L->run_pp : L->pp;
    const int *osplit = ps ? L->run_split : L->split;

    if (!pw || !ol || !nl)
        TRY_GOTO(-ENOMEM, r, out);
    uint32_t olo[PLAN_MIG_MAX_STAGES + 1], nlo[PLAN_MIG_MAX_STAGES + 1];
    int split[PLAN_MIG_MAX_STAGES + 1];
    for (int s = 0; s <= opp; s++)
        olo[s] = (uint32_t)osplit[s];
    TRY_GOTO(loop__split_for(L, pp, split), r, out);
    for (int s = 0; s <= pp; s++)
        nlo[s] = (uint32_t)split[s];
    TRY_GOTO(plan_mig_layout_init((uint32_t)L->nlayers, L->layer_params, (uint32_t)odp,
                                  (uint32_t)opp, olo, ol), r, out);
    TRY_GOTO(plan_mig_layout_add_tied(ol, PLAN_MIG_STAGE_LAST, 0), r, out);
    TRY_GOTO(plan_mig_layout_init((uint32_t)L->nlayers, L->layer_params, (uint32_t)dp,
                                  (uint32_t)pp, nlo, nl), r, out);
    TRY_GOTO(plan_mig_layout_add_tied(nl, PLAN_MIG_STAGE_LAST, 0), r, out);
    for (size_t i = 0; i < nv; i++) {
        snprintf(pw[i].id, sizeof(pw[i].id), "%.*s", (int)sizeof(pw[i].id) - 1, v[i].w.id);
        pw[i].stage = v[i].positioned ? v[i].w.stage : -1;
        pw[i].replica = v[i].positioned ? v[i].w.replica : 0;
        pw[i].alive = !v[i].dead && !v[i].failed && v[i].w.state != COORD_WORKER_STOPPED;
        pw[i].leaving = pw[i].alive && v[i].leaving;
        if (ps && ps->pos[i] >= 0) {
            /* Everyone rolls back to the copies' step, a failed step included; a dead worker
             * still "sends" (its successor does it for it) but takes no position. */
            pw[i].stage = ps->pos[i] / odp;
            pw[i].replica = ps->pos[i] % odp;
            pw[i].alive = true;
            pw[i].leaving = v[i].dead || v[i].leaving;
        } else if (ps) {
            pw[i].stage = -1;
            pw[i].replica = 0;
            pw[i].alive = !v[i].dead && v[i].w.state != COORD_WORKER_STOPPED;
            pw[i].leaving = pw[i].alive && v[i].leaving;
        }
    }
    struct plan_mig_request req = {
        .nlayers = (uint32_t)L->nlayers,
        .layer_params = L->layer_params,
        .old_layout = ol,
        .new_layout = nl,
        .workers = pw,
        .nworkers = (uint32_t)nv,
        .validate = true,
    };
    r = plan_migration_new(&req, &plan, err, sizeof(err));
    if (ps && r < 0) {
        st_log(ST_LOG_WARN, "loop", "No peer restore to %dx%d: %s (%s)", dp, pp, st_strerror(r),
               err);
        r = -ENODATA;
        goto out;
    }
    if (r == -ENODATA || r == -ENOSPC) {
        char why[300];
        snprintf(why, sizeof(why), "%s; no live copy (%s)", reason, err);
        r = loop__start_restore(L, v, nv, now, why);
        goto out;
    }
    if (r < 0) {
        st_log(ST_LOG_ERR, "loop", "Migration plan to %dx%d failed: %s (%s)", dp, pp,
               st_strerror(r), err);
        goto out;
    }
    size_t npos = (size_t)(dp * pp);
    as = st_calloc(npos, sizeof(*as));
    peers = st_calloc(nv + 1, sizeof(*peers));
    ids = st_calloc(nv + 1, sizeof(*ids));
    tr = st_calloc(plan->ntransfers + 1, sizeof(*tr));
    src = st_calloc(plan->ntransfers + 1, sizeof(*src));
    sends = st_calloc(nv + 1, sizeof(*sends));
    if (!as || !peers || !ids || !tr || !src || !sends)
        TRY_GOTO(-ENOMEM, r, out);
    for (size_t t = 0; t < plan->ntransfers; t++) {
        src[t] = plan->transfers[t].src;
        if (ps && v[src[t]].dead)
            src[t] = (uint32_t)ps->succ[src[t]];
        sends[src[t]] = true;
    }
    size_t np = 0;
    for (size_t p = 0; p < npos; p++) {
        uint32_t w = plan->position_worker[p];
        int s = (int)(p / (size_t)dp), rep = (int)(p % (size_t)dp);
        snprintf(as[p].worker_id, sizeof(as[p].worker_id), "%s", v[w].w.id);
        as[p].stage = s;
        as[p].replica = rep;
        as[p].layer_begin = split[s];
        as[p].layer_end = split[s + 1];
        snprintf(peers[np].worker_id, sizeof(peers[np].worker_id), "%s", v[w].w.id);
        peers[np].stage = s;
        peers[np].replica = rep;
        np++;
    }
    /* Send-only participants: alive workers without a new position that send something. */
    for (size_t i = 0; i < nv; i++) {
        if (plan->worker_stage[i] >= 0 || !sends[i])
            continue;
        snprintf(peers[np].worker_id, sizeof(peers[np].worker_id), "%s", v[i].w.id);
        peers[np].stage = LOOP_SPARE_STAGE;
        peers[np].replica = LOOP_SPARE_STAGE;
        np++;
    }
    for (size_t k = 0; k < np; k++)
        snprintf(ids[k], sizeof(ids[k]), "%s", peers[k].worker_id);
    uint64_t at = ps ? ps->step : L->lease;
    struct coord_epoch_setup *es = st_malloc(sizeof(*es));
    if (!es)
        TRY_GOTO(-ENOMEM, r, out);
    epoch_setup(es, ps ? COORD_RECONF_PEER_RESTORE : COORD_RECONF_MIGRATE, split, pp, NULL);
    uint64_t epoch = 0;
    char rs[200];
    snprintf(rs, sizeof(rs), "%s %s: %s", plan_reconf_name(plan->cls),
             ps ? "peer restore" : "migration", reason);
    double t_order = st_now();
    r = coord_configure_epoch(L->c, dp, pp, as, npos, es, at, rs, &epoch);
    st_free(es);
    if (r < 0)
        goto out;
    L->rc.first_lease = first_lease(L, v, nv, dp, pp, at);
    for (size_t k = 0; k < np; k++) {
        size_t nt = 0;
        uint32_t wi = 0;
        for (size_t i = 0; i < nv; i++)
            if (!strcmp(v[i].w.id, peers[k].worker_id))
                wi = (uint32_t)i;
        for (size_t t = 0; t < plan->ntransfers; t++) {
            const struct plan_mig_transfer *x = &plan->transfers[t];
            if (src[t] != wi && x->dst != wi)
                continue;
            snprintf(tr[nt].src_worker_id, sizeof(tr[nt].src_worker_id), "%s", v[src[t]].w.id);
            tr[nt].from_copy = src[t] != x->src;
            snprintf(tr[nt].dst_worker_id, sizeof(tr[nt].dst_worker_id), "%s", v[x->dst].w.id);
            tr[nt].layer = (int)x->layer;
            tr[nt].kind = (enum st_state_kind)x->kind;
            tr[nt].offset = x->offset;
            tr[nt].count = x->count;
            nt++;
        }
        /* A peer restore names the copies' epoch: a worker that applied part of a failed
         * epoch holds state of another layout in its engine, and only its copy of the run
         * epoch is what this plan assumes it holds. */
        r = order_migrate(L, peers[k].worker_id, tr, nt, at, peers, np, ps ? L->run_epoch : 0,
                          k < npos);
        if (r < 0) {
            /* The epoch is open but incomplete: its workers cannot finish it. Restore. */
            loop__event(L, "epoch %" PRIu64 ": cannot send the migration order to %.8s: %s",
                        epoch, peers[k].worker_id, st_strerror(r));
            L->epoch = epoch;
            L->dp = dp;
            L->pp = pp;
            L->need_restore = true;
            L->phase = PH_WAIT_FIRST;
            goto out;
        }
    }
    /* The orders' journaling and delivery: what a worker that reached the boundary first
     * waits for (the "wait" part of the stall). */
    st_log(ST_LOG_INFO, "loop", "Epoch %" PRIu64 " ordered at step %" PRIu64 ": %zu orders in "
           "%.6f s, %.6f s after the decision began", epoch, at, np + 1, st_now() - t_order,
           st_now() - now);
    loop__cm_epoch_end(L);
    /* A peer restore's old epoch has stopped; a migration's trains on until the boundary,
     * in its shape (counted when the reconfiguration ends). */
    if (ps)
        loop__shape_time(L, now);
    /* A plan that moves nothing (same layout, every position kept) still rebuilds the
     * communicators: counted as intra-stage. */
    enum plan_reconf kind = plan->cls == PLAN_RECONF_NONE ? PLAN_RECONF_INTRA_STAGE : plan->cls;
    memset(&L->rc.rec, 0, sizeof(L->rc.rec));
    L->rc.rec.ordered_at = now - L->t0;
    L->rc.rec.epoch = epoch;
    L->rc.rec.at_step = at;
    L->rc.rec.kind = ps ? PLAN_RECONF_PEER_RESTORE : kind;
    L->rc.rec.dp_reshard = !ps && dp != L->dp;
    L->rc.rec.steps_replayed = ps && L->max_step > at ? L->max_step - at : 0;
    L->rc.rec.from_dp = odp;
    L->rc.rec.from_pp = opp;
    L->rc.rec.to_dp = dp;
    L->rc.rec.to_pp = pp;
    L->rc.rec.planned_bytes = plan->bytes_moved;
    loop__cm_predict(L, dp, pp, plan);
    snprintf(L->rc.rec.reason, sizeof(L->rc.rec.reason), "%s", reason);
    TRY_GOTO(rc_open(L, epoch, at, false, dp, pp, split, now, ids, np, as, npos), r, out);
    L->phase = PH_RECONF;
    L->need_restore = false;
    snprintf(L->rc.why, sizeof(L->rc.why), "because %s", reason);
    char pb[32];
    loop__fmt_bytes(pb, sizeof(pb), plan->bytes_moved);
    if (ps)
        loop__set_status(L, "epoch %" PRIu64 ": peer restore %dx%d -> %dx%d from the copies of "
                         "step %" PRIu64 " ordered (%" PRIu64 " steps to replay), %s planned",
                         epoch, odp, opp, dp, pp, at, L->rc.rec.steps_replayed, pb);
    else
        loop__set_status(L, "epoch %" PRIu64 ": %s migration %dx%d -> %dx%d at step %" PRIu64
                         " ordered, %s planned", epoch, plan_reconf_name(plan->cls), L->dp,
                         L->pp, dp, pp, at, pb);
out:
    if (r < 0 && !(ps && r == -ENODATA))
        st_log(ST_LOG_ERR, "loop", "Migration %dx%d -> %dx%d not ordered: %s", L->dp, L->pp, dp,
               pp, st_strerror(r));
    plan_migration_free(plan);
    st_free(pw);
    st_free(ol);
    st_free(nl);
    st_free(as);
    st_free(tr);
    st_free(peers);
    st_free(ids);
    st_free(src);
    st_free(sends);
    return r;
}

/* Whether a peer restore may be planned now after a loss: every surviving positioned worker
 * reported since the loss was seen (its newest copy's generation came with it: a Report may
 * lag the copies by more than the two generations a worker keeps, and a plan made from the
 * stale ones finds no step everyone holds), or LOOP_COPIES_SETTLE passed. Starts that wait. */
bool loop__copies_heard(struct coord_loop *L, const struct wv *v, size_t nv, double now) {
    if (L->lost_since == 0)
        L->lost_since = now;
    if (now - L->lost_since >= LOOP_COPIES_SETTLE)
        return true;
    bool all = true;
    pthread_mutex_lock(&L->lock);
    for (size_t i = 0; i < nv && all; i++) {
        if (!v[i].positioned || v[i].dead)
            continue;
        const struct lworker *w = loop__lw_get(L, v[i].w.id);
        all = w && w->report_at >= L->lost_since;
    }
    pthread_mutex_unlock(&L->lock);
    return all;
}

static bool pc_has(const struct lworker *w, uint64_t epoch, uint64_t step) {
    for (int k = 0; w && k < 2; k++)
        if (w->pc_epoch[k] == epoch && w->pc_step[k] == step)
            return true;
    return false;
}

/* After an unannounced loss: restores from the peer copies of the last running epoch when
 * one step's copies survive for every position (each alive owner holds its own, each dead
 * owner's successor in the copies' ring holds it), onto the available workers. Returns 0 when
 * ordered, -ENODATA when no copy serves (the caller restores from disk), or another negative
 * errno. */
int loop__start_peer_restore(struct coord_loop *L, const struct wv *v, size_t nv, double now,
                             const char *reason) {
    int n = L->run_dp * L->run_pp, r = 0;
    if (L->cfg.spec.fault_tolerance.peer_copy_every <= 0 || !L->run_pos || L->run_epoch == 0 ||
        n < 2)
        return -ENODATA;
    struct peer_src ps = {0, st_calloc(nv + 1, sizeof(int)), st_calloc(nv + 1, sizeof(size_t))};
    long *vi = st_calloc((size_t)n, sizeof(*vi));
    int *next = st_calloc((size_t)n, sizeof(*next));
    const char **zones = st_calloc((size_t)n, sizeof(*zones));
    if (!ps.pos || !ps.succ || !vi || !next || !zones)
        TRY_GOTO(-ENOMEM, r, out);
    for (size_t i = 0; i < nv; i++)
        ps.pos[i] = -1;
    for (int p = 0; p < n; p++) {
        vi[p] = -1;
        for (size_t i = 0; i < nv; i++)
            if (!strcmp(v[i].w.id, L->run_pos[p]))
                vi[p] = (long)i;
        if (vi[p] < 0)
            TRY_GOTO(-ENODATA, r, out); /* gone from the table: nothing to plan with */
        ps.pos[vi[p]] = p;
    }
    /* The copies' ring, as the workers derived it from the epoch's zones (st_peer_ring). */
    for (int p = 0; p < n; p++)
        zones[p] = v[vi[p]].w.zone; /* vi complete now */
    TRY_GOTO(st_peer_ring(n, zones, next), r, out);
    for (int p = 0; p < n; p++)
        ps.succ[vi[p]] = (size_t)vi[next[p]];
    bool found = false;
    pthread_mutex_lock(&L->lock);
    for (int p = 0; p < n; p++)
        for (int k = 0; k < 2; k++) {
            struct lworker *w = loop__lw_get(L, L->run_pos[p]);
            if (!w || w->pc_epoch[k] != L->run_epoch || (found && w->pc_step[k] <= ps.step))
                continue;
            uint64_t cand = w->pc_step[k];
            bool ok = cand != L->peer_failed_at;
            for (int q = 0; ok && q < n; q++) {
                const struct wv *o = &v[vi[q]], *sc = &v[vi[next[q]]];
                if (!o->dead)
                    ok = pc_has(loop__lw_get(L, o->w.id), L->run_epoch, cand);
                else
                    ok = !sc->dead && pc_has(loop__lw_get(L, sc->w.id), L->run_epoch, cand);
            }
            if (ok) {
                ps.step = cand;
                found = true;
            }
        }
    pthread_mutex_unlock(&L->lock);
    if (!found)
        TRY_GOTO(-ENODATA, r, out);
    int navail = 0;
    for (size_t i = 0; i < nv; i++)
        navail += !v[i].dead && !v[i].leaving && v[i].w.state != COORD_WORKER_STOPPED;
    int dp, pp;
    char why[200];
    loop__choose_shape(L, navail, ps.step, v, nv, now, &dp, &pp, why, sizeof(why));
    if (dp < 1)
        TRY_GOTO(-ENODATA, r, out);
    r = loop__start_migrate(L, v, nv, dp, pp, now, reason, &ps);
out:
    st_free(ps.pos);
    st_free(ps.succ);
    st_free(vi);
    st_free(next);
    st_free(zones);
    return r;
}
