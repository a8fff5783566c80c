/* migrate-internal.h: internal header of migrate/ — the transport vtable, the communicator's
 * common fields and the XXH64 stream. No other part may include it.
 *
 * The one idea: the collectives (coll.c) are written once over a transport's concurrent
 * point-to-point batch with host-side sums in a fixed order; a transport that has its own
 * collectives (NCCL) fills the optional entries of its ops table instead (NCCL ncclNet_t). */
#ifndef ST_MIGRATE_INTERNAL_H
#define ST_MIGRATE_INTERNAL_H

#include <stdatomic.h>

#include "common.h" /* st_log, st_malloc, ST_MIN */
#include "config.h" /* HAVE_CUDA */
#include "migrate.h"

#define MIG__COMM_MAGIC 0x4d4947434f4d4d31ULL /* "MIGCOMM1" */

/* A transport: "tcp" or "nccl". init fills c->priv from the peer list; fini frees it (and may
 * be called after a failed init with c->priv NULL). batch moves messages. The collectives
 * (coll.c) are generic over batch; they touch buffers only through the memory hooks, which are
 * NULL for host memory (tcp) and set by transports whose buffers live elsewhere (nccl: device
 * memory, cudaMalloc/cudaMemcpy/cuBLAS axpy). Every hook is synchronous. */
struct mig_transport_ops {
    const char *name;
    int (*init)(struct mig_comm *c, const char *const *peer_addrs);
    void (*fini)(struct mig_comm *c);
    int (*batch)(struct mig_comm *c, struct mig_op *ops, size_t n);
    void (*shut)(struct mig_comm *c); /* optional: mig_comm_shut */
    /* Optional memory hooks (all or none). */
    void *(*mem_alloc)(struct mig_comm *c, size_t bytes);
    void (*mem_free)(struct mig_comm *c, void *p);
    int (*mem_copy)(struct mig_comm *c, void *dst, const void *src, size_t bytes); /* memmove */
    /* acc[i] = acc[i] + x[i] for i < count, in t's precision, no FMA with anything else. */
    int (*mem_sum)(struct mig_comm *c, void *acc, const void *x, size_t count, enum mig_dtype t);
};

extern const struct mig_transport_ops mig__tcp_ops;
#ifdef MIG_HAVE_NCCL
extern const struct mig_transport_ops mig__nccl_ops;

/* nccl.c loads the CUDA runtime, cuBLAS and NCCL on the first NCCL comm (dlopen). */
enum { MIG_CUDA_LIB_CUDART, MIG_CUDA_LIB_CUBLAS, MIG_CUDA_LIB_NCCL, MIG_CUDA_NLIBS };
/* The sonames loaded: the major versions the headers this build was compiled with name. */
void mig__cuda_lib_names(char names[MIG_CUDA_NLIBS][32]);
/* Loads names and resolves every function nccl.c calls, without touching the transport's own
 * table: 0, or -ENOENT with the missing library or symbol in why (for tests). */
int mig__cuda_try(const char *const names[MIG_CUDA_NLIBS], char *why, size_t whylen);
#endif

struct mig_comm {
    uint64_t magic; /* MIG__COMM_MAGIC while alive */
    const struct mig_transport_ops *ops;
    struct mig_endpoint *ep; /* borrowed */
    uint64_t epoch;    /* without MIG_EPOCH_SIDE or MIG_EPOCH_MOVE */
    bool side;         /* the epoch's side channel (MIG_EPOCH_SIDE) */
    bool move;         /* the epoch's move channel (MIG_EPOCH_MOVE) */
    _Atomic bool cancelled; /* mig_comm_cancel(): batches give up */
    bool ahead;        /* built ahead of its boundary (mig_comm_new_ahead) until mig_comm_enter */
    _Atomic bool *stop; /* mig_comm_new_ahead's: its build gives up once set; NULL otherwise */
    int rank, nranks;
    double timeout_s;  /* seconds without progress before -ETIMEDOUT */
    double first_wait; /* mig_comm_set_first_wait: the limit until heard (0: timeout_s) */
    _Atomic double heard_at; /* st_now() when c received its first byte; 0: not yet */
    bool keyed;        /* built with a secret: messages carry MACs */
    bool tls;          /* keyed and encrypted: connections run TLS 1.3, no GMAC trailers */
    struct mig_auth auth; /* all-zero key when !keyed; wiped by mig_comm_free */
    uint64_t sent;     /* payload bytes */
    uint64_t recvd;
    bool cut_send;     /* mig_execute_cut_at fired: the transport cuts the next send (tcp) */
    void *priv;        /* the transport's state */
};

/* How a communicator is built: at its boundary (NULL), or ahead of it (mig_comm_new_ahead),
 * given up when *stop is set (stop NULL: never). */
struct mig__build {
    _Atomic bool *stop;
};

/* Builds a communicator on the given transport ops (used by mig_comm_new and by the NCCL
 * transport to bootstrap over tcp). */
int mig__comm_new_ops(const struct mig_transport_ops *ops, struct mig_endpoint *ep,
                      uint64_t epoch, int rank, int nranks, const char *const *peer_addrs,
                      const struct mig_auth *auth, double timeout_s,
                      const struct mig__build *how, struct mig_comm **ret);

/* Overwrites n bytes at p in a way the compiler keeps (key material). tcp.c. */
void mig__wipe(void *p, size_t n);

/* Streaming XXH64 (xxh64.c). */
struct mig__xxh64 {
    uint64_t v[4];
    uint64_t seed;
    uint64_t total;
    unsigned char buf[32];
    size_t buffered;
};
void mig__xxh64_init(struct mig__xxh64 *s, uint64_t seed);
void mig__xxh64_update(struct mig__xxh64 *s, const void *data, size_t len);
uint64_t mig__xxh64_digest(const struct mig__xxh64 *s);

#endif
