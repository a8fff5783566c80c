/* test-hooks.c: the coordinator API as the end-to-end loop will use it, in one process —
 * hooks (joined, membership, report, ack, lost, tick) deciding the shape with
 * coord_configure(), orders with coord_migrate() and coord_stop(), and worker/agent.c on the
 * other end, over real gRPC on loopback. Runs under ASan with leak checking. */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "coordinator.h"
#include "test.h"
#include "worker-agent.h"

struct seen {
    atomic_int joined, membership, reports, acks, acks_failed, lost, ticks;
    atomic_int configures, migrates, stops, transfers;
    atomic_int lease;         /* Migrate.lease of the last migration order */
    atomic_int configure_err; /* r of coord_configure inside the hook */
    atomic_int step5_epoch;   /* the epoch of the first Report of step 5 (-1: none yet) */
};

static struct seen seen;

/* The figures of the last "ckpt-written" and "terminate" notices on_report saw, the former's
 * detail, and the error of the last refused command's ack. */
static struct st_notice_figures ckw_seen, term_seen;
static char ckw_detail[256], ack_error[128];
static atomic_int ckw_n, term_n;

static void on_joined(struct coord *c, const struct coord_worker *w, bool rejoined, void *u) {
    (void)c;
    (void)w;
    (void)rejoined;
    (void)u;
    seen.joined++;
}

/* The planner's seat: configure every live worker as one pipeline stage each (dp = 1). */
static void on_membership(struct coord *c, void *u) {
    (void)u;
    struct coord_worker *ws = NULL;
    size_t n = 0, live = 0;
    if (coord_workers_get(c, &ws, &n) < 0)
        return;
    struct coord_assignment a[8];
    memset(a, 0, sizeof(a));
    for (size_t i = 0; i < n && live < 8; i++) {
        if (ws[i].state == COORD_WORKER_LOST || ws[i].state == COORD_WORKER_STOPPED)
            continue;
        snprintf(a[live].worker_id, sizeof(a[live].worker_id), "%s", ws[i].id);
        a[live].stage = (int)live;
        a[live].layer_begin = (int)live;
        a[live].layer_end = (int)live + 1;
        live++;
    }
    st_free(ws);
    if (live > 0)
        seen.configure_err = coord_configure(c, 1, (int)live, a, live, "tcp", 0, "hook", NULL);
    /* Counted last, so a test that waits on it sees what the hook did (the job's shape). */
    __atomic_fetch_add(&seen.membership, 1, __ATOMIC_RELEASE);
}

static void on_report(struct coord *c, const struct coord_report *r, void *u) {
    (void)c;
    (void)u;
    if (r->step == 5 && __atomic_load_n(&seen.step5_epoch, __ATOMIC_ACQUIRE) < 0)
        __atomic_store_n(&seen.step5_epoch, (int)r->epoch, __ATOMIC_RELEASE);
    for (size_t i = 0; i < r->nnotices; i++) {
        if (!strcmp(r->notices[i].kind, "ckpt-written")) {
            ckw_seen = r->notices[i].figures;
            snprintf(ckw_detail, sizeof(ckw_detail), "%s", r->notices[i].detail);
            __atomic_fetch_add(&ckw_n, 1, __ATOMIC_RELEASE);
        } else if (!strcmp(r->notices[i].kind, "terminate")) {
            term_seen = r->notices[i].figures;
            __atomic_fetch_add(&term_n, 1, __ATOMIC_RELEASE);
        }
    }
    seen.reports++;
}

static void on_ack(struct coord *c, const char *wid, uint64_t id, bool ok, const char *err,
                   void *u) {
    (void)c;
    (void)wid;
    (void)id;
    (void)u;
    if (ok) {
        seen.acks++;
    } else {
        snprintf(ack_error, sizeof(ack_error), "%s", err);
        seen.acks_failed++; /* after: a test that waits on it reads ack_error */
    }
}

static void on_lost(struct coord *c, const struct coord_worker *w, void *u) {
    (void)c;
    (void)w;
    (void)u;
    seen.lost++;
}

static void on_tick(struct coord *c, double now, void *u) {
    (void)c;
    (void)now;
    (void)u;
    seen.ticks++;
}

static int on_command(struct worker_agent *a, const Spottrain__V1__Command *cmd, char *err,
                      size_t errsz, void *u) {
    (void)a;
    (void)u;
    switch (cmd->body_case) {
    case SPOTTRAIN__V1__COMMAND__BODY_CONFIGURE:
        seen.configures++;
        return 0;
    case SPOTTRAIN__V1__COMMAND__BODY_MIGRATE:
        seen.transfers += (int)cmd->migrate->n_transfers;
        seen.lease = (int)cmd->migrate->lease;
        /* Counted last, so a test that waits on it sees the transfers and the lease. */
        __atomic_fetch_add(&seen.migrates, 1, __ATOMIC_RELEASE);
        if (cmd->migrate->n_transfers == 0) {
            /* A UTF-8 path in an error arrives as '?' (printable ASCII only: the coordinator
             * refused the whole Report, and the ack never arrived). */
            snprintf(err, errsz, "empty transfer list for '/ckpt/caf\xc3\xa9'");
            return -EINVAL;
        }
        return 0;
    case SPOTTRAIN__V1__COMMAND__BODY_STOP:
        seen.stops++;
        return 0;
    default:
        return 0;
    }
}

/* Bounded wait on a condition the threads change. */
#define WAIT_FOR(cond, what)                                                       \
    do {                                                                           \
        double end_ = st_now() + 30;                                               \
        while (!(cond) && st_now() < end_)                                         \
            usleep(10000);                                                         \
        if (!(cond))                                                               \
            TEST_FAIL_("timed out waiting for %s", what);                          \
    } while (0)

static int test_hooks_and_agent(void) {
    char dir[] = "/tmp/st-hooks-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    struct st_spec spec;
    st_spec_defaults(&spec);
    snprintf(spec.name, sizeof(spec.name), "hooks");
    spec.model.layers = 4;
    struct coord_config cfg;
    coord_config_init(&cfg);
    cfg.spec = &spec;
    snprintf(cfg.state_dir, sizeof(cfg.state_dir), "%s/state", dir);
    snprintf(cfg.listen, sizeof(cfg.listen), "127.0.0.1:0");
    snprintf(cfg.status_listen, sizeof(cfg.status_listen), "127.0.0.1:0");
    snprintf(cfg.token, sizeof(cfg.token), "tok");
    cfg.heartbeat_deadline = 1.0;
    cfg.settle = 0.1;
    cfg.tick = 0.05;
    struct coord_hooks hooks = {NULL, on_joined, on_lost, on_membership, on_report, on_ack,
                                on_tick};
    struct coord *c = NULL;
    ASSERT_OK(coord_new(&cfg, &hooks, &c));
    ASSERT_OK(coord_start(c));
    ASSERT_TRUE(strncmp(coord_grpc_addr(c), "127.0.0.1:", 10) == 0);
    ASSERT_TRUE(strncmp(coord_rest_addr(c), "127.0.0.1:", 10) == 0);

    struct worker_agent *ag[2] = {NULL, NULL};
    struct worker_agent_ops ops = {on_command, NULL};
    for (int i = 0; i < 2; i++) {
        struct worker_agent_config wc;
        worker_agent_config_init(&wc);
        snprintf(wc.coordinator, sizeof(wc.coordinator), "%s", coord_grpc_addr(c));
        snprintf(wc.token, sizeof(wc.token), "tok");
        snprintf(wc.data_addr, sizeof(wc.data_addr), "127.0.0.1:%d", 7300 + i);
        char sd[64];
        snprintf(sd, sizeof(sd), "%s/w%d", dir, i);
        ASSERT_OK(worker_agent_id_load(sd, NULL, wc.id));
        char again[ST_UUID_STR_LEN];
        ASSERT_OK(worker_agent_id_load(sd, NULL, again));
        ASSERT_STREQ(again, wc.id); /* the UUID survives a restart */
        ASSERT_OK(worker_agent_new(&wc, &ops, &ag[i]));
        ASSERT_OK(worker_agent_start(ag[i]));
    }
    WAIT_FOR(seen.joined >= 2, "two joins");
    WAIT_FOR(seen.configures >= 2 && worker_agent_epoch(ag[0]) >= 1 &&
                 worker_agent_epoch(ag[1]) >= 1,
             "both agents configured by the hook");
    ASSERT_EQ(seen.configure_err, 0);
    uint64_t epoch = 0;
    int dp = 0, pp = 0;
    coord_job_get(c, NULL, &epoch, &dp, &pp, NULL, NULL);
    ASSERT_EQ(dp, 1);
    ASSERT_EQ(pp, 2);
    WAIT_FOR(seen.acks >= 2, "configure acks reach on_ack");

    /* Progress and a notice travel in Reports. The Report's epoch is the one the progress
     * names, the epoch the worker trains in, not the newest one ordered (1 here): a worker
     * still in epoch 0 says 0. */
    seen.step5_epoch = -1;
    worker_agent_progress(ag[0], 0, 5, 1.25, 40, 0.1, 0.5);
    ASSERT_OK(worker_agent_notice(ag[0], "terminate", st_wall() + 120, "spot", NULL));
    /* Typed figures arrive as sent, whatever the words say: a checkpoint directory longer
     * than a detail holds, with a space and a UTF-8 name in it (a key=value detail cut it at
     * 255 characters, and its printable-ASCII rule refused the Report). */
    struct st_notice_figures f = {.step = 7, .stage = 1, .seconds = 0.25, .sent = 1ull << 40};
    size_t dl = (size_t)snprintf(f.dir, sizeof(f.dir), "%s/ckpt dir/caf\xc3\xa9/", dir);
    while (dl < 400)
        f.dir[dl++] = 'x';
    f.dir[dl] = '\0';
    ASSERT_OK(worker_agent_notice(ag[0], "ckpt-written", st_wall(), "dir=caf\xc3\xa9", &f));
    ASSERT_ERR(worker_agent_notice(ag[0], "", 0, NULL, NULL), -EINVAL);
    uint64_t step = 0;
    WAIT_FOR((coord_job_get(c, NULL, NULL, NULL, NULL, NULL, &step), step == 5), "step 5");
    /* The job's step is the coordinator's, set before the hook runs on its thread: wait for
     * the hook too (a loaded ASan run read -1 here). */
    WAIT_FOR(__atomic_load_n(&seen.step5_epoch, __ATOMIC_ACQUIRE) >= 0, "on_report of step 5");
    ASSERT_EQ(seen.step5_epoch, 0);
    WAIT_FOR(__atomic_load_n(&ckw_n, __ATOMIC_ACQUIRE) == 1 &&
                 __atomic_load_n(&term_n, __ATOMIC_ACQUIRE) == 1,
             "on_report of the two notices");
    ASSERT_EQ(ckw_seen.step, 7);
    ASSERT_EQ(ckw_seen.stage, 1);
    ASSERT_EQ(ckw_seen.sent, 1ull << 40);
    ASSERT_TRUE(ckw_seen.seconds == 0.25 && ckw_seen.epoch == 0 && ckw_seen.need == 0);
    ASSERT_STREQ(ckw_seen.dir, f.dir);
    ASSERT_STREQ(ckw_detail, "dir=caf??"); /* the words for people: printable ASCII */
    ASSERT_EQ(strlen(ckw_seen.dir), 400);
    /* sent without figures: all zero */
    ASSERT_TRUE(term_seen.epoch == 0 && term_seen.step == 0 && term_seen.sent == 0 &&
                term_seen.seconds == 0 && term_seen.stall == 0 && term_seen.dir[0] == '\0');
    ASSERT_TRUE(seen.reports > 0 && seen.ticks > 0);

    /* A migration order: one good, one the worker refuses. */
    struct coord_transfer t;
    memset(&t, 0, sizeof(t));
    snprintf(t.src_worker_id, sizeof(t.src_worker_id), "%s", worker_agent_id(ag[0]));
    snprintf(t.dst_worker_id, sizeof(t.dst_worker_id), "%s", worker_agent_id(ag[1]));
    t.layer = 1;
    t.kind = ST_STATE_PARAM;
    t.count = 100;
    uint64_t cid = 0;
    ASSERT_OK(coord_migrate(c, worker_agent_id(ag[1]), &t, 1, 5, &cid));
    ASSERT_OK(coord_migrate(c, worker_agent_id(ag[1]), NULL, 0, 5, &cid));
    WAIT_FOR(__atomic_load_n(&seen.migrates, __ATOMIC_ACQUIRE) == 2 && seen.acks_failed == 1,
             "migrate applied and one refused");
    ASSERT_STREQ(ack_error, "empty transfer list for '/ckpt/caf?\?'");
    ASSERT_EQ(seen.transfers, 1);
    ASSERT_EQ(seen.lease, 0); /* coord_migrate() gives no first lease */

    /* A migration with its communicator and the new epoch's first lease: the worker gets the
     * lease in the order; a first lease not past the boundary is refused unsent. */
    struct coord_peer cp[2];
    memset(cp, 0, sizeof(cp));
    for (int i = 0; i < 2; i++) {
        snprintf(cp[i].worker_id, sizeof(cp[i].worker_id), "%s", worker_agent_id(ag[i]));
        cp[i].stage = i;
    }
    ASSERT_ERR(coord_migrate_peers(c, worker_agent_id(ag[1]), &t, 1, 5, cp, 2, 0, 5, &cid),
               -EINVAL);
    ASSERT_ERR(coord_migrate_peers(c, worker_agent_id(ag[1]), &t, 1, 5, cp, 2, 0, 4, &cid),
               -EINVAL);
    ASSERT_OK(coord_migrate_peers(c, worker_agent_id(ag[1]), &t, 1, 5, cp, 2, 0, 9, &cid));
    WAIT_FOR(__atomic_load_n(&seen.migrates, __ATOMIC_ACQUIRE) == 3,
             "the migration with a first lease");
    ASSERT_EQ(seen.lease, 9);
    ASSERT_EQ(seen.transfers, 2);

    /* A worker that goes silent is lost; the hook re-plans with the survivor. */
    int membership_before = seen.membership;
    ag[1] = worker_agent_free(ag[1]);
    WAIT_FOR(seen.lost == 1, "on_worker_lost");
    WAIT_FOR(__atomic_load_n(&seen.membership, __ATOMIC_ACQUIRE) > membership_before,
             "on_membership after the loss");
    coord_job_get(c, NULL, &epoch, &dp, &pp, NULL, NULL);
    ASSERT_EQ(pp, 1);
    WAIT_FOR(worker_agent_epoch(ag[0]) == epoch, "survivor configured in the new epoch");

    /* Stop: the agent applies it, reports, and finishes. */
    ASSERT_OK(coord_stop(c, "test over"));
    ASSERT_EQ(worker_agent_wait(ag[0], 30), 1);
    ASSERT_TRUE(seen.stops >= 1);
    enum coord_job_state js = COORD_JOB_RUNNING;
    WAIT_FOR((coord_job_get(c, NULL, NULL, NULL, NULL, &js, NULL), js == COORD_JOB_STOPPED),
             "job stopped");
    ag[0] = worker_agent_free(ag[0]);
    c = coord_free(c);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ASSERT_EQ(system(cmd), 0);
    return 0;
}

static int test_agent_bad_config(void) {
    struct worker_agent_config wc;
    struct worker_agent *a = NULL;
    char id[ST_UUID_STR_LEN];
    worker_agent_config_init(&wc);
    ASSERT_ERR(worker_agent_new(&wc, NULL, &a), -EINVAL); /* no coordinator, no id */
    snprintf(wc.coordinator, sizeof(wc.coordinator), "127.0.0.1:1");
    ASSERT_ERR(worker_agent_new(&wc, NULL, &a), -EINVAL); /* no id */
    ASSERT_ERR(worker_agent_id_load(NULL, "not-a-uuid", id), -EINVAL);
    char dir[] = "/tmp/st-agentid-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    char path[64];
    snprintf(path, sizeof(path), "%s/worker-id", dir);
    ASSERT_OK(st_write_file_atomic(path, "garbage\n", 8));
    ASSERT_ERR(worker_agent_id_load(dir, NULL, id), -EINVAL); /* corrupt id file */
    ASSERT_OK(worker_agent_id_load(dir, "0b8c3f4e-1a2b-4c3d-8e9f-0123456789ab", id));
    ASSERT_OK(worker_agent_id_load(dir, NULL, id));
    ASSERT_STREQ(id, "0b8c3f4e-1a2b-4c3d-8e9f-0123456789ab");
    ASSERT_TRUE(a == NULL);
    remove(path);
    rmdir(dir);
    return 0;
}

/* The notice queue of an agent whose coordinator takes no Report (never started here): 64
 * notices, then -ENOBUFS; a "latest" notice replaces the queued one of its kind, so a stream
 * of peer-copy notices takes one slot however long the coordinator is away and the others
 * still fit (a loaded run dropped notices once 16 had queued). */
static int test_agent_notice_queue(void) {
    struct worker_agent_config wc;
    struct worker_agent *a = NULL;
    worker_agent_config_init(&wc);
    snprintf(wc.coordinator, sizeof(wc.coordinator), "127.0.0.1:1");
    snprintf(wc.id, sizeof(wc.id), "0b8c3f4e-1a2b-4c3d-8e9f-0123456789ab");
    ASSERT_OK(worker_agent_new(&wc, NULL, &a));
    ASSERT_EQ(worker_agent_notices_pending(a), 0);
    ASSERT_OK(worker_agent_notice(a, "first-step", 1.0, "epoch=1", NULL));
    for (int i = 0; i < 200; i++) {
        char d[32];
        snprintf(d, sizeof(d), "epoch=1 step=%d", i);
        ASSERT_OK(worker_agent_notice_latest(a, "peer-copy", 2.0 + i, d, NULL));
    }
    ASSERT_EQ(worker_agent_notices_pending(a), 2);
    ASSERT_ERR(worker_agent_notice_latest(a, "", 0, NULL, NULL), -EINVAL);
    ASSERT_ERR(worker_agent_notice_latest(NULL, "peer-copy", 0, NULL, NULL), -EINVAL);
    for (int i = 2; i < 64; i++)
        ASSERT_OK(worker_agent_notice(a, "reconfigured", 300.0 + i, "epoch=2", NULL));
    ASSERT_ERR(worker_agent_notice(a, "reconfigured", 400.0, "epoch=2", NULL), -ENOBUFS);
    /* full: a latest one still replaces its own kind */
    ASSERT_OK(worker_agent_notice_latest(a, "peer-copy", 500.0, "epoch=2 step=1", NULL));
    ASSERT_ERR(worker_agent_notice_latest(a, "ckpt-written", 500.0, "step=1", NULL), -ENOBUFS);
    ASSERT_EQ(worker_agent_notices_pending(a), 64);
    ASSERT_EQ(worker_agent_notices_pending(NULL), 0);
    worker_agent_free(a);
    return 0;
}

/* TLS files are read by worker_agent_new: bad pairings, missing and non-PEM files are refused
 * with nothing created; PEM files are accepted (the handshake is in tests/integration/tls). */
static int test_agent_tls_config(void) {
    char dir[] = "/tmp/st-agenttls-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    char pem[64], junk[64];
    snprintf(pem, sizeof(pem), "%s/x.pem", dir);
    snprintf(junk, sizeof(junk), "%s/junk.pem", dir);
    ASSERT_OK(st_write_file_atomic(pem, "-----BEGIN CERTIFICATE-----\nAA==\n", 33));
    ASSERT_OK(st_write_file_atomic(junk, "not pem\n", 8));
    struct worker_agent_config wc;
    struct worker_agent *a = NULL;
    worker_agent_config_init(&wc);
    snprintf(wc.coordinator, sizeof(wc.coordinator), "127.0.0.1:1");
    snprintf(wc.id, sizeof(wc.id), "0b8c3f4e-1a2b-4c3d-8e9f-0123456789ab");
    struct {
        const char *ca, *cert, *key;
        int err;
    } cases[] = {
        {pem, pem, "", -EINVAL},   /* cert without key */
        {pem, "", pem, -EINVAL},   /* key without cert */
        {"", pem, pem, -EINVAL},   /* client cert without a CA */
        {junk, "", "", -EINVAL},   /* not PEM */
        {pem, pem, junk, -EINVAL},
        {"/nonexistent/ca.pem", "", "", -ENOENT},
        {pem, "/nonexistent/c.pem", pem, -ENOENT},
    };
    for (size_t i = 0; i < ST_ARRAY_SIZE(cases); i++) {
        snprintf(wc.tls_ca, sizeof(wc.tls_ca), "%s", cases[i].ca);
        snprintf(wc.tls_cert, sizeof(wc.tls_cert), "%s", cases[i].cert);
        snprintf(wc.tls_key, sizeof(wc.tls_key), "%s", cases[i].key);
        ASSERT_ERR(worker_agent_new(&wc, NULL, &a), cases[i].err);
        ASSERT_TRUE(a == NULL);
    }
    snprintf(wc.tls_key, sizeof(wc.tls_key), "%s", pem);
    snprintf(wc.tls_cert, sizeof(wc.tls_cert), "%s", pem);
    snprintf(wc.tls_ca, sizeof(wc.tls_ca), "%s", pem);
    ASSERT_OK(worker_agent_new(&wc, NULL, &a));
    a = worker_agent_free(a);
    remove(pem);
    remove(junk);
    rmdir(dir);
    return 0;
}

TEST_MAIN(TEST(test_hooks_and_agent), TEST(test_agent_bad_config), TEST(test_agent_tls_config),
          TEST(test_agent_notice_queue))
