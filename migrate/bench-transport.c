/* bench-transport.c: data-plane throughput against raw loopback TCP, measured in one run.
 *
 * Baselines: a plain blocking TCP socket pair per stream, the sender writing in 4 MiB writes.
 * Ours: mig_send/mig_recv of the same bytes over the tcp transport, and mig_batch with 4
 * concurrent pairs (4 sender and 4 receiver processes, each moving its share in one batch),
 * against 4 raw pairs. Each figure is bytes / wall seconds from a common start to the last
 * receiver's acknowledgement; prints both and the ratio (target >= 0.8). Run by
 * scripts/bench.d/migration. The mig cases run three times: without a key, with an epoch secret
 * (a GMAC per message), which is how `spottrain run` moves state, and with the secret and TLS
 * 1.3 (fleet.data_plane.tls: AES-128-GCM records).
 *
 * The one idea: every side is its own process, started together through a pipe, so the
 * baseline and ours pay the same scheduling and copies.
 *
 * Each case also prints the CPU it used: every process's user + system seconds from the start
 * to its end, summed, over the wall time: how many cores the move keeps busy. A migration
 * overlapped with compute can only hide what the compute leaves of the machine's cores
 * (docs/live-migration.md). */
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "migrate.h"

#define WRITE_BYTES (4u << 20)
#define MAX_PAIRS 8

static size_t opt_bytes = (size_t)1 << 30; /* per stream */
static size_t opt_msg = (size_t)64 << 20;  /* mig message size */
/* The raw streams' buffer: writes and reads of WRITE_BYTES walk across it. WRITE_BYTES (the
 * default) keeps it in a cache; the size of a mig message gives the raw stream the memory
 * footprint of ours (--raw-buf). */
static size_t opt_raw_buf = WRITE_BYTES;
static int opt_reps = 3;
static bool cur_keyed; /* the mig cases run with an epoch secret (GMAC per message) */
static bool cur_tls;   /* ... and encrypted (TLS 1.3 with the handshake's PSK) */

/* What each process writes back: its wall time (receivers: -1) and its CPU seconds. */
struct result {
    double wall, cpu;
};

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int put_result(int res, double wall, double cpu0) {
    struct result x = {wall, cpu_seconds() - cpu0};
    return write(res, &x, sizeof(x)) == sizeof(x) ? 0 : -EIO;
}

/* Waits for the start signal: the parent closes the pipe's write end. */
static void wait_go(int fd) {
    char c;
    while (read(fd, &c, 1) > 0)
        ;
}

static int full_write(int fd, const void *b, size_t n) {
    const char *p = b;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int full_read(int fd, void *b, size_t n) {
    char *p = b;
    while (n) {
        ssize_t g = recv(fd, p, n, 0);
        if (g == 0)
            return -ECONNRESET;
        if (g < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += g;
        n -= (size_t)g;
    }
    return 0;
}

/* One raw stream: the receiver listens, the sender connects and writes opt_bytes. */
static int raw_receiver(int lfd, int go, int res) {
    char *buf = malloc(opt_raw_buf);
    int fd = accept(lfd, NULL, NULL);
    if (!buf || fd < 0)
        return 1;
    wait_go(go);
    double c0 = cpu_seconds();
    int r = 0;
    for (size_t left = opt_bytes, at = 0; left && r == 0;) {
        if (at == opt_raw_buf)
            at = 0;
        size_t want = ST_MIN(ST_MIN(left, (size_t)WRITE_BYTES), opt_raw_buf - at);
        ssize_t g = recv(fd, buf + at, want, 0);
        if (g <= 0) {
            r = -EIO;
        } else {
            left -= (size_t)g;
            at += (size_t)g;
        }
    }
    if (r == 0)
        r = full_write(fd, "k", 1);
    if (r == 0)
        r = put_result(res, -1, c0);
    close(fd);
    free(buf);
    return r == 0 ? 0 : 1;
}

static int raw_sender(int port, int go, int res) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    char *buf = malloc(opt_raw_buf);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (!buf || fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
        return 1;
    memset(buf, 0x5a, opt_raw_buf);
    wait_go(go);
    double t0 = st_now(), c0 = cpu_seconds();
    int r = 0;
    for (size_t left = opt_bytes, at = 0; left && r == 0;) {
        if (at == opt_raw_buf)
            at = 0;
        size_t n = ST_MIN(ST_MIN(left, (size_t)WRITE_BYTES), opt_raw_buf - at);
        r = full_write(fd, buf + at, n);
        left -= n;
        at += n;
    }
    char k;
    if (r == 0)
        r = full_read(fd, &k, 1);
    if (r == 0)
        r = put_result(res, st_now() - t0, c0);
    close(fd);
    free(buf);
    return r == 0 ? 0 : 1;
}

/* mig: ranks 0..p-1 send to ranks p..2p-1 (pair i = (i, i + p)). */
static int mig_rank(int rank, int nranks, struct mig_endpoint *ep, const char *const *addrs,
                    int go, int res, bool batch) {
    struct mig_comm *c;
    int pairs = nranks / 2, r;
    size_t msg = ST_MIN(opt_msg, opt_bytes), nmsg = (opt_bytes + msg - 1) / msg;
    /* One message-sized buffer: messages to one peer are moved one after the other, so even
     * the receives of one batch can share it. */
    char *buf = malloc(msg);
    struct mig_op *ops = calloc(nmsg, sizeof(*ops));
    if (!buf || !ops)
        return 1;
    memset(buf, 0x5a, msg);
    if (cur_keyed) {
        /* What `spottrain run` does: every epoch has a secret, every message its MAC. */
        struct mig_auth auth;
        memset(&auth, 0, sizeof(auth));
        memset(auth.key, 0x42, sizeof(auth.key));
        snprintf(auth.job_id, sizeof(auth.job_id), "bench-transport");
        auth.tls = cur_tls;
        r = mig_comm_new_auth("tcp", ep, 1, rank, nranks, addrs, &auth, 60, &c);
        mig_auth_clear(&auth);
    } else {
        r = mig_comm_new("tcp", ep, 1, rank, nranks, addrs, 60, &c);
    }
    if (r < 0) {
        fprintf(stderr, "rank %d: mig_comm_new: %s\n", rank, st_strerror(r));
        return 1;
    }
    bool sender = rank < pairs;
    int peer = sender ? rank + pairs : rank - pairs;
    wait_go(go);
    double t0 = st_now(), c0 = cpu_seconds();
    if (batch) {
        /* One batch moving the whole share as nmsg messages, all posted at once. */
        for (size_t i = 0; i < nmsg; i++) {
            size_t off = i * msg;
            ops[i] = (struct mig_op){peer, sender, buf, ST_MIN(msg, opt_bytes - off)};
        }
        r = mig_batch(c, ops, nmsg);
    } else {
        for (size_t off = 0; off < opt_bytes && r >= 0; off += msg) {
            size_t n = ST_MIN(msg, opt_bytes - off);
            r = sender ? mig_send(c, peer, buf, n) : mig_recv(c, peer, buf, n);
        }
    }
    char k = 'k';
    if (r >= 0)
        r = sender ? mig_recv(c, peer, &k, 1) : mig_send(c, peer, &k, 1);
    if (r >= 0 && put_result(res, sender ? st_now() - t0 : -1, c0) < 0)
        r = -EIO;
    if (r < 0)
        fprintf(stderr, "rank %d: %s\n", rank, st_strerror(r));
    mig_comm_free(c);
    free(ops);
    free(buf);
    return r < 0 ? 1 : 0;
}

/* Runs one configuration; returns aggregate bytes per second, or -1, and the cores its
 * processes kept busy (CPU seconds over the wall time) in *ret_cores. */
static double run_case(bool mig, bool batch, int pairs, double *ret_cores) {
    int go[2], res[2], nproc = 2 * pairs;
    pid_t pids[2 * MAX_PAIRS];
    struct mig_endpoint *eps[2 * MAX_PAIRS] = {0};
    char addr[2 * MAX_PAIRS][MIG_ADDR_MAX];
    const char *addrs[2 * MAX_PAIRS];
    int lfd[MAX_PAIRS], port[MAX_PAIRS];

    if (pipe(go) < 0 || pipe(res) < 0)
        return -1;
    for (int i = 0; i < pairs && !mig; i++) {
        struct sockaddr_in a = {.sin_family = AF_INET};
        socklen_t l = sizeof(a);
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        lfd[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (lfd[i] < 0 || bind(lfd[i], (struct sockaddr *)&a, sizeof(a)) < 0 ||
            listen(lfd[i], 4) < 0 || getsockname(lfd[i], (struct sockaddr *)&a, &l) < 0)
            return -1;
        port[i] = ntohs(a.sin_port);
    }
    for (int i = 0; i < nproc && mig; i++) {
        if (mig_endpoint_new("127.0.0.1", 0, &eps[i]) < 0)
            return -1;
        snprintf(addr[i], sizeof(addr[i]), "%s", mig_endpoint_addr(eps[i]));
        addrs[i] = addr[i];
    }
    fflush(stdout);
    for (int i = 0; i < nproc; i++) {
        pids[i] = fork();
        if (pids[i] < 0)
            return -1;
        if (pids[i] == 0) {
            close(go[1]);
            close(res[0]);
            int rc;
            if (mig) {
                for (int j = 0; j < nproc; j++)
                    if (j != i)
                        eps[j] = mig_endpoint_free(eps[j]);
                rc = mig_rank(i, nproc, eps[i], addrs, go[0], res[1], batch);
                mig_endpoint_free(eps[i]);
            } else {
                rc = i < pairs ? raw_sender(port[i], go[0], res[1])
                               : raw_receiver(lfd[i - pairs], go[0], res[1]);
            }
            exit(rc);
        }
    }
    for (int i = 0; i < pairs && !mig; i++)
        close(lfd[i]);
    for (int i = 0; i < nproc && mig; i++)
        mig_endpoint_free(eps[i]);
    close(go[0]);
    close(res[1]);
    /* Let every process connect and block on the pipe, then start them together. */
    usleep(mig ? 300000 : 100000);
    close(go[1]);
    double worst = 0, cpu = 0;
    struct result x;
    int got = 0;
    while (read(res[0], &x, sizeof(x)) == sizeof(x)) {
        worst = x.wall > worst ? x.wall : worst;
        cpu += x.cpu;
        got++;
    }
    close(res[0]);
    bool ok = got == nproc;
    for (int i = 0; i < nproc; i++) {
        int st;
        waitpid(pids[i], &st, 0);
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    *ret_cores = worst > 0 ? cpu / worst : 0;
    return ok && worst > 0 ? (double)opt_bytes * pairs / worst : -1;
}

/* Best of opt_reps runs, to take the noise of a shared machine out of both sides alike;
 * *ret_cores is the best run's. */
static double best_of(bool mig, bool batch, int pairs, double *ret_cores) {
    double best = -1;
    for (int i = 0; i < opt_reps; i++) {
        double cores, v = run_case(mig, batch, pairs, &cores);
        if (v < 0)
            return -1;
        if (v > best) {
            best = v;
            *ret_cores = cores;
        }
    }
    return best;
}

int main(int argc, char **argv) {
    static const struct option opts[] = {
        {"bytes", required_argument, NULL, 'b'}, {"msg", required_argument, NULL, 'm'},
        {"reps", required_argument, NULL, 'r'},  {"pairs", required_argument, NULL, 'p'},
        {"raw-buf", required_argument, NULL, 'w'}, {"help", no_argument, NULL, 'h'},
        {0},
    };
    int c, pairs = 4;
    uint64_t v;
    st_log_init_from_env();
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b':
        case 'm':
        case 'w':
            if (st_parse_size(optarg, &v) < 0 || v == 0 || v > ((uint64_t)16 << 30)) {
                fprintf(stderr, "bench-transport: bad size '%s'\n", optarg);
                return 2;
            }
            *(c == 'b' ? &opt_bytes : c == 'm' ? &opt_msg : &opt_raw_buf) = (size_t)v;
            break;
        case 'r':
            opt_reps = atoi(optarg);
            if (opt_reps < 1 || opt_reps > 100) {
                fprintf(stderr, "bench-transport: bad --reps '%s'\n", optarg);
                return 2;
            }
            break;
        case 'p':
            pairs = atoi(optarg);
            if (pairs < 1 || pairs > MAX_PAIRS) {
                fprintf(stderr, "bench-transport: bad --pairs '%s' (1..%d)\n", optarg, MAX_PAIRS);
                return 2;
            }
            break;
        case 'h':
            printf("Usage: bench-transport [--bytes SIZE] [--msg SIZE] [--reps N] [--pairs P]\n"
                   "                       [--raw-buf SIZE]\n"
                   "Loopback throughput of raw TCP vs the mig tcp transport (best of N).\n"
                   "--raw-buf: the raw streams' buffer (default 4 MiB, their write size).\n");
            return 0;
        default:
            fprintf(stderr, "bench-transport: unknown option; try --help\n");
            return 2;
        }
    }
    double cr1, cm1, crp, cmp, ck1, ckp, ct1, ctp; /* cores busy */
    double raw1 = best_of(false, false, 1, &cr1), mig1 = best_of(true, false, 1, &cm1);
    double rawp = best_of(false, false, pairs, &crp), migp = best_of(true, true, pairs, &cmp);
    cur_keyed = true;
    double key1 = best_of(true, false, 1, &ck1), keyp = best_of(true, true, pairs, &ckp);
    cur_tls = true;
    double tls1 = best_of(true, false, 1, &ct1), tlsp = best_of(true, true, pairs, &ctp);
    /* The raw streams again with buffers as large as a mig message: ours move to and from
     * buffers of that size (a layer's parameters), which no cache holds. */
    size_t raw_buf = opt_raw_buf;
    double cf1 = 0, cfp = 0, rawf1 = 0, rawfp = 0;
    opt_raw_buf = ST_MIN(opt_msg, opt_bytes);
    if (opt_raw_buf != raw_buf) {
        rawf1 = best_of(false, false, 1, &cf1);
        rawfp = best_of(false, false, pairs, &cfp);
    }
    opt_raw_buf = raw_buf;
    if (raw1 < 0 || mig1 < 0 || rawp < 0 || migp < 0 || key1 < 0 || keyp < 0 || tls1 < 0 ||
        tlsp < 0 || rawf1 < 0 || rawfp < 0) {
        fprintf(stderr, "bench-transport: a run failed\n");
        return 1;
    }
    const double G = 1e9;
    printf("transport: %.2f GiB per stream, mig messages of %zu MiB, raw buffers of %zu KiB, "
           "best of %d\n", (double)opt_bytes / (1u << 30), opt_msg >> 20, opt_raw_buf >> 10,
           opt_reps);
    printf("  raw tcp 1 stream (4 MiB writes)        %8.2f GB/s               cpu %.2f cores\n",
           raw1 / G, cr1);
    printf("  mig_send/mig_recv 1 pair               %8.2f GB/s   ratio %.2f  cpu %.2f cores\n",
           mig1 / G, mig1 / raw1, cm1);
    printf("  raw tcp %d streams                      %8.2f GB/s               cpu %.2f cores\n",
           pairs, rawp / G, crp);
    printf("  mig_batch %d concurrent pairs           %8.2f GB/s   ratio %.2f  cpu %.2f cores\n",
           pairs, migp / G, migp / rawp, cmp);
    if (rawf1 > 0) {
        size_t fb = ST_MIN(opt_msg, opt_bytes) >> 20;
        printf("  raw tcp again, its buffers as large as a mig message (%zu MiB; ours move to\n"
               "  and from such buffers, out of any cache):\n", fb);
        printf("  raw tcp 1 stream, %4zu MiB buffers     %8.2f GB/s               cpu %.2f cores"
               "   mig 1 pair / it %.2f\n", fb, rawf1 / G, cf1, mig1 / rawf1);
        printf("  raw tcp %d streams, %4zu MiB buffers    %8.2f GB/s               cpu %.2f cores"
               "   mig pairs / it %.2f\n", pairs, fb, rawfp / G, cfp, migp / rawfp);
    }
    printf("  with the epoch secret (a GMAC per message, as spottrain run):\n");
    printf("  mig_send/mig_recv 1 pair, keyed        %8.2f GB/s   ratio %.2f  cpu %.2f cores\n",
           key1 / G, key1 / raw1, ck1);
    printf("  mig_batch %d concurrent pairs, keyed    %8.2f GB/s   ratio %.2f  cpu %.2f cores\n",
           pairs, keyp / G, keyp / rawp, ckp);
    printf("  with the epoch secret and TLS 1.3 (fleet.data_plane.tls: true):\n");
    printf("  mig_send/mig_recv 1 pair, tls          %8.2f GB/s   ratio %.2f  cpu %.2f cores\n",
           tls1 / G, tls1 / raw1, ct1);
    printf("  mig_batch %d concurrent pairs, tls      %8.2f GB/s   ratio %.2f  cpu %.2f cores\n",
           pairs, tlsp / G, tlsp / rawp, ctp);
    printf("data_plane_ratio %.3f %.3f %.3f %.3f %.3f %.3f\n", mig1 / raw1, migp / rawp,
           key1 / raw1, keyp / rawp, tls1 / raw1, tlsp / rawp);
    /* For scripts/bench.d/migration's cost file: raw and ours (keyed, as runs are), one pair
     * and all pairs. */
    printf("data_plane_bytes_per_s %.0f %.0f %.0f %.0f\n", raw1, key1, rawp, keyp);
    /* Cores busy while moving, in the same order as data_plane_bytes_per_s. */
    printf("data_plane_cores %.2f %.2f %.2f %.2f\n", cr1, ck1, crp, ckp);
    return 0;
}
