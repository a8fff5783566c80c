/* tcp.c: the TCP transport — endpoints (listening sockets that live across epochs), the
 * per-epoch connection handshake, and the poll-driven batch that moves every message.
 *
 * The one idea: no threads of its own. Every call runs one poll loop over the sockets it needs,
 * with non-blocking sockets and a no-progress deadline, so a dead or absent peer is an error
 * (-ECONNRESET, -ETIMEDOUT) returned to the caller, never a hang or a SIGPIPE (MSG_NOSIGNAL).
 * Connections a peer opens for an epoch we have not reached yet are accepted when we next
 * look at the listener and buffered on the endpoint by epoch until our mig_comm_new() of that
 * epoch; connections of an older epoch are answered with a rejection. The caller's threads
 * may run two builds at once, one of them ahead of its boundary (mig_comm_new_ahead): the
 * endpoint's lock covers what they share, and each takes only its own epoch's and channel's
 * connections. Every message carries a
 * header (magic, epoch, sequence number, length), so a receiver that posted another size, or
 * bytes of another epoch, get -EPROTO instead of silently mixed data.
 *
 * Authentication (protocol version 2, docs/data-plane-security.md): the hello carries the
 * dialler's nonce; the acceptor answers with its own nonce and its proof, HMAC(key, "S" | T),
 * and the dialler, having checked it, sends HMAC(key, "C" | T), where the transcript T binds
 * the job id, epoch, both ranks, nranks and both nonces. Only then is the connection adopted.
 * Fresh nonces on both sides make a recorded handshake useless on a new connection, and the
 * one-letter labels keep either proof from being reflected as the other. Each connection then
 * MACs every message (both ranks, header, payload) with GMAC (AES-256-GCM over no plaintext)
 * under HMAC(key, "K" | T), the IV being the sender's rank and the message's sequence number,
 * so a byte flipped in transit fails the receiving call before the caller can use the buffer.
 * GMAC, not HMAC-SHA256, because the MAC runs over every byte on both ends: GHASH with carry-less
 * multiplication keeps up with loopback TCP where SHA-256 cut the data plane to 0.2-0.6 of it.
 *
 * Encryption (fleet.data_plane.tls): the same handshake first, with the TLS flag in the hello
 * (and so in T: a proxy cannot strip it), then TLS 1.3 on the adopted connection, the dialler
 * as client, with HMAC(key, "K" | T) as the external PSK and an (EC)DHE exchange on top. The
 * stranger is refused, and counted, before any TLS state exists; each connection's PSK is its
 * own; and the AEAD records replace the GMAC trailers (the headers are still checked). Reads
 * and writes go through SSL_read_ex/SSL_write_ex on the same non-blocking sockets and the same
 * poll loop: SSL_ERROR_WANT_READ/WANT_WRITE park a queue as a short read or write does. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/core_names.h> /* OSSL_MAC_PARAM_DIGEST */
#include <openssl/crypto.h>     /* CRYPTO_memcmp, OPENSSL_cleanse */
#include <openssl/evp.h>        /* EVP_MAC, EVP_Q_mac */
#include <openssl/err.h>        /* ERR_clear_error */
#include <openssl/rand.h>       /* RAND_bytes */
#include <openssl/ssl.h>        /* SSL_CTX, SSL: the encrypted data plane */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "check.h" /* TRY_GOTO */
#include "migrate-internal.h"

#define HELLO_MAGIC 0x484d5453u /* "STMH" */
#define ACK_MAGIC 0x414d5453u   /* "STMA" */
#define PROOF_MAGIC 0x504d5453u /* "STMP" */
#define DATA_MAGIC 0x444d5453u  /* "STMD" */
#define PROTO_VERSION 2u        /* 1: no authentication (refused) */
#define NONCE_SIZE 32
#define MAC_SIZE 32
#define TAG_SIZE 16 /* the GMAC tag that trails every message of a keyed comm */
#define HELLO_SIZE (32 + NONCE_SIZE)           /* v1 fields, flags, dialler nonce */
#define ACK_SIZE (16 + NONCE_SIZE + MAC_SIZE)  /* magic, status, epoch, nonce, proof */
#define PROOF_SIZE (8 + MAC_SIZE)
#define HDR_SIZE 32
#define HELLO_KEYED 1u          /* flags: the dialler holds a secret (messages carry MACs) */
#define HELLO_TLS 2u            /* flags: the connection continues as TLS 1.3 (PSK) */
#define HELLO_SIDE 4u           /* flags: a connection of the epoch's side channel */
#define HELLO_MOVE 8u           /* flags: a connection of the epoch's move channel */
#define HELLO_CHANNEL (HELLO_SIDE | HELLO_MOVE)
#define TLS_PSK_ID "spottrain-dp-v2" /* the external PSK's identity; the key is per connection */
#define CHUNK_BYTES (4u << 20)  /* at most this much per send()/recv() call */
/* The same on a keyed comm: the MAC then reads what the socket call just copied while the
 * caches still hold it (docs/live-migration.md: +15-30% over 4 MiB calls on this VM). */
#define MAC_CHUNK_BYTES (256u << 10)
#define MAX_PENDING 256         /* early connections buffered on an endpoint */
#define CONNECT_RETRY_S 0.05    /* a refused connect is retried after this long */
#define HELLO_WAIT_S 10.0       /* a hello not complete after this long is refused */

/* ---- wire helpers ------------------------------------------------------------------ */

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

struct hello {
    uint64_t epoch;
    uint32_t from, to, nranks;
    uint32_t flags;
    unsigned char nonce[NONCE_SIZE];
};

static void hello_encode(unsigned char *b, const struct hello *h) {
    memset(b, 0, HELLO_SIZE);
    put32(b, HELLO_MAGIC);
    put32(b + 4, PROTO_VERSION);
    put64(b + 8, h->epoch);
    put32(b + 16, h->from);
    put32(b + 20, h->to);
    put32(b + 24, h->nranks);
    put32(b + 28, h->flags);
    memcpy(b + 32, h->nonce, NONCE_SIZE);
}

/* Decodes a complete hello (the caller checked magic and version on its first 8 bytes). */
static void hello_decode(const unsigned char *b, struct hello *ret) {
    ret->epoch = get64(b + 8);
    ret->from = get32(b + 16);
    ret->to = get32(b + 20);
    ret->nranks = get32(b + 24);
    ret->flags = get32(b + 28);
    memcpy(ret->nonce, b + 32, NONCE_SIZE);
}

/* The acceptor's answer: status 0 with its nonce and proof, or a negative errno (rejected;
 * nonce and proof zero). Its first 16 bytes are laid out as protocol 1's ack, so an old or
 * foreign dialler still reads the refusal. */
static void ack_encode(unsigned char *b, int status, uint64_t epoch, const unsigned char *nonce,
                       const unsigned char *proof) {
    memset(b, 0, ACK_SIZE);
    put32(b, ACK_MAGIC);
    put32(b + 4, (uint32_t)status);
    put64(b + 8, epoch);
    if (nonce)
        memcpy(b + 16, nonce, NONCE_SIZE);
    if (proof)
        memcpy(b + 16 + NONCE_SIZE, proof, MAC_SIZE);
}

static int io_errno(int e) {
    switch (e) {
    case EPIPE:
    case ECONNRESET:
    case ENOTCONN:
    case ECONNABORTED:
    case ESHUTDOWN:
        return -ECONNRESET;
    default:
        return -e;
    }
}

static void set_nodelay(int fd) {
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Milliseconds until deadline for poll(), at least 0, at most 1 s steps are not needed. */
static int ms_until(double deadline) {
    double d = deadline - st_now();
    if (d <= 0)
        return 0;
    if (d > 3600)
        d = 3600;
    return (int)(d * 1000.0) + 1;
}

/* Parses "host:port" into a sockaddr_in (IPv4; names resolved with getaddrinfo). */
static int parse_addr(const char *s, struct sockaddr_in *ret) {
    char host[MIG_ADDR_MAX];
    const char *colon = s ? strrchr(s, ':') : NULL;
    if (!colon || (size_t)(colon - s) >= sizeof(host) || colon == s)
        return -EINVAL;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port <= 0 || port > 65535)
        return -EINVAL;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
        if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
            return -EINVAL;
        a.sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
        freeaddrinfo(res);
    }
    *ret = a;
    return 0;
}

/* ---- proofs and message MACs --------------------------------------------------------------- */

/* See migrate-internal.h. */
void mig__wipe(void *p, size_t n) {
    OPENSSL_cleanse(p, n);
}

/* The handshake transcript T: everything both ends must agree on. */
#define TRANSCRIPT_SIZE (1 + 16 + MIG_JOB_ID_MAX + 8 + 4 * 4 + 2 * NONCE_SIZE)

/* HMAC-SHA256(key, label | T) into out. Returns 0 or -EIO (the crypto library failed). */
static int proof_mac(const struct mig_comm *c, char label, const struct hello *h,
                     const unsigned char *acc_nonce, unsigned char out[MAC_SIZE]) {
    unsigned char t[TRANSCRIPT_SIZE], *p = t;
    memset(t, 0, sizeof(t));
    *p++ = (unsigned char)label;
    memcpy(p, "spottrain-dp-v2", 15);
    p += 16;
    memcpy(p, c->auth.job_id, strnlen(c->auth.job_id, MIG_JOB_ID_MAX - 1));
    p += MIG_JOB_ID_MAX;
    put64(p, h->epoch);
    put32(p + 8, h->from);
    put32(p + 12, h->to);
    put32(p + 16, h->nranks);
    put32(p + 20, h->flags);
    p += 24;
    memcpy(p, h->nonce, NONCE_SIZE);
    memcpy(p + NONCE_SIZE, acc_nonce, NONCE_SIZE);
    size_t len = 0;
    unsigned char *m = EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, c->auth.key, MIG_KEY_BYTES,
                                 t, sizeof(t), out, MAC_SIZE, &len);
    return m && len == MAC_SIZE ? 0 : -EIO;
}

/* A fresh keyed GMAC (AES-256-GCM) context for one direction of a connection, or NULL. */
static EVP_MAC_CTX *mac_new(const unsigned char key[MAC_SIZE]) {
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "GMAC", NULL);
    EVP_MAC_CTX *m = mac ? EVP_MAC_CTX_new(mac) : NULL;
    EVP_MAC_free(mac); /* the context holds its own reference */
    if (!m)
        return NULL;
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_CIPHER,
                                                            (char *)"AES-256-GCM", 0),
                           OSSL_PARAM_construct_end()};
    if (EVP_MAC_CTX_set_params(m, params) != 1 || EVP_MAC_init(m, key, MAC_SIZE, NULL) != 1) {
        EVP_MAC_CTX_free(m);
        return NULL;
    }
    return m;
}

/* Starts the MAC of one message: re-initialises with the connection's key (kept by the
 * context) and the message's IV, sender rank u32 | sequence number u64 from the header, which
 * never repeats under one connection key (each direction counts its own messages from 0, and
 * every handshake derives a fresh key); then covers sender rank, receiver rank and header. */
static int mac_begin(EVP_MAC_CTX *m, int from, int to, const unsigned char *hdr) {
    unsigned char ranks[8], iv[12];
    put32(ranks, (uint32_t)from);
    put32(ranks + 4, (uint32_t)to);
    put32(iv, (uint32_t)from);
    memcpy(iv + 4, hdr + 16, 8); /* the header's sequence number */
    OSSL_PARAM params[] = {OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_IV, iv, sizeof(iv)),
                           OSSL_PARAM_construct_end()};
    if (EVP_MAC_init(m, NULL, 0, params) != 1 || EVP_MAC_update(m, ranks, 8) != 1 ||
        EVP_MAC_update(m, hdr, HDR_SIZE) != 1)
        return -EIO;
    return 0;
}

static int mac_update(EVP_MAC_CTX *m, const void *p, size_t n) {
    return n == 0 || EVP_MAC_update(m, p, n) == 1 ? 0 : -EIO;
}

static int mac_final(EVP_MAC_CTX *m, unsigned char out[TAG_SIZE]) {
    size_t len = 0;
    return EVP_MAC_final(m, out, &len, TAG_SIZE) == 1 && len == TAG_SIZE ? 0 : -EIO;
}

/* ---- endpoints ----------------------------------------------------------------------- */

/* An accepted connection: its hello incomplete, or complete for a future epoch (PEND_HELLO);
 * or challenged by the comm being built and waiting for the dialler's proof (PEND_PROOF). */
enum pend_state { PEND_HELLO, PEND_PROOF };
struct pending {
    int fd;
    enum pend_state st;
    size_t got;          /* bytes of hello (PEND_HELLO) or proof (PEND_PROOF) */
    double since;        /* st_now() at accept */
    unsigned char hello[HELLO_SIZE];
    unsigned char proof[PROOF_SIZE];
    unsigned char nonce[NONCE_SIZE]; /* ours, sent with the challenge */
    char peer[MIG_ADDR_MAX];
};

struct mig_endpoint {
    /* The pending connections, the epochs, the failure ring: what two builds share when one
     * runs ahead of its boundary (mig_comm_new_ahead) beside the endpoint's own thread. Held
     * for short, non-blocking work only, never across a poll. */
    pthread_mutex_t lock;
    int fd;
    int port;
    char addr[MIG_ADDR_MAX];
    uint64_t min_epoch; /* epochs below this are stale (highest epoch built so far) */
    bool any_epoch;     /* false until the first comm */
    /* Per channel (chan(): main, side, move), the newest epoch whose comm came up; valid when
     * built[ch]. */
    uint64_t built_epoch[3];
    bool built[3];
    struct pending pend[MAX_PENDING];
    size_t npend;
    struct mig_auth_failure fail[MIG_AUTH_FAILURES_KEPT]; /* ring, oldest at fail_head */
    size_t fail_head, nfail;
    uint64_t fail_total;
    /* mig_endpoint_abandon(): comms of lower epochs still being built give up. Set from the
     * worker's command thread, read by the one that builds. */
    _Atomic uint64_t abandon_below;
};

#define ABANDON_POLL_MS 50 /* how often a build that waits looks at abandon_below */

/* See migrate.h. */
void mig_endpoint_abandon(struct mig_endpoint *ep, uint64_t epoch) {
    if (!ep)
        return;
    uint64_t cur = atomic_load(&ep->abandon_below);
    while (cur < epoch && !atomic_compare_exchange_weak(&ep->abandon_below, &cur, epoch))
        ;
}

/* See migrate.h. */
uint64_t mig_endpoint_abandoned(const struct mig_endpoint *ep) {
    return ep ? atomic_load(&((struct mig_endpoint *)ep)->abandon_below) : 0;
}

/* See migrate.h. */
void mig_comm_enter(struct mig_comm *c) {
    if (!c || c->magic != MIG__COMM_MAGIC || !c->ahead)
        return;
    c->ahead = false;
    struct mig_endpoint *ep = c->ep;
    if (!ep)
        return; /* one rank: no endpoint */
    pthread_mutex_lock(&ep->lock);
    if (c->epoch > ep->min_epoch)
        ep->min_epoch = c->epoch;
    pthread_mutex_unlock(&ep->lock);
}

/* Records and logs a refused connection. The log names the peer, never a key or a proof. With
 * ep->lock held. */
static void auth_fail(struct mig_endpoint *ep, const char *peer, uint64_t epoch,
                      const char *why) {
    st_log(ST_LOG_WARN, "migrate", "Data plane %s: refused the connection with %s (epoch %llu): "
           "%s", ep->addr, peer, (unsigned long long)epoch, why);
    ep->fail_total++;
    if (ep->nfail == MIG_AUTH_FAILURES_KEPT) {
        ep->fail_head = (ep->fail_head + 1) % MIG_AUTH_FAILURES_KEPT;
        ep->nfail--;
    }
    struct mig_auth_failure *f = &ep->fail[(ep->fail_head + ep->nfail) % MIG_AUTH_FAILURES_KEPT];
    /* peer lives in ep too (a pending connection's), never in the ring: gcc -O3 cannot tell
     * (-Wrestrict), so a copy that allows overlap. */
    size_t len = strnlen(peer, sizeof(f->peer) - 1);
    memmove(f->peer, peer, len);
    f->peer[len] = '\0';
    f->epoch = epoch;
    f->why = why;
    ep->nfail++;
}

/* See migrate.h. */
size_t mig_endpoint_auth_failures(struct mig_endpoint *ep, struct mig_auth_failure *ret,
                                  size_t max) {
    size_t n = 0;
    if (!ep || !ret)
        return 0;
    pthread_mutex_lock(&ep->lock);
    for (; n < max && ep->nfail > 0; n++) {
        ret[n] = ep->fail[ep->fail_head];
        ep->fail_head = (ep->fail_head + 1) % MIG_AUTH_FAILURES_KEPT;
        ep->nfail--;
    }
    pthread_mutex_unlock(&ep->lock);
    return n;
}

/* See migrate.h. */
uint64_t mig_endpoint_auth_failure_total(const struct mig_endpoint *ep) {
    if (!ep)
        return 0;
    struct mig_endpoint *w = (struct mig_endpoint *)ep; /* the lock, not the figures */
    pthread_mutex_lock(&w->lock);
    uint64_t n = ep->fail_total;
    pthread_mutex_unlock(&w->lock);
    return n;
}

/* See migrate.h. */
int mig_endpoint_new(const char *bind_host, int port, struct mig_endpoint **ret) {
    struct sockaddr_in a;
    char spec[MIG_ADDR_MAX];
    struct mig_endpoint *ep = NULL;
    int r, one = 1;

    if (!ret || port < 0 || port > 65535)
        return -EINVAL;
    if (!bind_host)
        bind_host = "127.0.0.1";
    snprintf(spec, sizeof(spec), "%s:%d", bind_host, port ? port : 1);
    TRY(parse_addr(spec, &a));
    a.sin_port = htons((uint16_t)port);

    ep = st_calloc(1, sizeof(*ep));
    if (!ep)
        return -ENOMEM;
    pthread_mutex_init(&ep->lock, NULL);
    ep->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (ep->fd < 0) {
        r = -errno;
        goto out;
    }
    (void)setsockopt(ep->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(ep->fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(ep->fd, SOMAXCONN) < 0) {
        r = -errno;
        goto out;
    }
    socklen_t len = sizeof(a);
    if (getsockname(ep->fd, (struct sockaddr *)&a, &len) < 0) {
        r = -errno;
        goto out;
    }
    ep->port = ntohs(a.sin_port);
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
    snprintf(ep->addr, sizeof(ep->addr), "%s:%d", ip, ep->port);
    *ret = ep;
    return 0;
out:
    mig_endpoint_free(ep);
    return r;
}

/* See migrate.h. */
const char *mig_endpoint_addr(const struct mig_endpoint *ep) {
    return ep ? ep->addr : NULL;
}

/* See migrate.h. */
int mig_endpoint_port(const struct mig_endpoint *ep) {
    return ep ? ep->port : -EINVAL;
}

/* See migrate.h. */
struct mig_endpoint *mig_endpoint_free(struct mig_endpoint *ep) {
    if (!ep)
        return NULL;
    for (size_t i = 0; i < ep->npend; i++)
        close(ep->pend[i].fd);
    if (ep->fd >= 0)
        close(ep->fd);
    pthread_mutex_destroy(&ep->lock);
    st_free(ep);
    return NULL;
}

/* The channel of a comm, and the one a hello's flags name: 0 main, 1 side, 2 move; -1 for a
 * hello that names two. */
static int chan(const struct mig_comm *c) {
    return c->side ? 1 : c->move ? 2 : 0;
}

static int hello_chan(uint32_t flags) {
    switch (flags & HELLO_CHANNEL) {
    case 0: return 0;
    case HELLO_SIDE: return 1;
    case HELLO_MOVE: return 2;
    default: return -1;
    }
}

static void pending_drop(struct mig_endpoint *ep, size_t i) {
    close(ep->pend[i].fd);
    ep->pend[i] = ep->pend[--ep->npend];
}

/* Refuses pending i: the 16-byte refusal when status < 0, a record when why is set, close. */
static void pending_refuse(struct mig_endpoint *ep, size_t i, int status, const char *why) {
    struct pending *p = &ep->pend[i];
    uint64_t epoch = p->got >= 16 || p->st == PEND_PROOF ? get64(p->hello + 8) : 0;
    if (status < 0) {
        unsigned char b[ACK_SIZE];
        ack_encode(b, status, epoch, NULL, NULL);
        /* Best effort: a fresh socket's send buffer always has room for it. */
        (void)send(p->fd, b, ACK_SIZE, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (why)
        auth_fail(ep, p->peer, epoch, why);
    pending_drop(ep, i);
}

/* Accepts what is waiting on the listener and reads partial hellos and proofs. Refuses at
 * once what cannot become a valid handshake: another protocol (magic), another version (1
 * had no authentication), a hello or proof cut short. With ep->lock held, as every function
 * below that reads or changes ep->pend. */
static void listener_progress(struct mig_endpoint *ep) {
    for (;;) {
        struct sockaddr_in a;
        socklen_t alen = sizeof(a);
        int fd = accept4(ep->fd, (struct sockaddr *)&a, &alen, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            break;
        if (ep->npend == MAX_PENDING) {
            st_log(ST_LOG_WARN, "migrate", "endpoint %s: too many early connections, "
                   "dropping one", ep->addr);
            close(fd);
            continue;
        }
        struct pending *p = &ep->pend[ep->npend++];
        *p = (struct pending){.fd = fd, .st = PEND_HELLO, .since = st_now()};
        char ip[INET_ADDRSTRLEN] = "?";
        if (alen == sizeof(a) && a.sin_family == AF_INET)
            inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
        snprintf(p->peer, sizeof(p->peer), "%s:%d", ip, ntohs(a.sin_port));
    }
    double now = st_now();
    for (size_t i = 0; i < ep->npend;) {
        struct pending *p = &ep->pend[i];
        bool hello = p->st == PEND_HELLO;
        size_t want = hello ? HELLO_SIZE : PROOF_SIZE;
        if (p->got < want) {
            unsigned char *dst = hello ? p->hello : p->proof;
            ssize_t g = recv(p->fd, dst + p->got, want - p->got, 0);
            if (g == 0 || (g < 0 && errno != EAGAIN && errno != EINTR)) {
                /* A bare connect-and-close (a port probe) is not an attempt; anything that
                 * started a handshake and gave up is. */
                pending_refuse(ep, i, 0, !hello ? "closed before its proof"
                                         : p->got > 0 ? "truncated hello" : NULL);
                continue;
            }
            if (g > 0)
                p->got += (size_t)g;
        }
        if (hello && p->got >= 8 && get32(p->hello) != HELLO_MAGIC) {
            pending_refuse(ep, i, 0, "not a spottrain hello");
            continue;
        }
        if (hello && p->got >= 8 && get32(p->hello + 4) != PROTO_VERSION) {
            pending_refuse(ep, i, -EACCES, "unauthenticated hello (old protocol version)");
            continue;
        }
        if (hello && p->got >= HELLO_SIZE && hello_chan(get32(p->hello + 28)) < 0) {
            pending_refuse(ep, i, -EPROTO, "hello names two channels");
            continue;
        }
        if (hello && p->got < HELLO_SIZE && now - p->since > HELLO_WAIT_S) {
            pending_refuse(ep, i, 0, p->got > 0 ? "truncated hello" : NULL);
            continue;
        }
        i++;
    }
}

/* Between epochs: complete hellos for an epoch already built cannot be genuine (every peer of
 * an epoch connects while its comm is built), stale ones are answered, later ones wait. */
static void pending_sort_idle(struct mig_endpoint *ep) {
    for (size_t i = 0; i < ep->npend;) {
        struct pending *p = &ep->pend[i];
        if (p->st != PEND_HELLO || p->got < HELLO_SIZE) {
            i++;
            continue;
        }
        uint64_t epoch = get64(p->hello + 8);
        int ch = hello_chan(get32(p->hello + 28)); /* >= 0: listener_progress refused two */
        if (ep->built[ch] && epoch <= ep->built_epoch[ch] &&
            epoch >= ep->min_epoch) {
            pending_refuse(ep, i, -EACCES, "hello for an epoch already built");
            continue;
        }
        if (ep->any_epoch && epoch < ep->min_epoch) {
            pending_refuse(ep, i, -ESTALE, NULL);
            continue;
        }
        i++;
    }
}

/* See migrate.h. */
int mig_endpoint_service(struct mig_endpoint *ep) {
    if (!ep)
        return -EINVAL;
    pthread_mutex_lock(&ep->lock);
    listener_progress(ep);
    pending_sort_idle(ep);
    pthread_mutex_unlock(&ep->lock);
    return 0;
}

/* ---- communicator setup ---------------------------------------------------------------- */

struct conn {
    int fd;
    int err;            /* sticky error: the stream is unusable after it */
    uint64_t send_seq;  /* next sequence number we send */
    uint64_t recv_seq;  /* next sequence number we expect */
    unsigned char skey[MAC_SIZE]; /* the connection's message key (keyed), or TLS PSK (tls) */
    EVP_MAC_CTX *tx, *rx;         /* MAC of the message being sent / received (keyed, !tls) */
    SSL *ssl;                     /* tls: the session on fd (which it does not own) */
    unsigned char *stage;         /* tls: header and a small payload, sent as one record */
};

struct tcp_comm {
    struct conn *conns; /* nranks entries; conns[rank].fd = -1 */
    SSL_CTX *ctx;       /* tls: shared by the epoch's sessions */
};

/* ---- TLS (fleet.data_plane.tls) ------------------------------------------------------------ */

/* TLS_AES_128_GCM_SHA256, the fastest TLS 1.3 suite here: with AES-NI and carry-less
 * multiplication, `openssl speed -evp` on 16 KiB blocks gives AES-128-GCM 5.5 GB/s,
 * AES-256-GCM and ChaCha20-Poly1305 5.2. */
#define TLS_SUITE "TLS_AES_128_GCM_SHA256"
static const unsigned char TLS_SUITE_ID[2] = {0x13, 0x01};
/* A message up to this size goes out with its header in one record (one copy, one write). */
#define TLS_COALESCE (16384 - HDR_SIZE)
#define TLS_READ_BUF (256u << 10)  /* read-ahead buffer: many records per recv() */
#define TLS_WRITE_BUF (256u << 10) /* records gathered into one send() (flushed per message) */

/* The connection's PSK as the session both PSK callbacks give OpenSSL. NULL on failure. */
static SSL_SESSION *psk_session(SSL *ssl) {
    const struct conn *cn = SSL_get_app_data(ssl);
    const SSL_CIPHER *ciph = SSL_CIPHER_find(ssl, TLS_SUITE_ID);
    SSL_SESSION *s = ciph && cn ? SSL_SESSION_new() : NULL;
    if (s && (SSL_SESSION_set1_master_key(s, cn->skey, MAC_SIZE) != 1 ||
              SSL_SESSION_set_cipher(s, ciph) != 1 ||
              SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1)) {
        SSL_SESSION_free(s);
        s = NULL;
    }
    return s;
}

/* Client side: offers the PSK. md is set on a second call (after a HelloRetryRequest), when
 * the PSK only fits a suite with that hash; ours always has SHA-256. */
static int psk_use_cb(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
                      SSL_SESSION **sess) {
    SSL_SESSION *s = psk_session(ssl);
    if (!s)
        return 0;
    if (md && SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(s)) != md) {
        SSL_SESSION_free(s);
        *sess = NULL;
        return 1;
    }
    *id = (const unsigned char *)TLS_PSK_ID;
    *idlen = strlen(TLS_PSK_ID);
    *sess = s;
    return 1;
}

/* Server side: accepts only our identity; with no PSK and no certificate the handshake fails. */
static int psk_find_cb(SSL *ssl, const unsigned char *id, size_t idlen, SSL_SESSION **sess) {
    *sess = NULL;
    if (idlen != strlen(TLS_PSK_ID) || memcmp(id, TLS_PSK_ID, idlen) != 0)
        return 1;
    *sess = psk_session(ssl);
    return *sess ? 1 : 0;
}

/* ---- a socket BIO that never raises SIGPIPE ---------------------------------------------- */

/* OpenSSL's socket BIO writes with write(): a peer that reset the connection kills a process
 * that has not ignored SIGPIPE (found by test-auth under load: the dialler of a refused TLS
 * connection died of it). This one sends with MSG_NOSIGNAL, as the plaintext path does; the
 * caller keeps the descriptor (as BIO_NOCLOSE). Its data is the fd; BIO_FLAGS_IN_EOF says the
 * peer ended the stream. */
static int nosig_write(BIO *b, const char *buf, int len) {
    int fd = (int)(intptr_t)BIO_get_data(b);
    BIO_clear_retry_flags(b);
    ssize_t w = send(fd, buf, (size_t)len, MSG_NOSIGNAL);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_write(b);
    return (int)w;
}

static int nosig_read(BIO *b, char *buf, int len) {
    int fd = (int)(intptr_t)BIO_get_data(b);
    BIO_clear_retry_flags(b);
    ssize_t g = recv(fd, buf, (size_t)len, 0);
    if (g < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_read(b);
    if (g == 0)
        BIO_set_flags(b, BIO_FLAGS_IN_EOF);
    return (int)g;
}

static long nosig_ctrl(BIO *b, int cmd, long num, void *ptr) {
    (void)num;
    int fd = (int)(intptr_t)BIO_get_data(b);
    switch (cmd) {
    case BIO_CTRL_FLUSH:
        return 1; /* nothing is buffered here */
    case BIO_CTRL_EOF:
        return BIO_test_flags(b, BIO_FLAGS_IN_EOF) != 0;
    case BIO_C_GET_FD:
        if (ptr)
            *(int *)ptr = fd;
        return fd;
    default:
        return 0;
    }
}

static BIO_METHOD *nosig_method;

static void nosig_method_make(void) {
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK |
                                 BIO_TYPE_DESCRIPTOR, "spottrain socket (MSG_NOSIGNAL)");
    if (m && (BIO_meth_set_write(m, nosig_write) != 1 || BIO_meth_set_read(m, nosig_read) != 1 ||
              BIO_meth_set_ctrl(m, nosig_ctrl) != 1)) {
        BIO_meth_free(m);
        m = NULL;
    }
    nosig_method = m; /* lives as long as the process */
}

/* A BIO over fd (not closed with the BIO), or NULL. */
static BIO *nosig_bio_new(int fd) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, nosig_method_make);
    BIO *b = nosig_method ? BIO_new(nosig_method) : NULL;
    if (b) {
        BIO_set_data(b, (void *)(intptr_t)fd);
        BIO_set_init(b, 1);
    }
    return b;
}

/* TLS 1.3 only, one suite, PSK with (EC)DHE (OpenSSL's default for an external PSK: a leaked
 * key file does not decrypt recorded epochs), no tickets (nothing is ever resumed). */
static SSL_CTX *tls_ctx_new(void) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_method());
    if (!ctx)
        return NULL;
    if (SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) != 1 ||
        SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) != 1 ||
        SSL_CTX_set_ciphersuites(ctx, TLS_SUITE) != 1 || SSL_CTX_set_num_tickets(ctx, 0) != 1) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    /* A write that would block is retried from the op's buffer, which may be the stage. */
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_read_ahead(ctx, 1);
    SSL_CTX_set_default_read_buffer_len(ctx, TLS_READ_BUF);
    SSL_CTX_set_psk_use_session_callback(ctx, psk_use_cb);
    SSL_CTX_set_psk_find_session_callback(ctx, psk_find_cb);
    return ctx;
}

/* Maps a failed SSL call (e = SSL_get_error) to a negative errno and logs it once. A record
 * that fails its AEAD tag (or any protocol error: a byte changed anywhere, or the peer's alert
 * saying it saw one) is -EBADMSG, as a GMAC mismatch is on a keyed comm; an end of stream is
 * -ECONNRESET. */
static int tls_errno(const struct mig_comm *c, int peer, int e, const char *what) {
    char msg[160] = "";
    int sys = errno;
    /* OpenSSL 3 reports a peer that closed mid-record or mid-handshake as a protocol error;
     * for us it is a closed connection, as on a plain stream. */
    if (e == SSL_ERROR_SSL &&
        ERR_GET_REASON(ERR_peek_last_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING)
        e = SSL_ERROR_ZERO_RETURN;
    if (e == SSL_ERROR_SSL) {
        ERR_error_string_n(ERR_peek_last_error(), msg, sizeof(msg));
        ERR_clear_error();
        st_log(ST_LOG_ERR, "migrate", "rank %d: epoch %llu: TLS %s with rank %d failed: %s",
               c->rank, (unsigned long long)c->epoch, what, peer, msg);
        return -EBADMSG;
    }
    ERR_clear_error();
    if (e == SSL_ERROR_SYSCALL && sys != 0)
        return io_errno(sys);
    return -ECONNRESET;
}

/* Runs TLS on every connection of c at once, in one poll loop (each rank is client to the
 * ranks it dialled, server to those that dialled it, so no two ranks wait on each other).
 * pfd has room for nranks entries. Returns 0 or a negative errno. */
static int tls_start(struct mig_comm *c, struct tcp_comm *tc, struct pollfd *pfd) {
    double deadline = st_now() + c->timeout_s;
    if (!(tc->ctx = tls_ctx_new()))
        return -EIO;
    for (int j = 0; j < c->nranks; j++) {
        struct conn *cn = &tc->conns[j];
        if (cn->fd < 0)
            continue;
        cn->stage = st_malloc(HDR_SIZE + TLS_COALESCE);
        if (!cn->stage || !(cn->ssl = SSL_new(tc->ctx)))
            return -ENOMEM;
        /* Reads straight from the socket; writes through a buffer, so that the 16 KiB records
         * of a large message leave in few send() calls (OpenSSL writes each record on its own). */
        BIO *sb = nosig_bio_new(cn->fd), *wb = BIO_new(BIO_f_buffer());
        if (!sb || !wb || BIO_set_write_buffer_size(wb, TLS_WRITE_BUF) != 1 || !BIO_up_ref(sb)) {
            BIO_free(sb);
            BIO_free(wb);
            return -ENOMEM;
        }
        BIO_push(wb, sb);
        SSL_set_bio(cn->ssl, sb, wb); /* the session owns both; sb twice (read, under wb) */
        if (SSL_set_app_data(cn->ssl, cn) != 1)
            return -EIO;
        if (j > c->rank)
            SSL_set_connect_state(cn->ssl);
        else
            SSL_set_accept_state(cn->ssl);
    }
    bool *done = st_calloc((size_t)c->nranks, sizeof(*done));
    int r = 0;
    if (!done)
        return -ENOMEM;
    for (;;) {
        nfds_t np = 0;
        for (int j = 0; j < c->nranks; j++) {
            struct conn *cn = &tc->conns[j];
            if (!cn->ssl || done[j])
                continue;
            ERR_clear_error();
            int k = SSL_do_handshake(cn->ssl);
            if (k == 1) {
                done[j] = true;
                continue;
            }
            int e = SSL_get_error(cn->ssl, k);
            if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
                r = tls_errno(c, j, e, "handshake");
                goto out;
            }
            pfd[np++] = (struct pollfd){.fd = cn->fd,
                                        .events = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT};
        }
        if (np == 0)
            break;
        if (c->stop && atomic_load(c->stop)) {
            r = -ECANCELED;
            goto out;
        }
        if (st_now() >= deadline) {
            st_log(ST_LOG_ERR, "migrate", "rank %d: epoch %llu: TLS handshakes not done within "
                   "%.3g s", c->rank, (unsigned long long)c->epoch, c->timeout_s);
            r = -ETIMEDOUT;
            goto out;
        }
        if (poll(pfd, np, ST_MIN(ms_until(deadline), ABANDON_POLL_MS)) < 0 && errno != EINTR) {
            r = -errno; /* (at most ABANDON_POLL_MS: see the stop flag above) */
            goto out;
        }
    }
out:
    st_free(done);
    return r;
}

/* State of an outgoing connection during setup. */
enum out_state { OUT_IDLE, OUT_CONNECTING, OUT_HELLO, OUT_ACK, OUT_PROOF, OUT_DONE };
struct outgoing {
    enum out_state st;
    int fd;
    double retry_at;
    size_t done; /* bytes of hello or proof sent / ack received */
    unsigned char buf[ACK_SIZE];
    struct hello h;  /* ours, with our nonce */
    unsigned char skey[MAC_SIZE];
    struct sockaddr_in addr;
    const char *peer; /* the address as given */
};

/* The hello's flags for c: what every connection of the epoch must agree on. */
static uint32_t hello_flags(const struct mig_comm *c) {
    return (c->keyed ? HELLO_KEYED : 0u) | (c->tls ? HELLO_TLS : 0u) |
           (c->side ? HELLO_SIDE : 0u) | (c->move ? HELLO_MOVE : 0u);
}

static int out_start(struct outgoing *o) {
    o->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (o->fd < 0)
        return -errno;
    o->done = 0;
    if (connect(o->fd, (struct sockaddr *)&o->addr, sizeof(o->addr)) == 0) {
        o->st = OUT_HELLO;
        return 0;
    }
    if (errno == EINPROGRESS) {
        o->st = OUT_CONNECTING;
        return 0;
    }
    if (errno == ECONNREFUSED || errno == EAGAIN) {
        close(o->fd);
        o->fd = -1;
        o->st = OUT_IDLE;
        o->retry_at = st_now() + CONNECT_RETRY_S;
        return 0;
    }
    return -errno;
}

/* Sends the rest of len bytes of buf; true once all are out. */
static int send_rest(int fd, const unsigned char *buf, size_t len, size_t *done) {
    ssize_t w = send(fd, buf + *done, len - *done, MSG_NOSIGNAL);
    if (w < 0)
        return errno == EAGAIN || errno == EINTR ? 0 : io_errno(errno);
    *done += (size_t)w;
    return *done == len;
}

/* The dialler's check of the acceptor's answer; then our proof and the message key. */
static int out_verify(struct mig_comm *c, struct outgoing *o, int peer) {
    int status = (int)get32(o->buf + 4);
    unsigned char want[MAC_SIZE];
    if (get32(o->buf) != ACK_MAGIC || get64(o->buf + 8) != c->epoch)
        return -EPROTO;
    if (status < 0) {
        st_log(ST_LOG_WARN, "migrate", "rank %d: rank %d rejected our epoch %llu: %s",
               c->rank, peer, (unsigned long long)c->epoch, st_strerror(status));
        return status;
    }
    unsigned char nonce[NONCE_SIZE];
    memcpy(nonce, o->buf + 16, NONCE_SIZE);
    TRY(proof_mac(c, 'S', &o->h, nonce, want));
    if (CRYPTO_memcmp(want, o->buf + 16 + NONCE_SIZE, MAC_SIZE) != 0) {
        pthread_mutex_lock(&c->ep->lock);
        auth_fail(c->ep, o->peer, c->epoch, "the address we dialled failed its proof");
        pthread_mutex_unlock(&c->ep->lock);
        return -EACCES;
    }
    memset(o->buf, 0, sizeof(o->buf));
    put32(o->buf, PROOF_MAGIC);
    TRY(proof_mac(c, 'C', &o->h, nonce, o->buf + 8));
    TRY(proof_mac(c, 'K', &o->h, nonce, o->skey));
    return 0;
}

/* Advances one outgoing connection. Returns 0 or a fatal negative errno. */
static int out_progress(struct mig_comm *c, struct outgoing *o, int peer) {
    if (o->st == OUT_IDLE && st_now() >= o->retry_at)
        TRY(out_start(o));
    if (o->st == OUT_CONNECTING) {
        int e = 0;
        socklen_t l = sizeof(e);
        struct pollfd p = {.fd = o->fd, .events = POLLOUT};
        if (poll(&p, 1, 0) <= 0)
            return 0;
        if (getsockopt(o->fd, SOL_SOCKET, SO_ERROR, &e, &l) < 0)
            e = errno;
        if (e) {
            /* Refused or reset: the peer's listener is not up (yet); retry until the deadline. */
            close(o->fd);
            o->fd = -1;
            o->st = OUT_IDLE;
            o->retry_at = st_now() + CONNECT_RETRY_S;
            return 0;
        }
        o->st = OUT_HELLO;
        o->done = 0;
    }
    if (o->st == OUT_HELLO) {
        if (o->done == 0) {
            /* A fresh nonce per connection attempt: nothing recorded earlier replays. */
            o->h = (struct hello){c->epoch, (uint32_t)c->rank, (uint32_t)peer,
                                  (uint32_t)c->nranks, hello_flags(c), {0}};
            if (RAND_bytes(o->h.nonce, NONCE_SIZE) != 1)
                return -EIO;
            hello_encode(o->buf, &o->h);
        }
        int k = send_rest(o->fd, o->buf, HELLO_SIZE, &o->done);
        if (k < 0)
            return k;
        if (k) {
            o->st = OUT_ACK;
            o->done = 0;
        }
    }
    if (o->st == OUT_ACK) {
        ssize_t g = recv(o->fd, o->buf + o->done, ACK_SIZE - o->done, 0);
        if (g == 0) {
            /* A refusal may be only the protocol-1 sized prefix; read it as one. */
            if (o->done >= 16 && get32(o->buf) == ACK_MAGIC && (int)get32(o->buf + 4) < 0)
                return out_verify(c, o, peer);
            return -ECONNRESET;
        }
        if (g < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return 0;
            return io_errno(errno);
        }
        o->done += (size_t)g;
        if (o->done == ACK_SIZE) {
            TRY(out_verify(c, o, peer));
            o->st = OUT_PROOF;
            o->done = 0;
        }
    }
    if (o->st == OUT_PROOF) {
        int k = send_rest(o->fd, o->buf, PROOF_SIZE, &o->done);
        if (k < 0)
            return k;
        if (k)
            o->st = OUT_DONE;
    }
    return 0;
}

/* The acceptor's half for a complete hello of our epoch: check the ranks it names, then send
 * our nonce and proof. Returns 0 or a negative errno to refuse with. */
static int pending_challenge(struct mig_comm *c, struct tcp_comm *tc, struct pending *p,
                             const char **ret_why) {
    struct hello h;
    unsigned char b[ACK_SIZE], proof[MAC_SIZE];
    hello_decode(p->hello, &h);
    if (h.to != (uint32_t)c->rank || h.nranks != (uint32_t)c->nranks ||
        h.from >= (uint32_t)c->rank || tc->conns[h.from].fd >= 0) {
        *ret_why = "hello names ranks that are not waited for";
        return -EPROTO;
    }
    if ((h.flags & HELLO_KEYED) != (c->keyed ? HELLO_KEYED : 0u)) {
        *ret_why = c->keyed ? "hello without a secret" : "keyed hello to an unkeyed comm";
        return -EACCES;
    }
    if ((h.flags & HELLO_TLS) != (hello_flags(c) & HELLO_TLS)) {
        *ret_why = c->tls ? "hello without TLS" : "TLS hello to a plaintext comm";
        return -EACCES;
    }
    if (RAND_bytes(p->nonce, NONCE_SIZE) != 1 || proof_mac(c, 'S', &h, p->nonce, proof) < 0) {
        *ret_why = "crypto library failure";
        return -EIO;
    }
    ack_encode(b, 0, h.epoch, p->nonce, proof);
    /* A fresh socket's send buffer always has room for the answer. */
    if (send(p->fd, b, ACK_SIZE, MSG_NOSIGNAL | MSG_DONTWAIT) != ACK_SIZE) {
        *ret_why = "closed before its challenge";
        return -EIO;
    }
    p->st = PEND_PROOF;
    p->got = 0;
    return 0;
}

/* The dialler's proof arrived: adopt the connection when it is right. */
static int pending_adopt(struct mig_comm *c, struct tcp_comm *tc, struct pending *p,
                         const char **ret_why) {
    struct hello h;
    unsigned char want[MAC_SIZE];
    hello_decode(p->hello, &h);
    if (get32(p->proof) != PROOF_MAGIC || proof_mac(c, 'C', &h, p->nonce, want) < 0 ||
        CRYPTO_memcmp(want, p->proof + 8, MAC_SIZE) != 0) {
        *ret_why = "bad proof";
        return -EACCES;
    }
    if (tc->conns[h.from].fd >= 0) {
        *ret_why = "a second connection for an adopted rank";
        return -EPROTO;
    }
    TRY(proof_mac(c, 'K', &h, p->nonce, tc->conns[h.from].skey));
    tc->conns[h.from].fd = p->fd;
    return 0;
}

/* Whether pending p is a connection of c's epoch and channel (its hello is complete). */
static bool pending_ours(const struct mig_comm *c, const struct pending *p) {
    return get64(p->hello + 8) == c->epoch && hello_chan(get32(p->hello + 28)) == chan(c);
}

/* Looks at every complete hello and proof buffered on ep: challenges hellos of our epoch and
 * channel, adopts the connections we challenged once proven, rejects stale ones (older than
 * the endpoint's current epoch: a comm built ahead leaves the current epoch's to its side
 * channel), refuses (and records) the rest. */
static int pending_scan(struct mig_comm *c, struct tcp_comm *tc) {
    struct mig_endpoint *ep = c->ep;
    for (size_t i = 0; i < ep->npend;) {
        struct pending *p = &ep->pend[i];
        const char *why = NULL;
        if (p->st == PEND_PROOF) {
            if (p->got < PROOF_SIZE || !pending_ours(c, p)) {
                i++; /* not all here, or challenged by the other build */
                continue;
            }
            if (pending_adopt(c, tc, p, &why) < 0) {
                pending_refuse(ep, i, 0, why);
                continue;
            }
            ep->pend[i] = ep->pend[--ep->npend];
            continue;
        }
        if (p->got < HELLO_SIZE) {
            i++;
            continue;
        }
        uint64_t epoch = get64(p->hello + 8);
        if (epoch < ep->min_epoch) {
            st_log(ST_LOG_INFO, "migrate", "rank %d: rejecting rank %u of stale epoch %llu "
                   "(now %llu)", c->rank, get32(p->hello + 16), (unsigned long long)epoch,
                   (unsigned long long)c->epoch);
            pending_refuse(ep, i, -ESTALE, NULL);
            continue;
        }
        if (!pending_ours(c, p)) {
            i++; /* for a later mig_comm_new, the epoch's other channel, or the current
                    epoch's side channel while we build ahead */
            continue;
        }
        int status = pending_challenge(c, tc, p, &why);
        if (status < 0) {
            pending_refuse(ep, i, status, why);
            continue;
        }
        i++;
    }
    return 0;
}

static void tcp_fini(struct mig_comm *c) {
    struct tcp_comm *tc = c->priv;
    if (!tc)
        return;
    if (tc->conns)
        for (int i = 0; i < c->nranks; i++) {
            if (tc->conns[i].fd >= 0)
                close(tc->conns[i].fd);
            EVP_MAC_CTX_free(tc->conns[i].tx);
            EVP_MAC_CTX_free(tc->conns[i].rx);
            SSL_free(tc->conns[i].ssl); /* leaves fd open: SSL_set_fd does not pass ownership */
            if (tc->conns[i].stage)
                mig__wipe(tc->conns[i].stage, HDR_SIZE + TLS_COALESCE);
            st_free(tc->conns[i].stage);
            mig__wipe(tc->conns[i].skey, MAC_SIZE);
        }
    SSL_CTX_free(tc->ctx);
    st_free(tc->conns);
    st_free(tc);
    c->priv = NULL;
}

static int tcp_init(struct mig_comm *c, const char *const *peer_addrs) {
    struct mig_endpoint *ep = c->ep;
    struct outgoing *out = NULL;
    struct pollfd *pfd = NULL;
    struct tcp_comm *tc;
    int r = 0;

    if (!ep && c->nranks > 1)
        return -EINVAL;
    if (ep) {
        pthread_mutex_lock(&ep->lock);
        bool stale = ep->any_epoch && c->epoch < ep->min_epoch;
        pthread_mutex_unlock(&ep->lock);
        if (stale)
            return -ESTALE;
    }
    tc = st_calloc(1, sizeof(*tc));
    if (!tc)
        return -ENOMEM;
    c->priv = tc;
    tc->conns = st_calloc((size_t)c->nranks, sizeof(*tc->conns));
    if (!tc->conns)
        return -ENOMEM;
    for (int i = 0; i < c->nranks; i++)
        tc->conns[i].fd = -1; /* before anything can fail: tcp_fini closes what is >= 0 */
    out = st_calloc((size_t)c->nranks, sizeof(*out));
    pfd = st_calloc((size_t)c->nranks + MAX_PENDING + 1, sizeof(*pfd));
    if (!out || !pfd) {
        r = -ENOMEM;
        goto out;
    }
    for (int i = 0; i < c->nranks; i++)
        out[i].fd = -1;
    if (c->nranks == 1)
        goto out; /* nothing to connect; no endpoint needed */
    pthread_mutex_lock(&ep->lock);
    /* A side channel comes after its epoch's main comm; one built ahead leaves the current
     * epoch current until mig_comm_enter(). */
    if (!ep->any_epoch || (!c->ahead && c->epoch > ep->min_epoch))
        ep->min_epoch = c->epoch;
    ep->any_epoch = true;
    pthread_mutex_unlock(&ep->lock);
    for (int j = c->rank + 1; j < c->nranks; j++) {
        if (!peer_addrs[j] || parse_addr(peer_addrs[j], &out[j].addr) < 0) {
            st_log(ST_LOG_ERR, "migrate", "rank %d: bad address '%s' for rank %d", c->rank,
                   peer_addrs[j] ? peer_addrs[j] : "(null)", j);
            r = -EINVAL;
            goto out;
        }
        out[j].peer = peer_addrs[j];
        TRY_GOTO(out_start(&out[j]), r, out);
    }

    double deadline = st_now() + c->timeout_s;
    for (;;) {
        if (atomic_load(&c->cancelled) || (c->stop && atomic_load(c->stop))) {
            r = -ECANCELED;
            goto out;
        }
        /* Not a side channel: its epoch still runs when a live migration is ordered ahead
         * (a move channel is built at its epoch's boundary, like the main one). */
        if (!c->side && c->epoch < atomic_load(&ep->abandon_below)) {
            st_log(ST_LOG_WARN, "migrate", "rank %d: epoch %llu: abandoned while connecting (the "
                   "coordinator moved on to epoch %llu)", c->rank, (unsigned long long)c->epoch,
                   (unsigned long long)atomic_load(&ep->abandon_below));
            r = -ECANCELED;
            goto out;
        }
        pthread_mutex_lock(&ep->lock);
        listener_progress(ep);
        r = pending_scan(c, tc);
        pthread_mutex_unlock(&ep->lock);
        if (r < 0)
            goto out;
        bool all = true;
        for (int j = c->rank + 1; j < c->nranks; j++) {
            TRY_GOTO(out_progress(c, &out[j], j), r, out);
            if (out[j].st != OUT_DONE)
                all = false;
        }
        for (int j = 0; j < c->rank; j++)
            if (tc->conns[j].fd < 0)
                all = false;
        if (all)
            break;
        if (st_now() >= deadline) {
            int missing = -1;
            for (int j = 0; j < c->nranks && missing < 0; j++)
                if (j != c->rank && tc->conns[j].fd < 0 && (j < c->rank || out[j].st != OUT_DONE))
                    missing = j;
            st_log(ST_LOG_ERR, "migrate", "rank %d: epoch %llu: rank %d did not connect within "
                   "%.3g s", c->rank, (unsigned long long)c->epoch, missing, c->timeout_s);
            r = -ETIMEDOUT;
            goto out;
        }
        /* Wait for anything: the listener, partial hellos and proofs, our connects and acks. */
        nfds_t np = 0;
        double wake = deadline;
        pfd[np++] = (struct pollfd){.fd = ep->fd, .events = POLLIN};
        /* The other build may close one of these before we poll: poll then says POLLNVAL (or
         * a new socket on the same number wakes us), and the next round looks again. */
        pthread_mutex_lock(&ep->lock);
        for (size_t i = 0; i < ep->npend; i++)
            if (ep->pend[i].st == PEND_PROOF || ep->pend[i].got < HELLO_SIZE)
                pfd[np++] = (struct pollfd){.fd = ep->pend[i].fd, .events = POLLIN};
        pthread_mutex_unlock(&ep->lock);
        for (int j = c->rank + 1; j < c->nranks; j++) {
            if (out[j].st == OUT_CONNECTING || out[j].st == OUT_HELLO || out[j].st == OUT_PROOF)
                pfd[np++] = (struct pollfd){.fd = out[j].fd, .events = POLLOUT};
            else if (out[j].st == OUT_ACK)
                pfd[np++] = (struct pollfd){.fd = out[j].fd, .events = POLLIN};
            else if (out[j].st == OUT_IDLE && out[j].retry_at < wake)
                wake = out[j].retry_at;
        }
        if (poll(pfd, np, ST_MIN(ms_until(wake), ABANDON_POLL_MS)) < 0 && errno != EINTR) {
            r = -errno;
            goto out;
        }
    }
    for (int j = c->rank + 1; j < c->nranks; j++) {
        tc->conns[j].fd = out[j].fd;
        memcpy(tc->conns[j].skey, out[j].skey, MAC_SIZE);
        out[j].fd = -1;
    }
    for (int j = 0; j < c->nranks; j++) {
        struct conn *cn = &tc->conns[j];
        if (cn->fd < 0)
            continue;
        set_nodelay(cn->fd);
        if (c->keyed && !c->tls &&
            (!(cn->tx = mac_new(cn->skey)) || !(cn->rx = mac_new(cn->skey)))) {
            r = -EIO;
            goto out;
        }
    }
    if (c->tls)
        TRY_GOTO(tls_start(c, tc, pfd), r, out);
    pthread_mutex_lock(&ep->lock);
    ep->built[chan(c)] = true;
    ep->built_epoch[chan(c)] = c->epoch;
    pthread_mutex_unlock(&ep->lock);
out:
    if (ep && c->nranks > 1) {
        /* Connections we challenged that never proved themselves: strangers, or peers of an
         * attempt that is over either way. */
        pthread_mutex_lock(&ep->lock);
        for (size_t i = 0; i < ep->npend;) {
            if (ep->pend[i].st == PEND_PROOF && pending_ours(c, &ep->pend[i]))
                pending_refuse(ep, i, 0, "no proof before the epoch was built");
            else
                i++;
        }
        pthread_mutex_unlock(&ep->lock);
    }
    if (out)
        for (int j = 0; j < c->nranks; j++) {
            if (out[j].fd >= 0)
                close(out[j].fd);
            mig__wipe(out[j].skey, MAC_SIZE);
        }
    st_free(out);
    st_free(pfd);
    return r;
}

/* ---- data movement ---------------------------------------------------------------------- */

struct opstate {
    size_t done;              /* payload bytes moved */
    size_t hdone;             /* header bytes moved */
    size_t tdone;             /* MAC trailer bytes moved (keyed comms) */
    bool tmade;               /* the trailer is computed (the MAC context is finalised) */
    int next;                 /* next op index with the same (peer, direction), or -1 */
    bool finished;
    unsigned char hdr[HDR_SIZE];
    unsigned char trailer[TAG_SIZE];
};

/* Bytes of MAC trailer each message carries on c. */
static size_t trailer_size(const struct mig_comm *c) {
    return c->keyed && !c->tls ? TAG_SIZE : 0; /* TLS records carry their own tags */
}

static void hdr_encode(unsigned char *b, uint64_t epoch, uint64_t seq, uint64_t len) {
    put32(b, DATA_MAGIC);
    put32(b + 4, 0);
    put64(b + 8, epoch);
    put64(b + 16, seq);
    put64(b + 24, len);
}

/* A received header must name our epoch, the next sequence number and the posted size. */
static int hdr_check(const struct mig_comm *c, int peer, const struct conn *cn,
                     const struct mig_op *op, const unsigned char *hdr) {
    uint64_t ep = get64(hdr + 8), seq = get64(hdr + 16), len = get64(hdr + 24);
    if (get32(hdr) != DATA_MAGIC || ep != c->epoch || seq != cn->recv_seq || len != op->bytes) {
        st_log(ST_LOG_ERR, "migrate", "rank %d: message from rank %d does not match: "
               "epoch %llu seq %llu len %llu, expected epoch %llu seq %llu len %zu",
               c->rank, peer, (unsigned long long)ep, (unsigned long long)seq,
               (unsigned long long)len, (unsigned long long)c->epoch,
               (unsigned long long)cn->recv_seq, op->bytes);
        return -EPROTO;
    }
    return 0;
}

/* send_some on a TLS comm: the header with a small payload in one record, or the header and
 * then the payload in SSL_write_ex calls of at most CHUNK_BYTES; then a flush of the write
 * buffer, after which the message is finished. A call that would block is retried later with
 * the same bytes (OpenSSL keeps the records it already made), a flush that would block is
 * retried as it is; WANT_READ too, although TLS 1.3 without tickets or key updates never asks
 * for it when writing. Returns the bytes that reached the socket (records, not payload) or a
 * negative errno. */
static ssize_t tls_send_some(struct mig_comm *c, int peer, struct conn *cn, struct mig_op *op,
                             struct opstate *s, bool *ret_short) {
    BIO *wb = SSL_get_wbio(cn->ssl), *sb = BIO_next(wb);
    uint64_t w0 = BIO_number_written(sb);
    while (!(s->hdone == HDR_SIZE && s->done == op->bytes)) {
        const void *p;
        size_t want, n = 0;
        bool small = false;
        if (s->hdone < HDR_SIZE) {
            hdr_encode(s->hdr, c->epoch, cn->send_seq, op->bytes);
            small = op->bytes <= TLS_COALESCE;
            if (small) {
                memcpy(cn->stage, s->hdr, HDR_SIZE);
                if (op->bytes)
                    memcpy(cn->stage + HDR_SIZE, op->buf, op->bytes);
            }
            p = small ? cn->stage : s->hdr;
            want = HDR_SIZE + (small ? op->bytes : 0);
        } else {
            p = (const char *)op->buf + s->done;
            want = ST_MIN(op->bytes - s->done, (size_t)CHUNK_BYTES);
        }
        ERR_clear_error();
        if (SSL_write_ex(cn->ssl, p, want, &n) != 1) {
            int e = SSL_get_error(cn->ssl, 0);
            if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
                *ret_short = true;
                break;
            }
            return tls_errno(c, peer, e, "send");
        }
        if (s->hdone < HDR_SIZE) {
            s->hdone = HDR_SIZE;
            if (small) {
                s->done = op->bytes;
                c->sent += op->bytes;
            }
        } else {
            s->done += n;
            c->sent += n;
        }
    }
    if (s->hdone == HDR_SIZE && s->done == op->bytes) {
        /* The message's last records may sit in the write buffer: out before it counts. */
        if (BIO_flush(wb) == 1) {
            s->finished = true;
            cn->send_seq++;
        } else if (BIO_should_retry(wb)) {
            *ret_short = true;
        } else {
            return tls_errno(c, peer, SSL_ERROR_SYSCALL, "send");
        }
    }
    return (ssize_t)(BIO_number_written(sb) - w0);
}

/* recv_some on a TLS comm. SSL_read_ex returns at most one record, so a read shorter than
 * asked is no reason to poll: only WANT_READ is (nothing buffered in OpenSSL or the socket). */
static ssize_t tls_recv_some(struct mig_comm *c, int peer, struct conn *cn, struct mig_op *op,
                             struct opstate *s, bool *ret_short) {
    BIO *rb = SSL_get_rbio(cn->ssl);
    uint64_t r0 = BIO_number_read(rb);
    while (!(s->hdone == HDR_SIZE && s->done == op->bytes)) {
        void *p;
        size_t want, n = 0;
        if (s->hdone < HDR_SIZE) {
            p = s->hdr + s->hdone;
            want = HDR_SIZE - s->hdone;
        } else {
            p = (char *)op->buf + s->done;
            want = ST_MIN(op->bytes - s->done, (size_t)CHUNK_BYTES);
        }
        ERR_clear_error();
        if (SSL_read_ex(cn->ssl, p, want, &n) != 1) {
            int e = SSL_get_error(cn->ssl, 0);
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
                *ret_short = true;
                break;
            }
            return tls_errno(c, peer, e, "receive");
        }
        if (s->hdone < HDR_SIZE) {
            s->hdone += n;
            if (s->hdone == HDR_SIZE)
                TRY(hdr_check(c, peer, cn, op, s->hdr));
        } else {
            s->done += n;
            c->recvd += n;
        }
    }
    if (s->hdone == HDR_SIZE && s->done == op->bytes) {
        s->finished = true;
        cn->recv_seq++;
    }
    return (ssize_t)(BIO_number_read(rb) - r0);
}

/* Bytes per send()/recv() call of a payload on c. */
static size_t chunk_bytes(const struct mig_comm *c) {
    return trailer_size(c) ? MAC_CHUNK_BYTES : CHUNK_BYTES;
}

/* Moves bytes of a send op until it finishes or the socket takes less than offered; then
 * *ret_short is set (wait for POLLOUT before trying again). On a keyed comm the MAC covers
 * the payload as the socket accepts it and goes out as a trailer after it. Returns bytes moved
 * (>= 0) or a negative errno. */
static ssize_t send_some(struct mig_comm *c, int peer, struct conn *cn, struct mig_op *op,
                         struct opstate *s, bool *ret_short) {
    size_t moved = 0, tsize = trailer_size(c);
    for (;;) {
        struct iovec iov[3];
        int niov = 0;
        size_t offered = 0;
        if (s->hdone < HDR_SIZE) {
            if (s->hdone == 0) {
                hdr_encode(s->hdr, c->epoch, cn->send_seq, op->bytes);
                if (tsize && mac_begin(cn->tx, c->rank, peer, s->hdr) < 0)
                    return -EIO;
            }
            iov[niov++] = (struct iovec){s->hdr + s->hdone, HDR_SIZE - s->hdone};
            offered += HDR_SIZE - s->hdone;
        }
        size_t chunk = ST_MIN(op->bytes - s->done, chunk_bytes(c));
        if (chunk)
            iov[niov++] = (struct iovec){(char *)op->buf + s->done, chunk};
        offered += chunk;
        if (tsize && s->done == op->bytes) {
            /* Once: a write that took none of the trailer (EAGAIN, or a short write that ended
             * with the payload) comes back here, and a finalised context fails a second time. */
            if (!s->tmade && mac_final(cn->tx, s->trailer) < 0)
                return -EIO;
            s->tmade = true;
            iov[niov++] = (struct iovec){s->trailer + s->tdone, tsize - s->tdone};
            offered += tsize - s->tdone;
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t w = sendmsg(cn->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                *ret_short = true;
                break;
            }
            return io_errno(errno);
        }
        size_t n = (size_t)w;
        if (s->hdone < HDR_SIZE) {
            size_t h = ST_MIN(n, HDR_SIZE - s->hdone);
            s->hdone += h;
            n -= h;
        }
        size_t pay = ST_MIN(n, op->bytes - s->done);
        if (tsize && mac_update(cn->tx, (char *)op->buf + s->done, pay) < 0)
            return -EIO;
        s->done += pay;
        c->sent += pay;
        n -= pay;
        s->tdone += n;
        moved += (size_t)w;
        if (s->hdone == HDR_SIZE && s->done == op->bytes && s->tdone == tsize) {
            s->finished = true;
            cn->send_seq++;
            break;
        }
        if ((size_t)w < offered) {
            *ret_short = true; /* the socket buffer is full: poll before the next try */
            break;
        }
    }
    return (ssize_t)moved;
}

/* The receiving twin of send_some: reads the header exactly, checks it against what was
 * posted (-EPROTO), then the payload, then (keyed) the trailer, which must equal the MAC of
 * what arrived (-EBADMSG: altered in transit; the op never finishes, so no caller uses the
 * buffer). A read that returns less than asked sets *ret_short. */
static ssize_t recv_some(struct mig_comm *c, int peer, struct conn *cn, struct mig_op *op,
                         struct opstate *s, bool *ret_short) {
    size_t moved = 0, tsize = trailer_size(c);
    for (;;) {
        ssize_t g;
        size_t want;
        if (s->hdone < HDR_SIZE) {
            want = HDR_SIZE - s->hdone;
            g = recv(cn->fd, s->hdr + s->hdone, want, MSG_DONTWAIT);
        } else if (s->done < op->bytes) {
            want = ST_MIN(op->bytes - s->done, chunk_bytes(c));
            g = recv(cn->fd, (char *)op->buf + s->done, want, MSG_DONTWAIT);
        } else {
            want = tsize - s->tdone;
            g = recv(cn->fd, s->trailer + s->tdone, want, MSG_DONTWAIT);
        }
        if (g == 0)
            return -ECONNRESET;
        if (g < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                *ret_short = true;
                break;
            }
            return io_errno(errno);
        }
        moved += (size_t)g;
        if (s->hdone < HDR_SIZE) {
            s->hdone += (size_t)g;
            if (s->hdone == HDR_SIZE) {
                TRY(hdr_check(c, peer, cn, op, s->hdr));
                if (tsize && mac_begin(cn->rx, peer, c->rank, s->hdr) < 0)
                    return -EIO;
            }
        } else if (s->done < op->bytes) {
            if (tsize && mac_update(cn->rx, (char *)op->buf + s->done, (size_t)g) < 0)
                return -EIO;
            s->done += (size_t)g;
            c->recvd += (size_t)g;
        } else {
            s->tdone += (size_t)g;
            if (s->tdone == tsize) {
                unsigned char want_mac[TAG_SIZE];
                if (mac_final(cn->rx, want_mac) < 0)
                    return -EIO;
                if (CRYPTO_memcmp(want_mac, s->trailer, TAG_SIZE) != 0) {
                    st_log(ST_LOG_ERR, "migrate", "rank %d: epoch %llu: message %llu from rank "
                           "%d (%zu bytes) fails its MAC: altered in transit",
                           c->rank, (unsigned long long)c->epoch,
                           (unsigned long long)cn->recv_seq, peer, op->bytes);
                    return -EBADMSG;
                }
            }
        }
        if (s->hdone == HDR_SIZE && s->done == op->bytes && s->tdone == tsize) {
            s->finished = true;
            cn->recv_seq++;
            break;
        }
        if ((size_t)g < want) {
            *ret_short = true; /* drained: poll before the next try */
            break;
        }
    }
    return (ssize_t)moved;
}

/* Ends a connection for the rest of the epoch: later batches that use it fail with err (the
 * first error sticks), and the socket is closed, not only shut down: a peer blocked on our
 * full buffer sends no new data past a shutdown, only zero-window probes, and would probe for
 * ever; a close with unread data resets it (found by test_side_cut, loaded). */
static void conn_end(struct conn *cn, int err) {
    if (!cn->err)
        cn->err = err;
    if (cn->fd >= 0) {
        close(cn->fd);
        cn->fd = -1;
    }
}

/* The one poll loop of every data-plane call. Queues: one per (peer, direction), ops in array
 * order. A queue is tried while it is "ready" and parked after a short read or write until poll
 * reports its socket, so a busy stream costs one syscall per wakeup plus one poll for all. */
/* mig_execute_cut_at(): the header and at most half (up to 4 KiB) of op's payload go out,
 * then the connection is shut down both ways, mid-message, as a failing network would leave
 * it. The peer reads a short message and then the end of the stream. */
static int cut_mid_message(struct mig_comm *c, struct conn *cn, const struct mig_op *op) {
    unsigned char hdr[HDR_SIZE];
    size_t done = 0, half = ST_MIN(op->bytes / 2, (size_t)4096);
    hdr_encode(hdr, c->epoch, cn->send_seq, op->bytes);
    /* TLS: plaintext bytes would read as a forged record; the cut alone is the fault. */
    if (!c->tls && send_rest(cn->fd, hdr, HDR_SIZE, &done) > 0 && half > 0) {
        done = 0;
        (void)send_rest(cn->fd, op->buf, half, &done);
    }
    (void)shutdown(cn->fd, SHUT_RDWR);
    st_log(ST_LOG_WARN, "migrate", "rank %d: epoch %llu: the test hook cut the connection to "
           "rank %d mid-message", c->rank, (unsigned long long)c->epoch, op->peer);
    return -ECONNRESET;
}

/* mig_side_cut_at() and mig_move_cut_at(): the batch to cut, and the sending batches on such
 * channels counted since it was armed (when each starts, whether or not it gets to send). */
struct cut_hook {
    long at, count;
};
static struct cut_hook side_cut, move_cut;

static void cut_arm(struct cut_hook *h, long n) {
    __atomic_store_n(&h->count, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&h->at, n, __ATOMIC_SEQ_CST);
}

/* Whether the batch ops[0..n) is the one h cuts. */
static bool cut_due(struct cut_hook *h, const struct mig_op *ops, size_t n) {
    if (__atomic_load_n(&h->at, __ATOMIC_SEQ_CST) <= 0)
        return false;
    bool sends = false;
    for (size_t i = 0; i < n && !sends; i++)
        sends = ops[i].send;
    return sends && __atomic_add_fetch(&h->count, 1, __ATOMIC_SEQ_CST) ==
                        __atomic_load_n(&h->at, __ATOMIC_SEQ_CST);
}

/* See migrate-execute.h. */
void mig_side_cut_at(long n) {
    cut_arm(&side_cut, n);
}

/* See migrate-execute.h. */
void mig_move_cut_at(long n) {
    cut_arm(&move_cut, n);
}

static int tcp_batch(struct mig_comm *c, struct mig_op *ops, size_t n) {
    struct tcp_comm *tc = c->priv;
    if ((c->side && cut_due(&side_cut, ops, n)) || (c->move && cut_due(&move_cut, ops, n)))
        c->cut_send = true; /* the first send below is cut */
    int nr = c->nranks, r = 0;
    size_t left = 0;

    /* One block: op states; per queue head, tail, ready; poll set and its peers. */
    size_t sz = n * sizeof(struct opstate) + 2 * (size_t)nr * (2 * sizeof(int) + sizeof(bool)) +
                (size_t)nr * (sizeof(struct pollfd) + sizeof(int)) + 16;
    char *mem = st_malloc(sz);
    if (!mem)
        return -ENOMEM;
    struct opstate *st = (struct opstate *)(void *)mem;
    int *head = (int *)(void *)(st + n); /* [2*nr]: head[2p] send, head[2p+1] recv */
    int *tail = head + 2 * nr;           /* [2*nr] */
    struct pollfd *pfd = (struct pollfd *)(void *)(tail + 2 * nr);
    int *pfd_peer = (int *)(void *)(pfd + nr);
    bool *ready = (bool *)(void *)(pfd_peer + nr); /* [2*nr] */
    for (int i = 0; i < 2 * nr; i++) {
        head[i] = tail[i] = -1;
        ready[i] = true;
    }
    for (size_t i = 0; i < n; i++) {
        int q = 2 * ops[i].peer + (ops[i].send ? 0 : 1);
        memset(&st[i], 0, offsetof(struct opstate, hdr));
        st[i].next = -1;
        if (tail[q] >= 0)
            st[tail[q]].next = (int)i;
        else
            head[q] = (int)i;
        tail[q] = (int)i;
        left++;
    }
    for (int p = 0; p < nr; p++)
        if ((head[2 * p] >= 0 || head[2 * p + 1] >= 0) && tc->conns[p].err) {
            r = tc->conns[p].err;
            goto out;
        }

    /* Until we hear from a peer, an early rank's longer wait (mig_comm_set_first_wait). */
    bool heard = atomic_load(&c->heard_at) > 0;
    double limit = c->first_wait > 0 && !heard ? c->first_wait : c->timeout_s;
    double deadline = st_now() + limit;
    while (left) {
        bool progress = false, any_ready = false;
        if (atomic_load_explicit(&c->cancelled, memory_order_relaxed)) {
            r = -ECANCELED;
            goto out;
        }
        for (int q = 0; q < 2 * nr; q++) {
            int i = head[q], p = q / 2;
            if (i < 0 || !ready[q])
                continue;
            bool short_io = false;
            if (c->cut_send && q % 2 == 0 && st[i].hdone == 0) {
                c->cut_send = false;
                r = cut_mid_message(c, &tc->conns[p], &ops[i]);
                goto out;
            }
            ssize_t m;
            if (c->tls)
                m = q % 2 == 0 ? tls_send_some(c, p, &tc->conns[p], &ops[i], &st[i], &short_io)
                               : tls_recv_some(c, p, &tc->conns[p], &ops[i], &st[i], &short_io);
            else
                m = q % 2 == 0 ? send_some(c, p, &tc->conns[p], &ops[i], &st[i], &short_io)
                               : recv_some(c, p, &tc->conns[p], &ops[i], &st[i], &short_io);
            if (m < 0) {
                r = (int)m;
                goto out;
            }
            if (m > 0)
                progress = true;
            if (m > 0 && q % 2 == 1 && !heard) {
                heard = true;
                atomic_store(&c->heard_at, st_now());
                limit = c->timeout_s;
            }
            if (st[i].finished) {
                head[q] = st[i].next;
                left--;
                progress = true;
            }
            if (short_io)
                ready[q] = false;
            else if (head[q] >= 0)
                any_ready = true;
        }
        if (!left)
            break;
        if (progress)
            deadline = st_now() + limit;
        if (any_ready)
            continue;
        if (st_now() >= deadline) {
            st_log(ST_LOG_ERR, "migrate", "rank %d: epoch %llu: no progress for %.3g s",
                   c->rank, (unsigned long long)c->epoch, limit);
            r = -ETIMEDOUT;
            goto out;
        }
        nfds_t np = 0;
        for (int p = 0; p < nr; p++) {
            short ev = (short)((head[2 * p] >= 0 ? POLLOUT : 0) |
                               (head[2 * p + 1] >= 0 ? POLLIN : 0));
            if (ev) {
                pfd_peer[np] = p;
                pfd[np++] = (struct pollfd){.fd = tc->conns[p].fd, .events = ev};
            }
        }
        int pr = poll(pfd, np, ST_MIN(ms_until(deadline), ABANDON_POLL_MS)); /* see cancelled */
        if (pr < 0 && errno != EINTR) {
            r = -errno;
            goto out;
        }
        for (nfds_t k = 0; pr > 0 && k < np; k++) {
            short re = pfd[k].revents;
            int p = pfd_peer[k];
            /* Errors and hang-ups wake both directions: the next try reports them. */
            if (re & (POLLOUT | POLLERR | POLLHUP))
                ready[2 * p] = true;
            if (re & (POLLIN | POLLERR | POLLHUP | POLLRDHUP))
                ready[2 * p + 1] = true;
        }
    }
out:
    if (r < 0)
        /* Streams with unfinished messages are out of step for the rest of the epoch, and
         * their peers are told at once rather than left to their own no-progress timeout: a
         * peer still sending to us stalls once our socket buffer is full, and on a side
         * channel, where a failed exchange does not end the epoch, that peer's training
         * would wait for it (found by run-peer-cut under load): conn_end. A cancel leaves
         * them open: its peers are ending the epoch too, and cancel themselves. */
        for (int p = 0; p < nr; p++)
            for (int d = 0; d < 2; d++)
                if (head[2 * p + d] >= 0 && !tc->conns[p].err) {
                    if (r == -ECANCELED)
                        tc->conns[p].err = r;
                    else
                        conn_end(&tc->conns[p], r);
                }
    st_free(mem);
    return r;
}

/* mig_comm_shut: every connection ended now (conn_end), our own later batches told so. */
static void tcp_shut(struct mig_comm *c) {
    struct tcp_comm *tc = c->priv;
    for (int p = 0; p < c->nranks; p++)
        if (p != c->rank)
            conn_end(&tc->conns[p], -ECONNABORTED);
}

const struct mig_transport_ops mig__tcp_ops = {
    .name = "tcp",
    .init = tcp_init,
    .fini = tcp_fini,
    .batch = tcp_batch,
    .shut = tcp_shut,
};
