/* blas.c: OpenBLAS, loaded on first use instead of at program start.
 *
 * One idea: the binary defines the three OpenBLAS entry points the kernels call (cblas_sgemm,
 * openblas_{get,set}_num_threads) and forwards them to a libopenblas that it dlopen()s the first
 * time one is needed, so the binary itself does not list libopenblas as a dependency. Why: the
 * library's constructor starts one thread per core, and each thread mallocs a 128 MiB buffer
 * and retries for ever when that fails. Under an address-space limit (`ulimit -v 1048576`)
 * every command, `version` included, then spun at 100% CPU instead of exiting. Now only
 * commands that do math load it, with OPENBLAS_NUM_THREADS=1 during the load (the kernels
 * run their own OpenMP threads and keep OpenBLAS's pool idle, ops.c), and kern_blas_load()
 * first checks that the buffers the calling threads will need can be had, so a tight limit
 * gives -ENOMEM and a clear message instead of a spin. */
#include <cblas.h> /* the prototypes defined here */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

/* What OpenBLAS mallocs per calling thread (Debian's build: BUFFER_SIZE 128 MiB plus a page);
 * its allocator retries this without end when it fails. */
#define KERN_BLAS_BUFFER ((size_t)128 << 20)
#define KERN_BLAS_PROBE_MAX 256 /* buffers probed at most */

#ifndef KERN_BLAS_LIBDIR
#define KERN_BLAS_LIBDIR ""
#endif

typedef void kern_sgemm_fn(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE,
                           const enum CBLAS_TRANSPOSE, const blasint, const blasint,
                           const blasint, const float, const float *, const blasint,
                           const float *, const blasint, const float, float *, const blasint);
typedef void kern_set_threads_fn(int);
typedef int kern_get_threads_fn(void);

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static int blas_err;                /* 0 or negative errno of the one load */
static char blas_why[512];
static kern_sgemm_fn *blas_sgemm;
static kern_set_threads_fn *blas_set_threads;
static kern_get_threads_fn *blas_get_threads;

static void blas_open(void) {
    /* The constructor reads the thread count from the environment: one thread, no pool and
     * no pool buffers at load. A user's own OPENBLAS_NUM_THREADS is left as it is, and ours
     * is taken back after the load so that child processes see the environment they were
     * given. */
    const char *had = getenv("OPENBLAS_NUM_THREADS");
    if (!had)
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
    void *h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h && KERN_BLAS_LIBDIR[0])
        h = dlopen(KERN_BLAS_LIBDIR "/libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!had)
        unsetenv("OPENBLAS_NUM_THREADS");
    if (!h) {
        const char *e = dlerror();
        snprintf(blas_why, sizeof(blas_why), "cannot load OpenBLAS: %s", e ? e : "?");
        blas_err = e && strstr(e, "map") ? -ENOMEM : -ENOENT;
        return;
    }
    /* POSIX's way to turn a void * into a function pointer (dlsym(3)). */
    *(void **)&blas_sgemm = dlsym(h, "cblas_sgemm");
    *(void **)&blas_set_threads = dlsym(h, "openblas_set_num_threads");
    *(void **)&blas_get_threads = dlsym(h, "openblas_get_num_threads");
    if (!blas_sgemm || !blas_set_threads || !blas_get_threads) {
        snprintf(blas_why, sizeof(blas_why), "libopenblas.so.0 lacks cblas_sgemm or "
                 "openblas_{get,set}_num_threads");
        blas_err = -ENOENT;
    }
}

/* Loads on first use; a kernel called without a prior successful kern_blas_load() that cannot
 * load has no way to report it (the kernels return void), so it stops with the reason. */
static void blas_need(void) {
    pthread_once(&blas_once, blas_open);
    if (blas_err < 0) {
        fprintf(stderr, "spottrain: %s\n", blas_why);
        abort();
    }
}

/* See kernels.h. */
int kern_blas_load(int threads, char *why, size_t whysz) {
    pthread_once(&blas_once, blas_open);
    if (blas_err < 0) {
        if (why && whysz)
            snprintf(why, whysz, "%s", blas_why);
        return blas_err;
    }
    /* Every thread that calls cblas_sgemm at once takes one buffer, and kern_set_threads(t)
     * grows OpenBLAS's pool to t - 1 threads holding one each: 2t - 1, all held together. */
    int t = threads < 1 ? 1 : threads, n = 2 * t - 1;
    if (n > KERN_BLAS_PROBE_MAX)
        n = KERN_BLAS_PROBE_MAX;
    void *probe[KERN_BLAS_PROBE_MAX];
    int got = 0;
    for (; got < n; got++) {
        probe[got] = malloc(KERN_BLAS_BUFFER + 4096);
        if (!probe[got])
            break;
    }
    for (int i = 0; i < got; i++)
        free(probe[i]);
    if (got < n) {
        if (why && whysz)
            snprintf(why, whysz, "not enough memory for OpenBLAS: %d thread(s) need %d buffers "
                     "of %zu MiB of address space, only %d could be had (is `ulimit -v` too "
                     "low?)", t, n, KERN_BLAS_BUFFER >> 20, got);
        return -ENOMEM;
    }
    return 0;
}

void cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta,
                 const enum CBLAS_TRANSPOSE tb, const blasint M, const blasint N, const blasint K,
                 const float alpha, const float *A, const blasint lda, const float *B,
                 const blasint ldb, const float beta, float *C, const blasint ldc) {
    blas_need();
    blas_sgemm(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void openblas_set_num_threads(int n) {
    blas_need();
    blas_set_threads(n);
}

int openblas_get_num_threads(void) {
    blas_need();
    return blas_get_threads();
}
