/* stage.c: the memory of a pipeline stage — owned layers with their moment shards, and the
 * work buffers of a step (in-flight micro-batch activations, gradient accumulators).
 *
 * A stage's state is sized by its layer range and its replica's shards only, so the same code
 * builds the state of any position of any layout (migration allocates the new position's
 * view next to the old one). */
#include <stdlib.h>
#include <string.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "worker-internal.h"
#include "worker-reserve.h" /* the engine's large buffers */

void worker_shard(size_t n, int dp, int r, size_t *ret_lo, size_t *ret_hi) {
    uint64_t lo, hi;
    st_shard(n, dp, r, &lo, &hi); /* the planner's transfers use the same rule */
    *ret_lo = (size_t)lo;
    *ret_hi = (size_t)hi;
}

int worker__rank(const struct engine_view *v, int stage, int replica) {
    return v->layout.ranks[stage * v->layout.dp + replica];
}

static const struct engine_layer *view_layer_c(const struct engine_view *v, int layer) {
    if (!v || !v->valid || v->stage < 0 || layer < v->lo || layer >= v->hi)
        return NULL;
    return &v->layers[layer - v->lo];
}

struct engine_layer *worker__view_layer(struct engine_view *v, int layer) {
    return (struct engine_layer *)view_layer_c(v, layer);
}

void worker__view_done(struct engine_view *v) {
    if (v->layers) {
        for (int i = 0; i < v->hi - v->lo; i++) {
            worker__big_free(v->layers[i].param);
            worker__big_free(v->layers[i].m);
            worker__big_free(v->layers[i].v);
        }
        worker__big_free(v->layers);
    }
    worker__big_free(v->tied0);
    memset(v, 0, sizeof(*v));
}

/* A buffer of n floats: share's when it has one (n > 0), else a fresh zeroed one. */
static float *take(float *share, size_t n) {
    return share && n > 0 ? share : worker__big_alloc(ST_MAX(n, 1) * sizeof(float), true);
}

/* Allocates (zeroed) the buffers of position (stage, replica), or borrows share's; stage -1
 * holds nothing. */
int worker__view_init(struct engine_view *v, const struct worker_train_config *cfg,
                      const struct worker_layout *layout, int stage, int replica,
                      struct mig_comm *comm, const struct engine_view *share) {
    int r = 0;
    memset(v, 0, sizeof(*v));
    v->layout = *layout;
    v->stage = stage;
    v->replica = replica;
    v->comm = comm;
    v->valid = 1;
    if (stage < 0)
        return 0;
    v->lo = layout->stage_lo[stage];
    v->hi = layout->stage_lo[stage + 1];
    v->layers = st_calloc((size_t)(v->hi - v->lo), sizeof(*v->layers));
    if (!v->layers)
        TRY_GOTO(-ENOMEM, r, out);
    for (int l = v->lo; l < v->hi; l++) {
        struct engine_layer *L = &v->layers[l - v->lo];
        const struct engine_layer *O = view_layer_c(share, l);
        L->layer = l;
        L->n = kern_layer_param_count(&cfg->model, l);
        worker_shard(L->n, layout->dp, replica, &L->lo, &L->hi);
        bool same = O && O->lo == L->lo && O->hi == L->hi;
        L->param = take(O ? O->param : NULL, L->n);
        L->m = take(same ? O->m : NULL, L->hi - L->lo);
        L->v = take(same ? O->v : NULL, L->hi - L->lo);
        if (!L->param || !L->m || !L->v)
            TRY_GOTO(-ENOMEM, r, out);
    }
    if (stage == layout->pp - 1 && v->lo > 0) {
        const struct engine_layer *O = view_layer_c(share, 0);
        size_t n0 = kern_layer_param_count(&cfg->model, 0);
        v->tied0 = take(O ? O->param : share && share->stage >= 0 ? share->tied0 : NULL, n0);
        if (!v->tied0)
            TRY_GOTO(-ENOMEM, r, out);
    }
out:
    if (r < 0) {
        worker__view_unshare(v, share);
        worker__view_done(v);
    }
    return r;
}

/* Writes one byte of every page of a buffer of fresh memory (zero: a calloc'd buffer stays
 * zero, a malloc'd one is written before it is read). */
static void touch(void *p, size_t bytes) {
    volatile unsigned char *c = p;
    for (size_t i = 0; c && i < bytes; i += 4096)
        c[i] = 0;
    if (c && bytes)
        c[bytes - 1] = 0;
}

static bool holds(const struct engine_view *v, const float *p) {
    if (!p || !v || !v->valid)
        return false;
    if (p == v->tied0)
        return true;
    for (int i = 0; v->layers && i < v->hi - v->lo; i++)
        if (p == v->layers[i].param || p == v->layers[i].m || p == v->layers[i].v)
            return true;
    return false;
}

void worker__view_touch(const struct engine_view *v, const struct engine_view *share,
                        const struct kern_config *model) {
    for (int i = 0; v->valid && v->stage >= 0 && i < v->hi - v->lo; i++) {
        const struct engine_layer *L = &v->layers[i];
        size_t ns = ST_MAX(L->hi - L->lo, 1);
        if (!holds(share, L->param))
            touch(L->param, L->n * sizeof(float));
        if (!holds(share, L->m))
            touch(L->m, ns * sizeof(float));
        if (!holds(share, L->v))
            touch(L->v, ns * sizeof(float));
    }
    if (v->valid && v->tied0 && !holds(share, v->tied0))
        touch(v->tied0, kern_layer_param_count(model, 0) * sizeof(float));
}

void worker__view_unshare(struct engine_view *v, const struct engine_view *keep) {
    if (!keep || !keep->valid)
        return;
    for (int i = 0; v->layers && i < v->hi - v->lo; i++) {
        struct engine_layer *L = &v->layers[i];
        if (holds(keep, L->param))
            L->param = NULL;
        if (holds(keep, L->m))
            L->m = NULL;
        if (holds(keep, L->v))
            L->v = NULL;
    }
    if (holds(keep, v->tied0))
        v->tied0 = NULL;
}

struct engine_work *worker__work_free(struct engine_work *w, int nowned) {
    if (!w)
        return NULL;
    if (w->slots) {
        for (int s = 0; s < w->nslots; s++) {
            struct engine_slot *sl = &w->slots[s];
            worker__big_free(sl->tokens);
            worker__big_free(sl->targets);
            worker__big_free(sl->in);
            for (int i = 0; i < nowned; i++) {
                if (sl->acts)
                    worker__big_free(sl->acts[i]);
                if (sl->out)
                    worker__big_free(sl->out[i]);
            }
            worker__big_free(sl->acts);
            worker__big_free(sl->out);
        }
        worker__big_free(w->slots);
    }
    for (int i = 0; i < nowned; i++) {
        if (w->grad)
            worker__big_free(w->grad[i]);
        if (w->acc)
            worker__big_free(w->acc[i]);
    }
    worker__big_free(w->grad);
    worker__big_free(w->acc);
    worker__big_free(w->grad_head);
    worker__big_free(w->acc_head);
    worker__big_free(w->recv_head);
    worker__big_free(w->dbuf[0]);
    worker__big_free(w->dbuf[1]);
    worker__big_free(w->scratch);
    worker__big_free(w->logits);
    worker__big_free(w->losses);
    worker__big_free(w->gshard);
    worker__big_free(w->norm_parts);
    worker__big_free(w->sample);
    worker__big_free(w);
    return NULL;
}

/* Allocations of work buffers, every page written when t. */
static void *wmalloc(size_t bytes, bool t) {
    void *p = worker__big_alloc(bytes, false);
    if (t)
        touch(p, bytes);
    return p;
}

static void *wcalloc(size_t n, size_t size, bool t) {
    void *p = n && size > SIZE_MAX / n ? NULL : worker__big_alloc(n * size, true);
    if (t)
        touch(p, n * size);
    return p;
}

/* See worker-internal.h. Only e->cfg is read from e. */
/* Moves *from to *to when from holds one, so that it is not freed twice. */
static bool give(void **to, void **from) {
    if (!*from)
        return false;
    *to = *from;
    *from = NULL;
    return true;
}

/* Layer `layer`'s gradient buffers from the first donor that holds both. */
static bool give_layer(const struct work_donor *d, int nd, int layer, float **grad,
                       double **acc) {
    for (int i = 0; i < nd; i++) {
        struct engine_work *w = d[i].w;
        int k = layer - d[i].lo;
        if (w && k >= 0 && k < d[i].n && w->grad && w->acc && w->grad[k] && w->acc[k]) {
            give((void **)grad, (void **)&w->grad[k]);
            give((void **)acc, (void **)&w->acc[k]);
            return true;
        }
    }
    return false;
}

static bool give_head(const struct work_donor *d, int nd, float **grad, double **acc) {
    for (int i = 0; i < nd; i++) {
        struct engine_work *w = d[i].w;
        if (w && w->grad_head && w->acc_head) {
            give((void **)grad, (void **)&w->grad_head);
            give((void **)acc, (void **)&w->acc_head);
            return true;
        }
    }
    return false;
}

static bool give_recv_head(const struct work_donor *d, int nd, double **recv) {
    for (int i = 0; i < nd; i++)
        if (d[i].w && give((void **)recv, (void **)&d[i].w->recv_head))
            return true;
    return false;
}

/* The largest shard's rounded-gradient buffer, from the first donor whose buffer is at least
 * that large (its contents are written before they are read). */
static bool give_gshard(const struct work_donor *d, int nd, size_t maxshard, float **gshard) {
    for (int i = 0; i < nd; i++)
        if (d[i].w && d[i].w->gshard && d[i].w->gshard_n >= maxshard)
            return give((void **)gshard, (void **)&d[i].w->gshard);
    return false;
}

static size_t max_shard(const struct engine_view *v) {
    size_t m = 1;
    for (int i = 0; v->stage >= 0 && i < v->hi - v->lo; i++)
        m = ST_MAX(m, v->layers[i].hi - v->layers[i].lo);
    return m;
}

/* A buffer of w's that is missing: wmalloc'd (zeroed when zero) into *p unless it is there,
 * counted in w->made. */
#define WANT(p, bytes, zero)                                                               \
    do {                                                                                   \
        if (!(p)) {                                                                        \
            if (!((p) = (zero) ? wcalloc(1, (bytes), t) : wmalloc((bytes), t)))            \
                TRY_GOTO(-ENOMEM, r, out);                                                 \
            w->made += (bytes);                                                            \
        }                                                                                  \
    } while (0)

/* Makes whatever w lacks of view v's work buffers: the large ones from the donors where they
 * hold them, the rest allocated (every page written when t). With skip, the large buffers
 * that skip's work will give at the boundary (the layers it owns, its head, its received
 * head, a shard buffer as large) are left missing: a preparation's partial work. */
static int work_fill(const struct worker_engine *e, const struct engine_view *v, bool t,
                     struct engine_work *w, const struct work_donor *d, int nd,
                     const struct engine_view *skip) {
    const struct kern_config *mc = &e->cfg.model;
    int B = e->cfg.micro_batch, T = mc->seq_len, C = mc->channels, V = mc->vocab;
    int nowned = v->hi - v->lo;
    int pp = v->layout.pp, dp = v->layout.dp;
    int first = v->stage == 0, last = v->stage == pp - 1;
    size_t BT = (size_t)B * T, BTC = BT * C, VC = (size_t)V * C;
    bool sk = skip && skip->valid && skip->stage >= 0;
    bool skip_last = sk && skip->stage == skip->layout.pp - 1;
    bool skip_recv = sk && skip->stage == 0 && !skip_last;
    int r = 0;
    if (!w->slots) {
        w->micro = e->cfg.global_batch / (dp * B);
        w->nslots = ST_MIN(pp - v->stage, w->micro);
        WANT(w->slots, (size_t)w->nslots * sizeof(*w->slots), true);
    }
    WANT(w->grad, (size_t)ST_MAX(nowned, 1) * sizeof(float *), true);
    WANT(w->acc, (size_t)ST_MAX(nowned, 1) * sizeof(double *), true);
    for (int s = 0; s < w->nslots; s++) {
        struct engine_slot *sl = &w->slots[s];
        WANT(sl->tokens, BT * sizeof(int), false);
        WANT(sl->targets, BT * sizeof(int), false);
        WANT(sl->acts, (size_t)ST_MAX(nowned, 1) * sizeof(float *), true);
        WANT(sl->out, (size_t)ST_MAX(nowned, 1) * sizeof(float *), true);
        if (!first)
            WANT(sl->in, BTC * sizeof(float), false);
        for (int i = 0; i < nowned; i++) {
            size_t na = kern_layer_act_count(mc, v->lo + i, B);
            WANT(sl->acts[i], ST_MAX(na, 1) * sizeof(float), false);
            WANT(sl->out[i], BTC * sizeof(float), false);
        }
    }
    for (int i = 0; i < nowned; i++) {
        const struct engine_layer *L = &v->layers[i];
        if (w->grad[i] && w->acc[i])
            continue;
        if (sk && L->layer >= skip->lo && L->layer < skip->hi)
            continue;
        if (!give_layer(d, nd, L->layer, &w->grad[i], &w->acc[i])) {
            WANT(w->grad[i], L->n * sizeof(float), true);
            WANT(w->acc[i], L->n * sizeof(double), true);
        }
    }
    if (last) {
        if (!w->grad_head && !skip_last && !give_head(d, nd, &w->grad_head, &w->acc_head)) {
            WANT(w->grad_head, VC * sizeof(float), true);
            WANT(w->acc_head, VC * sizeof(double), true);
        }
        WANT(w->logits, BT * V * sizeof(float), false);
        WANT(w->losses, BT * sizeof(float), false);
    }
    if (first && !last && !w->recv_head && !skip_recv && !give_recv_head(d, nd, &w->recv_head))
        WANT(w->recv_head, VC * sizeof(double), false);
    WANT(w->dbuf[0], BTC * sizeof(float), false);
    WANT(w->dbuf[1], BTC * sizeof(float), false);
    WANT(w->scratch, kern_scratch_count(mc, B) * sizeof(float), false);
    size_t ms = max_shard(v);
    if (!w->gshard && !(sk && max_shard(skip) >= ms) && !give_gshard(d, nd, ms, &w->gshard))
        WANT(w->gshard, ms * sizeof(float), false);
    if (w->gshard)
        w->gshard_n = ms;
    WANT(w->norm_parts, WORKER_NORM_SLOTS * sizeof(double), true);
    WANT(w->sample, ((size_t)T + 1) * sizeof(uint16_t), false);
out:
    return r;
}

#undef WANT

int worker__work_new(const struct worker_engine *e, const struct engine_view *v, bool touch,
                     const struct work_donor *donors, int ndonors, struct engine_work **ret) {
    struct engine_work *w = st_calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    int r = work_fill(e, v, touch, w, donors, ndonors, NULL);
    if (r < 0) {
        worker__work_free(w, v->hi - v->lo);
        return r;
    }
    *ret = w;
    return 0;
}

int worker__work_complete(const struct worker_engine *e, const struct engine_view *v,
                          bool touch, struct engine_work *w, const struct work_donor *donors,
                          int ndonors) {
    return work_fill(e, v, touch, w, donors, ndonors, NULL);
}

int worker__work_prep(const struct worker_engine *e, const struct engine_view *v,
                      const struct engine_view *have, struct engine_work **ret) {
    struct engine_work *w = st_calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    int r = v->stage < 0 ? 0 : work_fill(e, v, true, w, NULL, 0, have);
    if (r < 0) {
        worker__work_free(w, v->stage < 0 ? 0 : v->hi - v->lo);
        return r;
    }
    *ret = w;
    return 0;
}
