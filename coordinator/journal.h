/* journal.h: internal to coordinator/ — the durable journal (SQLite, WAL mode).
 *
 * One idea: the journal is the truth and memory is a cache of it. Tables: meta (magic +
 * version), job (one row), workers (uuid kept across restarts), epochs, commands (per worker,
 * increasing id, packed protobuf body, ack), events (increasing seq). Writes that belong
 * together go in one transaction (coord__journal_begin/commit). synchronous=FULL: a commit
 * survives kill -9 and power loss; acknowledgements wait for the next commit or a flush
 * (coord__journal_commit_later), so a grant acked by N workers costs one wait for the disk,
 * not N. Not thread-safe: the coordinator lock serialises callers. */
#ifndef ST_COORD_JOURNAL_H
#define ST_COORD_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coordinator.h"

#define COORD_JOURNAL_MAGIC "spottrain-journal"
#define COORD_JOURNAL_VERSION 1
#define COORD_JOURNAL_FILE "journal.db"
#define COORD_JOURNAL_LOCK "lock"

struct coord_journal;

/* The job row. */
struct coord_job_row {
    char id[ST_UUID_STR_LEN];
    char name[128];
    enum coord_job_state state;
    uint64_t epoch;
    int dp, pp;
    uint64_t step, samples;
    double loss;
    double created; /* Unix seconds */
};

/* A command row as read back for redelivery. body is owned by the callback's caller. */
struct coord_command_row {
    uint64_t id, epoch;
    const char *kind; /* "configure", "migrate", "checkpoint", "stop" */
    const void *body;
    size_t len;
    bool acked;
};

typedef int coord_journal_worker_fn(const struct coord_worker *w, uint64_t next_command,
                                    void *userdata);
typedef int coord_journal_command_fn(const struct coord_command_row *row, void *userdata);
typedef int coord_journal_event_fn(int64_t seq, double time, const char *kind,
                                   const char *worker_id, const char *message, void *userdata);

/* Creates dir if needed and opens (or creates) dir/journal.db, holding an exclusive lock on
 * dir/lock (flock, released by coord__journal_close or the process's end, kill -9 included)
 * while it is open. Errors, logged with the path: -ENOTDIR/-EACCES/-EROFS... for an unusable
 * directory, -EBUSY when another coordinator holds the lock, -EIO for a corrupt or non-SQLite
 * file, -EPROTO for a SQLite file that is not a spottrain journal or has another version.
 * Caller frees with coord__journal_close(). */
int coord__journal_open(const char *dir, struct coord_journal **ret_j);
/* NULL-safe. */
void coord__journal_close(struct coord_journal *j);

int coord__journal_begin(struct coord_journal *j);
int coord__journal_commit(struct coord_journal *j);
/* Ends a transaction without waiting for the disk: its writes stay in an open transaction
 * that the next commit (or coord__journal_flush) makes durable with its own. Only for writes
 * whose loss in a crash costs nothing but a repeat: acknowledgements (a command whose ack was
 * lost is delivered again, and workers skip a command id they applied). A later transaction's
 * rollback leaves them in place. */
int coord__journal_commit_later(struct coord_journal *j);
/* Commits what commit_later kept, if the oldest of it is max_age seconds old or more.
 * 0 or negative errno (logged: the kept writes are lost). */
int coord__journal_flush(struct coord_journal *j, double max_age);
/* Never fails from the caller's view; logs. */
void coord__journal_rollback(struct coord_journal *j);
/* Seconds every commit so far spent waiting for the disk, summed. */
double coord__journal_waited(const struct coord_journal *j);

/* -ENOENT when the journal has no job yet. */
int coord__journal_job_load(struct coord_journal *j, struct coord_job_row *ret_row);
int coord__journal_job_save(struct coord_journal *j, const struct coord_job_row *row);

/* Inserts or replaces a worker row (every field of w plus its next command id). */
int coord__journal_worker_save(struct coord_journal *j, const struct coord_worker *w,
                               uint64_t next_command);
/* Calls fn for every worker in join order; stops at the first negative return. */
int coord__journal_workers_load(struct coord_journal *j, coord_journal_worker_fn *fn,
                                void *userdata);

int coord__journal_epoch_add(struct coord_journal *j, uint64_t epoch, int dp, int pp,
                             const char *reason, double time);
/* Number of rows in the epochs table (tests, /v1/job). */
int64_t coord__journal_epoch_count(struct coord_journal *j);

int coord__journal_command_add(struct coord_journal *j, const char *worker_id, uint64_t id,
                               uint64_t epoch, const char *kind, const void *body, size_t len,
                               double time);
/* Marks a command acknowledged. Returns 1 when it changed a row, 0 when it was already
 * acknowledged or does not exist (a redelivered ack), negative errno on failure. */
int coord__journal_command_ack(struct coord_journal *j, const char *worker_id, uint64_t id,
                               bool ok, const char *error, double time);
/* The redelivery set of a worker: its last Configure (acked or not) then every unacked
 * command after it, in id order. */
int coord__journal_commands_redeliver(struct coord_journal *j, const char *worker_id,
                                      coord_journal_command_fn *fn, void *userdata);
/* Total number of commands (tests). */
int64_t coord__journal_command_count(struct coord_journal *j);

/* Appends an event; returns its seq (> 0) or negative errno. */
int64_t coord__journal_event_add(struct coord_journal *j, double time, const char *kind,
                                 const char *worker_id, const char *message);
/* Retention: from now on each event_add deletes events older than the newest `keep`
 * (0 = keep all). Sequence numbers are never reused. */
void coord__journal_events_keep(struct coord_journal *j, int64_t keep);
/* Number of rows in the events table (tests). */
int64_t coord__journal_event_count(struct coord_journal *j);
/* Events with seq > since, at most limit, in seq order. */
int coord__journal_events(struct coord_journal *j, int64_t since, int limit,
                          coord_journal_event_fn *fn, void *userdata);

#endif
