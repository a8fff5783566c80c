/* fuzz-proto.c: structure-aware libFuzzer target for the control plane (proto/control.proto)
 * through the coordinator's real handlers, on a journal in a temporary directory.
 *
 * The input is a program, read byte by byte (FuzzedDataProvider style): each step builds a
 * valid JoinRequest, ReportRequest or WatchRequest with hostile values (huge counts and ids,
 * "negative" epochs and steps near 2^64, NaN and infinite doubles, unknown worker ids,
 * strings with bytes a C string cannot hold, appended as raw length-delimited fields after
 * protobuf-c packed the rest), or raw bytes as a message, or a liveness tick far in the
 * future, or a coord_configure() with hostile assignments. Each message goes the way
 * grpc-server.c's handle() sends it: unpack, coord__validate_*, then coord__apply_* under the
 * lock, then the hook notes.
 *
 * After the program: the in-memory tables obey their invariants, and a coordinator reopened
 * on the same journal sees exactly the workers and job the first one had in memory (the
 * journal is the truth, memory its cache: nothing half-written, in either direction). */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "coord-internal.h"
#include "fuzz.h"

static const char *dir; /* fuzz_dir_make() */
static struct st_spec spec;

/* ---- reading the input ------------------------------------------------------------- */

struct in {
    const uint8_t *p;
    size_t n, at;
};

static uint8_t u8(struct in *in) {
    return in->at < in->n ? in->p[in->at++] : 0;
}

static uint64_t u64(struct in *in) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)u8(in) << (8 * i);
    return v;
}

/* An integer that is usually small, sometimes at a boundary, sometimes anything. */
static uint64_t hostile_u64(struct in *in) {
    switch (u8(in) % 8) {
    case 0: return 0;
    case 1: return u8(in) % 8;
    case 2: return UINT64_MAX - u8(in) % 4; /* a negative number sent as unsigned */
    case 3: return (uint64_t)INT64_MAX + u8(in) % 2;
    case 4: return (1ull << 53) + u8(in) % 2;
    case 5: return UINT32_MAX;
    default: return u64(in);
    }
}

static double hostile_double(struct in *in) {
    switch (u8(in) % 6) {
    case 0: return 0;
    case 1: return NAN;
    case 2: return u8(in) % 2 ? INFINITY : -INFINITY;
    case 3: return -1;
    case 4: return 1e308;
    default: {
        uint64_t b = u64(in);
        double d;
        memcpy(&d, &b, sizeof(d));
        return d;
    }
    }
}

/* Bytes of the input as a NUL-terminated string (at most 300 bytes; no NUL inside). */
static char *str(struct in *in, char *buf, size_t size) {
    size_t n = u8(in);
    if (n > 300)
        n = 300;
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < size && in->at < in->n; i++) {
        uint8_t c = u8(in);
        buf[k++] = c ? (char)c : '?';
    }
    buf[k] = '\0';
    return buf;
}

static const char *const ids[] = {
    "6f1c2a3e-0000-4000-8000-000000000001", "6f1c2a3e-0000-4000-8000-000000000002",
    "6f1c2a3e-0000-4000-8000-000000000003", "6f1c2a3e-0000-4000-8000-000000000004",
    "6f1c2a3e-0000-4000-8000-00000000000a", "6F1C2A3E-0000-4000-8000-000000000001",
    "not-a-uuid", "",
};

static const char *worker_id(struct in *in, char *buf, size_t size) {
    uint8_t k = u8(in);
    if (k < 224)
        return ids[k % ST_ARRAY_SIZE(ids)];
    return str(in, buf, size);
}

static const char *const addrs[] = {"127.0.0.1:5000", "[::1]:65535", "h:0", "h:65536",
                                    "host", ":1", "a:b"};

/* Appends a length-delimited field `field` holding raw input bytes (NULs, invalid UTF-8):
 * proto3 keeps the last occurrence of a singular field, so this replaces a packed string. */
static size_t append_raw(struct in *in, uint8_t *buf, size_t len, size_t cap) {
    uint8_t field = 1 + u8(in) % 10;
    size_t n = u8(in) % 64;
    if (len + 3 + n > cap)
        return len;
    buf[len++] = (uint8_t)(field << 3 | 2);
    buf[len++] = (uint8_t)n;
    for (size_t i = 0; i < n; i++)
        buf[len++] = u8(in);
    return len;
}

/* ---- the handlers ---------------------------------------------------------------------- */

enum method { M_JOIN, M_WATCH, M_REPORT };

/* handle() of grpc-server.c without the transport: unpack, validate, apply under the lock,
 * then the notes. */
static void deliver(struct coord *c, enum method m, const uint8_t *data, size_t len) {
    char why[256] = "";
    ProtobufCMessage *msg = NULL;
    int r;
    switch (m) {
    case M_JOIN: {
        Spottrain__V1__JoinRequest *q = spottrain__v1__join_request__unpack(NULL, len, data);
        msg = q ? &q->base : NULL;
        r = q ? coord__validate_join(q, why, sizeof(why)) : -EBADMSG;
        if (r >= 0) {
            bool rejoined = false;
            pthread_mutex_lock(&c->lock);
            r = coord__apply_join(c, q, &rejoined);
            pthread_mutex_unlock(&c->lock);
            FUZZ_CHECK(r >= 0 || r == -ENOMEM || r == -EUSERS);
        }
        break;
    }
    case M_WATCH: {
        Spottrain__V1__WatchRequest *q = spottrain__v1__watch_request__unpack(NULL, len, data);
        msg = q ? &q->base : NULL;
        r = q ? coord__validate_watch(q, why, sizeof(why)) : -EBADMSG;
        if (r >= 0) { /* what start_watch looks up before it needs a stream */
            pthread_mutex_lock(&c->lock);
            (void)coord__worker_find(c, q->worker_id);
            pthread_mutex_unlock(&c->lock);
        }
        break;
    }
    default: {
        Spottrain__V1__ReportRequest *q = spottrain__v1__report_request__unpack(NULL, len, data);
        msg = q ? &q->base : NULL;
        r = q ? coord__validate_report(q, why, sizeof(why)) : -EBADMSG;
        if (r >= 0) {
            pthread_mutex_lock(&c->lock);
            r = coord__apply_report(c, q);
            pthread_mutex_unlock(&c->lock);
            FUZZ_CHECK(r >= 0 || r == -ENOENT || r == -ENOMEM);
            for (size_t i = 0; i < q->n_notices; i++) { /* what on_report would get */
                struct st_notice_figures f;
                coord__notice_figures(&f, q->notices[i]->figures);
                FUZZ_CHECK(!q->notices[i]->figures ||
                           !strcmp(f.dir, q->notices[i]->figures->dir));
            }
        }
        break;
    }
    }
    if (r < 0 && r != -ENOMEM && r != -ENOENT && r != -EUSERS)
        FUZZ_CHECK(why[0] != '\0' || r == -EBADMSG); /* a rejection says why */
    if (msg)
        protobuf_c_message_free_unpacked(msg, NULL);
    coord__run_notes(c);
}

static void op_join(struct coord *c, struct in *in) {
    char idb[320], inst[320], zone[320], type[320], addr[320];
    Spottrain__V1__JoinRequest q = SPOTTRAIN__V1__JOIN_REQUEST__INIT;
    q.worker_id = (char *)worker_id(in, idb, sizeof(idb));
    q.instance_id = u8(in) % 2 ? str(in, inst, sizeof(inst)) : (char *)"i-0abc";
    q.zone = u8(in) % 4 ? (char *)"us-east-1a" : str(in, zone, sizeof(zone));
    q.instance_type = u8(in) % 4 ? (char *)"p3.2xlarge" : str(in, type, sizeof(type));
    q.gpus = (uint32_t)hostile_u64(in);
    uint8_t a = u8(in);
    q.data_addr = a < 200 ? (char *)addrs[a % ST_ARRAY_SIZE(addrs)] : str(in, addr, sizeof(addr));
    q.protocol = u8(in) % 16 ? ST_PROTOCOL : (uint32_t)hostile_u64(in);
    uint8_t buf[4096];
    size_t len = spottrain__v1__join_request__pack(&q, buf);
    if (u8(in) % 4 == 0)
        len = append_raw(in, buf, len, sizeof(buf));
    deliver(c, M_JOIN, buf, len);
}

static void op_watch(struct coord *c, struct in *in) {
    char idb[320];
    Spottrain__V1__WatchRequest q = SPOTTRAIN__V1__WATCH_REQUEST__INIT;
    q.worker_id = (char *)worker_id(in, idb, sizeof(idb));
    q.last_applied_command = hostile_u64(in);
    uint8_t buf[1024];
    size_t len = spottrain__v1__watch_request__pack(&q, buf);
    if (u8(in) % 4 == 0)
        len = append_raw(in, buf, len, sizeof(buf));
    deliver(c, M_WATCH, buf, len);
}

static void op_report(struct coord *c, struct in *in) {
    char idb[320], state[320];
    static char kinds[8][320], details[8][320], errors[8][320], dirs[8][640];
    Spottrain__V1__ReportRequest q = SPOTTRAIN__V1__REPORT_REQUEST__INIT;
    q.worker_id = (char *)worker_id(in, idb, sizeof(idb));
    q.epoch = hostile_u64(in);
    q.step = hostile_u64(in);
    q.samples = hostile_u64(in);
    q.loss = u8(in) % 2 ? 2.5 : hostile_double(in);
    q.step_seconds = u8(in) % 2 ? 0.1 : hostile_double(in);
    q.stall_seconds = u8(in) % 2 ? 0 : hostile_double(in);
    static const char *const states[] = {"training", "idle", "stopped", "migrating"};
    uint8_t s = u8(in);
    q.state = s < 200 ? (char *)states[s % 4] : str(in, state, sizeof(state));
    /* Counts: mostly a few real entries; sometimes more than the limits (64 notices,
     * 1024 acks), with the entries repeated. */
    Spottrain__V1__Notice notices[8], *np[80];
    Spottrain__V1__NoticeFigures figs[8];
    Spottrain__V1__CommandAck acks[8], *ap[1100];
    size_t nn = u8(in) % 8 == 0 ? 65 + u8(in) % 10 : u8(in) % 3;
    size_t na = u8(in) % 8 == 0 ? 1025 + u8(in) % 50 : u8(in) % 4;
    for (int i = 0; i < 8; i++) {
        notices[i] = (Spottrain__V1__Notice)SPOTTRAIN__V1__NOTICE__INIT;
        notices[i].kind = u8(in) % 2 ? (char *)"terminate" : str(in, kinds[i], sizeof(kinds[i]));
        notices[i].at = u8(in) % 2 ? 1.7e9 : hostile_double(in);
        notices[i].detail = u8(in) % 2 ? (char *)"" : str(in, details[i], sizeof(details[i]));
        if (u8(in) % 2) { /* typed figures: hostile numbers, a dir up to 639 bytes */
            figs[i] = (Spottrain__V1__NoticeFigures)SPOTTRAIN__V1__NOTICE_FIGURES__INIT;
            figs[i].epoch = hostile_u64(in);
            figs[i].step = hostile_u64(in);
            figs[i].stage = (int32_t)hostile_u64(in);
            figs[i].seconds = hostile_double(in);
            figs[i].waited = hostile_double(in);
            figs[i].dir = str(in, dirs[i], sizeof(dirs[i]));
            size_t dl = strlen(dirs[i]), want = 500 + u8(in) % 24; /* about the 511 limit */
            if (dl > 0 && u8(in) % 4 == 0) {
                for (size_t k = dl; k < want; k++)
                    dirs[i][k] = dirs[i][k % dl];
                dirs[i][want] = '\0';
            }
            notices[i].figures = &figs[i];
        }
        acks[i] = (Spottrain__V1__CommandAck)SPOTTRAIN__V1__COMMAND_ACK__INIT;
        acks[i].id = u8(in) % 2 ? 1 + u8(in) % 6 : hostile_u64(in);
        acks[i].ok = u8(in) % 2;
        acks[i].error = acks[i].ok ? (char *)"" : str(in, errors[i], sizeof(errors[i]));
    }
    for (size_t i = 0; i < nn; i++)
        np[i] = &notices[i % 8];
    for (size_t i = 0; i < na; i++)
        ap[i] = &acks[i % 8];
    q.n_notices = nn;
    q.notices = np;
    q.n_acks = na;
    q.acks = ap;
    size_t cap = spottrain__v1__report_request__get_packed_size(&q) + 80;
    uint8_t *buf = malloc(cap);
    FUZZ_CHECK(buf != NULL);
    size_t len = spottrain__v1__report_request__pack(&q, buf);
    if (u8(in) % 4 == 0)
        len = append_raw(in, buf, len, cap);
    deliver(c, M_REPORT, buf, len);
    free(buf);
}

static void op_raw(struct coord *c, struct in *in) {
    enum method m = (enum method)(u8(in) % 3);
    /* Read the length once: ST_MIN evaluates its arguments twice, and a second u8() would
     * both move the cursor and give a length past the end of the input. */
    size_t want = u8(in);
    size_t n = ST_MIN(want, in->n - in->at);
    deliver(c, m, in->p + in->at, n);
    in->at += n;
}

/* A liveness tick up to a few deadlines from now (the built-in policy may configure). */
static void op_tick(struct coord *c, struct in *in) {
    double ahead = (double)(u8(in) % 4) * coord__deadline(c) * 0.75 + c->cfg.settle;
    pthread_mutex_lock(&c->lock);
    coord__tick(c, st_now() + ahead);
    pthread_mutex_unlock(&c->lock);
    coord__run_notes(c);
}

/* coord_configure() as the planning loop calls it, with hostile assignments. */
static void op_configure(struct coord *c, struct in *in) {
    int dp = 1 + u8(in) % 3, pp = 1 + u8(in) % 3;
    if (u8(in) % 8 == 0)
        dp = -(int)(u8(in) % 3);
    struct coord_assignment a[8];
    size_t n = u8(in) % 9;
    for (size_t i = 0; i < n; i++) {
        memset(&a[i], 0, sizeof(a[i]));
        snprintf(a[i].worker_id, sizeof(a[i].worker_id), "%s", ids[u8(in) % ST_ARRAY_SIZE(ids)]);
        a[i].stage = (int)(u8(in) % 4) - (u8(in) % 8 == 0);
        a[i].replica = (int)(u8(in) % 4);
        a[i].layer_begin = (int)(u8(in) % 4);
        a[i].layer_end = a[i].layer_begin + (int)(u8(in) % 3) - (u8(in) % 8 == 0);
    }
    uint64_t epoch = 0;
    int r = coord_configure(c, dp, pp, a, n, u8(in) % 2 ? NULL : "tcp", hostile_u64(in), "fuzz",
                            &epoch);
    FUZZ_CHECK(r >= 0 || r == -EINVAL || r == -ESHUTDOWN || r == -ENOMEM);
    coord__run_notes(c);
}

/* ---- invariants ------------------------------------------------------------------------ */

static void check_memory(struct coord *c) {
    for (size_t k = 0; k < c->nworkers; k++) {
        const struct coord_wk *wk = c->workers[k];
        const struct coord_worker *w = &wk->pub;
        FUZZ_CHECK(st_uuid_valid(w->id));
        FUZZ_CHECK(w->state >= 0 && w->state < COORD_WORKER_NSTATES);
        FUZZ_CHECK(w->acked_command < wk->next_command);
        FUZZ_CHECK(w->epoch <= c->job.epoch);
        if (w->state == COORD_WORKER_ACTIVE && w->epoch == c->job.epoch) {
            FUZZ_CHECK(w->stage >= 0 && w->stage < c->job.pp);
            FUZZ_CHECK(w->replica >= 0 && w->replica < c->job.dp);
            FUZZ_CHECK(w->layer_begin < w->layer_end);
        }
        for (size_t j = 0; j < k; j++)
            FUZZ_CHECK(strcmp(c->workers[j]->pub.id, w->id) != 0 &&
                       c->workers[j]->pub.order != w->order);
    }
    FUZZ_CHECK(coord__journal_epoch_count(c->journal) == (int64_t)c->job.epoch);
}

/* The durable part of a worker row (progress and liveness clocks are memory-only). */
static void check_same_worker(const struct coord_worker *a, const struct coord_worker *b) {
    FUZZ_CHECK(strcmp(a->id, b->id) == 0);
    FUZZ_CHECK(strcmp(a->instance_id, b->instance_id) == 0);
    FUZZ_CHECK(strcmp(a->zone, b->zone) == 0);
    FUZZ_CHECK(strcmp(a->instance_type, b->instance_type) == 0);
    FUZZ_CHECK(strcmp(a->data_addr, b->data_addr) == 0);
    FUZZ_CHECK(a->gpus == b->gpus && a->state == b->state && a->epoch == b->epoch);
    FUZZ_CHECK(a->stage == b->stage && a->replica == b->replica);
    FUZZ_CHECK(a->layer_begin == b->layer_begin && a->layer_end == b->layer_end);
    FUZZ_CHECK(a->acked_command == b->acked_command && a->order == b->order);
}

static int one(const uint8_t *data, size_t size) {
    struct coord *c = NULL;
    int r = fuzz_coord_fresh(&spec, dir, NULL, &c);
    if (r < 0)
        return r;
    struct in in = {data, size, 0};
    for (int steps = 0; steps < 64 && in.at < in.n; steps++) {
        switch (u8(&in) % 8) {
        case 0: case 1: op_join(c, &in); break;
        case 2: case 3: op_report(c, &in); break;
        case 4: op_watch(c, &in); break;
        case 5: op_raw(c, &in); break;
        case 6: op_tick(c, &in); break;
        default: op_configure(c, &in); break;
        }
    }
    /* The checks run with allocation failures off: they judge what the program left. */
    st_alloc_fail_after(0);
    check_memory(c);
    size_t n = c->nworkers;
    struct coord_worker *before = malloc((n ? n : 1) * sizeof(*before));
    FUZZ_CHECK(before != NULL);
    for (size_t k = 0; k < n; k++)
        before[k] = c->workers[k]->pub;
    struct coord_job_row job = c->job;
    coord_free(c);

    c = NULL;
    FUZZ_CHECK(fuzz_coord_open(&spec, dir, NULL, &c) == 0);
    FUZZ_CHECK(c->nworkers == n);
    for (size_t k = 0; k < n; k++)
        check_same_worker(&before[k], &c->workers[k]->pub);
    FUZZ_CHECK(strcmp(c->job.id, job.id) == 0 && c->job.epoch == job.epoch);
    FUZZ_CHECK(c->job.dp == job.dp && c->job.pp == job.pp && c->job.state == job.state);
    FUZZ_CHECK(c->job.step == job.step && c->job.samples == job.samples);
    check_memory(c);
    coord_free(c);
    free(before);
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    st_log_level_max = -1; /* rejected messages are expected by the thousand: no logging */
    dir = fuzz_dir_make("proto");
    fuzz_coord_spec(&spec);
    return 0;
}

FUZZ_TARGET(one)
