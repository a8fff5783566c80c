/* aws.c: the `aws` provider — a job's spot fleet from EC2's Query API.
 *
 * The one idea: the cloud's own tags are the fleet's record. Every instance is started with
 * RunInstances carrying the tags spottrain:job (metadata.name) and spottrain:job-id (the
 * journal's job id), and every few seconds DescribeInstances filtered by the job-id tag is
 * reconciled against what we believe: an instance of ours that the cloud shows shutting down
 * or gone became a loss (whether or not its worker saw a notice), and a running instance we
 * did not start ourselves is adopted (a restarted coordinator on the same state directory
 * has the same job id, so it takes over the fleet instead of asking for another). The same
 * tag is what `spottrain down` and a failed start sweep, so nothing is left running.
 *
 * Why RunInstances with InstanceMarketOptions (spot, one-time, terminate) and not CreateFleet:
 * one request per zone keeps zone rotation in our hands (a capacity error in one zone moves
 * the request to the next, then to on-demand with fleet.on_demand_fallback), the answer lists
 * the instances at once, and it is the call every EC2-compatible endpoint implements.
 *
 * Requests: POST form bodies (Version 2016-11-15) signed by libcurl's SigV4
 * (CURLOPT_AWS_SIGV4); answers parsed with libxml2. Credentials and endpoints are found as
 * the AWS tools find them (AWS_ACCESS_KEY_ID..., AWS_PROFILE in AWS_SHARED_CREDENTIALS_FILE or
 * ~/.aws/credentials, AWS_REGION/AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_EC2/AWS_ENDPOINT_URL).
 * Secrets (the secret key, the session token, the join token inside the user-data) are
 * never logged and never shown by a dry run. */
#include <curl/curl.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "aws-creds.h"      /* st_aws_creds_find, st_aws_region_find, st_aws_endpoint_find */
#include "check.h"          /* TRY, TRY_GOTO */
#include "http.h"           /* st_sbuf, st_sb_*, st_curl_errno */
#include "cloud-internal.h" /* cloud__emit, cloud__log */
#include "spec.h"           /* struct st_spec: advertise, image, the spec file */

#define AWS_API_VERSION "2016-11-15"
#define AWS_REPLY_MAX (8u << 20)  /* larger answers are refused */
#define AWS_TRIES 4               /* tries of one request when throttled or 5xx */
#define AWS_USER_DATA_MAX 16384   /* EC2's limit on raw user-data */
#define AWS_SPEC_EMBED_MAX 12288  /* the job spec copied into the user-data */
#define AWS_PRICE_EVERY 300.0     /* caller-clock seconds between DescribeSpotPriceHistory */

#define aws_creds st_aws_creds /* common/aws-creds.h */

struct aws_inst {
    bool used;
    bool dead;          /* lost or released: no longer listed */
    struct cloud_instance pub;
};

struct aws_ctx {
    /* where and who */
    struct aws_creds creds;
    bool have_creds;
    char region[64];
    char endpoint[CLOUD_URL_MAX];
    cloud_dry_run_fn *dry_run;
    void *dry_run_userdata;
    void *curl; /* CURL *, reused so connections stay alive */
    char last_code[96]; /* the last AWS error code ("" = none) */
    bool optional;      /* the call is a signal we do without: its failure logs at INFO */
    bool refused;       /* AWS refused the credentials: every later request would fail too */
};

struct aws_state {
    struct aws_ctx ctx;
    char image[128];
    char instance_type[CLOUD_NAME_MAX];
    int nzones; /* 0 = EC2 chooses */
    char zones[CLOUD_MAX_ZONES][CLOUD_NAME_MAX];
    bool spot, fallback;
    double price, interval;
    int target;
    int zone_next; /* where the next spread starts: rotation */
    char job_name[128], job_id[40];
    char *user_data;       /* the bootstrap script with the join token: never logged */
    char *user_data_shown; /* the same with the token redacted */
    struct aws_inst *insts;
    size_t ninsts;
    double next_reconcile, next_fill;
    /* live spot prices, newest per zone (DescribeSpotPriceHistory) */
    int nprices;
    char price_zone[CLOUD_MAX_ZONES][CLOUD_NAME_MAX];
    char price_when[CLOUD_MAX_ZONES][32]; /* RFC 3339, compares as text */
    double zone_price[CLOUD_MAX_ZONES];   /* dollars per instance-hour */
    double next_price;
    bool price_off; /* the endpoint does not offer it: asked once, not again */
};

/* ---- small helpers ------------------------------------------------------------------------- */

static void aws_log(struct cloud_provider *p, int level, const char *fmt, ...) ST_PRINTF(3, 4);
static void aws_log(struct cloud_provider *p, int level, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (p)
        cloud__log(p, level, "aws: %s", msg);
    else
        st_log_internal(level, "cloud", __FILE__, __LINE__, "aws: %s", msg);
}

static void wipe(void *b, size_t n) {
    volatile unsigned char *q = b;
    while (n--)
        *q++ = 0;
}

/* One request's parameters: the body that is sent, and the text a dry run shows (the same,
 * except that UserData is shown decoded below the line instead of as base64). */
struct aws_query {
    struct st_sbuf body, shown;
    const char *user_data_shown; /* borrowed */
};

static void q_param(struct aws_query *q, const char *k, const char *v) {
    if (q->body.len) {
        st_sb_str(&q->body, "&");
        st_sb_str(&q->shown, "&");
    }
    st_sb_escape(&q->body, k);
    st_sb_str(&q->body, "=");
    st_sb_escape(&q->body, v);
    st_sb_escape(&q->shown, k);
    st_sb_str(&q->shown, "=");
    st_sb_escape(&q->shown, v);
}

/* Key "PREFIX<i>" (the Query API's lists: InstanceId.1, Filter.2.Value.3). */
static void q_parami(struct aws_query *q, const char *prefix, int i, const char *v) {
    char k[128];
    snprintf(k, sizeof(k), "%s%d", prefix, i);
    q_param(q, k, v);
}

static void q_init(struct aws_query *q, const char *action) {
    memset(q, 0, sizeof(*q));
    q->body.max = 1u << 20;
    q->shown.max = 1u << 20;
    q_param(q, "Action", action);
    q_param(q, "Version", AWS_API_VERSION);
}

static void q_done(struct aws_query *q) {
    st_sb_done(&q->body);
    st_sb_done(&q->shown);
}

/* ---- credentials, region, endpoint ---------------------------------------------------------- */

static void trim(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = '\0';
    size_t k = strspn(s, " \t");
    memmove(s, s + k, strlen(s + k) + 1);
}

/* Credentials: the lookup shared with S3 checkpoints (common/aws-creds.c). */
static int creds_find(struct cloud_provider *p, struct aws_creds *c) {
    char why[4500];
    int r = st_aws_creds_find(c, why, sizeof(why));
    if (r < 0)
        aws_log(p, ST_LOG_ERR, "%s", why);
    return r;
}

static int ctx_init(struct cloud_provider *p, struct aws_ctx *x, const char *zone,
                    cloud_dry_run_fn *dry_run, void *dry_ud) {
    st_aws_region_find(x->region, sizeof(x->region), zone);
    int e = st_aws_endpoint_find("EC2", x->endpoint, sizeof(x->endpoint));
    if (e < 0) {
        aws_log(p, ST_LOG_ERR, "bad EC2 endpoint '%s' (want http:// or https://)", x->endpoint);
        return -EINVAL;
    }
    if (e == 0)
        snprintf(x->endpoint, sizeof(x->endpoint), "https://ec2.%s.amazonaws.com", x->region);
    x->dry_run = dry_run;
    x->dry_run_userdata = dry_ud;
    if (dry_run)
        return 0; /* a dry run sends nothing: no credentials needed */
    TRY(creds_find(p, &x->creds));
    x->have_creds = true;
    x->curl = curl_easy_init();
    return x->curl ? 0 : -ENOMEM;
}

static void ctx_done(struct aws_ctx *x) {
    if (x->curl)
        curl_easy_cleanup(x->curl);
    x->curl = NULL;
    wipe(&x->creds, sizeof(x->creds));
}

/* ---- XML ------------------------------------------------------------------------------------ */

static bool xml_is(const xmlNode *n, const char *name) {
    return n && n->type == XML_ELEMENT_NODE && strcmp((const char *)n->name, name) == 0;
}

static xmlNode *xml_child(xmlNode *n, const char *name) {
    for (xmlNode *c = n ? n->children : NULL; c; c = c->next)
        if (xml_is(c, name))
            return c;
    return NULL;
}

/* Depth-first: the first element called name at or below n. */
static xmlNode *xml_find(xmlNode *n, const char *name) {
    for (; n; n = n->next) {
        if (xml_is(n, name))
            return n;
        xmlNode *f = xml_find(n->children, name);
        if (f)
            return f;
    }
    return NULL;
}

static void xml_text(xmlNode *n, char *out, size_t sz) {
    out[0] = '\0';
    if (!n)
        return;
    xmlChar *t = xmlNodeGetContent(n);
    if (t) {
        snprintf(out, sz, "%s", (const char *)t);
        xmlFree(t);
        trim(out);
    }
}

/* ---- one request ------------------------------------------------------------------------------ */

/* Which errno an AWS error code is: refused credentials, no capacity (try another zone),
 * throttled (try again later), a request EC2 calls invalid, or something else. */
static int code_errno(const char *code, long status) {
    static const char *const auth[] = {"AuthFailure", "SignatureDoesNotMatch",
        "InvalidClientTokenId", "UnauthorizedOperation", "IncompleteSignature",
        "MissingAuthenticationToken", "OptInRequired", "Blocked", "AccessDenied",
        "AccessDeniedException", "ExpiredToken", "RequestExpired", "InvalidAccessKeyId"};
    static const char *const capacity[] = {"InsufficientInstanceCapacity",
        "MaxSpotInstanceCountExceeded", "SpotMaxPriceTooLow", "InsufficientCapacity",
        "InsufficientHostCapacity", "InsufficientReservedInstanceCapacity",
        "InstanceLimitExceeded", "Unsupported"};
    static const char *const busy[] = {"RequestLimitExceeded", "Throttling",
        "ThrottlingException", "ServiceUnavailable", "Unavailable", "InternalError",
        "InternalFailure", "SlowDown"};
    for (size_t i = 0; i < ST_ARRAY_SIZE(auth); i++)
        if (!strcmp(code, auth[i]))
            return -EACCES;
    for (size_t i = 0; i < ST_ARRAY_SIZE(capacity); i++)
        if (!strcmp(code, capacity[i]))
            return -EAGAIN;
    for (size_t i = 0; i < ST_ARRAY_SIZE(busy); i++)
        if (!strcmp(code, busy[i]))
            return -EBUSY;
    if (!strncmp(code, "Invalid", 7) || !strncmp(code, "Missing", 7))
        return -EINVAL;
    if (status == 429 || status >= 500)
        return -EBUSY;
    if (status == 401 || status == 403)
        return -EACCES;
    return -EPROTO;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* One POST, no retry. Returns 0 with *ret_doc (an EC2 success answer) or negative errno;
 * an AWS error is logged with its code and message. */
static int aws_post_once(struct cloud_provider *p, struct aws_ctx *x, const char *action,
                         const struct aws_query *q, xmlDoc **ret_doc) {
    CURL *c = x->curl;
    struct st_sbuf rep = {.max = AWS_REPLY_MAX};
    struct curl_slist *h = NULL;
    char sigv4[128], tok[sizeof(x->creds.session) + 32];
    xmlDoc *doc = NULL;
    long status = 0;
    int r;

    curl_easy_reset(c);
    snprintf(sigv4, sizeof(sigv4), "aws:amz:%s:ec2", x->region);
    h = curl_slist_append(h, "Content-Type: application/x-www-form-urlencoded; charset=utf-8");
    if (x->creds.session[0]) {
        snprintf(tok, sizeof(tok), "X-Amz-Security-Token: %s", x->creds.session);
        h = curl_slist_append(h, tok);
        wipe(tok, sizeof(tok));
    }
    if (!h)
        TRY_GOTO(-ENOMEM, r, out);
    curl_easy_setopt(c, CURLOPT_URL, x->endpoint);
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, q->body.p);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)q->body.len);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4);
    curl_easy_setopt(c, CURLOPT_USERNAME, x->creds.key_id);
    curl_easy_setopt(c, CURLOPT_PASSWORD, x->creds.secret);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, st_sb_curl_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &rep);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 30000L);
    CURLcode cc = curl_easy_perform(c);
    if (cc != CURLE_OK) {
        r = rep.fail ? -EFBIG : st_curl_errno(cc, -EIO);
        aws_log(p, x->optional ? ST_LOG_INFO : ST_LOG_ERR, "%s: %s: %s", action, x->endpoint,
                curl_easy_strerror(cc));
        goto out;
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (rep.len > 0 && rep.len < INT32_MAX)
        doc = xmlReadMemory(rep.p, (int)rep.len, "ec2.xml", NULL,
                            XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    xmlNode *root = doc ? xmlDocGetRootElement(doc) : NULL;
    xmlNode *err = root ? xml_find(root, "Error") : NULL;
    if (status >= 200 && status < 300 && root && !err) {
        x->last_code[0] = '\0';
        *ret_doc = doc;
        doc = NULL;
        r = 0;
        goto out;
    }
    if (err) {
        char code[96], msg[512];
        xml_text(xml_child(err, "Code"), code, sizeof(code));
        xml_text(xml_child(err, "Message"), msg, sizeof(msg));
        snprintf(x->last_code, sizeof(x->last_code), "%s", code[0] ? code : "Unknown");
        r = code_errno(code, status);
        x->refused |= r == -EACCES && !x->optional; /* a permission we do without */
        aws_log(p, x->optional ? ST_LOG_INFO
                   : r == -EBUSY || r == -EAGAIN ? ST_LOG_WARN : ST_LOG_ERR,
                "%s refused: %s: %s (HTTP %ld)", action, x->last_code, msg, status);
        goto out;
    }
    snprintf(x->last_code, sizeof(x->last_code), "HTTP %ld", status);
    r = status == 429 || status >= 500 ? -EBUSY : -EBADMSG;
    aws_log(p, x->optional ? ST_LOG_INFO : r == -EBUSY ? ST_LOG_WARN : ST_LOG_ERR,
            "%s: %s answered HTTP %ld with %s", action, x->endpoint, status,
            rep.len ? "a body that is not EC2 XML" : "no body");
out:
    if (doc)
        xmlFreeDoc(doc);
    curl_slist_free_all(h);
    curl_easy_reset(c); /* drops the borrowed credentials and body */
    st_sb_done(&rep);
    return r;
}

/* One EC2 call: in a dry run, shows it and returns 0 with *ret_doc NULL; else POSTs it,
 * retrying throttling and 5xx with exponential backoff. */
static int aws_call(struct cloud_provider *p, struct aws_ctx *x, const char *action,
                    struct aws_query *q, xmlDoc **ret_doc) {
    *ret_doc = NULL;
    if (q->body.fail || q->shown.fail)
        return -ENOMEM;
    if (x->dry_run) {
        struct st_sbuf t = {.max = 1u << 20};
        st_sb_str(&t, "POST ");
        st_sb_str(&t, x->endpoint);
        st_sb_str(&t, " ");
        st_sb_str(&t, q->shown.p);
        if (q->user_data_shown) {
            st_sb_str(&t, "\n");
            for (const char *l = q->user_data_shown; *l;) {
                const char *e = strchr(l, '\n');
                size_t n = e ? (size_t)(e - l) : strlen(l);
                st_sb_str(&t, "  | ");
                st_sb_add(&t, l, n);
                if (e && e[1])
                    st_sb_str(&t, "\n");
                l += n + (e ? 1 : 0);
            }
        }
        if (t.fail) {
            st_sb_done(&t);
            return -ENOMEM;
        }
        x->dry_run(x->dry_run_userdata, t.p);
        st_sb_done(&t);
        return 0;
    }
    int r = -EIO;
    double wait = 0.25;
    for (int i = 0; i < AWS_TRIES; i++) {
        r = aws_post_once(p, x, action, q, ret_doc);
        if (r != -EBUSY)
            return r;
        if (i + 1 < AWS_TRIES) {
            sleep_s(wait);
            wait *= 2;
        }
    }
    return r;
}

/* ---- instances in answers ---------------------------------------------------------------- */

struct ec2_inst {
    char id[CLOUD_NAME_MAX];
    char state[32];
    char zone[CLOUD_NAME_MAX];
};

typedef int inst_fn(void *userdata, const struct ec2_inst *in);

/* Calls fn for every instancesSet/item in an answer (RunInstances, DescribeInstances). */
static int each_instance(xmlNode *n, inst_fn *fn, void *userdata) {
    for (; n; n = n->next) {
        if (xml_is(n, "instancesSet")) {
            for (xmlNode *it = n->children; it; it = it->next) {
                if (!xml_is(it, "item"))
                    continue;
                struct ec2_inst e;
                xml_text(xml_child(it, "instanceId"), e.id, sizeof(e.id));
                xml_text(xml_child(xml_child(it, "instanceState"), "name"), e.state,
                         sizeof(e.state));
                xml_text(xml_child(xml_child(it, "placement"), "availabilityZone"), e.zone,
                         sizeof(e.zone));
                if (!e.id[0])
                    return -EBADMSG;
                TRY(fn(userdata, &e));
            }
            continue;
        }
        TRY(each_instance(n->children, fn, userdata));
    }
    return 0;
}

static bool state_alive(const char *s) {
    return !strcmp(s, "pending") || !strcmp(s, "running");
}

/* The job's instances in any state but terminated (DescribeInstances by tag). */
static int describe_tagged(struct cloud_provider *p, struct aws_ctx *x, const char *tag,
                           const char *value, inst_fn *fn, void *userdata) {
    struct aws_query q;
    xmlDoc *doc = NULL;
    char key[96];
    int r;
    q_init(&q, "DescribeInstances");
    snprintf(key, sizeof(key), "tag:%s", tag);
    q_param(&q, "Filter.1.Name", key);
    q_param(&q, "Filter.1.Value.1", value);
    q_param(&q, "Filter.2.Name", "instance-state-name");
    static const char *const states[] = {"pending", "running", "shutting-down", "stopping",
                                         "stopped"};
    for (size_t i = 0; i < ST_ARRAY_SIZE(states); i++)
        q_parami(&q, "Filter.2.Value.", (int)i + 1, states[i]);
    q_param(&q, "MaxResults", "1000");
    TRY_GOTO(aws_call(p, x, "DescribeInstances", &q, &doc), r, out);
    if (doc)
        r = each_instance(xmlDocGetRootElement(doc), fn, userdata);
    if (r == -EBADMSG)
        aws_log(p, ST_LOG_ERR, "DescribeInstances: an instance without instanceId");
out:
    if (doc)
        xmlFreeDoc(doc);
    q_done(&q);
    return r;
}

/* TerminateInstances for up to 1000 ids. */
static int terminate_ids(struct cloud_provider *p, struct aws_ctx *x, const char *const *ids,
                         size_t n) {
    if (n == 0)
        return 0;
    struct aws_query q;
    xmlDoc *doc = NULL;
    q_init(&q, "TerminateInstances");
    for (size_t i = 0; i < n && i < 1000; i++)
        q_parami(&q, "InstanceId.", (int)i + 1, ids[i]);
    int r = aws_call(p, x, "TerminateInstances", &q, &doc);
    if (doc)
        xmlFreeDoc(doc);
    q_done(&q);
    return r;
}

/* ---- sweeping a job's instances (down, and a provider that ends) -------------------------- */

struct sweep {
    char (*ids)[CLOUD_NAME_MAX];
    size_t n, cap;
};

static int sweep_add(void *userdata, const struct ec2_inst *in) {
    struct sweep *s = userdata;
    if (!strcmp(in->state, "shutting-down"))
        return 0; /* already going */
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        if (nc > CLOUD_MAX_INSTANCES)
            return -E2BIG;
        void *np = st_realloc(s->ids, nc * sizeof(*s->ids));
        if (!np)
            return -ENOMEM;
        s->ids = np;
        s->cap = nc;
    }
    snprintf(s->ids[s->n++], CLOUD_NAME_MAX, "%s", in->id);
    return 0;
}

/* Terminates every instance carrying tag=value. Returns how many were asked to end. */
static int sweep_tagged(struct cloud_provider *p, struct aws_ctx *x, const char *tag,
                        const char *value) {
    struct sweep s = {0};
    const char **ptrs = NULL;
    int r;
    TRY_GOTO(describe_tagged(p, x, tag, value, sweep_add, &s), r, out);
    ptrs = st_calloc(s.n + 1, sizeof(*ptrs));
    if (!ptrs)
        TRY_GOTO(-ENOMEM, r, out);
    for (size_t i = 0; i < s.n; i++)
        ptrs[i] = s.ids[i];
    for (size_t i = 0; i < s.n; i += 1000)
        TRY_GOTO(terminate_ids(p, x, ptrs + i, ST_MIN(s.n - i, (size_t)1000)), r, out);
    r = (int)s.n;
out:
    st_free(ptrs);
    st_free(s.ids);
    return r;
}

/* See cloud.h. */
int cloud_aws_down(const struct cloud_config *cfg, const char *job_name) {
    if (!cfg || !job_name || !*job_name)
        return -EINVAL;
    struct aws_ctx *x = st_calloc(1, sizeof(*x));
    if (!x)
        return -ENOMEM;
    int r = ctx_init(NULL, x, cfg->nzones > 0 ? cfg->zones[0] : NULL, cfg->dry_run,
                     cfg->dry_run_userdata);
    if (r == 0)
        r = sweep_tagged(NULL, x, "spottrain:job", job_name);
    ctx_done(x);
    st_free(x);
    return r;
}

/* ---- the provider ------------------------------------------------------------------------- */

static struct aws_inst *inst_find(struct aws_state *s, const char *id) {
    for (size_t i = 0; i < s->ninsts; i++)
        if (s->insts[i].used && !strcmp(s->insts[i].pub.name, id))
            return &s->insts[i];
    return NULL;
}

static int alive_count(const struct aws_state *s) {
    int n = 0;
    for (size_t i = 0; i < s->ninsts; i++)
        n += s->insts[i].used && !s->insts[i].dead;
    return n;
}

/* The live price of zone, or the configured price when none is known. */
static double zone_price(const struct aws_state *s, const char *zone) {
    for (int i = 0; i < s->nprices; i++)
        if (!strcmp(s->price_zone[i], zone))
            return s->zone_price[i];
    return s->price;
}

/* Records a granted or adopted instance and says so. */
static int inst_add(struct cloud_provider *p, struct aws_state *s, const struct ec2_inst *e,
                    double now, const char *how) {
    size_t slot = 0;
    while (slot < s->ninsts && s->insts[slot].used)
        slot++;
    if (slot == CLOUD_MAX_INSTANCES)
        return -E2BIG;
    struct aws_inst *in = &s->insts[slot];
    memset(in, 0, sizeof(*in));
    in->used = true;
    snprintf(in->pub.name, sizeof(in->pub.name), "%s", e->id);
    snprintf(in->pub.zone, sizeof(in->pub.zone), "%s", e->zone);
    snprintf(in->pub.node, sizeof(in->pub.node), "%s", e->zone[0] ? e->zone : "ec2");
    in->pub.state = CLOUD_INSTANCE_RUNNING;
    in->pub.started = now;
    in->pub.price_per_hour = zone_price(s, in->pub.zone);
    if (slot == s->ninsts)
        s->ninsts++;
    aws_log(p, ST_LOG_INFO, "%s %s in '%s'", how, e->id, e->zone);
    struct cloud_signal sig = {.kind = CLOUD_SIG_GRANTED, .at = now};
    memcpy(sig.instance, in->pub.name, sizeof(sig.instance));
    memcpy(sig.node, in->pub.node, sizeof(sig.node));
    return cloud__emit(p, &sig);
}

static int inst_lost(struct cloud_provider *p, struct aws_inst *in, enum cloud_loss_reason why,
                     double now) {
    in->dead = true;
    in->pub.state = CLOUD_INSTANCE_DEAD;
    aws_log(p, ST_LOG_INFO, "%s in '%s' is gone (%s)", in->pub.name, in->pub.zone,
            cloud_loss_reason_name(why));
    struct cloud_signal sig = {.kind = CLOUD_SIG_LOST, .at = now, .reason = why};
    memcpy(sig.instance, in->pub.name, sizeof(sig.instance));
    memcpy(sig.node, in->pub.node, sizeof(sig.node));
    return cloud__emit(p, &sig);
}

struct grant_ctx {
    struct cloud_provider *p;
    struct aws_state *s;
    double now;
    int n;
    const char *how;
};

static int on_granted(void *userdata, const struct ec2_inst *e) {
    struct grant_ctx *g = userdata;
    if (inst_find(g->s, e->id))
        return 0;
    TRY(inst_add(g->p, g->s, e, g->now, g->how));
    g->n++;
    return 0;
}

/* RunInstances for k instances in one zone ("" = EC2 chooses). Returns how many were granted
 * or negative errno (-EAGAIN: no capacity there). */
static int run_instances(struct cloud_provider *p, struct aws_state *s, const char *zone, int k,
                         bool spot, double now) {
    struct aws_query q;
    xmlDoc *doc = NULL;
    char num[16];
    int r;
    q_init(&q, "RunInstances");
    q_param(&q, "ImageId", s->image);
    q_param(&q, "InstanceType", s->instance_type);
    /* All or nothing per zone: a zone that cannot hold its whole share refuses it, and the
     * share moves on to the next zone (MinCount < MaxCount would take a part silently). */
    snprintf(num, sizeof(num), "%d", k);
    q_param(&q, "MinCount", num);
    q_param(&q, "MaxCount", num);
    if (zone[0])
        q_param(&q, "Placement.AvailabilityZone", zone);
    if (spot) {
        q_param(&q, "InstanceMarketOptions.MarketType", "spot");
        q_param(&q, "InstanceMarketOptions.SpotOptions.SpotInstanceType", "one-time");
        q_param(&q, "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior",
                "terminate");
    }
    q_param(&q, "InstanceInitiatedShutdownBehavior", "terminate");
    q_param(&q, "TagSpecification.1.ResourceType", "instance");
    q_param(&q, "TagSpecification.1.Tag.1.Key", "spottrain:job");
    q_param(&q, "TagSpecification.1.Tag.1.Value", s->job_name);
    q_param(&q, "TagSpecification.1.Tag.2.Key", "spottrain:job-id");
    q_param(&q, "TagSpecification.1.Tag.2.Value", s->job_id);
    /* The user-data: base64 in the body; a dry run shows it decoded, token redacted. */
    struct st_sbuf b64 = {.max = 2 * AWS_USER_DATA_MAX};
    st_sb_base64(&b64, s->user_data, strlen(s->user_data), false);
    st_sb_str(&q.body, "&UserData=");
    if (b64.fail)
        q.body.fail = true;
    else
        st_sb_escape(&q.body, b64.p); /* '+', '/' and '=' are not plain in a form body */
    st_sb_done(&b64);
    st_sb_str(&q.shown, "&UserData=(decoded below)");
    q.user_data_shown = s->user_data_shown;
    TRY_GOTO(aws_call(p, &s->ctx, "RunInstances", &q, &doc), r, out);
    r = 0;
    if (doc) {
        struct grant_ctx g = {p, s, now, 0, spot ? "granted spot" : "granted on-demand"};
        r = each_instance(xmlDocGetRootElement(doc), on_granted, &g);
        if (r == 0)
            r = g.n;
    }
out:
    if (doc)
        xmlFreeDoc(doc);
    q_done(&q);
    return r;
}

/* Asks for what is missing below the target, spread over the zones from the rotation point;
 * a zone without capacity passes its share to the next, and with fallback on-demand is asked
 * when every zone refused spot. Returns how many were granted or negative errno for a hard
 * error (credentials, a bad request). */
static int aws_fill(struct cloud_provider *p, struct aws_state *s, double now) {
    int want = s->target - alive_count(s);
    if (want <= 0)
        return 0;
    int nz = s->nzones > 0 ? s->nzones : 1, granted = 0;
    for (int pass = 0; pass < 2 && want > 0; pass++) {
        bool spot = pass == 0 && s->spot;
        if (pass == 1) {
            if (!s->spot || !s->fallback)
                break;
            aws_log(p, ST_LOG_WARN, "spot refused for %d instance(s); asking on-demand", want);
        }
        /* Each zone gets an even share of what is still wanted; a zone without capacity
         * leaves its share to the zones after it. */
        for (int i = 0; i < nz && want > 0; i++) {
            int zi = (s->zone_next + i) % nz;
            const char *zone = s->nzones > 0 ? s->zones[zi] : "";
            int share = (want + (nz - i) - 1) / (nz - i);
            int r = run_instances(p, s, zone, share, spot, now);
            if (r == -EAGAIN) {
                aws_log(p, ST_LOG_WARN, "no %s capacity in '%s' (%s); trying %s",
                        spot ? "spot" : "on-demand", zone[0] ? zone : "any zone",
                        s->ctx.last_code, i + 1 < nz ? "the next zone" : "later");
                continue;
            }
            if (r < 0)
                return r;
            if (s->ctx.dry_run)
                r = share; /* nothing granted, but the request was shown */
            granted += r;
            want -= r;
        }
    }
    s->zone_next = (s->zone_next + 1) % nz; /* the next spread starts one zone further */
    if (want > 0)
        aws_log(p, ST_LOG_WARN, "%d instance(s) not granted yet; asking again in %.0f s", want,
                s->interval);
    return granted;
}

struct reconcile_ctx {
    struct cloud_provider *p;
    struct aws_state *s;
    double now;
    bool *seen; /* per insts slot */
    int r;
};

static int on_described(void *userdata, const struct ec2_inst *e) {
    struct reconcile_ctx *rc = userdata;
    struct aws_inst *in = inst_find(rc->s, e->id);
    if (in) {
        rc->seen[in - rc->s->insts] = true;
        if (!in->dead && !state_alive(e->state))
            TRY(inst_lost(rc->p, in, CLOUD_LOSS_UNANNOUNCED, rc->now));
        return 0;
    }
    if (!state_alive(e->state))
        return 0;
    /* Ours by tag but not known: started by an earlier run of this job. Adopt it. */
    TRY(inst_add(rc->p, rc->s, e, rc->now, "adopted"));
    return 0;
}

/* DescribeInstances by the job-id tag, against what we believe. */
static int aws_reconcile(struct cloud_provider *p, struct aws_state *s, double now) {
    bool *seen = st_calloc(CLOUD_MAX_INSTANCES, sizeof(*seen));
    if (!seen)
        return -ENOMEM;
    size_t known = s->ninsts;
    struct reconcile_ctx rc = {p, s, now, seen, 0};
    int r = describe_tagged(p, &s->ctx, "spottrain:job-id", s->job_id, on_described, &rc);
    if (r == 0) {
        /* Not listed at all (terminated long enough ago to be filtered out): gone. */
        for (size_t i = 0; i < known && r == 0; i++) {
            struct aws_inst *in = &s->insts[i];
            if (in->used && !in->dead && !seen[i])
                r = inst_lost(p, in, CLOUD_LOSS_UNANNOUNCED, now);
        }
    }
    st_free(seen);
    return r;
}

/* What init made, released by its failure path and by done(): the user-data holds the
 * join token, so it is wiped before it is freed. */
static void aws_free(struct aws_state *s) {
    ctx_done(&s->ctx);
    if (s->user_data)
        wipe(s->user_data, strlen(s->user_data));
    st_free(s->user_data);
    st_free(s->user_data_shown);
    st_free(s->insts);
}

static int aws_init(struct cloud_provider *p, void *state, const struct cloud_config *cfg) {
    struct aws_state *s = state;
    const struct st_spec *sp = cfg->spec;
    const char *coordinator = sp && sp->coordinator.advertise[0] ? sp->coordinator.advertise
                                                                  : cfg->coordinator;
    int r;
    snprintf(s->image, sizeof(s->image), "%s", cfg->image[0] ? cfg->image
                                                 : sp ? sp->fleet.image : "");
    if (!s->image[0]) {
        aws_log(p, ST_LOG_ERR, "fleet.image (the AMI id instances boot) is not set");
        return -EINVAL;
    }
    if (!cfg->job_name[0] || !cfg->job_id[0] || !coordinator[0] ||
        cfg->max_instances > CLOUD_MAX_INSTANCES || cfg->nzones > CLOUD_MAX_ZONES) {
        aws_log(p, ST_LOG_ERR, "invalid configuration (job name, job id, coordinator address)");
        return -EINVAL;
    }
    snprintf(s->instance_type, sizeof(s->instance_type), "%s", cfg->instance_type);
    /* The sim's default zone means "none given": EC2 then picks. */
    s->nzones = sp && sp->fleet.nzones == 0 ? 0 : cfg->nzones;
    memcpy(s->zones, cfg->zones, sizeof(s->zones));
    s->spot = cfg->spot;
    s->fallback = cfg->on_demand_fallback;
    s->price = cfg->price_per_hour;
    s->interval = cfg->reconcile_interval > 0 ? cfg->reconcile_interval : 5.0;
    s->target = cfg->max_instances > 0 ? cfg->max_instances : 1;
    snprintf(s->job_name, sizeof(s->job_name), "%s", cfg->job_name);
    snprintf(s->job_id, sizeof(s->job_id), "%s", cfg->job_id);
    s->insts = st_calloc(CLOUD_MAX_INSTANCES, sizeof(*s->insts));
    if (!s->insts)
        return -ENOMEM;
    /* The user-data script (docs/aws.md), and the same with the token redacted. */
    TRY_GOTO(cloud__bootstrap_script(cfg, coordinator, "aws", false, AWS_USER_DATA_MAX,
                                     AWS_SPEC_EMBED_MAX, &s->user_data), r, out);
    TRY_GOTO(cloud__bootstrap_script(cfg, coordinator, "aws", true, AWS_USER_DATA_MAX,
                                     AWS_SPEC_EMBED_MAX, &s->user_data_shown), r, out);
    TRY_GOTO(ctx_init(p, &s->ctx, s->nzones > 0 ? s->zones[0] : NULL, cfg->dry_run,
                      cfg->dry_run_userdata), r, out);
    aws_log(p, ST_LOG_INFO, "region %s, endpoint %s, %d x %s from %s%s", s->ctx.region,
            s->ctx.endpoint, s->target, s->instance_type, s->image,
            s->spot ? " (spot)" : " (on-demand)");
    return 0;
out:
    if (r == -E2BIG)
        aws_log(p, ST_LOG_ERR, "the bootstrap script exceeds EC2's %d bytes of user-data",
                AWS_USER_DATA_MAX);
    aws_free(s);
    return r;
}

static void aws_done(struct cloud_provider *p, void *state) {
    struct aws_state *s = state;
    if (!s->ctx.dry_run) {
        int n = alive_count(s);
        if (s->ctx.refused && n == 0) {
            /* Refused credentials created nothing, and a sweep would only be refused again. */
        } else if (cloud_provider_detached(p)) {
            aws_log(p, ST_LOG_NOTICE, "leaving %d instance(s) of job '%s' running for a restart "
                    "to adopt (`spottrain down` ends them)", n, s->job_name);
        } else {
            /* Everything tagged with the job id, known to us or not (a RunInstances whose
             * answer was lost still tagged its instances). */
            int r = sweep_tagged(p, &s->ctx, "spottrain:job-id", s->job_id);
            if (r < 0)
                aws_log(p, ST_LOG_ERR, "could not terminate the instances of job '%s' (%s): "
                        "run `spottrain down` for it", s->job_name, st_strerror(r));
            else
                aws_log(p, ST_LOG_INFO, "terminated %d instance(s) of job '%s'", r,
                        s->job_name);
        }
    }
    aws_free(s);
}

/* Refreshes the live spot prices of the instance type (DescribeSpotPriceHistory from now:
 * EC2 answers the price in force in each zone) and re-prices the instances. An endpoint that
 * does not offer the call (an error answer) leaves the configured price in place: it is a
 * signal we use where we get it, never a reason to stop. */
static void spot_prices(struct cloud_provider *p, struct aws_state *s) {
    struct aws_query q;
    xmlDoc *doc = NULL;
    char now[32];
    time_t t = time(NULL);
    struct tm tm;
    if (!s->spot || s->price_off || s->ctx.dry_run)
        return;
    gmtime_r(&t, &tm);
    strftime(now, sizeof(now), "%Y-%m-%dT%H:%M:%SZ", &tm);
    q_init(&q, "DescribeSpotPriceHistory");
    q_param(&q, "InstanceType.1", s->instance_type);
    q_param(&q, "ProductDescription.1", "Linux/UNIX");
    q_param(&q, "StartTime", now);
    for (int z = 0; z < s->nzones; z++) {
        char k[64];
        snprintf(k, sizeof(k), "Filter.1.Value.%d", z + 1);
        if (z == 0)
            q_param(&q, "Filter.1.Name", "availability-zone");
        q_param(&q, k, s->zones[z]);
    }
    s->ctx.optional = true;
    int r = aws_call(p, &s->ctx, "DescribeSpotPriceHistory", &q, &doc);
    s->ctx.optional = false;
    q_done(&q);
    if (r < 0) {
        if (r != -ENOMEM) {
            s->price_off = true;
            aws_log(p, ST_LOG_NOTICE, "spot price history not offered by %s (%s): using the "
                    "configured $%.4f/h", s->ctx.endpoint, st_strerror(r), s->price);
        }
        return;
    }
    bool first = s->nprices == 0;
    xmlNode *set = xml_find(xmlDocGetRootElement(doc), "spotPriceHistorySet");
    for (xmlNode *it = set ? set->children : NULL; it; it = it->next) {
        char zone[CLOUD_NAME_MAX], price[32], when[32];
        if (!xml_is(it, "item"))
            continue;
        xml_text(xml_child(it, "availabilityZone"), zone, sizeof(zone));
        xml_text(xml_child(it, "spotPrice"), price, sizeof(price));
        xml_text(xml_child(it, "timestamp"), when, sizeof(when));
        char *end;
        double v = strtod(price, &end);
        if (!zone[0] || end == price || *end || !(v >= 0 && v < 1e6))
            continue;
        int i = 0;
        while (i < s->nprices && strcmp(s->price_zone[i], zone))
            i++;
        if (i == s->nprices) {
            if (i == CLOUD_MAX_ZONES)
                continue;
            s->nprices++;
            snprintf(s->price_zone[i], sizeof(s->price_zone[i]), "%s", zone);
            s->price_when[i][0] = '\0';
        } else if (strcmp(when, s->price_when[i]) < 0) {
            continue; /* an older entry of a zone we have */
        }
        snprintf(s->price_when[i], sizeof(s->price_when[i]), "%s", when);
        s->zone_price[i] = v;
    }
    xmlFreeDoc(doc);
    for (size_t i = 0; i < s->ninsts; i++)
        if (s->insts[i].used && !s->insts[i].dead)
            s->insts[i].pub.price_per_hour = zone_price(s, s->insts[i].pub.zone);
    for (int i = 0; i < s->nprices; i++)
        aws_log(p, first ? ST_LOG_NOTICE : ST_LOG_INFO, "spot price of %s in %s: $%.6g/h",
                s->instance_type, s->price_zone[i], s->zone_price[i]);
}

/* GetSpotPlacementScores as a prior over fleet.zones: the zones are reordered best score first
 * (stable: equal scores keep the spec's order), so the first spread asks most where EC2 says
 * spot capacity is likeliest. The answer names zone ids (use1-az4), which DescribeAvailability
 * Zones maps to the names the spec uses. One try, no retry: an endpoint that does not offer it
 * (moto answers 500) leaves the order as it is and says so once. */
static void placement_scores(struct cloud_provider *p, struct aws_state *s) {
    struct aws_query q;
    xmlDoc *doc = NULL, *zdoc = NULL;
    char tgt[16];
    int score[CLOUD_MAX_ZONES] = {0};
    if (!s->spot || s->ctx.dry_run || s->nzones < 2)
        return; /* a prior only matters when there is a choice */
    snprintf(tgt, sizeof(tgt), "%d", s->target);
    q_init(&q, "GetSpotPlacementScores");
    q_param(&q, "InstanceTypes.1", s->instance_type);
    q_param(&q, "TargetCapacity", tgt);
    q_param(&q, "SingleAvailabilityZone", "true");
    q_param(&q, "RegionNames.1", s->ctx.region);
    s->ctx.optional = true;
    int r = q.body.fail ? -ENOMEM : aws_post_once(p, &s->ctx, "GetSpotPlacementScores", &q, &doc);
    q_done(&q);
    if (r >= 0) {
        q_init(&q, "DescribeAvailabilityZones");
        r = q.body.fail ? -ENOMEM : aws_post_once(p, &s->ctx, "DescribeAvailabilityZones", &q,
                                                    &zdoc);
        q_done(&q);
    }
    s->ctx.optional = false;
    if (r < 0) {
        aws_log(p, ST_LOG_NOTICE, "spot placement scores not offered by %s (%s): zones keep "
                "the spec's order", s->ctx.endpoint, s->ctx.last_code[0] ? s->ctx.last_code
                                                                         : st_strerror(r));
        goto out;
    }
    xmlNode *zset = xml_find(xmlDocGetRootElement(zdoc), "availabilityZoneInfo");
    xmlNode *set = xml_find(xmlDocGetRootElement(doc), "spotPlacementScoreSet");
    int scored = 0;
    for (xmlNode *it = set ? set->children : NULL; it; it = it->next) {
        char id[CLOUD_NAME_MAX], sc[16], zid[CLOUD_NAME_MAX], zname[CLOUD_NAME_MAX];
        if (!xml_is(it, "item"))
            continue;
        xml_text(xml_child(it, "availabilityZoneId"), id, sizeof(id));
        xml_text(xml_child(it, "score"), sc, sizeof(sc));
        int v = atoi(sc);
        for (xmlNode *z = zset ? zset->children : NULL; z && id[0]; z = z->next) {
            if (!xml_is(z, "item"))
                continue;
            xml_text(xml_child(z, "zoneId"), zid, sizeof(zid));
            xml_text(xml_child(z, "zoneName"), zname, sizeof(zname));
            if (strcmp(zid, id))
                continue;
            for (int i = 0; i < s->nzones; i++)
                if (!strcmp(s->zones[i], zname) && v >= 1 && v <= 10) {
                    score[i] = v;
                    scored++;
                }
        }
    }
    if (!scored) {
        aws_log(p, ST_LOG_NOTICE, "spot placement scores name none of fleet.zones: zones keep "
                "the spec's order");
        goto out;
    }
    for (int i = 1; i < s->nzones; i++) /* insertion sort: stable, and at most a few zones */
        for (int j = i; j > 0 && score[j] > score[j - 1]; j--) {
            char t[CLOUD_NAME_MAX];
            int ts = score[j];
            memcpy(t, s->zones[j], sizeof(t));
            memcpy(s->zones[j], s->zones[j - 1], sizeof(t));
            memcpy(s->zones[j - 1], t, sizeof(t));
            score[j] = score[j - 1];
            score[j - 1] = ts;
        }
    char line[512];
    size_t at = 0;
    for (int i = 0; i < s->nzones && at < sizeof(line); i++)
        at += (size_t)snprintf(line + at, sizeof(line) - at, "%s%s (%d)", i ? ", " : "",
                               s->zones[i], score[i]);
    aws_log(p, ST_LOG_NOTICE, "zones by spot placement score: %s", line);
out:
    if (doc)
        xmlFreeDoc(doc);
    if (zdoc)
        xmlFreeDoc(zdoc);
}

static int aws_start(struct cloud_provider *p, void *state, double now) {
    struct aws_state *s = state;
    TRY(aws_reconcile(p, s, now)); /* adopt what an earlier run of this job left */
    /* After the first call, so an endpoint that answers nothing right fails there, once. */
    spot_prices(p, s);
    s->next_price = now + AWS_PRICE_EVERY;
    placement_scores(p, s);
    int r = aws_fill(p, s, now);
    if (r < 0)
        return r;
    s->next_reconcile = now + s->interval;
    s->next_fill = now + s->interval;
    return 0;
}

static int aws_poll(struct cloud_provider *p, void *state, double now) {
    struct aws_state *s = state;
    if (now >= s->next_price) {
        spot_prices(p, s);
        s->next_price = now + AWS_PRICE_EVERY;
    }
    if (now >= s->next_reconcile) {
        int r = aws_reconcile(p, s, now);
        if (r < 0 && r != -ENOMEM && r != -ENOBUFS)
            aws_log(p, ST_LOG_WARN, "reconcile failed (%s), ignoring until the next one",
                    st_strerror(r));
        else if (r < 0)
            return r;
        s->next_reconcile = now + s->interval;
    }
    if (now >= s->next_fill && alive_count(s) < s->target) {
        int r = aws_fill(p, s, now);
        if (r < 0)
            aws_log(p, ST_LOG_WARN, "asking for instances failed (%s), ignoring until %.0f s "
                    "from now", st_strerror(r), s->interval);
        s->next_fill = now + s->interval;
    }
    return 0;
}

static int aws_acquire(struct cloud_provider *p, void *state, int n, double now) {
    struct aws_state *s = state;
    s->target = ST_MIN(s->target + n, CLOUD_MAX_INSTANCES);
    return aws_fill(p, s, now);
}

static int aws_release(struct cloud_provider *p, void *state, const char *instance, double now) {
    struct aws_state *s = state;
    struct aws_inst *in = inst_find(s, instance);
    if (!in || in->dead)
        return -ENOENT;
    const char *ids[1] = {in->pub.name};
    int r = terminate_ids(p, &s->ctx, ids, 1);
    /* Forgotten either way: a failed terminate is retried by the sweep in done(). */
    s->target = ST_MAX(0, s->target - 1);
    TRY(inst_lost(p, in, CLOUD_LOSS_RELEASED, now));
    return r;
}

static int aws_instances(struct cloud_provider *p, void *state, struct cloud_instance *out,
                         size_t max, size_t *ret_n) {
    (void)p;
    struct aws_state *s = state;
    size_t n = 0;
    for (size_t i = 0; i < s->ninsts; i++) {
        if (!s->insts[i].used || s->insts[i].dead)
            continue;
        if (n < max)
            out[n] = s->insts[i].pub;
        n++;
    }
    *ret_n = n;
    return 0;
}

/* The fleet's live $/instance-hour: the mean over running instances of their zone's price,
 * else the cheapest known zone; -ENODATA when no price was ever answered. */
static int aws_price(struct cloud_provider *p, void *state, double *ret) {
    (void)p;
    struct aws_state *s = state;
    double sum = 0, lo = -1;
    int n = 0;
    if (s->nprices == 0)
        return -ENODATA;
    for (size_t i = 0; i < s->ninsts; i++)
        if (s->insts[i].used && !s->insts[i].dead) {
            sum += s->insts[i].pub.price_per_hour;
            n++;
        }
    for (int i = 0; i < s->nprices; i++)
        lo = lo < 0 || s->zone_price[i] < lo ? s->zone_price[i] : lo;
    *ret = n ? sum / n : lo;
    return 0;
}

static double aws_next_deadline(struct cloud_provider *p, void *state, double now) {
    (void)p;
    struct aws_state *s = state;
    (void)now;
    return ST_MIN(s->next_reconcile, s->next_fill); /* always something: a cloud keeps going */
}

const struct cloud_provider_ops cloud__aws_ops = {
    .name = "aws",
    .state_size = sizeof(struct aws_state),
    .init = aws_init,
    .done = aws_done,
    .start = aws_start,
    .poll = aws_poll,
    .acquire = aws_acquire,
    .release = aws_release,
    .instances = aws_instances,
    .next_deadline = aws_next_deadline,
    .price = aws_price,
};
