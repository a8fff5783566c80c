/* planner-migration.h: migration transfer plans — which live worker sends which element range
 * of which layer's parameters or AdamW moments to whom, when a job changes shape.
 *
 * Included by planner.h; also compiles on its own (it needs only the C standard headers).
 * Pure code: no I/O, no clocks, no globals, no logging; errors are negative errno plus an
 * optional message buffer.
 *
 * The state model (the engine, the migration executor and this planner share it):
 * - A model is NL layers in pipeline order; layer l is a flat float32 vector of n_l elements
 *   (layer_params[l]) in a canonical order. For the built-in GPT: layer 0 = embeddings
 *   (wte, wpe), layers 1..L = transformer blocks, layer L+1 = final LayerNorm; the LM head
 *   is tied to wte.
 * - A layout (dp, pp) gives stage s the contiguous layer range [stage_lo[s], stage_lo[s+1]).
 *   plan_stage_split() is the default rule; explicit ranges are accepted too.
 * - Tied extras: a list of (stage selector, layer) pairs. The selected stage also holds the
 *   PARAM (never the optimizer state) of that layer, unless the layer is in its own range.
 *   GPT uses {PLAN_MIG_STAGE_LAST, 0}: the last stage holds wte for the tied LM head.
 * - Worker (stage s, replica r) holds: PARAM of every layer in its range (whole) plus its tied
 *   extras; ADAM_M and ADAM_V of its ZeRO-1 shard of every layer in its range: for a layer of
 *   n elements, replica r of dp holds elements [floor(r*n/dp), floor((r+1)*n/dp)).
 *   Sharding is per layer, so a repartition moves whole layers' shards. An ADAM shard has
 *   exactly one holder: losing a worker without notice loses its shard (-ENODATA below).
 * - Workers are indices 0..W-1 into an array of struct plan_mig_worker (each carries a string
 *   id). A worker has an old position (or none: a new worker), and is dead, alive (can send
 *   and can take a new position) or leaving (alive but noticed: can send, takes no position).
 *
 * Bytes are elements * 4 (float32). */
#ifndef ST_PLANNER_MIGRATION_H
#define ST_PLANNER_MIGRATION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h" /* enum st_state_kind: what a transfer carries */
#include "reconf.h" /* enum plan_reconf: a plan's class */

#define PLAN_MIG_MAX_LAYERS 4096  /* layers of a model */
#define PLAN_MIG_MAX_STAGES 1024  /* pipeline stages of a layout */
#define PLAN_MIG_MAX_WORKERS 8192 /* worker descriptors in one request */
#define PLAN_MIG_MAX_POSITIONS 2048 /* dp*pp of a layout (the matching is dense in it) */
#define PLAN_MIG_MAX_TIED 8       /* tied-extra entries of a layout */
#define PLAN_MIG_ID_MAX 64        /* bytes of a worker id, NUL included */
#define PLAN_MIG_ELEM_BYTES 4     /* float32 */

/* Stage selectors for tied extras; values >= 0 name a stage index. */
#define PLAN_MIG_STAGE_FIRST (-1)
#define PLAN_MIG_STAGE_LAST (-2)

/* A tied extra: stage `stage` (>= 0, PLAN_MIG_STAGE_FIRST or PLAN_MIG_STAGE_LAST) also holds
 * the PARAM of `layer`. */
struct plan_mig_tied {
    int32_t stage;
    uint32_t layer;
};

/* A shape with its layer split. Caller-owned; fill with plan_mig_layout_init. */
struct plan_mig_layout {
    uint32_t dp;                                 /* data-parallel replicas */
    uint32_t pp;                                 /* pipeline stages */
    uint32_t stage_lo[PLAN_MIG_MAX_STAGES + 1];  /* stage s: layers [stage_lo[s], stage_lo[s+1]) */
    uint32_t ntied;
    struct plan_mig_tied tied[PLAN_MIG_MAX_TIED];
};

/* One worker as the planner sees it. */
struct plan_mig_worker {
    char id[PLAN_MIG_ID_MAX]; /* stable id (instance name); only echoed, never interpreted */
    int32_t stage;            /* old position in the old layout; -1 = holds nothing (new) */
    int32_t replica;          /* old replica; ignored when stage is -1 */
    bool alive;               /* reachable now: may send; may hold a new position */
    bool leaving;             /* noticed: may send, gets no new position (needs alive) */
};

/* Everything plan_migration_new reads. All pointers are borrowed for the call only. */
struct plan_mig_request {
    uint32_t nlayers;
    const uint64_t *layer_params;              /* elements per layer, nlayers entries */
    const struct plan_mig_layout *old_layout;  /* what the workers hold now */
    const struct plan_mig_layout *new_layout;  /* target */
    const struct plan_mig_worker *workers;     /* nworkers descriptors */
    uint32_t nworkers;
    /* Optional: fixed new assignment, per worker the new position stage*dp+replica of the
     * new layout, or -1 for none. NULL = the planner chooses (maximum bytes kept in place). */
    const int32_t *fixed_position;
    bool validate;                             /* run plan_migration_validate on the result */
};

/* One transfer: src sends elements [offset, offset+count) of (layer, kind) to dst. */
struct plan_mig_transfer {
    uint32_t src, dst;   /* worker indices */
    uint32_t layer;
    uint32_t kind;       /* enum st_state_kind */
    uint64_t offset;     /* first element within the layer's flat vector */
    uint64_t count;      /* elements (> 0) */
};

/* Bytes between one (src, dst) pair. */
struct plan_mig_pair {
    uint32_t src, dst;
    uint64_t bytes;
};

#define PLAN_MIG_MAGIC 0x4d504c4eu /* "MPLN" */

/* A transfer plan. Heap object from plan_migration_new; free with plan_migration_free. */
struct plan_migration {
    uint32_t magic;                      /* PLAN_MIG_MAGIC */
    enum plan_reconf cls;
    uint32_t nworkers;                   /* = request nworkers */
    uint32_t npositions;                 /* new dp * pp */
    uint32_t *position_worker;           /* [npositions]: worker at new position s*dp+r */
    int32_t *worker_stage;               /* [nworkers]: new stage, -1 = no position */
    int32_t *worker_replica;             /* [nworkers]: new replica, -1 = no position */
    struct plan_mig_transfer *transfers; /* grouped by src (ascending); within a sender by
                                          * receiver in new-position order, then PARAM by
                                          * layer, then per layer the ADAM pieces */
    size_t ntransfers;
    struct plan_mig_pair *pairs;         /* one per (src, dst), in the transfers' order */
    size_t npairs;
    uint64_t *sent_bytes;                /* [nworkers] */
    uint64_t *recv_bytes;                /* [nworkers] */
    uint64_t bytes_kind[ST_STATE_NKINDS]; /* bytes moved per kind */
    uint64_t bytes_moved;                /* sum of bytes_kind */
    uint64_t bytes_kept;                 /* bytes the new positions already hold in place */
    uint64_t bytes_needed;               /* bytes all new positions hold after the migration */
    uint32_t max_sender_transfers;       /* most transfers any one worker sends */
};

/* Splits nlayers layers into pp contiguous, non-empty stages balanced by parameter count:
 * the split minimises the largest stage sum (bottleneck); among such splits it takes, stage
 * by stage from the first, as many layers as fit under that bottleneck while leaving at
 * least one layer for each later stage. Deterministic. Writes ret_lo[0..pp] (ret_lo[0] = 0,
 * ret_lo[pp] = nlayers). Returns 0 or -EINVAL (pp == 0, pp > nlayers, nlayers too large). */
int plan_stage_split(uint32_t nlayers, const uint64_t *layer_params, uint32_t pp,
                     uint32_t *ret_lo);

/* Fills *ret for (dp, pp): stage ranges from stage_lo (pp+1 boundaries) or, when stage_lo is
 * NULL, from plan_stage_split. No tied extras (add them with plan_mig_layout_add_tied).
 * Returns 0 or -EINVAL (bad sizes or boundaries). */
int plan_mig_layout_init(uint32_t nlayers, const uint64_t *layer_params, uint32_t dp,
                         uint32_t pp, const uint32_t *stage_lo, struct plan_mig_layout *ret);
/* Appends a tied extra. Returns 0, or -EINVAL (bad selector) / -E2BIG (table full). */
int plan_mig_layout_add_tied(struct plan_mig_layout *l, int32_t stage, uint32_t layer);
/* Checks a layout against a model. Returns 0 or -EINVAL with a message in err. */
int plan_mig_layout_check(const struct plan_mig_layout *l, uint32_t nlayers, char *err,
                          size_t errlen);
/* Stage holding layer l in its range, or -1. O(log pp). */
int plan_mig_layout_stage_of(const struct plan_mig_layout *l, uint32_t layer);

/* ZeRO-1 shard of replica r among dp of an n-element layer: [floor(r*n/dp), floor((r+1)*n/dp)). */
void plan_mig_shard(uint64_t n, uint32_t dp, uint32_t r, uint64_t *ret_offset,
                    uint64_t *ret_count);
/* What position (stage, replica) of layout l holds of (layer, kind): returns 1 and the
 * element range (count may be 0 for an empty shard), 0 when it holds nothing of it, or
 * -EINVAL for out-of-range arguments. The engine uses this to know what a worker keeps. */
int plan_mig_holding(const struct plan_mig_layout *l, const uint64_t *layer_params,
                     uint32_t nlayers, uint32_t stage, uint32_t replica, uint32_t layer,
                     enum st_state_kind kind, uint64_t *ret_offset, uint64_t *ret_count);

/* Parameters per layer of the built-in GPT (GPT-2 block with biases, tied LM head):
 * layer 0 = vocab*hidden + seq_len*hidden, layers 1..layers = 12*h^2 + 13*h,
 * layer layers+1 = 2*h. Writes ret[0..layers+2). Returns layers+2, or -EINVAL. */
int plan_mig_gpt_layer_params(uint32_t layers, uint32_t hidden, uint32_t vocab,
                              uint32_t seq_len, uint64_t *ret);

/* Layers some part of whose state has no live holder (a dead worker held the only copy of an
 * ADAM shard, or no live worker holds a layer's PARAM). ret_lost_kinds (nlayers entries,
 * may be NULL) gets per layer a bitmask of (1 << kind) lost. Returns the number of layers
 * with anything lost (0 = a live migration is possible), or -EINVAL for a bad request. */
int plan_migration_lost(const struct plan_mig_request *req, uint8_t *ret_lost_kinds);

/* Plans a migration. Chooses the new assignment of alive, non-leaving workers to the new
 * positions that maximises bytes kept in place (maximum-weight matching: Hungarian algorithm
 * on each connected component of the positive-weight graph; when every survivor's best
 * position is distinct that is taken directly), or uses req->fixed_position; positions
 * left over go to the remaining alive, staying workers, lowest index first. Then, for every
 * (new worker, layer, kind, range) it must hold and does not already hold, picks one live
 * source per sub-range. PARAM: the candidate old stages are the layer's range stage and its
 * tied holders; each stage offers one sender per destination, chosen once per destination
 * (so one sender ships all of that stage's layers a destination misses) as: a worker whose
 * new stage is the destination's (intra-stage), then non-leaving, then least loaded (elements
 * assigned to send so far), then lowest index. Between stages: intra-stage first, then the
 * stage holding the most of the destination's missing PARAM elements, then the same
 * tie-breaks. ADAM: the new shard is pieced from the unique old holders of the old shards it
 * overlaps (two or more when dp changes).
 * Returns 0 and *ret_plan (free with plan_migration_free); -EINVAL on a bad request (message
 * in err); -ENOSPC when fewer alive, non-leaving workers than new positions; -ENODATA when
 * some state has no live holder (err names the layers; plan_migration_lost lists them all;
 * the caller falls back to a checkpoint); -ENOMEM. err may be NULL. */
int plan_migration_new(const struct plan_mig_request *req, struct plan_migration **ret_plan,
                       char *err, size_t errlen);
/* Frees a plan; NULL-safe; returns NULL. */
struct plan_migration *plan_migration_free(struct plan_migration *p);

/* Checks a plan against its request from scratch: the assignment is a bijection of alive,
 * non-leaving workers onto the new positions; every transfer has a live sender that holds the
 * range, a positioned receiver that needs it, src != dst, count > 0; and for every new
 * position every needed (layer, kind) range is covered exactly once by what the worker holds
 * in place plus the transfers to it (nothing missing, no overlap). Also checks the counters.
 * Returns 0, -EINVAL with the first violation in err, or -ENOMEM. */
int plan_migration_validate(const struct plan_mig_request *req, const struct plan_migration *p,
                            char *err, size_t errlen);

#endif
