/* spec-yaml.c: YAML text -> a flat node tree, for the job-spec parser (spec.c).
 *
 * It uses libyaml's event API and keeps only what a job spec may contain: mappings,
 * sequences and scalars with their positions. Everything a spec never needs and an attacker
 * could abuse is refused here with a position: anchors and aliases (the "billion laughs"
 * expansion), tags, a second document, nesting deeper than SPEC_MAX_DEPTH, more than
 * SPEC_MAX_NODES nodes, and text that is not UTF-8 (checked first, so the error names the
 * byte instead of libyaml's reader state). */
#include <stdio.h>
#include <string.h>
#include <yaml.h>

#include "spec-internal.h"

/* Jumps to out with -ENOMEM when an allocation fails (the only way add_* fail). */
#define TRY_NOMEM_(expr)                                                           \
    do {                                                                           \
        if ((expr) < 0) {                                                          \
            r = -ENOMEM;                                                           \
            goto out;                                                              \
        }                                                                          \
    } while (0)

void spec__tree_done(struct spec_tree *tree) {
    st_free(tree->nodes);
    st_free(tree->text);
    tree->nodes = NULL;
    tree->text = NULL;
    tree->nnodes = tree->cap_nodes = tree->ntext = tree->cap_text = 0;
}

/* Line and column (1-based, in characters) of byte offset `off`. */
static void position_of(const char *data, size_t off, int *ret_line, int *ret_col) {
    int line = 1, col = 1;
    for (size_t i = 0; i < off; i++) {
        unsigned char c = (unsigned char)data[i];
        if (c == '\n') {
            line++;
            col = 1;
        } else if ((c & 0xC0) != 0x80) {
            col++; /* count characters, not continuation bytes */
        }
    }
    *ret_line = line;
    *ret_col = col;
}

/* Returns the offset of the first byte that is not valid UTF-8 (or a NUL), or len. */
static size_t utf8_invalid_at(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        size_t n;
        unsigned min;
        unsigned cp;
        if (c == 0)
            return i;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 1, min = 0x80, cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2, min = 0x800, cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3, min = 0x10000, cp = c & 0x07;
        } else {
            return i;
        }
        for (size_t k = 1; k <= n; k++) {
            if (i + k >= len || (s[i + k] & 0xC0) != 0x80)
                return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += n + 1;
    }
    return len;
}

static int add_node(struct spec_tree *t, enum spec_node_type type, const yaml_mark_t *mark,
                    int parent, int *ret_index) {
    if (t->nnodes >= t->cap_nodes) {
        size_t ncap = t->cap_nodes ? t->cap_nodes * 2 : 64;
        struct spec_node *nv = st_realloc(t->nodes, ncap * sizeof(*nv));
        if (!nv)
            return -ENOMEM;
        t->nodes = nv;
        t->cap_nodes = ncap;
    }
    int idx = (int)t->nnodes++;
    struct spec_node *n = &t->nodes[idx];
    memset(n, 0, sizeof(*n));
    n->type = type;
    n->line = (int)mark->line + 1;
    n->column = (int)mark->column + 1;
    n->first = n->last = n->next = -1;
    if (parent >= 0) {
        struct spec_node *p = &t->nodes[parent];
        if (p->last >= 0)
            t->nodes[p->last].next = idx;
        else
            p->first = idx;
        p->last = idx;
    }
    *ret_index = idx;
    return 0;
}

static int add_text(struct spec_tree *t, const char *s, size_t len, size_t *ret_off) {
    if (t->ntext + len + 1 > t->cap_text) {
        size_t ncap = t->cap_text ? t->cap_text : 1024;
        while (ncap < t->ntext + len + 1)
            ncap *= 2;
        char *nt = st_realloc(t->text, ncap);
        if (!nt)
            return -ENOMEM;
        t->text = nt;
        t->cap_text = ncap;
    }
    memcpy(t->text + t->ntext, s, len);
    t->text[t->ntext + len] = '\0';
    *ret_off = t->ntext;
    t->ntext += len + 1;
    return 0;
}

/* Turns a libyaml parser error into one of ours, rewording the ones users hit most. */
static void syntax_error(const yaml_parser_t *p, const char *data, size_t len,
                         struct spec_errors *errs) {
    int line = (int)p->problem_mark.line + 1, col = (int)p->problem_mark.column + 1;
    size_t off = p->problem_mark.index;
    if (off < len && data[off] == '\t') {
        spec__error(errs, line, col, NULL,
                    "tab character where indentation is expected (YAML indents with spaces only)");
        return;
    }
    if (p->context)
        spec__error(errs, line, col, NULL, "YAML syntax error: %s %s (line %d)", p->problem,
                    p->context, (int)p->context_mark.line + 1);
    else
        spec__error(errs, line, col, NULL, "YAML syntax error: %s",
                    p->problem ? p->problem : "unknown error");
}

/* Reports an anchor or a tag on an event; both are refused, the node is still built. */
static void check_anchor_tag(const yaml_event_t *e, const yaml_char_t *anchor,
                             const yaml_char_t *tag, bool implicit_tag,
                             struct spec_errors *errs) {
    int line = (int)e->start_mark.line + 1, col = (int)e->start_mark.column + 1;
    if (anchor)
        spec__error(errs, line, col, NULL,
                    "YAML anchors are not allowed in a job spec (found '&%s')",
                    (const char *)anchor);
    if (tag && !implicit_tag)
        spec__error(errs, line, col, NULL, "YAML tags are not allowed in a job spec (found '%s')",
                    (const char *)tag);
}

int spec__parse_yaml(const char *data, size_t len, struct spec_tree *tree,
                     struct spec_errors *errs) {
    int r = 0;
    yaml_parser_t parser;
    yaml_event_t ev;
    bool have_event = false;
    int stack[SPEC_MAX_DEPTH + 1];
    int depth = 0;
    int ndocs = 0;

    tree->root = -1;
    size_t bad = utf8_invalid_at((const unsigned char *)data, len);
    if (bad < len) {
        int line, col;
        position_of(data, bad, &line, &col);
        if (data[bad] == 0)
            spec__error(errs, line, col, NULL, "NUL byte in the file (a job spec is UTF-8 text)");
        else
            spec__error(errs, line, col, NULL,
                        "invalid UTF-8 (byte 0x%02x); a job spec must be UTF-8 text",
                        (unsigned char)data[bad]);
        return 1;
    }

    if (!yaml_parser_initialize(&parser))
        return -ENOMEM;
    yaml_parser_set_input_string(&parser, (const unsigned char *)data, len);
    yaml_parser_set_encoding(&parser, YAML_UTF8_ENCODING);

    for (;;) {
        if (!yaml_parser_parse(&parser, &ev)) {
            if (parser.error == YAML_MEMORY_ERROR) {
                r = -ENOMEM;
                goto out;
            }
            syntax_error(&parser, data, len, errs);
            r = 1;
            goto out;
        }
        have_event = true;
        int line = (int)ev.start_mark.line + 1, col = (int)ev.start_mark.column + 1;
        int parent = depth > 0 ? stack[depth - 1] : -1;
        int idx;
        if (ev.type == YAML_STREAM_END_EVENT)
            break;
        switch (ev.type) {
        case YAML_DOCUMENT_START_EVENT:
            if (++ndocs > 1) {
                spec__error(errs, line, col, NULL,
                            "a second YAML document; a job spec is a single document");
                goto out; /* the first document is still checked */
            }
            break;
        case YAML_MAPPING_START_EVENT:
        case YAML_SEQUENCE_START_EVENT: {
            bool map = ev.type == YAML_MAPPING_START_EVENT;
            if (map)
                check_anchor_tag(&ev, ev.data.mapping_start.anchor, ev.data.mapping_start.tag,
                                 ev.data.mapping_start.implicit, errs);
            else
                check_anchor_tag(&ev, ev.data.sequence_start.anchor, ev.data.sequence_start.tag,
                                 ev.data.sequence_start.implicit, errs);
            if (depth >= SPEC_MAX_DEPTH) {
                spec__error(errs, line, col, NULL, "nesting deeper than %d levels",
                            SPEC_MAX_DEPTH);
                r = 1;
                goto out;
            }
            if (tree->nnodes >= SPEC_MAX_NODES) {
                spec__error(errs, line, col, NULL, "more than %d YAML nodes", SPEC_MAX_NODES);
                r = 1;
                goto out;
            }
            TRY_NOMEM_(add_node(tree, map ? SPEC_MAPPING : SPEC_SEQUENCE, &ev.start_mark,
                                parent, &idx));
            if (parent < 0)
                tree->root = idx;
            stack[depth++] = idx;
            break;
        }
        case YAML_MAPPING_END_EVENT:
        case YAML_SEQUENCE_END_EVENT:
            if (depth > 0)
                depth--;
            break;
        case YAML_SCALAR_EVENT:
        case YAML_ALIAS_EVENT: {
            if (tree->nnodes >= SPEC_MAX_NODES) {
                spec__error(errs, line, col, NULL, "more than %d YAML nodes", SPEC_MAX_NODES);
                r = 1;
                goto out;
            }
            TRY_NOMEM_(add_node(tree, SPEC_SCALAR, &ev.start_mark, parent, &idx));
            if (parent < 0)
                tree->root = idx;
            struct spec_node *n = &tree->nodes[idx];
            size_t off;
            if (ev.type == YAML_ALIAS_EVENT) {
                /* Stands in as an empty value so the walk goes on; the error is the point. */
                spec__error(errs, line, col, NULL,
                            "YAML aliases are not allowed in a job spec (found '*%s')",
                            (const char *)ev.data.alias.anchor);
                TRY_NOMEM_(add_text(tree, "", 0, &off));
                n = &tree->nodes[idx];
                n->plain = true;
                n->alias = true;
            } else {
                check_anchor_tag(&ev, ev.data.scalar.anchor, ev.data.scalar.tag,
                                 ev.data.scalar.plain_implicit || ev.data.scalar.quoted_implicit,
                                 errs);
                TRY_NOMEM_(add_text(tree, (const char *)ev.data.scalar.value,
                                    ev.data.scalar.length, &off));
                n = &tree->nodes[idx];
                n->len = ev.data.scalar.length;
                n->plain = ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
            }
            n->off = off;
            break;
        }
        default:
            break;
        }
        yaml_event_delete(&ev);
        have_event = false;
    }
    if (ndocs == 0) {
        spec__error(errs, 1, 1, NULL,
                    "the file is empty (expected a mapping with apiVersion, kind, metadata "
                    "and spec)");
        r = 1;
    }
out:
    if (have_event)
        yaml_event_delete(&ev);
    yaml_parser_delete(&parser);
    return r;
}
