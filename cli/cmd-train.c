/* cmd-train.c: `spottrain train --local` — trains a job with a fixed (dp, pp) shape in
 * dp * pp local worker processes, no coordinator.
 *
 * The parent forks one process per position, each with its own data-plane endpoint; the
 * children send their endpoint address up a pipe, the parent sends everyone the full list
 * down another, and from then on the children talk only over the data plane. The parent just
 * waits: a child that dies makes its peers fail on the data plane (never hang: every call has
 * a no-progress timeout), and the parent reports which rank died and exits 1. */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "kernels.h"
#include "migrate.h"
#include "planner.h" /* plan_stage_split */
#include "tokens.h"
#include "worker.h"

#define TRAIN_MAX_LOCAL_RANKS 64

struct train_opts {
    int dp, pp;
    int steps;          /* -1 = the spec's */
    int threads;        /* per worker process; 0 = cores / ranks */
    double timeout;     /* data-plane no-progress limit, seconds */
    const char *save;   /* checkpoint directory or NULL */
    const char *job;
};

struct train_run {
    struct train_opts o;
    struct worker_train_config cfg;
    struct worker_layout layout;
    struct st_tokens *tokens;
};

static int parse_int(const char *name, const char *s, int min, int max, int *ret) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) {
        cli_usage_error("train", "invalid %s '%s' (expected an integer in %d..%d)", name, s, min,
                        max);
        return -EINVAL;
    }
    *ret = (int)v;
    return 0;
}

/* ---- the child: one worker ----------------------------------------------------------- */

static int read_line(int fd, char *buf, size_t size) {
    size_t n = 0;
    while (n + 1 < size) {
        char c;
        ssize_t k = read(fd, &c, 1);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -ECONNRESET;
        if (c == '\n')
            break;
        buf[n++] = c;
    }
    buf[n] = '\0';
    return 0;
}

static int write_all(int fd, const char *s, size_t len) {
    while (len > 0) {
        ssize_t k = write(fd, s, len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -errno;
        s += k;
        len -= (size_t)k;
    }
    return 0;
}

static int child_main(const struct train_run *run, int rank, int fd_up, int fd_down) {
    const struct train_opts *o = &run->o;
    int n = o->dp * o->pp, stage = rank / o->dp, replica = rank % o->dp;
    struct mig_endpoint *ep = NULL;
    struct mig_comm *comm = NULL;
    struct worker_engine *e = NULL;
    char (*addrs)[MIG_ADDR_MAX] = NULL;
    const char **addrp = NULL;
    char id[32];
    int r;
    snprintf(id, sizeof(id), "rank %d", rank);
    st_log_set_role("worker", id);
    kern_set_threads(o->threads);

    r = mig_endpoint_new("127.0.0.1", 0, &ep);
    if (r < 0) {
        r = st_log_errno(r, "Cannot listen on loopback: %s", st_strerror(r));
        goto out;
    }
    char line[MIG_ADDR_MAX + 1];
    snprintf(line, sizeof(line), "%s\n", mig_endpoint_addr(ep));
    addrs = st_calloc((size_t)n, sizeof(*addrs));
    addrp = st_calloc((size_t)n, sizeof(*addrp));
    if (!addrs || !addrp) {
        r = -ENOMEM;
        goto out;
    }
    if ((r = write_all(fd_up, line, strlen(line))) < 0)
        goto out;
    for (int i = 0; i < n; i++) {
        if ((r = read_line(fd_down, addrs[i], sizeof(addrs[i]))) < 0) {
            r = st_log_errno(r, "Lost the parent before the peer list arrived");
            goto out;
        }
        addrp[i] = addrs[i];
    }
    r = mig_comm_new("tcp", ep, 1, rank, n, addrp, o->timeout, &comm);
    if (r < 0) {
        r = st_log_errno(r, "Cannot connect to the other workers: %s", st_strerror(r));
        goto out;
    }
    r = worker_engine_new(&run->cfg, &run->layout, stage, replica, comm, run->tokens, &e);
    if (r < 0) {
        r = st_log_errno(r, "Cannot create the engine: %s", st_strerror(r));
        goto out;
    }
    int report = stage == o->pp - 1 && replica == 0;
    double tokens_per_step = (double)run->cfg.global_batch * run->cfg.model.seq_len;
    for (int s = 0; s < o->steps; s++) {
        double t0 = st_now(), loss;
        r = worker_engine_step(e, (uint64_t)s, &loss);
        if (r < 0)
            goto out;
        if (report) {
            double dt = st_now() - t0;
            printf("step %d/%d loss %.4f tokens/s %.0f\n", s + 1, o->steps, loss,
                   dt > 0 ? tokens_per_step / dt : 0.0);
            fflush(stdout);
        }
    }
    if (o->save) {
        r = worker_engine_save(e, o->save, (uint64_t)o->steps);
        if (r < 0)
            goto out;
        if (stage == 0 && replica == 0) {
            printf("saved checkpoint %s (step %d)\n", o->save, o->steps);
            fflush(stdout);
        }
    }
out:
    worker_engine_free(e);
    mig_comm_free(comm);
    mig_endpoint_free(ep);
    st_free(addrs);
    st_free(addrp);
    return r < 0 ? 1 : 0;
}

/* ---- the parent ------------------------------------------------------------------------ */

static void describe_status(int status, char *buf, size_t size) {
    if (WIFSIGNALED(status))
        snprintf(buf, size, "killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(buf, size, "exited with status %d", WEXITSTATUS(status));
}

static int rank_of(const pid_t *pids, int n, pid_t pid) {
    for (int i = 0; i < n; i++)
        if (pids[i] == pid)
            return i;
    return -1;
}

/* Reaps every child. After the first failure the rest get `grace` seconds to notice on the
 * data plane and exit, then SIGKILL. Ranks that died by a signal are named first (they are
 * the cause), then those that exited with an error (usually because they lost that peer).
 * Returns the exit code of the command. */
static int reap_children(const struct train_run *run, pid_t *pids, int n, double grace) {
    int alive = 0, code = CLI_EXIT_OK, killed_by_us = 0;
    int status_of[TRAIN_MAX_LOCAL_RANKS], ours[TRAIN_MAX_LOCAL_RANKS];
    double deadline = 0;
    for (int i = 0; i < n; i++) {
        alive += pids[i] > 0;
        status_of[i] = 0;
        ours[i] = 0;
    }
    while (alive > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, deadline > 0 ? WNOHANG : 0);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0)
            break;
        if (pid == 0) {
            if (!killed_by_us && st_now() > deadline) {
                for (int i = 0; i < n; i++)
                    if (pids[i] > 0 && kill(pids[i], SIGKILL) == 0)
                        ours[i] = 1;
                killed_by_us = 1;
            }
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        int rank = rank_of(pids, n, pid);
        if (rank < 0)
            continue;
        pids[rank] = -1;
        alive--;
        status_of[rank] = status;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
            continue;
        if (code == CLI_EXIT_OK) {
            code = CLI_EXIT_FAILURE;
            deadline = st_now() + grace;
        }
    }
    for (int pass = 0; pass < 2 && code != CLI_EXIT_OK; pass++) {
        for (int i = 0; i < n; i++) {
            int st = status_of[i];
            if ((WIFEXITED(st) && WEXITSTATUS(st) == 0) || (pass == 0) != WIFSIGNALED(st))
                continue;
            char what[96];
            describe_status(st, what, sizeof(what));
            fprintf(stderr, "spottrain train: rank %d (stage %d, replica %d) %s%s\n", i,
                    i / run->o.dp, i % run->o.dp, what,
                    ours[i] ? " (stopped after the timeout)" : "");
        }
    }
    return code;
}

static int run_local(struct train_run *run) {
    const struct train_opts *o = &run->o;
    int n = o->dp * o->pp, code = CLI_EXIT_FAILURE;
    pid_t pids[TRAIN_MAX_LOCAL_RANKS];
    int up[TRAIN_MAX_LOCAL_RANKS], down[TRAIN_MAX_LOCAL_RANKS];
    char (*addrs)[MIG_ADDR_MAX] = st_calloc((size_t)n, sizeof(*addrs));
    if (!addrs) {
        fprintf(stderr, "spottrain train: out of memory\n");
        return CLI_EXIT_FAILURE;
    }
    for (int i = 0; i < n; i++)
        pids[i] = -1, up[i] = -1, down[i] = -1;
    signal(SIGPIPE, SIG_IGN); /* a child that died shows as EPIPE on its pipe, not a kill */
    fflush(stdout);
    fflush(stderr);
    int started = 0;
    for (int i = 0; i < n; i++) {
        int pu[2], pd[2];
        if (pipe(pu) < 0) {
            fprintf(stderr, "spottrain train: pipe: %s\n", strerror(errno));
            goto out;
        }
        if (pipe(pd) < 0) {
            fprintf(stderr, "spottrain train: pipe: %s\n", strerror(errno));
            close(pu[0]), close(pu[1]);
            goto out;
        }
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "spottrain train: fork: %s\n", strerror(errno));
            close(pu[0]), close(pu[1]), close(pd[0]), close(pd[1]);
            goto out;
        }
        if (pid == 0) {
            for (int j = 0; j < i; j++)
                close(up[j]), close(down[j]);
            close(pu[0]);
            close(pd[1]);
            int rc = child_main(run, i, pu[1], pd[0]);
            fflush(stdout);
            fflush(stderr);
            _exit(rc);
        }
        close(pu[1]);
        close(pd[0]);
        pids[i] = pid;
        up[i] = pu[0];
        down[i] = pd[1];
        started++;
    }
    /* Collect every address, then hand out the list. A child that dies first shows as EOF. */
    for (int i = 0; i < n; i++) {
        struct pollfd pfd = {.fd = up[i], .events = POLLIN};
        int pr = poll(&pfd, 1, (int)(o->timeout * 1000));
        if (pr <= 0 || read_line(up[i], addrs[i], sizeof(addrs[i])) < 0 || !addrs[i][0]) {
            fprintf(stderr, "spottrain train: rank %d did not report its address\n", i);
            goto out;
        }
    }
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) {
            char line[MIG_ADDR_MAX + 1];
            snprintf(line, sizeof(line), "%s\n", addrs[j]);
            if (write_all(down[i], line, strlen(line)) < 0)
                break; /* that child died; reaping reports it */
        }
        close(down[i]);
        down[i] = -1;
    }
    code = CLI_EXIT_OK;
out:
    if (code != CLI_EXIT_OK) /* setup failed: stop whoever started */
        for (int i = 0; i < n; i++)
            if (pids[i] > 0)
                kill(pids[i], SIGKILL);
    for (int i = 0; i < n; i++) {
        if (up[i] >= 0)
            close(up[i]);
        if (down[i] >= 0)
            close(down[i]);
    }
    if (started > 0) {
        int rc = reap_children(run, pids, n, o->timeout + 5.0);
        if (code == CLI_EXIT_OK)
            code = rc;
    }
    st_free(addrs);
    return code;
}

int cli_cmd_train(int argc, char **argv) {
    static const struct option longopts[] = {
        {"local", no_argument, NULL, 'l'},   {"dp", required_argument, NULL, 'd'},
        {"pp", required_argument, NULL, 'p'}, {"steps", required_argument, NULL, 's'},
        {"save", required_argument, NULL, 'o'}, {"threads", required_argument, NULL, 't'},
        {"timeout", required_argument, NULL, 'T'}, {NULL, 0, NULL, 0},
    };
    struct train_run run;
    memset(&run, 0, sizeof(run));
    struct train_opts *o = &run.o;
    o->dp = 1;
    o->pp = 1;
    o->steps = -1;
    o->timeout = 60.0;
    int local = 0, c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'l': local = 1; break;
        case 'd':
            if (parse_int("--dp", optarg, 1, TRAIN_MAX_LOCAL_RANKS, &o->dp) < 0)
                return CLI_EXIT_INPUT;
            break;
        case 'p':
            if (parse_int("--pp", optarg, 1, WORKER_MAX_STAGES, &o->pp) < 0)
                return CLI_EXIT_INPUT;
            break;
        case 's':
            if (parse_int("--steps", optarg, 1, 100000000, &o->steps) < 0)
                return CLI_EXIT_INPUT;
            break;
        case 't':
            if (parse_int("--threads", optarg, 1, 1024, &o->threads) < 0)
                return CLI_EXIT_INPUT;
            break;
        case 'o': o->save = optarg; break;
        case 'T':
            if (st_parse_duration(optarg, &o->timeout) < 0 || o->timeout <= 0)
                return cli_usage_error("train", "invalid --timeout '%s'", optarg);
            break;
        default:
            return cli_usage_error("train", "unknown or incomplete option '%s'",
                                   argv[optind - 1]);
        }
    }
    if (optind != argc - 1)
        return cli_usage_error("train", optind >= argc ? "missing JOB.yaml"
                                                       : "expected one JOB.yaml, got more");
    o->job = argv[optind];
    if (!local)
        return cli_usage_error("train", "only --local is supported (use 'spottrain run' for a "
                                        "fleet)");
    if (o->dp * o->pp > TRAIN_MAX_LOCAL_RANKS)
        return cli_usage_error("train", "--dp %d x --pp %d is more than %d local workers",
                               o->dp, o->pp, TRAIN_MAX_LOCAL_RANKS);
    if (o->threads != 1 && !getenv("OMP_WAIT_POLICY")) {
        /* OpenMP threads spinning after each parallel region starve Debian's pthread
         * OpenBLAS (a 20x slowdown measured with 2 threads); libgomp reads the policy only at
         * load time, so restart once with it set. On failure, carry on as we are. */
        char **args = st_calloc((size_t)argc + 2, sizeof(char *));
        if (args && setenv("OMP_WAIT_POLICY", "passive", 1) == 0) {
            args[0] = (char *)"spottrain";
            memcpy(args + 1, argv, (size_t)argc * sizeof(char *));
            fflush(stdout);
            fflush(stderr);
            execv("/proc/self/exe", args);
        }
        st_free(args);
    }

    struct st_spec spec;
    struct st_error errs[16];
    size_t nerrs = 0;
    int r = st_spec_load(o->job, &spec, errs, ST_ARRAY_SIZE(errs), &nerrs);
    if (r < 0) {
        for (size_t i = 0; i < ST_MIN(nerrs, ST_ARRAY_SIZE(errs)); i++) {
            char buf[1024];
            st_error_format(&errs[i], buf, sizeof(buf));
            fprintf(stderr, "%s\n", buf);
        }
        if (nerrs == 0)
            fprintf(stderr, "spottrain train: cannot load '%s': %s\n", o->job, st_strerror(r));
        return r == -ENOMEM ? CLI_EXIT_FAILURE : CLI_EXIT_INPUT; /* unreadable spec = input */
    }
    if (o->steps > 0)
        spec.training.steps = o->steps; /* as if the spec said so: the LR schedule follows */
    o->steps = spec.training.steps;
    if (worker_train_config_from_spec(&spec, &run.cfg) < 0) {
        fprintf(stderr, "spottrain train: '%s': the model or batch sizes are not trainable\n",
                o->job);
        return CLI_EXIT_INPUT;
    }
    if (spec.training.precision != ST_PRECISION_FP32)
        return cli_usage_error("train", "'%s': training.precision bf16 is not supported by the "
                                        "CPU engine (use fp32)", o->job);
    int nl = kern_num_layers(&run.cfg.model);
    if (o->pp > nl)
        return cli_usage_error("train", "--pp %d is more than the model's %d layers "
                                        "(embeddings, %d blocks, final norm)",
                               o->pp, nl, run.cfg.model.layers);
    if (run.cfg.global_batch % (o->dp * run.cfg.micro_batch) != 0)
        return cli_usage_error("train", "global_batch %d is not a multiple of dp %d x "
                                        "micro_batch %d", run.cfg.global_batch, o->dp,
                               run.cfg.micro_batch);
    uint32_t lo[WORKER_MAX_STAGES + 1];
    int stage_lo[WORKER_MAX_STAGES + 1];
    uint64_t *params = st_calloc((size_t)nl, sizeof(uint64_t));
    if (!params) {
        fprintf(stderr, "spottrain train: out of memory\n");
        return CLI_EXIT_FAILURE;
    }
    for (int l = 0; l < nl; l++)
        params[l] = kern_layer_param_count(&run.cfg.model, l);
    /* pp <= nl was checked, so the split and the layout cannot fail on input. */
    r = plan_stage_split((uint32_t)nl, params, (uint32_t)o->pp, lo);
    st_free(params);
    for (int s = 0; s <= o->pp && r >= 0; s++)
        stage_lo[s] = (int)lo[s];
    if (r < 0 || worker_layout_init(&run.layout, o->dp, o->pp, stage_lo, nl) < 0) {
        fprintf(stderr, "spottrain train: cannot split %d layers into %d stages\n", nl, o->pp);
        return CLI_EXIT_FAILURE;
    }
    if (o->threads == 0) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        o->threads = (int)ST_MAX(1, ncpu / (o->dp * o->pp));
    }
    /* The ranks fork from here: load OpenBLAS once, and say so now if its buffers cannot be
     * had (its allocator would retry for ever in every rank instead). */
    char blas_why[512];
    r = kern_blas_load(o->threads, blas_why, sizeof(blas_why));
    if (r < 0) {
        fprintf(stderr, "spottrain train: %s\n", blas_why);
        return CLI_EXIT_FAILURE;
    }

    /* A checkpoint store that refuses us is bad input, found before any step is trained. */
    r = o->save ? mig_ckpt_check_dest(o->save) : 0;
    if (r < 0) {
        fprintf(stderr, "spottrain train: cannot use --save '%s': %s\n", o->save,
                st_strerror(r));
        return r == -ENOMEM ? CLI_EXIT_FAILURE : CLI_EXIT_INPUT;
    }
    int code = cli_ensure_data("train", &spec, false);
    if (code != 0)
        return code;
    struct st_error terr;
    memset(&terr, 0, sizeof(terr));
    r = st_tokens_open(spec.data.train, run.cfg.model.vocab, &run.tokens, &terr);
    if (r < 0) {
        char buf[1024];
        st_error_format(&terr, buf, sizeof(buf));
        fprintf(stderr, "spottrain train: cannot use data '%s': %s\n", spec.data.train,
                terr.message[0] ? buf : st_strerror(r));
        return r == -ENOMEM ? CLI_EXIT_FAILURE : CLI_EXIT_INPUT;
    }
    if (run.tokens->ntokens <= (uint64_t)run.cfg.model.seq_len) {
        fprintf(stderr, "spottrain train: data '%s' is shorter than seq_len + 1 tokens\n",
                spec.data.train);
        st_tokens_free(run.tokens);
        return CLI_EXIT_INPUT;
    }
    fprintf(stderr, "spottrain train: %s, dp %d x pp %d, %d micro-batches of %d per replica, "
                    "stages", o->job, o->dp, o->pp,
            run.cfg.global_batch / (o->dp * run.cfg.micro_batch), run.cfg.micro_batch);
    for (int s = 0; s < o->pp; s++)
        fprintf(stderr, " [%d,%d)", stage_lo[s], stage_lo[s + 1]);
    fprintf(stderr, "\n");
    code = run_local(&run);
    st_tokens_free(run.tokens);
    return code;
}
