/* tcp.c: the TCP transport — endpoints (listening sockets that live across epochs), the
 * per-epoch connection handshake, and the poll-driven batch that moves every message.
 *
 * The one idea: no threads. Every call runs one poll loop over the sockets it needs, with
 * non-blocking sockets and a no-progress deadline, so a dead or absent peer is an error
 * (-ECONNRESET, -ETIMEDOUT) returned to the caller, never a hang or a SIGPIPE (MSG_NOSIGNAL).
 * Connections a peer opens for an epoch we have not reached yet are accepted when we next
 * look at the listener and buffered on the endpoint by epoch until our mig_comm_new() of that
 * epoch; connections of an older epoch are answered with a rejection. Every message carries a
 * header (magic, epoch, sequence number, length), so a receiver that posted another size, or
 * bytes of another epoch, get -EPROTO instead of silently mixed data. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "check.h" /* TRY_GOTO */
#include "migrate-internal.h"

#define HELLO_MAGIC 0x484d5453u /* "STMH" */
#define ACK_MAGIC 0x414d5453u   /* "STMA" */
#define DATA_MAGIC 0x444d5453u  /* "STMD" */
#define PROTO_VERSION 1u
#define HELLO_SIZE 32
#define ACK_SIZE 16
#define HDR_SIZE 32
#define CHUNK_BYTES (4u << 20)  /* at most this much per send()/recv() call */
#define MAX_PENDING 256         /* early connections buffered on an endpoint */
#define CONNECT_RETRY_S 0.05    /* a refused connect is retried after this long */

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
};

static void hello_encode(unsigned char *b, const struct hello *h) {
    memset(b, 0, HELLO_SIZE);
    put32(b, HELLO_MAGIC);
    put32(b + 4, PROTO_VERSION);
    put64(b + 8, h->epoch);
    put32(b + 16, h->from);
    put32(b + 20, h->to);
    put32(b + 24, h->nranks);
}

/* Returns 0 or -EPROTO for a foreign or other-version hello. */
static int hello_decode(const unsigned char *b, struct hello *ret) {
    if (get32(b) != HELLO_MAGIC || get32(b + 4) != PROTO_VERSION)
        return -EPROTO;
    ret->epoch = get64(b + 8);
    ret->from = get32(b + 16);
    ret->to = get32(b + 20);
    ret->nranks = get32(b + 24);
    return 0;
}

static void ack_encode(unsigned char *b, int status, uint64_t epoch) {
    put32(b, ACK_MAGIC);
    put32(b + 4, (uint32_t)status);
    put64(b + 8, epoch);
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

/* ---- endpoints ----------------------------------------------------------------------- */

/* An accepted connection whose hello is incomplete, or complete for a future epoch. */
struct pending {
    int fd;
    size_t got;
    unsigned char hello[HELLO_SIZE];
};

struct mig_endpoint {
    int fd;
    int port;
    char addr[MIG_ADDR_MAX];
    uint64_t min_epoch; /* epochs below this are stale (highest epoch built so far) */
    bool any_epoch;     /* false until the first comm */
    struct pending pend[MAX_PENDING];
    size_t npend;
};

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
    st_free(ep);
    return NULL;
}

static void pending_drop(struct mig_endpoint *ep, size_t i) {
    close(ep->pend[i].fd);
    ep->pend[i] = ep->pend[--ep->npend];
}

/* ---- communicator setup ---------------------------------------------------------------- */

struct conn {
    int fd;
    int err;            /* sticky error: the stream is unusable after it */
    uint64_t send_seq;  /* next sequence number we send */
    uint64_t recv_seq;  /* next sequence number we expect */
};

struct tcp_comm {
    struct conn *conns; /* nranks entries; conns[rank].fd = -1 */
};

/* State of an outgoing connection during setup. */
enum out_state { OUT_IDLE, OUT_CONNECTING, OUT_HELLO, OUT_ACK, OUT_DONE };
struct outgoing {
    enum out_state st;
    int fd;
    double retry_at;
    size_t done; /* bytes of hello sent / ack received */
    unsigned char buf[HELLO_SIZE];
    struct sockaddr_in addr;
};

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
            struct hello h = {c->epoch, (uint32_t)c->rank, (uint32_t)peer, (uint32_t)c->nranks};
            hello_encode(o->buf, &h);
        }
        ssize_t w = send(o->fd, o->buf + o->done, HELLO_SIZE - o->done, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return 0;
            return io_errno(errno);
        }
        o->done += (size_t)w;
        if (o->done == HELLO_SIZE) {
            o->st = OUT_ACK;
            o->done = 0;
        }
    }
    if (o->st == OUT_ACK) {
        ssize_t g = recv(o->fd, o->buf + o->done, ACK_SIZE - o->done, 0);
        if (g == 0)
            return -ECONNRESET;
        if (g < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return 0;
            return io_errno(errno);
        }
        o->done += (size_t)g;
        if (o->done == ACK_SIZE) {
            int status = (int)get32(o->buf + 4);
            if (get32(o->buf) != ACK_MAGIC || get64(o->buf + 8) != c->epoch)
                return -EPROTO;
            if (status < 0) {
                st_log(ST_LOG_WARN, "migrate", "rank %d: rank %d rejected our epoch %llu: %s",
                       c->rank, peer, (unsigned long long)c->epoch, st_strerror(status));
                return status;
            }
            o->st = OUT_DONE;
        }
    }
    return 0;
}

static int send_ack(int fd, int status, uint64_t epoch) {
    unsigned char b[ACK_SIZE];
    ack_encode(b, status, epoch);
    /* A fresh socket's send buffer always has room for 16 bytes. */
    ssize_t w = send(fd, b, ACK_SIZE, MSG_NOSIGNAL);
    return w == ACK_SIZE ? 0 : -EIO;
}

/* Looks at every complete hello buffered on ep: adopts those of our epoch, rejects stale
 * ones. Returns 0 or a fatal error. */
static int pending_scan(struct mig_comm *c, struct tcp_comm *tc) {
    struct mig_endpoint *ep = c->ep;
    for (size_t i = 0; i < ep->npend;) {
        struct pending *p = &ep->pend[i];
        struct hello h;
        if (p->got < HELLO_SIZE) {
            i++;
            continue;
        }
        if (hello_decode(p->hello, &h) < 0) {
            pending_drop(ep, i);
            continue;
        }
        if (h.epoch < c->epoch) {
            st_log(ST_LOG_INFO, "migrate", "rank %d: rejecting rank %u of stale epoch %llu "
                   "(now %llu)", c->rank, h.from, (unsigned long long)h.epoch,
                   (unsigned long long)c->epoch);
            (void)send_ack(p->fd, -ESTALE, h.epoch);
            pending_drop(ep, i);
            continue;
        }
        if (h.epoch > c->epoch) {
            i++; /* for a later mig_comm_new */
            continue;
        }
        int status = 0;
        if (h.to != (uint32_t)c->rank || h.nranks != (uint32_t)c->nranks ||
            h.from >= (uint32_t)c->rank || tc->conns[h.from].fd >= 0)
            status = -EPROTO;
        if (status < 0 || send_ack(p->fd, 0, h.epoch) < 0) {
            st_log(ST_LOG_WARN, "migrate", "rank %d: bad handshake from rank %u (to %u of %u), "
                   "ignoring", c->rank, h.from, h.to, h.nranks);
            if (status < 0)
                (void)send_ack(p->fd, status, h.epoch);
            pending_drop(ep, i);
            continue;
        }
        tc->conns[h.from].fd = p->fd;
        ep->pend[i] = ep->pend[--ep->npend];
    }
    return 0;
}

/* Accepts what is waiting on the listener and reads partial hellos. */
static void listener_progress(struct mig_endpoint *ep) {
    for (;;) {
        int fd = accept4(ep->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            break;
        if (ep->npend == MAX_PENDING) {
            st_log(ST_LOG_WARN, "migrate", "endpoint %s: too many early connections, "
                   "dropping one", ep->addr);
            close(fd);
            continue;
        }
        ep->pend[ep->npend++] = (struct pending){.fd = fd};
    }
    for (size_t i = 0; i < ep->npend;) {
        struct pending *p = &ep->pend[i];
        if (p->got < HELLO_SIZE) {
            ssize_t g = recv(p->fd, p->hello + p->got, HELLO_SIZE - p->got, 0);
            if (g == 0 || (g < 0 && errno != EAGAIN && errno != EINTR)) {
                pending_drop(ep, i);
                continue;
            }
            if (g > 0)
                p->got += (size_t)g;
        }
        i++;
    }
}

static void tcp_fini(struct mig_comm *c) {
    struct tcp_comm *tc = c->priv;
    if (!tc)
        return;
    if (tc->conns)
        for (int i = 0; i < c->nranks; i++)
            if (tc->conns[i].fd >= 0)
                close(tc->conns[i].fd);
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
    if (ep && ep->any_epoch && c->epoch < ep->min_epoch)
        return -ESTALE;
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
    ep->min_epoch = c->epoch;
    ep->any_epoch = true;
    for (int j = c->rank + 1; j < c->nranks; j++) {
        if (!peer_addrs[j] || parse_addr(peer_addrs[j], &out[j].addr) < 0) {
            st_log(ST_LOG_ERR, "migrate", "rank %d: bad address '%s' for rank %d", c->rank,
                   peer_addrs[j] ? peer_addrs[j] : "(null)", j);
            r = -EINVAL;
            goto out;
        }
        TRY_GOTO(out_start(&out[j]), r, out);
    }

    double deadline = st_now() + c->timeout_s;
    for (;;) {
        listener_progress(ep);
        TRY_GOTO(pending_scan(c, tc), r, out);
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
        /* Wait for anything: the listener, partial hellos, our connects and acks. */
        nfds_t np = 0;
        double wake = deadline;
        pfd[np++] = (struct pollfd){.fd = ep->fd, .events = POLLIN};
        for (size_t i = 0; i < ep->npend; i++)
            if (ep->pend[i].got < HELLO_SIZE)
                pfd[np++] = (struct pollfd){.fd = ep->pend[i].fd, .events = POLLIN};
        for (int j = c->rank + 1; j < c->nranks; j++) {
            if (out[j].st == OUT_CONNECTING || out[j].st == OUT_HELLO)
                pfd[np++] = (struct pollfd){.fd = out[j].fd, .events = POLLOUT};
            else if (out[j].st == OUT_ACK)
                pfd[np++] = (struct pollfd){.fd = out[j].fd, .events = POLLIN};
            else if (out[j].st == OUT_IDLE && out[j].retry_at < wake)
                wake = out[j].retry_at;
        }
        if (poll(pfd, np, ms_until(wake)) < 0 && errno != EINTR) {
            r = -errno;
            goto out;
        }
    }
    for (int j = c->rank + 1; j < c->nranks; j++) {
        tc->conns[j].fd = out[j].fd;
        out[j].fd = -1;
    }
    for (int j = 0; j < c->nranks; j++)
        if (tc->conns[j].fd >= 0)
            set_nodelay(tc->conns[j].fd);
out:
    if (out)
        for (int j = 0; j < c->nranks; j++)
            if (out[j].fd >= 0)
                close(out[j].fd);
    st_free(out);
    st_free(pfd);
    return r;
}

/* ---- data movement ---------------------------------------------------------------------- */

struct opstate {
    size_t done;              /* payload bytes moved */
    size_t hdone;             /* header bytes moved */
    int next;                 /* next op index with the same (peer, direction), or -1 */
    bool finished;
    unsigned char hdr[HDR_SIZE];
};

static void hdr_encode(unsigned char *b, uint64_t epoch, uint64_t seq, uint64_t len) {
    put32(b, DATA_MAGIC);
    put32(b + 4, 0);
    put64(b + 8, epoch);
    put64(b + 16, seq);
    put64(b + 24, len);
}

/* Moves bytes of a send op until it finishes or the socket takes less than offered; then
 * *ret_short is set (wait for POLLOUT before trying again). Returns bytes moved (>= 0) or a
 * negative errno. */
static ssize_t send_some(struct mig_comm *c, struct conn *cn, struct mig_op *op,
                         struct opstate *s, bool *ret_short) {
    size_t moved = 0;
    for (;;) {
        struct iovec iov[2];
        int niov = 0;
        size_t offered = 0;
        if (s->hdone < HDR_SIZE) {
            if (s->hdone == 0)
                hdr_encode(s->hdr, c->epoch, cn->send_seq, op->bytes);
            iov[niov++] = (struct iovec){s->hdr + s->hdone, HDR_SIZE - s->hdone};
            offered += HDR_SIZE - s->hdone;
        }
        size_t chunk = ST_MIN(op->bytes - s->done, (size_t)CHUNK_BYTES);
        if (chunk)
            iov[niov++] = (struct iovec){(char *)op->buf + s->done, chunk};
        offered += chunk;
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
        s->done += n;
        moved += (size_t)w;
        c->sent += n;
        if (s->hdone == HDR_SIZE && s->done == op->bytes) {
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
 * posted (-EPROTO), then the payload; a read that returns less than asked sets *ret_short. */
static ssize_t recv_some(struct mig_comm *c, int peer, struct conn *cn, struct mig_op *op,
                         struct opstate *s, bool *ret_short) {
    size_t moved = 0;
    for (;;) {
        ssize_t g;
        size_t want;
        if (s->hdone < HDR_SIZE) {
            want = HDR_SIZE - s->hdone;
            g = recv(cn->fd, s->hdr + s->hdone, want, MSG_DONTWAIT);
        } else {
            want = ST_MIN(op->bytes - s->done, (size_t)CHUNK_BYTES);
            g = recv(cn->fd, (char *)op->buf + s->done, want, MSG_DONTWAIT);
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
                uint64_t ep = get64(s->hdr + 8), seq = get64(s->hdr + 16);
                uint64_t len = get64(s->hdr + 24);
                if (get32(s->hdr) != DATA_MAGIC || ep != c->epoch || seq != cn->recv_seq ||
                    len != op->bytes) {
                    st_log(ST_LOG_ERR, "migrate", "rank %d: message from rank %d does not match: "
                           "epoch %llu seq %llu len %llu, expected epoch %llu seq %llu len %zu",
                           c->rank, peer, (unsigned long long)ep, (unsigned long long)seq,
                           (unsigned long long)len, (unsigned long long)c->epoch,
                           (unsigned long long)cn->recv_seq, op->bytes);
                    return -EPROTO;
                }
            }
        } else {
            s->done += (size_t)g;
            c->recvd += (size_t)g;
        }
        if (s->hdone == HDR_SIZE && s->done == op->bytes) {
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

/* The one poll loop of every data-plane call. Queues: one per (peer, direction), ops in array
 * order. A queue is tried while it is "ready" and parked after a short read or write until poll
 * reports its socket, so a busy stream costs one syscall per wakeup plus one poll for all. */
static int tcp_batch(struct mig_comm *c, struct mig_op *ops, size_t n) {
    struct tcp_comm *tc = c->priv;
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

    double deadline = st_now() + c->timeout_s;
    while (left) {
        bool progress = false, any_ready = false;
        for (int q = 0; q < 2 * nr; q++) {
            int i = head[q], p = q / 2;
            if (i < 0 || !ready[q])
                continue;
            bool short_io = false;
            ssize_t m = q % 2 == 0
                            ? send_some(c, &tc->conns[p], &ops[i], &st[i], &short_io)
                            : recv_some(c, p, &tc->conns[p], &ops[i], &st[i], &short_io);
            if (m < 0) {
                r = (int)m;
                goto out;
            }
            if (m > 0)
                progress = true;
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
            deadline = st_now() + c->timeout_s;
        if (any_ready)
            continue;
        if (st_now() >= deadline) {
            st_log(ST_LOG_ERR, "migrate", "rank %d: epoch %llu: no progress for %.3g s",
                   c->rank, (unsigned long long)c->epoch, c->timeout_s);
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
        int pr = poll(pfd, np, ms_until(deadline));
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
        /* Streams with unfinished messages are out of step for the rest of the epoch. */
        for (int p = 0; p < nr; p++)
            for (int d = 0; d < 2; d++)
                if (head[2 * p + d] >= 0 && !tc->conns[p].err)
                    tc->conns[p].err = r;
    st_free(mem);
    return r;
}

const struct mig_transport_ops mig__tcp_ops = {
    .name = "tcp",
    .init = tcp_init,
    .fini = tcp_fini,
    .batch = tcp_batch,
};
