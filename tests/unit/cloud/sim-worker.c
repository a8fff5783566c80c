/* sim-worker.c: the tiny worker the cloud tests have the sim provider start (libuv's
 * TEST_HELPER idea: the helper is a real process, so the provider's fork, kill and reap paths
 * run for real).
 *
 * Modes:
 *   sleep          wait to be killed
 *   exit N         exit with status N at once
 *   watch FIFO     read identity and poll the spot notice through the AWS notice client (the
 *                  endpoint comes from AWS_EC2_METADATA_SERVICE_ENDPOINT, as on EC2), and
 *                  report to FIFO: "ready ID TYPE ZONE", then "rebalance TIME" and
 *                  "notice ACTION TIME" as they appear; wait to be killed. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "cloud.h"

/* Writes one line to the FIFO; a vanished reader ends the helper. */
static void say(int fd, const char *line) {
    size_t len = strlen(line);
    if (write(fd, line, len) != (ssize_t)len)
        _exit(3);
}

static int watch(const char *fifo) {
    int fd = open(fifo, O_WRONLY);
    if (fd < 0)
        return 2;
    struct cloud_notice_config cfg = {.timeout_ms = 2000};
    struct cloud_notice_client *c = NULL;
    if (cloud_notice_client_new("aws", &cfg, &c) < 0)
        return 2;
    struct cloud_identity id;
    int r = cloud_notice_client_identity(c, &id);
    char line[512];
    if (r < 0) {
        snprintf(line, sizeof(line), "error identity %d\n", r);
        say(fd, line);
        return 2;
    }
    snprintf(line, sizeof(line), "ready %s %s %s\n", id.instance_id, id.instance_type, id.zone);
    say(fd, line);
    bool rebalance_said = false;
    for (;;) {
        struct cloud_notice n;
        r = cloud_notice_client_poll(c, &n);
        if (r < 0) {
            snprintf(line, sizeof(line), "error poll %d\n", r);
            say(fd, line);
        } else if (r > 0 && n.kind == CLOUD_NOTICE_REBALANCE && !rebalance_said) {
            snprintf(line, sizeof(line), "rebalance %.0f\n", n.time);
            say(fd, line);
            rebalance_said = true;
        } else if (r > 0 && n.kind != CLOUD_NOTICE_REBALANCE) {
            snprintf(line, sizeof(line), "notice %s %.0f\n", cloud_notice_kind_name(n.kind),
                     n.time);
            say(fd, line);
            pause(); /* the provider SIGKILLs us at the deadline */
        }
        /* A worker polls every few seconds on EC2; here every 5 ms keeps tests short. */
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int main(int argc, char **argv) {
    /* A test that fails half-way leaves its provider unfreed; don't outlive it (an orphan
     * would hold the test's stdout open and meson would wait for it). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        return 4;
    if (argc >= 2 && strcmp(argv[1], "sleep") == 0) {
        for (;;)
            pause();
    }
    if (argc >= 3 && strcmp(argv[1], "exit") == 0)
        return atoi(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "watch") == 0)
        return watch(argv[2]);
    fprintf(stderr, "usage: sim-worker sleep | exit N | watch FIFO\n");
    return 2;
}
