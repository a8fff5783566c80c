/* agent.c: the worker's control-plane client on gRPC C core (worker-agent.h).
 *
 * One idea: two threads, each with its own completion queue used synchronously — the session
 * thread makes unary calls (Join, Report) one at a time, the watch thread reads the command
 * stream — so each queue has at most one outstanding batch and the code reads top to bottom.
 * Anything going wrong with the coordinator (unreachable, restarted, "Join first") ends the
 * session; the session thread then reconnects with exponential backoff and Joins again with
 * the same UUID. */
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "worker-agent.h"

#define AGENT_MAGIC 0x4147454eu /* "AGEN" */
#define AGENT_MAX_NOTICES 64
#define AGENT_MAX_ACKS 1024
#define AGENT_ID_FILE "worker-id"

struct agent_ack {
    uint64_t id;
    bool ok;
    char error[128];
};

struct agent_notice {
    char kind[32];
    double at;
    char detail[256];
    bool has_figures;
    struct st_notice_figures figures;
};

struct worker_agent {
    uint32_t magic;
    struct worker_agent_config cfg;
    struct worker_agent_ops ops;
    pthread_mutex_t lock;
    pthread_cond_t cond;      /* wakes the session thread and waiters */
    pthread_t session;
    bool started, quit, finished;
    int fatal;                /* negative errno that ended the agent, or 0 */

    /* session state (lock) */
    grpc_call *watch_call;    /* to cancel it from the session thread */
    bool watch_ended;
    bool watch_cancel;        /* the session is over: the watch thread must not wait */
    bool connected;
    double interval;          /* seconds between Reports, from JoinResponse */
    char job_id[ST_UUID_STR_LEN]; /* from JoinResponse; "" before the first Join */

    /* command state (lock) */
    uint64_t last_applied;    /* highest command id applied */
    uint64_t epoch;           /* the newest epoch a Configure ordered (commands of older ones
                               * are refused) */
    bool stop_applied;
    struct agent_ack acks[AGENT_MAX_ACKS];
    size_t nacks;
    struct agent_notice notices[AGENT_MAX_NOTICES];
    size_t nnotices;
    size_t nsending;          /* the first nsending notices are in a Report under way */

    bool report_now;          /* send a Report without waiting for the interval (lock) */
    char refusal[256];        /* the status details of the last call refused (lock) */

    /* progress (lock) */
    uint64_t run_epoch;       /* the epoch the runner trains in (worker_agent_progress) */
    uint64_t step, samples;
    double loss, step_seconds, stall_seconds;

    /* TLS PEM texts read by worker_agent_new; NULL = not configured */
    char *tls_ca_pem, *tls_cert_pem, *tls_key_pem;
};

void worker_agent_config_init(struct worker_agent_config *cfg) {
    memset(cfg, 0, sizeof(*cfg));
}

int worker_agent_id_load(const char *state_dir, const char *want_id,
                         char ret_id[ST_UUID_STR_LEN]) {
    char path[ST_SPEC_PATH_MAX + 32], id[ST_UUID_STR_LEN];
    char *data = NULL;
    size_t len = 0;
    int r;

    if (want_id && want_id[0] && !st_uuid_valid(want_id))
        return -EINVAL;
    if (!state_dir || !state_dir[0]) {
        if (want_id && want_id[0])
            snprintf(id, sizeof(id), "%s", want_id);
        else
            st_uuid_new(id);
        memcpy(ret_id, id, ST_UUID_STR_LEN);
        return 0;
    }
    TRY(st_mkdir_p(state_dir, 0700));
    snprintf(path, sizeof(path), "%s/%s", state_dir, AGENT_ID_FILE);
    if (want_id && want_id[0]) {
        snprintf(id, sizeof(id), "%s", want_id);
    } else {
        r = st_read_file(path, 256, &data, &len);
        if (r == -ENOENT) {
            st_uuid_new(id);
        } else if (r < 0) {
            return r;
        } else {
            while (len > 0 && (data[len - 1] == '\n' || data[len - 1] == ' '))
                data[--len] = '\0';
            bool ok = st_uuid_valid(data);
            if (ok)
                snprintf(id, sizeof(id), "%s", data);
            st_free(data);
            if (!ok)
                return -EINVAL;
            memcpy(ret_id, id, ST_UUID_STR_LEN);
            return 0;
        }
    }
    char line[ST_UUID_STR_LEN + 1];
    int n = snprintf(line, sizeof(line), "%s\n", id);
    TRY(st_write_file_atomic(path, line, (size_t)n));
    memcpy(ret_id, id, ST_UUID_STR_LEN);
    return 0;
}

/* Reads one PEM file for the TLS channel; logs the path on failure. */
static int read_pem(const char *what, const char *path, char **ret_pem) {
    char *data = NULL;
    size_t len = 0;
    int r = st_read_file(path, 1 << 20, &data, &len);
    if (r < 0)
        return st_log_errno(r, "Cannot read the TLS %s '%s'", what, path);
    if (len == 0 || !strstr(data, "-----BEGIN ")) {
        st_free(data);
        return st_log_errno(-EINVAL, "TLS %s '%s' is not PEM (no '-----BEGIN' line)", what,
                            path);
    }
    *ret_pem = data;
    return 0;
}

/* Frees the PEM texts, wiping the key first. */
static void tls_free(struct worker_agent *a) {
    if (a->tls_key_pem) {
        volatile char *p = a->tls_key_pem;
        while (*p)
            *p++ = '\0';
    }
    st_free(a->tls_key_pem);
    st_free(a->tls_cert_pem);
    st_free(a->tls_ca_pem);
    a->tls_key_pem = a->tls_cert_pem = a->tls_ca_pem = NULL;
}

int worker_agent_new(const struct worker_agent_config *cfg, const struct worker_agent_ops *ops,
                     struct worker_agent **ret_a) {
    if (!cfg || !ret_a || !cfg->coordinator[0] || !st_uuid_valid(cfg->id) || cfg->gpus < 0 ||
        cfg->rpc_timeout < 0 || cfg->backoff_max < 0)
        return -EINVAL;
    if (!cfg->tls_cert[0] != !cfg->tls_key[0] || (cfg->tls_cert[0] && !cfg->tls_ca[0]))
        return -EINVAL;
    struct worker_agent *a = st_calloc(1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    a->magic = AGENT_MAGIC;
    a->cfg = *cfg;
    a->loss = NAN; /* no step, no loss: Reports say no_loss until progress arrives */
    int r = 0;
    if (cfg->tls_ca[0])
        r = read_pem("CA", cfg->tls_ca, &a->tls_ca_pem);
    if (r >= 0 && cfg->tls_cert[0])
        r = read_pem("certificate", cfg->tls_cert, &a->tls_cert_pem);
    if (r >= 0 && cfg->tls_key[0])
        r = read_pem("key", cfg->tls_key, &a->tls_key_pem);
    if (r < 0) {
        tls_free(a);
        st_free(a);
        return r;
    }
    if (a->cfg.rpc_timeout == 0)
        a->cfg.rpc_timeout = 5;
    if (a->cfg.backoff_max == 0)
        a->cfg.backoff_max = 2;
    if (ops)
        a->ops = *ops;
    a->interval = 1;
    pthread_mutex_init(&a->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->cond, &ca);
    pthread_condattr_destroy(&ca);
    *ret_a = a;
    return 0;
}

const char *worker_agent_id(const struct worker_agent *a) {
    return a ? a->cfg.id : "";
}

/* See worker-agent.h. */
void worker_agent_job_id(struct worker_agent *a, char ret_id[ST_UUID_STR_LEN]) {
    pthread_mutex_lock(&a->lock);
    memcpy(ret_id, a->job_id, ST_UUID_STR_LEN);
    pthread_mutex_unlock(&a->lock);
}

uint64_t worker_agent_epoch(struct worker_agent *a) {
    pthread_mutex_lock(&a->lock);
    uint64_t e = a->epoch;
    pthread_mutex_unlock(&a->lock);
    return e;
}

bool worker_agent_connected(struct worker_agent *a) {
    pthread_mutex_lock(&a->lock);
    bool c = a->connected;
    pthread_mutex_unlock(&a->lock);
    return c;
}

void worker_agent_progress(struct worker_agent *a, uint64_t epoch, uint64_t step, double loss,
                           uint64_t samples, double step_seconds, double stall_seconds) {
    /* NAN is this worker's "no loss" (not the last stage); an infinite loss is a bug. */
    if (!a || a->magic != AGENT_MAGIC || isinf(loss) || !isfinite(step_seconds) ||
        !isfinite(stall_seconds) || step_seconds < 0 || stall_seconds < 0)
        return;
    pthread_mutex_lock(&a->lock);
    /* The runner also calls this while it waits (step_seconds 0, only stall to add): the
     * seconds of the step it last made stay those the Report carries. */
    if (step != a->step || step_seconds > 0)
        a->step_seconds = step_seconds;
    a->run_epoch = epoch;
    a->step = step;
    a->loss = loss;
    a->samples = samples;
    a->stall_seconds += stall_seconds;
    pthread_mutex_unlock(&a->lock);
}

void worker_agent_report_now(struct worker_agent *a) {
    if (!a || a->magic != AGENT_MAGIC)
        return;
    pthread_mutex_lock(&a->lock);
    a->report_now = true;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->lock);
}

/* Copies text for a Report field the coordinator takes as printable ASCII only (an ack's
 * error, a notice's detail: coord__validate_report), '?' for any other byte: a UTF-8 path in
 * a message must not get the Report refused, and so sent again and refused forever. */
static void printable(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src ? src : "");
    for (char *p = dst; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
            *p = '?';
}

static int notice_add(struct worker_agent *a, const char *kind, double at, const char *detail,
                      const struct st_notice_figures *figures, bool latest) {
    if (!a || a->magic != AGENT_MAGIC || !kind || !kind[0] || !isfinite(at))
        return -EINVAL;
    pthread_mutex_lock(&a->lock);
    int r = -ENOBUFS;
    /* The new one says all a queued one of its kind did: drop that one, unless a Report
     * under way carries it (its delivery drops the notices it carried from the front). */
    if (latest)
        for (size_t i = a->nsending; i < a->nnotices; i++)
            if (!strcmp(a->notices[i].kind, kind)) {
                memmove(&a->notices[i], &a->notices[i + 1],
                        (a->nnotices - i - 1) * sizeof(a->notices[0]));
                a->nnotices--;
                break;
            }
    if (a->nnotices < AGENT_MAX_NOTICES) {
        struct agent_notice *n = &a->notices[a->nnotices++];
        snprintf(n->kind, sizeof(n->kind), "%s", kind);
        n->at = at;
        printable(n->detail, sizeof(n->detail), detail);
        n->has_figures = figures != NULL;
        if (figures)
            n->figures = *figures;
        pthread_cond_broadcast(&a->cond);
        r = 0;
    }
    pthread_mutex_unlock(&a->lock);
    return r;
}

int worker_agent_notice(struct worker_agent *a, const char *kind, double at,
                        const char *detail, const struct st_notice_figures *figures) {
    return notice_add(a, kind, at, detail, figures, false);
}

int worker_agent_notice_latest(struct worker_agent *a, const char *kind, double at,
                               const char *detail, const struct st_notice_figures *figures) {
    return notice_add(a, kind, at, detail, figures, true);
}

size_t worker_agent_notices_pending(struct worker_agent *a) {
    if (!a || a->magic != AGENT_MAGIC)
        return 0;
    pthread_mutex_lock(&a->lock);
    size_t n = a->nnotices;
    pthread_mutex_unlock(&a->lock);
    return n;
}

/* ---- gRPC plumbing ---------------------------------------------------------------------- */

static gpr_timespec deadline_in(double seconds) {
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis((int64_t)(seconds * 1000), GPR_TIMESPAN));
}

/* Waits for `tag` on a queue that has only that batch outstanding. */
static bool cq_wait(grpc_completion_queue *cq, void *tag) {
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_OP_COMPLETE && ev.tag == tag)
            return ev.success != 0;
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            return false;
    }
}

static void cq_destroy(grpc_completion_queue *cq) {
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
}

static grpc_channel *channel_new(const struct worker_agent *a) {
    grpc_arg args[6];
    args[0] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIME_MS, {.integer = 10000}};
    args[1] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, {.integer = 5000}};
    args[2] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
                         {.integer = 1}};
    args[3] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                         {.integer = 64 << 20}};
    args[4] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
                         {.integer = 100}};
    args[5] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, {.integer = 2000}};
    grpc_channel_args chargs = {ST_ARRAY_SIZE(args), args};
    grpc_channel_credentials *creds;
    if (a->tls_ca_pem) {
        /* Verifies the coordinator's certificate against tls_ca only (never the system
         * roots) and its name or IP against the HOST of cfg.coordinator. */
        grpc_ssl_pem_key_cert_pair pair = {a->tls_key_pem, a->tls_cert_pem};
        creds = grpc_ssl_credentials_create(a->tls_ca_pem, a->tls_cert_pem ? &pair : NULL,
                                            NULL, NULL);
    } else {
        creds = grpc_insecure_credentials_create();
    }
    grpc_channel *ch = grpc_channel_create(a->cfg.coordinator, creds, &chargs);
    grpc_channel_credentials_release(creds);
    return ch;
}

static size_t auth_md(const struct worker_agent *a, grpc_metadata *md) {
    if (!a->cfg.token[0])
        return 0;
    char v[300];
    snprintf(v, sizeof(v), "Bearer %s", a->cfg.token);
    memset(md, 0, sizeof(*md));
    md->key = grpc_slice_from_static_string("authorization");
    md->value = grpc_slice_from_copied_string(v);
    return 1;
}

/* One unary call. Returns 0 with *ret_resp (caller unrefs the slice) when the status is OK,
 * else the gRPC status code as a positive number (details logged), or -ENOMEM. */
static int unary(struct worker_agent *a, grpc_channel *ch, grpc_completion_queue *cq,
                 const char *method, const void *req, size_t len, grpc_slice *ret_resp) {
    grpc_metadata md;
    size_t nmd = auth_md(a, &md);
    grpc_slice path = grpc_slice_from_static_string(method);
    grpc_call *call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, path,
                                               NULL, deadline_in(a->cfg.rpc_timeout), NULL);
    grpc_slice s = grpc_slice_from_copied_buffer(req, len);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_byte_buffer *recv = NULL;
    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = nmd;
    ops[0].data.send_initial_metadata.metadata = nmd ? &md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trail_md;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    int r;
    if (grpc_call_start_batch(call, ops, 6, call, NULL) != GRPC_CALL_OK || !cq_wait(cq, call)) {
        r = GRPC_STATUS_INTERNAL;
    } else if (status != GRPC_STATUS_OK) {
        char *d = grpc_slice_to_c_string(details);
        st_log(ST_LOG_INFO, "agent", "%s: status %d: %s", method, (int)status, d);
        pthread_mutex_lock(&a->lock);
        snprintf(a->refusal, sizeof(a->refusal), "%s", d ? d : "");
        pthread_mutex_unlock(&a->lock);
        gpr_free(d);
        r = (int)status;
    } else if (!recv) {
        r = GRPC_STATUS_INTERNAL;
    } else {
        grpc_byte_buffer_reader rd;
        if (grpc_byte_buffer_reader_init(&rd, recv)) {
            *ret_resp = grpc_byte_buffer_reader_readall(&rd);
            grpc_byte_buffer_reader_destroy(&rd);
            r = 0;
        } else {
            r = GRPC_STATUS_INTERNAL;
        }
    }
    if (recv)
        grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_slice_unref(details);
    if (nmd)
        grpc_slice_unref(md.value);
    grpc_call_unref(call);
    return r;
}

/* ---- commands ----------------------------------------------------------------------------- */

static void add_ack(struct worker_agent *a, uint64_t id, bool ok, const char *err) {
    for (size_t i = 0; i < a->nacks; i++)
        if (a->acks[i].id == id)
            return;
    if (a->nacks == AGENT_MAX_ACKS) {
        st_log(ST_LOG_WARN, "agent", "Too many unsent acks, dropping ack of command %llu",
               (unsigned long long)id);
        return;
    }
    struct agent_ack *k = &a->acks[a->nacks++];
    k->id = id;
    k->ok = ok;
    printable(k->error, sizeof(k->error), err);
}

static void handle_command(struct worker_agent *a, const Spottrain__V1__Command *cmd) {
    char err[128] = "";
    pthread_mutex_lock(&a->lock);
    bool seen = cmd->id <= a->last_applied;
    bool stale = !seen && cmd->body_case != SPOTTRAIN__V1__COMMAND__BODY_STOP &&
                 cmd->epoch < a->epoch;
    pthread_mutex_unlock(&a->lock);
    int r = 0;
    if (seen) {
        st_log(ST_LOG_DEBUG, "agent", "Command %llu redelivered, acknowledging again",
               (unsigned long long)cmd->id);
    } else if (stale) {
        r = -ESTALE;
        snprintf(err, sizeof(err), "command of epoch %llu after epoch %llu",
                 (unsigned long long)cmd->epoch, (unsigned long long)a->epoch);
    } else if (a->ops.on_command) {
        r = a->ops.on_command(a, cmd, err, sizeof(err), a->ops.userdata);
        if (r < 0 && !err[0])
            snprintf(err, sizeof(err), "%s", st_strerror(r));
    }
    pthread_mutex_lock(&a->lock);
    if (!seen && cmd->id > a->last_applied)
        a->last_applied = cmd->id;
    if (!seen && r >= 0 && cmd->body_case == SPOTTRAIN__V1__COMMAND__BODY_CONFIGURE &&
        cmd->epoch > a->epoch)
        a->epoch = cmd->epoch;
    if (r >= 0 && cmd->body_case == SPOTTRAIN__V1__COMMAND__BODY_STOP)
        a->stop_applied = true;
    add_ack(a, cmd->id, r >= 0, err);
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->lock);
}

struct watch_args {
    struct worker_agent *a;
    grpc_channel *ch;
};

static void *watch_main(void *arg) {
    struct watch_args *wa = arg;
    struct worker_agent *a = wa->a;
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_metadata md;
    size_t nmd = auth_md(a, &md);
    uint8_t reqbuf[128];
    Spottrain__V1__WatchRequest req = SPOTTRAIN__V1__WATCH_REQUEST__INIT;
    req.worker_id = a->cfg.id;
    pthread_mutex_lock(&a->lock);
    req.last_applied_command = a->last_applied;
    pthread_mutex_unlock(&a->lock);
    size_t len = spottrain__v1__watch_request__pack(&req, reqbuf);
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)reqbuf, len);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_call *call = grpc_channel_create_call(
        wa->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
        grpc_slice_from_static_string("/spottrain.v1.Coordinator/Watch"), NULL,
        gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    pthread_mutex_lock(&a->lock);
    a->watch_call = call;
    bool quit = a->quit || a->watch_cancel;
    pthread_mutex_unlock(&a->lock);
    if (quit)
        grpc_call_cancel(call, NULL);

    grpc_op ops[4];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = nmd;
    ops[0].data.send_initial_metadata.metadata = nmd ? &md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    bool ok = grpc_call_start_batch(call, ops, 4, &ops[0], NULL) == GRPC_CALL_OK &&
              cq_wait(cq, &ops[0]);
    while (ok) {
        grpc_byte_buffer *recv = NULL;
        grpc_op op;
        memset(&op, 0, sizeof(op));
        op.op = GRPC_OP_RECV_MESSAGE;
        op.data.recv_message.recv_message = &recv;
        if (grpc_call_start_batch(call, &op, 1, &op, NULL) != GRPC_CALL_OK || !cq_wait(cq, &op) ||
            !recv)
            break;
        grpc_byte_buffer_reader rd;
        grpc_slice msg = grpc_empty_slice();
        if (grpc_byte_buffer_reader_init(&rd, recv)) {
            msg = grpc_byte_buffer_reader_readall(&rd);
            grpc_byte_buffer_reader_destroy(&rd);
        }
        grpc_byte_buffer_destroy(recv);
        Spottrain__V1__Command *cmd = spottrain__v1__command__unpack(
            NULL, GRPC_SLICE_LENGTH(msg), GRPC_SLICE_START_PTR(msg));
        grpc_slice_unref(msg);
        if (!cmd || cmd->id == 0) {
            st_log(ST_LOG_WARN, "agent", "Malformed command from the coordinator, ignoring");
            if (cmd)
                spottrain__v1__command__free_unpacked(cmd, NULL);
            continue;
        }
        handle_command(a, cmd);
        spottrain__v1__command__free_unpacked(cmd, NULL);
    }
    /* The stream ended (or failed): collect its status. */
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &trail_md;
    op.data.recv_status_on_client.status = &status;
    op.data.recv_status_on_client.status_details = &details;
    if (grpc_call_start_batch(call, &op, 1, &op, NULL) == GRPC_CALL_OK && cq_wait(cq, &op)) {
        char *d = grpc_slice_to_c_string(details);
        st_log(ST_LOG_INFO, "agent", "Watch stream ended: status %d: %s", (int)status, d);
        gpr_free(d);
    }
    pthread_mutex_lock(&a->lock);
    a->watch_call = NULL;
    a->watch_ended = true;
    if (status == GRPC_STATUS_UNAUTHENTICATED)
        a->fatal = -EACCES;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->lock);
    grpc_call_unref(call);
    grpc_byte_buffer_destroy(send);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_slice_unref(details);
    if (nmd)
        grpc_slice_unref(md.value);
    cq_destroy(cq);
    st_free(wa);
    return NULL;
}

/* ---- session ---------------------------------------------------------------------------- */

/* Returns 0, a positive gRPC status, or negative errno. */
static int do_join(struct worker_agent *a, grpc_channel *ch, grpc_completion_queue *cq) {
    Spottrain__V1__JoinRequest req = SPOTTRAIN__V1__JOIN_REQUEST__INIT;
    req.worker_id = a->cfg.id;
    req.instance_id = a->cfg.instance_id;
    req.zone = a->cfg.zone;
    req.instance_type = a->cfg.instance_type;
    req.gpus = (uint32_t)a->cfg.gpus;
    req.data_addr = a->cfg.data_addr;
    req.protocol = ST_PROTOCOL;
    uint8_t buf[1024];
    size_t len = spottrain__v1__join_request__pack(&req, buf);
    grpc_slice resp;
    int r = unary(a, ch, cq, "/spottrain.v1.Coordinator/Join", buf, len, &resp);
    if (r != 0)
        return r;
    Spottrain__V1__JoinResponse *jr = spottrain__v1__join_response__unpack(
        NULL, GRPC_SLICE_LENGTH(resp), GRPC_SLICE_START_PTR(resp));
    grpc_slice_unref(resp);
    if (!jr)
        return GRPC_STATUS_INTERNAL;
    if (a->cfg.job_id[0] && strcmp(jr->job_id, a->cfg.job_id) != 0) {
        /* An instance booted for one job must not train another that reused the address. */
        st_log(ST_LOG_ERR, "agent", "The coordinator at '%s' runs job '%s' (%s), not %s",
               a->cfg.coordinator, jr->job_name, jr->job_id, a->cfg.job_id);
        spottrain__v1__join_response__free_unpacked(jr, NULL);
        return GRPC_STATUS_FAILED_PRECONDITION;
    }
    pthread_mutex_lock(&a->lock);
    if (isfinite(jr->heartbeat_interval) && jr->heartbeat_interval > 0.001)
        a->interval = jr->heartbeat_interval;
    snprintf(a->job_id, sizeof(a->job_id), "%s", jr->job_id ? jr->job_id : "");
    pthread_mutex_unlock(&a->lock);
    st_log(ST_LOG_NOTICE, "agent", "Joined job '%s' (%s) at epoch %llu%s, reporting every %.2f s",
           jr->job_name, jr->job_id, (unsigned long long)jr->epoch,
           jr->rejoined ? " (rejoined)" : "", a->interval);
    spottrain__v1__join_response__free_unpacked(jr, NULL);
    return 0;
}

/* The proto of a notice's figures; strings point into f. */
static void notice_figures_pb(Spottrain__V1__NoticeFigures *m, struct st_notice_figures *f) {
    spottrain__v1__notice_figures__init(m);
    m->epoch = f->epoch;
    m->step = f->step;
    m->prev_epoch = f->prev_epoch;
    m->prev_step = f->prev_step;
    m->sent = f->sent;
    m->recv = f->recv;
    m->replayed = f->replayed;
    m->prewarmed = f->prewarmed;
    m->need = f->need;
    m->stage = f->stage;
    m->seconds = f->seconds;
    m->step_seconds = f->step_seconds;
    m->blocked = f->blocked;
    m->stall = f->stall;
    m->wait = f->wait;
    m->connect = f->connect;
    m->reshape = f->reshape;
    m->transfer = f->transfer;
    m->commit = f->commit;
    m->deferred = f->deferred;
    m->waited = f->waited;
    m->dir = f->dir;
}

static int do_report(struct worker_agent *a, grpc_channel *ch, grpc_completion_queue *cq,
                     bool *ret_stop_done) {
    Spottrain__V1__ReportRequest req = SPOTTRAIN__V1__REPORT_REQUEST__INIT;
    Spottrain__V1__CommandAck ackv[AGENT_MAX_ACKS], *ackp[AGENT_MAX_ACKS];
    Spottrain__V1__Notice notv[AGENT_MAX_NOTICES], *notp[AGENT_MAX_NOTICES];
    Spottrain__V1__NoticeFigures figv[AGENT_MAX_NOTICES];
    struct agent_ack *acks = st_calloc(AGENT_MAX_ACKS, sizeof(*acks));
    struct agent_notice *nots = st_calloc(AGENT_MAX_NOTICES, sizeof(*nots));
    if (!acks || !nots) {
        st_free(acks);
        st_free(nots);
        return -ENOMEM;
    }
    pthread_mutex_lock(&a->lock);
    size_t nacks = a->nacks, nnot = a->nnotices;
    memcpy(acks, a->acks, nacks * sizeof(*acks));
    memcpy(nots, a->notices, nnot * sizeof(*nots));
    a->nsending = nnot;
    a->report_now = false; /* this Report carries the progress asked for */
    /* The epoch the step is of. A restarted coordinator resumes an epoch from the steps its
     * workers report in it: a worker that has the order of the next epoch but still trains
     * (or is stuck) in the one before must not vouch for the new one (chaos coord-kill: a
     * recovery's epoch resumed at the old epoch's step, and the job hung). */
    req.epoch = a->run_epoch;
    req.step = a->step;
    req.no_loss = isnan(a->loss);
    req.loss = req.no_loss ? 0.0 : a->loss;
    req.samples = a->samples;
    req.step_seconds = a->step_seconds;
    req.stall_seconds = a->stall_seconds;
    bool stopping = a->stop_applied;
    pthread_mutex_unlock(&a->lock);
    req.worker_id = a->cfg.id;
    req.state = (char *)(stopping ? "stopped" : req.epoch ? "configured" : "idle");
    for (size_t i = 0; i < nacks; i++) {
        spottrain__v1__command_ack__init(&ackv[i]);
        ackv[i].id = acks[i].id;
        ackv[i].ok = acks[i].ok;
        ackv[i].error = acks[i].error;
        ackp[i] = &ackv[i];
    }
    for (size_t i = 0; i < nnot; i++) {
        spottrain__v1__notice__init(&notv[i]);
        notv[i].kind = nots[i].kind;
        notv[i].at = nots[i].at;
        notv[i].detail = nots[i].detail;
        if (nots[i].has_figures) {
            notice_figures_pb(&figv[i], &nots[i].figures);
            notv[i].figures = &figv[i];
        }
        notp[i] = &notv[i];
    }
    req.n_acks = nacks;
    req.acks = ackp;
    req.n_notices = nnot;
    req.notices = notp;
    size_t len = spottrain__v1__report_request__get_packed_size(&req);
    uint8_t *buf = st_malloc(len + 1);
    grpc_slice resp;
    int r = -ENOMEM;
    if (buf) {
        spottrain__v1__report_request__pack(&req, buf);
        r = unary(a, ch, cq, "/spottrain.v1.Coordinator/Report", buf, len, &resp);
        st_free(buf);
    }
    pthread_mutex_lock(&a->lock);
    if (r == 0) {
        grpc_slice_unref(resp);
        /* Delivered: forget what was sent (new ones may have arrived meanwhile). */
        size_t keep = 0;
        for (size_t i = 0; i < a->nacks; i++) {
            bool sent = false;
            for (size_t k = 0; k < nacks && !sent; k++)
                sent = acks[k].id == a->acks[i].id;
            if (!sent)
                a->acks[keep++] = a->acks[i];
        }
        a->nacks = keep;
        memmove(a->notices, a->notices + nnot, (a->nnotices - nnot) * sizeof(*a->notices));
        a->nnotices -= nnot;
        a->stall_seconds -= req.stall_seconds;
        if (a->stall_seconds < 0)
            a->stall_seconds = 0;
        *ret_stop_done = stopping;
    }
    a->nsending = 0; /* delivered and dropped, or not: they stay queued, to go again */
    pthread_mutex_unlock(&a->lock);
    st_free(acks);
    st_free(nots);
    return r;
}

static void timed_wait(struct worker_agent *a, double seconds) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t = (double)ts.tv_sec + ts.tv_nsec / 1e9 + seconds;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(&a->cond, &a->lock, &ts);
}

static void *session_main(void *arg) {
    struct worker_agent *a = arg;
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    double backoff = 0.1;
    unsigned seed = (unsigned)(st_now() * 1e6) ^ (unsigned)(uintptr_t)a;

    for (;;) {
        pthread_mutex_lock(&a->lock);
        bool quit = a->quit || a->finished || a->fatal;
        pthread_mutex_unlock(&a->lock);
        if (quit)
            break;
        grpc_channel *ch = channel_new(a);
        int r = do_join(a, ch, cq);
        if (r == GRPC_STATUS_UNAUTHENTICATED || r == GRPC_STATUS_INVALID_ARGUMENT ||
            r == GRPC_STATUS_FAILED_PRECONDITION) {
            pthread_mutex_lock(&a->lock);
            if (r != GRPC_STATUS_FAILED_PRECONDITION) /* a job mismatch was logged by do_join */
                st_log(ST_LOG_ERR, "agent", "The coordinator at '%s' refused to let worker %s "
                       "join (%s: %s)", a->cfg.coordinator, a->cfg.id,
                       r == GRPC_STATUS_UNAUTHENTICATED ? "wrong or missing token"
                                                        : "bad request",
                       a->refusal[0] ? a->refusal : "no reason given");
            a->fatal = r == GRPC_STATUS_UNAUTHENTICATED ? -EACCES
                       : r == GRPC_STATUS_FAILED_PRECONDITION ? -ESRCH : -EINVAL;
            pthread_cond_broadcast(&a->cond);
            pthread_mutex_unlock(&a->lock);
            grpc_channel_destroy(ch);
            break;
        }
        if (r == 0) {
            backoff = 0.1;
            pthread_t wt;
            struct watch_args *wa = st_calloc(1, sizeof(*wa));
            bool watching = false;
            pthread_mutex_lock(&a->lock);
            a->watch_ended = false;
            a->watch_cancel = false;
            pthread_mutex_unlock(&a->lock);
            if (wa) {
                wa->a = a;
                wa->ch = ch;
                watching = pthread_create(&wt, NULL, watch_main, wa) == 0;
                if (!watching)
                    st_free(wa);
            }
            pthread_mutex_lock(&a->lock);
            a->connected = watching;
            pthread_mutex_unlock(&a->lock);
            bool stop_done = false;
            while (watching) {
                r = do_report(a, ch, cq, &stop_done);
                pthread_mutex_lock(&a->lock);
                if (r == 0 && stop_done) {
                    a->finished = true;
                    pthread_cond_broadcast(&a->cond);
                }
                if (r == 0 && !a->quit && !a->finished && !a->watch_ended && !a->fatal &&
                    a->nacks == 0 && a->nnotices == 0 && !a->report_now)
                    timed_wait(a, a->interval);
                bool leave = r != 0 || a->quit || a->finished || a->watch_ended || a->fatal;
                if (a->finished || a->quit)
                    leave = true;
                pthread_mutex_unlock(&a->lock);
                if (leave)
                    break;
            }
            pthread_mutex_lock(&a->lock);
            a->connected = false;
            a->watch_cancel = true;
            if (a->watch_call)
                grpc_call_cancel(a->watch_call, NULL);
            pthread_mutex_unlock(&a->lock);
            if (watching)
                pthread_join(wt, NULL);
        }
        grpc_channel_destroy(ch);
        pthread_mutex_lock(&a->lock);
        if (!a->quit && !a->finished && !a->fatal) {
            double jitter = 0.5 + (double)(rand_r(&seed) % 1000) / 1000.0;
            st_log(ST_LOG_INFO, "agent", "Coordinator '%s' unavailable, retrying in %.2f s",
                   a->cfg.coordinator, backoff * jitter);
            timed_wait(a, backoff * jitter);
            backoff = ST_MIN(backoff * 2, a->cfg.backoff_max);
        }
        pthread_mutex_unlock(&a->lock);
    }
    cq_destroy(cq);
    return NULL;
}

int worker_agent_start(struct worker_agent *a) {
    if (!a || a->magic != AGENT_MAGIC || a->started)
        return -EINVAL;
    grpc_init();
    if (pthread_create(&a->session, NULL, session_main, a) != 0) {
        grpc_shutdown();
        return -EAGAIN;
    }
    a->started = true;
    return 0;
}

int worker_agent_wait(struct worker_agent *a, double timeout) {
    if (!a || a->magic != AGENT_MAGIC)
        return -EINVAL;
    double end = st_now() + timeout;
    pthread_mutex_lock(&a->lock);
    while (!a->finished && !a->fatal) {
        if (timeout >= 0) {
            double left = end - st_now();
            if (left <= 0)
                break;
            timed_wait(a, ST_MIN(left, 1.0));
        } else {
            timed_wait(a, 1.0);
        }
    }
    int r = a->fatal ? a->fatal : a->finished ? 1 : 0;
    pthread_mutex_unlock(&a->lock);
    return r;
}

void worker_agent_stop(struct worker_agent *a) {
    if (!a || a->magic != AGENT_MAGIC || !a->started)
        return;
    pthread_mutex_lock(&a->lock);
    a->quit = true;
    if (a->watch_call)
        grpc_call_cancel(a->watch_call, NULL);
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->lock);
    pthread_join(a->session, NULL);
    a->started = false;
    grpc_shutdown();
}

struct worker_agent *worker_agent_free(struct worker_agent *a) {
    if (!a)
        return NULL;
    worker_agent_stop(a);
    pthread_cond_destroy(&a->cond);
    pthread_mutex_destroy(&a->lock);
    tls_free(a);
    a->magic = 0;
    st_free(a);
    return NULL;
}
