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
#include <libxml/tree.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "aws-creds.h" /* st_aws_creds_find, st_aws_region_find, st_aws_endpoint_find */
#include "check.h"     /* TRY, TRY_GOTO */
#include "store-http.h" /* struct mig__store_backend, mig__store_request */

#define S3_PART_DEFAULT (64u << 20) /* bytes per multipart part */
#define S3_PART_MIN (5u << 20)      /* S3's minimum for every part but the last */
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
static int target_init(const char *url, void *tp) {
    struct s3_target *t = tp;
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

static void target_done(void *tp) {
    struct s3_target *t = tp;
    st_aws_creds_wipe(&t->creds);
}

static const char *target_name(const void *tp) {
    const struct s3_target *t = tp;
    return t->key;
}

/* ---- one request ------------------------------------------------------------------------- */

/* A refusal: S3 names it by the <Code> of an <Error> body, which says more than the status
 * (NoSuchBucket vs NoSuchKey, SlowDown). */
static int refusal(void *tp, const struct mig__store_buf *b, const struct mig__store_hdrs *hd,
                   long status, struct mig__store_refusal *ret) {
    static const char *const auth[] = {"AccessDenied", "InvalidAccessKeyId",
        "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired",
        "AllAccessDisabled", "AuthorizationHeaderMalformed", NULL};
    static const char *const not_found[] = {"NoSuchKey", "NoSuchUpload", NULL};
    static const char *const busy[] = {"SlowDown", "InternalError", NULL};
    (void)tp;
    (void)hd;
    mig__store_xml_error(b, ret->code, sizeof(ret->code), ret->msg, sizeof(ret->msg));
    ret->hint = "; check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE";
    return mig__store_code_errno(ret->code, status, auth, not_found, "NoSuchBucket", busy);
}

/* A request with what s3_prepare adds, computed once for all its tries. */
struct s3_req {
    struct mig__store_req q; /* first: prepare casts back */
    char sigv4[128];         /* CURLOPT_AWS_SIGV4 */
    char sha[128];           /* the x-amz-content-sha256 header */
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

/* The headers of one attempt, and SigV4 signing by libcurl. */
static int s3_prepare(void *tp, const struct mig__store_req *q, void *c, struct curl_slist **hp) {
    const struct s3_target *t = tp;
    const struct s3_req *sq = (const struct s3_req *)q;
    char range[96], tok[sizeof(t->creds.session) + 32];
    struct curl_slist *h = *hp;
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
    h = curl_slist_append(h, sq->sha);
    *hp = h;
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sq->sigv4);
    curl_easy_setopt(c, CURLOPT_USERNAME, t->creds.key_id);
    curl_easy_setopt(c, CURLOPT_PASSWORD, t->creds.secret);
    return 0;
}

/* One signed request (see mig__store_request). */
static int s3_request(struct s3_target *t, const struct mig__store_req *q) {
    struct s3_req sq = {.q = *q};
    TRY(payload_hash_header(q->body, q->body_len, sq.sha, sizeof(sq.sha)));
    snprintf(sq.sigv4, sizeof(sq.sigv4), "aws:amz:%s:s3", t->region);
    return mig__store_request(&mig__store_s3_backend, t, &sq.q);
}

/* ---- the ops ----------------------------------------------------------------------------- */

static int s3_get_req(void *tp, const char *range, struct mig__store_buf *b,
                      struct mig__store_hdrs *hd) {
    struct s3_target *t = tp;
    struct mig__store_req q = {.method = "GET", .url = t->base, .range = range, .out = b,
                               .hdrs = hd, .quiet_404 = true};
    return s3_request(t, &q);
}

static int s3_put_req(void *tp, const void *data, size_t len, struct mig__store_buf *b) {
    struct s3_target *t = tp;
    struct mig__store_req q = {.method = "PUT", .url = t->base, .body = data, .body_len = len,
                               .out = b};
    return s3_request(t, &q);
}

static int s3_remove_req(void *tp, struct mig__store_buf *b) {
    struct s3_target *t = tp;
    struct mig__store_req q = {.method = "DELETE", .url = t->base, .out = b, .quiet_404 = true};
    return s3_request(t, &q);
}

/* The text of the first <name> element of an XML answer. */
static int xml_first(const struct mig__store_buf *b, const char *name, char *out, size_t sz) {
    int r = -EBADMSG;
    xmlNode *root;
    if (mig__store_xml_root(b, NULL, &root) < 0)
        return r;
    for (xmlNode *c = root->children; c; c = c->next)
        if (c->type == XML_ELEMENT_NODE && !strcmp((const char *)c->name, name)) {
            xmlChar *v = xmlNodeGetContent(c);
            if (v && snprintf(out, sz, "%s", (const char *)v) < (int)sz)
                r = 0;
            xmlFree(v);
            break;
        }
    xmlFreeDoc(root->doc);
    return r;
}

/* CreateMultipartUpload; u->id gets the escaped UploadId, u->doc the part list's start. */
static int s3_upload_begin(void *tp, struct mig__store_upload *u) {
    struct s3_target *t = tp;
    char upload[512] = "", qurl[2400];
    snprintf(qurl, sizeof(qurl), "%s?uploads=", t->base);
    struct mig__store_req cq = {.method = "POST", .url = qurl, .out = u->out};
    TRY(s3_request(t, &cq));
    if (xml_first(u->out, "UploadId", upload, sizeof(upload)) < 0 || !upload[0])
        return st_log_errno(-EBADMSG, "S3 CreateMultipartUpload for '%s': no UploadId in the "
                            "answer", u->url);
    /* An UploadId of at most 511 bytes escapes into at most 1534: it always fits. */
    TRY(mig__store_escape(u->id, sizeof(u->id), upload, false));
    u->cap = 256 + (u->size / u->chunk + 1) * 200;
    u->doc = st_malloc(u->cap);
    if (!u->doc)
        return -ENOMEM;
    u->len = (size_t)snprintf(u->doc, u->cap, "<CompleteMultipartUpload>");
    return 0;
}

/* UploadPart i + 1 (S3 numbers parts from 1); its ETag goes into the part list. */
static int s3_upload_part(void *tp, struct mig__store_upload *u, int i,
                          const unsigned char *buf, size_t n, uint64_t off) {
    struct s3_target *t = tp;
    struct mig__store_hdrs hd = {.total = 0};
    char qurl[2400];
    int part = i + 1;
    (void)off;
    snprintf(qurl, sizeof(qurl), "%s?partNumber=%d&uploadId=%s", t->base, part, u->id);
    struct mig__store_req pq = {.method = "PUT", .url = qurl, .body = buf, .body_len = n,
                                .out = u->out, .hdrs = &hd};
    TRY(s3_request(t, &pq));
    if (!hd.value[0])
        return st_log_errno(-EBADMSG, "S3 UploadPart %d of '%s': no ETag in the answer", part,
                            u->url);
    u->len += (size_t)snprintf(u->doc + u->len, u->cap - u->len,
                               "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>", part,
                               hd.value);
    return 0;
}

/* CompleteMultipartUpload. */
static int s3_upload_commit(void *tp, struct mig__store_upload *u) {
    struct s3_target *t = tp;
    char qurl[2400];
    u->len += (size_t)snprintf(u->doc + u->len, u->cap - u->len, "</CompleteMultipartUpload>");
    snprintf(qurl, sizeof(qurl), "%s?uploadId=%s", t->base, u->id);
    struct mig__store_req fq = {.method = "POST", .url = qurl, .body = u->doc,
                                .body_len = u->len, .out = u->out};
    int r = s3_request(t, &fq);
    /* CompleteMultipartUpload may fail inside a 200 answer (S3 documents this). */
    if (r == 0 && u->out->len && strstr((const char *)u->out->p, "<Error>")) {
        char code[96], msg[512];
        mig__store_xml_error(u->out, code, sizeof(code), msg, sizeof(msg));
        r = st_log_errno(-EIO, "S3 CompleteMultipartUpload of '%s' failed: %s: %s", u->url,
                         code, msg);
    }
    return r;
}

/* AbortMultipartUpload, so no parts are left billed. */
static void s3_upload_abort(void *tp, struct mig__store_upload *u) {
    struct s3_target *t = tp;
    char qurl[2400];
    snprintf(qurl, sizeof(qurl), "%s?uploadId=%s", t->base, u->id);
    struct mig__store_req aq = {.method = "DELETE", .url = qurl, .out = u->out,
                                .quiet_404 = true};
    (void)s3_request(t, &aq);
}

/* One page of ListObjectsV2: Contents/Key (objects), CommonPrefixes/Prefix (one level down);
 * the continuation token only while IsTruncated. */
static int s3_list_parse(const struct mig__store_buf *b, size_t plen, mig__store_list_fn *fn,
                         void *userdata, char *next, size_t nsz) {
    xmlNode *root;
    bool truncated = false;
    int r = 0;
    next[0] = '\0';
    TRY(mig__store_xml_root(b, "ListBucketResult", &root));
    for (xmlNode *c = root->children; c && r >= 0; c = c->next) {
        if (c->type != XML_ELEMENT_NODE)
            continue;
        const char *n = (const char *)c->name;
        bool dir = !strcmp(n, "CommonPrefixes");
        if (dir || !strcmp(n, "Contents")) {
            r = mig__store_xml_child(c, dir ? "Prefix" : "Key", plen, dir, fn, userdata);
        } else if (!strcmp(n, "IsTruncated") || !strcmp(n, "NextContinuationToken")) {
            xmlChar *v = xmlNodeGetContent(c);
            if (v && n[0] == 'I')
                truncated = !strcmp((const char *)v, "true");
            else if (v)
                snprintf(next, nsz, "%s", (const char *)v);
            xmlFree(v);
        }
    }
    if (!truncated)
        next[0] = '\0';
    xmlFreeDoc(root->doc);
    return r;
}

static int s3_list_req(void *tp, const char *prefix, const char *next,
                       struct mig__store_buf *b) {
    struct s3_target *t = tp;
    char eprefix[3400], etok[3100], qurl[8000];
    TRY(mig__store_escape(eprefix, sizeof(eprefix), prefix, false));
    TRY(mig__store_escape(etok, sizeof(etok), next, false));
    snprintf(qurl, sizeof(qurl), "%s?%s%s%sdelimiter=%%2F&list-type=2&prefix=%s", t->bucket_url,
             next[0] ? "continuation-token=" : "", next[0] ? etok : "", next[0] ? "&" : "",
             eprefix);
    struct mig__store_req q = {.method = "GET", .url = qurl, .out = b};
    return s3_request(t, &q);
}

_Static_assert(sizeof(struct s3_target) <= MIG__STORE_TARGET_MAX,
               "struct s3_target no longer fits the ops' target room");

/* See store-http.h. */
const struct mig__store_backend mig__store_s3_backend = {
    .scheme = "s3://",
    .what = "S3",
    .no_code = "no error code",
    .want_header = "etag:",
    .list_what = "ListObjectsV2",
    .list_result = "a ListBucketResult",
    .init = target_init,
    .done = target_done,
    .name = target_name,
    .prepare = s3_prepare,
    .refusal = refusal,
    .get = s3_get_req,
    .put = s3_put_req,
    .remove = s3_remove_req,
    .list_request = s3_list_req,
    .list_parse = s3_list_parse,
    .chunk_env = "SPOTTRAIN_S3_PART_BYTES",
    .chunk_min = S3_PART_MIN,
    .chunk_quantum = 1,
    .chunk_default = S3_PART_DEFAULT,
    .upload_begin = s3_upload_begin,
    .upload_part = s3_upload_part,
    .upload_commit = s3_upload_commit,
    .upload_abort = s3_upload_abort,
};
