/* cmd-ckpt.c: `spottrain ckpt info|verify|diff` — inspect, check and compare checkpoints
 * (docs/checkpoint-format.md).
 *
 * The one idea: checkpoints are unsharded and named, so two of them compare tensor by tensor
 * whatever (dp, pp) shapes wrote them. diff prints the largest relative difference per layer
 * and kind and exits 0 when every one is within --rtol (default 0: equal values), 1 otherwise,
 * 2 on bad input (a missing, torn or corrupt checkpoint, or a different model). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "common.h"
#include "migrate.h"

static const char *const cmd = "ckpt";

/* Prints a checkpoint error naming the file and the failed check. */
static void print_err(const char *what, int r, const struct st_error *err) {
    if (err->message[0])
        fprintf(stderr, "spottrain ckpt: %s: '%s': %s\n", what, err->file, err->message);
    else
        fprintf(stderr, "spottrain ckpt: %s: %s\n", what, st_strerror(r));
}

static int open_or_complain(const char *dir, struct mig_ckpt **ret) {
    struct st_error err = {0};
    int r = mig_ckpt_open(dir, ret, &err);
    if (r < 0)
        print_err("cannot open checkpoint", r, &err);
    return r;
}

static int cmd_info(const char *dir) {
    struct mig_ckpt *c;
    struct mig_ckpt_meta m;
    if (open_or_complain(dir, &c) < 0)
        return CLI_EXIT_INPUT;
    mig_ckpt_get_meta(c, &m);
    uint64_t total = 0;
    int n = mig_ckpt_nlayers(c);
    printf("checkpoint %s\n", dir);
    printf("  step %" PRIu64 ", samples committed %" PRIu64 ", optimizer step %" PRIu64 "\n",
           m.step, m.samples_committed, m.opt_step);
    printf("  data position %" PRIu64 ", data seed %" PRIu64 "\n", m.data_position, m.data_seed);
    printf("  model %s\n", m.model_json);
    printf("  extra %s\n", m.extra_json);
    printf("  layers %d\n", n);
    for (int l = 0; l < n; l++) {
        size_t nt;
        uint64_t el;
        mig_ckpt_layer_info(c, l, &nt, &el);
        printf("    layer %d: %zu tensors, %" PRIu64 " floats\n", l, nt, el);
        total += el;
    }
    printf("  total %" PRIu64 " floats (%.1f MiB), parameters %" PRIu64 "\n", total,
           (double)total * 4 / 1048576.0, total / ST_STATE_NKINDS);
    mig_ckpt_free(c);
    return CLI_EXIT_OK;
}

static int cmd_verify(const char *dir) {
    struct mig_ckpt *c;
    struct st_error err = {0};
    struct stat sb;
    /* No directory at all is bad input (2); a directory that fails a check is the finding (1).
     * For a store URL, a store that refuses us (credentials, bucket) is bad input too. */
    int r = mig_ckpt_check_root(dir);
    if (r < 0) {
        fprintf(stderr, "spottrain ckpt: cannot use '%s': %s\n", dir, st_strerror(r));
        return CLI_EXIT_INPUT;
    }
    if (!strstr(dir, "://") && (stat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode))) {
        fprintf(stderr, "spottrain ckpt: '%s' is not a directory\n", dir);
        return CLI_EXIT_INPUT;
    }
    r = mig_ckpt_open(dir, &c, &err);
    if (r < 0) {
        print_err("invalid checkpoint", r, &err);
        return CLI_EXIT_FAILURE;
    }
    r = mig_ckpt_verify(c, &err);
    if (r < 0)
        print_err("invalid checkpoint", r, &err);
    else
        printf("ok: %s: %d layers, every checksum matches\n", dir, mig_ckpt_nlayers(c));
    mig_ckpt_free(c);
    return r < 0 ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
}

/* Relative difference of two floats: 0 when equal (+0 == -0), +inf when one is NaN or they
 * differ by an infinity. */
static double rel_diff(float a, float b) {
    if (a == b || (isnan(a) && isnan(b)))
        return 0;
    double d = fabs((double)a - (double)b), m = fmax(fabs((double)a), fabs((double)b));
    double r = d / m;
    return isnan(r) ? INFINITY : r;
}

static int cmd_diff(const char *da, const char *db, double rtol) {
    struct mig_ckpt *a = NULL, *b = NULL;
    struct mig_ckpt_layer *la = NULL, *lb = NULL;
    struct mig_ckpt_meta ma, mb;
    struct st_error err = {0};
    int rc = CLI_EXIT_OK, r;
    double worst = 0;

    if (open_or_complain(da, &a) < 0 || open_or_complain(db, &b) < 0) {
        rc = CLI_EXIT_INPUT;
        goto out;
    }
    mig_ckpt_get_meta(a, &ma);
    mig_ckpt_get_meta(b, &mb);
    if (strcmp(ma.model_json, mb.model_json) != 0) {
        fprintf(stderr, "spottrain ckpt: different models:\n  %s: %s\n  %s: %s\n", da,
                ma.model_json, db, mb.model_json);
        rc = CLI_EXIT_INPUT;
        goto out;
    }
    if (mig_ckpt_nlayers(a) != mig_ckpt_nlayers(b)) {
        fprintf(stderr, "spottrain ckpt: different models: %d layers in '%s', %d in '%s'\n",
                mig_ckpt_nlayers(a), da, mig_ckpt_nlayers(b), db);
        rc = CLI_EXIT_INPUT;
        goto out;
    }
    if (ma.step != mb.step)
        fprintf(stderr, "spottrain ckpt: note: step %" PRIu64 " in '%s', %" PRIu64 " in '%s'\n",
                ma.step, da, mb.step, db);
    for (int l = 0; l < mig_ckpt_nlayers(a); l++) {
        if ((r = mig_ckpt_read_layer(a, l, &la, &err)) < 0 ||
            (r = mig_ckpt_read_layer(b, l, &lb, &err)) < 0) {
            print_err("corrupt checkpoint", r, &err);
            rc = CLI_EXIT_INPUT;
            goto out;
        }
        if (la->ntensors != lb->ntensors) {
            fprintf(stderr, "spottrain ckpt: different models: layer %d has %zu tensors in '%s', "
                    "%zu in '%s'\n", l, la->ntensors, da, lb->ntensors, db);
            rc = CLI_EXIT_INPUT;
            goto out;
        }
        double maxrel[ST_STATE_NKINDS] = {0};
        bool present[ST_STATE_NKINDS] = {0};
        for (size_t i = 0; i < la->ntensors; i++) {
            const struct mig_tensor *ta = &la->tensors[i];
            const struct mig_tensor *tb = mig_ckpt_layer_find(lb, ta->name, ta->kind);
            if (!tb || tb->count != ta->count) {
                fprintf(stderr, "spottrain ckpt: different models: layer %d tensor '%s' (%s) "
                        "%s in '%s'\n", l, ta->name, st_state_kind_name(ta->kind),
                        tb ? "has another size" : "is missing", db);
                rc = CLI_EXIT_INPUT;
                goto out;
            }
            present[ta->kind] = true;
            for (size_t e = 0; e < ta->count; e++) {
                double d = rel_diff(ta->data[e], tb->data[e]);
                if (d > maxrel[ta->kind])
                    maxrel[ta->kind] = d;
            }
        }
        for (int k = 0; k < ST_STATE_NKINDS; k++) {
            if (!present[k])
                continue;
            printf("layer %d %s max_rel %.9g\n", l, st_state_kind_name((enum st_state_kind)k),
                   maxrel[k]);
            worst = fmax(worst, maxrel[k]);
        }
        la = mig_ckpt_layer_free(la);
        lb = mig_ckpt_layer_free(lb);
    }
    rc = worst <= rtol ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
    printf("%s: max_rel %.9g, rtol %.9g\n", rc == CLI_EXIT_OK ? "equal within rtol" : "differ",
           worst, rtol);
out:
    mig_ckpt_layer_free(la);
    mig_ckpt_layer_free(lb);
    mig_ckpt_free(a);
    mig_ckpt_free(b);
    return rc;
}

/* `spottrain ckpt SUB ...`; argv[0] is "ckpt". */
int cli_cmd_ckpt(int argc, char **argv) {
    static const struct option opts[] = {
        {"rtol", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {0},
    };
    double rtol = 0;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'r': {
            char *end;
            errno = 0;
            rtol = strtod(optarg, &end);
            if (!*optarg || *end || errno || !(rtol >= 0) || isinf(rtol))
                return cli_usage_error(cmd, "bad --rtol '%s' (a number >= 0)", optarg);
            break;
        }
        default:
            return cli_opt_help_or_unknown(cmd, c, argv);
        }
    }
    int nargs = argc - optind;
    char **args = argv + optind;
    if (nargs < 1)
        return cli_usage_error(cmd, "missing subcommand (info, verify or diff)");
    const char *sub = args[0];
    if (strcmp(sub, "diff") == 0) {
        if (nargs != 3)
            return cli_usage_error(cmd, "diff takes two checkpoint directories");
        return cmd_diff(args[1], args[2], rtol);
    }
    if (strcmp(sub, "info") == 0 || strcmp(sub, "verify") == 0) {
        if (nargs != 2)
            return cli_usage_error(cmd, "%s takes one checkpoint directory", sub);
        if (rtol != 0)
            return cli_usage_error(cmd, "--rtol is only for diff");
        return sub[0] == 'i' ? cmd_info(args[1]) : cmd_verify(args[1]);
    }
    return cli_usage_error(cmd, "unknown subcommand '%s' (info, verify or diff)", sub);
}
