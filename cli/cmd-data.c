/* cmd-data.c: `spottrain data synth|info` — make a synthetic corpus, inspect a token file.
 *
 * `synth` writes tokens from a seeded random order-k Markov source and prints its exact
 * entropy rate: the loss floor a model trained on the file can approach (common/tokens.h).
 * `info` opens a token file with the same validation the trainer uses and prints what is in
 * it, so a user can check a nanoGPT or llm.c file before pointing a job at it. */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h" /* st_tokens_*, st_synth_*, st_markov_* */

/* Strict unsigned integer in [lo, hi]; returns 0 or -EINVAL. */
static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *ret) {
    char *end = NULL;
    if (!s || !*s || *s == '-' || *s == '+')
        return -EINVAL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -EINVAL;
    *ret = v;
    return 0;
}

/* --FLAG's value as an integer in [lo, hi] into *ret; otherwise prints "--FLAG 'VALUE':
 * expected WANT" and returns -EINVAL. */
static int flag_u64(const char *flag, const char *s, uint64_t lo, uint64_t hi, const char *want,
                    uint64_t *ret) {
    if (parse_u64(s, lo, hi, ret) < 0) {
        cli_usage_error("data", "%s '%s': expected %s", flag, s, want);
        return -EINVAL;
    }
    return 0;
}

/* The cases both actions end their switch with: --help, a flag without its value (getopt's
 * ':'), an unknown flag. Returns the exit code. */
static int other_flag(int c, char **argv) {
    if (c == 'h') {
        cli_print_usage("data", stdout);
        return CLI_EXIT_OK;
    }
    if (c == ':')
        return cli_usage_error("data", "option '%s' needs a value", argv[optind - 1]);
    return cli_usage_error("data", "unknown option '%s'", argv[optind - 1]);
}

static void print_entropy(const struct st_markov_entropy *e, int order, int T) {
    printf("entropy rate: %.6f nats/token (%.6f bits/token)\n", e->rate, e->rate_bits);
    if (order > 1)
        printf("loss floor at seq_len %d: %.6f nats/token (the first %d positions see less "
               "context)\n",
               T, st_markov_floor(e, order, T), order - 1);
    else
        printf("loss floor: %.6f nats/token (mean next-token cross-entropy of the best model)\n",
               e->rate);
}

static int cmd_synth(int argc, char **argv) {
    static const struct option opts[] = {
        {"out", required_argument, NULL, 'o'},    {"vocab", required_argument, NULL, 'v'},
        {"order", required_argument, NULL, 'k'},  {"tokens", required_argument, NULL, 'n'},
        {"seed", required_argument, NULL, 's'},   {"format", required_argument, NULL, 'f'},
        {"seq-len", required_argument, NULL, 'T'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    struct st_synth_params p;
    const char *out = NULL;
    uint64_t v, T = 64;
    int c;

    st_synth_params_defaults(&p);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":o:v:k:n:s:f:T:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            out = optarg;
            break;
        case 'v':
            if (flag_u64("--vocab", optarg, 2, 65536, "an integer in 2..65536", &v) < 0)
                return CLI_EXIT_INPUT;
            p.vocab = (int)v;
            break;
        case 'k':
            if (flag_u64("--order", optarg, 1, 20, "an integer in 1..20", &v) < 0)
                return CLI_EXIT_INPUT;
            p.order = (int)v;
            break;
        case 'n':
            if (flag_u64("--tokens", optarg, 2, (1ULL << 31) - 1, "an integer in 2..2147483647",
                         &v) < 0)
                return CLI_EXIT_INPUT;
            p.ntokens = v;
            break;
        case 's':
            if (flag_u64("--seed", optarg, 0, UINT64_MAX, "a non-negative integer", &v) < 0)
                return CLI_EXIT_INPUT;
            p.seed = v;
            break;
        case 'f':
            if (st_tokens_format_parse(optarg, &p.format) < 0)
                return cli_usage_error("data", "--format '%s': expected nanogpt or llmc", optarg);
            break;
        case 'T':
            if (flag_u64("--seq-len", optarg, 1, 1 << 20, "a positive integer", &v) < 0)
                return CLI_EXIT_INPUT;
            T = v;
            break;
        default:
            return other_flag(c, argv);
        }
    }
    if (optind < argc)
        return cli_usage_error("data", "unexpected argument '%s'", argv[optind]);
    if (!out)
        return cli_usage_error("data", "synth needs --out FILE");
    uint64_t states = 1;
    for (int i = 0; i < p.order; i++) {
        states *= (uint64_t)p.vocab;
        if (states > ST_MARKOV_MAX_STATES)
            return cli_usage_error("data",
                                   "--vocab %d --order %d gives more than %u Markov states; "
                                   "lower one of them",
                                   p.vocab, p.order, ST_MARKOV_MAX_STATES);
    }

    struct st_markov_entropy e;
    int r = st_synth_write(&p, out, &e);
    if (r < 0) {
        /* A place that cannot take the file is bad input; a disk that failed under it is not. */
        fprintf(stderr, "spottrain data: cannot write '%s': %s\n", out, st_strerror(r));
        return r == -ENOSPC || r == -EIO || r == -ENOMEM ? CLI_EXIT_FAILURE : CLI_EXIT_INPUT;
    }
    printf("wrote %s: %" PRIu64 " tokens, %s format, vocab %d, order-%d Markov source, "
           "seed %" PRIu64 "\n",
           out, p.ntokens, st_tokens_format_name(p.format), p.vocab, p.order, p.seed);
    print_entropy(&e, p.order, (int)T);
    return CLI_EXIT_OK;
}

static int cmd_info(int argc, char **argv) {
    static const struct option opts[] = {{"vocab", required_argument, NULL, 'v'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    uint64_t v;
    int vocab = 0, c;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":v:h", opts, NULL)) != -1) {
        switch (c) {
        case 'v':
            if (flag_u64("--vocab", optarg, 1, 65536, "an integer in 1..65536", &v) < 0)
                return CLI_EXIT_INPUT;
            vocab = (int)v;
            break;
        default:
            return other_flag(c, argv);
        }
    }
    if (optind + 1 != argc)
        return cli_usage_error("data", "info needs exactly one token FILE");
    const char *path = argv[optind];

    struct st_tokens *t = NULL;
    struct st_error err;
    memset(&err, 0, sizeof(err));
    int r = st_tokens_open(path, vocab, &t, &err);
    if (r < 0) {
        char buf[1024];
        st_error_format(&err, buf, sizeof(buf));
        fprintf(stderr, "spottrain data: %s\n", buf);
        return r == -EINVAL ? CLI_EXIT_INPUT : CLI_EXIT_FAILURE;
    }
    uint64_t *count = st_calloc((size_t)t->max_token + 1, sizeof(uint64_t));
    if (!count) {
        st_tokens_free(t);
        (void)st_log_errno(-ENOMEM, "Out of memory reading '%s'", path);
        return CLI_EXIT_FAILURE;
    }
    for (uint64_t i = 0; i < t->ntokens; i++)
        count[t->tok[i]]++;
    uint64_t distinct = 0;
    double h = 0;
    for (uint32_t i = 0; i <= t->max_token; i++) {
        if (!count[i])
            continue;
        distinct++;
        double q = (double)count[i] / (double)t->ntokens;
        h -= q * log(q);
    }
    printf("%s: %s token file\n", path,
           t->format == ST_TOKENS_LLMC ? "llm.c (header + uint16)" : "nanoGPT (raw uint16)");
    printf("tokens: %" PRIu64 "\n", t->ntokens);
    printf("largest token: %u (vocab must be > %u)\n", t->max_token, t->max_token);
    printf("distinct tokens: %" PRIu64 "\n", distinct);
    printf("unigram entropy: %.6f nats/token (%.6f bits)\n", h, h / M_LN2);
    st_free(count);
    st_tokens_free(t);
    return CLI_EXIT_OK;
}

/* `spottrain data ACTION ...`: dispatches to synth or info (argv[1]); called from main(). */
int cli_cmd_data(int argc, char **argv) {
    if (argc < 2)
        return cli_usage_error("data", "missing action: synth or info");
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        cli_print_usage("data", stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "synth") == 0)
        return cmd_synth(argc - 1, argv + 1);
    if (strcmp(argv[1], "info") == 0)
        return cmd_info(argc - 1, argv + 1);
    return cli_usage_error("data", "unknown action '%s': expected synth or info", argv[1]);
}
