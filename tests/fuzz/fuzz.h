/* fuzz.h: what every libFuzzer target of tests/fuzz shares — the entry point's prototype, a
 * check that aborts (so libFuzzer records the input) and the allocation-failure replay.
 *
 * The one idea: a quarter of the inputs are run twice, the second time with st_malloc's test
 * hook failing the Nth allocation (N from the input's hash, so a crash replays exactly). The
 * second run must give the first run's result or -ENOMEM and free everything it took, which
 * is curl's torture mode spread over the fuzzer's inputs instead of a loop over N. */
#ifndef ST_FUZZ_H
#define ST_FUZZ_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.h" /* st_alloc_fail_after */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Aborts with file:line when c is false: libFuzzer keeps the input as a crash. */
#define FUZZ_CHECK(c)                                                                      \
    do {                                                                                   \
        if (!(c)) {                                                                        \
            fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed\n", __FILE__, __LINE__, #c);     \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

/* FNV-1a of the input. */
static inline uint64_t fuzz_hash(const uint8_t *d, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ d[i]) * 1099511628211ull;
    return h;
}

/* 0 for three inputs in four; else which allocation (1..48) to fail in the replay. */
static inline long fuzz_alloc_nth(const uint8_t *d, size_t n) {
    uint64_t h = fuzz_hash(d, n);
    if (h % 4 != 0)
        return 0;
    return 1 + (long)((h >> 8) % 48);
}

/* Runs fn(data, size) once normally and, for a quarter of inputs, again with the Nth
 * allocation failing; fn returns 0 or negative errno. The replay must agree or be -ENOMEM. */
static inline void fuzz_run(int (*fn)(const uint8_t *, size_t), const uint8_t *data,
                            size_t size) {
    int r = fn(data, size);
    long nth = fuzz_alloc_nth(data, size);
    if (nth == 0)
        return;
    st_alloc_fail_after(nth);
    int r2 = fn(data, size);
    st_alloc_fail_after(0);
    if (r2 != r && r2 != -ENOMEM) {
        fprintf(stderr, "fuzz: first run gave %d, run failing allocation %ld gave %d\n", r, nth,
                r2);
        abort();
    }
}

/* Entry point of a target: each input goes through fuzz_run(fn). Written once per target,
 * without a trailing semicolon (one at file scope is an empty declaration -pedantic flags). */
#define FUZZ_TARGET(fn)                                                                    \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {                         \
        fuzz_run(fn, data, size);                                                          \
        return 0;                                                                          \
    }

/* Initialisation of a target whose only setup is quiet logging: bad input is expected by the
 * thousand and logs only errors. */
#define FUZZ_INIT_QUIET()                                                                  \
    int LLVMFuzzerInitialize(int *argc, char ***argv) {                                    \
        (void)argc;                                                                        \
        (void)argv;                                                                        \
        st_log_set_level(ST_LOG_ERR);                                                      \
        return 0;                                                                          \
    }

/* A parser's verdict on one input: true when it refused the input, and then -EINVAL must come
 * with a message in *e (the user is told what is wrong). */
static inline bool fuzz_parse_refused(int r, const struct st_error *e) {
    if (r == -EINVAL)
        FUZZ_CHECK(e->message[0] != '\0');
    return r < 0;
}

/* ---- fuzz-dir.c: a private directory, for targets that read and write files ------------- */

/* Makes /dev/shm/spottrain-fuzz-NAME-XXXXXX (/tmp without /dev/shm), removed with its files
 * at exit; aborts when it cannot. Returns its path (static storage, one per process). Called
 * once, from LLVMFuzzerInitialize. */
const char *fuzz_dir_make(const char *name);
/* Removes the files in that directory (not below), keeping it: an input starts empty. */
void fuzz_dir_clear(void);

/* ---- fuzz-coord.c: the coordinator of fuzz-proto and fuzz-rest -------------------------- */

struct coord;
/* A default spec named "fuzz" with 4 layers. */
void fuzz_coord_spec(struct st_spec *spec);
/* Opens a coordinator on the journal in dir (spec borrowed for its life), gRPC on a free
 * loopback port, no REST listener; token NULL leaves the token unset. Returns coord_new()'s
 * result; caller frees with coord_free(). */
int fuzz_coord_open(const struct st_spec *spec, const char *dir, const char *token,
                    struct coord **ret);
/* fuzz_coord_open() on an emptied directory: the start of every input. Out of memory (the
 * allocation-failing replay) is the only failure it allows; returns 0 or -ENOMEM. */
int fuzz_coord_fresh(const struct st_spec *spec, const char *dir, const char *token,
                     struct coord **ret);

#endif
