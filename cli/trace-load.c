/* trace-load.c: the trace file of `predict --trace` and `simulate --trace`.
 *
 * One idea: a command names its input errors the same way whichever command read the file,
 * so tests and users match one message; the text is dropped once parsed (the trace keeps no
 * pointer into it). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "planner.h" /* plan_trace_parse */
#include "trace-load.h"

#define TRACE_FILE_MAX (64u << 20)

/* See trace-load.h. */
int cli__trace_load(const char *cmd, const char *path, struct plan_trace **ret) {
    char *text = NULL;
    size_t len = 0;
    int r = st_read_file(path, TRACE_FILE_MAX, &text, &len);
    if (r < 0) {
        fprintf(stderr, "spottrain %s: cannot read trace '%s': %s\n", cmd, path, st_strerror(r));
        return CLI_EXIT_INPUT;
    }
    struct st_error err;
    memset(&err, 0, sizeof(err));
    r = plan_trace_parse(path, text, len, ret, &err);
    st_free(text);
    if (r < 0) {
        char buf[1024];
        st_error_format(&err, buf, sizeof(buf));
        fprintf(stderr, "spottrain %s: %s\n", cmd, buf);
        return r == -ENOMEM ? CLI_EXIT_FAILURE : CLI_EXIT_INPUT;
    }
    return CLI_EXIT_OK;
}

/* See trace-load.h. */
int cli__trace_check(const char *cmd, const char *path) {
    struct plan_trace *t = NULL;
    int code = cli__trace_load(cmd, path, &t);
    plan_trace_free(t);
    return code;
}
