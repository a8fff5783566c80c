/* main.c: the `spottrain` entry point — global flags, then dispatch to a subcommand.
 *
 * One binary serves every role (DESIGN.md "One binary"). Exit codes: 0 ok, 2 invalid input,
 * 1 runtime failure. */
#include <getopt.h> /* optind */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "common.h"
#include "config.h"

static const struct cli_command commands[] = {
#define X(n, s, u) {#n, s, u, cli_cmd_##n},
#include "commands.def"
#undef X
};

const struct cli_command *cli_command_find(const char *name) {
    for (size_t i = 0; i < ST_ARRAY_SIZE(commands); i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

void cli_print_usage(const char *name, FILE *f) {
    const struct cli_command *c = cli_command_find(name);
    if (c)
        fprintf(f, "%s", c->usage);
}

int cli_usage_error(const char *name, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "spottrain %s: ", name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'spottrain %s --help'.\n", name);
    return CLI_EXIT_INPUT;
}

/* See cli.h. */
int cli_opt_help_or_unknown(const char *name, int c, char **argv) {
    if (c == 'h') {
        cli_print_usage(name, stdout);
        return CLI_EXIT_OK;
    }
    return cli_usage_error(name, "unknown or incomplete option '%s'", argv[optind - 1]);
}

int cli_ensure_data(const char *name, const struct st_spec *spec, bool required) {
    struct stat stt;
    if (stat(spec->data.train, &stt) == 0)
        return CLI_EXIT_OK;
    if (!spec->data.synth) {
        if (!required)
            return CLI_EXIT_OK;
        fprintf(stderr, "spottrain %s: data.train '%s' does not exist (and the spec has no "
                        "data.synth to make it)\n", name, spec->data.train);
        return CLI_EXIT_INPUT;
    }
    char dir[ST_SPEC_PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", spec->data.train);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        st_mkdir_p(dir, 0755); /* a failure shows as the write's error below */
    }
    struct st_markov_entropy ent;
    int r = st_tokens_synth_for_spec(spec, &ent);
    if (r < 0) {
        fprintf(stderr, "spottrain %s: cannot synthesize '%s': %s\n", name, spec->data.train,
                st_strerror(r));
        return r == -EINVAL ? CLI_EXIT_INPUT : CLI_EXIT_FAILURE;
    }
    fprintf(stderr, "spottrain %s: wrote synthetic corpus '%s' (%llu tokens, entropy floor "
                    "%.4f nats)\n", name, spec->data.train,
            (unsigned long long)spec->data.synth_tokens,
            st_markov_floor(&ent, spec->data.synth_order, spec->model.seq_len));
    return CLI_EXIT_OK;
}

static void print_help(FILE *f) {
    fprintf(f,
            "Usage: spottrain [--version] [--help] COMMAND [ARGS...]\n"
            "\n"
            "Keeps large-model training running on preemptible (spot) VMs: forecasts\n"
            "preemptions, picks the data x pipeline parallel shape that commits the most\n"
            "samples, and live-migrates parameters and optimizer state.\n"
            "\n"
            "Commands:\n");
    for (size_t i = 0; i < ST_ARRAY_SIZE(commands); i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(f,
            "  %-12s %s\n"
            "\n"
            "Environment: SPOTTRAIN_DEBUG=err|warn|notice|info|debug, SPOTTRAIN_DEBUG_SUBSYS=a,b,\n"
            "SPOTTRAIN_LOG_FORMAT=human|json.\n"
            "Run 'spottrain help COMMAND' for a command's options.\n",
            "help", "Show help for a command");
}

int main(int argc, char **argv) {
    st_log_init_from_env();
    st_log_set_role("cli", NULL);
    if (argc < 2) {
        print_help(stderr);
        return CLI_EXIT_INPUT;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        print_help(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("spottrain %s\n", ST_VERSION);
        return CLI_EXIT_OK;
    }
    if (strcmp(cmd, "help") == 0) {
        if (argc < 3 || strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0) {
            print_help(stdout);
            return CLI_EXIT_OK;
        }
        if (!cli_command_find(argv[2])) {
            fprintf(stderr, "spottrain: unknown command '%s'\n", argv[2]);
            return CLI_EXIT_INPUT;
        }
        cli_print_usage(argv[2], stdout);
        return CLI_EXIT_OK;
    }
    const struct cli_command *c = cli_command_find(cmd);
    if (!c) {
        fprintf(stderr, "spottrain: unknown command '%s'\nTry 'spottrain --help'.\n", cmd);
        return CLI_EXIT_INPUT;
    }
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            break;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(c->usage, stdout);
            return CLI_EXIT_OK;
        }
    }
    return c->fn(argc - 1, argv + 1);
}

int cli_cmd_version(int argc, char **argv) {
    if (argc > 1)
        return cli_usage_error("version", "unexpected argument '%s'", argv[1]);
    printf("spottrain %s\n", ST_VERSION);
    return CLI_EXIT_OK;
}
