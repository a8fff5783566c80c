/* test-cuda.c: every CUDA twin (kernels-cuda.h) against its CPU reference (kernels.h) on the
 * same random inputs, llm.c style. Backward ops start from non-zero gradients on both sides,
 * so "accumulates" and "overwrites" are checked too.
 *
 * Tolerance |gpu - cpu| <= 1e-5 + 1e-4 |cpu|: the twins do the same math, but reductions run
 * in another order and nvcc fuses multiply-adds, so agreement is to rounding, not bits; the
 * embedding backward, which only adds in the CPU's order, must match bit for bit.
 * Suite `gpu`: exits 77 (skip) when no CUDA device answers. */
#include <math.h>
#include <stdint.h>

#include "kernels-cuda.h"
#include "kernels.h"
#include "test.h"

#define ATOL 1e-5
#define RTOL 1e-4
#define MAXBUF 32

static uint64_t rng_state = 0x853c49e6748fea9bULL;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/* Host buffers and their device copies, freed together at the end of each test. */
static float *hbuf[MAXBUF];
static void *dbuf[MAXBUF];
static int nbuf;

static void release(void) {
    for (int i = 0; i < nbuf; i++) {
        free(hbuf[i]);
        kern_cuda_free(dbuf[i]);
    }
    nbuf = 0;
}

/* A host array of n floats (random * scale, or zero) and a device copy: returns the index. */
static int buf(size_t n, float scale) {
    if (nbuf >= MAXBUF)
        abort();
    float *h = malloc((n ? n : 1) * sizeof(float));
    void *d = NULL;
    if (!h || kern_cuda_malloc(&d, n * sizeof(float)) < 0)
        abort();
    for (size_t i = 0; i < n; i++)
        h[i] = scale * frand();
    if (kern_cuda_upload(d, h, n * sizeof(float)) < 0)
        abort();
    hbuf[nbuf] = h;
    dbuf[nbuf] = d;
    return nbuf++;
}

/* Integer tokens in [0, V) as a device buffer; the host copy is hbuf[] reinterpreted. */
static int ibuf(size_t n, int V) {
    int k = buf(n, 0);
    int *h = (int *)hbuf[k];
    for (size_t i = 0; i < n; i++) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        h[i] = (int)(rng_state % (uint64_t)V);
    }
    if (kern_cuda_upload(dbuf[k], h, n * sizeof(int)) < 0)
        abort();
    return k;
}

#define H(k) (hbuf[k])
#define D(k) ((float *)dbuf[k])
#define DI(k) ((int *)dbuf[k])
#define HI(k) ((int *)hbuf[k])

/* Downloads buffer k and compares it with the host (CPU-computed) values. */
static long compare(const char *what, int k, size_t n, int bitwise) {
    float *g = malloc(n * sizeof(float));
    if (!g || kern_cuda_sync() < 0 || kern_cuda_download(g, dbuf[k], n * sizeof(float)) < 0) {
        fprintf(stderr, "  %s: CUDA error\n", what);
        free(g);
        return 1;
    }
    long bad = 0;
    double maxd = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)g[i] - (double)hbuf[k][i]);
        maxd = fmax(maxd, d);
        int ok = bitwise ? memcmp(&g[i], &hbuf[k][i], sizeof(float)) == 0
                         : d <= ATOL + RTOL * fabs((double)hbuf[k][i]);
        if (!ok) {
            if (bad < 5)
                fprintf(stderr, "  %s[%zu]: gpu %.9g cpu %.9g\n", what, i, g[i], hbuf[k][i]);
            bad++;
        }
    }
    if (bad)
        fprintf(stderr, "  %s: %ld of %zu differ%s; max |diff| %.3g\n", what, bad, n,
                bitwise ? " (bitwise)" : "", maxd);
    free(g);
    return bad;
}

static int have_device(void) {
    return kern_cuda_device_count() > 0 && kern_cuda_init() == 0;
}

enum { B = 2, T = 12, C = 48, NH = 4, OC = 80, V = 101 };
#define BT ((size_t)B * T)

static int test_encoder(void) {
    if (!have_device())
        return TEST_SKIP;
    int inp = ibuf(BT, V), wte = buf((size_t)V * C, 1), wpe = buf((size_t)T * C, 1);
    int out = buf(BT * C, 0), dout = buf(BT * C, 1);
    int dwte = buf((size_t)V * C, 1), dwpe = buf((size_t)T * C, 1);
    kern_encoder_forward(H(out), HI(inp), H(wte), H(wpe), B, T, C);
    kern_cuda_encoder_forward(D(out), DI(inp), D(wte), D(wpe), B, T, C);
    kern_encoder_backward(H(dwte), H(dwpe), H(dout), HI(inp), B, T, C);
    kern_cuda_encoder_backward(D(dwte), D(dwpe), D(dout), DI(inp), B, T, C);
    long bad = compare("encoder out", out, BT * C, 1) + compare("dwte", dwte, (size_t)V * C, 1) +
               compare("dwpe", dwpe, (size_t)T * C, 1);
    release();
    ASSERT_EQ(bad, 0);
    return 0;
}

static long layernorm_case(int nb, int nt, int nc) {
    size_t nbt = (size_t)nb * nt;
    int inp = buf(nbt * nc, 2), w = buf(nc, 1), b = buf(nc, 1);
    int out = buf(nbt * nc, 0), mean = buf(nbt, 0), rstd = buf(nbt, 0);
    int dout = buf(nbt * nc, 1), dinp = buf(nbt * nc, 1), dw = buf(nc, 1), db = buf(nc, 1);
    kern_layernorm_forward(H(out), H(mean), H(rstd), H(inp), H(w), H(b), nb, nt, nc);
    kern_cuda_layernorm_forward(D(out), D(mean), D(rstd), D(inp), D(w), D(b), nb, nt, nc);
    kern_layernorm_backward(H(dinp), H(dw), H(db), H(dout), H(inp), H(w), H(mean), H(rstd), nb,
                            nt, nc);
    kern_cuda_layernorm_backward(D(dinp), D(dw), D(db), D(dout), D(inp), D(w), D(mean), D(rstd),
                                 nb, nt, nc);
    long bad = compare("ln out", out, nbt * nc, 0) + compare("ln mean", mean, nbt, 0) +
               compare("ln rstd", rstd, nbt, 0) + compare("ln dinp", dinp, nbt * nc, 0) +
               compare("ln dweight", dw, nc, 0) + compare("ln dbias", db, nc, 0);
    release();
    return bad;
}

/* The small shape, and one of 201 rows: parameter gradients sum rows in chunks of 64, so
 * several chunks and a partial last one. */
static int test_layernorm(void) {
    if (!have_device())
        return TEST_SKIP;
    ASSERT_EQ(layernorm_case(B, T, C), 0);
    ASSERT_EQ(layernorm_case(3, 67, 96), 0);
    return 0;
}

static long matmul_case(int nb, int nt, int nc, int noc) {
    size_t nbt = (size_t)nb * nt;
    int inp = buf(nbt * nc, 1), w = buf((size_t)noc * nc, 1), bias = buf(noc, 1);
    int out = buf(nbt * noc, 0), out2 = buf(nbt * noc, 0), dout = buf(nbt * noc, 1);
    int dinp = buf(nbt * nc, 1), dw = buf((size_t)noc * nc, 1), db = buf(noc, 1);
    int dw2 = buf((size_t)noc * nc, 1);
    kern_matmul_forward(H(out), H(inp), H(w), H(bias), nb, nt, nc, noc);
    kern_cuda_matmul_forward(D(out), D(inp), D(w), D(bias), nb, nt, nc, noc);
    kern_matmul_forward(H(out2), H(inp), H(w), NULL, nb, nt, nc, noc);
    kern_cuda_matmul_forward(D(out2), D(inp), D(w), NULL, nb, nt, nc, noc);
    kern_matmul_backward(H(dinp), H(dw), H(db), H(dout), H(inp), H(w), nb, nt, nc, noc);
    kern_cuda_matmul_backward(D(dinp), D(dw), D(db), D(dout), D(inp), D(w), nb, nt, nc, noc);
    /* dinp and dbias may be NULL (the LM head). */
    kern_matmul_backward(NULL, H(dw2), NULL, H(dout), H(inp), H(w), nb, nt, nc, noc);
    kern_cuda_matmul_backward(NULL, D(dw2), NULL, D(dout), D(inp), D(w), nb, nt, nc, noc);
    long bad = compare("mm out", out, nbt * noc, 0) + compare("mm out nobias", out2, nbt * noc, 0) +
               compare("mm dinp", dinp, nbt * nc, 0) + compare("mm dweight", dw, (size_t)noc * nc, 0) +
               compare("mm dbias", db, noc, 0) + compare("mm dweight2", dw2, (size_t)noc * nc, 0);
    release();
    return bad;
}

static int test_matmul(void) {
    if (!have_device())
        return TEST_SKIP;
    ASSERT_EQ(matmul_case(B, T, C, OC), 0);
    ASSERT_EQ(matmul_case(3, 67, 96, 80), 0);
    return 0;
}

/* One attention case: forward and backward of the twin against the CPU's. */
static long attention_case(int b, int t, int c, int nh) {
    size_t natt = (size_t)b * nh * t * t, bt = (size_t)b * t;
    int inp = buf(bt * 3 * c, 1), out = buf(bt * c, 0), pre = buf(natt, 0), att = buf(natt, 0);
    int dout = buf(bt * c, 1), dinp = buf(bt * 3 * c, 1), dpre = buf(natt, 0),
        datt = buf(natt, 0);
    kern_attention_forward(H(out), H(pre), H(att), H(inp), b, t, c, nh);
    kern_cuda_attention_forward(D(out), D(pre), D(att), D(inp), b, t, c, nh);
    long bad = compare("att out", out, bt * c, 0) + compare("att probs", att, natt, 0);
    /* Backward from the CPU's probabilities on both sides, so only backward is measured. */
    if (kern_cuda_upload(dbuf[att], hbuf[att], natt * sizeof(float)) < 0)
        bad++;
    kern_attention_backward(H(dinp), H(dpre), H(datt), H(dout), H(inp), H(att), b, t, c, nh);
    kern_cuda_attention_backward(D(dinp), D(dpre), D(datt), D(dout), D(inp), D(att), b, t, c,
                                 nh);
    bad += compare("att dinp", dinp, bt * 3 * c, 0);
    release();
    return bad;
}

/* The small shape, and one whose rows span several warps' strides and end mid-stride (T = 67)
 * with more heads than the batched products' smallest case. */
static int test_attention(void) {
    if (!have_device())
        return TEST_SKIP;
    ASSERT_EQ(attention_case(B, T, C, NH), 0);
    ASSERT_EQ(attention_case(3, 67, 96, 6), 0);
    return 0;
}

static int test_gelu_residual(void) {
    if (!have_device())
        return TEST_SKIP;
    int N = (int)(BT * 4 * C);
    int inp = buf((size_t)N, 3), out = buf((size_t)N, 0), dout = buf((size_t)N, 1),
        dinp = buf((size_t)N, 1);
    int a = buf((size_t)N, 1), b = buf((size_t)N, 1), r = buf((size_t)N, 0), da = buf((size_t)N, 1),
        db = buf((size_t)N, 1);
    kern_gelu_forward(H(out), H(inp), N);
    kern_cuda_gelu_forward(D(out), D(inp), N);
    kern_gelu_backward(H(dinp), H(inp), H(dout), N);
    kern_cuda_gelu_backward(D(dinp), D(inp), D(dout), N);
    kern_residual_forward(H(r), H(a), H(b), N);
    kern_cuda_residual_forward(D(r), D(a), D(b), N);
    kern_residual_backward(H(da), H(db), H(dout), N);
    kern_cuda_residual_backward(D(da), D(db), D(dout), N);
    long bad = compare("gelu out", out, (size_t)N, 0) + compare("gelu dinp", dinp, (size_t)N, 0) +
               compare("residual out", r, (size_t)N, 1) + compare("residual da", da, (size_t)N, 1) +
               compare("residual db", db, (size_t)N, 1);
    release();
    ASSERT_EQ(bad, 0);
    return 0;
}

static int test_softmax_crossentropy(void) {
    if (!have_device())
        return TEST_SKIP;
    int N = (int)BT;
    int logits = buf((size_t)N * V, 4), probs = buf((size_t)N * V, 0), losses = buf((size_t)N, 0);
    int tgt = ibuf((size_t)N, V), dlog = buf((size_t)N * V, 1);
    int inplace = buf((size_t)N * V, 0);
    memcpy(H(inplace), H(logits), (size_t)N * V * sizeof(float));
    if (kern_cuda_upload(dbuf[inplace], hbuf[logits], (size_t)N * V * sizeof(float)) < 0)
        return 1;
    kern_softmax_crossentropy_forward(H(losses), H(probs), H(logits), HI(tgt), N, V);
    kern_cuda_softmax_crossentropy_forward(D(losses), D(probs), D(logits), DI(tgt), N, V);
    /* In place, as kern_head_forward uses it (probs == logits), with no targets. */
    kern_softmax_crossentropy_forward(NULL, H(inplace), H(inplace), NULL, N, V);
    kern_cuda_softmax_crossentropy_forward(NULL, D(inplace), D(inplace), NULL, N, V);
    kern_softmax_crossentropy_backward(H(dlog), H(probs), HI(tgt), 0.25f, N, V);
    kern_cuda_softmax_crossentropy_backward(D(dlog), D(probs), DI(tgt), 0.25f, N, V);
    long bad = compare("probs", probs, (size_t)N * V, 0) + compare("losses", losses, (size_t)N, 0) +
               compare("probs in place", inplace, (size_t)N * V, 0) +
               compare("dlogits", dlog, (size_t)N * V, 0);
    release();
    ASSERT_EQ(bad, 0);
    return 0;
}

static int test_adamw(void) {
    if (!have_device())
        return TEST_SKIP;
    size_t n = 10007;
    int p = buf(n, 1), g = buf(n, 0.1f), m = buf(n, 0), v = buf(n, 0);
    for (int t = 1; t <= 3; t++) {
        kern_adamw(H(p), H(g), H(m), H(v), n, 1e-3f * t, 0.9f, 0.95f, 1e-8f, t == 2 ? 0.0f : 0.1f,
                   t);
        kern_cuda_adamw(D(p), D(g), D(m), D(v), n, 1e-3f * t, 0.9f, 0.95f, 1e-8f,
                        t == 2 ? 0.0f : 0.1f, t);
    }
    long bad = compare("adamw param", p, n, 0) + compare("adamw m", m, n, 0) +
               compare("adamw v", v, n, 0);
    release();
    ASSERT_EQ(bad, 0);
    return 0;
}

static int test_done(void) {
    if (!have_device())
        return TEST_SKIP;
    ASSERT_OK(kern_cuda_sync());
    kern_cuda_done();
    kern_cuda_done(); /* idempotent */
    return 0;
}

TEST_MAIN(TEST(test_encoder), TEST(test_layernorm), TEST(test_matmul), TEST(test_attention),
          TEST(test_gelu_residual), TEST(test_softmax_crossentropy), TEST(test_adamw),
          TEST(test_done))
