/* test-cli.c: `spottrain simulate` and `spottrain predict` from the outside: exit codes,
 * error messages, JSON, decision export and plot. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "test.h"

static char out_buf[1 << 16];

/* Runs `spottrain ARGS` in the source dir; stdout+stderr in out_buf; returns exit code. */
static int sh(const char *args) {
    const char *bin = getenv("SPOTTRAIN_BIN"), *src = getenv("SPOTTRAIN_SRCDIR");
    if (!bin || !src)
        return -1;
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "cd '%s' && '%s' %s 2>&1", src, bin, args);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    size_t n = fread(out_buf, 1, sizeof(out_buf) - 1, f);
    out_buf[n] = 0;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#define PROF "--profile traces/parcae-cost-profiles.json --model gpt-1.5b_gbs128_mbs1"
#define TRACE "--trace traces/per-model/gpt-1.5b_p3_gbs128_mbs1.jsonl"
#define DEC "--decisions traces/decisions/gpt-1.5b_p3_gbs128_mbs1.json"

static int test_errors(void) {
    if (!getenv("SPOTTRAIN_BIN"))
        return TEST_SKIP;
    ASSERT_EQ(sh("simulate --trace /nonexistent.csv " PROF), 2);
    ASSERT_CONTAINS(out_buf, "/nonexistent.csv");
    ASSERT_EQ(sh("simulate " TRACE " " PROF " --policy liveput,bogus"), 2);
    ASSERT_CONTAINS(out_buf, "'bogus'");
    ASSERT_EQ(sh("simulate " TRACE), 2);
    ASSERT_CONTAINS(out_buf, "--profile");
    ASSERT_EQ(sh("simulate " PROF), 2);
    ASSERT_EQ(sh("simulate " TRACE " --profile traces/parcae-cost-profiles.json --model x"), 2);
    ASSERT_CONTAINS(out_buf, "no model 'x'");
    ASSERT_EQ(sh("simulate " TRACE " " PROF " --policy parcae"), 2);
    ASSERT_CONTAINS(out_buf, "--decisions");
    ASSERT_EQ(sh("simulate " TRACE " " PROF " --unannounced 2"), 2);
    ASSERT_EQ(sh("simulate " TRACE " " PROF " --notice -5"), 2);
    ASSERT_EQ(sh("simulate " TRACE " " PROF " --lookahead 0"), 2);
    ASSERT_EQ(sh("simulate " TRACE " " PROF " --count-window 1.5"), 2);
    ASSERT_CONTAINS(out_buf, "--count-window");
    ASSERT_EQ(sh("simulate --trace traces/toy-events.csv " PROF
                 " --policy liveput --count-window 720 --json"),
              0);
    ASSERT_CONTAINS(out_buf, "\"policy\": \"liveput\"");
    ASSERT_EQ(sh("simulate " TRACE " " PROF " --bogus-flag"), 2);
    ASSERT_EQ(sh("simulate --trace traces/README.md " PROF), 2);
    ASSERT_CONTAINS(out_buf, "README.md:");
    ASSERT_EQ(sh("simulate " TRACE " " PROF
                 " --decisions traces/decisions/vgg19_gbs2048_mbs32.json --policy parcae"),
              2);
    ASSERT_CONTAINS(out_buf, "666 intervals");
    ASSERT_EQ(sh("predict --eval"), 2);
    ASSERT_EQ(sh("predict --trace /nonexistent --eval"), 2);
    ASSERT_EQ(sh("predict --trace traces/events.csv --horizon 0"), 2);
    ASSERT_EQ(sh("simulate " TRACE " " PROF " --policy ideal --decisions-out /nonexistent/x"), 1);
    ASSERT_CONTAINS(out_buf, "cannot write");
    ASSERT_EQ(sh("simulate " TRACE " " PROF " --victims psychic"), 2);
    ASSERT_EQ(sh("simulate " TRACE " " PROF " --predictor crystal-ball"), 2);
    ASSERT_EQ(sh("simulate --bench-decide 0"), 2);
    ASSERT_EQ(sh("simulate --help"), 0);
    ASSERT_CONTAINS(out_buf, "--unannounced");
    return 0;
}

static int test_runs(void) {
    if (!getenv("SPOTTRAIN_BIN") || !getenv("SPOTTRAIN_BUILDDIR"))
        return TEST_SKIP;
    char tmp[512], args[2048];
    snprintf(tmp, sizeof(tmp), "%s/test-planner-cli-%d", getenv("SPOTTRAIN_BUILDDIR"),
             (int)getpid());
    snprintf(args, sizeof(args),
             "simulate " TRACE " " PROF " " DEC " --policy reactive,parcae,ideal --json "
             "--samples 32 --decisions-out '%s.json' --plot '%s.svg'",
             tmp, tmp);
    ASSERT_EQ(sh(args), 0);
    ASSERT_CONTAINS(out_buf, "\"policies\"");
    ASSERT_CONTAINS(out_buf, "\"committed_samples\"");
    ASSERT_CONTAINS(out_buf, "\"reconfigurations_by_kind\"");
    ASSERT_CONTAINS(out_buf, "\"samples_per_dollar\"");
    /* the export reads back as a Parcae decisions file, one entry per interval */
    char path[600];
    snprintf(path, sizeof(path), "%s.json", tmp);
    char *text = NULL;
    size_t len;
    ASSERT_OK(st_read_file(path, 1 << 24, &text, &len));
    ASSERT_CONTAINS(text, "\"reactive\"");
    ASSERT_CONTAINS(text, "\"interval\"");
    struct plan_decisions *d = NULL;
    struct st_error e;
    ASSERT_OK(plan_decisions_parse(path, text, len, &d, &e));
    ASSERT_EQ(d->n, 683);
    ASSERT_EQ(d->intervals[0][1], 18);
    plan_decisions_free(d);
    st_free(text);
    unlink(path);
    snprintf(path, sizeof(path), "%s.svg", tmp);
    ASSERT_OK(st_read_file(path, 1 << 24, &text, &len));
    ASSERT_CONTAINS(text, "<svg");
    ASSERT_CONTAINS(text, "polyline");
    st_free(text);
    unlink(path);
    /* a plain seconds,N step trace is accepted */
    snprintf(path, sizeof(path), "%s.steps", tmp);
    const char *steps = "# steps\n0,12\n600,12\n600,10\n1200,10\n1200,14\n1800,14\n";
    ASSERT_OK(st_write_file_atomic(path, steps, strlen(steps)));
    snprintf(args, sizeof(args), "simulate --trace '%s' " PROF " --policy liveput,reactive,ideal",
             path);
    ASSERT_EQ(sh(args), 0);
    ASSERT_CONTAINS(out_buf, "liveput");
    unlink(path);
    ASSERT_EQ(sh("predict --trace traces/events.csv --eval --horizon 4 --json"), 0);
    ASSERT_CONTAINS(out_buf, "\"mae\"");
    ASSERT_EQ(sh("simulate --bench-decide 32 " PROF), 0);
    ASSERT_CONTAINS(out_buf, "ms/decision");
    return 0;
}

TEST_MAIN(TEST(test_errors), TEST(test_runs))
