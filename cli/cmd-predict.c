/* cmd-predict.c: `spottrain predict` — forecast live instances from a trace.
 *
 * With --eval, every predictor forecasts after every interval of the trace and the mean
 * absolute error per horizon is printed (table or --json); without it, each predictor's
 * forecast for the L intervals after the trace's end. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "planner.h"
#include "trace-load.h" /* cli__trace_load: the same errors as simulate */

int cli_cmd_predict(int argc, char **argv) {
    const char *cmd = "predict";
    static const struct option opts[] = {
        {"trace", required_argument, NULL, 't'}, {"eval", no_argument, NULL, 'e'},
        {"horizon", required_argument, NULL, 'L'}, {"json", no_argument, NULL, 'j'},
        {"notice", required_argument, NULL, 'n'},  {"help", no_argument, NULL, 'h'},
        {"predictor", required_argument, NULL, 'p'},
        {0},
    };
    const char *trace_path = NULL;
    bool eval = false, json = false;
    int L = 12, c, only = -1; /* --predictor: only this one; -1 = every predictor */
    double notice = 120;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 't': trace_path = optarg; break;
        case 'e': eval = true; break;
        case 'j': json = true; break;
        case 'p': {
            enum plan_predictor pr;
            if (plan_predictor_parse(optarg, &pr) < 0)
                return cli_usage_error(cmd, "unknown --predictor '%s' (one of: %s)", optarg,
                                       plan_predictor_names());
            only = (int)pr;
            break;
        }
        case 'L': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || !*optarg || v < 1 || v > PLAN_MAX_LOOKAHEAD)
                return cli_usage_error(cmd, "bad --horizon '%s' (1..%d)", optarg,
                                       PLAN_MAX_LOOKAHEAD);
            L = (int)v;
            break;
        }
        case 'n': {
            char *end;
            notice = strtod(optarg, &end);
            if (*end || !*optarg || !(notice >= 0 && notice <= 86400))
                return cli_usage_error(cmd, "bad --notice '%s' (seconds, 0..86400)", optarg);
            break;
        }
        default:
            return cli_opt_help_or_unknown(cmd, c, argv);
        }
    }
    if (optind < argc)
        return cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    if (!trace_path)
        return cli_usage_error(cmd, "--trace FILE is required");
    struct plan_trace *t = NULL;
    int *counts = NULL, *outs = NULL;
    json_t *root = NULL;
    int r, rc = cli__trace_load(cmd, trace_path, &t);
    if (rc != CLI_EXIT_OK)
        return rc;
    int n = t->nintervals, hi = 0;
    counts = st_calloc((size_t)n, sizeof(int));
    outs = st_calloc((size_t)n, sizeof(int));
    if (!counts || !outs) {
        rc = CLI_EXIT_FAILURE;
        goto out;
    }
    for (int i = 0; i < n; i++) {
        counts[i] = plan_trace_n_after(t, i);
        outs[i] = t->iv[i].n_out;
        hi = ST_MAX(hi, counts[i]);
    }
    root = json_pack("{s:s,s:i,s:i,s:o}", "trace", trace_path, "intervals", n, "horizon", L,
                     "predictors", json_array());
    if (!root) {
        rc = CLI_EXIT_FAILURE;
        goto out;
    }
    if (eval && n < L + 3) {
        fprintf(stderr, "spottrain %s: trace '%s' has %d intervals, too few for horizon %d\n",
                cmd, trace_path, n, L);
        rc = CLI_EXIT_INPUT;
        goto out;
    }
    if (!json) {
        printf("%-11s", eval ? "MAE by h" : "forecast");
        for (int k = 0; k < L; k++)
            printf(" %6d", k + 1);
        printf(eval ? " %7s\n" : "\n", "mean");
    }
    for (int p = 0; p < PLAN_PRED_NKINDS; p++) {
        if (only >= 0 && p != only)
            continue;
        double mae[PLAN_MAX_LOOKAHEAD];
        int f[PLAN_MAX_LOOKAHEAD];
        json_t *arr = json_array();
        if (eval)
            r = plan_forecast_eval((enum plan_predictor)p, counts, outs, n, L, 0, hi, notice,
                                   mae);
        else
            r = plan_forecast((enum plan_predictor)p, counts, n, L, 0, hi, 1, f);
        if (r < 0 || !arr) {
            json_decref(arr);
            fprintf(stderr, "spottrain %s: predictor '%s' failed: %s\n", cmd,
                    plan_predictor_name((enum plan_predictor)p), st_strerror(r));
            rc = CLI_EXIT_FAILURE;
            goto out;
        }
        double mean = 0;
        if (!json)
            printf("%-11s", plan_predictor_name((enum plan_predictor)p));
        for (int k = 0; k < L; k++) {
            if (eval) {
                mean += mae[k] / L;
                json_array_append_new(arr, json_real(mae[k]));
                if (!json)
                    printf(" %6.3f", mae[k]);
            } else {
                json_array_append_new(arr, json_integer(f[k]));
                if (!json)
                    printf(" %6d", f[k]);
            }
        }
        if (!json)
            printf(eval ? " %7.3f\n" : "\n", mean);
        json_array_append_new(json_object_get(root, "predictors"),
                              json_pack("{s:s,s:o}", "predictor",
                                        plan_predictor_name((enum plan_predictor)p),
                                        eval ? "mae" : "forecast", arr));
    }
    if (json) {
        char *s = json_dumps(root, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
        printf("%s\n", s ? s : "{}");
        free(s);
    }
out:
    json_decref(root);
    st_free(counts);
    st_free(outs);
    plan_trace_free(t);
    return rc;
}
