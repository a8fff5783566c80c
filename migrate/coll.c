/* coll.c: collectives over a subgroup, written once over a transport's point-to-point batch.
 *
 * The one idea: the sum of element e is always ((x[g0] + x[g1]) + x[g2]) + ... in group order,
 * computed by the one member that owns e's segment after it has received every member's
 * contribution, so the result depends only on the group list and the data, never on timing
 * (bitwise reproducible). All-reduce = reduce-scatter (direct: every member sends each
 * segment to its owner) + all-gather (every owner sends its segment to all), which moves
 * 2(n-1)/n of the buffer per member, like a ring, in two steps instead of 2(n-1). Segments are
 * moved in bounded chunks so the temporary memory stays small for any buffer size. */
#include <string.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "migrate-internal.h"

#define CHUNK_TOTAL (32u << 20) /* bytes of receive buffers per reduce-scatter round */
#define CHUNK_MIN (256u << 10)
#define CHUNK_MAX (8u << 20)

/* Validates a group and returns the caller's position in it (>= 0) or -EINVAL. */
static int group_check(const struct mig_comm *c, const int *group, int n) {
    int me = -1;
    if (!c || c->magic != MIG__COMM_MAGIC || !group || n < 1 || n > c->nranks)
        return -EINVAL;
    for (int i = 0; i < n; i++) {
        if (group[i] < 0 || group[i] >= c->nranks)
            return -EINVAL;
        for (int j = 0; j < i; j++)
            if (group[j] == group[i])
                return -EINVAL;
        if (group[i] == c->rank)
            me = i;
    }
    return me;
}

static void *mem_alloc(struct mig_comm *c, size_t bytes) {
    return c->ops->mem_alloc ? c->ops->mem_alloc(c, bytes) : st_malloc(bytes);
}

static void mem_free(struct mig_comm *c, void *p) {
    if (c->ops->mem_free)
        c->ops->mem_free(c, p);
    else
        st_free(p);
}

static int mem_copy(struct mig_comm *c, void *dst, const void *src, size_t bytes) {
    if (c->ops->mem_copy)
        return c->ops->mem_copy(c, dst, src, bytes);
    if (bytes)
        memmove(dst, src, bytes);
    return 0;
}

static int sum_into(struct mig_comm *c, void *acc, const void *x, size_t count,
                    enum mig_dtype t) {
    if (c->ops->mem_sum)
        return c->ops->mem_sum(c, acc, x, count, t);
    if (t == MIG_F32) {
        float *a = acc;
        const float *b = x;
        for (size_t i = 0; i < count; i++)
            a[i] = a[i] + b[i];
    } else {
        double *a = acc;
        const double *b = x;
        for (size_t i = 0; i < count; i++)
            a[i] = a[i] + b[i];
    }
    return 0;
}

static int gen_reduce_scatter(struct mig_comm *c, const int *group, int n, int me,
                              const void *in, void *out, const size_t *counts,
                              enum mig_dtype t) {
    size_t esz = mig_dtype_size(t), total = 0, maxc = 0;
    size_t *off = NULL;
    char *tmp = NULL;
    struct mig_op *ops = NULL;
    int r = 0;

    off = st_malloc((size_t)n * sizeof(*off));
    if (!off)
        return -ENOMEM;
    for (int i = 0; i < n; i++) {
        off[i] = total;
        total += counts[i];
        maxc = ST_MAX(maxc, counts[i]);
    }
    if (n == 1) {
        r = mem_copy(c, out, (const char *)in + off[0] * esz, counts[0] * esz);
        goto out;
    }
    size_t chunk_bytes = CHUNK_TOTAL / (size_t)n;
    chunk_bytes = ST_MAX(ST_MIN(chunk_bytes, (size_t)CHUNK_MAX), (size_t)CHUNK_MIN);
    size_t ch = chunk_bytes / esz; /* elements per segment per round */
    size_t rounds = (maxc + ch - 1) / ch;
    size_t mine = counts[me];
    size_t tmp_elems = ST_MIN(ch, mine);
    /* n slots: one per member's contribution; slot n-... the accumulator is slot me. */
    tmp = mem_alloc(c, (size_t)n * tmp_elems * esz + 1);
    ops = st_malloc(2 * (size_t)n * sizeof(*ops));
    if (!tmp || !ops) {
        r = -ENOMEM;
        goto out;
    }
    for (size_t k = 0; k < rounds; k++) {
        size_t nops = 0, base = k * ch;
        for (int i = 0; i < n; i++) {
            if (i == me || counts[i] <= base)
                continue;
            size_t len = ST_MIN(ch, counts[i] - base);
            ops[nops++] = (struct mig_op){group[i], true,
                                          (char *)in + (off[i] + base) * esz, len * esz};
        }
        size_t mylen = mine > base ? ST_MIN(ch, mine - base) : 0;
        if (mylen)
            for (int i = 0; i < n; i++)
                if (i != me)
                    ops[nops++] = (struct mig_op){group[i], false,
                                                  tmp + (size_t)i * tmp_elems * esz, mylen * esz};
        TRY_GOTO(c->ops->batch(c, ops, nops), r, out);
        if (!mylen)
            continue;
        /* Our own contribution goes into its slot, then the fixed-order sum into slot 0. */
        TRY_GOTO(mem_copy(c, tmp + (size_t)me * tmp_elems * esz,
                          (const char *)in + (off[me] + base) * esz, mylen * esz), r, out);
        for (int i = 1; i < n; i++)
            TRY_GOTO(sum_into(c, tmp, tmp + (size_t)i * tmp_elems * esz, mylen, t), r, out);
        TRY_GOTO(mem_copy(c, (char *)out + base * esz, tmp, mylen * esz), r, out);
    }
out:
    st_free(ops);
    if (tmp)
        mem_free(c, tmp);
    st_free(off);
    return r;
}

static int gen_allgather(struct mig_comm *c, const int *group, int n, int me, const void *in,
                         void *out, const size_t *counts, enum mig_dtype t) {
    size_t esz = mig_dtype_size(t), o = 0, myoff = 0;
    struct mig_op *ops = st_malloc(2 * (size_t)n * sizeof(*ops) + 1);
    size_t nops = 0;
    int r;
    if (!ops)
        return -ENOMEM;
    for (int i = 0; i < n; i++) {
        if (i == me) {
            myoff = o;
        } else {
            ops[nops++] = (struct mig_op){group[i], true, (void *)in, counts[me] * esz};
            ops[nops++] = (struct mig_op){group[i], false, (char *)out + o * esz,
                                          counts[i] * esz};
        }
        o += counts[i];
    }
    r = nops ? c->ops->batch(c, ops, nops) : 0;
    if (r >= 0 && (const char *)in != (char *)out + myoff * esz)
        r = mem_copy(c, (char *)out + myoff * esz, in, counts[me] * esz);
    st_free(ops);
    return r;
}

static int gen_broadcast(struct mig_comm *c, const int *group, int n, int me, int root,
                         void *buf, size_t bytes) {
    if (c->rank != root) {
        struct mig_op op = {root, false, buf, bytes};
        return c->ops->batch(c, &op, 1);
    }
    if (n == 1)
        return 0;
    struct mig_op *ops = st_malloc((size_t)n * sizeof(*ops));
    size_t nops = 0;
    int r;
    if (!ops)
        return -ENOMEM;
    for (int i = 0; i < n; i++)
        if (i != me)
            ops[nops++] = (struct mig_op){group[i], true, buf, bytes};
    r = c->ops->batch(c, ops, nops);
    st_free(ops);
    return r;
}

/* See migrate.h. */
int mig_reduce_scatter(struct mig_comm *c, const int *group, int n, const void *in, void *out,
                       const size_t *counts, enum mig_dtype t) {
    int me = group_check(c, group, n);
    if (me < 0 || !counts || (t != MIG_F32 && t != MIG_F64))
        return -EINVAL;
    for (int i = 0; i < n; i++)
        if (counts[i] && !in)
            return -EINVAL;
    if (counts[me] && !out)
        return -EINVAL;
    return gen_reduce_scatter(c, group, n, me, in, out, counts, t);
}

/* See migrate.h. */
int mig_allgather(struct mig_comm *c, const int *group, int n, const void *in, void *out,
                  const size_t *counts, enum mig_dtype t) {
    int me = group_check(c, group, n);
    if (me < 0 || !counts || mig_dtype_size(t) == 0)
        return -EINVAL;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += counts[i];
    if ((counts[me] && !in) || (total && !out))
        return -EINVAL;
    return gen_allgather(c, group, n, me, in, out, counts, t);
}

/* See migrate.h. */
int mig_allreduce(struct mig_comm *c, const int *group, int n, void *buf, size_t count,
                  enum mig_dtype t) {
    int me = group_check(c, group, n), r;
    if (me < 0 || (t != MIG_F32 && t != MIG_F64) || (count && !buf))
        return -EINVAL;
    if (n == 1 || count == 0)
        return n == 1 ? 0 : mig_barrier(c, group, n);
    size_t *counts = st_malloc((size_t)n * sizeof(*counts));
    if (!counts)
        return -ENOMEM;
    size_t base = count / (size_t)n, rem = count % (size_t)n, myoff = 0;
    for (int i = 0; i < n; i++) {
        counts[i] = base + ((size_t)i < rem ? 1 : 0);
        if (i < me)
            myoff += counts[i];
    }
    char *mine = (char *)buf + myoff * mig_dtype_size(t);
    r = gen_reduce_scatter(c, group, n, me, buf, mine, counts, t);
    if (r >= 0)
        r = gen_allgather(c, group, n, me, mine, buf, counts, t);
    st_free(counts);
    return r;
}

/* See migrate.h. */
int mig_broadcast(struct mig_comm *c, const int *group, int n, int root, void *buf,
                  size_t bytes) {
    int me = group_check(c, group, n);
    bool root_in = false;
    if (me < 0 || (bytes && !buf))
        return -EINVAL;
    for (int i = 0; i < n; i++)
        root_in |= group[i] == root;
    if (!root_in)
        return -EINVAL;
    return gen_broadcast(c, group, n, me, root, buf, bytes);
}

/* See migrate.h. */
int mig_barrier(struct mig_comm *c, const int *group, int n) {
    int me = group_check(c, group, n), r;
    if (me < 0)
        return -EINVAL;
    if (n == 1)
        return 0;
    /* One byte each way with every member: a zero-byte message would be a no-op on NCCL. */
    struct mig_op *ops = st_malloc(2 * (size_t)n * sizeof(*ops));
    char *tok = mem_alloc(c, 2 * (size_t)n);
    size_t nops = 0;
    if (!ops || !tok) {
        st_free(ops);
        if (tok)
            mem_free(c, tok);
        return -ENOMEM;
    }
    if (!c->ops->mem_alloc)
        memset(tok, 0, 2 * (size_t)n);
    for (int i = 0; i < n; i++)
        if (i != me) {
            ops[nops++] = (struct mig_op){group[i], true, tok + 2 * i, 1};
            ops[nops++] = (struct mig_op){group[i], false, tok + 2 * i + 1, 1};
        }
    r = c->ops->batch(c, ops, nops);
    st_free(ops);
    mem_free(c, tok);
    return r;
}
