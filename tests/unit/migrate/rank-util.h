/* rank-util.h: helpers for multi-rank transport tests — fork one process per rank on
 * loopback, fill buffers from (seed, rank, offset), collect exit codes.
 *
 * The one idea: every rank is its own process (libuv: each test in its own process), so a
 * rank can be killed for real and the survivors must notice through the sockets. The parent
 * creates every endpoint before forking, so all addresses are known to all ranks. */
#ifndef ST_TEST_RANK_UTIL_H
#define ST_TEST_RANK_UTIL_H

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "migrate.h"

#define RU_MAX 8

/* In a rank body: on failure print where and return the line number as the exit code. */
#define RCHECK(c)                                                                  \
    do {                                                                           \
        if (!(c)) {                                                                \
            fprintf(stderr, "  rank check failed %s:%d: %s\n", __FILE__, __LINE__, #c); \
            return 1;                                                              \
        }                                                                          \
    } while (0)
#define RCHECK_R(expr, want)                                                       \
    do {                                                                           \
        long long rr_ = (long long)(expr);                                         \
        if (rr_ != (long long)(want)) {                                            \
            fprintf(stderr, "  rank check failed %s:%d: %s = %lld, want %lld\n",  \
                    __FILE__, __LINE__, #expr, rr_, (long long)(want));            \
            return 1;                                                              \
        }                                                                          \
    } while (0)

/* A rank's body: returns 0 on success, anything else is a failure code. */
typedef int ru_rank_fn(int rank, int nranks, struct mig_endpoint *ep, const char *const *addrs,
                       void *arg);

static pid_t ru_pids[RU_MAX]; /* pids of the ranks forked so far (visible to later ranks) */

static inline uint64_t ru_mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* Deterministic values from (seed, rank, offset), with varied signs and magnitudes so that
 * the order of a float sum matters. */
static inline float ru_f32(uint64_t seed, int rank, size_t off) {
    uint64_t h = ru_mix(seed * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)rank << 40) ^ off);
    float m = (float)((int)(h & 0xffffff) - 0x800000) / 8388608.0f;
    return ldexpf(m, (int)((h >> 32) % 24) - 12);
}
static inline double ru_f64(uint64_t seed, int rank, size_t off) {
    uint64_t h = ru_mix(seed * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)rank << 40) ^ off ^ 0x5555);
    double m = (double)(int64_t)(h & 0xfffffffffffffULL) / 4503599627370496.0 - 0.5;
    return ldexp(m, (int)((h >> 52) % 40) - 20);
}
static inline unsigned char ru_byte(uint64_t seed, int rank, size_t off) {
    return (unsigned char)(ru_mix(seed ^ ((uint64_t)rank << 48) ^ off) >> 17);
}

/* Forks nranks processes running fn and waits for them. ret_status[i] gets the exit code of
 * rank i, or 128 + signal when it was killed. Returns 0, or -1 when setup failed. */
static inline int ru_run(int nranks, ru_rank_fn *fn, void *arg, int *ret_status) {
    struct mig_endpoint *eps[RU_MAX] = {0};
    static char addr_buf[RU_MAX][MIG_ADDR_MAX];
    const char *addrs[RU_MAX];
    if (nranks > RU_MAX)
        return -1;
    for (int i = 0; i < nranks; i++) {
        if (mig_endpoint_new("127.0.0.1", 0, &eps[i]) < 0)
            return -1;
        snprintf(addr_buf[i], sizeof(addr_buf[i]), "%s", mig_endpoint_addr(eps[i]));
        addrs[i] = addr_buf[i];
    }
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < nranks; i++) {
        pid_t p = fork();
        if (p < 0)
            return -1;
        if (p == 0) {
            alarm(50); /* a hang is a failure, not a stuck test suite */
            for (int j = 0; j < nranks; j++)
                if (j != i)
                    eps[j] = mig_endpoint_free(eps[j]);
            int rc = fn(i, nranks, eps[i], addrs, arg);
            mig_endpoint_free(eps[i]);
            exit(rc);
        }
        ru_pids[i] = p;
    }
    int bad = 0;
    for (int i = 0; i < nranks; i++) {
        int st;
        if (waitpid(ru_pids[i], &st, 0) < 0)
            bad = -1;
        ret_status[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    for (int i = 0; i < nranks; i++)
        mig_endpoint_free(eps[i]);
    return bad;
}

#endif
