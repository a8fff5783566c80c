/* cmd-worker.c: `spottrain worker --coordinator ADDR ...` — run a worker's control-plane agent.
 *
 * One idea: the command is only glue — worker id from the state directory, token from a file,
 * and a command handler — around worker/agent.c, which does the talking and reconnecting.
 * With --job it trains (cli_worker_job_main, worker/runner.c); without, its handler applies a
 * command by printing it as one parseable line (`worker command id=N epoch=E kind=K ...`) and
 * acknowledging it, a control-plane-only worker for tests and debugging. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "coordinator.h" /* coord_token_read */
#include "run-worker.h"  /* cli_worker_job_main: --job */
#include "worker.h"      /* worker_agent_* */

static int print_command(struct worker_agent *a, const Spottrain__V1__Command *cmd, char *err,
                         size_t errsz, void *userdata) {
    (void)a;
    (void)err;
    (void)errsz;
    (void)userdata;
    unsigned long long id = (unsigned long long)cmd->id, ep = (unsigned long long)cmd->epoch;
    switch (cmd->body_case) {
    case SPOTTRAIN__V1__COMMAND__BODY_CONFIGURE: {
        const Spottrain__V1__Configure *c = cmd->configure;
        printf("worker command id=%llu epoch=%llu kind=configure dp=%u pp=%u stage=%u "
               "replica=%u layers=%u-%u peers=%zu rendezvous=%s\n",
               id, ep, c->shape ? c->shape->dp : 0, c->shape ? c->shape->pp : 0, c->stage,
               c->replica, c->layer_begin, c->layer_end, c->n_peers, c->rendezvous);
        break;
    }
    case SPOTTRAIN__V1__COMMAND__BODY_MIGRATE:
        printf("worker command id=%llu epoch=%llu kind=migrate transfers=%zu at_step=%llu\n", id,
               ep, cmd->migrate->n_transfers, (unsigned long long)cmd->migrate->at_step);
        break;
    case SPOTTRAIN__V1__COMMAND__BODY_CHECKPOINT:
        printf("worker command id=%llu epoch=%llu kind=checkpoint dir=%s\n", id, ep,
               cmd->checkpoint->dir);
        break;
    case SPOTTRAIN__V1__COMMAND__BODY_STOP:
        printf("worker command id=%llu epoch=%llu kind=stop reason=%s\n", id, ep,
               cmd->stop->reason);
        break;
    default:
        printf("worker command id=%llu epoch=%llu kind=unknown\n", id, ep);
        break;
    }
    fflush(stdout);
    return 0;
}

/* See run-worker.h. */
int cli__worker_agent_flag(struct worker_agent_config *a, int opt, const char *v,
                           const char **ret_token_file, const char **ret_want_id) {
    switch (opt) {
    case 'c':
        if (!*v || strlen(v) >= sizeof(a->coordinator) || !strchr(v, ':')) {
            cli_usage_error("worker", "bad --coordinator '%s' (want HOST:PORT)", v);
            return -EINVAL;
        }
        snprintf(a->coordinator, sizeof(a->coordinator), "%s", v);
        return 0;
    case 't':
        *ret_token_file = v;
        return 0;
    case 'i':
        if (!st_uuid_valid(v)) {
            cli_usage_error("worker", "--id '%s' is not a UUID", v);
            return -EINVAL;
        }
        *ret_want_id = v;
        return 0;
    case 'd':
        if (strlen(v) >= sizeof(a->state_dir)) {
            cli_usage_error("worker", "--state-dir is too long");
            return -EINVAL;
        }
        snprintf(a->state_dir, sizeof(a->state_dir), "%s", v);
        return 0;
    case 'J':
        if (!st_uuid_valid(v)) {
            cli_usage_error("worker", "--job-id '%s' is not a UUID", v);
            return -EINVAL;
        }
        snprintf(a->job_id, sizeof(a->job_id), "%s", v);
        return 0;
    default:
        return 1;
    }
}

/* See run-worker.h. */
int cli__worker_agent_check(const struct worker_agent_config *a, bool job_missing) {
    if (!a->coordinator[0])
        return cli_usage_error("worker", "--coordinator HOST:PORT is required");
    if (job_missing)
        return cli_usage_error("worker", "--job JOB.yaml is required to train");
    if (!a->tls_cert[0] != !a->tls_key[0])
        return cli_usage_error("worker", "--tls-cert and --tls-key go together");
    if (a->tls_cert[0] && !a->tls_ca[0])
        return cli_usage_error("worker", "--tls-cert needs --tls-ca (the coordinator's CA)");
    return CLI_EXIT_OK;
}

/* See run-worker.h. */
int cli__worker_agent_identity(struct worker_agent_config *a, const char *token_file,
                               const char *want_id) {
    if (token_file) {
        char why[512];
        if (coord_token_read(token_file, a->token, sizeof(a->token), why, sizeof(why)) < 0) {
            fprintf(stderr, "spottrain worker: %s\n", why);
            return CLI_EXIT_INPUT;
        }
    }
    int r = worker_agent_id_load(a->state_dir, want_id, a->id);
    if (r < 0) {
        fprintf(stderr, "spottrain worker: cannot load or save the worker id in '%s': %s\n",
                a->state_dir, st_strerror(r));
        return r == -EINVAL ? CLI_EXIT_INPUT : CLI_EXIT_FAILURE;
    }
    st_log_set_role("worker", a->id);
    return CLI_EXIT_OK;
}

/* SPOTTRAIN_PARENT_PID=PID, set by the sim fleet (cloud/sim.c): the worker dies with the
 * process that started it, so a `spottrain run` killed with SIGKILL leaves no workers behind
 * retrying its dead coordinator (the sim SIGKILLs them when it ends normally too). The
 * kernel's parent-death signal follows the *thread* that spawned us; the sim spawns from the
 * job's main thread, which lives as long as the job. A parent gone before the signal was
 * armed is caught by the check after it; a parent that is not PID (a wrapper the spawn
 * callback put in between) is fine while PID lives, and the signal then follows the wrapper.
 * Returns CLI_EXIT_OK, CLI_EXIT_INPUT for a malformed value, CLI_EXIT_FAILURE for a parent
 * already gone. */
static int die_with_parent(void) {
    const char *v = getenv("SPOTTRAIN_PARENT_PID");
    if (!v)
        return CLI_EXIT_OK;
    char *end;
    errno = 0;
    long pid = strtol(v, &end, 10);
    if (errno || end == v || *end || pid <= 1 || pid > INT_MAX)
        return cli_usage_error("worker", "invalid SPOTTRAIN_PARENT_PID '%s': not a process id",
                               v);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        st_log(ST_LOG_WARN, "worker", "cannot die with my parent (pid %ld): %s", pid,
               st_strerror(-errno));
    if (getppid() != (pid_t)pid && kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
        fprintf(stderr, "spottrain worker: the process that started me (pid %ld) is gone\n",
                pid);
        return CLI_EXIT_FAILURE;
    }
    return CLI_EXIT_OK;
}

int cli_cmd_worker(int argc, char **argv) {
    static const struct option opts[] = {
        CLI_WORKER_AGENT_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    struct worker_agent_config cfg;
    const char *token_file = NULL, *want_id = NULL;
    int opt;

    int dr = die_with_parent();
    if (dr != CLI_EXIT_OK)
        return dr;
    /* With --job the worker trains (worker/runner.c); without, it only talks (this file). */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--job") || !strncmp(argv[i], "--job=", 6))
            return cli_worker_job_main(argc, argv);
    worker_agent_config_init(&cfg);
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        const char *v = optarg;
        int r = cli__worker_agent_flag(&cfg, opt, v, &token_file, &want_id);
        if (r < 0)
            return CLI_EXIT_INPUT;
        if (r == 0)
            continue;
        switch (opt) {
        case 'a':
            if (strlen(v) >= sizeof(cfg.data_addr) || !strchr(v, ':'))
                return cli_usage_error("worker", "bad --data-addr '%s' (want HOST:PORT)", v);
            snprintf(cfg.data_addr, sizeof(cfg.data_addr), "%s", v);
            break;
        case 'z':
            if (strlen(v) >= sizeof(cfg.zone))
                return cli_usage_error("worker", "--zone is too long");
            snprintf(cfg.zone, sizeof(cfg.zone), "%s", v);
            break;
        case 'I':
            if (strlen(v) >= sizeof(cfg.instance_id))
                return cli_usage_error("worker", "--instance-id is too long");
            snprintf(cfg.instance_id, sizeof(cfg.instance_id), "%s", v);
            break;
        case 'T':
            if (strlen(v) >= sizeof(cfg.instance_type))
                return cli_usage_error("worker", "--instance-type is too long");
            snprintf(cfg.instance_type, sizeof(cfg.instance_type), "%s", v);
            break;
        case 'g': {
            char *end = NULL;
            long g = strtol(v, &end, 10);
            if (!*v || *end || g < 0 || g > 1024)
                return cli_usage_error("worker", "bad --gpus '%s' (0..1024)", v);
            cfg.gpus = (int)g;
            break;
        }
        case 'A':
        case 'C':
        case 'K': {
            char *dst = opt == 'A' ? cfg.tls_ca : opt == 'C' ? cfg.tls_cert : cfg.tls_key;
            const char *flag = opt == 'A' ? "--tls-ca" : opt == 'C' ? "--tls-cert" : "--tls-key";
            if (!*v || strlen(v) >= sizeof(cfg.tls_ca))
                return cli_usage_error("worker", "bad %s '%s'", flag, v);
            if (access(v, R_OK) < 0)
                return cli_usage_error("worker", "cannot read %s '%s': %s", flag, v,
                                       st_strerror(-errno));
            snprintf(dst, sizeof(cfg.tls_ca), "%s", v);
            break;
        }
        default:
            return cli_usage_error("worker", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("worker", "unexpected argument '%s'", argv[optind]);
    int r = cli__worker_agent_check(&cfg, false);
    if (r == CLI_EXIT_OK)
        r = cli__worker_agent_identity(&cfg, token_file, want_id);
    if (r != CLI_EXIT_OK)
        return r;

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct worker_agent_ops ops = {print_command, NULL};
    struct worker_agent *a = NULL;
    r = worker_agent_new(&cfg, &ops, &a);
    if (r < 0) {
        fprintf(stderr, "spottrain worker: bad configuration: %s\n", st_strerror(r));
        return CLI_EXIT_INPUT;
    }
    printf("worker id=%s coordinator=%s%s\n", cfg.id, cfg.coordinator,
           cfg.tls_ca[0] ? " tls=on" : "");
    fflush(stdout);
    r = worker_agent_start(a);
    int ret = CLI_EXIT_FAILURE;
    if (r < 0) {
        fprintf(stderr, "spottrain worker: cannot start: %s\n", st_strerror(r));
        goto out;
    }
    /* Wait for a signal, a Stop, or a fatal refusal, whichever comes first. */
    struct timespec tick = {0, 200 * 1000 * 1000};
    for (;;) {
        int sig = sigtimedwait(&set, NULL, &tick);
        if (sig == SIGTERM || sig == SIGINT) {
            ret = CLI_EXIT_OK;
            printf("worker stopped by signal %d\n", sig);
            break;
        }
        r = worker_agent_wait(a, 0);
        if (r == 1) {
            ret = CLI_EXIT_OK;
            printf("worker stopped by the coordinator\n");
            break;
        }
        if (r < 0) {
            fprintf(stderr, "spottrain worker: %s\n",
                    r == -EACCES ? "the coordinator rejected the token (wrong or missing "
                                   "--token-file)"
                                 : st_strerror(r));
            ret = CLI_EXIT_FAILURE;
            break;
        }
    }
    fflush(stdout);
out:
    worker_agent_free(a);
    return ret;
}
