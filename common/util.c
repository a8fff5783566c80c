/* util.c: error text, counted allocation, clocks, duration/size parsing, ids and files.
 *
 * The allocator wrappers exist for one reason: a test can make the Nth allocation fail and
 * check that every error path frees what it took (curl's torture mode). */
#include <ctype.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uuid/uuid.h>

#include "common.h"

const char *st_strerror(int r) {
    if (r < 0)
        r = -r;
    /* strerror() is not thread-safe in general, but glibc returns static strings for known
     * codes, which is all we pass it. */
    return strerror(r);
}

static long alloc_fail_at; /* 0 = never; else fail when alloc_count reaches it */
static long alloc_count;

void st_alloc_fail_after(long n) {
    alloc_count = 0;
    alloc_fail_at = n;
}

static bool alloc_should_fail(void) {
    if (alloc_fail_at <= 0)
        return false;
    return ++alloc_count >= alloc_fail_at;
}

void *st_malloc(size_t n) {
    if (alloc_should_fail())
        return NULL;
    return malloc(n ? n : 1);
}

void *st_calloc(size_t n, size_t size) {
    if (alloc_should_fail())
        return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

void *st_realloc(void *p, size_t n) {
    if (alloc_should_fail())
        return NULL;
    return realloc(p, n ? n : 1);
}

int st_grow_(void **arr, size_t n, size_t *cap, size_t elem, size_t first) {
    if (n < *cap)
        return 0;
    size_t ncap = *cap ? 2 * *cap : first;
    if (ncap <= n || ncap > SIZE_MAX / elem)
        return -ENOMEM;
    void *p = st_realloc(*arr, ncap * elem);
    if (!p)
        return -ENOMEM;
    *arr = p;
    *cap = ncap;
    return 0;
}

char *st_strdup(const char *s) {
    return s ? st_strndup(s, strlen(s)) : NULL;
}

char *st_strndup(const char *s, size_t n) {
    if (!s)
        return NULL;
    size_t len = strnlen(s, n);
    char *d = st_malloc(len + 1);
    if (!d)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

void st_free(void *p) {
    free(p);
}

double st_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double st_wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Splits "12.5GiB" into a finite non-negative number and a unit suffix. */
static int parse_number_unit(const char *s, double *ret_v, const char **ret_unit) {
    if (!s)
        return -EINVAL;
    while (isspace((unsigned char)*s))
        s++;
    if (!*s || *s == '-' || *s == '+')
        return -EINVAL;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0)
        return -EINVAL;
    if (strchr("xXnNiI", s[0]) || (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')))
        return -EINVAL; /* hex floats, nan, inf */
    *ret_v = v;
    *ret_unit = end;
    return 0;
}

int st_parse_duration(const char *s, double *ret_seconds) {
    double v;
    const char *u;
    if (parse_number_unit(s, &v, &u) < 0)
        return -EINVAL;
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1}, {"ms", 1e-3}, {"s", 1}, {"m", 60}, {"min", 60}, {"h", 3600}, {"d", 86400}};
    for (size_t i = 0; i < ST_ARRAY_SIZE(units); i++)
        if (strcmp(u, units[i].unit) == 0) {
            *ret_seconds = v * units[i].mult;
            return 0;
        }
    return -EINVAL;
}

int st_parse_size(const char *s, uint64_t *ret_bytes) {
    double v;
    const char *u;
    if (parse_number_unit(s, &v, &u) < 0)
        return -EINVAL;
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1},           {"B", 1},           {"KiB", 1024.0},     {"MiB", 1048576.0},
                 {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},
                 {"GB", 1e9},       {"TB", 1e12}};
    for (size_t i = 0; i < ST_ARRAY_SIZE(units); i++)
        if (strcmp(u, units[i].unit) == 0) {
            double b = v * units[i].mult;
            if (b >= 18446744073709551615.0 || b != floor(b))
                return -EINVAL;
            *ret_bytes = (uint64_t)b;
            return 0;
        }
    return -EINVAL;
}

void st_uuid_new(char buf[ST_UUID_STR_LEN]) {
    uuid_t u;
    uuid_generate_random(u);
    uuid_unparse_lower(u, buf);
}

bool st_uuid_valid(const char *s) {
    uuid_t u;
    return s && strlen(s) == 36 && uuid_parse(s, u) == 0;
}

int st_read_file(const char *path, size_t max, char **ret_data, size_t *ret_len) {
    int r = 0;
    char *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    size_t cap = 4096, len = 0;
    buf = st_malloc(cap);
    if (!buf) {
        r = -ENOMEM;
        goto out;
    }
    for (;;) {
        if (len + 1 >= cap) {
            if (cap > max + 1) {
                r = -EFBIG;
                goto out;
            }
            size_t ncap = cap * 2;
            char *nb = st_realloc(buf, ncap);
            if (!nb) {
                r = -ENOMEM;
                goto out;
            }
            buf = nb;
            cap = ncap;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (len > max) {
            r = -EFBIG;
            goto out;
        }
        if (n == 0) {
            if (ferror(f))
                r = -EIO;
            break;
        }
    }
    if (r == 0) {
        buf[len] = '\0';
        *ret_data = buf;
        if (ret_len)
            *ret_len = len;
        buf = NULL;
    }
out:
    st_free(buf);
    fclose(f);
    return r;
}

int st_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp))
        return -ENAMETOOLONG;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    int r = 0;
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            r = -errno;
            break;
        }
        p += w;
        len -= (size_t)w;
    }
    if (r == 0 && fsync(fd) < 0)
        r = -errno;
    if (close(fd) < 0 && r == 0)
        r = -errno;
    if (r == 0 && rename(tmp, path) < 0)
        r = -errno;
    if (r < 0)
        unlink(tmp);
    return r;
}

int st_mkdir_p(const char *path, unsigned mode) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
        return -ENAMETOOLONG;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, mode) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(buf, mode) == 0)
        return 0;
    if (errno != EEXIST)
        return -errno;
    /* There already: as a directory (or a link to one), not as a file. */
    struct stat sb;
    if (stat(buf, &sb) < 0)
        return -errno;
    return S_ISDIR(sb.st_mode) ? 0 : -ENOTDIR;
}

int st_error_set(struct st_error *e, const char *file, int line, int column, const char *field,
                 const char *fmt, ...) {
    if (!e)
        return -EINVAL;
    snprintf(e->file, sizeof(e->file), "%s", file ? file : "");
    e->line = line;
    e->column = column;
    snprintf(e->field, sizeof(e->field), "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return -EINVAL;
}

void st_error_format(const struct st_error *e, char *buf, size_t size) {
    char pos[300];
    if (e->line > 0)
        snprintf(pos, sizeof(pos), "%s:%d:%d", e->file, e->line, e->column);
    else
        snprintf(pos, sizeof(pos), "%s", e->file);
    if (e->field[0])
        snprintf(buf, size, "%s: %s: %s", pos, e->field, e->message);
    else
        snprintf(buf, size, "%s: %s", pos, e->message);
}

/* See common.h. */
void st_shard(uint64_t n, int64_t dp, int64_t r, uint64_t *ret_lo, uint64_t *ret_hi) {
    if (dp < 1 || r < 0 || r >= dp) {
        *ret_lo = *ret_hi = n;
        return;
    }
    /* floor(r n / dp) = r (n / dp) + floor(r (n % dp) / dp): no overflow of r n */
    uint64_t q = n / (uint64_t)dp, rem = n % (uint64_t)dp, ur = (uint64_t)r;
    *ret_lo = ur * q + (ur * rem) / (uint64_t)dp;
    *ret_hi = (ur + 1) * q + ((ur + 1) * rem) / (uint64_t)dp;
}

/* See common.h. */
const char *st_state_kind_name(enum st_state_kind k) {
    static const char *const names[ST_STATE_NKINDS] = {"param", "adam_m", "adam_v"};
    return (unsigned)k < ST_STATE_NKINDS ? names[k] : "?";
}

/* See common.h. */
int st_peer_ring(int n, const char *const *zones, int *next) {
    if (n < 1 || n > 4096 || !next)
        return -EINVAL;
    int *grp = st_calloc((size_t)n, sizeof(int)), *size = st_calloc((size_t)n, sizeof(int));
    int *rank = st_calloc((size_t)n, sizeof(int)), *order = st_calloc((size_t)n, sizeof(int));
    int *cyc = st_calloc((size_t)n, sizeof(int));
    int ng = 0, same = -ENOMEM;
    if (!grp || !size || !rank || !order || !cyc)
        goto out;
    /* Zone groups in order of first appearance. */
    for (int p = 0; p < n; p++) {
        const char *z = zones && zones[p] ? zones[p] : "";
        grp[p] = -1;
        for (int q = 0; q < p && grp[p] < 0; q++) {
            const char *zq = zones && zones[q] ? zones[q] : "";
            if (!strcmp(z, zq))
                grp[p] = grp[q];
        }
        if (grp[p] < 0)
            grp[p] = ng++;
        size[grp[p]]++;
    }
    if (ng == 1) {
        for (int p = 0; p < n; p++)
            cyc[p] = p;
    } else {
        /* Groups by size, largest first (a stable selection: ties keep their order). */
        for (int g = 0; g < ng; g++)
            rank[g] = g;
        for (int i = 1; i < ng; i++)
            for (int j = i; j > 0 && size[rank[j]] > size[rank[j - 1]]; j--) {
                int t = rank[j];
                rank[j] = rank[j - 1];
                rank[j - 1] = t;
            }
        int k = 0;
        for (int i = 0; i < ng; i++)
            for (int p = 0; p < n; p++)
                if (grp[p] == rank[i])
                    order[k++] = p;
        /* Even slots first, then odd: order[i] and order[i + ceil(n/2)] end up adjacent. */
        int slot = 0;
        for (int i = 0; i < n; i++) {
            cyc[slot] = order[i];
            slot += 2;
            if (slot >= n)
                slot = 1;
        }
    }
    same = 0;
    for (int i = 0; i < n; i++) {
        next[cyc[i]] = cyc[(i + 1) % n];
        same += n > 1 && grp[cyc[i]] == grp[cyc[(i + 1) % n]];
    }
out:
    st_free(grp);
    st_free(size);
    st_free(rank);
    st_free(order);
    st_free(cyc);
    return same;
}
