/* nccl.c: the NCCL transport (CUDA builds only) — point-to-point batches as ncclSend/ncclRecv
 * groups on the comm's stream, with the generic fixed-order collectives of coll.c running on
 * device memory through cudaMemcpy and cuBLAS axpy.
 *
 * The one idea: NCCL is bootstrapped over our own tcp transport (rank 0's ncclUniqueId is
 * broadcast on a tcp comm of the same endpoint and epoch), and the communicator is created
 * non-blocking (config.blocking = 0) so that every wait — init, each batch — is a poll loop
 * bounded by timeout_s that aborts the communicator on expiry (-ETIMEDOUT) instead of hanging.
 * Buffers are device pointers of the CUDA device current when mig_comm_new was called. NCCL
 * messages carry no header: a receiver posting another size than the sender is not detected.
 *
 * The CUDA runtime, cuBLAS and NCCL are loaded on the first NCCL comm (dlopen), not linked:
 * linked, every process of the binary mapped and relocated them at start (cuBLAS brings
 * cuBLASLt), 121 ms of CPU per `spottrain version` against 15 ms without them, for a transport
 * most runs never use. The libraries are the major versions the headers name, found as the
 * dynamic loader finds them (LD_LIBRARY_PATH, ld.so.cache) or else in the toolkit's lib dir;
 * the function table below takes each entry's type from the headers, so a call through it is
 * checked as a direct call would be. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
/* nccl.h declares a few functions with empty parameter lists. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "check.h" /* TRY_GOTO */
#include "migrate-internal.h"

#ifndef MIG_CUDA_LIBDIR
#define MIG_CUDA_LIBDIR ""
#endif

/* Every CUDA, cuBLAS and NCCL function this file calls: (library, symbol). cuBLAS's v2 names
 * are the symbols its header's macros (cublasCreate, ...) stand for. */
#define MIG_CUDA_FNS(X)                                                                       \
    X(MIG_CUDA_LIB_CUDART, cudaGetErrorString)                                                \
    X(MIG_CUDA_LIB_CUDART, cudaGetLastError)                                                  \
    X(MIG_CUDA_LIB_CUDART, cudaGetDeviceCount)                                                \
    X(MIG_CUDA_LIB_CUDART, cudaGetDevice)                                                     \
    X(MIG_CUDA_LIB_CUDART, cudaStreamCreateWithFlags)                                         \
    X(MIG_CUDA_LIB_CUDART, cudaStreamDestroy)                                                 \
    X(MIG_CUDA_LIB_CUDART, cudaStreamQuery)                                                   \
    X(MIG_CUDA_LIB_CUDART, cudaStreamSynchronize)                                             \
    X(MIG_CUDA_LIB_CUDART, cudaMalloc)                                                        \
    X(MIG_CUDA_LIB_CUDART, cudaFree)                                                          \
    X(MIG_CUDA_LIB_CUDART, cudaMemcpyAsync)                                                   \
    X(MIG_CUDA_LIB_CUBLAS, cublasCreate_v2)                                                   \
    X(MIG_CUDA_LIB_CUBLAS, cublasDestroy_v2)                                                  \
    X(MIG_CUDA_LIB_CUBLAS, cublasSetStream_v2)                                                \
    X(MIG_CUDA_LIB_CUBLAS, cublasSaxpy_v2)                                                    \
    X(MIG_CUDA_LIB_CUBLAS, cublasDaxpy_v2)                                                    \
    X(MIG_CUDA_LIB_NCCL, ncclGetErrorString)                                                  \
    X(MIG_CUDA_LIB_NCCL, ncclGetUniqueId)                                                     \
    X(MIG_CUDA_LIB_NCCL, ncclCommInitRankConfig)                                              \
    X(MIG_CUDA_LIB_NCCL, ncclCommGetAsyncError)                                               \
    X(MIG_CUDA_LIB_NCCL, ncclCommFinalize)                                                    \
    X(MIG_CUDA_LIB_NCCL, ncclCommDestroy)                                                     \
    X(MIG_CUDA_LIB_NCCL, ncclCommAbort)                                                       \
    X(MIG_CUDA_LIB_NCCL, ncclGroupStart)                                                      \
    X(MIG_CUDA_LIB_NCCL, ncclGroupEnd)                                                        \
    X(MIG_CUDA_LIB_NCCL, ncclSend)                                                            \
    X(MIG_CUDA_LIB_NCCL, ncclRecv)

struct mig_cuda_fns {
#define X(lib, fn) __typeof__(&fn) fn;
    MIG_CUDA_FNS(X)
#undef X
};

static const struct {
    int lib;
    const char *name;
    size_t off;
} mig_cuda_syms[] = {
#define X(lib, fn) {lib, #fn, offsetof(struct mig_cuda_fns, fn)},
    MIG_CUDA_FNS(X)
#undef X
};

static struct mig_cuda_fns cu; /* filled once by cuda_load_once */
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static int cuda_err;
static char cuda_why[512];

void mig__cuda_lib_names(char names[MIG_CUDA_NLIBS][32]) {
    snprintf(names[MIG_CUDA_LIB_CUDART], 32, "libcudart.so.%d", CUDART_VERSION / 1000);
    snprintf(names[MIG_CUDA_LIB_CUBLAS], 32, "libcublas.so.%d", CUBLAS_VER_MAJOR);
    snprintf(names[MIG_CUDA_LIB_NCCL], 32, "libnccl.so.%d", NCCL_MAJOR);
}

/* Opens names (the loader's search, then libdir) and resolves every entry into fns, or says
 * which library or symbol is missing in why. Handles stay open: the functions live on. */
static int cuda_open(const char *const names[MIG_CUDA_NLIBS], const char *libdir,
                     struct mig_cuda_fns *fns, char *why, size_t whylen) {
    void *h[MIG_CUDA_NLIBS];
    for (int i = 0; i < MIG_CUDA_NLIBS; i++) {
        h[i] = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h[i] && libdir && libdir[0] && !strchr(names[i], '/')) {
            char path[4096];
            snprintf(path, sizeof(path), "%s/%s", libdir, names[i]);
            h[i] = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
        if (!h[i]) {
            const char *e = dlerror();
            snprintf(why, whylen, "cannot load %s: %s", names[i], e ? e : "?");
            return -ENOENT;
        }
    }
    for (size_t i = 0; i < ST_ARRAY_SIZE(mig_cuda_syms); i++) {
        void *f = dlsym(h[mig_cuda_syms[i].lib], mig_cuda_syms[i].name);
        if (!f) {
            snprintf(why, whylen, "%s has no %s", names[mig_cuda_syms[i].lib],
                     mig_cuda_syms[i].name);
            return -ENOENT;
        }
        /* POSIX's way to turn a void * into a function pointer (dlsym(3)). */
        memcpy((char *)fns + mig_cuda_syms[i].off, &f, sizeof(f));
    }
    return 0;
}

int mig__cuda_try(const char *const names[MIG_CUDA_NLIBS], char *why, size_t whylen) {
    struct mig_cuda_fns fns;
    return cuda_open(names, NULL, &fns, why, whylen);
}

static void cuda_load_once(void) {
    char buf[MIG_CUDA_NLIBS][32];
    const char *names[MIG_CUDA_NLIBS];
    mig__cuda_lib_names(buf);
    for (int i = 0; i < MIG_CUDA_NLIBS; i++)
        names[i] = buf[i];
    cuda_err = cuda_open(names, MIG_CUDA_LIBDIR, &cu, cuda_why, sizeof(cuda_why));
}

/* 0 once CUDA, cuBLAS and NCCL are loaded; else -ENOENT, with the reason logged once. */
static int cuda_load(void) {
    static bool said;
    pthread_once(&cuda_once, cuda_load_once);
    if (cuda_err < 0 && !__atomic_exchange_n(&said, true, __ATOMIC_RELAXED))
        st_log(ST_LOG_ERR, "migrate", "nccl transport: %s", cuda_why);
    return cuda_err;
}

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
    st_log(ST_LOG_DEBUG, "migrate", "cuda: %s", cu.cudaGetErrorString(e));
    (void)cu.cudaGetLastError(); /* clear a non-sticky error */
    return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

#define NCCL_TRY(expr, r, label)                                                   \
    do {                                                                           \
        ncclResult_t nr_ = (expr);                                                 \
        if (nr_ != ncclSuccess && nr_ != ncclInProgress) {                         \
            st_log(ST_LOG_DEBUG, "migrate", "-> %s:%d nccl: %s", __FILE__, __LINE__, \
                   cu.ncclGetErrorString(nr_));                                       \
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
        ncclResult_t q = cu.ncclCommGetAsyncError(nc->comm, &st);
        if (q != ncclSuccess)
            return nccl_errno(q);
        if (st != ncclSuccess && st != ncclInProgress)
            return nccl_errno(st) < 0 ? nccl_errno(st) : -EIO;
        if (st == ncclSuccess) {
            if (!stream)
                return 0;
            cudaError_t e = cu.cudaStreamQuery(nc->stream);
            if (e == cudaSuccess)
                return 0;
            if (e != cudaErrorNotReady)
                return cuda_errno(e);
        }
        if (st_now() >= deadline) {
            st_log(ST_LOG_ERR, "migrate", "rank %d: nccl: no completion within %.3g s, aborting "
                   "the communicator", c->rank, c->timeout_s);
            (void)cu.ncclCommAbort(nc->comm);
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
        bool ok = !nc->err && nccl_errno(cu.ncclCommFinalize(nc->comm)) == 0 &&
                  nccl_wait(c, nc, st_now() + c->timeout_s, false) >= 0;
        if (nc->comm) /* nccl_wait aborts (and clears it) on timeout */
            (void)(ok ? cu.ncclCommDestroy(nc->comm) : cu.ncclCommAbort(nc->comm));
    }
    if (nc->blas)
        cu.cublasDestroy_v2(nc->blas);
    if (nc->stream)
        cu.cudaStreamDestroy(nc->stream);
    st_free(nc);
    c->priv = NULL;
}

static int nccl_init(struct mig_comm *c, const char *const *peer_addrs) {
    struct mig_comm *boot = NULL;
    struct nccl_comm *nc;
    ncclUniqueId id;
    int r = 0, ndev = 0;

    if (cuda_load() < 0) /* no CUDA stack here: as good as no GPU */
        return -ENODEV;
    if (cu.cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        (void)cu.cudaGetLastError();
        return -ENODEV;
    }
    nc = st_calloc(1, sizeof(*nc));
    if (!nc)
        return -ENOMEM;
    c->priv = nc;
    CUDA_TRY(cu.cudaGetDevice(&nc->device), r, out);
    CUDA_TRY(cu.cudaStreamCreateWithFlags(&nc->stream, cudaStreamNonBlocking), r, out);
    if (cu.cublasCreate_v2(&nc->blas) != CUBLAS_STATUS_SUCCESS ||
        cu.cublasSetStream_v2(nc->blas, nc->stream) != CUBLAS_STATUS_SUCCESS) {
        nc->blas = NULL;
        r = -EIO;
        goto out;
    }
    /* The unique id travels over tcp on the same endpoint and epoch. */
    memset(&id, 0, sizeof(id));
    if (c->rank == 0)
        NCCL_TRY(cu.ncclGetUniqueId(&id), r, out);
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
    NCCL_TRY(cu.ncclCommInitRankConfig(&nc->comm, c->nranks, id, c->rank, &config), r, out);
    TRY_GOTO(nccl_wait(c, nc, st_now() + c->timeout_s, false), r, out);
out:
    return r;
}

static int nccl_batch(struct mig_comm *c, struct mig_op *ops, size_t n) {
    struct nccl_comm *nc = c->priv;
    int r = 0;
    if (nc->err || !nc->comm)
        return nc->err ? nc->err : -EIO;
    NCCL_TRY(cu.ncclGroupStart(), r, out);
    for (size_t i = 0; i < n; i++) {
        if (ops[i].send)
            NCCL_TRY(cu.ncclSend(ops[i].buf, ops[i].bytes, ncclUint8, ops[i].peer, nc->comm,
                              nc->stream), r, group);
        else
            NCCL_TRY(cu.ncclRecv(ops[i].buf, ops[i].bytes, ncclUint8, ops[i].peer, nc->comm,
                              nc->stream), r, group);
    }
group:
    if (r < 0) {
        (void)cu.ncclGroupEnd();
        goto out;
    }
    NCCL_TRY(cu.ncclGroupEnd(), r, out);
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
    if (cu.cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cu.cudaGetLastError();
        return NULL;
    }
    return p;
}

static void nccl_mem_free(struct mig_comm *c, void *p) {
    if (p)
        cu.cudaFree(p);
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
        r = cuda_errno(cu.cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice,
                                          nc->stream));
        if (r >= 0)
            r = cuda_errno(cu.cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice,
                                           nc->stream));
        if (r >= 0)
            r = cuda_errno(cu.cudaStreamSynchronize(nc->stream));
        cu.cudaFree(tmp);
        return r;
    }
    TRY(cuda_errno(cu.cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nc->stream)));
    return cuda_errno(cu.cudaStreamSynchronize(nc->stream));
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
            s = cu.cublasSaxpy_v2(nc->blas, n, &one, (const float *)x + done, 1,
                                  (float *)acc + done, 1);
        } else {
            const double one = 1.0;
            s = cu.cublasDaxpy_v2(nc->blas, n, &one, (const double *)x + done, 1,
                                  (double *)acc + done, 1);
        }
        done += (size_t)n;
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        return -EIO;
    return cuda_errno(cu.cudaStreamSynchronize(nc->stream));
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
