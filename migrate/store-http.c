/* store-http.c: what the object-store backends (s3, gs, az) share: URL escaping, a bounded
 * answer buffer for libcurl, positioned reads of the file being uploaded, the <Error> body
 * that S3 and Azure Blob both answer, and libcurl's failures as negative errno.
 *
 * The one idea: the backends differ in how a request is addressed, signed and committed,
 * not in how bytes move, so the byte-moving pieces live once, here (see migrate-store.h). */
#include <curl/curl.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "migrate-store.h"

/* See migrate-store.h. */
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

/* See migrate-store.h. */
size_t mig__store_on_body(char *ptr, size_t size, size_t nmemb, void *userdata) {
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

/* See migrate-store.h. */
int mig__store_read_at(int fd, unsigned char *buf, size_t n, uint64_t off) {
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

/* See migrate-store.h. */
void mig__store_xml_error(const struct mig__store_buf *b, char *code, size_t csz, char *msg,
                          size_t msz) {
    code[0] = msg[0] = '\0';
    if (!b->len || b->len > INT32_MAX)
        return;
    xmlDoc *doc = xmlReadMemory((const char *)b->p, (int)b->len, "error.xml", NULL,
                                XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    xmlNode *root = doc ? xmlDocGetRootElement(doc) : NULL;
    if (root && !strcmp((const char *)root->name, "Error"))
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
    if (doc)
        xmlFreeDoc(doc);
}

/* See migrate-store.h. */
int mig__store_curl_errno(int cc) {
    switch ((CURLcode)cc) {
    case CURLE_OK: return 0;
    case CURLE_COULDNT_CONNECT: return -ECONNREFUSED;
    case CURLE_OPERATION_TIMEDOUT: return -ETIMEDOUT;
    case CURLE_COULDNT_RESOLVE_HOST: return -EHOSTUNREACH;
    case CURLE_OUT_OF_MEMORY: return -ENOMEM;
    default: return -ECONNRESET;
    }
}

/* See migrate-store.h. */
void mig__store_backoff(int attempt) {
    struct timespec ts = {0, (long)(250000000L << attempt)};
    while (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}
