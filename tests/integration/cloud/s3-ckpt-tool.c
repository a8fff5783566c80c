/* s3-ckpt-tool.c: test helper for test_s3.py — runs the job driver's checkpoint retention and
 * restore lookups (mig_ckpt_latest_step, mig_ckpt_prune) on a root, which `spottrain ckpt`
 * does not expose, and prints their results on one line for the script to assert exactly.
 *
 * Usage: s3-ckpt-tool latest ROOT      -> "latest STEP DIR" or "latest none (ERRNO-NAME)"
 *        s3-ckpt-tool prune ROOT KEEP  -> "pruned N" or "prune failed (ERRNO-NAME)"
 *        s3-ckpt-tool imds KEY SECRET TOKEN -> starts the sim's loopback IMDSv2 server
 *            (cloud/imds-server.c) with an instance role holding those credentials, prints
 *            "imds http://127.0.0.1:PORT", and serves until stdin closes
 * Exit 0 when the call returned >= 0 (or -ENOENT for latest), else 1. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cloud.h"   /* cloud_imds_server_new, cloud_imds_server_set_role */
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
    if (argc == 5 && !strcmp(argv[1], "imds")) {
        struct cloud_imds_server_config cfg = {.instance_id = "i-0123456789abcdef0",
                                               .zone = "us-east-1a"};
        struct cloud_imds_server *s;
        char ep[128], line[64];
        int r = cloud_imds_server_new(&cfg, &s);
        if (r >= 0)
            r = cloud_imds_server_set_role(s, "spottrain-worker", argv[2], argv[3], argv[4],
                                           st_wall() + 6 * 3600);
        if (r >= 0)
            r = cloud_imds_server_endpoint(s, ep, sizeof(ep));
        if (r < 0) {
            fprintf(stderr, "imds: %s\n", st_strerror(r));
            return 1;
        }
        printf("imds %s\n", ep);
        fflush(stdout);
        while (fgets(line, sizeof(line), stdin))
            ;
        unsigned puts, gets;
        cloud_imds_server_counts(s, &puts, &gets);
        printf("served %u token PUTs, %u GETs\n", puts, gets);
        cloud_imds_server_free(s);
        return 0;
    }
    fprintf(stderr, "usage: s3-ckpt-tool latest ROOT | prune ROOT KEEP | imds KEY SECRET "
            "TOKEN\n");
    return 2;
}
