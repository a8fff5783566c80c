/* optim.cu: CUDA twin of kern_adamw (kernels/optim.c), one thread per element.
 *
 * The update follows the CPU reference's order of operations (torch.optim.AdamW's
 * single-tensor path: decay first, lerp for the first moment, bias-corrected denominator), so
 * a ZeRO-1 shard updated on either device lands on the same values within rounding. */
#include <cuda_runtime.h>
#include <math.h>

#include "kernels-cuda.h"

__global__ static void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n,
                                    float step_size, float bc2_sqrt, float beta1, float beta2,
                                    float eps, float decay) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float g = grad[i];
    float mi = m[i] + (g - m[i]) * (1.0f - beta1);
    float vi = v[i] * beta2 + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    param[i] = param[i] * decay - step_size * (mi / denom);
}

extern "C" void kern_cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n,
                                float lr, float beta1, float beta2, float eps, float wd, int t) {
    if (n == 0)
        return;
    /* Scalars on the host exactly as the CPU computes them. */
    float bc1 = 1.0f - powf(beta1, (float)t);
    float bc2 = 1.0f - powf(beta2, (float)t);
    float step_size = lr / bc1;
    float bc2_sqrt = sqrtf(bc2);
    float decay = 1.0f - lr * wd;
    unsigned int blocks = (unsigned int)((n + 255) / 256);
    adamw_kernel<<<blocks, 256>>>(param, grad, m, v, n, step_size, bc2_sqrt, beta1, beta2, eps,
                                  decay);
}
