/* fitted.c: the planner's cost model fitted online from what the job measures. Pure: the loop
 * feeds it numbers.
 *
 * The spec's hardware figures (fleet.gpu_tflops, fleet.net_gbps) give a prior that can be off
 * by orders of magnitude (a CPU quickstart priced as a GPU). The one idea: keep the prior's
 * *shape* of the costs and fit the error.
 *
 * Step times. A shape that ran is predicted from its own measurements: log(measured / prior)
 * step time, a moving average. A shape not run yet is predicted by a + b log dp + c log pp
 * (least squares over every shape's measurements, older ones decaying, so it follows the
 * machine getting busier or quieter; b and c pulled towards 0, so one shape's measurements
 * scale every shape alike). a is the wrong hardware; b and c catch a prior that scales wrongly
 * with the shape, e.g. workers that share CPU cores gain nothing from more replicas. A shape
 * that ran was once predicted as the regression plus its own deviation from it, taken when it
 * ran; the decay let the running shape take the regression over, so a shape not running was
 * pulled towards the running one (2x2 and 1x2 taking turns at 20 and 30 ms: 2x2 predicted at
 * 16.9 ms, for ever). This sharper fit needs the planner to choose only shapes the job can
 * run (plan_options.rules): a shape it chose and the loop replaced never met a measurement,
 * and the jobs flapped (docs/planner.md). The fit also keeps the step spread, how far a
 * shape's measured step lands from its own prediction; plan_fit_margins makes the planner's
 * margins at least that, so noise between two shapes a few percent apart buys no move.
 *
 * Migrations. Once one was measured, the cost model charges live migrations
 * (plan_cost_use_measured) with each kind's fixed part: what a stall leaves beyond its bytes
 * over the link, averaged over the kind's last FIT_MIG_WINDOW migrations and its cost file's
 * figure (counted as many times as the migrations behind it, at most FIT_PRIOR_MAX), leaving
 * out any more than FIT_OUTLIER times their median. A mean, because the planner charges
 * expected costs and stalls are skewed (on the quickstart a kind's stalls run 2-4x apart; the
 * median sits below the mean). Without the outliers, because one stall an order of magnitude
 * above the rest (a worker descheduled at the hand-off) would otherwise move every prediction
 * after it; the skew up to about 4x the median is the expected cost. What a dp change adds
 * (dp-resharding) is learnt from the kinds whose moves both kept and changed dp; a kind whose
 * every move changed dp is charged those moves' mean, whole (base_fixed). A kind this job has
 * no figure for is charged the mean of the kinds' figures it has. The window follows a machine
 * that gets busier or quieter. plan_fit_costs hands the figures back in the cost file's shape,
 * so the next job (`spottrain run --save-costs`) starts where this one ended; a cost file
 * (planner.migration_costs, plan_fit_start_costs) also gives each kind's throughput. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h> /* qsort */
#include <string.h>

#include "common.h"
#include "planner-internal.h"
#include "planner.h"

#define FIT_ALPHA 0.5  /* weight of a new sample in a shape's own average */
#define FIT_DECAY 0.7  /* weight left to older samples in the regression at each new one */
#define FIT_SPREAD_DECAY 0.9 /* weight left to older errors in the step spread at each new one */
#define FIT_RIDGE 1.0  /* pull of b and c towards 0 */
#define FIT_MIG_WINDOW 8 /* the migrations of a kind its fixed part is fitted from */
#define FIT_PRIOR_MAX 4  /* the most migrations a cost file's figure counts as */
#define FIT_OUTLIER 8.0  /* a fixed part above this many times the median is left out */

struct plan_fit {
    struct plan_cost *cost;      /* the fitted model plan_decide reads */
    double *prior_sps;           /* [nshapes] prior samples/s */
    double *own;                 /* [nshapes] a shape's own log(measured / prior) step time,
                                  * a moving average */
    bool *seen;                  /* [nshapes] the shape ran */
    double A[3][3], B[3];        /* decayed normal equations of the regression */
    bool have_level;
    double spread_sum, spread_w; /* decayed |log(measured / predicted)| of shapes that ran */
    /* Per base kind (intra-stage, inter-stage, pipeline) a ring of its last moves: what each
     * stalled beyond its bytes, and whether it changed dp. */
    double fixed[PLAN_RECONF_DP_RESHARDING][FIT_MIG_WINDOW];
    bool fixed_dp[PLAN_RECONF_DP_RESHARDING][FIT_MIG_WINDOW];
    int nfixed[PLAN_RECONF_NLIVE]; /* moves observed per kind, dp changes under dp-resharding */
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
    f->own = st_calloc((size_t)prior->nshapes, sizeof(double));
    f->seen = st_calloc((size_t)prior->nshapes, sizeof(bool));
    if (!f->prior_sps || !f->own || !f->seen) {
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
    st_free(f->own);
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
    return p * exp(f->seen[i] ? f->own[i] : regress(f, dp, pp));
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
    if (f->seen[i]) {
        f->spread_sum = FIT_SPREAD_DECAY * f->spread_sum + fabs(l - f->own[i]);
        f->spread_w = FIT_SPREAD_DECAY * f->spread_w + 1;
    }
    f->own[i] = f->seen[i] ? (1 - FIT_ALPHA) * f->own[i] + FIT_ALPHA * l : l;
    f->seen[i] = true;
    f->dirty = true;
    return 0;
}

double plan_fit_step_spread(const struct plan_fit *f) {
    return f && f->spread_w > 0 ? expm1(f->spread_sum / f->spread_w) : 0;
}

void plan_fit_margins(struct plan_fit *f, struct plan_options *o) {
    const struct plan_cost *cost = plan_fit_cost(f); /* measured costs set the defaults */
    double s = plan_fit_step_spread(f);
    o->hysteresis = fmax(plan__margin(cost, o->hysteresis), s);
    o->defer = fmax(plan__margin(cost, o->defer), s);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n), sorting it; +inf when n is 0. */
static double median(double *v, int n) {
    if (n <= 0)
        return INFINITY;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The mean of v[0..n) (sorted here) without the values above FIT_OUTLIER times its median;
 * -1 when n is 0. */
static double robust_mean(double *v, int n) {
    if (n <= 0)
        return -1;
    double cap = FIT_OUTLIER * median(v, n), sum = 0;
    int kept = 0;
    for (int i = 0; i < n && v[i] <= cap; i++, kept++)
        sum += v[i];
    return sum / kept; /* the smallest value is never above the median: kept >= 1 */
}

/* Appends to v what the last moves of base kind k left beyond their bytes: those that changed
 * dp (dp 1), those that did not (dp 0), or all (dp -1). Returns how many. */
static int window(const struct plan_fit *f, int k, int dp, double *v) {
    int n = ST_MIN(f->nfixed[k], FIT_MIG_WINDOW), m = 0;
    for (int i = 0; i < n; i++)
        if (dp < 0 || f->fixed_dp[k][i] == (dp == 1))
            v[m++] = f->fixed[k][i];
    return m;
}

/* The migrations the cost file's figure for kind k counts as: 0 without a file, or where the
 * file says nothing was measured (its figure then stands only until a measurement). */
static int prior_weight(const struct plan_fit *f, int k) {
    return f->have_file ? ST_MIN(f->file.samples[k], FIT_PRIOR_MAX) : 0;
}

static bool measured_any(const struct plan_fit *f) {
    for (int k = 0; k < PLAN_RECONF_DP_RESHARDING; k++)
        if (f->nfixed[k] > 0)
            return true;
    return false;
}

static double dp_fixed(const struct plan_fit *f);

/* Base kind k's fixed part, without what a dp change adds: the mean of its moves that kept dp
 * with its file's figure. A kind whose every move changed dp (the quickstart's intra-stage and
 * pipeline moves) gives the mean of those moves, with the file's figure plus dp's part, less
 * dp's part, so that the two add up to what such a move stalled. Without either, the mean of
 * the measured kinds' parts; then the file's stand-in. -1 when nothing is known (the prior). */
static double base_fixed(const struct plan_fit *f, int k) {
    double v[FIT_MIG_WINDOW + FIT_PRIOR_MAX];
    int n = window(f, k, 0, v), w = prior_weight(f, k);
    if (n == 0 && (n = window(f, k, 1, v)) > 0) {
        double d = dp_fixed(f);
        for (int i = 0; i < w; i++)
            v[n++] = f->file.fixed_s[k] + d;
        return ST_MAX(0.0, robust_mean(v, n) - d);
    }
    for (int i = 0; i < w; i++)
        v[n++] = f->file.fixed_s[k];
    if (n > 0)
        return robust_mean(v, n);
    double sum = 0;
    for (int j = 0; j < PLAN_RECONF_DP_RESHARDING; j++)
        if (f->nfixed[j] > 0) {
            sum += base_fixed(f, j);
            n++;
        }
    if (n > 0)
        return sum / n;
    return f->have_file ? f->file.fixed_s[k] : -1;
}

/* What a change of dp adds to a move's stall (the ZeRO-1 shards' re-layout): the mean, over
 * the moves that changed dp of the kinds that also have moves that kept dp, of their stall
 * beyond their kind's fixed part, with the file's figure. A kind whose every move changed dp
 * cannot tell the two parts apart, and is charged its own mean whole (base_fixed). Moves an
 * order of magnitude above their kind's are left out, as robust_mean leaves them out of a
 * kind. Residuals may be negative (a move faster than its kind's mean); the mean is not below
 * 0. 0 when no such move was measured and the file says nothing; -1 when nothing is known. */
static double dp_fixed(const struct plan_fit *f) {
    double v[FIT_MIG_WINDOW];
    double sum = 0;
    int n = 0;
    for (int k = 0; k < PLAN_RECONF_DP_RESHARDING; k++) {
        if (window(f, k, 0, v) == 0)
            continue;
        double all[FIT_MIG_WINDOW], base = base_fixed(f, k);
        double cap = FIT_OUTLIER * median(all, window(f, k, -1, all));
        int m = window(f, k, 1, v);
        for (int i = 0; i < m; i++)
            if (v[i] <= cap) {
                sum += v[i] - base;
                n++;
            }
    }
    int w = prior_weight(f, PLAN_RECONF_DP_RESHARDING);
    sum += w * (f->have_file ? f->file.fixed_s[PLAN_RECONF_DP_RESHARDING] : 0);
    n += w;
    if (n > 0)
        return ST_MAX(0.0, sum / n);
    if (measured_any(f))
        return 0;
    return f->have_file ? f->file.fixed_s[PLAN_RECONF_DP_RESHARDING] : -1;
}

/* Kind k's fixed part (dp-resharding: what a dp change adds to its move's). */
static double fixed_s(const struct plan_fit *f, enum plan_reconf k) {
    return k == PLAN_RECONF_DP_RESHARDING ? dp_fixed(f) : base_fixed(f, k);
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
            !isfinite(m->bytes_per_s[k]) || m->samples[k] < 0)
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
        return plan__intra_ms(f->cost, 1, 1) / 1000 + move_s(f, k, mv);
    if (k == PLAN_RECONF_DP_RESHARDING) /* the part a dp change adds, alone */
        return fx;
    return fx + (mv->dp_change ? dp_fixed(f) : 0) + move_s(f, k, mv);
}

int plan_fit_observe_move(struct plan_fit *f, enum plan_reconf k,
                          const struct plan_fit_move *mv, double stall_s) {
    if (!f || (unsigned)k >= PLAN_RECONF_DP_RESHARDING || !move_ok(mv) || !(stall_s >= 0) ||
        !isfinite(stall_s))
        return -EINVAL;
    int i = f->nfixed[k] % FIT_MIG_WINDOW;
    f->fixed[k][i] = ST_MAX(0.0, stall_s - move_s(f, k, mv));
    f->fixed_dp[k][i] = mv->dp_change;
    f->nfixed[k]++;
    if (mv->dp_change)
        f->nfixed[PLAN_RECONF_DP_RESHARDING]++;
    f->dirty = true;
    return 0;
}

/* The bytes all in the stall: weights, as far as the charge goes. */
double plan_fit_stall_seconds(const struct plan_fit *f, enum plan_reconf k, double bytes) {
    struct plan_fit_move mv = {bytes, 0, 1, 1, false};
    return plan_fit_stall_seconds_move(f, k, &mv);
}

int plan_fit_observe_migration(struct plan_fit *f, enum plan_reconf k, double bytes,
                               double stall_s) {
    struct plan_fit_move mv = {bytes, 0, 1, 1, false};
    return plan_fit_observe_move(f, k, &mv, stall_s);
}

bool plan_fit_stall_calibrated(const struct plan_fit *f) {
    return f && (f->have_file || measured_any(f));
}

int plan_fit_costs(const struct plan_fit *f, struct plan_measured_costs *ret) {
    if (!f || !ret)
        return -EINVAL;
    if (!measured_any(f))
        return -ENODATA;
    struct plan_measured_costs m;
    memset(&m, 0, sizeof(m));
    if (f->have_file)
        m = f->file;
    else
        m.link_gbps = f->link_bytes_per_s * 8 / 1e9;
    for (int k = 0; k < PLAN_RECONF_NLIVE; k++) {
        m.fixed_s[k] = fixed_s(f, (enum plan_reconf)k); /* >= 0: a migration was measured */
        m.bytes_per_s[k] = rate(f, (enum plan_reconf)k);
        /* What the figure rests on: the file's migrations and this job's (all of them, though
         * the window keeps the last; a later job counts them as at most FIT_PRIOR_MAX). */
        int64_t n = (int64_t)(f->have_file ? f->file.samples[k] : 0) + f->nfixed[k];
        m.samples[k] = (int)ST_MIN(n, (int64_t)INT32_MAX);
    }
    *ret = m;
    return 0;
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
    if (f->have_file || measured_any(f)) {
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
