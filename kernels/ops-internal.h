/* ops-internal.h: helpers shared between kernels/ .c files, not part of the public kernels.h
 * API (the CUDA twins do not implement them). */
#ifndef ST_KERNELS_OPS_INTERNAL_H
#define ST_KERNELS_OPS_INTERNAL_H

/* The head's softmax cross-entropy forward and backward in one pass per row, in place:
 * logits (N rows of V) becomes dlogits = (softmax - onehot(targets)) * dloss, and
 * losses[n] = -log softmax[targets[n]]. Bitwise the values kern_softmax_crossentropy_forward
 * and then a (probs - onehot) * dloss pass would give. */
void kern_softmax_xent_fused(float *logits, float *losses, const int *targets, float dloss,
                             int N, int V);

#endif
