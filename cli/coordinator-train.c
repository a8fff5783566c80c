/* coordinator-train.c: `spottrain coordinator --train` — a standalone coordinator that drives
 * its job with the planning loop.
 *
 * One idea: the same loop as `spottrain run`, without a cloud provider: workers are started by
 * someone else (`spottrain worker --job`) and the loop learns about them from the coordinator's
 * worker table and their reports. Everything the loop needs after a `kill -9` is in the journal,
 * so restarting this command on the same state directory resumes the job. */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "coord-loop.h"
#include "coordinator-train.h"
#include "check.h" /* TRY */
#include "kernels.h"
#include "migrate.h"
#include "worker.h" /* worker_model_json, worker_train_config_from_spec */

/* See coordinator-train.h. */
int cli_ckpt_latest(void *userdata, const char *root, char *dir, size_t dirsz,
                    uint64_t *ret_step) {
    (void)userdata;
    int r = mig_ckpt_latest(root, dir, dirsz);
    if (r < 0)
        return r;
    struct mig_ckpt *c = NULL;
    r = mig_ckpt_open(dir, &c, NULL);
    if (r < 0)
        return r;
    struct mig_ckpt_meta m;
    mig_ckpt_get_meta(c, &m);
    *ret_step = m.step;
    mig_ckpt_free(c);
    return 0;
}

/* See coordinator-train.h. */
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

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path) < 0 ? -1 : 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0; /* newest first */
}

/* See coordinator-train.h. */
int cli_ckpt_prune(void *userdata, const char *root, int keep) {
    (void)userdata;
    DIR *d = opendir(root);
    if (!d)
        return errno == ENOENT ? 0 : -errno;
    uint64_t steps[1024];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < ST_ARRAY_SIZE(steps)) {
        char *end;
        if (strncmp(e->d_name, "step-", 5) != 0 || !e->d_name[5])
            continue;
        unsigned long long v = strtoull(e->d_name + 5, &end, 10);
        if (!*end)
            steps[n++] = v;
    }
    closedir(d);
    qsort(steps, n, sizeof(steps[0]), cmp_u64);
    int committed = 0, removed = 0;
    for (size_t i = 0; i < n; i++) {
        char dir[ST_SPEC_PATH_MAX + 64], man[ST_SPEC_PATH_MAX + 96];
        snprintf(dir, sizeof(dir), "%s/step-%" PRIu64, root, steps[i]);
        snprintf(man, sizeof(man), "%s/manifest.json", dir);
        bool is_committed = access(man, F_OK) == 0;
        if (committed < keep) {
            committed += is_committed;
            continue; /* kept, or newer than the kept ones and maybe still being written */
        }
        if (nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS) == 0)
            removed++;
    }
    return removed;
}

/* See coordinator-train.h. */
int cli_coordinator_train(struct coord_config *cfg, const struct st_spec *spec,
                          const char *save, const sigset_t *set) {
    struct coord_loop_config *lc = st_calloc(1, sizeof(*lc));
    struct coord_loop *L = NULL;
    struct coord *c = NULL;
    int ret = CLI_EXIT_FAILURE, r;

    if (!lc) {
        fprintf(stderr, "spottrain coordinator: out of memory\n");
        return CLI_EXIT_FAILURE;
    }
    lc->spec = *spec;
    if (cfg->heartbeat_deadline > 0)
        lc->spec.coordinator.heartbeat_deadline = cfg->heartbeat_deadline;
    lc->time_scale = 1.0; /* no trace: planning intervals are real seconds */
    lc->ckpt_latest = cli_ckpt_latest;
    lc->ckpt_prune = cli_ckpt_prune;
    lc->ckpt_commit = cli_ckpt_commit;
    lc->ckpt_userdata = (void *)spec;
    if (spec->checkpoint.interval > 0) {
        snprintf(lc->ckpt_root, sizeof(lc->ckpt_root), "%s/ckpt", cfg->state_dir);
        lc->ckpt_interval = spec->checkpoint.interval;
    }
    if (save)
        snprintf(lc->save_dir, sizeof(lc->save_dir), "%s", save);
    lc->expect_workers = spec->fleet.min > 0 ? spec->fleet.min : 1;
    if ((r = coord_loop_new(lc, &L)) < 0) {
        fprintf(stderr, "spottrain coordinator: cannot create the planning loop: %s\n",
                st_strerror(r));
        ret = CLI_EXIT_INPUT;
        goto out;
    }
    struct coord_hooks hooks;
    coord_loop_hooks(L, &hooks);
    cfg->settle = 0.2;
    r = coord_new(cfg, &hooks, &c);
    if (r < 0) {
        fprintf(stderr, "spottrain coordinator: cannot open job state in '%s': %s\n",
                cfg->state_dir, st_strerror(r));
        ret = r == -EINVAL || r == -EEXIST || r == -ENOTDIR || r == -EACCES ? CLI_EXIT_INPUT
                                                                            : CLI_EXIT_FAILURE;
        goto out;
    }
    if ((r = coord_loop_attach(L, c)) < 0 || (r = coord_start(c)) < 0) {
        fprintf(stderr, "spottrain coordinator: cannot start: %s\n", st_strerror(r));
        goto out;
    }
    char job_id[ST_UUID_STR_LEN];
    uint64_t epoch = 0;
    coord_job_get(c, job_id, &epoch, NULL, NULL, NULL, NULL);
    printf("coordinator listening grpc=%s rest=%s job=%s epoch=%llu state=%s\n",
           coord_grpc_addr(c), coord_rest_addr(c)[0] ? coord_rest_addr(c) : "-", job_id,
           (unsigned long long)epoch, cfg->state_dir);
    fflush(stdout);
    char last[160] = "";
    for (;;) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        int sig = sigtimedwait(set, NULL, &ts);
        if (sig == SIGTERM || sig == SIGINT) {
            st_log(ST_LOG_NOTICE, "coord", "Signal %d: shutting down", sig);
            ret = CLI_EXIT_OK;
            break;
        }
        r = coord_loop_tick(L, st_now());
        struct coord_loop_status st;
        coord_loop_status(L, &st);
        if (strcmp(st.last_event, last)) {
            snprintf(last, sizeof(last), "%s", st.last_event);
            printf("coordinator: %s\n", last);
            fflush(stdout);
        }
        if (r < 0) {
            fprintf(stderr, "spottrain coordinator: planning loop failed: %s\n",
                    st_strerror(r));
            break;
        }
        if (r == 1) {
            struct coord_loop_summary *s = st_calloc(1, sizeof(*s));
            if (s) {
                coord_loop_summary(L, s);
                printf("coordinator: job %s: %" PRIu64 " steps, %" PRIu64 " samples, loss %.4f\n",
                       s->finished ? "finished" : "stopped", s->steps, s->samples,
                       s->final_loss);
                ret = s->finished ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
                st_free(s);
            }
            break;
        }
    }
    coord_shutdown(c);
    printf("coordinator stopped\n");
    fflush(stdout);
out:
    coord_free(c);
    coord_loop_free(L);
    st_free(lc);
    return ret;
}
