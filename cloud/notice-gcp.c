/* notice-gcp.c: the GCE metadata notice client (shared/anchors/cloud-apis.md §3).
 *
 * The one idea: on GCE "nothing pending" is 200 FALSE, not 404, and every request must carry
 * Metadata-Flavor: Google (403 without). A preempted VM reads TRUE on instance/preempted; a
 * host-maintenance termination reads TERMINATE_ON_HOST_MAINTENANCE on maintenance-event.
 * GCE gives no deadline in either, so the notice's time is 0 (Spot VMs get 30 s). */
#include <string.h>

#include "check.h"          /* TRY */
#include "cloud-internal.h" /* cloud__http */

static const char *const gcp_headers[] = {"Metadata-Flavor: Google", NULL};

/* GET a plain-text value into buf (trailing newline dropped). */
static int gcp_get(struct cloud_notice_client *c, const char *path, char *buf, size_t size) {
    struct cloud_http_reply rep;
    TRY(cloud__http(c, "GET", path, gcp_headers, &rep));
    int r = 0;
    size_t len = rep.len;
    while (len > 0 && (rep.body[len - 1] == '\n' || rep.body[len - 1] == '\r'))
        len--;
    if (rep.status != 200)
        r = cloud__http_status_errno(rep.status);
    else if (len == 0 || len >= size || memchr(rep.body, '\n', len))
        r = -EBADMSG;
    else {
        memcpy(buf, rep.body, len);
        buf[len] = '\0';
    }
    cloud__http_reply_done(&rep);
    return r;
}

static int gcp_poll(struct cloud_notice_client *c, void *state, struct cloud_notice *ret) {
    char v[64];
    TRY(gcp_get(c, "/computeMetadata/v1/instance/preempted", v, sizeof(v)));
    if (strcmp(v, "TRUE") == 0) {
        ret->kind = CLOUD_NOTICE_TERMINATE;
        return 1;
    }
    if (strcmp(v, "FALSE") != 0)
        return -EBADMSG;
    TRY(gcp_get(c, "/computeMetadata/v1/instance/maintenance-event", v, sizeof(v)));
    if (strcmp(v, "TERMINATE_ON_HOST_MAINTENANCE") == 0) {
        ret->kind = CLOUD_NOTICE_TERMINATE;
        return 1;
    }
    if (strcmp(v, "NONE") != 0 && strcmp(v, "MIGRATE_ON_HOST_MAINTENANCE") != 0)
        return -EBADMSG;
    return 0;
}

/* "projects/123/zones/us-central1-a" -> "us-central1-a" (in place). */
static void last_segment(char *s) {
    char *slash = strrchr(s, '/');
    if (slash)
        memmove(s, slash + 1, strlen(slash + 1) + 1);
}

static int gcp_identity(struct cloud_notice_client *c, void *state, struct cloud_identity *id) {
    TRY(gcp_get(c, "/computeMetadata/v1/instance/name", id->instance_id, CLOUD_NAME_MAX));
    char buf[256];
    TRY(gcp_get(c, "/computeMetadata/v1/instance/machine-type", buf, sizeof(buf)));
    last_segment(buf);
    if (!*buf || strlen(buf) >= CLOUD_NAME_MAX)
        return -EBADMSG;
    memcpy(id->instance_type, buf, strlen(buf) + 1);
    TRY(gcp_get(c, "/computeMetadata/v1/instance/zone", buf, sizeof(buf)));
    last_segment(buf);
    if (!*buf || strlen(buf) >= CLOUD_NAME_MAX)
        return -EBADMSG;
    memcpy(id->zone, buf, strlen(buf) + 1);
    return 0;
}

const struct cloud_notice_ops cloud__gcp_notice_ops = {
    .name = "gcp",
    .state_size = 0,
    .poll = gcp_poll,
    .identity = gcp_identity,
};
