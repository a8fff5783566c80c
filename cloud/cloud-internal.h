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

/* Logs through the injected logger (or st_log). */
void cloud__log(struct cloud_provider *p, int level, const char *fmt, ...) ST_PRINTF(3, 4);

/* Appends a signal. Returns 0, -ENOBUFS when CLOUD_SIGNAL_QUEUE_MAX are queued, -ENOMEM. */
int cloud__emit(struct cloud_provider *p, const struct cloud_signal *sig);

/* The sim backend (sim.c). */
extern const struct cloud_provider_ops cloud__sim_ops;
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
    void *curl; /* CURL *, reused so connections are kept alive */
    void *state;
};

#define CLOUD_HTTP_BODY_MAX 65536 /* larger metadata bodies are refused (-EFBIG) */

struct cloud_http_reply {
    long status;
    char *body;          /* NUL-terminated, st_free()d by cloud__http_reply_done() */
    size_t len;
    long ttl_header;     /* X-Aws-Ec2-Metadata-Token-Ttl-Seconds, -1 when absent */
};

/* One request: method "GET" or "PUT", url = endpoint + path_and_query, extra headers
 * ("Name: value", NULL-terminated). Returns 0 with the reply filled (any status), or
 * -ETIMEDOUT, -ECONNREFUSED, -EFBIG, -ENOMEM, -EIO for transport failures. */
int cloud__http(struct cloud_notice_client *c, const char *method, const char *path_and_query,
                const char *const *headers, struct cloud_http_reply *ret_reply);
void cloud__http_reply_done(struct cloud_http_reply *r);
/* Maps a non-success HTTP status to a negative errno (see cloud_notice_client_poll). */
int cloud__http_status_errno(long status);
/* The clock of the client (injected or st_now). */
double cloud__client_now(struct cloud_notice_client *c);

#endif
