/* bootstrap.c: the worker bootstrap script every VM cloud boots its instances with (EC2
 * user-data, GCE startup-script, Azure customData): it writes the join token and the job
 * spec under /var/lib/spottrain, asks the instance's metadata service for its own name, and
 * execs `spottrain worker`.
 *
 * The one idea: the script is the same on every cloud but for how an instance learns its
 * name, so that is a row of a table and the rest is written once. Called by aws.c, gcp.c and
 * azure.c at init, once with the token and once redacted for dry runs and logs. */
#include <stdio.h>
#include <string.h>

#include "cloud-internal.h" /* cloud__bootstrap_script, st_sbuf */
#include "spec.h"           /* struct st_spec: the spec file embedded in the script */

/* How a cloud's instance finds its own name, so the coordinator ties the worker to the
 * instance the cloud's listing reports (curl is on the image). */
static const struct boot_cloud {
    const char *name;
    const char *instance_id; /* shell lines that set $iid */
} boot_clouds[] = {
    {"aws",
     /* IMDSv2 (docs/aws.md): a session token first, then the instance id. */
     "md=${AWS_EC2_METADATA_SERVICE_ENDPOINT:-http://169.254.169.254}\n"
     "t=$(curl -fsS -X PUT \"$md/latest/api/token\" "
     "-H 'X-aws-ec2-metadata-token-ttl-seconds: 300')\n"
     "iid=$(curl -fsS -H \"X-aws-ec2-metadata-token: $t\" "
     "\"$md/latest/meta-data/instance-id\")\n"},
    {"gcp",
     "md=${GCE_METADATA_HOST:-metadata.google.internal}\n"
     "iid=$(curl -fsS -H 'Metadata-Flavor: Google' "
     "\"http://$md/computeMetadata/v1/instance/name\")\n"},
    {"azure",
     "md=${AZURE_POD_IDENTITY_AUTHORITY_HOST:-http://169.254.169.254}\n"
     "iid=$(curl -fsS -H 'Metadata: true' \"$md/metadata/instance/compute/"
     "name?api-version=2021-02-01&format=text\")\n"},
};

/* See cloud-internal.h. */
int cloud__bootstrap_script(const struct cloud_config *cfg, const char *coordinator,
                            const char *cloud, bool redact, size_t max, size_t spec_max,
                            char **ret) {
    const struct boot_cloud *bc = NULL;
    for (size_t i = 0; i < ST_ARRAY_SIZE(boot_clouds); i++)
        if (!strcmp(boot_clouds[i].name, cloud))
            bc = &boot_clouds[i];
    if (!bc)
        return -EINVAL;
    struct st_sbuf b = {.max = max};
    char *spec_text = NULL;
    size_t spec_len = 0;
    if (cfg->spec && cfg->spec->path[0] &&
        st_read_file(cfg->spec->path, spec_max, &spec_text, &spec_len) < 0)
        spec_text = NULL;
    st_sb_str(&b, "#!/bin/sh\n# spottrain bootstrap: job '");
    st_sb_str(&b, cfg->job_name);
    st_sb_str(&b, "' (");
    st_sb_str(&b, cfg->job_id);
    st_sb_str(&b, "). Runs once at first boot; the image has spottrain on PATH.\n"
                  "set -eu\ndir=/var/lib/spottrain\nmkdir -p \"$dir\"\nchmod 700 \"$dir\"\n"
                  "umask 077\n");
    if (cfg->token) {
        st_sb_str(&b, "printf '%s\\n' '");
        st_sb_str(&b, redact ? "<redacted>" : cfg->token);
        st_sb_str(&b, "' >\"$dir/token\"\n");
    }
    /* A spec that holds the heredoc's end marker cannot be embedded safely: the script then
     * leaves --job off. */
    bool job = spec_text && !strstr(spec_text, "SPOTTRAIN_JOB_EOF");
    if (job) {
        st_sb_str(&b, "cat >\"$dir/job.yaml\" <<'SPOTTRAIN_JOB_EOF'\n");
        st_sb_add(&b, spec_text, spec_len);
        if (spec_len && spec_text[spec_len - 1] != '\n')
            st_sb_str(&b, "\n");
        st_sb_str(&b, "SPOTTRAIN_JOB_EOF\n");
    }
    /* The data plane listens on the instance's first address, where its peers reach it. */
    st_sb_str(&b, bc->instance_id);
    st_sb_str(&b, "ip=$(hostname -I 2>/dev/null | cut -d' ' -f1)\n");
    st_sb_str(&b, "exec spottrain worker --coordinator ");
    st_sb_str(&b, coordinator);
    st_sb_str(&b, " --job-id ");
    st_sb_str(&b, cfg->job_id);
    if (cfg->token)
        st_sb_str(&b, " --token-file \"$dir/token\"");
    if (job)
        st_sb_str(&b, " --job \"$dir/job.yaml\"");
    /* Every cloud's worker is told its cloud: that is what makes it poll the metadata
     * service for its interruption notice (without the flag an aws worker polled only when
     * AWS_EC2_METADATA_SERVICE_ENDPOINT was set, which a real EC2 instance does not set). */
    st_sb_str(&b, " --cloud ");
    st_sb_str(&b, cloud);
    st_sb_str(&b, " --instance-id \"$iid\" --data-addr \"${ip:-127.0.0.1}:0\" --state-dir "
                  "\"$dir\"\n");
    st_free(spec_text);
    if (b.fail) {
        st_sb_done(&b);
        return -E2BIG;
    }
    *ret = b.p;
    return 0;
}
