/* ops.cu: CUDA twins of kernels/ops.c (declared in kernels-cuda.h), after llm.c's
 * train_gpt2.cu: the same math and the same accumulate-or-overwrite contract as the CPU
 * reference, on device pointers.
 *
 * The one idea: every reduction has a fixed order. Sums that several (b, t) positions feed
 * are never made with atomics: embedding rows by one thread per output element looping over the
 * inputs in order (the embedding backward matches the CPU bit for bit), LayerNorm and bias
 * parameter gradients by chunks of rows summed in order and then the chunks in order, the
 * rest (attention's products among them) by cuBLAS in fp32 (no TF32), deterministic for a
 * given card. So a run is bitwise reproducible. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>

#include "kernels-cuda.h"

#define GELU_SCALING_FACTOR 0.7978845608028654f /* sqrt(2 / pi) */

static cublasHandle_t cublas_handle;
static bool cublas_ready;
static int first_error; /* first failure seen by a void op (cuBLAS status), as -errno */
static float *col_scratch; /* column sums' chunk parts (scratch_for), grown on demand */
static size_t col_scratch_n;

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

/* The cuBLAS handle, made on first use by an op; false (the error noted) when it cannot be. */
static bool blas_ready(void) {
    if (cublas_ready || kern_cuda_init() == 0)
        return true;
    note_error(-EIO);
    return false;
}

extern "C" void kern_cuda_done(void) {
    if (cublas_ready)
        cublasDestroy(cublas_handle);
    cublas_ready = false;
    cudaFree(col_scratch);
    col_scratch = NULL;
    col_scratch_n = 0;
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

/* ---- column sums over rows (parameter gradients) ---------------------------------------- */

/* A parameter's gradient sums N rows per column. One thread per column walking all N rows in
 * order left 768 threads for GPT-2's LayerNorm (0.5 ms a call on an H200); instead the rows
 * are cut into chunks of COL_CHUNK, one thread per (chunk, column) sums its chunk in row order
 * into scratch, and one thread per column adds the chunks' sums in chunk order: the same fixed
 * order every run, so results stay bitwise reproducible. */
#define COL_CHUNK 64

static float *scratch_for(size_t n) {
    if (n <= col_scratch_n)
        return col_scratch;
    cudaFree(col_scratch);
    col_scratch = NULL;
    col_scratch_n = 0;
    if (cudaMalloc((void **)&col_scratch, n * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        note_error(-ENOMEM);
        return NULL;
    }
    col_scratch_n = n;
    return col_scratch;
}

/* out[c] += sum over chunks k (in order) of part[k * C + c], for two arrays at once when
 * out2 is set (its parts follow the first's: part + chunks * C). */
__global__ static void col_finish_kernel(float *out, float *out2, const float *part, int chunks,
                                         int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float s = out[c];
    for (int k = 0; k < chunks; k++)
        s += part[(size_t)k * C + c];
    out[c] = s;
    if (out2) {
        const float *p2 = part + (size_t)chunks * C;
        float s2 = out2[c];
        for (int k = 0; k < chunks; k++)
            s2 += p2[(size_t)k * C + c];
        out2[c] = s2;
    }
}

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

/* Parameter gradients, chunk k's part: one thread per (k, channel), its rows in order. */
__global__ static void layernorm_backward_params_kernel(float *part, const float *dout,
                                                        const float *inp, const float *mean,
                                                        const float *rstd, int N, int C,
                                                        int chunks) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)chunks * C)
        return;
    int i = (int)(idx % C), k = (int)(idx / C);
    int n0 = k * COL_CHUNK, n1 = min(N, n0 + COL_CHUNK);
    float dw = 0.0f, db = 0.0f;
    for (int n = n0; n < n1; n++) {
        float norm_i = (inp[(size_t)n * C + i] - mean[n]) * rstd[n];
        float d = dout[(size_t)n * C + i];
        db += d;
        dw += norm_i * d;
    }
    part[idx] = dw;
    part[(size_t)chunks * C + idx] = db;
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
    int N = B * T, chunks = (N + COL_CHUNK - 1) / COL_CHUNK;
    float *part = scratch_for(2 * (size_t)chunks * C);
    if (!part)
        return;
    layernorm_backward_params_kernel<<<blocks_for((size_t)chunks * C, 256), 256>>>(
        part, dout, inp, mean, rstd, N, C, chunks);
    col_finish_kernel<<<blocks_for((size_t)C, 128), 128>>>(dweight, dbias, part, chunks, C);
}

/* ---- matmul (cuBLAS, column-major view of row-major data) ----------------------------- */

__global__ static void add_bias_kernel(float *out, const float *bias, size_t N, int OC) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < N * OC)
        out[idx] += bias[idx % OC];
}

/* The bias gradient, chunk k's part: one thread per (k, output channel), its rows in order. */
__global__ static void bias_backward_kernel(float *part, const float *dout, int N, int OC,
                                            int chunks) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)chunks * OC)
        return;
    int o = (int)(idx % OC), k = (int)(idx / OC);
    int n0 = k * COL_CHUNK, n1 = min(N, n0 + COL_CHUNK);
    float s = 0.0f;
    for (int n = n0; n < n1; n++)
        s += dout[(size_t)n * OC + o];
    part[idx] = s;
}

extern "C" void kern_cuda_matmul_forward(float *out, const float *inp, const float *weight,
                                         const float *bias, int B, int T, int C, int OC) {
    const float one = 1.0f, zero = 0.0f;
    int N = B * T;
    if (!blas_ready())
        return;
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
    if (!blas_ready())
        return;
    /* dinp (N x C) += dout (N x OC) @ weight (OC x C) */
    if (dinp && cublasSgemm(cublas_handle, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, C,
                            dout, OC, &one, dinp, C) != CUBLAS_STATUS_SUCCESS)
        note_error(-EIO);
    /* dweight (OC x C) += dout^T (OC x N) @ inp (N x C) */
    if (cublasSgemm(cublas_handle, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC,
                    &one, dweight, C) != CUBLAS_STATUS_SUCCESS)
        note_error(-EIO);
    if (dbias) {
        int chunks = (N + COL_CHUNK - 1) / COL_CHUNK;
        float *part = scratch_for((size_t)chunks * OC);
        if (!part)
            return;
        bias_backward_kernel<<<blocks_for((size_t)chunks * OC, 256), 256>>>(part, dout, N, OC,
                                                                             chunks);
        col_finish_kernel<<<blocks_for((size_t)OC, 128), 128>>>(dbias, NULL, part, chunks, OC);
    }
}

/* ---- attention ------------------------------------------------------------------------ */

/* Attention as batched matrix products, PyTorch's math path: per batch row b, one strided
 * batched cuBLAS product over the heads for scores = scale * Q K^T (all T x T, the masked half
 * too), a causal softmax per query row, and out = att V; backward likewise (datt = dout V^T,
 * dV += att^T dout, dscores by the softmax's backward, dQ += scale * dscores K, dK += scale *
 * dscores^T Q). A head's Q, K and V are T x hs row-major slices of inp (B,T,3C) with row
 * stride 3C, one head hs columns after the other. The first twin, one thread per query row
 * over all keys, spent 473 ms of a 560 ms GPT-2 124M step here (scripts/bench gpu, H200). */

/* One product per head of batch row b: C_h = alpha * op(A_h) op(B_h) + beta * C_h, cuBLAS
 * column-major, heads strideA, strideB, strideC apart. */
static void gemm_heads(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                       float alpha, const float *A, int lda, long long sa, const float *Bm,
                       int ldb, long long sb, float beta, float *Cm, int ldc, long long sc,
                       int heads) {
    if (cublasSgemmStridedBatched(cublas_handle, ta, tb, m, n, k, &alpha, A, lda, sa, Bm, ldb, sb,
                                  &beta, Cm, ldc, sc, heads) != CUBLAS_STATUS_SUCCESS)
        note_error(-EIO);
}

/* One warp per (b, h, t) row: att = softmax of preatt's first t + 1 entries, zeros after. */
__global__ static void attention_softmax_kernel(float *att, const float *preatt, size_t rows,
                                                int T) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) /* the whole warp: row is the warp's */
        return;
    int t = (int)(row % (size_t)T);
    const float *p = preatt + row * T;
    float *a = att + row * T;
    float m = -INFINITY, sum = 0.0f;
    for (int j = lane; j <= t; j += 32)
        m = fmaxf(m, p[j]);
    for (int o = 16; o > 0; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    for (int j = lane; j <= t; j += 32)
        sum += expf(p[j] - m);
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (int j = lane; j < T; j += 32)
        a[j] = j <= t ? expf(p[j] - m) * inv : 0.0f;
}

/* Softmax backward, one warp per row: dpreatt = att * (datt - sum(att * datt)) up to t, zeros
 * after (the products that read it span the whole row). */
__global__ static void attention_dpreatt_kernel(float *dpreatt, const float *datt,
                                                const float *att, size_t rows, int T) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows)
        return;
    int t = (int)(row % (size_t)T);
    const float *a = att + row * T, *da = datt + row * T;
    float *dp = dpreatt + row * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32)
        dot += a[j] * da[j];
    for (int o = 16; o > 0; o >>= 1)
        dot += __shfl_xor_sync(0xffffffffu, dot, o);
    for (int j = lane; j < T; j += 32)
        dp[j] = j <= t ? a[j] * (da[j] - dot) : 0.0f;
}

extern "C" void kern_cuda_attention_forward(float *out, float *preatt, float *att,
                                            const float *inp, int B, int T, int C, int NH) {
    if (!blas_ready())
        return;
    int hs = C / NH, C3 = 3 * C;
    long long TT = (long long)T * T;
    float scale = 1.0f / sqrtf((float)hs);
    size_t rows = (size_t)B * NH * T;
    for (int b = 0; b < B; b++) {
        const float *q = inp + (size_t)b * T * C3;
        /* scores[t][t2] = scale * q_t . k_t2: column-major (t2, t) = K^T-op times Q */
        gemm_heads(CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, q + C, C3, hs, q, C3, hs, 0.0f,
                   preatt + b * NH * TT, T, TT, NH);
    }
    attention_softmax_kernel<<<blocks_for(rows * 32, 256), 256>>>(att, preatt, rows, T);
    for (int b = 0; b < B; b++) {
        const float *v = inp + (size_t)b * T * C3 + 2 * C;
        /* out[t][d] = sum_t2 att[t][t2] v[t2][d]: column-major (d, t) = V times att-as-stored */
        gemm_heads(CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, C3, hs, att + b * NH * TT, T, TT,
                   0.0f, out + (size_t)b * T * C, C, hs, NH);
    }
}

extern "C" void kern_cuda_attention_backward(float *dinp, float *dpreatt, float *datt,
                                             const float *dout, const float *inp,
                                             const float *att, int B, int T, int C, int NH) {
    if (!blas_ready())
        return;
    int hs = C / NH, C3 = 3 * C;
    long long TT = (long long)T * T;
    float scale = 1.0f / sqrtf((float)hs);
    size_t rows = (size_t)B * NH * T;
    for (int b = 0; b < B; b++) {
        const float *q = inp + (size_t)b * T * C3, *d = dout + (size_t)b * T * C;
        float *di = dinp + (size_t)b * T * C3;
        /* datt[t][t2] = dout_t . v_t2 */
        gemm_heads(CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, q + 2 * C, C3, hs, d, C, hs, 0.0f,
                   datt + b * NH * TT, T, TT, NH);
        /* dv[t2][d] += sum_t att[t][t2] dout[t][d] */
        gemm_heads(CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, d, C, hs, att + b * NH * TT, T, TT,
                   1.0f, di + 2 * C, C3, hs, NH);
    }
    attention_dpreatt_kernel<<<blocks_for(rows * 32, 256), 256>>>(dpreatt, datt, att, rows, T);
    for (int b = 0; b < B; b++) {
        const float *q = inp + (size_t)b * T * C3;
        const float *dp = dpreatt + b * NH * TT;
        float *di = dinp + (size_t)b * T * C3;
        /* dq[t][d] += scale * sum_t2 dp[t][t2] k[t2][d] */
        gemm_heads(CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, scale, q + C, C3, hs, dp, T, TT, 1.0f, di,
                   C3, hs, NH);
        /* dk[t2][d] += scale * sum_t dp[t][t2] q[t][d] */
        gemm_heads(CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, scale, q, C3, hs, dp, T, TT, 1.0f, di + C,
                   C3, hs, NH);
    }
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
