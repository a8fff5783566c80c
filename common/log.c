/* log.c: leveled, subsystem-filtered logging to stderr, as human lines or JSON lines.
 *
 * The level test happens in the st_log() macro, so arguments of filtered lines are never
 * evaluated. Each line carries a UTC timestamp, the role and id set by main(), the level and
 * the subsystem; errors add file:line. One write() per line keeps lines whole across processes
 * sharing a terminal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

int st_log_level_max = ST_LOG_NOTICE;

static bool log_json;
static char log_role[32] = "spottrain";
static char log_id[64];
static char log_subsys[256]; /* comma-separated allow list, "" = all */

static const char *const level_names[] = {"err", "warn", "notice", "info", "debug"};

void st_log_set_level(int level) {
    if (level < ST_LOG_ERR)
        level = ST_LOG_ERR;
    if (level > ST_LOG_DEBUG)
        level = ST_LOG_DEBUG;
    st_log_level_max = level;
}

void st_log_set_json(bool json) {
    log_json = json;
}

void st_log_set_role(const char *role, const char *id) {
    snprintf(log_role, sizeof(log_role), "%s", role ? role : "");
    snprintf(log_id, sizeof(log_id), "%s", id ? id : "");
}

void st_log_init_from_env(void) {
    const char *v = getenv("SPOTTRAIN_DEBUG");
    if (v && *v) {
        for (size_t i = 0; i < ST_ARRAY_SIZE(level_names); i++)
            if (strcasecmp(v, level_names[i]) == 0)
                st_log_set_level((int)i);
        if (strcasecmp(v, "error") == 0)
            st_log_set_level(ST_LOG_ERR);
        if (strcasecmp(v, "warning") == 0)
            st_log_set_level(ST_LOG_WARN);
    }
    v = getenv("SPOTTRAIN_DEBUG_SUBSYS");
    snprintf(log_subsys, sizeof(log_subsys), "%s", v ? v : "");
    v = getenv("SPOTTRAIN_LOG_FORMAT");
    if (v && strcasecmp(v, "json") == 0)
        log_json = true;
}

bool st_log_subsys_enabled(const char *subsys) {
    if (!log_subsys[0] || !subsys)
        return true;
    size_t n = strlen(subsys);
    for (const char *p = log_subsys; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, subsys, n) == 0)
            return true;
        if (!e)
            break;
        p = e + 1;
    }
    return false;
}

/* Appends s to buf as a JSON string body (no quotes), escaping what JSON requires. */
static size_t json_escape(char *buf, size_t size, size_t off, const char *s) {
    for (; *s && off + 7 < size; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            buf[off++] = '\\';
            buf[off++] = (char)c;
        } else if (c < 0x20) {
            off += (size_t)snprintf(buf + off, size - off, "\\u%04x", c);
        } else {
            buf[off++] = (char)c;
        }
    }
    buf[off] = '\0';
    return off;
}

void st_log_internal(int level, const char *subsys, const char *file, int line, const char *fmt,
                     ...) {
    if (level > ST_LOG_ERR && !st_log_subsys_enabled(subsys))
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char tbuf[40];
    snprintf(tbuf, sizeof(tbuf), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    const char *lv = level >= 0 && level <= ST_LOG_DEBUG ? level_names[level] : "?";

    char out[4096];
    size_t off;
    if (log_json) {
        off = (size_t)snprintf(out, sizeof(out),
                               "{\"ts\":\"%s\",\"level\":\"%s\",\"role\":\"%s\",\"id\":\"%s\","
                               "\"pid\":%d,\"subsys\":\"%s\",",
                               tbuf, lv, log_role, log_id, (int)getpid(), subsys ? subsys : "");
        if (level == ST_LOG_ERR)
            off += (size_t)snprintf(out + off, sizeof(out) - off, "\"src\":\"%s:%d\",", file,
                                    line);
        off += (size_t)snprintf(out + off, sizeof(out) - off, "\"msg\":\"");
        off = json_escape(out, sizeof(out) - 3, off, msg);
        off += (size_t)snprintf(out + off, sizeof(out) - off, "\"}\n");
    } else {
        const char *base = strrchr(file, '/');
        base = base ? base + 1 : file;
        if (level == ST_LOG_ERR)
            off = (size_t)snprintf(out, sizeof(out), "%s %s%s%s %s %s: %s (%s:%d)\n", tbuf,
                                   log_role, log_id[0] ? "/" : "", log_id, lv,
                                   subsys ? subsys : "", msg, base, line);
        else
            off = (size_t)snprintf(out, sizeof(out), "%s %s%s%s %s %s: %s\n", tbuf, log_role,
                                   log_id[0] ? "/" : "", log_id, lv, subsys ? subsys : "", msg);
    }
    if (off >= sizeof(out)) {
        off = sizeof(out) - 1;
        out[off - 1] = '\n';
    }
    ssize_t w = write(STDERR_FILENO, out, off);
    (void)w;
}
