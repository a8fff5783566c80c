/* fuzz-tokens.c: libFuzzer target for token files (st_tokens_open: nanoGPT raw uint16 and
 * llm.c header + uint16), which `train` and `run` open on every worker.
 *
 * The input is the file. st_tokens_open takes a path and maps the file, so the bytes go into a
 * memfd opened through /proc/self/fd (no disk, no name clashes between parallel fuzzers). The
 * last byte picks the vocabulary the caller checks against. A file that opens must give
 * samples whose tokens all lie in it. */
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"

static int memfd = -1;
static char path[64];

static int one(const uint8_t *data, size_t size) {
    FUZZ_CHECK(ftruncate(memfd, 0) == 0);
    if (size && pwrite(memfd, data, size, 0) != (ssize_t)size)
        abort();
    static const int vocabs[] = {0, 2, 256, 50257, 65536};
    int vocab = size ? vocabs[data[size - 1] % ST_ARRAY_SIZE(vocabs)] : 0;
    struct st_tokens *t = NULL;
    struct st_error e;
    memset(&e, 0, sizeof(e));
    int r = st_tokens_open(path, vocab, &t, &e);
    if (r == -EINVAL) {
        FUZZ_CHECK(e.message[0] != '\0');
        return r;
    }
    if (r < 0)
        return r;
    FUZZ_CHECK(t->ntokens >= 2);
    FUZZ_CHECK(vocab == 0 || t->max_token < (uint32_t)vocab);
    uint16_t out[9];
    for (int i = 0; i < 4; i++) {
        r = st_tokens_sample(t, 1, (uint64_t)i, 4, i, 8, out);
        if (t->ntokens < 9) {
            FUZZ_CHECK(r == -EINVAL); /* shorter than T + 1 tokens */
            continue;
        }
        FUZZ_CHECK(r == 0);
        for (int k = 0; k < 9; k++)
            FUZZ_CHECK(out[k] <= t->max_token);
    }
    st_tokens_free(t);
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    memfd = memfd_create("fuzz-tokens", MFD_CLOEXEC);
    if (memfd < 0) {
        perror("memfd_create");
        abort();
    }
    snprintf(path, sizeof(path), "/proc/self/fd/%d", memfd);
    return 0;
}

FUZZ_TARGET(one)
