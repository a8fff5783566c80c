/* http.h: what every libcurl caller shares — a bounded string that is wiped when freed, the
 * base64 and percent-encodings HTTP APIs want, and CURLcode -> negative errno.
 *
 * Shared by common/oauth.c (token endpoints), cloud/aws.c (EC2's Query API) and cloud/rest.c
 * (Compute, Resource Manager): the lowest part that needs them owns them (DESIGN.md), so they
 * live here instead of in three copies. Non-logging. */
#ifndef SPOTTRAIN_HTTP_H
#define SPOTTRAIN_HTTP_H

#include <curl/curl.h> /* CURLcode */
#include <stdbool.h>
#include <stddef.h>

/* A growing string with a bound (curl dynbuf style); fail is sticky (over max, or out of
 * memory) and p stays NUL-terminated. Bodies carry tokens and secrets, so every byte the
 * string ever held is wiped: on growth (the old block) and in st_sb_done(). Zero-initialise
 * with .max set; release with st_sb_done(). */
struct st_sbuf {
    char *p;
    size_t len, cap, max; /* bytes */
    bool fail;
};
void st_sb_add(struct st_sbuf *b, const char *s, size_t n);
void st_sb_str(struct st_sbuf *b, const char *s);
/* Wipes and frees the bytes; b is zero afterwards (max too). */
void st_sb_done(struct st_sbuf *b);
/* Standard base64 (padded), or base64url without padding (JWT, RFC 7515) when url. */
void st_sb_base64(struct st_sbuf *b, const void *data, size_t n, bool url);
/* RFC 3986 percent-encoding (form bodies, query parameters, SigV4). */
void st_sb_escape(struct st_sbuf *b, const char *s);

/* A CURLOPT_WRITEFUNCTION appending to the struct st_sbuf in CURLOPT_WRITEDATA; over its
 * bound the transfer stops (CURLE_WRITE_ERROR, with the buffer's fail set). */
size_t st_sb_curl_write(char *ptr, size_t size, size_t nmemb, void *userdata);

/* The negative errno of a failed transfer: -ECONNREFUSED, -ETIMEDOUT, -EHOSTUNREACH, -ENOMEM,
 * -EFBIG (the write callback refused: a body over its bound), -ECONNRESET (nothing, or a
 * broken send or receive); any other code is `other` (each caller keeps its own: see there). */
int st_curl_errno(CURLcode c, int other);

#endif
