/* validate.c: checks on decoded control-plane messages before they may touch job state.
 *
 * One idea: protobuf-c only proves the bytes were well-formed protobuf; whether the values
 * make sense (a UUID where a worker id goes, bounded printable strings, finite numbers,
 * bounded repeated fields) is decided here, and a failure becomes INVALID_ARGUMENT with no
 * state change. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord-internal.h"

static int fail(char *why, size_t whysz, const char *fmt, ...) ST_PRINTF(3, 4);
static int fail(char *why, size_t whysz, const char *fmt, ...) {
    if (why && whysz) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, whysz, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

/* At most max bytes, none a control character; printable ASCII only unless utf8 (a path,
 * whose bytes above 0x7f pass). */
static bool text_ok(const char *s, size_t max, bool utf8) {
    if (!s)
        return true;
    size_t n = strlen(s);
    if (n > max)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || (c > 0x7f && !utf8))
            return false;
    }
    return true;
}

static bool str_ok(const char *s, size_t max) {
    return text_ok(s, max, false);
}

/* A notice's figures: times finite, a dir that fits struct st_notice_figures. (A Report
 * refused is sent again as it was: refuse only what the coordinator cannot hold.) */
static bool figures_ok(const Spottrain__V1__NoticeFigures *f) {
    const double t[] = {f->seconds, f->step_seconds, f->blocked, f->stall, f->wait, f->connect,
                        f->reshape, f->transfer, f->commit, f->deferred, f->waited};
    for (size_t i = 0; i < ST_ARRAY_SIZE(t); i++)
        if (!isfinite(t[i]))
            return false;
    return text_ok(f->dir, ST_NOTICE_DIR_MAX - 1, true);
}

int coord__parse_hostport(const char *s, char *ret_host, size_t hostsz, int *ret_port) {
    if (!s || !*s)
        return -EINVAL;
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s)
        return -EINVAL;
    const char *host = s;
    size_t hlen = (size_t)(colon - s);
    if (host[0] == '[') { /* [v6]:port */
        if (hlen < 3 || host[hlen - 1] != ']')
            return -EINVAL;
        host++;
        hlen -= 2;
    }
    if (hlen == 0 || hlen >= hostsz)
        return -EINVAL;
    char *end = NULL;
    long port = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || port < 0 || port > 65535)
        return -EINVAL;
    if (!str_ok(s, COORD_ADDR_MAX - 1))
        return -EINVAL;
    if (ret_host) {
        memcpy(ret_host, host, hlen);
        ret_host[hlen] = '\0';
    }
    if (ret_port)
        *ret_port = (int)port;
    return 0;
}

int coord__validate_join(const Spottrain__V1__JoinRequest *m, char *why, size_t whysz) {
    if (!m)
        return fail(why, whysz, "%s", "empty request");
    if (m->protocol != ST_PROTOCOL) /* first: another protocol's fields may mean other things */
        return fail(why, whysz, "the worker speaks control protocol %u, this coordinator %u: "
                    "run the same spottrain release on both", m->protocol, ST_PROTOCOL);
    if (!st_uuid_valid(m->worker_id))
        return fail(why, whysz, "%s is not a UUID", "worker_id");
    if (!str_ok(m->instance_id, 63))
        return fail(why, whysz, "%s is too long or not printable", "instance_id");
    if (!str_ok(m->zone, 31))
        return fail(why, whysz, "%s is too long or not printable", "zone");
    if (!str_ok(m->instance_type, 63))
        return fail(why, whysz, "%s is too long or not printable", "instance_type");
    if (m->gpus > 1024)
        return fail(why, whysz, "%s is out of range (0..1024)", "gpus");
    if (m->data_addr && m->data_addr[0] &&
        coord__parse_hostport(m->data_addr, NULL, COORD_ADDR_MAX, NULL) < 0)
        return fail(why, whysz, "%s is not HOST:PORT", "data_addr");
    return 0;
}

int coord__validate_watch(const Spottrain__V1__WatchRequest *m, char *why, size_t whysz) {
    if (!m)
        return fail(why, whysz, "%s", "empty request");
    if (!st_uuid_valid(m->worker_id))
        return fail(why, whysz, "%s is not a UUID", "worker_id");
    return 0;
}

int coord__validate_report(const Spottrain__V1__ReportRequest *m, char *why, size_t whysz) {
    if (!m)
        return fail(why, whysz, "%s", "empty request");
    if (!st_uuid_valid(m->worker_id))
        return fail(why, whysz, "%s is not a UUID", "worker_id");
    if (!isfinite(m->loss))
        return fail(why, whysz, "%s is not finite", "loss");
    if (!isfinite(m->step_seconds) || m->step_seconds < 0)
        return fail(why, whysz, "%s is negative or not finite", "step_seconds");
    if (!isfinite(m->stall_seconds) || m->stall_seconds < 0)
        return fail(why, whysz, "%s is negative or not finite", "stall_seconds");
    if (m->step > ((uint64_t)1 << 53) || m->samples > ((uint64_t)1 << 53))
        return fail(why, whysz, "%s is out of range", "step or samples");
    if (!str_ok(m->state, 31))
        return fail(why, whysz, "%s is too long or not printable", "state");
    if (m->n_notices > COORD_MAX_NOTICES)
        return fail(why, whysz, "too many %s (at most 64)", "notices");
    for (size_t i = 0; i < m->n_notices; i++) {
        const Spottrain__V1__Notice *n = m->notices[i];
        if (!n || !n->kind || !n->kind[0] || !str_ok(n->kind, 31) || !str_ok(n->detail, 255) ||
            !isfinite(n->at))
            return fail(why, whysz, "%s has a bad kind, detail or time", "notices[]");
        if (n->figures && !figures_ok(n->figures))
            return fail(why, whysz, "%s has a figure that is not finite, or a bad dir",
                        "notices[].figures");
    }
    if (m->n_acks > COORD_MAX_ACKS)
        return fail(why, whysz, "too many %s (at most 1024)", "acks");
    for (size_t i = 0; i < m->n_acks; i++) {
        const Spottrain__V1__CommandAck *a = m->acks[i];
        if (!a || a->id == 0 || !str_ok(a->error, 127))
            return fail(why, whysz, "%s has id 0 or a bad error text", "acks[]");
    }
    return 0;
}

int coord_token_read(const char *path, char *buf, size_t size, char *why, size_t whysz) {
    char *data = NULL;
    size_t len = 0;
    if (!path || !buf || size == 0)
        return -EINVAL;
    int r = st_read_file(path, 4096, &data, &len);
    if (r < 0) {
        if (why && whysz)
            snprintf(why, whysz, "cannot read '%s': %s", path, st_strerror(r));
        return r;
    }
    while (len > 0 && (data[len - 1] == '\n' || data[len - 1] == '\r' || data[len - 1] == ' ' ||
                       data[len - 1] == '\t'))
        data[--len] = '\0';
    r = 0;
    if (len == 0 || len > 255 || len >= size) {
        r = fail(why, whysz, "token in '%s' is empty or longer than 255 bytes", path);
    } else {
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)data[i] <= 0x20 || (unsigned char)data[i] > 0x7e)
                r = fail(why, whysz, "token in '%s' has a space or a non-printable byte", path);
    }
    if (r == 0)
        memcpy(buf, data, len + 1);
    st_free(data);
    return r;
}
