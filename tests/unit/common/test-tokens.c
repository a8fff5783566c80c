/* test-tokens.c: token files (both formats, corrupt headers), the step-deterministic sampler,
 * Markov entropy against chains worked out by hand, the synthetic corpus, and the
 * `spottrain data` command's exit codes. */
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "test.h"

static char tmpdir[PATH_MAX];

static const char *tmp_path(const char *name) {
    static char buf[4][PATH_MAX];
    static int k;
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof(tmpdir), "/tmp/st-tokens-XXXXXX");
        if (!mkdtemp(tmpdir))
            abort();
    }
    char *p = buf[k++ % 4];
    snprintf(p, PATH_MAX, "%s/%s", tmpdir, name);
    return p;
}

static int write_bytes(const char *path, const void *data, size_t len) {
    return st_write_file_atomic(path, data, len);
}

/* An llm.c header with the given fields, then n uint16 tokens 0, 1, 2, ... */
static int write_llmc(const char *path, int32_t magic, int32_t version, int32_t count,
                      size_t n) {
    size_t len = ST_TOKENS_LLMC_HEADER_BYTES + 2 * n;
    unsigned char *b = calloc(1, len);
    if (!b)
        return -ENOMEM;
    int32_t h[3] = {magic, version, count};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            b[4 * i + k] = (unsigned char)((uint32_t)h[i] >> (8 * k));
    for (size_t i = 0; i < n; i++)
        b[ST_TOKENS_LLMC_HEADER_BYTES + 2 * i] = (unsigned char)(i % 200);
    int r = write_bytes(path, b, len);
    free(b);
    return r;
}

static int test_nanogpt_roundtrip(void) {
    uint16_t tok[1000];
    for (int i = 0; i < 1000; i++)
        tok[i] = (uint16_t)((i * 7919) % 50257);
    const char *p = tmp_path("raw.bin");
    ASSERT_OK(st_tokens_write(p, ST_TOKENS_NANOGPT, tok, 1000));
    struct stat st;
    ASSERT_OK(stat(p, &st));
    ASSERT_EQ(st.st_size, 2000);
    struct st_tokens *t = NULL;
    ASSERT_OK(st_tokens_open(p, 50257, &t, NULL));
    ASSERT_EQ(t->format, ST_TOKENS_NANOGPT);
    ASSERT_EQ(t->ntokens, 1000);
    ASSERT_TRUE(memcmp(t->tok, tok, sizeof(tok)) == 0);
    uint16_t mx = 0;
    for (int i = 0; i < 1000; i++)
        mx = tok[i] > mx ? tok[i] : mx;
    ASSERT_EQ(t->max_token, mx);
    t = st_tokens_free(t);
    ASSERT_TRUE(t == NULL);
    /* Little-endian on disk: byte 2 and 3 hold token 1 = 7919 = 0x1eef. */
    char *data;
    size_t len;
    ASSERT_OK(st_read_file(p, 4096, &data, &len));
    ASSERT_EQ((unsigned char)data[2], 0xef);
    ASSERT_EQ((unsigned char)data[3], 0x1e);
    st_free(data);
    /* vocab 0 skips the range check. */
    ASSERT_OK(st_tokens_open(p, 0, &t, NULL));
    st_tokens_free(t);
    return 0;
}

static int test_llmc_roundtrip(void) {
    uint16_t tok[500];
    for (int i = 0; i < 500; i++)
        tok[i] = (uint16_t)(i % 256);
    const char *p = tmp_path("llmc.bin");
    ASSERT_OK(st_tokens_write(p, ST_TOKENS_LLMC, tok, 500));
    char *data;
    size_t len;
    ASSERT_OK(st_read_file(p, 1 << 16, &data, &len));
    ASSERT_EQ(len, 1024 + 1000);
    int32_t h[3];
    memcpy(h, data, sizeof(h));
    ASSERT_EQ(h[0], 20240520);
    ASSERT_EQ(h[1], 1);
    ASSERT_EQ(h[2], 500);
    st_free(data);
    struct st_tokens *t = NULL;
    ASSERT_OK(st_tokens_open(p, 256, &t, NULL));
    ASSERT_EQ(t->format, ST_TOKENS_LLMC);
    ASSERT_EQ(t->ntokens, 500);
    ASSERT_TRUE(memcmp(t->tok, tok, sizeof(tok)) == 0);
    st_tokens_free(t);
    /* A file written by llm.c's own layout (helper above) opens the same way. */
    ASSERT_OK(write_llmc(p, ST_TOKENS_LLMC_MAGIC, 1, 300, 300));
    ASSERT_OK(st_tokens_open(p, 200, &t, NULL));
    ASSERT_EQ(t->ntokens, 300);
    ASSERT_EQ(t->tok[199], 199);
    ASSERT_EQ(t->tok[200], 0);
    st_tokens_free(t);
    return 0;
}

/* Opens p and expects -EINVAL with `want` in the message and the file named. */
static int expect_bad(const char *p, int vocab, const char *want) {
    struct st_tokens *t = NULL;
    struct st_error e;
    memset(&e, 0, sizeof(e));
    ASSERT_ERR(st_tokens_open(p, vocab, &t, &e), -EINVAL);
    ASSERT_TRUE(t == NULL);
    ASSERT_CONTAINS(e.message, want);
    ASSERT_STREQ(e.file, p);
    return 0;
}

static int test_corrupt(void) {
    const char *p = tmp_path("bad.bin");
    ASSERT_OK(write_llmc(p, ST_TOKENS_LLMC_MAGIC, 1, 300, 299));
    ASSERT_EQ(expect_bad(p, 0, "header says 300 tokens"), 0);
    ASSERT_OK(write_llmc(p, ST_TOKENS_LLMC_MAGIC, 1, 300, 301));
    ASSERT_EQ(expect_bad(p, 0, "truncated or corrupt"), 0);
    ASSERT_OK(write_llmc(p, ST_TOKENS_LLMC_MAGIC, 1, -5, 10));
    ASSERT_EQ(expect_bad(p, 0, "header says -5 tokens"), 0);
    ASSERT_OK(write_llmc(p, ST_TOKENS_LLMC_MAGIC, 2, 10, 10));
    ASSERT_EQ(expect_bad(p, 0, "version 2 holds uint32"), 0);
    ASSERT_OK(write_llmc(p, ST_TOKENS_LLMC_MAGIC, 7, 10, 10));
    ASSERT_EQ(expect_bad(p, 0, "version 7 is not supported"), 0);
    ASSERT_OK(write_llmc(p, ST_TOKENS_LLMC_MODEL_MAGIC, 3, 10, 10));
    ASSERT_EQ(expect_bad(p, 0, "model checkpoint"), 0);
    /* Magic but shorter than the header. */
    int32_t shorthdr[4] = {ST_TOKENS_LLMC_MAGIC, 1, 2, 0};
    ASSERT_OK(write_bytes(p, shorthdr, sizeof(shorthdr)));
    ASSERT_EQ(expect_bad(p, 0, "shorter than its 1024-byte header"), 0);
    /* Raw files: odd size, too small, empty. */
    ASSERT_OK(write_bytes(p, "abcde", 5));
    ASSERT_EQ(expect_bad(p, 0, "odd size (5 bytes)"), 0);
    ASSERT_OK(write_bytes(p, "ab", 2));
    ASSERT_EQ(expect_bad(p, 0, "at least 2 uint16 tokens"), 0);
    ASSERT_OK(write_bytes(p, "", 0));
    ASSERT_EQ(expect_bad(p, 0, "has 0 bytes"), 0);
    /* A token outside the vocabulary, named with its index. */
    uint16_t tok[6] = {1, 2, 3, 300, 4, 5};
    ASSERT_OK(st_tokens_write(p, ST_TOKENS_NANOGPT, tok, 6));
    ASSERT_EQ(expect_bad(p, 256, "token 300 at index 3 is outside the vocabulary of 256"), 0);
    ASSERT_OK(st_tokens_write(p, ST_TOKENS_LLMC, tok, 6));
    ASSERT_EQ(expect_bad(p, 300, "token 300 at index 3"), 0);
    /* Not a regular file; missing file; bad arguments. */
    ASSERT_EQ(expect_bad(tmpdir, 0, "not a regular file"), 0);
    struct st_tokens *t = NULL;
    struct st_error e;
    memset(&e, 0, sizeof(e));
    ASSERT_ERR(st_tokens_open(tmp_path("missing.bin"), 0, &t, &e), -ENOENT);
    ASSERT_CONTAINS(e.message, "cannot open token file");
    ASSERT_ERR(st_tokens_open(NULL, 0, &t, NULL), -EINVAL);
    ASSERT_ERR(st_tokens_open(p, 70000, &t, NULL), -EINVAL);
    ASSERT_ERR(st_tokens_write(p, ST_TOKENS_NANOGPT, tok, 0), -EINVAL);
    ASSERT_ERR(st_tokens_write(p, ST_TOKENS_LLMC, tok, 1ULL << 31), -EINVAL);
    return 0;
}

static int test_format_names(void) {
    enum st_tokens_format f;
    ASSERT_OK(st_tokens_format_parse("llmc", &f));
    ASSERT_EQ(f, ST_TOKENS_LLMC);
    ASSERT_OK(st_tokens_format_parse("nanogpt", &f));
    ASSERT_EQ(f, ST_TOKENS_NANOGPT);
    ASSERT_ERR(st_tokens_format_parse("hdf5", &f), -EINVAL);
    ASSERT_STREQ(st_tokens_format_name(ST_TOKENS_LLMC), "llmc");
    ASSERT_STREQ(st_tokens_format_name(ST_TOKENS_NANOGPT), "nanogpt");
    return 0;
}

static int test_sample_determinism(void) {
    enum { N = 10000, T = 16, GB = 8 };
    uint16_t *tok = malloc(N * sizeof(uint16_t));
    ASSERT_TRUE(tok != NULL);
    for (int i = 0; i < N; i++)
        tok[i] = (uint16_t)(i % 4099);
    const char *p = tmp_path("sample.bin");
    ASSERT_OK(st_tokens_write(p, ST_TOKENS_NANOGPT, tok, N));
    free(tok);
    struct st_tokens *a = NULL, *b = NULL;
    ASSERT_OK(st_tokens_open(p, 0, &a, NULL));
    ASSERT_OK(st_tokens_open(p, 0, &b, NULL));

    /* splitmix64 reference value: the first output of the generator seeded with 0. */
    ASSERT_TRUE(st_mix64(0) == 0xe220a8397b1dcdafULL);

    uint16_t x[T + 1], y[T + 1];
    for (uint64_t step = 0; step < 5; step++) {
        for (int i = 0; i < GB; i++) {
            uint64_t off;
            ASSERT_OK(st_tokens_sample_offset(a, 42, step, GB, i, T, &off));
            /* The contract, restated: mix(mix(seed) ^ (step * gb + i)) mod (n - T). */
            ASSERT_TRUE(off == st_mix64(st_mix64(42) ^ (step * GB + (uint64_t)i)) % (N - T));
            ASSERT_OK(st_tokens_sample(a, 42, step, GB, i, T, x));
            /* A second handle (another worker) reading in reverse order gets the same. */
            ASSERT_OK(st_tokens_sample(b, 42, step, GB, GB - 1 - i, T, y));
            ASSERT_OK(st_tokens_sample(b, 42, step, GB, i, T, y));
            ASSERT_TRUE(memcmp(x, y, sizeof(x)) == 0);
            for (int k = 0; k <= T; k++)
                ASSERT_EQ(x[k], (off + (uint64_t)k) % 4099);
        }
    }
    /* Another seed moves the windows; another step too. */
    uint64_t o1, o2, o3;
    ASSERT_OK(st_tokens_sample_offset(a, 1, 3, GB, 2, T, &o1));
    ASSERT_OK(st_tokens_sample_offset(a, 2, 3, GB, 2, T, &o2));
    ASSERT_OK(st_tokens_sample_offset(a, 1, 4, GB, 2, T, &o3));
    ASSERT_TRUE(o1 != o2 && o1 != o3);
    /* Offsets cover the file roughly uniformly: each tenth gets 7%..13% of 20000 samples. */
    int bins[10] = {0};
    for (int s = 0; s < 20000; s++) {
        uint64_t o;
        ASSERT_OK(st_tokens_sample_offset(a, 7, (uint64_t)s / GB, GB, s % GB, T, &o));
        ASSERT_LT(o, N - T);
        bins[o * 10 / (N - T)]++;
    }
    for (int i = 0; i < 10; i++) {
        ASSERT_GT(bins[i], 1400);
        ASSERT_LT(bins[i], 2600);
    }
    /* Bad arguments. */
    ASSERT_ERR(st_tokens_sample(a, 1, 0, GB, GB, T, x), -EINVAL);
    ASSERT_ERR(st_tokens_sample(a, 1, 0, GB, -1, T, x), -EINVAL);
    ASSERT_ERR(st_tokens_sample(a, 1, 0, 0, 0, T, x), -EINVAL);
    ASSERT_ERR(st_tokens_sample(a, 1, 0, GB, 0, 0, x), -EINVAL);
    ASSERT_ERR(st_tokens_sample(a, 1, 0, GB, 0, N, x), -EINVAL);
    ASSERT_ERR(st_tokens_sample(a, 1, 0, GB, 0, T, NULL), -EINVAL);
    ASSERT_ERR(st_tokens_sample(NULL, 1, 0, GB, 0, T, x), -EINVAL);
    /* The largest context that fits: one window only, always offset 0. */
    uint64_t o;
    ASSERT_OK(st_tokens_sample_offset(a, 9, 0, GB, 0, N - 1, &o));
    ASSERT_EQ(o, 0);
    st_tokens_free(a);
    st_tokens_free(b);
    return 0;
}

static double H2(double p) {
    return -(p * log(p) + (1 - p) * log(1 - p));
}

static int test_entropy_two_state(void) {
    /* P = [[0.9, 0.1], [0.5, 0.5]]. Stationary: pi0 * 0.1 = pi1 * 0.5, so pi = (5/6, 1/6).
     * Rate = 5/6 H(0.9) + 1/6 ln 2 = 5/6 * 0.3250830 + 1/6 * 0.6931472 = 0.3864271 nats. */
    const double P[4] = {0.9, 0.1, 0.5, 0.5};
    struct st_markov *m = NULL;
    ASSERT_OK(st_markov_new_dense(2, 1, P, 0.0, &m));
    struct st_markov_entropy e;
    ASSERT_OK(st_markov_entropy(m, &e));
    ASSERT_NEAR(e.rate, 5.0 / 6 * H2(0.9) + 1.0 / 6 * log(2.0), 1e-12, 0);
    ASSERT_NEAR(e.rate, 0.3864271, 1e-7, 0);
    ASSERT_NEAR(e.rate_bits, e.rate / log(2.0), 1e-12, 0);
    ASSERT_NEAR(e.cond[0], H2(5.0 / 6), 1e-12, 0); /* unigram entropy of pi */
    ASSERT_NEAR(e.cond[1], e.rate, 0, 0);
    ASSERT_NEAR(st_markov_floor(&e, 1, 64), e.rate, 1e-15, 0);
    ASSERT_TRUE(e.residual < 1e-13);

    /* Generated frequencies follow P: N = 200000 gives standard errors below 0.002. */
    enum { N = 200000 };
    uint16_t *x = malloc(N * sizeof(uint16_t));
    ASSERT_TRUE(x != NULL);
    ASSERT_OK(st_markov_generate(m, 5, N, x));
    long c[2][2] = {{0, 0}, {0, 0}};
    for (int i = 1; i < N; i++)
        c[x[i - 1]][x[i]]++;
    ASSERT_NEAR((double)c[0][1] / (double)(c[0][0] + c[0][1]), 0.1, 0.01, 0);
    ASSERT_NEAR((double)c[1][1] / (double)(c[1][0] + c[1][1]), 0.5, 0.01, 0);
    ASSERT_NEAR((double)(c[1][0] + c[1][1]) / N, 1.0 / 6, 0.01, 0);
    /* Same seed, same sequence; another seed, another one. */
    uint16_t *y = malloc(N * sizeof(uint16_t));
    ASSERT_TRUE(y != NULL);
    ASSERT_OK(st_markov_generate(m, 5, N, y));
    ASSERT_TRUE(memcmp(x, y, N * sizeof(uint16_t)) == 0);
    ASSERT_OK(st_markov_generate(m, 6, N, y));
    ASSERT_TRUE(memcmp(x, y, N * sizeof(uint16_t)) != 0);
    free(x);
    free(y);
    st_markov_free(m);
    return 0;
}

static int test_entropy_eps_and_periodic(void) {
    /* Identity with eps = 0.2 uniform mixing is [[0.9, 0.1], [0.1, 0.9]]: pi uniform,
     * rate H(0.9). */
    const double I[4] = {1, 0, 0, 1};
    struct st_markov *m = NULL;
    struct st_markov_entropy e;
    ASSERT_OK(st_markov_new_dense(2, 1, I, 0.2, &m));
    ASSERT_OK(st_markov_entropy(m, &e));
    ASSERT_NEAR(e.rate, H2(0.9), 1e-12, 0);
    ASSERT_NEAR(e.cond[0], log(2.0), 1e-12, 0);
    st_markov_free(m);
    /* The periodic flip chain has no limit under plain power iteration; the lazy chain
     * converges to the uniform law, and the rate is 0. */
    const double F[4] = {0, 1, 1, 0};
    ASSERT_OK(st_markov_new_dense(2, 1, F, 0.0, &m));
    ASSERT_OK(st_markov_entropy(m, &e));
    ASSERT_NEAR(e.rate, 0, 1e-15, 0);
    ASSERT_NEAR(e.cond[0], log(2.0), 1e-12, 0);
    st_markov_free(m);
    /* Bad matrices. */
    const double bad_sum[4] = {0.5, 0.4, 0.5, 0.5};
    const double bad_neg[4] = {1.5, -0.5, 0.5, 0.5};
    ASSERT_ERR(st_markov_new_dense(2, 1, bad_sum, 0, &m), -EINVAL);
    ASSERT_ERR(st_markov_new_dense(2, 1, bad_neg, 0, &m), -EINVAL);
    ASSERT_ERR(st_markov_new_dense(2, 1, I, 1.5, &m), -EINVAL);
    ASSERT_ERR(st_markov_new_dense(1, 1, I, 0, &m), -EINVAL);
    ASSERT_ERR(st_markov_new_dense(2, 0, I, 0, &m), -EINVAL);
    return 0;
}

static int test_entropy_order2(void) {
    /* Binary order-2 source: the next token repeats the token two steps back with p = 0.75.
     * State s = 2 * x_{t-2} + x_{t-1}. By symmetry the stationary law is uniform over the four
     * states, so the rate is H(0.75) = 0.5623351; one token of context says nothing
     * (x_{t-1} and x_{t-2} are independent), so cond[1] = ln 2; cond[0] = ln 2. */
    double P[8];
    for (int s = 0; s < 4; s++) {
        int old = s >> 1;
        P[2 * s + old] = 0.75;
        P[2 * s + (1 - old)] = 0.25;
    }
    struct st_markov *m = NULL;
    struct st_markov_entropy e;
    ASSERT_OK(st_markov_new_dense(2, 2, P, 0.0, &m));
    ASSERT_OK(st_markov_entropy(m, &e));
    ASSERT_NEAR(e.rate, H2(0.75), 1e-12, 0);
    ASSERT_NEAR(e.rate, 0.5623351, 1e-7, 0);
    ASSERT_NEAR(e.cond[0], log(2.0), 1e-12, 0);
    ASSERT_NEAR(e.cond[1], log(2.0), 1e-12, 0);
    ASSERT_NEAR(e.cond[2], e.rate, 0, 0);
    /* Context 4: position 0 sees one token (ln 2), positions 1..3 see two or more. */
    ASSERT_NEAR(st_markov_floor(&e, 2, 4), (log(2.0) + 3 * H2(0.75)) / 4, 1e-12, 0);
    /* The generator follows the order-2 rule. */
    enum { N = 100000 };
    uint16_t *x = malloc(N * sizeof(uint16_t));
    ASSERT_TRUE(x != NULL);
    ASSERT_OK(st_markov_generate(m, 11, N, x));
    long same = 0;
    for (int i = 2; i < N; i++)
        same += x[i] == x[i - 2];
    ASSERT_NEAR((double)same / (N - 2), 0.75, 0.01, 0);
    free(x);
    st_markov_free(m);
    return 0;
}

static int test_random_source(void) {
    struct st_markov *m = NULL, *m2 = NULL;
    ASSERT_OK(st_markov_new_random(64, 2, 3, &m));
    ASSERT_OK(st_markov_new_random(64, 2, 3, &m2));
    ASSERT_EQ(m->nstates, 4096);
    ASSERT_TRUE(memcmp(m->prob, m2->prob, m->nstates * m->max_succ * sizeof(double)) == 0);
    for (uint64_t s = 0; s < m->nstates; s++) {
        ASSERT_GE(m->nsucc[s], 2);
        ASSERT_LE(m->nsucc[s], 8);
        double sum = 0;
        for (int j = 0; j < m->nsucc[s]; j++)
            sum += m->prob[s * m->max_succ + j];
        ASSERT_NEAR(sum, 1.0, 1e-12, 0);
    }
    struct st_markov_entropy e;
    ASSERT_OK(st_markov_entropy(m, &e));
    /* At most 8 successors plus eps = 0.02 uniform: the rate lies between the entropy of the
     * eps part alone and ln 8 + that part's share of ln(64/0.02). */
    ASSERT_TRUE(e.rate > 0.1);
    ASSERT_TRUE(e.rate < log(8.0) + 0.02 * log(64 / 0.02) + 0.1);
    ASSERT_TRUE(e.cond[1] > e.rate);
    ASSERT_TRUE(e.cond[0] > e.cond[1]);
    ASSERT_TRUE(e.cond[0] <= log(64.0) + 1e-12);
    st_markov_free(m2);
    ASSERT_OK(st_markov_new_random(64, 2, 4, &m2));
    ASSERT_TRUE(memcmp(m->prob, m2->prob, m->nstates * m->max_succ * sizeof(double)) != 0);
    st_markov_free(m2);
    st_markov_free(m);
    ASSERT_ERR(st_markov_new_random(1, 1, 0, &m), -EINVAL);
    ASSERT_ERR(st_markov_new_random(256, 0, 0, &m), -EINVAL);
    ASSERT_ERR(st_markov_new_random(256, 3, 0, &m), -EINVAL); /* 2^24 states */
    ASSERT_ERR(st_markov_new_random(65537, 1, 0, &m), -EINVAL);
    ASSERT_TRUE(st_markov_free(NULL) == NULL);
    return 0;
}

static int test_synth_file(void) {
    struct st_synth_params p;
    st_synth_params_defaults(&p);
    ASSERT_EQ(p.vocab, 256);
    ASSERT_EQ(p.order, 1);
    p.ntokens = 50000;
    p.seed = 9;
    p.format = ST_TOKENS_LLMC;
    struct st_markov_entropy e1, e2;
    const char *a = tmp_path("synth-a.bin"), *b = tmp_path("synth-b.bin");
    ASSERT_OK(st_synth_write(&p, a, &e1));
    ASSERT_OK(st_synth_write(&p, b, NULL));
    ASSERT_OK(st_synth_entropy(&p, &e2));
    ASSERT_NEAR(e1.rate, e2.rate, 0, 0);
    char *da, *db;
    size_t la, lb;
    ASSERT_OK(st_read_file(a, 1 << 20, &da, &la));
    ASSERT_OK(st_read_file(b, 1 << 20, &db, &lb));
    ASSERT_EQ(la, lb);
    ASSERT_TRUE(memcmp(da, db, la) == 0);
    st_free(da);
    st_free(db);
    struct st_tokens *t = NULL;
    ASSERT_OK(st_tokens_open(a, 256, &t, NULL));
    ASSERT_EQ(t->format, ST_TOKENS_LLMC);
    ASSERT_EQ(t->ntokens, 50000);
    st_tokens_free(t);
    /* Bad parameters change nothing on disk. */
    p.vocab = 1;
    ASSERT_ERR(st_synth_write(&p, tmp_path("never.bin"), NULL), -EINVAL);
    ASSERT_TRUE(access(tmp_path("never.bin"), F_OK) != 0);
    p.vocab = 256;
    p.ntokens = 1;
    ASSERT_ERR(st_synth_write(&p, tmp_path("never.bin"), NULL), -EINVAL);
    p.ntokens = 100;
    p.order = 3;
    ASSERT_ERR(st_synth_entropy(&p, &e1), -EINVAL);
    ASSERT_ERR(st_synth_write(&p, NULL, NULL), -EINVAL);
    return 0;
}

static int test_synth_for_spec(void) {
    struct st_spec *s = calloc(1, sizeof(*s));
    ASSERT_TRUE(s != NULL);
    st_spec_defaults(s);
    s->model.vocab = 128;
    snprintf(s->data.train, sizeof(s->data.train), "%s", tmp_path("spec-train.bin"));
    struct st_markov_entropy e;
    memset(&e, 0, sizeof(e));
    s->data.synth = false;
    ASSERT_EQ(st_tokens_synth_for_spec(s, &e), 0);
    ASSERT_TRUE(access(s->data.train, F_OK) != 0);
    s->data.synth = true;
    s->data.synth_order = 1;
    s->data.synth_seed = 4;
    s->data.synth_tokens = 20000;
    ASSERT_EQ(st_tokens_synth_for_spec(s, &e), 1);
    double rate = e.rate;
    ASSERT_TRUE(rate > 0);
    struct st_tokens *t = NULL;
    ASSERT_OK(st_tokens_open(s->data.train, 128, &t, NULL));
    ASSERT_EQ(t->ntokens, 20000);
    st_tokens_free(t);
    memset(&e, 0, sizeof(e));
    ASSERT_EQ(st_tokens_synth_for_spec(s, &e), 0); /* exists: not rewritten, entropy given */
    ASSERT_NEAR(e.rate, rate, 0, 0);
    s->model.vocab = 1;
    unlink(s->data.train);
    ASSERT_ERR(st_tokens_synth_for_spec(s, &e), -EINVAL);
    ASSERT_ERR(st_tokens_synth_for_spec(NULL, &e), -EINVAL);
    free(s);
    return 0;
}

static int test_oom(void) {
    const char *p = tmp_path("oom.bin");
    uint16_t tok[64] = {0};
    ASSERT_OK(st_tokens_write(p, ST_TOKENS_NANOGPT, tok, 64));
    /* Every allocation of each call fails in turn; the call reports -ENOMEM and leaks
     * nothing (ASan's leak checker watches this run). */
    for (long n = 1; n < 10; n++) {
        struct st_tokens *t = NULL;
        st_alloc_fail_after(n);
        int r = st_tokens_open(p, 0, &t, NULL);
        st_alloc_fail_after(0);
        if (r == 0) {
            st_tokens_free(t);
            break;
        }
        ASSERT_ERR(r, -ENOMEM);
    }
    struct st_synth_params sp;
    st_synth_params_defaults(&sp);
    sp.vocab = 16;
    sp.ntokens = 1000;
    int ok = 0;
    for (long n = 1; n < 40 && !ok; n++) {
        st_alloc_fail_after(n);
        int r = st_synth_write(&sp, tmp_path("oom-synth.bin"), NULL);
        st_alloc_fail_after(0);
        if (r == 0)
            ok = 1;
        else
            ASSERT_ERR(r, -ENOMEM);
    }
    ASSERT_TRUE(ok);
    ASSERT_OK(st_tokens_write(p, ST_TOKENS_LLMC, tok, 64));
    st_alloc_fail_after(1);
    int r = st_tokens_write(p, ST_TOKENS_LLMC, tok, 64);
    st_alloc_fail_after(0);
    ASSERT_ERR(r, -ENOMEM);
    return 0;
}

/* Runs the spottrain binary with args (shell words) and returns its exit status. */
static int run_cli(const char *args, const char *out_file) {
    const char *bin = getenv("SPOTTRAIN_BIN");
    char cmd[2 * PATH_MAX];
    snprintf(cmd, sizeof(cmd), "'%s' %s >'%s' 2>&1", bin, args, out_file);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int test_cli(void) {
    if (!getenv("SPOTTRAIN_BIN"))
        return TEST_SKIP;
    char args[3 * PATH_MAX], *out;
    const char *log = tmp_path("cli.log"), *f = tmp_path("cli.bin");
    size_t len;
    snprintf(args, sizeof(args), "data synth --out '%s' --vocab 64 --order 2 --tokens 5000 "
                                 "--seed 3 --format llmc", f);
    ASSERT_EQ(run_cli(args, log), 0);
    ASSERT_OK(st_read_file(log, 1 << 16, &out, &len));
    ASSERT_CONTAINS(out, "5000 tokens, llmc format, vocab 64, order-2");
    ASSERT_CONTAINS(out, "entropy rate: ");
    ASSERT_CONTAINS(out, "loss floor at seq_len 64: ");
    st_free(out);
    snprintf(args, sizeof(args), "data info '%s' --vocab 64", f);
    ASSERT_EQ(run_cli(args, log), 0);
    ASSERT_OK(st_read_file(log, 1 << 16, &out, &len));
    ASSERT_CONTAINS(out, "llm.c (header + uint16)");
    ASSERT_CONTAINS(out, "tokens: 5000");
    st_free(out);
    /* A token file with a token >= --vocab is invalid input (2), and says why. */
    snprintf(args, sizeof(args), "data info '%s' --vocab 10", f);
    ASSERT_EQ(run_cli(args, log), 2);
    ASSERT_OK(st_read_file(log, 1 << 16, &out, &len));
    ASSERT_CONTAINS(out, "outside the vocabulary of 10");
    st_free(out);
    snprintf(args, sizeof(args), "data info '%s'", tmp_path("nope.bin"));
    ASSERT_EQ(run_cli(args, log), 1);
    static const char *const bad[] = {
        "data", "data frobnicate", "data synth", "data synth --out x --vocab 1",
        "data synth --out x --vocab abc", "data synth --out x --order 0",
        "data synth --out x --tokens 1", "data synth --out x --seed -1",
        "data synth --out x --order 21",
        "data synth --out x --format hdf5", "data synth --out x --vocab 256 --order 3",
        "data synth --out x --seq-len 0", "data synth --out x --bogus", "data synth --out",
        "data synth --out x extra", "data info", "data info a b", "data info x --vocab 0",
        "data info --bogus x", "data info x --vocab"};
    for (size_t i = 0; i < ST_ARRAY_SIZE(bad); i++) {
        int rc = run_cli(bad[i], log);
        if (rc != 2)
            TEST_FAIL_("'%s' exited %d, expected 2", bad[i], rc);
        ASSERT_OK(st_read_file(log, 1 << 16, &out, &len));
        ASSERT_CONTAINS(out, "spottrain data: ");
        st_free(out);
    }
    ASSERT_EQ(run_cli("data --help", log), 0);
    ASSERT_EQ(run_cli("data synth --help", log), 0);
    ASSERT_EQ(run_cli("data info --help", log), 0);
    ASSERT_OK(st_read_file(log, 1 << 16, &out, &len));
    ASSERT_CONTAINS(out, "Usage: spottrain data synth");
    st_free(out);
    /* A destination that cannot be made is bad input (2), as for train --save; a disk that
     * fails under the write is a runtime failure (1). */
    ASSERT_EQ(run_cli("data synth --out /nonexistent-dir/x.bin --tokens 100", log), 2);
    ASSERT_OK(st_read_file(log, 1 << 16, &out, &len));
    ASSERT_STREQ(out, "spottrain data: cannot write '/nonexistent-dir/x.bin': No such file or "
                      "directory\n");
    st_free(out);
    return 0;
}

static int cleanup(void) {
    char cmd[PATH_MAX + 16];
    if (tmpdir[0]) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
        ASSERT_EQ(system(cmd), 0);
    }
    return 0;
}

TEST_MAIN(TEST(test_nanogpt_roundtrip), TEST(test_llmc_roundtrip), TEST(test_corrupt),
          TEST(test_format_names), TEST(test_sample_determinism), TEST(test_entropy_two_state),
          TEST(test_entropy_eps_and_periodic), TEST(test_entropy_order2),
          TEST(test_random_source), TEST(test_synth_file), TEST(test_synth_for_spec),
          TEST(test_oom), TEST(test_cli), TEST(cleanup))
