/* http.c: the bounded wiped string, encodings and curl error mapping (see http.h).
 *
 * The one idea: one copy of what oauth.c, cloud/aws.c and cloud/rest.c each used to carry,
 * keeping the strictest habit of the three: a buffer that held a secret is wiped before its
 * memory goes back, on growth as well as at the end (realloc would leave the old copy). */
#include <errno.h>
#include <string.h>

#include "common.h" /* st_malloc, st_free */
#include "http.h"

static void wipe(void *p, size_t n) {
    volatile unsigned char *q = p;
    while (n--)
        *q++ = 0;
}

/* See http.h. */
void st_sb_add(struct st_sbuf *b, const char *s, size_t n) {
    if (b->fail)
        return;
    if (b->len + n + 1 > b->max) {
        b->fail = true;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n + 1)
            nc *= 2;
        char *np = st_malloc(nc);
        if (!np) {
            b->fail = true;
            return;
        }
        if (b->p) {
            memcpy(np, b->p, b->len);
            wipe(b->p, b->cap);
            st_free(b->p);
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* See http.h. */
void st_sb_str(struct st_sbuf *b, const char *s) {
    st_sb_add(b, s, strlen(s));
}

/* See http.h. */
void st_sb_done(struct st_sbuf *b) {
    if (b->p)
        wipe(b->p, b->cap);
    st_free(b->p);
    memset(b, 0, sizeof(*b));
}

/* See http.h. */
void st_sb_base64(struct st_sbuf *b, const void *data, size_t n, bool url) {
    static const char std[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    static const char web[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    const char *tab = url ? web : std;
    const unsigned char *u = data;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)u[i] << 16;
        if (i + 1 < n)
            v |= (unsigned)u[i + 1] << 8;
        if (i + 2 < n)
            v |= u[i + 2];
        char o[4] = {tab[(v >> 18) & 63], tab[(v >> 12) & 63],
                     i + 1 < n ? tab[(v >> 6) & 63] : '=', i + 2 < n ? tab[v & 63] : '='};
        /* base64url in a JWT has no padding (RFC 7515). */
        size_t k = url ? (i + 2 < n ? 4 : i + 1 < n ? 3 : 2) : 4;
        st_sb_add(b, o, k);
    }
}

/* See http.h. */
void st_sb_escape(struct st_sbuf *b, const char *s) {
    static const char hex[] = "0123456789ABCDEF";
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
            c == '-' || c == '_' || c == '.' || c == '~') {
            st_sb_add(b, (const char *)&c, 1);
        } else {
            char e[3] = {'%', hex[c >> 4], hex[c & 15]};
            st_sb_add(b, e, 3);
        }
    }
}

/* See http.h. */
size_t st_sb_curl_write(char *ptr, size_t size, size_t nmemb, void *userdata) {
    struct st_sbuf *b = userdata;
    st_sb_add(b, ptr, size * nmemb);
    return b->fail ? 0 : size * nmemb;
}

/* See http.h. */
int st_curl_errno(CURLcode c, int other) {
    switch (c) {
    case CURLE_OK: return 0;
    case CURLE_COULDNT_CONNECT: return -ECONNREFUSED;
    case CURLE_OPERATION_TIMEDOUT: return -ETIMEDOUT;
    case CURLE_COULDNT_RESOLVE_HOST: return -EHOSTUNREACH;
    case CURLE_OUT_OF_MEMORY: return -ENOMEM;
    case CURLE_WRITE_ERROR: return -EFBIG;
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR: return -ECONNRESET;
    default: return other;
    }
}
