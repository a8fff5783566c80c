/* test-transport.c: the TCP data plane with real processes on loopback — point-to-point
 * (empty, small, 64 MiB streamed), concurrent batches, collectives over subgroups checked
 * byte-exact against a serial reference, and the failure paths: a peer that dies, a peer that
 * never comes, a stale epoch, a size mismatch, a build the coordinator abandoned; and the
 * epoch's side channel driven by a thread of its own beside the main comm, and cancelled; and
 * the next epoch's comm built ahead of its boundary beside the current epoch's side channel.
 *
 * The one idea: every rank is a forked process (rank-util.h), so failures are real closed
 * sockets, and every wait is bounded by the transport's own timeout. */
#include <dirent.h>
#include <linux/tcp.h> /* struct tcp_info with tcpi_snd_wnd (netinet/tcp.h's may lack it) */
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include "common.h"
#include "test.h"
#include "migrate-execute.h" /* mig_side_cut_at */
#include "unit/migrate/rank-util.h"

#define TMO 20.0 /* seconds: generous, only reached when something is broken */

static int run_ok(int n, ru_rank_fn *fn, void *arg) {
    int st[RU_MAX];
    ASSERT_OK(ru_run(n, fn, arg, st));
    for (int i = 0; i < n; i++)
        if (st[i] != 0)
            TEST_FAIL_("rank %d exited with %d", i, st[i]);
    return 0;
}

/* ---- point to point ---------------------------------------------------------------- */

static int p2p_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                    void *arg) {
    struct mig_comm *c;
    size_t big = 64u << 20;
    RCHECK_R(mig_comm_new("tcp", ep, 1, rank, n, addrs, TMO, &c), 0);
    RCHECK_R(mig_comm_rank(c), rank);
    RCHECK_R(mig_comm_size(c), 2);
    RCHECK(strcmp(mig_comm_transport(c), "tcp") == 0);
    unsigned char *buf = malloc(big);
    RCHECK(buf);
    if (rank == 0) {
        RCHECK_R(mig_send(c, 1, NULL, 0), 0);
        RCHECK_R(mig_send(c, 1, "hello, rank 1", 13), 0);
        for (size_t i = 0; i < big; i++)
            buf[i] = ru_byte(11, 0, i);
        RCHECK_R(mig_send(c, 1, buf, big), 0);
        RCHECK_R(mig_recv(c, 1, buf, 5), 0); /* reverse direction on the same connection */
        RCHECK(memcmp(buf, "done!", 5) == 0);
        uint64_t s = 0, r = 0;
        mig_comm_stats(c, &s, &r);
        RCHECK_R(s, 13 + big);
        RCHECK_R(r, 5);
    } else {
        char small[13];
        RCHECK_R(mig_recv(c, 0, NULL, 0), 0);
        RCHECK_R(mig_recv(c, 0, small, 13), 0);
        RCHECK(memcmp(small, "hello, rank 1", 13) == 0);
        memset(buf, 0, big);
        RCHECK_R(mig_recv(c, 0, buf, big), 0);
        size_t wrong = 0;
        for (size_t i = 0; i < big; i++)
            wrong += buf[i] != ru_byte(11, 0, i);
        RCHECK_R(wrong, 0);
        RCHECK_R(mig_send(c, 0, "done!", 5), 0);
    }
    free(buf);
    mig_comm_free(c);
    return 0;
}

static int test_p2p(void) {
    return run_ok(2, p2p_rank, NULL);
}

/* A comm built with a long wait for its peers and then given a short limit
 * (mig_comm_set_timeout): rank 0's receive, which rank 1 never answers, gives up at the short
 * limit with -ETIMEDOUT (not the 600 s it was built with), and the stream it leaves out of step
 * is shut, so rank 1's own receive ends at once with -ECONNRESET. */
static int timeout_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                        void *arg) {
    struct mig_comm *c;
    char b[4];
    RCHECK_R(mig_comm_new("tcp", ep, 1, rank, n, addrs, 600.0, &c), 0);
    if (rank == 0) {
        RCHECK_R(mig_comm_set_timeout(c, 0.3), 0);
        double t0 = st_now();
        RCHECK_R(mig_recv(c, 1, b, 4), -ETIMEDOUT);
        RCHECK(st_now() - t0 < 60.0);
    } else {
        RCHECK_R(mig_recv(c, 0, b, 4), -ECONNRESET);
    }
    mig_comm_free(c);
    return 0;
}

static int test_set_timeout(void) {
    return run_ok(2, timeout_rank, NULL);
}

/* mig_comm_set_first_wait: rank 1 (a spare at the boundary early) has a 0.3 s no-progress
 * limit but waits its first wait for rank 0, which trains 1 s before it sends, and
 * mig_comm_heard_at says when that came; once heard from, the short limit holds again
 * (-ETIMEDOUT). On the next epoch's comm, still waiting to
 * hear, it learns at once that rank 0 gave that epoch up: rank 0 frees its comm. */
static int first_wait_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                           void *arg) {
    struct mig_comm *c, *c3;
    char b[16] = {0};
    RCHECK_R(mig_comm_new("tcp", ep, 2, rank, n, addrs, 600.0, &c), 0);
    if (rank == 0) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
        RCHECK_R(mig_send(c, 1, b, sizeof(b)), 0);
        RCHECK_R(mig_recv(c, 1, b, 4), -ECONNRESET); /* rank 1 timed out: its stream shut */
        mig_comm_free(c);
        RCHECK_R(mig_comm_new("tcp", ep, 3, rank, n, addrs, 600.0, &c3), 0);
        mig_comm_free(c3); /* gives epoch 3 up */
        return 0;
    }
    RCHECK_R(mig_comm_set_timeout(c, 0.3), 0);
    RCHECK_R(mig_comm_set_first_wait(c, TMO), 0);
    double t0 = st_now();
    RCHECK(mig_comm_heard_at(c) == 0);
    RCHECK_R(mig_recv(c, 0, b, sizeof(b)), 0);
    RCHECK(st_now() - t0 > 0.3);
    /* when the first byte came: after rank 0's second of training, by the end of the call */
    RCHECK(mig_comm_heard_at(c) > t0 + 0.3 && mig_comm_heard_at(c) <= st_now());
    t0 = st_now();
    RCHECK_R(mig_recv(c, 0, b, 4), -ETIMEDOUT);
    RCHECK(st_now() - t0 < 10.0);
    mig_comm_free(c);
    RCHECK_R(mig_comm_new("tcp", ep, 3, rank, n, addrs, 600.0, &c3), 0);
    RCHECK_R(mig_comm_set_first_wait(c3, 600.0), 0);
    t0 = st_now();
    RCHECK_R(mig_recv(c3, 0, b, 4), -ECONNRESET);
    RCHECK(st_now() - t0 < 60.0);
    mig_comm_free(c3);
    return 0;
}

static int test_first_wait(void) {
    ASSERT_EQ(run_ok(2, first_wait_rank, NULL), 0);
    struct mig_comm *c = NULL;
    struct mig_endpoint *ep;
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &ep));
    const char *addrs[1] = {mig_endpoint_addr(ep)};
    ASSERT_OK(mig_comm_new("tcp", ep, 1, 0, 1, addrs, 1.0, &c));
    ASSERT_ERR(mig_comm_set_first_wait(c, 0), -EINVAL);
    ASSERT_ERR(mig_comm_set_first_wait(c, NAN), -EINVAL);
    ASSERT_ERR(mig_comm_set_first_wait(NULL, 1.0), -EINVAL);
    ASSERT_TRUE(mig_comm_heard_at(NULL) == 0);
    mig_comm_free(c);
    mig_endpoint_free(ep);
    return 0;
}

/* Every rank sends 3 MiB to every other at once and receives from all: without concurrent
 * progress this deadlocks once the socket buffers are full. */
static int batch_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                      void *arg) {
    struct mig_comm *c;
    size_t sz = 3u << 20;
    struct mig_op ops[2 * RU_MAX];
    unsigned char *bufs[2 * RU_MAX];
    size_t k = 0;
    RCHECK_R(mig_comm_new("tcp", ep, 7, rank, n, addrs, TMO, &c), 0);
    for (int p = 0; p < n; p++) {
        if (p == rank)
            continue;
        bufs[k] = malloc(sz);
        bufs[k + 1] = calloc(1, sz);
        RCHECK(bufs[k] && bufs[k + 1]);
        for (size_t i = 0; i < sz; i++)
            bufs[k][i] = ru_byte(3, rank * 16 + p, i);
        ops[k] = (struct mig_op){p, true, bufs[k], sz};
        ops[k + 1] = (struct mig_op){p, false, bufs[k + 1], sz};
        k += 2;
    }
    RCHECK_R(mig_batch(c, ops, k), 0);
    for (size_t j = 1; j < k; j += 2) {
        int p = ops[j].peer;
        for (size_t i = 0; i < sz; i++)
            if (bufs[j][i] != ru_byte(3, p * 16 + rank, i))
                RCHECK(!"batch data mismatch");
    }
    for (size_t j = 0; j < k; j++)
        free(bufs[j]);
    /* Several messages to one peer in one batch keep their order. */
    if (rank < 2) {
        int other = 1 - rank;
        int a = 1, b = 2, x = 0, y = 0;
        struct mig_op two[4] = {{other, true, &a, 4}, {other, true, &b, 4},
                                {other, false, &x, 4}, {other, false, &y, 4}};
        RCHECK_R(mig_batch(c, two, 4), 0);
        RCHECK(x == 1 && y == 2);
    }
    mig_comm_free(c);
    return 0;
}

static int test_batch_all_to_all(void) {
    return run_ok(4, batch_rank, NULL);
}

/* ---- collectives ------------------------------------------------------------------------ */

static const int groups[][5] = {{0}, {3, 1}, {4, 0, 2}, {1, 3, 0, 4}, {2, 0, 4, 1, 3},
                                {0, 1, 2, 3, 4}, {2}};
static const int group_n[] = {1, 2, 3, 4, 5, 5, 1};

static int pos_in(const int *g, int n, int rank) {
    for (int i = 0; i < n; i++)
        if (g[i] == rank)
            return i;
    return -1;
}

/* Checks a float/double array against the serial fixed-order reference. */
static int check_sum_f32(const float *got, const int *g, int n, uint64_t seed, size_t base,
                         size_t count) {
    size_t wrong = 0;
    for (size_t e = 0; e < count; e++) {
        float acc = ru_f32(seed, g[0], base + e);
        for (int i = 1; i < n; i++)
            acc = acc + ru_f32(seed, g[i], base + e);
        if (memcmp(&acc, &got[e], 4) != 0 && wrong++ < 3)
            fprintf(stderr, "  f32 elem %zu: got %.9g want %.9g\n", base + e, got[e], acc);
    }
    return wrong ? 1 : 0;
}

static int check_sum_f64(const double *got, const int *g, int n, uint64_t seed, size_t base,
                         size_t count) {
    size_t wrong = 0;
    for (size_t e = 0; e < count; e++) {
        double acc = ru_f64(seed, g[0], base + e);
        for (int i = 1; i < n; i++)
            acc = acc + ru_f64(seed, g[i], base + e);
        if (memcmp(&acc, &got[e], 8) != 0 && wrong++ < 3)
            fprintf(stderr, "  f64 elem %zu: got %.17g want %.17g\n", base + e, got[e], acc);
    }
    return wrong ? 1 : 0;
}

static int coll_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                     void *arg) {
    struct mig_comm *c;
    const size_t big = *(const size_t *)arg;
    RCHECK_R(mig_comm_new("tcp", ep, 3, rank, n, addrs, TMO, &c), 0);
    for (size_t gi = 0; gi < ST_ARRAY_SIZE(groups); gi++) {
        const int *g = groups[gi];
        int gn = group_n[gi], me = pos_in(g, gn, rank);
        if (me < 0)
            continue;
        uint64_t seed = 100 + gi;

        /* allreduce F32, sizes with and without a remainder, and a large one (chunked). */
        const size_t sizes[] = {1, 7, 1000, 12347, big};
        for (size_t si = 0; si < ST_ARRAY_SIZE(sizes); si++) {
            size_t cnt = sizes[si];
            float *f = malloc(cnt * 4);
            RCHECK(f);
            for (size_t e = 0; e < cnt; e++)
                f[e] = ru_f32(seed + si, rank, e);
            RCHECK_R(mig_allreduce(c, g, gn, f, cnt, MIG_F32), 0);
            RCHECK_R(check_sum_f32(f, g, gn, seed + si, 0, cnt), 0);
            free(f);
        }
        /* allreduce F64 */
        {
            size_t cnt = 5003;
            double *d = malloc(cnt * 8);
            RCHECK(d);
            for (size_t e = 0; e < cnt; e++)
                d[e] = ru_f64(seed, rank, e);
            RCHECK_R(mig_allreduce(c, g, gn, d, cnt, MIG_F64), 0);
            RCHECK_R(check_sum_f64(d, g, gn, seed, 0, cnt), 0);
            free(d);
        }
        /* reduce_scatter with uneven counts (one empty), separate out and in place. */
        {
            size_t counts[5], total = 0, off[5];
            for (int i = 0; i < gn; i++) {
                counts[i] = i == 1 ? 0 : 1000 + 333 * (size_t)i;
                off[i] = total;
                total += counts[i];
            }
            float *in = malloc(total * 4 + 4), *out = malloc(counts[me] * 4 + 4);
            RCHECK(in && out);
            for (size_t e = 0; e < total; e++)
                in[e] = ru_f32(seed * 7, rank, e);
            RCHECK_R(mig_reduce_scatter(c, g, gn, in, out, counts, MIG_F32), 0);
            RCHECK_R(check_sum_f32(out, g, gn, seed * 7, off[me], counts[me]), 0);
            RCHECK_R(mig_reduce_scatter(c, g, gn, in, in + off[me], counts, MIG_F32), 0);
            RCHECK_R(check_sum_f32(in + off[me], g, gn, seed * 7, off[me], counts[me]), 0);
            free(in);
            free(out);
            /* F64 */
            double *din = malloc(total * 8 + 8), *dout = malloc(counts[me] * 8 + 8);
            RCHECK(din && dout);
            for (size_t e = 0; e < total; e++)
                din[e] = ru_f64(seed * 5, rank, e);
            RCHECK_R(mig_reduce_scatter(c, g, gn, din, dout, counts, MIG_F64), 0);
            RCHECK_R(check_sum_f64(dout, g, gn, seed * 5, off[me], counts[me]), 0);
            /* In place, as the engine reduces its double gradient accumulators. */
            RCHECK_R(mig_reduce_scatter(c, g, gn, din, din + off[me], counts, MIG_F64), 0);
            RCHECK_R(check_sum_f64(din + off[me], g, gn, seed * 5, off[me], counts[me]), 0);
            free(din);
            free(dout);
        }
        /* allgather of bytes, uneven counts, separate and in place. */
        {
            size_t counts[5], total = 0, off[5];
            for (int i = 0; i < gn; i++) {
                counts[i] = (size_t)(17 * i + (i == 2 ? 0 : 5));
                off[i] = total;
                total += counts[i];
            }
            unsigned char *in = malloc(counts[me] + 1), *out = calloc(1, total + 1);
            RCHECK(in && out);
            for (size_t e = 0; e < counts[me]; e++)
                in[e] = ru_byte(seed, rank, e);
            RCHECK_R(mig_allgather(c, g, gn, in, out, counts, MIG_BYTES), 0);
            for (int i = 0; i < gn; i++)
                for (size_t e = 0; e < counts[i]; e++)
                    RCHECK(out[off[i] + e] == ru_byte(seed, g[i], e));
            memset(out, 0, total);
            memcpy(out + off[me], in, counts[me]);
            RCHECK_R(mig_allgather(c, g, gn, out + off[me], out, counts, MIG_BYTES), 0);
            for (int i = 0; i < gn; i++)
                for (size_t e = 0; e < counts[i]; e++)
                    RCHECK(out[off[i] + e] == ru_byte(seed, g[i], e));
            free(in);
            free(out);
        }
        /* broadcast from the last member of the group, then a barrier. */
        {
            int root = g[gn - 1];
            size_t bytes = 100003;
            unsigned char *b = malloc(bytes);
            RCHECK(b);
            for (size_t e = 0; e < bytes; e++)
                b[e] = rank == root ? ru_byte(seed, root, e) : 0;
            RCHECK_R(mig_broadcast(c, g, gn, root, b, bytes), 0);
            for (size_t e = 0; e < bytes; e++)
                RCHECK(b[e] == ru_byte(seed, root, e));
            free(b);
            RCHECK_R(mig_barrier(c, g, gn), 0);
        }
    }
    /* Bad groups are refused before anything moves. */
    int dup[] = {0, 0}, outside[] = {0, 9}, notme[] = {(rank + 1) % n};
    float x = 0;
    RCHECK_R(mig_allreduce(c, dup, 2, &x, 1, MIG_F32), -EINVAL);
    RCHECK_R(mig_allreduce(c, outside, 2, &x, 1, MIG_F32), -EINVAL);
    RCHECK_R(mig_allreduce(c, notme, 1, &x, 1, MIG_F32), -EINVAL);
    RCHECK_R(mig_allreduce(c, notme, 0, &x, 1, MIG_F32), -EINVAL);
    RCHECK_R(mig_allreduce(c, groups[5], 5, &x, 1, MIG_BYTES), -EINVAL);
    RCHECK_R(mig_broadcast(c, groups[5], 5, 7, &x, 4), -EINVAL);
    mig_comm_free(c);
    return 0;
}

static int test_collectives(void) {
    /* 3M floats: each member's segment exceeds one chunk, so several rounds run. */
    size_t big = 3u << 20;
    return run_ok(5, coll_rank, &big);
}

/* ---- failures ------------------------------------------------------------------------------ */

/* Rank 1 kills rank 0 while rank 0 is blocked sending 64 MiB, then receives: it must get
 * -ECONNRESET (the stream ends early), promptly. Rank 2 kills itself; rank 1 then sends to
 * it: an error, no SIGPIPE. */
static int dead_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                     void *arg) {
    struct mig_comm *c;
    size_t big = 64u << 20;
    RCHECK_R(mig_comm_new("tcp", ep, 9, rank, n, addrs, 5.0, &c), 0);
    char *buf = calloc(1, big);
    RCHECK(buf);
    if (rank == 0 || rank == 2) {
        RCHECK_R(mig_send(c, 1, "go", 2), 0);
        if (rank == 0)
            (void)mig_send(c, 1, buf, big); /* rank 1 kills us in here */
        else
            kill(getpid(), SIGKILL);
        return 3; /* not reached */
    }
    char go[2];
    RCHECK_R(mig_recv(c, 0, go, 2), 0);
    RCHECK_R(mig_recv(c, 2, go, 2), 0);
    kill(ru_pids[0], SIGKILL); /* lower ranks were forked before us: their pids are known */
    double t0 = st_now();
    RCHECK_R(mig_recv(c, 0, buf, big), -ECONNRESET);
    RCHECK(st_now() - t0 < 5.0);
    /* Later calls on the broken connection fail at once with the same error. */
    RCHECK_R(mig_recv(c, 0, buf, 4), -ECONNRESET);
    /* The peer is gone: sending fills the socket then fails with a reset, never SIGPIPE. */
    int r = mig_send(c, 2, buf, big);
    RCHECK(r == -ECONNRESET);
    int all[] = {0, 1, 2};
    float x = 1;
    RCHECK(mig_allreduce(c, all, 3, &x, 1, MIG_F32) < 0);
    free(buf);
    mig_comm_free(c);
    return 0;
}

static int test_dead_peer(void) {
    int st[RU_MAX];
    ASSERT_OK(ru_run(3, dead_rank, NULL, st));
    ASSERT_EQ(st[0], 128 + SIGKILL);
    ASSERT_EQ(st[1], 0);
    ASSERT_EQ(st[2], 128 + SIGKILL);
    return 0;
}

/* A peer that never calls mig_comm_new: its listener accepts (kernel backlog), the handshake
 * never completes. And a peer address where nothing listens. Both: -ETIMEDOUT in time. */
static int test_no_show(void) {
    struct mig_endpoint *a, *b;
    struct mig_comm *c = NULL;
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &a));
    ASSERT_OK(mig_endpoint_new(NULL, 0, &b));
    const char *addrs[2] = {mig_endpoint_addr(a), mig_endpoint_addr(b)};
    double t0 = st_now();
    ASSERT_ERR(mig_comm_new("tcp", a, 1, 0, 2, addrs, 0.3, &c), -ETIMEDOUT);
    ASSERT_TRUE(st_now() - t0 < 3.0);
    /* b still holds a's epoch-1 hello in its backlog (a gave up); as epoch 2 it rejects it
     * as stale and then times out waiting for a rank 0 that never comes. */
    ASSERT_ERR(mig_comm_new("tcp", b, 2, 1, 2, addrs, 0.3, &c), -ETIMEDOUT);
    ASSERT_TRUE(c == NULL);
    /* Nothing listens on b's port once b is gone: connects are refused and retried. */
    char dead[MIG_ADDR_MAX];
    snprintf(dead, sizeof(dead), "%s", mig_endpoint_addr(b));
    b = mig_endpoint_free(b);
    const char *addrs2[2] = {mig_endpoint_addr(a), dead};
    t0 = st_now();
    ASSERT_ERR(mig_comm_new("tcp", a, 3, 0, 2, addrs2, 0.3, &c), -ETIMEDOUT);
    ASSERT_TRUE(st_now() - t0 < 3.0);
    mig_endpoint_free(a);
    return 0;
}

/* Child: rank 0 of epoch `epoch` connecting to the parent's endpoint. Exit code: 0 when the
 * comm came up and a message went through, 10 on -ESTALE, 11 on another error. */
static int child_connect(const char *const *addrs, uint64_t epoch) {
    struct mig_endpoint *ep;
    struct mig_comm *c;
    if (mig_endpoint_new("127.0.0.1", 0, &ep) < 0)
        return 12;
    int r = mig_comm_new("tcp", ep, epoch, 0, 2, addrs, 10.0, &c);
    if (r == 0) {
        r = mig_send(c, 1, &epoch, 8);
        mig_comm_free(c);
    }
    mig_endpoint_free(ep);
    return r == 0 ? 0 : r == -ESTALE ? 10 : 11;
}

static int spawn_child(const char *const *addrs, uint64_t epoch, pid_t *ret) {
    fflush(stdout);
    pid_t p = fork();
    if (p < 0)
        return -errno;
    if (p == 0) {
        alarm(30);
        exit(child_connect(addrs, epoch));
    }
    *ret = p;
    return 0;
}

static int wait_child(pid_t p) {
    int st;
    if (waitpid(p, &st, 0) < 0)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The parent is rank 1. A rank still in epoch 4 is rejected (-ESTALE) by our epoch 5 and not
 * counted; a rank already in epoch 6 connects early and is adopted by our epoch 6. */
static int test_epochs(void) {
    struct mig_endpoint *ep;
    struct mig_comm *c = NULL;
    pid_t p = -1;
    uint64_t got = 0;
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &ep));
    const char *addrs[2] = {"127.0.0.1:1", mig_endpoint_addr(ep)};

    ASSERT_OK(spawn_child(addrs, 4, &p));
    /* Keep building epoch 5 (each attempt times out: no rank 0 of epoch 5 exists) until the
     * stale child has been answered and exited, however slow the machine is. */
    int st = -1;
    for (int i = 0; i < 40 && st < 0; i++) {
        ASSERT_ERR(mig_comm_new("tcp", ep, 5, 1, 2, addrs, 0.5, &c), -ETIMEDOUT);
        int ws;
        if (waitpid(p, &ws, WNOHANG) == p)
            st = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    }
    ASSERT_EQ(st, 10);

    ASSERT_OK(spawn_child(addrs, 5, &p));
    ASSERT_OK(mig_comm_new("tcp", ep, 5, 1, 2, addrs, 10.0, &c));
    ASSERT_OK(mig_recv(c, 0, &got, 8));
    ASSERT_EQ(got, 5);
    c = mig_comm_free(c);
    ASSERT_EQ(wait_child(p), 0);

    /* Early: the child of epoch 6 connects while we still build (and fail) epoch 5 again;
     * its connection is kept on the endpoint and adopted by our epoch 6. */
    ASSERT_OK(spawn_child(addrs, 6, &p));
    ASSERT_ERR(mig_comm_new("tcp", ep, 5, 1, 2, addrs, 0.5, &c), -ETIMEDOUT);
    ASSERT_OK(mig_comm_new("tcp", ep, 6, 1, 2, addrs, 10.0, &c));
    ASSERT_OK(mig_recv(c, 0, &got, 8));
    ASSERT_EQ(got, 6);
    c = mig_comm_free(c);
    ASSERT_EQ(wait_child(p), 0);

    /* Our endpoint has moved on: building an older epoch is refused locally. */
    ASSERT_ERR(mig_comm_new("tcp", ep, 5, 1, 2, addrs, 0.2, &c), -ESTALE);
    mig_endpoint_free(ep);
    return 0;
}

/* Sender sends 100 bytes, receiver posts 200: -EPROTO, and the connection stays failed. */
static int mismatch_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                         void *arg) {
    struct mig_comm *c;
    char buf[200] = {0};
    RCHECK_R(mig_comm_new("tcp", ep, 2, rank, n, addrs, TMO, &c), 0);
    if (rank == 0) {
        RCHECK_R(mig_send(c, 1, buf, 100), 0);
        /* Rank 1 answers nothing (its stream is broken) and closes: we see the reset. */
        RCHECK_R(mig_recv(c, 1, buf, 1), -ECONNRESET);
    } else {
        RCHECK_R(mig_recv(c, 0, buf, 200), -EPROTO);
        RCHECK_R(mig_recv(c, 0, buf, 100), -EPROTO);
        RCHECK_R(mig_send(c, 0, buf, 1), -EPROTO);
    }
    mig_comm_free(c);
    return 0;
}

static int test_size_mismatch(void) {
    int st[RU_MAX];
    ASSERT_OK(ru_run(2, mismatch_rank, NULL, st));
    ASSERT_EQ(st[0], 0);
    ASSERT_EQ(st[1], 0);
    return 0;
}

static int test_bad_args(void) {
    struct mig_endpoint *ep;
    struct mig_comm *c = NULL;
    ASSERT_ERR(mig_endpoint_new("not an address!", 0, &ep), -EINVAL);
    ASSERT_ERR(mig_endpoint_new(NULL, 70000, &ep), -EINVAL);
    ASSERT_OK(mig_endpoint_new(NULL, 0, &ep));
    ASSERT_GT(mig_endpoint_port(ep), 0);
    const char *addrs[3] = {mig_endpoint_addr(ep), "nonsense", "127.0.0.1:99999"};
    ASSERT_ERR(mig_comm_new("udp", ep, 1, 0, 1, addrs, 1, &c), -EINVAL);
    if (!mig_transport_available("nccl"))
        ASSERT_ERR(mig_comm_new("nccl", ep, 1, 0, 1, addrs, 1, &c), -EOPNOTSUPP);
    ASSERT_ERR(mig_comm_new("tcp", ep, 1, 1, 1, addrs, 1, &c), -EINVAL);
    ASSERT_ERR(mig_comm_new("tcp", ep, 1, 0, 0, addrs, 1, &c), -EINVAL);
    ASSERT_ERR(mig_comm_new("tcp", ep, 1, 0, 1, addrs, 0, &c), -EINVAL);
    ASSERT_ERR(mig_comm_new("tcp", ep, 1, 0, 2, addrs + 1, 1, &c), -EINVAL);
    ASSERT_ERR(mig_comm_new("tcp", ep, 1, 0, 3, addrs, 1, &c), -EINVAL);
    ASSERT_TRUE(c == NULL);
    /* One rank needs no endpoint and no addresses. */
    ASSERT_OK(mig_comm_new("tcp", NULL, 1, 0, 1, NULL, 1, &c));
    c = mig_comm_free(c);
    ASSERT_ERR(mig_comm_new("tcp", NULL, 1, 0, 2, addrs, 1, &c), -EINVAL);
    /* A single-rank comm: collectives are local copies. */
    ASSERT_OK(mig_comm_new("tcp", ep, 1, 0, 1, addrs, 1, &c));
    int g[] = {0};
    float f[3] = {1, 2, 3}, out[3];
    size_t cnt[] = {3};
    ASSERT_OK(mig_allreduce(c, g, 1, f, 3, MIG_F32));
    ASSERT_OK(mig_reduce_scatter(c, g, 1, f, out, cnt, MIG_F32));
    ASSERT_TRUE(memcmp(f, out, sizeof(f)) == 0);
    ASSERT_OK(mig_allgather(c, g, 1, f, out, cnt, MIG_F32));
    ASSERT_OK(mig_broadcast(c, g, 1, 0, f, 12));
    ASSERT_OK(mig_barrier(c, g, 1));
    ASSERT_ERR(mig_send(c, 0, f, 4), -EINVAL);
    ASSERT_ERR(mig_send(c, 1, f, 4), -EINVAL);
    ASSERT_ERR(mig_send(c, -1, f, 4), -EINVAL);
    ASSERT_ERR(mig_batch(c, NULL, 1), -EINVAL);
    ASSERT_OK(mig_batch(c, NULL, 0));
    ASSERT_ERR(mig_comm_set_timeout(c, 0), -EINVAL);
    ASSERT_ERR(mig_comm_set_timeout(c, NAN), -EINVAL);
    ASSERT_ERR(mig_comm_set_timeout(c, INFINITY), -EINVAL);
    ASSERT_ERR(mig_comm_set_timeout(NULL, 1), -EINVAL);
    ASSERT_OK(mig_comm_set_timeout(c, 2.5));
    ASSERT_EQ(mig_dtype_size(MIG_F64), 8);
    ASSERT_EQ(mig_dtype_size((enum mig_dtype)9), 0);
    mig_comm_free(c);
    mig_endpoint_free(ep);
    ASSERT_TRUE(mig_comm_free(NULL) == NULL);
    ASSERT_TRUE(mig_endpoint_free(NULL) == NULL);
    return 0;
}

/* Every allocation of endpoint + single-rank comm + local collectives failing in turn. */
static int test_alloc_failures(void) {
    int ok_at = -1;
    for (long n = 1; n < 100 && ok_at < 0; n++) {
        struct mig_endpoint *ep = NULL;
        struct mig_comm *c = NULL;
        int g[] = {0};
        float f[4] = {1, 2, 3, 4};
        st_alloc_fail_after(n);
        int r = mig_endpoint_new(NULL, 0, &ep);
        const char *addrs[1] = {r >= 0 ? mig_endpoint_addr(ep) : ""};
        if (r >= 0)
            r = mig_comm_new("tcp", ep, 1, 0, 1, addrs, 1, &c);
        if (r >= 0)
            r = mig_allreduce(c, g, 1, f, 4, MIG_F32);
        if (r >= 0)
            r = mig_barrier(c, g, 1);
        st_alloc_fail_after(0);
        mig_comm_free(c);
        mig_endpoint_free(ep);
        if (r == 0)
            ok_at = (int)n;
        else
            ASSERT_ERR(r, -ENOMEM);
    }
    ASSERT_GT(ok_at, 2);
    return 0;
}

/* The coordinator moved on: a build of an older epoch waiting for a peer that never comes
 * gives up with -ECANCELED, whether abandoned before it started or while it waits (another
 * thread), long before its 60 s timeout; a later epoch's build is not affected. */
struct abandon_arg {
    struct mig_endpoint *ep;
    uint64_t epoch;
};

static void *abandon_later(void *p) {
    struct abandon_arg *a = p;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL); /* usually inside the build by now; either order must give -ECANCELED */
    mig_endpoint_abandon(a->ep, a->epoch);
    return NULL;
}

static int test_abandon(void) {
    struct mig_endpoint *a;
    struct mig_comm *c = NULL;
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &a));
    const char *addrs[2] = {mig_endpoint_addr(a), "127.0.0.1:1"}; /* rank 1 never listens */
    struct abandon_arg arg = {a, 3};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, abandon_later, &arg), 0);
    ASSERT_ERR(mig_comm_new("tcp", a, 2, 0, 2, addrs, 60.0, &c), -ECANCELED);
    pthread_join(th, NULL);
    ASSERT_TRUE(c == NULL);
    mig_endpoint_free(a);
    /* abandoned before the build: at once; lower calls do not undo it; the epoch named is
     * not abandoned itself and times out as usual */
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &a));
    addrs[0] = mig_endpoint_addr(a);
    mig_endpoint_abandon(a, 5);
    mig_endpoint_abandon(a, 1);
    ASSERT_ERR(mig_comm_new("tcp", a, 4, 0, 2, addrs, 60.0, &c), -ECANCELED);
    ASSERT_ERR(mig_comm_new("tcp", a, 5, 0, 2, addrs, 0.3, &c), -ETIMEDOUT);
    mig_endpoint_abandon(NULL, 9);
    mig_endpoint_free(a);
    return 0;
}

/* ---- the side channel (MIG_EPOCH_SIDE) ---------------------------------------------- */

/* An epoch's auth for the tests: the key all `fill` bytes. */
static void test_auth(struct mig_auth *a, unsigned char fill, const char *job) {
    memset(a, 0, sizeof(*a));
    memset(a->key, fill, sizeof(a->key));
    snprintf(a->job_id, sizeof(a->job_id), "%s", job);
}

/* Side ranks are the main ranks reversed (the side channel names its own ranks): raddrs gets
 * the addresses by side rank; returns ours. */
static int side_ranks(int rank, int n, const char *const *addrs, const char **raddrs) {
    for (int i = 0; i < n; i++)
        raddrs[i] = addrs[n - 1 - i];
    return n - 1 - rank;
}

/* A ring on a side channel, run by side_ring on a thread. */
struct side_job {
    struct mig_comm *side;
    int rank, n;
    size_t bytes;
    int rc;
};

/* A ring exchange on the side channel: send to side rank + 1, receive from side rank - 1. */
static void *side_ring(void *p) {
    struct side_job *j = p;
    unsigned char *out = malloc(j->bytes), *in = malloc(j->bytes);
    j->rc = -ENOMEM;
    if (out && in) {
        for (size_t i = 0; i < j->bytes; i++)
            out[i] = ru_byte(5, j->rank, i);
        struct mig_op ops[2] = {
            {.peer = (j->rank + 1) % j->n, .send = true, .buf = out, .bytes = j->bytes},
            {.peer = (j->rank + j->n - 1) % j->n, .send = false, .buf = in, .bytes = j->bytes},
        };
        j->rc = mig_batch(j->side, ops, 2);
        int from = (j->rank + j->n - 1) % j->n;
        for (size_t i = 0; j->rc == 0 && i < j->bytes; i++)
            if (in[i] != ru_byte(5, from, i))
                j->rc = -EBADMSG;
    }
    free(out);
    free(in);
    return NULL;
}

static void *cancel_later(void *p) {
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL); /* usually inside the batch's poll by now; either order must cancel */
    mig_comm_cancel(p);
    return NULL;
}

/* 20 all-reduces of 16 KiB on c while another thread uses another channel of its epoch. */
static int sums_on(struct mig_comm *c, int rank, int n) {
    for (int k = 0; k < 20; k++) {
        float v[4096];
        for (size_t i = 0; i < ST_ARRAY_SIZE(v); i++)
            v[i] = (float)(rank + 1);
        int all[RU_MAX];
        for (int i = 0; i < n; i++)
            all[i] = i;
        RCHECK_R(mig_allreduce(c, all, n, v, ST_ARRAY_SIZE(v), MIG_F32), 0);
        RCHECK(v[0] == (float)(n * (n + 1) / 2) && v[4095] == v[0]);
    }
    return 0;
}

/* A ring of `bytes` on `ring` (our rank there: ring_rank) on a thread, while this thread sums
 * on main: two channels of one epoch at once. 0, or 1 after printing the failed check. */
static int ring_beside_sums(struct mig_comm *ring, int ring_rank, struct mig_comm *main,
                            int rank, int n, size_t bytes) {
    struct side_job j = {ring, ring_rank, n, bytes, -1};
    pthread_t th;
    RCHECK_R(pthread_create(&th, NULL, side_ring, &j), 0);
    int r = sums_on(main, rank, n);
    pthread_join(th, NULL);
    RCHECK_R(r, 0);
    RCHECK_R(j.rc, 0);
    return 0;
}

static int side_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                     void *arg) {
    (void)arg;
    struct mig_comm *c, *side, *c3;
    struct mig_auth auth;
    test_auth(&auth, 0x5a, "side-test");
    const char *raddrs[RU_MAX];
    int srank = side_ranks(rank, n, addrs, raddrs);
    RCHECK_R(mig_comm_new_auth("tcp", ep, 2, rank, n, addrs, &auth, TMO, &c), 0);
    /* a live migration to epoch 3 ordered ahead: epoch 2 trains on, and so do its copies */
    mig_endpoint_abandon(ep, 3);
    RCHECK_R(mig_comm_new_auth("tcp", ep, 2 | MIG_EPOCH_SIDE, srank, n, raddrs, &auth, TMO,
                               &side), 0);
    RCHECK_R(mig_comm_epoch(side), 2);
    RCHECK_R(mig_comm_rank(side), srank);
    /* the side ring on a thread while this one sums on the main comm, both on loopback */
    RCHECK_R(ring_beside_sums(side, srank, c, rank, n, 8u << 20), 0);
    uint64_t sent = 0, recvd = 0;
    mig_comm_stats(c, &sent, &recvd);
    RCHECK(sent < (1u << 20)); /* the main comm's figures count only its own messages */
    mig_comm_stats(side, &sent, &recvd);
    RCHECK_R(sent, 8u << 20);
    RCHECK_R(recvd, 8u << 20);
    /* an older epoch's side channel is stale; the next epoch's main comm still builds */
    struct mig_comm *old = NULL;
    RCHECK_R(mig_comm_new_auth("tcp", ep, 1 | MIG_EPOCH_SIDE, srank, n, raddrs, &auth, TMO,
                               &old), -ESTALE);
    RCHECK_R(mig_comm_new_auth("tcp", ep, 3, rank, n, addrs, &auth, TMO, &c3), 0);
    /* cancel: side rank 0 waits for a message nobody sends; another thread cancels it long
     * before the 20 s timeout, and the comm stays cancelled */
    if (srank == 0) {
        unsigned char b[16];
        pthread_t ct;
        double t0 = st_now();
        RCHECK_R(pthread_create(&ct, NULL, cancel_later, side), 0);
        RCHECK_R(mig_recv(side, 1, b, sizeof(b)), -ECANCELED);
        pthread_join(ct, NULL);
        RCHECK(st_now() - t0 < 5.0);
        RCHECK_R(mig_send(side, 1, b, sizeof(b)), -ECANCELED);
    }
    RCHECK_R(mig_barrier(c3, (int[]){0, 1, 2}, n), 0); /* nobody leaves before the cancel */
    mig_comm_free(side);
    mig_comm_free(c3);
    mig_comm_free(c);
    return 0;
}

/* Whether one of this process's TCP sockets has data it cannot send because its peer
 * advertises a zero window (the peer's receive buffer is full). Never, on a kernel whose
 * TCP_INFO stops before tcpi_snd_wnd: the caller's wait then runs out (TMO) and the case runs
 * in whatever order the scheduler gives, which passes too. */
static bool zero_window_here(void) {
    DIR *d = opendir("/proc/self/fd");
    bool seen = false;
    struct dirent *e;
    while (d && !seen && (e = readdir(d))) {
        struct stat sb;
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fstat(fd, &sb) != 0 || !S_ISSOCK(sb.st_mode))
            continue;
        struct tcp_info ti;
        socklen_t len = sizeof(ti);
        memset(&ti, 0, sizeof(ti));
        seen = getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
               len >= offsetof(struct tcp_info, tcpi_snd_wnd) + sizeof(ti.tcpi_snd_wnd) &&
               ti.tcpi_snd_wnd == 0 &&
               ti.tcpi_notsent_bytes > 0;
    }
    if (d)
        closedir(d);
    return seen;
}

struct cut_job {
    struct mig_comm *side;
    struct mig_op *ops;
    int r;
    bool done;
};

static void *cut_batch(void *p) {
    struct cut_job *j = p;
    int r = mig_batch(j->side, j->ops, 2);
    j->r = r;
    __atomic_store_n(&j->done, true, __ATOMIC_RELEASE);
    return NULL;
}

/* A side ring of 3 whose rank 0 has its send cut mid-message (mig_side_cut_at): every rank's
 * exchange fails at once, none waits for its no-progress timeout. Rank 2 sends 64 MiB to
 * rank 0, more than the socket buffers hold: it learns of rank 0's failure only because rank
 * 0's failed batch ends the stream it will no longer read (-ETIMEDOUT after TMO without
 * that), while the comm itself stays open.
 *
 * With arg "blocked", rank 0 cuts only once rank 2's stream has filled rank 0's socket:
 * rank 2 runs its exchange on a thread and tells rank 0 on the main comm when its socket
 * sees a zero window. A shutdown alone would leave rank 2 probing that window for ever (the
 * kernel resets a peer only for new data after a shutdown, and a full window admits none):
 * rank 0 must close the failed stream, and the unread data makes the kernel reset it (found
 * by a loaded ASan run of this test). */
static int cut_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                    void *arg) {
    bool blocked = arg != NULL;
    struct mig_comm *c, *side;
    struct mig_auth auth;
    test_auth(&auth, 0x5b, "cut-test");
    RCHECK_R(mig_comm_new_auth("tcp", ep, 2, rank, n, addrs, &auth, TMO, &c), 0);
    RCHECK_R(mig_comm_new_auth("tcp", ep, 2 | MIG_EPOCH_SIDE, rank, n, addrs, &auth, TMO,
                               &side), 0);
    unsigned char token = 7;
    if (blocked && rank == 0)
        RCHECK_R(mig_recv(c, 2, &token, 1), 0);
    if (rank == 0)
        mig_side_cut_at(1);
    size_t bytes = 64u << 20;
    unsigned char *out = calloc(1, bytes), *in = calloc(1, bytes);
    RCHECK(out && in);
    struct mig_op ops[2] = {
        {.peer = (rank + 1) % n, .send = true, .buf = out, .bytes = bytes},
        {.peer = (rank + n - 1) % n, .send = false, .buf = in, .bytes = bytes},
    };
    int r;
    if (blocked && rank == 2) {
        struct cut_job j = {side, ops, 0, false};
        pthread_t th;
        RCHECK_R(pthread_create(&th, NULL, cut_batch, &j), 0);
        double t0 = st_now();
        while (!__atomic_load_n(&j.done, __ATOMIC_ACQUIRE) && !zero_window_here() &&
               st_now() - t0 < TMO) {
            struct timespec ts = {0, 5 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        RCHECK(!__atomic_load_n(&j.done, __ATOMIC_ACQUIRE)); /* rank 0 has not read yet */
        RCHECK_R(mig_send(c, 0, &token, 1), 0);
        pthread_join(th, NULL);
        r = j.r;
    } else {
        r = mig_batch(side, ops, 2);
    }
    free(out);
    free(in);
    if (rank == 0)
        RCHECK_R(r, -ECONNRESET);
    RCHECK(r < 0 && r != -ETIMEDOUT);
    /* The side channel stays open until every rank is done, as a worker keeps it for the
     * rest of the epoch: closing it is not what tells the peers. */
    RCHECK_R(mig_barrier(c, (int[]){0, 1, 2}, n), 0);
    mig_comm_free(side);
    mig_comm_free(c);
    return 0;
}

static int test_side_cut(void) {
    ASSERT_EQ(run_ok(3, cut_rank, NULL), 0);
    ASSERT_EQ(run_ok(3, cut_rank, "blocked"), 0);
    return 0;
}

/* mig_comm_shut: rank 0 completes an exchange with both neighbours, then ends every stream
 * of its comm. Rank 1 then waits for a message rank 0 will never send and rank 2 sends rank 0
 * more than the socket buffers hold: both fail at once, neither waits out its 20 s timeout
 * (a side channel's neighbour after a failed exchange, runner.c peer_main). Rank 0's own later
 * calls say -ECONNABORTED. */
static int shut_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                     void *arg) {
    (void)arg;
    struct mig_comm *c, *side;
    RCHECK_R(mig_comm_new("tcp", ep, 4, rank, n, addrs, TMO, &c), 0);
    RCHECK_R(mig_comm_new("tcp", ep, 4 | MIG_EPOCH_SIDE, rank, n, addrs, TMO, &side), 0);
    unsigned char small[64] = {0};
    struct mig_op ring[2] = {
        {.peer = (rank + 1) % n, .send = true, .buf = small, .bytes = sizeof(small)},
        {.peer = (rank + n - 1) % n, .send = false, .buf = small, .bytes = sizeof(small)},
    };
    RCHECK_R(mig_batch(side, ring, 2), 0);
    RCHECK_R(mig_barrier(c, (int[]){0, 1, 2}, n), 0); /* everyone completed it */
    if (rank == 0) {
        RCHECK_R(mig_comm_shut(side), 0);
        RCHECK_R(mig_send(side, 1, small, sizeof(small)), -ECONNABORTED);
        RCHECK_R(mig_comm_shut(side), 0); /* again: nothing left to end */
    } else if (rank == 1) {
        int r = mig_recv(side, 0, small, sizeof(small));
        RCHECK(r < 0 && r != -ETIMEDOUT);
    } else {
        size_t bytes = 64u << 20;
        unsigned char *big = calloc(1, bytes);
        RCHECK(big != NULL);
        int r = mig_send(side, 0, big, bytes);
        free(big);
        RCHECK(r < 0 && r != -ETIMEDOUT);
    }
    RCHECK_R(mig_barrier(c, (int[]){0, 1, 2}, n), 0); /* the main comm is untouched */
    mig_comm_free(side);
    mig_comm_free(c);
    return 0;
}

static int test_shut(void) {
    ASSERT_EQ(run_ok(3, shut_rank, NULL), 0);
    ASSERT_ERR(mig_comm_shut(NULL), -EINVAL);
    return 0;
}

/* ---- the move channel (MIG_EPOCH_MOVE) ---------------------------------------------- */

/* The three channels of epoch 2 side by side: a 16 MiB ring moves on the move channel on a
 * thread (a migration's state after the boundary) while this thread sums on the main comm (the
 * first step's messages) and then rings on the side channel (a peer copy); each comm counts
 * only its own bytes. An older epoch's move channel is stale; once the coordinator moved on,
 * a move channel of the epoch it left is abandoned (it is built at that epoch's boundary,
 * like the main comm), while that epoch's side channel still builds. */
static int move_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                     void *arg) {
    (void)arg;
    struct mig_comm *c, *move, *side, *old = NULL, *late = NULL;
    struct mig_auth auth;
    test_auth(&auth, 0x5c, "move-test");
    RCHECK_R(mig_comm_new_auth("tcp", ep, 2, rank, n, addrs, &auth, TMO, &c), 0);
    RCHECK_R(mig_comm_new_auth("tcp", ep, 2 | MIG_EPOCH_MOVE, rank, n, addrs, &auth, TMO, &move),
             0);
    RCHECK_R(mig_comm_epoch(move), 2);
    RCHECK_R(ring_beside_sums(move, rank, c, rank, n, 16u << 20), 0);
    RCHECK_R(mig_comm_new_auth("tcp", ep, 2 | MIG_EPOCH_SIDE, rank, n, addrs, &auth, TMO, &side),
             0);
    struct side_job js = {side, rank, n, 1u << 20, -1};
    side_ring(&js);
    RCHECK_R(js.rc, 0);
    uint64_t sent = 0, recvd = 0;
    mig_comm_stats(c, &sent, &recvd);
    RCHECK(sent < (1u << 20));
    mig_comm_stats(move, &sent, &recvd);
    RCHECK_R(sent, 16u << 20);
    RCHECK_R(recvd, 16u << 20);
    mig_comm_stats(side, &sent, &recvd);
    RCHECK_R(sent, 1u << 20);
    RCHECK_R(mig_comm_new_auth("tcp", ep, 1 | MIG_EPOCH_MOVE, rank, n, addrs, &auth, TMO, &old),
             -ESTALE);
    mig_endpoint_abandon(ep, 3);
    RCHECK_R(mig_comm_new_auth("tcp", ep, 2 | MIG_EPOCH_MOVE, rank, n, addrs, &auth, TMO,
                               &late), -ECANCELED);
    RCHECK_R(mig_barrier(c, (int[]){0, 1, 2}, n), 0);
    mig_comm_free(side);
    mig_comm_free(move);
    mig_comm_free(c);
    return 0;
}

/* ---- built ahead of the boundary (mig_comm_new_ahead) -------------------------------- */

struct ahead_job {
    struct mig_endpoint *ep;
    const char *const *addrs;
    const struct mig_auth *auth;
    int rank, n;
    _Atomic bool *stop;
    struct mig_comm *c;
    int rc;
};

static void *ahead_build(void *p) {
    struct ahead_job *j = p;
    j->rc = mig_comm_new_ahead(j->ep, 3, j->rank, j->n, j->addrs, j->auth, TMO, j->stop, &j->c);
    return NULL;
}

/* Epoch 2 trains on (sums on its comm) while epoch 3's comm is built ahead on a thread, and
 * this thread builds epoch 2's side channel and rings on it: the two builds share the
 * endpoint. Rank 0 starts its ahead build only once its side channel is up, so ranks 1 and 2
 * build their side channels while their ahead builds wait for rank 0: both builds run at once
 * on one endpoint, and epoch 2's side hellos must not be taken as stale by the build of 3.
 * After mig_comm_enter(), epoch 2 is stale. */
static int ahead_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                      void *arg) {
    (void)arg;
    struct mig_comm *c, *side, *old = NULL;
    struct mig_auth auth;
    test_auth(&auth, 0x3c, "ahead-test");
    const char *raddrs[RU_MAX];
    int srank = side_ranks(rank, n, addrs, raddrs);
    RCHECK_R(mig_comm_new_auth("tcp", ep, 2, rank, n, addrs, &auth, TMO, &c), 0);
    mig_endpoint_abandon(ep, 3); /* epoch 3 is ordered: 2 trains on to its boundary */
    struct ahead_job j = {ep, addrs, &auth, rank, n, NULL, NULL, -1};
    pthread_t th;
    if (rank != 0)
        RCHECK_R(pthread_create(&th, NULL, ahead_build, &j), 0);
    RCHECK_R(mig_comm_new_auth("tcp", ep, 2 | MIG_EPOCH_SIDE, srank, n, raddrs, &auth, TMO,
                               &side), 0);
    if (rank == 0)
        RCHECK_R(pthread_create(&th, NULL, ahead_build, &j), 0);
    RCHECK_R(ring_beside_sums(side, srank, c, rank, n, 4u << 20), 0);
    pthread_join(th, NULL);
    RCHECK_R(j.rc, 0);
    RCHECK_R(mig_comm_epoch(j.c), 3);
    RCHECK_R(mig_comm_new_auth("tcp", ep, 1 | MIG_EPOCH_SIDE, srank, n, raddrs, &auth, TMO,
                               &old), -ESTALE);
    /* the boundary: epoch 3 is current, 2 is stale, and 3's comm works */
    mig_comm_enter(j.c);
    mig_comm_enter(j.c); /* twice: nothing more */
    RCHECK_R(mig_comm_new_auth("tcp", ep, 2 | MIG_EPOCH_SIDE, srank, n, raddrs, &auth, TMO,
                               &old), -ESTALE);
    RCHECK_R(sums_on(j.c, rank, n), 0);
    mig_comm_free(side);
    mig_comm_free(c);
    mig_comm_free(j.c);
    return 0;
}

static void *stop_later(void *p) {
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL); /* usually inside the build by now; either order must give -ECANCELED */
    atomic_store((_Atomic bool *)p, true);
    return NULL;
}

/* An ahead build whose peer never comes gives up at once when *stop is set, from another
 * thread or before it started, and when the coordinator abandons its epoch; not for the side
 * channel. */
static int test_ahead(void) {
    ASSERT_EQ(run_ok(3, ahead_rank, NULL), 0);
    struct mig_endpoint *a;
    struct mig_comm *c = NULL;
    _Atomic bool stop = false;
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &a));
    const char *addrs[2] = {mig_endpoint_addr(a), "127.0.0.1:1"}; /* rank 1 never listens */
    pthread_t th;
    double t0 = st_now();
    ASSERT_EQ(pthread_create(&th, NULL, stop_later, &stop), 0);
    ASSERT_ERR(mig_comm_new_ahead(a, 2, 0, 2, addrs, NULL, 60.0, &stop, &c), -ECANCELED);
    pthread_join(th, NULL);
    ASSERT_TRUE(st_now() - t0 < 30.0);
    ASSERT_ERR(mig_comm_new_ahead(a, 2, 0, 2, addrs, NULL, 60.0, &stop, &c), -ECANCELED);
    mig_endpoint_abandon(a, 4);
    ASSERT_ERR(mig_comm_new_ahead(a, 3 | MIG_EPOCH_MOVE, 0, 2, addrs, NULL, 60.0, NULL, &c),
               -ECANCELED);
    ASSERT_ERR(mig_comm_new_ahead(a, 4 | MIG_EPOCH_SIDE, 0, 2, addrs, NULL, 1.0, NULL, &c),
               -EINVAL);
    ASSERT_TRUE(c == NULL);
    mig_comm_enter(NULL);
    mig_endpoint_free(a);
    return 0;
}

static int test_move_channel(void) {
    ASSERT_EQ(run_ok(3, move_rank, NULL), 0);
    struct mig_comm *c = NULL;
    ASSERT_ERR(mig_comm_new("tcp", NULL, 1 | MIG_EPOCH_SIDE | MIG_EPOCH_MOVE, 0, 1, NULL, 1.0, &c),
               -EINVAL);
    ASSERT_ERR(mig_comm_new("nccl", NULL, 1 | MIG_EPOCH_MOVE, 0, 1, NULL, 1.0, &c), -EOPNOTSUPP);
    return 0;
}

static int test_side_channel(void) {
    ASSERT_EQ(run_ok(3, side_rank, NULL), 0);
    /* not on another transport */
    struct mig_comm *c = NULL;
    ASSERT_ERR(mig_comm_new("nccl", NULL, 1 | MIG_EPOCH_SIDE, 0, 1, NULL, 1.0, &c), -EOPNOTSUPP);
    mig_comm_cancel(NULL);
    return 0;
}

TEST_MAIN(TEST(test_p2p), TEST(test_set_timeout), TEST(test_first_wait), TEST(test_batch_all_to_all), TEST(test_collectives),
          TEST(test_dead_peer), TEST(test_no_show), TEST(test_epochs), TEST(test_size_mismatch),
          TEST(test_bad_args), TEST(test_alloc_failures), TEST(test_abandon),
          TEST(test_side_channel), TEST(test_side_cut), TEST(test_shut),
          TEST(test_move_channel), TEST(test_ahead))
