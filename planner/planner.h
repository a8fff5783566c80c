/* planner.h: the public header of planner/ — spot traces, the cost model, forecasts, the
 * liveput optimizer and the trace simulator.
 *
 * planner/ is pure: no I/O, no clocks, no globals, no logging. Parsers take buffers (the CLI
 * reads files with st_read_file) and return -EINVAL with a struct st_error naming the line
 * and field. The cost model follows Parcae's (NSDI'24) published simulator so that decisions
 * we export can be scored by it; docs/planner.md says where and why we differ. */
#ifndef ST_PLANNER_H
#define ST_PLANNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "reconf.h" /* enum plan_reconf: what a reconfiguration does */

struct st_spec;

struct st_error;

#define PLAN_INTERVAL_S 60.0    /* seconds per trace interval */
#define PLAN_MAX_SHAPES 8192    /* (dp, pp) shapes a cost model may hold */
#define PLAN_MAX_LAYERS 1024    /* layers a model may have */
#define PLAN_MAX_LOOKAHEAD 64   /* intervals plan_decide may look ahead */
#define PLAN_MAX_NOTICES 4096   /* noticed instances in one situation */

/* ---- traces --------------------------------------------------------------------------- */

/* One one-minute interval: an event at time t belongs to interval floor(t / 60 s). */
struct plan_interval {
    int n_before;      /* live instances before this interval's events */
    int n_in, n_out;   /* instances added / removed at the start of the interval */
    int first_in;      /* index into plan_trace.node_ids of the first added node (n_in of them) */
    int first_out;     /* same for removed nodes; -1 when the trace names no nodes */
    int ref_shape[3][2]; /* shapes recorded in replay files: throughput-opt, truth, predict;
                          * {0,0} when absent */
};

struct plan_trace {
    int nintervals;
    struct plan_interval *iv;   /* nintervals entries */
    int *node_ids;              /* node identities referenced by iv[].first_in/first_out */
    int nnode_ids;
    int nnames;                 /* distinct node names (ids are 0..nnames-1) */
    bool named;                 /* events name their nodes */
    bool has_ref;               /* ref_shape filled (replay JSON lines) */
};

/* Parses a trace in any supported format, detected from its content: events CSV
 * (timestamp_ms,add|remove,node), counts CSV (timestamp_ms,N), replay JSON lines
 * ([timestamp_ms, "add"|"remove"|"no-op", {"nodes": [...], ...}]) or the plain step format
 * (seconds,N; two rows at the same second mark a change; '#' starts a comment line).
 * `name` is used in error positions. Returns 0 and a heap trace (free with plan_trace_free),
 * or -EINVAL with *err filled (line, field), or -ENOMEM. */
int plan_trace_parse(const char *name, const char *text, size_t len, struct plan_trace **ret,
                     struct st_error *err);
/* Frees a trace; NULL-safe; returns NULL. */
struct plan_trace *plan_trace_free(struct plan_trace *t);
/* Live instances after interval i's events. */
static inline int plan_trace_n_after(const struct plan_trace *t, int i) {
    return t->iv[i].n_before + t->iv[i].n_in - t->iv[i].n_out;
}

/* ---- decisions files (Parcae's format) -------------------------------------------------- */

/* Parcae's decisions file: a JSON list of {"interval": [N, in, out], "throughut-opt": [dp,pp],
 * "liveput-truth": [dp,pp], "liveput-predict": [dp,pp]}. shapes[i][k] for k = 0 throughput-opt,
 * 1 liveput-truth, 2 liveput-predict; intervals[i] = {N_before, n_in, n_out}. */
struct plan_decisions {
    int n;
    int (*intervals)[3];
    int (*shapes)[3][2];
};
/* Parses a decisions file. Returns 0 and a heap object (plan_decisions_free), or -EINVAL
 * with *err filled, or -ENOMEM. */
int plan_decisions_parse(const char *name, const char *text, size_t len,
                         struct plan_decisions **ret, struct st_error *err);
struct plan_decisions *plan_decisions_free(struct plan_decisions *d);

/* ---- cost model ----------------------------------------------------------------------- */

struct plan_shape {
    int dp, pp;
};

enum plan_mig_kind {
    PLAN_KIND_NONE = 0,
    PLAN_KIND_INTRA,       /* intra-stage: communicator rebuild only */
    PLAN_KIND_INTER,       /* inter-stage: a stage's weights + optimizer state over the link */
    PLAN_KIND_REPARTITION, /* pipeline repartition: layers change owner, broadcast to replicas */
    PLAN_KIND_GROWTH,      /* new instances join an unchanged-depth pipeline (inter-stage add) */
    PLAN_KIND_RESTART,     /* checkpoint restart */
    PLAN_KIND_NKINDS
};
/* "intra-stage", "inter-stage", ... */
const char *plan_mig_kind_name(enum plan_mig_kind k);

/* Parcae's per-model constants: which group-rebuild formula, process start time, whether an
 * "add" restart pays restart_extra_ms. */
enum plan_family { PLAN_FAMILY_GPT = 0, PLAN_FAMILY_VGG, PLAN_FAMILY_OTHER };

/* A cost model. Built from a Parcae profile (plan_cost_from_profile) or analytically
 * (plan_cost_analytic). Immutable once built; plan_decide and the simulator only read it. */
struct plan_cost {
    char model[64];              /* e.g. "gpt-1.5b" */
    enum plan_family family;
    double group_remove_ms;      /* ms per process group on removal (GPT family) */
    int micro_batch, global_batch;
    int nshapes;
    struct plan_shape *shapes;   /* profiled / feasible shapes */
    double *samples_per_s;       /* per shape */
    int pp_min, pp_max;          /* pipeline-depth bounds (Parcae's per-model bounds) */
    uint64_t pp_ignore;          /* bit pp set: depth never used (pp < 64) */
    bool dp1_ignored;            /* Parcae ignores dp = 1 for VGG-19 */
    int nlayers;
    double *layer_params;        /* parameters per layer, pipeline order */
    double *prefix;              /* prefix[i] = sum of layer_params[0..i) */
    int np2p;
    double p2p_bytes[64], p2p_us[64]; /* point-to-point time per message size */
    double build_ms[PLAN_MAX_LAYERS + 1]; /* model build time per pp; <0 = unknown */
    double restart_extra_ms;     /* extra restart time on "add" (0 when none) */
    double proc_ms, rdzv_ms;     /* process start, rendezvous */
    double ckpt_ms;              /* checkpoint save+load of the checkpoint-restart baseline */
    double state_bytes_per_param; /* weights + Adam moments: 12 */
    int max_n;                   /* largest instance count the shapes cover */
    /* derived by the builders */
    double *maxpart_params;      /* [pp]: parameters of the largest stage at depth pp */
    int last_start[PLAN_MAX_LAYERS + 1]; /* [pp]: first layer of the last stage */
    int *index;                  /* shape index by (dp, pp): index[pp * (max_n + 1) + dp] */
    /* set by plan_cost_use_measured: live-migration costs replace Parcae's */
    bool measured;
    double meas_fixed_ms[PLAN_RECONF_NLIVE];     /* per live kind (reconf.h), ms */
    double meas_bytes_per_ms[PLAN_RECONF_NLIVE]; /* per live kind, bytes/ms over the link */
    bool meas_at_boundary;       /* a migration moves its state at the boundary, all of it in
                                    its stall (fleet.data_plane.overlap false); else after it,
                                    beside the first step (docs/planner.md) */
};

/* Reads Parcae's profile JSON as is (anchors/parcae-cost-profiles.json). `model` picks one
 * entry of "models"; NULL or "" is allowed when the file holds exactly one. Returns 0 and a
 * heap cost model (plan_cost_free), -ENOENT when the model is not in the file (err names the
 * models), -EINVAL on malformed input, -ENOMEM. */
int plan_cost_from_profile(const char *name, const char *text, size_t len, const char *model,
                           struct plan_cost **ret, struct st_error *err);

/* Analytic description of a model nobody profiled and the instances it runs on. */
struct plan_model_desc {
    int layers, hidden, seq, vocab;
    int micro_batch, global_batch;
    double gpu_tflops;   /* sustained TFLOP/s per instance */
    double gpu_mem_gib;  /* memory per instance */
    double net_gbps;     /* network Gb/s per instance */
    int max_n;           /* largest instance count to plan for */
};
/* Builds a cost model from a description: 1F1B time with its bubble, DP all-reduce, and
 * per-stage memory feasibility (weights, gradients, Adam state, activations). Shapes that do
 * not fit in memory are left out. Returns 0, -EINVAL (bad description), -ENOMEM. */
int plan_cost_analytic(const struct plan_model_desc *d, struct plan_cost **ret);
/* The cost model a job's planner decides with: the analytic model of the spec's built-in GPT
 * on the spec's hardware figures (fleet.gpu_tflops, fleet.net_gbps, fleet.gpu_memory), for up
 * to fleet.max x gpus_per_instance workers. Returns 0 and *ret (plan_cost_free), -EOPNOTSUPP
 * for a profiled model (simulation only), -EINVAL, -ENOMEM. */
int plan_cost_from_spec(const struct st_spec *spec, struct plan_cost **ret);
struct plan_cost *plan_cost_free(struct plan_cost *c);
/* A deep copy of c (callers that adjust a model, e.g. plan_fit). Returns 0 and *ret
 * (plan_cost_free), -EINVAL, -ENOMEM. */
int plan_cost_dup(const struct plan_cost *c, struct plan_cost **ret);

/* Samples per second of a shape; 0 when the shape is not in the model. */
double plan_cost_throughput(const struct plan_cost *c, int dp, int pp);
/* Index of the shape in c->shapes, or -1. */
int plan_cost_shape_index(const struct plan_cost *c, int dp, int pp);
/* True when Parcae's planner may pick this shape (pp bounds, ignored depths/dp). */
bool plan_cost_shape_allowed(const struct plan_cost *c, int dp, int pp);
/* Best-throughput allowed-or-not shape with dp*pp <= n (Parcae's best_strategy, which looks at
 * every profiled shape); {0,0} when none fits. */
struct plan_shape plan_cost_best_shape(const struct plan_cost *c, int n);
/* Point-to-point send time in ms for `bytes` (interpolated from the profile). */
double plan_cost_p2p_ms(const struct plan_cost *c, double bytes);
/* Restart time in ms (Parcae estimate_restart_cost); add = instances join. */
double plan_cost_restart_ms(const struct plan_cost *c, int dp, int pp, bool add);
/* Stage boundaries of the pipeline split: bounds[0..pp] (layers [bounds[s], bounds[s+1])).
 * bounds must hold pp+1 ints. Returns 0 or -EINVAL (pp out of range). */
int plan_cost_partition(const struct plan_cost *c, int pp, int *bounds);

/* Cost of one reconfiguration, for a known set of victims. Instances are numbered as in
 * Parcae: the first D*P are the grid (instance i is in stage i % P, replica i / P), the rest
 * are spares. From shape (D, P) on N instances, n_in join and the instances victims[0..n_out)
 * leave; the job moves to (dp, pp). D = P = 0 means no job yet. Returns the time in ms and
 * the kind in *ret_kind (may be NULL). */
double plan_cost_transition_ms(const struct plan_cost *c, int N, int D, int P, int n_in,
                               const int *victims, int n_out, int dp, int pp,
                               enum plan_mig_kind *ret_kind);
/* The same averaged over victims drawn uniformly (Parcae's Monte Carlo), with `samples`
 * deterministic draws from `seed`; exact (one evaluation) when n_out == 0. */
double plan_cost_transition_expected_ms(const struct plan_cost *c, int N, int D, int P,
                                        int n_in, int n_out, int dp, int pp, int samples,
                                        uint64_t seed, enum plan_mig_kind *ret_kind);
/* Fast planning estimate of the same expectation, O(1) after the partition: exact
 * probability of staying intra-stage (hypergeometric over stages), victim-free repartition.
 * Used inside plan_decide. */
double plan_cost_transition_estimate_ms(const struct plan_cost *c, int N, int D, int P,
                                        int n_in, int n_out, int dp, int pp,
                                        enum plan_mig_kind *ret_kind);

/* ---- measured migration costs (scripts/bench migration, docs/planner.md) ----------------- */

/* A cost file gives figures for each live kind, PLAN_RECONF_INTRA_STAGE ..
 * PLAN_RECONF_DP_RESHARDING (reconf.h), in the names the run summary uses. */

/* A migration cost file: per kind the stall not explained by bytes and the data plane's
 * throughput, measured on `machine` whose raw link (loopback TCP) carried link_gbps. */
struct plan_measured_costs {
    char machine[128];
    double link_gbps;                          /* raw link of the measurement, Gb/s */
    double fixed_s[PLAN_RECONF_NLIVE];         /* seconds per migration of this kind */
    double bytes_per_s[PLAN_RECONF_NLIVE];     /* data-plane throughput, bytes/s */
    double raw_bytes_per_s[PLAN_RECONF_NLIVE]; /* raw TCP in the same setting (optional "raw_
                                                * bytes_per_s"; 0 = link_gbps), bytes/s */
    int samples[PLAN_RECONF_NLIVE];            /* migrations behind fixed_s (optional
                                                * "samples", 1 when absent; 0: a stand-in,
                                                * not measured) */
};

/* Parses a cost file: {"machine": "...", "link_gbps": G, "kinds": {"intra-stage": {"fixed_s":
 * F, "bytes_per_s": B}, "inter-stage": {...}, "pipeline": {...}, "dp-resharding": {...}}};
 * other fields are ignored. Every kind is required, fixed_s >= 0 and finite, bytes_per_s and
 * link_gbps > 0, an optional samples an integer >= 0. Returns 0 and fills *ret, or -EINVAL
 * with err naming the field. */
int plan_measured_costs_parse(const char *name, const char *text, size_t len,
                              struct plan_measured_costs *ret, struct st_error *err);
/* m as a cost file plan_measured_costs_parse reads back, with "source" saying where it came
 * from (may be NULL). Returns 0 and *ret (st_free), -EINVAL, -ENOMEM. */
int plan_measured_costs_format(const struct plan_measured_costs *m, const char *source,
                               char **ret);

/* Makes c charge migrations with measured costs instead of Parcae's restart-based ones:
 * bytes from c's layer sizes (state_bytes_per_param per parameter) over a link of link_gbps
 * at the efficiency the data plane reached against raw TCP when measured (bytes_per_s over
 * raw_bytes_per_s, or over link_gbps; at most 1) (link_gbps <= 0:
 * the measured throughput as is), plus the kind's fixed part. Intra-stage moves cost their
 * fixed part; a dp change adds the dp-resharding one and the ZeRO-1 shard bytes. Restarts
 * (checkpoint-restart policy) keep Parcae's formulas. Returns 0, or -EINVAL. Called by
 * `spottrain simulate --migration-costs`. */
int plan_cost_use_measured(struct plan_cost *c, const struct plan_measured_costs *m,
                           double link_gbps);

/* ---- the cost model fitted online (planner/fitted.c) --------------------------------------- */

/* A cost model that starts from a prior (plan_cost_from_spec, or a profile) and is fitted from
 * the job's own measurements: step seconds per shape, and each migration's bytes and stall.
 * Used by the coordinator's loop; pure like the rest of planner/. */
struct plan_fit;
/* Returns 0 and *ret (plan_fit_free; the prior is copied, not kept), -EINVAL, -ENOMEM. */
int plan_fit_new(const struct plan_cost *prior, struct plan_fit **ret);
struct plan_fit *plan_fit_free(struct plan_fit *f);
/* Predicted seconds per step of a shape: for a shape that ran, the prior x exp(a moving
 * average of its own log(measured / prior)); for one that did not, the prior x exp(a + b log
 * dp + c log pp), a, b, c fitted to every shape's log(measured / prior) by decaying least
 * squares (b, c pulled to 0); the prior before any measurement; 0 when the shape is not in the
 * model. */
double plan_fit_step_seconds(const struct plan_fit *f, int dp, int pp);
/* One step of `seconds` measured on shape (dp, pp). Returns 0, or -EINVAL (unknown shape,
 * seconds not > 0). */
int plan_fit_observe_step(struct plan_fit *f, int dp, int pp, double seconds);
/* How far a step-time prediction of a shape that ran typically is from what it then measures,
 * as a fraction: exp(a decayed mean of |log(measured / predicted)|) - 1 over the observations
 * of shapes seen before (0 before any). On shared CPU cores it is a few percent. */
double plan_fit_step_spread(const struct plan_fit *f);
/* Raises o's margins (hysteresis, defer; NAN: the defaults for the fitted model,
 * plan_fit_cost) to the step spread: a change the step times cannot tell from noise is not
 * worth a migration. Without it, two shapes measured within a few percent of each other take
 * turns, each move bought by the last interval's noise (scripts/bench cost-model --minutes
 * 150, docs/planner.md). */
struct plan_options;
void plan_fit_margins(struct plan_fit *f, struct plan_options *o);
/* Predicted stall of a live migration of kind k moving `bytes`, all of them in the stall: the
 * kind's fitted fixed part (fitted.c says how; for a kind without a figure, the same over
 * every kind measured; the prior's intra-stage estimate before any) plus the bytes over the
 * prior's link (or the cost file's throughput). -1 on bad arguments. */
double plan_fit_stall_seconds(const struct plan_fit *f, enum plan_reconf k, double bytes);
/* One migration measured whose bytes all stalled. Returns 0 or -EINVAL. */
int plan_fit_observe_migration(struct plan_fit *f, enum plan_reconf k, double bytes,
                               double stall_s);
/* What a live migration moves, as the cost model charges it (docs/planner.md): its weights
 * stall the new shape's first step; its optimizer moments move while that step runs, and
 * only what outlasts the step stalls (all of it when the prior's meas_at_boundary is set). */
struct plan_fit_move {
    double weight_bytes, moment_bytes;
    int dp, pp;     /* the new shape, whose predicted step hides the moments */
    bool dp_change; /* dp changes too: the dp-resharding fixed part adds to the kind's */
};
/* plan_fit_stall_seconds and plan_fit_observe_migration for such a move: the prediction the
 * planner's own charge makes (the kind's fixed part, the dp-resharding one where dp changes,
 * and the transfers), and the fixed part the measurement leaves beside it. Moves are observed
 * under their base kind (intra-stage, inter-stage, pipeline; dp-resharding is -EINVAL): a
 * move that changes dp also teaches what such a change adds. Predicted with k dp-resharding:
 * that added part alone. */
double plan_fit_stall_seconds_move(const struct plan_fit *f, enum plan_reconf k,
                                   const struct plan_fit_move *mv);
int plan_fit_observe_move(struct plan_fit *f, enum plan_reconf k,
                          const struct plan_fit_move *mv, double stall_s);
/* Whether stall predictions rest on measurements: a migration of this job was observed, or a
 * cost file (plan_fit_start_costs) gave every kind's figures. False with the prior alone. */
bool plan_fit_stall_calibrated(const struct plan_fit *f);
/* Starts the migration costs from a cost file (scripts/bench migration, or a job's
 * `--save-costs`) instead of the prior's: each kind's fixed part is the file's, counted as
 * its samples (at most 4) migrations beside the ones this job measures, and bytes cross at
 * the file's throughput of that kind, in predictions and in the fit alike. Call before the
 * first observation. Returns 0 or -EINVAL. */
int plan_fit_start_costs(struct plan_fit *f, const struct plan_measured_costs *m);
/* The migration costs fitted so far, in a cost file's shape: per kind the fixed part charged
 * now, the throughput used and the migrations behind the figure (the start file's and this
 * job's); machine, link and raw rates from the start file (the prior's link without one).
 * Returns 0, -ENODATA when this job measured no migration, -EINVAL. */
int plan_fit_costs(const struct plan_fit *f, struct plan_measured_costs *ret);
/* The fitted model for plan_decide: throughput from the predicted step times and, once a
 * migration was measured, migrations charged with the fitted costs (plan_cost_use_measured).
 * Borrowed; valid until the next call or plan_fit_free. */
const struct plan_cost *plan_fit_cost(struct plan_fit *f);

/* ---- forecast ------------------------------------------------------------------------- */

enum plan_predictor {
#define PLAN_PREDICTOR(e, name, doc) e,
#include "predictors.def" /* last-value, arima, damped, notice */
#undef PLAN_PREDICTOR
    PLAN_PRED_NKINDS
};
const char *plan_predictor_name(enum plan_predictor p);
/* The names, comma-separated ("last-value, arima, ..."), for messages. */
const char *plan_predictor_names(void);
/* Parses a name of predictors.def; returns 0 or -EINVAL. */
int plan_predictor_parse(const char *s, enum plan_predictor *ret);

/* Predicts live instances for each of the next L intervals from hist[0..nhist) (counts after
 * each past interval, oldest first; hist[nhist-1] = now). Writes ret_n[0..L). `seed` feeds
 * the deterministic draw that replaces Parcae's Poisson sample. Returns 0 or -EINVAL. */
int plan_forecast(enum plan_predictor p, const int *hist, int nhist, int L, int lo, int hi,
                  uint64_t seed, int *ret_n);

/* Mean absolute error of predictor p per horizon over a count series: a forecast is made
 * after every interval t (history counts[0..t]) and compared with counts[t+1..t+L].
 * For PLAN_PRED_NOTICE, n_out[] (removals per interval, may be NULL) within notice_s seconds
 * of t are known losses. Writes ret_mae[0..L) and returns the number of forecasts, or -EINVAL. */
int plan_forecast_eval(enum plan_predictor p, const int *counts, const int *n_out, int n, int L,
                       int lo, int hi, double notice_s, double *ret_mae);

/* ---- liveput optimizer ---------------------------------------------------------------- */

struct plan_notice {
    int instance;      /* instance id (position: grid index or spare, as in the cost model) */
    double seconds;    /* seconds until it is lost */
};

/* What the coordinator knows at a decision point (the start of an interval). */
struct plan_situation {
    struct plan_shape cur;    /* shape running now; {0,0} when none */
    int n_before;             /* instances live before this interval's events */
    int n_in, n_out;          /* this interval's events (already happened) */
    bool migrating;           /* a reconfiguration is still in progress */
    double remain_ms;         /* its remaining time */
    const int *hist;          /* live counts after each past interval, oldest first, */
    int nhist;                /*   ending with the count after this interval's events */
    const struct plan_notice *notices; /* announced losses (known victims) */
    int nnotices;
    const int *future;        /* when non-NULL: the true counts after each of the next */
    int nfuture;              /*   intervals (oracle); the forecast is not used */
};

struct plan_rules;
struct plan_options {
    int lookahead;            /* L intervals (default 12) */
    enum plan_predictor predictor;
    int pp_min, pp_max;       /* extra bounds; 0 = the model's */
    int dp_min, dp_max;
    const struct plan_rules *rules; /* when set, only shapes plan_shape_check passes: the
                               * shapes a job can run (the coordinator's loop); NULL: none */
    int spares;               /* instances kept out of the shape as spares */
    bool on_demand_fallback;  /* when no spot shape fits, ask for on-demand instances */
    double hysteresis;        /* a change must gain this fraction over staying (default NAN:
                               * 0.003 against restarts, 0.001 against measured live costs) */
    double defer;             /* and beat "stay now, best plan later" by this fraction: a
                               * change that can wait, waits (default NAN, as hysteresis) */
    int defer_max;            /* defer only within this many intervals of the last count
                               * change, so "later" cannot become "never" (default 3) */
    double tail;              /* intervals after the window credited at each final shape's
                               * throughput (the window does not end the job; default 0) */
    int count_window;         /* fit the stochastic count model on this many past intervals
                               * (0 = off, the default: point forecast only) */
    int announced;            /* intervals ahead whose losses come with notices (default 2) */
    uint64_t seed;
};
/* Fills the defaults above. */
void plan_options_init(struct plan_options *o);

struct plan_decision {
    struct plan_shape shape;          /* run this shape during this interval */
    enum plan_mig_kind kind;          /* migration kind the change needs (NONE when kept) */
    double cost_ms;                   /* estimated migration time */
    double expected_samples;          /* value of the plan over the window */
    int npred;                        /* entries in pred_n */
    int pred_n[PLAN_MAX_LOOKAHEAD];   /* predicted live instances after each interval */
    bool need_on_demand;              /* no spot shape fits: fallback wanted */
    char reason[160];                 /* one line: why this shape */
};

/* Chooses the shape for this interval: a dynamic program over the next L intervals whose
 * states are shapes (dp, pp), whose value is the committed samples expected under the
 * forecast (or the true future in s->future), and whose transitions are priced by the
 * migration cost model. Noticed instances are counted as certain losses at their interval.
 * A change is taken only if it pays for itself within the window by the hysteresis margin.
 * Called by the simulator every interval and by the coordinator at each decision point.
 * When no shape fits the live instances the decision is the idle shape {0,0} (and
 * need_on_demand is set when o->on_demand_fallback). Returns 0 and fills *ret; -EINVAL on a
 * bad situation (negative counts, more instances out than live, no history); -ENOMEM. */
int plan_decide(const struct plan_cost *cost, const struct plan_situation *s,
                const struct plan_options *o, struct plan_decision *ret);

/* ---- feasibility ---------------------------------------------------------------------- */

/* A rule a (dp, pp) shape must satisfy to run a job: the spec's own bounds and the engine's
 * limits. The order is the blame order (plan_feasible names the first rule that alone makes
 * the job impossible): what the user chose first, the model's nature last. */
enum plan_rule {
    PLAN_RULE_OK = 0,
    PLAN_RULE_DP,       /* spec.planner.dp: pin, min, max */
    PLAN_RULE_PP,       /* spec.planner.pp: pin, min, max */
    PLAN_RULE_FLEET,    /* dp x pp <= fleet.max x gpus_per_instance */
    PLAN_RULE_MEMORY,   /* the fullest stage fits fleet.gpu_memory (built-in GPT only) */
    PLAN_RULE_BATCH,    /* dp x micro_batch divides global_batch */
    PLAN_RULE_LAYERS,   /* at most one stage per pipeline layer */
    PLAN_RULE_NKINDS
};
/* The spec field a rule is about, e.g. "spec.planner.dp"; "" for PLAN_RULE_OK. */
const char *plan_rule_field(enum plan_rule r);

/* A spec's rules, resolved once, so that callers checking many shapes (the loop's search)
 * pay for the memory model's stage sizes only here. */
struct plan_rules {
    int dp_lo, dp_hi;          /* dp bounds, pin folded in (hi 0 = none) */
    int pp_lo, pp_hi;
    int global_batch, micro_batch;
    int stages_max;            /* pipeline layers: model.layers + embedding + final norm */
    int workers_max;           /* fleet.max x gpus_per_instance (and the migration planner's
                                * PLAN_MIG_MAX_POSITIONS) */
    bool memory;               /* memory is checked (the built-in GPT; not for profiles) */
    double mem_budget;         /* bytes a stage may use: 90% of fleet.gpu_memory */
    double stage_params[PLAN_MAX_LAYERS + 1]; /* [pp]: parameters of the fullest stage */
    int stage_layers[PLAN_MAX_LAYERS + 1];    /* [pp]: layers of the largest stage */
    double act_layer;          /* activation bytes per layer per micro-batch */
};
/* Resolves a spec's rules. pins = false leaves planner.dp/pp pins out (the loop's forced
 * shapes override them; min/max still hold). Pure. Returns 0 or -EINVAL (no spec, or a model
 * the engine cannot hold). */
int plan_rules_from_spec(const struct st_spec *spec, bool pins, struct plan_rules *ret);
/* The first rule (in enum order) that (dp, pp) breaks; PLAN_RULE_OK when it may run. */
enum plan_rule plan_shape_check(const struct plan_rules *r, int dp, int pp);
/* Bytes the fullest stage of (dp, pp) needs: weights, gradients and Adam moments (16 bytes a
 * parameter) and the activations of the micro-batches 1F1B keeps in flight. */
double plan_shape_stage_bytes(const struct plan_rules *r, int dp, int pp);

#define PLAN_FEAS_NEAREST 4 /* shapes named by plan_feasible */

/* Whether any (dp, pp) can run a job (plan_feasible). */
struct plan_feasibility {
    int nfeasible;                 /* shapes that satisfy every rule */
    struct plan_shape smallest;    /* the feasible shape with fewest workers (then the
                                    * shallowest pipeline); {0,0} when none */
    enum plan_rule rule;           /* when none: the rule to blame */
    char field[64];                /* its spec field ("" when feasible) */
    char message[400];             /* one line: why, and the nearest shapes */
    int nnearest;                  /* shapes that would run if only `field` changed */
    struct plan_shape nearest[PLAN_FEAS_NEAREST];
};
/* Decides whether any (dp, pp) satisfies the spec's and the engine's rules together (the one
 * decision validate, the CLI's spec loader and the coordinator loop share). The candidates are
 * dp <= max(dp bound, workers, global_batch / micro_batch), pp <= max(pp bound, layers), at
 * most 4096 x 1024. When none is feasible, blames the rule that the fewest changes would
 * fix: among the candidates breaking the fewest rules, the first rule in enum order, and
 * names the nearest such shapes. Pure. Returns 0 (feasible or not: see nfeasible) or -EINVAL. */
int plan_feasible(const struct st_spec *spec, struct plan_feasibility *ret);

/* ---- simulator ------------------------------------------------------------------------ */

enum plan_policy {
    PLAN_POL_LIVEPUT = 0,
    PLAN_POL_LIVEPUT_ORACLE,
    PLAN_POL_REACTIVE,
    PLAN_POL_CKPT_RESTART,
    PLAN_POL_REDUNDANT,
    PLAN_POL_PARCAE,
    PLAN_POL_PARCAE_TRUTH,
    PLAN_POL_IDEAL,
    PLAN_POL_NKINDS
};
const char *plan_policy_name(enum plan_policy p);
/* Returns 0 and the policy, or -EINVAL for an unknown name. */
int plan_policy_parse(const char *s, enum plan_policy *ret);

struct plan_sim_options {
    double notice_s;          /* notice lead time (default 120) */
    double unannounced;       /* fraction of removals without notice */
    uint64_t seed;
    int lookahead;
    enum plan_predictor predictor;
    double hysteresis, defer, tail; /* plan_options for the liveput policies */
    int defer_max;
    int count_window;         /* plan_options.count_window for the liveput policies */
    bool named_victims;       /* charge the trace's named victims (default: Parcae's
                               * expectation over uniformly drawn victims) */
    int cost_samples;         /* draws for the expectation (default 256) */
    double spot_price;        /* dollars per instance-hour (every live instance is billed) */
    const struct plan_decisions *decisions; /* for parcae / parcae-truth */
};
void plan_sim_options_init(struct plan_sim_options *o);

struct plan_sim_result {
    enum plan_policy policy;
    double committed_samples;
    double ideal_fraction;
    int reconfigurations;
    int by_kind[PLAN_KIND_NKINDS];
    double seconds_lost;
    double dollars;
    double samples_per_dollar;
    int n;                     /* intervals */
    struct plan_shape *shape;  /* shape run in each interval (n entries) */
    double *cum_samples;       /* cumulative samples after each interval */
};

/* Replays the trace under one policy. Returns 0 and fills *ret (free its arrays with
 * plan_sim_result_done), -EINVAL (parcae policies without decisions, or decisions that do not
 * match the trace), -ENOMEM. ideal_fraction is filled by the caller's ideal run; this sets it
 * from its own ideal computation. */
int plan_simulate(const struct plan_cost *cost, const struct plan_trace *t, enum plan_policy p,
                  const struct plan_sim_options *o, struct plan_sim_result *ret);
void plan_sim_result_done(struct plan_sim_result *r);

#include "planner-migration.h" /* migration transfer plans (mig plan), owned separately */

/* ---- situation files (`spottrain plan`, docs/plan-format.md) ------------------------------ */

enum plan_sit_cost_kind {
    PLAN_SIT_COST_NONE = 0, /* a target shape was given; no cost model is needed */
    PLAN_SIT_COST_PROFILE,  /* "cost": {"profile": FILE, "model": NAME} */
    PLAN_SIT_COST_ANALYTIC, /* "cost": {"analytic": {...}} with the model given as "gpt" */
};

/* Everything a situation file says: the model's layers, the current layout and who holds
 * which (stage, replica), survivors, new workers, notices, an optional target, the forecast
 * and history, planner options and the cost model to decide with. */
struct plan_situation_file {
    uint32_t nlayers;
    uint64_t *np;                         /* [nlayers] elements per layer */
    bool gpt;                             /* the model was given as "gpt" */
    uint32_t gpt_layers, gpt_hidden, gpt_vocab, gpt_seq;
    struct plan_mig_tied tied[PLAN_MIG_MAX_TIED];
    uint32_t ntied;
    struct plan_mig_layout old_layout, new_layout; /* new_layout only when have_target */
    bool have_target;
    struct plan_mig_worker *w;            /* [nw]: listed workers, then new ones */
    uint32_t nw, nold;                    /* all workers; those listed under "workers" */
    double *notice_s;                     /* [nw]: seconds until lost, <0 = none */
    int *forecast, nforecast;             /* instance counts; NULL/0 when absent */
    int *hist, nhist;
    int lookahead;                        /* intervals (default 12) */
    enum plan_predictor predictor;        /* default damped */
    enum plan_sit_cost_kind cost_kind;    /* NONE whenever have_target */
    char *cost_profile;                   /* PROFILE: the file name as written (relative to
                                             the situation file unless absolute) */
    char *cost_model;                     /* PROFILE: the model name, NULL = the profile's
                                             default */
    struct plan_model_desc cost_analytic; /* ANALYTIC: the description, max_n = nw (>= 1) */
};

/* Parses a situation file (JSON text of len bytes, no NUL needed). Pure: the profile a cost
 * names is not read here; the caller loads it (relative to the file) and builds the cost.
 * Fields are checked in file order and the first bad one is reported: -EINVAL with err (if
 * non-NULL) naming `name` and the dotted field, or, for a JSON syntax error, the line and
 * column. Returns 0 and fills *ret (release with plan_situation_file_done()), -EINVAL, or
 * -ENOMEM (*ret untouched on failure). Called by `spottrain plan` and the `situation` fuzz
 * target. */
int plan_situation_parse(const char *name, const char *text, size_t len,
                         struct plan_situation_file *ret, struct st_error *err);
/* Frees what plan_situation_parse() allocated and zeroes *s; NULL-safe. */
void plan_situation_file_done(struct plan_situation_file *s);

#endif
