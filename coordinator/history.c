/* history.c: bounded time series of what the coordinator saw, for GET /v1/history and the
 * status page (history.h says what each series holds).
 *
 * One idea: a series never allocates and never grows past COORD_HISTORY_MAX points. A sampled
 * series that fills up keeps every other point and from then on lets each point absorb twice
 * as many offers, keeping the newest, so a job of a week is drawn end to end as well as a job of
 * a minute; an event series drops its oldest event instead, because merging two migrations
 * would invent one that never happened. */
#include <stddef.h>
#include <string.h>

#include "check.h"
#include "coord-internal.h"

_Static_assert(offsetof(struct coord_hist_instances, t) == 0, "time first");
_Static_assert(offsetof(struct coord_hist_shape, t) == 0, "time first");
_Static_assert(offsetof(struct coord_hist_loss, t) == 0, "time first");
_Static_assert(offsetof(struct coord_hist_migration, t) == 0, "time first");
_Static_assert(offsetof(struct coord_hist_cost, t) == 0, "time first");

static void series_init(struct coord__series *s, void *pts, size_t size, double min_dt,
                        bool ring) {
    memset(s, 0, sizeof(*s));
    s->pts = pts;
    s->size = size;
    s->max = COORD_HISTORY_MAX;
    s->stride = 1;
    s->min_dt = min_dt;
    s->ring = ring;
}

static void *series_at(const struct coord__series *s, size_t i) {
    return (unsigned char *)s->pts + i * s->size;
}

static const void *series_last(const struct coord__series *s) {
    return s->n ? series_at(s, s->n - 1) : NULL;
}

/* Adds point p (s->size bytes, time first) under the series' retention rule. */
static void series_offer(struct coord__series *s, const void *p) {
    double t;
    memcpy(&t, p, sizeof(t));
    if (s->ring) {
        if (s->n == s->max) {
            memmove(s->pts, series_at(s, 1), (s->n - 1) * s->size);
            s->n--;
        }
        memcpy(series_at(s, s->n++), p, s->size);
        return;
    }
    if (s->n > 0) {
        /* Measured from when the newest point opened, or a steady stream would never leave it. */
        if (s->absorbed < s->stride || t - s->opened < s->min_dt) {
            memcpy(series_at(s, s->n - 1), p, s->size);
            s->absorbed++;
            return;
        }
    }
    if (s->n == s->max) {
        /* Keep the even points (the first, the job's start, stays) at half the resolution. */
        for (size_t i = 1; i < s->max / 2; i++)
            memcpy(series_at(s, i), series_at(s, 2 * i), s->size);
        s->n = s->max / 2;
        s->stride *= 2;
    }
    memcpy(series_at(s, s->n++), p, s->size);
    s->absorbed = 1;
    s->opened = t;
}

void coord__history_init(struct coord_history *h) {
    series_init(&h->instances, h->instances_pts, sizeof(h->instances_pts[0]), 0, false);
    series_init(&h->shapes, h->shapes_pts, sizeof(h->shapes_pts[0]), 0, true);
    series_init(&h->loss, h->loss_pts, sizeof(h->loss_pts[0]), 0, false);
    series_init(&h->migrations, h->migrations_pts, sizeof(h->migrations_pts[0]), 0, true);
    series_init(&h->cost, h->cost_pts, sizeof(h->cost_pts[0]), 1.0, false);
}

void coord__history_instances(struct coord_history *h, double now, int alive, int noticed,
                              double forecast) {
    const struct coord_hist_instances *last = series_last(&h->instances);
    if (last && last->alive == alive && last->noticed == noticed && last->forecast == forecast)
        return;
    struct coord_hist_instances p = {now, alive, noticed, forecast};
    series_offer(&h->instances, &p);
}

void coord__history_shape(struct coord_history *h, double now, uint64_t epoch, int dp, int pp,
                          uint64_t step) {
    struct coord_hist_shape p = {now, epoch, step, dp, pp};
    series_offer(&h->shapes, &p);
}

void coord__history_loss(struct coord_history *h, double now, uint64_t step, double loss,
                         double samples_per_second) {
    const struct coord_hist_loss *last = series_last(&h->loss);
    if (last && last->step == step)
        return;
    struct coord_hist_loss p = {now, step, loss, samples_per_second};
    series_offer(&h->loss, &p);
}

void coord__history_migration(struct coord_history *h, double now, uint64_t epoch,
                              uint64_t step, int dp, int pp, enum plan_reconf kind,
                              uint64_t bytes, double stall_seconds) {
    struct coord_hist_migration p = {now, epoch, step, dp, pp, kind, bytes, stall_seconds};
    series_offer(&h->migrations, &p);
}

void coord__history_cost(struct coord_history *h, double now, double spot_dollars,
                         double on_demand_dollars) {
    struct coord_hist_cost p = {now, spot_dollars, on_demand_dollars};
    series_offer(&h->cost, &p);
}

/* Appends the new object o to arr; false (and nothing leaks) when either is missing. */
static bool append(json_t *arr, json_t *o) {
    return o && json_array_append_new(arr, o) == 0;
}

json_t *coord__history_json(const struct coord_history *h, double now) {
    json_t *inst = json_array(), *shapes = json_array(), *loss = json_array();
    json_t *migs = json_array(), *cost = json_array();
    bool ok = inst && shapes && loss && migs && cost;
    for (size_t i = 0; ok && i < h->instances.n; i++) {
        const struct coord_hist_instances *p = &h->instances_pts[i];
        ok = append(inst, json_pack("{s:f, s:i, s:i, s:f}", "t", p->t, "alive", p->alive,
                                    "noticed", p->noticed, "forecast", p->forecast));
    }
    for (size_t i = 0; ok && i < h->shapes.n; i++) {
        const struct coord_hist_shape *p = &h->shapes_pts[i];
        ok = append(shapes, json_pack("{s:f, s:I, s:i, s:i, s:I}", "t", p->t, "epoch",
                                      (json_int_t)p->epoch, "dp", p->dp, "pp", p->pp, "step",
                                      (json_int_t)p->step));
    }
    for (size_t i = 0; ok && i < h->loss.n; i++) {
        const struct coord_hist_loss *p = &h->loss_pts[i];
        ok = append(loss, json_pack("{s:f, s:I, s:f, s:f}", "t", p->t, "step",
                                    (json_int_t)p->step, "loss", p->loss, "samples_per_second",
                                    p->samples_per_second));
    }
    for (size_t i = 0; ok && i < h->migrations.n; i++) {
        const struct coord_hist_migration *p = &h->migrations_pts[i];
        ok = append(migs, json_pack("{s:f, s:I, s:I, s:i, s:i, s:s, s:I, s:f}", "t", p->t,
                                    "epoch", (json_int_t)p->epoch, "step", (json_int_t)p->step,
                                    "dp", p->dp, "pp", p->pp, "kind",
                                    plan_reconf_label(p->kind), "bytes",
                                    (json_int_t)p->bytes, "stall_seconds", p->stall_seconds));
    }
    for (size_t i = 0; ok && i < h->cost.n; i++) {
        const struct coord_hist_cost *p = &h->cost_pts[i];
        ok = append(cost, json_pack("{s:f, s:f, s:f}", "t", p->t, "spot_dollars",
                                    p->spot_dollars, "on_demand_dollars", p->on_demand_dollars));
    }
    if (!ok) {
        json_decref(inst);
        json_decref(shapes);
        json_decref(loss);
        json_decref(migs);
        json_decref(cost);
        return NULL;
    }
    /* "o" steals the references, also when json_pack fails. */
    return json_pack("{s:f, s:i, s:o, s:o, s:o, s:o, s:o}", "now", now, "max_points",
                     COORD_HISTORY_MAX, "instances", inst, "shapes", shapes, "loss", loss,
                     "migrations", migs, "cost", cost);
}
