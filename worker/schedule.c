/* schedule.c: one training step — the 1F1B pipeline over this replica's micro-batches, then
 * the gradient reduction and the sharded AdamW update.
 *
 * The 1F1B order is Megatron-LM's non-interleaved schedule: stage s runs pp-s-1 warm-up
 * forwards, then alternates one forward and one backward, then drains the remaining
 * backwards. A send and the receive that must overlap with it go out as one mig_batch, so
 * neighbouring stages never block on each other's large sends.
 *
 * Reduction order (what makes shapes agree, docs/engine.md): each micro-batch's float
 * gradient is added into a double accumulator in micro-batch order; the tied wte gradient is
 * embed-side + head-side; replicas are summed by mig_reduce_scatter in replica order; the
 * global norm is summed per layer, per replica shard, in layer order; the result is rounded to
 * float once, after clipping. */
#include <math.h>
#include <string.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "tokens.h" /* st_tokens_sample */
#include "worker-internal.h"

static size_t act_bytes(const struct worker_engine *e) {
    return (size_t)e->cfg.micro_batch * e->cfg.model.seq_len * e->cfg.model.channels *
           sizeof(float);
}

/* Fills slot's tokens/targets with micro-batch m of this replica for `step`. */
static int load_micro(struct worker_engine *e, uint64_t step, int m, struct engine_slot *sl) {
    struct engine_work *w = e->work;
    int B = e->cfg.micro_batch, T = e->cfg.model.seq_len;
    int base = (e->cur.replica * w->micro + m) * B;
    for (int j = 0; j < B; j++) {
        TRY(st_tokens_sample(e->data, e->cfg.seed, step, e->cfg.global_batch, base + j, T,
                             w->sample));
        for (int t = 0; t < T; t++) {
            sl->tokens[j * T + t] = w->sample[t];
            sl->targets[j * T + t] = w->sample[t + 1];
        }
    }
    return 0;
}

static const float *head_wte(const struct worker_engine *e) {
    return e->cur.tied0 ? e->cur.tied0 : e->cur.layers[0].param;
}

/* Forward of micro-batch m through the owned layers; on the last stage also the head's
 * forward and backward, leaving dx in dbuf[0]. */
static int forward(struct worker_engine *e, uint64_t step, int m) {
    struct engine_view *v = &e->cur;
    struct engine_work *w = e->work;
    struct engine_slot *sl = &w->slots[m % w->nslots];
    const struct kern_config *mc = &e->cfg.model;
    int B = e->cfg.micro_batch;
    TRY(load_micro(e, step, m, sl));
    for (int l = v->lo; l < v->hi; l++) {
        int i = l - v->lo;
        const float *in = i == 0 ? sl->in : sl->out[i - 1];
        TRY(worker__layer_gate(e, l)); /* a migration may still be writing its parameters */
        TRY(kern_layer_forward(mc, l, v->layers[i].param, B, sl->tokens, in, sl->out[i],
                               sl->acts[i], w->scratch));
    }
    if (v->stage == v->layout.pp - 1) {
        float dloss = 1.0f / ((float)e->cfg.global_batch * (float)mc->seq_len);
        double sum = 0.0;
        if (v->tied0)
            TRY(worker__layer_gate(e, WORKER_ENGINE_TIED_LAYER));
        TRY(kern_head_forward_backward(mc, head_wte(e), B, sl->out[v->hi - v->lo - 1],
                                       sl->targets, dloss, w->logits, w->losses, w->grad_head,
                                       w->dbuf[0], &sum));
        w->loss_sum += sum;
    }
    return 0;
}

/* Backward of micro-batch m from dout in dbuf[0]; leaves din of the first owned layer in
 * *ret_din (NULL on the first stage). Then adds the float gradients into the accumulators. */
static int backward(struct worker_engine *e, int m, float **ret_din) {
    struct engine_view *v = &e->cur;
    struct engine_work *w = e->work;
    struct engine_slot *sl = &w->slots[m % w->nslots];
    const struct kern_config *mc = &e->cfg.model;
    int B = e->cfg.micro_batch;
    float *dout = w->dbuf[0], *din = w->dbuf[1];
    for (int l = v->hi - 1; l >= v->lo; l--) {
        int i = l - v->lo;
        const float *in = i == 0 ? sl->in : sl->out[i - 1];
        TRY(kern_layer_backward(mc, l, v->layers[i].param, w->grad[i], B, sl->tokens, in,
                                sl->acts[i], dout, l == 0 ? NULL : din, w->scratch));
        float *tmp = dout;
        dout = din;
        din = tmp;
    }
    /* After the swap, dout holds the input gradient of the first owned layer. */
    *ret_din = v->lo == 0 ? NULL : dout;
    for (int i = 0; i < v->hi - v->lo; i++) {
        kern_accumulate_f64(w->acc[i], w->grad[i], v->layers[i].n);
        memset(w->grad[i], 0, v->layers[i].n * sizeof(float));
    }
    if (w->grad_head) {
        size_t VC = (size_t)mc->vocab * mc->channels;
        kern_accumulate_f64(w->acc_head, w->grad_head, VC);
        memset(w->grad_head, 0, VC * sizeof(float));
    }
    return 0;
}

/* Every pipeline message goes through here: a migration's state after the boundary still
 * moving on the same communicator must end first, so the gate runs before the step's first
 * message; with pp 1 there is none, and the update's gate waits. A move on a channel of its
 * own (worker_engine_gate_messages) leaves the messages free: the layer gate and the update's
 * gate wait for what the step reads. */
static int p2p(struct worker_engine *e, struct mig_op *ops, size_t n) {
    if (e->gate_messages)
        TRY(worker__gate(e));
    return mig_batch(e->cur.comm, ops, n);
}

/* Point-to-point helpers; each is a no-op at the pipeline end it does not apply to. */
static int recv_forward(struct worker_engine *e, int m) {
    struct engine_view *v = &e->cur;
    if (v->stage == 0)
        return 0;
    struct mig_op op = {worker__rank(v, v->stage - 1, v->replica), false,
                        e->work->slots[m % e->work->nslots].in, act_bytes(e)};
    return p2p(e, &op, 1);
}

static int send_forward(struct worker_engine *e, int m) {
    struct engine_view *v = &e->cur;
    if (v->stage == v->layout.pp - 1)
        return 0;
    struct mig_op op = {worker__rank(v, v->stage + 1, v->replica), true,
                        e->work->slots[m % e->work->nslots].out[v->hi - v->lo - 1],
                        act_bytes(e)};
    return p2p(e, &op, 1);
}

/* Sends micro-batch m's output forward and receives a gradient into dbuf[0] together. */
static int send_forward_recv_backward(struct worker_engine *e, int m) {
    struct engine_view *v = &e->cur;
    if (v->stage == v->layout.pp - 1)
        return 0; /* the head already left dout in dbuf[0] */
    int next = worker__rank(v, v->stage + 1, v->replica);
    struct mig_op ops[2] = {
        {next, true, e->work->slots[m % e->work->nslots].out[v->hi - v->lo - 1], act_bytes(e)},
        {next, false, e->work->dbuf[0], act_bytes(e)},
    };
    return p2p(e, ops, 2);
}

/* Sends din backward and receives micro-batch m's input together. */
static int send_backward_recv_forward(struct worker_engine *e, float *din, int m) {
    struct engine_view *v = &e->cur;
    if (v->stage == 0)
        return 0;
    int prev = worker__rank(v, v->stage - 1, v->replica);
    struct mig_op ops[2] = {
        {prev, true, din, act_bytes(e)},
        {prev, false, e->work->slots[m % e->work->nslots].in, act_bytes(e)},
    };
    return p2p(e, ops, 2);
}

static int send_backward(struct worker_engine *e, float *din) {
    struct engine_view *v = &e->cur;
    if (v->stage == 0)
        return 0;
    struct mig_op op = {worker__rank(v, v->stage - 1, v->replica), true, din, act_bytes(e)};
    return p2p(e, &op, 1);
}

static int recv_backward(struct worker_engine *e) {
    struct engine_view *v = &e->cur;
    if (v->stage == v->layout.pp - 1)
        return 0;
    struct mig_op op = {worker__rank(v, v->stage + 1, v->replica), false, e->work->dbuf[0],
                        act_bytes(e)};
    return p2p(e, &op, 1);
}

/* The 1F1B schedule of one step over this replica's micro-batches. */
int worker__run_pipeline(struct worker_engine *e, uint64_t step) {
    struct engine_view *v = &e->cur;
    struct engine_work *w = e->work;
    int M = w->micro;
    int warmup = ST_MIN(v->layout.pp - v->stage - 1, M);
    int remaining = M - warmup;
    int fm = 0, bm = 0;
    float *din;
    for (int i = 0; i < warmup; i++, fm++) {
        TRY(recv_forward(e, fm));
        TRY(forward(e, step, fm));
        TRY(send_forward(e, fm));
    }
    if (remaining > 0)
        TRY(recv_forward(e, fm));
    for (int i = 0; i < remaining; i++) {
        TRY(forward(e, step, fm));
        TRY(send_forward_recv_backward(e, fm));
        fm++;
        TRY(backward(e, bm, &din));
        bm++;
        if (i == remaining - 1)
            TRY(send_backward(e, din));
        else
            TRY(send_backward_recv_forward(e, din, fm));
    }
    for (int i = 0; i < warmup; i++, bm++) {
        TRY(recv_backward(e));
        TRY(backward(e, bm, &din));
        TRY(send_backward(e, din));
    }
    return 0;
}
