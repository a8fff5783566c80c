/* run-worker.c: `spottrain worker --job JOB.yaml ...` — a training worker under a coordinator.
 *
 * One idea: glue only. The flags become a worker_runner_config (worker/runner.c does the
 * work), and the cloud's interruption notice is polled with cloud/'s notice clients — the same
 * libcurl code that runs on the clouds. `--cloud gcp|azure` (the gcp and azure bootstraps pass
 * it) picks that cloud's metadata client at its default or environment endpoint
 * (GCE_METADATA_HOST, AZURE_POD_IDENTITY_AUTHORITY_HOST); without it, the IMDSv2 client is used
 * only when AWS_EC2_METADATA_SERVICE_ENDPOINT is set (the sim provider and the aws tests set it
 * for every instance). On Azure the worker acknowledges its Scheduled Event once its state has
 * left. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cloud.h"
#include "common.h"
#include "coordinator.h" /* coord_token_read */
#include "kernels.h"     /* kern_blas_load */
#include "migrate.h"     /* the chaos suite's hooks: ENOSPC, a cut data plane */
#include "run-worker.h"
#include "worker.h"
#include "worker-runner.h"

/* The event id it fills is the one state_left acknowledges. */
static int poll_imds(struct cloud_notice_client *c, char *event_id, size_t idsz, char *kind,
                     size_t kindsz, double *ret_at) {
    struct cloud_notice n;
    int r = cloud_notice_client_poll(c, &n);
    if (r <= 0)
        return r;
    if (n.kind != CLOUD_NOTICE_TERMINATE && n.kind != CLOUD_NOTICE_STOP &&
        n.kind != CLOUD_NOTICE_HIBERNATE)
        return 0;
    snprintf(kind, kindsz, "terminate");
    snprintf(event_id, idsz, "%s", n.event_id);
    *ret_at = n.time;
    return 1;
}

/* SIGTERM in a pod: the kubelet's grace period has begun (the pod is being evicted, its spot
 * node preempted). It is a notice like the cloud's: the worker keeps training, the coordinator
 * moves its state away and then stops it ("leave now, the state moves"). Only when
 * SPOTTRAIN_NOTICE_SECONDS says how long the grace is (the kubernetes provider sets it in every
 * worker pod); elsewhere SIGTERM keeps its default meaning. */
static volatile sig_atomic_t term_seen;

static void on_term(int sig) {
    (void)sig;
    term_seen = 1;
}

struct notice_sources {
    struct cloud_notice_client *imds; /* NULL = none */
    double grace;                     /* seconds from SIGTERM to SIGKILL; < 0 = not a notice */
    char event_id[CLOUD_NAME_MAX];    /* the notice's event (Azure), "" = none */
};

static int poll_notices(void *userdata, char *kind, size_t kindsz, double *ret_at) {
    struct notice_sources *n = userdata;
    if (n->grace >= 0 && term_seen) {
        snprintf(kind, kindsz, "terminate");
        *ret_at = st_wall() + n->grace;
        return 1;
    }
    return n->imds ? poll_imds(n->imds, n->event_id, sizeof(n->event_id), kind, kindsz, ret_at)
                   : 0;
}

/* The runner's state_left: our state has moved away after the notice, so the cloud need not
 * wait for the event's NotBefore. A failed acknowledgement only costs that wait. */
static void ack_notice(void *userdata) {
    struct notice_sources *n = userdata;
    if (!n->imds || !n->event_id[0])
        return;
    int r = cloud_notice_client_ack(n->imds, n->event_id);
    if (r == -EOPNOTSUPP)
        return;
    if (r < 0)
        st_log(ST_LOG_WARN, "worker", "Cannot acknowledge event '%s': %s, ignoring", n->event_id,
               st_strerror(r));
    else
        st_log(ST_LOG_NOTICE, "worker", "State left: acknowledged event '%s'", n->event_id);
}

/* The count N of a test fault from environment variable name into *ret, -1 when it is unset or
 * empty. Prints "spottrain worker: invalid NAME 'VALUE'" and returns -EINVAL when it is not a
 * whole number >= 0. */
static int fault_count(const char *name, long *ret) {
    const char *v = getenv(name);
    if (!v || !v[0]) {
        *ret = -1;
        return 0;
    }
    char *e;
    long n = strtol(v, &e, 10);
    if (*e || n < 0) {
        fprintf(stderr, "spottrain worker: invalid %s '%s'\n", name, v);
        return -EINVAL;
    }
    *ret = n;
    return 0;
}

/* A number of seconds from the environment, at most max: 0 and *ret set, or 0 and *ret
 * untouched when unset; -EINVAL (said on stderr) when malformed, negative or above max. */
static int env_seconds(const char *name, double max, double *ret) {
    const char *v = getenv(name);
    if (!v || !v[0])
        return 0;
    char *e;
    double x = strtod(v, &e);
    if (*e || !(x >= 0) || x > max) {
        fprintf(stderr, "spottrain worker: invalid %s '%s'\n", name, v);
        return -EINVAL;
    }
    *ret = x;
    return 0;
}

static int parse_int(const char *flag, const char *s, int lo, int hi, int *ret) {
    char *e;
    long v = strtol(s, &e, 10);
    if (!*s || *e || v < lo || v > hi)
        return cli_usage_error("worker", "invalid %s '%s' (expected %d..%d)", flag, s, lo, hi);
    *ret = (int)v;
    return 0;
}

/* See run-worker.h. */
int cli_worker_job_main(int argc, char **argv) {
    static const struct option opts[] = {
        CLI_WORKER_AGENT_OPTIONS,
        {"advertise-data-addr", required_argument, NULL, 'D'},
        {"job", required_argument, NULL, 'j'},
        {"steps", required_argument, NULL, 's'},
        {"threads", required_argument, NULL, 'k'},
        {"timeout", required_argument, NULL, 'o'},
        {"cloud", required_argument, NULL, 'L'},
        {NULL, 0, NULL, 0},
    };
    struct worker_runner_config *cfg = st_calloc(1, sizeof(*cfg));
    struct cloud_notice_client *nc = NULL;
    const char *token_file = NULL, *want_id = NULL, *job = NULL, *cloud = NULL;
    int opt, ret = CLI_EXIT_INPUT;

    if (!cfg) {
        fprintf(stderr, "spottrain worker: out of memory\n");
        return CLI_EXIT_FAILURE;
    }
    worker_runner_config_init(cfg);
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        const char *v = optarg;
        int r = cli__worker_agent_flag(&cfg->agent, opt, v, &token_file, &want_id);
        if (r < 0)
            goto out;
        if (r == 0)
            continue;
        switch (opt) {
        case 'a': {
            const char *colon = strrchr(v, ':');
            char *e;
            long port = colon ? strtol(colon + 1, &e, 10) : -1;
            if (!colon || colon == v || (size_t)(colon - v) >= sizeof(cfg->bind_host) ||
                !colon[1] || *e || port < 0 || port > 65535) {
                cli_usage_error("worker", "bad --data-addr '%s' (want HOST:PORT)", v);
                goto out;
            }
            snprintf(cfg->bind_host, sizeof(cfg->bind_host), "%.*s", (int)(colon - v), v);
            cfg->port = (int)port;
            break;
        }
        case 'D': {
            /* The address peers should dial, when it is not the one we listen on: behind a
             * NAT, a port forward or a proxy (the man-in-the-middle test puts one there). */
            const char *colon = strrchr(v, ':');
            char *e;
            long port = colon ? strtol(colon + 1, &e, 10) : -1;
            if (!colon || colon == v || strlen(v) >= sizeof(cfg->advertise_addr) ||
                !colon[1] || *e || port < 1 || port > 65535) {
                cli_usage_error("worker", "bad --advertise-data-addr '%s' (want HOST:PORT)", v);
                goto out;
            }
            snprintf(cfg->advertise_addr, sizeof(cfg->advertise_addr), "%s", v);
            break;
        }
        case 'z':
            snprintf(cfg->agent.zone, sizeof(cfg->agent.zone), "%s", v);
            break;
        case 'I':
            snprintf(cfg->agent.instance_id, sizeof(cfg->agent.instance_id), "%s", v);
            break;
        case 'T':
            snprintf(cfg->agent.instance_type, sizeof(cfg->agent.instance_type), "%s", v);
            break;
        case 'g':
            if (parse_int("--gpus", v, 0, 1024, &cfg->agent.gpus) != 0)
                goto out;
            break;
        case 'j': job = v; break;
        case 'L':
            if (strcmp(v, "aws") && strcmp(v, "gcp") && strcmp(v, "azure")) {
                cli_usage_error("worker", "bad --cloud '%s' (aws, gcp or azure)", v);
                goto out;
            }
            cloud = v;
            break;
        case 's':
            if (parse_int("--steps", v, 1, 100000000, &cfg->steps) != 0)
                goto out;
            break;
        case 'k':
            if (parse_int("--threads", v, 1, 1024, &cfg->threads) != 0)
                goto out;
            break;
        case 'o':
            if (st_parse_duration(v, &cfg->timeout) < 0 || cfg->timeout <= 0) {
                cli_usage_error("worker", "invalid --timeout '%s'", v);
                goto out;
            }
            break;
        case 'A':
        case 'C':
        case 'K': {
            char *dst = opt == 'A' ? cfg->agent.tls_ca : opt == 'C' ? cfg->agent.tls_cert
                                                                     : cfg->agent.tls_key;
            if (!*v || strlen(v) >= sizeof(cfg->agent.tls_ca)) {
                cli_usage_error("worker", "bad TLS file name '%s'", v);
                goto out;
            }
            snprintf(dst, sizeof(cfg->agent.tls_ca), "%s", v);
            break;
        }
        default:
            cli_usage_error("worker", "unknown option '%s'", argv[optind - 1]);
            goto out;
        }
    }
    if (optind < argc) {
        cli_usage_error("worker", "unexpected argument '%s'", argv[optind]);
        goto out;
    }
    if ((ret = cli__worker_agent_check(&cfg->agent, !job)) != CLI_EXIT_OK)
        goto out;
    struct st_error errs[8];
    size_t nerrs = 0;
    int r = st_spec_load(job, &cfg->spec, errs, ST_ARRAY_SIZE(errs), &nerrs);
    if (r < 0) {
        for (size_t i = 0; i < ST_MIN(nerrs, ST_ARRAY_SIZE(errs)); i++) {
            char buf[1024];
            st_error_format(&errs[i], buf, sizeof(buf));
            fprintf(stderr, "%s\n", buf);
        }
        if (nerrs == 0)
            fprintf(stderr, "spottrain worker: cannot load '%s': %s\n", job, st_strerror(r));
        ret = r == -EINVAL || r == -ENOENT ? CLI_EXIT_INPUT : CLI_EXIT_FAILURE;
        goto out;
    }
    /* A migration's order and an early handshake may wait longer than the coordinator lets
     * a reconfiguration go without progress: it, not the worker, decides that one failed. */
    cfg->reconfig_timeout = ST_MAX(60.0, 2.0 * cfg->spec.coordinator.reconfig_timeout);
    if ((ret = cli__worker_agent_identity(&cfg->agent, token_file, want_id)) != CLI_EXIT_OK)
        goto out;
    ret = CLI_EXIT_INPUT;
    signal(SIGPIPE, SIG_IGN);
    struct notice_sources ns = {.imds = NULL, .grace = -1};
    if (env_seconds("SPOTTRAIN_NOTICE_SECONDS", 86400, &ns.grace) < 0)
        goto out; /* ret is CLI_EXIT_INPUT */
    if (ns.grace >= 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_term;
        sigaction(SIGTERM, &sa, NULL);
        cfg->poll_notice = poll_notices;
        cfg->notice_userdata = &ns;
    }
    /* Tests: hold this worker at a migration's boundary (a spare then arrives that much
     * earlier than the others, as it does ahead of slow steps). */
    if (env_seconds("SPOTTRAIN_TEST_BOUNDARY_DELAY", 3600, &cfg->boundary_delay) < 0)
        goto out;
    /* Tests: the tied copies of wte move late after a migration's boundary. */
    if (env_seconds("SPOTTRAIN_TEST_TIED_DELAY", 60, &cfg->tied_delay) < 0)
        goto out;
    /* Tests: this worker's step N hangs (it keeps reporting) until the coordinator moves on. */
    long stall;
    if (fault_count("SPOTTRAIN_TEST_STALL_STEP", &stall) < 0) {
        ret = CLI_EXIT_INPUT;
        goto out;
    }
    if (stall > 0)
        cfg->stall_step = (uint64_t)stall;
    /* Tests: a noticed worker is gone the moment its state has left (an acknowledged VM). */
    long killed;
    if (fault_count("SPOTTRAIN_TEST_LEAVE_KILLED", &killed) < 0) {
        ret = CLI_EXIT_INPUT;
        goto out;
    }
    cfg->leave_killed = killed > 0;
    /* Benches: the state after a migration's boundary shares the communicator (no move
     * channel), to measure what the channel buys. */
    long shared;
    if (fault_count("SPOTTRAIN_TEST_SHARED_MOVE", &shared) < 0) {
        ret = CLI_EXIT_INPUT;
        goto out;
    }
    cfg->shared_move = shared > 0;
    /* Benches: a live migration's comms are built at its boundary, not ahead of it, to
     * measure what building them ahead buys. */
    long at_boundary;
    if (fault_count("SPOTTRAIN_TEST_CONNECT_AT_BOUNDARY", &at_boundary) < 0) {
        ret = CLI_EXIT_INPUT;
        goto out;
    }
    cfg->connect_at_boundary = at_boundary > 0;
    /* Tests: a peer late at the boundary. Only the worker on this node (SPOTTRAIN_NODE, which
     * the sim sets) is held there (SPOTTRAIN_TEST_BOUNDARY_DELAY), and it builds its comms
     * there rather than ahead, so the others' builds ahead wait for its handshake. */
    const char *late = getenv("SPOTTRAIN_TEST_LATE_NODE");
    if (late && *late) {
        const char *node = getenv("SPOTTRAIN_NODE");
        if (node && !strcmp(node, late))
            cfg->connect_at_boundary = true;
        else
            cfg->boundary_delay = 0;
    }
    /* Faults for scripts/chaos and the tests: this worker's Nth checkpoint layer write fails
     * with ENOSPC; its Nth sending migration transfer, or its Nth peer-copy exchange, is cut
     * mid-message. */
    long enospc, cut, pcut, mcut;
    if (fault_count("SPOTTRAIN_TEST_CKPT_ENOSPC", &enospc) < 0 ||
        fault_count("SPOTTRAIN_TEST_DATA_CUT", &cut) < 0 ||
        fault_count("SPOTTRAIN_TEST_PEER_CUT", &pcut) < 0 ||
        fault_count("SPOTTRAIN_TEST_MOVE_CUT", &mcut) < 0) {
        ret = CLI_EXIT_INPUT;
        goto out;
    }
    if (enospc >= 0)
        mig_ckpt_write_fail_at(enospc);
    if (cut >= 0)
        mig_execute_cut_at(cut);
    if (pcut >= 0)
        mig_side_cut_at(pcut);
    if (mcut >= 0)
        mig_move_cut_at(mcut);
    if (!cloud && getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT"))
        cloud = "aws";
    if (cloud) {
        struct cloud_notice_config ncfg;
        memset(&ncfg, 0, sizeof(ncfg));
        ncfg.timeout_ms = 500;
        /* Azure's document lists every VM of the availability set: keep the events naming us. */
        if (!strcmp(cloud, "azure") && cfg->agent.instance_id[0])
            ncfg.vm_name = cfg->agent.instance_id;
        r = cloud_notice_client_new(cloud, &ncfg, &nc);
        if (r < 0)
            st_log(ST_LOG_WARN, "worker", "No interruption-notice client (%s), ignoring",
                   st_strerror(r));
        else {
            ns.imds = nc;
            cfg->poll_notice = poll_notices;
            cfg->state_left = ack_notice;
            cfg->notice_userdata = &ns;
        }
    }
    char blas_why[512];
    r = kern_blas_load(cfg->threads > 0 ? cfg->threads : 1, blas_why, sizeof(blas_why));
    if (r < 0) {
        fprintf(stderr, "spottrain worker: %s\n", blas_why);
        ret = CLI_EXIT_FAILURE;
        goto out;
    }
    r = worker_runner_run(cfg);
    if (r < 0) {
        fprintf(stderr, "spottrain worker: %s\n",
                r == -EACCES ? "the coordinator rejected the token" : st_strerror(r));
        ret = CLI_EXIT_FAILURE;
        goto out;
    }
    ret = CLI_EXIT_OK;
out:
    cloud_notice_client_free(nc);
    st_free(cfg);
    return ret;
}
