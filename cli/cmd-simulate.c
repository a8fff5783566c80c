/* cmd-simulate.c: `spottrain simulate` — replay a spot trace under several policies.
 *
 * Reads the trace, the cost profile and (for the parcae policies) a Parcae decisions file,
 * runs planner/'s simulator once per policy and prints a table or JSON; optionally writes
 * the per-interval shapes in Parcae's decisions format and an SVG plot. `--bench-decide N`
 * times plan_decide on synthetic situations (used by scripts/bench.d/planner).
 * `--migration-costs FILE` charges migrations with the costs scripts/bench migration measured
 * (planner/measured.c); each policy then also runs under Parcae's accounting, and both figures
 * print side by side. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "planner.h"
#include "trace-load.h" /* cli__trace_load: the same errors as predict */

#define FILE_MAX (64u << 20)

static int load(const char *cmd, const char *what, const char *path, char **ret, size_t *len) {
    int r = st_read_file(path, FILE_MAX, ret, len);
    if (r < 0) {
        fprintf(stderr, "spottrain %s: cannot read %s '%s': %s\n", cmd, what, path,
                st_strerror(r));
        return r;
    }
    return 0;
}

static void print_err(const char *cmd, const struct st_error *e) {
    char buf[1024];
    st_error_format(e, buf, sizeof(buf));
    fprintf(stderr, "spottrain %s: %s\n", cmd, buf);
}

static bool parse_double(const char *s, double lo, double hi, double *ret) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < lo || v > hi)
        return false;
    *ret = v;
    return true;
}

static int write_svg(const char *path, const struct plan_trace *t, const struct plan_sim_result *r,
                     int nr) {
    static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                         "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
    size_t cap = 1 << 20, len = 0;
    char *buf = st_malloc(cap);
    if (!buf)
        return -ENOMEM;
#define OUT(...)                                                                   \
    do {                                                                           \
        int n_ = snprintf(buf + len, cap - len, __VA_ARGS__);                      \
        if (n_ < 0 || (size_t)n_ >= cap - len) {                                   \
            char *nb_ = st_realloc(buf, cap * 2);                                  \
            if (!nb_) {                                                            \
                st_free(buf);                                                      \
                return -ENOMEM;                                                    \
            }                                                                      \
            buf = nb_;                                                             \
            cap *= 2;                                                              \
            n_ = snprintf(buf + len, cap - len, __VA_ARGS__);                      \
        }                                                                          \
        len += (size_t)n_;                                                         \
    } while (0)
    int n = t->nintervals, W = 1000, H = 300, X0 = 60;
    int nmax = 1;
    double smax = 1;
    for (int i = 0; i < n; i++)
        nmax = ST_MAX(nmax, plan_trace_n_after(t, i));
    for (int k = 0; k < nr; k++)
        smax = ST_MAX(smax, r[k].cum_samples[n - 1]);
    OUT("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
        "font-family=\"sans-serif\" font-size=\"12\">\n",
        W + 200, 2 * H + 80);
    OUT("<text x=\"%d\" y=\"15\">instances (black) and instances used by each policy's shape"
        "</text>\n",
        X0);
    OUT("<text x=\"%d\" y=\"%d\">cumulative committed samples</text>\n", X0, H + 55);
    for (int panel = 0; panel < 2; panel++) {
        int y0 = 20 + panel * (H + 40);
        OUT("<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
            "stroke=\"#ccc\"/>\n",
            X0, y0, W, H);
        if (panel == 0) {
            OUT("<text x=\"5\" y=\"%d\">%d</text>\n", y0 + 10, nmax);
            OUT("<polyline fill=\"none\" stroke=\"black\" stroke-width=\"2\" points=\"");
            for (int i = 0; i < n; i++)
                OUT("%.1f,%.1f ", X0 + (double)W * i / n,
                    y0 + H - (double)H * plan_trace_n_after(t, i) / nmax);
            OUT("\"/>\n");
        } else {
            OUT("<text x=\"5\" y=\"%d\">%.3g</text>\n", y0 + 10, smax);
        }
        for (int k = 0; k < nr; k++) {
            OUT("<polyline fill=\"none\" stroke=\"%s\" points=\"", colors[k % 8]);
            for (int i = 0; i < n; i++) {
                double v = panel == 0 ? (double)r[k].shape[i].dp * r[k].shape[i].pp / nmax
                                      : r[k].cum_samples[i] / smax;
                OUT("%.1f,%.1f ", X0 + (double)W * i / n, y0 + H - H * v);
            }
            OUT("\"/>\n");
        }
    }
    for (int k = 0; k < nr; k++)
        OUT("<text x=\"%d\" y=\"%d\" fill=\"%s\">%s</text>\n", X0 + W + 10, 40 + 18 * k,
            colors[k % 8], plan_policy_name(r[k].policy));
    OUT("<text x=\"%d\" y=\"%d\">minutes 0..%d</text>\n", X0, 2 * H + 75, n);
    OUT("</svg>\n");
#undef OUT
    int rr = st_write_file_atomic(path, buf, len);
    st_free(buf);
    return rr;
}

static int write_decisions(const char *path, const struct plan_trace *t,
                           const struct plan_sim_result *r, int nr) {
    json_t *root = json_array();
    int rr = -ENOMEM;
    if (!root)
        return -ENOMEM;
    for (int i = 0; i < t->nintervals; i++) {
        const struct plan_interval *iv = &t->iv[i];
        json_t *o = json_pack("{s:[i,i,i],s:i}", "interval", iv->n_before, iv->n_in, iv->n_out,
                              "duration", 60000);
        if (!o || json_array_append_new(root, o) < 0)
            goto out;
        for (int k = 0; k < nr; k++)
            if (json_object_set_new(o, plan_policy_name(r[k].policy),
                                    json_pack("[i,i]", r[k].shape[i].dp, r[k].shape[i].pp)) < 0)
                goto out;
    }
    char *text = json_dumps(root, JSON_COMPACT);
    if (!text)
        goto out;
    rr = st_write_file_atomic(path, text, strlen(text));
    free(text);
out:
    json_decref(root);
    return rr;
}

/* Times plan_decide on synthetic situations around n instances. */
static int bench_decide(const char *cmd, const struct plan_cost *prof, int n, int L,
                        int count_window) {
    struct plan_cost *an = NULL;
    const struct plan_cost *c = prof;
    if (!c || n > c->max_n) {
        struct plan_model_desc d = {.layers = 48, .hidden = 1600, .seq = 1024, .vocab = 50257,
                                    .micro_batch = 1, .global_batch = 4096, .gpu_tflops = 60,
                                    .gpu_mem_gib = 16, .net_gbps = 10, .max_n = n};
        int r = plan_cost_analytic(&d, &an);
        if (r < 0) {
            fprintf(stderr, "spottrain %s: analytic model failed: %s\n", cmd, st_strerror(r));
            return CLI_EXIT_FAILURE;
        }
        c = an;
    }
    int nh = 120, hist[120 + PLAN_MAX_LOOKAHEAD];
    uint64_t st = 12345;
    struct plan_options o;
    plan_options_init(&o);
    o.lookahead = L;
    o.count_window = count_window;
    int reps = n >= 1024 ? 15 : 60;
    double spent = 0, worst = 0;
    int rc = CLI_EXIT_OK;
    for (int rep = 0; rep < reps; rep++) {
        int cur = n;
        for (int i = 0; i < nh + L; i++) { /* random walk between n/2 and n */
            st = st * 6364136223846793005ULL + 1442695040888963407ULL;
            int step = (int)((st >> 33) % 5) - 2;
            cur = ST_MIN(n, ST_MAX(n / 2, cur + step));
            hist[i] = cur;
        }
        struct plan_notice nt[2] = {{0, 60}, {1, 120}};
        struct plan_shape best = plan_cost_best_shape(c, hist[nh - 2]);
        struct plan_situation s = {.cur = best, .n_before = hist[nh - 2],
                                   .n_in = ST_MAX(0, hist[nh - 1] - hist[nh - 2]),
                                   .n_out = ST_MAX(0, hist[nh - 2] - hist[nh - 1]),
                                   .hist = hist, .nhist = nh, .notices = nt,
                                   .nnotices = rep % 3 == 1 ? 2 : 0};
        if (rep % 3 == 2) { /* oracle: a path that changes every interval */
            s.future = hist + nh;
            s.nfuture = L - 1;
        }
        struct plan_decision dec;
        double a = st_now();
        int r = plan_decide(c, &s, &o, &dec);
        double dt = st_now() - a;
        spent += dt;
        worst = ST_MAX(worst, dt);
        if (r < 0) {
            fprintf(stderr, "spottrain %s: plan_decide failed: %s\n", cmd, st_strerror(r));
            rc = CLI_EXIT_FAILURE;
            break;
        }
    }
    double per = spent / reps * 1000;
    if (rc == CLI_EXIT_OK)
        printf("decide N=%d L=%d shapes=%d model=%s: %.3f ms/decision (worst %.3f ms)\n", n, L,
               c->nshapes, c->model, per, worst * 1000);
    plan_cost_free(an);
    return rc;
}

int cli_cmd_simulate(int argc, char **argv) {
    const char *cmd = "simulate";
    static const struct option opts[] = {
        {"trace", required_argument, NULL, 't'},
        {"profile", required_argument, NULL, 'p'},
        {"model", required_argument, NULL, 'm'},
        {"decisions", required_argument, NULL, 'd'},
        {"notice", required_argument, NULL, 'n'},
        {"unannounced", required_argument, NULL, 'u'},
        {"decisions-out", required_argument, NULL, 'o'},
        {"seed", required_argument, NULL, 's'},
        {"lookahead", required_argument, NULL, 'L'},
        {"plot", required_argument, NULL, 'g'},
        {"policy", required_argument, NULL, 'P'},
        {"json", no_argument, NULL, 'j'},
        {"predictor", required_argument, NULL, 'r'},
        {"victims", required_argument, NULL, 'v'},
        {"samples", required_argument, NULL, 'S'},
        {"spot-price", required_argument, NULL, 'x'},
        {"bench-decide", required_argument, NULL, 'B'},
        {"hysteresis", required_argument, NULL, 'H'},
        {"tail", required_argument, NULL, 'T'},
        {"defer", required_argument, NULL, 'D'},
        {"defer-max", required_argument, NULL, 'M'},
        {"count-window", required_argument, NULL, 'W'},
        {"migration-costs", required_argument, NULL, 'C'},
        {"link-gbps", required_argument, NULL, 'G'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    const char *trace_path = NULL, *profile_path = NULL, *model = NULL, *dec_path = NULL;
    const char *dec_out = NULL, *plot = NULL, *policies = NULL, *mc_path = NULL;
    double link_gbps = 0;
    bool json = false;
    int bench_n = 0;
    struct plan_sim_options so;
    plan_sim_options_init(&so);
    double v;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 't': trace_path = optarg; break;
        case 'p': profile_path = optarg; break;
        case 'm': model = optarg; break;
        case 'd': dec_path = optarg; break;
        case 'o': dec_out = optarg; break;
        case 'g': plot = optarg; break;
        case 'P': policies = optarg; break;
        case 'j': json = true; break;
        case 'n':
            if (!parse_double(optarg, 0, 86400, &so.notice_s))
                return cli_usage_error(cmd, "bad --notice '%s' (seconds, 0..86400)", optarg);
            break;
        case 'u':
            if (!parse_double(optarg, 0, 1, &so.unannounced))
                return cli_usage_error(cmd, "bad --unannounced '%s' (fraction 0..1)", optarg);
            break;
        case 's':
            if (!parse_double(optarg, 0, 1e18, &v) || v != floor(v))
                return cli_usage_error(cmd, "bad --seed '%s'", optarg);
            so.seed = (uint64_t)v;
            break;
        case 'L':
            if (!parse_double(optarg, 1, PLAN_MAX_LOOKAHEAD, &v) || v != floor(v))
                return cli_usage_error(cmd, "bad --lookahead '%s' (1..%d)", optarg,
                                       PLAN_MAX_LOOKAHEAD);
            so.lookahead = (int)v;
            break;
        case 'r':
            if (plan_predictor_parse(optarg, &so.predictor) < 0)
                return cli_usage_error(
                    cmd, "unknown --predictor '%s' (one of: %s)", optarg, plan_predictor_names());
            break;
        case 'v':
            if (strcmp(optarg, "named") == 0)
                so.named_victims = true;
            else if (strcmp(optarg, "expected") == 0)
                so.named_victims = false;
            else
                return cli_usage_error(cmd, "bad --victims '%s' (named or expected)", optarg);
            break;
        case 'S':
            if (!parse_double(optarg, 1, 100000, &v) || v != floor(v))
                return cli_usage_error(cmd, "bad --samples '%s' (1..100000)", optarg);
            so.cost_samples = (int)v;
            break;
        case 'x':
            if (!parse_double(optarg, 0, 1e6, &so.spot_price))
                return cli_usage_error(cmd, "bad --spot-price '%s'", optarg);
            break;
        case 'B':
            if (!parse_double(optarg, 1, 65536, &v) || v != floor(v))
                return cli_usage_error(cmd, "bad --bench-decide '%s' (1..65536)", optarg);
            bench_n = (int)v;
            break;
        case 'H':
            if (!parse_double(optarg, 0, 10, &so.hysteresis))
                return cli_usage_error(cmd, "bad --hysteresis '%s' (0..10)", optarg);
            break;
        case 'D':
            if (!parse_double(optarg, 0, 10, &so.defer))
                return cli_usage_error(cmd, "bad --defer '%s' (0..10)", optarg);
            break;
        case 'M':
            if (!parse_double(optarg, 0, 1e6, &v) || v != floor(v))
                return cli_usage_error(cmd, "bad --defer-max '%s' (intervals)", optarg);
            so.defer_max = (int)v;
            break;
        case 'W':
            if (!parse_double(optarg, 0, 1e6, &v) || v != floor(v))
                return cli_usage_error(cmd, "bad --count-window '%s' (intervals, 0 = off)",
                                       optarg);
            so.count_window = (int)v;
            break;
        case 'C': mc_path = optarg; break;
        case 'G':
            if (!parse_double(optarg, 1e-3, 1e6, &link_gbps))
                return cli_usage_error(cmd, "bad --link-gbps '%s' (Gb/s, > 0)", optarg);
            break;
        case 'T':
            if (!parse_double(optarg, 0, 1000, &so.tail))
                return cli_usage_error(cmd, "bad --tail '%s' (0..1000 intervals)", optarg);
            break;
        default:
            return cli_opt_help_or_unknown(cmd, c, argv);
        }
    }
    if (optind < argc)
        return cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    if (!bench_n && !trace_path)
        return cli_usage_error(cmd, "--trace FILE is required");
    if (!profile_path && !bench_n)
        return cli_usage_error(cmd, "--profile FILE is required");
    if (link_gbps > 0 && !mc_path)
        return cli_usage_error(cmd, "--link-gbps needs --migration-costs FILE");

    int rc = CLI_EXIT_OK, r;
    char *ptext = NULL, *dtext = NULL, *mtext = NULL;
    size_t plen = 0, dlen = 0, mlen = 0;
    struct plan_trace *t = NULL;
    struct plan_cost *cost = NULL, *parcae_cost = NULL;
    struct plan_measured_costs mc;
    struct plan_decisions *dec = NULL;
    struct plan_sim_result res[PLAN_POL_NKINDS], pres[PLAN_POL_NKINDS];
    enum plan_policy pol[PLAN_POL_NKINDS];
    int npol = 0, nres = 0;
    struct st_error err;
    memset(&err, 0, sizeof(err));
    memset(res, 0, sizeof(res));
    memset(pres, 0, sizeof(pres));
    memset(&mc, 0, sizeof(mc));

    /* policies first: a bad name is an input error before any file is read */
    if (!policies)
        policies = dec_path ? "liveput,liveput-oracle,reactive,checkpoint-restart,redundant,"
                              "parcae,parcae-truth,ideal"
                            : "liveput,liveput-oracle,reactive,checkpoint-restart,redundant,ideal";
    if (!bench_n) {
        char pbuf[512];
        snprintf(pbuf, sizeof(pbuf), "%s", policies);
        for (char *save = NULL, *tok = strtok_r(pbuf, ",", &save); tok;
             tok = strtok_r(NULL, ",", &save)) {
            enum plan_policy p;
            if (plan_policy_parse(tok, &p) < 0)
                return cli_usage_error(cmd,
                                       "unknown policy '%s' (liveput, liveput-oracle, reactive, "
                                       "checkpoint-restart, redundant, parcae, parcae-truth, "
                                       "ideal)",
                                       tok);
            bool dup = false;
            for (int k = 0; k < npol; k++)
                dup |= pol[k] == p;
            if (!dup && npol < PLAN_POL_NKINDS)
                pol[npol++] = p;
            if ((p == PLAN_POL_PARCAE || p == PLAN_POL_PARCAE_TRUTH) && !dec_path)
                return cli_usage_error(cmd, "policy '%s' needs --decisions FILE", tok);
        }
        if (npol == 0)
            return cli_usage_error(cmd, "--policy lists no policy");
    }

    if (profile_path) {
        if (load(cmd, "profile", profile_path, &ptext, &plen) < 0) {
            rc = CLI_EXIT_INPUT;
            goto out;
        }
        r = plan_cost_from_profile(profile_path, ptext, plen, model, &cost, &err);
        if (r < 0) {
            print_err(cmd, &err);
            rc = r == -ENOMEM ? CLI_EXIT_FAILURE : CLI_EXIT_INPUT;
            goto out;
        }
    }
    if (mc_path) {
        if (load(cmd, "migration costs", mc_path, &mtext, &mlen) < 0) {
            rc = CLI_EXIT_INPUT;
            goto out;
        }
        if ((r = plan_measured_costs_parse(mc_path, mtext, mlen, &mc, &err)) < 0) {
            print_err(cmd, &err);
            rc = CLI_EXIT_INPUT;
            goto out;
        }
        /* The same profile twice: one cost model charges measured costs, the other keeps
         * Parcae's so both accountings print. */
        r = plan_cost_from_profile(profile_path, ptext, plen, model, &parcae_cost, &err);
        if (r < 0 || (r = plan_cost_use_measured(cost, &mc, link_gbps)) < 0) {
            fprintf(stderr, "spottrain %s: cannot apply '%s': %s\n", cmd, mc_path,
                    st_strerror(r));
            rc = CLI_EXIT_FAILURE;
            goto out;
        }
    }
    if (bench_n) {
        rc = bench_decide(cmd, cost, bench_n, so.lookahead, so.count_window);
        goto out;
    }
    if ((rc = cli__trace_load(cmd, trace_path, &t)) != CLI_EXIT_OK)
        goto out;
    if (dec_path) {
        if (load(cmd, "decisions", dec_path, &dtext, &dlen) < 0) {
            rc = CLI_EXIT_INPUT;
            goto out;
        }
        r = plan_decisions_parse(dec_path, dtext, dlen, &dec, &err);
        if (r < 0) {
            print_err(cmd, &err);
            rc = r == -ENOMEM ? CLI_EXIT_FAILURE : CLI_EXIT_INPUT;
            goto out;
        }
        if (dec->n != t->nintervals) {
            fprintf(stderr,
                    "spottrain %s: decisions file '%s' has %d intervals, trace '%s' has %d\n",
                    cmd, dec_path, dec->n, trace_path, t->nintervals);
            rc = CLI_EXIT_INPUT;
            goto out;
        }
        so.decisions = dec;
    }
    for (int k = 0; k < npol; k++) {
        r = plan_simulate(cost, t, pol[k], &so, &res[nres]);
        if (r < 0) {
            fprintf(stderr, "spottrain %s: policy '%s' failed: %s\n", cmd,
                    plan_policy_name(pol[k]), st_strerror(r));
            rc = r == -EINVAL ? CLI_EXIT_INPUT : CLI_EXIT_FAILURE;
            goto out;
        }
        nres++;
        if (parcae_cost && (r = plan_simulate(parcae_cost, t, pol[k], &so, &pres[k])) < 0) {
            fprintf(stderr, "spottrain %s: policy '%s' failed under Parcae's costs: %s\n", cmd,
                    plan_policy_name(pol[k]), st_strerror(r));
            rc = r == -EINVAL ? CLI_EXIT_INPUT : CLI_EXIT_FAILURE;
            goto out;
        }
    }
    if (json) {
        json_t *root = json_pack("{s:[],s:s,s:i,s:f,s:f}", "policies", "model", cost->model,
                                 "intervals", t->nintervals, "notice_s", so.notice_s,
                                 "unannounced", so.unannounced);
        json_t *arr = json_object_get(root, "policies");
        for (int k = 0; k < nres; k++) {
            json_t *kinds = json_object();
            for (int kk = 1; kk < PLAN_KIND_NKINDS; kk++)
                json_object_set_new(kinds, plan_mig_kind_name((enum plan_mig_kind)kk),
                                    json_integer(res[k].by_kind[kk]));
            json_t *po = json_pack("{s:s,s:f,s:f,s:i,s:o,s:f,s:f,s:f}", "policy",
                               plan_policy_name(res[k].policy), "committed_samples",
                               res[k].committed_samples, "ideal_fraction", res[k].ideal_fraction,
                               "reconfigurations", res[k].reconfigurations,
                               "reconfigurations_by_kind", kinds, "seconds_lost",
                               res[k].seconds_lost, "dollars", res[k].dollars,
                               "samples_per_dollar", res[k].samples_per_dollar);
            if (po && parcae_cost)
                json_object_set_new(po, "parcae_accounting",
                                    json_pack("{s:f,s:f,s:i}", "committed_samples",
                                              pres[k].committed_samples, "ideal_fraction",
                                              pres[k].ideal_fraction, "reconfigurations",
                                              pres[k].reconfigurations));
            json_array_append_new(arr, po);
        }
        if (parcae_cost)
            json_object_set_new(root, "migration_costs",
                                json_pack("{s:s,s:s,s:f,s:f}", "file", mc_path, "machine",
                                          mc.machine, "measured_link_gbps", mc.link_gbps,
                                          "link_gbps", link_gbps > 0 ? link_gbps : mc.link_gbps));
        char *s = json_dumps(root, JSON_INDENT(1) | JSON_REAL_PRECISION(10));
        printf("%s\n", s ? s : "{}");
        free(s);
        json_decref(root);
    } else {
        printf("model %s, %d intervals, notice %.0f s, unannounced %.2f\n", cost->model,
               t->nintervals, so.notice_s, so.unannounced);
        if (parcae_cost)
            printf("migrations charged with '%s' (measured on '%s' at %.1f Gb/s) over %.1f Gb/s;"
                   " 'parcae' column: the same policy under Parcae's restart-based costs\n",
                   mc_path, mc.machine, mc.link_gbps, link_gbps > 0 ? link_gbps : mc.link_gbps);
        printf("%-19s %14s %7s %7s %11s %9s %11s %s %s\n", "policy", "samples", "ideal", "reconf",
               "seconds-lost", "dollars", "samples/$", parcae_cost ? "  parcae" : "",
               " migrations by kind");
        for (int k = 0; k < nres; k++) {
            printf("%-19s %14.0f %7.4f %7d %11.0f %9.2f %11.1f ", plan_policy_name(res[k].policy),
                   res[k].committed_samples, res[k].ideal_fraction, res[k].reconfigurations,
                   res[k].seconds_lost, res[k].dollars, res[k].samples_per_dollar);
            if (parcae_cost)
                printf(" %7.4f ", pres[k].ideal_fraction);
            for (int kk = 1; kk < PLAN_KIND_NKINDS; kk++)
                if (res[k].by_kind[kk])
                    printf(" %s=%d", plan_mig_kind_name((enum plan_mig_kind)kk),
                           res[k].by_kind[kk]);
            printf("\n");
        }
    }
    if (dec_out && (r = write_decisions(dec_out, t, res, nres)) < 0) {
        fprintf(stderr, "spottrain %s: cannot write '%s': %s\n", cmd, dec_out, st_strerror(r));
        rc = CLI_EXIT_FAILURE;
        goto out;
    }
    if (plot && (r = write_svg(plot, t, res, nres)) < 0) {
        fprintf(stderr, "spottrain %s: cannot write '%s': %s\n", cmd, plot, st_strerror(r));
        rc = CLI_EXIT_FAILURE;
        goto out;
    }
out:
    for (int k = 0; k < nres; k++) {
        plan_sim_result_done(&res[k]);
        plan_sim_result_done(&pres[k]);
    }
    plan_cost_free(parcae_cost);
    st_free(mtext);
    plan_decisions_free(dec);
    plan_cost_free(cost);
    plan_trace_free(t);
    st_free(ptext);
    st_free(dtext);
    return rc;
}
