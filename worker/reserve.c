/* reserve.c: the warm reserve — memory a worker without state faults in while it waits, from
 * which its next engine's large buffers are made.
 *
 * The one idea: what making a spare's engine costs at its boundary is page faults, not writes.
 * At the GPT-2 124M size the engine is about 2 GB; faulting in 2 GB took 2.6 s on this 2-core
 * VM under load, writing the same memory once it was faulted 0.26 s. So a worker that holds
 * nothing maps the bytes of the largest position it could be given and faults them in on a
 * thread of its own; the engine's buffers are carved from that mapping (page
 * aligned, in address order), and each is unmapped on its own when it is freed, so the reserve
 * holds nothing longer than the buffer it backs. The first carving stops the filling: pages it
 * had not reached are faulted by the engine's own writes, as without a reserve. The thread
 * runs at the worker's priority: stopping it waits for the 2 MiB it is faulting in, and at the
 * lowest priority, on a host whose cores train, it was rarely scheduled (a loaded run's making
 * still took 3.1 s); an unprivileged process cannot raise a thread's priority again.
 *
 * One reserve per process (the runner's engine is the only one), guarded by one mutex; the
 * filling thread takes no lock. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "worker-reserve.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#define FILL_CHUNK ((size_t)2 << 20)

struct span {
    char *p;
    size_t len;
};

static struct {
    pthread_mutex_t lock;
    char *base;                /* the open mapping, NULL when closed */
    size_t size, next;         /* [base + next, base + size) is not carved yet */
    pthread_t th;
    bool th_live;
    atomic_bool stop;
    atomic_size_t filled;      /* bytes from base the thread has faulted in */
    struct span *spans;        /* carved buffers still live, sorted by address */
    size_t nspans, cap;
    struct worker_reserve_stats st;
} rs = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t page_size(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static void *fill_main(void *arg) {
    (void)arg;
    bool populate = true;
    size_t pg = page_size();
    for (size_t off = 0; off < rs.size && !atomic_load(&rs.stop); off += FILL_CHUNK) {
        size_t len = ST_MIN(FILL_CHUNK, rs.size - off);
        if (populate && madvise(rs.base + off, len, MADV_POPULATE_WRITE) != 0)
            populate = false; /* an older kernel: write a byte of every page */
        if (!populate)
            for (size_t i = 0; i < len; i += pg)
                ((volatile char *)rs.base)[off + i] = 0;
        atomic_store(&rs.filled, off + len);
    }
    return NULL;
}

/* Stops and joins the filling thread. Called with rs.lock held (the thread never takes it). */
static void fill_stop(void) {
    if (!rs.th_live)
        return;
    atomic_store(&rs.stop, true);
    pthread_join(rs.th, NULL);
    rs.th_live = false;
    rs.st.faulted = atomic_load(&rs.filled);
}

static void close_locked(void) {
    fill_stop();
    if (rs.base && rs.next < rs.size)
        munmap(rs.base + rs.next, rs.size - rs.next);
    rs.base = NULL;
    rs.size = rs.next = 0;
}

int worker_reserve_open(size_t bytes) {
    if (bytes == 0)
        return -EINVAL;
    pthread_mutex_lock(&rs.lock);
    close_locked();
    int r = 0;
    size_t size = round_up(bytes, page_size());
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
        r = -errno;
        goto out;
    }
    rs.base = p;
    rs.size = size;
    rs.next = 0;
    atomic_store(&rs.stop, false);
    atomic_store(&rs.filled, 0);
    memset(&rs.st, 0, sizeof(rs.st));
    rs.st.bytes = size;
    if (pthread_create(&rs.th, NULL, fill_main, NULL) != 0) {
        munmap(rs.base, rs.size);
        rs.base = NULL;
        rs.size = 0;
        r = -EAGAIN;
        goto out;
    }
    rs.th_live = true;
out:
    pthread_mutex_unlock(&rs.lock);
    return r;
}

void worker_reserve_close(void) {
    pthread_mutex_lock(&rs.lock);
    close_locked();
    pthread_mutex_unlock(&rs.lock);
}

bool worker_reserve_is_open(void) {
    pthread_mutex_lock(&rs.lock);
    bool open = rs.base != NULL;
    pthread_mutex_unlock(&rs.lock);
    return open;
}

void worker_reserve_stats(struct worker_reserve_stats *ret) {
    pthread_mutex_lock(&rs.lock);
    *ret = rs.st;
    if (rs.th_live)
        ret->faulted = atomic_load(&rs.filled);
    ret->live = 0;
    for (size_t i = 0; i < rs.nspans; i++)
        ret->live += rs.spans[i].len;
    pthread_mutex_unlock(&rs.lock);
}

/* Index of the first span at or after p. */
static size_t span_find(const char *p) {
    size_t lo = 0, hi = rs.nspans;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (rs.spans[mid].p < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void *worker__reserve_take(size_t bytes) {
    if (bytes < WORKER_RESERVE_MIN)
        return NULL;
    pthread_mutex_lock(&rs.lock);
    char *p = NULL;
    size_t len = round_up(bytes, page_size());
    if (!rs.base || len > rs.size - rs.next)
        goto out;
    if (rs.nspans == rs.cap) {
        size_t cap = rs.cap ? rs.cap * 2 : 256;
        struct span *s = st_realloc(rs.spans, cap * sizeof(*s));
        if (!s)
            goto out;
        rs.spans = s;
        rs.cap = cap;
    }
    fill_stop(); /* what it did not reach is faulted by the caller's writes */
    p = rs.base + rs.next;
    rs.next += len;
    size_t i = span_find(p);
    memmove(&rs.spans[i + 1], &rs.spans[i], (rs.nspans - i) * sizeof(*rs.spans));
    rs.spans[i] = (struct span){p, len};
    rs.nspans++;
    rs.st.given += len;
out:
    pthread_mutex_unlock(&rs.lock);
    return p;
}

bool worker__reserve_release(void *ptr) {
    if (!ptr)
        return false;
    pthread_mutex_lock(&rs.lock);
    size_t i = span_find(ptr);
    bool ours = i < rs.nspans && rs.spans[i].p == ptr;
    if (ours) {
        /* Inside the open mapping too: a carved range is never carved again. */
        munmap(rs.spans[i].p, rs.spans[i].len);
        memmove(&rs.spans[i], &rs.spans[i + 1], (rs.nspans - i - 1) * sizeof(*rs.spans));
        rs.nspans--;
        if (rs.nspans == 0 && !rs.base) {
            st_free(rs.spans);
            rs.spans = NULL;
            rs.cap = 0;
        }
    }
    pthread_mutex_unlock(&rs.lock);
    return ours;
}

/* The first unsigned number in file root/rel; false when it is missing or says "max". */
static bool read_u64(const char *root, const char *rel, const char *prefix, uint64_t *ret) {
    char path[512], line[256];
    snprintf(path, sizeof(path), "%s%s", root, rel);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool ok = false;
    size_t np = prefix ? strlen(prefix) : 0;
    while (!ok && fgets(line, sizeof(line), f)) {
        if (np && strncmp(line, prefix, np) != 0)
            continue;
        char *end;
        unsigned long long v = strtoull(line + np, &end, 10);
        ok = end != line + np;
        if (ok)
            *ret = (uint64_t)v;
        if (!np)
            break;
    }
    fclose(f);
    return ok;
}

uint64_t worker_reserve_headroom(const char *root) {
    if (!root)
        root = "";
    uint64_t kb = 0, lim = 0, use = 0, room = UINT64_MAX;
    if (read_u64(root, "/proc/meminfo", "MemAvailable:", &kb))
        room = kb * 1024;
    /* A container's limit (cgroup v2, then v1): what is left under it. */
    if ((read_u64(root, "/sys/fs/cgroup/memory.max", NULL, &lim) &&
         read_u64(root, "/sys/fs/cgroup/memory.current", NULL, &use)) ||
        (read_u64(root, "/sys/fs/cgroup/memory/memory.limit_in_bytes", NULL, &lim) &&
         read_u64(root, "/sys/fs/cgroup/memory/memory.usage_in_bytes", NULL, &use)))
        room = ST_MIN(room, lim > use ? lim - use : 0);
    return room;
}

void *worker__big_alloc(size_t bytes, bool zero) {
    void *p = worker__reserve_take(bytes); /* fresh anonymous pages: zero */
    if (p)
        return p;
    return zero ? st_calloc(ST_MAX(bytes, 1), 1) : st_malloc(ST_MAX(bytes, 1));
}

void worker__big_free(void *p) {
    if (!worker__reserve_release(p))
        st_free(p);
}
