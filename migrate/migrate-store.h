/* migrate-store.h (internal to migrate/): where checkpoint files live.
 *
 * Checkpoint directories are named by a string: a local path, or an object-store URL
 * (s3://BUCKET/PREFIX). ckpt.c keeps its file code for local paths (so their bytes and fsync
 * order stay exactly as they were) and goes through one of these backends for URLs. A backend
 * is a table of whole-object operations, the shape every object store offers: put, ranged get,
 * list one level, delete. Each backend is one table and one scheme: s3, gs (the GCS JSON API), az
 * (Azure Blob REST). */
#ifndef SPOTTRAIN_MIGRATE_STORE_H
#define SPOTTRAIN_MIGRATE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h" /* struct st_error, st_realloc */

/* Called by list() once per child of a prefix: name is the last path element ("step-12",
 * "manifest.json"), is_dir true for a common prefix ("step-12/"). A negative return stops the
 * listing and is returned by list(). */
typedef int mig__store_list_fn(void *userdata, const char *name, bool is_dir);

struct mig_store_ops {
    const char *name;   /* "s3" */
    const char *scheme; /* "s3://" */
    /* Reads bytes [off, off+len) of the object at url (len 0: to the end), at most max bytes.
     * *ret (caller frees with st_free) holds *ret_len bytes plus a NUL; *ret_total the object's
     * size. -ENOENT when there is no such object; err (may be NULL) gets url and the reason. */
    int (*get)(const char *url, uint64_t off, uint64_t len, size_t max, unsigned char **ret,
               size_t *ret_len, uint64_t *ret_total, struct st_error *err);
    /* Writes the object at url from memory; it appears whole or not at all. */
    int (*put)(const char *url, const void *data, size_t len);
    /* Writes the object at url from a local file (multipart when large). */
    int (*put_file)(const char *url, const char *path);
    /* Lists the children of url (as a directory: url + "/"). */
    int (*list)(const char *url, mig__store_list_fn *fn, void *userdata);
    /* Deletes the object at url; absent is not an error. */
    int (*remove)(const char *url);
};

/* Defined in store-http.c, on the backends of store-s3.c, store-gs.c and store-az.c. */
extern const struct mig_store_ops mig__store_s3;  /* s3://BUCKET/PREFIX */
extern const struct mig_store_ops mig__store_gs;  /* gs://BUCKET/PREFIX */
extern const struct mig_store_ops mig__store_az;  /* az://ACCOUNT/CONTAINER/PREFIX */

/* The backend for url, or NULL when url is a local path. */
const struct mig_store_ops *mig__store_for(const char *url);

/* What the three backends share (the request loop, the ops' skeletons, answer parsing) is in
 * store-http.h, which only the store-*.c files include. */

#endif
