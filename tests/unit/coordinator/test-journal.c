/* test-journal.c: the coordinator's SQLite journal — create, reopen, redelivery set, ack
 * idempotence, and refusing corrupt, foreign or unusable state directories with a clear error.
 * Also the coordinator API on top of it (coord_new/configure/migrate/stop, restart). */
#include <signal.h>
#include <spawn.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h" /* TRY */
#include "coord-internal.h"
#include "journal.h"
#include "test.h"

static char *tmpdir(void) {
    static char buf[64];
    snprintf(buf, sizeof(buf), "/tmp/st-journal-XXXXXX");
    return mkdtemp(buf);
}

static int rm_rf(const char *d) {
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
    return system(cmd);
}

struct collect {
    uint64_t ids[16];
    int n;
};

static int collect_cmd(const struct coord_command_row *row, void *userdata) {
    struct collect *c = userdata;
    if (c->n < 16)
        c->ids[c->n++] = row->id;
    return 0;
}

static int count_worker(const struct coord_worker *w, uint64_t next, void *userdata) {
    int *n = userdata;
    (*n)++;
    return w->state == COORD_WORKER_ACTIVE && next == 5 ? 0 : -EBADMSG;
}

static int test_create_reopen(void) {
    char *d = tmpdir();
    struct coord_journal *j = NULL;
    struct coord_job_row job, back;
    ASSERT_OK(coord__journal_open(d, &j));
    ASSERT_ERR(coord__journal_job_load(j, &back), -ENOENT);
    memset(&job, 0, sizeof(job));
    st_uuid_new(job.id);
    snprintf(job.name, sizeof(job.name), "t");
    job.epoch = 3;
    job.dp = 2;
    job.pp = 4;
    job.state = COORD_JOB_RUNNING;
    ASSERT_OK(coord__journal_begin(j));
    ASSERT_OK(coord__journal_job_save(j, &job));
    struct coord_worker w;
    memset(&w, 0, sizeof(w));
    st_uuid_new(w.id);
    w.state = COORD_WORKER_ACTIVE;
    ASSERT_OK(coord__journal_worker_save(j, &w, 5));
    ASSERT_OK(coord__journal_epoch_add(j, 3, 2, 4, "test", 1.0));
    const char *kinds[] = {"configure", "migrate", "migrate", "configure", "migrate", "stop"};
    for (int i = 0; i < 6; i++)
        ASSERT_OK(coord__journal_command_add(j, w.id, (uint64_t)i + 1, 3, kinds[i], "x", 1, 1.0));
    ASSERT_OK(coord__journal_commit(j));
    ASSERT_EQ(coord__journal_event_add(j, 1.0, "a", NULL, "m"), 1);
    ASSERT_EQ(coord__journal_event_add(j, 2.0, "b", w.id, "m"), 2);
    /* Acks: 4 (the last configure) and 5; 6 stays pending. A repeated ack changes nothing. */
    ASSERT_EQ(coord__journal_command_ack(j, w.id, 4, true, "", 2.0), 1);
    ASSERT_EQ(coord__journal_command_ack(j, w.id, 5, true, "", 2.0), 1);
    ASSERT_EQ(coord__journal_command_ack(j, w.id, 5, true, "", 3.0), 0);
    ASSERT_EQ(coord__journal_command_ack(j, w.id, 99, true, "", 3.0), 0);
    coord__journal_close(j);

    j = NULL;
    ASSERT_OK(coord__journal_open(d, &j));
    ASSERT_OK(coord__journal_job_load(j, &back));
    ASSERT_STREQ(back.id, job.id);
    ASSERT_EQ(back.epoch, 3);
    ASSERT_EQ(back.dp, 2);
    ASSERT_EQ(back.pp, 4);
    ASSERT_EQ(back.state, COORD_JOB_RUNNING);
    int n = 0;
    ASSERT_OK(coord__journal_workers_load(j, count_worker, &n));
    ASSERT_EQ(n, 1);
    ASSERT_EQ(coord__journal_epoch_count(j), 1);
    ASSERT_EQ(coord__journal_command_count(j), 6);
    struct collect col = {{0}, 0};
    ASSERT_OK(coord__journal_commands_redeliver(j, w.id, collect_cmd, &col));
    ASSERT_EQ(col.n, 2); /* the last Configure (4, acked) and the pending Stop (6) */
    ASSERT_EQ(col.ids[0], 4);
    ASSERT_EQ(col.ids[1], 6);
    ASSERT_EQ(coord__journal_event_add(j, 3.0, "c", NULL, "m"), 3);
    coord__journal_close(j);
    rm_rf(d);
    return 0;
}

static int test_corrupt(void) {
    char *d = tmpdir(), path[128];
    struct coord_journal *j = NULL;
    snprintf(path, sizeof(path), "%s/%s", d, COORD_JOURNAL_FILE);
    static const char junk[] = "this is not a sqlite database, not even close........"
                               "...............................................";
    ASSERT_OK(st_write_file_atomic(path, junk, sizeof(junk)));
    ASSERT_ERR(coord__journal_open(d, &j), -EIO);
    ASSERT_TRUE(j == NULL);
    rm_rf(d);
    return 0;
}

static int test_foreign(void) {
    char *d = tmpdir(), path[128];
    sqlite3 *db = NULL;
    struct coord_journal *j = NULL;
    snprintf(path, sizeof(path), "%s/%s", d, COORD_JOURNAL_FILE);
    ASSERT_EQ(sqlite3_open(path, &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                               "INSERT INTO meta VALUES('magic', 'someone-else')",
                           NULL, NULL, NULL),
              SQLITE_OK);
    sqlite3_close(db);
    ASSERT_ERR(coord__journal_open(d, &j), -EPROTO);
    /* Right magic, future version. */
    ASSERT_EQ(sqlite3_open(path, &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "UPDATE meta SET value='spottrain-journal' WHERE key='magic';"
                               "INSERT INTO meta VALUES('version', '99')",
                           NULL, NULL, NULL),
              SQLITE_OK);
    sqlite3_close(db);
    ASSERT_ERR(coord__journal_open(d, &j), -EPROTO);
    rm_rf(d);
    return 0;
}

/* One coordinator per state directory: a second open of the same directory is refused while
 * the first is open, and allowed once it is closed, even with a child the first started still
 * running (the lock is not inherited across exec). */
static int test_one_coordinator(void) {
    char *d = tmpdir();
    struct coord_journal *j = NULL, *j2 = NULL;
    ASSERT_OK(coord__journal_open(d, &j));
    ASSERT_ERR(coord__journal_open(d, &j2), -EBUSY);
    ASSERT_TRUE(j2 == NULL);
    extern char **environ;
    pid_t child;
    char *argv[] = {"sleep", "60", NULL};
    ASSERT_EQ(posix_spawnp(&child, "sleep", NULL, NULL, argv, environ), 0);
    coord__journal_close(j);
    int r = coord__journal_open(d, &j2);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    ASSERT_OK(r);
    coord__journal_close(j2);
    rm_rf(d);
    return 0;
}

static int test_unusable_dir(void) {
    char *d = tmpdir(), file[128], sub[160];
    struct coord_journal *j = NULL;
    snprintf(file, sizeof(file), "%s/plain-file", d);
    ASSERT_OK(st_write_file_atomic(file, "x", 1));
    /* A state "directory" that is a regular file, and one below a regular file. */
    ASSERT_TRUE(coord__journal_open(file, &j) < 0);
    snprintf(sub, sizeof(sub), "%s/below", file);
    ASSERT_TRUE(coord__journal_open(sub, &j) < 0);
    ASSERT_ERR(coord__journal_open("", &j), -EINVAL);
    if (geteuid() != 0) { /* root ignores permissions */
        char ro[160];
        snprintf(ro, sizeof(ro), "%s/ro", d);
        ASSERT_EQ(mkdir(ro, 0500), 0);
        ASSERT_ERR(coord__journal_open(ro, &j), -EACCES);
    }
    ASSERT_TRUE(j == NULL);
    rm_rf(d);
    return 0;
}

/* ---- the coordinator API over the journal (no network: coord_start is not called) ---- */

static int join(struct coord *c, const char *id) {
    Spottrain__V1__JoinRequest req = SPOTTRAIN__V1__JOIN_REQUEST__INIT;
    bool rejoined;
    req.worker_id = (char *)id;
    req.data_addr = (char *)"127.0.0.1:1";
    return coord__apply_join(c, &req, &rejoined);
}

static int test_coord_api(void) {
    char *d = tmpdir();
    struct st_spec spec;
    st_spec_defaults(&spec);
    snprintf(spec.name, sizeof(spec.name), "api");
    spec.model.layers = 4;
    struct coord_config cfg;
    coord_config_init(&cfg);
    cfg.spec = &spec;
    snprintf(cfg.state_dir, sizeof(cfg.state_dir), "%s", d);
    snprintf(cfg.listen, sizeof(cfg.listen), "127.0.0.1:0");
    snprintf(cfg.status_listen, sizeof(cfg.status_listen), "-");
    struct coord *c = NULL;
    ASSERT_OK(coord_new(&cfg, NULL, &c));
    char a[ST_UUID_STR_LEN], b[ST_UUID_STR_LEN], x[ST_UUID_STR_LEN];
    st_uuid_new(a);
    st_uuid_new(b);
    st_uuid_new(x);
    ASSERT_OK(join(c, a));
    ASSERT_OK(join(c, b));
    struct coord_assignment as[2];
    memset(as, 0, sizeof(as));
    snprintf(as[0].worker_id, sizeof(as[0].worker_id), "%s", a);
    snprintf(as[1].worker_id, sizeof(as[1].worker_id), "%s", b);
    as[0].layer_end = 2;
    as[1].stage = 1;
    as[1].layer_begin = 2;
    as[1].layer_end = 4;
    uint64_t epoch = 0;
    /* Bad calls change nothing. */
    ASSERT_ERR(coord_configure(c, 1, 2, as, 1, NULL, 0, "short", &epoch), -EINVAL);
    ASSERT_ERR(coord_configure(c, 2, 2, as, 2, NULL, 0, "mismatch", &epoch), -EINVAL);
    struct coord_assignment dup[2] = {as[0], as[0]};
    ASSERT_ERR(coord_configure(c, 1, 2, dup, 2, NULL, 0, "dup", &epoch), -EINVAL);
    struct coord_assignment unk[2] = {as[0], as[1]};
    snprintf(unk[1].worker_id, sizeof(unk[1].worker_id), "%s", x);
    ASSERT_ERR(coord_configure(c, 1, 2, unk, 2, NULL, 0, "unknown", &epoch), -EINVAL);
    ASSERT_EQ(coord__journal_epoch_count(c->journal), 0);
    ASSERT_EQ(coord__journal_command_count(c->journal), 0);
    ASSERT_OK(coord_configure(c, 1, 2, as, 2, "tcp", 7, "test", &epoch));
    ASSERT_EQ(epoch, 1);
    ASSERT_EQ(coord__journal_command_count(c->journal), 2);
    struct coord_transfer t;
    memset(&t, 0, sizeof(t));
    snprintf(t.src_worker_id, sizeof(t.src_worker_id), "%s", a);
    snprintf(t.dst_worker_id, sizeof(t.dst_worker_id), "%s", b);
    t.count = 10;
    t.kind = ST_STATE_ADAM_M;
    uint64_t cid = 0;
    ASSERT_OK(coord_migrate(c, a, &t, 1, 7, &cid));
    ASSERT_EQ(cid, 2);
    ASSERT_ERR(coord_migrate(c, x, &t, 1, 7, &cid), -ENOENT);
    t.count = 0;
    ASSERT_ERR(coord_migrate(c, a, &t, 1, 7, &cid), -EINVAL);
    ASSERT_EQ(coord_checkpoint(c, "/tmp/ck", 8), 2);
    /* A lease for both at once: one command each, an unknown id and a repeat skipped. */
    int64_t ncmd = coord__journal_command_count(c->journal);
    const char *ids[4] = {a, x, b, a};
    ASSERT_EQ(coord_grant_lease(c, ids, 4, 9), 2);
    ASSERT_EQ(coord__journal_command_count(c->journal), ncmd + 2);
    ASSERT_EQ(coord_grant_lease(c, ids, 0, 9), 0);
    ASSERT_ERR(coord_grant_lease(c, NULL, 2, 9), -EINVAL);
    ASSERT_OK(coord_migrate(c, a, NULL, 0, 10, &cid)); /* configure, migrate, checkpoint, lease */
    ASSERT_EQ(cid, 5);
    ASSERT_TRUE(coord_event(c, "custom", NULL, "hello %d", 1) > 0);
    ASSERT_ERR(coord_plan_detail_set(c, "[1]"), -EINVAL);
    ASSERT_OK(coord_plan_detail_set(c, "{\"why\": 1}"));
    c = coord_free(c);

    /* Restart: same job, epoch and roles; another job name is refused. */
    ASSERT_OK(coord_new(&cfg, NULL, &c));
    struct coord_worker *ws = NULL;
    size_t n = 0;
    uint64_t ep = 0;
    int dp = 0, pp = 0;
    ASSERT_OK(coord_workers_get(c, &ws, &n));
    ASSERT_EQ(n, 2);
    ASSERT_EQ(ws[1].stage, 1);
    ASSERT_EQ(ws[1].state, COORD_WORKER_ACTIVE);
    st_free(ws);
    coord_job_get(c, NULL, &ep, &dp, &pp, NULL, NULL);
    ASSERT_EQ(ep, 1);
    ASSERT_EQ(dp, 1);
    ASSERT_EQ(pp, 2);
    ASSERT_OK(coord_stop(c, "done"));
    enum coord_job_state js;
    coord_job_get(c, NULL, NULL, NULL, NULL, &js, NULL);
    ASSERT_EQ(js, COORD_JOB_STOPPING);
    ASSERT_ERR(coord_configure(c, 1, 2, as, 2, NULL, 0, "late", &epoch), -ESHUTDOWN);
    ASSERT_ERR(coord_grant_lease(c, ids, 4, 11), -ESHUTDOWN);
    c = coord_free(c);
    snprintf(spec.name, sizeof(spec.name), "other");
    ASSERT_ERR(coord_new(&cfg, NULL, &c), -EEXIST);
    ASSERT_TRUE(c == NULL);
    rm_rf(d);
    return 0;
}

static int first_seq(int64_t seq, double time, const char *kind, const char *worker_id,
                     const char *message, void *userdata) {
    (void)time, (void)kind, (void)worker_id, (void)message;
    int64_t *first = userdata;
    if (*first == 0)
        *first = seq;
    return 0;
}

/* Retention: the journal keeps the newest N events, sequence numbers never repeat; the
 * coordinator takes N from the config, else the spec, else COORD_EVENTS_KEEP_DEFAULT. */
static int test_events_retention(void) {
    char *d = tmpdir();
    struct coord_journal *j = NULL;
    ASSERT_OK(coord__journal_open(d, &j));
    coord__journal_events_keep(j, 100);
    for (int i = 1; i <= 250; i++)
        ASSERT_EQ(coord__journal_event_add(j, i, "k", NULL, "m"), i);
    ASSERT_EQ(coord__journal_event_count(j), 100);
    int64_t first = 0;
    ASSERT_OK(coord__journal_events(j, 0, 1000, first_seq, &first));
    ASSERT_EQ(first, 151);
    coord__journal_events_keep(j, 0); /* 0 = keep everything */
    for (int i = 0; i < 50; i++)
        ASSERT_TRUE(coord__journal_event_add(j, 1, "k", NULL, "m") > 250);
    ASSERT_EQ(coord__journal_event_count(j), 150);
    coord__journal_close(j);
    rm_rf(d);

    d = tmpdir();
    struct st_spec spec;
    st_spec_defaults(&spec);
    ASSERT_EQ(spec.coordinator.events_keep, COORD_EVENTS_KEEP_DEFAULT);
    snprintf(spec.name, sizeof(spec.name), "keep");
    spec.coordinator.events_keep = 120;
    struct coord_config cfg;
    coord_config_init(&cfg);
    cfg.spec = &spec;
    snprintf(cfg.state_dir, sizeof(cfg.state_dir), "%s", d);
    snprintf(cfg.listen, sizeof(cfg.listen), "127.0.0.1:0");
    snprintf(cfg.status_listen, sizeof(cfg.status_listen), "-");
    struct coord *c = NULL;
    ASSERT_OK(coord_new(&cfg, NULL, &c));
    for (int i = 0; i < 300; i++)
        ASSERT_TRUE(coord_event(c, "tick", NULL, "event %d", i) > 0);
    ASSERT_EQ(coord__journal_event_count(c->journal), 120);
    c = coord_free(c);
    cfg.events_keep = 150; /* the config overrides the spec */
    ASSERT_OK(coord_new(&cfg, NULL, &c));
    for (int i = 0; i < 300; i++)
        ASSERT_TRUE(coord_event(c, "tick", NULL, "event %d", i) > 0);
    ASSERT_EQ(coord__journal_event_count(c->journal), 150);
    c = coord_free(c);
    rm_rf(d);
    return 0;
}

/* TLS settings are resolved and read in coord_new: bad pairings and unreadable or non-PEM
 * files are refused before anything listens or any journal is created. */
static int test_tls_config(void) {
    char *d = tmpdir();
    char pem[128], junk[128], state[128];
    snprintf(pem, sizeof(pem), "%s/x.pem", d);
    snprintf(junk, sizeof(junk), "%s/junk.pem", d);
    snprintf(state, sizeof(state), "%s/state", d);
    ASSERT_OK(st_write_file_atomic(pem, "-----BEGIN CERTIFICATE-----\nAA==\n", 33));
    ASSERT_OK(st_write_file_atomic(junk, "not pem\n", 8));
    struct st_spec spec;
    st_spec_defaults(&spec);
    snprintf(spec.name, sizeof(spec.name), "tls");
    struct coord_config cfg;
    coord_config_init(&cfg);
    cfg.spec = &spec;
    snprintf(cfg.state_dir, sizeof(cfg.state_dir), "%s", state);
    snprintf(cfg.listen, sizeof(cfg.listen), "127.0.0.1:0");
    snprintf(cfg.status_listen, sizeof(cfg.status_listen), "-");
    struct coord *c = NULL;
    struct {
        const char *cert, *key, *ca;
        int err;
    } cases[] = {
        {pem, "", "", -EINVAL},            /* cert without key */
        {"", pem, "", -EINVAL},            /* key without cert */
        {"", "", pem, -EINVAL},            /* client CA without cert and key */
        {junk, pem, "", -EINVAL},          /* not PEM */
        {pem, junk, "", -EINVAL},
        {pem, pem, junk, -EINVAL},
        {"/nonexistent/c.pem", pem, "", -ENOENT},
    };
    for (size_t i = 0; i < ST_ARRAY_SIZE(cases); i++) {
        snprintf(cfg.tls_cert, sizeof(cfg.tls_cert), "%s", cases[i].cert);
        snprintf(cfg.tls_key, sizeof(cfg.tls_key), "%s", cases[i].key);
        snprintf(cfg.tls_client_ca, sizeof(cfg.tls_client_ca), "%s", cases[i].ca);
        ASSERT_ERR(coord_new(&cfg, NULL, &c), cases[i].err);
        ASSERT_TRUE(c == NULL);
        ASSERT_TRUE(access(state, F_OK) < 0); /* nothing created */
    }
    /* The spec's files are used when the config leaves them empty; "-" turns TLS off. */
    snprintf(spec.coordinator.tls_cert, sizeof(spec.coordinator.tls_cert), "%s", junk);
    snprintf(spec.coordinator.tls_key, sizeof(spec.coordinator.tls_key), "%s", pem);
    cfg.tls_cert[0] = cfg.tls_key[0] = cfg.tls_client_ca[0] = '\0';
    ASSERT_ERR(coord_new(&cfg, NULL, &c), -EINVAL);
    snprintf(cfg.tls_cert, sizeof(cfg.tls_cert), "-");
    ASSERT_OK(coord_new(&cfg, NULL, &c));
    ASSERT_TRUE(c->tls_cert_pem == NULL);
    c = coord_free(c);
    /* Readable PEM files are loaded (the handshake itself is tested in tests/integration/tls). */
    snprintf(cfg.tls_cert, sizeof(cfg.tls_cert), "%s", pem);
    snprintf(cfg.tls_key, sizeof(cfg.tls_key), "%s", pem);
    snprintf(cfg.tls_client_ca, sizeof(cfg.tls_client_ca), "%s", pem);
    ASSERT_OK(coord_new(&cfg, NULL, &c));
    ASSERT_TRUE(c->tls_cert_pem && c->tls_key_pem && c->tls_ca_pem);
    c = coord_free(c);
    rm_rf(d);
    return 0;
}

/* A disk whose every sync takes SLOW_SYNC_S: an SQLite VFS that wraps the default one and
 * sleeps in xSync, so the journal's commit waits the way it does on a loaded, throttled disk. */
#define SLOW_SYNC_S 1.2

struct slow_file {
    sqlite3_file base; /* pMethods = &slow_io */
    sqlite3_file *real; /* the default VFS's file, allocated right after this struct */
};

static sqlite3_vfs slow_vfs, *real_vfs;
static sqlite3_io_methods slow_io;
static int slow_syncs;
static bool slow_armed; /* only the syncs under test count (and wait, with slow_wait) */
static bool slow_wait;
static bool slow_fail; /* the sync reports an I/O error (a disk that failed) */

static int slow_close(sqlite3_file *f) {
    struct slow_file *sf = (struct slow_file *)f;
    return sf->real->pMethods ? sf->real->pMethods->xClose(sf->real) : SQLITE_OK;
}
static int slow_read(sqlite3_file *f, void *b, int n, sqlite3_int64 off) {
    struct slow_file *sf = (struct slow_file *)f;
    return sf->real->pMethods->xRead(sf->real, b, n, off);
}
static int slow_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 off) {
    struct slow_file *sf = (struct slow_file *)f;
    return sf->real->pMethods->xWrite(sf->real, b, n, off);
}
static int slow_truncate(sqlite3_file *f, sqlite3_int64 size) {
    struct slow_file *sf = (struct slow_file *)f;
    return sf->real->pMethods->xTruncate(sf->real, size);
}
static int slow_sync(sqlite3_file *f, int flags) {
    struct slow_file *sf = (struct slow_file *)f;
    if (slow_armed) {
        struct timespec ts = {1, (long)((SLOW_SYNC_S - 1.0) * 1e9)};
        if (slow_wait)
            nanosleep(&ts, NULL);
        slow_syncs++;
        if (slow_fail)
            return SQLITE_IOERR_FSYNC;
    }
    return sf->real->pMethods->xSync(sf->real, flags);
}
static int slow_size(sqlite3_file *f, sqlite3_int64 *size) {
    struct slow_file *sf = (struct slow_file *)f;
    return sf->real->pMethods->xFileSize(sf->real, size);
}
static int slow_lock(sqlite3_file *f, int l) {
    struct slow_file *sf = (struct slow_file *)f;
    return sf->real->pMethods->xLock(sf->real, l);
}
static int slow_unlock(sqlite3_file *f, int l) {
    struct slow_file *sf = (struct slow_file *)f;
    return sf->real->pMethods->xUnlock(sf->real, l);
}
static int slow_check_lock(sqlite3_file *f, int *out) {
    struct slow_file *sf = (struct slow_file *)f;
    return sf->real->pMethods->xCheckReservedLock(sf->real, out);
}
static int slow_fcntl(sqlite3_file *f, int op, void *arg) {
    struct slow_file *sf = (struct slow_file *)f;
    return sf->real->pMethods->xFileControl(sf->real, op, arg);
}
static int slow_sector(sqlite3_file *f) {
    struct slow_file *sf = (struct slow_file *)f;
    return sf->real->pMethods->xSectorSize(sf->real);
}
static int slow_devchar(sqlite3_file *f) {
    struct slow_file *sf = (struct slow_file *)f;
    return sf->real->pMethods->xDeviceCharacteristics(sf->real);
}
static int slow_shm_map(sqlite3_file *f, int pg, int sz, int extend, void volatile **pp) {
    struct slow_file *sf = (struct slow_file *)f;
    return sf->real->pMethods->xShmMap(sf->real, pg, sz, extend, pp);
}
static int slow_shm_lock(sqlite3_file *f, int off, int n, int flags) {
    struct slow_file *sf = (struct slow_file *)f;
    return sf->real->pMethods->xShmLock(sf->real, off, n, flags);
}
static void slow_shm_barrier(sqlite3_file *f) {
    struct slow_file *sf = (struct slow_file *)f;
    sf->real->pMethods->xShmBarrier(sf->real);
}
static int slow_shm_unmap(sqlite3_file *f, int del) {
    struct slow_file *sf = (struct slow_file *)f;
    return sf->real->pMethods->xShmUnmap(sf->real, del);
}

static int slow_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags,
                     int *out_flags) {
    (void)vfs;
    struct slow_file *sf = (struct slow_file *)f;
    sf->real = (sqlite3_file *)(sf + 1);
    int rc = real_vfs->xOpen(real_vfs, name, sf->real, flags, out_flags);
    sf->base.pMethods = rc == SQLITE_OK ? &slow_io : NULL;
    return rc;
}

/* stderr into DIR/stderr between capture_begin and capture_end (what st_log writes). */
struct capture {
    char path[128];
    int saved;
    FILE *f;
};

static int capture_begin(const char *dir, struct capture *cap) {
    snprintf(cap->path, sizeof(cap->path), "%s/stderr", dir);
    fflush(stderr);
    cap->saved = dup(STDERR_FILENO);
    cap->f = fopen(cap->path, "w");
    ASSERT_TRUE(cap->saved >= 0 && cap->f);
    dup2(fileno(cap->f), STDERR_FILENO);
    return 0;
}

static void capture_end(struct capture *cap) {
    fflush(stderr);
    dup2(cap->saved, STDERR_FILENO);
    close(cap->saved);
    fclose(cap->f);
}

/* Makes the counting VFS SQLite's default (for journals opened from now on). */
static int slow_vfs_on(void) {
    real_vfs = sqlite3_vfs_find(NULL);
    ASSERT_TRUE(real_vfs != NULL);
    slow_io = (sqlite3_io_methods){2,          slow_close,     slow_read,        slow_write,
                                   slow_truncate, slow_sync,   slow_size,        slow_lock,
                                   slow_unlock, slow_check_lock, slow_fcntl,     slow_sector,
                                   slow_devchar, slow_shm_map, slow_shm_lock,    slow_shm_barrier,
                                   slow_shm_unmap, NULL,        NULL};
    slow_vfs = *real_vfs;
    slow_vfs.zName = "slow-sync";
    slow_vfs.szOsFile = (int)sizeof(struct slow_file) + real_vfs->szOsFile;
    slow_vfs.xOpen = slow_open;
    slow_vfs.pNext = NULL;
    ASSERT_EQ(sqlite3_vfs_register(&slow_vfs, 1), SQLITE_OK);
    slow_syncs = 0;
    return 0;
}

/* Commits on a slow disk succeed, and each one that waited past a second says so on stderr
 * with the journal's path: the line to look for when REST answers late. */
static int test_slow_disk(void) {
    ASSERT_OK(slow_vfs_on());
    char *d = tmpdir();
    struct capture cap;
    ASSERT_OK(capture_begin(d, &cap));

    struct coord_journal *j = NULL;
    int r = coord__journal_open(d, &j);
    struct coord_job_row job;
    memset(&job, 0, sizeof(job));
    st_uuid_new(job.id);
    snprintf(job.name, sizeof(job.name), "slow");
    job.state = COORD_JOB_RUNNING;
    if (r >= 0)
        r = coord__journal_begin(j);
    if (r >= 0)
        r = coord__journal_job_save(j, &job);
    slow_armed = slow_wait = true;
    if (r >= 0)
        r = coord__journal_commit(j);
    slow_armed = slow_wait = false;
    int syncs = slow_syncs;
    coord__journal_close(j);

    capture_end(&cap);
    sqlite3_vfs_unregister(&slow_vfs);
    ASSERT_OK(r);
    ASSERT_GE(syncs, 1);
    char *text = NULL;
    size_t len = 0;
    ASSERT_OK(st_read_file(cap.path, 1 << 16, &text, &len));
    char want[256];
    snprintf(want, sizeof(want), "Journal '%s/", d);
    ASSERT_CONTAINS(text, want);
    ASSERT_CONTAINS(text, "a commit waited");
    ASSERT_CONTAINS(text, "s for the disk; requests waited with it");
    st_free(text);
    rm_rf(d);
    return 0;
}

/* A coordinator on dir with no listeners (REST off, gRPC not started) for a 4-layer model;
 * deadline 0 = the spec's heartbeat deadline. spec must outlive it. */
static int small_coord(const char *dir, const char *name, double deadline, struct st_spec *spec,
                       struct coord **ret) {
    st_spec_defaults(spec);
    snprintf(spec->name, sizeof(spec->name), "%s", name);
    spec->model.layers = 4;
    struct coord_config cfg;
    coord_config_init(&cfg);
    cfg.spec = spec;
    cfg.heartbeat_deadline = deadline;
    snprintf(cfg.state_dir, sizeof(cfg.state_dir), "%s", dir);
    snprintf(cfg.listen, sizeof(cfg.listen), "127.0.0.1:0");
    snprintf(cfg.status_listen, sizeof(cfg.status_listen), "-");
    return coord_new(&cfg, NULL, ret);
}

/* A lease granted to every positioned worker waits for the disk once, not once per worker
 * (the loop grants several times a second, and each wait holds the lock REST needs). */
static int test_lease_one_sync(void) {
    ASSERT_OK(slow_vfs_on());
    char *d = tmpdir();
    struct st_spec spec;
    struct coord *c = NULL;
    ASSERT_OK(small_coord(d, "lease", 0, &spec, &c));
    char id[3][ST_UUID_STR_LEN];
    struct coord_assignment as[3];
    memset(as, 0, sizeof(as));
    const char *ids[3];
    for (int i = 0; i < 3; i++) {
        st_uuid_new(id[i]);
        ASSERT_OK(join(c, id[i]));
        snprintf(as[i].worker_id, sizeof(as[i].worker_id), "%s", id[i]);
        as[i].replica = i;
        as[i].layer_end = 4;
        ids[i] = id[i];
    }
    ASSERT_OK(coord_configure(c, 3, 1, as, 3, "tcp", 0, "test", NULL));
    slow_armed = true;
    ASSERT_EQ(coord_grant_lease(c, ids, 3, 8), 3);
    int batched = slow_syncs;
    slow_syncs = 0;
    for (int i = 0; i < 3; i++)
        ASSERT_OK(coord_migrate(c, ids[i], NULL, 0, 16, NULL));
    int each = slow_syncs;
    slow_armed = false;
    c = coord_free(c);
    sqlite3_vfs_unregister(&slow_vfs);
    ASSERT_EQ(batched, 1);
    ASSERT_EQ(each, 3);
    rm_rf(d);
    return 0;
}

/* Events in journal.db as another connection (a reader after a crash) sees them. */
static int64_t durable_events(const char *dir) {
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, COORD_JOURNAL_FILE);
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int64_t n = -1;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, "SELECT count(*) FROM events", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

static int add_event(struct coord_journal *j, bool later) {
    TRY(coord__journal_begin(j));
    int64_t seq = coord__journal_event_add(j, 1.0, "t", NULL, "m");
    if (seq < 0) {
        coord__journal_rollback(j);
        return (int)seq;
    }
    return later ? coord__journal_commit_later(j) : coord__journal_commit(j);
}

/* commit_later: writes that wait for the next commit or flush, in one wait for the disk;
 * a transaction inside them rolls back alone; close commits them; a flush the disk refuses
 * loses them (said) and leaves the journal usable. */
static int test_commit_later(void) {
    ASSERT_OK(slow_vfs_on());
    char *d = tmpdir();
    struct coord_journal *j = NULL;
    ASSERT_OK(coord__journal_open(d, &j));
    int64_t base = coord__journal_event_count(j);
    slow_armed = true;
    for (int i = 0; i < 5; i++)
        ASSERT_OK(add_event(j, true));
    ASSERT_EQ(slow_syncs, 0);
    ASSERT_EQ(coord__journal_event_count(j), base + 5); /* this connection sees them */
    ASSERT_EQ(durable_events(d), base);                  /* no other does yet */
    ASSERT_OK(coord__journal_flush(j, 3600));            /* not old enough */
    ASSERT_EQ(durable_events(d), base);
    ASSERT_OK(coord__journal_flush(j, 0));
    ASSERT_EQ(slow_syncs, 1);
    ASSERT_EQ(durable_events(d), base + 5);
    ASSERT_OK(coord__journal_flush(j, 0)); /* nothing kept: no commit */
    ASSERT_EQ(slow_syncs, 1);
    /* A transaction begun inside kept writes and rolled back takes only its own. */
    ASSERT_OK(add_event(j, true));
    ASSERT_OK(coord__journal_begin(j));
    ASSERT_TRUE(coord__journal_event_add(j, 2.0, "t", NULL, "undone") > 0);
    coord__journal_rollback(j);
    ASSERT_EQ(coord__journal_event_count(j), base + 6);
    /* A plain commit makes the kept writes durable with its own. */
    ASSERT_OK(add_event(j, false));
    ASSERT_EQ(slow_syncs, 2);
    ASSERT_EQ(durable_events(d), base + 7);
    /* Close commits what is kept. */
    ASSERT_OK(add_event(j, true));
    coord__journal_close(j);
    j = NULL;
    ASSERT_EQ(durable_events(d), base + 8);
    /* A disk that refuses the flush: the kept writes are gone, said once, and the journal
     * goes on. */
    ASSERT_OK(coord__journal_open(d, &j));
    ASSERT_OK(add_event(j, true));
    struct capture cap;
    ASSERT_OK(capture_begin(d, &cap));
    slow_fail = true;
    int r = coord__journal_flush(j, 0);
    slow_fail = false;
    capture_end(&cap);
    ASSERT_TRUE(r < 0);
    ASSERT_EQ(coord__journal_event_count(j), base + 8);
    ASSERT_OK(add_event(j, false));
    ASSERT_EQ(durable_events(d), base + 9);
    slow_armed = false;
    coord__journal_close(j);
    sqlite3_vfs_unregister(&slow_vfs);
    char *text = NULL;
    size_t len = 0;
    ASSERT_OK(st_read_file(cap.path, 1 << 16, &text, &len));
    ASSERT_CONTAINS(text, "writes kept for a later commit were lost");
    ASSERT_CONTAINS(text, "their commands will be delivered again");
    st_free(text);
    rm_rf(d);
    return 0;
}

/* A commit that waits for the disk longer than the heartbeat deadline (the lock held, no
 * Report heard meanwhile) does not get a live worker declared lost; silence beyond it does. */
static int test_deaf_while_committing(void) {
    ASSERT_OK(slow_vfs_on());
    char *d = tmpdir();
    struct st_spec spec;
    struct coord *c = NULL;
    const double deadline = 1.0; /* shorter than one SLOW_SYNC_S commit */
    ASSERT_OK(small_coord(d, "deaf", deadline, &spec, &c));
    char id[ST_UUID_STR_LEN];
    st_uuid_new(id);
    ASSERT_OK(join(c, id));
    pthread_mutex_lock(&c->lock);
    coord__tick(c, st_now()); /* credits the commits of the set-up */
    pthread_mutex_unlock(&c->lock);
    slow_armed = slow_wait = true;
    ASSERT_TRUE(coord_event(c, "custom", NULL, "kept for the next commit") > 0);
    /* Nobody is active to take it: the commit carries the kept event, and waits. */
    ASSERT_EQ(coord_checkpoint(c, "/tmp/ck", 4), 0);
    slow_armed = slow_wait = false;
    pthread_mutex_lock(&c->lock);
    struct coord_wk *wk = coord__worker_find(c, id);
    double after_commit = st_now();
    ASSERT_TRUE(wk != NULL);
    ASSERT_TRUE(after_commit - wk->last_seen > deadline); /* silent that long */
    coord__tick(c, after_commit);
    enum coord_worker_state kept = wk->pub.state;
    coord__tick(c, after_commit + 2 * deadline); /* then silent for real */
    enum coord_worker_state later = wk->pub.state;
    pthread_mutex_unlock(&c->lock);
    c = coord_free(c);
    sqlite3_vfs_unregister(&slow_vfs);
    ASSERT_EQ(slow_syncs, 1);
    ASSERT_NE(kept, COORD_WORKER_LOST); /* joined, or active by now (the built-in policy) */
    ASSERT_EQ(later, COORD_WORKER_LOST);
    rm_rf(d);
    return 0;
}

TEST_MAIN(TEST(test_create_reopen), TEST(test_corrupt), TEST(test_foreign),
          TEST(test_unusable_dir), TEST(test_one_coordinator), TEST(test_coord_api), TEST(test_events_retention),
          TEST(test_tls_config), TEST(test_slow_disk),
          TEST(test_lease_one_sync), TEST(test_commit_later),
          TEST(test_deaf_while_committing))
