/* situation.c: the situation file of `spottrain plan` (docs/plan-format.md), JSON into a
 * struct plan_situation_file.
 *
 * The file names the model's layers, the current shape and which worker holds which (stage,
 * replica), who survived, who is new and who has a notice, and either a target shape or the
 * cost model to decide one with. Parsing is pure (the CLI reads the file and loads the profile
 * the cost names), so the same function is what `spottrain plan` runs and what the `situation`
 * fuzz target feeds. The one idea: every field is checked here, in file order, and the first
 * bad one is named in the st_error, so callers never see a half-valid situation. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "check.h"   /* TRY */
#include "common.h"  /* st_error_set, st_calloc */
#include "planner.h" /* struct plan_situation_file, plan_mig_layout_init */

#define SIT_MAX_HIST 100000 /* forecast/history entries */

/* Fills err with the field and message (no line: jansson keeps no positions for values). */
static int bad(struct st_error *err, const char *name, const char *field, const char *fmt, ...)
    ST_PRINTF(4, 5);
static int bad(struct st_error *err, const char *name, const char *field, const char *fmt, ...) {
    char msg[sizeof(err->message)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return st_error_set(err, name, 0, 0, field, "%s", msg);
}

/* What one parse carries around: the file name for errors and where to put them. */
struct ctx {
    const char *name;
    struct st_error *err;
    struct plan_situation_file *s;
};

/* A non-negative integer <= max from obj[key]; absent = *ret untouched and 0 unless required. */
static int get_uint(struct ctx *c, json_t *obj, const char *key, const char *path, bool required,
                    uint64_t max, uint64_t *ret) {
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required)
            return bad(c->err, c->name, path, "missing (an integer is required)");
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        (uint64_t)json_integer_value(v) > max)
        return bad(c->err, c->name, path, "expected an integer in 0..%llu",
                   (unsigned long long)max);
    *ret = (uint64_t)json_integer_value(v);
    return 0;
}

/* A required integer in 1..max from obj[key]. */
static int get_pos(struct ctx *c, json_t *obj, const char *key, const char *path, uint64_t max,
                   uint32_t *ret) {
    json_t *v = json_object_get(obj, key);
    if (!v)
        return bad(c->err, c->name, path, "missing (an integer in 1..%llu is required)",
                   (unsigned long long)max);
    if (!json_is_integer(v) || json_integer_value(v) < 1 || (uint64_t)json_integer_value(v) > max)
        return bad(c->err, c->name, path, "expected an integer in 1..%llu",
                   (unsigned long long)max);
    *ret = (uint32_t)json_integer_value(v);
    return 0;
}

/* {"dp", "pp", "stage_lo"?} into a layout with the model's tied extras. */
static int parse_shape(struct ctx *c, json_t *obj, const char *name,
                       struct plan_mig_layout *ret) {
    struct plan_situation_file *s = c->s;
    char path[64];
    if (!json_is_object(obj))
        return bad(c->err, c->name, name, "expected an object {\"dp\": D, \"pp\": P}");
    uint32_t dp = 0, pp = 0;
    snprintf(path, sizeof(path), "%s.dp", name);
    TRY(get_pos(c, obj, "dp", path, PLAN_MIG_MAX_POSITIONS, &dp));
    snprintf(path, sizeof(path), "%s.pp", name);
    TRY(get_pos(c, obj, "pp", path, PLAN_MIG_MAX_STAGES, &pp));
    if (pp > s->nlayers)
        return bad(c->err, c->name, path, "%u stages for %u layers", pp, s->nlayers);
    if ((uint64_t)dp * pp > PLAN_MIG_MAX_POSITIONS)
        return bad(c->err, c->name, name, "dp * pp = %llu is more than %d positions",
                   (unsigned long long)dp * pp, PLAN_MIG_MAX_POSITIONS);
    /* Zeroed so that the error path below, which shows the layout it rejected, never reads
     * an uninitialised boundary when the file gave none. */
    uint32_t lo[PLAN_MIG_MAX_STAGES + 1] = {0};
    json_t *jl = json_object_get(obj, "stage_lo");
    snprintf(path, sizeof(path), "%s.stage_lo", name);
    if (jl) {
        if (!json_is_array(jl) || json_array_size(jl) != pp + 1)
            return bad(c->err, c->name, path, "expected %u boundaries (pp + 1)", pp + 1);
        for (uint32_t i = 0; i <= pp; i++) {
            json_t *e = json_array_get(jl, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) > s->nlayers)
                return bad(c->err, c->name, path, "entry %u: expected a layer index in 0..%u", i,
                           s->nlayers);
            lo[i] = (uint32_t)json_integer_value(e);
        }
    }
    char why[200];
    struct plan_mig_layout l;
    if (plan_mig_layout_init(s->nlayers, s->np, dp, pp, jl ? lo : NULL, &l) < 0) {
        memset(&l, 0, sizeof(l));
        l.dp = dp;
        l.pp = pp;
        memcpy(l.stage_lo, lo, (pp + 1) * sizeof(uint32_t));
        why[0] = '\0';
        plan_mig_layout_check(&l, s->nlayers, why, sizeof(why));
        return bad(c->err, c->name, path, "%s", why);
    }
    for (uint32_t i = 0; i < s->ntied; i++) {
        if (s->tied[i].stage >= (int32_t)pp)
            return bad(c->err, c->name, "model.tied",
                       "entry %u: stage %d does not exist in '%s' (pp %u)", i, s->tied[i].stage,
                       name, pp);
        plan_mig_layout_add_tied(&l, s->tied[i].stage, s->tied[i].layer);
    }
    *ret = l;
    return 0;
}

static int parse_model(struct ctx *c, json_t *root) {
    struct plan_situation_file *s = c->s;
    json_t *m = json_object_get(root, "model");
    if (!json_is_object(m))
        return bad(c->err, c->name, "model",
                   "missing or not an object (give \"layer_params\" or \"gpt\")");
    json_t *lp = json_object_get(m, "layer_params"), *g = json_object_get(m, "gpt");
    if ((lp != NULL) == (g != NULL))
        return bad(c->err, c->name, "model", "give exactly one of \"layer_params\" and \"gpt\"");
    if (lp) {
        if (!json_is_array(lp) || json_array_size(lp) == 0 ||
            json_array_size(lp) > PLAN_MIG_MAX_LAYERS)
            return bad(c->err, c->name, "model.layer_params", "expected 1..%u integers",
                       PLAN_MIG_MAX_LAYERS);
        s->nlayers = (uint32_t)json_array_size(lp);
        s->np = st_calloc(s->nlayers, sizeof(uint64_t));
        if (!s->np)
            return -ENOMEM;
        for (uint32_t l = 0; l < s->nlayers; l++) {
            json_t *e = json_array_get(lp, l);
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) > (json_int_t)(1ll << 50))
                return bad(c->err, c->name, "model.layer_params",
                           "entry %u: expected an element count", l);
            s->np[l] = (uint64_t)json_integer_value(e);
        }
    } else {
        if (!json_is_object(g))
            return bad(c->err, c->name, "model.gpt",
                       "expected {layers, hidden, heads, vocab, seq_len}");
        uint32_t heads = 1;
        TRY(get_pos(c, g, "layers", "model.gpt.layers", PLAN_MIG_MAX_LAYERS - 2, &s->gpt_layers));
        TRY(get_pos(c, g, "hidden", "model.gpt.hidden", 1u << 20, &s->gpt_hidden));
        TRY(get_pos(c, g, "heads", "model.gpt.heads", 1u << 16, &heads));
        TRY(get_pos(c, g, "vocab", "model.gpt.vocab", 1u << 24, &s->gpt_vocab));
        TRY(get_pos(c, g, "seq_len", "model.gpt.seq_len", 1u << 24, &s->gpt_seq));
        if (s->gpt_hidden % heads)
            return bad(c->err, c->name, "model.gpt.heads",
                       "hidden %u is not a multiple of %u heads", s->gpt_hidden, heads);
        s->gpt = true;
        s->nlayers = s->gpt_layers + 2;
        s->np = st_calloc(s->nlayers, sizeof(uint64_t));
        if (!s->np)
            return -ENOMEM;
        plan_mig_gpt_layer_params(s->gpt_layers, s->gpt_hidden, s->gpt_vocab, s->gpt_seq, s->np);
        s->tied[0] = (struct plan_mig_tied){PLAN_MIG_STAGE_LAST, 0}; /* tied LM head */
        s->ntied = 1;
    }
    json_t *t = json_object_get(m, "tied");
    if (t) {
        if (!json_is_array(t) || json_array_size(t) > PLAN_MIG_MAX_TIED)
            return bad(c->err, c->name, "model.tied",
                       "expected a list of at most %d {stage, layer}", PLAN_MIG_MAX_TIED);
        s->ntied = 0;
        for (size_t i = 0; i < json_array_size(t); i++) {
            json_t *e = json_array_get(t, i), *st = json_object_get(e, "stage");
            int32_t stage;
            if (json_is_string(st) && strcmp(json_string_value(st), "last") == 0)
                stage = PLAN_MIG_STAGE_LAST;
            else if (json_is_string(st) && strcmp(json_string_value(st), "first") == 0)
                stage = PLAN_MIG_STAGE_FIRST;
            else if (json_is_integer(st) && json_integer_value(st) >= 0 &&
                     json_integer_value(st) < PLAN_MIG_MAX_STAGES)
                stage = (int32_t)json_integer_value(st);
            else
                return bad(c->err, c->name, "model.tied",
                           "entry %zu: stage must be \"first\", \"last\" or a stage index", i);
            uint64_t layer = 0;
            TRY(get_uint(c, e, "layer", "model.tied.layer", true, s->nlayers - 1, &layer));
            s->tied[s->ntied++] = (struct plan_mig_tied){stage, (uint32_t)layer};
        }
    }
    return 0;
}

static int find_worker(const struct plan_situation_file *s, const char *id) {
    for (uint32_t i = 0; i < s->nw; i++)
        if (strcmp(s->w[i].id, id) == 0)
            return (int)i;
    return -1;
}

static int parse_int_list(struct ctx *c, json_t *root, const char *key, int **ret, int *ret_n) {
    json_t *a = json_object_get(root, key);
    if (!a)
        return 0;
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > SIT_MAX_HIST)
        return bad(c->err, c->name, key, "expected a non-empty list of instance counts");
    int n = (int)json_array_size(a);
    int *v = st_calloc((size_t)n, sizeof(int));
    if (!v)
        return -ENOMEM;
    for (int i = 0; i < n; i++) {
        json_t *e = json_array_get(a, (size_t)i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > 65536) {
            st_free(v);
            return bad(c->err, c->name, key, "entry %d: expected an instance count in 0..65536",
                       i);
        }
        v[i] = (int)json_integer_value(e);
    }
    *ret = v;
    *ret_n = n;
    return 0;
}

/* A worker id: a non-empty string short enough for plan_mig_worker.id. */
static bool good_id(json_t *v) {
    return json_is_string(v) && *json_string_value(v) &&
           strlen(json_string_value(v)) < PLAN_MIG_ID_MAX;
}

/* Adds workers from "workers", then marks "survivors", appends "new_workers" and applies
 * "notices". */
static int parse_workers(struct ctx *c, json_t *root) {
    struct plan_situation_file *s = c->s;
    json_t *ws = json_object_get(root, "workers"), *sv = json_object_get(root, "survivors");
    json_t *nw = json_object_get(root, "new_workers"), *no = json_object_get(root, "notices");
    if (!json_is_array(ws))
        return bad(c->err, c->name, "workers", "missing or not a list of {id, stage, replica}");
    if (nw && !json_is_array(nw))
        return bad(c->err, c->name, "new_workers", "expected a list of worker ids");
    if (sv && !json_is_array(sv))
        return bad(c->err, c->name, "survivors", "expected a list of worker ids");
    if (no && !json_is_array(no))
        return bad(c->err, c->name, "notices", "expected a list of {id, seconds}");
    size_t total = json_array_size(ws) + (nw ? json_array_size(nw) : 0);
    if (total > PLAN_MIG_MAX_WORKERS)
        return bad(c->err, c->name, "workers", "%zu workers is more than %d", total,
                   PLAN_MIG_MAX_WORKERS);
    s->w = st_calloc(total ? total : 1, sizeof(*s->w));
    s->notice_s = st_calloc(total ? total : 1, sizeof(double));
    if (!s->w || !s->notice_s)
        return -ENOMEM;
    for (size_t i = 0; i < json_array_size(ws); i++) {
        json_t *e = json_array_get(ws, i), *id = json_object_get(e, "id");
        char path[64];
        snprintf(path, sizeof(path), "workers[%zu]", i);
        if (!json_is_object(e))
            return bad(c->err, c->name, path, "expected an object {id, stage, replica}");
        if (!good_id(id))
            return bad(c->err, c->name, path, "id: expected a string of 1..%d characters",
                       PLAN_MIG_ID_MAX - 1);
        if (find_worker(s, json_string_value(id)) >= 0)
            return bad(c->err, c->name, path, "id '%s' is listed twice", json_string_value(id));
        struct plan_mig_worker *w = &s->w[s->nw];
        snprintf(w->id, sizeof(w->id), "%s", json_string_value(id));
        w->alive = true;
        w->stage = w->replica = -1;
        json_t *st = json_object_get(e, "stage");
        if (st && !json_is_null(st)) { /* no stage: a spare holding nothing */
            uint64_t stage = 0, rep = 0;
            snprintf(path, sizeof(path), "workers[%zu].stage", i);
            TRY(get_uint(c, e, "stage", path, true, s->old_layout.pp - 1, &stage));
            snprintf(path, sizeof(path), "workers[%zu].replica", i);
            TRY(get_uint(c, e, "replica", path, true, s->old_layout.dp - 1, &rep));
            for (uint32_t k = 0; k < s->nw; k++)
                if (s->w[k].stage == (int32_t)stage && s->w[k].replica == (int32_t)rep)
                    return bad(c->err, c->name, path, "'%s' and '%s' both at stage %llu replica %llu",
                               s->w[k].id, w->id, (unsigned long long)stage,
                               (unsigned long long)rep);
            w->stage = (int32_t)stage;
            w->replica = (int32_t)rep;
        }
        s->notice_s[s->nw] = -1;
        s->nw++;
    }
    s->nold = s->nw;
    if (sv) {
        for (uint32_t i = 0; i < s->nw; i++)
            s->w[i].alive = false;
        for (size_t i = 0; i < json_array_size(sv); i++) {
            json_t *e = json_array_get(sv, i);
            int k = json_is_string(e) ? find_worker(s, json_string_value(e)) : -1;
            if (k < 0)
                return bad(c->err, c->name, "survivors",
                           "entry %zu: not the id of a listed worker", i);
            s->w[k].alive = true;
        }
    }
    for (size_t i = 0; nw && i < json_array_size(nw); i++) {
        json_t *e = json_array_get(nw, i);
        if (!good_id(e))
            return bad(c->err, c->name, "new_workers",
                       "entry %zu: expected an id of 1..%d characters", i, PLAN_MIG_ID_MAX - 1);
        if (find_worker(s, json_string_value(e)) >= 0)
            return bad(c->err, c->name, "new_workers", "entry %zu: id '%s' is already listed", i,
                       json_string_value(e));
        struct plan_mig_worker *w = &s->w[s->nw];
        snprintf(w->id, sizeof(w->id), "%s", json_string_value(e));
        w->stage = w->replica = -1;
        w->alive = true;
        s->notice_s[s->nw] = -1;
        s->nw++;
    }
    for (size_t i = 0; no && i < json_array_size(no); i++) {
        json_t *e = json_array_get(no, i), *id = json_object_get(e, "id");
        json_t *sec = json_object_get(e, "seconds");
        int k = json_is_string(id) ? find_worker(s, json_string_value(id)) : -1;
        if (k < 0)
            return bad(c->err, c->name, "notices", "entry %zu: id is not a listed worker", i);
        if (!s->w[k].alive)
            return bad(c->err, c->name, "notices",
                       "entry %zu: '%s' is not alive (not among the survivors)", i, s->w[k].id);
        if (sec && (!json_is_number(sec) || json_number_value(sec) < 0))
            return bad(c->err, c->name, "notices", "entry %zu: seconds must be a number >= 0", i);
        s->w[k].leaving = true;
        s->notice_s[k] = sec ? json_number_value(sec) : 0;
    }
    return 0;
}

/* "cost": {"profile": FILE, "model": NAME} or {"analytic": {micro_batch, global_batch,
 * gpu_tflops, gpu_mem_gib, net_gbps}}. Only read when there is no target, as the shape it
 * decides is the only use of it. */
static int parse_cost(struct ctx *c, json_t *cj) {
    struct plan_situation_file *s = c->s;
    if (!json_is_object(cj))
        return bad(c->err, c->name, "cost",
                   "expected {\"profile\": FILE, \"model\": NAME} or {\"analytic\": {...}}");
    json_t *prof = json_object_get(cj, "profile"), *an = json_object_get(cj, "analytic");
    if ((prof != NULL) == (an != NULL))
        return bad(c->err, c->name, "cost", "give exactly one of \"profile\" and \"analytic\"");
    if (prof) {
        if (!json_is_string(prof))
            return bad(c->err, c->name, "cost.profile", "expected a file name");
        json_t *m = json_object_get(cj, "model");
        if (m && !json_is_string(m))
            return bad(c->err, c->name, "cost.model", "expected a model name");
        s->cost_profile = st_strdup(json_string_value(prof));
        if (!s->cost_profile)
            return -ENOMEM;
        if (m) {
            s->cost_model = st_strdup(json_string_value(m));
            if (!s->cost_model)
                return -ENOMEM;
        }
        s->cost_kind = PLAN_SIT_COST_PROFILE;
        return 0;
    }
    if (!s->gpt)
        return bad(c->err, c->name, "cost.analytic",
                   "needs the model as \"gpt\" (layers, hidden, seq_len, vocab)");
    if (!json_is_object(an))
        return bad(c->err, c->name, "cost.analytic", "expected an object");
    struct plan_model_desc *d = &s->cost_analytic;
    memset(d, 0, sizeof(*d));
    d->layers = (int)s->gpt_layers;
    d->hidden = (int)s->gpt_hidden;
    d->seq = (int)s->gpt_seq;
    d->vocab = (int)s->gpt_vocab;
    uint64_t mb = 0, gb = 0;
    TRY(get_uint(c, an, "micro_batch", "cost.analytic.micro_batch", true, 1u << 20, &mb));
    TRY(get_uint(c, an, "global_batch", "cost.analytic.global_batch", true, 1u << 24, &gb));
    d->micro_batch = (int)mb;
    d->global_batch = (int)gb;
    static const char *const fk[] = {"gpu_tflops", "gpu_mem_gib", "net_gbps"};
    double *fv[] = {&d->gpu_tflops, &d->gpu_mem_gib, &d->net_gbps};
    for (int i = 0; i < 3; i++) {
        json_t *v = json_object_get(an, fk[i]);
        if (!json_is_number(v) || json_number_value(v) <= 0) {
            char path[64];
            snprintf(path, sizeof(path), "cost.analytic.%s", fk[i]);
            return bad(c->err, c->name, path, "expected a positive number");
        }
        *fv[i] = json_number_value(v);
    }
    d->max_n = (int)ST_MAX(s->nw, 1);
    s->cost_kind = PLAN_SIT_COST_ANALYTIC;
    return 0;
}

static int parse_root(struct ctx *c, json_t *root) {
    struct plan_situation_file *s = c->s;
    if (!json_is_object(root))
        return bad(c->err, c->name, "(top level)", "expected a JSON object");
    TRY(parse_model(c, root));
    TRY(parse_shape(c, json_object_get(root, "shape"), "shape", &s->old_layout));
    TRY(parse_workers(c, root));
    json_t *t = json_object_get(root, "target");
    if (t && !json_is_null(t)) {
        TRY(parse_shape(c, t, "target", &s->new_layout));
        s->have_target = true;
    }
    TRY(parse_int_list(c, root, "forecast", &s->forecast, &s->nforecast));
    TRY(parse_int_list(c, root, "history", &s->hist, &s->nhist));
    s->lookahead = 12;
    s->predictor = PLAN_PRED_DAMPED;
    json_t *o = json_object_get(root, "options");
    if (o) {
        if (!json_is_object(o))
            return bad(c->err, c->name, "options", "expected an object {lookahead, predictor}");
        uint64_t la = 12;
        TRY(get_uint(c, o, "lookahead", "options.lookahead", false, PLAN_MAX_LOOKAHEAD, &la));
        if (la == 0)
            return bad(c->err, c->name, "options.lookahead", "must be >= 1");
        s->lookahead = (int)la;
        json_t *p = json_object_get(o, "predictor");
        if (p && (!json_is_string(p) ||
                  plan_predictor_parse(json_string_value(p), &s->predictor) < 0))
            return bad(c->err, c->name, "options.predictor",
                       "expected last-value, arima or damped");
    }
    json_t *cj = json_object_get(root, "cost");
    if (!s->have_target && !cj)
        return bad(c->err, c->name, "target",
                   "absent, and no \"cost\" to decide a shape with (give one of them)");
    if (!s->have_target)
        TRY(parse_cost(c, cj));
    return 0;
}

void plan_situation_file_done(struct plan_situation_file *s) {
    if (!s)
        return;
    st_free(s->np);
    st_free(s->w);
    st_free(s->notice_s);
    st_free(s->forecast);
    st_free(s->hist);
    st_free(s->cost_profile);
    st_free(s->cost_model);
    memset(s, 0, sizeof(*s));
}

int plan_situation_parse(const char *name, const char *text, size_t len,
                         struct plan_situation_file *ret, struct st_error *err) {
    if (!name || (!text && len) || !ret)
        return -EINVAL;
    struct plan_situation_file s;
    memset(&s, 0, sizeof(s));
    struct ctx c = {name, err, &s};
    json_error_t jerr;
    json_t *root = json_loadb(text ? text : "", len, 0, &jerr);
    if (!root) {
        /* jansson reports its own allocation failures as errors too; keep them apart so a
         * caller can tell a bad file from an exhausted machine. */
        if (json_error_code(&jerr) == json_error_out_of_memory)
            return -ENOMEM;
        return st_error_set(err, name, jerr.line, jerr.column, "", "%s", jerr.text);
    }
    int r = parse_root(&c, root);
    json_decref(root);
    if (r < 0) {
        plan_situation_file_done(&s);
        return r;
    }
    *ret = s;
    return 0;
}
