/* sim.c: replays a trace interval by interval under one policy and counts committed samples.
 *
 * Scoring follows Parcae's simulator (liveput.py optimize): in interval i the policy's shape
 * runs after the interval's events; a change costs the migration time of the cost model
 * (by default its expectation over uniformly drawn victims, as Parcae's Monte Carlo store
 * does; with named_victims, the trace's own victims at their place in the assignment);
 * samples = throughput x (60 s - migration time), and a migration longer than the interval
 * carries over. A shape wider than the live instances is narrowed as Parcae does
 * (dp = N / pp, or one pipeline of N stages). The checkpoint-restart baseline is Parcae's
 * "throughput optimized" run; the redundant one is a Bamboo-like model (docs/planner.md). */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "common.h"
#include "planner-internal.h"
#include "planner.h"

#define REDUNDANT_FACTOR 0.75 /* Bamboo: redundant computation costs ~1/3 more compute */

const char *plan_policy_name(enum plan_policy p) {
    static const char *const names[PLAN_POL_NKINDS] = {
        "liveput",   "liveput-oracle", "reactive",    "checkpoint-restart",
        "redundant", "parcae",         "parcae-truth", "ideal"};
    return (unsigned)p < PLAN_POL_NKINDS ? names[p] : "?";
}

int plan_policy_parse(const char *s, enum plan_policy *ret) {
    for (int i = 0; i < PLAN_POL_NKINDS; i++)
        if (strcmp(s, plan_policy_name((enum plan_policy)i)) == 0) {
            *ret = (enum plan_policy)i;
            return 0;
        }
    return -EINVAL;
}

void plan_sim_options_init(struct plan_sim_options *o) {
    memset(o, 0, sizeof(*o));
    o->notice_s = 120;
    o->unannounced = 0;
    o->seed = 1;
    o->lookahead = 12;
    o->predictor = PLAN_PRED_NOTICE;
    o->cost_samples = 256;
    o->hysteresis = NAN; /* plan_options' default: by the cost model */
    o->tail = 0;
    o->defer = NAN;
    o->defer_max = 3;
    o->spot_price = 0.918;     /* p3.2xlarge spot, $/h (us-east-1, 2023) */
}

void plan_sim_result_done(struct plan_sim_result *r) {
    if (!r)
        return;
    st_free(r->shape);
    st_free(r->cum_samples);
    r->shape = NULL;
    r->cum_samples = NULL;
}

static struct plan_shape clamp_shape(struct plan_shape s, int N) {
    if (s.dp * s.pp > N) {
        s.dp = s.pp > 0 ? N / s.pp : 0;
        if (s.dp == 0) {
            s.dp = N > 0 ? 1 : 0;
            s.pp = N;
        }
    }
    return s;
}

/* Deterministic per-event coin in [0, 1). */
static double coin(uint64_t seed, int a, int b) {
    uint64_t st = seed ^ ((uint64_t)a << 32) ^ (uint64_t)(unsigned)b;
    return (double)(plan__rng_next(&st) >> 11) / 9007199254740992.0;
}

/* Assignment of named instances: grid[r * P + s] = name id, then spares. */
struct assign {
    int *pos;   /* name id at position i (grid first, then spares) */
    int n;      /* live instances */
};

static int find_pos(const struct assign *a, int name) {
    for (int i = 0; i < a->n; i++)
        if (a->pos[i] == name)
            return i;
    return -1;
}

/* Moves the job from (D, P) to (dp, pp) on the survivors: with the same depth, survivors keep
 * their stage; otherwise the old order is kept. Victims must already be removed (-1). */
static void reassign(struct assign *a, int D, int P, int dp, int pp, int *tmp) {
    int n = 0;
    if (pp == P && D > 0) {
        bool *used = (bool *)(tmp + a->n);
        memset(used, 0, (size_t)a->n * sizeof(bool));
        int *grid = tmp;
        for (int i = 0; i < dp * pp; i++)
            grid[i] = -1;
        for (int s = 0; s < P; s++) {
            int r2 = 0;
            for (int r = 0; r < D && r2 < dp; r++) {
                int i = r * P + s;
                if (i < a->n && a->pos[i] >= 0) {
                    grid[r2 * pp + s] = a->pos[i];
                    used[i] = true;
                    r2++;
                }
            }
        }
        int k = 0;
        for (int i = 0; i < dp * pp; i++) {
            if (grid[i] >= 0)
                continue;
            while (k < a->n && (used[k] || a->pos[k] < 0))
                k++;
            if (k < a->n) {
                grid[i] = a->pos[k];
                used[k] = true;
            }
        }
        int m = 0;
        for (int i = 0; i < dp * pp; i++)
            if (grid[i] >= 0)
                tmp[a->n * 2 + m++] = grid[i];
        for (int i = 0; i < a->n; i++)
            if (!used[i] && a->pos[i] >= 0)
                tmp[a->n * 2 + m++] = a->pos[i];
        memcpy(a->pos, tmp + a->n * 2, (size_t)m * sizeof(int));
        n = m;
    } else {
        for (int i = 0; i < a->n; i++)
            if (a->pos[i] >= 0)
                a->pos[n++] = a->pos[i];
    }
    a->n = n;
}

int plan_simulate(const struct plan_cost *cost, const struct plan_trace *t, enum plan_policy p,
                  const struct plan_sim_options *o, struct plan_sim_result *ret) {
    if (!cost || !t || !o || !ret || (unsigned)p >= PLAN_POL_NKINDS || t->nintervals < 1)
        return -EINVAL;
    if ((p == PLAN_POL_PARCAE || p == PLAN_POL_PARCAE_TRUTH) &&
        (!o->decisions || o->decisions->n != t->nintervals))
        return -EINVAL;
    int r = 0, n = t->nintervals;
    struct plan_sim_result res;
    memset(&res, 0, sizeof(res));
    res.policy = p;
    res.n = n;
    int *hist = st_calloc((size_t)n + 1, sizeof(int));
    int *victims = st_calloc((size_t)t->nnames + 64, sizeof(int));
    int *tmp = st_calloc((size_t)(t->nnames + 64) * 4, sizeof(int));
    struct plan_notice *notices = st_calloc((size_t)PLAN_MAX_NOTICES, sizeof(*notices));
    struct assign asg = {st_calloc((size_t)t->nnames + 64, sizeof(int)), 0};
    res.shape = st_calloc((size_t)n, sizeof(*res.shape));
    res.cum_samples = st_calloc((size_t)n, sizeof(double));
    if (!hist || !victims || !tmp || !notices || !asg.pos || !res.shape || !res.cum_samples) {
        r = -ENOMEM;
        goto out;
    }
    struct plan_options po;
    plan_options_init(&po);
    po.lookahead = o->lookahead;
    po.predictor = o->predictor;
    po.seed = o->seed;
    po.hysteresis = o->hysteresis;
    po.tail = o->tail;
    po.defer = o->defer;
    po.defer_max = o->defer_max;
    po.count_window = o->count_window;
    po.announced = o->unannounced > 0 ? 0 : (int)floor(o->notice_s / PLAN_INTERVAL_S + 1e-9);
    struct plan_shape cur = {0, 0};
    double remain = 0, total = 0, ideal_total = 0, lost = 0, inst_minutes = 0;
    int future[PLAN_MAX_LOOKAHEAD];
    for (int i = 0; i < n; i++) {
        const struct plan_interval *iv = &t->iv[i];
        int N = plan_trace_n_after(t, i);
        hist[i] = N;
        inst_minutes += N;
        struct plan_shape best = plan_cost_best_shape(cost, N);
        ideal_total += plan_cost_throughput(cost, best.dp, best.pp) * PLAN_INTERVAL_S;
        /* Named victims: positions in the assignment. */
        int nv = 0;
        bool named = o->named_victims && t->named && iv->first_out >= 0;
        if (named) {
            for (int k = 0; k < iv->n_out; k++) {
                int pos = find_pos(&asg, t->node_ids[iv->first_out + k]);
                if (pos >= 0)
                    victims[nv++] = pos;
            }
        }
        struct plan_shape next = cur;
        switch (p) {
        case PLAN_POL_IDEAL:
        case PLAN_POL_REACTIVE:
        case PLAN_POL_CKPT_RESTART:
        case PLAN_POL_REDUNDANT:
            next = best;
            break;
        case PLAN_POL_PARCAE:
        case PLAN_POL_PARCAE_TRUTH: {
            int k = p == PLAN_POL_PARCAE ? 2 : 1;
            next = (struct plan_shape){o->decisions->shapes[i][k][0],
                                       o->decisions->shapes[i][k][1]};
            break;
        }
        case PLAN_POL_LIVEPUT:
        case PLAN_POL_LIVEPUT_ORACLE: {
            struct plan_situation s = {.cur = cur,
                                       .n_before = iv->n_before,
                                       .n_in = iv->n_in,
                                       .n_out = iv->n_out,
                                       .migrating = remain > 0,
                                       .remain_ms = remain,
                                       .hist = hist,
                                       .nhist = i + 1};
            int L = ST_MIN(po.lookahead, PLAN_MAX_LOOKAHEAD);
            if (p == PLAN_POL_LIVEPUT_ORACLE) {
                int nf = 0;
                for (int k = 1; k < L && i + k < n; k++)
                    future[nf++] = plan_trace_n_after(t, i + k);
                if (nf == 0)
                    future[nf++] = N;
                s.future = future;
                s.nfuture = nf;
            } else {
                /* Notices: removals in later intervals within notice_s, unless unannounced. */
                int nn = 0;
                for (int k = 1; k < L && i + k < n; k++) {
                    double sec = k * PLAN_INTERVAL_S;
                    if (sec > o->notice_s + 1e-9)
                        break;
                    for (int v = 0; v < t->iv[i + k].n_out && nn < PLAN_MAX_NOTICES; v++) {
                        if (coin(o->seed, i + k, v) < o->unannounced)
                            continue;
                        notices[nn++] = (struct plan_notice){-1, sec};
                    }
                }
                s.notices = notices;
                s.nnotices = nn;
            }
            struct plan_decision d;
            if ((r = plan_decide(cost, &s, &po, &d)) < 0)
                goto out;
            next = d.shape;
            break;
        }
        default:
            break;
        }
        next = clamp_shape(next, N);
        double thr = plan_cost_throughput(cost, next.dp, next.pp);
        double ms = 0, samples;
        enum plan_mig_kind kind = PLAN_KIND_NONE;
        bool changed = next.dp != cur.dp || next.pp != cur.pp;
        if (p == PLAN_POL_IDEAL) {
            samples = thr * PLAN_INTERVAL_S;
        } else if (p == PLAN_POL_CKPT_RESTART) {
            if (i == 0 || iv->n_in + iv->n_out > 0) {
                bool add = iv->n_in > 0 || i == 0;
                int b[PLAN_MAX_LAYERS + 1];
                ms = plan_cost_restart_ms(cost, next.dp, next.pp, add);
                if (i > 0)
                    ms += cost->ckpt_ms;
                if (next.pp >= 1 && plan_cost_partition(cost, next.pp, b) == 0)
                    for (int s2 = 0; s2 < next.pp; s2++)
                        ms += plan_cost_p2p_ms(cost, plan__stage_state_bytes(cost, next.pp, s2));
                kind = PLAN_KIND_RESTART;
                remain = remain > 0 ? ms + plan_cost_restart_ms(cost, next.dp, next.pp, add) : ms;
            }
            double work = ST_MAX(0.0, PLAN_INTERVAL_S - remain / 1000);
            samples = thr * work;
            remain = ST_MAX(0.0, remain - PLAN_INTERVAL_S * 1000);
        } else {
            if (p == PLAN_POL_REDUNDANT) {
                thr *= REDUNDANT_FACTOR;
                if (iv->n_out > 0 || changed) {
                    /* Survives losses that leave no two adjacent stages of one pipeline
                     * dead; otherwise restarts from a checkpoint. */
                    int nvv = nv;
                    if (!named) {
                        uint64_t st = o->seed ^ (uint64_t)i * 0x2545F4914F6CDD1DULL;
                        nvv = 0;
                        for (int k = 0; k < iv->n_out && iv->n_before > 0; k++)
                            victims[nvv++] =
                                (int)(plan__rng_next(&st) % (uint64_t)iv->n_before);
                    }
                    bool adjacent = false;
                    for (int a = 0; a < nvv && cur.pp > 1; a++)
                        for (int b2 = 0; b2 < nvv; b2++) {
                            int va = victims[a], vb = victims[b2];
                            if (va < cur.dp * cur.pp && vb < cur.dp * cur.pp &&
                                va / cur.pp == vb / cur.pp && vb % cur.pp == va % cur.pp + 1)
                                adjacent = true;
                        }
                    if (adjacent || (changed && iv->n_in > 0) || cur.dp == 0) {
                        ms = plan_cost_restart_ms(cost, next.dp, next.pp, iv->n_in > 0 || i == 0) +
                             (adjacent ? cost->ckpt_ms : 0);
                        kind = PLAN_KIND_RESTART;
                    } else {
                        ms = plan__intra_ms(cost, next.dp, next.pp);
                        kind = PLAN_KIND_INTRA;
                    }
                }
            } else if (changed || iv->n_out > 0) {
                if (named && cur.dp > 0)
                    ms = plan_cost_transition_ms(cost, iv->n_before, cur.dp, cur.pp, iv->n_in,
                                                 victims, nv, next.dp, next.pp, &kind);
                else
                    ms = plan_cost_transition_expected_ms(cost, iv->n_before, cur.dp, cur.pp,
                                                          iv->n_in, iv->n_out, next.dp,
                                                          next.pp, o->cost_samples, o->seed,
                                                          &kind);
            }
            /* Parcae restarts a migration caught by another one; a live one queues behind it. */
            if (ms > 0 && cost->measured)
                remain += ms;
            else if (ms > 0)
                remain = remain > 0 ? ms + plan_cost_restart_ms(cost, next.dp, next.pp, false)
                                    : ms;
            double work = PLAN_INTERVAL_S * 1000 - remain;
            if (work >= 0) {
                samples = thr * work / 1000;
                remain = 0;
            } else {
                samples = 0;
                remain = -work;
            }
        }
        if (kind != PLAN_KIND_NONE && ms > 0)
            res.by_kind[kind]++;
        if (changed && i > 0)
            res.reconfigurations++;
        if (thr > 0)
            lost += ST_MAX(0.0, PLAN_INTERVAL_S - samples / thr);
        else
            lost += PLAN_INTERVAL_S;
        total += samples;
        res.shape[i] = next;
        res.cum_samples[i] = total;
        /* Follow named instances into the new assignment. */
        if (o->named_victims && t->named) {
            for (int k = 0; k < nv; k++)
                asg.pos[victims[k]] = -1;
            if (iv->first_out >= 0)
                for (int k = 0; k < iv->n_out; k++) {
                    int pos = find_pos(&asg, t->node_ids[iv->first_out + k]);
                    if (pos >= 0)
                        asg.pos[pos] = -1;
                }
            if (iv->first_in >= 0)
                for (int k = 0; k < iv->n_in; k++)
                    asg.pos[asg.n++] = t->node_ids[iv->first_in + k];
            reassign(&asg, cur.dp, cur.pp, next.dp, next.pp, tmp);
        }
        cur = next;
    }
    res.committed_samples = total;
    res.ideal_fraction = ideal_total > 0 ? total / ideal_total : 0;
    res.seconds_lost = lost;
    res.dollars = inst_minutes / 60.0 * o->spot_price;
    res.samples_per_dollar = res.dollars > 0 ? total / res.dollars : 0;
    *ret = res;
    memset(&res, 0, sizeof(res));
out:
    plan_sim_result_done(&res);
    st_free(hist);
    st_free(victims);
    st_free(tmp);
    st_free(notices);
    st_free(asg.pos);
    return r;
}
