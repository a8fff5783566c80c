/* bench-cuda.c: one training step of GPT-2 124M through the CUDA twins (kernels-cuda.h), the
 * number scripts/bench.d/gpu puts beside PyTorch on the same GPU.
 *
 * Usage: bench-cuda [L C NH V T B ITERS]   (default 12 768 12 50257 1024 4 10)
 * A step is what the engine's 1F1B schedule runs for one micro-batch on one stage holding the
 * whole model: the embedding, L blocks forward, the final LayerNorm and the tied head with the
 * loss, the whole backward, and one AdamW update over every parameter. The blocks share one set
 * of buffers (the timing does not depend on the values; they are random, never zeros). One
 * untimed warm-up step, then ITERS timed ones, each ended by a device synchronisation; prints
 *   tokens_per_s=<B*T/median step s> ms_per_step=<median ms> ms_min=<ms> ms_max=<ms>
 * and, with --ops, the milliseconds of each op kind summed over a step (each op synchronised:
 * slower in all than a step, but it says where a step goes).
 * Exit 77 when no CUDA device answers, 2 on bad arguments, 1 on a CUDA error. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels-cuda.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static float frand(void) { /* uniform in [-0.5, 0.5) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) * 0x1.0p-53) - 0.5f;
}

#define MAXBUF 128
static void *bufs[MAXBUF];
static int nbufs;

/* A device buffer of n floats with random values in [-scale/2, scale/2). */
static float *dev(size_t n, float scale) {
    void *d = NULL;
    float *h = malloc(n * sizeof(float));
    if (!h || nbufs == MAXBUF || kern_cuda_malloc(&d, n * sizeof(float)) < 0) {
        free(h);
        fprintf(stderr, "bench-cuda: cannot allocate %zu floats\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        h[i] = scale * frand();
    if (kern_cuda_upload(d, h, n * sizeof(float)) < 0) {
        fprintf(stderr, "bench-cuda: upload failed\n");
        exit(1);
    }
    free(h);
    bufs[nbufs++] = d;
    return d;
}

static int parse_int(const char *s, int *ret) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v <= 0 || v > 1 << 30)
        return -EINVAL;
    *ret = (int)v;
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum { OP_ENC, OP_LN, OP_MM, OP_ATT, OP_GELU, OP_RES, OP_CE, OP_ADAM, NOPS };
static const char *op_names[NOPS] = {"encoder", "layernorm", "matmul", "attention", "gelu",
                                     "residual", "softmax-ce", "adamw"};
static double op_ms[NOPS];
static int per_op;

/* Runs one op; with --ops, synchronised and timed into its kind. */
#define OP(kind, stmt)                                                                     \
    do {                                                                                   \
        double t0_ = per_op ? now() : 0;                                                   \
        stmt;                                                                              \
        if (per_op) {                                                                      \
            if (kern_cuda_sync() < 0)                                                      \
                return -1;                                                                 \
            op_ms[kind] += 1e3 * (now() - t0_);                                            \
        }                                                                                  \
    } while (0)

struct model {
    int L, C, NH, V, T, B;
    /* parameters and their gradients (one block's, shared by all blocks) */
    float *wte, *wpe, *ln1w, *ln1b, *wqkv, *bqkv, *wo, *bo, *ln2w, *ln2b, *wfc, *bfc, *wpr, *bpr,
        *lnfw, *lnfb;
    float *dwte, *dwpe, *dln1w, *dln1b, *dwqkv, *dbqkv, *dwo, *dbo, *dln2w, *dln2b, *dwfc, *dbfc,
        *dwpr, *dbpr, *dlnfw, *dlnfb;
    /* activations of one block, and the head's */
    float *x0, *ln1, *m1, *r1, *qkv, *preatt, *att, *atty, *ao, *x1, *ln2, *m2, *r2, *fc, *fcg,
        *pr, *x2, *lnf, *mf, *rf, *logits, *probs, *losses;
    /* gradients of activations */
    float *dx, *dln, *dqkv, *dpreatt, *datt, *datty, *dao, *dfc, *dfcg, *dpr, *dx1, *dlogits;
    int *tokens, *targets;
    /* AdamW over every parameter of the model */
    float *p, *g, *m, *v;
    size_t nparams;
};

static int step(struct model *M, int t) {
    int B = M->B, T = M->T, C = M->C, NH = M->NH, V = M->V;
    size_t BTC = (size_t)B * T * C;
    OP(OP_ENC, kern_cuda_encoder_forward(M->x0, M->tokens, M->wte, M->wpe, B, T, C));
    for (int l = 0; l < M->L; l++) {
        OP(OP_LN, kern_cuda_layernorm_forward(M->ln1, M->m1, M->r1, M->x0, M->ln1w, M->ln1b, B,
                                              T, C));
        OP(OP_MM, kern_cuda_matmul_forward(M->qkv, M->ln1, M->wqkv, M->bqkv, B, T, C, 3 * C));
        OP(OP_ATT, kern_cuda_attention_forward(M->atty, M->preatt, M->att, M->qkv, B, T, C, NH));
        OP(OP_MM, kern_cuda_matmul_forward(M->ao, M->atty, M->wo, M->bo, B, T, C, C));
        OP(OP_RES, kern_cuda_residual_forward(M->x1, M->x0, M->ao, (int)BTC));
        OP(OP_LN, kern_cuda_layernorm_forward(M->ln2, M->m2, M->r2, M->x1, M->ln2w, M->ln2b, B,
                                              T, C));
        OP(OP_MM, kern_cuda_matmul_forward(M->fc, M->ln2, M->wfc, M->bfc, B, T, C, 4 * C));
        OP(OP_GELU, kern_cuda_gelu_forward(M->fcg, M->fc, (int)(4 * BTC)));
        OP(OP_MM, kern_cuda_matmul_forward(M->pr, M->fcg, M->wpr, M->bpr, B, T, 4 * C, C));
        OP(OP_RES, kern_cuda_residual_forward(M->x2, M->x1, M->pr, (int)BTC));
    }
    OP(OP_LN, kern_cuda_layernorm_forward(M->lnf, M->mf, M->rf, M->x2, M->lnfw, M->lnfb, B, T,
                                          C));
    OP(OP_MM, kern_cuda_matmul_forward(M->logits, M->lnf, M->wte, NULL, B, T, C, V));
    OP(OP_CE, kern_cuda_softmax_crossentropy_forward(M->losses, M->probs, M->logits,
                                                     M->targets, B * T, V));
    OP(OP_CE, kern_cuda_softmax_crossentropy_backward(M->dlogits, M->probs, M->targets,
                                                      1.0f / (float)(B * T), B * T, V));
    OP(OP_MM, kern_cuda_matmul_backward(M->dln, M->dwte, NULL, M->dlogits, M->lnf, M->wte, B, T,
                                        C, V));
    OP(OP_LN, kern_cuda_layernorm_backward(M->dx, M->dlnfw, M->dlnfb, M->dln, M->x2, M->lnfw,
                                           M->mf, M->rf, B, T, C));
    for (int l = M->L - 1; l >= 0; l--) {
        /* dx is d(x2): into the MLP branch and the skip (dx1 = dx + branch) */
        OP(OP_RES, kern_cuda_residual_backward(M->dx1, M->dpr, M->dx, (int)BTC));
        OP(OP_MM, kern_cuda_matmul_backward(M->dfcg, M->dwpr, M->dbpr, M->dpr, M->fcg, M->wpr, B,
                                            T, 4 * C, C));
        OP(OP_GELU, kern_cuda_gelu_backward(M->dfc, M->fc, M->dfcg, (int)(4 * BTC)));
        OP(OP_MM, kern_cuda_matmul_backward(M->dln, M->dwfc, M->dbfc, M->dfc, M->ln2, M->wfc, B,
                                            T, C, 4 * C));
        OP(OP_LN, kern_cuda_layernorm_backward(M->dx1, M->dln2w, M->dln2b, M->dln, M->x1, M->ln2w,
                                               M->m2, M->r2, B, T, C));
        OP(OP_RES, kern_cuda_residual_backward(M->dx, M->dao, M->dx1, (int)BTC));
        OP(OP_MM, kern_cuda_matmul_backward(M->datty, M->dwo, M->dbo, M->dao, M->atty, M->wo, B, T,
                                            C, C));
        OP(OP_ATT, kern_cuda_attention_backward(M->dqkv, M->dpreatt, M->datt, M->datty, M->qkv,
                                                M->att, B, T, C, NH));
        OP(OP_MM, kern_cuda_matmul_backward(M->dln, M->dwqkv, M->dbqkv, M->dqkv, M->ln1, M->wqkv,
                                            B, T, C, 3 * C));
        OP(OP_LN, kern_cuda_layernorm_backward(M->dx, M->dln1w, M->dln1b, M->dln, M->x0, M->ln1w,
                                               M->m1, M->r1, B, T, C));
    }
    OP(OP_ENC, kern_cuda_encoder_backward(M->dwte, M->dwpe, M->dx, M->tokens, B, T, C));
    OP(OP_ADAM, kern_cuda_adamw(M->p, M->g, M->m, M->v, M->nparams, 1e-4f, 0.9f, 0.95f, 1e-8f,
                                0.1f, t));
    return kern_cuda_sync() < 0 ? -1 : 0;
}

int main(int argc, char **argv) {
    int dims[7] = {12, 768, 12, 50257, 1024, 4, 10};
    int a = 1;
    if (a < argc && !strcmp(argv[a], "--ops")) {
        per_op = 1;
        a++;
    }
    if (a < argc && (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h"))) {
        printf("Usage: bench-cuda [--ops] [L C NH V T B ITERS]\n");
        return 0;
    }
    if (argc - a != 0 && argc - a != 7) {
        fprintf(stderr, "Usage: bench-cuda [--ops] [L C NH V T B ITERS]\n");
        return 2;
    }
    for (int i = 0; a < argc && i < 7; i++)
        if (parse_int(argv[a + i], &dims[i]) < 0) {
            fprintf(stderr, "bench-cuda: bad argument '%s'\n", argv[a + i]);
            return 2;
        }
    if (dims[1] % dims[2] != 0) {
        fprintf(stderr, "bench-cuda: %d heads do not divide %d channels\n", dims[2], dims[1]);
        return 2;
    }
    if (kern_cuda_device_count() <= 0 || kern_cuda_init() < 0) {
        fprintf(stderr, "bench-cuda: no CUDA device\n");
        return 77;
    }
    struct model M;
    memset(&M, 0, sizeof(M));
    M.L = dims[0], M.C = dims[1], M.NH = dims[2], M.V = dims[3], M.T = dims[4], M.B = dims[5];
    int iters = dims[6];
    size_t C = (size_t)M.C, V = (size_t)M.V, T = (size_t)M.T, BT = (size_t)M.B * T,
           BTC = BT * C, att = (size_t)M.B * M.NH * T * T;
    float ws = 0.04f;
    M.wte = dev(V * C, ws), M.wpe = dev(T * C, ws);
    M.ln1w = dev(C, 1), M.ln1b = dev(C, ws), M.wqkv = dev(3 * C * C, ws), M.bqkv = dev(3 * C, ws);
    M.wo = dev(C * C, ws), M.bo = dev(C, ws), M.ln2w = dev(C, 1), M.ln2b = dev(C, ws);
    M.wfc = dev(4 * C * C, ws), M.bfc = dev(4 * C, ws), M.wpr = dev(4 * C * C, ws);
    M.bpr = dev(C, ws), M.lnfw = dev(C, 1), M.lnfb = dev(C, ws);
    M.dwte = dev(V * C, 0), M.dwpe = dev(T * C, 0), M.dln1w = dev(C, 0), M.dln1b = dev(C, 0);
    M.dwqkv = dev(3 * C * C, 0), M.dbqkv = dev(3 * C, 0), M.dwo = dev(C * C, 0);
    M.dbo = dev(C, 0), M.dln2w = dev(C, 0), M.dln2b = dev(C, 0), M.dwfc = dev(4 * C * C, 0);
    M.dbfc = dev(4 * C, 0), M.dwpr = dev(4 * C * C, 0), M.dbpr = dev(C, 0);
    M.dlnfw = dev(C, 0), M.dlnfb = dev(C, 0);
    M.x0 = dev(BTC, 1), M.ln1 = dev(BTC, 1), M.m1 = dev(BT, 1), M.r1 = dev(BT, 1);
    M.qkv = dev(3 * BTC, 1), M.preatt = dev(att, 1), M.att = dev(att, 1), M.atty = dev(BTC, 1);
    M.ao = dev(BTC, 1), M.x1 = dev(BTC, 1), M.ln2 = dev(BTC, 1), M.m2 = dev(BT, 1);
    M.r2 = dev(BT, 1), M.fc = dev(4 * BTC, 1), M.fcg = dev(4 * BTC, 1), M.pr = dev(BTC, 1);
    M.x2 = dev(BTC, 1), M.lnf = dev(BTC, 1), M.mf = dev(BT, 1), M.rf = dev(BT, 1);
    M.logits = dev(BT * V, 1), M.probs = dev(BT * V, 1), M.losses = dev(BT, 1);
    M.dx = dev(BTC, 1), M.dln = dev(BTC, 1), M.dqkv = dev(3 * BTC, 1), M.dpreatt = dev(att, 1);
    M.datt = dev(att, 1), M.datty = dev(BTC, 1), M.dao = dev(BTC, 1), M.dfc = dev(4 * BTC, 1);
    M.dfcg = dev(4 * BTC, 1), M.dpr = dev(BTC, 1), M.dx1 = dev(BTC, 1), M.dlogits = dev(BT * V, 1);
    M.nparams = V * C + T * C + (size_t)M.L * (12 * C * C + 13 * C) + 2 * C;
    M.p = dev(M.nparams, ws), M.g = dev(M.nparams, 0.001f), M.m = dev(M.nparams, 0);
    M.v = dev(M.nparams, 0);
    int *ht = malloc(2 * BT * sizeof(int));
    void *dt = NULL, *dg = NULL;
    if (!ht || kern_cuda_malloc(&dt, BT * sizeof(int)) < 0 ||
        kern_cuda_malloc(&dg, BT * sizeof(int)) < 0)
        return 1;
    for (size_t i = 0; i < 2 * BT; i++)
        ht[i] = (int)((frand() + 0.5f) * (float)(M.V - 1));
    if (kern_cuda_upload(dt, ht, BT * sizeof(int)) < 0 ||
        kern_cuda_upload(dg, ht + BT, BT * sizeof(int)) < 0)
        return 1;
    free(ht);
    M.tokens = dt, M.targets = dg;
    if (kern_cuda_sync() < 0 || step(&M, 1) < 0) { /* warm-up: cuBLAS picks its kernels */
        fprintf(stderr, "bench-cuda: CUDA error in the warm-up step\n");
        return 1;
    }
    memset(op_ms, 0, sizeof(op_ms));
    double *ms = calloc((size_t)iters, sizeof(double));
    if (!ms)
        return 1;
    for (int i = 0; i < iters; i++) {
        double t0 = now();
        if (step(&M, i + 2) < 0) {
            fprintf(stderr, "bench-cuda: CUDA error in step %d\n", i + 2);
            return 1;
        }
        ms[i] = 1e3 * (now() - t0);
    }
    qsort(ms, (size_t)iters, sizeof(double), cmp_double);
    double med = iters % 2 ? ms[iters / 2] : 0.5 * (ms[iters / 2 - 1] + ms[iters / 2]);
    printf("tokens_per_s=%.0f ms_per_step=%.3f ms_min=%.3f ms_max=%.3f params=%zu\n",
           (double)BT / (med / 1e3), med, ms[0], ms[iters - 1], M.nparams);
    if (per_op)
        for (int k = 0; k < NOPS; k++)
            printf("op %-10s %10.3f ms per step\n", op_names[k], op_ms[k] / iters);
    free(ms);
    for (int i = 0; i < nbufs; i++)
        kern_cuda_free(bufs[i]);
    kern_cuda_free(dt);
    kern_cuda_free(dg);
    kern_cuda_done();
    return 0;
}
