/* test-ops.c: finite-difference gradient checks of every kernel op and of the layer API on
 * tiny shapes, plus AdamW / LR / clipping against scalar double references and the
 * determinism properties the engine relies on (thread count, pure initialisation).
 *
 * Gradient checks: with a random projection w, L(x) = sum_i w_i * f(x)_i is accumulated in
 * double; the analytic gradient (the op's backward with dout = w) is compared with the
 * central difference (L(x+h) - L(x-h)) / 2h at sampled coordinates. The forward runs in float,
 * so the tolerance (atol 2e-3 + rtol 2e-2) covers float rounding over 2h; the golden tests
 * check the same ops against PyTorch to 1e-5. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "test.h"

/* ---- helpers --------------------------------------------------------------------------- */

static uint64_t rng_state = 88172645463325252ULL;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *rand_buf(size_t n, float scale) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * scale;
    return p;
}

static float *zero_buf(size_t n) { return calloc(n, sizeof(float)); }

static double dotw(const float *out, const float *w, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)out[i] * (double)w[i];
    return s;
}

typedef double loss_fn(void);

/* Compares grad[i] with the central difference of f at up to nprobe indices of x. */
static int fd_check(const char *what, float *x, size_t n, const float *grad, loss_fn *f,
                    int nprobe, float h) {
    size_t stride = n > (size_t)nprobe ? n / (size_t)nprobe : 1;
    int bad = 0;
    for (size_t i = stride / 2; i < n; i += stride) {
        float saved = x[i];
        x[i] = saved + h;
        double lp = f();
        x[i] = saved - h;
        double lm = f();
        x[i] = saved;
        double fd = (lp - lm) / (2.0 * ((double)(saved + h) - (double)saved));
        if (!(fabs(fd - grad[i]) <= 2e-3 + 2e-2 * fabs(fd))) {
            if (bad < 5)
                fprintf(stderr, "  %s[%zu]: analytic %.6g vs finite difference %.6g\n", what, i,
                        (double)grad[i], fd);
            bad++;
        }
    }
    return bad;
}

/* ---- op checks ------------------------------------------------------------------------- */

enum { B_ = 2, T_ = 5, C_ = 8, NH_ = 2, OC_ = 6, V_ = 11 };

static float *g_in, *g_w, *g_b, *g_out, *g_proj, *g_aux1, *g_aux2;
static int *g_tok;

static double ln_loss(void) {
    kern_layernorm_forward(g_out, g_aux1, g_aux2, g_in, g_w, g_b, B_, T_, C_);
    return dotw(g_out, g_proj, (size_t)B_ * T_ * C_);
}

static int test_layernorm_grad(void) {
    size_t N = (size_t)B_ * T_ * C_;
    g_in = rand_buf(N, 2.0f);
    g_w = rand_buf(C_, 1.0f);
    g_b = rand_buf(C_, 1.0f);
    g_out = zero_buf(N);
    g_proj = rand_buf(N, 1.0f);
    g_aux1 = zero_buf(B_ * T_);
    g_aux2 = zero_buf(B_ * T_);
    float *din = zero_buf(N), *dw = zero_buf(C_), *db = zero_buf(C_);
    ln_loss();
    kern_layernorm_backward(din, dw, db, g_proj, g_in, g_w, g_aux1, g_aux2, B_, T_, C_);
    int bad = fd_check("ln.dinp", g_in, N, din, ln_loss, 40, 1e-2f) +
              fd_check("ln.dw", g_w, C_, dw, ln_loss, C_, 1e-2f) +
              fd_check("ln.db", g_b, C_, db, ln_loss, C_, 1e-2f);
    free(g_in), free(g_w), free(g_b), free(g_out), free(g_proj), free(g_aux1), free(g_aux2);
    free(din), free(dw), free(db);
    ASSERT_EQ(bad, 0);
    return 0;
}

static double mm_loss(void) {
    kern_matmul_forward(g_out, g_in, g_w, g_b, B_, T_, C_, OC_);
    return dotw(g_out, g_proj, (size_t)B_ * T_ * OC_);
}

static int test_matmul_grad(void) {
    size_t N = (size_t)B_ * T_;
    g_in = rand_buf(N * C_, 1.0f);
    g_w = rand_buf((size_t)OC_ * C_, 1.0f);
    g_b = rand_buf(OC_, 1.0f);
    g_out = zero_buf(N * OC_);
    g_proj = rand_buf(N * OC_, 1.0f);
    float *din = zero_buf(N * C_), *dw = zero_buf((size_t)OC_ * C_), *db = zero_buf(OC_);
    kern_matmul_backward(din, dw, db, g_proj, g_in, g_w, B_, T_, C_, OC_);
    int bad = fd_check("mm.dinp", g_in, N * C_, din, mm_loss, 40, 1e-2f) +
              fd_check("mm.dw", g_w, (size_t)OC_ * C_, dw, mm_loss, 40, 1e-2f) +
              fd_check("mm.db", g_b, OC_, db, mm_loss, OC_, 1e-2f);
    /* Without bias the output is overwritten, not accumulated. */
    float *out2 = zero_buf(N * OC_);
    for (size_t i = 0; i < N * OC_; i++)
        out2[i] = NAN;
    kern_matmul_forward(out2, g_in, g_w, NULL, B_, T_, C_, OC_);
    kern_matmul_forward(g_out, g_in, g_w, g_b, B_, T_, C_, OC_);
    int nb = 0;
    for (size_t n = 0; n < N; n++)
        for (int o = 0; o < OC_; o++)
            if (fabsf(out2[n * OC_ + o] + g_b[o] - g_out[n * OC_ + o]) > 1e-5f)
                nb++;
    free(g_in), free(g_w), free(g_b), free(g_out), free(g_proj), free(din), free(dw), free(db);
    free(out2);
    ASSERT_EQ(bad, 0);
    ASSERT_EQ(nb, 0);
    return 0;
}

static double att_loss(void) {
    kern_attention_forward(g_out, g_aux1, g_aux2, g_in, B_, T_, C_, NH_);
    return dotw(g_out, g_proj, (size_t)B_ * T_ * C_);
}

static int test_attention_grad(void) {
    size_t N = (size_t)B_ * T_, A = (size_t)B_ * NH_ * T_ * T_;
    g_in = rand_buf(N * 3 * C_, 1.5f);
    g_out = zero_buf(N * C_);
    g_proj = rand_buf(N * C_, 1.0f);
    g_aux1 = zero_buf(A);
    g_aux2 = zero_buf(A);
    float *din = zero_buf(N * 3 * C_), *s1 = zero_buf(A), *s2 = zero_buf(A);
    att_loss();
    kern_attention_backward(din, s1, s2, g_proj, g_in, g_aux2, B_, T_, C_, NH_);
    int bad = fd_check("att.dqkv", g_in, N * 3 * C_, din, att_loss, 120, 1e-2f);
    /* Causality: the output at t = 0 depends on position 0 only. */
    float *att = g_aux2;
    int leak = 0;
    for (int b = 0; b < B_; b++)
        for (int h = 0; h < NH_; h++)
            for (int t = 0; t < T_; t++)
                for (int t2 = t + 1; t2 < T_; t2++)
                    if (att[(((size_t)b * NH_ + h) * T_ + t) * T_ + t2] != 0.0f)
                        leak++;
    free(g_in), free(g_out), free(g_proj), free(g_aux1), free(g_aux2), free(din), free(s1);
    free(s2);
    ASSERT_EQ(bad, 0);
    ASSERT_EQ(leak, 0);
    return 0;
}

static double gelu_loss(void) {
    kern_gelu_forward(g_out, g_in, 64);
    return dotw(g_out, g_proj, 64);
}

static int test_gelu_grad(void) {
    g_in = rand_buf(64, 4.0f);
    g_out = zero_buf(64);
    g_proj = rand_buf(64, 1.0f);
    float *din = zero_buf(64);
    kern_gelu_backward(din, g_in, g_proj, 64);
    int bad = fd_check("gelu", g_in, 64, din, gelu_loss, 64, 1e-2f);
    /* GPT-2 tanh approximation at known points. */
    float x[3] = {0.0f, 1.0f, -2.0f}, y[3];
    kern_gelu_forward(y, x, 3);
    free(g_in), free(g_out), free(g_proj), free(din);
    ASSERT_EQ(bad, 0);
    ASSERT_NEAR(y[0], 0.0, 1e-7, 0);
    ASSERT_NEAR(y[1], 0.8411920071, 1e-6, 0);
    ASSERT_NEAR(y[2], -0.0454023, 1e-6, 0);
    return 0;
}

static double ce_loss(void) {
    int N = B_ * T_;
    kern_softmax_crossentropy_forward(g_aux1, g_out, g_in, g_tok, N, V_);
    double s = 0.0;
    for (int i = 0; i < N; i++)
        s += g_aux1[i];
    return s * 0.25;
}

static int test_crossentropy_grad(void) {
    int N = B_ * T_;
    g_in = rand_buf((size_t)N * V_, 3.0f);
    g_out = zero_buf((size_t)N * V_);
    g_aux1 = zero_buf((size_t)N);
    g_tok = malloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++)
        g_tok[i] = (i * 7) % V_;
    ce_loss();
    float *dl = zero_buf((size_t)N * V_);
    kern_softmax_crossentropy_backward(dl, g_out, g_tok, 0.25f, N, V_);
    int bad = fd_check("ce.dlogits", g_in, (size_t)N * V_, dl, ce_loss, 60, 1e-2f);
    /* Probabilities sum to one and the loss is -log p[target]. */
    double s = 0.0;
    for (int i = 0; i < V_; i++)
        s += g_out[i];
    double l0 = -log(g_out[g_tok[0]]);
    float l0k = g_aux1[0];
    free(g_in), free(g_out), free(g_aux1), free(g_tok), free(dl);
    ASSERT_EQ(bad, 0);
    ASSERT_NEAR(s, 1.0, 1e-5, 0);
    ASSERT_NEAR(l0k, l0, 1e-5, 1e-5);
    return 0;
}

static int test_encoder_residual(void) {
    int N = B_ * T_;
    float *wte = rand_buf((size_t)V_ * C_, 1.0f), *wpe = rand_buf((size_t)T_ * C_, 1.0f);
    float *out = zero_buf((size_t)N * C_), *dout = rand_buf((size_t)N * C_, 1.0f);
    float *dwte = zero_buf((size_t)V_ * C_), *dwpe = zero_buf((size_t)T_ * C_);
    int tok[B_ * T_];
    for (int i = 0; i < N; i++)
        tok[i] = i % 3; /* repeated tokens: gradients must add up */
    kern_encoder_forward(out, tok, wte, wpe, B_, T_, C_);
    kern_encoder_backward(dwte, dwpe, dout, tok, B_, T_, C_);
    int bad = 0;
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C_; c++)
            if (out[i * C_ + c] != wte[tok[i] * C_ + c] + wpe[(i % T_) * C_ + c])
                bad++;
    for (int v = 0; v < V_; v++) {
        for (int c = 0; c < C_; c++) {
            double s = 0.0;
            for (int i = 0; i < N; i++)
                if (tok[i] == v)
                    s += dout[i * C_ + c];
            if (fabs(s - dwte[v * C_ + c]) > 1e-5)
                bad++;
        }
    }
    float a[4] = {1, 2, 3, 4}, b[4] = {0.5f, 0.5f, 0.5f, 0.5f}, o[4];
    float da[4] = {0}, db[4] = {1, 1, 1, 1}, d[4] = {1, 2, 3, 4};
    kern_residual_forward(o, a, b, 4);
    kern_residual_backward(da, db, d, 4);
    free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
    ASSERT_EQ(bad, 0);
    ASSERT_NEAR(o[3], 4.5, 0, 0);
    ASSERT_NEAR(da[2], 3.0, 0, 0);
    ASSERT_NEAR(db[2], 4.0, 0, 0);
    return 0;
}

/* ---- layer API -------------------------------------------------------------------------- */

static const struct kern_config tiny = {.layers = 2, .channels = 8, .heads = 2, .vocab = 13,
                                        .seq_len = 6};

static int test_layer_table(void) {
    ASSERT_EQ(kern_config_check(&tiny), 0);
    struct kern_config bad = tiny;
    bad.heads = 3;
    ASSERT_ERR(kern_config_check(&bad), -EINVAL);
    bad = tiny;
    bad.vocab = 70000;
    ASSERT_ERR(kern_config_check(&bad), -EINVAL);
    ASSERT_ERR(kern_config_check(NULL), -EINVAL);
    ASSERT_EQ(kern_num_layers(&tiny), 4);
    size_t total = 0;
    for (int l = 0; l < kern_num_layers(&tiny); l++) {
        size_t off = 0;
        int nt = kern_layer_tensor_count(&tiny, l);
        ASSERT_EQ(nt, l == 1 || l == 2 ? 12 : 2);
        for (int k = 0; k < nt; k++) {
            struct kern_tensor_info ti;
            ASSERT_OK(kern_layer_tensor(&tiny, l, k, &ti));
            ASSERT_EQ(ti.offset, off);
            ASSERT_EQ(ti.numel, (size_t)ti.shape[0] * ti.shape[1]);
            ASSERT_EQ(ti.decay, ti.ndim == 2);
            off += ti.numel;
        }
        ASSERT_EQ(off, kern_layer_param_count(&tiny, l));
        total += off;
    }
    ASSERT_EQ(total, kern_model_param_count(&tiny));
    /* GPT-2 count for (L=2, C=8, V=13, T=6): (13+6)*8 + 2*(12*64 + 13*8) + 2*8 */
    ASSERT_EQ(total, (size_t)(19 * 8 + 2 * (12 * 64 + 104) + 16));
    struct kern_tensor_info ti;
    ASSERT_OK(kern_layer_tensor(&tiny, 1, 10, &ti));
    ASSERT_STREQ(ti.name, "fcproj.w");
    ASSERT_EQ(ti.shape[0], 8);
    ASSERT_EQ(ti.shape[1], 32);
    ASSERT_ERR(kern_layer_tensor(&tiny, 1, 12, &ti), -EINVAL);
    ASSERT_ERR(kern_layer_tensor(&tiny, 4, 0, &ti), -EINVAL);
    ASSERT_ERR(kern_layer_tensor(&tiny, -1, 0, &ti), -EINVAL);
    ASSERT_EQ(kern_layer_param_count(&tiny, 4), 0);
    ASSERT_EQ(kern_layer_tensor_count(&tiny, 4), 0);
    return 0;
}

static float h_dummy[4];

static int test_layer_init(void) {
    size_t n = kern_layer_param_count(&tiny, 1);
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    ASSERT_OK(kern_layer_init(&tiny, 1, 42, a));
    ASSERT_OK(kern_layer_init(&tiny, 1, 42, b));
    int same = memcmp(a, b, n * sizeof(float)) == 0;
    ASSERT_OK(kern_layer_init(&tiny, 1, 43, b));
    int differ = memcmp(a, b, n * sizeof(float)) != 0;
    struct kern_tensor_info ln1w, qkvb, fcproj;
    kern_layer_tensor(&tiny, 1, 0, &ln1w);
    kern_layer_tensor(&tiny, 1, 3, &qkvb);
    kern_layer_tensor(&tiny, 1, 10, &fcproj);
    int ok_consts = a[ln1w.offset] == 1.0f && a[qkvb.offset] == 0.0f;
    /* A wider model's layer 0 wpe starts with the same values: a pure function of
     * (seed, layer, tensor, element), whatever the shape of the run. */
    struct kern_config wide = tiny;
    wide.vocab = 20;
    size_t n0 = kern_layer_param_count(&tiny, 0), n0w = kern_layer_param_count(&wide, 0);
    float *e0 = malloc(n0 * sizeof(float)), *e0w = malloc(n0w * sizeof(float));
    kern_layer_init(&tiny, 0, 7, e0);
    kern_layer_init(&wide, 0, 7, e0w);
    int pure = memcmp(e0, e0w, 13 * 8 * sizeof(float)) == 0; /* wte rows of tiny */
    /* Standard deviation of a big weight: 0.02. */
    struct kern_config big = {.layers = 4, .channels = 64, .heads = 4, .vocab = 512,
                              .seq_len = 16};
    size_t nb = kern_layer_param_count(&big, 0);
    float *w = malloc(nb * sizeof(float));
    kern_layer_init(&big, 0, 1, w);
    double s2 = 0.0;
    for (size_t i = 0; i < nb; i++)
        s2 += (double)w[i] * w[i];
    double std = sqrt(s2 / nb);
    size_t n1 = kern_layer_param_count(&big, 1);
    float *w1 = malloc(n1 * sizeof(float));
    kern_layer_init(&big, 1, 1, w1);
    struct kern_tensor_info ti;
    kern_layer_tensor(&big, 1, 10, &ti);
    s2 = 0.0;
    for (size_t i = 0; i < ti.numel; i++)
        s2 += (double)w1[ti.offset + i] * w1[ti.offset + i];
    double std_proj = sqrt(s2 / ti.numel);
    free(a), free(b), free(e0), free(e0w), free(w), free(w1);
    ASSERT_TRUE(same);
    ASSERT_TRUE(differ);
    ASSERT_TRUE(ok_consts);
    ASSERT_TRUE(pure);
    ASSERT_NEAR(std, 0.02, 0.001, 0);
    ASSERT_NEAR(std_proj, 0.02 / sqrt(8.0), 0.0005, 0);
    ASSERT_ERR(kern_layer_init(&tiny, 5, 1, h_dummy), -EINVAL);
    return 0;
}

static float *l_params, *l_in, *l_out, *l_acts, *l_scratch, *l_proj;
static int l_layer, *l_tok;

static double layer_loss(void) {
    kern_layer_forward(&tiny, l_layer, l_params, 2, l_tok, l_in, l_out, l_acts, l_scratch);
    return dotw(l_out, l_proj, (size_t)2 * tiny.seq_len * tiny.channels);
}

static int layer_grad_check(int layer) {
    int B = 2;
    size_t BTC = (size_t)B * tiny.seq_len * tiny.channels;
    size_t n = kern_layer_param_count(&tiny, layer);
    l_layer = layer;
    l_params = malloc(n * sizeof(float));
    kern_layer_init(&tiny, layer, 3, l_params);
    for (size_t i = 0; i < n; i++) /* non-trivial biases and LN weights */
        l_params[i] += 0.1f * frand();
    l_in = rand_buf(BTC, 1.0f);
    l_out = zero_buf(BTC);
    l_proj = rand_buf(BTC, 1.0f);
    l_acts = zero_buf(kern_layer_act_count(&tiny, layer, B) + 1);
    l_scratch = zero_buf(kern_scratch_count(&tiny, B));
    l_tok = malloc(BTC * sizeof(int));
    for (size_t i = 0; i < (size_t)B * tiny.seq_len; i++)
        l_tok[i] = (int)(i * 5 % (size_t)tiny.vocab);
    float *grads = zero_buf(n), *din = zero_buf(BTC), *dout = malloc(BTC * sizeof(float));
    memcpy(dout, l_proj, BTC * sizeof(float));
    int r = kern_layer_forward(&tiny, layer, l_params, B, l_tok, l_in, l_out, l_acts, l_scratch);
    r |= kern_layer_backward(&tiny, layer, l_params, grads, B, l_tok, l_in, l_acts, dout,
                             layer == 0 ? NULL : din, l_scratch);
    char what[32];
    snprintf(what, sizeof(what), "layer%d.params", layer);
    int bad = fd_check(what, l_params, n, grads, layer_loss, 150, 1e-2f);
    if (layer > 0) {
        snprintf(what, sizeof(what), "layer%d.in", layer);
        bad += fd_check(what, l_in, BTC, din, layer_loss, 60, 1e-2f);
    }
    free(l_params), free(l_in), free(l_out), free(l_proj), free(l_acts), free(l_scratch);
    free(l_tok), free(grads), free(din), free(dout);
    return r != 0 ? -1 : bad;
}

static int test_layer_grads(void) {
    for (int l = 0; l < kern_num_layers(&tiny); l++)
        ASSERT_EQ(layer_grad_check(l), 0);
    return 0;
}

static float *h_wte, *h_x, *h_logits, *h_losses;
static int *h_tgt;

static double head_loss(void) {
    double sum = 0.0;
    kern_head_forward(&tiny, h_wte, 2, h_x, h_tgt, h_logits, h_losses, &sum);
    return sum * 0.5;
}

static int test_head_grad(void) {
    int B = 2, N = B * tiny.seq_len;
    size_t VC = (size_t)tiny.vocab * tiny.channels;
    h_wte = rand_buf(VC, 0.5f);
    h_x = rand_buf((size_t)N * tiny.channels, 1.0f);
    h_logits = zero_buf((size_t)N * tiny.vocab);
    h_losses = zero_buf((size_t)N);
    h_tgt = malloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++)
        h_tgt[i] = (3 * i + 1) % tiny.vocab;
    float *dwte = zero_buf(VC), *dx = rand_buf((size_t)N * tiny.channels, 9.0f);
    double sum = 0.0;
    ASSERT_OK(kern_head_forward_backward(&tiny, h_wte, B, h_x, h_tgt, 0.5f, h_logits, h_losses,
                                         dwte, dx, &sum));
    int bad = fd_check("head.dwte", h_wte, VC, dwte, head_loss, 60, 1e-2f) +
              fd_check("head.dx", h_x, (size_t)N * tiny.channels, dx, head_loss, 60, 1e-2f);
    double ref = head_loss() * 2.0;
    free(h_wte), free(h_x), free(h_logits), free(h_losses), free(h_tgt), free(dwte), free(dx);
    ASSERT_EQ(bad, 0);
    ASSERT_NEAR(sum, ref, 1e-9, 1e-9);
    ASSERT_ERR(kern_head_forward_backward(&tiny, NULL, B, NULL, NULL, 1.0f, NULL, NULL, NULL,
                                          NULL, NULL),
               -EINVAL);
    return 0;
}

/* ---- determinism: thread count does not change a bit ------------------------------------ */

static int run_block(int threads, float *grads_out, float *din_out) {
    kern_set_threads(threads);
    /* Big enough that OpenBLAS splits its products across threads. */
    struct kern_config c = {.layers = 2, .channels = 256, .heads = 4, .vocab = 64,
                            .seq_len = 64};
    int B = 4;
    size_t BTC = (size_t)B * c.seq_len * c.channels, n = kern_layer_param_count(&c, 1);
    float *p = malloc(n * sizeof(float));
    kern_layer_init(&c, 1, 5, p);
    uint64_t saved = rng_state;
    rng_state = 12345;
    float *in = rand_buf(BTC, 1.0f), *dout = rand_buf(BTC, 1.0f);
    rng_state = saved;
    float *out = zero_buf(BTC), *acts = zero_buf(kern_layer_act_count(&c, 1, B));
    float *scratch = zero_buf(kern_scratch_count(&c, B));
    memset(grads_out, 0, n * sizeof(float));
    kern_layer_forward(&c, 1, p, B, NULL, in, out, acts, scratch);
    kern_layer_backward(&c, 1, p, grads_out, B, NULL, in, acts, dout, din_out, scratch);
    free(p), free(in), free(dout), free(out), free(acts), free(scratch);
    return (int)n;
}

static int test_thread_determinism(void) {
    size_t n = 12 * 256 * 256 + 13 * 256, BTC = 4 * 64 * 256;
    float *g1 = malloc(n * sizeof(float)), *g2 = malloc(n * sizeof(float));
    float *d1 = malloc(BTC * sizeof(float)), *d2 = malloc(BTC * sizeof(float));
    run_block(1, g1, d1);
    run_block(2, g2, d2);
    kern_set_threads(0);
    int same = memcmp(g1, g2, n * sizeof(float)) == 0 && memcmp(d1, d2, BTC * sizeof(float)) == 0;
    free(g1), free(g2), free(d1), free(d2);
    ASSERT_TRUE(same);
    return 0;
}

/* ---- optimizer --------------------------------------------------------------------------- */

static int test_adamw(void) {
    float p[4] = {0.5f, -0.25f, 1.0f, 0.0f}, g[4] = {0.1f, -0.2f, 0.0f, 1.0f};
    float m[4] = {0}, v[4] = {0};
    double pd[4], md[4] = {0}, vd[4] = {0};
    for (int i = 0; i < 4; i++)
        pd[i] = p[i];
    double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    for (int t = 1; t <= 3; t++) {
        kern_adamw(p, g, m, v, 4, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, t);
        for (int i = 0; i < 4; i++) { /* torch.optim.AdamW, in double */
            pd[i] *= 1.0 - lr * wd;
            md[i] = b1 * md[i] + (1 - b1) * g[i];
            vd[i] = b2 * vd[i] + (1 - b2) * (double)g[i] * g[i];
            double mh = md[i] / (1 - pow(b1, t)), vh = vd[i] / (1 - pow(b2, t));
            pd[i] -= lr * mh / (sqrt(vh) + eps);
        }
    }
    for (int i = 0; i < 4; i++) {
        ASSERT_NEAR(p[i], pd[i], 1e-6, 1e-5);
        ASSERT_NEAR(m[i], md[i], 1e-7, 1e-5);
        ASSERT_NEAR(v[i], vd[i], 1e-9, 1e-5);
    }
    /* Per-range application equals whole-array application (ZeRO shards). */
    float a[5] = {1, 2, 3, 4, 5}, b[5] = {1, 2, 3, 4, 5}, gg[5] = {.1f, .2f, -.3f, .4f, -.5f};
    float ma[5] = {0}, va[5] = {0}, mb[5] = {0}, vb[5] = {0};
    kern_adamw(a, gg, ma, va, 5, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
    kern_adamw(b, gg, mb, vb, 2, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
    kern_adamw(b + 2, gg + 2, mb + 2, vb + 2, 3, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
    ASSERT_TRUE(memcmp(a, b, sizeof(a)) == 0);
    return 0;
}

static int test_lr_and_clip(void) {
    /* warmup 10 steps to 1e-3, cosine to 1e-4 at step 100 */
    ASSERT_NEAR(kern_lr(KERN_LR_COSINE, 1e-3, 10, 100, 0.1, 0), 1e-4, 1e-15, 0);
    ASSERT_NEAR(kern_lr(KERN_LR_COSINE, 1e-3, 10, 100, 0.1, 9), 1e-3, 1e-15, 0);
    ASSERT_NEAR(kern_lr(KERN_LR_COSINE, 1e-3, 10, 100, 0.1, 10), 1e-3, 1e-15, 0);
    ASSERT_NEAR(kern_lr(KERN_LR_COSINE, 1e-3, 10, 100, 0.1, 55), 5.5e-4, 1e-12, 0);
    ASSERT_NEAR(kern_lr(KERN_LR_COSINE, 1e-3, 10, 100, 0.1, 100), 1e-4, 1e-12, 0);
    ASSERT_NEAR(kern_lr(KERN_LR_COSINE, 1e-3, 10, 100, 0.1, 500), 1e-4, 1e-12, 0);
    ASSERT_NEAR(kern_lr(KERN_LR_LINEAR, 1e-3, 0, 100, 0.0, 50), 5e-4, 1e-12, 0);
    ASSERT_NEAR(kern_lr(KERN_LR_CONSTANT, 1e-3, 0, 100, 0.0, 99), 1e-3, 0, 0);
    ASSERT_NEAR(kern_clip_scale(10.0, 1.0), 1.0 / (10.0 + 1e-6), 1e-15, 0);
    ASSERT_NEAR(kern_clip_scale(0.5, 1.0), 1.0, 0, 0);
    ASSERT_NEAR(kern_clip_scale(100.0, 0.0), 1.0, 0, 0);
    double x[3] = {1.0, 2.0, 2.0};
    ASSERT_NEAR(kern_sumsq_f64(x, 3), 9.0, 0, 0);
    float out[3];
    kern_round_scaled(out, x, 3, 0.5);
    ASSERT_NEAR(out[2], 1.0, 0, 0);
    double acc[3] = {0.5, 0.5, 0.5};
    float g[3] = {1.0f, 0.25f, -0.5f};
    kern_accumulate_f64(acc, g, 3);
    ASSERT_NEAR(acc[0], 1.5, 0, 0);
    ASSERT_NEAR(acc[2], 0.0, 0, 0);
    return 0;
}

TEST_MAIN(TEST(test_layernorm_grad), TEST(test_matmul_grad), TEST(test_attention_grad),
          TEST(test_gelu_grad), TEST(test_crossentropy_grad), TEST(test_encoder_residual),
          TEST(test_layer_table), TEST(test_layer_init), TEST(test_layer_grads),
          TEST(test_head_grad), TEST(test_thread_determinism), TEST(test_adamw),
          TEST(test_lr_and_clip))
