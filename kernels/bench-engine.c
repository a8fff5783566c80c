/* bench-engine.c: forward + backward throughput of the CPU kernels through kernels.h's layer
 * API, the number scripts/bench.d/engine puts beside PyTorch's on the same model.
 *
 * Usage: bench-engine [--ops] L C NH V T B ITERS
 * One untimed warm-up iteration, then ITERS timed ones over one micro-batch of B random
 * sequences (embeddings, blocks, final LayerNorm, tied head with the loss, and the whole
 * backward; no optimizer step). Prints one line:
 *   tokens_per_s=<B*T*ITERS / seconds> ms_per_iter=<ms> cpu_ms_per_iter=<process CPU ms>
 *   loss=<mean loss of the last iteration>
 * (cpu_ms above ms x threads means the machine was busy; below, threads idled.)
 * --ops instead times each op of one block and of the head, one call each after a warm-up
 * call, on the same shapes (wall and process-CPU ms per op; the figures to look at when
 * tuning a kernel).
 * Threads: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS, as the caller sets them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

#define BENCH_MAX_LAYERS 130

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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

/* Fills x with a deterministic pattern in [-0.5, 0.5). */
static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((i * 2654435761u) % 1000u) / 1000.0f - 0.5f;
}

#define OP(name, stmt)                                                                      \
    do {                                                                                    \
        stmt;                                                                               \
        double w0 = now(), c0 = cpu_now();                                                  \
        stmt;                                                                               \
        printf("%-22s %10.2f %10.2f\n", name, 1e3 * (now() - w0), 1e3 * (cpu_now() - c0)); \
    } while (0)

/* --ops: wall and CPU ms of each op of one block and of the head at the config's shapes. */
static int bench_ops(const struct kern_config *cfg, int B) {
    int T = cfg->seq_len, C = cfg->channels, NH = cfg->heads, V = cfg->vocab, N = B * T;
    size_t att_n = (size_t)B * NH * T * T, big = (size_t)N * 4 * C;
    size_t wn = (size_t)V * C > (size_t)16 * C * C ? (size_t)V * C : (size_t)16 * C * C;
    float *x = malloc((size_t)N * C * sizeof(float)), *w = malloc(wn * sizeof(float));
    float *bias = malloc((size_t)4 * C * sizeof(float)), *out = malloc(big * sizeof(float));
    float *dout = malloc(big * sizeof(float)), *dx = malloc(big * sizeof(float));
    float *dw = malloc(wn * sizeof(float)), *db = malloc((size_t)4 * C * sizeof(float));
    float *qkv = malloc((size_t)N * 3 * C * sizeof(float));
    float *dqkv = malloc((size_t)N * 3 * C * sizeof(float));
    float *att = malloc(att_n * sizeof(float)), *pre = malloc(att_n * sizeof(float));
    float *datt = malloc(att_n * sizeof(float)), *mean = malloc((size_t)N * sizeof(float));
    float *rstd = malloc((size_t)N * sizeof(float)), *losses = malloc((size_t)N * sizeof(float));
    float *logits = malloc((size_t)N * V * sizeof(float));
    int *tgt = malloc((size_t)N * sizeof(int)), r = 1;
    if (!x || !w || !bias || !out || !dout || !dx || !dw || !db || !qkv || !dqkv || !att ||
        !pre || !datt || !mean || !rstd || !losses || !logits || !tgt) {
        fprintf(stderr, "bench-engine: out of memory\n");
        goto out;
    }
    fill(x, (size_t)N * C), fill(w, wn), fill(bias, (size_t)4 * C), fill(dout, big);
    fill(qkv, (size_t)N * 3 * C), fill(out, big);
    memset(dx, 0, big * sizeof(float)), memset(dw, 0, wn * sizeof(float));
    memset(db, 0, (size_t)4 * C * sizeof(float)), memset(dqkv, 0, (size_t)N * 3 * C * 4);
    for (int i = 0; i < N; i++)
        tgt[i] = (int)(((unsigned)i * 7919u) % (unsigned)V);
    double sum;
    printf("%-22s %10s %10s\n", "op", "wall_ms", "cpu_ms");
    OP("layernorm fwd", kern_layernorm_forward(out, mean, rstd, x, w, bias, B, T, C));
    OP("layernorm bwd", kern_layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, B, T, C));
    OP("matmul fwd qkv", kern_matmul_forward(out, x, w, bias, B, T, C, 3 * C));
    OP("matmul fwd attproj", kern_matmul_forward(out, x, w, bias, B, T, C, C));
    OP("matmul fwd fc", kern_matmul_forward(out, x, w, bias, B, T, C, 4 * C));
    OP("matmul fwd fcproj", kern_matmul_forward(dx, out, w, bias, B, T, 4 * C, C));
    OP("matmul bwd qkv", kern_matmul_backward(dx, dw, db, dout, x, w, B, T, C, 3 * C));
    OP("matmul bwd attproj", kern_matmul_backward(dx, dw, db, dout, x, w, B, T, C, C));
    OP("matmul bwd fc", kern_matmul_backward(dx, dw, db, dout, x, w, B, T, C, 4 * C));
    OP("matmul bwd fcproj", kern_matmul_backward(dx, dw, db, dout, out, w, B, T, 4 * C, C));
    OP("attention fwd", kern_attention_forward(out, pre, att, qkv, B, T, C, NH));
    OP("attention bwd", kern_attention_backward(dqkv, pre, datt, dout, qkv, att, B, T, C, NH));
    OP("gelu fwd", kern_gelu_forward(out, dout, N * 4 * C));
    OP("gelu bwd", kern_gelu_backward(dx, out, dout, N * 4 * C));
    OP("residual fwd", kern_residual_forward(out, x, dout, N * C));
    OP("residual bwd", kern_residual_backward(dx, out, dout, N * C));
    OP("head matmul fwd", kern_matmul_forward(logits, x, w, NULL, B, T, C, V));
    OP("head softmax+xent", kern_softmax_crossentropy_forward(losses, logits, logits, tgt, N, V));
    OP("head fwd+bwd (all)", kern_head_forward_backward(cfg, w, B, x, tgt, 1e-3f, logits, losses,
                                                        dw, dx, &sum));
    OP("encoder bwd", kern_encoder_backward(dw, dx, dout, tgt, B, T, C));
    r = 0;
out:
    free(x), free(w), free(bias), free(out), free(dout), free(dx), free(dw), free(db);
    free(qkv), free(dqkv), free(att), free(pre), free(datt), free(mean), free(rstd);
    free(losses), free(logits), free(tgt);
    return r;
}

int main(int argc, char **argv) {
    struct kern_config cfg;
    int B, iters, r = 1, ops = 0;
    if (argc > 1 && strcmp(argv[1], "--ops") == 0) {
        ops = 1;
        argc--, argv++;
    }
    if (argc != 8 || parse_int(argv[1], &cfg.layers) < 0 || parse_int(argv[2], &cfg.channels) < 0 ||
        parse_int(argv[3], &cfg.heads) < 0 || parse_int(argv[4], &cfg.vocab) < 0 ||
        parse_int(argv[5], &cfg.seq_len) < 0 || parse_int(argv[6], &B) < 0 ||
        parse_int(argv[7], &iters) < 0 || kern_config_check(&cfg) < 0 ||
        cfg.layers + 2 > BENCH_MAX_LAYERS) {
        fprintf(stderr, "usage: bench-engine [--ops] L C NH V T B ITERS (positive; NH divides C; "
                        "V <= 65536; L <= %d)\n", BENCH_MAX_LAYERS - 2);
        return 2;
    }
    if (ops)
        return bench_ops(&cfg, B);
    int nl = kern_num_layers(&cfg), L = cfg.layers, T = cfg.seq_len;
    size_t BT = (size_t)B * T, BTC = BT * cfg.channels;
    float *params[BENCH_MAX_LAYERS] = {0}, *grads[BENCH_MAX_LAYERS] = {0};
    float *acts[BENCH_MAX_LAYERS] = {0}, *x[BENCH_MAX_LAYERS] = {0};
    float *scratch = NULL, *dx = NULL, *dy = NULL, *logits = NULL, *losses = NULL;
    int *inp = NULL, *tgt = NULL;
    for (int l = 0; l < nl; l++) {
        size_t n = kern_layer_param_count(&cfg, l);
        params[l] = malloc(n * sizeof(float));
        grads[l] = calloc(n, sizeof(float));
        acts[l] = malloc((kern_layer_act_count(&cfg, l, B) + 1) * sizeof(float));
        x[l] = malloc(BTC * sizeof(float));
        if (!params[l] || !grads[l] || !acts[l] || !x[l])
            goto oom;
        kern_layer_init(&cfg, l, 1337, params[l]);
    }
    scratch = malloc(kern_scratch_count(&cfg, B) * sizeof(float));
    dx = malloc(BTC * sizeof(float));
    dy = malloc(BTC * sizeof(float));
    logits = malloc(BT * (size_t)cfg.vocab * sizeof(float));
    losses = malloc(BT * sizeof(float));
    inp = malloc(BT * sizeof(int));
    tgt = malloc(BT * sizeof(int));
    if (!scratch || !dx || !dy || !logits || !losses || !inp || !tgt)
        goto oom;
    uint64_t s = 88172645463325252ULL;
    for (size_t i = 0; i < BT; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        inp[i] = (int)(s % (uint64_t)cfg.vocab);
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        tgt[i] = (int)(s % (uint64_t)cfg.vocab);
    }

    double t0 = 0, c0 = 0, loss = 0;
    for (int it = 0; it <= iters; it++) {
        if (it == 1) {
            t0 = now();
            c0 = cpu_now();
        }
        for (int l = 0; l < nl; l++)
            memset(grads[l], 0, kern_layer_param_count(&cfg, l) * sizeof(float));
        kern_layer_forward(&cfg, 0, params[0], B, inp, NULL, x[0], acts[0], scratch);
        for (int l = 1; l <= L + 1; l++)
            kern_layer_forward(&cfg, l, params[l], B, NULL, x[l - 1], x[l], acts[l], scratch);
        double sum = 0;
        kern_head_forward_backward(&cfg, params[0], B, x[L + 1], tgt, (float)(1.0 / (double)BT),
                                   logits, losses, grads[0], dx, &sum);
        float *dout = dx, *din = dy;
        for (int l = L + 1; l >= 1; l--) {
            kern_layer_backward(&cfg, l, params[l], grads[l], B, NULL, x[l - 1], acts[l], dout,
                                din, scratch);
            float *tmp = dout;
            dout = din;
            din = tmp;
        }
        kern_layer_backward(&cfg, 0, params[0], grads[0], B, inp, NULL, acts[0], dout, NULL,
                            scratch);
        loss = sum / (double)BT;
    }
    double dt = now() - t0, dc = cpu_now() - c0;
    printf("tokens_per_s=%.1f ms_per_iter=%.2f cpu_ms_per_iter=%.2f loss=%.4f\n",
           (double)BT * iters / dt, 1e3 * dt / iters, 1e3 * dc / iters, loss);
    r = 0;
    goto out;
oom:
    fprintf(stderr, "bench-engine: out of memory\n");
out:
    for (int l = 0; l < nl; l++) {
        free(params[l]);
        free(grads[l]);
        free(acts[l]);
        free(x[l]);
    }
    free(scratch);
    free(dx);
    free(dy);
    free(logits);
    free(losses);
    free(inp);
    free(tgt);
    return r;
}
