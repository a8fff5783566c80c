/* test-imds-server.c: conformance of the loopback IMDSv2 server with
 * shared/anchors/cloud-apis.md §1 (token flow, TTL bounds, 401/403/404/405, exact notice
 * JSON), checked with raw libcurl requests rather than our own client, plus the time formats.
 * Token expiry runs on an injected clock, so nothing sleeps. */
#include <curl/curl.h>
#include <strings.h>

#include "cloud.h"
#include "common.h"
#include "test.h"

static double fake_now;
static double fake_clock(void *ud) {
    (void)ud;
    return fake_now;
}

struct resp {
    long status;
    char body[4096];
    size_t len;
    char ttl[32];
    char ctype[64];
};

static size_t on_body(char *p, size_t s, size_t n, void *ud) {
    struct resp *r = ud;
    size_t k = s * n;
    if (r->len + k >= sizeof(r->body))
        return 0;
    memcpy(r->body + r->len, p, k);
    r->len += k;
    r->body[r->len] = '\0';
    return k;
}

/* Copies the value of header `name` (lower case, with colon) into dst. */
static void grab(const char *line, size_t n, const char *name, char *dst, size_t size) {
    size_t nl = strlen(name);
    if (n <= nl || strncasecmp(line, name, nl) != 0)
        return;
    const char *v = line + nl;
    while (*v == ' ')
        v++;
    size_t vl = n - (size_t)(v - line);
    while (vl > 0 && (v[vl - 1] == '\r' || v[vl - 1] == '\n'))
        vl--;
    snprintf(dst, size, "%.*s", (int)vl, v);
}

static size_t on_header(char *p, size_t s, size_t n, void *ud) {
    struct resp *r = ud;
    grab(p, s * n, "x-aws-ec2-metadata-token-ttl-seconds:", r->ttl, sizeof(r->ttl));
    grab(p, s * n, "content-type:", r->ctype, sizeof(r->ctype));
    return s * n;
}

/* One request with up to two headers. Returns the curl code. */
static int req(struct cloud_imds_server *s, const char *method, const char *path,
               const char *h1, const char *h2, struct resp *r) {
    char url[256];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u%s", cloud_imds_server_port(s), path);
    memset(r, 0, sizeof(*r));
    CURL *c = curl_easy_init();
    struct curl_slist *hl = NULL;
    if (h1)
        hl = curl_slist_append(hl, h1);
    if (h2)
        hl = curl_slist_append(hl, h2);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    else if (strcmp(method, "GET") != 0)
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    CURLcode cc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    return (int)cc;
}

static struct cloud_imds_server *server(bool token_optional) {
    struct cloud_imds_server_config cfg = {.instance_id = "i-1234567890abcdef0",
                                           .instance_type = "p3.2xlarge",
                                           .zone = "us-east-1a",
                                           .token_optional = token_optional,
                                           .clock = fake_clock};
    struct cloud_imds_server *s = NULL;
    if (cloud_imds_server_new(&cfg, &s) < 0)
        return NULL;
    return s;
}

/* PUTs a token with the given TTL into tok (size 128). */
static int get_token(struct cloud_imds_server *s, const char *ttl, char *tok) {
    struct resp r;
    char h[96];
    snprintf(h, sizeof(h), "X-aws-ec2-metadata-token-ttl-seconds: %s", ttl);
    if (req(s, "PUT", "/latest/api/token", h, NULL, &r) != 0 || r.status != 200)
        return -1;
    snprintf(tok, 128, "X-aws-ec2-metadata-token: %s", r.body);
    return 0;
}

static int test_token_required(void) {
    fake_now = 1000;
    struct cloud_imds_server *s = server(false);
    ASSERT_TRUE(s);
    struct resp r;
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/instance-id", NULL, NULL, &r), 0);
    ASSERT_EQ(r.status, 401);
    ASSERT_CONTAINS(r.body, "<title>401 - Unauthorized</title>");
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/instance-id", "X-aws-ec2-metadata-token: nope",
                  NULL, &r), 0);
    ASSERT_EQ(r.status, 401);
    char tok[128];
    ASSERT_OK(get_token(s, "21600", tok));
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/instance-id", tok, NULL, &r), 0);
    ASSERT_EQ(r.status, 200);
    ASSERT_STREQ(r.body, "i-1234567890abcdef0");
    ASSERT_STREQ(r.ctype, "text/plain");
    ASSERT_STREQ(r.ttl, "21600"); /* remaining TTL echoed on GETs, as NTH expects */
    /* HEAD is allowed too. */
    ASSERT_EQ(req(s, "HEAD", "/latest/meta-data/instance-id", tok, NULL, &r), 0);
    ASSERT_EQ(r.status, 200);
    cloud_imds_server_free(s);
    /* IMDSv1 mode: no token needed. */
    s = server(true);
    ASSERT_TRUE(s);
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/instance-id", NULL, NULL, &r), 0);
    ASSERT_EQ(r.status, 200);
    cloud_imds_server_free(s);
    return 0;
}

static int test_ttl_bounds(void) {
    fake_now = 0;
    struct cloud_imds_server *s = server(false);
    ASSERT_TRUE(s);
    struct resp r;
    static const char *const bad[] = {"0", "21601", "abc", "-1", "", "1.5", "99999999"};
    ASSERT_EQ(req(s, "PUT", "/latest/api/token", NULL, NULL, &r), 0);
    ASSERT_EQ(r.status, 400);
    ASSERT_CONTAINS(r.body, "400 - Bad Request");
    for (size_t i = 0; i < ST_ARRAY_SIZE(bad); i++) {
        char h[96];
        snprintf(h, sizeof(h), "X-aws-ec2-metadata-token-ttl-seconds: %s", bad[i]);
        ASSERT_EQ(req(s, "PUT", "/latest/api/token", h, NULL, &r), 0);
        if (r.status != 400)
            TEST_FAIL_("ttl '%s' answered %ld, expected 400", bad[i], r.status);
    }
    ASSERT_EQ(req(s, "PUT", "/latest/api/token", "X-aws-ec2-metadata-token-ttl-seconds: 1", NULL,
                  &r), 0);
    ASSERT_EQ(r.status, 200);
    ASSERT_STREQ(r.ttl, "1");
    ASSERT_EQ(req(s, "PUT", "/latest/api/token", "X-aws-ec2-metadata-token-ttl-seconds: 21600",
                  NULL, &r), 0);
    ASSERT_EQ(r.status, 200);
    ASSERT_STREQ(r.ttl, "21600");
    ASSERT_STREQ(r.ctype, "text/plain");
    ASSERT_EQ(r.len, 44);
    /* Two tokens are different. */
    char first[64];
    snprintf(first, sizeof(first), "%s", r.body);
    ASSERT_EQ(req(s, "PUT", "/latest/api/token", "X-aws-ec2-metadata-token-ttl-seconds: 60",
                  NULL, &r), 0);
    ASSERT_TRUE(strcmp(first, r.body) != 0);
    cloud_imds_server_free(s);
    return 0;
}

static int test_forbidden_and_methods(void) {
    struct cloud_imds_server *s = server(false);
    ASSERT_TRUE(s);
    struct resp r;
    const char *ttl = "X-aws-ec2-metadata-token-ttl-seconds: 60";
    ASSERT_EQ(req(s, "PUT", "/latest/api/token", ttl, "X-Forwarded-For: 10.0.0.1", &r), 0);
    ASSERT_EQ(r.status, 403);
    ASSERT_CONTAINS(r.body, "403 - Forbidden");
    ASSERT_EQ(req(s, "PUT", "/2021-03-23/api/token", ttl, NULL, &r), 0);
    ASSERT_EQ(r.status, 403);
    ASSERT_EQ(req(s, "POST", "/latest/api/token", ttl, NULL, &r), 0);
    ASSERT_EQ(r.status, 405);
    char tok[128];
    ASSERT_OK(get_token(s, "60", tok));
    ASSERT_EQ(req(s, "GET", "/latest/api/token", tok, NULL, &r), 0);
    ASSERT_EQ(r.status, 405);
    ASSERT_EQ(req(s, "DELETE", "/latest/meta-data/instance-id", tok, NULL, &r), 0);
    ASSERT_EQ(r.status, 405);
    cloud_imds_server_free(s);
    return 0;
}

static int test_token_expiry(void) {
    fake_now = 500;
    struct cloud_imds_server *s = server(false);
    ASSERT_TRUE(s);
    char tok[128];
    ASSERT_OK(get_token(s, "10", tok));
    struct resp r;
    fake_now = 509.5;
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/instance-type", tok, NULL, &r), 0);
    ASSERT_EQ(r.status, 200);
    ASSERT_STREQ(r.body, "p3.2xlarge");
    ASSERT_STREQ(r.ttl, "1");
    fake_now = 510; /* AEMM: expired when now - created >= ttl */
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/instance-type", tok, NULL, &r), 0);
    ASSERT_EQ(r.status, 401);
    /* A fresh token works again. */
    ASSERT_OK(get_token(s, "10", tok));
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/instance-type", tok, NULL, &r), 0);
    ASSERT_EQ(r.status, 200);
    cloud_imds_server_free(s);
    return 0;
}

static int test_notice_format(void) {
    fake_now = 0;
    struct cloud_imds_server *s = server(false);
    ASSERT_TRUE(s);
    char tok[128];
    ASSERT_OK(get_token(s, "21600", tok));
    struct resp r;
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/spot/instance-action", tok, NULL, &r), 0);
    ASSERT_EQ(r.status, 404);
    ASSERT_CONTAINS(r.body, "<h1>404 - Not Found</h1>");
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/spot/termination-time", tok, NULL, &r), 0);
    ASSERT_EQ(r.status, 404);
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/", tok, NULL, &r), 0);
    ASSERT_TRUE(strstr(r.body, "spot/") == NULL);
    ASSERT_ERR(cloud_imds_server_set_notice(s, "reboot", 1790000090.0), -EINVAL);
    ASSERT_ERR(cloud_imds_server_set_notice(s, "terminate", -5), -EINVAL);
    ASSERT_OK(cloud_imds_server_set_notice(s, "terminate", 1790000090.0));
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/spot/instance-action", tok, NULL, &r), 0);
    ASSERT_EQ(r.status, 200);
    ASSERT_STREQ(r.body, "{\"action\": \"terminate\", \"time\": \"2026-09-21T14:14:50Z\"}");
    ASSERT_STREQ(r.ctype, "text/plain");
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/spot/termination-time", tok, NULL, &r), 0);
    ASSERT_STREQ(r.body, "2026-09-21T14:14:50Z");
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/spot/", tok, NULL, &r), 0);
    ASSERT_STREQ(r.body, "instance-action\ntermination-time");
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/", tok, NULL, &r), 0);
    ASSERT_CONTAINS(r.body, "\nspot/");
    ASSERT_OK(cloud_imds_server_set_notice(s, "stop", 1790000000.0));
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/spot/instance-action", tok, NULL, &r), 0);
    ASSERT_STREQ(r.body, "{\"action\": \"stop\", \"time\": \"2026-09-21T14:13:20Z\"}");
    cloud_imds_server_free(s);
    return 0;
}

static int test_rebalance_and_static(void) {
    struct cloud_imds_server *s = server(false);
    ASSERT_TRUE(s);
    char tok[128];
    ASSERT_OK(get_token(s, "21600", tok));
    struct resp r;
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/events/recommendations/rebalance", tok, NULL, &r),
              0);
    ASSERT_EQ(r.status, 404);
    ASSERT_OK(cloud_imds_server_set_rebalance(s, 1790000070.0));
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/events/recommendations/rebalance", tok, NULL, &r),
              0);
    ASSERT_EQ(r.status, 200);
    ASSERT_STREQ(r.body, "{\"noticeTime\": \"2026-09-21T14:14:30Z\"}");
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/spot/instance-action", tok, NULL, &r), 0);
    ASSERT_EQ(r.status, 404); /* a hint is not a notice */
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/placement/availability-zone", tok, NULL, &r), 0);
    ASSERT_STREQ(r.body, "us-east-1a");
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/placement/region", tok, NULL, &r), 0);
    ASSERT_STREQ(r.body, "us-east-1");
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/instance-life-cycle", tok, NULL, &r), 0);
    ASSERT_STREQ(r.body, "spot");
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/placement/", tok, NULL, &r), 0);
    ASSERT_STREQ(r.body, "availability-zone\nregion");
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/no-such-item", tok, NULL, &r), 0);
    ASSERT_EQ(r.status, 404);
    ASSERT_EQ(req(s, "GET", "/2009-04-04/meta-data/instance-id", tok, NULL, &r), 0);
    ASSERT_EQ(r.status, 404);
    cloud_imds_server_free(s);
    return 0;
}

static int test_inject_and_counts(void) {
    struct cloud_imds_server *s = server(false);
    ASSERT_TRUE(s);
    ASSERT_ERR(cloud_imds_server_inject(s, 418, 1), -EINVAL);
    ASSERT_ERR(cloud_imds_server_inject(s, 503, -1), -EINVAL);
    ASSERT_OK(cloud_imds_server_inject(s, 503, 2));
    struct resp r;
    const char *ttl = "X-aws-ec2-metadata-token-ttl-seconds: 60";
    ASSERT_EQ(req(s, "PUT", "/latest/api/token", ttl, NULL, &r), 0);
    ASSERT_EQ(r.status, 503);
    ASSERT_EQ(req(s, "GET", "/latest/meta-data/", NULL, NULL, &r), 0);
    ASSERT_EQ(r.status, 503);
    ASSERT_EQ(req(s, "PUT", "/latest/api/token", ttl, NULL, &r), 0);
    ASSERT_EQ(r.status, 200);
    unsigned puts = 0, gets = 0;
    cloud_imds_server_counts(s, &puts, &gets);
    ASSERT_EQ(puts, 2);
    ASSERT_EQ(gets, 1);
    char ep[64];
    ASSERT_OK(cloud_imds_server_endpoint(s, ep, sizeof(ep)));
    ASSERT_CONTAINS(ep, "http://127.0.0.1:");
    ASSERT_ERR(cloud_imds_server_endpoint(s, ep, 8), -ENOBUFS);
    cloud_imds_server_free(s);
    return 0;
}

static int test_config_errors(void) {
    struct cloud_imds_server *s = NULL;
    struct cloud_imds_server_config cfg = {0};
    ASSERT_ERR(cloud_imds_server_new(&cfg, &s), -EINVAL);
    cfg.instance_id = "i-1";
    cfg.zone = "a"; /* a zone needs at least a region and a letter */
    ASSERT_ERR(cloud_imds_server_new(&cfg, &s), -EINVAL);
    ASSERT_ERR(cloud_imds_server_new(NULL, &s), -EINVAL);
    ASSERT_TRUE(s == NULL);
    ASSERT_TRUE(cloud_imds_server_free(NULL) == NULL);
    ASSERT_ERR(cloud_imds_server_set_notice(NULL, "stop", 1), -EINVAL);
    /* A port in use is refused. */
    cfg.zone = NULL;
    ASSERT_OK(cloud_imds_server_new(&cfg, &s));
    struct cloud_imds_server *s2 = NULL;
    cfg.port = cloud_imds_server_port(s);
    ASSERT_ERR(cloud_imds_server_new(&cfg, &s2), -EADDRINUSE);
    cloud_imds_server_free(s);
    return 0;
}

static int test_time_formats(void) {
    char buf[32];
    double t;
    ASSERT_OK(cloud_format_rfc3339(1790000090.0, buf, sizeof(buf)));
    ASSERT_STREQ(buf, "2026-09-21T14:14:50Z");
    ASSERT_ERR(cloud_format_rfc3339(1.0, buf, 20), -EINVAL);
    ASSERT_ERR(cloud_format_rfc3339(-1.0, buf, sizeof(buf)), -EINVAL);
    ASSERT_OK(cloud_parse_rfc3339("2026-09-21T14:14:50Z", &t));
    ASSERT_NEAR(t, 1790000090.0, 0, 0);
    ASSERT_OK(cloud_parse_rfc3339("2026-09-21T14:14:50.250Z", &t));
    ASSERT_NEAR(t, 1790000090.25, 1e-6, 0);
    static const char *const bad3339[] = {"", "2026-09-21 14:14:50Z", "2026-09-21T14:14:50",
                                          "2026-13-21T14:14:50Z", "2026-09-21T14:14:50Zjunk",
                                          "26-09-21T14:14:50Z", "2026-09-21T14:14:50.Z"};
    for (size_t i = 0; i < ST_ARRAY_SIZE(bad3339); i++)
        if (cloud_parse_rfc3339(bad3339[i], &t) != -EINVAL)
            TEST_FAIL_("'%s' parsed", bad3339[i]);
    ASSERT_OK(cloud_parse_rfc1123("Tue, 09 Aug 2022 17:07:32 GMT", &t));
    ASSERT_NEAR(t, 1660064852.0, 0, 0);
    static const char *const bad1123[] = {"", "Tue, 09 Aug 2022 17:07:32 UTC",
                                          "Xyz, 09 Aug 2022 17:07:32 GMT",
                                          "Tue, 09 Foo 2022 17:07:32 GMT",
                                          "2022-08-09T17:07:32Z"};
    for (size_t i = 0; i < ST_ARRAY_SIZE(bad1123); i++)
        if (cloud_parse_rfc1123(bad1123[i], &t) != -EINVAL)
            TEST_FAIL_("'%s' parsed", bad1123[i]);
    return 0;
}

TEST_MAIN(TEST(test_token_required), TEST(test_ttl_bounds), TEST(test_forbidden_and_methods),
          TEST(test_token_expiry), TEST(test_notice_format), TEST(test_rebalance_and_static),
          TEST(test_inject_and_counts), TEST(test_config_errors), TEST(test_time_formats))
