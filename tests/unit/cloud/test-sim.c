/* test-sim.c: the sim provider driven by an injected clock. Adds start real helper processes
 * (sim-worker) at the scaled times, removes post the notice and kill at the scaled deadline,
 * the unannounced fraction follows the seed, exits are reaped and reported, and capacity
 * follows acquire/release. The only waiting is for a SIGKILLed process to become a zombie,
 * done on a pidfd, never with a sleep. */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cloud.h"
#include "common.h"
#include "test.h"

#define WALL0 1790000000.0

struct spawn_ctx {
    const char *mode;
    const char *arg;
    const char *fail_node; /* callback fails for this node */
    const char *program;   /* overrides the worker path */
    int calls;
};

static int spawn_cb(void *ud, const struct cloud_instance *inst, struct cloud_spawn_cmd *cmd) {
    struct spawn_ctx *c = ud;
    c->calls++;
    if (c->fail_node && strcmp(inst->node, c->fail_node) == 0)
        return -EIO;
    cmd->argv[0] = c->program ? c->program : getenv("CLOUD_TEST_WORKER");
    cmd->argv[1] = c->mode ? c->mode : "sleep";
    cmd->argv[2] = c->arg;
    cmd->env[0] = "CLOUD_TEST_EXTRA=yes";
    cmd->env[1] = "SPOTTRAIN_NODE=overridden-by-provider";
    return 0;
}

static double wall_clock(void *ud) {
    (void)ud;
    return WALL0;
}

static int nlogs;
static void count_log(void *ud, int level, const char *msg) {
    (void)ud;
    (void)msg;
    if (level <= ST_LOG_WARN)
        nlogs++;
}

static void base_config(struct cloud_config *cfg, struct spawn_ctx *sc,
                        const struct cloud_event *ev, size_t nev) {
    cloud_config_init(cfg);
    cfg->events = ev;
    cfg->nevents = nev;
    cfg->spawn = spawn_cb;
    cfg->spawn_userdata = sc;
    cfg->wall_clock = wall_clock;
    cfg->log = count_log;
    cfg->price_per_hour = 0.918;
}

#define MAXSIG 256
struct sigs {
    struct cloud_signal s[MAXSIG];
    size_t n;
};

static int poll_all(struct cloud_provider *p, double now, struct sigs *out) {
    out->n = 0;
    for (;;) {
        size_t n = 0;
        int r = cloud_provider_poll(p, now, out->s + out->n, 4, &n);
        if (r < 0)
            return r;
        out->n += n;
        if (n < 4 || out->n + 4 > MAXSIG)
            return 0;
    }
}

static size_t count_kind(const struct sigs *s, enum cloud_signal_kind k) {
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        n += s->s[i].kind == k;
    return n;
}

static const struct cloud_signal *find_sig(const struct sigs *s, enum cloud_signal_kind k,
                                           const char *node) {
    for (size_t i = 0; i < s->n; i++)
        if (s->s[i].kind == k && (!node || strcmp(s->s[i].node, node) == 0))
            return &s->s[i];
    return NULL;
}

/* Waits (pidfd, 10 s at most) until pid has exited; it stays a zombie until reaped. */
static int wait_dead(pid_t pid) {
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0)
        return errno == ESRCH ? 0 : -errno;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int r = poll(&pfd, 1, 10000);
    close(fd);
    return r == 1 ? 0 : -ETIMEDOUT;
}

/* Reads VAR from /proc/pid/environ into buf, once. */
static int proc_env_once(pid_t pid, const char *var, char *buf, size_t size) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/environ", (int)pid);
    char *data = NULL;
    size_t len = 0;
    /* The process may not have exec'd yet; environ is set by posix_spawn before exec. */
    int r = st_read_file(path, 1 << 20, &data, &len);
    if (r < 0)
        return r;
    size_t vl = strlen(var);
    r = -ENOENT;
    for (size_t off = 0; off < len; off += strlen(data + off) + 1) {
        if (strncmp(data + off, var, vl) == 0 && data[off + vl] == '=') {
            snprintf(buf, size, "%s", data + off + vl + 1);
            r = 0;
            break;
        }
    }
    st_free(data);
    return r;
}

/* posix_spawn returns when the child's exec has replaced its memory, which is a moment
 * before the kernel records where the new environment lies; until then environ reads empty.
 * So retry until the exec has finished (bounded: 5 s). */
static int proc_env(pid_t pid, const char *var, char *buf, size_t size) {
    int r = -ENOENT;
    for (int i = 0; i < 5000 && r == -ENOENT; i++) {
        r = proc_env_once(pid, var, buf, size);
        if (r == -ENOENT) {
            struct timespec ts = {0, 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    return r;
}

static struct cloud_event ev(double t, enum cloud_event_action a, const char *node) {
    struct cloud_event e = {.t = t, .action = a};
    snprintf(e.node, sizeof(e.node), "%s", node);
    return e;
}

static int test_config_errors(void) {
    struct spawn_ctx sc = {0};
    struct cloud_event evs[2] = {ev(10, CLOUD_EVENT_ADD, "a"), ev(5, CLOUD_EVENT_ADD, "b")};
    struct cloud_config cfg;
    struct cloud_provider *p = NULL;
    base_config(&cfg, &sc, evs, 1);
    ASSERT_ERR(cloud_provider_new("openstack", &cfg, &p), -ENOENT); /* not registered */
    ASSERT_ERR(cloud_provider_new("gcp", &cfg, &p), -EINVAL);   /* no job spec */
    ASSERT_ERR(cloud_provider_new("azure", &cfg, &p), -EINVAL); /* no job spec */
    ASSERT_ERR(cloud_provider_new("aws", &cfg, &p), -EINVAL); /* no image, no job identity */
    ASSERT_ERR(cloud_provider_new(NULL, &cfg, &p), -EINVAL);
    cfg.spawn = NULL;
    ASSERT_ERR(cloud_provider_new("sim", &cfg, &p), -EINVAL);
    base_config(&cfg, &sc, evs, 1);
    cfg.time_scale = 0;
    ASSERT_ERR(cloud_provider_new("sim", &cfg, &p), -EINVAL);
    base_config(&cfg, &sc, evs, 1);
    cfg.unannounced = 1.5;
    ASSERT_ERR(cloud_provider_new("sim", &cfg, &p), -EINVAL);
    base_config(&cfg, &sc, evs, 1);
    cfg.notice_seconds = -1;
    ASSERT_ERR(cloud_provider_new("sim", &cfg, &p), -EINVAL);
    base_config(&cfg, &sc, evs, 2); /* out of order */
    ASSERT_ERR(cloud_provider_new("sim", &cfg, &p), -EINVAL);
    evs[1] = ev(20, CLOUD_EVENT_ADD, "");
    ASSERT_ERR(cloud_provider_new("sim", &cfg, &p), -EINVAL);
    memset(evs[1].node, 'x', sizeof(evs[1].node)); /* not NUL-terminated */
    ASSERT_ERR(cloud_provider_new("sim", &cfg, &p), -EINVAL);
    evs[1] = ev(20, (enum cloud_event_action)7, "b");
    ASSERT_ERR(cloud_provider_new("sim", &cfg, &p), -EINVAL);
    base_config(&cfg, &sc, NULL, 3); /* events missing */
    ASSERT_ERR(cloud_provider_new("sim", &cfg, &p), -EINVAL);
    ASSERT_TRUE(p == NULL);

    /* The fleet section of a spec. */
    struct st_spec spec;
    memset(&spec, 0, sizeof(spec));
    spec.fleet.time_scale = 2.0 / 60;
    spec.fleet.notice_seconds = 120;
    spec.fleet.unannounced = 0.25;
    spec.fleet.max = 8;
    spec.fleet.spot = true;
    spec.fleet.spot_price = 0.918;
    spec.fleet.nzones = 2;
    snprintf(spec.fleet.zones[0], 32, "us-east-1a");
    snprintf(spec.fleet.zones[1], 32, "us-east-1b");
    snprintf(spec.fleet.instance_type, 64, "p3.2xlarge");
    cloud_config_init(&cfg);
    ASSERT_OK(cloud_config_from_fleet(&cfg, &spec.fleet));
    ASSERT_NEAR(cfg.time_scale, 2.0 / 60, 0, 0);
    ASSERT_EQ(cfg.max_instances, 8);
    ASSERT_EQ(cfg.nzones, 2);
    ASSERT_STREQ(cfg.zones[1], "us-east-1b");
    ASSERT_STREQ(cfg.instance_type, "p3.2xlarge");
    ASSERT_NEAR(cfg.price_per_hour, 0.918, 0, 0);
    spec.fleet.unannounced = -0.1;
    ASSERT_ERR(cloud_config_from_fleet(&cfg, &spec.fleet), -EINVAL);
    spec.fleet.unannounced = 0;
    spec.fleet.time_scale = 0;
    ASSERT_ERR(cloud_config_from_fleet(&cfg, &spec.fleet), -EINVAL);

    /* Call-order errors. */
    base_config(&cfg, &sc, evs, 1);
    ASSERT_OK(cloud_provider_new("sim", &cfg, &p));
    ASSERT_STREQ(cloud_provider_name(p), "sim");
    size_t n;
    struct cloud_signal sig;
    ASSERT_ERR(cloud_provider_poll(p, 0, &sig, 1, &n), -ENOTCONN);
    ASSERT_OK(cloud_provider_start(p, 5));
    ASSERT_ERR(cloud_provider_start(p, 5), -EALREADY);
    ASSERT_ERR(cloud_provider_poll(p, 4, &sig, 1, &n), -EINVAL); /* time went backwards */
    ASSERT_ERR(cloud_provider_poll(p, 6, NULL, 1, &n), -EINVAL);
    ASSERT_ERR(cloud_provider_acquire(p, 0, 6), -EINVAL);
    ASSERT_ERR(cloud_provider_release(p, "i-nope", 6), -ENOENT);
    ASSERT_TRUE(cloud_provider_free(p) == NULL);
    ASSERT_TRUE(cloud_provider_free(NULL) == NULL);
    ASSERT_STREQ(cloud_provider_names()[0], "sim");
    ASSERT_STREQ(cloud_provider_names()[1], "aws");
    ASSERT_STREQ(cloud_provider_names()[2], "gcp");
    ASSERT_STREQ(cloud_provider_names()[3], "azure");
    ASSERT_STREQ(cloud_provider_names()[4], "kubernetes");
    ASSERT_TRUE(cloud_provider_names()[5] == NULL);
    return 0;
}

static int test_adds_spawn_at_scaled_times(void) {
    struct spawn_ctx sc = {0};
    struct cloud_event evs[] = {ev(0, CLOUD_EVENT_ADD, "a"), ev(0, CLOUD_EVENT_ADD, "b"),
                                ev(60, CLOUD_EVENT_ADD, "c")};
    struct cloud_config cfg;
    base_config(&cfg, &sc, evs, 3);
    cfg.time_scale = 0.01;
    cfg.nzones = 2;
    snprintf(cfg.zones[0], CLOUD_NAME_MAX, "us-east-1a");
    snprintf(cfg.zones[1], CLOUD_NAME_MAX, "us-east-1b");
    struct cloud_provider *p = NULL;
    ASSERT_OK(cloud_provider_new("sim", &cfg, &p));
    ASSERT_OK(cloud_provider_start(p, 100.0));
    struct sigs s;
    ASSERT_OK(poll_all(p, 100.0, &s));
    ASSERT_EQ(s.n, 2);
    ASSERT_EQ(count_kind(&s, CLOUD_SIG_GRANTED), 2);
    ASSERT_NEAR(s.s[0].at, 100.0, 0, 0);
    ASSERT_STREQ(s.s[0].node, "a");
    ASSERT_STREQ(s.s[1].node, "b");
    ASSERT_TRUE(strcmp(s.s[0].instance, s.s[1].instance) != 0);
    struct cloud_instance inst[4];
    size_t n = 0;
    ASSERT_OK(cloud_provider_instances(p, inst, 4, &n));
    ASSERT_EQ(n, 2);
    ASSERT_STREQ(inst[0].zone, "us-east-1a");
    ASSERT_STREQ(inst[1].zone, "us-east-1b");
    ASSERT_NEAR(inst[0].price_per_hour, 0.918, 0, 0);
    ASSERT_EQ(inst[0].state, CLOUD_INSTANCE_RUNNING);
    ASSERT_EQ(kill(inst[0].pid, 0), 0);
    /* The worker's environment points at its own endpoint. */
    char v[256];
    ASSERT_OK(proc_env(inst[0].pid, "AWS_EC2_METADATA_SERVICE_ENDPOINT", v, sizeof(v)));
    ASSERT_STREQ(v, inst[0].endpoint);
    ASSERT_OK(proc_env(inst[1].pid, "AWS_EC2_METADATA_SERVICE_ENDPOINT", v, sizeof(v)));
    ASSERT_STREQ(v, inst[1].endpoint);
    ASSERT_TRUE(strcmp(inst[0].endpoint, inst[1].endpoint) != 0);
    ASSERT_OK(proc_env(inst[0].pid, "SPOTTRAIN_NODE", v, sizeof(v)));
    ASSERT_STREQ(v, "a");
    ASSERT_OK(proc_env(inst[0].pid, "SPOTTRAIN_INSTANCE_ID", v, sizeof(v)));
    ASSERT_STREQ(v, inst[0].name);
    ASSERT_OK(proc_env(inst[0].pid, "CLOUD_TEST_EXTRA", v, sizeof(v)));
    ASSERT_STREQ(v, "yes");
    /* c arrives at trace second 60 = caller time 100.6. */
    ASSERT_NEAR(cloud_provider_next_deadline(p, 100.0), 100.6, 1e-9, 0);
    ASSERT_OK(poll_all(p, 100.59, &s));
    ASSERT_EQ(s.n, 0);
    ASSERT_OK(poll_all(p, 100.6, &s));
    ASSERT_EQ(s.n, 1);
    ASSERT_EQ(s.s[0].kind, CLOUD_SIG_GRANTED);
    ASSERT_STREQ(s.s[0].node, "c");
    ASSERT_OK(cloud_provider_instances(p, inst, 1, &n));
    ASSERT_EQ(n, 3); /* total, although only one fit */
    ASSERT_TRUE(cloud_provider_next_deadline(p, 100.6) < 0);
    ASSERT_EQ(sc.calls, 3);
    cloud_provider_free(p);
    return 0;
}

static int test_remove_notice_then_kill(void) {
    struct spawn_ctx sc = {0};
    struct cloud_event evs[] = {ev(0, CLOUD_EVENT_ADD, "a"), ev(60, CLOUD_EVENT_REMOVE, "a")};
    struct cloud_config cfg;
    base_config(&cfg, &sc, evs, 2);
    cfg.time_scale = 0.5;
    cfg.notice_seconds = 120;
    struct cloud_provider *p = NULL;
    ASSERT_OK(cloud_provider_new("sim", &cfg, &p));
    ASSERT_OK(cloud_provider_start(p, 0));
    struct sigs s;
    ASSERT_OK(poll_all(p, 0, &s));
    ASSERT_EQ(s.n, 1);
    pid_t pid = s.s[0].pid;
    struct cloud_instance inst;
    size_t n;
    ASSERT_OK(cloud_provider_instances(p, &inst, 1, &n));
    struct cloud_notice_config ncfg = {.endpoint = inst.endpoint};
    struct cloud_notice_client *nc = NULL;
    ASSERT_OK(cloud_notice_client_new("aws", &ncfg, &nc));
    struct cloud_notice notice;
    ASSERT_EQ(cloud_notice_client_poll(nc, &notice), 0);
    ASSERT_OK(poll_all(p, 29.99, &s));
    ASSERT_EQ(s.n, 0);
    ASSERT_OK(poll_all(p, 30, &s));
    ASSERT_EQ(s.n, 1);
    ASSERT_EQ(s.s[0].kind, CLOUD_SIG_NOTICE);
    ASSERT_NEAR(s.s[0].at, 30, 0, 0);
    ASSERT_NEAR(s.s[0].deadline, 90, 1e-9, 0); /* 30 + 120 * 0.5 */
    ASSERT_EQ(cloud_notice_client_poll(nc, &notice), 1);
    ASSERT_EQ(notice.kind, CLOUD_NOTICE_TERMINATE);
    ASSERT_NEAR(notice.time, WALL0 + 90, 0, 0);
    ASSERT_OK(cloud_provider_instances(p, &inst, 1, &n));
    ASSERT_EQ(n, 1);
    ASSERT_EQ(inst.state, CLOUD_INSTANCE_NOTICED);
    ASSERT_NEAR(cloud_provider_next_deadline(p, 30), 90, 1e-9, 0);
    ASSERT_OK(poll_all(p, 89.99, &s));
    ASSERT_EQ(s.n, 0);
    ASSERT_EQ(kill(pid, 0), 0); /* alive through the notice */
    ASSERT_OK(poll_all(p, 90, &s));
    ASSERT_EQ(s.n, 1);
    ASSERT_EQ(s.s[0].kind, CLOUD_SIG_LOST);
    ASSERT_EQ(s.s[0].reason, CLOUD_LOSS_PREEMPTED);
    ASSERT_NEAR(s.s[0].at, 90, 1e-9, 0);
    ASSERT_OK(cloud_provider_instances(p, &inst, 1, &n));
    ASSERT_EQ(n, 0);
    ASSERT_OK(wait_dead(pid));
    ASSERT_OK(poll_all(p, 90, &s));
    ASSERT_EQ(s.n, 1);
    ASSERT_EQ(s.s[0].kind, CLOUD_SIG_EXITED);
    ASSERT_TRUE(WIFSIGNALED(s.s[0].status) && WTERMSIG(s.s[0].status) == SIGKILL);
    ASSERT_EQ(s.s[0].pid, pid);
    ASSERT_TRUE(kill(pid, 0) < 0 && errno == ESRCH); /* reaped */
    /* The instance's endpoint is gone with it. */
    ASSERT_ERR(cloud_notice_client_poll(nc, &notice), -ECONNREFUSED);
    cloud_notice_client_free(nc);
    cloud_provider_free(p);
    return 0;
}

/* Runs 20 removals with the given fraction and seed; writes which nodes went unannounced. */
static int run_unannounced(double fraction, uint64_t seed, char pattern[21]) {
    struct spawn_ctx sc = {0};
    struct cloud_event evs[40];
    for (int i = 0; i < 20; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%02d", i);
        evs[i] = ev(0, CLOUD_EVENT_ADD, name);
        evs[20 + i] = ev(10.0 * (i + 1), CLOUD_EVENT_REMOVE, name);
    }
    struct cloud_config cfg;
    base_config(&cfg, &sc, evs, 40);
    cfg.unannounced = fraction;
    cfg.seed = seed;
    cfg.notice_seconds = 5;
    struct cloud_provider *p = NULL;
    if (cloud_provider_new("sim", &cfg, &p) < 0 || cloud_provider_start(p, 0) < 0)
        return -1;
    struct sigs s;
    memset(pattern, '-', 20);
    pattern[20] = '\0';
    int r = 0;
    for (int i = 1; i <= 20 && r == 0; i++) {
        r = poll_all(p, 10.0 * i, &s);
        for (size_t k = 0; k < s.n && r == 0; k++) {
            int node = atoi(s.s[k].node + 1);
            if (s.s[k].kind == CLOUD_SIG_LOST && s.s[k].reason == CLOUD_LOSS_UNANNOUNCED) {
                if (s.s[k].at != 10.0 * (node + 1) || pattern[node] != '-')
                    r = -1;
                pattern[node] = 'U';
            } else if (s.s[k].kind == CLOUD_SIG_NOTICE) {
                if (pattern[node] != '-')
                    r = -1;
                pattern[node] = 'N';
            }
        }
    }
    cloud_provider_free(p);
    return r;
}

static int count_char(const char *s, char c) {
    int n = 0;
    for (; *s; s++)
        n += *s == c;
    return n;
}

static int test_unannounced_seeded(void) {
    char a[21], b[21], c[21];
    ASSERT_OK(run_unannounced(0.25, 42, a));
    ASSERT_EQ(count_char(a, 'U'), 5); /* round(0.25 * 20) */
    ASSERT_EQ(count_char(a, 'N'), 15);
    ASSERT_OK(run_unannounced(0.25, 42, b));
    ASSERT_STREQ(a, b); /* same seed, same choice */
    bool differs = false;
    for (uint64_t seed = 1; seed <= 4 && !differs; seed++) {
        ASSERT_OK(run_unannounced(0.25, seed, c));
        ASSERT_EQ(count_char(c, 'U'), 5);
        differs = strcmp(a, c) != 0;
    }
    ASSERT_TRUE(differs);
    ASSERT_OK(run_unannounced(0, 42, c));
    ASSERT_EQ(count_char(c, 'U'), 0);
    ASSERT_OK(run_unannounced(1, 42, c));
    ASSERT_EQ(count_char(c, 'U'), 20);
    return 0;
}

static int test_unannounced_has_no_notice(void) {
    struct spawn_ctx sc = {0};
    struct cloud_event evs[] = {ev(0, CLOUD_EVENT_ADD, "a"), ev(60, CLOUD_EVENT_REMOVE, "a")};
    struct cloud_config cfg;
    base_config(&cfg, &sc, evs, 2);
    cfg.unannounced = 1;
    struct cloud_provider *p = NULL;
    ASSERT_OK(cloud_provider_new("sim", &cfg, &p));
    ASSERT_OK(cloud_provider_start(p, 0));
    struct sigs s;
    ASSERT_OK(poll_all(p, 59, &s));
    pid_t pid = s.s[0].pid;
    ASSERT_OK(poll_all(p, 60, &s));
    ASSERT_EQ(s.n, 1);
    ASSERT_EQ(s.s[0].kind, CLOUD_SIG_LOST);
    ASSERT_EQ(s.s[0].reason, CLOUD_LOSS_UNANNOUNCED);
    ASSERT_OK(wait_dead(pid));
    ASSERT_OK(poll_all(p, 60, &s));
    ASSERT_EQ(count_kind(&s, CLOUD_SIG_EXITED), 1);
    cloud_provider_free(p);
    return 0;
}

static int test_exit_reaped(void) {
    struct spawn_ctx sc = {.mode = "exit", .arg = "3"};
    struct cloud_event evs[] = {ev(0, CLOUD_EVENT_ADD, "a"), ev(1, CLOUD_EVENT_ADD, "b")};
    struct cloud_config cfg;
    base_config(&cfg, &sc, evs, 2);
    cfg.max_instances = 1;
    struct cloud_provider *p = NULL;
    ASSERT_OK(cloud_provider_new("sim", &cfg, &p));
    ASSERT_OK(cloud_provider_start(p, 0));
    struct sigs s;
    ASSERT_OK(poll_all(p, 0, &s));
    /* The grant; the child exits at once, so the same poll may already have reaped it. */
    ASSERT_TRUE(s.n == 1 || s.n == 2);
    ASSERT_EQ(s.s[0].kind, CLOUD_SIG_GRANTED);
    struct cloud_signal ex = s.s[s.n - 1];
    if (s.n == 1) {
        ASSERT_OK(wait_dead(s.s[0].pid));
        ASSERT_OK(poll_all(p, 0.5, &s));
        ASSERT_EQ(s.n, 1);
        ex = s.s[0];
    }
    ASSERT_EQ(ex.kind, CLOUD_SIG_EXITED);
    ASSERT_TRUE(WIFEXITED(ex.status) && WEXITSTATUS(ex.status) == 3);
    ASSERT_STREQ(ex.node, "a");
    size_t n;
    ASSERT_OK(cloud_provider_instances(p, NULL, 0, &n));
    ASSERT_EQ(n, 0);
    /* The exit lowered the target to 0: capacity b arrives but is not launched... */
    ASSERT_OK(poll_all(p, 1, &s));
    ASSERT_EQ(s.n, 0);
    /* ...until we ask for it. Node a's capacity is available again too and comes first. */
    sc.mode = "sleep";
    ASSERT_EQ(cloud_provider_acquire(p, 2, 1), 2);
    ASSERT_OK(poll_all(p, 1, &s));
    ASSERT_EQ(count_kind(&s, CLOUD_SIG_GRANTED), 2);
    ASSERT_STREQ(s.s[0].node, "a");
    ASSERT_STREQ(s.s[1].node, "b");
    cloud_provider_free(p);
    return 0;
}

static int test_target_and_release(void) {
    struct spawn_ctx sc = {0};
    struct cloud_event evs[] = {ev(0, CLOUD_EVENT_ADD, "a"), ev(0, CLOUD_EVENT_ADD, "b"),
                                ev(0, CLOUD_EVENT_ADD, "c"), ev(10, CLOUD_EVENT_REMOVE, "b")};
    struct cloud_config cfg;
    base_config(&cfg, &sc, evs, 4);
    cfg.max_instances = 2;
    cfg.notice_seconds = 100;
    struct cloud_provider *p = NULL;
    ASSERT_OK(cloud_provider_new("sim", &cfg, &p));
    ASSERT_OK(cloud_provider_start(p, 0));
    struct sigs s;
    ASSERT_OK(poll_all(p, 0, &s));
    ASSERT_EQ(count_kind(&s, CLOUD_SIG_GRANTED), 2); /* c waits: target 2 */
    char a_name[CLOUD_NAME_MAX];
    snprintf(a_name, sizeof(a_name), "%s", find_sig(&s, CLOUD_SIG_GRANTED, "a")->instance);
    pid_t a_pid = find_sig(&s, CLOUD_SIG_GRANTED, "a")->pid;
    ASSERT_OK(cloud_provider_release(p, a_name, 1));
    ASSERT_ERR(cloud_provider_release(p, a_name, 1), -ENOENT); /* already dead */
    ASSERT_OK(poll_all(p, 1, &s));
    const struct cloud_signal *lost = find_sig(&s, CLOUD_SIG_LOST, "a");
    ASSERT_TRUE(lost);
    ASSERT_EQ(lost->reason, CLOUD_LOSS_RELEASED);
    ASSERT_EQ(count_kind(&s, CLOUD_SIG_GRANTED), 0); /* target went down to 1 */
    ASSERT_OK(wait_dead(a_pid));
    /* Asking for one more relaunches node a (its capacity came back) with a new id. */
    ASSERT_EQ(cloud_provider_acquire(p, 1, 2), 1);
    ASSERT_OK(poll_all(p, 2, &s));
    const struct cloud_signal *g = find_sig(&s, CLOUD_SIG_GRANTED, "a");
    ASSERT_TRUE(g);
    ASSERT_TRUE(strcmp(g->instance, a_name) != 0);
    ASSERT_TRUE(find_sig(&s, CLOUD_SIG_EXITED, "a"));
    /* b's notice at 10 frees a slot: c launches while b is still in its notice window. */
    ASSERT_OK(poll_all(p, 10, &s));
    ASSERT_TRUE(find_sig(&s, CLOUD_SIG_NOTICE, "b"));
    ASSERT_TRUE(find_sig(&s, CLOUD_SIG_GRANTED, "c"));
    size_t n;
    ASSERT_OK(cloud_provider_instances(p, NULL, 0, &n));
    ASSERT_EQ(n, 3); /* a, c running; b noticed */
    cloud_provider_free(p);
    return 0;
}

static int test_spawn_failure(void) {
    struct spawn_ctx sc = {.fail_node = "a"};
    struct cloud_event evs[] = {ev(0, CLOUD_EVENT_ADD, "a"), ev(0, CLOUD_EVENT_ADD, "b"),
                                ev(5, CLOUD_EVENT_REMOVE, "a"), ev(6, CLOUD_EVENT_ADD, "a")};
    struct cloud_config cfg;
    base_config(&cfg, &sc, evs, 4);
    struct cloud_provider *p = NULL;
    ASSERT_OK(cloud_provider_new("sim", &cfg, &p));
    nlogs = 0;
    ASSERT_OK(cloud_provider_start(p, 0));
    ASSERT_GT(nlogs, 0); /* the failure was logged through the injected logger */
    struct sigs s;
    ASSERT_OK(poll_all(p, 0, &s));
    ASSERT_EQ(s.n, 1);
    ASSERT_STREQ(s.s[0].node, "b");
    /* The failed node stays unusable until the trace removes it and adds it back. */
    sc.fail_node = NULL;
    ASSERT_OK(poll_all(p, 5, &s));
    ASSERT_EQ(s.n, 0);
    ASSERT_OK(poll_all(p, 6, &s));
    ASSERT_EQ(s.n, 1);
    ASSERT_STREQ(s.s[0].node, "a");
    cloud_provider_free(p);

    /* A program that does not exist. */
    struct spawn_ctx sc2 = {.program = "/nonexistent/spottrain-worker"};
    base_config(&cfg, &sc2, evs, 2);
    ASSERT_OK(cloud_provider_new("sim", &cfg, &p));
    ASSERT_OK(cloud_provider_start(p, 0));
    ASSERT_OK(poll_all(p, 0, &s));
    ASSERT_EQ(count_kind(&s, CLOUD_SIG_GRANTED), 0);
    cloud_provider_free(p);
    return 0;
}

static int test_rebalance_hint(void) {
    struct spawn_ctx sc = {0};
    struct cloud_event evs[] = {ev(0, CLOUD_EVENT_ADD, "a"), ev(100, CLOUD_EVENT_REMOVE, "a")};
    struct cloud_config cfg;
    base_config(&cfg, &sc, evs, 2);
    cfg.rebalance_lead = 30;
    struct cloud_provider *p = NULL;
    ASSERT_OK(cloud_provider_new("sim", &cfg, &p));
    ASSERT_OK(cloud_provider_start(p, 0));
    struct sigs s;
    ASSERT_OK(poll_all(p, 0, &s));
    struct cloud_instance inst;
    size_t n;
    ASSERT_OK(cloud_provider_instances(p, &inst, 1, &n));
    struct cloud_notice_config ncfg = {.endpoint = inst.endpoint};
    struct cloud_notice_client *nc = NULL;
    ASSERT_OK(cloud_notice_client_new("aws", &ncfg, &nc));
    ASSERT_NEAR(cloud_provider_next_deadline(p, 0), 70, 1e-9, 0);
    ASSERT_OK(poll_all(p, 70, &s));
    ASSERT_EQ(s.n, 1);
    ASSERT_EQ(s.s[0].kind, CLOUD_SIG_REBALANCE);
    ASSERT_NEAR(s.s[0].at, 70, 1e-9, 0);
    struct cloud_notice notice;
    ASSERT_EQ(cloud_notice_client_poll(nc, &notice), 1);
    ASSERT_EQ(notice.kind, CLOUD_NOTICE_REBALANCE);
    ASSERT_NEAR(notice.time, WALL0 + 70, 0, 0);
    ASSERT_OK(poll_all(p, 100, &s));
    ASSERT_EQ(s.n, 1);
    ASSERT_EQ(s.s[0].kind, CLOUD_SIG_NOTICE);
    ASSERT_EQ(cloud_notice_client_poll(nc, &notice), 1);
    ASSERT_EQ(notice.kind, CLOUD_NOTICE_TERMINATE); /* the interruption outranks the hint */
    ASSERT_NEAR(notice.time, WALL0 + 220, 0, 0);
    cloud_notice_client_free(nc);
    cloud_provider_free(p);
    return 0;
}

static int test_readd_during_notice(void) {
    struct spawn_ctx sc = {0};
    struct cloud_event evs[] = {ev(0, CLOUD_EVENT_ADD, "a"), ev(60, CLOUD_EVENT_REMOVE, "a"),
                                ev(90, CLOUD_EVENT_ADD, "a"), ev(95, CLOUD_EVENT_ADD, "a"),
                                ev(96, CLOUD_EVENT_REMOVE, "zz")};
    struct cloud_config cfg;
    base_config(&cfg, &sc, evs, 5);
    struct cloud_provider *p = NULL;
    ASSERT_OK(cloud_provider_new("sim", &cfg, &p));
    ASSERT_OK(cloud_provider_start(p, 0));
    struct sigs s;
    ASSERT_OK(poll_all(p, 60, &s));
    ASSERT_TRUE(find_sig(&s, CLOUD_SIG_NOTICE, "a"));
    char old[CLOUD_NAME_MAX];
    snprintf(old, sizeof(old), "%s", find_sig(&s, CLOUD_SIG_NOTICE, "a")->instance);
    nlogs = 0;
    ASSERT_OK(poll_all(p, 100, &s));
    ASSERT_EQ(s.n, 1);
    ASSERT_EQ(s.s[0].kind, CLOUD_SIG_GRANTED);
    ASSERT_TRUE(strcmp(s.s[0].instance, old) != 0);
    ASSERT_EQ(nlogs, 2); /* the duplicate add and the unknown removal were warned about */
    size_t n;
    ASSERT_OK(cloud_provider_instances(p, NULL, 0, &n));
    ASSERT_EQ(n, 2);
    ASSERT_OK(poll_all(p, 180, &s));
    ASSERT_EQ(s.n, 1);
    ASSERT_EQ(s.s[0].kind, CLOUD_SIG_LOST);
    ASSERT_STREQ(s.s[0].instance, old);
    cloud_provider_free(p);
    return 0;
}

static int test_free_kills_children(void) {
    struct spawn_ctx sc = {0};
    struct cloud_event evs[] = {ev(0, CLOUD_EVENT_ADD, "a"), ev(0, CLOUD_EVENT_ADD, "b")};
    struct cloud_config cfg;
    base_config(&cfg, &sc, evs, 2);
    struct cloud_provider *p = NULL;
    ASSERT_OK(cloud_provider_new("sim", &cfg, &p));
    ASSERT_OK(cloud_provider_start(p, 0));
    struct sigs s;
    ASSERT_OK(poll_all(p, 0, &s));
    ASSERT_EQ(s.n, 2);
    cloud_provider_free(p);
    for (size_t i = 0; i < 2; i++)
        ASSERT_TRUE(kill(s.s[i].pid, 0) < 0 && errno == ESRCH);
    return 0;
}

static int test_signal_queue_overflow_is_kept(void) {
    /* 9 grants polled 4 at a time: nothing is lost between calls. */
    struct spawn_ctx sc = {0};
    struct cloud_event evs[9];
    for (int i = 0; i < 9; i++) {
        char name[8];
        snprintf(name, sizeof(name), "q%d", i);
        evs[i] = ev(0, CLOUD_EVENT_ADD, name);
    }
    struct cloud_config cfg;
    base_config(&cfg, &sc, evs, 9);
    struct cloud_provider *p = NULL;
    ASSERT_OK(cloud_provider_new("sim", &cfg, &p));
    ASSERT_OK(cloud_provider_start(p, 0));
    struct cloud_signal sig[4];
    size_t n, total = 0;
    do {
        ASSERT_OK(cloud_provider_poll(p, 0, sig, 4, &n));
        for (size_t i = 0; i < n; i++) {
            char want[8];
            snprintf(want, sizeof(want), "q%zu", total + i);
            ASSERT_STREQ(sig[i].node, want);
        }
        total += n;
    } while (n == 4);
    ASSERT_EQ(total, 9);
    cloud_provider_free(p);
    return 0;
}


/* The shipped toy trace (events CSV), one trace minute in 2 s: after every event time, the
 * instances running without a notice are exactly the trace's N, every removal is either
 * noticed or (round(0.25 x removals) of them) unannounced, and every kill lands on its
 * deadline. */
static int test_toy_trace_replay(void) {
    const char *src = getenv("SPOTTRAIN_SRCDIR");
    char path[1024];
    snprintf(path, sizeof(path), "%s/traces/toy-events.csv", src ? src : "..");
    char *data = NULL;
    size_t len;
    if (st_read_file(path, 1 << 20, &data, &len) < 0)
        return TEST_SKIP;
    struct cloud_event evs[64];
    size_t nev = 0, nremove = 0;
    for (char *line = strtok(data, "\n"); line && nev < 64; line = strtok(NULL, "\n")) {
        long ms;
        char act[16], node[CLOUD_NAME_MAX];
        if (sscanf(line, "%ld,%15[^,],%63s", &ms, act, node) != 3)
            continue;
        evs[nev] = ev(ms / 1000.0, strcmp(act, "add") == 0 ? CLOUD_EVENT_ADD : CLOUD_EVENT_REMOVE,
                      node);
        nremove += evs[nev].action == CLOUD_EVENT_REMOVE;
        nev++;
    }
    st_free(data);
    ASSERT_EQ(nev, 18);
    struct spawn_ctx sc = {0};
    struct cloud_config cfg;
    base_config(&cfg, &sc, evs, nev);
    cfg.time_scale = 2.0 / 60;
    cfg.notice_seconds = 120;
    cfg.unannounced = 0.25;
    cfg.seed = 7;
    struct cloud_provider *p = NULL;
    ASSERT_OK(cloud_provider_new("sim", &cfg, &p));
    ASSERT_OK(cloud_provider_start(p, 0));
    int n_trace = 0;
    size_t notices = 0, unannounced = 0, preempted = 0;
    struct sigs s;
    for (size_t i = 0; i < nev;) {
        double t = evs[i].t;
        for (; i < nev && evs[i].t == t; i++)
            n_trace += evs[i].action == CLOUD_EVENT_ADD ? 1 : -1;
        ASSERT_OK(poll_all(p, t * cfg.time_scale, &s));
        for (size_t k = 0; k < s.n; k++) {
            notices += s.s[k].kind == CLOUD_SIG_NOTICE;
            if (s.s[k].kind == CLOUD_SIG_NOTICE)
                ASSERT_NEAR(s.s[k].deadline, s.s[k].at + 4.0, 1e-9, 0);
            if (s.s[k].kind == CLOUD_SIG_LOST) {
                unannounced += s.s[k].reason == CLOUD_LOSS_UNANNOUNCED;
                preempted += s.s[k].reason == CLOUD_LOSS_PREEMPTED;
            }
        }
        struct cloud_instance inst[32];
        size_t n;
        ASSERT_OK(cloud_provider_instances(p, inst, 32, &n));
        int running = 0;
        for (size_t k = 0; k < n; k++)
            running += inst[k].state == CLOUD_INSTANCE_RUNNING;
        ASSERT_EQ(running, n_trace);
    }
    ASSERT_EQ(unannounced, (size_t)(0.25 * (double)nremove + 0.5));
    ASSERT_EQ(notices + unannounced, nremove);
    double end = cloud_provider_next_deadline(p, evs[nev - 1].t * cfg.time_scale);
    while (end >= 0) {
        ASSERT_OK(poll_all(p, end, &s));
        preempted += count_kind(&s, CLOUD_SIG_LOST);
        end = cloud_provider_next_deadline(p, end);
    }
    ASSERT_EQ(preempted, notices);
    cloud_provider_free(p);
    return 0;
}

/* curl torture: fail the nth allocation for every n; each call fails cleanly or works. */
static int test_alloc_failures(void) {
    struct spawn_ctx sc = {0};
    struct cloud_event evs[] = {ev(0, CLOUD_EVENT_ADD, "a"), ev(0, CLOUD_EVENT_ADD, "b"),
                                ev(1, CLOUD_EVENT_REMOVE, "a")};
    struct cloud_config cfg;
    base_config(&cfg, &sc, evs, 3);
    cfg.unannounced = 0.5;
    int clean = 0;
    for (long nth = 1; nth <= 60; nth++) {
        struct cloud_provider *p = NULL;
        struct sigs s;
        st_alloc_fail_after(nth);
        int r = cloud_provider_new("sim", &cfg, &p);
        if (r == 0) {
            r = cloud_provider_start(p, 0);
            if (r == 0)
                r = poll_all(p, 2, &s);
        }
        st_alloc_fail_after(0);
        if (r != 0 && r != -ENOMEM)
            TEST_FAIL_("allocation %ld failing gave %d", nth, r);
        clean += r == 0;
        cloud_provider_free(p);
    }
    ASSERT_GT(clean, 0); /* enough room at the end for everything to work */
    return 0;
}

TEST_MAIN(TEST(test_config_errors), TEST(test_adds_spawn_at_scaled_times),
          TEST(test_remove_notice_then_kill), TEST(test_unannounced_seeded),
          TEST(test_unannounced_has_no_notice), TEST(test_exit_reaped),
          TEST(test_target_and_release), TEST(test_spawn_failure), TEST(test_rebalance_hint),
          TEST(test_readd_during_notice), TEST(test_free_kills_children),
          TEST(test_signal_queue_overflow_is_kept), TEST(test_alloc_failures),
          TEST(test_toy_trace_replay))
