/* test-cost.c: the profile reader, Parcae's stage split and costs, the reactive choice
 * against Parcae's own throughput-opt column, the analytic model. */
#include <math.h>
#include <string.h>

#include "helpers.h"
#include "planner-internal.h"
#include "test.h"

static int test_profile(void) {
    struct plan_cost *c = tp_cost("gpt-1.5b_gbs128_mbs1");
    ASSERT_TRUE(c != NULL);
    ASSERT_STREQ(c->model, "gpt-1.5b");
    ASSERT_EQ(c->nshapes, 47);
    ASSERT_NEAR(plan_cost_throughput(c, 4, 8), 43.468, 1e-9, 0);
    ASSERT_NEAR(plan_cost_throughput(c, 3, 3), 0, 0, 0);
    ASSERT_EQ(c->pp_min, 6);
    /* p2p: exact at a profiled size, interpolated between, linear beyond */
    ASSERT_NEAR(plan_cost_p2p_ms(c, 1048576), 1.428108, 1e-9, 0);
    ASSERT_NEAR(plan_cost_p2p_ms(c, 1.5 * 1048576), (1.428108 + 3.006771) / 2, 1e-9, 0);
    ASSERT_NEAR(plan_cost_p2p_ms(c, 2 * 1073741824.0), 2 * 1198.2559, 1e-6, 0);
    /* GPT-1.5b build time: p2p(50257*1024*4)/1000 + 430*ceil(48/pp) */
    double comm = plan_cost_p2p_ms(c, 50257.0 * 1024 * 4);
    ASSERT_NEAR(c->build_ms[8], comm + 430 * 6, 1e-9, 0);
    /* restart "remove" for (4,8): 35 + 39.3*(4+8+1+32) + 240 + build */
    ASSERT_NEAR(plan_cost_restart_ms(c, 4, 8, false), 35 + 39.3 * 45 + 240 + c->build_ms[8],
                1e-9, 0);
    ASSERT_NEAR(plan_cost_restart_ms(c, 4, 8, true),
                6600 + 35 + 500.0 * 45 + 240 + c->build_ms[8], 1e-9, 0);
    plan_cost_free(c);
    return 0;
}

static int test_partition(void) {
    struct plan_cost *c = tp_cost("bert_gbs1024_mbs8"); /* 26 layers */
    ASSERT_TRUE(c != NULL);
    int b[PLAN_MAX_LAYERS + 1];
    /* L=26, P=4: chunk 6, sizes [7,6,6,6], (25 % 4)=1 extra to stage 2 -> [7,6,7,6] */
    ASSERT_OK(plan_cost_partition(c, 4, b));
    ASSERT_EQ(b[1] - b[0], 7);
    ASSERT_EQ(b[2] - b[1], 6);
    ASSERT_EQ(b[3] - b[2], 7);
    ASSERT_EQ(b[4] - b[3], 6);
    ASSERT_OK(plan_cost_partition(c, 1, b));
    ASSERT_EQ(b[1], 26);
    ASSERT_ERR(plan_cost_partition(c, 0, b), -EINVAL);
    ASSERT_ERR(plan_cost_partition(c, 27, b), -EINVAL);
    for (int pp = 1; pp <= 26; pp++) {
        ASSERT_OK(plan_cost_partition(c, pp, b));
        ASSERT_EQ(b[pp], 26);
        for (int s = 0; s < pp; s++)
            ASSERT_GE(b[s + 1], b[s]);
    }
    plan_cost_free(c);
    return 0;
}

/* The reactive shape of every interval is Parcae's throughut-opt column. */
static int test_reactive_matches_parcae(void) {
    struct plan_cost *c = tp_cost("gpt-1.5b_gbs128_mbs1");
    struct plan_decisions *d = tp_decisions("traces/decisions/gpt-1.5b_p3_gbs128_mbs1.json");
    ASSERT_TRUE(c && d);
    ASSERT_EQ(d->n, 683);
    for (int i = 0; i < d->n; i++) {
        int N = d->intervals[i][0] + d->intervals[i][1] - d->intervals[i][2];
        struct plan_shape s = plan_cost_best_shape(c, N);
        if (s.dp != d->shapes[i][0][0] || s.pp != d->shapes[i][0][1])
            TEST_FAIL_("interval %d (N=%d): %dx%d vs Parcae %dx%d", i, N, s.dp, s.pp,
                       d->shapes[i][0][0], d->shapes[i][0][1]);
    }
    plan_cost_free(c);
    plan_decisions_free(d);
    return 0;
}

static int test_transition_kinds(void) {
    struct plan_cost *c = tp_cost("gpt-1.5b_gbs128_mbs1");
    ASSERT_TRUE(c != NULL);
    enum plan_mig_kind k;
    /* nothing changes: free */
    ASSERT_NEAR(plan_cost_transition_ms(c, 32, 4, 8, 0, NULL, 0, 4, 8, &k), 0, 0, 0);
    ASSERT_EQ(k, PLAN_KIND_NONE);
    /* a spare dies (id 32 of 33): intra-stage */
    int v1[] = {32};
    double intra = plan_cost_transition_ms(c, 33, 4, 8, 0, v1, 1, 4, 8, &k);
    ASSERT_EQ(k, PLAN_KIND_INTRA);
    ASSERT_NEAR(intra, plan__intra_ms(c, 4, 8), 1e-9, 0);
    /* a grid instance dies, dp shrinks to 3: intra-stage */
    int v2[] = {5};
    plan_cost_transition_ms(c, 32, 4, 8, 0, v2, 1, 3, 8, &k);
    ASSERT_EQ(k, PLAN_KIND_INTRA);
    /* same depth, keep dp 4 after a loss: inter-stage, slower than intra */
    double inter = plan_cost_transition_ms(c, 33, 4, 8, 0, v2, 1, 4, 8, &k);
    ASSERT_EQ(k, PLAN_KIND_INTER);
    ASSERT_GT(inter, intra);
    /* new depth: repartition */
    plan_cost_transition_ms(c, 32, 4, 8, 0, NULL, 0, 3, 10, &k);
    ASSERT_EQ(k, PLAN_KIND_REPARTITION);
    /* growth: more replicas at the same depth */
    plan_cost_transition_ms(c, 24, 2, 8, 8, NULL, 0, 3, 8, &k);
    ASSERT_EQ(k, PLAN_KIND_GROWTH);
    /* expected over victims lies between the extremes */
    double e = plan_cost_transition_expected_ms(c, 33, 4, 8, 0, 1, 4, 8, 512, 7, NULL);
    ASSERT_TRUE(e > intra && e < inter);
    plan_cost_free(c);
    return 0;
}

/* Exact hypergeometric probability against enumeration of all victim sets. */
static int test_prob_intra_exact(void) {
    int cases[][5] = {{8, 2, 3, 2, 1}, {10, 2, 4, 3, 1}, {12, 3, 3, 2, 2}, {9, 4, 2, 4, 2},
                      {6, 1, 6, 2, 1}};
    for (size_t ci = 0; ci < ST_ARRAY_SIZE(cases); ci++) {
        int N = cases[ci][0], D = cases[ci][1], P = cases[ci][2], k = cases[ci][3];
        int dp = cases[ci][4];
        long good = 0, total = 0;
        for (unsigned m = 0; m < (1u << N); m++) {
            if (__builtin_popcount(m) != k)
                continue;
            total++;
            int ok = 1;
            for (int s = 0; s < P; s++) {
                int rem = D;
                for (int r = 0; r < D; r++)
                    if (m & (1u << (r * P + s)))
                        rem--;
                if (rem < dp)
                    ok = 0;
            }
            good += ok;
        }
        ASSERT_NEAR(plan__prob_intra(N, D, P, k, dp), (double)good / total, 1e-9, 0);
    }
    return 0;
}

static int test_profile_errors(void) {
    size_t len;
    char *t = tp_read("traces/parcae-cost-profiles.json", &len);
    ASSERT_TRUE(t != NULL);
    struct plan_cost *c = NULL;
    struct st_error e;
    memset(&e, 0, sizeof(e));
    ASSERT_ERR(plan_cost_from_profile("p", t, len, "nope", &c, &e), -ENOENT);
    ASSERT_CONTAINS(e.message, "gpt-1.5b_gbs128_mbs1");
    ASSERT_ERR(plan_cost_from_profile("p", t, len, NULL, &c, &e), -EINVAL);
    ASSERT_CONTAINS(e.message, "--model");
    st_free(t);
    const char *bad = "{\"models\": {\"m\": {\"micro_batch\": 1, \"global_batch\": 8}}, "
                      "\"p2p_us\": {\"4\": 1}}";
    ASSERT_ERR(plan_cost_from_profile("p", bad, strlen(bad), NULL, &c, &e), -EINVAL);
    ASSERT_STREQ(e.field, "models.layer_params");
    ASSERT_ERR(plan_cost_from_profile("p", "{", 1, NULL, &c, &e), -EINVAL);
    ASSERT_TRUE(c == NULL);
    return 0;
}

static int test_analytic(void) {
    struct plan_model_desc d = {.layers = 24, .hidden = 1024, .seq = 1024, .vocab = 50257,
                                .micro_batch = 1, .global_batch = 256, .gpu_tflops = 50,
                                .gpu_mem_gib = 16, .net_gbps = 10, .max_n = 64};
    struct plan_cost *c = NULL;
    ASSERT_OK(plan_cost_analytic(&d, &c));
    ASSERT_TRUE(c->nshapes > 10);
    /* more replicas at a fixed depth never lower throughput much; the bubble shrinks */
    ASSERT_TRUE(plan_cost_throughput(c, 8, 2) > plan_cost_throughput(c, 1, 2));
    struct plan_shape b16 = plan_cost_best_shape(c, 16), b64 = plan_cost_best_shape(c, 64);
    ASSERT_TRUE(plan_cost_throughput(c, b64.dp, b64.pp) > plan_cost_throughput(c, b16.dp, b16.pp));
    plan_cost_free(c);
    /* a model too large for one GPU: pp = 1 is infeasible */
    d.layers = 48;
    d.hidden = 4096;
    ASSERT_OK(plan_cost_analytic(&d, &c));
    ASSERT_EQ(plan_cost_shape_index(c, 1, 1), -1);
    ASSERT_GT(c->nshapes, 0);
    plan_cost_free(c);
    d.gpu_mem_gib = 0;
    ASSERT_ERR(plan_cost_analytic(&d, &c), -EINVAL);
    return 0;
}

/* A minimal valid profile, then one broken field at a time. */
static int try_profile(const char *models, const char *p2p, struct st_error *e) {
    char buf[2048];
    snprintf(buf, sizeof(buf), "{\"models\": {\"m\": %s}, \"p2p_us\": %s}", models, p2p);
    struct plan_cost *c = NULL;
    memset(e, 0, sizeof(*e));
    int r = plan_cost_from_profile("p", buf, strlen(buf), NULL, &c, e);
    plan_cost_free(c);
    return r;
}

static int test_profile_field_errors(void) {
    struct st_error e;
    const char *p2p = "{\"4\": 140, \"1048576\": 1400}";
#define M(extra)                                                                   \
    "{\"micro_batch\": 1, \"global_batch\": 8, \"layer_params\": [10, 20, 30], " extra "}"
    ASSERT_OK(try_profile(M("\"throughput\": [{\"dp\": 1, \"pp\": 2, \"samples_per_s\": 5}], "
                            "\"model_build_ms\": {\"2\": 100}"), p2p, &e));
    ASSERT_ERR(try_profile(M("\"throughput\": [{\"dp\": 1, \"pp\": 9, \"samples_per_s\": 5}], "
                             "\"model_build_ms\": {\"2\": 100}"), p2p, &e), -EINVAL);
    ASSERT_STREQ(e.field, "models.throughput");
    ASSERT_ERR(try_profile(M("\"model_build_ms\": {\"2\": 100}"), p2p, &e), -EINVAL);
    ASSERT_STREQ(e.field, "models.throughput");
    ASSERT_ERR(try_profile(M("\"throughput\": [{\"dp\": 1, \"pp\": 2, \"samples_per_s\": 5}]"),
                           p2p, &e), -EINVAL);
    ASSERT_STREQ(e.field, "models.model_build_ms");
    ASSERT_ERR(try_profile(M("\"throughput\": [{\"dp\": 1, \"pp\": 2, \"samples_per_s\": 5}], "
                             "\"model_build_ms\": {\"x\": 100}"), p2p, &e), -EINVAL);
    ASSERT_STREQ(e.field, "models.model_build_ms");
    ASSERT_ERR(try_profile(M("\"throughput\": [{\"dp\": 1, \"pp\": 2, \"samples_per_s\": 5}], "
                             "\"model_build_ms\": \"pp squared\""), p2p, &e), -EINVAL);
    ASSERT_STREQ(e.field, "models.model_build_ms");
    ASSERT_ERR(try_profile(M("\"throughput\": [{\"dp\": 1, \"pp\": 2, \"samples_per_s\": 5}], "
                             "\"model_build_ms\": {\"2\": 100}"), "{\"four\": 1}", &e), -EINVAL);
    ASSERT_STREQ(e.field, "p2p_us");
    ASSERT_ERR(try_profile("{\"micro_batch\": \"one\", \"global_batch\": 8}", p2p, &e), -EINVAL);
    ASSERT_STREQ(e.field, "models.micro_batch");
    ASSERT_ERR(try_profile("{\"micro_batch\": 1, \"global_batch\": 8, \"layer_params\": [1, -2]}",
                           p2p, &e), -EINVAL);
    ASSERT_STREQ(e.field, "models.layer_params");
#undef M
    const char *nomodels = "{\"p2p_us\": {}}";
    struct plan_cost *c = NULL;
    ASSERT_ERR(plan_cost_from_profile("p", nomodels, strlen(nomodels), NULL, &c, &e), -EINVAL);
    ASSERT_STREQ(e.field, "models");
    return 0;
}

TEST_MAIN(TEST(test_profile), TEST(test_partition), TEST(test_reactive_matches_parcae),
          TEST(test_transition_kinds), TEST(test_prob_intra_exact), TEST(test_profile_errors),
          TEST(test_analytic), TEST(test_profile_field_errors))
