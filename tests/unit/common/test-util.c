/* test-util.c: durations, sizes, ids, atomic files, error formatting, allocation failure. */
#include <limits.h>
#include <unistd.h>

#include "common.h"
#include "check.h"
#include "test.h"

static int test_duration(void) {
    double s;
    ASSERT_OK(st_parse_duration("60s", &s));
    ASSERT_NEAR(s, 60, 0, 0);
    ASSERT_OK(st_parse_duration("30m", &s));
    ASSERT_NEAR(s, 1800, 0, 0);
    ASSERT_OK(st_parse_duration("1.5h", &s));
    ASSERT_NEAR(s, 5400, 0, 0);
    ASSERT_OK(st_parse_duration("250ms", &s));
    ASSERT_NEAR(s, 0.25, 1e-12, 0);
    ASSERT_OK(st_parse_duration("7", &s));
    ASSERT_NEAR(s, 7, 0, 0);
    ASSERT_ERR(st_parse_duration("-5s", &s), -EINVAL);
    ASSERT_ERR(st_parse_duration("5 parsecs", &s), -EINVAL);
    ASSERT_ERR(st_parse_duration("", &s), -EINVAL);
    ASSERT_ERR(st_parse_duration("nan", &s), -EINVAL);
    ASSERT_ERR(st_parse_duration(NULL, &s), -EINVAL);
    return 0;
}

static int test_size(void) {
    uint64_t b;
    ASSERT_OK(st_parse_size("16GiB", &b));
    ASSERT_EQ(b, 16ULL << 30);
    ASSERT_OK(st_parse_size("512MiB", &b));
    ASSERT_EQ(b, 512ULL << 20);
    ASSERT_OK(st_parse_size("1GB", &b));
    ASSERT_EQ(b, 1000000000ULL);
    ASSERT_ERR(st_parse_size("1.5B", &b), -EINVAL);
    ASSERT_ERR(st_parse_size("12 GiB", &b), -EINVAL);
    ASSERT_ERR(st_parse_size("99999999999TiB", &b), -EINVAL);
    return 0;
}

static int test_uuid(void) {
    char a[ST_UUID_STR_LEN], b[ST_UUID_STR_LEN];
    st_uuid_new(a);
    st_uuid_new(b);
    ASSERT_TRUE(st_uuid_valid(a));
    ASSERT_TRUE(strcmp(a, b) != 0);
    ASSERT_FALSE(st_uuid_valid("not-a-uuid"));
    ASSERT_FALSE(st_uuid_valid(NULL));
    return 0;
}

static int test_files(void) {
    char dir[] = "/tmp/st-test-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    char path[PATH_MAX], sub[PATH_MAX];
    snprintf(sub, sizeof(sub), "%s/a/b/c", dir);
    ASSERT_OK(st_mkdir_p(sub, 0755));
    ASSERT_OK(st_mkdir_p(sub, 0755)); /* there already */
    snprintf(path, sizeof(path), "%s/f.txt", sub);
    ASSERT_OK(st_write_file_atomic(path, "hello", 5));
    /* A file in the directory's place, and one in a parent's. */
    ASSERT_ERR(st_mkdir_p(path, 0755), -ENOTDIR);
    char below[PATH_MAX + 8];
    snprintf(below, sizeof(below), "%s/d", path);
    ASSERT_ERR(st_mkdir_p(below, 0755), -ENOTDIR);
    char *data = NULL;
    size_t len = 0;
    ASSERT_OK(st_read_file(path, 100, &data, &len));
    ASSERT_EQ(len, 5);
    ASSERT_STREQ(data, "hello");
    st_free(data);
    ASSERT_ERR(st_read_file(path, 3, &data, &len), -EFBIG);
    snprintf(path, sizeof(path), "%s/missing", dir);
    ASSERT_ERR(st_read_file(path, 100, &data, &len), -ENOENT);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ASSERT_EQ(system(cmd), 0);
    return 0;
}

static int test_error_format(void) {
    struct st_error e = {0};
    ASSERT_ERR(st_error_set(&e, "job.yaml", 14, 5, "spec.training", "unknown key '%s'", "x"),
               -EINVAL);
    char buf[600];
    st_error_format(&e, buf, sizeof(buf));
    ASSERT_STREQ(buf, "job.yaml:14:5: spec.training: unknown key 'x'");
    return 0;
}

static int alloc_twice(void) {
    int r = 0;
    char *a = NULL, *b = NULL;
    a = st_strdup("a");
    if (!a) {
        r = -ENOMEM;
        goto out;
    }
    b = st_strdup("b");
    if (!b)
        r = -ENOMEM;
out:
    st_free(b);
    st_free(a);
    return r;
}

static int test_alloc_failure(void) {
    st_alloc_fail_after(1);
    ASSERT_ERR(alloc_twice(), -ENOMEM);
    st_alloc_fail_after(2);
    ASSERT_ERR(alloc_twice(), -ENOMEM);
    st_alloc_fail_after(0);
    ASSERT_OK(alloc_twice());
    return 0;
}

static int try_fails(void) {
    TRY(-EIO);
    return 0;
}

static int test_try(void) {
    ASSERT_ERR(try_fails(), -EIO);
    return 0;
}

/* Follows next[] from 0: a single cycle through all n positions. */
static bool one_cycle(const int *next, int n) {
    bool seen[64] = {false};
    int p = 0;
    for (int i = 0; i < n; i++) {
        if (p < 0 || p >= n || seen[p])
            return false;
        seen[p] = true;
        p = next[p];
    }
    return p == 0;
}

static int test_peer_ring(void) {
    int next[64];
    /* one zone (or none named): position order */
    const char *one[] = {"a", "a", "a", "a"};
    ASSERT_EQ(st_peer_ring(4, one, next), 4); /* all held in their own zone */
    for (int p = 0; p < 4; p++)
        ASSERT_EQ(next[p], (p + 1) % 4);
    ASSERT_EQ(st_peer_ring(3, NULL, next), 3);
    ASSERT_EQ(next[2], 0);
    /* a, b, c, a: position order would hold 3 in its own zone at 0; the ring is 0 1 3 2 */
    const char *abca[] = {"a", "b", "c", "a"};
    ASSERT_EQ(st_peer_ring(4, abca, next), 0);
    ASSERT_EQ(next[0], 1);
    ASSERT_EQ(next[1], 3);
    ASSERT_EQ(next[3], 2);
    ASSERT_EQ(next[2], 0);
    /* two zones, same-zone positions adjacent: every copy crosses */
    const char *aabb[] = {"a", "a", "b", "b", "a", "b"};
    ASSERT_EQ(st_peer_ring(6, aabb, next), 0);
    ASSERT_TRUE(one_cycle(next, 6));
    for (int p = 0; p < 6; p++)
        ASSERT_TRUE(strcmp(aabb[p], aabb[next[p]]) != 0);
    /* a zone with more than half: the fewest own-zone holders a cycle allows (5 a of 7: 3) */
    const char *many[] = {"a", "a", "a", "b", "a", "c", "a"};
    ASSERT_EQ(st_peer_ring(7, many, next), 3);
    ASSERT_TRUE(one_cycle(next, 7));
    /* odd n, largest group at most half: none */
    const char *odd[] = {"x", "y", "z", "x", "y"};
    ASSERT_EQ(st_peer_ring(5, odd, next), 0);
    ASSERT_TRUE(one_cycle(next, 5));
    ASSERT_EQ(st_peer_ring(0, NULL, next), -EINVAL);
    ASSERT_EQ(st_peer_ring(2, NULL, NULL), -EINVAL);
    st_alloc_fail_after(1);
    ASSERT_EQ(st_peer_ring(4, abca, next), -ENOMEM);
    st_alloc_fail_after(0);
    return 0;
}

/* ST_GROW: room for element n, doubling from `first`; a failed allocation leaves the array as
 * it was; a count that cannot double is refused. */
static int test_grow(void) {
    struct pair {
        int a, b;
    } *v = NULL;
    size_t n = 0, cap = 0;
    for (int i = 0; i < 100; i++) {
        ASSERT_OK(ST_GROW(v, n, cap, 4));
        ASSERT_LT(n, cap);
        v[n++] = (struct pair){i, -i};
    }
    ASSERT_EQ(cap, 128); /* 4, 8, ..., 128 */
    st_alloc_fail_after(1);
    for (; n < cap; n++)
        ASSERT_OK(ST_GROW(v, n, cap, 4)); /* room left: nothing allocated */
    ASSERT_EQ(ST_GROW(v, n, cap, 4), -ENOMEM);
    st_alloc_fail_after(0);
    ASSERT_EQ(cap, 128);
    for (int i = 0; i < 100; i++)
        ASSERT_TRUE(v[i].a == i && v[i].b == -i);
    size_t huge = SIZE_MAX / sizeof(*v) / 2 + 1;
    ASSERT_EQ(ST_GROW(v, huge, huge, 4), -ENOMEM); /* 2 x huge elements do not fit size_t */
    ASSERT_EQ(ST_GROW(v, 128, cap, 4), 0);
    ASSERT_EQ(cap, 256);
    st_free(v);
    return 0;
}

TEST_MAIN(TEST(test_duration), TEST(test_size), TEST(test_uuid), TEST(test_files),
          TEST(test_error_format), TEST(test_alloc_failure), TEST(test_try),
          TEST(test_peer_ring), TEST(test_grow))
