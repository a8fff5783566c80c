/* loop-hooks.c: what the planning loop learns from workers' reports and notices. These are
 * the coordinator's hooks: its completion-queue thread calls them without the coordinator's
 * lock, and they take L->lock. A notice is a kind and typed figures (struct
 * st_notice_figures: worker/runner.c fills them); its detail is for people and not read here. */
#include <stdio.h>
#include <string.h>

#include "loop-internal.h"

struct lworker *loop__lw_get(struct coord_loop *L, const char *id) {
    for (size_t i = 0; i < L->nlw; i++)
        if (!strcmp(L->lw[i].id, id))
            return &L->lw[i];
    if (ST_GROW(L->lw, L->nlw, L->caplw, 16) < 0)
        return NULL;
    struct lworker *w = &L->lw[L->nlw++];
    memset(w, 0, sizeof(*w));
    snprintf(w->id, sizeof(w->id), "%s", id);
    return w;
}

static void hook_report(struct coord *c, const struct coord_report *r, void *userdata) {
    struct coord_loop *L = userdata;
    (void)c;
    pthread_mutex_lock(&L->lock);
    struct lworker *w = loop__lw_get(L, r->worker_id);
    if (w && r->step_seconds > 0 && r->step != w->step && r->epoch == L->ep_epoch) {
        if (w->meas_epoch == r->epoch) {
            L->ep_step_sum += r->step_seconds; /* a new step of the measured epoch */
            L->ep_steps++;
        }
        w->meas_epoch = r->epoch;
    }
    if (w && r->step_seconds > 0)
        w->step_seconds = r->step_seconds;
    /* The epoch's steady step time, for its stall: the steps reported after the first. */
    struct lfirst *fh = w ? &w->fh[0] : NULL;
    if (fh && r->step_seconds > 0 && fh->epoch && r->epoch == fh->epoch && r->step > fh->step &&
        fh->nlater < LOOP_LATER_STEPS && (fh->nlater == 0 || r->step != fh->later_step)) {
        fh->later[fh->nlater++] = r->step_seconds;
        fh->later_step = r->step;
    }
    if (w) {
        w->step = r->step;
        w->loss = r->loss;
        w->reported = true;
        w->report_epoch = r->epoch;
        w->report_at = st_now();
    }
    for (size_t i = 0; w && i < r->nnotices; i++) {
        const char *k = r->notices[i].kind;
        const struct st_notice_figures *f = &r->notices[i].figures;
        if (!strcmp(k, "terminate")) {
            if (!w->terminate) {
                L->sum.worker_notices++;
                w->terminate_at = st_now();
            }
            w->terminate = true;
        } else if (!strcmp(k, "reconfigured")) {
            w->reconf_epoch = f->epoch;
            w->recv = f->recv;
            w->sent = f->sent;
            w->replayed = f->replayed;
            w->stall = f->stall;
            if (w->rh[0].epoch != f->epoch)
                w->rh[1] = w->rh[0];
            w->rh[0] = (struct lreconf){
                f->epoch, f->prewarmed,
                {f->wait, f->connect, f->reshape, f->transfer, f->commit, 0.0},
                f->deferred, f->waited};
        } else if (!strcmp(k, "reconfig-failed")) {
            w->reconf_fail_epoch = f->epoch;
        } else if (!strcmp(k, "step-failed")) {
            w->fail_epoch = f->epoch;
            snprintf(w->fail_why, sizeof(w->fail_why), "%s",
                     r->notices[i].detail ? r->notices[i].detail : "");
        } else if (!strcmp(k, "ckpt-written")) {
            w->ckw_step = f->step;
            w->ckw_stage = f->stage;
            w->ckw_seconds = f->seconds;
            snprintf(w->ckw_dir, sizeof(w->ckw_dir), "%s", f->dir);
        } else if (!strcmp(k, "peer-copy")) {
            /* The generations the worker holds now (it keeps two). */
            w->pc_epoch[0] = f->epoch;
            w->pc_step[0] = f->step;
            w->pc_epoch[1] = f->prev_epoch;
            w->pc_step[1] = f->prev_step;
        } else if (!strcmp(k, "peer-copy-refused")) {
            if (!L->peer_refused)
                L->peer_refused_need = f->need;
            L->peer_refused = true;
        } else if (!strcmp(k, "first-step")) {
            if (w->fh[0].epoch != f->epoch)
                w->fh[1] = w->fh[0];
            w->fh[0] = (struct lfirst){.epoch = f->epoch, .step = f->step,
                                       .seconds = f->seconds,
                                       .step_seconds = f->step_seconds};
        } else if (!strcmp(k, "checkpointed")) {
            w->ckpt_step = f->step;
            snprintf(w->ckpt_dir, sizeof(w->ckpt_dir), "%s", f->dir);
        }
    }
    pthread_mutex_unlock(&L->lock);
}

static void hook_membership(struct coord *c, void *userdata) {
    struct coord_loop *L = userdata;
    (void)c;
    pthread_mutex_lock(&L->lock);
    L->membership = true;
    pthread_mutex_unlock(&L->lock);
}

/* See coord-loop.h. */
void coord_loop_hooks(struct coord_loop *L, struct coord_hooks *h) {
    memset(h, 0, sizeof(*h));
    h->userdata = L;
    h->on_report = hook_report;
    h->on_membership = hook_membership;
}
