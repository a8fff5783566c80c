/* bench-engine.c: forward + backward throughput of the CPU kernels through kernels.h's layer
 * API, the number scripts/bench.d/engine puts beside PyTorch's on the same model.
 *
 * Usage: bench-engine L C NH V T B ITERS
 * One untimed warm-up iteration, then ITERS timed ones over one micro-batch of B random
 * sequences (embeddings, blocks, final LayerNorm, tied head with the loss, and the whole
 * backward; no optimizer step). Prints one line:
 *   tokens_per_s=<B*T*ITERS / seconds> ms_per_iter=<ms> loss=<mean loss of the last iteration>
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

static int parse_int(const char *s, int *ret) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v <= 0 || v > 1 << 30)
        return -EINVAL;
    *ret = (int)v;
    return 0;
}

int main(int argc, char **argv) {
    struct kern_config cfg;
    int B, iters, r = 1;
    if (argc != 8 || parse_int(argv[1], &cfg.layers) < 0 || parse_int(argv[2], &cfg.channels) < 0 ||
        parse_int(argv[3], &cfg.heads) < 0 || parse_int(argv[4], &cfg.vocab) < 0 ||
        parse_int(argv[5], &cfg.seq_len) < 0 || parse_int(argv[6], &B) < 0 ||
        parse_int(argv[7], &iters) < 0 || kern_config_check(&cfg) < 0 ||
        cfg.layers + 2 > BENCH_MAX_LAYERS) {
        fprintf(stderr, "usage: bench-engine L C NH V T B ITERS (positive; NH divides C; "
                        "V <= 65536; L <= %d)\n", BENCH_MAX_LAYERS - 2);
        return 2;
    }
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

    double t0 = 0, loss = 0;
    for (int it = 0; it <= iters; it++) {
        if (it == 1)
            t0 = now();
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
    double dt = now() - t0;
    printf("tokens_per_s=%.1f ms_per_iter=%.2f loss=%.4f\n", (double)BT * iters / dt,
           1e3 * dt / iters, loss);
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
