/* spec.h: the job spec (apiVersion spottrain/v1, kind TrainingJob) as a resolved struct.
 *
 * Included by common.h; this is part of common/'s public interface. st_spec_load() parses
 * YAML with libyaml, fills every default, runs the cross-field checks and reports every
 * error found (not only the first) with file:line:column and the field path. The format is
 * documented in docs/job-spec.md. */
#ifndef ST_SPEC_H
#define ST_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct st_error;

#define ST_SPEC_MAX_ZONES 16
#define ST_SPEC_MAX_KV 16          /* fleet.kubernetes.node_selector / resources entries */
#define ST_SPEC_MAX_TOLERATIONS 16 /* fleet.kubernetes.tolerations entries */
#define ST_SPEC_PATH_MAX 512

enum st_precision { ST_PRECISION_FP32 = 0, ST_PRECISION_BF16 };
enum st_lr_schedule { ST_LR_COSINE = 0, ST_LR_CONSTANT, ST_LR_LINEAR };
enum st_provider {
    ST_PROVIDER_SIM = 0,
    ST_PROVIDER_AWS,
    ST_PROVIDER_GCP,
    ST_PROVIDER_AZURE,
    ST_PROVIDER_KUBERNETES
};

struct st_spec_model {
    /* Built-in GPT (used when profile is empty). */
    int layers;   /* transformer blocks */
    int hidden;   /* model width (channels) */
    int heads;    /* attention heads; divides hidden */
    int vocab;    /* vocabulary size; tokens are uint16 so <= 65536 */
    int seq_len;  /* tokens per sample (context length) */
    /* Simulation only: a cost-profile file (Parcae's profile JSON) and the model in it. */
    char profile[ST_SPEC_PATH_MAX];    /* "" = built-in GPT */
    char profile_model[128];           /* model key inside a multi-model profile; "" = only one */
};

struct st_spec_data {
    char train[ST_SPEC_PATH_MAX]; /* token file: nanoGPT raw uint16 or llm.c header + uint16 */
    char val[ST_SPEC_PATH_MAX];   /* "" = none */
    /* data.synth: when train is missing, `spottrain data synth` generates it first. */
    bool synth;            /* a synth block was given */
    int synth_order;       /* Markov order of the synthetic corpus */
    uint64_t synth_seed;
    uint64_t synth_tokens; /* corpus length in tokens */
};

struct st_spec_optimizer {
    char name[16];        /* "adamw" (the only one in v1) */
    double lr;            /* peak learning rate */
    double beta1, beta2;
    double eps;
    double weight_decay;  /* decoupled */
    double grad_clip;     /* global-norm clip; 0 = off */
    int warmup_steps;
    enum st_lr_schedule schedule; /* after warmup */
    double min_lr_ratio;  /* final lr = lr * min_lr_ratio (cosine/linear) */
};

struct st_spec_training {
    int global_batch;     /* samples per step, constant across shapes */
    int micro_batch;      /* samples per micro-batch; divides global_batch */
    int steps;
    struct st_spec_optimizer optimizer;
    uint64_t seed;
    enum st_precision precision;
};

/* One entry of a string -> string mapping: a Kubernetes label (node_selector) or a
 * resource name and its quantity (resources: "nvidia.com/gpu": "1"). */
struct st_spec_kv {
    char key[254];        /* [prefix/]name: a DNS subdomain prefix and a 63-character name */
    char value[64];
};

/* A Kubernetes toleration (the pod field, in the spec's snake_case). */
struct st_spec_toleration {
    char key[254];        /* "" with operator Exists = every taint */
    char op[8];           /* "Equal" (default) or "Exists" */
    char value[64];       /* "" with Exists */
    char effect[20];      /* "", NoSchedule, PreferNoSchedule or NoExecute */
    long long seconds;    /* toleration_seconds (NoExecute only); -1 = not given */
};

struct st_spec_kv_list {
    int n;
    struct st_spec_kv v[ST_SPEC_MAX_KV];
};

/* fleet.kubernetes: how the kubernetes provider shapes worker pods. */
struct st_spec_kubernetes {
    struct st_spec_kv_list node_selector;
    int n_tolerations;
    struct st_spec_toleration tolerations[ST_SPEC_MAX_TOLERATIONS];
    struct st_spec_kv_list resources; /* requests = limits (GPUs need both equal) */
    char priority_class[254]; /* PriorityClass name; "" = none */
};

struct st_spec_fleet {
    enum st_provider provider;
    char instance_type[64];
    int gpus_per_instance;
    int min;              /* instances */
    int max;
    int nzones;
    char zones[ST_SPEC_MAX_ZONES][32];
    bool spot;
    bool on_demand_fallback;
    /* gcp */
    char project[64];     /* GCP project id */
    char gcp_endpoint[128]; /* Compute Engine root URL ("" = https://compute.googleapis.com) */
    /* azure */
    char subscription[64];  /* Azure subscription id */
    char resource_group[96];
    char location[48];      /* Azure region, e.g. "westeurope" */
    char azure_subnet[384]; /* subnet resource id the VMs' NICs are created on */
    char azure_endpoint[128]; /* ARM root URL ("" = https://management.azure.com) */
    /* sim provider */
    char trace[ST_SPEC_PATH_MAX]; /* trace file (events CSV, counts CSV, replay JSONL, seconds,N) */
    double time_scale;    /* wall seconds per trace second; 2/60 = one trace minute in 2 s */
    double notice_seconds;    /* interruption notice lead time, seconds (default by provider:
                                 sim and aws 120, gcp and azure 30) */
    double unannounced;       /* fraction of removals without notice, [0, 1] */
    /* prices, dollars per instance-hour */
    double spot_price;
    double on_demand_price;
    uint64_t gpu_memory;      /* bytes of memory per GPU, for the cost model's fit check */
    double gpu_tflops;        /* sustained TFLOP/s per instance, for the cost model */
    double net_gbps;          /* network Gb/s per instance, for the cost model */
    /* the image workers run: kubernetes the container image; cloud providers the machine
     * image (AWS AMI id, GCE image URL, Azure image resource id or
     * PUBLISHER:OFFER:SKU:VERSION) with spottrain on PATH; "" = none */
    char image[256];
    struct st_spec_kubernetes kubernetes;
    /* fleet.data_plane: how workers protect the data connections between them */
    bool data_plane_tls; /* TLS 1.3 (epoch secret as PSK) on every data connection */
    /* A live migration's optimizer moments move while the new epoch's first step runs its
     * forward and backward passes, not at the boundary (docs/live-migration.md); default true */
    bool data_plane_overlap;
    /* A worker that holds no state (a spare) faults in the memory of the largest position it
     * could be given while it waits, so that taking one costs no page faults at the
     * boundary (worker/reserve.c); default true */
    bool prewarm;
};

struct st_spec_planner {
    double interval;      /* seconds of cloud time between decisions (default 60) */
    int lookahead;        /* intervals the liveput DP looks ahead (default 12) */
    char predictor[32];   /* a name of planner/predictors.def (default "notice") */
    int dp_min, dp_max;   /* bounds; 0 = unbounded */
    int pp_min, pp_max;
    int dp, pp;           /* pinned shape; 0 = planner chooses */
    double wait_limit;    /* seconds of cloud time the job may wait for a fleet that can
                           * host a feasible shape before it stops with an error (default
                           * 1800) */
    bool learn;           /* decide on the cost model fitted to the job's measured steps and
                           * migrations (default true); false: on the spec's fleet figures */
    char migration_costs[ST_SPEC_PATH_MAX]; /* a cost file (scripts/bench migration) the
                           * fitted model starts from; "" = the spec's figures */
};

struct st_spec_checkpoint {
    char dir[ST_SPEC_PATH_MAX];
    double interval;      /* seconds between durable checkpoints; 0 = off */
    int keep;             /* how many to keep */
};

/* fault_tolerance: in-memory peer copies of state (docs/live-migration.md, "Peer copies"). */
struct st_spec_fault_tolerance {
    int peer_copy_every;       /* steps between peer copies; 0 = off */
    uint64_t peer_copy_memory; /* bytes a worker may spend on copies (its own and a peer's) */
    bool peer_copy_background; /* exchange on a thread while training goes on (true), or at the
                                  step boundary (false) */
};

struct st_spec_coordinator {
    char listen[128];     /* HOST:PORT for gRPC */
    char advertise[256];  /* HOST:PORT workers dial; "" = the bound address (or, in
                             Kubernetes, the Service `spottrain k8s render` makes) */
    double heartbeat_deadline; /* seconds of silence before a worker is declared lost */
    double reconfig_timeout;   /* seconds a reconfiguration may go without progress before
                                  it fails (default 30) */
    /* coordinator.tls: cert + key turn on TLS for gRPC and REST; client_ca also requires
     * and verifies client certificates (mutual TLS). "" = not set; files must exist. */
    char tls_cert[ST_SPEC_PATH_MAX];      /* PEM certificate chain of the server */
    char tls_key[ST_SPEC_PATH_MAX];       /* PEM private key of tls_cert */
    char tls_client_ca[ST_SPEC_PATH_MAX]; /* PEM CA bundle client certificates must chain to */
    int events_keep;      /* journal keeps the newest N events (default 10000) */
};

struct st_spec_status {
    char listen[128];     /* HOST:PORT for REST + /metrics; "" = off */
    char token_file[ST_SPEC_PATH_MAX]; /* bearer token for writes and gRPC; "" = none */
};

#define ST_SPEC_MAX_WHERE 160 /* positions kept; the format has fewer than 100 fields */

/* Where a field given in the file was (its value), for errors found after parsing. */
struct st_spec_where {
    char path[64];         /* "spec.planner.dp"; longer paths are not kept */
    int line, column;      /* 1-based */
};

struct st_spec {
    char path[ST_SPEC_PATH_MAX]; /* the file it was loaded from */
    char api_version[32];  /* "spottrain/v1" */
    char kind[32];         /* "TrainingJob" */
    char name[128];        /* metadata.name */
    struct st_spec_model model;
    struct st_spec_data data;
    struct st_spec_training training;
    struct st_spec_fleet fleet;
    struct st_spec_planner planner;
    struct st_spec_checkpoint checkpoint;
    struct st_spec_fault_tolerance fault_tolerance;
    struct st_spec_coordinator coordinator;
    struct st_spec_status status;
    int nwhere;            /* positions of the fields given in the file (st_spec_where) */
    struct st_spec_where where[ST_SPEC_MAX_WHERE];
};

/* Fills every field with its default (docs/job-spec.md). */
void st_spec_defaults(struct st_spec *spec);

/* Parses and validates a job spec file. On success returns 0 and fills *ret_spec.
 * On invalid input returns -EINVAL and fills errs[0..min(n,max_errs)) with every error found,
 * in file order, and *ret_nerrs with the total count; *ret_spec is untouched.
 * Other negative errno on I/O failure (errs[0] names the file). Never logs. */
int st_spec_load(const char *path, struct st_spec *ret_spec, struct st_error *errs,
                 size_t max_errs, size_t *ret_nerrs);

/* Same, from a buffer; `name` is used in error positions. */
int st_spec_parse(const char *name, const char *data, size_t len, struct st_spec *ret_spec,
                  struct st_error *errs, size_t max_errs, size_t *ret_nerrs);

/* Resolved spec as JSON text (every default filled in). Caller frees with st_free(). */
char *st_spec_to_json(const struct st_spec *spec);

const char *st_provider_name(enum st_provider p);

/* Where `field` (a dotted path such as "spec.planner.dp") was given in the spec's file; for
 * a field left to its default, where its nearest given parent mapping was. Writes *ret_line
 * and *ret_column (1-based). Returns 0 for the field itself, 1 for a parent, -ENOENT when
 * neither was given (a spec not parsed from a file), -EINVAL on bad arguments. Callers with
 * a verdict about a parsed spec (plan_feasible) use it to name file:line:column. */
int st_spec_where(const struct st_spec *spec, const char *field, int *ret_line,
                  int *ret_column);

#endif
