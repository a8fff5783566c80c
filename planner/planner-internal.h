/* planner-internal.h: helpers shared by the files of planner/ only (not part of the API). */
#ifndef ST_PLANNER_INTERNAL_H
#define ST_PLANNER_INTERNAL_H

#include <stdint.h>

#include "planner.h"

/* Fills prefix sums, per-depth stage sizes and the shape index after a builder set shapes,
 * layers and throughput. Returns 0 or -ENOMEM. */
int plan__cost_finish(struct plan_cost *c);
/* Bytes of a stage's weights + optimizer state at depth pp. */
double plan__stage_state_bytes(const struct plan_cost *c, int pp, int stage);
/* Intra-stage migration time (communicator rebuild + process start), ms. */
double plan__intra_ms(const struct plan_cost *c, int dp, int pp);
/* Exact probability that every stage keeps >= dp replicas when n_out of N die uniformly. */
double plan__prob_intra(int N, int D, int P, int n_out, int dp);
/* Measured costs (measured.c; only when c->measured), ms: an intra-stage move from D to dp
 * replicas, an inter-stage move whose receivers each take at most stage_params parameters,
 * and a repartition from (D, P) with dead[r * P + s] marking lost grid instances (NULL: none). */
double plan__measured_intra_ms(const struct plan_cost *c, int D, int dp, int pp);
/* The part of a live migration's transfers that stalls training (docs/planner.md): the
 * weights' time whole, the moments' only beyond the new shape's step; all of it when the
 * state moves at the boundary. Any one unit of time. */
double plan__after_boundary(bool at_boundary, double weights, double moments, double step);
double plan__measured_inter_ms(const struct plan_cost *c, int D, int dp, int pp,
                               double stage_params);
double plan__measured_repartition_ms(const struct plan_cost *c, int D, int P, const char *dead,
                                     int dp, int pp);
/* Minimum-cost assignment (the Hungarian algorithm) on the n x m cost matrix a, row-major,
 * n <= m: writes ret_col[i], the distinct column of row i, so that the sum of a[i][ret_col[i]]
 * is least. Costs stay far below INT64_MAX / 4 in magnitude (its "infinity"; the migration
 * planner's are byte counts). O(n^2 m). Returns 0 or -ENOMEM (hungarian.c). */
int plan__hungarian(const int64_t *a, uint32_t n, uint32_t m, uint32_t *ret_col);
/* Parcae's pipeline split of L layers into pp stages: bounds[0..pp]. Returns 0 or -EINVAL. */
int plan__partition(int L, int pp, int *bounds);
/* The analytic model's description of a spec's built-in GPT and hardware (plan_cost_from_spec
 * and the feasibility rules share it, so both judge memory alike). */
void plan__desc_from_spec(const struct st_spec *spec, struct plan_model_desc *ret);
/* The analytic GPT's parameters per pipeline layer: embedding, d->layers blocks, final norm
 * (d->layers + 2 entries). */
void plan__gpt_layer_params(const struct plan_model_desc *d, double *ret);
/* Activation bytes one layer keeps per micro-batch. */
static inline double plan__act_layer_bytes(const struct plan_model_desc *d) {
    return 34.0 * d->seq * d->hidden * d->micro_batch;
}
/* Bytes a stage may use: 90% of the GPU's memory (the rest: allocator, workspace). */
static inline double plan__mem_budget(const struct plan_model_desc *d) {
    return d->gpu_mem_gib * 1073741824.0 * 0.9;
}
/* Bytes the fullest stage needs: 16 bytes per parameter (fp32 weights, gradients, two Adam
 * moments) plus the activations of min(pp, m) micro-batches in flight under 1F1B, m being the
 * micro-batches per replica and step. */
static inline double plan__stage_bytes(double pmax, int lmax, double act_layer, int pp, int m) {
    return pmax * 16 + (pp < m ? pp : m) * lmax * act_layer;
}
/* splitmix64 step. */
uint64_t plan__rng_next(uint64_t *state);

/* The margins a change must beat (plan_options.hysteresis, .defer): `set` unless it is NAN,
 * else PLAN_MARGIN_RESTART against restart costs and PLAN_MARGIN_MEASURED against live
 * migrations charged with measured costs (liveput.c says why). */
#define PLAN_MARGIN_RESTART 0.003
#define PLAN_MARGIN_MEASURED 0.001
double plan__margin(const struct plan_cost *c, double set);

#endif
