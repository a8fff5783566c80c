/* gcp.c: the `gcp` provider — a job's spot fleet from the Compute Engine v1 REST API.
 *
 * The one idea: one instances.insert per instance with scheduling.provisioningModel SPOT and
 * instanceTerminationAction DELETE, so a preempted instance deletes itself and the job's
 * labels (spottrain-job, spottrain-job-id) are the whole record: instances.list filtered by
 * the job-id label is reconciled by the fleet engine (rest.c), which also sweeps it when the
 * job ends. An insert's Operation is followed with zoneOperations.wait; an operation that
 * ends in ZONE_RESOURCE_POOL_EXHAUSTED (or another capacity error) moves the request to the
 * next zone.
 *
 * Credentials, in the order Google's libraries look: the service-account key file named by
 * GOOGLE_APPLICATION_CREDENTIALS (a JWT signed RS256 with OpenSSL, exchanged at the key's
 * token_uri for an access token), else the metadata server's token (GCE_METADATA_HOST or
 * metadata.google.internal; its answers carry Metadata-Flavor: Google; the probe gives up
 * within 1 s). The endpoint is spec fleet.gcp.endpoint (default https://compute.googleapis.com)
 * with /compute/v1/ appended, as the discovery document's rootUrl + servicePath. The access
 * token, the key and the join token in the startup-script are never logged nor shown by a
 * dry run. docs/gcp-azure.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"          /* TRY, TRY_GOTO */
#include "cloud-internal.h" /* cloud__fleet, cloud__rest_call */
#include "oauth.h"          /* st_gcp_token_get */
#include "spec.h"           /* struct st_spec: project, endpoint */

#define GCP_SCRIPT_MAX (256u << 10) /* GCE's limit on all metadata values together */
#define GCP_SCOPE "https://www.googleapis.com/auth/compute"
#define GCP_TRIES 4      /* tries of one request when throttled or 5xx */
#define GCP_WAITS 20     /* zoneOperations.wait calls before an operation is given up */

struct gcp_state {
    struct cloud__rest_cloud rc; /* first: fleet, token, startup-script (rest.c) */
    char base[CLOUD_URL_MAX + 64];  /* ENDPOINT/compute/v1/projects/PROJECT */
    char project[64];
    char machine_type[CLOUD_NAME_MAX], image[128];
    char label_job[64], job_id[40];
};

/* ---- calls ------------------------------------------------------------------------------- */

/* The reasons of a Compute error or a failed Operation that mean "no capacity here". */
static bool capacity_error(const char *code) {
    static const char *const codes[] = {"ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "QUOTA_EXCEEDED", "RESOURCE_EXHAUSTED",
        "UNSUPPORTED_OPERATION", "resourceExhausted"};
    for (size_t i = 0; i < ST_ARRAY_SIZE(codes); i++)
        if (!strcmp(code, codes[i]))
            return true;
    return false;
}

/* The first error code of an Operation's error.errors[] or an HTTP error's error.errors[]
 * (reason), into s->rc.fleet.last_error. */
static void note_error(struct gcp_state *s, const json_t *err) {
    const json_t *e0 = json_array_get(json_object_get(err, "errors"), 0);
    const char *code = cloud__json_str(e0, "code");
    if (!code[0])
        code = cloud__json_str(e0, "reason");
    const char *msg = cloud__json_str(e0, "message");
    if (!msg[0])
        msg = cloud__json_str(err, "message");
    snprintf(s->rc.fleet.last_error, sizeof(s->rc.fleet.last_error), "%s%s%s",
             code[0] ? code : cloud__json_str(err, "status"), msg[0] ? ": " : "", msg);
}

/* One authorised Compute call (rest.c's, retried when throttled or 5xx), its refusal turned
 * into an errno. In a dry run, shows it and returns 0 with rep->status 0. */
static int gcp_call(struct gcp_state *s, const char *method, const char *url,
                    const json_t *body, const json_t *shown, struct cloud__rest_reply *rep) {
    int r = cloud__rest_cloud_send(&s->rc, method, url, body, shown, rep);
    if (r < 0 || s->rc.dry_run)
        return r;
    if (rep->status >= 200 && rep->status < 300)
        return 0;
    const json_t *err = json_object_get(rep->json, "error");
    note_error(s, err);
    const json_t *e0 = json_array_get(json_object_get(err, "errors"), 0);
    if (rep->status == 401 || rep->status == 403) {
        if (capacity_error(cloud__json_str(e0, "reason")))
            return -EAGAIN;
        cloud__log(s->rc.p, ST_LOG_ERR, "gcp: %s %s refused (HTTP %ld): %s", method, url,
                   rep->status, s->rc.fleet.last_error);
        return -EACCES;
    }
    if (rep->status == 404)
        return -ENOENT;
    if (capacity_error(cloud__json_str(e0, "reason")) ||
        capacity_error(cloud__json_str(e0, "code")))
        return -EAGAIN;
    cloud__log(s->rc.p, ST_LOG_ERR, "gcp: %s %s failed (HTTP %ld): %s", method, url, rep->status,
               s->rc.fleet.last_error);
    return rep->status == 400 ? -EINVAL : -EPROTO;
}

/* Follows an Operation to DONE with zoneOperations.wait. Returns 0 when it succeeded,
 * -EAGAIN for a capacity error, another negative errno otherwise. Takes the reply's JSON. */
static int gcp_wait(struct gcp_state *s, const char *zone, struct cloud__rest_reply *rep) {
    int r = 0;
    for (int i = 0; i < GCP_WAITS; i++) {
        const json_t *op = rep->json;
        if (!json_is_object(op)) {
            r = -EBADMSG;
            break;
        }
        if (!strcmp(cloud__json_str(op, "status"), "DONE")) {
            const json_t *err = json_object_get(op, "error");
            if (!err)
                return 0;
            note_error(s, err);
            const json_t *e0 = json_array_get(json_object_get(err, "errors"), 0);
            if (capacity_error(cloud__json_str(e0, "code")))
                return -EAGAIN;
            cloud__log(s->rc.p, ST_LOG_ERR, "gcp: operation '%s' failed: %s",
                       cloud__json_str(op, "name"), s->rc.fleet.last_error);
            return -EPROTO;
        }
        char url[CLOUD_URL_MAX + 512];
        snprintf(url, sizeof(url), "%s/zones/%s/operations/%s/wait", s->base, zone,
                 cloud__json_str(op, "name"));
        struct cloud__rest_reply next;
        r = gcp_call(s, "POST", url, NULL, NULL, &next);
        cloud__rest_reply_done(rep);
        *rep = next;
        if (r < 0)
            return r;
    }
    return r < 0 ? r : -ETIMEDOUT;
}

/* The instances.insert body (the Instance schema of compute.v1.json). */
static json_t *instance_body(const struct gcp_state *s, const char *zone, const char *name,
                             const char *script) {
    char mt[CLOUD_NAME_MAX * 2 + 32];
    snprintf(mt, sizeof(mt), "zones/%s/machineTypes/%s", zone, s->machine_type);
    json_t *sched = s->rc.spot ? json_pack("{s:s, s:s, s:b, s:s}", "provisioningModel", "SPOT",
                                        "instanceTerminationAction", "DELETE",
                                        "automaticRestart", 0, "onHostMaintenance", "TERMINATE")
                            : json_pack("{s:s}", "provisioningModel", "STANDARD");
    return json_pack(
        "{s:s, s:s, s:{s:s, s:s}, s:[{s:b, s:b, s:{s:s}}], s:[{s:s, s:[{s:s, s:s}]}],"
        " s:o, s:{s:[{s:s, s:s}]}}",
        "name", name, "machineType", mt,
        "labels", "spottrain-job", s->label_job, "spottrain-job-id", s->job_id,
        "disks", "boot", 1, "autoDelete", 1, "initializeParams", "sourceImage", s->image,
        "networkInterfaces", "network", "global/networks/default", "accessConfigs", "type",
        "ONE_TO_ONE_NAT", "name", "External NAT",
        "scheduling", sched,
        "metadata", "items", "key", "startup-script", "value", script);
}

static int gcp_create(void *backend, const char *zone, const char *name) {
    struct gcp_state *s = backend;
    struct cloud__rest_reply rep = {0};
    char url[CLOUD_URL_MAX + 256];
    snprintf(url, sizeof(url), "%s/zones/%s/instances", s->base, zone);
    json_t *body = instance_body(s, zone, name, s->rc.boot);
    json_t *shown = instance_body(s, zone, name, s->rc.boot_shown);
    int r = body && shown ? gcp_call(s, "POST", url, body, shown, &rep) : -ENOMEM;
    json_decref(body);
    json_decref(shown);
    if (r == 0 && !s->rc.dry_run)
        r = gcp_wait(s, zone, &rep);
    if (r == -EAGAIN && !s->rc.dry_run) {
        /* An instance left behind by a failed insert would be swept anyway; delete it now. */
        snprintf(url, sizeof(url), "%s/zones/%s/instances/%s", s->base, zone, name);
        struct cloud__rest_reply del;
        (void)gcp_call(s, "DELETE", url, NULL, NULL, &del);
        cloud__rest_reply_done(&del);
    }
    cloud__rest_reply_done(&rep);
    return r;
}

static int gcp_destroy(void *backend, const char *name, const char *zone) {
    struct gcp_state *s = backend;
    struct cloud__rest_reply rep;
    char url[CLOUD_URL_MAX + 256];
    snprintf(url, sizeof(url), "%s/zones/%s/instances/%s", s->base, zone, name);
    int r = gcp_call(s, "DELETE", url, NULL, NULL, &rep);
    cloud__rest_reply_done(&rep);
    return r;
}

static bool status_alive(const char *st) {
    return !strcmp(st, "PROVISIONING") || !strcmp(st, "STAGING") || !strcmp(st, "RUNNING") ||
           !strcmp(st, "REPAIRING");
}

static int gcp_list(void *backend, cloud__fleet_seen_fn *fn, void *userdata) {
    struct gcp_state *s = backend;
    for (int z = 0; z < s->rc.fleet.nzones; z++) {
        const char *zone = s->rc.fleet.zones[z];
        char page[512] = "";
        for (int pages = 0; pages < 1000; pages++) {
            struct st_sbuf url = {.max = 4096};
            struct cloud__rest_reply rep;
            char filter[128];
            const char *key = s->rc.by_name ? "spottrain-job" : "spottrain-job-id";
            const char *want = s->rc.by_name ? s->label_job : s->job_id;
            snprintf(filter, sizeof(filter), "labels.%s=\"%s\"", key, want);
            st_sb_str(&url, s->base);
            st_sb_str(&url, "/zones/");
            st_sb_str(&url, zone);
            st_sb_str(&url, "/instances?filter=");
            st_sb_escape(&url, filter);
            if (page[0]) {
                st_sb_str(&url, "&pageToken=");
                st_sb_escape(&url, page);
            }
            memset(&rep, 0, sizeof(rep));
            int r = url.fail ? -ENOMEM : gcp_call(s, "GET", url.p, NULL, NULL, &rep);
            st_sb_done(&url);
            if (r < 0) {
                cloud__rest_reply_done(&rep); /* a refusal's error body */
                return r;
            }
            if (s->rc.dry_run)
                break;
            const json_t *items = json_object_get(rep.json, "items");
            size_t i;
            const json_t *it;
            json_array_foreach(items, i, it) {
                const json_t *labels = json_object_get(it, "labels");
                /* The filter is the server's; the label is checked again here. */
                if (strcmp(cloud__json_str(labels, key), want))
                    continue;
                if ((r = fn(userdata, cloud__json_str(it, "name"), zone,
                            status_alive(cloud__json_str(it, "status")))) < 0)
                    break;
            }
            snprintf(page, sizeof(page), "%s", cloud__json_str(rep.json, "nextPageToken"));
            cloud__rest_reply_done(&rep);
            if (r < 0)
                return r;
            if (!page[0])
                break;
        }
    }
    return 0;
}

static const struct cloud__fleet_ops gcp_fleet_ops = {gcp_create, gcp_list, gcp_destroy};

/* ---- the provider ------------------------------------------------------------------------- */

/* GCE label values: lower case letters, digits, '_' and '-', at most 63. */
static void label_value(const char *in, char *out, size_t size) {
    size_t n = 0;
    for (; *in && n + 1 < size && n < 63; in++) {
        char c = *in;
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        out[n++] = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'
                       ? c : '-';
    }
    out[n] = '\0';
}

/* The project, zones and endpoint of the spec into s->base (launch and down). */
static int gcp_base_init(struct gcp_state *s, const struct st_spec *sp) {
    snprintf(s->project, sizeof(s->project), "%s", sp->fleet.project);
    if (!s->project[0] || sp->fleet.nzones == 0) {
        cloud__log(s->rc.p, ST_LOG_ERR, "gcp: fleet.project and fleet.zones are required");
        return -EINVAL;
    }
    const char *ep = sp->fleet.gcp_endpoint[0] ? sp->fleet.gcp_endpoint
                                               : "https://compute.googleapis.com";
    int el = cloud__rest_endpoint_len(&s->rc, "fleet.gcp.endpoint", ep);
    if (el < 0)
        return el;
    snprintf(s->base, sizeof(s->base), "%.*s/compute/v1/projects/%s", el, ep, s->project);
    return 0;
}

/* cloud__rest_cloud_ops.down_init: the sweep lists by the job-name label. */
static int gcp_down_init(void *state, const struct cloud_config *cfg, const char *job_name) {
    struct gcp_state *s = state;
    TRY(gcp_base_init(s, cfg->spec));
    label_value(job_name, s->label_job, sizeof(s->label_job));
    return 0;
}

static const struct cloud__rest_cloud_ops gcp_rest_ops;

static int gcp_init(struct cloud_provider *p, void *state, const struct cloud_config *cfg) {
    struct gcp_state *s = state;
    const struct st_spec *sp = cfg->spec;
    int r;
    cloud__rest_cloud_init(&s->rc, &gcp_rest_ops, p, cfg);
    if (!sp) {
        cloud__log(p, ST_LOG_ERR, "gcp: the provider needs the job spec");
        return -EINVAL;
    }
    const char *coordinator = sp->coordinator.advertise[0] ? sp->coordinator.advertise
                                                           : cfg->coordinator;
    snprintf(s->image, sizeof(s->image), "%s", cfg->image[0] ? cfg->image : sp->fleet.image);
    if (!s->image[0] || !sp->fleet.project[0] || sp->fleet.nzones == 0) {
        cloud__log(p, ST_LOG_ERR, "gcp: fleet.image, fleet.project and fleet.zones are "
                   "required");
        return -EINVAL;
    }
    if (!cfg->job_name[0] || !cfg->job_id[0] || !coordinator[0]) {
        cloud__log(p, ST_LOG_ERR, "gcp: invalid configuration (job name, job id, coordinator "
                   "address)");
        return -EINVAL;
    }
    TRY(gcp_base_init(s, sp));
    snprintf(s->machine_type, sizeof(s->machine_type), "%s", cfg->instance_type);
    label_value(cfg->job_id, s->job_id, sizeof(s->job_id));
    label_value(cfg->job_name, s->label_job, sizeof(s->label_job));
    TRY_GOTO(cloud__bootstrap_script(cfg, coordinator, "gcp", false, GCP_SCRIPT_MAX,
                                     GCP_SCRIPT_MAX / 2, &s->rc.boot), r, out);
    TRY_GOTO(cloud__bootstrap_script(cfg, coordinator, "gcp", true, GCP_SCRIPT_MAX,
                                     GCP_SCRIPT_MAX / 2, &s->rc.boot_shown), r, out);
    TRY_GOTO(cloud__fleet_init(&s->rc.fleet, p, "gcp", &gcp_fleet_ops, s, cfg, sp->fleet.nzones),
             r, out);
    cloud__log(p, ST_LOG_INFO, "gcp: %s, %d x %s from %s%s", s->base, s->rc.fleet.target,
               s->machine_type, s->image, s->rc.spot ? " (spot)" : "");
    return 0;
out:
    cloud__rest_cloud_free_boot(&s->rc);
    return r;
}

static const struct cloud__rest_cloud_ops gcp_rest_ops = {
    .name = "gcp",
    .state_size = sizeof(struct gcp_state),
    .token_get = st_gcp_token_get,
    .scope = GCP_SCOPE,
    .tries = GCP_TRIES,
    .fleet = &gcp_fleet_ops,
    .down_init = gcp_down_init,
};

const struct cloud_provider_ops cloud__gcp_ops = {
    .name = "gcp",
    .state_size = sizeof(struct gcp_state),
    .init = gcp_init,
    CLOUD__REST_CLOUD_PROVIDER_OPS,
};

/* See cloud.h. */
int cloud_gcp_down(const struct cloud_config *cfg, const char *job_name) {
    return cloud__rest_cloud_down(&gcp_rest_ops, cfg, job_name);
}
