/* cmd-k8s.c: `spottrain k8s render JOB.yaml [--image IMAGE] [--namespace NS]
 * [--token-secret NAME]` — the Kubernetes manifests of a job on stdout.
 *
 * Parsing flags and printing only: the objects come from cloud_k8s_render(), which also
 * builds the worker pods the kubernetes provider creates, so both agree on names. The spec is
 * validated first (the same loader as every command), so a bad spec gives its file:line
 * errors and never a half-written manifest: nothing reaches stdout before it all rendered. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cloud.h"  /* cloud_k8s_render */
#include "common.h" /* st_spec, st_read_file */

#define K8S_SPEC_MAX (1024 * 1024) /* the spec loader's own limit */

/* A DNS label (namespace and Secret names are at most that strict). */
static bool valid_dns_label(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 63 || s[0] == '-' || s[n - 1] == '-')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return false;
    return true;
}

static int k8s_render(int argc, char **argv) {
    static const struct option opts[] = {
        {"image", required_argument, NULL, 'i'},
        {"namespace", required_argument, NULL, 'n'},
        {"token-secret", required_argument, NULL, 't'},
        {"state-size", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *image = NULL, *ns = NULL, *token_secret = NULL, *state_size = NULL;
    int ch, ret = CLI_EXIT_OK;
    struct st_spec *spec = NULL;
    char *text = NULL, *yaml = NULL;

    optind = 1;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'i':
            image = optarg;
            break;
        case 'n':
            ns = optarg;
            break;
        case 't':
            token_secret = optarg;
            break;
        case 's':
            state_size = optarg;
            break;
        case 'h':
            cli_print_usage("k8s", stdout);
            return CLI_EXIT_OK;
        default:
            return cli_usage_error("k8s", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return cli_usage_error("k8s", "missing JOB.yaml");
    if (optind + 1 < argc)
        return cli_usage_error("k8s", "unexpected argument '%s'", argv[optind + 1]);
    if (ns && !valid_dns_label(ns))
        return cli_usage_error("k8s", "invalid --namespace '%s' (lower-case letters, digits "
                                      "and '-', at most 63)", ns);
    if (token_secret && !valid_dns_label(token_secret))
        return cli_usage_error("k8s", "invalid --token-secret '%s' (lower-case letters, digits "
                                      "and '-', at most 63)", token_secret);
    const char *path = argv[optind];

    spec = st_malloc(sizeof(*spec));
    if (!spec) {
        fprintf(stderr, "spottrain k8s: %s\n", st_strerror(-ENOMEM));
        return CLI_EXIT_FAILURE;
    }
    ret = cli_spec_load("k8s", path, spec);
    if (ret != CLI_EXIT_OK)
        goto out;
    if (spec->fleet.provider != ST_PROVIDER_KUBERNETES) {
        fprintf(stderr, "%s: spec.fleet.provider: is '%s'; a Kubernetes deployment needs "
                        "'kubernetes'\n", path, st_provider_name(spec->fleet.provider));
        ret = CLI_EXIT_INPUT;
        goto out;
    }
    if (!image || !image[0])
        image = spec->fleet.image;
    if (!image[0]) {
        fprintf(stderr, "%s: spec.fleet.image: missing; give the image there or with "
                        "--image IMAGE\n", path);
        ret = CLI_EXIT_INPUT;
        goto out;
    }
    size_t len;
    int r = st_read_file(path, K8S_SPEC_MAX, &text, &len);
    if (r < 0) {
        fprintf(stderr, "spottrain k8s: cannot read '%s': %s\n", path, st_strerror(r));
        ret = CLI_EXIT_INPUT;
        goto out;
    }
    struct cloud_render_opts o = {
        .spec = spec,
        .spec_text = text,
        .image = image,
        .ns = ns,
        .token_secret = token_secret,
        .state_size = state_size,
    };
    r = cloud_k8s_render(&o, &yaml);
    if (r < 0) {
        fprintf(stderr, "spottrain k8s: cannot render the manifests: %s\n", st_strerror(r));
        ret = CLI_EXIT_FAILURE;
        goto out;
    }
    if (fputs(yaml, stdout) == EOF || fflush(stdout) != 0) {
        fprintf(stderr, "spottrain k8s: cannot write to stdout: %s\n", st_strerror(-errno));
        ret = CLI_EXIT_FAILURE;
    }
out:
    st_free(yaml);
    st_free(text);
    st_free(spec);
    return ret;
}

int cli_cmd_k8s(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        cli_print_usage("k8s", stdout);
        return CLI_EXIT_OK;
    }
    if (argc < 2)
        return cli_usage_error("k8s", "missing action (render)");
    if (!strcmp(argv[1], "render"))
        return k8s_render(argc - 1, argv + 1);
    return cli_usage_error("k8s", "unknown action '%s' (expected render)", argv[1]);
}
