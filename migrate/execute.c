/* execute.c: runs a migration transfer list at a step boundary (migrate-execute.h).
 *
 * The one idea: all of this rank's sends and receives of a migration go into one mig_batch,
 * built in list order. Both ends of a pair walk the same list, so the k-th message from A to B
 * that A posts is the k-th that B posts, and mig_batch matches them in order while transfers
 * between other pairs progress at the same time in the same poll loop. */
#include <string.h>

#include "check.h" /* TRY */
#include "common.h"
#include "migrate.h"
#include "migrate-execute.h"
#include "migrate-internal.h" /* struct mig_comm: cut_send */

static int xfer_check(const struct mig_xfer *x, int nranks) {
    if (x->src < 0 || x->dst < 0 || x->src >= nranks || x->dst >= nranks || x->src == x->dst ||
        x->count == 0 || x->kind > ST_STATE_ADAM_V || x->count > SIZE_MAX / sizeof(float))
        return -EINVAL;
    return 0;
}

/* See migrate-execute.h. */
void mig_xfer_bytes(const struct mig_xfer *x, size_t n, int rank, uint64_t *ret_send,
                    uint64_t *ret_recv) {
    uint64_t s = 0, r = 0;
    for (size_t i = 0; x && i < n; i++) {
        if (x[i].src == rank)
            s += x[i].count * sizeof(float);
        if (x[i].dst == rank)
            r += x[i].count * sizeof(float);
    }
    if (ret_send)
        *ret_send = s;
    if (ret_recv)
        *ret_recv = r;
}

/* mig_execute_cut_at(): sending executions counted since it was armed, and the one cut. */
static long cut_at, cut_count;

/* See migrate-execute.h. */
void mig_execute_cut_at(long n) {
    __atomic_store_n(&cut_count, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&cut_at, n, __ATOMIC_SEQ_CST);
}

/* See migrate-execute.h. */
int mig_execute(struct mig_comm *c, const struct mig_xfer *x, size_t n, mig_xfer_buf_fn *buf,
                void *userdata, struct mig_exec_stats *ret_stats) {
    struct mig_exec_stats st;
    struct mig_op *ops = NULL;
    size_t nops = 0;
    int r = 0;

    if (!c || (n > 0 && (!x || !buf)))
        return -EINVAL;
    memset(&st, 0, sizeof(st));
    int rank = mig_comm_rank(c), nranks = mig_comm_size(c);
    for (size_t i = 0; i < n; i++) {
        TRY(xfer_check(&x[i], nranks));
        if (x[i].src == rank || x[i].dst == rank)
            nops++;
    }
    if (nops > 0) {
        ops = st_calloc(nops, sizeof(*ops));
        if (!ops)
            return -ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool send = x[i].src == rank;
        if (!send && x[i].dst != rank)
            continue;
        float *p = NULL;
        TRY_GOTO(buf(userdata, &x[i], send, &p), r, out);
        if (!p)
            TRY_GOTO(-EINVAL, r, out);
        ops[k].peer = send ? x[i].dst : x[i].src;
        ops[k].send = send;
        ops[k].buf = p;
        ops[k].bytes = (size_t)x[i].count * sizeof(float);
        if (send) {
            st.bytes_sent += ops[k].bytes;
            st.nsend++;
        } else {
            st.bytes_recv += ops[k].bytes;
            st.nrecv++;
        }
        k++;
    }
    if (nops > 0) {
        long at = __atomic_load_n(&cut_at, __ATOMIC_SEQ_CST);
        bool counted = st.nsend > 0 && at > 0;
        c->cut_send = counted && __atomic_add_fetch(&cut_count, 1, __ATOMIC_SEQ_CST) == at;
        bool armed = c->cut_send;
        uint64_t sent0 = c->sent;
        double t0 = st_now();
        r = mig_batch(c, ops, nops);
        /* The batch ended (cancelled, a broken connection) before its first send, the cut's
         * or any: it does not count, so a test that arms the cut always sees one. */
        if (counted && (armed ? c->cut_send : c->sent == sent0))
            __atomic_sub_fetch(&cut_count, 1, __ATOMIC_SEQ_CST);
        c->cut_send = false;
        if (r < 0)
            goto out;
        st.seconds = st_now() - t0;
    }
    if (ret_stats)
        *ret_stats = st;
out:
    st_free(ops);
    return r;
}
