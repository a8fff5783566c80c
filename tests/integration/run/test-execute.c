/* test-execute.c: migrate/execute.c (a transfer list run as one concurrent batch per rank)
 * over real processes on loopback, plus the pure parsers of the end-to-end path (the
 * rendezvous string the runner reads, the --shapes list the loop reads).
 *
 *  pairs:      4 ranks, transfers between several pairs at once, both directions between two
 *              ranks, several ranges of one layer; every destination byte-exact, the stats
 *              equal mig_xfer_bytes of the list;
 *  bad:        malformed transfers (src == dst, rank out of range, count 0, unknown kind) and
 *              a failing buffer callback are rejected before any byte moves;
 *  dead:       a peer that dies makes the others fail with an error, never hang;
 *  cut:        a connection cut mid-message (mig_execute_cut_at) fails both ends at once;
 *  rendezvous: worker_rendezvous_parse accepts the four modes and rejects malformed strings;
 *  forced:     coord_loop_parse_forced. */
#include <string.h>

#include "../../unit/migrate/rank-util.h"
#include "common.h"
#include "coord-loop.h"
#include "migrate.h"
#include "migrate-execute.h"
#include "test.h"
#include "worker-runner.h"

#define NL 3        /* layers */
#define LN 5000     /* elements per layer and kind */
#define SEED 77

/* Each rank holds NL layers x 3 kinds of LN floats: its own values. */
struct hold {
    float v[NL][3][LN];
};

static int buf_cb(void *ud, const struct mig_xfer *x, bool send, float **ret) {
    struct hold *h = ud;
    (void)send;
    if (x->layer >= NL || x->offset + x->count > LN)
        return -ERANGE;
    *ret = &h->v[x->layer][x->kind][x->offset];
    return 0;
}

static const struct mig_xfer pairs_list[] = {
    {0, 1, 0, ST_STATE_PARAM, 0, 1000},   {0, 1, 0, ST_STATE_PARAM, 2000, 500},
    {1, 0, 1, ST_STATE_ADAM_M, 0, LN},    {2, 3, 2, ST_STATE_ADAM_V, 10, 4000},
    {3, 2, 2, ST_STATE_PARAM, 0, 7},      {0, 2, 1, ST_STATE_ADAM_V, 100, 1},
    {3, 1, 0, ST_STATE_ADAM_M, 4999, 1},
};

static void fill(struct hold *h, int rank) {
    for (int l = 0; l < NL; l++)
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < LN; i++)
                h->v[l][k][i] = ru_f32(SEED, rank, ((size_t)l * 3 + k) * LN + i);
}

static int rank_pairs(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                      void *arg) {
    (void)arg;
    struct mig_comm *c = NULL;
    static struct hold h;
    fill(&h, rank);
    RCHECK_R(mig_comm_new("tcp", ep, 1, rank, n, addrs, 10.0, &c), 0);
    struct mig_exec_stats st;
    size_t nx = ST_ARRAY_SIZE(pairs_list);
    RCHECK_R(mig_execute(c, pairs_list, nx, buf_cb, &h, &st), 0);
    uint64_t s, r;
    mig_xfer_bytes(pairs_list, nx, rank, &s, &r);
    RCHECK(st.bytes_sent == s && st.bytes_recv == r);
    uint64_t cs = 0, cr = 0;
    mig_comm_stats(c, &cs, &cr);
    RCHECK(cs == s && cr == r);
    /* Every received range holds the sender's values; everything else is untouched. */
    for (int l = 0; l < NL; l++)
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < LN; i++) {
                int from = rank;
                for (size_t t = 0; t < nx; t++) {
                    const struct mig_xfer *x = &pairs_list[t];
                    if (x->dst == rank && (int)x->layer == l && (int)x->kind == k &&
                        (uint64_t)i >= x->offset && (uint64_t)i < x->offset + x->count)
                        from = x->src;
                }
                float want = ru_f32(SEED, from, ((size_t)l * 3 + k) * LN + i);
                RCHECK(memcmp(&h.v[l][k][i], &want, sizeof(float)) == 0);
            }
    mig_comm_free(c);
    return 0;
}

static int test_pairs(void) {
    int st[4];
    ASSERT_OK(ru_run(4, rank_pairs, NULL, st));
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(st[i], 0);
    return 0;
}

static int fail_cb(void *ud, const struct mig_xfer *x, bool send, float **ret) {
    (void)ud;
    (void)x;
    (void)send;
    (void)ret;
    return -ENOENT;
}

static int rank_bad(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                    void *arg) {
    (void)arg;
    struct mig_comm *c = NULL;
    static struct hold h;
    fill(&h, rank);
    RCHECK_R(mig_comm_new("tcp", ep, 2, rank, n, addrs, 10.0, &c), 0);
    struct mig_xfer bad[] = {
        {0, 0, 0, ST_STATE_PARAM, 0, 1},  /* src == dst */
        {0, 5, 0, ST_STATE_PARAM, 0, 1},  /* rank out of range */
        {0, 1, 0, ST_STATE_PARAM, 0, 0},  /* count 0 */
        {0, 1, 0, 9, 0, 1},          /* unknown kind */
        {-1, 1, 0, ST_STATE_PARAM, 0, 1}, /* negative rank */
    };
    for (size_t i = 0; i < ST_ARRAY_SIZE(bad); i++)
        RCHECK_R(mig_execute(c, &bad[i], 1, buf_cb, &h, NULL), -EINVAL);
    RCHECK_R(mig_execute(NULL, bad, 1, buf_cb, &h, NULL), -EINVAL);
    RCHECK_R(mig_execute(c, bad, 1, NULL, &h, NULL), -EINVAL);
    /* The callback's error comes back and nothing is sent (the peer posts nothing either). */
    struct mig_xfer ok = {0, 1, 0, ST_STATE_PARAM, 0, 10};
    RCHECK_R(mig_execute(c, &ok, 1, fail_cb, &h, NULL), -ENOENT);
    /* Out-of-range for the holder: the callback refuses. */
    struct mig_xfer far = {0, 1, 0, ST_STATE_PARAM, LN - 1, 2};
    RCHECK_R(mig_execute(c, &far, 1, buf_cb, &h, NULL), -ERANGE);
    /* An empty list is a no-op. */
    struct mig_exec_stats st;
    RCHECK_R(mig_execute(c, NULL, 0, NULL, NULL, &st), 0);
    RCHECK(st.bytes_sent == 0 && st.bytes_recv == 0 && st.seconds == 0);
    /* The comm is still usable afterwards. */
    RCHECK_R(mig_execute(c, &ok, 1, buf_cb, &h, NULL), 0);
    mig_comm_free(c);
    return 0;
}

static int test_bad(void) {
    int st[2];
    ASSERT_OK(ru_run(2, rank_bad, NULL, st));
    ASSERT_EQ(st[0], 0);
    ASSERT_EQ(st[1], 0);
    return 0;
}

static int rank_dead(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                     void *arg) {
    (void)arg;
    struct mig_comm *c = NULL;
    static struct hold h;
    fill(&h, rank);
    RCHECK_R(mig_comm_new("tcp", ep, 3, rank, n, addrs, 5.0, &c), 0);
    if (rank == 2)
        _exit(0); /* dies before its part of the migration */
    struct mig_xfer x[] = {{0, 1, 0, ST_STATE_PARAM, 0, LN}, {2, 0, 1, ST_STATE_PARAM, 0, LN},
                           {2, 1, 2, ST_STATE_PARAM, 0, LN}};
    int r = mig_execute(c, x, ST_ARRAY_SIZE(x), buf_cb, &h, NULL);
    RCHECK(r < 0);
    mig_comm_free(c);
    return 0;
}

static int test_dead(void) {
    int st[3];
    ASSERT_OK(ru_run(3, rank_dead, NULL, st));
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(st[i], 0);
    return 0;
}

/* The chaos suite's data-plane cut (mig_execute_cut_at) on rank 0: an execution where it only
 * receives is not counted, nor one cancelled before its first send (on another epoch's
 * comm: a moments batch cancelled by the next order), the first where it sends moves every
 * byte, the second is cut mid-message: both ends fail with -ECONNRESET at once (not the
 * timeout), and the connection stays broken for the rest of the epoch. */
static int rank_cut(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                    void *arg) {
    (void)arg;
    struct mig_comm *c = NULL, *gone = NULL;
    static struct hold h;
    fill(&h, rank);
    RCHECK_R(mig_comm_new("tcp", ep, 4, rank, n, addrs, 10.0, &c), 0);
    RCHECK_R(mig_comm_new("tcp", ep, 5, rank, n, addrs, 10.0, &gone), 0);
    if (rank == 0)
        mig_execute_cut_at(2);
    struct mig_xfer in = {1, 0, 0, ST_STATE_ADAM_M, 0, LN};
    struct mig_xfer out = {0, 1, 1, ST_STATE_PARAM, 0, LN};
    struct mig_xfer cut = {0, 1, 2, ST_STATE_ADAM_V, 0, LN};
    RCHECK_R(mig_execute(c, &in, 1, buf_cb, &h, NULL), 0);
    if (rank == 0) {
        mig_comm_cancel(gone);
        RCHECK_R(mig_execute(gone, &out, 1, buf_cb, &h, NULL), -ECANCELED);
    }
    gone = mig_comm_free(gone);
    RCHECK_R(mig_execute(c, &out, 1, buf_cb, &h, NULL), 0);
    if (rank == 1)
        for (int i = 0; i < LN; i++)
            RCHECK(h.v[1][ST_STATE_PARAM][i] ==
                   ru_f32(SEED, 0, ((size_t)1 * 3 + ST_STATE_PARAM) * LN + i));
    double t0 = st_now();
    RCHECK_R(mig_execute(c, &cut, 1, buf_cb, &h, NULL), -ECONNRESET);
    RCHECK(st_now() - t0 < 5.0);
    RCHECK_R(mig_execute(c, &in, 1, buf_cb, &h, NULL), -ECONNRESET);
    if (rank == 0)
        mig_execute_cut_at(0);
    mig_comm_free(c);
    return 0;
}

static int test_cut(void) {
    int st[2];
    ASSERT_OK(ru_run(2, rank_cut, NULL, st));
    ASSERT_EQ(st[0], 0);
    ASSERT_EQ(st[1], 0);
    return 0;
}

static int test_rendezvous(void) {
    char mode[16], dir[256];
    int split[8], n = 0;
    ASSERT_OK(worker_rendezvous_parse("tcp;mode=init;split=0,2,4", mode, sizeof(mode), split, 8,
                                      &n, dir, sizeof(dir)));
    ASSERT_STREQ(mode, "init");
    ASSERT_EQ(n, 3);
    ASSERT_EQ(split[1], 2);
    ASSERT_STREQ(dir, "");
    ASSERT_OK(worker_rendezvous_parse("tcp;mode=restore;split=0,4;dir=/a b;c/step-3", mode,
                                      sizeof(mode), split, 8, &n, dir, sizeof(dir)));
    ASSERT_STREQ(mode, "restore");
    ASSERT_STREQ(dir, "/a b;c/step-3");
    ASSERT_OK(worker_rendezvous_parse("tcp;split=0,1,2,3;mode=migrate", mode, sizeof(mode),
                                      split, 8, &n, dir, sizeof(dir)));
    ASSERT_EQ(n, 4);
    ASSERT_OK(worker_rendezvous_parse("tcp;mode=peer-restore;split=0,2,4", mode, sizeof(mode),
                                      split, 8, &n, dir, sizeof(dir)));
    ASSERT_STREQ(mode, "peer-restore");
    ASSERT_EQ(n, 3);
    const char *bad[] = {
        "tcp", "nccl;mode=init;split=0,2", "tcp;mode=init", "tcp;mode=fly;split=0,2",
        "tcp;mode=init;split=0", "tcp;mode=init;split=2,1", "tcp;mode=init;split=0,x",
        "tcp;mode=restore;split=0,2", "tcp;mode=init;split=0,2;what=1",
        "tcp;mode=init;split=0,1,2,3,4,5,6,7,8,9", "tcp;mode=;split=0,2", "tcp;mode=init;split=0,,2",
    };
    for (size_t i = 0; i < ST_ARRAY_SIZE(bad); i++) {
        int r = worker_rendezvous_parse(bad[i], mode, sizeof(mode), split, 8, &n, dir,
                                        sizeof(dir));
        if (r != -EINVAL)
            TEST_FAIL_("'%s' accepted", bad[i]);
    }
    ASSERT_ERR(worker_rendezvous_parse(NULL, mode, sizeof(mode), split, 8, &n, dir,
                                       sizeof(dir)), -EINVAL);
    return 0;
}

/* The typed Configure fields win over the legacy string; an unset mode falls back to it; bad
 * typed fields are refused exactly. */
static int test_configure_setup(void) {
    char mode[16], dir[256];
    int split[8], n = 0;
    uint32_t sp[] = {0, 2, 4};
    Spottrain__V1__Configure cf = SPOTTRAIN__V1__CONFIGURE__INIT;
    cf.rendezvous = "tcp;mode=migrate;split=0,1,2,3";
    cf.mode = SPOTTRAIN__V1__RECONFIGURE_MODE__RECONFIGURE_MODE_RESTORE;
    cf.split = sp;
    cf.n_split = 3;
    cf.restore_dir = "/ckpt/step-7";
    ASSERT_OK(worker_configure_setup(&cf, mode, sizeof(mode), split, 8, &n, dir, sizeof(dir)));
    ASSERT_STREQ(mode, "restore");
    ASSERT_EQ(n, 3);
    ASSERT_EQ(split[2], 4);
    ASSERT_STREQ(dir, "/ckpt/step-7");
    cf.mode = SPOTTRAIN__V1__RECONFIGURE_MODE__RECONFIGURE_MODE_UNSPECIFIED;
    ASSERT_OK(worker_configure_setup(&cf, mode, sizeof(mode), split, 8, &n, dir, sizeof(dir)));
    ASSERT_STREQ(mode, "migrate"); /* from the string, as a previous coordinator sends it */
    ASSERT_EQ(n, 4);
    cf.mode = SPOTTRAIN__V1__RECONFIGURE_MODE__RECONFIGURE_MODE_PEER_RESTORE;
    cf.restore_dir = "";
    ASSERT_OK(worker_configure_setup(&cf, mode, sizeof(mode), split, 8, &n, dir, sizeof(dir)));
    ASSERT_STREQ(mode, "peer-restore");
    uint32_t bad_order[] = {0, 4, 2}, bad_first[] = {1, 2, 4};
    cf.split = bad_order;
    ASSERT_ERR(worker_configure_setup(&cf, mode, sizeof(mode), split, 8, &n, dir, sizeof(dir)),
               -EINVAL);
    cf.split = bad_first;
    ASSERT_ERR(worker_configure_setup(&cf, mode, sizeof(mode), split, 8, &n, dir, sizeof(dir)),
               -EINVAL);
    cf.split = sp;
    cf.n_split = 1;
    ASSERT_ERR(worker_configure_setup(&cf, mode, sizeof(mode), split, 8, &n, dir, sizeof(dir)),
               -EINVAL);
    cf.n_split = 3;
    cf.mode = SPOTTRAIN__V1__RECONFIGURE_MODE__RECONFIGURE_MODE_RESTORE; /* without a dir */
    ASSERT_ERR(worker_configure_setup(&cf, mode, sizeof(mode), split, 8, &n, dir, sizeof(dir)),
               -EINVAL);
    cf.mode = (Spottrain__V1__ReconfigureMode)42;
    ASSERT_ERR(worker_configure_setup(&cf, mode, sizeof(mode), split, 8, &n, dir, sizeof(dir)),
               -EINVAL);
    return 0;
}

static int test_forced(void) {
    struct coord_loop_forced f[4];
    ASSERT_EQ(coord_loop_parse_forced("0:2x1,10:1x2,20:4X1", f, 4), 3);
    ASSERT_EQ(f[1].step, 10);
    ASSERT_EQ(f[1].dp, 1);
    ASSERT_EQ(f[1].pp, 2);
    ASSERT_EQ(f[2].dp, 4);
    const char *bad[] = {"", "0", "0:2", "0:2x", "0:x2", "5:2x1,5:1x1", "5:2x1,3:1x1", "0:0x1",
                         "0:1x0", "0:2x1,", "a:2x1", "0:2x1;1:1x1", "0:1x1,1:1x1,2:1x1,3:1x1,4:1x1"};
    for (size_t i = 0; i < ST_ARRAY_SIZE(bad); i++) {
        int r = coord_loop_parse_forced(bad[i], f, 4);
        if (r != -EINVAL)
            TEST_FAIL_("'%s' accepted (%d)", bad[i], r);
    }
    ASSERT_ERR(coord_loop_parse_forced(NULL, f, 4), -EINVAL);
    return 0;
}

TEST_MAIN(TEST(test_pairs), TEST(test_bad), TEST(test_dead), TEST(test_cut), TEST(test_rendezvous),
          TEST(test_configure_setup), TEST(test_forced))
