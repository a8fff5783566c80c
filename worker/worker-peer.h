/* worker-peer.h: in-memory peer copies of training state (runner.c and peer.c only).
 *
 * Every `fault_tolerance.peer_copy_every` steps each positioned worker of an epoch snapshots
 * its own state (the parameters of its stage's layers, its ZeRO-1 moment shards, the AdamW
 * step) and sends that snapshot to its successor in the ring, receiving its predecessor's:
 * worker__peer_take() at the step boundary, worker__peer_swap() on the epoch's side channel
 * (on the runner's peer-copy thread while the next steps train), worker__peer_keep(). A
 * generation (own + held, same step) is kept only when both the send and the receive
 * completed; the two newest generations are kept, so a loss in the middle of an exchange
 * still leaves one step that every survivor holds. docs/live-migration.md, "Peer copies", has
 * the protocol. */
#ifndef ST_WORKER_PEER_H
#define ST_WORKER_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "migrate.h"
#include "migrate-execute.h"
#include "worker.h"

#define WORKER_PEER_GENS 2

/* One layer of a part: whole parameters (n floats at off, when the part has parameters) and
 * one moment shard (m then v, hi - lo floats each, at moff). A tied extra (layer 0 on a last
 * stage without it) has lo == hi. */
struct worker_peer_layer {
    uint64_t layer, n, lo, hi;
    uint64_t off;              /* floats from the start of the part's data: parameters */
    uint64_t moff;             /* the same: moment shards */
};

/* The state of one position at one step: the parameters of every layer, then every layer's
 * moment shards. A held part of a replica of our own stage has no parameters (has_params
 * false): ours of the same generation are the same bits, so the exchange sends and the copy
 * keeps only its moments (worker__peer_held_buf() serves the parameters from the own part). */
struct worker_peer_part {
    int pos;                   /* stage * dp + replica in the generation's layout */
    int nl;
    struct worker_peer_layer *l; /* nl entries */
    float *data;               /* one allocation */
    uint64_t nfloats;
    uint64_t pfloats;          /* floats of the parameters, first in data (0 = none held) */
    bool has_params;
};

struct worker_peer_gen {
    bool valid;
    uint64_t epoch, step;
    int opt_step;
    struct worker_layout layout;
    int stage, replica;
    struct worker_peer_part own, held; /* held: the predecessor's part */
};

struct worker_peer_store {
    struct worker_peer_gen gen[WORKER_PEER_GENS];
};

/* Bytes a worker of position pos needs for WORKER_PEER_GENS generations of its own state and
 * its predecessor's, in layout lay for the model of tc. Pure. */
uint64_t worker__peer_need(const struct worker_train_config *tc, const struct worker_layout *lay,
                           int pos);

/* Largest worker__peer_need() over the layout's positions: the same on every worker, so every
 * worker of an epoch takes the same decision about the memory budget. */
uint64_t worker__peer_need_max(const struct worker_train_config *tc,
                               const struct worker_layout *lay);

/* Snapshots eng's current view as a generation at `step` of `epoch`: its own part filled, its
 * held part allocated, not valid yet. The caller passes it to worker__peer_swap() and then
 * worker__peer_keep(), or frees it with worker__peer_gen_free(). Returns 0, -ENOMEM, -EINVAL
 * (no position, or a layout of one position). */
int worker__peer_take(const struct worker_train_config *tc, struct worker_engine *eng,
                      uint64_t epoch, uint64_t step, struct worker_peer_gen *ret);

/* The exchange of generation g: sends its own part to the successor and receives the
 * predecessor's into its held part, on comm, whose rank r is position r of g's layout (the
 * epoch's side channel, MIG_EPOCH_SIDE; every position calls it for the same step). Touches
 * only g and comm, so it may run on a thread other than the engine's while the engine steps.
 * Returns 0 (g is valid) or negative errno (-ECANCELED after mig_comm_cancel; g stays
 * invalid and the comm may be unusable). */
int worker__peer_swap(struct worker_peer_gen *g, struct mig_comm *comm);

/* Moves valid generation g into the store in place of the oldest; g is left empty. A
 * generation is kept only when both directions of its exchange completed. */
void worker__peer_keep(struct worker_peer_store *s, struct worker_peer_gen *g);

/* Frees a generation that was not kept. NULL-safe. */
void worker__peer_gen_free(struct worker_peer_gen *g);

/* take, swap and keep at once, on this thread: the exchange at the step boundary
 * (fault_tolerance.peer_copy_background: false). On failure nothing changes in s. */
int worker__peer_exchange(struct worker_peer_store *s, const struct worker_train_config *tc,
                          struct worker_engine *eng, struct mig_comm *comm, uint64_t epoch,
                          uint64_t step);

/* The generation at `step` whose layout and position are those of eng's current view, or
 * NULL. */
const struct worker_peer_gen *worker__peer_find(const struct worker_peer_store *s,
                                                struct worker_engine *eng, uint64_t step);

/* The generation of (epoch, step), whatever its layout, or NULL. A peer restore names both:
 * after a replay two generations may share a step in different layouts. */
const struct worker_peer_gen *worker__peer_get(const struct worker_peer_store *s, uint64_t epoch,
                                               uint64_t step);
/* Whether some generation of `epoch` is held (this worker was a position of that epoch). */
bool worker__peer_holds(const struct worker_peer_store *s, uint64_t epoch);
/* Writes generation g's own part into eng's current view wherever the two overlap, exactly as
 * worker_engine_reshape_begin() would keep it locally from an engine in g's layout: the
 * parameters of every layer both hold (the tied embedding included), the overlap of the
 * moment shards. Sets the AdamW step to g's. eng may have any layout; what it does not take
 * from g must come from transfers. A peer restore builds its engine this way, so nothing the
 * engine held before (a failed epoch may have reshaped it) reaches the restored state.
 * Returns 0 or -EINVAL (a layer of another size). */
int worker__peer_fill(const struct worker_peer_gen *g, struct worker_engine *eng);
/* Writes the own part of generation g back into eng's current view and sets the AdamW step:
 * the engine is then exactly as it was after step g->step. Returns 0, -EINVAL (g does not
 * fit eng). */
int worker__peer_rollback(const struct worker_peer_gen *g, struct worker_engine *eng);

/* The held part's range for transfer x (x->kind: any enum st_state_kind; offsets
 * of the whole layer as the migration planner writes them) in generation g; parameters of a
 * held part without them come from the own part. Returns 0, or -ERANGE when the held copy
 * does not cover it. */
int worker__peer_held_buf(const struct worker_peer_gen *g, const struct mig_xfer *x,
                          float **ret);
/* The same for the own part: what a survivor sends of its own state in a peer restore. */
int worker__peer_own_buf(const struct worker_peer_gen *g, const struct mig_xfer *x, float **ret);

/* Frees every generation. */
void worker__peer_store_done(struct worker_peer_store *s);

#endif
