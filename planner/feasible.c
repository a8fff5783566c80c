/* feasible.c: can any (dp, pp) shape run this job at all?
 *
 * A shape must satisfy the spec's bounds and pins, the engine's limits (dp x micro_batch
 * divides global_batch, at most one stage per pipeline layer, no more positions than the
 * fleet has GPUs) and the analytic cost model's memory check. validate, the CLI's spec loader
 * and the coordinator loop all ask this file, so a spec that passes validation is one the
 * loop can start, and a spec the loop would wait on forever is refused before it runs.
 *
 * The one idea: when no shape is feasible, blame by relaxation. Every candidate shape breaks
 * some set of rules; the candidates breaking the fewest rules are the shapes the smallest edit
 * of the spec would make workable, and the first rule (in enum plan_rule order) they break is
 * the field to name. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h" /* struct st_spec, ST_MIN */
#include "planner-internal.h"
#include "planner.h"

#define FEAS_DP_MAX 4096 /* the spec's own limit on planner.dp */
#define FEAS_PP_MAX 1024 /* and on planner.pp */

/* See planner.h. */
const char *plan_rule_field(enum plan_rule r) {
    static const char *const f[] = {"", "spec.planner.dp", "spec.planner.pp", "spec.fleet.max",
                                    "spec.fleet.gpu_memory", "spec.training.global_batch",
                                    "spec.model.layers"};
    return (unsigned)r < PLAN_RULE_NKINDS ? f[r] : "";
}

/* See planner.h. */
int plan_rules_from_spec(const struct st_spec *spec, bool pins, struct plan_rules *ret) {
    if (!spec || !ret || spec->training.micro_batch < 1 || spec->training.global_batch < 1)
        return -EINVAL;
    const struct st_spec_planner *p = &spec->planner;
    struct plan_rules r = {
        .dp_lo = ST_MAX(p->dp_min, 1),
        .dp_hi = p->dp_max,
        .pp_lo = ST_MAX(p->pp_min, 1),
        .pp_hi = p->pp_max,
        .global_batch = spec->training.global_batch,
        .micro_batch = spec->training.micro_batch,
    };
    if (pins && p->dp > 0)
        r.dp_lo = r.dp_hi = p->dp;
    if (pins && p->pp > 0)
        r.pp_lo = r.pp_hi = p->pp;
    long workers = (long)ST_MAX(spec->fleet.max, 0) * ST_MAX(spec->fleet.gpus_per_instance, 1);
    r.workers_max = (int)ST_MIN(workers, (long)PLAN_MIG_MAX_POSITIONS);
    if (spec->model.profile[0]) {
        /* A profiled model is simulated: its layers and memory are the profile's business. */
        r.stages_max = FEAS_PP_MAX;
        r.memory = false;
        *ret = r;
        return 0;
    }
    struct plan_model_desc d;
    plan__desc_from_spec(spec, &d);
    if (d.layers < 1 || d.layers + 2 > PLAN_MAX_LAYERS || d.hidden < 1 || d.seq < 1 ||
        d.vocab < 1 || !(d.gpu_mem_gib > 0))
        return -EINVAL;
    int L = d.layers + 2; /* the engine's pipeline layers (plan_mig_gpt_layer_params) */
    r.stages_max = ST_MIN(L, PLAN_MIG_MAX_STAGES);
    r.memory = true;
    r.mem_budget = plan__mem_budget(&d);
    r.act_layer = plan__act_layer_bytes(&d);
    double params[PLAN_MAX_LAYERS + 1];
    int b[PLAN_MAX_LAYERS + 1];
    plan__gpt_layer_params(&d, params);
    for (int pp = 1; pp <= r.stages_max; pp++) {
        if (plan__partition(L, pp, b) < 0)
            return -EINVAL;
        double pmax = 0;
        int lmax = 0;
        for (int s = 0; s < pp; s++) {
            double pr = 0;
            for (int l = b[s]; l < b[s + 1]; l++)
                pr += params[l];
            pmax = ST_MAX(pmax, pr);
            lmax = ST_MAX(lmax, b[s + 1] - b[s]);
        }
        r.stage_params[pp] = pmax;
        r.stage_layers[pp] = lmax;
    }
    *ret = r;
    return 0;
}

/* See planner.h. Only meaningful for shapes within stages_max (others break LAYERS first). */
double plan_shape_stage_bytes(const struct plan_rules *r, int dp, int pp) {
    if (!r || dp < 1 || pp < 1 || pp > r->stages_max || !r->memory)
        return 0;
    int per = dp * r->micro_batch;
    int m = (r->global_batch + per - 1) / per; /* micro-batches per replica and step */
    return plan__stage_bytes(r->stage_params[pp], r->stage_layers[pp], r->act_layer, pp, m);
}

/* Every rule (dp, pp) breaks, as a bit set over enum plan_rule. */
static unsigned shape_breaks(const struct plan_rules *r, int dp, int pp) {
    unsigned v = 0;
    if (dp < r->dp_lo || (r->dp_hi > 0 && dp > r->dp_hi))
        v |= 1u << PLAN_RULE_DP;
    if (pp < r->pp_lo || (r->pp_hi > 0 && pp > r->pp_hi))
        v |= 1u << PLAN_RULE_PP;
    if ((long)dp * pp > r->workers_max)
        v |= 1u << PLAN_RULE_FLEET;
    if ((long)dp * r->micro_batch > r->global_batch ||
        r->global_batch % (dp * r->micro_batch) != 0)
        v |= 1u << PLAN_RULE_BATCH;
    if (pp > r->stages_max)
        v |= 1u << PLAN_RULE_LAYERS;
    else if (r->memory && !(v & (1u << PLAN_RULE_BATCH)) &&
             plan_shape_stage_bytes(r, dp, pp) > r->mem_budget)
        v |= 1u << PLAN_RULE_MEMORY; /* memory is judged at a batch split the engine can run */
    return v;
}

/* See planner.h. */
enum plan_rule plan_shape_check(const struct plan_rules *r, int dp, int pp) {
    if (!r || dp < 1 || pp < 1)
        return dp < 1 ? PLAN_RULE_DP : PLAN_RULE_PP;
    unsigned v = shape_breaks(r, dp, pp);
    for (int k = 1; k < PLAN_RULE_NKINDS; k++)
        if (v & (1u << k))
            return (enum plan_rule)k;
    return PLAN_RULE_OK;
}

static int popcount(unsigned v) {
    int n = 0;
    for (; v; v &= v - 1)
        n++;
    return n;
}

/* How far (dp, pp) is from satisfying `rule`, so the named shapes are the ones closest to
 * what the spec asked for: log distance to the violated bound for dp and pp, the workers
 * (or bytes) needed beyond the limit for fleet and memory, the size of the shape otherwise. */
static double distance(const struct plan_rules *r, enum plan_rule rule, int dp, int pp) {
    switch (rule) {
    case PLAN_RULE_DP:
        return fabs(log((double)dp / (dp < r->dp_lo ? r->dp_lo : r->dp_hi)));
    case PLAN_RULE_PP:
        return fabs(log((double)pp / (pp < r->pp_lo ? r->pp_lo : r->pp_hi)));
    case PLAN_RULE_MEMORY:
        return plan_shape_stage_bytes(r, dp, pp) / r->mem_budget;
    default:
        return (double)dp * pp;
    }
}

/* The candidate space: wide enough to hold every shape some one-field edit could allow. */
static void candidates(const struct plan_rules *r, int *ret_dp, int *ret_pp) {
    int dp = ST_MAX(ST_MAX(r->dp_lo, r->dp_hi), r->global_batch / r->micro_batch);
    dp = ST_MAX(dp, r->workers_max);
    int pp = ST_MAX(ST_MAX(r->pp_lo, r->pp_hi), r->stages_max);
    *ret_dp = ST_MIN(ST_MAX(dp, 1), FEAS_DP_MAX);
    *ret_pp = ST_MIN(ST_MAX(pp, 1), FEAS_PP_MAX);
}

/* "dp pinned to 64", "dp in 2..4", "dp >= 3". */
static void fmt_bound(char *buf, size_t size, const char *name, int lo, int hi) {
    if (lo == hi)
        snprintf(buf, size, "%s pinned to %d", name, lo);
    else if (hi > 0)
        snprintf(buf, size, "%s in %d..%d", name, lo, hi);
    else
        snprintf(buf, size, "%s >= %d", name, lo);
}

/* Why no shape can run, in terms of the blamed rule. */
static void fmt_why(const struct plan_rules *r, enum plan_rule rule, struct plan_shape near,
                    char *buf, size_t size) {
    char b[64];
    switch (rule) {
    case PLAN_RULE_DP:
        fmt_bound(b, sizeof(b), "dp", r->dp_lo, r->dp_hi);
        snprintf(buf, size, "no (dp, pp) shape can run with %s (dp x micro_batch %d must divide "
                 "global_batch %d and dp x pp fit %d workers)", b, r->micro_batch,
                 r->global_batch, r->workers_max);
        break;
    case PLAN_RULE_PP:
        fmt_bound(b, sizeof(b), "pp", r->pp_lo, r->pp_hi);
        snprintf(buf, size, "no (dp, pp) shape can run with %s (the pipeline has %d layers "
                 "and dp x pp must fit %d workers)", b, r->stages_max, r->workers_max);
        break;
    case PLAN_RULE_FLEET:
        snprintf(buf, size, "fleet.max x gpus_per_instance = %d workers, fewer than any "
                 "allowed (dp, pp) shape needs (the smallest needs %d)", r->workers_max,
                 near.dp * near.pp);
        break;
    case PLAN_RULE_MEMORY:
        snprintf(buf, size, "no allowed (dp, pp) shape's fullest stage fits in %.4g GiB (90%% "
                 "of fleet.gpu_memory; the smallest needs %.4g GiB)",
                 r->mem_budget / 1073741824.0,
                 plan_shape_stage_bytes(r, near.dp, near.pp) / 1073741824.0);
        break;
    case PLAN_RULE_BATCH:
        snprintf(buf, size, "global_batch %d is not a multiple of dp x micro_batch (%d) for any "
                 "allowed dp", r->global_batch, r->micro_batch);
        break;
    case PLAN_RULE_LAYERS:
        snprintf(buf, size, "every allowed pp exceeds the pipeline's %d layers "
                 "(model.layers + embedding + final norm)", r->stages_max);
        break;
    default:
        snprintf(buf, size, "no (dp, pp) shape can run this job");
    }
}

/* See planner.h. */
int plan_feasible(const struct st_spec *spec, struct plan_feasibility *ret) {
    struct plan_rules *r = NULL;
    int rc = 0;
    if (!spec || !ret)
        return -EINVAL;
    r = st_malloc(sizeof(*r));
    if (!r)
        return -ENOMEM;
    if ((rc = plan_rules_from_spec(spec, true, r)) < 0)
        goto out;
    struct plan_feasibility f = {.rule = PLAN_RULE_OK};
    int ndp, npp;
    candidates(r, &ndp, &npp);
    /* Pass 1: count the feasible shapes, find the smallest, and the fewest rules any
     * candidate breaks together with the first rule such candidates break. */
    int fewest = PLAN_RULE_NKINDS + 1;
    enum plan_rule blame = PLAN_RULE_OK;
    for (int pp = 1; pp <= npp; pp++)
        for (int dp = 1; dp <= ndp; dp++) {
            unsigned v = shape_breaks(r, dp, pp);
            if (v == 0) {
                long w = (long)dp * pp, ws = (long)f.smallest.dp * f.smallest.pp;
                if (f.nfeasible++ == 0 || w < ws || (w == ws && pp < f.smallest.pp))
                    f.smallest = (struct plan_shape){dp, pp};
                continue;
            }
            int k = popcount(v);
            enum plan_rule first = plan_shape_check(r, dp, pp);
            if (k < fewest || (k == fewest && first < blame)) {
                fewest = k;
                blame = first;
            }
        }
    if (f.nfeasible > 0)
        goto done;
    f.rule = blame;
    snprintf(f.field, sizeof(f.field), "%s", plan_rule_field(blame));
    /* Pass 2: the nearest shapes that break only what the blamed candidates break. */
    double dist[PLAN_FEAS_NEAREST];
    for (int pp = 1; pp <= npp; pp++)
        for (int dp = 1; dp <= ndp; dp++) {
            unsigned v = shape_breaks(r, dp, pp);
            if (popcount(v) != fewest || plan_shape_check(r, dp, pp) != blame)
                continue;
            double d = distance(r, blame, dp, pp);
            int i = f.nnearest;
            if (i == PLAN_FEAS_NEAREST) {
                if (!(d < dist[i - 1]))
                    continue; /* ties keep the earlier (shallower) shape */
                i--;
            } else {
                f.nnearest++;
            }
            for (; i > 0 && d < dist[i - 1]; i--) {
                dist[i] = dist[i - 1];
                f.nearest[i] = f.nearest[i - 1];
            }
            dist[i] = d;
            f.nearest[i] = (struct plan_shape){dp, pp};
        }
    char why[300];
    fmt_why(r, blame, f.nearest[0], why, sizeof(why));
    size_t n = (size_t)snprintf(f.message, sizeof(f.message), "%s", why);
    if (fewest > 1 && n < sizeof(f.message)) {
        /* One edit is not enough: say which other fields must change too. */
        unsigned v = shape_breaks(r, f.nearest[0].dp, f.nearest[0].pp) & ~(1u << blame);
        n += (size_t)snprintf(f.message + n, sizeof(f.message) - n, "; the nearest shapes also "
                              "need");
        for (int k = 1; k < PLAN_RULE_NKINDS && n < sizeof(f.message); k++)
            if (v & (1u << k))
                n += (size_t)snprintf(f.message + n, sizeof(f.message) - n, " %s",
                                      plan_rule_field((enum plan_rule)k));
    }
    for (int i = 0; i < f.nnearest && n < sizeof(f.message); i++)
        n += (size_t)snprintf(f.message + n, sizeof(f.message) - n, "%s%dx%d",
                              i ? ", " : "; nearest workable shapes (dp x pp): ",
                              f.nearest[i].dp, f.nearest[i].pp);
done:
    *ret = f;
out:
    st_free(r);
    return rc;
}
