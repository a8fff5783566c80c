/* loop-stall.c: what a reconfiguration cost. When its participants all reported (or it
 * failed), its record and counts go to the summary (loop__record_done); once the epoch that
 * ended the chain of reconfigurations has made its first steps, the chain's stall as
 * shared/DESIGN.md defines it (loop__stall_done): into the summary, /metrics, the fitted cost
 * model (loop-cost.c) and the epoch's one event line. The loop's thread calls both, with the
 * workers' figures the hooks (loop-hooks.c) keep under L->lock. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h> /* qsort */
#include <string.h>

#include "loop-internal.h"

/* The end of a reconfiguration (its participants all reported, or it failed). Counts and wire
 * bytes go to the summary now; the stall only once the epoch that ended the chain of
 * reconfigurations made its first step (loop__stall_done()). */
void loop__record_done(struct coord_loop *L, bool ok, uint64_t moved, double now) {
    struct coord_loop_record *rec = &L->rc.rec;
    rec->ok = ok;
    rec->moved_bytes = moved;
    rec->stall_seconds = 0;
    rec->seconds = now - L->rc.started;
    struct coord_loop_summary *S = &L->sum;
    bool first = (rec->kind == PLAN_RECONF_CHECKPOINT_RESTORE ||
                  rec->kind == PLAN_RECONF_FRESH_START) && !L->rc.restore;
    if (S->nrecords < COORD_LOOP_MAX_RECORDS) {
        S->records[S->nrecords++] = *rec;
        if (L->chain < 0)
            L->chain = S->nrecords - 1;
        L->stall_rec = ok && !first ? S->nrecords - 1 : -1;
        snprintf(L->stall_why, sizeof(L->stall_why), "%s", L->rc.why);
        if (first)
            L->chain = -1; /* the job's start: no stall to speak of */
    }
    if (!ok || first)
        return;
    S->count[rec->kind]++;
    S->bytes[rec->kind] += moved;
    S->replayed[rec->kind] += rec->steps_replayed;
    if (rec->dp_reshard) {
        S->count[PLAN_RECONF_DP_RESHARDING]++;
        S->bytes[PLAN_RECONF_DP_RESHARDING] += moved;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Once every positioned worker of the running epoch reported its first step and LOOP_LATER_STEPS
 * steps after it: the stall of the chain of reconfigurations that led to it (shared/DESIGN.md):
 * the longest span from a worker's last step before the chain to the end of its first step in this
 * epoch, minus the epoch's median step time, the median of those later steps' times. Not of the
 * first steps: a pipeline's first step waits for its neighbours, so a new stage's wait for its
 * parameters is in every first step, and a median of them took part of it back out of the stall
 * (with two workers, half); and every first step shares the cores with the move after the
 * boundary. With settle (the epoch ends: the next reconfiguration is done or failed, or the job's
 * last step), the later steps that came stand, or with none the first steps' own times. Every
 * record of the chain (failed ones too) shows it; the summary counts it once, under the kind of
 * the epoch that ended the chain. */
void loop__stall_done(struct coord_loop *L, const struct wv *v, size_t nv, bool settle) {
    struct coord_loop_summary *S = &L->sum;
    if (L->stall_rec < 0 || L->chain < 0 || S->records[L->stall_rec].epoch != L->epoch)
        return;
    /* The epoch's positions: while the next reconfiguration is being ordered the workers'
     * rows already name its epoch, but they train on in this one until its boundary. */
    bool by_run = L->phase == PH_RECONF;
    if (by_run && (L->run_epoch != L->epoch || !L->run_pos))
        return;
    double span = 0, span_new = 0, steps[64 * LOOP_LATER_STEPS], firsts[64];
    struct coord_loop_stall_parts parts = {0}, parts_new = {0};
    uint64_t prewarmed = 0;
    double after = 0, waited = 0;
    int ns = 0, nl = 0;
    bool all = true, old = false, later = true;
    pthread_mutex_lock(&L->lock);
    for (size_t i = 0; i < nv && all; i++) {
        bool positioned = v[i].positioned;
        if (by_run) {
            positioned = false;
            for (int p = 0; p < L->run_dp * L->run_pp && !positioned; p++)
                positioned = !strcmp(L->run_pos[p], v[i].w.id);
        }
        if (!positioned || v[i].dead)
            continue;
        struct lworker *w = loop__lw_get(L, v[i].w.id);
        const struct lfirst *fh = NULL;
        for (int j = 0; w && j < 2 && !fh; j++)
            if (w->fh[j].epoch == L->epoch)
                fh = &w->fh[j];
        if (!fh) {
            all = false;
            break;
        }
        /* Only a worker that trained in the epoch before knows when its last step ended; a
         * spare's last step may be epochs old, a new worker has none (it counts from its
         * order, a lower bound used only when nobody else knows better). */
        bool was = false;
        for (int p = 0; p < L->prev_n && !was; p++)
            was = !strcmp(L->prev_pos[p], v[i].w.id);
        /* The parts are those of the worker whose span sets the stall. */
        struct coord_loop_stall_parts wp = {0};
        for (int j = 0; j < 2; j++)
            if (w->rh[j].epoch == L->epoch) {
                wp = w->rh[j].parts;
                prewarmed += w->rh[j].prewarmed;
                after = ST_MAX(after, w->rh[j].deferred);
                waited = ST_MAX(waited, w->rh[j].waited);
            }
        if (was) {
            if (!old || fh->seconds > span) {
                span = fh->seconds;
                parts = wp;
            }
            old = true;
        } else if (fh->seconds > span_new) {
            span_new = fh->seconds;
            parts_new = wp;
        }
        if (ns < (int)ST_ARRAY_SIZE(firsts)) {
            later = later && fh->nlater == LOOP_LATER_STEPS;
            for (int j = 0; j < fh->nlater; j++)
                steps[nl++] = fh->later[j];
            firsts[ns++] = fh->step_seconds;
        }
    }
    pthread_mutex_unlock(&L->lock);
    if (!old) {
        span = span_new;
        parts = parts_new;
    }
    if (!all || ns == 0 || (!later && !settle))
        return;
    /* Settling: whatever later steps came, else the first steps' own times. */
    bool of_later = nl > 0;
    double *st = of_later ? steps : firsts;
    int n = of_later ? nl : ns;
    qsort(st, (size_t)n, sizeof(st[0]), cmp_double);
    double med = n % 2 ? st[n / 2] : 0.5 * (st[n / 2 - 1] + st[n / 2]);
    double stall = ST_MAX(0.0, span - med);
    parts.rest = stall - (parts.wait + parts.connect + parts.reshape + parts.transfer +
                          parts.commit);
    for (int i = L->chain; i <= L->stall_rec; i++) {
        S->records[i].stall_seconds = stall;
        S->records[i].stall_span = span;
        S->records[i].stall_step = med;
        S->records[i].stall_step_from =
            of_later ? COORD_LOOP_STEP_FROM_LATER : COORD_LOOP_STEP_FROM_FIRST;
    }
    S->records[L->stall_rec].parts = parts;
    S->records[L->stall_rec].prewarmed_bytes = prewarmed;
    S->records[L->stall_rec].after_seconds = after;
    S->records[L->stall_rec].after_waited = waited;
    struct coord_loop_record *rec = &S->records[L->stall_rec];
    st_log(ST_LOG_INFO, "loop", "Epoch %" PRIu64 " stall %.6f s: wait %.6f connect %.6f "
           "reshape %.6f transfer %.6f commit %.6f rest %.6f (step median %.6f, of %s)",
           L->epoch, stall, parts.wait, parts.connect, parts.reshape, parts.transfer,
           parts.commit, parts.rest, med, of_later ? "later steps" : "first steps");
    S->stall[rec->kind] += stall;
    if (rec->dp_reshard)
        S->stall[PLAN_RECONF_DP_RESHARDING] += stall;
    coord_metrics_add_migration(L->c, rec->kind, rec->moved_bytes, stall,
                                rec->steps_replayed);
    loop__cm_migration(L, rec, rec->moved_bytes, stall);
    /* The epoch's one line: what ran, what it cost, and why. Epochs of the chain that the
     * next one replaced before their first step get theirs first (their stall is the
     * chain's, counted once under the last). */
    char mb[32], sb[32];
    loop__fmt_secs(sb, sizeof(sb), stall);
    for (int i = L->chain; i < L->stall_rec; i++) {
        const struct coord_loop_record *e = &S->records[i];
        loop__fmt_bytes(mb, sizeof(mb), e->moved_bytes);
        loop__event(L, "epoch %" PRIu64 ": %s%s%s %dx%d -> %dx%d at step %" PRIu64 ", %s, %s; "
                    "replaced by epoch %" PRIu64 " before its first step (because %s)", e->epoch,
                    plan_reconf_name(e->kind),
                    loop__kind_is_migration(e->kind) ? " migration" : "",
                    e->ok ? "" : " (failed)", e->from_dp,
                    e->from_pp, e->to_dp, e->to_pp, e->at_step, mb,
                    e->ok ? "done" : "not done", L->epoch, e->reason);
    }
    loop__fmt_bytes(mb, sizeof(mb), rec->moved_bytes);
    if (rec->kind == PLAN_RECONF_CHECKPOINT_RESTORE || rec->kind == PLAN_RECONF_FRESH_START)
        loop__event(L, "epoch %" PRIu64 ": %s, running %dx%d from step %" PRIu64 ", %s stall, %s",
                    L->epoch,
                    rec->kind == PLAN_RECONF_CHECKPOINT_RESTORE ? "checkpoint restore"
                                                              : "restart from scratch",
                  rec->to_dp, rec->to_pp, rec->at_step, sb, L->stall_why);
    else
        loop__event(L, "epoch %" PRIu64 ": %s%s %dx%d -> %dx%d at step %" PRIu64 ", %s, %s "
                    "stall, %s", L->epoch, plan_reconf_name(rec->kind),
                    loop__kind_is_migration(rec->kind) ? " migration" : "", rec->from_dp,
                    rec->from_pp, rec->to_dp, rec->to_pp, rec->at_step, mb, sb, L->stall_why);
    L->chain = L->stall_rec = -1;
}
