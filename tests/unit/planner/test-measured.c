/* test-measured.c: migration cost files (plan_measured_costs_parse) and charging migrations
 * with them (plan_cost_use_measured) instead of Parcae's restarts, down to the millisecond on a
 * small hand-made model, and their effect on a whole simulated trace. */
#include <math.h>
#include <string.h>

#include "helpers.h"
#include "planner-internal.h" /* plan__margin */
#include "test.h"

/* Five layers of 100..500 parameters: pp = 2 splits them [0,3) [3,5) (600 and 900 params),
 * pp = 4 splits them [0,2) [2,3) [3,4) [4,5) (300, 300, 400, 500). */
static const char *const PROFILE =
    "{\"models\": {\"m\": {\"micro_batch\": 1, \"global_batch\": 8,"
    " \"layer_params\": [100, 200, 300, 400, 500],"
    " \"throughput\": [{\"dp\": 1, \"pp\": 2, \"samples_per_s\": 5},"
    "                {\"dp\": 1, \"pp\": 4, \"samples_per_s\": 6},"
    "                {\"dp\": 2, \"pp\": 2, \"samples_per_s\": 9},"
    "                {\"dp\": 2, \"pp\": 4, \"samples_per_s\": 11}],"
    " \"model_build_ms\": {\"2\": 100, \"4\": 100}}}, \"p2p_us\": {\"4\": 140, \"1048576\": 1400}}";

/* 8 Gb/s raw = 1e9 bytes/s; the data plane at half of it; fixed parts 0.1 .. 0.4 s. */
static const char *const COSTS =
    "{\"machine\": \"test box\", \"link_gbps\": 8, \"kinds\": {"
    " \"intra-stage\": {\"fixed_s\": 0.1, \"bytes_per_s\": 5e8},"
    " \"inter-stage\": {\"fixed_s\": 0.2, \"bytes_per_s\": 5e8},"
    " \"pipeline\": {\"fixed_s\": 0.3, \"bytes_per_s\": 5e8},"
    " \"dp-resharding\": {\"fixed_s\": 0.4, \"bytes_per_s\": 5e8}}}";

static int parse(const char *text, struct plan_measured_costs *m, struct st_error *e) {
    memset(e, 0, sizeof(*e));
    return plan_measured_costs_parse("costs.json", text, strlen(text), m, e);
}

static struct plan_cost *small_cost(void) {
    struct plan_cost *c = NULL;
    struct st_error e;
    if (plan_cost_from_profile("p", PROFILE, strlen(PROFILE), NULL, &c, &e) < 0)
        return NULL;
    return c;
}

static int test_parse(void) {
    struct plan_measured_costs m;
    struct st_error e;
    ASSERT_OK(parse(COSTS, &m, &e));
    ASSERT_STREQ(m.machine, "test box");
    ASSERT_NEAR(m.link_gbps, 8, 0, 0);
    ASSERT_NEAR(m.fixed_s[PLAN_RECONF_INTRA_STAGE], 0.1, 0, 0);
    ASSERT_NEAR(m.fixed_s[PLAN_RECONF_INTER_STAGE], 0.2, 0, 0);
    ASSERT_NEAR(m.fixed_s[PLAN_RECONF_PIPELINE], 0.3, 0, 0);
    ASSERT_NEAR(m.fixed_s[PLAN_RECONF_DP_RESHARDING], 0.4, 0, 0);
    for (int k = 0; k < PLAN_RECONF_NLIVE; k++) {
        ASSERT_NEAR(m.bytes_per_s[k], 5e8, 0, 0);
        ASSERT_NEAR(m.raw_bytes_per_s[k], 0, 0, 0);
    }
    ASSERT_STREQ(plan_reconf_name(PLAN_RECONF_DP_RESHARDING), "dp-resharding");
    ASSERT_STREQ(plan_reconf_name(PLAN_RECONF_NLIVE), "checkpoint-restore");
    ASSERT_STREQ(plan_reconf_name(PLAN_RECONF_FRESH_START), "fresh-start");
    ASSERT_STREQ(plan_reconf_name(PLAN_RECONF_NONE), "none");
    ASSERT_STREQ(plan_reconf_name(PLAN_RECONF_NKINDS), "?");
    ASSERT_STREQ(plan_reconf_label(PLAN_RECONF_PEER_RESTORE), "peer_restore");
    ASSERT_STREQ(plan_reconf_label(PLAN_RECONF_NKINDS), "?");
    /* extra fields are allowed, raw_bytes_per_s is read */
    const char *extra = "{\"link_gbps\": 8, \"note\": [1], \"kinds\": {"
                        " \"intra-stage\": {\"fixed_s\": 0, \"bytes_per_s\": 1, \"samples\": 3},"
                        " \"inter-stage\": {\"fixed_s\": 0, \"bytes_per_s\": 1},"
                        " \"pipeline\": {\"fixed_s\": 0, \"bytes_per_s\": 1,"
                        "                \"raw_bytes_per_s\": 2},"
                        " \"dp-resharding\": {\"fixed_s\": 0, \"bytes_per_s\": 1}}}";
    ASSERT_OK(parse(extra, &m, &e));
    ASSERT_STREQ(m.machine, "");
    ASSERT_NEAR(m.raw_bytes_per_s[PLAN_RECONF_PIPELINE], 2, 0, 0);
    /* samples: the migrations behind a figure, one where the file does not say */
    ASSERT_EQ(m.samples[PLAN_RECONF_INTRA_STAGE], 3);
    ASSERT_EQ(m.samples[PLAN_RECONF_INTER_STAGE], 1);
    return 0;
}

static int test_parse_errors(void) {
    struct plan_measured_costs m, keep;
    struct st_error e;
    memset(&keep, 0x5a, sizeof(keep));
    m = keep;
    ASSERT_ERR(parse("{\"link_gbps\": 8,\n \"kinds\": {", &m, &e), -EINVAL);
    ASSERT_STREQ(e.field, "json");
    ASSERT_EQ(e.line, 2);
    ASSERT_TRUE(memcmp(&m, &keep, sizeof(m)) == 0); /* nothing written on failure */
    ASSERT_ERR(parse("[1, 2]", &m, &e), -EINVAL);
    ASSERT_CONTAINS(e.message, "JSON object");
    ASSERT_ERR(parse("{\"machine\": 3, \"link_gbps\": 8, \"kinds\": {}}", &m, &e), -EINVAL);
    ASSERT_STREQ(e.field, "machine");
    ASSERT_ERR(parse("{\"kinds\": {}}", &m, &e), -EINVAL);
    ASSERT_STREQ(e.field, "link_gbps");
    ASSERT_ERR(parse("{\"link_gbps\": -1, \"kinds\": {}}", &m, &e), -EINVAL);
    ASSERT_STREQ(e.field, "link_gbps");
    ASSERT_ERR(parse("{\"link_gbps\": 8}", &m, &e), -EINVAL);
    ASSERT_STREQ(e.field, "kinds");
    ASSERT_ERR(parse("{\"link_gbps\": 8, \"kinds\": {\"intra-stage\": {\"fixed_s\": 0, "
                     "\"bytes_per_s\": 1}}}", &m, &e), -EINVAL);
    ASSERT_STREQ(e.field, "kinds.inter-stage");
    ASSERT_CONTAINS(e.message, "missing");
    /* each bad number names its kind and field */
    struct {
        const char *from, *to, *field;
    } cases[] = {
        {"\"fixed_s\": 0.2", "\"fixed_s\": -0.2", "kinds.inter-stage.fixed_s"},
        {"\"fixed_s\": 0.3", "\"fixed_s\": \"0.3\"", "kinds.pipeline.fixed_s"},
        {"\"fixed_s\": 0.1, \"bytes_per_s\": 5e8", "\"fixed_s\": 0.1", "kinds.intra-stage.bytes_per_s"},
        {"\"fixed_s\": 0.4, \"bytes_per_s\": 5e8", "\"fixed_s\": 0.4, \"bytes_per_s\": 0",
         "kinds.dp-resharding.bytes_per_s"},
        {"\"fixed_s\": 0.4, \"bytes_per_s\": 5e8", "\"fixed_s\": 0.4, \"bytes_per_s\": 5e8, "
         "\"raw_bytes_per_s\": \"fast\"", "kinds.dp-resharding.raw_bytes_per_s"},
        {"\"fixed_s\": 0.2, \"bytes_per_s\": 5e8", "\"fixed_s\": 0.2, \"bytes_per_s\": 5e8, "
         "\"samples\": -1", "kinds.inter-stage.samples"},
        {"\"fixed_s\": 0.3, \"bytes_per_s\": 5e8", "\"fixed_s\": 0.3, \"bytes_per_s\": 5e8, "
         "\"samples\": 1.5", "kinds.pipeline.samples"},
        {"\"fixed_s\": 0.3, \"bytes_per_s\": 5e8", "\"fixed_s\": 0.3, \"bytes_per_s\": 5e8, "
         "\"samples\": 3000000000", "kinds.pipeline.samples"},
    };
    for (size_t i = 0; i < ST_ARRAY_SIZE(cases); i++) {
        char buf[1024];
        const char *at = strstr(COSTS, cases[i].from);
        ASSERT_TRUE(at != NULL);
        snprintf(buf, sizeof(buf), "%.*s%s%s", (int)(at - COSTS), COSTS, cases[i].to,
                 at + strlen(cases[i].from));
        ASSERT_ERR(parse(buf, &m, &e), -EINVAL);
        ASSERT_STREQ(e.field, cases[i].field);
        ASSERT_STREQ(e.file, "costs.json");
    }
    return 0;
}

static int test_charging(void) {
    struct plan_cost *c = small_cost();
    struct plan_measured_costs m;
    struct st_error e;
    enum plan_mig_kind k;
    ASSERT_TRUE(c != NULL);
    ASSERT_OK(parse(COSTS, &m, &e));
    ASSERT_OK(plan_cost_use_measured(c, &m, 0)); /* the measured rate as is: 5e5 bytes/ms */
    ASSERT_TRUE(c->measured);
    /* nothing happens: free */
    ASSERT_NEAR(plan_cost_transition_ms(c, 8, 2, 4, 0, NULL, 0, 2, 4, &k), 0, 0, 0);
    ASSERT_EQ(k, PLAN_KIND_NONE);
    /* The state moves after the boundary, beside the new shape's first step (steps of
     * seconds here): the step waits for the weights (4 bytes a parameter), the moments (8)
     * move while it runs. 2x4 -> 1x4, nobody lost: intra-stage 100 ms + dp-resharding 400 ms;
     * the largest stage's moments (500 params x 8 bytes over 5e5 bytes/ms) are hidden */
    ASSERT_NEAR(plan_cost_transition_ms(c, 8, 2, 4, 0, NULL, 0, 1, 4, &k), 500, 1e-9, 0);
    ASSERT_EQ(k, PLAN_KIND_INTRA);
    /* 1x4 loses stage 3: its 500 params' weights x 4 bytes, 200 ms fixed */
    int v3 = 3;
    ASSERT_NEAR(plan_cost_transition_ms(c, 4, 1, 4, 1, &v3, 1, 1, 4, &k), 200.004, 1e-9, 0);
    ASSERT_EQ(k, PLAN_KIND_INTER);
    /* 1x4 grows to 2x4: every stage gets a replica (largest 500 params) and dp reshards */
    ASSERT_NEAR(plan_cost_transition_ms(c, 8, 1, 4, 4, NULL, 0, 2, 4, &k),
                200 + 0.004 + 400, 1e-9, 0);
    ASSERT_EQ(k, PLAN_KIND_GROWTH);
    /* 1x4 -> 1x2: new stage 0 [0,3) lacks 300 params of any old stage, stage 1 [3,5) lacks
     * 400 (old stage 3 holds 500); the larger fetch sets the time */
    ASSERT_NEAR(plan_cost_transition_ms(c, 4, 1, 4, 0, NULL, 0, 1, 2, &k), 300.0032, 1e-9, 0);
    ASSERT_EQ(k, PLAN_KIND_REPARTITION);
    ASSERT_NEAR(plan_cost_transition_estimate_ms(c, 4, 1, 4, 0, 0, 1, 2, &k), 300.0032, 1e-9, 0);
    ASSERT_EQ(k, PLAN_KIND_REPARTITION);
    /* ... with old stage 3 lost, stage 1 must fetch 500 */
    ASSERT_NEAR(plan_cost_transition_ms(c, 4, 1, 4, 0, &v3, 1, 1, 2, &k), 300.004, 1e-9, 0);
    /* 2x4 -> 2x2: plus the largest new stage (900 params) for the second replica */
    ASSERT_NEAR(plan_cost_transition_ms(c, 8, 2, 4, 0, NULL, 0, 2, 2, &k), 300.0104, 1e-9, 0);
    /* moved at the boundary (fleet.data_plane.overlap false), all 12 bytes stall */
    c->meas_at_boundary = true;
    ASSERT_NEAR(plan_cost_transition_ms(c, 4, 1, 4, 1, &v3, 1, 1, 4, &k), 200.012, 1e-9, 0);
    ASSERT_NEAR(plan_cost_transition_ms(c, 8, 2, 4, 0, NULL, 0, 2, 2, &k), 300.0312, 1e-9, 0);
    ASSERT_NEAR(plan_cost_transition_ms(c, 8, 2, 4, 0, NULL, 0, 1, 4, &k), 500.008, 1e-9, 0);
    c->meas_at_boundary = false;
    /* the estimate mixes intra (2x4 keeps both replicas of every stage with prob p) and inter:
     * one of 8 instances lost, dp stays 1 of 2 -> always intra-stage plus a reshard */
    ASSERT_NEAR(plan_cost_transition_estimate_ms(c, 8, 2, 4, 0, 1, 1, 4, &k), 500, 1e-9, 0);
    ASSERT_EQ(k, PLAN_KIND_INTRA);
    /* over an 80 Gb/s link (1e10 bytes/s) the transport's own 5e8 bytes/s sets the rate */
    ASSERT_OK(plan_cost_use_measured(c, &m, 80));
    ASSERT_NEAR(plan_cost_transition_ms(c, 4, 1, 4, 1, &v3, 1, 1, 4, &k), 200.004, 1e-9, 0);
    /* over a 1 Gb/s link (1.25e8 bytes/s) the link does; raw TCP's figure does not enter */
    ASSERT_OK(plan_cost_use_measured(c, &m, 1));
    ASSERT_NEAR(plan_cost_transition_ms(c, 4, 1, 4, 1, &v3, 1, 1, 4, &k), 200.016, 1e-9, 0);
    m.raw_bytes_per_s[PLAN_RECONF_INTER_STAGE] = 5e8;
    ASSERT_OK(plan_cost_use_measured(c, &m, 1));
    ASSERT_NEAR(plan_cost_transition_ms(c, 4, 1, 4, 1, &v3, 1, 1, 4, &k), 200.016, 1e-9, 0);
    /* moments that outlast the step stall for the rest: at 1 byte/ms, 1x4 -> 1x2's 400
     * params (1600 bytes of weights, 3200 of moments) against the 1x2 step's 400 ms */
    for (int i = 0; i < PLAN_RECONF_NLIVE; i++)
        m.bytes_per_s[i] = 1000;
    ASSERT_OK(plan_cost_use_measured(c, &m, 0));
    double step_ms = 1000.0 * c->global_batch / plan_cost_throughput(c, 1, 2);
    ASSERT_TRUE(step_ms < 3200);
    ASSERT_NEAR(plan_cost_transition_ms(c, 4, 1, 4, 0, NULL, 0, 1, 2, &k),
                300 + 1600 + (3200 - step_ms), 1e-9, 0);
    m.bytes_per_s[PLAN_RECONF_PIPELINE] = 5e8;
    /* bad figures are refused */
    m.bytes_per_s[PLAN_RECONF_PIPELINE] = 0;
    ASSERT_ERR(plan_cost_use_measured(c, &m, 10), -EINVAL);
    m.bytes_per_s[PLAN_RECONF_PIPELINE] = 1;
    m.link_gbps = 0;
    ASSERT_ERR(plan_cost_use_measured(c, &m, 10), -EINVAL);
    ASSERT_ERR(plan_cost_use_measured(NULL, &m, 10), -EINVAL);
    plan_cost_free(c);
    return 0;
}

static double liveput_fraction(const char *costs_json, double link_gbps) {
    struct plan_cost *c = tp_cost("gpt-1.5b_gbs128_mbs1");
    struct plan_trace *t = tp_trace("traces/per-model/gpt-1.5b_p3_gbs128_mbs1.jsonl");
    struct plan_measured_costs m;
    struct st_error e;
    struct plan_sim_options o;
    struct plan_sim_result r;
    double f = -1;
    plan_sim_options_init(&o);
    o.cost_samples = 64;
    if (c && t &&
        plan_measured_costs_parse("c", costs_json, strlen(costs_json), &m, &e) == 0 &&
        plan_cost_use_measured(c, &m, link_gbps) == 0 &&
        plan_simulate(c, t, PLAN_POL_LIVEPUT, &o, &r) == 0) {
        f = r.ideal_fraction;
        plan_sim_result_done(&r);
    }
    plan_cost_free(c);
    plan_trace_free(t);
    return f;
}

/* On Parcae's gpt-1.5b trace, live migrations at a 10 Gb/s link clear 0.98 of ideal, and a
 * file whose fixed parts are larger gives a lower fraction. */
static int test_trace_fraction(void) {
#define FILE_(f)                                                                   \
    "{\"link_gbps\": 10, \"kinds\": {"                                             \
    "\"intra-stage\": {\"fixed_s\": " f ", \"bytes_per_s\": 1e9},"                 \
    "\"inter-stage\": {\"fixed_s\": " f ", \"bytes_per_s\": 1e9},"                 \
    "\"pipeline\": {\"fixed_s\": " f ", \"bytes_per_s\": 1e9},"                    \
    "\"dp-resharding\": {\"fixed_s\": " f ", \"bytes_per_s\": 1e9}}}"
    double small = liveput_fraction(FILE_("0.1"), 10);
    double large = liveput_fraction(FILE_("5"), 10);
#undef FILE_
    ASSERT_TRUE(small >= 0.98 && small <= 1.0);
    ASSERT_TRUE(large > 0 && large < small);
    /* and both beat Parcae's restart-based accounting of the same trace (0.94 at best) */
    struct plan_cost *c = tp_cost("gpt-1.5b_gbs128_mbs1");
    struct plan_trace *t = tp_trace("traces/per-model/gpt-1.5b_p3_gbs128_mbs1.jsonl");
    ASSERT_TRUE(c && t);
    struct plan_sim_options o;
    struct plan_sim_result r;
    plan_sim_options_init(&o);
    o.cost_samples = 64;
    ASSERT_OK(plan_simulate(c, t, PLAN_POL_LIVEPUT, &o, &r));
    ASSERT_TRUE(r.ideal_fraction < large);
    plan_sim_result_done(&r);
    plan_cost_free(c);
    plan_trace_free(t);
    return 0;
}

/* The online fit: step times per shape, the prior scaled for shapes not run, migrations'
 * fixed parts, and the model plan_decide gets from it. */
static int test_fit(void) {
    struct plan_cost *c = small_cost();
    struct plan_fit *f = NULL;
    ASSERT_TRUE(c != NULL);
    ASSERT_ERR(plan_fit_new(NULL, &f), -EINVAL);
    ASSERT_OK(plan_fit_new(c, &f));
    /* the prior: global batch 8 over the profiled samples/s */
    ASSERT_NEAR(plan_fit_step_seconds(f, 1, 2), 1.6, 1e-12, 0);
    ASSERT_NEAR(plan_fit_step_seconds(f, 3, 3), 0, 0, 0);
    ASSERT_ERR(plan_fit_observe_step(f, 3, 3, 1.0), -EINVAL);
    ASSERT_ERR(plan_fit_observe_step(f, 1, 2, 0), -EINVAL);
    ASSERT_ERR(plan_fit_observe_step(f, 1, 2, NAN), -EINVAL);
    ASSERT_OK(plan_fit_observe_step(f, 1, 2, 3.2));
    ASSERT_NEAR(plan_fit_step_seconds(f, 1, 2), 3.2, 1e-9, 0);
    ASSERT_NEAR(plan_fit_step_seconds(f, 2, 4), 8.0 / 11 * 2, 1e-9, 0); /* prior x 2 */
    /* one shape seen: the decayed mean (0.7 log 2 + 0) / 1.7 scales every shape not run (b, c
     * stay 0); (1,2) itself: the moving average of its own, (log 2 + 0) / 2 */
    ASSERT_OK(plan_fit_observe_step(f, 1, 2, 1.6));
    double lv = 0.7 / 1.7;
    ASSERT_NEAR(plan_fit_step_seconds(f, 1, 2), 1.6 * pow(2, 0.5), 1e-6, 0);
    ASSERT_NEAR(plan_fit_step_seconds(f, 2, 2), 8.0 / 9 * pow(2, lv), 1e-6, 0);
    const struct plan_cost *fc = plan_fit_cost(f);
    ASSERT_NEAR(plan_cost_throughput(fc, 1, 2), 5 / pow(2, 0.5), 1e-5, 0);
    /* a second shape that runs as slow as the first per step: more replicas do not help here,
     * and the fit learns it (dp's coefficient), so a third shape is predicted slower than the
     * prior's scaling would say */
    for (int k = 0; k < 6; k++) {
        ASSERT_OK(plan_fit_observe_step(f, 1, 2, 2.0));
        ASSERT_OK(plan_fit_observe_step(f, 2, 2, 2.0));
    }
    ASSERT_NEAR(plan_fit_step_seconds(f, 1, 2), 2.0, 0.01, 0);
    ASSERT_NEAR(plan_fit_step_seconds(f, 2, 2), 2.0, 1e-9, 0);
    ASSERT_TRUE(plan_fit_step_seconds(f, 2, 4) > 1.5 * 8.0 / 11 * 2.0 / 1.6);
    ASSERT_NEAR(plan_cost_throughput(fc, 2, 2), 9 / pow(2, lv), 1e-5, 0);
    ASSERT_FALSE(fc->measured); /* no migration measured yet: the prior's costs */
    ASSERT_NEAR(plan_cost_throughput(c, 1, 2), 5, 0, 0); /* the prior is not touched */
    /* migrations: the prior's link is its p2p table, 1 MiB in 1.4 ms */
    double link = 1048576 / 1.4e-3;
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTRA_STAGE, 0), 1.065, 1e-12, 0);
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_NLIVE, 0), -1, 0, 0);
    ASSERT_ERR(plan_fit_observe_migration(f, PLAN_RECONF_PIPELINE, -1, 0.5), -EINVAL);
    ASSERT_ERR(plan_fit_observe_migration(f, PLAN_RECONF_PIPELINE, 0, INFINITY), -EINVAL);
    ASSERT_FALSE(plan_fit_stall_calibrated(f)); /* the prior alone, whatever steps say */
    ASSERT_FALSE(plan_fit_stall_calibrated(NULL));
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_PIPELINE, link * 0.5, 0.75));
    ASSERT_TRUE(plan_fit_stall_calibrated(f));
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_PIPELINE, link), 1.25, 1e-9, 0);
    /* a kind not measured: the mean over the kinds measured */
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTRA_STAGE, 0), 0.25, 1e-9, 0);
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTRA_STAGE, 0, 0.05));
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTRA_STAGE, 0, 0.15));
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTRA_STAGE, 0), 0.1, 1e-12, 0);
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTER_STAGE, 0), 0.175, 1e-9, 0);
    /* now plan_decide's model charges live migrations with those figures */
    fc = plan_fit_cost(f);
    ASSERT_TRUE(fc->measured);
    enum plan_mig_kind k;
    ASSERT_NEAR(plan_cost_transition_ms(fc, 8, 2, 4, 0, NULL, 0, 2, 4, &k), 0, 0, 0);
    int v3 = 3; /* 1x4 loses stage 3: 175 ms fixed (inter: the measured kinds' mean) + 2000
                 * bytes of weights (its moments move during the first step) */
    ASSERT_NEAR(plan_cost_transition_ms(fc, 4, 1, 4, 1, &v3, 1, 1, 4, &k),
                175 + 2000 / link * 1000, 1e-6, 0);
    ASSERT_EQ(k, PLAN_KIND_INTER);
    ASSERT_TRUE(plan_fit_free(f) == NULL);
    ASSERT_TRUE(plan_fit_free(NULL) == NULL);
    plan_cost_free(c);
    return 0;
}

/* A fit started from a cost file (planner.migration_costs): every kind is charged the file's
 * fixed part and throughput before the job measured any, plan_decide's model charges them at
 * once, and a measured kind averages its file figure (one migration's worth here) with what
 * the job measures (its bytes taken at the file's rate). */
static int test_fit_start_costs(void) {
    struct plan_cost *c = small_cost();
    struct plan_fit *f = NULL;
    ASSERT_TRUE(c != NULL);
    ASSERT_OK(plan_fit_new(c, &f));
    struct plan_measured_costs m;
    memset(&m, 0, sizeof(m));
    m.link_gbps = 10;
    for (int k = 0; k < PLAN_RECONF_NLIVE; k++) {
        m.fixed_s[k] = 0.01 * (k + 1);
        m.bytes_per_s[k] = 1e9 * (k + 1);
        m.samples[k] = 1;
    }
    struct plan_measured_costs bad = m;
    bad.bytes_per_s[PLAN_RECONF_PIPELINE] = 0;
    ASSERT_ERR(plan_fit_start_costs(f, &bad), -EINVAL);
    bad = m;
    bad.fixed_s[PLAN_RECONF_INTER_STAGE] = NAN;
    ASSERT_ERR(plan_fit_start_costs(f, &bad), -EINVAL);
    bad = m;
    bad.samples[PLAN_RECONF_INTRA_STAGE] = -1;
    ASSERT_ERR(plan_fit_start_costs(f, &bad), -EINVAL);
    ASSERT_ERR(plan_fit_start_costs(NULL, &m), -EINVAL);
    /* before: the prior's guess; after: the file's figures */
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTRA_STAGE, 0), 1.065, 1e-12, 0);
    ASSERT_FALSE(plan_fit_stall_calibrated(f));
    ASSERT_OK(plan_fit_start_costs(f, &m));
    ASSERT_TRUE(plan_fit_stall_calibrated(f)); /* the file's figures were measured */
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTRA_STAGE, 0), 0.01, 1e-12, 0);
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_PIPELINE, 3e9), 0.03 + 1.0, 1e-12, 0);
    ASSERT_TRUE(plan_fit_cost(f)->measured); /* charged from the start */
    /* a pipeline move measured: 0.5 s for 3e9 bytes at the file's 3e9 B/s: fixed -0.5 -> 0,
     * averaged with the file's 0.03 */
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_PIPELINE, 3e9, 0.5));
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_PIPELINE, 0), 0.015, 1e-12, 0);
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_PIPELINE, 0, 0.21));
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_PIPELINE, 0), 0.08, 1e-12, 0);
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTER_STAGE, 2e9), 0.02 + 1.0, 1e-12, 0);
    /* One stall an order of magnitude above the rest (a worker descheduled at the hand-off)
     * does not carry into the figure once there are others to tell: more than 8x their median
     * is left out; once 8 more came it is gone from the window anyway. */
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTER_STAGE, 0, 1.0));
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTER_STAGE, 0), 0.51, 1e-12, 0);
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTER_STAGE, 0, 0.11));
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTER_STAGE, 0, 0.09));
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTER_STAGE, 0), 0.22 / 3, 1e-12, 0);
    for (int i = 0; i < 4; i++) {
        ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTER_STAGE, 0, 0.12));
        ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTER_STAGE, 0, 0.08));
    }
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTER_STAGE, 0), 0.82 / 9, 1e-12, 0);
    /* an unseen kind is charged the mean over the kinds measured: inter's last 8 */
    plan_fit_free(f);
    ASSERT_OK(plan_fit_new(c, &f));
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTER_STAGE, 0, 1.0));
    for (int i = 0; i < 8; i++)
        ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTER_STAGE, 0, 0.1));
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTRA_STAGE, 0), 0.1, 1e-12, 0);
    plan_fit_free(f);
    plan_cost_free(c);
    return 0;
}

/* The margins a change must beat: left NAN by plan_options_init, they follow the cost model
 * (restart-based until measured costs are in use); a margin that was set stays set. */
static int test_margins(void) {
    struct plan_cost *c = small_cost();
    struct plan_measured_costs m;
    struct plan_options o;
    struct st_error e;
    ASSERT_TRUE(c != NULL);
    plan_options_init(&o);
    ASSERT_TRUE(isnan(o.hysteresis) && isnan(o.defer));
    ASSERT_NEAR(plan__margin(c, o.hysteresis), PLAN_MARGIN_RESTART, 0, 0);
    ASSERT_NEAR(plan__margin(c, 0.02), 0.02, 0, 0);
    ASSERT_OK(parse(COSTS, &m, &e));
    ASSERT_OK(plan_cost_use_measured(c, &m, 0));
    ASSERT_NEAR(plan__margin(c, o.defer), PLAN_MARGIN_MEASURED, 0, 0);
    ASSERT_NEAR(plan__margin(c, 0), 0, 0, 0);
    ASSERT_TRUE(PLAN_MARGIN_MEASURED < PLAN_MARGIN_RESTART);
    plan_cost_free(c);
    return 0;
}

/* Two shapes taking turns, each as fast as it was the time before: each is predicted at its
 * own step time, not pulled towards the other's. (The quickstart's 4x2 and 2x2 do this over a
 * long trace: predicted as the regression plus a deviation, they came out 0.80 of what they
 * measured.) Then the machine gets busier: the running shape follows at once, and a shape not
 * run yet scales with it through the regression. */
static int test_fit_turns(void) {
    struct plan_cost *c = small_cost();
    struct plan_fit *f = NULL;
    ASSERT_TRUE(c != NULL);
    ASSERT_OK(plan_fit_new(c, &f));
    for (int turn = 0; turn < 6; turn++) {
        int dp = turn % 2 ? 1 : 2;
        double t = turn % 2 ? 0.03 : 0.02;
        if (turn >= 2)
            ASSERT_NEAR(plan_fit_step_seconds(f, dp, 2), t, 1e-12, 0);
        for (int k = 0; k < 10; k++)
            ASSERT_OK(plan_fit_observe_step(f, dp, 2, t));
    }
    double before = plan_fit_step_seconds(f, 2, 4);
    for (int k = 0; k < 10; k++)
        ASSERT_OK(plan_fit_observe_step(f, 1, 2, 0.06));
    ASSERT_NEAR(plan_fit_step_seconds(f, 1, 2), 0.06, 1e-4, 0);
    ASSERT_TRUE(plan_fit_step_seconds(f, 2, 4) > 1.5 * before);
    plan_fit_free(f);
    plan_cost_free(c);
    return 0;
}

/* The step spread: 0 while every shape runs at a constant step time (turns included), the
 * mean error of the moving average when one shape's steps alternate 5% above and below; and
 * the margins it raises: a change must gain at least the spread, never less than the
 * planner's own margin or one the caller set. */
static int test_fit_spread(void) {
    struct plan_cost *c = small_cost();
    struct plan_fit *f = NULL;
    ASSERT_TRUE(c != NULL);
    ASSERT_OK(plan_fit_new(c, &f));
    ASSERT_NEAR(plan_fit_step_spread(f), 0, 0, 0);
    for (int turn = 0; turn < 4; turn++)
        for (int k = 0; k < 5; k++)
            ASSERT_OK(plan_fit_observe_step(f, turn % 2 ? 1 : 2, 2, turn % 2 ? 0.03 : 0.02));
    ASSERT_NEAR(plan_fit_step_spread(f), 0, 1e-12, 0);
    struct plan_options o;
    plan_options_init(&o);
    plan_fit_margins(f, &o);
    ASSERT_NEAR(o.hysteresis, 0.003, 1e-12, 0); /* the prior's costs: PLAN_MARGIN_RESTART */
    ASSERT_NEAR(o.defer, 0.003, 1e-12, 0);
    for (int k = 0; k < 60; k++)
        ASSERT_OK(plan_fit_observe_step(f, 2, 2, k % 2 ? 0.02 * 1.05 : 0.02 / 1.05));
    /* the average settles a third of the way from each step to the other: |error| = 4/3 x
     * log 1.05 */
    double want = expm1(4.0 / 3 * log(1.05));
    ASSERT_NEAR(plan_fit_step_spread(f), want, 0, 0.02);
    plan_options_init(&o);
    plan_fit_margins(f, &o);
    ASSERT_NEAR(o.hysteresis, plan_fit_step_spread(f), 1e-12, 0);
    ASSERT_NEAR(o.defer, plan_fit_step_spread(f), 1e-12, 0);
    o.hysteresis = 0.5;
    plan_fit_margins(f, &o);
    ASSERT_NEAR(o.hysteresis, 0.5, 0, 0);
    ASSERT_NEAR(plan_fit_step_spread(NULL), 0, 0, 0);
    plan_fit_free(f);
    plan_cost_free(c);
    return 0;
}

/* The fit's stall of a move as the planner charges it: the weights stall, the moments only for
 * what outlasts the new shape's predicted step (1.6 s for 1x2 in the prior), all of it with
 * meas_at_boundary; and an observed stall leaves as the fixed part what that charge does not
 * explain. */
static int test_fit_move(void) {
    struct plan_cost *c = small_cost();
    struct plan_fit *f = NULL, *fb = NULL;
    ASSERT_TRUE(c != NULL);
    ASSERT_OK(plan_fit_new(c, &f));
    c->meas_at_boundary = true;
    ASSERT_OK(plan_fit_new(c, &fb));
    double link = 1048576 / 1.4e-3; /* the prior's p2p rate, bytes/s */
    double base = plan_fit_stall_seconds(f, PLAN_RECONF_PIPELINE, 0);
    ASSERT_TRUE(base > 0);
    struct plan_fit_move hidden = {0.5 * link, 1.0 * link, 1, 2};
    struct plan_fit_move outlasts = {0, 2.0 * link, 1, 2};
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_PIPELINE, &hidden), base + 0.5, 1e-9, 0);
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_PIPELINE, &outlasts), base + 0.4, 1e-9,
                0);
    ASSERT_NEAR(plan_fit_stall_seconds_move(fb, PLAN_RECONF_PIPELINE, &hidden), base + 1.5, 1e-9,
                0);
    /* all bytes in the stall: the older call */
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_PIPELINE, 1.5 * link), base + 1.5, 1e-9, 0);
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_PIPELINE, &hidden, 0.75));
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_PIPELINE, &hidden), 0.75, 1e-9, 0);
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_PIPELINE, &outlasts), 0.65, 1e-9, 0);
    /* a stall shorter than the charge leaves no fixed part */
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_INTRA_STAGE, &hidden, 0.1));
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_INTRA_STAGE, &hidden), 0.5, 1e-9, 0);
    struct plan_fit_move bad = {-1, 0, 1, 2}, nan = {0, NAN, 1, 2};
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_PIPELINE, &bad), -1, 0, 0);
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_PIPELINE, NULL), -1, 0, 0);
    ASSERT_ERR(plan_fit_observe_move(f, PLAN_RECONF_PIPELINE, &nan, 0.1), -EINVAL);
    ASSERT_ERR(plan_fit_observe_move(f, PLAN_RECONF_NLIVE, &hidden, 0.1), -EINVAL);
    ASSERT_ERR(plan_fit_observe_move(f, PLAN_RECONF_PIPELINE, &hidden, -1), -EINVAL);
    plan_fit_free(f);
    plan_fit_free(fb);
    plan_cost_free(c);
    return 0;
}

/* A cost file of 10 Gb/s giving every kind the same figures. */
static struct plan_measured_costs uniform_costs(double fixed_s, double bytes_per_s, int samples) {
    struct plan_measured_costs m;
    memset(&m, 0, sizeof(m));
    m.link_gbps = 10;
    for (int k = 0; k < PLAN_RECONF_NLIVE; k++) {
        m.fixed_s[k] = fixed_s;
        m.bytes_per_s[k] = bytes_per_s;
        m.samples[k] = samples;
    }
    return m;
}

/* A kind's fixed part is the mean of its window, its cost file's figure counted as the
 * migrations behind it (at most 4), leaving out what is more than 8x the median; a file's
 * stand-in (samples 0) lasts until the job measured anything. */
static int test_fit_mean(void) {
    struct plan_cost *c = small_cost();
    struct plan_fit *f = NULL;
    ASSERT_TRUE(c != NULL);
    ASSERT_OK(plan_fit_new(c, &f));
    /* skewed stalls: the mean, not the median (0.1), is what a move costs on average */
    double st[] = {0.1, 0.1, 0.4};
    for (size_t i = 0; i < ST_ARRAY_SIZE(st); i++)
        ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTRA_STAGE, 0, st[i]));
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTRA_STAGE, 0), 0.2, 1e-12, 0);
    /* 2.0 is 8x the median of {0.1, 0.1, 0.4, 2.0} (0.25), no more: it counts */
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTRA_STAGE, 0, 2.0));
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTRA_STAGE, 0), 2.6 / 4, 1e-12, 0);
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTRA_STAGE, 0, 0.1));
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTRA_STAGE, 0, 0.1));
    /* {0.1 x4, 0.4, 2.0}: median 0.1, 2.0 left out */
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTRA_STAGE, 0), 0.8 / 5, 1e-12, 0);
    plan_fit_free(f);

    /* a file's figure counts as its samples, at most 4; samples 0 is a stand-in */
    struct plan_measured_costs m = uniform_costs(0.2, 1e9, 0), out;
    snprintf(m.machine, sizeof(m.machine), "box");
    m.raw_bytes_per_s[PLAN_RECONF_PIPELINE] = 2e9;
    m.samples[PLAN_RECONF_INTRA_STAGE] = 10;
    m.samples[PLAN_RECONF_INTER_STAGE] = 1;
    m.samples[PLAN_RECONF_PIPELINE] = 2;
    m.fixed_s[PLAN_RECONF_DP_RESHARDING] = 0.5; /* samples 0 */
    ASSERT_OK(plan_fit_new(c, &f));
    ASSERT_OK(plan_fit_start_costs(f, &m));
    ASSERT_ERR(plan_fit_costs(f, &out), -ENODATA); /* this job measured nothing yet */
    ASSERT_ERR(plan_fit_costs(NULL, &out), -EINVAL);
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_DP_RESHARDING, 0), 0.5, 1e-12, 0);
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTRA_STAGE, 0, 0.1));
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_INTER_STAGE, 0, 0.1));
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTRA_STAGE, 0), 0.9 / 5, 1e-12, 0);
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_INTER_STAGE, 0), 0.15, 1e-12, 0);
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_PIPELINE, 0), 0.2, 1e-12, 0);
    /* the stand-in gave way to what this job measured: no move changed dp, so a dp change
     * adds nothing known */
    ASSERT_NEAR(plan_fit_stall_seconds(f, PLAN_RECONF_DP_RESHARDING, 0), 0, 1e-12, 0);

    /* handed back as a cost file: the figures charged now, the migrations behind them, the
     * file's throughput, link and machine; and read back as they were written */
    ASSERT_OK(plan_fit_costs(f, &out));
    ASSERT_STREQ(out.machine, "box");
    ASSERT_NEAR(out.link_gbps, 10, 0, 0);
    for (int k = 0; k < PLAN_RECONF_NLIVE; k++) {
        ASSERT_NEAR(out.fixed_s[k], plan_fit_stall_seconds(f, (enum plan_reconf)k, 0), 1e-15, 0);
        ASSERT_NEAR(out.bytes_per_s[k], 1e9, 0, 0);
    }
    ASSERT_NEAR(out.raw_bytes_per_s[PLAN_RECONF_PIPELINE], 2e9, 0, 0);
    ASSERT_EQ(out.samples[PLAN_RECONF_INTRA_STAGE], 11);
    ASSERT_EQ(out.samples[PLAN_RECONF_INTER_STAGE], 2);
    ASSERT_EQ(out.samples[PLAN_RECONF_PIPELINE], 2);
    ASSERT_EQ(out.samples[PLAN_RECONF_DP_RESHARDING], 0);
    char *text = NULL;
    struct plan_measured_costs back;
    struct st_error e;
    ASSERT_OK(plan_measured_costs_format(&out, "a test", &text));
    ASSERT_CONTAINS(text, "\"source\": \"a test\"");
    ASSERT_OK(parse(text, &back, &e));
    st_free(text);
    ASSERT_STREQ(back.machine, "box");
    ASSERT_NEAR(back.link_gbps, 10, 0, 0);
    for (int k = 0; k < PLAN_RECONF_NLIVE; k++) {
        ASSERT_NEAR(back.fixed_s[k], out.fixed_s[k], 0, 0); /* 17 digits: exact */
        ASSERT_NEAR(back.bytes_per_s[k], out.bytes_per_s[k], 0, 0);
        ASSERT_NEAR(back.raw_bytes_per_s[k], out.raw_bytes_per_s[k], 0, 0);
        ASSERT_EQ(back.samples[k], out.samples[k]);
    }
    /* what the parser would refuse is not written */
    out.fixed_s[PLAN_RECONF_PIPELINE] = NAN;
    ASSERT_ERR(plan_measured_costs_format(&out, NULL, &text), -EINVAL);
    out.fixed_s[PLAN_RECONF_PIPELINE] = 0;
    out.samples[PLAN_RECONF_PIPELINE] = -1;
    ASSERT_ERR(plan_measured_costs_format(&out, NULL, &text), -EINVAL);
    out.samples[PLAN_RECONF_PIPELINE] = 0;
    out.link_gbps = 0;
    ASSERT_ERR(plan_measured_costs_format(&out, NULL, &text), -EINVAL);
    plan_fit_free(f);

    /* without a file: the prior's link, and this machine to be named by the caller */
    ASSERT_OK(plan_fit_new(c, &f));
    ASSERT_OK(plan_fit_observe_migration(f, PLAN_RECONF_PIPELINE, 0, 0.3));
    ASSERT_OK(plan_fit_costs(f, &out));
    ASSERT_STREQ(out.machine, "");
    ASSERT_NEAR(out.link_gbps, 1048576 / 1.4e-3 * 8 / 1e9, 0, 1e-9);
    ASSERT_NEAR(out.fixed_s[PLAN_RECONF_INTRA_STAGE], 0.3, 1e-12, 0);
    ASSERT_EQ(out.samples[PLAN_RECONF_PIPELINE], 1);
    ASSERT_EQ(out.samples[PLAN_RECONF_INTRA_STAGE], 0);
    plan_fit_free(f);
    plan_cost_free(c);
    return 0;
}

/* A move that changes dp is observed under its base kind and teaches what the change adds: its
 * stall beyond the kind's fixed part (from the kind's moves that kept dp), as the planner
 * charges it (kind + dp-resharding) and as `scripts/bench migration` writes it. A kind whose
 * every move changed dp is charged what its moves stalled, whole. */
static int test_fit_dp(void) {
    struct plan_cost *c = small_cost();
    struct plan_fit *f = NULL;
    struct plan_measured_costs out;
    struct plan_fit_move keep = {0, 0, 1, 2, false}, change = {0, 0, 1, 2, true};
    ASSERT_TRUE(c != NULL);
    ASSERT_OK(plan_fit_new(c, &f));
    ASSERT_ERR(plan_fit_observe_move(f, PLAN_RECONF_DP_RESHARDING, &change, 0.1), -EINVAL);
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_PIPELINE, &keep, 0.1));
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_PIPELINE, &change), 0.1, 1e-12, 0);
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_PIPELINE, &keep, 0.1));
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_PIPELINE, &change, 0.3));
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_PIPELINE, &change, 0.25));
    /* the kind from its moves that kept dp; a change adds the mean of 0.2 and 0.15 */
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_PIPELINE, &keep), 0.1, 1e-12, 0);
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_DP_RESHARDING, &change), 0.175,
                1e-12, 0);
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_PIPELINE, &change), 0.275, 1e-12, 0);
    /* a kind whose every move changed dp cannot tell its part from dp's: its moves (0.2,
     * 0.4) are charged whole, as its part less dp's (learnt from the pipeline alone) plus
     * dp's */
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_INTRA_STAGE, &change, 0.2));
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_INTRA_STAGE, &change, 0.4));
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_DP_RESHARDING, &change), 0.175,
                1e-12, 0);
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_INTRA_STAGE, &change), 0.3, 1e-12,
                0);
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_INTRA_STAGE, &keep), 0.125, 1e-12,
                0);
    ASSERT_OK(plan_fit_costs(f, &out));
    ASSERT_EQ(out.samples[PLAN_RECONF_DP_RESHARDING], 4);
    ASSERT_EQ(out.samples[PLAN_RECONF_PIPELINE], 4);
    ASSERT_EQ(out.samples[PLAN_RECONF_INTRA_STAGE], 2);
    ASSERT_NEAR(out.fixed_s[PLAN_RECONF_DP_RESHARDING], 0.175, 1e-12, 0);
    ASSERT_NEAR(out.fixed_s[PLAN_RECONF_INTRA_STAGE], 0.125, 1e-12, 0);
    /* a kind not measured: the mean of the kinds' parts (0.1 and 0.125) */
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_INTER_STAGE, &keep), 0.1125, 1e-12,
                0);
    plan_fit_free(f);
    /* such a kind's moves below dp's part: its own part is 0, not less */
    ASSERT_OK(plan_fit_new(c, &f));
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_PIPELINE, &keep, 0.1));
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_PIPELINE, &change, 0.3));
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_INTRA_STAGE, &change, 0.05));
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_INTRA_STAGE, &keep), 0, 0, 0);
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_INTRA_STAGE, &change), 0.2, 1e-12,
                0);
    plan_fit_free(f);
    /* a dp change faster than its kind adds nothing (not less than nothing); one an order of
     * magnitude above its kind's moves is left out */
    ASSERT_OK(plan_fit_new(c, &f));
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_PIPELINE, &keep, 0.5));
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_PIPELINE, &change, 0.1));
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_DP_RESHARDING, &change), 0, 0, 0);
    plan_fit_free(f);
    ASSERT_OK(plan_fit_new(c, &f));
    for (int i = 0; i < 3; i++)
        ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_PIPELINE, &keep, 0.1));
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_PIPELINE, &change, 0.15));
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_PIPELINE, &change, 5.0));
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_DP_RESHARDING, &change), 0.05, 1e-12,
                0);
    plan_fit_free(f);
    /* started from a file, a kind whose every move changes dp still learns from them (its
     * figure would otherwise stay the file's job after job, and dp-resharding take up what
     * every such kind measured) */
    struct plan_measured_costs m = uniform_costs(0.2, 1e12, 4);
    m.fixed_s[PLAN_RECONF_DP_RESHARDING] = 0;
    ASSERT_OK(plan_fit_new(c, &f));
    ASSERT_OK(plan_fit_start_costs(f, &m));
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_INTRA_STAGE, &change, 0.1));
    ASSERT_OK(plan_fit_observe_move(f, PLAN_RECONF_INTRA_STAGE, &change, 0.1));
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_INTRA_STAGE, &keep), 1.0 / 6, 1e-9,
                0);
    /* no kind kept dp: dp's part stays the file's (4 x 0), and the kind's moves count beside
     * the file's 4 x (0.2 + 0) */
    ASSERT_NEAR(plan_fit_stall_seconds_move(f, PLAN_RECONF_DP_RESHARDING, &change), 0, 0, 0);
    plan_fit_free(f);
    plan_cost_free(c);
    return 0;
}

TEST_MAIN(TEST(test_parse), TEST(test_parse_errors), TEST(test_charging),
          TEST(test_trace_fraction), TEST(test_fit), TEST(test_fit_turns), TEST(test_fit_spread),
          TEST(test_fit_move), TEST(test_fit_start_costs), TEST(test_fit_mean), TEST(test_fit_dp),
          TEST(test_margins))
