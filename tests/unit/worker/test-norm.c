/* test-norm.c: the engine's exact gradient-norm accumulator (worker__sumsq_exact_*).
 *
 * The global grad norm used to be summed per replica shard in double and the shard sums
 * added, so dp = 1 (one sequential sum) and dp >= 2 (sums of partial sums) rounded the norm
 * differently, gave a clip scale differing in its last bits and, once in a while, a different
 * float gradient: a dp 1 run and a dp 2 run drifted apart after ~1000s of steps. The exact
 * accumulator makes the sum independent of how the elements are split and combined; these
 * tests split the same vector as dp = 1..8 would and require the same bits, and check that
 * the naive per-shard double sum does NOT agree on the same data (so the data exercises it). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "worker-internal.h"

#define N 20000

static double xs[N];

static void fill(unsigned seed) {
    srand(seed);
    for (int i = 0; i < N; i++) {
        double m = 0.5 + (double)rand() / RAND_MAX * 0.5;
        int e = rand() % 70 - 60;
        xs[i] = (rand() & 1 ? -1.0 : 1.0) * ldexp(m, e);
    }
}

/* The norm of xs split into dp shards [floor(r n/dp), floor((r+1) n/dp)), each shard's
 * accumulator sent as doubles and summed in `reverse` or forward replica order. */
static double split_exact(int dp, int reverse) {
    uint64_t total[WORKER_NORM_SLOTS];
    double sum[WORKER_NORM_SLOTS];
    memset(sum, 0, sizeof(sum));
    for (int k = 0; k < dp; k++) {
        int r = reverse ? dp - 1 - k : k;
        size_t lo = (size_t)r * N / (size_t)dp, hi = (size_t)(r + 1) * N / (size_t)dp;
        uint64_t limb[WORKER_NORM_SLOTS];
        memset(limb, 0, sizeof(limb));
        worker__sumsq_exact_add(limb, xs + lo, hi - lo);
        for (int s = 0; s < WORKER_NORM_SLOTS; s++)
            sum[s] += (double)limb[s];
    }
    for (int s = 0; s < WORKER_NORM_SLOTS; s++)
        total[s] = (uint64_t)sum[s];
    return worker__sumsq_exact_value(total);
}

/* The old way: per-shard sequential double sums, added in replica order. */
static double split_naive(int dp) {
    double total = 0.0;
    for (int r = 0; r < dp; r++) {
        size_t lo = (size_t)r * N / (size_t)dp, hi = (size_t)(r + 1) * N / (size_t)dp;
        double s = 0.0;
        for (size_t i = lo; i < hi; i++)
            s += xs[i] * xs[i];
        total += s;
    }
    return total;
}

static int test_split_independent(void) {
    int naive_differs = 0;
    for (unsigned seed = 1; seed <= 5; seed++) {
        fill(seed);
        double one = split_exact(1, 0);
        for (int dp = 1; dp <= 8; dp++) {
            double a = split_exact(dp, 0), b = split_exact(dp, 1);
            ASSERT_TRUE(memcmp(&a, &one, sizeof(a)) == 0);
            ASSERT_TRUE(memcmp(&b, &one, sizeof(b)) == 0);
            if (split_naive(dp) != split_naive(1))
                naive_differs++;
        }
        /* Close to the true sum (long double, ascending magnitude is near-exact here). */
        long double ref = 0.0L;
        for (int i = 0; i < N; i++)
            ref += (long double)xs[i] * xs[i];
        ASSERT_NEAR(one, (double)ref, 0.0, 1e-14);
    }
    printf("# naive per-shard sums differed from dp=1 in %d of 40 splits\n", naive_differs);
    ASSERT_GT(naive_differs, 0);
    return 0;
}

static int test_exact_values(void) {
    uint64_t limb[WORKER_NORM_SLOTS];
    double v[4] = {1.0, -2.0, 3.0, 0.0};
    memset(limb, 0, sizeof(limb));
    ASSERT_TRUE(worker__sumsq_exact_value(limb) == 0.0);
    worker__sumsq_exact_add(limb, v, 4);
    ASSERT_TRUE(worker__sumsq_exact_value(limb) == 14.0);
    /* Extremes: a subnormal square and a huge one, exactly. */
    double tiny = ldexp(1.0, -530), big = ldexp(1.0, 500);
    memset(limb, 0, sizeof(limb));
    worker__sumsq_exact_add(limb, &tiny, 1);
    ASSERT_TRUE(worker__sumsq_exact_value(limb) == ldexp(1.0, -1060));
    memset(limb, 0, sizeof(limb));
    worker__sumsq_exact_add(limb, &big, 1);
    worker__sumsq_exact_add(limb, &big, 1);
    ASSERT_TRUE(worker__sumsq_exact_value(limb) == ldexp(1.0, 1001));
    /* Non-finite squares: NaN wins over infinity. */
    double inf[2] = {1.0, ldexp(1.0, 600)}, nan[2] = {NAN, INFINITY};
    memset(limb, 0, sizeof(limb));
    worker__sumsq_exact_add(limb, inf, 2);
    ASSERT_TRUE(isinf(worker__sumsq_exact_value(limb)));
    memset(limb, 0, sizeof(limb));
    worker__sumsq_exact_add(limb, nan, 2);
    ASSERT_TRUE(isnan(worker__sumsq_exact_value(limb)));
    return 0;
}

/* The accumulator as first written, with frexp and ldexp (a library call each per element):
 * the bit reading that replaced it must leave the same limbs. */
static void sumsq_frexp(uint64_t *limb, const double *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double s = x[i] * x[i];
        if (s == 0.0 || !isfinite(s))
            continue;
        int e;
        double f = frexp(s, &e);
        uint64_t m = (uint64_t)ldexp(f, 53);
        int p = e + 1073, k = p / 32, sh = p % 32;
        uint64_t rest = m >> (32 - sh);
        limb[k] += (m << sh) & 0xffffffffULL;
        limb[k + 1] += rest & 0xffffffffULL;
        limb[k + 2] += rest >> 32;
    }
    uint64_t carry = 0;
    for (int k = 0; k < WORKER_NORM_SLOTS - 2; k++) {
        uint64_t v = limb[k] + carry;
        limb[k] = v & 0xffffffffULL;
        carry = v >> 32;
    }
}

/* Long enough for several of the accumulator's chunks (2^16 elements), which the kernels'
 * OpenMP threads sum apart (two on a 2-core machine). */
#define NV (3 * 65536 + 1234)

static int test_same_limbs_as_frexp(void) {
    /* Squares across the whole finite range: subnormal (|x| below 2^-537), normal, up to just
     * under overflow; random fractions, and powers of two (a fraction of 0). */
    static double v[NV];
    srand(11);
    for (int i = 0; i < NV; i++) {
        double m = i % 7 ? 0.5 + (double)rand() / RAND_MAX * 0.5 : 0.5;
        int e = rand() % 1050 - 560; /* x in [2^-561, 2^489]: s from 2^-1122 to 2^978 */
        v[i] = (rand() & 1 ? -1.0 : 1.0) * ldexp(m, e);
    }
    v[0] = ldexp(1.0, -537);             /* the smallest x whose square is not 0 */
    v[1] = nextafter(ldexp(1.0, 512), 0); /* the largest square still finite */
    v[2] = ldexp(1.0, -511);             /* the smallest normal square, 2^-1022 */
    v[3] = nextafter(v[2], 0);           /* just below it: a subnormal square */
    int subnormal = 0;
    for (int i = 0; i < NV; i++)
        subnormal += v[i] * v[i] != 0.0 && fpclassify(v[i] * v[i]) == FP_SUBNORMAL;
    ASSERT_GT(subnormal, 100);
    uint64_t a[WORKER_NORM_SLOTS], b[WORKER_NORM_SLOTS];
    memset(a, 0, sizeof(a));
    memset(b, 0, sizeof(b));
    worker__sumsq_exact_add(a, v, NV);
    sumsq_frexp(b, v, NV);
    ASSERT_TRUE(memcmp(a, b, sizeof(a)) == 0);
    double x = worker__sumsq_exact_value(a), y = worker__sumsq_exact_value(b);
    ASSERT_TRUE(memcmp(&x, &y, sizeof(x)) == 0);
    return 0;
}

TEST_MAIN(TEST(test_split_independent), TEST(test_exact_values), TEST(test_same_limbs_as_frexp))
