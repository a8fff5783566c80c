/* k8s-manifest.c: the Kubernetes objects of a job — what `spottrain k8s render` prints and
 * the worker pod the kubernetes provider creates — and a small JSON -> YAML block writer.
 *
 * The one idea: every object is built as a jansson tree from the job spec, once, here; the
 * render command and the provider only serialise it (YAML for people, JSON for the API
 * server). So the worker pod a rendered coordinator creates mounts exactly the ConfigMap and
 * Secret the render made, under the same names (cloud__k8s_names). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "cloud-internal.h"
#include "common.h" /* struct st_spec, st_malloc */

#define SPEC_MOUNT "/etc/spottrain"        /* the ConfigMap: job.yaml */
#define TOKEN_MOUNT "/var/run/spottrain/token" /* the Secret: token */
#define STATE_MOUNT "/var/lib/spottrain"   /* the PersistentVolumeClaim: the journal */

void cloud__k8s_names(const char *job, struct cloud_k8s_names *ret) {
    snprintf(ret->account, sizeof(ret->account), "spottrain-%s", job);
    snprintf(ret->config, sizeof(ret->config), "spottrain-%s-spec", job);
    snprintf(ret->secret, sizeof(ret->secret), "spottrain-%s-token", job);
    snprintf(ret->claim, sizeof(ret->claim), "spottrain-%s-state", job);
    snprintf(ret->coordinator, sizeof(ret->coordinator), "spottrain-%s-coordinator", job);
}

/* The port of a HOST:PORT listen address, or dflt when it has none or 0. */
static int listen_port(const char *listen, int dflt) {
    const char *colon = strrchr(listen, ':');
    int port = colon ? atoi(colon + 1) : 0;
    return port > 0 && port < 65536 ? port : dflt;
}

int cloud__k8s_ports(const struct st_spec *spec, int *ret_grpc, int *ret_rest) {
    *ret_grpc = listen_port(spec->coordinator.listen, 7070);
    *ret_rest = listen_port(spec->status.listen, 8080);
    return 0;
}

/* json_object_set_new that records failure in *ok instead of leaking. */
static void jset(json_t *o, const char *k, json_t *v, bool *ok) {
    if (!o || !v || json_object_set_new(o, k, v) < 0) {
        json_decref(v);
        *ok = false;
    }
}

static void jpush(json_t *a, json_t *v, bool *ok) {
    if (!a || !v || json_array_append_new(a, v) < 0) {
        json_decref(v);
        *ok = false;
    }
}

static json_t *obj(const char *api, const char *kind, const char *name, const char *ns,
                   const char *job, bool *ok) {
    json_t *o = json_object(), *meta = json_object(), *labels = json_object();
    jset(o, "apiVersion", json_string(api), ok);
    jset(o, "kind", json_string(kind), ok);
    jset(meta, "name", json_string(name), ok);
    if (ns && ns[0])
        jset(meta, "namespace", json_string(ns), ok);
    jset(labels, "app.kubernetes.io/name", json_string("spottrain"), ok);
    jset(labels, CLOUD_K8S_LABEL_JOB, json_string(job), ok);
    jset(meta, "labels", labels, ok);
    jset(o, "metadata", meta, ok);
    return o;
}

static json_t *kv_object(const struct st_spec_kv_list *l, bool *ok) {
    json_t *o = json_object();
    for (int i = 0; i < l->n; i++)
        jset(o, l->v[i].key, json_string(l->v[i].value), ok);
    return o;
}

/* The volumes both the coordinator and the workers mount: the spec and the token. */
static void add_common_volumes(json_t *pod_spec, json_t *container,
                               const struct cloud_k8s_names *nm, const char *token_secret,
                               bool *ok) {
    json_t *vols = json_array(), *mounts = json_array(), *v, *src;

    v = json_object();
    jset(v, "name", json_string("spec"), ok);
    src = json_object();
    jset(src, "name", json_string(nm->config), ok);
    jset(v, "configMap", src, ok);
    jpush(vols, v, ok);
    v = json_object();
    jset(v, "name", json_string("token"), ok);
    src = json_object();
    jset(src, "secretName", json_string(token_secret), ok);
    jset(src, "defaultMode", json_integer(0400), ok);
    jset(v, "secret", src, ok);
    jpush(vols, v, ok);

    v = json_object();
    jset(v, "name", json_string("spec"), ok);
    jset(v, "mountPath", json_string(SPEC_MOUNT), ok);
    jset(v, "readOnly", json_true(), ok);
    jpush(mounts, v, ok);
    v = json_object();
    jset(v, "name", json_string("token"), ok);
    jset(v, "mountPath", json_string(TOKEN_MOUNT), ok);
    jset(v, "readOnly", json_true(), ok);
    jpush(mounts, v, ok);

    jset(pod_spec, "volumes", vols, ok);
    jset(container, "volumeMounts", mounts, ok);
}

static json_t *str_array(const char *const *v, bool *ok) {
    json_t *a = json_array();
    for (size_t i = 0; v[i]; i++)
        jpush(a, json_string(v[i]), ok);
    return a;
}

static json_t *container_port(const char *name, int port, bool *ok) {
    json_t *p = json_object();
    jset(p, "name", json_string(name), ok);
    jset(p, "containerPort", json_integer(port), ok);
    jset(p, "protocol", json_string("TCP"), ok);
    return p;
}

static json_t *probe(int port, int period, bool *ok) {
    json_t *p = json_object(), *get = json_object();
    jset(get, "path", json_string("/healthz"), ok);
    jset(get, "port", json_integer(port), ok);
    jset(p, "httpGet", get, ok);
    jset(p, "periodSeconds", json_integer(period), ok);
    jset(p, "failureThreshold", json_integer(3), ok);
    return p;
}

int cloud__k8s_worker_pod(const struct cloud_k8s_pod_opts *o, json_t **ret_pod) {
    bool ok = true;
    const struct st_spec *spec = o->spec;
    const struct st_spec_kubernetes *k = &spec->fleet.kubernetes;
    struct cloud_k8s_names nm;

    if (!o->name || !o->coordinator || !o->image || !o->image[0])
        return -EINVAL;
    cloud__k8s_names(spec->name, &nm);
    json_t *pod = obj("v1", "Pod", o->name, o->ns, spec->name, &ok);
    json_t *meta = json_object_get(pod, "metadata");
    json_t *labels = json_object_get(meta, "labels");
    jset(labels, CLOUD_K8S_LABEL_JOB_ID, json_string(o->job_id), &ok);
    jset(labels, CLOUD_K8S_LABEL_ROLE, json_string("worker"), &ok);
    if (o->owner_uid && o->owner_uid[0]) {
        /* The job's ConfigMap owns the workers: deleting the job (kubectl delete -f) lets
         * the garbage collector remove them, whatever became of the coordinator's pod. */
        json_t *refs = json_array(), *ref = json_object();
        jset(ref, "apiVersion", json_string("v1"), &ok);
        jset(ref, "kind", json_string("ConfigMap"), &ok);
        jset(ref, "name", json_string(nm.config), &ok);
        jset(ref, "uid", json_string(o->owner_uid), &ok);
        jpush(refs, ref, &ok);
        jset(meta, "ownerReferences", refs, &ok);
    }

    json_t *ps = json_object(), *c = json_object(), *env = json_array(), *e, *fr, *src;
    jset(ps, "restartPolicy", json_string("Never"), &ok);
    jset(ps, "automountServiceAccountToken", json_false(), &ok);
    /* The kubelet's grace period is the worker's notice: SIGTERM, then this long to move
     * its state away before SIGKILL. */
    jset(ps, "terminationGracePeriodSeconds", json_integer(o->grace_seconds > 0 ?
                                                           o->grace_seconds : 30), &ok);
    if (k->priority_class[0])
        jset(ps, "priorityClassName", json_string(k->priority_class), &ok);
    if (k->node_selector.n)
        jset(ps, "nodeSelector", kv_object(&k->node_selector, &ok), &ok);
    if (k->n_tolerations) {
        json_t *tols = json_array();
        for (int i = 0; i < k->n_tolerations; i++) {
            const struct st_spec_toleration *t = &k->tolerations[i];
            json_t *j = json_object();
            if (t->key[0])
                jset(j, "key", json_string(t->key), &ok);
            jset(j, "operator", json_string(t->op), &ok);
            if (t->value[0])
                jset(j, "value", json_string(t->value), &ok);
            if (t->effect[0])
                jset(j, "effect", json_string(t->effect), &ok);
            if (t->seconds >= 0)
                jset(j, "tolerationSeconds", json_integer(t->seconds), &ok);
            jpush(tols, j, &ok);
        }
        jset(ps, "tolerations", tols, &ok);
    }

    char token_path[128];
    snprintf(token_path, sizeof(token_path), "%s/token", TOKEN_MOUNT);
    const char *args[] = {"worker", "--coordinator", o->coordinator, "--token-file", token_path,
                          "--job", SPEC_MOUNT "/job.yaml", NULL};
    jset(c, "name", json_string("worker"), &ok);
    jset(c, "image", json_string(o->image), &ok);
    jset(c, "args", str_array(args, &ok), &ok);
    e = json_object();
    jset(e, "name", json_string("SPOTTRAIN_INSTANCE_ID"), &ok);
    fr = json_object();
    src = json_object();
    jset(src, "fieldPath", json_string("metadata.name"), &ok);
    jset(fr, "fieldRef", src, &ok);
    jset(e, "valueFrom", fr, &ok);
    jpush(env, e, &ok);
    e = json_object();
    jset(e, "name", json_string("SPOTTRAIN_NODE"), &ok);
    fr = json_object();
    src = json_object();
    jset(src, "fieldPath", json_string("spec.nodeName"), &ok);
    jset(fr, "fieldRef", src, &ok);
    jset(e, "valueFrom", fr, &ok);
    jpush(env, e, &ok);
    /* The worker treats SIGTERM as a notice with this much time left (cli/run-worker.c). */
    char grace[16];
    snprintf(grace, sizeof(grace), "%d", o->grace_seconds > 0 ? o->grace_seconds : 30);
    e = json_object();
    jset(e, "name", json_string("SPOTTRAIN_NOTICE_SECONDS"), &ok);
    jset(e, "value", json_string(grace), &ok);
    jpush(env, e, &ok);
    jset(c, "env", env, &ok);
    if (k->resources.n) {
        /* Extended resources (nvidia.com/gpu) must have requests equal to limits. */
        json_t *res = json_object();
        jset(res, "requests", kv_object(&k->resources, &ok), &ok);
        jset(res, "limits", kv_object(&k->resources, &ok), &ok);
        jset(c, "resources", res, &ok);
    }
    add_common_volumes(ps, c, &nm, o->token_secret && o->token_secret[0] ? o->token_secret
                                                                          : nm.secret, &ok);
    json_t *cs = json_array();
    jpush(cs, c, &ok);
    jset(ps, "containers", cs, &ok);
    jset(pod, "spec", ps, &ok);
    if (!ok) {
        json_decref(pod);
        return -ENOMEM;
    }
    *ret_pod = pod;
    return 0;
}

/* ---- render ------------------------------------------------------------------------- */

static int random_token(char *buf, size_t size) {
    unsigned char raw[32];
    if (size < 2 * sizeof(raw) + 1)
        return -ENOBUFS;
    size_t got = 0;
    while (got < sizeof(raw)) {
        ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);
        if (n < 0 && errno != EINTR)
            return -errno;
        if (n > 0)
            got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof(raw); i++)
        snprintf(buf + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

static json_t *render_role(const struct cloud_render_opts *o, const struct cloud_k8s_names *nm,
                           bool *ok) {
    json_t *role = obj("rbac.authorization.k8s.io/v1", "Role", nm->account, o->ns,
                       o->spec->name, ok);
    json_t *rules = json_array(), *r;
    static const char *const pod_verbs[] = {"get", "list", "watch", "create", "delete", "patch",
                                            NULL};
    static const char *const event_verbs[] = {"create", NULL};
    static const char *const cm_verbs[] = {"get", NULL};
    static const char *const core[] = {"", NULL};
    static const char *const pods[] = {"pods", NULL};
    static const char *const events[] = {"events", NULL};
    static const char *const configmaps[] = {"configmaps", NULL};
    const char *const cm_names[] = {nm->config, NULL};

    r = json_object();
    jset(r, "apiGroups", str_array(core, ok), ok);
    jset(r, "resources", str_array(pods, ok), ok);
    jset(r, "verbs", str_array(pod_verbs, ok), ok);
    jpush(rules, r, ok);
    r = json_object();
    jset(r, "apiGroups", str_array(core, ok), ok);
    jset(r, "resources", str_array(events, ok), ok);
    jset(r, "verbs", str_array(event_verbs, ok), ok);
    jpush(rules, r, ok);
    /* Only the job's own ConfigMap, for its uid: the workers' owner reference. */
    r = json_object();
    jset(r, "apiGroups", str_array(core, ok), ok);
    jset(r, "resources", str_array(configmaps, ok), ok);
    jset(r, "resourceNames", str_array(cm_names, ok), ok);
    jset(r, "verbs", str_array(cm_verbs, ok), ok);
    jpush(rules, r, ok);
    jset(role, "rules", rules, ok);
    return role;
}

static json_t *render_binding(const struct cloud_render_opts *o,
                              const struct cloud_k8s_names *nm, bool *ok) {
    json_t *b = obj("rbac.authorization.k8s.io/v1", "RoleBinding", nm->account, o->ns,
                    o->spec->name, ok);
    json_t *ref = json_object(), *subs = json_array(), *s = json_object();
    jset(ref, "apiGroup", json_string("rbac.authorization.k8s.io"), ok);
    jset(ref, "kind", json_string("Role"), ok);
    jset(ref, "name", json_string(nm->account), ok);
    jset(b, "roleRef", ref, ok);
    jset(s, "kind", json_string("ServiceAccount"), ok);
    jset(s, "name", json_string(nm->account), ok);
    if (o->ns && o->ns[0])
        jset(s, "namespace", json_string(o->ns), ok);
    jpush(subs, s, ok);
    jset(b, "subjects", subs, ok);
    return b;
}

static json_t *coordinator_labels(const struct st_spec *spec, bool *ok) {
    json_t *l = json_object();
    jset(l, "app.kubernetes.io/name", json_string("spottrain"), ok);
    jset(l, CLOUD_K8S_LABEL_JOB, json_string(spec->name), ok);
    jset(l, CLOUD_K8S_LABEL_ROLE, json_string("coordinator"), ok);
    return l;
}

static json_t *render_deployment(const struct cloud_render_opts *o,
                                 const struct cloud_k8s_names *nm, const char *token_secret,
                                 int grpc, int rest, bool *ok) {
    const struct st_spec *spec = o->spec;
    json_t *d = obj("apps/v1", "Deployment", nm->coordinator, o->ns, spec->name, ok);
    json_t *ds = json_object(), *sel = json_object(), *strategy = json_object();
    jset(ds, "replicas", json_integer(1), ok);
    /* Never two coordinators on one journal: the old pod ends before the new one starts. */
    jset(strategy, "type", json_string("Recreate"), ok);
    jset(ds, "strategy", strategy, ok);
    jset(sel, "matchLabels", coordinator_labels(spec, ok), ok);
    jset(ds, "selector", sel, ok);

    json_t *tmpl = json_object(), *tmeta = json_object(), *ps = json_object(),
           *c = json_object();
    jset(tmeta, "labels", coordinator_labels(spec, ok), ok);
    jset(tmpl, "metadata", tmeta, ok);
    jset(ps, "serviceAccountName", json_string(nm->account), ok);
    /* SIGTERM keeps the workers for the next coordinator to adopt; the journal is
     * consistent within a second. */
    jset(ps, "terminationGracePeriodSeconds", json_integer(30), ok);

    char listen[64], status[64], token_path[128];
    snprintf(listen, sizeof(listen), "0.0.0.0:%d", grpc);
    snprintf(status, sizeof(status), "0.0.0.0:%d", rest);
    snprintf(token_path, sizeof(token_path), "%s/token", TOKEN_MOUNT);
    const char *args[] = {"coordinator", "--job", SPEC_MOUNT "/job.yaml", "--train",
                          "--listen", listen, "--status-listen", status, "--token-file",
                          token_path, "--state-dir", STATE_MOUNT, NULL};
    jset(c, "name", json_string("coordinator"), ok);
    jset(c, "image", json_string(o->image), ok);
    jset(c, "args", str_array(args, ok), ok);
    json_t *ports = json_array();
    jpush(ports, container_port("grpc", grpc, ok), ok);
    jpush(ports, container_port("http", rest, ok), ok);
    jset(c, "ports", ports, ok);
    json_t *env = json_array(), *e = json_object(), *fr = json_object(), *src = json_object();
    jset(e, "name", json_string("SPOTTRAIN_NAMESPACE"), ok);
    jset(src, "fieldPath", json_string("metadata.namespace"), ok);
    jset(fr, "fieldRef", src, ok);
    jset(e, "valueFrom", fr, ok);
    jpush(env, e, ok);
    e = json_object();
    jset(e, "name", json_string("SPOTTRAIN_IMAGE"), ok);
    jset(e, "value", json_string(o->image), ok);
    jpush(env, e, ok);
    jset(c, "env", env, ok);
    jset(c, "livenessProbe", probe(rest, 10, ok), ok);
    jset(c, "readinessProbe", probe(rest, 5, ok), ok);
    add_common_volumes(ps, c, nm, token_secret, ok);
    json_t *vol = json_object(), *claim = json_object(), *m = json_object();
    jset(vol, "name", json_string("state"), ok);
    jset(claim, "claimName", json_string(nm->claim), ok);
    jset(vol, "persistentVolumeClaim", claim, ok);
    jpush(json_object_get(ps, "volumes"), vol, ok);
    jset(m, "name", json_string("state"), ok);
    jset(m, "mountPath", json_string(STATE_MOUNT), ok);
    jpush(json_object_get(c, "volumeMounts"), m, ok);
    json_t *cs = json_array();
    jpush(cs, c, ok);
    jset(ps, "containers", cs, ok);
    jset(tmpl, "spec", ps, ok);
    jset(ds, "template", tmpl, ok);
    jset(d, "spec", ds, ok);
    return d;
}

static json_t *render_service(const struct cloud_render_opts *o,
                              const struct cloud_k8s_names *nm, int grpc, int rest, bool *ok) {
    json_t *s = obj("v1", "Service", nm->coordinator, o->ns, o->spec->name, ok);
    json_t *ss = json_object(), *ports = json_array(), *p;
    jset(ss, "selector", coordinator_labels(o->spec, ok), ok);
    p = json_object();
    jset(p, "name", json_string("grpc"), ok);
    jset(p, "port", json_integer(grpc), ok);
    jset(p, "targetPort", json_string("grpc"), ok);
    jset(p, "appProtocol", json_string("grpc"), ok);
    jpush(ports, p, ok);
    p = json_object();
    jset(p, "name", json_string("http"), ok);
    jset(p, "port", json_integer(rest), ok);
    jset(p, "targetPort", json_string("http"), ok);
    jpush(ports, p, ok);
    jset(ss, "ports", ports, ok);
    jset(s, "spec", ss, ok);
    return s;
}

/* ---- JSON -> YAML ----------------------------------------------------------------- */

struct ybuf {
    char *p;
    size_t len, cap;
    bool failed;
};

static void yput(struct ybuf *b, const char *s, size_t n) {
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *q = st_realloc(b->p, cap);
        if (!q) {
            b->failed = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void yputs(struct ybuf *b, const char *s) {
    yput(b, s, strlen(s));
}

static void yindent(struct ybuf *b, int n) {
    for (int i = 0; i < n; i++)
        yput(b, " ", 1);
}

/* A scalar: strings always double-quoted (JSON escapes are valid in YAML double-quoted
 * scalars), so "yes", "1" or "0400" never change type on the way. */
static void yscalar(struct ybuf *b, json_t *v) {
    char *s = json_dumps(v, JSON_ENCODE_ANY);
    if (!s) {
        b->failed = true;
        return;
    }
    yputs(b, s);
    free(s); /* jansson's allocator */
}

/* Keys that are safe unquoted: letters, digits and -_./ not starting with a digit. */
static bool plain_key(const char *k) {
    if (!k[0] || !((k[0] >= 'a' && k[0] <= 'z') || (k[0] >= 'A' && k[0] <= 'Z')))
        return false;
    for (const char *p = k; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.' || *p == '/'))
            return false;
    return true;
}

static bool empty_container(json_t *v) {
    return (json_is_object(v) && json_object_size(v) == 0) ||
           (json_is_array(v) && json_array_size(v) == 0);
}

static void yvalue(struct ybuf *b, json_t *v, int indent);

static void ykey(struct ybuf *b, const char *k) {
    if (plain_key(k)) {
        yputs(b, k);
    } else {
        json_t *s = json_string(k);
        yscalar(b, s);
        json_decref(s);
    }
    yputs(b, ":");
}

/* Writes the members of an object at `indent`; the first line's indentation is already
 * written when `first_done`. */
static void yobject(struct ybuf *b, json_t *o, int indent, bool first_done) {
    const char *k;
    json_t *v;
    bool first = true;
    json_object_foreach(o, k, v) {
        if (!(first && first_done))
            yindent(b, indent);
        first = false;
        ykey(b, k);
        if (json_is_object(v) && !empty_container(v)) {
            yputs(b, "\n");
            yobject(b, v, indent + 2, false);
        } else if (json_is_array(v) && !empty_container(v)) {
            yputs(b, "\n");
            yvalue(b, v, indent);
        } else {
            yputs(b, " ");
            yvalue(b, v, indent + 2);
            yputs(b, "\n");
        }
    }
}

static void yvalue(struct ybuf *b, json_t *v, int indent) {
    if (json_is_object(v) && json_object_size(v) == 0) {
        yputs(b, "{}");
    } else if (json_is_array(v) && json_array_size(v) == 0) {
        yputs(b, "[]");
    } else if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            yindent(b, indent);
            yputs(b, "- ");
            if (json_is_object(e) && !empty_container(e)) {
                yobject(b, e, indent + 2, true);
            } else {
                yvalue(b, e, indent + 2);
                yputs(b, "\n");
            }
        }
    } else {
        yscalar(b, v);
    }
}

int cloud__k8s_yaml(json_t *const *docs, size_t n, char **ret_yaml) {
    struct ybuf b = {0};
    for (size_t i = 0; i < n; i++) {
        yputs(&b, "---\n");
        yobject(&b, docs[i], 0, false);
    }
    if (b.failed || !b.p) {
        st_free(b.p);
        return -ENOMEM;
    }
    *ret_yaml = b.p;
    return 0;
}

int cloud_k8s_render(const struct cloud_render_opts *o, char **ret_yaml) {
    json_t *docs[10] = {0};
    size_t n = 0;
    bool ok = true;
    int r = 0;
    struct cloud_k8s_names nm;
    char token[80];

    if (!o || !o->spec || !o->image || !o->image[0] || !ret_yaml)
        return -EINVAL;
    const struct st_spec *spec = o->spec;
    cloud__k8s_names(spec->name, &nm);
    int grpc, rest;
    cloud__k8s_ports(spec, &grpc, &rest);
    const char *token_secret = o->token_secret && o->token_secret[0] ? o->token_secret
                                                                     : nm.secret;

    if (o->ns && o->ns[0]) {
        json_t *nsobj = json_object(), *meta = json_object();
        jset(nsobj, "apiVersion", json_string("v1"), &ok);
        jset(nsobj, "kind", json_string("Namespace"), &ok);
        jset(meta, "name", json_string(o->ns), &ok);
        jset(nsobj, "metadata", meta, &ok);
        docs[n++] = nsobj;
    }
    docs[n++] = obj("v1", "ServiceAccount", nm.account, o->ns, spec->name, &ok);
    docs[n++] = render_role(o, &nm, &ok);
    docs[n++] = render_binding(o, &nm, &ok);
    if (!(o->token_secret && o->token_secret[0])) {
        TRY_GOTO(random_token(token, sizeof(token)), r, out);
        json_t *sec = obj("v1", "Secret", nm.secret, o->ns, spec->name, &ok);
        json_t *data = json_object();
        jset(sec, "type", json_string("Opaque"), &ok);
        jset(data, "token", json_string(token), &ok);
        jset(sec, "stringData", data, &ok);
        docs[n++] = sec;
    }
    json_t *cm = obj("v1", "ConfigMap", nm.config, o->ns, spec->name, &ok);
    json_t *cmdata = json_object();
    jset(cmdata, "job.yaml", json_string(o->spec_text ? o->spec_text : ""), &ok);
    jset(cm, "data", cmdata, &ok);
    docs[n++] = cm;

    json_t *pvc = obj("v1", "PersistentVolumeClaim", nm.claim, o->ns, spec->name, &ok);
    json_t *ps = json_object(), *modes = json_array(), *res = json_object(),
           *req = json_object();
    jpush(modes, json_string("ReadWriteOnce"), &ok);
    jset(ps, "accessModes", modes, &ok);
    jset(req, "storage", json_string(o->state_size && o->state_size[0] ? o->state_size : "1Gi"),
         &ok);
    jset(res, "requests", req, &ok);
    jset(ps, "resources", res, &ok);
    jset(pvc, "spec", ps, &ok);
    docs[n++] = pvc;
    docs[n++] = render_deployment(o, &nm, token_secret, grpc, rest, &ok);
    docs[n++] = render_service(o, &nm, grpc, rest, &ok);
    if (!ok) {
        r = -ENOMEM;
        goto out;
    }
    r = cloud__k8s_yaml(docs, n, ret_yaml);
out:
    for (size_t i = 0; i < n; i++)
        json_decref(docs[i]);
    explicit_bzero(token, sizeof(token));
    return r;
}
