/* cmd-run.c: `spottrain run JOB.yaml` — a whole job on this machine: the coordinator
 * in-process, a simulated spot fleet replaying the spec's trace, one worker process per
 * instance, and the planning loop until every step is done.
 *
 * One idea: nothing here is special to the demo. The job driver (coordinator/job.h) runs the
 * same coordinator, planning loop and workers a real fleet uses; this command only parses
 * flags, asks for the sim fleet on loopback, and prints what the driver reports.
 * docs/live-migration.md explains the rest. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "job-ui.h" /* cli__job_*: the run shared with launch */
#include "cloud.h"
#include "common.h"
#include "coord-loop.h"
#include "coordinator.h"
#include "migrate.h"
#include "planner.h"
#include "trace-load.h" /* cli__trace_check */

struct run_opts {
    const char *job;
    const char *save;
    const char *json;
    const char *costs;  /* --save-costs */
    const char *state_dir;
    const char *shapes;
    int steps;          /* 0 = spec */
    double time_scale;  /* 0 = spec */
    int threads;        /* per worker; 0 = 1 */
};

static int parse_num(const char *flag, const char *s, double lo, double hi, double *ret) {
    char *e;
    double v = strtod(s, &e);
    if (!*s || *e || !(v >= lo) || !(v <= hi))
        return cli_usage_error("run", "invalid %s '%s' (expected a number in %g..%g)", flag, s,
                               lo, hi);
    *ret = v;
    return 0;
}

static int run_job(const struct run_opts *o, struct st_spec *spec) {
    struct cli_job *j = cli__job_new("run", spec, o->job, o->save);
    char state[PATH_MAX] = "", journal[PATH_MAX + 16];
    int code, r;

    if (!j)
        return CLI_EXIT_FAILURE;
    /* State directory: journal, token, worker logs, checkpoints. */
    if ((code = cli__job_state_dir("run", o->state_dir, "--state-dir", state, sizeof(state))) !=
        CLI_EXIT_OK)
        goto out;
    /* What the job writes at its end, checked before any worker starts: a --save that cannot
     * be written would fail the workers' final save, a --json-summary the summary. */
    if ((code = cli__job_check_outputs("run", o->save, true, o->json)) != CLI_EXIT_OK ||
        (o->costs && (code = cli__job_check_file("run", "--save-costs", o->costs)) != CLI_EXIT_OK))
        goto out;
    struct coord_config *cc = &j->cc;
    snprintf(cc->listen, sizeof(cc->listen), "127.0.0.1:0");
    snprintf(cc->status_listen, sizeof(cc->status_listen), "127.0.0.1:0");
    snprintf(journal, sizeof(journal), "%s/journal", state);
    snprintf(cc->state_dir, sizeof(cc->state_dir), "%s", journal); /* the coordinator's */

    struct coord_job_config *jc = &j->jc;
    jc->fleet = COORD_JOB_FLEET_SIM;
    jc->on_stop = COORD_JOB_STOP_RELEASE;
    jc->shapes = o->shapes;
    jc->time_scale = o->time_scale;
    jc->worker_threads = o->threads;
    jc->heartbeat_deadline = 6;
    snprintf(jc->work_dir, sizeof(jc->work_dir), "%s", state); /* token, checkpoints */

    if (!getenv("SPOTTRAIN_DEBUG"))
        st_log_set_level(ST_LOG_WARN); /* events print once, as lines of their own */
    r = cli__job_run(j);
    if (r < 0) {
        code = r == -EINVAL ? CLI_EXIT_INPUT : CLI_EXIT_FAILURE;
        goto out;
    }
    cli_job_ui_finish(&j->ui);
    code = cli__job_summary(j, r, o->json);
    code = cli__job_save_costs(j, o->costs, code);
out:
    /* A state directory of our own that the job never wrote to (it stopped before the
     * coordinator started) goes; one with a journal or checkpoints stays, as printed. */
    if (!o->state_dir && state[0])
        (void)rmdir(state);
    st_free(j);
    return code;
}

int cli_cmd_run(int argc, char **argv) {
    static const struct option longopts[] = {
        {"save", required_argument, NULL, 'o'},
        {"steps", required_argument, NULL, 's'},
        {"time-scale", required_argument, NULL, 'x'},
        {"json-summary", required_argument, NULL, 'j'},
        {"save-costs", required_argument, NULL, 'c'},
        {"state-dir", required_argument, NULL, 'd'},
        {"shapes", required_argument, NULL, 'S'},
        {"threads", required_argument, NULL, 't'},
        {NULL, 0, NULL, 0},
    };
    struct run_opts o;
    memset(&o, 0, sizeof(o));
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        double v = 0; /* parse_num sets it; gcc -O3 cannot see that (-Wmaybe-uninitialized) */
        switch (c) {
        case 'o': o.save = optarg; break;
        case 'j': o.json = optarg; break;
        case 'c': o.costs = optarg; break;
        case 'd': o.state_dir = optarg; break;
        case 'S': {
            struct coord_loop_forced f[COORD_LOOP_MAX_FORCED];
            if (coord_loop_parse_forced(optarg, f, COORD_LOOP_MAX_FORCED) < 0)
                return cli_usage_error("run", "invalid --shapes '%s' (want STEP:DPxPP,... with "
                                              "increasing steps)", optarg);
            o.shapes = optarg;
            break;
        }
        case 's':
            if (parse_num("--steps", optarg, 1, 1e8, &v) != 0)
                return CLI_EXIT_INPUT;
            if (v != floor(v))
                return cli_usage_error("run", "invalid --steps '%s' (an integer)", optarg);
            o.steps = (int)v;
            break;
        case 'x':
            if (parse_num("--time-scale", optarg, 1e-6, 1e6, &v) != 0)
                return CLI_EXIT_INPUT;
            o.time_scale = v;
            break;
        case 't':
            if (parse_num("--threads", optarg, 1, 1024, &v) != 0)
                return CLI_EXIT_INPUT;
            o.threads = (int)v;
            break;
        default:
            return cli_usage_error("run", "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc - 1)
        return cli_usage_error("run", optind >= argc ? "missing JOB.yaml"
                                                     : "expected one JOB.yaml, got more");
    o.job = argv[optind];
    struct st_spec *spec = st_calloc(1, sizeof(*spec));
    if (!spec)
        return CLI_EXIT_FAILURE;
    int r = cli_spec_load("run", o.job, spec);
    if (r != CLI_EXIT_OK) {
        st_free(spec);
        return r;
    }
    int code = CLI_EXIT_INPUT;
    if (spec->fleet.provider != ST_PROVIDER_SIM) {
        cli_usage_error("run", "'%s' uses provider '%s'; `spottrain run` drives the sim "
                               "provider only", o.job, st_provider_name(spec->fleet.provider));
        goto out;
    }
    if (o.steps > 0)
        spec->training.steps = o.steps;
    /* A trace that does not parse is bad input, said before a corpus is made or a directory
     * created (the driver would find it only once started). */
    if ((code = cli__trace_check("run", spec->fleet.trace)) != CLI_EXIT_OK)
        goto out;
    if ((code = cli_ensure_data("run", spec, true)) != 0)
        goto out;
    code = run_job(&o, spec);
out:
    st_free(spec);
    return code;
}
