/* test-forecast.c: predictors and their evaluation. */
#include <string.h>

#include "helpers.h"
#include "test.h"

static int test_last_and_names(void) {
    int h[] = {5, 6, 7}, f[4];
    ASSERT_OK(plan_forecast(PLAN_PRED_LAST, h, 3, 4, 0, 32, 1, f));
    for (int k = 0; k < 4; k++)
        ASSERT_EQ(f[k], 7);
    enum plan_predictor p;
    ASSERT_OK(plan_predictor_parse("arima", &p));
    ASSERT_EQ(p, PLAN_PRED_ARIMA);
    ASSERT_ERR(plan_predictor_parse("prophet", &p), -EINVAL);
    ASSERT_ERR(plan_forecast(PLAN_PRED_LAST, h, 0, 4, 0, 32, 1, f), -EINVAL);
    ASSERT_ERR(plan_forecast(PLAN_PRED_LAST, h, 3, 0, 0, 32, 1, f), -EINVAL);
    return 0;
}

static int test_arima(void) {
    int flat[20], f[12];
    for (int i = 0; i < 20; i++)
        flat[i] = 20;
    ASSERT_OK(plan_forecast(PLAN_PRED_ARIMA, flat, 20, 12, 8, 32, 1, f));
    for (int k = 0; k < 12; k++)
        ASSERT_EQ(f[k], 20);
    /* a steady climb: ARIMA extrapolates, Parcae's bounds cap it at first + 3 and at 32,
     * and its in-penalty (climb >= 10 -> 0.5) halves the step */
    int up[20];
    for (int i = 0; i < 20; i++)
        up[i] = 10 + i;
    ASSERT_OK(plan_forecast(PLAN_PRED_ARIMA, up, 20, 12, 8, 32, 1, f));
    ASSERT_GT(f[0], 29);
    for (int k = 1; k < 12; k++) {
        ASSERT_GE(f[k], f[k - 1]);
        ASSERT_LE(f[k], 32);
    }
    /* too little history: flat */
    ASSERT_OK(plan_forecast(PLAN_PRED_ARIMA, up, 5, 12, 8, 32, 1, f));
    ASSERT_EQ(f[11], up[4]);
    return 0;
}

static int test_eval_on_trace(void) {
    struct plan_trace *t = tp_trace("traces/per-model/gpt-1.5b_p3_gbs128_mbs1.jsonl");
    ASSERT_TRUE(t != NULL);
    int n = t->nintervals, counts[1024], outs[1024];
    for (int i = 0; i < n; i++) {
        counts[i] = plan_trace_n_after(t, i);
        outs[i] = t->iv[i].n_out;
    }
    double last[12], ar[12], dm[12], nt[12];
    ASSERT_GT(plan_forecast_eval(PLAN_PRED_LAST, counts, outs, n, 12, 0, 32, 120, last), 600);
    ASSERT_OK(plan_forecast_eval(PLAN_PRED_ARIMA, counts, outs, n, 12, 0, 32, 120, ar));
    ASSERT_OK(plan_forecast_eval(PLAN_PRED_DAMPED, counts, outs, n, 12, 0, 32, 120, dm));
    ASSERT_OK(plan_forecast_eval(PLAN_PRED_NOTICE, counts, outs, n, 12, 0, 32, 120, nt));
    /* errors grow with the horizon; notices halve the error of the next two minutes and
     * keep every later horizon below last value; ARIMA trails last value on this trace */
    ASSERT_TRUE(last[11] > last[0]);
    ASSERT_TRUE(nt[0] < 0.6 * last[0]);
    ASSERT_TRUE(nt[1] < 0.6 * last[1]);
    for (int k = 0; k < 12; k++)
        ASSERT_TRUE(nt[k] <= last[k]);
    ASSERT_TRUE(ar[0] > last[0]);
    ASSERT_TRUE(dm[11] < 2 * last[11]);
    plan_trace_free(t);
    return 0;
}

TEST_MAIN(TEST(test_last_and_names), TEST(test_arima), TEST(test_eval_on_trace))
