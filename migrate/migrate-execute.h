/* migrate-execute.h: executing a migration transfer list at a step boundary (part of
 * migrate/'s public interface, included by migrate.h).
 *
 * The one idea: a transfer list names element ranges of per-layer float32 state by (layer,
 * kind, offset, count) between comm ranks; the executor knows nothing about the engine's
 * memory and asks a callback for the address of each range, then runs every transfer this rank
 * takes part in as ONE mig_batch, so transfers between different pairs progress concurrently
 * and the two ends of each pair match their messages by list order. Every rank of the
 * migration gets the same list (or the part of it that names it, in the same relative order). */
#ifndef ST_MIGRATE_EXECUTE_H
#define ST_MIGRATE_EXECUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct mig_comm;

/* One transfer, in comm ranks: src sends elements [offset, offset+count) of (layer, kind)
 * (kind is an enum st_state_kind) to dst. Elements are float32. */
struct mig_xfer {
    int src, dst;     /* comm ranks, different */
    uint32_t layer;
    uint32_t kind;    /* ST_STATE_PARAM, ST_STATE_ADAM_M, ST_STATE_ADAM_V */
    uint64_t offset;  /* first element within the layer's flat vector of that kind */
    uint64_t count;   /* elements, > 0 */
};

/* Returns in *ret_ptr the address of the first element of x's range on this rank: the source
 * range when send is true, the destination range otherwise. Returns 0, or negative errno when
 * this rank does not hold the range (the whole execution then fails before any byte moves). */
typedef int mig_xfer_buf_fn(void *userdata, const struct mig_xfer *x, bool send,
                            float **ret_ptr);

/* What one execution moved, as seen by this rank. */
struct mig_exec_stats {
    uint64_t bytes_sent;  /* payload bytes this rank sent */
    uint64_t bytes_recv;  /* payload bytes this rank received */
    size_t nsend, nrecv;  /* transfers this rank took part in */
    double seconds;       /* wall seconds of the batch (0 when nothing to move) */
};

/* Runs the transfers of x[0..n) that have this rank (mig_comm_rank) as src or dst, in list
 * order per (peer, direction), as one concurrent mig_batch. Transfers not naming this rank are
 * skipped. Returns 0 and fills *ret_stats (may be NULL); -EINVAL for a malformed transfer
 * (src == dst, rank out of range, count 0, unknown kind) or when buf fails (its error is
 * returned); -ENOMEM; or the data plane's error (-ECONNRESET, -ETIMEDOUT, ...), after which
 * the destination ranges hold undefined data. Never blocks longer than the comm's timeout
 * without progress. */
int mig_execute(struct mig_comm *c, const struct mig_xfer *x, size_t n, mig_xfer_buf_fn *buf,
                void *userdata, struct mig_exec_stats *ret_stats);

/* Test hook (like st_alloc_fail_after): the nth mig_execute() from now (1-based, counted per
 * process) in which this rank sends has its first message's connection cut on the TCP data
 * plane after the header and part of the payload (shutdown both ways, as a failing network
 * cuts it); an execution that ends before its first send (cancelled) does not count: that call returns -ECONNRESET, its receiver sees the stream end mid-message, and
 * the rest of the epoch's traffic on that connection fails. 0 disarms. A worker arms it from
 * SPOTTRAIN_TEST_DATA_CUT=N so that scripts/chaos can cut a migration mid-transfer. */
void mig_execute_cut_at(long n);

/* The same for the epochs' side channels (MIG_EPOCH_SIDE): the nth batch from now in which
 * this rank sends on a side channel has its first send cut mid-message. A worker arms it from
 * SPOTTRAIN_TEST_PEER_CUT=N, so that a test can fail a peer-copy exchange. 0 disarms. */
void mig_side_cut_at(long n);

/* The same for the epochs' move channels (MIG_EPOCH_MOVE): the nth batch from now in which
 * this rank sends on a move channel, counted when it starts, has its first send cut
 * mid-message. A worker arms it from SPOTTRAIN_TEST_MOVE_CUT=N. 0 disarms. */
void mig_move_cut_at(long n);

/* Bytes rank `rank` sends (ret_send) and receives (ret_recv) under x[0..n). Either pointer may
 * be NULL. Lets a caller compare a plan's bytes with what mig_execute reports. */
void mig_xfer_bytes(const struct mig_xfer *x, size_t n, int rank, uint64_t *ret_send,
                    uint64_t *ret_recv);

#endif
