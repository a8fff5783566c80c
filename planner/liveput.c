/* liveput.c: the liveput optimizer — which (dp, pp) to run this interval.
 *
 * A backward dynamic program over the next L intervals. The path of live-instance counts
 * comes from the forecast (or the true future for the oracle), with noticed instances taken
 * as certain losses in the interval their notice names. States are shapes; a transition
 * from shape a to shape b in interval t earns throughput(b) x (60 s - migration time), the
 * migration priced by the cost model's expectation over which instances leave (exact
 * hypergeometric probability of staying intra-stage). Only the first step is acted on
 * (receding horizon), and a change must beat staying by the hysteresis margin over the
 * window, so a forecast wobble cannot buy a reconfiguration that does not pay for itself. */
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
    o->hysteresis = 0.003;
    o->defer = 0.003;
    o->defer_max = 3;
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
    return true;
}

/* Candidate shapes: every allowed shape when the model is small, otherwise the widest dp for
 * each depth at each count on the path (a narrower dp at the same depth only loses). */
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
                if (dp < 1 || !shape_ok(c, o, dp, pp))
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
    int K = candidates(cost, o, path, L, s->cur, cand, maxc);
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
    if (stay >= 0) {
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
               ((keepv != -INFINITY && bestv <= keepv * (1 + o->hysteresis)) ||
                (quiet < o->defer_max && bestv <= stayv * (1 + o->defer)))) {
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
