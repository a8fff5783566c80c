/* kernels-cuda.h: the CUDA twins of kernels.h's ops (kernels/ops.cu, kernels/optim.cu).
 *
 * Each kern_cuda_X has exactly the parameter list of kern_X in kernels.h, on device pointers,
 * and the same contract (what is written, what is accumulated), so a caller switches between
 * the CPU reference and the GPU by prefix; the `gpu` test suite checks every twin against the
 * CPU reference. They are separate names, not the same symbols, so that one binary can hold
 * both, which that check needs. No CUDA header is needed to include this file.
 *
 * Launches are asynchronous on the default stream and the ops return nothing, as their CPU
 * twins; kern_cuda_sync() waits and reports the first error as negative errno. Reductions
 * run in a fixed order (no atomics), so results are bitwise reproducible run to run. */
#ifndef ST_KERNELS_CUDA_H
#define ST_KERNELS_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices; 0 when the runtime or driver has none or fails. */
int kern_cuda_device_count(void);
/* Creates the cuBLAS handle the matmuls use (once; later calls return 0). Returns 0, -ENODEV
 * (no device), -EIO (CUDA or cuBLAS failure). Called before the first op. */
int kern_cuda_init(void);
/* Destroys the cuBLAS handle; safe without init. */
void kern_cuda_done(void);
/* Waits for the device and returns 0 or the first error (-ENOMEM for out of memory, -EIO
 * otherwise), clearing the sticky error. */
int kern_cuda_sync(void);

/* Device memory helpers: *ret_ptr is written only on success; free is NULL-safe. */
int kern_cuda_malloc(void **ret_ptr, size_t bytes);
void kern_cuda_free(void *ptr);
int kern_cuda_upload(void *dst_device, const void *src_host, size_t bytes);
int kern_cuda_download(void *dst_host, const void *src_device, size_t bytes);
int kern_cuda_memset0(void *dst_device, size_t bytes);

/* ---- twins of kernels.h's ops (same parameters, device pointers) -------------------- */

void kern_cuda_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe,
                               int B, int T, int C);
void kern_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp,
                                int B, int T, int C);
void kern_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *weight, const float *bias, int B, int T, int C);
void kern_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, const float *mean,
                                  const float *rstd, int B, int T, int C);
void kern_cuda_matmul_forward(float *out, const float *inp, const float *weight,
                              const float *bias, int B, int T, int C, int OC);
void kern_cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, int B, int T, int C,
                               int OC);
void kern_cuda_attention_forward(float *out, float *preatt, float *att, const float *inp, int B,
                                 int T, int C, int NH);
void kern_cuda_attention_backward(float *dinp, float *dpreatt, float *datt, const float *dout,
                                  const float *inp, const float *att, int B, int T, int C,
                                  int NH);
void kern_cuda_gelu_forward(float *out, const float *inp, int N);
void kern_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, int N);
void kern_cuda_residual_forward(float *out, const float *a, const float *b, int N);
void kern_cuda_residual_backward(float *da, float *db, const float *dout, int N);
void kern_cuda_softmax_crossentropy_forward(float *losses, float *probs, const float *logits,
                                            const int *targets, int N, int V);
void kern_cuda_softmax_crossentropy_backward(float *dlogits, const float *probs,
                                             const int *targets, float dloss, int N, int V);
void kern_cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                     float beta1, float beta2, float eps, float wd, int t);

#ifdef __cplusplus
}
#endif

#endif
