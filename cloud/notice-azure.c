/* notice-azure.c: the Azure scheduled-events notice client (shared/anchors/cloud-apis.md §4).
 *
 * The one idea: the whole document is the state. "Nothing pending" is 200 with an empty
 * Events array; a Spot eviction is an event of type Preempt (Terminate for a user delete)
 * whose Resources name our VM, with NotBefore in RFC 1123 ("" once it has started). Requests
 * carry Metadata: true (400 without) and never go through a proxy. A worker whose state has
 * left acknowledges the event (POST StartRequests), so the eviction need not wait for
 * NotBefore. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h> /* free: json_dumps's buffer */
#include <string.h>

#include "check.h"          /* TRY */
#include "cloud-internal.h" /* cloud__http */

static const char *const azure_headers[] = {"Metadata: true", NULL};

struct azure_state {
    long incarnation; /* last DocumentIncarnation seen, -1 before the first */
};

static int azure_init(struct cloud_notice_client *c, void *state) {
    struct azure_state *s = state;
    s->incarnation = -1;
    return 0;
}

/* True when the event's Resources name our VM (or no VM name was configured). */
static bool names_us(struct cloud_notice_client *c, json_t *ev) {
    if (!c->vm_name[0])
        return true;
    json_t *res = json_object_get(ev, "Resources");
    size_t i;
    json_t *v;
    json_array_foreach(res, i, v) {
        if (json_is_string(v) && strcmp(json_string_value(v), c->vm_name) == 0)
            return true;
    }
    return false;
}

static int azure_poll(struct cloud_notice_client *c, void *state, struct cloud_notice *ret) {
    struct azure_state *s = state;
    struct cloud_http_reply rep;
    TRY(cloud__http(c, "GET", "/metadata/scheduledevents?api-version=2020-07-01", azure_headers,
                    &rep));
    int r = 0;
    json_t *j = NULL;
    if (rep.status != 200) {
        r = cloud__http_status_errno(rep.status);
        goto out;
    }
    json_error_t err;
    j = json_loadb(rep.body, rep.len, 0, &err);
    json_t *events = j ? json_object_get(j, "Events") : NULL;
    json_t *inc = j ? json_object_get(j, "DocumentIncarnation") : NULL;
    if (!json_is_array(events) || !json_is_integer(inc)) {
        r = -EBADMSG;
        goto out;
    }
    s->incarnation = (long)json_integer_value(inc);
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev) {
        json_t *type = json_object_get(ev, "EventType");
        json_t *id = json_object_get(ev, "EventId");
        json_t *nb = json_object_get(ev, "NotBefore");
        if (!json_is_string(type) || !json_is_string(id) || !json_is_string(nb) ||
            !json_is_array(json_object_get(ev, "Resources"))) {
            r = -EBADMSG;
            goto out;
        }
        if (strcmp(json_string_value(type), "Preempt") != 0 &&
            strcmp(json_string_value(type), "Terminate") != 0)
            continue;
        if (!names_us(c, ev))
            continue;
        const char *nbs = json_string_value(nb);
        double t = 0;
        if (*nbs && cloud_parse_rfc1123(nbs, &t) < 0) {
            r = -EBADMSG;
            goto out;
        }
        ret->kind = CLOUD_NOTICE_TERMINATE;
        ret->time = t;
        snprintf(ret->event_id, sizeof(ret->event_id), "%s", json_string_value(id));
        r = 1;
        goto out;
    }
out:
    json_decref(j);
    cloud__http_reply_done(&rep);
    return r;
}

static int azure_ack(struct cloud_notice_client *c, void *state, const char *event_id) {
    (void)state;
    static const char *const post_headers[] = {"Metadata: true",
                                               "Content-Type: application/json", NULL};
    json_t *doc = json_pack("{s:[{s:s}]}", "StartRequests", "EventId", event_id);
    char *body = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!body)
        return -ENOMEM;
    struct cloud_http_reply rep;
    int r = cloud__http_body(c, "POST", "/metadata/scheduledevents?api-version=2020-07-01",
                             post_headers, body, &rep);
    free(body); /* jansson's allocator */
    if (r < 0)
        return r;
    /* IMDS answers 200 with an empty body; any 2xx means the request was taken. */
    if (rep.status < 200 || rep.status > 299)
        r = cloud__http_status_errno(rep.status);
    cloud__http_reply_done(&rep);
    return r;
}

static int azure_identity(struct cloud_notice_client *c, void *state,
                          struct cloud_identity *id) {
    struct cloud_http_reply rep;
    TRY(cloud__http(c, "GET", "/metadata/instance/compute?api-version=2021-02-01",
                    azure_headers, &rep));
    int r = 0;
    json_t *j = NULL;
    if (rep.status != 200) {
        r = cloud__http_status_errno(rep.status);
        goto out;
    }
    json_error_t err;
    j = json_loadb(rep.body, rep.len, 0, &err);
    json_t *name = j ? json_object_get(j, "name") : NULL;
    json_t *size = j ? json_object_get(j, "vmSize") : NULL;
    json_t *zone = j ? json_object_get(j, "zone") : NULL;
    json_t *loc = j ? json_object_get(j, "location") : NULL;
    if (!json_is_string(name) || !json_is_string(size) || !json_is_string(loc) ||
        (zone && !json_is_string(zone))) {
        r = -EBADMSG;
        goto out;
    }
    /* An unzoned VM has zone ""; its location is the best placement we can name. */
    const char *z = zone && *json_string_value(zone) ? json_string_value(zone)
                                                      : json_string_value(loc);
    if (!*json_string_value(name) || strlen(json_string_value(name)) >= CLOUD_NAME_MAX ||
        strlen(json_string_value(size)) >= CLOUD_NAME_MAX || strlen(z) >= CLOUD_NAME_MAX) {
        r = -EBADMSG;
        goto out;
    }
    snprintf(id->instance_id, CLOUD_NAME_MAX, "%s", json_string_value(name));
    snprintf(id->instance_type, CLOUD_NAME_MAX, "%s", json_string_value(size));
    snprintf(id->zone, CLOUD_NAME_MAX, "%s", z);
out:
    json_decref(j);
    cloud__http_reply_done(&rep);
    return r;
}

const struct cloud_notice_ops cloud__azure_notice_ops = {
    .name = "azure",
    .state_size = sizeof(struct azure_state),
    .init = azure_init,
    .poll = azure_poll,
    .identity = azure_identity,
    .ack = azure_ack,
};
