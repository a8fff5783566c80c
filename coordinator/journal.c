/* journal.c: the coordinator's durable journal on SQLite in WAL mode.
 *
 * One idea: a schema small enough to read in one screen, with a meta table holding magic and
 * version that is checked on every open, so a wrong or corrupt file is refused with a hint
 * instead of being "repaired". Statements are prepared per call: the hot path (heartbeats)
 * never touches the journal, only state changes do. */
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h> /* flock */
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"   /* TRY, TRY_GOTO */
#include "journal.h" /* struct coord_journal API */

struct coord_journal {
    sqlite3 *db;
    int lock_fd;         /* dir/lock, flocked while open; -1 = none */
    char path[ST_SPEC_PATH_MAX + 32];
    int64_t events_keep; /* newest events kept; 0 = all */
    bool later;          /* a transaction ended with commit_later is still open */
    bool savepoint;      /* a transaction runs as SAVEPOINT tx inside it */
    double later_since;  /* st_now() of the oldest write the open one holds */
    double waited;       /* seconds all commits so far waited (coord__journal_waited) */
};

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS job(one INTEGER PRIMARY KEY CHECK(one = 1), id TEXT NOT NULL,"
    " name TEXT NOT NULL, state INTEGER NOT NULL, epoch INTEGER NOT NULL, dp INTEGER NOT NULL,"
    " pp INTEGER NOT NULL, step INTEGER NOT NULL, samples INTEGER NOT NULL, loss REAL NOT NULL,"
    " created REAL NOT NULL);"
    "CREATE TABLE IF NOT EXISTS workers(id TEXT PRIMARY KEY, instance_id TEXT, zone TEXT,"
    " instance_type TEXT, gpus INTEGER, data_addr TEXT, state INTEGER, epoch INTEGER,"
    " stage INTEGER, replica INTEGER, layer_begin INTEGER, layer_end INTEGER,"
    " acked INTEGER, step INTEGER, loss REAL, joined REAL, ord INTEGER, next_cmd INTEGER);"
    "CREATE TABLE IF NOT EXISTS epochs(epoch INTEGER PRIMARY KEY, dp INTEGER, pp INTEGER,"
    " reason TEXT, time REAL);"
    "CREATE TABLE IF NOT EXISTS commands(worker_id TEXT NOT NULL, id INTEGER NOT NULL,"
    " epoch INTEGER NOT NULL, kind TEXT NOT NULL, body BLOB, time REAL, acked REAL,"
    " ok INTEGER, error TEXT, PRIMARY KEY(worker_id, id));"
    "CREATE TABLE IF NOT EXISTS events(seq INTEGER PRIMARY KEY AUTOINCREMENT, time REAL,"
    " kind TEXT NOT NULL, worker_id TEXT, message TEXT);";

static int sql_err(struct coord_journal *j, int rc, const char *what) {
    st_log(ST_LOG_ERR, "journal", "Journal '%s': %s failed: %s", j->path, what,
           j->db ? sqlite3_errmsg(j->db) : sqlite3_errstr(rc));
    switch (rc & 0xff) {
    case SQLITE_NOMEM:
        return -ENOMEM;
    case SQLITE_READONLY:
    case SQLITE_PERM:
        return -EACCES;
    case SQLITE_FULL:
        return -ENOSPC;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return -EBUSY;
    case SQLITE_CANTOPEN:
        return -EACCES;
    default:
        return -EIO;
    }
}

static int exec(struct coord_journal *j, const char *sql) {
    int rc = sqlite3_exec(j->db, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return sql_err(j, rc, sql);
    return 0;
}

static int prepare(struct coord_journal *j, const char *sql, sqlite3_stmt **ret_st) {
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(j->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return sql_err(j, rc, "prepare");
    *ret_st = st;
    return 0;
}

/* Steps a statement that returns no rows, then finalizes it. */
static int step_done(struct coord_journal *j, sqlite3_stmt *st) {
    int rc = sqlite3_step(st);
    int r = 0;
    if (rc != SQLITE_DONE)
        r = sql_err(j, rc, "write");
    sqlite3_finalize(st);
    return r;
}

static const char *col_text(sqlite3_stmt *st, int i) {
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? (const char *)t : "";
}

static void copy_str(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src ? src : "");
}

static int check_meta(struct coord_journal *j) {
    sqlite3_stmt *st = NULL;
    char magic[64] = "", version[32] = "";
    TRY(prepare(j, "SELECT key, value FROM meta", &st));
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (strcmp(col_text(st, 0), "magic") == 0)
            copy_str(magic, sizeof(magic), col_text(st, 1));
        else if (strcmp(col_text(st, 0), "version") == 0)
            copy_str(version, sizeof(version), col_text(st, 1));
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return sql_err(j, rc, "reading meta");
    if (magic[0] == '\0' && version[0] == '\0') {
        char sql[256];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO meta(key, value) VALUES('magic', '%s'), ('version', '%d')",
                 COORD_JOURNAL_MAGIC, COORD_JOURNAL_VERSION);
        return exec(j, sql);
    }
    if (strcmp(magic, COORD_JOURNAL_MAGIC) != 0) {
        st_log(ST_LOG_ERR, "journal",
               "Journal '%s' has magic '%s', expected '%s': not a spottrain journal "
               "(hint: use an empty --state-dir)", j->path, magic, COORD_JOURNAL_MAGIC);
        return -EPROTO;
    }
    char want[16];
    snprintf(want, sizeof(want), "%d", COORD_JOURNAL_VERSION);
    if (strcmp(version, want) != 0) {
        st_log(ST_LOG_ERR, "journal",
               "Journal '%s' has version '%s', this build reads version %s "
               "(hint: finish the job with the spottrain that started it)", j->path, version,
               want);
        return -EPROTO;
    }
    return 0;
}

int coord__journal_open(const char *dir, struct coord_journal **ret_j) {
    struct coord_journal *j = NULL;
    struct stat sb;
    int r;

    if (!dir || !dir[0] || !ret_j)
        return -EINVAL;
    r = st_mkdir_p(dir, 0700);
    if (r < 0)
        return st_log_errno(r, "Cannot create state directory '%s': %s", dir, st_strerror(r));
    if (stat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode))
        return st_log_errno(-ENOTDIR, "State directory '%s' is not a directory", dir);
    if (access(dir, W_OK | X_OK) < 0) {
        r = -errno;
        return st_log_errno(r, "State directory '%s' is not writable: %s", dir, st_strerror(r));
    }
    j = st_calloc(1, sizeof(*j));
    if (!j)
        return -ENOMEM;
    /* One coordinator per state directory: a second one would take the same job over and
     * write the same journal (a second `run --state-dir D` used to launch its own workers
     * beside the first's). The lock goes with the process, so a restart after kill -9 finds
     * it free; close-on-exec, so no worker the coordinator starts keeps it. */
    char lock[sizeof(j->path)];
    snprintf(lock, sizeof(lock), "%s/%s", dir, COORD_JOURNAL_LOCK);
    j->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (j->lock_fd < 0) {
        r = -errno;
        r = st_log_errno(r, "Cannot open '%s': %s", lock, st_strerror(r));
        goto out;
    }
    if (flock(j->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        r = errno == EWOULDBLOCK ? -EBUSY : -errno;
        st_log(ST_LOG_ERR, "journal", "State directory '%s' is in use: another coordinator holds "
               "its journal (stop that one first, or give this one another state directory)",
               dir);
        goto out;
    }
    snprintf(j->path, sizeof(j->path), "%s/%s", dir, COORD_JOURNAL_FILE);
    int rc = sqlite3_open_v2(j->path, &j->db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                             NULL);
    if (rc != SQLITE_OK) {
        r = sql_err(j, rc, "open");
        goto out;
    }
    sqlite3_busy_timeout(j->db, 5000);
    /* The first statement reads the header: a file that is not SQLite fails here. */
    rc = sqlite3_exec(j->db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        st_log(ST_LOG_ERR, "journal",
               "Journal '%s' is corrupt or not a SQLite database: %s (hint: move it away to "
               "start a new job)", j->path, sqlite3_errmsg(j->db));
        r = (rc & 0xff) == SQLITE_READONLY || (rc & 0xff) == SQLITE_CANTOPEN ? -EACCES : -EIO;
        goto out;
    }
    TRY_GOTO(exec(j, "PRAGMA synchronous=FULL"), r, out);
    TRY_GOTO(exec(j, "PRAGMA foreign_keys=ON"), r, out);
    rc = sqlite3_exec(j->db, schema, NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        st_log(ST_LOG_ERR, "journal", "Journal '%s' has an unexpected schema or is corrupt: %s",
               j->path, sqlite3_errmsg(j->db));
        r = (rc & 0xff) == SQLITE_READONLY ? -EACCES : -EPROTO;
        goto out;
    }
    TRY_GOTO(check_meta(j), r, out);
    *ret_j = j;
    return 0;
out:
    coord__journal_close(j);
    return r;
}

void coord__journal_close(struct coord_journal *j) {
    if (!j)
        return;
    if (j->db) {
        (void)coord__journal_flush(j, 0);
        sqlite3_close(j->db);
    }
    if (j->lock_fd >= 0)
        close(j->lock_fd); /* and with it the lock */
    st_free(j);
}

/* Inside a transaction left open by commit_later, a new one is a savepoint of it: its
 * rollback undoes only its own writes, its commit commits both. */
int coord__journal_begin(struct coord_journal *j) {
    if (!j->later)
        return exec(j, "BEGIN IMMEDIATE");
    TRY(exec(j, "SAVEPOINT tx"));
    j->savepoint = true;
    return 0;
}

/* A commit waits for the disk (synchronous=FULL) while the caller holds the coordinator lock,
 * so REST and gRPC wait with it: a slow one is said, with the file it waited on. */
#define JOURNAL_SLOW_COMMIT_S 1.0

static int commit_now(struct coord_journal *j) {
    double t0 = st_now();
    int r = exec(j, "COMMIT");
    double dt = st_now() - t0;
    j->waited += dt;
    if (dt > JOURNAL_SLOW_COMMIT_S)
        st_log(ST_LOG_WARN, "journal", "Journal '%s': a commit waited %.1f s for the disk; "
               "requests waited with it", j->path, dt);
    if (r < 0 && !sqlite3_get_autocommit(j->db))
        (void)sqlite3_exec(j->db, "ROLLBACK", NULL, NULL, NULL);
    return r;
}

int coord__journal_commit(struct coord_journal *j) {
    if (j->savepoint) {
        j->savepoint = false;
        TRY(exec(j, "RELEASE tx"));
    }
    j->later = false;
    return commit_now(j);
}

double coord__journal_waited(const struct coord_journal *j) {
    return j ? j->waited : 0;
}

int coord__journal_commit_later(struct coord_journal *j) {
    if (j->savepoint) {
        j->savepoint = false;
        return exec(j, "RELEASE tx");
    }
    if (!j->later) {
        j->later = true;
        j->later_since = st_now();
    }
    return 0;
}

int coord__journal_flush(struct coord_journal *j, double max_age) {
    if (!j || !j->later || st_now() - j->later_since < max_age)
        return 0;
    j->later = false;
    int r = commit_now(j);
    if (r < 0)
        st_log(ST_LOG_WARN, "journal", "Journal '%s': writes kept for a later commit were "
               "lost (%s); their commands will be delivered again", j->path, st_strerror(r));
    return r;
}

void coord__journal_rollback(struct coord_journal *j) {
    if (j->savepoint) {
        j->savepoint = false;
        int rc = sqlite3_exec(j->db, "ROLLBACK TO tx; RELEASE tx", NULL, NULL, NULL);
        if (rc != SQLITE_OK)
            st_log(ST_LOG_WARN, "journal", "Journal '%s': rollback failed: %s, ignoring",
                   j->path, sqlite3_errmsg(j->db));
        return;
    }
    if (j->later || sqlite3_get_autocommit(j->db))
        return; /* nothing of the caller's is open (its begin failed) */
    int rc = sqlite3_exec(j->db, "ROLLBACK", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        st_log(ST_LOG_WARN, "journal", "Journal '%s': rollback failed: %s, ignoring", j->path,
               sqlite3_errmsg(j->db));
}

int coord__journal_job_load(struct coord_journal *j, struct coord_job_row *ret_row) {
    sqlite3_stmt *st = NULL;
    TRY(prepare(j,
                "SELECT id, name, state, epoch, dp, pp, step, samples, loss, created FROM job",
                &st));
    int rc = sqlite3_step(st);
    int r = 0;
    if (rc == SQLITE_ROW) {
        struct coord_job_row row;
        memset(&row, 0, sizeof(row));
        copy_str(row.id, sizeof(row.id), col_text(st, 0));
        copy_str(row.name, sizeof(row.name), col_text(st, 1));
        int state = sqlite3_column_int(st, 2);
        row.state = state >= 0 && state <= COORD_JOB_STOPPED ? (enum coord_job_state)state
                                                              : COORD_JOB_PENDING;
        row.epoch = (uint64_t)sqlite3_column_int64(st, 3);
        row.dp = sqlite3_column_int(st, 4);
        row.pp = sqlite3_column_int(st, 5);
        row.step = (uint64_t)sqlite3_column_int64(st, 6);
        row.samples = (uint64_t)sqlite3_column_int64(st, 7);
        row.loss = sqlite3_column_double(st, 8);
        row.created = sqlite3_column_double(st, 9);
        *ret_row = row;
    } else if (rc == SQLITE_DONE) {
        r = -ENOENT;
    } else {
        r = sql_err(j, rc, "reading job");
    }
    sqlite3_finalize(st);
    return r;
}

int coord__journal_job_save(struct coord_journal *j, const struct coord_job_row *row) {
    sqlite3_stmt *st = NULL;
    TRY(prepare(j,
                "INSERT OR REPLACE INTO job(one, id, name, state, epoch, dp, pp, step, samples,"
                " loss, created) VALUES(1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                &st));
    sqlite3_bind_text(st, 1, row->id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, row->name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 3, (int)row->state);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)row->epoch);
    sqlite3_bind_int(st, 5, row->dp);
    sqlite3_bind_int(st, 6, row->pp);
    sqlite3_bind_int64(st, 7, (sqlite3_int64)row->step);
    sqlite3_bind_int64(st, 8, (sqlite3_int64)row->samples);
    sqlite3_bind_double(st, 9, row->loss);
    sqlite3_bind_double(st, 10, row->created);
    return step_done(j, st);
}

int coord__journal_worker_save(struct coord_journal *j, const struct coord_worker *w,
                               uint64_t next_command) {
    sqlite3_stmt *st = NULL;
    TRY(prepare(j,
                "INSERT OR REPLACE INTO workers(id, instance_id, zone, instance_type, gpus,"
                " data_addr, state, epoch, stage, replica, layer_begin, layer_end, acked, step,"
                " loss, joined, ord, next_cmd) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                &st));
    sqlite3_bind_text(st, 1, w->id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, w->instance_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, w->zone, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 4, w->instance_type, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 5, w->gpus);
    sqlite3_bind_text(st, 6, w->data_addr, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 7, (int)w->state);
    sqlite3_bind_int64(st, 8, (sqlite3_int64)w->epoch);
    sqlite3_bind_int(st, 9, w->stage);
    sqlite3_bind_int(st, 10, w->replica);
    sqlite3_bind_int(st, 11, w->layer_begin);
    sqlite3_bind_int(st, 12, w->layer_end);
    sqlite3_bind_int64(st, 13, (sqlite3_int64)w->acked_command);
    sqlite3_bind_int64(st, 14, (sqlite3_int64)w->step);
    sqlite3_bind_double(st, 15, w->loss);
    sqlite3_bind_double(st, 16, w->joined);
    sqlite3_bind_int(st, 17, w->order);
    sqlite3_bind_int64(st, 18, (sqlite3_int64)next_command);
    return step_done(j, st);
}

int coord__journal_workers_load(struct coord_journal *j, coord_journal_worker_fn *fn,
                                void *userdata) {
    sqlite3_stmt *st = NULL;
    int r = 0, rc;
    TRY(prepare(j,
                "SELECT id, instance_id, zone, instance_type, gpus, data_addr, state, epoch,"
                " stage, replica, layer_begin, layer_end, acked, step, loss, joined, ord,"
                " next_cmd FROM workers ORDER BY ord",
                &st));
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct coord_worker w;
        memset(&w, 0, sizeof(w));
        copy_str(w.id, sizeof(w.id), col_text(st, 0));
        copy_str(w.instance_id, sizeof(w.instance_id), col_text(st, 1));
        copy_str(w.zone, sizeof(w.zone), col_text(st, 2));
        copy_str(w.instance_type, sizeof(w.instance_type), col_text(st, 3));
        w.gpus = sqlite3_column_int(st, 4);
        copy_str(w.data_addr, sizeof(w.data_addr), col_text(st, 5));
        int state = sqlite3_column_int(st, 6);
        w.state = state >= 0 && state < COORD_WORKER_NSTATES ? (enum coord_worker_state)state
                                                             : COORD_WORKER_LOST;
        w.epoch = (uint64_t)sqlite3_column_int64(st, 7);
        w.stage = sqlite3_column_int(st, 8);
        w.replica = sqlite3_column_int(st, 9);
        w.layer_begin = sqlite3_column_int(st, 10);
        w.layer_end = sqlite3_column_int(st, 11);
        w.acked_command = (uint64_t)sqlite3_column_int64(st, 12);
        w.step = (uint64_t)sqlite3_column_int64(st, 13);
        w.loss = sqlite3_column_double(st, 14);
        w.joined = sqlite3_column_double(st, 15);
        w.order = sqlite3_column_int(st, 16);
        uint64_t next = (uint64_t)sqlite3_column_int64(st, 17);
        r = fn(&w, next, userdata);
        if (r < 0)
            break;
    }
    if (r >= 0 && rc != SQLITE_DONE)
        r = sql_err(j, rc, "reading workers");
    sqlite3_finalize(st);
    return r < 0 ? r : 0;
}

int coord__journal_epoch_add(struct coord_journal *j, uint64_t epoch, int dp, int pp,
                             const char *reason, double time) {
    sqlite3_stmt *st = NULL;
    TRY(prepare(j, "INSERT INTO epochs(epoch, dp, pp, reason, time) VALUES(?,?,?,?,?)", &st));
    sqlite3_bind_int64(st, 1, (sqlite3_int64)epoch);
    sqlite3_bind_int(st, 2, dp);
    sqlite3_bind_int(st, 3, pp);
    sqlite3_bind_text(st, 4, reason ? reason : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(st, 5, time);
    return step_done(j, st);
}

static int64_t count_rows(struct coord_journal *j, const char *sql) {
    sqlite3_stmt *st = NULL;
    TRY(prepare(j, sql, &st));
    int64_t n;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    else
        n = sql_err(j, rc, "count");
    sqlite3_finalize(st);
    return n;
}

int64_t coord__journal_epoch_count(struct coord_journal *j) {
    return count_rows(j, "SELECT COUNT(*) FROM epochs");
}

int64_t coord__journal_command_count(struct coord_journal *j) {
    return count_rows(j, "SELECT COUNT(*) FROM commands");
}

int coord__journal_command_add(struct coord_journal *j, const char *worker_id, uint64_t id,
                               uint64_t epoch, const char *kind, const void *body, size_t len,
                               double time) {
    sqlite3_stmt *st = NULL;
    TRY(prepare(j,
                "INSERT INTO commands(worker_id, id, epoch, kind, body, time) VALUES(?,?,?,?,?,?)",
                &st));
    sqlite3_bind_text(st, 1, worker_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)id);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)epoch);
    sqlite3_bind_text(st, 4, kind, -1, SQLITE_TRANSIENT);
    sqlite3_bind_blob(st, 5, body, (int)len, SQLITE_TRANSIENT);
    sqlite3_bind_double(st, 6, time);
    return step_done(j, st);
}

int coord__journal_command_ack(struct coord_journal *j, const char *worker_id, uint64_t id,
                               bool ok, const char *error, double time) {
    sqlite3_stmt *st = NULL;
    TRY(prepare(j,
                "UPDATE commands SET acked = ?, ok = ?, error = ? WHERE worker_id = ? AND id = ?"
                " AND acked IS NULL",
                &st));
    sqlite3_bind_double(st, 1, time);
    sqlite3_bind_int(st, 2, ok ? 1 : 0);
    sqlite3_bind_text(st, 3, error ? error : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 4, worker_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 5, (sqlite3_int64)id);
    TRY(step_done(j, st));
    return sqlite3_changes(j->db) > 0 ? 1 : 0;
}

int coord__journal_commands_redeliver(struct coord_journal *j, const char *worker_id,
                                      coord_journal_command_fn *fn, void *userdata) {
    sqlite3_stmt *st = NULL;
    int r = 0, rc;
    /* The last Configure, then every unacknowledged command after it. */
    TRY(prepare(j,
                "SELECT id, epoch, kind, body, acked IS NOT NULL FROM commands WHERE worker_id = ?1"
                " AND id >= COALESCE((SELECT MAX(id) FROM commands WHERE worker_id = ?1 AND"
                " kind = 'configure'), 0) AND (kind = 'configure' OR acked IS NULL) ORDER BY id",
                &st));
    sqlite3_bind_text(st, 1, worker_id, -1, SQLITE_TRANSIENT);
    bool first_configure_seen = false;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct coord_command_row row;
        row.id = (uint64_t)sqlite3_column_int64(st, 0);
        row.epoch = (uint64_t)sqlite3_column_int64(st, 1);
        row.kind = col_text(st, 2);
        row.body = sqlite3_column_blob(st, 3);
        row.len = (size_t)sqlite3_column_bytes(st, 3);
        row.acked = sqlite3_column_int(st, 4) != 0;
        if (strcmp(row.kind, "configure") == 0) {
            if (first_configure_seen)
                continue; /* cannot happen: only the last one is >= MAX(id) */
            first_configure_seen = true;
        }
        r = fn(&row, userdata);
        if (r < 0)
            break;
    }
    if (r >= 0 && rc != SQLITE_DONE)
        r = sql_err(j, rc, "reading commands");
    sqlite3_finalize(st);
    return r < 0 ? r : 0;
}

int64_t coord__journal_event_add(struct coord_journal *j, double time, const char *kind,
                                 const char *worker_id, const char *message) {
    sqlite3_stmt *st = NULL;
    TRY(prepare(j, "INSERT INTO events(time, kind, worker_id, message) VALUES(?,?,?,?)", &st));
    sqlite3_bind_double(st, 1, time);
    sqlite3_bind_text(st, 2, kind, -1, SQLITE_TRANSIENT);
    if (worker_id && worker_id[0])
        sqlite3_bind_text(st, 3, worker_id, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, 3);
    sqlite3_bind_text(st, 4, message ? message : "", -1, SQLITE_TRANSIENT);
    TRY(step_done(j, st));
    int64_t seq = (int64_t)sqlite3_last_insert_rowid(j->db);
    /* Retention: seq never repeats (AUTOINCREMENT), so readers paging with since=N only see
     * the oldest events disappear. A range delete on the rowid, usually one row. */
    if (j->events_keep > 0 && seq > j->events_keep) {
        TRY(prepare(j, "DELETE FROM events WHERE seq <= ?", &st));
        sqlite3_bind_int64(st, 1, seq - j->events_keep);
        TRY(step_done(j, st));
    }
    return seq;
}

void coord__journal_events_keep(struct coord_journal *j, int64_t keep) {
    j->events_keep = keep > 0 ? keep : 0;
}

int64_t coord__journal_event_count(struct coord_journal *j) {
    return count_rows(j, "SELECT COUNT(*) FROM events");
}

int coord__journal_events(struct coord_journal *j, int64_t since, int limit,
                          coord_journal_event_fn *fn, void *userdata) {
    sqlite3_stmt *st = NULL;
    int r = 0, rc;
    TRY(prepare(j,
                "SELECT seq, time, kind, worker_id, message FROM events WHERE seq > ? ORDER BY seq"
                " LIMIT ?",
                &st));
    sqlite3_bind_int64(st, 1, since);
    sqlite3_bind_int(st, 2, limit);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const unsigned char *wid = sqlite3_column_text(st, 3);
        r = fn(sqlite3_column_int64(st, 0), sqlite3_column_double(st, 1), col_text(st, 2),
               wid ? (const char *)wid : NULL, col_text(st, 4), userdata);
        if (r < 0)
            break;
    }
    if (r >= 0 && rc != SQLITE_DONE)
        r = sql_err(j, rc, "reading events");
    sqlite3_finalize(st);
    return r < 0 ? r : 0;
}
