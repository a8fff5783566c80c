/* store-az.c: the az checkpoint store — block blobs in Azure Blob Storage over its REST API
 * (libcurl), authorised with an Azure AD bearer token (common/oauth.c) or the account's Shared
 * Key (AZURE_STORAGE_KEY).
 *
 * The one idea: a block blob appears whole or not at all. A small file is one Put Blob; a
 * large one is staged as blocks (Put Block, bounded in size) that stay invisible until one Put
 * Block List commits them all, so a cut-short upload leaves no blob (Azure drops uncommitted
 * blocks after a week). That keeps ckpt.c's commit point — the manifest is written last — as it
 * is on S3.
 *
 * Addressing: az://ACCOUNT/CONTAINER/PREFIX goes to https://ACCOUNT.blob.core.windows.net, or
 * to AZURE_STORAGE_ENDPOINT, the account's blob service URL (Azurite's path style
 * http://127.0.0.1:10000/ACCOUNT, a private endpoint; http:// only on loopback, since the
 * credentials would travel in clear). Every request carries x-ms-version and x-ms-date. With
 * AZURE_STORAGE_KEY the request is signed with Shared Key (HMAC-SHA256 of the canonical
 * string the Blob service documents); else a bearer token for https://storage.azure.com from a
 * client secret or a managed identity, as the azure provider gets them. Neither the key nor
 * the token reaches a log line. */
#include <curl/curl.h>
#include <fcntl.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "migrate-store.h"
#include "oauth.h" /* st_azure_token_get, st_url_is_loopback */

#define AZ_VERSION "2021-08-06"      /* x-ms-version: bearer tokens need >= 2017-11-09 */
#define AZ_RESOURCE "https://storage.azure.com"
#define AZ_BLOCK_DEFAULT (64u << 20) /* bytes per staged block */
#define AZ_BLOCK_MIN (64u << 10)     /* smallest block SPOTTRAIN_AZ_BLOCK_BYTES may set */
#define AZ_BLOCKS_MAX 50000          /* Azure: blocks per blob */
#define AZ_REPLY_MAX (16u << 20)     /* XML answers larger than this are refused */
#define AZ_TRIES 4                   /* tries of one request on 5xx / 429 / reset */
#define AZ_QUERY_MAX 6               /* query parameters of one request */

/* A parsed az://ACCOUNT/CONTAINER/BLOB and where to send it. */
struct az_target {
    char account[64];
    char container[64];
    char blob[1024];       /* blob name (no trailing '/'), may be "" */
    char svc[1024];        /* the account's blob service URL, without trailing '/' */
    const char *svc_path;  /* the path part of svc ("" or "/ACCOUNT"), for Shared Key */
    unsigned char key[128]; /* the decoded Shared Key; key_len 0 = bearer token */
    size_t key_len;
    struct st_token token;
};

/* The last bearer token, shared by the threads of this process. Failures are not cached. */
static struct {
    pthread_mutex_t lock;
    struct st_token token;
} token_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int credentials(struct az_target *t, const char *url) {
    char why[1024];
    const char *k = getenv("AZURE_STORAGE_KEY");
    int r = 0;
    if (k && *k) {
        unsigned char raw[sizeof(t->key) + 4];
        size_t kl = strlen(k);
        int n = kl % 4 == 0 && kl / 4 * 3 <= sizeof(raw)
                    ? EVP_DecodeBlock(raw, (const unsigned char *)k, (int)kl) : -1;
        if (n > 0) /* EVP_DecodeBlock counts the padding's zero bytes */
            n -= (kl > 0 && k[kl - 1] == '=') + (kl > 1 && k[kl - 2] == '=');
        if (n <= 0 || (size_t)n > sizeof(t->key)) {
            memset(raw, 0, sizeof(raw));
            return st_log_errno(-EINVAL, "Cannot reach '%s': AZURE_STORAGE_KEY is not a base64 "
                                "account key", url);
        }
        memcpy(t->key, raw, (size_t)n);
        t->key_len = (size_t)n;
        memset(raw, 0, sizeof(raw));
        return 0;
    }
    pthread_mutex_lock(&token_cache.lock);
    if (st_now() > token_cache.token.expiry - 60)
        r = st_azure_token_get(AZ_RESOURCE, &token_cache.token, why, sizeof(why));
    if (r == 0)
        t->token = token_cache.token;
    pthread_mutex_unlock(&token_cache.lock);
    if (r < 0)
        return st_log_errno(r, "Cannot reach '%s': %s", url, why);
    return 0;
}

/* Parses url into t and finds credentials. Logs (once) why it cannot. */
static int target_init(const char *url, struct az_target *t) {
    memset(t, 0, sizeof(*t));
    if (strncmp(url, "az://", 5) != 0)
        return -EINVAL;
    const char *a = url + 5, *s1 = strchr(a, '/');
    const char *c = s1 ? s1 + 1 : NULL, *s2 = c ? strchr(c, '/') : NULL;
    size_t al = s1 ? (size_t)(s1 - a) : 0, cl = c ? (s2 ? (size_t)(s2 - c) : strlen(c)) : 0;
    if (al < 3 || al >= sizeof(t->account) || cl < 3 || cl >= sizeof(t->container))
        return st_log_errno(-EINVAL, "Bad Azure URL '%s' (want az://ACCOUNT/CONTAINER/PREFIX: "
                            "an account and a container of 3 to 63 characters)", url);
    memcpy(t->account, a, al);
    memcpy(t->container, c, cl);
    const char *blob = s2 ? s2 + 1 : "";
    size_t bl = strlen(blob);
    while (bl && blob[bl - 1] == '/')
        bl--;
    if (bl >= sizeof(t->blob))
        return st_log_errno(-ENAMETOOLONG, "Bad Azure URL '%s': blob name too long", url);
    memcpy(t->blob, blob, bl);
    const char *ep = getenv("AZURE_STORAGE_ENDPOINT");
    int w = ep && *ep ? snprintf(t->svc, sizeof(t->svc), "%s", ep)
                      : snprintf(t->svc, sizeof(t->svc), "https://%s.blob.core.windows.net",
                                 t->account);
    if (w < 0 || (size_t)w >= sizeof(t->svc))
        return st_log_errno(-ENAMETOOLONG, "Azure URL '%s' too long", url);
    size_t n = strlen(t->svc);
    while (n && t->svc[n - 1] == '/')
        t->svc[--n] = '\0';
    if (!(strncmp(t->svc, "https://", 8) == 0 ||
          (strncmp(t->svc, "http://", 7) == 0 && st_url_is_loopback(t->svc))))
        return st_log_errno(-EINVAL, "Bad AZURE_STORAGE_ENDPOINT '%s' (want https://, or "
                            "http:// on loopback)", t->svc);
    const char *host = strstr(t->svc, "://") + 3, *path = strchr(host, '/');
    t->svc_path = path ? path : "";
    return credentials(t, url);
}

static void target_done(struct az_target *t) {
    volatile unsigned char *q = t->key;
    for (size_t i = 0; i < sizeof(t->key); i++)
        q[i] = 0;
    st_token_wipe(&t->token);
}

/* ---- one request ------------------------------------------------------------------------- */

struct az_hdrs {
    char error_code[96]; /* x-ms-error-code */
    uint64_t total;      /* from Content-Range "bytes a-b/TOTAL", else Content-Length */
    bool have_range;
};

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *userdata) {
    struct az_hdrs *h = userdata;
    size_t n = size * nmemb;
    char line[512];
    snprintf(line, sizeof(line), "%.*s", (int)ST_MIN(n, sizeof(line) - 1), ptr);
    line[strcspn(line, "\r\n")] = '\0';
    if (!strncasecmp(line, "x-ms-error-code:", 16)) {
        snprintf(h->error_code, sizeof(h->error_code), "%s", line + 16 + strspn(line + 16, " "));
    } else if (!strncasecmp(line, "content-range:", 14)) {
        const char *s = strchr(line, '/');
        if (s && s[1] != '*') {
            h->total = strtoull(s + 1, NULL, 10);
            h->have_range = true;
        }
    } else if (!strncasecmp(line, "content-length:", 15) && !h->have_range) {
        h->total = strtoull(line + 15, NULL, 10);
    }
    return n;
}

static int code_errno(const char *code, long status) {
    static const char *const auth[] = {"AuthenticationFailed", "AuthorizationFailure",
        "AuthorizationPermissionMismatch", "InvalidAuthenticationInfo",
        "NoAuthenticationInformation", "AuthorizationSourceIPMismatch",
        "InsufficientAccountPermissions"};
    for (size_t i = 0; i < ST_ARRAY_SIZE(auth); i++)
        if (!strcmp(code, auth[i]))
            return -EACCES;
    if (!strcmp(code, "BlobNotFound"))
        return -ENOENT;
    if (!strcmp(code, "ContainerNotFound"))
        return -ENXIO;
    if (!strcmp(code, "ServerBusy") || !strcmp(code, "InternalError") || status == 429 ||
        status >= 500)
        return -EBUSY;
    if (status == 404)
        return -ENOENT;
    if (status == 401 || status == 403)
        return -EACCES;
    return -EPROTO;
}

struct az_query {
    const char *name, *value; /* value unescaped */
};

struct az_req {
    const char *method;       /* GET, PUT, DELETE */
    bool container;           /* the request is on the container, not the blob */
    struct az_query q[AZ_QUERY_MAX]; /* sorted by name (Shared Key signs them in order) */
    const void *body;         /* PUT body, or NULL */
    size_t body_len;
    const char *range;        /* "a-b" or NULL (GET) */
    bool block_blob;          /* x-ms-blob-type: BlockBlob (Put Blob) */
    struct mig__store_buf *out;
    struct az_hdrs *hdrs;     /* may be NULL */
    bool quiet_404;
};

/* Appends to a bounded string; *n past sz marks it as too long (checked once at the end). */
static void sts_add(char *buf, size_t sz, size_t *n, const char *fmt, ...) ST_PRINTF(4, 5);
static void sts_add(char *buf, size_t sz, size_t *n, const char *fmt, ...) {
    va_list ap;
    if (*n >= sz)
        return;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *n, sz - *n, fmt, ap);
    va_end(ap);
    *n = w < 0 ? sz : *n + (size_t)w;
}

/* The Shared Key "Authorization: SharedKey ACCOUNT:SIG" header for q (Blob service, version
 * 2015-02-21 and later: an empty Content-Length when there is no body). The string to sign is
 * the one the service documents: verb, the standard headers (only Content-Length and
 * Content-Type are ever sent; x-ms-date stands for Date), the x-ms-* headers sorted, then
 * /ACCOUNT + the encoded path and the query parameters sorted, unescaped. */
static int shared_key(const struct az_target *t, const struct az_req *q, const char *path,
                      const char *date, const char *xrange, char *out, size_t sz) {
    char sts[8192];
    size_t n = 0;
    sts_add(sts, sizeof(sts), &n, "%s\n\n\n", q->method);
    if (q->body_len)
        sts_add(sts, sizeof(sts), &n, "%zu", q->body_len);
    sts_add(sts, sizeof(sts), &n, "\n\n%s\n\n\n\n\n\n\n",
            strcmp(q->method, "PUT") ? "" : "application/octet-stream");
    if (q->block_blob)
        sts_add(sts, sizeof(sts), &n, "x-ms-blob-type:BlockBlob\n");
    sts_add(sts, sizeof(sts), &n, "x-ms-date:%s\n", date);
    if (xrange)
        sts_add(sts, sizeof(sts), &n, "x-ms-range:bytes=%s\n", xrange);
    sts_add(sts, sizeof(sts), &n, "x-ms-version:%s\n/%s%s", AZ_VERSION, t->account, path);
    for (int i = 0; i < AZ_QUERY_MAX && q->q[i].name; i++)
        sts_add(sts, sizeof(sts), &n, "\n%s:%s", q->q[i].name, q->q[i].value);
    if (n >= sizeof(sts))
        return -ENAMETOOLONG;
    unsigned char mac[EVP_MAX_MD_SIZE], b64[2 * EVP_MAX_MD_SIZE];
    size_t maclen = 0;
    if (!EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, t->key, t->key_len,
                   (const unsigned char *)sts, n, mac, sizeof(mac), &maclen))
        return -EIO;
    EVP_EncodeBlock(b64, mac, (int)maclen);
    snprintf(out, sz, "Authorization: SharedKey %s:%s", t->account, (const char *)b64);
    return 0;
}

/* One request, retried on throttling, 5xx and dropped connections. Returns 0 on 2xx, else
 * negative errno with the service's error code logged (what, code, message, HTTP status). */
static int az_request(struct az_target *t, const struct az_req *q) {
    char path[4200], url[12000], date[64], auth[sizeof(t->token.value) + 32], range[96];
    char ver[64], xdate[96];
    int r = -EIO;

    /* The path as sent (Shared Key signs it encoded) and the query from the raw values. */
    char eblob[3200];
    TRY(mig__store_escape(eblob, sizeof(eblob), t->blob, true));
    int w = q->container ? snprintf(path, sizeof(path), "%s/%s", t->svc_path, t->container)
                         : snprintf(path, sizeof(path), "%s/%s/%s", t->svc_path, t->container,
                                    eblob);
    if (w < 0 || (size_t)w >= sizeof(path))
        return -ENAMETOOLONG;
    const char *host_end = strstr(t->svc, "://") + 3;
    host_end += strcspn(host_end, "/");
    size_t u = (size_t)snprintf(url, sizeof(url), "%.*s%s", (int)(host_end - t->svc), t->svc,
                                path);
    for (int i = 0; i < AZ_QUERY_MAX && q->q[i].name; i++) {
        char ev[3200];
        TRY(mig__store_escape(ev, sizeof(ev), q->q[i].value, false));
        u += (size_t)snprintf(url + u, sizeof(url) - u, "%c%s=%s", i ? '&' : '?', q->q[i].name,
                              ev);
        if (u >= sizeof(url))
            return -ENAMETOOLONG;
    }
    CURL *c = curl_easy_init();
    if (!c)
        return -ENOMEM;
    for (int attempt = 0; attempt < AZ_TRIES; attempt++) {
        struct curl_slist *h = NULL;
        struct az_hdrs hd = {0};
        long status = 0;
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
        q->out->len = 0;
        q->out->toobig = false;
        curl_easy_reset(c);
        if (t->key_len) {
            if ((r = shared_key(t, q, path, date, q->range, auth, sizeof(auth))) < 0)
                break;
        } else {
            snprintf(auth, sizeof(auth), "Authorization: Bearer %s", t->token.value);
        }
        h = curl_slist_append(h, auth);
        memset(auth, 0, sizeof(auth));
        snprintf(xdate, sizeof(xdate), "x-ms-date: %s", date);
        h = curl_slist_append(h, xdate);
        snprintf(ver, sizeof(ver), "x-ms-version: %s", AZ_VERSION);
        h = curl_slist_append(h, ver);
        if (q->block_blob)
            h = curl_slist_append(h, "x-ms-blob-type: BlockBlob");
        if (q->range) {
            snprintf(range, sizeof(range), "x-ms-range: bytes=%s", q->range);
            h = curl_slist_append(h, range);
        }
        /* Content-Type only on PUT (it is signed); none on GET and DELETE. */
        h = curl_slist_append(h, strcmp(q->method, "PUT")
                                     ? "Content-Type:"
                                     : "Content-Type: application/octet-stream");
        h = curl_slist_append(h, "Expect:"); /* no 100-continue round trip for each block */
        if (!h) {
            r = -ENOMEM;
            break;
        }
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, q->method);
        if (!strcmp(q->method, "PUT")) {
            curl_easy_setopt(c, CURLOPT_POSTFIELDS, q->body ? q->body : "");
            curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
        } else if (!strcmp(q->method, "GET")) {
            curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
        }
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, mig__store_on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, q->out);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &hd);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
        curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
        curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
        CURLcode cc = curl_easy_perform(c);
        curl_slist_free_all(h);
        if (cc == CURLE_WRITE_ERROR && q->out->toobig) {
            r = st_log_errno(-EFBIG, "Azure %s %s: answer larger than %zu bytes", q->method, url,
                             q->out->max);
            break;
        }
        if (cc != CURLE_OK) {
            bool retry = cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR ||
                         cc == CURLE_GOT_NOTHING;
            r = mig__store_curl_errno(cc);
            if (retry && attempt + 1 < AZ_TRIES)
                continue;
            st_log(ST_LOG_ERR, "migrate", "Azure %s %s: %s", q->method, url,
                   curl_easy_strerror(cc));
            break;
        }
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        if (status >= 200 && status < 300) {
            if (q->hdrs)
                *q->hdrs = hd;
            r = 0;
            break;
        }
        char code[96], msg[512];
        mig__store_xml_error(q->out, code, sizeof(code), msg, sizeof(msg));
        if (!code[0])
            snprintf(code, sizeof(code), "%s", hd.error_code);
        msg[strcspn(msg, "\r\n")] = '\0'; /* Azure appends RequestId and Time on new lines */
        r = code_errno(code, status);
        if (r == -EBUSY && attempt + 1 < AZ_TRIES) {
            mig__store_backoff(attempt);
            continue;
        }
        if (!(r == -ENOENT && q->quiet_404))
            st_log(ST_LOG_ERR, "migrate", "Azure %s %s refused: %s%s%s (HTTP %ld)%s", q->method,
                   url, code[0] ? code : "no error code", msg[0] ? ": " : "", msg, status,
                   r == -EACCES ? (t->key_len ? "; check AZURE_STORAGE_KEY"
                                              : "; check the identity's role on the account "
                                                "(Storage Blob Data Contributor)") : "");
        break;
    }
    curl_easy_cleanup(c);
    return r;
}

/* ---- the ops ----------------------------------------------------------------------------- */

static int az_get(const char *url, uint64_t off, uint64_t len, size_t max, unsigned char **ret,
                  size_t *ret_len, uint64_t *ret_total, struct st_error *err) {
    struct az_target t;
    struct mig__store_buf b = {.max = max + 1};
    struct az_hdrs hd = {0};
    char range[64];
    int r;

    TRY(target_init(url, &t));
    if (off || len)
        snprintf(range, sizeof(range), len ? "%llu-%llu" : "%llu-", (unsigned long long)off,
                 (unsigned long long)(off + len - 1));
    struct az_req q = {.method = "GET", .range = off || len ? range : NULL, .out = &b,
                       .hdrs = &hd, .quiet_404 = true};
    r = az_request(&t, &q);
    if (r < 0) {
        if (err) {
            memset(err, 0, sizeof(*err));
            snprintf(err->file, sizeof(err->file), "%s", url);
            snprintf(err->message, sizeof(err->message), r == -ENOENT ? "no such object"
                     : "cannot read: %s", st_strerror(r));
        }
        goto out;
    }
    if (!b.p) {
        b.p = st_malloc(1);
        if (!b.p)
            TRY_GOTO(-ENOMEM, r, out);
        b.p[0] = '\0';
    }
    *ret = b.p;
    *ret_len = b.len;
    if (ret_total)
        *ret_total = hd.total ? hd.total : b.len;
    b.p = NULL;
out:
    st_free(b.p);
    target_done(&t);
    return r;
}

static int az_put(const char *url, const void *data, size_t len) {
    struct az_target t;
    struct mig__store_buf b = {.max = AZ_REPLY_MAX};
    TRY(target_init(url, &t));
    struct az_req q = {.method = "PUT", .body = data, .body_len = len, .block_blob = true,
                       .out = &b};
    int r = az_request(&t, &q);
    st_free(b.p);
    target_done(&t);
    return r;
}

static size_t block_bytes(void) {
    const char *e = getenv("SPOTTRAIN_AZ_BLOCK_BYTES");
    unsigned long long v = e && *e ? strtoull(e, NULL, 10) : 0;
    return v >= AZ_BLOCK_MIN && v <= (1ull << 32) ? (size_t)v : AZ_BLOCK_DEFAULT;
}

/* The id of block i: base64 of a fixed-length string (Azure wants every id of a blob to have
 * the same length). */
static void block_id(int i, char *out, size_t sz) {
    char raw[32];
    unsigned char b64[64];
    int n = snprintf(raw, sizeof(raw), "spottrain-%08d", i);
    EVP_EncodeBlock(b64, (const unsigned char *)raw, n);
    snprintf(out, sz, "%s", (const char *)b64);
}

static int az_put_file(const char *url, const char *path) {
    struct az_target t;
    struct mig__store_buf b = {.max = AZ_REPLY_MAX};
    unsigned char *buf = NULL;
    char *list = NULL, id[64];
    size_t bsize = block_bytes(), llen = 0, lcap = 0;
    struct stat sb;
    int fd, r;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &sb) < 0) {
        r = -errno;
        close(fd);
        return r;
    }
    r = target_init(url, &t);
    if (r < 0) {
        close(fd);
        return r;
    }
    uint64_t size = (uint64_t)sb.st_size;
    buf = st_malloc(size <= bsize ? (size ? size : 1) : bsize);
    if (!buf)
        TRY_GOTO(-ENOMEM, r, out);
    if (size <= bsize) { /* one Put Blob */
        TRY_GOTO(mig__store_read_at(fd, buf, size, 0), r, out);
        struct az_req q = {.method = "PUT", .body = buf, .body_len = size, .block_blob = true,
                           .out = &b};
        r = az_request(&t, &q);
        goto out;
    }
    uint64_t nblocks = (size + bsize - 1) / bsize;
    if (nblocks > AZ_BLOCKS_MAX) {
        r = st_log_errno(-EFBIG, "Azure upload of '%s': %llu blocks of %zu bytes exceed the "
                         "service's %d", url, (unsigned long long)nblocks, bsize, AZ_BLOCKS_MAX);
        goto out;
    }
    lcap = 128 + nblocks * 64;
    list = st_malloc(lcap);
    if (!list)
        TRY_GOTO(-ENOMEM, r, out);
    llen = (size_t)snprintf(list, lcap, "<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>");
    int i = 0;
    for (uint64_t off = 0; off < size; off += bsize, i++) {
        size_t n = (size_t)ST_MIN((uint64_t)bsize, size - off);
        TRY_GOTO(mig__store_read_at(fd, buf, n, off), r, out);
        block_id(i, id, sizeof(id));
        struct az_req pq = {.method = "PUT", .q = {{"blockid", id}, {"comp", "block"}},
                            .body = buf, .body_len = n, .out = &b};
        TRY_GOTO(az_request(&t, &pq), r, out);
        llen += (size_t)snprintf(list + llen, lcap - llen, "<Latest>%s</Latest>", id);
    }
    llen += (size_t)snprintf(list + llen, lcap - llen, "</BlockList>");
    /* The commit: until this Put Block List the blob does not exist (or keeps its old bytes). */
    struct az_req cq = {.method = "PUT", .q = {{"comp", "blocklist"}}, .body = list,
                        .body_len = llen, .out = &b};
    r = az_request(&t, &cq);
out:
    close(fd);
    st_free(list);
    st_free(buf);
    st_free(b.p);
    target_done(&t);
    return r;
}

/* One page of List Blobs: Blobs/Blob/Name (objects) and Blobs/BlobPrefix/Name (one level
 * down), and NextMarker. */
static int list_page(const struct mig__store_buf *b, size_t plen, mig__store_list_fn *fn,
                     void *userdata, char *next, size_t nsz) {
    int r = 0;
    next[0] = '\0';
    if (!b->len || b->len > INT32_MAX)
        return -EBADMSG;
    xmlDoc *doc = xmlReadMemory((const char *)b->p, (int)b->len, "list.xml", NULL,
                                XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    xmlNode *root = doc ? xmlDocGetRootElement(doc) : NULL;
    if (!root || strcmp((const char *)root->name, "EnumerationResults")) {
        r = -EBADMSG;
        goto out;
    }
    for (xmlNode *c = root->children; c && r >= 0; c = c->next) {
        if (c->type != XML_ELEMENT_NODE)
            continue;
        if (!strcmp((const char *)c->name, "NextMarker")) {
            xmlChar *v = xmlNodeGetContent(c);
            if (v && snprintf(next, nsz, "%s", (const char *)v) >= (int)nsz)
                r = -EBADMSG;
            xmlFree(v);
            continue;
        }
        if (strcmp((const char *)c->name, "Blobs"))
            continue;
        for (xmlNode *e = c->children; e && r >= 0; e = e->next) {
            if (e->type != XML_ELEMENT_NODE)
                continue;
            bool dir = !strcmp((const char *)e->name, "BlobPrefix");
            if (!dir && strcmp((const char *)e->name, "Blob"))
                continue;
            for (xmlNode *k = e->children; k; k = k->next) {
                if (k->type != XML_ELEMENT_NODE || strcmp((const char *)k->name, "Name"))
                    continue;
                xmlChar *v = xmlNodeGetContent(k);
                if (v && strlen((const char *)v) > plen) {
                    char name[1024];
                    snprintf(name, sizeof(name), "%s", (const char *)v + plen);
                    size_t nl = strlen(name);
                    if (dir && nl && name[nl - 1] == '/')
                        name[nl - 1] = '\0';
                    if (name[0])
                        r = fn(userdata, name, dir);
                }
                xmlFree(v);
                break;
            }
        }
    }
out:
    if (doc)
        xmlFreeDoc(doc);
    return r;
}

static int az_list(const char *url, mig__store_list_fn *fn, void *userdata) {
    struct az_target t;
    struct mig__store_buf b = {.max = AZ_REPLY_MAX};
    char prefix[1100], next[1024] = "";
    int r;

    TRY(target_init(url, &t));
    snprintf(prefix, sizeof(prefix), "%s%s", t.blob, t.blob[0] ? "/" : "");
    do {
        /* Sorted by name, as Shared Key signs them. */
        struct az_req q = {.method = "GET", .container = true, .out = &b,
                           .q = {{"comp", "list"}, {"delimiter", "/"}}};
        int i = 2;
        if (next[0])
            q.q[i++] = (struct az_query){"marker", next};
        q.q[i++] = (struct az_query){"prefix", prefix};
        q.q[i] = (struct az_query){"restype", "container"};
        TRY_GOTO(az_request(&t, &q), r, out);
        r = list_page(&b, strlen(prefix), fn, userdata, next, sizeof(next));
        if (r == -EBADMSG)
            st_log(ST_LOG_ERR, "migrate", "Azure List Blobs of '%s': the answer is not an "
                   "EnumerationResults", url);
        if (r < 0)
            goto out;
    } while (next[0]);
    r = 0;
out:
    st_free(b.p);
    target_done(&t);
    return r;
}

static int az_remove(const char *url) {
    struct az_target t;
    struct mig__store_buf b = {.max = AZ_REPLY_MAX};
    TRY(target_init(url, &t));
    struct az_req q = {.method = "DELETE", .out = &b, .quiet_404 = true};
    int r = az_request(&t, &q);
    st_free(b.p);
    target_done(&t);
    return r == -ENOENT ? 0 : r;
}

/* See migrate-store.h. */
const struct mig_store_ops mig__store_az = {
    .name = "az",
    .scheme = "az://",
    .get = az_get,
    .put = az_put,
    .put_file = az_put_file,
    .list = az_list,
    .remove = az_remove,
};
