/* history.h: internal to coordinator/ — the time series behind GET /v1/history and the status
 * page: instances alive/noticed/forecast, shapes, loss and samples/s, migrations, cost.
 *
 * One idea: every series is a fixed array inside struct coord (no allocation, so recording can
 * never fail), and its retention is bounded in points, not time. Sampled series (instances,
 * loss, cost) *thin* when full: every other point is dropped and each point afterwards stands
 * for twice as many offers (the newest of them), so a series always spans the whole job at a
 * resolution that halves as the job grows. Event series (shapes, migrations) keep the newest
 * COORD_HISTORY_MAX. History lives in memory only: a restarted coordinator starts it afresh.
 * All functions are called with c->lock held; times are Unix seconds (st_wall()). */
#ifndef ST_COORD_HISTORY_H
#define ST_COORD_HISTORY_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "coordinator.h" /* enum plan_reconf */

#define COORD_HISTORY_MAX 1024 /* points per series */

/* Every point starts with its time, which the thinning and merging read generically. */
struct coord_hist_instances {
    double t;
    int alive, noticed;    /* instances alive now; of them, under an interruption notice */
    double forecast;       /* instances the predictor expects for the next interval */
};
struct coord_hist_shape {
    double t;
    uint64_t epoch, step;  /* the epoch that opened, and the step it starts at */
    int dp, pp;
};
struct coord_hist_loss {
    double t;
    uint64_t step;
    double loss;               /* of that step, from a worker of the last pipeline stage */
    double samples_per_second; /* global batch / that step's wall seconds; 0 = unknown */
};
struct coord_hist_migration {
    double t;                  /* when it finished */
    uint64_t epoch, step;      /* the job's epoch and step then */
    int dp, pp;                /* the shape it produced */
    enum plan_reconf kind;
    uint64_t bytes;
    double stall_seconds;
};
struct coord_hist_cost {
    double t;
    double spot_dollars;       /* spent so far */
    double on_demand_dollars;  /* the same instance-hours at the on-demand price */
};

struct coord__series {
    void *pts;          /* max points of `size` bytes, oldest first */
    size_t size, n, max;
    uint64_t stride;    /* offers one point stands for (1, 2, 4, ... after thinning) */
    uint64_t absorbed;  /* offers merged into the newest point so far */
    double opened;      /* time of the first offer merged into the newest point */
    double min_dt;      /* seconds: an offer closer than this to the newest point replaces it */
    bool ring;          /* when full, drop the oldest instead of thinning */
};

struct coord_history {
    struct coord__series instances, shapes, loss, migrations, cost;
    struct coord_hist_instances instances_pts[COORD_HISTORY_MAX];
    struct coord_hist_shape shapes_pts[COORD_HISTORY_MAX];
    struct coord_hist_loss loss_pts[COORD_HISTORY_MAX];
    struct coord_hist_migration migrations_pts[COORD_HISTORY_MAX];
    struct coord_hist_cost cost_pts[COORD_HISTORY_MAX];
};

/* Empties every series. h lives inside struct coord (never moved: the series point into it). */
void coord__history_init(struct coord_history *h);

/* Recorders. instances records only a change of any of its values (the page extends the last
 * value to "now"); loss only a step other than its newest point's; cost at most one point per
 * second (a closer offer replaces the newest point). */
void coord__history_instances(struct coord_history *h, double now, int alive, int noticed,
                              double forecast);
void coord__history_shape(struct coord_history *h, double now, uint64_t epoch, int dp, int pp,
                          uint64_t step);
void coord__history_loss(struct coord_history *h, double now, uint64_t step, double loss,
                         double samples_per_second);
void coord__history_migration(struct coord_history *h, double now, uint64_t epoch,
                              uint64_t step, int dp, int pp, enum plan_reconf kind,
                              uint64_t bytes, double stall_seconds);
void coord__history_cost(struct coord_history *h, double now, double spot_dollars,
                         double on_demand_dollars);

/* The GET /v1/history object (docs/openapi.yaml, schema History). Returns a new reference,
 * NULL when out of memory. */
json_t *coord__history_json(const struct coord_history *h, double now);

#endif
