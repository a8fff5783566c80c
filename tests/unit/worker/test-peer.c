/* test-peer.c: in-memory peer copies (worker/peer.c) on two data-parallel ranks over TCP on
 * loopback, one thread per rank.
 *
 *  exchange:  after step 2 each rank holds its own state and its peer's, byte-exact (the held
 *             part of rank 0 is rank 1's own part and the other way round); the same for the
 *             copy of step 4, taken as the runner takes it: snapshot, then the exchange on the
 *             epoch's side channel in a thread while steps 4 and 5 train;
 *  rollback:  after two more steps, rolling both ranks back to the copy of step 2 and
 *             replaying steps 2 and 3 gives the same bits as the first time (data order is a
 *             function of the step);
 *  ranges:    worker__peer_held_buf serves what the held part covers and -ERANGE otherwise;
 *             worker__peer_find ignores copies of another layout; the memory need is two
 *             generations of both parts;
 *  dead:      an exchange whose peer is gone fails and leaves the older generations intact;
 *  fill:      a peer restore's engine of another layout (1x1 from a dp-2 copy) takes exactly
 *             what the copy holds: every parameter, the copy's moment shard and nothing else of
 *             the moments, the AdamW step; worker__peer_get finds a generation by (epoch,
 *             step) whatever the layout; worker__peer_own_buf serves the own part's ranges;
 *             a model of another size is refused. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels.h"
#include "migrate.h"
#include "test.h"
#include "worker-peer.h"
#include "worker.h"

static const struct kern_config model = {.layers = 3, .channels = 16, .heads = 2, .vocab = 32,
                                         .seq_len = 8};

static struct worker_train_config make_cfg(void) {
    struct worker_train_config c;
    memset(&c, 0, sizeof(c));
    c.model = model;
    c.global_batch = 8;
    c.micro_batch = 1;
    c.total_steps = 10;
    c.lr = 3e-3;
    c.beta1 = 0.9;
    c.beta2 = 0.95;
    c.eps = 1e-8;
    c.weight_decay = 0.1;
    c.grad_clip = 1.0;
    c.warmup_steps = 2;
    c.schedule = KERN_LR_COSINE;
    c.min_lr_ratio = 0.1;
    c.seed = 1234;
    return c;
}

static char tmpdir[256];
static struct st_tokens *tokens;

static int setup_data(void) {
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/st-peer-XXXXXX");
    if (!mkdtemp(tmpdir))
        return -errno;
    char path[300];
    snprintf(path, sizeof(path), "%s/tokens.bin", tmpdir);
    uint16_t tok[4096];
    uint64_t x = 7;
    for (size_t i = 0; i < ST_ARRAY_SIZE(tok); i++) {
        x = st_mix64(x);
        tok[i] = (uint16_t)(x % 32);
    }
    int r = st_tokens_write(path, ST_TOKENS_NANOGPT, tok, ST_ARRAY_SIZE(tok));
    if (r < 0)
        return r;
    return st_tokens_open(path, model.vocab, &tokens, NULL);
}

/* Every float of a rank's engine: params, then its moment shards, layer by layer. */
static size_t engine_dump(struct worker_engine *e, float *out) {
    size_t k = 0;
    for (int l = 0; l < kern_num_layers(&model); l++) {
        struct worker_layer_bufs b;
        if (worker_engine_layer(e, WORKER_VIEW_CURRENT, l, &b) < 0)
            continue;
        if (out)
            memcpy(out + k, b.param, b.n * sizeof(float));
        k += b.n;
        size_t sh = b.shard_hi - b.shard_lo;
        if (out && sh) {
            memcpy(out + k, b.adam_m, sh * sizeof(float));
            memcpy(out + k + sh, b.adam_v, sh * sizeof(float));
        }
        k += 2 * sh;
    }
    return k;
}

struct rank_arg {
    struct mig_endpoint *ep[2];
    const char *addrs[2];
    pthread_barrier_t *bar;
    int rank;
    int rc;
    struct worker_peer_store store;
    float *after4, *replay4; /* engine dumps after step 4, first run and replay */
    size_t n;
    int dead_rc;             /* the exchange after the peer left */
};

struct swap_job {
    struct worker_peer_gen g;
    struct mig_comm *side;
    int rc;
};

static void *swap_main(void *p) {
    struct swap_job *j = p;
    j->rc = worker__peer_swap(&j->g, j->side);
    return NULL;
}

static void *rank_main(void *p) {
    struct rank_arg *a = p;
    struct worker_train_config cfg = make_cfg();
    struct worker_layout lay;
    int nl = kern_num_layers(&model), split[2] = {0, nl}, r;
    struct mig_comm *comm = NULL, *side = NULL;
    struct worker_engine *e = NULL;
    struct swap_job bg;
    pthread_t th;
    memset(&bg, 0, sizeof(bg));
    kern_set_threads(1);
    worker_layout_init(&lay, 2, 1, split, nl);
    if ((r = mig_comm_new("tcp", a->ep[a->rank], 1, a->rank, 2, a->addrs, 30.0, &comm)) < 0)
        goto out;
    if ((r = worker_engine_new(&cfg, &lay, 0, a->rank, comm, tokens, &e)) < 0)
        goto out;
    for (uint64_t s = 0; s < 2 && r >= 0; s++)
        r = worker_engine_step(e, s, NULL);
    if (r < 0 || (r = worker__peer_exchange(&a->store, &cfg, e, comm, 1, 2)) < 0)
        goto out;
    for (uint64_t s = 2; s < 4 && r >= 0; s++)
        r = worker_engine_step(e, s, NULL);
    if (r < 0)
        goto out;
    a->n = engine_dump(e, NULL);
    a->after4 = st_malloc(a->n * sizeof(float));
    a->replay4 = st_malloc(a->n * sizeof(float));
    if (!a->after4 || !a->replay4) {
        r = -ENOMEM;
        goto out;
    }
    engine_dump(e, a->after4);
    /* The copy of step 4 as the runner takes it: snapshot here, exchange on the epoch's side
     * channel in a thread while steps 4 and 5 train on the main comm. */
    if ((r = mig_comm_new("tcp", a->ep[a->rank], 1 | MIG_EPOCH_SIDE, a->rank, 2, a->addrs,
                          30.0, &side)) < 0 ||
        (r = worker__peer_take(&cfg, e, 1, 4, &bg.g)) < 0)
        goto out;
    bg.side = side;
    if ((r = -pthread_create(&th, NULL, swap_main, &bg)) < 0)
        goto out;
    for (uint64_t s = 4; s < 6 && r >= 0; s++)
        r = worker_engine_step(e, s, NULL);
    pthread_join(th, NULL);
    if (r < 0 || (r = bg.rc) < 0)
        goto out;
    worker__peer_keep(&a->store, &bg.g);
    /* Roll back to step 2 and replay. */
    const struct worker_peer_gen *g = worker__peer_find(&a->store, e, 2);
    if (!g) {
        r = -ENOENT;
        goto out;
    }
    if ((r = worker__peer_rollback(g, e)) < 0)
        goto out;
    if (worker_engine_opt_step(e) != 2) {
        r = -EPROTO;
        goto out;
    }
    for (uint64_t s = 2; s < 4 && r >= 0; s++)
        r = worker_engine_step(e, s, NULL);
    if (r < 0)
        goto out;
    engine_dump(e, a->replay4);
    /* Rank 1 leaves; rank 0's next exchange must fail, not hang, and keep what it has. */
    pthread_barrier_wait(a->bar);
    if (a->rank == 1) {
        comm = mig_comm_free(comm);
    } else {
        a->dead_rc = worker__peer_exchange(&a->store, &cfg, e, comm, 1, 6);
    }
out:
    a->rc = r;
    if (r < 0)
        pthread_barrier_wait(a->bar); /* keep the other thread from waiting forever */
    worker_engine_free(e);
    worker__peer_gen_free(&bg.g);
    mig_comm_free(side);
    mig_comm_free(comm);
    return NULL;
}

static struct rank_arg ra[2];

static int test_exchange_rollback(void) {
    ASSERT_OK(setup_data());
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    pthread_t th[2];
    memset(ra, 0, sizeof(ra));
    for (int i = 0; i < 2; i++)
        ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &ra[0].ep[i]));
    for (int i = 0; i < 2; i++) {
        ra[1].ep[i] = ra[0].ep[i];
        ra[0].addrs[i] = ra[1].addrs[i] = mig_endpoint_addr(ra[0].ep[i]);
    }
    for (int i = 0; i < 2; i++) {
        ra[i].rank = i;
        ra[i].bar = &bar;
        ASSERT_EQ(pthread_create(&th[i], NULL, rank_main, &ra[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    for (int i = 0; i < 2; i++)
        mig_endpoint_free(ra[0].ep[i]);
    ASSERT_OK(ra[0].rc);
    ASSERT_OK(ra[1].rc);
    /* Replay after the rollback: the same bits. */
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(ra[i].n, ra[0].n);
        ASSERT_EQ(memcmp(ra[i].after4, ra[i].replay4, ra[i].n * sizeof(float)), 0);
    }
    /* Each holds the other's own part of the same step, byte-exact: its moment shards (the
     * other is a replica of our stage), and the parameters, which our own part has, bit for
     * bit. */
    for (int s = 2; s <= 4; s += 2)
        for (int i = 0; i < 2; i++) {
            const struct worker_peer_gen *mine = worker__peer_find(&ra[i].store, NULL, (uint64_t)s);
            const struct worker_peer_gen *other =
                worker__peer_find(&ra[1 - i].store, NULL, (uint64_t)s);
            ASSERT_TRUE(mine != NULL && other != NULL);
            ASSERT_EQ(mine->held.pos, 1 - i);
            ASSERT_TRUE(!mine->held.has_params && mine->held.pfloats == 0);
            ASSERT_TRUE(other->own.has_params && other->own.pfloats > 0);
            ASSERT_EQ(mine->held.nfloats, other->own.nfloats - other->own.pfloats);
            ASSERT_EQ(memcmp(mine->held.data, other->own.data + other->own.pfloats,
                             mine->held.nfloats * sizeof(float)), 0);
            ASSERT_EQ(mine->own.pfloats, other->own.pfloats);
            ASSERT_EQ(memcmp(mine->own.data, other->own.data,
                             mine->own.pfloats * sizeof(float)), 0);
        }
    /* The failed exchange: an error, and the two generations (steps 2 and 4) still there. */
    ASSERT_TRUE(ra[0].dead_rc < 0);
    ASSERT_TRUE(worker__peer_find(&ra[0].store, NULL, 2) != NULL);
    ASSERT_TRUE(worker__peer_find(&ra[0].store, NULL, 4) != NULL);
    ASSERT_TRUE(worker__peer_find(&ra[0].store, NULL, 6) == NULL);
    return 0;
}

static int test_ranges(void) {
    const struct worker_peer_gen *g = worker__peer_find(&ra[0].store, NULL, 4);
    ASSERT_TRUE(g != NULL);
    const struct worker_peer_layer *L = &g->held.l[1];
    float *p = NULL;
    struct mig_xfer x = {.src = 0, .dst = 1, .layer = (uint32_t)L->layer, .kind = ST_STATE_PARAM,
                         .offset = 3, .count = 5};
    ASSERT_OK(worker__peer_held_buf(g, &x, &p));
    ASSERT_TRUE(p == g->own.data + g->own.l[1].off + 3); /* a replica's: from our own part */
    ASSERT_EQ(g->own.l[1].layer, L->layer);
    x.offset = L->n - 1;
    x.count = 2; /* past the layer */
    ASSERT_ERR(worker__peer_held_buf(g, &x, &p), -ERANGE);
    x.kind = ST_STATE_ADAM_V;
    x.offset = L->lo;
    x.count = L->hi - L->lo;
    ASSERT_OK(worker__peer_held_buf(g, &x, &p));
    ASSERT_TRUE(p == g->held.data + L->moff + (L->hi - L->lo));
    x.kind = ST_STATE_ADAM_M;
    x.offset = 0; /* rank 1's shard starts at the middle: rank 0's half is not held */
    x.count = 1;
    ASSERT_TRUE(L->lo > 0);
    ASSERT_ERR(worker__peer_held_buf(g, &x, &p), -ERANGE);
    x.layer = 99;
    ASSERT_ERR(worker__peer_held_buf(g, &x, &p), -ERANGE);
    /* Another layout does not take these copies. */
    struct worker_train_config cfg = make_cfg();
    struct worker_layout one;
    int nl = kern_num_layers(&model), split[2] = {0, nl};
    ASSERT_OK(worker_layout_init(&one, 1, 1, split, nl));
    struct worker_engine *e = NULL;
    ASSERT_OK(worker_engine_new(&cfg, &one, 0, 0, NULL, tokens, &e));
    ASSERT_TRUE(worker__peer_find(&ra[0].store, e, 4) == NULL);
    ASSERT_ERR(worker__peer_rollback(g, e), -EINVAL); /* own part of a dp-2 shard */
    worker_engine_free(e);
    /* The budget: two generations of our part and our predecessor's. */
    ASSERT_EQ(worker__peer_need(&cfg, &g->layout, 0),
              2 * (g->own.nfloats + g->held.nfloats) * sizeof(float));
    ASSERT_EQ(worker__peer_need_max(&cfg, &g->layout), worker__peer_need(&cfg, &g->layout, 0));
    return 0;
}

static int test_fill(void) {
    const struct worker_peer_gen *g = worker__peer_get(&ra[0].store, 1, 4);
    ASSERT_TRUE(g != NULL);
    ASSERT_EQ(g->step, 4);
    ASSERT_TRUE(worker__peer_get(&ra[0].store, 2, 4) == NULL); /* another epoch's step 4 */
    ASSERT_TRUE(worker__peer_get(&ra[0].store, 1, 3) == NULL);
    ASSERT_TRUE(worker__peer_holds(&ra[0].store, 1));
    ASSERT_TRUE(!worker__peer_holds(&ra[0].store, 2));
    ASSERT_ERR(worker__peer_fill(NULL, NULL), -EINVAL);
    /* Rank 0's copy (replica 0 of a dp-2 stage: the first half of every moment) into a 1x1
     * engine, as a peer restore that takes the whole model onto one worker does. */
    struct worker_train_config cfg = make_cfg();
    struct worker_layout one;
    int nl = kern_num_layers(&model), split[2] = {0, nl};
    ASSERT_OK(worker_layout_init(&one, 1, 1, split, nl));
    struct worker_engine *e = NULL;
    ASSERT_OK(worker_engine_new(&cfg, &one, 0, 0, NULL, tokens, &e));
    /* Mark the moments so what the fill leaves alone shows. */
    for (int l = 0; l < nl; l++) {
        struct worker_layer_bufs b;
        ASSERT_OK(worker_engine_layer(e, WORKER_VIEW_CURRENT, l, &b));
        for (size_t i = 0; i < b.n; i++)
            b.adam_m[i] = b.adam_v[i] = -7.0f;
    }
    ASSERT_OK(worker__peer_fill(g, e));
    ASSERT_EQ(worker_engine_opt_step(e), g->opt_step);
    ASSERT_EQ(g->opt_step, 4);
    ASSERT_EQ(g->own.nl, nl);
    size_t wrong = 0;
    for (int k = 0; k < g->own.nl; k++) {
        const struct worker_peer_layer *x = &g->own.l[k];
        const float *d = g->own.data + x->off;
        size_t sh = (size_t)(x->hi - x->lo);
        struct worker_layer_bufs b;
        ASSERT_OK(worker_engine_layer(e, WORKER_VIEW_CURRENT, (int)x->layer, &b));
        ASSERT_EQ(b.n, x->n);
        ASSERT_EQ(x->lo, 0);
        ASSERT_TRUE(x->hi > 0 && x->hi < x->n);
        wrong += memcmp(b.param, d, b.n * sizeof(float)) != 0;
        wrong += memcmp(b.adam_m, g->own.data + x->moff, sh * sizeof(float)) != 0;
        wrong += memcmp(b.adam_v, g->own.data + x->moff + sh, sh * sizeof(float)) != 0;
        for (size_t i = sh; i < b.n; i++)
            wrong += b.adam_m[i] != -7.0f || b.adam_v[i] != -7.0f;
        /* The own part's ranges, as worker__peer_held_buf serves the held one's. */
        float *p = NULL;
        struct mig_xfer t = {.src = 0, .dst = 1, .layer = (uint32_t)x->layer,
                             .kind = ST_STATE_ADAM_V, .offset = 1, .count = sh - 1};
        ASSERT_OK(worker__peer_own_buf(g, &t, &p));
        ASSERT_TRUE(p == g->own.data + x->moff + sh + 1);
        t.count = sh; /* one past the shard */
        ASSERT_ERR(worker__peer_own_buf(g, &t, &p), -ERANGE);
        t.kind = ST_STATE_PARAM;
        t.offset = 0;
        t.count = x->n;
        ASSERT_OK(worker__peer_own_buf(g, &t, &p));
        ASSERT_TRUE(p == g->own.data + x->off);
    }
    ASSERT_EQ(wrong, 0);
    worker_engine_free(e);
    /* A model of another width: its layers are of another size. */
    struct worker_train_config wide = make_cfg();
    wide.model.channels = 32;
    ASSERT_OK(worker_engine_new(&wide, &one, 0, 0, NULL, tokens, &e));
    ASSERT_ERR(worker__peer_fill(g, e), -EINVAL);
    worker_engine_free(e);
    return 0;
}

static int test_cleanup(void) {
    for (int i = 0; i < 2; i++) {
        worker__peer_store_done(&ra[i].store);
        st_free(ra[i].after4);
        st_free(ra[i].replay4);
    }
    tokens = st_tokens_free(tokens);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    ASSERT_EQ(system(cmd), 0);
    return 0;
}

TEST_MAIN(TEST(test_exchange_rollback), TEST(test_ranges), TEST(test_fill), TEST(test_cleanup))
