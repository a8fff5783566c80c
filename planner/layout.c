/* layout.c: the layout model of migration plans (planner-migration.h): how a dp x pp layout
 * splits the layers into stages, which stage holds which layer (its own range, and the tied
 * copies a later stage reads), and which interval of a layer's state a position holds (a
 * whole layer for PARAM, one ZeRO-1 shard for ADAM_M and ADAM_V). migration.c plans the
 * transfers between two layouts from these rules; mig-validate.c checks plans against them.
 *
 * Pure: no I/O, no clocks, no globals, no logging. */
#include <errno.h>
#include <string.h>

#include "common.h"             /* st_shard */
#include "migration-internal.h" /* plan__errf, and what this file shares with migration.c */

/* ---- shards --------------------------------------------------------------------------- */

void plan_mig_shard(uint64_t n, uint32_t dp, uint32_t r, uint64_t *ret_offset,
                    uint64_t *ret_count) {
    uint64_t lo, hi;
    st_shard(n, dp, r, &lo, &hi); /* the engine's optimizer shards use the same rule */
    *ret_offset = lo;
    *ret_count = hi - lo;
}

uint64_t plan__shard_lo(uint64_t n, uint32_t dp, uint32_t r) {
    uint64_t lo, hi;
    st_shard(n, dp, r, &lo, &hi);
    return lo;
}

/* Replica whose (non-empty) shard contains element x < n. */
uint32_t plan__shard_index_of(uint64_t n, uint32_t dp, uint64_t x) {
    uint32_t r = (uint32_t)(x * dp / n);
    if (r >= dp)
        r = dp - 1;
    while (r + 1 < dp && plan__shard_lo(n, dp, r + 1) <= x)
        r++;
    while (r > 0 && plan__shard_lo(n, dp, r) > x)
        r--;
    return r;
}

/* ---- layouts -------------------------------------------------------------------------- */

/* Greedy split under bottleneck B: the number of stages needed (each stage as long as it fits). */
static uint32_t stages_needed(uint32_t nl, const uint64_t *w, uint64_t B) {
    uint32_t k = 1;
    uint64_t cur = 0;
    for (uint32_t l = 0; l < nl; l++) {
        if (cur + w[l] > B && cur > 0) {
            k++;
            cur = 0;
        }
        cur += w[l];
    }
    return k;
}

int plan_stage_split(uint32_t nlayers, const uint64_t *layer_params, uint32_t pp,
                     uint32_t *ret_lo) {
    if (!layer_params || !ret_lo || pp == 0 || pp > nlayers || nlayers > PLAN_MIG_MAX_LAYERS ||
        pp > PLAN_MIG_MAX_STAGES)
        return -EINVAL;
    uint64_t lo = 0, hi = 0;
    for (uint32_t l = 0; l < nlayers; l++) {
        if (layer_params[l] > PLAN_MIG_MAX_LAYER_ELEMS)
            return -EINVAL;
        lo = ST_MAX(lo, layer_params[l]);
        hi += layer_params[l];
    }
    /* Smallest bottleneck B for which the greedy split needs at most pp stages. */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (stages_needed(nlayers, layer_params, mid) <= pp)
            hi = mid;
        else
            lo = mid + 1;
    }
    uint64_t B = lo;
    /* Greedy again, capped so that every later stage keeps at least one layer. Either the cap
     * binds (then each later stage takes one layer, each <= B) or the greedy itself fills
     * all pp stages: the result is non-empty everywhere and within B. */
    uint32_t l = 0;
    ret_lo[0] = 0;
    for (uint32_t s = 0; s < pp; s++) {
        uint32_t cap = nlayers - (pp - s - 1); /* exclusive end this stage may reach */
        uint64_t cur = layer_params[l];
        uint32_t e = l + 1;
        if (s == pp - 1) {
            e = nlayers;
        } else {
            while (e < cap && cur + layer_params[e] <= B) {
                cur += layer_params[e];
                e++;
            }
        }
        l = e;
        ret_lo[s + 1] = e;
    }
    return 0;
}

int plan_mig_layout_init(uint32_t nlayers, const uint64_t *layer_params, uint32_t dp,
                         uint32_t pp, const uint32_t *stage_lo, struct plan_mig_layout *ret) {
    if (!ret || dp == 0 || pp == 0 || pp > PLAN_MIG_MAX_STAGES || pp > nlayers ||
        nlayers > PLAN_MIG_MAX_LAYERS || (uint64_t)dp * pp > PLAN_MIG_MAX_POSITIONS)
        return -EINVAL;
    struct plan_mig_layout l;
    memset(&l, 0, sizeof(l));
    l.dp = dp;
    l.pp = pp;
    if (stage_lo) {
        memcpy(l.stage_lo, stage_lo, (pp + 1) * sizeof(uint32_t));
    } else {
        int r = plan_stage_split(nlayers, layer_params, pp, l.stage_lo);
        if (r < 0)
            return r;
    }
    if (plan_mig_layout_check(&l, nlayers, NULL, 0) < 0)
        return -EINVAL;
    *ret = l;
    return 0;
}

int plan_mig_layout_add_tied(struct plan_mig_layout *l, int32_t stage, uint32_t layer) {
    if (!l || stage < PLAN_MIG_STAGE_LAST)
        return -EINVAL;
    if (l->ntied >= PLAN_MIG_MAX_TIED)
        return -E2BIG;
    l->tied[l->ntied].stage = stage;
    l->tied[l->ntied].layer = layer;
    l->ntied++;
    return 0;
}

int plan_mig_layout_check(const struct plan_mig_layout *l, uint32_t nlayers, char *err,
                          size_t errlen) {
    if (!l)
        return plan__errf(err, errlen, -EINVAL, "no layout");
    if (l->dp == 0 || l->pp == 0)
        return plan__errf(err, errlen, -EINVAL, "dp and pp must be >= 1 (got %u x %u)", l->dp,
                          l->pp);
    if (l->pp > PLAN_MIG_MAX_STAGES || l->pp > nlayers)
        return plan__errf(err, errlen, -EINVAL, "pp %u exceeds the %u layers", l->pp, nlayers);
    if ((uint64_t)l->dp * l->pp > PLAN_MIG_MAX_POSITIONS)
        return plan__errf(err, errlen, -EINVAL, "dp*pp = %llu exceeds %u positions",
                          (unsigned long long)l->dp * l->pp, PLAN_MIG_MAX_POSITIONS);
    if (l->stage_lo[0] != 0 || l->stage_lo[l->pp] != nlayers)
        return plan__errf(err, errlen, -EINVAL, "stage ranges must start at 0 and end at %u layers",
                          nlayers);
    for (uint32_t s = 0; s < l->pp; s++)
        if (l->stage_lo[s + 1] <= l->stage_lo[s])
            return plan__errf(err, errlen, -EINVAL, "stage %u has an empty or reversed layer range",
                              s);
    if (l->ntied > PLAN_MIG_MAX_TIED)
        return plan__errf(err, errlen, -EINVAL, "too many tied entries (%u)", l->ntied);
    for (uint32_t i = 0; i < l->ntied; i++) {
        if (l->tied[i].stage < PLAN_MIG_STAGE_LAST || l->tied[i].stage >= (int32_t)l->pp)
            return plan__errf(err, errlen, -EINVAL, "tied entry %u: bad stage %d", i,
                              l->tied[i].stage);
        if (l->tied[i].layer >= nlayers)
            return plan__errf(err, errlen, -EINVAL, "tied entry %u: layer %u out of range", i,
                              l->tied[i].layer);
    }
    return 0;
}

int plan_mig_layout_stage_of(const struct plan_mig_layout *l, uint32_t layer) {
    if (!l || l->pp == 0 || layer >= l->stage_lo[l->pp])
        return -1;
    uint32_t a = 0, b = l->pp; /* stage_lo[a] <= layer < stage_lo[b] */
    while (b - a > 1) {
        uint32_t m = (a + b) / 2;
        if (l->stage_lo[m] <= layer)
            a = m;
        else
            b = m;
    }
    return (int)a;
}

static int32_t tied_resolve(const struct plan_mig_layout *l, int32_t sel) {
    if (sel == PLAN_MIG_STAGE_FIRST)
        return 0;
    if (sel == PLAN_MIG_STAGE_LAST)
        return (int32_t)l->pp - 1;
    return sel;
}

static bool in_range(const struct plan_mig_layout *l, uint32_t s, uint32_t layer) {
    return layer >= l->stage_lo[s] && layer < l->stage_lo[s + 1];
}

/* True when stage s holds the PARAM of layer as a tied extra (not in its own range). */
bool plan__tied_holds(const struct plan_mig_layout *l, uint32_t s, uint32_t layer) {
    if (in_range(l, s, layer))
        return false;
    for (uint32_t i = 0; i < l->ntied; i++)
        if (l->tied[i].layer == layer && tied_resolve(l, l->tied[i].stage) == (int32_t)s)
            return true;
    return false;
}

bool plan__stage_holds(const struct plan_mig_layout *l, uint32_t s, uint32_t layer,
                        enum st_state_kind kind) {
    if (in_range(l, s, layer))
        return true;
    return kind == ST_STATE_PARAM && plan__tied_holds(l, s, layer);
}

/* Stages of layout l holding the PARAM of layer: its range stage, then tied holders.
 * Writes at most 1 + PLAN_MIG_MAX_TIED entries; returns the count. */
uint32_t plan__param_stages(const struct plan_mig_layout *l, const uint32_t *stage_of,
                             uint32_t layer, uint32_t *out) {
    uint32_t n = 0;
    out[n++] = stage_of[layer];
    for (uint32_t i = 0; i < l->ntied; i++) {
        if (l->tied[i].layer != layer)
            continue;
        uint32_t s = (uint32_t)tied_resolve(l, l->tied[i].stage);
        bool dup = false;
        for (uint32_t j = 0; j < n; j++)
            dup |= out[j] == s;
        if (!dup)
            out[n++] = s;
    }
    return n;
}

/* Interval of (layer, kind) held by position (s, r); false when none. */
bool plan__pos_holding(const struct plan_mig_layout *l, const uint64_t *np, uint32_t s,
                        uint32_t r, uint32_t layer, uint32_t kind, uint64_t *a, uint64_t *b) {
    if (!plan__stage_holds(l, s, layer, (enum st_state_kind)kind))
        return false;
    if (kind == ST_STATE_PARAM) {
        *a = 0;
        *b = np[layer];
    } else {
        uint64_t off, cnt;
        plan_mig_shard(np[layer], l->dp, r, &off, &cnt);
        *a = off;
        *b = off + cnt;
    }
    return true;
}

int plan_mig_holding(const struct plan_mig_layout *l, const uint64_t *layer_params,
                     uint32_t nlayers, uint32_t stage, uint32_t replica, uint32_t layer,
                     enum st_state_kind kind, uint64_t *ret_offset, uint64_t *ret_count) {
    if (!l || !layer_params || stage >= l->pp || replica >= l->dp || layer >= nlayers ||
        (unsigned)kind >= ST_STATE_NKINDS || plan_mig_layout_check(l, nlayers, NULL, 0) < 0)
        return -EINVAL;
    uint64_t a, b;
    if (!plan__pos_holding(l, layer_params, stage, replica, layer, kind, &a, &b))
        return 0;
    if (ret_offset)
        *ret_offset = a;
    if (ret_count)
        *ret_count = b - a;
    return 1;
}

int plan_mig_gpt_layer_params(uint32_t layers, uint32_t hidden, uint32_t vocab,
                              uint32_t seq_len, uint64_t *ret) {
    if (!ret || layers == 0 || hidden == 0 || vocab == 0 || seq_len == 0 ||
        layers + 2 > PLAN_MIG_MAX_LAYERS)
        return -EINVAL;
    uint64_t h = hidden;
    ret[0] = (uint64_t)vocab * h + (uint64_t)seq_len * h;
    for (uint32_t l = 1; l <= layers; l++)
        ret[l] = 12 * h * h + 13 * h;
    ret[layers + 1] = 2 * h;
    return (int)(layers + 2);
}
