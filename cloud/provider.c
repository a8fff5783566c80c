/* provider.c: the generic provider shell — registry, argument checks, the injected logger and
 * the bounded signal queue that every backend emits into.
 *
 * Backends only implement what differs (struct cloud_provider_ops); the shell guarantees they
 * are called with a valid handle, a started provider and a clock that never goes backwards. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "check.h"          /* TRY */
#include "cloud-internal.h" /* struct cloud_provider, cloud__sim_ops */

static const struct cloud_provider_ops *const providers[] = {
    &cloud__sim_ops, &cloud__aws_ops, &cloud__gcp_ops, &cloud__azure_ops, &cloud__k8s_ops};
static const char *const provider_names[] = {"sim", "aws", "gcp", "azure", "kubernetes", NULL};

const char *const *cloud_provider_names(void) {
    return provider_names;
}

const char *cloud_signal_kind_name(enum cloud_signal_kind k) {
    switch (k) {
    case CLOUD_SIG_GRANTED: return "granted";
    case CLOUD_SIG_REBALANCE: return "rebalance";
    case CLOUD_SIG_NOTICE: return "notice";
    case CLOUD_SIG_LOST: return "lost";
    case CLOUD_SIG_EXITED: return "exited";
    }
    return "unknown";
}

const char *cloud_loss_reason_name(enum cloud_loss_reason r) {
    switch (r) {
    case CLOUD_LOSS_NONE: return "none";
    case CLOUD_LOSS_PREEMPTED: return "preempted";
    case CLOUD_LOSS_UNANNOUNCED: return "unannounced";
    case CLOUD_LOSS_RELEASED: return "released";
    case CLOUD_LOSS_SHUTDOWN: return "shutdown";
    }
    return "unknown";
}

void cloud_config_init(struct cloud_config *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    snprintf(cfg->instance_type, sizeof(cfg->instance_type), "%s", "sim.local");
    cfg->nzones = 1;
    snprintf(cfg->zones[0], sizeof(cfg->zones[0]), "%s", "local-1a");
    cfg->time_scale = 1.0;
    cfg->notice_seconds = 120.0;
    cfg->seed = 1;
    cfg->spot = true;
}

int cloud_config_from_fleet(struct cloud_config *cfg, const struct st_spec_fleet *fleet) {
    if (!cfg || !fleet)
        return -EINVAL;
    if (!(fleet->time_scale > 0) || !(fleet->notice_seconds >= 0) ||
        !(fleet->unannounced >= 0 && fleet->unannounced <= 1) || fleet->nzones < 0 ||
        fleet->nzones > (int)ST_ARRAY_SIZE(cfg->zones))
        return -EINVAL;
    cfg->time_scale = fleet->time_scale;
    cfg->notice_seconds = fleet->notice_seconds;
    cfg->unannounced = fleet->unannounced;
    cfg->max_instances = fleet->max;
    cfg->price_per_hour = fleet->spot ? fleet->spot_price : fleet->on_demand_price;
    cfg->spot = fleet->spot;
    cfg->on_demand_fallback = fleet->on_demand_fallback;
    snprintf(cfg->image, sizeof(cfg->image), "%s", fleet->image);
    if (fleet->instance_type[0])
        snprintf(cfg->instance_type, sizeof(cfg->instance_type), "%s", fleet->instance_type);
    if (fleet->nzones > 0) {
        cfg->nzones = fleet->nzones;
        for (int i = 0; i < fleet->nzones; i++)
            snprintf(cfg->zones[i], sizeof(cfg->zones[i]), "%s", fleet->zones[i]);
    }
    return 0;
}

void cloud__log(struct cloud_provider *p, int level, const char *fmt, ...) {
    if ((!p || !p->log) && level > st_log_level_max)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (p && p->log)
        p->log(p->log_userdata, level, msg);
    else
        st_log_internal(level, "cloud", __FILE__, __LINE__, "%s", msg);
}

int cloud__emit(struct cloud_provider *p, const struct cloud_signal *sig) {
    if (p->q_n == p->q_cap) {
        if (p->q_cap >= CLOUD_SIGNAL_QUEUE_MAX)
            return -ENOBUFS;
        size_t ncap = p->q_cap ? p->q_cap * 2 : 64;
        struct cloud_signal *nq = st_calloc(ncap, sizeof(*nq));
        if (!nq)
            return -ENOMEM;
        for (size_t i = 0; i < p->q_n; i++)
            nq[i] = p->q[(p->q_head + i) % p->q_cap];
        st_free(p->q);
        p->q = nq;
        p->q_cap = ncap;
        p->q_head = 0;
    }
    p->q[(p->q_head + p->q_n) % p->q_cap] = *sig;
    p->q_n++;
    return 0;
}

static bool provider_ok(const struct cloud_provider *p) {
    return p && p->magic == CLOUD_PROVIDER_MAGIC;
}

int cloud_provider_new(const char *name, const struct cloud_config *cfg,
                       struct cloud_provider **ret_p) {
    if (!name || !cfg || !ret_p)
        return -EINVAL;
    const struct cloud_provider_ops *ops = NULL;
    for (size_t i = 0; i < ST_ARRAY_SIZE(providers); i++)
        if (strcmp(providers[i]->name, name) == 0)
            ops = providers[i];
    if (!ops)
        return -ENOENT;
    struct cloud_provider *p = st_calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->magic = CLOUD_PROVIDER_MAGIC;
    p->ops = ops;
    p->log = cfg->log;
    p->log_userdata = cfg->log_userdata;
    p->state = st_calloc(1, ops->state_size);
    if (!p->state) {
        st_free(p);
        return -ENOMEM;
    }
    int r = ops->init(p, p->state, cfg);
    if (r < 0) {
        st_free(p->state);
        st_free(p);
        return r;
    }
    *ret_p = p;
    return 0;
}

struct cloud_provider *cloud_provider_free(struct cloud_provider *p) {
    if (!provider_ok(p))
        return NULL;
    p->ops->done(p, p->state);
    st_free(p->state);
    st_free(p->q);
    p->magic = 0;
    st_free(p);
    return NULL;
}

void cloud_provider_detach(struct cloud_provider *p) {
    if (provider_ok(p))
        p->detached = true;
}

bool cloud_provider_detached(const struct cloud_provider *p) {
    return provider_ok(p) && p->detached;
}

const char *cloud_provider_name(const struct cloud_provider *p) {
    return provider_ok(p) ? p->ops->name : "invalid";
}

int cloud_provider_start(struct cloud_provider *p, double now) {
    if (!provider_ok(p))
        return -EINVAL;
    if (p->started)
        return -EALREADY;
    TRY(p->ops->start(p, p->state, now));
    p->started = true;
    p->last_now = now;
    return 0;
}

/* Checks a later call's clock: started, and not going backwards. */
static int provider_advance(struct cloud_provider *p, double now) {
    if (!provider_ok(p))
        return -EINVAL;
    if (!p->started)
        return -ENOTCONN;
    if (!(now >= p->last_now))
        return -EINVAL;
    p->last_now = now;
    return 0;
}

int cloud_provider_poll(struct cloud_provider *p, double now, struct cloud_signal *sigs,
                        size_t max, size_t *ret_n) {
    if (!ret_n || (!sigs && max > 0))
        return -EINVAL;
    TRY(provider_advance(p, now));
    TRY(p->ops->poll(p, p->state, now));
    size_t n = 0;
    while (n < max && p->q_n > 0) {
        sigs[n++] = p->q[p->q_head];
        p->q_head = (p->q_head + 1) % p->q_cap;
        p->q_n--;
    }
    *ret_n = n;
    return 0;
}

int cloud_provider_acquire(struct cloud_provider *p, int n, double now) {
    if (n <= 0 || n > CLOUD_MAX_INSTANCES)
        return -EINVAL;
    TRY(provider_advance(p, now));
    return p->ops->acquire(p, p->state, n, now);
}

int cloud_provider_release(struct cloud_provider *p, const char *instance, double now) {
    if (!instance)
        return -EINVAL;
    TRY(provider_advance(p, now));
    return p->ops->release(p, p->state, instance, now);
}

int cloud_provider_instances(struct cloud_provider *p, struct cloud_instance *out, size_t max,
                             size_t *ret_n) {
    if (!provider_ok(p) || !ret_n || (!out && max > 0))
        return -EINVAL;
    return p->ops->instances(p, p->state, out, max, ret_n);
}

/* See cloud.h. */
int cloud_provider_price(struct cloud_provider *p, double *ret_per_hour) {
    if (!provider_ok(p) || !ret_per_hour)
        return -EINVAL;
    if (!p->ops->price || !p->started)
        return -ENODATA;
    double v;
    TRY(p->ops->price(p, p->state, &v));
    *ret_per_hour = v;
    return 0;
}

double cloud_provider_next_deadline(struct cloud_provider *p, double now) {
    if (!provider_ok(p) || !p->started)
        return -1;
    return p->ops->next_deadline(p, p->state, now);
}
