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
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "oauth.h" /* st_gcp_token_get, st_url_is_loopback */
#include "store-http.h" /* struct mig__store_backend, mig__store_request */

#define GS_SCOPE "https://www.googleapis.com/auth/devstorage.read_write"
#define GS_ENDPOINT "https://storage.googleapis.com"
#define GS_CHUNK_DEFAULT (16u << 20) /* bytes per resumable-upload chunk */
#define GS_CHUNK_QUANTUM (256u << 10) /* GCS: every chunk but the last is a multiple of this */

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
static int target_init(const char *url, void *tp) {
    struct gs_target *t = tp;
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

static void target_done(void *tp) {
    struct gs_target *t = tp;
    st_token_wipe(&t->token);
}

static const char *target_name(const void *tp) {
    const struct gs_target *t = tp;
    return t->name;
}

/* ---- one request ------------------------------------------------------------------------- */

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

/* A refusal: the JSON API names reason and message in the body, but the errno follows the
 * status alone (GCS has no code that means more than its status). */
static int refusal(void *tp, const struct mig__store_buf *b, const struct mig__store_hdrs *hd,
                   long status, struct mig__store_refusal *ret) {
    (void)tp;
    (void)hd;
    json_error(b, ret->code, sizeof(ret->code), ret->msg, sizeof(ret->msg));
    ret->hint = "; check GOOGLE_APPLICATION_CREDENTIALS or the instance's service account";
    return mig__store_status_errno(status);
}

/* A request with the headers only some GCS calls send. */
struct gs_req {
    struct mig__store_req q;  /* first: prepare casts back */
    const char *header;       /* one more "Name: value" (Content-Range, X-Upload-...) or NULL */
    const char *header2;      /* and another, or NULL */
    const char *content_type; /* of body; NULL = application/octet-stream */
};

/* The headers of one attempt: the bearer token (none for an anonymous emulator). */
static int gs_prepare(void *tp, const struct mig__store_req *q, void *c, struct curl_slist **hp) {
    const struct gs_target *t = tp;
    const struct gs_req *gq = (const struct gs_req *)q;
    char auth[sizeof(t->token.value) + 32], range[96], ctype[96];
    struct curl_slist *h = *hp;
    (void)c;
    if (t->token.value[0]) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", t->token.value);
        h = curl_slist_append(h, auth);
        memset(auth, 0, sizeof(auth));
    }
    if (q->range) {
        snprintf(range, sizeof(range), "Range: bytes=%s", q->range);
        h = curl_slist_append(h, range);
    }
    if (gq->header)
        h = curl_slist_append(h, gq->header);
    if (gq->header2)
        h = curl_slist_append(h, gq->header2);
    snprintf(ctype, sizeof(ctype), "Content-Type: %s",
             gq->content_type ? gq->content_type : "application/octet-stream");
    *hp = curl_slist_append(h, ctype);
    return 0;
}

/* One request (see mig__store_request). */
static int gs_request(struct gs_target *t, const struct gs_req *q) {
    return mig__store_request(&mig__store_gs_backend, t, &q->q);
}

/* ---- the ops ----------------------------------------------------------------------------- */

static int gs_get_req(void *tp, const char *range, struct mig__store_buf *b,
                      struct mig__store_hdrs *hd) {
    struct gs_target *t = tp;
    char qurl[4200];
    snprintf(qurl, sizeof(qurl), "%s?alt=media", t->obj_url);
    struct gs_req q = {.q = {.method = "GET", .url = qurl, .range = range, .out = b, .hdrs = hd,
                             .quiet_404 = true}};
    return gs_request(t, &q);
}

/* A media upload of data as object t->name. */
static int media_upload(void *tp, const void *data, size_t len, struct mig__store_buf *b) {
    struct gs_target *t = tp;
    char ename[3200], qurl[4400];
    TRY(mig__store_escape(ename, sizeof(ename), t->name, false));
    snprintf(qurl, sizeof(qurl), "%s?uploadType=media&name=%s", t->upload_url, ename);
    struct gs_req q = {.q = {.method = "POST", .url = qurl, .body = data, .body_len = len,
                             .out = b}};
    return gs_request(t, &q);
}

static int gs_remove_req(void *tp, struct mig__store_buf *b) {
    struct gs_target *t = tp;
    struct gs_req q = {.q = {.method = "DELETE", .url = t->obj_url, .out = b,
                             .quiet_404 = true}};
    return gs_request(t, &q);
}

/* Opens a resumable session; u->id gets its URI. */
static int gs_upload_begin(void *tp, struct mig__store_upload *u) {
    struct gs_target *t = tp;
    char ename[3200], qurl[4400], h1[128];
    TRY(mig__store_escape(ename, sizeof(ename), t->name, false));
    snprintf(qurl, sizeof(qurl), "%s?uploadType=resumable&name=%s", t->upload_url, ename);
    snprintf(h1, sizeof(h1), "X-Upload-Content-Length: %llu", (unsigned long long)u->size);
    struct mig__store_hdrs hd = {.total = 0};
    /* The session's metadata is the JSON body (none beyond the name in the query). */
    struct gs_req oq = {.q = {.method = "POST", .url = qurl, .body = "{}", .body_len = 2,
                              .out = u->out, .hdrs = &hd},
                        .content_type = "application/json; charset=UTF-8", .header = h1,
                        .header2 = "X-Upload-Content-Type: application/octet-stream"};
    TRY(gs_request(t, &oq));
    if (!hd.value[0])
        return st_log_errno(-EBADMSG, "GCS resumable upload of '%s': no session URI (Location) "
                            "in the answer", u->url);
    snprintf(u->id, sizeof(u->id), "%s", hd.value);
    return 0;
}

/* One chunk PUT to the session; the object exists once the last is in (no commit call). */
static int gs_upload_part(void *tp, struct mig__store_upload *u, int i,
                          const unsigned char *buf, size_t n, uint64_t off) {
    char h2[96];
    bool last = off + n == u->size;
    (void)i;
    snprintf(h2, sizeof(h2), "Content-Range: bytes %llu-%llu/%llu", (unsigned long long)off,
             (unsigned long long)(off + n - 1), (unsigned long long)u->size);
    struct gs_req pq = {.q = {.method = "PUT", .url = u->id, .body = buf, .body_len = n,
                              .out = u->out, .ok_308 = !last},
                        .header = h2};
    return gs_request(tp, &pq);
}

/* Cancels the session, so no partial upload lingers. */
static void gs_upload_abort(void *tp, struct mig__store_upload *u) {
    struct gs_req cq = {.q = {.method = "DELETE", .url = u->id, .out = u->out,
                              .quiet_404 = true, .ok_499 = true}};
    (void)gs_request(tp, &cq);
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
        if (p && r >= 0)
            r = mig__store_list_emit(fn, userdata, p, plen, true);
    }
    json_array_foreach(json_object_get(j, "items"), i, v) {
        const char *p = json_string_value(json_object_get(v, "name"));
        if (p && r >= 0)
            r = mig__store_list_emit(fn, userdata, p, plen, false);
    }
    const char *tok = json_string_value(json_object_get(j, "nextPageToken"));
    if (tok && snprintf(next, nsz, "%s", tok) >= (int)nsz)
        r = r < 0 ? r : -EBADMSG;
    json_decref(j);
    return r;
}

static int gs_list_req(void *tp, const char *prefix, const char *next,
                       struct mig__store_buf *b) {
    struct gs_target *t = tp;
    char eprefix[3400], etok[3100], qurl[8000];
    TRY(mig__store_escape(eprefix, sizeof(eprefix), prefix, false));
    TRY(mig__store_escape(etok, sizeof(etok), next, false));
    snprintf(qurl, sizeof(qurl), "%s?delimiter=%%2F&prefix=%s%s%s", t->bucket_url, eprefix,
             next[0] ? "&pageToken=" : "", next[0] ? etok : "");
    struct gs_req q = {.q = {.method = "GET", .url = qurl, .out = b}};
    int r = gs_request(t, &q);
    /* objects.list answers 404 only for a bucket that does not exist. */
    return r == -ENOENT ? -ENXIO : r;
}

_Static_assert(sizeof(struct gs_target) <= MIG__STORE_TARGET_MAX,
               "struct gs_target no longer fits the ops' target room");

/* See store-http.h. */
const struct mig__store_backend mig__store_gs_backend = {
    .scheme = "gs://",
    .what = "GCS",
    .no_code = "no error reason",
    .want_header = "location:",
    .list_what = "objects.list",
    .list_result = "an Objects resource",
    .init = target_init,
    .done = target_done,
    .name = target_name,
    .prepare = gs_prepare,
    .refusal = refusal,
    .get = gs_get_req,
    .put = media_upload,
    .remove = gs_remove_req,
    .list_request = gs_list_req,
    .list_parse = list_page,
    .chunk_env = "SPOTTRAIN_GS_CHUNK_BYTES",
    .chunk_min = GS_CHUNK_QUANTUM,
    .chunk_quantum = GS_CHUNK_QUANTUM,
    .chunk_default = GS_CHUNK_DEFAULT,
    .upload_begin = gs_upload_begin,
    .upload_part = gs_upload_part,
    .upload_abort = gs_upload_abort,
};
