/* test-rest.c: coord__rest_handle, the REST answer without a socket (the function
 * libmicrohttpd's callback and tests/fuzz/fuzz-rest.c share): each route's status, content
 * type and body shape, authentication, the body limit, client certificates, bad arguments. */
#include <jansson.h>
#include <math.h> /* NAN */
#include <stdlib.h>
#include <unistd.h>

#include "coord-internal.h"
#include "test.h"

#define TOKEN "t0ken"

static char dir[64];
static struct st_spec spec;

static int open_coord(struct coord **ret) {
    snprintf(dir, sizeof(dir), "/tmp/st-rest-XXXXXX");
    if (!mkdtemp(dir))
        return -errno;
    st_spec_defaults(&spec);
    snprintf(spec.name, sizeof(spec.name), "rest");
    spec.model.layers = 4;
    struct coord_config cfg;
    coord_config_init(&cfg);
    cfg.spec = &spec;
    snprintf(cfg.state_dir, sizeof(cfg.state_dir), "%s", dir);
    snprintf(cfg.listen, sizeof(cfg.listen), "127.0.0.1:0");
    snprintf(cfg.status_listen, sizeof(cfg.status_listen), "-");
    snprintf(cfg.token, sizeof(cfg.token), "%s", TOKEN);
    return coord_new(&cfg, NULL, ret);
}

static void close_coord(struct coord *c) {
    coord_free(c);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    (void)!system(cmd);
}

static const struct coord_rest_kv auth[] = {{"authorization", "Bearer " TOKEN}};

/* One request; returns the status, with the reply's body parsed when it is JSON. */
static int ask(struct coord *c, const char *method, const char *url,
               const struct coord_rest_kv *args, size_t nargs, bool authed, size_t body_len,
               struct coord_rest_reply *ret_rep, json_t **ret_json) {
    struct coord_rest_request rq = {.method = method, .url = url, .args = args, .nargs = nargs,
                                    .headers = authed ? auth : NULL, .nheaders = authed,
                                    .body_len = body_len};
    int r = coord__rest_handle(c, &rq, ret_rep);
    if (r < 0)
        return r;
    *ret_json = NULL;
    if (strcmp(ret_rep->content_type, "application/json") == 0)
        *ret_json = json_loadb(ret_rep->body, ret_rep->len, 0, NULL);
    return (int)ret_rep->status;
}

static const char *code_of(json_t *j) {
    const char *s = json_string_value(json_object_get(j, "code"));
    return s ? s : "(none)";
}

static int test_routes(void) {
    struct coord *c = NULL;
    ASSERT_OK(open_coord(&c));
    struct coord_rest_reply rep;
    json_t *j;

    ASSERT_EQ(ask(c, "GET", "/healthz", NULL, 0, false, 0, &rep, &j), 200);
    ASSERT_STREQ(rep.body, "{\"status\":\"ok\"}\n");
    ASSERT_TRUE(rep.allow == NULL && !rep.asset);
    json_decref(j);
    coord__rest_reply_done(&rep);

    /* Reads of the job are open; the history and stopping take the token. */
    ASSERT_EQ(ask(c, "GET", "/v1/history", NULL, 0, false, 0, &rep, &j), 401);
    ASSERT_STREQ(code_of(j), "unauthenticated");
    json_decref(j);
    coord__rest_reply_done(&rep);
    const struct coord_rest_kv wrong[] = {{"Authorization", "Bearer t0ke"}};
    struct coord_rest_request rq = {.method = "GET", .url = "/v1/history", .headers = wrong,
                                    .nheaders = 1};
    ASSERT_OK(coord__rest_handle(c, &rq, &rep));
    ASSERT_EQ(rep.status, 401);
    coord__rest_reply_done(&rep);
    ASSERT_EQ(ask(c, "GET", "/v1/history", NULL, 0, true, 0, &rep, &j), 200);
    json_decref(j);
    coord__rest_reply_done(&rep);

    ASSERT_EQ(ask(c, "GET", "/v1/job", NULL, 0, false, 0, &rep, &j), 200);
    ASSERT_STREQ(json_string_value(json_object_get(j, "state")), "pending");
    ASSERT_STREQ(json_string_value(json_object_get(j, "name")), "rest");
    json_decref(j);
    coord__rest_reply_done(&rep);

    ASSERT_EQ(ask(c, "GET", "/nowhere", NULL, 0, true, 0, &rep, &j), 404);
    ASSERT_STREQ(code_of(j), "not_found");
    json_decref(j);
    coord__rest_reply_done(&rep);

    ASSERT_EQ(ask(c, "DELETE", "/v1/job", NULL, 0, true, 0, &rep, &j), 405);
    ASSERT_STREQ(rep.allow, "GET, HEAD");
    ASSERT_STREQ(code_of(j), "method_not_allowed");
    json_decref(j);
    coord__rest_reply_done(&rep);

    ASSERT_EQ(ask(c, "GET", "/v1/job:stop", NULL, 0, true, 0, &rep, &j), 405);
    ASSERT_STREQ(rep.allow, "POST");
    json_decref(j);
    coord__rest_reply_done(&rep);

    /* The page is a compiled-in asset, handed out without a copy. */
    ASSERT_EQ(ask(c, "GET", "/", NULL, 0, false, 0, &rep, &j), 200);
    ASSERT_TRUE(rep.asset && rep.body == (const char *)coord__page_html &&
                rep.len == coord__page_html_len);
    ASSERT_STREQ(rep.content_type, "text/html; charset=utf-8");
    coord__rest_reply_done(&rep);

    ASSERT_EQ(ask(c, "GET", "/metrics", NULL, 0, true, 0, &rep, &j), 200);
    ASSERT_STREQ(rep.content_type, "text/plain; version=0.0.4; charset=utf-8");
    ASSERT_EQ(strlen(rep.body), rep.len);
    coord__rest_reply_done(&rep);
    close_coord(c);
    return 0;
}

static int test_events_args_and_stop(void) {
    struct coord *c = NULL;
    ASSERT_OK(open_coord(&c));
    struct coord_rest_reply rep;
    json_t *j;
    const struct coord_rest_kv neg[] = {{"since", "-1"}};
    ASSERT_EQ(ask(c, "GET", "/v1/events", neg, 1, true, 0, &rep, &j), 400);
    ASSERT_STREQ(code_of(j), "invalid_argument");
    ASSERT_CONTAINS(json_string_value(json_object_get(j, "message")), "'since'");
    json_decref(j);
    coord__rest_reply_done(&rep);
    const struct coord_rest_kv big[] = {{"limit", "1001"}};
    ASSERT_EQ(ask(c, "GET", "/v1/events", big, 1, true, 0, &rep, &j), 400);
    ASSERT_CONTAINS(json_string_value(json_object_get(j, "message")), "'limit'");
    json_decref(j);
    coord__rest_reply_done(&rep);

    ASSERT_EQ(ask(c, "POST", "/v1/job:stop", NULL, 0, false, 0, &rep, &j), 401);
    json_decref(j);
    coord__rest_reply_done(&rep);
    ASSERT_EQ(c->job.state, COORD_JOB_PENDING);
    ASSERT_EQ(ask(c, "POST", "/v1/job:stop", NULL, 0, true, 0, &rep, &j), 200);
    ASSERT_STREQ(json_string_value(json_object_get(j, "state")), "stopped");
    json_decref(j);
    coord__rest_reply_done(&rep);
    ASSERT_EQ(c->job.state, COORD_JOB_STOPPED);

    /* The stop is the one event with kind job_stopped; the first argument wins. */
    const struct coord_rest_kv args[] = {{"limit", "1000"}, {"limit", "x"}};
    ASSERT_EQ(ask(c, "GET", "/v1/events", args, 2, true, 0, &rep, &j), 200);
    json_t *ev = json_object_get(j, "events");
    size_t i, stops = 0;
    json_t *e;
    json_array_foreach(ev, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "kind")), "job_stopped") == 0) {
            stops++;
            ASSERT_STREQ(json_string_value(json_object_get(e, "message")), "stopped over REST");
        }
    }
    ASSERT_EQ(stops, 1);
    ASSERT_EQ(json_integer_value(json_object_get(j, "next")),
              json_integer_value(json_object_get(json_array_get(ev, json_array_size(ev) - 1),
                                                 "seq")));
    json_decref(j);
    coord__rest_reply_done(&rep);
    close_coord(c);
    return 0;
}

static void *failing_malloc(size_t n) {
    (void)n;
    return NULL;
}

static int test_limits(void) {
    struct coord *c = NULL;
    ASSERT_OK(open_coord(&c));
    struct coord_rest_reply rep;
    json_t *j;
    ASSERT_EQ(ask(c, "GET", "/healthz", NULL, 0, true, 65536, &rep, &j), 200);
    json_decref(j);
    coord__rest_reply_done(&rep);
    ASSERT_EQ(ask(c, "GET", "/healthz", NULL, 0, true, 65537, &rep, &j), 413);
    ASSERT_STREQ(code_of(j), "payload_too_large");
    json_decref(j);
    coord__rest_reply_done(&rep);

    /* With a client CA configured, a request without a verified certificate is refused
     * before any route (the PEM text itself is only read by libmicrohttpd). */
    c->tls_ca_pem = st_strdup("CA");
    ASSERT_TRUE(c->tls_ca_pem != NULL);
    ASSERT_EQ(ask(c, "GET", "/healthz", NULL, 0, true, 0, &rep, &j), 403);
    ASSERT_STREQ(code_of(j), "client_certificate_required");
    json_decref(j);
    coord__rest_reply_done(&rep);
    struct coord_rest_request ok = {.method = "GET", .url = "/healthz", .client_cert_ok = true};
    ASSERT_OK(coord__rest_handle(c, &ok, &rep));
    ASSERT_EQ(rep.status, 200);
    coord__rest_reply_done(&rep);
    st_free(c->tls_ca_pem);
    c->tls_ca_pem = NULL;

    /* An answer that cannot be built (jansson out of memory) is -ENOMEM, reply untouched:
     * libmicrohttpd's callback then drops the connection. */
    json_set_alloc_funcs(failing_malloc, free);
    memset(&rep, 0x5a, sizeof(rep));
    ASSERT_ERR(coord__rest_handle(c, &ok, &rep), -ENOMEM);
    json_set_alloc_funcs(malloc, free);
    ASSERT_EQ(rep.status, 0x5a5a5a5au);

    struct coord_rest_request bad = {.method = "GET", .url = NULL};
    ASSERT_ERR(coord__rest_handle(c, &bad, &rep), -EINVAL);
    bad.url = "/healthz";
    bad.nargs = 1; /* args NULL */
    ASSERT_ERR(coord__rest_handle(c, &bad, &rep), -EINVAL);
    bad.nargs = 0;
    ASSERT_ERR(coord__rest_handle(NULL, &bad, &rep), -EINVAL);
    ASSERT_ERR(coord__rest_handle(c, &bad, NULL), -EINVAL);
    close_coord(c);
    return 0;
}

/* The recovery figures the loop feeds reach both GET /v1/job "migrations" and /metrics, per
 * kind and summed exactly; a call with a senseless stall or kind changes nothing. */
static int test_migration_figures(void) {
    struct coord *c = NULL;
    ASSERT_OK(open_coord(&c));
    struct coord_rest_reply rep;
    json_t *j;
    coord_metrics_add_migration(c, PLAN_RECONF_PEER_RESTORE, 1000, 0.25, 7);
    coord_metrics_add_migration(c, PLAN_RECONF_PEER_RESTORE, 500, 0.5, 3);
    coord_metrics_add_migration(c, PLAN_RECONF_CHECKPOINT_RESTORE, 0, 1.5, 40);
    coord_metrics_add_migration(c, PLAN_RECONF_INTER_STAGE, 4096, 0.125, 0);
    coord_metrics_add_migration(c, PLAN_RECONF_PEER_RESTORE, 9, -1.0, 9);
    coord_metrics_add_migration(c, PLAN_RECONF_PEER_RESTORE, 9, NAN, 9);
    coord_metrics_add_migration(c, PLAN_RECONF_NKINDS, 9, 1.0, 9);
    coord_metrics_add_migration(c, PLAN_RECONF_NONE, 9, 1.0, 9);
    /* dp-resharding is counted in the summary apart; here each reconfiguration once */
    coord_metrics_add_migration(c, PLAN_RECONF_DP_RESHARDING, 9, 1.0, 9);

    ASSERT_EQ(ask(c, "GET", "/v1/job", NULL, 0, false, 0, &rep, &j), 200);
    json_t *m = json_object_get(j, "migrations");
    ASSERT_EQ(json_object_size(m), PLAN_RECONF_NKINDS - 1); /* all but dp_resharding */
    ASSERT_TRUE(!json_object_get(m, "dp_resharding"));
    static const struct {
        const char *kind;
        long long count, bytes, replayed;
        double stall;
    } want[] = {{"peer_restore", 2, 1500, 10, 0.75},  {"checkpoint_restore", 1, 0, 40, 1.5},
                {"inter_stage", 1, 4096, 0, 0.125},   {"intra_stage", 0, 0, 0, 0},
                {"pipeline", 0, 0, 0, 0},             {"fresh_start", 0, 0, 0, 0}};
    for (size_t i = 0; i < ST_ARRAY_SIZE(want); i++) {
        json_t *k = json_object_get(m, want[i].kind);
        ASSERT_EQ(json_object_size(k), 4);
        ASSERT_EQ(json_integer_value(json_object_get(k, "count")), want[i].count);
        ASSERT_EQ(json_integer_value(json_object_get(k, "bytes")), want[i].bytes);
        ASSERT_EQ(json_integer_value(json_object_get(k, "steps_replayed")), want[i].replayed);
        /* Sums of binary fractions: exact. */
        ASSERT_TRUE(json_real_value(json_object_get(k, "stall_seconds")) == want[i].stall);
    }
    json_decref(j);
    coord__rest_reply_done(&rep);

    ASSERT_EQ(ask(c, "GET", "/metrics", NULL, 0, false, 0, &rep, &j), 200);
    ASSERT_CONTAINS(rep.body, "\nspottrain_migrations_total{kind=\"peer_restore\"} 2\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_migration_bytes_total{kind=\"peer_restore\"} 1500\n");
    ASSERT_CONTAINS(rep.body,
                    "\nspottrain_migration_stall_seconds_total{kind=\"peer_restore\"} 0.750000\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_steps_replayed_total{kind=\"peer_restore\"} 10\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_migrations_total{kind=\"checkpoint_restore\"} 1\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_steps_replayed_total{kind=\"checkpoint_restore\"} 40\n");
    ASSERT_CONTAINS(rep.body,
                    "\nspottrain_migration_stall_seconds_total{kind=\"inter_stage\"} 0.125000\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_migrations_total{kind=\"fresh_start\"} 0\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_steps_replayed_total{kind=\"inter_stage\"} 0\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_stall_seconds_total 2.375000\n");
    coord__rest_reply_done(&rep);
    close_coord(c);
    return 0;
}

/* The cost model the loop sets: GET /v1/job "cost_model" shows means (null where nothing was
 * counted), /metrics the sums; a NULL model changes nothing. */
static int test_cost_model(void) {
    struct coord *c = NULL;
    ASSERT_OK(open_coord(&c));
    struct coord_rest_reply rep;
    json_t *j;
    /* Before the loop set anything: counts 0, means null. */
    ASSERT_EQ(ask(c, "GET", "/v1/job", NULL, 0, false, 0, &rep, &j), 200);
    json_t *cm = json_object_get(j, "cost_model");
    ASSERT_EQ(json_integer_value(json_object_get(cm, "steps")), 0);
    ASSERT_TRUE(json_is_null(json_object_get(cm, "step_seconds_predicted")));
    ASSERT_TRUE(json_is_null(json_object_get(cm, "step_seconds_measured")));
    ASSERT_TRUE(json_is_null(json_object_get(
        json_object_get(json_object_get(cm, "kinds"), "pipeline"), "stall_seconds_measured")));
    json_decref(j);
    coord__rest_reply_done(&rep);

    struct coord_cost_model m;
    memset(&m, 0, sizeof(m));
    m.steps = 4;
    m.step_predicted = 0.5; /* sums: means 0.125 and 0.25 */
    m.step_measured = 1.0;
    m.n[PLAN_RECONF_PIPELINE] = 2;
    m.stall_predicted[PLAN_RECONF_PIPELINE] = 0.75;
    m.stall_measured[PLAN_RECONF_PIPELINE] = 0.25;
    m.n[PLAN_RECONF_DP_RESHARDING] = 1;
    m.stall_predicted[PLAN_RECONF_DP_RESHARDING] = 0.5;
    m.stall_measured[PLAN_RECONF_DP_RESHARDING] = 0.125;
    m.cal_n[PLAN_RECONF_PIPELINE] = 1; /* the second pipeline move, after the first measured */
    m.cal_predicted[PLAN_RECONF_PIPELINE] = 0.0625;
    m.cal_measured[PLAN_RECONF_PIPELINE] = 0.03125;
    coord_metrics_set_cost_model(c, &m);
    coord_metrics_set_cost_model(c, NULL);
    coord_metrics_set_cost_model(NULL, &m);

    ASSERT_EQ(ask(c, "GET", "/v1/job", NULL, 0, false, 0, &rep, &j), 200);
    cm = json_object_get(j, "cost_model");
    ASSERT_EQ(json_integer_value(json_object_get(cm, "steps")), 4);
    ASSERT_TRUE(json_real_value(json_object_get(cm, "step_seconds_predicted")) == 0.125);
    ASSERT_TRUE(json_real_value(json_object_get(cm, "step_seconds_measured")) == 0.25);
    json_t *kinds = json_object_get(cm, "kinds");
    ASSERT_EQ(json_object_size(kinds), PLAN_RECONF_NLIVE);
    json_t *pk = json_object_get(kinds, "pipeline"), *dk = json_object_get(kinds, "dp_resharding");
    ASSERT_EQ(json_integer_value(json_object_get(pk, "count")), 2);
    ASSERT_TRUE(json_real_value(json_object_get(pk, "stall_seconds_predicted")) == 0.375);
    ASSERT_TRUE(json_real_value(json_object_get(pk, "stall_seconds_measured")) == 0.125);
    ASSERT_TRUE(json_real_value(json_object_get(dk, "stall_seconds_predicted")) == 0.5);
    json_t *pc = json_object_get(pk, "calibrated"), *dc = json_object_get(dk, "calibrated");
    ASSERT_EQ(json_integer_value(json_object_get(pc, "count")), 1);
    ASSERT_TRUE(json_real_value(json_object_get(pc, "stall_seconds_predicted")) == 0.0625);
    ASSERT_TRUE(json_real_value(json_object_get(pc, "stall_seconds_measured")) == 0.03125);
    ASSERT_EQ(json_integer_value(json_object_get(dc, "count")), 0);
    ASSERT_TRUE(json_is_null(json_object_get(dc, "stall_seconds_predicted")));
    ASSERT_TRUE(json_is_null(json_object_get(dc, "stall_seconds_measured")));
    ASSERT_EQ(json_integer_value(json_object_get(json_object_get(kinds, "intra_stage"), "count")),
              0);
    ASSERT_TRUE(json_is_null(
        json_object_get(json_object_get(kinds, "inter_stage"), "stall_seconds_predicted")));
    json_decref(j);
    coord__rest_reply_done(&rep);

    ASSERT_EQ(ask(c, "GET", "/metrics", NULL, 0, false, 0, &rep, &j), 200);
    ASSERT_CONTAINS(rep.body, "\nspottrain_cost_model_steps_total 4\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_cost_model_step_seconds_predicted_total 0.500000\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_cost_model_step_seconds_measured_total 1.000000\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_cost_model_migrations_total{kind=\"pipeline\"} 2\n");
    ASSERT_CONTAINS(rep.body,
                    "\nspottrain_cost_model_migrations_total{kind=\"intra_stage\"} 0\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_cost_model_stall_seconds_predicted_total"
                              "{kind=\"pipeline\"} 0.750000\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_cost_model_stall_seconds_measured_total"
                              "{kind=\"dp_resharding\"} 0.125000\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_cost_model_calibrated_migrations_total"
                              "{kind=\"pipeline\"} 1\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_cost_model_calibrated_migrations_total"
                              "{kind=\"dp_resharding\"} 0\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_cost_model_calibrated_stall_seconds_predicted_total"
                              "{kind=\"pipeline\"} 0.062500\n");
    ASSERT_CONTAINS(rep.body, "\nspottrain_cost_model_calibrated_stall_seconds_measured_total"
                              "{kind=\"pipeline\"} 0.031250\n");
    coord__rest_reply_done(&rep);
    close_coord(c);
    return 0;
}

TEST_MAIN(TEST(test_routes), TEST(test_events_args_and_stop), TEST(test_limits),
          TEST(test_migration_figures), TEST(test_cost_model))
