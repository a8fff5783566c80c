/* test-spec.c: the job-spec parser — valid specs resolve with their defaults, and every kind
 * of bad input gets the exact message at the exact line:column.
 *
 * Invalid inputs are one table of inline YAML documents (parsed with st_spec_parse under a
 * name inside tests/unit/common/specs/, so relative paths find the fixture files there);
 * I/O errors use fixture files; the OOM test fails every allocation in turn (curl torture);
 * the last test runs the built `spottrain validate` for its exit codes and output. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "spec-internal.h" /* spec__edit_distance */
#include "test.h"

#define MAX_ERRS 64

static char specs_dir[1024];   /* tests/unit/common/specs */
static char inline_name[1100]; /* specs/inline.yaml: a name only, never read */

static int setup(void) {
    const char *src = getenv("SPOTTRAIN_SRCDIR");
    if (!src)
        src = ".";
    snprintf(specs_dir, sizeof(specs_dir), "%s/tests/unit/common/specs", src);
    snprintf(inline_name, sizeof(inline_name), "%s/inline.yaml", specs_dir);
    return 0;
}

/* The shared head and body of the inline specs; cases append or swap one section.
 * Lines: 1 apiVersion .. 5 spec:, 6 model, 7 data, 8 training, 9 fleet, 10+ the case. */
#define HEAD "apiVersion: spottrain/v1\nkind: TrainingJob\nmetadata:\n  name: t\nspec:\n"
#define MODEL "  model: {layers: 2, hidden: 8, heads: 2, vocab: 16, seq_len: 8}\n"
#define DATA "  data: {train: tokens.bin}\n"
#define TRAIN "  training: {global_batch: 8, micro_batch: 2, steps: 10}\n"
#define FLEET "  fleet: {max: 4, trace: trace.csv}\n"
#define BASE HEAD MODEL DATA TRAIN FLEET

struct bad_case {
    const char *yaml;
    size_t nerrs;       /* total errors expected */
    int line, column;   /* of the first error */
    const char *field;
    const char *message;
};

static const struct bad_case bad_cases[] = {
    /* unknown keys, with and without a suggestion */
    {HEAD MODEL DATA FLEET "  training:\n    global_batch: 8\n    micro_bach: 2\n    steps: 10\n",
     1, 11, 5, "spec.training", "unknown key 'micro_bach' (did you mean 'micro_batch'?)"},
    {BASE "  bogus: 1\n", 1, 10, 3, "spec", "unknown key 'bogus'"},
    {BASE "  planner: {lokahead: 3}\n", 1, 10, 13, "spec.planner",
     "unknown key 'lokahead' (did you mean 'lookahead'?)"},
    {BASE "specs: {}\n", 1, 10, 1, "", "unknown key 'specs' (did you mean 'spec'?)"},
    /* types */
    {HEAD MODEL DATA FLEET "  training: {global_batch: 8, steps: abc}\n", 1, 9, 38,
     "spec.training.steps", "expected an integer, found 'abc'"},
    {HEAD MODEL DATA FLEET "  training: {global_batch: 8, steps: 1.5}\n", 1, 9, 38,
     "spec.training.steps", "expected an integer, found '1.5'"},
    {HEAD MODEL DATA FLEET "  training: {global_batch: 8, steps: }\n", 1, 9, 38,
     "spec.training.steps", "expected an integer, found an empty value"},
    {HEAD MODEL DATA FLEET "  training: {global_batch: 8, steps: [1]}\n", 1, 9, 38,
     "spec.training.steps", "expected an integer, found a list"},
    {BASE "  planner: {lookahead: 0}\n", 1, 10, 24, "spec.planner.lookahead",
     "must be between 1 and 1000, found 0"},
    {BASE "  planner: {learn: maybe}\n", 1, 10, 20, "spec.planner.learn",
     "expected true or false, found 'maybe'"},
    {BASE "  fleet2: 1\n  planner: {interval: soon}\n", 2, 10, 3, "spec",
     "unknown key 'fleet2' (did you mean 'fleet'?)"},
    {BASE "  planner: {interval: soon}\n", 1, 10, 23, "spec.planner.interval",
     "expected a duration like '60s', '30m' or '2h', found 'soon'"},
    {BASE "  planner: {interval: 0s}\n", 1, 10, 23, "spec.planner.interval",
     "must be in (0, 86400], found 0 s"},
    {BASE "  coordinator: {heartbeat_deadline: 2h}\n", 1, 10, 37,
     "spec.coordinator.heartbeat_deadline", "must be in (0, 3600], found 7200 s"},
    {BASE "  coordinator: {reconfig_timeout: 0s}\n", 1, 10, 35,
     "spec.coordinator.reconfig_timeout", "must be in (0, 3600], found 0 s"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, trace: trace.csv, spot: yes}\n", 1, 9, 43,
     "spec.fleet.spot", "expected true or false, found 'yes'"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, trace: trace.csv, data_plane: {tls: on}}\n", 1, 9,
     55, "spec.fleet.data_plane.tls", "expected true or false, found 'on'"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, trace: trace.csv, data_plane: {tsl: true}}\n", 1, 9,
     50, "spec.fleet.data_plane", "unknown key 'tsl' (did you mean 'tls'?)"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, trace: trace.csv, unannounced: 1.5}\n", 1, 9, 50,
     "spec.fleet.unannounced", "must be in [0, 1], found 1.5"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, trace: trace.csv, gpu_memory: lots}\n", 1, 9, 49,
     "spec.fleet.gpu_memory", "expected a size like '16GiB' or '512MiB', found 'lots'"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, trace: trace.csv, time_scale: fast}\n", 1, 9, 49,
     "spec.fleet.time_scale", "expected a number, found 'fast'"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, trace: trace.csv, zones: us-east-1a}\n", 1, 9, 44,
     "spec.fleet.zones", "expected a list of zones, found 'us-east-1a'"},
    {BASE "  planner: 5\n", 1, 10, 12, "spec.planner", "expected a mapping, found '5'"},
    /* bounds */
    {HEAD "  model: {layers: 2, hidden: 8, heads: 2, vocab: 70000, seq_len: 8}\n" DATA TRAIN FLEET,
     1, 6, 50, "spec.model.vocab",
     "must be between 2 and 65536 (tokens are uint16), found 70000"},
    {HEAD MODEL DATA FLEET "  training:\n    global_batch: 8\n    steps: 10\n    optimizer:\n"
     "      beta1: 1\n",
     1, 13, 14, "spec.training.optimizer.beta1", "must be in [0, 1), found 1"},
    {HEAD MODEL DATA FLEET "  training:\n    global_batch: 8\n    steps: 10\n    optimizer:\n"
     "      lr: 0\n",
     1, 13, 11, "spec.training.optimizer.lr", "must be in (0, 10], found 0"},
    {HEAD MODEL DATA FLEET "  training: {global_batch: 8, micro_batch: 0, steps: 10}\n", 1, 9,
     44, "spec.training.micro_batch", "must be between 1 and 16777216, found 0"},
    {BASE "  planner: {dp: 0}\n", 1, 10, 17, "spec.planner.dp",
     "must be between 1 and 4096, found 0"},
    {BASE "  planner: {dp: {min: x}}\n", 1, 10, 23, "spec.planner.dp.min",
     "expected an integer, found 'x'"},
    {HEAD MODEL DATA FLEET "  training: {global_batch: 8, steps: 10, seed: 18446744073709551615}\n",
     1, 9, 48, "spec.training.seed",
     "must be at most 9223372036854775807, found 18446744073709551615"},
    {HEAD MODEL DATA FLEET "  training: {global_batch: 8, steps: 10, seed: -1}\n", 1, 9, 48,
     "spec.training.seed", "expected a non-negative integer, found '-1'"},
    /* enums */
    {HEAD MODEL DATA FLEET "  training: {global_batch: 8, steps: 10, precision: bf17}\n", 1, 9,
     53, "spec.training.precision", "invalid value 'bf17' (expected one of: fp32, bf16)"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, trace: trace.csv, provider: aws2}\n", 1, 9, 47,
     "spec.fleet.provider", "invalid value 'aws2' (expected one of: sim, aws, gcp, azure, kubernetes)"},
    {BASE "  planner: {predictor: arma}\n", 1, 10, 24, "spec.planner.predictor",
     "invalid value 'arma' (expected one of: last-value, arima, damped, notice)"},
    {HEAD MODEL DATA FLEET "  training: {global_batch: 8, steps: 10, optimizer: {schedule: step}}\n",
     1, 9, 64, "spec.training.optimizer.schedule",
     "invalid value 'step' (expected one of: cosine, constant, linear)"},
    {HEAD MODEL TRAIN FLEET "  data: {train: x.bin, synth: {kind: zipf}}\n", 1, 9, 38,
     "spec.data.synth.kind", "invalid value 'zipf' (expected one of: markov)"},
    /* strings */
    {BASE "  status: {listen: \"127.0.0.1:70000\"}\n", 1, 10, 20, "spec.status.listen",
     "expected HOST:PORT with a port from 0 to 65535, found '127.0.0.1:70000'"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, trace: trace.csv, instance_type: "
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa}\n",
     1, 9, 52, "spec.fleet.instance_type", "too long (68 characters; at most 63)"},
    {"apiVersion: spottrain/v1\nkind: TrainingJob\nmetadata:\n  name: My_Job\nspec:\n" MODEL DATA
     TRAIN FLEET,
     1, 4, 9, "metadata.name",
     "invalid name 'My_Job' (lower-case letters, digits and '-', at most 63, starting and "
     "ending with a letter or digit)"},
    {"apiVersion: spottrain/v2\nkind: TrainingJob\nmetadata:\n  name: t\nspec:\n" MODEL DATA TRAIN
     FLEET,
     1, 1, 13, "apiVersion", "unsupported apiVersion 'spottrain/v2' (expected 'spottrain/v1')"},
    {"apiVersion: spottrain/v1\nkind: Job\nmetadata:\n  name: t\nspec:\n" MODEL DATA TRAIN FLEET,
     1, 2, 7, "kind", "unsupported kind 'Job' (expected 'TrainingJob')"},
    /* missing keys */
    {HEAD MODEL DATA FLEET "  training:\n    global_batch: 8\n", 1, 10, 5, "spec.training",
     "missing required key 'steps'"},
    {"apiVersion: spottrain/v1\nkind: TrainingJob\nmetadata:\n  name: t\n", 1, 1, 1, "",
     "missing required key 'spec'"},
    {HEAD "  model: {layers: 2, hidden: 8, heads: 2, vocab: 16}\n" DATA TRAIN FLEET, 1, 6, 10,
     "spec.model",
     "missing required key 'seq_len' (the built-in GPT needs it unless 'profile' is set)"},
    {HEAD MODEL TRAIN FLEET, 1, 6, 3, "spec",
     "missing required key 'data' (training the built-in GPT needs token files)"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4}\n", 1, 9, 10, "spec.fleet",
     "missing required key 'trace' (the sim provider replays a trace)"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, provider: gcp, project: p}\n", 1, 9, 10,
     "spec.fleet", "missing required key 'instance_type' (needed by cloud providers)"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, provider: gcp, instance_type: n1}\n", 1, 9, 10,
     "spec.fleet", "missing required key 'project' (the GCP project)"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, provider: gcp, instance_type: n1, project: ''}\n",
     1, 9, 62, "spec.fleet.project", "must not be empty: the GCP project"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, provider: azure, instance_type: D2}\n", 4, 9, 10,
     "spec.fleet", "missing required key 'subscription' (the Azure subscription id)"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, provider: azure, instance_type: D2, "
     "subscription: s, resource_group: g, location: l}\n", 1, 9, 10, "spec.fleet",
     "missing required key 'azure.subnet' (the subnet resource id the VMs' network interfaces "
     "join)"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, provider: azure, instance_type: D2, "
     "subscription: s, resource_group: g, location: l, azure: {subnet: /x, zone: 1}}\n", 1, 9,
     124, "spec.fleet.azure", "unknown key 'zone'"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, trace: \"\"}\n", 1, 9, 26, "spec.fleet.trace",
     "must not be empty: the sim provider replays a trace"},
    {HEAD MODEL DATA TRAIN "  fleet: {max: 4, provider: azure, instance_type: '', "
     "subscription: s, resource_group: g, location: l, azure: {subnet: /x}}\n", 1, 9, 51,
     "spec.fleet.instance_type", "must not be empty: needed by cloud providers"},
    {HEAD MODEL TRAIN FLEET "  data: {train: \"\"}\n", 1, 9, 17, "spec.data.train",
     "must not be empty"},
    /* cross-field checks */
    {HEAD "  model: {layers: 2, hidden: 10, heads: 4, vocab: 16, seq_len: 8}\n" DATA TRAIN FLEET,
     1, 6, 41, "spec.model.heads", "heads (4) must divide hidden (10)"},
    {HEAD MODEL DATA FLEET "  training: {global_batch: 10, micro_batch: 3, steps: 10}\n", 1, 9,
     45, "spec.training.micro_batch", "global_batch (10) is not a multiple of micro_batch (3)"},
    {HEAD MODEL DATA FLEET "  training: {global_batch: 10, micro_batch: 20, steps: 10}\n", 1, 9,
     45, "spec.training.micro_batch", "global_batch (10) is not a multiple of micro_batch (20)"},
    {HEAD MODEL DATA TRAIN "  fleet: {min: 5, max: 4, trace: trace.csv}\n", 1, 9, 16,
     "spec.fleet.min", "min (5) is greater than max (4)"},
    {BASE "  planner: {pp: {min: 3, max: 2}}\n", 1, 10, 17, "spec.planner.pp",
     "min (3) is greater than max (2)"},
    {BASE "  planner: {pp: {max: 3}}\n", 1, 10, 17, "spec.planner.pp",
     "pp max (3) exceeds model.layers (2); every pipeline stage needs a layer"},
    {BASE "  planner: {dp: 4, pp: 2}\n", 1, 10, 17, "spec.planner.dp",
     "pinned shape dp x pp = 4 x 2 needs 8 GPUs, but fleet.max x gpus_per_instance is 4"},
    {HEAD MODEL DATA FLEET "  training: {global_batch: 8, steps: 10, optimizer: {warmup_steps: 11}}\n",
     1, 9, 68, "spec.training.optimizer.warmup_steps", "warmup_steps (11) exceeds steps (10)"},
    {HEAD "  model: {profile_model: gpt, layers: 2, hidden: 8, heads: 2, vocab: 16, seq_len: 8}\n"
     DATA TRAIN FLEET,
     1, 6, 26, "spec.model.profile_model", "is only used with 'profile'"},
    /* files */
    {HEAD MODEL TRAIN FLEET "  data: {train: tokens.bin, val: .}\n", 1, 9, 34, "spec.data.val",
     NULL /* "'<specs dir>/.' is not a regular file", checked in test_bad_cases */},
    /* YAML-level refusals */
    {BASE "  training: {global_batch: 8, steps: 10}\n", 1, 10, 3, "spec",
     "duplicate key 'training' (first given on line 8)"},
    {HEAD MODEL DATA FLEET "  training:\n    global_batch: 8\n\tsteps: 10\n", 1, 11, 1, "",
     "tab character where indentation is expected (YAML indents with spaces only)"},
    {BASE "  planner: &p {lookahead: 3}\n  status: *p\n", 2, 10, 12, "",
     "YAML anchors are not allowed in a job spec (found '&p')"},
    {BASE "  planner: {lookahead: !!int 3}\n", 1, 10, 24, "",
     "YAML tags are not allowed in a job spec (found 'tag:yaml.org,2002:int')"},
    {BASE "---\napiVersion: spottrain/v1\n", 1, 10, 1, "",
     "a second YAML document; a job spec is a single document"},
    {"- a\n- b\n", 1, 1, 1, "",
     "expected a mapping with apiVersion, kind, metadata and spec at the top level, found a list"},
    {"", 1, 1, 1, "",
     "the file is empty (expected a mapping with apiVersion, kind, metadata and spec)"},
    {"# only a comment\n", 1, 1, 1, "",
     "the file is empty (expected a mapping with apiVersion, kind, metadata and spec)"},
    {"spec: [1, 2\n", 1, 2, 1, "",
     "YAML syntax error: did not find expected ',' or ']' while parsing a flow sequence (line 1)"},
    {HEAD "  model: {layers: 2, na\xc3\x28: 1}\n", 1, 6, 24, "",
     "invalid UTF-8 (byte 0xc3); a job spec must be UTF-8 text"},
    {HEAD "  \xe2\x82\xac: 1\n  \xff: 2\n", 1, 7, 3, "",
     "invalid UTF-8 (byte 0xff); a job spec must be UTF-8 text"},
    {BASE "  ? [a]\n  : 1\n", 1, 10, 5, "spec", "keys must be plain names, found a list"},
    {BASE "  status: {token_file: \"a\\0b\"}\n", 1, 10, 24, "spec.status.token_file",
     "contains a NUL character"},
    /* coordinator.tls: cert and key go together, client_ca needs both, files must exist */
    {BASE "  coordinator: {tls: {cert: token}}\n", 1, 10, 22, "spec.coordinator.tls",
     "missing required key 'key' (cert needs its private key)"},
    {BASE "  coordinator: {tls: {key: token}}\n", 1, 10, 22, "spec.coordinator.tls",
     "missing required key 'cert' (key needs its certificate)"},
    {BASE "  coordinator: {tls: {client_ca: token}}\n", 1, 10, 22, "spec.coordinator.tls",
     "missing required key 'cert' (client_ca needs the server's cert and key)"},
    {BASE "  coordinator: {tls: {cert: ., key: token}}\n", 1, 10, 29,
     "spec.coordinator.tls.cert", NULL},
    {BASE "  coordinator: {tls: {cert: token, key: token, client_ca: .}}\n", 1, 10, 59,
     "spec.coordinator.tls.client_ca", NULL},
    {BASE "  coordinator: {tls: {cert: token, key: token, clientca: token}}\n", 1, 10, 48,
     "spec.coordinator.tls", "unknown key 'clientca' (did you mean 'client_ca'?)"},
    {BASE "  coordinator: {tls: yes}\n", 1, 10, 22, "spec.coordinator.tls",
     "expected a mapping, found 'yes'"},
    /* fleet.kubernetes: what the API server would refuse when a pod is created */
#define KFLEET HEAD MODEL DATA TRAIN "  fleet: {max: 4, provider: kubernetes, kubernetes: "
    {KFLEET "{node_selector: {'bad key!': x}}}\n", 1, 9, 70, "spec.fleet.kubernetes.node_selector",
     "invalid name 'bad key!' (an optional DNS-subdomain prefix and '/', then at most 63 "
     "letters, digits, '-', '_' or '.')"},
    {KFLEET "{node_selector: {cloud.google.com/gke-spot: 'yes please'}}}\n", 1, 9, 97,
     "spec.fleet.kubernetes.node_selector",
     "invalid label value 'yes please' for 'cloud.google.com/gke-spot' (at most 63 letters, "
     "digits, '-', '_' or '.')"},
    {KFLEET "{resources: {nvidia.com/gpu: one}}}\n", 1, 9, 82, "spec.fleet.kubernetes.resources",
     "invalid quantity 'one' for 'nvidia.com/gpu' (expected a number with an optional suffix "
     "like m, Ki, Mi or Gi)"},
    {KFLEET "{resources: {memory: 16GB}}}\n", 1, 9, 74, "spec.fleet.kubernetes.resources",
     "invalid quantity '16GB' for 'memory' (expected a number with an optional suffix like m, "
     "Ki, Mi or Gi)"},
    {KFLEET "{resources: [1]}}\n", 1, 9, 65, "spec.fleet.kubernetes.resources",
     "expected a mapping, found a list"},
    {KFLEET "{tolerations: {key: a}}}\n", 1, 9, 67, "spec.fleet.kubernetes.tolerations",
     "expected a list of tolerations, found a mapping"},
    {KFLEET "{tolerations: [{key: a, operator: Exist}]}}\n", 1, 9, 87,
     "spec.fleet.kubernetes.tolerations[0].operator",
     "invalid value 'Exist' (expected one of: Equal, Exists)"},
    {KFLEET "{tolerations: [{key: a, operator: Exists, value: b}]}}\n", 1, 9, 68,
     "spec.fleet.kubernetes.tolerations[0]", "operator Exists takes no value (found 'b')"},
    {KFLEET "{tolerations: [{effect: NoSchedule}]}}\n", 1, 9, 68,
     "spec.fleet.kubernetes.tolerations[0]", "a toleration without a key needs operator: Exists"},
    {KFLEET "{tolerations: [{key: a, toleration_seconds: 30}]}}\n", 1, 9, 68,
     "spec.fleet.kubernetes.tolerations[0]", "toleration_seconds needs effect: NoExecute"},
    {KFLEET "{tolerations: [{key: a, efect: NoSchedule}]}}\n", 1, 9, 77,
     "spec.fleet.kubernetes.tolerations[0]",
     "unknown key 'efect' (expected key, operator, value, effect, toleration_seconds)"},
    {KFLEET "{priority_class: Spot_Low}}\n", 1, 9, 70, "spec.fleet.kubernetes.priority_class",
     "invalid PriorityClass name 'Spot_Low' (lower-case letters, digits, '-' and '.', at most "
     "253)"},
    {KFLEET "{node_selectors: {}}}\n", 1, 9, 54, "spec.fleet.kubernetes",
     "unknown key 'node_selectors' (did you mean 'node_selector'?)"},
    {BASE "  coordinator: {advertise: spottrain}\n", 1, 10, 28, "spec.coordinator.advertise",
     "expected HOST:PORT with a port from 0 to 65535, found 'spottrain'"},
    {BASE "  coordinator: {events_keep: 10}\n", 1, 10, 30, "spec.coordinator.events_keep",
     "must be between 100 and 100000000, found 10"},
};

static int test_bad_cases(void) {
    setup();
    struct st_error errs[MAX_ERRS];
    int failed = 0;
    for (size_t i = 0; i < ST_ARRAY_SIZE(bad_cases); i++) {
        const struct bad_case *c = &bad_cases[i];
        size_t n = 0;
        struct st_spec spec;
        memset(errs, 0, sizeof(errs));
        int r = st_spec_parse(inline_name, c->yaml, strlen(c->yaml), &spec, errs, MAX_ERRS, &n);
        char msg[600];
        if (c->message)
            snprintf(msg, sizeof(msg), "%s", c->message);
        else
            snprintf(msg, sizeof(msg), "'%s/.' is not a regular file", specs_dir);
        bool ok = r == -EINVAL && n == c->nerrs && errs[0].line == c->line &&
                  errs[0].column == c->column && strcmp(errs[0].field, c->field) == 0 &&
                  strcmp(errs[0].message, msg) == 0 && strcmp(errs[0].file, inline_name) == 0;
        if (!ok) {
            char line[1200];
            fprintf(stderr, "  case %zu: r=%d nerrs=%zu (want %zu)\n", i, r, n, c->nerrs);
            for (size_t k = 0; k < n && k < MAX_ERRS; k++) {
                st_error_format(&errs[k], line, sizeof(line));
                fprintf(stderr, "    got:  %s\n", line);
            }
            fprintf(stderr, "    want: %d:%d: %s: %s\n", c->line, c->column, c->field, msg);
            failed++;
        }
    }
    printf("# %zu invalid inputs, %d wrong\n", ST_ARRAY_SIZE(bad_cases), failed);
    ASSERT_GE(ST_ARRAY_SIZE(bad_cases), 35);
    ASSERT_EQ(failed, 0);
    return 0;
}

/* The input with a NUL byte in the middle can only be given with an explicit length. */
static int test_nul_byte(void) {
    static const char yaml[] = "apiVersion: spottrain/v1\nkind: Train\0ingJob\n";
    struct st_error errs[4];
    size_t n = 0;
    struct st_spec spec;
    ASSERT_ERR(st_spec_parse("nul.yaml", yaml, sizeof(yaml) - 1, &spec, errs, 4, &n), -EINVAL);
    ASSERT_EQ(n, 1);
    ASSERT_EQ(errs[0].line, 2);
    ASSERT_EQ(errs[0].column, 12);
    ASSERT_STREQ(errs[0].message, "NUL byte in the file (a job spec is UTF-8 text)");
    return 0;
}

/* Every error is reported, in file order, and max_errs caps only what is copied out. */
static int test_all_errors_in_order(void) {
    setup();
    static const char yaml[] =
        "apiVersion: spottrain/v2\n"                                              /* 1 */
        "kind: TrainingJob\n"                                                     /* 2 */
        "metadata: {name: t}\n"                                                   /* 3 */
        "spec:\n"                                                                 /* 4 */
        "  model: {layers: 2, hidden: 10, heads: 4, vocab: 16, seq_len: 8}\n"     /* 5 */
        "  data: {train: tokens.bin}\n"                                           /* 6 */
        "  training: {global_batch: 10, micro_batch: 3, steps: x}\n"              /* 7 */
        "  fleet: {min: 9, max: 8, trace: nope.csv}\n"                            /* 8 */
        "  planner: {predictor: arma}\n";                                         /* 9 */
    struct st_error errs[MAX_ERRS];
    size_t n = 0;
    struct st_spec spec;
    ASSERT_ERR(st_spec_parse(inline_name, yaml, strlen(yaml), &spec, errs, MAX_ERRS, &n),
               -EINVAL);
    ASSERT_EQ(n, 7);
    static const struct {
        int line, col;
        const char *field;
    } want[] = {{1, 13, "apiVersion"},        {5, 41, "spec.model.heads"},
                {7, 45, "spec.training.micro_batch"}, {7, 55, "spec.training.steps"},
                {8, 16, "spec.fleet.min"},    {8, 34, "spec.fleet.trace"},
                {9, 24, "spec.planner.predictor"}};
    for (size_t i = 0; i < ST_ARRAY_SIZE(want); i++) {
        ASSERT_EQ(errs[i].line, want[i].line);
        ASSERT_EQ(errs[i].column, want[i].col);
        ASSERT_STREQ(errs[i].field, want[i].field);
    }
    char msg[1200];
    snprintf(msg, sizeof(msg), "cannot access '%s/nope.csv': No such file or directory",
             specs_dir);
    ASSERT_STREQ(errs[5].message, msg);

    /* Only two copied out, the total still counted. */
    struct st_error two[2];
    n = 0;
    ASSERT_ERR(st_spec_parse(inline_name, yaml, strlen(yaml), &spec, two, 2, &n), -EINVAL);
    ASSERT_EQ(n, 7);
    ASSERT_STREQ(two[1].field, "spec.model.heads");
    return 0;
}

/* A billion-laughs document is refused at its first anchor without expanding anything. */
static int test_billion_laughs(void) {
    static const char yaml[] = "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
                               "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
                               "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
                               "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
                               "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
                               "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
                               "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n";
    struct st_error errs[MAX_ERRS];
    size_t n = 0;
    struct st_spec spec;
    ASSERT_ERR(st_spec_parse("lol.yaml", yaml, strlen(yaml), &spec, errs, MAX_ERRS, &n),
               -EINVAL);
    /* At 1:1 the unknown key 'a' and the four missing keys of the top level, then 1:4. */
    ASSERT_STREQ(errs[0].message, "unknown key 'a'");
    ASSERT_STREQ(errs[1].message, "missing required key 'apiVersion'");
    ASSERT_EQ(errs[5].line, 1);
    ASSERT_EQ(errs[5].column, 4);
    ASSERT_STREQ(errs[5].message, "YAML anchors are not allowed in a job spec (found '&a')");
    ASSERT_EQ(errs[8].line, 2);
    ASSERT_EQ(errs[8].column, 8);
    ASSERT_STREQ(errs[8].message, "YAML aliases are not allowed in a job spec (found '*a')");
    /* 7 anchors + 54 aliases + 7 unknown keys + 4 missing keys */
    ASSERT_EQ(n, 72);
    return 0;
}

/* Nesting is bounded, so a deep document cannot exhaust anything. */
static int test_deep_nesting(void) {
    char yaml[256];
    size_t k = 0;
    k += (size_t)snprintf(yaml, sizeof(yaml), "spec: ");
    for (int i = 0; i < 40; i++)
        yaml[k++] = '[';
    for (int i = 0; i < 40; i++)
        yaml[k++] = ']';
    yaml[k++] = '\n';
    yaml[k] = '\0';
    struct st_error errs[4];
    size_t n = 0;
    struct st_spec spec;
    ASSERT_ERR(st_spec_parse("deep.yaml", yaml, k, &spec, errs, 4, &n), -EINVAL);
    ASSERT_EQ(n, 1);
    ASSERT_EQ(errs[0].line, 1);
    ASSERT_EQ(errs[0].column, 38);
    ASSERT_STREQ(errs[0].message, "nesting deeper than 32 levels");
    return 0;
}

static int load_fixture(const char *file, struct st_spec *spec) {
    setup();
    char path[1200];
    struct st_error errs[8];
    size_t n = 0;
    snprintf(path, sizeof(path), "%s/%s", specs_dir, file);
    int r = st_spec_load(path, spec, errs, 8, &n);
    for (size_t i = 0; r < 0 && i < n && i < 8; i++) {
        char line[1200];
        st_error_format(&errs[i], line, sizeof(line));
        fprintf(stderr, "  %s\n", line);
    }
    return r;
}

static int test_quickstart_valid(void) {
    char path[1200];
    struct st_error errs[8];
    size_t n = 99;
    struct st_spec s;
    snprintf(path, sizeof(path), "%s/examples/quickstart.yaml",
             getenv("SPOTTRAIN_SRCDIR") ? getenv("SPOTTRAIN_SRCDIR") : ".");
    ASSERT_OK(st_spec_load(path, &s, errs, 8, &n));
    ASSERT_EQ(n, 0);
    ASSERT_STREQ(s.name, "quickstart");
    ASSERT_EQ(s.model.layers, 4);
    ASSERT_EQ(s.model.hidden, 64);
    ASSERT_EQ(s.model.heads, 4);
    ASSERT_EQ(s.model.vocab, 256);
    ASSERT_EQ(s.model.seq_len, 64);
    ASSERT_EQ(s.training.global_batch, 16);
    ASSERT_EQ(s.training.micro_batch, 2);
    ASSERT_EQ(s.training.steps, 1000);
    ASSERT_NEAR(s.training.optimizer.lr, 3e-3, 0, 1e-12);
    ASSERT_TRUE(s.data.synth);
    ASSERT_EQ(s.data.synth_order, 1);
    ASSERT_EQ(s.data.synth_tokens, 1000000);
    ASSERT_EQ(s.fleet.provider, ST_PROVIDER_SIM);
    ASSERT_EQ(s.fleet.max, 8);
    ASSERT_NEAR(s.fleet.time_scale * 60, 2.0, 1e-9, 0);
    ASSERT_TRUE(s.fleet.trace[0] == '/');
    ASSERT_CONTAINS(s.fleet.trace, "/examples/traces/quickstart-trace.csv");
    ASSERT_CONTAINS(s.data.train, "/examples/data/quickstart-markov1.bin");
    ASSERT_EQ(s.planner.pp_max, 4);
    ASSERT_EQ(s.planner.pp_min, 2);
    ASSERT_EQ(s.planner.dp_max, 8);
    ASSERT_NEAR(s.checkpoint.interval, 30, 0, 0);
    return 0;
}

/* The smallest spec: every default as docs/job-spec.md lists it. */
static int test_defaults(void) {
    struct st_spec s;
    ASSERT_OK(load_fixture("minimal.yaml", &s));
    ASSERT_STREQ(s.api_version, "spottrain/v1");
    ASSERT_STREQ(s.kind, "TrainingJob");
    ASSERT_EQ(s.training.micro_batch, 1);
    ASSERT_EQ(s.training.seed, 1337);
    ASSERT_EQ(s.training.precision, ST_PRECISION_FP32);
    ASSERT_STREQ(s.training.optimizer.name, "adamw");
    ASSERT_NEAR(s.training.optimizer.lr, 3e-4, 0, 1e-12);
    ASSERT_NEAR(s.training.optimizer.beta1, 0.9, 0, 1e-12);
    ASSERT_NEAR(s.training.optimizer.beta2, 0.95, 0, 1e-12);
    ASSERT_NEAR(s.training.optimizer.eps, 1e-8, 0, 1e-12);
    ASSERT_NEAR(s.training.optimizer.weight_decay, 0.1, 0, 1e-12);
    ASSERT_NEAR(s.training.optimizer.grad_clip, 1.0, 0, 1e-12);
    ASSERT_EQ(s.training.optimizer.warmup_steps, 0);
    ASSERT_EQ(s.training.optimizer.schedule, ST_LR_COSINE);
    ASSERT_NEAR(s.training.optimizer.min_lr_ratio, 0.1, 0, 1e-12);
    ASSERT_STREQ(s.data.val, "");
    ASSERT_FALSE(s.data.synth);
    ASSERT_EQ(s.fleet.provider, ST_PROVIDER_SIM);
    ASSERT_STREQ(s.fleet.instance_type, "");
    ASSERT_EQ(s.fleet.gpus_per_instance, 1);
    ASSERT_EQ(s.fleet.min, 1);
    ASSERT_EQ(s.fleet.max, 4);
    ASSERT_EQ(s.fleet.nzones, 0);
    ASSERT_TRUE(s.fleet.spot);
    ASSERT_FALSE(s.fleet.on_demand_fallback);
    ASSERT_NEAR(s.fleet.time_scale, 1.0, 0, 0);
    ASSERT_NEAR(s.fleet.notice_seconds, 120, 0, 0);
    ASSERT_NEAR(s.fleet.unannounced, 0, 0, 0);
    ASSERT_FALSE(s.fleet.data_plane_tls);
    ASSERT_TRUE(s.fleet.data_plane_overlap);
    ASSERT_TRUE(s.fleet.prewarm);
    ASSERT_NEAR(s.fleet.spot_price, 0.918, 0, 1e-12);
    ASSERT_NEAR(s.fleet.on_demand_price, 3.06, 0, 1e-12);
    ASSERT_EQ(s.fleet.gpu_memory, 16ull << 30);
    ASSERT_NEAR(s.planner.interval, 60, 0, 0);
    ASSERT_EQ(s.planner.lookahead, 12);
    ASSERT_TRUE(s.planner.learn);
    ASSERT_STREQ(s.planner.predictor, "notice");
    ASSERT_EQ(s.planner.dp, 0);
    ASSERT_EQ(s.planner.pp, 0);
    ASSERT_EQ(s.planner.dp_min, 0);
    ASSERT_EQ(s.planner.dp_max, 0);
    ASSERT_EQ(s.planner.pp_min, 0);
    ASSERT_EQ(s.planner.pp_max, 0);
    ASSERT_STREQ(s.checkpoint.dir, "/tmp/spottrain/minimal/checkpoints");
    ASSERT_NEAR(s.checkpoint.interval, 1800, 0, 0);
    ASSERT_EQ(s.checkpoint.keep, 2);
    ASSERT_STREQ(s.coordinator.listen, "127.0.0.1:7070");
    ASSERT_NEAR(s.coordinator.heartbeat_deadline, 10, 0, 0);
    ASSERT_NEAR(s.coordinator.reconfig_timeout, 30, 0, 0);
    ASSERT_STREQ(s.status.listen, "127.0.0.1:8080");
    ASSERT_STREQ(s.status.token_file, "");
    ASSERT_STREQ(s.coordinator.tls_cert, "");
    ASSERT_STREQ(s.coordinator.tls_client_ca, "");
    ASSERT_EQ(s.coordinator.events_keep, 10000);
    /* Relative paths resolved against the spec's directory, made absolute. */
    ASSERT_TRUE(s.data.train[0] == '/');
    ASSERT_CONTAINS(s.data.train, "/tests/unit/common/specs/tokens.bin");
    ASSERT_CONTAINS(s.path, "/tests/unit/common/specs/minimal.yaml");
    return 0;
}

/* A simulation-only spec: a profile instead of the GPT, pinned dp, pp bound, zones. */
static int test_profile_spec(void) {
    struct st_spec s;
    ASSERT_OK(load_fixture("sim-profile.yaml", &s));
    ASSERT_CONTAINS(s.model.profile, "/specs/profile.json");
    ASSERT_STREQ(s.model.profile_model, "gpt-1.5b");
    ASSERT_EQ(s.model.layers, 0);
    ASSERT_STREQ(s.data.train, "");
    ASSERT_EQ(s.fleet.nzones, 2);
    ASSERT_STREQ(s.fleet.zones[1], "us-east-1b");
    ASSERT_EQ(s.fleet.gpu_memory, 16ull << 30);
    ASSERT_EQ(s.planner.dp, 4);
    ASSERT_EQ(s.planner.dp_min, 4);
    ASSERT_EQ(s.planner.dp_max, 4);
    ASSERT_EQ(s.planner.pp, 0);
    ASSERT_EQ(s.planner.pp_max, 8);
    ASSERT_STREQ(s.planner.predictor, "arima");
    ASSERT_STREQ(s.status.listen, "");
    ASSERT_CONTAINS(s.status.token_file, "/specs/token");
    return 0;
}

/* The annotated example in docs/job-spec.md is a valid spec whose values are the defaults
 * where it says so (its files are made in a temporary directory). */
static int test_docs_example(void) {
    char path[1200], dir[] = "/tmp/spottrain-test-docs-XXXXXX";
    char *doc = NULL;
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/docs/job-spec.md",
             getenv("SPOTTRAIN_SRCDIR") ? getenv("SPOTTRAIN_SRCDIR") : ".");
    ASSERT_OK(st_read_file(path, 1 << 20, &doc, &len));
    char *start = strstr(doc, "```yaml\n");
    char *end = start ? strstr(start + 8, "```") : NULL;
    if (!start || !end) {
        st_free(doc);
        TEST_FAIL_("no ```yaml block in %s", path);
    }
    start += 8;
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    char cmd[1400], spec_path[1200];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s/data' '%s/traces' && touch '%s/data/train.bin' "
             "'%s/traces/p3.csv'", dir, dir, dir, dir);
    int sys_r = system(cmd);
    snprintf(spec_path, sizeof(spec_path), "%s/job.yaml", dir);
    int wr = st_write_file_atomic(spec_path, start, (size_t)(end - start));
    st_free(doc);
    struct st_spec s, d;
    struct st_error errs[8];
    size_t n = 0;
    int r = st_spec_load(spec_path, &s, errs, 8, &n);
    for (size_t i = 0; r < 0 && i < n && i < 8; i++) {
        char line[1200];
        st_error_format(&errs[i], line, sizeof(line));
        fprintf(stderr, "  %s\n", line);
    }
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    int rm_r = system(cmd);
    ASSERT_EQ(sys_r, 0);
    ASSERT_EQ(rm_r, 0);
    ASSERT_OK(wr);
    ASSERT_OK(r);
    st_spec_defaults(&d);
    ASSERT_STREQ(s.name, "my-job");
    ASSERT_EQ(s.model.layers, 12);
    ASSERT_EQ(s.planner.pp, 4);
    ASSERT_EQ(s.planner.dp_max, 64);
    ASSERT_TRUE(memcmp(&s.training.optimizer, &d.training.optimizer,
                       sizeof(d.training.optimizer)) == 0);
    ASSERT_EQ(s.training.micro_batch, d.training.micro_batch);
    ASSERT_EQ(s.training.seed, d.training.seed);
    ASSERT_EQ(s.fleet.gpus_per_instance, d.fleet.gpus_per_instance);
    ASSERT_NEAR(s.fleet.notice_seconds, d.fleet.notice_seconds, 0, 0);
    ASSERT_NEAR(s.fleet.spot_price, d.fleet.spot_price, 0, 0);
    ASSERT_NEAR(s.fleet.on_demand_price, d.fleet.on_demand_price, 0, 0);
    ASSERT_EQ(s.fleet.gpu_memory, d.fleet.gpu_memory);
    ASSERT_NEAR(s.planner.interval, d.planner.interval, 0, 0);
    ASSERT_EQ(s.planner.lookahead, d.planner.lookahead);
    ASSERT_STREQ(s.planner.predictor, d.planner.predictor);
    ASSERT_STREQ(s.checkpoint.dir, "/tmp/spottrain/my-job/checkpoints");
    ASSERT_NEAR(s.checkpoint.interval, d.checkpoint.interval, 0, 0);
    ASSERT_EQ(s.checkpoint.keep, d.checkpoint.keep);
    ASSERT_STREQ(s.coordinator.listen, d.coordinator.listen);
    ASSERT_STREQ(s.status.listen, d.status.listen);
    ASSERT_STREQ(s.status.token_file, "");
    ASSERT_EQ(s.data.synth_order, d.data.synth_order);
    ASSERT_EQ(s.data.synth_tokens, d.data.synth_tokens);
    return 0;
}

static int test_missing_file(void) {
    struct st_error errs[2];
    size_t n = 0;
    struct st_spec s;
    ASSERT_ERR(st_spec_load("/nonexistent/job.yaml", &s, errs, 2, &n), -ENOENT);
    ASSERT_EQ(n, 1);
    ASSERT_STREQ(errs[0].file, "/nonexistent/job.yaml");
    ASSERT_EQ(errs[0].line, 0);
    ASSERT_STREQ(errs[0].message, "cannot read the job spec: No such file or directory");
    char line[1200];
    st_error_format(&errs[0], line, sizeof(line));
    ASSERT_STREQ(line, "/nonexistent/job.yaml: cannot read the job spec: No such file or directory");
    setup();
    ASSERT_ERR(st_spec_load(specs_dir, &s, errs, 2, &n), -EISDIR);
    ASSERT_EQ(n, 1);
    ASSERT_STREQ(errs[0].message, "cannot read the job spec: Is a directory");
    return 0;
}

static int test_non_utf8_file(void) {
    setup();
    char path[1200];
    struct st_error errs[4];
    size_t n = 0;
    struct st_spec s;
    snprintf(path, sizeof(path), "%s/non-utf8.yaml", specs_dir);
    ASSERT_ERR(st_spec_load(path, &s, errs, 4, &n), -EINVAL);
    ASSERT_EQ(n, 1);
    ASSERT_STREQ(errs[0].file, path);
    ASSERT_EQ(errs[0].line, 4);
    ASSERT_EQ(errs[0].column, 12);
    ASSERT_STREQ(errs[0].message, "invalid UTF-8 (byte 0xe9); a job spec must be UTF-8 text");
    return 0;
}

static int test_too_large(void) {
    char path[] = "/tmp/spottrain-test-spec-XXXXXX";
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    FILE *f = fdopen(fd, "w");
    ASSERT_TRUE(f != NULL);
    for (int i = 0; i < (1 << 20) / 16 + 1; i++)
        fputs("# padding line.\n", f);
    fclose(f);
    struct st_error errs[2];
    size_t n = 0;
    struct st_spec s;
    int r = st_spec_load(path, &s, errs, 2, &n);
    unlink(path);
    ASSERT_ERR(r, -EINVAL);
    ASSERT_EQ(n, 1);
    ASSERT_STREQ(errs[0].message, "file is too large (the limit is 1 MiB)");
    /* The buffer entry point applies the same limit. */
    size_t len = (1 << 20) + 1;
    char *big = malloc(len);
    ASSERT_TRUE(big != NULL);
    memset(big, ' ', len);
    r = st_spec_parse("big.yaml", big, len, &s, errs, 2, &n);
    free(big);
    ASSERT_ERR(r, -EINVAL);
    ASSERT_STREQ(errs[0].message, "file is too large (1048577 bytes; the limit is 1 MiB)");
    return 0;
}

static int test_edit_distance(void) {
    ASSERT_EQ(spec__edit_distance("micro_bach", "micro_batch"), 1);
    ASSERT_EQ(spec__edit_distance("lookahaed", "lookahead"), 1); /* transposition */
    ASSERT_EQ(spec__edit_distance("", "abc"), 3);
    ASSERT_EQ(spec__edit_distance("kitten", "sitting"), 3);
    return 0;
}

/* The JSON form holds the resolved values and parses back. */
static int test_json(void) {
    struct st_spec s;
    ASSERT_OK(load_fixture("minimal.yaml", &s));
    char *text = st_spec_to_json(&s);
    ASSERT_TRUE(text != NULL);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    st_free(text);
    ASSERT_TRUE(root != NULL);
    json_t *sp = json_object_get(root, "spec");
    ASSERT_STREQ(json_string_value(json_object_get(root, "apiVersion")), "spottrain/v1");
    ASSERT_STREQ(json_string_value(json_object_get(json_object_get(root, "metadata"), "name")),
                 "minimal");
    json_t *tr = json_object_get(sp, "training");
    ASSERT_EQ(json_integer_value(json_object_get(tr, "global_batch")), 8);
    ASSERT_EQ(json_integer_value(json_object_get(tr, "micro_batch")), 1);
    ASSERT_NEAR(json_real_value(json_object_get(json_object_get(tr, "optimizer"), "beta2")),
                0.95, 0, 1e-12);
    json_t *fl = json_object_get(sp, "fleet");
    ASSERT_STREQ(json_string_value(json_object_get(fl, "provider")), "sim");
    ASSERT_NEAR(json_real_value(json_object_get(fl, "notice")), 120, 0, 0);
    ASSERT_TRUE(json_is_false(json_object_get(json_object_get(fl, "data_plane"), "tls")));
    ASSERT_TRUE(json_is_true(json_object_get(json_object_get(fl, "data_plane"), "overlap")));
    ASSERT_STREQ(json_string_value(json_object_get(json_object_get(sp, "planner"), "predictor")),
                 "notice");
    json_decref(root);
    return 0;
}

/* Fails each allocation in turn until the parse succeeds: every failure must be -ENOMEM
 * (never -EINVAL) and free what it took (ASan's leak check runs at exit). */
static int test_oom(void) {
    setup();
    char path[1200];
    char *data = NULL;
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/sim-profile.yaml", specs_dir);
    ASSERT_OK(st_read_file(path, 1 << 20, &data, &len));
    int fails = 0;
    long n;
    for (n = 1; n < 10000; n++) {
        struct st_spec s;
        struct st_error errs[4];
        size_t nerrs = 0;
        st_alloc_fail_after(n);
        int r = st_spec_parse(path, data, len, &s, errs, 4, &nerrs);
        st_alloc_fail_after(0);
        if (r == 0)
            break;
        if (r != -ENOMEM) {
            st_free(data);
            TEST_FAIL_("allocation %ld failing gave %d, expected -ENOMEM", n, r);
        }
        fails++;
    }
    /* The same walk through st_spec_load (file buffer first) and st_spec_to_json. */
    for (long m = 1; m < 10000; m++) {
        struct st_spec s;
        size_t nerrs = 0;
        st_alloc_fail_after(m);
        int r = st_spec_load(path, &s, NULL, 0, &nerrs);
        st_alloc_fail_after(0);
        if (r == 0) {
            for (long j = 1; j < 100; j++) {
                st_alloc_fail_after(j);
                char *t = st_spec_to_json(&s);
                st_alloc_fail_after(0);
                if (t) {
                    st_free(t);
                    break;
                }
            }
            break;
        }
        if (r != -ENOMEM) {
            st_free(data);
            TEST_FAIL_("allocation %ld failing in st_spec_load gave %d", m, r);
        }
    }
    st_free(data);
    printf("# %d failing allocations walked\n", fails);
    ASSERT_GT(fails, 0);
    ASSERT_LT(n, 10000);
    return 0;
}

/* Runs a shell command line and returns its exit status (or -1). */
static int run_status(const char *cmd) {
    int st = system(cmd);
    if (st < 0 || !WIFEXITED(st))
        return -1;
    return WEXITSTATUS(st);
}

static int read_text(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
    return 0;
}

/* `spottrain validate`: exit 0 with a summary or JSON, exit 2 with one error per line. */
static int test_cli_validate(void) {
    const char *bin = getenv("SPOTTRAIN_BIN");
    const char *src = getenv("SPOTTRAIN_SRCDIR");
    if (!bin || !src || access(bin, X_OK) != 0)
        return TEST_SKIP;
    char dir[] = "/tmp/spottrain-test-cli-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    char cmd[4096], out[1200], err[1200], text[16384];
    snprintf(out, sizeof(out), "%s/out", dir);
    snprintf(err, sizeof(err), "%s/err", dir);

    /* valid: summary */
    snprintf(cmd, sizeof(cmd), "'%s' validate '%s/examples/quickstart.yaml' >'%s' 2>'%s'", bin,
             src, out, err);
    int st1 = run_status(cmd);
    int r1 = read_text(out, text, sizeof(text));
    bool summary_ok = r1 == 0 && strstr(text, "valid spottrain/v1 TrainingJob 'quickstart'");

    /* valid: JSON that parses */
    snprintf(cmd, sizeof(cmd), "'%s' validate --json '%s/examples/quickstart.yaml' >'%s' 2>'%s'",
             bin, src, out, err);
    int st2 = run_status(cmd);
    json_error_t jerr;
    json_t *root = json_load_file(out, 0, &jerr);
    bool json_ok = root && json_integer_value(json_object_get(
                               json_object_get(json_object_get(root, "spec"), "training"),
                               "steps")) == 1000;
    json_decref(root);

    /* a misspelled key, run from the spec's directory so the name is as given */
    char copy[1200];
    snprintf(copy, sizeof(copy), "%s/quickstart.yaml", dir);
    snprintf(cmd, sizeof(cmd),
             "sed -e 's/micro_batch: 2 /micro_bach: 2 /' "
             "-e 's#traces/quickstart-trace.csv#%s/examples/traces/quickstart-trace.csv#' "
             "'%s/examples/quickstart.yaml' >'%s'",
             src, src, copy);
    ASSERT_EQ(run_status(cmd), 0);
    snprintf(cmd, sizeof(cmd), "cd '%s' && '%s' validate quickstart.yaml >'%s' 2>'%s'", dir, bin,
             out, err);
    int st3 = run_status(cmd);
    int r3 = read_text(err, text, sizeof(text));
    bool err_ok = r3 == 0 && strcmp(text, "quickstart.yaml:14:5: spec.training: unknown key "
                                          "'micro_bach' (did you mean 'micro_batch'?)\n") == 0;
    if (!err_ok)
        fprintf(stderr, "  stderr was: %s\n", text);

    /* unreadable file, and no file */
    snprintf(cmd, sizeof(cmd), "'%s' validate '%s/missing.yaml' >'%s' 2>'%s'", bin, dir, out,
             err);
    int st4 = run_status(cmd);
    int r4 = read_text(err, text, sizeof(text));
    bool missing_ok = r4 == 0 && strstr(text, "missing.yaml: cannot read the job spec: No such "
                                              "file or directory");
    snprintf(cmd, sizeof(cmd), "'%s' validate >'%s' 2>'%s'", bin, out, err);
    int st5 = run_status(cmd);

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    run_status(cmd);
    ASSERT_EQ(st1, 0);
    ASSERT_TRUE(summary_ok);
    ASSERT_EQ(st2, 0);
    ASSERT_TRUE(json_ok);
    ASSERT_EQ(st3, 2);
    ASSERT_TRUE(err_ok);
    ASSERT_EQ(st4, 2);
    ASSERT_TRUE(missing_ok);
    ASSERT_EQ(st5, 2);
    return 0;
}

/* coordinator.tls and events_keep: paths resolve against the spec's directory; the resolved
 * JSON carries them. */
static int test_tls_fields(void) {
    setup();
    static const char yaml[] = HEAD MODEL DATA TRAIN
        "  fleet: {max: 4, trace: trace.csv, prewarm: false, data_plane: {tls: true, overlap: false}}\n"
        "  coordinator:\n    events_keep: 500\n"
        "    tls: {cert: token, key: token, client_ca: token}\n";
    struct st_spec s;
    struct st_error errs[4];
    size_t n = 0;
    ASSERT_OK(st_spec_parse(inline_name, yaml, strlen(yaml), &s, errs, 4, &n));
    ASSERT_EQ(s.coordinator.events_keep, 500);
    ASSERT_TRUE(s.fleet.data_plane_tls);
    ASSERT_FALSE(s.fleet.data_plane_overlap);
    ASSERT_FALSE(s.fleet.prewarm);
    ASSERT_TRUE(s.coordinator.tls_cert[0] == '/');
    ASSERT_CONTAINS(s.coordinator.tls_cert, "/tests/unit/common/specs/token");
    ASSERT_CONTAINS(s.coordinator.tls_key, "/specs/token");
    ASSERT_CONTAINS(s.coordinator.tls_client_ca, "/specs/token");
    char *text = st_spec_to_json(&s);
    ASSERT_TRUE(text != NULL);
    json_t *root = json_loads(text, 0, NULL);
    st_free(text);
    ASSERT_TRUE(root != NULL);
    json_t *co = json_object_get(json_object_get(root, "spec"), "coordinator");
    ASSERT_EQ(json_integer_value(json_object_get(co, "events_keep")), 500);
    json_t *dpl = json_object_get(json_object_get(json_object_get(root, "spec"), "fleet"),
                                  "data_plane");
    ASSERT_TRUE(json_is_true(json_object_get(dpl, "tls")));
    ASSERT_TRUE(json_is_false(json_object_get(dpl, "overlap")));
    ASSERT_CONTAINS(json_string_value(json_object_get(json_object_get(co, "tls"), "key")),
                    "/specs/token");
    json_decref(root);
    return 0;
}

/* fleet.notice defaults to the provider's notice (EC2 two minutes, GCE and Azure thirty
 * seconds) unless given; the cloud fields round-trip through JSON. */
static int test_provider_notice(void) {
    setup();
    static const struct {
        const char *fleet;
        double notice;
    } cases[] = {
        {"  fleet: {max: 2, provider: aws, instance_type: p3}\n", 120},
        {"  fleet: {max: 2, provider: gcp, instance_type: n1, project: p, zones: [z1],\n"
         "          gcp: {endpoint: 'http://127.0.0.1:1'}}\n", 30},
        {"  fleet: {max: 2, provider: gcp, instance_type: n1, project: p, notice: 45s}\n", 45},
        {"  fleet: {max: 2, provider: azure, instance_type: D2, subscription: s,\n"
         "          resource_group: g, location: l, azure: {subnet: /sub, endpoint: e}}\n", 30},
        {"  fleet: {max: 2, trace: trace.csv}\n", 120},
    };
    for (size_t i = 0; i < ST_ARRAY_SIZE(cases); i++) {
        char yaml[1024];
        snprintf(yaml, sizeof(yaml), "%s%s%s%s%s", HEAD, MODEL, DATA, TRAIN, cases[i].fleet);
        struct st_spec s;
        struct st_error errs[4];
        size_t n = 0;
        ASSERT_OK(st_spec_parse(inline_name, yaml, strlen(yaml), &s, errs, 4, &n));
        ASSERT_NEAR(s.fleet.notice_seconds, cases[i].notice, 0, 1e-9);
        if (i == 1) {
            ASSERT_STREQ(s.fleet.project, "p");
            ASSERT_STREQ(s.fleet.gcp_endpoint, "http://127.0.0.1:1");
        }
        if (i == 3) {
            ASSERT_STREQ(s.fleet.azure_subnet, "/sub");
            ASSERT_STREQ(s.fleet.azure_endpoint, "e");
            char *text = st_spec_to_json(&s);
            ASSERT_TRUE(text != NULL);
            json_t *root = json_loads(text, 0, NULL);
            st_free(text);
            ASSERT_TRUE(root != NULL);
            json_t *fl = json_object_get(json_object_get(root, "spec"), "fleet");
            ASSERT_STREQ(json_string_value(json_object_get(fl, "resource_group")), "g");
            ASSERT_STREQ(json_string_value(json_object_get(json_object_get(fl, "azure"),
                                                           "subnet")), "/sub");
            json_decref(root);
        }
    }
    return 0;
}

/* Positions kept for checks made after parsing (st_spec_where), and planner.wait_limit. */
static int test_where(void) {
    static const char yaml[] = BASE "  planner: {dp: 2, wait_limit: 90s, learn: false}\n";
    struct st_spec *s = st_malloc(sizeof(*s));
    struct st_error errs[4];
    size_t nerrs = 0;
    int line = 0, col = 0;
    setup();
    ASSERT_TRUE(s);
    ASSERT_OK(st_spec_parse(inline_name, yaml, strlen(yaml), s, errs, 4, &nerrs));
    ASSERT_NEAR(s->planner.wait_limit, 90, 0, 1e-12);
    ASSERT_FALSE(s->planner.learn);
    ASSERT_EQ(st_spec_where(s, "spec.planner.dp", &line, &col), 0);
    ASSERT_EQ(line, 10);
    ASSERT_EQ(col, 17);
    ASSERT_EQ(st_spec_where(s, "spec.planner.wait_limit", &line, &col), 0);
    ASSERT_EQ(col, 32);
    /* Defaulted fields point at their nearest given parent. */
    ASSERT_EQ(st_spec_where(s, "spec.planner.pp", &line, &col), 1);
    ASSERT_EQ(line, 10);
    ASSERT_EQ(col, 12);
    ASSERT_EQ(st_spec_where(s, "spec.fleet.gpu_memory", &line, &col), 1);
    ASSERT_EQ(line, 9);
    ASSERT_EQ(col, 10);
    ASSERT_ERR(st_spec_where(s, "nothing", &line, &col), -ENOENT);
    ASSERT_ERR(st_spec_where(s, NULL, &line, &col), -EINVAL);
    ASSERT_ERR(st_spec_where(NULL, "spec", &line, &col), -EINVAL);
    ASSERT_ERR(st_spec_where(s, "spec", NULL, &col), -EINVAL);
    /* A spec not parsed from a file has no positions. */
    st_spec_defaults(s);
    ASSERT_NEAR(s->planner.wait_limit, 1800, 0, 1e-12);
    ASSERT_ERR(st_spec_where(s, "spec.planner.dp", &line, &col), -ENOENT);
    static const char zero[] = BASE "  planner: {wait_limit: 0s}\n";
    ASSERT_ERR(st_spec_parse(inline_name, zero, strlen(zero), s, errs, 4, &nerrs), -EINVAL);
    ASSERT_EQ(nerrs, 1);
    ASSERT_STREQ(errs[0].field, "spec.planner.wait_limit");
    st_free(s);
    return 0;
}

TEST_MAIN(TEST(test_bad_cases), TEST(test_nul_byte), TEST(test_tls_fields),
          TEST(test_provider_notice),
          TEST(test_all_errors_in_order), TEST(test_billion_laughs), TEST(test_deep_nesting),
          TEST(test_quickstart_valid), TEST(test_defaults), TEST(test_profile_spec), TEST(test_docs_example),
          TEST(test_missing_file), TEST(test_non_utf8_file), TEST(test_too_large),
          TEST(test_edit_distance), TEST(test_json), TEST(test_oom), TEST(test_cli_validate),
          TEST(test_where))
