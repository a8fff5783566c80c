/* liveput.c: the liveput optimizer — which (dp, pp) to run this interval.
 *
 * A backward dynamic program over the next L intervals. The path of live-instance counts
 * comes from the forecast (or the true future for the oracle), with noticed instances taken
 * as certain losses in the interval their notice names. States are shapes; a transition
 * from shape a to shape b in interval t earns throughput(b) x (60 s - migration time), the
 * migration priced by the cost model's expectation over which instances leave (exact
 * hypergeometric probability of staying intra-stage). Only the first step is acted on
 * (receding horizon), and a change must beat staying by the hysteresis margin over the
 * window, so a forecast wobble cannot buy a reconfiguration that does not pay for itself.
 * Optionally (plan_options.count_window > 0) the path is not a point forecast: a
 * stochastic DP draws the change of the count per interval from a distribution fitted on
 * the history (docs/planner.md says what it gains and where it loses; it is off by
 * default). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "planner-internal.h"
#include "planner.h"

void plan_options_init(struct plan_options *o) {
    memset(o, 0, sizeof(*o));
    o->lookahead = 12;
    o->predictor = PLAN_PRED_NOTICE;
    o->hysteresis = NAN; /* by the cost model: plan__margin */
    o->defer = NAN;
    o->defer_max = 3;
    o->count_window = 0;
    o->announced = 2;
}

/* plan__margin: a margin left NAN follows what a migration costs. Against restarts of
 * 30-40 s whose length the profile only estimates, a change must gain PLAN_MARGIN_RESTART;
 * against live migrations measured on the data plane (plan_cost_use_measured) a wrong move
 * costs seconds, and a smaller margin lets the plan take the gains the larger one left
 * (scripts/bench planner: 0.003 -> 0.001 gained 0.0003-0.0015 of ideal on all five of
 * Parcae's models at 10 and 25 Gb/s; 0.0005 and 0 gained no more). */
double plan__margin(const struct plan_cost *c, double set) {
    return !isnan(set) ? set : c->measured ? PLAN_MARGIN_MEASURED : PLAN_MARGIN_RESTART;
}

static bool shape_ok(const struct plan_cost *c, const struct plan_options *o, int dp, int pp) {
    if (!plan_cost_shape_allowed(c, dp, pp))
        return false;
    if (o->pp_min > 0 && pp < o->pp_min)
        return false;
    if (o->pp_max > 0 && pp > o->pp_max)
        return false;
    if (o->dp_min > 0 && dp < o->dp_min)
        return false;
    if (o->dp_max > 0 && dp > o->dp_max)
        return false;
    return !o->rules || plan_shape_check(o->rules, dp, pp) == PLAN_RULE_OK;
}

/* Candidate shapes: every allowed shape when the model is small, otherwise the widest allowed
 * dp for each depth at each count on the path (a narrower dp at the same depth only loses). */
static int candidates(const struct plan_cost *c, const struct plan_options *o, const int *path,
                      int L, struct plan_shape cur, struct plan_shape *out, int max) {
    int n = 0;
    int nmax = 0;
    for (int t = 0; t < L; t++)
        nmax = ST_MAX(nmax, path[t]);
    if (c->nshapes <= 256) {
        for (int i = 0; i < c->nshapes && n < max; i++) {
            struct plan_shape s = c->shapes[i];
            if (s.dp * s.pp <= nmax && shape_ok(c, o, s.dp, s.pp))
                out[n++] = s;
        }
    } else {
        for (int t = 0; t < L; t++) {
            if (t > 0 && path[t] == path[t - 1])
                continue;
            for (int pp = 1; pp <= c->nlayers && n < max; pp++) {
                int dp = path[t] / pp;
                while (dp >= 1 && !shape_ok(c, o, dp, pp))
                    dp--;
                if (dp < 1)
                    continue;
                bool dup = false;
                for (int k = 0; k < n && !dup; k++)
                    dup = out[k].dp == dp && out[k].pp == pp;
                if (!dup)
                    out[n++] = (struct plan_shape){dp, pp};
            }
        }
    }
    if (cur.dp > 0 && n < max && shape_ok(c, o, cur.dp, cur.pp)) {
        bool dup = false;
        for (int k = 0; k < n && !dup; k++)
            dup = out[k].dp == cur.dp && out[k].pp == cur.pp;
        if (!dup)
            out[n++] = cur;
    }
    return n;
}

#define MAXC 2048
#define JM 8                  /* instances added beyond the path the stochastic DP tracks */
#define JL 4                  /* instances lost beyond the path it tracks */
#define NJ (JM + JL + 1)      /* count offsets -JL..JM */
#define STOCH_MAXK 128        /* more candidates than this: the deterministic DP only */

/* The count model, fitted online from the history alone (no look at the future): the
 * distribution of the change of the count in one interval, p[g][d + JL] for d = -JL..JM
 * (clamped), conditioned on g = whether the interval before added instances. Clouds announce
 * losses (notices) but never additions, and additions come in bursts. One smoothing
 * pseudo-interval without a change. Returns false when the history is too short. */
static bool count_model(const int *hist, int nhist, int window, double p[2][NJ]) {
    if (window <= 0 || nhist < 3)
        return false;
    double cnt[2][NJ] = {{0}};
    int first = ST_MAX(2, nhist - window);
    for (int j = first; j < nhist; j++) {
        int g = hist[j - 1] > hist[j - 2];
        int d = ST_MIN(JM, ST_MAX(-JL, hist[j] - hist[j - 1]));
        cnt[g][d + JL] += 1;
    }
    for (int g = 0; g < 2; g++) {
        double tot = 0;
        for (int k = 0; k < NJ; k++)
            tot += cnt[g][k];
        for (int k = 0; k < NJ; k++)
            p[g][k] = (cnt[g][k] + (k == JL)) / (tot + 1);
    }
    return true;
}

/* Transition matrices of the stochastic DP, one per (instances before, instances lost). A
 * repartition's estimate depends on the loss only through the add/remove restart, so it is
 * computed once per pair (rep0: without the restart) and completed per key; same-depth
 * pairs are priced by the estimate. */
struct smats {
    const struct plan_cost *cost;
    const struct plan_shape *cand;
    int K, slots, used, next;
    int key_n[64], key_out[64];
    double *m[64];
    double *rep0, *rst_add, *rst_rm;
};

static const double *smats_get(struct smats *sm, int N, int n_out) {
    for (int i = 0; i < sm->used; i++)
        if (sm->key_n[i] == N && sm->key_out[i] == n_out)
            return sm->m[i];
    int i = sm->used < sm->slots ? sm->used++ : (sm->next++ % sm->slots);
    int K = sm->K;
    const struct plan_shape *c = sm->cand;
    double *M = sm->m[i];
    for (int a = 0; a < K; a++)
        for (int b = 0; b < K; b++) {
            size_t ab = (size_t)a * K + b;
            if (a == b && n_out == 0)
                M[ab] = 0;
            else if (c[a].pp != c[b].pp)
                M[ab] = sm->rep0[ab] + (c[b].dp * c[b].pp > c[a].dp * c[a].pp - n_out
                                            ? sm->rst_add[b]
                                            : sm->rst_rm[b]);
            else
                M[ab] = plan_cost_transition_estimate_ms(sm->cost, N, c[a].dp, c[a].pp, 0,
                                                         n_out, c[b].dp, c[b].pp, NULL);
        }
    sm->key_n[i] = N;
    sm->key_out[i] = n_out;
    return M;
}

/* Non-anticipative stochastic DP over the window: the count in interval t is the path plus
 * an offset J (-JL..JM) that moves by the count model's draws, each interval's shape chosen
 * knowing only the draws so far. Losses in the first `announced` intervals are left to the
 * notices (already on the path). Fills Wn[b] = expected best value of intervals 1..L-1 with
 * shape b in interval 0, and *ret_keep = the expected value of keeping shape `stay` (moving
 * only when it stops fitting). Returns 0 or -ENOMEM. */
static int stoch_dp(const struct plan_cost *cost, const struct plan_options *o,
                    const struct plan_shape *cand, const double *thr, int K, const int *path,
                    const int *nout, int L, double (*pm)[NJ], int g0, int announced, int stay,
                    int ncap, double *Wn, double *ret_keep) {
    int r = 0;
    size_t ksz = (size_t)K * K, wsz = (size_t)K * NJ * 2;
    struct smats sm = {.cost = cost, .cand = cand, .K = K};
    sm.slots = (int)ST_MIN((size_t)64, ST_MAX((size_t)4, ((size_t)8 << 20) / (ksz * 8)));
    double *buf = st_malloc(sizeof(double) * (ksz * (size_t)(sm.slots + 1) + 2 * (size_t)K +
                                              2 * wsz + 4 * NJ));
    if (!buf)
        return -ENOMEM;
    for (int i = 0; i < sm.slots; i++)
        sm.m[i] = buf + ksz * (size_t)i;
    sm.rep0 = buf + ksz * (size_t)sm.slots;
    sm.rst_add = sm.rep0 + ksz;
    sm.rst_rm = sm.rst_add + K;
    double *Wa = sm.rst_rm + K, *Wb = Wa + wsz, *Ka = Wb + wsz, *Kb = Ka + 2 * NJ;
    for (int b = 0; b < K; b++) {
        sm.rst_add[b] = plan_cost_restart_ms(cost, cand[b].dp, cand[b].pp, true);
        sm.rst_rm[b] = plan_cost_restart_ms(cost, cand[b].dp, cand[b].pp, false);
    }
    for (int a = 0; a < K; a++)
        for (int b = 0; b < K; b++) {
            if (cand[a].pp == cand[b].pp) {
                sm.rep0[(size_t)a * K + b] = 0;
                continue;
            }
            bool add = cand[b].dp * cand[b].pp > cand[a].dp * cand[a].pp;
            sm.rep0[(size_t)a * K + b] =
                plan_cost_transition_estimate_ms(cost, 0, cand[a].dp, cand[a].pp, 0, 0,
                                                 cand[b].dp, cand[b].pp, NULL) -
                (add ? sm.rst_add[b] : sm.rst_rm[b]);
        }
#define WI(k, j, g) (((size_t)(k) * NJ + (size_t)(j)) * 2 + (size_t)(g))
    double *Wnext = Wa, *Wcur = Wb, *Knext = Ka, *Kcur = Kb;
    for (int k = 0; k < K; k++)
        for (int j = 0; j < NJ; j++)
            for (int g = 0; g < 2; g++)
                Wnext[WI(k, j, g)] = o->tail * PLAN_INTERVAL_S * thr[k];
    for (int i = 0; i < 2 * NJ; i++)
        Knext[i] = stay >= 0 ? o->tail * PLAN_INTERVAL_S * thr[stay] : 0;
    for (int t = L - 1; t >= 1; t--) {
        for (int j = 0; j < NJ; j++) {
            int Np = ST_MIN(ncap, ST_MAX(0, path[t - 1] + j - JL));
            for (int g = 0; g < 2; g++) {
                for (int a = 0; a < K; a++)
                    Wcur[WI(a, j, g)] =
                        cand[a].dp * cand[a].pp > Np + o->spares ? -INFINITY : 0;
                Kcur[j * 2 + g] = 0;
                for (int dk = 0; dk < NJ; dk++) {
                    double p = pm[g][dk];
                    int d = dk - JL;
                    if (t <= announced && d < 0)
                        continue; /* announced: the loss is on the path already */
                    if (t <= announced && d == 0)
                        for (int e = 0; e < JL; e++)
                            p += pm[g][e];
                    if (p <= 0)
                        continue;
                    int j2 = ST_MIN(NJ - 1, ST_MAX(0, j + d)), g2 = d > 0;
                    int lost = d < 0 ? ST_MIN(-d, Np) : 0;
                    int Nt = ST_MIN(ncap, ST_MAX(0, path[t] + j2 - JL));
                    const double *M = smats_get(&sm, Np + o->spares, nout[t] + lost);
                    for (int a = 0; a < K; a++) {
                        if (Wcur[WI(a, j, g)] == -INFINITY)
                            continue;
                        double best = -INFINITY;
                        for (int b = 0; b < K; b++) {
                            double wn = Wnext[WI(b, j2, g2)];
                            if (cand[b].dp * cand[b].pp > Nt || wn == -INFINITY)
                                continue;
                            double v = thr[b] * ST_MAX(0.0, PLAN_INTERVAL_S -
                                                                M[(size_t)a * K + b] / 1000.0) +
                                       wn;
                            if (v > best)
                                best = v;
                        }
                        /* nothing fits: the job idles, keep the value so far */
                        double v = best == -INFINITY ? 0 : best;
                        Wcur[WI(a, j, g)] += p * v;
                        if (a == stay) {
                            /* keeping: stay while it fits, else the forced best move */
                            double kv = v;
                            if (cand[stay].dp * cand[stay].pp <= Nt)
                                kv = thr[stay] * ST_MAX(0.0, PLAN_INTERVAL_S -
                                                                 M[(size_t)a * K + a] / 1000.0) +
                                     Knext[j2 * 2 + g2];
                            Kcur[j * 2 + g] += p * kv;
                        }
                    }
                }
            }
        }
        double *tmp = Wnext;
        Wnext = Wcur;
        Wcur = tmp;
        tmp = Knext;
        Knext = Kcur;
        Kcur = tmp;
    }
    for (int k = 0; k < K; k++)
        Wn[k] = Wnext[WI(k, JL, g0)];
    *ret_keep = stay >= 0 ? Knext[JL * 2 + g0] : -INFINITY;
#undef WI
    st_free(buf);
    return r;
}

int plan_decide(const struct plan_cost *cost, const struct plan_situation *s,
                const struct plan_options *o, struct plan_decision *ret) {
    if (!cost || !s || !o || !ret)
        return -EINVAL;
    if (s->n_before < 0 || s->n_in < 0 || s->n_out < 0 || s->n_out > s->n_before + s->n_in ||
        !s->hist || s->nhist < 1 || s->nnotices < 0 || (s->nnotices > 0 && !s->notices))
        return -EINVAL;
    int L = o->lookahead > 0 ? ST_MIN(o->lookahead, PLAN_MAX_LOOKAHEAD) : 12;
    int r = 0;
    struct plan_decision d;
    memset(&d, 0, sizeof(d));
    int N0 = s->n_before + s->n_in - s->n_out;
    /* Path of counts and events. */
    int path[PLAN_MAX_LOOKAHEAD], nin[PLAN_MAX_LOOKAHEAD], nout[PLAN_MAX_LOOKAHEAD];
    int noticed[PLAN_MAX_LOOKAHEAD + 1] = {0};
    path[0] = N0;
    nin[0] = s->n_in;
    nout[0] = s->n_out;
    for (int i = 0; i < s->nnotices; i++) {
        double sec = s->notices[i].seconds;
        if (sec <= 0)
            continue;
        int t = (int)ceil(sec / PLAN_INTERVAL_S - 1e-9);
        if (t >= 1 && t < L)
            noticed[t]++;
    }
    int fc[PLAN_MAX_LOOKAHEAD];
    if (L > 1) {
        if (s->future && s->nfuture > 0) {
            for (int t = 1; t < L; t++)
                fc[t - 1] = s->future[ST_MIN(t - 1, s->nfuture - 1)];
        } else {
            int hi = ST_MAX(cost->max_n, N0);
            r = plan_forecast(o->predictor, s->hist, s->nhist, L - 1, 0, hi, o->seed, fc);
            if (r < 0)
                return r;
        }
    }
    int cum = 0;
    for (int t = 1; t < L; t++) {
        int f = fc[t - 1];
        if (!s->future) {
            cum += noticed[t];
            f = ST_MAX(0, f - cum);
        }
        path[t] = f;
        int dlt = path[t] - path[t - 1];
        nout[t] = ST_MAX(dlt < 0 ? -dlt : 0, s->future ? 0 : noticed[t]);
        nin[t] = dlt + nout[t];
        if (nin[t] < 0) { /* noticed losses beyond the forecast drop */
            nout[t] -= nin[t];
            nin[t] = 0;
        }
    }
    for (int t = 0; t < L; t++)
        path[t] = ST_MAX(0, path[t] - o->spares);
    d.npred = L;
    for (int t = 0; t < L; t++)
        d.pred_n[t] = path[t] + o->spares;

    static const int maxc = MAXC;
    struct plan_shape *cand = st_malloc(sizeof(*cand) * MAXC);
    double *W = st_malloc(sizeof(double) * MAXC * 2);
    double *M = NULL;
    if (!cand || !W) {
        r = -ENOMEM;
        goto out;
    }
    double pm[2][NJ];
    bool stoch = !s->future && count_model(s->hist, s->nhist, o->count_window, pm);
    int cpath[PLAN_MAX_LOOKAHEAD];
    for (int t = 0; t < L; t++)
        cpath[t] = path[t] + (stoch && t > 0 ? JM : 0);
    int K = candidates(cost, o, stoch ? cpath : path, L, s->cur, cand, maxc);
    if (K > STOCH_MAXK)
        stoch = false;
    M = st_malloc(sizeof(double) * (size_t)ST_MAX(K, 1) * (size_t)ST_MAX(K, 1));
    if (!M) {
        r = -ENOMEM;
        goto out;
    }
    double *Wn = W, *Wt = W + MAXC;
    double thr[MAXC];
    for (int k = 0; k < K; k++)
        thr[k] = plan_cost_throughput(cost, cand[k].dp, cand[k].pp);
    /* Backward pass: Wn[b] = best value of intervals t+1.. given shape b in interval t. */
    for (int k = 0; k < K; k++)
        Wn[k] = o->tail * PLAN_INTERVAL_S * thr[k];
    int key_N = -1, key_in = -1, key_out = -1;
    for (int t = L - 1; t >= 1; t--) {
        int Nprev = path[t - 1] + o->spares;
        if (Nprev != key_N || nin[t] != key_in || nout[t] != key_out) {
            for (int a = 0; a < K; a++)
                for (int b = 0; b < K; b++)
                    M[(size_t)a * K + b] =
                        (a == b && nout[t] == 0)
                            ? 0
                            : plan_cost_transition_estimate_ms(cost, Nprev, cand[a].dp,
                                                               cand[a].pp, nin[t], nout[t],
                                                               cand[b].dp, cand[b].pp, NULL);
            key_N = Nprev;
            key_in = nin[t];
            key_out = nout[t];
        }
        for (int a = 0; a < K; a++) {
            double best = -INFINITY;
            if (cand[a].dp * cand[a].pp > path[t - 1] + o->spares) {
                Wt[a] = -INFINITY;
                continue;
            }
            for (int b = 0; b < K; b++) {
                if (cand[b].dp * cand[b].pp > path[t] || Wn[b] == -INFINITY)
                    continue;
                double ms = M[(size_t)a * K + b];
                double v = thr[b] * ST_MAX(0.0, PLAN_INTERVAL_S - ms / 1000.0) + Wn[b];
                if (v > best)
                    best = v;
            }
            /* nothing fits later: the job idles, keep the value so far */
            Wt[a] = best == -INFINITY ? 0 : best;
        }
        double *tmp = Wn;
        Wn = Wt;
        Wt = tmp;
    }
    int stay0 = -1;
    for (int k = 0; k < K; k++)
        if (cand[k].dp == s->cur.dp && cand[k].pp == s->cur.pp)
            stay0 = k;
    double skeep = -INFINITY;
    if (stoch) {
        r = stoch_dp(cost, o, cand, thr, K, path, nout, L, pm, s->n_in > 0, o->announced,
                     stay0, ST_MAX(cost->max_n, N0), Wn, &skeep);
        if (r < 0)
            goto out;
    }
    /* First step from the current shape. */
    int best = -1, stay = -1;
    double bestv = -INFINITY, stayv = -INFINITY, best_ms = 0;
    enum plan_mig_kind best_kind = PLAN_KIND_NONE;
    for (int b = 0; b < K; b++) {
        if (cand[b].dp * cand[b].pp > path[0] || Wn[b] == -INFINITY)
            continue;
        enum plan_mig_kind kind = PLAN_KIND_NONE;
        bool same = cand[b].dp == s->cur.dp && cand[b].pp == s->cur.pp;
        double ms = (same && s->n_out == 0)
                        ? 0
                        : plan_cost_transition_estimate_ms(cost, s->n_before + o->spares,
                                                           s->cur.dp, s->cur.pp, s->n_in,
                                                           s->n_out, cand[b].dp, cand[b].pp,
                                                           &kind);
        if (s->migrating && s->remain_ms > 0)
            ms = ms > 0 ? ms + plan_cost_restart_ms(cost, cand[b].dp, cand[b].pp, false)
                        : s->remain_ms;
        double v = thr[b] * ST_MAX(0.0, PLAN_INTERVAL_S - ms / 1000.0) + Wn[b];
        if (v > bestv) {
            bestv = v;
            best = b;
            best_ms = ms;
            best_kind = ms > 0 ? kind : PLAN_KIND_NONE;
        }
        if (same) {
            stay = b;
            stayv = v;
        }
    }
    /* Value of keeping the current shape for the whole window: the yardstick a change must
     * beat (comparing with "stay now, move later" would let the DP put a change off forever). */
    double keepv = -INFINITY;
    if (stay >= 0 && stoch) {
        keepv = skeep == -INFINITY ? -INFINITY : stayv - Wn[stay] + skeep;
    } else if (stay >= 0) {
        keepv = stayv - Wn[stay];
        for (int t = 1; t < L && keepv != -INFINITY; t++) {
            if (cand[stay].dp * cand[stay].pp > path[t]) {
                keepv = -INFINITY;
                break;
            }
            double ms = nout[t] == 0 ? 0
                                     : plan_cost_transition_estimate_ms(
                                           cost, path[t - 1] + o->spares, cand[stay].dp,
                                           cand[stay].pp, nin[t], nout[t], cand[stay].dp,
                                           cand[stay].pp, NULL);
            keepv += thr[stay] * ST_MAX(0.0, PLAN_INTERVAL_S - ms / 1000.0);
        }
        keepv += o->tail * PLAN_INTERVAL_S * thr[stay];
    }
    /* Intervals since the count last changed: a change is deferred at most defer_max of them,
     * so "later" cannot become "never". */
    int quiet = 0;
    while (quiet + 1 < s->nhist && s->hist[s->nhist - 1 - quiet] == s->hist[s->nhist - 2 - quiet])
        quiet++;
    if (s->n_in + s->n_out > 0)
        quiet = 0;
    if (best < 0) {
        d.shape = (struct plan_shape){0, 0};
        d.need_on_demand = o->on_demand_fallback;
        snprintf(d.reason, sizeof(d.reason), "no shape fits %d instances%s", N0,
                 o->on_demand_fallback ? "; on-demand fallback wanted" : "");
    } else if (stay >= 0 && stay != best &&
               ((keepv != -INFINITY && bestv <= keepv * (1 + plan__margin(cost, o->hysteresis))) ||
                (quiet < o->defer_max && bestv <= stayv * (1 + plan__margin(cost, o->defer))))) {
        d.shape = cand[stay];
        d.expected_samples = stayv;
        d.kind = s->n_out > 0 ? PLAN_KIND_INTRA : PLAN_KIND_NONE;
        snprintf(d.reason, sizeof(d.reason),
                 "keep %dx%d: best change %dx%d gains only %.2f%% over %d intervals",
                 s->cur.dp, s->cur.pp, cand[best].dp, cand[best].pp,
                 keepv > 0 ? 100 * (bestv - keepv) / keepv : 0.0, L);
    } else {
        d.shape = cand[best];
        d.expected_samples = bestv;
        d.cost_ms = best_ms;
        d.kind = best_kind;
        if (best == stay)
            snprintf(d.reason, sizeof(d.reason), "keep %dx%d: best over %d intervals",
                     s->cur.dp, s->cur.pp, L);
        else if (keepv == -INFINITY)
            snprintf(d.reason, sizeof(d.reason),
                     "move %dx%d -> %dx%d (%s, %.1f s): the current shape does not fit the "
                     "next %d intervals",
                     s->cur.dp, s->cur.pp, cand[best].dp, cand[best].pp,
                     plan_mig_kind_name(best_kind), best_ms / 1000, L);
        else
            snprintf(d.reason, sizeof(d.reason),
                     "move %dx%d -> %dx%d (%s, %.1f s): +%.2f%% samples over %d intervals",
                     s->cur.dp, s->cur.pp, cand[best].dp, cand[best].pp,
                     plan_mig_kind_name(best_kind), best_ms / 1000,
                     keepv > 0 && keepv != -INFINITY ? 100 * (bestv - keepv) / keepv : 100.0, L);
    }
    *ret = d;
out:
    st_free(cand);
    st_free(W);
    st_free(M);
    return r;
}
