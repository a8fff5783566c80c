/* fuzz-imds.c: libFuzzer target for the answers of the instance metadata services (AWS IMDSv2,
 * GCE metadata, Azure Scheduled Events) as the worker-side notice clients read them.
 *
 * The input has the format of tests/integration/cloud/data/testNNN (so those fixtures are the
 * seeds): a "client aws|gcp|azure" line, then "%%response" blocks, each a raw HTTP response
 * (status line, headers, blank line, body; "%%request" blocks are skipped: what we send is
 * checked by test-notice-data, not here). A loopback server thread in this process answers
 * the client's requests with those responses in order, closing the connection after each
 * (and at once when none is left); the real client (libcurl, the same code a worker runs)
 * then polls and asks for the identity. Any answer must give a notice, none, or a negative
 * errno from the documented set, never a crash, leak or undefined behaviour. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cloud.h"
#include "fuzz.h"

#define MAX_RESPONSES 8
#define RESP_MAX 20000

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char responses[MAX_RESPONSES][RESP_MAX];
static size_t resp_len[MAX_RESPONSES];
static int nresp, next_resp;
static int listen_fd = -1;
static char endpoint[64];

/* Serves one response per connection, in order. */
static void *server(void *arg) {
    (void)arg;
    for (;;) {
        int fd = accept(listen_fd, NULL, NULL);
        if (fd < 0)
            continue;
        char req[8192];
        size_t have = 0;
        while (have < sizeof(req) - 1) { /* requests carry no body: read to the blank line */
            ssize_t n = recv(fd, req + have, sizeof(req) - 1 - have, 0);
            if (n <= 0)
                break;
            have += (size_t)n;
            req[have] = '\0';
            if (strstr(req, "\r\n\r\n"))
                break;
        }
        pthread_mutex_lock(&lock);
        int k = next_resp < nresp ? next_resp++ : -1;
        pthread_mutex_unlock(&lock);
        if (k >= 0) {
            size_t off = 0;
            while (off < resp_len[k]) {
                ssize_t n = send(fd, responses[k] + off, resp_len[k] - off, MSG_NOSIGNAL);
                if (n <= 0)
                    break;
                off += (size_t)n;
            }
        }
        close(fd);
    }
    return NULL;
}

/* Copies a response block, turning the head's line ends into CRLF and adding
 * "Connection: close" so the client reads the body to the end of the connection. */
static void add_response(const char *p, size_t n) {
    if (nresp == MAX_RESPONSES)
        return;
    char *o = responses[nresp];
    size_t k = 0;
    const char *blank = NULL;
    for (size_t i = 0; i + 1 < n; i++)
        if (p[i] == '\n' && p[i + 1] == '\n') {
            blank = p + i;
            break;
        }
    size_t head = blank ? (size_t)(blank - p) : n;
    for (size_t i = 0; i < head && k + 2 < RESP_MAX; i++) {
        if (p[i] == '\n')
            o[k++] = '\r';
        o[k++] = p[i];
    }
    const char *extra = "\r\nConnection: close\r\n\r\n";
    if (k + strlen(extra) < RESP_MAX) {
        memcpy(o + k, extra, strlen(extra));
        k += strlen(extra);
    }
    if (blank) {
        size_t body = n - head - 2;
        if (k + body > RESP_MAX)
            body = RESP_MAX - k;
        memcpy(o + k, blank + 2, body);
        k += body;
    }
    resp_len[nresp++] = k;
}

/* Splits the input into its client kind and response blocks. */
static const char *parse(const uint8_t *data, size_t size) {
    const char *p = (const char *)data, *end = p + size;
    const char *kind = "aws";
    if (size >= 7 && memmem(p, size, "client gcp", 10))
        kind = "gcp";
    else if (size >= 7 && memmem(p, size, "client azure", 12))
        kind = "azure";
    nresp = next_resp = 0;
    const char *at = p;
    while (at < end) {
        const char *r = memmem(at, (size_t)(end - at), "%%response\n", 11);
        if (!r)
            break;
        r += 11;
        const char *stop = memmem(r, (size_t)(end - r), "\n%%", 3);
        size_t n = stop ? (size_t)(stop - r) + 1 : (size_t)(end - r);
        add_response(r, n);
        at = r + n;
    }
    return kind;
}

static bool known_error(int r) {
    static const int ok[] = {-ETIMEDOUT, -ECONNREFUSED, -ECONNRESET, -EAGAIN, -EACCES, -EINVAL,
                             -ENOENT, -EBADMSG, -EPROTO, -EFBIG, -EIO, -ENOMEM};
    for (size_t i = 0; i < ST_ARRAY_SIZE(ok); i++)
        if (r == ok[i])
            return true;
    return false;
}

static int one(const uint8_t *data, size_t size) {
    pthread_mutex_lock(&lock);
    const char *kind = parse(data, size);
    pthread_mutex_unlock(&lock);
    struct cloud_notice_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.endpoint = endpoint;
    cfg.timeout_ms = 5000;
    cfg.vm_name = "vm-1";
    struct cloud_notice_client *c = NULL;
    int r = cloud_notice_client_new(kind, &cfg, &c);
    if (r < 0) {
        FUZZ_CHECK(r == -ENOMEM);
        return r;
    }
    struct cloud_notice n;
    memset(&n, 0, sizeof(n));
    int pr = cloud_notice_client_poll(c, &n);
    FUZZ_CHECK(pr == 0 || pr == 1 || known_error(pr));
    if (pr == 1)
        FUZZ_CHECK(n.kind != CLOUD_NOTICE_NONE && cloud_notice_kind_name(n.kind) != NULL);
    struct cloud_identity id;
    int ir = cloud_notice_client_identity(c, &id);
    FUZZ_CHECK(ir >= 0 || known_error(ir));
    if (ir >= 0)
        FUZZ_CHECK(memchr(id.instance_id, '\0', sizeof(id.instance_id)) &&
                   memchr(id.zone, '\0', sizeof(id.zone)));
    cloud_notice_client_free(c);
    /* The replay must be deterministic whatever the server was left holding. */
    return pr < 0 ? pr : ir < 0 ? ir : pr;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    st_log_level_max = -1;
    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
        listen(listen_fd, 16) < 0 || getsockname(listen_fd, (struct sockaddr *)&a, &alen) < 0) {
        perror("fuzz-imds: loopback listener");
        abort();
    }
    snprintf(endpoint, sizeof(endpoint), "http://127.0.0.1:%u", ntohs(a.sin_port));
    pthread_t t;
    if (pthread_create(&t, NULL, server, NULL) != 0)
        abort();
    pthread_detach(t);
    return 0;
}

FUZZ_TARGET(one)
