/* analytic.c: a cost model for a GPT-style model nobody profiled.
 *
 * Throughput of a (dp, pp) shape from first principles: 1F1B pipeline time with its
 * (pp - 1)-microbatch bubble, activation sends between stages, and the data-parallel
 * gradient all-reduce of the largest stage (ring: 2 (dp-1)/dp of the bytes). A shape is kept
 * only if its fullest stage fits in GPU memory: fp32 weights, gradients and two Adam moments
 * (16 bytes per parameter) plus the activations of the micro-batches 1F1B keeps in flight.
 * Migration and restart constants reuse Parcae's "other model" formulas. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "planner-internal.h"
#include "planner.h"

int plan_cost_analytic(const struct plan_model_desc *d, struct plan_cost **ret) {
    if (!d || !ret || d->layers < 1 || d->layers + 2 > PLAN_MAX_LAYERS || d->hidden < 1 ||
        d->seq < 1 || d->vocab < 1 || d->micro_batch < 1 || d->global_batch < d->micro_batch ||
        d->gpu_tflops <= 0 || d->gpu_mem_gib <= 0 || d->net_gbps <= 0 || d->max_n < 1 ||
        d->max_n > 65536)
        return -EINVAL;
    int r = 0;
    struct plan_cost *c = st_calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    snprintf(c->model, sizeof(c->model), "analytic-gpt-%dx%d", d->layers, d->hidden);
    c->family = PLAN_FAMILY_OTHER;
    c->micro_batch = d->micro_batch;
    c->global_batch = d->global_batch;
    c->state_bytes_per_param = 12;
    c->ckpt_ms = 14000;
    c->rdzv_ms = 6600;
    c->proc_ms = 240;
    c->restart_extra_ms = 0;
    double h = d->hidden, S = d->seq, V = d->vocab;
    int L = d->layers + 2;
    c->nlayers = L;
    c->layer_params = st_calloc((size_t)L, sizeof(double));
    if (!c->layer_params) {
        r = -ENOMEM;
        goto out;
    }
    plan__gpt_layer_params(d, c->layer_params);
    /* p2p: fixed latency plus bytes over the link */
    double bw = d->net_gbps * 1e9 / 8; /* bytes/s */
    c->np2p = 0;
    for (double b = 4; b <= 1073741824.0 && c->np2p < 64; b *= 2) {
        c->p2p_bytes[c->np2p] = b;
        c->p2p_us[c->np2p++] = 140 + b / bw * 1e6;
    }
    for (int i = 0; i <= PLAN_MAX_LAYERS; i++)
        c->build_ms[i] = -1;
    for (int pp = 1; pp <= L; pp++)
        c->build_ms[pp] = 500 + 100.0 * ceil((double)L / pp);
    c->pp_min = 1;
    c->pp_max = L;
    /* flops per sample: fwd+bwd = 3x fwd; block fwd 24 S h^2 + 4 S^2 h; head 2 S h V */
    double fl_block = 3 * (24 * S * h * h + 4 * S * S * h);
    double fl_head = 3 * 2 * S * h * V;
    double act_layer = plan__act_layer_bytes(d);
    double mem = plan__mem_budget(d);
    double flops = d->gpu_tflops * 1e12;
    size_t cap = 0;
    for (int pp = 1; pp <= ST_MIN(L, d->max_n); pp++)
        cap += (size_t)(d->max_n / pp);
    if (cap > PLAN_MAX_SHAPES)
        cap = PLAN_MAX_SHAPES;
    c->shapes = st_calloc(cap + 1, sizeof(*c->shapes));
    c->samples_per_s = st_calloc(cap + 1, sizeof(double));
    if (!c->shapes || !c->samples_per_s) {
        r = -ENOMEM;
        goto out;
    }
    c->prefix = NULL;
    int b[PLAN_MAX_LAYERS + 1];
    for (int pp = 1; pp <= ST_MIN(L, d->max_n); pp++) {
        plan_cost_partition(c, pp, b);
        double tmax = 0, pmax = 0;
        int lmax = 0;
        for (int s = 0; s < pp; s++) {
            double fl = 0, pr = 0;
            for (int l = b[s]; l < b[s + 1]; l++) {
                fl += (l == 0 || l == L - 1) ? (l == 0 ? fl_head : 0) : fl_block;
                pr += c->layer_params[l];
            }
            tmax = ST_MAX(tmax, fl * d->micro_batch / flops);
            pmax = ST_MAX(pmax, pr);
            lmax = ST_MAX(lmax, b[s + 1] - b[s]);
        }
        for (int dp = 1; dp * pp <= d->max_n && dp * d->micro_batch <= d->global_batch; dp++) {
            if ((size_t)c->nshapes >= cap)
                break;
            int m = (d->global_batch + dp * d->micro_batch - 1) / (dp * d->micro_batch);
            if (plan__stage_bytes(pmax, lmax, act_layer, pp, m) > mem)
                continue;
            double send = pp > 1 ? 2 * S * h * d->micro_batch * 2 / bw : 0; /* fp16 acts */
            double pipe = (m + pp - 1) * (tmax + 2 * send);
            double ar = dp > 1 ? pmax * 4 * 2.0 * (dp - 1) / dp / bw : 0;
            double iter = pipe + ar;
            c->shapes[c->nshapes] = (struct plan_shape){dp, pp};
            c->samples_per_s[c->nshapes++] = m * dp * d->micro_batch / iter;
        }
    }
    if (c->nshapes == 0) {
        r = -EINVAL; /* nothing fits in memory */
        goto out;
    }
    if ((r = plan__cost_finish(c)) < 0)
        goto out;
    *ret = c;
    c = NULL;
out:
    plan_cost_free(c);
    return r;
}

/* See planner-internal.h. */
void plan__gpt_layer_params(const struct plan_model_desc *d, double *ret) {
    double h = d->hidden, S = d->seq, V = d->vocab;
    ret[0] = V * h + S * h;
    for (int i = 1; i <= d->layers; i++)
        ret[i] = 12 * h * h + 13 * h;
    ret[d->layers + 1] = 2 * h; /* final norm; the head is tied to the embedding */
}

/* See planner-internal.h. */
void plan__desc_from_spec(const struct st_spec *spec, struct plan_model_desc *ret) {
    *ret = (struct plan_model_desc){
        .layers = spec->model.layers,
        .hidden = spec->model.hidden,
        .seq = spec->model.seq_len,
        .vocab = spec->model.vocab,
        .micro_batch = spec->training.micro_batch,
        .global_batch = spec->training.global_batch,
        .gpu_tflops = spec->fleet.gpu_tflops,
        .gpu_mem_gib = spec->fleet.gpu_memory ? (double)spec->fleet.gpu_memory / (1 << 30) : 16,
        .net_gbps = spec->fleet.net_gbps,
        .max_n = ST_MAX(spec->fleet.max, 1) * ST_MAX(spec->fleet.gpus_per_instance, 1),
    };
}

/* See planner.h. */
int plan_cost_from_spec(const struct st_spec *spec, struct plan_cost **ret) {
    if (!spec || !ret)
        return -EINVAL;
    if (spec->model.profile[0])
        return -EOPNOTSUPP; /* profiled models are simulated, not trained */
    struct plan_model_desc d;
    plan__desc_from_spec(spec, &d);
    int r = plan_cost_analytic(&d, ret);
    if (r >= 0)
        (*ret)->meas_at_boundary = !spec->fleet.data_plane_overlap;
    return r;
}
