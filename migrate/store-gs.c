/* store-gs.c: the gs checkpoint store — objects in Google Cloud Storage through its JSON API
 * (storage/v1) over libcurl, with a bearer token from common/oauth.c.
 *
 * The one idea: an object appears whole or not at all. A small file is one media upload
 * (POST /upload/storage/v1/b/B/o?uploadType=media); a large one is a resumable upload: a
 * session opened with POST ...?uploadType=resumable, then chunks PUT to the session URI with
 * Content-Range (each but the last a multiple of 256 KiB, answered 308 until the last), and the
 * object exists only once the last chunk is in. A failed upload cancels its session (DELETE).
 * So ckpt.c's commit point — the manifest is written last — holds here as it does on S3.
 *
 * Addressing: https://storage.googleapis.com, or STORAGE_EMULATOR_HOST (host:port or a URL;
 * the variable Google's own client libraries honour, so fake-gcs-server and the tests' loopback
 * fake work unchanged). Object names go in the path with '/' escaped, as the API requires.
 * Credentials as the gcp provider gets them (key file, else the metadata server), with the
 * devstorage.read_write scope; against an emulator with no credentials at all the requests go
 * anonymous, as Google's libraries do there. The token never reaches a log line. */
#include <curl/curl.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "migrate-store.h"
#include "oauth.h" /* st_gcp_token_get, st_url_is_loopback */

#define GS_SCOPE "https://www.googleapis.com/auth/devstorage.read_write"
#define GS_ENDPOINT "https://storage.googleapis.com"
#define GS_CHUNK_DEFAULT (16u << 20) /* bytes per resumable-upload chunk */
#define GS_CHUNK_QUANTUM (256u << 10) /* GCS: every chunk but the last is a multiple of this */
#define GS_REPLY_MAX (16u << 20)      /* JSON answers larger than this are refused */
#define GS_TRIES 4                    /* tries of one request on 5xx / 429 / connection reset */

/* A parsed gs://BUCKET/NAME and where to send it. */
struct gs_target {
    char bucket[224];
    char name[1024];       /* object name (no trailing '/') */
    char ep[512];          /* endpoint without trailing '/' */
    char obj_url[4096];    /* ep/storage/v1/b/BUCKET/o/ESCAPED-NAME */
    char bucket_url[1024]; /* ep/storage/v1/b/BUCKET/o */
    char upload_url[1024]; /* ep/upload/storage/v1/b/BUCKET/o */
    struct st_token token; /* value "" = anonymous (emulator only) */
};

/* The last token, shared by the threads of this process (a background checkpoint writer and
 * the training loop), so a checkpoint of many objects asks for a token once. Failures are not
 * cached: the next call tries again. */
static struct {
    pthread_mutex_t lock;
    struct st_token token;
    bool anonymous; /* an emulator and no credentials: until token.expiry */
} token_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int token_get(struct gs_target *t, bool emulator, const char *url) {
    char why[1024];
    int r = 0;
    pthread_mutex_lock(&token_cache.lock);
    if (st_now() > token_cache.token.expiry - 60) {
        token_cache.anonymous = false;
        r = st_gcp_token_get(GS_SCOPE, &token_cache.token, why, sizeof(why));
        if (r == -ENOKEY && emulator) {
            token_cache.anonymous = true;
            token_cache.token.expiry = st_now() + 300;
            r = 0;
        }
    }
    if (r == 0)
        t->token = token_cache.token;
    pthread_mutex_unlock(&token_cache.lock);
    if (r < 0)
        return st_log_errno(r, "Cannot reach '%s': %s", url, why);
    return 0;
}

/* The endpoint: STORAGE_EMULATOR_HOST ("host:port" means http://host:port) or GCS. 1 when an
 * emulator is named, 0 for GCS, -EINVAL for an http:// endpoint off loopback (the token would
 * travel in clear). */
static int endpoint_find(char *out, size_t sz) {
    const char *e = getenv("STORAGE_EMULATOR_HOST");
    if (!e || !*e) {
        snprintf(out, sz, "%s", GS_ENDPOINT);
        return 0;
    }
    bool scheme = !strncmp(e, "http://", 7) || !strncmp(e, "https://", 8);
    int w = snprintf(out, sz, "%s%s", scheme ? "" : "http://", e);
    if (w < 0 || (size_t)w >= sz)
        return -EINVAL;
    size_t n = strlen(out);
    while (n && out[n - 1] == '/')
        out[--n] = '\0';
    if (!strncmp(out, "http://", 7) && !st_url_is_loopback(out))
        return -EINVAL;
    return 1;
}

/* Parses url into t and finds credentials. Logs (once) why it cannot. */
static int target_init(const char *url, struct gs_target *t) {
    char ename[3200];
    memset(t, 0, sizeof(*t));
    if (strncmp(url, "gs://", 5) != 0)
        return -EINVAL;
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t blen = slash ? (size_t)(slash - b) : strlen(b);
    if (blen < 3 || blen >= sizeof(t->bucket))
        return st_log_errno(-EINVAL, "Bad GCS URL '%s': the bucket name must have 3 to 222 "
                            "characters", url);
    memcpy(t->bucket, b, blen);
    const char *name = slash ? slash + 1 : "";
    size_t nlen = strlen(name);
    while (nlen && name[nlen - 1] == '/')
        nlen--;
    if (nlen >= sizeof(t->name))
        return st_log_errno(-ENAMETOOLONG, "Bad GCS URL '%s': object name too long", url);
    memcpy(t->name, name, nlen);
    int e = endpoint_find(t->ep, sizeof(t->ep));
    if (e < 0)
        return st_log_errno(-EINVAL, "Bad STORAGE_EMULATOR_HOST '%s' (want host:port, or an "
                            "http:// URL on loopback, or https://)",
                            getenv("STORAGE_EMULATOR_HOST"));
    TRY(mig__store_escape(ename, sizeof(ename), t->name, false));
    int w1 = snprintf(t->bucket_url, sizeof(t->bucket_url), "%s/storage/v1/b/%s/o", t->ep,
                      t->bucket);
    int w2 = snprintf(t->upload_url, sizeof(t->upload_url), "%s/upload/storage/v1/b/%s/o",
                      t->ep, t->bucket);
    int w3 = snprintf(t->obj_url, sizeof(t->obj_url), "%s/%s", t->bucket_url, ename);
    if (w1 < 0 || (size_t)w1 >= sizeof(t->bucket_url) || w2 < 0 ||
        (size_t)w2 >= sizeof(t->upload_url) || w3 < 0 || (size_t)w3 >= sizeof(t->obj_url))
        return st_log_errno(-ENAMETOOLONG, "GCS URL '%s' too long", url);
    return token_get(t, e > 0, url);
}

static void target_done(struct gs_target *t) {
    st_token_wipe(&t->token);
}

/* ---- one request ------------------------------------------------------------------------- */

/* Response headers we need: a resumable session's Location, the total of a ranged GET. */
struct gs_hdrs {
    char location[2048];
    uint64_t total; /* from Content-Range "bytes a-b/TOTAL", else Content-Length */
    bool have_range;
};

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *userdata) {
    struct gs_hdrs *h = userdata;
    size_t n = size * nmemb;
    char line[2100];
    snprintf(line, sizeof(line), "%.*s", (int)ST_MIN(n, sizeof(line) - 1), ptr);
    line[strcspn(line, "\r\n")] = '\0';
    if (!strncasecmp(line, "location:", 9)) {
        snprintf(h->location, sizeof(h->location), "%s", line + 9 + strspn(line + 9, " "));
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

/* The reason and message of a JSON API error answer ({"error": {"code", "message",
 * "errors": [{"reason"}]}}); empty when the body is not one. */
static void json_error(const struct mig__store_buf *b, char *reason, size_t rsz, char *msg,
                       size_t msz) {
    reason[0] = msg[0] = '\0';
    json_t *j = b->len ? json_loadb((const char *)b->p, b->len, 0, NULL) : NULL;
    json_t *e = json_object_get(j, "error");
    const char *m = json_string_value(json_object_get(e, "message"));
    const char *rs = json_string_value(
        json_object_get(json_array_get(json_object_get(e, "errors"), 0), "reason"));
    snprintf(reason, rsz, "%s", rs ? rs : "");
    snprintf(msg, msz, "%s", m ? m : "");
    json_decref(j);
}

static int status_errno(long status) {
    if (status == 401 || status == 403)
        return -EACCES;
    if (status == 404)
        return -ENOENT;
    if (status == 429 || status >= 500)
        return -EBUSY;
    return -EPROTO;
}

struct gs_req {
    const char *method;   /* GET, PUT, POST, DELETE */
    const char *url;      /* full URL, query included */
    const void *body;     /* PUT/POST body, or NULL */
    size_t body_len;
    const char *range;    /* "a-b" or NULL (GET) */
    const char *header;   /* one more "Name: value" (Content-Range, X-Upload-...) or NULL */
    const char *header2;  /* and another, or NULL */
    const char *content_type; /* of body; NULL = application/octet-stream */
    struct mig__store_buf *out; /* answer body (success or error) */
    struct gs_hdrs *hdrs; /* may be NULL */
    bool quiet_404;       /* a missing object is an answer, not an error to log */
    bool ok_308;          /* 308 (Resume Incomplete) is a success: a chunk that was not last */
    bool ok_499;          /* 499 answers the cancel of a resumable session */
};

/* One request, retried on throttling, 5xx and dropped connections. Returns 0 on 2xx (and 308
 * when ok_308), else negative errno with the service's reason logged (what, reason, message,
 * HTTP status). */
static int gs_request(struct gs_target *t, const struct gs_req *q) {
    char auth[sizeof(t->token.value) + 32], range[96], ctype[96];
    int r = -EIO;
    CURL *c = curl_easy_init();
    if (!c)
        return -ENOMEM;
    for (int attempt = 0; attempt < GS_TRIES; attempt++) {
        struct curl_slist *h = NULL;
        struct gs_hdrs hd = {0};
        long status = 0;
        q->out->len = 0;
        q->out->toobig = false;
        curl_easy_reset(c);
        if (t->token.value[0]) {
            snprintf(auth, sizeof(auth), "Authorization: Bearer %s", t->token.value);
            h = curl_slist_append(h, auth);
            memset(auth, 0, sizeof(auth));
        }
        if (q->range) {
            snprintf(range, sizeof(range), "Range: bytes=%s", q->range);
            h = curl_slist_append(h, range);
        }
        if (q->header)
            h = curl_slist_append(h, q->header);
        if (q->header2)
            h = curl_slist_append(h, q->header2);
        snprintf(ctype, sizeof(ctype), "Content-Type: %s",
                 q->content_type ? q->content_type : "application/octet-stream");
        h = curl_slist_append(h, ctype);
        if (!h) {
            r = -ENOMEM;
            break;
        }
        curl_easy_setopt(c, CURLOPT_URL, q->url);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, q->method);
        if (q->body || !strcmp(q->method, "POST") || !strcmp(q->method, "PUT")) {
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
            r = st_log_errno(-EFBIG, "GCS %s %s: answer larger than %zu bytes", q->method,
                             q->url, q->out->max);
            break;
        }
        if (cc != CURLE_OK) {
            bool retry = cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR ||
                         cc == CURLE_GOT_NOTHING;
            r = mig__store_curl_errno(cc);
            if (retry && attempt + 1 < GS_TRIES)
                continue;
            st_log(ST_LOG_ERR, "migrate", "GCS %s %s: %s", q->method, q->url,
                   curl_easy_strerror(cc));
            break;
        }
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        if ((status >= 200 && status < 300) || (status == 308 && q->ok_308) ||
            (status == 499 && q->ok_499)) {
            if (q->hdrs)
                *q->hdrs = hd;
            r = 0;
            break;
        }
        char reason[96], msg[512];
        json_error(q->out, reason, sizeof(reason), msg, sizeof(msg));
        r = status_errno(status);
        if (r == -EBUSY && attempt + 1 < GS_TRIES) {
            mig__store_backoff(attempt);
            continue;
        }
        if (!(r == -ENOENT && q->quiet_404))
            st_log(ST_LOG_ERR, "migrate", "GCS %s %s refused: %s%s%s (HTTP %ld)%s", q->method,
                   q->url, reason[0] ? reason : "no error reason", msg[0] ? ": " : "", msg,
                   status, r == -EACCES ? "; check GOOGLE_APPLICATION_CREDENTIALS or the "
                                          "instance's service account" : "");
        break;
    }
    curl_easy_cleanup(c);
    return r;
}

/* ---- the ops ----------------------------------------------------------------------------- */

static int gs_get(const char *url, uint64_t off, uint64_t len, size_t max, unsigned char **ret,
                  size_t *ret_len, uint64_t *ret_total, struct st_error *err) {
    struct gs_target t;
    struct mig__store_buf b = {.max = max + 1};
    struct gs_hdrs hd = {0};
    char range[64], qurl[4200];
    int r;

    TRY(target_init(url, &t));
    if (off || len)
        snprintf(range, sizeof(range), len ? "%llu-%llu" : "%llu-", (unsigned long long)off,
                 (unsigned long long)(off + len - 1));
    snprintf(qurl, sizeof(qurl), "%s?alt=media", t.obj_url);
    struct gs_req q = {.method = "GET", .url = qurl, .range = off || len ? range : NULL,
                       .out = &b, .hdrs = &hd, .quiet_404 = true};
    r = gs_request(&t, &q);
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

/* A media upload of data as object t->name. */
static int media_upload(struct gs_target *t, const void *data, size_t len,
                        struct mig__store_buf *b) {
    char ename[3200], qurl[4400];
    TRY(mig__store_escape(ename, sizeof(ename), t->name, false));
    snprintf(qurl, sizeof(qurl), "%s?uploadType=media&name=%s", t->upload_url, ename);
    struct gs_req q = {.method = "POST", .url = qurl, .body = data, .body_len = len, .out = b};
    return gs_request(t, &q);
}

static int gs_put(const char *url, const void *data, size_t len) {
    struct gs_target t;
    struct mig__store_buf b = {.max = GS_REPLY_MAX};
    TRY(target_init(url, &t));
    int r = media_upload(&t, data, len, &b);
    st_free(b.p);
    target_done(&t);
    return r;
}

static size_t chunk_bytes(void) {
    const char *e = getenv("SPOTTRAIN_GS_CHUNK_BYTES");
    unsigned long long v = e && *e ? strtoull(e, NULL, 10) : 0;
    return v >= GS_CHUNK_QUANTUM && v % GS_CHUNK_QUANTUM == 0 && v <= (1ull << 32)
               ? (size_t)v : GS_CHUNK_DEFAULT;
}

static int gs_put_file(const char *url, const char *path) {
    struct gs_target t;
    struct mig__store_buf b = {.max = GS_REPLY_MAX};
    unsigned char *buf = NULL;
    char ename[3200], qurl[4400], session[2048] = "", h1[128], h2[96];
    size_t chunk = chunk_bytes();
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
    buf = st_malloc(size <= chunk ? (size ? size : 1) : chunk);
    if (!buf)
        TRY_GOTO(-ENOMEM, r, out);
    if (size <= chunk) { /* one media upload */
        TRY_GOTO(mig__store_read_at(fd, buf, size, 0), r, out);
        r = media_upload(&t, buf, size, &b);
        goto out;
    }
    TRY_GOTO(mig__store_escape(ename, sizeof(ename), t.name, false), r, out);
    snprintf(qurl, sizeof(qurl), "%s?uploadType=resumable&name=%s", t.upload_url, ename);
    snprintf(h1, sizeof(h1), "X-Upload-Content-Length: %llu", (unsigned long long)size);
    struct gs_hdrs hd = {0};
    /* The session's metadata is the JSON body (none beyond the name in the query). */
    struct gs_req oq = {.method = "POST", .url = qurl, .body = "{}", .body_len = 2,
                        .content_type = "application/json; charset=UTF-8", .header = h1,
                        .header2 = "X-Upload-Content-Type: application/octet-stream", .out = &b,
                        .hdrs = &hd};
    TRY_GOTO(gs_request(&t, &oq), r, out);
    if (!hd.location[0]) {
        r = st_log_errno(-EBADMSG, "GCS resumable upload of '%s': no session URI (Location) in "
                         "the answer", url);
        goto out;
    }
    snprintf(session, sizeof(session), "%s", hd.location);
    for (uint64_t off = 0; off < size; off += chunk) {
        size_t n = (size_t)ST_MIN((uint64_t)chunk, size - off);
        bool last = off + n == size;
        TRY_GOTO(mig__store_read_at(fd, buf, n, off), r, out);
        snprintf(h2, sizeof(h2), "Content-Range: bytes %llu-%llu/%llu", (unsigned long long)off,
                 (unsigned long long)(off + n - 1), (unsigned long long)size);
        struct gs_req pq = {.method = "PUT", .url = session, .body = buf, .body_len = n,
                            .header = h2, .out = &b, .ok_308 = !last};
        TRY_GOTO(gs_request(&t, &pq), r, out);
    }
    session[0] = '\0'; /* complete: nothing to cancel */
out:
    if (r < 0 && session[0]) { /* cancel, so no partial upload lingers; keep the first error */
        struct gs_req cq = {.method = "DELETE", .url = session, .out = &b, .quiet_404 = true,
                            .ok_499 = true};
        (void)gs_request(&t, &cq);
    }
    close(fd);
    st_free(buf);
    st_free(b.p);
    target_done(&t);
    return r;
}

/* One page of objects.list: items[].name (objects) and prefixes[] (one level down). */
static int list_page(const struct mig__store_buf *b, size_t plen, mig__store_list_fn *fn,
                     void *userdata, char *next, size_t nsz) {
    json_t *j = b->len ? json_loadb((const char *)b->p, b->len, 0, NULL) : NULL;
    int r = 0;
    next[0] = '\0';
    if (!json_is_object(j)) {
        json_decref(j);
        return -EBADMSG;
    }
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(j, "prefixes"), i, v) {
        const char *p = json_string_value(v);
        if (!p || strlen(p) <= plen || r < 0)
            continue;
        char name[1024];
        snprintf(name, sizeof(name), "%s", p + plen);
        size_t nl = strlen(name);
        if (nl && name[nl - 1] == '/')
            name[nl - 1] = '\0';
        if (name[0])
            r = fn(userdata, name, true);
    }
    json_array_foreach(json_object_get(j, "items"), i, v) {
        const char *p = json_string_value(json_object_get(v, "name"));
        if (p && strlen(p) > plen && r >= 0)
            r = fn(userdata, p + plen, false);
    }
    const char *tok = json_string_value(json_object_get(j, "nextPageToken"));
    if (tok && snprintf(next, nsz, "%s", tok) >= (int)nsz)
        r = r < 0 ? r : -EBADMSG;
    json_decref(j);
    return r;
}

static int gs_list(const char *url, mig__store_list_fn *fn, void *userdata) {
    struct gs_target t;
    struct mig__store_buf b = {.max = GS_REPLY_MAX};
    char prefix[1100], eprefix[3400], next[1024] = "", etok[3100], qurl[8000];
    int r;

    TRY(target_init(url, &t));
    snprintf(prefix, sizeof(prefix), "%s%s", t.name, t.name[0] ? "/" : "");
    TRY_GOTO(mig__store_escape(eprefix, sizeof(eprefix), prefix, false), r, out);
    do {
        TRY_GOTO(mig__store_escape(etok, sizeof(etok), next, false), r, out);
        snprintf(qurl, sizeof(qurl), "%s?delimiter=%%2F&prefix=%s%s%s", t.bucket_url, eprefix,
                 next[0] ? "&pageToken=" : "", next[0] ? etok : "");
        struct gs_req q = {.method = "GET", .url = qurl, .out = &b};
        r = gs_request(&t, &q);
        if (r == -ENOENT) /* objects.list answers 404 only for a bucket that does not exist */
            r = -ENXIO;
        if (r < 0)
            goto out;
        r = list_page(&b, strlen(prefix), fn, userdata, next, sizeof(next));
        if (r == -EBADMSG)
            st_log(ST_LOG_ERR, "migrate", "GCS objects.list of '%s': the answer is not an "
                   "Objects resource", url);
        if (r < 0)
            goto out;
    } while (next[0]);
    r = 0;
out:
    st_free(b.p);
    target_done(&t);
    return r;
}

static int gs_remove(const char *url) {
    struct gs_target t;
    struct mig__store_buf b = {.max = GS_REPLY_MAX};
    TRY(target_init(url, &t));
    struct gs_req q = {.method = "DELETE", .url = t.obj_url, .out = &b, .quiet_404 = true};
    int r = gs_request(&t, &q);
    st_free(b.p);
    target_done(&t);
    return r == -ENOENT ? 0 : r;
}

/* See migrate-store.h. */
const struct mig_store_ops mig__store_gs = {
    .name = "gs",
    .scheme = "gs://",
    .get = gs_get,
    .put = gs_put,
    .put_file = gs_put_file,
    .list = gs_list,
    .remove = gs_remove,
};
