/* migrate.h: the public header of migrate/ — the data plane (point-to-point transfers and
 * collectives between the workers of one epoch, over TCP or NCCL) and the checkpoint format.
 *
 * The one idea: a group of workers is rebuilt for every epoch (every change of shape). An
 * endpoint (a listening socket) lives for the whole life of a worker; a communicator
 * (struct mig_comm) lives for one epoch and is built from the endpoint plus the list of the
 * epoch's peer addresses. Connections carry the epoch in their handshake and every message
 * carries it in its header, so bytes from a worker still living in an older epoch can never be
 * mistaken for current data.
 *
 * Authentication (docs/data-plane-security.md): a communicator built with mig_comm_new_auth()
 * holds the epoch's secret. Both ends of every connection prove they know it (HMAC-SHA256 over
 * both nonces, the epoch, both ranks, nranks and the job id) before any payload moves, and
 * every message then carries a GMAC of its header and bytes under a key derived for that
 * connection. A connection that fails the handshake is closed and recorded on the endpoint
 * (mig_endpoint_auth_failures()); the genuine peers are adopted all the same. With
 * mig_auth.tls (fleet.data_plane.tls) every connection then runs TLS 1.3 with that derived key
 * as its PSK, and the TLS records, not GMACs, carry the messages.
 *
 * Errors are negative errno: -EINVAL bad argument, -ENOMEM, -ETIMEDOUT (no progress for
 * timeout_s), -ECONNRESET (a peer died or closed), -EPROTO (message header does not match what
 * the receiver posted: size, sequence or epoch), -ESTALE (our handshake was rejected because
 * the peer is in a newer epoch), -EACCES (the address we connected to failed to prove the
 * epoch's secret, or refused ours), -EBADMSG (a message's MAC or a TLS record does not verify,
 * or the TLS peer said so: bytes altered in transit; also corrupt checkpoint files), -EIO (checkpoint files; the crypto library).
 *
 * Threading: a struct mig_comm and a struct mig_endpoint are used by one thread at a time.
 * Checkpoint functions are independent of each other and may run in any thread. */
#ifndef ST_MIGRATE_H
#define ST_MIGRATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h" /* enum st_state_kind */

struct st_error;

/* ==== data plane ========================================================================= */

enum mig_dtype {
    MIG_F32 = 0, /* float, summed in float */
    MIG_F64,     /* double, summed in double */
    MIG_BYTES,   /* opaque bytes: valid for allgather and broadcast; not summable */
};

/* Size in bytes of one element of t (1 for MIG_BYTES); 0 for an unknown value. */
size_t mig_dtype_size(enum mig_dtype t);

#define MIG_MAX_RANKS 1024        /* upper bound on nranks of a communicator */
#define MIG_ADDR_MAX 64           /* "host:port" strings, NUL included */

/* A listening data-plane socket. It lives across epochs: connections that peers open for an
 * epoch this worker has not reached yet wait in the listen backlog or are buffered by epoch,
 * and are picked up by the mig_comm_new() of that epoch. */
struct mig_endpoint;

/* Binds and listens on bind_host (an IPv4 literal or a name; NULL = "127.0.0.1") and port
 * (0 = any free port). Caller frees *ret with mig_endpoint_free(). */
int mig_endpoint_new(const char *bind_host, int port, struct mig_endpoint **ret);
/* "HOST:PORT" as peers should pass it to mig_comm_new(); owned by ep. */
const char *mig_endpoint_addr(const struct mig_endpoint *ep);
/* Port the endpoint listens on. */
int mig_endpoint_port(const struct mig_endpoint *ep);
/* The coordinator has moved on to `epoch`: a mig_comm_new() of a lower epoch that is still
 * waiting for its peers (one of them dead, say) gives up within 50 ms with -ECANCELED instead
 * of at its timeout. Comms already built are not touched (a live migration still moves state
 * on the old epoch's), nor are side channels (MIG_EPOCH_SIDE): the old epoch trains on until
 * a live migration's boundary, and its copies with it. Safe from any thread; epochs only go
 * up. NULL-safe. */
void mig_endpoint_abandon(struct mig_endpoint *ep, uint64_t epoch);
/* The highest epoch mig_endpoint_abandon() was given (0: none). NULL-safe. */
uint64_t mig_endpoint_abandoned(const struct mig_endpoint *ep);

/* Closes the listener and every buffered early connection. NULL-safe; returns NULL.
 * Every communicator built on ep must be freed first. */
struct mig_endpoint *mig_endpoint_free(struct mig_endpoint *ep);

/* The group of one epoch: ranks 0..nranks-1 with their endpoint addresses. */
struct mig_comm;

/* Builds the communicator of `epoch` for `rank` of `nranks`. transport is "tcp" or "nccl"
 * ("nccl" only in CUDA builds, else -EOPNOTSUPP; -ENODEV without a GPU; it bootstraps over
 * the tcp transport on ep, its buffers are device pointers of the CUDA device current at this
 * call, its collectives run the same fixed-order sums on the device, and it cannot detect a
 * receiver posting another size than the sender). peer_addrs[i] is rank i's
 * mig_endpoint_addr() (our own entry is ignored). Connections: each rank connects to every
 * higher rank and accepts from every lower one, handshake (magic, epoch, from, to, nranks);
 * a connection for an older epoch is rejected (the old peer gets -ESTALE), one for a newer
 * epoch is kept on ep for later. Waits at most timeout_s for every peer (-ETIMEDOUT), and
 * timeout_s is also the no-progress limit of every later call on the comm.
 * ep stays owned by the caller and must outlive the comm; comms of different epochs may
 * coexist on one ep (the old group can still move state while the new one is built). After a
 * failed mig_comm_new, retry with a new epoch: peers may hold half-built connections of the
 * failed one. Caller frees with mig_comm_free(). */
int mig_comm_new(const char *transport, struct mig_endpoint *ep, uint64_t epoch, int rank,
                 int nranks, const char *const *peer_addrs, double timeout_s,
                 struct mig_comm **ret);

/* OR'd into the epoch given to mig_comm_new() or mig_comm_new_auth(): the epoch's side
 * channel, a second communicator of the same epoch with connections of its own (the hello's
 * flags say which channel, and the handshake's transcript binds them, so neither channel can
 * adopt the other's connections). Its ranks and size need not be the main communicator's.
 * Another thread may drive it while this one drives the main communicator: a batch touches
 * only its comm's connections, never the endpoint. Building it (the endpoint) stays on the
 * endpoint's thread, beside at most one build ahead (mig_comm_new_ahead). "tcp" only (-EOPNOTSUPP otherwise); mig_comm_epoch() answers without the
 * bit. The worker's peer copies run on it (docs/live-migration.md). */
#define MIG_EPOCH_SIDE (1ull << 63)
/* The same for the epoch's move channel, a third communicator of the epoch (never OR'd with
 * MIG_EPOCH_SIDE: -EINVAL): a live migration's state moves on it after the boundary, while the
 * new epoch's first step sends its pipeline messages on the main communicator. Built like the
 * main one, at the boundary and by the thread that builds that (it is abandoned with its
 * epoch, mig_endpoint_abandon); driven by any one thread after. "tcp" only. */
#define MIG_EPOCH_MOVE (1ull << 62)

#define MIG_KEY_BYTES 32  /* the data-plane secret of one epoch */
#define MIG_JOB_ID_MAX 64 /* job id bound into the proofs, NUL included */

/* What authenticates the connections of one epoch. The key comes from the coordinator's
 * Configure (or Migrate) of that epoch and is never logged; job_id is the job's UUID. */
struct mig_auth {
    unsigned char key[MIG_KEY_BYTES];
    char job_id[MIG_JOB_ID_MAX];
    bool tls; /* encrypt: TLS 1.3 with a PSK from the handshake (fleet.data_plane.tls); every
                 rank of the epoch must agree, a peer that does not is refused */
};

/* Wipes a struct mig_auth the caller filled (the compiler keeps the wipe). NULL-safe. */
void mig_auth_clear(struct mig_auth *a);

/* mig_comm_new() with the epoch's secret: every connection runs the mutual challenge-response
 * and every message is MAC'd (see the top of this file). Every rank of the epoch must pass the
 * same auth. auth is copied (the comm wipes its copy when freed). "nccl" bootstraps over an
 * authenticated tcp comm; NCCL's own traffic is not covered (docs/data-plane-security.md).
 * mig_comm_new() is this with an all-zero key and no job id: the same handshake, which then
 * proves nothing, and no per-message MACs; for tools whose ranks all run on one host. */
int mig_comm_new_auth(const char *transport, struct mig_endpoint *ep, uint64_t epoch, int rank,
                      int nranks, const char *const *peer_addrs, const struct mig_auth *auth,
                      double timeout_s, struct mig_comm **ret);

/* mig_comm_new_auth() on "tcp" for the main or move communicator of the next epoch, built
 * ahead of its boundary on a thread of the caller's while the endpoint's current epoch still
 * runs: that epoch's comms move data, its side channel may be built by the endpoint's thread,
 * and the endpoint goes on taking that epoch's hellos as current (they would be stale after a
 * boundary) until mig_comm_enter(). The two builds share the endpoint under its lock, each
 * taking only the connections of its own epoch and channel. The build gives up with
 * -ECANCELED when the coordinator abandons the epoch (mig_endpoint_abandon) or when *stop
 * (NULL: none) is set by another thread, within 50 ms either way. So a worker's peers connect
 * while everyone trains up to the boundary, and the boundary finds the handshakes done
 * (docs/live-migration.md). A move channel ahead is built after its epoch's main one, on the
 * same thread. -EINVAL for MIG_EPOCH_SIDE. */
int mig_comm_new_ahead(struct mig_endpoint *ep, uint64_t epoch, int rank, int nranks,
                       const char *const *peer_addrs, const struct mig_auth *auth,
                       double timeout_s, _Atomic bool *stop, struct mig_comm **ret);
/* The epoch of c, built ahead, is the endpoint's current one from now on: hellos of older
 * epochs are stale (answered -ESTALE), as after a build at the boundary. Call at the boundary,
 * from the endpoint's thread. NULL-safe; nothing for a comm built at its boundary. */
void mig_comm_enter(struct mig_comm *c);

/* Closes every connection of the epoch and wipes its key. NULL-safe; returns NULL. */
struct mig_comm *mig_comm_free(struct mig_comm *c);
/* Sets the no-progress limit of every later call on c (mig_comm_new's timeout_s was both the
 * wait for the peers and this): a worker that waited longer for its peers to reach a boundary
 * keeps the usual limit for the data it then moves. Call before c is used from another thread.
 * Returns 0, -EINVAL (bad comm or timeout). */
int mig_comm_set_timeout(struct mig_comm *c, double timeout_s);
/* Until c receives its first byte, calls on it wait up to `seconds` without progress rather
 * than the no-progress limit: for a rank that reached the boundary early (a spare, whose
 * order came a lease ahead) and whose peers, their handshakes done ahead
 * (mig_comm_new_ahead), send only once they have trained up to it. (Not abandoned with its
 * epoch: by then it may be the running epoch's comm, whose first step is not over. A peer
 * that gives the epoch up closes its connections, which ends the wait.) Call before c is used
 * from another thread. Returns 0, -EINVAL (bad comm or seconds). */
int mig_comm_set_first_wait(struct mig_comm *c, double seconds);
/* st_now() when c received its first byte (0: not yet, or a bad comm). Safe from any thread
 * while c is alive: a rank early at a boundary measures its first step from there, when its
 * peers began to send (the runner's first-step figures). "tcp" only (0 on nccl). */
double mig_comm_heard_at(const struct mig_comm *c);
/* The batch running on c in another thread, and every later call on c, give up within 50 ms
 * with -ECANCELED; the streams with unfinished messages are unusable afterwards. Safe from any
 * thread while c is alive. NULL-safe. */
void mig_comm_cancel(struct mig_comm *c);
/* Ends every stream of c now, not only those a failed call left out of step: each peer's
 * call with us, in flight or to come, fails at once (the end of the stream, or a reset where
 * it sent what we will not read) instead of waiting out its no-progress timeout. For a comm
 * its owner stops using before the epoch ends (a side channel whose copies stop after a
 * failed exchange: its peers may have finished that exchange and start the next). Our own
 * later calls fail with -ECONNABORTED; free c as usual. Not from another thread while a call
 * runs on c (mig_comm_cancel is). Returns 0, -EINVAL (bad comm), -EOPNOTSUPP (a transport
 * without it: nccl). */
int mig_comm_shut(struct mig_comm *c);

/* A connection refused by the handshake, as recorded on the endpoint. */
struct mig_auth_failure {
    char peer[MIG_ADDR_MAX]; /* "HOST:PORT" it came from (accepted) or we dialled (outgoing) */
    uint64_t epoch;          /* the epoch its hello named; 0 when it sent none */
    const char *why;         /* static text, e.g. "bad proof", "truncated hello" */
};
#define MIG_AUTH_FAILURES_KEPT 32 /* newest failures kept until taken; older ones only counted */

/* Moves up to max recorded failures (oldest first) into ret and forgets them; returns how
 * many. The caller reports them (the worker relays them to the coordinator as notices). */
size_t mig_endpoint_auth_failures(struct mig_endpoint *ep, struct mig_auth_failure *ret,
                                  size_t max);
/* Failures since the endpoint was created, including those no longer kept. */
uint64_t mig_endpoint_auth_failure_total(const struct mig_endpoint *ep);

/* Looks at the listener between epochs, without blocking: accepts waiting connections, reads
 * their hellos, refuses (and records) those that cannot be genuine now — a hello of another
 * protocol version, or for an epoch whose communicator is already built — answers stale ones,
 * and keeps hellos of later epochs for their mig_comm_new. A worker calls it at every step so
 * that a stranger is refused while training runs, not only at the next reconfiguration.
 * Returns 0 or -EINVAL. */
int mig_endpoint_service(struct mig_endpoint *ep);

int mig_comm_rank(const struct mig_comm *c);
int mig_comm_size(const struct mig_comm *c);
uint64_t mig_comm_epoch(const struct mig_comm *c);
/* "tcp" or "nccl". */
const char *mig_comm_transport(const struct mig_comm *c);

/* Blocking point-to-point: one message of exactly `bytes` (0 allowed). The receiver must post
 * the same size as the sender, else -EPROTO. Messages between a pair are matched in order.
 * A send only completes locally (the bytes are in the socket), as MPI_Send does with eager
 * buffers; two ranks sending large messages to each other at once need mig_batch(). */
int mig_send(struct mig_comm *c, int peer, const void *buf, size_t bytes);
int mig_recv(struct mig_comm *c, int peer, void *buf, size_t bytes);

/* One operation of a batch. */
struct mig_op {
    int peer;     /* rank in the comm, != own rank */
    bool send;    /* true: send buf to peer; false: receive into buf from peer */
    void *buf;    /* host memory for tcp, device memory for nccl */
    size_t bytes; /* message size; sender and receiver must agree */
};

/* Concurrent point-to-point batch: posts all sends and receives, progresses them together
 * (one poll loop), returns 0 when all completed or the first error. Ops to the same peer in the
 * same direction are sent/matched in array order. After an error, connections with unfinished
 * operations are broken for the rest of the epoch (their byte streams are out of step): later
 * calls on them return the same error. Used by migration (transfers between different pairs run
 * concurrently) and by the pipeline schedule. */
int mig_batch(struct mig_comm *c, struct mig_op *ops, size_t n);

/* Collectives over a subgroup given as a list of ranks (the same list, in the same order, on
 * every member; the caller must be a member; no duplicates). Sums are done in a FIXED order
 * that depends only on the group list: element e of the result is
 *     ((x[group[0]] + x[group[1]]) + x[group[2]]) + ... + x[group[n-1]]
 * computed in the dtype's own precision (no FMA, no reassociation), whatever the timing, so
 * results are bitwise reproducible and equal to that serial loop.
 *
 * allreduce: buf (count elements) is replaced by the sum on every member. F32/F64 only. */
int mig_allreduce(struct mig_comm *c, const int *group, int n, void *buf, size_t count,
                  enum mig_dtype t);
/* reduce_scatter: `in` holds sum(counts) elements, as n contiguous segments; member i
 * (position i in group) receives the sum of segment i into out (counts[i] elements). out may
 * be in + offset of segment i (in place). F32/F64 only. */
int mig_reduce_scatter(struct mig_comm *c, const int *group, int n, const void *in, void *out,
                       const size_t *counts, enum mig_dtype t);
/* allgather: member i contributes `in` (counts[i] elements); out receives the n segments
 * contiguously in group order. in may be out + offset of segment i (in place). */
int mig_allgather(struct mig_comm *c, const int *group, int n, const void *in, void *out,
                  const size_t *counts, enum mig_dtype t);
/* broadcast: root (a rank of the comm, member of group) sends buf to every member. */
int mig_broadcast(struct mig_comm *c, const int *group, int n, int root, void *buf,
                  size_t bytes);
/* barrier: returns when every member has entered it. */
int mig_barrier(struct mig_comm *c, const int *group, int n);

/* Payload bytes sent and received on c since mig_comm_new (headers not counted). Either
 * pointer may be NULL. */
void mig_comm_stats(const struct mig_comm *c, uint64_t *ret_sent, uint64_t *ret_recv);

/* True when the transport is compiled into this build ("tcp" always, "nccl" with CUDA). */
bool mig_transport_available(const char *name);

/* ==== checkpoints =========================================================================
 * A checkpoint is a directory: one self-contained file per layer (layer-NNNN.bin: magic,
 * version, sizes, names, float32 payload, XXH64 checksum over header+payload) and a
 * manifest.json written LAST by atomic rename: the manifest is the commit point, a directory
 * without it is torn. Layer 0 is the embeddings; the layout of the rest is the engine's.
 * Every layer file holds PARAM, ADAM_M and ADAM_V of each of its tensors, full (unsharded), so
 * a checkpoint loads into any (dp, pp). Format: docs/checkpoint-format.md.
 *
 * Every `dir` and `root` below may also be an object-store URL, s3://BUCKET/PREFIX,
 * gs://BUCKET/PREFIX or az://ACCOUNT/CONTAINER/PREFIX: the same files become objects (layer
 * files uploaded whole, in parts when large: S3 multipart, a GCS resumable upload, Azure
 * staged blocks; manifest.json put last, still the commit point), read back with the same
 * checks. Credentials and endpoints as each cloud's tools find them (common/aws-creds.h,
 * common/oauth.h; docs/aws.md, docs/gcp-azure.md). */

#define MIG_TENSOR_NAME_MAX 128 /* bytes of a name, NUL excluded */
#define MIG_CKPT_MAX_LAYERS 100000

/* A named float32 tensor. For writing, data is borrowed from the caller. */
struct mig_tensor {
    const char *name;          /* e.g. "wte", "h.3.attn.c_attn.weight" */
    enum st_state_kind kind;
    size_t count;              /* elements */
    float *data;
};

/* Writes layer files into one checkpoint directory. Holds only the directory name, so one
 * writer per process (or per thread) can write its own layers; a background thread may run
 * mig_ckpt_write_layer() on a snapshot of the tensors. */
struct mig_ckpt_writer;

/* Creates dir (mkdir -p). Caller frees with mig_ckpt_writer_free(). */
int mig_ckpt_writer_new(const char *dir, struct mig_ckpt_writer **ret);
struct mig_ckpt_writer *mig_ckpt_writer_free(struct mig_ckpt_writer *w);
/* Writes layer-NNNN.bin atomically (temp file, fsync, rename). t[0..n-1]: names unique per
 * (name, kind), at most MIG_TENSOR_NAME_MAX bytes. May be called from different processes for
 * different layers of the same directory. The caller's buffers are only read. */
int mig_ckpt_write_layer(struct mig_ckpt_writer *w, int layer, const struct mig_tensor *t,
                         size_t n);
/* Test hook (like st_alloc_fail_after): the nth mig_ckpt_write_layer() from now (1-based,
 * counted per process, all threads) fails with -ENOSPC after writing its payload, as on a disk
 * that filled up mid-file: the temporary file is removed and the layer is not there; the calls
 * after it write again (the space came back). 0 disarms. A worker arms it from the environment
 * (SPOTTRAIN_TEST_CKPT_ENOSPC=N) so that scripts/chaos can fail one checkpoint of a fleet. */
void mig_ckpt_write_fail_at(long n);

/* Metadata of a checkpoint, written into manifest.json by mig_ckpt_commit(). */
struct mig_ckpt_meta {
    const char *model_json;     /* JSON object: the model config (required) */
    uint64_t step;              /* steps completed */
    uint64_t samples_committed; /* training samples consumed by those steps */
    uint64_t data_position;     /* data loader position (e.g. next sample index) */
    uint64_t data_seed;
    uint64_t opt_step;          /* AdamW step count t (for bias correction) */
    const char *extra_json;     /* any JSON object from the caller, or NULL */
};

/* Commits the checkpoint in dir: verifies that layer-0000.bin .. layer-(nlayers-1) exist and
 * are valid (magic, version, sizes, checksum), then writes manifest.json (with each layer
 * file's size and checksum) by atomic rename and fsyncs the directory. -EINVAL when model_json
 * or extra_json is not a JSON object; -ENOENT/-EBADMSG (logged, naming the file) when a layer
 * file is missing or invalid. */
int mig_ckpt_commit(const char *dir, const struct mig_ckpt_meta *meta, int nlayers);

/* An opened (committed) checkpoint. */
struct mig_ckpt;

/* Opens dir: reads and checks manifest.json (torn: "manifest.json missing") and the header of
 * every layer file (magic, version, sizes, size recorded in the manifest). Checksums are
 * checked when a layer is read, or by mig_ckpt_verify(). On failure returns -ENOENT, -EBADMSG,
 * -EIO or -ENOMEM and, if err is non-NULL, fills err->file and err->message with the reason
 * (e.g. "bad magic", "unsupported version 7 (this build reads 1)", "checksum mismatch",
 * "truncated"). Caller frees with mig_ckpt_free(). */
int mig_ckpt_open(const char *dir, struct mig_ckpt **ret, struct st_error *err);
struct mig_ckpt *mig_ckpt_free(struct mig_ckpt *c);

int mig_ckpt_nlayers(const struct mig_ckpt *c);
/* Metadata from the manifest; the strings are owned by c (model_json, extra_json: compact
 * JSON text; extra_json "{}" when none was given). */
void mig_ckpt_get_meta(const struct mig_ckpt *c, struct mig_ckpt_meta *ret);
/* Number of tensors (all kinds) and float elements of layer, or -EINVAL. */
int mig_ckpt_layer_info(const struct mig_ckpt *c, int layer, size_t *ret_ntensors,
                        uint64_t *ret_elements);

/* One layer read back: ntensors tensors whose data live in one block owned by the layer. */
struct mig_ckpt_layer {
    int layer;
    size_t ntensors;
    struct mig_tensor *tensors;
};

/* Reads layer, checking its checksum. Errors as mig_ckpt_open (err may be NULL). Caller frees
 * with mig_ckpt_layer_free(). */
int mig_ckpt_read_layer(struct mig_ckpt *c, int layer, struct mig_ckpt_layer **ret,
                        struct st_error *err);
struct mig_ckpt_layer *mig_ckpt_layer_free(struct mig_ckpt_layer *l);
/* The tensor (name, kind) of l, or NULL. */
const struct mig_tensor *mig_ckpt_layer_find(const struct mig_ckpt_layer *l, const char *name,
                                             enum st_state_kind kind);

/* Reads every layer file in full and checks its checksum against the file and the manifest.
 * Returns 0 or the error of the first bad file (err filled as in mig_ckpt_open). */
int mig_ckpt_verify(struct mig_ckpt *c, struct st_error *err);

/* Writes into ret_dir the newest checkpoint directory under root that is committed and valid
 * (fully verified): directories named step-<N> (N decimal), newest = largest N; torn or corrupt
 * ones are skipped with a warning. -ENOENT when none is valid, -ENAMETOOLONG when size is too
 * small. */
int mig_ckpt_latest(const char *root, char *ret_dir, size_t size);

/* mig_ckpt_latest(), then the step that checkpoint holds (its manifest's step). Returns 0,
 * -ENOENT when none is valid, or another negative errno. The job driver's ckpt_latest. */
int mig_ckpt_latest_step(const char *root, char *ret_dir, size_t size, uint64_t *ret_step);

/* Removes ROOT/step-N directories beyond the newest `keep` committed ones (manifest.json
 * present); newer uncommitted ones (still being written) stay. Returns the number removed or
 * negative errno (root missing = 0 removed). The job driver's retention. */
int mig_ckpt_prune(const char *root, int keep);

/* Checks that a checkpoint root can be used before any work is done: for an object-store URL
 * (s3://, gs://, az://) it lists the prefix, which proves the credentials, the endpoint and the
 * bucket or container (the failure is logged with the store's error code); a local path is 0.
 * Returns 0, -ENOKEY (no credentials), -EACCES (refused), -ENXIO (no such bucket), -EINVAL
 * (bad URL) or another negative errno. Callers use it to fail fast with exit 2. */
int mig_ckpt_check_root(const char *root);
/* The same check for a checkpoint that is about to be written to dir (a `--save`): a store URL
 * as mig_ckpt_check_root; a local directory is created (as the writer would) and must be
 * writable. 0, or a negative errno (-EACCES, -ENOENT, -ENOTDIR, -EROFS, ...). */
int mig_ckpt_check_dest(const char *dir);

/* 64-bit XXH64 (xxHash, seed) of data, as the checkpoint files use it. Exposed for tests and
 * tools. */
uint64_t mig_xxh64(const void *data, size_t len, uint64_t seed);

#include "migrate-execute.h" /* running a transfer list at a step boundary */

#endif
