/* The header can be included twice (include guard) and compiles on its own,
 * with nothing included before it; the version macros are usable in #if. */
#include "kvcore.h"
#include "kvcore.h"

#include <stdio.h>

#if !defined(KVCORE_VERSION_MAJOR) || !defined(KVCORE_VERSION_MINOR) || !defined(KVCORE_VERSION_PATCH)
#error "kvcore.h must define the version macros"
#endif

#if KVCORE_VERSION_MAJOR < 0
#error "the version macros must be integer constants"
#endif

int main(void) {
    /* kvc_event is a fixed-size record: 136 bytes, no padding, 8-aligned;
     * kvc_block_copy 28 bytes (seven uint32_t). */
    int ok = sizeof(kvc_event) == 136 && _Alignof(kvc_event) == 8 && sizeof(kvc_block_copy) == 28;
    if (!ok) {
        fprintf(stderr, "double_include: unexpected record layout\n");
        return 1;
    }
    printf("double_include: all checks passed\n");
    return 0;
}
