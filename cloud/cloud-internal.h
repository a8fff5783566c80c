/* cloud-internal.h: what the files of cloud/ share and no other part may include — the
 * provider handle, its signal queue and the injected logger.
 *
 * A provider is a generic shell (magic, logger, bounded signal queue) around one backend's
 * state, which is allocated right after the shell (NCCL plugin tables, Redis ConnectionType). */
#ifndef ST_CLOUD_INTERNAL_H
#define ST_CLOUD_INTERNAL_H

#include "cloud.h"
#include "common.h" /* ST_PRINTF, st_log */

#define CLOUD_PROVIDER_MAGIC 0x436c6f7564507276ULL /* "CloudPrv" */
#define CLOUD_SIGNAL_QUEUE_MAX 65536               /* queued signals before poll fails */

struct cloud_provider {
    uint64_t magic;
    const struct cloud_provider_ops *ops;
    cloud_log_fn *log;
    void *log_userdata;
    bool started;
    bool detached;   /* cloud_provider_detach(): done() must leave instances running */
    double last_now;
    /* FIFO of signals not yet handed out: [head, head + n) modulo cap. */
    struct cloud_signal *q;
    size_t q_head, q_n, q_cap;
    void *state; /* backend state, ops->state_size bytes */
};

/* Logs through the injected logger (or st_log, also when p is NULL: `down` has no provider). */
void cloud__log(struct cloud_provider *p, int level, const char *fmt, ...) ST_PRINTF(3, 4);

/* Appends a signal. Returns 0, -ENOBUFS when CLOUD_SIGNAL_QUEUE_MAX are queued, -ENOMEM. */
int cloud__emit(struct cloud_provider *p, const struct cloud_signal *sig);

/* The sim backend (sim.c), the EC2 backend (aws.c), Compute Engine (gcp.c) and Azure
 * Resource Manager (azure.c). */
extern const struct cloud_provider_ops cloud__sim_ops;
extern const struct cloud_provider_ops cloud__aws_ops;
extern const struct cloud_provider_ops cloud__gcp_ops;
extern const struct cloud_provider_ops cloud__azure_ops;

/* ---- rest.c: what the JSON providers (gcp, azure) share ----------------------------------- */

#include <jansson.h>

#include "http.h" /* struct st_sbuf, st_sb_*: bounded strings (common/http.c) */

/* One HTTP request. Strings are borrowed; bearer and body are never logged. */
struct cloud__rest_req {
    const char *method;       /* "GET", "POST", "PUT", "DELETE" */
    const char *url;
    const char *bearer;       /* NULL = no Authorization header */
    const char *header;       /* one extra "Name: value" header or NULL */
    const char *body;         /* NULL = none */
    const char *content_type; /* of body */
    long timeout_ms;          /* whole request; 0 = 30 s (connect at most 5 s) */
};
struct cloud__rest_reply {
    long status;
    json_t *json;         /* the body parsed as JSON; NULL when empty or not JSON */
    char async_op[1024];  /* Azure-AsyncOperation header ("" = none) */
};
/* Sends req and waits for the answer (any HTTP status is a success here: the caller judges
 * it). Returns 0 or negative errno for a transport failure (-ECONNREFUSED, -ETIMEDOUT,
 * -EFBIG over 8 MiB, ...). Free the reply with cloud__rest_reply_done(). */
int cloud__rest_call(const struct cloud__rest_req *req, struct cloud__rest_reply *rep);
void cloud__rest_reply_done(struct cloud__rest_reply *rep);
/* True when the URL's host is 127.x, localhost or [::1] (http:// is accepted only there). */
bool cloud__url_is_loopback(const char *url);
/* The string member key of o, "" when absent. */
const char *cloud__json_str(const json_t *o, const char *key);
void cloud__sleep(double seconds);

/* The worker bootstrap (bootstrap.c; EC2 user-data, GCE startup-script, Azure customData):
 * writes the join token (or "<redacted>") and the job spec (when the file fits in spec_max
 * bytes), reads the instance's name from the metadata service of cloud ("aws", "gcp" or
 * "azure"), then execs `spottrain worker`. *ret: caller frees with st_free(). Returns 0,
 * -E2BIG beyond max bytes, -EINVAL for another cloud. */
int cloud__bootstrap_script(const struct cloud_config *cfg, const char *coordinator,
                            const char *cloud, bool redact, size_t max, size_t spec_max,
                            char **ret);

/* The fleet engine: a target count kept over zones by a backend that can create one named
 * instance, list the job's instances and delete one. */
typedef int cloud__fleet_seen_fn(void *userdata, const char *name, const char *zone, bool alive);
struct cloud__fleet_ops {
    /* Returns 0 once the instance exists (or, in a dry run, the request was shown), -EAGAIN
     * when the zone has no capacity (the next zone is tried), another negative errno for a
     * hard error (-EACCES: credentials). */
    int (*create)(void *backend, const char *zone, const char *name);
    /* Calls fn for every instance labelled with the job id. */
    int (*list)(void *backend, cloud__fleet_seen_fn *fn, void *userdata);
    /* Returns 0, -ENOENT when already gone, or negative errno. */
    int (*destroy)(void *backend, const char *name, const char *zone);
};
struct cloud__fleet_inst {
    bool used, dead;
    struct cloud_instance pub;
};
struct cloud__fleet {
    struct cloud_provider *p;
    const char *name; /* "gcp", "azure": log prefix */
    const struct cloud__fleet_ops *ops;
    void *backend;
    int nzones; /* 0 = the cloud chooses */
    char zones[CLOUD_MAX_ZONES][CLOUD_NAME_MAX];
    double price, interval;
    int target, zone_next;
    bool dry_run, started;
    char job_id[40], job_name[128];
    char last_error[256]; /* the cloud's last error code, for logs */
    struct cloud__fleet_inst *insts;
    size_t ninsts;
    double next_reconcile, next_fill;
};
int cloud__fleet_init(struct cloud__fleet *f, struct cloud_provider *p, const char *name,
                      const struct cloud__fleet_ops *ops, void *backend,
                      const struct cloud_config *cfg, int nzones);
/* Deletes every listed instance of the job unless the provider is detached, then frees. */
void cloud__fleet_done(struct cloud__fleet *f);
int cloud__fleet_start(struct cloud__fleet *f, double now);
int cloud__fleet_poll(struct cloud__fleet *f, double now);
int cloud__fleet_acquire(struct cloud__fleet *f, int n, double now);
int cloud__fleet_release(struct cloud__fleet *f, const char *instance, double now);
int cloud__fleet_instances(struct cloud__fleet *f, struct cloud_instance *out, size_t max,
                           size_t *ret_n);
double cloud__fleet_next_deadline(const struct cloud__fleet *f);
/* Deletes every alive instance the listing shows. Returns how many, or negative errno. */
int cloud__fleet_sweep(struct cloud__fleet *f);

/* ---- a JSON cloud's provider (rest.c): what gcp.c and azure.c differ in ------------------ */

#include "oauth.h" /* struct st_token */

/* The per-cloud part of a JSON cloud's provider; the rest of the provider is rest.c's. */
struct cloud__rest_cloud_ops {
    const char *name; /* "gcp", "azure": log prefix, fleet name */
    size_t state_size; /* bytes of the cloud's state, which starts with struct cloud__rest_cloud */
    /* st_gcp_token_get or st_azure_token_get, asked for scope (a scope or a resource). */
    int (*token_get)(const char *scope, struct st_token *t, char *why, size_t whysz);
    const char *scope;
    int tries; /* of one request when throttled or 5xx */
    const struct cloud__fleet_ops *fleet;
    /* `down`: fills the fresh state from the spec for a sweep of job_name's instances by
     * their job-name label or tag (base URL, label). Logs its own errors. */
    int (*down_init)(void *state, const struct cloud_config *cfg, const char *job_name);
};

/* What a JSON cloud's state starts with: the fleet engine and what rest.c's provider entry
 * points use and free. The cloud's own fields follow it in its own struct. */
struct cloud__rest_cloud {
    struct cloud__fleet fleet; /* first, so the state pointer is also the fleet's */
    const struct cloud__rest_cloud_ops *ops;
    struct cloud_provider *p;
    bool by_name; /* list by the job-name label or tag (down) instead of the job id */
    bool spot;
    char *boot, *boot_shown; /* the bootstrap as sent (startup-script, base64 customData)
                              * with the join token, and the same redacted */
    cloud_dry_run_fn *dry_run;
    void *dry_run_userdata;
    struct st_token token; /* the access token: never logged */
};

/* Fills the generic part of a state at init (p, ops and the config's spot and dry run). */
void cloud__rest_cloud_init(struct cloud__rest_cloud *rc, const struct cloud__rest_cloud_ops *ops,
                            struct cloud_provider *p, const struct cloud_config *cfg);
/* The length of the spec's endpoint ep (named field in the message) without its trailing
 * slashes, for "%.*s"; -EINVAL, logged, unless it is https:// or http:// on loopback (where
 * tests run their fake clouds). */
int cloud__rest_endpoint_len(struct cloud__rest_cloud *rc, const char *field, const char *ep);
/* Wipes and frees the bootstrap texts (init's failure path; done() does it too). */
void cloud__rest_cloud_free_boot(struct cloud__rest_cloud *rc);
/* One authorised call with a JSON body (borrowed, may be NULL), retried when throttled or
 * 5xx; a transport failure is logged. In a dry run, shows method, url and shown instead and
 * returns 0 with rep->status 0. Returns 0 with *rep filled (any status: the caller judges
 * it; free it with cloud__rest_reply_done()), or negative errno (no token: logged). */
int cloud__rest_cloud_send(struct cloud__rest_cloud *rc, const char *method, const char *url,
                           const json_t *body, const json_t *shown,
                           struct cloud__rest_reply *rep);
/* The provider entry points (struct cloud_provider_ops) every JSON cloud shares, to be listed
 * in its ops table after name, state_size and init. */
void cloud__rest_cloud_done(struct cloud_provider *p, void *state);
int cloud__rest_cloud_start(struct cloud_provider *p, void *state, double now);
int cloud__rest_cloud_poll(struct cloud_provider *p, void *state, double now);
int cloud__rest_cloud_acquire(struct cloud_provider *p, void *state, int n, double now);
int cloud__rest_cloud_release(struct cloud_provider *p, void *state, const char *instance,
                              double now);
int cloud__rest_cloud_instances(struct cloud_provider *p, void *state, struct cloud_instance *out,
                                size_t max, size_t *ret_n);
double cloud__rest_cloud_next_deadline(struct cloud_provider *p, void *state, double now);
#define CLOUD__REST_CLOUD_PROVIDER_OPS                                                         \
    .done = cloud__rest_cloud_done, .start = cloud__rest_cloud_start,                          \
    .poll = cloud__rest_cloud_poll, .acquire = cloud__rest_cloud_acquire,                      \
    .release = cloud__rest_cloud_release, .instances = cloud__rest_cloud_instances,            \
    .next_deadline = cloud__rest_cloud_next_deadline
/* `spottrain down` for a JSON cloud: deletes every instance labelled or tagged with job_name
 * (cloud_gcp_down, cloud_azure_down in cloud.h). Returns how many, or negative errno. */
int cloud__rest_cloud_down(const struct cloud__rest_cloud_ops *ops, const struct cloud_config *cfg,
                           const char *job_name);

/* The kubernetes backend (k8s.c). */
extern const struct cloud_provider_ops cloud__k8s_ops;

/* ---- Kubernetes (k8s-manifest.c, k8s.c) ------------------------------------------------- */

#include <jansson.h> /* json_t: the objects are jansson trees until they are serialised */

#define CLOUD_K8S_LABEL_JOB "spottrain.dev/job"       /* metadata.name of the job */
#define CLOUD_K8S_LABEL_JOB_ID "spottrain.dev/job-id" /* the journal's job id */
#define CLOUD_K8S_LABEL_ROLE "spottrain.dev/role"     /* coordinator | worker */

/* The names of a job's objects, all derived from metadata.name, so the render and the
 * provider agree without passing them around. */
struct cloud_k8s_names {
    char account[160];     /* ServiceAccount, Role and RoleBinding: spottrain-JOB */
    char config[160];      /* ConfigMap holding job.yaml; owner of the worker pods */
    char secret[160];      /* Secret holding the join token */
    char claim[160];       /* PersistentVolumeClaim of the journal */
    char coordinator[160]; /* Deployment and Service */
};
void cloud__k8s_names(const char *job, struct cloud_k8s_names *ret);
/* The gRPC and REST ports of the coordinator: the spec's listen ports, else 7070 and 8080. */
int cloud__k8s_ports(const struct st_spec *spec, int *ret_grpc, int *ret_rest);

struct cloud_k8s_pod_opts {
    const struct st_spec *spec;
    const char *name;         /* pod name (explicit: no generateName) */
    const char *ns;           /* "" or NULL = none in the object (the URL names it) */
    const char *job_id;
    const char *image;
    const char *coordinator;  /* HOST:PORT the worker dials */
    const char *token_secret; /* NULL = spottrain-JOB-token */
    const char *owner_uid;    /* the job ConfigMap's uid; NULL or "" = no owner reference */
    int grace_seconds;        /* terminationGracePeriodSeconds; <= 0 = 30 */
};
/* Builds a worker pod. Returns 0 and *ret_pod (caller json_decref()s), -EINVAL, -ENOMEM. */
int cloud__k8s_worker_pod(const struct cloud_k8s_pod_opts *o, json_t **ret_pod);
/* Serialises objects as a multi-document YAML stream ("---" before each). Returns 0 and
 * *ret_yaml (caller st_free()s) or -ENOMEM. */
int cloud__k8s_yaml(json_t *const *docs, size_t n, char **ret_yaml);

/* Notice backends (notice-aws.c, notice-gcp.c, notice-azure.c). */
extern const struct cloud_notice_ops cloud__aws_notice_ops;
extern const struct cloud_notice_ops cloud__gcp_notice_ops;
extern const struct cloud_notice_ops cloud__azure_notice_ops;

/* ---- the HTTP helper the notice clients share (http.c) ---------------------------------- */

struct cloud_notice_client {
    uint64_t magic;
    const struct cloud_notice_ops *ops;
    char endpoint[CLOUD_URL_MAX]; /* without a trailing slash */
    long timeout_ms;
    long token_ttl;
    char vm_name[CLOUD_NAME_MAX];
    cloud_clock_fn *clock;
    void *clock_userdata;
    void *share; /* CURLSH * holding the connection cache, so connections are kept alive
                  * between requests although each request has its own easy handle
                  * (cloud__http says why) */
    void *state;
};

#define CLOUD_HTTP_BODY_MAX 65536 /* larger metadata bodies are refused (-EFBIG) */

struct cloud_http_reply {
    long status;
    char *body;          /* NUL-terminated, st_free()d by cloud__http_reply_done() */
    size_t len;
    long ttl_header;     /* X-Aws-Ec2-Metadata-Token-Ttl-Seconds, -1 when absent */
};

/* One request: method "GET", "PUT" or "POST", url = endpoint + path_and_query, extra headers
 * ("Name: value", NULL-terminated). Returns 0 with the reply filled (any status), or
 * -ETIMEDOUT, -ECONNREFUSED, -EFBIG, -ENOMEM, -EIO for transport failures. */
int cloud__http(struct cloud_notice_client *c, const char *method, const char *path_and_query,
                const char *const *headers, struct cloud_http_reply *ret_reply);
/* The same with a request body (NUL-terminated, sent as is; NULL = none). */
int cloud__http_body(struct cloud_notice_client *c, const char *method,
                     const char *path_and_query, const char *const *headers, const char *body,
                     struct cloud_http_reply *ret_reply);
void cloud__http_reply_done(struct cloud_http_reply *r);
/* Maps a non-success HTTP status to a negative errno (see cloud_notice_client_poll). */
int cloud__http_status_errno(long status);
/* The clock of the client (injected or st_now). */
double cloud__client_now(struct cloud_notice_client *c);

#endif
