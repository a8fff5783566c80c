/* fuzz-dir.c: the private directory of a fuzz target whose code under test reads and writes
 * files (fuzz-ckpt: checkpoint files; fuzz-proto and fuzz-rest: the coordinator's journal).
 *
 * One idea: the directory lives in /dev/shm where it can (millions of inputs each write a
 * few files; tmpfs keeps the disk out of the fuzzer's speed) and is emptied, not remade,
 * between inputs, so an input starts from nothing without a mkdtemp per run. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "fuzz.h"

static char fuzz_dir[256];

/* See fuzz.h. */
void fuzz_dir_clear(void) {
    DIR *d = opendir(fuzz_dir);
    if (!d)
        return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof(path), "%s/%s", fuzz_dir, e->d_name);
            unlink(path);
        }
    closedir(d);
}

static void fuzz_dir_remove(void) {
    fuzz_dir_clear();
    rmdir(fuzz_dir);
}

/* See fuzz.h. */
const char *fuzz_dir_make(const char *name) {
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(fuzz_dir, sizeof(fuzz_dir), "%s/spottrain-fuzz-%s-XXXXXX", base, name);
    if (!mkdtemp(fuzz_dir)) {
        perror("mkdtemp");
        abort();
    }
    atexit(fuzz_dir_remove);
    return fuzz_dir;
}
