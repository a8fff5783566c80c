/* cmd-launch.c: `spottrain launch JOB.yaml` and `spottrain down JOB.yaml` — a job on a cloud
 * spot fleet from a user's machine, and the broom that ends a fleet.
 *
 * One idea: launch is the job driver (coordinator/job.h) with the spec's provider acquiring
 * the fleet; this file parses flags, keeps the join token of the state directory (so a
 * restarted launch, which adopts the instances it finds by tag, gives them the token they
 * already hold), maps the outcome to an exit code and otherwise prints what the driver
 * reports. What happens to the fleet when launch ends is the driver's on_stop: RELEASE (every
 * instance terminated) unless --keep-fleet. down needs no coordinator: it terminates every
 * instance tagged spottrain:job=<metadata.name> (aws) or labelled/tagged spottrain-job (gcp,
 * azure: the spec names the project or resource group), which is idempotent. docs/aws.md,
 * docs/gcp-azure.md. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "job-ui.h" /* cli__job_*: the run shared with run */
#include "cloud.h"
#include "common.h"
#include "coordinator.h"

struct launch_opts {
    const char *job;
    const char *state_dir;
    const char *save;
    const char *json;
    const char *costs; /* --save-costs */
    bool dry_run;
    bool keep;
};

/* Exit code of a driver or provider error: the user's input (spec, credentials, the AWS
 * account refusing the request) or a runtime failure. */
static int error_code(int r) {
    return r == -EINVAL || r == -EACCES || r == -ENOKEY || r == -EPERM || r == -E2BIG
               ? CLI_EXIT_INPUT
               : CLI_EXIT_FAILURE;
}

static void print_dry_run(void *userdata, const char *text) {
    (void)userdata;
    printf("%s\n", text);
}

/* --dry-run: the provider shows every request of a start and sends none; no coordinator. */
static int launch_dry_run(const struct st_spec *spec) {
    struct cloud_config *cfg = st_calloc(1, sizeof(*cfg));
    struct cloud_provider *p = NULL;
    int code = CLI_EXIT_FAILURE, r;
    if (!cfg)
        goto out;
    cloud_config_init(cfg);
    if ((r = cloud_config_from_fleet(cfg, &spec->fleet)) < 0) {
        fprintf(stderr, "spottrain launch: bad fleet section: %s\n", st_strerror(r));
        code = CLI_EXIT_INPUT;
        goto out;
    }
    cfg->spec = spec;
    snprintf(cfg->job_name, sizeof(cfg->job_name), "%s", spec->name);
    snprintf(cfg->job_id, sizeof(cfg->job_id), "%s", "JOB-ID"); /* the journal assigns it */
    snprintf(cfg->coordinator, sizeof(cfg->coordinator), "%s", spec->coordinator.listen);
    cfg->token = "the join token is redacted in a dry run";
    cfg->dry_run = print_dry_run;
    if ((r = cloud_provider_new(st_provider_name(spec->fleet.provider), cfg, &p)) < 0 ||
        (r = cloud_provider_start(p, 0)) < 0) {
        fprintf(stderr, "spottrain launch: %s\n", st_strerror(r));
        code = error_code(r);
        goto out;
    }
    fflush(stdout);
    code = CLI_EXIT_OK;
out:
    cloud_provider_free(p);
    st_free(cfg);
    return code;
}

/* The join token: the state directory's, made once, so a restart hands adopted instances the
 * token their bootstrap already holds; else spec.status.token_file's. */
static int launch_token(const struct st_spec *spec, const char *state, char *tok, size_t toksz) {
    char path[PATH_MAX + 16], why[512];
    if (spec->status.token_file[0]) {
        snprintf(path, sizeof(path), "%s", spec->status.token_file);
    } else {
        snprintf(path, sizeof(path), "%s/join-token", state);
        if (access(path, F_OK) != 0) {
            char t[ST_UUID_STR_LEN], line[ST_UUID_STR_LEN + 2];
            st_uuid_new(t);
            snprintf(line, sizeof(line), "%s\n", t);
            int r = st_write_file_atomic(path, line, strlen(line));
            if (r < 0) {
                fprintf(stderr, "spottrain launch: cannot write '%s': %s\n", path,
                        st_strerror(r));
                return CLI_EXIT_FAILURE;
            }
        }
    }
    if (coord_token_read(path, tok, toksz, why, sizeof(why)) < 0) {
        fprintf(stderr, "spottrain launch: %s\n", why);
        return CLI_EXIT_INPUT;
    }
    return CLI_EXIT_OK;
}

static void on_started(const char *grpc, const char *rest, const char *job_id,
                       const char *state_dir, void *userdata) {
    (void)userdata;
    printf("launch: coordinator grpc=%s rest=%s job=%s state=%s\n", grpc, rest[0] ? rest : "-",
           job_id, state_dir);
    fflush(stdout);
}

static int launch_job(const struct launch_opts *o, const struct st_spec *spec) {
    struct cli_job *j = cli__job_new("launch", spec, o->job, o->save);
    char def[PATH_MAX], state[PATH_MAX];
    int code, r;
    if (!j)
        return CLI_EXIT_FAILURE;
    snprintf(def, sizeof(def), "spottrain-state/%s", spec->name);
    if ((code = cli__job_state_dir("launch", o->state_dir ? o->state_dir : def,
                                   "the state directory", state, sizeof(state))) != CLI_EXIT_OK)
        goto out;
    struct coord_config *cc = &j->cc;
    cc->spec = spec;
    snprintf(cc->state_dir, sizeof(cc->state_dir), "%s", state);
    if ((code = launch_token(spec, state, cc->token, sizeof(cc->token))) != CLI_EXIT_OK)
        goto out;
    /* Before any instance is asked for: a store that refuses us, or a summary file that
     * cannot be written, would otherwise be found when the fleet has trained. */
    if ((code = cli__job_check_outputs("launch", o->save, false, o->json)) != CLI_EXIT_OK ||
        (o->costs &&
         (code = cli__job_check_file("launch", "--save-costs", o->costs)) != CLI_EXIT_OK))
        goto out;

    j->jc.fleet = COORD_JOB_FLEET_PROVIDER;
    j->jc.on_stop = o->keep ? COORD_JOB_STOP_KEEP : COORD_JOB_STOP_RELEASE;
    j->jc.ui.on_started = on_started;

    r = cli__job_run(j);
    if (r < 0) {
        code = error_code(r);
        goto out;
    }
    /* Unlike run, the last status stays on screen: a stopped launch prints no summary, and
     * the block is what it ended on. */
    if (j->ui.have_status)
        cli_job_ui_draw(&j->ui, &j->ui.last);
    if (cli__job_stopped()) {
        printf("launch stopped: %s\n", o->keep ? "the fleet is left running (`spottrain down` "
                                                 "ends it)"
                                               : "every instance of the job was terminated");
        code = cli__job_json(j, o->json, CLI_EXIT_OK);
    } else {
        code = cli__job_summary(j, r, o->json);
    }
    code = cli__job_save_costs(j, o->costs, code); /* stopped or not: what was measured */
    fflush(stdout);
out:
    st_free(j);
    return code;
}

int cli_cmd_launch(int argc, char **argv) {
    static const struct option longopts[] = {
        {"state-dir", required_argument, NULL, 'd'},
        {"dry-run", no_argument, NULL, 'n'},
        {"keep-fleet", no_argument, NULL, 'k'},
        {"save", required_argument, NULL, 'o'},
        {"json-summary", required_argument, NULL, 'j'},
        {"save-costs", required_argument, NULL, 'c'},
        {NULL, 0, NULL, 0},
    };
    struct launch_opts o;
    memset(&o, 0, sizeof(o));
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'd': o.state_dir = optarg; break;
        case 'n': o.dry_run = true; break;
        case 'k': o.keep = true; break;
        case 'o': o.save = optarg; break;
        case 'j': o.json = optarg; break;
        case 'c': o.costs = optarg; break;
        default:
            return cli_usage_error("launch", "unknown or incomplete option '%s'",
                                   argv[optind - 1]);
        }
    }
    if (optind != argc - 1)
        return cli_usage_error("launch", optind >= argc ? "missing JOB.yaml"
                                                        : "expected one JOB.yaml, got more");
    o.job = argv[optind];
    struct st_spec *spec = st_calloc(1, sizeof(*spec));
    if (!spec)
        return CLI_EXIT_FAILURE;
    int code = cli_spec_load("launch", o.job, spec);
    if (code != CLI_EXIT_OK)
        goto out;
    code = CLI_EXIT_INPUT;
    if (spec->fleet.provider != ST_PROVIDER_AWS && spec->fleet.provider != ST_PROVIDER_GCP &&
        spec->fleet.provider != ST_PROVIDER_AZURE) {
        cli_usage_error("launch", "'%s' uses provider '%s'; launch drives cloud providers "
                        "(aws, gcp, azure); `spottrain run` drives sim", o.job,
                        st_provider_name(spec->fleet.provider));
        goto out;
    }
    if (!spec->fleet.image[0]) {
        static const char *const what[] = {[ST_PROVIDER_AWS] = "the AMI id",
                                           [ST_PROVIDER_GCP] = "the image URL",
                                           [ST_PROVIDER_AZURE] = "the image id or "
                                                                 "PUBLISHER:OFFER:SKU:VERSION"};
        cli_usage_error("launch", "'%s': spec.fleet.image (%s) is required", o.job,
                        what[spec->fleet.provider]);
        goto out;
    }
    if (!getenv("SPOTTRAIN_DEBUG"))
        st_log_set_level(ST_LOG_WARN); /* events print once, as lines of their own */
    st_log_set_role("launch", spec->name);
    code = o.dry_run ? launch_dry_run(spec) : launch_job(&o, spec);
out:
    st_free(spec);
    return code;
}

/* ---- down ------------------------------------------------------------------------------------ */

int cli_cmd_down(int argc, char **argv) {
    static const struct option longopts[] = {
        {"job", required_argument, NULL, 'j'},
        {NULL, 0, NULL, 0},
    };
    const char *name = NULL;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'j': name = optarg; break;
        default:
            return cli_usage_error("down", "unknown or incomplete option '%s'",
                                   argv[optind - 1]);
        }
    }
    if ((name && optind != argc) || (!name && optind != argc - 1))
        return cli_usage_error("down", "give one JOB.yaml or --job NAME");
    struct st_spec *spec = st_calloc(1, sizeof(*spec));
    struct cloud_config *cfg = st_calloc(1, sizeof(*cfg));
    int code = CLI_EXIT_FAILURE;
    if (!spec || !cfg)
        goto out;
    cloud_config_init(cfg);
    cfg->nzones = 0; /* region from the environment unless the spec names zones */
    if (!name) {
        if ((code = cli_spec_load("down", argv[optind], spec)) != CLI_EXIT_OK)
            goto out;
        if (spec->fleet.provider != ST_PROVIDER_AWS && spec->fleet.provider != ST_PROVIDER_GCP &&
            spec->fleet.provider != ST_PROVIDER_AZURE) {
            code = cli_usage_error("down", "'%s' uses provider '%s'; down ends aws, gcp and "
                                   "azure fleets", argv[optind],
                                   st_provider_name(spec->fleet.provider));
            goto out;
        }
        (void)cloud_config_from_fleet(cfg, &spec->fleet);
        if (spec->fleet.nzones == 0)
            cfg->nzones = 0;
        cfg->spec = spec; /* gcp and azure: project or subscription, endpoint */
        name = spec->name;
    }
    if (!getenv("SPOTTRAIN_DEBUG"))
        st_log_set_level(ST_LOG_WARN);
    /* --job NAME has no spec to name a project or subscription: aws only. */
    int r = !cfg->spec || spec->fleet.provider == ST_PROVIDER_AWS ? cloud_aws_down(cfg, name)
            : spec->fleet.provider == ST_PROVIDER_GCP             ? cloud_gcp_down(cfg, name)
                                                                  : cloud_azure_down(cfg, name);
    if (r < 0) {
        fprintf(stderr, "spottrain down: job '%s': %s\n", name, st_strerror(r));
        code = error_code(r);
        goto out;
    }
    printf("down: job '%s': %d instance(s) terminated\n", name, r);
    code = CLI_EXIT_OK;
out:
    st_free(spec);
    st_free(cfg);
    return code;
}
