/* test-liveput.c: the liveput DP against brute-force enumeration, notices, hysteresis and
 * bad situations. */
#include <math.h>
#include <string.h>

#include "helpers.h"
#include "test.h"

struct bf {
    const struct plan_cost *c;
    struct plan_shape cand[256];
    int K, L;
    int path[16], nin[16], nout[16];
    struct plan_situation *s;
};

static double gain(const struct bf *b, int t, struct plan_shape from, struct plan_shape to) {
    double ms;
    if (t == 0)
        ms = (from.dp == to.dp && from.pp == to.pp && b->s->n_out == 0)
                 ? 0
                 : plan_cost_transition_estimate_ms(b->c, b->s->n_before, from.dp, from.pp,
                                                    b->s->n_in, b->s->n_out, to.dp, to.pp, NULL);
    else
        ms = (from.dp == to.dp && from.pp == to.pp && b->nout[t] == 0)
                 ? 0
                 : plan_cost_transition_estimate_ms(b->c, b->path[t - 1], from.dp, from.pp,
                                                    b->nin[t], b->nout[t], to.dp, to.pp, NULL);
    return plan_cost_throughput(b->c, to.dp, to.pp) * fmax(0.0, 60 - ms / 1000);
}

static double brute(const struct bf *b, int t, struct plan_shape prev) {
    if (t == b->L)
        return 0;
    double best = -INFINITY;
    for (int k = 0; k < b->K; k++) {
        struct plan_shape s = b->cand[k];
        if (s.dp * s.pp > b->path[t])
            continue;
        double v = gain(b, t, prev, s) + brute(b, t + 1, s);
        if (v > best)
            best = v;
    }
    return best;
}

static int test_dp_equals_brute_force(void) {
    struct plan_cost *c = tp_cost("bert_gbs1024_mbs8");
    ASSERT_TRUE(c != NULL);
    uint64_t st = 42;
    for (int rep = 0; rep < 300; rep++) {
        struct bf b = {.c = c};
        b.L = 2 + rep % 3;
        int N[16];
        for (int t = 0; t <= b.L; t++) {
            st = st * 6364136223846793005ULL + 1442695040888963407ULL;
            N[t] = 2 + (int)((st >> 33) % 9); /* 2..10 */
        }
        int nmax = 0;
        for (int t = 1; t <= b.L; t++)
            nmax = ST_MAX(nmax, N[t]);
        /* N[0] = before this interval; N[1..L] = after each interval */
        struct plan_situation s = {0};
        s.n_before = N[0];
        s.n_out = N[1] < N[0] ? N[0] - N[1] : 0;
        s.n_in = N[1] > N[0] ? N[1] - N[0] : 0;
        int hist[2] = {N[0], N[1]};
        s.hist = hist;
        s.nhist = 2;
        s.future = N + 2;
        s.nfuture = b.L - 1;
        /* current shape: a random allowed one that fit before */
        int pick = (int)((st >> 20) % 16), seen = 0;
        for (int i = 0; i < c->nshapes; i++) {
            struct plan_shape x = c->shapes[i];
            if (x.dp * x.pp <= N[0] && plan_cost_shape_allowed(c, x.dp, x.pp))
                if (seen++ == pick % 6 || s.cur.dp == 0)
                    s.cur = x;
        }
        b.s = &s;
        for (int t = 0; t < b.L; t++)
            b.path[t] = N[t + 1];
        b.nin[0] = s.n_in;
        b.nout[0] = s.n_out;
        for (int t = 1; t < b.L; t++) {
            int d = b.path[t] - b.path[t - 1];
            b.nout[t] = d < 0 ? -d : 0;
            b.nin[t] = d > 0 ? d : 0;
        }
        for (int i = 0; i < c->nshapes; i++) {
            struct plan_shape x = c->shapes[i];
            if (x.dp * x.pp <= nmax && plan_cost_shape_allowed(c, x.dp, x.pp))
                b.cand[b.K++] = x;
        }
        bool cur_in = false;
        for (int k = 0; k < b.K; k++)
            cur_in |= b.cand[k].dp == s.cur.dp && b.cand[k].pp == s.cur.pp;
        if (!cur_in && s.cur.dp > 0)
            b.cand[b.K++] = s.cur;
        struct plan_options o;
        plan_options_init(&o);
        o.lookahead = b.L;
        o.hysteresis = 0;
        o.defer = 0;
        struct plan_decision d;
        ASSERT_OK(plan_decide(c, &s, &o, &d));
        double want = brute(&b, 0, s.cur);
        if (fabs(d.expected_samples - want) > 1e-6 * fmax(1, want))
            TEST_FAIL_("case %d (L=%d, N0=%d): DP %.6f vs brute force %.6f", rep, b.L, N[0],
                       d.expected_samples, want);
        /* the chosen first step is one that reaches the optimum */
        double first = gain(&b, 0, s.cur, d.shape) + brute(&b, 1, d.shape);
        ASSERT_NEAR(first, want, 1e-6 * fmax(1, want), 0);
    }
    plan_cost_free(c);
    return 0;
}

static int test_notice_and_hysteresis(void) {
    struct plan_cost *c = tp_cost("gpt-1.5b_gbs128_mbs1");
    ASSERT_TRUE(c != NULL);
    int hist[30];
    for (int i = 0; i < 30; i++)
        hist[i] = 32;
    struct plan_situation s = {.cur = {4, 8}, .n_before = 32, .hist = hist, .nhist = 30};
    struct plan_options o;
    plan_options_init(&o);
    struct plan_decision d;
    ASSERT_OK(plan_decide(c, &s, &o, &d));
    ASSERT_EQ(d.shape.dp, 4);
    ASSERT_EQ(d.shape.pp, 8);
    ASSERT_EQ(d.pred_n[5], 32);
    /* eight instances noticed to leave in 60 s: the forecast knows */
    struct plan_notice nt[8];
    for (int i = 0; i < 8; i++)
        nt[i] = (struct plan_notice){i, 60};
    s.notices = nt;
    s.nnotices = 8;
    ASSERT_OK(plan_decide(c, &s, &o, &d));
    ASSERT_EQ(d.pred_n[0], 32);
    ASSERT_EQ(d.pred_n[1], 24);
    ASSERT_EQ(d.pred_n[11], 24);
    ASSERT_TRUE(strlen(d.reason) > 0);
    /* one instance gone now: (4,8) no longer fits; the decision fits 31 */
    s.notices = NULL;
    s.nnotices = 0;
    s.n_out = 1;
    hist[29] = 31;
    ASSERT_OK(plan_decide(c, &s, &o, &d));
    ASSERT_LE(d.shape.dp * d.shape.pp, 31);
    ASSERT_GT(d.shape.dp, 0);
    /* a huge hysteresis keeps the current shape when it still fits */
    s.n_out = 0;
    s.n_in = 1;
    s.n_before = 31;
    s.cur = (struct plan_shape){3, 10};
    hist[29] = 32;
    o.hysteresis = 10;
    ASSERT_OK(plan_decide(c, &s, &o, &d));
    ASSERT_EQ(d.shape.dp, 3);
    ASSERT_EQ(d.shape.pp, 10);
    ASSERT_CONTAINS(d.reason, "keep");
    plan_cost_free(c);
    return 0;
}

static int test_bad_and_idle(void) {
    struct plan_cost *c = tp_cost("gpt-1.5b_gbs128_mbs1");
    ASSERT_TRUE(c != NULL);
    int hist[2] = {4, 4};
    struct plan_situation s = {.n_before = 4, .hist = hist, .nhist = 2};
    struct plan_options o;
    plan_options_init(&o);
    o.on_demand_fallback = true;
    struct plan_decision d;
    /* 4 instances cannot hold gpt-1.5b (pp >= 6): idle, ask for on-demand */
    ASSERT_OK(plan_decide(c, &s, &o, &d));
    ASSERT_EQ(d.shape.dp, 0);
    ASSERT_TRUE(d.need_on_demand);
    s.n_out = 5;
    ASSERT_ERR(plan_decide(c, &s, &o, &d), -EINVAL);
    s.n_out = 0;
    s.nhist = 0;
    ASSERT_ERR(plan_decide(c, &s, &o, &d), -EINVAL);
    ASSERT_ERR(plan_decide(NULL, &s, &o, &d), -EINVAL);
    plan_cost_free(c);
    return 0;
}

/* A 2 % better shape is not put off forever: after defer_max quiet intervals the change is
 * taken; right after a change in the count it may wait. */
static int test_defer_cap(void) {
    struct plan_cost *c = tp_cost("bert_gbs1024_mbs8");
    ASSERT_TRUE(c != NULL);
    int hist[40];
    for (int i = 0; i < 40; i++)
        hist[i] = 32;
    struct plan_situation s = {.cur = {10, 3}, .n_before = 32, .hist = hist, .nhist = 40};
    struct plan_options o;
    plan_options_init(&o);
    struct plan_decision d;
    ASSERT_OK(plan_decide(c, &s, &o, &d));
    ASSERT_EQ(d.shape.dp, 8);
    ASSERT_EQ(d.shape.pp, 4);
    ASSERT_CONTAINS(d.reason, "move");
    /* one instance just joined: deferring is allowed, and staying loses < 0.3 % */
    s.n_before = 31;
    s.n_in = 1;
    hist[38] = 31;
    ASSERT_OK(plan_decide(c, &s, &o, &d));
    ASSERT_EQ(d.shape.dp, 10);
    ASSERT_EQ(d.shape.pp, 3);
    o.defer = 0;
    ASSERT_OK(plan_decide(c, &s, &o, &d));
    ASSERT_EQ(d.shape.pp, 4);
    plan_cost_free(c);
    return 0;
}

/* The stochastic count model: with a history that never changes it is the point forecast
 * (same decision, same value); the oracle ignores it; with a history of frequent losses it
 * values the cost of the losses it expects, so the value it promises is lower. */
static int test_count_model(void) {
    struct plan_cost *c = tp_cost("bert_gbs1024_mbs8");
    ASSERT_TRUE(c != NULL);
    int hist[80];
    for (int i = 0; i < 80; i++)
        hist[i] = 32;
    struct plan_situation s = {.cur = {10, 3}, .n_before = 32, .hist = hist, .nhist = 40};
    struct plan_options o;
    plan_options_init(&o);
    ASSERT_EQ(o.count_window, 0);
    struct plan_decision d0, d1;
    ASSERT_OK(plan_decide(c, &s, &o, &d0));
    o.count_window = 720;
    ASSERT_OK(plan_decide(c, &s, &o, &d1));
    ASSERT_EQ(d1.shape.dp, d0.shape.dp);
    ASSERT_EQ(d1.shape.pp, d0.shape.pp);
    ASSERT_NEAR(d1.expected_samples, d0.expected_samples, 0, 1e-6);
    /* a negative window is no model */
    o.count_window = -5;
    ASSERT_OK(plan_decide(c, &s, &o, &d1));
    ASSERT_NEAR(d1.expected_samples, d0.expected_samples, 0, 1e-6);
    /* frequent losses (one instance every other interval, back the next) */
    for (int i = 0; i < 80; i++)
        hist[i] = i % 2 ? 31 : 32;
    s.nhist = 80;
    s.cur = (struct plan_shape){8, 4};
    o.count_window = 0;
    ASSERT_OK(plan_decide(c, &s, &o, &d0));
    o.count_window = 720;
    ASSERT_OK(plan_decide(c, &s, &o, &d1));
    ASSERT_LE(d1.shape.dp * d1.shape.pp, 32);
    ASSERT_GT(d1.shape.dp, 0);
    ASSERT_TRUE(d1.expected_samples < d0.expected_samples);
    /* the oracle knows the future: the model is not used */
    int fut[11];
    for (int i = 0; i < 11; i++)
        fut[i] = 32;
    s.future = fut;
    s.nfuture = 11;
    o.count_window = 0;
    ASSERT_OK(plan_decide(c, &s, &o, &d0));
    o.count_window = 720;
    ASSERT_OK(plan_decide(c, &s, &o, &d1));
    ASSERT_EQ(d1.shape.dp, d0.shape.dp);
    ASSERT_EQ(d1.shape.pp, d0.shape.pp);
    ASSERT_NEAR(d1.expected_samples, d0.expected_samples, 0, 1e-9);
    plan_cost_free(c);
    return 0;
}

/* plan_options.rules: the planner chooses among the shapes a job can run, not among every
 * shape of the cost model (the loop once ran a substitute for a 3x2 that cannot split its
 * global batch, and the next decision asked for 3x2 again). Both ways of listing candidates:
 * every shape of a small model, the widest dp per depth of a large one. */
static int test_rules(void) {
    struct plan_cost *small = tp_cost("bert_gbs1024_mbs8");
    struct plan_model_desc md = {.layers = 48, .hidden = 256, .seq = 128, .vocab = 1000,
                                 .micro_batch = 1, .global_batch = 64, .gpu_tflops = 10,
                                 .gpu_mem_gib = 80, .net_gbps = 10, .max_n = 64};
    struct plan_cost *large = NULL;
    ASSERT_TRUE(small != NULL);
    ASSERT_OK(plan_cost_analytic(&md, &large));
    ASSERT_TRUE(small->nshapes <= 256);
    ASSERT_TRUE(large->nshapes > 256);
    struct plan_cost *models[2] = {small, large};
    for (int m = 0; m < 2; m++) {
        struct plan_cost *c = models[m];
        int hist[4] = {30, 30, 30, 30};
        struct plan_situation s = {.n_before = 30, .hist = hist, .nhist = 4};
        struct plan_options o;
        plan_options_init(&o);
        struct plan_decision free_d, d;
        ASSERT_OK(plan_decide(c, &s, &o, &free_d));
        /* rules that the free choice breaks: its dp cannot split the global batch (or, for
         * dp = 1, which always can, its depth is over the bound) */
        struct plan_rules r = {.dp_lo = 1, .pp_lo = 1, .global_batch = c->global_batch,
                               .micro_batch = c->micro_batch, .stages_max = c->nlayers,
                               .workers_max = 64};
        ASSERT_TRUE(free_d.shape.dp > 0);
        if (plan_shape_check(&r, free_d.shape.dp, free_d.shape.pp) == PLAN_RULE_OK) {
            if (free_d.shape.dp > 1)
                r.global_batch = c->micro_batch * (free_d.shape.dp + 1);
            else
                r.pp_hi = free_d.shape.pp - 1;
        }
        ASSERT_TRUE(plan_shape_check(&r, free_d.shape.dp, free_d.shape.pp) != PLAN_RULE_OK);
        o.rules = &r;
        ASSERT_OK(plan_decide(c, &s, &o, &d));
        ASSERT_TRUE(d.shape.dp > 0);
        ASSERT_EQ(plan_shape_check(&r, d.shape.dp, d.shape.pp), PLAN_RULE_OK);
        ASSERT_LE(d.shape.dp * d.shape.pp, 30);
        /* and it is the best runnable one by throughput, up to what starting costs */
        double best = 0;
        for (int i = 0; i < c->nshapes; i++) {
            struct plan_shape x = c->shapes[i];
            if (x.dp * x.pp <= 30 && plan_cost_shape_allowed(c, x.dp, x.pp) &&
                plan_shape_check(&r, x.dp, x.pp) == PLAN_RULE_OK)
                best = fmax(best, plan_cost_throughput(c, x.dp, x.pp));
        }
        ASSERT_TRUE(plan_cost_throughput(c, d.shape.dp, d.shape.pp) >= 0.95 * best);
        if (c == large) {
            /* depth pinned at 10: the widest dp on 30 instances, 3, cannot split 64; the
             * candidates must reach down to 2 */
            struct plan_rules p10 = r;
            p10.global_batch = 64;
            p10.pp_lo = p10.pp_hi = 10;
            o.rules = &p10;
            ASSERT_OK(plan_decide(c, &s, &o, &d));
            ASSERT_EQ(d.shape.dp, 2);
            ASSERT_EQ(d.shape.pp, 10);
            o.rules = &r;
        }
        /* rules no shape passes: idle */
        r.pp_lo = r.pp_hi = c->nlayers + 1;
        ASSERT_OK(plan_decide(c, &s, &o, &d));
        ASSERT_EQ(d.shape.dp, 0);
    }
    plan_cost_free(small);
    plan_cost_free(large);
    return 0;
}

TEST_MAIN(TEST(test_dp_equals_brute_force), TEST(test_notice_and_hysteresis),
          TEST(test_bad_and_idle), TEST(test_defer_cap), TEST(test_count_model),
          TEST(test_rules))
