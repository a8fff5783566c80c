/* imds-server.c: a loopback IMDSv2 endpoint that answers like EC2's instance metadata service
 * (shared/anchors/cloud-apis.md §1), one per simulated instance.
 *
 * The one idea: a worker must not be able to tell it from the real thing. So tokens are
 * required on every read (401 without, or once expired), the token PUT enforces the TTL header
 * (400 outside 1..21600, 403 with X-Forwarded-For or on a versioned path), errors carry the
 * XHTML pages AEMM serves, and the spot notice is a 404 until the provider posts it.
 * libmicrohttpd answers from its own thread; the small state is behind one mutex. */
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "check.h" /* TRY */
#include "cloud-internal.h"

#define IMDS_MAX_TOKENS 64
#define IMDS_TOKEN_LEN 44
#define IMDS_TTL_MAX 21600

static const char body_404[] =
    "<?xml version=\"1.0\" encoding=\"iso-8859-1\"?>\n"
    "<!DOCTYPE html PUBLIC \"-//W3C//DTD XHTML 1.0 Transitional//EN\"\n"
    "\t\"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd\">\n"
    "<html xmlns=\"http://www.w3.org/1999/xhtml\" xml:lang=\"en\" lang=\"en\">\n"
    " <head>\n"
    "  <title>404 - Not Found</title>\n"
    " </head>\n"
    " <body>\n"
    "  <h1>404 - Not Found</h1>\n"
    " </body>\n"
    "</html>\n";

/* The 401 page; 400, 403 and 405 use the same page with their own title. */
static const char body_err_fmt[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<!DOCTYPE html PUBLIC \"-//W3C//DTD XHTML 1.0 Transitional//EN\" "
    "\"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd\">\n"
    "<html xmlns=\"http://www.w3.org/1999/xhtml\" xml:lang=\"en\" lang=\"en\">\n"
    "   <head>\n"
    "      <title>%s</title>\n"
    "   </head>\n"
    "   <body>\n"
    "      <h1>%s</h1>\n"
    "   </body>\n"
    "</html>\n";

struct imds_token {
    char value[IMDS_TOKEN_LEN + 1];
    double created; /* server clock seconds */
    long ttl;       /* seconds */
};

struct cloud_imds_server {
    struct MHD_Daemon *daemon;
    unsigned short port;
    char instance_id[CLOUD_NAME_MAX];
    char instance_type[CLOUD_NAME_MAX];
    char zone[CLOUD_NAME_MAX];
    bool token_optional;
    cloud_clock_fn *clock;
    void *clock_userdata;

    pthread_mutex_t lock; /* guards everything below */
    struct imds_token tokens[IMDS_MAX_TOKENS];
    size_t ntokens;
    bool notice;
    char notice_action[16];
    char notice_time[32];   /* RFC 3339 */
    bool rebalance;
    char rebalance_time[32];
    int inject_status;
    int inject_count;
    unsigned puts, gets;
    char role[64];   /* instance profile role name; "" = no role (iam paths are 404) */
    char *role_json; /* its security-credentials document */
};

static double server_now(struct cloud_imds_server *s) {
    return s->clock ? s->clock(s->clock_userdata) : st_now();
}

/* Queues a response; the body is copied. ttl >= 0 adds the token TTL header. */
static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *body,
                             const char *ctype, long ttl) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                                                MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", ctype);
    MHD_add_response_header(resp, "Server", "EC2ws");
    if (ttl >= 0) {
        char v[24];
        snprintf(v, sizeof(v), "%ld", ttl);
        MHD_add_response_header(resp, "X-Aws-Ec2-Metadata-Token-Ttl-Seconds", v);
    }
    enum MHD_Result r = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return r;
}

static enum MHD_Result reply_error(struct MHD_Connection *conn, unsigned status) {
    if (status == MHD_HTTP_NOT_FOUND)
        return reply(conn, status, body_404, "text/html", -1);
    const char *title = status == 400   ? "400 - Bad Request"
                        : status == 401 ? "401 - Unauthorized"
                        : status == 403 ? "403 - Forbidden"
                        : status == 405 ? "405 - Method Not Allowed"
                        : status == 429 ? "429 - Too Many Requests"
                        : status == 503 ? "503 - Service Unavailable"
                                        : "500 - Internal Server Error";
    char body[1024];
    snprintf(body, sizeof(body), body_err_fmt, title, title);
    return reply(conn, status, body, "text/html", -1);
}

/* A fresh opaque token: 33 random bytes in URL-safe base64. */
static void make_token(char out[IMDS_TOKEN_LEN + 1]) {
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    unsigned char raw[33];
    size_t got = 0;
    while (got < sizeof(raw)) {
        ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);
        if (n <= 0) {
            /* getrandom() on Linux >= 3.17 does not fail for small requests; keep going
             * with what the stack holds mixed with a counter rather than abort. */
            static unsigned ctr;
            for (; got < sizeof(raw); got++)
                raw[got] = (unsigned char)(raw[got] ^ (++ctr * 131u));
            break;
        }
        got += (size_t)n;
    }
    for (size_t i = 0, o = 0; i < sizeof(raw); i += 3) {
        unsigned v = (unsigned)raw[i] << 16 | (unsigned)raw[i + 1] << 8 | raw[i + 2];
        out[o++] = b64[(v >> 18) & 63];
        out[o++] = b64[(v >> 12) & 63];
        out[o++] = b64[(v >> 6) & 63];
        out[o++] = b64[v & 63];
    }
    out[IMDS_TOKEN_LEN] = '\0';
}

/* Strict TTL parse: decimal digits only, 1..21600. */
static long parse_ttl(const char *v) {
    if (!v || !*v || strlen(v) > 6)
        return -1;
    long ttl = 0;
    for (const char *p = v; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        ttl = ttl * 10 + (*p - '0');
    }
    return ttl >= 1 && ttl <= IMDS_TTL_MAX ? ttl : -1;
}

static enum MHD_Result handle_token(struct cloud_imds_server *s, struct MHD_Connection *conn) {
    if (MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Forwarded-For"))
        return reply_error(conn, 403);
    long ttl = parse_ttl(MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     "X-aws-ec2-metadata-token-ttl-seconds"));
    if (ttl < 0)
        return reply_error(conn, 400);
    double now = server_now(s);
    /* Reuse the slot of an expired token, else the oldest one. */
    size_t slot = s->ntokens;
    if (s->ntokens == IMDS_MAX_TOKENS) {
        slot = 0;
        for (size_t i = 0; i < s->ntokens; i++) {
            if (now - s->tokens[i].created >= (double)s->tokens[i].ttl) {
                slot = i;
                break;
            }
            if (s->tokens[i].created < s->tokens[slot].created)
                slot = i;
        }
    } else {
        s->ntokens++;
    }
    make_token(s->tokens[slot].value);
    s->tokens[slot].created = now;
    s->tokens[slot].ttl = ttl;
    return reply(conn, 200, s->tokens[slot].value, "text/plain", ttl);
}

/* Remaining TTL of a valid token, or -1 when missing, unknown or expired. */
static long token_remaining(struct cloud_imds_server *s, const char *tok) {
    if (!tok)
        return -1;
    double now = server_now(s);
    for (size_t i = 0; i < s->ntokens; i++) {
        if (strcmp(s->tokens[i].value, tok) != 0)
            continue;
        double left = (double)s->tokens[i].ttl - (now - s->tokens[i].created);
        if (left <= 0)
            return -1;
        long l = (long)left;
        return l < 1 ? 1 : l;
    }
    return -1;
}

static enum MHD_Result handle_get(struct cloud_imds_server *s, struct MHD_Connection *conn,
                                  const char *url) {
    long ttl = token_remaining(
        s, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-aws-ec2-metadata-token"));
    if (ttl < 0 && !s->token_optional)
        return reply_error(conn, 401);
    static const char prefix[] = "/latest/meta-data/";
    if (strncmp(url, prefix, sizeof(prefix) - 1) != 0)
        return reply_error(conn, 404);
    const char *item = url + sizeof(prefix) - 1;
    char buf[512];
    static const char creds[] = "iam/security-credentials/";
    const char *body = NULL;
    if (strcmp(item, "") == 0) {
        snprintf(buf, sizeof(buf), "%sinstance-id\ninstance-life-cycle\ninstance-type\n"
                 "placement/%s",
                 s->rebalance ? "events/\n" : "", s->notice ? "\nspot/" : "");
        body = buf;
    } else if (strcmp(item, "instance-id") == 0) {
        body = s->instance_id;
    } else if (strcmp(item, "instance-type") == 0) {
        body = s->instance_type;
    } else if (strcmp(item, "instance-life-cycle") == 0) {
        body = "spot";
    } else if (strcmp(item, "placement/") == 0) {
        body = "availability-zone\nregion";
    } else if (strcmp(item, "placement/availability-zone") == 0) {
        body = s->zone;
    } else if (strcmp(item, "placement/region") == 0) {
        snprintf(buf, sizeof(buf), "%.*s", (int)strlen(s->zone) - 1, s->zone);
        body = buf;
    } else if (strcmp(item, "spot/") == 0 && s->notice) {
        body = "instance-action\ntermination-time";
    } else if (strcmp(item, "spot/instance-action") == 0 && s->notice) {
        snprintf(buf, sizeof(buf), "{\"action\": \"%s\", \"time\": \"%s\"}", s->notice_action,
                 s->notice_time);
        body = buf;
    } else if (strcmp(item, "spot/termination-time") == 0 && s->notice) {
        body = s->notice_time;
    } else if (strcmp(item, "iam/") == 0 && s->role[0]) {
        body = "info\nsecurity-credentials/";
    } else if (strcmp(item, creds) == 0 && s->role[0]) {
        body = s->role;
    } else if (strncmp(item, creds, sizeof(creds) - 1) == 0 && s->role[0] &&
               strcmp(item + sizeof(creds) - 1, s->role) == 0) {
        return reply(conn, 200, s->role_json, "text/plain", ttl);
    } else if (strcmp(item, "events/") == 0 && s->rebalance) {
        body = "recommendations/";
    } else if (strcmp(item, "events/recommendations/") == 0 && s->rebalance) {
        body = "rebalance";
    } else if (strcmp(item, "events/recommendations/rebalance") == 0 && s->rebalance) {
        snprintf(buf, sizeof(buf), "{\"noticeTime\": \"%s\"}", s->rebalance_time);
        body = buf;
    }
    if (!body)
        return reply_error(conn, 404);
    return reply(conn, 200, body, "text/plain", ttl);
}

static enum MHD_Result access_handler(void *cls, struct MHD_Connection *conn, const char *url,
                                      const char *method, const char *version,
                                      const char *upload_data, size_t *upload_data_size,
                                      void **con_cls) {
    struct cloud_imds_server *s = cls;
    static int marker;
    if (!*con_cls) { /* headers only so far; answer once any body has been read */
        *con_cls = &marker;
        return MHD_YES;
    }
    if (*upload_data_size) {
        *upload_data_size = 0; /* IMDS ignores request bodies */
        return MHD_YES;
    }
    pthread_mutex_lock(&s->lock);
    enum MHD_Result r;
    bool is_put = strcmp(method, "PUT") == 0;
    if (is_put)
        s->puts++;
    else
        s->gets++;
    size_t ulen = strlen(url);
    bool token_path = ulen >= 10 && strcmp(url + ulen - 10, "/api/token") == 0;
    if (s->inject_count > 0) {
        s->inject_count--;
        r = reply_error(conn, (unsigned)s->inject_status);
    } else if (is_put && strcmp(url, "/latest/api/token") == 0) {
        r = handle_token(s, conn);
    } else if (is_put && token_path) {
        r = reply_error(conn, 403); /* versioned token paths are refused (§1.1) */
    } else if (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0) {
        r = token_path ? reply_error(conn, 405) : handle_get(s, conn, url);
    } else {
        r = reply_error(conn, 405);
    }
    pthread_mutex_unlock(&s->lock);
    return r;
}

int cloud_imds_server_new(const struct cloud_imds_server_config *cfg,
                          struct cloud_imds_server **ret_s) {
    if (!cfg || !ret_s || !cfg->instance_id || !*cfg->instance_id ||
        strlen(cfg->instance_id) >= CLOUD_NAME_MAX ||
        (cfg->instance_type && strlen(cfg->instance_type) >= CLOUD_NAME_MAX) ||
        (cfg->zone && (strlen(cfg->zone) < 2 || strlen(cfg->zone) >= CLOUD_NAME_MAX)))
        return -EINVAL;
    struct cloud_imds_server *s = st_calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    snprintf(s->instance_id, sizeof(s->instance_id), "%s", cfg->instance_id);
    snprintf(s->instance_type, sizeof(s->instance_type), "%s",
             cfg->instance_type ? cfg->instance_type : "sim.local");
    snprintf(s->zone, sizeof(s->zone), "%s", cfg->zone ? cfg->zone : "local-1a");
    s->token_optional = cfg->token_optional;
    s->clock = cfg->clock;
    s->clock_userdata = cfg->clock_userdata;
    pthread_mutex_init(&s->lock, NULL);

    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(cfg->port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    s->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, NULL, NULL,
                                 access_handler, s, MHD_OPTION_SOCK_ADDR,
                                 (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned)30, MHD_OPTION_END);
    if (!s->daemon) {
        pthread_mutex_destroy(&s->lock);
        st_free(s);
        return -EADDRINUSE;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : cfg->port;
    *ret_s = s;
    return 0;
}

struct cloud_imds_server *cloud_imds_server_free(struct cloud_imds_server *s) {
    if (!s)
        return NULL;
    MHD_stop_daemon(s->daemon);
    pthread_mutex_destroy(&s->lock);
    if (s->role_json)
        memset(s->role_json, 0, strlen(s->role_json)); /* a secret */
    st_free(s->role_json);
    st_free(s);
    return NULL;
}

unsigned short cloud_imds_server_port(const struct cloud_imds_server *s) {
    return s ? s->port : 0;
}

int cloud_imds_server_endpoint(const struct cloud_imds_server *s, char *buf, size_t size) {
    if (!s || !buf)
        return -EINVAL;
    int n = snprintf(buf, size, "http://127.0.0.1:%u", (unsigned)s->port);
    return n < 0 || (size_t)n >= size ? -ENOBUFS : 0;
}

int cloud_imds_server_set_notice(struct cloud_imds_server *s, const char *action, double time) {
    if (!s || !action ||
        (strcmp(action, "terminate") && strcmp(action, "stop") && strcmp(action, "hibernate")))
        return -EINVAL;
    char t[32];
    int r = cloud_format_rfc3339(time, t, sizeof(t));
    if (r < 0)
        return r;
    pthread_mutex_lock(&s->lock);
    s->notice = true;
    snprintf(s->notice_action, sizeof(s->notice_action), "%s", action);
    memcpy(s->notice_time, t, sizeof(t));
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int cloud_imds_server_set_rebalance(struct cloud_imds_server *s, double notice_time) {
    if (!s)
        return -EINVAL;
    char t[32];
    int r = cloud_format_rfc3339(notice_time, t, sizeof(t));
    if (r < 0)
        return r;
    pthread_mutex_lock(&s->lock);
    s->rebalance = true;
    memcpy(s->rebalance_time, t, sizeof(t));
    pthread_mutex_unlock(&s->lock);
    return 0;
}

/* See cloud.h. */
int cloud_imds_server_set_role(struct cloud_imds_server *s, const char *role, const char *key_id,
                               const char *secret, const char *token, double expiration) {
    char exp[32], now[32];
    if (!s || !role || !*role || strlen(role) >= sizeof(s->role) || strchr(role, '/') ||
        !key_id || !secret || !token)
        return -EINVAL;
    TRY(cloud_format_rfc3339(expiration, exp, sizeof(exp)));
    TRY(cloud_format_rfc3339(st_wall(), now, sizeof(now)));
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "Code", "Success",
                          "LastUpdated", now, "Type", "AWS-HMAC", "AccessKeyId", key_id,
                          "SecretAccessKey", secret, "Token", token, "Expiration", exp);
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    char *copy = text ? st_strdup(text) : NULL;
    if (text) {
        memset(text, 0, strlen(text));
        free(text);
    }
    if (!copy)
        return -ENOMEM;
    pthread_mutex_lock(&s->lock);
    snprintf(s->role, sizeof(s->role), "%s", role);
    if (s->role_json)
        memset(s->role_json, 0, strlen(s->role_json));
    st_free(s->role_json);
    s->role_json = copy;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int cloud_imds_server_inject(struct cloud_imds_server *s, int status, int count) {
    if (!s || (status != 429 && status != 500 && status != 503) || count < 0)
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    s->inject_status = status;
    s->inject_count = count;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

void cloud_imds_server_counts(struct cloud_imds_server *s, unsigned *ret_puts,
                              unsigned *ret_gets) {
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    if (ret_puts)
        *ret_puts = s->puts;
    if (ret_gets)
        *ret_gets = s->gets;
    pthread_mutex_unlock(&s->lock);
}
