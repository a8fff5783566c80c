/* spec.c: the job spec (apiVersion spottrain/v1, kind TrainingJob) -> struct st_spec.
 *
 * The one idea: every mapping of the format is a table of field descriptors (key, type,
 * offset into struct st_spec, bounds, flags), as systemd's config tables are, and one walker
 * applies a table to a YAML mapping. Type errors, bounds, unknown keys (with a "did you
 * mean" suggestion), duplicates and missing keys all come out of that walker in one place;
 * what cannot be said per field (global_batch vs micro_batch, files that must exist, ...) is
 * in check_cross() at the end. Every error is recorded and the walk goes on, so a user sees
 * all of them at once, sorted into file order. The YAML itself is read by spec-yaml.c. */
#include <ctype.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spec-internal.h"

/* ---- field descriptors ----------------------------------------------------------- */

enum field_type {
    F_INT,      /* int, decimal */
    F_U64,      /* uint64_t, decimal */
    F_DOUBLE,   /* double */
    F_BOOL,     /* bool: true | false */
    F_STRING,   /* char[size] */
    F_PATH,     /* char[size]; relative paths resolve against the spec file's directory */
    F_DURATION, /* double seconds: "60s", "30m", "2h", "250ms" or a number of seconds */
    F_SIZE,     /* uint64_t bytes: "16GiB", "512MiB", "1GB" or a number of bytes */
    F_ENUM,     /* int (an enum) from names[] */
    F_CHOICE,   /* char[size] that must be one of names[] */
    F_LISTEN,   /* char[size] HOST:PORT */
    F_NAME,     /* char[size] DNS label (metadata.name) */
    F_MAP,      /* a nested mapping: sub */
    F_SHAPE,    /* an int pinning the value (off), or a {min, max} mapping: sub */
    F_ZONES,    /* a list of zone names -> fleet.zones / fleet.nzones */
    F_KV,       /* a mapping of label keys to strings -> struct st_spec_kv_list at off */
    F_TOLERATIONS, /* a list of toleration mappings -> fleet.kubernetes.tolerations */
};

enum {
    REQUIRED = 1 << 0,    /* missing key is an error (conditional ones are in check_cross) */
    EMPTY_OK = 1 << 1,    /* "" is a valid string value */
    MIN_EXCL = 1 << 2,    /* value must be > min rather than >= min */
    MAX_EXCL = 1 << 3,    /* value must be < max rather than <= max */
    QUANTITY = 1 << 4,    /* F_KV: values are Kubernetes quantities ("1", "500m", "16Gi") */
};

struct table;

struct field {
    const char *key;
    enum field_type type;
    size_t off;                /* into struct st_spec */
    size_t size;               /* strings: buffer size */
    double min, max;           /* numbers, durations, sizes */
    const char *const *names;  /* F_ENUM, F_CHOICE: NULL-terminated */
    const struct table *sub;   /* F_MAP, F_SHAPE */
    unsigned flags;
    const char *why;           /* appended to range errors, e.g. "tokens are uint16" */
};

struct table {
    const struct field *fields;
    size_t n;
};

#define OFF(m) offsetof(struct st_spec, m)
#define STR(m) OFF(m), sizeof(((struct st_spec *)0)->m)
#define TABLE(a) {a, ST_ARRAY_SIZE(a)}

static const char *const provider_names[] = {"sim", "aws", "gcp", "azure", "kubernetes", NULL};
static const char *const precision_names[] = {"fp32", "bf16", NULL};
static const char *const schedule_names[] = {"cosine", "constant", "linear", NULL};
static const char *const optimizer_names[] = {"adamw", NULL};
/* The planner owns the forecasters' names; the spec accepts exactly those. */
static const char *const predictor_names[] = {
#define PLAN_PREDICTOR(e, name, doc) name,
#include "../planner/predictors.def"
#undef PLAN_PREDICTOR
    NULL};

static const struct field metadata_fields[] = {
    {"name", F_NAME, STR(name), 0, 0, NULL, NULL, REQUIRED, NULL},
};
static const struct table metadata_table = TABLE(metadata_fields);

static const struct field model_fields[] = {
    {"layers", F_INT, OFF(model.layers), 0, 1, 1024, NULL, NULL, 0, NULL},
    {"hidden", F_INT, OFF(model.hidden), 0, 1, 65536, NULL, NULL, 0, NULL},
    {"heads", F_INT, OFF(model.heads), 0, 1, 1024, NULL, NULL, 0, NULL},
    {"vocab", F_INT, OFF(model.vocab), 0, 2, 65536, NULL, NULL, 0, "tokens are uint16"},
    {"seq_len", F_INT, OFF(model.seq_len), 0, 1, 1048576, NULL, NULL, 0, NULL},
    {"profile", F_PATH, STR(model.profile), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"profile_model", F_STRING, STR(model.profile_model), 0, 0, NULL, NULL, EMPTY_OK, NULL},
};
static const struct table model_table = TABLE(model_fields);

static const struct field synth_fields[] = {
    {"kind", F_CHOICE, 0, 0, 0, 0, (const char *const[]){"markov", NULL}, NULL, 0, NULL},
    {"order", F_INT, OFF(data.synth_order), 0, 1, 8, NULL, NULL, 0, NULL},
    {"seed", F_U64, OFF(data.synth_seed), 0, 0, 0, NULL, NULL, 0, NULL},
    {"tokens", F_U64, OFF(data.synth_tokens), 0, 1, 1e10, NULL, NULL, 0, NULL},
};
static const struct table synth_table = TABLE(synth_fields);

static const struct field data_fields[] = {
    {"train", F_PATH, STR(data.train), 0, 0, NULL, NULL, REQUIRED, NULL},
    {"val", F_PATH, STR(data.val), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"synth", F_MAP, 0, 0, 0, 0, NULL, &synth_table, 0, NULL},
};
static const struct table data_table = TABLE(data_fields);

static const struct field optimizer_fields[] = {
    {"name", F_CHOICE, STR(training.optimizer.name), 0, 0, optimizer_names, NULL, 0, NULL},
    {"lr", F_DOUBLE, OFF(training.optimizer.lr), 0, 0, 10, NULL, NULL, MIN_EXCL, NULL},
    {"beta1", F_DOUBLE, OFF(training.optimizer.beta1), 0, 0, 1, NULL, NULL, MAX_EXCL, NULL},
    {"beta2", F_DOUBLE, OFF(training.optimizer.beta2), 0, 0, 1, NULL, NULL, MAX_EXCL, NULL},
    {"eps", F_DOUBLE, OFF(training.optimizer.eps), 0, 0, 1, NULL, NULL, MIN_EXCL, NULL},
    {"weight_decay", F_DOUBLE, OFF(training.optimizer.weight_decay), 0, 0, 10, NULL, NULL, 0,
     NULL},
    {"grad_clip", F_DOUBLE, OFF(training.optimizer.grad_clip), 0, 0, 1e6, NULL, NULL, 0, NULL},
    {"warmup_steps", F_INT, OFF(training.optimizer.warmup_steps), 0, 0, INT_MAX, NULL, NULL, 0,
     NULL},
    {"schedule", F_ENUM, OFF(training.optimizer.schedule), 0, 0, 0, schedule_names, NULL, 0,
     NULL},
    {"min_lr_ratio", F_DOUBLE, OFF(training.optimizer.min_lr_ratio), 0, 0, 1, NULL, NULL, 0,
     NULL},
};
static const struct table optimizer_table = TABLE(optimizer_fields);

static const struct field training_fields[] = {
    {"global_batch", F_INT, OFF(training.global_batch), 0, 1, 1 << 24, NULL, NULL, REQUIRED,
     NULL},
    {"micro_batch", F_INT, OFF(training.micro_batch), 0, 1, 1 << 24, NULL, NULL, 0, NULL},
    {"steps", F_INT, OFF(training.steps), 0, 1, INT_MAX, NULL, NULL, REQUIRED, NULL},
    {"optimizer", F_MAP, 0, 0, 0, 0, NULL, &optimizer_table, 0, NULL},
    {"seed", F_U64, OFF(training.seed), 0, 0, 0, NULL, NULL, 0, NULL},
    {"precision", F_ENUM, OFF(training.precision), 0, 0, 0, precision_names, NULL, 0, NULL},
};
static const struct table training_table = TABLE(training_fields);

static const struct field price_fields[] = {
    {"spot", F_DOUBLE, OFF(fleet.spot_price), 0, 0, 1e6, NULL, NULL, 0, NULL},
    {"on_demand", F_DOUBLE, OFF(fleet.on_demand_price), 0, 0, 1e6, NULL, NULL, 0, NULL},
};
static const struct table price_table = TABLE(price_fields);

static const struct field gcp_fields[] = {
    {"endpoint", F_STRING, STR(fleet.gcp_endpoint), 0, 0, NULL, NULL, EMPTY_OK, NULL},
};
static const struct table gcp_table = TABLE(gcp_fields);

static const struct field azure_fields[] = {
    {"subnet", F_STRING, STR(fleet.azure_subnet), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"endpoint", F_STRING, STR(fleet.azure_endpoint), 0, 0, NULL, NULL, EMPTY_OK, NULL},
};
static const struct table azure_table = TABLE(azure_fields);
static const struct field kubernetes_fields[] = {
    {"node_selector", F_KV, OFF(fleet.kubernetes.node_selector), 0, 0, 0, NULL, NULL, 0, NULL},
    {"tolerations", F_TOLERATIONS, 0, 0, 0, 0, NULL, NULL, 0, NULL},
    {"resources", F_KV, OFF(fleet.kubernetes.resources), 0, 0, 0, NULL, NULL, QUANTITY, NULL},
    {"priority_class", F_STRING, STR(fleet.kubernetes.priority_class), 0, 0, NULL, NULL,
     EMPTY_OK, NULL},
};
static const struct table kubernetes_table = TABLE(kubernetes_fields);

static const struct field data_plane_fields[] = {
    {"tls", F_BOOL, OFF(fleet.data_plane_tls), 0, 0, 0, NULL, NULL, 0, NULL},
    {"overlap", F_BOOL, OFF(fleet.data_plane_overlap), 0, 0, 0, NULL, NULL, 0, NULL},
};
static const struct table data_plane_table = TABLE(data_plane_fields);

static const struct field fleet_fields[] = {
    {"provider", F_ENUM, OFF(fleet.provider), 0, 0, 0, provider_names, NULL, 0, NULL},
    {"instance_type", F_STRING, STR(fleet.instance_type), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"gpus_per_instance", F_INT, OFF(fleet.gpus_per_instance), 0, 1, 64, NULL, NULL, 0, NULL},
    {"min", F_INT, OFF(fleet.min), 0, 0, 4096, NULL, NULL, 0, NULL},
    {"max", F_INT, OFF(fleet.max), 0, 1, 4096, NULL, NULL, REQUIRED, NULL},
    {"zones", F_ZONES, 0, 0, 0, 0, NULL, NULL, 0, NULL},
    {"spot", F_BOOL, OFF(fleet.spot), 0, 0, 0, NULL, NULL, 0, NULL},
    {"on_demand_fallback", F_BOOL, OFF(fleet.on_demand_fallback), 0, 0, 0, NULL, NULL, 0, NULL},
    {"image", F_STRING, STR(fleet.image), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"project", F_STRING, STR(fleet.project), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"subscription", F_STRING, STR(fleet.subscription), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"resource_group", F_STRING, STR(fleet.resource_group), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"location", F_STRING, STR(fleet.location), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"gcp", F_MAP, 0, 0, 0, 0, NULL, &gcp_table, 0, NULL},
    {"azure", F_MAP, 0, 0, 0, 0, NULL, &azure_table, 0, NULL},
    {"trace", F_PATH, STR(fleet.trace), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"time_scale", F_DOUBLE, OFF(fleet.time_scale), 0, 0, 1e6, NULL, NULL, MIN_EXCL, NULL},
    {"notice", F_DURATION, OFF(fleet.notice_seconds), 0, 0, 3600, NULL, NULL, 0, NULL},
    {"unannounced", F_DOUBLE, OFF(fleet.unannounced), 0, 0, 1, NULL, NULL, 0, NULL},
    {"price", F_MAP, 0, 0, 0, 0, NULL, &price_table, 0, NULL},
    {"gpu_memory", F_SIZE, OFF(fleet.gpu_memory), 0, 0, 0, NULL, NULL, 0, NULL},
    {"gpu_tflops", F_DOUBLE, OFF(fleet.gpu_tflops), 0, 0, 1e5, NULL, NULL, MIN_EXCL, NULL},
    {"net_gbps", F_DOUBLE, OFF(fleet.net_gbps), 0, 0, 1e5, NULL, NULL, MIN_EXCL, NULL},
    {"prewarm", F_BOOL, OFF(fleet.prewarm), 0, 0, 0, NULL, NULL, 0, NULL},
    {"kubernetes", F_MAP, 0, 0, 0, 0, NULL, &kubernetes_table, 0, NULL},
    {"data_plane", F_MAP, 0, 0, 0, 0, NULL, &data_plane_table, 0, NULL},
};
static const struct table fleet_table = TABLE(fleet_fields);

static const struct field dp_range_fields[] = {
    {"min", F_INT, OFF(planner.dp_min), 0, 1, 4096, NULL, NULL, 0, NULL},
    {"max", F_INT, OFF(planner.dp_max), 0, 1, 4096, NULL, NULL, 0, NULL},
};
static const struct table dp_range_table = TABLE(dp_range_fields);
static const struct field pp_range_fields[] = {
    {"min", F_INT, OFF(planner.pp_min), 0, 1, 1024, NULL, NULL, 0, NULL},
    {"max", F_INT, OFF(planner.pp_max), 0, 1, 1024, NULL, NULL, 0, NULL},
};
static const struct table pp_range_table = TABLE(pp_range_fields);

static const struct field planner_fields[] = {
    {"interval", F_DURATION, OFF(planner.interval), 0, 0, 86400, NULL, NULL, MIN_EXCL, NULL},
    {"lookahead", F_INT, OFF(planner.lookahead), 0, 1, 1000, NULL, NULL, 0, NULL},
    {"predictor", F_CHOICE, STR(planner.predictor), 0, 0, predictor_names, NULL, 0, NULL},
    {"dp", F_SHAPE, OFF(planner.dp), 0, 1, 4096, NULL, &dp_range_table, 0, NULL},
    {"pp", F_SHAPE, OFF(planner.pp), 0, 1, 1024, NULL, &pp_range_table, 0, NULL},
    {"wait_limit", F_DURATION, OFF(planner.wait_limit), 0, 0, 1e7, NULL, NULL, MIN_EXCL, NULL},
    {"learn", F_BOOL, OFF(planner.learn), 0, 0, 0, NULL, NULL, 0, NULL},
    {"migration_costs", F_PATH, STR(planner.migration_costs), 0, 0, NULL, NULL, EMPTY_OK, NULL},
};
static const struct table planner_table = TABLE(planner_fields);

static const struct field checkpoint_fields[] = {
    {"dir", F_PATH, STR(checkpoint.dir), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"interval", F_DURATION, OFF(checkpoint.interval), 0, 0, 1e7, NULL, NULL, 0, NULL},
    {"keep", F_INT, OFF(checkpoint.keep), 0, 1, 1000, NULL, NULL, 0, NULL},
};
static const struct table checkpoint_table = TABLE(checkpoint_fields);

static const struct field fault_tolerance_fields[] = {
    {"peer_copy_every", F_INT, OFF(fault_tolerance.peer_copy_every), 0, 0, 1000000, NULL, NULL,
     0, NULL},
    {"peer_copy_memory", F_SIZE, OFF(fault_tolerance.peer_copy_memory), 0, 0, 0, NULL, NULL, 0,
     NULL},
    {"peer_copy_background", F_BOOL, OFF(fault_tolerance.peer_copy_background), 0, 0, 0, NULL,
     NULL, 0, NULL},
};
static const struct table fault_tolerance_table = TABLE(fault_tolerance_fields);

static const struct field tls_fields[] = {
    {"cert", F_PATH, STR(coordinator.tls_cert), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"key", F_PATH, STR(coordinator.tls_key), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"client_ca", F_PATH, STR(coordinator.tls_client_ca), 0, 0, NULL, NULL, EMPTY_OK, NULL},
};
static const struct table tls_table = TABLE(tls_fields);

static const struct field coordinator_fields[] = {
    {"listen", F_LISTEN, STR(coordinator.listen), 0, 0, NULL, NULL, 0, NULL},
    {"advertise", F_LISTEN, STR(coordinator.advertise), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"heartbeat_deadline", F_DURATION, OFF(coordinator.heartbeat_deadline), 0, 0, 3600, NULL,
     NULL, MIN_EXCL, NULL},
    {"reconfig_timeout", F_DURATION, OFF(coordinator.reconfig_timeout), 0, 0, 3600, NULL, NULL,
     MIN_EXCL, NULL},
    {"tls", F_MAP, 0, 0, 0, 0, NULL, &tls_table, 0, NULL},
    {"events_keep", F_INT, OFF(coordinator.events_keep), 0, 100, 100000000, NULL, NULL, 0,
     NULL},
};
static const struct table coordinator_table = TABLE(coordinator_fields);

static const struct field status_fields[] = {
    {"listen", F_LISTEN, STR(status.listen), 0, 0, NULL, NULL, EMPTY_OK, NULL},
    {"token_file", F_PATH, STR(status.token_file), 0, 0, NULL, NULL, EMPTY_OK, NULL},
};
static const struct table status_table = TABLE(status_fields);

static const struct field spec_fields[] = {
    {"model", F_MAP, 0, 0, 0, 0, NULL, &model_table, REQUIRED, NULL},
    {"data", F_MAP, 0, 0, 0, 0, NULL, &data_table, 0, NULL}, /* required unless profile */
    {"training", F_MAP, 0, 0, 0, 0, NULL, &training_table, REQUIRED, NULL},
    {"fleet", F_MAP, 0, 0, 0, 0, NULL, &fleet_table, REQUIRED, NULL},
    {"planner", F_MAP, 0, 0, 0, 0, NULL, &planner_table, 0, NULL},
    {"checkpoint", F_MAP, 0, 0, 0, 0, NULL, &checkpoint_table, 0, NULL},
    {"fault_tolerance", F_MAP, 0, 0, 0, 0, NULL, &fault_tolerance_table, 0, NULL},
    {"coordinator", F_MAP, 0, 0, 0, 0, NULL, &coordinator_table, 0, NULL},
    {"status", F_MAP, 0, 0, 0, 0, NULL, &status_table, 0, NULL},
};
static const struct table spec_table = TABLE(spec_fields);

static const struct field top_fields[] = {
    {"apiVersion", F_STRING, STR(api_version), 0, 0, NULL, NULL, REQUIRED, NULL},
    {"kind", F_STRING, STR(kind), 0, 0, NULL, NULL, REQUIRED, NULL},
    {"metadata", F_MAP, 0, 0, 0, 0, NULL, &metadata_table, REQUIRED, NULL},
    {"spec", F_MAP, 0, 0, 0, 0, NULL, &spec_table, REQUIRED, NULL},
};
static const struct table top_table = TABLE(top_fields);

/* ---- parse state ------------------------------------------------------------------ */

#define SEEN_MAX 256 /* distinct field paths; the format has fewer than 100 */

/* Where each field given in the file is, and whether its value was valid: cross-field
 * checks skip fields that already have an error and point at the right line. */
struct seen {
    char path[96];
    int key_line, key_col;  /* the key */
    int line, col;          /* the value */
    bool ok;
};

struct parse_ctx {
    struct st_spec spec;
    struct spec_errors errs;
    struct spec_tree tree;
    char base_dir[ST_SPEC_PATH_MAX]; /* "" = paths stay as written */
    struct seen seen[SEEN_MAX];
    size_t nseen;
    struct st_error err_store[SPEC_KEEP_ERRS];
};

void spec__error(struct spec_errors *errs, int line, int column, const char *field,
                 const char *fmt, ...) {
    errs->total++;
    if (errs->n >= SPEC_KEEP_ERRS)
        return;
    struct st_error *e = &errs->v[errs->n++];
    snprintf(e->file, sizeof(e->file), "%s", errs->file);
    e->line = line;
    e->column = column;
    snprintf(e->field, sizeof(e->field), "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
}

static struct seen *seen_find(struct parse_ctx *c, const char *path) {
    for (size_t i = 0; i < c->nseen; i++)
        if (strcmp(c->seen[i].path, path) == 0)
            return &c->seen[i];
    return NULL;
}

static struct seen *seen_add(struct parse_ctx *c, const char *path, int key, int value) {
    if (c->nseen >= SEEN_MAX)
        return NULL; /* cannot happen: paths come from the tables */
    struct seen *s = &c->seen[c->nseen++];
    snprintf(s->path, sizeof(s->path), "%s", path);
    const struct spec_node *k = key >= 0 ? &c->tree.nodes[key] : NULL;
    const struct spec_node *v = &c->tree.nodes[value];
    s->key_line = k ? k->line : v->line;
    s->key_col = k ? k->column : v->column;
    s->line = v->line;
    s->col = v->column;
    s->ok = true;
    return s;
}

/* True when the field was given and its value was valid. */
static bool given(struct parse_ctx *c, const char *path) {
    struct seen *s = seen_find(c, path);
    return s && s->ok;
}

/* True when the field's value may be used by a cross check: valid or defaulted. */
static bool usable(struct parse_ctx *c, const char *path) {
    struct seen *s = seen_find(c, path);
    return !s || s->ok;
}

/* ---- helpers ---------------------------------------------------------------------- */

int spec__edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return 100;
    int d[65][65];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = ST_MIN(d[i - 1][j] + 1, d[i][j - 1] + 1);
            v = ST_MIN(v, d[i - 1][j - 1] + cost);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                v = ST_MIN(v, d[i - 2][j - 2] + 1);
            d[i][j] = v;
        }
    return ST_MIN(d[la][lb], 100);
}

/* The closest key in the table, when it is close enough to be a likely typo. */
static const char *suggest_key(const struct table *t, const char *key) {
    const char *best = NULL;
    int best_d = 100;
    for (size_t i = 0; i < t->n; i++) {
        int d = spec__edit_distance(key, t->fields[i].key);
        if (d < best_d) {
            best_d = d;
            best = t->fields[i].key;
        }
    }
    int limit = ST_MIN(3, 1 + (int)strlen(key) / 5);
    return best_d <= limit ? best : NULL;
}

static bool is_null(const struct spec_tree *t, int n) {
    const struct spec_node *node = &t->nodes[n];
    if (node->type != SPEC_SCALAR || !node->plain)
        return false;
    const char *s = spec__text(t, n);
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
           !strcmp(s, "NULL");
}

/* "'text'", "an empty value", "a mapping" or "a list", for "expected X, found Y". */
static const char *describe(const struct spec_tree *t, int n, char *buf, size_t size) {
    const struct spec_node *node = &t->nodes[n];
    if (node->type == SPEC_MAPPING)
        return "a mapping";
    if (node->type == SPEC_SEQUENCE)
        return "a list";
    if (is_null(t, n))
        return "an empty value";
    const char *s = spec__text(t, n);
    if (strlen(s) > 40)
        snprintf(buf, size, "'%.37s...'", s);
    else
        snprintf(buf, size, "'%s'", s);
    return buf;
}

static void join_path(char *buf, size_t size, const char *parent, const char *key) {
    if (parent[0])
        snprintf(buf, size, "%s.%s", parent, key);
    else
        snprintf(buf, size, "%s", key);
}

static void names_list(const char *const *names, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; names[i]; i++) {
        int w = snprintf(buf + used, size - used, "%s%s", i ? ", " : "", names[i]);
        if (w < 0 || (size_t)w >= size - used)
            break;
        used += (size_t)w;
    }
}

/* Formats a bounds error for a field's [min, max] with its exclusivity flags. */
static void range_error(struct parse_ctx *c, const struct spec_node *n, const char *path,
                        const struct field *f, bool integer, const char *found) {
    char lo[32], hi[32], why[96] = "";
    snprintf(lo, sizeof(lo), integer ? "%.0f" : "%g", f->min);
    snprintf(hi, sizeof(hi), integer ? "%.0f" : "%g", f->max);
    if (f->why)
        snprintf(why, sizeof(why), " (%s)", f->why);
    bool has_max = f->max > f->min;
    if (integer && has_max)
        spec__error(&c->errs, n->line, n->column, path, "must be between %s and %s%s, found %s",
                    lo, hi, why, found);
    else if (has_max)
        spec__error(&c->errs, n->line, n->column, path, "must be in %c%s, %s%c%s, found %s",
                    f->flags & MIN_EXCL ? '(' : '[', lo, hi, f->flags & MAX_EXCL ? ')' : ']',
                    why, found);
    else
        spec__error(&c->errs, n->line, n->column, path, "must be at least %s%s, found %s", lo,
                    why, found);
}

static bool in_range(const struct field *f, double v) {
    if (f->max <= f->min) /* only a lower bound */
        return v >= f->min;
    if (f->flags & MIN_EXCL ? v <= f->min : v < f->min)
        return false;
    if (f->flags & MAX_EXCL ? v >= f->max : v > f->max)
        return false;
    return true;
}

static bool parse_int(const char *s, long long *ret) {
    if (!*s || isspace((unsigned char)*s))
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end)
        return false;
    *ret = v;
    return true;
}

static bool parse_u64(const char *s, uint64_t *ret) {
    if (!isdigit((unsigned char)*s))
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return false;
    *ret = v;
    return true;
}

static bool parse_double(const char *s, double *ret) {
    const char *p = s;
    if (*p == '-' || *p == '+')
        p++;
    /* Decimal numbers only: no hex floats, inf or nan. */
    if (!isdigit((unsigned char)*p) && !(*p == '.' && isdigit((unsigned char)p[1])))
        return false;
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X'))
        return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return false;
    *ret = v;
    return true;
}

/* True when s is HOST:PORT with a non-empty host (or [v6]) and a port in 0..65535. */
static bool valid_listen(const char *s) {
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s)
        return false;
    if (s[0] == '[' && colon[-1] != ']')
        return false;
    for (const char *p = s; p < colon; p++)
        if (isspace((unsigned char)*p) || *p == '/')
            return false;
    long long port;
    if (!parse_int(colon + 1, &port) || colon[1] == '+' || colon[1] == '-')
        return false;
    return port >= 0 && port <= 65535;
}

/* Kubernetes-style name: [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters. */
static bool valid_name(const char *s) {
    size_t len = strlen(s);
    if (len == 0 || len > 63 || s[0] == '-' || s[len - 1] == '-')
        return false;
    for (size_t i = 0; i < len; i++)
        if (!(islower((unsigned char)s[i]) || isdigit((unsigned char)s[i]) || s[i] == '-'))
            return false;
    return true;
}

/* Kubernetes name segment of a qualified name or a label value:
 * [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?, 1..63 characters. */
static bool valid_label_name(const char *s, size_t len) {
    if (len == 0 || len > 63 || !isalnum((unsigned char)s[0]) ||
        !isalnum((unsigned char)s[len - 1]))
        return false;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.')
            return false;
    return true;
}

/* DNS subdomain (RFC 1123): lower-case alphanumerics, '-' and '.', at most 253. */
static bool valid_subdomain(const char *s, size_t len) {
    if (len == 0 || len > 253 || !isalnum((unsigned char)s[0]) ||
        !isalnum((unsigned char)s[len - 1]))
        return false;
    for (size_t i = 0; i < len; i++)
        if (!(islower((unsigned char)s[i]) || isdigit((unsigned char)s[i]) || s[i] == '-' ||
              s[i] == '.'))
            return false;
    return true;
}

/* A label key or resource name: [DNS-subdomain/]name. */
static bool valid_qualified_name(const char *s) {
    const char *slash = strchr(s, '/');
    if (!slash)
        return valid_label_name(s, strlen(s));
    return valid_subdomain(s, (size_t)(slash - s)) && valid_label_name(slash + 1, strlen(slash + 1));
}

/* A label value: empty or a name segment. */
static bool valid_label_value(const char *s) {
    return !*s || valid_label_name(s, strlen(s));
}

/* A Kubernetes quantity without sign: digits[.digits] and an optional suffix (binary Ki..Ei,
 * decimal n u m k M G T P E, or an exponent e/E[+-]digits). "1", "500m", "16Gi", "1.5". */
static bool valid_quantity(const char *s) {
    const char *p = s;
    if (!isdigit((unsigned char)*p) && !(*p == '.' && isdigit((unsigned char)p[1])))
        return false;
    while (isdigit((unsigned char)*p))
        p++;
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p))
            p++;
    }
    if (!*p)
        return true;
    static const char *const suffixes[] = {"Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m",
                                           "k", "M", "G", "T", "P", "E", NULL};
    for (size_t i = 0; suffixes[i]; i++)
        if (!strcmp(p, suffixes[i]))
            return true;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!isdigit((unsigned char)*p))
            return false;
        while (isdigit((unsigned char)*p))
            p++;
        return !*p;
    }
    return false;
}

/* Resolves a path relative to base_dir into out; false when the result does not fit. */
static bool resolve_path(const struct parse_ctx *c, const char *p, char *out, size_t size) {
    int w;
    /* An object-store URL (checkpoint.dir: s3://BUCKET/PREFIX, gs://BUCKET/PREFIX,
     * az://ACCOUNT/CONTAINER/PREFIX) is not relative to anything. */
    if (p[0] == '/' || !c->base_dir[0] || strncmp(p, "s3://", 5) == 0 ||
        strncmp(p, "gs://", 5) == 0 || strncmp(p, "az://", 5) == 0)
        w = snprintf(out, size, "%s", p);
    else
        w = snprintf(out, size, "%s/%s", c->base_dir, p);
    return w >= 0 && (size_t)w < size;
}

/* ---- the walker ------------------------------------------------------------------- */

static void walk_map(struct parse_ctx *c, const struct table *t, int node, const char *path);

/* Reads a scalar value for a field; reports and returns NULL when it is not one. */
static const char *scalar_or_error(struct parse_ctx *c, int v, const char *path,
                                   const char *expected) {
    const struct spec_node *n = &c->tree.nodes[v];
    if (n->alias)
        return NULL; /* reported where it was found */
    if (n->type != SPEC_SCALAR || is_null(&c->tree, v)) {
        char buf[64];
        spec__error(&c->errs, n->line, n->column, path, "expected %s, found %s", expected,
                    describe(&c->tree, v, buf, sizeof(buf)));
        return NULL;
    }
    return spec__text(&c->tree, v);
}

/* Copies a string value into a fixed buffer of the spec; reports what does not fit. */
static bool store_string(struct parse_ctx *c, const struct field *f, int v, const char *path,
                         const char *s) {
    const struct spec_node *n = &c->tree.nodes[v];
    if (strlen(s) != n->len) {
        spec__error(&c->errs, n->line, n->column, path, "contains a NUL character");
        return false;
    }
    if (!*s && !(f->flags & EMPTY_OK)) {
        spec__error(&c->errs, n->line, n->column, path, "must not be empty");
        return false;
    }
    if (n->len >= f->size) {
        spec__error(&c->errs, n->line, n->column, path,
                    "too long (%zu characters; at most %zu)", n->len, f->size - 1);
        return false;
    }
    memcpy((char *)&c->spec + f->off, s, n->len + 1);
    return true;
}

/* fleet.kubernetes.node_selector / resources: a mapping of qualified names to label values
 * (or quantities with QUANTITY), at most ST_SPEC_MAX_KV entries, no duplicates. Kubernetes
 * would reject anything else when the pod is created, long after the job started. */
static bool parse_kv(struct parse_ctx *c, const struct field *f, int v, const char *path) {
    const struct spec_node *n = &c->tree.nodes[v];
    struct st_spec_kv_list *list = (struct st_spec_kv_list *)((char *)&c->spec + f->off);
    char buf[64];
    bool ok = true;

    if (n->type != SPEC_MAPPING) {
        spec__error(&c->errs, n->line, n->column, path, "expected a mapping, found %s",
                    describe(&c->tree, v, buf, sizeof(buf)));
        return false;
    }
    list->n = 0;
    for (int k = n->first; k >= 0; k = c->tree.nodes[k].next) {
        int val = c->tree.nodes[k].next;
        if (val < 0)
            break;
        const struct spec_node *kn = &c->tree.nodes[k], *vn = &c->tree.nodes[val];
        int key_node = k;
        const char *key = scalar_or_error(c, k, path, "a name");
        const char *value = key ? scalar_or_error(c, val, path, f->flags & QUANTITY ?
                                                  "a quantity like '1', '500m' or '16Gi'" :
                                                  "a label value") : NULL;
        k = val;
        if (!key || !value) {
            ok = false;
            continue;
        }
        if (list->n >= ST_SPEC_MAX_KV) {
            spec__error(&c->errs, kn->line, kn->column, path, "more than %d entries",
                        ST_SPEC_MAX_KV);
            return false;
        }
        if (strlen(key) != kn->len || kn->len >= sizeof(list->v[0].key) ||
            !valid_qualified_name(key)) {
            spec__error(&c->errs, kn->line, kn->column, path,
                        "invalid name %s (an optional DNS-subdomain prefix and '/', then at most "
                        "63 letters, digits, '-', '_' or '.')",
                        describe(&c->tree, key_node, buf, sizeof(buf)));
            ok = false;
            continue;
        }
        bool good = strlen(value) == vn->len && vn->len < sizeof(list->v[0].value) &&
                    (f->flags & QUANTITY ? valid_quantity(value) : valid_label_value(value));
        if (!good) {
            spec__error(&c->errs, vn->line, vn->column, path,
                        f->flags & QUANTITY ? "invalid quantity %s for '%s' (expected a number "
                                              "with an optional suffix like m, Ki, Mi or Gi)"
                                            : "invalid label value %s for '%s' (at most 63 "
                                              "letters, digits, '-', '_' or '.')",
                        describe(&c->tree, val, buf, sizeof(buf)), key);
            ok = false;
            continue;
        }
        for (int i = 0; i < list->n; i++)
            if (!strcmp(list->v[i].key, key)) {
                spec__error(&c->errs, kn->line, kn->column, path, "duplicate key '%s'", key);
                good = false;
            }
        if (!good) {
            ok = false;
            continue;
        }
        snprintf(list->v[list->n].key, sizeof(list->v[0].key), "%s", key);
        snprintf(list->v[list->n].value, sizeof(list->v[0].value), "%s", value);
        list->n++;
    }
    return ok;
}

/* One toleration mapping: key, operator (Equal | Exists), value, effect, toleration_seconds,
 * with the pod API's own rules (Exists takes no value; an empty key needs Exists;
 * toleration_seconds only with NoExecute). */
static bool parse_toleration(struct parse_ctx *c, int m, const char *path,
                             struct st_spec_toleration *t) {
    static const char *const ops[] = {"Equal", "Exists", NULL};
    static const char *const effects[] = {"NoSchedule", "PreferNoSchedule", "NoExecute", NULL};
    const struct spec_node *mn = &c->tree.nodes[m];
    char buf[64], list[96];
    bool ok = true, has_op = false;

    memset(t, 0, sizeof(*t));
    t->seconds = -1;
    snprintf(t->op, sizeof(t->op), "Equal");
    for (int k = mn->first; k >= 0; k = c->tree.nodes[k].next) {
        int v = c->tree.nodes[k].next;
        if (v < 0)
            break;
        const struct spec_node *kn = &c->tree.nodes[k], *vn = &c->tree.nodes[v];
        const char *key = scalar_or_error(c, k, path, "a name");
        const char *val = key ? scalar_or_error(c, v, path, "a string") : NULL;
        k = v;
        if (!key || !val) {
            ok = false;
            continue;
        }
        char fpath[160];
        snprintf(fpath, sizeof(fpath), "%s.%s", path, key);
        bool good = strlen(val) == vn->len;
        if (!strcmp(key, "key")) {
            good = good && vn->len < sizeof(t->key) && valid_qualified_name(val);
            if (good)
                snprintf(t->key, sizeof(t->key), "%s", val);
            else
                spec__error(&c->errs, vn->line, vn->column, fpath, "invalid taint key %s",
                            describe(&c->tree, v, buf, sizeof(buf)));
        } else if (!strcmp(key, "operator") || !strcmp(key, "effect")) {
            const char *const *names = key[0] == 'o' ? ops : effects;
            good = false;
            for (size_t i = 0; names[i]; i++)
                if (!strcmp(val, names[i]))
                    good = true;
            if (good && key[0] == 'o') {
                snprintf(t->op, sizeof(t->op), "%s", val);
                has_op = true;
            } else if (good) {
                snprintf(t->effect, sizeof(t->effect), "%s", val);
            } else {
                names_list(names, list, sizeof(list));
                spec__error(&c->errs, vn->line, vn->column, fpath,
                            "invalid value %s (expected one of: %s)",
                            describe(&c->tree, v, buf, sizeof(buf)), list);
            }
        } else if (!strcmp(key, "value")) {
            good = good && vn->len < sizeof(t->value) && valid_label_value(val);
            if (good)
                snprintf(t->value, sizeof(t->value), "%s", val);
            else
                spec__error(&c->errs, vn->line, vn->column, fpath, "invalid taint value %s",
                            describe(&c->tree, v, buf, sizeof(buf)));
        } else if (!strcmp(key, "toleration_seconds")) {
            long long x;
            good = parse_int(val, &x) && x >= 0;
            if (good)
                t->seconds = x;
            else
                spec__error(&c->errs, vn->line, vn->column, fpath,
                            "expected a non-negative integer, found %s",
                            describe(&c->tree, v, buf, sizeof(buf)));
        } else {
            good = false;
            spec__error(&c->errs, kn->line, kn->column, path,
                        "unknown key '%.40s' (expected key, operator, value, effect, "
                        "toleration_seconds)", key);
        }
        ok = ok && good;
    }
    if (!ok)
        return false;
    if (!strcmp(t->op, "Exists") && t->value[0]) {
        spec__error(&c->errs, mn->line, mn->column, path,
                    "operator Exists takes no value (found '%s')", t->value);
        return false;
    }
    if (!t->key[0] && (!has_op || strcmp(t->op, "Exists"))) {
        spec__error(&c->errs, mn->line, mn->column, path,
                    "a toleration without a key needs operator: Exists");
        return false;
    }
    if (t->seconds >= 0 && strcmp(t->effect, "NoExecute")) {
        spec__error(&c->errs, mn->line, mn->column, path,
                    "toleration_seconds needs effect: NoExecute");
        return false;
    }
    return true;
}

static bool parse_tolerations(struct parse_ctx *c, int v, const char *path) {
    const struct spec_node *n = &c->tree.nodes[v];
    struct st_spec_kubernetes *kube = &c->spec.fleet.kubernetes;
    char buf[64];
    bool ok = true;

    if (n->type != SPEC_SEQUENCE) {
        spec__error(&c->errs, n->line, n->column, path,
                    "expected a list of tolerations, found %s",
                    describe(&c->tree, v, buf, sizeof(buf)));
        return false;
    }
    kube->n_tolerations = 0;
    int i = 0;
    for (int m = n->first; m >= 0; m = c->tree.nodes[m].next, i++) {
        const struct spec_node *mn = &c->tree.nodes[m];
        char ipath[128];
        snprintf(ipath, sizeof(ipath), "%s[%d]", path, i);
        if (kube->n_tolerations >= ST_SPEC_MAX_TOLERATIONS) {
            spec__error(&c->errs, mn->line, mn->column, path, "more than %d tolerations",
                        ST_SPEC_MAX_TOLERATIONS);
            return false;
        }
        if (mn->type != SPEC_MAPPING) {
            spec__error(&c->errs, mn->line, mn->column, ipath, "expected a mapping, found %s",
                        describe(&c->tree, m, buf, sizeof(buf)));
            ok = false;
            continue;
        }
        if (parse_toleration(c, m, ipath, &kube->tolerations[kube->n_tolerations]))
            kube->n_tolerations++;
        else
            ok = false;
    }
    return ok;
}

/* Parses one value into the spec. Returns false after reporting an error. */
static bool parse_value(struct parse_ctx *c, const struct field *f, int v, const char *path) {
    const struct spec_node *n = &c->tree.nodes[v];
    char *dst = (char *)&c->spec + f->off;
    char buf[64];
    const char *s;

    switch (f->type) {
    case F_MAP: {
        if (n->type != SPEC_MAPPING) {
            spec__error(&c->errs, n->line, n->column, path, "expected a mapping, found %s",
                        describe(&c->tree, v, buf, sizeof(buf)));
            return false;
        }
        walk_map(c, f->sub, v, path);
        return true;
    }
    case F_SHAPE: {
        if (n->type == SPEC_MAPPING) {
            walk_map(c, f->sub, v, path);
            return true;
        }
        long long x;
        s = scalar_or_error(c, v, path, "an integer or a {min, max} mapping");
        if (!s)
            return false;
        if (!parse_int(s, &x)) {
            spec__error(&c->errs, n->line, n->column, path,
                        "expected an integer or a {min, max} mapping, found %s",
                        describe(&c->tree, v, buf, sizeof(buf)));
            return false;
        }
        if (!in_range(f, (double)x)) {
            range_error(c, n, path, f, true, s);
            return false;
        }
        /* Pinned: the bounds say the same, so code reading either sees it. */
        const struct field *lo = &f->sub->fields[0], *hi = &f->sub->fields[1];
        *(int *)dst = (int)x;
        *(int *)((char *)&c->spec + lo->off) = (int)x;
        *(int *)((char *)&c->spec + hi->off) = (int)x;
        return true;
    }
    case F_ZONES: {
        if (n->type != SPEC_SEQUENCE) {
            spec__error(&c->errs, n->line, n->column, path, "expected a list of zones, found %s",
                        describe(&c->tree, v, buf, sizeof(buf)));
            return false;
        }
        bool ok = true;
        int count = 0;
        for (int z = n->first; z >= 0; z = c->tree.nodes[z].next) {
            const struct spec_node *zn = &c->tree.nodes[z];
            if (count >= ST_SPEC_MAX_ZONES) {
                spec__error(&c->errs, zn->line, zn->column, path, "more than %d zones",
                            ST_SPEC_MAX_ZONES);
                return false;
            }
            s = scalar_or_error(c, z, path, "a zone name");
            if (!s) {
                ok = false;
                continue;
            }
            if (strlen(s) != zn->len || !*s || zn->len >= sizeof(c->spec.fleet.zones[0])) {
                spec__error(&c->errs, zn->line, zn->column, path,
                            "zone names are 1 to %zu characters, found %s",
                            sizeof(c->spec.fleet.zones[0]) - 1,
                            describe(&c->tree, z, buf, sizeof(buf)));
                ok = false;
                continue;
            }
            memcpy(c->spec.fleet.zones[count++], s, zn->len + 1);
        }
        c->spec.fleet.nzones = count;
        return ok;
    }
    case F_KV:
        return parse_kv(c, f, v, path);
    case F_TOLERATIONS:
        return parse_tolerations(c, v, path);
    default:
        break;
    }

    static const char *const expected[] = {
        [F_INT] = "an integer",
        [F_U64] = "a non-negative integer",
        [F_DOUBLE] = "a number",
        [F_BOOL] = "true or false",
        [F_STRING] = "a string",
        [F_PATH] = "a file path",
        [F_DURATION] = "a duration like '60s', '30m' or '2h'",
        [F_SIZE] = "a size like '16GiB' or '512MiB'",
        [F_ENUM] = "a string",
        [F_CHOICE] = "a string",
        [F_LISTEN] = "HOST:PORT",
        [F_NAME] = "a name",
    };
    if (f->type == F_LISTEN && (f->flags & EMPTY_OK) && n->type == SPEC_SCALAR && !n->plain &&
        n->len == 0) {
        dst[0] = '\0'; /* listen: "" turns the server off */
        return true;
    }
    s = scalar_or_error(c, v, path, expected[f->type]);
    if (!s)
        return false;

    switch (f->type) {
    case F_INT: {
        long long x;
        if (!parse_int(s, &x)) {
            spec__error(&c->errs, n->line, n->column, path, "expected an integer, found %s",
                        describe(&c->tree, v, buf, sizeof(buf)));
            return false;
        }
        if (!in_range(f, (double)x) || x > INT_MAX || x < INT_MIN) {
            range_error(c, n, path, f, true, s);
            return false;
        }
        *(int *)dst = (int)x;
        return true;
    }
    case F_U64: {
        uint64_t x;
        if (!parse_u64(s, &x)) {
            spec__error(&c->errs, n->line, n->column, path,
                        "expected a non-negative integer, found %s",
                        describe(&c->tree, v, buf, sizeof(buf)));
            return false;
        }
        if (f->max > f->min && !in_range(f, (double)x)) {
            range_error(c, n, path, f, true, s);
            return false;
        }
        if (x > (uint64_t)INT64_MAX) { /* so JSON (signed 64-bit) carries it exactly */
            spec__error(&c->errs, n->line, n->column, path, "must be at most %lld, found %s",
                        (long long)INT64_MAX, s);
            return false;
        }
        *(uint64_t *)dst = x;
        return true;
    }
    case F_DOUBLE:
    case F_DURATION: {
        double x;
        bool ok = f->type == F_DOUBLE ? parse_double(s, &x) : st_parse_duration(s, &x) == 0;
        if (!ok) {
            spec__error(&c->errs, n->line, n->column, path, "expected %s, found %s",
                        expected[f->type], describe(&c->tree, v, buf, sizeof(buf)));
            return false;
        }
        if (!in_range(f, x)) {
            char found[48];
            if (f->type == F_DURATION)
                snprintf(found, sizeof(found), "%g s", x);
            else
                snprintf(found, sizeof(found), "%s", s);
            range_error(c, n, path, f, false, found);
            return false;
        }
        *(double *)dst = x;
        return true;
    }
    case F_SIZE: {
        uint64_t x;
        if (st_parse_size(s, &x) < 0) {
            spec__error(&c->errs, n->line, n->column, path, "expected %s, found %s",
                        expected[f->type], describe(&c->tree, v, buf, sizeof(buf)));
            return false;
        }
        if (x > (uint64_t)INT64_MAX) {
            spec__error(&c->errs, n->line, n->column, path, "must be at most 8EiB, found %s", s);
            return false;
        }
        *(uint64_t *)dst = x;
        return true;
    }
    case F_BOOL:
        if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")) {
            *(bool *)dst = true;
        } else if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")) {
            *(bool *)dst = false;
        } else {
            spec__error(&c->errs, n->line, n->column, path, "expected true or false, found %s",
                        describe(&c->tree, v, buf, sizeof(buf)));
            return false;
        }
        return true;
    case F_ENUM:
    case F_CHOICE: {
        for (int i = 0; f->names[i]; i++)
            if (!strcmp(s, f->names[i])) {
                if (f->type == F_ENUM)
                    *(int *)dst = i;
                else if (f->size) /* synth.kind has only one value and no field */
                    snprintf(dst, f->size, "%s", s);
                return true;
            }
        char list[160];
        names_list(f->names, list, sizeof(list));
        spec__error(&c->errs, n->line, n->column, path, "invalid value %s (expected one of: %s)",
                    describe(&c->tree, v, buf, sizeof(buf)), list);
        return false;
    }
    case F_LISTEN:
        if (!valid_listen(s)) {
            spec__error(&c->errs, n->line, n->column, path,
                        "expected HOST:PORT with a port from 0 to 65535, found %s",
                        describe(&c->tree, v, buf, sizeof(buf)));
            return false;
        }
        return store_string(c, f, v, path, s);
    case F_NAME:
        if (!valid_name(s)) {
            spec__error(&c->errs, n->line, n->column, path,
                        "invalid name %s (lower-case letters, digits and '-', at most 63, "
                        "starting and ending with a letter or digit)",
                        describe(&c->tree, v, buf, sizeof(buf)));
            return false;
        }
        return store_string(c, f, v, path, s);
    case F_STRING:
        return store_string(c, f, v, path, s);
    case F_PATH: {
        char resolved[ST_SPEC_PATH_MAX];
        if (strlen(s) != n->len || !*s) {
            return store_string(c, f, v, path, s); /* reports NUL or empty */
        }
        if (!resolve_path(c, s, resolved, sizeof(resolved))) {
            spec__error(&c->errs, n->line, n->column, path,
                        "path too long once resolved (at most %d characters)",
                        ST_SPEC_PATH_MAX - 1);
            return false;
        }
        memcpy(dst, resolved, strlen(resolved) + 1);
        return true;
    }
    default:
        return false;
    }
}

/* Applies table t to the mapping `node` whose dotted path is `path` ("" at the top). */
static void walk_map(struct parse_ctx *c, const struct table *t, int node, const char *path) {
    int first_key[32]; /* per field: the key node that set it, -1 = not given */
    const struct spec_node *m = &c->tree.nodes[node];
    char buf[64];

    for (size_t i = 0; i < t->n && i < ST_ARRAY_SIZE(first_key); i++)
        first_key[i] = -1;

    for (int k = m->first; k >= 0; k = c->tree.nodes[k].next) {
        int v = c->tree.nodes[k].next;
        if (v < 0)
            break; /* libyaml always pairs keys with values */
        const struct spec_node *kn = &c->tree.nodes[k];
        if (kn->alias) {
            k = v;
            continue;
        }
        if (kn->type != SPEC_SCALAR || is_null(&c->tree, k)) {
            spec__error(&c->errs, kn->line, kn->column, path,
                        "keys must be plain names, found %s",
                        describe(&c->tree, k, buf, sizeof(buf)));
            k = v;
            continue;
        }
        const char *key = spec__text(&c->tree, k);
        size_t fi = 0;
        while (fi < t->n && strcmp(t->fields[fi].key, key) != 0)
            fi++;
        if (fi == t->n) {
            const char *hint = suggest_key(t, key);
            char shown[48];
            snprintf(shown, sizeof(shown), strlen(key) > 40 ? "%.37s..." : "%s", key);
            if (hint)
                spec__error(&c->errs, kn->line, kn->column, path,
                            "unknown key '%s' (did you mean '%s'?)", shown, hint);
            else
                spec__error(&c->errs, kn->line, kn->column, path, "unknown key '%s'", shown);
            k = v;
            continue;
        }
        const struct field *f = &t->fields[fi];
        char fpath[128];
        join_path(fpath, sizeof(fpath), path, f->key);
        if (first_key[fi] >= 0) {
            spec__error(&c->errs, kn->line, kn->column, path,
                        "duplicate key '%s' (first given on line %d)", key,
                        c->tree.nodes[first_key[fi]].line);
            k = v;
            continue;
        }
        first_key[fi] = k;
        struct seen *s = seen_add(c, fpath, k, v);
        bool ok = !c->tree.nodes[v].alias && parse_value(c, f, v, fpath);
        if (s)
            s->ok = ok;
        k = v;
    }

    for (size_t i = 0; i < t->n; i++)
        if ((t->fields[i].flags & REQUIRED) && first_key[i] < 0)
            spec__error(&c->errs, m->line, m->column, path, "missing required key '%s'",
                        t->fields[i].key);
}

/* ---- cross-field checks ------------------------------------------------------------ */

/* Reports at the given field's value, or at its parent mapping when it was defaulted. */
static void cross_error(struct parse_ctx *c, const char *path, const char *fmt, ...)
    ST_PRINTF(3, 4);
static void cross_error(struct parse_ctx *c, const char *path, const char *fmt, ...) {
    char msg[400], parent[128];
    struct seen *s = seen_find(c, path);
    snprintf(parent, sizeof(parent), "%s", path);
    while (!s) {
        char *dot = strrchr(parent, '.');
        if (!dot)
            break;
        *dot = '\0';
        s = seen_find(c, parent);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    spec__error(&c->errs, s ? s->line : 1, s ? s->col : 1, path, "%s", msg);
}

/* A missing key whose requirement depends on another field: reported at the parent. */
static void missing_error(struct parse_ctx *c, const char *parent, const char *key,
                          const char *why) {
    struct seen *s = seen_find(c, parent);
    spec__error(&c->errs, s ? s->line : 1, s ? s->col : 1, parent,
                "missing required key '%s' (%s)", key, why);
}

/* A file the job reads must exist and be a regular file. */
static void check_file(struct parse_ctx *c, const char *path, const char *file) {
    struct stat st;
    if (!file[0] || !given(c, path))
        return;
    if (stat(file, &st) < 0)
        cross_error(c, path, "cannot access '%s': %s", file, st_strerror(errno));
    else if (!S_ISREG(st.st_mode))
        cross_error(c, path, "'%s' is not a regular file", file);
}

static void check_cross(struct parse_ctx *c) {
    struct st_spec *s = &c->spec;
    bool gpt = !s->model.profile[0] && usable(c, "spec.model.profile");

    if (given(c, "spec.model")) {
        static const char *const gpt_keys[] = {"layers", "hidden", "heads", "vocab", "seq_len"};
        char p[64];
        if (gpt)
            for (size_t i = 0; i < ST_ARRAY_SIZE(gpt_keys); i++) {
                snprintf(p, sizeof(p), "spec.model.%s", gpt_keys[i]);
                if (!seen_find(c, p))
                    missing_error(c, "spec.model", gpt_keys[i],
                                  "the built-in GPT needs it unless 'profile' is set");
            }
        if (given(c, "spec.model.profile_model") && s->model.profile_model[0] &&
            !s->model.profile[0] && usable(c, "spec.model.profile"))
            cross_error(c, "spec.model.profile_model", "is only used with 'profile'");
        if (given(c, "spec.model.hidden") && given(c, "spec.model.heads") &&
            s->model.hidden % s->model.heads != 0)
            cross_error(c, "spec.model.heads", "heads (%d) must divide hidden (%d)",
                        s->model.heads, s->model.hidden);
    }

    if (gpt && given(c, "spec") && !seen_find(c, "spec.data"))
        missing_error(c, "spec", "data", "training the built-in GPT needs token files");

    if (usable(c, "spec.training.global_batch") && usable(c, "spec.training.micro_batch") &&
        s->training.global_batch > 0 && s->training.global_batch % s->training.micro_batch)
        cross_error(c, "spec.training.micro_batch",
                    "global_batch (%d) is not a multiple of micro_batch (%d)",
                    s->training.global_batch, s->training.micro_batch);
    if (given(c, "spec.training.optimizer.warmup_steps") && given(c, "spec.training.steps") &&
        s->training.optimizer.warmup_steps > s->training.steps)
        cross_error(c, "spec.training.optimizer.warmup_steps",
                    "warmup_steps (%d) exceeds steps (%d)", s->training.optimizer.warmup_steps,
                    s->training.steps);

    if (given(c, "spec.fleet")) {
        bool sim = s->fleet.provider == ST_PROVIDER_SIM;
        if (usable(c, "spec.fleet.provider") && sim && !s->fleet.trace[0]) {
            if (given(c, "spec.fleet.trace"))
                cross_error(c, "spec.fleet.trace", "must not be empty: the sim provider "
                                                   "replays a trace");
            else if (!seen_find(c, "spec.fleet.trace"))
                missing_error(c, "spec.fleet", "trace", "the sim provider replays a trace");
        }
        bool kube = s->fleet.provider == ST_PROVIDER_KUBERNETES;
        /* Pods ask for resources (fleet.kubernetes.resources), not an instance type. */
        if (usable(c, "spec.fleet.provider") && !sim && !kube && !s->fleet.instance_type[0]) {
            if (given(c, "spec.fleet.instance_type"))
                cross_error(c, "spec.fleet.instance_type",
                            "must not be empty: needed by cloud providers");
            else if (!seen_find(c, "spec.fleet.instance_type"))
                missing_error(c, "spec.fleet", "instance_type", "needed by cloud providers");
        }
        /* The notice a provider gives before it takes an instance: EC2's two minutes,
         * GCE's and Azure's thirty seconds. The planner plans with it. */
        if (usable(c, "spec.fleet.provider") && !seen_find(c, "spec.fleet.notice") &&
            (s->fleet.provider == ST_PROVIDER_GCP || s->fleet.provider == ST_PROVIDER_AZURE))
            s->fleet.notice_seconds = 30;
        static const struct {
            enum st_provider provider;
            const char *field, *path, *why;
            size_t off;
        } needs[] = {
            {ST_PROVIDER_GCP, "project", "spec.fleet.project", "the GCP project",
             OFF(fleet.project)},
            {ST_PROVIDER_AZURE, "subscription", "spec.fleet.subscription",
             "the Azure subscription id", OFF(fleet.subscription)},
            {ST_PROVIDER_AZURE, "resource_group", "spec.fleet.resource_group",
             "the resource group the VMs are created in", OFF(fleet.resource_group)},
            {ST_PROVIDER_AZURE, "location", "spec.fleet.location", "the Azure region",
             OFF(fleet.location)},
            {ST_PROVIDER_AZURE, "azure.subnet", "spec.fleet.azure.subnet",
             "the subnet resource id the VMs' network interfaces join", OFF(fleet.azure_subnet)},
        };
        for (size_t i = 0; i < ST_ARRAY_SIZE(needs); i++) {
            if (!usable(c, "spec.fleet.provider") || s->fleet.provider != needs[i].provider ||
                ((const char *)s + needs[i].off)[0])
                continue;
            if (given(c, needs[i].path))
                cross_error(c, needs[i].path, "must not be empty: %s", needs[i].why);
            else if (!seen_find(c, needs[i].path))
                missing_error(c, "spec.fleet", needs[i].field, needs[i].why);
        }
        const char *pc = s->fleet.kubernetes.priority_class;
        if (given(c, "spec.fleet.kubernetes.priority_class") && pc[0] &&
            !valid_subdomain(pc, strlen(pc)))
            cross_error(c, "spec.fleet.kubernetes.priority_class",
                        "invalid PriorityClass name '%s' (lower-case letters, digits, '-' and "
                        "'.', at most 253)", pc);
        if (given(c, "spec.fleet.max") && usable(c, "spec.fleet.min") &&
            s->fleet.min > s->fleet.max)
            cross_error(c, "spec.fleet.min", "min (%d) is greater than max (%d)", s->fleet.min,
                        s->fleet.max);
    }

    static const struct {
        const char *path, *name;
        size_t lo, hi, pin;
    } shapes[] = {
        {"spec.planner.dp", "dp", OFF(planner.dp_min), OFF(planner.dp_max), OFF(planner.dp)},
        {"spec.planner.pp", "pp", OFF(planner.pp_min), OFF(planner.pp_max), OFF(planner.pp)},
    };
    for (size_t i = 0; i < ST_ARRAY_SIZE(shapes); i++) {
        char p[64];
        int lo = *(int *)((char *)s + shapes[i].lo), hi = *(int *)((char *)s + shapes[i].hi);
        snprintf(p, sizeof(p), "%s.min", shapes[i].path);
        bool ok = usable(c, shapes[i].path) && usable(c, p);
        snprintf(p, sizeof(p), "%s.max", shapes[i].path);
        ok = ok && usable(c, p);
        if (ok && lo && hi && lo > hi)
            cross_error(c, shapes[i].path, "min (%d) is greater than max (%d)", lo, hi);
    }
    /* Each pipeline stage holds at least one layer. */
    int pp_top = s->planner.pp_max;
    if (gpt && pp_top > 0 && given(c, "spec.model.layers") && usable(c, "spec.planner.pp") &&
        usable(c, "spec.planner.pp.max") && pp_top > s->model.layers)
        cross_error(c, "spec.planner.pp",
                    "%s (%d) exceeds model.layers (%d); every pipeline stage needs a layer",
                    s->planner.pp ? "pinned pp" : "pp max", pp_top, s->model.layers);
    if (s->planner.dp && s->planner.pp && given(c, "spec.fleet.max") &&
        usable(c, "spec.fleet.gpus_per_instance") &&
        (long)s->planner.dp * s->planner.pp >
            (long)s->fleet.max * s->fleet.gpus_per_instance)
        cross_error(c, "spec.planner.dp",
                    "pinned shape dp x pp = %d x %d needs %d GPUs, but fleet.max x "
                    "gpus_per_instance is %d",
                    s->planner.dp, s->planner.pp, s->planner.dp * s->planner.pp,
                    s->fleet.max * s->fleet.gpus_per_instance);

    /* Files the job reads. data.train may be missing when data.synth will make it. */
    if (!s->data.synth)
        check_file(c, "spec.data.train", s->data.train);
    check_file(c, "spec.data.val", s->data.val);
    check_file(c, "spec.fleet.trace", s->fleet.trace);
    check_file(c, "spec.model.profile", s->model.profile);
    check_file(c, "spec.status.token_file", s->status.token_file);
    check_file(c, "spec.coordinator.tls.cert", s->coordinator.tls_cert);
    check_file(c, "spec.coordinator.tls.key", s->coordinator.tls_key);
    check_file(c, "spec.coordinator.tls.client_ca", s->coordinator.tls_client_ca);
    /* TLS needs the certificate and its key together; a client CA only makes sense with both. */
    if (usable(c, "spec.coordinator.tls.cert") && usable(c, "spec.coordinator.tls.key") &&
        usable(c, "spec.coordinator.tls.client_ca")) {
        const struct st_spec_coordinator *co = &s->coordinator;
        if (co->tls_cert[0] && !co->tls_key[0])
            missing_error(c, "spec.coordinator.tls", "key", "cert needs its private key");
        else if (co->tls_key[0] && !co->tls_cert[0])
            missing_error(c, "spec.coordinator.tls", "cert", "key needs its certificate");
        else if (co->tls_client_ca[0] && !co->tls_cert[0])
            missing_error(c, "spec.coordinator.tls", "cert",
                          "client_ca needs the server's cert and key");
    }

    if (given(c, "apiVersion") && strcmp(s->api_version, "spottrain/v1") != 0)
        cross_error(c, "apiVersion", "unsupported apiVersion '%s' (expected 'spottrain/v1')",
                    s->api_version);
    if (given(c, "kind") && strcmp(s->kind, "TrainingJob") != 0)
        cross_error(c, "kind", "unsupported kind '%s' (expected 'TrainingJob')", s->kind);
}

/* ---- public API ------------------------------------------------------------------- */

void st_spec_defaults(struct st_spec *spec) {
    memset(spec, 0, sizeof(*spec));
    snprintf(spec->api_version, sizeof(spec->api_version), "spottrain/v1");
    snprintf(spec->kind, sizeof(spec->kind), "TrainingJob");
    spec->data.synth_order = 2;
    spec->data.synth_seed = 1;
    spec->data.synth_tokens = 1000000;
    spec->training.micro_batch = 1;
    spec->training.seed = 1337;
    spec->training.precision = ST_PRECISION_FP32;
    struct st_spec_optimizer *o = &spec->training.optimizer;
    snprintf(o->name, sizeof(o->name), "adamw");
    o->lr = 3e-4;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->weight_decay = 0.1;
    o->grad_clip = 1.0;
    o->warmup_steps = 0;
    o->schedule = ST_LR_COSINE;
    o->min_lr_ratio = 0.1;
    spec->fleet.provider = ST_PROVIDER_SIM;
    spec->fleet.gpus_per_instance = 1;
    spec->fleet.min = 1;
    spec->fleet.spot = true;
    spec->fleet.time_scale = 1.0;
    spec->fleet.notice_seconds = 120;
    spec->fleet.unannounced = 0;
    spec->fleet.spot_price = 0.918;   /* p3.2xlarge spot, us-east-1 (the trace's fleet) */
    spec->fleet.on_demand_price = 3.06; /* p3.2xlarge on demand, us-east-1 */
    spec->fleet.gpu_memory = 16ull << 30; /* V100-16GB */
    spec->fleet.gpu_tflops = 0.05;    /* what a CPU worker of the sim sustains */
    spec->fleet.net_gbps = 10;
    spec->fleet.data_plane_overlap = true;
    spec->fleet.prewarm = true;
    spec->planner.interval = 60;
    spec->planner.lookahead = 12;
    snprintf(spec->planner.predictor, sizeof(spec->planner.predictor), "notice");
    spec->planner.wait_limit = 1800;
    spec->planner.learn = true;
    spec->checkpoint.interval = 1800;
    spec->checkpoint.keep = 2;
    /* Measured on the quickstart (8 CPU workers on 2 cores, `SPOTTRAIN_DEBUG=info spottrain
     * run examples/quickstart.yaml --steps 300`, the peer-copy notices' seconds): a copy takes
     * a median 3.4 ms against about 75 ms per step. Every 10 steps costs about 0.5% and keeps
     * the replay after a loss under 20 steps (two generations are kept). */
    spec->fault_tolerance.peer_copy_every = 10;
    spec->fault_tolerance.peer_copy_memory = 4ull << 30;
    spec->fault_tolerance.peer_copy_background = true;
    snprintf(spec->coordinator.listen, sizeof(spec->coordinator.listen), "127.0.0.1:7070");
    spec->coordinator.heartbeat_deadline = 10;
    spec->coordinator.reconfig_timeout = 30;
    spec->coordinator.events_keep = 10000;
    snprintf(spec->status.listen, sizeof(spec->status.listen), "127.0.0.1:8080");
}

const char *st_provider_name(enum st_provider p) {
    if ((unsigned)p < ST_ARRAY_SIZE(provider_names) - 1)
        return provider_names[p];
    return "unknown";
}

/* Sorts errors by position; stable, so errors at one position keep the order found. */
static void sort_errors(struct st_error *v, size_t n) {
    for (size_t i = 1; i < n; i++) {
        struct st_error tmp = v[i];
        size_t j = i;
        while (j > 0 && (v[j - 1].line > tmp.line ||
                         (v[j - 1].line == tmp.line && v[j - 1].column > tmp.column))) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = tmp;
    }
}

/* The parse behind st_spec_parse and st_spec_load; base_dir "" keeps paths as written. */
static int spec_parse(const char *name, const char *base_dir, const char *spec_path,
                      const char *data, size_t len, struct st_spec *ret_spec,
                      struct st_error *errs, size_t max_errs, size_t *ret_nerrs) {
    int r = 0;
    struct parse_ctx *c = st_calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->errs.file = name;
    c->errs.v = c->err_store;
    snprintf(c->base_dir, sizeof(c->base_dir), "%s", base_dir);
    st_spec_defaults(&c->spec);
    snprintf(c->spec.path, sizeof(c->spec.path), "%s", spec_path);

    if (len > SPEC_MAX_BYTES) {
        spec__error(&c->errs, 0, 0, NULL, "file is too large (%zu bytes; the limit is 1 MiB)",
                    len);
        goto report;
    }
    r = spec__parse_yaml(data, len, &c->tree, &c->errs);
    if (r < 0)
        goto out;
    if (r == 0 && c->tree.root >= 0) {
        int root = c->tree.root;
        const struct spec_node *rn = &c->tree.nodes[root];
        if (rn->type != SPEC_MAPPING) {
            char buf[64];
            spec__error(&c->errs, rn->line, rn->column, NULL,
                        "expected a mapping with apiVersion, kind, metadata and spec at the "
                        "top level, found %s",
                        describe(&c->tree, root, buf, sizeof(buf)));
        } else {
            seen_add(c, "", -1, root);
            walk_map(c, &top_table, root, "");
            if (given(c, "spec.data.synth"))
                c->spec.data.synth = true;
            check_cross(c);
        }
    }
    r = 0;

    if (!c->spec.checkpoint.dir[0] && c->spec.name[0])
        snprintf(c->spec.checkpoint.dir, sizeof(c->spec.checkpoint.dir),
                 "/tmp/spottrain/%s/checkpoints", c->spec.name);

report:
    if (c->errs.total > 0) {
        sort_errors(c->errs.v, c->errs.n);
        if (errs)
            for (size_t i = 0; i < c->errs.n && i < max_errs; i++)
                errs[i] = c->errs.v[i];
        if (ret_nerrs)
            *ret_nerrs = c->errs.total;
        r = -EINVAL;
        goto out;
    }
    if (ret_nerrs)
        *ret_nerrs = 0;
    /* Keep the positions: checks made after parsing (the planner's feasibility) name them. */
    for (size_t i = 0; i < c->nseen && c->spec.nwhere < ST_SPEC_MAX_WHERE; i++) {
        struct st_spec_where *w = &c->spec.where[c->spec.nwhere];
        if (!c->seen[i].path[0] || strlen(c->seen[i].path) >= sizeof(w->path))
            continue;
        snprintf(w->path, sizeof(w->path), "%s", c->seen[i].path);
        w->line = c->seen[i].line;
        w->column = c->seen[i].col;
        c->spec.nwhere++;
    }
    if (ret_spec)
        *ret_spec = c->spec;
out:
    spec__tree_done(&c->tree);
    st_free(c);
    return r;
}

int st_spec_parse(const char *name, const char *data, size_t len, struct st_spec *ret_spec,
                  struct st_error *errs, size_t max_errs, size_t *ret_nerrs) {
    char dir[ST_SPEC_PATH_MAX];
    if (!name || (!data && len))
        return -EINVAL;
    snprintf(dir, sizeof(dir), "%s", name);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        dir[0] = '\0'; /* relative to the current directory: keep paths as written */
    return spec_parse(name, dir, name, data ? data : "", len, ret_spec, errs, max_errs,
                      ret_nerrs);
}

int st_spec_load(const char *path, struct st_spec *ret_spec, struct st_error *errs,
                 size_t max_errs, size_t *ret_nerrs) {
    char *data = NULL;
    size_t len = 0;
    int r;
    if (!path)
        return -EINVAL;
    struct stat st;
    /* fopen() accepts a directory and fread() then fails with a vague EIO: say it first. */
    r = stat(path, &st) < 0 ? -errno : S_ISDIR(st.st_mode) ? -EISDIR : 0;
    if (r == 0)
        r = st_read_file(path, SPEC_MAX_BYTES, &data, &len);
    if (r == -EFBIG) {
        if (errs && max_errs > 0)
            st_error_set(&errs[0], path, 0, 0, NULL, "file is too large (the limit is 1 MiB)");
        if (ret_nerrs)
            *ret_nerrs = 1;
        return -EINVAL;
    }
    if (r < 0) {
        if (errs && max_errs > 0)
            st_error_set(&errs[0], path, 0, 0, NULL, "cannot read the job spec: %s",
                         st_strerror(r));
        if (ret_nerrs)
            *ret_nerrs = 1;
        return r;
    }

    /* Absolute paths, so workers that change directory still find the files. */
    char real[PATH_MAX], dir[PATH_MAX];
    if (!realpath(path, real))
        snprintf(real, sizeof(real), "%s", path);
    snprintf(dir, sizeof(dir), "%s", real);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        dir[0] = '\0';
    r = spec_parse(path, dir, real, data, len, ret_spec, errs, max_errs, ret_nerrs);
    st_free(data);
    return r;
}

/* ---- JSON ------------------------------------------------------------------------- */

/* json_object_set_new that records failure instead of leaking. */
static void jset(json_t *o, const char *k, json_t *v, bool *ok) {
    if (!v || json_object_set_new(o, k, v) < 0)
        *ok = false;
}

static json_t *shape_json(int pinned, int lo, int hi, bool *ok) {
    json_t *o = json_object();
    if (!o) {
        *ok = false;
        return NULL;
    }
    jset(o, "pinned", json_integer(pinned), ok);
    jset(o, "min", json_integer(lo), ok);
    jset(o, "max", json_integer(hi), ok);
    return o;
}

static json_t *kv_json(const struct st_spec_kv_list *l, bool *ok) {
    json_t *o = json_object();
    for (int i = 0; o && i < l->n; i++)
        jset(o, l->v[i].key, json_string(l->v[i].value), ok);
    if (!o)
        *ok = false;
    return o;
}

static json_t *kubernetes_json(const struct st_spec_kubernetes *k, bool *ok) {
    json_t *o = json_object(), *tols = json_array();
    if (!o || !tols) {
        json_decref(o);
        json_decref(tols);
        *ok = false;
        return NULL;
    }
    jset(o, "node_selector", kv_json(&k->node_selector, ok), ok);
    for (int i = 0; i < k->n_tolerations; i++) {
        const struct st_spec_toleration *t = &k->tolerations[i];
        json_t *j = json_object();
        if (!j || json_array_append_new(tols, j) < 0) {
            *ok = false;
            break;
        }
        jset(j, "key", json_string(t->key), ok);
        jset(j, "operator", json_string(t->op), ok);
        jset(j, "value", json_string(t->value), ok);
        jset(j, "effect", json_string(t->effect), ok);
        if (t->seconds >= 0)
            jset(j, "toleration_seconds", json_integer(t->seconds), ok);
    }
    jset(o, "tolerations", tols, ok);
    jset(o, "resources", kv_json(&k->resources, ok), ok);
    jset(o, "priority_class", json_string(k->priority_class), ok);
    return o;
}

char *st_spec_to_json(const struct st_spec *spec) {
    static const char *const prec[] = {"fp32", "bf16"};
    bool ok = true;
    char *text = NULL, *out = NULL;
    json_t *root = json_object(), *meta = json_object(), *sp = json_object();
    json_t *model = json_object(), *data = json_object(), *training = json_object();
    json_t *opt = json_object(), *fleet = json_object(), *price = json_object();
    json_t *zones = json_array(), *planner = json_object(), *ckpt = json_object();
    json_t *coord = json_object(), *status = json_object(), *synth = NULL;
    if (!spec || !root || !meta || !sp || !model || !data || !training || !opt || !fleet ||
        !price || !zones || !planner || !ckpt || !coord || !status)
        ok = false;
    if (!ok) {
        json_t *all[] = {meta, sp,   model,   data, training, opt,   fleet,
                         price, zones, planner, ckpt, coord,   status};
        for (size_t i = 0; i < ST_ARRAY_SIZE(all); i++)
            json_decref(all[i]);
        goto out;
    }
    jset(root, "path", json_string(spec->path), &ok);
    jset(root, "apiVersion", json_string(spec->api_version), &ok);
    jset(root, "kind", json_string(spec->kind), &ok);
    jset(meta, "name", json_string(spec->name), &ok);
    jset(root, "metadata", meta, &ok);

    jset(model, "layers", json_integer(spec->model.layers), &ok);
    jset(model, "hidden", json_integer(spec->model.hidden), &ok);
    jset(model, "heads", json_integer(spec->model.heads), &ok);
    jset(model, "vocab", json_integer(spec->model.vocab), &ok);
    jset(model, "seq_len", json_integer(spec->model.seq_len), &ok);
    jset(model, "profile", json_string(spec->model.profile), &ok);
    jset(model, "profile_model", json_string(spec->model.profile_model), &ok);
    jset(sp, "model", model, &ok);

    jset(data, "train", json_string(spec->data.train), &ok);
    jset(data, "val", json_string(spec->data.val), &ok);
    if (spec->data.synth) {
        synth = json_object();
        if (synth) {
            jset(synth, "kind", json_string("markov"), &ok);
            jset(synth, "order", json_integer(spec->data.synth_order), &ok);
            jset(synth, "seed", json_integer((json_int_t)spec->data.synth_seed), &ok);
            jset(synth, "tokens", json_integer((json_int_t)spec->data.synth_tokens), &ok);
        }
        jset(data, "synth", synth, &ok);
    } else {
        jset(data, "synth", json_null(), &ok);
    }
    jset(sp, "data", data, &ok);

    const struct st_spec_optimizer *o = &spec->training.optimizer;
    static const char *const sched[] = {"cosine", "constant", "linear"};
    jset(opt, "name", json_string(o->name), &ok);
    jset(opt, "lr", json_real(o->lr), &ok);
    jset(opt, "beta1", json_real(o->beta1), &ok);
    jset(opt, "beta2", json_real(o->beta2), &ok);
    jset(opt, "eps", json_real(o->eps), &ok);
    jset(opt, "weight_decay", json_real(o->weight_decay), &ok);
    jset(opt, "grad_clip", json_real(o->grad_clip), &ok);
    jset(opt, "warmup_steps", json_integer(o->warmup_steps), &ok);
    jset(opt, "schedule", json_string(sched[o->schedule % 3]), &ok);
    jset(opt, "min_lr_ratio", json_real(o->min_lr_ratio), &ok);
    jset(training, "global_batch", json_integer(spec->training.global_batch), &ok);
    jset(training, "micro_batch", json_integer(spec->training.micro_batch), &ok);
    jset(training, "steps", json_integer(spec->training.steps), &ok);
    jset(training, "optimizer", opt, &ok);
    jset(training, "seed", json_integer((json_int_t)spec->training.seed), &ok);
    jset(training, "precision", json_string(prec[spec->training.precision % 2]), &ok);
    jset(sp, "training", training, &ok);

    jset(fleet, "provider", json_string(st_provider_name(spec->fleet.provider)), &ok);
    jset(fleet, "instance_type", json_string(spec->fleet.instance_type), &ok);
    jset(fleet, "gpus_per_instance", json_integer(spec->fleet.gpus_per_instance), &ok);
    jset(fleet, "min", json_integer(spec->fleet.min), &ok);
    jset(fleet, "max", json_integer(spec->fleet.max), &ok);
    for (int i = 0; i < spec->fleet.nzones && i < ST_SPEC_MAX_ZONES; i++)
        if (json_array_append_new(zones, json_string(spec->fleet.zones[i])) < 0)
            ok = false;
    jset(fleet, "zones", zones, &ok);
    jset(fleet, "spot", json_boolean(spec->fleet.spot), &ok);
    jset(fleet, "on_demand_fallback", json_boolean(spec->fleet.on_demand_fallback), &ok);
    jset(fleet, "image", json_string(spec->fleet.image), &ok);
    jset(fleet, "project", json_string(spec->fleet.project), &ok);
    jset(fleet, "subscription", json_string(spec->fleet.subscription), &ok);
    jset(fleet, "resource_group", json_string(spec->fleet.resource_group), &ok);
    jset(fleet, "location", json_string(spec->fleet.location), &ok);
    json_t *gcp = json_object(), *azure = json_object();
    jset(gcp, "endpoint", json_string(spec->fleet.gcp_endpoint), &ok);
    jset(azure, "subnet", json_string(spec->fleet.azure_subnet), &ok);
    jset(azure, "endpoint", json_string(spec->fleet.azure_endpoint), &ok);
    jset(fleet, "gcp", gcp, &ok);
    jset(fleet, "azure", azure, &ok);
    jset(fleet, "trace", json_string(spec->fleet.trace), &ok);
    jset(fleet, "time_scale", json_real(spec->fleet.time_scale), &ok);
    jset(fleet, "notice", json_real(spec->fleet.notice_seconds), &ok);
    jset(fleet, "unannounced", json_real(spec->fleet.unannounced), &ok);
    jset(price, "spot", json_real(spec->fleet.spot_price), &ok);
    jset(price, "on_demand", json_real(spec->fleet.on_demand_price), &ok);
    jset(fleet, "price", price, &ok);
    jset(fleet, "gpu_memory", json_integer((json_int_t)spec->fleet.gpu_memory), &ok);
    jset(fleet, "gpu_tflops", json_real(spec->fleet.gpu_tflops), &ok);
    jset(fleet, "net_gbps", json_real(spec->fleet.net_gbps), &ok);
    jset(fleet, "prewarm", json_boolean(spec->fleet.prewarm), &ok);
    jset(fleet, "kubernetes", kubernetes_json(&spec->fleet.kubernetes, &ok), &ok);
    json_t *dplane = json_object();
    jset(dplane, "tls", json_boolean(spec->fleet.data_plane_tls), &ok);
    jset(dplane, "overlap", json_boolean(spec->fleet.data_plane_overlap), &ok);
    jset(fleet, "data_plane", dplane, &ok);
    jset(sp, "fleet", fleet, &ok);

    jset(planner, "interval", json_real(spec->planner.interval), &ok);
    jset(planner, "lookahead", json_integer(spec->planner.lookahead), &ok);
    jset(planner, "predictor", json_string(spec->planner.predictor), &ok);
    jset(planner, "dp", shape_json(spec->planner.dp, spec->planner.dp_min, spec->planner.dp_max,
                                   &ok), &ok);
    jset(planner, "pp", shape_json(spec->planner.pp, spec->planner.pp_min, spec->planner.pp_max,
                                   &ok), &ok);
    jset(planner, "wait_limit", json_real(spec->planner.wait_limit), &ok);
    jset(planner, "learn", json_boolean(spec->planner.learn), &ok);
    jset(planner, "migration_costs", json_string(spec->planner.migration_costs), &ok);
    jset(sp, "planner", planner, &ok);

    jset(ckpt, "dir", json_string(spec->checkpoint.dir), &ok);
    jset(ckpt, "interval", json_real(spec->checkpoint.interval), &ok);
    jset(ckpt, "keep", json_integer(spec->checkpoint.keep), &ok);
    jset(sp, "checkpoint", ckpt, &ok);
    json_t *ft = json_object();
    jset(ft, "peer_copy_every", json_integer(spec->fault_tolerance.peer_copy_every), &ok);
    jset(ft, "peer_copy_memory", json_integer((json_int_t)spec->fault_tolerance.peer_copy_memory),
         &ok);
    jset(ft, "peer_copy_background", json_boolean(spec->fault_tolerance.peer_copy_background),
         &ok);
    jset(sp, "fault_tolerance", ft, &ok);
    jset(coord, "listen", json_string(spec->coordinator.listen), &ok);
    jset(coord, "advertise", json_string(spec->coordinator.advertise), &ok);
    jset(coord, "heartbeat_deadline", json_real(spec->coordinator.heartbeat_deadline), &ok);
    jset(coord, "reconfig_timeout", json_real(spec->coordinator.reconfig_timeout), &ok);
    json_t *tls = json_object();
    jset(tls, "cert", json_string(spec->coordinator.tls_cert), &ok);
    jset(tls, "key", json_string(spec->coordinator.tls_key), &ok);
    jset(tls, "client_ca", json_string(spec->coordinator.tls_client_ca), &ok);
    jset(coord, "tls", tls, &ok);
    jset(coord, "events_keep", json_integer(spec->coordinator.events_keep), &ok);
    jset(sp, "coordinator", coord, &ok);
    jset(status, "listen", json_string(spec->status.listen), &ok);
    jset(status, "token_file", json_string(spec->status.token_file), &ok);
    jset(sp, "status", status, &ok);
    jset(root, "spec", sp, &ok);
    if (!ok)
        goto out;

    text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    if (text)
        out = st_strdup(text);
out:
    free(text); /* jansson's allocator */
    json_decref(root);
    return out;
}

/* See spec.h. */
int st_spec_where(const struct st_spec *spec, const char *field, int *ret_line,
                  int *ret_column) {
    char p[sizeof(spec->where[0].path)];
    if (!spec || !field || !ret_line || !ret_column)
        return -EINVAL;
    snprintf(p, sizeof(p), "%s", field);
    for (int parent = 0;; parent = 1) {
        for (int i = 0; i < spec->nwhere && i < ST_SPEC_MAX_WHERE; i++)
            if (strcmp(spec->where[i].path, p) == 0) {
                *ret_line = spec->where[i].line;
                *ret_column = spec->where[i].column;
                return parent;
            }
        char *dot = strrchr(p, '.');
        if (!dot)
            return -ENOENT;
        *dot = '\0';
    }
}
