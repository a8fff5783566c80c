/* check.h: error-propagation macros, after NCCL's NCCLCHECK family.
 *
 * Every fallible function returns int: >= 0 on success, negative errno on failure.
 * TRY returns the error to the caller; TRY_GOTO stores it and jumps to the one cleanup label.
 * Both log "-> file:line" at debug level so a failure's path can be traced with
 * SPOTTRAIN_DEBUG=debug. */
#ifndef ST_CHECK_H
#define ST_CHECK_H

#include "common.h" /* st_log */

#define TRY(expr)                                                                  \
    do {                                                                           \
        int try_r_ = (expr);                                                       \
        if (try_r_ < 0) {                                                          \
            st_log(ST_LOG_DEBUG, "trace", "-> %s:%d (%s)", __FILE__, __LINE__,     \
                   st_strerror(try_r_));                                           \
            return try_r_;                                                         \
        }                                                                          \
    } while (0)

#define TRY_GOTO(expr, r, label)                                                   \
    do {                                                                           \
        (r) = (expr);                                                              \
        if ((r) < 0) {                                                             \
            st_log(ST_LOG_DEBUG, "trace", "-> %s:%d (%s)", __FILE__, __LINE__,     \
                   st_strerror(r));                                                \
            goto label;                                                            \
        }                                                                          \
    } while (0)

/* Keep the first error: cleanup steps run in order and must not overwrite it. */
#define TRY_KEEP(r, expr)                                                          \
    do {                                                                           \
        int keep_r_ = (expr);                                                      \
        if (keep_r_ < 0 && (r) >= 0)                                               \
            (r) = keep_r_;                                                         \
    } while (0)

#endif
