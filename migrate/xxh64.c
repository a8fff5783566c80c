/* xxh64.c: XXH64, the 64-bit xxHash of Yann Collet, written from its published specification
 * (github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md). Checkpoint files carry it over
 * header + payload.
 *
 * The one idea: a streaming state (four lanes of 8 bytes over 32-byte stripes) so a layer
 * file can be hashed while it is written from the caller's tensors, without a copy. */
#include <string.h>

#include "migrate-internal.h"

#define P1 11400714785074694791ULL
#define P2 14029467366897019727ULL
#define P3 1609587929392839161ULL
#define P4 9650029242287828579ULL
#define P5 2870177450012600261ULL

static inline uint64_t rotl64(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t read64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t read32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t round64(uint64_t acc, uint64_t input) {
    acc += input * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}

static inline uint64_t merge64(uint64_t acc, uint64_t val) {
    acc ^= round64(0, val);
    return acc * P1 + P4;
}

/* Starts a stream with seed. Called by the checkpoint writer and reader. */
void mig__xxh64_init(struct mig__xxh64 *s, uint64_t seed) {
    memset(s, 0, sizeof(*s));
    s->v[0] = seed + P1 + P2;
    s->v[1] = seed + P2;
    s->v[2] = seed;
    s->v[3] = seed - P1;
    s->seed = seed;
}

static void stripe(uint64_t v[4], const unsigned char *p) {
    v[0] = round64(v[0], read64(p));
    v[1] = round64(v[1], read64(p + 8));
    v[2] = round64(v[2], read64(p + 16));
    v[3] = round64(v[3], read64(p + 24));
}

/* Feeds len bytes into the stream. */
void mig__xxh64_update(struct mig__xxh64 *s, const void *data, size_t len) {
    const unsigned char *p = data;
    s->total += len;
    if (s->buffered) {
        size_t take = ST_MIN(len, 32 - s->buffered);
        memcpy(s->buf + s->buffered, p, take);
        s->buffered += take;
        p += take;
        len -= take;
        if (s->buffered < 32)
            return;
        stripe(s->v, s->buf);
        s->buffered = 0;
    }
    while (len >= 32) {
        stripe(s->v, p);
        p += 32;
        len -= 32;
    }
    if (len) {
        memcpy(s->buf, p, len);
        s->buffered = len;
    }
}

/* The hash of everything fed so far; the stream stays usable. */
uint64_t mig__xxh64_digest(const struct mig__xxh64 *s) {
    uint64_t h;
    if (s->total >= 32) {
        h = rotl64(s->v[0], 1) + rotl64(s->v[1], 7) + rotl64(s->v[2], 12) + rotl64(s->v[3], 18);
        for (int i = 0; i < 4; i++)
            h = merge64(h, s->v[i]);
    } else {
        h = s->seed + P5;
    }
    h += s->total;
    const unsigned char *p = s->buf;
    size_t len = s->buffered;
    while (len >= 8) {
        h ^= round64(0, read64(p));
        h = rotl64(h, 27) * P1 + P4;
        p += 8;
        len -= 8;
    }
    if (len >= 4) {
        h ^= (uint64_t)read32(p) * P1;
        h = rotl64(h, 23) * P2 + P3;
        p += 4;
        len -= 4;
    }
    while (len) {
        h ^= (*p) * P5;
        h = rotl64(h, 11) * P1;
        p++;
        len--;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

/* One-shot XXH64 (see migrate.h). */
uint64_t mig_xxh64(const void *data, size_t len, uint64_t seed) {
    struct mig__xxh64 s;
    mig__xxh64_init(&s, seed);
    mig__xxh64_update(&s, data, len);
    return mig__xxh64_digest(&s);
}
