/* spec-internal.h: internals of the job-spec parser shared by spec.c and spec-yaml.c.
 * No other part may include this header (STYLE.md "one public header per part").
 *
 * spec-yaml.c turns the YAML text into a small tree of nodes (scalars, mappings, sequences)
 * held in two flat arrays, so freeing it is two st_free() calls whatever the nesting; spec.c
 * walks that tree against the field tables and fills struct st_spec. Errors from both go
 * into one struct spec_errors, sorted into file order at the end. */
#ifndef ST_SPEC_INTERNAL_H
#define ST_SPEC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "common.h" /* struct st_error */

#define SPEC_MAX_BYTES (1024 * 1024) /* larger files are rejected before parsing */
#define SPEC_MAX_DEPTH 32            /* nesting of mappings and sequences */
#define SPEC_MAX_NODES 100000        /* nodes in the tree */
#define SPEC_KEEP_ERRS 128           /* errors kept for sorting; later ones are only counted */

enum spec_node_type { SPEC_SCALAR = 0, SPEC_MAPPING, SPEC_SEQUENCE };

/* One YAML node. Children of a mapping alternate key, value. Indices are into
 * spec_tree.nodes; -1 = none. */
struct spec_node {
    enum spec_node_type type;
    int line, column;   /* 1-based position of the node's first character */
    int first, last;    /* first and last child */
    int next;           /* next sibling */
    size_t off, len;    /* scalar text in spec_tree.text (NUL-terminated there) */
    bool plain;         /* unquoted scalar (so `~`, `null` and empty mean "no value") */
    bool alias;         /* stands for a refused alias: already reported, skip it */
};

struct spec_tree {
    struct spec_node *nodes;
    size_t nnodes, cap_nodes;
    char *text;
    size_t ntext, cap_text;
    int root;           /* -1 when the stream held no document */
};

/* Errors collected while parsing: kept in an array of SPEC_KEEP_ERRS, counted beyond. */
struct spec_errors {
    const char *file;   /* name used in positions */
    struct st_error *v; /* SPEC_KEEP_ERRS entries */
    size_t n;           /* kept */
    size_t total;       /* found */
};

/* Records one error (formatted message). Never fails: beyond the kept ones it only counts. */
void spec__error(struct spec_errors *errs, int line, int column, const char *field,
                 const char *fmt, ...) ST_PRINTF(5, 6);

/* Parses YAML text into *tree (zeroed by the caller). Returns 0 when a tree was built (even
 * if errors were recorded that do not stop the schema walk, such as aliases or a second
 * document), 1 when errors make the tree unusable (syntax error, bad encoding, empty file:
 * the schema walk must be skipped), -ENOMEM on allocation failure. Caller frees with
 * spec__tree_done(). */
int spec__parse_yaml(const char *data, size_t len, struct spec_tree *tree,
                     struct spec_errors *errs);
void spec__tree_done(struct spec_tree *tree);

/* Scalar text of a node (NUL-terminated, owned by the tree). */
static inline const char *spec__text(const struct spec_tree *t, int n) {
    return t->text + t->nodes[n].off;
}

/* Optimal-string-alignment (Damerau-Levenshtein) distance, capped at 100. */
int spec__edit_distance(const char *a, const char *b);

#endif
