/* worker-reserve.h: the warm reserve (worker/reserve.c) — memory a worker without state
 * faults in ahead, from which its next engine's large buffers are made. Part of worker/; the
 * runner opens and closes it, stage.c allocates and frees through it. */
#ifndef ST_WORKER_RESERVE_H
#define ST_WORKER_RESERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Buffers smaller than this come from the heap, never from the reserve. */
#define WORKER_RESERVE_MIN ((size_t)64 << 10)

struct worker_reserve_stats {
    size_t bytes;   /* the last reserve's size */
    size_t faulted; /* of which faulted in before the first buffer was carved (or so far) */
    size_t given;   /* carved into buffers */
    size_t live;    /* carved buffers not freed yet, from any reserve */
};

/* Maps `bytes` (rounded up to pages) and starts a thread faulting them in; an open reserve is
 * closed first. 0, -EINVAL (0 bytes), or the mmap's negative errno. */
int worker_reserve_open(size_t bytes);
/* Stops the filling and unmaps what was not carved; carved buffers stay until freed. Idempotent. */
void worker_reserve_close(void);
bool worker_reserve_is_open(void);
void worker_reserve_stats(struct worker_reserve_stats *ret);

/* Bytes of memory this process may still take: MemAvailable of root/proc/meminfo, and no more
 * than a container's memory limit leaves (root/sys/fs/cgroup: v2 memory.max less
 * memory.current, else v1 memory.limit_in_bytes less memory.usage_in_bytes; "max" is no
 * limit). root NULL or "" is the machine's own. UINT64_MAX when nothing says. */
uint64_t worker_reserve_headroom(const char *root);

/* A page-aligned, zeroed buffer of at least `bytes` from the open reserve, or NULL (none
 * open, too small a request, no room left). Stops the filling. */
void *worker__reserve_take(size_t bytes);
/* Unmaps ptr when it is a buffer the reserve gave (true); false otherwise, touching nothing. */
bool worker__reserve_release(void *ptr);
/* The engine's large buffers: from the reserve when it can, else the heap (zeroed when zero);
 * freed with worker__big_free, which takes either. */
void *worker__big_alloc(size_t bytes, bool zero);
void worker__big_free(void *p);

#endif
