/* ckpt.c: the checkpoint format — per-layer shard files and the manifest that commits them.
 * The byte layout is documented in docs/checkpoint-format.md; keep the two in step.
 *
 * The one idea: every file is self-describing and self-checking (magic, version, sizes,
 * XXH64 over header + payload), each layer file is written atomically by whoever owns that
 * layer, and manifest.json — written last, by atomic rename, with every layer file's size and
 * checksum — is the commit point. A directory without a manifest is torn; a layer file that
 * does not match its manifest entry is corrupt. Readers say which check failed. */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h" /* TRY, TRY_GOTO */
#include "migrate-internal.h"
#include "migrate-store.h" /* mig__store_for: s3://, gs://, az:// checkpoints */

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint payloads are little-endian float32; add byte swapping for this host"
#endif

#define LAYER_MAGIC "SPOTCKPT"
#define TRAILER_MAGIC "SPOTEND\0"
#define FORMAT_VERSION 1u
#define FIXED_HDR 40        /* bytes before the tensor table */
#define ALIGN 64            /* header end and tensor offsets */
#define TRAILER 16          /* xxh64 + magic */
#define MAX_HDR (64u << 20) /* sanity bound on a header */
#define MAX_TENSORS (1u << 20)
#define MANIFEST "manifest.json"
#define MANIFEST_MAX (64u << 20)
#define FORMAT_NAME "spottrain-checkpoint"

static size_t align_up(size_t v) {
    return (v + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

static void put32(unsigned char *p, uint32_t v) {
    memcpy(p, &v, 4);
}
static void put64(unsigned char *p, uint64_t v) {
    memcpy(p, &v, 8);
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Fills err (if any) with the file and the reason, returns r. */
static int ckerr(struct st_error *err, int r, const char *path, const char *fmt, ...)
    ST_PRINTF(4, 5);
static int ckerr(struct st_error *err, int r, const char *path, const char *fmt, ...) {
    if (err) {
        va_list ap;
        memset(err, 0, sizeof(*err));
        snprintf(err->file, sizeof(err->file), "%s", path ? path : "");
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof(err->message), fmt, ap);
        va_end(ap);
    }
    return r;
}

static int layer_path(const char *dir, int layer, char *buf, size_t size) {
    int n = snprintf(buf, size, "%s/layer-%04d.bin", dir, layer);
    return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int r = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return r;
}

/* mig_ckpt_write_fail_at(): layer writes counted since it was armed, and the one that fails.
 * Atomic: the runner writes from a background thread. */
static long write_fail_at, write_count;

/* See migrate.h. */
void mig_ckpt_write_fail_at(long n) {
    __atomic_store_n(&write_count, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&write_fail_at, n, __ATOMIC_SEQ_CST);
}

static bool write_should_fail(void) {
    long at = __atomic_load_n(&write_fail_at, __ATOMIC_SEQ_CST);
    return at > 0 && __atomic_add_fetch(&write_count, 1, __ATOMIC_SEQ_CST) == at;
}

static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, ST_MIN(len, (size_t)1 << 30));
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* ---- parsed layer header ------------------------------------------------------------ */

struct entry {
    uint32_t kind;
    uint32_t name_len;
    uint64_t count;
    uint64_t offset;      /* bytes from the payload start */
    size_t name_at;       /* byte offset of the name in the header */
};

struct layer_hdr {
    uint32_t layer;
    uint32_t ntensors;
    uint64_t header_bytes;
    uint64_t payload_bytes;
    uint64_t elements;
    struct entry *e; /* ntensors entries, caller frees with st_free */
};

/* Checks the fixed part of a header (first FIXED_HDR bytes). */
static int check_fixed(const unsigned char *b, size_t have, uint64_t file_size, const char *path,
                       struct layer_hdr *h, struct st_error *err) {
    if (have < FIXED_HDR || memcmp(b, LAYER_MAGIC, 8) != 0)
        return ckerr(err, -EBADMSG, path, "bad magic: not a spottrain checkpoint layer file");
    uint32_t v = get32(b + 8);
    if (v != FORMAT_VERSION)
        return ckerr(err, -EBADMSG, path, "unsupported version %" PRIu32 " (this build reads %u)",
                     v, FORMAT_VERSION);
    h->layer = get32(b + 12);
    h->ntensors = get32(b + 16);
    h->header_bytes = get64(b + 24);
    h->payload_bytes = get64(b + 32);
    if (h->ntensors > MAX_TENSORS || h->header_bytes < FIXED_HDR || h->header_bytes > MAX_HDR ||
        h->header_bytes % ALIGN || h->payload_bytes > UINT64_MAX / 2)
        return ckerr(err, -EBADMSG, path, "bad sizes in header (tensors %" PRIu32 ", header %"
                     PRIu64 " bytes, payload %" PRIu64 " bytes)", h->ntensors, h->header_bytes,
                     h->payload_bytes);
    uint64_t want = h->header_bytes + h->payload_bytes + TRAILER;
    if (file_size != want)
        return ckerr(err, -EBADMSG, path, "%s: file has %" PRIu64 " bytes, header says %" PRIu64,
                     file_size < want ? "truncated" : "trailing bytes", file_size, want);
    return 0;
}

/* Parses the tensor table of a complete header buffer. */
static int parse_table(const unsigned char *b, const char *path, struct layer_hdr *h,
                       struct st_error *err) {
    size_t at = FIXED_HDR;
    h->elements = 0;
    h->e = st_calloc(h->ntensors ? h->ntensors : 1, sizeof(*h->e));
    if (!h->e)
        return -ENOMEM;
    for (uint32_t i = 0; i < h->ntensors; i++) {
        struct entry *e = &h->e[i];
        if (at + 24 > h->header_bytes)
            return ckerr(err, -EBADMSG, path, "bad sizes: tensor table overruns the header");
        e->kind = get32(b + at);
        e->name_len = get32(b + at + 4);
        e->count = get64(b + at + 8);
        e->offset = get64(b + at + 16);
        e->name_at = at + 24;
        at += 24;
        if (e->kind >= ST_STATE_NKINDS)
            return ckerr(err, -EBADMSG, path, "bad tensor kind %" PRIu32 " in entry %" PRIu32,
                         e->kind, i);
        if (e->name_len == 0 || e->name_len > MIG_TENSOR_NAME_MAX ||
            at + e->name_len + 1 > h->header_bytes || b[at + e->name_len] != '\0' ||
            memchr(b + at, '\0', e->name_len))
            return ckerr(err, -EBADMSG, path, "bad tensor name in entry %" PRIu32, i);
        at += (e->name_len + 1 + 7) & ~(size_t)7;
        if (e->count > h->payload_bytes / 4 || e->offset % ALIGN ||
            e->offset > h->payload_bytes - e->count * 4)
            return ckerr(err, -EBADMSG, path, "bad sizes: tensor '%s' (%" PRIu64 " elements at %"
                         PRIu64 ") outside the payload of %" PRIu64 " bytes",
                         (const char *)b + e->name_at, e->count, e->offset, h->payload_bytes);
        h->elements += e->count;
    }
    return 0;
}

/* Checks the trailer and checksum of a whole layer file in buf (its fixed header already
 * checked into *h) and parses its tensor table into h->e. */
static int check_body(const unsigned char *buf, const char *path, struct layer_hdr *h,
                      uint64_t *ret_sum, struct st_error *err) {
    uint64_t body = h->header_bytes + h->payload_bytes;
    if (memcmp(buf + body + 8, TRAILER_MAGIC, 8) != 0)
        return ckerr(err, -EBADMSG, path, "bad trailer magic (truncated or overwritten)");
    uint64_t want = get64(buf + body), sum = mig_xxh64(buf, (size_t)body, 0);
    if (want != sum)
        return ckerr(err, -EBADMSG, path, "checksum mismatch: file says %016" PRIx64 ", contents "
                     "hash to %016" PRIx64, want, sum);
    TRY(parse_table(buf, path, h, err));
    *ret_sum = sum;
    return 0;
}

/* load_file() for an object in a store: the same checks on the object read whole. */
static int load_object(const struct mig_store_ops *st, const char *url, int layer,
                       unsigned char **ret_buf, struct layer_hdr *ret_h, uint64_t *ret_sum,
                       struct st_error *err) {
    struct layer_hdr h = {0};
    unsigned char *buf = NULL;
    size_t len = 0;
    uint64_t total = 0, sum;
    int r = st->get(url, 0, 0, SIZE_MAX - 1, &buf, &len, &total, err);
    if (r == -ENOENT)
        return ckerr(err, -ENOENT, url, "layer file missing");
    if (r < 0)
        return r;
    if (len < FIXED_HDR) {
        r = len >= 8 && memcmp(buf, LAYER_MAGIC, 8) == 0
                ? ckerr(err, -EBADMSG, url, "truncated: file has %zu bytes", len)
                : ckerr(err, -EBADMSG, url, "bad magic: not a spottrain checkpoint layer file");
        goto out;
    }
    TRY_GOTO(check_fixed(buf, len, (uint64_t)len, url, &h, err), r, out);
    if (layer >= 0 && h.layer != (uint32_t)layer) {
        r = ckerr(err, -EBADMSG, url, "holds layer %" PRIu32 ", expected %d", h.layer, layer);
        goto out;
    }
    TRY_GOTO(check_body(buf, url, &h, &sum, err), r, out);
    *ret_buf = buf;
    buf = NULL;
    *ret_h = h;
    h.e = NULL;
    if (ret_sum)
        *ret_sum = sum;
out:
    st_free(h.e);
    st_free(buf);
    return r;
}

/* Reads path whole (checking header, sizes and checksum). On success *ret_buf (caller frees
 * with st_free) holds the file and *ret_h the parsed header (h->e caller frees). */
static int load_file(const char *path, int layer, unsigned char **ret_buf, struct layer_hdr *ret_h,
                     uint64_t *ret_sum, struct st_error *err) {
    struct layer_hdr h = {0};
    unsigned char *buf = NULL;
    struct stat sb;
    int fd, r = 0;

    const struct mig_store_ops *st = mig__store_for(path);
    if (st)
        return load_object(st, path, layer, ret_buf, ret_h, ret_sum, err);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ckerr(err, -errno, path, "%s",
                     errno == ENOENT ? "layer file missing" : strerror(errno));
    if (fstat(fd, &sb) < 0) {
        r = ckerr(err, -errno, path, "%s", strerror(errno));
        goto out;
    }
    unsigned char fixed[FIXED_HDR];
    ssize_t g = pread(fd, fixed, FIXED_HDR, 0);
    if (g < 0) {
        r = ckerr(err, -EIO, path, "read failed: %s", strerror(errno));
        goto out;
    }
    if (g < FIXED_HDR) {
        r = memcmp(fixed, LAYER_MAGIC, (size_t)ST_MIN(g, 8)) == 0 || g == 0
                ? ckerr(err, -EBADMSG, path, "truncated: file has %zd bytes", g)
                : ckerr(err, -EBADMSG, path, "bad magic: not a spottrain checkpoint layer file");
        goto out;
    }
    TRY_GOTO(check_fixed(fixed, (size_t)g, (uint64_t)sb.st_size, path, &h, err), r, out);
    if (layer >= 0 && h.layer != (uint32_t)layer) {
        r = ckerr(err, -EBADMSG, path, "holds layer %" PRIu32 ", expected %d", h.layer, layer);
        goto out;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        r = ckerr(err, -EFBIG, path, "too large for this host");
        goto out;
    }
    buf = st_malloc((size_t)sb.st_size);
    if (!buf) {
        r = -ENOMEM;
        goto out;
    }
    for (size_t done = 0; done < (size_t)sb.st_size;) {
        ssize_t n = pread(fd, buf + done, ST_MIN((size_t)sb.st_size - done, (size_t)1 << 30),
                          (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            r = ckerr(err, n < 0 ? -EIO : -EBADMSG, path, "%s",
                      n < 0 ? strerror(errno) : "truncated while reading");
            goto out;
        }
        done += (size_t)n;
    }
    uint64_t sum;
    TRY_GOTO(check_body(buf, path, &h, &sum, err), r, out);
    *ret_buf = buf;
    buf = NULL;
    *ret_h = h;
    h.e = NULL;
    if (ret_sum)
        *ret_sum = sum;
out:
    st_free(h.e);
    st_free(buf);
    close(fd);
    return r;
}

/* ---- writer ---------------------------------------------------------------------------- */

/* For a store URL, layer files are written exactly as for a local directory into a private
 * staging directory (so their bytes are the same), then uploaded whole and removed there. */
struct mig_ckpt_writer {
    char *dir;                        /* where layer files are written (staging for a URL) */
    char *url;                        /* the store URL, or NULL for a local directory */
    const struct mig_store_ops *store; /* NULL for a local directory */
};

/* See migrate.h. */
int mig_ckpt_writer_new(const char *dir, struct mig_ckpt_writer **ret) {
    struct mig_ckpt_writer *w;
    if (!dir || !*dir || !ret)
        return -EINVAL;
    const struct mig_store_ops *st = mig__store_for(dir);
    if (!st)
        TRY(st_mkdir_p(dir, 0755));
    w = st_calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->store = st;
    if (st) {
        char tmpl[4096];
        const char *tmp = getenv("TMPDIR");
        snprintf(tmpl, sizeof(tmpl), "%s/spottrain-ckpt-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        w->url = st_strdup(dir);
        w->dir = w->url && mkdtemp(tmpl) ? st_strdup(tmpl) : NULL;
        if (!w->dir) {
            int r = w->url ? -errno : -ENOMEM;
            st_free(w->url);
            st_free(w);
            return r < 0 ? r : -ENOMEM;
        }
    } else {
        w->dir = st_strdup(dir);
    }
    if (!w->dir) {
        st_free(w);
        return -ENOMEM;
    }
    *ret = w;
    return 0;
}

/* See migrate.h. */
struct mig_ckpt_writer *mig_ckpt_writer_free(struct mig_ckpt_writer *w) {
    if (!w)
        return NULL;
    if (w->store)
        rmdir(w->dir); /* the staging directory: its files were removed after upload */
    st_free(w->url);
    st_free(w->dir);
    st_free(w);
    return NULL;
}

/* See migrate.h. */
int mig_ckpt_write_layer(struct mig_ckpt_writer *w, int layer, const struct mig_tensor *t,
                         size_t n) {
    char path[4096], tmp[4200];
    unsigned char *hdr = NULL;
    int fd = -1, r = 0;

    if (!w || layer < 0 || layer >= MIG_CKPT_MAX_LAYERS || (n && !t) || n > MAX_TENSORS)
        return -EINVAL;
    size_t hbytes = FIXED_HDR;
    uint64_t payload = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = t[i].name ? strlen(t[i].name) : 0;
        if (len == 0 || len > MIG_TENSOR_NAME_MAX || (unsigned)t[i].kind >= ST_STATE_NKINDS ||
            (t[i].count && !t[i].data))
            return -EINVAL;
        for (size_t j = 0; j < i; j++)
            if (t[j].kind == t[i].kind && strcmp(t[j].name, t[i].name) == 0)
                return -EINVAL;
        hbytes += 24 + ((len + 1 + 7) & ~(size_t)7);
        payload = align_up(payload) + (uint64_t)t[i].count * 4;
    }
    payload = align_up(payload);
    hbytes = align_up(hbytes);
    if (hbytes > MAX_HDR)
        return -EINVAL;
    TRY(layer_path(w->dir, layer, path, sizeof(path)));
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld.%ld", path, (long)getpid(), (long)gettid());

    hdr = st_calloc(1, hbytes);
    if (!hdr)
        return -ENOMEM;
    memcpy(hdr, LAYER_MAGIC, 8);
    put32(hdr + 8, FORMAT_VERSION);
    put32(hdr + 12, (uint32_t)layer);
    put32(hdr + 16, (uint32_t)n);
    put64(hdr + 24, hbytes);
    put64(hdr + 32, payload);
    size_t at = FIXED_HDR;
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(t[i].name);
        off = align_up(off);
        put32(hdr + at, (uint32_t)t[i].kind);
        put32(hdr + at + 4, (uint32_t)len);
        put64(hdr + at + 8, t[i].count);
        put64(hdr + at + 16, off);
        memcpy(hdr + at + 24, t[i].name, len);
        at += 24 + ((len + 1 + 7) & ~(size_t)7);
        off += (uint64_t)t[i].count * 4;
    }

    struct mig__xxh64 hs;
    static const unsigned char zeros[ALIGN];
    mig__xxh64_init(&hs, 0);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        r = -errno;
        goto out;
    }
    mig__xxh64_update(&hs, hdr, hbytes);
    TRY_GOTO(write_all(fd, hdr, hbytes), r, out);
    off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t pad = (size_t)(align_up(off) - off);
        mig__xxh64_update(&hs, zeros, pad);
        TRY_GOTO(write_all(fd, zeros, pad), r, out);
        off += pad;
        size_t bytes = t[i].count * 4;
        mig__xxh64_update(&hs, t[i].data, bytes);
        TRY_GOTO(write_all(fd, t[i].data, bytes), r, out);
        off += bytes;
    }
    size_t pad = (size_t)(payload - off);
    mig__xxh64_update(&hs, zeros, pad);
    TRY_GOTO(write_all(fd, zeros, pad), r, out);
    if (write_should_fail())
        TRY_GOTO(-ENOSPC, r, out); /* the test hook: the disk filled before the trailer */
    unsigned char trailer[TRAILER];
    put64(trailer, mig__xxh64_digest(&hs));
    memcpy(trailer + 8, TRAILER_MAGIC, 8);
    TRY_GOTO(write_all(fd, trailer, TRAILER), r, out);
    if (fsync(fd) < 0) {
        r = -errno;
        goto out;
    }
    if (close(fd) < 0) {
        fd = -1;
        r = -errno;
        goto out;
    }
    fd = -1;
    if (rename(tmp, path) < 0) {
        r = -errno;
        goto out;
    }
    r = fsync_dir(w->dir);
    if (r >= 0 && w->store) {
        char url[4200];
        TRY_GOTO(layer_path(w->url, layer, url, sizeof(url)), r, out);
        r = w->store->put_file(url, path);
        unlink(path);
        if (r < 0)
            snprintf(path, sizeof(path), "%s", url); /* the error names what failed */
    }
out:
    if (fd >= 0)
        close(fd);
    if (r < 0) {
        unlink(tmp);
        st_log(ST_LOG_ERR, "migrate", "Failed to write checkpoint layer '%s': %s", path,
               st_strerror(r));
    }
    st_free(hdr);
    return r;
}

/* ---- commit ------------------------------------------------------------------------------- */

static json_t *parse_object(const char *text) {
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
    if (j && !json_is_object(j)) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* See migrate.h. */
int mig_ckpt_commit(const char *dir, const struct mig_ckpt_meta *meta, int nlayers) {
    json_t *root = NULL, *layers = NULL, *model = NULL, *extra = NULL;
    char path[4096], *text = NULL;
    int r = 0;

    if (!dir || !meta || !meta->model_json || nlayers < 1 || nlayers > MIG_CKPT_MAX_LAYERS)
        return -EINVAL;
    const uint64_t u[] = {meta->step, meta->samples_committed, meta->data_position,
                          meta->data_seed, meta->opt_step};
    for (size_t i = 0; i < ST_ARRAY_SIZE(u); i++)
        if (u[i] > (uint64_t)INT64_MAX)
            return -ERANGE;
    model = parse_object(meta->model_json);
    extra = meta->extra_json ? parse_object(meta->extra_json) : json_object();
    if (!model || !extra) {
        r = st_log_errno(-EINVAL, "Checkpoint '%s': %s is not a JSON object", dir,
                         !model ? "model config" : "extra metadata");
        goto out;
    }
    layers = json_array();
    root = json_object();
    if (!layers || !root) {
        r = -ENOMEM;
        goto out;
    }
    for (int l = 0; l < nlayers; l++) {
        struct layer_hdr h = {0};
        struct st_error err;
        unsigned char *buf = NULL;
        uint64_t sum;
        TRY_GOTO(layer_path(dir, l, path, sizeof(path)), r, out);
        r = load_file(path, l, &buf, &h, &sum, &err);
        if (r < 0) {
            st_log(ST_LOG_ERR, "migrate", "Cannot commit checkpoint: '%s': %s", err.file,
                   err.message);
            goto out;
        }
        char hex[17];
        snprintf(hex, sizeof(hex), "%016" PRIx64, sum);
        const char *base = strrchr(path, '/') + 1;
        json_t *e = json_pack("{s:s, s:I, s:s, s:I, s:I}", "file", base, "bytes",
                              (json_int_t)(h.header_bytes + h.payload_bytes + TRAILER), "xxh64",
                              hex, "tensors", (json_int_t)h.ntensors, "elements",
                              (json_int_t)h.elements);
        st_free(buf);
        st_free(h.e);
        if (!e || json_array_append_new(layers, e) < 0) {
            r = -ENOMEM;
            goto out;
        }
    }
    if (json_object_set_new(root, "format", json_string(FORMAT_NAME)) < 0 ||
        json_object_set_new(root, "version", json_integer(FORMAT_VERSION)) < 0 ||
        json_object_set_new(root, "nlayers", json_integer(nlayers)) < 0 ||
        json_object_set_new(root, "step", json_integer((json_int_t)meta->step)) < 0 ||
        json_object_set_new(root, "samples_committed",
                            json_integer((json_int_t)meta->samples_committed)) < 0 ||
        json_object_set_new(root, "data_position",
                            json_integer((json_int_t)meta->data_position)) < 0 ||
        json_object_set_new(root, "data_seed", json_integer((json_int_t)meta->data_seed)) < 0 ||
        json_object_set_new(root, "opt_step", json_integer((json_int_t)meta->opt_step)) < 0 ||
        json_object_set(root, "model", model) < 0 || json_object_set(root, "extra", extra) < 0 ||
        json_object_set(root, "layers", layers) < 0) {
        r = -ENOMEM;
        goto out;
    }
    text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!text) {
        r = -ENOMEM;
        goto out;
    }
    snprintf(path, sizeof(path), "%s/%s", dir, MANIFEST);
    size_t len = strlen(text);
    text[len] = '\n'; /* json_dumps leaves room for the NUL we overwrite; rewritten below */
    const struct mig_store_ops *st = mig__store_for(dir);
    /* In a store, the PUT of the manifest after every layer object is the commit point. */
    r = st ? st->put(path, text, len + 1) : st_write_file_atomic(path, text, len + 1);
    text[len] = '\0';
    if (r < 0) {
        st_log(ST_LOG_ERR, "migrate", "Failed to write '%s': %s", path, st_strerror(r));
        goto out;
    }
    r = st ? 0 : fsync_dir(dir);
out:
    free(text);
    json_decref(root);
    json_decref(layers);
    json_decref(model);
    json_decref(extra);
    return r;
}

/* ---- reader ------------------------------------------------------------------------------- */

struct ckpt_layer_info {
    char *path;
    uint64_t bytes;
    uint64_t sum;
    uint32_t ntensors;
    uint64_t elements;
};

struct mig_ckpt {
    char *dir;
    int nlayers;
    struct mig_ckpt_meta meta;
    char *model_json, *extra_json;
    struct ckpt_layer_info *layers;
};

/* See migrate.h. */
struct mig_ckpt *mig_ckpt_free(struct mig_ckpt *c) {
    if (!c)
        return NULL;
    if (c->layers)
        for (int i = 0; i < c->nlayers; i++)
            st_free(c->layers[i].path);
    st_free(c->layers);
    free(c->model_json);
    free(c->extra_json);
    st_free(c->dir);
    st_free(c);
    return NULL;
}

static int get_u64(json_t *root, const char *key, uint64_t *ret) {
    json_t *v = json_object_get(root, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -EBADMSG;
    *ret = (uint64_t)json_integer_value(v);
    return 0;
}

/* mig_ckpt_open()'s header check of one layer object: its first bytes and its size. */
static int check_object_header(const struct mig_store_ops *st, const char *url, int l,
                               const struct ckpt_layer_info *li, struct st_error *err) {
    unsigned char *b = NULL;
    size_t len = 0;
    uint64_t total = 0;
    struct layer_hdr h;
    int r = st->get(url, 0, FIXED_HDR, FIXED_HDR, &b, &len, &total, err);
    if (r == -ENOENT)
        return ckerr(err, -ENOENT, url, "layer file missing");
    if (r < 0)
        return r;
    if (len < FIXED_HDR && len >= 8 && memcmp(b, LAYER_MAGIC, 8) == 0) {
        r = ckerr(err, -EBADMSG, url, "truncated: file has %zu bytes", len);
        goto out;
    }
    TRY_GOTO(check_fixed(b, len, total, url, &h, err), r, out);
    if (h.layer != (uint32_t)l || h.ntensors != li->ntensors || total != li->bytes)
        r = ckerr(err, -EBADMSG, url, "does not match its manifest entry (layer %" PRIu32
                  ", %" PRIu32 " tensors, %" PRIu64 " bytes; manifest: layer %d, %" PRIu32
                  " tensors, %" PRIu64 " bytes)", h.layer, h.ntensors, total, l, li->ntensors,
                  li->bytes);
out:
    st_free(b);
    return r;
}

/* See migrate.h. */
int mig_ckpt_open(const char *dir, struct mig_ckpt **ret, struct st_error *err) {
    char path[4096];
    char *text = NULL;
    json_t *root = NULL;
    struct mig_ckpt *c = NULL;
    struct stat sb;
    int r = 0;

    if (!dir || !ret)
        return -EINVAL;
    const struct mig_store_ops *st = mig__store_for(dir);
    if (!st && stat(dir, &sb) < 0)
        return ckerr(err, -ENOENT, dir, "not a checkpoint directory (%s)", strerror(errno));
    if (!st && !S_ISDIR(sb.st_mode))
        return ckerr(err, -ENOENT, dir, "not a checkpoint directory (not a directory)");
    snprintf(path, sizeof(path), "%s/%s", dir, MANIFEST);
    if (st) {
        size_t tl;
        r = st->get(path, 0, 0, MANIFEST_MAX, (unsigned char **)&text, &tl, NULL, NULL);
    } else {
        r = st_read_file(path, MANIFEST_MAX, &text, NULL);
    }
    if (r == -ENOENT)
        return ckerr(err, -ENOENT, path, "manifest.json missing: checkpoint is torn "
                     "(not committed)");
    if (r < 0)
        return ckerr(err, r, path, "cannot read manifest: %s", st_strerror(r));
    json_error_t je;
    root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
        r = ckerr(err, -EBADMSG, path, "manifest is not a JSON object (line %d: %s)",
                  root ? 1 : je.line, root ? "not an object" : je.text);
        goto out;
    }
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!fmt || strcmp(fmt, FORMAT_NAME) != 0) {
        r = ckerr(err, -EBADMSG, path, "bad magic: manifest format is not '%s'", FORMAT_NAME);
        goto out;
    }
    json_t *ver = json_object_get(root, "version");
    if (!json_is_integer(ver) || json_integer_value(ver) != FORMAT_VERSION) {
        r = ckerr(err, -EBADMSG, path, "unsupported manifest version %lld (this build reads %u)",
                  json_is_integer(ver) ? (long long)json_integer_value(ver) : -1LL,
                  FORMAT_VERSION);
        goto out;
    }
    c = st_calloc(1, sizeof(*c));
    if (!c) {
        r = -ENOMEM;
        goto out;
    }
    c->dir = st_strdup(dir);
    json_t *nl = json_object_get(root, "nlayers"), *layers = json_object_get(root, "layers");
    json_t *model = json_object_get(root, "model"), *extra = json_object_get(root, "extra");
    if (!c->dir) {
        r = -ENOMEM;
        goto out;
    }
    if (!json_is_integer(nl) || json_integer_value(nl) < 1 ||
        json_integer_value(nl) > MIG_CKPT_MAX_LAYERS || !json_is_array(layers) ||
        json_array_size(layers) != (size_t)json_integer_value(nl) || !json_is_object(model) ||
        (extra && !json_is_object(extra)) || get_u64(root, "step", &c->meta.step) < 0 ||
        get_u64(root, "samples_committed", &c->meta.samples_committed) < 0 ||
        get_u64(root, "data_position", &c->meta.data_position) < 0 ||
        get_u64(root, "data_seed", &c->meta.data_seed) < 0 ||
        get_u64(root, "opt_step", &c->meta.opt_step) < 0) {
        r = ckerr(err, -EBADMSG, path, "bad sizes or fields in manifest (nlayers, layers, model, "
                  "step, samples_committed, data_position, data_seed, opt_step)");
        goto out;
    }
    c->model_json = json_dumps(model, JSON_COMPACT | JSON_SORT_KEYS);
    c->extra_json = extra ? json_dumps(extra, JSON_COMPACT | JSON_SORT_KEYS) : strdup("{}");
    c->nlayers = (int)json_integer_value(nl);
    c->layers = st_calloc((size_t)c->nlayers, sizeof(*c->layers));
    if (!c->model_json || !c->extra_json || !c->layers) {
        r = -ENOMEM;
        goto out;
    }
    for (int l = 0; l < c->nlayers; l++) {
        json_t *e = json_array_get(layers, (size_t)l);
        const char *file = json_string_value(json_object_get(e, "file"));
        const char *hex = json_string_value(json_object_get(e, "xxh64"));
        struct ckpt_layer_info *li = &c->layers[l];
        char want[64], *end;
        snprintf(want, sizeof(want), "layer-%04d.bin", l);
        uint64_t nt;
        if (!file || strcmp(file, want) != 0 || !hex || strlen(hex) != 16 ||
            get_u64(e, "bytes", &li->bytes) < 0 || get_u64(e, "tensors", &nt) < 0 ||
            nt > MAX_TENSORS || get_u64(e, "elements", &li->elements) < 0) {
            r = ckerr(err, -EBADMSG, path, "bad sizes or fields in manifest entry of layer %d", l);
            goto out;
        }
        li->sum = strtoull(hex, &end, 16);
        li->ntensors = (uint32_t)nt;
        if (*end) {
            r = ckerr(err, -EBADMSG, path, "bad checksum text in manifest entry of layer %d", l);
            goto out;
        }
        TRY_GOTO(layer_path(dir, l, path, sizeof(path)), r, out);
        li->path = st_strdup(path);
        if (!li->path) {
            r = -ENOMEM;
            goto out;
        }
        /* Header-level checks now; the checksum when the layer is read. */
        if (st) {
            TRY_GOTO(check_object_header(st, path, l, li, err), r, out);
            continue;
        }
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            r = ckerr(err, errno == ENOENT ? -ENOENT : -EIO, path, "%s",
                      errno == ENOENT ? "layer file missing" : strerror(errno));
            goto out;
        }
        unsigned char fixed[FIXED_HDR];
        ssize_t g = pread(fd, fixed, FIXED_HDR, 0);
        int fr = fstat(fd, &sb);
        close(fd);
        struct layer_hdr h;
        if (g < 0 || fr < 0) {
            r = ckerr(err, -EIO, path, "cannot read: %s", strerror(errno));
            goto out;
        }
        if (g < FIXED_HDR && g >= 8 && memcmp(fixed, LAYER_MAGIC, 8) == 0) {
            r = ckerr(err, -EBADMSG, path, "truncated: file has %zd bytes", g);
            goto out;
        }
        TRY_GOTO(check_fixed(fixed, (size_t)g, (uint64_t)sb.st_size, path, &h, err), r, out);
        if (h.layer != (uint32_t)l || h.ntensors != li->ntensors ||
            (uint64_t)sb.st_size != li->bytes) {
            r = ckerr(err, -EBADMSG, path, "does not match its manifest entry (layer %" PRIu32
                      ", %" PRIu32 " tensors, %" PRIu64 " bytes; manifest: layer %d, %" PRIu32
                      " tensors, %" PRIu64 " bytes)", h.layer, h.ntensors,
                      (uint64_t)sb.st_size, l, li->ntensors, li->bytes);
            goto out;
        }
    }
    c->meta.model_json = c->model_json;
    c->meta.extra_json = c->extra_json;
    *ret = c;
    c = NULL;
out:
    json_decref(root);
    st_free(text);
    mig_ckpt_free(c);
    return r;
}

/* See migrate.h. */
int mig_ckpt_nlayers(const struct mig_ckpt *c) {
    return c ? c->nlayers : -EINVAL;
}

/* See migrate.h. */
void mig_ckpt_get_meta(const struct mig_ckpt *c, struct mig_ckpt_meta *ret) {
    if (c && ret)
        *ret = c->meta;
}

/* See migrate.h. */
int mig_ckpt_layer_info(const struct mig_ckpt *c, int layer, size_t *ret_ntensors,
                        uint64_t *ret_elements) {
    if (!c || layer < 0 || layer >= c->nlayers)
        return -EINVAL;
    if (ret_ntensors)
        *ret_ntensors = c->layers[layer].ntensors;
    if (ret_elements)
        *ret_elements = c->layers[layer].elements;
    return 0;
}

/* A read layer: the public struct first, then the file buffer its tensors point into. */
struct layer_impl {
    struct mig_ckpt_layer pub;
    unsigned char *buf;
    struct mig_tensor t[];
};

/* See migrate.h. */
struct mig_ckpt_layer *mig_ckpt_layer_free(struct mig_ckpt_layer *l) {
    if (!l)
        return NULL;
    struct layer_impl *li = (struct layer_impl *)l;
    st_free(li->buf);
    st_free(li);
    return NULL;
}

/* See migrate.h. */
int mig_ckpt_read_layer(struct mig_ckpt *c, int layer, struct mig_ckpt_layer **ret,
                        struct st_error *err) {
    struct layer_hdr h = {0};
    unsigned char *buf = NULL;
    uint64_t sum;
    int r;

    if (!c || !ret || layer < 0 || layer >= c->nlayers)
        return -EINVAL;
    struct ckpt_layer_info *info = &c->layers[layer];
    TRY(load_file(info->path, layer, &buf, &h, &sum, err));
    if (sum != info->sum || h.ntensors != info->ntensors) {
        r = ckerr(err, -EBADMSG, info->path, "checksum mismatch: file hashes to %016" PRIx64
                  ", manifest says %016" PRIx64 " (file replaced after commit)", sum, info->sum);
        goto out;
    }
    struct layer_impl *li = st_malloc(sizeof(*li) + h.ntensors * sizeof(struct mig_tensor));
    if (!li) {
        r = -ENOMEM;
        goto out;
    }
    li->pub.layer = layer;
    li->pub.ntensors = h.ntensors;
    li->pub.tensors = li->t;
    for (uint32_t i = 0; i < h.ntensors; i++)
        li->t[i] = (struct mig_tensor){
            .name = (const char *)buf + h.e[i].name_at,
            .kind = (enum st_state_kind)h.e[i].kind,
            .count = (size_t)h.e[i].count,
            .data = (float *)(void *)(buf + h.header_bytes + h.e[i].offset),
        };
    li->buf = buf;
    buf = NULL;
    *ret = &li->pub;
    r = 0;
out:
    st_free(h.e);
    st_free(buf);
    return r;
}

/* See migrate.h. */
const struct mig_tensor *mig_ckpt_layer_find(const struct mig_ckpt_layer *l, const char *name,
                                             enum st_state_kind kind) {
    if (!l || !name)
        return NULL;
    for (size_t i = 0; i < l->ntensors; i++)
        if (l->tensors[i].kind == kind && strcmp(l->tensors[i].name, name) == 0)
            return &l->tensors[i];
    return NULL;
}

/* See migrate.h. */
int mig_ckpt_verify(struct mig_ckpt *c, struct st_error *err) {
    if (!c)
        return -EINVAL;
    for (int l = 0; l < c->nlayers; l++) {
        struct mig_ckpt_layer *layer;
        TRY(mig_ckpt_read_layer(c, l, &layer, err));
        mig_ckpt_layer_free(layer);
    }
    return 0;
}

struct step_dir {
    uint64_t step;
    char name[256];
};

static int step_cmp_desc(const void *a, const void *b) {
    const struct step_dir *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

/* The step-<N> children of a checkpoint root, collected by step_add. */
struct step_list {
    struct step_dir *v;
    size_t n, cap;
};

/* Adds name when it is a step-<N> directory (a mig__store_list_fn, also fed by readdir). */
static int step_add(void *userdata, const char *s, bool is_dir) {
    struct step_list *L = userdata;
    char *end;
    if (!is_dir || strncmp(s, "step-", 5) != 0 || s[5] < '0' || s[5] > '9' || strlen(s) >= 256)
        return 0;
    errno = 0;
    unsigned long long step = strtoull(s + 5, &end, 10);
    if (*end || errno)
        return 0;
    if (ST_GROW(L->v, L->n, L->cap, 16) < 0)
        return -ENOMEM;
    L->v[L->n].step = step;
    snprintf(L->v[L->n].name, sizeof(L->v[L->n].name), "%s", s);
    L->n++;
    return 0;
}

/* Lists root's step-<N> children into *L (caller frees L->v with st_free). A missing local
 * root is -ENOENT; an empty or missing store prefix is 0 with none. */
static int steps_list(const char *root, struct step_list *L) {
    const struct mig_store_ops *st = mig__store_for(root);
    if (st)
        return st->list(root, step_add, L);
    DIR *d = opendir(root);
    if (!d)
        return -errno;
    int r = 0;
    for (struct dirent *de; r >= 0 && (de = readdir(d));)
        r = step_add(L, de->d_name, true);
    closedir(d);
    return r;
}

/* See migrate.h. */
int mig_ckpt_latest(const char *root, char *ret_dir, size_t size) {
    struct step_list L = {0};
    int r = -ENOENT;

    if (!root || !ret_dir || size == 0)
        return -EINVAL;
    int q0 = steps_list(root, &L);
    if (q0 < 0) {
        st_free(L.v);
        return q0;
    }
    struct step_dir *v = L.v;
    size_t n = L.n;
    if (n)
        qsort(v, n, sizeof(*v), step_cmp_desc);
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        struct mig_ckpt *c;
        struct st_error err;
        int k = snprintf(path, sizeof(path), "%s/%s", root, v[i].name);
        if (k < 0 || (size_t)k >= sizeof(path))
            continue;
        int q = mig_ckpt_open(path, &c, &err);
        if (q >= 0) {
            q = mig_ckpt_verify(c, &err);
            mig_ckpt_free(c);
        }
        if (q == -ENOMEM) {
            r = q;
            goto out;
        }
        if (q < 0) {
            st_log(ST_LOG_WARN, "migrate", "Checkpoint '%s' is not usable ('%s': %s), trying an "
                   "older one", path, err.file, err.message);
            continue;
        }
        if ((size_t)k >= size) {
            r = -ENAMETOOLONG;
            goto out;
        }
        memcpy(ret_dir, path, (size_t)k + 1);
        r = 0;
        goto out;
    }
out:
    st_free(v);
    return r;
}

/* See migrate.h. */
int mig_ckpt_latest_step(const char *root, char *ret_dir, size_t size, uint64_t *ret_step) {
    char dir[4096];
    TRY(mig_ckpt_latest(root, dir, sizeof(dir)));
    struct mig_ckpt *c = NULL;
    TRY(mig_ckpt_open(dir, &c, NULL));
    struct mig_ckpt_meta m;
    mig_ckpt_get_meta(c, &m);
    uint64_t step = m.step;
    mig_ckpt_free(c);
    if (strlen(dir) >= size)
        return -ENAMETOOLONG;
    snprintf(ret_dir, size, "%s", dir);
    *ret_step = step;
    return 0;
}

static int prune_rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path) < 0 ? -1 : 0;
}

static int cmp_step_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int count_any(void *userdata, const char *name, bool is_dir) {
    (void)name;
    (void)is_dir;
    ++*(int *)userdata;
    return 0;
}

/* See migrate.h. */
int mig_ckpt_check_root(const char *root) {
    if (!root)
        return -EINVAL;
    const struct mig_store_ops *st = mig__store_for(root);
    int n = 0;
    return st ? st->list(root, count_any, &n) : 0;
}

/* See migrate.h. */
int mig_ckpt_check_dest(const char *dir) {
    if (!dir || !*dir)
        return -EINVAL;
    if (mig__store_for(dir))
        return mig_ckpt_check_root(dir);
    TRY(st_mkdir_p(dir, 0755));
    return access(dir, W_OK | X_OK) < 0 ? -errno : 0;
}

/* Collects the object names of one checkpoint directory in a store (prune_store). */
struct name_list {
    char (*v)[256];
    size_t n, cap;
};

static int name_add(void *userdata, const char *name, bool is_dir) {
    struct name_list *L = userdata;
    if (is_dir || strlen(name) >= 256)
        return 0;
    if (ST_GROW(L->v, L->n, L->cap, 64) < 0)
        return -ENOMEM;
    snprintf(L->v[L->n++], 256, "%s", name);
    return 0;
}

/* mig_ckpt_prune() for a store: the same rule; a directory is removed object by object, the
 * manifest first, so a prune cut short leaves a torn checkpoint (skipped), never a committed
 * one with objects missing. */
static int prune_store(const struct mig_store_ops *st, const char *root, int keep) {
    struct step_list S = {0};
    int r = steps_list(root, &S), committed = 0, removed = 0;
    if (r < 0)
        goto out;
    if (S.n)
        qsort(S.v, S.n, sizeof(*S.v), step_cmp_desc);
    for (size_t i = 0; i < S.n; i++) {
        char dir[4096 + 32], obj[4096 + 300];
        struct name_list N = {0};
        snprintf(dir, sizeof(dir), "%s/%s", root, S.v[i].name);
        r = st->list(dir, name_add, &N);
        bool is_committed = false;
        for (size_t k = 0; r >= 0 && k < N.n; k++)
            is_committed |= strcmp(N.v[k], MANIFEST) == 0;
        if (r >= 0 && committed >= keep) {
            snprintf(obj, sizeof(obj), "%s/%s", dir, MANIFEST);
            r = is_committed ? st->remove(obj) : 0;
            for (size_t k = 0; r >= 0 && k < N.n; k++) {
                if (strcmp(N.v[k], MANIFEST) == 0)
                    continue;
                snprintf(obj, sizeof(obj), "%s/%s", dir, N.v[k]);
                r = st->remove(obj);
            }
            removed += r >= 0;
        } else if (r >= 0) {
            committed += is_committed;
        }
        st_free(N.v);
        if (r < 0)
            goto out;
    }
    r = removed;
out:
    st_free(S.v);
    return r;
}

/* See migrate.h. */
int mig_ckpt_prune(const char *root, int keep) {
    const struct mig_store_ops *st = mig__store_for(root);
    if (st)
        return prune_store(st, root, keep);
    DIR *d = opendir(root);
    if (!d)
        return errno == ENOENT ? 0 : -errno;
    uint64_t steps[1024];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < ST_ARRAY_SIZE(steps)) {
        char *end;
        if (strncmp(e->d_name, "step-", 5) != 0 || !e->d_name[5])
            continue;
        unsigned long long v = strtoull(e->d_name + 5, &end, 10);
        if (!*end)
            steps[n++] = v;
    }
    closedir(d);
    qsort(steps, n, sizeof(steps[0]), cmp_step_desc);
    int committed = 0, removed = 0;
    for (size_t i = 0; i < n; i++) {
        char dir[4096 + 32], man[4096 + 64];
        snprintf(dir, sizeof(dir), "%s/step-%" PRIu64, root, steps[i]);
        snprintf(man, sizeof(man), "%s/manifest.json", dir);
        bool is_committed = access(man, F_OK) == 0;
        if (committed < keep) {
            committed += is_committed;
            continue; /* kept, or newer than the kept ones and maybe still being written */
        }
        if (nftw(dir, prune_rm, 8, FTW_DEPTH | FTW_PHYS) == 0)
            removed++;
    }
    return removed;
}
