/* cost.c: the cost model — throughput per shape and the time of every reconfiguration.
 *
 * The formulas follow Parcae's published simulator (JF-D/Parcae liveput/cost.py and
 * monte_carlo.py at efedee7) so a decision is charged what Parcae's own simulator would
 * charge it: intra-stage moves rebuild communicators, inter-stage moves send a stage's
 * weights and Adam state point to point, repartitions send the layers that change owner and
 * broadcast to replicas, and every change pays a restart estimate. docs/planner.md lists the
 * formulas and the places where Parcae's code has quirks we reproduce on purpose. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "planner-internal.h"
#include "planner.h"

const char *plan_mig_kind_name(enum plan_mig_kind k) {
    static const char *const names[PLAN_KIND_NKINDS] = {
        "none", "intra-stage", "inter-stage", "repartition", "growth", "restart"};
    return (unsigned)k < PLAN_KIND_NKINDS ? names[k] : "?";
}

struct plan_cost *plan_cost_free(struct plan_cost *c) {
    if (!c)
        return NULL;
    st_free(c->shapes);
    st_free(c->samples_per_s);
    st_free(c->layer_params);
    st_free(c->prefix);
    st_free(c->maxpart_params);
    st_free(c->index);
    st_free(c);
    return NULL;
}

int plan_cost_dup(const struct plan_cost *c, struct plan_cost **ret) {
    struct plan_cost *d;
    if (!c || !ret)
        return -EINVAL;
    size_t ni = (size_t)(c->nlayers + 1) * (size_t)(c->max_n + 1);
    d = st_malloc(sizeof(*d));
    if (!d)
        return -ENOMEM;
    *d = *c;
    d->shapes = NULL;
    d->samples_per_s = d->layer_params = d->prefix = d->maxpart_params = NULL;
    d->index = NULL;
    d->shapes = st_malloc((size_t)c->nshapes * sizeof(*d->shapes));
    d->samples_per_s = st_malloc((size_t)c->nshapes * sizeof(double));
    d->layer_params = st_malloc((size_t)c->nlayers * sizeof(double));
    d->prefix = st_malloc((size_t)(c->nlayers + 1) * sizeof(double));
    d->maxpart_params = st_malloc((size_t)(c->nlayers + 1) * sizeof(double));
    if (c->index)
        d->index = st_malloc(ni * sizeof(int));
    if (!d->shapes || !d->samples_per_s || !d->layer_params || !d->prefix ||
        !d->maxpart_params || (c->index && !d->index)) {
        plan_cost_free(d);
        return -ENOMEM;
    }
    memcpy(d->shapes, c->shapes, (size_t)c->nshapes * sizeof(*d->shapes));
    memcpy(d->samples_per_s, c->samples_per_s, (size_t)c->nshapes * sizeof(double));
    memcpy(d->layer_params, c->layer_params, (size_t)c->nlayers * sizeof(double));
    memcpy(d->prefix, c->prefix, (size_t)(c->nlayers + 1) * sizeof(double));
    memcpy(d->maxpart_params, c->maxpart_params, (size_t)(c->nlayers + 1) * sizeof(double));
    if (c->index)
        memcpy(d->index, c->index, ni * sizeof(int));
    *ret = d;
    return 0;
}

int plan_cost_partition(const struct plan_cost *c, int pp, int *bounds) {
    return plan__partition(c->nlayers, pp, bounds);
}

/* See planner-internal.h. */
int plan__partition(int L, int pp, int *bounds) {
    if (pp < 1 || pp > L)
        return -EINVAL;
    /* Parcae: chunk = (L-1)//P; sizes = [chunk+1] + [chunk]*(P-1); the (L-1)%P extra layers
     * go to the stages just before the last. */
    int chunk = (L - 1) / pp, extra = (L - 1) % pp;
    bounds[0] = 0;
    for (int s = 0; s < pp; s++) {
        int size = s == 0 ? chunk + 1 : chunk;
        /* sizes[-i-2] += 1 for i < extra: stages pp-2, pp-3, ... pp-1-extra */
        if (s >= pp - 1 - extra && s <= pp - 2)
            size++;
        bounds[s + 1] = bounds[s] + size;
    }
    /* pp == 1: chunk = L-1, size = L. */
    return 0;
}

static double range_params(const struct plan_cost *c, int a, int b) {
    if (b <= a)
        return 0;
    return c->prefix[b] - c->prefix[a];
}

double plan_cost_p2p_ms(const struct plan_cost *c, double bytes) {
    /* bisect_left over the profiled sizes, linear interpolation, linear beyond the last. */
    int n = c->np2p;
    double us;
    int i = 0;
    while (i < n && c->p2p_bytes[i] < bytes)
        i++;
    if (i == 0)
        us = c->p2p_us[0];
    else if (i >= n)
        us = bytes / c->p2p_bytes[n - 1] * c->p2p_us[n - 1];
    else {
        double l = c->p2p_bytes[i - 1], r = c->p2p_bytes[i];
        us = c->p2p_us[i - 1] + (c->p2p_us[i] - c->p2p_us[i - 1]) * (bytes - l) / (r - l);
    }
    return us / 1000.0;
}

static double rebuild_groups_ms(const struct plan_cost *c, int dp, int pp, bool add) {
    double g;
    switch (c->family) {
    case PLAN_FAMILY_GPT: {
        double groups = dp + pp + 1 + (double)dp * pp;
        g = groups * (add ? 500.0 : c->group_remove_ms);
        break;
    }
    case PLAN_FAMILY_VGG:
        g = (add ? 440.0 : 340.0) * dp * pp;
        break;
    default:
        g = dp >= 12 ? 2000 : dp >= 6 ? 1500 : 1000;
        if (add)
            g *= 1.5;
        break;
    }
    return 35.0 + g;
}

static double build_ms(const struct plan_cost *c, int pp) {
    if (pp >= 0 && pp <= PLAN_MAX_LAYERS && c->build_ms[pp] >= 0)
        return c->build_ms[pp];
    /* Not profiled: the nearest profiled depth. */
    for (int d = 1; d <= PLAN_MAX_LAYERS; d++) {
        if (pp - d >= 0 && pp - d <= PLAN_MAX_LAYERS && c->build_ms[pp - d] >= 0)
            return c->build_ms[pp - d];
        if (pp + d <= PLAN_MAX_LAYERS && c->build_ms[pp + d] >= 0)
            return c->build_ms[pp + d];
    }
    return 0;
}

double plan_cost_restart_ms(const struct plan_cost *c, int dp, int pp, bool add) {
    double ms = 0;
    if (add)
        ms += c->rdzv_ms + c->restart_extra_ms;
    ms += rebuild_groups_ms(c, dp, pp, add);
    ms += c->proc_ms;
    ms += build_ms(c, pp);
    return ms;
}

double plan__stage_state_bytes(const struct plan_cost *c, int pp, int stage) {
    int b[PLAN_MAX_LAYERS + 1];
    if (plan_cost_partition(c, pp, b) < 0 || stage < 0 || stage >= pp)
        return 0;
    return range_params(c, b[stage], b[stage + 1]) * c->state_bytes_per_param;
}

int plan_cost_shape_index(const struct plan_cost *c, int dp, int pp) {
    if (c->index) {
        if (dp < 1 || pp < 1 || dp > c->max_n || pp > c->nlayers)
            return -1;
        return c->index[pp * (c->max_n + 1) + dp];
    }
    for (int i = 0; i < c->nshapes; i++)
        if (c->shapes[i].dp == dp && c->shapes[i].pp == pp)
            return i;
    return -1;
}

double plan_cost_throughput(const struct plan_cost *c, int dp, int pp) {
    int i = plan_cost_shape_index(c, dp, pp);
    return i < 0 ? 0 : c->samples_per_s[i];
}

bool plan_cost_shape_allowed(const struct plan_cost *c, int dp, int pp) {
    if (pp < c->pp_min || pp > c->pp_max)
        return false;
    if (pp < 64 && (c->pp_ignore >> pp) & 1)
        return false;
    if (c->dp1_ignored && dp == 1)
        return false;
    return plan_cost_shape_index(c, dp, pp) >= 0;
}

struct plan_shape plan_cost_best_shape(const struct plan_cost *c, int n) {
    /* Parcae's best_strategy: dp ascending, pp ascending, strictly better throughput. */
    struct plan_shape best = {0, 0};
    double bt = 0;
    for (int dp = 1; dp <= n; dp++)
        for (int pp = 1; pp * dp <= n; pp++) {
            double t = plan_cost_throughput(c, dp, pp);
            if (t > bt) {
                bt = t;
                best = (struct plan_shape){dp, pp};
            }
        }
    return best;
}

/* Parcae's repartition for a known victim set. */
static double repartition_ms(const struct plan_cost *c, int N, int D, int P, const char *dead,
                             int n_out, int dp, int pp) {
    int ob[PLAN_MAX_LAYERS + 1], nb[PLAN_MAX_LAYERS + 1];
    double need = 0;
    if (plan_cost_partition(c, pp, nb) < 0)
        return INFINITY;
    if (D > 0 && P > 0 && plan_cost_partition(c, P, ob) == 0) {
        /* node_to_layers in id order; nodes of one old stage are interchangeable except for
         * their ids, so keep per old stage the next alive replica. */
        int next[PLAN_MAX_LAYERS + 1];
        for (int o = 0; o < P; o++) {
            int r = 0;
            while (r < D && dead[r * P + o])
                r++;
            next[o] = r;
        }
        for (int s = 0; s < pp; s++) {
            double full = range_params(c, nb[s], nb[s + 1]);
            int best = -1, best_id = 0;
            double best_extra = INFINITY;
            for (int o = 0; o < P; o++) {
                if (next[o] >= D)
                    continue;
                int lo = ST_MAX(ob[o], nb[s]), hi = ST_MIN(ob[o + 1], nb[s + 1]);
                double extra = full - range_params(c, lo, hi);
                int id = next[o] * P + o;
                if (extra < best_extra || (extra == best_extra && id < best_id)) {
                    best = o;
                    best_extra = extra;
                    best_id = id;
                }
            }
            if (best >= 0) {
                /* Parcae assigns (not adds) the need here; reproduced on purpose. */
                need = best_extra;
                int r = next[best] + 1;
                while (r < D && dead[r * P + best])
                    r++;
                next[best] = r;
            }
        }
    }
    double ms = plan_cost_p2p_ms(c, need * c->state_bytes_per_param);
    if (dp > 1) {
        double b = 0;
        for (int s = 0; s < pp; s++)
            b = ST_MAX(b, plan_cost_p2p_ms(c, range_params(c, nb[s], nb[s + 1]) *
                                                   c->state_bytes_per_param));
        ms += b;
    }
    (void)N;
    ms += plan_cost_restart_ms(c, dp, pp, (double)dp * pp > (double)D * P - n_out);
    return ms;
}

double plan__intra_ms(const struct plan_cost *c, int dp, int pp) {
    return rebuild_groups_ms(c, dp, pp, false) + c->proc_ms;
}

double plan_cost_transition_ms(const struct plan_cost *c, int N, int D, int P, int n_in,
                               const int *victims, int n_out, int dp, int pp,
                               enum plan_mig_kind *ret_kind) {
    enum plan_mig_kind kind = PLAN_KIND_NONE;
    double ms = 0;
    char deadbuf[1024], *dead = deadbuf;
    int grid = D * P;
    (void)n_in;
    if (grid > (int)sizeof(deadbuf)) {
        dead = st_calloc((size_t)grid, 1);
        if (!dead) /* cannot evaluate: treat as a full restart of the target */
            return plan_cost_restart_ms(c, dp, pp, true);
    } else
        memset(dead, 0, (size_t)ST_MAX(grid, 1));
    for (int i = 0; i < n_out; i++)
        if (victims[i] >= 0 && victims[i] < grid)
            dead[victims[i]] = 1;
    if (pp == P && D > 0) {
        if (n_out == 0 && dp == D)
            goto out;
        int remain_min = D;
        double stage_cost = 0, redundant = 0;
        int hit = 0;
        for (int s = 0; s < P; s++) {
            int rem = D;
            for (int r = 0; r < D; r++)
                rem -= dead[r * P + s];
            remain_min = ST_MIN(remain_min, rem);
            if (rem < D)
                hit = 1;
        }
        if (remain_min >= dp) {
            kind = PLAN_KIND_INTRA;
            ms = c->measured ? plan__measured_intra_ms(c, D, dp, pp) : plan__intra_ms(c, dp, pp);
            goto out;
        }
        double moved_params = 0; /* measured costs: the largest stage a node must receive */
        for (int s = 0; s < P; s++) {
            int rem = D;
            for (int r = 0; r < D; r++)
                rem -= dead[r * P + s];
            int req = ST_MAX(dp - rem, 0);
            if (req == 0)
                continue;
            double sc = plan_cost_p2p_ms(c, plan__stage_state_bytes(c, pp, s));
            moved_params = ST_MAX(moved_params,
                                  plan__stage_state_bytes(c, pp, s) / c->state_bytes_per_param);
            if (req == dp || (s == pp - 1 && req == dp - 1))
                redundant += sc;
            stage_cost = ST_MAX(stage_cost, sc);
        }
        kind = hit ? PLAN_KIND_INTER : PLAN_KIND_GROWTH;
        if (c->measured) {
            ms = plan__measured_inter_ms(c, D, dp, pp, moved_params);
            goto out;
        }
        ms = ST_MAX(stage_cost, redundant) +
             plan_cost_restart_ms(c, dp, pp, (double)dp * pp > (double)grid - n_out);
        goto out;
    }
    kind = PLAN_KIND_REPARTITION;
    ms = c->measured ? plan__measured_repartition_ms(c, D, P, dead, dp, pp)
                     : repartition_ms(c, N, D, P, dead, n_out, dp, pp);
out:
    if (dead != deadbuf)
        st_free(dead);
    if (ret_kind)
        *ret_kind = kind;
    return ms;
}

uint64_t plan__rng_next(uint64_t *s) {
    /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

double plan_cost_transition_expected_ms(const struct plan_cost *c, int N, int D, int P,
                                        int n_in, int n_out, int dp, int pp, int samples,
                                        uint64_t seed, enum plan_mig_kind *ret_kind) {
    if (n_out <= 0 || N <= 0)
        return plan_cost_transition_ms(c, N, D, P, n_in, NULL, 0, dp, pp, ret_kind);
    if (n_out > N)
        n_out = N;
    if (samples < 1)
        samples = 1;
    int stackpool[256], *pool = stackpool;
    if (N > 256) {
        pool = st_malloc((size_t)N * sizeof(int));
        if (!pool)
            return plan_cost_restart_ms(c, dp, pp, true);
    }
    uint64_t st = seed ^ ((uint64_t)N << 40) ^ ((uint64_t)D << 28) ^ ((uint64_t)P << 16) ^
                  (uint64_t)n_out;
    double sum = 0;
    int kinds[PLAN_KIND_NKINDS] = {0};
    for (int k = 0; k < samples; k++) {
        for (int i = 0; i < N; i++)
            pool[i] = i;
        for (int i = 0; i < n_out; i++) { /* partial Fisher-Yates */
            int j = i + (int)(plan__rng_next(&st) % (uint64_t)(N - i));
            int t = pool[i];
            pool[i] = pool[j];
            pool[j] = t;
        }
        enum plan_mig_kind kd;
        sum += plan_cost_transition_ms(c, N, D, P, n_in, pool, n_out, dp, pp, &kd);
        kinds[kd]++;
    }
    if (pool != stackpool)
        st_free(pool);
    if (ret_kind) {
        int best = 0;
        for (int k = 1; k < PLAN_KIND_NKINDS; k++)
            if (kinds[k] > kinds[best])
                best = k;
        *ret_kind = (enum plan_mig_kind)best;
    }
    return sum / samples;
}

/* log C(n, k) */
static double lchoose(int n, int k) {
    if (k < 0 || k > n)
        return -INFINITY;
    return lgamma(n + 1.0) - lgamma(k + 1.0) - lgamma(n - k + 1.0);
}

double plan__prob_intra(int N, int D, int P, int n_out, int dp) {
    /* P(every stage keeps >= dp replicas) when n_out of N instances die uniformly:
     * coefficient of x^n_out in (sum_{k<=D-dp} C(D,k) x^k)^P (1+x)^S over C(N, n_out). */
    int m = D - dp, S = N - D * P;
    if (m < 0 || S < 0)
        return 0;
    if (n_out == 0)
        return 1;
    if (n_out > 512)
        return 0;
    double poly[513] = {0}, tmp[513];
    double base[513] = {0};
    double lnorm = lchoose(N, n_out);
    /* Work in scaled doubles: each term C(D,k) exp(-lnorm / n_out) per victim. */
    double sc = exp(-lnorm / n_out);
    for (int k = 0; k <= ST_MIN(m, n_out); k++)
        base[k] = exp(lchoose(D, k)) * pow(sc, k);
    poly[0] = 1;
    for (int s = 0; s < P; s++) {
        memset(tmp, 0, sizeof(double) * (size_t)(n_out + 1));
        for (int a = 0; a <= n_out; a++)
            if (poly[a] != 0)
                for (int k = 0; k <= ST_MIN(m, n_out - a); k++)
                    tmp[a + k] += poly[a] * base[k];
        memcpy(poly, tmp, sizeof(double) * (size_t)(n_out + 1));
    }
    double total = 0;
    for (int a = 0; a <= n_out; a++) {
        int rest = n_out - a;
        if (rest > S)
            continue;
        total += poly[a] * exp(lchoose(S, rest)) * pow(sc, rest);
    }
    return ST_MIN(1.0, ST_MAX(0.0, total));
}

double plan_cost_transition_estimate_ms(const struct plan_cost *c, int N, int D, int P,
                                        int n_in, int n_out, int dp, int pp,
                                        enum plan_mig_kind *ret_kind) {
    enum plan_mig_kind kind;
    if (pp != P || D <= 0 || n_out <= 0) {
        if (pp != P && D > 0 && pp >= 1 && pp <= c->nlayers && P <= c->nlayers) {
            if (ret_kind)
                *ret_kind = PLAN_KIND_REPARTITION;
            if (c->measured)
                return plan__measured_repartition_ms(c, D, P, NULL, dp, pp);
            /* Victim-free repartition, O(1): the last new stage takes its layers from a replica
             * of the last old stage (the one holding most of them). */
            double need = range_params(c, c->last_start[pp], c->last_start[P]);
            double ms = plan_cost_p2p_ms(c, need * c->state_bytes_per_param);
            if (dp > 1)
                ms += plan_cost_p2p_ms(c, c->maxpart_params[pp] * c->state_bytes_per_param);
            ms += plan_cost_restart_ms(c, dp, pp, (double)dp * pp > (double)D * P - n_out);
            if (ret_kind)
                *ret_kind = PLAN_KIND_REPARTITION;
            return ms;
        }
        return plan_cost_transition_ms(c, N, D, P, n_in, NULL, 0, dp, pp, ret_kind);
    }
    double p = plan__prob_intra(N, D, P, n_out, dp);
    kind = p >= 0.5 ? PLAN_KIND_INTRA : PLAN_KIND_INTER;
    if (ret_kind)
        *ret_kind = kind;
    if (c->measured) /* losses are spread over stages; a node receives one stage at most */
        return p * plan__measured_intra_ms(c, D, dp, pp) +
               (1 - p) * plan__measured_inter_ms(c, D, dp, pp, c->maxpart_params[pp]);
    double intra = plan__intra_ms(c, dp, pp);
    /* Inter-stage: the largest stage moves; with D == 1 every hit stage is wiped and the
     * transfers add up (Parcae's redundant_cost). */
    double smax = plan_cost_p2p_ms(c, c->maxpart_params[pp] * c->state_bytes_per_param);
    double grid_hits = (double)n_out * D * P / N;
    double red = D == 1 ? grid_hits * smax : 0;
    double inter = ST_MAX(smax, red) +
                   plan_cost_restart_ms(c, dp, pp, (double)dp * pp > (double)D * P - n_out);
    return p * intra + (1 - p) * inter;
}

/* ---- building ----------------------------------------------------------------------- */

int plan__cost_finish(struct plan_cost *c) {
    c->prefix = st_calloc((size_t)c->nlayers + 1, sizeof(double));
    c->maxpart_params = st_calloc((size_t)c->nlayers + 1, sizeof(double));
    if (!c->prefix || !c->maxpart_params)
        return -ENOMEM;
    for (int i = 0; i < c->nlayers; i++)
        c->prefix[i + 1] = c->prefix[i] + c->layer_params[i];
    int b[PLAN_MAX_LAYERS + 1];
    for (int pp = 1; pp <= c->nlayers; pp++) {
        plan_cost_partition(c, pp, b);
        double m = 0;
        for (int s = 0; s < pp; s++)
            m = ST_MAX(m, range_params(c, b[s], b[s + 1]));
        c->maxpart_params[pp] = m;
        c->last_start[pp] = b[pp - 1];
    }
    c->max_n = 0;
    for (int i = 0; i < c->nshapes; i++)
        c->max_n = ST_MAX(c->max_n, c->shapes[i].dp * c->shapes[i].pp);
    size_t ni = (size_t)(c->nlayers + 1) * (size_t)(c->max_n + 1);
    int *index = st_malloc(ni * sizeof(int));
    if (!index)
        return -ENOMEM;
    for (size_t i = 0; i < ni; i++)
        index[i] = -1;
    for (int i = 0; i < c->nshapes; i++) {
        size_t k = (size_t)c->shapes[i].pp * (size_t)(c->max_n + 1) + (size_t)c->shapes[i].dp;
        if (index[k] < 0)
            index[k] = i;
    }
    c->index = index;
    return 0;
}

static int num_field(json_t *o, const char *key, double *ret) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v))
        return -EINVAL;
    *ret = json_number_value(v);
    return 0;
}

/* Parcae's per-model pp bounds (monte_carlo.py). */
static void set_bounds(struct plan_cost *c) {
    c->pp_min = 1;
    c->pp_max = c->nlayers;
    c->pp_ignore = 0;
    c->dp1_ignored = false;
    if (strcmp(c->model, "gpt-1.5b") == 0) {
        c->pp_min = 6;
        c->pp_max = 32;
    } else if (strcmp(c->model, "gpt-6.7b") == 0) {
        c->pp_min = 12;
        c->pp_max = 32;
        int ig[] = {17, 19, 21, 23, 25, 27, 28, 29, 30, 31, 32};
        for (size_t i = 0; i < ST_ARRAY_SIZE(ig); i++)
            c->pp_ignore |= 1ULL << ig[i];
    } else if (strcmp(c->model, "bert") == 0) {
        c->pp_min = 2;
        c->pp_max = 16;
        c->pp_ignore = (1ULL << 9) | (1ULL << 11) | (1ULL << 13) | (1ULL << 15);
    } else if (strcmp(c->model, "vgg19") == 0) {
        c->pp_min = 2;
        c->pp_max = 9;
        c->dp1_ignored = true;
    } else if (strcmp(c->model, "resnet152") == 0) {
        c->pp_min = 2;
        c->pp_max = 16;
        for (int p = 3; p <= 15; p += 2)
            c->pp_ignore |= 1ULL << p;
    }
}

int plan_cost_from_profile(const char *name, const char *text, size_t len, const char *model,
                           struct plan_cost **ret, struct st_error *err) {
    json_error_t je;
    int r = 0;
    struct plan_cost *c = NULL;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root)
        return st_error_set(err, name, je.line, je.column, "json", "%s", je.text);
    json_t *models = json_object_get(root, "models");
    if (!json_is_object(models) || json_object_size(models) == 0) {
        r = st_error_set(err, name, 0, 0, "models", "missing \"models\" object");
        goto out;
    }
    const char *key = model;
    json_t *m;
    if (!model || !*model) {
        if (json_object_size(models) != 1) {
            char list[400] = "";
            const char *k;
            json_t *v;
            json_object_foreach(models, k, v) {
                if (strlen(list) + strlen(k) + 3 < sizeof(list))
                    strcat(strcat(list, *list ? ", " : ""), k);
            }
            r = st_error_set(err, name, 0, 0, "models",
                             "the profile holds several models; pick one with --model (%s)",
                             list);
            goto out;
        }
        void *it = json_object_iter(models);
        key = json_object_iter_key(it);
    }
    m = json_object_get(models, key);
    if (!json_is_object(m)) {
        char list[400] = "";
        const char *k;
        json_t *v;
        json_object_foreach(models, k, v) {
            if (strlen(list) + strlen(k) + 3 < sizeof(list))
                strcat(strcat(list, *list ? ", " : ""), k);
        }
        st_error_set(err, name, 0, 0, "models", "no model '%s' in the profile (have: %s)", key,
                     list);
        r = -ENOENT;
        goto out;
    }
    c = st_calloc(1, sizeof(*c));
    if (!c) {
        r = -ENOMEM;
        goto out;
    }
    json_t *jm = json_object_get(m, "model");
    snprintf(c->model, sizeof(c->model), "%s", json_is_string(jm) ? json_string_value(jm) : key);
    double v;
    if (num_field(m, "micro_batch", &v) < 0 || v < 1 || num_field(m, "global_batch", &v) < 0) {
        r = st_error_set(err, name, 0, 0, "models.micro_batch",
                         "'%s': micro_batch and global_batch must be numbers", key);
        goto out;
    }
    num_field(m, "micro_batch", &v);
    c->micro_batch = (int)v;
    num_field(m, "global_batch", &v);
    c->global_batch = (int)v;
    c->family = strncmp(c->model, "gpt", 3) == 0 ? PLAN_FAMILY_GPT
                : strcmp(c->model, "vgg19") == 0 ? PLAN_FAMILY_VGG
                                                 : PLAN_FAMILY_OTHER;
    c->group_remove_ms = strstr(c->model, "6.7b") ? 115.6 : 39.3;
    c->state_bytes_per_param = 12;
    c->ckpt_ms = 14000;
    c->rdzv_ms = 6600;
    c->proc_ms = c->family == PLAN_FAMILY_GPT ? 240 : 30;
    json_t *consts = json_object_get(root, "constants");
    if (json_is_object(consts)) {
        json_t *pt = json_object_get(consts, "proc_time_ms");
        if (json_is_object(pt)) {
            json_t *x = json_object_get(pt, c->family == PLAN_FAMILY_GPT ? "gpt" : "other");
            if (json_is_number(x))
                c->proc_ms = json_number_value(x);
        }
        if (num_field(consts, "rdzv_time_ms", &v) == 0)
            c->rdzv_ms = v;
        if (num_field(consts, "checkpoint_restart_extra_ms_reactive_baseline", &v) == 0)
            c->ckpt_ms = v;
    }
    if (num_field(m, "restart_extra_ms", &v) == 0)
        c->restart_extra_ms = v;
    /* p2p */
    json_t *p2p = json_object_get(root, "p2p_us");
    if (!json_is_object(p2p) || json_object_size(p2p) == 0 || json_object_size(p2p) > 64) {
        r = st_error_set(err, name, 0, 0, "p2p_us", "missing or oversized p2p_us table");
        goto out;
    }
    {
        const char *k;
        json_t *x;
        json_object_foreach(p2p, k, x) {
            char *end;
            double b = strtod(k, &end);
            if (*end || !json_is_number(x) || b <= 0) {
                r = st_error_set(err, name, 0, 0, "p2p_us", "bad entry '%s'", k);
                goto out;
            }
            int i = c->np2p++;
            while (i > 0 && c->p2p_bytes[i - 1] > b) { /* insertion sort by size */
                c->p2p_bytes[i] = c->p2p_bytes[i - 1];
                c->p2p_us[i] = c->p2p_us[i - 1];
                i--;
            }
            c->p2p_bytes[i] = b;
            c->p2p_us[i] = json_number_value(x);
        }
    }
    /* layers */
    json_t *lp = json_object_get(m, "layer_params");
    size_t nl = json_array_size(lp);
    if (!json_is_array(lp) || nl == 0 || nl > PLAN_MAX_LAYERS) {
        r = st_error_set(err, name, 0, 0, "models.layer_params",
                         "'%s': layer_params must be a list of 1..%d numbers", key,
                         PLAN_MAX_LAYERS);
        goto out;
    }
    c->nlayers = (int)nl;
    c->layer_params = st_calloc(nl, sizeof(double));
    if (!c->layer_params) {
        r = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < nl; i++) {
        json_t *x = json_array_get(lp, i);
        if (!json_is_number(x) || json_number_value(x) < 0) {
            r = st_error_set(err, name, 0, 0, "models.layer_params", "'%s': entry %zu bad", key,
                             i);
            goto out;
        }
        c->layer_params[i] = json_number_value(x);
    }
    /* throughput */
    json_t *tp = json_object_get(m, "throughput");
    size_t nt = json_array_size(tp);
    if (!json_is_array(tp) || nt == 0 || nt > PLAN_MAX_SHAPES) {
        r = st_error_set(err, name, 0, 0, "models.throughput", "'%s': missing throughput list",
                         key);
        goto out;
    }
    c->shapes = st_calloc(nt, sizeof(*c->shapes));
    c->samples_per_s = st_calloc(nt, sizeof(double));
    if (!c->shapes || !c->samples_per_s) {
        r = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < nt; i++) {
        json_t *e = json_array_get(tp, i);
        double dp, pp, sps;
        if (num_field(e, "dp", &dp) < 0 || num_field(e, "pp", &pp) < 0 ||
            num_field(e, "samples_per_s", &sps) < 0 || dp < 1 || pp < 1 || dp > 100000 ||
            pp > nl || sps < 0) {
            r = st_error_set(err, name, 0, 0, "models.throughput",
                             "'%s': entry %zu needs dp, pp (1..layers) and samples_per_s", key,
                             i);
            goto out;
        }
        c->shapes[i] = (struct plan_shape){(int)dp, (int)pp};
        c->samples_per_s[i] = sps;
    }
    c->nshapes = (int)nt;
    /* model build time per pp: a table, or Parcae's GPT-1.5b formula written as text */
    for (int i = 0; i <= PLAN_MAX_LAYERS; i++)
        c->build_ms[i] = -1;
    json_t *bm = json_object_get(m, "model_build_ms");
    if (json_is_object(bm)) {
        const char *k;
        json_t *x;
        json_object_foreach(bm, k, x) {
            char *end;
            long p = strtol(k, &end, 10);
            if (*end || p < 0 || p > PLAN_MAX_LAYERS || !json_is_number(x)) {
                r = st_error_set(err, name, 0, 0, "models.model_build_ms", "'%s': bad entry '%s'",
                                 key, k);
                goto out;
            }
            c->build_ms[p] = json_number_value(x);
        }
    } else if (json_is_string(bm)) {
        long a, b2, d, per, L, lo, hi;
        if (sscanf(json_string_value(bm),
                   "p2p_us(%ld*%ld*%ld)/1000 + %ld*ceil(%ld/pp) for pp in %ld..%ld", &a, &b2, &d,
                   &per, &L, &lo, &hi) != 7 ||
            lo < 1 || hi > PLAN_MAX_LAYERS || lo > hi) {
            r = st_error_set(err, name, 0, 0, "models.model_build_ms",
                             "'%s': unrecognised build-time formula", key);
            goto out;
        }
        double comm = plan_cost_p2p_ms(c, (double)a * b2 * d);
        for (long p = lo; p <= hi; p++)
            c->build_ms[p] = comm + (double)per * ceil((double)L / p);
    } else {
        r = st_error_set(err, name, 0, 0, "models.model_build_ms", "'%s': missing", key);
        goto out;
    }
    set_bounds(c);
    if ((r = plan__cost_finish(c)) < 0)
        goto out;
    *ret = c;
    c = NULL;
out:
    plan_cost_free(c);
    json_decref(root);
    return r;
}
