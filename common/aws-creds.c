/* aws-creds.c: AWS credentials, region and endpoint lookup (see aws-creds.h).
 *
 * The one idea: do exactly what the AWS CLI does, in the same order, so that a user's working
 * `aws` setup works here unchanged. The shared credentials file is INI: [profile] then
 * key = value lines. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aws-creds.h"
#include "common.h" /* st_read_file, st_free, st_strerror */

/* See aws-creds.h. */
void st_aws_creds_wipe(struct st_aws_creds *c) {
    volatile unsigned char *q = (volatile unsigned char *)c;
    for (size_t n = sizeof(*c); n--;)
        *q++ = 0;
}

static void trim(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = '\0';
    size_t k = strspn(s, " \t");
    memmove(s, s + k, strlen(s + k) + 1);
}

/* Reads one profile of a shared credentials file. -ESRCH: no such profile; -ENOKEY: the
 * profile lacks a key id or secret. */
static int from_file(const char *path, const char *profile, struct st_aws_creds *c) {
    char *data = NULL;
    size_t len = 0;
    int r = st_read_file(path, 1u << 20, &data, &len);
    if (r < 0)
        return r;
    bool in = false, found = false;
    for (char *line = data, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        trim(line);
        if (line[0] == '#' || line[0] == ';' || !line[0])
            continue;
        if (line[0] == '[') {
            char *end = strchr(line, ']');
            if (end)
                *end = '\0';
            char *name = line + 1;
            trim(name);
            in = strcmp(name, profile) == 0;
            found |= in;
            continue;
        }
        char *eq = strchr(line, '=');
        if (!in || !eq)
            continue;
        *eq = '\0';
        char *k = line, *v = eq + 1;
        trim(k);
        trim(v);
        if (!strcmp(k, "aws_access_key_id"))
            snprintf(c->key_id, sizeof(c->key_id), "%s", v);
        else if (!strcmp(k, "aws_secret_access_key"))
            snprintf(c->secret, sizeof(c->secret), "%s", v);
        else if (!strcmp(k, "aws_session_token"))
            snprintf(c->session, sizeof(c->session), "%s", v);
    }
    volatile char *q = data;
    for (size_t n = len; n--;)
        *q++ = 0;
    st_free(data);
    if (!found)
        return -ESRCH;
    return c->key_id[0] && c->secret[0] ? 0 : -ENOKEY;
}

/* See aws-creds.h. */
int st_aws_creds_find(struct st_aws_creds *c, char *why, size_t whysz) {
    memset(c, 0, sizeof(*c));
    const char *k = getenv("AWS_ACCESS_KEY_ID"), *s = getenv("AWS_SECRET_ACCESS_KEY");
    if (k && *k && s && *s) {
        snprintf(c->key_id, sizeof(c->key_id), "%s", k);
        snprintf(c->secret, sizeof(c->secret), "%s", s);
        const char *t = getenv("AWS_SESSION_TOKEN");
        if (t && *t)
            snprintf(c->session, sizeof(c->session), "%s", t);
        return 0;
    }
    const char *profile = getenv("AWS_PROFILE");
    if (!profile || !*profile)
        profile = "default";
    char path[4096];
    const char *f = getenv("AWS_SHARED_CREDENTIALS_FILE"), *home = getenv("HOME");
    if (f && *f)
        snprintf(path, sizeof(path), "%s", f);
    else
        snprintf(path, sizeof(path), "%s/.aws/credentials", home && *home ? home : "");
    int r = from_file(path, profile, c);
    if (r == 0)
        return 0;
    if (why && whysz) {
        char what[64];
        if (r == -ESRCH || r == -ENOKEY)
            snprintf(what, sizeof(what), "%s", r == -ESRCH ? "no such profile there"
                                                           : "the profile lacks a key id or secret");
        else
            snprintf(what, sizeof(what), "cannot read it: %s", st_strerror(r));
        snprintf(why, whysz, "no AWS credentials: set AWS_ACCESS_KEY_ID and "
                 "AWS_SECRET_ACCESS_KEY, or a profile '%s' in '%s' (%s)", profile, path, what);
    }
    st_aws_creds_wipe(c);
    return -ENOKEY;
}

/* See aws-creds.h. */
void st_aws_region_find(char *out, size_t sz, const char *zone) {
    const char *r = getenv("AWS_REGION");
    if (!r || !*r)
        r = getenv("AWS_DEFAULT_REGION");
    if (r && *r) {
        snprintf(out, sz, "%s", r);
        return;
    }
    size_t n = zone ? strlen(zone) : 0;
    if (n > 1 && zone[n - 1] >= 'a' && zone[n - 1] <= 'z' && zone[n - 2] >= '0' &&
        zone[n - 2] <= '9') {
        snprintf(out, sz, "%.*s", (int)(n - 1), zone);
        return;
    }
    snprintf(out, sz, "us-east-1");
}

/* See aws-creds.h. */
int st_aws_endpoint_find(const char *service, char *out, size_t sz) {
    char name[64];
    snprintf(name, sizeof(name), "AWS_ENDPOINT_URL_%s", service);
    const char *e = getenv(name);
    if (!e || !*e)
        e = getenv("AWS_ENDPOINT_URL");
    out[0] = '\0';
    if (!e || !*e)
        return 0;
    int w = snprintf(out, sz, "%s", e);
    if (w < 0 || (size_t)w >= sz || (strncmp(out, "http://", 7) && strncmp(out, "https://", 8)))
        return -EINVAL;
    size_t n = strlen(out);
    if (n > 8 && out[n - 1] == '/')
        out[n - 1] = '\0';
    return 1;
}
