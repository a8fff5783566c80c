/* test-train.c: `spottrain train --local` end to end — real worker processes on loopback.
 *
 *  equivalence: after 20 steps, (1,2) and (1,4) checkpoints are bitwise equal to (1,1), and
 *               (2,1), (2,2), (4,1) within 1e-6 relative (the test prints whether bitwise);
 *  loss:        the quickstart-sized model on a synthetic Markov corpus gets within a stated
 *               margin of the corpus's entropy floor;
 *  dead rank:   SIGKILL of one worker makes the command exit 1 naming the rank, in time;
 *  input:       every invalid input exits 2 with a message naming it.
 * Each runs as its own meson test (the test name is the argument). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "migrate.h"
#include "test.h"
#include "tokens.h"

#define LOSS_STEPS 100
#define ST_STR2(x) #x
#define ST_STR(x) ST_STR2(x)

static char tmp[256];

static const char *bin(void) {
    const char *b = getenv("SPOTTRAIN_BIN");
    return b ? b : "build/spottrain";
}

static int make_tmp(void) {
    if (tmp[0])
        return 0;
    snprintf(tmp, sizeof(tmp), "/tmp/st-train-XXXXXX");
    return mkdtemp(tmp) ? 0 : -errno;
}

static void rm_tmp(void) {
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", tmp);
    tmp[0] = '\0';
}

/* Writes a job spec; model fields as given, synthetic order-`order` corpus. */
static int write_spec(const char *path, int layers, int hidden, int heads, int vocab, int T,
                      int micro, int global, int steps, double lr, int order, long tokens) {
    const char *src = getenv("SPOTTRAIN_SRCDIR");
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    fprintf(f,
            "apiVersion: spottrain/v1\nkind: TrainingJob\nmetadata:\n  name: t\nspec:\n"
            "  model: {layers: %d, hidden: %d, heads: %d, vocab: %d, seq_len: %d}\n"
            "  training:\n    micro_batch: %d\n    global_batch: %d\n    steps: %d\n"
            "    seed: 11\n    optimizer: {name: adamw, lr: %g, warmup_steps: 5, "
            "schedule: cosine, weight_decay: 0.1, grad_clip: 1.0}\n"
            "  data:\n    train: data-%d-%d.bin\n    synth: {kind: markov, order: %d, seed: 5, "
            "tokens: %ld}\n"
            "  fleet:\n    provider: sim\n    min: 1\n    max: 8\n"
            "    trace: %s/examples/traces/quickstart-trace.csv\n",
            layers, hidden, heads, vocab, T, micro, global, steps, lr, vocab, order, order,
            tokens, src ? src : ".");
    fclose(f);
    return 0;
}

/* Runs argv with stdout/stderr into files; kills it after timeout_s. Returns the exit status,
 * 128 + signal when killed by one, or -1 when it timed out. */
static int run(char *const argv[], const char *out, const char *err, double timeout_s) {
    pid_t pid = fork();
    if (pid < 0)
        return -2;
    if (pid == 0) {
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    struct timespec t0, now, ts = {0, 20 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int st;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec + (now.tv_nsec - t0.tv_nsec) / 1e9 > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        nanosleep(&ts, NULL);
    }
}

static char *slurp(const char *path) {
    char *d = NULL;
    size_t n;
    if (st_read_file(path, 1 << 24, &d, &n) < 0)
        return NULL;
    return d;
}

/* Last "step S/N loss X" loss in a file, or NAN. */
static double last_loss(const char *path, int *ret_lines) {
    char *d = slurp(path);
    double loss = NAN;
    int lines = 0;
    for (char *p = d; p && (p = strstr(p, "step ")); p++) {
        int s, n;
        double l, tps;
        if (sscanf(p, "step %d/%d loss %lf tokens/s %lf", &s, &n, &l, &tps) == 4) {
            loss = l;
            lines++;
        }
    }
    free(d);
    if (ret_lines)
        *ret_lines = lines;
    return loss;
}

static int train(const char *spec, int dp, int pp, const char *save, const char *tag,
                 double *ret_loss) {
    char sdp[16], spp[16], out[300], err[300];
    snprintf(sdp, sizeof(sdp), "%d", dp);
    snprintf(spp, sizeof(spp), "%d", pp);
    snprintf(out, sizeof(out), "%s/%s.out", tmp, tag);
    snprintf(err, sizeof(err), "%s/%s.err", tmp, tag);
    char *argv[] = {(char *)bin(), "train", "--local", "--dp", sdp, "--pp", spp,
                    "--threads", "1", "--save", (char *)save, (char *)spec, NULL};
    int rc = run(argv, out, err, 50.0);
    if (rc != 0) {
        char *e = slurp(err);
        fprintf(stderr, "  train dp %d pp %d exited %d: %s\n", dp, pp, rc, e ? e : "");
        free(e);
        return -1;
    }
    int lines;
    *ret_loss = last_loss(out, &lines);
    return lines;
}

/* Compares two checkpoints tensor by tensor: number of differing floats and the largest
 * relative difference. */
static int ckpt_compare(const char *a, const char *b, size_t *ret_ndiff, double *ret_rel,
                        size_t *ret_total) {
    struct mig_ckpt *ca = NULL, *cb = NULL;
    int r = mig_ckpt_open(a, &ca, NULL);
    if (r < 0)
        return r;
    r = mig_ckpt_open(b, &cb, NULL);
    if (r < 0) {
        mig_ckpt_free(ca);
        return r;
    }
    size_t ndiff = 0, total = 0;
    double rel = 0.0;
    if (mig_ckpt_nlayers(ca) != mig_ckpt_nlayers(cb))
        r = -EINVAL;
    for (int l = 0; r >= 0 && l < mig_ckpt_nlayers(ca); l++) {
        struct mig_ckpt_layer *la = NULL, *lb = NULL;
        if ((r = mig_ckpt_read_layer(ca, l, &la, NULL)) < 0)
            break;
        if ((r = mig_ckpt_read_layer(cb, l, &lb, NULL)) < 0) {
            mig_ckpt_layer_free(la);
            break;
        }
        for (size_t k = 0; k < la->ntensors; k++) {
            const struct mig_tensor *ta = &la->tensors[k];
            const struct mig_tensor *tb = mig_ckpt_layer_find(lb, ta->name, ta->kind);
            if (!tb || tb->count != ta->count) {
                r = -EINVAL;
                break;
            }
            for (size_t i = 0; i < ta->count; i++) {
                float x = ta->data[i], y = tb->data[i];
                total++;
                if (memcmp(&x, &y, sizeof(x)) != 0) {
                    ndiff++;
                    double d = fabs((double)x - y) / fmax(fabs((double)y), 1e-30);
                    if (fabs((double)x - y) < 1e-12) /* tiny absolute: moments near zero */
                        d = 0;
                    rel = fmax(rel, d);
                }
            }
        }
        mig_ckpt_layer_free(la);
        mig_ckpt_layer_free(lb);
    }
    mig_ckpt_free(ca);
    mig_ckpt_free(cb);
    *ret_ndiff = ndiff;
    *ret_rel = rel;
    *ret_total = total;
    return r;
}

static int test_equivalence(void) {
    ASSERT_OK(make_tmp());
    char spec[300], base[300];
    snprintf(spec, sizeof(spec), "%s/job.yaml", tmp);
    ASSERT_OK(write_spec(spec, 4, 32, 4, 64, 16, 1, 8, 20, 3e-3, 1, 200000));
    snprintf(base, sizeof(base), "%s/ck-1-1", tmp);
    double loss0, loss;
    ASSERT_EQ(train(spec, 1, 1, base, "1-1", &loss0), 20);
    const int shapes[5][2] = {{1, 2}, {1, 4}, {2, 1}, {2, 2}, {4, 1}};
    for (int i = 0; i < 5; i++) {
        int dp = shapes[i][0], pp = shapes[i][1];
        char dir[300], tag[32];
        snprintf(tag, sizeof(tag), "%d-%d", dp, pp);
        snprintf(dir, sizeof(dir), "%s/ck-%s", tmp, tag);
        ASSERT_EQ(train(spec, dp, pp, dir, tag, &loss), 20);
        size_t nd, total;
        double rel;
        ASSERT_OK(ckpt_compare(dir, base, &nd, &rel, &total));
        printf("# (%d,%d) vs (1,1) after 20 steps: %zu of %zu floats differ, max rel %.3g, "
               "final loss %.6f vs %.6f -> %s\n", dp, pp, nd, total, rel, loss, loss0,
               nd == 0 ? "bitwise" : "not bitwise");
        if (dp == 1) {
            ASSERT_EQ(nd, 0);
            ASSERT_TRUE(loss == loss0);
        } else {
            ASSERT_TRUE(rel <= 1e-6);
        }
        /* The interface outside checks use agrees: `spottrain ckpt diff` (bitwise for pp,
         * --rtol 1e-6 for dp). */
        char o[300], e[300];
        snprintf(o, sizeof(o), "%s/diff.out", tmp);
        snprintf(e, sizeof(e), "%s/diff.err", tmp);
        char *argv[] = {(char *)bin(), "ckpt", "diff", dir, base, "--rtol",
                        dp == 1 ? "0" : "1e-6", NULL};
        ASSERT_EQ(run(argv, o, e, 30.0), 0);
    }
    /* The checkpoint of the last run differs from an earlier state (the run trained). */
    char early[300];
    snprintf(early, sizeof(early), "%s/ck-early", tmp);
    char *argv[] = {(char *)bin(), "train", "--local", "--steps", "2", "--threads", "1",
                    "--save", early, spec, NULL};
    char o[300], e[300];
    char *dargv[] = {(char *)bin(), "ckpt", "diff", early, base, NULL};
    snprintf(o, sizeof(o), "%s/early.out", tmp);
    snprintf(e, sizeof(e), "%s/early.err", tmp);
    ASSERT_EQ(run(argv, o, e, 50.0), 0);
    size_t nd, total;
    double rel;
    ASSERT_OK(ckpt_compare(early, base, &nd, &rel, &total));
    ASSERT_GT(nd, total / 2);
    ASSERT_EQ(run(dargv, o, e, 30.0), 1); /* and ckpt diff says so */
    rm_tmp();
    return 0;
}

static int test_loss_floor(void) {
    ASSERT_OK(make_tmp());
    /* The quickstart model (4 layers, 64 wide, 4 heads, vocab 256, context 64, global batch
     * 16) on an order-1 Markov corpus: the floor is the source's entropy rate. */
    char spec[300], data[300];
    snprintf(spec, sizeof(spec), "%s/job.yaml", tmp);
    ASSERT_OK(write_spec(spec, 4, 64, 4, 256, 64, 8, 16, LOSS_STEPS, 1e-2, 1, 300000));
    struct st_synth_params p;
    st_synth_params_defaults(&p);
    p.vocab = 256;
    p.order = 1;
    p.seed = 5;
    p.ntokens = 300000;
    struct st_markov_entropy ent;
    ASSERT_OK(st_synth_entropy(&p, &ent));
    double floor = st_markov_floor(&ent, 1, 64);
    double loss;
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/ck", tmp);
    ASSERT_EQ(train(spec, 1, 1, dir, "loss", &loss), LOSS_STEPS);
    char out[300];
    snprintf(out, sizeof(out), "%s/loss.out", tmp);
    /* The first step's loss is near log(256) = 5.55 (uniform prediction). */
    char *d = slurp(out);
    double first = NAN;
    if (d)
        sscanf(d, "step 1/%*d loss %lf", &first);
    free(d);
    snprintf(data, sizeof(data), "%s/data-256-1.bin", tmp);
    struct stat st;
    int synthesized = stat(data, &st) == 0;
    printf("# loss: first %.4f, after " ST_STR(LOSS_STEPS) " steps %.4f; entropy floor %.4f nats; margin %.4f "
           "(allowed 0.35)\n", first, loss, floor, loss - floor);
    rm_tmp();
    ASSERT_TRUE(synthesized);
    ASSERT_NEAR(first, log(256.0), 0.15, 0);
    ASSERT_TRUE(loss >= floor - 0.05);
    ASSERT_TRUE(loss - floor <= 0.35);
    return 0;
}

/* First child pid of pid (from /proc), or -1. */
static pid_t child_of(pid_t pid, int index) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)pid, (int)pid);
    char *d = slurp(path);
    pid_t r = -1;
    char *p = d;
    for (int i = 0; p && *p; i++) {
        long v = strtol(p, &p, 10);
        if (v <= 0)
            break;
        if (i == index) {
            r = (pid_t)v;
            break;
        }
    }
    free(d);
    return r;
}

/* Starts a 2 x 2 run, waits for progress, then kills rank 2; with `hang`, also stops rank 1
 * (SIGSTOP) so that only the parent's timeout can end it. */
static int dead_rank_case(int hang) {
    ASSERT_OK(make_tmp());
    char spec[300], out[300], err[300];
    snprintf(spec, sizeof(spec), "%s/job.yaml", tmp);
    ASSERT_OK(write_spec(spec, 2, 32, 4, 64, 16, 1, 8, 1000000, 1e-3, 1, 100000));
    snprintf(out, sizeof(out), "%s/dead.out", tmp);
    snprintf(err, sizeof(err), "%s/dead.err", tmp);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        execl(bin(), bin(), "train", "--local", "--dp", "2", "--pp", "2", "--threads", "1",
              "--timeout", hang ? "1" : "10", spec, (char *)NULL);
        _exit(127);
    }
    /* Wait until training runs (progress lines), then kill rank 2 (stage 1, replica 0). */
    struct timespec ts = {0, 20 * 1000 * 1000};
    int lines = 0;
    for (int i = 0; i < 2000 && lines < 2; i++) {
        last_loss(out, &lines);
        nanosleep(&ts, NULL);
    }
    pid_t victim = child_of(pid, 2), stopped = hang ? child_of(pid, 1) : 0;
    int killed = lines >= 2 && victim > 0 && stopped >= 0 &&
                 (!hang || kill(stopped, SIGSTOP) == 0) && kill(victim, SIGKILL) == 0;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int st = 0, done = 0;
    double waited = 0;
    while (waited < 30.0) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            done = 1;
            break;
        }
        nanosleep(&ts, NULL);
        clock_gettime(CLOCK_MONOTONIC, &now);
        waited = now.tv_sec - t0.tv_sec + (now.tv_nsec - t0.tv_nsec) / 1e9;
    }
    if (!done) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    char *e = slurp(err);
    int named = e && strstr(e, "rank 2 (stage 1, replica 0) killed by signal 9") != NULL;
    int hung_named = !hang || (e && strstr(e, "rank 1 (stage 0, replica 1) killed by signal 9 "
                                              "(Killed) (stopped after the timeout)"));
    printf("# dead rank%s: exit after %.2f s; stderr tail: %s\n", hang ? " + hung rank" : "",
           waited, e ? e + (strlen(e) > 400 ? strlen(e) - 400 : 0) : "");
    free(e);
    rm_tmp();
    ASSERT_TRUE(killed);
    ASSERT_TRUE(done);
    ASSERT_TRUE(WIFEXITED(st));
    ASSERT_EQ(WEXITSTATUS(st), 1);
    ASSERT_TRUE(named);
    ASSERT_TRUE(hung_named);
    return 0;
}

static int test_dead_rank(void) {
    ASSERT_EQ(dead_rank_case(0), 0);
    ASSERT_EQ(dead_rank_case(1), 0);
    return 0;
}

/* Runs the CLI with extra arguments and checks exit code and a stderr substring. */
static int expect(int code, const char *needle, char *const argv[]) {
    char out[300], err[300];
    snprintf(out, sizeof(out), "%s/x.out", tmp);
    snprintf(err, sizeof(err), "%s/x.err", tmp);
    int rc = run(argv, out, err, 30.0);
    char *e = slurp(err), *o = slurp(out);
    int ok = rc == code && (!needle || (e && strstr(e, needle)) || (o && strstr(o, needle)));
    if (!ok)
        fprintf(stderr, "  %s %s ...: exit %d (want %d), stderr: %s\n", argv[1], argv[2], rc,
                code, e ? e : "");
    free(e);
    free(o);
    return ok;
}

static int test_bad_input(void) {
    ASSERT_OK(make_tmp());
    char spec[300], nosynth[300], badspec[300], baddata[300];
    snprintf(spec, sizeof(spec), "%s/job.yaml", tmp);
    ASSERT_OK(write_spec(spec, 2, 32, 4, 64, 16, 1, 8, 10, 1e-3, 1, 50000));
    char *B = (char *)bin();
#define X(code, needle, ...)                                                               \
    do {                                                                                   \
        char *argv_[] = {B, "train", __VA_ARGS__, NULL};                                   \
        ASSERT_TRUE(expect(code, needle, argv_));                                          \
    } while (0)
    X(0, "Usage: spottrain train", "--help");
    X(2, "only --local", "--dp", "1", spec);
    X(2, "missing JOB.yaml", "--local");
    X(2, "invalid --dp", "--local", "--dp", "0", spec);
    X(2, "invalid --pp", "--local", "--pp", "x", spec);
    X(2, "invalid --steps", "--local", "--steps", "-3", spec);
    X(2, "invalid --threads", "--local", "--threads", "0", spec);
    X(2, "invalid --timeout", "--local", "--timeout", "soon", spec);
    X(2, "unknown or incomplete option", "--local", "--frobnicate", spec);
    X(2, "more than the model's 4 layers", "--local", "--pp", "5", spec);
    X(2, "not a multiple of dp 3", "--local", "--dp", "3", spec);
    X(2, "expected one JOB.yaml", "--local", spec, spec);
    X(2, "more than 64 local workers", "--local", "--dp", "64", "--pp", "2", spec);
    X(2, "no-such.yaml", "--local", "/nonexistent/no-such.yaml");
    /* A spec error names file:line. */
    snprintf(badspec, sizeof(badspec), "%s/bad.yaml", tmp);
    FILE *f = fopen(badspec, "w");
    fprintf(f, "apiVersion: spottrain/v1\nkind: TrainingJob\nmetadata: {name: b}\nspec:\n"
               "  model: {layers: -1}\n");
    fclose(f);
    X(2, "bad.yaml:5", "--local", badspec);
    /* Data missing and no synth block. */
    snprintf(nosynth, sizeof(nosynth), "%s/nosynth.yaml", tmp);
    char *s = slurp(spec);
    char *cut = strstr(s, "    synth:");
    char *eol = strchr(cut, '\n');
    memmove(cut, eol + 1, strlen(eol + 1) + 1);
    char *tr = strstr(s, "train: data-");
    memcpy(tr, "train: miss-", 12);
    st_write_file_atomic(nosynth, s, strlen(s));
    free(s);
    X(2, "spec.data.train", "--local", nosynth);
    /* Data with tokens beyond the vocabulary. */
    snprintf(baddata, sizeof(baddata), "%s/miss-64-1.bin", tmp);
    uint16_t tok[100];
    for (int i = 0; i < 100; i++)
        tok[i] = (uint16_t)(i * 3);
    ASSERT_OK(st_tokens_write(baddata, ST_TOKENS_NANOGPT, tok, 100));
    X(2, "cannot use data", "--local", nosynth);
    /* Data shorter than one sample. */
    for (int i = 0; i < 10; i++)
        tok[i] = (uint16_t)i;
    ASSERT_OK(st_tokens_write(baddata, ST_TOKENS_NANOGPT, tok, 10));
    X(2, "shorter than seq_len + 1 tokens", "--local", nosynth);
    /* bf16 is a valid spec but not something the CPU engine does. */
    char bf16[300];
    snprintf(bf16, sizeof(bf16), "%s/bf16.yaml", tmp);
    s = slurp(spec);
    char *sd = strstr(s, "    seed: 11\n");
    ASSERT_TRUE(sd != NULL);
    char *s2 = malloc(strlen(s) + 64);
    memcpy(s2, s, (size_t)(sd - s));
    sprintf(s2 + (sd - s), "    precision: bf16\n%s", sd);
    st_write_file_atomic(bf16, s2, strlen(s2));
    free(s);
    free(s2);
    X(2, "precision bf16 is not supported", "--local", bf16);
    /* A corpus that cannot be written (its directory is a file): runtime failure, exit 1. */
    char unwritable[300];
    snprintf(unwritable, sizeof(unwritable), "%s/unwritable.yaml", tmp);
    s = slurp(spec);
    tr = strstr(s, "train: data-64-1.bin");
    ASSERT_TRUE(tr != NULL);
    memcpy(tr, "train: job.yaml/x.b", 19);
    st_write_file_atomic(unwritable, s, strlen(s));
    free(s);
    X(1, "cannot synthesize", "--local", unwritable);
    /* And a run that works, with the progress line format of the interface. */
    X(0, "step 10/10 loss ", "--local", "--pp", "2", spec);
    /* More than one thread per worker restarts once with OMP_WAIT_POLICY=passive. */
    X(0, "step 10/10 loss ", "--local", "--threads", "2", spec);
#undef X
    rm_tmp();
    return 0;
}

TEST_MAIN(TEST(test_equivalence), TEST(test_loss_floor), TEST(test_dead_rank),
          TEST(test_bad_input))
