/* forecast.c: predicting the number of live instances over the next L intervals.
 *
 * Three predictors: last value; Parcae's ARIMA(1,1,0) with its pre- and post-processing
 * (outlier removal, turning-point flattening, growth bounds, fleet bounds, in/out penalties,
 * liveput/trace_prediction.py), fitted here by conditional least squares instead of
 * statsmodels' exact likelihood; and ours, an ensemble of last value, a damped trend and the
 * recent mean whose weights follow each member's recent error at each horizon. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "common.h"
#include "planner-internal.h"
#include "planner.h"

#define HIST_MAX 4096

const char *plan_predictor_name(enum plan_predictor p) {
    static const char *const names[PLAN_PRED_NKINDS] = {
#define PLAN_PREDICTOR(e, name, doc) [e] = name,
#include "predictors.def"
#undef PLAN_PREDICTOR
    };
    return (unsigned)p < PLAN_PRED_NKINDS ? names[p] : "?";
}

const char *plan_predictor_names(void) {
    static const char list[] = ""
#define PLAN_PREDICTOR(e, name, doc) ", " name
#include "predictors.def"
#undef PLAN_PREDICTOR
        ;
    return list + 2; /* without the first ", " */
}

int plan_predictor_parse(const char *s, enum plan_predictor *ret) {
    for (int i = 0; i < PLAN_PRED_NKINDS; i++)
        if (strcmp(s, plan_predictor_name((enum plan_predictor)i)) == 0) {
            *ret = (enum plan_predictor)i;
            return 0;
        }
    return -EINVAL;
}

static int clampi(double v, int lo, int hi) {
    if (v < lo)
        return lo;
    if (v > hi)
        return hi;
    return (int)v;
}

/* Parcae's history length for a look-ahead (trace.py). */
static int past_for(int L) {
    switch (L) {
    case 14:
        return 17;
    case 12:
        return 12;
    case 10:
        return 10;
    case 9:
        return 9;
    case 8:
        return 8;
    case 7:
        return 8;
    case 5:
        return 10;
    default:
        return L < 7 ? 7 : L;
    }
}

static void remove_outlier(double *a, int n, int size) {
    for (int i = 0; i < n - 1 - size; i++) {
        if (a[i] != a[i + 1 + size])
            continue;
        bool all = true;
        for (int j = 1; j <= size; j++)
            if (a[i] == a[i + j])
                all = false;
        if (all)
            for (int j = 1; j <= size; j++)
                a[i + j] = a[i];
    }
}

static void handle_turnpoint(double *a, int n) {
    double l = a[0], r = a[n - 1], mn = a[0], mx = a[0];
    for (int i = 0; i < n; i++) {
        mn = ST_MIN(mn, a[i]);
        mx = ST_MAX(mx, a[i]);
    }
    if (mn < ST_MIN(l, r)) {
        int pos = 0;
        for (int i = 0; i < n; i++)
            if (a[i] == mn)
                pos = i;
        for (int i = 0; i < pos; i++)
            a[i] = mn;
    } else if (mx > ST_MAX(l, r)) {
        int pos = 0;
        for (int i = 0; i < n; i++)
            if (a[i] == mx)
                pos = i;
        for (int i = 0; i < pos; i++)
            a[i] = mx;
    }
}

static double stddev(const double *a, int n) {
    double m = 0, v = 0;
    for (int i = 0; i < n; i++)
        m += a[i];
    m /= n;
    for (int i = 0; i < n; i++)
        v += (a[i] - m) * (a[i] - m);
    return sqrt(v / n);
}

static bool sorted(const double *a, int n, bool asc) {
    for (int i = 0; i + 1 < n; i++)
        if (asc ? a[i] > a[i + 1] : a[i] < a[i + 1])
            return false;
    return true;
}

/* Poisson draw (Knuth) from a splitmix state. */
static int poisson(double lambda, uint64_t *st) {
    double l = exp(-lambda), p = 1;
    int k = 0;
    do {
        k++;
        p *= (double)(plan__rng_next(st) >> 11) / 9007199254740992.0;
    } while (p > l && k < 1000);
    return k - 1;
}

static void arima(const int *hist, int nhist, int L, int lo, int hi, uint64_t seed, int *out) {
    int n = ST_MIN(nhist, past_for(L));
    double a[HIST_MAX], rem[HIST_MAX];
    const int *h = hist + nhist - n;
    for (int i = 0; i < n; i++) {
        a[i] = h[i];
        rem[i] = i > 0 && h[i] < h[i - 1] ? h[i - 1] - h[i] : 0;
    }
    if (n < 3 || nhist < past_for(L)) { /* Parcae: too little history, flat */
        for (int k = 0; k < L; k++)
            out[k] = hist[nhist - 1];
        return;
    }
    for (int s = 3; s >= 1; s--)
        remove_outlier(a, n, s);
    handle_turnpoint(a, n);
    double in_pen = 1, out_pen = 1;
    if (sorted(a, n, true)) {
        double mn = a[0];
        for (int i = 0; i < n; i++)
            mn = ST_MIN(mn, a[i]);
        double delta = a[n - 1] - mn;
        in_pen = delta >= 10 ? 0.5 : delta >= 5 ? 0.75 : 1;
    }
    if (sorted(a, n, false)) {
        double mx = a[0];
        for (int i = 0; i < n; i++)
            mx = ST_MAX(mx, a[i]);
        double delta = mx - a[n - 1];
        out_pen = delta >= 10 ? 0.5 : delta >= 5 ? 0.75 : 1;
    }
    double est[PLAN_MAX_LOOKAHEAD];
    double sd = stddev(a, n);
    if (sd == 0) {
        for (int k = 0; k < L; k++)
            est[k] = rint(a[n - 1]);
    } else {
        /* ARIMA(1,1,0) with drift on the differences z: z_t - mu = phi (z_{t-1} - mu) */
        double z[HIST_MAX];
        int nz = n - 1;
        for (int i = 0; i < nz; i++)
            z[i] = a[i + 1] - a[i];
        double sx = 0, sy = 0, sxx = 0, sxy = 0;
        int m = nz - 1;
        for (int i = 1; i < nz; i++) {
            sx += z[i - 1];
            sy += z[i];
            sxx += z[i - 1] * z[i - 1];
            sxy += z[i - 1] * z[i];
        }
        double phi = 0, c0 = m > 0 ? sy / m : 0;
        double den = m * sxx - sx * sx;
        if (m > 1 && den > 1e-12) {
            phi = (m * sxy - sx * sy) / den;
            c0 = (sy - phi * sx) / m;
        }
        if (phi > 0.99)
            phi = 0.99;
        if (phi < -0.99)
            phi = -0.99;
        double mu = c0 / (1 - phi);
        double lvl = a[n - 1], zl = z[nz - 1];
        for (int k = 0; k < L; k++) {
            zl = mu + phi * (zl - mu);
            lvl += zl;
            est[k] = rint(lvl);
        }
    }
    double first = est[0];
    for (int k = 1; k < L; k++) {
        if (est[k] > first + 3)
            est[k] = first + 3;
        if (est[k] < first - 3)
            est[k] = first - 3;
    }
    for (int k = 0; k < L; k++)
        est[k] = ST_MIN(ST_MAX(est[k], lo), hi);
    double inp[PLAN_MAX_LOOKAHEAD] = {0}, outp[PLAN_MAX_LOOKAHEAD] = {0};
    bool flat = true;
    for (int k = 1; k < L; k++)
        if (est[k] != est[0])
            flat = false;
    if (flat && sd != 0) {
        /* Parcae draws removals ~ Poisson(min(std, var, mean)) of the removal history. */
        double rs = stddev(rem, n), rm = 0;
        for (int i = 0; i < n; i++)
            rm += rem[i];
        rm /= n;
        double lam = ST_MIN(ST_MIN(rs, rs * rs), rm);
        uint64_t st = seed ^ (uint64_t)nhist * 0x9E3779B97F4A7C15ULL;
        for (int k = 0; k < L; k++)
            outp[k] += lam > 0 ? poisson(lam, &st) : 0;
    }
    double cur = hist[nhist - 1];
    for (int k = 0; k < L; k++) {
        if (est[k] > cur)
            inp[k] += est[k] - cur;
        else if (est[k] < cur)
            outp[k] += cur - est[k];
        cur = est[k];
    }
    cur = hist[nhist - 1];
    for (int k = 0; k < L; k++) {
        cur = rint(cur + inp[k] * in_pen - outp[k] * out_pen);
        if (cur < 0)
            cur = 0;
        out[k] = (int)cur;
    }
}

/* Members of our ensemble at horizon k (0-based) from history ending at index e. */
static double member(int which, const int *hist, int e, int k) {
    double last = hist[e];
    switch (which) {
    case 0:
        return last;
    case 1: { /* damped trend over 20 intervals */
        int w = ST_MIN(20, e);
        if (w <= 0)
            return last;
        double slope = (hist[e] - hist[e - w]) / (double)w, damp = 0, f = 1;
        for (int j = 0; j <= k; j++) {
            f *= 0.85;
            damp += f;
        }
        return last + slope * damp;
    }
    default: { /* mean of the last 10 */
        int w = ST_MIN(10, e + 1);
        double s = 0;
        for (int j = 0; j < w; j++)
            s += hist[e - j];
        return s / w;
    }
    }
}

static void ensemble(const int *hist, int nhist, int L, int lo, int hi, int *out) {
    int e = nhist - 1;
    for (int k = 0; k < L; k++) {
        /* recent absolute error of each member at this horizon, decayed */
        double err[3] = {0, 0, 0}, wsum = 0;
        for (int back = 1; back <= 60; back++) {
            int s = e - k - back; /* forecast made at s for s + k + 1 */
            if (s < 0)
                break;
            double decay = pow(0.97, back);
            for (int m = 0; m < 3; m++)
                err[m] += decay * fabs(member(m, hist, s, k) - hist[s + k + 1]);
            wsum += decay;
        }
        double num = 0, den = 0;
        for (int m = 0; m < 3; m++) {
            double mae = wsum > 0 ? err[m] / wsum : (m == 0 ? 0 : 1);
            double w = 1.0 / (0.05 + mae * mae);
            num += w * member(m, hist, e, k);
            den += w;
        }
        out[k] = clampi(rint(num / den), lo, hi);
    }
}

int plan_forecast(enum plan_predictor p, const int *hist, int nhist, int L, int lo, int hi,
                  uint64_t seed, int *ret_n) {
    if (!hist || nhist < 1 || L < 1 || L > PLAN_MAX_LOOKAHEAD || !ret_n || lo > hi)
        return -EINVAL;
    if (nhist > HIST_MAX) {
        hist += nhist - HIST_MAX;
        nhist = HIST_MAX;
    }
    switch (p) {
    case PLAN_PRED_LAST:
    case PLAN_PRED_NOTICE:
        for (int k = 0; k < L; k++)
            ret_n[k] = hist[nhist - 1];
        return 0;
    case PLAN_PRED_ARIMA:
        arima(hist, nhist, L, lo, hi, seed, ret_n);
        return 0;
    case PLAN_PRED_DAMPED:
        ensemble(hist, nhist, L, lo, hi, ret_n);
        return 0;
    default:
        return -EINVAL;
    }
}

int plan_forecast_eval(enum plan_predictor p, const int *counts, const int *n_out, int n, int L,
                       int lo, int hi, double notice_s, double *ret_mae) {
    if (!counts || n < 2 || L < 1 || L > PLAN_MAX_LOOKAHEAD || !ret_mae)
        return -EINVAL;
    double sum[PLAN_MAX_LOOKAHEAD] = {0};
    int cnt = 0, pred[PLAN_MAX_LOOKAHEAD];
    for (int t = 1; t + L < n; t++) {
        int r = plan_forecast(p, counts, t + 1, L, lo, hi, (uint64_t)t, pred);
        if (r < 0)
            return r;
        if (p == PLAN_PRED_NOTICE && n_out) {
            /* known losses stay lost at every later horizon */
            int cum = 0;
            for (int k = 0; k < L; k++) {
                if ((k + 1) * PLAN_INTERVAL_S <= notice_s + 1e-9)
                    cum += n_out[t + 1 + k];
                pred[k] = ST_MAX(0, pred[k] - cum);
            }
        }
        for (int k = 0; k < L; k++)
            sum[k] += fabs((double)pred[k] - counts[t + 1 + k]);
        cnt++;
    }
    if (cnt == 0)
        return -EINVAL;
    for (int k = 0; k < L; k++)
        ret_mae[k] = sum[k] / cnt;
    return cnt;
}
