/* test-notice-data.c: the notice clients (AWS IMDSv2, GCE metadata, Azure scheduled events)
 * against a loopback HTTP server scripted by data files (curl's tests/data/testNNN idea).
 *
 * Each file under data/ names the client and the call, the result we must get, and a list
 * of exchanges: the exact request the client must send (request line and the headers that
 * matter, "!Name" for a header that must be absent) and the raw response to serve ("hang"
 * to never answer). The server speaks raw sockets, so what is checked is what went over the
 * wire. Format:
 *
 *   # comment
 *   client aws|gcp|azure
 *   call poll|identity|ack      (default poll)
 *   event_id ID                 (ack: the event acknowledged)
 *   calls N                     (default 1; the last call's result is checked)
 *   timeout_ms N                (default 2000)
 *   token_ttl N                 (AWS; default 21600)
 *   vm_name NAME                (Azure)
 *   expect none | notice KIND EPOCH [EVENT_ID] | error ENAME | identity ID TYPE ZONE | ok
 *   %%request
 *   GET /path?query HTTP/1.1
 *   Header: value
 *   !Absent-Header
 *   %%response [hang]
 *   HTTP/1.1 200 OK
 *   Header: value
 *   <empty line>
 *   body (its last newline is not part of it)
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cloud.h"
#include "common.h"
#include "test.h"

#define MAX_EXCHANGES 16
#define MAX_HEADERS 16

struct exchange {
    char request_line[512];
    char headers[MAX_HEADERS][256]; /* "Name: value" or "!Name" */
    int nheaders;
    char *response;                 /* raw head + body, \n line ends */
    bool hang;
};

struct script {
    char name[256];
    char client[16];
    char call[16];
    int calls;
    long timeout_ms, token_ttl;
    char vm_name[64];
    char event_id[64];
    char expect[256];
    struct exchange ex[MAX_EXCHANGES];
    int nex;
};

struct server {
    int lfd;
    int stop_pipe[2];
    unsigned short port;
    pthread_t thread;
    struct script *sc;
    int next;                 /* exchanges answered */
    char error[1024];         /* first mismatch */
    int hung[MAX_EXCHANGES];  /* connections held open */
    int nhung;
};

static void script_free(struct script *sc) {
    for (int i = 0; i < sc->nex; i++)
        st_free(sc->ex[i].response);
}

/* Parses a data file. Returns 0 or -EINVAL with a message on stderr. */
static int script_load(const char *path, struct script *sc) {
    char *data = NULL;
    size_t len;
    int r = st_read_file(path, 1 << 20, &data, &len);
    if (r < 0)
        return r;
    memset(sc, 0, sizeof(*sc));
    snprintf(sc->call, sizeof(sc->call), "poll");
    sc->calls = 1;
    sc->timeout_ms = 2000;
    enum { HEAD, REQ, RESP } mode = HEAD;
    struct exchange *ex = NULL;
    size_t resp_cap = 0, resp_len = 0;
    /* Split on '\n' by hand so empty lines survive (strtok would skip them). */
    for (char *line = data; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (strncmp(line, "%%request", 9) == 0) {
            if (sc->nex == MAX_EXCHANGES)
                goto bad;
            ex = &sc->ex[sc->nex++];
            mode = REQ;
        } else if (strncmp(line, "%%response", 10) == 0) {
            if (!ex)
                goto bad;
            ex->hang = strstr(line, "hang") != NULL;
            resp_cap = 4096;
            resp_len = 0;
            ex->response = st_calloc(1, resp_cap);
            mode = RESP;
        } else if (mode == HEAD) {
            char key[32], val[256];
            if (line[0] == '#' || line[0] == '\0') {
            } else if (sscanf(line, "%31s %255[^\n]", key, val) == 2) {
                if (!strcmp(key, "client"))
                    snprintf(sc->client, sizeof(sc->client), "%s", val);
                else if (!strcmp(key, "call"))
                    snprintf(sc->call, sizeof(sc->call), "%s", val);
                else if (!strcmp(key, "calls"))
                    sc->calls = atoi(val);
                else if (!strcmp(key, "timeout_ms"))
                    sc->timeout_ms = atol(val);
                else if (!strcmp(key, "token_ttl"))
                    sc->token_ttl = atol(val);
                else if (!strcmp(key, "vm_name"))
                    snprintf(sc->vm_name, sizeof(sc->vm_name), "%s", val);
                else if (!strcmp(key, "event_id"))
                    snprintf(sc->event_id, sizeof(sc->event_id), "%s", val);
                else if (!strcmp(key, "expect"))
                    snprintf(sc->expect, sizeof(sc->expect), "%s", val);
                else if (!strcmp(key, "name"))
                    snprintf(sc->name, sizeof(sc->name), "%s", val);
                else
                    goto bad;
            } else {
                goto bad;
            }
        } else if (mode == REQ) {
            if (line[0] == '\0')
                ;
            else if (!ex->request_line[0])
                snprintf(ex->request_line, sizeof(ex->request_line), "%s", line);
            else if (ex->nheaders < MAX_HEADERS)
                snprintf(ex->headers[ex->nheaders++], 256, "%s", line);
            else
                goto bad;
        } else { /* RESP: keep lines verbatim */
            size_t l = strlen(line);
            if (resp_len + l + 2 > resp_cap) {
                resp_cap = (resp_len + l + 2) * 2;
                char *n = st_realloc(ex->response, resp_cap);
                if (!n)
                    goto bad;
                ex->response = n;
            }
            memcpy(ex->response + resp_len, line, l);
            resp_len += l;
            ex->response[resp_len++] = '\n';
            ex->response[resp_len] = '\0';
        }
        line = nl ? nl + 1 : NULL;
    }
    st_free(data);
    if (!sc->client[0] || !sc->expect[0] || sc->calls < 1)
        return -EINVAL;
    return 0;
bad:
    st_free(data);
    script_free(sc);
    return -EINVAL;
}

/* Reads one request head (up to the blank line). */
static int read_head(int fd, char *buf, size_t size) {
    size_t len = 0;
    while (len + 1 < size) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) != 1)
            return -ETIMEDOUT;
        ssize_t n = read(fd, buf + len, size - 1 - len);
        if (n <= 0)
            return -ECONNRESET;
        len += (size_t)n;
        buf[len] = '\0';
        if (strstr(buf, "\r\n\r\n"))
            return 0;
    }
    return -EFBIG;
}

/* Value of header `name` in a raw head, or NULL. Copies into val. */
static const char *head_value(const char *head, const char *name, char *val, size_t size) {
    size_t nl = strlen(name);
    for (const char *l = strstr(head, "\r\n"); l && l[2]; l = strstr(l + 2, "\r\n")) {
        const char *h = l + 2;
        if (strncasecmp(h, name, nl) == 0 && h[nl] == ':') {
            const char *v = h + nl + 1;
            while (*v == ' ')
                v++;
            const char *e = strstr(v, "\r\n");
            snprintf(val, size, "%.*s", (int)(e - v), v);
            return val;
        }
    }
    return NULL;
}

/* Checks a request against the exchange; writes the first mismatch into err. */
static bool matches(const struct exchange *ex, const char *head, char *err, size_t size) {
    const char *e = strstr(head, "\r\n");
    if ((size_t)(e - head) != strlen(ex->request_line) ||
        strncmp(head, ex->request_line, (size_t)(e - head)) != 0) {
        snprintf(err, size, "request line '%.*s', expected '%s'", (int)(e - head), head,
                 ex->request_line);
        return false;
    }
    for (int i = 0; i < ex->nheaders; i++) {
        char val[512];
        const char *h = ex->headers[i];
        if (h[0] == '!') {
            if (head_value(head, h + 1, val, sizeof(val))) {
                snprintf(err, size, "header '%s' must be absent", h + 1);
                return false;
            }
            continue;
        }
        const char *colon = strchr(h, ':');
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)(colon - h), h);
        const char *want = colon + 1;
        while (*want == ' ')
            want++;
        if (!head_value(head, name, val, sizeof(val)) || strcmp(val, want) != 0) {
            snprintf(err, size, "header '%s': got '%s', expected '%s'", name,
                     head_value(head, name, val, sizeof(val)) ? val : "(absent)", want);
            return false;
        }
    }
    return true;
}

/* Sends the scripted response: head lines with \r\n, Content-Length and Connection: close. */
static void send_response(int fd, const char *raw) {
    const char *sep = strstr(raw, "\n\n");
    size_t head_len = sep ? (size_t)(sep - raw) : strlen(raw);
    const char *body = sep ? sep + 2 : "";
    size_t body_len = strlen(body);
    if (body_len > 0 && body[body_len - 1] == '\n')
        body_len--; /* the file's last newline is not part of the body */
    char out[16384];
    size_t o = 0;
    for (size_t i = 0; i < head_len && o + 2 < sizeof(out); i++) {
        if (raw[i] == '\n')
            out[o++] = '\r';
        out[o++] = raw[i];
    }
    o += (size_t)snprintf(out + o, sizeof(out) - o,
                          "\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", body_len);
    if (o + body_len < sizeof(out)) {
        memcpy(out + o, body, body_len);
        o += body_len;
    }
    for (size_t w = 0; w < o;) {
        ssize_t n = write(fd, out + w, o - w);
        if (n <= 0)
            break;
        w += (size_t)n;
    }
}

static void *server_main(void *arg) {
    struct server *s = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = s->lfd, .events = POLLIN},
                              {.fd = s->stop_pipe[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0 || (p[1].revents & POLLIN))
            break;
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        char head[16384], err[512];
        if (read_head(fd, head, sizeof(head)) < 0) {
            close(fd);
            continue;
        }
        if (s->next >= s->sc->nex) {
            if (!s->error[0])
                snprintf(s->error, sizeof(s->error), "unexpected request %d: %.*s", s->next + 1,
                         (int)(strstr(head, "\r\n") - head), head);
            send_response(fd, "HTTP/1.1 500 Unexpected\n\n");
            close(fd);
            continue;
        }
        const struct exchange *ex = &s->sc->ex[s->next++];
        if (!matches(ex, head, err, sizeof(err))) {
            if (!s->error[0])
                snprintf(s->error, sizeof(s->error), "request %d: %s", s->next, err);
            send_response(fd, "HTTP/1.1 500 Mismatch\n\n");
            close(fd);
        } else if (ex->hang) {
            s->hung[s->nhung++] = fd;
        } else {
            send_response(fd, ex->response ? ex->response : "");
            close(fd);
        }
    }
    return NULL;
}

static int server_start(struct server *s, struct script *sc) {
    memset(s, 0, sizeof(*s));
    s->sc = sc;
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
        listen(s->lfd, 16) < 0 || getsockname(s->lfd, (struct sockaddr *)&a, &al) < 0 ||
        pipe(s->stop_pipe) < 0)
        return -errno;
    s->port = ntohs(a.sin_port);
    return -pthread_create(&s->thread, NULL, server_main, s);
}

static void server_stop(struct server *s) {
    if (write(s->stop_pipe[1], "x", 1) != 1)
        return;
    pthread_join(s->thread, NULL);
    for (int i = 0; i < s->nhung; i++)
        close(s->hung[i]);
    close(s->lfd);
    close(s->stop_pipe[0]);
    close(s->stop_pipe[1]);
}

static const struct {
    const char *name;
    int value;
} errnames[] = {{"ETIMEDOUT", -ETIMEDOUT}, {"ECONNREFUSED", -ECONNREFUSED},
                {"EAGAIN", -EAGAIN},       {"EACCES", -EACCES},
                {"EBADMSG", -EBADMSG},     {"EPROTO", -EPROTO},
                {"EINVAL", -EINVAL},       {"ENOENT", -ENOENT},
                {"EIO", -EIO},             {"EFBIG", -EFBIG},
                {"EOPNOTSUPP", -EOPNOTSUPP}};

/* Runs one script; returns 0 on pass, writes why not into why. */
static int run_script(struct script *sc, char *why, size_t size) {
    struct server srv;
    int r = server_start(&srv, sc);
    if (r < 0) {
        snprintf(why, size, "server: %s", strerror(-r));
        return 1;
    }
    char ep[64];
    snprintf(ep, sizeof(ep), "http://127.0.0.1:%u", srv.port);
    struct cloud_notice_config cfg = {.endpoint = ep, .timeout_ms = sc->timeout_ms,
                                      .token_ttl = sc->token_ttl,
                                      .vm_name = sc->vm_name[0] ? sc->vm_name : NULL};
    struct cloud_notice_client *c = NULL;
    char got[512] = "";
    r = cloud_notice_client_new(sc->client, &cfg, &c);
    if (r < 0) {
        snprintf(why, size, "client: %s", strerror(-r));
        server_stop(&srv);
        return 1;
    }
    for (int i = 0; i < sc->calls; i++) {
        struct cloud_notice n;
        struct cloud_identity id;
        if (strcmp(sc->call, "identity") == 0)
            r = cloud_notice_client_identity(c, &id);
        else if (strcmp(sc->call, "ack") == 0)
            r = cloud_notice_client_ack(c, sc->event_id);
        else
            r = cloud_notice_client_poll(c, &n);
        if (r < 0) {
            snprintf(got, sizeof(got), "error %d", r);
            for (size_t k = 0; k < ST_ARRAY_SIZE(errnames); k++)
                if (errnames[k].value == r)
                    snprintf(got, sizeof(got), "error %s", errnames[k].name);
        } else if (strcmp(sc->call, "ack") == 0) {
            snprintf(got, sizeof(got), "ok");
        } else if (strcmp(sc->call, "identity") == 0) {
            snprintf(got, sizeof(got), "identity %s %s %s", id.instance_id, id.instance_type,
                     id.zone);
        } else if (r == 0) {
            snprintf(got, sizeof(got), "none");
        } else {
            snprintf(got, sizeof(got), "notice %s %.0f%s%s", cloud_notice_kind_name(n.kind),
                     n.time, n.event_id[0] ? " " : "", n.event_id);
        }
    }
    cloud_notice_client_free(c);
    server_stop(&srv);
    if (srv.error[0]) {
        snprintf(why, size, "%s", srv.error);
        return 1;
    }
    if (srv.next != sc->nex) {
        snprintf(why, size, "%d of %d scripted requests were made", srv.next, sc->nex);
        return 1;
    }
    if (strcmp(got, sc->expect) != 0) {
        snprintf(why, size, "got '%s', expected '%s'", got, sc->expect);
        return 1;
    }
    return 0;
}

static int only_tests(const struct dirent *d) {
    return strncmp(d->d_name, "test", 4) == 0;
}

int main(int argc, char **argv) {
    const char *src = getenv("SPOTTRAIN_SRCDIR");
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/tests/integration/cloud/data", src ? src : ".");
    struct dirent **names = NULL;
    int n = scandir(dir, &names, only_tests, alphasort);
    if (n <= 0) {
        fprintf(stderr, "no data files in '%s'\n", dir);
        return n < 0 ? 1 : TEST_SKIP;
    }
    int failed = 0, ran = 0;
    for (int i = 0; i < n; i++) {
        bool want = argc < 2;
        for (int a = 1; a < argc; a++)
            want |= strcmp(argv[a], names[i]->d_name) == 0;
        if (want) {
            char path[2048], why[1200] = "";
            snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name);
            struct script sc;
            memset(&sc, 0, sizeof(sc));
            int fail;
            if (script_load(path, &sc) < 0) {
                snprintf(why, sizeof(why), "cannot parse '%s'", path);
                fail = 1;
            } else {
                fail = run_script(&sc, why, sizeof(why));
                script_free(&sc);
            }
            ran++;
            failed += fail;
            printf("%s %d - %s (%s)\n", fail ? "not ok" : "ok", i + 1, names[i]->d_name,
                   sc.name);
            if (fail)
                fprintf(stderr, "  %s: %s\n", names[i]->d_name, why);
        }
        free(names[i]);
    }
    free(names);
    printf("# %d passed, %d failed, 0 skipped\n", ran - failed, failed);
    return failed ? 1 : 0;
}
