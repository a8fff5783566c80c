/* ops.c: CPU reference of the GPT-2 ops — forward and backward of each building block.
 *
 * llm.c's train_gpt2.c structure, with matrix products through CBLAS (OpenBLAS). The one idea:
 * every output element is computed by exactly one thread in a fixed order, and every
 * parameter-gradient reduction runs in a fixed (row) order, so results do not depend on the
 * thread count. That is what lets different pipeline shapes agree bitwise. */
#include <cblas.h> /* cblas_sgemm */
#include <math.h>
#include <string.h>

#include "kernels.h"

#define GELU_SCALING_FACTOR 0.7978845608028654f /* sqrt(2 / pi) */
/* Parallel only when a loop has enough work to pay for waking threads (same result either
 * way: each element is still computed by one thread in the same order). */
#define KERN_PAR(work) ((work) >= (size_t)1 << 16)

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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C,
                bias ? 1.0f : 0.0f, out, OC);
}

void kern_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int B, int T, int C, int OC) {
    int N = B * T;
    if (dinp) /* dinp (N, C) += dout (N, OC) @ weight (OC, C) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight,
                    C, 1.0f, dinp, C);
    /* dweight (OC, C) += dout^T (OC, N) @ inp (N, C) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                dweight, C);
    if (dbias) {
#pragma omp parallel for if (KERN_PAR((size_t)N * OC))
        for (int o = 0; o < OC; o++) {
            float s = dbias[o];
            for (int n = 0; n < N; n++)
                s += dout[(size_t)n * OC + o];
            dbias[o] = s;
        }
    }
}

/* Attention runs per (batch, head) as matrix products (CBLAS threads them when T is large):
 * preatt = scale * Q K^T, a causal row softmax, out = att V. Entries above the diagonal of att
 * are exact zeros, so the product adds only zeros for future positions. */
void kern_attention_forward(float *out, float *preatt, float *att, const float *inp, int B,
                            int T, int C, int NH) {
    int C3 = C * 3;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = inp + (size_t)b * T * C3 + (size_t)h * hs;
            float *P = preatt + ((size_t)b * NH + h) * T * T;
            float *A = att + ((size_t)b * NH + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, q + C,
                        C3, 0.0f, P, T);
#pragma omp parallel for if (KERN_PAR((size_t)T * T))
            for (int t = 0; t < T; t++) {
                const float *p = P + (size_t)t * T;
                float *a = A + (size_t)t * T;
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++)
                    if (p[t2] > maxval)
                        maxval = p[t2];
                float expsum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    float e = expf(p[t2] - maxval);
                    expsum += e;
                    a[t2] = e;
                }
                float inv = expsum == 0.0f ? 0.0f : 1.0f / expsum;
                for (int t2 = 0; t2 <= t; t2++)
                    a[t2] *= inv;
                for (int t2 = t + 1; t2 < T; t2++)
                    a[t2] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, A, T,
                        q + 2 * C, C3, 0.0f, out + (size_t)b * T * C + (size_t)h * hs, C);
        }
    }
}

void kern_attention_backward(float *dinp, float *dpreatt, float *datt, const float *dout,
                             const float *inp, const float *att, int B, int T, int C, int NH) {
    int C3 = C * 3;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t off = (size_t)b * T * C3 + (size_t)h * hs;
            const float *q = inp + off, *k = q + C, *v = q + 2 * C;
            float *dq = dinp + off, *dk = dq + C, *dv = dq + 2 * C;
            const float *A = att + ((size_t)b * NH + h) * T * T;
            float *dA = datt + ((size_t)b * NH + h) * T * T;
            float *dP = dpreatt + ((size_t)b * NH + h) * T * T;
            const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
            /* out = A V */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dO, C, v, C3,
                        0.0f, dA, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, A, T, dO, C,
                        1.0f, dv, C3);
            /* softmax: dP = A * (dA - sum(A * dA)) on the causal part, 0 above it */
#pragma omp parallel for if (KERN_PAR((size_t)T * T))
            for (int t = 0; t < T; t++) {
                const float *a = A + (size_t)t * T, *da = dA + (size_t)t * T;
                float *dp = dP + (size_t)t * T;
                float dot = 0.0f;
                for (int t2 = 0; t2 <= t; t2++)
                    dot += a[t2] * da[t2];
                for (int t2 = 0; t2 <= t; t2++)
                    dp[t2] = a[t2] * (da[t2] - dot);
                for (int t2 = t + 1; t2 < T; t2++)
                    dp[t2] = 0.0f;
            }
            /* P = scale Q K^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, dP, T, k, C3,
                        1.0f, dq, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, dP, T, q, C3,
                        1.0f, dk, C3);
        }
    }
}

/* tanh through one expf: glibc's tanhf and coshf cost several times more and GELU runs on
 * 4C channels. Saturates cleanly (expf overflow gives 1, underflow -1). */
static inline float fast_tanhf(float u) { return 1.0f - 2.0f / (expf(2.0f * u) + 1.0f); }

void kern_gelu_forward(float *out, const float *inp, int N) {
#pragma omp parallel for if (KERN_PAR((size_t)N * 8))
    for (int i = 0; i < N; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        out[i] = 0.5f * x * (1.0f + fast_tanhf(GELU_SCALING_FACTOR * (x + cube)));
    }
}

void kern_gelu_backward(float *dinp, const float *inp, const float *dout, int N) {
#pragma omp parallel for if (KERN_PAR((size_t)N * 8))
    for (int i = 0; i < N; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        float tanh_arg = GELU_SCALING_FACTOR * (x + cube);
        float tanh_out = fast_tanhf(tanh_arg);
        float sech_out = 1.0f - tanh_out * tanh_out; /* sech^2 */
        float local_grad = 0.5f * (1.0f + tanh_out) +
                           x * 0.5f * sech_out * GELU_SCALING_FACTOR *
                               (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += local_grad * dout[i];
    }
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

void kern_softmax_crossentropy_forward(float *losses, float *probs, const float *logits,
                                       const int *targets, int N, int V) {
#pragma omp parallel for if (KERN_PAR((size_t)N * V))
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        float *p = probs + (size_t)n * V;
        float maxval = -INFINITY;
        for (int i = 0; i < V; i++)
            if (l[i] > maxval)
                maxval = l[i];
        float sum = 0.0f;
        for (int i = 0; i < V; i++) {
            p[i] = expf(l[i] - maxval);
            sum += p[i];
        }
        float inv = 1.0f / sum;
        for (int i = 0; i < V; i++)
            p[i] *= inv;
        if (targets)
            losses[n] = -logf(p[targets[n]]);
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
