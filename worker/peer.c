/* peer.c: in-memory peer copies of training state (worker-peer.h).
 *
 * The one idea: every worker can compute, from the layout alone, what any position's state
 * looks like (its layers, their sizes, its moment shards), so a copy travels as one bare
 * message per direction, without a header, and the receiver knows where each layer sits in
 * it. Positions form a ring (worker_layout_peer_next: st_peer_ring over the positions' zones,
 * so the successor sits in another zone where there is one; position order in one zone): with
 * a loss of one worker, or of a whole zone, its state survives at its successor and everyone
 * else's at its owner. */
#include <string.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "common.h"
#include "kernels.h" /* kern_layer_param_count */
#include "worker-peer.h"

static int npos(const struct worker_layout *lay) { return lay->dp * lay->pp; }

/* Fills p's layer table (no data) for position pos of lay: the parameters of every layer
 * first (none when !params), then each layer's moment shards. Caller frees p->l. */
static int part_describe(const struct worker_train_config *tc, const struct worker_layout *lay,
                         int pos, bool params, struct worker_peer_part *p) {
    int s = pos / lay->dp, rep = pos % lay->dp;
    int lo = lay->stage_lo[s], hi = lay->stage_lo[s + 1];
    bool tied = s == lay->pp - 1 && lo > 0;
    memset(p, 0, sizeof(*p));
    p->pos = pos;
    p->has_params = params;
    p->nl = hi - lo + (tied ? 1 : 0);
    p->l = st_calloc((size_t)p->nl, sizeof(*p->l));
    if (!p->l)
        return -ENOMEM;
    for (int k = 0; k < p->nl; k++) {
        struct worker_peer_layer *x = &p->l[k];
        x->layer = k < hi - lo ? (uint64_t)(lo + k) : 0; /* the tied extra: layer 0 */
        x->n = kern_layer_param_count(&tc->model, (int)x->layer);
        size_t a = 0, b = 0;
        if (k < hi - lo)
            worker_shard((size_t)x->n, lay->dp, rep, &a, &b);
        x->lo = a;
        x->hi = b;
        x->off = p->pfloats;
        if (params)
            p->pfloats += x->n;
    }
    uint64_t off = p->pfloats;
    for (int k = 0; k < p->nl; k++) {
        p->l[k].moff = off;
        off += 2 * (p->l[k].hi - p->l[k].lo);
    }
    p->nfloats = off;
    return 0;
}

/* Whether the copy pos holds of pred's state can leave out the parameters: data-parallel
 * replicas of one stage hold the same parameters after every step, bit for bit, so our own
 * part of the same generation has them. */
static bool held_params(const struct worker_layout *lay, int pos, int pred) {
    return pos / lay->dp != pred / lay->dp;
}

static void part_done(struct worker_peer_part *p) {
    st_free(p->l);
    st_free(p->data);
    memset(p, 0, sizeof(*p));
}

static void gen_done(struct worker_peer_gen *g) {
    part_done(&g->own);
    part_done(&g->held);
    memset(g, 0, sizeof(*g));
}

static uint64_t part_floats(const struct worker_train_config *tc, const struct worker_layout *lay,
                            int pos, bool params) {
    struct worker_peer_part p;
    if (part_describe(tc, lay, pos, params, &p) < 0)
        return UINT64_MAX / 16;
    uint64_t n = p.nfloats;
    part_done(&p);
    return n;
}

/* See worker-peer.h. */
uint64_t worker__peer_need(const struct worker_train_config *tc, const struct worker_layout *lay,
                           int pos) {
    int pred = worker_layout_peer_prev(lay, pos);
    return WORKER_PEER_GENS *
           (part_floats(tc, lay, pos, true) +
            part_floats(tc, lay, pred, held_params(lay, pos, pred))) * sizeof(float);
}

/* See worker-peer.h. */
uint64_t worker__peer_need_max(const struct worker_train_config *tc,
                               const struct worker_layout *lay) {
    uint64_t m = 0;
    for (int p = 0; p < npos(lay); p++)
        m = ST_MAX(m, worker__peer_need(tc, lay, p));
    return m;
}

/* Copies between the engine's current view and a part laid out by part_describe(). */
static int part_copy(struct worker_peer_part *p, struct worker_engine *eng, bool to_engine) {
    for (int k = 0; k < p->nl; k++) {
        const struct worker_peer_layer *x = &p->l[k];
        struct worker_layer_bufs b;
        TRY(worker_engine_layer(eng, WORKER_VIEW_CURRENT, (int)x->layer, &b));
        if (b.n != x->n || b.shard_lo != x->lo || b.shard_hi != x->hi)
            return -EINVAL;
        float *d = p->data + x->off, *m = p->data + x->moff;
        size_t sh = (size_t)(x->hi - x->lo);
        if (to_engine) {
            memcpy(b.param, d, (size_t)x->n * sizeof(float));
            if (sh) {
                memcpy(b.adam_m, m, sh * sizeof(float));
                memcpy(b.adam_v, m + sh, sh * sizeof(float));
            }
        } else {
            memcpy(d, b.param, (size_t)x->n * sizeof(float));
            if (sh) {
                memcpy(m, b.adam_m, sh * sizeof(float));
                memcpy(m + sh, b.adam_v, sh * sizeof(float));
            }
        }
    }
    return 0;
}

/* See worker-peer.h. */
int worker__peer_take(const struct worker_train_config *tc, struct worker_engine *eng,
                      uint64_t epoch, uint64_t step, struct worker_peer_gen *ret) {
    struct worker_peer_gen g;
    int r = 0;
    if (!tc || !eng || !ret)
        return -EINVAL;
    memset(&g, 0, sizeof(g));
    const struct worker_layout *lay = worker_engine_layout(eng);
    int n = npos(lay), st = worker_engine_stage(eng), rep = worker_engine_replica(eng);
    if (st < 0 || n < 2)
        return -EINVAL;
    int pos = st * lay->dp + rep, pred = worker_layout_peer_prev(lay, pos);
    g.epoch = epoch;
    g.step = step;
    g.opt_step = worker_engine_opt_step(eng);
    g.layout = *lay;
    g.stage = st;
    g.replica = rep;
    TRY_GOTO(part_describe(tc, lay, pos, true, &g.own), r, out);
    TRY_GOTO(part_describe(tc, lay, pred, held_params(lay, pos, pred), &g.held), r, out);
    g.own.data = st_malloc(ST_MAX(g.own.nfloats, 1) * sizeof(float));
    g.held.data = st_malloc(ST_MAX(g.held.nfloats, 1) * sizeof(float));
    if (!g.own.data || !g.held.data)
        TRY_GOTO(-ENOMEM, r, out);
    TRY_GOTO(part_copy(&g.own, eng, false), r, out);
    *ret = g;
    return 0;
out:
    gen_done(&g);
    return r;
}

/* See worker-peer.h. */
int worker__peer_swap(struct worker_peer_gen *g, struct mig_comm *comm) {
    if (!g || !comm || g->valid || !g->own.data || !g->held.data ||
        mig_comm_size(comm) != npos(&g->layout))
        return -EINVAL;
    int pos = g->stage * g->layout.dp + g->replica, succ = worker_layout_peer_next(&g->layout, pos);
    /* A successor in our stage has our parameters: it takes only the moment shards. */
    uint64_t skip = held_params(&g->layout, succ, pos) ? 0 : g->own.pfloats;
    struct mig_op ops[2] = {
        {.peer = succ, .send = true, .buf = g->own.data + skip,
         .bytes = (size_t)(g->own.nfloats - skip) * sizeof(float)},
        {.peer = worker_layout_peer_prev(&g->layout, pos), .send = false, .buf = g->held.data,
         .bytes = (size_t)g->held.nfloats * sizeof(float)},
    };
    TRY(mig_batch(comm, ops, 2));
    g->valid = true;
    return 0;
}

/* See worker-peer.h. */
void worker__peer_keep(struct worker_peer_store *s, struct worker_peer_gen *g) {
    if (!s || !g || !g->valid)
        return;
    /* Replace the oldest (or an empty) generation. */
    int k = !s->gen[0].valid ? 0 : !s->gen[1].valid ? 1 : s->gen[0].step <= s->gen[1].step ? 0 : 1;
    gen_done(&s->gen[k]);
    s->gen[k] = *g;
    memset(g, 0, sizeof(*g));
}

/* See worker-peer.h. */
void worker__peer_gen_free(struct worker_peer_gen *g) {
    if (g)
        gen_done(g);
}

/* See worker-peer.h. */
int worker__peer_exchange(struct worker_peer_store *s, const struct worker_train_config *tc,
                          struct worker_engine *eng, struct mig_comm *comm, uint64_t epoch,
                          uint64_t step) {
    struct worker_peer_gen g;
    if (!s || !comm)
        return -EINVAL;
    TRY(worker__peer_take(tc, eng, epoch, step, &g));
    int r = worker__peer_swap(&g, comm);
    if (r >= 0)
        worker__peer_keep(s, &g);
    gen_done(&g);
    return r;
}

static bool same_layout(const struct worker_layout *a, const struct worker_layout *b) {
    if (a->dp != b->dp || a->pp != b->pp)
        return false;
    for (int i = 0; i <= a->pp; i++)
        if (a->stage_lo[i] != b->stage_lo[i])
            return false;
    for (int p = 0; p < npos(a); p++)
        if (worker_layout_peer_next(a, p) != worker_layout_peer_next(b, p))
            return false;
    return true;
}

/* See worker-peer.h. */
const struct worker_peer_gen *worker__peer_find(const struct worker_peer_store *s,
                                                struct worker_engine *eng, uint64_t step) {
    for (int k = 0; s && k < WORKER_PEER_GENS; k++) {
        const struct worker_peer_gen *g = &s->gen[k];
        if (!g->valid || g->step != step)
            continue;
        if (eng && (!same_layout(&g->layout, worker_engine_layout(eng)) ||
                    g->stage != worker_engine_stage(eng) ||
                    g->replica != worker_engine_replica(eng)))
            continue;
        return g;
    }
    return NULL;
}

/* See worker-peer.h. */
const struct worker_peer_gen *worker__peer_get(const struct worker_peer_store *s, uint64_t epoch,
                                               uint64_t step) {
    for (int k = 0; s && k < WORKER_PEER_GENS; k++)
        if (s->gen[k].valid && s->gen[k].epoch == epoch && s->gen[k].step == step)
            return &s->gen[k];
    return NULL;
}

/* See worker-peer.h. */
bool worker__peer_holds(const struct worker_peer_store *s, uint64_t epoch) {
    for (int k = 0; s && k < WORKER_PEER_GENS; k++)
        if (s->gen[k].valid && s->gen[k].epoch == epoch)
            return true;
    return false;
}

/* See worker-peer.h. */
int worker__peer_fill(const struct worker_peer_gen *g, struct worker_engine *eng) {
    if (!g || !eng || !g->valid)
        return -EINVAL;
    for (int k = 0; k < g->own.nl; k++) {
        const struct worker_peer_layer *x = &g->own.l[k];
        struct worker_layer_bufs b;
        /* Layer 0 answers with the tied copy where the engine holds only that: a reshape
         * keeps the embedding's parameters there too, and no moments. */
        int r = worker_engine_layer(eng, WORKER_VIEW_CURRENT, (int)x->layer, &b);
        if (r == -ENOENT)
            continue;
        TRY(r);
        if (b.n != x->n)
            return -EINVAL;
        const float *d = g->own.data + x->off, *m = g->own.data + x->moff;
        memcpy(b.param, d, (size_t)x->n * sizeof(float));
        uint64_t lo = ST_MAX(x->lo, (uint64_t)b.shard_lo), hi = ST_MIN(x->hi, (uint64_t)b.shard_hi);
        if (lo < hi && b.adam_m && b.adam_v) {
            size_t sh = (size_t)(x->hi - x->lo);
            memcpy(b.adam_m + (lo - b.shard_lo), m + (lo - x->lo),
                   (size_t)(hi - lo) * sizeof(float));
            memcpy(b.adam_v + (lo - b.shard_lo), m + sh + (lo - x->lo),
                   (size_t)(hi - lo) * sizeof(float));
        }
    }
    return worker_engine_set_opt_step(eng, g->opt_step);
}

/* See worker-peer.h. */
int worker__peer_rollback(const struct worker_peer_gen *g, struct worker_engine *eng) {
    if (!g || !eng || !g->valid)
        return -EINVAL;
    struct worker_peer_part p = g->own; /* part_copy only reads the table and the data */
    TRY(part_copy(&p, eng, true));
    return worker_engine_set_opt_step(eng, g->opt_step);
}

/* The range of part p that transfer x names (whole-layer offsets), or -ERANGE. */
static int part_buf(const struct worker_peer_part *p, const struct mig_xfer *x, float **ret) {
    for (int k = 0; k < p->nl; k++) {
        const struct worker_peer_layer *L = &p->l[k];
        if (L->layer != x->layer)
            continue;
        if (x->kind == ST_STATE_PARAM) {
            if (!p->has_params)
                return -ENODATA;
            if (x->offset + x->count > L->n)
                return -ERANGE;
            *ret = p->data + L->off + x->offset;
            return 0;
        }
        if (x->offset < L->lo || x->offset + x->count > L->hi)
            return -ERANGE;
        float *m = p->data + L->moff + (x->kind == ST_STATE_ADAM_V ? L->hi - L->lo : 0);
        *ret = m + (x->offset - L->lo);
        return 0;
    }
    return -ERANGE;
}

/* See worker-peer.h. */
int worker__peer_held_buf(const struct worker_peer_gen *g, const struct mig_xfer *x,
                          float **ret) {
    if (!g || !x || !ret || !g->valid)
        return -EINVAL;
    if (x->kind == ST_STATE_PARAM && !g->held.has_params)
        return part_buf(&g->own, x, ret); /* a replica of our stage: its parameters are ours */
    return part_buf(&g->held, x, ret);
}

/* See worker-peer.h. */
int worker__peer_own_buf(const struct worker_peer_gen *g, const struct mig_xfer *x, float **ret) {
    if (!g || !x || !ret || !g->valid)
        return -EINVAL;
    return part_buf(&g->own, x, ret);
}

/* See worker-peer.h. */
void worker__peer_store_done(struct worker_peer_store *s) {
    for (int k = 0; s && k < WORKER_PEER_GENS; k++)
        gen_done(&s->gen[k]);
}
