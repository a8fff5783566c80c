/* notice-aws.c: the IMDSv2 notice client (shared/anchors/cloud-apis.md §1) — the code a worker
 * runs on EC2 and, unchanged, against the sim provider's loopback endpoint.
 *
 * The one idea: one session token, reused until shortly before it expires (or until a 401
 * says it has), then spot/instance-action (404 = nothing) and, when that is quiet, the
 * rebalance recommendation. An interruption always outranks a rebalance hint. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "check.h"          /* TRY */
#include "cloud-internal.h" /* cloud__http */

#define AWS_TOKEN_MAX 256

struct aws_state {
    char token[AWS_TOKEN_MAX];
    bool have_token;
    double expires; /* client clock seconds */
};

/* Gets a fresh token when there is none or it expires within min(15 s, ttl / 4). */
static int aws_token(struct cloud_notice_client *c, struct aws_state *s, bool force) {
    double now = cloud__client_now(c);
    double margin = ST_MIN(15.0, (double)c->token_ttl / 4.0);
    if (s->have_token && !force && now < s->expires - margin)
        return 0;
    s->have_token = false;
    char ttl_hdr[80];
    snprintf(ttl_hdr, sizeof(ttl_hdr), "X-aws-ec2-metadata-token-ttl-seconds: %ld", c->token_ttl);
    const char *hdrs[] = {ttl_hdr, NULL};
    struct cloud_http_reply rep;
    TRY(cloud__http(c, "PUT", "/latest/api/token", hdrs, &rep));
    int r = 0;
    if (rep.status != 200) {
        r = cloud__http_status_errno(rep.status);
        goto out;
    }
    size_t len = rep.len;
    while (len > 0 && (rep.body[len - 1] == '\n' || rep.body[len - 1] == '\r'))
        len--;
    if (len == 0 || len >= AWS_TOKEN_MAX) {
        r = -EBADMSG;
        goto out;
    }
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)rep.body[i] <= ' ' || (unsigned char)rep.body[i] > '~') {
            r = -EBADMSG;
            goto out;
        }
    memcpy(s->token, rep.body, len);
    s->token[len] = '\0';
    s->have_token = true;
    /* The server's TTL header wins; without one, trust what we asked for. */
    s->expires = now + (double)(rep.ttl_header > 0 ? rep.ttl_header : c->token_ttl);
out:
    cloud__http_reply_done(&rep);
    return r;
}

/* GET with the token; one refresh and retry on 401. */
static int aws_get(struct cloud_notice_client *c, struct aws_state *s, const char *path,
                   struct cloud_http_reply *ret_rep) {
    for (int attempt = 0;; attempt++) {
        TRY(aws_token(c, s, attempt > 0));
        char hdr[AWS_TOKEN_MAX + 40];
        snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s", s->token);
        const char *hdrs[] = {hdr, NULL};
        struct cloud_http_reply rep;
        TRY(cloud__http(c, "GET", path, hdrs, &rep));
        if (rep.status == 401 && attempt == 0) {
            s->have_token = false;
            cloud__http_reply_done(&rep);
            continue;
        }
        *ret_rep = rep;
        return 0;
    }
}

/* Parses a JSON object body and returns its string member `key` (borrowed from *ret_json). */
static int json_string_member(const struct cloud_http_reply *rep, const char *key,
                              json_t **ret_json, const char **ret_value) {
    json_error_t err;
    json_t *j = json_loadb(rep->body, rep->len, 0, &err);
    if (!j)
        return -EBADMSG;
    json_t *v = json_is_object(j) ? json_object_get(j, key) : NULL;
    if (!json_is_string(v)) {
        json_decref(j);
        return -EBADMSG;
    }
    *ret_json = j;
    *ret_value = json_string_value(v);
    return 0;
}

static int aws_poll(struct cloud_notice_client *c, void *state, struct cloud_notice *ret) {
    struct aws_state *s = state;
    struct cloud_http_reply rep;
    json_t *j = NULL;
    const char *v;
    TRY(aws_get(c, s, "/latest/meta-data/spot/instance-action", &rep));
    int r = 0;
    if (rep.status == 200) {
        TRY_GOTO(json_string_member(&rep, "action", &j, &v), r, out);
        if (strcmp(v, "terminate") == 0)
            ret->kind = CLOUD_NOTICE_TERMINATE;
        else if (strcmp(v, "stop") == 0)
            ret->kind = CLOUD_NOTICE_STOP;
        else if (strcmp(v, "hibernate") == 0)
            ret->kind = CLOUD_NOTICE_HIBERNATE;
        else {
            r = -EBADMSG;
            goto out;
        }
        json_t *t = json_object_get(j, "time");
        if (!json_is_string(t) || cloud_parse_rfc3339(json_string_value(t), &ret->time) < 0) {
            r = -EBADMSG;
            goto out;
        }
        r = 1;
        goto out;
    }
    if (rep.status != 404) {
        r = cloud__http_status_errno(rep.status);
        goto out;
    }
    cloud__http_reply_done(&rep);
    TRY(aws_get(c, s, "/latest/meta-data/events/recommendations/rebalance", &rep));
    if (rep.status == 404)
        goto out;
    if (rep.status != 200) {
        r = cloud__http_status_errno(rep.status);
        goto out;
    }
    TRY_GOTO(json_string_member(&rep, "noticeTime", &j, &v), r, out);
    if (cloud_parse_rfc3339(v, &ret->time) < 0) {
        r = -EBADMSG;
        goto out;
    }
    ret->kind = CLOUD_NOTICE_REBALANCE;
    r = 1;
out:
    json_decref(j);
    cloud__http_reply_done(&rep);
    return r;
}

/* Reads one plain-text leaf into buf (size CLOUD_NAME_MAX). */
static int aws_leaf(struct cloud_notice_client *c, struct aws_state *s, const char *path,
                    char *buf) {
    struct cloud_http_reply rep;
    TRY(aws_get(c, s, path, &rep));
    int r = 0;
    if (rep.status != 200)
        r = cloud__http_status_errno(rep.status);
    else if (rep.len == 0 || rep.len >= CLOUD_NAME_MAX || strchr(rep.body, '\n'))
        r = -EBADMSG;
    else
        memcpy(buf, rep.body, rep.len + 1);
    cloud__http_reply_done(&rep);
    return r;
}

static int aws_identity(struct cloud_notice_client *c, void *state, struct cloud_identity *id) {
    struct aws_state *s = state;
    TRY(aws_leaf(c, s, "/latest/meta-data/instance-id", id->instance_id));
    TRY(aws_leaf(c, s, "/latest/meta-data/instance-type", id->instance_type));
    TRY(aws_leaf(c, s, "/latest/meta-data/placement/availability-zone", id->zone));
    return 0;
}

const struct cloud_notice_ops cloud__aws_notice_ops = {
    .name = "aws",
    .state_size = sizeof(struct aws_state),
    .poll = aws_poll,
    .identity = aws_identity,
};
