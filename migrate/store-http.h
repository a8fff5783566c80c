/* store-http.h (internal to migrate/, included only by store-*.c): what the object-store
 * backends share.
 *
 * The one idea: s3, gs and az differ in how a request is addressed, signed and refused, how a
 * listing reads and how a large file is committed, not in how a request is retried or how an
 * op is put together from requests. So store-http.c holds the request loop and the five ops of
 * struct mig_store_ops once, and each backend is a struct mig__store_backend: a table of
 * callbacks for what differs. A backend's vtable entries only give the generic op a place for
 * the backend's own target (parsed URL and credentials) on their stack. */
#ifndef SPOTTRAIN_MIGRATE_STORE_HTTP_H
#define SPOTTRAIN_MIGRATE_STORE_HTTP_H

#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "migrate-store.h" /* struct mig_store_ops, mig__store_list_fn */

struct curl_slist; /* libcurl's; so this header needs no curl.h */
struct _xmlNode;   /* libxml2's xmlNode; so this header needs no libxml headers */

#define MIG__STORE_TRIES 4               /* tries of one request on 5xx / 429 / connection reset */
#define MIG__STORE_REPLY_MAX (16u << 20) /* XML / JSON answers larger than this are refused */
#define MIG__STORE_TARGET_MAX (24u << 10) /* bytes of the largest backend target (gs: its URLs
                                           * and an 8 KiB token); each backend asserts it fits */

/* An answer body, bounded (curl dynbuf style): toobig is set, and the transfer stopped, when it
 * would exceed max bytes. p (st_free) holds len bytes plus a NUL. */
struct mig__store_buf {
    unsigned char *p;
    size_t len, cap, max;
    bool toobig;
};

/* The response headers a backend needs. */
struct mig__store_hdrs {
    char value[2048]; /* the backend's want_header: S3's part ETag, GCS's session Location,
                       * Azure's x-ms-error-code */
    uint64_t total;   /* from Content-Range "bytes a-b/TOTAL", else Content-Length */
    bool have_range;
};

/* One request. A backend that needs more per request (extra headers, Azure's query) embeds
 * this as the first member of its own struct and casts back in its prepare callback. */
struct mig__store_req {
    const char *method;           /* GET, PUT, POST, DELETE */
    const char *url;              /* full URL, query included */
    const void *body;             /* PUT/POST body, or NULL */
    size_t body_len;
    const char *range;            /* "a-b" or NULL */
    struct mig__store_buf *out;   /* answer body (success or error) */
    struct mig__store_hdrs *hdrs; /* may be NULL */
    bool quiet_404;               /* a missing object is an answer, not an error to log */
    bool ok_308; /* GCS: 308 (Resume Incomplete) answers a chunk that was not the last */
    bool ok_499; /* GCS: 499 answers the cancel of a resumable session */
};

/* Why a request was refused, as the backend reads it from the answer. */
struct mig__store_refusal {
    char code[96];    /* the service's error code or reason; "" when it gave none */
    char msg[512];    /* its message, one line; "" when it gave none */
    const char *hint; /* appended to the logged refusal when it is -EACCES; NULL for none */
};

/* A large file going up part by part: S3 multipart, GCS resumable, Azure staged blocks. */
struct mig__store_upload {
    const char *url;            /* the object's store URL, for log lines */
    uint64_t size;              /* bytes of the whole file */
    size_t chunk;               /* bytes per part (the last may be shorter) */
    struct mig__store_buf *out; /* answer bodies */
    char id[2048];              /* S3's escaped UploadId, GCS's session URI; while not "",
                                 * a failure calls upload_abort */
    char *doc;                  /* the commit document being built (S3's part list, Azure's
                                 * block list), st_malloc'ed by upload_begin, freed by the
                                 * generic op */
    size_t len, cap;            /* bytes of doc used and allocated */
};

/* A backend: what differs between the stores. t is always the backend's own target, in room
 * of MIG__STORE_TARGET_MAX bytes aligned for any type. */
struct mig__store_backend {
    const char *scheme;      /* "s3://": the URLs this backend serves */
    const char *what;        /* "S3", "GCS", "Azure": opens every logged line */
    const char *no_code;     /* logged when a refusal has no code: "no error code" */
    const char *want_header; /* response header kept in mig__store_hdrs.value, with ':' */
    const char *list_what;   /* the listing call, for its log line: "ListObjectsV2" */
    const char *list_result; /* what a listing answer must be: "a ListBucketResult" */

    /* Parses url into t and finds credentials, logging (once) why it cannot; done wipes the
     * credentials. done is called only after init succeeded. */
    int (*init)(const char *url, void *t);
    void (*done)(void *t);
    /* The object name (or listed prefix) of t, without a trailing '/'. */
    const char *(*name)(const void *t);

    /* Appends the headers of one attempt to *h, in the order the service is sent them, and
     * sets the backend's own curl options on curl (a CURL *). Called before every attempt, so
     * a signature can carry the attempt's date. */
    int (*prepare)(void *t, const struct mig__store_req *q, void *curl, struct curl_slist **h);
    /* Reads a non-2xx answer (body b, headers hd, HTTP status) into ret; returns its negative
     * errno, -EBUSY for what is worth a retry. */
    int (*refusal)(void *t, const struct mig__store_buf *b, const struct mig__store_hdrs *hd,
                   long status, struct mig__store_refusal *ret);

    /* One request each: a ranged read (range NULL: whole), a whole-object write, a delete. */
    int (*get)(void *t, const char *range, struct mig__store_buf *b, struct mig__store_hdrs *hd);
    int (*put)(void *t, const void *data, size_t len, struct mig__store_buf *b);
    int (*remove)(void *t, struct mig__store_buf *b);

    /* One listing page of prefix ("dir/" or "") after page token next ("" = first). */
    int (*list_request)(void *t, const char *prefix, const char *next, struct mig__store_buf *b);
    /* Calls fn for each child in page b (plen bytes of prefix to strip) and sets next to the
     * next page's token, "" on the last page; -EBADMSG when b is not a listing. */
    int (*list_parse)(const struct mig__store_buf *b, size_t plen, mig__store_list_fn *fn,
                      void *userdata, char *next, size_t nsz);

    /* Bytes per part of a large upload (a file no larger goes up as one put): chunk_env when
     * it lies in [chunk_min, 2^32] and is a multiple of chunk_quantum, else chunk_default. */
    const char *chunk_env;
    size_t chunk_min, chunk_quantum, chunk_default;
    /* A large upload: begin (may set u->id and u->doc), each part i from 0 (buf holds n bytes
     * at off), commit (NULL: the last part commits), abort when a step failed and u->id is set
     * (NULL: nothing to abort). */
    int (*upload_begin)(void *t, struct mig__store_upload *u);
    int (*upload_part)(void *t, struct mig__store_upload *u, int i, const unsigned char *buf,
                       size_t n, uint64_t off);
    int (*upload_commit)(void *t, struct mig__store_upload *u);
    void (*upload_abort)(void *t, struct mig__store_upload *u);
};

extern const struct mig__store_backend mig__store_s3_backend; /* store-s3.c */
extern const struct mig__store_backend mig__store_gs_backend; /* store-gs.c */
extern const struct mig__store_backend mig__store_az_backend; /* store-az.c */

/* One request of backend be, retried on throttling, 5xx and dropped connections. Returns 0 on
 * 2xx (and 308 / 499 where q allows them) and fills q->hdrs, else negative errno with the
 * refusal logged (what, code, message, HTTP status), except a quiet_404 -ENOENT. Called by the
 * backends' request wrappers. */
int mig__store_request(const struct mig__store_backend *be, void *t,
                       const struct mig__store_req *q);

/* RFC 3986 escaping of s into out; '/' kept when keep_slash (object paths), escaped in query
 * values. -ENAMETOOLONG when it does not fit. */
int mig__store_escape(char *out, size_t sz, const char *s, bool keep_slash);
/* The negative errno of an S3 or Azure error code: auth, not_found and busy are NULL-ended
 * lists of codes, no_bucket the one code of a missing bucket or container; a code in none of
 * them falls back to the HTTP status as mig__store_status_errno reads it. */
int mig__store_code_errno(const char *code, long status, const char *const *auth,
                          const char *const *not_found, const char *no_bucket,
                          const char *const *busy);
/* The negative errno of an HTTP status: -EACCES, -ENOENT, -EBUSY (429, 5xx) or -EPROTO. */
int mig__store_status_errno(long status);
/* The root element of the XML answer b when it is named root (NULL: any name), else -EBADMSG.
 * The caller frees the document with xmlFreeDoc((*ret)->doc). */
int mig__store_xml_root(const struct mig__store_buf *b, const char *root, struct _xmlNode **ret);
/* The <Code> and <Message> of an <Error> XML body (S3, Azure Blob); empty when there is none. */
void mig__store_xml_error(const struct mig__store_buf *b, char *code, size_t csz, char *msg,
                          size_t msz);
/* Calls fn for the first child element of e named child: its text, less the plen bytes of the
 * listed prefix, as a directory when dir. 0 when there is none. */
int mig__store_xml_child(struct _xmlNode *e, const char *child, size_t plen, bool dir,
                         mig__store_list_fn *fn, void *userdata);
/* Calls fn for the listed name full less its plen bytes of prefix (nothing when no bytes are
 * left); a directory loses its trailing '/'. Returns fn's answer, or 0. */
int mig__store_list_emit(mig__store_list_fn *fn, void *userdata, const char *full, size_t plen,
                         bool dir);
#endif
