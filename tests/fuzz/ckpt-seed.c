/* ckpt-seed.c: writes seed inputs for fuzz-ckpt from real checkpoints.
 *
 * `ckpt-seed OUTDIR` writes checkpoints with the product's writer (mig_ckpt_writer_new,
 * mig_ckpt_write_layer, mig_ckpt_commit) into a temporary directory and packs each in
 * fuzz-ckpt's input format (flags byte, then 16-bit length + bytes records: manifest.json,
 * layer-0000.bin, ...) as OUTDIR/seed-N. Run by scripts/fuzz before fuzzing ckpt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "migrate.h"

static int pack_file(FILE *out, const char *path) {
    char *text = NULL;
    size_t len = 0;
    int r = st_read_file(path, 65535, &text, &len);
    if (r < 0)
        return r;
    fputc((int)(len & 0xff), out);
    fputc((int)(len >> 8), out);
    fwrite(text, 1, len, out);
    st_free(text);
    return 0;
}

/* One checkpoint of nlayers layers with ntensors tensors of count floats each. */
static int seed(const char *outdir, int n, int nlayers, int ntensors, size_t count) {
    char dir[] = "/tmp/spottrain-ckpt-seed-XXXXXX";
    if (!mkdtemp(dir))
        return -errno;
    struct mig_ckpt_writer *w = NULL;
    int r = mig_ckpt_writer_new(dir, &w);
    float *data = calloc(count ? count : 1, sizeof(float));
    for (size_t i = 0; i < count; i++)
        data[i] = (float)i * 0.5f;
    for (int l = 0; r >= 0 && l < nlayers; l++) {
        struct mig_tensor t[3];
        char names[3][32];
        for (int k = 0; k < ntensors; k++) {
            snprintf(names[k], sizeof(names[k]), "h.%d.w%d", l, k);
            t[k] = (struct mig_tensor){names[k], (enum st_state_kind)(k % 3), count, data};
        }
        r = mig_ckpt_write_layer(w, l, t, (size_t)ntensors);
    }
    struct mig_ckpt_meta meta = {"{\"layers\": 2, \"hidden\": 8}", 10, 80, 80, 1, 10,
                                 "{\"note\": \"seed\"}"};
    if (r >= 0)
        r = mig_ckpt_commit(dir, &meta, nlayers);
    char path[512];
    snprintf(path, sizeof(path), "%s/seed-%d", outdir, n);
    FILE *out = r >= 0 ? fopen(path, "wb") : NULL;
    if (r >= 0 && !out)
        r = -errno;
    if (out) {
        fputc(1, out); /* flags: fix trailers (they are right already) */
        snprintf(path, sizeof(path), "%s/manifest.json", dir);
        r = pack_file(out, path);
        for (int l = 0; r >= 0 && l < nlayers; l++) {
            snprintf(path, sizeof(path), "%s/layer-%04d.bin", dir, l);
            r = pack_file(out, path);
        }
        fclose(out);
    }
    snprintf(path, sizeof(path), "%s/manifest.json", dir);
    unlink(path);
    for (int l = 0; l < nlayers; l++) {
        snprintf(path, sizeof(path), "%s/layer-%04d.bin", dir, l);
        unlink(path);
    }
    rmdir(dir);
    free(data);
    mig_ckpt_writer_free(w);
    return r;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: ckpt-seed OUTDIR\n");
        return 2;
    }
    int r = 0;
    if (r >= 0)
        r = seed(argv[1], 0, 1, 1, 4);
    if (r >= 0)
        r = seed(argv[1], 1, 2, 3, 16);
    if (r >= 0)
        r = seed(argv[1], 2, 4, 2, 1);
    if (r < 0) {
        fprintf(stderr, "ckpt-seed: %s\n", st_strerror(r));
        return 1;
    }
    return 0;
}
