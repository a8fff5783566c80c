/* hungarian.c: minimum-cost assignment (planner-internal.h, plan__hungarian). The migration
 * planner keeps the most bytes in place by assigning survivors to new positions with it
 * (SpotServe's Kuhn-Munkres step, planner/migration.c). */
#include <stdbool.h>
#include <stdint.h>

#include "common.h" /* st_calloc, st_free, ST_MIN */
#include "planner-internal.h"

/* See planner-internal.h. Shortest augmenting paths with potentials, after a warm start. */
int plan__hungarian(const int64_t *a, uint32_t n, uint32_t m, uint32_t *ret_col) {
    const int64_t INF = INT64_MAX / 4;
    int r = -ENOMEM;
    int64_t *u = st_calloc(n + 1, sizeof(int64_t));
    int64_t *v = st_calloc(m + 1, sizeof(int64_t));
    int64_t *minv = st_malloc((m + 1) * sizeof(int64_t));
    uint32_t *p = st_calloc(m + 1, sizeof(uint32_t));   /* row (1-based) matched to column */
    uint32_t *way = st_calloc(m + 1, sizeof(uint32_t));
    bool *used = st_malloc((m + 1) * sizeof(bool));
    uint32_t *row_match = st_calloc(n + 1, sizeof(uint32_t)); /* column (1-based) of row */
    if (!u || !v || !minv || !p || !way || !used || !row_match) {
        st_free(row_match);
        goto out;
    }
    /* Warm start (the classic initialisation): row (then, when square, column) reduction
     * keeps the dual feasible (u[i] + v[j] <= a[i][j]); then rows are greedily matched
     * along tight edges to free columns. The augmenting loop below only runs for rows left
     * unmatched, which on our block-structured matrices is a small fraction. */
    for (uint32_t i = 1; i <= n; i++) {
        const int64_t *row = a + (size_t)(i - 1) * m;
        int64_t mn = row[0];
        for (uint32_t j = 1; j < m; j++)
            mn = ST_MIN(mn, row[j]);
        u[i] = mn;
    }
    /* Column reduction only when square: with n < m a column may stay free, and a free
     * column must keep v[j] = 0 for the result to be optimal (rectangular dual, v <= 0). */
    for (uint32_t j = 1; j <= m && n == m; j++) {
        int64_t mn = INF;
        for (uint32_t i = 1; i <= n; i++)
            mn = ST_MIN(mn, a[(size_t)(i - 1) * m + (j - 1)] - u[i]);
        v[j] = mn;
    }
    for (uint32_t i = 1; i <= n; i++) {
        const int64_t *row = a + (size_t)(i - 1) * m;
        for (uint32_t j = 1; j <= m; j++)
            if (!p[j] && row[j - 1] - u[i] - v[j] == 0) {
                p[j] = i;
                row_match[i] = j;
                break;
            }
    }
    for (uint32_t i = 1; i <= n; i++) {
        if (row_match[i])
            continue;
        p[0] = i;
        uint32_t j0 = 0;
        for (uint32_t j = 0; j <= m; j++) {
            minv[j] = INF;
            used[j] = false;
        }
        do {
            used[j0] = true;
            uint32_t i0 = p[j0], j1 = 0;
            int64_t delta = INF;
            const int64_t *row = a + (size_t)(i0 - 1) * m;
            int64_t ui0 = u[i0];
            for (uint32_t j = 1; j <= m; j++) {
                if (used[j])
                    continue;
                int64_t cur = row[j - 1] - ui0 - v[j];
                if (cur < minv[j]) {
                    minv[j] = cur;
                    way[j] = j0;
                }
                /* Among equally near columns take a free one: with the many ties of our
                 * block matrices this ends the search at once (as LAPJV's scan lists do). */
                if (minv[j] < delta || (minv[j] == delta && p[j] == 0 && p[j1] != 0)) {
                    delta = minv[j];
                    j1 = j;
                }
            }
            for (uint32_t j = 0; j <= m; j++) {
                if (used[j]) {
                    u[p[j]] += delta;
                    v[j] -= delta;
                } else {
                    minv[j] -= delta;
                }
            }
            j0 = j1;
        } while (p[j0] != 0);
        do {
            uint32_t j1 = way[j0];
            p[j0] = p[j1];
            j0 = j1;
        } while (j0);
    }
    for (uint32_t j = 1; j <= m; j++)
        if (p[j])
            ret_col[p[j] - 1] = j - 1;
    st_free(row_match);
    r = 0;
out:
    st_free(u);
    st_free(v);
    st_free(minv);
    st_free(p);
    st_free(way);
    st_free(used);
    return r;
}
