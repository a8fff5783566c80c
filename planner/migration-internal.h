/* migration-internal.h: what planner/migration.c shares with mig-validate.c and layout.c: the
 * request's lookup tables and the rules of who holds what. Not part of the API. */
#ifndef ST_PLANNER_MIGRATION_INTERNAL_H
#define ST_PLANNER_MIGRATION_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "planner-migration.h"

/* A request, checked, with its lookup tables (plan__ctx_init; plan__ctx_done frees them). */
struct plan__ctx {
    const struct plan_mig_request *req;
    const struct plan_mig_layout *ol, *nl; /* old, new layouts */
    const uint64_t *np;                    /* layer_params */
    uint32_t nlayers, nw;
    uint32_t oP, nP;                       /* old / new positions */
    int32_t *old_at;                       /* [oP]: worker at old position, -1 none */
    uint32_t *so_of;                       /* [nlayers]: old stage of layer */
    uint32_t *sn_of;                       /* [nlayers]: new stage of layer */
};

#define PLAN_MIG_MAX_LAYER_ELEMS (1ull << 50) /* keeps r*n within 64 bits */

/* Fills err (when given) with the formatted message; returns r. */
int plan__errf(char *err, size_t errlen, int r, const char *fmt, ...) ST_PRINTF(4, 5);
/* layout.c: the first element of replica r's shard of n elements over dp replicas. */
uint64_t plan__shard_lo(uint64_t n, uint32_t dp, uint32_t r);
/* layout.c: the replica whose (non-empty) shard holds element x < n. */
uint32_t plan__shard_index_of(uint64_t n, uint32_t dp, uint64_t x);
/* layout.c: true when stage s of l holds the PARAM of layer as a tied copy (outside its own
 * range). */
bool plan__tied_holds(const struct plan_mig_layout *l, uint32_t s, uint32_t layer);
/* layout.c: true when stage s of l holds (layer, kind): its own range, or a tied PARAM. */
bool plan__stage_holds(const struct plan_mig_layout *l, uint32_t s, uint32_t layer,
                       enum st_state_kind kind);
/* layout.c: the stages of l holding the PARAM of layer (stage_of[layer] is its range's),
 * first its range stage, then the tied holders; writes at most 1 + PLAN_MIG_MAX_TIED entries
 * to out and returns the count. */
uint32_t plan__param_stages(const struct plan_mig_layout *l, const uint32_t *stage_of,
                            uint32_t layer, uint32_t *out);
/* layout.c: the interval [*a, *b) of (layer, kind) that position (s, r) of layout l holds;
 * false when none. */
bool plan__pos_holding(const struct plan_mig_layout *l, const uint64_t *np, uint32_t s,
                       uint32_t r, uint32_t layer, uint32_t kind, uint64_t *a, uint64_t *b);
/* Validates the request and builds the lookup tables: 0, or a negative errno with err set. */
int plan__ctx_init(struct plan__ctx *c, const struct plan_mig_request *req, char *err,
                   size_t errlen);
void plan__ctx_done(struct plan__ctx *c);
/* What worker w holds (old) of (layer, kind); false when nothing or when w is dead. */
bool plan__w_holding(const struct plan__ctx *c, uint32_t w, uint32_t layer, uint32_t kind,
                     uint64_t *a, uint64_t *b);
/* Stable counting sort of v[0..n) by src (by_src) or dst into a new array (caller frees);
 * NULL when out of memory. */
struct plan_mig_transfer *plan__bucket_sort(const struct plan_mig_transfer *v, size_t n,
                                            uint32_t nw, bool by_src);
/* qsort order of transfers by (dst, layer, kind, offset). */
int plan__cmp_xfer_dst(const void *pa, const void *pb);

#endif
