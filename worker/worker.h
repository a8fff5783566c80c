/* worker.h: the public header of worker/ — the training engine of one worker process.
 *
 * A worker is position (stage s, replica r) of a (dp, pp) layout: it owns the contiguous layer
 * range [lo[s], lo[s+1]) of the model (kernels.h's layers: 0 = embeddings, 1..L = blocks,
 * L+1 = final LayerNorm), runs the 1F1B pipeline schedule over its replica's micro-batches,
 * and keeps ZeRO-1 state: PARAM of its layers whole, ADAM_M/ADAM_V of its shard of each layer
 * (replica r of dp holds elements [floor(r*n/dp), floor((r+1)*n/dp))). The last stage also
 * holds a copy of layer 0's PARAM (wte, wpe; no moments) for the tied LM head (the planner's
 * "tied extra" {PLAN_MIG_STAGE_LAST, 0}).
 *
 * The one idea: every floating-point sum whose order could depend on the shape is done in a
 * fixed order in double and rounded to float once, so pipeline depth never changes a bit of
 * the result and data parallelism changes it by at most one float rounding (docs/engine.md).
 *
 * Threading: an engine is used by one thread at a time. Errors are negative errno; the
 * engine logs (subsystem "engine") where it decides, its callers log the rest. */
#ifndef ST_WORKER_H
#define ST_WORKER_H

#include <limits.h> /* INT_MAX */
#include <stddef.h>
#include <stdint.h>

#include "kernels.h" /* struct kern_config, enum kern_lr_schedule */
#include "worker-agent.h" /* the control-plane client: struct worker_agent */

struct mig_comm;
struct st_tokens;
struct st_spec;

#define WORKER_MAX_STAGES 256
#define WORKER_MAX_RANKS 1024

/* What to train: model, batch, optimizer. Same on every worker of a job. */
struct worker_train_config {
    struct kern_config model;
    int global_batch;       /* samples per step, constant across shapes */
    int micro_batch;        /* samples per micro-batch */
    int total_steps;        /* for the learning-rate schedule */
    double lr, beta1, beta2, eps, weight_decay;
    double grad_clip;       /* global-norm clip; <= 0 = off */
    int warmup_steps;
    enum kern_lr_schedule schedule;
    double min_lr_ratio;
    uint64_t seed;          /* initialisation and data sampling seed */
};

/* Fills *ret from a resolved job spec. Returns 0 or -EINVAL (model fails kern_config_check). */
int worker_train_config_from_spec(const struct st_spec *spec, struct worker_train_config *ret);

/* The shape of an epoch and where every position lives in the communicator. */
struct worker_layout {
    int dp, pp;
    int stage_lo[WORKER_MAX_STAGES + 1]; /* stage s owns layers [stage_lo[s], stage_lo[s+1]) */
    int ranks[WORKER_MAX_RANKS];         /* comm rank of position s*dp + r */
    /* The peer-copy ring (st_peer_ring, from the positions' zones): position peer_next[p]
     * holds p's copy. Unset (a layout from worker_layout_init): position order. */
    bool peer_ring_set;
    int peer_next[WORKER_MAX_RANKS];
};

/* The position that holds pos's peer copy, and the one whose copy pos holds. */
int worker_layout_peer_next(const struct worker_layout *l, int pos);
int worker_layout_peer_prev(const struct worker_layout *l, int pos);

/* Fills *ret for (dp, pp) with the given stage boundaries (pp+1 entries: 0 = first,
 * nlayers = last, strictly increasing) and ranks[s*dp + r] = s*dp + r.
 * Returns 0 or -EINVAL. */
int worker_layout_init(struct worker_layout *ret, int dp, int pp, const int *stage_lo,
                       int nlayers);
/* Checks a layout against a model's layer count. Returns 0 or -EINVAL. */
int worker_layout_check(const struct worker_layout *l, int nlayers);

/* ZeRO-1 shard of replica r among dp for an n-element layer. */
void worker_shard(size_t n, int dp, int r, size_t *ret_lo, size_t *ret_hi);

struct worker_engine;

/* Creates the engine of position (stage, replica) of layout, with freshly initialised
 * parameters (kern_layer_init from cfg->seed), zero moments and optimizer step t = 0.
 * comm is borrowed (must outlive the engine or be replaced by worker_engine_reshape_*);
 * data is borrowed (token file; its tokens must be < vocab). timeouts come from the comm.
 * Caller frees with worker_engine_free(). Returns 0, -EINVAL, -ENOMEM. */
/* worker_engine_new without its communicator yet, for a worker whose state all arrives from
 * elsewhere (a spare taking a position: the transfers; a restore: a peer copy and transfers):
 * it makes its engine, and with worker_engine_ready its work buffers, while the others train
 * up to the boundary and the epoch's comm cannot be built. Its parameters and moments are zero
 * (every page written, none initialised) until filled through worker_engine_layer. It cannot
 * step or move state until worker_engine_attach gives it the comm. Same returns. */
int worker_engine_new_detached(const struct worker_train_config *cfg,
                               const struct worker_layout *layout, int stage, int replica,
                               const struct st_tokens *data, struct worker_engine **ret);
/* Gives a detached engine its communicator, checked against its layout as worker_engine_new
 * checks one (our rank must be the position's). Returns 0, -EINVAL (bad engine or comm, or it
 * has one already). */
int worker_engine_attach(struct worker_engine *e, struct mig_comm *comm);
int worker_engine_new(const struct worker_train_config *cfg, const struct worker_layout *layout,
                      int stage, int replica, struct mig_comm *comm,
                      const struct st_tokens *data, struct worker_engine **ret);
/* NULL-safe; returns NULL. Does not free the comm or the data. */
struct worker_engine *worker_engine_free(struct worker_engine *e);

/* Runs training step `step` (0-based; selects the data and the learning rate): forward and
 * backward of this replica's micro-batches (global_batch / (dp * micro_batch) of them) under
 * 1F1B, tied-embedding gradient sum, reduce-scatter, global-norm clip, AdamW on the shard,
 * all-gather. Collective: every worker of the layout must call it with the same step.
 * *ret_loss (may be NULL) receives the mean loss over the global batch on last-stage workers
 * and NaN elsewhere. On error the engine's state is undefined for this step (the caller
 * rebuilds it from a migration or a checkpoint). */
int worker_engine_step(struct worker_engine *e, uint64_t step, double *ret_loss);

/* AdamW steps taken (bias-correction t). */
int worker_engine_opt_step(const struct worker_engine *e);
/* Sets it (migration: a new worker takes the value of its peers). Returns 0 or -EINVAL. */
int worker_engine_set_opt_step(struct worker_engine *e, int t);

/* This worker's position. */
int worker_engine_stage(const struct worker_engine *e);
int worker_engine_replica(const struct worker_engine *e);
const struct worker_layout *worker_engine_layout(const struct worker_engine *e);

/* The buffers of one layer, for migration to send/receive byte ranges in place. */
struct worker_layer_bufs {
    int layer;
    size_t n;              /* elements of the layer */
    float *param;          /* n elements (whole layer) */
    size_t shard_lo;       /* this replica's ZeRO-1 shard [shard_lo, shard_hi) */
    size_t shard_hi;
    float *adam_m;         /* shard_hi - shard_lo elements; NULL for a tied extra */
    float *adam_v;
};

enum worker_view {
    WORKER_VIEW_CURRENT = 0, /* the layout in force (the new one after reshape_begin) */
    WORKER_VIEW_OLD,         /* between reshape_begin and reshape_commit: the old buffers */
};

/* Fills *ret with the buffers of `layer` in the given view. Layer 0 on the last stage (when
 * the last stage does not own layer 0) is the tied extra: param holds the whole layer
 * (n elements), the shard is empty and adam_m/adam_v are NULL. Returns 0, or -ENOENT when
 * this worker does not hold the layer, -EINVAL. */
int worker_engine_layer(struct worker_engine *e, enum worker_view view, int layer,
                        struct worker_layer_bufs *ret);

/* Reshape after migration, in two phases so a migration can send from the old buffers and
 * receive into the new ones concurrently:
 *   begin:  allocates the buffers of (layout, stage, replica); copies what this worker
 *           already holds (PARAM of kept layers, the overlap of old and new moment shards);
 *           the rest is zero until the migration fills it through worker_engine_layer(NEW).
 *           The old buffers stay readable as WORKER_VIEW_OLD. comm is the new epoch's.
 *   commit: frees the old buffers (on a thread of their own, after the next step or
 *           worker_engine_ready made the work buffers). abort: drops the new ones and
 *           keeps the old layout.
 * stage = -1 means this worker holds no position in the new layout (a spare). */
int worker_engine_reshape_begin(struct worker_engine *e, const struct worker_layout *layout,
                                int stage, int replica, struct mig_comm *comm);
int worker_engine_reshape_commit(struct worker_engine *e);
int worker_engine_reshape_abort(struct worker_engine *e);
/* Makes a reshape to (layout, stage, replica) ready while steps run on: a thread allocates the
 * buffers the new position does not share with the current one and writes every page of
 * them, so that a later reshape_begin of that position finds them ready (it waits for the
 * thread): where fresh memory faults in slowly (a VM) that was most of a large model's
 * stall (docs/live-migration.md, "At the GPT-2 124M size"). Contents are still copied at reshape_begin (they change with every step).
 * A begin of another position, or worker_engine_free, discards it. Returns 0, -EBUSY
 * mid-reshape, -EINVAL, -ENOMEM or a thread error; failure only means no preparation. */
int worker_engine_reshape_prepare(struct worker_engine *e, const struct worker_layout *layout,
                                  int stage, int replica);
/* Allocates the work buffers of a step now (else the first step does): a reconfiguration
 * calls it before it ends, so that the new epoch's first step is an ordinary one and the
 * stall, which subtracts the epoch's median step time, counts the allocation. 0 or -ENOMEM;
 * nothing to do for a spare, mid-reshape, or when they exist. */
int worker_engine_ready(struct worker_engine *e);
/* Bytes of work buffers that the last making of them (worker_engine_ready, or the first step
 * after a (re)configuration) allocated there and then: what neither the old position's
 * buffers nor a preparation (worker_engine_reshape_prepare) had ready. 0 before any. */
size_t worker_engine_work_fresh(const struct worker_engine *e);

/* The bytes an engine of position (stage, replica) of layout allocates for its state and a
 * step's work buffers (what making it writes, page by page), into *ret. Measured by making
 * them without writing a page (fresh anonymous memory costs nothing until written), so it
 * follows the engine's own sizes. 0; -EINVAL for a position the config cannot train;
 * -EBUSY while the warm reserve is open (the measure would carve it); -ENOMEM. */
int worker_engine_position_bytes(const struct worker_train_config *cfg,
                                 const struct worker_layout *layout, int stage, int replica,
                                 uint64_t *ret);

/* State after the boundary (docs/live-migration.md): a migration may still be moving the
 * parameters and optimizer moments of the new position (and reading the old one's) on another
 * thread when the new epoch's first step starts. The gate is called once, by the next step,
 * before the step first uses the communicator or the moments: with pp 1 after the forward and
 * backward passes, which touch neither; with a pipeline at its first send or receive, unless
 * worker_engine_gate_messages() said the move runs on a channel of its own (then at the
 * update). It waits for that move; a negative return fails the step with it. The layer gate,
 * until the gate is called or cleared, is called by every forward pass before it first reads
 * a layer's parameters (WORKER_ENGINE_TIED_LAYER before the last stage's head reads its tied
 * copy of wte), and waits for those. NULL clears both. Setting a gate makes messages wait
 * again. */
#define WORKER_ENGINE_TIED_LAYER (INT_MAX - 1) /* after every layer: a move sends it last */
typedef int worker_engine_gate_fn(void *userdata);
typedef int worker_engine_layer_gate_fn(void *userdata, int layer);
void worker_engine_set_gate(struct worker_engine *e, worker_engine_gate_fn *fn,
                            worker_engine_layer_gate_fn *layer_fn, void *userdata);
/* Whether the step's pipeline messages call the gate (true, the default: the move shares their
 * communicator, whose streams carry one thing at a time) or leave it to the update (false: the
 * move has a channel of its own, MIG_EPOCH_MOVE). */
void worker_engine_gate_messages(struct worker_engine *e, bool wait);
/* While held, a committed reshape keeps its old buffers (the sends of such a move read them)
 * instead of releasing them after the next worker_engine_ready or step; releasing lets them
 * go. A reshape_begin while held is -EBUSY. */
void worker_engine_hold_old(struct worker_engine *e, bool hold);
/* The next reshape_begin leaves the moments this worker keeps (the overlap of its old and
 * new moment shards, when they are not the same range) in the old buffers for
 * worker_engine_copy_kept_moments, instead of copying them inside the stall. */
void worker_engine_reshape_moments_later(struct worker_engine *e);
/* Copies what the last reshape_begin left (above): the old buffers must still be there (not
 * aborted; committed only while held). Safe on another thread while the new epoch's first
 * step runs up to its gate: it reads the old shards and writes the new ones, which nothing
 * else touches before. Returns the bytes copied. */
size_t worker_engine_copy_kept_moments(struct worker_engine *e);

/* Checkpoint save: gathers the moment shards to replica 0 of each stage, which writes its
 * layers' files (PARAM, ADAM_M, ADAM_V of every tensor, full) into dir; then position
 * (0, 0) commits manifest.json with `step` steps done. Collective over the layout.
 * Returns 0 or negative errno (logged). */
int worker_engine_save(struct worker_engine *e, const char *dir, uint64_t step);

/* Checkpoint load into any shape: reads this worker's layers (whole PARAM, its shard of the
 * moments), the tied layer-0 copy on the last stage and the optimizer step t. Not collective.
 * *ret_step (may be NULL) receives the checkpoint's step. Returns 0, -EINVAL (the checkpoint
 * is of another model), or a checkpoint error (logged). */
int worker_engine_load(struct worker_engine *e, const char *dir, uint64_t *ret_step);

/* The model config as the JSON object checkpoints store ("model" in manifest.json).
 * Caller frees with st_free(). NULL on allocation failure. */
char *worker_model_json(const struct kern_config *cfg);

#include "worker-runner.h" /* the worker process under a coordinator */

#endif
