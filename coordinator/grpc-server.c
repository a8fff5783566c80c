/* grpc-server.c: the coordinator's gRPC server on gRPC C core (one completion queue, one
 * thread).
 *
 * One idea: every asynchronous object starts with a struct coord_tag whose fn the queue
 * thread calls on completion, and is freed only in its last completion (libuv's close
 * callback rule). Methods are registered with READ_INITIAL_BYTE_BUFFER so a request arrives
 * with its message; authentication, decoding and validation all happen before the lock is
 * taken to apply it, so a stranger or a malformed message never touches state.
 * Shutdown follows STYLE.md: shutdown_and_notify, cancel everything, wait for the tag,
 * destroy the server, shut the queue down and drain it, grpc_shutdown(). */
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "coord-internal.h"

#define CONTAINER_OF(p, type, member) ((type *)((char *)(p)-offsetof(type, member)))
#define PENDING_PER_METHOD 16

struct coord_tag {
    void (*fn)(struct coord *c, struct coord_tag *t, bool ok);
};

enum { M_JOIN = 0, M_WATCH, M_REPORT, M_UNKNOWN };
static const char *const method_paths[] = {"/spottrain.v1.Coordinator/Join",
                                           "/spottrain.v1.Coordinator/Watch",
                                           "/spottrain.v1.Coordinator/Report", NULL};

struct coord_rpc {
    struct coord_tag tag;
    int method;
    bool responding;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_call_details details; /* M_UNKNOWN only */
    grpc_byte_buffer *payload;
    grpc_byte_buffer *resp;
    grpc_slice status_details;
    int cancelled;
};

struct coord_qitem {
    struct coord_qitem *next;
    grpc_byte_buffer *bb;
};

struct coord_watch {
    struct coord_tag close_tag;
    struct coord_tag write_tag;
    grpc_call *call;
    struct coord_wk *wk; /* NULL once detached */
    struct coord_qitem *head, *tail;
    grpc_byte_buffer *inflight;
    bool writing, closed, ended;
    int cancelled;
};

static struct coord_tag shutdown_tag;

static void rpc_free(struct coord_rpc *rpc) {
    if (!rpc)
        return;
    if (rpc->call)
        grpc_call_unref(rpc->call);
    grpc_metadata_array_destroy(&rpc->md);
    if (rpc->method == M_UNKNOWN)
        grpc_call_details_destroy(&rpc->details);
    if (rpc->payload)
        grpc_byte_buffer_destroy(rpc->payload);
    if (rpc->resp)
        grpc_byte_buffer_destroy(rpc->resp);
    grpc_slice_unref(rpc->status_details);
    st_free(rpc);
}

static void on_rpc(struct coord *c, struct coord_tag *t, bool ok);

/* Lock held. Requests one more call of the given method. */
static int request_call(struct coord *c, int method) {
    if (c->shutting_down)
        return 0;
    struct coord_rpc *rpc = st_calloc(1, sizeof(*rpc));
    if (!rpc)
        return -ENOMEM;
    rpc->tag.fn = on_rpc;
    rpc->method = method;
    rpc->status_details = grpc_empty_slice();
    grpc_metadata_array_init(&rpc->md);
    grpc_call_error e;
    if (method == M_UNKNOWN) {
        grpc_call_details_init(&rpc->details);
        e = grpc_server_request_call(c->server, &rpc->call, &rpc->details, &rpc->md, c->cq,
                                     c->cq, &rpc->tag);
    } else {
        void *m = method == M_JOIN ? c->m_join : method == M_WATCH ? c->m_watch : c->m_report;
        e = grpc_server_request_registered_call(c->server, m, &rpc->call, &rpc->deadline,
                                                &rpc->md, &rpc->payload, c->cq, c->cq,
                                                &rpc->tag);
    }
    if (e != GRPC_CALL_OK) {
        st_log(ST_LOG_ERR, "grpc", "Requesting a call failed (%d)", (int)e);
        rpc_free(rpc);
        return -EIO;
    }
    return 0;
}

static void on_rpc_done(struct coord *c, struct coord_tag *t, bool ok) {
    (void)c;
    (void)ok;
    rpc_free(CONTAINER_OF(t, struct coord_rpc, tag));
}

/* Sends the response (resp may be NULL) and status; the rpc is freed when that completes. */
static void respond(struct coord *c, struct coord_rpc *rpc, grpc_status_code code,
                    const char *msg, const void *resp, size_t len) {
    grpc_op ops[4];
    size_t n = 0;
    memset(ops, 0, sizeof(ops));
    (void)c;
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    n++;
    if (resp && code == GRPC_STATUS_OK) {
        grpc_slice s = grpc_slice_from_copied_buffer(resp, len);
        rpc->resp = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = rpc->resp;
        n++;
    }
    rpc->status_details = grpc_slice_from_copied_string(msg ? msg : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = code;
    ops[n].data.send_status_from_server.status_details = &rpc->status_details;
    n++;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n].data.recv_close_on_server.cancelled = &rpc->cancelled;
    n++;
    rpc->responding = true;
    rpc->tag.fn = on_rpc_done;
    grpc_call_error e = grpc_call_start_batch(rpc->call, ops, n, &rpc->tag, NULL);
    if (e != GRPC_CALL_OK) {
        st_log(ST_LOG_WARN, "grpc", "Answering a call failed (%d), dropping it", (int)e);
        rpc_free(rpc);
    }
}

bool coord__auth_ok(const struct coord *c, const grpc_metadata_array *md) {
    if (!c->cfg.token[0])
        return true;
    char want[sizeof(c->cfg.token) + 8];
    int wlen = snprintf(want, sizeof(want), "Bearer %s", c->cfg.token);
    for (size_t i = 0; i < md->count; i++) {
        const grpc_slice *k = &md->metadata[i].key, *v = &md->metadata[i].value;
        if (GRPC_SLICE_LENGTH(*k) != 13 ||
            memcmp(GRPC_SLICE_START_PTR(*k), "authorization", 13) != 0)
            continue;
        if (GRPC_SLICE_LENGTH(*v) != (size_t)wlen)
            return false;
        const unsigned char *p = GRPC_SLICE_START_PTR(*v);
        unsigned char diff = 0;
        for (int b = 0; b < wlen; b++)
            diff |= (unsigned char)(p[b] ^ (unsigned char)want[b]);
        return diff == 0;
    }
    return false;
}

/* Flattens the request payload; caller unrefs the slice. */
static grpc_slice payload_slice(grpc_byte_buffer *bb) {
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb))
        return grpc_empty_slice();
    grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    return s;
}

/* ---- Watch streams ------------------------------------------------------------------ */

static void watch_maybe_free(struct coord_watch *w) {
    if (!w->closed || w->writing)
        return;
    while (w->head) {
        struct coord_qitem *q = w->head;
        w->head = q->next;
        grpc_byte_buffer_destroy(q->bb);
        st_free(q);
    }
    grpc_call_unref(w->call);
    st_free(w);
}

static void watch_detach(struct coord_watch *w) {
    if (w->wk && w->wk->watch == w)
        w->wk->watch = NULL;
    w->wk = NULL;
}

static void watch_kick(struct coord_watch *w) {
    if (w->writing || w->closed || w->ended || !w->head)
        return;
    struct coord_qitem *q = w->head;
    w->head = q->next;
    if (!w->head)
        w->tail = NULL;
    w->inflight = q->bb;
    st_free(q);
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = w->inflight;
    w->writing = true;
    if (grpc_call_start_batch(w->call, &op, 1, &w->write_tag, NULL) != GRPC_CALL_OK) {
        st_log(ST_LOG_WARN, "grpc", "Writing to a Watch stream failed, ending it");
        w->writing = false;
        grpc_byte_buffer_destroy(w->inflight);
        w->inflight = NULL;
    }
}

static void on_watch_write(struct coord *c, struct coord_tag *t, bool ok) {
    struct coord_watch *w = CONTAINER_OF(t, struct coord_watch, write_tag);
    pthread_mutex_lock(&c->lock);
    w->writing = false;
    grpc_byte_buffer_destroy(w->inflight);
    w->inflight = NULL;
    if (ok)
        watch_kick(w);
    watch_maybe_free(w);
    pthread_mutex_unlock(&c->lock);
}

static void on_watch_close(struct coord *c, struct coord_tag *t, bool ok) {
    struct coord_watch *w = CONTAINER_OF(t, struct coord_watch, close_tag);
    (void)ok;
    pthread_mutex_lock(&c->lock);
    if (w->wk)
        st_log(ST_LOG_INFO, "grpc", "Watch stream of worker %s closed", w->wk->pub.id);
    w->closed = true;
    watch_detach(w);
    watch_maybe_free(w);
    pthread_mutex_unlock(&c->lock);
}

int coord__watch_push(struct coord *c, struct coord_watch *w, const void *data, size_t len) {
    (void)c;
    if (w->closed || w->ended)
        return 0;
    struct coord_qitem *q = st_calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
    grpc_slice s = grpc_slice_from_copied_buffer(data, len);
    q->bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    if (w->tail)
        w->tail->next = q;
    else
        w->head = q;
    w->tail = q;
    watch_kick(w);
    return 0;
}

void coord__watch_end(struct coord *c, struct coord_watch *w, grpc_status_code code,
                      const char *why) {
    (void)c;
    if (w->ended)
        return;
    w->ended = true;
    watch_detach(w);
    grpc_call_cancel_with_status(w->call, code, why, NULL);
}

static void start_watch(struct coord *c, struct coord_rpc *rpc,
                        const Spottrain__V1__WatchRequest *req) {
    pthread_mutex_lock(&c->lock);
    struct coord_wk *wk = coord__worker_find(c, req->worker_id);
    if (!wk || wk->pub.state == COORD_WORKER_LOST || wk->pub.state == COORD_WORKER_STOPPED) {
        pthread_mutex_unlock(&c->lock);
        respond(c, rpc, GRPC_STATUS_NOT_FOUND, "unknown or lost worker: Join first", NULL, 0);
        return;
    }
    struct coord_watch *w = st_calloc(1, sizeof(*w));
    if (!w) {
        pthread_mutex_unlock(&c->lock);
        respond(c, rpc, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory", NULL, 0);
        return;
    }
    if (wk->watch)
        coord__watch_end(c, wk->watch, GRPC_STATUS_ABORTED, "superseded by a newer Watch");
    w->close_tag.fn = on_watch_close;
    w->write_tag.fn = on_watch_write;
    w->call = rpc->call;
    rpc->call = NULL;
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[1].data.recv_close_on_server.cancelled = &w->cancelled;
    if (grpc_call_start_batch(w->call, ops, 2, &w->close_tag, NULL) != GRPC_CALL_OK) {
        grpc_call_unref(w->call);
        st_free(w);
        pthread_mutex_unlock(&c->lock);
        rpc_free(rpc);
        return;
    }
    w->wk = wk;
    wk->watch = w;
    wk->last_seen = st_now();
    int r = coord__watch_fill(c, wk, w);
    if (r < 0)
        coord__watch_end(c, w, GRPC_STATUS_UNAVAILABLE, "journal read failed");
    st_log(ST_LOG_INFO, "grpc", "Watch stream of worker %s open", wk->pub.id);
    pthread_mutex_unlock(&c->lock);
    rpc_free(rpc);
}

/* ---- unary methods ---------------------------------------------------------------------- */

/* See coord-internal.h. */
void coord__notice_figures(struct st_notice_figures *f, const Spottrain__V1__NoticeFigures *m) {
    if (!m) {
        *f = (struct st_notice_figures){0};
        return;
    }
    *f = (struct st_notice_figures){
        .epoch = m->epoch, .step = m->step, .prev_epoch = m->prev_epoch,
        .prev_step = m->prev_step, .sent = m->sent, .recv = m->recv, .replayed = m->replayed,
        .prewarmed = m->prewarmed, .need = m->need, .stage = m->stage, .seconds = m->seconds,
        .step_seconds = m->step_seconds, .blocked = m->blocked, .stall = m->stall,
        .wait = m->wait, .connect = m->connect, .reshape = m->reshape,
        .transfer = m->transfer, .commit = m->commit, .deferred = m->deferred,
        .waited = m->waited};
    snprintf(f->dir, sizeof(f->dir), "%s", m->dir ? m->dir : "");
}

static void handle(struct coord *c, struct coord_rpc *rpc) {
    char why[256] = "";
    if (rpc->method == M_UNKNOWN) {
        respond(c, rpc, GRPC_STATUS_UNIMPLEMENTED, "unknown method", NULL, 0);
        return;
    }
    if (!coord__auth_ok(c, &rpc->md)) {
        pthread_mutex_lock(&c->lock);
        c->rejected_auth++;
        pthread_mutex_unlock(&c->lock);
        respond(c, rpc, GRPC_STATUS_UNAUTHENTICATED, "missing or wrong bearer token", NULL, 0);
        return;
    }
    if (!rpc->payload) {
        pthread_mutex_lock(&c->lock);
        c->rejected_invalid++;
        pthread_mutex_unlock(&c->lock);
        respond(c, rpc, GRPC_STATUS_INVALID_ARGUMENT, "missing request message", NULL, 0);
        return;
    }
    grpc_slice s = payload_slice(rpc->payload);
    const uint8_t *data = GRPC_SLICE_START_PTR(s);
    size_t len = GRPC_SLICE_LENGTH(s);
    ProtobufCMessage *msg = NULL;
    int r = 0;
    switch (rpc->method) {
    case M_JOIN: {
        Spottrain__V1__JoinRequest *m = spottrain__v1__join_request__unpack(NULL, len, data);
        msg = m ? &m->base : NULL;
        r = m ? coord__validate_join(m, why, sizeof(why)) : -EBADMSG;
        break;
    }
    case M_WATCH: {
        Spottrain__V1__WatchRequest *m = spottrain__v1__watch_request__unpack(NULL, len, data);
        msg = m ? &m->base : NULL;
        r = m ? coord__validate_watch(m, why, sizeof(why)) : -EBADMSG;
        break;
    }
    default: {
        Spottrain__V1__ReportRequest *m = spottrain__v1__report_request__unpack(NULL, len, data);
        msg = m ? &m->base : NULL;
        r = m ? coord__validate_report(m, why, sizeof(why)) : -EBADMSG;
        break;
    }
    }
    grpc_slice_unref(s);
    if (r < 0 || !msg) {
        pthread_mutex_lock(&c->lock);
        c->rejected_invalid++;
        pthread_mutex_unlock(&c->lock);
        if (r == -EBADMSG || !msg)
            snprintf(why, sizeof(why), "malformed %s message",
                     rpc->method == M_JOIN ? "JoinRequest"
                     : rpc->method == M_WATCH ? "WatchRequest" : "ReportRequest");
        st_log(ST_LOG_INFO, "grpc", "Rejected %s: %s", method_paths[rpc->method], why);
        respond(c, rpc, GRPC_STATUS_INVALID_ARGUMENT, why, NULL, 0);
        if (msg)
            protobuf_c_message_free_unpacked(msg, NULL);
        return;
    }

    if (rpc->method == M_WATCH) {
        start_watch(c, rpc, (Spottrain__V1__WatchRequest *)msg);
    } else if (rpc->method == M_JOIN) {
        Spottrain__V1__JoinRequest *m = (Spottrain__V1__JoinRequest *)msg;
        Spottrain__V1__JoinResponse resp = SPOTTRAIN__V1__JOIN_RESPONSE__INIT;
        char job_id[ST_UUID_STR_LEN], job_name[128];
        bool rejoined = false;
        pthread_mutex_lock(&c->lock);
        r = coord__apply_join(c, m, &rejoined);
        snprintf(job_id, sizeof(job_id), "%s", c->job.id);
        snprintf(job_name, sizeof(job_name), "%s", c->job.name);
        resp.epoch = c->job.epoch;
        pthread_mutex_unlock(&c->lock);
        if (r < 0) {
            respond(c, rpc, r == -EUSERS ? GRPC_STATUS_RESOURCE_EXHAUSTED : GRPC_STATUS_INTERNAL,
                    st_strerror(r), NULL, 0);
        } else {
            resp.job_id = job_id;
            resp.job_name = job_name;
            resp.heartbeat_interval = coord__heartbeat_interval(c);
            resp.heartbeat_deadline = coord__deadline(c);
            resp.rejoined = rejoined;
            uint8_t buf[512];
            size_t n = spottrain__v1__join_response__pack(&resp, buf);
            respond(c, rpc, GRPC_STATUS_OK, "", buf, n);
        }
    } else {
        Spottrain__V1__ReportRequest *m = (Spottrain__V1__ReportRequest *)msg;
        Spottrain__V1__ReportResponse resp = SPOTTRAIN__V1__REPORT_RESPONSE__INIT;
        pthread_mutex_lock(&c->lock);
        r = coord__apply_report(c, m);
        resp.epoch = c->job.epoch;
        resp.stop = c->job.state == COORD_JOB_STOPPING || c->job.state == COORD_JOB_STOPPED;
        pthread_mutex_unlock(&c->lock);
        if (r == -ENOENT) {
            respond(c, rpc, GRPC_STATUS_NOT_FOUND, "unknown or lost worker: Join first", NULL, 0);
        } else if (r < 0) {
            respond(c, rpc, GRPC_STATUS_INTERNAL, st_strerror(r), NULL, 0);
        } else {
            if (c->hooks.on_report) {
                struct coord_notice nv[COORD_MAX_NOTICES];
                for (size_t i = 0; i < m->n_notices; i++) {
                    nv[i] = (struct coord_notice){m->notices[i]->kind, m->notices[i]->at,
                                                  m->notices[i]->detail, {0}};
                    coord__notice_figures(&nv[i].figures, m->notices[i]->figures);
                }
                struct coord_report rep = {m->worker_id, m->epoch, m->step, m->samples,
                                           m->loss, m->step_seconds, m->stall_seconds,
                                           m->state, nv, m->n_notices};
                c->hooks.on_report(c, &rep, c->hooks.userdata);
            }
            uint8_t buf[64];
            size_t n = spottrain__v1__report_response__pack(&resp, buf);
            respond(c, rpc, GRPC_STATUS_OK, "", buf, n);
        }
    }
    protobuf_c_message_free_unpacked(msg, NULL);
}

static void on_rpc(struct coord *c, struct coord_tag *t, bool ok) {
    struct coord_rpc *rpc = CONTAINER_OF(t, struct coord_rpc, tag);
    if (!ok) { /* the server is shutting down */
        rpc_free(rpc);
        return;
    }
    pthread_mutex_lock(&c->lock);
    (void)request_call(c, rpc->method);
    pthread_mutex_unlock(&c->lock);
    handle(c, rpc);
}

static void on_shutdown(struct coord *c, struct coord_tag *t, bool ok) {
    (void)t;
    (void)ok;
    grpc_server_destroy(c->server);
    c->server = NULL;
    grpc_completion_queue_shutdown(c->cq);
}

static void *cq_main(void *arg) {
    struct coord *c = arg;
    for (;;) {
        double tick = c->cfg.tick;
        gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                       gpr_time_from_millis((int64_t)(tick * 1000) / 2 + 1,
                                                            GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(c->cq, dl, NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE) {
            struct coord_tag *t = ev.tag;
            t->fn(c, t, ev.success != 0);
        }
        double now = st_now();
        bool ticked = false;
        pthread_mutex_lock(&c->lock);
        if (!c->shutting_down && now - c->last_tick >= tick) {
            c->last_tick = now;
            coord__tick(c, now);
            ticked = true;
        }
        pthread_mutex_unlock(&c->lock);
        coord__run_notes(c);
        if (ticked && c->hooks.on_tick)
            c->hooks.on_tick(c, now, c->hooks.userdata);
    }
    return NULL;
}

int coord__grpc_start(struct coord *c) {
    char host[COORD_ADDR_MAX];
    int port = 0, r = 0;
    TRY(coord__parse_hostport(c->cfg.listen, host, sizeof(host), &port));
    grpc_init();
    grpc_arg args[7];
    /* gRPC sets SO_REUSEPORT by default: a second coordinator would share the port. */
    args[6] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_ALLOW_REUSEPORT, {.integer = 0}};
    args[0] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                         {.integer = (int)c->cfg.max_message}};
    args[1] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIME_MS, {.integer = 20000}};
    args[2] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, {.integer = 10000}};
    args[3] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
                         {.integer = 1}};
    args[4] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                         {.integer = 5000}};
    args[5] = (grpc_arg){GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MAX_PING_STRIKES, {.integer = 0}};
    grpc_channel_args chargs = {ST_ARRAY_SIZE(args), args};
    c->cq = grpc_completion_queue_create_for_next(NULL);
    c->server = grpc_server_create(&chargs, NULL);
    grpc_server_register_completion_queue(c->server, c->cq, NULL);
    c->m_join = grpc_server_register_method(c->server, method_paths[M_JOIN], NULL,
                                            GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    c->m_watch = grpc_server_register_method(c->server, method_paths[M_WATCH], NULL,
                                             GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    c->m_report = grpc_server_register_method(c->server, method_paths[M_REPORT], NULL,
                                              GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    grpc_server_credentials *creds;
    if (c->tls_cert_pem) {
        /* TLS; with a client CA, a client without a certificate chaining to it is refused
         * in the handshake, before any RPC exists. */
        grpc_ssl_pem_key_cert_pair pair = {c->tls_key_pem, c->tls_cert_pem};
        creds = grpc_ssl_server_credentials_create_ex(
            c->tls_ca_pem, &pair, 1,
            c->tls_ca_pem ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                          : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
    } else {
        creds = grpc_insecure_server_credentials_create();
    }
    int bound = creds ? grpc_server_add_http2_port(c->server, c->cfg.listen, creds) : 0;
    if (creds)
        grpc_server_credentials_release(creds);
    else
        st_log(ST_LOG_ERR, "coord", "gRPC refused the TLS certificate or key");
    if (bound <= 0 || !c->m_join || !c->m_watch || !c->m_report) {
        r = st_log_errno(-EADDRNOTAVAIL, "Cannot listen for gRPC on '%s' (in use or not a local "
                         "address%s)", c->cfg.listen,
                         c->tls_cert_pem ? ", or a TLS certificate and key that do not match"
                                         : "");
        /* Never started: destroying needs no shutdown notification. */
        grpc_server_destroy(c->server);
        c->server = NULL;
        grpc_completion_queue_shutdown(c->cq);
        while (grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN)
            ;
        grpc_completion_queue_destroy(c->cq);
        c->cq = NULL;
        grpc_shutdown();
        return r;
    }
    snprintf(c->grpc_addr, sizeof(c->grpc_addr), "%s:%d", c->cfg.listen[0] == '[' ? "" : host,
             bound);
    if (c->cfg.listen[0] == '[')
        snprintf(c->grpc_addr, sizeof(c->grpc_addr), "[%s]:%d", host, bound);
    grpc_server_start(c->server);
    pthread_mutex_lock(&c->lock);
    for (int m = M_JOIN; m <= M_REPORT; m++)
        for (int i = 0; i < PENDING_PER_METHOD; i++)
            TRY_KEEP(r, request_call(c, m));
    TRY_KEEP(r, request_call(c, M_UNKNOWN));
    pthread_mutex_unlock(&c->lock);
    shutdown_tag.fn = on_shutdown;
    c->last_tick = st_now();
    if (r < 0 || pthread_create(&c->cq_thread, NULL, cq_main, c) != 0) {
        /* Run the normal shutdown path on this thread instead. */
        c->shutting_down = true;
        grpc_server_shutdown_and_notify(c->server, c->cq, &shutdown_tag);
        grpc_server_cancel_all_calls(c->server);
        for (;;) {
            grpc_event ev = grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                                       NULL);
            if (ev.type == GRPC_QUEUE_SHUTDOWN)
                break;
            struct coord_tag *t = ev.tag;
            t->fn(c, t, false);
        }
        grpc_completion_queue_destroy(c->cq);
        c->cq = NULL;
        grpc_shutdown();
        return r < 0 ? r : -EAGAIN;
    }
    c->cq_started = true;
    return 0;
}

void coord__grpc_stop(struct coord *c) {
    if (!c->cq_started)
        return;
    pthread_mutex_lock(&c->lock);
    c->shutting_down = true;
    /* End every stream now so the shutdown does not wait on them. */
    for (size_t k = 0; k < c->nworkers; k++)
        if (c->workers[k]->watch)
            coord__watch_end(c, c->workers[k]->watch, GRPC_STATUS_UNAVAILABLE,
                             "coordinator shutting down");
    grpc_server_shutdown_and_notify(c->server, c->cq, &shutdown_tag);
    grpc_server_cancel_all_calls(c->server);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->cq_thread, NULL);
    grpc_completion_queue_destroy(c->cq);
    c->cq = NULL;
    c->cq_started = false;
    grpc_shutdown();
}
