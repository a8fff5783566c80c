/* oauth.c: Google and Azure access tokens (see oauth.h).
 *
 * The one idea: do what google-auth and azure-identity do, in their order, so a setup that
 * works with gcloud or az works here unchanged. Moved here from cloud/gcp.c and cloud/azure.c
 * when the gs:// and az:// checkpoint stores needed the same tokens from migrate/ (which may
 * not use cloud/): the providers and the stores now share one lookup, each asking for its own
 * scope or resource. Token endpoints are HTTPS, so this file is the one in common/ that links
 * libcurl (and OpenSSL for the RS256 signature of a service-account JWT). */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"  /* TRY_GOTO */
#include "common.h" /* st_now, st_strerror, st_malloc */
#include "http.h"   /* st_sbuf, st_sb_*, st_curl_errno */
#include "oauth.h"

#define TOKEN_REPLY_MAX (1u << 20) /* bytes of a token endpoint's answer */

/* See oauth.h. */
void st_token_wipe(struct st_token *t) {
    volatile unsigned char *q = (volatile unsigned char *)t;
    for (size_t n = sizeof(*t); n--;)
        *q++ = 0;
}

/* See oauth.h. */
bool st_url_is_loopback(const char *url) {
    const char *h = strstr(url, "://");
    if (!h)
        return false;
    h += 3;
    return !strncmp(h, "127.", 4) || !strncmp(h, "localhost:", 10) ||
           !strcmp(h, "localhost") || !strncmp(h, "localhost/", 10) || !strncmp(h, "[::1]", 5);
}

/* ---- one token request ------------------------------------------------------------------- */

/* POSTs form (or GETs when form is NULL) to url; *ret_json is the answer parsed as JSON (NULL
 * when it is not), *ret_status its HTTP status. Returns 0 or a transport error. */
static int token_call(const char *url, const char *form, const char *header, long timeout_ms,
                      long *ret_status, json_t **ret_json) {
    struct st_sbuf body = {.max = TOKEN_REPLY_MAX};
    struct curl_slist *h = NULL;
    long status = 0;
    int r = 0;
    CURL *c = curl_easy_init();
    if (!c)
        return -ENOMEM;
    h = curl_slist_append(h, "Accept: application/json");
    if (h && header)
        h = curl_slist_append(h, header);
    if (h && form)
        h = curl_slist_append(h, "Content-Type: application/x-www-form-urlencoded");
    if (!h)
        TRY_GOTO(-ENOMEM, r, out);
    curl_easy_setopt(c, CURLOPT_URL, url);
    if (form) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, form);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(form));
    } else {
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, st_sb_curl_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*"); /* metadata servers are never behind a proxy */
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, ST_MIN(timeout_ms, 5000L));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    CURLcode cc = curl_easy_perform(c);
    if (cc != CURLE_OK) {
        /* Whatever else went wrong reads as a reset connection here: the callers show it
         * as "did not answer (...)" and a metadata probe turns it into -ENOKEY. */
        r = body.fail ? -EFBIG : st_curl_errno(cc, -ECONNRESET);
        goto out;
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    *ret_status = status;
    *ret_json = body.len ? json_loadb(body.p, body.len, 0, NULL) : NULL;
out:
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    st_sb_done(&body);
    return r;
}

static const char *jstr(const json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static double json_seconds(const json_t *v) {
    if (json_is_integer(v))
        return (double)json_integer_value(v);
    if (json_is_string(v))
        return atof(json_string_value(v)); /* Azure IMDS sends "expires_in": "3599" */
    return 0;
}

/* A token endpoint's or metadata server's refusal, as the user must see it. Google's answers
 * carry error as a string ({"error": "invalid_grant"}), as do Microsoft's. */
static void refusal(char *why, size_t whysz, const char *where, long status, const json_t *j) {
    const char *code = jstr(j, "error"), *desc = jstr(j, "error_description");
    snprintf(why, whysz, "%s refused the credentials (HTTP %ld): %s%s%s", where, status,
             code[0] ? code : "no error code", desc[0] ? ": " : "", desc);
}

/* The access token and its lifetime out of a 200 answer; else the refusal into why. */
static int take_token(const char *where, long status, json_t *j, double ttl_default,
                      struct st_token *t, char *why, size_t whysz) {
    const char *tok = jstr(j, "access_token");
    if (status != 200 || !tok[0]) {
        refusal(why, whysz, where, status, j);
        return status >= 500 ? -EIO : -EACCES;
    }
    if (strlen(tok) >= sizeof(t->value)) {
        snprintf(why, whysz, "%s answered a token longer than %zu bytes", where,
                 sizeof(t->value) - 1);
        return -EFBIG;
    }
    snprintf(t->value, sizeof(t->value), "%s", tok);
    double ttl = json_seconds(json_object_get(j, "expires_in"));
    t->expiry = st_now() + (ttl > 0 ? ttl : ttl_default);
    return 0;
}

/* ---- Google ------------------------------------------------------------------------------ */

/* RS256 signature of data with the PEM key, base64url into out. */
static int jwt_sign(const char *pem, const char *data, struct st_sbuf *out) {
    BIO *bio = BIO_new_mem_buf(pem, -1);
    EVP_PKEY *key = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char sig[1024];
    size_t siglen = sizeof(sig);
    int r = -EINVAL;
    if (!bio || !md)
        TRY_GOTO(-ENOMEM, r, out);
    if (!key)
        goto out; /* not a PEM private key */
    if (EVP_DigestSignInit(md, NULL, EVP_sha256(), NULL, key) != 1 ||
        EVP_DigestSign(md, sig, &siglen, (const unsigned char *)data, strlen(data)) != 1)
        goto out;
    st_sb_base64(out, sig, siglen, true);
    r = 0;
out:
    EVP_MD_CTX_free(md);
    EVP_PKEY_free(key);
    BIO_free(bio);
    return r;
}

/* The service-account flow: a signed JWT exchanged at token_uri (RFC 7523). */
static int gcp_from_key(const char *path, const char *scope, struct st_token *t, char *why,
                        size_t whysz) {
    json_error_t jerr;
    json_t *key = json_load_file(path, 0, &jerr), *rep = NULL;
    struct st_sbuf jwt = {.max = 16384}, form = {.max = 32768};
    char *claims = NULL, *header = NULL;
    long status = 0;
    int r;
    if (!key) {
        snprintf(why, whysz, "GOOGLE_APPLICATION_CREDENTIALS '%s': %s", path, jerr.text);
        return -EINVAL;
    }
    const char *email = jstr(key, "client_email"), *pem = jstr(key, "private_key");
    const char *uri = jstr(key, "token_uri");
    if (!uri[0])
        uri = "https://oauth2.googleapis.com/token";
    if (!email[0] || !pem[0]) {
        snprintf(why, whysz, "'%s' is not a service-account key (no client_email or "
                 "private_key)", path);
        TRY_GOTO(-EINVAL, r, out);
    }
    if (strncmp(uri, "https://", 8) &&
        !(strncmp(uri, "http://", 7) == 0 && st_url_is_loopback(uri))) {
        snprintf(why, whysz, "token_uri '%s' must be https:// (http:// only on loopback)", uri);
        TRY_GOTO(-EINVAL, r, out);
    }
    time_t now = time(NULL);
    json_t *h = json_pack("{s:s, s:s, s:s}", "alg", "RS256", "typ", "JWT", "kid",
                          jstr(key, "private_key_id"));
    json_t *c = json_pack("{s:s, s:s, s:s, s:I, s:I}", "iss", email, "scope", scope, "aud",
                          uri, "iat", (json_int_t)now, "exp", (json_int_t)now + 3600);
    header = h ? json_dumps(h, JSON_COMPACT) : NULL;
    claims = c ? json_dumps(c, JSON_COMPACT) : NULL;
    json_decref(h);
    json_decref(c);
    if (!header || !claims)
        TRY_GOTO(-ENOMEM, r, out);
    st_sb_base64(&jwt, header, strlen(header), true);
    st_sb_str(&jwt, ".");
    st_sb_base64(&jwt, claims, strlen(claims), true);
    if (jwt.fail)
        TRY_GOTO(-ENOMEM, r, out);
    if ((r = jwt_sign(pem, jwt.p, &form)) < 0) {
        snprintf(why, whysz, "cannot sign with the private key of '%s'", path);
        goto out;
    }
    st_sb_str(&jwt, ".");
    st_sb_add(&jwt, form.p ? form.p : "", form.len);
    form.len = 0;
    st_sb_str(&form, "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer"
                     "&assertion=");
    st_sb_escape(&form, jwt.p ? jwt.p : "");
    if (jwt.fail || form.fail)
        TRY_GOTO(-ENOMEM, r, out);
    if ((r = token_call(uri, form.p, NULL, 30000, &status, &rep)) < 0) {
        snprintf(why, whysz, "token endpoint '%s': %s", uri, st_strerror(r));
        goto out;
    }
    r = take_token("the token endpoint", status, rep, 3600, t, why, whysz);
out:
    json_decref(rep);
    st_sb_done(&jwt);
    st_sb_done(&form);
    free(claims); /* json_dumps allocates with malloc */
    free(header);
    json_decref(key);
    return r;
}

/* The metadata server's token for the instance's service account. */
static int gcp_from_metadata(struct st_token *t, char *why, size_t whysz) {
    const char *host = getenv("GCE_METADATA_HOST");
    char url[512];
    json_t *rep = NULL;
    long status = 0;
    snprintf(url, sizeof(url), "http://%s/computeMetadata/v1/instance/service-accounts/default/"
             "token", host && *host ? host : "metadata.google.internal");
    int r = token_call(url, NULL, "Metadata-Flavor: Google", 1000, &status, &rep);
    if (r < 0) {
        snprintf(why, whysz, "no credentials: GOOGLE_APPLICATION_CREDENTIALS is not set and the "
                 "metadata server at '%s' did not answer (%s)", url, st_strerror(r));
        return -ENOKEY;
    }
    r = take_token("the metadata server", status, rep, 300, t, why, whysz);
    if (r == -EACCES && status == 404)
        r = -ENOKEY;
    json_decref(rep);
    return r;
}

/* See oauth.h. */
int st_gcp_token_get(const char *scope, struct st_token *t, char *why, size_t whysz) {
    const char *key = getenv("GOOGLE_APPLICATION_CREDENTIALS");
    memset(t, 0, sizeof(*t));
    why[0] = '\0';
    return key && *key ? gcp_from_key(key, scope, t, why, whysz)
                       : gcp_from_metadata(t, why, whysz);
}

/* ---- Azure ------------------------------------------------------------------------------- */

/* The client-credentials grant at the Microsoft identity platform (v2.0 endpoint). */
static int az_from_secret(const char *resource, const char *tenant, const char *client,
                          const char *secret, struct st_token *t, char *why, size_t whysz) {
    const char *auth = getenv("AZURE_AUTHORITY_HOST");
    struct st_sbuf url = {.max = 2048}, form = {.max = 8192};
    json_t *rep = NULL;
    long status = 0;
    int r;
    if (!auth || !*auth)
        auth = "https://login.microsoftonline.com";
    if (strncmp(auth, "https://", 8) &&
        !(strncmp(auth, "http://", 7) == 0 && st_url_is_loopback(auth))) {
        snprintf(why, whysz, "AZURE_AUTHORITY_HOST '%s' must be https:// (http:// only on "
                 "loopback)", auth);
        return -EINVAL;
    }
    size_t al = strlen(auth);
    while (al > 0 && auth[al - 1] == '/')
        al--;
    st_sb_add(&url, auth, al);
    st_sb_str(&url, "/");
    st_sb_escape(&url, tenant);
    st_sb_str(&url, "/oauth2/v2.0/token");
    st_sb_str(&form, "grant_type=client_credentials&client_id=");
    st_sb_escape(&form, client);
    st_sb_str(&form, "&client_secret=");
    st_sb_escape(&form, secret);
    st_sb_str(&form, "&scope=");
    st_sb_escape(&form, resource);
    st_sb_escape(&form, "/.default");
    if (url.fail || form.fail)
        TRY_GOTO(-ENOMEM, r, out);
    if ((r = token_call(url.p, form.p, NULL, 30000, &status, &rep)) < 0) {
        snprintf(why, whysz, "token endpoint '%s': %s", url.p, st_strerror(r));
        goto out;
    }
    r = take_token("the token endpoint", status, rep, 3600, t, why, whysz);
out:
    json_decref(rep);
    st_sb_done(&url);
    st_sb_done(&form);
    return r;
}

/* A managed identity's token from the instance metadata service. */
static int az_from_imds(const char *resource, struct st_token *t, char *why, size_t whysz) {
    const char *host = getenv("AZURE_POD_IDENTITY_AUTHORITY_HOST");
    struct st_sbuf url = {.max = 2048};
    json_t *rep = NULL;
    long status = 0;
    int r;
    if (!host || !*host)
        host = "http://169.254.169.254";
    size_t hl = strlen(host);
    while (hl > 0 && host[hl - 1] == '/')
        hl--;
    st_sb_add(&url, host, hl);
    st_sb_str(&url, "/metadata/identity/oauth2/token?api-version=2018-02-01&resource=");
    st_sb_escape(&url, resource);
    st_sb_escape(&url, "/");
    if (url.fail)
        return -ENOMEM;
    r = token_call(url.p, NULL, "Metadata: true", 1000, &status, &rep);
    if (r < 0) {
        snprintf(why, whysz, "no credentials: AZURE_TENANT_ID, AZURE_CLIENT_ID and "
                 "AZURE_CLIENT_SECRET are not all set and IMDS at '%.*s' did not answer (%s)",
                 (int)hl, host, st_strerror(r));
        r = -ENOKEY;
        goto out;
    }
    r = take_token("IMDS", status, rep, 300, t, why, whysz);
    if (r == -EACCES && (status == 400 || status == 404))
        r = -ENOKEY;
out:
    json_decref(rep);
    st_sb_done(&url);
    return r;
}

/* See oauth.h. */
int st_azure_token_get(const char *resource, struct st_token *t, char *why, size_t whysz) {
    const char *tn = getenv("AZURE_TENANT_ID"), *c = getenv("AZURE_CLIENT_ID"),
               *k = getenv("AZURE_CLIENT_SECRET");
    memset(t, 0, sizeof(*t));
    why[0] = '\0';
    if (tn && *tn && c && *c && k && *k)
        return az_from_secret(resource, tn, c, k, t, why, whysz);
    return az_from_imds(resource, t, why, whysz);
}
