/* test-imds-client.c: the AWS notice client against the sim's own IMDSv2 server, and the
 * whole path end to end: the sim provider starts a worker process, the worker finds its
 * endpoint through AWS_EC2_METADATA_SERVICE_ENDPOINT and polls it with the libcurl client,
 * sees the notice the trace's removal posts, and is SIGKILLed at the scaled deadline.
 * Time is injected everywhere; the test waits only on a FIFO and a pidfd. */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cloud.h"
#include "common.h"
#include "test.h"

#define WALL0 1790000000.0

static double fake_now;
static double fake_clock(void *ud) {
    (void)ud;
    return fake_now;
}
static double wall_clock(void *ud) {
    (void)ud;
    return WALL0;
}

static struct cloud_imds_server *server(void) {
    struct cloud_imds_server_config cfg = {.instance_id = "i-0abc", .zone = "eu-west-3c",
                                           .instance_type = "g5.xlarge", .clock = fake_clock};
    struct cloud_imds_server *s = NULL;
    return cloud_imds_server_new(&cfg, &s) < 0 ? NULL : s;
}

static int test_token_reuse_and_refresh(void) {
    fake_now = 0;
    struct cloud_imds_server *s = server();
    ASSERT_TRUE(s);
    char ep[64];
    ASSERT_OK(cloud_imds_server_endpoint(s, ep, sizeof(ep)));
    struct cloud_notice_config cfg = {.endpoint = ep, .token_ttl = 60, .clock = fake_clock};
    struct cloud_notice_client *c = NULL;
    ASSERT_OK(cloud_notice_client_new("aws", &cfg, &c));
    struct cloud_notice n;
    for (int i = 0; i < 5; i++) {
        fake_now = i * 5.0;
        ASSERT_EQ(cloud_notice_client_poll(c, &n), 0);
    }
    unsigned puts, gets;
    cloud_imds_server_counts(s, &puts, &gets);
    ASSERT_EQ(puts, 1); /* one token for all five polls */
    ASSERT_EQ(gets, 10);
    /* Within min(15, ttl/4) of expiry the client renews before asking. */
    fake_now = 46;
    ASSERT_EQ(cloud_notice_client_poll(c, &n), 0);
    cloud_imds_server_counts(s, &puts, &gets);
    ASSERT_EQ(puts, 2);
    struct cloud_identity id;
    ASSERT_OK(cloud_notice_client_identity(c, &id));
    ASSERT_STREQ(id.instance_id, "i-0abc");
    ASSERT_STREQ(id.instance_type, "g5.xlarge");
    ASSERT_STREQ(id.zone, "eu-west-3c");
    cloud_notice_client_free(c);

    /* A client whose clock lags the server's: the server expires the token, answers 401,
     * and the client gets a new one and retries. */
    struct cloud_notice_config cfg2 = {.endpoint = ep, .token_ttl = 60};
    ASSERT_OK(cloud_notice_client_new("aws", &cfg2, &c)); /* real clock: never renews */
    ASSERT_EQ(cloud_notice_client_poll(c, &n), 0);
    fake_now += 1000; /* server-side expiry */
    unsigned before;
    cloud_imds_server_counts(s, &before, &gets);
    ASSERT_OK(cloud_imds_server_set_notice(s, "terminate", WALL0 + 120));
    ASSERT_EQ(cloud_notice_client_poll(c, &n), 1);
    ASSERT_EQ(n.kind, CLOUD_NOTICE_TERMINATE);
    ASSERT_NEAR(n.time, WALL0 + 120, 0, 0);
    cloud_imds_server_counts(s, &puts, &gets);
    ASSERT_EQ(puts, before + 1);

    /* Throttling is reported, then the next poll works. */
    ASSERT_OK(cloud_imds_server_inject(s, 503, 1));
    ASSERT_ERR(cloud_notice_client_poll(c, &n), -EAGAIN);
    ASSERT_EQ(cloud_notice_client_poll(c, &n), 1);
    cloud_notice_client_free(c);
    cloud_imds_server_free(s);

    /* Nobody listening any more. */
    ASSERT_OK(cloud_notice_client_new("aws", &cfg2, &c));
    ASSERT_ERR(cloud_notice_client_poll(c, &n), -ECONNREFUSED);
    cloud_notice_client_free(c);
    return 0;
}

static int test_client_config(void) {
    struct cloud_notice_client *c = NULL;
    struct cloud_notice_config cfg = {0};
    ASSERT_ERR(cloud_notice_client_new("ibm", &cfg, &c), -ENOENT);
    cfg.endpoint = "ftp://127.0.0.1";
    ASSERT_ERR(cloud_notice_client_new("aws", &cfg, &c), -EINVAL);
    cfg.endpoint = "http://bad host";
    ASSERT_ERR(cloud_notice_client_new("aws", &cfg, &c), -EINVAL);
    cfg.endpoint = NULL;
    cfg.token_ttl = 21601;
    ASSERT_ERR(cloud_notice_client_new("aws", &cfg, &c), -EINVAL);
    cfg.token_ttl = 0;
    /* Endpoints from the environment, as the SDKs read them. */
    setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:1338/", 1);
    ASSERT_OK(cloud_notice_client_new("aws", &cfg, &c));
    ASSERT_STREQ(cloud_notice_client_endpoint(c), "http://127.0.0.1:1338");
    cloud_notice_client_free(c);
    unsetenv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    ASSERT_OK(cloud_notice_client_new("aws", &cfg, &c));
    ASSERT_STREQ(cloud_notice_client_endpoint(c), "http://169.254.169.254");
    cloud_notice_client_free(c);
    setenv("GCE_METADATA_HOST", "127.0.0.1:8080", 1);
    ASSERT_OK(cloud_notice_client_new("gcp", &cfg, &c));
    ASSERT_STREQ(cloud_notice_client_endpoint(c), "http://127.0.0.1:8080");
    cloud_notice_client_free(c);
    unsetenv("GCE_METADATA_HOST");
    ASSERT_OK(cloud_notice_client_new("gcp", &cfg, &c));
    ASSERT_STREQ(cloud_notice_client_endpoint(c), "http://metadata.google.internal");
    cloud_notice_client_free(c);
    ASSERT_OK(cloud_notice_client_new("azure", &cfg, &c));
    ASSERT_STREQ(cloud_notice_client_endpoint(c), "http://169.254.169.254");
    ASSERT_ERR(cloud_notice_client_poll(c, NULL), -EINVAL);
    cloud_notice_client_free(c);
    ASSERT_TRUE(cloud_notice_client_free(NULL) == NULL);
    return 0;
}

/* ---- end to end ------------------------------------------------------------------------ */

struct e2e {
    char fifo[256];
};

static int spawn_watch(void *ud, const struct cloud_instance *inst, struct cloud_spawn_cmd *cmd) {
    struct e2e *e = ud;
    (void)inst;
    cmd->argv[0] = getenv("CLOUD_TEST_WORKER");
    cmd->argv[1] = "watch";
    cmd->argv[2] = e->fifo;
    return 0;
}

/* Reads one line from fd (10 s at most). */
static int read_line(int fd, char *buf, size_t size) {
    size_t len = 0;
    while (len + 1 < size) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 10000) != 1)
            return -ETIMEDOUT;
        char ch;
        ssize_t n = read(fd, &ch, 1);
        if (n <= 0)
            return -EPIPE;
        if (ch == '\n') {
            buf[len] = '\0';
            return 0;
        }
        buf[len++] = ch;
    }
    return -EFBIG;
}

static int wait_dead(pid_t pid) {
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0)
        return errno == ESRCH ? 0 : -errno;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int r = poll(&pfd, 1, 10000);
    close(fd);
    return r == 1 ? 0 : -ETIMEDOUT;
}

static int test_end_to_end(void) {
    if (!getenv("CLOUD_TEST_WORKER"))
        return TEST_SKIP;
    struct e2e e;
    char dir[] = "/tmp/spottrain-cloud-e2e-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir));
    snprintf(e.fifo, sizeof(e.fifo), "%s/fifo", dir);
    ASSERT_EQ(mkfifo(e.fifo, 0600), 0);
    /* Opened read-write so open() does not block before the worker opens its end. */
    int fd = open(e.fifo, O_RDWR | O_CLOEXEC);
    ASSERT_TRUE(fd >= 0);

    struct cloud_event evs[2] = {{.t = 0, .action = CLOUD_EVENT_ADD, .node = "p3-node-1"},
                                 {.t = 60, .action = CLOUD_EVENT_REMOVE, .node = "p3-node-1"}};
    struct cloud_config cfg;
    cloud_config_init(&cfg);
    cfg.events = evs;
    cfg.nevents = 2;
    cfg.time_scale = 2.0 / 60; /* one trace minute in 2 s of caller time */
    cfg.notice_seconds = 120;
    cfg.rebalance_lead = 30;
    cfg.spawn = spawn_watch;
    cfg.spawn_userdata = &e;
    cfg.wall_clock = wall_clock;
    snprintf(cfg.instance_type, sizeof(cfg.instance_type), "p3.2xlarge");
    snprintf(cfg.zones[0], sizeof(cfg.zones[0]), "us-east-1d");
    struct cloud_provider *p = NULL;
    ASSERT_OK(cloud_provider_new("sim", &cfg, &p));
    ASSERT_OK(cloud_provider_start(p, 0));
    struct cloud_signal sig[8];
    size_t n;
    ASSERT_OK(cloud_provider_poll(p, 0, sig, 8, &n));
    ASSERT_EQ(n, 1);
    ASSERT_EQ(sig[0].kind, CLOUD_SIG_GRANTED);
    pid_t pid = sig[0].pid;
    char want[256], line[256];
    snprintf(want, sizeof(want), "ready %s p3.2xlarge us-east-1d", sig[0].instance);
    ASSERT_OK(read_line(fd, line, sizeof(line)));
    ASSERT_STREQ(line, want);

    /* Rebalance hint at trace second 30 = caller second 1. */
    ASSERT_OK(cloud_provider_poll(p, 1.0, sig, 8, &n));
    ASSERT_EQ(n, 1);
    ASSERT_EQ(sig[0].kind, CLOUD_SIG_REBALANCE);
    ASSERT_OK(read_line(fd, line, sizeof(line)));
    snprintf(want, sizeof(want), "rebalance %.0f", WALL0 + 1.0);
    ASSERT_STREQ(line, want);

    /* Removal at trace second 60 = caller second 2; kill at 2 + 120 * 2/60 = 6. */
    ASSERT_OK(cloud_provider_poll(p, 2.0, sig, 8, &n));
    ASSERT_EQ(n, 1);
    ASSERT_EQ(sig[0].kind, CLOUD_SIG_NOTICE);
    ASSERT_NEAR(sig[0].deadline, 6.0, 1e-9, 0);
    ASSERT_OK(read_line(fd, line, sizeof(line)));
    snprintf(want, sizeof(want), "notice terminate %.0f", WALL0 + 6.0);
    ASSERT_STREQ(line, want);
    ASSERT_EQ(kill(pid, 0), 0);

    ASSERT_OK(cloud_provider_poll(p, 6.0, sig, 8, &n));
    ASSERT_EQ(n, 1);
    ASSERT_EQ(sig[0].kind, CLOUD_SIG_LOST);
    ASSERT_EQ(sig[0].reason, CLOUD_LOSS_PREEMPTED);
    ASSERT_OK(wait_dead(pid));
    ASSERT_OK(cloud_provider_poll(p, 6.0, sig, 8, &n));
    ASSERT_EQ(n, 1);
    ASSERT_EQ(sig[0].kind, CLOUD_SIG_EXITED);
    ASSERT_TRUE(WIFSIGNALED(sig[0].status) && WTERMSIG(sig[0].status) == SIGKILL);
    cloud_provider_free(p);
    close(fd);
    unlink(e.fifo);
    rmdir(dir);
    return 0;
}


/* curl torture for the client: the nth allocation fails; every call fails cleanly or works. */
static int test_alloc_failures(void) {
    struct cloud_imds_server *s = server();
    ASSERT_TRUE(s);
    ASSERT_OK(cloud_imds_server_set_notice(s, "terminate", WALL0));
    char ep[64];
    ASSERT_OK(cloud_imds_server_endpoint(s, ep, sizeof(ep)));
    struct cloud_notice_config cfg = {.endpoint = ep};
    int clean = 0;
    for (long nth = 1; nth <= 30; nth++) {
        struct cloud_notice_client *c = NULL;
        struct cloud_notice n;
        st_alloc_fail_after(nth);
        int r = cloud_notice_client_new("aws", &cfg, &c);
        if (r == 0)
            r = cloud_notice_client_poll(c, &n);
        st_alloc_fail_after(0);
        if (r < 0 && r != -ENOMEM)
            TEST_FAIL_("allocation %ld failing gave %d", nth, r);
        clean += r == 1;
        cloud_notice_client_free(c);
    }
    ASSERT_GT(clean, 0);
    cloud_imds_server_free(s);
    return 0;
}

TEST_MAIN(TEST(test_token_reuse_and_refresh), TEST(test_client_config), TEST(test_end_to_end),
          TEST(test_alloc_failures))
