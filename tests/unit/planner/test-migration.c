/* test-migration.c: migration transfer plans (planner/migration.c).
 *
 * Hand cases for each kind of migration, the lost-state fallback, validation of corrupted
 * plans, and property tests over thousands of seeded random (assignment, survivors, target)
 * cases. The property tests do not trust plan_migration_validate alone: they execute every
 * plan on per-worker element maps filled from a (layer, kind, element) pattern and check that
 * each new worker ends up with exactly what the state model says it must hold, written once. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "planner-internal.h" /* plan__hungarian */
#include "planner.h"
#include "test.h"

/* ---- helpers --------------------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static uint32_t rnd(uint32_t n) { /* 0..n-1 */
    return n ? (uint32_t)(rng() % n) : 0;
}

static void worker_set(struct plan_mig_worker *w, const char *id, int stage, int replica,
                       bool alive, bool leaving) {
    memset(w, 0, sizeof(*w));
    snprintf(w->id, sizeof(w->id), "%s", id);
    w->stage = stage;
    w->replica = replica;
    w->alive = alive;
    w->leaving = leaving;
}

static struct plan_mig_request make_req(uint32_t nl, const uint64_t *np,
                                        const struct plan_mig_layout *ol,
                                        const struct plan_mig_layout *nlay,
                                        const struct plan_mig_worker *w, uint32_t nw) {
    struct plan_mig_request r;
    memset(&r, 0, sizeof(r));
    r.nlayers = nl;
    r.layer_params = np;
    r.old_layout = ol;
    r.new_layout = nlay;
    r.workers = w;
    r.nworkers = nw;
    r.validate = true;
    return r;
}

/* The pattern every copy of element e of (layer, kind) carries. Never 0xffffffff. */
static uint32_t pattern(uint32_t layer, uint32_t kind, uint64_t e) {
    uint64_t h = (layer + 1) * 0x9E3779B97F4A7C15ull ^ (kind + 7) * 0xC2B2AE3D27D4EB4Full ^
                 (e + 3) * 0x165667B19E3779F9ull;
    h ^= h >> 29;
    return (uint32_t)h & 0x7fffffffu;
}

#define INVALID 0xffffffffu

/* Independent model of holdings (re-derived here, not taken from the planner). */
static bool model_holds(const struct plan_mig_layout *l, const uint64_t *np, uint32_t s,
                        uint32_t r, uint32_t layer, uint32_t kind, uint64_t *a, uint64_t *b) {
    bool in = layer >= l->stage_lo[s] && layer < l->stage_lo[s + 1];
    if (!in && kind == ST_STATE_PARAM) {
        for (uint32_t i = 0; i < l->ntied; i++) {
            int32_t st = l->tied[i].stage == PLAN_MIG_STAGE_LAST    ? (int32_t)l->pp - 1
                         : l->tied[i].stage == PLAN_MIG_STAGE_FIRST ? 0
                                                                    : l->tied[i].stage;
            if (l->tied[i].layer == layer && st == (int32_t)s)
                in = true;
        }
        if (in) {
            *a = 0;
            *b = np[layer];
            return true;
        }
        return false;
    }
    if (!in)
        return false;
    if (kind == ST_STATE_PARAM) {
        *a = 0;
        *b = np[layer];
    } else {
        *a = (uint64_t)r * np[layer] / l->dp;
        *b = (uint64_t)(r + 1) * np[layer] / l->dp;
    }
    return true;
}

/* Executes plan p for request q on element maps and checks the outcome. Returns 0 or 1. */
static int simulate(const struct plan_mig_request *q, const struct plan_migration *p) {
    uint32_t nl = q->nlayers, nw = q->nworkers;
    uint64_t nmax = 1;
    for (uint32_t l = 0; l < nl; l++)
        nmax = ST_MAX(nmax, q->layer_params[l]);
    size_t cells = (size_t)nw * nl * 3 * nmax;
    uint32_t *oldm = malloc(cells * sizeof(uint32_t));
    uint32_t *newm = malloc(cells * sizeof(uint32_t));
    uint8_t *writes = calloc(cells, 1);
    int fail = 0;
    if (!oldm || !newm || !writes) {
        fail = 1;
        goto out;
    }
#define CELL(w, l, k, e) ((((size_t)(w) * nl + (l)) * 3 + (k)) * nmax + (e))
    for (size_t i = 0; i < cells; i++)
        oldm[i] = newm[i] = INVALID;
    for (uint32_t w = 0; w < nw; w++) {
        const struct plan_mig_worker *wk = &q->workers[w];
        if (!wk->alive || wk->stage < 0)
            continue;
        for (uint32_t l = 0; l < nl; l++)
            for (uint32_t k = 0; k < 3; k++) {
                uint64_t a, b;
                if (model_holds(q->old_layout, q->layer_params, (uint32_t)wk->stage,
                                (uint32_t)wk->replica, l, k, &a, &b))
                    for (uint64_t e = a; e < b; e++)
                        oldm[CELL(w, l, k, e)] = pattern(l, k, e);
            }
    }
    /* In place: a positioned worker keeps what it held that its new position needs. */
    for (uint32_t w = 0; w < nw; w++) {
        if (p->worker_stage[w] < 0)
            continue;
        for (uint32_t l = 0; l < nl; l++)
            for (uint32_t k = 0; k < 3; k++) {
                uint64_t a, b;
                if (!model_holds(q->new_layout, q->layer_params, (uint32_t)p->worker_stage[w],
                                 (uint32_t)p->worker_replica[w], l, k, &a, &b))
                    continue;
                for (uint64_t e = a; e < b; e++)
                    if (oldm[CELL(w, l, k, e)] != INVALID) {
                        newm[CELL(w, l, k, e)] = oldm[CELL(w, l, k, e)];
                        writes[CELL(w, l, k, e)]++;
                    }
            }
    }
    for (size_t i = 0; i < p->ntransfers; i++) {
        const struct plan_mig_transfer *t = &p->transfers[i];
        if (!q->workers[t->src].alive) {
            fprintf(stderr, "  transfer %zu from dead worker %u\n", i, t->src);
            fail = 1;
            goto out;
        }
        for (uint64_t e = t->offset; e < t->offset + t->count; e++) {
            uint32_t v = oldm[CELL(t->src, t->layer, t->kind, e)];
            if (v == INVALID) {
                fprintf(stderr, "  transfer %zu: src %u lacks layer %u kind %u elem %llu\n", i,
                        t->src, t->layer, t->kind, (unsigned long long)e);
                fail = 1;
                goto out;
            }
            newm[CELL(t->dst, t->layer, t->kind, e)] = v;
            writes[CELL(t->dst, t->layer, t->kind, e)]++;
        }
    }
    /* Every positioned worker holds exactly its needs, each element written once. */
    for (uint32_t w = 0; w < nw; w++) {
        for (uint32_t l = 0; l < nl; l++)
            for (uint32_t k = 0; k < 3; k++) {
                uint64_t a = 0, b = 0;
                bool need = p->worker_stage[w] >= 0 &&
                            model_holds(q->new_layout, q->layer_params,
                                        (uint32_t)p->worker_stage[w],
                                        (uint32_t)p->worker_replica[w], l, k, &a, &b);
                for (uint64_t e = 0; e < q->layer_params[l]; e++) {
                    bool want = need && e >= a && e < b;
                    uint8_t wr = writes[CELL(w, l, k, e)];
                    if (want ? (wr != 1 || newm[CELL(w, l, k, e)] != pattern(l, k, e))
                             : wr != 0) {
                        fprintf(stderr, "  worker %u layer %u kind %u elem %llu: want %d, "
                                "written %u times\n", w, l, k, (unsigned long long)e, want, wr);
                        fail = 1;
                        goto out;
                    }
                }
            }
    }
#undef CELL
out:
    free(oldm);
    free(newm);
    free(writes);
    return fail;
}

/* Bytes kept in place by an assignment (independent of the planner). */
static uint64_t kept_of(const struct plan_mig_request *q, const int32_t *pos_of_worker) {
    uint64_t kept = 0;
    for (uint32_t w = 0; w < q->nworkers; w++) {
        const struct plan_mig_worker *wk = &q->workers[w];
        if (pos_of_worker[w] < 0 || wk->stage < 0 || !wk->alive)
            continue;
        uint32_t sn = (uint32_t)pos_of_worker[w] / q->new_layout->dp;
        uint32_t rn = (uint32_t)pos_of_worker[w] % q->new_layout->dp;
        for (uint32_t l = 0; l < q->nlayers; l++)
            for (uint32_t k = 0; k < 3; k++) {
                uint64_t a, b, c, d;
                if (model_holds(q->new_layout, q->layer_params, sn, rn, l, k, &a, &b) &&
                    model_holds(q->old_layout, q->layer_params, (uint32_t)wk->stage,
                                (uint32_t)wk->replica, l, k, &c, &d)) {
                    uint64_t lo = ST_MAX(a, c), hi = ST_MIN(b, d);
                    if (hi > lo)
                        kept += hi - lo;
                }
            }
    }
    return kept * 4;
}

/* Best kept bytes over all assignments, by exhaustive search (small cases only). */
static void brute_best(const struct plan_mig_request *q, uint32_t pos, int32_t *pos_of,
                       bool *used, uint64_t *best) {
    uint32_t nP = q->new_layout->dp * q->new_layout->pp;
    if (pos == nP) {
        uint64_t k = kept_of(q, pos_of);
        if (k > *best)
            *best = k;
        return;
    }
    for (uint32_t w = 0; w < q->nworkers; w++) {
        if (used[w] || !q->workers[w].alive || q->workers[w].leaving)
            continue;
        used[w] = true;
        pos_of[w] = (int32_t)pos;
        brute_best(q, pos + 1, pos_of, used, best);
        used[w] = false;
        pos_of[w] = -1;
    }
}

static const struct plan_mig_transfer *find_xfer(const struct plan_migration *p, uint32_t dst,
                                                 uint32_t layer, uint32_t kind, uint64_t off) {
    for (size_t i = 0; i < p->ntransfers; i++)
        if (p->transfers[i].dst == dst && p->transfers[i].layer == layer &&
            p->transfers[i].kind == kind && p->transfers[i].offset == off)
            return &p->transfers[i];
    return NULL;
}

/* ---- stage split ------------------------------------------------------------------------ */

static int test_stage_split(void) {
    uint64_t np[6] = {10, 10, 10, 10, 10, 10};
    uint32_t lo[7];
    ASSERT_OK(plan_stage_split(6, np, 3, lo));
    ASSERT_EQ(lo[0], 0);
    ASSERT_EQ(lo[1], 2);
    ASSERT_EQ(lo[2], 4);
    ASSERT_EQ(lo[3], 6);
    ASSERT_OK(plan_stage_split(6, np, 6, lo));
    for (int s = 0; s <= 6; s++)
        ASSERT_EQ(lo[s], s);
    uint64_t gpt[5] = {100, 30, 30, 30, 1}; /* heavy embedding first */
    ASSERT_OK(plan_stage_split(5, gpt, 2, lo));
    ASSERT_EQ(lo[1], 1); /* bottleneck 100: embedding alone, blocks together */
    ASSERT_EQ(lo[2], 5);
    ASSERT_ERR(plan_stage_split(5, gpt, 0, lo), -EINVAL);
    ASSERT_ERR(plan_stage_split(5, gpt, 6, lo), -EINVAL);
    ASSERT_ERR(plan_stage_split(5, NULL, 2, lo), -EINVAL);
    return 0;
}

/* Random splits: non-empty stages and the optimal bottleneck (exhaustive for small cases). */
static uint64_t best_bottleneck(const uint64_t *np, uint32_t from, uint32_t nl, uint32_t k) {
    if (k == 1) {
        uint64_t s = 0;
        for (uint32_t l = from; l < nl; l++)
            s += np[l];
        return s;
    }
    uint64_t best = UINT64_MAX, s = 0;
    for (uint32_t e = from + 1; e + k - 1 <= nl; e++) {
        s += np[e - 1];
        uint64_t rest = best_bottleneck(np, e, nl, k - 1);
        best = ST_MIN(best, ST_MAX(s, rest));
    }
    return best;
}

static int test_stage_split_random(void) {
    rng_state = 0x5eed1234u;
    for (int it = 0; it < 400; it++) {
        uint32_t nl = 1 + rnd(9), pp = 1 + rnd(nl);
        uint64_t np[10];
        for (uint32_t l = 0; l < nl; l++)
            np[l] = rnd(4) == 0 ? 0 : rnd(100);
        uint32_t lo[11];
        ASSERT_OK(plan_stage_split(nl, np, pp, lo));
        ASSERT_EQ(lo[0], 0);
        ASSERT_EQ(lo[pp], nl);
        uint64_t mx = 0;
        for (uint32_t s = 0; s < pp; s++) {
            ASSERT_LT(lo[s], lo[s + 1]);
            uint64_t sum = 0;
            for (uint32_t l = lo[s]; l < lo[s + 1]; l++)
                sum += np[l];
            mx = ST_MAX(mx, sum);
        }
        ASSERT_EQ(mx, best_bottleneck(np, 0, nl, pp));
    }
    return 0;
}

/* ---- hand cases -------------------------------------------------------------------------- */

/* 8 equal layers of 100 elements. */
static const uint64_t EQ8[8] = {100, 100, 100, 100, 100, 100, 100, 100};

static int test_none(void) {
    struct plan_mig_layout ol;
    ASSERT_OK(plan_mig_layout_init(8, EQ8, 2, 2, NULL, &ol));
    struct plan_mig_worker w[5];
    worker_set(&w[0], "a", 0, 0, true, false);
    worker_set(&w[1], "b", 0, 1, true, false);
    worker_set(&w[2], "c", 1, 0, true, false);
    worker_set(&w[3], "d", 1, 1, true, false);
    worker_set(&w[4], "spare", -1, 0, true, false);
    struct plan_mig_request q = make_req(8, EQ8, &ol, &ol, w, 5);
    struct plan_migration *p = NULL;
    char err[256] = "";
    ASSERT_OK(plan_migration_new(&q, &p, err, sizeof(err)));
    ASSERT_EQ(p->cls, PLAN_RECONF_NONE);
    ASSERT_EQ(p->ntransfers, 0);
    ASSERT_EQ(p->bytes_moved, 0);
    ASSERT_EQ(p->bytes_kept, p->bytes_needed);
    ASSERT_EQ(p->bytes_needed, 4 * (4 * 4 * 100 + 4 * 4 * 2 * 50));
    ASSERT_EQ(p->worker_stage[4], -1);
    for (uint32_t i = 0; i < 4; i++)
        ASSERT_EQ(p->position_worker[w[i].stage * 2 + w[i].replica], i);
    ASSERT_STREQ(plan_reconf_name(p->cls), "none");
    plan_migration_free(p);
    return 0;
}

/* 2 x 2, worker d (stage 1, replica 1) is noticed; target 1 x 2: the survivors of each stage
 * take over and only optimizer shards move within a stage. */
static int test_intra_stage(void) {
    struct plan_mig_layout ol, nl;
    ASSERT_OK(plan_mig_layout_init(8, EQ8, 2, 2, NULL, &ol));
    ASSERT_OK(plan_mig_layout_init(8, EQ8, 1, 2, NULL, &nl));
    struct plan_mig_worker w[4];
    worker_set(&w[0], "a", 0, 0, true, false);
    worker_set(&w[1], "b", 0, 1, true, false);
    worker_set(&w[2], "c", 1, 0, true, false);
    worker_set(&w[3], "d", 1, 1, true, true);
    struct plan_mig_request q = make_req(8, EQ8, &ol, &nl, w, 4);
    struct plan_migration *p = NULL;
    char err[256] = "";
    ASSERT_OK(plan_migration_new(&q, &p, err, sizeof(err)));
    ASSERT_EQ(p->cls, PLAN_RECONF_INTRA_STAGE);
    ASSERT_EQ(p->bytes_kind[ST_STATE_PARAM], 0);
    /* Each stage: 4 layers x the other half (50) x 2 moments. */
    ASSERT_EQ(p->bytes_kind[ST_STATE_ADAM_M], 4 * 2 * 4 * 50);
    ASSERT_EQ(p->bytes_kind[ST_STATE_ADAM_V], 4 * 2 * 4 * 50);
    ASSERT_EQ(p->worker_stage[3], -1); /* leaving */
    /* Stage 1's missing shard can only come from the leaving worker d. */
    uint32_t s1 = p->position_worker[1];
    ASSERT_EQ(w[s1].stage, 1);
    for (uint32_t l = 4; l < 8; l++) {
        const struct plan_mig_transfer *t = find_xfer(p, s1, l, ST_STATE_ADAM_M, 50);
        ASSERT_TRUE(t != NULL);
        ASSERT_EQ(t->src, 3);
        ASSERT_EQ(t->count, 50);
    }
    ASSERT_EQ(simulate(&q, p), 0);
    plan_migration_free(p);
    return 0;
}

/* 2 x 2, worker d noticed, a new worker e replaces it: weights from the surviving replica of
 * the same stage, moments from d. The tied embedding (last stage holds layer 0's PARAM) comes
 * from the peer too. */
static int test_inter_stage(void) {
    struct plan_mig_layout ol;
    ASSERT_OK(plan_mig_layout_init(8, EQ8, 2, 2, NULL, &ol));
    ASSERT_OK(plan_mig_layout_add_tied(&ol, PLAN_MIG_STAGE_LAST, 0));
    struct plan_mig_worker w[5];
    worker_set(&w[0], "a", 0, 0, true, false);
    worker_set(&w[1], "b", 0, 1, true, false);
    worker_set(&w[2], "c", 1, 0, true, false);
    worker_set(&w[3], "d", 1, 1, true, true);
    worker_set(&w[4], "e", -1, -1, true, false);
    struct plan_mig_request q = make_req(8, EQ8, &ol, &ol, w, 5);
    struct plan_migration *p = NULL;
    char err[256] = "";
    ASSERT_OK(plan_migration_new(&q, &p, err, sizeof(err)));
    ASSERT_EQ(p->cls, PLAN_RECONF_INTER_STAGE);
    ASSERT_EQ(p->worker_stage[4], 1);
    ASSERT_EQ(p->worker_replica[4], 1);
    for (uint32_t i = 0; i < 3; i++) /* survivors stay in place */
        ASSERT_EQ(p->position_worker[w[i].stage * 2 + w[i].replica], i);
    /* Layers 4..7 and tied layer 0: PARAM from c (peer), ADAM from d. */
    ASSERT_EQ(p->bytes_kind[ST_STATE_PARAM], 4 * 5 * 100);
    ASSERT_EQ(p->bytes_kind[ST_STATE_ADAM_M], 4 * 4 * 50);
    for (size_t i = 0; i < p->ntransfers; i++) {
        const struct plan_mig_transfer *t = &p->transfers[i];
        ASSERT_EQ(t->dst, 4);
        ASSERT_EQ(t->src, t->kind == ST_STATE_PARAM ? 2u : 3u);
    }
    ASSERT_TRUE(find_xfer(p, 4, 0, ST_STATE_PARAM, 0) != NULL);
    ASSERT_EQ(p->npairs, 2);
    ASSERT_EQ(simulate(&q, p), 0);
    plan_migration_free(p);
    return 0;
}

/* pp 2 -> 4 on the same four workers (2 x 2 -> 1 x 4), and back (1 x 4 -> 2 x 2). */
static int test_pipeline(void) {
    struct plan_mig_layout a, b;
    ASSERT_OK(plan_mig_layout_init(8, EQ8, 2, 2, NULL, &a));
    ASSERT_OK(plan_mig_layout_init(8, EQ8, 1, 4, NULL, &b));
    ASSERT_EQ(b.stage_lo[1], 2);
    struct plan_mig_worker w[4];
    worker_set(&w[0], "a", 0, 0, true, false);
    worker_set(&w[1], "b", 0, 1, true, false);
    worker_set(&w[2], "c", 1, 0, true, false);
    worker_set(&w[3], "d", 1, 1, true, false);
    struct plan_mig_request q = make_req(8, EQ8, &a, &b, w, 4);
    struct plan_migration *p = NULL;
    char err[256] = "";
    ASSERT_OK(plan_migration_new(&q, &p, err, sizeof(err)));
    ASSERT_EQ(p->cls, PLAN_RECONF_PIPELINE);
    ASSERT_EQ(p->bytes_kind[ST_STATE_PARAM], 0);   /* every worker already has its layers */
    ASSERT_EQ(p->bytes_kept, 4 * 4 * 400);
    ASSERT_EQ(p->bytes_moved, 4 * 800);
    ASSERT_EQ(simulate(&q, p), 0);
    plan_migration_free(p);

    /* 4 -> 2. */
    struct plan_mig_worker w2[4];
    for (int i = 0; i < 4; i++)
        worker_set(&w2[i], "x", i, 0, true, false);
    q = make_req(8, EQ8, &b, &a, w2, 4);
    ASSERT_OK(plan_migration_new(&q, &p, err, sizeof(err)));
    ASSERT_EQ(p->cls, PLAN_RECONF_PIPELINE);
    ASSERT_EQ(p->bytes_kept, 4 * 4 * 400);
    ASSERT_EQ(p->bytes_kind[ST_STATE_PARAM], 4 * 4 * 200);
    ASSERT_EQ(p->bytes_kind[ST_STATE_ADAM_M] + p->bytes_kind[ST_STATE_ADAM_V], 4 * 800);
    for (uint32_t i = 0; i < 4; i++) /* old stage s lands in new stage s / 2 */
        ASSERT_EQ(p->worker_stage[i], (int)i / 2);
    ASSERT_EQ(simulate(&q, p), 0);
    plan_migration_free(p);
    return 0;
}

/* dp 2 -> 3 with a new worker: the middle new shard [2,4) of a 6-element layer is covered by
 * two old shards, [0,3) and [3,6), so it comes from two sources. */
static int test_reshard(void) {
    uint64_t np[2] = {6, 6};
    struct plan_mig_layout a, b;
    ASSERT_OK(plan_mig_layout_init(2, np, 2, 1, NULL, &a));
    ASSERT_OK(plan_mig_layout_init(2, np, 3, 1, NULL, &b));
    struct plan_mig_worker w[3];
    worker_set(&w[0], "a", 0, 0, true, false);
    worker_set(&w[1], "b", 0, 1, true, false);
    worker_set(&w[2], "new", -1, -1, true, false);
    struct plan_mig_request q = make_req(2, np, &a, &b, w, 3);
    struct plan_migration *p = NULL;
    char err[256] = "";
    ASSERT_OK(plan_migration_new(&q, &p, err, sizeof(err)));
    ASSERT_EQ(p->cls, PLAN_RECONF_INTER_STAGE);
    ASSERT_EQ(p->position_worker[0], 0);
    ASSERT_EQ(p->position_worker[1], 2);
    ASSERT_EQ(p->position_worker[2], 1);
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t k = ST_STATE_ADAM_M; k <= ST_STATE_ADAM_V; k++) {
            const struct plan_mig_transfer *t1 = find_xfer(p, 2, l, k, 2);
            const struct plan_mig_transfer *t2 = find_xfer(p, 2, l, k, 3);
            ASSERT_TRUE(t1 && t2);
            ASSERT_EQ(t1->src, 0);
            ASSERT_EQ(t1->count, 1);
            ASSERT_EQ(t2->src, 1);
            ASSERT_EQ(t2->count, 1);
        }
    /* a keeps [0,2) and sends [2,3) to new; b keeps [4,6) and sends [3,4); also b's [3,4)
     * is no longer b's: b at replica 2 needs [4,6) only. */
    ASSERT_EQ(p->bytes_kind[ST_STATE_ADAM_M], 4 * 2 * 2);
    ASSERT_EQ(p->bytes_kind[ST_STATE_PARAM], 4 * 12);
    ASSERT_EQ(simulate(&q, p), 0);
    plan_migration_free(p);

    /* The same survivors without the new worker: dp 2 -> 1, intra-stage. */
    struct plan_mig_layout c;
    ASSERT_OK(plan_mig_layout_init(2, np, 1, 1, NULL, &c));
    q = make_req(2, np, &a, &c, w, 2);
    ASSERT_OK(plan_migration_new(&q, &p, err, sizeof(err)));
    ASSERT_EQ(p->cls, PLAN_RECONF_INTRA_STAGE);
    ASSERT_EQ(p->bytes_moved, 4 * 2 * 2 * 3);
    ASSERT_EQ(simulate(&q, p), 0);
    plan_migration_free(p);
    return 0;
}

/* dp 4 -> 8 with four new workers: the parameters the new workers need are spread over the
 * four holders (least-loaded sender), one whole-stage sender per new worker. */
static int test_balance(void) {
    uint64_t np[4] = {100, 100, 100, 100};
    struct plan_mig_layout a, b;
    ASSERT_OK(plan_mig_layout_init(4, np, 4, 1, NULL, &a));
    ASSERT_OK(plan_mig_layout_init(4, np, 8, 1, NULL, &b));
    struct plan_mig_worker w[8];
    for (int i = 0; i < 8; i++)
        worker_set(&w[i], i < 4 ? "old" : "new", i < 4 ? 0 : -1, i < 4 ? i : -1, true, false);
    struct plan_mig_request q = make_req(4, np, &a, &b, w, 8);
    struct plan_migration *p = NULL;
    char err[256] = "";
    ASSERT_OK(plan_migration_new(&q, &p, err, sizeof(err)));
    ASSERT_EQ(p->cls, PLAN_RECONF_INTER_STAGE);
    uint64_t param_sent[8] = {0};
    int senders_of[8] = {0};
    for (size_t i = 0; i < p->ntransfers; i++)
        if (p->transfers[i].kind == ST_STATE_PARAM) {
            param_sent[p->transfers[i].src] += p->transfers[i].count;
            if (p->transfers[i].layer == 0)
                senders_of[p->transfers[i].dst]++;
        }
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(param_sent[i], 400); /* each holder ships one full copy */
    for (int i = 4; i < 8; i++)
        ASSERT_EQ(senders_of[i], 1);
    ASSERT_LE(p->npairs, 4 + 4); /* at most a PARAM and an ADAM sender per new worker */
    ASSERT_EQ(simulate(&q, p), 0);
    plan_migration_free(p);
    return 0;
}

/* GPT-like model with a tied embedding. */
static int test_tied(void) {
    uint64_t np[6];
    ASSERT_EQ(plan_mig_gpt_layer_params(4, 8, 50, 16, np), 6);
    ASSERT_EQ(np[0], 50 * 8 + 16 * 8);
    ASSERT_EQ(np[1], 12 * 64 + 13 * 8);
    ASSERT_EQ(np[5], 16);
    ASSERT_ERR(plan_mig_gpt_layer_params(0, 8, 50, 16, np), -EINVAL);
    struct plan_mig_layout a, b;
    ASSERT_OK(plan_mig_layout_init(6, np, 1, 2, NULL, &a));
    ASSERT_OK(plan_mig_layout_add_tied(&a, PLAN_MIG_STAGE_LAST, 0));
    ASSERT_OK(plan_mig_layout_init(6, np, 1, 3, NULL, &b));
    ASSERT_OK(plan_mig_layout_add_tied(&b, PLAN_MIG_STAGE_LAST, 0));
    uint64_t off, cnt;
    ASSERT_EQ(plan_mig_holding(&a, np, 6, 1, 0, 0, ST_STATE_PARAM, &off, &cnt), 1);
    ASSERT_EQ(cnt, np[0]);
    ASSERT_EQ(plan_mig_holding(&a, np, 6, 1, 0, 0, ST_STATE_ADAM_M, &off, &cnt), 0);
    ASSERT_ERR(plan_mig_holding(&a, np, 6, 2, 0, 0, ST_STATE_PARAM, &off, &cnt), -EINVAL);

    /* 1 x 2 -> 1 x 3 with a new worker: the new last stage needs layer 0's PARAM, which both
     * old stages hold (stage 0 in range, stage 1 tied). */
    struct plan_mig_worker w[3];
    worker_set(&w[0], "s0", 0, 0, true, false);
    worker_set(&w[1], "s1", 1, 0, true, false);
    worker_set(&w[2], "new", -1, -1, true, false);
    struct plan_mig_request q = make_req(6, np, &a, &b, w, 3);
    struct plan_migration *p = NULL;
    char err[256] = "";
    ASSERT_OK(plan_migration_new(&q, &p, err, sizeof(err)));
    ASSERT_EQ(p->cls, PLAN_RECONF_PIPELINE);
    ASSERT_EQ(simulate(&q, p), 0);
    uint32_t last = p->position_worker[2];
    if (last != 1) /* whoever is last either kept layer 0 or received it */
        ASSERT_TRUE(find_xfer(p, last, 0, ST_STATE_PARAM, 0) != NULL);
    for (size_t i = 0; i < p->ntransfers; i++) /* never optimizer state of a tied extra */
        ASSERT_FALSE(p->transfers[i].layer == 0 && p->transfers[i].kind != ST_STATE_PARAM &&
                     p->worker_stage[p->transfers[i].dst] != 0);
    plan_migration_free(p);

    /* Stage 0 lost without notice: layer 0's PARAM survives through the tied copy on stage 1,
     * but its moments (and everything of layers 1..) are gone. */
    w[0].alive = false;
    uint8_t lost[6];
    ASSERT_EQ(plan_migration_lost(&q, lost), (int)a.stage_lo[1]);
    ASSERT_EQ(lost[0], (1 << ST_STATE_ADAM_M) | (1 << ST_STATE_ADAM_V));
    if (a.stage_lo[1] > 1)
        ASSERT_EQ(lost[1], 7);
    ASSERT_EQ(lost[5], 0);
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -ENODATA);
    ASSERT_CONTAINS(err, "0(adam)");
    return 0;
}

/* Both replicas of stage 1 die without notice: -ENODATA naming the layers. */
static int test_lost_stage(void) {
    struct plan_mig_layout ol, nl;
    ASSERT_OK(plan_mig_layout_init(8, EQ8, 2, 2, NULL, &ol));
    ASSERT_OK(plan_mig_layout_init(8, EQ8, 1, 2, NULL, &nl));
    struct plan_mig_worker w[4];
    worker_set(&w[0], "a", 0, 0, true, false);
    worker_set(&w[1], "b", 0, 1, true, false);
    worker_set(&w[2], "c", 1, 0, false, false);
    worker_set(&w[3], "d", 1, 1, false, false);
    struct plan_mig_request q = make_req(8, EQ8, &ol, &nl, w, 4);
    struct plan_migration *p = NULL;
    char err[256] = "";
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -ENODATA);
    ASSERT_TRUE(p == NULL);
    ASSERT_CONTAINS(err, "no live copy of 4 layers: 4(param,adam) 5(param,adam)");
    uint8_t lost[8];
    ASSERT_EQ(plan_migration_lost(&q, lost), 4);
    for (int l = 0; l < 8; l++)
        ASSERT_EQ(lost[l], l < 4 ? 0 : 7);
    /* One replica lost without notice also loses its ZeRO-1 moments shard. */
    w[2].alive = true;
    ASSERT_EQ(plan_migration_lost(&q, lost), 4);
    ASSERT_EQ(lost[4], 6);
    /* With a notice (alive, leaving) nothing is lost. */
    w[3].alive = true;
    w[3].leaving = true;
    ASSERT_EQ(plan_migration_lost(&q, NULL), 0);
    return 0;
}

static int test_bad_requests(void) {
    struct plan_mig_layout ol, nl;
    ASSERT_OK(plan_mig_layout_init(8, EQ8, 2, 2, NULL, &ol));
    ASSERT_OK(plan_mig_layout_init(8, EQ8, 2, 2, NULL, &nl));
    struct plan_mig_worker w[4];
    worker_set(&w[0], "a", 0, 0, true, false);
    worker_set(&w[1], "b", 0, 1, true, false);
    worker_set(&w[2], "c", 1, 0, true, false);
    worker_set(&w[3], "d", 1, 1, true, false);
    struct plan_mig_request q = make_req(8, EQ8, &ol, &nl, w, 4);
    struct plan_migration *p = NULL;
    char err[256] = "";
    /* Layout errors. */
    uint32_t bad_lo[3] = {0, 0, 8};
    struct plan_mig_layout tmp;
    ASSERT_ERR(plan_mig_layout_init(8, EQ8, 2, 2, bad_lo, &tmp), -EINVAL);
    ASSERT_ERR(plan_mig_layout_init(8, EQ8, 0, 2, NULL, &tmp), -EINVAL);
    ASSERT_ERR(plan_mig_layout_init(8, EQ8, 1, 9, NULL, &tmp), -EINVAL);
    ASSERT_ERR(plan_mig_layout_add_tied(&tmp, -3, 0), -EINVAL);
    tmp = ol;
    for (int i = 0; i < PLAN_MIG_MAX_TIED; i++)
        ASSERT_OK(plan_mig_layout_add_tied(&tmp, 0, 7));
    ASSERT_ERR(plan_mig_layout_add_tied(&tmp, 0, 7), -E2BIG);
    tmp = ol;
    tmp.tied[0].stage = 5;
    tmp.ntied = 1;
    ASSERT_ERR(plan_mig_layout_check(&tmp, 8, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "bad stage");
    tmp.tied[0].stage = 0;
    tmp.tied[0].layer = 9;
    ASSERT_ERR(plan_mig_layout_check(&tmp, 8, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "out of range");
    ASSERT_EQ(plan_mig_layout_stage_of(&ol, 5), 1);
    ASSERT_EQ(plan_mig_layout_stage_of(&ol, 8), -1);
    q.new_layout = &tmp;
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "new layout");
    q.new_layout = &nl;
    /* Worker errors. */
    w[1].stage = 0;
    w[1].replica = 0;
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "both hold old position");
    w[1].replica = 2;
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "outside the old");
    w[1].replica = 1;
    w[1].alive = false;
    w[1].leaving = true;
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "leaving but not alive");
    w[1].alive = true;
    /* Not enough staying workers. */
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -ENOSPC);
    ASSERT_CONTAINS(err, "needs 4 workers but only 3");
    w[1].leaving = false;
    /* Fixed assignments. */
    int32_t fixed[4] = {0, 1, 2, 2};
    q.fixed_position = fixed;
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "given to two workers");
    fixed[3] = 7;
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "out of range");
    fixed[3] = -1;
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "leaves position 3 empty");
    fixed[0] = 3; /* a and d swap stages: an inter-stage plan, still valid */
    fixed[3] = 0;
    ASSERT_OK(plan_migration_new(&q, &p, err, sizeof(err)));
    ASSERT_EQ(p->cls, PLAN_RECONF_INTER_STAGE);
    ASSERT_EQ(simulate(&q, p), 0);
    plan_migration_free(p);
    uint64_t huge[8];
    for (int i = 0; i < 8; i++)
        huge[i] = 1ull << 50;
    q.layer_params = huge;
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "too large");
    huge[0] = (1ull << 50) + 1;
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "layer 0");
    q.layer_params = EQ8;
    q.nlayers = 0;
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -EINVAL);
    q.nlayers = 8;
    q.old_layout = NULL;
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "layouts are required");
    q.old_layout = &ol;
    w[2].stage = -5;
    ASSERT_ERR(plan_migration_new(&q, &p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "bad stage");
    w[2].stage = 1;
    ASSERT_ERR(plan_migration_new(NULL, &p, err, sizeof(err)), -EINVAL);
    ASSERT_ERR(plan_migration_new(&q, NULL, err, sizeof(err)), -EINVAL);
    ASSERT_ERR(plan_migration_lost(NULL, NULL), -EINVAL);
    ASSERT_TRUE(plan_migration_free(NULL) == NULL);
    ASSERT_STREQ(st_state_kind_name(ST_STATE_ADAM_V), "adam_v");
    ASSERT_STREQ(st_state_kind_name(ST_STATE_NKINDS), "?");
    ASSERT_STREQ(plan_reconf_name(PLAN_RECONF_PIPELINE), "pipeline");
    return 0;
}

/* Corrupted plans are rejected with a message. */
static int test_validate_rejects(void) {
    uint64_t np[2] = {6, 6};
    struct plan_mig_layout a, b;
    ASSERT_OK(plan_mig_layout_init(2, np, 2, 1, NULL, &a));
    ASSERT_OK(plan_mig_layout_init(2, np, 3, 1, NULL, &b));
    struct plan_mig_worker w[4];
    worker_set(&w[0], "a", 0, 0, true, false);
    worker_set(&w[1], "b", 0, 1, true, false);
    worker_set(&w[2], "new", -1, -1, true, false);
    worker_set(&w[3], "dead", -1, -1, false, false);
    struct plan_mig_request q = make_req(2, np, &a, &b, w, 4);
    struct plan_migration *p = NULL;
    char err[256] = "";
    ASSERT_OK(plan_migration_new(&q, &p, err, sizeof(err)));
    ASSERT_OK(plan_migration_validate(&q, p, err, sizeof(err)));
    ASSERT_GT(p->ntransfers, 2);

    struct plan_mig_transfer save = p->transfers[0];
    p->transfers[0].src = 3; /* dead sender */
    ASSERT_ERR(plan_migration_validate(&q, p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "is dead");
    p->transfers[0] = save;
    p->transfers[0].count += 1; /* beyond what the sender holds or the receiver needs */
    ASSERT_ERR(plan_migration_validate(&q, p, err, sizeof(err)), -EINVAL);
    p->transfers[0] = save;
    p->transfers[0].dst = p->transfers[0].src; /* self */
    ASSERT_ERR(plan_migration_validate(&q, p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "bad fields");
    p->transfers[0] = save;

    size_t n = p->ntransfers;
    p->ntransfers = n - 1; /* drop the last: something missing */
    ASSERT_ERR(plan_migration_validate(&q, p, err, sizeof(err)), -EINVAL);
    p->ntransfers = n;
    /* Duplicate a transfer: overlap. */
    struct plan_mig_transfer *dup = malloc((n + 1) * sizeof(*dup));
    ASSERT_TRUE(dup != NULL);
    memcpy(dup, p->transfers, n * sizeof(*dup));
    dup[n] = dup[0];
    struct plan_mig_transfer *orig = p->transfers;
    p->transfers = dup;
    p->ntransfers = n + 1;
    ASSERT_ERR(plan_migration_validate(&q, p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "overlap");
    p->transfers = orig;
    p->ntransfers = n;
    free(dup);
    /* A transfer into what the receiver already holds. */
    struct plan_mig_transfer *extra = malloc((n + 1) * sizeof(*extra));
    ASSERT_TRUE(extra != NULL);
    memcpy(extra, p->transfers, n * sizeof(*extra));
    extra[n] = (struct plan_mig_transfer){1, 0, 0, ST_STATE_PARAM, 0, 6};
    p->transfers = extra;
    p->ntransfers = n + 1;
    ASSERT_ERR(plan_migration_validate(&q, p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "overlap");
    p->transfers = orig;
    p->ntransfers = n;
    free(extra);
    /* Assignment errors. */
    uint32_t pw = p->position_worker[1];
    p->position_worker[1] = 3;
    ASSERT_ERR(plan_migration_validate(&q, p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "dead");
    p->position_worker[1] = p->position_worker[0];
    ASSERT_ERR(plan_migration_validate(&q, p, err, sizeof(err)), -EINVAL);
    p->position_worker[1] = pw;
    p->bytes_moved++;
    ASSERT_ERR(plan_migration_validate(&q, p, err, sizeof(err)), -EINVAL);
    ASSERT_CONTAINS(err, "counters");
    p->bytes_moved--;
    p->magic = 0;
    ASSERT_ERR(plan_migration_validate(&q, p, err, sizeof(err)), -EINVAL);
    p->magic = PLAN_MIG_MAGIC;
    ASSERT_OK(plan_migration_validate(&q, p, err, sizeof(err)));
    plan_migration_free(p);
    return 0;
}

/* ---- property tests ---------------------------------------------------------------------- */

static void random_layout(uint32_t nl, const uint64_t *np, uint32_t dp, uint32_t pp,
                          bool tied, struct plan_mig_layout *l) {
    if (rnd(2)) {
        plan_mig_layout_init(nl, np, dp, pp, NULL, l);
    } else { /* random boundaries */
        uint32_t lo[PLAN_MIG_MAX_STAGES + 1];
        bool cut[64] = {false};
        uint32_t ncut = 0;
        while (ncut < pp - 1) {
            uint32_t c = 1 + rnd(nl - 1);
            if (!cut[c]) {
                cut[c] = true;
                ncut++;
            }
        }
        uint32_t s = 0;
        lo[s++] = 0;
        for (uint32_t c = 1; c < nl; c++)
            if (cut[c])
                lo[s++] = c;
        lo[s] = nl;
        plan_mig_layout_init(nl, np, dp, pp, lo, l);
    }
    if (tied)
        plan_mig_layout_add_tied(l, PLAN_MIG_STAGE_LAST, 0);
    if (rnd(8) == 0)
        plan_mig_layout_add_tied(l, (int32_t)rnd(pp), rnd(nl));
}

static int test_random_plans(void) {
    rng_state = 0xC0FFEE5EEDull;
    int ok = 0, nodata = 0, nospc = 0, brute = 0;
    int by_class[1 + PLAN_RECONF_PIPELINE + 1] = {0}; /* none, intra, inter, pipeline */
    for (int it = 0; it < 6000; it++) {
        uint32_t nl = 1 + rnd(10);
        uint64_t np[10];
        for (uint32_t l = 0; l < nl; l++)
            np[l] = rnd(6) == 0 ? rnd(3) : 1 + rnd(40);
        struct plan_mig_layout ol, nlay;
        bool tied = rnd(2);
        random_layout(nl, np, 1 + rnd(4), 1 + rnd(ST_MIN(nl, 4)), tied, &ol);
        int shape = (int)rnd(4);
        if (shape == 0) /* same shape */
            nlay = ol;
        else if (shape == 1) /* dp change only */
            random_layout(nl, np, 1 + rnd(4), ol.pp, tied, &nlay), memcpy(nlay.stage_lo,
                                                                        ol.stage_lo,
                                                                        sizeof(ol.stage_lo));
        else
            random_layout(nl, np, 1 + rnd(4), 1 + rnd(ST_MIN(nl, 4)), tied, &nlay);
        uint32_t oP = ol.dp * ol.pp;
        struct plan_mig_worker w[32];
        uint32_t nw = 0;
        uint32_t perm[16];
        for (uint32_t i = 0; i < oP; i++)
            perm[i] = i;
        for (uint32_t i = oP; i > 1; i--) {
            uint32_t j = rnd(i), t = perm[i - 1];
            perm[i - 1] = perm[j];
            perm[j] = t;
        }
        uint32_t dead_pct = rnd(3) == 0 ? 15 : 0;
        for (uint32_t i = 0; i < oP; i++) {
            if (rnd(40) == 0)
                continue; /* position nobody reports */
            bool alive = rnd(100) >= dead_pct;
            bool leaving = alive && rnd(5) == 0;
            worker_set(&w[nw++], "old", (int)(perm[i] / ol.dp), (int)(perm[i] % ol.dp), alive,
                       leaving);
        }
        uint32_t nnew = rnd(6);
        for (uint32_t i = 0; i < nnew; i++)
            worker_set(&w[nw++], "new", -1, -1, rnd(10) != 0, false);
        struct plan_mig_request q = make_req(nl, np, &ol, &nlay, w, nw);
        int32_t fixed[32];
        if (rnd(6) == 0) { /* a random fixed assignment */
            uint32_t cand[32], nc = 0;
            for (uint32_t i = 0; i < nw; i++) {
                fixed[i] = -1;
                if (w[i].alive && !w[i].leaving)
                    cand[nc++] = i;
            }
            for (uint32_t i = nc; i > 1; i--) {
                uint32_t j = rnd(i), t = cand[i - 1];
                cand[i - 1] = cand[j];
                cand[j] = t;
            }
            for (uint32_t p = 0; p < ST_MIN(nc, nlay.dp * nlay.pp); p++)
                fixed[cand[p]] = (int32_t)p;
            q.fixed_position = fixed;
        }
        /* Independent expectations. */
        uint32_t staying = 0;
        for (uint32_t i = 0; i < nw; i++)
            staying += w[i].alive && !w[i].leaving;
        bool any_lost = false;
        for (uint32_t l = 0; l < nl && !any_lost; l++)
            for (uint32_t k = 0; k < 3 && !any_lost; k++)
                for (uint64_t e = 0; e < np[l] && !any_lost; e++) {
                    bool have = false;
                    for (uint32_t i = 0; i < nw && !have; i++) {
                        uint64_t a, b;
                        have = w[i].alive && w[i].stage >= 0 &&
                               model_holds(&ol, np, (uint32_t)w[i].stage,
                                           (uint32_t)w[i].replica, l, k, &a, &b) &&
                               e >= a && e < b;
                    }
                    any_lost = !have;
                }
        struct plan_migration *p = NULL;
        char err[512] = "";
        int r = plan_migration_new(&q, &p, err, sizeof(err));
        int nlost = plan_migration_lost(&q, NULL);
        ASSERT_EQ(nlost > 0, any_lost);
        if (any_lost) {
            ASSERT_ERR(r, -ENODATA);
            nodata++;
            continue;
        }
        if (staying < nlay.dp * nlay.pp) {
            ASSERT_ERR(r, -ENOSPC);
            nospc++;
            continue;
        }
        if (r < 0)
            fprintf(stderr, "  case %d: %s\n", it, err);
        ASSERT_OK(r);
        ok++;
        ASSERT_TRUE(p->cls >= PLAN_RECONF_NONE && p->cls <= PLAN_RECONF_PIPELINE);
        by_class[1 + p->cls]++;
        ASSERT_OK(plan_migration_validate(&q, p, err, sizeof(err)));
        if (simulate(&q, p)) {
            fprintf(stderr, "  case %d failed the simulated execution\n", it);
            plan_migration_free(p);
            return 1;
        }
        int32_t pos_of[32];
        for (uint32_t i = 0; i < nw; i++)
            pos_of[i] = p->worker_stage[i] < 0
                            ? -1
                            : p->worker_stage[i] * (int32_t)nlay.dp + p->worker_replica[i];
        ASSERT_EQ(kept_of(&q, pos_of), p->bytes_kept);
        if (!q.fixed_position && nlay.dp * nlay.pp <= 5 && staying <= 7) {
            int32_t bp[32];
            bool used[32] = {false};
            for (uint32_t i = 0; i < nw; i++)
                bp[i] = -1;
            uint64_t best = 0;
            brute_best(&q, 0, bp, used, &best);
            ASSERT_EQ(p->bytes_kept, best); /* the matching is optimal */
            brute++;
        }
        plan_migration_free(p);
    }
    printf("# %d planned (none %d, intra %d, inter %d, pipeline %d), %d lost, %d short, "
           "%d checked against exhaustive search\n", ok, by_class[0], by_class[1], by_class[2],
           by_class[3], nodata, nospc, brute);
    ASSERT_GT(ok, 2000);
    ASSERT_GT(nodata, 100);
    ASSERT_GT(brute, 500);
    for (size_t c = 0; c < ST_ARRAY_SIZE(by_class); c++)
        ASSERT_GT(by_class[c], 20);
    return 0;
}

/* A large case (W = 1024, 100 layers): plans, validates and keeps what it can. */
static int test_large(void) {
    enum { NL = 100 };
    uint64_t np[NL];
    for (int l = 0; l < NL; l++)
        np[l] = 1000 + (uint64_t)l * 7;
    static struct plan_mig_layout a, b;
    ASSERT_OK(plan_mig_layout_init(NL, np, 128, 8, NULL, &a));
    ASSERT_OK(plan_mig_layout_init(NL, np, 100, 10, NULL, &b));
    static struct plan_mig_worker w[1100];
    uint32_t nw = 0;
    for (uint32_t s = 0; s < 8; s++)
        for (uint32_t r = 0; r < 128; r++)
            worker_set(&w[nw++], "w", (int)s, (int)r, true, (s * 128 + r) % 50 == 0);
    for (int i = 0; i < 40; i++)
        worker_set(&w[nw++], "n", -1, -1, true, false);
    struct plan_mig_request q = make_req(NL, np, &a, &b, w, nw);
    struct plan_migration *p = NULL;
    char err[256] = "";
    ASSERT_OK(plan_migration_new(&q, &p, err, sizeof(err)));
    ASSERT_EQ(p->cls, PLAN_RECONF_PIPELINE);
    ASSERT_GT(p->bytes_kept, 0);
    ASSERT_EQ(p->bytes_kept + p->bytes_moved, p->bytes_needed);
    plan_migration_free(p);
    /* Same layout, a few replicas replaced by new workers: the shortcut path. */
    q.new_layout = &a;
    ASSERT_OK(plan_migration_new(&q, &p, err, sizeof(err)));
    ASSERT_EQ(p->cls, PLAN_RECONF_INTER_STAGE);
    plan_migration_free(p);
    return 0;
}

/* Every allocation failure is reported as -ENOMEM and leaks nothing (run under ASan). */
static int test_alloc_failures(void) {
    uint64_t np[3] = {6, 7, 9};
    struct plan_mig_layout a, b;
    ASSERT_OK(plan_mig_layout_init(3, np, 2, 1, NULL, &a));
    ASSERT_OK(plan_mig_layout_add_tied(&a, PLAN_MIG_STAGE_LAST, 0));
    ASSERT_OK(plan_mig_layout_init(3, np, 2, 2, NULL, &b));
    ASSERT_OK(plan_mig_layout_add_tied(&b, PLAN_MIG_STAGE_LAST, 0));
    struct plan_mig_worker w[5];
    worker_set(&w[0], "a", 0, 0, true, false);
    worker_set(&w[1], "b", 0, 1, true, false);
    worker_set(&w[2], "c", -1, -1, true, false);
    worker_set(&w[3], "d", -1, -1, true, false);
    worker_set(&w[4], "e", -1, -1, true, false);
    struct plan_mig_request q = make_req(3, np, &a, &b, w, 5);
    int succeeded = 0;
    for (long n = 1; n < 500 && !succeeded; n++) {
        struct plan_migration *p = NULL;
        st_alloc_fail_after(n);
        int r = plan_migration_new(&q, &p, NULL, 0);
        st_alloc_fail_after(0);
        if (r == 0) {
            ASSERT_TRUE(n > 5);
            ASSERT_EQ(simulate(&q, p), 0);
            plan_migration_free(p);
            succeeded = 1;
        } else {
            ASSERT_ERR(r, -ENOMEM);
            ASSERT_TRUE(p == NULL);
        }
    }
    ASSERT_TRUE(succeeded);
    /* The Hungarian path (dp 2 -> 3 reshard, conflicting row maxima) too. */
    struct plan_mig_layout c;
    ASSERT_OK(plan_mig_layout_init(3, np, 3, 1, NULL, &c));
    ASSERT_OK(plan_mig_layout_add_tied(&c, PLAN_MIG_STAGE_LAST, 0));
    q.new_layout = &c;
    succeeded = 0;
    for (long n = 1; n < 500 && !succeeded; n++) {
        struct plan_migration *p = NULL;
        st_alloc_fail_after(n);
        int r = plan_migration_new(&q, &p, NULL, 0);
        st_alloc_fail_after(0);
        if (r == 0) {
            plan_migration_free(p);
            succeeded = 1;
        } else {
            ASSERT_ERR(r, -ENOMEM);
        }
    }
    ASSERT_TRUE(succeeded);
    return 0;
}

/* The least sum over injective maps of rows 0..n-1 into columns (used[] marks taken ones). */
static int64_t brute_min(const int64_t *a, uint32_t n, uint32_t m, uint32_t i, bool *used) {
    if (i == n)
        return 0;
    int64_t best = INT64_MAX;
    for (uint32_t j = 0; j < m; j++) {
        if (used[j])
            continue;
        used[j] = true;
        int64_t s = a[(size_t)i * m + j] + brute_min(a, n, m, i + 1, used);
        used[j] = false;
        best = ST_MIN(best, s);
    }
    return best;
}

/* plan__hungarian against exhaustive search on small matrices, square and wide, with the
 * many ties and the negated byte counts the planner gives it. */
static int test_hungarian(void) {
    rng_state = 0x4A4E47ull;
    for (int it = 0; it < 3000; it++) {
        uint32_t n = 1 + rnd(6), m = n + rnd(3);
        int64_t a[8 * 8];
        uint32_t col[8];
        bool used[8] = {false};
        uint32_t range = rnd(2) ? 3 : 1000000; /* few values: ties everywhere */
        for (uint32_t k = 0; k < n * m; k++)
            a[k] = -(int64_t)rnd(range) * (rnd(4) ? 1 : 4096);
        ASSERT_OK(plan__hungarian(a, n, m, col));
        int64_t sum = 0;
        for (uint32_t i = 0; i < n; i++) {
            ASSERT_LT(col[i], m);
            ASSERT_FALSE(used[col[i]]); /* distinct columns */
            used[col[i]] = true;
            sum += a[(size_t)i * m + col[i]];
        }
        bool none[8] = {false};
        ASSERT_TRUE(sum == brute_min(a, n, m, 0, none));
    }
    return 0;
}

TEST_MAIN(TEST(test_stage_split), TEST(test_stage_split_random), TEST(test_none),
          TEST(test_intra_stage), TEST(test_inter_stage), TEST(test_pipeline), TEST(test_reshard),
          TEST(test_balance), TEST(test_tied), TEST(test_lost_stage), TEST(test_bad_requests),
          TEST(test_validate_rejects), TEST(test_random_plans), TEST(test_large),
          TEST(test_alloc_failures), TEST(test_hungarian))
