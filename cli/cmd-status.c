/* cmd-status.c: `spottrain status [--endpoint URL] [--json] [--watch [--interval S]]
 * [--token-file F]` — show a running job from the coordinator's REST API; --watch draws the
 * status page's picture (instances, shape, migrations, loss, samples/s, cost from /v1/history)
 * in text and redraws it in place.
 *
 * One idea: three GETs (/v1/job, /v1/workers, /v1/events) over a tiny HTTP/1.0 client on a
 * plain socket for http://, or libcurl for https:// (a coordinator with spec.coordinator.tls;
 * --tls-ca verifies it, --tls-cert/--tls-key answer a client-certificate request), rendered
 * as a table or passed through as one JSON object for scripts. */
#include <curl/curl.h>
#include <getopt.h>
#include <jansson.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "coordinator.h" /* coord_token_read */

#define STATUS_MAX_RESPONSE (16 << 20)

struct endpoint {
    char host[256];
    char port[8];
    bool https;
    char base[300];              /* https: "https://HOST:PORT" as given, for libcurl */
    const char *ca, *cert, *key; /* https: PEM files; NULL = system CAs / no client cert */
    double timeout;              /* seconds one GET may take, connect included (--timeout) */
};

static int parse_endpoint(const char *url, struct endpoint *ep) {
    const char *p = url;
    ep->https = false;
    if (strncmp(p, "http://", 7) == 0) {
        p += 7;
    } else if (strncmp(p, "https://", 8) == 0) {
        p += 8;
        ep->https = true;
    } else if (strstr(p, "://")) {
        return -EINVAL;
    }
    size_t n = strcspn(p, "/");
    char hp[300];
    if (n == 0 || n >= sizeof(hp))
        return -EINVAL;
    memcpy(hp, p, n);
    hp[n] = '\0';
    char *colon = strrchr(hp, ':');
    if (colon && (!strchr(hp, ']') || colon > strchr(hp, ']'))) {
        *colon = '\0';
        char *end = NULL;
        long port = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || port < 1 || port > 65535)
            return -EINVAL;
        snprintf(ep->port, sizeof(ep->port), "%ld", port);
    } else {
        snprintf(ep->port, sizeof(ep->port), "%s", ep->https ? "443" : "80");
    }
    snprintf(ep->base, sizeof(ep->base), "https://%.*s", (int)n, p);
    char *h = hp;
    if (h[0] == '[') {
        h++;
        char *close = strchr(h, ']');
        if (!close)
            return -EINVAL;
        *close = '\0';
    }
    if (!*h)
        return -EINVAL;
    snprintf(ep->host, sizeof(ep->host), "%s", h);
    return 0;
}

struct curl_buf {
    char *data;
    size_t len;
    bool too_big;
};

static size_t curl_sink(char *ptr, size_t size, size_t nmemb, void *userdata) {
    struct curl_buf *b = userdata;
    size_t n = size * nmemb;
    if (b->len + n + 1 > STATUS_MAX_RESPONSE) {
        b->too_big = true;
        return 0;
    }
    char *d = st_realloc(b->data, b->len + n + 1);
    if (!d)
        return 0;
    memcpy(d + b->len, ptr, n);
    b->len += n;
    d[b->len] = '\0';
    b->data = d;
    return n;
}

/* GET over https with libcurl: the same contract as http_get. */
static int https_get(const struct endpoint *ep, const char *path, const char *token,
                     char **ret_body) {
    char url[1400], auth[300];
    struct curl_buf b = {NULL, 0, false};
    struct curl_slist *hdrs = NULL;
    int r = -ENOMEM;
    CURL *h = curl_easy_init();
    if (!h)
        return -ENOMEM;
    snprintf(url, sizeof(url), "%s%s", ep->base, path);
    hdrs = curl_slist_append(NULL, "Accept: application/json");
    if (token && hdrs) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token);
        struct curl_slist *t = curl_slist_append(hdrs, auth);
        hdrs = t ? t : hdrs;
        if (!t)
            goto out;
    }
    if (!hdrs)
        goto out;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, curl_sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(ep->timeout * 1e3));
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "https");
    if (ep->ca)
        curl_easy_setopt(h, CURLOPT_CAINFO, ep->ca);
    if (ep->cert) {
        curl_easy_setopt(h, CURLOPT_SSLCERT, ep->cert);
        curl_easy_setopt(h, CURLOPT_SSLKEY, ep->key);
    }
    CURLcode cc = curl_easy_perform(h);
    if (cc != CURLE_OK) {
        fprintf(stderr, "spottrain status: %s: %s\n", url, curl_easy_strerror(cc));
        r = b.too_big ? -EFBIG
            : cc == CURLE_COULDNT_CONNECT ? -ECONNREFUSED
            : cc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT
            : cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CONNECT_ERROR ||
                      cc == CURLE_SSL_CACERT_BADFILE || cc == CURLE_SSL_CERTPROBLEM
                ? -EPROTO
                : -EIO;
        goto out;
    }
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    char *body = st_strdup(b.data ? b.data : "");
    if (!body)
        goto out;
    *ret_body = body;
    r = (int)status;
out:
    st_free(b.data);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    return r;
}

/* GET path; returns the HTTP status and the body (caller frees), or negative errno. */
static int http_get(const struct endpoint *ep, const char *path, const char *token,
                    char **ret_body) {
    if (ep->https)
        return https_get(ep, path, token, ret_body);
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(ep->host, ep->port, &hints, &ai) != 0 || !ai)
        return -EHOSTUNREACH;
    int fd = -1, r = -ECONNREFUSED;
    for (struct addrinfo *x = ai; x; x = x->ai_next) {
        fd = socket(x->ai_family, x->ai_socktype | SOCK_CLOEXEC, x->ai_protocol);
        if (fd < 0)
            continue;
        /* Each wait (connect, send, every read) is bounded by --timeout: a coordinator whose
         * disk stalls its journal for seconds is slow, not gone. */
        struct timeval tv = {(time_t)ep->timeout,
                             (suseconds_t)((ep->timeout - (double)(time_t)ep->timeout) * 1e6)};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        if (connect(fd, x->ai_addr, x->ai_addrlen) == 0)
            break;
        r = errno == EINPROGRESS || errno == EAGAIN ? -ETIMEDOUT : -errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return r;
    char req[1024];
    int n = snprintf(req, sizeof(req),
                     "GET %s HTTP/1.0\r\nHost: %s:%s\r\nAccept: application/json\r\n%s%s%s\r\n",
                     path, ep->host, ep->port, token ? "Authorization: Bearer " : "",
                     token ? token : "", token ? "\r\n" : "");
    /* A server that reset the connection is an error to report, not a SIGPIPE. */
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return -EIO;
    }
    size_t cap = 65536, len = 0;
    char *buf = st_malloc(cap);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    for (;;) {
        if (len + 1 >= cap) {
            if (cap >= STATUS_MAX_RESPONSE) {
                st_free(buf);
                close(fd);
                return -EFBIG;
            }
            char *b = st_realloc(buf, cap * 2);
            if (!b) {
                st_free(buf);
                close(fd);
                return -ENOMEM;
            }
            buf = b;
            cap *= 2;
        }
        ssize_t k = read(fd, buf + len, cap - len - 1);
        if (k < 0) {
            r = errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
            st_free(buf);
            close(fd);
            return r;
        }
        if (k == 0)
            break;
        len += (size_t)k;
    }
    close(fd);
    buf[len] = '\0';
    int status = 0;
    if (sscanf(buf, "HTTP/%*d.%*d %d", &status) != 1) {
        st_free(buf);
        return -EPROTO;
    }
    char *body = strstr(buf, "\r\n\r\n");
    char *out = st_strdup(body ? body + 4 : "");
    st_free(buf);
    if (!out)
        return -ENOMEM;
    *ret_body = out;
    return status;
}

static int get_json(const struct endpoint *ep, const char *path, const char *token,
                    json_t **ret) {
    char *body = NULL;
    int status = http_get(ep, path, token, &body);
    if (status < 0)
        return status;
    json_t *j = json_loads(body, 0, NULL);
    st_free(body);
    if (!j || status != 200) {
        json_decref(j);
        return -EPROTO;
    }
    *ret = j;
    return 0;
}

static const char *jstr(json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static long long jint(json_t *o, const char *k) {
    return (long long)json_integer_value(json_object_get(o, k));
}

/* ---- events, as a person reads them ------------------------------------------------------ */

#define EV_TEXT 400

/* One line of "last events": an event, or a run of events folded into one. */
struct ev_line {
    long long seq;            /* the last event folded in */
    time_t t;                 /* its time */
    char kind[24];
    char wid[12];             /* worker id prefix; "" for the coordinator's own or a group */
    char text[EV_TEXT];
    int reps;                 /* identical events folded in */
    /* A group of events in a row that read as one: "ckpt" (checkpoints: each stage's notice
     * and the coordinator's line, over consecutive steps) or "reconf N" (each worker's
     * notice that it reconfigured for epoch N). */
    char group[32];
    long long first, last;    /* ckpt: first and last step */
    int count;                /* ckpt: checkpoints; reconf: workers */
    double bytes;             /* reconf: bytes received */
    double slowest;           /* seconds: the slowest write or stall */
};

/* A worker's notice "KIND at UNIX-TIME k=v k=v" in words: "KIND: k v, k v" (the time is the
 * event's own, shown in its column). */
static void notice_words(const char *msg, char *out, size_t size) {
    char kind[64];
    double at;
    int off = 0;
    if (sscanf(msg, "%63s at %lf %n", kind, &at, &off) < 2 || off == 0) {
        snprintf(out, size, "%s", msg);
        return;
    }
    size_t k = (size_t)snprintf(out, size, "%s", kind);
    const char *p = msg + off;
    bool first = true;
    while (*p && k + 1 < size) {
        size_t n = strcspn(p, " ");
        const char *eq = memchr(p, '=', n);
        if (eq && !strncmp(p, "dir=", 4))
            n = strlen(p); /* last, may hold spaces */
        if (eq)
            k += (size_t)snprintf(out + k, size - k, "%s%.*s %.*s", first ? ": " : ", ",
                                  (int)(eq - p), p, (int)(n - (size_t)(eq - p) - 1), eq + 1);
        else
            k += (size_t)snprintf(out + k, size - k, "%s%.*s", first ? ": " : " ", (int)n, p);
        first = false;
        p += n;
        while (*p == ' ')
            p++;
    }
}

/* Value of "key=" in a notice's text, as a number; false when absent. */
static bool notice_num(const char *msg, const char *key, double *ret) {
    char pat[32];
    snprintf(pat, sizeof(pat), " %s=", key);
    const char *p = strstr(msg, pat);
    if (!p)
        return false;
    *ret = strtod(p + strlen(pat), NULL);
    return true;
}

static const char *secs_words(char *buf, size_t size, double s) {
    if (s < 1)
        snprintf(buf, size, "%.0f ms", s * 1000);
    else
        snprintf(buf, size, "%.2f s", s);
    return buf;
}

/* The text of a folded group, once all its events are in. */
static void group_text(struct ev_line *l) {
    char slow[32];
    secs_words(slow, sizeof(slow), l->slowest);
    if (!strcmp(l->group, "ckpt") && l->count == 1)
        snprintf(l->text, sizeof(l->text), "checkpoint at step %lld written in %s", l->last,
                 slow);
    else if (!strcmp(l->group, "ckpt"))
        snprintf(l->text, sizeof(l->text), "%d checkpoints, steps %lld to %lld, the slowest "
                 "written in %s", l->count, l->first, l->last, slow);
    else
        snprintf(l->text, sizeof(l->text), "%d worker%s reconfigured for epoch %lld: %.2f MB "
                 "received, the longest stall %s", l->count, l->count == 1 ? "" : "s",
                 l->first, l->bytes / 1e6, slow);
}

/* Folds the journal's events into lines: a checkpoint is one line (its stages' notices and
 * the coordinator's "written" line together), a run of checkpoints with nothing between is
 * one line, the workers' "reconfigured" notices of one epoch are one line, and identical
 * events in a row are one line with a count. Keeps the last `max` lines; returns how many. */
static size_t fold_events(json_t *el, struct ev_line *out, size_t max) {
    size_t n = 0, i;
    json_t *e;
    json_array_foreach(el, i, e) {
        const char *kind = jstr(e, "kind"), *msg = jstr(e, "message");
        const char *wid = json_string_value(json_object_get(e, "worker_id"));
        struct ev_line x;
        memset(&x, 0, sizeof(x));
        x.seq = jint(e, "seq");
        x.t = (time_t)json_number_value(json_object_get(e, "time"));
        snprintf(x.kind, sizeof(x.kind), "%s", kind);
        snprintf(x.wid, sizeof(x.wid), "%.8s", wid ? wid : "");
        double v = 0, secs = 0;
        unsigned long long step = 0, epoch = 0;
        int dp = 0, pp = 0, off = 0;
        char took[32] = "";
        bool is_notice = !strcmp(kind, "notice");
        if (is_notice && !strncmp(msg, "ckpt-written ", 13) && notice_num(msg, "step", &v)) {
            snprintf(x.group, sizeof(x.group), "ckpt");
            x.first = x.last = (long long)v;
            (void)notice_num(msg, "seconds", &x.slowest);
        } else if (!strcmp(kind, "loop") &&
                   sscanf(msg, "checkpoint at step %llu written: %*d stage%*s in %31[^\n]",
                          &step, took) == 2) {
            snprintf(x.group, sizeof(x.group), "ckpt");
            x.first = x.last = (long long)step;
            x.slowest = strtod(took, NULL) / (strstr(took, "ms") ? 1000.0 : 1.0);
        } else if (is_notice && !strncmp(msg, "reconfigured ", 13) &&
                   notice_num(msg, "epoch", &v)) {
            snprintf(x.group, sizeof(x.group), "reconf %.0f", v);
            x.first = (long long)v;
            x.count = 1;
            (void)notice_num(msg, "recv", &x.bytes);
            (void)notice_num(msg, "stall", &secs);
            x.slowest = secs;
        } else if (!strcmp(kind, "epoch") &&
                   sscanf(msg, "epoch %llu: dp=%d pp=%d (%n", &epoch, &dp, &pp, &off) == 3 &&
                   off > 0) {
            /* The coordinator's record of an order; the loop's line reports the outcome. */
            snprintf(x.text, sizeof(x.text), "epoch %llu ordered: %dx%d (%s", epoch, dp, pp,
                     msg + off);
        } else if (is_notice) {
            notice_words(msg, x.text, sizeof(x.text));
        } else {
            snprintf(x.text, sizeof(x.text), "%s", msg);
        }
        struct ev_line *last = n ? &out[n - 1] : NULL;
        if (x.group[0] && last && !strcmp(last->group, x.group)) {
            if (!strcmp(x.group, "ckpt"))
                last->count += x.last != last->last;
            else
                last->count++;
            last->last = x.last;
            last->bytes += x.bytes;
            last->slowest = x.slowest > last->slowest ? x.slowest : last->slowest;
            last->seq = x.seq;
            last->t = x.t;
            continue;
        }
        if (!x.group[0] && last && !last->group[0] && !strcmp(last->kind, x.kind) &&
            !strcmp(last->wid, x.wid) && !strcmp(last->text, x.text)) {
            last->reps++;
            last->seq = x.seq;
            last->t = x.t;
            continue;
        }
        if (x.group[0]) {
            x.count = 1;
            snprintf(x.kind, sizeof(x.kind), "%s", !strcmp(x.group, "ckpt") ? "checkpoint"
                                                                            : "reconfigured");
            x.wid[0] = '\0';
        }
        if (n == max) {
            memmove(out, out + 1, (max - 1) * sizeof(*out));
            n--;
        }
        out[n++] = x;
    }
    for (i = 0; i < n; i++)
        if (out[i].group[0])
            group_text(&out[i]);
    return n;
}

static void print_events(json_t *el) {
    struct ev_line *lines = st_calloc(10, sizeof(*lines));
    if (!lines)
        return;
    size_t n = fold_events(el, lines, 10);
    printf("\nlast events:\n");
    for (size_t i = 0; i < n; i++) {
        struct tm tm;
        char ts[32], reps[32] = "";
        localtime_r(&lines[i].t, &tm);
        strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
        if (lines[i].reps)
            snprintf(reps, sizeof(reps), " (x%d)", lines[i].reps + 1);
        printf("  %6lld %s %-12s %s%s%s%s\n", lines[i].seq, ts, lines[i].kind, lines[i].wid,
               lines[i].wid[0] ? " " : "", lines[i].text, reps);
    }
    st_free(lines);
}

static void print_table(json_t *job, json_t *workers, json_t *events) {
    json_t *shape = json_object_get(job, "shape");
    printf("job %s (%s)  state %s  epoch %lld  shape dp=%lld pp=%lld\n", jstr(job, "name"),
           jstr(job, "id"), jstr(job, "state"), jint(job, "epoch"), jint(shape, "dp"),
           jint(shape, "pp"));
    printf("step %lld/%lld  samples %lld  loss %.4f (step %lld)  samples/s %.1f\n",
           jint(job, "step"), jint(job, "target_steps"), jint(job, "samples"),
           json_number_value(json_object_get(job, "loss")), jint(job, "loss_step"),
           json_number_value(json_object_get(job, "samples_per_second")));
    json_t *wl = json_object_get(workers, "workers");
    printf("\n%-36s  %-8s %5s %5s %7s %-10s %-21s %8s\n", "WORKER", "STATE", "STAGE", "REPL",
           "LAYERS", "ZONE", "DATA", "SEEN");
    size_t i;
    json_t *w;
    long long nlayers = 0; /* the model's layers, embeddings and head included */
    json_array_foreach(wl, i, w) {
        char layers[32] = "-", stage[16] = "-", repl[16] = "-";
        if (jint(w, "stage") >= 0) {
            snprintf(stage, sizeof(stage), "%lld", jint(w, "stage"));
            snprintf(repl, sizeof(repl), "%lld", jint(w, "replica"));
            snprintf(layers, sizeof(layers), "[%lld,%lld)", jint(w, "layer_begin"),
                     jint(w, "layer_end"));
            if (jint(w, "layer_end") > nlayers)
                nlayers = jint(w, "layer_end");
        }
        printf("%-36s  %-8s %5s %5s %7s %-10s %-21s %7.1fs\n", jstr(w, "id"), jstr(w, "state"),
               stage, repl, layers, jstr(w, "zone")[0] ? jstr(w, "zone") : "-",
               jstr(w, "data_addr")[0] ? jstr(w, "data_addr") : "-",
               json_number_value(json_object_get(w, "last_seen_seconds_ago")));
    }
    /* The engine's numbering (kernels.h): the embeddings and the final norm with the tied LM
     * head are layers of their own, around the transformer blocks. */
    if (nlayers >= 3)
        printf("LAYERS: [first,end) of the model's %lld layers: 0 = embeddings, 1-%lld = "
               "transformer blocks, %lld = final norm and LM head\n", nlayers, nlayers - 2,
               nlayers - 1);
    print_events(json_object_get(events, "events"));
    fflush(stdout);
}

/* ---- --watch: the status page's picture in text ---------------------------------------- */

#define WATCH_COLS 60 /* columns of a sparkline: the job's time range, left to right */

static double jnum(json_t *o, const char *k) {
    return json_number_value(json_object_get(o, k));
}

/* Prints "label |sparkline| last (max)" (no newline): pts[].key sampled as a step function (the newest
 * point at or before each column's end), scaled from 0 to the series' max. */
static void spark(const char *label, json_t *pts, const char *key, double t0, double t1,
                  int decimals) {
    static const char *const blocks[] = {"\u2581", "\u2582", "\u2583", "\u2584", "\u2585",
                                         "\u2586", "\u2587", "\u2588"};
    size_t n = json_array_size(pts), j = 0;
    double max = 0, last = 0;
    for (size_t i = 0; i < n; i++)
        max = ST_MAX(max, jnum(json_array_get(pts, i), key));
    printf("  %-12s |", label);
    for (int col = 0; col < WATCH_COLS; col++) {
        double end = t0 + (t1 - t0) * (col + 1) / WATCH_COLS;
        bool have = j > 0;
        while (j < n && jnum(json_array_get(pts, j), "t") <= end) {
            last = jnum(json_array_get(pts, j), key);
            have = true;
            j++;
        }
        if (!have || max <= 0) {
            fputs(" ", stdout);
            continue;
        }
        int b = (int)(last / max * 7.0 + 0.5);
        fputs(blocks[ST_MAX(0, ST_MIN(7, b))], stdout);
    }
    printf("| %.*f (max %.*f)", decimals, n ? jnum(json_array_get(pts, n - 1), key) : 0.0,
           decimals, max);
}

/* The picture of the status page: progress, then instances, shape, loss, samples/s and cost
 * over the job's time, the migrations with kind and stall, the newest events. Lines end in
 * "\033[K" on a terminal so a shorter redraw leaves nothing of the last one behind. */
static void print_watch(json_t *job, json_t *hist, json_t *events, bool tty) {
    const char *el = tty ? "\033[K" : "";
    json_t *shape = json_object_get(job, "shape"), *w = json_object_get(job, "workers");
    printf("job %s  %s  epoch %lld  shape %lldx%lld (dp x pp)%s\n", jstr(job, "name"),
           jstr(job, "state"), jint(job, "epoch"), jint(shape, "dp"), jint(shape, "pp"), el);
    printf("step %lld/%lld  loss %.4f  samples/s %.1f  workers %lld active, %lld spare%s\n",
           jint(job, "step"), jint(job, "target_steps"), jnum(job, "loss"),
           jnum(job, "samples_per_second"), jint(w, "active"), jint(w, "spare"), el);
    if (!hist) {
        printf("(history needs the job's token: --token-file)%s\n", el);
    } else {
        json_t *inst = json_object_get(hist, "instances"), *shp = json_object_get(hist, "shapes");
        json_t *loss = json_object_get(hist, "loss"), *cost = json_object_get(hist, "cost");
        json_t *migs = json_object_get(hist, "migrations");
        double t1 = jnum(hist, "now"), t0 = jnum(job, "created");
        json_t *series[] = {inst, shp, loss, cost};
        for (size_t i = 0; i < ST_ARRAY_SIZE(series); i++)
            if (json_array_size(series[i]) > 0)
                t0 = ST_MIN(t0, jnum(json_array_get(series[i], 0), "t"));
        if (t1 <= t0)
            t1 = t0 + 1;
        size_t nc = json_array_size(cost);
        json_t *lc = nc ? json_array_get(cost, nc - 1) : NULL;
        printf("%s\nover %.0f s:%s\n", el, t1 - t0, el);
        spark("instances", inst, "alive", t0, t1, 0);
        printf("%s\n", el);
        spark("noticed", inst, "noticed", t0, t1, 0);
        printf("%s\n", el);
        spark("forecast", inst, "forecast", t0, t1, 1);
        printf("%s\n", el);
        spark("shape dp", shp, "dp", t0, t1, 0);
        printf("%s\n", el);
        spark("shape pp", shp, "pp", t0, t1, 0);
        printf("%s\n", el);
        spark("loss", loss, "loss", t0, t1, 4);
        printf("%s\n", el);
        spark("samples/s", loss, "samples_per_second", t0, t1, 1);
        printf("%s\n", el);
        spark("spent $", cost, "spot_dollars", t0, t1, 2);
        printf("%s\n", el);
        printf("  spent $%.2f, on demand $%.2f%s\n", lc ? jnum(lc, "spot_dollars") : 0.0,
               lc ? jnum(lc, "on_demand_dollars") : 0.0, el);
        size_t nm = json_array_size(migs);
        printf("%s\nmigrations: %zu%s\n", el, nm, el);
        for (size_t i = nm > 6 ? nm - 6 : 0; i < nm; i++) {
            json_t *m = json_array_get(migs, i);
            printf("  %6.0fs  %-18s -> %lldx%lld at step %-6lld %8.2f MB  %6.0f ms stall%s\n",
                   jnum(m, "t") - t0, jstr(m, "kind"), jint(m, "dp"), jint(m, "pp"),
                   jint(m, "step"), (double)jint(m, "bytes") / 1e6,
                   jnum(m, "stall_seconds") * 1e3, el);
        }
    }
    json_t *evs = json_object_get(events, "events");
    size_t n = json_array_size(evs);
    printf("%s\nlast events:%s\n", el, el);
    for (size_t i = n > 6 ? n - 6 : 0; i < n; i++) {
        json_t *e = json_array_get(evs, i);
        printf("  %-14s %.100s%s\n", jstr(e, "kind"), jstr(e, "message"), el);
    }
    if (tty)
        printf("\033[J");
    fflush(stdout);
}

/* The line for a GET that failed with r (negative errno). */
static void read_failed(const struct endpoint *ep, int r) {
    if (r == -ETIMEDOUT)
        fprintf(stderr, "spottrain status: cannot read %s:%s: no answer within %g s "
                "(--timeout)\n", ep->host, ep->port, ep->timeout);
    else
        fprintf(stderr, "spottrain status: cannot read %s:%s: %s\n", ep->host, ep->port,
                st_strerror(r));
}

/* One --watch frame; returns 0 or negative errno (message printed). */
static int show_watch(const struct endpoint *ep, const char *token, bool tty) {
    json_t *job = NULL, *hist = NULL, *events = NULL;
    int r = get_json(ep, "/v1/job", token, &job);
    if (r >= 0)
        r = get_json(ep, "/v1/events?since=0&limit=1000", token, &events);
    if (r >= 0 && token && get_json(ep, "/v1/history", token, &hist) < 0)
        hist = NULL; /* drawn without it, with a line that says why */
    if (r < 0) {
        if (tty)
            printf("\033[H\033[J");
        read_failed(ep, r);
    } else {
        if (tty)
            printf("\033[H");
        print_watch(job, hist, events, tty);
    }
    json_decref(job);
    json_decref(hist);
    json_decref(events);
    return r;
}

/* One snapshot; returns 0 or negative errno (message printed). */
static int show(const struct endpoint *ep, const char *token, bool as_json) {
    json_t *job = NULL, *workers = NULL, *events = NULL;
    int r = get_json(ep, "/v1/job", token, &job);
    if (r >= 0)
        r = get_json(ep, "/v1/workers", token, &workers);
    if (r >= 0) {
        /* The last 50 events: ask for the count first through /v1/job's view of the log. */
        r = get_json(ep, "/v1/events?since=0&limit=1000", token, &events);
    }
    if (r < 0) {
        read_failed(ep, r);
    } else if (as_json) {
        json_t *all = json_pack("{s:O, s:O, s:O}", "job", job, "workers",
                                json_object_get(workers, "workers"), "events",
                                json_object_get(events, "events"));
        char *t = all ? json_dumps(all, JSON_INDENT(2)) : NULL;
        if (t)
            printf("%s\n", t);
        free(t);
        json_decref(all);
        fflush(stdout);
    } else {
        print_table(job, workers, events);
    }
    json_decref(job);
    json_decref(workers);
    json_decref(events);
    return r;
}

static volatile sig_atomic_t watch_stop;

static void on_watch_signal(int sig) {
    (void)sig;
    watch_stop = 1;
}

/* A number of seconds in 0.1..3600 (--interval, --timeout); 0 or -EINVAL. */
static int parse_seconds(const char *s, double *ret) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= 0.1 && v <= 3600))
        return -EINVAL;
    *ret = v;
    return 0;
}

int cli_cmd_status(int argc, char **argv) {
    static const struct option opts[] = {
        {"endpoint", required_argument, NULL, 'e'},
        {"json", no_argument, NULL, 'j'},
        {"watch", no_argument, NULL, 'w'},
        {"interval", required_argument, NULL, 'i'},
        {"token-file", required_argument, NULL, 't'},
        {"tls-ca", required_argument, NULL, 'A'},
        {"tls-cert", required_argument, NULL, 'C'},
        {"tls-key", required_argument, NULL, 'K'},
        {"timeout", required_argument, NULL, 'T'},
        {NULL, 0, NULL, 0},
    };
    const char *url = "http://127.0.0.1:8080", *token_file = NULL;
    const char *tls_ca = NULL, *tls_cert = NULL, *tls_key = NULL;
    bool as_json = false, watch = false;
    double interval = 2.0, timeout = 30.0;
    int opt;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'e': url = optarg; break;
        case 'j': as_json = true; break;
        case 'w': watch = true; break;
        case 'i':
            if (parse_seconds(optarg, &interval) < 0)
                return cli_usage_error("status", "invalid --interval '%s' (seconds, 0.1..3600)",
                                       optarg);
            break;
        case 'T':
            if (parse_seconds(optarg, &timeout) < 0)
                return cli_usage_error("status", "invalid --timeout '%s' (seconds, 0.1..3600)",
                                       optarg);
            break;
        case 't': token_file = optarg; break;
        case 'A': tls_ca = optarg; break;
        case 'C': tls_cert = optarg; break;
        case 'K': tls_key = optarg; break;
        default:
            return cli_usage_error("status", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("status", "unexpected argument '%s'", argv[optind]);
    struct endpoint ep;
    if (parse_endpoint(url, &ep) < 0)
        return cli_usage_error("status", "bad --endpoint '%s' (want http://HOST:PORT or "
                               "https://HOST:PORT)", url);
    if (!tls_cert != !tls_key)
        return cli_usage_error("status", "--tls-cert and --tls-key go together");
    if ((tls_ca || tls_cert) && !ep.https)
        return cli_usage_error("status", "--tls-ca/--tls-cert need an https:// --endpoint");
    const char *tls_files[3] = {tls_ca, tls_cert, tls_key};
    static const char *const tls_flag[3] = {"--tls-ca", "--tls-cert", "--tls-key"};
    for (int i = 0; i < 3; i++)
        if (tls_files[i] && access(tls_files[i], R_OK) < 0)
            return cli_usage_error("status", "cannot read %s '%s': %s", tls_flag[i],
                                   tls_files[i], st_strerror(-errno));
    ep.ca = tls_ca;
    ep.timeout = timeout;
    ep.cert = tls_cert;
    ep.key = tls_key;
    char token[256];
    if (token_file) {
        char why[512];
        if (coord_token_read(token_file, token, sizeof(token), why, sizeof(why)) < 0) {
            fprintf(stderr, "spottrain status: %s\n", why);
            return CLI_EXIT_INPUT;
        }
    }
    const char *tok = token_file ? token : NULL;
    if (ep.https && curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "spottrain status: cannot initialise libcurl\n");
        return CLI_EXIT_FAILURE;
    }
    int ret = CLI_EXIT_OK;
    if (!watch) {
        ret = show(&ep, tok, as_json) < 0 ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
    } else {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGINT);
        sigaddset(&set, SIGTERM);
        /* Threads that libraries started at load (OpenBLAS) do not block the signals: one
         * delivered there runs this handler (the flag) instead of ending the process. */
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_watch_signal;
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        sigprocmask(SIG_BLOCK, &set, NULL);
        /* On a terminal each frame overwrites the last in place (cursor home, each line
         * cleared to its end); into a pipe or file the frames follow each other. */
        bool tty = isatty(STDOUT_FILENO);
        if (tty && !as_json)
            printf("\033[2J");
        for (;;) {
            if (as_json)
                (void)show(&ep, tok, true);
            else
                (void)show_watch(&ep, tok, tty);
            if (!tty && !as_json)
                printf("\n");
            struct timespec wait = {(time_t)interval,
                                    (long)((interval - (double)(time_t)interval) * 1e9)};
            int sig = watch_stop ? 0 : sigtimedwait(&set, NULL, &wait);
            if (sig == SIGINT || sig == SIGTERM || watch_stop)
                break;
        }
    }
    if (ep.https)
        curl_global_cleanup();
    return ret;
}
