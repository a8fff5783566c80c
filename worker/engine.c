/* engine.c: the worker engine's lifecycle — creation, the optimizer half of a step (tied
 * gradient sum, ZeRO-1 reduce-scatter, global-norm clip, AdamW on the shard, all-gather),
 * buffer access for migration, reshape, and checkpoint save/load.
 *
 * The one idea: the engine never sums floats in an order that depends on the shape; see
 * schedule.c for the forward/backward half and docs/engine.md for the whole argument. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "check.h" /* TRY, TRY_GOTO, TRY_KEEP */
#include "tokens.h" /* struct st_tokens */
#include "worker-internal.h"
#include "worker-reserve.h" /* worker_reserve_is_open */

#define SUBSYS "engine"

int worker_train_config_from_spec(const struct st_spec *spec, struct worker_train_config *ret) {
    struct worker_train_config c;
    memset(&c, 0, sizeof(c));
    c.model.layers = spec->model.layers;
    c.model.channels = spec->model.hidden;
    c.model.heads = spec->model.heads;
    c.model.vocab = spec->model.vocab;
    c.model.seq_len = spec->model.seq_len;
    c.global_batch = spec->training.global_batch;
    c.micro_batch = spec->training.micro_batch;
    c.total_steps = spec->training.steps;
    const struct st_spec_optimizer *o = &spec->training.optimizer;
    c.lr = o->lr;
    c.beta1 = o->beta1;
    c.beta2 = o->beta2;
    c.eps = o->eps;
    c.weight_decay = o->weight_decay;
    c.grad_clip = o->grad_clip;
    c.warmup_steps = o->warmup_steps;
    c.schedule = o->schedule == ST_LR_CONSTANT ? KERN_LR_CONSTANT
                 : o->schedule == ST_LR_LINEAR ? KERN_LR_LINEAR
                                               : KERN_LR_COSINE;
    c.min_lr_ratio = o->min_lr_ratio;
    c.seed = spec->training.seed;
    if (kern_config_check(&c.model) < 0 || c.global_batch <= 0 || c.micro_batch <= 0 ||
        c.global_batch % c.micro_batch != 0)
        return -EINVAL;
    *ret = c;
    return 0;
}

int worker_layout_check(const struct worker_layout *l, int nlayers) {
    if (!l || l->dp <= 0 || l->pp <= 0 || l->pp > WORKER_MAX_STAGES ||
        (long)l->dp * l->pp > WORKER_MAX_RANKS || l->pp > nlayers)
        return -EINVAL;
    if (l->stage_lo[0] != 0 || l->stage_lo[l->pp] != nlayers)
        return -EINVAL;
    for (int s = 0; s < l->pp; s++)
        if (l->stage_lo[s + 1] <= l->stage_lo[s])
            return -EINVAL;
    int n = l->dp * l->pp;
    for (int i = 0; i < n; i++) {
        if (l->ranks[i] < 0 || l->ranks[i] >= WORKER_MAX_RANKS)
            return -EINVAL;
        for (int j = 0; j < i; j++)
            if (l->ranks[j] == l->ranks[i])
                return -EINVAL;
    }
    if (l->peer_ring_set) { /* a single cycle through every position */
        int p = 0;
        for (int i = 0; i < n; i++) {
            if (l->peer_next[p] < 0 || l->peer_next[p] >= n || (i < n - 1 && l->peer_next[p] == 0))
                return -EINVAL;
            p = l->peer_next[p];
        }
        if (p != 0)
            return -EINVAL;
    }
    return 0;
}

int worker_layout_peer_next(const struct worker_layout *l, int pos) {
    int n = l->dp * l->pp;
    return l->peer_ring_set ? l->peer_next[pos] : (pos + 1) % n;
}

int worker_layout_peer_prev(const struct worker_layout *l, int pos) {
    int n = l->dp * l->pp;
    for (int p = 0; l->peer_ring_set && p < n; p++)
        if (l->peer_next[p] == pos)
            return p;
    return (pos + n - 1) % n;
}

int worker_layout_init(struct worker_layout *ret, int dp, int pp, const int *stage_lo,
                       int nlayers) {
    if (!ret || !stage_lo || dp <= 0 || pp <= 0 || pp > WORKER_MAX_STAGES ||
        (long)dp * pp > WORKER_MAX_RANKS)
        return -EINVAL;
    struct worker_layout l;
    memset(&l, 0, sizeof(l));
    l.dp = dp;
    l.pp = pp;
    for (int s = 0; s <= pp; s++)
        l.stage_lo[s] = stage_lo[s];
    for (int i = 0; i < dp * pp; i++)
        l.ranks[i] = i;
    TRY(worker_layout_check(&l, nlayers));
    *ret = l;
    return 0;
}

/* A detached engine (worker_engine_new_detached) of a layout with peers has no comm yet. */
static bool detached(const struct engine_view *v) {
    return !v->comm && v->layout.dp * v->layout.pp > 1;
}

static int engine_check(const struct worker_engine *e) {
    return e && e->magic == WORKER_ENGINE_MAGIC ? 0 : -EINVAL;
}

static int nowned(const struct engine_view *v) { return v->stage < 0 ? 0 : v->hi - v->lo; }

static void drop_work(struct worker_engine *e) {
    e->work = worker__work_free(e->work, nowned(&e->cur));
}

static void drop_spare(struct worker_engine *e) {
    e->spare = worker__work_free(e->spare, e->spare_n);
    e->spare_lo = e->spare_n = 0;
}

/* Freeing a large model's old buffers took 30-45 ms at the boundary (the munmaps of ~0.5 GB,
 * scripts/bench migration at the GPT-2 size); a thread of its own does it after the stall. */
struct engine_reap {
    pthread_t th;
    struct engine_view view;
    struct engine_work *work;
    int work_n;
};

static void *reap_main(void *arg) {
    struct engine_reap *k = arg;
    worker__view_done(&k->view);
    worker__work_free(k->work, k->work_n);
    return NULL;
}

static void reap_join(struct worker_engine *e) {
    if (!e->reap)
        return;
    pthread_join(e->reap->th, NULL);
    st_free(e->reap);
    e->reap = NULL;
}

/* Releases e->dead and the spare (both then empty): on a thread, or here when none starts.
 * Not while held (worker_engine_hold_old): a move after the boundary still reads them. */
static void reap_dead(struct worker_engine *e) {
    if (e->hold_dead)
        return;
    reap_join(e);
    struct engine_reap *k = st_calloc(1, sizeof(*k));
    if (k) {
        k->view = e->dead;
        k->work = e->spare;
        k->work_n = e->spare_n;
        if (pthread_create(&k->th, NULL, reap_main, k) == 0) {
            e->reap = k;
            memset(&e->dead, 0, sizeof(e->dead));
            e->spare = NULL;
            e->spare_lo = e->spare_n = 0;
            return;
        }
        st_free(k);
    }
    worker__view_done(&e->dead);
    drop_spare(e);
}

/* Forgets the kept moments a reshape left to copy (copied, or their views gone). */
static void mcopy_drop(struct worker_engine *e) {
    st_free(e->mcopy);
    e->mcopy = NULL;
    e->nmcopy = 0;
}

static void drop_pwork(struct worker_engine *e) {
    e->pwork = worker__work_free(e->pwork, e->pwork_n);
    e->pwork_lo = e->pwork_n = 0;
}

/* The current view's work buffers: those the preparation made (e->pwork), the rest from the
 * spare's where they fit (what is left of the spare goes). */
static int work_make(struct worker_engine *e, bool touch) {
    struct work_donor d = {e->spare, e->spare_lo, e->spare_n};
    int r;
    if (e->pwork) {
        size_t had = e->pwork->made;
        r = worker__work_complete(e, &e->cur, touch, e->pwork, &d, 1);
        if (r == 0) {
            e->work_fresh = e->pwork->made - had;
            e->work = e->pwork;
            e->pwork = NULL;
            e->pwork_lo = e->pwork_n = 0;
        }
    } else {
        r = worker__work_new(e, &e->cur, touch, &d, 1, &e->work);
        if (r == 0)
            e->work_fresh = e->work->made;
    }
    reap_dead(e);
    drop_pwork(e);
    return r;
}

/* A reshape made ready ahead of its boundary (worker_engine_reshape_prepare): the new
 * position's view, sharing what it keeps with the current one, its own buffers allocated and
 * written page by page on a thread of their own while steps run on; then the large work
 * buffers of a step that the current position's cannot give it (worker__work_prep). At the
 * GPT-2 124M size on a 2-core VM, a 1x2 -> 2x1 move faults in about 1 GB of those; done at
 * the boundary they were most of the 2.4-2.6 s commit part (scripts/bench migration). */
struct engine_prep {
    pthread_t th;
    const struct worker_engine *e; /* read: cfg, and cur's buffer pointers (not contents) */
    struct worker_layout layout;
    int stage, replica;
    struct engine_view view;
    struct engine_work *work; /* NULL: none made (only an optimization) */
    int rc;
};

static void *prep_main(void *arg) {
    struct engine_prep *p = arg;
    const struct worker_engine *e = p->e;
    p->rc = worker__view_init(&p->view, &e->cfg, &p->layout, p->stage, p->replica, NULL,
                              &e->cur);
    if (p->rc == 0 && p->stage >= 0) {
        worker__view_touch(&p->view, &e->cur, &e->cfg.model);
        if (worker__work_prep(e, &p->view, &e->cur, &p->work) < 0)
            p->work = NULL;
    }
    return NULL;
}

/* Waits for the preparation and takes it: 0 with *ret_view (and the work buffers it made in
 * e->pwork) when it is of this position, else frees it and returns -ENOENT. e->prep is NULL
 * after. */
static int prep_take(struct worker_engine *e, const struct worker_layout *layout, int stage,
                     int replica, struct engine_view *ret_view) {
    struct engine_prep *p = e->prep;
    if (!p)
        return -ENOENT;
    e->prep = NULL;
    pthread_join(p->th, NULL);
    bool same = p->rc == 0 && layout && p->stage == stage && p->replica == replica &&
                p->layout.dp == layout->dp && p->layout.pp == layout->pp;
    for (int s = 0; same && s <= layout->pp; s++)
        same = p->layout.stage_lo[s] == layout->stage_lo[s];
    if (same) {
        *ret_view = p->view;
        drop_pwork(e);
        e->pwork = p->work;
        e->pwork_lo = p->view.lo;
        e->pwork_n = nowned(&p->view);
    } else {
        worker__work_free(p->work, nowned(&p->view));
        worker__view_unshare(&p->view, &e->cur);
        worker__view_done(&p->view);
    }
    st_free(p);
    return same ? 0 : -ENOENT;
}

/* Validates a position against the config (its layout, stage and replica). */
static int check_layout_position(const struct worker_train_config *cfg,
                                 const struct worker_layout *layout, int stage, int replica) {
    int nl = kern_num_layers(&cfg->model);
    if (!layout || worker_layout_check(layout, nl) < 0)
        return -EINVAL;
    if (stage < -1 || stage >= layout->pp || (stage >= 0 && (replica < 0 ||
                                                             replica >= layout->dp)))
        return -EINVAL;
    if (cfg->global_batch % (layout->dp * cfg->micro_batch) != 0)
        return -EINVAL;
    return 0;
}

/* Validates a position against the config and its comm. */
static int check_position(const struct worker_train_config *cfg,
                          const struct worker_layout *layout, int stage, int replica,
                          struct mig_comm *comm) {
    TRY(check_layout_position(cfg, layout, stage, replica));
    if (!comm && layout->dp * layout->pp > 1)
        return -EINVAL;
    if (comm) {
        int n = layout->dp * layout->pp;
        for (int i = 0; i < n; i++)
            if (layout->ranks[i] >= mig_comm_size(comm))
                return -EINVAL;
        if (stage >= 0 && layout->ranks[stage * layout->dp + replica] != mig_comm_rank(comm))
            return -EINVAL;
    }
    return 0;
}

/* worker_engine_new, and with detached, worker_engine_new_detached (no comm: checked later). */
static int engine_make(const struct worker_train_config *cfg, const struct worker_layout *layout,
                       int stage, int replica, struct mig_comm *comm, bool detached,
                       const struct st_tokens *data, struct worker_engine **ret) {
    int r = 0;
    if (!cfg || !layout || !data || !ret || kern_config_check(&cfg->model) < 0 ||
        cfg->micro_batch <= 0 || cfg->global_batch <= 0 || cfg->total_steps < 0 || stage < 0)
        return -EINVAL;
    if (data->max_token >= (uint32_t)cfg->model.vocab || data->ntokens <= (uint64_t)cfg->model.seq_len)
        return -EINVAL;
    if (detached)
        TRY(check_layout_position(cfg, layout, stage, replica));
    else
        TRY(check_position(cfg, layout, stage, replica, comm));
    struct worker_engine *e = st_calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    e->magic = WORKER_ENGINE_MAGIC;
    e->cfg = *cfg;
    e->data = data;
    TRY_GOTO(worker__view_init(&e->cur, cfg, layout, stage, replica, comm, NULL), r, out);
    if (detached) {
        /* Its state arrives in transfers or from a peer copy: no initialisation (at GPT-2
         * size seconds of random numbers thrown away), only every page written now, so that
         * the transfers do not fault them in. */
        worker__view_touch(&e->cur, NULL, &cfg->model);
        *ret = e;
        return 0;
    }
    for (int l = e->cur.lo; l < e->cur.hi; l++)
        TRY_GOTO(kern_layer_init(&cfg->model, l, cfg->seed, e->cur.layers[l - e->cur.lo].param),
                 r, out);
    if (e->cur.tied0)
        TRY_GOTO(kern_layer_init(&cfg->model, 0, cfg->seed, e->cur.tied0), r, out);
    *ret = e;
    e = NULL;
out:
    worker_engine_free(e);
    return r;
}

int worker_engine_new(const struct worker_train_config *cfg, const struct worker_layout *layout,
                      int stage, int replica, struct mig_comm *comm,
                      const struct st_tokens *data, struct worker_engine **ret) {
    return engine_make(cfg, layout, stage, replica, comm, false, data, ret);
}

int worker_engine_new_detached(const struct worker_train_config *cfg,
                               const struct worker_layout *layout, int stage, int replica,
                               const struct st_tokens *data, struct worker_engine **ret) {
    return engine_make(cfg, layout, stage, replica, NULL, true, data, ret);
}

int worker_engine_attach(struct worker_engine *e, struct mig_comm *comm) {
    TRY(engine_check(e));
    if (!comm || e->cur.comm || e->old.valid)
        return -EINVAL;
    TRY(check_position(&e->cfg, &e->cur.layout, e->cur.stage, e->cur.replica, comm));
    e->cur.comm = comm;
    return 0;
}

struct worker_engine *worker_engine_free(struct worker_engine *e) {
    if (!e)
        return NULL;
    (void)prep_take(e, NULL, 0, 0, NULL);
    reap_join(e);
    drop_work(e);
    drop_spare(e);
    drop_pwork(e);
    mcopy_drop(e);
    worker__view_done(&e->dead);
    worker__view_unshare(&e->old, &e->cur);
    worker__view_done(&e->cur);
    worker__view_done(&e->old);
    e->magic = 0;
    st_free(e);
    return NULL;
}

int worker_engine_opt_step(const struct worker_engine *e) { return e ? e->t : 0; }

int worker_engine_set_opt_step(struct worker_engine *e, int t) {
    TRY(engine_check(e));
    if (t < 0)
        return -EINVAL;
    e->t = t;
    return 0;
}

int worker_engine_stage(const struct worker_engine *e) { return e->cur.stage; }
int worker_engine_replica(const struct worker_engine *e) { return e->cur.replica; }
const struct worker_layout *worker_engine_layout(const struct worker_engine *e) {
    return &e->cur.layout;
}

/* The comm ranks of stage s's replicas, in replica order. */
static void stage_group(const struct engine_view *v, int s, int *group) {
    for (int r = 0; r < v->layout.dp; r++)
        group[r] = worker__rank(v, s, r);
}

static void shard_counts(size_t n, int dp, size_t *counts) {
    for (int r = 0; r < dp; r++) {
        size_t lo, hi;
        worker_shard(n, dp, r, &lo, &hi);
        counts[r] = hi - lo;
    }
}

/* Exact sum of squares (shape-independent grad norm). Each square s = m·2^(p−1126), m an
 * integer below 2^53, 52 ≤ p ≤ 2097, is added as three 32-bit chunks into 32-bit limbs
 * held in uint64 (carries deferred, normalized after each call). Limbs NORM_LIMBS and
 * NORM_LIMBS+1 count NaN and infinite squares. */
#define NORM_LIMBS (WORKER_NORM_SLOTS - 2)
#define LIMB_MASK 0xffffffffULL

static void limbs_normalize(uint64_t *limb) {
    uint64_t carry = 0;
    for (int k = 0; k < NORM_LIMBS; k++) {
        uint64_t x = limb[k] + carry;
        limb[k] = x & LIMB_MASK;
        carry = x >> 32;
    }
}

/* Adds the squares of x[0..n), n < 2^30 (no limb can carry out of 64 bits), unnormalized. */
static void sumsq_chunk(uint64_t *limb, const double *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double s = x[i] * x[i];
        if (s == 0.0)
            continue;
        if (!isfinite(s)) {
            limb[isnan(s) ? NORM_LIMBS : NORM_LIMBS + 1]++;
            continue;
        }
        /* s = m·2^(p−1126) read off its bits: a normal s with biased exponent E and
         * fraction F is (2^52 + F)·2^(E−1075), so m = 2^52 + F, p = E + 51; a subnormal one
         * is F·2^−1074, so m = F, p = 52. (frexp and ldexp gave the same value as a
         * normalized m, and so the same sum, at a library call each per element.) */
        uint64_t bits;
        memcpy(&bits, &s, sizeof(bits));
        uint64_t m = bits & ((UINT64_C(1) << 52) - 1);
        int p = (int)(bits >> 52); /* s > 0: no sign bit */
        if (p) {
            m |= UINT64_C(1) << 52;
            p += 51;
        } else {
            p = 52;
        }
        int k = p / 32, sh = p % 32;
        uint64_t rest = m >> (32 - sh);
        limb[k] += (m << sh) & LIMB_MASK;
        limb[k + 1] += rest & LIMB_MASK;
        limb[k + 2] += rest >> 32;
    }
}

#define SUMSQ_CHUNK ((size_t)1 << 16)

/* See worker-internal.h. Each OpenMP thread sums whole chunks into limbs of its own, and the
 * threads' limbs are added: integer sums, so the result is the same bits whatever the number
 * of threads or the order they finish in. */
void worker__sumsq_exact_add(uint64_t *limb, const double *x, size_t n) {
    size_t nch = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
#pragma omp parallel if (nch > 1)
    {
        uint64_t mine[WORKER_NORM_SLOTS];
        memset(mine, 0, sizeof(mine));
#pragma omp for schedule(static)
        for (size_t c = 0; c < nch; c++) {
            size_t lo = c * SUMSQ_CHUNK;
            sumsq_chunk(mine, x + lo, ST_MIN(n - lo, SUMSQ_CHUNK));
            limbs_normalize(mine);
        }
#pragma omp critical(worker_sumsq)
        for (int k = 0; k < WORKER_NORM_SLOTS; k++)
            limb[k] += mine[k];
    }
    limbs_normalize(limb);
}

/* See worker-internal.h. */
double worker__sumsq_exact_value(uint64_t *limb) {
    if (limb[NORM_LIMBS])
        return NAN;
    if (limb[NORM_LIMBS + 1])
        return INFINITY;
    limbs_normalize(limb);
    int t = NORM_LIMBS - 1;
    while (t >= 0 && !limb[t])
        t--;
    if (t < 0)
        return 0.0;
    uint64_t l1 = t >= 1 ? limb[t - 1] : 0, l2 = t >= 2 ? limb[t - 2] : 0;
    double d = ldexp((double)limb[t], 64) + (double)((l1 << 32) | l2);
    return ldexp(d, 32 * (t - 2) - 1126);
}

/* After the pipeline: tied gradient, reduce-scatter, norm, AdamW, all-gather, tied copy. */
static int optimizer_step(struct worker_engine *e, uint64_t step) {
    struct engine_view *v = &e->cur;
    struct engine_work *w = e->work;
    const struct kern_config *mc = &e->cfg.model;
    int dp = v->layout.dp, pp = v->layout.pp;
    int first = v->stage == 0, last = v->stage == pp - 1;
    size_t VC = (size_t)mc->vocab * mc->channels;
    int group[WORKER_MAX_RANKS];
    size_t counts[WORKER_MAX_RANKS];
    int r = 0;

    /* Moments still arriving (a migration's second batch) are in place from here on. */
    TRY(worker__gate(e));

    /* Tied wte: embed-side + head-side, in that order, whatever pp is. */
    if (first && last) {
        for (size_t i = 0; i < VC; i++)
            w->acc[0][i] += w->acc_head[i];
    } else if (last) {
        TRY(mig_send(v->comm, worker__rank(v, 0, v->replica), w->acc_head, VC * sizeof(double)));
    } else if (first) {
        TRY(mig_recv(v->comm, worker__rank(v, pp - 1, v->replica), w->recv_head,
                     VC * sizeof(double)));
        for (size_t i = 0; i < VC; i++)
            w->acc[0][i] += w->recv_head[i];
    }

    /* Sum over replicas into each one's shard, in replica order. */
    stage_group(v, v->stage, group);
    for (int i = 0; i < v->hi - v->lo; i++) {
        struct engine_layer *L = &v->layers[i];
        if (dp > 1) {
            shard_counts(L->n, dp, counts);
            TRY(mig_reduce_scatter(v->comm, group, dp, w->acc[i], w->acc[i] + L->lo, counts,
                                   MIG_F64));
        }
    }

    /* Global norm: every worker adds the squares of its shards into an exact fixed-point
     * accumulator; the accumulators are all-reduced (integer limbs, exact in double in any
     * order), so the sum does not depend on dp, pp or the shard boundaries. */
    uint64_t limb[WORKER_NORM_SLOTS];
    memset(limb, 0, sizeof(limb));
    for (int i = 0; i < v->hi - v->lo; i++) {
        struct engine_layer *L = &v->layers[i];
        worker__sumsq_exact_add(limb, w->acc[i] + L->lo, L->hi - L->lo);
    }
    for (int k = 0; k < WORKER_NORM_SLOTS; k++)
        w->norm_parts[k] = (double)limb[k];
    if (dp * pp > 1) {
        for (int k = 0; k < dp * pp; k++)
            group[k] = v->layout.ranks[k];
        TRY(mig_allreduce(v->comm, group, dp * pp, w->norm_parts, WORKER_NORM_SLOTS, MIG_F64));
    }
    for (int k = 0; k < WORKER_NORM_SLOTS; k++)
        limb[k] = (uint64_t)w->norm_parts[k];
    double sumsq = worker__sumsq_exact_value(limb);
    double scale = kern_clip_scale(sqrt(sumsq), e->cfg.grad_clip);

    /* AdamW on this replica's shard, tensor by tensor (weight decay on 2-D weights only). */
    int t = e->t + 1;
    float lr = (float)kern_lr(e->cfg.schedule, e->cfg.lr, e->cfg.warmup_steps,
                              e->cfg.total_steps, e->cfg.min_lr_ratio, (int)step);
    for (int i = 0; i < v->hi - v->lo; i++) {
        struct engine_layer *L = &v->layers[i];
        kern_round_scaled(w->gshard, w->acc[i] + L->lo, L->hi - L->lo, scale);
        int nt = kern_layer_tensor_count(mc, L->layer);
        for (int k = 0; k < nt; k++) {
            struct kern_tensor_info ti;
            kern_layer_tensor(mc, L->layer, k, &ti);
            size_t a = ST_MAX(ti.offset, L->lo), b = ST_MIN(ti.offset + ti.numel, L->hi);
            if (a >= b)
                continue;
            kern_adamw(L->param + a, w->gshard + (a - L->lo), L->m + (a - L->lo),
                       L->v + (a - L->lo), b - a, lr, (float)e->cfg.beta1, (float)e->cfg.beta2,
                       (float)e->cfg.eps, ti.decay ? (float)e->cfg.weight_decay : 0.0f, t);
        }
    }

    /* Every replica gets the whole updated parameters. */
    stage_group(v, v->stage, group);
    for (int i = 0; i < v->hi - v->lo && dp > 1; i++) {
        struct engine_layer *L = &v->layers[i];
        shard_counts(L->n, dp, counts);
        TRY(mig_allgather(v->comm, group, dp, L->param + L->lo, L->param, counts, MIG_F32));
    }

    /* The tied head copy follows layer 0. */
    size_t n0 = kern_layer_param_count(mc, 0);
    if (pp > 1 && first)
        TRY(mig_send(v->comm, worker__rank(v, pp - 1, v->replica), v->layers[0].param,
                     n0 * sizeof(float)));
    else if (pp > 1 && last)
        TRY(mig_recv(v->comm, worker__rank(v, 0, v->replica), v->tied0, n0 * sizeof(float)));
    e->t = t;
    return r;
}

int worker_engine_step(struct worker_engine *e, uint64_t step, double *ret_loss) {
    TRY(engine_check(e));
    struct engine_view *v = &e->cur;
    if (v->stage < 0 || e->old.valid || detached(v))
        return -EINVAL;
    if (!e->work)
        TRY(work_make(e, false));
    struct engine_work *w = e->work;
    for (int i = 0; i < v->hi - v->lo; i++)
        memset(w->acc[i], 0, v->layers[i].n * sizeof(double));
    if (w->acc_head)
        memset(w->acc_head, 0, (size_t)e->cfg.model.vocab * e->cfg.model.channels *
                                   sizeof(double));
    w->loss_sum = 0.0;
    int r = worker__run_pipeline(e, step);
    if (r < 0)
        return st_log_errno(r, "Step %" PRIu64 ": pipeline failed (stage %d, replica %d): %s",
                            step, v->stage, v->replica, st_strerror(r));
    r = optimizer_step(e, step);
    if (r < 0)
        return st_log_errno(r, "Step %" PRIu64 ": gradient reduction or update failed: %s",
                            step, st_strerror(r));
    double loss = NAN;
    if (v->stage == v->layout.pp - 1) {
        double sum = w->loss_sum;
        if (v->layout.dp > 1) {
            int group[WORKER_MAX_RANKS];
            stage_group(v, v->stage, group);
            r = mig_allreduce(v->comm, group, v->layout.dp, &sum, 1, MIG_F64);
            if (r < 0)
                return st_log_errno(r, "Step %" PRIu64 ": loss reduction failed: %s", step,
                                    st_strerror(r));
        }
        loss = sum / ((double)e->cfg.global_batch * e->cfg.model.seq_len);
    }
    if (ret_loss)
        *ret_loss = loss;
    return 0;
}

int worker_engine_layer(struct worker_engine *e, enum worker_view view, int layer,
                        struct worker_layer_bufs *ret) {
    TRY(engine_check(e));
    if (!ret || (view != WORKER_VIEW_CURRENT && view != WORKER_VIEW_OLD))
        return -EINVAL;
    struct engine_view *v = view == WORKER_VIEW_OLD ? &e->old : &e->cur;
    if (!v->valid)
        return -ENOENT;
    struct worker_layer_bufs b;
    memset(&b, 0, sizeof(b));
    b.layer = layer;
    struct engine_layer *L = worker__view_layer(v, layer);
    if (L) {
        b.n = L->n;
        b.param = L->param;
        b.shard_lo = L->lo;
        b.shard_hi = L->hi;
        b.adam_m = L->m;
        b.adam_v = L->v;
    } else if (layer == 0 && v->tied0) {
        b.n = kern_layer_param_count(&e->cfg.model, 0);
        b.param = v->tied0;
    } else {
        return -ENOENT;
    }
    *ret = b;
    return 0;
}

int worker_engine_reshape_begin(struct worker_engine *e, const struct worker_layout *layout,
                                int stage, int replica, struct mig_comm *comm) {
    TRY(engine_check(e));
    if (e->old.valid || e->hold_dead)
        return -EBUSY;
    TRY(check_position(&e->cfg, layout, stage, replica, comm));
    /* What the new position keeps as it is (a layer's parameters, a moment shard of the same
     * range) stays in its buffer, shared by both views until the commit: a worker whose
     * position does not change copies nothing and touches no new memory. Only what changes
     * is allocated and filled from the old view here or by the transfers. */
    struct engine_view nv;
    drop_pwork(e); /* an earlier reshape's, never made into work buffers: another view's */
    if (prep_take(e, layout, stage, replica, &nv) == 0)
        nv.comm = comm;
    else
        TRY(worker__view_init(&nv, &e->cfg, layout, stage, replica, comm, &e->cur));
    size_t n0 = kern_layer_param_count(&e->cfg.model, 0);
    bool later = e->moments_later;
    e->moments_later = false;
    mcopy_drop(e);
    if (later && stage >= 0 && nv.hi > nv.lo) {
        e->mcopy = st_calloc((size_t)(nv.hi - nv.lo), sizeof(*e->mcopy));
        later = e->mcopy != NULL; /* else copied here, as without */
    }
    for (int l = nv.lo; l < nv.hi && stage >= 0; l++) {
        struct engine_layer *N = &nv.layers[l - nv.lo];
        struct engine_layer *O = worker__view_layer(&e->cur, l);
        if (O) {
            /* The overlap of the old and new moment shards, when the shard moved. */
            size_t a = ST_MAX(N->lo, O->lo), b = ST_MIN(N->hi, O->hi);
            if (a >= b || N->m == O->m)
                continue;
            struct engine_mcopy k = {N->m + (a - N->lo), N->v + (a - N->lo),
                                     O->m + (a - O->lo), O->v + (a - O->lo), b - a};
            if (later) {
                e->mcopy[e->nmcopy++] = k;
            } else {
                memcpy(k.m, k.om, k.n * sizeof(float));
                memcpy(k.v, k.ov, k.n * sizeof(float));
            }
        } else if (l == 0 && e->cur.tied0) {
            memcpy(N->param, e->cur.tied0, n0 * sizeof(float));
        }
    }
    reap_dead(e); /* a previous reshape's, when no step or ready came between */
    e->spare = e->work; /* its layers' buffers go to the new view's work (work_make) */
    e->spare_lo = e->cur.lo;
    e->spare_n = nowned(&e->cur);
    e->work = NULL;
    e->old = e->cur;
    e->cur = nv;
    return 0;
}

void worker_engine_reshape_moments_later(struct worker_engine *e) {
    if (engine_check(e) == 0)
        e->moments_later = true;
}

size_t worker_engine_copy_kept_moments(struct worker_engine *e) {
    size_t bytes = 0;
    if (engine_check(e) < 0)
        return 0;
    for (int i = 0; i < e->nmcopy; i++) {
        const struct engine_mcopy *c = &e->mcopy[i];
        memcpy(c->m, c->om, c->n * sizeof(float));
        memcpy(c->v, c->ov, c->n * sizeof(float));
        bytes += 2 * c->n * sizeof(float);
    }
    mcopy_drop(e);
    return bytes;
}

void worker_engine_set_gate(struct worker_engine *e, worker_engine_gate_fn *fn,
                            worker_engine_layer_gate_fn *layer_fn, void *userdata) {
    if (engine_check(e) < 0)
        return;
    e->gate = fn;
    e->layer_gate = fn ? layer_fn : NULL;
    e->gate_userdata = fn ? userdata : NULL;
    e->gate_messages = true;
}

void worker_engine_gate_messages(struct worker_engine *e, bool wait) {
    if (engine_check(e) < 0)
        return;
    e->gate_messages = wait;
}

int worker__gate(struct worker_engine *e) {
    worker_engine_gate_fn *fn = e->gate;
    if (!fn)
        return 0;
    e->gate = NULL;
    e->layer_gate = NULL;
    return fn(e->gate_userdata);
}

int worker__layer_gate(struct worker_engine *e, int layer) {
    return e->layer_gate ? e->layer_gate(e->gate_userdata, layer) : 0;
}

void worker_engine_hold_old(struct worker_engine *e, bool hold) {
    if (engine_check(e) < 0 || e->hold_dead == hold)
        return;
    e->hold_dead = hold;
    /* Released after the work buffers were made (else the next work_make releases them). */
    if (!hold && (e->work || e->cur.stage < 0))
        reap_dead(e);
}

size_t worker_engine_work_fresh(const struct worker_engine *e) {
    return engine_check(e) == 0 ? e->work_fresh : 0;
}

int worker_engine_position_bytes(const struct worker_train_config *cfg,
                                 const struct worker_layout *layout, int stage, int replica,
                                 uint64_t *ret) {
    if (!cfg || !ret || stage < 0 || kern_config_check(&cfg->model) < 0 || cfg->micro_batch <= 0)
        return -EINVAL;
    TRY(check_layout_position(cfg, layout, stage, replica));
    if (worker_reserve_is_open())
        return -EBUSY;
    struct worker_engine e; /* work buffers read e->cfg only */
    memset(&e, 0, sizeof(e));
    e.cfg = *cfg;
    struct engine_view v;
    struct engine_work *w = NULL;
    TRY(worker__view_init(&v, cfg, layout, stage, replica, NULL, NULL));
    uint64_t b = 0;
    for (int i = 0; i < v.hi - v.lo; i++)
        b += (v.layers[i].n + 2 * ST_MAX(v.layers[i].hi - v.layers[i].lo, 1)) * sizeof(float);
    if (v.tied0)
        b += kern_layer_param_count(&cfg->model, 0) * sizeof(float);
    int r = worker__work_new(&e, &v, false, NULL, 0, &w);
    if (r == 0)
        b += w->made;
    worker__work_free(w, v.hi - v.lo);
    worker__view_done(&v);
    if (r == 0)
        *ret = b;
    return r;
}

int worker_engine_ready(struct worker_engine *e) {
    TRY(engine_check(e));
    if (e->cur.stage < 0 || e->old.valid || e->work)
        return 0;
    return work_make(e, true);
}

int worker_engine_reshape_prepare(struct worker_engine *e, const struct worker_layout *layout,
                                  int stage, int replica) {
    TRY(engine_check(e));
    if (e->old.valid)
        return -EBUSY;
    TRY(check_layout_position(&e->cfg, layout, stage, replica));
    (void)prep_take(e, NULL, 0, 0, NULL); /* an older one: another position */
    struct engine_prep *p = st_calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->e = e;
    p->layout = *layout;
    p->stage = stage;
    p->replica = replica;
    int r = pthread_create(&p->th, NULL, prep_main, p);
    if (r != 0) {
        st_free(p);
        return -r;
    }
    e->prep = p;
    return 0;
}

int worker_engine_reshape_commit(struct worker_engine *e) {
    TRY(engine_check(e));
    if (!e->old.valid)
        return -EINVAL;
    worker__view_unshare(&e->old, &e->cur);
    worker__view_done(&e->dead);
    e->dead = e->old; /* released by the next work_make, after the stall */
    memset(&e->old, 0, sizeof(e->old));
    if (e->cur.stage < 0)
        reap_dead(e); /* a spare makes no work buffers */
    return 0;
}

int worker_engine_reshape_abort(struct worker_engine *e) {
    TRY(engine_check(e));
    if (!e->old.valid)
        return -EINVAL;
    drop_work(e);
    drop_pwork(e);
    mcopy_drop(e); /* their destination goes with the new view */
    worker__view_unshare(&e->cur, &e->old);
    worker__view_done(&e->cur);
    e->cur = e->old;
    memset(&e->old, 0, sizeof(e->old));
    e->work = e->spare; /* the old view's own, untouched since the begin */
    e->spare = NULL;
    e->spare_lo = e->spare_n = 0;
    return 0;
}

char *worker_model_json(const struct kern_config *cfg) {
    char buf[256];
    snprintf(buf, sizeof(buf),
             "{\"arch\":\"gpt2\",\"layers\":%d,\"channels\":%d,\"heads\":%d,\"vocab\":%d,"
             "\"seq_len\":%d}",
             cfg->layers, cfg->channels, cfg->heads, cfg->vocab, cfg->seq_len);
    return st_strdup(buf);
}

/* Gathers a layer's moment shards to every replica of the stage (full m, v). */
static int gather_moments(struct worker_engine *e, struct engine_layer *L, float *m, float *v) {
    struct engine_view *vw = &e->cur;
    int dp = vw->layout.dp;
    if (dp == 1) {
        memcpy(m, L->m, L->n * sizeof(float));
        memcpy(v, L->v, L->n * sizeof(float));
        return 0;
    }
    int group[WORKER_MAX_RANKS];
    size_t counts[WORKER_MAX_RANKS];
    stage_group(vw, vw->stage, group);
    shard_counts(L->n, dp, counts);
    TRY(mig_allgather(vw->comm, group, dp, L->m, m, counts, MIG_F32));
    TRY(mig_allgather(vw->comm, group, dp, L->v, v, counts, MIG_F32));
    return 0;
}

static int write_layer(struct worker_engine *e, struct mig_ckpt_writer *wr,
                       struct engine_layer *L, float *m, float *v) {
    const struct kern_config *mc = &e->cfg.model;
    struct mig_tensor t[3 * KERN_MAX_TENSORS];
    char names[KERN_MAX_TENSORS][KERN_TENSOR_NAME_MAX]; /* the writer reads them in the call */
    float *src[3] = {L->param, m, v};
    int nt = kern_layer_tensor_count(mc, L->layer);
    for (int i = 0; i < nt; i++) {
        struct kern_tensor_info ti;
        kern_layer_tensor(mc, L->layer, i, &ti);
        memcpy(names[i], ti.name, sizeof(names[i]));
        for (int kind = 0; kind < 3; kind++) {
            struct mig_tensor *x = &t[3 * i + kind];
            x->name = names[i];
            x->kind = (enum st_state_kind)kind;
            x->count = ti.numel;
            x->data = src[kind] + ti.offset;
        }
    }
    return mig_ckpt_write_layer(wr, L->layer, t, (size_t)(3 * nt));
}

int worker_engine_save(struct worker_engine *e, const char *dir, uint64_t step) {
    TRY(engine_check(e));
    struct engine_view *v = &e->cur;
    if (!dir || v->stage < 0 || e->old.valid || detached(v))
        return -EINVAL;
    int r = 0;
    struct mig_ckpt_writer *wr = NULL;
    float *m = NULL, *vv = NULL;
    char *model = NULL;
    size_t maxn = 1;
    for (int i = 0; i < v->hi - v->lo; i++)
        maxn = ST_MAX(maxn, v->layers[i].n);
    m = st_malloc(maxn * sizeof(float));
    vv = st_malloc(maxn * sizeof(float));
    if (!m || !vv)
        TRY_GOTO(-ENOMEM, r, out);
    if (v->replica == 0) {
        r = mig_ckpt_writer_new(dir, &wr);
        if (r < 0) {
            r = st_log_errno(r, "Cannot create checkpoint directory '%s': %s", dir,
                             st_strerror(r));
            goto out;
        }
    }
    for (int i = 0; i < v->hi - v->lo; i++) {
        TRY_GOTO(gather_moments(e, &v->layers[i], m, vv), r, out);
        if (v->replica == 0) {
            r = write_layer(e, wr, &v->layers[i], m, vv);
            if (r < 0) {
                r = st_log_errno(r, "Cannot write layer %d of checkpoint '%s': %s",
                             v->layers[i].layer, dir, st_strerror(r));
                goto out;
            }
        }
    }
    int n = v->layout.dp * v->layout.pp, group[WORKER_MAX_RANKS];
    for (int k = 0; k < n; k++)
        group[k] = v->layout.ranks[k];
    if (n > 1)
        TRY_GOTO(mig_barrier(v->comm, group, n), r, out);
    if (v->stage == 0 && v->replica == 0) {
        model = worker_model_json(&e->cfg.model);
        if (!model)
            TRY_GOTO(-ENOMEM, r, out);
        char extra[256];
        snprintf(extra, sizeof(extra), "{\"global_batch\":%d,\"micro_batch\":%d,\"dp\":%d,"
                 "\"pp\":%d}", e->cfg.global_batch, e->cfg.micro_batch, v->layout.dp,
                 v->layout.pp);
        struct mig_ckpt_meta meta = {
            .model_json = model,
            .step = step,
            .samples_committed = step * (uint64_t)e->cfg.global_batch,
            .data_position = step,
            .data_seed = e->cfg.seed,
            .opt_step = (uint64_t)e->t,
            .extra_json = extra,
        };
        r = mig_ckpt_commit(dir, &meta, kern_num_layers(&e->cfg.model));
        if (r < 0) {
            r = st_log_errno(r, "Cannot commit checkpoint '%s': %s", dir, st_strerror(r));
            TRY_KEEP(r, n > 1 ? mig_barrier(v->comm, group, n) : 0);
            goto out;
        }
    }
    if (n > 1)
        TRY_GOTO(mig_barrier(v->comm, group, n), r, out);
out:
    st_free(model);
    st_free(m);
    st_free(vv);
    mig_ckpt_writer_free(wr);
    return r;
}

/* True when the checkpoint's model JSON describes cfg. */
static int model_matches(const char *json, const struct kern_config *cfg) {
    json_error_t jerr;
    json_t *o = json_loads(json ? json : "", 0, &jerr);
    if (!o)
        return 0;
    int ok = json_integer_value(json_object_get(o, "layers")) == cfg->layers &&
             json_integer_value(json_object_get(o, "channels")) == cfg->channels &&
             json_integer_value(json_object_get(o, "heads")) == cfg->heads &&
             json_integer_value(json_object_get(o, "vocab")) == cfg->vocab &&
             json_integer_value(json_object_get(o, "seq_len")) == cfg->seq_len;
    json_decref(o);
    return ok;
}

/* Copies one layer from a checkpoint: whole PARAM into param; the [lo, hi) range of the
 * moments into m, v (when non-NULL). */
static int load_layer(struct worker_engine *e, struct mig_ckpt *ck, const char *dir, int layer,
                      float *param, size_t lo, size_t hi, float *m, float *v) {
    const struct kern_config *mc = &e->cfg.model;
    struct mig_ckpt_layer *cl = NULL;
    struct st_error err;
    memset(&err, 0, sizeof(err));
    int r = mig_ckpt_read_layer(ck, layer, &cl, &err);
    if (r < 0)
        return st_log_errno(r, "Cannot read layer %d of checkpoint '%s': %s: %s", layer, dir,
                            err.file, err.message);
    int nt = kern_layer_tensor_count(mc, layer);
    for (int i = 0; i < nt && r >= 0; i++) {
        struct kern_tensor_info ti;
        kern_layer_tensor(mc, layer, i, &ti);
        for (int kind = 0; kind < 3; kind++) {
            if (kind > 0 && !m)
                break;
            const struct mig_tensor *t = mig_ckpt_layer_find(cl, ti.name, (enum st_state_kind)kind);
            if (!t || t->count != ti.numel) {
                r = st_log_errno(-EINVAL, "Checkpoint '%s' layer %d: tensor '%s' (%s) %s", dir,
                                 layer, ti.name, st_state_kind_name((enum st_state_kind)kind),
                                 t ? "has the wrong size" : "is missing");
                break;
            }
            if (kind == 0) {
                memcpy(param + ti.offset, t->data, ti.numel * sizeof(float));
                continue;
            }
            size_t a = ST_MAX(ti.offset, lo), b = ST_MIN(ti.offset + ti.numel, hi);
            if (a < b)
                memcpy((kind == 1 ? m : v) + (a - lo), t->data + (a - ti.offset),
                       (b - a) * sizeof(float));
        }
    }
    mig_ckpt_layer_free(cl);
    return r;
}

int worker_engine_load(struct worker_engine *e, const char *dir, uint64_t *ret_step) {
    TRY(engine_check(e));
    struct engine_view *v = &e->cur;
    if (!dir || e->old.valid)
        return -EINVAL;
    struct mig_ckpt *ck = NULL;
    struct st_error err;
    memset(&err, 0, sizeof(err));
    int r = mig_ckpt_open(dir, &ck, &err);
    if (r < 0)
        return st_log_errno(r, "Cannot open checkpoint '%s': %s: %s", dir, err.file,
                            err.message);
    struct mig_ckpt_meta meta;
    mig_ckpt_get_meta(ck, &meta);
    if (mig_ckpt_nlayers(ck) != kern_num_layers(&e->cfg.model) ||
        !model_matches(meta.model_json, &e->cfg.model)) {
        r = st_log_errno(-EINVAL, "Checkpoint '%s' is of another model (%s)", dir,
                         meta.model_json ? meta.model_json : "?");
        goto out;
    }
    if (meta.opt_step > (uint64_t)INT32_MAX) {
        r = st_log_errno(-EINVAL, "Checkpoint '%s': optimizer step out of range", dir);
        goto out;
    }
    for (int i = 0; i < nowned(v); i++) {
        struct engine_layer *L = &v->layers[i];
        TRY_GOTO(load_layer(e, ck, dir, L->layer, L->param, L->lo, L->hi, L->m, L->v), r, out);
    }
    if (v->tied0)
        TRY_GOTO(load_layer(e, ck, dir, 0, v->tied0, 0, 0, NULL, NULL), r, out);
    e->t = (int)meta.opt_step;
    if (ret_step)
        *ret_step = meta.step;
out:
    mig_ckpt_free(ck);
    return r;
}
