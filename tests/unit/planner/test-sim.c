/* test-sim.c: the simulator reproduces Parcae's own scores and orders the policies. */
#include <string.h>

#include "helpers.h"
#include "test.h"

static int run(const struct plan_cost *c, const struct plan_trace *t,
               const struct plan_decisions *d, enum plan_policy p, double unannounced,
               struct plan_sim_result *r) {
    struct plan_sim_options o;
    plan_sim_options_init(&o);
    o.decisions = d;
    o.unannounced = unannounced;
    o.cost_samples = 64;
    return plan_simulate(c, t, p, &o, r);
}

static int test_gpt15b(void) {
    struct plan_cost *c = tp_cost("gpt-1.5b_gbs128_mbs1");
    struct plan_trace *t = tp_trace("traces/per-model/gpt-1.5b_p3_gbs128_mbs1.jsonl");
    struct plan_decisions *d = tp_decisions("traces/decisions/gpt-1.5b_p3_gbs128_mbs1.json");
    ASSERT_TRUE(c && t && d);
    struct plan_sim_result r[PLAN_POL_NKINDS];
    for (int p = 0; p < PLAN_POL_NKINDS; p++)
        ASSERT_OK(run(c, t, d, (enum plan_policy)p, 0, &r[p]));
    /* Parcae's own simulator gives these fractions of ideal (issue 8's table) */
    ASSERT_NEAR(r[PLAN_POL_CKPT_RESTART].ideal_fraction, 0.778, 0.003, 0);
    ASSERT_NEAR(r[PLAN_POL_PARCAE].ideal_fraction, 0.865, 0.003, 0);
    ASSERT_NEAR(r[PLAN_POL_REACTIVE].ideal_fraction, 0.923, 0.003, 0);
    ASSERT_NEAR(r[PLAN_POL_PARCAE_TRUTH].ideal_fraction, 0.932, 0.003, 0);
    ASSERT_NEAR(r[PLAN_POL_IDEAL].ideal_fraction, 1.0, 1e-12, 0);
    for (int p = 0; p < PLAN_POL_NKINDS; p++) {
        ASSERT_TRUE(r[p].committed_samples <= r[PLAN_POL_IDEAL].committed_samples * (1 + 1e-12));
        ASSERT_EQ(r[p].n, 683);
        ASSERT_NEAR(r[p].cum_samples[682], r[p].committed_samples, 1e-6, 0);
    }
    ASSERT_TRUE(r[PLAN_POL_LIVEPUT].committed_samples > r[PLAN_POL_REACTIVE].committed_samples);
    ASSERT_TRUE(r[PLAN_POL_LIVEPUT].committed_samples > r[PLAN_POL_PARCAE].committed_samples);
    double oracle = r[PLAN_POL_LIVEPUT_ORACLE].committed_samples;
    ASSERT_TRUE(r[PLAN_POL_LIVEPUT].committed_samples >= 0.98 * oracle);
    double ckpt = r[PLAN_POL_CKPT_RESTART].committed_samples;
    ASSERT_TRUE(r[PLAN_POL_REACTIVE].committed_samples > ckpt);
    ASSERT_TRUE(r[PLAN_POL_LIVEPUT].reconfigurations < r[PLAN_POL_PARCAE].reconfigurations);
    ASSERT_TRUE(r[PLAN_POL_LIVEPUT].dollars > 0);
    ASSERT_NEAR(r[PLAN_POL_LIVEPUT].dollars, r[PLAN_POL_REACTIVE].dollars, 1e-9, 0);
    /* every shape fits the live instances */
    for (int i = 0; i < 683; i++)
        ASSERT_LE(r[PLAN_POL_LIVEPUT].shape[i].dp * r[PLAN_POL_LIVEPUT].shape[i].pp,
                  plan_trace_n_after(t, i));
    for (int p = 0; p < PLAN_POL_NKINDS; p++)
        plan_sim_result_done(&r[p]);
    /* without notices the forecast alone still beats reactive */
    struct plan_sim_result u;
    ASSERT_OK(run(c, t, d, PLAN_POL_LIVEPUT, 1.0, &u));
    ASSERT_OK(run(c, t, d, PLAN_POL_REACTIVE, 1.0, &r[0]));
    ASSERT_TRUE(u.committed_samples > r[0].committed_samples);
    plan_sim_result_done(&u);
    plan_sim_result_done(&r[0]);
    plan_cost_free(c);
    plan_trace_free(t);
    plan_decisions_free(d);
    return 0;
}

static int test_named_victims_and_errors(void) {
    struct plan_cost *c = tp_cost("gpt-1.5b_gbs128_mbs1");
    struct plan_trace *t = tp_trace("traces/events.csv");
    ASSERT_TRUE(c && t);
    struct plan_sim_options o;
    plan_sim_options_init(&o);
    o.named_victims = true;
    struct plan_sim_result a, b;
    ASSERT_OK(plan_simulate(c, t, PLAN_POL_REACTIVE, &o, &a));
    ASSERT_OK(plan_simulate(c, t, PLAN_POL_IDEAL, &o, &b));
    ASSERT_TRUE(a.committed_samples < b.committed_samples);
    ASSERT_TRUE(a.ideal_fraction > 0.85);
    plan_sim_result_done(&a);
    plan_sim_result_done(&b);
    /* parcae policies need a decisions file of the same length */
    ASSERT_ERR(plan_simulate(c, t, PLAN_POL_PARCAE, &o, &a), -EINVAL);
    struct plan_decisions *d = tp_decisions("traces/decisions/vgg19_gbs2048_mbs32.json");
    ASSERT_TRUE(d != NULL);
    o.decisions = d;
    ASSERT_ERR(plan_simulate(c, t, PLAN_POL_PARCAE_TRUTH, &o, &a), -EINVAL);
    enum plan_policy p;
    ASSERT_ERR(plan_policy_parse("greedy", &p), -EINVAL);
    ASSERT_OK(plan_policy_parse("parcae-truth", &p));
    ASSERT_EQ(p, PLAN_POL_PARCAE_TRUTH);
    plan_decisions_free(d);
    plan_cost_free(c);
    plan_trace_free(t);
    return 0;
}

TEST_MAIN(TEST(test_gpt15b), TEST(test_named_victims_and_errors))
