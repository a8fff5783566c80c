/* aws-creds.h: finding AWS credentials, region and endpoints the way the AWS tools do.
 *
 * Shared by cloud/aws.c (EC2) and migrate/store-s3.c (S3 checkpoints): both need the same
 * answer, and migrate/ may not use cloud/ (DESIGN.md), so the lookup lives here. Only libc:
 * the instance role from IMDSv2 is asked with a few lines of HTTP on a plain socket. */
#ifndef SPOTTRAIN_AWS_CREDS_H
#define SPOTTRAIN_AWS_CREDS_H

#include <stddef.h>

struct st_aws_creds {
    char key_id[128];
    char secret[256];   /* never logged */
    char session[4096]; /* never logged */
};

/* Environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) first, then the
 * profile AWS_PROFILE (default "default") of AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials,
 * then the instance role from IMDSv2 (AWS_EC2_METADATA_SERVICE_ENDPOINT, else 169.254.169.254
 * only on a machine that says it is EC2; AWS_EC2_METADATA_DISABLED=true skips it).
 * Returns 0 with *c filled, or -ENOKEY with c zeroed and why (if non-NULL) holding one line a
 * caller can log: which profile and file were tried and what was wrong (no secret in it).
 * Non-logging; may block up to a few seconds on IMDS. Callers hold the result only as long as
 * they need it: role credentials expire (hours), so long-lived users call again. */
int st_aws_creds_find(struct st_aws_creds *c, char *why, size_t whysz);

/* Overwrites *c so the secret does not linger in memory. */
void st_aws_creds_wipe(struct st_aws_creds *c);

/* The region: AWS_REGION, AWS_DEFAULT_REGION, else zone minus its letter ("us-east-1a"), else
 * "us-east-1". zone may be NULL. */
void st_aws_region_find(char *out, size_t sz, const char *zone);

/* The endpoint for service ("EC2", "S3"): AWS_ENDPOINT_URL_<service>, else AWS_ENDPOINT_URL,
 * copied into out without a trailing slash; 1 when one was set, 0 when none is (out = ""),
 * -EINVAL when it is not http:// or https:// or does not fit. */
int st_aws_endpoint_find(const char *service, char *out, size_t sz);

#endif
