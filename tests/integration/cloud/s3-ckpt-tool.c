/* s3-ckpt-tool.c: test helper for test_s3.py — runs the job driver's checkpoint retention and
 * restore lookups (mig_ckpt_latest_step, mig_ckpt_prune) on a root, which `spottrain ckpt`
 * does not expose, and prints their results on one line for the script to assert exactly.
 *
 * Usage: s3-ckpt-tool latest ROOT      -> "latest STEP DIR" or "latest none (ERRNO-NAME)"
 *        s3-ckpt-tool prune ROOT KEEP  -> "pruned N" or "prune failed (ERRNO-NAME)"
 * Exit 0 when the call returned >= 0 (or -ENOENT for latest), else 1. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"  /* st_strerror */
#include "migrate.h" /* mig_ckpt_latest_step, mig_ckpt_prune */

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "latest")) {
        char dir[4096];
        uint64_t step;
        int r = mig_ckpt_latest_step(argv[2], dir, sizeof(dir), &step);
        if (r < 0) {
            printf("latest none (%s)\n", st_strerror(r));
            return r == -ENOENT ? 0 : 1;
        }
        printf("latest %" PRIu64 " %s\n", step, dir);
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "prune")) {
        int r = mig_ckpt_prune(argv[2], atoi(argv[3]));
        if (r < 0) {
            printf("prune failed (%s)\n", st_strerror(r));
            return 1;
        }
        printf("pruned %d\n", r);
        return 0;
    }
    fprintf(stderr, "usage: s3-ckpt-tool latest ROOT | prune ROOT KEEP\n");
    return 2;
}
