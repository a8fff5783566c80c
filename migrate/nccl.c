/* nccl.c: the NCCL transport (CUDA builds only) — point-to-point batches as ncclSend/ncclRecv
 * groups on the comm's stream, with the generic fixed-order collectives of coll.c running on
 * device memory through cudaMemcpy and cuBLAS axpy.
 *
 * The one idea: NCCL is bootstrapped over our own tcp transport (rank 0's ncclUniqueId is
 * broadcast on a tcp comm of the same endpoint and epoch), and the communicator is created
 * non-blocking (config.blocking = 0) so that every wait — init, each batch — is a poll loop
 * bounded by timeout_s that aborts the communicator on expiry (-ETIMEDOUT) instead of hanging.
 * Buffers are device pointers of the CUDA device current when mig_comm_new was called. NCCL
 * messages carry no header: a receiver posting another size than the sender is not detected. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
/* nccl.h declares a few functions with empty parameter lists. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <string.h>

#include "check.h" /* TRY_GOTO */
#include "migrate-internal.h"

struct nccl_comm {
    ncclComm_t comm;
    cudaStream_t stream;
    cublasHandle_t blas;
    int device;
    int err; /* sticky: after an abort nothing else runs */
};

static int nccl_errno(ncclResult_t r) {
    switch (r) {
    case ncclSuccess:
    case ncclInProgress:
        return 0;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
        return -EINVAL;
    case ncclRemoteError:
        return -ECONNRESET;
    default:
        return -EIO;
    }
}

static int cuda_errno(cudaError_t e) {
    if (e == cudaSuccess)
        return 0;
    st_log(ST_LOG_DEBUG, "migrate", "cuda: %s", cudaGetErrorString(e));
    (void)cudaGetLastError(); /* clear a non-sticky error */
    return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

#define NCCL_TRY(expr, r, label)                                                   \
    do {                                                                           \
        ncclResult_t nr_ = (expr);                                                 \
        if (nr_ != ncclSuccess && nr_ != ncclInProgress) {                         \
            st_log(ST_LOG_DEBUG, "migrate", "-> %s:%d nccl: %s", __FILE__, __LINE__, \
                   ncclGetErrorString(nr_));                                       \
            (r) = nccl_errno(nr_);                                                 \
            goto label;                                                            \
        }                                                                          \
    } while (0)

#define CUDA_TRY(expr, r, label) TRY_GOTO(cuda_errno(expr), r, label)

/* Polls the communicator's async state until it leaves ncclInProgress, and the stream until
 * it is idle, both bounded by deadline. On expiry aborts the communicator. */
static int nccl_wait(struct mig_comm *c, struct nccl_comm *nc, double deadline, bool stream) {
    for (;;) {
        ncclResult_t st;
        ncclResult_t q = ncclCommGetAsyncError(nc->comm, &st);
        if (q != ncclSuccess)
            return nccl_errno(q);
        if (st != ncclSuccess && st != ncclInProgress)
            return nccl_errno(st) < 0 ? nccl_errno(st) : -EIO;
        if (st == ncclSuccess) {
            if (!stream)
                return 0;
            cudaError_t e = cudaStreamQuery(nc->stream);
            if (e == cudaSuccess)
                return 0;
            if (e != cudaErrorNotReady)
                return cuda_errno(e);
        }
        if (st_now() >= deadline) {
            st_log(ST_LOG_ERR, "migrate", "rank %d: nccl: no completion within %.3g s, aborting "
                   "the communicator", c->rank, c->timeout_s);
            (void)ncclCommAbort(nc->comm);
            nc->comm = NULL;
            return -ETIMEDOUT;
        }
    }
}

static void nccl_fini(struct mig_comm *c) {
    struct nccl_comm *nc = c->priv;
    if (!nc)
        return;
    if (nc->comm) {
        bool ok = !nc->err && nccl_errno(ncclCommFinalize(nc->comm)) == 0 &&
                  nccl_wait(c, nc, st_now() + c->timeout_s, false) >= 0;
        if (nc->comm) /* nccl_wait aborts (and clears it) on timeout */
            (void)(ok ? ncclCommDestroy(nc->comm) : ncclCommAbort(nc->comm));
    }
    if (nc->blas)
        cublasDestroy(nc->blas);
    if (nc->stream)
        cudaStreamDestroy(nc->stream);
    st_free(nc);
    c->priv = NULL;
}

static int nccl_init(struct mig_comm *c, const char *const *peer_addrs) {
    struct mig_comm *boot = NULL;
    struct nccl_comm *nc;
    ncclUniqueId id;
    int r = 0, ndev = 0;

    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        (void)cudaGetLastError();
        return -ENODEV;
    }
    nc = st_calloc(1, sizeof(*nc));
    if (!nc)
        return -ENOMEM;
    c->priv = nc;
    CUDA_TRY(cudaGetDevice(&nc->device), r, out);
    CUDA_TRY(cudaStreamCreateWithFlags(&nc->stream, cudaStreamNonBlocking), r, out);
    if (cublasCreate(&nc->blas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(nc->blas, nc->stream) != CUBLAS_STATUS_SUCCESS) {
        nc->blas = NULL;
        r = -EIO;
        goto out;
    }
    /* The unique id travels over tcp on the same endpoint and epoch. */
    memset(&id, 0, sizeof(id));
    if (c->rank == 0)
        NCCL_TRY(ncclGetUniqueId(&id), r, out);
    if (c->nranks > 1) {
        int *all = st_malloc((size_t)c->nranks * sizeof(int));
        if (!all) {
            r = -ENOMEM;
            goto out;
        }
        for (int i = 0; i < c->nranks; i++)
            all[i] = i;
        r = mig__comm_new_ops(&mig__tcp_ops, c->ep, c->epoch, c->rank, c->nranks, peer_addrs,
                              c->keyed ? &c->auth : NULL, c->timeout_s, NULL, &boot);
        if (r >= 0)
            r = mig_broadcast(boot, all, c->nranks, 0, &id, sizeof(id));
        st_free(all);
        boot = mig_comm_free(boot);
        if (r < 0)
            goto out;
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    NCCL_TRY(ncclCommInitRankConfig(&nc->comm, c->nranks, id, c->rank, &config), r, out);
    TRY_GOTO(nccl_wait(c, nc, st_now() + c->timeout_s, false), r, out);
out:
    return r;
}

static int nccl_batch(struct mig_comm *c, struct mig_op *ops, size_t n) {
    struct nccl_comm *nc = c->priv;
    int r = 0;
    if (nc->err || !nc->comm)
        return nc->err ? nc->err : -EIO;
    NCCL_TRY(ncclGroupStart(), r, out);
    for (size_t i = 0; i < n; i++) {
        if (ops[i].send)
            NCCL_TRY(ncclSend(ops[i].buf, ops[i].bytes, ncclUint8, ops[i].peer, nc->comm,
                              nc->stream), r, group);
        else
            NCCL_TRY(ncclRecv(ops[i].buf, ops[i].bytes, ncclUint8, ops[i].peer, nc->comm,
                              nc->stream), r, group);
    }
group:
    if (r < 0) {
        (void)ncclGroupEnd();
        goto out;
    }
    NCCL_TRY(ncclGroupEnd(), r, out);
    TRY_GOTO(nccl_wait(c, nc, st_now() + c->timeout_s, true), r, out);
    for (size_t i = 0; i < n; i++) {
        if (ops[i].send)
            c->sent += ops[i].bytes;
        else
            c->recvd += ops[i].bytes;
    }
out:
    if (r < 0)
        nc->err = r;
    return r;
}

static void *nccl_mem_alloc(struct mig_comm *c, size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void nccl_mem_free(struct mig_comm *c, void *p) {
    if (p)
        cudaFree(p);
}

static int nccl_mem_copy(struct mig_comm *c, void *dst, const void *src, size_t bytes) {
    struct nccl_comm *nc = c->priv;
    if (!bytes || dst == src)
        return 0;
    /* cudaMemcpy's overlap behaviour is undefined; overlapping moves go through a bounce. */
    const char *d = dst, *s = src;
    if ((d < s && d + bytes > s) || (s < d && s + bytes > d)) {
        void *tmp = nccl_mem_alloc(c, bytes);
        int r;
        if (!tmp)
            return -ENOMEM;
        r = cuda_errno(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, nc->stream));
        if (r >= 0)
            r = cuda_errno(cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice,
                                           nc->stream));
        if (r >= 0)
            r = cuda_errno(cudaStreamSynchronize(nc->stream));
        cudaFree(tmp);
        return r;
    }
    TRY(cuda_errno(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nc->stream)));
    return cuda_errno(cudaStreamSynchronize(nc->stream));
}

/* acc += 1 * x: axpy with alpha = 1 rounds once, exactly as acc + x does. */
static int nccl_mem_sum(struct mig_comm *c, void *acc, const void *x, size_t count,
                        enum mig_dtype t) {
    struct nccl_comm *nc = c->priv;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    for (size_t done = 0; done < count && s == CUBLAS_STATUS_SUCCESS;) {
        int n = (int)ST_MIN(count - done, (size_t)1 << 30);
        if (t == MIG_F32) {
            const float one = 1.0f;
            s = cublasSaxpy(nc->blas, n, &one, (const float *)x + done, 1, (float *)acc + done, 1);
        } else {
            const double one = 1.0;
            s = cublasDaxpy(nc->blas, n, &one, (const double *)x + done, 1, (double *)acc + done,
                            1);
        }
        done += (size_t)n;
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        return -EIO;
    return cuda_errno(cudaStreamSynchronize(nc->stream));
}

const struct mig_transport_ops mig__nccl_ops = {
    .name = "nccl",
    .init = nccl_init,
    .fini = nccl_fini,
    .batch = nccl_batch,
    .mem_alloc = nccl_mem_alloc,
    .mem_free = nccl_mem_free,
    .mem_copy = nccl_mem_copy,
    .mem_sum = nccl_mem_sum,
};
