/* test-nccl.c: the NCCL transport on one GPU — a single-rank communicator bootstrapped like a
 * multi-rank one, a batch-free collective set on device memory, and the errors of a bad call.
 * Skips (77) when no GPU or driver answers: cudaGetDeviceCount fails or finds none.
 *
 * The one idea: with one rank every collective reduces to device copies, which exercises the
 * transport's memory hooks (cudaMalloc, cudaMemcpy, cuBLAS axpy) and NCCL init/teardown. */
#include <cuda_runtime.h>
#include <string.h>

#include "common.h"
#include "migrate.h"
#include "test.h"

static int test_single_rank(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
        return TEST_SKIP;
    struct mig_endpoint *ep;
    struct mig_comm *c;
    ASSERT_TRUE(mig_transport_available("nccl"));
    ASSERT_OK(mig_endpoint_new(NULL, 0, &ep));
    const char *addrs[1] = {mig_endpoint_addr(ep)};
    ASSERT_OK(mig_comm_new("nccl", ep, 1, 0, 1, addrs, 60, &c));
    ASSERT_STREQ(mig_comm_transport(c), "nccl");

    enum { N = 1 << 20 };
    float *h = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    ASSERT_TRUE(h && back);
    for (int i = 0; i < N; i++)
        h[i] = (float)i * 0.25f - 1000.0f;
    float *d = NULL, *d2 = NULL;
    ASSERT_EQ(cudaMalloc((void **)&d, N * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc((void **)&d2, N * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, h, N * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    int g[] = {0};
    size_t cnt[] = {N};
    ASSERT_OK(mig_allreduce(c, g, 1, d, N, MIG_F32));
    ASSERT_OK(mig_reduce_scatter(c, g, 1, d, d2, cnt, MIG_F32));
    ASSERT_OK(mig_allgather(c, g, 1, d2, d, cnt, MIG_F32));
    ASSERT_OK(mig_broadcast(c, g, 1, 0, d, N * sizeof(float)));
    ASSERT_OK(mig_barrier(c, g, 1));
    ASSERT_EQ(cudaMemcpy(back, d, N * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_TRUE(memcmp(h, back, N * sizeof(float)) == 0);
    ASSERT_ERR(mig_send(c, 0, d, 4), -EINVAL); /* no peer but ourselves */
    cudaFree(d);
    cudaFree(d2);
    free(h);
    free(back);
    mig_comm_free(c);
    mig_endpoint_free(ep);
    return 0;
}

TEST_MAIN(TEST(test_single_rank))
