/* cloud.h: the public header of cloud/ — providers that hand out instances and report their
 * fate, the loopback IMDSv2 endpoint the sim provider gives every instance, and the
 * worker-side interruption-notice clients (the same libcurl code that runs on EC2, GCE and
 * Azure).
 *
 * The one idea: whatever the cloud, the coordinator sees the same stream of signals
 * (granted, notice, rebalance hint, lost, exited), and a worker learns about its own end
 * through the cloud's documented metadata endpoint, never through a side channel. The sim
 * provider makes that true on one machine: each instance is a local process with its own
 * IMDSv2-compatible HTTP server on 127.0.0.1, found through AWS_EC2_METADATA_SERVICE_ENDPOINT.
 *
 * Time. Providers never read a clock for decisions: every call takes `now`, seconds on the
 * caller's monotonic clock (st_now() in production, a plain counter in tests). Wall-clock
 * text (the "time" of a notice) is derived from an injected wall clock read once at start.
 *
 * Threads. A provider handle is used from one thread. The IMDS servers answer from their own
 * threads; their state is locked internally. Notice clients are single-threaded. */
#ifndef ST_CLOUD_H
#define ST_CLOUD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct st_spec;
struct st_spec_fleet;

#define CLOUD_NAME_MAX 64       /* instance names, node names, zones (with NUL) */
#define CLOUD_URL_MAX 256       /* endpoint base URLs (with NUL) */
#define CLOUD_SPAWN_MAX_ARGS 62 /* argv entries a spawn callback may set */
#define CLOUD_SPAWN_MAX_ENV 30  /* extra environment entries a spawn callback may set */
#define CLOUD_MAX_INSTANCES 4096 /* instances one provider handle keeps track of */
#define CLOUD_MAX_EVENTS 1000000 /* events in one sim trace */
#define CLOUD_MAX_ZONES 16       /* zones one provider hands out */

/* ---- logging and clocks ---------------------------------------------------------------- */

/* Injected logger (NCCL plugin style): level is an enum st_log_level, msg has no newline.
 * When a config leaves it NULL, lines go to st_log() with subsystem "cloud". */
typedef void cloud_log_fn(void *userdata, int level, const char *msg);

/* Injected clock: seconds. Used for wall-clock text (epoch seconds) and for token expiry
 * in the IMDS server and clients (monotonic seconds). */
typedef double cloud_clock_fn(void *userdata);

/* ---- signals ------------------------------------------------------------------------------ */

enum cloud_signal_kind {
    CLOUD_SIG_GRANTED = 0, /* a new instance is running (its worker process was started) */
    CLOUD_SIG_REBALANCE,   /* elevated risk of interruption (AWS rebalance recommendation) */
    CLOUD_SIG_NOTICE,      /* certain loss of the instance at `deadline` */
    CLOUD_SIG_LOST,        /* the instance is gone (preempted, released or killed) */
    CLOUD_SIG_EXITED,      /* the instance's process was reaped; `status` says how it ended */
};

enum cloud_loss_reason {
    CLOUD_LOSS_NONE = 0,
    CLOUD_LOSS_PREEMPTED,   /* taken back by the cloud after a notice */
    CLOUD_LOSS_UNANNOUNCED, /* taken back without any notice */
    CLOUD_LOSS_RELEASED,    /* released by us (cloud_provider_release) */
    CLOUD_LOSS_SHUTDOWN,    /* the provider was freed */
};

struct cloud_signal {
    enum cloud_signal_kind kind;
    char instance[CLOUD_NAME_MAX]; /* instance id, e.g. "i-00000000000000001" */
    char node[CLOUD_NAME_MAX];     /* the trace's node name the instance runs on */
    double at;                     /* caller-clock seconds when it happened (scheduled time) */
    double deadline;               /* NOTICE: caller-clock seconds of the loss; else 0 */
    enum cloud_loss_reason reason; /* LOST only */
    int status;                    /* EXITED only: waitpid() status */
    pid_t pid;                     /* the worker process, 0 when none */
};

/* Short lower-case names for logs and JSON ("granted", "preempted", ...). Never NULL. */
const char *cloud_signal_kind_name(enum cloud_signal_kind k);
const char *cloud_loss_reason_name(enum cloud_loss_reason r);

/* ---- instances ---------------------------------------------------------------------------- */

enum cloud_instance_state {
    CLOUD_INSTANCE_RUNNING = 0, /* process alive, no notice */
    CLOUD_INSTANCE_NOTICED,     /* process alive, will be killed at `deadline` */
    CLOUD_INSTANCE_DEAD,        /* killed or exited, not yet reaped */
};

struct cloud_instance {
    char name[CLOUD_NAME_MAX];          /* instance id */
    char node[CLOUD_NAME_MAX];          /* trace node name */
    char zone[CLOUD_NAME_MAX];          /* availability zone */
    char endpoint[CLOUD_URL_MAX];       /* its metadata endpoint base URL ("" when none) */
    enum cloud_instance_state state;
    double started;                     /* caller-clock seconds */
    double deadline;                    /* NOTICED: caller-clock seconds of the kill; else 0 */
    double price_per_hour;              /* dollars */
    pid_t pid;
};

/* ---- sim trace events --------------------------------------------------------------------- */

enum cloud_event_action { CLOUD_EVENT_ADD = 0, CLOUD_EVENT_REMOVE };

/* One timed trace event, built by the caller (from the planner's trace parser): the provider
 * stays below the planner and never parses trace files. Events must be sorted by t. */
struct cloud_event {
    double t;                      /* trace seconds from the start of the trace */
    enum cloud_event_action action;
    char node[CLOUD_NAME_MAX];     /* node name; an add of a present node is ignored */
};

/* ---- spawning workers --------------------------------------------------------------------- */

/* What to run for one instance. The provider passes a zeroed struct; the callback fills argv
 * (argv[0] is the program path; NULL-terminated) and optionally env (extra "KEY=VALUE"
 * entries that override the inherited environment). The strings stay owned by the callback
 * and must stay valid until the callback is called again or the provider is freed.
 * The provider itself adds AWS_EC2_METADATA_SERVICE_ENDPOINT=<instance endpoint>,
 * SPOTTRAIN_INSTANCE_ID=<instance>, SPOTTRAIN_NODE=<node> and SPOTTRAIN_ZONE=<zone>. */
struct cloud_spawn_cmd {
    const char *argv[CLOUD_SPAWN_MAX_ARGS + 2];
    const char *env[CLOUD_SPAWN_MAX_ENV + 2];
};

/* Returns 0 after filling cmd, or negative errno (the instance is then not launched and its
 * node's capacity is marked failed until the trace removes it). */
typedef int cloud_spawn_fn(void *userdata, const struct cloud_instance *inst,
                           struct cloud_spawn_cmd *cmd);

/* Dry run (aws): called with each request the provider would send, as one display line
 * ("POST ENDPOINT Action=RunInstances&..."), followed by any extra lines (the user-data
 * decoded, each starting with "  | "); nothing is sent and no secret is in the text. */
typedef void cloud_dry_run_fn(void *userdata, const char *text);

/* ---- providers ---------------------------------------------------------------------------- */

struct cloud_provider;

/* Everything a provider is created from. Fill with cloud_config_init() (or
 * cloud_config_from_fleet()), then set what you need. Pointers are borrowed: events and the
 * callbacks' userdata must outlive the provider. */
struct cloud_config {
    /* common */
    cloud_log_fn *log;                 /* NULL = st_log */
    void *log_userdata;
    char instance_type[CLOUD_NAME_MAX]; /* served as instance-type; default "sim.local" */
    int nzones;                         /* zones handed out round-robin by node, 1..16 */
    char zones[CLOUD_MAX_ZONES][CLOUD_NAME_MAX]; /* default "local-1a" */
    double price_per_hour;              /* dollars per instance-hour */
    int max_instances;                  /* target capacity at start; <= 0 = unbounded */
    /* the job, for tags/labels and the workers' bootstrap (filled by the job driver) */
    const struct st_spec *spec;         /* the job spec (borrowed); NULL in unit tests */
    char job_name[128];                 /* metadata.name */
    char job_id[40];                    /* the journal's job id */
    char coordinator[256];              /* HOST:PORT workers dial (coordinator.advertise, else
                                           the bound gRPC address) */
    const char *token;                  /* the join token for the bootstrap (borrowed); never
                                           logged */
    /* cloud providers (aws) */
    char image[128];                    /* machine image (AMI id), with spottrain installed */
    bool spot;                          /* ask for spot capacity (else on-demand) */
    bool on_demand_fallback;            /* ask on-demand when every zone refuses spot */
    double reconcile_interval;          /* seconds between DescribeInstances; 0 = 5 */
    cloud_dry_run_fn *dry_run;          /* non-NULL: print requests instead of sending them */
    void *dry_run_userdata;
    /* kubernetes */
    char kubeconfig[512];               /* "" = $KUBECONFIG, else in-cluster config */
    char k8s_namespace[128];            /* "" = the kubeconfig context's, the service
                                           account's, $SPOTTRAIN_NAMESPACE or "default" */
    /* sim */
    const struct cloud_event *events;   /* sorted by t */
    size_t nevents;
    double time_scale;                  /* wall seconds per trace second; > 0 */
    double notice_seconds;              /* trace seconds between notice and kill; >= 0 */
    double unannounced;                 /* fraction of removals without notice, [0, 1] */
    double rebalance_lead;              /* trace seconds a rebalance hint precedes a noticed
                                           removal; 0 = no hints */
    uint64_t seed;                      /* picks the unannounced removals */
    cloud_spawn_fn *spawn;              /* required by sim */
    void *spawn_userdata;
    cloud_clock_fn *wall_clock;         /* epoch seconds for notice text; NULL = st_wall */
    void *wall_clock_userdata;
    cloud_clock_fn *imds_clock;         /* monotonic seconds for IMDS token expiry;
                                           NULL = st_now */
    void *imds_clock_userdata;
};

/* Backend table: one per provider kind. Called only through the cloud_provider_* wrappers,
 * which check arguments and the handle's magic first. */
struct cloud_provider_ops {
    const char *name;
    size_t state_size;                 /* bytes of backend state allocated (zeroed) for init */
    int (*init)(struct cloud_provider *p, void *state, const struct cloud_config *cfg);
    void (*done)(struct cloud_provider *p, void *state); /* kill, reap, release everything */
    int (*start)(struct cloud_provider *p, void *state, double now);
    int (*poll)(struct cloud_provider *p, void *state, double now);
    int (*acquire)(struct cloud_provider *p, void *state, int n, double now);
    int (*release)(struct cloud_provider *p, void *state, const char *instance, double now);
    int (*instances)(struct cloud_provider *p, void *state, struct cloud_instance *out,
                     size_t max, size_t *ret_n);
    double (*next_deadline)(struct cloud_provider *p, void *state, double now);
    /* Optional (NULL: not offered): the live $/instance-hour of the fleet, or -ENODATA. */
    int (*price)(struct cloud_provider *p, void *state, double *ret_per_hour);
};

/* Fills cfg with defaults: no events, time_scale 1, notice 120 s, nothing unannounced,
 * seed 1, one zone "local-1a", instance type "sim.local", unbounded capacity. */
void cloud_config_init(struct cloud_config *cfg);

/* Fills cfg from the job spec's fleet section (cloud_config_init() first): time_scale,
 * notice_seconds, unannounced, max, zones, instance_type, spot_price. Returns 0 or -EINVAL
 * when a value is out of range (the spec loader normally caught that already). */
int cloud_config_from_fleet(struct cloud_config *cfg, const struct st_spec_fleet *fleet);

/* Names of the registered providers, NULL-terminated ({"sim", "aws", "gcp", "azure",
 * "kubernetes", NULL}). */
const char *const *cloud_provider_names(void);

/* Creates a provider of the named kind. Returns 0 and *ret_p, -ENOENT for an unknown name,
 * -EINVAL for a bad config, or another negative errno. Nothing runs until
 * cloud_provider_start(). Caller frees with cloud_provider_free(). */
int cloud_provider_new(const char *name, const struct cloud_config *cfg,
                       struct cloud_provider **ret_p);

/* Kills every process the provider started, reaps them and frees everything. NULL-safe;
 * returns NULL. */
struct cloud_provider *cloud_provider_free(struct cloud_provider *p);

/* The live price of the fleet's instances in dollars per instance-hour, as the cloud answers
 * it (aws: DescribeSpotPriceHistory). Returns 0, or -ENODATA when the provider has none (sim,
 * or an endpoint that does not offer it): callers then use the configured fleet price. */
int cloud_provider_price(struct cloud_provider *p, double *ret_per_hour);

/* Marks the provider so that cloud_provider_free() leaves its instances running (a
 * coordinator that stops for a restart to adopt its fleet). Backends whose instances cannot
 * outlive this process (the sim's child processes) still end them. */
void cloud_provider_detach(struct cloud_provider *p);
/* True after cloud_provider_detach(): a backend's done() asks before releasing. */
bool cloud_provider_detached(const struct cloud_provider *p);

/* The backend's name ("sim"). */
const char *cloud_provider_name(const struct cloud_provider *p);

/* Starts the provider at caller time `now` (trace time 0): the sim applies every event at
 * t <= 0, launching the trace's initial instances. Returns 0 or negative errno; -EALREADY
 * on a second call. */
int cloud_provider_start(struct cloud_provider *p, double now);

/* Advances the provider to `now` (never backwards: -EINVAL) and queues what happened as
 * signals, then copies up to max of the queued signals, oldest first, into sigs and writes
 * *ret_n. Signals that did not fit stay queued: call again (with the same now) until
 * *ret_n < max. Also reaps exited processes. Returns 0 or negative errno. */
int cloud_provider_poll(struct cloud_provider *p, double now, struct cloud_signal *sigs,
                        size_t max, size_t *ret_n);

/* Raises the target capacity by n (> 0) and launches from capacity the trace has made
 * available. Returns how many instances were launched now (>= 0); the rest follow as the
 * trace adds capacity. GRANTED signals come through cloud_provider_poll(). */
int cloud_provider_acquire(struct cloud_provider *p, int n, double now);

/* Terminates one of our instances (SIGKILL, as a user's TerminateInstances) and lowers the
 * target capacity by one. Returns 0, -ENOENT for an unknown or already dead instance. */
int cloud_provider_release(struct cloud_provider *p, const char *instance, double now);

/* Copies up to max live (running or noticed) instances into out. Returns 0 and *ret_n, the
 * total count (which may exceed max). */
int cloud_provider_instances(struct cloud_provider *p, struct cloud_instance *out, size_t max,
                             size_t *ret_n);

/* The next caller time after `now` at which poll() has something to do (event, kill,
 * hint), or a negative value when nothing is scheduled; lets a loop sleep exactly. */
double cloud_provider_next_deadline(struct cloud_provider *p, double now);

/* ---- Kubernetes manifests (k8s-manifest.c) ------------------------------------------------ */

struct cloud_render_opts {
    const struct st_spec *spec;  /* the job (borrowed) */
    const char *spec_text;       /* the spec file as written: the ConfigMap's job.yaml */
    const char *image;           /* required: the spottrain image of coordinator and workers */
    const char *ns;              /* NULL or "": no Namespace object, no metadata.namespace */
    const char *token_secret;    /* NULL or "": render a Secret with a fresh random token;
                                    else reference this existing Secret (key "token") */
    const char *state_size;      /* the journal's PersistentVolumeClaim; NULL = "1Gi" */
};

/* Renders what `spottrain k8s render` prints: [Namespace], ServiceAccount, Role, RoleBinding
 * (namespaced only: pods get/list/watch/create/delete/patch, events create, the job's
 * ConfigMap get), [Secret], ConfigMap, PersistentVolumeClaim, the coordinator Deployment
 * (1 replica, Recreate, /healthz probes) and its Service (grpc + http), as a multi-document
 * YAML stream. Worker pods are not rendered: the coordinator creates them. Returns 0 and
 * *ret_yaml (caller frees with st_free()), -EINVAL, -ENOMEM or an errno from getrandom(). */
int cloud_k8s_render(const struct cloud_render_opts *o, char **ret_yaml);

/* ---- the loopback IMDSv2 server (one per sim instance; also used by tests) -------------- */

struct cloud_imds_server;

struct cloud_imds_server_config {
    const char *instance_id;          /* required */
    const char *instance_type;        /* NULL = "sim.local" */
    const char *zone;                 /* NULL = "local-1a"; region = zone minus last char */
    unsigned short port;              /* 0 = any free port */
    bool token_optional;              /* false (IMDSv2 "required"): GETs need a token */
    cloud_clock_fn *clock;            /* monotonic seconds for token expiry; NULL = st_now */
    void *clock_userdata;
};

/* Starts a server on 127.0.0.1 (its own thread). Returns 0 and *ret_s or negative errno.
 * Caller frees with cloud_imds_server_free(). */
int cloud_imds_server_new(const struct cloud_imds_server_config *cfg,
                          struct cloud_imds_server **ret_s);
/* Stops the server and frees it. NULL-safe; returns NULL. */
struct cloud_imds_server *cloud_imds_server_free(struct cloud_imds_server *s);
/* The bound port. */
unsigned short cloud_imds_server_port(const struct cloud_imds_server *s);
/* "http://127.0.0.1:PORT" into buf. Returns 0 or -ENOBUFS. */
int cloud_imds_server_endpoint(const struct cloud_imds_server *s, char *buf, size_t size);
/* Posts a spot interruption notice: from now on spot/instance-action answers
 * {"action": "<action>", "time": "<time as RFC 3339 UTC>"} and spot/termination-time the time.
 * action is "terminate", "stop" or "hibernate" (-EINVAL otherwise); time is epoch seconds. */
int cloud_imds_server_set_notice(struct cloud_imds_server *s, const char *action, double time);
/* Posts a rebalance recommendation emitted at epoch seconds notice_time. */
int cloud_imds_server_set_rebalance(struct cloud_imds_server *s, double notice_time);
/* Gives the instance an instance-profile role: iam/security-credentials/ lists role and
 * iam/security-credentials/<role> answers the credentials document EC2 serves (Code, Type
 * AWS-HMAC, AccessKeyId, SecretAccessKey, Token, Expiration at epoch seconds expiration).
 * Until called those paths are 404, as on an instance without a role. */
int cloud_imds_server_set_role(struct cloud_imds_server *s, const char *role, const char *key_id,
                               const char *secret, const char *token, double expiration);
/* The next count requests (any path) get HTTP status (429, 500 or 503) instead of an answer. */
int cloud_imds_server_inject(struct cloud_imds_server *s, int status, int count);
/* Requests answered so far: token PUTs and everything else. */
void cloud_imds_server_counts(struct cloud_imds_server *s, unsigned *ret_puts, unsigned *ret_gets);

/* Formats epoch seconds as "YYYY-MM-DDTHH:MM:SSZ" (21 bytes with NUL). Returns 0 or -EINVAL. */
int cloud_format_rfc3339(double t, char *buf, size_t size);
/* Parses "YYYY-MM-DDTHH:MM:SS[.fff]Z" into epoch seconds. Returns 0 or -EINVAL. */
int cloud_parse_rfc3339(const char *s, double *ret_t);
/* Parses RFC 1123 "Tue, 09 Aug 2022 17:07:32 GMT" into epoch seconds. Returns 0 or -EINVAL. */
int cloud_parse_rfc1123(const char *s, double *ret_t);

/* ---- worker-side notice clients ------------------------------------------------------------ */

enum cloud_notice_kind {
    CLOUD_NOTICE_NONE = 0,
    CLOUD_NOTICE_TERMINATE,   /* AWS terminate, GCE preempted / TERMINATE_ON_HOST_MAINTENANCE,
                                 Azure Preempt / Terminate */
    CLOUD_NOTICE_STOP,        /* AWS stop */
    CLOUD_NOTICE_HIBERNATE,   /* AWS hibernate */
    CLOUD_NOTICE_REBALANCE,   /* AWS rebalance recommendation (a risk hint, not a deadline) */
};

struct cloud_notice {
    enum cloud_notice_kind kind;
    double time;              /* epoch seconds: the action time (AWS time, Azure NotBefore),
                                 the emit time for REBALANCE; 0 when not given */
    char event_id[CLOUD_NAME_MAX]; /* Azure EventId; "" elsewhere */
};

const char *cloud_notice_kind_name(enum cloud_notice_kind k);

/* Identity of the instance the client runs on. */
struct cloud_identity {
    char instance_id[CLOUD_NAME_MAX];
    char instance_type[CLOUD_NAME_MAX];
    char zone[CLOUD_NAME_MAX];
};

struct cloud_notice_config {
    const char *endpoint;      /* base URL; NULL = from the environment (AWS:
                                  AWS_EC2_METADATA_SERVICE_ENDPOINT, GCE: GCE_METADATA_HOST,
                                  Azure: AZURE_POD_IDENTITY_AUTHORITY_HOST, the IMDS override
                                  the bootstrap and azure-identity read too), else the cloud's
                                  link-local default */
    long timeout_ms;           /* per request; 0 = 2000 */
    long token_ttl;            /* AWS token TTL seconds, 1..21600; 0 = 21600 */
    const char *vm_name;       /* Azure: only events whose Resources name this VM; NULL = any */
    cloud_clock_fn *clock;     /* monotonic seconds for token refresh; NULL = st_now */
    void *clock_userdata;
};

struct cloud_notice_client;

/* Backend table of a notice client (AWS IMDSv2, GCE metadata, Azure scheduled events). */
struct cloud_notice_ops {
    const char *name;          /* "aws", "gcp", "azure" */
    size_t state_size;
    int (*init)(struct cloud_notice_client *c, void *state);
    void (*done)(struct cloud_notice_client *c, void *state);
    int (*poll)(struct cloud_notice_client *c, void *state, struct cloud_notice *ret_notice);
    int (*identity)(struct cloud_notice_client *c, void *state, struct cloud_identity *ret_id);
    /* Optional: tells the cloud the instance is ready for the event (Azure StartRequests). */
    int (*ack)(struct cloud_notice_client *c, void *state, const char *event_id);
};

/* Creates a client for "aws", "gcp" or "azure". Returns 0 and *ret_c, -ENOENT for another
 * name, -EINVAL for a bad config or endpoint. Caller frees with cloud_notice_client_free(). */
int cloud_notice_client_new(const char *kind, const struct cloud_notice_config *cfg,
                            struct cloud_notice_client **ret_c);
struct cloud_notice_client *cloud_notice_client_free(struct cloud_notice_client *c);
/* The base URL in use. */
const char *cloud_notice_client_endpoint(const struct cloud_notice_client *c);

/* One check, a few requests. Returns 1 and fills *ret_notice when a notice is present (an
 * interruption outranks a rebalance hint), 0 when none is, or negative errno: -ETIMEDOUT,
 * -ECONNREFUSED, -ECONNRESET, -EAGAIN (429, 410 or 5xx: retry later), -EACCES (401 after a
 * refresh, 403), -EINVAL (400: the service calls our request malformed; on the AWS token PUT
 * that is a hard error), -ENOENT (an unexpected 404), -EBADMSG (a body we cannot parse),
 * -EPROTO (another status), -EFBIG (a body over 64 KiB), -EIO. An expired AWS token (401)
 * is refreshed and the request retried once. Polling every 5 s is what AWS recommends; the
 * caller owns the schedule. */
int cloud_notice_client_poll(struct cloud_notice_client *c, struct cloud_notice *ret_notice);

/* Acknowledges a notice's event (Azure: POST StartRequests with its EventId, so the platform
 * may go ahead before NotBefore). Called by the worker once its state has left the instance.
 * Returns 0, -EOPNOTSUPP where the cloud has no acknowledgement (aws, gcp), -EINVAL for an
 * empty or overlong event id, or negative errno as for poll. */
int cloud_notice_client_ack(struct cloud_notice_client *c, const char *event_id);

/* Reads the instance's id, type and zone. Returns 0 or negative errno as above;
 * -EOPNOTSUPP where the backend has no identity call. */
int cloud_notice_client_identity(struct cloud_notice_client *c, struct cloud_identity *ret_id);

/* ---- aws: the EC2 Query API outside a job (aws.c) ----------------------------------------- */

/* Terminates every instance tagged spottrain:job=job_name that is not already terminated
 * (`spottrain down`), in cfg's region and endpoint with the environment's credentials (as the
 * aws provider finds them). Idempotent. Returns how many instances were asked to terminate
 * (>= 0), or negative errno: -EACCES for refused credentials (the AWS error code is logged),
 * -ENOKEY when no credentials are found, -ETIMEDOUT/-ECONNREFUSED for a dead endpoint,
 * -EBADMSG for an answer that is not EC2 XML, -EPROTO for another AWS error. */
int cloud_aws_down(const struct cloud_config *cfg, const char *job_name);

/* ---- gcp and azure outside a job (gcp.c, azure.c) ----------------------------------------- */

/* Deletes every instance labelled (gcp: spottrain-job, in each of the spec's zones) or tagged
 * (azure: spottrain-job, in the spec's resource group) with job_name that is still alive
 * (`spottrain down`), with the credentials the provider finds in the environment; cfg->spec
 * gives the project or subscription and the endpoint. Idempotent. Returns how many were asked
 * to delete (>= 0), or negative errno: -EINVAL for a spec without them, -EACCES for refused
 * credentials (the cloud's error is logged), -ENOKEY when none are found, -ETIMEDOUT or
 * -ECONNREFUSED for a dead endpoint, -EPROTO for another error. */
int cloud_gcp_down(const struct cloud_config *cfg, const char *job_name);
int cloud_azure_down(const struct cloud_config *cfg, const char *job_name);

#endif
