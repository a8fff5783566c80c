/* store-http.c: what the object-store backends (s3, gs, az) share: the request loop with its
 * retries and refusal log line, the five ops of struct mig_store_ops built from a backend's
 * requests (ranged get, put, part-by-part upload of a file, paged listing, delete), URL
 * escaping, a bounded answer buffer for libcurl, the <Error> XML body that S3 and Azure Blob
 * both answer, and libcurl's failures as negative errno.
 *
 * The one idea: the backends differ in how a request is addressed, signed and committed,
 * not in how bytes move or how a request is retried, so those pieces live once, here, and a
 * backend is a table of callbacks for the rest (see store-http.h). */
#include <curl/curl.h>
#include <fcntl.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "store-http.h"

/* See store-http.h. */
int mig__store_escape(char *out, size_t sz, const char *s, bool keep_slash) {
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                     c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/');
        if (o + 4 > sz)
            return -ENAMETOOLONG;
        if (plain) {
            out[o++] = (char)c;
        } else {
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    out[o] = '\0';
    return 0;
}

/* CURLOPT_WRITEFUNCTION appending to a struct mig__store_buf. */
static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata) {
    struct mig__store_buf *b = userdata;
    size_t n = size * nmemb;
    if (b->len + n + 1 > b->max) {
        b->toobig = true;
        return 0;
    }
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->len + n + 1)
            nc *= 2;
        unsigned char *np = st_realloc(b->p, nc);
        if (!np)
            return 0;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, ptr, n);
    b->len += n;
    b->p[b->len] = '\0';
    return n;
}

/* n bytes at off of fd into buf (pread until done); -EIO at a premature end. */
static int read_at(int fd, unsigned char *buf, size_t n, uint64_t off) {
    while (n) {
        ssize_t g = pread(fd, buf, n, (off_t)off);
        if (g < 0 && errno == EINTR)
            continue;
        if (g <= 0)
            return g < 0 ? -errno : -EIO;
        buf += g;
        n -= (size_t)g;
        off += (uint64_t)g;
    }
    return 0;
}

/* See store-http.h. */
int mig__store_xml_root(const struct mig__store_buf *b, const char *root, xmlNode **ret) {
    if (!b->len || b->len > INT32_MAX)
        return -EBADMSG;
    xmlDoc *doc = xmlReadMemory((const char *)b->p, (int)b->len, "answer.xml", NULL,
                                XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    xmlNode *r = doc ? xmlDocGetRootElement(doc) : NULL;
    if (!r || (root && strcmp((const char *)r->name, root))) {
        if (doc)
            xmlFreeDoc(doc);
        return -EBADMSG;
    }
    *ret = r;
    return 0;
}

/* See store-http.h. */
void mig__store_xml_error(const struct mig__store_buf *b, char *code, size_t csz, char *msg,
                          size_t msz) {
    xmlNode *root;
    code[0] = msg[0] = '\0';
    if (mig__store_xml_root(b, "Error", &root) < 0)
        return;
    for (xmlNode *c = root->children; c; c = c->next) {
        if (c->type != XML_ELEMENT_NODE)
            continue;
        xmlChar *t = xmlNodeGetContent(c);
        if (t && !strcmp((const char *)c->name, "Code"))
            snprintf(code, csz, "%s", (const char *)t);
        else if (t && !strcmp((const char *)c->name, "Message"))
            snprintf(msg, msz, "%s", (const char *)t);
        xmlFree(t);
    }
    xmlFreeDoc(root->doc);
}

/* See store-http.h. */
int mig__store_list_emit(mig__store_list_fn *fn, void *userdata, const char *full, size_t plen,
                         bool dir) {
    if (strlen(full) <= plen)
        return 0;
    if (!dir)
        return fn(userdata, full + plen, false);
    char name[1024];
    snprintf(name, sizeof(name), "%s", full + plen);
    size_t nl = strlen(name);
    if (nl && name[nl - 1] == '/')
        name[nl - 1] = '\0';
    return name[0] ? fn(userdata, name, true) : 0;
}

/* See store-http.h. */
int mig__store_xml_child(xmlNode *e, const char *child, size_t plen, bool dir,
                         mig__store_list_fn *fn, void *userdata) {
    for (xmlNode *k = e->children; k; k = k->next) {
        if (k->type != XML_ELEMENT_NODE || strcmp((const char *)k->name, child))
            continue;
        xmlChar *v = xmlNodeGetContent(k);
        int r = v ? mig__store_list_emit(fn, userdata, (const char *)v, plen, dir) : 0;
        xmlFree(v);
        return r;
    }
    return 0;
}

/* See store-http.h. */
int mig__store_status_errno(long status) {
    if (status == 401 || status == 403)
        return -EACCES;
    if (status == 404)
        return -ENOENT;
    if (status == 429 || status >= 500)
        return -EBUSY;
    return -EPROTO;
}

static bool in_list(const char *code, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(code, *list))
            return true;
    return false;
}

/* See store-http.h. */
int mig__store_code_errno(const char *code, long status, const char *const *auth,
                          const char *const *not_found, const char *no_bucket,
                          const char *const *busy) {
    if (in_list(code, auth))
        return -EACCES;
    if (in_list(code, not_found))
        return -ENOENT;
    if (!strcmp(code, no_bucket))
        return -ENXIO;
    if (in_list(code, busy))
        return -EBUSY;
    return mig__store_status_errno(status);
}

/* A CURLcode as negative errno. */
static int curl_errno(CURLcode cc) {
    switch (cc) {
    case CURLE_OK: return 0;
    case CURLE_COULDNT_CONNECT: return -ECONNREFUSED;
    case CURLE_OPERATION_TIMEDOUT: return -ETIMEDOUT;
    case CURLE_COULDNT_RESOLVE_HOST: return -EHOSTUNREACH;
    case CURLE_OUT_OF_MEMORY: return -ENOMEM;
    default: return -ECONNRESET;
    }
}

/* Sleeps 0.25 s << attempt before a retry of a throttled or failed request. */
static void backoff(int attempt) {
    struct timespec ts = {0, (long)(250000000L << attempt)};
    while (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ---- one request ------------------------------------------------------------------------- */

/* What on_header writes into: the headers, and which extra one the backend wants. */
struct hdr_ctx {
    const char *want; /* "etag:" */
    struct mig__store_hdrs hd;
};

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *userdata) {
    struct hdr_ctx *x = userdata;
    struct mig__store_hdrs *h = &x->hd;
    size_t n = size * nmemb, wl = strlen(x->want);
    char line[2100];
    snprintf(line, sizeof(line), "%.*s", (int)ST_MIN(n, sizeof(line) - 1), ptr);
    line[strcspn(line, "\r\n")] = '\0';
    if (!strncasecmp(line, x->want, wl)) {
        snprintf(h->value, sizeof(h->value), "%s", line + wl + strspn(line + wl, " "));
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

/* See store-http.h. */
int mig__store_request(const struct mig__store_backend *be, void *t,
                       const struct mig__store_req *q) {
    int r = -EIO;
    CURL *c = curl_easy_init();
    if (!c)
        return -ENOMEM;
    for (int attempt = 0; attempt < MIG__STORE_TRIES; attempt++) {
        struct curl_slist *h = NULL;
        struct hdr_ctx x = {.want = be->want_header};
        long status = 0;
        q->out->len = 0;
        q->out->toobig = false;
        curl_easy_reset(c);
        r = be->prepare(t, q, c, &h);
        if (r >= 0 && !h)
            r = -ENOMEM;
        if (r < 0) {
            curl_slist_free_all(h);
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
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, q->out);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &x);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
        curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
        curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
        CURLcode cc = curl_easy_perform(c);
        curl_slist_free_all(h);
        if (cc == CURLE_WRITE_ERROR && q->out->toobig) {
            r = st_log_errno(-EFBIG, "%s %s %s: answer larger than %zu bytes", be->what,
                             q->method, q->url, q->out->max);
            break;
        }
        if (cc != CURLE_OK) {
            bool retry = cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR ||
                         cc == CURLE_GOT_NOTHING;
            r = curl_errno(cc);
            if (retry && attempt + 1 < MIG__STORE_TRIES)
                continue;
            st_log(ST_LOG_ERR, "migrate", "%s %s %s: %s", be->what, q->method, q->url,
                   curl_easy_strerror(cc));
            break;
        }
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        if ((status >= 200 && status < 300) || (status == 308 && q->ok_308) ||
            (status == 499 && q->ok_499)) {
            if (q->hdrs)
                *q->hdrs = x.hd;
            r = 0;
            break;
        }
        struct mig__store_refusal f = {.hint = NULL};
        r = be->refusal(t, q->out, &x.hd, status, &f);
        if (r == -EBUSY && attempt + 1 < MIG__STORE_TRIES) {
            backoff(attempt);
            continue;
        }
        if (!(r == -ENOENT && q->quiet_404))
            st_log(ST_LOG_ERR, "migrate", "%s %s %s refused: %s%s%s (HTTP %ld)%s", be->what,
                   q->method, q->url, f.code[0] ? f.code : be->no_code, f.msg[0] ? ": " : "",
                   f.msg, status, r == -EACCES && f.hint ? f.hint : "");
        break;
    }
    curl_easy_cleanup(c);
    return r;
}

/* ---- the ops ----------------------------------------------------------------------------- */

/* Room for any backend's target, on the stack of the op that uses it. */
struct target_room {
    alignas(max_align_t) unsigned char bytes[MIG__STORE_TARGET_MAX];
};

static const struct mig__store_backend *const backends[] = {
    &mig__store_s3_backend, &mig__store_gs_backend, &mig__store_az_backend};

/* The index in backends[] (and in the ops tables' all[]) of the scheme of url; -1 for none. */
static int scheme_index(const char *url) {
    for (size_t i = 0; url && i < ST_ARRAY_SIZE(backends); i++)
        if (!strncmp(url, backends[i]->scheme, strlen(backends[i]->scheme)))
            return (int)i;
    return -1;
}

/* The backend that serves url; NULL for none (the op then answers -EINVAL, as each backend's
 * init does for a URL not its own). */
static const struct mig__store_backend *backend_for(const char *url) {
    int i = scheme_index(url);
    return i < 0 ? NULL : backends[i];
}

/* See struct mig_store_ops. */
static int store_get(const char *url, uint64_t off, uint64_t len, size_t max, unsigned char **ret,
                     size_t *ret_len, uint64_t *ret_total, struct st_error *err) {
    const struct mig__store_backend *be = backend_for(url);
    struct target_room room;
    void *t = room.bytes;
    struct mig__store_buf b = {.max = max + 1};
    struct mig__store_hdrs hd = {.total = 0};
    char range[64];
    int r;

    if (!be)
        return -EINVAL;
    TRY(be->init(url, t));
    if (off || len)
        snprintf(range, sizeof(range), len ? "%llu-%llu" : "%llu-", (unsigned long long)off,
                 (unsigned long long)(off + len - 1));
    r = be->get(t, off || len ? range : NULL, &b, &hd);
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
    be->done(t);
    return r;
}

/* A put of data (remove false) or a delete (remove true): one request each, so they share
 * the target and answer buffer around it. */
static int store_one(const char *url, const void *data, size_t len, bool remove) {
    const struct mig__store_backend *be = backend_for(url);
    struct target_room room;
    void *t = room.bytes;
    struct mig__store_buf b = {.max = MIG__STORE_REPLY_MAX};
    if (!be)
        return -EINVAL;
    TRY(be->init(url, t));
    int r = remove ? be->remove(t, &b) : be->put(t, data, len, &b);
    st_free(b.p);
    be->done(t);
    return remove && r == -ENOENT ? 0 : r; /* absent is what a delete wants */
}

/* See struct mig_store_ops. */
static int store_put(const char *url, const void *data, size_t len) {
    return store_one(url, data, len, false);
}

static size_t chunk_bytes(const struct mig__store_backend *be) {
    const char *e = getenv(be->chunk_env);
    unsigned long long v = e && *e ? strtoull(e, NULL, 10) : 0;
    return v >= be->chunk_min && v % be->chunk_quantum == 0 && v <= (1ull << 32)
               ? (size_t)v : be->chunk_default;
}

/* See struct mig_store_ops. The file is read one part at a time into one buffer, so a layer
 * file of any size costs one part of memory. */
static int store_put_file(const char *url, const char *path) {
    const struct mig__store_backend *be = backend_for(url);
    struct target_room room;
    void *t = room.bytes;
    struct mig__store_buf b = {.max = MIG__STORE_REPLY_MAX};
    struct mig__store_upload u = {.url = url, .out = &b};
    unsigned char *buf = NULL;
    struct stat sb;
    int fd, r;

    if (!be)
        return -EINVAL;
    u.chunk = chunk_bytes(be);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &sb) < 0) {
        r = -errno;
        close(fd);
        return r;
    }
    r = be->init(url, t);
    if (r < 0) {
        close(fd);
        return r;
    }
    u.size = (uint64_t)sb.st_size;
    buf = st_malloc(u.size <= u.chunk ? (u.size ? u.size : 1) : u.chunk);
    if (!buf)
        TRY_GOTO(-ENOMEM, r, out);
    if (u.size <= u.chunk) { /* one put */
        TRY_GOTO(read_at(fd, buf, u.size, 0), r, out);
        r = be->put(t, buf, u.size, &b);
        goto out;
    }
    TRY_GOTO(be->upload_begin(t, &u), r, out);
    int i = 0;
    for (uint64_t off = 0; off < u.size; off += u.chunk, i++) {
        size_t n = (size_t)ST_MIN((uint64_t)u.chunk, u.size - off);
        TRY_GOTO(read_at(fd, buf, n, off), r, out);
        TRY_GOTO(be->upload_part(t, &u, i, buf, n, off), r, out);
    }
    r = be->upload_commit ? be->upload_commit(t, &u) : 0;
out:
    /* Abort, so no parts are left billed or lingering; keep the first error. */
    if (r < 0 && u.id[0] && be->upload_abort)
        be->upload_abort(t, &u);
    close(fd);
    st_free(u.doc);
    st_free(buf);
    st_free(b.p);
    be->done(t);
    return r;
}

/* See struct mig_store_ops. */
static int store_list(const char *url, mig__store_list_fn *fn, void *userdata) {
    const struct mig__store_backend *be = backend_for(url);
    struct target_room room;
    void *t = room.bytes;
    struct mig__store_buf b = {.max = MIG__STORE_REPLY_MAX};
    char prefix[1100], next[1024] = "";
    int r;

    if (!be)
        return -EINVAL;
    TRY(be->init(url, t));
    const char *name = be->name(t);
    snprintf(prefix, sizeof(prefix), "%s%s", name, name[0] ? "/" : "");
    do {
        TRY_GOTO(be->list_request(t, prefix, next, &b), r, out);
        r = be->list_parse(&b, strlen(prefix), fn, userdata, next, sizeof(next));
        if (r == -EBADMSG)
            st_log(ST_LOG_ERR, "migrate", "%s %s of '%s': the answer is not %s", be->what,
                   be->list_what, url, be->list_result);
        if (r < 0)
            goto out;
    } while (next[0]);
    r = 0;
out:
    st_free(b.p);
    be->done(t);
    return r;
}

/* See struct mig_store_ops. */
static int store_remove(const char *url) {
    return store_one(url, NULL, 0, true);
}

/* One table per scheme, all on the generic ops: what differs is in the backend. */
#define STORE_OPS(n)                                                                            \
    {                                                                                           \
        .name = n, .scheme = n "://", .get = store_get, .put = store_put,                      \
        .put_file = store_put_file, .list = store_list, .remove = store_remove,                \
    }

/* See migrate-store.h. */
const struct mig_store_ops mig__store_s3 = STORE_OPS("s3");
const struct mig_store_ops mig__store_gs = STORE_OPS("gs");
const struct mig_store_ops mig__store_az = STORE_OPS("az");

/* See migrate-store.h. */
const struct mig_store_ops *mig__store_for(const char *url) {
    static const struct mig_store_ops *const all[] = {&mig__store_s3, &mig__store_gs,
                                                       &mig__store_az}; /* as backends[] */
    int i = scheme_index(url);
    return i < 0 ? NULL : all[i];
}
