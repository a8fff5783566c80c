/* ops.cu: CUDA twins of kernels/ops.c (declared in kernels-cuda.h), after llm.c's
 * train_gpt2.cu: the same math and the same accumulate-or-overwrite contract as the CPU
 * reference, on device pointers.
 *
 * The one idea: every reduction has a fixed order. Sums that several (b, t) positions feed
 * (embedding rows, LayerNorm and bias parameter gradients, key/value gradients) are computed
 * by one thread per output element looping over the inputs in order, never by atomics, so a
 * run is bitwise reproducible and the embedding backward even matches the CPU bit for bit.
 * Matrix products go through cuBLAS in fp32 (no TF32). */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>

#include "kernels-cuda.h"

#define GELU_SCALING_FACTOR 0.7978845608028654f /* sqrt(2 / pi) */

static cublasHandle_t cublas_handle;
static bool cublas_ready;
static int first_error; /* first failure seen by a void op (cuBLAS status), as -errno */

static int map_cuda(cudaError_t e) {
    if (e == cudaSuccess)
        return 0;
    return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

static void note_error(int r) {
    if (r < 0 && first_error == 0)
        first_error = r;
}

static unsigned int blocks_for(size_t n, unsigned int threads) {
    return (unsigned int)((n + threads - 1) / threads);
}

extern "C" int kern_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int kern_cuda_init(void) {
    if (cublas_ready)
        return 0;
    if (kern_cuda_device_count() <= 0)
        return -ENODEV;
    if (cublasCreate(&cublas_handle) != CUBLAS_STATUS_SUCCESS)
        return -EIO;
    /* fp32 reference semantics: no TF32 tensor-core rounding. */
    if (cublasSetMathMode(cublas_handle, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(cublas_handle);
        return -EIO;
    }
    cublas_ready = true;
    return 0;
}

extern "C" void kern_cuda_done(void) {
    if (cublas_ready)
        cublasDestroy(cublas_handle);
    cublas_ready = false;
}

extern "C" int kern_cuda_sync(void) {
    int r = map_cuda(cudaDeviceSynchronize());
    int r2 = map_cuda(cudaGetLastError());
    if (r == 0)
        r = r2;
    if (r == 0 && first_error < 0)
        r = first_error;
    first_error = 0;
    return r;
}

extern "C" int kern_cuda_malloc(void **ret_ptr, size_t bytes) {
    void *p = NULL;
    if (!ret_ptr)
        return -EINVAL;
    int r = map_cuda(cudaMalloc(&p, bytes ? bytes : 1));
    if (r < 0) {
        cudaGetLastError();
        return r;
    }
    *ret_ptr = p;
    return 0;
}

extern "C" void kern_cuda_free(void *ptr) {
    if (ptr)
        cudaFree(ptr);
}

extern "C" int kern_cuda_upload(void *dst_device, const void *src_host, size_t bytes) {
    return map_cuda(cudaMemcpy(dst_device, src_host, bytes, cudaMemcpyHostToDevice));
}

extern "C" int kern_cuda_download(void *dst_host, const void *src_device, size_t bytes) {
    return map_cuda(cudaMemcpy(dst_host, src_device, bytes, cudaMemcpyDeviceToHost));
}

extern "C" int kern_cuda_memset0(void *dst_device, size_t bytes) {
    return map_cuda(cudaMemset(dst_device, 0, bytes));
}

/* ---- encoder ------------------------------------------------------------------------ */

__global__ static void encoder_forward_kernel(float *out, const int *inp, const float *wte,
                                              const float *wpe, int B, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t n = (size_t)B * T * C;
    if (idx >= n)
        return;
    size_t bt = idx / C;
    int c = (int)(idx % C), t = (int)(bt % T);
    out[idx] = wte[(size_t)inp[bt] * C + c] + wpe[(size_t)t * C + c];
}

/* One thread per channel, (b, t) in order: the CPU's order, so the sums match bitwise. */
__global__ static void encoder_backward_kernel(float *dwte, float *dwpe, const float *dout,
                                               const int *inp, int B, int T, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float d = dout[((size_t)b * T + t) * C + c];
            dwte[(size_t)inp[b * T + t] * C + c] += d;
            dwpe[(size_t)t * C + c] += d;
        }
}

extern "C" void kern_cuda_encoder_forward(float *out, const int *inp, const float *wte,
                                          const float *wpe, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    encoder_forward_kernel<<<blocks_for(n, 256), 256>>>(out, inp, wte, wpe, B, T, C);
}

extern "C" void kern_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                           const int *inp, int B, int T, int C) {
    encoder_backward_kernel<<<blocks_for((size_t)C, 128), 128>>>(dwte, dwpe, dout, inp, B, T, C);
}

/* ---- block reductions (fixed tree: deterministic) ------------------------------------ */

/* Sum of v over the block's threads (blockDim.x a power of two <= 1024); every thread gets
 * the result. sh holds blockDim.x floats. */
__device__ static float block_sum(float v, float *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

__device__ static float block_max(float v, float *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

#define ROW_THREADS 128

/* ---- layernorm ------------------------------------------------------------------------ */

__global__ static void layernorm_forward_kernel(float *out, float *mean, float *rstd,
                                                const float *inp, const float *weight,
                                                const float *bias, int C) {
    __shared__ float sh[ROW_THREADS];
    size_t n = blockIdx.x;
    const float *x = inp + n * C;
    float s = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        s += x[i];
    float m = block_sum(s, sh) / C;
    float v = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float d = x[i] - m;
        v += d * d;
    }
    v = block_sum(v, sh) / C;
    float r = 1.0f / sqrtf(v + 1e-5f);
    float *o = out + n * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        o[i] = (r * (x[i] - m)) * weight[i] + bias[i];
    if (threadIdx.x == 0) {
        mean[n] = m;
        rstd[n] = r;
    }
}

__global__ static void layernorm_backward_dinp_kernel(float *dinp, const float *dout,
                                                      const float *inp, const float *weight,
                                                      const float *mean, const float *rstd,
                                                      int C) {
    __shared__ float sh[ROW_THREADS];
    size_t n = blockIdx.x;
    const float *dout_n = dout + n * C, *inp_n = inp + n * C;
    float *dinp_n = dinp + n * C;
    float mean_n = mean[n], rstd_n = rstd[n];
    float a = 0.0f, b = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float norm_i = (inp_n[i] - mean_n) * rstd_n;
        float dnorm_i = weight[i] * dout_n[i];
        a += dnorm_i;
        b += dnorm_i * norm_i;
    }
    float dnorm_mean = block_sum(a, sh) / C;
    float dnorm_norm_mean = block_sum(b, sh) / C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float norm_i = (inp_n[i] - mean_n) * rstd_n;
        float dnorm_i = weight[i] * dout_n[i];
        dinp_n[i] += (dnorm_i - dnorm_mean - norm_i * dnorm_norm_mean) * rstd_n;
    }
}

/* Parameter gradients: one thread per channel, rows in order (the CPU's order). */
__global__ static void layernorm_backward_params_kernel(float *dweight, float *dbias,
                                                        const float *dout, const float *inp,
                                                        const float *mean, const float *rstd,
                                                        int N, int C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C)
        return;
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

extern "C" void kern_cuda_layernorm_forward(float *out, float *mean, float *rstd,
                                            const float *inp, const float *weight,
                                            const float *bias, int B, int T, int C) {
    layernorm_forward_kernel<<<(unsigned int)(B * T), ROW_THREADS>>>(out, mean, rstd, inp,
                                                                      weight, bias, C);
}

extern "C" void kern_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                             const float *dout, const float *inp,
                                             const float *weight, const float *mean,
                                             const float *rstd, int B, int T, int C) {
    layernorm_backward_dinp_kernel<<<(unsigned int)(B * T), ROW_THREADS>>>(dinp, dout, inp,
                                                                            weight, mean, rstd,
                                                                            C);
    layernorm_backward_params_kernel<<<blocks_for((size_t)C, 128), 128>>>(
        dweight, dbias, dout, inp, mean, rstd, B * T, C);
}

/* ---- matmul (cuBLAS, column-major view of row-major data) ----------------------------- */

__global__ static void add_bias_kernel(float *out, const float *bias, size_t N, int OC) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < N * OC)
        out[idx] += bias[idx % OC];
}

__global__ static void bias_backward_kernel(float *dbias, const float *dout, int N, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC)
        return;
    float s = dbias[o];
    for (int n = 0; n < N; n++)
        s += dout[(size_t)n * OC + o];
    dbias[o] = s;
}

extern "C" void kern_cuda_matmul_forward(float *out, const float *inp, const float *weight,
                                         const float *bias, int B, int T, int C, int OC) {
    const float one = 1.0f, zero = 0.0f;
    int N = B * T;
    if (!cublas_ready && kern_cuda_init() < 0) {
        note_error(-EIO);
        return;
    }
    /* out^T (OC x N) = weight (row-major OC x C, i.e. column-major C x OC)^T @ inp^T */
    if (cublasSgemm(cublas_handle, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, weight, C, inp, C,
                    &zero, out, OC) != CUBLAS_STATUS_SUCCESS)
        note_error(-EIO);
    if (bias)
        add_bias_kernel<<<blocks_for((size_t)N * OC, 256), 256>>>(out, bias, (size_t)N, OC);
}

extern "C" void kern_cuda_matmul_backward(float *dinp, float *dweight, float *dbias,
                                          const float *dout, const float *inp,
                                          const float *weight, int B, int T, int C, int OC) {
    const float one = 1.0f;
    int N = B * T;
    if (!cublas_ready && kern_cuda_init() < 0) {
        note_error(-EIO);
        return;
    }
    /* dinp (N x C) += dout (N x OC) @ weight (OC x C) */
    if (dinp && cublasSgemm(cublas_handle, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, C,
                            dout, OC, &one, dinp, C) != CUBLAS_STATUS_SUCCESS)
        note_error(-EIO);
    /* dweight (OC x C) += dout^T (OC x N) @ inp (N x C) */
    if (cublasSgemm(cublas_handle, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC,
                    &one, dweight, C) != CUBLAS_STATUS_SUCCESS)
        note_error(-EIO);
    if (dbias)
        bias_backward_kernel<<<blocks_for((size_t)OC, 128), 128>>>(dbias, dout, N, OC);
}

/* ---- attention ------------------------------------------------------------------------ */

/* One thread per (b, h, t): scores, softmax and the weighted sum of values for that query,
 * in the CPU's order of operations. */
__global__ static void attention_forward_kernel(float *out, float *preatt, float *att,
                                                const float *inp, int B, int T, int C, int NH) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * NH * T)
        return;
    int t = idx % T, h = (idx / T) % NH, b = idx / (T * NH);
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    const float *q = inp + ((size_t)b * T + t) * C3 + h * hs;
    float *pre = preatt + (((size_t)b * NH + h) * T + t) * T;
    float *a = att + (((size_t)b * NH + h) * T + t) * T;
    float maxval = -INFINITY;
    for (int t2 = 0; t2 <= t; t2++) {
        const float *k = inp + ((size_t)b * T + t2) * C3 + h * hs + C;
        float val = 0.0f;
        for (int i = 0; i < hs; i++)
            val += q[i] * k[i];
        val *= scale;
        maxval = fmaxf(maxval, val);
        pre[t2] = val;
    }
    float sum = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) {
        float e = expf(pre[t2] - maxval);
        sum += e;
        a[t2] = e;
    }
    float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (int t2 = 0; t2 < T; t2++)
        a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
    float *o = out + ((size_t)b * T + t) * C + h * hs;
    for (int i = 0; i < hs; i++) {
        float acc = 0.0f;
        for (int t2 = 0; t2 <= t; t2++)
            acc += a[t2] * inp[((size_t)b * T + t2) * C3 + h * hs + 2 * C + i];
        o[i] = acc;
    }
}

/* datt[t][t2] = dout_t . value_t2 for t2 <= t; one thread per (b, h, t). */
__global__ static void attention_datt_kernel(float *datt, const float *dout, const float *inp,
                                             int B, int T, int C, int NH) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * NH * T)
        return;
    int t = idx % T, h = (idx / T) % NH, b = idx / (T * NH);
    int C3 = 3 * C, hs = C / NH;
    const float *d = dout + ((size_t)b * T + t) * C + h * hs;
    float *da = datt + (((size_t)b * NH + h) * T + t) * T;
    for (int t2 = 0; t2 <= t; t2++) {
        const float *v = inp + ((size_t)b * T + t2) * C3 + h * hs + 2 * C;
        float s = 0.0f;
        for (int i = 0; i < hs; i++)
            s += v[i] * d[i];
        da[t2] = s;
    }
}

/* dvalue[t2][i] += sum over t >= t2 of att[t][t2] * dout[t][i]; one thread per (b,h,t2,i). */
__global__ static void attention_dvalue_kernel(float *dinp, const float *dout, const float *att,
                                               int B, int T, int C, int NH) {
    int hs = C / NH;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NH * T * hs)
        return;
    int i = (int)(idx % hs), t2 = (int)((idx / hs) % T), h = (int)((idx / ((size_t)hs * T)) % NH);
    int b = (int)(idx / ((size_t)hs * T * NH));
    float s = dinp[((size_t)b * T + t2) * 3 * C + h * hs + 2 * C + i];
    for (int t = t2; t < T; t++)
        s += att[(((size_t)b * NH + h) * T + t) * T + t2] *
             dout[((size_t)b * T + t) * C + h * hs + i];
    dinp[((size_t)b * T + t2) * 3 * C + h * hs + 2 * C + i] = s;
}

/* Softmax backward: dpreatt = att * (datt - sum(att * datt)); one thread per (b, h, t). */
__global__ static void attention_dpreatt_kernel(float *dpreatt, const float *datt,
                                                const float *att, int B, int T, int NH) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * NH * T)
        return;
    int t = idx % T;
    size_t row = (size_t)idx * T;
    float dot = 0.0f;
    for (int t2 = 0; t2 <= t; t2++)
        dot += att[row + t2] * datt[row + t2];
    for (int t2 = 0; t2 <= t; t2++)
        dpreatt[row + t2] = att[row + t2] * (datt[row + t2] - dot);
}

/* dquery[t][i] += scale * sum_{t2 <= t} dpreatt[t][t2] key[t2][i] and
 * dkey[t2][i] += scale * sum_{t >= t2} dpreatt[t][t2] query[t][i]; one thread per
 * (b, h, position, i) for each. */
__global__ static void attention_dqk_kernel(float *dinp, const float *dpreatt, const float *inp,
                                            int B, int T, int C, int NH) {
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NH * T * hs)
        return;
    int i = (int)(idx % hs), p = (int)((idx / hs) % T), h = (int)((idx / ((size_t)hs * T)) % NH);
    int b = (int)(idx / ((size_t)hs * T * NH));
    const float *dp = dpreatt + ((size_t)b * NH + h) * T * T;
    /* query at position p */
    float dq = 0.0f;
    for (int t2 = 0; t2 <= p; t2++)
        dq += inp[((size_t)b * T + t2) * C3 + h * hs + C + i] * (dp[(size_t)p * T + t2] * scale);
    dinp[((size_t)b * T + p) * C3 + h * hs + i] += dq;
    /* key at position p */
    float dk = 0.0f;
    for (int t = p; t < T; t++)
        dk += inp[((size_t)b * T + t) * C3 + h * hs + i] * (dp[(size_t)t * T + p] * scale);
    dinp[((size_t)b * T + p) * C3 + h * hs + C + i] += dk;
}

extern "C" void kern_cuda_attention_forward(float *out, float *preatt, float *att,
                                            const float *inp, int B, int T, int C, int NH) {
    attention_forward_kernel<<<blocks_for((size_t)B * NH * T, 128), 128>>>(out, preatt, att, inp,
                                                                           B, T, C, NH);
}

extern "C" void kern_cuda_attention_backward(float *dinp, float *dpreatt, float *datt,
                                             const float *dout, const float *inp,
                                             const float *att, int B, int T, int C, int NH) {
    size_t natt = (size_t)B * NH * T * T, nhs = (size_t)B * T * C;
    note_error(map_cuda(cudaMemsetAsync(dpreatt, 0, natt * sizeof(float))));
    note_error(map_cuda(cudaMemsetAsync(datt, 0, natt * sizeof(float))));
    attention_datt_kernel<<<blocks_for((size_t)B * NH * T, 128), 128>>>(datt, dout, inp, B, T, C,
                                                                        NH);
    attention_dvalue_kernel<<<blocks_for(nhs, 256), 256>>>(dinp, dout, att, B, T, C, NH);
    attention_dpreatt_kernel<<<blocks_for((size_t)B * NH * T, 128), 128>>>(dpreatt, datt, att, B,
                                                                           T, NH);
    attention_dqk_kernel<<<blocks_for(nhs, 256), 256>>>(dinp, dpreatt, inp, B, T, C, NH);
}

/* ---- elementwise ---------------------------------------------------------------------- */

__global__ static void gelu_forward_kernel(float *out, const float *inp, int N) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N)
        return;
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * (x + cube)));
}

__global__ static void gelu_backward_kernel(float *dinp, const float *inp, const float *dout,
                                            int N) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N)
        return;
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    float arg = GELU_SCALING_FACTOR * (x + cube);
    float th = tanhf(arg);
    float ch = coshf(arg);
    float sech2 = 1.0f / (ch * ch);
    float local = 0.5f * (1.0f + th) +
                  x * 0.5f * sech2 * GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += local * dout[i];
}

__global__ static void residual_forward_kernel(float *out, const float *a, const float *b, int N) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N)
        out[i] = a[i] + b[i];
}

__global__ static void residual_backward_kernel(float *da, float *db, const float *dout, int N) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

extern "C" void kern_cuda_gelu_forward(float *out, const float *inp, int N) {
    gelu_forward_kernel<<<blocks_for((size_t)N, 256), 256>>>(out, inp, N);
}

extern "C" void kern_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, int N) {
    gelu_backward_kernel<<<blocks_for((size_t)N, 256), 256>>>(dinp, inp, dout, N);
}

extern "C" void kern_cuda_residual_forward(float *out, const float *a, const float *b, int N) {
    residual_forward_kernel<<<blocks_for((size_t)N, 256), 256>>>(out, a, b, N);
}

extern "C" void kern_cuda_residual_backward(float *da, float *db, const float *dout, int N) {
    residual_backward_kernel<<<blocks_for((size_t)N, 256), 256>>>(da, db, dout, N);
}

/* ---- softmax cross-entropy ------------------------------------------------------------ */

/* One block per row. probs may alias logits: every read of a row happens before the
 * barrier that precedes its first write. */
__global__ static void softmax_ce_forward_kernel(float *losses, float *probs,
                                                 const float *logits, const int *targets,
                                                 int V) {
    __shared__ float sh[ROW_THREADS];
    size_t n = blockIdx.x;
    const float *l = logits + n * V;
    float *p = probs + n * V;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        mx = fmaxf(mx, l[i]);
    mx = block_max(mx, sh);
    float s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        s += expf(l[i] - mx);
    float inv = 1.0f / block_sum(s, sh); /* block_sum ends on a barrier: all reads are done */
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        p[i] = expf(l[i] - mx) * inv;
    __syncthreads();
    if (targets && threadIdx.x == 0)
        losses[n] = -logf(p[targets[n]]);
}

__global__ static void softmax_ce_backward_kernel(float *dlogits, const float *probs,
                                                  const int *targets, float dloss, int N, int V) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * V)
        return;
    size_t n = idx / V;
    int i = (int)(idx % V);
    float indicator = i == targets[n] ? 1.0f : 0.0f;
    dlogits[idx] += (probs[idx] - indicator) * dloss;
}

extern "C" void kern_cuda_softmax_crossentropy_forward(float *losses, float *probs,
                                                       const float *logits, const int *targets,
                                                       int N, int V) {
    softmax_ce_forward_kernel<<<(unsigned int)N, ROW_THREADS>>>(losses, probs, logits, targets,
                                                                V);
}

extern "C" void kern_cuda_softmax_crossentropy_backward(float *dlogits, const float *probs,
                                                        const int *targets, float dloss, int N,
                                                        int V) {
    softmax_ce_backward_kernel<<<blocks_for((size_t)N * V, 256), 256>>>(dlogits, probs, targets,
                                                                        dloss, N, V);
}
