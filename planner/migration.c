/* migration.c: migration transfer plans (planner-migration.h), from the layout model of
 * layout.c (stages, tied copies, shards: who holds what).
 *
 * The one idea: every holding in the state model is a single element interval per (worker,
 * layer, kind) — a whole layer for PARAM, one ZeRO-1 shard for ADAM_M/ADAM_V — so "what must
 * move" is interval arithmetic: need minus what is held in place, split where the old shard
 * boundaries fall. The only real choice is the new assignment of survivors to positions,
 * a maximum-weight bipartite matching on bytes kept in place (SpotServe's Kuhn–Munkres step),
 * and the choice of PARAM senders, which is greedy with load balancing.
 *
 * Pure: no I/O, no clocks, no globals, no logging. Callers: cli/cmd-plan.c, the coordinator,
 * the migration executor's tests. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"             /* st_malloc, st_calloc, st_realloc, st_free */
#include "migration-internal.h" /* struct plan__ctx, shared with mig-validate.c */
#include "planner-internal.h"   /* plan__hungarian */

/* ---- small helpers -------------------------------------------------------------------- */

int plan__errf(char *err, size_t errlen, int r, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return r;
}

/* ---- request context ------------------------------------------------------------------ */

void plan__ctx_done(struct plan__ctx *c) {
    st_free(c->old_at);
    st_free(c->so_of);
    st_free(c->sn_of);
    c->old_at = NULL;
    c->so_of = c->sn_of = NULL;
}

static bool w_live(const struct plan__ctx *c, uint32_t w) {
    return c->req->workers[w].alive;
}

static bool w_has_old(const struct plan__ctx *c, uint32_t w) {
    return c->req->workers[w].stage >= 0;
}

/* What worker w holds (old) of (layer, kind); false when nothing or when w is dead. */
bool plan__w_holding(const struct plan__ctx *c, uint32_t w, uint32_t layer, uint32_t kind,
                      uint64_t *a, uint64_t *b) {
    const struct plan_mig_worker *wk = &c->req->workers[w];
    if (!wk->alive || wk->stage < 0)
        return false;
    return plan__pos_holding(c->ol, c->np, (uint32_t)wk->stage, (uint32_t)wk->replica, layer,
                             kind, a, b);
}

/* Validates the request and builds the lookup tables. */
int plan__ctx_init(struct plan__ctx *c, const struct plan_mig_request *req, char *err,
                    size_t errlen) {
    memset(c, 0, sizeof(*c));
    if (!req)
        return plan__errf(err, errlen, -EINVAL, "no request");
    if (req->nlayers == 0 || req->nlayers > PLAN_MIG_MAX_LAYERS || !req->layer_params)
        return plan__errf(err, errlen, -EINVAL, "model needs 1..%u layers (got %u)",
                          PLAN_MIG_MAX_LAYERS, req->nlayers);
    uint64_t total = 0;
    for (uint32_t l = 0; l < req->nlayers; l++) {
        if (req->layer_params[l] > PLAN_MIG_MAX_LAYER_ELEMS)
            return plan__errf(err, errlen, -EINVAL, "layer %u: %llu elements is too large", l,
                              (unsigned long long)req->layer_params[l]);
        total += req->layer_params[l];
    }
    if (total > PLAN_MIG_MAX_LAYER_ELEMS * 4) /* keeps matching weights far from overflow */
        return plan__errf(err, errlen, -EINVAL, "model of %llu elements is too large",
                          (unsigned long long)total);
    if (!req->old_layout || !req->new_layout)
        return plan__errf(err, errlen, -EINVAL, "old and new layouts are required");
    char sub[200];
    if (plan_mig_layout_check(req->old_layout, req->nlayers, sub, sizeof(sub)) < 0)
        return plan__errf(err, errlen, -EINVAL, "old layout: %s", sub);
    if (plan_mig_layout_check(req->new_layout, req->nlayers, sub, sizeof(sub)) < 0)
        return plan__errf(err, errlen, -EINVAL, "new layout: %s", sub);
    if (req->nworkers > PLAN_MIG_MAX_WORKERS || (req->nworkers && !req->workers))
        return plan__errf(err, errlen, -EINVAL, "bad worker count %u (max %u)", req->nworkers,
                          PLAN_MIG_MAX_WORKERS);
    c->req = req;
    c->ol = req->old_layout;
    c->nl = req->new_layout;
    c->np = req->layer_params;
    c->nlayers = req->nlayers;
    c->nw = req->nworkers;
    c->oP = c->ol->dp * c->ol->pp;
    c->nP = c->nl->dp * c->nl->pp;
    c->old_at = st_malloc(c->oP * sizeof(int32_t));
    c->so_of = st_malloc(c->nlayers * sizeof(uint32_t));
    c->sn_of = st_malloc(c->nlayers * sizeof(uint32_t));
    if (!c->old_at || !c->so_of || !c->sn_of) {
        plan__ctx_done(c);
        return -ENOMEM;
    }
    for (uint32_t p = 0; p < c->oP; p++)
        c->old_at[p] = -1;
    for (uint32_t s = 0; s < c->ol->pp; s++)
        for (uint32_t l = c->ol->stage_lo[s]; l < c->ol->stage_lo[s + 1]; l++)
            c->so_of[l] = s;
    for (uint32_t s = 0; s < c->nl->pp; s++)
        for (uint32_t l = c->nl->stage_lo[s]; l < c->nl->stage_lo[s + 1]; l++)
            c->sn_of[l] = s;
    for (uint32_t w = 0; w < c->nw; w++) {
        const struct plan_mig_worker *wk = &req->workers[w];
        if (!memchr(wk->id, '\0', sizeof(wk->id))) {
            plan__ctx_done(c);
            return plan__errf(err, errlen, -EINVAL, "worker %u: id is not NUL-terminated", w);
        }
        if (wk->leaving && !wk->alive) {
            plan__ctx_done(c);
            return plan__errf(err, errlen, -EINVAL, "worker %u ('%s'): leaving but not alive", w,
                              wk->id);
        }
        if (wk->stage < 0) {
            if (wk->stage != -1) {
                plan__ctx_done(c);
                return plan__errf(err, errlen, -EINVAL, "worker %u ('%s'): bad stage %d", w, wk->id,
                                  wk->stage);
            }
            continue;
        }
        if ((uint32_t)wk->stage >= c->ol->pp || wk->replica < 0 ||
            (uint32_t)wk->replica >= c->ol->dp) {
            plan__ctx_done(c);
            return plan__errf(err, errlen, -EINVAL,
                              "worker %u ('%s'): position (%d, %d) outside the old %u x %u "
                              "layout", w, wk->id, wk->stage, wk->replica, c->ol->dp, c->ol->pp);
        }
        uint32_t p = (uint32_t)wk->stage * c->ol->dp + (uint32_t)wk->replica;
        if (c->old_at[p] >= 0) {
            int32_t prev = c->old_at[p];
            plan__ctx_done(c);
            return plan__errf(err, errlen, -EINVAL,
                              "workers %d and %u both hold old position (stage %d, replica %d)",
                              prev, w, wk->stage, wk->replica);
        }
        c->old_at[p] = (int32_t)w;
    }
    return 0;
}

/* ---- lost state ----------------------------------------------------------------------- */

/* Fills lost[l] (may be NULL) and returns the number of layers with anything lost. */
static int find_lost(const struct plan__ctx *c, uint8_t *lost) {
    int nlost = 0;
    for (uint32_t l = 0; l < c->nlayers; l++) {
        uint8_t mask = 0;
        uint32_t so = c->so_of[l];
        bool param = c->np[l] == 0; /* nothing to lose */
        for (uint32_t r = 0; r < c->ol->dp && !param; r++) {
            int32_t w = c->old_at[so * c->ol->dp + r];
            param = w >= 0 && w_live(c, (uint32_t)w);
        }
        for (uint32_t s = 0; s < c->ol->pp && !param; s++) {
            if (!plan__tied_holds(c->ol, s, l))
                continue;
            for (uint32_t r = 0; r < c->ol->dp && !param; r++) {
                int32_t w = c->old_at[s * c->ol->dp + r];
                param = w >= 0 && w_live(c, (uint32_t)w);
            }
        }
        if (!param)
            mask |= 1u << ST_STATE_PARAM;
        for (uint32_t r = 0; r < c->ol->dp; r++) {
            uint64_t off, cnt;
            plan_mig_shard(c->np[l], c->ol->dp, r, &off, &cnt);
            int32_t w = c->old_at[so * c->ol->dp + r];
            if (cnt > 0 && (w < 0 || !w_live(c, (uint32_t)w)))
                mask |= (1u << ST_STATE_ADAM_M) | (1u << ST_STATE_ADAM_V);
        }
        if (lost)
            lost[l] = mask;
        if (mask)
            nlost++;
    }
    return nlost;
}

int plan_migration_lost(const struct plan_mig_request *req, uint8_t *ret_lost_kinds) {
    struct plan__ctx c;
    int r = plan__ctx_init(&c, req, NULL, 0);
    if (r < 0)
        return r;
    r = find_lost(&c, ret_lost_kinds);
    plan__ctx_done(&c);
    return r;
}

/* ---- assignment: maximum bytes kept in place ------------------------------------------ */

static uint32_t uf_find(uint32_t *parent, uint32_t x) {
    while (parent[x] != x) {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    return x;
}

/* Chooses pos_worker[nP] (worker per new position). */
static int choose_assignment(const struct plan__ctx *c, uint32_t *pos_worker, char *err,
                             size_t errlen) {
    const struct plan_mig_layout *ol = c->ol, *nl = c->nl;
    uint32_t nP = c->nP;
    int r = -ENOMEM;
    uint32_t *rows = NULL, *row_col = NULL, *parent = NULL, *comp_rows = NULL,
             *comp_cols = NULL, *sub_col = NULL, *comp_rows_head = NULL, *comp_link = NULL;
    int64_t *val = NULL, *cst = NULL, *sub = NULL;
    bool *taken = NULL;

    uint32_t navail = 0;
    for (uint32_t w = 0; w < c->nw; w++)
        navail += c->req->workers[w].alive && !c->req->workers[w].leaving;
    if (navail < nP)
        return plan__errf(err, errlen, -ENOSPC,
                          "the %u x %u target needs %u workers but only %u are alive and staying",
                          nl->dp, nl->pp, nP, navail);

    if (c->req->fixed_position) {
        for (uint32_t p = 0; p < nP; p++)
            pos_worker[p] = UINT32_MAX;
        for (uint32_t w = 0; w < c->nw; w++) {
            int32_t p = c->req->fixed_position[w];
            if (p < 0)
                continue;
            const struct plan_mig_worker *wk = &c->req->workers[w];
            if ((uint32_t)p >= nP)
                return plan__errf(err, errlen, -EINVAL, "worker %u: fixed position %d out of range",
                                  w, p);
            if (!wk->alive || wk->leaving)
                return plan__errf(err, errlen, -EINVAL,
                                  "worker %u ('%s'): fixed position but dead or leaving", w,
                                  wk->id);
            if (pos_worker[p] != UINT32_MAX)
                return plan__errf(err, errlen, -EINVAL, "fixed position %d given to two workers",
                                  p);
            pos_worker[p] = w;
        }
        for (uint32_t p = 0; p < nP; p++)
            if (pos_worker[p] == UINT32_MAX)
                return plan__errf(err, errlen, -EINVAL, "fixed assignment leaves position %u empty",
                                  p);
        return 0;
    }

    /* Rows: alive, staying workers with an old position. */
    uint32_t R = 0;
    rows = st_malloc((c->nw ? c->nw : 1) * sizeof(uint32_t));
    taken = st_calloc(c->nw ? c->nw : 1, sizeof(bool));
    if (!rows || !taken)
        goto out;
    for (uint32_t w = 0; w < c->nw; w++)
        if (c->req->workers[w].alive && !c->req->workers[w].leaving && w_has_old(c, w))
            rows[R++] = w;
    for (uint32_t p = 0; p < nP; p++)
        pos_worker[p] = UINT32_MAX;

    if (R > 0) {
        /* Weight (elements kept in place) = PARAM part, constant per (old stage, new stage),
         * plus the ADAM part, 2 * shard overlap per shared layer. */
        uint32_t opp = ol->pp, npp = nl->pp;
        cst = st_calloc((size_t)opp * npp, sizeof(int64_t));
        val = st_calloc((size_t)R * nP, sizeof(int64_t));
        row_col = st_malloc(R * sizeof(uint32_t));
        int32_t *row_of_old = (int32_t *)st_malloc(c->oP * sizeof(int32_t));
        if (!cst || !val || !row_col || !row_of_old) {
            st_free(row_of_old);
            goto out;
        }
        for (uint32_t p = 0; p < c->oP; p++)
            row_of_old[p] = -1;
        for (uint32_t i = 0; i < R; i++) {
            const struct plan_mig_worker *wk = &c->req->workers[rows[i]];
            row_of_old[(uint32_t)wk->stage * ol->dp + (uint32_t)wk->replica] = (int32_t)i;
        }
        for (uint32_t l = 0; l < c->nlayers; l++) {
            uint32_t gs[1 + PLAN_MIG_MAX_TIED], hs[1 + PLAN_MIG_MAX_TIED];
            uint32_t ng = plan__param_stages(ol, c->so_of, l, gs);
            uint32_t nh = plan__param_stages(nl, c->sn_of, l, hs);
            for (uint32_t a = 0; a < ng; a++)
                for (uint32_t b = 0; b < nh; b++)
                    cst[gs[a] * npp + hs[b]] += (int64_t)c->np[l];
        }
        for (uint32_t i = 0; i < R; i++) {
            uint32_t so = (uint32_t)c->req->workers[rows[i]].stage;
            for (uint32_t p = 0; p < nP; p++)
                val[(size_t)i * nP + p] = cst[so * npp + p / nl->dp];
        }
        for (uint32_t l = 0; l < c->nlayers; l++) {
            uint64_t n = c->np[l];
            uint32_t so = c->so_of[l], sn = c->sn_of[l];
            uint32_t ro = 0, rn = 0;
            while (ro < ol->dp && rn < nl->dp) { /* merge the two shard partitions */
                uint64_t oa = plan__shard_lo(n, ol->dp, ro), ob = plan__shard_lo(n, ol->dp, ro + 1);
                uint64_t na = plan__shard_lo(n, nl->dp, rn), nb = plan__shard_lo(n, nl->dp, rn + 1);
                uint64_t a = ST_MAX(oa, na), b = ST_MIN(ob, nb);
                if (b > a) {
                    int32_t i = row_of_old[so * ol->dp + ro];
                    if (i >= 0)
                        val[(size_t)i * nP + sn * nl->dp + rn] += 2 * (int64_t)(b - a);
                }
                if (ob <= nb)
                    ro++;
                else
                    rn++;
            }
        }
        st_free(row_of_old);

        /* Shortcut: if every row's best position is distinct, that is optimal. */
        bool distinct = true;
        for (uint32_t i = 0; i < R; i++) {
            const int64_t *row = val + (size_t)i * nP;
            uint32_t best = UINT32_MAX;
            int64_t bv = 0;
            for (uint32_t p = 0; p < nP; p++)
                if (row[p] > bv) {
                    bv = row[p];
                    best = p;
                }
            row_col[i] = best;
            if (best != UINT32_MAX) {
                if (pos_worker[best] != UINT32_MAX) {
                    distinct = false;
                    break;
                }
                pos_worker[best] = rows[i];
            }
        }
        if (!distinct) {
            for (uint32_t p = 0; p < nP; p++)
                pos_worker[p] = UINT32_MAX;
            /* Components of the positive-weight graph; each is solved on its own. A weight
             * is positive exactly when the stage pair shares parameters (cst > 0; the ADAM
             * part needs a shared layer too), so the components come from the stage graph:
             * rows join their old-stage node, columns their new-stage node, and stage nodes
             * join when cst > 0. O(R + nP + opp*npp) instead of a scan of the matrix. */
            uint32_t NN = R + nP + opp + npp;
            parent = st_malloc(NN * sizeof(uint32_t));
            comp_rows = st_malloc(R * sizeof(uint32_t));
            comp_cols = st_malloc(nP * sizeof(uint32_t));
            comp_rows_head = st_malloc(NN * sizeof(uint32_t));
            comp_link = st_malloc(NN * sizeof(uint32_t));
            if (!parent || !comp_rows || !comp_cols || !comp_rows_head || !comp_link)
                goto out;
            for (uint32_t x = 0; x < NN; x++)
                parent[x] = x;
            for (uint32_t i = 0; i < R; i++)
                parent[i] = R + nP + (uint32_t)c->req->workers[rows[i]].stage;
            for (uint32_t p = 0; p < nP; p++)
                parent[R + p] = R + nP + opp + p / nl->dp;
            for (uint32_t so = 0; so < opp; so++)
                for (uint32_t sn = 0; sn < npp; sn++)
                    if (cst[so * npp + sn] > 0) {
                        uint32_t x = uf_find(parent, R + nP + so);
                        uint32_t y = uf_find(parent, R + nP + opp + sn);
                        if (x != y)
                            parent[x] = y;
                    }
            /* Bucket rows and columns by component root (linked lists through parent-sized
             * arrays), so each component is gathered in time proportional to its size. */
            uint32_t *head = comp_rows_head, *link = comp_link;
            for (uint32_t x = 0; x < NN; x++)
                head[x] = UINT32_MAX;
            for (uint32_t x = R + nP; x-- > 0;) {
                uint32_t root = uf_find(parent, x);
                link[x] = head[root];
                head[root] = x;
            }
            for (uint32_t root = 0; root < NN; root++) {
                if (head[root] == UINT32_MAX)
                    continue;
                uint32_t cr = 0, cc = 0;
                for (uint32_t x = head[root]; x != UINT32_MAX; x = link[x]) {
                    if (x < R)
                        comp_rows[cr++] = x;
                    else
                        comp_cols[cc++] = x - R;
                }
                if (cr == 0 || cc == 0)
                    continue;
                bool tr = cr > cc; /* Hungarian wants n <= m */
                uint32_t n = tr ? cc : cr, m = tr ? cr : cc;
                sub = st_malloc((size_t)n * m * sizeof(int64_t));
                sub_col = st_malloc(n * sizeof(uint32_t));
                if (!sub || !sub_col)
                    goto out;
                for (uint32_t x = 0; x < n; x++)
                    for (uint32_t y = 0; y < m; y++) {
                        uint32_t i = tr ? comp_rows[y] : comp_rows[x];
                        uint32_t p = tr ? comp_cols[x] : comp_cols[y];
                        sub[(size_t)x * m + y] = -val[(size_t)i * nP + p];
                    }
                r = plan__hungarian(sub, n, m, sub_col);
                if (r < 0)
                    goto out;
                for (uint32_t x = 0; x < n; x++) {
                    uint32_t i = tr ? comp_rows[sub_col[x]] : comp_rows[x];
                    uint32_t p = tr ? comp_cols[x] : comp_cols[sub_col[x]];
                    if (val[(size_t)i * nP + p] > 0)
                        pos_worker[p] = rows[i];
                }
                st_free(sub);
                st_free(sub_col);
                sub = NULL;
                sub_col = NULL;
            }
        }
    }
    /* Positions left: alive, staying workers not yet placed, lowest index first. */
    for (uint32_t p = 0; p < nP; p++)
        if (pos_worker[p] != UINT32_MAX)
            taken[pos_worker[p]] = true;
    uint32_t next = 0;
    for (uint32_t p = 0; p < nP; p++) {
        if (pos_worker[p] != UINT32_MAX)
            continue;
        while (next < c->nw && (taken[next] || !c->req->workers[next].alive ||
                                c->req->workers[next].leaving))
            next++;
        if (next >= c->nw) { /* cannot happen: navail >= nP was checked */
            r = plan__errf(err, errlen, -ENOSPC, "not enough workers for position %u", p);
            goto out;
        }
        pos_worker[p] = next;
        taken[next] = true;
    }
    r = 0;
out:
    st_free(rows);
    st_free(row_col);
    st_free(parent);
    st_free(comp_rows);
    st_free(comp_cols);
    st_free(comp_rows_head);
    st_free(comp_link);
    st_free(sub_col);
    st_free(val);
    st_free(cst);
    st_free(sub);
    st_free(taken);
    return r;
}

/* ---- transfers ------------------------------------------------------------------------ */

struct xfers {
    struct plan_mig_transfer *v;
    size_t n, cap;
};

static int xfer_add(struct xfers *x, uint32_t src, uint32_t dst, uint32_t layer, uint32_t kind,
                    uint64_t off, uint64_t cnt) {
    if (cnt == 0)
        return 0;
    if (x->n == x->cap) {
        size_t ncap = x->cap ? x->cap * 2 : 256;
        struct plan_mig_transfer *nv = st_realloc(x->v, ncap * sizeof(*nv));
        if (!nv)
            return -ENOMEM;
        x->v = nv;
        x->cap = ncap;
    }
    x->v[x->n++] = (struct plan_mig_transfer){src, dst, layer, kind, off, cnt};
    return 0;
}

/* Stable counting sort of v[0..n) by src (by_src) or dst into a new array (caller frees).
 * O(n + nw): plans reach ~10^6 transfers, where qsort dominated the planning time. */
struct plan_mig_transfer *plan__bucket_sort(const struct plan_mig_transfer *v, size_t n,
                                             uint32_t nw, bool by_src) {
    size_t *start = st_calloc((size_t)nw + 1, sizeof(size_t));
    struct plan_mig_transfer *out = st_malloc((n ? n : 1) * sizeof(*out));
    if (!start || !out) {
        st_free(start);
        st_free(out);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        start[(by_src ? v[i].src : v[i].dst) + 1]++;
    for (uint32_t w = 0; w < nw; w++)
        start[w + 1] += start[w];
    for (size_t i = 0; i < n; i++)
        out[start[by_src ? v[i].src : v[i].dst]++] = v[i];
    st_free(start);
    return out;
}

int plan__cmp_xfer_dst(const void *pa, const void *pb) {
    const struct plan_mig_transfer *a = pa, *b = pb;
    if (a->dst != b->dst)
        return a->dst < b->dst ? -1 : 1;
    if (a->layer != b->layer)
        return a->layer < b->layer ? -1 : 1;
    if (a->kind != b->kind)
        return a->kind < b->kind ? -1 : 1;
    return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Per-destination scratch for PARAM sender choice. */
struct pick {
    uint64_t *score;   /* [old pp]: missing PARAM elements of dst held by old stage */
    int32_t *chosen;   /* [old pp]: sender chosen from that stage for this dst, -1 */
    uint32_t *touched; /* old stages with score/chosen set */
    uint32_t ntouched;
    uint64_t *load;    /* [nw]: elements assigned to send so far */
    int32_t *new_stage; /* [nw] */
};

/* Sort key of a candidate sender (smaller is better). */
struct key {
    int peer;          /* 0 = in dst's new stage */
    uint64_t nscore;   /* ~score */
    int leaving;
    uint64_t load;
    uint32_t w;
};

static bool key_less(const struct key *a, const struct key *b) {
    if (a->peer != b->peer)
        return a->peer < b->peer;
    if (a->nscore != b->nscore)
        return a->nscore < b->nscore;
    if (a->leaving != b->leaving)
        return a->leaving < b->leaving;
    if (a->load != b->load)
        return a->load < b->load;
    return a->w < b->w;
}

static struct key make_key(const struct plan__ctx *c, const struct pick *pk, uint32_t w,
                           uint32_t sn, uint64_t score) {
    struct key k = {pk->new_stage[w] == (int32_t)sn ? 0 : 1, ~score,
                    c->req->workers[w].leaving ? 1 : 0, pk->load[w], w};
    return k;
}

/* The sender of old stage g for a dst in new stage sn (cached per dst). */
static int32_t group_sender(const struct plan__ctx *c, struct pick *pk, uint32_t g, uint32_t sn) {
    if (pk->chosen[g] >= 0)
        return pk->chosen[g];
    int32_t best = -1;
    struct key bk = {0};
    for (uint32_t r = 0; r < c->ol->dp; r++) {
        int32_t w = c->old_at[g * c->ol->dp + r];
        if (w < 0 || !w_live(c, (uint32_t)w))
            continue;
        struct key k = make_key(c, pk, (uint32_t)w, sn, 0);
        if (best < 0 || key_less(&k, &bk)) {
            best = w;
            bk = k;
        }
    }
    pk->chosen[g] = best;
    return best;
}

/* Adds the transfers that bring position p's needs to worker w. */
static int plan_position(const struct plan__ctx *c, struct pick *pk, uint32_t p, uint32_t w,
                         struct xfers *x, uint64_t *kept, uint64_t *needed, uint32_t *lost_layer,
                         uint32_t *lost_kind) {
    const struct plan_mig_layout *ol = c->ol, *nl = c->nl;
    uint32_t sn = p / nl->dp, rn = p % nl->dp;
    int r;
    /* PARAM: layers in range plus tied extras. */
    pk->ntouched = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t l = 0; l < c->nlayers; l++) {
            if (!plan__stage_holds(nl, sn, l, ST_STATE_PARAM))
                continue;
            uint64_t a, b;
            if (pass == 0)
                *needed += c->np[l];
            if (plan__w_holding(c, w, l, ST_STATE_PARAM, &a, &b)) {
                if (pass == 0)
                    *kept += c->np[l];
                continue;
            }
            if (c->np[l] == 0)
                continue;
            /* Old stages holding PARAM l: its range stage and tied holders. */
            uint32_t gs[1 + PLAN_MIG_MAX_TIED];
            uint32_t ng = plan__param_stages(ol, c->so_of, l, gs);
            if (pass == 0) {
                for (uint32_t i = 0; i < ng; i++) {
                    uint32_t g = gs[i];
                    if (pk->score[g] == 0)
                        pk->touched[pk->ntouched++] = g;
                    pk->score[g] += c->np[l];
                }
                continue;
            }
            int32_t best = -1;
            struct key bk = {0};
            for (uint32_t i = 0; i < ng; i++) {
                uint32_t g = gs[i];
                int32_t s = group_sender(c, pk, g, sn);
                if (s >= 0) {
                    struct key k = make_key(c, pk, (uint32_t)s, sn, pk->score[g]);
                    if (best < 0 || key_less(&k, &bk)) {
                        best = s;
                        bk = k;
                    }
                }
            }
            if (best < 0) {
                *lost_layer = l;
                *lost_kind = ST_STATE_PARAM;
                return -ENODATA;
            }
            r = xfer_add(x, (uint32_t)best, w, l, ST_STATE_PARAM, 0, c->np[l]);
            if (r < 0)
                return r;
            pk->load[best] += c->np[l];
        }
    }
    for (uint32_t i = 0; i < pk->ntouched; i++) {
        pk->score[pk->touched[i]] = 0;
        pk->chosen[pk->touched[i]] = -1;
    }
    /* ADAM: the new shard of every layer in range, pieced from the old shards. */
    for (uint32_t l = nl->stage_lo[sn]; l < nl->stage_lo[sn + 1]; l++) {
        uint64_t n = c->np[l], a, cnt;
        plan_mig_shard(n, nl->dp, rn, &a, &cnt);
        uint64_t b = a + cnt;
        *needed += 2 * cnt;
        if (cnt == 0)
            continue;
        uint32_t so = c->so_of[l];
        for (uint32_t ro = plan__shard_index_of(n, ol->dp, a); ro < ol->dp; ro++) {
            uint64_t oa = plan__shard_lo(n, ol->dp, ro), ob = plan__shard_lo(n, ol->dp, ro + 1);
            if (oa >= b)
                break;
            uint64_t pa = ST_MAX(a, oa), pb = ST_MIN(b, ob);
            if (pb <= pa)
                continue;
            int32_t h = c->old_at[so * ol->dp + ro];
            if (h == (int32_t)w) {
                *kept += 2 * (pb - pa);
                continue;
            }
            if (h < 0 || !w_live(c, (uint32_t)h)) {
                *lost_layer = l;
                *lost_kind = ST_STATE_ADAM_M;
                return -ENODATA;
            }
            for (uint32_t k = ST_STATE_ADAM_M; k <= ST_STATE_ADAM_V; k++) {
                r = xfer_add(x, (uint32_t)h, w, l, k, pa, pb - pa);
                if (r < 0)
                    return r;
            }
            pk->load[h] += 2 * (pb - pa);
        }
    }
    return 0;
}

struct plan_migration *plan_migration_free(struct plan_migration *p) {
    if (!p)
        return NULL;
    st_free(p->position_worker);
    st_free(p->worker_stage);
    st_free(p->worker_replica);
    st_free(p->transfers);
    st_free(p->pairs);
    st_free(p->sent_bytes);
    st_free(p->recv_bytes);
    p->magic = 0;
    st_free(p);
    return NULL;
}

static enum plan_reconf classify(const struct plan__ctx *c, const struct plan_migration *p) {
    const struct plan_mig_layout *ol = c->ol, *nl = c->nl;
    bool same_ranges = ol->pp == nl->pp &&
                       memcmp(ol->stage_lo, nl->stage_lo, (ol->pp + 1) * sizeof(uint32_t)) == 0;
    if (!same_ranges)
        return PLAN_RECONF_PIPELINE;
    bool kept_all = ol->dp == nl->dp && p->ntransfers == 0;
    for (uint32_t q = 0; q < c->nP && kept_all; q++)
        kept_all = (uint32_t)c->old_at[q] == p->position_worker[q];
    if (kept_all)
        return PLAN_RECONF_NONE;
    for (uint32_t q = 0; q < c->nP; q++) {
        const struct plan_mig_worker *wk = &c->req->workers[p->position_worker[q]];
        if (wk->stage != (int32_t)(q / nl->dp))
            return PLAN_RECONF_INTER_STAGE;
    }
    return PLAN_RECONF_INTRA_STAGE;
}

/* Sorts, merges adjacent ranges, and fills pairs and counters. */
static int finish_plan(const struct plan__ctx *c, struct plan_migration *p, struct xfers *x) {
    /* Group by sender, keeping the generation order (receiver position, then layer) inside. */
    struct plan_mig_transfer *sorted = plan__bucket_sort(x->v, x->n, c->nw, true);
    if (!sorted)
        return -ENOMEM;
    st_free(x->v);
    x->v = sorted;
    size_t m = 0;
    for (size_t i = 0; i < x->n; i++) {
        struct plan_mig_transfer *t = &x->v[i];
        if (m > 0) {
            struct plan_mig_transfer *q = &x->v[m - 1];
            if (q->src == t->src && q->dst == t->dst && q->layer == t->layer &&
                q->kind == t->kind && q->offset + q->count == t->offset) {
                q->count += t->count;
                continue;
            }
        }
        x->v[m++] = *t;
    }
    p->transfers = x->v;
    p->ntransfers = m;
    x->v = NULL;
    size_t npairs = 0;
    for (size_t i = 0; i < m; i++)
        if (i == 0 || p->transfers[i].src != p->transfers[i - 1].src ||
            p->transfers[i].dst != p->transfers[i - 1].dst)
            npairs++;
    p->pairs = st_calloc(npairs ? npairs : 1, sizeof(struct plan_mig_pair));
    uint32_t *nsend = st_calloc(c->nw ? c->nw : 1, sizeof(uint32_t));
    if (!p->pairs || !nsend) {
        st_free(nsend);
        return -ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < m; i++) {
        const struct plan_mig_transfer *t = &p->transfers[i];
        uint64_t bytes = t->count * PLAN_MIG_ELEM_BYTES;
        if (i == 0 || t->src != p->transfers[i - 1].src || t->dst != p->transfers[i - 1].dst) {
            p->pairs[k].src = t->src;
            p->pairs[k].dst = t->dst;
            k++;
        }
        p->pairs[k - 1].bytes += bytes;
        p->bytes_kind[t->kind] += bytes;
        p->bytes_moved += bytes;
        p->sent_bytes[t->src] += bytes;
        p->recv_bytes[t->dst] += bytes;
        nsend[t->src]++;
    }
    p->npairs = npairs;
    for (uint32_t w = 0; w < c->nw; w++)
        p->max_sender_transfers = ST_MAX(p->max_sender_transfers, nsend[w]);
    st_free(nsend);
    p->cls = classify(c, p);
    return 0;
}

static int lost_message(const struct plan__ctx *c, char *err, size_t errlen) {
    uint8_t *lost = st_calloc(c->nlayers, 1);
    if (!lost)
        return -ENOMEM;
    int n = find_lost(c, lost);
    if (err && errlen) {
        int len = snprintf(err, errlen, "no live copy of %d layer%s:", n, n == 1 ? "" : "s");
        int shown = 0;
        for (uint32_t l = 0; l < c->nlayers && len >= 0 && (size_t)len < errlen; l++) {
            if (!lost[l])
                continue;
            if (shown == 8) {
                snprintf(err + len, errlen - (size_t)len, " ...");
                break;
            }
            len += snprintf(err + len, errlen - (size_t)len, " %u(%s%s%s)", l,
                            lost[l] & 1 ? "param" : "",
                            (lost[l] & 1) && (lost[l] & 6) ? "," : "",
                            lost[l] & 6 ? "adam" : "");
            shown++;
        }
    }
    st_free(lost);
    return -ENODATA;
}

int plan_migration_new(const struct plan_mig_request *req, struct plan_migration **ret_plan,
                       char *err, size_t errlen) {
    if (!ret_plan)
        return plan__errf(err, errlen, -EINVAL, "no result pointer");
    struct plan__ctx c;
    int r = plan__ctx_init(&c, req, err, errlen);
    if (r < 0)
        return r;
    struct plan_migration *p = NULL;
    struct xfers x = {0};
    struct pick pk = {0};

    if (find_lost(&c, NULL) > 0) {
        r = lost_message(&c, err, errlen);
        goto out;
    }
    r = -ENOMEM;
    p = st_calloc(1, sizeof(*p));
    if (!p)
        goto out;
    p->magic = PLAN_MIG_MAGIC;
    p->nworkers = c.nw;
    p->npositions = c.nP;
    size_t nw1 = c.nw ? c.nw : 1;
    p->position_worker = st_malloc(c.nP * sizeof(uint32_t));
    p->worker_stage = st_malloc(nw1 * sizeof(int32_t));
    p->worker_replica = st_malloc(nw1 * sizeof(int32_t));
    p->sent_bytes = st_calloc(nw1, sizeof(uint64_t));
    p->recv_bytes = st_calloc(nw1, sizeof(uint64_t));
    pk.score = st_calloc(c.ol->pp, sizeof(uint64_t));
    pk.chosen = st_malloc(c.ol->pp * sizeof(int32_t));
    pk.touched = st_malloc(c.ol->pp * sizeof(uint32_t));
    pk.load = st_calloc(nw1, sizeof(uint64_t));
    if (!p->position_worker || !p->worker_stage || !p->worker_replica || !p->sent_bytes ||
        !p->recv_bytes || !pk.score || !pk.chosen || !pk.touched || !pk.load)
        goto out;
    for (uint32_t g = 0; g < c.ol->pp; g++)
        pk.chosen[g] = -1;

    r = choose_assignment(&c, p->position_worker, err, errlen);
    if (r < 0)
        goto out;
    for (uint32_t w = 0; w < c.nw; w++)
        p->worker_stage[w] = p->worker_replica[w] = -1;
    for (uint32_t q = 0; q < c.nP; q++) {
        p->worker_stage[p->position_worker[q]] = (int32_t)(q / c.nl->dp);
        p->worker_replica[p->position_worker[q]] = (int32_t)(q % c.nl->dp);
    }
    pk.new_stage = p->worker_stage;

    uint64_t kept = 0, needed = 0;
    for (uint32_t q = 0; q < c.nP; q++) {
        uint32_t lost_layer = 0, lost_kind = 0;
        r = plan_position(&c, &pk, q, p->position_worker[q], &x, &kept, &needed, &lost_layer,
                          &lost_kind);
        if (r == -ENODATA) { /* find_lost said otherwise: keep the message honest anyway */
            r = plan__errf(err, errlen, -ENODATA, "no live copy of layer %u %s", lost_layer,
                           st_state_kind_name((enum st_state_kind)lost_kind));
            goto out;
        }
        if (r < 0)
            goto out;
    }
    p->bytes_kept = kept * PLAN_MIG_ELEM_BYTES;
    p->bytes_needed = needed * PLAN_MIG_ELEM_BYTES;
    r = finish_plan(&c, p, &x);
    if (r < 0)
        goto out;
    if (req->validate) {
        r = plan_migration_validate(req, p, err, errlen);
        if (r < 0)
            goto out;
    }
    *ret_plan = p;
    p = NULL;
    r = 0;
out:
    plan_migration_free(p);
    st_free(x.v);
    st_free(pk.score);
    st_free(pk.chosen);
    st_free(pk.touched);
    st_free(pk.load);
    plan__ctx_done(&c);
    return r;
}
