/* layers.c: the model as L+2 layers with one flat parameter vector each.
 *
 * The layer is the unit a pipeline stage owns, a ZeRO-1 shard splits and a checkpoint stores,
 * so its layout (tensor order, offsets, names) is part of the on-disk contract and documented
 * in docs/engine.md. Forward saves per-micro-batch activations into caller memory so that a
 * 1F1B schedule can keep several micro-batches in flight; backward reads them back. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "ops-internal.h"

enum { BLK_LN1W, BLK_LN1B, BLK_QKVW, BLK_QKVB, BLK_ATTPROJW, BLK_ATTPROJB, BLK_LN2W, BLK_LN2B,
       BLK_FCW, BLK_FCB, BLK_FCPROJW, BLK_FCPROJB, BLK_NTENSORS };

static const char *const block_names[BLK_NTENSORS] = {
    "ln1.w", "ln1.b", "qkv.w", "qkv.b", "attproj.w", "attproj.b",
    "ln2.w", "ln2.b", "fc.w",  "fc.b",  "fcproj.w",  "fcproj.b"};

int kern_config_check(const struct kern_config *cfg) {
    if (!cfg || cfg->layers <= 0 || cfg->channels <= 0 || cfg->heads <= 0 || cfg->vocab <= 0 ||
        cfg->seq_len <= 0)
        return -EINVAL;
    if (cfg->channels % cfg->heads != 0 || cfg->vocab > 65536)
        return -EINVAL;
    return 0;
}

int kern_num_layers(const struct kern_config *cfg) { return cfg->layers + 2; }

static int layer_kind(const struct kern_config *cfg, int layer) {
    if (layer < 0 || layer > cfg->layers + 1)
        return -1;
    if (layer == 0)
        return 0; /* embeddings */
    if (layer == cfg->layers + 1)
        return 2; /* final LN */
    return 1;     /* block */
}

int kern_layer_tensor_count(const struct kern_config *cfg, int layer) {
    switch (layer_kind(cfg, layer)) {
    case 0: return 2;
    case 1: return BLK_NTENSORS;
    case 2: return 2;
    default: return 0;
    }
}

static void set_info(struct kern_tensor_info *ti, const char *name, size_t offset, int rows,
                     int cols, int ndim) {
    memset(ti, 0, sizeof(*ti));
    strncpy(ti->name, name, KERN_TENSOR_NAME_MAX - 1);
    ti->offset = offset;
    ti->numel = (size_t)rows * (size_t)cols;
    ti->ndim = ndim;
    ti->shape[0] = rows;
    ti->shape[1] = cols;
    ti->decay = ndim == 2;
}

int kern_layer_tensor(const struct kern_config *cfg, int layer, int idx,
                      struct kern_tensor_info *ret_info) {
    int kind = layer_kind(cfg, layer);
    if (!ret_info || idx < 0 || idx >= kern_layer_tensor_count(cfg, layer))
        return -EINVAL;
    size_t C = (size_t)cfg->channels;
    struct kern_tensor_info ti;
    if (kind == 0) {
        if (idx == 0)
            set_info(&ti, "wte", 0, cfg->vocab, cfg->channels, 2);
        else
            set_info(&ti, "wpe", (size_t)cfg->vocab * C, cfg->seq_len, cfg->channels, 2);
    } else if (kind == 2) {
        set_info(&ti, idx == 0 ? "lnf.w" : "lnf.b", idx * C, cfg->channels, 1, 1);
    } else {
        /* rows, cols per block tensor; cols == 1 means a vector */
        const int rows[BLK_NTENSORS] = {1, 1, 3, 3, 1, 1, 1, 1, 4, 4, 1, 1};
        const int is_mat[BLK_NTENSORS] = {0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0};
        size_t offset = 0;
        for (int i = 0; i <= idx; i++) {
            size_t r = (size_t)rows[i] * C;
            size_t c = is_mat[i] ? (i == BLK_FCPROJW ? 4 * C : C) : 1;
            if (i == BLK_FCPROJW)
                r = C;
            if (i == idx)
                set_info(&ti, block_names[i], offset, (int)r, (int)c, is_mat[i] ? 2 : 1);
            offset += r * c;
        }
    }
    *ret_info = ti;
    return 0;
}

size_t kern_layer_param_count(const struct kern_config *cfg, int layer) {
    size_t C = (size_t)cfg->channels;
    switch (layer_kind(cfg, layer)) {
    case 0: return ((size_t)cfg->vocab + (size_t)cfg->seq_len) * C;
    case 1: return 12 * C * C + 13 * C;
    case 2: return 2 * C;
    default: return 0;
    }
}

size_t kern_model_param_count(const struct kern_config *cfg) {
    size_t n = 0;
    for (int l = 0; l < kern_num_layers(cfg); l++)
        n += kern_layer_param_count(cfg, l);
    return n;
}

/* splitmix64: a bijective mixer, used as a counter-based generator. */
static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Standard normal for element i of stream key (Box-Muller on the two 32-bit halves). */
static double normal_at(uint64_t key, uint64_t i) {
    uint64_t r = mix64(key ^ mix64(i));
    double u1 = ((double)(r >> 32) + 0.5) / 4294967296.0;
    double u2 = ((double)(r & 0xffffffffULL) + 0.5) / 4294967296.0;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

int kern_layer_init(const struct kern_config *cfg, int layer, uint64_t seed, float *params) {
    if (kern_config_check(cfg) < 0 || layer_kind(cfg, layer) < 0 || !params)
        return -EINVAL;
    int nt = kern_layer_tensor_count(cfg, layer);
    for (int k = 0; k < nt; k++) {
        struct kern_tensor_info ti;
        kern_layer_tensor(cfg, layer, k, &ti);
        float *p = params + ti.offset;
        const char *dot = strchr(ti.name, '.');
        int is_ln = strncmp(ti.name, "ln", 2) == 0;
        if (is_ln && dot && dot[1] == 'w') {
            for (size_t i = 0; i < ti.numel; i++)
                p[i] = 1.0f;
        } else if (ti.ndim == 1) {
            memset(p, 0, ti.numel * sizeof(float));
        } else {
            double std = 0.02;
            if (strcmp(ti.name, "attproj.w") == 0 || strcmp(ti.name, "fcproj.w") == 0)
                std = 0.02 / sqrt(2.0 * cfg->layers);
            uint64_t key = mix64(mix64(mix64(seed) ^ (uint64_t)layer) ^ (uint64_t)(k + 1));
            for (size_t i = 0; i < ti.numel; i++)
                p[i] = (float)(std * normal_at(key, i));
        }
    }
    return 0;
}

/* ---- activations ---------------------------------------------------------------------- */

/* Offsets of a block's saved activations, in floats. */
struct block_acts {
    size_t ln1, ln1_mean, ln1_rstd, qkv, atty, att, residual2, ln2, ln2_mean, ln2_rstd, fch,
        fch_gelu, total;
};

static struct block_acts block_layout(const struct kern_config *cfg, int B) {
    size_t BT = (size_t)B * cfg->seq_len, C = (size_t)cfg->channels;
    size_t att = (size_t)B * cfg->heads * cfg->seq_len * cfg->seq_len;
    struct block_acts a;
    size_t o = 0;
    a.ln1 = o; o += BT * C;
    a.ln1_mean = o; o += BT;
    a.ln1_rstd = o; o += BT;
    a.qkv = o; o += 3 * BT * C;
    a.atty = o; o += BT * C;
    a.att = o; o += att;
    a.residual2 = o; o += BT * C;
    a.ln2 = o; o += BT * C;
    a.ln2_mean = o; o += BT;
    a.ln2_rstd = o; o += BT;
    a.fch = o; o += 4 * BT * C;
    a.fch_gelu = o; o += 4 * BT * C;
    a.total = o;
    return a;
}

size_t kern_layer_act_count(const struct kern_config *cfg, int layer, int B) {
    switch (layer_kind(cfg, layer)) {
    case 0: return 0;
    case 1: return block_layout(cfg, B).total;
    case 2: return 2 * (size_t)B * cfg->seq_len;
    default: return 0;
    }
}

/* Scratch: preatt, dpreatt, datt (B,NH,T,T each), then 14 (B,T,C)-sized slots. */
size_t kern_scratch_count(const struct kern_config *cfg, int B) {
    size_t BT = (size_t)B * cfg->seq_len, C = (size_t)cfg->channels;
    size_t att = (size_t)B * cfg->heads * cfg->seq_len * cfg->seq_len;
    return 3 * att + 14 * BT * C;
}

int kern_layer_forward(const struct kern_config *cfg, int layer, const float *params, int B,
                       const int *tokens, const float *in, float *out, float *acts,
                       float *scratch) {
    int kind = layer_kind(cfg, layer);
    if (kind < 0 || !params || !out || B <= 0)
        return -EINVAL;
    int T = cfg->seq_len, C = cfg->channels, NH = cfg->heads;
    size_t BTC = (size_t)B * T * C;
    if (kind == 0) {
        if (!tokens)
            return -EINVAL;
        kern_encoder_forward(out, tokens, params, params + (size_t)cfg->vocab * C, B, T, C);
        return 0;
    }
    if (!in || !acts)
        return -EINVAL;
    if (kind == 2) {
        kern_layernorm_forward(out, acts, acts + (size_t)B * T, in, params, params + C, B, T, C);
        return 0;
    }
    if (!scratch)
        return -EINVAL;
    struct kern_tensor_info ti[BLK_NTENSORS];
    for (int k = 0; k < BLK_NTENSORS; k++)
        kern_layer_tensor(cfg, layer, k, &ti[k]);
#define P(k) (params + ti[k].offset)
    struct block_acts a = block_layout(cfg, B);
    size_t att = (size_t)B * NH * T * T;
    float *preatt = scratch;
    float *tmp = scratch + 3 * att; /* attproj / fcproj output */
    kern_layernorm_forward(acts + a.ln1, acts + a.ln1_mean, acts + a.ln1_rstd, in, P(BLK_LN1W),
                           P(BLK_LN1B), B, T, C);
    kern_matmul_forward(acts + a.qkv, acts + a.ln1, P(BLK_QKVW), P(BLK_QKVB), B, T, C, 3 * C);
    kern_attention_forward(acts + a.atty, preatt, acts + a.att, acts + a.qkv, B, T, C, NH);
    kern_matmul_forward(tmp, acts + a.atty, P(BLK_ATTPROJW), P(BLK_ATTPROJB), B, T, C, C);
    kern_residual_forward(acts + a.residual2, in, tmp, (int)BTC);
    kern_layernorm_forward(acts + a.ln2, acts + a.ln2_mean, acts + a.ln2_rstd,
                           acts + a.residual2, P(BLK_LN2W), P(BLK_LN2B), B, T, C);
    kern_matmul_forward(acts + a.fch, acts + a.ln2, P(BLK_FCW), P(BLK_FCB), B, T, C, 4 * C);
    kern_gelu_forward(acts + a.fch_gelu, acts + a.fch, (int)(4 * BTC));
    kern_matmul_forward(tmp, acts + a.fch_gelu, P(BLK_FCPROJW), P(BLK_FCPROJB), B, T, 4 * C, C);
    kern_residual_forward(out, acts + a.residual2, tmp, (int)BTC);
#undef P
    return 0;
}

int kern_layer_backward(const struct kern_config *cfg, int layer, const float *params,
                        float *grads, int B, const int *tokens, const float *in,
                        const float *acts, float *dout, float *din, float *scratch) {
    int kind = layer_kind(cfg, layer);
    if (kind < 0 || !params || !grads || !dout || B <= 0)
        return -EINVAL;
    int T = cfg->seq_len, C = cfg->channels, NH = cfg->heads;
    size_t BTC = (size_t)B * T * C;
    if (kind == 0) {
        if (!tokens)
            return -EINVAL;
        kern_encoder_backward(grads, grads + (size_t)cfg->vocab * C, dout, tokens, B, T, C);
        return 0;
    }
    if (!in || !acts || !din)
        return -EINVAL;
    if (kind == 2) {
        memset(din, 0, BTC * sizeof(float));
        kern_layernorm_backward(din, grads, grads + C, dout, in, params, acts,
                                acts + (size_t)B * T, B, T, C);
        return 0;
    }
    if (!scratch)
        return -EINVAL;
    struct kern_tensor_info ti[BLK_NTENSORS];
    for (int k = 0; k < BLK_NTENSORS; k++)
        kern_layer_tensor(cfg, layer, k, &ti[k]);
#define P(k) (params + ti[k].offset)
#define G(k) (grads + ti[k].offset)
    struct block_acts a = block_layout(cfg, B);
    size_t att = (size_t)B * NH * T * T;
    float *dpreatt = scratch + att, *datt = scratch + 2 * att;
    float *s = scratch + 3 * att + BTC; /* first slot is the forward's tmp */
    float *dfch_gelu = s, *dfch = s + 4 * BTC, *dln2 = s + 8 * BTC, *datty = s + 9 * BTC;
    float *dqkv = s + 10 * BTC; /* 3 slots; dln1 reuses dln2's slot */
    float *dln1 = dln2;
    /* out = residual2 + fcproj: dout is dresidual2's start and dfcproj */
    memset(dfch_gelu, 0, 4 * BTC * sizeof(float));
    kern_matmul_backward(dfch_gelu, G(BLK_FCPROJW), G(BLK_FCPROJB), dout, acts + a.fch_gelu,
                         P(BLK_FCPROJW), B, T, 4 * C, C);
    memset(dfch, 0, 4 * BTC * sizeof(float));
    kern_gelu_backward(dfch, acts + a.fch, dfch_gelu, (int)(4 * BTC));
    memset(dln2, 0, BTC * sizeof(float));
    kern_matmul_backward(dln2, G(BLK_FCW), G(BLK_FCB), dfch, acts + a.ln2, P(BLK_FCW), B, T, C,
                         4 * C);
    kern_layernorm_backward(dout, G(BLK_LN2W), G(BLK_LN2B), dln2, acts + a.residual2,
                            P(BLK_LN2W), acts + a.ln2_mean, acts + a.ln2_rstd, B, T, C);
    /* residual2 = in + attproj: dout now holds dresidual2 */
    memset(datty, 0, BTC * sizeof(float));
    kern_matmul_backward(datty, G(BLK_ATTPROJW), G(BLK_ATTPROJB), dout, acts + a.atty,
                         P(BLK_ATTPROJW), B, T, C, C);
    memset(dqkv, 0, 3 * BTC * sizeof(float));
    kern_attention_backward(dqkv, dpreatt, datt, datty, acts + a.qkv, acts + a.att, B, T, C, NH);
    memset(dln1, 0, BTC * sizeof(float));
    kern_matmul_backward(dln1, G(BLK_QKVW), G(BLK_QKVB), dqkv, acts + a.ln1, P(BLK_QKVW), B, T,
                         C, 3 * C);
    memcpy(din, dout, BTC * sizeof(float));
    kern_layernorm_backward(din, G(BLK_LN1W), G(BLK_LN1B), dln1, in, P(BLK_LN1W),
                            acts + a.ln1_mean, acts + a.ln1_rstd, B, T, C);
#undef P
#undef G
    return 0;
}

int kern_head_forward(const struct kern_config *cfg, const float *wte, int B, const float *x,
                      const int *targets, float *logits, float *losses, double *ret_loss_sum) {
    if (!cfg || !wte || !x || !logits || B <= 0 || (targets && !losses))
        return -EINVAL;
    int T = cfg->seq_len, C = cfg->channels, V = cfg->vocab;
    int N = B * T;
    kern_matmul_forward(logits, x, wte, NULL, B, T, C, V);
    kern_softmax_crossentropy_forward(losses, logits, logits, targets, N, V);
    if (targets) {
        double sum = 0.0;
        for (int n = 0; n < N; n++)
            sum += losses[n];
        if (ret_loss_sum)
            *ret_loss_sum = sum;
    }
    return 0;
}

int kern_head_forward_backward(const struct kern_config *cfg, const float *wte, int B,
                               const float *x, const int *targets, float dloss, float *logits,
                               float *losses, float *dwte, float *dx, double *ret_loss_sum) {
    if (!targets || !losses || !dwte || !dx)
        return -EINVAL;
    if (!cfg || !wte || !x || !logits || B <= 0)
        return -EINVAL;
    int T = cfg->seq_len, C = cfg->channels, V = cfg->vocab;
    int N = B * T;
    kern_matmul_forward(logits, x, wte, NULL, B, T, C, V);
    /* In place, one pass per row: logits -> dlogits = (probs - onehot) * dloss. */
    kern_softmax_xent_fused(logits, losses, targets, dloss, N, V);
    double sum = 0.0;
    for (int n = 0; n < N; n++)
        sum += losses[n];
    memset(dx, 0, (size_t)N * C * sizeof(float));
    kern_matmul_backward(dx, dwte, NULL, logits, x, wte, B, T, C, V);
    if (ret_loss_sum)
        *ret_loss_sum = sum;
    return 0;
}
