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
#include <libxml/tree.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "oauth.h" /* st_azure_token_get, st_url_is_loopback */
#include "store-http.h" /* struct mig__store_backend, mig__store_request */

#define AZ_VERSION "2021-08-06"      /* x-ms-version: bearer tokens need >= 2017-11-09 */
#define AZ_RESOURCE "https://storage.azure.com"
#define AZ_BLOCK_DEFAULT (64u << 20) /* bytes per staged block */
#define AZ_BLOCK_MIN (64u << 10)     /* smallest block SPOTTRAIN_AZ_BLOCK_BYTES may set */
#define AZ_BLOCKS_MAX 50000          /* Azure: blocks per blob */
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
static int target_init(const char *url, void *tp) {
    struct az_target *t = tp;
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

static const char *target_name(const void *tp) {
    const struct az_target *t = tp;
    return t->blob;
}

static void target_done(void *tp) {
    struct az_target *t = tp;
    volatile unsigned char *q = t->key;
    for (size_t i = 0; i < sizeof(t->key); i++)
        q[i] = 0;
    st_token_wipe(&t->token);
}

/* ---- one request ------------------------------------------------------------------------- */

/* A refusal: as S3, by the <Code> of an <Error> body, with Azure's own codes; the hint
 * depends on which credential was used. */
static int refusal(void *tp, const struct mig__store_buf *b, const struct mig__store_hdrs *hd,
                   long status, struct mig__store_refusal *ret) {
    static const char *const auth[] = {"AuthenticationFailed", "AuthorizationFailure",
        "AuthorizationPermissionMismatch", "InvalidAuthenticationInfo",
        "NoAuthenticationInformation", "AuthorizationSourceIPMismatch",
        "InsufficientAccountPermissions", NULL};
    static const char *const not_found[] = {"BlobNotFound", NULL};
    static const char *const busy[] = {"ServerBusy", "InternalError", NULL};
    const struct az_target *t = tp;
    mig__store_xml_error(b, ret->code, sizeof(ret->code), ret->msg, sizeof(ret->msg));
    /* Azure also names the error in x-ms-error-code, which is all a bodyless answer has. */
    if (!ret->code[0])
        snprintf(ret->code, sizeof(ret->code), "%s", hd->value);
    ret->msg[strcspn(ret->msg, "\r\n")] = '\0'; /* Azure appends RequestId and Time on new lines */
    ret->hint = t->key_len ? "; check AZURE_STORAGE_KEY"
                           : "; check the identity's role on the account (Storage Blob Data "
                             "Contributor)";
    return mig__store_code_errno(ret->code, status, auth, not_found, "ContainerNotFound", busy);
}

struct az_query {
    const char *name, *value; /* value unescaped */
};

/* A request as the backend's calls give it: url is left NULL, az_request builds it from the
 * target, container and q. */
struct az_req {
    struct mig__store_req r;  /* first: prepare casts back (method GET, PUT or DELETE) */
    bool container;           /* the request is on the container, not the blob */
    struct az_query q[AZ_QUERY_MAX]; /* sorted by name (Shared Key signs them in order) */
    bool block_blob;          /* x-ms-blob-type: BlockBlob (Put Blob) */
    const char *path;         /* set by az_request: the path as sent, for Shared Key */
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
    sts_add(sts, sizeof(sts), &n, "%s\n\n\n", q->r.method);
    if (q->r.body_len)
        sts_add(sts, sizeof(sts), &n, "%zu", q->r.body_len);
    sts_add(sts, sizeof(sts), &n, "\n\n%s\n\n\n\n\n\n\n",
            strcmp(q->r.method, "PUT") ? "" : "application/octet-stream");
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

/* The headers of one attempt: its date, signed with Shared Key, or the bearer token. */
static int az_prepare(void *tp, const struct mig__store_req *rq, void *c, struct curl_slist **hp) {
    const struct az_target *t = tp;
    const struct az_req *q = (const struct az_req *)rq;
    char date[64], auth[sizeof(t->token.value) + 32], range[96], ver[64], xdate[96];
    struct curl_slist *h = *hp;
    time_t now = time(NULL);
    struct tm tm;
    (void)c;
    gmtime_r(&now, &tm);
    strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (t->key_len)
        TRY(shared_key(t, q, q->path, date, rq->range, auth, sizeof(auth)));
    else
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", t->token.value);
    h = curl_slist_append(h, auth);
    memset(auth, 0, sizeof(auth));
    snprintf(xdate, sizeof(xdate), "x-ms-date: %s", date);
    h = curl_slist_append(h, xdate);
    snprintf(ver, sizeof(ver), "x-ms-version: %s", AZ_VERSION);
    h = curl_slist_append(h, ver);
    if (q->block_blob)
        h = curl_slist_append(h, "x-ms-blob-type: BlockBlob");
    if (rq->range) {
        snprintf(range, sizeof(range), "x-ms-range: bytes=%s", rq->range);
        h = curl_slist_append(h, range);
    }
    /* Content-Type only on PUT (it is signed); none on GET and DELETE. */
    h = curl_slist_append(h, strcmp(rq->method, "PUT") ? "Content-Type:"
                                                        : "Content-Type: application/octet-stream");
    *hp = curl_slist_append(h, "Expect:"); /* no 100-continue round trip for each block */
    return 0;
}

/* One request (see mig__store_request), its URL built from the target and q's query. */
static int az_request(struct az_target *t, const struct az_req *q) {
    char path[4200], url[12000];
    struct az_req aq = *q;

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
    aq.r.url = url;
    aq.path = path;
    return mig__store_request(&mig__store_az_backend, t, &aq.r);
}

/* ---- the ops ----------------------------------------------------------------------------- */

static int az_get_req(void *tp, const char *range, struct mig__store_buf *b,
                      struct mig__store_hdrs *hd) {
    struct az_req q = {.r = {.method = "GET", .range = range, .out = b, .hdrs = hd,
                             .quiet_404 = true}};
    return az_request(tp, &q);
}

/* Put Blob: the whole blob in one request. */
static int az_put_req(void *tp, const void *data, size_t len, struct mig__store_buf *b) {
    struct az_req q = {.r = {.method = "PUT", .body = data, .body_len = len, .out = b},
                       .block_blob = true};
    return az_request(tp, &q);
}

static int az_remove_req(void *tp, struct mig__store_buf *b) {
    struct az_req q = {.r = {.method = "DELETE", .out = b, .quiet_404 = true}};
    return az_request(tp, &q);
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

/* Checks the block count and starts the block list. */
static int az_upload_begin(void *tp, struct mig__store_upload *u) {
    (void)tp;
    uint64_t nblocks = (u->size + u->chunk - 1) / u->chunk;
    if (nblocks > AZ_BLOCKS_MAX)
        return st_log_errno(-EFBIG, "Azure upload of '%s': %llu blocks of %zu bytes exceed the "
                            "service's %d", u->url, (unsigned long long)nblocks, u->chunk,
                            AZ_BLOCKS_MAX);
    u->cap = 128 + nblocks * 64;
    u->doc = st_malloc(u->cap);
    if (!u->doc)
        return -ENOMEM;
    u->len = (size_t)snprintf(u->doc, u->cap,
                              "<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>");
    return 0;
}

/* Put Block i: staged, invisible until the block list commits it. */
static int az_upload_part(void *tp, struct mig__store_upload *u, int i,
                          const unsigned char *buf, size_t n, uint64_t off) {
    char id[64];
    (void)off;
    block_id(i, id, sizeof(id));
    struct az_req pq = {.r = {.method = "PUT", .body = buf, .body_len = n, .out = u->out},
                        .q = {{"blockid", id}, {"comp", "block"}}};
    TRY(az_request(tp, &pq));
    u->len += (size_t)snprintf(u->doc + u->len, u->cap - u->len, "<Latest>%s</Latest>", id);
    return 0;
}

/* The commit: until this Put Block List the blob does not exist (or keeps its old bytes). */
static int az_upload_commit(void *tp, struct mig__store_upload *u) {
    u->len += (size_t)snprintf(u->doc + u->len, u->cap - u->len, "</BlockList>");
    struct az_req cq = {.r = {.method = "PUT", .body = u->doc, .body_len = u->len,
                              .out = u->out},
                        .q = {{"comp", "blocklist"}}};
    return az_request(tp, &cq);
}

/* One page of List Blobs: Blobs/Blob/Name (objects) and Blobs/BlobPrefix/Name (one level
 * down), and NextMarker. */
static int list_page(const struct mig__store_buf *b, size_t plen, mig__store_list_fn *fn,
                     void *userdata, char *next, size_t nsz) {
    xmlNode *root;
    int r = 0;
    next[0] = '\0';
    TRY(mig__store_xml_root(b, "EnumerationResults", &root));
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
            if (dir || !strcmp((const char *)e->name, "Blob"))
                r = mig__store_xml_child(e, "Name", plen, dir, fn, userdata);
        }
    }
    xmlFreeDoc(root->doc);
    return r;
}

static int az_list_req(void *tp, const char *prefix, const char *next,
                       struct mig__store_buf *b) {
    /* Sorted by name, as Shared Key signs them. */
    struct az_req q = {.r = {.method = "GET", .out = b}, .container = true,
                       .q = {{"comp", "list"}, {"delimiter", "/"}}};
    int i = 2;
    if (next[0])
        q.q[i++] = (struct az_query){"marker", next};
    q.q[i++] = (struct az_query){"prefix", prefix};
    q.q[i] = (struct az_query){"restype", "container"};
    return az_request(tp, &q);
}

_Static_assert(sizeof(struct az_target) <= MIG__STORE_TARGET_MAX,
               "struct az_target no longer fits the ops' target room");

/* See store-http.h. */
const struct mig__store_backend mig__store_az_backend = {
    .scheme = "az://",
    .what = "Azure",
    .no_code = "no error code",
    .want_header = "x-ms-error-code:",
    .list_what = "List Blobs",
    .list_result = "an EnumerationResults",
    .init = target_init,
    .done = target_done,
    .name = target_name,
    .prepare = az_prepare,
    .refusal = refusal,
    .get = az_get_req,
    .put = az_put_req,
    .remove = az_remove_req,
    .list_request = az_list_req,
    .list_parse = list_page,
    .chunk_env = "SPOTTRAIN_AZ_BLOCK_BYTES",
    .chunk_min = AZ_BLOCK_MIN,
    .chunk_quantum = 1,
    .chunk_default = AZ_BLOCK_DEFAULT,
    .upload_begin = az_upload_begin,
    .upload_part = az_upload_part,
    .upload_commit = az_upload_commit,
    /* No abort: uncommitted blocks are invisible and Azure drops them after a week. */
};
