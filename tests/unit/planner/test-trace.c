/* test-trace.c: trace formats, interval bucketing and bad input with line numbers. */
#include <string.h>

#include "helpers.h"
#include "test.h"

static int parse(const char *text, struct plan_trace **t, struct st_error *e) {
    memset(e, 0, sizeof(*e));
    return plan_trace_parse("t", text, strlen(text), t, e);
}

static int test_events_toy(void) {
    struct plan_trace *t = tp_trace("traces/toy-events.csv");
    ASSERT_TRUE(t != NULL);
    ASSERT_EQ(t->nintervals, 6);
    ASSERT_TRUE(t->named);
    ASSERT_EQ(t->iv[0].n_before, 0);
    ASSERT_EQ(t->iv[0].n_in, 8);
    ASSERT_EQ(t->iv[1].n_out, 2);
    ASSERT_EQ(plan_trace_n_after(t, 1), 6);
    ASSERT_EQ(plan_trace_n_after(t, 5), 6);
    /* interval 1 removes node2 and node3 (ids 1 and 2) */
    ASSERT_EQ(t->node_ids[t->iv[1].first_out], 1);
    ASSERT_EQ(t->node_ids[t->iv[1].first_out + 1], 2);
    plan_trace_free(t);
    return 0;
}

static int test_full_trace_formats_agree(void) {
    struct plan_trace *ev = tp_trace("traces/events.csv");
    struct plan_trace *co = tp_trace("traces/counts.csv");
    struct plan_trace *pm = tp_trace("traces/per-model/gpt-1.5b_p3_gbs128_mbs1.jsonl");
    ASSERT_TRUE(ev && co && pm);
    ASSERT_EQ(ev->nintervals, 683);
    ASSERT_EQ(co->nintervals, 683);
    ASSERT_EQ(pm->nintervals, 683);
    ASSERT_TRUE(pm->has_ref);
    ASSERT_FALSE(co->named);
    for (int i = 0; i < 683; i++) {
        ASSERT_EQ(plan_trace_n_after(ev, i), plan_trace_n_after(co, i));
        ASSERT_EQ(plan_trace_n_after(ev, i), plan_trace_n_after(pm, i));
        ASSERT_EQ(ev->iv[i].n_in, pm->iv[i].n_in);
        ASSERT_EQ(ev->iv[i].n_out, pm->iv[i].n_out);
    }
    plan_trace_free(ev);
    plan_trace_free(co);
    plan_trace_free(pm);
    return 0;
}

static int test_steps(void) {
    struct plan_trace *t;
    struct st_error e;
    /* 4 nodes, at 90 s one leaves, at 150 s two join, comments ignored */
    ASSERT_OK(parse("# a step trace\nseconds,N\n0,4\n90,4\n90,3\n# more\n150,3\n150,5\n", &t,
                    &e));
    ASSERT_EQ(t->nintervals, 3);
    ASSERT_EQ(t->iv[0].n_in, 4);
    ASSERT_EQ(t->iv[1].n_out, 1);
    ASSERT_EQ(t->iv[2].n_in, 2);
    ASSERT_EQ(plan_trace_n_after(t, 2), 5);
    plan_trace_free(t);
    /* without a header: seconds detected from small stamps */
    ASSERT_OK(parse("0,10\n60,10\n60,8\n", &t, &e));
    ASSERT_EQ(t->nintervals, 2);
    ASSERT_EQ(t->iv[1].n_out, 2);
    plan_trace_free(t);
    return 0;
}

static int test_bad_input(void) {
    struct plan_trace *t = NULL;
    struct st_error e;
    ASSERT_ERR(parse("0,add,a\n0,add,b\n60,delete,a\n", &t, &e), -EINVAL);
    ASSERT_EQ(e.line, 3);
    ASSERT_STREQ(e.field, "event");
    ASSERT_ERR(parse("0,add,a\n60,remove,b\n", &t, &e), -EINVAL);
    ASSERT_EQ(e.line, 2);
    ASSERT_STREQ(e.field, "node");
    ASSERT_ERR(parse("0,add,a\nx,add,b\n", &t, &e), -EINVAL);
    ASSERT_EQ(e.line, 2);
    ASSERT_STREQ(e.field, "timestamp");
    ASSERT_ERR(parse("60000,add,a\n0,add,b\n", &t, &e), -EINVAL);
    ASSERT_EQ(e.line, 2);
    ASSERT_ERR(parse("0,add,a\n0,add,a\n", &t, &e), -EINVAL);
    ASSERT_EQ(e.line, 2);
    ASSERT_ERR(parse("0,4\n60,-1\n", &t, &e), -EINVAL);
    ASSERT_EQ(e.line, 2);
    ASSERT_STREQ(e.field, "N");
    ASSERT_ERR(parse("0,4,5,6,7\n", &t, &e), -EINVAL);
    ASSERT_STREQ(e.field, "columns");
    ASSERT_ERR(parse("0,4\n0,add,a\n", &t, &e), -EINVAL);
    ASSERT_ERR(parse("# only a comment\n", &t, &e), -EINVAL);
    ASSERT_ERR(parse("foo,bar\n0,1\n", &t, &e), -EINVAL);
    ASSERT_STREQ(e.field, "header");
    ASSERT_ERR(parse("[0, \"add\", {\"nodes\": [\"a\"]}]\n[60000, \"oops\", {}]\n", &t, &e),
               -EINVAL);
    ASSERT_EQ(e.line, 2);
    ASSERT_ERR(parse("[0, \"add\", {\"nodes\": [\"a\"]}]\n[60000, \"add\", {\n", &t, &e),
               -EINVAL);
    ASSERT_EQ(e.line, 2);
    ASSERT_ERR(parse("[0, \"add\", {\"nodes\": [1]}]\n", &t, &e), -EINVAL);
    ASSERT_STREQ(e.field, "nodes");
    ASSERT_TRUE(t == NULL);
    return 0;
}

static int test_decisions(void) {
    struct plan_decisions *d = tp_decisions("traces/decisions/gpt-1.5b_p3_gbs128_mbs1.json");
    ASSERT_TRUE(d != NULL);
    ASSERT_EQ(d->n, 683);
    ASSERT_EQ(d->intervals[0][1], 18);
    ASSERT_EQ(d->shapes[0][0][0], 2);
    ASSERT_EQ(d->shapes[0][0][1], 9);
    plan_decisions_free(d);
    struct st_error e;
    const char *bad = "[{\"interval\": [1, 2]}]";
    ASSERT_ERR(plan_decisions_parse("d", bad, strlen(bad), &d, &e), -EINVAL);
    ASSERT_STREQ(e.field, "interval");
    const char *bad2 = "[{\"interval\": [1, 2, 0], \"liveput-truth\": [1]}]";
    ASSERT_ERR(plan_decisions_parse("d", bad2, strlen(bad2), &d, &e), -EINVAL);
    ASSERT_STREQ(e.field, "liveput-truth");
    ASSERT_ERR(plan_decisions_parse("d", "{", 1, &d, &e), -EINVAL);
    return 0;
}

static int test_alloc_failure(void) {
    const char *text = "0,add,a\n0,add,b\n60,remove,a\n120000,add,c\n";
    for (long n = 1; n < 40; n++) {
        struct plan_trace *t = NULL;
        struct st_error e;
        st_alloc_fail_after(n);
        int r = plan_trace_parse("t", text, strlen(text), &t, &e);
        st_alloc_fail_after(0);
        if (r == 0) {
            ASSERT_EQ(t->nintervals, 3);
            plan_trace_free(t);
            return 0;
        }
        ASSERT_ERR(r, -ENOMEM);
    }
    TEST_FAIL_("never succeeded");
}

TEST_MAIN(TEST(test_events_toy), TEST(test_full_trace_formats_agree), TEST(test_steps),
          TEST(test_bad_input), TEST(test_decisions), TEST(test_alloc_failure))
