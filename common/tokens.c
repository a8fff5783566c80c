/* tokens.c: token files, the step-deterministic sampler and the synthetic Markov corpus.
 *
 * Token files are mapped read-only and validated once at open (header, size, every token
 * below the vocabulary), so the training loop can index them without checks. The sampler is
 * counter-based (splitmix64 of the global sample number), which is what lets any split of a
 * step's batch across workers read the same windows. The synthetic corpus comes from a Markov
 * source whose entropy rate is computed exactly, giving a training run a known loss floor. */
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "common.h"

#define ST_TOKENS_HANDLE_MAGIC 0x746f6b6eu /* "tokn" */

uint64_t st_mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

const char *st_tokens_format_name(enum st_tokens_format f) {
    return f == ST_TOKENS_LLMC ? "llmc" : "nanogpt";
}

int st_tokens_format_parse(const char *s, enum st_tokens_format *ret) {
    if (!s || !ret)
        return -EINVAL;
    if (strcmp(s, "nanogpt") == 0 || strcmp(s, "raw") == 0)
        *ret = ST_TOKENS_NANOGPT;
    else if (strcmp(s, "llmc") == 0 || strcmp(s, "llm.c") == 0)
        *ret = ST_TOKENS_LLMC;
    else
        return -EINVAL;
    return 0;
}

static int32_t le32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

int st_tokens_open(const char *path, int vocab, struct st_tokens **ret, struct st_error *reterr) {
    int r = 0, fd = -1;
    void *map = MAP_FAILED;
    size_t len = 0;
    struct st_tokens *t = NULL;

    if (!path || !ret || vocab < 0 || vocab > 65536)
        return -EINVAL;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        r = -errno;
        st_error_set(reterr, path, 0, 0, "", "cannot open token file: %s", st_strerror(r));
        return r;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        r = -errno;
        st_error_set(reterr, path, 0, 0, "", "cannot stat token file: %s", st_strerror(r));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        r = st_error_set(reterr, path, 0, 0, "", "not a regular file");
        goto out;
    }
    len = (size_t)st.st_size;
    if (len < 4) {
        r = st_error_set(reterr, path, 0, 0, "",
                         "token file has %zu bytes; it needs at least 2 uint16 tokens", len);
        goto out;
    }
    map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        r = -errno;
        st_error_set(reterr, path, 0, 0, "", "cannot map token file: %s", st_strerror(r));
        goto out;
    }

    const unsigned char *b = map;
    int32_t magic = le32(b);
    enum st_tokens_format format;
    const uint16_t *tok;
    uint64_t n;
    if (magic == ST_TOKENS_LLMC_MAGIC) {
        format = ST_TOKENS_LLMC;
        if (len < ST_TOKENS_LLMC_HEADER_BYTES) {
            r = st_error_set(reterr, path, 0, 0, "",
                             "llm.c token file is %zu bytes, shorter than its %d-byte header", len,
                             ST_TOKENS_LLMC_HEADER_BYTES);
            goto out;
        }
        int32_t version = le32(b + 4), count = le32(b + 8);
        if (version != ST_TOKENS_LLMC_VERSION) {
            r = st_error_set(reterr, path, 0, 0, "",
                             "llm.c token file version %d is not supported (expected %d: uint16 "
                             "tokens%s)",
                             version, ST_TOKENS_LLMC_VERSION,
                             version == 2 ? "; version 2 holds uint32 tokens" : "");
            goto out;
        }
        if (count <= 1 ||
            (uint64_t)count * 2 != (uint64_t)len - ST_TOKENS_LLMC_HEADER_BYTES) {
            r = st_error_set(reterr, path, 0, 0, "",
                             "llm.c header says %d tokens but the file holds %zu bytes after the "
                             "header (expected %lld); the file is truncated or corrupt",
                             count, len - ST_TOKENS_LLMC_HEADER_BYTES, 2LL * count);
            goto out;
        }
        tok = (const uint16_t *)(b + ST_TOKENS_LLMC_HEADER_BYTES);
        n = (uint64_t)count;
    } else {
        if (magic == ST_TOKENS_LLMC_MODEL_MAGIC) {
            r = st_error_set(reterr, path, 0, 0, "",
                             "this is an llm.c model checkpoint (magic %d), not a token file",
                             magic);
            goto out;
        }
        format = ST_TOKENS_NANOGPT;
        if (len % 2 != 0) {
            r = st_error_set(reterr, path, 0, 0, "",
                             "raw uint16 token file has an odd size (%zu bytes); it is truncated "
                             "or not a token file",
                             len);
            goto out;
        }
        tok = (const uint16_t *)b;
        n = len / 2;
    }

    uint32_t max_tok = 0;
    for (uint64_t i = 0; i < n; i++)
        if (tok[i] > max_tok)
            max_tok = tok[i];
    if (vocab > 0 && max_tok >= (uint32_t)vocab) {
        uint64_t at = 0;
        while (tok[at] < vocab)
            at++;
        r = st_error_set(reterr, path, 0, 0, "",
                         "token %u at index %llu is outside the vocabulary of %d (largest token "
                         "in the file: %u)",
                         tok[at], (unsigned long long)at, vocab, max_tok);
        goto out;
    }

    t = st_calloc(1, sizeof(*t));
    if (!t) {
        r = -ENOMEM;
        goto out;
    }
    t->magic = ST_TOKENS_HANDLE_MAGIC;
    t->format = format;
    t->tok = tok;
    t->ntokens = n;
    t->max_token = max_tok;
    t->map = map;
    t->map_len = len;
    map = MAP_FAILED;
    *ret = t;
out:
    if (map != MAP_FAILED)
        munmap(map, len);
    if (fd >= 0)
        close(fd);
    return r;
}

struct st_tokens *st_tokens_free(struct st_tokens *t) {
    if (!t)
        return NULL;
    if (t->map)
        munmap(t->map, t->map_len);
    t->magic = 0;
    st_free(t);
    return NULL;
}

int st_tokens_sample_offset(const struct st_tokens *t, uint64_t seed, uint64_t step,
                            int global_batch, int index, int T, uint64_t *ret_offset) {
    if (!t || t->magic != ST_TOKENS_HANDLE_MAGIC || !ret_offset || global_batch <= 0 ||
        index < 0 || index >= global_batch || T <= 0)
        return -EINVAL;
    if (t->ntokens < (uint64_t)T + 1)
        return -EINVAL;
    uint64_t windows = t->ntokens - (uint64_t)T; /* start offsets 0 .. ntokens-T-1 */
    uint64_t sample = step * (uint64_t)global_batch + (uint64_t)index;
    uint64_t h = st_mix64(st_mix64(seed) ^ sample);
    *ret_offset = h % windows;
    return 0;
}

int st_tokens_sample(const struct st_tokens *t, uint64_t seed, uint64_t step, int global_batch,
                     int index, int T, uint16_t *out) {
    uint64_t off;
    if (!out)
        return -EINVAL;
    int r = st_tokens_sample_offset(t, seed, step, global_batch, index, T, &off);
    if (r < 0)
        return r;
    memcpy(out, t->tok + off, ((size_t)T + 1) * sizeof(uint16_t));
    return 0;
}

int st_tokens_write(const char *path, enum st_tokens_format format, const uint16_t *tok,
                    uint64_t n) {
    if (!path || !tok || n == 0)
        return -EINVAL;
    if (format == ST_TOKENS_LLMC && n > (uint64_t)INT32_MAX)
        return -EINVAL;
    if (n > (SIZE_MAX - ST_TOKENS_LLMC_HEADER_BYTES) / 2)
        return -EINVAL;
    size_t hdr = format == ST_TOKENS_LLMC ? ST_TOKENS_LLMC_HEADER_BYTES : 0;
    size_t len = hdr + (size_t)n * 2;
    unsigned char *buf = st_calloc(1, len);
    if (!buf)
        return -ENOMEM;
    if (hdr) {
        int32_t h[3] = {ST_TOKENS_LLMC_MAGIC, ST_TOKENS_LLMC_VERSION, (int32_t)n};
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < 4; k++)
                buf[i * 4 + k] = (unsigned char)((uint32_t)h[i] >> (8 * k));
    }
    for (uint64_t i = 0; i < n; i++) {
        buf[hdr + 2 * i] = (unsigned char)(tok[i] & 0xff);
        buf[hdr + 2 * i + 1] = (unsigned char)(tok[i] >> 8);
    }
    int r = st_write_file_atomic(path, buf, len);
    st_free(buf);
    return r;
}

/* ---- Markov sources ------------------------------------------------------------------ */

/* A counter-based uniform double in [0, 1) from (key, i). */
static double unif(uint64_t key, uint64_t i) {
    return (double)(st_mix64(key ^ st_mix64(i)) >> 11) * 0x1.0p-53;
}

/* Allocates an empty source; vocab^order must fit ST_MARKOV_MAX_STATES. */
static int markov_alloc(int vocab, int order, int max_succ, struct st_markov **ret) {
    if (vocab < 2 || vocab > 65536 || order < 1 || max_succ < 1 || max_succ > 65535)
        return -EINVAL;
    uint64_t ns = 1;
    for (int i = 0; i < order; i++) {
        ns *= (uint64_t)vocab;
        if (ns > ST_MARKOV_MAX_STATES)
            return -EINVAL;
    }
    struct st_markov *m = st_calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    m->vocab = vocab;
    m->order = order;
    m->nstates = ns;
    m->max_succ = max_succ;
    m->nsucc = st_calloc(ns, sizeof(*m->nsucc));
    m->succ = st_calloc(ns * (uint64_t)max_succ, sizeof(*m->succ));
    m->prob = st_calloc(ns * (uint64_t)max_succ, sizeof(*m->prob));
    if (!m->nsucc || !m->succ || !m->prob) {
        st_markov_free(m);
        return -ENOMEM;
    }
    *ret = m;
    return 0;
}

struct st_markov *st_markov_free(struct st_markov *m) {
    if (!m)
        return NULL;
    st_free(m->nsucc);
    st_free(m->succ);
    st_free(m->prob);
    st_free(m);
    return NULL;
}

int st_markov_new_random(int vocab, int order, uint64_t seed, struct st_markov **ret) {
    enum { MIN_SUCC = 2, MAX_SUCC = 8 };
    struct st_markov *m = NULL;
    if (!ret)
        return -EINVAL;
    int r = markov_alloc(vocab, order, MAX_SUCC, &m);
    if (r < 0)
        return r;
    m->eps = ST_MARKOV_EPS;
    uint64_t base = st_mix64(seed ^ 0x5eed5eed5eed5eedULL);
    int most = vocab < MAX_SUCC ? vocab : MAX_SUCC;
    int least = most < MIN_SUCC ? most : MIN_SUCC;
    for (uint64_t s = 0; s < m->nstates; s++) {
        uint64_t key = st_mix64(base ^ st_mix64(s));
        uint64_t ctr = 0;
        int k = least + (int)(st_mix64(key) % (uint64_t)(most - least + 1));
        uint16_t *succ = m->succ + s * MAX_SUCC;
        double *prob = m->prob + s * MAX_SUCC;
        double total = 0;
        for (int j = 0; j < k; j++) {
            /* Distinct successors: redraw on collision (k <= 8 <= vocab keeps this short). */
            uint16_t x;
            for (;;) {
                x = (uint16_t)(st_mix64(key ^ st_mix64(++ctr)) % (uint64_t)vocab);
                int dup = 0;
                for (int i = 0; i < j; i++)
                    dup |= succ[i] == x;
                if (!dup)
                    break;
            }
            /* Gamma(1/2) = Z^2 / 2, so normalised squared normals are Dirichlet(1/2). */
            double u1 = unif(key, ++ctr), u2 = unif(key, ++ctr);
            double z = sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
            double w = z * z + 1e-12;
            succ[j] = x;
            prob[j] = w;
            total += w;
        }
        for (int j = 0; j < k; j++)
            prob[j] /= total;
        m->nsucc[s] = (uint16_t)k;
    }
    *ret = m;
    return 0;
}

int st_markov_new_dense(int vocab, int order, const double *P, double eps,
                        struct st_markov **ret) {
    struct st_markov *m = NULL;
    if (!P || !ret || !(eps >= 0 && eps <= 1) || vocab > 65535)
        return -EINVAL;
    int r = markov_alloc(vocab, order, vocab, &m);
    if (r < 0)
        return r;
    m->eps = eps;
    for (uint64_t s = 0; s < m->nstates; s++) {
        const double *row = P + s * (uint64_t)vocab;
        double sum = 0;
        int k = 0;
        for (int x = 0; x < vocab; x++) {
            if (!(row[x] >= 0 && row[x] <= 1)) {
                st_markov_free(m);
                return -EINVAL;
            }
            sum += row[x];
            if (row[x] > 0) {
                m->succ[s * (uint64_t)vocab + (uint64_t)k] = (uint16_t)x;
                m->prob[s * (uint64_t)vocab + (uint64_t)k] = row[x];
                k++;
            }
        }
        if (fabs(sum - 1.0) > 1e-9) {
            st_markov_free(m);
            return -EINVAL;
        }
        m->nsucc[s] = (uint16_t)k;
    }
    *ret = m;
    return 0;
}

/* -sum p log p over the full next-token distribution of state s (eps-mixed). */
static double row_entropy(const struct st_markov *m, uint64_t s) {
    const double *prob = m->prob + s * (uint64_t)m->max_succ;
    double u = m->eps / m->vocab, h = 0;
    int k = m->nsucc[s];
    for (int j = 0; j < k; j++) {
        double p = (1.0 - m->eps) * prob[j] + u;
        if (p > 0)
            h -= p * log(p);
    }
    if (u > 0)
        h -= (double)(m->vocab - k) * u * log(u);
    return h;
}

/* Entropy of the stationary distribution of the last j tokens (the state's low j digits). */
static int marginal_entropy(const struct st_markov *m, const double *pi, int j, double *ret) {
    uint64_t nj = 1;
    for (int i = 0; i < j; i++)
        nj *= (uint64_t)m->vocab;
    double *q = st_calloc(nj, sizeof(double));
    if (!q)
        return -ENOMEM;
    for (uint64_t s = 0; s < m->nstates; s++)
        q[s % nj] += pi[s];
    double h = 0;
    for (uint64_t i = 0; i < nj; i++)
        if (q[i] > 0)
            h -= q[i] * log(q[i]);
    st_free(q);
    *ret = h;
    return 0;
}

int st_markov_entropy(const struct st_markov *m, struct st_markov_entropy *ret) {
    enum { MAX_ITERS = 200000 };
    int r = 0;
    if (!m || !ret)
        return -EINVAL;
    uint64_t ns = m->nstates, V = (uint64_t)m->vocab, nsuf = ns / V;
    double *pi = st_malloc(ns * sizeof(double));
    double *nx = st_malloc(ns * sizeof(double));
    double *suf = st_malloc(nsuf * sizeof(double));
    if (!pi || !nx || !suf) {
        r = -ENOMEM;
        goto out;
    }
    for (uint64_t s = 0; s < ns; s++)
        pi[s] = 1.0 / (double)ns;
    int it = 0;
    double resid = INFINITY;
    while (it < MAX_ITERS && !(resid < 1e-13)) {
        /* Uniform part: state s moves to (s mod V^(k-1)) * V + x for every x with weight
         * eps/V, so aggregate by the surviving suffix first (O(states), not O(states*V)). */
        memset(suf, 0, nsuf * sizeof(double));
        for (uint64_t s = 0; s < ns; s++)
            suf[s % nsuf] += pi[s];
        for (uint64_t s = 0; s < ns; s++)
            nx[s] = m->eps / (double)V * suf[s / V];
        for (uint64_t s = 0; s < ns; s++) {
            uint64_t base = (s % nsuf) * V;
            double w = (1.0 - m->eps) * pi[s];
            const uint16_t *succ = m->succ + s * (uint64_t)m->max_succ;
            const double *prob = m->prob + s * (uint64_t)m->max_succ;
            for (int j = 0; j < m->nsucc[s]; j++)
                nx[base + succ[j]] += w * prob[j];
        }
        /* With eps > 0 every state reaches the all-zeros state, which loops on itself, so the
         * chain is aperiodic and the plain step converges; without, take the lazy step
         * (pi + pi P) / 2, whose fixed point is the same. Renormalise against drift. */
        double sum = 0;
        for (uint64_t s = 0; s < ns; s++) {
            if (!(m->eps > 0))
                nx[s] = 0.5 * (nx[s] + pi[s]);
            sum += nx[s];
        }
        resid = 0;
        for (uint64_t s = 0; s < ns; s++) {
            nx[s] /= sum;
            resid += fabs(nx[s] - pi[s]);
        }
        double *tmp = pi;
        pi = nx;
        nx = tmp;
        it++;
    }
    if (!(resid < 1e-13)) {
        r = -ERANGE;
        goto out;
    }
    struct st_markov_entropy e;
    memset(&e, 0, sizeof(e));
    double rate = 0;
    for (uint64_t s = 0; s < ns; s++)
        rate += pi[s] * row_entropy(m, s);
    e.rate = rate;
    e.rate_bits = rate / M_LN2;
    e.iterations = it;
    e.residual = resid;
    /* cond[j] = H(j+1-gram) - H(j-gram) for j < order. */
    int top = m->order < 7 ? m->order : 7;
    double hprev = 0;
    for (int j = 0; j < top; j++) {
        double h;
        TRY_GOTO(marginal_entropy(m, pi, j + 1, &h), r, out);
        e.cond[j] = h - hprev;
        hprev = h;
    }
    if (m->order <= 7)
        e.cond[m->order] = rate;
    *ret = e;
out:
    st_free(pi);
    st_free(nx);
    st_free(suf);
    return r;
}

double st_markov_floor(const struct st_markov_entropy *e, int order, int T) {
    if (!e || T <= 0)
        return NAN;
    double sum = 0;
    for (int t = 0; t < T; t++) {
        int ctx = t + 1; /* position t predicts token t+1 from tokens 0..t */
        sum += ctx >= order || ctx > 7 ? e->rate : e->cond[ctx];
    }
    return sum / T;
}

/* One step of the source from state s with the two uniforms u (mix) and w (pick). */
static uint16_t markov_next(const struct st_markov *m, uint64_t s, double u, double w) {
    if (u < m->eps)
        return (uint16_t)(w * m->vocab);
    const uint16_t *succ = m->succ + s * (uint64_t)m->max_succ;
    const double *prob = m->prob + s * (uint64_t)m->max_succ;
    int k = m->nsucc[s];
    double c = 0;
    for (int j = 0; j < k - 1; j++) {
        c += prob[j];
        if (w < c)
            return succ[j];
    }
    return succ[k - 1];
}

int st_markov_generate(const struct st_markov *m, uint64_t seed, uint64_t n, uint16_t *out) {
    if (!m || (!out && n > 0))
        return -EINVAL;
    uint64_t key = st_mix64(seed ^ 0x6e6e6e6e6e6e6e6eULL);
    uint64_t burn = 64 * m->nstates;
    if (burn > (1u << 20))
        burn = 1u << 20;
    uint64_t s = 0, ctr = 0, nsuf = m->nstates / (uint64_t)m->vocab;
    for (uint64_t i = 0; i < burn + n; i++) {
        double u = unif(key, ctr++), w = unif(key, ctr++);
        uint16_t x = markov_next(m, s, u, w);
        s = (s % nsuf) * (uint64_t)m->vocab + x;
        if (i >= burn)
            out[i - burn] = x;
    }
    return 0;
}

/* ---- the synthetic corpus ------------------------------------------------------------ */

void st_synth_params_defaults(struct st_synth_params *p) {
    memset(p, 0, sizeof(*p));
    p->vocab = 256;
    p->order = 1;
    p->ntokens = 1u << 20;
    p->seed = 1;
    p->format = ST_TOKENS_NANOGPT;
}

static int synth_check(const struct st_synth_params *p) {
    if (!p || p->vocab < 2 || p->vocab > 65536 || p->order < 1 || p->ntokens < 2)
        return -EINVAL;
    if (p->ntokens > (1ULL << 31) - 1)
        return -EINVAL;
    return 0;
}

int st_synth_entropy(const struct st_synth_params *p, struct st_markov_entropy *ret_entropy) {
    struct st_markov *m = NULL;
    TRY(synth_check(p));
    TRY(st_markov_new_random(p->vocab, p->order, p->seed, &m));
    int r = st_markov_entropy(m, ret_entropy);
    st_markov_free(m);
    return r;
}

int st_synth_write(const struct st_synth_params *p, const char *path,
                   struct st_markov_entropy *ret_entropy) {
    struct st_markov *m = NULL;
    uint16_t *tok = NULL;
    struct st_markov_entropy e;
    int r;
    if (!path)
        return -EINVAL;
    TRY(synth_check(p));
    TRY(st_markov_new_random(p->vocab, p->order, p->seed, &m));
    TRY_GOTO(st_markov_entropy(m, &e), r, out);
    tok = st_malloc(p->ntokens * sizeof(uint16_t));
    if (!tok) {
        r = -ENOMEM;
        goto out;
    }
    TRY_GOTO(st_markov_generate(m, p->seed, p->ntokens, tok), r, out);
    TRY_GOTO(st_tokens_write(path, p->format, tok, p->ntokens), r, out);
    if (ret_entropy)
        *ret_entropy = e;
out:
    st_free(tok);
    st_markov_free(m);
    return r;
}

int st_tokens_synth_for_spec(const struct st_spec *spec, struct st_markov_entropy *ret_entropy) {
    struct st_synth_params p;
    struct st_markov_entropy e;
    if (!spec)
        return -EINVAL;
    if (!spec->data.synth)
        return 0;
    st_synth_params_defaults(&p);
    p.vocab = spec->model.vocab;
    if (spec->data.synth_order > 0)
        p.order = spec->data.synth_order;
    p.seed = spec->data.synth_seed;
    if (spec->data.synth_tokens > 0)
        p.ntokens = spec->data.synth_tokens;
    if (access(spec->data.train, F_OK) == 0) {
        TRY(st_synth_entropy(&p, &e));
        if (ret_entropy)
            *ret_entropy = e;
        return 0;
    }
    TRY(st_synth_write(&p, spec->data.train, &e));
    if (ret_entropy)
        *ret_entropy = e;
    return 1;
}
