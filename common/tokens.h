/* tokens.h: training data — token files (nanoGPT raw uint16, llm.c header + uint16), the
 * deterministic sampler, and the synthetic Markov corpus with a known entropy floor.
 *
 * Included by common.h; part of common/'s public interface. Nothing here logs: functions
 * return negative errno and, where a file is involved, fill a struct st_error naming it.
 *
 * The one idea: the samples of step s are a pure function of (seed, s, global_batch, i), so
 * any (dp, pp, micro-batch) split of a step consumes exactly the same token windows. */
#ifndef ST_TOKENS_H
#define ST_TOKENS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct st_error;
struct st_spec;

/* ---- token files ------------------------------------------------------------------- */

#define ST_TOKENS_LLMC_MAGIC 20240520   /* llm.c data file header[0] */
#define ST_TOKENS_LLMC_VERSION 1        /* header[1]: 1 = uint16 tokens (GPT-2 vocab) */
#define ST_TOKENS_LLMC_HEADER_INTS 256  /* header is 256 little-endian int32 */
#define ST_TOKENS_LLMC_HEADER_BYTES (ST_TOKENS_LLMC_HEADER_INTS * 4)
#define ST_TOKENS_LLMC_MODEL_MAGIC 20240326 /* llm.c model checkpoint, named in the error hint */

enum st_tokens_format {
    ST_TOKENS_NANOGPT = 0, /* raw little-endian uint16, no header (nanoGPT's train.bin) */
    ST_TOKENS_LLMC,        /* 1024-byte header (magic, version, count) then uint16 */
};

/* An opened token file. Read-only after st_tokens_open(); safe to share across threads. */
struct st_tokens {
    uint32_t magic;                /* ST_TOKENS_HANDLE_MAGIC while open */
    enum st_tokens_format format;
    const uint16_t *tok;           /* ntokens tokens (little-endian on disk = host order) */
    uint64_t ntokens;
    uint32_t max_token;            /* largest token value present */
    void *map;                     /* the mapping (whole file) */
    size_t map_len;                /* bytes mapped */
};

/* Opens and validates a token file: the format is told by the llm.c magic in the first 4
 * bytes; an llm.c header must carry version 1 and a count that matches the file size; a raw
 * file must have an even, non-zero size. When vocab > 0, every token must be < vocab. The file
 * is mapped read-only. Returns 0 and a heap handle in *ret (caller frees with
 * st_tokens_free()), -ENOENT/-EACCES/... when it cannot be opened, -EINVAL for a malformed file
 * (with reterr, if non-NULL, naming the file and what is wrong), -ENOMEM. */
int st_tokens_open(const char *path, int vocab, struct st_tokens **ret, struct st_error *reterr);

/* Unmaps and frees; NULL-safe; returns NULL. */
struct st_tokens *st_tokens_free(struct st_tokens *t);

/* The start offset of sample `index` of step `step`: a splitmix64 hash of
 * (seed, step * global_batch + index) reduced mod (ntokens - T). Pure; the same on every
 * worker. Returns 0 and writes *ret_offset, or -EINVAL (bad arguments, file shorter than
 * T + 1 tokens). */
int st_tokens_sample_offset(const struct st_tokens *t, uint64_t seed, uint64_t step,
                            int global_batch, int index, int T, uint64_t *ret_offset);

/* Copies the T + 1 tokens of that sample (inputs are out[0..T), targets out[1..T]) into out.
 * Returns 0 or -EINVAL. */
int st_tokens_sample(const struct st_tokens *t, uint64_t seed, uint64_t step, int global_batch,
                     int index, int T, uint16_t *out);

/* Writes a token file atomically (temp + rename) in the given format. Returns 0 or negative
 * errno (-EINVAL when n is 0 or too large for an llm.c header). */
int st_tokens_write(const char *path, enum st_tokens_format format, const uint16_t *tok,
                    uint64_t n);

/* "nanogpt" / "llmc"; and the reverse (returns 0 or -EINVAL). */
const char *st_tokens_format_name(enum st_tokens_format f);
int st_tokens_format_parse(const char *s, enum st_tokens_format *ret);

/* splitmix64's finalizer (Steele, Lea, Flood 2014): a bijective 64-bit mixer. Exposed so the
 * sampler's contract can be tested and reproduced outside C. */
uint64_t st_mix64(uint64_t x);

/* ---- Markov sources with an exact entropy rate --------------------------------------- */

#define ST_MARKOV_MAX_STATES (1u << 20) /* vocab^order bound: memory and power-iteration time */
#define ST_MARKOV_EPS 0.02              /* uniform mixing weight of the random sources */

/* An order-k Markov source over tokens 0..vocab-1. The state is the last k tokens, encoded
 * base vocab with the most recent token as the lowest digit. From state s the next token is,
 * with probability eps, uniform over the vocabulary, else drawn from the sparse row of s:
 * nsucc[s] successor tokens with probabilities prob (summing to 1). */
struct st_markov {
    int vocab;
    int order;
    uint64_t nstates;    /* vocab^order */
    int max_succ;        /* row stride of succ/prob */
    double eps;          /* in [0, 1] */
    uint16_t *nsucc;     /* [nstates] */
    uint16_t *succ;      /* [nstates * max_succ] */
    double *prob;        /* [nstates * max_succ] */
};

/* A random source: each state gets 2..8 distinct successors with Dirichlet(1/2) weights
 * (normalised squared normals), so a few successors dominate, mixed with eps = ST_MARKOV_EPS
 * uniform, which makes the chain irreducible and aperiodic. A pure function of the
 * arguments. Returns 0 and a heap source (free with st_markov_free()), -EINVAL when
 * vocab < 2 or > 65536, order < 1 or vocab^order > ST_MARKOV_MAX_STATES, or -ENOMEM. */
int st_markov_new_random(int vocab, int order, uint64_t seed, struct st_markov **ret);

/* A source from a dense row-stochastic matrix P[vocab^order][vocab] (each row sums to 1
 * within 1e-9, entries >= 0) and eps. Returns 0 and a heap source, -EINVAL, -ENOMEM. */
int st_markov_new_dense(int vocab, int order, const double *P, double eps,
                        struct st_markov **ret);

/* NULL-safe; returns NULL. */
struct st_markov *st_markov_free(struct st_markov *m);

/* The loss floor of a source. Entropies are in nats unless named _bits. */
struct st_markov_entropy {
    double rate;          /* entropy rate H(X_t | X_{t-k..t-1}) under the stationary law */
    double rate_bits;
    double cond[8];       /* cond[j] = H(X | j previous tokens), j = 0..min(order, 7);
                             cond[order] == rate */
    int iterations;       /* power-iteration steps taken */
    double residual;      /* L1 change of the last step */
};

/* Computes the stationary distribution by power iteration from the uniform start (on the
 * lazy chain (I + P) / 2 when eps is 0: same fixed point, always aperiodic) until the L1
 * change is below
 * 1e-13, then the entropy rate sum_s pi(s) H(P(s, .)) and the lower-order conditional
 * entropies from the stationary j-gram marginals. For a reducible chain the result is the
 * one reached from the uniform start. Returns 0, -ENOMEM, or -ERANGE when 200000 steps did
 * not converge (ret untouched). */
int st_markov_entropy(const struct st_markov *m, struct st_markov_entropy *ret);

/* The floor of the mean next-token loss of a model with context T: positions see 1..T
 * previous tokens, so the first order-1 positions pay cond[1..order-1]. */
double st_markov_floor(const struct st_markov_entropy *e, int order, int T);

/* Generates n tokens from the source, starting in state 0 and discarding a burn-in of
 * 64 * vocab^order steps (at most 2^20) so the sequence starts near the stationary law.
 * Pure function of (m, seed, n). Returns 0 or -EINVAL. */
int st_markov_generate(const struct st_markov *m, uint64_t seed, uint64_t n, uint16_t *out);

/* ---- the synthetic corpus ------------------------------------------------------------ */

struct st_synth_params {
    int vocab;                     /* default 256 */
    int order;                     /* default 1 */
    uint64_t ntokens;              /* default 1 << 20 */
    uint64_t seed;                 /* default 1 */
    enum st_tokens_format format;  /* default ST_TOKENS_NANOGPT */
};

/* Fills the defaults above. */
void st_synth_params_defaults(struct st_synth_params *p);

/* Builds the random source of p, computes its entropy and writes p->ntokens tokens to path
 * atomically. Returns 0 and fills *ret_entropy (may be NULL), -EINVAL for bad params,
 * -ERANGE (no convergence), -ENOMEM or an I/O errno. */
int st_synth_write(const struct st_synth_params *p, const char *path,
                   struct st_markov_entropy *ret_entropy);

/* Computes only the entropy of the source p describes (what `data info` and the train
 * progress line compare the loss with). Returns 0 or as st_markov_entropy(). */
int st_synth_entropy(const struct st_synth_params *p, struct st_markov_entropy *ret_entropy);

/* For a spec with a data.synth block: computes the source's entropy into *ret_entropy (may
 * be NULL) and, when data.train does not exist yet, writes it there (vocab = model.vocab,
 * order/seed/tokens from data.synth, nanoGPT format). Returns 1 when the file was written,
 * 0 when it already existed or the spec has no synth block (entropy then untouched),
 * negative errno as st_synth_write(). Called by `train` and `run` before opening the data. */
int st_tokens_synth_for_spec(const struct st_spec *spec, struct st_markov_entropy *ret_entropy);

#endif
