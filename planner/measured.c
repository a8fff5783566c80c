/* measured.c: migration costs measured on our own data plane instead of Parcae's restarts.
 *
 * Parcae charges every reconfiguration a process restart (rendezvous, model build, ~29-43 s);
 * ours are live, so a migration costs what the bench measured: a fixed stall per kind (the
 * hand-off, communicator rebuild, the engine's re-layout) plus the bytes that must move over
 * the link. The bytes come from the model's real layer sizes in the profile; the rate is the
 * target link's, capped by the rate our data plane sustained where it was measured (on
 * loopback: what its own copies and MACs allow), so a file measured on loopback says
 * something about a 10 Gb/s fleet. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h> /* free: what json_dumps returns */
#include <string.h>

#include "common.h"
#include "planner-internal.h"
#include "planner.h"


int plan_measured_costs_format(const struct plan_measured_costs *m, const char *source,
                               char **ret) {
    if (!m || !ret || !(m->link_gbps > 0) || !isfinite(m->link_gbps))
        return -EINVAL;
    for (int k = 0; k < PLAN_RECONF_NLIVE; k++) /* what the parser would refuse */
        if (!(m->fixed_s[k] >= 0) || !isfinite(m->fixed_s[k]) || !(m->bytes_per_s[k] > 0) ||
            !isfinite(m->bytes_per_s[k]) || !isfinite(m->raw_bytes_per_s[k]) ||
            m->samples[k] < 0)
            return -EINVAL;
    json_t *root = json_object(), *kinds = json_object();
    int r = root && kinds ? 0 : -ENOMEM;
    for (int k = 0; r == 0 && k < PLAN_RECONF_NLIVE; k++) {
        json_t *o = json_pack("{s:f, s:f, s:I}", "fixed_s", m->fixed_s[k], "bytes_per_s",
                              m->bytes_per_s[k], "samples", (json_int_t)m->samples[k]);
        if (o && m->raw_bytes_per_s[k] > 0 &&
            json_object_set_new(o, "raw_bytes_per_s", json_real(m->raw_bytes_per_s[k])) < 0) {
            json_decref(o);
            o = NULL;
        }
        if (!o || json_object_set_new(kinds, plan_reconf_name((enum plan_reconf)k), o) < 0)
            r = -ENOMEM;
    }
    if (r == 0 && (json_object_set_new(root, "machine", json_string(m->machine)) < 0 ||
                   json_object_set_new(root, "link_gbps", json_real(m->link_gbps)) < 0 ||
                   (source && json_object_set_new(root, "source", json_string(source)) < 0) ||
                   json_object_set(root, "kinds", kinds) < 0))
        r = -ENOMEM;
    char *text = r == 0 ? json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    if (r == 0 && text) {
        *ret = st_strdup(text); /* st_free, as the rest of the tree frees */
        r = *ret ? 0 : -ENOMEM;
    } else if (r == 0) {
        r = -ENOMEM; /* json_dumps fails only for memory: the values are finite numbers */
    }
    free(text);
    json_decref(kinds);
    json_decref(root);
    return r;
}

/* Adam's two moments, the part of a stage's state ZeRO-1 shards across its replicas. */
#define OPT_BYTES_PER_PARAM 8.0

static bool positive(json_t *v, double *ret) {
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) <= 0)
        return false;
    *ret = json_number_value(v);
    return true;
}

int plan_measured_costs_parse(const char *name, const char *text, size_t len,
                              struct plan_measured_costs *ret, struct st_error *err) {
    struct plan_measured_costs m;
    json_error_t je;
    int r = 0;
    if (!name || !text || !ret)
        return -EINVAL;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root)
        return st_error_set(err, name, je.line, je.column, "json", "%s", je.text);
    memset(&m, 0, sizeof(m));
    if (!json_is_object(root)) {
        r = st_error_set(err, name, 0, 0, "", "a cost file is a JSON object");
        goto out;
    }
    json_t *mach = json_object_get(root, "machine");
    if (mach && !json_is_string(mach)) {
        r = st_error_set(err, name, 0, 0, "machine", "must be a string");
        goto out;
    }
    snprintf(m.machine, sizeof(m.machine), "%s", mach ? json_string_value(mach) : "");
    if (!positive(json_object_get(root, "link_gbps"), &m.link_gbps)) {
        r = st_error_set(err, name, 0, 0, "link_gbps",
                         "missing or not a positive number (Gb/s of the measured link)");
        goto out;
    }
    json_t *kinds = json_object_get(root, "kinds");
    if (!json_is_object(kinds)) {
        r = st_error_set(err, name, 0, 0, "kinds",
                         "missing \"kinds\" object (intra-stage, inter-stage, pipeline, "
                         "dp-resharding)");
        goto out;
    }
    for (int k = 0; k < PLAN_RECONF_NLIVE; k++) {
        const char *kn = plan_reconf_name((enum plan_reconf)k);
        char field[64];
        json_t *o = json_object_get(kinds, kn);
        if (!json_is_object(o)) {
            snprintf(field, sizeof(field), "kinds.%s", kn);
            r = st_error_set(err, name, 0, 0, field, "missing (an object with fixed_s and "
                                                     "bytes_per_s)");
            goto out;
        }
        json_t *f = json_object_get(o, "fixed_s");
        if (!json_is_number(f) || !isfinite(json_number_value(f)) || json_number_value(f) < 0) {
            snprintf(field, sizeof(field), "kinds.%s.fixed_s", kn);
            r = st_error_set(err, name, 0, 0, field, "missing or not a number >= 0 (seconds)");
            goto out;
        }
        m.fixed_s[k] = json_number_value(f);
        if (!positive(json_object_get(o, "bytes_per_s"), &m.bytes_per_s[k])) {
            snprintf(field, sizeof(field), "kinds.%s.bytes_per_s", kn);
            r = st_error_set(err, name, 0, 0, field, "missing or not a positive number");
            goto out;
        }
        json_t *n = json_object_get(o, "samples");
        if (n && (!json_is_integer(n) || json_integer_value(n) < 0 ||
                  json_integer_value(n) > INT32_MAX)) {
            snprintf(field, sizeof(field), "kinds.%s.samples", kn);
            r = st_error_set(err, name, 0, 0, field, "not an integer >= 0 (the migrations "
                                                     "fixed_s was measured on)");
            goto out;
        }
        m.samples[k] = n ? (int)json_integer_value(n) : 1;
        json_t *raw = json_object_get(o, "raw_bytes_per_s");
        if (raw && !positive(raw, &m.raw_bytes_per_s[k])) {
            snprintf(field, sizeof(field), "kinds.%s.raw_bytes_per_s", kn);
            r = st_error_set(err, name, 0, 0, field, "not a positive number");
            goto out;
        }
    }
    *ret = m;
out:
    json_decref(root);
    return r;
}

int plan_cost_use_measured(struct plan_cost *c, const struct plan_measured_costs *m,
                           double link_gbps) {
    if (!c || !m || !(m->link_gbps > 0) || !isfinite(link_gbps))
        return -EINVAL;
    for (int k = 0; k < PLAN_RECONF_NLIVE; k++) {
        if (!(m->bytes_per_s[k] > 0) || !(m->fixed_s[k] >= 0) || !isfinite(m->fixed_s[k]))
            return -EINVAL;
        /* On loopback the wire is a CPU copy, so bytes_per_s is the rate the data plane's own
         * CPU work (copies, MAC) allows, and raw TCP there is the kernel's. On a link of its
         * own the wire drains the socket buffer while that work runs, so bytes cross at the
         * link's rate or the data plane's, whichever is lower: bytes over the link, capped by
         * what the transport was measured to sustain. Without --link-gbps the file's own
         * measurement stands. */
        double bps = m->bytes_per_s[k];
        if (link_gbps > 0)
            bps = ST_MIN(link_gbps * 1e9 / 8, bps);
        c->meas_fixed_ms[k] = m->fixed_s[k] * 1000;
        c->meas_bytes_per_ms[k] = bps / 1000;
    }
    c->measured = true;
    return 0;
}

/* What a migration's transfers add to its stall, ms: weights of `params` parameters and
 * optimizer moments of `moment_params` at kind k's rate, plus `reshard` ms of re-cut moments.
 * The state moves after the boundary while the new shape's first step runs
 * (docs/live-migration.md, "State after the boundary"; into a pipeline on a channel of its
 * own): a forward pass waits for each layer's weights, the update for the moments. So the step
 * waits for the weights, charged whole (a bound: the forward computes the first layers while
 * later ones arrive), and for what of the moments outlasts the step. Not modelled: the step's
 * own pipeline messages share the link meanwhile. At the boundary, all of it stalls. */
static double moved_ms(const struct plan_cost *c, enum plan_reconf k, int dp, int pp,
                       double params, double moment_params, double reshard) {
    double weights = params * (c->state_bytes_per_param - OPT_BYTES_PER_PARAM);
    double w_ms = weights / c->meas_bytes_per_ms[k];
    double m_ms = moment_params * OPT_BYTES_PER_PARAM / c->meas_bytes_per_ms[k] + reshard;
    double thr = plan_cost_throughput(c, dp, pp);
    double step_ms = thr > 0 ? 1000.0 * c->global_batch / thr : 0;
    return plan__after_boundary(c->meas_at_boundary, w_ms, m_ms, step_ms);
}

double plan__after_boundary(bool at_boundary, double weights, double moments, double step) {
    return weights + (at_boundary ? moments : ST_MAX(0.0, moments - step));
}

/* A dp change re-cuts every stage's ZeRO-1 optimizer shards: each replica receives at most
 * its new shard of the largest stage; the transfer's ms (the kind's fixed part apart). */
static double reshard_ms(const struct plan_cost *c, int D, int dp, int pp) {
    if (dp == D || dp < 1)
        return 0;
    double bytes = c->maxpart_params[pp] * OPT_BYTES_PER_PARAM / dp;
    return bytes / c->meas_bytes_per_ms[PLAN_RECONF_DP_RESHARDING];
}

static double reshard_fixed_ms(const struct plan_cost *c, int D, int dp) {
    return dp == D || dp < 1 ? 0 : c->meas_fixed_ms[PLAN_RECONF_DP_RESHARDING];
}

double plan__measured_intra_ms(const struct plan_cost *c, int D, int dp, int pp) {
    return c->meas_fixed_ms[PLAN_RECONF_INTRA_STAGE] + reshard_fixed_ms(c, D, dp) +
           moved_ms(c, PLAN_RECONF_INTRA_STAGE, dp, pp, 0, 0, reshard_ms(c, D, dp, pp));
}

double plan__measured_inter_ms(const struct plan_cost *c, int D, int dp, int pp,
                               double stage_params) {
    return c->meas_fixed_ms[PLAN_RECONF_INTER_STAGE] + reshard_fixed_ms(c, D, dp) +
           moved_ms(c, PLAN_RECONF_INTER_STAGE, dp, pp, stage_params, stage_params,
                    reshard_ms(c, D, dp, pp));
}

/* Each new stage fetches the layers its best surviving old stage lacks; receivers work in
 * parallel (each node has its own link), so the largest fetch sets the time, and with dp > 1
 * the other replicas of the largest new stage are filled the same way after it. */
double plan__measured_repartition_ms(const struct plan_cost *c, int D, int P, const char *dead,
                                     int dp, int pp) {
    int ob[PLAN_MAX_LAYERS + 1], nb[PLAN_MAX_LAYERS + 1];
    double need = 0;
    if (plan_cost_partition(c, pp, nb) < 0)
        return INFINITY;
    if (D > 0 && P > 0 && plan_cost_partition(c, P, ob) == 0) {
        for (int s = 0; s < pp; s++) {
            double full = c->prefix[nb[s + 1]] - c->prefix[nb[s]], best = full;
            for (int o = 0; o < P; o++) {
                bool alive = false;
                for (int r = 0; r < D && !alive; r++)
                    alive = !dead || !dead[r * P + o];
                if (!alive)
                    continue;
                int lo = ST_MAX(ob[o], nb[s]), hi = ST_MIN(ob[o + 1], nb[s + 1]);
                double have = hi > lo ? c->prefix[hi] - c->prefix[lo] : 0;
                best = ST_MIN(best, full - have);
            }
            need = ST_MAX(need, best);
        }
    } else {
        need = c->maxpart_params[pp];
    }
    if (dp > 1)
        need += c->maxpart_params[pp];
    return c->meas_fixed_ms[PLAN_RECONF_PIPELINE] +
           moved_ms(c, PLAN_RECONF_PIPELINE, dp, pp, need, need, 0);
}
