/* timefmt.c: the two time formats the metadata services speak — RFC 3339 UTC ("Z") on AWS,
 * RFC 1123 ("GMT") in Azure scheduled events — to and from epoch seconds.
 *
 * Parsing is strict about the shape (digits where digits belong, the zone suffix present)
 * because a notice whose time we misread is worse than one we reject. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cloud-internal.h"

int cloud_format_rfc3339(double t, char *buf, size_t size) {
    if (!buf || !isfinite(t) || t < 0 || t > 253402300799.0 || size < 21)
        return -EINVAL;
    time_t tt = (time_t)floor(t);
    struct tm tm;
    if (!gmtime_r(&tt, &tm))
        return -EINVAL;
    if (strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        return -EINVAL;
    return 0;
}

/* Reads exactly n digits at *s into *ret and advances. */
static int digits(const char **s, int n, int *ret) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)(*s)[i]))
            return -EINVAL;
        v = v * 10 + ((*s)[i] - '0');
    }
    *s += n;
    *ret = v;
    return 0;
}

static int expect(const char **s, char c) {
    if (**s != c)
        return -EINVAL;
    (*s)++;
    return 0;
}

/* Checks ranges and converts a broken-down UTC time. */
static int to_epoch(int y, int mo, int d, int h, int mi, int se, double frac, double *ret_t) {
    if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || se > 60)
        return -EINVAL;
    struct tm tm = {.tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h,
                    .tm_min = mi, .tm_sec = se};
    time_t t = timegm(&tm);
    if (t == (time_t)-1)
        return -EINVAL;
    *ret_t = (double)t + frac;
    return 0;
}

int cloud_parse_rfc3339(const char *s, double *ret_t) {
    if (!s || !ret_t)
        return -EINVAL;
    int y, mo, d, h, mi, se;
    if (digits(&s, 4, &y) < 0 || expect(&s, '-') < 0 || digits(&s, 2, &mo) < 0 ||
        expect(&s, '-') < 0 || digits(&s, 2, &d) < 0 || (*s != 'T' && *s != 't') ||
        (s++, digits(&s, 2, &h)) < 0 || expect(&s, ':') < 0 || digits(&s, 2, &mi) < 0 ||
        expect(&s, ':') < 0 || digits(&s, 2, &se) < 0)
        return -EINVAL;
    double frac = 0, scale = 0.1;
    if (*s == '.') {
        s++;
        if (!isdigit((unsigned char)*s))
            return -EINVAL;
        while (isdigit((unsigned char)*s)) {
            frac += (*s - '0') * scale;
            scale /= 10;
            s++;
        }
    }
    if ((*s != 'Z' && *s != 'z') || s[1] != '\0')
        return -EINVAL;
    return to_epoch(y, mo, d, h, mi, se, frac, ret_t);
}

int cloud_parse_rfc1123(const char *s, double *ret_t) {
    static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                         "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    static const char *const days[] = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
    if (!s || !ret_t || strlen(s) != 29)
        return -EINVAL;
    bool day_ok = false;
    for (size_t i = 0; i < ST_ARRAY_SIZE(days); i++)
        if (strncmp(s, days[i], 3) == 0)
            day_ok = true;
    if (!day_ok || strncmp(s + 3, ", ", 2) != 0)
        return -EINVAL;
    const char *p = s + 5;
    int d, y, h, mi, se, mo = 0;
    if (digits(&p, 2, &d) < 0 || expect(&p, ' ') < 0)
        return -EINVAL;
    for (size_t i = 0; i < ST_ARRAY_SIZE(months); i++)
        if (strncmp(p, months[i], 3) == 0)
            mo = (int)i + 1;
    if (mo == 0)
        return -EINVAL;
    p += 3;
    if (expect(&p, ' ') < 0 || digits(&p, 4, &y) < 0 || expect(&p, ' ') < 0 ||
        digits(&p, 2, &h) < 0 || expect(&p, ':') < 0 || digits(&p, 2, &mi) < 0 ||
        expect(&p, ':') < 0 || digits(&p, 2, &se) < 0 || strcmp(p, " GMT") != 0)
        return -EINVAL;
    return to_epoch(y, mo, d, h, mi, se, 0, ret_t);
}
