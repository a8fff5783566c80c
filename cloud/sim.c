/* sim.c: the `sim` provider — a spot fleet on one machine, replaying a trace of timed add and
 * remove events at a time scale.
 *
 * The one idea: the trace gives *capacity* (which nodes the cloud would let us have), and the
 * provider behaves like an EC2 fleet with a target capacity on top of it. A node the trace
 * adds becomes available; while fewer instances run than the target, available nodes are
 * launched: a fresh instance id, a loopback IMDSv2 server of its own, and a worker process
 * from the caller's spawn callback that finds that server through
 * AWS_EC2_METADATA_SERVICE_ENDPOINT. A trace removal of a running node posts the spot notice
 * on its server and SIGKILLs the process notice_seconds (scaled) later — or, for a seeded
 * fraction of removals, SIGKILLs it at once with no notice at all.
 *
 * Time: trace second t happens at caller time t0 + t * time_scale, where t0 is the `now` given
 * to start(). Everything is decided from the `now` passed to poll(), so tests drive the fleet
 * with a counter and never sleep; only reaping (waitpid) depends on real process exit. */
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"          /* TRY, TRY_GOTO */
#include "cloud-internal.h" /* cloud__emit, cloud__log */

extern char **environ;

enum node_state { NODE_ABSENT = 0, NODE_AVAILABLE, NODE_RUNNING, NODE_FAILED };

struct sim_node {
    char name[CLOUD_NAME_MAX];
    int zone;         /* index into zones */
    enum node_state state;
    int inst;         /* index into insts while RUNNING, else -1 */
};

struct sim_inst {
    bool used;
    struct cloud_instance pub;
    struct cloud_imds_server *imds;
    int node;         /* index into nodes while the node still holds it, else -1 */
    bool killed;      /* we sent SIGKILL */
};

struct sim_state {
    /* config (events are borrowed) */
    const struct cloud_event *events;
    size_t nevents;
    double time_scale, notice_seconds, rebalance_lead, price;
    char instance_type[CLOUD_NAME_MAX];
    int nzones;
    char zones[CLOUD_MAX_ZONES][CLOUD_NAME_MAX];
    cloud_spawn_fn *spawn;
    void *spawn_userdata;
    cloud_clock_fn *wall_clock;
    void *wall_clock_userdata;
    cloud_clock_fn *imds_clock;
    void *imds_clock_userdata;

    /* per event */
    int *ev_node;         /* node index of each event */
    bool *ev_unannounced; /* remove events chosen to come without notice */
    size_t cursor;        /* next event to apply */
    size_t rb_cursor;     /* next event to consider for a rebalance hint */

    struct sim_node *nodes;
    size_t nnodes;
    struct sim_inst *insts;
    size_t ninsts;        /* slots in use or free; bounded by CLOUD_MAX_INSTANCES */
    int target;           /* target capacity; -1 = unbounded */
    unsigned long next_id;
    double t0, wall0;
};

/* splitmix64: small, seedable, and the same on every platform. */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double ev_time(const struct sim_state *s, size_t i) {
    return s->t0 + s->events[i].t * s->time_scale;
}

static double to_wall(const struct sim_state *s, double t) {
    return s->wall0 + (t - s->t0);
}

static int find_node(const struct sim_state *s, const char *name) {
    for (size_t i = 0; i < s->nnodes; i++)
        if (strcmp(s->nodes[i].name, name) == 0)
            return (int)i;
    return -1;
}

/* Checks the events, indexes their nodes and picks the unannounced removals. */
static int sim_index_events(struct cloud_provider *p, struct sim_state *s, uint64_t seed,
                            double unannounced) {
    size_t nremove = 0;
    for (size_t i = 0; i < s->nevents; i++) {
        const struct cloud_event *e = &s->events[i];
        if (!(e->t >= 0) || e->t > 1e12 || (i > 0 && e->t < s->events[i - 1].t)) {
            cloud__log(p, ST_LOG_ERR, "sim: event %zu: time %g is negative or out of order", i,
                       e->t);
            return -EINVAL;
        }
        if (e->action != CLOUD_EVENT_ADD && e->action != CLOUD_EVENT_REMOVE)
            return -EINVAL;
        size_t len = strnlen(e->node, CLOUD_NAME_MAX);
        if (len == 0 || len == CLOUD_NAME_MAX) {
            cloud__log(p, ST_LOG_ERR, "sim: event %zu: node name empty or too long", i);
            return -EINVAL;
        }
        int n = find_node(s, e->node);
        if (n < 0) {
            if (s->nnodes == CLOUD_MAX_INSTANCES)
                return -E2BIG;
            n = (int)s->nnodes++;
            memcpy(s->nodes[n].name, e->node, len + 1);
            s->nodes[n].zone = n % s->nzones;
            s->nodes[n].inst = -1;
        }
        s->ev_node[i] = n;
        if (e->action == CLOUD_EVENT_REMOVE)
            nremove++;
    }
    /* Exactly round(fraction * removals) of them, chosen by a seeded partial shuffle. */
    size_t k = (size_t)(unannounced * (double)nremove + 0.5);
    if (k == 0)
        return 0;
    size_t *idx = st_calloc(nremove, sizeof(*idx));
    if (!idx)
        return -ENOMEM;
    for (size_t i = 0, j = 0; i < s->nevents; i++)
        if (s->events[i].action == CLOUD_EVENT_REMOVE)
            idx[j++] = i;
    uint64_t st = seed;
    for (size_t i = 0; i < k; i++) {
        size_t j = i + (size_t)(splitmix64(&st) % (uint64_t)(nremove - i));
        size_t tmp = idx[i];
        idx[i] = idx[j];
        idx[j] = tmp;
        s->ev_unannounced[idx[i]] = true;
    }
    st_free(idx);
    return 0;
}

static int sim_init(struct cloud_provider *p, void *state, const struct cloud_config *cfg) {
    struct sim_state *s = state;
    if (!cfg->spawn || !(cfg->time_scale > 0) || cfg->time_scale > 1e6 ||
        !(cfg->notice_seconds >= 0) || cfg->notice_seconds > 1e9 ||
        !(cfg->unannounced >= 0 && cfg->unannounced <= 1) || !(cfg->rebalance_lead >= 0) ||
        cfg->rebalance_lead > 1e9 || cfg->nevents > CLOUD_MAX_EVENTS ||
        (cfg->nevents > 0 && !cfg->events) || cfg->nzones < 1 ||
        cfg->nzones > (int)ST_ARRAY_SIZE(cfg->zones) ||
        cfg->max_instances > CLOUD_MAX_INSTANCES || !(cfg->price_per_hour >= 0)) {
        cloud__log(p, ST_LOG_ERR, "sim: invalid configuration (spawn callback, time_scale > 0, "
                   "notice_seconds >= 0, unannounced in [0, 1], zones 1..16)");
        return -EINVAL;
    }
    for (int z = 0; z < cfg->nzones; z++)
        if (strnlen(cfg->zones[z], CLOUD_NAME_MAX) < 2 ||
            strnlen(cfg->zones[z], CLOUD_NAME_MAX) == CLOUD_NAME_MAX)
            return -EINVAL;
    s->events = cfg->events;
    s->nevents = cfg->nevents;
    s->time_scale = cfg->time_scale;
    s->notice_seconds = cfg->notice_seconds;
    s->rebalance_lead = cfg->rebalance_lead;
    s->price = cfg->price_per_hour;
    snprintf(s->instance_type, sizeof(s->instance_type), "%s", cfg->instance_type);
    s->nzones = cfg->nzones;
    memcpy(s->zones, cfg->zones, sizeof(s->zones));
    s->spawn = cfg->spawn;
    s->spawn_userdata = cfg->spawn_userdata;
    s->wall_clock = cfg->wall_clock;
    s->wall_clock_userdata = cfg->wall_clock_userdata;
    s->imds_clock = cfg->imds_clock;
    s->imds_clock_userdata = cfg->imds_clock_userdata;
    s->target = cfg->max_instances > 0 ? cfg->max_instances : -1;

    int r;
    size_t nev = s->nevents ? s->nevents : 1;
    s->ev_node = st_calloc(nev, sizeof(*s->ev_node));
    s->ev_unannounced = st_calloc(nev, sizeof(*s->ev_unannounced));
    s->nodes = st_calloc(CLOUD_MAX_INSTANCES, sizeof(*s->nodes));
    s->insts = st_calloc(CLOUD_MAX_INSTANCES, sizeof(*s->insts));
    if (!s->ev_node || !s->ev_unannounced || !s->nodes || !s->insts) {
        r = -ENOMEM;
        goto out;
    }
    TRY_GOTO(sim_index_events(p, s, cfg->seed, cfg->unannounced), r, out);
    return 0;
out:
    st_free(s->ev_node);
    st_free(s->ev_unannounced);
    st_free(s->nodes);
    st_free(s->insts);
    return r;
}

static void sim_free_inst(struct sim_state *s, struct sim_inst *in) {
    in->imds = cloud_imds_server_free(in->imds);
    if (in->node >= 0 && s->nodes[in->node].inst == (int)(in - s->insts))
        s->nodes[in->node].inst = -1;
    memset(in, 0, sizeof(*in));
}

static void sim_done(struct cloud_provider *p, void *state) {
    struct sim_state *s = state;
    for (size_t i = 0; i < s->ninsts; i++) {
        struct sim_inst *in = &s->insts[i];
        if (!in->used)
            continue;
        if (in->pub.pid > 0) {
            kill(in->pub.pid, SIGKILL);
            while (waitpid(in->pub.pid, NULL, 0) < 0 && errno == EINTR)
                ;
        }
        sim_free_inst(s, in);
    }
    st_free(s->ev_node);
    st_free(s->ev_unannounced);
    st_free(s->nodes);
    st_free(s->insts);
}

static int sim_emit(struct cloud_provider *p, enum cloud_signal_kind kind,
                    const struct sim_inst *in, double at) {
    struct cloud_signal sig = {.kind = kind, .at = at, .pid = in->pub.pid};
    memcpy(sig.instance, in->pub.name, sizeof(sig.instance));
    memcpy(sig.node, in->pub.node, sizeof(sig.node));
    if (kind == CLOUD_SIG_NOTICE)
        sig.deadline = in->pub.deadline;
    return cloud__emit(p, &sig);
}

/* Sets "KEY=VALUE" entries: the inherited environment minus overridden keys, then extras. */
static int build_env(const char *const *extra, size_t nextra, char ***ret_envp) {
    size_t n = 0;
    while (environ && environ[n])
        n++;
    char **envp = st_calloc(n + nextra + 1, sizeof(*envp));
    if (!envp)
        return -ENOMEM;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *eq = strchr(environ[i], '=');
        size_t klen = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
        bool overridden = false;
        for (size_t j = 0; j < nextra && !overridden; j++)
            overridden = strncmp(extra[j], environ[i], klen) == 0 && extra[j][klen] == '=';
        if (!overridden)
            envp[o++] = environ[i];
    }
    for (size_t j = 0; j < nextra; j++) { /* a later extra overrides an earlier one */
        size_t klen = (size_t)(strchr(extra[j], '=') - extra[j]);
        bool later = false;
        for (size_t k = j + 1; k < nextra && !later; k++)
            later = strncmp(extra[k], extra[j], klen + 1) == 0;
        if (!later)
            envp[o++] = (char *)extra[j];
    }
    *ret_envp = envp;
    return 0;
}

/* Launches an instance on an available node at caller time `at`. */
static int sim_launch(struct cloud_provider *p, struct sim_state *s, int node, double at) {
    struct sim_node *nd = &s->nodes[node];
    size_t slot = 0;
    while (slot < s->ninsts && s->insts[slot].used)
        slot++;
    if (slot == CLOUD_MAX_INSTANCES)
        return -E2BIG;
    struct sim_inst *in = &s->insts[slot];
    memset(in, 0, sizeof(*in));
    in->node = -1;
    snprintf(in->pub.name, sizeof(in->pub.name), "i-%017lx", ++s->next_id);
    memcpy(in->pub.node, nd->name, sizeof(in->pub.node));
    memcpy(in->pub.zone, s->zones[nd->zone], sizeof(in->pub.zone));
    in->pub.state = CLOUD_INSTANCE_RUNNING;
    in->pub.started = at;
    in->pub.price_per_hour = s->price;

    int r;
    char **envp = NULL;
    struct cloud_imds_server_config icfg = {
        .instance_id = in->pub.name, .instance_type = s->instance_type, .zone = in->pub.zone,
        .clock = s->imds_clock, .clock_userdata = s->imds_clock_userdata};
    TRY_GOTO(cloud_imds_server_new(&icfg, &in->imds), r, out);
    TRY_GOTO(cloud_imds_server_endpoint(in->imds, in->pub.endpoint, sizeof(in->pub.endpoint)), r,
             out);

    struct cloud_spawn_cmd cmd;
    memset(&cmd, 0, sizeof(cmd));
    TRY_GOTO(s->spawn(s->spawn_userdata, &in->pub, &cmd), r, out);
    if (!cmd.argv[0] || cmd.argv[CLOUD_SPAWN_MAX_ARGS] || cmd.env[CLOUD_SPAWN_MAX_ENV]) {
        r = -EINVAL;
        goto out;
    }
    char vars[5][CLOUD_URL_MAX + 48];
    const char *extra[CLOUD_SPAWN_MAX_ENV + 5];
    size_t nextra = 0;
    for (size_t i = 0; cmd.env[i]; i++) {
        if (!strchr(cmd.env[i], '=')) {
            r = -EINVAL;
            goto out;
        }
        extra[nextra++] = cmd.env[i];
    }
    snprintf(vars[0], sizeof(vars[0]), "AWS_EC2_METADATA_SERVICE_ENDPOINT=%s", in->pub.endpoint);
    snprintf(vars[1], sizeof(vars[1]), "SPOTTRAIN_INSTANCE_ID=%s", in->pub.name);
    snprintf(vars[2], sizeof(vars[2]), "SPOTTRAIN_NODE=%s", in->pub.node);
    snprintf(vars[3], sizeof(vars[3]), "SPOTTRAIN_ZONE=%s", in->pub.zone);
    /* A spottrain worker dies with us (cli/cmd-worker.c): none outlives a killed run. */
    snprintf(vars[4], sizeof(vars[4]), "SPOTTRAIN_PARENT_PID=%d", (int)getpid());
    for (size_t i = 0; i < ST_ARRAY_SIZE(vars); i++)
        extra[nextra++] = vars[i];
    TRY_GOTO(build_env(extra, nextra, &envp), r, out);
    pid_t pid;
    int e = posix_spawnp(&pid, cmd.argv[0], NULL, NULL, (char *const *)cmd.argv, envp);
    if (e != 0) {
        r = -e;
        cloud__log(p, ST_LOG_WARN, "sim: cannot start '%s' for %s: %s", cmd.argv[0],
                   in->pub.name, st_strerror(r));
        goto out;
    }
    in->pub.pid = pid;
    in->used = true;
    in->node = node;
    if (slot == s->ninsts)
        s->ninsts++;
    nd->state = NODE_RUNNING;
    nd->inst = (int)slot;
    cloud__log(p, ST_LOG_INFO, "sim: %s on node '%s' (%s) started, pid %d, imds %s",
               in->pub.name, nd->name, in->pub.zone, (int)pid, in->pub.endpoint);
    r = sim_emit(p, CLOUD_SIG_GRANTED, in, at);
out:
    st_free(envp);
    if (r < 0 && !in->used) {
        in->imds = cloud_imds_server_free(in->imds);
        memset(in, 0, sizeof(*in));
        nd->state = NODE_FAILED;
        cloud__log(p, ST_LOG_WARN, "sim: launch on node '%s' failed: %s; node unusable until "
                   "the trace removes it", nd->name, st_strerror(r));
        return 0; /* a failed launch is the node's problem, not the fleet's */
    }
    return r;
}

static int sim_running(const struct sim_state *s) {
    int n = 0;
    for (size_t i = 0; i < s->ninsts; i++)
        if (s->insts[i].used && s->insts[i].pub.state == CLOUD_INSTANCE_RUNNING)
            n++;
    return n;
}

/* Launches available nodes (in trace order) while below the target. Returns how many. */
static int sim_fill(struct cloud_provider *p, struct sim_state *s, double at) {
    int launched = 0;
    for (size_t n = 0; n < s->nnodes; n++) {
        if (s->target >= 0 && sim_running(s) >= s->target)
            break;
        if (s->nodes[n].state != NODE_AVAILABLE)
            continue;
        TRY(sim_launch(p, s, (int)n, at));
        if (s->nodes[n].state == NODE_RUNNING)
            launched++;
    }
    return launched;
}

/* SIGKILLs an instance's process and reports the loss. */
static int sim_kill(struct cloud_provider *p, struct sim_state *s, struct sim_inst *in,
                    enum cloud_loss_reason reason, double at) {
    if (in->pub.pid > 0 && kill(in->pub.pid, SIGKILL) < 0 && errno != ESRCH)
        cloud__log(p, ST_LOG_WARN, "sim: kill(%d): %s, ignoring", (int)in->pub.pid,
                   st_strerror(-errno));
    in->killed = true;
    in->pub.state = CLOUD_INSTANCE_DEAD;
    if (in->node >= 0 && s->nodes[in->node].inst == (int)(in - s->insts)) {
        s->nodes[in->node].inst = -1;
        s->nodes[in->node].state = reason == CLOUD_LOSS_RELEASED ? NODE_AVAILABLE : NODE_ABSENT;
    }
    in->node = -1;
    cloud__log(p, ST_LOG_INFO, "sim: %s on node '%s' killed (%s)", in->pub.name, in->pub.node,
               cloud_loss_reason_name(reason));
    struct cloud_signal sig = {.kind = CLOUD_SIG_LOST, .at = at, .reason = reason,
                               .pid = in->pub.pid};
    memcpy(sig.instance, in->pub.name, sizeof(sig.instance));
    memcpy(sig.node, in->pub.node, sizeof(sig.node));
    return cloud__emit(p, &sig);
}

static int sim_apply_event(struct cloud_provider *p, struct sim_state *s, size_t i, double at) {
    const struct cloud_event *e = &s->events[i];
    struct sim_node *nd = &s->nodes[s->ev_node[i]];
    if (e->action == CLOUD_EVENT_ADD) {
        if (nd->state != NODE_ABSENT) {
            cloud__log(p, ST_LOG_WARN, "sim: trace adds node '%s' that is present, ignoring",
                       nd->name);
            return 0;
        }
        nd->state = NODE_AVAILABLE;
        return 0;
    }
    if (nd->state == NODE_ABSENT) {
        cloud__log(p, ST_LOG_WARN, "sim: trace removes node '%s' that is absent, ignoring",
                   nd->name);
        return 0;
    }
    if (nd->state != NODE_RUNNING) { /* capacity we never used goes away silently */
        nd->state = NODE_ABSENT;
        return 0;
    }
    struct sim_inst *in = &s->insts[nd->inst];
    if (s->ev_unannounced[i])
        return sim_kill(p, s, in, CLOUD_LOSS_UNANNOUNCED, at);
    /* Detach from the node: the trace may add it back (a new instance) within the notice. */
    nd->state = NODE_ABSENT;
    nd->inst = -1;
    in->node = -1;
    in->pub.state = CLOUD_INSTANCE_NOTICED;
    in->pub.deadline = at + s->notice_seconds * s->time_scale;
    TRY(cloud_imds_server_set_notice(in->imds, "terminate", to_wall(s, in->pub.deadline)));
    cloud__log(p, ST_LOG_INFO, "sim: %s on node '%s' noticed, killed at %.3f", in->pub.name,
               nd->name, in->pub.deadline);
    return sim_emit(p, CLOUD_SIG_NOTICE, in, at);
}

/* Posts a rebalance hint on the instance that runs the node of removal event i now. */
static int sim_apply_hint(struct cloud_provider *p, struct sim_state *s, size_t i, double at) {
    struct sim_node *nd = &s->nodes[s->ev_node[i]];
    if (nd->state != NODE_RUNNING)
        return 0;
    struct sim_inst *in = &s->insts[nd->inst];
    TRY(cloud_imds_server_set_rebalance(in->imds, to_wall(s, at)));
    return sim_emit(p, CLOUD_SIG_REBALANCE, in, at);
}

static double hint_time(const struct sim_state *s, size_t i) {
    double t = ev_time(s, i) - s->rebalance_lead * s->time_scale;
    return t < s->t0 ? s->t0 : t;
}

/* Skips events that never get a hint; returns the next hinted event index or nevents. */
static size_t next_hint(const struct sim_state *s, size_t from) {
    if (s->rebalance_lead <= 0)
        return s->nevents;
    while (from < s->nevents && (s->events[from].action != CLOUD_EVENT_REMOVE ||
                                 s->ev_unannounced[from]))
        from++;
    return from;
}

/* The noticed instance with the earliest deadline, or NULL. */
static struct sim_inst *next_kill(struct sim_state *s) {
    struct sim_inst *best = NULL;
    for (size_t i = 0; i < s->ninsts; i++) {
        struct sim_inst *in = &s->insts[i];
        if (in->used && in->pub.state == CLOUD_INSTANCE_NOTICED &&
            (!best || in->pub.deadline < best->pub.deadline))
            best = in;
    }
    return best;
}

/* Applies everything due at or before `now` in time order: kills, then hints, then events. */
static int sim_advance(struct cloud_provider *p, struct sim_state *s, double now) {
    for (;;) {
        struct sim_inst *k = next_kill(s);
        s->rb_cursor = next_hint(s, s->rb_cursor);
        double tk = k ? k->pub.deadline : 1e300;
        double th = s->rb_cursor < s->nevents ? hint_time(s, s->rb_cursor) : 1e300;
        double te = s->cursor < s->nevents ? ev_time(s, s->cursor) : 1e300;
        double t = ST_MIN(tk, ST_MIN(th, te));
        if (t > now)
            return 0;
        if (tk == t) {
            TRY(sim_kill(p, s, k, CLOUD_LOSS_PREEMPTED, t));
        } else if (th == t) {
            TRY(sim_apply_hint(p, s, s->rb_cursor++, t));
        } else {
            TRY(sim_apply_event(p, s, s->cursor++, t));
        }
        TRY(sim_fill(p, s, t));
    }
}

/* Reaps exited processes and reports them. A process that ended by itself takes its
 * instance with it: the node's capacity becomes available and the target drops by one. */
static int sim_reap(struct cloud_provider *p, struct sim_state *s, double now) {
    for (size_t i = 0; i < s->ninsts; i++) {
        struct sim_inst *in = &s->insts[i];
        if (!in->used || in->pub.pid <= 0)
            continue;
        int status;
        pid_t r = waitpid(in->pub.pid, &status, WNOHANG);
        if (r == 0 || (r < 0 && errno == EINTR))
            continue;
        if (r < 0) { /* ECHILD: someone else reaped it */
            status = 0;
            cloud__log(p, ST_LOG_WARN, "sim: %s: pid %d was reaped elsewhere", in->pub.name,
                       (int)in->pub.pid);
        }
        if (!in->killed) {
            if (in->node >= 0 && s->nodes[in->node].inst == (int)i)
                s->nodes[in->node].state = NODE_AVAILABLE;
            if (s->target > 0 && in->pub.state == CLOUD_INSTANCE_RUNNING)
                s->target--;
            cloud__log(p, ST_LOG_NOTICE, "sim: %s (pid %d) exited by itself, status %d",
                       in->pub.name, (int)in->pub.pid, status);
        }
        struct cloud_signal sig = {.kind = CLOUD_SIG_EXITED, .at = now, .status = status,
                                   .pid = in->pub.pid};
        memcpy(sig.instance, in->pub.name, sizeof(sig.instance));
        memcpy(sig.node, in->pub.node, sizeof(sig.node));
        sim_free_inst(s, in);
        TRY(cloud__emit(p, &sig));
    }
    return 0;
}

static int sim_start(struct cloud_provider *p, void *state, double now) {
    struct sim_state *s = state;
    s->t0 = now;
    s->wall0 = s->wall_clock ? s->wall_clock(s->wall_clock_userdata) : st_wall();
    return sim_advance(p, s, now);
}

static int sim_poll(struct cloud_provider *p, void *state, double now) {
    struct sim_state *s = state;
    TRY(sim_reap(p, s, now));
    return sim_advance(p, s, now);
}

static int sim_acquire(struct cloud_provider *p, void *state, int n, double now) {
    struct sim_state *s = state;
    TRY(sim_advance(p, s, now));
    if (s->target >= 0)
        s->target = ST_MIN(s->target + n, CLOUD_MAX_INSTANCES);
    return sim_fill(p, s, now);
}

static int sim_release(struct cloud_provider *p, void *state, const char *instance, double now) {
    struct sim_state *s = state;
    TRY(sim_advance(p, s, now));
    for (size_t i = 0; i < s->ninsts; i++) {
        struct sim_inst *in = &s->insts[i];
        if (!in->used || in->pub.state == CLOUD_INSTANCE_DEAD ||
            strcmp(in->pub.name, instance) != 0)
            continue;
        if (s->target > 0 && in->pub.state == CLOUD_INSTANCE_RUNNING)
            s->target--;
        return sim_kill(p, s, in, CLOUD_LOSS_RELEASED, now);
    }
    return -ENOENT;
}

static int sim_instances(struct cloud_provider *p, void *state, struct cloud_instance *out,
                         size_t max, size_t *ret_n) {
    struct sim_state *s = state;
    size_t n = 0;
    for (size_t i = 0; i < s->ninsts; i++) {
        const struct sim_inst *in = &s->insts[i];
        if (!in->used || in->pub.state == CLOUD_INSTANCE_DEAD)
            continue;
        if (n < max)
            out[n] = in->pub;
        n++;
    }
    *ret_n = n;
    return 0;
}

static double sim_next_deadline(struct cloud_provider *p, void *state, double now) {
    struct sim_state *s = state;
    struct sim_inst *k = next_kill(s);
    size_t h = next_hint(s, s->rb_cursor);
    double t = 1e300;
    if (k)
        t = k->pub.deadline;
    if (h < s->nevents)
        t = ST_MIN(t, hint_time(s, h));
    if (s->cursor < s->nevents)
        t = ST_MIN(t, ev_time(s, s->cursor));
    if (t == 1e300)
        return -1;
    return ST_MAX(t, now);
}

const struct cloud_provider_ops cloud__sim_ops = {
    .name = "sim",
    .state_size = sizeof(struct sim_state),
    .init = sim_init,
    .done = sim_done,
    .start = sim_start,
    .poll = sim_poll,
    .acquire = sim_acquire,
    .release = sim_release,
    .instances = sim_instances,
    .next_deadline = sim_next_deadline,
};
