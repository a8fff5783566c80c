/* rest.c: the coordinator's REST status API and Prometheus /metrics on libmicrohttpd.
 *
 * One idea: every answer is built under the coordinator lock into a jansson object (or the
 * metrics text), then sent after the lock is released; every error is JSON
 * {"code": ..., "message": ...}. The routes and shapes are exactly those of
 * docs/openapi.yaml, which schemathesis checks against this code. coord__rest_handle() answers
 * one request given as plain data, so libmicrohttpd's callback (on_request) and the fuzz target
 * (tests/fuzz/fuzz-rest.c) run the same code. */
#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#ifdef COORD_HAVE_GNUTLS
#include <gnutls/gnutls.h>
#endif
#include <math.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h> /* strcasecmp */
#include <sys/socket.h>

#include "check.h"
#include "coord-internal.h"

#define REST_MAX_BODY 65536
#define EVENTS_MAX_LIMIT 1000

/* Per-connection state, to swallow (bounded) request bodies. */
struct rest_req {
    size_t body;
    bool too_big;
};

/* The exchange the routes answer: the request and the reply being filled. Named conn in the
 * routes, where it stands for the client's connection. */
struct rest_exchange {
    const struct coord_rest_request *rq;
    struct coord_rest_reply *rep;
};

/* Takes text (malloc()ed; freed by coord__rest_reply_done or by libmicrohttpd). */
static int send_text(struct rest_exchange *conn, unsigned status, const char *ctype, char *text,
                     const char *allow) {
    struct coord_rest_reply *rep = conn->rep;
    rep->status = status;
    rep->content_type = ctype;
    rep->allow = allow;
    rep->asset = false;
    rep->body = text;
    rep->len = strlen(text);
    return 0;
}

/* A compiled-in asset (page.c): never copied, never freed. */
static int send_static(struct rest_exchange *conn, const char *ctype, const unsigned char *data,
                       size_t len) {
    struct coord_rest_reply *rep = conn->rep;
    rep->status = MHD_HTTP_OK;
    rep->content_type = ctype;
    rep->allow = NULL;
    rep->asset = true;
    rep->body = (char *)data;
    rep->len = len;
    return 0;
}

/* Takes a reference to j. The text is malloc()ed: jansson allocates with malloc. */
static int send_json(struct rest_exchange *conn, unsigned status, json_t *j, const char *allow) {
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!text)
        return -ENOMEM;
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (!t2) {
        free(text);
        return -ENOMEM;
    }
    t2[n] = '\n';
    t2[n + 1] = '\0';
    return send_text(conn, status, "application/json", t2, allow);
}

static int send_error(struct rest_exchange *conn, unsigned status, const char *code,
                      const char *allow, const char *fmt, ...) ST_PRINTF(5, 6);
static int send_error(struct rest_exchange *conn, unsigned status, const char *code,
                      const char *allow, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return send_json(conn, status, json_pack("{s:s, s:s}", "code", code, "message", msg), allow);
}

/* The planner's decisions (coord_planner_record): "last" is null before the first one. */
static json_t *planner_json(struct coord *c) {
    const struct coord_planner_decision *d = &c->planner_last;
    json_t *last = json_null();
    if (c->planner_decisions > 0)
        last = json_pack("{s:i, s:i, s:I, s:f, s:f, s:s}", "dp", d->dp, "pp", d->pp, "at_step",
                         (json_int_t)d->at_step, "expected_samples_per_s",
                         isfinite(d->expected_samples_per_s) ? d->expected_samples_per_s : 0.0,
                         "decide_seconds", d->decide_seconds, "reason", d->reason);
    return json_pack("{s:s, s:I, s:o}", "predictor",
                     c->planner_predictor[0] ? c->planner_predictor : c->spec.planner.predictor,
                     "decisions", (json_int_t)c->planner_decisions, "last", last);
}

/* Each kind's totals, keyed by the /metrics label, so a client reads the same figures both
 * ways (the summary of `spottrain run` spells the kinds with hyphens; the API keeps the
 * names its history and metrics already use). */
static json_t *migrations_json(const struct coord *c) {
    json_t *m = json_object();
    for (int k = 0; m && k < PLAN_RECONF_NKINDS; k++)
        if (coord__counted_kind((enum plan_reconf)k))
            json_object_set_new(m, plan_reconf_label((enum plan_reconf)k),
                                json_pack("{s:I, s:I, s:f, s:I}", "count",
                                          (json_int_t)c->mig_count[k], "bytes",
                                          (json_int_t)c->mig_bytes[k], "stall_seconds",
                                          c->mig_stall[k], "steps_replayed",
                                          (json_int_t)c->mig_replayed[k]));
    return m;
}

/* {"count": n, "stall_seconds_predicted": mean, "stall_seconds_measured": mean} (null means
 * when n is 0). */
static json_t *stall_json(uint64_t n, double predicted, double measured) {
    return json_pack("{s:I, s:o, s:o}", "count", (json_int_t)n, "stall_seconds_predicted",
                     n ? json_real(predicted / (double)n) : json_null(),
                     "stall_seconds_measured", n ? json_real(measured / (double)n) : json_null());
}

/* The planner's cost model against what happened: means (null before any), counts. */
static json_t *cost_model_json(const struct coord *c) {
    const struct coord_cost_model *cm = &c->cost_model;
    json_t *kinds = json_object();
    for (int k = 0; kinds && k < PLAN_RECONF_NLIVE; k++) {
        json_t *o = stall_json(cm->n[k], cm->stall_predicted[k], cm->stall_measured[k]);
        if (o)
            json_object_set_new(o, "calibrated",
                                stall_json(cm->cal_n[k], cm->cal_predicted[k],
                                           cm->cal_measured[k]));
        json_object_set_new(kinds, plan_reconf_label((enum plan_reconf)k), o);
    }
    bool steps = cm->steps > 0;
    return json_pack("{s:I, s:o, s:o, s:o}", "steps", (json_int_t)cm->steps,
                     "step_seconds_predicted",
                     steps ? json_real(cm->step_predicted / (double)cm->steps) : json_null(),
                     "step_seconds_measured",
                     steps ? json_real(cm->step_measured / (double)cm->steps) : json_null(),
                     "kinds", kinds ? kinds : json_null());
}

static json_t *job_json(struct coord *c) {
    size_t counts[COORD_WORKER_NSTATES];
    coord__count_states(c, counts);
    json_t *ws = json_object();
    for (int s = 0; s < COORD_WORKER_NSTATES; s++)
        json_object_set_new(ws, coord_worker_state_name((enum coord_worker_state)s),
                            json_integer((json_int_t)counts[s]));
    json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:{s:i, s:i}, s:I, s:I, s:f, s:I, s:f, s:f,"
                          " s:o, s:I}",
                          "id", c->job.id, "name", c->job.name, "state",
                          coord_job_state_name(c->job.state), "epoch", (json_int_t)c->job.epoch,
                          "shape", "dp", c->job.dp, "pp", c->job.pp, "step",
                          (json_int_t)c->job.step, "samples", (json_int_t)c->job.samples, "loss",
                          c->job.loss, "loss_step", (json_int_t)c->loss_step,
                          "samples_per_second", c->samples_per_second, "created",
                          c->job.created, "workers", ws, "target_steps",
                          (json_int_t)c->spec.training.steps);
    if (j) {
        json_object_set_new(j, "planner", planner_json(c));
        json_object_set_new(j, "waiting_reason", json_string(c->waiting_reason));
        json_object_set_new(j, "spot_price_per_hour",
                            json_real(c->spot_price_live > 0 ? c->spot_price_live
                                                             : c->spec.fleet.spot_price));
        json_object_set_new(j, "spot_price_live", json_boolean(c->spot_price_live > 0));
        json_object_set_new(j, "migrations", migrations_json(c));
        json_object_set_new(j, "cost_model", cost_model_json(c));
    }
    return j;
}

static json_t *worker_json(const struct coord_worker *w) {
    return json_pack("{s:s, s:s, s:s, s:s, s:i, s:s, s:s, s:I, s:i, s:i, s:i, s:i, s:I, s:I,"
                     " s:f, s:f, s:f, s:b}",
                     "id", w->id, "instance_id", w->instance_id, "zone", w->zone,
                     "instance_type", w->instance_type, "gpus", w->gpus, "data_addr",
                     w->data_addr, "state", coord_worker_state_name(w->state), "epoch",
                     (json_int_t)w->epoch, "stage", w->stage, "replica", w->replica,
                     "layer_begin", w->layer_begin, "layer_end", w->layer_end, "acked_command",
                     (json_int_t)w->acked_command, "step", (json_int_t)w->step, "loss", w->loss,
                     "joined", w->joined, "last_seen_seconds_ago", w->last_seen_ago,
                     "watching", w->watching);
}

static int event_to_json(int64_t seq, double time, const char *kind, const char *worker_id,
                         const char *message, void *userdata) {
    json_t *arr = userdata;
    json_t *e = json_pack("{s:I, s:f, s:s, s:s?, s:s}", "seq", (json_int_t)seq, "time", time,
                          "kind", kind, "worker_id", worker_id, "message", message);
    if (!e)
        return -ENOMEM;
    if (!worker_id)
        json_object_set_new(e, "worker_id", json_null());
    return json_array_append_new(arr, e) == 0 ? 0 : -ENOMEM;
}

/* Parses a non-negative decimal integer query parameter. */
static int parse_nonneg(const char *s, long long max, long long *ret) {
    if (!s || !*s)
        return -EINVAL;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9')
            return -EINVAL;
    if (strlen(s) > 18)
        return -ERANGE;
    long long v = strtoll(s, NULL, 10);
    if (v > max)
        return -ERANGE;
    *ret = v;
    return 0;
}

/* The first value of a header (names compare without case, as HTTP says) or NULL. */
static const char *header_value(const struct coord_rest_request *rq, const char *name) {
    for (size_t i = 0; i < rq->nheaders; i++)
        if (strcasecmp(rq->headers[i].name, name) == 0)
            return rq->headers[i].value;
    return NULL;
}

/* The first value of a query argument or NULL. */
static const char *arg_value(const struct coord_rest_request *rq, const char *name) {
    for (size_t i = 0; i < rq->nargs; i++)
        if (strcmp(rq->args[i].name, name) == 0)
            return rq->args[i].value;
    return NULL;
}

static bool http_auth_ok(struct coord *c, struct rest_exchange *conn) {
    if (!c->cfg.token[0])
        return true;
    const char *h = header_value(conn->rq, "Authorization");
    if (!h)
        return false;
    char want[sizeof(c->cfg.token) + 8];
    int wlen = snprintf(want, sizeof(want), "Bearer %s", c->cfg.token);
    if (strlen(h) != (size_t)wlen)
        return false;
    unsigned char diff = 0;
    for (int i = 0; i < wlen; i++)
        diff |= (unsigned char)(h[i] ^ want[i]);
    return diff == 0;
}

static void metric(char **buf, size_t *len, size_t *cap, const char *fmt, ...) ST_PRINTF(4, 5);
static void metric(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    if (!*buf)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if ((size_t)n < *cap - *len) {
            *len += (size_t)n;
            return;
        }
        char *b = st_realloc(*buf, *cap * 2 + (size_t)n);
        if (!b) {
            st_free(*buf);
            *buf = NULL;
            return;
        }
        *buf = b;
        *cap = *cap * 2 + (size_t)n;
    }
}

/* A counter by reconfiguration kind, name{kind="..."}: counts n or sums v, over the first
 * nkinds kinds; counted_only leaves out the kinds /metrics does not count apart
 * (coord__counted_kind: a dp-resharding counts under its base kind). */
struct kind_series {
    const char *name, *help;
    int nkinds;
    bool counted_only;
    const uint64_t *n; /* counts, or */
    const double *v;   /* sums */
};

static void kind_series(char **b, size_t *len, size_t *cap, const struct kind_series *s) {
    metric(b, len, cap, "# HELP %s %s\n# TYPE %s counter\n", s->name, s->help, s->name);
    for (int k = 0; k < s->nkinds; k++) {
        if (s->counted_only && !coord__counted_kind((enum plan_reconf)k))
            continue;
        const char *kind = plan_reconf_label((enum plan_reconf)k);
        if (s->n)
            metric(b, len, cap, "%s{kind=\"%s\"} %llu\n", s->name, kind,
                   (unsigned long long)s->n[k]);
        else
            metric(b, len, cap, "%s{kind=\"%s\"} %.6f\n", s->name, kind, s->v[k]);
    }
}

char *coord__metrics_text(struct coord *c) {
    size_t cap = 8192, len = 0;
    char *b = st_malloc(cap);
    if (!b)
        return NULL;
    b[0] = '\0';
    size_t counts[COORD_WORKER_NSTATES];
    coord__count_states(c, counts);
#define M(...) metric(&b, &len, &cap, __VA_ARGS__)
    M("# HELP spottrain_steps_total Training steps the job has completed.\n"
      "# TYPE spottrain_steps_total counter\nspottrain_steps_total %llu\n",
      (unsigned long long)c->job.step);
    M("# HELP spottrain_samples_total Training samples committed.\n"
      "# TYPE spottrain_samples_total counter\nspottrain_samples_total %llu\n",
      (unsigned long long)c->job.samples);
    M("# HELP spottrain_loss Loss of the newest step the last pipeline stage reported.\n"
      "# TYPE spottrain_loss gauge\nspottrain_loss %.9g\n", c->job.loss);
    M("# HELP spottrain_samples_per_second Global batch over the wall seconds of that step.\n"
      "# TYPE spottrain_samples_per_second gauge\nspottrain_samples_per_second %.6g\n",
      c->samples_per_second);
    M("# HELP spottrain_epoch Current job epoch (configurations so far).\n"
      "# TYPE spottrain_epoch gauge\nspottrain_epoch %llu\n", (unsigned long long)c->job.epoch);
    M("# HELP spottrain_shape_dp Data-parallel replicas of the current epoch.\n"
      "# TYPE spottrain_shape_dp gauge\nspottrain_shape_dp %d\n", c->job.dp);
    M("# HELP spottrain_shape_pp Pipeline stages of the current epoch.\n"
      "# TYPE spottrain_shape_pp gauge\nspottrain_shape_pp %d\n", c->job.pp);
    M("# HELP spottrain_workers Workers by state.\n# TYPE spottrain_workers gauge\n");
    for (int s = 0; s < COORD_WORKER_NSTATES; s++)
        M("spottrain_workers{state=\"%s\"} %zu\n",
          coord_worker_state_name((enum coord_worker_state)s), counts[s]);
    const struct kind_series migrations[] = {
        {"spottrain_migrations_total", "Migrations executed, by kind.", PLAN_RECONF_NKINDS,
         true, c->mig_count, NULL},
        {"spottrain_migration_bytes_total", "Bytes moved by migrations, by kind.",
         PLAN_RECONF_NKINDS, true, c->mig_bytes, NULL},
        {"spottrain_migration_stall_seconds_total", "Seconds training stalled, by the kind of "
         "the reconfiguration that ended it (shared/DESIGN.md).", PLAN_RECONF_NKINDS, true, NULL,
         c->mig_stall},
        {"spottrain_steps_replayed_total", "Steps done before an unannounced loss and trained "
         "again after the restore, by kind.", PLAN_RECONF_NKINDS, true, c->mig_replayed, NULL},
    };
    for (size_t i = 0; i < ST_ARRAY_SIZE(migrations); i++)
        kind_series(&b, &len, &cap, &migrations[i]);
    const struct coord_cost_model *cm = &c->cost_model;
    M("# HELP spottrain_cost_model_steps_total Steps whose step time the planner's cost model "
      "predicted when their epoch was decided, with measured steps behind the prediction.\n"
      "# TYPE spottrain_cost_model_steps_total counter\nspottrain_cost_model_steps_total "
      "%llu\n", (unsigned long long)cm->steps);
    M("# HELP spottrain_cost_model_step_seconds_predicted_total The predicted step time, summed "
      "over those steps (over spottrain_cost_model_steps_total: the mean).\n"
      "# TYPE spottrain_cost_model_step_seconds_predicted_total counter\n"
      "spottrain_cost_model_step_seconds_predicted_total %.6f\n", cm->step_predicted);
    M("# HELP spottrain_cost_model_step_seconds_measured_total The measured step time, summed "
      "over the same steps.\n# TYPE spottrain_cost_model_step_seconds_measured_total counter\n"
      "spottrain_cost_model_step_seconds_measured_total %.6f\n", cm->step_measured);
#define COST(name, help, n, v) \
    {"spottrain_cost_model_" name, help, PLAN_RECONF_NLIVE, false, n, v}
    const struct kind_series costs[] = {
        COST("migrations_total", "Live migrations whose stall the cost model predicted when "
             "they were ordered, by kind (dp_resharding also counts under its base kind).",
             cm->n, NULL),
        COST("stall_seconds_predicted_total", "Their predicted stalls, summed, by kind.", NULL,
             cm->stall_predicted),
        COST("stall_seconds_measured_total", "Their measured stalls, summed, by kind.", NULL,
             cm->stall_measured),
        COST("calibrated_migrations_total", "Of those, the migrations whose prediction rested "
             "on measured migrations (this job's or a cost file's), by kind.", cm->cal_n, NULL),
        COST("calibrated_stall_seconds_predicted_total", "Their predicted stalls, summed, by "
             "kind.", NULL, cm->cal_predicted),
        COST("calibrated_stall_seconds_measured_total", "Their measured stalls, summed, by "
             "kind.", NULL, cm->cal_measured),
    };
#undef COST
    for (size_t i = 0; i < ST_ARRAY_SIZE(costs); i++)
        kind_series(&b, &len, &cap, &costs[i]);
    double stall = c->stall_total;
    for (int k = 0; k < PLAN_RECONF_NKINDS; k++)
        stall += c->mig_stall[k];
    M("# HELP spottrain_stall_seconds_total Seconds training stalled (migrations, rendezvous).\n"
      "# TYPE spottrain_stall_seconds_total counter\nspottrain_stall_seconds_total %.6f\n",
      stall);
    M("# HELP spottrain_instances_predicted Instances the forecast expects for the next "
      "interval.\n# TYPE spottrain_instances_predicted gauge\nspottrain_instances_predicted "
      "%.6g\n", c->predicted);
    M("# HELP spottrain_instances_actual Instances alive now.\n"
      "# TYPE spottrain_instances_actual gauge\nspottrain_instances_actual %.6g\n", c->actual);
    M("# HELP spottrain_instances_noticed Instances alive under an interruption notice.\n"
      "# TYPE spottrain_instances_noticed gauge\nspottrain_instances_noticed %d\n",
      c->noticed);
    M("# HELP spottrain_spend_dollars_total Dollars spent on instances.\n"
      "# TYPE spottrain_spend_dollars_total counter\nspottrain_spend_dollars_total %.6f\n",
      c->spend);
    M("# HELP spottrain_spot_price_dollars_per_hour Spot $/instance-hour: the cloud's live "
      "price where the provider answers one, else the spec's fleet.price.spot.\n"
      "# TYPE spottrain_spot_price_dollars_per_hour gauge\n"
      "spottrain_spot_price_dollars_per_hour %.6f\n",
      c->spot_price_live > 0 ? c->spot_price_live : c->spec.fleet.spot_price);
    M("# HELP spottrain_on_demand_dollars_total What the same instance-hours would have cost "
      "on demand.\n# TYPE spottrain_on_demand_dollars_total counter\n"
      "spottrain_on_demand_dollars_total %.6f\n", coord__on_demand_dollars(c));
    M("# HELP spottrain_waiting 1 while the planning loop waits for workers that can host a "
      "shape the spec allows (GET /v1/job waiting_reason says why).\n"
      "# TYPE spottrain_waiting gauge\nspottrain_waiting %d\n", c->waiting_reason[0] != '\0');
    M("# HELP spottrain_planner_decisions_total Consultations of the liveput planner.\n"
      "# TYPE spottrain_planner_decisions_total counter\nspottrain_planner_decisions_total "
      "%llu\n", (unsigned long long)c->planner_decisions);
    M("# HELP spottrain_planner_decide_seconds Time the planner took per decision.\n"
      "# TYPE spottrain_planner_decide_seconds summary\n"
      "spottrain_planner_decide_seconds_sum %.9f\nspottrain_planner_decide_seconds_count "
      "%llu\n", c->planner_decide_seconds, (unsigned long long)c->planner_decisions);
    M("# HELP spottrain_reports_total Reports (heartbeats) accepted.\n"
      "# TYPE spottrain_reports_total counter\nspottrain_reports_total %llu\n",
      (unsigned long long)c->reports);
    M("# HELP spottrain_commands_total Commands issued to workers.\n"
      "# TYPE spottrain_commands_total counter\nspottrain_commands_total %llu\n",
      (unsigned long long)c->commands_sent);
    M("# HELP spottrain_rpc_rejected_total RPCs rejected, by reason.\n"
      "# TYPE spottrain_rpc_rejected_total counter\n"
      "spottrain_rpc_rejected_total{reason=\"unauthenticated\"} %llu\n"
      "spottrain_rpc_rejected_total{reason=\"invalid_argument\"} %llu\n",
      (unsigned long long)c->rejected_auth, (unsigned long long)c->rejected_invalid);
    M("# HELP spottrain_data_plane_auth_failures_total Data-plane connections the workers "
      "refused (no or wrong epoch secret).\n"
      "# TYPE spottrain_data_plane_auth_failures_total counter\n"
      "spottrain_data_plane_auth_failures_total %llu\n",
      (unsigned long long)c->dp_auth_failures);
#undef M
    return b;
}

static json_t *plan_json(struct coord *c) {
    json_t *as = json_array();
    for (size_t k = 0; k < c->nworkers; k++) {
        const struct coord_worker *w = &c->workers[k]->pub;
        if (w->state != COORD_WORKER_ACTIVE || w->epoch != c->job.epoch)
            continue;
        json_array_append_new(as, json_pack("{s:s, s:i, s:i, s:i, s:i, s:s}", "worker_id", w->id,
                                            "stage", w->stage, "replica", w->replica,
                                            "layer_begin", w->layer_begin, "layer_end",
                                            w->layer_end, "data_addr", w->data_addr));
    }
    json_t *detail = NULL;
    if (c->plan_detail)
        detail = json_loads(c->plan_detail, 0, NULL);
    return json_pack("{s:I, s:{s:i, s:i}, s:o, s:o}", "epoch", (json_int_t)c->job.epoch, "shape",
                     "dp", c->job.dp, "pp", c->job.pp, "assignments", as, "detail",
                     detail ? detail : json_null());
}

static int route(struct coord *c, struct rest_exchange *conn, const char *url,
                 const char *method) {
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    bool post = strcmp(method, "POST") == 0;

    if (strcmp(url, "/v1/job:stop") == 0) {
        if (!post)
            return send_error(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed", "POST",
                              "%s is not allowed on %s", method, url);
        if (!http_auth_ok(c, conn))
            return send_error(conn, MHD_HTTP_UNAUTHORIZED, "unauthenticated", NULL,
                              "missing or wrong bearer token");
        int r = coord_stop(c, "stopped over REST");
        if (r < 0)
            return send_error(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", NULL,
                              "stopping failed: %s", st_strerror(r));
        pthread_mutex_lock(&c->lock);
        json_t *j = job_json(c);
        pthread_mutex_unlock(&c->lock);
        return send_json(conn, MHD_HTTP_OK, j, NULL);
    }
    static const char *const gets[] = {"/healthz", "/v1/job", "/v1/workers", "/v1/events",
                                       "/v1/plan", "/v1/history", "/metrics", "/",
                                       "/favicon.svg"};
    bool known = false;
    for (size_t i = 0; i < ST_ARRAY_SIZE(gets); i++)
        known |= strcmp(url, gets[i]) == 0;
    if (!known)
        return send_error(conn, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no route %s", url);
    if (!get)
        return send_error(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed", "GET, HEAD",
                          "%s is not allowed on %s", method, url);

    if (strcmp(url, "/healthz") == 0)
        return send_json(conn, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"), NULL);
    /* The status page and its icon are open, like /healthz: they hold no job data, and the
     * page asks for the token itself when /v1/history answers 401. */
    if (strcmp(url, "/") == 0)
        return send_static(conn, "text/html; charset=utf-8", coord__page_html,
                           coord__page_html_len);
    if (strcmp(url, "/favicon.svg") == 0)
        return send_static(conn, "image/svg+xml", coord__page_icon, coord__page_icon_len);
    if (strcmp(url, "/v1/history") == 0) {
        if (!http_auth_ok(c, conn))
            return send_error(conn, MHD_HTTP_UNAUTHORIZED, "unauthenticated", NULL,
                              "missing or wrong bearer token");
        pthread_mutex_lock(&c->lock);
        json_t *h = coord__history_json(&c->history, st_wall());
        pthread_mutex_unlock(&c->lock);
        if (!h)
            return send_error(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", NULL,
                              "out of memory");
        return send_json(conn, MHD_HTTP_OK, h, NULL);
    }
    if (strcmp(url, "/metrics") == 0) {
        pthread_mutex_lock(&c->lock);
        char *t = coord__metrics_text(c);
        pthread_mutex_unlock(&c->lock);
        if (!t)
            return send_error(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", NULL,
                              "out of memory");
        char *m = strdup(t); /* MHD frees with free() */
        st_free(t);
        if (!m)
            return -ENOMEM;
        return send_text(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", m, NULL);
    }
    if (strcmp(url, "/v1/events") == 0) {
        long long since = 0, limit = 100;
        const char *s = arg_value(conn->rq, "since");
        const char *l = arg_value(conn->rq, "limit");
        if (s && parse_nonneg(s, (1LL << 53), &since) < 0)
            return send_error(conn, MHD_HTTP_BAD_REQUEST, "invalid_argument", NULL,
                              "'since' must be a non-negative integer");
        if (l && (parse_nonneg(l, EVENTS_MAX_LIMIT, &limit) < 0 || limit < 1))
            return send_error(conn, MHD_HTTP_BAD_REQUEST, "invalid_argument", NULL,
                              "'limit' must be an integer in 1..%d", EVENTS_MAX_LIMIT);
        json_t *arr = json_array();
        pthread_mutex_lock(&c->lock);
        int r = coord__journal_events(c->journal, since, (int)limit, event_to_json, arr);
        pthread_mutex_unlock(&c->lock);
        if (r < 0) {
            json_decref(arr);
            return send_error(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", NULL,
                              "reading events failed: %s", st_strerror(r));
        }
        long long next = since;
        size_t n = json_array_size(arr);
        if (n > 0)
            next = (long long)json_integer_value(
                json_object_get(json_array_get(arr, n - 1), "seq"));
        return send_json(conn, MHD_HTTP_OK,
                         json_pack("{s:o, s:I}", "events", arr, "next", (json_int_t)next), NULL);
    }
    json_t *j = NULL;
    pthread_mutex_lock(&c->lock);
    if (strcmp(url, "/v1/job") == 0) {
        j = job_json(c);
    } else if (strcmp(url, "/v1/plan") == 0) {
        j = plan_json(c);
    } else {
        json_t *arr = json_array();
        for (size_t k = 0; k < c->nworkers; k++) {
            struct coord_worker w;
            coord__worker_copy(c, c->workers[k], &w);
            json_array_append_new(arr, worker_json(&w));
        }
        j = json_pack("{s:o}", "workers", arr);
    }
    pthread_mutex_unlock(&c->lock);
    if (!j)
        return send_error(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", NULL,
                          "out of memory");
    return send_json(conn, MHD_HTTP_OK, j, NULL);
}

/* Mutual TLS: true when the peer sent a certificate that chains to the client CA (set as
 * libmicrohttpd's trust store) and is valid now. */
static bool client_cert_ok(struct MHD_Connection *conn) {
#ifdef COORD_HAVE_GNUTLS
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (!ci || !ci->tls_session)
        return false;
    gnutls_session_t s = (gnutls_session_t)ci->tls_session;
    unsigned status = 0;
    if (gnutls_certificate_type_get(s) != GNUTLS_CRT_X509 ||
        !gnutls_certificate_get_peers(s, &(unsigned){0}))
        return false;
    return gnutls_certificate_verify_peers2(s, &status) == 0 && status == 0;
#else
    (void)conn;
    return false;
#endif
}

int coord__rest_handle(struct coord *c, const struct coord_rest_request *rq,
                       struct coord_rest_reply *ret_reply) {
    if (!c || !rq || !rq->method || !rq->url || !ret_reply || (rq->nargs && !rq->args) ||
        (rq->nheaders && !rq->headers))
        return -EINVAL;
    struct coord_rest_reply rep;
    memset(&rep, 0, sizeof(rep));
    struct rest_exchange conn = {rq, &rep};
    int r;
    if (rq->body_len > REST_MAX_BODY)
        r = send_error(&conn, MHD_HTTP_CONTENT_TOO_LARGE, "payload_too_large", NULL,
                       "request body over %d bytes", REST_MAX_BODY);
    else if (c->tls_ca_pem && !rq->client_cert_ok)
        r = send_error(&conn, MHD_HTTP_FORBIDDEN, "client_certificate_required", NULL,
                       "this coordinator requires a client certificate signed by its "
                       "client CA");
    else
        r = route(c, &conn, rq->url, rq->method);
    if (r < 0) {
        coord__rest_reply_done(&rep);
        return r;
    }
    *ret_reply = rep;
    return 0;
}

void coord__rest_reply_done(struct coord_rest_reply *r) {
    if (!r->asset)
        free(r->body);
    r->body = NULL;
    r->len = 0;
}

/* Collects headers and query arguments for coord__rest_handle (pointers into the
 * connection's memory, valid for this callback). Past REST_MAX_PAIRS the rest are dropped,
 * which only a hostile client sends. */
#define REST_MAX_PAIRS 64
struct rest_pairs {
    struct coord_rest_kv kv[REST_MAX_PAIRS];
    size_t n;
};

static enum MHD_Result collect_pair(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value) {
    struct rest_pairs *p = cls;
    (void)kind;
    if (p->n < REST_MAX_PAIRS && key)
        p->kv[p->n++] = (struct coord_rest_kv){key, value ? value : ""};
    return MHD_YES;
}

/* Sends a reply; the body is handed to libmicrohttpd (freed with free()) unless it is a
 * compiled-in asset. The page must not be framed by another origin nor load anything from
 * one, whatever a browser would otherwise allow. */
static enum MHD_Result send_reply(struct MHD_Connection *conn, struct coord_rest_reply *rep) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        rep->len, rep->body, rep->asset ? MHD_RESPMEM_PERSISTENT : MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        coord__rest_reply_done(rep);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", rep->content_type);
    if (rep->allow)
        MHD_add_response_header(resp, "Allow", rep->allow);
    if (rep->status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (rep->asset) {
        MHD_add_response_header(resp, "Content-Security-Policy",
                                "default-src 'self'; script-src 'self' 'unsafe-inline'; "
                                "style-src 'self' 'unsafe-inline'; img-src 'self'; "
                                "connect-src 'self'; frame-ancestors 'none'");
        MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
    }
    enum MHD_Result r = MHD_queue_response(conn, rep->status, resp);
    MHD_destroy_response(resp);
    return r;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    struct coord *c = cls;
    (void)version;
    (void)upload_data;
    struct rest_req *rq = *con_cls;
    if (!rq) {
        rq = calloc(1, sizeof(*rq));
        if (!rq)
            return MHD_NO;
        *con_cls = rq;
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        rq->body += *upload_data_size;
        if (rq->body > REST_MAX_BODY)
            rq->too_big = true;
        *upload_data_size = 0;
        return MHD_YES;
    }
    /* No route reads a body yet: only its (capped) length travels. */
    struct rest_pairs *p = calloc(2, sizeof(*p));
    if (!p)
        return MHD_NO;
    MHD_get_connection_values(conn, MHD_HEADER_KIND, collect_pair, &p[0]);
    MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, collect_pair, &p[1]);
    struct coord_rest_request req = {
        .method = method,
        .url = url,
        .args = p[1].kv,
        .nargs = p[1].n,
        .headers = p[0].kv,
        .nheaders = p[0].n,
        .body_len = rq->too_big ? (size_t)REST_MAX_BODY + 1 : rq->body,
        .client_cert_ok = c->tls_ca_pem && client_cert_ok(conn),
    };
    struct coord_rest_reply rep;
    int r = coord__rest_handle(c, &req, &rep);
    free(p);
    if (r < 0)
        return MHD_NO;
    return send_reply(conn, &rep);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)conn;
    (void)toe;
    free(*con_cls);
    *con_cls = NULL;
}

int coord__rest_start(struct coord *c) {
    char host[COORD_ADDR_MAX], portstr[16];
    int port;
    struct addrinfo hints, *ai = NULL;

    c->rest_addr[0] = '\0';
    if (strcmp(c->cfg.status_listen, "-") == 0)
        return 0;
    TRY(coord__parse_hostport(c->cfg.status_listen, host, sizeof(host), &port));
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(portstr, sizeof(portstr), "%d", port);
    if (getaddrinfo(host, portstr, &hints, &ai) != 0 || !ai)
        return st_log_errno(-EADDRNOTAVAIL, "Cannot resolve status address '%s'",
                            c->cfg.status_listen);
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* TLS: the same certificate as gRPC. A client CA makes libmicrohttpd ask for a client
     * certificate; whether it chains to the CA is checked per request (client_cert_ok). */
    struct MHD_OptionItem tls_opts[4];
    size_t ntls = 0;
    if (c->tls_cert_pem) {
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
            freeaddrinfo(ai);
            return st_log_errno(-ENOTSUP, "REST over TLS: this libmicrohttpd was built without "
                                "TLS support (turn REST off with --status-listen '')");
        }
#ifndef COORD_HAVE_GNUTLS
        if (c->tls_ca_pem) {
            freeaddrinfo(ai);
            return st_log_errno(-ENOTSUP, "REST client certificates need gnutls at build time "
                                "(install libgnutls28-dev, or turn REST off)");
        }
#endif
        flags |= MHD_USE_TLS;
        tls_opts[ntls++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0,
                                                   c->tls_cert_pem};
        tls_opts[ntls++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0,
                                                   c->tls_key_pem};
        if (c->tls_ca_pem)
            tls_opts[ntls++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_TRUST, 0,
                                                       c->tls_ca_pem};
    }
    tls_opts[ntls] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    c->mhd = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, c,
                              MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)256, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, c, MHD_OPTION_ARRAY,
                              tls_opts, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!c->mhd)
        return st_log_errno(-EADDRINUSE, "Cannot listen for REST on '%s' (in use or not a "
                            "local address)", c->cfg.status_listen);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(c->mhd, MHD_DAEMON_INFO_BIND_PORT);
    int bound = info ? (int)info->port : port;
    if (strchr(host, ':'))
        snprintf(c->rest_addr, sizeof(c->rest_addr), "[%s]:%d", host, bound);
    else
        snprintf(c->rest_addr, sizeof(c->rest_addr), "%s:%d", host, bound);
    return 0;
}

void coord__rest_stop(struct coord *c) {
    if (c->mhd)
        MHD_stop_daemon(c->mhd);
    c->mhd = NULL;
}
