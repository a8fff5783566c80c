/* test-golden.c: our CPU kernels against PyTorch on the tiny GPT in tests/golden/gpt-tiny.bin
 * (written by scripts/make-golden; format in tests/golden/README.md).
 *
 * Forward (logits, loss), backward (every parameter gradient), AdamW (two steps from
 * PyTorch's own gradients) and two whole training steps through kernels.h's layer API are
 * compared element by element with |ours - ref| <= ATOL + RTOL * |ref| (RTOL 1e-5, the issue's
 * "1e-5 relative"; ATOL 1e-6 for elements near zero, where a relative bound means nothing). A
 * failure prints the first mismatches and the largest difference (llm.c validate_result). */
#include <limits.h>
#include <math.h>

#include "common.h"
#include "kernels.h"
#include "test.h"

#define GOLDEN_MAGIC 20261123
#define GOLDEN_VERSION 1
#define GOLDEN_HEADER_INTS 256
#define GOLDEN_NAME_LEN 48
#define GOLDEN_HYPER 32
#define GOLDEN_ENTRY_BYTES 88 /* name[48], dtype, ndim, shape[4] (int32), offset, numel (int64) */
#define GOLDEN_MAX_TENSORS 1024
#define GOLDEN_MAX_LAYERS 16 /* L + 2 of the golden configs */

#define ATOL 1e-6
#define RTOL 1e-5
#define COND_MIN 1e-6 /* AdamW's direction is set by the data only where |g| >= this */

struct golden_tensor {
    char name[GOLDEN_NAME_LEN];
    int dtype; /* 0 float32, 1 int32 */
    int ndim;
    int shape[4];
    const void *data;
    size_t numel;
};

struct golden {
    char *buf;
    size_t len;
    struct kern_config cfg;
    int B, nsteps, ntensors;
    double lr[2], beta1, beta2, eps, weight_decay, grad_clip;
    struct golden_tensor *t;
};

static void golden_done(struct golden *g) {
    st_free(g->buf);
    st_free(g->t);
    memset(g, 0, sizeof(*g));
}

/* Parses a golden file image; on error returns -EINVAL with a hint in why. */
static int golden_parse(struct golden *g, char *buf, size_t len, char *why, size_t whylen) {
    memset(g, 0, sizeof(*g));
    size_t table_at = GOLDEN_HEADER_INTS * 4 + GOLDEN_HYPER * 8;
    if (len < table_at) {
        snprintf(why, whylen, "file is %zu bytes, shorter than the %zu-byte header", len,
                 table_at);
        return -EINVAL;
    }
    int32_t h[GOLDEN_HEADER_INTS];
    memcpy(h, buf, sizeof(h));
    if (h[0] != GOLDEN_MAGIC) {
        snprintf(why, whylen, "bad magic %d (expected %d): not a spottrain golden file", h[0],
                 GOLDEN_MAGIC);
        return -EINVAL;
    }
    if (h[1] != GOLDEN_VERSION) {
        snprintf(why, whylen, "version %d, this test reads %d: rerun scripts/make-golden", h[1],
                 GOLDEN_VERSION);
        return -EINVAL;
    }
    g->cfg = (struct kern_config){.layers = h[2], .channels = h[3], .heads = h[4],
                                  .vocab = h[5], .seq_len = h[6]};
    g->B = h[7];
    g->nsteps = h[8];
    g->ntensors = h[9];
    if (kern_config_check(&g->cfg) < 0 || g->B <= 0 || g->nsteps != 2 || h[10] != GOLDEN_NAME_LEN ||
        h[11] != GOLDEN_HYPER || g->ntensors <= 0 || g->ntensors > GOLDEN_MAX_TENSORS) {
        snprintf(why, whylen, "bad shapes in header (L %d C %d NH %d V %d T %d B %d steps %d "
                 "tensors %d)", h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]);
        return -EINVAL;
    }
    double hy[GOLDEN_HYPER];
    memcpy(hy, buf + GOLDEN_HEADER_INTS * 4, sizeof(hy));
    g->lr[0] = hy[0];
    g->lr[1] = hy[1];
    g->beta1 = hy[2];
    g->beta2 = hy[3];
    g->eps = hy[4];
    g->weight_decay = hy[5];
    g->grad_clip = hy[6];
    if (len < table_at + (size_t)g->ntensors * GOLDEN_ENTRY_BYTES) {
        snprintf(why, whylen, "file ends inside the tensor table");
        return -EINVAL;
    }
    g->t = st_calloc((size_t)g->ntensors, sizeof(*g->t));
    if (!g->t)
        return -ENOMEM;
    for (int i = 0; i < g->ntensors; i++) {
        const char *e = buf + table_at + (size_t)i * GOLDEN_ENTRY_BYTES;
        struct golden_tensor *t = &g->t[i];
        int32_t iv[6];
        int64_t off, numel;
        memcpy(t->name, e, GOLDEN_NAME_LEN);
        t->name[GOLDEN_NAME_LEN - 1] = '\0';
        memcpy(iv, e + GOLDEN_NAME_LEN, sizeof(iv));
        memcpy(&off, e + GOLDEN_NAME_LEN + 24, 8);
        memcpy(&numel, e + GOLDEN_NAME_LEN + 32, 8);
        t->dtype = iv[0];
        t->ndim = iv[1];
        size_t prod = 1;
        for (int k = 0; k < 4; k++) {
            t->shape[k] = iv[2 + k];
            prod *= (size_t)(iv[2 + k] > 0 ? iv[2 + k] : 0);
        }
        if ((t->dtype != 0 && t->dtype != 1) || t->ndim < 1 || t->ndim > 4 || numel < 0 ||
            (size_t)numel != prod || off < 0 || (size_t)off > len ||
            (size_t)numel > (len - (size_t)off) / 4 || off % 4 != 0) {
            snprintf(why, whylen, "tensor %d ('%s') has a bad entry or lies outside the file", i,
                     t->name);
            return -EINVAL;
        }
        t->data = buf + off;
        t->numel = (size_t)numel;
    }
    g->buf = buf;
    g->len = len;
    return 0;
}

static int golden_load(struct golden *g) {
    const char *src = getenv("SPOTTRAIN_SRCDIR");
    char path[PATH_MAX], why[256];
    snprintf(path, sizeof(path), "%s/tests/golden/gpt-tiny.bin", src ? src : ".");
    char *buf = NULL;
    size_t len = 0;
    int r = st_read_file(path, 64u << 20, &buf, &len);
    if (r < 0) {
        fprintf(stderr, "  cannot read '%s': %s\n", path, st_strerror(r));
        return r;
    }
    r = golden_parse(g, buf, len, why, sizeof(why));
    if (r < 0) {
        fprintf(stderr, "  '%s': %s\n", path, why);
        st_free(buf);
        golden_done(g);
    }
    return r;
}

static const struct golden_tensor *golden_find(const struct golden *g, const char *name) {
    for (int i = 0; i < g->ntensors; i++)
        if (strcmp(g->t[i].name, name) == 0)
            return &g->t[i];
    fprintf(stderr, "  golden file has no tensor '%s'\n", name);
    return NULL;
}

/* llm.c validate_result: counts elements outside ATOL + RTOL |ref| (only where mask is
 * NULL or non-zero), prints the first five and the largest difference. Returns the count. */
static long check_close(const char *what, const float *ours, const float *ref, size_t n,
                        const unsigned char *mask) {
    long bad = 0;
    double maxd = 0, maxrel = 0;
    for (size_t i = 0; i < n; i++) {
        if (mask && !mask[i])
            continue;
        double d = fabs((double)ours[i] - (double)ref[i]);
        maxd = fmax(maxd, d);
        maxrel = fmax(maxrel, d / fmax(fabs((double)ref[i]), 1e-30));
        if (!(d <= ATOL + RTOL * fabs((double)ref[i]))) {
            if (bad < 5)
                fprintf(stderr, "  %s[%zu]: ours %.9g, torch %.9g (diff %.3g)\n", what, i,
                        ours[i], ref[i], d);
            bad++;
        }
    }
    if (bad)
        fprintf(stderr, "  %s: %ld of %zu outside atol %g + rtol %g; max |diff| %.3g\n", what,
                bad, n, (double)ATOL, (double)RTOL, maxd);
    return bad;
}

/* ---- the model, driven through kernels.h's layer API ---------------------------------- */

struct model {
    struct kern_config cfg;
    int B, nl;
    float *params[GOLDEN_MAX_LAYERS]; /* per layer */
    float *grads[GOLDEN_MAX_LAYERS];
    float *m[GOLDEN_MAX_LAYERS], *v[GOLDEN_MAX_LAYERS];
    float *acts[GOLDEN_MAX_LAYERS];
    float *x[GOLDEN_MAX_LAYERS]; /* layer outputs, (B,T,C) */
    float *scratch, *dx, *dy, *logits, *probs, *losses;
    int *inp, *tgt;
    int t; /* AdamW steps taken */
};

static void model_done(struct model *mo) {
    for (int l = 0; l < mo->nl; l++) {
        st_free(mo->params[l]);
        st_free(mo->grads[l]);
        st_free(mo->m[l]);
        st_free(mo->v[l]);
        st_free(mo->acts[l]);
        st_free(mo->x[l]);
    }
    st_free(mo->scratch);
    st_free(mo->dx);
    st_free(mo->dy);
    st_free(mo->logits);
    st_free(mo->probs);
    st_free(mo->losses);
    st_free(mo->inp);
    st_free(mo->tgt);
    memset(mo, 0, sizeof(*mo));
}

/* Copies tensors "<prefix>.L<l>.<name>" from the golden file into per-layer vectors. */
static int load_layers(const struct golden *g, const char *prefix, float **dst) {
    for (int l = 0; l < kern_num_layers(&g->cfg); l++) {
        for (int k = 0; k < kern_layer_tensor_count(&g->cfg, l); k++) {
            struct kern_tensor_info ti;
            char name[96];
            ASSERT_OK(kern_layer_tensor(&g->cfg, l, k, &ti));
            snprintf(name, sizeof(name), "%s.L%d.%s", prefix, l, ti.name);
            const struct golden_tensor *t = golden_find(g, name);
            ASSERT_TRUE(t != NULL);
            ASSERT_EQ(t->dtype, 0);
            ASSERT_EQ(t->numel, ti.numel);
            ASSERT_EQ(t->shape[0], ti.shape[0]);
            memcpy(dst[l] + ti.offset, t->data, ti.numel * sizeof(float));
        }
    }
    return 0;
}

static int model_init(struct model *mo, const struct golden *g) {
    memset(mo, 0, sizeof(*mo));
    mo->cfg = g->cfg;
    mo->B = g->B;
    mo->nl = kern_num_layers(&g->cfg);
    ASSERT_LE(mo->nl, GOLDEN_MAX_LAYERS);
    size_t BT = (size_t)g->B * g->cfg.seq_len, BTC = BT * g->cfg.channels;
    for (int l = 0; l < mo->nl; l++) {
        size_t n = kern_layer_param_count(&g->cfg, l);
        ASSERT_GT(n, 0);
        mo->params[l] = st_calloc(n, sizeof(float));
        mo->grads[l] = st_calloc(n, sizeof(float));
        mo->m[l] = st_calloc(n, sizeof(float));
        mo->v[l] = st_calloc(n, sizeof(float));
        mo->acts[l] = st_calloc(kern_layer_act_count(&g->cfg, l, g->B) + 1, sizeof(float));
        mo->x[l] = st_calloc(BTC, sizeof(float));
        ASSERT_TRUE(mo->params[l] && mo->grads[l] && mo->m[l] && mo->v[l] && mo->acts[l] &&
                    mo->x[l]);
    }
    mo->scratch = st_calloc(kern_scratch_count(&g->cfg, g->B), sizeof(float));
    mo->dx = st_calloc(BTC, sizeof(float));
    mo->dy = st_calloc(BTC, sizeof(float));
    mo->logits = st_calloc(BT * g->cfg.vocab, sizeof(float));
    mo->probs = st_calloc(BT * g->cfg.vocab, sizeof(float));
    mo->losses = st_calloc(BT, sizeof(float));
    mo->inp = st_calloc(BT, sizeof(int));
    mo->tgt = st_calloc(BT, sizeof(int));
    ASSERT_TRUE(mo->scratch && mo->dx && mo->dy && mo->logits && mo->probs && mo->losses &&
                mo->inp && mo->tgt);
    return load_layers(g, "p0", mo->params);
}

/* Loads batch `step` (tokens (steps, B, T+1)) into inp/tgt. */
static int set_batch(struct model *mo, const struct golden *g, int step) {
    const struct golden_tensor *t = golden_find(g, "tokens");
    ASSERT_TRUE(t != NULL);
    int T = g->cfg.seq_len;
    ASSERT_EQ(t->dtype, 1);
    ASSERT_EQ(t->numel, (size_t)g->nsteps * g->B * (T + 1));
    const int32_t *tok = t->data;
    for (int b = 0; b < g->B; b++)
        for (int i = 0; i < T; i++) {
            const int32_t *row = tok + ((size_t)step * g->B + b) * (T + 1);
            ASSERT_TRUE(row[i] >= 0 && row[i] < g->cfg.vocab && row[i + 1] < g->cfg.vocab);
            mo->inp[b * T + i] = row[i];
            mo->tgt[b * T + i] = row[i + 1];
        }
    return 0;
}

/* Forward and backward of the current batch: grads zeroed then filled, logits kept, mean
 * loss returned through *ret_loss. */
static int fwd_bwd(struct model *mo, double *ret_loss) {
    const struct kern_config *c = &mo->cfg;
    int L = c->layers, B = mo->B;
    size_t BT = (size_t)B * c->seq_len;
    for (int l = 0; l < mo->nl; l++)
        memset(mo->grads[l], 0, kern_layer_param_count(c, l) * sizeof(float));
    ASSERT_OK(kern_layer_forward(c, 0, mo->params[0], B, mo->inp, NULL, mo->x[0], mo->acts[0],
                                 mo->scratch));
    for (int l = 1; l <= L + 1; l++)
        ASSERT_OK(kern_layer_forward(c, l, mo->params[l], B, NULL, mo->x[l - 1], mo->x[l],
                                     mo->acts[l], mo->scratch));
    kern_matmul_forward(mo->logits, mo->x[L + 1], mo->params[0], NULL, B, c->seq_len,
                        c->channels, c->vocab);
    double sum = 0;
    ASSERT_OK(kern_head_forward_backward(c, mo->params[0], B, mo->x[L + 1], mo->tgt,
                                         (float)(1.0 / (double)BT), mo->probs, mo->losses,
                                         mo->grads[0], mo->dx, &sum));
    float *dout = mo->dx, *din = mo->dy;
    for (int l = L + 1; l >= 1; l--) {
        ASSERT_OK(kern_layer_backward(c, l, mo->params[l], mo->grads[l], B, NULL, mo->x[l - 1],
                                      mo->acts[l], dout, din, mo->scratch));
        float *tmp = dout;
        dout = din;
        din = tmp;
    }
    ASSERT_OK(kern_layer_backward(c, 0, mo->params[0], mo->grads[0], B, mo->inp, NULL,
                                  mo->acts[0], dout, NULL, mo->scratch));
    *ret_loss = sum / (double)BT;
    return 0;
}

/* Global-norm clipping and one AdamW step from the gradients in mo->grads, the way the
 * worker does it: accumulate in double, norm over layers/tensors/elements in order, round
 * once with the clip factor applied. */
static int clip_and_step(struct model *mo, const struct golden *g, int step, double *ret_norm) {
    const struct kern_config *c = &mo->cfg;
    double sumsq = 0;
    double *acc[GOLDEN_MAX_LAYERS];
    for (int l = 0; l < mo->nl; l++) {
        size_t n = kern_layer_param_count(c, l);
        acc[l] = st_calloc(n, sizeof(double));
        ASSERT_TRUE(acc[l] != NULL);
        kern_accumulate_f64(acc[l], mo->grads[l], n);
        sumsq += kern_sumsq_f64(acc[l], n);
    }
    double norm = sqrt(sumsq), scale = kern_clip_scale(norm, g->grad_clip);
    mo->t++;
    for (int l = 0; l < mo->nl; l++) {
        size_t n = kern_layer_param_count(c, l);
        kern_round_scaled(mo->grads[l], acc[l], n, scale);
        st_free(acc[l]);
        for (int k = 0; k < kern_layer_tensor_count(c, l); k++) {
            struct kern_tensor_info ti;
            ASSERT_OK(kern_layer_tensor(c, l, k, &ti));
            kern_adamw(mo->params[l] + ti.offset, mo->grads[l] + ti.offset, mo->m[l] + ti.offset,
                       mo->v[l] + ti.offset, ti.numel, (float)g->lr[step], (float)g->beta1,
                       (float)g->beta2, (float)g->eps, ti.decay ? (float)g->weight_decay : 0.0f,
                       mo->t);
        }
    }
    *ret_norm = norm;
    return 0;
}

/* Compares every layer's vector with the golden tensors "<prefix>.L<l>.<name>"; when masked,
 * elements whose gradient is below COND_MIN in either step are checked only against a bound
 * on how far AdamW can move them (see README). Returns the number of mismatches. */
static long compare_layers(const struct golden *g, float **ours, const char *prefix,
                           int masked) {
    long bad = 0;
    for (int l = 0; l < kern_num_layers(&g->cfg); l++) {
        for (int k = 0; k < kern_layer_tensor_count(&g->cfg, l); k++) {
            struct kern_tensor_info ti;
            char name[96], gname[96];
            kern_layer_tensor(&g->cfg, l, k, &ti);
            snprintf(name, sizeof(name), "%s.L%d.%s", prefix, l, ti.name);
            const struct golden_tensor *t = golden_find(g, name);
            if (!t || t->numel != ti.numel)
                return bad + 1;
            unsigned char *mask = NULL;
            if (masked) {
                mask = st_calloc(ti.numel, 1);
                if (!mask)
                    return bad + 1;
                memset(mask, 1, ti.numel);
                for (int s = 1; s <= 2; s++) {
                    snprintf(gname, sizeof(gname), "g%d.L%d.%s", s, l, ti.name);
                    const struct golden_tensor *gt = golden_find(g, gname);
                    if (!gt) {
                        st_free(mask);
                        return bad + 1;
                    }
                    const float *gv = gt->data;
                    for (size_t i = 0; i < ti.numel; i++)
                        if (fabsf(gv[i]) < COND_MIN)
                            mask[i] = 0;
                }
                const float *ref = t->data;
                double bound = 2.0 * (g->lr[0] + g->lr[1]);
                for (size_t i = 0; i < ti.numel; i++)
                    if (!mask[i] && !(fabs(ours[l][ti.offset + i] - ref[i]) <= bound)) {
                        fprintf(stderr, "  %s[%zu] (gradient below %g): ours %.9g, torch %.9g "
                                "moved further than AdamW can\n", name, i, COND_MIN,
                                ours[l][ti.offset + i], ref[i]);
                        bad++;
                    }
            }
            bad += check_close(name, ours[l] + ti.offset, t->data, ti.numel, mask);
            st_free(mask);
        }
    }
    return bad;
}

/* ---- tests ---------------------------------------------------------------------------- */

static int test_header(void) {
    struct golden g;
    ASSERT_OK(golden_load(&g));
    ASSERT_EQ(g.cfg.layers, 2);
    ASSERT_EQ(g.cfg.channels, 32);
    ASSERT_EQ(g.cfg.heads, 4);
    ASSERT_EQ(g.cfg.vocab, 64);
    ASSERT_EQ(g.cfg.seq_len, 16);
    ASSERT_EQ(g.B, 4);
    ASSERT_TRUE(g.lr[0] > 0 && g.lr[1] > 0 && g.grad_clip > 0);
    /* Corrupted copies are refused with a hint. */
    char why[256];
    struct golden h;
    char *copy = st_malloc(g.len);
    ASSERT_TRUE(copy != NULL);
    int32_t bad_magic = 1234, bad_version = 99, bad_layers = 0, huge = 1 << 30;
    memcpy(copy, g.buf, g.len);
    memcpy(copy, &bad_magic, 4);
    ASSERT_ERR(golden_parse(&h, copy, g.len, why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "bad magic 1234");
    st_free(h.t);
    memcpy(copy, g.buf, g.len);
    memcpy(copy + 4, &bad_version, 4);
    ASSERT_ERR(golden_parse(&h, copy, g.len, why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "rerun scripts/make-golden");
    st_free(h.t);
    memcpy(copy, g.buf, g.len);
    memcpy(copy + 8, &bad_layers, 4);
    ASSERT_ERR(golden_parse(&h, copy, g.len, why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "bad shapes");
    st_free(h.t);
    memcpy(copy, g.buf, g.len);
    ASSERT_ERR(golden_parse(&h, copy, 100, why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "shorter than");
    ASSERT_ERR(golden_parse(&h, copy, 1024 + 256 + 10, why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "tensor table");
    /* First entry's numel made huge: it would reach past the end of the file. */
    size_t entry0 = 1024 + 256;
    int64_t off;
    memcpy(&off, copy + entry0 + 48 + 24, 8);
    memcpy(copy + entry0 + 48 + 8, &huge, 4);
    ASSERT_ERR(golden_parse(&h, copy, g.len, why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "outside the file");
    st_free(h.t);
    st_free(copy);
    golden_done(&g);
    return 0;
}

static int test_forward(void) {
    struct golden g;
    struct model mo;
    double loss;
    ASSERT_OK(golden_load(&g));
    int r = model_init(&mo, &g);
    if (r == 0)
        r = set_batch(&mo, &g, 0);
    if (r == 0)
        r = fwd_bwd(&mo, &loss);
    if (r == 0) {
        const struct golden_tensor *lg = golden_find(&g, "logits"), *ls = golden_find(&g, "loss");
        size_t n = (size_t)g.B * g.cfg.seq_len * g.cfg.vocab;
        if (!lg || !ls || lg->numel != n)
            r = 1;
        else if (check_close("logits", mo.logits, lg->data, n, NULL) > 0)
            r = 1;
        else {
            float l32 = (float)loss;
            if (check_close("loss", &l32, ls->data, 1, NULL) > 0)
                r = 1;
        }
    }
    model_done(&mo);
    golden_done(&g);
    return r;
}

static int test_backward(void) {
    struct golden g;
    struct model mo;
    double loss;
    ASSERT_OK(golden_load(&g));
    int r = model_init(&mo, &g);
    if (r == 0)
        r = set_batch(&mo, &g, 0);
    if (r == 0)
        r = fwd_bwd(&mo, &loss);
    if (r == 0 && compare_layers(&g, mo.grads, "g1", 0) > 0)
        r = 1;
    model_done(&mo);
    golden_done(&g);
    return r;
}

/* AdamW alone: PyTorch's own gradients in, both steps, parameters compared everywhere. */
static int test_adamw(void) {
    struct golden g;
    struct model mo;
    double norm;
    ASSERT_OK(golden_load(&g));
    int r = model_init(&mo, &g);
    const struct golden_tensor *gn = r == 0 ? golden_find(&g, "gradnorm") : NULL;
    for (int s = 0; s < 2 && r == 0; s++) {
        char prefix[8];
        snprintf(prefix, sizeof(prefix), "g%d", s + 1);
        r = load_layers(&g, prefix, mo.grads);
        if (r == 0)
            r = clip_and_step(&mo, &g, s, &norm);
        float n32 = (float)norm;
        if (r == 0 && (!gn || check_close("gradnorm", &n32, (const float *)gn->data + s, 1,
                                          NULL) > 0))
            r = 1;
        snprintf(prefix, sizeof(prefix), "p%d", s + 1);
        if (r == 0 && compare_layers(&g, mo.params, prefix, 0) > 0)
            r = 1;
        /* Step 2 starts from PyTorch's p1 so that only this step's error is measured. */
        if (r == 0)
            r = load_layers(&g, prefix, mo.params);
    }
    model_done(&mo);
    golden_done(&g);
    return r;
}

/* Two whole training steps through the layer API, nothing taken from PyTorch but the
 * initial parameters and the batches. */
static int test_two_steps(void) {
    struct golden g;
    struct model mo;
    double loss, norm;
    ASSERT_OK(golden_load(&g));
    int r = model_init(&mo, &g);
    const struct golden_tensor *ls = r == 0 ? golden_find(&g, "loss") : NULL;
    const struct golden_tensor *gn = r == 0 ? golden_find(&g, "gradnorm") : NULL;
    if (!ls || !gn)
        r = 1;
    for (int s = 0; s < 2 && r == 0; s++) {
        char prefix[8];
        r = set_batch(&mo, &g, s);
        if (r == 0)
            r = fwd_bwd(&mo, &loss);
        snprintf(prefix, sizeof(prefix), "g%d", s + 1);
        if (r == 0 && compare_layers(&g, mo.grads, prefix, 0) > 0)
            r = 1;
        if (r == 0)
            r = clip_and_step(&mo, &g, s, &norm);
        float l32 = (float)loss, n32 = (float)norm;
        if (r == 0 && (check_close("loss", &l32, (const float *)ls->data + s, 1, NULL) > 0 ||
                       check_close("gradnorm", &n32, (const float *)gn->data + s, 1, NULL) > 0))
            r = 1;
        snprintf(prefix, sizeof(prefix), "p%d", s + 1);
        if (r == 0 && compare_layers(&g, mo.params, prefix, 1) > 0)
            r = 1;
    }
    model_done(&mo);
    golden_done(&g);
    return r;
}

TEST_MAIN(TEST(test_header), TEST(test_forward), TEST(test_backward), TEST(test_adamw),
          TEST(test_two_steps))
