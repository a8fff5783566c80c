/* test-ckpt.c: the checkpoint format — XXH64 against published values, round trip, torn and
 * corrupt checkpoints (flipped byte, truncated, bad magic, wrong version) detected with the
 * right message, mig_ckpt_latest skipping a bad newest one, allocation failures on open/read,
 * and `spottrain ckpt diff|info|verify` exit codes through the built binary.
 *
 * The one idea: each corruption is made by editing real files written by the writer, and each
 * test asserts on which check fired, not only that something failed. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "migrate.h"
#include "test.h"

#define NLAYERS 3
#define MODEL "{\"n_layer\": 1, \"n_embd\": 8, \"vocab\": 16}"

static char tmproot[256];

static int mk_root(void) {
    snprintf(tmproot, sizeof(tmproot), "/tmp/st-ckpt-test-XXXXXX");
    return mkdtemp(tmproot) ? 0 : -errno;
}

static void rm_rf(const char *p) {
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", p);
    if (system(cmd) != 0)
        fprintf(stderr, "  cleanup of %s failed\n", p);
}

static float val(int layer, int t, int kind, size_t e, float bias) {
    return ((float)(layer * 1000 + t * 100 + kind) + (float)e * 0.001f + 1.0f) * (1.0f + bias);
}

/* Writes a checkpoint of NLAYERS layers; layer l holds l + 1 tensors of 10 * (l + 1) + t
 * elements, each with all three kinds. bias scales every value by 1 + bias (diff tests). */
static int write_ckpt(const char *dir, uint64_t step, float bias, const char *model) {
    struct mig_ckpt_writer *w;
    if (mig_ckpt_writer_new(dir, &w) < 0)
        return -1;
    for (int l = 0; l < NLAYERS; l++) {
        struct mig_tensor t[3 * NLAYERS];
        float *bufs[3 * NLAYERS];
        char names[NLAYERS][32];
        size_t n = 0;
        for (int i = 0; i <= l; i++) {
            snprintf(names[i], sizeof(names[i]), "h.%d.w%d", l, i);
            for (int k = 0; k < ST_STATE_NKINDS; k++) {
                size_t cnt = 10 * (size_t)(l + 1) + (size_t)i;
                bufs[n] = malloc(cnt * sizeof(float));
                if (!bufs[n])
                    abort();
                for (size_t e = 0; e < cnt; e++)
                    bufs[n][e] = val(l, i, k, e, bias);
                t[n] = (struct mig_tensor){names[i], (enum st_state_kind)k, cnt, bufs[n]};
                n++;
            }
        }
        int r = mig_ckpt_write_layer(w, l, t, n);
        for (size_t i = 0; i < n; i++)
            free(bufs[i]);
        if (r < 0) {
            mig_ckpt_writer_free(w);
            return r;
        }
    }
    mig_ckpt_writer_free(w);
    struct mig_ckpt_meta m = {.model_json = model, .step = step, .samples_committed = step * 32,
                              .data_position = step * 32 + 1, .data_seed = 1234,
                              .opt_step = step, .extra_json = "{\"note\": \"test\"}"};
    return mig_ckpt_commit(dir, &m, NLAYERS);
}

static int path_of(char *buf, size_t size, const char *dir, const char *file) {
    snprintf(buf, size, "%s/%s", dir, file);
    return 0;
}

/* Overwrites len bytes at off (off < 0: from the end) of a file. */
static int patch_file(const char *path, long off, const void *data, size_t len) {
    int fd = open(path, O_RDWR);
    if (fd < 0)
        return -errno;
    struct stat sb;
    fstat(fd, &sb);
    off_t at = off >= 0 ? off : sb.st_size + off;
    ssize_t w = pwrite(fd, data, len, at);
    close(fd);
    return w == (ssize_t)len ? 0 : -EIO;
}

static int test_xxh64(void) {
    /* Values of the reference implementation (python-xxhash 3.x). */
    ASSERT_EQ(mig_xxh64("", 0, 0), 0xef46db3751d8e999ULL);
    ASSERT_EQ(mig_xxh64("a", 1, 0), 0xd24ec4f1a98c6e5bULL);
    ASSERT_EQ(mig_xxh64("abc", 3, 0), 0x44bc2cf5ad770999ULL);
    ASSERT_EQ(mig_xxh64("abc", 3, 7), 0x9e755206156676d7ULL);
    unsigned char b[768];
    for (int i = 0; i < 768; i++)
        b[i] = (unsigned char)i;
    ASSERT_EQ(mig_xxh64(b, sizeof(b), 0), 0x8e03c838c596036fULL);
    ASSERT_EQ(mig_xxh64(b, sizeof(b), 7), 0xb1e10f6c5294cd6bULL);
    return 0;
}

static int test_round_trip(void) {
    char dir[512];
    struct mig_ckpt *c;
    struct mig_ckpt_meta m;
    struct st_error err;
    ASSERT_OK(mk_root());
    snprintf(dir, sizeof(dir), "%s/step-5", tmproot);
    ASSERT_OK(write_ckpt(dir, 5, 0, MODEL));
    ASSERT_OK(mig_ckpt_open(dir, &c, &err));
    ASSERT_EQ(mig_ckpt_nlayers(c), NLAYERS);
    mig_ckpt_get_meta(c, &m);
    ASSERT_EQ(m.step, 5);
    ASSERT_EQ(m.samples_committed, 160);
    ASSERT_EQ(m.data_position, 161);
    ASSERT_EQ(m.data_seed, 1234);
    ASSERT_EQ(m.opt_step, 5);
    ASSERT_STREQ(m.model_json, "{\"n_embd\":8,\"n_layer\":1,\"vocab\":16}");
    ASSERT_STREQ(m.extra_json, "{\"note\":\"test\"}");
    for (int l = 0; l < NLAYERS; l++) {
        struct mig_ckpt_layer *ly;
        size_t nt;
        uint64_t el;
        ASSERT_OK(mig_ckpt_layer_info(c, l, &nt, &el));
        ASSERT_EQ(nt, 3 * (size_t)(l + 1));
        ASSERT_OK(mig_ckpt_read_layer(c, l, &ly, &err));
        ASSERT_EQ(ly->layer, l);
        ASSERT_EQ(ly->ntensors, nt);
        for (int i = 0; i <= l; i++) {
            char name[32];
            snprintf(name, sizeof(name), "h.%d.w%d", l, i);
            for (int k = 0; k < ST_STATE_NKINDS; k++) {
                const struct mig_tensor *t = mig_ckpt_layer_find(ly, name,
                                                                 (enum st_state_kind)k);
                ASSERT_TRUE(t != NULL);
                ASSERT_EQ(t->count, 10 * (size_t)(l + 1) + (size_t)i);
                for (size_t e = 0; e < t->count; e++)
                    ASSERT_TRUE(t->data[e] == val(l, i, k, e, 0));
            }
        }
        ASSERT_TRUE(mig_ckpt_layer_find(ly, "nope", ST_STATE_PARAM) == NULL);
        mig_ckpt_layer_free(ly);
    }
    ASSERT_OK(mig_ckpt_verify(c, &err));
    ASSERT_ERR(mig_ckpt_layer_info(c, NLAYERS, NULL, NULL), -EINVAL);
    mig_ckpt_free(c);
    ASSERT_STREQ(st_state_kind_name(ST_STATE_ADAM_V), "adam_v");
    ASSERT_STREQ(st_state_kind_name((enum st_state_kind)3), "?");
    rm_rf(tmproot);
    return 0;
}

/* Opens (and verifies) dir expecting error r with msg in the message. */
static int expect_bad(const char *dir, int want, const char *msg) {
    struct mig_ckpt *c = NULL;
    struct st_error err = {0};
    int r = mig_ckpt_open(dir, &c, &err);
    if (r >= 0) {
        r = mig_ckpt_verify(c, &err);
        mig_ckpt_free(c);
    }
    ASSERT_EQ(r, want);
    ASSERT_CONTAINS(err.message, msg);
    return 0;
}

static int test_corrupt(void) {
    char dir[512], p[600], q[600];
    ASSERT_OK(mk_root());
    snprintf(dir, sizeof(dir), "%s/c", tmproot);
    path_of(p, sizeof(p), dir, "layer-0001.bin");
    path_of(q, sizeof(q), dir, "manifest.json");

    /* Torn: no manifest. */
    ASSERT_OK(write_ckpt(dir, 1, 0, MODEL));
    ASSERT_OK(unlink(q));
    if (expect_bad(dir, -ENOENT, "manifest.json missing"))
        return 1;

    /* Flipped payload byte: checksum. */
    ASSERT_OK(write_ckpt(dir, 1, 0, MODEL));
    ASSERT_OK(patch_file(p, -20, "\x7f", 1));
    if (expect_bad(dir, -EBADMSG, "checksum mismatch"))
        return 1;

    /* Truncated. */
    ASSERT_OK(write_ckpt(dir, 1, 0, MODEL));
    struct stat sb;
    ASSERT_OK(stat(p, &sb));
    ASSERT_OK(truncate(p, sb.st_size - 100));
    if (expect_bad(dir, -EBADMSG, "truncated"))
        return 1;
    ASSERT_OK(truncate(p, 20));
    if (expect_bad(dir, -EBADMSG, "truncated"))
        return 1;

    /* Bad magic. */
    ASSERT_OK(write_ckpt(dir, 1, 0, MODEL));
    ASSERT_OK(patch_file(p, 0, "NOTCKPT!", 8));
    if (expect_bad(dir, -EBADMSG, "bad magic"))
        return 1;

    /* Wrong version. */
    ASSERT_OK(write_ckpt(dir, 1, 0, MODEL));
    ASSERT_OK(patch_file(p, 8, "\x07\0\0\0", 4));
    if (expect_bad(dir, -EBADMSG, "unsupported version 7"))
        return 1;

    /* A valid layer file from another checkpoint swapped in after the commit. */
    char other[512], op[600];
    snprintf(other, sizeof(other), "%s/other", tmproot);
    ASSERT_OK(write_ckpt(dir, 1, 0, MODEL));
    ASSERT_OK(write_ckpt(other, 1, 0.5f, MODEL));
    path_of(op, sizeof(op), other, "layer-0001.bin");
    ASSERT_OK(rename(op, p));
    if (expect_bad(dir, -EBADMSG, "manifest says"))
        return 1;

    /* Missing layer file, manifest with a bad version, manifest not JSON. */
    ASSERT_OK(write_ckpt(dir, 1, 0, MODEL));
    ASSERT_OK(unlink(p));
    if (expect_bad(dir, -ENOENT, "layer file missing"))
        return 1;
    ASSERT_OK(write_ckpt(dir, 1, 0, MODEL));
    char *text;
    ASSERT_OK(st_read_file(q, 1 << 20, &text, NULL));
    char *v = strstr(text, "\"version\": 1");
    ASSERT_TRUE(v != NULL);
    v[11] = '9';
    ASSERT_OK(st_write_file_atomic(q, text, strlen(text)));
    st_free(text);
    if (expect_bad(dir, -EBADMSG, "unsupported manifest version 9"))
        return 1;
    ASSERT_OK(st_write_file_atomic(q, "[1,", 3));
    if (expect_bad(dir, -EBADMSG, "manifest is not a JSON object"))
        return 1;
    if (expect_bad("/nonexistent/ckpt", -ENOENT, "not a checkpoint directory"))
        return 1;

    /* Commit refuses bad layers and bad metadata. */
    ASSERT_OK(write_ckpt(dir, 1, 0, MODEL));
    ASSERT_OK(patch_file(p, -20, "\x7f", 1));
    struct mig_ckpt_meta m = {.model_json = MODEL};
    ASSERT_ERR(mig_ckpt_commit(dir, &m, NLAYERS), -EBADMSG);
    ASSERT_ERR(mig_ckpt_commit(dir, &m, NLAYERS + 1), -EBADMSG);
    m.model_json = "[1]";
    ASSERT_ERR(mig_ckpt_commit(dir, &m, 1), -EINVAL);
    m.model_json = MODEL;
    m.extra_json = "{bad";
    ASSERT_ERR(mig_ckpt_commit(dir, &m, 1), -EINVAL);
    m.extra_json = NULL;
    m.step = UINT64_MAX;
    ASSERT_ERR(mig_ckpt_commit(dir, &m, 1), -ERANGE);
    m.step = 0;
    ASSERT_OK(unlink(p));
    ASSERT_ERR(mig_ckpt_commit(dir, &m, NLAYERS), -ENOENT);
    ASSERT_OK(mig_ckpt_commit(dir, &m, 1)); /* layer 0 alone is fine */

    /* Writer argument checks. */
    struct mig_ckpt_writer *w;
    float f[2] = {1, 2};
    struct mig_tensor dup[2] = {{"a", ST_STATE_PARAM, 2, f}, {"a", ST_STATE_PARAM, 2, f}};
    struct mig_tensor noname[1] = {{"", ST_STATE_PARAM, 2, f}};
    struct mig_tensor badkind[1] = {{"a", (enum st_state_kind)5, 2, f}};
    ASSERT_OK(mig_ckpt_writer_new(dir, &w));
    ASSERT_ERR(mig_ckpt_write_layer(w, 0, dup, 2), -EINVAL);
    ASSERT_ERR(mig_ckpt_write_layer(w, 0, noname, 1), -EINVAL);
    ASSERT_ERR(mig_ckpt_write_layer(w, 0, badkind, 1), -EINVAL);
    ASSERT_ERR(mig_ckpt_write_layer(w, -1, dup, 1), -EINVAL);
    ASSERT_OK(mig_ckpt_write_layer(w, 0, dup, 1));
    ASSERT_OK(mig_ckpt_write_layer(w, 1, NULL, 0)); /* an empty layer is valid */
    mig_ckpt_writer_free(w);
    ASSERT_ERR(mig_ckpt_writer_new("", &w), -EINVAL);
    rm_rf(tmproot);
    return 0;
}

static int test_latest(void) {
    char dir[512], buf[512], p[600];
    ASSERT_OK(mk_root());
    ASSERT_ERR(mig_ckpt_latest(tmproot, buf, sizeof(buf)), -ENOENT);
    for (int s = 1; s <= 4; s++) {
        snprintf(dir, sizeof(dir), "%s/step-%d", tmproot, s * 10);
        ASSERT_OK(write_ckpt(dir, (uint64_t)s * 10, 0, MODEL));
    }
    snprintf(dir, sizeof(dir), "%s/step-not-a-number", tmproot);
    ASSERT_OK(mkdir(dir, 0755));
    ASSERT_OK(mig_ckpt_latest(tmproot, buf, sizeof(buf)));
    snprintf(dir, sizeof(dir), "%s/step-40", tmproot);
    ASSERT_STREQ(buf, dir);
    /* Newest torn, next corrupt: the third newest wins. */
    path_of(p, sizeof(p), dir, "manifest.json");
    ASSERT_OK(unlink(p));
    snprintf(dir, sizeof(dir), "%s/step-30", tmproot);
    path_of(p, sizeof(p), dir, "layer-0002.bin");
    ASSERT_OK(patch_file(p, -30, "\x01\x02", 2));
    ASSERT_OK(mig_ckpt_latest(tmproot, buf, sizeof(buf)));
    snprintf(dir, sizeof(dir), "%s/step-20", tmproot);
    ASSERT_STREQ(buf, dir);
    ASSERT_ERR(mig_ckpt_latest(tmproot, buf, 5), -ENAMETOOLONG);
    ASSERT_ERR(mig_ckpt_latest("/nonexistent/root", buf, sizeof(buf)), -ENOENT);
    rm_rf(tmproot);
    return 0;
}

/* Layers written at the same time by different processes into one directory, then one
 * commit: the writer keeps no shared state, each layer file is renamed into place whole. */
static int test_parallel_writers(void) {
    char dir[512];
    struct mig_ckpt *c;
    struct mig_ckpt_layer *l;
    struct st_error err;
    pid_t pids[4];
    ASSERT_OK(mk_root());
    snprintf(dir, sizeof(dir), "%s/step-9", tmproot);
    fflush(stdout);
    for (int i = 0; i < 4; i++) {
        pids[i] = fork();
        ASSERT_TRUE(pids[i] >= 0);
        if (pids[i] == 0) {
            struct mig_ckpt_writer *w;
            size_t cnt = 100000 + (size_t)i;
            float *p = malloc(cnt * 4), *m = malloc(cnt * 4), *v = malloc(cnt * 4);
            if (!p || !m || !v || mig_ckpt_writer_new(dir, &w) < 0)
                exit(1);
            for (size_t e = 0; e < cnt; e++) {
                p[e] = (float)e + (float)i;
                m[e] = -(float)e;
                v[e] = (float)i;
            }
            struct mig_tensor t[3] = {{"w", ST_STATE_PARAM, cnt, p}, {"w", ST_STATE_ADAM_M, cnt, m},
                                      {"w", ST_STATE_ADAM_V, cnt, v}};
            int r = mig_ckpt_write_layer(w, i, t, 3);
            mig_ckpt_writer_free(w);
            free(p);
            free(m);
            free(v);
            exit(r < 0 ? 1 : 0);
        }
    }
    for (int i = 0; i < 4; i++) {
        int st;
        ASSERT_EQ(waitpid(pids[i], &st, 0), pids[i]);
        ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    struct mig_ckpt_meta m = {.model_json = MODEL, .step = 9};
    ASSERT_OK(mig_ckpt_commit(dir, &m, 4));
    ASSERT_OK(mig_ckpt_open(dir, &c, &err));
    ASSERT_OK(mig_ckpt_read_layer(c, 3, &l, &err));
    const struct mig_tensor *t = mig_ckpt_layer_find(l, "w", ST_STATE_PARAM);
    ASSERT_TRUE(t != NULL);
    ASSERT_EQ(t->count, 100003);
    ASSERT_TRUE(t->data[100002] == 100005.0f);
    mig_ckpt_layer_free(l);
    mig_ckpt_free(c);
    rm_rf(tmproot);
    return 0;
}

/* Every allocation of open + read + verify failing in turn: -ENOMEM, never a crash or leak. */
static int test_alloc_failures(void) {
    char dir[512];
    ASSERT_OK(mk_root());
    snprintf(dir, sizeof(dir), "%s/step-1", tmproot);
    ASSERT_OK(write_ckpt(dir, 1, 0, MODEL));
    int ok_at = -1;
    for (long n = 1; n < 1000 && ok_at < 0; n++) {
        struct mig_ckpt *c = NULL;
        struct mig_ckpt_layer *l = NULL;
        struct st_error err;
        st_alloc_fail_after(n);
        int r = mig_ckpt_open(dir, &c, &err);
        if (r >= 0)
            r = mig_ckpt_read_layer(c, 2, &l, &err);
        if (r >= 0)
            r = mig_ckpt_verify(c, &err);
        st_alloc_fail_after(0);
        mig_ckpt_layer_free(l);
        mig_ckpt_free(c);
        if (r == 0)
            ok_at = (int)n;
        else
            ASSERT_ERR(r, -ENOMEM);
    }
    ASSERT_GT(ok_at, 3);
    char buf[512];
    for (long n = 1; n < 200; n++) {
        st_alloc_fail_after(n);
        int r = mig_ckpt_latest(tmproot, buf, sizeof(buf));
        st_alloc_fail_after(0);
        if (r == 0)
            break;
        ASSERT_ERR(r, -ENOMEM);
    }
    rm_rf(tmproot);
    return 0;
}

/* Runs the spottrain binary with args, output to a file; returns its exit code. */
static int run_bin(const char *out, const char *args) {
    const char *bin = getenv("SPOTTRAIN_BIN");
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "'%s' %s >'%s' 2>&1", bin, args, out);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

static int test_cli(void) {
    const char *bin = getenv("SPOTTRAIN_BIN");
    if (!bin || access(bin, X_OK) != 0)
        return TEST_SKIP;
    char a[512], b[512], c[512], d[512], e[512], out[512], args[2600];
    char *text = NULL;
    ASSERT_OK(mk_root());
    snprintf(a, sizeof(a), "%s/a", tmproot);
    snprintf(b, sizeof(b), "%s/b", tmproot);
    snprintf(c, sizeof(c), "%s/c", tmproot);
    snprintf(d, sizeof(d), "%s/d", tmproot);
    snprintf(e, sizeof(e), "%s/e", tmproot);
    snprintf(out, sizeof(out), "%s/out.txt", tmproot);
    ASSERT_OK(write_ckpt(a, 3, 0, MODEL));
    ASSERT_OK(write_ckpt(b, 3, 0, MODEL));
    ASSERT_OK(write_ckpt(c, 3, 1e-3f, MODEL)); /* relative differences up to ~1e-3 */
    ASSERT_OK(write_ckpt(d, 3, 0, "{\"n_layer\": 2}"));
    ASSERT_OK(write_ckpt(e, 3, 0, MODEL));
    char p[600];
    path_of(p, sizeof(p), e, "layer-0002.bin");
    ASSERT_OK(patch_file(p, -20, "\x55", 1));

    snprintf(args, sizeof(args), "ckpt diff '%s' '%s'", a, b);
    ASSERT_EQ(run_bin(out, args), 0);
    ASSERT_OK(st_read_file(out, 1 << 20, &text, NULL));
    ASSERT_CONTAINS(text, "layer 0 param max_rel 0\n");
    ASSERT_CONTAINS(text, "layer 2 adam_v max_rel 0\n");
    st_free(text);

    snprintf(args, sizeof(args), "ckpt diff '%s' '%s'", a, c);
    ASSERT_EQ(run_bin(out, args), 1);
    ASSERT_OK(st_read_file(out, 1 << 20, &text, NULL));
    ASSERT_CONTAINS(text, "layer 1 adam_m max_rel ");
    ASSERT_CONTAINS(text, "differ");
    st_free(text);
    snprintf(args, sizeof(args), "ckpt diff '%s' '%s' --rtol 1e-2", a, c);
    ASSERT_EQ(run_bin(out, args), 0);
    snprintf(args, sizeof(args), "ckpt diff --rtol 1e-7 '%s' '%s'", a, c);
    ASSERT_EQ(run_bin(out, args), 1);

    snprintf(args, sizeof(args), "ckpt diff '%s' '%s'", a, d);
    ASSERT_EQ(run_bin(out, args), 2);
    ASSERT_OK(st_read_file(out, 1 << 20, &text, NULL));
    ASSERT_CONTAINS(text, "different models");
    st_free(text);
    snprintf(args, sizeof(args), "ckpt diff '%s' '%s'", a, e);
    ASSERT_EQ(run_bin(out, args), 2);
    ASSERT_OK(st_read_file(out, 1 << 20, &text, NULL));
    ASSERT_CONTAINS(text, "checksum mismatch");
    st_free(text);
    snprintf(args, sizeof(args), "ckpt diff '%s' '%s/missing'", a, tmproot);
    ASSERT_EQ(run_bin(out, args), 2);
    snprintf(args, sizeof(args), "ckpt diff '%s' '%s' --rtol -1", a, b);
    ASSERT_EQ(run_bin(out, args), 2);
    snprintf(args, sizeof(args), "ckpt diff '%s'", a);
    ASSERT_EQ(run_bin(out, args), 2);
    ASSERT_EQ(run_bin(out, "ckpt frobnicate x"), 2);
    ASSERT_EQ(run_bin(out, "ckpt"), 2);
    ASSERT_EQ(run_bin(out, "ckpt --help"), 0);
    ASSERT_OK(st_read_file(out, 1 << 20, &text, NULL));
    ASSERT_CONTAINS(text, "spottrain ckpt diff A B [--rtol X]");
    st_free(text);

    snprintf(args, sizeof(args), "ckpt info '%s'", a);
    ASSERT_EQ(run_bin(out, args), 0);
    ASSERT_OK(st_read_file(out, 1 << 20, &text, NULL));
    ASSERT_CONTAINS(text, "step 3, samples committed 96, optimizer step 3");
    ASSERT_CONTAINS(text, "layers 3");
    st_free(text);
    snprintf(args, sizeof(args), "ckpt verify '%s'", a);
    ASSERT_EQ(run_bin(out, args), 0);
    snprintf(args, sizeof(args), "ckpt verify '%s'", e);
    ASSERT_EQ(run_bin(out, args), 1);
    snprintf(args, sizeof(args), "ckpt verify '%s/missing'", tmproot);
    ASSERT_EQ(run_bin(out, args), 2);
    path_of(p, sizeof(p), b, "manifest.json");
    ASSERT_OK(unlink(p));
    snprintf(args, sizeof(args), "ckpt verify '%s'", b);
    ASSERT_EQ(run_bin(out, args), 1);
    ASSERT_OK(st_read_file(out, 1 << 20, &text, NULL));
    ASSERT_CONTAINS(text, "torn");
    st_free(text);
    snprintf(args, sizeof(args), "ckpt info '%s'", b);
    ASSERT_EQ(run_bin(out, args), 2);
    rm_rf(tmproot);
    return 0;
}

/* Names in dir (not . and ..): how many, and how many are temporary files. */
static int count_files(const char *dir, int *ret_tmp) {
    DIR *d = opendir(dir);
    if (!d)
        return -errno;
    int n = 0, tmp = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        n++;
        tmp += strstr(e->d_name, ".tmp.") != NULL;
    }
    closedir(d);
    *ret_tmp = tmp;
    return n;
}

/* A disk that fills while the second layer is written (the hook): that write fails with
 * -ENOSPC and leaves neither the layer nor its temporary file, the checkpoint is never
 * committed (latest finds none), and once space is back the same directory is written whole. */
static int test_write_enospc(void) {
    char dir[512], path[600];
    int tmp = -1;
    ASSERT_OK(mk_root());
    snprintf(dir, sizeof(dir), "%s/step-5", tmproot);
    mig_ckpt_write_fail_at(2);
    ASSERT_ERR(write_ckpt(dir, 5, 0, MODEL), -ENOSPC);
    ASSERT_EQ(count_files(dir, &tmp), 1); /* layer 0 only */
    ASSERT_EQ(tmp, 0);
    snprintf(path, sizeof(path), "%s/layer-0001.bin", dir);
    ASSERT_ERR(access(path, F_OK) < 0 ? -errno : 0, -ENOENT);
    ASSERT_ERR(mig_ckpt_latest(tmproot, path, sizeof(path)), -ENOENT);
    ASSERT_OK(write_ckpt(dir, 5, 0, MODEL));
    mig_ckpt_write_fail_at(0);
    ASSERT_EQ(count_files(dir, &tmp), NLAYERS + 1);
    ASSERT_EQ(tmp, 0);
    struct mig_ckpt *c = NULL;
    struct st_error err;
    ASSERT_OK(mig_ckpt_open(dir, &c, &err));
    ASSERT_OK(mig_ckpt_verify(c, &err));
    mig_ckpt_free(c);
    ASSERT_OK(mig_ckpt_latest(tmproot, path, sizeof(path)));
    ASSERT_STREQ(path, dir);
    rm_rf(tmproot);
    return 0;
}

TEST_MAIN(TEST(test_xxh64), TEST(test_round_trip), TEST(test_corrupt), TEST(test_latest),
          TEST(test_parallel_writers), TEST(test_alloc_failures),
          TEST(test_write_enospc), TEST(test_cli))
