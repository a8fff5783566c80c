/* job.c: the job driver (job.h) — spec -> coordinator -> planning loop -> fleet -> ticks ->
 * summary, the same for every fleet.
 *
 * The one idea: nothing here is special to one command. The coordinator, the planning loop with
 * the liveput planner on the cost model the spec describes, and a fleet (the sim provider's
 * local worker processes, workers that join by themselves, or a cloud provider) are wired the
 * same way whoever calls; what differs is said by the config (which fleet, what a stop does).
 * The commands print what the ui callbacks report. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h" /* TRY */
#include "cloud.h"
#include "common.h"
#include "coordinator.h"
#include "planner.h"

/* See job.h. */
void coord_job_config_init(struct coord_job_config *cfg) {
    memset(cfg, 0, sizeof(*cfg));
}

/* ---- the sim fleet ------------------------------------------------------------------------- */

/* What the spawn callback hands the sim provider; strings stay valid across calls. */
struct sim_spawn {
    char exe[PATH_MAX];
    char coordinator[COORD_ADDR_MAX];
    char token_file[PATH_MAX];
    char job[PATH_MAX];
    char steps[32];
    char threads[16];
    char instance[CLOUD_NAME_MAX];
    char zone[CLOUD_NAME_MAX];
};

static int spawn_worker(void *userdata, const struct cloud_instance *inst,
                        struct cloud_spawn_cmd *cmd) {
    struct sim_spawn *s = userdata;
    snprintf(s->instance, sizeof(s->instance), "%s", inst->name);
    snprintf(s->zone, sizeof(s->zone), "%s", inst->zone[0] ? inst->zone : "local-1a");
    const char *argv[] = {s->exe, "worker", "--coordinator", s->coordinator, "--token-file",
                          s->token_file, "--data-addr", "127.0.0.1:0", "--job", s->job,
                          "--steps", s->steps, "--threads", s->threads, "--instance-id",
                          s->instance, "--zone", s->zone};
    for (size_t k = 0; k < ST_ARRAY_SIZE(argv); k++)
        cmd->argv[k] = argv[k];
    cmd->argv[ST_ARRAY_SIZE(argv)] = NULL;
    if (!getenv("SPOTTRAIN_DEBUG"))
        cmd->env[0] = "SPOTTRAIN_DEBUG=warn"; /* workers' own lines: problems only */
    return 0;
}

/* Trace -> timed add/remove events with node names. Traces that name their nodes keep them;
 * count traces get fresh names for adds and seeded picks among the live nodes for removes. */
static int trace_events(const struct plan_trace *t, uint64_t seed, struct cloud_event **ret,
                        size_t *ret_n) {
    size_t cap = 16, n = 0, maxlive = (size_t)ST_MAX(t->nnames, 1) + 4096;
    struct cloud_event *ev = st_calloc(cap, sizeof(*ev));
    int *live = st_calloc(maxlive, sizeof(int));
    int nlive = 0, next = 0, r = 0;
    uint64_t x = seed ? seed : 1;
    if (!ev || !live)
        TRY_GOTO(-ENOMEM, r, out);
    for (int i = 0; i < t->nintervals; i++) {
        const struct plan_interval *iv = &t->iv[i];
        for (int k = 0; k < iv->n_out + iv->n_in; k++) {
            /* A count trace: the minute's removals first, as its count says (picks among the
             * nodes up before it). A named one: its additions first, as the parser checked
             * it (a node added and removed in the same minute goes in that minute). */
            bool add = t->named ? k < iv->n_in : k >= iv->n_out;
            int j = t->named ? (add ? k : k - iv->n_in) : (add ? k - iv->n_out : k);
            int id, pick;
            if (add) {
                if (t->named && iv->first_in >= 0)
                    id = t->node_ids[iv->first_in + j];
                else
                    id = next++;
                if ((size_t)nlive >= maxlive)
                    continue;
                live[nlive++] = id;
            } else {
                if (nlive == 0)
                    continue;
                if (t->named && iv->first_out >= 0) {
                    id = t->node_ids[iv->first_out + j];
                    for (pick = 0; pick < nlive && live[pick] != id; pick++)
                        ;
                    if (pick == nlive) {
                        /* The parser refuses a removal of a node not up; said, not dropped in
                         * silence, should one get here. */
                        st_log(ST_LOG_WARN, "job", "Trace: the removal of node-%d in minute %d "
                               "is ignored: it is not up then", id, i);
                        continue;
                    }
                } else {
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    pick = (int)(x % (uint64_t)nlive);
                    id = live[pick];
                }
                live[pick] = live[--nlive];
            }
            if (n == cap) {
                struct cloud_event *v = st_realloc(ev, 2 * cap * sizeof(*ev));
                if (!v)
                    TRY_GOTO(-ENOMEM, r, out);
                ev = v;
                cap *= 2;
            }
            ev[n].t = i * PLAN_INTERVAL_S;
            ev[n].action = add ? CLOUD_EVENT_ADD : CLOUD_EVENT_REMOVE;
            snprintf(ev[n].node, sizeof(ev[n].node), "node-%d", id);
            n++;
        }
    }
    *ret = ev;
    *ret_n = n;
    ev = NULL;
out:
    st_free(ev);
    st_free(live);
    return r;
}

/* Reads and parses the spec's trace. */
static int load_trace(const struct st_spec *spec, struct plan_trace **ret) {
    char *text = NULL;
    size_t len = 0;
    int r = st_read_file(spec->fleet.trace, 64 << 20, &text, &len);
    if (r < 0)
        return st_log_errno(r, "Cannot read trace '%s'", spec->fleet.trace);
    struct st_error err;
    memset(&err, 0, sizeof(err));
    r = plan_trace_parse(spec->fleet.trace, text, len, ret, &err);
    st_free(text);
    if (r < 0) {
        char buf[1024];
        st_error_format(&err, buf, sizeof(buf));
        st_log(ST_LOG_ERR, "job", "Bad trace: %s", buf);
        return -EINVAL;
    }
    return 0;
}

static int write_token(const char *path) {
    char tok[ST_UUID_STR_LEN], line[ST_UUID_STR_LEN + 2];
    st_uuid_new(tok);
    snprintf(line, sizeof(line), "%s\n", tok);
    return st_write_file_atomic(path, line, strlen(line));
}

/* ---- the driver ------------------------------------------------------------------------------ */

struct job {
    const struct coord_job_config *cfg;
    struct st_spec spec;
    struct coord_loop_config *lc;
    struct coord_loop *L;
    struct coord *c;
    struct cloud_provider *prov;
    struct plan_trace *trace;
    struct plan_cost *cost;
    struct plan_measured_costs mcosts; /* planner.migration_costs, when set */
    struct cloud_event *ev;
    size_t nev;
    struct sim_spawn *spawn;
    struct cloud_config pc;
    char last_event[sizeof(((struct coord_loop_status *)0)->last_event)];
    uint64_t events_seen;
};

/* Reports every loop event not reported yet, once each and in order. */
static void report_events(struct job *J) {
    const struct coord_job_ui *ui = &J->cfg->ui;
    char line[400];
    while (coord_loop_event_next(J->L, &J->events_seen, line, sizeof(line)) > 0)
        if (ui->on_event)
            ui->on_event(line, ui->userdata);
}

/* The sim fleet: the trace's events and the spawn callback that starts local workers. */
static int sim_fleet_setup(struct job *J, const char *state_dir) {
    const struct coord_job_config *cfg = J->cfg;
    struct sim_spawn *sp = J->spawn;
    TRY(trace_events(J->trace, J->spec.training.seed, &J->ev, &J->nev));
    if (cfg->worker_exe[0]) {
        snprintf(sp->exe, sizeof(sp->exe), "%s", cfg->worker_exe);
    } else {
        ssize_t n = readlink("/proc/self/exe", sp->exe, sizeof(sp->exe) - 1);
        if (n <= 0)
            return st_log_errno(-errno, "Cannot find my own executable");
        sp->exe[n] = '\0';
    }
    snprintf(sp->coordinator, sizeof(sp->coordinator), "%s", coord_grpc_addr(J->c));
    const char *path = cfg->spec_path[0] ? cfg->spec_path : J->spec.path;
    if (!realpath(path, sp->job))
        return st_log_errno(-errno, "Cannot resolve the spec path '%s'", path);
    snprintf(sp->steps, sizeof(sp->steps), "%d", J->spec.training.steps);
    snprintf(sp->threads, sizeof(sp->threads), "%d",
             cfg->worker_threads > 0 ? cfg->worker_threads : 1);
    (void)state_dir;
    J->pc.events = J->ev;
    J->pc.nevents = J->nev;
    J->pc.time_scale = J->lc->time_scale;
    J->pc.seed = J->spec.training.seed;
    J->pc.spawn = spawn_worker;
    J->pc.spawn_userdata = sp;
    return 0;
}

/* Creates and starts the provider for sim and cloud fleets. */
static int fleet_start(struct job *J, const char *state_dir) {
    const struct coord_job_config *cfg = J->cfg;
    if (cfg->fleet == COORD_JOB_FLEET_JOINERS)
        return 0;
    cloud_config_init(&J->pc);
    int r = cloud_config_from_fleet(&J->pc, &J->spec.fleet);
    if (r < 0)
        return st_log_errno(r, "Bad fleet section");
    J->pc.spec = &J->spec;
    snprintf(J->pc.job_name, sizeof(J->pc.job_name), "%s", J->spec.name);
    coord_job_get(J->c, J->pc.job_id, NULL, NULL, NULL, NULL, NULL);
    snprintf(J->pc.coordinator, sizeof(J->pc.coordinator), "%s", coord_grpc_addr(J->c));
    J->pc.token = cfg->coord->token[0] ? cfg->coord->token : NULL;
    const char *name = st_provider_name(J->spec.fleet.provider);
    if (cfg->fleet == COORD_JOB_FLEET_SIM) {
        TRY(sim_fleet_setup(J, state_dir));
        name = "sim";
    } else if (cfg->provider_setup) {
        TRY(cfg->provider_setup(cfg->provider_userdata, &J->pc));
    }
    r = cloud_provider_new(name, &J->pc, &J->prov);
    if (r == -ENOENT) {
        st_log(ST_LOG_ERR, "job", "Provider '%s' is not available in this build", name);
        return -EINVAL;
    }
    if (r < 0)
        return st_log_errno(r, "Cannot create the '%s' fleet", name);
    if ((r = cloud_provider_start(J->prov, st_now())) < 0)
        return st_log_errno(r, "Cannot start the '%s' fleet", name);
    coord_loop_set_provider(J->L, J->prov); /* after start: the trace's time 0 is now */
    return 0;
}

/* Builds the loop's configuration from the job's. */
static int loop_config(struct job *J, const char *state_dir) {
    const struct coord_job_config *cfg = J->cfg;
    struct coord_loop_config *lc = J->lc;
    lc->spec = J->spec;
    if (cfg->heartbeat_deadline > 0)
        lc->spec.coordinator.heartbeat_deadline = cfg->heartbeat_deadline;
    lc->steps = J->spec.training.steps;
    lc->reconfig_timeout = J->spec.coordinator.reconfig_timeout;
    if (cfg->fleet == COORD_JOB_FLEET_SIM)
        lc->time_scale = cfg->time_scale > 0 ? cfg->time_scale : J->spec.fleet.time_scale;
    else
        lc->time_scale = 1.0; /* real fleets: planning intervals are real seconds */
    lc->cost = J->cost;
    lc->migration_costs = J->spec.planner.migration_costs[0] ? &J->mcosts : NULL;
    lc->ckpt_latest = cfg->ckpt_latest;
    lc->ckpt_prune = cfg->ckpt_prune;
    lc->ckpt_commit = cfg->ckpt_commit;
    lc->ckpt_userdata = cfg->ckpt_userdata;
    if (J->spec.checkpoint.interval > 0) {
        /* Under the job's own directory: a checkpoint of another run of the same name can
         * never be taken for this job's. */
        snprintf(lc->ckpt_root, sizeof(lc->ckpt_root), "%s/ckpt", state_dir);
        lc->ckpt_interval = J->spec.checkpoint.interval * lc->time_scale;
    }
    snprintf(lc->save_dir, sizeof(lc->save_dir), "%s", cfg->save_dir);
    if (cfg->shapes) {
        int n = coord_loop_parse_forced(cfg->shapes, lc->forced, COORD_LOOP_MAX_FORCED);
        if (n < 0) {
            st_log(ST_LOG_ERR, "job", "Invalid forced shapes '%s'", cfg->shapes);
            return -EINVAL;
        }
        lc->nforced = n;
    }
    lc->hold_trace = cfg->fleet == COORD_JOB_FLEET_SIM;
    if (cfg->fleet == COORD_JOB_FLEET_SIM) {
        int initial = J->trace->nintervals > 0 ? plan_trace_n_after(J->trace, 0) : 0;
        lc->expect_workers = ST_MAX(1, ST_MIN(initial, J->spec.fleet.max > 0 ? J->spec.fleet.max
                                                                              : initial));
    } else if (cfg->fleet == COORD_JOB_FLEET_PROVIDER) {
        lc->expect_workers = ST_MAX(1, J->spec.fleet.max > 0 ? J->spec.fleet.max
                                                            : J->spec.fleet.min);
    } else {
        lc->expect_workers = J->spec.fleet.min > 0 ? J->spec.fleet.min : 1;
    }
    return 0;
}

/* The ticks, until the job ends or the stop flag is raised. Returns 1 when the job is over,
 * 0 when stopped by the flag with on_stop KEEP, negative errno on a loop failure. */
static int tick_until_done(struct job *J) {
    const struct coord_job_config *cfg = J->cfg;
    const struct coord_job_ui *ui = &cfg->ui;
    double every = ui->progress_interval > 0 ? ui->progress_interval : 0.25, last_draw = 0;
    for (;;) {
        double now = st_now();
        if (cfg->stop_flag && *cfg->stop_flag) {
            if (cfg->on_stop == COORD_JOB_STOP_KEEP) {
                st_log(ST_LOG_NOTICE, "job", "Stopping; the job and its fleet stay for a "
                                             "restart to adopt");
                return 0;
            }
            coord_loop_cancel(J->L);
        }
        /* A Stop over REST (POST /v1/job:stop) ends the job like a cancel: the loop winds
         * down and the fleet is released, whatever phase it was in. */
        enum coord_job_state js = COORD_JOB_PENDING;
        coord_job_get(J->c, NULL, NULL, NULL, NULL, &js, NULL);
        if (js == COORD_JOB_STOPPING || js == COORD_JOB_STOPPED)
            coord_loop_cancel(J->L);
        int r = coord_loop_tick(J->L, now);
        report_events(J);
        if (r < 0)
            return st_log_errno(r, "Planning loop failed");
        if (ui->on_progress && (now - last_draw >= every || r == 1)) {
            struct coord_loop_status st;
            coord_loop_status(J->L, &st);
            ui->on_progress(&st, ui->userdata);
            last_draw = now;
        }
        if (r == 1)
            return 1;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Whether some worker may still be running the job: one not yet known to have acknowledged
 * its Stop or been lost. An unreadable table counts as yes (the drain stays bounded). */
static bool workers_running(struct job *J) {
    struct coord_worker *w = NULL;
    size_t n = 0;
    if (coord_workers_get(J->c, &w, &n) < 0)
        return true;
    bool running = false;
    for (size_t i = 0; i < n && !running; i++)
        running = w[i].state != COORD_WORKER_STOPPED && w[i].state != COORD_WORKER_LOST;
    st_free(w);
    return running;
}

/* After the job's Stop: waits (bounded) for the workers to finish, then releases whatever is
 * still running. A sim worker's process exits by itself; a cloud's VM or a pod does not, so
 * there the wait ends once every worker has acknowledged its Stop (or was lost), and not
 * when the bound runs out: a user's ^C or a finished job does not sit 5 s on idle VMs. */
static void fleet_drain(struct job *J) {
    if (!J->prov)
        return;
    double until = st_now() + 5.0;
    while (st_now() < until) {
        struct cloud_signal sig[32];
        size_t k = 0, alive = 0;
        (void)cloud_provider_poll(J->prov, st_now(), sig, ST_ARRAY_SIZE(sig), &k);
        (void)cloud_provider_instances(J->prov, NULL, 0, &alive);
        if (alive == 0 || (J->cfg->fleet != COORD_JOB_FLEET_SIM && !workers_running(J)))
            break;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    struct cloud_instance inst[64];
    size_t n = 0;
    for (int round = 0; round < 64; round++) {
        if (cloud_provider_instances(J->prov, inst, ST_ARRAY_SIZE(inst), &n) < 0 || n == 0)
            break;
        for (size_t i = 0; i < ST_MIN(n, ST_ARRAY_SIZE(inst)); i++)
            (void)cloud_provider_release(J->prov, inst[i].name, st_now());
    }
}

/* See job.h. */
int coord_job_run(const struct coord_job_config *cfg, struct coord_loop_summary *ret_sum) {
    if (!cfg || !cfg->spec || !cfg->coord || !cfg->coord->state_dir[0])
        return -EINVAL;
    struct job *J = st_calloc(1, sizeof(*J));
    int r = 0, result = 1;
    bool keep = false;
    if (!J)
        return -ENOMEM;
    J->cfg = cfg;
    J->spec = *cfg->spec;
    if (cfg->steps > 0)
        J->spec.training.steps = cfg->steps;
    J->lc = st_calloc(1, sizeof(*J->lc));
    J->spawn = st_calloc(1, sizeof(*J->spawn));
    if (!J->lc || !J->spawn)
        TRY_GOTO(-ENOMEM, r, out);
    const char *state_dir = cfg->work_dir[0] ? cfg->work_dir : cfg->coord->state_dir;
    TRY_GOTO(st_mkdir_p(state_dir, 0700), r, out);
    if (cfg->fleet == COORD_JOB_FLEET_SIM) {
        if ((r = load_trace(&J->spec, &J->trace)) < 0)
            goto out;
        /* Sim workers read the token from a file the driver writes. */
        snprintf(J->spawn->token_file, sizeof(J->spawn->token_file), "%s/token", state_dir);
        if (!cfg->coord->token[0]) {
            if ((r = write_token(J->spawn->token_file)) < 0) {
                (void)st_log_errno(r, "Cannot write '%s'", J->spawn->token_file);
                goto out;
            }
            char why[256];
            if (coord_token_read(J->spawn->token_file, cfg->coord->token,
                                 sizeof(cfg->coord->token), why, sizeof(why)) < 0) {
                st_log(ST_LOG_ERR, "job", "%s", why);
                TRY_GOTO(-EINVAL, r, out);
            }
        } else {
            char line[sizeof(cfg->coord->token) + 2];
            snprintf(line, sizeof(line), "%s\n", cfg->coord->token);
            if ((r = st_write_file_atomic(J->spawn->token_file, line, strlen(line))) < 0) {
                (void)st_log_errno(r, "Cannot write '%s'", J->spawn->token_file);
                goto out;
            }
        }
    }
    /* The liveput planner's cost model, from the spec's model and hardware figures. */
    r = plan_cost_from_spec(&J->spec, &J->cost);
    if (r < 0) {
        st_log(ST_LOG_WARN, "job", "No cost model for this spec (%s); the loop fills the fleet, "
                                   "ignoring", st_strerror(r));
        J->cost = NULL;
    }
    if (J->spec.planner.migration_costs[0]) {
        /* A cost file the fitted model starts from (scripts/bench migration writes one). */
        const char *path = J->spec.planner.migration_costs;
        char *text = NULL;
        size_t len = 0;
        struct st_error err;
        memset(&err, 0, sizeof(err));
        r = st_read_file(path, 1u << 20, &text, &len);
        if (r < 0) {
            st_log(ST_LOG_ERR, "job", "Cannot read planner.migration_costs '%s': %s", path,
                   st_strerror(r));
            r = -EINVAL; /* the spec names it: bad input, whatever the reason */
            goto out;
        }
        r = plan_measured_costs_parse(path, text, len, &J->mcosts, &err);
        st_free(text);
        if (r < 0) {
            st_log(ST_LOG_ERR, "job", "planner.migration_costs '%s' is not a cost file: %s",
                   path, err.message[0] ? err.message : st_strerror(r));
            goto out;
        }
    }
    TRY_GOTO(loop_config(J, state_dir), r, out);
    if ((r = coord_loop_new(J->lc, &J->L)) < 0) {
        (void)st_log_errno(r, "Cannot create the planning loop");
        goto out;
    }
    struct coord_hooks hooks;
    coord_loop_hooks(J->L, &hooks);
    cfg->coord->spec = &J->spec;
    if (cfg->heartbeat_deadline > 0)
        cfg->coord->heartbeat_deadline = cfg->heartbeat_deadline;
    if (cfg->coord->settle <= 0)
        cfg->coord->settle = cfg->fleet == COORD_JOB_FLEET_SIM ? 0.1 : 0.2;
    if ((r = coord_new(cfg->coord, &hooks, &J->c)) < 0) {
        (void)st_log_errno(r, "Cannot open the job state in '%s'", state_dir);
        goto out;
    }
    if (J->lc->ckpt_root[0] && strstr(J->spec.checkpoint.dir, "://")) {
        /* An object-store checkpoint.dir (s3://, gs://, az://) is the one place a cloud
         * fleet's workers and a replacement coordinator all reach (the state directory is this
         * machine's): checkpoints go to DIR/JOB-ID there, so that another run of the same name
         * is never taken for this one's, as STATE/ckpt guarantees locally. */
        char job_id[ST_UUID_STR_LEN], root[ST_SPEC_PATH_MAX];
        coord_job_get(J->c, job_id, NULL, NULL, NULL, NULL, NULL);
        size_t n = strlen(J->spec.checkpoint.dir);
        while (n > 0 && J->spec.checkpoint.dir[n - 1] == '/')
            n--;
        int w = snprintf(root, sizeof(root), "%.*s/%s", (int)n, J->spec.checkpoint.dir, job_id);
        if (w < 0 || (size_t)w >= sizeof(root)) {
            r = st_log_errno(-ENAMETOOLONG, "checkpoint.dir '%s' is too long",
                             J->spec.checkpoint.dir);
            goto out;
        }
        coord_loop_set_ckpt_root(J->L, root);
    }
    if ((r = coord_loop_attach(J->L, J->c)) < 0 || (r = coord_start(J->c)) < 0) {
        (void)st_log_errno(r, "Cannot start the coordinator");
        goto out;
    }
    if (cfg->ui.on_started) {
        char job_id[ST_UUID_STR_LEN];
        coord_job_get(J->c, job_id, NULL, NULL, NULL, NULL, NULL);
        cfg->ui.on_started(coord_grpc_addr(J->c), coord_rest_addr(J->c), job_id, state_dir,
                           cfg->ui.userdata);
    }
    if ((r = fleet_start(J, state_dir)) < 0)
        goto out;
    r = tick_until_done(J);
    if (r < 0)
        goto out;
    keep = r == 0;
    if (!keep)
        fleet_drain(J);
    struct coord_loop_summary *sum = st_calloc(1, sizeof(*sum));
    if (!sum)
        TRY_GOTO(-ENOMEM, r, out);
    coord_loop_summary(J->L, sum);
    result = sum->finished ? 0 : 1;
    if (ret_sum)
        *ret_sum = *sum;
    st_free(sum);
    r = 0;
out:
    if (J->c)
        coord_shutdown(J->c);
    /* A kept fleet stays: its provider handle is dropped without releasing (sim processes are
     * children and die with us; cloud providers forget their instances). */
    if (keep && J->prov)
        cloud_provider_detach(J->prov);
    J->prov = cloud_provider_free(J->prov);
    J->c = coord_free(J->c);
    J->L = coord_loop_free(J->L);
    plan_cost_free(J->cost);
    plan_trace_free(J->trace);
    st_free(J->ev);
    st_free(J->lc);
    st_free(J->spawn);
    st_free(J);
    return r < 0 ? r : result;
}
