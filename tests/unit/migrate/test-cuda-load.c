/* test-cuda-load.c: the NCCL transport's libraries (CUDA runtime, cuBLAS, NCCL) are loaded on
 * the first NCCL comm, not at start, and a machine that lacks them, or lacks a GPU, gets a
 * clear error rather than a binary that does not start. Runs without a GPU (CUDA builds).
 *
 * The one idea: the test binary links migrate/ as spottrain does, so what it maps before its
 * first NCCL comm is what every spottrain command maps at start. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "migrate-internal.h"
#include "test.h"

/* Whether a file whose name contains lib is mapped into this process. */
static bool mapped(const char *lib) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    bool found = false;
    if (!f)
        return false;
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, lib) != NULL;
    fclose(f);
    return found;
}

/* Runs first: nothing has asked for NCCL yet. */
static int test_nothing_mapped_at_start(void) {
    ASSERT_TRUE(mapped("libc.so")); /* the reading works */
    ASSERT_FALSE(mapped("libcudart"));
    ASSERT_FALSE(mapped("libcublas"));
    ASSERT_FALSE(mapped("libnccl"));
    return 0;
}

static void names_of_build(char buf[MIG_CUDA_NLIBS][32], const char *names[MIG_CUDA_NLIBS]) {
    mig__cuda_lib_names(buf);
    for (int i = 0; i < MIG_CUDA_NLIBS; i++)
        names[i] = buf[i];
}

static int test_every_function_resolves(void) {
    char buf[MIG_CUDA_NLIBS][32], why[512] = "";
    const char *names[MIG_CUDA_NLIBS];
    names_of_build(buf, names);
    ASSERT_TRUE(strncmp(names[MIG_CUDA_LIB_CUDART], "libcudart.so.", 13) == 0);
    ASSERT_TRUE(strncmp(names[MIG_CUDA_LIB_CUBLAS], "libcublas.so.", 13) == 0);
    ASSERT_TRUE(strncmp(names[MIG_CUDA_LIB_NCCL], "libnccl.so.", 11) == 0);
    /* The build's lib dir, as the transport falls back to it: the test's environment need
     * not have it on the loader's path. */
    char path[MIG_CUDA_NLIBS][256];
    for (int i = 0; i < MIG_CUDA_NLIBS; i++) {
        snprintf(path[i], sizeof(path[i]), "%s/%s", MIG_CUDA_LIBDIR, buf[i]);
        names[i] = path[i];
    }
    int r = mig__cuda_try(names, why, sizeof(why));
    if (r < 0)
        fprintf(stderr, "    %s\n", why);
    ASSERT_OK(r);
    ASSERT_TRUE(mapped("libcudart"));
    ASSERT_TRUE(mapped("libnccl"));
    return 0;
}

static int test_missing_library(void) {
    char buf[MIG_CUDA_NLIBS][32], why[512] = "";
    const char *names[MIG_CUDA_NLIBS];
    names_of_build(buf, names);
    names[MIG_CUDA_LIB_CUBLAS] = "libspottrain-no-such-library.so.1";
    ASSERT_ERR(mig__cuda_try(names, why, sizeof(why)), -ENOENT);
    ASSERT_CONTAINS(why, "cannot load libspottrain-no-such-library.so.1: ");
    return 0;
}

static int test_missing_function(void) {
    char buf[MIG_CUDA_NLIBS][32], why[512] = "";
    const char *names[MIG_CUDA_NLIBS];
    names_of_build(buf, names);
    names[MIG_CUDA_LIB_CUDART] = "libm.so.6"; /* loads, and has none of CUDA's functions */
    ASSERT_ERR(mig__cuda_try(names, why, sizeof(why)), -ENOENT);
    ASSERT_STREQ(why, "libm.so.6 has no cudaGetErrorString");
    return 0;
}

/* Without a GPU the transport loads its libraries and then finds no device. */
static int test_no_gpu_is_enodev(void) {
    if (access("/dev/nvidiactl", F_OK) == 0)
        return TEST_SKIP; /* a GPU machine: test-nccl covers it */
    struct mig_comm *c = NULL;
    ASSERT_TRUE(mig_transport_available("nccl"));
    ASSERT_ERR(mig_comm_new("nccl", NULL, 1, 0, 1, NULL, 1.0, &c), -ENODEV);
    ASSERT_TRUE(c == NULL);
    return 0;
}

TEST_MAIN(TEST(test_nothing_mapped_at_start), TEST(test_every_function_resolves),
          TEST(test_missing_library), TEST(test_missing_function), TEST(test_no_gpu_is_enodev))
