/* test-validate.c: control-plane message validation — every rule that keeps a decoded but
 * senseless message away from job state — plus HOST:PORT parsing and token files. */
#include <math.h>

#include "coord-internal.h"
#include "test.h"

#define UUID "0b8c3f4e-1a2b-4c3d-8e9f-0123456789ab"

static int test_join(void) {
    Spottrain__V1__JoinRequest m = SPOTTRAIN__V1__JOIN_REQUEST__INIT;
    char why[128];
    ASSERT_ERR(coord__validate_join(NULL, why, sizeof(why)), -EINVAL);
    /* A worker of another release (0: before the field), refused first, with both versions. */
    ASSERT_ERR(coord__validate_join(&m, why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "control protocol 0, this coordinator 1");
    m.protocol = ST_PROTOCOL + 1;
    ASSERT_ERR(coord__validate_join(&m, why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "run the same spottrain release on both");
    m.protocol = ST_PROTOCOL;
    ASSERT_ERR(coord__validate_join(&m, why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "worker_id");
    m.worker_id = (char *)UUID;
    ASSERT_OK(coord__validate_join(&m, why, sizeof(why)));
    m.gpus = 5000;
    ASSERT_ERR(coord__validate_join(&m, why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "gpus");
    m.gpus = 8;
    m.zone = (char *)"a-zone-name-that-is-far-too-long-to-be-real";
    ASSERT_ERR(coord__validate_join(&m, why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "zone");
    m.zone = (char *)"bad\x01zone";
    ASSERT_ERR(coord__validate_join(&m, why, sizeof(why)), -EINVAL);
    m.zone = (char *)"us-east-1a";
    m.data_addr = (char *)"nohostport";
    ASSERT_ERR(coord__validate_join(&m, why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "data_addr");
    m.data_addr = (char *)"10.0.0.1:70000";
    ASSERT_ERR(coord__validate_join(&m, why, sizeof(why)), -EINVAL);
    m.data_addr = (char *)"10.0.0.1:7000";
    ASSERT_OK(coord__validate_join(&m, why, sizeof(why)));
    return 0;
}

static int test_report(void) {
    Spottrain__V1__ReportRequest m = SPOTTRAIN__V1__REPORT_REQUEST__INIT;
    char why[128];
    m.worker_id = (char *)UUID;
    ASSERT_OK(coord__validate_report(&m, why, sizeof(why)));
    m.loss = NAN;
    ASSERT_ERR(coord__validate_report(&m, why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "loss");
    m.loss = 1.0;
    m.stall_seconds = -1;
    ASSERT_ERR(coord__validate_report(&m, why, sizeof(why)), -EINVAL);
    m.stall_seconds = 0;
    m.step_seconds = INFINITY;
    ASSERT_ERR(coord__validate_report(&m, why, sizeof(why)), -EINVAL);
    m.step_seconds = 0.5;
    m.step = (uint64_t)1 << 60;
    ASSERT_ERR(coord__validate_report(&m, why, sizeof(why)), -EINVAL);
    m.step = 3;
    Spottrain__V1__CommandAck ack = SPOTTRAIN__V1__COMMAND_ACK__INIT, *ackp = &ack;
    m.n_acks = 1;
    m.acks = &ackp;
    ASSERT_ERR(coord__validate_report(&m, why, sizeof(why)), -EINVAL); /* id 0 */
    ASSERT_CONTAINS(why, "acks");
    ack.id = 4;
    ASSERT_OK(coord__validate_report(&m, why, sizeof(why)));
    m.n_acks = COORD_MAX_ACKS + 1;
    ASSERT_ERR(coord__validate_report(&m, why, sizeof(why)), -EINVAL);
    m.n_acks = 1;
    Spottrain__V1__Notice no = SPOTTRAIN__V1__NOTICE__INIT, *nop = &no;
    m.n_notices = 1;
    m.notices = &nop;
    ASSERT_ERR(coord__validate_report(&m, why, sizeof(why)), -EINVAL); /* empty kind */
    no.kind = (char *)"terminate";
    no.at = NAN;
    ASSERT_ERR(coord__validate_report(&m, why, sizeof(why)), -EINVAL);
    no.at = 1e9;
    ASSERT_OK(coord__validate_report(&m, why, sizeof(why)));
    /* Figures: finite times; a dir of at most 511 bytes without control characters (UTF-8
     * names pass); negative figures pass (refused, a Report would be sent again as it was). */
    Spottrain__V1__NoticeFigures fig = SPOTTRAIN__V1__NOTICE_FIGURES__INIT;
    no.kind = (char *)"ckpt-written";
    no.figures = &fig;
    fig.dir = (char *)"/ckpt/caf\xc3\xa9 run";
    fig.wait = -1e-9;
    fig.stage = -1;
    ASSERT_OK(coord__validate_report(&m, why, sizeof(why)));
    fig.waited = NAN;
    ASSERT_ERR(coord__validate_report(&m, why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "notices[].figures");
    fig.waited = 0;
    fig.dir = (char *)"/ckpt/a\nb";
    ASSERT_ERR(coord__validate_report(&m, why, sizeof(why)), -EINVAL);
    char longdir[ST_NOTICE_DIR_MAX + 1];
    memset(longdir, 'd', sizeof(longdir) - 1);
    longdir[ST_NOTICE_DIR_MAX] = '\0';
    fig.dir = longdir; /* 512 bytes: one too many */
    ASSERT_ERR(coord__validate_report(&m, why, sizeof(why)), -EINVAL);
    longdir[ST_NOTICE_DIR_MAX - 1] = '\0';
    ASSERT_OK(coord__validate_report(&m, why, sizeof(why)));
    no.figures = NULL;
    m.n_notices = COORD_MAX_NOTICES + 1;
    ASSERT_ERR(coord__validate_report(&m, why, sizeof(why)), -EINVAL);
    return 0;
}

static int test_watch(void) {
    Spottrain__V1__WatchRequest m = SPOTTRAIN__V1__WATCH_REQUEST__INIT;
    char why[64];
    ASSERT_ERR(coord__validate_watch(&m, why, sizeof(why)), -EINVAL);
    m.worker_id = (char *)"0b8c3f4e-1a2b-4c3d-8e9f-0123456789aZ";
    ASSERT_ERR(coord__validate_watch(&m, why, sizeof(why)), -EINVAL);
    m.worker_id = (char *)UUID;
    ASSERT_OK(coord__validate_watch(&m, why, sizeof(why)));
    return 0;
}

static int test_hostport(void) {
    char host[64];
    int port = -1;
    ASSERT_OK(coord__parse_hostport("127.0.0.1:0", host, sizeof(host), &port));
    ASSERT_STREQ(host, "127.0.0.1");
    ASSERT_EQ(port, 0);
    ASSERT_OK(coord__parse_hostport("[::1]:8080", host, sizeof(host), &port));
    ASSERT_STREQ(host, "::1");
    ASSERT_EQ(port, 8080);
    ASSERT_ERR(coord__parse_hostport(":80", host, sizeof(host), &port), -EINVAL);
    ASSERT_ERR(coord__parse_hostport("h:", host, sizeof(host), &port), -EINVAL);
    ASSERT_ERR(coord__parse_hostport("h:-1", host, sizeof(host), &port), -EINVAL);
    ASSERT_ERR(coord__parse_hostport("h:1x", host, sizeof(host), &port), -EINVAL);
    ASSERT_ERR(coord__parse_hostport("h", host, sizeof(host), &port), -EINVAL);
    ASSERT_ERR(coord__parse_hostport("", host, sizeof(host), &port), -EINVAL);
    return 0;
}

static int test_token(void) {
    char tok[256], why[256];
    const char *p = "/tmp/st-test-validate-token";
    ASSERT_OK(st_write_file_atomic(p, "abc123\n", 7));
    ASSERT_OK(coord_token_read(p, tok, sizeof(tok), why, sizeof(why)));
    ASSERT_STREQ(tok, "abc123");
    ASSERT_OK(st_write_file_atomic(p, "\n\n", 2));
    ASSERT_ERR(coord_token_read(p, tok, sizeof(tok), why, sizeof(why)), -EINVAL);
    ASSERT_CONTAINS(why, "empty");
    ASSERT_OK(st_write_file_atomic(p, "a b", 3));
    ASSERT_ERR(coord_token_read(p, tok, sizeof(tok), why, sizeof(why)), -EINVAL);
    remove(p);
    ASSERT_ERR(coord_token_read(p, tok, sizeof(tok), why, sizeof(why)), -ENOENT);
    ASSERT_CONTAINS(why, "cannot read");
    return 0;
}

TEST_MAIN(TEST(test_join), TEST(test_report), TEST(test_watch), TEST(test_hostport),
          TEST(test_token))
