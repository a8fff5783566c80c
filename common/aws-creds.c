/* aws-creds.c: AWS credentials, region and endpoint lookup (see aws-creds.h).
 *
 * The one idea: do exactly what the AWS CLI does, in the same order, so that a user's working
 * `aws` setup works here unchanged. The shared credentials file is INI: [profile] then
 * key = value lines. Last comes the instance role from IMDSv2 (token PUT, then
 * iam/security-credentials/ROLE), spoken over a few lines of plain HTTP/1.1 on a socket
 * because common/ links no HTTP library (DESIGN.md) and IMDS is plain HTTP by definition.
 * IMDS is asked only where it can exist: AWS_EC2_METADATA_SERVICE_ENDPOINT is set, or the
 * machine says it is EC2 (DMI vendor, Xen uuid); AWS_EC2_METADATA_DISABLED=true turns it off,
 * as in the AWS SDKs. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

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

#define IMDS_TIMEOUT_MS 2000     /* connect, and each read or write */
#define IMDS_REPLY_MAX (64u << 10)

/* True when this machine looks like EC2 (where the AWS SDKs would ask IMDS). */
static bool on_ec2(void) {
    static const char *const files[] = {"/sys/class/dmi/id/sys_vendor",
        "/sys/class/dmi/id/board_vendor", "/sys/hypervisor/uuid"};
    for (size_t i = 0; i < ST_ARRAY_SIZE(files); i++) {
        char buf[64] = "";
        FILE *f = fopen(files[i], "re");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        if (strstr(buf, "Amazon EC2") || !strncasecmp(buf, "ec2", 3))
            return true;
    }
    return false;
}

static int wait_fd(int fd, short ev) {
    struct pollfd p = {.fd = fd, .events = ev};
    int r;
    while ((r = poll(&p, 1, IMDS_TIMEOUT_MS)) < 0 && errno == EINTR)
        ;
    return r < 0 ? -errno : r == 0 ? -ETIMEDOUT : 0;
}

/* One HTTP/1.1 request to host:port with Connection: close. On 200 returns 0 with the body in
 * *ret (caller frees with st_free); another status is -ENOENT (404), -EACCES (401/403) or
 * -EPROTO. */
static int http_call(const char *host, const char *port, const char *method, const char *path,
                     const char *header, char **ret) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char *buf = NULL, req[8192];
    size_t len = 0;
    int fd = -1, r;

    if (getaddrinfo(host, port, &hints, &ai) != 0 || !ai)
        return -EHOSTUNREACH;
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        r = -errno;
        goto out;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        if (errno != EINPROGRESS) {
            r = -errno;
            goto out;
        }
        int e = 0;
        socklen_t el = sizeof(e);
        if ((r = wait_fd(fd, POLLOUT)) < 0)
            goto out;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0 || e) {
            r = e ? -e : -errno;
            goto out;
        }
    }
    int n = snprintf(req, sizeof(req), "%s %s HTTP/1.1\r\nHost: %s:%s\r\n%s%s"
                     "Content-Length: 0\r\nConnection: close\r\n\r\n", method, path, host,
                     port, header ? header : "", header ? "\r\n" : "");
    if (n < 0 || (size_t)n >= sizeof(req)) {
        r = -ENAMETOOLONG;
        goto out;
    }
    for (size_t off = 0; off < (size_t)n;) {
        ssize_t w = send(fd, req + off, (size_t)n - off, MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            if ((r = wait_fd(fd, POLLOUT)) < 0)
                goto out;
            continue;
        }
        if (w < 0) {
            r = -errno;
            goto out;
        }
        off += (size_t)w;
    }
    buf = st_malloc(IMDS_REPLY_MAX + 1);
    if (!buf) {
        r = -ENOMEM;
        goto out;
    }
    for (;;) {
        if (len == IMDS_REPLY_MAX) {
            r = -EFBIG;
            goto out;
        }
        ssize_t g = recv(fd, buf + len, IMDS_REPLY_MAX - len, 0);
        if (g < 0 && (errno == EAGAIN || errno == EINTR)) {
            if ((r = wait_fd(fd, POLLIN)) < 0)
                goto out;
            continue;
        }
        if (g < 0) {
            r = -errno;
            goto out;
        }
        if (g == 0)
            break;
        len += (size_t)g;
    }
    buf[len] = '\0';
    int status = 0;
    char *body = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1 || !body) {
        r = -EPROTO;
        goto out;
    }
    if (status != 200) {
        r = status == 404 ? -ENOENT : status == 401 || status == 403 ? -EACCES : -EPROTO;
        goto out;
    }
    body += 4;
    memmove(buf, body, strlen(body) + 1);
    *ret = buf;
    buf = NULL;
    r = 0;
out:
    if (buf) {
        memset(buf, 0, len);
        st_free(buf);
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return r;
}

/* The instance role's credentials from IMDSv2 at endpoint ("http://host[:port]"). Returns 0,
 * -ENOENT when the instance has no role, or another negative errno; why says what failed. */
static int from_imds(const char *endpoint, struct st_aws_creds *c, char *why, size_t whysz) {
    char host[256], port[16] = "80", hdr[256], path[512], *tok = NULL, *role = NULL,
         *doc = NULL;
    json_t *j = NULL;
    int r;
    const char *h = endpoint + (strncmp(endpoint, "http://", 7) ? 0 : 7);
    size_t hl = strcspn(h, ":/");
    if (strncmp(endpoint, "http://", 7) || hl == 0 || hl >= sizeof(host)) {
        snprintf(why, whysz, "bad IMDS endpoint '%s' (want http://HOST[:PORT])", endpoint);
        return -EINVAL;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    if (h[hl] == ':')
        snprintf(port, sizeof(port), "%.*s", (int)strcspn(h + hl + 1, "/"), h + hl + 1);
    r = http_call(host, port, "PUT", "/latest/api/token",
                  "X-aws-ec2-metadata-token-ttl-seconds: 21600", &tok);
    if (r < 0) {
        snprintf(why, whysz, "IMDSv2 at '%s' gave no token (%s)", endpoint, st_strerror(r));
        goto out;
    }
    tok[strcspn(tok, "\r\n")] = '\0';
    snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s", tok);
    r = http_call(host, port, "GET", "/latest/meta-data/iam/security-credentials/", hdr, &role);
    if (r < 0) {
        snprintf(why, whysz, "IMDSv2 at '%s': %s", endpoint,
                 r == -ENOENT ? "the instance has no role" : st_strerror(r));
        goto out;
    }
    role[strcspn(role, "\r\n")] = '\0';
    if (!role[0] || strchr(role, '/') || strlen(role) > 128) {
        snprintf(why, whysz, "IMDSv2 at '%s' named no usable role", endpoint);
        r = -EPROTO;
        goto out;
    }
    snprintf(path, sizeof(path), "/latest/meta-data/iam/security-credentials/%s", role);
    r = http_call(host, port, "GET", path, hdr, &doc);
    if (r < 0) {
        snprintf(why, whysz, "IMDSv2 at '%s': role '%s': %s", endpoint, role, st_strerror(r));
        goto out;
    }
    j = json_loads(doc, 0, NULL);
    const char *code = json_string_value(json_object_get(j, "Code"));
    const char *k = json_string_value(json_object_get(j, "AccessKeyId"));
    const char *s = json_string_value(json_object_get(j, "SecretAccessKey"));
    const char *t = json_string_value(json_object_get(j, "Token"));
    if (!code || strcmp(code, "Success") || !k || !*k || !s || !*s ||
        strlen(k) >= sizeof(c->key_id) || strlen(s) >= sizeof(c->secret) ||
        (t && strlen(t) >= sizeof(c->session))) {
        snprintf(why, whysz, "IMDSv2 at '%s': role '%s': the credentials document is not "
                 "usable (Code '%s')", endpoint, role, code ? code : "none");
        r = -EPROTO;
        goto out;
    }
    snprintf(c->key_id, sizeof(c->key_id), "%s", k);
    snprintf(c->secret, sizeof(c->secret), "%s", s);
    snprintf(c->session, sizeof(c->session), "%s", t ? t : "");
    r = 0;
out:
    json_decref(j);
    if (doc)
        memset(doc, 0, strlen(doc));
    st_free(doc);
    st_free(role);
    st_free(tok);
    return r;
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
    const char *ep = getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT"),
               *off = getenv("AWS_EC2_METADATA_DISABLED");
    char iwhy[512] = "";
    if (!(off && !strcasecmp(off, "true")) && ((ep && *ep) || on_ec2())) {
        if (from_imds(ep && *ep ? ep : "http://169.254.169.254", c, iwhy, sizeof(iwhy)) == 0)
            return 0;
        memset(c, 0, sizeof(*c));
    }
    if (why && whysz) {
        char what[64];
        if (r == -ESRCH || r == -ENOKEY)
            snprintf(what, sizeof(what), "%s", r == -ESRCH ? "no such profile there"
                                                           : "the profile lacks a key id or secret");
        else
            snprintf(what, sizeof(what), "cannot read it: %s", st_strerror(r));
        snprintf(why, whysz, "no AWS credentials: set AWS_ACCESS_KEY_ID and "
                 "AWS_SECRET_ACCESS_KEY, or a profile '%s' in '%s' (%s)%s%s", profile, path,
                 what, iwhy[0] ? "; " : "", iwhy);
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
