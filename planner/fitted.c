/* fitted.c: the planner's cost model fitted online from what the job measures.
 *
 * The spec's hardware figures (fleet.gpu_tflops, fleet.net_gbps) give a prior that can be off
 * by orders of magnitude (a CPU quickstart priced as a GPU). The one idea: keep the prior's
 * *shape* of the costs and fit the error: log(measured / prior) step time is modelled as
 * a + b log dp + c log pp (least squares over the measurements, older ones decaying, so it
 * follows the machine getting busier or quieter; b and c pulled towards 0, so one shape's
 * measurements scale every shape alike) plus, for a shape that ran, its own deviation (a moving
 * average). a is the wrong hardware; b and c catch a prior that scales wrongly with the shape,
 * e.g. workers that share CPU cores gain nothing from more replicas. Migrations: once one was
 * measured, the cost model charges live migrations (plan_cost_use_measured) with each kind's
 * fixed part fitted as the median, over its last FIT_MIG_WINDOW migrations, of stall minus its
 * bytes over the prior's link, and a kind not yet seen at the largest fixed part seen so far.
 * A median, not a mean: a job's first migration pays one-time costs (connections, buffers
 * faulted in) several times a typical stall, and a mean carried that into every prediction
 * after it (the quickstart: predicted 2x the measured stall, calibrated ones included); the
 * window lets the figure follow a machine that gets busier or quieter. A cost file
 * (planner.migration_costs, plan_fit_start_costs) replaces the prior's migration figures from
 * the start: every kind then has its file's fixed part and throughput until the job measures
 * it. Pure: the loop feeds it numbers. */
#include <errno.h>
#include <math.h>
#include <stdlib.h> /* qsort */
#include <string.h>

#include "common.h"
#include "planner-internal.h"
#include "planner.h"

#define FIT_ALPHA 0.5  /* weight of a new sample in a shape's deviation */
#define FIT_DECAY 0.7  /* weight left to older samples in the regression at each new one */
#define FIT_RIDGE 1.0  /* pull of b and c towards 0 */
#define FIT_MIG_WINDOW 8 /* the migrations of a kind whose median is its fixed part */

struct plan_fit {
    struct plan_cost *cost;      /* the fitted model plan_decide reads */
    double *prior_sps;           /* [nshapes] prior samples/s */
    double *dev;                 /* [nshapes] a shape's log deviation from the level */
    bool *seen;                  /* [nshapes] the shape ran */
    double A[3][3], B[3];        /* decayed normal equations of the regression */
    bool have_level;
    double fixed[PLAN_RECONF_NLIVE][FIT_MIG_WINDOW]; /* a ring of the last fixed parts */
    int nfixed[PLAN_RECONF_NLIVE];                   /* all observed (the ring holds the last) */
    double link_bytes_per_s;     /* the prior's point-to-point rate at large messages */
    bool have_file;              /* plan_fit_start_costs: the kinds' figures below */
    struct plan_measured_costs file;
    bool dirty;
};

static double prior_step(const struct plan_fit *f, int i) {
    return f->prior_sps[i] > 0 ? f->cost->global_batch / f->prior_sps[i] : 0;
}

int plan_fit_new(const struct plan_cost *prior, struct plan_fit **ret) {
    struct plan_fit *f = NULL;
    int r = 0;
    if (!prior || !ret || prior->nshapes < 1 || prior->global_batch < 1)
        return -EINVAL;
    f = st_calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    if ((r = plan_cost_dup(prior, &f->cost)) < 0)
        goto out;
    f->prior_sps = st_calloc((size_t)prior->nshapes, sizeof(double));
    f->dev = st_calloc((size_t)prior->nshapes, sizeof(double));
    f->seen = st_calloc((size_t)prior->nshapes, sizeof(bool));
    if (!f->prior_sps || !f->dev || !f->seen) {
        r = -ENOMEM;
        goto out;
    }
    memcpy(f->prior_sps, prior->samples_per_s, (size_t)prior->nshapes * sizeof(double));
    /* 1 GiB over the prior's p2p table: its link rate, whatever the latency term. */
    double gib = 1024.0 * 1024 * 1024, ms = plan_cost_p2p_ms(prior, gib);
    f->link_bytes_per_s = ms > 0 ? gib / ms * 1000 : 1.25e9;
    *ret = f;
    f = NULL;
out:
    plan_fit_free(f);
    return r;
}

struct plan_fit *plan_fit_free(struct plan_fit *f) {
    if (!f)
        return NULL;
    plan_cost_free(f->cost);
    st_free(f->prior_sps);
    st_free(f->dev);
    st_free(f->seen);
    st_free(f);
    return NULL;
}

/* theta . x for a shape: the regression's log(measured / prior) step time. */
static double regress(const struct plan_fit *f, int dp, int pp) {
    double M[3][4];
    for (int r = 0; r < 3; r++) {
        for (int k = 0; k < 3; k++)
            M[r][k] = f->A[r][k] + (r == k ? (r ? FIT_RIDGE : 1e-12) : 0);
        M[r][3] = f->B[r];
    }
    for (int k = 0; k < 3; k++) { /* Gaussian elimination; M is positive definite */
        for (int r = k + 1; r < 3; r++) {
            double q = M[r][k] / M[k][k];
            for (int j = k; j < 4; j++)
                M[r][j] -= q * M[k][j];
        }
    }
    double th[3];
    for (int k = 2; k >= 0; k--) {
        double v = M[k][3];
        for (int j = k + 1; j < 3; j++)
            v -= M[k][j] * th[j];
        th[k] = v / M[k][k];
    }
    return th[0] + th[1] * log(dp) + th[2] * log(pp);
}

double plan_fit_step_seconds(const struct plan_fit *f, int dp, int pp) {
    int i = f ? plan_cost_shape_index(f->cost, dp, pp) : -1;
    if (i < 0)
        return 0;
    double p = prior_step(f, i);
    if (!f->have_level)
        return p;
    return p * exp(regress(f, dp, pp) + (f->seen[i] ? f->dev[i] : 0));
}

int plan_fit_observe_step(struct plan_fit *f, int dp, int pp, double seconds) {
    int i = f ? plan_cost_shape_index(f->cost, dp, pp) : -1;
    if (i < 0 || !(seconds > 0) || !isfinite(seconds))
        return -EINVAL;
    double p = prior_step(f, i);
    if (!(p > 0))
        return -EINVAL; /* a shape the prior says cannot run */
    double l = log(seconds / p), x[3] = {1, log(dp), log(pp)};
    for (int r = 0; r < 3; r++) {
        for (int k = 0; k < 3; k++)
            f->A[r][k] = FIT_DECAY * f->A[r][k] + x[r] * x[k];
        f->B[r] = FIT_DECAY * f->B[r] + x[r] * l;
    }
    f->have_level = true;
    double d = l - regress(f, dp, pp);
    f->dev[i] = f->seen[i] ? (1 - FIT_ALPHA) * f->dev[i] + FIT_ALPHA * d : d;
    f->seen[i] = true;
    f->dirty = true;
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of kind k's last fixed parts; -1 when none was observed. */
static double fixed_median(const struct plan_fit *f, int k) {
    int n = ST_MIN(f->nfixed[k], FIT_MIG_WINDOW);
    if (n <= 0) /* never below 0; said so, gcc -O3 bounds the memcpy below */
        return -1;
    double v[FIT_MIG_WINDOW];
    memcpy(v, f->fixed[k], (size_t)n * sizeof(double));
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double fixed_s(const struct plan_fit *f, enum plan_reconf k) {
    if (f->nfixed[k] > 0)
        return fixed_median(f, k);
    if (f->have_file)
        return f->file.fixed_s[k];
    double worst = -1;
    for (int j = 0; j < PLAN_RECONF_NLIVE; j++)
        worst = ST_MAX(worst, fixed_median(f, j));
    return worst;
}

/* Bytes per second a migration of kind k moves: the cost file's, or the prior's link. */
static double rate(const struct plan_fit *f, enum plan_reconf k) {
    return f->have_file ? f->file.bytes_per_s[k] : f->link_bytes_per_s;
}

int plan_fit_start_costs(struct plan_fit *f, const struct plan_measured_costs *m) {
    if (!f || !m)
        return -EINVAL;
    for (int k = 0; k < PLAN_RECONF_NLIVE; k++)
        if (!(m->bytes_per_s[k] > 0) || !(m->fixed_s[k] >= 0) || !isfinite(m->fixed_s[k]) ||
            !isfinite(m->bytes_per_s[k]))
            return -EINVAL;
    f->file = *m;
    f->have_file = true;
    f->dirty = true;
    return 0;
}

static bool move_ok(const struct plan_fit_move *mv) {
    return mv && mv->weight_bytes >= 0 && mv->moment_bytes >= 0 && isfinite(mv->weight_bytes) &&
           isfinite(mv->moment_bytes);
}

/* Seconds of mv's transfers in the stall (measured.c's moved_ms, on the fit's figures). */
static double move_s(const struct plan_fit *f, enum plan_reconf k,
                     const struct plan_fit_move *mv) {
    return plan__after_boundary(f->cost->meas_at_boundary, mv->weight_bytes / rate(f, k),
                                mv->moment_bytes / rate(f, k),
                                plan_fit_step_seconds(f, mv->dp, mv->pp));
}

double plan_fit_stall_seconds_move(const struct plan_fit *f, enum plan_reconf k,
                                   const struct plan_fit_move *mv) {
    if (!f || (unsigned)k >= PLAN_RECONF_NLIVE || !move_ok(mv))
        return -1;
    double fx = fixed_s(f, k);
    if (fx < 0) /* nothing measured yet: the prior's own estimate of a live move */
        fx = plan__intra_ms(f->cost, 1, 1) / 1000;
    return fx + move_s(f, k, mv);
}

int plan_fit_observe_move(struct plan_fit *f, enum plan_reconf k,
                          const struct plan_fit_move *mv, double stall_s) {
    if (!f || (unsigned)k >= PLAN_RECONF_NLIVE || !move_ok(mv) || !(stall_s >= 0) ||
        !isfinite(stall_s))
        return -EINVAL;
    f->fixed[k][f->nfixed[k] % FIT_MIG_WINDOW] = ST_MAX(0.0, stall_s - move_s(f, k, mv));
    f->nfixed[k]++;
    f->dirty = true;
    return 0;
}

/* The bytes all in the stall: weights, as far as the charge goes. */
double plan_fit_stall_seconds(const struct plan_fit *f, enum plan_reconf k, double bytes) {
    struct plan_fit_move mv = {bytes, 0, 1, 1};
    return plan_fit_stall_seconds_move(f, k, &mv);
}

int plan_fit_observe_migration(struct plan_fit *f, enum plan_reconf k, double bytes,
                               double stall_s) {
    struct plan_fit_move mv = {bytes, 0, 1, 1};
    return plan_fit_observe_move(f, k, &mv, stall_s);
}

bool plan_fit_stall_calibrated(const struct plan_fit *f) {
    return f && (f->have_file || fixed_s(f, PLAN_RECONF_INTRA_STAGE) >= 0);
}

const struct plan_cost *plan_fit_cost(struct plan_fit *f) {
    if (!f)
        return NULL;
    if (!f->dirty)
        return f->cost;
    struct plan_cost *c = f->cost;
    for (int i = 0; i < c->nshapes; i++) {
        double s = plan_fit_step_seconds(f, c->shapes[i].dp, c->shapes[i].pp);
        c->samples_per_s[i] = s > 0 ? c->global_batch / s : 0;
    }
    if (fixed_s(f, PLAN_RECONF_INTRA_STAGE) >= 0) { /* some kind was measured */
        struct plan_measured_costs m;
        memset(&m, 0, sizeof(m));
        m.link_gbps = f->have_file ? f->file.link_gbps : f->link_bytes_per_s * 8 / 1e9;
        for (int k = 0; k < PLAN_RECONF_NLIVE; k++) {
            m.fixed_s[k] = fixed_s(f, (enum plan_reconf)k);
            m.bytes_per_s[k] = rate(f, (enum plan_reconf)k);
        }
        (void)plan_cost_use_measured(c, &m, 0); /* figures checked above: cannot fail */
    }
    f->dirty = false;
    return c;
}
