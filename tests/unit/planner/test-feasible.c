/* test-feasible.c: plan_feasible and plan_shape_check against a brute force.
 *
 * The brute force states every rule from scratch, and judges memory by the cost model the
 * planner decides with (a shape fits when plan_cost_from_spec kept it), so the feasibility
 * function and the cost model cannot drift apart unnoticed. */
#include <string.h>

#include "common.h"
#include "planner.h"
#include "test.h"

#define GiB (1024.0 * 1024.0 * 1024.0)

/* A small built-in GPT on a fleet of `max` single-GPU instances. */
static void base_spec(struct st_spec *s, int layers, int mb, int gb, int max) {
    st_spec_defaults(s);
    s->model.layers = layers;
    s->model.hidden = 64;
    s->model.heads = 4;
    s->model.vocab = 256;
    s->model.seq_len = 64;
    s->training.micro_batch = mb;
    s->training.global_batch = gb;
    s->fleet.max = max;
    s->fleet.gpus_per_instance = 1;
    s->fleet.gpu_memory = (uint64_t)16 << 30;
}

/* Every rule, written out independently of planner/feasible.c. */
static bool brute_ok(const struct st_spec *s, const struct plan_cost *cost, int dp, int pp) {
    const struct st_spec_planner *p = &s->planner;
    if (p->dp ? dp != p->dp : (dp < p->dp_min || (p->dp_max && dp > p->dp_max)))
        return false;
    if (p->pp ? pp != p->pp : (pp < p->pp_min || (p->pp_max && pp > p->pp_max)))
        return false;
    int mb = s->training.micro_batch, gb = s->training.global_batch;
    if (dp * mb > gb || gb % (dp * mb) != 0)
        return false;
    if (pp > s->model.layers + 2)
        return false;
    if (dp * pp > s->fleet.max * s->fleet.gpus_per_instance)
        return false;
    /* Memory: the analytic cost model leaves out exactly the shapes that do not fit. */
    return cost && plan_cost_shape_index(cost, dp, pp) >= 0;
}

/* Checks plan_feasible and plan_shape_check on one spec against the brute force. */
static int check_spec(const struct st_spec *s) {
    struct plan_cost *cost = NULL;
    int r = plan_cost_from_spec(s, &cost);
    if (r < 0)
        ASSERT_EQ(r, -EINVAL); /* nothing fits in memory at all */
    struct plan_rules *rules = st_malloc(sizeof(*rules));
    ASSERT_TRUE(rules);
    ASSERT_OK(plan_rules_from_spec(s, true, rules));
    int n = 0;
    struct plan_shape small = {0, 0};
    for (int pp = 1; pp <= 12; pp++)
        for (int dp = 1; dp <= 64; dp++) {
            bool ok = brute_ok(s, cost, dp, pp);
            if ((plan_shape_check(rules, dp, pp) == PLAN_RULE_OK) != ok) {
                fprintf(stderr, "  shape %dx%d: brute %d, plan_shape_check %d (layers %d mb %d "
                        "gb %d max %d dp %d/%d..%d pp %d/%d..%d mem %.4g GiB)\n", dp, pp, ok,
                        plan_shape_check(rules, dp, pp), s->model.layers,
                        s->training.micro_batch, s->training.global_batch, s->fleet.max,
                        s->planner.dp, s->planner.dp_min, s->planner.dp_max, s->planner.pp,
                        s->planner.pp_min, s->planner.pp_max, s->fleet.gpu_memory / GiB);
                st_free(rules);
                plan_cost_free(cost);
                return 1;
            }
            if (!ok)
                continue;
            if (n++ == 0 || dp * pp < small.dp * small.pp ||
                (dp * pp == small.dp * small.pp && pp < small.pp))
                small = (struct plan_shape){dp, pp};
        }
    struct plan_feasibility f;
    ASSERT_OK(plan_feasible(s, &f));
    ASSERT_EQ(f.nfeasible, n);
    ASSERT_EQ(f.smallest.dp, small.dp);
    ASSERT_EQ(f.smallest.pp, small.pp);
    if (n > 0) {
        ASSERT_EQ(f.rule, PLAN_RULE_OK);
        ASSERT_STREQ(f.field, "");
        ASSERT_EQ(f.nnearest, 0);
    } else {
        ASSERT_NE(f.rule, PLAN_RULE_OK);
        ASSERT_STREQ(f.field, plan_rule_field(f.rule));
        ASSERT_GT(f.nnearest, 0);
        for (int i = 0; i < f.nnearest; i++)
            ASSERT_EQ(plan_shape_check(rules, f.nearest[i].dp, f.nearest[i].pp), f.rule);
    }
    st_free(rules);
    plan_cost_free(cost);
    return 0;
}

/* Exhaustive agreement over small specs: every combination of model depth, batch split,
 * fleet size, GPUs per instance, dp and pp pins or bounds, and memory that binds or not. */
static int test_brute_force(void) {
    static const int layers[] = {1, 3};
    static const int mbs[] = {1, 2};
    static const int gbk[] = {1, 4, 6};
    static const int maxes[] = {1, 3, 8};
    static const int gpus[] = {1, 2};
    static const int dps[][3] = {{0, 0, 0}, {2, 0, 0}, {3, 0, 0}, {0, 2, 4}, {0, 5, 0}};
    static const int pps[][3] = {{0, 0, 0}, {2, 0, 0}, {0, 2, 3}, {5, 0, 0}, {0, 0, 1}};
    /* 16 GiB fits anything here; ~3.2 MiB fits only deep pipelines; 64 KiB fits nothing. */
    static const uint64_t mems[] = {(uint64_t)16 << 30, 3400000, 65536};
    struct st_spec *s = st_malloc(sizeof(*s));
    ASSERT_TRUE(s);
    int specs = 0, infeasible = 0, memory_bound = 0;
    for (size_t a = 0; a < ST_ARRAY_SIZE(layers); a++)
        for (size_t b = 0; b < ST_ARRAY_SIZE(mbs); b++)
            for (size_t c = 0; c < ST_ARRAY_SIZE(gbk); c++)
                for (size_t d = 0; d < ST_ARRAY_SIZE(maxes); d++)
                    for (size_t e = 0; e < ST_ARRAY_SIZE(gpus); e++)
                        for (size_t g = 0; g < ST_ARRAY_SIZE(dps); g++)
                            for (size_t h = 0; h < ST_ARRAY_SIZE(pps); h++)
                                for (size_t m = 0; m < ST_ARRAY_SIZE(mems); m++) {
                                    base_spec(s, layers[a], mbs[b], mbs[b] * gbk[c], maxes[d]);
                                    s->fleet.gpus_per_instance = gpus[e];
                                    s->planner.dp = dps[g][0];
                                    s->planner.dp_min = dps[g][1];
                                    s->planner.dp_max = dps[g][2];
                                    s->planner.pp = pps[h][0];
                                    s->planner.pp_min = pps[h][1];
                                    s->planner.pp_max = pps[h][2];
                                    s->fleet.gpu_memory = mems[m];
                                    if (check_spec(s) != 0) {
                                        st_free(s);
                                        return 1;
                                    }
                                    struct plan_feasibility f;
                                    ASSERT_OK(plan_feasible(s, &f));
                                    specs++;
                                    infeasible += f.nfeasible == 0;
                                    memory_bound += f.rule == PLAN_RULE_MEMORY;
                                }
    st_free(s);
    /* The sweep covers both verdicts and memory as the deciding rule. */
    ASSERT_EQ(specs, 2 * 2 * 3 * 3 * 2 * 5 * 5 * 3);
    ASSERT_GT(infeasible, 0);
    ASSERT_LT(infeasible, specs);
    ASSERT_GT(memory_bound, 0);
    return 0;
}

/* The issue's example: the quickstart with planner.dp: 64. */
static int test_issue_dp64(void) {
    struct st_spec *s = st_malloc(sizeof(*s));
    ASSERT_TRUE(s);
    base_spec(s, 4, 2, 16, 8);
    s->planner.dp = 64;
    s->planner.pp_min = 2;
    s->planner.pp_max = 4;
    struct plan_feasibility f;
    ASSERT_OK(plan_feasible(s, &f));
    st_free(s);
    ASSERT_EQ(f.nfeasible, 0);
    ASSERT_EQ(f.rule, PLAN_RULE_DP);
    ASSERT_STREQ(f.field, "spec.planner.dp");
    ASSERT_STREQ(f.message, "no (dp, pp) shape can run with dp pinned to 64 (dp x micro_batch 2 "
                            "must divide global_batch 16 and dp x pp fit 8 workers); nearest "
                            "workable shapes (dp x pp): 4x2, 2x2, 2x3, 2x4");
    ASSERT_EQ(f.nnearest, 4);
    ASSERT_EQ(f.nearest[0].dp, 4);
    ASSERT_EQ(f.nearest[0].pp, 2);
    return 0;
}

/* The job's cost model follows fleet.data_plane.overlap: with the state moved at the boundary
 * a live migration's stall is charged all of it (plan_cost.meas_at_boundary). */
static int test_overlap(void) {
    struct st_spec *s = st_malloc(sizeof(*s));
    struct plan_cost *on = NULL, *off = NULL;
    ASSERT_TRUE(s);
    base_spec(s, 4, 2, 16, 8);
    s->fleet.data_plane_overlap = true;
    int r_on = plan_cost_from_spec(s, &on);
    s->fleet.data_plane_overlap = false;
    int r_off = plan_cost_from_spec(s, &off);
    st_free(s);
    ASSERT_OK(r_on);
    ASSERT_OK(r_off);
    bool at_on = on->meas_at_boundary, at_off = off->meas_at_boundary;
    plan_cost_free(on);
    plan_cost_free(off);
    ASSERT_FALSE(at_on);
    ASSERT_TRUE(at_off);
    return 0;
}

/* Each rule named when it alone is what stands in the way. */
static int test_each_rule(void) {
    struct st_spec *s = st_malloc(sizeof(*s));
    struct plan_feasibility f;
    ASSERT_TRUE(s);
    /* pp: at least 3 stages on 2 instances. */
    base_spec(s, 4, 1, 8, 2);
    s->planner.pp_min = 3;
    ASSERT_OK(plan_feasible(s, &f));
    ASSERT_EQ(f.rule, PLAN_RULE_PP);
    ASSERT_STREQ(f.message, "no (dp, pp) shape can run with pp >= 3 (the pipeline has 6 layers "
                            "and dp x pp must fit 2 workers); nearest workable shapes (dp x pp): "
                            "1x2, 1x1, 2x1");
    /* fleet: memory needs a deep pipeline (> 2 stages) that 2 instances cannot hold. */
    base_spec(s, 4, 1, 8, 2);
    s->fleet.gpu_memory = 2500000;
    ASSERT_OK(plan_feasible(s, &f));
    ASSERT_EQ(f.rule, PLAN_RULE_FLEET);
    ASSERT_STREQ(f.field, "spec.fleet.max");
    /* 16 bytes a parameter and 1F1B's in-flight activations: 2x5 is the smallest that fits. */
    ASSERT_STREQ(f.message, "fleet.max x gpus_per_instance = 2 workers, fewer than any allowed "
                            "(dp, pp) shape needs (the smallest needs 10); nearest workable "
                            "shapes (dp x pp): 2x5, 2x6, 4x4, 4x5");
    /* memory: nothing fits whatever the shape. */
    base_spec(s, 4, 1, 8, 8);
    s->fleet.gpu_memory = 65536;
    ASSERT_OK(plan_feasible(s, &f));
    ASSERT_EQ(f.rule, PLAN_RULE_MEMORY);
    ASSERT_STREQ(f.field, "spec.fleet.gpu_memory");
    ASSERT_CONTAINS(f.message, "no allowed (dp, pp) shape's fullest stage fits in 5.493e-05 GiB");

    /* batch: no dp splits 7 samples into micro-batches of 2 (the spec parser refuses this
     * earlier; the planner still names it). */
    base_spec(s, 4, 2, 7, 8);
    ASSERT_OK(plan_feasible(s, &f));
    ASSERT_EQ(f.rule, PLAN_RULE_BATCH);
    ASSERT_STREQ(f.field, "spec.training.global_batch");
    /* two fields at once: dp pinned to 3 does not divide 8, and pp pinned to 3 on 2 workers:
     * every shape breaks two rules; the nearest to dp 3 (4x3) breaks the dp pin and the
     * fleet size. */
    base_spec(s, 4, 1, 8, 2);
    s->planner.dp = 3;
    s->planner.pp = 3;
    ASSERT_OK(plan_feasible(s, &f));
    ASSERT_EQ(f.rule, PLAN_RULE_DP);
    ASSERT_CONTAINS(f.message, "; the nearest shapes also need spec.fleet.max; nearest workable "
                               "shapes (dp x pp): 4x3, 2x1, 2x3, 8x3");
    /* a pin the model cannot hold: the pp pin is named before the layer count. */
    base_spec(s, 1, 1, 8, 8);
    s->planner.pp = 4;
    ASSERT_OK(plan_feasible(s, &f));
    ASSERT_EQ(f.rule, PLAN_RULE_PP);
    struct plan_rules *r = st_malloc(sizeof(*r));
    ASSERT_TRUE(r);
    ASSERT_OK(plan_rules_from_spec(s, false, r));
    ASSERT_EQ(plan_shape_check(r, 1, 4), PLAN_RULE_LAYERS); /* 1 block + embedding + norm */
    ASSERT_EQ(plan_shape_check(r, 1, 3), PLAN_RULE_OK);     /* pins left out */
    ASSERT_EQ(plan_shape_check(r, 0, 1), PLAN_RULE_DP);
    ASSERT_EQ(plan_shape_check(r, 1, 0), PLAN_RULE_PP);
    ASSERT_EQ(plan_shape_check(r, 9, 1), PLAN_RULE_FLEET);
    ASSERT_EQ(plan_shape_check(r, 3, 1), PLAN_RULE_BATCH);
    st_free(r);
    st_free(s);
    return 0;
}

/* Bad arguments and specs the rules cannot describe. */
static int test_errors(void) {
    struct st_spec *s = st_malloc(sizeof(*s));
    struct plan_feasibility f;
    struct plan_rules *r = st_malloc(sizeof(*r));
    ASSERT_TRUE(s && r);
    base_spec(s, 4, 1, 8, 2);
    ASSERT_ERR(plan_feasible(NULL, &f), -EINVAL);
    ASSERT_ERR(plan_feasible(s, NULL), -EINVAL);
    ASSERT_ERR(plan_rules_from_spec(s, true, NULL), -EINVAL);
    s->training.micro_batch = 0;
    ASSERT_ERR(plan_feasible(s, &f), -EINVAL);
    base_spec(s, 0, 1, 8, 2);
    ASSERT_ERR(plan_rules_from_spec(s, true, r), -EINVAL);
    /* A profiled model: layers and memory are the profile's, the spec's rules still hold. */
    base_spec(s, 0, 1, 8, 2);
    snprintf(s->model.profile, sizeof(s->model.profile), "profile.json");
    s->planner.dp = 3;
    ASSERT_OK(plan_feasible(s, &f));
    ASSERT_EQ(f.nfeasible, 0);
    ASSERT_EQ(f.rule, PLAN_RULE_DP);
    ASSERT_STREQ(plan_rule_field(PLAN_RULE_NKINDS), "");
    st_free(r);
    st_free(s);
    return 0;
}

TEST_MAIN(TEST(test_brute_force), TEST(test_issue_dp64), TEST(test_each_rule),
          TEST(test_errors), TEST(test_overlap))
