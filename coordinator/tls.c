/* tls.c: internal to coordinator/ — the TLS material of the gRPC and REST servers.
 *
 * One idea: every file is resolved (flag over spec, field by field), checked for pairing and
 * read into memory once, in coord_new(), so a bad path or a certificate without its key is
 * refused with the path before anything listens, and both servers serve the same bytes.
 * The private key is wiped before it is freed. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "coord-internal.h"

#define COORD_TLS_MAX_PEM (1 << 20) /* bytes; a PEM bundle larger than this is not a cert */

/* Reads one PEM file; logs the path on failure. */
static int read_pem(const char *what, const char *path, char **ret_pem) {
    char *data = NULL;
    size_t len = 0;
    int r = st_read_file(path, COORD_TLS_MAX_PEM, &data, &len);
    if (r < 0)
        return st_log_errno(r, "Cannot read the TLS %s '%s'", what, path);
    if (len == 0 || !strstr(data, "-----BEGIN ")) {
        st_free(data);
        return st_log_errno(-EINVAL, "TLS %s '%s' is not PEM (no '-----BEGIN' line)", what,
                            path);
    }
    *ret_pem = data;
    return 0;
}

int coord__tls_load(struct coord *c) {
    struct coord_config *cfg = &c->cfg;
    const struct st_spec_coordinator *sp = &c->spec.coordinator;
    int r = 0;

    if (strcmp(cfg->tls_cert, "-") == 0) {
        cfg->tls_cert[0] = cfg->tls_key[0] = cfg->tls_client_ca[0] = '\0';
        return 0;
    }
    if (!cfg->tls_cert[0])
        snprintf(cfg->tls_cert, sizeof(cfg->tls_cert), "%s", sp->tls_cert);
    if (!cfg->tls_key[0])
        snprintf(cfg->tls_key, sizeof(cfg->tls_key), "%s", sp->tls_key);
    if (!cfg->tls_client_ca[0])
        snprintf(cfg->tls_client_ca, sizeof(cfg->tls_client_ca), "%s", sp->tls_client_ca);
    if (!cfg->tls_cert[0] != !cfg->tls_key[0])
        return st_log_errno(-EINVAL, "TLS needs both a certificate and its key (got only %s "
                            "'%s')", cfg->tls_cert[0] ? "the certificate" : "the key",
                            cfg->tls_cert[0] ? cfg->tls_cert : cfg->tls_key);
    if (cfg->tls_client_ca[0] && !cfg->tls_cert[0])
        return st_log_errno(-EINVAL, "A TLS client CA ('%s') needs the server's certificate "
                            "and key", cfg->tls_client_ca);
    if (!cfg->tls_cert[0])
        return 0;
    TRY_GOTO(read_pem("certificate", cfg->tls_cert, &c->tls_cert_pem), r, out);
    TRY_GOTO(read_pem("key", cfg->tls_key, &c->tls_key_pem), r, out);
    if (cfg->tls_client_ca[0])
        TRY_GOTO(read_pem("client CA", cfg->tls_client_ca, &c->tls_ca_pem), r, out);
out:
    if (r < 0)
        coord__tls_free(c);
    return r;
}

void coord__tls_free(struct coord *c) {
    if (c->tls_key_pem) {
        volatile char *p = c->tls_key_pem;
        while (*p)
            *p++ = '\0';
    }
    st_free(c->tls_key_pem);
    st_free(c->tls_cert_pem);
    st_free(c->tls_ca_pem);
    c->tls_key_pem = c->tls_cert_pem = c->tls_ca_pem = NULL;
}
