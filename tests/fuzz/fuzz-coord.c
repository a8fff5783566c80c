/* fuzz-coord.c: the coordinator that fuzz-proto and fuzz-rest drive — a small spec and a
 * coordinator whose journal lives in the target's private directory (fuzz-dir.c).
 *
 * One idea: both targets reopen the coordinator on the same journal after an input to check
 * that what was written is whole, so the two opens must be the same configuration; one
 * function makes it. */
#include <errno.h>
#include <stdio.h>

#include "coordinator.h"
#include "fuzz.h"

/* See fuzz.h. */
void fuzz_coord_spec(struct st_spec *spec) {
    st_spec_defaults(spec);
    snprintf(spec->name, sizeof(spec->name), "fuzz");
    spec->model.layers = 4;
}

/* See fuzz.h. */
int fuzz_coord_open(const struct st_spec *spec, const char *dir, const char *token,
                    struct coord **ret) {
    struct coord_config cfg;
    coord_config_init(&cfg);
    cfg.spec = spec;
    snprintf(cfg.listen, sizeof(cfg.listen), "127.0.0.1:0");
    snprintf(cfg.status_listen, sizeof(cfg.status_listen), "-");
    snprintf(cfg.state_dir, sizeof(cfg.state_dir), "%s", dir);
    if (token)
        snprintf(cfg.token, sizeof(cfg.token), "%s", token);
    cfg.heartbeat_deadline = 10;
    cfg.settle = 0.5;
    return coord_new(&cfg, NULL, ret);
}

/* See fuzz.h. */
int fuzz_coord_fresh(const struct st_spec *spec, const char *dir, const char *token,
                     struct coord **ret) {
    fuzz_dir_clear();
    int r = fuzz_coord_open(spec, dir, token, ret);
    FUZZ_CHECK(r >= 0 || r == -ENOMEM);
    return r;
}
