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
double plan__measured_inter_ms(const struct plan_cost *c, int D, int dp, int pp,
                               double stage_params);
double plan__measured_repartition_ms(const struct plan_cost *c, int D, int P, const char *dead,
                                     int dp, int pp);
/* splitmix64 step. */
uint64_t plan__rng_next(uint64_t *state);

#endif
