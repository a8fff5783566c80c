/* test-engine.c: the training engine in one process — each position of a (dp, pp) layout runs
 * in its own thread with its own data-plane endpoint and communicator on loopback TCP.
 *
 * Checks the engine's contracts: pipeline depth changes no bit of the result, data
 * parallelism changes it by at most float rounding, a checkpoint loads into another shape and
 * training continues bitwise, a reshape keeps what a worker holds, and bad arguments are
 * rejected. The cross-process version (the CLI, 20 steps) is tests/integration/train. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "kernels.h"
#include "migrate.h"
#include "test.h"
#include "tokens.h"
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
    if (tokens)
        return 0;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/st-engine-XXXXXX");
    if (!mkdtemp(tmpdir))
        return -errno;
    char path[300];
    snprintf(path, sizeof(path), "%s/tokens.bin", tmpdir);
    uint16_t tok[4096];
    uint64_t x = 99;
    for (size_t i = 0; i < ST_ARRAY_SIZE(tok); i++) {
        x = st_mix64(x);
        tok[i] = (uint16_t)(i % 7 == 0 ? x % 32 : (uint64_t)(tok[i ? i - 1 : 0] * 3 + 1) % 32);
    }
    int r = st_tokens_write(path, ST_TOKENS_NANOGPT, tok, ST_ARRAY_SIZE(tok));
    if (r < 0)
        return r;
    return st_tokens_open(path, model.vocab, &tokens, NULL);
}

/* The full state of a model gathered from every position (replica 0's params, every
 * replica's moment shards). */
struct state {
    float *param[8], *m[8], *v[8];
    size_t n[8];
    float *tied0;       /* last stage's head copy (pp > 1), else NULL */
    double loss[32];
    int t;
};

static void state_free(struct state *s) {
    for (int l = 0; l < 8; l++)
        free(s->param[l]), free(s->m[l]), free(s->v[l]);
    free(s->tied0);
    memset(s, 0, sizeof(*s));
}

static void state_alloc(struct state *s) {
    memset(s, 0, sizeof(*s));
    for (int l = 0; l < kern_num_layers(&model); l++) {
        s->n[l] = kern_layer_param_count(&model, l);
        s->param[l] = calloc(s->n[l], sizeof(float));
        s->m[l] = calloc(s->n[l], sizeof(float));
        s->v[l] = calloc(s->n[l], sizeof(float));
    }
}

struct job {
    int dp, pp, nsteps;
    uint64_t first_step;
    const char *load_dir;  /* load before stepping */
    const char *save_dir;  /* save after stepping */
    int stage_lo[8];
    struct worker_train_config cfg;
    struct mig_endpoint *ep[16];
    const char *addrs[16];
    struct state *out;
    pthread_mutex_t lock;
    int rc[16];
    bool detached; /* engines made before their comm (worker_engine_new_detached), attached */
};

static bool job_detached; /* run_job's jobs: detached engines */

struct thread_arg {
    struct job *job;
    int rank;
};

static void collect(struct job *j, struct worker_engine *e, int stage, int replica) {
    pthread_mutex_lock(&j->lock);
    struct state *s = j->out;
    for (int l = 0; l < kern_num_layers(&model); l++) {
        struct worker_layer_bufs b;
        if (worker_engine_layer(e, WORKER_VIEW_CURRENT, l, &b) < 0)
            continue;
        if (!b.adam_m) { /* tied copy */
            if (!s->tied0)
                s->tied0 = calloc(b.n, sizeof(float));
            if (replica == 0)
                memcpy(s->tied0, b.param, b.n * sizeof(float));
            continue;
        }
        if (replica == 0)
            memcpy(s->param[l], b.param, b.n * sizeof(float));
        memcpy(s->m[l] + b.shard_lo, b.adam_m, (b.shard_hi - b.shard_lo) * sizeof(float));
        memcpy(s->v[l] + b.shard_lo, b.adam_v, (b.shard_hi - b.shard_lo) * sizeof(float));
    }
    s->t = worker_engine_opt_step(e);
    (void)stage;
    pthread_mutex_unlock(&j->lock);
}

static void *worker_thread(void *p) {
    struct thread_arg *a = p;
    struct job *j = a->job;
    int rank = a->rank, n = j->dp * j->pp, stage = rank / j->dp, replica = rank % j->dp;
    struct mig_comm *comm = NULL;
    struct worker_engine *e = NULL;
    struct worker_layout layout;
    int r;
    kern_set_threads(1);
    if ((r = worker_layout_init(&layout, j->dp, j->pp, j->stage_lo, kern_num_layers(&model))) < 0)
        goto out;
    if (j->detached) {
        /* What a spare does ahead of its boundary: the engine and its work buffers first;
         * until the comm is attached, nothing that needs peers runs. */
        if ((r = worker_engine_new_detached(&j->cfg, &layout, stage, replica, tokens, &e)) < 0 ||
            (r = worker_engine_ready(e)) < 0)
            goto out;
        /* Zero until filled; filled here as the transfers would: the initial parameters. */
        for (int l = 0; l < kern_num_layers(&model); l++) {
            struct worker_layer_bufs b;
            if (worker_engine_layer(e, WORKER_VIEW_CURRENT, l, &b) < 0)
                continue;
            for (size_t i = 0; i < b.n; i++)
                if (b.param[i] != 0.0f) {
                    r = -EPROTO;
                    goto out;
                }
            if ((r = kern_layer_init(&j->cfg.model, l, j->cfg.seed, b.param)) < 0)
                goto out;
        }
        if (n > 1 && (worker_engine_step(e, j->first_step, NULL) != -EINVAL ||
                      worker_engine_save(e, tmpdir, 0) != -EINVAL ||
                      worker_engine_attach(e, NULL) != -EINVAL)) {
            r = -EPROTO;
            goto out;
        }
    }
    if ((r = mig_comm_new("tcp", j->ep[rank], 1, rank, n, j->addrs, 30.0, &comm)) < 0)
        goto out;
    if (j->detached) {
        if ((r = worker_engine_attach(e, comm)) < 0)
            goto out;
        if (worker_engine_attach(e, comm) != -EINVAL) { /* it has one now */
            r = -EPROTO;
            goto out;
        }
    } else if ((r = worker_engine_new(&j->cfg, &layout, stage, replica, comm, tokens, &e)) < 0) {
        goto out;
    }
    if (j->load_dir && (r = worker_engine_load(e, j->load_dir, NULL)) < 0)
        goto out;
    for (int s = 0; s < j->nsteps; s++) {
        double loss;
        if ((r = worker_engine_step(e, j->first_step + (uint64_t)s, &loss)) < 0)
            goto out;
        if (stage == j->pp - 1 && replica == 0)
            j->out->loss[s] = loss;
        else if (stage == j->pp - 1 ? isnan(loss) : !isnan(loss)) {
            r = -EPROTO;
            goto out;
        }
    }
    if (j->save_dir && (r = worker_engine_save(e, j->save_dir, j->first_step + j->nsteps)) < 0)
        goto out;
    collect(j, e, stage, replica);
out:
    worker_engine_free(e);
    mig_comm_free(comm);
    j->rc[rank] = r;
    return NULL;
}

/* Runs a (dp, pp) job with the given split (NULL: even split by layer) in threads. */
static int run_job(int dp, int pp, const int *split, int nsteps, uint64_t first_step,
                   const char *load_dir, const char *save_dir, struct state *out) {
    struct job j;
    memset(&j, 0, sizeof(j));
    j.dp = dp;
    j.pp = pp;
    j.nsteps = nsteps;
    j.first_step = first_step;
    j.load_dir = load_dir;
    j.save_dir = save_dir;
    j.cfg = make_cfg();
    j.out = out;
    j.detached = job_detached;
    pthread_mutex_init(&j.lock, NULL);
    int nl = kern_num_layers(&model), n = dp * pp, r = 0;
    for (int s = 0; s <= pp; s++)
        j.stage_lo[s] = split ? split[s] : s * nl / pp;
    for (int i = 0; i < n; i++) {
        if ((r = mig_endpoint_new("127.0.0.1", 0, &j.ep[i])) < 0)
            goto out;
        j.addrs[i] = mig_endpoint_addr(j.ep[i]);
    }
    pthread_t th[16];
    struct thread_arg args[16];
    for (int i = 0; i < n; i++) {
        args[i].job = &j;
        args[i].rank = i;
        pthread_create(&th[i], NULL, worker_thread, &args[i]);
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < n; i++)
        if (j.rc[i] < 0 && r == 0) {
            fprintf(stderr, "  rank %d failed: %s\n", i, strerror(-j.rc[i]));
            r = j.rc[i];
        }
out:
    for (int i = 0; i < n; i++)
        mig_endpoint_free(j.ep[i]);
    pthread_mutex_destroy(&j.lock);
    return r;
}

/* Largest relative difference between two states' params and moments; counts bit
 * differences into *ret_ndiff. */
static double state_diff(const struct state *a, const struct state *b, size_t *ret_ndiff) {
    double worst = 0.0;
    size_t ndiff = 0;
    for (int l = 0; l < kern_num_layers(&model); l++) {
        const float *pa[3] = {a->param[l], a->m[l], a->v[l]};
        const float *pb[3] = {b->param[l], b->m[l], b->v[l]};
        for (int k = 0; k < 3; k++) {
            for (size_t i = 0; i < a->n[l]; i++) {
                float x = pa[k][i], y = pb[k][i];
                if (memcmp(&x, &y, sizeof(float)) != 0)
                    ndiff++;
                double d = fabs((double)x - y) / fmax(fabs((double)y), 1e-6);
                if (d > worst)
                    worst = d;
            }
        }
    }
    *ret_ndiff = ndiff;
    return worst;
}

static int test_pipeline_bitwise(void) {
    ASSERT_OK(setup_data());
    struct state base, s2, s5;
    state_alloc(&base), state_alloc(&s2), state_alloc(&s5);
    ASSERT_OK(run_job(1, 1, NULL, 4, 0, NULL, NULL, &base));
    ASSERT_OK(run_job(1, 2, NULL, 4, 0, NULL, NULL, &s2));
    ASSERT_OK(run_job(1, 5, NULL, 4, 0, NULL, NULL, &s5));
    size_t nd2, nd5;
    state_diff(&s2, &base, &nd2);
    state_diff(&s5, &base, &nd5);
    int loss_same = memcmp(base.loss, s2.loss, sizeof(base.loss)) == 0 &&
                    memcmp(base.loss, s5.loss, sizeof(base.loss)) == 0;
    /* The last stage's tied copy equals layer 0. */
    int tied_ok = s2.tied0 && memcmp(s2.tied0, base.param[0], base.n[0] * sizeof(float)) == 0;
    int t = base.t;
    double l0 = base.loss[0], l3 = base.loss[3];
    /* Training moved every layer away from its initialisation and filled the moments. */
    int moved = 1;
    for (int l = 0; l < kern_num_layers(&model); l++) {
        float *init = malloc(base.n[l] * sizeof(float));
        kern_layer_init(&model, l, make_cfg().seed, init);
        if (memcmp(init, base.param[l], base.n[l] * sizeof(float)) == 0 || base.v[l][0] <= 0.0f)
            moved = 0;
        free(init);
    }
    state_free(&base), state_free(&s2), state_free(&s5);
    ASSERT_EQ(nd2, 0);
    ASSERT_EQ(nd5, 0);
    ASSERT_TRUE(loss_same);
    ASSERT_TRUE(tied_ok);
    ASSERT_TRUE(moved);
    ASSERT_EQ(t, 4);
    ASSERT_NEAR(l0, log(32.0), 0.1, 0); /* starts at the uniform loss */
    ASSERT_TRUE(l3 < l0);
    return 0;
}

static int test_data_parallel_close(void) {
    ASSERT_OK(setup_data());
    struct state base, d2, d22, d4;
    state_alloc(&base), state_alloc(&d2), state_alloc(&d22), state_alloc(&d4);
    ASSERT_OK(run_job(1, 1, NULL, 4, 0, NULL, NULL, &base));
    ASSERT_OK(run_job(2, 1, NULL, 4, 0, NULL, NULL, &d2));
    ASSERT_OK(run_job(2, 2, NULL, 4, 0, NULL, NULL, &d22));
    ASSERT_OK(run_job(4, 1, NULL, 4, 0, NULL, NULL, &d4));
    size_t n2, n22, n4;
    double w2 = state_diff(&d2, &base, &n2), w22 = state_diff(&d22, &base, &n22),
           w4 = state_diff(&d4, &base, &n4);
    printf("# dp vs (1,1) after 4 steps: (2,1) max rel %.3g, %zu floats differ; (2,2) %.3g, "
           "%zu; (4,1) %.3g, %zu\n", w2, n2, w22, n22, w4, n4);
    double dl = fabs(d2.loss[3] - base.loss[3]);
    state_free(&base), state_free(&d2), state_free(&d22), state_free(&d4);
    ASSERT_TRUE(w2 <= 1e-6 && w22 <= 1e-6 && w4 <= 1e-6);
    ASSERT_NEAR(dl, 0.0, 1e-9, 0);
    return 0;
}

static int test_checkpoint_continue(void) {
    ASSERT_OK(setup_data());
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/ckpt-a", tmpdir);
    struct state full, half, rest;
    state_alloc(&full), state_alloc(&half), state_alloc(&rest);
    ASSERT_OK(run_job(1, 1, NULL, 4, 0, NULL, NULL, &full));
    ASSERT_OK(run_job(1, 2, NULL, 2, 0, NULL, dir, &half));
    /* Continue in another shape: uneven split over 3 stages. */
    int split[4] = {0, 2, 3, 5};
    ASSERT_OK(run_job(1, 3, split, 2, 2, dir, NULL, &rest));
    size_t nd;
    state_diff(&rest, &full, &nd);
    int t = rest.t;
    struct mig_ckpt *ck = NULL;
    int ro = mig_ckpt_open(dir, &ck, NULL);
    struct mig_ckpt_meta meta;
    memset(&meta, 0, sizeof(meta));
    if (ro == 0)
        mig_ckpt_get_meta(ck, &meta);
    uint64_t step = meta.step, opt = meta.opt_step;
    int has_model = meta.model_json && strstr(meta.model_json, "\"channels\":16") != NULL;
    mig_ckpt_free(ck);
    state_free(&full), state_free(&half), state_free(&rest);
    ASSERT_OK(ro);
    ASSERT_EQ(step, 2);
    ASSERT_EQ(opt, 2);
    ASSERT_TRUE(has_model);
    ASSERT_EQ(nd, 0);
    ASSERT_EQ(t, 4);
    return 0;
}

/* dp 2 -> 1: replica 1 hands its moment shards to replica 0 (what a migration does), then
 * replica 0 trains alone. */
struct reshape_arg {
    struct mig_endpoint *ep[2];
    const char *addrs[2];
    int rc[2];
    struct state *out;
    bool prep;    /* test_reshape_pipeline_prepared: prepare the new position */
    bool later;   /* test_reshape_dp_shrink: the kept moments copied after the commit */
    size_t copied, copied_want; /* bytes worker_engine_copy_kept_moments copied, expected */
    size_t fresh; /* and what its first work buffers still allocated */
};

/* Rank's side of a pair: its comm and an engine at (stage, replica) of layout from. */
static int pair_engine(struct reshape_arg *a, int rank, const struct worker_train_config *cfg,
                       const struct worker_layout *from, int stage, int replica,
                       struct mig_comm **comm, struct worker_engine **e) {
    int r;
    kern_set_threads(1);
    if ((r = mig_comm_new("tcp", a->ep[rank], 1, rank, 2, a->addrs, 30.0, comm)) < 0)
        return r;
    return worker_engine_new(cfg, from, stage, replica, *comm, tokens, e);
}

/* The state a 1x1 engine ends with, into out (to compare with run_job's). */
static void state_take(struct worker_engine *e, struct state *out) {
    for (int l = 0; l < kern_num_layers(&model); l++) {
        struct worker_layer_bufs b;
        worker_engine_layer(e, WORKER_VIEW_CURRENT, l, &b);
        memcpy(out->param[l], b.param, b.n * sizeof(float));
        memcpy(out->m[l], b.adam_m, b.n * sizeof(float));
        memcpy(out->v[l], b.adam_v, b.n * sizeof(float));
    }
    out->t = worker_engine_opt_step(e);
}

static void *reshape_thread(void *p) {
    struct { struct reshape_arg *a; int rank; } *x = p;
    struct reshape_arg *a = x->a;
    int rank = x->rank, r;
    struct worker_train_config cfg = make_cfg();
    struct worker_layout l2, l1;
    int nl = kern_num_layers(&model), split[2] = {0, nl};
    struct mig_comm *comm = NULL;
    struct worker_engine *e = NULL;
    worker_layout_init(&l2, 2, 1, split, nl);
    worker_layout_init(&l1, 1, 1, split, nl);
    if ((r = pair_engine(a, rank, &cfg, &l2, 0, rank, &comm, &e)) < 0)
        goto out;
    /* The new position's memory is made ready while the steps run (a thread of its own); the
     * begin below takes it, and the contents still come out equal. */
    if ((r = worker_engine_reshape_prepare(e, &l1, rank == 0 ? 0 : -1, 0)) < 0)
        goto out;
    for (int s = 0; s < 2 && r >= 0; s++)
        r = worker_engine_step(e, (uint64_t)s, NULL);
    if (r < 0)
        goto out;
    if (a->later)
        worker_engine_reshape_moments_later(e);
    if ((r = worker_engine_reshape_begin(e, &l1, rank == 0 ? 0 : -1, 0, NULL)) < 0)
        goto out;
    if (worker_engine_step(e, 2, NULL) != -EINVAL) { /* no step between begin and commit */
        r = -EPROTO;
        goto out;
    }
    for (int l = 0; l < nl && r >= 0; l++) {
        struct worker_layer_bufs b;
        if (rank == 1) {
            if ((r = worker_engine_layer(e, WORKER_VIEW_OLD, l, &b)) < 0)
                break;
            size_t cnt = (b.shard_hi - b.shard_lo) * sizeof(float);
            r = mig_send(comm, 0, b.adam_m, cnt);
            if (r >= 0)
                r = mig_send(comm, 0, b.adam_v, cnt);
        } else {
            struct worker_layer_bufs ob;
            if ((r = worker_engine_layer(e, WORKER_VIEW_OLD, l, &ob)) < 0 ||
                (r = worker_engine_layer(e, WORKER_VIEW_CURRENT, l, &b)) < 0)
                break;
            size_t lo, hi;
            worker_shard(b.n, 2, 1, &lo, &hi);
            /* the kept half was copied by reshape_begin into the wider shard (later: not
             * yet); the parameters, kept as they are, are the old view's own buffer */
            if ((memcmp(b.adam_m, ob.adam_m, ob.shard_hi * sizeof(float)) != 0) != a->later ||
                b.shard_lo != 0 || b.shard_hi != b.n || b.adam_m == ob.adam_m ||
                b.param != ob.param) {
                r = -EPROTO;
                break;
            }
            r = mig_recv(comm, 1, b.adam_m + lo, (hi - lo) * sizeof(float));
            if (r >= 0)
                r = mig_recv(comm, 1, b.adam_v + lo, (hi - lo) * sizeof(float));
        }
    }
    if (a->later && rank == 0)
        worker_engine_hold_old(e, true); /* the copy below reads the old shard */
    if (r < 0 || (r = worker_engine_reshape_commit(e)) < 0)
        goto out;
    if (a->later && rank == 0) {
        size_t half, lo, hi, want = 0;
        for (int l = 0; l < nl; l++) {
            worker_shard(kern_layer_param_count(&model, l), 2, 0, &lo, &hi);
            half = hi - lo;
            want += 2 * half * sizeof(float);
        }
        a->copied = worker_engine_copy_kept_moments(e);
        a->copied_want = want;
        worker_engine_hold_old(e, false);
    }
    if (rank == 0) {
        mig_comm_free(comm);
        comm = NULL;
        for (int s = 2; s < 4 && r >= 0; s++)
            r = worker_engine_step(e, (uint64_t)s, NULL);
        if (r >= 0)
            state_take(e, a->out);
    } else if (worker_engine_step(e, 2, NULL) != -EINVAL) { /* a spare cannot step */
        r = -EPROTO;
    }
out:
    worker_engine_free(e);
    mig_comm_free(comm);
    a->rc[rank] = r;
    return NULL;
}

/* Runs fn as ranks 0 and 1 of a two-worker job on loopback, each with its own endpoint. */
static int run_pair(void *(*fn)(void *), struct reshape_arg *a) {
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &a->ep[i]));
        a->addrs[i] = mig_endpoint_addr(a->ep[i]);
    }
    pthread_t th[2];
    struct { struct reshape_arg *a; int rank; } args[2] = {{a, 0}, {a, 1}};
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, fn, &args[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        mig_endpoint_free(a->ep[i]);
    return 0;
}

static int test_reshape_dp_shrink(void) {
    ASSERT_OK(setup_data());
    for (int later = 0; later < 2; later++) {
        struct state full, got;
        state_alloc(&full), state_alloc(&got);
        ASSERT_OK(run_job(1, 1, NULL, 4, 0, NULL, NULL, &full));
        struct reshape_arg a;
        memset(&a, 0, sizeof(a));
        a.out = &got;
        a.later = later;
        ASSERT_OK(run_pair(reshape_thread, &a));
        size_t nd;
        double w = state_diff(&got, &full, &nd);
        int t = got.t;
        state_free(&full), state_free(&got);
        ASSERT_OK(a.rc[0]);
        ASSERT_OK(a.rc[1]);
        ASSERT_EQ(t, 4);
        ASSERT_TRUE(w <= 1e-6);
        ASSERT_EQ(a.copied, a.copied_want); /* 0 = 0 without */
        ASSERT_TRUE(!later || a.copied > 0);
    }
    return 0;
}

/* pp 2 -> 1: stage 1 hands its layers (parameters and moments) to stage 0, which then trains
 * alone; bitwise equal to a 1x1 run (pipeline depth changes no bit). With prep, stage 0's new
 * position is prepared before the two first steps: the gradient buffers of the layers it
 * gains and the head's are then made ahead, and its first work buffers allocate nothing
 * (worker_engine_work_fresh); without, they are made at the boundary. */

static void *pipe_thread(void *p) {
    struct { struct reshape_arg *a; int rank; } *x = p;
    struct reshape_arg *a = x->a;
    int rank = x->rank, r;
    struct worker_train_config cfg = make_cfg();
    struct worker_layout l2, l1;
    int nl = kern_num_layers(&model), split2[3] = {0, 2, nl}, split1[2] = {0, nl};
    struct mig_comm *comm = NULL;
    struct worker_engine *e = NULL;
    worker_layout_init(&l2, 1, 2, split2, nl);
    worker_layout_init(&l1, 1, 1, split1, nl);
    if ((r = pair_engine(a, rank, &cfg, &l2, rank, 0, &comm, &e)) < 0)
        goto out;
    if (a->prep && (r = worker_engine_reshape_prepare(e, &l1, rank == 0 ? 0 : -1, 0)) < 0)
        goto out;
    for (int s = 0; s < 2 && r >= 0; s++)
        r = worker_engine_step(e, (uint64_t)s, NULL);
    if (r < 0 || (r = worker_engine_reshape_begin(e, &l1, rank == 0 ? 0 : -1, 0, NULL)) < 0)
        goto out;
    for (int l = split2[1]; l < nl && r >= 0; l++) {
        struct worker_layer_bufs b;
        if ((r = worker_engine_layer(e, rank == 1 ? WORKER_VIEW_OLD : WORKER_VIEW_CURRENT, l,
                                     &b)) < 0)
            break;
        float *bufs[3] = {b.param, b.adam_m, b.adam_v};
        for (int k = 0; k < 3 && r >= 0; k++)
            r = rank == 1 ? mig_send(comm, 0, bufs[k], b.n * sizeof(float))
                          : mig_recv(comm, 1, bufs[k], b.n * sizeof(float));
    }
    if (r < 0 || (r = worker_engine_reshape_commit(e)) < 0)
        goto out;
    if (rank == 0) {
        mig_comm_free(comm);
        comm = NULL;
        if ((r = worker_engine_ready(e)) < 0)
            goto out;
        a->fresh = worker_engine_work_fresh(e);
        for (int s = 2; s < 4 && r >= 0; s++)
            r = worker_engine_step(e, (uint64_t)s, NULL);
        if (r >= 0)
            state_take(e, a->out);
    }
out:
    worker_engine_free(e);
    mig_comm_free(comm);
    a->rc[rank] = r;
    return NULL;
}

static int run_pipe_shrink(bool prep, struct state *got, size_t *ret_fresh) {
    struct reshape_arg a;
    memset(&a, 0, sizeof(a));
    a.out = got;
    a.prep = prep;
    ASSERT_OK(run_pair(pipe_thread, &a));
    ASSERT_OK(a.rc[0]);
    ASSERT_OK(a.rc[1]);
    *ret_fresh = a.fresh;
    return 0;
}

static int test_reshape_pipeline_prepared(void) {
    ASSERT_OK(setup_data());
    struct state full, cold, warm;
    state_alloc(&full), state_alloc(&cold), state_alloc(&warm);
    ASSERT_OK(run_job(1, 1, NULL, 4, 0, NULL, NULL, &full));
    size_t fresh_cold = 0, fresh_warm = 1, nd_cold, nd_warm;
    int rc_cold = run_pipe_shrink(false, &cold, &fresh_cold);
    int rc_warm = run_pipe_shrink(true, &warm, &fresh_warm);
    state_diff(&cold, &full, &nd_cold);
    state_diff(&warm, &full, &nd_warm);
    int t = warm.t;
    state_free(&full), state_free(&cold), state_free(&warm);
    ASSERT_OK(rc_cold);
    ASSERT_OK(rc_warm);
    ASSERT_EQ(nd_cold, 0);
    ASSERT_EQ(nd_warm, 0);
    ASSERT_EQ(t, 4);
    /* Without preparation the boundary made at least the gained layers' gradient buffers
     * (a float and a double per parameter) and the head's; with it, nothing. */
    size_t gained = (size_t)model.vocab * model.channels;
    for (int l = 2; l < kern_num_layers(&model); l++)
        gained += kern_layer_param_count(&model, l);
    ASSERT_TRUE(fresh_cold >= gained * (sizeof(float) + sizeof(double)));
    ASSERT_EQ(fresh_warm, 0);
    return 0;
}

static int test_bad_arguments(void) {
    ASSERT_OK(setup_data());
    struct worker_train_config cfg = make_cfg();
    struct worker_layout l;
    int nl = kern_num_layers(&model);
    int split[3] = {0, 2, nl}, bad_split[3] = {0, 0, nl}, one[2] = {0, nl};
    struct worker_engine *e = NULL;
    ASSERT_ERR(worker_layout_init(&l, 1, 2, bad_split, nl), -EINVAL);
    ASSERT_ERR(worker_layout_init(&l, 0, 1, one, nl), -EINVAL);
    ASSERT_ERR(worker_layout_init(&l, 1, 1, split, nl), -EINVAL); /* last bound != nl */
    ASSERT_OK(worker_layout_init(&l, 1, 2, split, nl));
    /* dp * pp > 1 needs a communicator */
    ASSERT_ERR(worker_engine_new(&cfg, &l, 0, 0, NULL, tokens, &e), -EINVAL);
    ASSERT_OK(worker_layout_init(&l, 1, 1, one, nl));
    ASSERT_ERR(worker_engine_new(&cfg, &l, 1, 0, NULL, tokens, &e), -EINVAL);
    ASSERT_ERR(worker_engine_new(&cfg, &l, 0, 0, NULL, NULL, &e), -EINVAL);
    struct worker_train_config c2 = cfg;
    c2.model.vocab = 16; /* the data holds tokens up to 31 */
    ASSERT_ERR(worker_engine_new(&c2, &l, 0, 0, NULL, tokens, &e), -EINVAL);
    c2 = cfg;
    c2.global_batch = 7; /* not a multiple of micro_batch 2 */
    c2.micro_batch = 2;
    ASSERT_ERR(worker_engine_new(&c2, &l, 0, 0, NULL, tokens, &e), -EINVAL);
    ASSERT_OK(worker_engine_new(&cfg, &l, 0, 0, NULL, tokens, &e));
    struct worker_layer_bufs b;
    ASSERT_ERR(worker_engine_layer(e, WORKER_VIEW_OLD, 0, &b), -ENOENT);
    ASSERT_ERR(worker_engine_layer(e, WORKER_VIEW_CURRENT, nl, &b), -ENOENT);
    ASSERT_ERR(worker_engine_reshape_commit(e), -EINVAL);
    ASSERT_ERR(worker_engine_reshape_abort(e), -EINVAL);
    ASSERT_ERR(worker_engine_set_opt_step(e, -1), -EINVAL);
    /* begin + abort keeps the old state */
    float p0 = 0;
    ASSERT_OK(worker_engine_layer(e, WORKER_VIEW_CURRENT, 1, &b));
    p0 = b.param[3];
    ASSERT_OK(worker_engine_reshape_begin(e, &l, 0, 0, NULL));
    ASSERT_ERR(worker_engine_reshape_begin(e, &l, 0, 0, NULL), -EBUSY);
    ASSERT_OK(worker_engine_reshape_abort(e));
    ASSERT_OK(worker_engine_layer(e, WORKER_VIEW_CURRENT, 1, &b));
    ASSERT_TRUE(b.param[3] == p0);
    /* A reshape to the same position shares every buffer (nothing copied, no new memory);
     * commit, abort and free each release them once (ASan checks). */
    struct worker_layer_bufs ob;
    ASSERT_OK(worker_engine_reshape_begin(e, &l, 0, 0, NULL));
    ASSERT_OK(worker_engine_layer(e, WORKER_VIEW_OLD, 1, &ob));
    ASSERT_OK(worker_engine_layer(e, WORKER_VIEW_CURRENT, 1, &b));
    ASSERT_TRUE(b.param == ob.param && b.adam_m == ob.adam_m && b.adam_v == ob.adam_v);
    ASSERT_OK(worker_engine_reshape_commit(e));
    ASSERT_OK(worker_engine_layer(e, WORKER_VIEW_CURRENT, 1, &b));
    ASSERT_TRUE(b.param == ob.param && b.param[3] == p0);
    ASSERT_OK(worker_engine_step(e, 0, NULL));
    ASSERT_OK(worker_engine_reshape_begin(e, &l, 0, 0, NULL));
    ASSERT_OK(worker_engine_reshape_abort(e));
    ASSERT_OK(worker_engine_step(e, 1, NULL));
    ASSERT_OK(worker_engine_reshape_begin(e, &l, 0, 0, NULL));
    ASSERT_ERR(worker_engine_reshape_prepare(e, &l, 0, 0), -EBUSY);
    worker_engine_free(e); /* in the middle of a reshape */
    e = NULL;
    ASSERT_OK(worker_engine_new(&cfg, &l, 0, 0, NULL, tokens, &e));
    /* A prepared reshape: taken by the begin of its position, discarded by another's, by a
     * newer preparation, or by free (while its thread may still run). */
    ASSERT_ERR(worker_engine_reshape_prepare(e, NULL, 0, 0), -EINVAL);
    ASSERT_ERR(worker_engine_reshape_prepare(e, &l, 1, 0), -EINVAL);
    ASSERT_OK(worker_engine_reshape_prepare(e, &l, 0, 0));
    ASSERT_OK(worker_engine_step(e, 2, NULL));
    ASSERT_OK(worker_engine_reshape_begin(e, &l, 0, 0, NULL));
    ASSERT_OK(worker_engine_layer(e, WORKER_VIEW_OLD, 1, &ob));
    ASSERT_OK(worker_engine_layer(e, WORKER_VIEW_CURRENT, 1, &b));
    ASSERT_TRUE(b.param == ob.param && b.adam_m == ob.adam_m);
    ASSERT_OK(worker_engine_reshape_commit(e));
    ASSERT_OK(worker_engine_ready(e));
    ASSERT_OK(worker_engine_step(e, 3, NULL));
    ASSERT_OK(worker_engine_reshape_prepare(e, &l, -1, 0));
    ASSERT_OK(worker_engine_reshape_prepare(e, &l, 0, 0)); /* replaces the spare's */
    ASSERT_OK(worker_engine_reshape_begin(e, &l, -1, 0, NULL)); /* not the prepared one */
    ASSERT_OK(worker_engine_reshape_abort(e));
    ASSERT_OK(worker_engine_step(e, 4, NULL)); /* the old view's work came back */
    ASSERT_OK(worker_engine_reshape_prepare(e, &l, 0, 0));
    worker_engine_free(e);
    e = NULL;
    ASSERT_OK(worker_engine_new(&cfg, &l, 0, 0, NULL, tokens, &e));
    /* Two reshapes with no step between: the second (unprepared) does not take the first's
     * prepared work buffers, and the first's old buffers are released by the second begin. */
    ASSERT_OK(worker_engine_step(e, 0, NULL));
    ASSERT_OK(worker_engine_reshape_prepare(e, &l, 0, 0));
    ASSERT_OK(worker_engine_reshape_begin(e, &l, 0, 0, NULL));
    ASSERT_OK(worker_engine_reshape_commit(e));
    ASSERT_OK(worker_engine_reshape_begin(e, &l, 0, 0, NULL));
    ASSERT_OK(worker_engine_reshape_commit(e));
    ASSERT_OK(worker_engine_ready(e));
    ASSERT_OK(worker_engine_step(e, 1, NULL));
    worker_engine_free(e);
    e = NULL;
    ASSERT_OK(worker_engine_new(&cfg, &l, 0, 0, NULL, tokens, &e));
    /* Loading a checkpoint of another model fails and names it. */
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/no-such-ckpt", tmpdir);
    ASSERT_TRUE(worker_engine_load(e, dir, NULL) < 0);
    /* Saving where no directory can be made fails and changes nothing. */
    ASSERT_TRUE(worker_engine_save(e, "/proc/no-such/ckpt", 0) < 0);
    ASSERT_ERR(worker_engine_save(e, NULL, 0), -EINVAL);
    ASSERT_ERR(worker_engine_step(NULL, 0, NULL), -EINVAL);
    worker_engine_free(e);
    ASSERT_TRUE(worker_engine_free(NULL) == NULL);
    return 0;
}

static int test_load_other_model(void) {
    ASSERT_OK(setup_data());
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/ckpt-b", tmpdir);
    struct state s;
    state_alloc(&s);
    ASSERT_OK(run_job(1, 1, NULL, 1, 0, NULL, dir, &s));
    state_free(&s);
    struct worker_train_config cfg = make_cfg();
    cfg.model.seq_len = 4; /* another model */
    struct worker_layout l;
    int one[2] = {0, kern_num_layers(&model)};
    ASSERT_OK(worker_layout_init(&l, 1, 1, one, kern_num_layers(&model)));
    struct worker_engine *e = NULL;
    ASSERT_OK(worker_engine_new(&cfg, &l, 0, 0, NULL, tokens, &e));
    int r = worker_engine_load(e, dir, NULL);
    worker_engine_free(e);
    ASSERT_ERR(r, -EINVAL);
    return 0;
}

static int test_cleanup(void) {
    tokens = st_tokens_free(tokens);
    if (tmpdir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
        ASSERT_EQ(system(cmd), 0);
    }
    return 0;
}

/* Engines made before their comm (a spare ahead of its boundary), then attached, train the
 * same bits as engines made with it: 1x2 and 2x1 against the same shapes made the usual way.
 * Before the attach they refuse to step or save. */
static int test_detached(void) {
    ASSERT_OK(setup_data());
    struct state p, pd, d, dd;
    state_alloc(&p), state_alloc(&pd), state_alloc(&d), state_alloc(&dd);
    int rc[4];
    rc[0] = run_job(1, 2, NULL, 3, 0, NULL, NULL, &p);
    rc[2] = run_job(2, 1, NULL, 3, 0, NULL, NULL, &d);
    job_detached = true;
    rc[1] = run_job(1, 2, NULL, 3, 0, NULL, NULL, &pd);
    rc[3] = run_job(2, 1, NULL, 3, 0, NULL, NULL, &dd);
    job_detached = false;
    size_t np, nd;
    state_diff(&pd, &p, &np);
    state_diff(&dd, &d, &nd);
    int t = pd.t;
    state_free(&p), state_free(&pd), state_free(&d), state_free(&dd);
    for (int i = 0; i < 4; i++)
        ASSERT_OK(rc[i]);
    ASSERT_EQ(np, 0);
    ASSERT_EQ(nd, 0);
    ASSERT_EQ(t, 3);
    /* A detached engine whose comm does not fit its layout is refused: a one-rank comm for a
     * two-rank layout. */
    struct worker_train_config cfg = make_cfg();
    struct worker_layout l2;
    int nl = kern_num_layers(&model), split[2] = {0, nl};
    worker_layout_init(&l2, 2, 1, split, nl);
    struct worker_engine *e = NULL;
    struct mig_endpoint *ep = NULL;
    struct mig_comm *one = NULL;
    ASSERT_OK(worker_engine_new_detached(&cfg, &l2, 0, 1, tokens, &e));
    ASSERT_ERR(worker_engine_new_detached(&cfg, &l2, 2, 0, tokens, &e), -EINVAL);
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &ep));
    const char *addr[1] = {mig_endpoint_addr(ep)};
    int r = mig_comm_new("tcp", ep, 1, 0, 1, addr, 5.0, &one);
    int ra = r < 0 ? r : worker_engine_attach(e, one);
    worker_engine_free(e);
    mig_comm_free(one);
    mig_endpoint_free(ep);
    ASSERT_OK(r);
    ASSERT_ERR(ra, -EINVAL);
    return 0;
}

/* The gates of state after the boundary (worker_engine_set_gate): a step calls the gate
 * once, before its update, and the layer gate before each forward reads a layer, in layer
 * order for every micro-batch, until the gate; either's error fails the step before anything
 * changed; a held old view makes the next reshape wait (-EBUSY) until released. One rank, so
 * the step's only use of the communicator-or-moments is the update. */
static int gate_calls;
static int gate_result;
static int count_gate(void *userdata) {
    gate_calls++;
    *(int *)userdata += 1;
    return gate_result;
}

static int layer_calls, layer_misordered, layer_result, layer_nl;
static int count_layer_gate(void *userdata, int layer) {
    (void)userdata;
    if (layer != layer_calls % layer_nl)
        layer_misordered++;
    layer_calls++;
    return layer_result;
}

static int test_gate(void) {
    ASSERT_OK(setup_data());
    struct worker_train_config cfg = make_cfg();
    struct worker_layout l1;
    int nl = kern_num_layers(&model), split[2] = {0, nl};
    worker_layout_init(&l1, 1, 1, split, nl);
    struct mig_endpoint *ep = NULL;
    struct mig_comm *c1 = NULL, *c2 = NULL;
    struct worker_engine *e = NULL;
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &ep));
    const char *addr[1] = {mig_endpoint_addr(ep)};
    ASSERT_OK(mig_comm_new("tcp", ep, 1, 0, 1, addr, 5.0, &c1));
    ASSERT_OK(mig_comm_new("tcp", ep, 2, 0, 1, addr, 5.0, &c2));
    ASSERT_OK(worker_engine_new(&cfg, &l1, 0, 0, c1, tokens, &e));
    int mine = 0, rc[9];
    double loss;
    gate_calls = 0;
    gate_result = 0;
    layer_calls = layer_misordered = layer_result = 0;
    layer_nl = nl;
    worker_engine_set_gate(e, count_gate, count_layer_gate, &mine);
    rc[0] = worker_engine_step(e, 0, &loss);
    int layer_calls_ok = layer_calls;
    rc[1] = worker_engine_step(e, 1, &loss); /* called once: the gates are gone */
    int calls_ok = gate_calls, t_ok = worker_engine_opt_step(e);
    int layer_calls_after = layer_calls;
    gate_result = -ECONNRESET;
    worker_engine_set_gate(e, count_gate, NULL, &mine);
    rc[2] = worker_engine_step(e, 2, &loss);
    int t_failed = worker_engine_opt_step(e);
    /* A layer gate's error fails the step at the first layer: neither the gate nor the
     * update ran. */
    gate_result = 0;
    layer_result = -ECONNRESET;
    worker_engine_set_gate(e, count_gate, count_layer_gate, &mine);
    rc[8] = worker_engine_step(e, 2, &loss);
    int layer_calls_failed = layer_calls - layer_calls_after, t_layer_failed =
        worker_engine_opt_step(e), gate_calls_layer_failed = gate_calls;
    worker_engine_set_gate(e, count_gate, count_layer_gate, &mine);
    worker_engine_set_gate(e, NULL, count_layer_gate, &mine); /* cleared: neither called */
    rc[3] = worker_engine_step(e, 2, &loss);
    /* Held: the old view of a committed reshape stays, and no reshape may begin. */
    rc[4] = worker_engine_reshape_begin(e, &l1, 0, 0, c2);
    rc[5] = worker_engine_reshape_commit(e);
    worker_engine_hold_old(e, true);
    rc[6] = worker_engine_reshape_begin(e, &l1, 0, 0, c2);
    worker_engine_hold_old(e, false);
    rc[7] = worker_engine_step(e, 3, &loss);
    worker_engine_free(e);
    mig_comm_free(c1);
    mig_comm_free(c2);
    mig_endpoint_free(ep);
    for (int i = 0; i < 2; i++)
        ASSERT_OK(rc[i]);
    ASSERT_EQ(calls_ok, 1);
    ASSERT_EQ(layer_calls_ok, nl * 8); /* 8 micro-batches of 1, each through nl layers */
    ASSERT_EQ(layer_calls_after, layer_calls_ok);
    ASSERT_EQ(layer_misordered, 0);
    ASSERT_EQ(t_ok, 2);
    ASSERT_ERR(rc[2], -ECONNRESET);
    ASSERT_EQ(t_failed, 2); /* the update never ran */
    ASSERT_ERR(rc[8], -ECONNRESET);
    ASSERT_EQ(layer_calls_failed, 1);
    ASSERT_EQ(t_layer_failed, 2);
    ASSERT_EQ(gate_calls_layer_failed, 2);
    ASSERT_EQ(gate_calls, 2);
    ASSERT_EQ(layer_calls, layer_calls_after + 1);
    ASSERT_EQ(mine, 2);
    ASSERT_OK(rc[3]);
    ASSERT_OK(rc[4]);
    ASSERT_OK(rc[5]);
    ASSERT_ERR(rc[6], -EBUSY);
    ASSERT_OK(rc[7]);
    return 0;
}

TEST_MAIN(TEST(test_gate), TEST(test_pipeline_bitwise), TEST(test_data_parallel_close), TEST(test_detached),
          TEST(test_reshape_pipeline_prepared),
          TEST(test_checkpoint_continue), TEST(test_reshape_dp_shrink),
          TEST(test_bad_arguments), TEST(test_load_other_model), TEST(test_cleanup))
