/* comm.c: the communicator front end — argument checks, the transport table, point-to-point
 * calls and statistics. Transports live in tcp.c and nccl.c, collectives in coll.c.
 *
 * The one idea: every public entry point validates its arguments and the comm's magic (NCCL
 * PtrCheck/startMagic) before a transport sees them, so transports trust their inputs. */
#include <math.h> /* isfinite */
#include <string.h>

#include "check.h" /* TRY */
#include "migrate-internal.h"

static const struct mig_transport_ops *const transports[] = {
    &mig__tcp_ops,
#ifdef MIG_HAVE_NCCL
    &mig__nccl_ops,
#endif
};

static const struct mig_transport_ops *transport_find(const char *name) {
    for (size_t i = 0; name && i < ST_ARRAY_SIZE(transports); i++)
        if (strcmp(transports[i]->name, name) == 0)
            return transports[i];
    return NULL;
}

/* See migrate.h. */
bool mig_transport_available(const char *name) {
    return transport_find(name) != NULL;
}

/* See migrate.h. */
size_t mig_dtype_size(enum mig_dtype t) {
    switch (t) {
    case MIG_F32:
        return 4;
    case MIG_F64:
        return 8;
    case MIG_BYTES:
        return 1;
    }
    return 0;
}

/* See migrate-internal.h. */
int mig__comm_new_ops(const struct mig_transport_ops *ops, struct mig_endpoint *ep,
                      uint64_t epoch, int rank, int nranks, const char *const *peer_addrs,
                      const struct mig_auth *auth, double timeout_s,
                      const struct mig__build *how, struct mig_comm **ret) {
    struct mig_comm *c;
    int r;

    if (!ops || !ret || nranks < 1 || nranks > MIG_MAX_RANKS || rank < 0 || rank >= nranks ||
        !(timeout_s > 0) || (nranks > 1 && (!ep || !peer_addrs)))
        return -EINVAL;
    c = st_calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->magic = MIG__COMM_MAGIC;
    c->ops = ops;
    c->ep = ep;
    c->epoch = epoch & ~(MIG_EPOCH_SIDE | MIG_EPOCH_MOVE);
    c->side = (epoch & MIG_EPOCH_SIDE) != 0;
    c->move = (epoch & MIG_EPOCH_MOVE) != 0;
    c->rank = rank;
    c->nranks = nranks;
    c->timeout_s = timeout_s;
    if (how) {
        c->ahead = true;
        c->stop = how->stop;
    }
    if (auth) {
        c->keyed = true;
        c->auth = *auth;
        c->auth.job_id[sizeof(c->auth.job_id) - 1] = '\0';
        c->tls = auth->tls;
    }
    r = ops->init(c, peer_addrs);
    if (r < 0) {
        mig_comm_free(c);
        return r;
    }
    c->stop = NULL; /* the caller's flag outlives only the build */
    st_log(ST_LOG_DEBUG, "migrate", "rank %d/%d: %s comm of epoch %llu%s%s ready", rank, nranks,
           ops->name, (unsigned long long)c->epoch, c->side   ? " (side channel)"
           : c->move ? " (move channel)"
                     : "", c->ahead ? ", ahead of its boundary" : "");
    *ret = c;
    return 0;
}

/* See migrate.h. */
int mig_comm_new_auth(const char *transport, struct mig_endpoint *ep, uint64_t epoch, int rank,
                      int nranks, const char *const *peer_addrs, const struct mig_auth *auth,
                      double timeout_s, struct mig_comm **ret) {
    const struct mig_transport_ops *ops = transport_find(transport);
    if (!transport || !ret)
        return -EINVAL;
    if (!ops)
        return strcmp(transport, "nccl") == 0 ? -EOPNOTSUPP : -EINVAL;
    if ((epoch & MIG_EPOCH_SIDE) && (epoch & MIG_EPOCH_MOVE))
        return -EINVAL;
    if ((epoch & (MIG_EPOCH_SIDE | MIG_EPOCH_MOVE)) && ops != &mig__tcp_ops)
        return -EOPNOTSUPP;
    return mig__comm_new_ops(ops, ep, epoch, rank, nranks, peer_addrs, auth, timeout_s, NULL,
                             ret);
}

/* See migrate.h. */
int mig_comm_new_ahead(struct mig_endpoint *ep, uint64_t epoch, int rank, int nranks,
                       const char *const *peer_addrs, const struct mig_auth *auth,
                       double timeout_s, _Atomic bool *stop, struct mig_comm **ret) {
    struct mig__build how = {.stop = stop};
    if (!ret || (epoch & MIG_EPOCH_SIDE))
        return -EINVAL;
    return mig__comm_new_ops(&mig__tcp_ops, ep, epoch, rank, nranks, peer_addrs, auth,
                             timeout_s, &how, ret);
}

/* See migrate.h. */
void mig_auth_clear(struct mig_auth *a) {
    if (a)
        mig__wipe(a, sizeof(*a));
}

/* See migrate.h. */
int mig_comm_new(const char *transport, struct mig_endpoint *ep, uint64_t epoch, int rank,
                 int nranks, const char *const *peer_addrs, double timeout_s,
                 struct mig_comm **ret) {
    return mig_comm_new_auth(transport, ep, epoch, rank, nranks, peer_addrs, NULL, timeout_s,
                             ret);
}

/* See migrate.h. */
struct mig_comm *mig_comm_free(struct mig_comm *c) {
    if (!c)
        return NULL;
    if (c->ops && c->ops->fini)
        c->ops->fini(c);
    mig__wipe(&c->auth, sizeof(c->auth));
    c->magic = 0;
    st_free(c);
    return NULL;
}

static bool comm_ok(const struct mig_comm *c) {
    return c && c->magic == MIG__COMM_MAGIC;
}

/* See migrate.h. */
int mig_comm_set_timeout(struct mig_comm *c, double timeout_s) {
    if (!comm_ok(c) || !(timeout_s > 0) || !isfinite(timeout_s))
        return -EINVAL;
    c->timeout_s = timeout_s;
    return 0;
}

/* See migrate.h. */
int mig_comm_set_first_wait(struct mig_comm *c, double seconds) {
    if (!comm_ok(c) || !(seconds > 0) || !isfinite(seconds))
        return -EINVAL;
    c->first_wait = seconds;
    return 0;
}

/* See migrate.h. */
double mig_comm_heard_at(const struct mig_comm *c) {
    return comm_ok(c) ? atomic_load(&((struct mig_comm *)c)->heard_at) : 0;
}

/* See migrate.h. */
void mig_comm_cancel(struct mig_comm *c) {
    if (comm_ok(c))
        atomic_store(&c->cancelled, true);
}

/* See migrate.h. */
int mig_comm_shut(struct mig_comm *c) {
    if (!comm_ok(c))
        return -EINVAL;
    if (!c->ops->shut)
        return -EOPNOTSUPP;
    c->ops->shut(c);
    return 0;
}

/* See migrate.h. */
int mig_comm_rank(const struct mig_comm *c) {
    return comm_ok(c) ? c->rank : -EINVAL;
}

/* See migrate.h. */
int mig_comm_size(const struct mig_comm *c) {
    return comm_ok(c) ? c->nranks : -EINVAL;
}

/* See migrate.h. */
uint64_t mig_comm_epoch(const struct mig_comm *c) {
    return comm_ok(c) ? c->epoch : 0;
}

/* See migrate.h. */
const char *mig_comm_transport(const struct mig_comm *c) {
    return comm_ok(c) ? c->ops->name : NULL;
}

/* See migrate.h. */
void mig_comm_stats(const struct mig_comm *c, uint64_t *ret_sent, uint64_t *ret_recv) {
    if (!comm_ok(c))
        return;
    if (ret_sent)
        *ret_sent = c->sent;
    if (ret_recv)
        *ret_recv = c->recvd;
}

/* See migrate.h. */
int mig_batch(struct mig_comm *c, struct mig_op *ops, size_t n) {
    if (!comm_ok(c) || (n && !ops))
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (ops[i].peer < 0 || ops[i].peer >= c->nranks || ops[i].peer == c->rank ||
            (ops[i].bytes && !ops[i].buf))
            return -EINVAL;
    if (n == 0)
        return 0;
    return c->ops->batch(c, ops, n);
}

/* See migrate.h. */
int mig_send(struct mig_comm *c, int peer, const void *buf, size_t bytes) {
    struct mig_op op = {.peer = peer, .send = true, .buf = (void *)buf, .bytes = bytes};
    return mig_batch(c, &op, 1);
}

/* See migrate.h. */
int mig_recv(struct mig_comm *c, int peer, void *buf, size_t bytes) {
    struct mig_op op = {.peer = peer, .send = false, .buf = buf, .bytes = bytes};
    return mig_batch(c, &op, 1);
}
