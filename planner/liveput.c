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
    o->analogs = 0;
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
#define JMAX 8 /* additions beyond the path tracked by the stochastic DP */

/* The additions model, fitted online from the history alone (no look at the future): the
 * distribution of instances added in an interval, p[g][m] for m = 0..JMAX (JMAX: that many
 * or more), conditioned on g = whether the interval before also added instances. Clouds
 * announce losses (notices) but never additions, and additions come in bursts: after a
 * join, another join within minutes is far likelier than at a random time, which a point
 * forecast (last value) cannot express. Laplace-smoothed counts over the last `window`
 * intervals; returns false (no model) when the history is too short. */
static bool join_model(const int *hist, int nhist, int window, double p[2][JMAX + 1]) {
    if (window <= 0 || nhist < 3)
        return false;
    double cnt[2][JMAX + 1] = {{0}};
    int first = ST_MAX(2, nhist - window);
    for (int j = first; j < nhist; j++) {
        int g = hist[j - 1] > hist[j - 2];
        int m = ST_MIN(JMAX, ST_MAX(0, hist[j] - hist[j - 1]));
        cnt[g][m] += 1;
    }
    for (int g = 0; g < 2; g++) {
        double tot = 0;
        for (int m = 0; m <= JMAX; m++)
            tot += cnt[g][m];
        /* smoothing: one pseudo-interval without a join */
        for (int m = 0; m <= JMAX; m++)
            p[g][m] = (cnt[g][m] + (m == 0)) / (tot + 1);
    }
    return true;
}

/* Transition matrices M[a * K + b] (ms) per (N before, n_out), kept for the decision. */
struct mcache {
    int slots, used, next;
    int key_n[16], key_out[16];
    double *m[16];
};

static const double *mcache_get(struct mcache *mc, const struct plan_cost *cost,
                                 const struct plan_shape *cand, int K, int N, int n_in,
                                 int n_out) {
    for (int i = 0; i < mc->used; i++)
        if (mc->key_n[i] == N && mc->key_out[i] == n_out)
            return mc->m[i];
    int i = mc->used < mc->slots ? mc->used++ : (mc->next++ % mc->slots);
    double *M = mc->m[i];
    for (int a = 0; a < K; a++)
        for (int b = 0; b < K; b++)
            M[(size_t)a * K + b] =
                (a == b && n_out == 0)
                    ? 0
                    : plan_cost_transition_estimate_ms(cost, N, cand[a].dp, cand[a].pp, n_in,
                                                       n_out, cand[b].dp, cand[b].pp, NULL);
    mc->key_n[i] = N;
    mc->key_out[i] = n_out;
    return M;
}

/* Backward pass over the path with additions drawn from the join model (non-anticipative:
 * each interval's shape is chosen knowing only the additions so far). The state after
 * interval t is (shape, J = instances added beyond the path so far, g = whether interval t
 * added instances). On return Wn[b] = expected best value of intervals 1..L-1 given shape b
 * in interval 0 and state (0, g0). Without a model (pj == NULL) it is the deterministic DP
 * over the path. Wa and Wb are scratch of K * (JMAX + 1) * 2 entries. */
static void dp_backward(const struct plan_cost *cost, const struct plan_options *o,
                        const struct plan_shape *cand, const double *thr, int K, const int *path,
                        const int *nin, const int *nout, int L, double (*pj)[JMAX + 1], int g0,
                        int ncap, struct mcache *mc, double *Wn, double *Wa, double *Wb) {
    int JS = pj ? JMAX + 1 : 1, GS = pj ? 2 : 1;
#define IDX(k, j, g) (((size_t)(k) * (size_t)JS + (size_t)(j)) * (size_t)GS + (size_t)(g))
    double *Wnext = Wa, *Wcur = Wb;
    for (int k = 0; k < K; k++)
        for (int j = 0; j < JS; j++)
            for (int g = 0; g < GS; g++)
                Wnext[IDX(k, j, g)] = o->tail * PLAN_INTERVAL_S * thr[k];
    for (int t = L - 1; t >= 1; t--) {
        for (int j = 0; j < JS; j++) {
            int Nprev = ST_MIN(path[t - 1] + j, ncap);
            /* with no loss the transition does not depend on N: one matrix for every j */
            const double *M = mcache_get(mc, cost, cand, K, nout[t] == 0 ? -1 : Nprev + o->spares,
                                         nin[t], nout[t]);
            for (int g = 0; g < GS; g++) {
                for (int a = 0; a < K; a++) {
                    if (cand[a].dp * cand[a].pp > Nprev + o->spares) {
                        Wcur[IDX(a, j, g)] = -INFINITY;
                        continue;
                    }
                    double ev = 0;
                    for (int m = 0; m < (pj ? JMAX + 1 : 1); m++) {
                        double pm = pj ? pj[g][m] : 1;
                        if (pm <= 0)
                            continue;
                        int j2 = ST_MIN(j + m, JS - 1), g2 = pj ? m > 0 : 0;
                        int Nt = ST_MIN(path[t] + j2, ncap);
                        double best = -INFINITY;
                        for (int b = 0; b < K; b++) {
                            double wn = Wnext[IDX(b, j2, g2)];
                            if (cand[b].dp * cand[b].pp > Nt || wn == -INFINITY)
                                continue;
                            double ms = M[(size_t)a * K + b];
                            double v = thr[b] * ST_MAX(0.0, PLAN_INTERVAL_S - ms / 1000.0) + wn;
                            if (v > best)
                                best = v;
                        }
                        /* nothing fits later: the job idles, keep the value so far */
                        ev += pm * (best == -INFINITY ? 0 : best);
                    }
                    Wcur[IDX(a, j, g)] = ev;
                }
            }
        }
        double *tmp = Wnext;
        Wnext = Wcur;
        Wcur = tmp;
    }
    for (int k = 0; k < K; k++)
        Wn[k] = Wnext[IDX(k, 0, pj ? g0 : 0)];
#undef IDX
}

/* Value of keeping shape k over intervals 1..L-1 of a path; -INFINITY if it stops fitting. */
static double keep_value(const struct plan_cost *cost, const struct plan_options *o,
                         struct plan_shape sh, double thr, const int *path, const int *nin,
                         const int *nout, int L) {
    double v = 0;
    for (int t = 1; t < L; t++) {
        if (sh.dp * sh.pp > path[t])
            return -INFINITY;
        double ms = nout[t] == 0 ? 0
                                 : plan_cost_transition_estimate_ms(cost, path[t - 1] + o->spares,
                                                                    sh.dp, sh.pp, nin[t],
                                                                    nout[t], sh.dp, sh.pp, NULL);
        v += thr * ST_MAX(0.0, PLAN_INTERVAL_S - ms / 1000.0);
    }
    return v + o->tail * PLAN_INTERVAL_S * thr;
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

    /* The additions model (only without the true future). */
    double pj[2][JMAX + 1];
    bool have_pj = !s->future && join_model(s->hist, s->nhist, o->analogs, pj);
    int g0 = s->n_in > 0;
    int cpath[PLAN_MAX_LOOKAHEAD];
    for (int t = 0; t < L; t++)
        cpath[t] = path[t] + (have_pj && t > 0 ? JMAX : 0);

    static const int maxc = MAXC;
    struct plan_shape *cand = st_malloc(sizeof(*cand) * MAXC);
    double *W = st_malloc(sizeof(double) * MAXC * 3);
    double *Wab = NULL;
    double *Mbuf = NULL;
    struct mcache mc = {0};
    if (!cand || !W) {
        r = -ENOMEM;
        goto out;
    }
    int K = candidates(cost, o, cpath, L, s->cur, cand, maxc);
    size_t msz = (size_t)ST_MAX(K, 1) * (size_t)ST_MAX(K, 1);
    /* matrix cache: up to 16 (N, n_out) keys within 32 MiB */
    mc.slots = (int)ST_MIN((size_t)16, ST_MAX((size_t)1, ((size_t)32 << 20) / (msz * sizeof(double))));
    Mbuf = st_malloc(sizeof(double) * msz * (size_t)mc.slots);
    if (!Mbuf) {
        r = -ENOMEM;
        goto out;
    }
    for (int i = 0; i < mc.slots; i++)
        mc.m[i] = Mbuf + msz * (size_t)i;
    size_t wsz = (size_t)ST_MAX(K, 1) * (JMAX + 1) * 2;
    Wab = st_malloc(sizeof(double) * wsz * 2);
    if (!Wab) {
        r = -ENOMEM;
        goto out;
    }
    double *Wn = W;
    double thr[MAXC];
    for (int k = 0; k < K; k++)
        thr[k] = plan_cost_throughput(cost, cand[k].dp, cand[k].pp);
    int ncap = ST_MAX(cost->max_n, N0);
    dp_backward(cost, o, cand, thr, K, path, nin, nout, L, have_pj ? pj : NULL, g0, ncap, &mc,
                Wn, Wab, Wab + wsz);
    int stay = -1;
    for (int k = 0; k < K; k++)
        if (cand[k].dp == s->cur.dp && cand[k].pp == s->cur.pp)
            stay = k;
    double keepv_after =
        stay >= 0 ? keep_value(cost, o, cand[stay], thr[stay], path, nin, nout, L) : -INFINITY;
    /* First step from the current shape. */
    int best = -1;
    double bestv = -INFINITY, stayv = -INFINITY, best_ms = 0;
    enum plan_mig_kind best_kind = PLAN_KIND_NONE;
    for (int b = 0; b < K; b++) {
        if (cand[b].dp * cand[b].pp > path[0] || Wn[b] == -INFINITY)
            continue;
        enum plan_mig_kind kind = PLAN_KIND_NONE;
        bool same = b == stay;
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
        if (same)
            stayv = v;
    }
    if (stayv == -INFINITY)
        stay = -1;
    /* Value of keeping the current shape for the whole window: the yardstick a change must
     * beat (comparing with "stay now, move later" would let the DP put a change off forever). */
    double keepv = -INFINITY;
    if (stay >= 0 && keepv_after != -INFINITY)
        keepv = stayv - Wn[stay] + keepv_after;
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
    st_free(Wab);
    st_free(Mbuf);
    return r;
}
