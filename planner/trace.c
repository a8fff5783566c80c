/* trace.c: spot-availability traces and Parcae decisions files, parsed from buffers.
 *
 * Every format is first turned into a flat list of events (time, add/remove, node or
 * anonymous count), then bucketed into one-minute intervals: an event at time t belongs to
 * interval floor(t / 60 s), adds before removes inside an interval, as Parcae's trace reader
 * counts them. Named nodes keep a small integer identity so the simulator can follow them. */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "planner.h"

struct ev {
    double t_ms;
    int add;     /* 1 add, 0 remove, -1 no-op row (replay) */
    int count;   /* instances (anonymous formats) */
    int node;    /* node id or -1 */
    int line;
    int ref[3][2];
    bool has_ref;
};

struct evlist {
    struct ev *v;
    int n, cap;
    char **names;
    int nnames, names_cap;
};

static int evlist_push(struct evlist *l, const struct ev *e) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 256;
        struct ev *v = st_realloc(l->v, (size_t)cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = *e;
    return 0;
}

static int name_id(struct evlist *l, const char *s, size_t len) {
    for (int i = 0; i < l->nnames; i++)
        if (strlen(l->names[i]) == len && memcmp(l->names[i], s, len) == 0)
            return i;
    if (l->nnames == l->names_cap) {
        int cap = l->names_cap ? l->names_cap * 2 : 64;
        char **v = st_realloc(l->names, (size_t)cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        l->names = v;
        l->names_cap = cap;
    }
    char *d = st_strndup(s, len);
    if (!d)
        return -ENOMEM;
    l->names[l->nnames] = d;
    return l->nnames++;
}

static void evlist_done(struct evlist *l) {
    for (int i = 0; i < l->nnames; i++)
        st_free(l->names[i]);
    st_free(l->names);
    st_free(l->v);
}

/* Splits a CSV line into at most 4 trimmed fields; returns the count. */
static int split_csv(char *line, char **f, int max) {
    int n = 0;
    char *p = line;
    while (n < max) {
        while (*p == ' ' || *p == '\t')
            p++;
        f[n++] = p;
        char *c = strchr(p, ',');
        char *end = c ? c : p + strlen(p);
        while (end > p && isspace((unsigned char)end[-1]))
            end--;
        if (!c) {
            *end = 0;
            break;
        }
        *end = 0;
        p = c + 1;
        if (n == max)
            return max + 1;
    }
    return n;
}

static bool parse_num(const char *s, double *ret) {
    char *end;
    if (!*s)
        return false;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno || !isfinite(v))
        return false;
    *ret = v;
    return true;
}

enum fmt { FMT_EVENTS, FMT_COUNTS, FMT_STEPS };

/* CSV formats: events, counts (ms) and steps (seconds). */
static int parse_csv(const char *name, const char *text, size_t len, struct evlist *l,
                     struct st_error *err) {
    int r = 0, lineno = 0, fmt = -1, forced = -1;
    double prev_t = -1, prev_n = 0;
    bool first_row = true;
    /* First pass decides counts (ms) vs steps (seconds) for two-column files. */
    struct row {
        double t, n;
        int line;
    } *rows = NULL;
    int nrows = 0, rows_cap = 0;
    const char *p = text, *end = text + len;
    char buf[1024];
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ll = nl ? (size_t)(nl - p) : (size_t)(end - p);
        lineno++;
        if (ll >= sizeof(buf)) {
            r = st_error_set(err, name, lineno, 0, "line", "line longer than %zu bytes",
                             sizeof(buf) - 1);
            goto out;
        }
        memcpy(buf, p, ll);
        buf[ll] = 0;
        p = nl ? nl + 1 : end;
        char *s = buf;
        while (*s == ' ' || *s == '\t' || *s == '\r')
            s++;
        if (!*s || *s == '#')
            continue;
        char *f[5];
        int nf = split_csv(s, f, 4);
        if (first_row && nf >= 1 && !isdigit((unsigned char)f[0][0]) && f[0][0] != '-' &&
            f[0][0] != '.') {
            /* Header line: names the time unit. */
            first_row = false;
            if (strcmp(f[0], "seconds") == 0 || strcmp(f[0], "t_s") == 0)
                forced = FMT_STEPS;
            else if (strcmp(f[0], "timestamp_ms") == 0 || strcmp(f[0], "t_ms") == 0)
                forced = nf == 3 ? FMT_EVENTS : FMT_COUNTS;
            else {
                r = st_error_set(err, name, lineno, 1, "header",
                                 "unknown header '%s' (want seconds,N or timestamp_ms,...)",
                                 f[0]);
                goto out;
            }
            continue;
        }
        first_row = false;
        if (nf != 2 && nf != 3) {
            r = st_error_set(err, name, lineno, 0, "columns",
                             "expected 'timestamp_ms,add|remove,node' or 'time,N', got %d "
                             "fields",
                             nf > 4 ? 5 : nf);
            goto out;
        }
        int this_fmt = nf == 3 ? FMT_EVENTS : FMT_COUNTS;
        if (fmt >= 0 && (fmt == FMT_EVENTS) != (this_fmt == FMT_EVENTS)) {
            r = st_error_set(err, name, lineno, 0, "columns", "mixed 2- and 3-column rows");
            goto out;
        }
        fmt = this_fmt;
        double t;
        if (!parse_num(f[0], &t) || t < 0) {
            r = st_error_set(err, name, lineno, 1, "timestamp", "bad time '%s'", f[0]);
            goto out;
        }
        if (t < prev_t) {
            r = st_error_set(err, name, lineno, 1, "timestamp",
                             "time %s goes backwards (previous %.17g)", f[0], prev_t);
            goto out;
        }
        prev_t = t;
        if (fmt == FMT_EVENTS) {
            struct ev e = {.t_ms = t, .count = 1, .line = lineno};
            if (strcmp(f[1], "add") == 0)
                e.add = 1;
            else if (strcmp(f[1], "remove") == 0)
                e.add = 0;
            else {
                r = st_error_set(err, name, lineno, 2, "event",
                                 "bad event '%s' (want add or remove)", f[1]);
                goto out;
            }
            if (!*f[2]) {
                r = st_error_set(err, name, lineno, 3, "node", "empty node name");
                goto out;
            }
            int id = name_id(l, f[2], strlen(f[2]));
            if (id < 0) {
                r = id;
                goto out;
            }
            e.node = id;
            if ((r = evlist_push(l, &e)) < 0)
                goto out;
        } else {
            double n;
            if (!parse_num(f[1], &n) || n < 0 || n != floor(n) || n > 1e6) {
                r = st_error_set(err, name, lineno, 2, "N", "bad instance count '%s'", f[1]);
                goto out;
            }
            if (nrows == rows_cap) {
                int cap = rows_cap ? rows_cap * 2 : 256;
                struct row *v = st_realloc(rows, (size_t)cap * sizeof(*v));
                if (!v) {
                    r = -ENOMEM;
                    goto out;
                }
                rows = v;
                rows_cap = cap;
            }
            rows[nrows++] = (struct row){t, n, lineno};
        }
    }
    if (fmt < 0) {
        r = st_error_set(err, name, lineno, 0, "trace", "no events in trace");
        goto out;
    }
    if (fmt == FMT_COUNTS) {
        /* Milliseconds or seconds? A header says; else counts files step by one instance per
         * row on whole-second millisecond stamps. */
        int kind = forced;
        if (kind < 0) {
            bool ms = true, unit = true;
            double tmax = 0;
            for (int i = 0; i < nrows; i++) {
                if (fmod(rows[i].t, 1000.0) != 0)
                    ms = false;
                tmax = ST_MAX(tmax, rows[i].t);
                double prev = i ? rows[i - 1].n : 0;
                if (fabs(rows[i].n - prev) > 1)
                    unit = false;
            }
            kind = (ms && unit && tmax >= 60000) ? FMT_COUNTS : FMT_STEPS;
        }
        double scale = kind == FMT_COUNTS ? 1.0 : 1000.0;
        for (int i = 0; i < nrows; i++) {
            double d = rows[i].n - prev_n;
            prev_n = rows[i].n;
            if (d == 0 && i > 0)
                continue;
            struct ev e = {.t_ms = rows[i].t * scale, .add = d >= 0, .count = (int)fabs(d),
                           .node = -1, .line = rows[i].line};
            if ((r = evlist_push(l, &e)) < 0)
                goto out;
        }
    }
out:
    st_free(rows);
    return r;
}

static int get_pair(json_t *a, int out[2]) {
    if (!json_is_array(a) || json_array_size(a) != 2 ||
        !json_is_integer(json_array_get(a, 0)) || !json_is_integer(json_array_get(a, 1)))
        return -EINVAL;
    json_int_t x = json_integer_value(json_array_get(a, 0));
    json_int_t y = json_integer_value(json_array_get(a, 1));
    if (x < 0 || y < 0 || x > 1000000 || y > 1000000)
        return -EINVAL;
    out[0] = (int)x;
    out[1] = (int)y;
    return 0;
}

/* Replay / per-model JSON lines. */
static int parse_jsonl(const char *name, const char *text, size_t len, struct evlist *l,
                       struct st_error *err) {
    int r = 0, lineno = 0;
    const char *p = text, *end = text + len;
    double prev_t = -1;
    static const char *const ref_keys[3] = {"throughput_opt_strategy", "liveput_truth_strategy",
                                            "liveput_predict_strategy"};
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ll = nl ? (size_t)(nl - p) : (size_t)(end - p);
        const char *s = p;
        p = nl ? nl + 1 : end;
        lineno++;
        size_t k = 0;
        while (k < ll && isspace((unsigned char)s[k]))
            k++;
        if (k == ll)
            continue;
        json_error_t je;
        json_t *row = json_loadb(s, ll, 0, &je);
        if (!row)
            return st_error_set(err, name, lineno, je.column, "json", "%s", je.text);
        json_t *jt = json_array_get(row, 0), *jk = json_array_get(row, 1);
        json_t *jo = json_array_get(row, 2);
        if (!json_is_array(row) || json_array_size(row) != 3 || !json_is_number(jt) ||
            !json_is_string(jk) || !json_is_object(jo)) {
            json_decref(row);
            return st_error_set(err, name, lineno, 1, "row",
                                "expected [timestamp_ms, \"add\"|\"remove\"|\"no-op\", {...}]");
        }
        double t = json_number_value(jt);
        const char *kind = json_string_value(jk);
        struct ev e = {.t_ms = t, .count = 0, .node = -1, .line = lineno};
        if (!isfinite(t) || t < 0 || t < prev_t) {
            json_decref(row);
            return st_error_set(err, name, lineno, 1, "timestamp",
                                "bad or decreasing timestamp");
        }
        prev_t = t;
        if (strcmp(kind, "add") == 0)
            e.add = 1;
        else if (strcmp(kind, "remove") == 0)
            e.add = 0;
        else if (strcmp(kind, "no-op") == 0)
            e.add = -1;
        else {
            r = st_error_set(err, name, lineno, 2, "event", "bad event '%s'", kind);
            json_decref(row);
            return r;
        }
        for (int i = 0; i < 3; i++) {
            json_t *a = json_object_get(jo, ref_keys[i]);
            if (a) {
                if (get_pair(a, e.ref[i]) < 0) {
                    json_decref(row);
                    return st_error_set(err, name, lineno, 0, ref_keys[i],
                                        "expected [dp, pp]");
                }
                e.has_ref = true;
            }
        }
        json_t *nodes = json_object_get(jo, "nodes");
        if (nodes && !json_is_array(nodes)) {
            json_decref(row);
            return st_error_set(err, name, lineno, 0, "nodes", "expected a list of names");
        }
        size_t nn = nodes ? json_array_size(nodes) : 0;
        if (e.add < 0 || nn == 0) {
            e.count = 0;
            if (e.add < 0 && nn > 0) {
                json_decref(row);
                return st_error_set(err, name, lineno, 0, "nodes", "no-op row names nodes");
            }
            if (e.add >= 0 && nn == 0 && !e.has_ref) {
                json_decref(row);
                return st_error_set(err, name, lineno, 0, "nodes", "event names no nodes");
            }
            r = evlist_push(l, &e);
        }
        for (size_t i = 0; i < nn && r >= 0; i++) {
            json_t *jn = json_array_get(nodes, i);
            if (!json_is_string(jn)) {
                json_decref(row);
                return st_error_set(err, name, lineno, 0, "nodes", "node names are strings");
            }
            int id = name_id(l, json_string_value(jn), strlen(json_string_value(jn)));
            if (id < 0) {
                r = id;
                break;
            }
            e.node = id;
            e.count = 1;
            r = evlist_push(l, &e);
            e.has_ref = false; /* refs once per row */
        }
        json_decref(row);
        if (r < 0)
            return r;
    }
    if (l->n == 0)
        return st_error_set(err, name, lineno, 0, "trace", "no events in trace");
    return 0;
}

struct plan_trace *plan_trace_free(struct plan_trace *t) {
    if (!t)
        return NULL;
    st_free(t->iv);
    st_free(t->node_ids);
    st_free(t);
    return NULL;
}

/* Buckets events into intervals and checks the count never goes negative and that named
 * nodes are live when removed. */
static int build(const char *name, struct evlist *l, struct plan_trace **ret,
                 struct st_error *err) {
    int r = 0;
    double tmax = l->v[l->n - 1].t_ms;
    if (tmax / 60000.0 > 10000000) /* ~19 years of minutes */
        return st_error_set(err, name, l->v[l->n - 1].line, 1, "timestamp", "trace too long");
    int niv = (int)floor(tmax / 60000.0) + 1;
    bool named = l->nnames > 0;
    struct plan_trace *t = st_calloc(1, sizeof(*t));
    char *live = NULL;
    if (!t)
        return -ENOMEM;
    t->nintervals = niv;
    t->named = named;
    t->nnames = l->nnames;
    t->iv = st_calloc((size_t)niv, sizeof(*t->iv));
    t->node_ids = st_calloc((size_t)l->n + 1, sizeof(int));
    live = st_calloc((size_t)l->nnames + 1, 1);
    if (!t->iv || !t->node_ids || !live) {
        r = -ENOMEM;
        goto out;
    }
    int n = 0, e = 0, nid = 0;
    for (int i = 0; i < niv; i++) {
        struct plan_interval *iv = &t->iv[i];
        iv->n_before = n;
        int e0 = e;
        while (e < l->n && (int)floor(l->v[e].t_ms / 60000.0) == i)
            e++;
        /* adds first, then removes (Parcae counts both within an interval) */
        iv->first_in = nid;
        for (int k = e0; k < e; k++) {
            struct ev *v = &l->v[k];
            if (v->has_ref) {
                memcpy(iv->ref_shape, v->ref, sizeof(v->ref));
                t->has_ref = true;
            }
            if (v->add != 1)
                continue;
            if (v->node >= 0) {
                if (live[v->node]) {
                    r = st_error_set(err, name, v->line, 3, "node",
                                     "node '%s' added while already live",
                                     l->names[v->node]);
                    goto out;
                }
                live[v->node] = 1;
                t->node_ids[nid++] = v->node;
            }
            iv->n_in += v->count;
        }
        iv->first_out = named ? nid : -1;
        if (!named)
            iv->first_in = -1;
        for (int k = e0; k < e; k++) {
            struct ev *v = &l->v[k];
            if (v->add != 0)
                continue;
            if (v->node >= 0) {
                if (!live[v->node]) {
                    r = st_error_set(err, name, v->line, 3, "node",
                                     "node '%s' removed while not live", l->names[v->node]);
                    goto out;
                }
                live[v->node] = 0;
                t->node_ids[nid++] = v->node;
            }
            iv->n_out += v->count;
            if (iv->n_out > n + iv->n_in) {
                r = st_error_set(err, name, v->line, 0, "N",
                                 "more instances removed than live");
                goto out;
            }
        }
        n += iv->n_in - iv->n_out;
    }
    t->nnode_ids = nid;
    *ret = t;
    t = NULL;
out:
    st_free(live);
    plan_trace_free(t);
    return r;
}

int plan_trace_parse(const char *name, const char *text, size_t len, struct plan_trace **ret,
                     struct st_error *err) {
    if (!name || !text || !ret)
        return -EINVAL;
    struct evlist l = {0};
    size_t k = 0;
    while (k < len && isspace((unsigned char)text[k]))
        k++;
    int r;
    if (k < len && text[k] == '[')
        r = parse_jsonl(name, text, len, &l, err);
    else
        r = parse_csv(name, text, len, &l, err);
    if (r >= 0)
        r = build(name, &l, ret, err);
    evlist_done(&l);
    return r;
}

struct plan_decisions *plan_decisions_free(struct plan_decisions *d) {
    if (!d)
        return NULL;
    st_free(d->intervals);
    st_free(d->shapes);
    st_free(d);
    return NULL;
}

int plan_decisions_parse(const char *name, const char *text, size_t len,
                         struct plan_decisions **ret, struct st_error *err) {
    static const char *const keys[3] = {"throughut-opt", "liveput-truth", "liveput-predict"};
    json_error_t je;
    int r = 0;
    struct plan_decisions *d = NULL;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root)
        return st_error_set(err, name, je.line, je.column, "json", "%s", je.text);
    if (!json_is_array(root) || json_array_size(root) == 0) {
        r = st_error_set(err, name, 1, 1, "decisions", "expected a non-empty JSON list");
        goto out;
    }
    size_t n = json_array_size(root);
    d = st_calloc(1, sizeof(*d));
    if (!d || !(d->intervals = st_calloc(n, sizeof(*d->intervals))) ||
        !(d->shapes = st_calloc(n, sizeof(*d->shapes)))) {
        r = -ENOMEM;
        goto out;
    }
    d->n = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(root, i), *iv = json_object_get(o, "interval");
        if (!json_is_object(o) || !json_is_array(iv) || json_array_size(iv) != 3) {
            r = st_error_set(err, name, 0, 0, "interval",
                             "entry %zu: expected {\"interval\": [N, in, out], ...}", i);
            goto out;
        }
        for (int k = 0; k < 3; k++) {
            json_t *x = json_array_get(iv, (size_t)k);
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                json_integer_value(x) > 1000000) {
                r = st_error_set(err, name, 0, 0, "interval", "entry %zu: bad count", i);
                goto out;
            }
            d->intervals[i][k] = (int)json_integer_value(x);
        }
        for (int k = 0; k < 3; k++) {
            json_t *a = json_object_get(o, keys[k]);
            if (a && get_pair(a, d->shapes[i][k]) < 0) {
                r = st_error_set(err, name, 0, 0, keys[k], "entry %zu: expected [dp, pp]", i);
                goto out;
            }
        }
    }
    *ret = d;
    d = NULL;
out:
    plan_decisions_free(d);
    json_decref(root);
    return r;
}
