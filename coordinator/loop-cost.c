/* loop-cost.c: the planning loop's side of the fitted cost model (planner/fitted.c):
 * measured steps and migrations in, predictions out, and the predicted-against-measured
 * figures of the run summary, GET /v1/job and /metrics. Every prediction is the one made when
 * the epoch or migration was decided, before what it is compared with was measured. */
#include <inttypes.h>
#include <string.h>

#include "loop-internal.h"

/* The live kind the fitted model keeps figures for (a restore's prediction, never compared,
 * is made as for an intra-stage move). */
static enum plan_reconf meas_kind(enum plan_reconf k) {
    return (unsigned)k < PLAN_RECONF_NLIVE ? k : PLAN_RECONF_INTRA_STAGE;
}

/* The cost model decisions are taken on: the fitted one, unless the spec says
 * planner.learn: false (then the spec's fleet figures; the fit still predicts, for the
 * summary's predicted-against-measured figures). */
const struct plan_cost *loop__decide_cost(const struct coord_loop *L) {
    return L->fit && L->cfg.spec.planner.learn ? plan_fit_cost(L->fit) : L->cfg.cost;
}

/* Feeds the steps measured since the last call (their mean) to the fit. */
void loop__cm_feed(struct coord_loop *L) {
    pthread_mutex_lock(&L->lock);
    double sum = L->ep_step_sum - L->ep_fed_sum;
    uint64_t n = L->ep_steps - L->ep_fed;
    L->ep_fed_sum = L->ep_step_sum;
    L->ep_fed = L->ep_steps;
    pthread_mutex_unlock(&L->lock);
    if (L->fit && n > 0 && L->dp > 0 && plan_fit_observe_step(L->fit, L->dp, L->pp, sum / n) == 0)
        L->fit_has_steps = true;
}

/* Adds the measured epoch's steps to the summary's predicted-against-measured figures. */
void loop__cm_account(const struct coord_loop *L, struct coord_loop_summary *S) {
    if (L->ep_calibrated && L->ep_steps > 0) {
        S->cost_model.steps += L->ep_steps;
        S->cost_model.step_predicted += L->ep_pred * (double)L->ep_steps;
        S->cost_model.step_measured += L->ep_step_sum;
    }
}

/* Shows the cost model against what happened, the running epoch's steps included, in GET
 * /v1/job and /metrics (the summary's figures as the job stands). */
void loop__cm_publish(struct coord_loop *L) {
    struct coord_loop_summary s;
    struct coord_cost_model cm;
    memset(&cm, 0, sizeof(cm));
    pthread_mutex_lock(&L->lock);
    s.cost_model = L->sum.cost_model;
    loop__cm_account(L, &s);
    pthread_mutex_unlock(&L->lock);
    cm.steps = s.cost_model.steps;
    cm.step_predicted = s.cost_model.step_predicted;
    cm.step_measured = s.cost_model.step_measured;
    for (int k = 0; k < PLAN_RECONF_NLIVE; k++) {
        cm.n[k] = s.cost_model.n[k];
        cm.stall_predicted[k] = s.cost_model.stall_predicted[k];
        cm.stall_measured[k] = s.cost_model.stall_measured[k];
        cm.cal_n[k] = s.cost_model.cal_n[k];
        cm.cal_predicted[k] = s.cost_model.cal_predicted[k];
        cm.cal_measured[k] = s.cost_model.cal_measured[k];
    }
    coord_metrics_set_cost_model(L->c, &cm);
}

/* The running epoch ends (a reconfiguration is ordered): account and feed its steps. */
void loop__cm_epoch_end(struct coord_loop *L) {
    loop__cm_feed(L);
    /* A figure, not an event: the summary's cost_model tabulates it (events stay one line
     * each per epoch). */
    if (L->ep_epoch && L->ep_steps > 0)
        st_log(ST_LOG_INFO, "loop", "Epoch %" PRIu64 " (%dx%d): step time %.4f s predicted "
               "when decided, %.4f s measured over %" PRIu64 " worker-steps", L->ep_epoch, L->dp,
               L->pp, L->ep_pred, L->ep_step_sum / (double)L->ep_steps, L->ep_steps);
    pthread_mutex_lock(&L->lock);
    loop__cm_account(L, &L->sum);
    L->ep_epoch = 0;
    L->ep_step_sum = L->ep_fed_sum = 0;
    L->ep_steps = L->ep_fed = 0;
    pthread_mutex_unlock(&L->lock);
}

/* Predictions for the reconfiguration being ordered (L->rc), before anything of it ran: the
 * planner's own charge of what plan moves (NULL: nothing; its weights stall the first step,
 * its moments only beyond it). */
void loop__cm_predict(struct coord_loop *L, int dp, int pp, const struct plan_migration *plan) {
    double all = plan ? (double)plan->bytes_moved : 0;
    double w = plan ? (double)plan->bytes_kind[ST_STATE_PARAM] : 0;
    struct coord_loop_record *rec = &L->rc.rec;
    rec->move = (struct plan_fit_move){w, all - w, dp, pp, rec->dp_reshard};
    L->rc.pred_step = L->fit ? plan_fit_step_seconds(L->fit, dp, pp) : 0;
    L->rc.calibrated = L->fit_has_steps;
    rec->stall_predicted = L->fit ? plan_fit_stall_seconds_move(L->fit, meas_kind(rec->kind),
                                                                &rec->move) : -1;
    rec->stall_calibrated = L->fit && plan_fit_stall_calibrated(L->fit);
}

/* Epoch L->epoch runs from now: measure its steps against the prediction made for it. */
void loop__cm_epoch_begin(struct coord_loop *L, double pred, bool calibrated) {
    pthread_mutex_lock(&L->lock);
    L->ep_epoch = L->epoch;
    L->ep_step_sum = L->ep_fed_sum = 0;
    L->ep_steps = L->ep_fed = 0;
    L->ep_pred = pred;
    L->ep_calibrated = calibrated && pred > 0;
    pthread_mutex_unlock(&L->lock);
}

/* One migration of kind k into the cost model's sums: all, and apart the calibrated. */
static void cm_count(struct coord_loop *L, int k, double predicted, bool calibrated,
                     double stall) {
    __typeof__(L->sum.cost_model) *cm = &L->sum.cost_model;
    cm->n[k]++;
    cm->stall_predicted[k] += predicted;
    cm->stall_measured[k] += stall;
    if (calibrated) {
        cm->cal_n[k]++;
        cm->cal_predicted[k] += predicted;
        cm->cal_measured[k] += stall;
    }
}

/* A live migration's stall was measured: compare it (in the summary and on its record) with
 * the prediction made when it was ordered, and learn. */
void loop__cm_migration(struct coord_loop *L, struct coord_loop_record *rec, uint64_t moved,
                        double stall) {
    if (!L->fit || (unsigned)rec->kind >= PLAN_RECONF_NLIVE) /* live migrations only */
        return;
    rec->stall_compared = true;
    cm_count(L, rec->kind, rec->stall_predicted, rec->stall_calibrated, stall);
    /* The wire's bytes, split as the plan's were. */
    struct plan_fit_move mv = rec->move;
    double planned = mv.weight_bytes + mv.moment_bytes;
    double scale = planned > 0 ? (double)moved / planned : 0;
    mv.weight_bytes *= scale;
    mv.moment_bytes *= scale;
    if (planned <= 0)
        mv.weight_bytes = (double)moved;
    (void)plan_fit_observe_move(L->fit, rec->kind, &mv, stall); /* dp's part with it */
    /* A move that changed dp counts again under dp-resharding: the same prediction of its
     * whole stall against the same measurement. */
    if (rec->dp_reshard)
        cm_count(L, PLAN_RECONF_DP_RESHARDING, rec->stall_predicted, rec->stall_calibrated,
                 stall);
}
