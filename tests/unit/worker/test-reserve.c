/* test-reserve.c: the warm reserve (worker/reserve.c, fleet.prewarm) — what it gives, what it
 * refuses, what its buffers survive, and that an engine made while it is open takes its large
 * buffers from it, as many bytes as worker_engine_position_bytes says. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "kernels.h"
#include "test.h"
#include "tokens.h"
#include "worker-reserve.h"
#include "worker.h"

static bool all_zero(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

static int test_take_and_release(void) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    ASSERT_ERR(worker_reserve_open(0), -EINVAL);
    ASSERT_TRUE((worker__reserve_take(1 << 20)) == NULL); /* none open */
    ASSERT_OK(worker_reserve_open((size_t)4 << 20));
    ASSERT_TRUE(worker_reserve_is_open());
    ASSERT_TRUE((worker__reserve_take(WORKER_RESERVE_MIN - 1)) == NULL); /* small: the heap's */
    unsigned char *a = worker__reserve_take((size_t)1 << 20);
    unsigned char *b = worker__reserve_take(WORKER_RESERVE_MIN + 1);
    ASSERT_TRUE((a) != NULL);
    ASSERT_TRUE((b) != NULL);
    ASSERT_EQ((uintptr_t)a % pg, 0);
    ASSERT_EQ((uintptr_t)b % pg, 0);
    ASSERT_TRUE(b >= a + ((size_t)1 << 20)); /* no overlap */
    ASSERT_TRUE(all_zero(a, (size_t)1 << 20));
    ASSERT_TRUE(all_zero(b, WORKER_RESERVE_MIN + 1));
    memset(a, 0xab, (size_t)1 << 20);
    ASSERT_TRUE((worker__reserve_take((size_t)4 << 20)) == NULL); /* no room left */
    struct worker_reserve_stats st;
    worker_reserve_stats(&st);
    ASSERT_EQ(st.bytes, (size_t)4 << 20);
    ASSERT_EQ(st.given, ((size_t)1 << 20) + ((WORKER_RESERVE_MIN + 1 + pg - 1) / pg * pg));
    ASSERT_EQ(st.live, st.given);
    ASSERT_TRUE(st.faulted <= st.bytes);

    /* A heap pointer is not ours; worker__big_free frees it the heap's way. */
    void *h = malloc(16);
    ASSERT_FALSE(worker__reserve_release(h));
    free(h);
    ASSERT_FALSE(worker__reserve_release(NULL));
    ASSERT_FALSE(worker__reserve_release(a + pg)); /* inside a buffer: not a buffer */

    /* Closed: nothing more is given, what was given stays usable until freed. */
    worker_reserve_close();
    worker_reserve_close(); /* idempotent */
    ASSERT_FALSE(worker_reserve_is_open());
    ASSERT_TRUE((worker__reserve_take((size_t)1 << 20)) == NULL);
    ASSERT_EQ(a[12345], 0xab);
    ASSERT_TRUE(worker__reserve_release(a));
    ASSERT_FALSE(worker__reserve_release(a)); /* once */
    worker__big_free(b);
    worker_reserve_stats(&st);
    ASSERT_EQ(st.live, 0);

    /* Without a reserve big_alloc is the heap's (zeroed when asked). */
    unsigned char *z = worker__big_alloc((size_t)1 << 20, true);
    ASSERT_TRUE((z) != NULL);
    ASSERT_TRUE(all_zero(z, (size_t)1 << 20));
    worker__big_free(z);
    return 0;
}

/* A reopened reserve replaces the open one; buffers of both are released apart. */
static int test_reopen(void) {
    ASSERT_OK(worker_reserve_open((size_t)1 << 20));
    void *a = worker__reserve_take(WORKER_RESERVE_MIN);
    ASSERT_TRUE((a) != NULL);
    ASSERT_OK(worker_reserve_open((size_t)2 << 20));
    void *b = worker__reserve_take((size_t)1 << 20);
    ASSERT_TRUE((b) != NULL);
    worker_reserve_close();
    ASSERT_TRUE(worker__reserve_release(b));
    ASSERT_TRUE(worker__reserve_release(a));
    struct worker_reserve_stats st;
    worker_reserve_stats(&st);
    ASSERT_EQ(st.live, 0);
    return 0;
}

static const struct kern_config model = {.layers = 3, .channels = 128, .heads = 4,
                                         .vocab = 512, .seq_len = 32};

static struct worker_train_config make_cfg(void) {
    struct worker_train_config c;
    memset(&c, 0, sizeof(c));
    c.model = model;
    c.global_batch = 4;
    c.micro_batch = 2;
    c.total_steps = 2;
    c.lr = 1e-3;
    c.beta1 = 0.9;
    c.beta2 = 0.95;
    c.eps = 1e-8;
    c.schedule = KERN_LR_COSINE;
    c.min_lr_ratio = 0.1;
    c.seed = 1;
    return c;
}

/* An engine made with the reserve open takes its large buffers from it: all of them when the
 * reserve is as large as worker_engine_position_bytes says (the rest, small, come from the
 * heap), for a first, a middle and a last stage. */
static int test_engine_from_reserve(void) {
    char dir[] = "/tmp/st-reserve-XXXXXX", path[64];
    ASSERT_TRUE((mkdtemp(dir)) != NULL);
    snprintf(path, sizeof(path), "%s/tokens.bin", dir);
    uint16_t tok[1024];
    for (size_t i = 0; i < ST_ARRAY_SIZE(tok); i++)
        tok[i] = (uint16_t)(st_mix64(i) % (uint64_t)model.vocab);
    ASSERT_OK(st_tokens_write(path, ST_TOKENS_NANOGPT, tok, ST_ARRAY_SIZE(tok)));
    struct st_tokens *data = NULL;
    ASSERT_OK(st_tokens_open(path, model.vocab, &data, NULL));
    struct worker_train_config cfg = make_cfg();
    int nl = kern_num_layers(&model); /* 3 blocks, the embedding and the head */
    int lo[4] = {0, 1, 2, nl};
    struct worker_layout lay;
    ASSERT_OK(worker_layout_init(&lay, 2, 3, lo, nl));
    uint64_t whole = 0;
    {
        int l1[2] = {0, nl};
        struct worker_layout one;
        ASSERT_OK(worker_layout_init(&one, 1, 1, l1, nl));
        ASSERT_OK(worker_engine_position_bytes(&cfg, &one, 0, 0, &whole));
    }
    for (int stage = 0; stage < 3; stage++) {
        uint64_t need = 0;
        ASSERT_OK(worker_engine_position_bytes(&cfg, &lay, stage, 1, &need));
        ASSERT_TRUE(need > 0 && need < whole); /* a part of the whole model's */
        ASSERT_OK(worker_reserve_open((size_t)need + ((size_t)1 << 20)));
        ASSERT_ERR(worker_engine_position_bytes(&cfg, &lay, stage, 1, &need), -EBUSY);
        struct worker_engine *e = NULL;
        ASSERT_OK(worker_engine_new_detached(&cfg, &lay, stage, 1, data, &e));
        ASSERT_OK(worker_engine_ready(e));
        worker_reserve_close();
        struct worker_reserve_stats st;
        worker_reserve_stats(&st);
        /* Every buffer of 64 KiB or more came from it, rounded up to pages. */
        ASSERT_TRUE(st.given <= need + ((size_t)1 << 20));
        ASSERT_TRUE(st.given >= need * 9 / 10);
        ASSERT_EQ(st.live, st.given);
        worker_engine_free(e);
        worker_reserve_stats(&st);
        ASSERT_EQ(st.live, 0); /* every buffer freed went back */
    }
    /* Bad positions are refused before anything is made. */
    uint64_t x = 7;
    ASSERT_ERR(worker_engine_position_bytes(&cfg, &lay, 3, 0, &x), -EINVAL);
    ASSERT_ERR(worker_engine_position_bytes(&cfg, &lay, 0, 2, &x), -EINVAL);
    ASSERT_ERR(worker_engine_position_bytes(&cfg, &lay, -1, 0, &x), -EINVAL);
    ASSERT_ERR(worker_engine_position_bytes(NULL, &lay, 0, 0, &x), -EINVAL);
    ASSERT_EQ(x, 7);
    st_tokens_free(data);
    unlink(path);
    rmdir(dir);
    return 0;
}

static int put(const char *root, const char *rel, const char *text) {
    char path[512];
    snprintf(path, sizeof(path), "%s%s", root, rel);
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    fputs(text, f);
    return fclose(f) == 0 ? 0 : -EIO;
}

static int mkdirs(const char *root, const char *rel) {
    char path[512];
    snprintf(path, sizeof(path), "%s%s", root, rel);
    for (char *p = path + strlen(root) + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0755);
            *p = '/';
        }
    return mkdir(path, 0755) == 0 || errno == EEXIST ? 0 : -errno;
}

/* What the reserve may take: the host's MemAvailable, or less under a container's limit
 * (cgroup v2, else v1); nothing known is no limit. */
static int test_headroom(void) {
    char root[] = "/tmp/st-headroom-XXXXXX";
    ASSERT_TRUE(mkdtemp(root) != NULL);
    ASSERT_EQ(worker_reserve_headroom(root), UINT64_MAX); /* nothing says */
    ASSERT_OK(mkdirs(root, "/proc"));
    ASSERT_OK(put(root, "/proc/meminfo", "MemTotal:       24000000 kB\n"
                  "MemFree:         1000 kB\nMemAvailable:    2000000 kB\n"));
    ASSERT_EQ(worker_reserve_headroom(root), 2000000ull * 1024);
    /* cgroup v1: 1 GiB limit, 256 MiB used. */
    ASSERT_OK(mkdirs(root, "/sys/fs/cgroup/memory"));
    ASSERT_OK(put(root, "/sys/fs/cgroup/memory/memory.limit_in_bytes", "1073741824\n"));
    ASSERT_OK(put(root, "/sys/fs/cgroup/memory/memory.usage_in_bytes", "268435456\n"));
    ASSERT_EQ(worker_reserve_headroom(root), 805306368ull);
    /* cgroup v2 where it gives a limit: "max" gives none, so v1's holds. */
    ASSERT_OK(put(root, "/sys/fs/cgroup/memory.max", "max\n"));
    ASSERT_OK(put(root, "/sys/fs/cgroup/memory.current", "100\n"));
    ASSERT_EQ(worker_reserve_headroom(root), 805306368ull);
    ASSERT_OK(put(root, "/sys/fs/cgroup/memory.max", "536870912\n"));
    ASSERT_EQ(worker_reserve_headroom(root), 536870812ull);
    /* Over its limit already: no room at all. */
    ASSERT_OK(put(root, "/sys/fs/cgroup/memory.current", "600000000\n"));
    ASSERT_EQ(worker_reserve_headroom(root), 0);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    ASSERT_EQ(system(cmd), 0);
    ASSERT_TRUE(worker_reserve_headroom(NULL) > 0); /* this machine's */
    return 0;
}

TEST_MAIN(TEST(test_take_and_release), TEST(test_reopen), TEST(test_engine_from_reserve),
          TEST(test_headroom))
