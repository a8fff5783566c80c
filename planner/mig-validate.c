/* mig-validate.c: plan_migration_validate (planner-migration.h), the check that a migration
 * plan moves exactly what the new layout needs from workers that hold it: every receiver gets
 * every element it needs once, from a live sender that holds it, and nothing else. It shares
 * the planner's rules of who holds what (migration-internal.h), not its choices. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "migration-internal.h"

/* First index in sorted (by dst, layer, kind, offset) t[0..n) not before (dst, layer, kind). */
static size_t lower_bound(const struct plan_mig_transfer *t, size_t n, uint32_t dst,
                          uint32_t layer, uint32_t kind) {
    size_t a = 0, b = n;
    struct plan_mig_transfer key = {0, dst, layer, kind, 0, 0};
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (plan__cmp_xfer_dst(&t[m], &key) < 0)
            a = m + 1;
        else
            b = m;
    }
    return a;
}

int plan_migration_validate(const struct plan_mig_request *req, const struct plan_migration *p,
                            char *err, size_t errlen) {
    struct plan__ctx c;
    int r = plan__ctx_init(&c, req, err, errlen);
    if (r < 0)
        return r;
    struct plan_mig_transfer *t = NULL;
    int32_t *pos_of = NULL;
    uint64_t *sent = NULL, *recv = NULL;
    r = -EINVAL;
    if (!p || p->magic != PLAN_MIG_MAGIC) {
        plan__errf(err, errlen, r, "not a migration plan");
        goto out;
    }
    if (p->nworkers != c.nw || p->npositions != c.nP) {
        plan__errf(err, errlen, r, "plan is for %u workers / %u positions, request has %u / %u",
                   p->nworkers, p->npositions, c.nw, c.nP);
        goto out;
    }
    r = -ENOMEM;
    size_t nw1 = c.nw ? c.nw : 1;
    pos_of = st_malloc(nw1 * sizeof(int32_t));
    sent = st_calloc(nw1, sizeof(uint64_t));
    recv = st_calloc(nw1, sizeof(uint64_t));
    t = st_malloc((p->ntransfers ? p->ntransfers : 1) * sizeof(*t));
    if (!pos_of || !sent || !recv || !t)
        goto out;
    r = -EINVAL;
    for (uint32_t w = 0; w < c.nw; w++)
        pos_of[w] = -1;
    /* The assignment: a bijection of alive, staying workers onto the positions. */
    for (uint32_t q = 0; q < c.nP; q++) {
        uint32_t w = p->position_worker[q];
        if (w >= c.nw) {
            plan__errf(err, errlen, r, "position %u: worker %u out of range", q, w);
            goto out;
        }
        if (!req->workers[w].alive || req->workers[w].leaving) {
            plan__errf(err, errlen, r, "position %u: worker %u ('%s') is %s", q, w,
                       req->workers[w].id, req->workers[w].alive ? "leaving" : "dead");
            goto out;
        }
        if (pos_of[w] >= 0) {
            plan__errf(err, errlen, r, "worker %u holds positions %d and %u", w, pos_of[w], q);
            goto out;
        }
        pos_of[w] = (int32_t)q;
        if (p->worker_stage[w] != (int32_t)(q / c.nl->dp) ||
            p->worker_replica[w] != (int32_t)(q % c.nl->dp)) {
            plan__errf(err, errlen, r, "worker %u: stage/replica disagree with position %u", w, q);
            goto out;
        }
    }
    for (uint32_t w = 0; w < c.nw; w++)
        if (pos_of[w] < 0 && (p->worker_stage[w] != -1 || p->worker_replica[w] != -1)) {
            plan__errf(err, errlen, r, "worker %u has a stage but no position", w);
            goto out;
        }
    /* Each transfer on its own. */
    uint64_t kind_bytes[ST_STATE_NKINDS] = {0}, moved = 0;
    for (size_t i = 0; i < p->ntransfers; i++) {
        const struct plan_mig_transfer *x = &p->transfers[i];
        uint64_t a, b;
        if (x->src >= c.nw || x->dst >= c.nw || x->layer >= c.nlayers ||
            x->kind >= ST_STATE_NKINDS || x->count == 0 || x->src == x->dst) {
            plan__errf(err, errlen, r, "transfer %zu: bad fields (src %u dst %u layer %u kind %u "
                       "count %llu)", i, x->src, x->dst, x->layer, x->kind,
                       (unsigned long long)x->count);
            goto out;
        }
        if (!req->workers[x->src].alive) {
            plan__errf(err, errlen, r, "transfer %zu: sender %u ('%s') is dead", i, x->src,
                       req->workers[x->src].id);
            goto out;
        }
        if (!plan__w_holding(&c, x->src, x->layer, x->kind, &a, &b) || x->offset < a ||
            x->offset + x->count > b) {
            plan__errf(err, errlen, r,
                       "transfer %zu: sender %u does not hold layer %u %s [%llu,+%llu)", i, x->src,
                       x->layer, st_state_kind_name((enum st_state_kind)x->kind),
                       (unsigned long long)x->offset, (unsigned long long)x->count);
            goto out;
        }
        if (pos_of[x->dst] < 0) {
            plan__errf(err, errlen, r, "transfer %zu: receiver %u has no new position", i, x->dst);
            goto out;
        }
        uint32_t q = (uint32_t)pos_of[x->dst];
        if (!plan__pos_holding(c.nl, c.np, q / c.nl->dp, q % c.nl->dp, x->layer, x->kind, &a, &b) ||
            x->offset < a || x->offset + x->count > b) {
            plan__errf(err, errlen, r, "transfer %zu: receiver %u does not need layer %u %s "
                       "[%llu,+%llu)", i, x->dst, x->layer,
                       st_state_kind_name((enum st_state_kind)x->kind),
                       (unsigned long long)x->offset, (unsigned long long)x->count);
            goto out;
        }
        uint64_t bytes = x->count * PLAN_MIG_ELEM_BYTES;
        kind_bytes[x->kind] += bytes;
        moved += bytes;
        sent[x->src] += bytes;
        recv[x->dst] += bytes;
        t[i] = *x;
    }
    if (p->ntransfers) { /* order (dst, layer, kind, offset): buckets, then small sorts */
        struct plan_mig_transfer *byd = plan__bucket_sort(t, p->ntransfers, c.nw, false);
        if (!byd) {
            r = -ENOMEM;
            goto out;
        }
        st_free(t);
        t = byd;
        for (size_t i = 0, j; i < p->ntransfers; i = j) {
            for (j = i + 1; j < p->ntransfers && t[j].dst == t[i].dst; j++)
                ;
            qsort(t + i, j - i, sizeof(*t), plan__cmp_xfer_dst);
        }
    }
    /* Coverage: held-in-place plus transfers tile every need exactly. */
    uint64_t kept = 0, needed = 0;
    for (uint32_t q = 0; q < c.nP; q++) {
        uint32_t w = p->position_worker[q], sn = q / c.nl->dp, rn = q % c.nl->dp;
        for (uint32_t l = 0; l < c.nlayers; l++) {
            for (uint32_t k = 0; k < ST_STATE_NKINDS; k++) {
                uint64_t a, b, ha = 0, hb = 0;
                if (!plan__pos_holding(c.nl, c.np, sn, rn, l, k, &a, &b))
                    continue;
                needed += b - a;
                bool held = plan__w_holding(&c, w, l, k, &ha, &hb);
                if (held) {
                    ha = ST_MAX(ha, a);
                    hb = ST_MIN(hb, b);
                    held = hb > ha;
                }
                if (held)
                    kept += hb - ha;
                uint64_t at = a;
                size_t i = lower_bound(t, p->ntransfers, w, l, k);
                for (;;) {
                    bool more = i < p->ntransfers && t[i].dst == w && t[i].layer == l &&
                                t[i].kind == k;
                    uint64_t next = more ? t[i].offset : UINT64_MAX;
                    if (held && ha < at) {
                        plan__errf(err, errlen, r, "worker %u layer %u %s: transfer overlaps the "
                                   "elements it holds at %llu", w, l,
                                   st_state_kind_name((enum st_state_kind)k),
                                   (unsigned long long)ha);
                        goto out;
                    }
                    if (held && ha <= next) {
                        if (ha != at)
                            break;
                        at = hb;
                        held = false;
                        continue;
                    }
                    if (!more)
                        break;
                    if (next != at) {
                        plan__errf(err, errlen, r,
                                   "worker %u layer %u %s: %s at element %llu (transfer from %u)",
                                   w, l, st_state_kind_name((enum st_state_kind)k),
                                   next < at ? "overlap" : "gap", (unsigned long long)at, t[i].src);
                        goto out;
                    }
                    at = next + t[i].count;
                    i++;
                }
                if (at != b) {
                    plan__errf(err, errlen, r,
                               "worker %u layer %u %s: elements [%llu, %llu) missing", w, l,
                               st_state_kind_name((enum st_state_kind)k), (unsigned long long)at,
                               (unsigned long long)b);
                    goto out;
                }
            }
        }
    }
    if (moved != p->bytes_moved || kept * PLAN_MIG_ELEM_BYTES != p->bytes_kept ||
        needed * PLAN_MIG_ELEM_BYTES != p->bytes_needed ||
        memcmp(kind_bytes, p->bytes_kind, sizeof(kind_bytes)) != 0 ||
        p->bytes_kept + p->bytes_moved != p->bytes_needed) {
        plan__errf(err, errlen, r, "byte counters disagree with the transfers");
        goto out;
    }
    for (uint32_t w = 0; w < c.nw; w++)
        if (sent[w] != p->sent_bytes[w] || recv[w] != p->recv_bytes[w]) {
            plan__errf(err, errlen, r, "worker %u: sent/received byte counters are wrong", w);
            goto out;
        }
    uint64_t pair_bytes = 0;
    for (size_t i = 0; i < p->npairs; i++)
        pair_bytes += p->pairs[i].bytes;
    if (pair_bytes != moved) {
        plan__errf(err, errlen, r, "pair byte counters disagree with the transfers");
        goto out;
    }
    r = 0;
out:
    st_free(t);
    st_free(pos_of);
    st_free(sent);
    st_free(recv);
    plan__ctx_done(&c);
    return r;
}
