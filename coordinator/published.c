/* published.c: what the planning loop and the job driver hand the coordinator to show
 * (coordinator.h): the plan's detail for GET /v1/plan, each migration's bytes and stall, the
 * cost model's predicted-against-measured figures, the fleet's predicted and live counts, the
 * planner's decisions, why the job waits, and the spend. Each setter takes the lock, keeps
 * the figure and adds it to the history; rest.c serves them (GET /v1/job, /metrics,
 * /v1/history). state.c holds the job's state machine. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "coord-internal.h"

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
