/* rest.c: what the JSON-over-HTTPS providers (gcp, azure) share — one bounded HTTP call with
 * its answer parsed as JSON, the fleet engine that keeps a target number of instances alive
 * over zones, and the provider around it (token, retries, dry run, the provider entry points,
 * `down`), so that gcp.c and azure.c hold only what their APIs differ in.
 *
 * The one idea of the fleet engine: a cloud's own labels or tags are the fleet's record, as
 * in aws.c. The backend only knows how to create one named instance in a zone, list the
 * job's instances (by label or tag) and delete one; the engine spreads what is missing over
 * the zones (a zone without capacity passes its share to the next), reconciles the listing
 * against what it believes (losses, adoption after a restart) and sweeps everything the
 * listing shows when the provider ends, unless it was detached. */
#include <curl/curl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "check.h"          /* TRY, TRY_GOTO */
#include "cloud-internal.h" /* cloud__emit, cloud__log, cloud__rest_* */
#include "http.h"           /* st_sbuf, st_curl_errno */
#include "oauth.h"          /* st_url_is_loopback */

#define REST_REPLY_MAX (8u << 20) /* larger answers are refused */

/* ---- HTTP -------------------------------------------------------------------------------- */

bool cloud__url_is_loopback(const char *url) {
    return st_url_is_loopback(url);
}

/* Keeps the headers a long-running operation is followed by. */
static size_t on_header(char *ptr, size_t size, size_t nmemb, void *userdata) {
    struct cloud__rest_reply *rep = userdata;
    size_t n = size * nmemb;
    static const char key[] = "azure-asyncoperation:";
    if (n > sizeof(key) - 1 && !strncasecmp(ptr, key, sizeof(key) - 1)) {
        const char *v = ptr + sizeof(key) - 1;
        while (v < ptr + n && *v == ' ')
            v++;
        size_t m = (size_t)(ptr + n - v);
        while (m > 0 && (v[m - 1] == '\r' || v[m - 1] == '\n' || v[m - 1] == ' '))
            m--;
        if (m < sizeof(rep->async_op)) {
            memcpy(rep->async_op, v, m);
            rep->async_op[m] = '\0';
        }
    }
    return n;
}

int cloud__rest_call(const struct cloud__rest_req *req, struct cloud__rest_reply *rep) {
    memset(rep, 0, sizeof(*rep));
    CURL *c = curl_easy_init();
    struct curl_slist *h = NULL;
    struct st_sbuf body = {.max = REST_REPLY_MAX};
    char auth[8192 + 32];
    int r = 0;
    if (!c)
        return -ENOMEM;
    if (req->bearer) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", req->bearer);
        h = curl_slist_append(h, auth);
        memset(auth, 0, sizeof(auth));
    }
    if (req->content_type) {
        char ct[128];
        snprintf(ct, sizeof(ct), "Content-Type: %s", req->content_type);
        h = curl_slist_append(h, ct);
    }
    if (req->header)
        h = curl_slist_append(h, req->header);
    h = curl_slist_append(h, "Accept: application/json");
    if (!h)
        TRY_GOTO(-ENOMEM, r, out);
    curl_easy_setopt(c, CURLOPT_URL, req->url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req->method);
    if (req->body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, req->body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(req->body));
    } else if (!strcmp(req->method, "POST") || !strcmp(req->method, "PUT")) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, 0L);
    } else if (!strcmp(req->method, "GET")) {
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    } else {
        curl_easy_setopt(c, CURLOPT_NOBODY, 0L);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, st_sb_curl_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, rep);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*"); /* metadata servers are never behind a proxy */
    long tmo = req->timeout_ms > 0 ? req->timeout_ms : 30000;
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, ST_MIN(tmo, 5000L));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, tmo);
    CURLcode cc = curl_easy_perform(c);
    if (cc != CURLE_OK) {
        r = body.fail ? -EFBIG : st_curl_errno(cc, -EIO);
        goto out;
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &rep->status);
    if (body.len > 0) {
        rep->json = json_loadb(body.p, body.len, 0, NULL);
    }
out:
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    st_sb_done(&body);
    return r;
}

void cloud__rest_reply_done(struct cloud__rest_reply *rep) {
    if (rep->json)
        json_decref(rep->json);
    memset(rep, 0, sizeof(*rep));
}

const char *cloud__json_str(const json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

void cloud__sleep(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ---- the fleet engine --------------------------------------------------------------------- */

static struct cloud__fleet_inst *inst_find(struct cloud__fleet *f, const char *name) {
    for (size_t i = 0; i < f->ninsts; i++)
        if (f->insts[i].used && !strcmp(f->insts[i].pub.name, name))
            return &f->insts[i];
    return NULL;
}

static int alive_count(const struct cloud__fleet *f) {
    int n = 0;
    for (size_t i = 0; i < f->ninsts; i++)
        n += f->insts[i].used && !f->insts[i].dead;
    return n;
}

static int inst_add(struct cloud__fleet *f, const char *name, const char *zone, double now,
                    const char *how) {
    size_t slot = 0;
    while (slot < f->ninsts && f->insts[slot].used)
        slot++;
    if (slot == CLOUD_MAX_INSTANCES)
        return -E2BIG;
    struct cloud__fleet_inst *in = &f->insts[slot];
    memset(in, 0, sizeof(*in));
    in->used = true;
    snprintf(in->pub.name, sizeof(in->pub.name), "%s", name);
    snprintf(in->pub.zone, sizeof(in->pub.zone), "%s", zone);
    snprintf(in->pub.node, sizeof(in->pub.node), "%s", zone[0] ? zone : f->name);
    in->pub.state = CLOUD_INSTANCE_RUNNING;
    in->pub.started = now;
    in->pub.price_per_hour = f->price;
    if (slot == f->ninsts)
        f->ninsts++;
    cloud__log(f->p, ST_LOG_INFO, "%s: %s %s in '%s'", f->name, how, name, zone);
    struct cloud_signal sig = {.kind = CLOUD_SIG_GRANTED, .at = now};
    memcpy(sig.instance, in->pub.name, sizeof(sig.instance));
    memcpy(sig.node, in->pub.node, sizeof(sig.node));
    return cloud__emit(f->p, &sig);
}

static int inst_lost(struct cloud__fleet *f, struct cloud__fleet_inst *in,
                     enum cloud_loss_reason why, double now) {
    in->dead = true;
    in->pub.state = CLOUD_INSTANCE_DEAD;
    cloud__log(f->p, ST_LOG_INFO, "%s: %s in '%s' is gone (%s)", f->name, in->pub.name,
               in->pub.zone, cloud_loss_reason_name(why));
    struct cloud_signal sig = {.kind = CLOUD_SIG_LOST, .at = now, .reason = why};
    memcpy(sig.instance, in->pub.name, sizeof(sig.instance));
    memcpy(sig.node, in->pub.node, sizeof(sig.node));
    return cloud__emit(f->p, &sig);
}

int cloud__fleet_init(struct cloud__fleet *f, struct cloud_provider *p, const char *name,
                      const struct cloud__fleet_ops *ops, void *backend,
                      const struct cloud_config *cfg, int nzones) {
    memset(f, 0, sizeof(*f));
    f->p = p;
    f->name = name;
    f->ops = ops;
    f->backend = backend;
    f->nzones = nzones;
    memcpy(f->zones, cfg->zones, sizeof(f->zones));
    f->price = cfg->price_per_hour;
    f->interval = cfg->reconcile_interval > 0 ? cfg->reconcile_interval : 5.0;
    f->target = cfg->max_instances > 0 ? cfg->max_instances : 1;
    f->dry_run = cfg->dry_run != NULL;
    snprintf(f->job_id, sizeof(f->job_id), "%s", cfg->job_id);
    snprintf(f->job_name, sizeof(f->job_name), "%s", cfg->job_name);
    f->insts = st_calloc(CLOUD_MAX_INSTANCES, sizeof(*f->insts));
    return f->insts ? 0 : -ENOMEM;
}

/* A fresh instance name both clouds accept: lower case, starts with a letter, <= 63. */
static void new_name(const struct cloud__fleet *f, char *out, size_t size) {
    char u[ST_UUID_STR_LEN];
    st_uuid_new(u);
    snprintf(out, size, "st-%.8s-%.8s", f->job_id, u);
    for (char *c = out; *c; c++)
        if (*c >= 'A' && *c <= 'Z')
            *c = (char)(*c - 'A' + 'a');
}

/* Creates what is missing below the target, spread over the zones from the rotation point.
 * Returns how many were created or negative errno for a hard error. */
static int fleet_fill(struct cloud__fleet *f, double now) {
    int want = f->target - alive_count(f);
    if (want <= 0)
        return 0;
    int nz = f->nzones > 0 ? f->nzones : 1, made = 0;
    for (int i = 0; i < nz && want > 0; i++) {
        int zi = (f->zone_next + i) % nz;
        const char *zone = f->nzones > 0 ? f->zones[zi] : "";
        int share = (want + (nz - i) - 1) / (nz - i), got = 0;
        for (int k = 0; k < share; k++) {
            char name[CLOUD_NAME_MAX];
            new_name(f, name, sizeof(name));
            int r = f->ops->create(f->backend, zone, name);
            if (r == -EAGAIN) {
                cloud__log(f->p, ST_LOG_WARN, "%s: no capacity in '%s' (%s); trying %s",
                           f->name, zone[0] ? zone : "the location", f->last_error,
                           i + 1 < nz ? "the next zone" : "later");
                break;
            }
            if (r < 0)
                return r;
            got++;
            if (!f->dry_run)
                TRY(inst_add(f, name, zone, now, "created"));
        }
        made += got;
        want -= got;
    }
    f->zone_next = (f->zone_next + 1) % nz;
    if (want > 0)
        cloud__log(f->p, ST_LOG_WARN, "%s: %d instance(s) not granted yet; asking again in "
                   "%.0f s", f->name, want, f->interval);
    return made;
}

struct seen_ctx {
    struct cloud__fleet *f;
    double now;
    bool *seen;
};

static int on_listed(void *userdata, const char *name, const char *zone, bool alive) {
    struct seen_ctx *sc = userdata;
    struct cloud__fleet *f = sc->f;
    struct cloud__fleet_inst *in = inst_find(f, name);
    if (in) {
        sc->seen[in - f->insts] = true;
        if (!in->dead && !alive)
            TRY(inst_lost(f, in, CLOUD_LOSS_UNANNOUNCED, sc->now));
        return 0;
    }
    if (!alive)
        return 0;
    /* Ours by label but not known: started by an earlier run of this job. Adopt it. */
    return inst_add(f, name, zone, sc->now, "adopted");
}

static int fleet_reconcile(struct cloud__fleet *f, double now) {
    bool *seen = st_calloc(CLOUD_MAX_INSTANCES, sizeof(*seen));
    if (!seen)
        return -ENOMEM;
    size_t known = f->ninsts;
    struct seen_ctx sc = {f, now, seen};
    int r = f->ops->list(f->backend, on_listed, &sc);
    if (r == 0 && !f->dry_run) {
        for (size_t i = 0; i < known && r == 0; i++) {
            struct cloud__fleet_inst *in = &f->insts[i];
            if (in->used && !in->dead && !seen[i])
                r = inst_lost(f, in, CLOUD_LOSS_UNANNOUNCED, now);
        }
    }
    st_free(seen);
    return r;
}

struct sweep_ctx {
    struct cloud_instance *found; /* CLOUD_MAX_INSTANCES */
    int n;
};

static int on_sweep_listed(void *userdata, const char *name, const char *zone, bool alive) {
    struct sweep_ctx *sc = userdata;
    if (!alive)
        return 0;
    if (sc->n == CLOUD_MAX_INSTANCES)
        return -ENOBUFS;
    struct cloud_instance *in = &sc->found[sc->n++];
    snprintf(in->name, sizeof(in->name), "%s", name);
    snprintf(in->zone, sizeof(in->zone), "%s", zone);
    return 0;
}

/* Lists every page first, then deletes: deleting while paging can shift the pages the server
 * has still to hand out, and an instance would be missed. */
int cloud__fleet_sweep(struct cloud__fleet *f) {
    struct sweep_ctx sc = {st_calloc(CLOUD_MAX_INSTANCES, sizeof(*sc.found)), 0};
    if (!sc.found)
        return -ENOMEM;
    int r = f->ops->list(f->backend, on_sweep_listed, &sc), n = 0;
    for (int i = 0; i < sc.n && r >= 0; i++) {
        int d = f->ops->destroy(f->backend, sc.found[i].name, sc.found[i].zone);
        if (d < 0 && d != -ENOENT)
            r = d;
        n += d == 0;
    }
    st_free(sc.found);
    return r < 0 ? r : n;
}

void cloud__fleet_done(struct cloud__fleet *f) {
    if (!f->insts)
        return;
    if (!f->dry_run && f->started) {
        int n = alive_count(f);
        if (cloud_provider_detached(f->p)) {
            cloud__log(f->p, ST_LOG_NOTICE, "%s: leaving %d instance(s) of job '%s' running "
                       "for a restart to adopt", f->name, n, f->job_name);
        } else {
            /* Everything the listing shows, known to us or not (a create whose answer was
             * lost still labelled its instance). */
            int r = cloud__fleet_sweep(f);
            if (r < 0)
                cloud__log(f->p, ST_LOG_ERR, "%s: could not delete the instances of job '%s' "
                           "(%s): delete them by their label spottrain-job-id=%s", f->name,
                           f->job_name, st_strerror(r), f->job_id);
            else
                cloud__log(f->p, ST_LOG_INFO, "%s: deleted %d instance(s) of job '%s'",
                           f->name, r, f->job_name);
        }
    }
    st_free(f->insts);
    f->insts = NULL;
}

int cloud__fleet_start(struct cloud__fleet *f, double now) {
    TRY(fleet_reconcile(f, now)); /* adopt what an earlier run of this job left */
    f->started = true;
    int r = fleet_fill(f, now);
    if (r < 0)
        return r;
    f->next_reconcile = now + f->interval;
    f->next_fill = now + f->interval;
    return 0;
}

int cloud__fleet_poll(struct cloud__fleet *f, double now) {
    if (now >= f->next_reconcile) {
        int r = fleet_reconcile(f, now);
        if (r == -ENOMEM || r == -ENOBUFS)
            return r;
        if (r < 0)
            cloud__log(f->p, ST_LOG_WARN, "%s: reconcile failed (%s), ignoring until the next "
                       "one", f->name, st_strerror(r));
        f->next_reconcile = now + f->interval;
    }
    if (now >= f->next_fill && alive_count(f) < f->target) {
        int r = fleet_fill(f, now);
        if (r < 0)
            cloud__log(f->p, ST_LOG_WARN, "%s: asking for instances failed (%s), ignoring "
                       "until %.0f s from now", f->name, st_strerror(r), f->interval);
        f->next_fill = now + f->interval;
    }
    return 0;
}

int cloud__fleet_acquire(struct cloud__fleet *f, int n, double now) {
    f->target = ST_MIN(f->target + n, CLOUD_MAX_INSTANCES);
    return fleet_fill(f, now);
}

int cloud__fleet_release(struct cloud__fleet *f, const char *instance, double now) {
    struct cloud__fleet_inst *in = inst_find(f, instance);
    if (!in || in->dead)
        return -ENOENT;
    int r = f->ops->destroy(f->backend, in->pub.name, in->pub.zone);
    /* Forgotten either way: a failed delete is retried by the sweep in done(). */
    f->target = ST_MAX(0, f->target - 1);
    TRY(inst_lost(f, in, CLOUD_LOSS_RELEASED, now));
    return r == -ENOENT ? 0 : r;
}

int cloud__fleet_instances(struct cloud__fleet *f, struct cloud_instance *out, size_t max,
                           size_t *ret_n) {
    size_t n = 0;
    for (size_t i = 0; i < f->ninsts; i++) {
        if (!f->insts[i].used || f->insts[i].dead)
            continue;
        if (n < max)
            out[n] = f->insts[i].pub;
        n++;
    }
    *ret_n = n;
    return 0;
}

double cloud__fleet_next_deadline(const struct cloud__fleet *f) {
    return ST_MIN(f->next_reconcile, f->next_fill); /* always something: a cloud keeps going */
}

/* ---- a JSON cloud's provider --------------------------------------------------------------- */

/* See cloud-internal.h. */
void cloud__rest_cloud_init(struct cloud__rest_cloud *rc, const struct cloud__rest_cloud_ops *ops,
                            struct cloud_provider *p, const struct cloud_config *cfg) {
    rc->ops = ops;
    rc->p = p;
    rc->spot = cfg->spot;
    rc->dry_run = cfg->dry_run;
    rc->dry_run_userdata = cfg->dry_run_userdata;
}

/* See cloud-internal.h. */
int cloud__rest_endpoint_len(struct cloud__rest_cloud *rc, const char *field, const char *ep) {
    if (strncmp(ep, "https://", 8) && !(strncmp(ep, "http://", 7) == 0 &&
                                        cloud__url_is_loopback(ep))) {
        cloud__log(rc->p, ST_LOG_ERR, "%s: %s '%s' must be https:// (http:// only on loopback)",
                   rc->ops->name, field, ep);
        return -EINVAL;
    }
    size_t el = strlen(ep);
    while (el > 0 && ep[el - 1] == '/')
        el--;
    return (int)ST_MIN(el, (size_t)INT_MAX);
}

/* See cloud-internal.h. */
void cloud__rest_cloud_free_boot(struct cloud__rest_cloud *rc) {
    if (rc->boot)
        memset(rc->boot, 0, strlen(rc->boot));
    st_free(rc->boot);
    st_free(rc->boot_shown);
    rc->boot = rc->boot_shown = NULL;
}

/* A valid access token, refreshed a minute before it expires. The lookup is common/oauth.c's,
 * shared with the gs:// and az:// checkpoint stores. */
static int rest_token(struct cloud__rest_cloud *rc) {
    char why[1024];
    if (rc->token.value[0] && st_now() < rc->token.expiry - 60)
        return 0;
    int r = rc->ops->token_get(rc->ops->scope, &rc->token, why, sizeof(why));
    if (r < 0)
        cloud__log(rc->p, ST_LOG_ERR, "%s: %s", rc->ops->name, why);
    return r;
}

/* See cloud-internal.h. */
int cloud__rest_cloud_send(struct cloud__rest_cloud *rc, const char *method, const char *url,
                           const json_t *body, const json_t *shown,
                           struct cloud__rest_reply *rep) {
    char *text = NULL;
    int r = 0;
    memset(rep, 0, sizeof(*rep));
    if (rc->dry_run) {
        char *t = shown ? json_dumps(shown, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        struct st_sbuf line = {.max = 1u << 20};
        st_sb_str(&line, method);
        st_sb_str(&line, " ");
        st_sb_str(&line, url);
        if (t) {
            st_sb_str(&line, "\n");
            st_sb_str(&line, t);
        }
        if (!line.fail)
            rc->dry_run(rc->dry_run_userdata, line.p);
        r = line.fail ? -ENOMEM : 0;
        st_sb_done(&line);
        st_free(t);
        return r;
    }
    TRY(rest_token(rc));
    if (body && !(text = json_dumps(body, JSON_COMPACT)))
        return -ENOMEM;
    double wait = 0.25;
    for (int i = 0; i < rc->ops->tries; i++) {
        cloud__rest_reply_done(rep);
        struct cloud__rest_req req = {.method = method, .url = url, .bearer = rc->token.value,
                                      .body = text,
                                      .content_type = text ? "application/json" : NULL};
        r = cloud__rest_call(&req, rep);
        if (r < 0) {
            cloud__log(rc->p, ST_LOG_ERR, "%s: %s %s: %s", rc->ops->name, method, url,
                       st_strerror(r));
            break;
        }
        if (!(rep->status == 429 || rep->status >= 500))
            break;
        if (i + 1 < rc->ops->tries) {
            cloud__sleep(wait);
            wait *= 2;
        }
    }
    if (text) {
        memset(text, 0, strlen(text)); /* the bootstrap in the body holds the join token */
        st_free(text);
    }
    return r;
}

/* See cloud-internal.h. */
void cloud__rest_cloud_done(struct cloud_provider *p, void *state) {
    (void)p;
    struct cloud__rest_cloud *rc = state;
    cloud__fleet_done(&rc->fleet);
    cloud__rest_cloud_free_boot(rc);
    st_token_wipe(&rc->token);
}

/* See cloud-internal.h. */
int cloud__rest_cloud_start(struct cloud_provider *p, void *state, double now) {
    (void)p;
    return cloud__fleet_start(&((struct cloud__rest_cloud *)state)->fleet, now);
}

/* See cloud-internal.h. */
int cloud__rest_cloud_poll(struct cloud_provider *p, void *state, double now) {
    (void)p;
    return cloud__fleet_poll(&((struct cloud__rest_cloud *)state)->fleet, now);
}

/* See cloud-internal.h. */
int cloud__rest_cloud_acquire(struct cloud_provider *p, void *state, int n, double now) {
    (void)p;
    return cloud__fleet_acquire(&((struct cloud__rest_cloud *)state)->fleet, n, now);
}

/* See cloud-internal.h. */
int cloud__rest_cloud_release(struct cloud_provider *p, void *state, const char *instance,
                              double now) {
    (void)p;
    return cloud__fleet_release(&((struct cloud__rest_cloud *)state)->fleet, instance, now);
}

/* See cloud-internal.h. */
int cloud__rest_cloud_instances(struct cloud_provider *p, void *state, struct cloud_instance *out,
                                size_t max, size_t *ret_n) {
    (void)p;
    return cloud__fleet_instances(&((struct cloud__rest_cloud *)state)->fleet, out, max, ret_n);
}

/* See cloud-internal.h. */
double cloud__rest_cloud_next_deadline(struct cloud_provider *p, void *state, double now) {
    (void)p;
    (void)now;
    return cloud__fleet_next_deadline(&((struct cloud__rest_cloud *)state)->fleet);
}

/* See cloud-internal.h. */
int cloud__rest_cloud_down(const struct cloud__rest_cloud_ops *ops, const struct cloud_config *cfg,
                           const char *job_name) {
    if (!cfg || !cfg->spec || !job_name || !*job_name)
        return -EINVAL;
    struct cloud__rest_cloud *rc = st_calloc(1, ops->state_size);
    if (!rc)
        return -ENOMEM;
    int r;
    rc->ops = ops;
    TRY_GOTO(ops->down_init(rc, cfg, job_name), r, out);
    rc->by_name = true;
    TRY_GOTO(cloud__fleet_init(&rc->fleet, NULL, ops->name, ops->fleet, rc, cfg,
                               cfg->spec->fleet.nzones), r, out);
    r = cloud__fleet_sweep(&rc->fleet);
out:
    cloud__fleet_done(&rc->fleet); /* never started: frees only */
    st_token_wipe(&rc->token);
    st_free(rc);
    return r;
}
