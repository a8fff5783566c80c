/* notice.c: the worker-side notice client shell and the one libcurl request function that the
 * AWS, GCE and Azure backends share.
 *
 * The one idea: these requests go to a link-local metadata service, so they must never take a
 * proxy (CURLOPT_NOPROXY "*"), must time out fast, and must keep one connection alive between
 * polls. Everything cloud-specific (paths, headers, tokens, body formats) is in the backends. */
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cloud-internal.h"

#define CLOUD_NOTICE_MAGIC 0x436c6f75644e7463ULL /* "CloudNtc" */

static const struct cloud_notice_ops *const notice_backends[] = {
    &cloud__aws_notice_ops, &cloud__gcp_notice_ops, &cloud__azure_notice_ops};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result;

static void curl_global_once(void) {
    curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT);
}

const char *cloud_notice_kind_name(enum cloud_notice_kind k) {
    switch (k) {
    case CLOUD_NOTICE_NONE: return "none";
    case CLOUD_NOTICE_TERMINATE: return "terminate";
    case CLOUD_NOTICE_STOP: return "stop";
    case CLOUD_NOTICE_HIBERNATE: return "hibernate";
    case CLOUD_NOTICE_REBALANCE: return "rebalance";
    }
    return "unknown";
}

static bool client_ok(const struct cloud_notice_client *c) {
    return c && c->magic == CLOUD_NOTICE_MAGIC;
}

double cloud__client_now(struct cloud_notice_client *c) {
    return c->clock ? c->clock(c->clock_userdata) : st_now();
}

/* The base URL: explicit, else the cloud's environment override, else its default. */
static int resolve_endpoint(const char *kind, const char *explicit_url, char *buf, size_t size) {
    const char *url = explicit_url;
    char tmp[CLOUD_URL_MAX];
    if (!url && strcmp(kind, "aws") == 0) {
        url = getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
        if (!url || !*url)
            url = "http://169.254.169.254";
    } else if (!url && strcmp(kind, "gcp") == 0) {
        const char *host = getenv("GCE_METADATA_HOST"); /* host:port, no scheme */
        if (host && *host) {
            if (snprintf(tmp, sizeof(tmp), "http://%s", host) >= (int)sizeof(tmp))
                return -EINVAL;
            url = tmp;
        } else {
            url = "http://metadata.google.internal";
        }
    } else if (!url) {
        url = "http://169.254.169.254";
    }
    size_t len = strlen(url);
    while (len > 0 && url[len - 1] == '/')
        len--;
    if ((strncasecmp(url, "http://", 7) != 0 && strncasecmp(url, "https://", 8) != 0) ||
        len <= 8 || len >= size)
        return -EINVAL;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)url[i] <= ' ')
            return -EINVAL;
    memcpy(buf, url, len);
    buf[len] = '\0';
    return 0;
}

int cloud_notice_client_new(const char *kind, const struct cloud_notice_config *cfg,
                            struct cloud_notice_client **ret_c) {
    if (!kind || !cfg || !ret_c || cfg->timeout_ms < 0 || cfg->timeout_ms > 600000 ||
        cfg->token_ttl < 0 || cfg->token_ttl > 21600 ||
        (cfg->vm_name && strlen(cfg->vm_name) >= CLOUD_NAME_MAX))
        return -EINVAL;
    const struct cloud_notice_ops *ops = NULL;
    for (size_t i = 0; i < ST_ARRAY_SIZE(notice_backends); i++)
        if (strcmp(notice_backends[i]->name, kind) == 0)
            ops = notice_backends[i];
    if (!ops)
        return -ENOENT;
    pthread_once(&curl_once, curl_global_once);
    if (curl_init_result != CURLE_OK)
        return -EIO;
    struct cloud_notice_client *c = st_calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    int r = resolve_endpoint(kind, cfg->endpoint, c->endpoint, sizeof(c->endpoint));
    if (r < 0)
        goto fail;
    c->magic = CLOUD_NOTICE_MAGIC;
    c->ops = ops;
    c->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : 2000;
    c->token_ttl = cfg->token_ttl ? cfg->token_ttl : 21600;
    snprintf(c->vm_name, sizeof(c->vm_name), "%s", cfg->vm_name ? cfg->vm_name : "");
    c->clock = cfg->clock;
    c->clock_userdata = cfg->clock_userdata;
    c->share = curl_share_init();
    c->state = st_calloc(1, ops->state_size ? ops->state_size : 1);
    if (!c->share || !c->state ||
        curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT) != CURLSHE_OK) {
        r = -ENOMEM;
        goto fail;
    }
    r = ops->init ? ops->init(c, c->state) : 0;
    if (r < 0)
        goto fail;
    *ret_c = c;
    return 0;
fail:
    if (c->share)
        curl_share_cleanup(c->share);
    st_free(c->state);
    st_free(c);
    return r;
}

struct cloud_notice_client *cloud_notice_client_free(struct cloud_notice_client *c) {
    if (!client_ok(c))
        return NULL;
    if (c->ops->done)
        c->ops->done(c, c->state);
    curl_share_cleanup(c->share);
    st_free(c->state);
    c->magic = 0;
    st_free(c);
    return NULL;
}

const char *cloud_notice_client_endpoint(const struct cloud_notice_client *c) {
    return client_ok(c) ? c->endpoint : "";
}

int cloud_notice_client_poll(struct cloud_notice_client *c, struct cloud_notice *ret_notice) {
    if (!client_ok(c) || !ret_notice)
        return -EINVAL;
    struct cloud_notice n;
    memset(&n, 0, sizeof(n));
    int r = c->ops->poll(c, c->state, &n);
    if (r > 0)
        *ret_notice = n;
    return r;
}

int cloud_notice_client_identity(struct cloud_notice_client *c, struct cloud_identity *ret_id) {
    if (!client_ok(c) || !ret_id)
        return -EINVAL;
    if (!c->ops->identity)
        return -EOPNOTSUPP;
    struct cloud_identity id;
    memset(&id, 0, sizeof(id));
    int r = c->ops->identity(c, c->state, &id);
    if (r >= 0)
        *ret_id = id;
    return r;
}

/* ---- the request ------------------------------------------------------------------------- */

struct body_buf {
    char *data;
    size_t len;
    bool too_big;
};

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata) {
    struct body_buf *b = userdata;
    size_t n = size * nmemb;
    if (b->len + n > CLOUD_HTTP_BODY_MAX) {
        b->too_big = true;
        return 0; /* aborts the transfer with CURLE_WRITE_ERROR */
    }
    char *nd = st_realloc(b->data, b->len + n + 1);
    if (!nd)
        return 0;
    memcpy(nd + b->len, ptr, n);
    b->data = nd;
    b->len += n;
    b->data[b->len] = '\0';
    return n;
}

static size_t on_header(char *ptr, size_t size, size_t nitems, void *userdata) {
    long *ttl = userdata;
    size_t n = size * nitems;
    static const char name[] = "x-aws-ec2-metadata-token-ttl-seconds:";
    if (n > sizeof(name) - 1 && strncasecmp(ptr, name, sizeof(name) - 1) == 0) {
        char v[32];
        size_t vl = ST_MIN(n - (sizeof(name) - 1), sizeof(v) - 1);
        memcpy(v, ptr + sizeof(name) - 1, vl);
        v[vl] = '\0';
        char *end;
        long t = strtol(v, &end, 10);
        while (*end == ' ' || *end == '\r' || *end == '\n' || *end == '\t')
            end++;
        if (*end == '\0' && t > 0)
            *ttl = t;
    }
    return n;
}

static int curl_errno(CURLcode cc, bool too_big) {
    switch (cc) {
    case CURLE_OK: return 0;
    case CURLE_OPERATION_TIMEDOUT: return -ETIMEDOUT;
    case CURLE_COULDNT_CONNECT: return -ECONNREFUSED;
    case CURLE_OUT_OF_MEMORY: return -ENOMEM;
    case CURLE_WRITE_ERROR: return too_big ? -EFBIG : -ENOMEM;
    case CURLE_URL_MALFORMAT: return -EINVAL;
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR: return -ECONNRESET;
    default: return -EIO;
    }
}

/* Each request gets a fresh easy handle; only the connection cache (c->share) outlives it.
 * Reusing one easy handle is what libcurl 7.88.1 (Debian bookworm) gets wrong: its header
 * store keeps a pointer to the previous response's last header ("prevhead") across
 * requests, and curl_easy_reset() does not clear it, so a response whose first header line
 * is a folded continuation (starts with a space) makes libcurl read the freed header of the
 * previous response (heap-use-after-free inside curl_easy_perform; curl PR #11103, fixed in
 * 8.1.0; input tests/fuzz/regressions/imds/curl-7.88-prevhead-uaf). A new handle starts with
 * that pointer NULL, and the shared cache still keeps the connection alive between polls. */
int cloud__http(struct cloud_notice_client *c, const char *method, const char *path_and_query,
                const char *const *headers, struct cloud_http_reply *ret_reply) {
    char url[CLOUD_URL_MAX + 512];
    if (snprintf(url, sizeof(url), "%s%s", c->endpoint, path_and_query) >= (int)sizeof(url))
        return -EINVAL;
    struct curl_slist *hl = NULL;
    for (size_t i = 0; headers && headers[i]; i++) {
        struct curl_slist *n = curl_slist_append(hl, headers[i]);
        if (!n) {
            curl_slist_free_all(hl);
            return -ENOMEM;
        }
        hl = n;
    }
    CURL *h = curl_easy_init();
    if (!h) {
        curl_slist_free_all(hl);
        return -ENOMEM;
    }
    struct body_buf body = {0};
    long ttl = -1;
    curl_easy_setopt(h, CURLOPT_SHARE, c->share);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, c->timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, c->timeout_ms);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    if (strcmp(method, "GET") != 0)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &ttl);
    CURLcode cc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    /* The handle goes before the header list it points to; its connection stays in c->share. */
    curl_easy_cleanup(h);
    curl_slist_free_all(hl);
    int r = curl_errno(cc, body.too_big);
    if (r < 0) {
        st_free(body.data);
        return r;
    }
    if (!body.data) {
        body.data = st_strdup("");
        if (!body.data)
            return -ENOMEM;
    }
    ret_reply->status = status;
    ret_reply->body = body.data;
    ret_reply->len = body.len;
    ret_reply->ttl_header = ttl;
    return 0;
}

void cloud__http_reply_done(struct cloud_http_reply *r) {
    st_free(r->body);
    r->body = NULL;
}

int cloud__http_status_errno(long status) {
    if (status == 400)
        return -EINVAL;
    if (status == 401 || status == 403)
        return -EACCES;
    if (status == 404)
        return -ENOENT;
    if (status == 429 || status == 410 || status >= 500)
        return -EAGAIN;
    return -EPROTO;
}
