/* helpers.h: shared by the planner tests — load shipped trace and profile files. */
#ifndef ST_TEST_PLANNER_HELPERS_H
#define ST_TEST_PLANNER_HELPERS_H

#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "planner.h"

/* Reads SPOTTRAIN_SRCDIR/rel into a heap buffer; NULL when unreadable. */
static inline char *tp_read(const char *rel, size_t *len) {
    const char *src = getenv("SPOTTRAIN_SRCDIR");
    char path[1024];
    char *data = NULL;
    snprintf(path, sizeof(path), "%s/%s", src ? src : ".", rel);
    if (st_read_file(path, 64u << 20, &data, len) < 0)
        return NULL;
    return data;
}

static inline struct plan_cost *tp_cost(const char *model) {
    size_t len;
    char *t = tp_read("traces/parcae-cost-profiles.json", &len);
    struct plan_cost *c = NULL;
    struct st_error e;
    if (t && plan_cost_from_profile("profile", t, len, model, &c, &e) < 0)
        c = NULL;
    st_free(t);
    return c;
}

static inline struct plan_trace *tp_trace(const char *rel) {
    size_t len;
    char *t = tp_read(rel, &len);
    struct plan_trace *tr = NULL;
    struct st_error e;
    if (t && plan_trace_parse(rel, t, len, &tr, &e) < 0)
        tr = NULL;
    st_free(t);
    return tr;
}

static inline struct plan_decisions *tp_decisions(const char *rel) {
    size_t len;
    char *t = tp_read(rel, &len);
    struct plan_decisions *d = NULL;
    struct st_error e;
    if (t && plan_decisions_parse(rel, t, len, &d, &e) < 0)
        d = NULL;
    st_free(t);
    return d;
}

#endif
