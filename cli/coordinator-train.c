/* coordinator-train.c: `spottrain coordinator --train` — a standalone coordinator that drives
 * its job with the planning loop, through the job driver.
 *
 * One idea: the same driver as `spottrain run`; only the fleet differs. With provider sim the
 * workers are started by someone else (`spottrain worker --job`) and join; with a cloud or
 * kubernetes provider the driver acquires them. A signal leaves job and fleet for a restart:
 * everything the loop needs after a `kill -9` is in the journal, so restarting this command on
 * the same state directory resumes the job. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cloud.h" /* struct cloud_config: --kubeconfig */
#include "common.h"
#include "coordinator-train.h"

static volatile sig_atomic_t train_stop;

static void on_stop_signal(int sig) {
    (void)sig;
    train_stop = 1;
}

/* The line tests and scripts parse: bound addresses (port 0 picks free ports). */
static void on_started(const char *grpc, const char *rest, const char *job_id,
                       const char *state_dir, void *userdata) {
    (void)userdata;
    printf("coordinator listening grpc=%s rest=%s job=%s state=%s\n", grpc, rest[0] ? rest : "-",
           job_id, state_dir);
    fflush(stdout);
}

/* Hands --kubeconfig to the provider before the driver creates it. */
static int provider_setup(void *userdata, struct cloud_config *pc) {
    const char *kubeconfig = userdata;
    if (kubeconfig && snprintf(pc->kubeconfig, sizeof(pc->kubeconfig), "%s", kubeconfig) >=
                          (int)sizeof(pc->kubeconfig))
        return -ENAMETOOLONG;
    return 0;
}

/* See coordinator-train.h. */
int cli_coordinator_train(struct coord_config *cfg, const struct st_spec *spec,
                          const char *save, const char *kubeconfig, const char *shapes) {
    struct coord_job_config *jc = st_calloc(1, sizeof(*jc));
    struct coord_loop_summary *sum = st_calloc(1, sizeof(*sum));
    struct cli_job_ui *ui = st_calloc(1, sizeof(*ui));
    int ret = CLI_EXIT_FAILURE;
    if (!jc || !sum || !ui) {
        fprintf(stderr, "spottrain coordinator: out of memory\n");
        goto out;
    }
    coord_job_config_init(jc);
    jc->spec = spec;
    jc->coord = cfg;
    jc->fleet = spec->fleet.provider == ST_PROVIDER_SIM ? COORD_JOB_FLEET_JOINERS
                                                        : COORD_JOB_FLEET_PROVIDER;
    jc->on_stop = COORD_JOB_STOP_KEEP;
    jc->stop_flag = &train_stop;
    jc->provider_setup = provider_setup;
    jc->provider_userdata = (void *)kubeconfig;
    jc->shapes = shapes;
    if (save)
        snprintf(jc->save_dir, sizeof(jc->save_dir), "%s", save);
    cli_job_ckpt_store(jc, spec);
    cli_job_ui_init(ui, "coordinator", "coordinator: ", &jc->ui);
    ui->tty = false; /* a server's output is a log: lines, never a redrawn block */
    jc->ui.on_started = on_started;
    jc->ui.on_progress = NULL;
    jc->ui.on_event = NULL; /* a server's events are its log lines (st_log), once each */

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGHUP, SIG_IGN); /* no config reload yet */

    int r = coord_job_run(jc, sum);
    if (r < 0) {
        fprintf(stderr, "spottrain coordinator: %s\n", st_strerror(r));
        ret = r == -EINVAL || r == -EEXIST || r == -ENOTDIR || r == -EACCES ? CLI_EXIT_INPUT
                                                                            : CLI_EXIT_FAILURE;
        goto out;
    }
    if (train_stop && r == 1 && !sum->steps && !sum->finished) {
        printf("coordinator stopped\n");
        ret = CLI_EXIT_OK;
        goto out;
    }
    if (train_stop) {
        printf("coordinator stopped\n");
        ret = CLI_EXIT_OK;
    } else {
        printf("coordinator: job %s: %" PRIu64 " steps, %" PRIu64 " samples, loss %.4f\n",
               sum->finished ? "finished" : "stopped", sum->steps, sum->samples,
               sum->final_loss);
        printf("coordinator stopped\n");
        ret = sum->finished ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
    }
    fflush(stdout);
out:
    st_free(jc);
    st_free(sum);
    st_free(ui);
    return ret;
}
