/* common.h: the public header of common/ — logging, error codes, allocation, time, ids,
 * JSON helpers and the job spec.
 *
 * Everything here is safe to call from any part. Parsers in common/ never log: they return
 * negative errno and fill a struct st_error; their callers log once. */
#ifndef ST_COMMON_H
#define ST_COMMON_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ST_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define ST_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ST_MAX(a, b) ((a) > (b) ? (a) : (b))
#define ST_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* ---- errors ------------------------------------------------------------------------ */

/* Text for a negative errno (or a positive one). Never NULL; the string is static. */
const char *st_strerror(int r);

/* ---- logging ----------------------------------------------------------------------- */

enum st_log_level { ST_LOG_ERR = 0, ST_LOG_WARN, ST_LOG_NOTICE, ST_LOG_INFO, ST_LOG_DEBUG };

/* Current threshold; st_log() tests it before evaluating its arguments (Redis serverLog). */
extern int st_log_level_max;

/* Reads SPOTTRAIN_DEBUG (err|warn|notice|info|debug), SPOTTRAIN_DEBUG_SUBSYS (comma list,
 * empty = all) and SPOTTRAIN_LOG_FORMAT (human|json). Called once from main(); safe to call again. */
void st_log_init_from_env(void);
void st_log_set_level(int level);
/* Output format: false = human lines, true = JSON lines. */
void st_log_set_json(bool json);
/* Role ("coordinator", "worker", "cli") and id (worker id or rank) put on every line.
 * The strings are copied. */
void st_log_set_role(const char *role, const char *id);
/* True when lines of this subsystem pass the SPOTTRAIN_DEBUG_SUBSYS filter. */
bool st_log_subsys_enabled(const char *subsys);

void st_log_internal(int level, const char *subsys, const char *file, int line, const char *fmt,
                     ...) ST_PRINTF(5, 6);

#define st_log(level, subsys, ...)                                                 \
    do {                                                                           \
        if ((level) <= st_log_level_max)                                           \
            st_log_internal((level), (subsys), __FILE__, __LINE__, __VA_ARGS__);   \
    } while (0)

/* Logs at ERR and returns r (negative errno), for `return st_log_errno(r, "...")`. */
#define st_log_errno(r, ...)                                                       \
    (st_log_internal(ST_LOG_ERR, "main", __FILE__, __LINE__, __VA_ARGS__), (r))

/* ---- the ZeRO-1 shard rule --------------------------------------------------------- */

/* Replica r's shard of n elements split over dp replicas: [*ret_lo, *ret_hi) with
 * lo = floor(r n / dp), hi = floor((r + 1) n / dp), computed without overflow; r >= dp (or
 * dp < 1) gives the empty range [n, n). The one rule the engine's optimizer shards and the
 * migration planner's transfers both use, so a shard is the same bytes everywhere. */
void st_shard(uint64_t n, int64_t dp, int64_t r, uint64_t *ret_lo, uint64_t *ret_hi);

/* ---- what a layer's state is made of ------------------------------------------------ */

/* A layer's parameters, or one of AdamW's two moments (the part ZeRO-1 shards across a
 * stage's replicas). One enum for the planner's transfers, the coordinator's Migrate commands,
 * the data plane and the checkpoint files; proto StateKind numbers them the same. */
enum st_state_kind {
    ST_STATE_PARAM = 0, /* parameters (a whole layer) */
    ST_STATE_ADAM_M,    /* AdamW first moment */
    ST_STATE_ADAM_V,    /* AdamW second moment */
    ST_STATE_NKINDS
};
/* "param", "adam_m", "adam_v"; "?" for any other value. */
const char *st_state_kind_name(enum st_state_kind k);

/* ---- the control protocol -------------------------------------------------------------- */

/* The version of proto/control.proto's messages and their meaning that this build speaks:
 * a worker sends it in its Join, and a coordinator refuses a worker that speaks another, with
 * a reason the worker prints (a mixed fleet would otherwise run with figures missing).
 * Bumped when a message changes meaning. 1: notices carry typed figures (NoticeFigures). */
#define ST_PROTOCOL 1

/* ---- what a worker's notice tells the coordinator ----------------------------------- */

/* The figures a worker's notice carries for the coordinator (proto NoticeFigures), beside its
 * words for people (Notice.detail, which nothing parses). worker/runner.c fills them,
 * coordinator/loop-hooks.c reads them; zero means not said. By notice kind:
 *   reconfigured        epoch, step, sent, recv, replayed, prewarmed, seconds, stall and its
 *                       parts (wait, connect, reshape, transfer, commit), deferred, waited
 *   reconfig-failed     epoch
 *   step-failed         epoch, step
 *   peer-copy-failed    epoch, step
 *   data-auth-failed    epoch
 *   ckpt-failed         step
 *   first-step          epoch, step, seconds, step_seconds
 *   peer-copy           epoch and step of the newest generation held, prev_epoch and
 *                       prev_step of the other, seconds, blocked
 *   peer-copy-refused   epoch, need
 *   ckpt-written        step, stage, seconds, dir
 *   checkpointed        step, seconds, dir */
#define ST_NOTICE_DIR_MAX 512
struct st_notice_figures {
    uint64_t epoch, step;
    uint64_t prev_epoch, prev_step;
    uint64_t sent, recv;   /* bytes on the wire */
    uint64_t replayed;     /* steps trained again after a restore */
    uint64_t prewarmed;    /* bytes a new engine took from the warm reserve */
    uint64_t need;         /* bytes of peer copies per worker the layout needs */
    int32_t stage;
    double seconds;        /* what the notice is about took this long */
    double step_seconds;   /* of the first step alone */
    double blocked;        /* of seconds, what training waited for */
    double stall, wait, connect, reshape, transfer, commit; /* the stall, and where it went */
    double deferred, waited; /* state moved after the boundary; what training waited for it */
    char dir[ST_NOTICE_DIR_MAX]; /* a checkpoint's directory */
};

/* ---- the peer-copy ring ------------------------------------------------------------- */

/* The ring of in-memory peer copies over n positions: next[p] is the position that holds p's
 * copy, a single cycle through all n, so every position holds exactly one other's. zones[p]
 * names the zone of p's instance (NULL or "" count as one unnamed zone). With one zone the
 * ring is position order (next[p] = p + 1 mod n). With several, positions are grouped by
 * zone (the largest group first, ties in order of first appearance, positions in order
 * within a group) and dealt to the ring's even slots, then its odd ones, so no position is
 * held in its own zone unless one zone has more than half of them. The one rule the workers
 * (who send and hold the copies) and the coordinator (which restores from them) both use.
 * Returns the number of positions held in their own zone, or -EINVAL (n < 1, n > 4096). */
int st_peer_ring(int n, const char *const *zones, int *next);

/* ---- allocation ------------------------------------------------------------------ */

/* All allocation goes through these so tests can make the Nth call fail (curl torture). */
void *st_malloc(size_t n);
void *st_calloc(size_t n, size_t size);
void *st_realloc(void *p, size_t n);
char *st_strdup(const char *s);
char *st_strndup(const char *s, size_t n);
void st_free(void *p);

/* Makes room for element n of a growable array arr of cap elements (arr and cap are lvalues):
 * when n == cap, reallocates arr to twice cap elements, or `first` when cap is 0. Evaluates to
 * 0, or -ENOMEM with arr and cap unchanged. (git's ALLOC_GROW, as a function.) */
#define ST_GROW(arr, n, cap, first) \
    st_grow_((void **)&(arr), (n), &(cap), sizeof(*(arr)), (first))
int st_grow_(void **arr, size_t n, size_t *cap, size_t elem, size_t first);
/* Test hook: the nth allocation from now (1-based) and every later one fail; 0 disables. */
void st_alloc_fail_after(long n);

/* ---- time -------------------------------------------------------------------------- */

/* Monotonic seconds (CLOCK_MONOTONIC). Only daemons and the CLI read clocks, never planner/. */
double st_now(void);
/* Wall-clock seconds since the epoch. */
double st_wall(void);

/* Parses "60s", "30m", "2h", "1.5h", "250ms" or a bare number of seconds.
 * Returns 0 and writes *ret_seconds, or -EINVAL. */
int st_parse_duration(const char *s, double *ret_seconds);
/* Parses "16GiB", "512MiB", "1GB", "4096" (bytes). Returns 0 or -EINVAL. */
int st_parse_size(const char *s, uint64_t *ret_bytes);

/* ---- ids --------------------------------------------------------------------------- */

#define ST_UUID_STR_LEN 37 /* 36 characters + NUL */
/* Writes a fresh random UUID in lower-case text form into buf[ST_UUID_STR_LEN]. */
void st_uuid_new(char buf[ST_UUID_STR_LEN]);
/* True when s is a well-formed UUID string. */
bool st_uuid_valid(const char *s);

/* ---- files -------------------------------------------------------------------------- */

/* Reads a whole file (at most max bytes) into a NUL-terminated heap buffer.
 * Returns 0, -ENOENT, -EFBIG when larger than max, or another negative errno.
 * Caller frees *ret_data with st_free(). */
int st_read_file(const char *path, size_t max, char **ret_data, size_t *ret_len);
/* Writes data to path atomically (temp file + fsync + rename). Returns 0 or negative errno. */
int st_write_file_atomic(const char *path, const void *data, size_t len);
/* mkdir -p. Returns 0 (made, or a directory already) or negative errno: -ENOTDIR when path, or
 * a component of it, is there as something other than a directory. */
int st_mkdir_p(const char *path, unsigned mode);

/* ---- parse errors ------------------------------------------------------------------ */

/* Where a parse error is: filled by parsers (spec, traces, profiles) next to -EINVAL. */
struct st_error {
    char file[256];
    int line;       /* 1-based; 0 when unknown */
    int column;     /* 1-based; 0 when unknown */
    char field[128]; /* dotted path, e.g. "spec.training.micro_batch"; "" when none */
    char message[512];
};

/* Fills e (if non-NULL) and returns -EINVAL, for `return st_error_set(e, ...)`. */
int st_error_set(struct st_error *e, const char *file, int line, int column, const char *field,
                 const char *fmt, ...) ST_PRINTF(6, 7);
/* "file:line:column: field: message" into buf. */
void st_error_format(const struct st_error *e, char *buf, size_t size);

#include "spec.h" /* struct st_spec, st_spec_load */
#include "tokens.h" /* token files, sampler, synthetic corpus */

#endif
