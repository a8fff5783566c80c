/* cmd-coordinator.c: `spottrain coordinator --job JOB.yaml ...` — run a job's coordinator.
 *
 * One idea: signals are blocked before any thread starts and taken synchronously with
 * sigwait() on the main thread, so SIGTERM leads to the ordinary shutdown path (streams ended,
 * gRPC drained, journal flushed) instead of running code in a signal handler. The bound
 * addresses are printed in one parseable line because port 0 picks free ports. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "coord-loop.h"  /* coord_loop_parse_forced: --shapes */
#include "coordinator.h" /* coord_new, coord_start */
#include "coordinator-train.h" /* --train */

int cli_cmd_coordinator(int argc, char **argv) {
    static const struct option opts[] = {
        {"job", required_argument, NULL, 'j'},
        {"listen", required_argument, NULL, 'l'},
        {"status-listen", required_argument, NULL, 's'},
        {"token-file", required_argument, NULL, 't'},
        {"state-dir", required_argument, NULL, 'd'},
        {"heartbeat-deadline", required_argument, NULL, 'H'},
        {"tls-cert", required_argument, NULL, 'C'},
        {"tls-key", required_argument, NULL, 'K'},
        {"tls-client-ca", required_argument, NULL, 'A'},
        {"train", no_argument, NULL, 'R'},
        {"save", required_argument, NULL, 'S'},
        {"kubeconfig", required_argument, NULL, 'k'},
        {"shapes", required_argument, NULL, 'P'},
        {NULL, 0, NULL, 0},
    };
    const char *tls[3] = {NULL, NULL, NULL}; /* cert, key, client CA */
    const char *job = NULL, *listen = NULL, *status_listen = NULL, *token_file = NULL,
               *state_dir = NULL;
    double deadline = 0;
    int opt;
    bool train = false;      /* --train: the planning loop drives the job (coordinator-train.c) */
    const char *save = NULL; /* --save DIR: final checkpoint (with --train) */
    const char *kubeconfig = NULL; /* --kubeconfig F: the kubernetes provider's API server */
    const char *shapes = NULL;     /* --shapes STEP:DPxPP,...: forced shapes (with --train) */

    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'j': job = optarg; break;
        case 'l': listen = optarg; break;
        case 's': status_listen = optarg; break;
        case 't': token_file = optarg; break;
        case 'd': state_dir = optarg; break;
        case 'C': tls[0] = optarg; break;
        case 'K': tls[1] = optarg; break;
        case 'A': tls[2] = optarg; break;
        case 'R': train = true; break;
        case 'S': save = optarg; break;
        case 'k': kubeconfig = optarg; break;
        case 'P': {
            struct coord_loop_forced f[COORD_LOOP_MAX_FORCED];
            if (coord_loop_parse_forced(optarg, f, COORD_LOOP_MAX_FORCED) < 0)
                return cli_usage_error("coordinator", "invalid --shapes '%s' (want "
                                       "STEP:DPxPP,... with increasing steps)", optarg);
            shapes = optarg;
            break;
        }
        case 'H':
            if (st_parse_duration(optarg, &deadline) < 0 || deadline <= 0)
                return cli_usage_error("coordinator", "bad --heartbeat-deadline '%s'", optarg);
            break;
        default:
            return cli_usage_error("coordinator", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("coordinator", "unexpected argument '%s'", argv[optind]);
    if (save && !train)
        return cli_usage_error("coordinator", "--save needs --train");
    if (kubeconfig && !train)
        return cli_usage_error("coordinator", "--kubeconfig needs --train");
    if (shapes && !train)
        return cli_usage_error("coordinator", "--shapes needs --train");
    if (!job)
        return cli_usage_error("coordinator", "--job JOB.yaml is required");
    if (!tls[0] != !tls[1])
        return cli_usage_error("coordinator", "--tls-cert and --tls-key go together");
    static const char *const tls_flag[3] = {"--tls-cert", "--tls-key", "--tls-client-ca"};
    for (int i = 0; i < 3; i++) {
        if (tls[i] && (!tls[i][0] || strlen(tls[i]) >= ST_SPEC_PATH_MAX))
            return cli_usage_error("coordinator", "bad %s '%s'", tls_flag[i], tls[i]);
        if (tls[i] && access(tls[i], R_OK) < 0)
            return cli_usage_error("coordinator", "cannot read %s '%s': %s", tls_flag[i],
                                   tls[i], st_strerror(-errno));
    }

    struct st_spec *spec = st_calloc(1, sizeof(*spec));
    struct coord *c = NULL;
    int ret = CLI_EXIT_FAILURE;
    if (!spec) {
        fprintf(stderr, "spottrain coordinator: out of memory\n");
        goto out;
    }
    int r = cli_spec_load("coordinator", job, spec);
    if (r != CLI_EXIT_OK) {
        ret = r;
        goto out;
    }

    struct coord_config cfg;
    coord_config_init(&cfg);
    cfg.spec = spec;
    cfg.heartbeat_deadline = deadline;
    if (tls[0]) {
        snprintf(cfg.tls_cert, sizeof(cfg.tls_cert), "%s", tls[0]);
        snprintf(cfg.tls_key, sizeof(cfg.tls_key), "%s", tls[1]);
    }
    if (tls[2])
        snprintf(cfg.tls_client_ca, sizeof(cfg.tls_client_ca), "%s", tls[2]);
    if (listen)
        snprintf(cfg.listen, sizeof(cfg.listen), "%s", listen);
    if (status_listen)
        snprintf(cfg.status_listen, sizeof(cfg.status_listen), "%s",
                 status_listen[0] ? status_listen : "-");
    if (!token_file && spec->status.token_file[0])
        token_file = spec->status.token_file;
    if (token_file) {
        char why[512];
        if (coord_token_read(token_file, cfg.token, sizeof(cfg.token), why, sizeof(why)) < 0) {
            fprintf(stderr, "spottrain coordinator: %s\n", why);
            ret = CLI_EXIT_INPUT;
            goto out;
        }
    } else {
        st_log(ST_LOG_WARN, "coord", "No token file: every caller is trusted (set "
               "spec.status.token_file or --token-file)");
    }
    if (state_dir)
        snprintf(cfg.state_dir, sizeof(cfg.state_dir), "%s", state_dir);
    else
        snprintf(cfg.state_dir, sizeof(cfg.state_dir), "spottrain-state/%s", spec->name);

    st_log_set_role("coordinator", spec->name);
    signal(SIGPIPE, SIG_IGN);
    if (train) {
        /* The job driver ticks on this thread; a signal only raises its stop flag. */
        ret = cli_coordinator_train(&cfg, spec, save, kubeconfig, shapes);
        goto out;
    }
    /* Block before any thread exists so every thread inherits the mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    r = coord_new(&cfg, NULL, &c);
    if (r < 0) {
        fprintf(stderr, "spottrain coordinator: cannot set up the job (TLS files, state in "
                "'%s'): %s\n", cfg.state_dir, st_strerror(r));
        ret = r == -EINVAL || r == -EEXIST || r == -EPROTO || r == -ENOTDIR || r == -EACCES ||
                      r == -EROFS
                  ? CLI_EXIT_INPUT
                  : CLI_EXIT_FAILURE;
        goto out;
    }
    r = coord_start(c);
    if (r < 0) {
        fprintf(stderr, "spottrain coordinator: cannot listen: %s\n", st_strerror(r));
        ret = r == -EINVAL ? CLI_EXIT_INPUT : CLI_EXIT_FAILURE;
        goto out;
    }
    char job_id[ST_UUID_STR_LEN];
    uint64_t epoch = 0;
    coord_job_get(c, job_id, &epoch, NULL, NULL, NULL, NULL);
    printf("coordinator listening grpc=%s rest=%s job=%s epoch=%llu state=%s\n",
           coord_grpc_addr(c), coord_rest_addr(c)[0] ? coord_rest_addr(c) : "-", job_id,
           (unsigned long long)epoch, cfg.state_dir);
    fflush(stdout);

    int sig = 0;
    while (sigwait(&set, &sig) == 0 && sig == SIGHUP)
        ; /* SIGHUP: ignored (no config reload yet) */
    st_log(ST_LOG_NOTICE, "coord", "Signal %d: shutting down", sig);
    coord_shutdown(c);
    printf("coordinator stopped\n");
    fflush(stdout);
    ret = CLI_EXIT_OK;
out:
    coord_free(c);
    st_free(spec);
    return ret;
}
