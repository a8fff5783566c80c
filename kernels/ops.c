/* ops.c: CPU reference of the GPT-2 ops — forward and backward of each building block.
 *
 * llm.c's train_gpt2.c structure, with matrix products through CBLAS (OpenBLAS). The one idea:
 * every output element is computed by exactly one thread in a fixed order, and every
 * parameter-gradient reduction runs in a fixed (row) order, so results do not depend on the
 * thread count. That is what lets different pipeline shapes agree bitwise. */
#include <cblas.h> /* cblas_sgemm, openblas_{get,set}_num_threads */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "ops-internal.h"

#define GELU_SCALING_FACTOR 0.7978845608028654f /* sqrt(2 / pi) */
/* Parallel only when a loop has enough work to pay for waking threads (same result either
 * way: each element is still computed by one thread in the same order). */
#define KERN_PAR(work) ((work) >= (size_t)1 << 16)

/* ---- threading and matrix products ----------------------------------------------------
 *
 * All parallelism is OpenMP. A matrix product is cut into a FIXED set of output blocks (a
 * function of the shape only, never of the thread count); each block is one single-threaded
 * OpenBLAS call that sums the whole inner dimension. So every output element is computed the
 * same way whatever the thread count. Blocks are handed out dynamically: which thread
 * computes a block changes nothing in it (no block is a partial sum of another), and on a
 * busy machine the thread that has the CPU takes more of them. OpenBLAS's own pthread pool
 * stays idle (its thread count is dropped to 1 while our threads call it): two pools on the
 * same cores, one spinning while the other works, made 2 threads slower than 1 on a busy
 * 2-core machine. */

/* Drops OpenBLAS to one thread while our OpenMP threads call it; returns what to restore. */
static int blas_single_begin(void) {
    int n = openblas_get_num_threads();
    if (n > 1)
        openblas_set_num_threads(1);
    return n;
}

static void blas_single_end(int n) {
    if (n > 1)
        openblas_set_num_threads(n);
}

/* Row-major C (M x N) = alpha op(A) op(B) + beta C, cut along the larger of M and N into
 * nch fixed blocks, nch a power of two (even shares for 2, 4, 8, 16 threads): enough blocks
 * to balance threads, few enough that re-packing the other operand (once per block) stays
 * small next to the block's arithmetic (at most 16 blocks, fewer when K is large). */
static void gemm_blocks(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K,
                        float alpha, const float *A, int lda, const float *Bm, int ldb,
                        float beta, float *Cm, int ldc) {
    int split_m = M >= N;
    long dim = split_m ? M : N;
    long lim = dim / 128;
    long by_k = 16 * dim / (K > 0 ? K : 1); /* large K: re-packing is the dominant cost */
    if (lim > by_k)
        lim = by_k;
    if (lim < 2)
        lim = dim >= 256 ? 2 : 1;
    long nch = 1;
    while (nch * 2 <= lim && nch < 16)
        nch *= 2;
    int nb = blas_single_begin();
#pragma omp parallel for schedule(dynamic, 1) if (nch > 1 && KERN_PAR((size_t)M * N * K / 64))
    for (long i = 0; i < nch; i++) {
        int lo = (int)(i * dim / nch), hi = (int)((i + 1) * dim / nch);
        if (split_m) {
            const float *a = A + (ta == CblasNoTrans ? (size_t)lo * lda : (size_t)lo);
            cblas_sgemm(CblasRowMajor, ta, tb, hi - lo, N, K, alpha, a, lda, Bm, ldb, beta,
                        Cm + (size_t)lo * ldc, ldc);
        } else {
            const float *b = Bm + (tb == CblasNoTrans ? (size_t)lo : (size_t)lo * ldb);
            cblas_sgemm(CblasRowMajor, ta, tb, M, hi - lo, K, alpha, A, lda, b, ldb, beta,
                        Cm + lo, ldc);
        }
    }
    blas_single_end(nb);
}

/* exp for float without a libm call: 2^n p(r) with n = round(x / ln 2) and a degree-6
 * polynomial on |r| <= ln2/2 (about 1 ulp). Below -87.33 gives 0, above 88 is clamped
 * (callers take exp of x - max <= 0, or saturate through tanh). Written on 4-float GCC
 * vectors (one SSE register on baseline x86-64); the scalar form is the same arithmetic for
 * loop tails. Row loops keep 8 lanes (two vectors) and add them in a fixed tree, so a sum's
 * order depends on the row length only. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline v4f v4_load(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline void v4_store(float *p, v4f v) { memcpy(p, &v, sizeof(v)); }

static inline v4f v4_sel(v4i m, v4f a, v4f b) { return (v4f)((m & (v4i)a) | (~m & (v4i)b)); }

static inline v4f kexpf4(v4f x) {
    const v4f hi = {88.0f, 88.0f, 88.0f, 88.0f};
    const v4f lo = {-87.0f, -87.0f, -87.0f, -87.0f};
    const v4f zlim = {-87.33654f, -87.33654f, -87.33654f, -87.33654f};
    v4f xc = v4_sel(x > hi, hi, x);
    xc = v4_sel(xc < lo, lo, xc);
    v4f t = xc * 1.44269504088896341f;
    v4f n = (t + 12582912.0f) - 12582912.0f; /* round to nearest (1.5 * 2^23 trick) */
    v4f r = xc - n * 0.693145751953125f;
    r = r - n * 1.428606765330187e-06f;
    v4f p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f +
                        r * (4.1666668e-2f + r * (8.3333338e-3f + r * 1.3888889e-3f)))));
    v4i e = (__builtin_convertvector(n, v4i) + 127) << 23;
    v4f y = p * (v4f)e;
    return v4_sel(x < zlim, (v4f){0}, y);
}

static inline float kexpf(float x) {
    float xc = x > 88.0f ? 88.0f : x;
    xc = xc < -87.0f ? -87.0f : xc;
    float t = xc * 1.44269504088896341f;
    float n = (t + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693145751953125f;
    r = r - n * 1.428606765330187e-06f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f +
                        r * (4.1666668e-2f + r * (8.3333338e-3f + r * 1.3888889e-3f)))));
    union { int32_t i; float f; } sc;
    sc.i = ((int32_t)n + 127) << 23;
    float y = p * sc.f;
    return x < -87.33654f ? 0.0f : y;
}

/* Sum of 8 lanes (a: 0..3, b: 4..7) in a fixed tree. */
static inline float v4_sum2(v4f a, v4f b) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((b[0] + b[1]) + (b[2] + b[3]));
}

/* max of x[0..n) (n >= 1) (exact: max does not round, so lanes change nothing). */
static float row_max(const float *x, int n) {
    v4f m = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        v4f v = v4_load(x + i);
        m = v4_sel(v > m, v, m);
    }
    float r = m[0];
    for (int j = 1; j < 4; j++)
        r = m[j] > r ? m[j] : r;
    for (; i < n; i++)
        r = x[i] > r ? x[i] : r;
    return r;
}

/* out[i] = exp(x[i] - mx); returns the sum (8 lanes, fixed tree, then the tail in order).
 * out may equal x. */
static float row_exp_sum(float *out, const float *x, int n, float mx) {
    v4f s0 = {0}, s1 = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v4f e0 = kexpf4(v4_load(x + i) - mx), e1 = kexpf4(v4_load(x + i + 4) - mx);
        v4_store(out + i, e0);
        v4_store(out + i + 4, e1);
        s0 += e0;
        s1 += e1;
    }
    float r = v4_sum2(s0, s1);
    for (; i < n; i++) {
        float e = kexpf(x[i] - mx);
        out[i] = e;
        r += e;
    }
    return r;
}

/* sum of a[i] * b[i], same lane order as row_exp_sum. */
static float row_dot(const float *a, const float *b, int n) {
    v4f s0 = {0}, s1 = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 += v4_load(a + i) * v4_load(b + i);
        s1 += v4_load(a + i + 4) * v4_load(b + i + 4);
    }
    float r = v4_sum2(s0, s1);
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

void kern_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                          int T, int C) {
#pragma omp parallel for collapse(2) if (KERN_PAR((size_t)B * T * C))
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float *out_bt = out + ((size_t)b * T + t) * C;
            const float *wte_ix = wte + (size_t)inp[b * T + t] * C;
            const float *wpe_t = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++)
                out_bt[i] = wte_ix[i] + wpe_t[i];
        }
    }
}

void kern_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                           int T, int C) {
    /* Rows of dwte can repeat (same token twice), so the (b,t) loop stays sequential; the
     * channel loop is split across threads, which keeps each element's order fixed. */
#pragma omp parallel for if (KERN_PAR((size_t)B * T * C))
    for (int i = 0; i < C; i++) {
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const float *dout_bt = dout + ((size_t)b * T + t) * C;
                dwte[(size_t)inp[b * T + t] * C + i] += dout_bt[i];
                dwpe[(size_t)t * C + i] += dout_bt[i];
            }
        }
    }
}

void kern_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int B, int T, int C) {
    const float eps = 1e-5f;
    int N = B * T;
#pragma omp parallel for if (KERN_PAR((size_t)N * C))
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float m = 0.0f;
        for (int i = 0; i < C; i++)
            m += x[i];
        m = m / C;
        float v = 0.0f;
        for (int i = 0; i < C; i++) {
            float xshift = x[i] - m;
            v += xshift * xshift;
        }
        v = v / C;
        float s = 1.0f / sqrtf(v + eps);
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++)
            o[i] = (s * (x[i] - m)) * weight[i] + bias[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void kern_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int B, int T, int C) {
    int N = B * T;
#pragma omp parallel for if (KERN_PAR((size_t)N * C))
    for (int n = 0; n < N; n++) {
        const float *dout_n = dout + (size_t)n * C;
        const float *inp_n = inp + (size_t)n * C;
        float *dinp_n = dinp + (size_t)n * C;
        float mean_n = mean[n], rstd_n = rstd[n];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int i = 0; i < C; i++) {
            float norm_i = (inp_n[i] - mean_n) * rstd_n;
            float dnorm_i = weight[i] * dout_n[i];
            dnorm_mean += dnorm_i;
            dnorm_norm_mean += dnorm_i * norm_i;
        }
        dnorm_mean = dnorm_mean / C;
        dnorm_norm_mean = dnorm_norm_mean / C;
        for (int i = 0; i < C; i++) {
            float norm_i = (inp_n[i] - mean_n) * rstd_n;
            float dnorm_i = weight[i] * dout_n[i];
            float dval = dnorm_i - dnorm_mean - norm_i * dnorm_norm_mean;
            dinp_n[i] += dval * rstd_n;
        }
    }
    /* Parameter gradients: rows in order, channels across threads. */
#pragma omp parallel for if (KERN_PAR((size_t)N * C))
    for (int i = 0; i < C; i++) {
        float dw = dweight[i], db = dbias[i];
        for (int n = 0; n < N; n++) {
            float norm_i = (inp[(size_t)n * C + i] - mean[n]) * rstd[n];
            float d = dout[(size_t)n * C + i];
            db += d;
            dw += norm_i * d;
        }
        dweight[i] = dw;
        dbias[i] = db;
    }
}

void kern_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int B, int T, int C, int OC) {
    int N = B * T;
    if (bias) {
#pragma omp parallel for if (KERN_PAR((size_t)N * OC))
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
    }
    gemm_blocks(CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, bias ? 1.0f : 0.0f,
                out, OC);
}

void kern_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int B, int T, int C, int OC) {
    int N = B * T;
    if (dinp) /* dinp (N, C) += dout (N, OC) @ weight (OC, C) */
        gemm_blocks(CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp,
                    C);
    /* dweight (OC, C) += dout^T (OC, N) @ inp (N, C) */
    gemm_blocks(CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) {
        /* Column sums in row order, 64 columns at a time (contiguous reads). */
        int nblk = (OC + 63) / 64;
#pragma omp parallel for schedule(static) if (KERN_PAR((size_t)N * OC))
        for (int blk = 0; blk < nblk; blk++) {
            int o0 = blk * 64, w = OC - o0 < 64 ? OC - o0 : 64;
            float s[64];
            for (int j = 0; j < w; j++)
                s[j] = dbias[o0 + j];
            for (int n = 0; n < N; n++) {
                const float *d = dout + (size_t)n * OC + o0;
                for (int j = 0; j < w; j++)
                    s[j] += d[j];
            }
            for (int j = 0; j < w; j++)
                dbias[o0 + j] = s[j];
        }
    }
}

/* Attention per (batch, head) as matrix products over blocks of ATT_BLK query rows: block
 * [r0, r1) only needs keys [0, r1), so the products skip the masked upper triangle (about
 * half the work at large T). Work items are (batch, head, row block), handed out dynamically
 * (their sizes differ); each item writes only its own rows, so the schedule changes nothing
 * in the results. Entries of att above
 * the diagonal are exact zeros (written for the whole row). */
#define ATT_BLK 128

void kern_attention_forward(float *out, float *preatt, float *att, const float *inp, int B,
                            int T, int C, int NH) {
    int C3 = C * 3;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    int nrb = (T + ATT_BLK - 1) / ATT_BLK;
    long items = (long)B * NH * nrb;
    int nb = blas_single_begin();
#pragma omp parallel for schedule(dynamic, 1) if (KERN_PAR((size_t)B * NH * T * T))
    for (long it = 0; it < items; it++) {
        int bh = (int)(it / nrb), b = bh / NH, h = bh % NH;
        int r0 = (nrb - 1 - (int)(it % nrb)) * ATT_BLK; /* largest blocks first */
        int r1 = r0 + ATT_BLK < T ? r0 + ATT_BLK : T;
        const float *q = inp + (size_t)b * T * C3 + (size_t)h * hs;
        float *P = preatt + (size_t)bh * T * T;
        float *A = att + (size_t)bh * T * T;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, scale,
                    q + (size_t)r0 * C3, C3, q + C, C3, 0.0f, P + (size_t)r0 * T, T);
        for (int t = r0; t < r1; t++) {
            const float *p = P + (size_t)t * T;
            float *a = A + (size_t)t * T;
            float maxval = row_max(p, t + 1);
            float expsum = row_exp_sum(a, p, t + 1, maxval);
            float inv = expsum == 0.0f ? 0.0f : 1.0f / expsum;
            for (int t2 = 0; t2 <= t; t2++)
                a[t2] *= inv;
            if (t + 1 < T)
                memset(a + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, 1.0f,
                    A + (size_t)r0 * T, T, q + 2 * C, C3, 0.0f,
                    out + ((size_t)b * T + r0) * C + (size_t)h * hs, C);
    }
    blas_single_end(nb);
}

void kern_attention_backward(float *dinp, float *dpreatt, float *datt, const float *dout,
                             const float *inp, const float *att, int B, int T, int C, int NH) {
    int C3 = C * 3;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    int nrb = (T + ATT_BLK - 1) / ATT_BLK;
    long items = (long)B * NH * nrb;
    int nb = blas_single_begin();
    /* Phase 1, per (batch, head, row block [r0, r1)): dA = dO V^T on keys [0, r1), the
     * softmax backward dP = A * (dA - sum(A * dA)) (0 above the diagonal), dQ += scale dP K. */
#pragma omp parallel for schedule(dynamic, 1) if (KERN_PAR((size_t)B * NH * T * T))
    for (long it = 0; it < items; it++) {
        int bh = (int)(it / nrb), b = bh / NH, h = bh % NH;
        int r0 = (nrb - 1 - (int)(it % nrb)) * ATT_BLK; /* largest blocks first */
        int r1 = r0 + ATT_BLK < T ? r0 + ATT_BLK : T;
        size_t off = (size_t)b * T * C3 + (size_t)h * hs;
        const float *k = inp + off + C, *v = inp + off + 2 * C;
        float *dq = dinp + off;
        const float *A = att + (size_t)bh * T * T;
        float *dA = datt + (size_t)bh * T * T;
        float *dP = dpreatt + (size_t)bh * T * T;
        const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, 1.0f,
                    dO + (size_t)r0 * C, C, v, C3, 0.0f, dA + (size_t)r0 * T, T);
        for (int t = r0; t < r1; t++) {
            const float *a = A + (size_t)t * T, *da = dA + (size_t)t * T;
            float *dp = dP + (size_t)t * T;
            float dot = row_dot(a, da, t + 1);
            for (int t2 = 0; t2 <= t; t2++)
                dp[t2] = a[t2] * (da[t2] - dot);
            for (int t2 = t + 1; t2 < r1; t2++)
                dp[t2] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, scale,
                    dP + (size_t)r0 * T, T, k, C3, 1.0f, dq + (size_t)r0 * C3, C3);
    }
    /* Phase 2, per (batch, head, key block [c0, c1)): only queries [c0, T) see these keys:
     * dV += A^T dO and dK += scale dP^T Q over those rows. */
#pragma omp parallel for schedule(dynamic, 1) if (KERN_PAR((size_t)B * NH * T * T))
    for (long it = 0; it < items; it++) {
        int bh = (int)(it / nrb), b = bh / NH, h = bh % NH;
        int c0 = (int)(it % nrb) * ATT_BLK; /* largest blocks (most query rows) first */
        int c1 = c0 + ATT_BLK < T ? c0 + ATT_BLK : T;
        size_t off = (size_t)b * T * C3 + (size_t)h * hs;
        const float *q = inp + off;
        float *dk = dinp + off + C, *dv = dinp + off + 2 * C;
        const float *A = att + (size_t)bh * T * T;
        const float *dP = dpreatt + (size_t)bh * T * T;
        const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
        size_t rc = (size_t)c0 * T + (size_t)c0;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, hs, T - c0, 1.0f, A + rc,
                    T, dO + (size_t)c0 * C, C, 1.0f, dv + (size_t)c0 * C3, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, hs, T - c0, scale,
                    dP + rc, T, q + (size_t)c0 * C3, C3, 1.0f, dk + (size_t)c0 * C3, C3);
    }
    blas_single_end(nb);
}

/* tanh through one exp (kexpf): glibc's tanhf and coshf cost several times more and GELU
 * runs on 4C channels. Saturates cleanly (kexpf's clamp at 88 gives 1, its 0 below -87.3
 * gives -1). */
static inline float fast_tanhf(float u) { return 1.0f - 2.0f / (kexpf(2.0f * u) + 1.0f); }

/* GELU forward of x[0..4) in one vector; the same arithmetic as the scalar tail. */
static inline v4f gelu4(v4f x) {
    v4f cube = 0.044715f * x * x * x;
    v4f u = GELU_SCALING_FACTOR * (x + cube);
    v4f th = 1.0f - 2.0f / (kexpf4(2.0f * u) + 1.0f);
    return 0.5f * x * (1.0f + th);
}

static inline float gelu1(float x) {
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + fast_tanhf(GELU_SCALING_FACTOR * (x + cube)));
}

/* d GELU / dx, vector and scalar forms. */
static inline v4f gelu_grad4(v4f x) {
    v4f cube = 0.044715f * x * x * x;
    v4f tanh_out = 1.0f - 2.0f / (kexpf4(2.0f * (GELU_SCALING_FACTOR * (x + cube))) + 1.0f);
    v4f sech_out = 1.0f - tanh_out * tanh_out; /* sech^2 */
    return 0.5f * (1.0f + tanh_out) +
           x * 0.5f * sech_out * GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
}

static inline float gelu_grad1(float x) {
    float cube = 0.044715f * x * x * x;
    float tanh_out = fast_tanhf(GELU_SCALING_FACTOR * (x + cube));
    float sech_out = 1.0f - tanh_out * tanh_out;
    return 0.5f * (1.0f + tanh_out) +
           x * 0.5f * sech_out * GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
}

void kern_gelu_forward(float *out, const float *inp, int N) {
    int N4 = N / 4;
#pragma omp parallel for schedule(static) if (KERN_PAR((size_t)N * 8))
    for (int k = 0; k < N4; k++)
        v4_store(out + 4 * k, gelu4(v4_load(inp + 4 * k)));
    for (int i = 4 * N4; i < N; i++)
        out[i] = gelu1(inp[i]);
}

void kern_gelu_backward(float *dinp, const float *inp, const float *dout, int N) {
    int N4 = N / 4;
#pragma omp parallel for schedule(static) if (KERN_PAR((size_t)N * 8))
    for (int k = 0; k < N4; k++) {
        v4f d = v4_load(dinp + 4 * k);
        d += gelu_grad4(v4_load(inp + 4 * k)) * v4_load(dout + 4 * k);
        v4_store(dinp + 4 * k, d);
    }
    for (int i = 4 * N4; i < N; i++)
        dinp[i] += gelu_grad1(inp[i]) * dout[i];
}

void kern_residual_forward(float *out, const float *a, const float *b, int N) {
#pragma omp parallel for if (KERN_PAR((size_t)N * 8))
    for (int i = 0; i < N; i++)
        out[i] = a[i] + b[i];
}

void kern_residual_backward(float *da, float *db, const float *dout, int N) {
#pragma omp parallel for if (KERN_PAR((size_t)N * 8))
    for (int i = 0; i < N; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

/* Softmax of one row of V logits into p (p may equal l). */
static void softmax_row(float *p, const float *l, int V) {
    float maxval = row_max(l, V);
    float sum = row_exp_sum(p, l, V, maxval);
    float inv = 1.0f / sum;
    for (int i = 0; i < V; i++)
        p[i] *= inv;
}

void kern_softmax_crossentropy_forward(float *losses, float *probs, const float *logits,
                                       const int *targets, int N, int V) {
#pragma omp parallel for schedule(static) if (KERN_PAR((size_t)N * V))
    for (int n = 0; n < N; n++) {
        float *p = probs + (size_t)n * V;
        softmax_row(p, logits + (size_t)n * V, V);
        if (targets)
            losses[n] = -logf(p[targets[n]]);
    }
}

/* One row at a time, so the row stays in cache between its passes (ops-internal.h). */
void kern_softmax_xent_fused(float *logits, float *losses, const int *targets, float dloss,
                             int N, int V) {
#pragma omp parallel for schedule(static) if (KERN_PAR((size_t)N * V))
    for (int n = 0; n < N; n++) {
        float *p = logits + (size_t)n * V;
        int ix = targets[n];
        float maxval = row_max(p, V);
        float sum = row_exp_sum(p, p, V, maxval);
        float inv = 1.0f / sum;
        float pt = p[ix] * inv;
        losses[n] = -logf(pt);
        for (int i = 0; i < V; i++)
            p[i] = (p[i] * inv) * dloss;
        p[ix] = (pt - 1.0f) * dloss;
    }
}

void kern_softmax_crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                                        float dloss, int N, int V) {
#pragma omp parallel for if (KERN_PAR((size_t)N * V))
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * V;
        float *d = dlogits + (size_t)n * V;
        int ix = targets[n];
        for (int i = 0; i < V; i++) {
            float indicator = i == ix ? 1.0f : 0.0f;
            d[i] += (p[i] - indicator) * dloss;
        }
    }
}
