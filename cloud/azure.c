/* azure.c: the `azure` provider — a job's spot fleet from Azure Resource Manager REST.
 *
 * The one idea: one virtualMachines create-or-update (PUT) per VM with priority Spot,
 * evictionPolicy Delete and billingProfile.maxPrice, its network interface created with it
 * through networkProfile.networkInterfaceConfigurations on fleet.azure.subnet (deleted with
 * it), so that a VM is one resource and the job's tags (spottrain-job, spottrain-job-id) are
 * the whole record: the resource group's VM list, kept to the job's tag, is reconciled by the
 * fleet engine (rest.c), which also sweeps it when the job ends. A create is a long-running
 * operation followed through its Azure-AsyncOperation URL; SkuNotAvailable or an allocation
 * failure moves the request to the next zone.
 *
 * Credentials, in azure-identity's order: a client secret from the environment
 * (AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_SECRET at AZURE_AUTHORITY_HOST, default
 * https://login.microsoftonline.com; http:// only on loopback, for tests), else a managed
 * identity from IMDS (AZURE_POD_IDENTITY_AUTHORITY_HOST or 169.254.169.254; the probe gives up
 * within 1 s). The endpoint is spec fleet.azure.endpoint (default https://management.azure.com).
 * The secret, the access token and the join token in customData are never logged nor shown by
 * a dry run. docs/gcp-azure.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"          /* TRY, TRY_GOTO */
#include "cloud-internal.h" /* cloud__fleet, cloud__rest_call */
#include "oauth.h"          /* st_azure_token_get */
#include "spec.h"           /* struct st_spec: subscription, resource group, subnet */

#define AZ_API "2024-03-01"          /* Microsoft.Compute virtualMachines */
#define AZ_CUSTOM_DATA_MAX 65535     /* bytes of customData before base64 (Azure: 64 KiB) */
#define AZ_RESOURCE "https://management.azure.com"
#define AZ_TRIES 4                   /* tries of one request when throttled or 5xx */
#define AZ_POLLS 120                 /* Azure-AsyncOperation polls before giving up */

struct az_state {
    struct cloud__rest_cloud rc; /* first: fleet, token, customData (rest.c) */
    char base[1024];  /* ENDPOINT/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/
                         virtualMachines */
    char location[48], vm_size[CLOUD_NAME_MAX], image[128], subnet[384];
    char job_name[128], job_id[40];
};

/* ---- calls ------------------------------------------------------------------------------- */

static bool capacity_error(const char *code) {
    static const char *const codes[] = {"SkuNotAvailable", "ZonalAllocationFailed",
        "AllocationFailed", "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest", "QuotaExceeded", "OperationNotAllowed",
        "SpotVMEvictionPolicyNotSupported"};
    for (size_t i = 0; i < ST_ARRAY_SIZE(codes); i++)
        if (!strcmp(code, codes[i]))
            return true;
    return false;
}

/* An ARM error body {"error": {"code", "message"}} into s->rc.fleet.last_error; its errno. */
static int arm_error(struct az_state *s, const json_t *body, long status) {
    const json_t *err = json_object_get(body, "error");
    const char *code = cloud__json_str(err, "code");
    snprintf(s->rc.fleet.last_error, sizeof(s->rc.fleet.last_error), "%s: %s",
             code[0] ? code : "no error code", cloud__json_str(err, "message"));
    if (capacity_error(code))
        return -EAGAIN;
    if (status == 401 || status == 403 || !strcmp(code, "AuthorizationFailed") ||
        !strcmp(code, "AuthenticationFailed") || !strcmp(code, "InvalidAuthenticationToken"))
        return -EACCES;
    if (status == 404 || !strcmp(code, "ResourceNotFound") || !strcmp(code, "NotFound"))
        return -ENOENT;
    return status == 400 ? -EINVAL : -EPROTO;
}

/* One authorised ARM call (rest.c's, retried when throttled or 5xx), its refusal turned into
 * an errno. In a dry run, shows it and returns 0 with rep->status 0. */
static int az_call(struct az_state *s, const char *method, const char *url, const json_t *body,
                   const json_t *shown, struct cloud__rest_reply *rep) {
    int r = cloud__rest_cloud_send(&s->rc, method, url, body, shown, rep);
    if (r < 0 || s->rc.dry_run)
        return r;
    if (rep->status >= 200 && rep->status < 300)
        return 0;
    r = arm_error(s, rep->json, rep->status);
    if (r != -ENOENT && r != -EAGAIN)
        cloud__log(s->rc.p, ST_LOG_ERR, "azure: %s %s refused (HTTP %ld): %s", method, url,
                   rep->status, s->rc.fleet.last_error);
    return r;
}

/* Polls an Azure-AsyncOperation URL until Succeeded, Failed or Canceled. */
static int az_follow(struct az_state *s, const char *op_url) {
    char url[1024];
    snprintf(url, sizeof(url), "%s", op_url);
    double wait = 0.1;
    for (int i = 0; i < AZ_POLLS; i++) {
        struct cloud__rest_reply rep;
        int r = az_call(s, "GET", url, NULL, NULL, &rep);
        if (r < 0) {
            cloud__rest_reply_done(&rep);
            return r;
        }
        const char *st = cloud__json_str(rep.json, "status");
        if (!strcmp(st, "Succeeded")) {
            cloud__rest_reply_done(&rep);
            return 0;
        }
        if (!strcmp(st, "Failed") || !strcmp(st, "Canceled")) {
            r = arm_error(s, rep.json, 200);
            if (r != -EAGAIN)
                cloud__log(s->rc.p, ST_LOG_ERR, "azure: operation %s: %s", st,
                           s->rc.fleet.last_error);
            cloud__rest_reply_done(&rep);
            return r == -ENOENT ? -EPROTO : r;
        }
        cloud__rest_reply_done(&rep);
        cloud__sleep(wait);
        wait = ST_MIN(wait * 2, 2.0);
    }
    return -ETIMEDOUT;
}

static json_t *image_reference(const char *image) {
    char pub[128], offer[128], sku[128], ver[128];
    if (sscanf(image, "%127[^:]:%127[^:]:%127[^:]:%127s", pub, offer, sku, ver) == 4)
        return json_pack("{s:s, s:s, s:s, s:s}", "publisher", pub, "offer", offer, "sku", sku,
                         "version", ver);
    return json_pack("{s:s}", "id", image);
}

/* The virtualMachines create-or-update body (VirtualMachine in the Compute spec). */
static json_t *vm_body(const struct az_state *s, const char *zone, const char *name,
                       const char *custom_data) {
    char nic[CLOUD_NAME_MAX + 8];
    snprintf(nic, sizeof(nic), "%s-nic", name);
    json_t *props = json_pack(
        "{s:{s:s}, s:{s:o, s:{s:s, s:s, s:{s:s}}},"
        " s:{s:s, s:s, s:s, s:{s:b, s:b}},"
        " s:{s:s, s:[{s:s, s:{s:b, s:s, s:[{s:s, s:{s:b, s:{s:s}}}]}}]}}",
        "hardwareProfile", "vmSize", s->vm_size,
        "storageProfile", "imageReference", image_reference(s->image), "osDisk", "createOption",
        "FromImage", "deleteOption", "Delete", "managedDisk", "storageAccountType",
        "Standard_LRS",
        "osProfile", "computerName", name, "adminUsername", "spottrain", "customData",
        custom_data, "linuxConfiguration", "disablePasswordAuthentication", 1,
        "provisionVMAgent", 1,
        "networkProfile", "networkApiVersion", "2020-11-01", "networkInterfaceConfigurations",
        "name", nic, "properties", "primary", 1, "deleteOption", "Delete", "ipConfigurations",
        "name", "ipconfig1", "properties", "primary", 1, "subnet", "id", s->subnet);
    if (!props)
        return NULL;
    if (s->rc.spot) {
        /* maxPrice -1: pay up to the on-demand price, never evicted for price, only for
         * capacity (the eviction the notice announces). */
        json_object_set_new(props, "priority", json_string("Spot"));
        json_object_set_new(props, "evictionPolicy", json_string("Delete"));
        json_object_set_new(props, "billingProfile", json_pack("{s:f}", "maxPrice", -1.0));
    } else {
        json_object_set_new(props, "priority", json_string("Regular"));
    }
    json_t *vm = json_pack("{s:s, s:{s:s, s:s}, s:o}", "location", s->location, "tags",
                           "spottrain-job", s->job_name, "spottrain-job-id", s->job_id,
                           "properties", props);
    if (vm && zone[0])
        json_object_set_new(vm, "zones", json_pack("[s]", zone));
    return vm;
}

static int az_create(void *backend, const char *zone, const char *name) {
    struct az_state *s = backend;
    struct cloud__rest_reply rep = {0};
    char url[1200];
    snprintf(url, sizeof(url), "%s/%s?api-version=" AZ_API, s->base, name);
    json_t *body = vm_body(s, zone, name, s->rc.boot);
    json_t *shown = vm_body(s, zone, name, s->rc.boot_shown);
    int r = body && shown ? az_call(s, "PUT", url, body, shown, &rep) : -ENOMEM;
    json_decref(body);
    json_decref(shown);
    if (r == 0 && !s->rc.dry_run && rep.async_op[0])
        r = az_follow(s, rep.async_op);
    if (r == -EAGAIN && !s->rc.dry_run) {
        /* A VM left in Failed would be swept anyway; delete it now. */
        struct cloud__rest_reply del;
        (void)az_call(s, "DELETE", url, NULL, NULL, &del);
        cloud__rest_reply_done(&del);
    }
    cloud__rest_reply_done(&rep);
    return r;
}

static int az_destroy(void *backend, const char *name, const char *zone) {
    (void)zone;
    struct az_state *s = backend;
    struct cloud__rest_reply rep;
    char url[1200];
    snprintf(url, sizeof(url), "%s/%s?api-version=" AZ_API, s->base, name);
    int r = az_call(s, "DELETE", url, NULL, NULL, &rep);
    cloud__rest_reply_done(&rep);
    return r;
}

static bool state_alive(const char *st) {
    return !strcmp(st, "Creating") || !strcmp(st, "Updating") || !strcmp(st, "Succeeded") ||
           !strcmp(st, "Migrating") || !st[0];
}

static int az_list(void *backend, cloud__fleet_seen_fn *fn, void *userdata) {
    struct az_state *s = backend;
    char url[4096];
    snprintf(url, sizeof(url), "%s?api-version=" AZ_API, s->base);
    for (int pages = 0; pages < 1000; pages++) {
        struct cloud__rest_reply rep;
        int r = az_call(s, "GET", url, NULL, NULL, &rep);
        if (r < 0) {
            cloud__rest_reply_done(&rep);
            return r;
        }
        if (s->rc.dry_run)
            return 0;
        const json_t *vms = json_object_get(rep.json, "value");
        size_t i;
        const json_t *vm;
        json_array_foreach(vms, i, vm) {
            /* The resource group holds other VMs too: the job's tag decides. */
            if (strcmp(cloud__json_str(json_object_get(vm, "tags"),
                                       s->rc.by_name ? "spottrain-job" : "spottrain-job-id"),
                       s->rc.by_name ? s->job_name : s->job_id))
                continue;
            const char *zone = json_string_value(json_array_get(json_object_get(vm, "zones"),
                                                                0));
            const char *st = cloud__json_str(json_object_get(vm, "properties"),
                                             "provisioningState");
            if ((r = fn(userdata, cloud__json_str(vm, "name"), zone ? zone : "",
                        state_alive(st))) < 0)
                break;
        }
        const char *next = cloud__json_str(rep.json, "nextLink");
        snprintf(url, sizeof(url), "%s", next);
        cloud__rest_reply_done(&rep);
        if (r < 0)
            return r;
        if (!url[0])
            break;
    }
    return 0;
}

static const struct cloud__fleet_ops az_fleet_ops = {az_create, az_list, az_destroy};

/* ---- the provider ------------------------------------------------------------------------- */

/* customData: the bootstrap script, base64. */
static int custom_data(const struct cloud_config *cfg, const char *coordinator, bool redact,
                       char **ret) {
    char *script = NULL;
    TRY(cloud__bootstrap_script(cfg, coordinator, "azure", redact, AZ_CUSTOM_DATA_MAX,
                                AZ_CUSTOM_DATA_MAX / 2, &script));
    struct st_sbuf b = {.max = AZ_CUSTOM_DATA_MAX * 2};
    st_sb_base64(&b, script, strlen(script), false);
    memset(script, 0, strlen(script));
    st_free(script);
    if (b.fail) {
        st_sb_done(&b);
        return -E2BIG;
    }
    *ret = b.p;
    return 0;
}

/* The subscription, resource group and endpoint of the spec into s->base (launch, down). */
static int az_base_init(struct az_state *s, const struct st_spec_fleet *f) {
    if (!f->subscription[0] || !f->resource_group[0]) {
        cloud__log(s->rc.p, ST_LOG_ERR, "azure: fleet.subscription and fleet.resource_group are "
                   "required");
        return -EINVAL;
    }
    const char *ep = f->azure_endpoint[0] ? f->azure_endpoint : AZ_RESOURCE;
    int el = cloud__rest_endpoint_len(&s->rc, "fleet.azure.endpoint", ep);
    if (el < 0)
        return el;
    snprintf(s->base, sizeof(s->base), "%.*s/subscriptions/%s/resourceGroups/%s/providers/"
             "Microsoft.Compute/virtualMachines", el, ep, f->subscription,
             f->resource_group);
    return 0;
}

/* cloud__rest_cloud_ops.down_init: the sweep lists by the job-name tag. */
static int az_down_init(void *state, const struct cloud_config *cfg, const char *job_name) {
    struct az_state *s = state;
    TRY(az_base_init(s, &cfg->spec->fleet));
    snprintf(s->job_name, sizeof(s->job_name), "%s", job_name);
    return 0;
}

static const struct cloud__rest_cloud_ops az_rest_ops;

static int az_init(struct cloud_provider *p, void *state, const struct cloud_config *cfg) {
    struct az_state *s = state;
    const struct st_spec *sp = cfg->spec;
    int r;
    cloud__rest_cloud_init(&s->rc, &az_rest_ops, p, cfg);
    if (!sp) {
        cloud__log(p, ST_LOG_ERR, "azure: the provider needs the job spec");
        return -EINVAL;
    }
    const struct st_spec_fleet *f = &sp->fleet;
    const char *coordinator = sp->coordinator.advertise[0] ? sp->coordinator.advertise
                                                           : cfg->coordinator;
    snprintf(s->image, sizeof(s->image), "%s", cfg->image[0] ? cfg->image : f->image);
    if (!s->image[0] || !f->subscription[0] || !f->resource_group[0] || !f->location[0] ||
        !f->azure_subnet[0]) {
        cloud__log(p, ST_LOG_ERR, "azure: fleet.image, fleet.subscription, "
                   "fleet.resource_group, fleet.location and fleet.azure.subnet are required");
        return -EINVAL;
    }
    if (!cfg->job_name[0] || !cfg->job_id[0] || !coordinator[0]) {
        cloud__log(p, ST_LOG_ERR, "azure: invalid configuration (job name, job id, "
                   "coordinator address)");
        return -EINVAL;
    }
    TRY(az_base_init(s, f));
    snprintf(s->location, sizeof(s->location), "%s", f->location);
    snprintf(s->subnet, sizeof(s->subnet), "%s", f->azure_subnet);
    snprintf(s->vm_size, sizeof(s->vm_size), "%s", cfg->instance_type);
    snprintf(s->job_name, sizeof(s->job_name), "%s", cfg->job_name);
    snprintf(s->job_id, sizeof(s->job_id), "%s", cfg->job_id);
    if ((r = custom_data(cfg, coordinator, false, &s->rc.boot)) < 0 ||
        (r = custom_data(cfg, coordinator, true, &s->rc.boot_shown)) < 0) {
        if (r == -E2BIG)
            cloud__log(p, ST_LOG_ERR, "azure: the bootstrap exceeds customData's %d bytes",
                       AZ_CUSTOM_DATA_MAX);
        goto out;
    }
    /* Zones in a location are "1", "2", "3"; none given = Azure places the VM. */
    TRY_GOTO(cloud__fleet_init(&s->rc.fleet, p, "azure", &az_fleet_ops, s, cfg, f->nzones), r,
             out);
    cloud__log(p, ST_LOG_INFO, "azure: %s in %s, %d x %s from %s%s", s->base, s->location,
               s->rc.fleet.target, s->vm_size, s->image, s->rc.spot ? " (spot)" : "");
    return 0;
out:
    cloud__rest_cloud_free_boot(&s->rc);
    return r;
}

static const struct cloud__rest_cloud_ops az_rest_ops = {
    .name = "azure",
    .state_size = sizeof(struct az_state),
    .token_get = st_azure_token_get,
    .scope = AZ_RESOURCE,
    .tries = AZ_TRIES,
    .fleet = &az_fleet_ops,
    .down_init = az_down_init,
};

const struct cloud_provider_ops cloud__azure_ops = {
    .name = "azure",
    .state_size = sizeof(struct az_state),
    .init = az_init,
    CLOUD__REST_CLOUD_PROVIDER_OPS,
};

/* See cloud.h. */
int cloud_azure_down(const struct cloud_config *cfg, const char *job_name) {
    return cloud__rest_cloud_down(&az_rest_ops, cfg, job_name);
}
