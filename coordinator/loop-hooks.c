/* loop-hooks.c: what the planning loop learns from workers' reports and notices. These are
 * the coordinator's hooks: its completion-queue thread calls them without the coordinator's
 * lock, and they take L->lock. A notice is a kind plus space-separated key=value words
 * (worker/runner.c writes them). */
#include <stdio.h>
#include <stdlib.h>
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

/* Value of "key=" in a notice's detail (space-separated key=value words). */
static bool kv(const char *s, const char *key, char *out, size_t size) {
    size_t k = strlen(key);
    for (const char *p = s; p && *p;) {
        if (!strncmp(p, key, k) && p[k] == '=' && (p == s || p[-1] == ' ')) {
            const char *v = p + k + 1, *e = strchr(v, ' ');
            size_t n = e ? (size_t)(e - v) : strlen(v);
            if (!strcmp(key, "dir"))
                n = strlen(v); /* last, may hold spaces */
            if (n >= size)
                return false;
            memcpy(out, v, n);
            out[n] = '\0';
            return true;
        }
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    return false;
}

static uint64_t kv_u64(const char *s, const char *key) {
    char b[32];
    return kv(s, key, b, sizeof(b)) ? strtoull(b, NULL, 10) : 0;
}

static double kv_f(const char *s, const char *key) {
    char b[32];
    return kv(s, key, b, sizeof(b)) ? strtod(b, NULL) : 0.0;
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
    if (w) {
        w->step = r->step;
        w->loss = r->loss;
        w->reported = true;
        w->report_epoch = r->epoch;
        w->report_at = st_now();
    }
    for (size_t i = 0; w && i < r->nnotices; i++) {
        const char *k = r->notices[i].kind, *d = r->notices[i].detail ? r->notices[i].detail : "";
        if (!strcmp(k, "terminate")) {
            if (!w->terminate) {
                L->sum.worker_notices++;
                w->terminate_at = st_now();
            }
            w->terminate = true;
        } else if (!strcmp(k, "reconfigured")) {
            w->reconf_epoch = kv_u64(d, "epoch");
            w->recv = kv_u64(d, "recv");
            w->sent = kv_u64(d, "sent");
            w->replayed = kv_u64(d, "replayed");
            w->prewarmed = kv_u64(d, "prewarmed");
            w->stall = kv_f(d, "stall");
            w->parts = (struct coord_loop_stall_parts){kv_f(d, "wait"), kv_f(d, "connect"),
                                                       kv_f(d, "reshape"), kv_f(d, "transfer"),
                                                       kv_f(d, "commit"), 0.0};
            w->deferred = kv_f(d, "deferred");
            w->waited = kv_f(d, "waited");
        } else if (!strcmp(k, "reconfig-failed")) {
            w->reconf_fail_epoch = kv_u64(d, "epoch");
        } else if (!strcmp(k, "step-failed")) {
            w->fail_epoch = kv_u64(d, "epoch");
        } else if (!strcmp(k, "ckpt-written")) {
            w->ckw_step = kv_u64(d, "step");
            w->ckw_stage = (int)kv_u64(d, "stage");
            w->ckw_seconds = kv_f(d, "seconds");
            if (!kv(d, "dir", w->ckw_dir, sizeof(w->ckw_dir)))
                w->ckw_dir[0] = '\0';
        } else if (!strcmp(k, "peer-copy")) {
            /* The generations the worker holds now (it keeps two). */
            w->pc_epoch[0] = kv_u64(d, "epoch");
            w->pc_step[0] = kv_u64(d, "step");
            w->pc_epoch[1] = kv_u64(d, "prev_epoch");
            w->pc_step[1] = kv_u64(d, "prev_step");
        } else if (!strcmp(k, "peer-copy-refused")) {
            if (!L->peer_refused)
                L->peer_refused_need = kv_u64(d, "need");
            L->peer_refused = true;
        } else if (!strcmp(k, "first-step")) {
            w->first_epoch = kv_u64(d, "epoch");
            w->first_seconds = kv_f(d, "seconds");
            w->first_step_seconds = kv_f(d, "step_seconds");
        } else if (!strcmp(k, "checkpointed")) {
            w->ckpt_step = kv_u64(d, "step");
            if (!kv(d, "dir", w->ckpt_dir, sizeof(w->ckpt_dir)))
                w->ckpt_dir[0] = '\0';
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
