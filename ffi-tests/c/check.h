/* Minimal checking helpers shared by the C tests: each failed check prints
 * where and why, and the program exits non-zero at the end. */
#ifndef KVC_TEST_CHECK_H
#define KVC_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcore.h"

static int check_failures = 0;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            check_failures++;                                                    \
        }                                                                        \
    } while (0)

/* Expects a status; on mismatch prints both codes and their descriptions. */
#define EXPECT_STATUS(expr, want)                                                      \
    do {                                                                               \
        kvc_status got_ = (expr);                                                      \
        if (got_ != (kvc_status)(want)) {                                              \
            fprintf(stderr, "%s:%d: %s returned %u (%s), expected %u (%s)\n", __FILE__, \
                    __LINE__, #expr, (unsigned)got_, kvc_status_str((uint32_t)got_),  \
                    (unsigned)(want), kvc_status_str((uint32_t)(want)));                \
            check_failures++;                                                          \
        }                                                                              \
    } while (0)

#define EXPECT_OK(expr) EXPECT_STATUS(expr, KVC_STATUS_OK)

/* The engine's last error as a static buffer (for messages and checks). */
static inline const char *last_error(const kvc_engine *engine) {
    static char buf[512];
    size_t n = 0;
    buf[0] = '\0';
    if (kvc_engine_last_error(engine, buf, sizeof buf, &n) != KVC_STATUS_OK) {
        return "<kvc_engine_last_error failed>";
    }
    return buf;
}

static inline int check_report(const char *name) {
    if (check_failures != 0) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, check_failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}

/* A request with no images, no LoRA, no salt, no UUID list. */
static inline kvc_request text_request(const uint32_t *tokens, size_t n) {
    kvc_request r;
    memset(&r, 0, sizeof r);
    r.tokens = tokens;
    r.tokens_len = n;
    return r;
}

#endif /* KVC_TEST_CHECK_H */
