/* loop.c: the coordinator's planning loop (coord-loop.h) — the provider's signals, the
 * workers' table, the phases (training, reconfiguring, saving, ...), checkpoints and the
 * fallback to one; the shape to run is loop-shape.c's, the epochs are ordered in
 * loop-order.c (loop-internal.h lists the loop's files).
 *
 * The one idea: the loop owns the step boundary. Workers of an epoch only train the steps
 * leased to them, so when the loop decides to reconfigure, the boundary is the lease already
 * granted: no worker can be past it, every worker will reach it, and no extra round trip is
 * needed to agree on it. Everything else is bookkeeping: who is alive, who was noticed, who
 * reported "reconfigured" for the new epoch, and a deadline on every wait. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h" /* TRY */
#include "loop-internal.h"

static const char *phase_name(enum loop_phase p) {
    static const char *const n[] = {"waiting", "resync", "training", "reconfiguring",
                                    "saving", "stopping", "done"};
    return n[p];
}

/* The provider's clock at wall time now (see hold). */
double loop__trace_now(const struct coord_loop *L, double now) {
    return now - L->hold;
}

void loop__event(struct coord_loop *L, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->st.last_event, sizeof(L->st.last_event), fmt, ap);
    va_end(ap);
    snprintf(L->events[L->nevents % LOOP_EVENTS], sizeof(L->events[0]), "%s", L->st.last_event);
    L->nevents++;
    st_log(ST_LOG_NOTICE, "loop", "%s", L->st.last_event);
    if (L->c)
        (void)coord_event(L->c, "loop", NULL, "%s", L->st.last_event);
}

/* What the loop is doing, for the status block's "last:" line only: an order whose outcome
 * loop__event() reports once, with its cost, when it is known (one line per event). */
void loop__set_status(struct coord_loop *L, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->st.last_event, sizeof(L->st.last_event), fmt, ap);
    va_end(ap);
    st_log(ST_LOG_INFO, "loop", "%s", L->st.last_event);
}

/* Bytes as a person reads them in an event line: "0.88 MB", "512 bytes". */
const char *loop__fmt_bytes(char *buf, size_t size, uint64_t b) {
    if (b >= 10000000000ull)
        snprintf(buf, size, "%.1f GB", (double)b / 1e9);
    else if (b >= 10000)
        snprintf(buf, size, "%.2f MB", (double)b / 1e6);
    else
        snprintf(buf, size, "%" PRIu64 " bytes", b);
    return buf;
}

/* Whether an event names kind k "<kind> migration" (the live ones) or by itself. */
bool loop__kind_is_migration(enum plan_reconf k) {
    return k == PLAN_RECONF_INTRA_STAGE || k == PLAN_RECONF_INTER_STAGE ||
           k == PLAN_RECONF_PIPELINE;
}

/* Seconds of stall or writing: "3 ms" under a second, "1.64 s" above. */
const char *loop__fmt_secs(char *buf, size_t size, double s) {
    if (s < 1.0)
        snprintf(buf, size, "%.0f ms", s * 1000);
    else
        snprintf(buf, size, "%.2f s", s);
    return buf;
}

/* ---- helpers -------------------------------------------------------------------------------- */

struct linst *loop__inst_find(struct coord_loop *L, const char *name) {
    for (size_t i = 0; i < L->ninst; i++)
        if (!strcmp(L->inst[i].name, name))
            return &L->inst[i];
    return NULL;
}

static struct linst *inst_get(struct coord_loop *L, const char *name) {
    struct linst *x = loop__inst_find(L, name);
    if (x)
        return x;
    if (ST_GROW(L->inst, L->ninst, L->capinst, 16) < 0)
        return NULL;
    x = &L->inst[L->ninst++];
    memset(x, 0, sizeof(*x));
    snprintf(x->name, sizeof(x->name), "%s", name);
    return x;
}

static int poll_provider(struct coord_loop *L, double now) {
    if (!L->cfg.provider)
        return 0;
    struct cloud_signal sig[64];
    size_t n;
    do {
        TRY(cloud_provider_poll(L->cfg.provider, loop__trace_now(L, now), sig, ST_ARRAY_SIZE(sig),
                                &n));
        for (size_t i = 0; i < n; i++) {
            struct linst *x = inst_get(L, sig[i].instance);
            if (!x)
                return -ENOMEM;
            if (sig[i].node[0])
                snprintf(x->node, sizeof(x->node), "%s", sig[i].node);
            const char *node = x->node[0] ? x->node : x->name;
            switch (sig[i].kind) {
            case CLOUD_SIG_NOTICE:
                x->noticed = true;
                x->deadline = sig[i].deadline;
                loop__event(L, "notice: %s (%s) goes in %.1f s", x->name, node,
                            sig[i].deadline - loop__trace_now(L, now));
                break;
            case CLOUD_SIG_LOST:
                x->dead = true;
                /* "lost: i-0003 (node-2, unannounced)": instance, node, and how. */
                loop__event(L, "lost: %s (%s, %s)", x->name, node,
                            cloud_loss_reason_name(sig[i].reason));
                break;
            case CLOUD_SIG_GRANTED:
                loop__event(L, "granted: %s (%s)", x->name, node);
                break;
            case CLOUD_SIG_EXITED:
                /* The worker process ended (crashed, killed by someone else): its state is
                 * gone as surely as with a preemption, and known now, not at the heartbeat
                 * deadline. */
                if (!x->dead)
                    loop__event(L, "%s exited: its worker process ended (instance %s, status %d)",
                                node, x->name, sig[i].status);
                x->dead = true;
                break;
            default:
                break;
            }
        }
    } while (n == ST_ARRAY_SIZE(sig));
    return 0;
}

static int alive_instances(struct coord_loop *L) {
    if (!L->cfg.provider)
        return -1;
    size_t n = 0;
    if (cloud_provider_instances(L->cfg.provider, NULL, 0, &n) < 0)
        return -1;
    return (int)n;
}

/* The worker table as this tick sees it. Caller frees *ret with st_free(). */
static int view_get(struct coord_loop *L, struct wv **ret, size_t *ret_n) {
    struct coord_worker *w = NULL;
    size_t n = 0;
    TRY(coord_workers_get(L->c, &w, &n));
    struct wv *v = st_calloc(n + 1, sizeof(*v));
    if (!v) {
        st_free(w);
        return -ENOMEM;
    }
    pthread_mutex_lock(&L->lock);
    for (size_t i = 0; i < n; i++) {
        v[i].w = w[i];
        struct linst *x = w[i].instance_id[0] ? loop__inst_find(L, w[i].instance_id) : NULL;
        struct lworker *lw = loop__lw_get(L, w[i].id);
        v[i].dead = w[i].state == COORD_WORKER_LOST || w[i].state == COORD_WORKER_STOPPED ||
                    (x && x->dead);
        v[i].leaving = (x && x->noticed) || (lw && lw->terminate);
        v[i].relayed_at = lw && lw->terminate ? lw->terminate_at : 0;
        v[i].positioned = w[i].state == COORD_WORKER_ACTIVE && w[i].epoch == L->epoch &&
                          L->epoch > 0;
        v[i].step = lw ? lw->step : w[i].step;
        v[i].loss = lw ? lw->loss : w[i].loss;
        v[i].failed = v[i].positioned && lw &&
                      (lw->fail_epoch == L->epoch || lw->reconf_fail_epoch == L->epoch);
        v[i].reported = lw && lw->reported && lw->report_epoch == L->epoch;
        v[i].step_seconds = lw ? lw->step_seconds : 0.0;
    }
    pthread_mutex_unlock(&L->lock);
    st_free(w);
    *ret = v;
    *ret_n = n;
    return 0;
}

void loop__shape_time(struct coord_loop *L, double now) {
    if (!L->epoch || L->dp <= 0)
        return;
    double dt = now - L->shape_since;
    L->shape_since = now;
    struct coord_loop_summary *S = &L->sum;
    for (int i = 0; i < S->nshapes; i++)
        if (S->shapes[i].dp == L->dp && S->shapes[i].pp == L->pp) {
            S->shapes[i].seconds += dt;
            return;
        }
    if (S->nshapes < COORD_LOOP_MAX_SHAPES) {
        S->shapes[S->nshapes].dp = L->dp;
        S->shapes[S->nshapes].pp = L->pp;
        S->shapes[S->nshapes].seconds = dt;
        S->nshapes++;
    }
}

/* ---- phases --------------------------------------------------------------------------------- */

/* One more failed try at `step` (a failed reconfiguration, a running epoch that stood still):
 * more than ten without progress past the failing boundary stop the job. Returns true when it
 * stopped it. */
static bool failed_try(struct coord_loop *L, uint64_t step, double now) {
    L->fail_at = ST_MAX(L->fail_at, step);
    if (++L->restore_tries <= 10)
        return false;
    loop__event(L, "giving up after %d failed reconfigurations", L->restore_tries);
    L->phase = PH_STOPPING;
    L->stop_at = now;
    (void)coord_stop(L->c, "too many failed reconfigurations");
    return true;
}

/* Whether worker id takes a position of the epoch being ordered or run (L->rc.pos). */
static bool rc_positioned(const struct coord_loop *L, const char *id) {
    for (int p = 0; L->rc.pos && p < L->rc.dp * L->rc.pp; p++)
        if (!strcmp(L->rc.pos[p], id))
            return true;
    return false;
}

static void phase_reconf(struct coord_loop *L, const struct wv *v, size_t nv, double now) {
    size_t done = 0;
    bool failed = false;
    uint64_t moved = 0, progress = 0;
    char bad[160] = "";
    /* A migration ordered for a later boundary leaves the running epoch training until then:
     * its first step may come in now, and ends its own chain, not the next one's. */
    loop__stall_done(L, v, nv, false);
    pthread_mutex_lock(&L->lock);
    for (size_t k = 0; k < L->rc.npart; k++) {
        struct lworker *w = loop__lw_get(L, L->rc.part[k]);
        const struct wv *x = NULL;
        for (size_t i = 0; i < nv; i++)
            if (!strcmp(v[i].w.id, L->rc.part[k]))
                x = &v[i];
        if (!w || !x || x->dead) {
            /* A participant that only sends (it leaves: noticed, its state moving off) may be
             * gone as soon as its sends are done: Azure deletes a VM the moment its worker
             * acknowledges the event, Kubernetes a pod whose process exited. Whether its
             * state arrived is for the positioned workers to say: each tells the epoch's end
             * only once everything it receives is in, and fails when a sender goes first. */
            if (L->rc.pos && !rc_positioned(L, L->rc.part[k])) {
                done++;
                continue;
            }
            failed = true;
            snprintf(bad, sizeof(bad), "participant %.8s lost", L->rc.part[k]);
            continue;
        }
        progress += w->step + (w->reconf_epoch == L->rc.epoch);
        if (w->reconf_fail_epoch == L->rc.epoch) {
            failed = true;
            snprintf(bad, sizeof(bad), "participant %.8s failed", L->rc.part[k]);
        } else if (w->reconf_epoch == L->rc.epoch) {
            done++;
            moved += w->recv;
            /* The loop's view of the steps done lags by a Report; the workers know. */
            L->rc.rec.steps_replayed = ST_MAX(L->rc.rec.steps_replayed, w->replayed);
        }
    }
    pthread_mutex_unlock(&L->lock);
    if (loop__kind_is_migration(L->rc.rec.kind) && (failed || done >= L->rc.npart))
        loop__shape_time(L, now); /* the old shape trained until the boundary */
    if (progress != L->rc.progress) {
        L->rc.progress = progress;
        L->rc.alive = now;
    }
    if (!failed && done < L->rc.npart && now - L->rc.alive > L->cfg.reconfig_timeout) {
        failed = true;
        snprintf(bad, sizeof(bad), "timed out: nothing moved for %.0f s (ordered %.0f s ago)",
                 now - L->rc.alive, now - L->rc.started);
    }
    if (failed || done >= L->rc.npart)
        loop__stall_done(L, v, nv, true); /* the running epoch's steps are over */
    if (failed) {
        loop__record_done(L, false, moved, now);
        if (L->rc.rec.kind == PLAN_RECONF_PEER_RESTORE)
            L->peer_failed_at = L->rc.at; /* the next try restores from disk */
        const struct coord_loop_record *fr = &L->rc.rec;
        loop__event(L, "epoch %" PRIu64 ": %s%s %dx%d -> %dx%d at step %" PRIu64 " failed (%s)",
                    L->rc.epoch, plan_reconf_name(fr->kind), loop__kind_is_migration(fr->kind)
                    ? " migration" : "", fr->from_dp, fr->from_pp, fr->to_dp, fr->to_pp,
                    fr->at_step, bad);
        L->epoch = L->rc.epoch; /* the workers left the old epoch (or will, and fail) */
        L->dp = L->rc.dp;
        L->pp = L->rc.pp;
        if (failed_try(L, L->rc.at, now))
            return;
        L->need_restore = true;
        L->phase = PH_WAIT_FIRST;
        return;
    }
    if (done < L->rc.npart)
        return;
    loop__record_done(L, true, moved, now);
    L->epoch = L->rc.epoch;
    L->dp = L->rc.dp;
    L->pp = L->rc.pp;
    memcpy(L->split, L->rc.split, sizeof(L->split));
    /* The layout peer copies will be taken in from now on. */
    st_free(L->prev_pos);
    L->prev_pos = L->run_pos;
    L->prev_n = L->run_pos ? L->run_dp * L->run_pp : 0;
    L->run_pos = L->rc.pos;
    L->rc.pos = NULL;
    L->run_epoch = L->epoch;
    L->run_dp = L->dp;
    L->run_pp = L->pp;
    memcpy(L->run_split, L->split, sizeof(L->run_split));
    L->max_step = L->rc.at;
    L->lease = L->rc.at;
    /* The workers may be training on already, up to the first lease their orders carried.
     * Grant it explicitly too: a worker that did not take it from its order (one of the
     * previous release) would otherwise wait at the boundary for a grant that never comes,
     * as the loop extends a lease only once half of it is used. */
    if (L->rc.first_lease > L->rc.at) {
        for (int p = 0; L->run_pos && p < L->run_dp * L->run_pp; p++)
            (void)coord_migrate(L->c, L->run_pos[p], NULL, 0, L->rc.first_lease, NULL);
        L->lease = L->rc.first_lease;
    }
    L->rate_step = L->rc.at;
    L->rate_t = now;
    L->last_grant = 0;
    L->shape_since = now;
    L->phase = PH_RUNNING;
    loop__cm_epoch_begin(L, L->rc.pred_step, L->rc.calibrated);
    /* The job's start has no cost to wait for: its one line now. Any other epoch gets its
     * line from loop__stall_done(), once its stall is known (one line per event, with its cost). */
    const struct coord_loop_record *rec = &L->rc.rec;
    if ((rec->kind == PLAN_RECONF_CHECKPOINT_RESTORE || rec->kind == PLAN_RECONF_FRESH_START) &&
        !L->rc.restore)
        loop__event(L, "epoch %" PRIu64 ": start, running %dx%d from step %" PRIu64 " (%s)",
                    L->epoch, L->dp, L->pp, L->lease, L->rc.why);
    else
        loop__set_status(L, "epoch %" PRIu64 " running %dx%d from step %" PRIu64 "; its stall "
                         "is known %d steps after its first", L->epoch, L->dp, L->pp, L->lease,
                         LOOP_LATER_STEPS);
}

/* "node-3 was noticed", "node-1 and node-2 were lost": the positioned workers that are lost
 * (lost = true: dead, or failed when none is dead) or leaving, by the node names the cloud
 * gave, for an event's "because". */
static void who(struct coord_loop *L, const struct wv *v, size_t nv, bool lost,
                const char *verb, char *buf, size_t size) {
    size_t k = 0;
    int n = 0;
    bool anydead = false; /* lost: the dead ones; the survivors whose step failed only if none */
    for (size_t i = 0; i < nv; i++)
        anydead |= v[i].positioned && v[i].dead;
    buf[0] = '\0';
    for (size_t i = 0; i < nv && k < size; i++) {
        if (!v[i].positioned ||
            (lost ? !(v[i].dead || (!anydead && v[i].failed)) : v[i].dead || !v[i].leaving))
            continue;
        const struct linst *x =
            v[i].w.instance_id[0] ? loop__inst_find(L, v[i].w.instance_id) : NULL;
        const char *name = x && x->node[0] ? x->node
                           : v[i].w.instance_id[0] ? v[i].w.instance_id : v[i].w.id;
        int w = (x && x->node[0]) || v[i].w.instance_id[0] ? 63 : 8; /* worker ids: a prefix */
        k += (size_t)snprintf(buf + k, size - k, "%s%.*s", n ? ", " : "", w, name);
        n++;
    }
    if (n == 0)
        snprintf(buf, size, "a worker was %s", verb);
    else if (k < size)
        snprintf(buf + k, size - k, " %s %s", n > 1 ? "were" : "was", verb);
}

/* Extends every positioned worker's lease to `to`, in one journal transaction. */
static void grant(struct coord_loop *L, const struct wv *v, size_t nv, uint64_t to) {
    const char **ids = st_calloc(nv + 1, sizeof(*ids));
    size_t n = 0;
    for (size_t i = 0; i < nv; i++) {
        if (!v[i].positioned || v[i].dead)
            continue;
        if (ids)
            ids[n++] = v[i].w.id;
        else /* no memory for the list: one transaction each, as before */
            (void)coord_migrate(L->c, v[i].w.id, NULL, 0, to, NULL);
    }
    if (ids)
        (void)coord_grant_lease(L->c, ids, n, to);
    st_free(ids);
    L->lease = to;
}

static void phase_running(struct coord_loop *L, const struct wv *v, size_t nv, double now) {
    uint64_t minstep = UINT64_MAX, maxstep = 0, progress = 0; /* progress: the steps summed */
    double slowest = 0; /* the slowest positioned worker's last step, seconds */
    int navail = 0, npos = 0;
    bool dead = false, leaving = false;
    for (size_t i = 0; i < nv; i++) {
        if (!v[i].dead && !v[i].leaving && v[i].w.state != COORD_WORKER_STOPPED)
            navail++;
        if (!v[i].positioned)
            continue;
        npos++;
        if (v[i].dead || v[i].failed)
            dead = true;
        else if (v[i].leaving)
            leaving = true;
        minstep = ST_MIN(minstep, v[i].step);
        maxstep = ST_MAX(maxstep, v[i].step);
        progress += v[i].step;
        slowest = ST_MAX(slowest, v[i].step_seconds);
        if (v[i].w.stage == L->pp - 1 && v[i].w.replica == 0 && v[i].step > 0) {
            L->st.loss = v[i].loss;
            L->sum.final_loss = v[i].loss;
            if (!isfinite(L->sum.first_loss))
                L->sum.first_loss = v[i].loss;
        }
    }
    if (npos == 0)
        minstep = 0;
    if (npos > 0)
        L->max_step = ST_MAX(L->max_step, maxstep);
    loop__stall_done(L, v, nv, minstep >= L->total);
    if (minstep > L->fail_at)
        L->restore_tries = 0; /* progress past every failed boundary: failures are not a loop */
    L->st.step = minstep;
    L->sum.steps = minstep;
    /* throughput estimate */
    if (minstep > L->rate_step && now > L->rate_t) {
        double inst = (double)(minstep - L->rate_step) / (now - L->rate_t);
        L->steps_per_s = L->steps_per_s > 0 ? 0.7 * L->steps_per_s + 0.3 * inst : inst;
        L->rate_step = minstep;
        L->rate_t = now;
    }
    L->st.samples_per_s = L->steps_per_s * L->cfg.spec.training.global_batch;
    /* A failed step alone usually means a peer died and is not known dead yet (the provider
     * or the heartbeat tells a moment later): a restore ordered now would count it alive and
     * fail on it. Wait a little for the loss to show, never long. */
    bool gone = false;
    for (size_t i = 0; i < nv; i++)
        gone = gone || (v[i].positioned && v[i].dead);
    if (dead && !gone && L->failed_since == 0)
        L->failed_since = now;
    if (!dead)
        L->failed_since = L->lost_since = 0;
    if (dead && !gone && now - L->failed_since < LOOP_FAILED_GRACE)
        return;
    if (dead && L->cfg.spec.fault_tolerance.peer_copy_every > 0 &&
        !loop__copies_heard(L, v, nv, now))
        return;
    /* The watchdog: positioned workers, none dead, steps leased to them, and no step for
     * reconfig_timeout (or ten of the slowest worker's steps, when longer). A worker stuck
     * where nothing tells the loop (a lost order, a wait on an old epoch) would otherwise hold
     * the job still for ever; the epoch fails as a dead worker's does, and the job restores. */
    if (progress != L->run_progress || L->run_seen != L->epoch || minstep >= L->lease ||
        L->run_alive <= 0) {
        L->run_progress = progress;
        L->run_alive = now;
        L->run_seen = L->epoch;
    } else if (!dead && npos > 0 && slowest > 0 &&
               now - L->run_alive > ST_MAX(L->cfg.reconfig_timeout, 10 * slowest)) {
        char why[120];
        snprintf(why, sizeof(why), "no step for %.0f s", now - L->run_alive);
        loop__event(L, "epoch %" PRIu64 " (%dx%d): %s at step %" PRIu64 " with steps leased "
                    "to %" PRIu64 "; restoring", L->epoch, L->dp, L->pp, why, minstep, L->lease);
        L->run_alive = now;
        if (failed_try(L, minstep, now))
            return;
        if (loop__start_peer_restore(L, v, nv, now, why) < 0)
            (void)loop__start_restore(L, v, nv, now, why);
        return;
    }
    if (dead) {
        L->failed_since = 0;
        L->lost_since = 0;
        char lost[120];
        who(L, v, nv, true, "lost", lost, sizeof(lost));
        int r = loop__start_peer_restore(L, v, nv, now, lost);
        if (r < 0)
            (void)loop__start_restore(L, v, nv, now, lost);
        return;
    }
    if (minstep >= L->total) {
        if (L->cfg.save_dir[0] && !L->save_ordered) {
            (void)coord_checkpoint(L->c, L->cfg.save_dir, L->total);
            L->save_ordered = true;
            L->phase = PH_FINISH_SAVE;
            L->stop_at = now;
            loop__event(L, "all %" PRIu64 " steps done; saving to '%s'", L->total,
                        L->cfg.save_dir);
            return;
        }
        loop__event(L, "all %" PRIu64 " steps done", L->total);
        L->sum.finished = true;
        loop__shape_time(L, now);
        (void)coord_stop(L->c, "job finished");
        L->phase = PH_STOPPING;
        L->stop_at = now;
        return;
    }
    if (L->cancel) {
        loop__shape_time(L, now);
        (void)coord_stop(L->c, "cancelled");
        L->phase = PH_STOPPING;
        L->stop_at = now;
        return;
    }
    /* Re-plan: a noticed worker (immediately), a forced change reached, a new interval, or a
     * changed membership. The boundary is the lease already granted. */
    uint64_t fnext = loop__forced_next(L, L->lease);
    const struct coord_loop_forced *fnow = loop__forced_at(L, L->lease); /* NULL: none */
    bool forced_due = fnow && (fnow->dp != L->dp || fnow->pp != L->pp);
    bool interval = now >= L->next_plan;
    pthread_mutex_lock(&L->lock);
    bool member = L->membership || navail != L->planned_avail;
    L->membership = false;
    pthread_mutex_unlock(&L->lock);
    bool last = L->lease >= L->total; /* every step is leased: a new shape gains nothing */
    if (!last && (leaving || forced_due || ((interval || member) && L->cfg.nforced == 0))) {
        if (interval)
            L->next_plan = now + L->cfg.spec.planner.interval * L->cfg.time_scale;
        L->planned_avail = navail;
        int dp, pp;
        char why[200];
        loop__choose_shape(L, navail, L->lease, v, nv, now, &dp, &pp, why, sizeof(why));
        if (dp >= 1 && (leaving || dp != L->dp || pp != L->pp)) {
            char noticed[120];
            if (leaving)
                who(L, v, nv, false, "noticed", noticed, sizeof(noticed));
            (void)loop__start_migrate(L, v, nv, dp, pp, now, leaving ? noticed : why, NULL);
            return;
        }
    }
    /* Durable checkpoint at the lease boundary. */
    if (L->cfg.ckpt_interval > 0 && L->cfg.ckpt_root[0] && now - L->last_ckpt >=
        L->cfg.ckpt_interval && L->lease > 0 && L->lease < L->total && L->lease > minstep &&
        L->lease != L->last_ckpt_step) { /* the same boundary again would add nothing */
        char dir[ST_SPEC_PATH_MAX + 32];
        snprintf(dir, sizeof(dir), "%s/step-%" PRIu64, L->cfg.ckpt_root, L->lease);
        if (coord_checkpoint(L->c, dir, L->lease) > 0) {
            loop__set_status(L, "checkpoint at step %" PRIu64 " ordered", L->lease);
            L->ckpt_pending = true; /* an older pending one is abandoned (stays torn) */
            L->ckpt_pend_step = L->lease;
            L->ckpt_pend_dp = L->dp;
            L->ckpt_pend_pp = L->pp;
            snprintf(L->ckpt_pend_dir, sizeof(L->ckpt_pend_dir), "%s", dir);
        }
        /* The one just ordered is not committed yet: keep `keep` committed ones besides. */
        if (L->cfg.ckpt_prune)
            (void)L->cfg.ckpt_prune(L->cfg.ckpt_userdata, L->cfg.ckpt_root,
                                    L->cfg.spec.checkpoint.keep > 0
                                        ? L->cfg.spec.checkpoint.keep : 2);
        L->last_ckpt_step = L->lease;
        L->last_ckpt = now;
    }
    /* Lease: about lease_seconds of steps ahead of the slowest worker. */
    if (now - L->last_grant >= 0.05 || minstep >= L->lease) {
        uint64_t w = loop__lease_window(L, v, nv);
        uint64_t to = ST_MIN(L->total, minstep + w);
        if (fnext && to > fnext)
            to = fnext;
        /* Extend once half the window is used: fewer commands, never a dry lease. */
        if (to > L->lease && (L->lease < minstep + w / 2 || to == L->total || to == fnext)) {
            grant(L, v, nv, to);
            L->last_grant = now;
        }
    }
}

/* After a coordinator restart: the workers stop at the lease the previous incarnation granted.
 * Wait until every positioned worker reports the same step for a while; that step is the
 * lease. */
static void phase_resync(struct coord_loop *L, const struct wv *v, size_t nv, double now) {
    uint64_t lo = UINT64_MAX, hi = 0;
    bool dead = false, unheard = false;
    int npos = 0;
    for (size_t i = 0; i < nv; i++) {
        if (!v[i].positioned)
            continue;
        npos++;
        dead |= v[i].dead || v[i].failed;
        /* A step this loop has not heard in this epoch is not one: the table's is the last
         * the journal knew (0 for an epoch its workers were still entering). Resuming there
         * once left the lease behind the workers and the job without progress (chaos-short,
         * a coordinator killed mid-recovery). */
        unheard |= !v[i].reported;
        lo = ST_MIN(lo, v[i].step);
        hi = ST_MAX(hi, v[i].step);
    }
    if (dead || npos == 0 || now - L->resync_since > L->cfg.reconfig_timeout) {
        loop__event(L, "resync after restart failed; restoring");
        L->need_restore = true;
        L->phase = PH_WAIT_FIRST;
        return;
    }
    if (unheard) {
        L->resync_step = UINT64_MAX;
        L->resync_changed = now;
        return;
    }
    if (lo != hi || lo != L->resync_step) {
        L->resync_step = lo == hi ? lo : UINT64_MAX;
        L->resync_changed = now;
        return;
    }
    /* Quiet for more than two report intervals (deadline / 4 each): nobody is still moving. */
    double quiet = ST_MAX(1.5, 0.6 * L->cfg.spec.coordinator.heartbeat_deadline);
    if (now - L->resync_changed < quiet)
        return;
    L->lease = lo;
    L->rate_step = lo;
    L->rate_t = now;
    L->shape_since = now;
    L->phase = PH_RUNNING;
    loop__cm_epoch_begin(L, L->fit ? plan_fit_step_seconds(L->fit, L->dp, L->pp) : 0,
                   L->fit_has_steps);
    loop__event(L, "resumed epoch %" PRIu64 " (%dx%d) at step %" PRIu64 " after a restart",
                L->epoch, L->dp, L->pp, lo);
}

/* While the n available workers cannot host any shape the spec allows, says so (an event when
 * the wait begins, the status line, GET /v1/job "waiting_reason", /metrics) and, after
 * planner.wait_limit of cloud time, stops the job with an error instead of waiting forever.
 * Returns true when it stopped the job. */
static bool wait_check(struct coord_loop *L, int n, double now) {
    const struct plan_feasibility *f = &L->feas;
    int need = f->smallest.dp * f->smallest.pp;
    if (f->nfeasible > 0 && n >= need) {
        if (L->waiting[0]) {
            L->waiting[0] = '\0';
            coord_set_waiting(L->c, "");
        }
        L->wait_since = 0;
        L->wait_told = false;
        return false;
    }
    char why[sizeof(L->waiting)];
    if (f->nfeasible == 0)
        snprintf(why, sizeof(why), "no (dp, pp) shape satisfies the spec (%s)", f->field);
    else
        snprintf(why, sizeof(why), "the smallest shape the spec allows needs %d worker%s, %d "
                 "alive", need, need == 1 ? "" : "s", n);
    if (L->wait_since == 0)
        L->wait_since = now;
    if (strcmp(why, L->waiting) != 0) {
        snprintf(L->waiting, sizeof(L->waiting), "%s", why);
        coord_set_waiting(L->c, why);
    }
    /* Workers joining one by one at the start are no news: the event is for a wait that
     * outlasts the first-workers grace, or any wait after training began. */
    bool grace = !L->need_restore && L->epoch == 0 && n < L->cfg.expect_workers &&
                 now - L->t0 < L->cfg.first_wait;
    if (!L->wait_told && !grace) {
        loop__event(L, "waiting: %s", why);
        L->wait_told = true;
    }
    double limit = L->cfg.spec.planner.wait_limit * L->cfg.time_scale;
    if (now - L->wait_since < limit)
        return false;
    snprintf(L->sum.error, sizeof(L->sum.error), "no fleet could host a shape the spec allows "
             "for %gs (planner.wait_limit): %s", L->cfg.spec.planner.wait_limit, why);
    loop__event(L, "%s; stopping", L->sum.error);
    (void)coord_stop(L->c, "wait limit");
    L->phase = PH_STOPPING;
    L->stop_at = now;
    return true;
}

static void phase_wait_first(struct coord_loop *L, const struct wv *v, size_t nv, double now) {
    int n = 0;
    for (size_t i = 0; i < nv; i++)
        n += !v[i].dead && !v[i].leaving && v[i].w.state != COORD_WORKER_STOPPED;
    if (L->cancel) {
        (void)coord_stop(L->c, "cancelled");
        L->phase = PH_STOPPING;
        L->stop_at = now;
        return;
    }
    if (n == 0) {
        /* Nobody left and nobody coming: the trace is over (or every worker crashed). */
        if (L->cfg.provider && alive_instances(L) == 0 &&
            cloud_provider_next_deadline(L->cfg.provider, loop__trace_now(L, now)) < 0 &&
            now - L->t0 > 2.0) {
            loop__event(L, "no instances left and none coming; giving up");
            (void)coord_stop(L->c, "no instances");
            L->phase = PH_STOPPING;
            L->stop_at = now;
            return;
        }
    }
    if (wait_check(L, n, now) || n == 0)
        return;
    if (!L->need_restore && L->epoch == 0 && n < L->cfg.expect_workers &&
        now - L->t0 < L->cfg.first_wait)
        return;
    L->planned_avail = n;
    if (L->need_restore && loop__start_peer_restore(L, v, nv, now, "state lost") == 0)
        return;
    (void)loop__start_restore(L, v, nv, now, L->need_restore ? "state lost" : "first epoch");
}

static void phase_stopping(struct coord_loop *L, const struct wv *v, size_t nv, double now) {
    bool all = true;
    for (size_t i = 0; i < nv; i++)
        if (!v[i].dead && v[i].w.state != COORD_WORKER_STOPPED)
            all = false;
    if (all || now - L->stop_at > 15.0)
        L->phase = PH_DONE;
}

static void phase_finish_save(struct coord_loop *L, const struct wv *v, size_t nv,
                              double now) {
    bool all = true, dead = false, failed = false;
    char why[200] = "";
    pthread_mutex_lock(&L->lock);
    for (size_t i = 0; i < nv; i++) {
        if (!v[i].positioned)
            continue;
        dead |= v[i].dead;
        struct lworker *w = loop__lw_get(L, v[i].w.id);
        if (v[i].failed && !failed) {
            failed = true;
            snprintf(why, sizeof(why), "%.8s: %s", v[i].w.id, w ? w->fail_why : "?");
        }
        if (!w || w->ckpt_step != L->total || strcmp(w->ckpt_dir, L->cfg.save_dir))
            all = false;
    }
    pthread_mutex_unlock(&L->lock);
    /* A worker that could not write its part, with nobody lost: the same write may fail again
     * (a full disk, a store that refuses us), and each try trains again from the last
     * checkpoint, so after COORD_LOOP_SAVE_TRIES the job stops unfinished, its periodic
     * checkpoints kept, rather than train for ever. */
    if (failed && !dead && ++L->save_failures >= COORD_LOOP_SAVE_TRIES) {
        snprintf(L->sum.error, sizeof(L->sum.error), "the final save to '%s' failed %d times "
                 "(last: worker %s)", L->cfg.save_dir, L->save_failures, why);
        loop__event(L, "%s; stopping", L->sum.error);
        loop__shape_time(L, now);
        (void)coord_stop(L->c, "the final save failed");
        L->phase = PH_STOPPING;
        L->stop_at = now;
        return;
    }
    if (dead || failed) {
        char reason[260] = "a worker was lost while saving";
        if (!dead)
            snprintf(reason, sizeof(reason), "the final save failed on worker %s", why);
        L->save_ordered = false;
        (void)loop__start_restore(L, v, nv, now, reason);
        return;
    }
    if (!all && now - L->stop_at < L->cfg.reconfig_timeout)
        return;
    L->sum.finished = all;
    loop__event(L, all ? "saved '%s'; stopping" : "saving '%s' timed out; stopping",
                L->cfg.save_dir);
    loop__shape_time(L, now);
    (void)coord_stop(L->c, "job finished");
    L->phase = PH_STOPPING;
    L->stop_at = now;
}

/* Commits the pending periodic checkpoint once every stage's writer reported its layers. */
static void ckpt_commit_check(struct coord_loop *L) {
    if (!L->ckpt_pending || !L->cfg.ckpt_commit)
        return;
    uint64_t seen = 0;
    int pp = L->ckpt_pend_pp;
    double took = 0; /* the slowest stage's write: the checkpoint's cost */
    pthread_mutex_lock(&L->lock);
    for (size_t i = 0; i < L->nlw; i++) {
        const struct lworker *w = &L->lw[i];
        if (w->ckw_step == L->ckpt_pend_step && !strcmp(w->ckw_dir, L->ckpt_pend_dir) &&
            w->ckw_stage >= 0 && w->ckw_stage < pp && w->ckw_stage < 64) {
            seen |= 1ull << w->ckw_stage;
            took = ST_MAX(took, w->ckw_seconds);
        }
    }
    pthread_mutex_unlock(&L->lock);
    if (pp > 64 || seen != (pp == 64 ? ~0ull : (1ull << pp) - 1))
        return;
    L->ckpt_pending = false;
    int r = L->cfg.ckpt_commit(L->cfg.ckpt_userdata, L->ckpt_pend_dir, L->ckpt_pend_step,
                               L->ckpt_pend_dp, pp);
    if (r < 0)
        loop__event(L, "checkpoint at step %" PRIu64 " could not be committed: %s",
                    L->ckpt_pend_step, st_strerror(r));
    else {
        /* One line per checkpoint, not one per stage that wrote it. A restore to an older
         * step replays steps a checkpoint was already taken at, and takes it again (the same
         * bits: data order is a function of the step); the line says so. */
        char tb[32];
        loop__event(L, "checkpoint at step %" PRIu64 " written%s: %d stage%s in %s",
                    L->ckpt_pend_step,
                    L->ckpt_pend_step <= L->ckpt_top ? " again (a restore replayed past it)" : "",
                    pp, pp == 1 ? "" : "s", loop__fmt_secs(tb, sizeof(tb), took));
        L->ckpt_top = ST_MAX(L->ckpt_top, L->ckpt_pend_step);
    }
}

/* ---- public --------------------------------------------------------------------------------- */

/* See coord-loop.h. */
int coord_loop_tick(struct coord_loop *L, double now) {
    struct wv *v = NULL;
    size_t nv = 0;
    if (!L || L->magic != LOOP_MAGIC || !L->c)
        return -EINVAL;
    if (L->t0 == 0) {
        L->t0 = now;
        L->next_plan = now + L->cfg.spec.planner.interval * L->cfg.time_scale;
        L->last_ckpt = now;
        L->rate_t = now;
    }
    int alive = alive_instances(L);
    if (L->last_tick > 0 && alive > 0) {
        double hours = (now - L->last_tick) / L->cfg.time_scale / 3600.0 * alive;
        L->sum.instance_hours += hours;
        double live;
        L->sum.on_demand_dollars += hours * L->cfg.spec.fleet.on_demand_price;
        if (cloud_provider_price(L->cfg.provider, &live) == 0 && live > 0) {
            L->sum.spot_price_live = live;
            L->sum.spot_dollars += hours * live;
            coord_metrics_add_spend_live(L->c, hours, live);
        } else {
            L->sum.spot_dollars += hours * L->cfg.spec.fleet.spot_price;
            coord_metrics_add_spend(L->c, hours * L->cfg.spec.fleet.spot_price);
        }
    }
    L->last_tick = now;
    if (L->cfg.hold_trace && L->run_epoch == 0 && L->phase != PH_RESYNC)
        L->hold = now - ST_MIN(L->prov_t0 > 0 ? L->prov_t0 : L->t0, now); /* time 0 fires */
    TRY(poll_provider(L, now));
    TRY(view_get(L, &v, &nv));
    /* History of live counts, one per planning interval. */
    int live = 0;
    for (size_t i = 0; i < nv; i++)
        live += !v[i].dead;
    double interval = L->cfg.spec.planner.interval * L->cfg.time_scale;
    int want = (int)((loop__trace_now(L, now) - L->t0) / (interval > 0 ? interval : 1)) + 1;
    while (L->nhist < want && L->nhist < LOOP_MAX_HIST)
        L->hist[L->nhist++] = alive >= 0 ? alive : live;
    L->st.alive = alive >= 0 ? alive : live;
    coord_metrics_set_instances(L->c, L->forecast > 0 ? L->forecast : L->st.alive, L->st.alive);
    int noticed = 0;
    for (size_t i = 0; i < L->ninst; i++)
        noticed += L->inst[i].noticed && !L->inst[i].dead;
    coord_metrics_set_noticed(L->c, noticed);
    loop__cm_publish(L);

    ckpt_commit_check(L);
    if (L->peer_refused && !L->peer_refused_said) {
        L->peer_refused_said = true;
        loop__event(L, "peer copies do not fit: %" PRIu64 " bytes per worker, "
                    "fault_tolerance.peer_copy_memory is %" PRIu64 "; an unannounced loss restores "
                    "from the disk checkpoint", L->peer_refused_need,
                    L->cfg.spec.fault_tolerance.peer_copy_memory);
    }
    switch (L->phase) {
    case PH_WAIT_FIRST: phase_wait_first(L, v, nv, now); break;
    case PH_RESYNC: phase_resync(L, v, nv, now); break;
    case PH_RUNNING: phase_running(L, v, nv, now); break;
    case PH_RECONF: phase_reconf(L, v, nv, now); break;
    case PH_FINISH_SAVE: phase_finish_save(L, v, nv, now); break;
    case PH_STOPPING: phase_stopping(L, v, nv, now); break;
    case PH_DONE: break;
    }
    st_free(v);
    L->sum.wall_seconds = now - L->t0;
    L->sum.samples = L->sum.steps * (uint64_t)L->cfg.spec.training.global_batch;
    L->st.epoch = L->epoch;
    L->st.total = L->total;
    L->st.dp = L->dp;
    L->st.pp = L->pp;
    L->st.forecast = L->forecast > 0 ? L->forecast : L->st.alive;
    snprintf(L->st.phase, sizeof(L->st.phase), "%s", phase_name(L->phase));
    snprintf(L->st.waiting, sizeof(L->st.waiting), "%s",
             L->phase == PH_WAIT_FIRST ? L->waiting : "");
    return L->phase == PH_DONE ? 1 : 0;
}

/* See coord-loop.h. */
int coord_loop_new(const struct coord_loop_config *cfg, struct coord_loop **ret) {
    if (!cfg || !ret)
        return -EINVAL;
    struct coord_loop *L = st_calloc(1, sizeof(*L));
    if (!L)
        return -ENOMEM;
    L->magic = LOOP_MAGIC;
    L->cfg = *cfg;
    if (L->cfg.steps > 0)
        L->cfg.spec.training.steps = L->cfg.steps;
    if (L->cfg.time_scale <= 0)
        L->cfg.time_scale = L->cfg.spec.fleet.time_scale > 0 ? L->cfg.spec.fleet.time_scale : 1;
    if (L->cfg.reconfig_timeout <= 0)
        L->cfg.reconfig_timeout = 30;
    if (L->cfg.lease_seconds <= 0)
        L->cfg.lease_seconds = 0.5;
    if (L->cfg.expect_workers <= 0)
        L->cfg.expect_workers = 1;
    if (L->cfg.first_wait <= 0)
        L->cfg.first_wait = 20;
    if (L->cfg.spec.planner.interval <= 0)
        L->cfg.spec.planner.interval = PLAN_INTERVAL_S;
    L->total = (uint64_t)L->cfg.spec.training.steps;
    const struct st_spec_model *m = &L->cfg.spec.model;
    int nl = plan_mig_gpt_layer_params((uint32_t)m->layers, (uint32_t)m->hidden,
                                       (uint32_t)m->vocab, (uint32_t)m->seq_len, L->layer_params);
    if (nl < 0 || L->total == 0 || L->cfg.nforced < 0 || L->cfg.nforced > COORD_LOOP_MAX_FORCED) {
        st_free(L);
        return -EINVAL;
    }
    L->nlayers = nl;
    /* The same rules validate applied: the loop searches only shapes they allow. */
    if (plan_rules_from_spec(&L->cfg.spec, true, &L->rules) < 0 ||
        plan_rules_from_spec(&L->cfg.spec, false, &L->rules_forced) < 0 ||
        plan_feasible(&L->cfg.spec, &L->feas) < 0) {
        st_free(L);
        return -EINVAL;
    }
    /* One vocabulary, the planner's: an unknown name is an error, never a silent default. */
    if (plan_predictor_parse(L->cfg.spec.planner.predictor, &L->predictor) < 0) {
        st_free(L);
        return -EINVAL;
    }
    int fr = L->cfg.cost ? plan_fit_new(L->cfg.cost, &L->fit) : 0;
    if (fr >= 0 && L->fit && L->cfg.migration_costs)
        fr = plan_fit_start_costs(L->fit, L->cfg.migration_costs);
    if (fr < 0) {
        plan_fit_free(L->fit);
        st_free(L);
        return fr;
    }
    L->sum.final_loss = NAN;
    L->sum.first_loss = NAN;
    L->st.loss = NAN;
    L->chain = L->stall_rec = -1;
    pthread_mutex_init(&L->lock, NULL);
    *ret = L;
    return 0;
}

/* See coord-loop.h. */
int coord_loop_attach(struct coord_loop *L, struct coord *c) {
    if (!L || L->magic != LOOP_MAGIC || !c)
        return -EINVAL;
    L->c = c;
    uint64_t epoch = 0, step = 0;
    int dp = 0, pp = 0;
    enum coord_job_state js;
    coord_job_get(c, NULL, &epoch, &dp, &pp, &js, &step);
    if (epoch > 0 && dp > 0 && pp > 0) {
        /* A restarted coordinator: the epoch in force and its split come from the journal. */
        struct coord_worker *w = NULL;
        size_t n = 0;
        TRY(coord_workers_get(c, &w, &n));
        for (int s = 0; s <= pp; s++)
            L->split[s] = -1;
        L->split[pp] = L->nlayers;
        for (size_t i = 0; i < n; i++)
            if (w[i].state == COORD_WORKER_ACTIVE && w[i].epoch == epoch && w[i].stage >= 0 &&
                w[i].stage < pp)
                L->split[w[i].stage] = w[i].layer_begin;
        st_free(w);
        bool ok = L->split[0] == 0;
        for (int s = 1; s < pp; s++)
            ok = ok && L->split[s] > L->split[s - 1];
        L->epoch = epoch;
        L->dp = dp;
        L->pp = pp;
        if (!ok) {
            loop__split_for(L, pp, L->split);
            L->need_restore = true;
            L->phase = PH_WAIT_FIRST;
        } else {
            L->phase = PH_RESYNC;
            L->resync_since = st_now();
            L->resync_step = UINT64_MAX;
        }
        L->planned_avail = -1;
    }
    return 0;
}

/* See coord-loop.h. */
void coord_loop_set_provider(struct coord_loop *L, struct cloud_provider *p) {
    if (L) {
        L->cfg.provider = p;
        L->prov_t0 = st_now(); /* the trace's time 0 (see hold) */
    }
}

/* See coord-loop.h. */
void coord_loop_set_ckpt_root(struct coord_loop *L, const char *root) {
    if (L && root)
        snprintf(L->cfg.ckpt_root, sizeof(L->cfg.ckpt_root), "%s", root);
}

/* See coord-loop.h. */
void coord_loop_cancel(struct coord_loop *L) {
    if (L)
        L->cancel = true;
}

/* See coord-loop.h. */
int coord_loop_event_next(struct coord_loop *L, uint64_t *cursor, char *buf, size_t size) {
    if (!L || !cursor || !buf || size == 0)
        return -EINVAL;
    if (*cursor >= L->nevents)
        return 0;
    uint64_t skipped = 0;
    if (L->nevents - *cursor > LOOP_EVENTS) {
        skipped = L->nevents - LOOP_EVENTS - *cursor;
        *cursor = L->nevents - LOOP_EVENTS;
    }
    if (skipped)
        snprintf(buf, size, "(%" PRIu64 " older events not shown) %s", skipped,
                 L->events[*cursor % LOOP_EVENTS]);
    else
        snprintf(buf, size, "%s", L->events[*cursor % LOOP_EVENTS]);
    (*cursor)++;
    return 1;
}

/* See coord-loop.h. */
void coord_loop_summary(struct coord_loop *L, struct coord_loop_summary *ret) {
    *ret = L->sum;
    pthread_mutex_lock(&L->lock);
    loop__cm_account(L, ret); /* the epoch still running */
    pthread_mutex_unlock(&L->lock);
    ret->cost_model.fitted_ok = L->fit && plan_fit_costs(L->fit, &ret->cost_model.fitted) == 0;
}

/* See coord-loop.h. */
void coord_loop_status(struct coord_loop *L, struct coord_loop_status *ret) {
    *ret = L->st;
}

/* See coord-loop.h. */
struct coord_loop *coord_loop_free(struct coord_loop *L) {
    if (!L)
        return NULL;
    pthread_mutex_destroy(&L->lock);
    plan_fit_free(L->fit);
    st_free(L->lw);
    st_free(L->inst);
    st_free(L->rc.part);
    st_free(L->rc.pos);
    st_free(L->run_pos);
    st_free(L->prev_pos);
    L->magic = 0;
    st_free(L);
    return NULL;
}

/* See coord-loop.h. */
int coord_loop_parse_forced(const char *s, struct coord_loop_forced *ret, int max) {
    int n = 0;
    const char *p = s;
    if (!s || !*s)
        return -EINVAL;
    while (*p) {
        char *e;
        unsigned long long step = strtoull(p, &e, 10);
        if (e == p || *e != ':' || n >= max)
            return -EINVAL;
        p = e + 1;
        long dp = strtol(p, &e, 10);
        if (e == p || (*e != 'x' && *e != 'X') || dp < 1 || dp > 4096)
            return -EINVAL;
        p = e + 1;
        long pp = strtol(p, &e, 10);
        if (e == p || pp < 1 || pp > 4096 || (*e && *e != ','))
            return -EINVAL;
        if (n > 0 && step <= ret[n - 1].step)
            return -EINVAL;
        ret[n].step = step;
        ret[n].dp = (int)dp;
        ret[n].pp = (int)pp;
        n++;
        p = *e ? e + 1 : e;
        if (*e == ',' && !*p)
            return -EINVAL;
    }
    return n;
}
