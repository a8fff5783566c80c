/* test-situation.c: plan_situation_parse(), the situation file of `spottrain plan`.
 *
 * The CLI's behaviour on the same files is tested end to end in tests/integration/plan; here
 * the parser's own contract: what a valid file fills in, the exact field (or line and column)
 * of the first error, that a target makes the cost irrelevant, and that every allocation
 * failure returns -ENOMEM without leaking. */
#include <errno.h>
#include <string.h>

#include "common.h"
#include "planner.h"
#include "test.h"

/* Eight layers in two stages, two replicas; w3 lost, w1 noticed, n0 new. */
static const char *const SIT =
    "{\"model\": {\"layer_params\": [10, 20, 30, 40, 50, 60, 70, 80]},\n"
    " \"shape\": {\"dp\": 2, \"pp\": 2},\n"
    " \"workers\": [{\"id\": \"w0\", \"stage\": 0, \"replica\": 0},\n"
    "             {\"id\": \"w1\", \"stage\": 0, \"replica\": 1},\n"
    "             {\"id\": \"w2\", \"stage\": 1, \"replica\": 0},\n"
    "             {\"id\": \"w3\", \"stage\": 1, \"replica\": 1},\n"
    "             {\"id\": \"spare\"}],\n"
    " \"survivors\": [\"w0\", \"w1\", \"w2\", \"spare\"],\n"
    " \"new_workers\": [\"n0\"],\n"
    " \"notices\": [{\"id\": \"w1\", \"seconds\": 30.5}],\n"
    " \"history\": [5, 5, 4], \"forecast\": [4, 4],\n"
    " \"cost\": {\"profile\": \"p.json\", \"model\": \"m\"},\n"
    " \"options\": {\"lookahead\": 6, \"predictor\": \"arima\"}}\n";

static int test_valid(void) {
    struct plan_situation_file s;
    struct st_error e;
    ASSERT_OK(plan_situation_parse("sit.json", SIT, strlen(SIT), &s, &e));
    ASSERT_EQ(s.nlayers, 8);
    ASSERT_EQ(s.np[7], 80);
    ASSERT_FALSE(s.gpt);
    ASSERT_EQ(s.old_layout.dp, 2);
    ASSERT_EQ(s.old_layout.pp, 2);
    ASSERT_FALSE(s.have_target);
    ASSERT_EQ(s.nold, 5);
    ASSERT_EQ(s.nw, 6);
    ASSERT_STREQ(s.w[3].id, "w3");
    ASSERT_FALSE(s.w[3].alive);
    ASSERT_TRUE(s.w[1].leaving);
    ASSERT_NEAR(s.notice_s[1], 30.5, 0, 0);
    ASSERT_NEAR(s.notice_s[0], -1, 0, 0);
    ASSERT_EQ(s.w[4].stage, -1);
    ASSERT_STREQ(s.w[5].id, "n0");
    ASSERT_EQ(s.w[5].stage, -1);
    ASSERT_TRUE(s.w[5].alive);
    ASSERT_EQ(s.nhist, 3);
    ASSERT_EQ(s.hist[2], 4);
    ASSERT_EQ(s.nforecast, 2);
    ASSERT_EQ(s.lookahead, 6);
    ASSERT_EQ(s.predictor, PLAN_PRED_ARIMA);
    ASSERT_EQ(s.cost_kind, PLAN_SIT_COST_PROFILE);
    ASSERT_STREQ(s.cost_profile, "p.json");
    ASSERT_STREQ(s.cost_model, "m");
    plan_situation_file_done(&s);
    ASSERT_TRUE(s.np == NULL && s.w == NULL && s.cost_profile == NULL);
    plan_situation_file_done(NULL);
    return 0;
}

/* Parses text and expects -EINVAL naming `field` (and line/column when line > 0). */
static int expect_error(const char *text, const char *field, int line, int column) {
    struct plan_situation_file s;
    memset(&s, 0x5a, sizeof(s));
    struct st_error e;
    memset(&e, 0, sizeof(e));
    ASSERT_ERR(plan_situation_parse("bad.json", text, strlen(text), &s, &e), -EINVAL);
    ASSERT_STREQ(e.file, "bad.json");
    ASSERT_STREQ(e.field, field);
    ASSERT_EQ(e.line, line);
    ASSERT_EQ(e.column, column);
    ASSERT_TRUE(e.message[0] != '\0');
    ASSERT_EQ(s.nlayers, 0x5a5a5a5a); /* untouched on failure */
    return 0;
}

static int test_errors(void) {
    const char *head = "{\"model\": {\"layer_params\": [1, 2]}, \"shape\": {\"dp\": 1, \"pp\": 2},"
                       " \"workers\": [{\"id\": \"a\", \"stage\": 0, \"replica\": 0}]";
    char buf[1024];
    ASSERT_EQ(expect_error("{\"model\": ", "", 1, 10), 0);
    ASSERT_EQ(expect_error("[1]", "(top level)", 0, 0), 0);
    ASSERT_EQ(expect_error("{}", "model", 0, 0), 0);
    snprintf(buf, sizeof(buf), "%s}", head);
    ASSERT_EQ(expect_error(buf, "target", 0, 0), 0);
    snprintf(buf, sizeof(buf), "%s, \"target\": {\"dp\": 1, \"pp\": 3}}", head);
    ASSERT_EQ(expect_error(buf, "target.pp", 0, 0), 0);
    snprintf(buf, sizeof(buf), "%s, \"survivors\": [\"b\"], \"cost\": 1}", head);
    ASSERT_EQ(expect_error(buf, "survivors", 0, 0), 0);
    snprintf(buf, sizeof(buf), "%s, \"cost\": 1}", head);
    ASSERT_EQ(expect_error(buf, "cost", 0, 0), 0);
    snprintf(buf, sizeof(buf), "%s, \"cost\": {\"analytic\": {}}}", head);
    ASSERT_EQ(expect_error(buf, "cost.analytic", 0, 0), 0);
    snprintf(buf, sizeof(buf), "%s, \"cost\": {\"profile\": \"p\", \"model\": 3}}", head);
    ASSERT_EQ(expect_error(buf, "cost.model", 0, 0), 0);
    ASSERT_EQ(expect_error("{\"model\": {\"gpt\": {\"layers\": 2, \"hidden\": 8, \"heads\": 2, "
                           "\"vocab\": 16, \"seq_len\": 4}}, \"shape\": {\"dp\": 1, \"pp\": 1}, "
                           "\"workers\": [], \"cost\": {\"analytic\": {\"micro_batch\": 1, "
                           "\"global_batch\": 4, \"gpu_tflops\": 1, \"gpu_mem_gib\": 0}}}",
                           "cost.analytic.gpu_mem_gib", 0, 0),
              0);
    /* With a target the cost is never used, so a malformed one is no error (as before the
     * parser left the CLI). */
    struct plan_situation_file s;
    snprintf(buf, sizeof(buf), "%s, \"target\": {\"dp\": 1, \"pp\": 1}, \"cost\": 7}", head);
    ASSERT_OK(plan_situation_parse("t.json", buf, strlen(buf), &s, NULL));
    ASSERT_EQ(s.cost_kind, PLAN_SIT_COST_NONE);
    ASSERT_TRUE(s.have_target);
    ASSERT_EQ(s.new_layout.pp, 1);
    plan_situation_file_done(&s);
    ASSERT_ERR(plan_situation_parse("t.json", NULL, 3, &s, NULL), -EINVAL);
    return 0;
}

static int test_analytic(void) {
    const char *t = "{\"model\": {\"gpt\": {\"layers\": 2, \"hidden\": 8, \"heads\": 2, "
                    "\"vocab\": 16, \"seq_len\": 4}}, \"shape\": {\"dp\": 1, \"pp\": 1}, "
                    "\"workers\": [{\"id\": \"a\", \"stage\": 0, \"replica\": 0}], "
                    "\"new_workers\": [\"b\", \"c\"], \"cost\": {\"analytic\": {\"micro_batch\": 2, "
                    "\"global_batch\": 8, \"gpu_tflops\": 10, \"gpu_mem_gib\": 16, "
                    "\"net_gbps\": 25}}}";
    struct plan_situation_file s;
    ASSERT_OK(plan_situation_parse("a.json", t, strlen(t), &s, NULL));
    ASSERT_TRUE(s.gpt);
    ASSERT_EQ(s.nlayers, 4);
    ASSERT_EQ(s.ntied, 1);
    ASSERT_EQ(s.cost_kind, PLAN_SIT_COST_ANALYTIC);
    ASSERT_EQ(s.cost_analytic.layers, 2);
    ASSERT_EQ(s.cost_analytic.micro_batch, 2);
    ASSERT_EQ(s.cost_analytic.global_batch, 8);
    ASSERT_NEAR(s.cost_analytic.net_gbps, 25, 0, 0);
    ASSERT_EQ(s.cost_analytic.max_n, 3);
    ASSERT_TRUE(s.cost_profile == NULL);
    plan_situation_file_done(&s);
    return 0;
}

/* Every allocation the parser makes (layers, workers, notices, history, forecast, profile
 * and model names) fails in turn: each must give -ENOMEM and free what it took (ASan). */
static int test_alloc_failure(void) {
    for (long n = 1; n < 64; n++) {
        struct plan_situation_file s;
        st_alloc_fail_after(n);
        int r = plan_situation_parse("sit.json", SIT, strlen(SIT), &s, NULL);
        st_alloc_fail_after(0);
        if (r == 0) {
            ASSERT_EQ(n, 8); /* np, w, notice_s, forecast, hist, profile, model: 7 to fail */
            ASSERT_EQ(s.nw, 6);
            plan_situation_file_done(&s);
            return 0;
        }
        ASSERT_ERR(r, -ENOMEM);
    }
    TEST_FAIL_("never succeeded");
}

TEST_MAIN(TEST(test_valid), TEST(test_errors), TEST(test_analytic), TEST(test_alloc_failure))
