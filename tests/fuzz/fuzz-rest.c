/* fuzz-rest.c: libFuzzer target for the coordinator's REST API (coordinator/rest.c): request
 * methods, paths, query strings, headers and bodies through coord__rest_handle, the function
 * libmicrohttpd's callback calls, on a coordinator whose journal lives in a temporary directory.
 *
 * The input is a few HTTP requests in text, separated by a line "==":
 *
 *     METHOD PATH[?QUERY]
 *     Name: value            (headers, up to a blank line)
 *
 *     body                   (to the separator; only its length reaches the routes)
 *
 * The query is split and %-decoded the way libmicrohttpd does before it hands arguments over.
 * The coordinator wants a bearer token, so both sides of authentication are reached.
 *
 * After each request: a reply or -ENOMEM, a status the API documents, JSON that parses, an
 * error body {"code","message"}, Allow exactly on 405. After the program: a coordinator
 * reopened on the same journal has the same job row and shows the same events first in
 * /v1/events (what a request wrote is whole on disk; nothing half-written). */
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "coord-internal.h"
#include "fuzz.h"

#define TOKEN "fuzz-token"
#define MAX_REQUESTS 16
#define MAX_PAIRS 32
#define FIELD_MAX 1024

static const char *dir; /* fuzz_dir_make() */
static struct st_spec spec;

/* ---- reading a request ----------------------------------------------------------------- */

struct request {
    char method[64];
    char path[FIELD_MAX];
    char strings[2 * MAX_PAIRS * 2][FIELD_MAX]; /* names and values of args, then headers */
    struct coord_rest_kv args[MAX_PAIRS], headers[MAX_PAIRS];
    size_t nargs, nheaders, nstrings;
    struct coord_rest_request rq;
};

/* Copies n bytes as a C string (a NUL inside ends it, as it would in libmicrohttpd). */
static char *copy(char *dst, size_t size, const char *src, size_t n) {
    n = ST_MIN(n, size - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
    return dst;
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* %XX and '+' decoding in place (MHD_http_unescape plus the form rule for '+'). */
static void unescape(char *s) {
    char *o = s;
    for (char *p = s; *p; p++) {
        int hi, lo;
        if (*p == '%' && (hi = hexval(p[1])) >= 0 && (lo = hexval(p[2])) >= 0) {
            *o++ = (char)(hi * 16 + lo);
            p += 2;
        } else {
            *o++ = *p == '+' ? ' ' : *p;
        }
    }
    *o = '\0';
}

static char *next_string(struct request *r, const char *src, size_t n) {
    if (r->nstrings == ST_ARRAY_SIZE(r->strings))
        return NULL;
    return copy(r->strings[r->nstrings++], FIELD_MAX, src, n);
}

static void parse_query(struct request *r, const char *q, size_t n) {
    const char *end = q + n;
    while (q < end && r->nargs < MAX_PAIRS) {
        const char *amp = memchr(q, '&', (size_t)(end - q));
        const char *stop = amp ? amp : end;
        const char *eq = memchr(q, '=', (size_t)(stop - q));
        char *name = next_string(r, q, (size_t)((eq ? eq : stop) - q));
        char *value = eq ? next_string(r, eq + 1, (size_t)(stop - eq - 1)) : next_string(r, "", 0);
        if (!name || !value)
            return;
        unescape(name);
        unescape(value);
        r->args[r->nargs++] = (struct coord_rest_kv){name, value};
        q = stop + 1;
    }
}

/* Fills r from one request's text. */
static void parse_request(struct request *r, const char *p, size_t n) {
    memset(r, 0, sizeof(*r));
    const char *end = p + n;
    const char *nl = memchr(p, '\n', n);
    const char *line_end = nl ? nl : end;
    const char *sp = memchr(p, ' ', (size_t)(line_end - p));
    copy(r->method, sizeof(r->method), p, (size_t)((sp ? sp : line_end) - p));
    const char *target = sp ? sp + 1 : line_end;
    const char *qm = memchr(target, '?', (size_t)(line_end - target));
    copy(r->path, sizeof(r->path), target, (size_t)((qm ? qm : line_end) - target));
    if (qm)
        parse_query(r, qm + 1, (size_t)(line_end - qm - 1));
    p = nl ? nl + 1 : end;
    while (p < end) {
        nl = memchr(p, '\n', (size_t)(end - p));
        line_end = nl ? nl : end;
        const char *next = nl ? nl + 1 : end;
        if (line_end == p) { /* the blank line: the rest is the body */
            p = next;
            break;
        }
        const char *colon = memchr(p, ':', (size_t)(line_end - p));
        if (colon && r->nheaders < MAX_PAIRS) {
            const char *v = colon + 1;
            while (v < line_end && *v == ' ')
                v++;
            char *name = next_string(r, p, (size_t)(colon - p));
            char *value = next_string(r, v, (size_t)(line_end - v));
            if (name && value)
                r->headers[r->nheaders++] = (struct coord_rest_kv){name, value};
        }
        p = next;
    }
    size_t body = p < end ? (size_t)(end - p) : 0;
    /* A body of "BIG" stands for one over the limit (inputs stay small). */
    if (body >= 3 && memcmp(p, "BIG", 3) == 0)
        body = 65537;
    r->rq = (struct coord_rest_request){
        .method = r->method,
        .url = r->path,
        .args = r->args,
        .nargs = r->nargs,
        .headers = r->headers,
        .nheaders = r->nheaders,
        .body = p < end ? p : NULL,
        .body_len = body,
        .client_cert_ok = false,
    };
}

/* ---- invariants ------------------------------------------------------------------------ */

static void check_reply(const struct coord_rest_reply *rep) {
    static const unsigned statuses[] = {200, 400, 401, 403, 404, 405, 413, 500};
    bool known = false;
    for (size_t i = 0; i < ST_ARRAY_SIZE(statuses); i++)
        known |= rep->status == statuses[i];
    FUZZ_CHECK(known);
    FUZZ_CHECK(rep->content_type != NULL && rep->body != NULL);
    FUZZ_CHECK((rep->allow != NULL) == (rep->status == 405));
    if (rep->asset) {
        FUZZ_CHECK(rep->status == 200 && rep->len > 0);
        return;
    }
    FUZZ_CHECK(strlen(rep->body) == rep->len);
    if (strcmp(rep->content_type, "application/json") != 0) {
        FUZZ_CHECK(rep->status == 200 && strncmp(rep->content_type, "text/plain", 10) == 0);
        return;
    }
    FUZZ_CHECK(rep->len > 0 && rep->body[rep->len - 1] == '\n');
    json_error_t err;
    json_t *j = json_loadb(rep->body, rep->len, 0, &err);
    FUZZ_CHECK(json_is_object(j));
    if (rep->status != 200)
        FUZZ_CHECK(json_is_string(json_object_get(j, "code")) &&
                   json_is_string(json_object_get(j, "message")));
    json_decref(j);
}

/* GET /v1/events from the start: the journal's events as the API shows them. Caller frees. */
static char *events_text(struct coord *c) {
    struct coord_rest_kv args[] = {{"limit", "1000"}};
    struct coord_rest_kv hdrs[] = {{"authorization", "Bearer " TOKEN}};
    struct coord_rest_request rq = {.method = "GET", .url = "/v1/events", .args = args,
                                    .nargs = 1, .headers = hdrs, .nheaders = 1};
    struct coord_rest_reply rep;
    FUZZ_CHECK(coord__rest_handle(c, &rq, &rep) == 0 && rep.status == 200);
    return rep.body;
}

/* Every event of the first answer is in the second, identical and in the same place (opening
 * the coordinator again may append its own). */
static void check_same_events(const char *before, const char *after) {
    json_error_t err;
    json_t *a = json_loads(before, 0, &err), *b = json_loads(after, 0, &err);
    json_t *ea = json_object_get(a, "events"), *eb = json_object_get(b, "events");
    FUZZ_CHECK(json_is_array(ea) && json_is_array(eb));
    FUZZ_CHECK(json_array_size(eb) >= json_array_size(ea));
    for (size_t i = 0; i < json_array_size(ea); i++)
        FUZZ_CHECK(json_equal(json_array_get(ea, i), json_array_get(eb, i)));
    json_decref(a);
    json_decref(b);
}

static int one(const uint8_t *data, size_t size) {
    struct coord *c = NULL;
    int r = fuzz_coord_fresh(&spec, dir, TOKEN, &c);
    if (r < 0)
        return r;
    const char *p = (const char *)data, *end = p + size;
    int result = 0;
    static struct request req; /* large: kept off the stack */
    for (int k = 0; k < MAX_REQUESTS && p < end; k++) {
        const char *sep = memmem(p, (size_t)(end - p), "\n==\n", 4);
        size_t n = sep ? (size_t)(sep - p) : (size_t)(end - p);
        parse_request(&req, p, n);
        p = sep ? sep + 4 : end;
        struct coord_rest_reply rep;
        r = coord__rest_handle(c, &req.rq, &rep);
        if (r < 0) {
            FUZZ_CHECK(r == -ENOMEM);
            result = r;
            continue;
        }
        check_reply(&rep);
        if (rep.status == 200 && strcmp(req.rq.url, "/v1/job:stop") == 0)
            FUZZ_CHECK(c->job.state == COORD_JOB_STOPPING || c->job.state == COORD_JOB_STOPPED);
        coord__rest_reply_done(&rep);
    }
    /* The checks run with allocation failures off: they judge what the requests left. */
    st_alloc_fail_after(0);
    struct coord_job_row job = c->job;
    char *ev = events_text(c);
    coord_free(c);
    c = NULL;
    FUZZ_CHECK(fuzz_coord_open(&spec, dir, TOKEN, &c) == 0);
    FUZZ_CHECK(strcmp(c->job.id, job.id) == 0 && c->job.epoch == job.epoch);
    FUZZ_CHECK(c->job.state == job.state && c->job.step == job.step);
    char *ev2 = events_text(c);
    check_same_events(ev, ev2);
    free(ev);
    free(ev2);
    coord_free(c);
    return result;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    st_log_level_max = -1;
    dir = fuzz_dir_make("rest");
    fuzz_coord_spec(&spec);
    return 0;
}

FUZZ_TARGET(one)
