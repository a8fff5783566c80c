/* store-s3.c: the s3 checkpoint store — objects in S3 (or any S3-compatible endpoint) over
 * libcurl, signed with SigV4 (CURLOPT_AWS_SIGV4, service s3), answers parsed with libxml2.
 *
 * The one idea: every request body is in memory when it is sent, so its SHA-256 goes into
 * x-amz-content-sha256 (S3 wants the header; libcurl 7.88 signs it but does not add it), and a large layer file goes up as a multipart upload of bounded parts
 * (CreateMultipartUpload, UploadPart, CompleteMultipartUpload; AbortMultipartUpload on any
 * failure) instead of one huge buffer. An object appears whole or not at all, which is what
 * lets ckpt.c keep "the manifest is written last" as the commit point.
 *
 * Addressing: with AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (moto, MinIO, a VPC endpoint) the
 * bucket goes in the path (ENDPOINT/BUCKET/KEY), since custom endpoints rarely have wildcard
 * DNS; else virtual-hosted https://BUCKET.s3.REGION.amazonaws.com/KEY. Credentials and region
 * come from common/aws-creds.c, the same lookup the EC2 provider uses. Secrets never reach a
 * log line. */
#include <curl/curl.h>
#include <fcntl.h>
#include <pthread.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "aws-creds.h" /* st_aws_creds_find, st_aws_region_find, st_aws_endpoint_find */
#include "check.h"     /* TRY, TRY_GOTO */
#include "migrate-store.h"

#define S3_PART_DEFAULT (64u << 20) /* bytes per multipart part */
#define S3_PART_MIN (5u << 20)      /* S3's minimum for every part but the last */
#define S3_REPLY_MAX (16u << 20)    /* XML answers larger than this are refused */
#define S3_TRIES 4                  /* tries of one request on 5xx / 429 / connection reset */
#define S3_CREDS_TTL 300.0          /* seconds a credential lookup is reused (IMDS rotates role
                                     * credentials well before they expire) */

/* A parsed s3://BUCKET/KEY and where to send it. */
struct s3_target {
    char bucket[64];
    char key[1024];
    char region[64];
    char base[1200]; /* URL of the object without query: ENDPOINT/BUCKET/KEY or vhost form */
    char bucket_url[1200]; /* URL of the bucket (for ListObjectsV2) */
    struct st_aws_creds creds;
};

static void wipe(void *p, size_t n) {
    volatile unsigned char *q = p;
    while (n--)
        *q++ = 0;
}

/* The last credential lookup, shared by the threads of this process (a background checkpoint
 * writer and the training loop), so a checkpoint of many objects asks IMDS once, not per
 * object. Failures are not cached: the next call tries again. */
static struct {
    pthread_mutex_t lock;
    struct st_aws_creds creds;
    double at; /* st_now() of the lookup; 0 = none */
} creds_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int creds_get(struct st_aws_creds *c, char *why, size_t whysz) {
    int r = 0;
    pthread_mutex_lock(&creds_cache.lock);
    double now = st_now();
    if (creds_cache.at == 0 || now - creds_cache.at > S3_CREDS_TTL) {
        r = st_aws_creds_find(&creds_cache.creds, why, whysz);
        creds_cache.at = r == 0 ? now : 0;
    }
    if (r == 0)
        *c = creds_cache.creds;
    pthread_mutex_unlock(&creds_cache.lock);
    return r;
}

/* Parses url into t and finds credentials. Logs (once) why it cannot. */
static int target_init(const char *url, struct s3_target *t) {
    char ekey[3200], endpoint[1024];
    memset(t, 0, sizeof(*t));
    if (strncmp(url, "s3://", 5) != 0)
        return -EINVAL;
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t blen = slash ? (size_t)(slash - b) : strlen(b);
    if (blen < 3 || blen >= sizeof(t->bucket))
        return st_log_errno(-EINVAL, "Bad S3 URL '%s': the bucket name must have 3 to 63 "
                            "characters", url);
    memcpy(t->bucket, b, blen);
    const char *key = slash ? slash + 1 : "";
    size_t klen = strlen(key);
    while (klen && key[klen - 1] == '/')
        klen--;
    if (klen >= sizeof(t->key))
        return st_log_errno(-ENAMETOOLONG, "Bad S3 URL '%s': key too long", url);
    memcpy(t->key, key, klen);
    st_aws_region_find(t->region, sizeof(t->region), NULL);
    int e = st_aws_endpoint_find("S3", endpoint, sizeof(endpoint));
    if (e < 0)
        return st_log_errno(-EINVAL, "Bad S3 endpoint '%s' (want http:// or https://)", endpoint);
    TRY(mig__store_escape(ekey, sizeof(ekey), t->key, true));
    int w1, w2;
    if (e > 0) {
        w1 = snprintf(t->bucket_url, sizeof(t->bucket_url), "%s/%s", endpoint, t->bucket);
        w2 = snprintf(t->base, sizeof(t->base), "%s/%s/%s", endpoint, t->bucket, ekey);
    } else {
        w1 = snprintf(t->bucket_url, sizeof(t->bucket_url), "https://%s.s3.%s.amazonaws.com",
                      t->bucket, t->region);
        w2 = snprintf(t->base, sizeof(t->base), "https://%s.s3.%s.amazonaws.com/%s", t->bucket,
                      t->region, ekey);
    }
    if (w1 < 0 || (size_t)w1 >= sizeof(t->bucket_url) || w2 < 0 ||
        (size_t)w2 >= sizeof(t->base))
        return st_log_errno(-ENAMETOOLONG, "S3 URL '%s' too long", url);
    char why[1024];
    if (creds_get(&t->creds, why, sizeof(why)) < 0)
        return st_log_errno(-ENOKEY, "Cannot reach '%s': %s", url, why);
    return 0;
}

static void target_done(struct s3_target *t) {
    st_aws_creds_wipe(&t->creds);
}

/* ---- one request ------------------------------------------------------------------------- */

/* Response headers we need: the ETag of an uploaded part, the total of a ranged GET. */
struct s3_hdrs {
    char etag[128];
    uint64_t total; /* from Content-Range "bytes a-b/TOTAL", else Content-Length */
    bool have_range;
};

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *userdata) {
    struct s3_hdrs *h = userdata;
    size_t n = size * nmemb;
    char line[512];
    snprintf(line, sizeof(line), "%.*s", (int)ST_MIN(n, sizeof(line) - 1), ptr);
    line[strcspn(line, "\r\n")] = '\0';
    if (!strncasecmp(line, "etag:", 5)) {
        const char *v = line + 5 + strspn(line + 5, " ");
        snprintf(h->etag, sizeof(h->etag), "%s", v);
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
    static const char *const auth[] = {"AccessDenied", "InvalidAccessKeyId",
        "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired",
        "AllAccessDisabled", "AuthorizationHeaderMalformed"};
    for (size_t i = 0; i < ST_ARRAY_SIZE(auth); i++)
        if (!strcmp(code, auth[i]))
            return -EACCES;
    if (!strcmp(code, "NoSuchKey") || !strcmp(code, "NoSuchUpload"))
        return -ENOENT;
    if (!strcmp(code, "NoSuchBucket"))
        return -ENXIO;
    if (!strcmp(code, "SlowDown") || !strcmp(code, "InternalError") || status == 429 ||
        status >= 500)
        return -EBUSY;
    if (status == 404)
        return -ENOENT;
    if (status == 401 || status == 403)
        return -EACCES;
    return -EPROTO;
}

struct s3_req {
    const char *method;        /* GET, PUT, POST, DELETE */
    const char *url;           /* full URL, query included */
    const void *body;          /* PUT/POST body, or NULL */
    size_t body_len;
    const char *range;         /* "a-b" or NULL */
    struct mig__store_buf *out;        /* answer body (success or error) */
    struct s3_hdrs *hdrs;      /* may be NULL */
    bool quiet_404;            /* a missing object is an answer, not an error to log */
};

/* "x-amz-content-sha256: <hex SHA-256 of the body>" into out (at least 100 bytes). */
static int payload_hash_header(const void *body, size_t len, char *out, size_t sz) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!EVP_Digest(body ? body : "", len, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32)
        return -EIO;
    int n = snprintf(out, sz, "x-amz-content-sha256: ");
    for (unsigned i = 0; i < mdlen; i++)
        n += snprintf(out + n, sz - (size_t)n, "%02x", md[i]);
    return 0;
}

/* One signed request, retried on throttling, 5xx and dropped connections. Returns 0 on 2xx,
 * else negative errno with the S3 error code logged (what, code, message, HTTP status). */
static int s3_request(struct s3_target *t, const struct s3_req *q) {
    char sigv4[128], range[96], tok[sizeof(t->creds.session) + 32], sha[128];
    int r = -EIO;
    TRY(payload_hash_header(q->body, q->body_len, sha, sizeof(sha)));
    CURL *c = curl_easy_init();
    if (!c)
        return -ENOMEM;
    snprintf(sigv4, sizeof(sigv4), "aws:amz:%s:s3", t->region);
    for (int attempt = 0; attempt < S3_TRIES; attempt++) {
        struct curl_slist *h = NULL;
        struct s3_hdrs hd = {0};
        long status = 0;
        q->out->len = 0;
        q->out->toobig = false;
        curl_easy_reset(c);
        if (t->creds.session[0]) {
            snprintf(tok, sizeof(tok), "X-Amz-Security-Token: %s", t->creds.session);
            h = curl_slist_append(h, tok);
            wipe(tok, sizeof(tok));
        }
        if (q->range) {
            snprintf(range, sizeof(range), "Range: bytes=%s", q->range);
            h = curl_slist_append(h, range);
        }
        h = curl_slist_append(h, "Content-Type: application/octet-stream");
        h = curl_slist_append(h, sha);
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
        curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4);
        curl_easy_setopt(c, CURLOPT_USERNAME, t->creds.key_id);
        curl_easy_setopt(c, CURLOPT_PASSWORD, t->creds.secret);
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
            r = st_log_errno(-EFBIG, "S3 %s %s: answer larger than %zu bytes", q->method,
                             q->url, q->out->max);
            break;
        }
        if (cc != CURLE_OK) {
            bool retry = cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR ||
                         cc == CURLE_GOT_NOTHING;
            r = mig__store_curl_errno(cc);
            if (retry && attempt + 1 < S3_TRIES)
                continue;
            st_log(ST_LOG_ERR, "migrate", "S3 %s %s: %s", q->method, q->url,
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
        r = code_errno(code, status);
        if (r == -EBUSY && attempt + 1 < S3_TRIES) {
            mig__store_backoff(attempt);
            continue;
        }
        if (!(r == -ENOENT && q->quiet_404))
            st_log(ST_LOG_ERR, "migrate", "S3 %s %s refused: %s%s%s (HTTP %ld)%s", q->method,
                   q->url, code[0] ? code : "no error code", msg[0] ? ": " : "", msg, status,
                   r == -EACCES ? "; check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
                                  "AWS_PROFILE" : "");
        break;
    }
    curl_easy_cleanup(c);
    return r;
}

/* ---- the ops ----------------------------------------------------------------------------- */

static int s3_get(const char *url, uint64_t off, uint64_t len, size_t max, unsigned char **ret,
                  size_t *ret_len, uint64_t *ret_total, struct st_error *err) {
    struct s3_target t;
    struct mig__store_buf b = {.max = max + 1};
    struct s3_hdrs hd = {0};
    char range[64];
    int r;

    TRY(target_init(url, &t));
    if (off || len)
        snprintf(range, sizeof(range), len ? "%llu-%llu" : "%llu-", (unsigned long long)off,
                 (unsigned long long)(off + len - 1));
    struct s3_req q = {.method = "GET", .url = t.base, .range = off || len ? range : NULL,
                       .out = &b, .hdrs = &hd, .quiet_404 = true};
    r = s3_request(&t, &q);
    if (r == -ENOENT) {
        if (err) {
            memset(err, 0, sizeof(*err));
            snprintf(err->file, sizeof(err->file), "%s", url);
            snprintf(err->message, sizeof(err->message), "no such object");
        }
        goto out;
    }
    if (r < 0) {
        if (err) {
            memset(err, 0, sizeof(*err));
            snprintf(err->file, sizeof(err->file), "%s", url);
            snprintf(err->message, sizeof(err->message), "cannot read: %s", st_strerror(r));
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

static int s3_put(const char *url, const void *data, size_t len) {
    struct s3_target t;
    struct mig__store_buf b = {.max = S3_REPLY_MAX};
    TRY(target_init(url, &t));
    struct s3_req q = {.method = "PUT", .url = t.base, .body = data, .body_len = len, .out = &b};
    int r = s3_request(&t, &q);
    st_free(b.p);
    target_done(&t);
    return r;
}

static size_t part_bytes(void) {
    const char *e = getenv("SPOTTRAIN_S3_PART_BYTES");
    unsigned long long v = e && *e ? strtoull(e, NULL, 10) : 0;
    return v >= S3_PART_MIN && v <= (1ull << 32) ? (size_t)v : S3_PART_DEFAULT;
}

/* The text of the first <name> element of an XML answer. */
static int xml_first(const struct mig__store_buf *b, const char *name, char *out, size_t sz) {
    int r = -EBADMSG;
    if (!b->len || b->len > INT32_MAX)
        return r;
    xmlDoc *doc = xmlReadMemory((const char *)b->p, (int)b->len, "s3.xml", NULL,
                                XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    xmlNode *root = doc ? xmlDocGetRootElement(doc) : NULL;
    for (xmlNode *c = root ? root->children : NULL; c; c = c->next)
        if (c->type == XML_ELEMENT_NODE && !strcmp((const char *)c->name, name)) {
            xmlChar *v = xmlNodeGetContent(c);
            if (v && snprintf(out, sz, "%s", (const char *)v) < (int)sz)
                r = 0;
            xmlFree(v);
            break;
        }
    if (doc)
        xmlFreeDoc(doc);
    return r;
}

static int s3_put_file(const char *url, const char *path) {
    struct s3_target t;
    struct mig__store_buf b = {.max = S3_REPLY_MAX};
    unsigned char *buf = NULL;
    char *complete = NULL;
    char upload[512] = "", qurl[2400], eid[1600];
    size_t psize = part_bytes(), clen = 0, ccap = 0;
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
    buf = st_malloc(size <= psize ? (size ? size : 1) : psize);
    if (!buf)
        TRY_GOTO(-ENOMEM, r, out);
    if (size <= psize) { /* one PUT */
        TRY_GOTO(mig__store_read_at(fd, buf, size, 0), r, out);
        struct s3_req q = {.method = "PUT", .url = t.base, .body = buf, .body_len = size,
                           .out = &b};
        r = s3_request(&t, &q);
        goto out;
    }
    snprintf(qurl, sizeof(qurl), "%s?uploads=", t.base);
    struct s3_req cq = {.method = "POST", .url = qurl, .out = &b};
    TRY_GOTO(s3_request(&t, &cq), r, out);
    if (xml_first(&b, "UploadId", upload, sizeof(upload)) < 0 || !upload[0]) {
        r = st_log_errno(-EBADMSG, "S3 CreateMultipartUpload for '%s': no UploadId in the "
                         "answer", url);
        goto out;
    }
    TRY_GOTO(mig__store_escape(eid, sizeof(eid), upload, false), r, out);
    ccap = 256 + (size / psize + 1) * 200;
    complete = st_malloc(ccap);
    if (!complete)
        TRY_GOTO(-ENOMEM, r, out);
    clen = (size_t)snprintf(complete, ccap, "<CompleteMultipartUpload>");
    int part = 1;
    for (uint64_t off = 0; off < size; off += psize, part++) {
        size_t n = (size_t)ST_MIN((uint64_t)psize, size - off);
        TRY_GOTO(mig__store_read_at(fd, buf, n, off), r, out);
        struct s3_hdrs hd = {0};
        snprintf(qurl, sizeof(qurl), "%s?partNumber=%d&uploadId=%s", t.base, part, eid);
        struct s3_req pq = {.method = "PUT", .url = qurl, .body = buf, .body_len = n, .out = &b,
                            .hdrs = &hd};
        TRY_GOTO(s3_request(&t, &pq), r, out);
        if (!hd.etag[0]) {
            r = st_log_errno(-EBADMSG, "S3 UploadPart %d of '%s': no ETag in the answer", part,
                             url);
            goto out;
        }
        clen += (size_t)snprintf(complete + clen, ccap - clen,
                                 "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>", part,
                                 hd.etag);
    }
    clen += (size_t)snprintf(complete + clen, ccap - clen, "</CompleteMultipartUpload>");
    snprintf(qurl, sizeof(qurl), "%s?uploadId=%s", t.base, eid);
    struct s3_req fq = {.method = "POST", .url = qurl, .body = complete, .body_len = clen,
                        .out = &b};
    r = s3_request(&t, &fq);
    /* CompleteMultipartUpload may fail inside a 200 answer (S3 documents this). */
    if (r == 0 && b.len && strstr((const char *)b.p, "<Error>")) {
        char code[96], msg[512];
        mig__store_xml_error(&b, code, sizeof(code), msg, sizeof(msg));
        r = st_log_errno(-EIO, "S3 CompleteMultipartUpload of '%s' failed: %s: %s", url, code,
                         msg);
    }
out:
    if (r < 0 && upload[0]) { /* abort, so no parts are left billed; keep the first error */
        snprintf(qurl, sizeof(qurl), "%s?uploadId=%s", t.base, eid);
        struct s3_req aq = {.method = "DELETE", .url = qurl, .out = &b, .quiet_404 = true};
        (void)s3_request(&t, &aq);
    }
    close(fd);
    st_free(complete);
    st_free(buf);
    st_free(b.p);
    target_done(&t);
    return r;
}

struct list_ctx {
    mig__store_list_fn *fn;
    void *userdata;
    size_t plen; /* bytes of the listed prefix, "dir/" included */
    char next[1024];
    bool truncated;
};

static int list_page(struct list_ctx *L, const struct mig__store_buf *b) {
    int r = 0;
    if (!b->len || b->len > INT32_MAX)
        return -EBADMSG;
    xmlDoc *doc = xmlReadMemory((const char *)b->p, (int)b->len, "s3.xml", NULL,
                                XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    xmlNode *root = doc ? xmlDocGetRootElement(doc) : NULL;
    if (!root || strcmp((const char *)root->name, "ListBucketResult")) {
        r = -EBADMSG;
        goto out;
    }
    L->truncated = false;
    L->next[0] = '\0';
    for (xmlNode *c = root->children; c && r >= 0; c = c->next) {
        if (c->type != XML_ELEMENT_NODE)
            continue;
        const char *n = (const char *)c->name;
        bool dir = !strcmp(n, "CommonPrefixes");
        if (dir || !strcmp(n, "Contents")) {
            for (xmlNode *k = c->children; k; k = k->next) {
                if (k->type != XML_ELEMENT_NODE ||
                    strcmp((const char *)k->name, dir ? "Prefix" : "Key"))
                    continue;
                xmlChar *v = xmlNodeGetContent(k);
                if (v && strlen((const char *)v) > L->plen) {
                    char name[1024];
                    snprintf(name, sizeof(name), "%s", (const char *)v + L->plen);
                    size_t nl = strlen(name);
                    if (dir && nl && name[nl - 1] == '/')
                        name[nl - 1] = '\0';
                    if (name[0])
                        r = L->fn(L->userdata, name, dir);
                }
                xmlFree(v);
            }
        } else if (!strcmp(n, "IsTruncated") || !strcmp(n, "NextContinuationToken")) {
            xmlChar *v = xmlNodeGetContent(c);
            if (v && n[0] == 'I')
                L->truncated = !strcmp((const char *)v, "true");
            else if (v)
                snprintf(L->next, sizeof(L->next), "%s", (const char *)v);
            xmlFree(v);
        }
    }
out:
    if (doc)
        xmlFreeDoc(doc);
    return r;
}

static int s3_list(const char *url, mig__store_list_fn *fn, void *userdata) {
    struct s3_target t;
    struct mig__store_buf b = {.max = S3_REPLY_MAX};
    char prefix[1100], eprefix[3400], etok[3100], qurl[8000];
    struct list_ctx L = {.fn = fn, .userdata = userdata};
    int r;

    TRY(target_init(url, &t));
    snprintf(prefix, sizeof(prefix), "%s%s", t.key, t.key[0] ? "/" : "");
    L.plen = strlen(prefix);
    TRY_GOTO(mig__store_escape(eprefix, sizeof(eprefix), prefix, false), r, out);
    do {
        TRY_GOTO(mig__store_escape(etok, sizeof(etok), L.next, false), r, out);
        snprintf(qurl, sizeof(qurl), "%s?%s%s%sdelimiter=%%2F&list-type=2&prefix=%s",
                 t.bucket_url, L.next[0] ? "continuation-token=" : "", L.next[0] ? etok : "",
                 L.next[0] ? "&" : "", eprefix);
        struct s3_req q = {.method = "GET", .url = qurl, .out = &b};
        TRY_GOTO(s3_request(&t, &q), r, out);
        r = list_page(&L, &b);
        if (r == -EBADMSG)
            st_log(ST_LOG_ERR, "migrate", "S3 ListObjectsV2 of '%s': the answer is not a "
                   "ListBucketResult", url);
        if (r < 0)
            goto out;
    } while (L.truncated && L.next[0]);
    r = 0;
out:
    st_free(b.p);
    target_done(&t);
    return r;
}

static int s3_remove(const char *url) {
    struct s3_target t;
    struct mig__store_buf b = {.max = S3_REPLY_MAX};
    TRY(target_init(url, &t));
    struct s3_req q = {.method = "DELETE", .url = t.base, .out = &b, .quiet_404 = true};
    int r = s3_request(&t, &q);
    st_free(b.p);
    target_done(&t);
    return r == -ENOENT ? 0 : r;
}

/* See migrate-store.h. */
const struct mig_store_ops mig__store_s3 = {
    .name = "s3",
    .scheme = "s3://",
    .get = s3_get,
    .put = s3_put,
    .put_file = s3_put_file,
    .list = s3_list,
    .remove = s3_remove,
};

/* See migrate-store.h. */
const struct mig_store_ops *mig__store_for(const char *url) {
    static const struct mig_store_ops *const all[] = {&mig__store_s3, &mig__store_gs,
                                                       &mig__store_az};
    for (size_t i = 0; url && i < ST_ARRAY_SIZE(all); i++)
        if (!strncmp(url, all[i]->scheme, strlen(all[i]->scheme)))
            return all[i];
    return NULL;
}
