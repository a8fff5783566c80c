/* cmd-plan.c: `spottrain plan SITUATION.json [--json]` — the decision and the transfer plan
 * for one situation (docs/plan-format.md).
 *
 * The situation names the model's layers, the current shape and which worker holds which
 * (stage, replica), who survived, who is new and who has a notice; planner/situation.c parses
 * it (plan_situation_parse) and this file only reads it, loads the cost profile it names and
 * prints. The target shape is taken from the file or, when absent, decided by the liveput
 * planner (plan_decide) with the cost model the file names. Then plan_migration_new turns it into transfers. Exit 0 with a plan
 * or with a checkpoint fallback (some state has no live copy), 2 on bad input naming the
 * field, 1 on a runtime failure. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "common.h"
#include "planner.h"

#define SIT_MAX_BYTES (16u << 20)

/* Prints "spottrain plan: FIELD: message" and returns CLI_EXIT_INPUT. */
static int bad(const char *field, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const char *field, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "spottrain plan: %s: ", field);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return CLI_EXIT_INPUT;
}

/* Builds the cost model the situation names (plan_situation_parse() checked its fields); a
 * profile is read relative to the situation file. */
static int load_cost(const struct plan_situation_file *s, const char *sit_path,
                     struct plan_cost **ret) {
    if (s->cost_kind == PLAN_SIT_COST_PROFILE) {
        char path[4096];
        const char *p = s->cost_profile;
        if (p[0] != '/') { /* relative to the situation file */
            char *dup = st_strdup(sit_path);
            if (!dup)
                return CLI_EXIT_FAILURE;
            snprintf(path, sizeof(path), "%s/%s", dirname(dup), p);
            st_free(dup);
        } else {
            snprintf(path, sizeof(path), "%s", p);
        }
        char *text = NULL;
        size_t len = 0;
        int r = st_read_file(path, 64u << 20, &text, &len);
        if (r < 0)
            return bad("cost.profile", "cannot read '%s': %s", path, st_strerror(r));
        struct st_error err;
        memset(&err, 0, sizeof(err));
        r = plan_cost_from_profile(path, text, len, s->cost_model, ret, &err);
        st_free(text);
        if (r < 0) {
            char buf[1024];
            st_error_format(&err, buf, sizeof(buf));
            if (r == -ENOMEM)
                return CLI_EXIT_FAILURE;
            return bad("cost.profile", "%s", buf);
        }
        return 0;
    }
    if (s->cost_kind != PLAN_SIT_COST_ANALYTIC)
        return bad("cost", "absent");
    int r = plan_cost_analytic(&s->cost_analytic, ret);
    if (r == -ENOMEM)
        return CLI_EXIT_FAILURE;
    if (r < 0)
        return bad("cost.analytic", "rejected by the analytic cost model: %s", st_strerror(r));
    return 0;
}

/* Asks the liveput planner for the shape. Noticed workers are counted as gone now: they
 * send their state during this migration but take no position in the new shape. */
static int decide(struct plan_situation_file *s, const char *sit_path, struct plan_decision *ret) {
    struct plan_cost *cost = NULL;
    int rc = load_cost(s, sit_path, &cost);
    if (rc)
        return rc;
    int n_before = (int)s->nold, n_in = (int)(s->nw - s->nold), n_out = 0;
    for (uint32_t i = 0; i < s->nw; i++)
        n_out += i < s->nold && (!s->w[i].alive || s->w[i].leaving);
    int N0 = n_before + n_in - n_out;
    int *hist = st_calloc((size_t)s->nhist + 1, sizeof(int));
    if (!hist) {
        plan_cost_free(cost);
        return CLI_EXIT_FAILURE;
    }
    int nh = 0;
    for (int i = 0; i < s->nhist; i++)
        hist[nh++] = s->hist[i];
    if (nh == 0 || hist[nh - 1] != N0)
        hist[nh++] = N0;
    struct plan_situation st;
    memset(&st, 0, sizeof(st));
    st.cur = (struct plan_shape){(int)s->old_layout.dp, (int)s->old_layout.pp};
    st.n_before = n_before;
    st.n_in = n_in;
    st.n_out = n_out;
    st.hist = hist;
    st.nhist = nh;
    st.future = s->forecast;
    st.nfuture = s->nforecast;
    struct plan_options o;
    plan_options_init(&o);
    o.lookahead = s->lookahead;
    o.predictor = s->predictor;
    struct plan_decision d;
    int r = plan_decide(cost, &st, &o, &d);
    st_free(hist);
    plan_cost_free(cost);
    if (r < 0)
        return bad("(situation)", "the liveput planner rejected it: %s", st_strerror(r));
    if (d.shape.dp < 1 || d.shape.pp < 1)
        return bad("(situation)", "no shape fits %d staying workers (%s)", N0, d.reason);
    *ret = d;
    return 0;
}

static const char *human_bytes(uint64_t b, char *buf, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    if (i == 0)
        snprintf(buf, n, "%llu B", (unsigned long long)b);
    else
        snprintf(buf, n, "%.2f %s", v, u[i]);
    return buf;
}

static json_t *layout_json(const struct plan_mig_layout *l) {
    json_t *lo = json_array();
    for (uint32_t i = 0; i <= l->pp; i++)
        json_array_append_new(lo, json_integer(l->stage_lo[i]));
    return json_pack("{s:i, s:i, s:o}", "dp", (int)l->dp, "pp", (int)l->pp, "stage_lo", lo);
}

static int print_json(const struct plan_situation_file *s, const struct plan_decision *d,
                      const struct plan_migration *p, const uint8_t *lost, int nlost,
                      const char *why) {
    json_t *root = json_object(), *dec = layout_json(&s->new_layout);
    json_object_set_new(dec, "source", json_string(d ? "liveput" : "target"));
    if (d) {
        json_object_set_new(dec, "reason", json_string(d->reason));
        json_object_set_new(dec, "kind", json_string(plan_mig_kind_name(d->kind)));
        json_object_set_new(dec, "cost_ms", json_real(d->cost_ms));
        json_t *pn = json_array();
        for (int i = 0; i < d->npred; i++)
            json_array_append_new(pn, json_integer(d->pred_n[i]));
        json_object_set_new(dec, "predicted_instances", pn);
    }
    json_object_set_new(root, "decision", dec);
    json_object_set_new(root, "current", layout_json(&s->old_layout));
    if (!p) {
        json_object_set_new(root, "migration", json_null());
        json_object_set_new(root, "fallback", json_string("checkpoint"));
        json_object_set_new(root, "message", json_string(why));
        json_t *ll = json_array();
        for (uint32_t l = 0; l < s->nlayers && lost; l++) {
            if (!lost[l])
                continue;
            json_t *k = json_array();
            for (int i = 0; i < ST_STATE_NKINDS; i++)
                if (lost[l] & (1 << i))
                    json_array_append_new(k, json_string(st_state_kind_name(i)));
            json_array_append_new(ll, json_pack("{s:i, s:o}", "layer", (int)l, "kinds", k));
        }
        json_object_set_new(root, "lost_layers", ll);
        json_object_set_new(root, "nlost", json_integer(nlost));
    } else {
        json_t *m = json_object(), *asg = json_array(), *sp = json_array(), *lv = json_array();
        json_t *xs = json_array(), *ps = json_array();
        json_object_set_new(m, "class", json_string(plan_reconf_name(p->cls)));
        json_object_set_new(m, "bytes_moved", json_integer((json_int_t)p->bytes_moved));
        json_object_set_new(m, "bytes_kept", json_integer((json_int_t)p->bytes_kept));
        json_object_set_new(m, "bytes_needed", json_integer((json_int_t)p->bytes_needed));
        json_t *bk = json_object();
        for (int k = 0; k < ST_STATE_NKINDS; k++)
            json_object_set_new(bk, st_state_kind_name(k),
                                json_integer((json_int_t)p->bytes_kind[k]));
        json_object_set_new(m, "bytes_by_kind", bk);
        for (uint32_t q = 0; q < p->npositions; q++) {
            const struct plan_mig_worker *w = &s->w[p->position_worker[q]];
            json_array_append_new(asg, json_pack("{s:s, s:i, s:i, s:b}", "id", w->id, "stage",
                                                 (int)(q / s->new_layout.dp), "replica",
                                                 (int)(q % s->new_layout.dp), "moved",
                                                 w->stage != (int32_t)(q / s->new_layout.dp) ||
                                                     w->replica !=
                                                         (int32_t)(q % s->new_layout.dp)));
        }
        for (uint32_t i = 0; i < s->nw; i++) {
            if (s->w[i].leaving)
                json_array_append_new(lv, json_string(s->w[i].id));
            else if (s->w[i].alive && p->worker_stage[i] < 0)
                json_array_append_new(sp, json_string(s->w[i].id));
        }
        for (size_t i = 0; i < p->ntransfers; i++) {
            const struct plan_mig_transfer *t = &p->transfers[i];
            json_array_append_new(
                xs, json_pack("{s:s, s:s, s:i, s:s, s:I, s:I, s:I}", "src", s->w[t->src].id,
                              "dst", s->w[t->dst].id, "layer", (int)t->layer, "kind",
                              st_state_kind_name(t->kind), "offset", (json_int_t)t->offset,
                              "count", (json_int_t)t->count, "bytes",
                              (json_int_t)(t->count * PLAN_MIG_ELEM_BYTES)));
        }
        for (size_t i = 0; i < p->npairs; i++)
            json_array_append_new(ps, json_pack("{s:s, s:s, s:I}", "src",
                                                s->w[p->pairs[i].src].id, "dst",
                                                s->w[p->pairs[i].dst].id, "bytes",
                                                (json_int_t)p->pairs[i].bytes));
        json_object_set_new(m, "assignment", asg);
        json_object_set_new(m, "spares", sp);
        json_object_set_new(m, "leaving", lv);
        json_object_set_new(m, "transfers", xs);
        json_object_set_new(m, "pairs", ps);
        json_object_set_new(root, "migration", m);
    }
    char *txt = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!txt)
        return CLI_EXIT_FAILURE;
    printf("%s\n", txt);
    free(txt);
    return CLI_EXIT_OK;
}

static void print_text(const struct plan_situation_file *s, const struct plan_decision *d,
                       const struct plan_migration *p, const uint8_t *lost, const char *why) {
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    uint32_t dead = 0, leaving = 0;
    for (uint32_t i = 0; i < s->nold; i++) {
        dead += !s->w[i].alive;
        leaving += s->w[i].leaving;
    }
    printf("situation: %u workers in a %u x %u shape (dp x pp), %u dead, %u noticed, %u new\n",
           s->nold, s->old_layout.dp, s->old_layout.pp, dead, leaving, s->nw - s->nold);
    if (d)
        printf("decision: %u x %u by the liveput planner (%s; %s, est. %.0f ms)\n",
               s->new_layout.dp, s->new_layout.pp, d->reason, plan_mig_kind_name(d->kind),
               d->cost_ms);
    else
        printf("decision: %u x %u (target given)\n", s->new_layout.dp, s->new_layout.pp);
    printf("stages:");
    for (uint32_t st = 0; st < s->new_layout.pp; st++)
        printf(" [%u,%u)", s->new_layout.stage_lo[st], s->new_layout.stage_lo[st + 1]);
    printf("\n");
    if (!p) {
        printf("migration: impossible, %s\nfallback: restore the latest checkpoint\n", why);
        printf("lost layers:");
        for (uint32_t l = 0; l < s->nlayers; l++)
            if (lost && lost[l])
                printf(" %u(%s%s%s)", l, lost[l] & 1 ? "param" : "",
                       (lost[l] & 1) && (lost[l] & 6) ? "," : "", lost[l] & 6 ? "adam" : "");
        printf("\n");
        return;
    }
    printf("migration: %s, %zu transfers between %zu pairs, moved %s (param %s, adam %s), "
           "kept in place %s of %s\n",
           plan_reconf_name(p->cls), p->ntransfers, p->npairs,
           human_bytes(p->bytes_moved, b1, sizeof(b1)),
           human_bytes(p->bytes_kind[ST_STATE_PARAM], b2, sizeof(b2)),
           human_bytes(p->bytes_kind[ST_STATE_ADAM_M] + p->bytes_kind[ST_STATE_ADAM_V], b3,
                       sizeof(b3)),
           human_bytes(p->bytes_kept, b4, sizeof(b4)),
           human_bytes(p->bytes_needed, b5, sizeof(b5)));
    printf("assignment:\n");
    for (uint32_t st = 0; st < s->new_layout.pp; st++) {
        printf("  stage %u:", st);
        for (uint32_t r = 0; r < s->new_layout.dp; r++) {
            const struct plan_mig_worker *w = &s->w[p->position_worker[st * s->new_layout.dp + r]];
            printf(" %s", w->id);
            if (w->stage < 0)
                printf("(new)");
            else if (w->stage != (int32_t)st || w->replica != (int32_t)r)
                printf("(was %d/%d)", w->stage, w->replica);
        }
        printf("\n");
    }
    for (uint32_t i = 0; i < s->nw; i++)
        if (s->w[i].leaving)
            printf("  leaving: %s\n", s->w[i].id);
        else if (s->w[i].alive && p->worker_stage[i] < 0)
            printf("  spare: %s\n", s->w[i].id);
    printf("pairs:\n");
    for (size_t i = 0; i < p->npairs; i++)
        printf("  %s -> %s  %s\n", s->w[p->pairs[i].src].id, s->w[p->pairs[i].dst].id,
               human_bytes(p->pairs[i].bytes, b1, sizeof(b1)));
    printf("transfers:\n");
    for (size_t i = 0; i < p->ntransfers; i++) {
        const struct plan_mig_transfer *t = &p->transfers[i];
        printf("  %s -> %s  layer %u %-6s [%llu, %llu)  %s\n", s->w[t->src].id, s->w[t->dst].id,
               t->layer, st_state_kind_name(t->kind), (unsigned long long)t->offset,
               (unsigned long long)(t->offset + t->count),
               human_bytes(t->count * PLAN_MIG_ELEM_BYTES, b1, sizeof(b1)));
    }
}

/* ---- --bench: planning time on synthetic fleets (scripts/bench.d/migration-plan) ---------- */

struct bench_case {
    const char *name;
    uint32_t odp, opp, ndp, npp;
    uint32_t leave_every; /* every k-th old position is noticed (0: none) */
    uint32_t nnew;        /* new workers */
};

/* Times plan_migration_new (best of `reps`) and plan_migration_validate on one case with a
 * 200-layer GPT-like model (tied embedding). Prints one table row. */
static int bench_one(const struct bench_case *bc, int reps) {
    enum { NL = 200 };
    static uint64_t np[NL];
    for (uint32_t l = 0; l < NL; l++)
        np[l] = l == 0 ? 80000000 : 30000000;
    static struct plan_mig_layout a, b;
    if (plan_mig_layout_init(NL, np, bc->odp, bc->opp, NULL, &a) < 0 ||
        plan_mig_layout_init(NL, np, bc->ndp, bc->npp, NULL, &b) < 0)
        return -EINVAL;
    plan_mig_layout_add_tied(&a, PLAN_MIG_STAGE_LAST, 0);
    plan_mig_layout_add_tied(&b, PLAN_MIG_STAGE_LAST, 0);
    uint32_t nw = bc->odp * bc->opp + bc->nnew;
    struct plan_mig_worker *w = st_calloc(nw, sizeof(*w));
    if (!w)
        return -ENOMEM;
    uint32_t k = 0;
    for (uint32_t st = 0; st < bc->opp; st++)
        for (uint32_t r = 0; r < bc->odp; r++, k++) {
            snprintf(w[k].id, sizeof(w[k].id), "w%u", k);
            w[k].stage = (int32_t)st;
            w[k].replica = (int32_t)r;
            w[k].alive = true;
            w[k].leaving = bc->leave_every && k % bc->leave_every == bc->leave_every / 2;
        }
    for (; k < nw; k++) {
        snprintf(w[k].id, sizeof(w[k].id), "n%u", k);
        w[k].stage = w[k].replica = -1;
        w[k].alive = true;
    }
    struct plan_mig_request q;
    memset(&q, 0, sizeof(q));
    q.nlayers = NL;
    q.layer_params = np;
    q.old_layout = &a;
    q.new_layout = &b;
    q.workers = w;
    q.nworkers = nw;
    double best = 1e30, vbest = 1e30, cbest = 1e30;
    struct plan_migration *p = NULL;
    char err[256] = "";
    int r = 0;
    for (int i = 0; i < reps && r >= 0; i++) {
        plan_migration_free(p);
        p = NULL;
        double t0 = st_now();
        clock_t c0 = clock();
        r = plan_migration_new(&q, &p, err, sizeof(err));
        clock_t c1 = clock();
        double t1 = st_now();
        if (r >= 0)
            r = plan_migration_validate(&q, p, err, sizeof(err));
        double t2 = st_now();
        best = ST_MIN(best, t1 - t0);
        cbest = ST_MIN(cbest, (double)(c1 - c0) / CLOCKS_PER_SEC);
        vbest = ST_MIN(vbest, t2 - t1);
    }
    if (r < 0) {
        fprintf(stderr, "spottrain plan: bench case '%s': %s\n", bc->name, err);
    } else {
        printf("%-34s %5u %-12s %9zu %10.1f %9.2f %9.2f %11.2f\n", bc->name, nw,
               plan_reconf_name(p->cls), p->ntransfers, (double)p->bytes_moved / 1e9,
               best * 1e3, cbest * 1e3, vbest * 1e3);
    }
    plan_migration_free(p);
    st_free(w);
    return r;
}

static int bench_all(void) {
    static const struct bench_case cases[] = {
        {"8x8 same, 1 noticed + 1 new", 8, 8, 8, 8, 64, 1},
        {"8x8 -> 7x8 (1 noticed)", 8, 8, 7, 8, 64, 0},
        {"16x4 -> 8x8", 16, 4, 8, 8, 0, 0},
        {"32x2 -> 21x3", 32, 2, 21, 3, 0, 0},
        {"64x1 -> 60x1 (reshard)", 64, 1, 60, 1, 16, 0},
        {"128x8 same, 20 noticed + 20 new", 128, 8, 128, 8, 50, 21},
        {"32x32 -> 31x32", 32, 32, 31, 32, 50, 0},
        {"256x4 -> 128x8", 256, 4, 128, 8, 0, 0},
        {"128x8 -> 100x10", 128, 8, 100, 10, 50, 0},
        {"1024x1 -> 1000x1 (reshard)", 1024, 1, 1000, 1, 50, 0},
    };
    printf("migration planning, 200-layer GPT-like model (tied embedding), best of 3 "
           "(wall and CPU ms)\n");
    printf("%-34s %5s %-12s %9s %10s %9s %9s %11s\n", "case", "W", "class", "transfers",
           "moved GB", "plan ms", "plan cpu", "validate ms");
    int rc = CLI_EXIT_OK;
    for (size_t i = 0; i < ST_ARRAY_SIZE(cases); i++)
        if (bench_one(&cases[i], 3) < 0)
            rc = CLI_EXIT_FAILURE;
    return rc;
}

int cli_cmd_plan(int argc, char **argv) {
    const char *cmd = "plan";
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'}, {"bench", no_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'}, {0},
    };
    bool json = false, bench = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'b': bench = true; break;
        case 'h':
            cli_print_usage(cmd, stdout);
            return CLI_EXIT_OK;
        default:
            return cli_usage_error(cmd, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (bench) {
        if (optind != argc)
            return cli_usage_error(cmd, "--bench takes no SITUATION file");
        return bench_all();
    }
    if (optind + 1 != argc)
        return cli_usage_error(cmd, optind >= argc ? "a SITUATION.json file is required"
                                                   : "only one SITUATION.json file is accepted");
    const char *path = argv[optind];
    char *text = NULL;
    size_t len = 0;
    int r = st_read_file(path, SIT_MAX_BYTES, &text, &len);
    if (r < 0) {
        fprintf(stderr, "spottrain plan: cannot read '%s': %s\n", path, st_strerror(r));
        return CLI_EXIT_INPUT;
    }
    struct plan_situation_file s;
    memset(&s, 0, sizeof(s));
    struct plan_migration *p = NULL;
    uint8_t *lost = NULL;
    struct plan_decision d;
    bool decided = false;
    struct st_error perr;
    memset(&perr, 0, sizeof(perr));
    r = plan_situation_parse(path, text, len, &s, &perr);
    st_free(text);
    if (r == -ENOMEM) {
        fprintf(stderr, "spottrain plan: out of memory\n");
        return CLI_EXIT_FAILURE;
    }
    if (r < 0) {
        if (perr.line > 0)
            fprintf(stderr, "spottrain plan: %s:%d:%d: %s\n", perr.file, perr.line, perr.column,
                    perr.message);
        else
            fprintf(stderr, "spottrain plan: %s: %s\n", perr.field, perr.message);
        return CLI_EXIT_INPUT;
    }
    int rc = CLI_EXIT_OK;
    if (!s.have_target) {
        if ((rc = decide(&s, path, &d)))
            goto out;
        decided = true;
        if (plan_mig_layout_init(s.nlayers, s.np, (uint32_t)d.shape.dp, (uint32_t)d.shape.pp,
                                 NULL, &s.new_layout) < 0) {
            rc = bad("(decision)", "the decided shape %d x %d does not fit the %u layers",
                     d.shape.dp, d.shape.pp, s.nlayers);
            goto out;
        }
        for (uint32_t i = 0; i < s.ntied; i++)
            if (s.tied[i].stage < (int32_t)s.new_layout.pp)
                plan_mig_layout_add_tied(&s.new_layout, s.tied[i].stage, s.tied[i].layer);
    }
    struct plan_mig_request q;
    memset(&q, 0, sizeof(q));
    q.nlayers = s.nlayers;
    q.layer_params = s.np;
    q.old_layout = &s.old_layout;
    q.new_layout = &s.new_layout;
    q.workers = s.w;
    q.nworkers = s.nw;
    q.validate = true;
    char err[1024] = "";
    r = plan_migration_new(&q, &p, err, sizeof(err));
    if (r == -ENODATA) {
        lost = st_calloc(s.nlayers, 1);
        if (!lost) {
            rc = CLI_EXIT_FAILURE;
            goto out;
        }
        int nlost = plan_migration_lost(&q, lost);
        if (json)
            rc = print_json(&s, decided ? &d : NULL, NULL, lost, nlost, err);
        else
            print_text(&s, decided ? &d : NULL, NULL, lost, err);
        goto out;
    }
    if (r == -ENOMEM) {
        fprintf(stderr, "spottrain plan: out of memory\n");
        rc = CLI_EXIT_FAILURE;
        goto out;
    }
    if (r < 0) {
        rc = bad(s.have_target ? "target" : "(decision)", "%s", err);
        goto out;
    }
    if (json)
        rc = print_json(&s, decided ? &d : NULL, p, NULL, 0, NULL);
    else
        print_text(&s, decided ? &d : NULL, p, NULL, NULL);
out:
    plan_migration_free(p);
    st_free(lost);
    plan_situation_file_done(&s);
    return rc;
}
