/* oauth.h: OAuth 2.0 access tokens for Google Cloud and Azure, found the way their libraries do.
 *
 * Shared by cloud/gcp.c and cloud/azure.c (Compute, Resource Manager) and by migrate/'s gs://
 * and az:// checkpoint stores (Cloud Storage, Blob storage): both need the same credentials,
 * and migrate/ may not use cloud/ (DESIGN.md), so the lookup lives here, as aws-creds.c does
 * for AWS. Non-logging: a failure fills `why` with the one line a caller logs (which source
 * was tried and what the service answered, its error code included; never a secret). */
#ifndef SPOTTRAIN_OAUTH_H
#define SPOTTRAIN_OAUTH_H

#include <stdbool.h>
#include <stddef.h>

struct st_token {
    char value[8192]; /* the bearer token: never logged */
    double expiry;    /* st_now() seconds */
};

/* A Google access token for scope ("https://www.googleapis.com/auth/devstorage.read_write"):
 * the service-account key file named by GOOGLE_APPLICATION_CREDENTIALS (a JWT signed RS256,
 * exchanged at the key's token_uri; http:// token_uri only on loopback), else the metadata
 * server's token (GCE_METADATA_HOST or metadata.google.internal, Metadata-Flavor: Google, the
 * probe gives up within 1 s). Returns 0 with *t filled; -ENOKEY when there are no credentials
 * (no key file and no metadata server), -EACCES when the token endpoint refused them, -EINVAL
 * for an unusable key file or token_uri, -EIO for a 5xx, or a transport error. */
int st_gcp_token_get(const char *scope, struct st_token *t, char *why, size_t whysz);

/* An Azure AD access token for resource ("https://management.azure.com",
 * "https://storage.azure.com"): a client secret from AZURE_TENANT_ID, AZURE_CLIENT_ID and
 * AZURE_CLIENT_SECRET at AZURE_AUTHORITY_HOST (default https://login.microsoftonline.com; http://
 * only on loopback), else a managed identity from IMDS (AZURE_POD_IDENTITY_AUTHORITY_HOST or
 * http://169.254.169.254, the probe gives up within 1 s). Returns as st_gcp_token_get(). */
int st_azure_token_get(const char *resource, struct st_token *t, char *why, size_t whysz);

/* Overwrites *t so the token does not linger in memory. */
void st_token_wipe(struct st_token *t);

/* True when the URL's host is 127.x, localhost or [::1] (http:// is accepted only there). */
bool st_url_is_loopback(const char *url);

#endif
