/* cmd-run.c: `spottrain run JOB.yaml` — a whole job on this machine: the coordinator
 * in-process, a simulated spot fleet replaying the spec's trace, one worker process per
 * instance, and the planning loop until every step is done.
 *
 * One idea: nothing here is special to the demo. The coordinator, its planning loop, the sim
 * provider and the workers (`spottrain worker --job`, this same binary) are the pieces a real
 * fleet uses; this command only wires them on loopback, compresses trace time by the time
 * scale, shows progress and prints what happened. docs/live-migration.md explains the rest. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cloud.h"
#include "common.h"
#include "coord-loop.h"
#include "coordinator.h"
#include "coordinator-train.h" /* cli_ckpt_latest, cli_ckpt_prune */
#include "migrate.h"
#include "planner.h"

#define RUN_MAX_ARG 512

struct run_opts {
    const char *job;
    const char *save;
    const char *json;
    const char *state_dir;
    const char *shapes;
    int steps;          /* 0 = spec */
    double time_scale;  /* 0 = spec */
    int threads;        /* per worker; 0 = 1 */
};

/* What the spawn callback hands the provider; strings stay valid across calls. */
struct run_spawn {
    char exe[PATH_MAX];
    char coordinator[COORD_ADDR_MAX];
    char token_file[PATH_MAX];
    char job[PATH_MAX];
    char steps[32];
    char threads[16];
    char instance[CLOUD_NAME_MAX];
    char zone[CLOUD_NAME_MAX];
    char log[PATH_MAX + 64];
    const char *logdir;
};

static volatile sig_atomic_t run_interrupted;

static void on_signal(int sig) {
    (void)sig;
    run_interrupted = 1;
}

static int spawn_worker(void *userdata, const struct cloud_instance *inst,
                        struct cloud_spawn_cmd *cmd) {
    struct run_spawn *s = userdata;
    snprintf(s->instance, sizeof(s->instance), "%s", inst->name);
    snprintf(s->zone, sizeof(s->zone), "%s", inst->zone[0] ? inst->zone : "local-1a");
    int k = 0;
    cmd->argv[k++] = s->exe;
    cmd->argv[k++] = "worker";
    cmd->argv[k++] = "--coordinator";
    cmd->argv[k++] = s->coordinator;
    cmd->argv[k++] = "--token-file";
    cmd->argv[k++] = s->token_file;
    cmd->argv[k++] = "--data-addr";
    cmd->argv[k++] = "127.0.0.1:0";
    cmd->argv[k++] = "--job";
    cmd->argv[k++] = s->job;
    cmd->argv[k++] = "--steps";
    cmd->argv[k++] = s->steps;
    cmd->argv[k++] = "--threads";
    cmd->argv[k++] = s->threads;
    cmd->argv[k++] = "--instance-id";
    cmd->argv[k++] = s->instance;
    cmd->argv[k++] = "--zone";
    cmd->argv[k++] = s->zone;
    cmd->argv[k] = NULL;
    if (!getenv("SPOTTRAIN_DEBUG"))
        cmd->env[0] = "SPOTTRAIN_DEBUG=warn"; /* workers' own lines: problems only */
    return 0;
}

/* Trace -> timed add/remove events with node names. Traces that name their nodes keep them;
 * count traces get fresh names for adds and seeded picks among the live nodes for removes. */
static int build_events(const struct plan_trace *t, uint64_t seed, int max,
                        struct cloud_event **ret, size_t *ret_n) {
    size_t cap = 16, n = 0;
    struct cloud_event *ev = st_calloc(cap, sizeof(*ev));
    int *live = st_calloc((size_t)ST_MAX(t->nnames, 1) + 4096, sizeof(int));
    int nlive = 0, next = 0;
    uint64_t x = seed ? seed : 1;
    if (!ev || !live) {
        st_free(ev);
        st_free(live);
        return -ENOMEM;
    }
    for (int i = 0; i < t->nintervals; i++) {
        const struct plan_interval *iv = &t->iv[i];
        for (int k = 0; k < iv->n_out + iv->n_in; k++) {
            bool add = k >= iv->n_out; /* removals first, as the interval's count says */
            int id;
            if (add) {
                if (t->named && iv->first_in >= 0)
                    id = t->node_ids[iv->first_in + (k - iv->n_out)];
                else
                    id = next++;
                if (nlive >= 4096 + t->nnames)
                    continue;
                live[nlive++] = id;
            } else {
                if (nlive == 0)
                    continue;
                int pick = nlive - 1;
                if (t->named && iv->first_out >= 0) {
                    id = t->node_ids[iv->first_out + k];
                    for (pick = 0; pick < nlive && live[pick] != id; pick++)
                        ;
                    if (pick == nlive)
                        continue;
                } else {
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    pick = (int)(x % (uint64_t)nlive);
                    id = live[pick];
                }
                live[pick] = live[--nlive];
            }
            if (n == cap) {
                cap *= 2;
                struct cloud_event *v = st_realloc(ev, cap * sizeof(*ev));
                if (!v) {
                    st_free(ev);
                    st_free(live);
                    return -ENOMEM;
                }
                ev = v;
            }
            ev[n].t = i * PLAN_INTERVAL_S;
            ev[n].action = add ? CLOUD_EVENT_ADD : CLOUD_EVENT_REMOVE;
            snprintf(ev[n].node, sizeof(ev[n].node), "node-%d", id);
            n++;
        }
    }
    (void)max;
    st_free(live);
    *ret = ev;
    *ret_n = n;
    return 0;
}

static int parse_num(const char *flag, const char *s, double lo, double hi, double *ret) {
    char *e;
    double v = strtod(s, &e);
    if (!*s || *e || !(v >= lo) || !(v <= hi))
        return cli_usage_error("run", "invalid %s '%s' (expected a number in %g..%g)", flag, s,
                               lo, hi);
    *ret = v;
    return 0;
}

static void print_status(const struct coord_loop_status *st, bool tty, int *drawn) {
    char line[4][200];
    snprintf(line[0], sizeof(line[0]), "step %" PRIu64 "/%" PRIu64 "  loss %.4f  %.1f samples/s",
             st->step, st->total, st->loss, st->samples_per_s);
    snprintf(line[1], sizeof(line[1]), "shape %dx%d (dp x pp)  epoch %" PRIu64 "  %s", st->dp,
             st->pp, st->epoch, st->phase);
    snprintf(line[2], sizeof(line[2]), "instances alive %d  forecast %d", st->alive,
             st->forecast);
    snprintf(line[3], sizeof(line[3]), "last: %.150s", st->last_event);
    if (tty) {
        if (*drawn)
            printf("\033[%dA", *drawn);
        for (int i = 0; i < 4; i++)
            printf("\033[2K%s\n", line[i]);
        *drawn = 4;
    } else {
        printf("run: %s | %s | %s\n", line[0], line[1], line[2]);
    }
    fflush(stdout);
}

static void print_summary(FILE *f, const struct coord_loop_summary *s, const struct st_spec *sp) {
    fprintf(f, "\nsummary\n");
    fprintf(f, "  steps              %" PRIu64 "%s\n", s->steps,
            s->finished ? "" : " (not finished)");
    fprintf(f, "  samples committed  %" PRIu64 "\n", s->samples);
    fprintf(f, "  final loss         %.4f (first reported %.4f)\n", s->final_loss,
            s->first_loss);
    fprintf(f, "  wall time          %.1f s\n", s->wall_seconds);
    fprintf(f, "  time per shape    ");
    for (int i = 0; i < s->nshapes; i++)
        fprintf(f, " %dx%d %.1fs", s->shapes[i].dp, s->shapes[i].pp, s->shapes[i].seconds);
    fprintf(f, "\n  migrations         kind                 count        bytes   stall s\n");
    for (int k = 0; k < COORD_LOOP_NKINDS; k++)
        fprintf(f, "                     %-20s %5" PRIu64 " %12" PRIu64 " %9.3f\n",
                coord_loop_kind_name((enum coord_loop_kind)k), s->count[k], s->bytes[k],
                s->stall[k]);
    fprintf(f, "  checkpoint restores %" PRIu64 "\n", s->count[COORD_LOOP_RESTORE]);
    fprintf(f, "  notices relayed    %d (read by workers from their IMDSv2 endpoint)\n",
            s->worker_notices);
    fprintf(f, "  fleet              %.3f instance-hours of trace time: $%.2f spot, $%.2f on "
               "demand (%.2f/%.2f $/h)\n", s->instance_hours, s->spot_dollars,
            s->on_demand_dollars, sp->fleet.spot_price, sp->fleet.on_demand_price);
    fflush(f);
}

static int write_json(const char *path, const struct coord_loop_summary *s) {
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    fprintf(f, "{\n  \"steps\": %" PRIu64 ",\n  \"finished\": %s,\n  \"samples_committed\": %"
               PRIu64 ",\n", s->steps, s->finished ? "true" : "false", s->samples);
    if (isfinite(s->final_loss))
        fprintf(f, "  \"final_loss\": %.9g,\n", s->final_loss);
    else
        fprintf(f, "  \"final_loss\": null,\n");
    if (isfinite(s->first_loss))
        fprintf(f, "  \"first_loss\": %.9g,\n", s->first_loss);
    fprintf(f, "  \"wall_seconds\": %.3f,\n  \"checkpoint_restores\": %" PRIu64 ",\n"
               "  \"worker_notices\": %d,\n",
            s->wall_seconds, s->count[COORD_LOOP_RESTORE], s->worker_notices);
    fprintf(f, "  \"migrations\": {");
    for (int k = 0; k < COORD_LOOP_NKINDS; k++)
        fprintf(f, "%s\n    \"%s\": {\"count\": %" PRIu64 ", \"bytes\": %" PRIu64
                   ", \"stall_seconds\": %.6f}", k ? "," : "",
                coord_loop_kind_name((enum coord_loop_kind)k), s->count[k], s->bytes[k],
                s->stall[k]);
    fprintf(f, "\n  },\n  \"time_per_shape\": [");
    for (int i = 0; i < s->nshapes; i++)
        fprintf(f, "%s{\"dp\": %d, \"pp\": %d, \"seconds\": %.3f}", i ? ", " : "",
                s->shapes[i].dp, s->shapes[i].pp, s->shapes[i].seconds);
    fprintf(f, "],\n  \"reconfigurations\": [");
    for (int i = 0; i < s->nrecords; i++) {
        const struct coord_loop_record *r = &s->records[i];
        fprintf(f, "%s\n    {\"epoch\": %" PRIu64 ", \"at_step\": %" PRIu64 ", \"kind\": \"%s\", "
                   "\"dp_resharding\": %s, \"from\": [%d, %d], \"to\": [%d, %d], "
                   "\"planned_bytes\": %" PRIu64 ", \"moved_bytes\": %" PRIu64 ", "
                   "\"stall_seconds\": %.6f, \"seconds\": %.6f, \"ok\": %s}",
                i ? "," : "", r->epoch, r->at_step, coord_loop_kind_name(r->kind),
                r->dp_reshard ? "true" : "false", r->from_dp, r->from_pp, r->to_dp, r->to_pp,
                r->planned_bytes, r->moved_bytes, r->stall_seconds, r->seconds,
                r->ok ? "true" : "false");
    }
    fprintf(f, "\n  ],\n  \"instance_hours\": %.6f,\n  \"spot_dollars\": %.6f,\n"
               "  \"on_demand_dollars\": %.6f\n}\n", s->instance_hours, s->spot_dollars,
            s->on_demand_dollars);
    int r = ferror(f) ? -EIO : 0;
    if (fclose(f) != 0 && r == 0)
        r = -errno;
    return r;
}

static int write_token(const char *path) {
    char tok[ST_UUID_STR_LEN], line[ST_UUID_STR_LEN + 2];
    st_uuid_new(tok);
    snprintf(line, sizeof(line), "%s\n", tok);
    return st_write_file_atomic(path, line, strlen(line));
}

static int run_job(const struct run_opts *o, struct st_spec *spec) {
    struct coord_loop_config *lc = st_calloc(1, sizeof(*lc));
    struct run_spawn *sp = st_calloc(1, sizeof(*sp));
    struct coord_loop *L = NULL;
    struct coord *c = NULL;
    struct cloud_provider *prov = NULL;
    struct plan_trace *trace = NULL;
    struct plan_cost *cost = NULL;
    struct cloud_event *ev = NULL;
    size_t nev = 0;
    char *text = NULL;
    char state[PATH_MAX];
    int code = CLI_EXIT_FAILURE, r;

    if (!lc || !sp) {
        fprintf(stderr, "spottrain run: out of memory\n");
        goto out;
    }
    /* State directory: journal, token, worker logs, checkpoints unless the spec names a dir. */
    if (o->state_dir) {
        snprintf(state, sizeof(state), "%s", o->state_dir);
        if (st_mkdir_p(state, 0700) < 0) {
            fprintf(stderr, "spottrain run: cannot create --state-dir '%s'\n", state);
            code = CLI_EXIT_INPUT;
            goto out;
        }
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(state, sizeof(state), "%s/spottrain-run-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(state)) {
            fprintf(stderr, "spottrain run: cannot create a state directory: %s\n",
                    strerror(errno));
            goto out;
        }
    }
    snprintf(sp->token_file, sizeof(sp->token_file), "%s/token", state);
    if ((r = write_token(sp->token_file)) < 0) {
        fprintf(stderr, "spottrain run: cannot write '%s': %s\n", sp->token_file,
                st_strerror(r));
        goto out;
    }
    /* Trace. */
    size_t len = 0;
    r = st_read_file(spec->fleet.trace, 64 << 20, &text, &len);
    if (r < 0) {
        fprintf(stderr, "spottrain run: cannot read trace '%s': %s\n", spec->fleet.trace,
                st_strerror(r));
        code = CLI_EXIT_INPUT;
        goto out;
    }
    struct st_error terr;
    memset(&terr, 0, sizeof(terr));
    r = plan_trace_parse(spec->fleet.trace, text, len, &trace, &terr);
    if (r < 0) {
        char buf[1024];
        st_error_format(&terr, buf, sizeof(buf));
        fprintf(stderr, "spottrain run: bad trace: %s\n", buf);
        code = CLI_EXIT_INPUT;
        goto out;
    }
    if ((r = build_events(trace, spec->training.seed, spec->fleet.max, &ev, &nev)) < 0)
        goto out;
    /* Cost model for the liveput planner (analytic: nobody profiled this model). */
    struct plan_model_desc d = {
        .layers = spec->model.layers, .hidden = spec->model.hidden, .seq = spec->model.seq_len,
        .vocab = spec->model.vocab, .micro_batch = spec->training.micro_batch,
        .global_batch = spec->training.global_batch, .gpu_tflops = 0.05,
        .gpu_mem_gib = spec->fleet.gpu_memory ? (double)spec->fleet.gpu_memory / (1 << 30) : 16,
        .net_gbps = 10, .max_n = ST_MAX(spec->fleet.max, 1),
    };
    if (plan_cost_analytic(&d, &cost) < 0)
        cost = NULL; /* the loop falls back to filling the fleet */

    /* The loop, then the coordinator with the loop's hooks. */
    lc->spec = *spec;
    lc->steps = spec->training.steps;
    lc->time_scale = o->time_scale > 0 ? o->time_scale : spec->fleet.time_scale;
    lc->cost = cost;
    lc->ckpt_latest = cli_ckpt_latest;
    lc->ckpt_prune = cli_ckpt_prune;
    lc->ckpt_commit = cli_ckpt_commit;
    lc->ckpt_userdata = spec;
    if (spec->checkpoint.interval > 0) {
        snprintf(lc->ckpt_root, sizeof(lc->ckpt_root), "%s/ckpt", state);
        lc->ckpt_interval = spec->checkpoint.interval * lc->time_scale;
    }
    if (o->save)
        snprintf(lc->save_dir, sizeof(lc->save_dir), "%s", o->save);
    if (o->shapes) {
        r = coord_loop_parse_forced(o->shapes, lc->forced, COORD_LOOP_MAX_FORCED);
        lc->nforced = r;
    }
    int initial = 0;
    for (int i = 0; i < trace->nintervals && i < 1; i++)
        initial = plan_trace_n_after(trace, 0);
    lc->expect_workers = ST_MAX(1, ST_MIN(initial, spec->fleet.max > 0 ? spec->fleet.max
                                                                         : initial));
    if ((r = coord_loop_new(lc, &L)) < 0) {
        fprintf(stderr, "spottrain run: cannot create the planning loop: %s\n", st_strerror(r));
        goto out;
    }
    struct coord_hooks hooks;
    coord_loop_hooks(L, &hooks);
    struct coord_config cc;
    coord_config_init(&cc);
    cc.spec = spec;
    snprintf(cc.listen, sizeof(cc.listen), "127.0.0.1:0");
    snprintf(cc.status_listen, sizeof(cc.status_listen), "127.0.0.1:0");
    snprintf(cc.state_dir, sizeof(cc.state_dir), "%s/journal", state);
    cc.heartbeat_deadline = 6;
    cc.settle = 0.1;
    char why[256];
    if (coord_token_read(sp->token_file, cc.token, sizeof(cc.token), why, sizeof(why)) < 0) {
        fprintf(stderr, "spottrain run: %s\n", why);
        goto out;
    }
    if ((r = coord_new(&cc, &hooks, &c)) < 0) {
        fprintf(stderr, "spottrain run: cannot open the coordinator state in '%s': %s\n",
                cc.state_dir, st_strerror(r));
        goto out;
    }
    if ((r = coord_loop_attach(L, c)) < 0 || (r = coord_start(c)) < 0) {
        fprintf(stderr, "spottrain run: cannot start the coordinator: %s\n", st_strerror(r));
        goto out;
    }
    fprintf(stderr, "spottrain run: coordinator grpc=%s rest=http://%s state=%s\n",
            coord_grpc_addr(c), coord_rest_addr(c), state);

    /* Simulated fleet; its spawn callback starts `spottrain worker --job`. */
    ssize_t n = readlink("/proc/self/exe", sp->exe, sizeof(sp->exe) - 1);
    if (n <= 0) {
        fprintf(stderr, "spottrain run: cannot find my own executable\n");
        goto out;
    }
    sp->exe[n] = '\0';
    snprintf(sp->coordinator, sizeof(sp->coordinator), "%s", coord_grpc_addr(c));
    if (!realpath(o->job, sp->job)) {
        fprintf(stderr, "spottrain run: '%s': %s\n", o->job, strerror(errno));
        goto out;
    }
    snprintf(sp->steps, sizeof(sp->steps), "%d", spec->training.steps);
    snprintf(sp->threads, sizeof(sp->threads), "%d", o->threads > 0 ? o->threads : 1);
    struct cloud_config pc;
    cloud_config_init(&pc);
    if ((r = cloud_config_from_fleet(&pc, &spec->fleet)) < 0) {
        fprintf(stderr, "spottrain run: bad fleet section: %s\n", st_strerror(r));
        code = CLI_EXIT_INPUT;
        goto out;
    }
    pc.events = ev;
    pc.nevents = nev;
    pc.time_scale = lc->time_scale;
    pc.seed = spec->training.seed;
    pc.spawn = spawn_worker;
    pc.spawn_userdata = sp;
    if ((r = cloud_provider_new("sim", &pc, &prov)) < 0) {
        fprintf(stderr, "spottrain run: cannot create the simulated fleet: %s\n",
                st_strerror(r));
        goto out;
    }
    /* The loop reads the provider; attach it through the config copy the loop holds. */
    coord_loop_set_provider(L, prov);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if ((r = cloud_provider_start(prov, st_now())) < 0) {
        fprintf(stderr, "spottrain run: cannot start the fleet: %s\n", st_strerror(r));
        goto out;
    }
    bool tty = isatty(STDOUT_FILENO);
    if (tty && !getenv("SPOTTRAIN_DEBUG"))
        st_log_set_level(ST_LOG_WARN); /* events show in the status block, not as lines */
    int drawn = 0;
    double last_draw = 0;
    char last_event[160] = "";
    for (;;) {
        double now = st_now();
        if (run_interrupted)
            coord_loop_cancel(L);
        r = coord_loop_tick(L, now);
        if (r < 0) {
            fprintf(stderr, "spottrain run: planning loop failed: %s\n", st_strerror(r));
            break;
        }
        struct coord_loop_status st;
        coord_loop_status(L, &st);
        if (!tty && strcmp(st.last_event, last_event)) {
            snprintf(last_event, sizeof(last_event), "%s", st.last_event);
            printf("run: event: %s\n", last_event);
            fflush(stdout);
        }
        if (now - last_draw >= (tty ? 0.25 : 2.0)) {
            print_status(&st, tty, &drawn);
            last_draw = now;
        }
        if (r == 1)
            break;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* Wait (bounded) for the worker processes to exit after their Stop. */
    double until = st_now() + 5.0;
    while (st_now() < until) {
        struct cloud_signal sig[32];
        size_t k = 0, alive = 0;
        (void)cloud_provider_poll(prov, st_now(), sig, ST_ARRAY_SIZE(sig), &k);
        (void)cloud_provider_instances(prov, NULL, 0, &alive);
        if (alive == 0)
            break;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    struct coord_loop_summary *sum = st_calloc(1, sizeof(*sum));
    if (!sum)
        goto out;
    coord_loop_summary(L, sum);
    print_summary(stdout, sum, spec);
    code = sum->finished ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
    if (o->json && (r = write_json(o->json, sum)) < 0) {
        fprintf(stderr, "spottrain run: cannot write '%s': %s\n", o->json, st_strerror(r));
        code = CLI_EXIT_FAILURE;
    }
    st_free(sum);
out:
    prov = cloud_provider_free(prov);
    c = coord_free(c);
    L = coord_loop_free(L);
    plan_cost_free(cost);
    plan_trace_free(trace);
    st_free(ev);
    st_free(text);
    st_free(lc);
    st_free(sp);
    return code;
}

int cli_cmd_run(int argc, char **argv) {
    static const struct option longopts[] = {
        {"save", required_argument, NULL, 'o'},
        {"steps", required_argument, NULL, 's'},
        {"time-scale", required_argument, NULL, 'x'},
        {"json-summary", required_argument, NULL, 'j'},
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
        double v;
        switch (c) {
        case 'o': o.save = optarg; break;
        case 'j': o.json = optarg; break;
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
    struct st_error errs[16];
    size_t nerrs = 0;
    if (!spec)
        return CLI_EXIT_FAILURE;
    int r = st_spec_load(o.job, spec, errs, ST_ARRAY_SIZE(errs), &nerrs);
    if (r < 0) {
        for (size_t i = 0; i < ST_MIN(nerrs, ST_ARRAY_SIZE(errs)); i++) {
            char buf[1024];
            st_error_format(&errs[i], buf, sizeof(buf));
            fprintf(stderr, "%s\n", buf);
        }
        if (nerrs == 0)
            fprintf(stderr, "spottrain run: cannot load '%s': %s\n", o.job, st_strerror(r));
        st_free(spec);
        return r == -EINVAL || r == -ENOENT ? CLI_EXIT_INPUT : CLI_EXIT_FAILURE;
    }
    int code = CLI_EXIT_INPUT;
    if (spec->fleet.provider != ST_PROVIDER_SIM) {
        cli_usage_error("run", "'%s' uses provider '%s'; `spottrain run` drives the sim "
                               "provider only", o.job, st_provider_name(spec->fleet.provider));
        goto out;
    }
    if (o.steps > 0)
        spec->training.steps = o.steps;
    if ((code = cli_ensure_data("run", spec, true)) != 0)
        goto out;
    code = run_job(&o, spec);
out:
    st_free(spec);
    return code;
}
