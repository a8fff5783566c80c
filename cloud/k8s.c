/* k8s.c: the "kubernetes" provider — worker pods on (spot) node pools through the Kubernetes
 * API, over libcurl + jansson.
 *
 * The one idea: the pods labelled spottrain.dev/job=<name> ARE the fleet. Start lists them
 * (adopting what a previous coordinator left), creates named pods up to the target, and then
 * watches the pods from the list's resourceVersion on a non-blocking curl multi handle that
 * poll() advances; 410 Gone (or any broken stream) means list again. What a pod goes through
 * becomes the provider signals: Running = GRANTED; a DisruptionTarget condition or a
 * deletionTimestamp we did not cause = NOTICE with the grace period as deadline; gone after
 * a notice = LOST preempted, gone without one = LOST unannounced. Pending pods are capacity
 * not granted yet (next_deadline says something is coming). Lost pods are replaced up to the
 * target, as a node pool would.
 *
 * Credentials: in the cluster, the service account's token (re-read every minute and after a
 * 401, since it rotates) and CA under /var/run/secrets/kubernetes.io/serviceaccount; outside,
 * a kubeconfig (cloud_config.kubeconfig, else $KUBECONFIG): server, CA, token or token file,
 * client certificate, namespace of the current context.
 *
 * The labelSelector is sent, and applied again here: a server (or a mock) that ignores it
 * must not make us adopt someone else's pods. Node taints would need a ClusterRole (nodes are
 * cluster-scoped) and the render grants nothing cluster-wide, so they are not read. */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <yaml.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "cloud-internal.h"
#include "common.h"

#define SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"
#define K8S_TIMEOUT_MS 10000          /* one API request (not the watch) */
#define K8S_BODY_MAX (16u << 20)       /* a list of pods */
#define K8S_LINE_MAX (4u << 20)        /* one watch event */
#define K8S_TOKEN_REREAD 60.0          /* seconds between token-file reads */
#define K8S_BACKOFF_MIN 0.5
#define K8S_BACKOFF_MAX 30.0

struct k8s_pod {
    char name[CLOUD_NAME_MAX];
    char node[CLOUD_NAME_MAX];
    bool used;
    bool granted;        /* GRANTED sent (phase Running) */
    bool noticed;        /* NOTICE sent */
    bool released;       /* we deleted it */
    double started;      /* caller clock */
    double deadline;     /* NOTICE deadline, caller clock */
};

struct k8s_state {
    struct cloud_provider *p;
    const struct st_spec *spec;
    char job[128], job_id[40], ns[128];
    char server[CLOUD_URL_MAX];
    char token[8192];
    char token_file[512];
    double token_read_at;  /* caller clock of the last read; < 0 = never */
    char ca_file[512];
    char *ca_blob;         /* certificate-authority-data, decoded */
    size_t ca_blob_len;
    char cert_file[512], key_file[512];
    bool insecure;
    bool in_cluster;
    char image[256];
    char coordinator[256];
    const char *token_secret;
    char owner_uid[128];
    int grace;             /* seconds: pods' terminationGracePeriodSeconds, notice default */
    int target;            /* pods we want alive or coming */
    int next_index;        /* next pod name suffix */
    struct k8s_pod *pods;
    size_t npods;          /* used slots are anywhere in [0, npods) */
    /* the watch */
    CURLM *multi;
    CURL *watch;
    struct curl_slist *watch_hdrs;
    char *line;
    size_t line_len;
    bool line_overflow;
    bool watch_relist;     /* the stream said 410 Gone (or ERROR): list before watching */
    char rv[128];          /* resourceVersion to watch from */
    double retry_at;       /* caller clock: next list/watch/create attempt after a failure */
    double backoff;
    bool relist;           /* list before the next watch */
    bool listed;           /* a list succeeded: adoption is done, creating is safe */
    int last_err;          /* the last API failure, for logging once */
    double now;            /* the caller time of the current call */
};

/* ---- small helpers ----------------------------------------------------------------- */

static void set_str(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src ? src : "");
}

static const char *jstr(json_t *o, const char *path) {
    /* "a.b.c": nested object members. */
    char key[64];
    const char *p = path;
    json_t *cur = o;
    while (cur && *p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (n >= sizeof(key))
            return NULL;
        memcpy(key, p, n);
        key[n] = '\0';
        cur = json_object_get(cur, key);
        p = dot ? dot + 1 : p + n;
    }
    return json_is_string(cur) ? json_string_value(cur) : NULL;
}

static int read_small_file(const char *path, char *buf, size_t size) {
    char *data = NULL;
    size_t len = 0;
    TRY(st_read_file(path, size - 1, &data, &len));
    while (len > 0 && (data[len - 1] == '\n' || data[len - 1] == '\r' || data[len - 1] == ' '))
        len--;
    memcpy(buf, data, len);
    buf[len] = '\0';
    explicit_bzero(data, len);
    st_free(data);
    return 0;
}

/* Re-reads the token file when it is due (it rotates) or forced (after a 401). */
static void token_refresh(struct k8s_state *s, bool force) {
    if (!s->token_file[0])
        return;
    if (!force && s->token_read_at >= 0 && s->now - s->token_read_at < K8S_TOKEN_REREAD)
        return;
    char tok[sizeof(s->token)];
    int r = read_small_file(s->token_file, tok, sizeof(tok));
    if (r < 0) {
        cloud__log(s->p, ST_LOG_WARN, "kubernetes: cannot read the token file '%s': %s, "
                   "keeping the last one", s->token_file, st_strerror(r));
    } else {
        memcpy(s->token, tok, sizeof(tok));
    }
    explicit_bzero(tok, sizeof(tok));
    s->token_read_at = s->now;
}

/* ---- kubeconfig ----------------------------------------------------------------------- */

/* libyaml node -> jansson (scalars as strings): kubeconfigs only need lookups. */
static json_t *yaml_to_json(yaml_document_t *d, yaml_node_t *n, int depth) {
    if (!n || depth > 32)
        return NULL;
    if (n->type == YAML_SCALAR_NODE)
        return json_stringn((const char *)n->data.scalar.value, n->data.scalar.length);
    if (n->type == YAML_SEQUENCE_NODE) {
        json_t *a = json_array();
        for (yaml_node_item_t *it = n->data.sequence.items.start;
             a && it < n->data.sequence.items.top; it++)
            json_array_append_new(a, yaml_to_json(d, yaml_document_get_node(d, *it), depth + 1));
        return a;
    }
    json_t *o = json_object();
    for (yaml_node_pair_t *pr = n->data.mapping.pairs.start; o && pr < n->data.mapping.pairs.top;
         pr++) {
        yaml_node_t *k = yaml_document_get_node(d, pr->key);
        if (!k || k->type != YAML_SCALAR_NODE)
            continue;
        char key[256];
        snprintf(key, sizeof(key), "%.*s", (int)k->data.scalar.length,
                 (const char *)k->data.scalar.value);
        json_t *v = yaml_to_json(d, yaml_document_get_node(d, pr->value), depth + 1);
        if (v)
            json_object_set_new(o, key, v);
    }
    return o;
}

/* Standard base64 (RFC 4648, padding optional, whitespace skipped) into out. Returns 0 or
 * -EINVAL. */
static int base64_decode(const char *in, unsigned char *out, size_t size, size_t *ret_len) {
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    uint32_t acc = 0;
    int bits = 0;
    size_t n = 0;
    for (const char *p = in; *p && *p != '='; p++) {
        if (*p == '\n' || *p == '\r' || *p == ' ')
            continue;
        const char *c = strchr(alphabet, *p);
        if (!c || !*c)
            return -EINVAL;
        acc = (acc << 6) | (uint32_t)(c - alphabet);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n >= size)
                return -EINVAL;
            out[n++] = (unsigned char)(acc >> bits);
        }
    }
    *ret_len = n;
    return 0;
}

/* The element of a kubeconfig list ("clusters", "users", "contexts") named `name`, its
 * inner object (`field`). */
static json_t *named(json_t *root, const char *list, const char *name, const char *field) {
    size_t i;
    json_t *e;
    if (!name)
        return NULL;
    json_array_foreach(json_object_get(root, list), i, e) {
        const char *n = jstr(e, "name");
        if (n && !strcmp(n, name))
            return json_object_get(e, field);
    }
    return NULL;
}

/* A relative path in a kubeconfig is relative to the file's folder. */
static void kc_path(const char *kubeconfig, const char *p, char *out, size_t size) {
    const char *slash = strrchr(kubeconfig, '/');
    if (p[0] == '/' || !slash)
        snprintf(out, size, "%s", p);
    else
        snprintf(out, size, "%.*s/%s", (int)(slash - kubeconfig), kubeconfig, p);
}

static int load_kubeconfig(struct k8s_state *s, const char *path) {
    char *data = NULL;
    size_t len = 0;
    yaml_parser_t parser;
    yaml_document_t doc;
    json_t *root = NULL;
    int r = st_read_file(path, 1u << 20, &data, &len);
    if (r < 0) {
        cloud__log(s->p, ST_LOG_ERR, "kubernetes: cannot read the kubeconfig '%s': %s", path,
                   st_strerror(r));
        return r;
    }
    if (!yaml_parser_initialize(&parser)) {
        st_free(data);
        return -ENOMEM;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)data, len);
    if (!yaml_parser_load(&parser, &doc)) {
        cloud__log(s->p, ST_LOG_ERR, "kubernetes: the kubeconfig '%s' is not valid YAML (line "
                   "%zu)", path, parser.problem_mark.line + 1);
        yaml_parser_delete(&parser);
        st_free(data);
        return -EINVAL;
    }
    root = yaml_to_json(&doc, yaml_document_get_root_node(&doc), 0);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    explicit_bzero(data, len);
    st_free(data);

    const char *ctx_name = jstr(root, "current-context");
    json_t *ctx = named(root, "contexts", ctx_name, "context");
    if (!ctx && json_array_size(json_object_get(root, "contexts")) == 1)
        ctx = json_object_get(json_array_get(json_object_get(root, "contexts"), 0), "context");
    json_t *cluster = named(root, "clusters", jstr(ctx, "cluster"), "cluster");
    json_t *user = named(root, "users", jstr(ctx, "user"), "user");
    const char *server = jstr(cluster, "server");
    if (!server || !server[0] || strlen(server) >= sizeof(s->server)) {
        cloud__log(s->p, ST_LOG_ERR, "kubernetes: the kubeconfig '%s' names no cluster server "
                   "for context '%s'", path, ctx_name ? ctx_name : "(none)");
        r = -EINVAL;
        goto out;
    }
    set_str(s->server, sizeof(s->server), server);
    size_t n = strlen(s->server);
    while (n > 0 && s->server[n - 1] == '/')
        s->server[--n] = '\0';
    const char *v;
    if ((v = jstr(cluster, "certificate-authority")))
        kc_path(path, v, s->ca_file, sizeof(s->ca_file));
    if ((v = jstr(cluster, "certificate-authority-data")) && v[0]) {
        size_t vl = strlen(v);
        s->ca_blob = st_malloc(vl + 1);
        if (!s->ca_blob) {
            r = -ENOMEM;
            goto out;
        }
        r = base64_decode(v, (unsigned char *)s->ca_blob, vl + 1, &s->ca_blob_len);
        if (r < 0) {
            cloud__log(s->p, ST_LOG_ERR, "kubernetes: bad certificate-authority-data in '%s'",
                       path);
            goto out;
        }
    }
    if ((v = jstr(cluster, "insecure-skip-tls-verify")))
        s->insecure = !strcmp(v, "true");
    if ((v = jstr(user, "token")))
        set_str(s->token, sizeof(s->token), v);
    if ((v = jstr(user, "tokenFile")))
        kc_path(path, v, s->token_file, sizeof(s->token_file));
    if ((v = jstr(user, "client-certificate")))
        kc_path(path, v, s->cert_file, sizeof(s->cert_file));
    if ((v = jstr(user, "client-key")))
        kc_path(path, v, s->key_file, sizeof(s->key_file));
    if ((v = jstr(ctx, "namespace")) && v[0])
        set_str(s->ns, sizeof(s->ns), v);
    r = 0;
out:
    if (r < 0) {
        st_free(s->ca_blob);
        s->ca_blob = NULL;
    }
    json_decref(root);
    return r;
}

static int load_in_cluster(struct k8s_state *s) {
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *port = getenv("KUBERNETES_SERVICE_PORT");
    if (!host || !host[0])
        return -ENOENT;
    snprintf(s->server, sizeof(s->server), strchr(host, ':') ? "https://[%s]:%s"
                                                             : "https://%s:%s",
             host, port && port[0] ? port : "443");
    snprintf(s->token_file, sizeof(s->token_file), "%s/token", SA_DIR);
    snprintf(s->ca_file, sizeof(s->ca_file), "%s/ca.crt", SA_DIR);
    if (!s->ns[0])
        (void)read_small_file(SA_DIR "/namespace", s->ns, sizeof(s->ns));
    s->in_cluster = true;
    return 0;
}

/* ---- requests --------------------------------------------------------------------------- */

struct k8s_body {
    char *p;
    size_t len;
    bool toobig;
};

static size_t body_write(char *ptr, size_t size, size_t nmemb, void *userdata) {
    struct k8s_body *b = userdata;
    size_t n = size * nmemb;
    if (b->len + n > K8S_BODY_MAX) {
        b->toobig = true;
        return 0;
    }
    char *q = st_realloc(b->p, b->len + n + 1);
    if (!q)
        return 0;
    memcpy(q + b->len, ptr, n);
    b->len += n;
    q[b->len] = '\0';
    b->p = q;
    return n;
}

/* Sets URL, TLS and credentials on an easy handle; *hdrs gets the header list to free. */
static int setup_handle(struct k8s_state *s, CURL *h, const char *path,
                        struct curl_slist **hdrs) {
    char url[CLOUD_URL_MAX + 1024], auth[sizeof(s->token) + 32];
    snprintf(url, sizeof(url), "%s%s", s->server, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    if (s->ca_file[0])
        curl_easy_setopt(h, CURLOPT_CAINFO, s->ca_file);
    if (s->ca_blob) {
        struct curl_blob blob = {s->ca_blob, s->ca_blob_len, CURL_BLOB_COPY};
        curl_easy_setopt(h, CURLOPT_CAINFO_BLOB, &blob);
    }
    if (s->insecure) {
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    if (s->cert_file[0])
        curl_easy_setopt(h, CURLOPT_SSLCERT, s->cert_file);
    if (s->key_file[0])
        curl_easy_setopt(h, CURLOPT_SSLKEY, s->key_file);
    struct curl_slist *l = curl_slist_append(NULL, "Accept: application/json");
    if (l && s->token[0]) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", s->token);
        struct curl_slist *l2 = curl_slist_append(l, auth);
        explicit_bzero(auth, sizeof(auth));
        if (!l2) {
            curl_slist_free_all(l);
            return -ENOMEM;
        }
        l = l2;
    }
    if (!l)
        return -ENOMEM;
    *hdrs = l;
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, l);
    return 0;
}

/* What a refused request means, said once with the permission it needs. */
static int api_refused(struct k8s_state *s, long status, const char *verb, const char *what) {
    int r = status == 401 ? -EACCES : -EPERM;
    if (s->last_err != r) {
        if (status == 401)
            cloud__log(s->p, ST_LOG_ERR, "kubernetes: the API server at %s refused our "
                       "credentials (401 Unauthorized) to %s %s in namespace '%s': check the "
                       "token or kubeconfig", s->server, verb, what, s->ns);
        else
            cloud__log(s->p, ST_LOG_ERR, "kubernetes: permission '%s %s' is missing in namespace "
                       "'%s' (403 Forbidden): bind the Role that `spottrain k8s render` makes "
                       "(pods get/list/watch/create/delete/patch, events create) to the "
                       "coordinator's service account", verb, what, s->ns);
    }
    s->last_err = r;
    return r;
}

/* One API request. body: JSON to send (NULL = none). Returns the HTTP status (>= 100) with
 * *ret_json the parsed reply (NULL when not JSON; caller json_decref()s), or a negative errno
 * for transport failures. A 401 re-reads the token file and retries once. */
static int api(struct k8s_state *s, const char *method, const char *path, json_t *body,
               const char *content_type, json_t **ret_json) {
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    int result = -EIO;
    if (body && !text)
        return -ENOMEM;
    for (int attempt = 0; attempt < 2; attempt++) {
        token_refresh(s, attempt > 0);
        CURL *h = curl_easy_init();
        struct curl_slist *hdrs = NULL;
        struct k8s_body b = {0};
        if (!h) {
            result = -ENOMEM;
            break;
        }
        int r = setup_handle(s, h, path, &hdrs);
        if (r < 0) {
            curl_easy_cleanup(h);
            result = r;
            break;
        }
        if (text) {
            char ct[96];
            snprintf(ct, sizeof(ct), "Content-Type: %s", content_type);
            struct curl_slist *l = curl_slist_append(hdrs, ct);
            if (l) {
                hdrs = l;
                curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
            }
            curl_easy_setopt(h, CURLOPT_POSTFIELDS, text);
        }
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)K8S_TIMEOUT_MS);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, body_write);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
        CURLcode cc = curl_easy_perform(h);
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(h);
        curl_slist_free_all(hdrs);
        if (cc != CURLE_OK) {
            result = b.toobig ? -EFBIG
                     : cc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT
                     : cc == CURLE_COULDNT_CONNECT ? -ECONNREFUSED
                     : cc == CURLE_OUT_OF_MEMORY ? -ENOMEM : -EIO;
            st_free(b.p);
            break;
        }
        if (status == 401 && attempt == 0 && s->token_file[0]) {
            st_free(b.p);
            continue; /* the token may have rotated under us */
        }
        if (ret_json) {
            *ret_json = b.p ? json_loads(b.p, 0, NULL) : NULL;
        }
        st_free(b.p);
        result = (int)status;
        break;
    }
    free(text); /* jansson's allocator */
    return result;
}

static void pods_path(struct k8s_state *s, char *buf, size_t size, const char *name,
                      const char *query) {
    snprintf(buf, size, "/api/v1/namespaces/%s/pods%s%s%s%s", s->ns, name ? "/" : "",
             name ? name : "", query ? "?" : "", query ? query : "");
}

/* ---- the pod table ------------------------------------------------------------------- */

static struct k8s_pod *pod_find(struct k8s_state *s, const char *name) {
    for (size_t i = 0; i < s->npods; i++)
        if (s->pods[i].used && !strcmp(s->pods[i].name, name))
            return &s->pods[i];
    return NULL;
}

static struct k8s_pod *pod_add(struct k8s_state *s, const char *name) {
    struct k8s_pod *x = NULL;
    for (size_t i = 0; i < s->npods && !x; i++)
        if (!s->pods[i].used)
            x = &s->pods[i];
    if (!x) {
        if (s->npods >= CLOUD_MAX_INSTANCES)
            return NULL;
        x = &s->pods[s->npods++];
    }
    memset(x, 0, sizeof(*x));
    x->used = true;
    set_str(x->name, sizeof(x->name), name);
    x->started = s->now;
    return x;
}

static int pods_coming(struct k8s_state *s) {
    int n = 0;
    for (size_t i = 0; i < s->npods; i++)
        n += s->pods[i].used && !s->pods[i].released && !s->pods[i].noticed;
    return n;
}

static int emit(struct k8s_state *s, enum cloud_signal_kind kind, const struct k8s_pod *x,
                enum cloud_loss_reason reason) {
    struct cloud_signal sig = {.kind = kind, .at = s->now, .reason = reason};
    memcpy(sig.instance, x->name, sizeof(sig.instance));
    memcpy(sig.node, x->node, sizeof(sig.node));
    if (kind == CLOUD_SIG_NOTICE)
        sig.deadline = x->deadline;
    return cloud__emit(s->p, &sig);
}

/* A pod left the API server (or ended): LOST, released / preempted / unannounced. */
static int pod_gone(struct k8s_state *s, struct k8s_pod *x) {
    enum cloud_loss_reason why = x->released ? CLOUD_LOSS_RELEASED
                                 : x->noticed ? CLOUD_LOSS_PREEMPTED : CLOUD_LOSS_UNANNOUNCED;
    int r = 0;
    if (x->granted || x->noticed)
        r = emit(s, CLOUD_SIG_LOST, x, why);
    if (!x->released)
        cloud__log(s->p, ST_LOG_NOTICE, "kubernetes: pod '%s' is gone (%s)", x->name,
                   cloud_loss_reason_name(why));
    x->used = false;
    return r;
}

/* True when the object carries our job's label (the server may ignore labelSelector). */
static bool ours(struct k8s_state *s, json_t *pod, bool *ret_same_id) {
    json_t *labels = json_object_get(json_object_get(pod, "metadata"), "labels");
    /* Label keys hold dots: look them up whole, not as jstr() paths. */
    const char *job = json_string_value(json_object_get(labels, CLOUD_K8S_LABEL_JOB));
    const char *role = json_string_value(json_object_get(labels, CLOUD_K8S_LABEL_ROLE));
    const char *id = json_string_value(json_object_get(labels, CLOUD_K8S_LABEL_JOB_ID));
    if (!job || strcmp(job, s->job) || !role || strcmp(role, "worker"))
        return false;
    *ret_same_id = id && !strcmp(id, s->job_id);
    return true;
}

static bool has_condition(json_t *pod, const char *type) {
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(json_object_get(pod, "status"), "conditions"), i, c) {
        const char *t = jstr(c, "type"), *st = jstr(c, "status");
        if (t && st && !strcmp(t, type) && !strcmp(st, "True"))
            return true;
    }
    return false;
}

/* Applies one observed state of a pod (ADDED, MODIFIED, or from a list). */
static int pod_seen(struct k8s_state *s, json_t *pod, bool adopt) {
    bool same_id = false;
    const char *name = jstr(pod, "metadata.name");
    if (!name || !ours(s, pod, &same_id))
        return 0;
    struct k8s_pod *x = pod_find(s, name);
    if (!x) {
        if (!same_id) {
            cloud__log(s->p, ST_LOG_WARN, "kubernetes: pod '%s' is labelled with job '%s' but "
                       "another job id, ignoring", name, s->job);
            return 0;
        }
        if (!adopt && jstr(pod, "metadata.deletionTimestamp"))
            return 0;
        x = pod_add(s, name);
        if (!x)
            return -ENOBUFS;
        if (adopt)
            cloud__log(s->p, ST_LOG_NOTICE, "kubernetes: adopting pod '%s'", name);
        int idx = 0;
        const char *w = strrchr(name, 'w');
        if (w && sscanf(w + 1, "%d", &idx) == 1 && idx >= s->next_index)
            s->next_index = idx + 1;
    }
    const char *node = jstr(pod, "spec.nodeName");
    if (node)
        set_str(x->node, sizeof(x->node), node);
    const char *phase = jstr(pod, "status.phase");
    if (phase && (!strcmp(phase, "Succeeded") || !strcmp(phase, "Failed"))) {
        /* The worker process ended; the pod (restartPolicy Never) will not come back. A
         * worker that exits 0 without a notice was told to (Stop): not a loss to replace. One
         * that leaves after a notice was preempted. */
        if (!strcmp(phase, "Succeeded") && !x->released && !x->noticed) {
            x->released = true;
            if (s->target > 0)
                s->target--;
        }
        char path[512];
        pods_path(s, path, sizeof(path), x->name, NULL);
        (void)api(s, "DELETE", path, NULL, NULL, NULL);
        return pod_gone(s, x);
    }
    if (!x->granted && phase && !strcmp(phase, "Running")) {
        x->granted = true;
        TRY(emit(s, CLOUD_SIG_GRANTED, x, CLOUD_LOSS_NONE));
    }
    if (!x->noticed && !x->released &&
        (has_condition(pod, "DisruptionTarget") || jstr(pod, "metadata.deletionTimestamp"))) {
        json_t *g = json_object_get(json_object_get(pod, "metadata"), "deletionGracePeriodSeconds");
        double grace = json_is_integer(g) ? (double)json_integer_value(g) : s->grace;
        x->noticed = true;
        x->deadline = s->now + grace;
        if (x->granted)
            TRY(emit(s, CLOUD_SIG_NOTICE, x, CLOUD_LOSS_NONE));
    }
    return 0;
}

/* Lists the job's pods, reconciles the table with them and remembers the resourceVersion. */
static int list_pods(struct k8s_state *s, bool adopt) {
    char path[512], query[300];
    json_t *reply = NULL;
    snprintf(query, sizeof(query), "labelSelector=%s%%3D%s", CLOUD_K8S_LABEL_JOB, s->job);
    pods_path(s, path, sizeof(path), NULL, query);
    int st = api(s, "GET", path, NULL, NULL, &reply);
    if (st < 0 || st == 401 || st == 403 || st != 200) {
        json_decref(reply);
        if (st == 401 || st == 403)
            return api_refused(s, st, "list", "pods");
        return st < 0 ? st : -EPROTO;
    }
    const char *rv = jstr(reply, "metadata.resourceVersion");
    set_str(s->rv, sizeof(s->rv), rv);
    json_t *items = json_object_get(reply, "items");
    /* Pods we know that the list lacks are gone. */
    for (size_t i = 0; i < s->npods; i++) {
        struct k8s_pod *x = &s->pods[i];
        if (!x->used)
            continue;
        bool found = false;
        size_t j;
        json_t *it;
        json_array_foreach(items, j, it) {
            const char *n = jstr(it, "metadata.name");
            if (n && !strcmp(n, x->name))
                found = true;
        }
        if (!found) {
            int r = pod_gone(s, x);
            if (r < 0) {
                json_decref(reply);
                return r;
            }
        }
    }
    size_t j;
    json_t *it;
    int r = 0;
    json_array_foreach(items, j, it) {
        if ((r = pod_seen(s, it, adopt)) < 0)
            break;
    }
    json_decref(reply);
    if (r == 0)
        s->last_err = 0;
    return r;
}

static int create_pod(struct k8s_state *s) {
    char name[CLOUD_NAME_MAX], path[512];
    json_t *pod = NULL, *reply = NULL;
    snprintf(name, sizeof(name), "%.50s-w%d", s->job, s->next_index);
    struct cloud_k8s_pod_opts o = {
        .spec = s->spec, .name = name, .ns = s->ns, .job_id = s->job_id, .image = s->image,
        .coordinator = s->coordinator, .token_secret = s->token_secret,
        .owner_uid = s->owner_uid, .grace_seconds = s->grace,
    };
    TRY(cloud__k8s_worker_pod(&o, &pod));
    pods_path(s, path, sizeof(path), NULL, NULL);
    int st = api(s, "POST", path, pod, "application/json", &reply);
    json_decref(pod);
    json_decref(reply);
    if (st == 401 || st == 403)
        return api_refused(s, st, "create", "pods");
    if (st == 409) {
        s->next_index++; /* a leftover holds the name: take the next one */
        return -EEXIST;
    }
    if (st < 0)
        return st;
    if (st != 201 && st != 200 && st != 202)
        return -EPROTO;
    s->next_index++;
    s->last_err = 0;
    if (!pod_find(s, name) && !pod_add(s, name))
        return -ENOBUFS;
    cloud__log(s->p, ST_LOG_INFO, "kubernetes: created pod '%s'", name);
    return 0;
}

/* Creates pods until alive + coming reaches the target. */
static int fill(struct k8s_state *s) {
    while (s->target >= 0 && pods_coming(s) < s->target) {
        int r = create_pod(s);
        if (r == -EEXIST)
            continue;
        if (r < 0)
            return r;
    }
    return 0;
}

static int delete_pod(struct k8s_state *s, struct k8s_pod *x) {
    char path[512];
    pods_path(s, path, sizeof(path), x->name, NULL);
    int st = api(s, "DELETE", path, NULL, NULL, NULL);
    if (st == 401 || st == 403)
        return api_refused(s, st, "delete", "pods");
    if (st < 0)
        return st;
    if (st != 200 && st != 202 && st != 404)
        return -EPROTO;
    x->released = true;
    return 0;
}

/* ---- the watch -------------------------------------------------------------------------- */

static int handle_event(struct k8s_state *s, const char *line, size_t len) {
    json_error_t e;
    json_t *ev = json_loadb(line, len, 0, &e);
    if (!ev)
        return 0; /* a torn line: the next list repairs whatever it carried */
    const char *type = jstr(ev, "type");
    json_t *obj = json_object_get(ev, "object");
    int r = 0;
    cloud__log(s->p, ST_LOG_DEBUG, "kubernetes: watch event %s '%s'", type ? type : "?",
               jstr(obj, "metadata.name") ? jstr(obj, "metadata.name") : "");
    if (!type) {
    } else if (!strcmp(type, "ERROR")) {
        json_t *code = json_object_get(obj, "code");
        if (json_integer_value(code) == 410)
            cloud__log(s->p, ST_LOG_INFO, "kubernetes: watch expired (410 Gone), listing again");
        s->watch_relist = true;
    } else if (!strcmp(type, "BOOKMARK")) {
        set_str(s->rv, sizeof(s->rv), jstr(obj, "metadata.resourceVersion"));
    } else if (!strcmp(type, "DELETED")) {
        bool same = false;
        const char *name = jstr(obj, "metadata.name");
        struct k8s_pod *x = name && ours(s, obj, &same) ? pod_find(s, name) : NULL;
        if (x)
            r = pod_gone(s, x);
    } else if (!strcmp(type, "ADDED") || !strcmp(type, "MODIFIED")) {
        const char *rv = jstr(obj, "metadata.resourceVersion");
        if (rv)
            set_str(s->rv, sizeof(s->rv), rv);
        r = pod_seen(s, obj, false);
    }
    json_decref(ev);
    return r;
}

static size_t watch_write(char *ptr, size_t size, size_t nmemb, void *userdata) {
    struct k8s_state *s = userdata;
    size_t n = size * nmemb;
    long status = 0;
    curl_easy_getinfo(s->watch, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200)
        return n; /* an error body; the status decides (watch_done) */
    for (size_t i = 0; i < n; i++) {
        if (ptr[i] == '\n') {
            if (!s->line_overflow && s->line_len > 0)
                (void)handle_event(s, s->line, s->line_len);
            s->line_len = 0;
            s->line_overflow = false;
            continue;
        }
        if (s->line_len + 1 >= K8S_LINE_MAX) {
            s->line_overflow = true; /* dropped; the next list repairs it */
            continue;
        }
        s->line[s->line_len++] = ptr[i];
    }
    return n;
}

static void watch_stop(struct k8s_state *s) {
    if (s->watch) {
        curl_multi_remove_handle(s->multi, s->watch);
        curl_easy_cleanup(s->watch);
        s->watch = NULL;
    }
    curl_slist_free_all(s->watch_hdrs);
    s->watch_hdrs = NULL;
    s->line_len = 0;
    s->line_overflow = false;
}

static int watch_start(struct k8s_state *s) {
    char path[512], query[512];
    snprintf(query, sizeof(query),
             "watch=true&allowWatchBookmarks=true&labelSelector=%s%%3D%s%s%s",
             CLOUD_K8S_LABEL_JOB, s->job, s->rv[0] ? "&resourceVersion=" : "", s->rv);
    pods_path(s, path, sizeof(path), NULL, query);
    token_refresh(s, false);
    s->watch = curl_easy_init();
    if (!s->watch)
        return -ENOMEM;
    int r = setup_handle(s, s->watch, path, &s->watch_hdrs);
    if (r < 0) {
        watch_stop(s);
        return r;
    }
    curl_easy_setopt(s->watch, CURLOPT_WRITEFUNCTION, watch_write);
    curl_easy_setopt(s->watch, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(s->watch, CURLOPT_CONNECTTIMEOUT_MS, (long)K8S_TIMEOUT_MS);
    /* A silent stream for 5 minutes is a dead one (servers end watches within 30 min). */
    curl_easy_setopt(s->watch, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(s->watch, CURLOPT_LOW_SPEED_TIME, 300L);
    if (curl_multi_add_handle(s->multi, s->watch) != CURLM_OK) {
        watch_stop(s);
        return -ENOMEM;
    }
    s->watch_relist = false;
    return 0;
}

/* The watch ended (or failed): decide whether to list again and when. */
static void watch_done(struct k8s_state *s, CURLcode cc) {
    long status = 0;
    curl_easy_getinfo(s->watch, CURLINFO_RESPONSE_CODE, &status);
    watch_stop(s);
    if (status == 410) {
        cloud__log(s->p, ST_LOG_INFO, "kubernetes: watch from resourceVersion '%s' is gone "
                   "(410), listing again", s->rv);
        s->relist = true;
        s->rv[0] = '\0';
        return; /* at once: nothing is wrong with the server */
    }
    if (status == 401 || status == 403)
        (void)api_refused(s, status, "watch", "pods");
    else if (cc != CURLE_OK && s->last_err != -EIO) {
        cloud__log(s->p, ST_LOG_WARN, "kubernetes: watch of pods broke (%s), retrying",
                   curl_easy_strerror(cc));
        s->last_err = -EIO;
    }
    s->relist = true;
    s->retry_at = s->now + s->backoff;
    s->backoff = ST_MIN(s->backoff * 2, K8S_BACKOFF_MAX);
}

/* ---- the backend ------------------------------------------------------------------------ */

static int k8s_init(struct cloud_provider *p, void *state, const struct cloud_config *cfg) {
    struct k8s_state *s = state;
    s->p = p;
    s->now = 0;
    s->token_read_at = -1;
    s->backoff = K8S_BACKOFF_MIN;
    if (!cfg->spec || !cfg->job_name[0] || cfg->max_instances > CLOUD_MAX_INSTANCES) {
        cloud__log(p, ST_LOG_ERR, "kubernetes: needs the job spec and name");
        return -EINVAL;
    }
    s->spec = cfg->spec;
    set_str(s->job, sizeof(s->job), cfg->job_name);
    set_str(s->job_id, sizeof(s->job_id), cfg->job_id);
    set_str(s->ns, sizeof(s->ns), cfg->k8s_namespace);
    const char *img = s->spec->fleet.image[0] ? s->spec->fleet.image : getenv("SPOTTRAIN_IMAGE");
    if (!img || !img[0]) {
        cloud__log(p, ST_LOG_ERR, "kubernetes: spec.fleet.image is empty (the image the worker "
                   "pods run)");
        return -EINVAL;
    }
    set_str(s->image, sizeof(s->image), img);
    s->grace = s->spec->fleet.notice_seconds >= 1 ? (int)s->spec->fleet.notice_seconds : 30;
    s->target = cfg->max_instances > 0 ? cfg->max_instances : 0;

    int r;
    const char *kc = cfg->kubeconfig[0] ? cfg->kubeconfig : getenv("KUBECONFIG");
    if (kc && kc[0]) {
        /* $KUBECONFIG may list several files; the first one is used. */
        char first[512];
        snprintf(first, sizeof(first), "%.*s", (int)strcspn(kc, ":"), kc);
        TRY(load_kubeconfig(s, first));
    } else if ((r = load_in_cluster(s)) < 0) {
        cloud__log(p, ST_LOG_ERR, "kubernetes: no API server: not in a cluster "
                   "(KUBERNETES_SERVICE_HOST unset) and no kubeconfig (--kubeconfig, $KUBECONFIG)");
        return -EINVAL;
    }
    if (!s->ns[0]) {
        const char *ns = getenv("SPOTTRAIN_NAMESPACE");
        set_str(s->ns, sizeof(s->ns), ns && ns[0] ? ns : "default");
    }
    int grpc, rest;
    cloud__k8s_ports(s->spec, &grpc, &rest);
    if (s->spec->coordinator.advertise[0])
        set_str(s->coordinator, sizeof(s->coordinator), s->spec->coordinator.advertise);
    else if (s->in_cluster)
        snprintf(s->coordinator, sizeof(s->coordinator), "spottrain-%s-coordinator.%s.svc:%d",
                 s->job, s->ns, grpc);
    else
        set_str(s->coordinator, sizeof(s->coordinator), cfg->coordinator);
    s->pods = st_calloc(CLOUD_MAX_INSTANCES, sizeof(*s->pods));
    s->line = st_malloc(K8S_LINE_MAX);
    s->multi = curl_multi_init();
    if (!s->pods || !s->line || !s->multi) {
        st_free(s->pods);
        st_free(s->line);
        if (s->multi)
            curl_multi_cleanup(s->multi);
        st_free(s->ca_blob);
        return -ENOMEM;
    }
    cloud__log(p, ST_LOG_INFO, "kubernetes: API server %s, namespace '%s', image '%s', workers "
               "dial %s", s->server, s->ns, s->image, s->coordinator);
    return 0;
}

static void k8s_done(struct cloud_provider *p, void *state) {
    struct k8s_state *s = state;
    watch_stop(s);
    if (!cloud_provider_detached(p)) {
        /* The job is over: leave no pod behind. */
        for (size_t i = 0; i < s->npods; i++)
            if (s->pods[i].used && !s->pods[i].released) {
                int r = delete_pod(s, &s->pods[i]);
                if (r < 0)
                    cloud__log(p, ST_LOG_WARN, "kubernetes: cannot delete pod '%s': %s",
                               s->pods[i].name, st_strerror(r));
            }
    } else {
        cloud__log(p, ST_LOG_NOTICE, "kubernetes: leaving the worker pods for the next "
                   "coordinator to adopt");
    }
    curl_multi_cleanup(s->multi);
    st_free(s->pods);
    st_free(s->line);
    st_free(s->ca_blob);
    explicit_bzero(s->token, sizeof(s->token));
}

/* The job ConfigMap's uid, for the workers' owner reference; none when it cannot be read (a
 * coordinator run outside `k8s render`'s objects). */
static void read_owner(struct k8s_state *s) {
    char path[512];
    json_t *reply = NULL;
    struct cloud_k8s_names nm;
    cloud__k8s_names(s->job, &nm);
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s/configmaps/%s", s->ns, nm.config);
    int st = api(s, "GET", path, NULL, NULL, &reply);
    const char *uid = st == 200 ? jstr(reply, "metadata.uid") : NULL;
    if (uid && uid[0])
        set_str(s->owner_uid, sizeof(s->owner_uid), uid);
    else
        cloud__log(s->p, ST_LOG_INFO, "kubernetes: no uid for ConfigMap '%s' (HTTP %d); worker "
                   "pods get no owner reference", nm.config, st);
    json_decref(reply);
}

/* List (adopting on the first one), create up to the target, watch. */
static int resync(struct k8s_state *s) {
    if (s->relist) {
        if (!s->listed)
            read_owner(s);
        TRY(list_pods(s, !s->listed));
        s->listed = true;
        s->relist = false;
    }
    TRY(fill(s));
    return watch_start(s);
}

/* After a failure: try again later, twice as late each time up to K8S_BACKOFF_MAX; said once
 * per kind of failure. */
static void retry_later(struct k8s_state *s, int r) {
    if (r != -EACCES && r != -EPERM && s->last_err != r)
        cloud__log(s->p, ST_LOG_WARN, "kubernetes: API server %s: %s, retrying with backoff "
                   "(%.1f s, at most %.0f s)", s->server, st_strerror(r), s->backoff,
                   K8S_BACKOFF_MAX);
    s->last_err = r;
    s->retry_at = s->now + s->backoff;
    s->backoff = ST_MIN(s->backoff * 2, K8S_BACKOFF_MAX);
}

static int k8s_start(struct cloud_provider *p, void *state, double now) {
    struct k8s_state *s = state;
    (void)p;
    s->now = now;
    s->relist = true;
    int r = resync(s);
    /* Missing permissions will not fix themselves: fail now, with the error said once. An
     * unreachable server (the API server restarting, a network blip) is retried. */
    if (r == -EACCES || r == -EPERM)
        return r;
    if (r < 0)
        retry_later(s, r);
    return 0;
}

static int k8s_poll(struct cloud_provider *p, void *state, double now) {
    struct k8s_state *s = state;
    (void)p;
    s->now = now;
    if (s->watch) {
        int running = 0;
        curl_multi_perform(s->multi, &running);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(s->multi, &left)))
            if (m->msg == CURLMSG_DONE && m->easy_handle == s->watch) {
                watch_done(s, m->data.result);
                break;
            }
        if (s->watch && s->watch_relist) {
            watch_stop(s);
            s->relist = true;
            s->rv[0] = '\0';
        }
    }
    if (now < s->retry_at)
        return 0;
    int r = s->watch ? (s->listed ? fill(s) : 0) : resync(s);
    if (r < 0)
        retry_later(s, r); /* the loop goes on; the log says why */
    else if (!s->watch_relist)
        s->backoff = K8S_BACKOFF_MIN;
    return 0;
}

static int k8s_acquire(struct cloud_provider *p, void *state, int n, double now) {
    struct k8s_state *s = state;
    (void)p;
    s->now = now;
    int before = pods_coming(s);
    s->target = ST_MIN(s->target + n, CLOUD_MAX_INSTANCES);
    if (s->listed)
        TRY(fill(s)); /* else the first list (in poll) adopts before creating */
    return pods_coming(s) - before;
}

static int k8s_release(struct cloud_provider *p, void *state, const char *instance, double now) {
    struct k8s_state *s = state;
    (void)p;
    s->now = now;
    struct k8s_pod *x = pod_find(s, instance);
    if (!x || x->released)
        return -ENOENT;
    TRY(delete_pod(s, x));
    if (s->target > 0)
        s->target--;
    return 0;
}

static int k8s_instances(struct cloud_provider *p, void *state, struct cloud_instance *out,
                         size_t max, size_t *ret_n) {
    struct k8s_state *s = state;
    (void)p;
    size_t n = 0;
    for (size_t i = 0; i < s->npods; i++) {
        const struct k8s_pod *x = &s->pods[i];
        if (!x->used || x->released)
            continue;
        if (out && n < max) {
            struct cloud_instance *in = &out[n];
            memset(in, 0, sizeof(*in));
            memcpy(in->name, x->name, sizeof(in->name));
            memcpy(in->node, x->node, sizeof(in->node));
            in->state = x->noticed ? CLOUD_INSTANCE_NOTICED : CLOUD_INSTANCE_RUNNING;
            in->started = x->started;
            in->deadline = x->noticed ? x->deadline : 0;
        }
        n++;
    }
    *ret_n = n;
    return 0;
}

static double k8s_next_deadline(struct cloud_provider *p, void *state, double now) {
    struct k8s_state *s = state;
    (void)p;
    /* Pending pods, a target not met or a watch to restart: something is coming. */
    if (s->target > 0 || pods_coming(s) > 0 || !s->watch)
        return now + 1.0;
    return -1;
}

const struct cloud_provider_ops cloud__k8s_ops = {
    .name = "kubernetes",
    .state_size = sizeof(struct k8s_state),
    .init = k8s_init,
    .done = k8s_done,
    .start = k8s_start,
    .poll = k8s_poll,
    .acquire = k8s_acquire,
    .release = k8s_release,
    .instances = k8s_instances,
    .next_deadline = k8s_next_deadline,
};
