/* test.h: the unit-test harness — a table of `static int test_x(void)` functions and
 * assertion macros that print both operands with file:line (libuv, systemd).
 *
 * A test returns 0 on pass, TEST_SKIP (77) to skip. Assertion failures print and return 1.
 * TEST_MAIN runs every test (or those named on the command line), prints a TAP-like line per
 * test and exits 0 when all passed or skipped, 77 when all skipped, 1 otherwise. */
#ifndef ST_TEST_H
#define ST_TEST_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_SKIP 77

#define TEST_FAIL_(...)                                                            \
    do {                                                                           \
        fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                          \
        fprintf(stderr, __VA_ARGS__);                                              \
        fprintf(stderr, "\n");                                                     \
        return 1;                                                                  \
    } while (0)

#define ASSERT_TRUE(c)                                                             \
    do {                                                                           \
        if (!(c))                                                                  \
            TEST_FAIL_("ASSERT_TRUE(%s) failed", #c);                              \
    } while (0)
#define ASSERT_FALSE(c) ASSERT_TRUE(!(c))

#define ASSERT_INT_OP_(a, b, op)                                                   \
    do {                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                        \
        if (!(a_ op b_))                                                           \
            TEST_FAIL_("%s %s %s failed: %lld vs %lld", #a, #op, #b, a_, b_);      \
    } while (0)
#define ASSERT_EQ(a, b) ASSERT_INT_OP_(a, b, ==)
#define ASSERT_NE(a, b) ASSERT_INT_OP_(a, b, !=)
#define ASSERT_LT(a, b) ASSERT_INT_OP_(a, b, <)
#define ASSERT_LE(a, b) ASSERT_INT_OP_(a, b, <=)
#define ASSERT_GT(a, b) ASSERT_INT_OP_(a, b, >)
#define ASSERT_GE(a, b) ASSERT_INT_OP_(a, b, >=)

/* r >= 0 (the negative-errno convention). */
#define ASSERT_OK(expr)                                                            \
    do {                                                                           \
        long long r_ = (long long)(expr);                                          \
        if (r_ < 0)                                                                \
            TEST_FAIL_("%s failed: %lld (%s)", #expr, r_, strerror((int)-r_));     \
    } while (0)
/* expr returns exactly the negative errno e. */
#define ASSERT_ERR(expr, e)                                                        \
    do {                                                                           \
        long long r_ = (long long)(expr);                                          \
        if (r_ != (long long)(e))                                                  \
            TEST_FAIL_("%s returned %lld, expected %s = %lld", #expr, r_, #e,      \
                       (long long)(e));                                            \
    } while (0)

#define ASSERT_STREQ(a, b)                                                         \
    do {                                                                           \
        const char *a_ = (a), *b_ = (b);                                           \
        if (!a_ || !b_ || strcmp(a_, b_) != 0)                                     \
            TEST_FAIL_("%s == %s failed: '%s' vs '%s'", #a, #b, a_ ? a_ : "(null)", \
                       b_ ? b_ : "(null)");                                        \
    } while (0)
#define ASSERT_CONTAINS(hay, needle)                                               \
    do {                                                                           \
        const char *h_ = (hay), *n_ = (needle);                                    \
        if (!h_ || !n_ || !strstr(h_, n_))                                         \
            TEST_FAIL_("'%s' does not contain '%s'", h_ ? h_ : "(null)", n_);      \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define ASSERT_NEAR(a, b, atol, rtol)                                              \
    do {                                                                           \
        double a_ = (double)(a), b_ = (double)(b);                                 \
        if (!(fabs(a_ - b_) <= (atol) + (rtol)*fabs(b_)))                          \
            TEST_FAIL_("%s ~= %s failed: %.9g vs %.9g (diff %.3g)", #a, #b, a_, b_, \
                       fabs(a_ - b_));                                             \
    } while (0)

struct test_case {
    const char *name;
    int (*fn)(void);
};

#define TEST(name) {#name, name}

static inline int test_main_(const struct test_case *tests, size_t n, int argc, char **argv) {
    int failed = 0, passed = 0, skipped = 0;
    for (size_t i = 0; i < n; i++) {
        if (argc > 1) {
            int want = 0;
            for (int a = 1; a < argc; a++)
                if (strcmp(argv[a], tests[i].name) == 0)
                    want = 1;
            if (!want)
                continue;
        }
        int r = tests[i].fn();
        if (r == 0) {
            passed++;
            printf("ok %zu - %s\n", i + 1, tests[i].name);
        } else if (r == TEST_SKIP) {
            skipped++;
            printf("ok %zu - %s # SKIP\n", i + 1, tests[i].name);
        } else {
            failed++;
            printf("not ok %zu - %s\n", i + 1, tests[i].name);
        }
        fflush(stdout);
    }
    printf("# %d passed, %d failed, %d skipped\n", passed, failed, skipped);
    if (failed)
        return 1;
    if (passed == 0 && skipped > 0)
        return TEST_SKIP;
    return 0;
}

#define TEST_MAIN(...)                                                             \
    int main(int argc, char **argv) {                                              \
        static const struct test_case tests_[] = {__VA_ARGS__};                    \
        return test_main_(tests_, sizeof(tests_) / sizeof(tests_[0]), argc, argv); \
    }

#endif
