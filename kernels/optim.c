/* optim.c: AdamW, gradient-norm helpers and the learning-rate schedule.
 *
 * AdamW works on an element range so that each ZeRO-1 replica updates only its shard; the
 * update is element-wise, so a shard's result does not depend on where the shard boundaries
 * fall. The norm helpers take the double accumulators the engine keeps, in index order. */
#include <cblas.h> /* openblas_set_num_threads */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"

void kern_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                float beta1, float beta2, float eps, float wd, int t) {
    /* Same order of operations as torch.optim.AdamW (single-tensor, non-capturable):
     * decay first, then the bias-corrected Adam step. */
    float bc1 = 1.0f - powf(beta1, (float)t);
    float bc2 = 1.0f - powf(beta2, (float)t);
    float step_size = lr / bc1;
    float bc2_sqrt = sqrtf(bc2);
    float decay = 1.0f - lr * wd;
#pragma omp parallel for if (n >= (size_t)1 << 16)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        float mi = m[i] + (g - m[i]) * (1.0f - beta1); /* lerp, as torch */
        float vi = v[i] * beta2 + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        param[i] = param[i] * decay - step_size * (mi / denom);
    }
}

double kern_sumsq_f64(const double *x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += x[i] * x[i];
    return s;
}

double kern_clip_scale(double norm, double max_norm) {
    if (max_norm <= 0.0)
        return 1.0;
    double c = max_norm / (norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}

void kern_round_scaled(float *out, const double *in, size_t n, double scale) {
#pragma omp parallel for if (n >= (size_t)1 << 16)
    for (size_t i = 0; i < n; i++)
        out[i] = (float)(in[i] * scale);
}

void kern_accumulate_f64(double *acc, const float *g, size_t n) {
#pragma omp parallel for if (n >= (size_t)1 << 16)
    for (size_t i = 0; i < n; i++)
        acc[i] += (double)g[i];
}

double kern_lr(enum kern_lr_schedule schedule, double lr, int warmup, int total_steps,
               double min_ratio, int step) {
    if (step < warmup)
        return lr * (double)(step + 1) / (double)warmup;
    if (schedule == KERN_LR_CONSTANT)
        return lr;
    double min_lr = lr * min_ratio;
    int span = total_steps - warmup;
    double ratio = span > 0 ? (double)(step - warmup) / (double)span : 1.0;
    if (ratio > 1.0)
        ratio = 1.0;
    if (ratio < 0.0)
        ratio = 0.0;
    double coeff = schedule == KERN_LR_LINEAR ? 1.0 - ratio : 0.5 * (1.0 + cos(M_PI * ratio));
    return min_lr + coeff * (lr - min_lr);
}

void kern_set_threads(int n) {
    if (n <= 0)
        return;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    openblas_set_num_threads(n);
}
