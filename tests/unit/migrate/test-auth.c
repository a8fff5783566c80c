/* test-auth.c: the data plane's authentication — the mutual challenge-response of protocol 2
 * and the per-message MACs — against genuine ranks and against strangers that speak the wire
 * format by hand: no secret, a wrong key or job id, a replayed handshake, a hello naming the
 * wrong epoch or ranks, a truncated hello, an old unauthenticated hello, a proxy that flips a
 * byte of a message.
 *
 * The one idea: a stranger here is a raw socket that writes the documented bytes
 * (docs/data-plane-security.md), computing proofs independently of tcp.c, so the test checks
 * the wire format as well as the refusals; every refusal is asserted by what the endpoint
 * recorded (peer, epoch, reason) and by what the stranger saw (a refusal, then the close). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "common.h"
#include "test.h"
#include "unit/migrate/rank-util.h"

#define TMO 20.0 /* seconds: generous, only reached when something is broken */
#define JOB "0b6f7c52-3d1e-4f7a-9a51-2f0c8e1d4b77"

static const struct mig_auth AUTH = {
    .key = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
            17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32},
    .job_id = JOB,
};

/* The same secret with encryption (fleet.data_plane.tls). */
static const struct mig_auth AUTH_TLS = {
    .key = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
            17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32},
    .job_id = JOB,
    .tls = true,
};

/* ---- a hand-written dialler ----------------------------------------------------------- */

static void le32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

struct raw_hello {
    uint32_t version;
    uint64_t epoch;
    uint32_t from, to, nranks, flags;
    unsigned char nonce[32];
};

/* The proof of the wire format: HMAC-SHA256(key, label | "spottrain-dp-v2"\0 | job id padded
 * to 64 | epoch | from | to | nranks | flags | dialler nonce | acceptor nonce). */
static void raw_proof(const struct mig_auth *a, char label, const struct raw_hello *h,
                      const unsigned char *ns, unsigned char out[32]) {
    unsigned char t[1 + 16 + 64 + 8 + 16 + 64] = {0};
    t[0] = (unsigned char)label;
    memcpy(t + 1, "spottrain-dp-v2", 15);
    memcpy(t + 17, a->job_id, strlen(a->job_id));
    le64(t + 81, h->epoch);
    le32(t + 89, h->from);
    le32(t + 93, h->to);
    le32(t + 97, h->nranks);
    le32(t + 101, h->flags);
    memcpy(t + 105, h->nonce, 32);
    memcpy(t + 137, ns, 32);
    size_t len = 0;
    EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, a->key, 32, t, sizeof(t), out, 32, &len);
}

static int raw_connect(const char *addr) {
    char host[64];
    const char *colon = strrchr(addr, ':');
    snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    inet_pton(AF_INET, host, &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* Our end's "HOST:PORT", as the acceptor records it. */
static void raw_local(int fd, char *buf, size_t size) {
    struct sockaddr_in sa;
    socklen_t l = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &l);
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
    snprintf(buf, size, "%s:%d", ip, ntohs(sa.sin_port));
}

/* Writes a hello; size 64 for protocol 2, 32 for protocol 1 (fields only), or less to cut it
 * short. */
static int raw_send_hello(int fd, const struct raw_hello *h, size_t size) {
    unsigned char b[64] = {0};
    le32(b, 0x484d5453u);
    le32(b + 4, h->version);
    le64(b + 8, h->epoch);
    le32(b + 16, h->from);
    le32(b + 20, h->to);
    le32(b + 24, h->nranks);
    le32(b + 28, h->flags);
    memcpy(b + 32, h->nonce, 32);
    return send(fd, b, size, MSG_NOSIGNAL) == (ssize_t)size ? 0 : -1;
}

/* Reads exactly n bytes (10 s at most); returns how many arrived before EOF or the limit. */
static size_t raw_read(int fd, unsigned char *b, size_t n) {
    size_t got = 0;
    double end = st_now() + 10.0;
    while (got < n && st_now() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t g = recv(fd, b + got, n - got, 0);
        if (g <= 0)
            break;
        got += (size_t)g;
    }
    return got;
}

/* True when the peer closed the connection (EOF, or a reset) within 10 s. */
static bool raw_closed(int fd) {
    unsigned char b[256];
    double end = st_now() + 10.0;
    while (st_now() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t g = recv(fd, b, sizeof(b), 0);
        if (g <= 0)
            return true;
    }
    return false;
}

static int raw_send_proof(int fd, const unsigned char mac[32]) {
    unsigned char b[40] = {0};
    le32(b, 0x504d5453u);
    memcpy(b + 8, mac, 32);
    return send(fd, b, sizeof(b), MSG_NOSIGNAL) == (ssize_t)sizeof(b) ? 0 : -1;
}

static struct raw_hello hello_for(uint64_t epoch, uint32_t from, uint32_t to, uint32_t nranks) {
    struct raw_hello h = {2, epoch, from, to, nranks, 1, {0}};
    RAND_bytes(h.nonce, 32);
    return h;
}

/* Checks the endpoint recorded exactly one failure: from peer (NULL: any), for epoch, why. */
static int expect_failure(struct mig_endpoint *ep, const char *peer, uint64_t epoch,
                          const char *why) {
    struct mig_auth_failure f[4];
    size_t n = mig_endpoint_auth_failures(ep, f, 4);
    ASSERT_EQ(n, 1);
    if (peer)
        ASSERT_STREQ(f[0].peer, peer);
    ASSERT_EQ(f[0].epoch, epoch);
    ASSERT_STREQ(f[0].why, why);
    return 0;
}

/* ---- forked helpers -------------------------------------------------------------------- */

static pid_t spawn(int (*fn)(void *), void *arg) {
    fflush(stdout);
    fflush(stderr);
    pid_t p = fork();
    if (p == 0) {
        alarm(50);
        exit(fn(arg));
    }
    return p;
}

static int reap(pid_t p) {
    int st;
    if (waitpid(p, &st, 0) < 0)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A genuine rank 0 of 2 (epoch 1) dialling `to`, which sends 1 MiB and exits 0 on success. */
struct genuine {
    const char *to;              /* the acceptor's (or a proxy's) address */
    const struct mig_auth *auth;
    int wait_fd;                 /* read one byte from it before dialling; -1 = don't */
};

static int genuine_rank0(void *arg) {
    struct genuine *g = arg;
    struct mig_endpoint *ep;
    struct mig_comm *c;
    unsigned char b;
    if (g->wait_fd >= 0 && read(g->wait_fd, &b, 1) != 1)
        return 20;
    if (mig_endpoint_new("127.0.0.1", 0, &ep) < 0)
        return 21;
    const char *addrs[2] = {mig_endpoint_addr(ep), g->to};
    int r = mig_comm_new_auth("tcp", ep, 1, 0, 2, addrs, g->auth, TMO, &c);
    if (r == 0) {
        size_t n = 1u << 20;
        unsigned char *buf = malloc(n);
        for (size_t i = 0; i < n; i++)
            buf[i] = ru_byte(5, 0, i);
        r = mig_send(c, 1, buf, n);
        /* Wait for the receiver's verdict: it closes (its stream is broken) or answers. */
        if (r == 0)
            r = mig_recv(c, 1, &b, 1);
        free(buf);
        mig_comm_free(c);
    }
    mig_endpoint_free(ep);
    return r == 0 ? 0 : r == -EACCES ? 10 : r == -ECONNRESET ? 11 : 12;
}

/* ---- tests ------------------------------------------------------------------------------ */

/* Two keyed ranks (arg: their auth, plain or TLS): byte-exact both ways, message sizes from 0
 * to 3 MiB (16352 and 16353: the largest a TLS header shares its record with, and one more),
 * nothing refused. */
static int keyed_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                      void *arg) {
    struct mig_comm *c;
    size_t sizes[] = {0, 1, 4096, 16352, 16353, 3u << 20};
    RCHECK_R(mig_comm_new_auth("tcp", ep, 3, rank, n, addrs, arg, TMO, &c), 0);
    for (size_t k = 0; k < ST_ARRAY_SIZE(sizes); k++) {
        unsigned char *s = malloc(sizes[k] + 1), *r = calloc(1, sizes[k] + 1);
        RCHECK(s && r);
        for (size_t i = 0; i < sizes[k]; i++)
            s[i] = ru_byte(k, rank, i);
        struct mig_op ops[2] = {{1 - rank, true, s, sizes[k]}, {1 - rank, false, r, sizes[k]}};
        RCHECK_R(mig_batch(c, ops, 2), 0);
        size_t wrong = 0;
        for (size_t i = 0; i < sizes[k]; i++)
            wrong += r[i] != ru_byte(k, 1 - rank, i);
        RCHECK_R(wrong, 0);
        free(s);
        free(r);
    }
    uint64_t sent = 0, recvd = 0;
    mig_comm_stats(c, &sent, &recvd);
    /* Payload only: MACs and TLS records are not counted. */
    RCHECK_R(sent, 1 + 4096 + 16352 + 16353 + (3u << 20));
    RCHECK_R(recvd, 1 + 4096 + 16352 + 16353 + (3u << 20));
    RCHECK_R(mig_endpoint_auth_failure_total(ep), 0);
    mig_comm_free(c);
    return 0;
}

static int test_keyed_roundtrip(void) {
    int st[RU_MAX];
    ASSERT_OK(ru_run(2, keyed_rank, (void *)&AUTH, st));
    ASSERT_EQ(st[0], 0);
    ASSERT_EQ(st[1], 0);
    return 0;
}

static int test_tls_roundtrip(void) {
    int st[RU_MAX];
    ASSERT_OK(ru_run(2, keyed_rank, (void *)&AUTH_TLS, st));
    ASSERT_EQ(st[0], 0);
    ASSERT_EQ(st[1], 0);
    return 0;
}

/* A TLS sender whose receiver resets the connection (rank 1 shuts its comm at once, with
 * rank 0's 64 MiB, more than the socket buffers hold, unread): rank 0's send fails with an
 * error; the process is not killed by SIGPIPE, which it has not ignored (OpenSSL's own socket
 * BIO writes with write(); ours sends with MSG_NOSIGNAL). */
static int tls_reset_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                          void *arg) {
    (void)arg;
    struct mig_comm *c = NULL;
    RCHECK(signal(SIGPIPE, SIG_DFL) != SIG_ERR);
    RCHECK_R(mig_comm_new_auth("tcp", ep, 4, rank, n, addrs, &AUTH_TLS, TMO, &c), 0);
    if (rank == 1) {
        unsigned char b[64];
        RCHECK_R(mig_recv(c, 0, b, sizeof(b)), 0); /* rank 0 is sending */
        RCHECK_R(mig_comm_shut(c), 0);
        mig_comm_free(c);
        return 0;
    }
    size_t big = 64u << 20;
    unsigned char *buf = calloc(1, big);
    RCHECK(buf != NULL);
    RCHECK_R(mig_send(c, 1, buf, 64), 0);
    int r = mig_send(c, 1, buf, big);
    free(buf);
    mig_comm_free(c);
    RCHECK(r < 0 && r != -ETIMEDOUT);
    return 0;
}

static int test_tls_peer_reset(void) {
    int st[RU_MAX];
    ASSERT_OK(ru_run(2, tls_reset_rank, NULL, st));
    ASSERT_EQ(st[1], 0);
    ASSERT_EQ(st[0], 0); /* 128 + SIGPIPE (141) before the MSG_NOSIGNAL BIO */
    return 0;
}

/* One rank asks for TLS and the other does not (a spec both must share, so never genuine; or a
 * proxy that stripped the flag, which the proofs would catch anyway): the acceptor refuses the
 * hello with -EACCES, records why, and the dialler gives up with that status. Both ways. */
static int tls_mismatch_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                             void *arg) {
    const bool dialler_tls = arg != NULL;
    struct mig_comm *c = NULL;
    struct mig_auth_failure f[4];
    if (rank == 0) {
        RCHECK_R(mig_comm_new_auth("tcp", ep, 4, 0, n, addrs, dialler_tls ? &AUTH_TLS : &AUTH,
                                   TMO, &c), -EACCES);
        RCHECK_R(mig_endpoint_auth_failures(ep, f, 4), 0);
        return 0;
    }
    for (int i = 0; i < 40 && mig_endpoint_auth_failure_total(ep) == 0; i++)
        RCHECK_R(mig_comm_new_auth("tcp", ep, 4, 1, n, addrs, dialler_tls ? &AUTH : &AUTH_TLS,
                                   0.5, &c), -ETIMEDOUT);
    RCHECK_R(mig_endpoint_auth_failures(ep, f, 4), 1);
    RCHECK(strcmp(f[0].why, dialler_tls ? "TLS hello to a plaintext comm"
                                        : "hello without TLS") == 0);
    RCHECK_R(f[0].epoch, 4);
    return 0;
}

static int test_tls_mismatch(void) {
    int st[RU_MAX];
    ASSERT_OK(ru_run(2, tls_mismatch_rank, (void *)1, st));
    ASSERT_EQ(st[0], 0);
    ASSERT_EQ(st[1], 0);
    ASSERT_OK(ru_run(2, tls_mismatch_rank, NULL, st));
    ASSERT_EQ(st[0], 0);
    ASSERT_EQ(st[1], 0);
    return 0;
}

/* Rank 0 holds another key (or another job id) than rank 1. The dialler finds the acceptor's
 * proof wrong and gives up (-EACCES, recorded with the address it dialled); the acceptor sees
 * the connection close before a proof and records that. Neither side adopts anything. */
struct mismatch {
    struct mig_auth a[2];
};

static int mismatch_rank(int rank, int n, struct mig_endpoint *ep, const char *const *addrs,
                         void *arg) {
    struct mismatch *m = arg;
    struct mig_comm *c = NULL;
    struct mig_auth_failure f[4];
    if (rank == 0) {
        RCHECK_R(mig_comm_new_auth("tcp", ep, 4, 0, n, addrs, &m->a[0], TMO, &c), -EACCES);
        RCHECK_R(mig_endpoint_auth_failures(ep, f, 4), 1);
        RCHECK(strcmp(f[0].peer, addrs[1]) == 0);
        RCHECK(strcmp(f[0].why, "the address we dialled failed its proof") == 0);
        RCHECK_R(f[0].epoch, 4);
        return 0;
    }
    /* Rebuild until the dialler's attempt has been seen and refused, however slow we are. */
    for (int i = 0; i < 40 && mig_endpoint_auth_failure_total(ep) == 0; i++)
        RCHECK_R(mig_comm_new_auth("tcp", ep, 4, 1, n, addrs, &m->a[1], 0.5, &c), -ETIMEDOUT);
    RCHECK_R(mig_endpoint_auth_failures(ep, f, 4), 1);
    RCHECK(strcmp(f[0].why, "closed before its proof") == 0);
    RCHECK_R(f[0].epoch, 4);
    RCHECK(c == NULL);
    return 0;
}

static int test_wrong_key(void) {
    struct mismatch m = {{AUTH, AUTH}};
    int st[RU_MAX];
    m.a[0].key[7] ^= 0x40;
    ASSERT_OK(ru_run(2, mismatch_rank, &m, st));
    ASSERT_EQ(st[0], 0);
    ASSERT_EQ(st[1], 0);
    /* The same key under another job id is another secret. */
    m.a[0] = AUTH;
    snprintf(m.a[0].job_id, sizeof(m.a[0].job_id), "%s", "11111111-2222-3333-4444-555555555555");
    ASSERT_OK(ru_run(2, mismatch_rank, &m, st));
    ASSERT_EQ(st[0], 0);
    ASSERT_EQ(st[1], 0);
    return 0;
}

/* A stranger with the right magic, epoch and ranks but no secret connects first and answers
 * the challenge with a made-up proof: refused (recorded with its address), and the genuine
 * rank 0, which dials afterwards, is adopted; the message it sends arrives intact. */
struct rogue {
    const char *to;
    int done_fd;    /* writes one byte there once refused */
    char *peer_out; /* shared page: the stranger's own address, for the assertion */
};

static int rogue_no_secret(void *arg) {
    struct rogue *g = arg;
    unsigned char ack[80], mac[32];
    int fd = raw_connect(g->to);
    if (fd < 0)
        return 30;
    raw_local(fd, g->peer_out, MIG_ADDR_MAX);
    struct raw_hello h = hello_for(1, 0, 1, 2);
    if (raw_send_hello(fd, &h, 64) < 0 || raw_read(fd, ack, 80) != 80)
        return 31;
    if (rd32(ack) != 0x414d5453u || rd32(ack + 4) != 0)
        return 32; /* a challenge, as for anyone whose hello fits */
    RAND_bytes(mac, 32);
    if (raw_send_proof(fd, mac) < 0 || !raw_closed(fd))
        return 33;
    close(fd);
    return write(g->done_fd, "x", 1) == 1 ? 0 : 34;
}

static int test_rogue_without_secret(void) {
    struct mig_endpoint *ep;
    struct mig_comm *c = NULL;
    int pfd[2];
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &ep));
    ASSERT_OK(pipe(pfd));
    char *peer = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_TRUE(peer != MAP_FAILED);
    struct rogue rg = {mig_endpoint_addr(ep), pfd[1], peer};
    struct genuine gn = {mig_endpoint_addr(ep), &AUTH, pfd[0]};
    pid_t pr = spawn(rogue_no_secret, &rg), pg = spawn(genuine_rank0, &gn);
    const char *addrs[2] = {"127.0.0.1:1", mig_endpoint_addr(ep)};
    ASSERT_OK(mig_comm_new_auth("tcp", ep, 1, 1, 2, addrs, &AUTH, TMO, &c));
    ASSERT_EQ(reap(pr), 0);
    ASSERT_OK(expect_failure(ep, peer, 1, "bad proof"));
    size_t n = 1u << 20, wrong = 0;
    unsigned char *buf = malloc(n);
    ASSERT_OK(mig_recv(c, 0, buf, n));
    for (size_t i = 0; i < n; i++)
        wrong += buf[i] != ru_byte(5, 0, i);
    ASSERT_EQ(wrong, 0);
    ASSERT_OK(mig_send(c, 0, "k", 1));
    ASSERT_EQ(reap(pg), 0);
    ASSERT_EQ(mig_endpoint_auth_failure_total(ep), 1);
    free(buf);
    mig_comm_free(c);
    munmap(peer, 4096);
    close(pfd[0]);
    close(pfd[1]);
    mig_endpoint_free(ep);
    return 0;
}

/* A handshake recorded off the wire — hello and the dialler's valid proof — replayed on a new
 * connection to the same epoch: the acceptor's fresh nonce makes the old proof wrong. */
struct replay {
    const char *to;
    int phase_fd; /* one byte after the genuine handshake, so the parent rebuilds */
    int go_fd;    /* one byte from the parent: it is building again */
};

static int replayer(void *arg) {
    struct replay *rp = arg;
    unsigned char ack[80], mac[32], ack2[80], b;
    struct raw_hello h = hello_for(6, 0, 1, 2);
    /* The genuine exchange, as the key holder made it (recorded: h and mac). */
    int fd = raw_connect(rp->to);
    if (fd < 0 || raw_send_hello(fd, &h, 64) < 0 || raw_read(fd, ack, 80) != 80)
        return 40;
    raw_proof(&AUTH, 'C', &h, ack + 16, mac);
    if (raw_send_proof(fd, mac) < 0)
        return 41;
    if (write(rp->phase_fd, "x", 1) != 1 || read(rp->go_fd, &b, 1) != 1)
        return 42;
    /* The replay: same hello, same proof, new connection. */
    int fd2 = raw_connect(rp->to);
    if (fd2 < 0 || raw_send_hello(fd2, &h, 64) < 0 || raw_read(fd2, ack2, 80) != 80)
        return 43;
    if (memcmp(ack + 16, ack2 + 16, 32) == 0)
        return 44; /* the acceptor must never reuse its nonce */
    if (raw_send_proof(fd2, mac) < 0 || !raw_closed(fd2))
        return 45;
    close(fd);
    close(fd2);
    return 0;
}

static int test_replayed_handshake(void) {
    struct mig_endpoint *ep;
    struct mig_comm *c = NULL;
    int ph[2], go[2];
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &ep));
    ASSERT_OK(pipe(ph));
    ASSERT_OK(pipe(go));
    struct replay rp = {mig_endpoint_addr(ep), ph[1], go[0]};
    pid_t p = spawn(replayer, &rp);
    const char *addrs[2] = {"127.0.0.1:1", mig_endpoint_addr(ep)};
    /* The genuine handshake is adopted: the wire format above is the one tcp.c speaks. */
    ASSERT_OK(mig_comm_new_auth("tcp", ep, 6, 1, 2, addrs, &AUTH, TMO, &c));
    c = mig_comm_free(c);
    unsigned char b;
    ASSERT_EQ(read(ph[0], &b, 1), 1);
    ASSERT_EQ(write(go[1], "x", 1), 1);
    /* Building epoch 6 again (a retry): the replay must not complete it. */
    for (int i = 0; i < 40 && mig_endpoint_auth_failure_total(ep) == 0; i++)
        ASSERT_ERR(mig_comm_new_auth("tcp", ep, 6, 1, 2, addrs, &AUTH, 0.5, &c), -ETIMEDOUT);
    ASSERT_OK(expect_failure(ep, NULL, 6, "bad proof"));
    ASSERT_EQ(reap(p), 0);
    for (int k = 0; k < 2; k++) {
        close(ph[k]);
        close(go[k]);
    }
    mig_endpoint_free(ep);
    return 0;
}

/* Hellos that are refused before any challenge, each checked for what the stranger reads
 * (the refusal's status) and what the endpoint records. The parent is rank 1 of 2 building
 * epoch 5; the stranger's bytes are in the socket before the build starts. */
static int refused_hello(struct mig_endpoint *ep, const struct raw_hello *h, size_t size,
                         bool close_after, int want_status, const char *want_why,
                         uint64_t want_epoch) {
    struct mig_comm *c = NULL;
    unsigned char ack[80];
    char me[MIG_ADDR_MAX];
    const char *addrs[2] = {"127.0.0.1:1", mig_endpoint_addr(ep)};
    int fd = raw_connect(mig_endpoint_addr(ep));
    ASSERT_GE(fd, 0);
    raw_local(fd, me, sizeof(me));
    ASSERT_OK(raw_send_hello(fd, h, size));
    if (close_after)
        shutdown(fd, SHUT_WR);
    ASSERT_ERR(mig_comm_new_auth("tcp", ep, 5, 1, 2, addrs, &AUTH, 0.3, &c), -ETIMEDOUT);
    if (want_status) {
        ASSERT_EQ(raw_read(fd, ack, 80), 80);
        ASSERT_EQ((int)rd32(ack + 4), want_status);
    }
    ASSERT_TRUE(raw_closed(fd));
    close(fd);
    if (want_why)
        ASSERT_OK(expect_failure(ep, me, want_epoch, want_why));
    else
        ASSERT_EQ(mig_endpoint_auth_failures(ep, (struct mig_auth_failure[1]){0}, 1), 0);
    return 0;
}

static int test_wrong_epoch_rank_truncated(void) {
    struct mig_endpoint *ep;
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &ep));
    struct raw_hello h = hello_for(5, 0, 0, 2); /* names rank 0 as the acceptor */
    ASSERT_OK(refused_hello(ep, &h, 64, false, -EPROTO,
                            "hello names ranks that are not waited for", 5));
    h = hello_for(5, 0, 1, 3); /* another world size */
    ASSERT_OK(refused_hello(ep, &h, 64, false, -EPROTO,
                            "hello names ranks that are not waited for", 5));
    h = hello_for(5, 1, 1, 2); /* from itself: only lower ranks dial */
    ASSERT_OK(refused_hello(ep, &h, 64, false, -EPROTO,
                            "hello names ranks that are not waited for", 5));
    h = hello_for(5, 0, 1, 2);
    h.flags = 0; /* claims to hold no secret */
    ASSERT_OK(refused_hello(ep, &h, 64, false, -EACCES, "hello without a secret", 5));
    h = hello_for(5, 0, 1, 2);
    h.flags = 1 | 4 | 8; /* keyed, for the side channel and the move channel at once */
    ASSERT_OK(refused_hello(ep, &h, 64, false, -EPROTO, "hello names two channels", 5));
    h = hello_for(5, 0, 1, 2);
    ASSERT_OK(refused_hello(ep, &h, 40, true, 0, "truncated hello", 5));
    h.version = 1; /* protocol 1: magic, epoch and ranks right, nothing to prove */
    ASSERT_OK(refused_hello(ep, &h, 32, false, -EACCES,
                            "unauthenticated hello (old protocol version)", 5));
    /* An older epoch is a slow genuine peer, not a stranger: answered, not recorded. */
    h = hello_for(4, 0, 1, 2);
    ASSERT_OK(refused_hello(ep, &h, 64, false, -ESTALE, NULL, 0));
    ASSERT_EQ(mig_endpoint_auth_failure_total(ep), 7);
    mig_endpoint_free(ep);
    return 0;
}

/* Between epochs, mig_endpoint_service refuses what cannot be genuine — a hello for the epoch
 * already built, a protocol-1 hello — keeps a later epoch's hello, and answers a stale one. */
struct built {
    const char *to;
};

static int built_rank0(void *arg) {
    struct built *b = arg;
    struct mig_endpoint *ep;
    struct mig_comm *c;
    char x;
    if (mig_endpoint_new("127.0.0.1", 0, &ep) < 0)
        return 21;
    const char *addrs[2] = {mig_endpoint_addr(ep), b->to};
    int r = mig_comm_new_auth("tcp", ep, 8, 0, 2, addrs, &AUTH, TMO, &c);
    if (r == 0) {
        r = mig_recv(c, 1, &x, 1); /* held open until the parent is done */
        mig_comm_free(c);
    }
    mig_endpoint_free(ep);
    return r == 0 ? 0 : 12;
}

static int test_service_between_epochs(void) {
    struct mig_endpoint *ep;
    struct mig_comm *c = NULL;
    unsigned char ack[80];
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &ep));
    struct built b = {mig_endpoint_addr(ep)};
    pid_t p = spawn(built_rank0, &b);
    const char *addrs[2] = {"127.0.0.1:1", mig_endpoint_addr(ep)};
    ASSERT_OK(mig_comm_new_auth("tcp", ep, 8, 1, 2, addrs, &AUTH, TMO, &c));

    int now = raw_connect(mig_endpoint_addr(ep)), later = raw_connect(mig_endpoint_addr(ep));
    int old = raw_connect(mig_endpoint_addr(ep)), v1 = raw_connect(mig_endpoint_addr(ep));
    ASSERT_TRUE(now >= 0 && later >= 0 && old >= 0 && v1 >= 0);
    char me[MIG_ADDR_MAX];
    raw_local(now, me, sizeof(me));
    struct raw_hello h = hello_for(8, 0, 1, 2);
    ASSERT_OK(raw_send_hello(now, &h, 64));
    h = hello_for(9, 0, 1, 2);
    ASSERT_OK(raw_send_hello(later, &h, 64));
    h = hello_for(7, 0, 1, 2);
    ASSERT_OK(raw_send_hello(old, &h, 64));
    h = hello_for(8, 0, 1, 2);
    h.version = 1;
    ASSERT_OK(raw_send_hello(v1, &h, 32));
    double end = st_now() + 20.0;
    for (;;) {
        /* Until both strangers are recorded and the stale peer has its answer. */
        struct pollfd pf = {.fd = old, .events = POLLIN};
        int answered = poll(&pf, 1, 20);
        if ((mig_endpoint_auth_failure_total(ep) >= 2 && answered == 1) || st_now() > end)
            break;
        ASSERT_OK(mig_endpoint_service(ep));
    }
    ASSERT_EQ(mig_endpoint_auth_failure_total(ep), 2);
    struct mig_auth_failure f[4];
    ASSERT_EQ(mig_endpoint_auth_failures(ep, f, 4), 2);
    int k = strcmp(f[0].peer, me) == 0 ? 0 : 1;
    ASSERT_STREQ(f[k].why, "hello for an epoch already built");
    ASSERT_EQ(f[k].epoch, 8);
    ASSERT_STREQ(f[1 - k].why, "unauthenticated hello (old protocol version)");
    ASSERT_EQ(raw_read(now, ack, 80), 80);
    ASSERT_EQ((int)rd32(ack + 4), -EACCES);
    ASSERT_TRUE(raw_closed(now));
    ASSERT_EQ(raw_read(v1, ack, 16), 16); /* protocol 1 reads a 16-byte ack */
    ASSERT_EQ((int)rd32(ack + 4), -EACCES);
    ASSERT_TRUE(raw_closed(v1));
    ASSERT_EQ(raw_read(old, ack, 80), 80);
    ASSERT_EQ((int)rd32(ack + 4), -ESTALE);
    /* The later epoch's hello is still waiting: no answer yet. */
    struct pollfd pf = {.fd = later, .events = POLLIN};
    ASSERT_EQ(poll(&pf, 1, 0), 0);
    ASSERT_OK(mig_send(c, 0, "x", 1));
    ASSERT_EQ(reap(p), 0);
    c = mig_comm_free(c);
    close(now);
    close(later);
    close(old);
    close(v1);
    ASSERT_ERR(mig_endpoint_service(NULL), -EINVAL);
    mig_endpoint_free(ep);
    return 0;
}

/* ---- a man in the middle --------------------------------------------------------------- */

/* Forwards one connection both ways between a client and `to`, flipping the byte at offset
 * `flip` of the client-to-server stream (-1: none). */
struct proxy {
    int lfd;
    const char *to;
    long flip;
    unsigned char *rec; /* shared with the parent: the client-to-server stream, or NULL */
    size_t rec_max;
    size_t *rec_len;
};

static int proxy_main(void *arg) {
    struct proxy *px = arg;
    int a = accept(px->lfd, NULL, NULL), b = raw_connect(px->to);
    long off = 0;
    if (a < 0 || b < 0)
        return 50;
    for (;;) {
        struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
        if (poll(p, 2, 10000) <= 0)
            return 51;
        unsigned char buf[65536];
        for (int k = 0; k < 2; k++) {
            if (!(p[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t g = recv(k ? b : a, buf, sizeof(buf), 0);
            if (g <= 0)
                return 0; /* either side closed: done */
            if (k == 0 && px->flip >= off && px->flip < off + g)
                buf[px->flip - off] ^= 0x01;
            if (k == 0 && px->rec && *px->rec_len + (size_t)g <= px->rec_max) {
                memcpy(px->rec + *px->rec_len, buf, (size_t)g);
                *px->rec_len += (size_t)g;
            }
            if (k == 0)
                off += g;
            if (send(k ? a : b, buf, (size_t)g, MSG_NOSIGNAL) != g)
                return 0;
        }
    }
}

static int mitm(const struct mig_auth *auth, long flip, int want_recv, const char *want_why) {
    struct mig_endpoint *ep;
    struct mig_comm *c = NULL;
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &ep));
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ASSERT_OK(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)));
    ASSERT_OK(listen(lfd, 4));
    char paddr[MIG_ADDR_MAX];
    raw_local(lfd, paddr, sizeof(paddr));
    struct proxy px = {lfd, mig_endpoint_addr(ep), flip, NULL, 0, NULL};
    struct genuine gn = {paddr, auth, -1};
    pid_t pp = spawn(proxy_main, &px), pg = spawn(genuine_rank0, &gn);
    const char *addrs[2] = {"127.0.0.1:1", mig_endpoint_addr(ep)};
    unsigned char *buf = calloc(1, 1u << 20);
    if (!want_why && want_recv == -EPROTONOSUPPORT) {
        /* TLS: the flip lands in the ClientHello, after the protocol-2 handshake adopted the
         * connection; the PSK binder no longer matches what we received. */
        ASSERT_ERR(mig_comm_new_auth("tcp", ep, 1, 1, 2, addrs, auth, TMO, &c), -EBADMSG);
        int g = reap(pg);
        ASSERT_TRUE(g == 12 || g == 11); /* our alert, or the reset of our close */
        ASSERT_EQ(mig_endpoint_auth_failure_total(ep), 0);
    } else if (!want_why) {
        ASSERT_OK(mig_comm_new_auth("tcp", ep, 1, 1, 2, addrs, auth, TMO, &c));
        ASSERT_ERR(mig_recv(c, 0, buf, 1u << 20), want_recv);
        /* The stream stays failed: a later message cannot be read as if nothing happened. */
        ASSERT_ERR(mig_recv(c, 0, buf, 1), want_recv);
        c = mig_comm_free(c);
        int g = reap(pg);
        if (auth->tls)
            /* The sender sees our TLS alert (bad record MAC: -EBADMSG) when it had written
             * everything and waits for the verdict, or the reset of our close (-ECONNRESET)
             * when it was still writing; which one is up to the scheduler. */
            ASSERT_TRUE(g == 12 || g == 11);
        else
            ASSERT_EQ(g, 11); /* the sender sees our close */
        ASSERT_EQ(mig_endpoint_auth_failure_total(ep), 0);
    } else {
        for (int i = 0; i < 40 && mig_endpoint_auth_failure_total(ep) == 0; i++)
            ASSERT_ERR(mig_comm_new_auth("tcp", ep, 1, 1, 2, addrs, auth, 0.5, &c), -ETIMEDOUT);
        ASSERT_OK(expect_failure(ep, NULL, 1, want_why));
        ASSERT_EQ(reap(pg), 11);
    }
    ASSERT_EQ(reap(pp), 0);
    free(buf);
    close(lfd);
    mig_endpoint_free(ep);
    return 0;
}

/* One bit flipped in the payload (after hello 64 + proof 40 + header 32 bytes), in the header's
 * length, in the MAC trailer, or in the dialler's proof. */
static int test_mitm_flip(void) {
    ASSERT_OK(mitm(&AUTH, 64 + 40 + 32 + 777, -EBADMSG, NULL));
    ASSERT_OK(mitm(&AUTH, 64 + 40 + 32 + (1 << 20) + 5, -EBADMSG, NULL));
    ASSERT_OK(mitm(&AUTH, 64 + 40 + 24, -EPROTO, NULL));
    ASSERT_OK(mitm(&AUTH, 64 + 20, 0, "bad proof"));
    return 0;
}

/* With TLS, one bit flipped in the dialler's proof is still refused by the handshake of
 * protocol 2; flipped inside the TLS stream after the handshakes (100 KiB in: inside the 1 MiB
 * message's records) it fails the record's tag: -EBADMSG, and the stream stays failed; flipped
 * in the TLS handshake, the comm is not built (-EBADMSG). (-EPROTONOSUPPORT below only selects
 * that last case in mitm().) */
static int test_tls_mitm_flip(void) {
    ASSERT_OK(mitm(&AUTH_TLS, 64 + 20, 0, "bad proof"));
    ASSERT_OK(mitm(&AUTH_TLS, 64 + 40 + (100 << 10), -EBADMSG, NULL));
    /* 60 bytes into the ClientHello: its random. The acceptor's TLS handshake fails. */
    ASSERT_OK(mitm(&AUTH_TLS, 64 + 40 + 60, -EPROTONOSUPPORT, NULL));
    return 0;
}

/* A dialler that holds the key and passes the protocol-2 handshake with the TLS flag (flags 3:
 * the wire format of docs/data-plane-security.md), then never starts TLS. */
struct silent {
    const char *to;
    int go_fd; /* one byte from the parent: it gave up; close */
};

static int silent_tls_dialler(void *arg) {
    struct silent *sl = arg;
    unsigned char ack[80], mac[32], b;
    struct raw_hello h = hello_for(9, 0, 1, 2);
    h.flags = 3;
    int fd = raw_connect(sl->to);
    if (fd < 0 || raw_send_hello(fd, &h, 64) < 0 || raw_read(fd, ack, 80) != 80 ||
        rd32(ack + 4) != 0)
        return 40;
    raw_proof(&AUTH_TLS, 'C', &h, ack + 16, mac);
    if (raw_send_proof(fd, mac) < 0 || read(sl->go_fd, &b, 1) != 1)
        return 41;
    close(fd);
    return 0;
}

/* The acceptor adopts the proven connection, then waits for a ClientHello that never comes:
 * -ETIMEDOUT after timeout_s, and nothing is recorded as an authentication failure (the peer
 * proved the secret; it is slow or broken, not a stranger). */
static int test_tls_handshake_timeout(void) {
    struct mig_endpoint *ep;
    struct mig_comm *c = NULL;
    int go[2];
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &ep));
    ASSERT_OK(pipe(go));
    struct silent sl = {mig_endpoint_addr(ep), go[0]};
    pid_t p = spawn(silent_tls_dialler, &sl);
    const char *addrs[2] = {"127.0.0.1:1", mig_endpoint_addr(ep)};
    ASSERT_ERR(mig_comm_new_auth("tcp", ep, 9, 1, 2, addrs, &AUTH_TLS, 0.5, &c), -ETIMEDOUT);
    ASSERT_TRUE(c == NULL);
    ASSERT_EQ(mig_endpoint_auth_failure_total(ep), 0);
    ASSERT_EQ(write(go[1], "x", 1), 1);
    ASSERT_EQ(reap(p), 0);
    close(go[0]);
    close(go[1]);
    mig_endpoint_free(ep);
    return 0;
}

/* True when the 64 bytes at pat occur anywhere in rec[0..n). */
static bool contains(const unsigned char *rec, size_t n, const unsigned char *pat) {
    for (size_t i = 0; i + 64 <= n; i++)
        if (rec[i] == pat[0] && memcmp(rec + i, pat, 64) == 0)
            return true;
    return false;
}

/* A recording proxy between two genuine ranks: the 1 MiB message's bytes are on the wire as
 * they are with a keyed comm (MACs protect, they do not hide) and appear nowhere in the stream
 * with TLS (not one of 64-byte windows sampled across the message). The receiver gets them
 * byte-exact either way. */
static int record_stream(const struct mig_auth *auth, int *ret_found) {
    struct mig_endpoint *ep;
    struct mig_comm *c = NULL;
    size_t max = 2u << 20, n = 1u << 20;
    unsigned char *rec = mmap(NULL, max + sizeof(size_t), PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_TRUE(rec != MAP_FAILED);
    size_t *rec_len = (size_t *)(void *)(rec + max);
    *rec_len = 0;
    ASSERT_OK(mig_endpoint_new("127.0.0.1", 0, &ep));
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ASSERT_OK(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)));
    ASSERT_OK(listen(lfd, 4));
    char paddr[MIG_ADDR_MAX];
    raw_local(lfd, paddr, sizeof(paddr));
    struct proxy px = {lfd, mig_endpoint_addr(ep), -1, rec, max, rec_len};
    struct genuine gn = {paddr, auth, -1};
    pid_t pp = spawn(proxy_main, &px), pg = spawn(genuine_rank0, &gn);
    const char *addrs[2] = {"127.0.0.1:1", mig_endpoint_addr(ep)};
    unsigned char *buf = calloc(1, n);
    ASSERT_OK(mig_comm_new_auth("tcp", ep, 1, 1, 2, addrs, auth, TMO, &c));
    ASSERT_OK(mig_recv(c, 0, buf, n));
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++)
        wrong += buf[i] != ru_byte(5, 0, i);
    ASSERT_EQ(wrong, 0);
    ASSERT_OK(mig_send(c, 0, "k", 1)); /* the verdict genuine_rank0 waits for */
    c = mig_comm_free(c);
    ASSERT_EQ(reap(pg), 0);
    ASSERT_EQ(reap(pp), 0);
    ASSERT_TRUE(*rec_len >= n); /* everything went through the proxy */
    int found = 0;
    for (size_t off = 0; off + 64 <= n; off += n / 16)
        found += contains(rec, *rec_len, buf + off);
    *ret_found = found;
    free(buf);
    close(lfd);
    mig_endpoint_free(ep);
    munmap(rec, max + sizeof(size_t));
    return 0;
}

static int test_tls_wire_encrypted(void) {
    int found = -1;
    ASSERT_OK(record_stream(&AUTH, &found));
    ASSERT_EQ(found, 16);
    ASSERT_OK(record_stream(&AUTH_TLS, &found));
    ASSERT_EQ(found, 0);
    return 0;
}

TEST_MAIN(TEST(test_keyed_roundtrip), TEST(test_wrong_key), TEST(test_rogue_without_secret),
          TEST(test_replayed_handshake), TEST(test_wrong_epoch_rank_truncated),
          TEST(test_service_between_epochs), TEST(test_mitm_flip), TEST(test_tls_roundtrip),
          TEST(test_tls_mismatch), TEST(test_tls_mitm_flip), TEST(test_tls_wire_encrypted),
          TEST(test_tls_handshake_timeout), TEST(test_tls_peer_reset))
