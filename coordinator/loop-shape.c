/* loop-shape.c: the shape to run (loop-internal.h): a forced shape at its step, else the
 * liveput planner's decision on the forecast and the fitted cost model, else the simple
 * policy; then made feasible for the engine (the global batch over dp replicas, at most one
 * stage per layer, the spec's bounds, no more positions than available workers), with the
 * reason in words for the decision's event. loop-order.c orders the epoch that runs it. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "check.h" /* TRY */
#include "loop-internal.h"

/* The shape to run on n workers: (dp, pp) itself when the engine can run it there, else the
 * feasible shape with the best throughput under the cost model (without one: the most
 * workers), where keeping the current depth counts 20% extra (a repartition moves whole
 * layers) and the wanted pp wins ties. {0,0} when nothing fits. */
static void clamp_shape(const struct coord_loop *L, const struct plan_rules *rules, int n,
                        int *dp, int *pp) {
    if (*dp >= 1 && *pp >= 1 && *dp * *pp <= n && plan_shape_check(rules, *dp, *pp) == 0)
        return;
    int want_pp = *pp > 0 ? *pp : 1, bd = 0, bp = 0;
    double best = -1;
    for (int p = 1; p <= L->nlayers; p++)
        for (int d = 1; d * p <= n; d++) {
            if (plan_shape_check(rules, d, p) != PLAN_RULE_OK)
                continue;
            double v = L->cfg.cost ? plan_cost_throughput(L->cfg.cost, d, p) : 0;
            if (!(v > 0))
                v = 1e-9 * d * p; /* not in the model: prefer using more workers */
            if (L->epoch > 0 && p == L->pp)
                v *= 1.2; /* keeping the depth avoids a repartition: it must gain 20% to pay */
            bool better = v > best * (1 + 1e-9) ||
                          (v >= best * (1 - 1e-9) && p == want_pp && bp != want_pp);
            if (better) {
                best = v;
                bd = d;
                bp = p;
            }
        }
    *dp = bd;
    *pp = bp;
}

const struct coord_loop_forced *loop__forced_at(const struct coord_loop *L, uint64_t step) {
    const struct coord_loop_forced *f = NULL;
    for (int i = 0; i < L->cfg.nforced; i++)
        if (L->cfg.forced[i].step <= step)
            f = &L->cfg.forced[i];
    return f;
}

/* First forced change strictly after `step`, or 0. */
uint64_t loop__forced_next(const struct coord_loop *L, uint64_t step) {
    for (int i = 0; i < L->cfg.nforced; i++)
        if (L->cfg.forced[i].step > step)
            return L->cfg.forced[i].step;
    return 0;
}

/* Why (dp, pp) cannot run on n workers, in words, for a decision message; mirrors
 * engine_shape_ok(). */
static void shape_refusal(const struct coord_loop *L, int n, int dp, int pp, char *buf,
                          size_t size) {
    const struct st_spec *s = &L->cfg.spec;
    if (dp * pp > n)
        snprintf(buf, size, "needs %d workers and %d are available", dp * pp, n);
    else if (pp > L->nlayers)
        snprintf(buf, size, "has more stages than the model's %d layers", L->nlayers);
    else if (dp * pp > PLAN_MIG_MAX_POSITIONS)
        snprintf(buf, size, "has more than %d positions", PLAN_MIG_MAX_POSITIONS);
    else if (s->training.global_batch % (dp * s->training.micro_batch) != 0)
        snprintf(buf, size, "cannot split the global batch of %d into micro-batches of %d "
                 "over %d replicas", s->training.global_batch, s->training.micro_batch, dp);
    else
        snprintf(buf, size, "is outside the spec's planner bounds");
}

/* The shape for n available workers at boundary `at`: forced, else the liveput planner, else
 * the simple policy; always engine-feasible. */
void loop__choose_shape(struct coord_loop *L, int n, uint64_t at, const struct wv *v,
                        size_t nv, double now, int *ret_dp, int *ret_pp, char *why,
                        size_t whysz) {
    const struct st_spec *s = &L->cfg.spec;
    int dp = s->planner.dp > 0 ? s->planner.dp : 0, pp = s->planner.pp > 0 ? s->planner.pp : 0;
    const struct coord_loop_forced *f = loop__forced_at(L, at);
    bool consulted = false;
    double decided = 0;
    snprintf(why, whysz, "fill the fleet");
    if (f) {
        dp = f->dp;
        pp = f->pp;
        snprintf(why, whysz, "forced %dx%d from step %" PRIu64, f->dp, f->pp, f->step);
    } else if (L->cfg.cost && (dp == 0 || pp == 0)) {
        struct plan_notice notices[PLAN_MAX_NOTICES];
        int nn = 0;
        for (size_t i = 0; i < nv && nn < PLAN_MAX_NOTICES; i++) {
            if (v[i].dead || !v[i].leaving)
                continue;
            struct linst *x = loop__inst_find(L, v[i].w.instance_id);
            double tn = loop__trace_now(L, now);
            double left = x && x->deadline > tn ? (x->deadline - tn) : 0.0;
            /* A notice only the worker saw (GCE preempted, Azure Preempt): the provider's
             * notice length (spec fleet.notice: 30 s there) from when it was relayed. */
            if (!(x && x->deadline > 0) && v[i].relayed_at > 0)
                left = ST_MAX(0.0, L->cfg.spec.fleet.notice_seconds *
                                       (L->cfg.time_scale > 0 ? L->cfg.time_scale : 1) -
                                       (now - v[i].relayed_at));
            notices[nn].instance = (int)i;
            notices[nn].seconds = left / (L->cfg.time_scale > 0 ? L->cfg.time_scale : 1);
            nn++;
        }
        int total = 0;
        for (size_t i = 0; i < nv; i++)
            total += !v[i].dead;
        int hist[LOOP_MAX_HIST + 1];
        int nh = L->nhist;
        memcpy(hist, L->hist, (size_t)nh * sizeof(int));
        hist[nh++] = total;
        struct plan_situation sit = {
            .cur = {L->epoch ? L->dp : 0, L->epoch ? L->pp : 0},
            .n_before = nh >= 2 ? hist[nh - 2] : total,
            .n_in = 0,
            .n_out = 0,
            .hist = hist,
            .nhist = nh,
            .notices = notices,
            .nnotices = nn,
        };
        if (nh >= 2) {
            int d = hist[nh - 1] - hist[nh - 2];
            sit.n_in = d > 0 ? d : 0;
            sit.n_out = d < 0 ? -d : 0;
        }
        struct plan_options o;
        plan_options_init(&o);
        o.lookahead = s->planner.lookahead > 0 ? ST_MIN(s->planner.lookahead,
                                                        PLAN_MAX_LOOKAHEAD) : 12;
        o.predictor = L->predictor;
        o.pp_min = s->planner.pp_min;
        o.pp_max = s->planner.pp_max ? ST_MIN(s->planner.pp_max, L->nlayers) : L->nlayers;
        o.dp_min = s->planner.dp_min;
        o.dp_max = s->planner.dp_max;
        o.rules = &L->rules; /* choose among the shapes the engine can run (clamp_shape's) */
        struct plan_decision d;
        loop__cm_feed(L);
        const struct plan_cost *dc = loop__decide_cost(L);
        if (dc != L->cfg.cost)
            plan_fit_margins(L->fit, &o); /* a gain the step times cannot tell from noise
                                           * buys no migration */
        double t0 = st_now();
        int r = plan_decide(dc, &sit, &o, &d);
        decided = st_now() - t0;
        consulted = true;
        if (r == 0 && d.shape.dp > 0) {
            dp = dp ? dp : d.shape.dp;
            pp = pp ? pp : d.shape.pp;
            L->forecast = d.npred > 0 ? d.pred_n[0] : n;
            if (sit.cur.dp == 0)
                /* From nothing there is no move and no migration to price: the planner's
                 * "move 0x0 -> ..." would read as one. */
                snprintf(why, whysz, "liveput: start %dx%d, the most samples over the next "
                         "%d intervals", d.shape.dp, d.shape.pp, o.lookahead);
            else
                snprintf(why, whysz, "liveput: %s", d.reason);
        } else if (r < 0) {
            snprintf(why, whysz, "liveput failed (%s); fill the fleet", st_strerror(r));
        } else {
            snprintf(why, whysz, "liveput: no shape fits %d workers", n);
        }
    }
    if (pp == 0)
        pp = L->epoch ? L->pp : 1;
    int want_dp = dp, want_pp = pp;
    clamp_shape(L, f ? &L->rules_forced : &L->rules, n, &dp, &pp);
    if (consulted) {
        /* The shape that will actually start, and why it differs from the planner's choice
         * when it does (engine rules, spec bounds, workers available). */
        if (dp > 0 && (dp != want_dp || pp != want_pp) && want_dp > 0) {
            char no[160];
            shape_refusal(L, n, want_dp, want_pp, no, sizeof(no));
            size_t k = strlen(why);
            snprintf(why + k, whysz - k, "; %dx%d runs instead (%dx%d %s)", dp, pp, want_dp,
                     want_pp, no);
        }
        struct coord_planner_decision pd = {
            .dp = dp, .pp = pp, .at_step = at, .decide_seconds = decided,
            .expected_samples_per_s =
                dp > 0 ? plan_cost_throughput(loop__decide_cost(L), dp,
                                              pp) : 0,
        };
        snprintf(pd.reason, sizeof(pd.reason), "%s", why);
        L->decisions++;
        coord_planner_record(L->c, plan_predictor_name(L->predictor), &pd);
    }
    *ret_dp = dp;
    *ret_pp = pp;
}

int loop__split_for(struct coord_loop *L, int pp, int *ret) {
    uint32_t lo[PLAN_MIG_MAX_STAGES + 1];
    TRY(plan_stage_split((uint32_t)L->nlayers, L->layer_params, (uint32_t)pp, lo));
    for (int s = 0; s <= pp; s++)
        ret[s] = (int)lo[s];
    return 0;
}
