/* cmd-validate.c: `spottrain validate JOB.yaml [--json]` — check a job spec and show it
 * resolved.
 *
 * This is a user's first contact with the project, so every error the parser found is
 * printed, one per line, as `file:line:column: field: message`, with the file named as it was
 * given on the command line. A valid spec is printed with every default filled in, as a
 * readable summary or as JSON (st_spec_to_json) for scripts. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common.h" /* st_spec_load, st_error_format */
#include "trace-load.h" /* cli__trace_check */

#define VALIDATE_MAX_ERRS 100

static const char *yes_no(bool b) {
    return b ? "yes" : "no";
}

/* "90s", "30m", "2h" or "1.5s": the shortest exact unit, for the summary. */
static void fmt_duration(double s, char *buf, size_t size) {
    if (s >= 3600 && s == (double)(long long)(s / 3600) * 3600)
        snprintf(buf, size, "%lldh", (long long)(s / 3600));
    else if (s >= 60 && s == (double)(long long)(s / 60) * 60)
        snprintf(buf, size, "%lldm", (long long)(s / 60));
    else
        snprintf(buf, size, "%gs", s);
}

static void fmt_bound(int pinned, int lo, int hi, char *buf, size_t size) {
    if (pinned)
        snprintf(buf, size, "%d (pinned)", pinned);
    else if (!lo && !hi)
        snprintf(buf, size, "planner chooses");
    else if (!hi)
        snprintf(buf, size, "%d..", lo);
    else
        snprintf(buf, size, "%d..%d", lo ? lo : 1, hi);
}

static void print_summary(const struct st_spec *s, FILE *f) {
    static const char *const prec[] = {"fp32", "bf16"};
    static const char *const sched[] = {"cosine", "constant", "linear"};
    char a[64], b[64], c[64];
    const struct st_spec_optimizer *o = &s->training.optimizer;

    fprintf(f, "%s: valid %s %s '%s'\n", s->path, s->api_version, s->kind, s->name);
    if (s->model.profile[0])
        fprintf(f, "  model       cost profile %s%s%s%s (simulation only)\n", s->model.profile,
                s->model.profile_model[0] ? " [" : "", s->model.profile_model,
                s->model.profile_model[0] ? "]" : "");
    if (s->model.layers)
        fprintf(f, "  model       GPT: %d layers, hidden %d, %d heads, vocab %d, seq_len %d\n",
                s->model.layers, s->model.hidden, s->model.heads, s->model.vocab,
                s->model.seq_len);
    if (s->data.train[0]) {
        fprintf(f, "  data        train %s%s\n", s->data.train,
                s->data.synth ? " (synthesized when missing)" : "");
        if (s->data.synth)
            fprintf(f, "              synth: markov order %d, seed %llu, %llu tokens\n",
                    s->data.synth_order, (unsigned long long)s->data.synth_seed,
                    (unsigned long long)s->data.synth_tokens);
        fprintf(f, "              val %s\n", s->data.val[0] ? s->data.val : "(none)");
    }
    fprintf(f, "  training    %d steps, global batch %d, micro batch %d, %s, seed %llu\n",
            s->training.steps, s->training.global_batch, s->training.micro_batch,
            prec[s->training.precision % 2], (unsigned long long)s->training.seed);
    fprintf(f,
            "  optimizer   %s lr %g, betas %g/%g, eps %g, weight decay %g, grad clip %g,\n"
            "              warmup %d steps, %s schedule to %g x lr\n",
            o->name, o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->grad_clip,
            o->warmup_steps, sched[o->schedule % 3], o->min_lr_ratio);
    fprintf(f, "  fleet       %s, %d..%d instances of %s x %d GPU, spot %s, on-demand fallback %s\n",
            st_provider_name(s->fleet.provider), s->fleet.min, s->fleet.max,
            s->fleet.instance_type[0] ? s->fleet.instance_type : "(provider default)",
            s->fleet.gpus_per_instance, yes_no(s->fleet.spot),
            yes_no(s->fleet.on_demand_fallback));
    if (s->fleet.nzones > 0) {
        fprintf(f, "              zones");
        for (int i = 0; i < s->fleet.nzones; i++)
            fprintf(f, " %s", s->fleet.zones[i]);
        fprintf(f, "\n");
    }
    if (s->fleet.trace[0])
        fprintf(f, "              trace %s, time scale %g\n", s->fleet.trace,
                s->fleet.time_scale);
    fmt_duration(s->fleet.notice_seconds, a, sizeof(a));
    fprintf(f,
            "              notice %s, %g%% unannounced; $%.3f/h spot, $%.3f/h on demand; "
            "%.1f GiB per GPU\n",
            a, s->fleet.unannounced * 100, s->fleet.spot_price, s->fleet.on_demand_price,
            (double)s->fleet.gpu_memory / (1024.0 * 1024.0 * 1024.0));
    fmt_duration(s->planner.interval, a, sizeof(a));
    fmt_bound(s->planner.dp, s->planner.dp_min, s->planner.dp_max, b, sizeof(b));
    fmt_bound(s->planner.pp, s->planner.pp_min, s->planner.pp_max, c, sizeof(c));
    fprintf(f, "  planner     every %s, lookahead %d, predictor %s, dp %s, pp %s\n", a,
            s->planner.lookahead, s->planner.predictor, b, c);
    if (s->checkpoint.interval > 0) {
        fmt_duration(s->checkpoint.interval, a, sizeof(a));
        fprintf(f, "  checkpoint  %s every %s, keep %d\n", s->checkpoint.dir, a,
                s->checkpoint.keep);
    } else {
        fprintf(f, "  checkpoint  off (interval 0)\n");
    }
    fmt_duration(s->coordinator.heartbeat_deadline, a, sizeof(a));
    fprintf(f, "  coordinator %s, heartbeat deadline %s\n", s->coordinator.listen, a);
    fprintf(f, "  status      %s%s%s\n", s->status.listen[0] ? s->status.listen : "off",
            s->status.token_file[0] ? ", token " : "", s->status.token_file);
}

int cli_cmd_validate(int argc, char **argv) {
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {NULL, 0, NULL, 0},
    };
    bool json = false;
    int ch;
    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "+j", opts, NULL)) != -1) {
        switch (ch) {
        case 'j':
            json = true;
            break;
        default:
            return cli_usage_error("validate", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return cli_usage_error("validate", "missing JOB.yaml");
    if (optind + 1 < argc)
        return cli_usage_error("validate", "unexpected argument '%s'", argv[optind + 1]);
    const char *path = argv[optind];

    struct st_error *errs = st_calloc(VALIDATE_MAX_ERRS, sizeof(*errs));
    struct st_spec *spec = st_malloc(sizeof(*spec));
    int ret = CLI_EXIT_OK;
    if (!errs || !spec) {
        fprintf(stderr, "spottrain validate: %s\n", st_strerror(-ENOMEM));
        ret = CLI_EXIT_FAILURE;
        goto out;
    }
    size_t nerrs = 0;
    int r = st_spec_load(path, spec, errs, VALIDATE_MAX_ERRS, &nerrs);
    if (r == -ENOMEM) {
        fprintf(stderr, "spottrain validate: %s\n", st_strerror(r));
        ret = CLI_EXIT_FAILURE;
        goto out;
    }
    if (r < 0) {
        /* A bad spec and an unreadable one are both bad input to this command. */
        char line[1024];
        for (size_t i = 0; i < nerrs && i < VALIDATE_MAX_ERRS; i++) {
            st_error_format(&errs[i], line, sizeof(line));
            fprintf(stderr, "%s\n", line);
        }
        if (nerrs > VALIDATE_MAX_ERRS)
            fprintf(stderr, "%s: ... and %zu more errors\n", path, nerrs - VALIDATE_MAX_ERRS);
        if (nerrs == 0)
            fprintf(stderr, "%s: %s\n", path, st_strerror(r));
        ret = CLI_EXIT_INPUT;
        goto out;
    }
    /* A spec every field of which is fine may still allow no (dp, pp) shape at all. */
    if ((ret = cli_spec_feasible(path, spec)) != CLI_EXIT_OK)
        goto out;
    /* The trace file was found by the spec's check; what is in it, `run` reads first. */
    if (spec->fleet.trace[0] && (ret = cli__trace_check("validate", spec->fleet.trace)) !=
                                    CLI_EXIT_OK)
        goto out;
    if (json) {
        char *text = st_spec_to_json(spec);
        if (!text) {
            fprintf(stderr, "spottrain validate: cannot build JSON: %s\n",
                    st_strerror(-ENOMEM));
            ret = CLI_EXIT_FAILURE;
            goto out;
        }
        printf("%s\n", text);
        st_free(text);
    } else {
        print_summary(spec, stdout);
    }
    if (fflush(stdout) != 0)
        ret = CLI_EXIT_FAILURE;
out:
    st_free(spec);
    st_free(errs);
    return ret;
}
