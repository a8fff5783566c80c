/* dp-secret.c: the data plane's per-epoch secrets — where they come from and how they reach
 * the workers without ever being written down in clear.
 *
 * The one idea: the secret of epoch E is HMAC-SHA256(master, label | job id | E), with a
 * 32-byte master key kept in its own file (state_dir/data-plane.key, mode 0600, created once).
 * Commands are journaled WITHOUT the secret and it is filled in only on the way out, both for
 * the first delivery and for every redelivery. A coordinator that restarts (killed, pod
 * rescheduled) reads the same master key back, so the Configure it redelivers carries the
 * same secret the epoch's other workers already hold, and the journal, REST, logs and events
 * never see it. docs/data-plane-security.md explains the choice. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h> /* OPENSSL_cleanse */
#include <openssl/evp.h>    /* EVP_Q_mac */
#include <openssl/rand.h>   /* RAND_bytes */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h" /* TRY */
#include "coord-internal.h"

#define KEY_FILE "data-plane.key"
#define LABEL "spottrain data-plane epoch secret v1"

static int read_all(int fd, unsigned char *buf, size_t n, size_t *ret_got) {
    size_t got = 0;
    while (got < n) {
        ssize_t g = read(fd, buf + got, n - got);
        if (g < 0 && errno == EINTR)
            continue;
        if (g < 0)
            return -errno;
        if (g == 0)
            break;
        got += (size_t)g;
    }
    *ret_got = got;
    return 0;
}

/* See coord-internal.h. */
int coord__dp_key_load(struct coord *c) {
    char path[ST_SPEC_PATH_MAX + 32];
    unsigned char extra;
    size_t got = 0, more = 0;
    int fd, r = 0;

    snprintf(path, sizeof(path), "%s/%s", c->cfg.state_dir, KEY_FILE);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        struct stat sb;
        r = fstat(fd, &sb) < 0 ? -errno : 0;
        if (r >= 0)
            r = read_all(fd, c->dp_master, COORD_DP_KEY_BYTES, &got);
        if (r >= 0)
            r = read_all(fd, &extra, 1, &more);
        close(fd);
        if (r < 0)
            return st_log_errno(r, "Cannot read the data-plane key '%s'", path);
        if (got != COORD_DP_KEY_BYTES || more != 0)
            return st_log_errno(-EBADMSG, "Data-plane key '%s' is %zu bytes, want %d (hint: "
                                "remove it only if no worker runs; a new key changes every "
                                "epoch's secret)", path, got + more, COORD_DP_KEY_BYTES);
        if (sb.st_mode & (S_IRWXG | S_IRWXO))
            st_log(ST_LOG_WARN, "coord", "Data-plane key '%s' is readable by others (mode "
                   "%03o), ignoring", path, (unsigned)(sb.st_mode & 0777));
        c->dp_loaded = true;
        return 0;
    }
    if (errno != ENOENT)
        return st_log_errno(-errno, "Cannot open the data-plane key '%s'", path);
    if (RAND_bytes(c->dp_master, COORD_DP_KEY_BYTES) != 1)
        return st_log_errno(-EIO, "Cannot draw a data-plane key: the random generator failed");
    /* O_EXCL: two coordinators on one state directory must not both write a key. */
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return st_log_errno(-errno, "Cannot create the data-plane key '%s'", path);
    ssize_t w = write(fd, c->dp_master, COORD_DP_KEY_BYTES);
    if (w != COORD_DP_KEY_BYTES || fsync(fd) < 0)
        r = w < 0 ? -errno : -EIO;
    close(fd);
    if (r < 0) {
        unlink(path);
        return st_log_errno(r, "Cannot write the data-plane key '%s'", path);
    }
    c->dp_loaded = true;
    return 0;
}

/* See coord-internal.h. */
void coord__dp_key_free(struct coord *c) {
    OPENSSL_cleanse(c->dp_master, sizeof(c->dp_master));
    c->dp_loaded = false;
}

/* See coord-internal.h. */
int coord__dp_secret(const struct coord *c, uint64_t epoch, unsigned char out[COORD_DP_KEY_BYTES]) {
    unsigned char msg[sizeof(LABEL) + ST_UUID_STR_LEN + 8];
    size_t len = 0;
    if (!c->dp_loaded)
        return -EINVAL;
    memset(msg, 0, sizeof(msg));
    memcpy(msg, LABEL, sizeof(LABEL));
    memcpy(msg + sizeof(LABEL), c->job.id, strnlen(c->job.id, ST_UUID_STR_LEN - 1));
    for (int i = 0; i < 8; i++)
        msg[sizeof(LABEL) + ST_UUID_STR_LEN + i] = (unsigned char)(epoch >> (8 * i));
    if (!EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, c->dp_master, COORD_DP_KEY_BYTES, msg,
                   sizeof(msg), out, COORD_DP_KEY_BYTES, &len) || len != COORD_DP_KEY_BYTES)
        return -EIO;
    return 0;
}

/* True when cmd carries the epoch's secret on the wire: every Configure, and a Migrate that
 * builds a communicator (transfers or peers), not a step lease. */
static bool needs_secret(const Spottrain__V1__Command *cmd) {
    if (cmd->body_case == SPOTTRAIN__V1__COMMAND__BODY_CONFIGURE)
        return cmd->configure != NULL;
    if (cmd->body_case == SPOTTRAIN__V1__COMMAND__BODY_MIGRATE)
        return cmd->migrate && (cmd->migrate->n_transfers > 0 || cmd->migrate->n_peers > 0);
    return false;
}

static ProtobufCBinaryData *secret_field(Spottrain__V1__Command *cmd) {
    return cmd->body_case == SPOTTRAIN__V1__COMMAND__BODY_CONFIGURE
               ? &cmd->configure->data_plane_secret
               : &cmd->migrate->data_plane_secret;
}

/* See coord-internal.h. */
int coord__dp_pack(const struct coord *c, Spottrain__V1__Command *cmd, bool with_secret,
                   void **ret_data, size_t *ret_len) {
    unsigned char key[COORD_DP_KEY_BYTES];
    bool add = with_secret && needs_secret(cmd);
    ProtobufCBinaryData *f = NULL, saved = {0, NULL};
    int r = 0;

    if (needs_secret(cmd)) {
        f = secret_field(cmd);
        saved = *f;
        *f = (ProtobufCBinaryData){0, NULL}; /* whatever the caller left there never goes out */
        /* Not secret, so journaled too; set here, beside the secret, so that every command
         * that builds a communicator carries it, a redelivery after a restart included. */
        if (cmd->body_case == SPOTTRAIN__V1__COMMAND__BODY_CONFIGURE)
            cmd->configure->data_plane_tls = c->spec.fleet.data_plane_tls;
        else {
            cmd->migrate->data_plane_tls = c->spec.fleet.data_plane_tls;
            cmd->migrate->defer_moments = c->spec.fleet.data_plane_overlap;
        }
    }
    if (add) {
        TRY_GOTO(coord__dp_secret(c, cmd->epoch, key), r, out);
        *f = (ProtobufCBinaryData){COORD_DP_KEY_BYTES, key};
    }
    size_t len = spottrain__v1__command__get_packed_size(cmd);
    void *data = st_malloc(len ? len : 1);
    if (!data)
        TRY_GOTO(-ENOMEM, r, out);
    spottrain__v1__command__pack(cmd, data);
    *ret_data = data;
    *ret_len = len;
out:
    if (f)
        *f = saved;
    OPENSSL_cleanse(key, sizeof(key));
    return r;
}

/* See coord-internal.h. */
int coord__dp_repack(const struct coord *c, const void *body, size_t len, void **ret_data,
                     size_t *ret_len) {
    Spottrain__V1__Command *cmd = spottrain__v1__command__unpack(NULL, len, body);
    if (!cmd)
        return -EBADMSG;
    int r = coord__dp_pack(c, cmd, true, ret_data, ret_len);
    spottrain__v1__command__free_unpacked(cmd, NULL);
    return r;
}

/* See coord-internal.h. */
void coord__dp_free_packed(void *data, size_t len) {
    if (data)
        OPENSSL_cleanse(data, len);
    st_free(data);
}
