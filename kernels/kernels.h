/* kernels.h: the public header of kernels/ — GPT-2 model and optimizer math.
 *
 * Two layers of API, both llm.c-style (plain float arrays, shapes as ints, caller-owned
 * memory, no allocation, no logging, no globals):
 *
 *  1. Ops: forward and backward of each GPT-2 building block (encoder, layernorm, matmul,
 *     causal attention, GELU, residual, softmax cross-entropy) and the optimizer (AdamW,
 *     gradient-norm helpers, learning-rate schedule). The CPU reference lives in the kernels/ .c files
 *     (matrix products through CBLAS); CUDA twins (the .cu files) implement the same
 *     signatures on device pointers.
 *  2. Layers: the model cut into L+2 "layers" with one flat float parameter vector each, which
 *     is the unit that pipeline stages own, ZeRO-1 shards and checkpoints store:
 *       layer 0        embeddings: wte (V x C), wpe (T x C)
 *       layer 1..L     transformer blocks (12 tensors, order in docs/engine.md)
 *       layer L+1      final LayerNorm (lnf.w, lnf.b); the LM head is tied to wte
 *
 * Backward functions ACCUMULATE (+=) into parameter gradients and into input gradients, as
 * llm.c does; callers zero what they need. Every op is deterministic: the same inputs give
 * bitwise the same outputs whatever the OpenMP thread count (each output element is computed
 * by one thread in a fixed order); matrix products are OpenBLAS sgemm calls of fixed shapes,
 * which split work by output blocks, not along the summed dimension. */
#ifndef ST_KERNELS_H
#define ST_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* ---- model configuration ----------------------------------------------------------- */

struct kern_config {
    int layers;   /* L: transformer blocks */
    int channels; /* C: model width */
    int heads;    /* NH: attention heads; divides C */
    int vocab;    /* V: vocabulary size */
    int seq_len;  /* T: tokens per sample */
};

#define KERN_MAX_TENSORS 12   /* most tensors in one layer (a block) */
#define KERN_TENSOR_NAME_MAX 16

/* Returns 0 when every field is positive, heads divides channels and vocab <= 65536;
 * else -EINVAL. */
int kern_config_check(const struct kern_config *cfg);
/* Number of layers in the layer API: cfg->layers + 2. */
int kern_num_layers(const struct kern_config *cfg);
/* Floats in layer `layer`'s flat parameter vector; 0 for a layer out of range. */
size_t kern_layer_param_count(const struct kern_config *cfg, int layer);
/* Total parameters of the model (the sum over layers; the tied head adds nothing). */
size_t kern_model_param_count(const struct kern_config *cfg);

/* One named tensor inside a layer's flat vector. */
struct kern_tensor_info {
    char name[KERN_TENSOR_NAME_MAX]; /* "wte", "qkv.w", "lnf.b", ... (docs/engine.md) */
    size_t offset;  /* floats from the start of the layer's vector */
    size_t numel;   /* floats */
    int ndim;       /* 1 or 2 */
    int shape[2];   /* rows, cols (cols = 1 when ndim == 1) */
    int decay;      /* 1 when AdamW applies weight decay (2-D weights, as nanoGPT) */
};

/* Tensors in a layer: 2 (embeddings), 12 (block), 2 (final LN); 0 when out of range. */
int kern_layer_tensor_count(const struct kern_config *cfg, int layer);
/* Describes tensor `idx` of `layer`. Returns 0 or -EINVAL (index out of range). */
int kern_layer_tensor(const struct kern_config *cfg, int layer, int idx,
                      struct kern_tensor_info *ret_info);

/* GPT-2 initialisation of one layer, a pure function of (seed, layer, tensor index, element):
 * weights N(0, 0.02), residual projections (attproj.w, fcproj.w) N(0, 0.02/sqrt(2L)),
 * biases 0, LayerNorm weights 1. The same seed gives the same values whatever the shape of
 * the run. Returns 0 or -EINVAL. */
int kern_layer_init(const struct kern_config *cfg, int layer, uint64_t seed, float *params);

/* Sets the threads the kernels use (OpenMP and OpenBLAS); n <= 0 keeps the defaults.
 * Results do not depend on it. */
void kern_set_threads(int n);

/* Loads OpenBLAS (blas.c: the binary does not link it, so commands that do no math never
 * start its threads) and checks that the buffers `threads` kernel threads will hold can be
 * allocated. Commands that train call it before any kernel, with the count they will pass
 * to kern_set_threads(); a kernel called first loads it too, and aborts with the reason if
 * that fails. Returns 0, -ENOMEM (an address-space limit too tight for the buffers, or for
 * the library itself) or -ENOENT (no usable libopenblas.so.0), with a one-line reason in
 * `why` (may be NULL). */
int kern_blas_load(int threads, char *why, size_t whysz);

/* ---- layer-level forward / backward (one micro-batch of B samples) ------------------ */

/* Floats of saved activations per micro-batch for `layer` (what backward needs), and of the
 * scratch space shared by all layers of a stage (reused between calls). */
size_t kern_layer_act_count(const struct kern_config *cfg, int layer, int B);
size_t kern_scratch_count(const struct kern_config *cfg, int B);

/* Forward of one layer.
 *   layer 0:     tokens (B*T ints) -> out (B,T,C)            (in unused)
 *   block:       in (B,T,C) -> out (B,T,C)
 *   final LN:    in (B,T,C) -> out (B,T,C) normalised         (input to the head)
 * `acts` holds kern_layer_act_count() floats and must be kept until the matching backward;
 * `in` must also stay unchanged until then. `out` may point into memory the caller keeps.
 * Returns 0 or -EINVAL. */
int kern_layer_forward(const struct kern_config *cfg, int layer, const float *params, int B,
                       const int *tokens, const float *in, float *out, float *acts,
                       float *scratch);

/* Backward of one layer: accumulates into grads (same layout as params) and writes
 * din (B,T,C) (overwritten, not accumulated; NULL for layer 0). dout is (B,T,C) and may be
 * clobbered. Returns 0 or -EINVAL. */
int kern_layer_backward(const struct kern_config *cfg, int layer, const float *params,
                        float *grads, int B, const int *tokens, const float *in,
                        const float *acts, float *dout, float *din, float *scratch);

/* The tied LM head and loss for one micro-batch: logits = x @ wte^T, softmax cross-entropy
 * against targets. Writes per-token losses (B*T) and returns their sum through *ret_loss_sum
 * (double, summed in token order). Then, in the same call, backward with dloss = `dloss`
 * per token (e.g. 1 / (global_batch * T)): accumulates into dwte (V x C) and writes dx
 * (B,T,C). logits needs B*T*V floats of caller memory. Returns 0 or -EINVAL. */
int kern_head_forward_backward(const struct kern_config *cfg, const float *wte, int B,
                               const float *x, const int *targets, float dloss, float *logits,
                               float *losses, float *dwte, float *dx, double *ret_loss_sum);

/* Forward only (evaluation): logits and per-token losses (targets may be NULL: no loss). */
int kern_head_forward(const struct kern_config *cfg, const float *wte, int B, const float *x,
                      const int *targets, float *logits, float *losses, double *ret_loss_sum);

/* ---- ops (llm.c shapes: B batch, T time, C channels, OC output channels) ------------ */

/* out[b,t,:] = wte[inp[b,t],:] + wpe[t,:] */
void kern_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                          int T, int C);
/* dwte[inp[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:] (in (b,t) order) */
void kern_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                           int T, int C);

/* LayerNorm over C with eps 1e-5; mean and rstd (B*T each) saved for backward. */
void kern_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int B, int T, int C);
/* Accumulates dinp, dweight, dbias. */
void kern_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int B, int T, int C);

/* out (B*T, OC) = inp (B*T, C) @ weight (OC, C)^T + bias (OC; may be NULL). */
void kern_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int B, int T, int C, int OC);
/* Accumulates dinp (may be NULL), dweight, dbias (may be NULL). */
void kern_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int B, int T, int C, int OC);

/* Causal multi-head self-attention. inp is qkv (B,T,3C); out (B,T,C); att (B,NH,T,T) holds
 * the softmax probabilities (saved for backward); preatt (B,NH,T,T) is scratch. */
void kern_attention_forward(float *out, float *preatt, float *att, const float *inp, int B,
                            int T, int C, int NH);
/* Accumulates dinp (B,T,3C); dpreatt and datt (B,NH,T,T) are scratch (overwritten). */
void kern_attention_backward(float *dinp, float *dpreatt, float *datt, const float *dout,
                             const float *inp, const float *att, int B, int T, int C, int NH);

/* GELU, tanh approximation (GPT-2). Backward accumulates dinp. */
void kern_gelu_forward(float *out, const float *inp, int N);
void kern_gelu_backward(float *dinp, const float *inp, const float *dout, int N);

/* out = a + b; backward accumulates dout into da and db. */
void kern_residual_forward(float *out, const float *a, const float *b, int N);
void kern_residual_backward(float *da, float *db, const float *dout, int N);

/* Row softmax of logits (N rows of V) into probs (probs may equal logits), and
 * losses[i] = -log p[target]. targets may be NULL (no losses written). */
void kern_softmax_crossentropy_forward(float *losses, float *probs, const float *logits,
                                       const int *targets, int N, int V);
/* dlogits[i,:] += (probs[i,:] - onehot(targets[i])) * dloss. */
void kern_softmax_crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                                        float dloss, int N, int V);

/* ---- optimizer ---------------------------------------------------------------------- */

/* AdamW on one element range (so a ZeRO-1 shard can update its slice):
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   mhat = m / (1 - b1^t);  vhat = v / (1 - b2^t);
 *   param -= lr * (mhat / (sqrt(vhat) + eps) + wd * param)
 * t is the 1-based step count. Pass wd = 0 for tensors without decay (kern_tensor_info.decay).
 * Same update as torch.optim.AdamW (decoupled weight decay, bias correction). */
void kern_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                float beta1, float beta2, float eps, float wd, int t);

/* Sum of squares of a double array, summed in index order (the canonical order the global
 * gradient norm uses: per layer, per tensor, per element). */
double kern_sumsq_f64(const double *x, size_t n);
/* Clip factor for a global norm: min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0
 * (torch.nn.utils.clip_grad_norm_). */
double kern_clip_scale(double norm, double max_norm);
/* out[i] = (float)(in[i] * scale): the one rounding of an accumulated gradient to float. */
void kern_round_scaled(float *out, const double *in, size_t n, double scale);
/* acc[i] += (double)g[i]: accumulates a micro-batch's float gradient in double. */
void kern_accumulate_f64(double *acc, const float *g, size_t n);

enum kern_lr_schedule { KERN_LR_COSINE = 0, KERN_LR_CONSTANT, KERN_LR_LINEAR };

/* Learning rate of 0-based step `step` of `total_steps` (nanoGPT get_lr): linear warmup
 * lr * (step+1) / warmup for step < warmup; then, with r = (step - warmup) /
 * (total_steps - warmup) clamped to [0, 1], cosine lr_min + 0.5 (1 + cos(pi r)) (lr - lr_min)
 * or linear lr_min + (1 - r) (lr - lr_min), lr_min = lr * min_ratio; constant keeps lr. */
double kern_lr(enum kern_lr_schedule schedule, double lr, int warmup, int total_steps,
               double min_ratio, int step);

#endif
