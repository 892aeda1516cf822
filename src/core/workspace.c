#define _POSIX_C_SOURCE 200809L /* posix_memalign, sysconf */
/* The CPU context's workspace, grown and never shrunk, so that the hot call allocates only when a shape grows. */
#include "core/internal.h"

#include <stdlib.h>
#include <unistd.h>

static void *grow(fa_context *ctx, void **buf, size_t *have, size_t bytes) {
    if (bytes <= *have) return *buf;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && (double)bytes > 0.8 * (double)pages * (double)page) {
        fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "workspace: the call needs %.2f GB, more than 80%% of this machine's "
                "%.2f GB of memory", (double)bytes / 1e9, (double)pages * (double)page / 1e9);
        return NULL;
    }
    size_t size = (bytes + 4095) & ~(size_t)4095;
    void *p = NULL;
    if (posix_memalign(&p, 4096, size) != 0 || !p) {
        fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "workspace: cannot allocate %zu bytes", size);
        return NULL;
    }
    free(*buf);
    *buf = p;
    *have = size;
    return p;
}

void *fa_workspace(fa_context *ctx, size_t bytes) { return grow(ctx, &ctx->ws, &ctx->ws_size, bytes); }
void *fa_workspace_in(fa_context *ctx, size_t bytes) { return grow(ctx, &ctx->ws_in, &ctx->ws_in_size, bytes); }
