/* fuzz-ckpt.c: libFuzzer target for checkpoints read back after a crash (mig_ckpt_open,
 * mig_ckpt_verify, mig_ckpt_read_layer: manifest.json and layer-NNNN.bin files).
 *
 * Input: one flags byte, then records of a 16-bit little-endian length and that many bytes
 * (the last one cut to what is left): record 0 is manifest.json, records 1..4 are
 * layer-0000.bin .. layer-0003.bin. They are written into a private directory and opened the
 * way `spottrain ckpt verify` and a restoring worker open them. Flags bit 0 rewrites each
 * layer file's trailer with the right xxh64, since a fuzzer cannot forge a hash but the
 * tensor table behind it must be reached. ckpt-seed.c turns real checkpoints into seeds. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "migrate.h"

#define MAX_LAYER_FILES 4

static const char *dir; /* fuzz_dir_make() */

static void write_file(const char *name, const uint8_t *p, size_t n) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    FUZZ_CHECK(f != NULL);
    FUZZ_CHECK(n == 0 || fwrite(p, 1, n, f) == n);
    FUZZ_CHECK(fclose(f) == 0);
}

static int one(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    bool fix = data[0] & 1;
    size_t at = 1;
    fuzz_dir_clear();
    for (int rec = 0; rec <= MAX_LAYER_FILES && at + 2 <= size; rec++) {
        size_t n = (size_t)data[at] | (size_t)data[at + 1] << 8;
        at += 2;
        n = ST_MIN(n, size - at);
        if (rec == 0) {
            write_file("manifest.json", data + at, n);
        } else {
            uint8_t *b = malloc(n ? n : 1);
            FUZZ_CHECK(b != NULL);
            memcpy(b, data + at, n);
            if (fix && n >= 56) { /* header (40) + trailer (16) at least */
                uint64_t h = mig_xxh64(b, n - 16, 0);
                for (int i = 0; i < 8; i++)
                    b[n - 16 + i] = (uint8_t)(h >> (8 * i));
                memcpy(b + n - 8, "SPOTEND\0", 8);
            }
            char name[32];
            snprintf(name, sizeof(name), "layer-%04d.bin", rec - 1);
            write_file(name, b, n);
            free(b);
        }
        at += n;
    }
    struct mig_ckpt *c = NULL;
    struct st_error e;
    memset(&e, 0, sizeof(e));
    int r = mig_ckpt_open(dir, &c, &e);
    if (r < 0) {
        FUZZ_CHECK(r == -ENOMEM || e.message[0] != '\0');
        return r;
    }
    int nl = mig_ckpt_nlayers(c);
    FUZZ_CHECK(nl >= 1);
    struct mig_ckpt_meta meta;
    mig_ckpt_get_meta(c, &meta);
    FUZZ_CHECK(meta.model_json && meta.model_json[0] == '{');
    int first = 0;
    for (int l = 0; l < nl; l++) {
        struct mig_ckpt_layer *layer = NULL;
        size_t nt = 0;
        uint64_t elements = 0;
        FUZZ_CHECK(mig_ckpt_layer_info(c, l, &nt, &elements) == 0);
        r = mig_ckpt_read_layer(c, l, &layer, &e);
        if (r < 0) {
            if (first == 0)
                first = r;
            continue;
        }
        FUZZ_CHECK(layer->ntensors == nt);
        for (size_t i = 0; i < layer->ntensors; i++) {
            const struct mig_tensor *t = &layer->tensors[i];
            FUZZ_CHECK((unsigned)t->kind < ST_STATE_NKINDS);
            FUZZ_CHECK(mig_ckpt_layer_find(layer, t->name, t->kind) != NULL);
            volatile float sink = 0;
            for (size_t k = 0; k < t->count; k++)
                sink += t->data[k]; /* every element lies inside the file (ASan) */
            (void)sink;
        }
        mig_ckpt_layer_free(layer);
    }
    /* verify reads the same layers and must find the same first error. */
    r = mig_ckpt_verify(c, &e);
    FUZZ_CHECK(r == first || r == -ENOMEM || first == -ENOMEM);
    mig_ckpt_free(c);
    return r;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    st_log_set_level(ST_LOG_ERR);
    dir = fuzz_dir_make("ckpt");
    return 0;
}

FUZZ_TARGET(one)
