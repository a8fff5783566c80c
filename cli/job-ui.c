/* job-ui.c: what every command that runs a job shares — loading a spec with its errors
 * printed, the checkpoint store the job driver is handed, and printing what the driver
 * reports (events, the live status block, the summary and its JSON).
 *
 * One idea: the job driver (coordinator/job.h) decides and the commands only show. `run`,
 * `coordinator --train` and `launch` print through these functions, so a user sees the same
 * lines whichever fleet the job runs on. */
#include <errno.h>
#include <fcntl.h> /* F_DUPFD_CLOEXEC, O_CLOEXEC */
#include <inttypes.h>
#include <jansson.h> /* json_dumps: the error string quoted */
#include <limits.h> /* PATH_MAX */
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h> /* TIOCGWINSZ */
#include <sys/stat.h>
#include <unistd.h>

#include "check.h" /* TRY */
#include "cli.h"
#include "common.h"
#include "job-ui.h" /* struct cli_job */
#include "coordinator.h"
#include "planner.h" /* plan_feasible */
#include "kernels.h"
#include "migrate.h"
#include "planner.h"
#include "worker.h" /* worker_model_json, worker_train_config_from_spec */

#define CLI_SPEC_MAX_ERRS 64

/* See cli.h. */
int cli_spec_load(const char *name, const char *path, struct st_spec *ret_spec) {
    struct st_error *errs = st_calloc(CLI_SPEC_MAX_ERRS, sizeof(*errs));
    size_t nerrs = 0;
    if (!errs) {
        fprintf(stderr, "spottrain %s: %s\n", name, st_strerror(-ENOMEM));
        return CLI_EXIT_FAILURE;
    }
    int r = st_spec_load(path, ret_spec, errs, CLI_SPEC_MAX_ERRS, &nerrs);
    if (r < 0) {
        char line[1024];
        for (size_t i = 0; i < nerrs && i < CLI_SPEC_MAX_ERRS; i++) {
            st_error_format(&errs[i], line, sizeof(line));
            fprintf(stderr, "%s\n", line);
        }
        if (nerrs > CLI_SPEC_MAX_ERRS)
            fprintf(stderr, "%s: ... and %zu more errors\n", path, nerrs - CLI_SPEC_MAX_ERRS);
        if (nerrs == 0)
            fprintf(stderr, "spottrain %s: cannot load '%s': %s\n", name, path, st_strerror(r));
    }
    st_free(errs);
    if (r == -ENOMEM)
        return CLI_EXIT_FAILURE;
    if (r < 0)
        return CLI_EXIT_INPUT; /* a bad or unreadable spec is bad input */
    /* A spec no shape can run would only wait: refuse it here, before any fleet starts. */
    return cli_spec_feasible(path, ret_spec);
}

/* See cli.h. */
int cli_spec_feasible(const char *path, const struct st_spec *spec) {
    struct plan_feasibility f;
    int r = plan_feasible(spec, &f);
    if (r == -ENOMEM) {
        fprintf(stderr, "spottrain: %s\n", st_strerror(r));
        return CLI_EXIT_FAILURE;
    }
    if (r < 0) {
        fprintf(stderr, "%s: cannot check which shapes can run this job: %s\n", path,
                st_strerror(r));
        return CLI_EXIT_INPUT;
    }
    if (f.nfeasible > 0)
        return CLI_EXIT_OK;
    struct st_error e;
    int line = 0, col = 0;
    if (st_spec_where(spec, f.field, &line, &col) < 0)
        line = col = 0;
    st_error_set(&e, path, line, col, f.field, "%s", f.message);
    char buf[1024];
    st_error_format(&e, buf, sizeof(buf));
    fprintf(stderr, "%s\n", buf);
    return CLI_EXIT_INPUT;
}

/* ---- the checkpoint store the driver is handed ------------------------------------------- */

/* See cli.h. */
int cli_ckpt_latest(void *userdata, const char *root, char *dir, size_t dirsz,
                    uint64_t *ret_step) {
    (void)userdata;
    return mig_ckpt_latest_step(root, dir, dirsz, ret_step);
}

/* See cli.h. */
int cli_ckpt_prune(void *userdata, const char *root, int keep) {
    (void)userdata;
    return mig_ckpt_prune(root, keep);
}

/* See cli.h. The manifest needs the model's description, which worker/ owns: this is the one
 * piece of glue between the driver (which may not link worker/) and the checkpoint format. */
int cli_ckpt_commit(void *userdata, const char *dir, uint64_t step, int dp, int pp) {
    const struct st_spec *spec = userdata;
    struct worker_train_config tc;
    TRY(worker_train_config_from_spec(spec, &tc));
    char *model = worker_model_json(&tc.model);
    if (!model)
        return -ENOMEM;
    char extra[256];
    snprintf(extra, sizeof(extra), "{\"global_batch\":%d,\"micro_batch\":%d,\"dp\":%d,"
             "\"pp\":%d}", tc.global_batch, tc.micro_batch, dp, pp);
    struct mig_ckpt_meta meta = {
        .model_json = model,
        .step = step,
        .samples_committed = step * (uint64_t)tc.global_batch,
        .data_position = step,
        .data_seed = tc.seed,
        .opt_step = step, /* one AdamW step per training step */
        .extra_json = extra,
    };
    int r = mig_ckpt_commit(dir, &meta, kern_num_layers(&tc.model));
    st_free(model);
    return r;
}

/* See cli.h. */
void cli_job_ckpt_store(struct coord_job_config *jc, const struct st_spec *spec) {
    jc->ckpt_latest = cli_ckpt_latest;
    jc->ckpt_prune = cli_ckpt_prune;
    jc->ckpt_commit = cli_ckpt_commit;
    jc->ckpt_userdata = (void *)spec;
}

/* ---- printing what the driver reports ------------------------------------------------------ */

static void ui_event(const char *line, void *userdata) {
    struct cli_job_ui *u = userdata;
    pthread_mutex_lock(&u->lock);
    if (u->tty && u->drawn) {
        printf("\033[%dA\033[J", u->drawn); /* the event goes above the status block */
        u->drawn = 0;
    }
    printf("%s%s\n", u->prefix, line);
    fflush(stdout);
    if (u->tty && u->have_status)
        cli_job_ui_draw(u, &u->last);
    pthread_mutex_unlock(&u->lock);
}

static void ui_progress(const struct coord_loop_status *st, void *userdata) {
    struct cli_job_ui *u = userdata;
    pthread_mutex_lock(&u->lock);
    u->last = *st;
    u->have_status = true;
    double now = st_now();
    if (u->tty || now - u->last_line >= 2.0) {
        cli_job_ui_draw(u, st);
        u->last_line = now;
    }
    pthread_mutex_unlock(&u->lock);
}

/* ---- log lines above the block (a terminal) ---------------------------------------------- */

/* One line (or a piece of an overlong one) that went to our stderr: erase the block, write
 * the line to the terminal, draw the block again below it. */
static void ui_log_line(struct cli_job_ui *u, const char *p, size_t n) {
    pthread_mutex_lock(&u->lock);
    if (u->drawn) {
        printf("\033[%dA\033[J", u->drawn);
        fflush(stdout);
        u->drawn = 0;
    }
    while (n > 0) {
        ssize_t w = write(u->err_fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        p += w;
        n -= (size_t)w;
    }
    if (u->have_status)
        cli_job_ui_draw(u, &u->last);
    pthread_mutex_unlock(&u->lock);
}

static void *ui_reader(void *arg) {
    struct cli_job_ui *u = arg;
    char buf[4096];
    size_t have = 0;
    for (;;) {
        ssize_t n = read(u->pipe_rd, buf + have, sizeof(buf) - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        have += (size_t)n;
        size_t start = 0;
        for (size_t i = 0; i < have; i++) {
            if (buf[i] == '\n') {
                ui_log_line(u, buf + start, i + 1 - start);
                start = i + 1;
            }
        }
        if (start == 0 && have == sizeof(buf)) { /* a line longer than the buffer */
            ui_log_line(u, buf, have);
            have = 0;
        } else {
            memmove(buf, buf + start, have - start);
            have -= start;
        }
    }
    if (have > 0) {
        buf[have < sizeof(buf) ? have : sizeof(buf) - 1] = '\n';
        ui_log_line(u, buf, have < sizeof(buf) ? have + 1 : have);
    }
    atomic_store(&u->reader_done, true);
    return NULL;
}

/* While the job runs on a terminal: fd 2 becomes a pipe that ui_reader prints above the
 * block; workers the sim starts inherit it. Nothing changes when it cannot be set up. */
static void ui_capture_begin(struct cli_job_ui *u) {
    int fds[2];
    if (!u->tty || !isatty(STDERR_FILENO) || u->err_fd >= 0 || pipe2(fds, O_CLOEXEC) < 0)
        return;
    int saved = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
    fflush(stderr);
    if (saved < 0 || dup2(fds[1], STDERR_FILENO) < 0) {
        if (saved >= 0)
            close(saved);
        close(fds[0]);
        close(fds[1]);
        return;
    }
    close(fds[1]);
    u->err_fd = saved;
    u->pipe_rd = fds[0];
    atomic_store(&u->reader_done, false);
    if (pthread_create(&u->reader, NULL, ui_reader, u) != 0) {
        dup2(saved, STDERR_FILENO);
        close(saved);
        close(fds[0]);
        u->err_fd = -1;
    }
}

/* The job is over: fd 2 is the terminal again, and the reader prints what is left in the pipe
 * (it ends when the last writer, ours or a worker's, is gone; waited for 1 s at most, then
 * left to finish on its own). */
static void ui_capture_end(struct cli_job_ui *u) {
    if (u->err_fd < 0)
        return;
    fflush(stderr);
    dup2(u->err_fd, STDERR_FILENO);
    for (int i = 0; i < 100 && !atomic_load(&u->reader_done); i++)
        usleep(10000);
    if (atomic_load(&u->reader_done)) {
        pthread_join(u->reader, NULL);
        close(u->pipe_rd);
        close(u->err_fd);
    } else {
        pthread_detach(u->reader); /* it still writes to err_fd: both stay open */
    }
    u->err_fd = -1;
}

static void ui_started(const char *grpc, const char *rest, const char *job_id,
                       const char *state_dir, void *userdata) {
    struct cli_job_ui *u = userdata;
    snprintf(u->rest, sizeof(u->rest), "%s", rest);
    fprintf(stderr, "spottrain %s: coordinator grpc=%s rest=%s%s job=%s state=%s\n", u->cmd,
            grpc, rest[0] ? "http://" : "", rest[0] ? rest : "-", job_id, state_dir);
    fflush(stderr);
}

/* See cli.h. */
void cli_job_ui_draw(struct cli_job_ui *u, const struct coord_loop_status *st) {
    char line[4][240], loss[32];
    if (isfinite(st->loss) && st->step > 0)
        snprintf(loss, sizeof(loss), "%.4f", st->loss);
    else
        snprintf(loss, sizeof(loss), "-");
    snprintf(line[0], sizeof(line[0]), "step %" PRIu64 "/%" PRIu64 "  loss %s  %.1f samples/s",
             st->step, st->total, loss, st->samples_per_s);
    if (st->dp > 0)
        snprintf(line[1], sizeof(line[1]), "shape %dx%d (dp x pp)  epoch %" PRIu64 "  %s",
                 st->dp, st->pp, st->epoch, st->phase);
    else if (st->waiting[0])
        snprintf(line[1], sizeof(line[1]), "shape -  epoch %" PRIu64 "  waiting: %.200s",
                 st->epoch, st->waiting);
    else
        snprintf(line[1], sizeof(line[1]), "shape -  epoch %" PRIu64 "  %s", st->epoch,
                 st->phase);
    snprintf(line[2], sizeof(line[2]), "instances alive %d  forecast %d", st->alive,
             st->forecast);
    snprintf(line[3], sizeof(line[3]), "last: %.200s", st->last_event);
    if (u->tty) {
        /* Each line is cut to the terminal's width: a line that wrapped would take two rows
         * while the redraw moves up one per line, leaving a stale copy of the block's top. */
        struct winsize ws;
        int cols = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 ? ws.ws_col : 80;
        if (u->drawn)
            printf("\033[%dA", u->drawn);
        for (int i = 0; i < 4; i++)
            printf("\033[2K%.*s\n", cols - 1, line[i]);
        u->drawn = 4;
    } else {
        /* Without the epoch: each event line ("epoch 2: ...") is printed once, and a log
         * searched for an epoch finds its event, not every progress line after it. */
        char shape[64];
        if (st->dp > 0)
            snprintf(shape, sizeof(shape), "shape %dx%d (dp x pp) %s", st->dp, st->pp,
                     st->phase);
        else
            snprintf(shape, sizeof(shape), "shape - %s", st->phase);
        printf("%sprogress: %s | %s | %s\n", u->prefix, line[0], shape, line[2]);
    }
    fflush(stdout);
}

/* See cli.h. */
void cli_job_ui_finish(struct cli_job_ui *u) {
    if (u->tty) {
        /* The summary that follows says it all: a stale block above it would only repeat
         * the last epoch's line. */
        if (u->drawn)
            printf("\033[%dA\033[J", u->drawn);
        u->drawn = 0;
        fflush(stdout);
    } else if (u->have_status) {
        cli_job_ui_draw(u, &u->last);
    }
}

/* See cli.h. */
void cli_job_ui_init(struct cli_job_ui *u, const char *cmd, const char *prefix,
                     struct coord_job_ui *ret) {
    memset(u, 0, sizeof(*u));
    pthread_mutex_init(&u->lock, NULL);
    u->err_fd = -1;
    u->pipe_rd = -1;
    u->cmd = cmd;
    u->prefix = prefix;
    u->tty = isatty(STDOUT_FILENO);
    memset(ret, 0, sizeof(*ret));
    ret->userdata = u;
    ret->on_started = ui_started;
    ret->on_event = ui_event;
    ret->on_progress = ui_progress;
    ret->progress_interval = u->tty ? 0.25 : 0.5;
}

/* ---- the run of `run` and `launch` ---------------------------------------------------------- */

/* One flag for the process: a command runs at most one job, and a handler can reach only a
 * global. */
static volatile sig_atomic_t job_stop;

static void on_stop_signal(int sig) {
    (void)sig;
    job_stop = 1;
}

/* See job-ui.h. */
struct cli_job *cli__job_new(const char *cmd, const struct st_spec *spec, const char *spec_path,
                             const char *save) {
    struct cli_job *j = st_calloc(1, sizeof(*j));
    if (!j) {
        fprintf(stderr, "spottrain %s: out of memory\n", cmd);
        return NULL;
    }
    j->cmd = cmd;
    coord_config_init(&j->cc);
    coord_job_config_init(&j->jc);
    j->jc.spec = spec;
    snprintf(j->jc.spec_path, sizeof(j->jc.spec_path), "%s", spec_path);
    j->jc.coord = &j->cc;
    j->jc.stop_flag = &job_stop;
    if (save)
        snprintf(j->jc.save_dir, sizeof(j->jc.save_dir), "%s", save);
    cli_job_ckpt_store(&j->jc, spec);
    cli_job_ui_init(&j->ui, cmd, "", &j->jc.ui);
    return j;
}

/* See job-ui.h. */
int cli__job_state_dir(const char *cmd, const char *dir, const char *what, char *state,
                       size_t statesz) {
    if (dir) {
        snprintf(state, statesz, "%s", dir);
        int r = st_mkdir_p(state, 0700);
        if (r < 0) {
            fprintf(stderr, "spottrain %s: cannot create %s '%s': %s\n", cmd, what, state,
                    st_strerror(r));
            return CLI_EXIT_INPUT;
        }
        return CLI_EXIT_OK;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(state, statesz, "%s/spottrain-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", cmd);
    if (!mkdtemp(state)) {
        fprintf(stderr, "spottrain %s: cannot create a state directory: %s\n", cmd,
                strerror(errno));
        return CLI_EXIT_FAILURE;
    }
    return CLI_EXIT_OK;
}

/* 0 when path can be written: the file when it is there, else a new one in its directory. */
static int file_writable(const char *path) {
    struct stat sb;
    if (!*path)
        return -ENOENT;
    if (stat(path, &sb) == 0)
        return S_ISDIR(sb.st_mode) ? -EISDIR : access(path, W_OK) < 0 ? -errno : 0;
    if (errno != ENOENT)
        return -errno;
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
    return access(dir, W_OK | X_OK) < 0 ? -errno : 0;
}

/* See job-ui.h. */
int cli__job_check_outputs(const char *cmd, const char *save, bool local_save, const char *json) {
    int r;
    if (save && (local_save || strstr(save, "://")) && (r = mig_ckpt_check_dest(save)) < 0) {
        fprintf(stderr, "spottrain %s: cannot use --save '%s': %s\n", cmd, save, st_strerror(r));
        return r == -ENOMEM ? CLI_EXIT_FAILURE : CLI_EXIT_INPUT;
    }
    return json ? cli__job_check_file(cmd, "--json-summary", json) : CLI_EXIT_OK;
}

/* See job-ui.h. */
int cli__job_check_file(const char *cmd, const char *flag, const char *path) {
    int r = file_writable(path);
    if (r < 0) {
        fprintf(stderr, "spottrain %s: cannot write %s '%s': %s\n", cmd, flag, path,
                st_strerror(r));
        return CLI_EXIT_INPUT;
    }
    return CLI_EXIT_OK;
}

/* See job-ui.h. */
int cli__job_run(struct cli_job *j) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    ui_capture_begin(&j->ui);
    int r = coord_job_run(&j->jc, &j->sum);
    ui_capture_end(&j->ui);
    if (r < 0)
        fprintf(stderr, "spottrain %s: %s\n", j->cmd, st_strerror(r));
    return r;
}

/* See job-ui.h. */
bool cli__job_stopped(void) {
    return job_stop != 0;
}

/* See job-ui.h. */
int cli__job_summary(struct cli_job *j, int r, const char *json) {
    cli_job_print_summary(stdout, &j->sum, j->jc.spec);
    return cli__job_json(j, json, r == 0 ? CLI_EXIT_OK : CLI_EXIT_FAILURE);
}

/* See job-ui.h. */
int cli__job_json(const struct cli_job *j, const char *json, int code) {
    int r;
    if (json && (r = cli_job_write_json(json, &j->sum)) < 0) {
        fprintf(stderr, "spottrain %s: cannot write '%s': %s\n", j->cmd, json, st_strerror(r));
        return CLI_EXIT_FAILURE;
    }
    return code;
}

/* See job-ui.h. */
int cli__job_save_costs(const struct cli_job *j, const char *path, int code) {
    const __typeof__(j->sum.cost_model) *cm = &j->sum.cost_model;
    if (!path)
        return code;
    if (!cm->fitted_ok) {
        printf("costs: no live migration was measured; '%s' left as it was\n", path);
        return code;
    }
    struct plan_measured_costs m = cm->fitted;
    const struct st_spec *spec = j->jc.spec;
    uint64_t n = 0;
    for (int k = 0; k < PLAN_RECONF_NLIVE; k++)
        if (k != PLAN_RECONF_DP_RESHARDING) /* a dp change is also counted under its kind */
            n += cm->n[k];
    char source[512];
    if (spec->planner.migration_costs[0]) {
        snprintf(source, sizeof(source), "spottrain %s (job %s): fixed parts fitted from %" PRIu64
                 " live migrations and those behind %s; throughput and machine from that file",
                 j->cmd, spec->name, n, spec->planner.migration_costs);
    } else {
        char host[64] = "";
        (void)gethostname(host, sizeof(host) - 1);
        if (spec->fleet.provider == ST_PROVIDER_SIM) /* the workers ran here */
            snprintf(m.machine, sizeof(m.machine), "%s (%ld cpus), sim fleet",
                     host[0] ? host : "?", sysconf(_SC_NPROCESSORS_ONLN));
        else
            snprintf(m.machine, sizeof(m.machine), "%s, %s fleet", spec->fleet.instance_type,
                     st_provider_name(spec->fleet.provider));
        snprintf(source, sizeof(source), "spottrain %s (job %s): fixed parts fitted from %" PRIu64
                 " live migrations; throughput: the spec's fleet.net_gbps (%g Gb/s), not "
                 "measured", j->cmd, spec->name, n, spec->fleet.net_gbps);
    }
    char *text = NULL;
    int r = plan_measured_costs_format(&m, source, &text);
    if (r == 0)
        r = st_write_file_atomic(path, text, strlen(text));
    st_free(text);
    if (r < 0) {
        fprintf(stderr, "spottrain %s: cannot write --save-costs '%s': %s\n", j->cmd, path,
                st_strerror(r));
        return CLI_EXIT_FAILURE;
    }
    printf("costs: %s (fixed s: intra-stage %.4f, inter-stage %.4f, pipeline %.4f, "
           "dp-resharding %.4f)\n", path, m.fixed_s[PLAN_RECONF_INTRA_STAGE],
           m.fixed_s[PLAN_RECONF_INTER_STAGE], m.fixed_s[PLAN_RECONF_PIPELINE],
           m.fixed_s[PLAN_RECONF_DP_RESHARDING]);
    return code;
}

/* See cli.h. */
void cli_job_print_summary(FILE *f, const struct coord_loop_summary *s,
                           const struct st_spec *sp) {
    fprintf(f, "\nsummary\n");
    fprintf(f, "  steps              %" PRIu64 "%s\n", s->steps,
            s->finished ? "" : " (not finished)");
    if (s->error[0])
        fprintf(f, "  error              %s\n", s->error);
    fprintf(f, "  samples committed  %" PRIu64 "\n", s->samples);
    if (isfinite(s->final_loss))
        fprintf(f, "  final loss         %.4f (first reported %.4f)\n", s->final_loss,
                s->first_loss);
    else
        fprintf(f, "  final loss         - (no step reported a loss)\n");
    fprintf(f, "  wall time          %.1f s\n", s->wall_seconds);
    fprintf(f, "  time per shape    ");
    for (int i = 0; i < s->nshapes; i++)
        fprintf(f, " %dx%d %.1fs", s->shapes[i].dp, s->shapes[i].pp, s->shapes[i].seconds);
    fprintf(f, "\n  migrations         kind                 count        bytes   stall s\n");
    for (int k = 0; k < PLAN_RECONF_NKINDS; k++)
        fprintf(f, "                     %-20s %5" PRIu64 " %12" PRIu64 " %9.3f\n",
                plan_reconf_name((enum plan_reconf)k), s->count[k], s->bytes[k],
                s->stall[k]);
    fprintf(f, "  restores           %" PRIu64 " from peer copies, %" PRIu64 " from checkpoints "
               "(%" PRIu64 " and %" PRIu64 " steps replayed), %" PRIu64 " fresh starts\n",
            s->count[PLAN_RECONF_PEER_RESTORE], s->count[PLAN_RECONF_CHECKPOINT_RESTORE],
            s->replayed[PLAN_RECONF_PEER_RESTORE], s->replayed[PLAN_RECONF_CHECKPOINT_RESTORE],
            s->count[PLAN_RECONF_FRESH_START]);
    fprintf(f, "  notices relayed    %d (read by workers from their cloud's metadata endpoint)\n",
            s->worker_notices);
    fprintf(f, "  fleet              %.3f instance-hours: $%.2f spot, $%.2f on demand "
               "(%.2f/%.2f $/h)\n", s->instance_hours, s->spot_dollars, s->on_demand_dollars,
            sp->fleet.spot_price, sp->fleet.on_demand_price);
    if (s->spot_price_live > 0)
        fprintf(f, "  spot price         $%.6g/h live from the cloud (spec says $%.6g/h)\n",
                s->spot_price_live, sp->fleet.spot_price);
    fflush(f);
}

/* ", \"stall_seconds_predicted\": P, \"stall_seconds_measured\": M": the means of n summed
 * stalls, or nulls when n is 0. */
static void stall_means(FILE *f, uint64_t n, double predicted, double measured) {
    if (n > 0)
        fprintf(f, ", \"stall_seconds_predicted\": %.6f, \"stall_seconds_measured\": %.6f",
                predicted / (double)n, measured / (double)n);
    else
        fprintf(f, ", \"stall_seconds_predicted\": null, \"stall_seconds_measured\": null");
}

/* See cli.h. */
/* The summary's name for where a stall's subtracted step time came from. */
static const char *step_from_name(enum coord_loop_step_from f) {
    switch (f) {
    case COORD_LOOP_STEP_FROM_LATER: return "later-steps";
    case COORD_LOOP_STEP_FROM_FIRST: return "first-steps";
    case COORD_LOOP_STEP_FROM_NONE: break;
    }
    return "none";
}

int cli_job_write_json(const char *path, const struct coord_loop_summary *s) {
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
            s->wall_seconds, s->count[PLAN_RECONF_CHECKPOINT_RESTORE], s->worker_notices);
    if (s->error[0]) {
        json_t *js = json_string(s->error);
        char *e = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
        json_decref(js);
        if (!e) {
            fclose(f);
            return -ENOMEM;
        }
        fprintf(f, "  \"error\": %s,\n", e);
        free(e); /* jansson allocates with malloc */
    }
    fprintf(f, "  \"migrations\": {");
    for (int k = 0; k < PLAN_RECONF_NKINDS; k++) {
        fprintf(f, "%s\n    \"%s\": {\"count\": %" PRIu64 ", \"bytes\": %" PRIu64
                   ", \"stall_seconds\": %.6f", k ? "," : "",
                plan_reconf_name((enum plan_reconf)k), s->count[k], s->bytes[k],
                s->stall[k]);
        if (k >= PLAN_RECONF_CHECKPOINT_RESTORE) /* the recoveries */
            fprintf(f, ", \"steps_replayed\": %" PRIu64, s->replayed[k]);
        fprintf(f, "}");
    }
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
                   "\"prewarmed_bytes\": %" PRIu64 ", "
                   "\"stall_seconds\": %.6f, \"steps_replayed\": %" PRIu64 ", "
                   "\"seconds\": %.6f, \"stall_parts\": {\"wait\": %.6f, \"connect\": %.6f, "
                   "\"reshape\": %.6f, \"transfer\": %.6f, \"commit\": %.6f, \"rest\": %.6f}, "
                   "\"after_boundary\": {\"seconds\": %.6f, \"waited_seconds\": %.6f}, "
                   "\"stall_span_seconds\": %.6f, \"stall_step_seconds\": %.6f, "
                   "\"stall_step_from\": \"%s\", \"ordered_at_seconds\": %.3f, ",
                i ? "," : "", r->epoch, r->at_step, plan_reconf_name(r->kind),
                r->dp_reshard ? "true" : "false", r->from_dp, r->from_pp, r->to_dp, r->to_pp,
                r->planned_bytes, r->moved_bytes, r->prewarmed_bytes, r->stall_seconds,
                r->steps_replayed, r->seconds,
                r->parts.wait, r->parts.connect, r->parts.reshape, r->parts.transfer,
                r->parts.commit, r->parts.rest, r->after_seconds, r->after_waited,
                r->stall_span, r->stall_step,
                step_from_name(r->stall_step_from), r->ordered_at);
        /* The cost model's prediction for a live migration, made when it was ordered, where
         * the stall it is compared with was measured. */
        if (r->stall_compared)
            fprintf(f, "\"stall_seconds_predicted\": %.6f, \"stall_calibrated\": %s, ",
                    r->stall_predicted, r->stall_calibrated ? "true" : "false");
        else
            fprintf(f, "\"stall_seconds_predicted\": null, \"stall_calibrated\": false, ");
        fprintf(f, "\"ok\": %s}", r->ok ? "true" : "false");
    }
    /* The planner's cost model, predicted against measured (means; null when nothing to
     * compare). */
    const __typeof__(s->cost_model) *cm = &s->cost_model;
    fprintf(f, "\n  ],\n  \"cost_model\": {\"steps\": %" PRIu64, cm->steps);
    if (cm->steps > 0)
        fprintf(f, ", \"step_seconds_predicted\": %.6f, \"step_seconds_measured\": %.6f",
                cm->step_predicted / (double)cm->steps, cm->step_measured / (double)cm->steps);
    else
        fprintf(f, ", \"step_seconds_predicted\": null, \"step_seconds_measured\": null");
    fprintf(f, ", \"kinds\": {");
    for (int k = 0; k < PLAN_RECONF_NLIVE; k++) {
        fprintf(f, "%s\n    \"%s\": {\"count\": %" PRIu64, k ? "," : "",
                plan_reconf_name((enum plan_reconf)k), cm->n[k]);
        stall_means(f, cm->n[k], cm->stall_predicted[k], cm->stall_measured[k]);
        /* Apart: those predicted with measured migrations behind them. */
        fprintf(f, ", \"calibrated\": {\"count\": %" PRIu64, cm->cal_n[k]);
        stall_means(f, cm->cal_n[k], cm->cal_predicted[k], cm->cal_measured[k]);
        fprintf(f, "}}");
    }
    fprintf(f, "}},");
    fprintf(f, "\n  \"instance_hours\": %.6f,\n  \"spot_dollars\": %.6f,\n"
               "  \"on_demand_dollars\": %.6f,\n  \"spot_price_live\": %.17g\n}\n",
            s->instance_hours, s->spot_dollars, s->on_demand_dollars, s->spot_price_live);
    int r = ferror(f) ? -EIO : 0;
    if (fclose(f) != 0 && r == 0)
        r = -errno;
    return r;
}
