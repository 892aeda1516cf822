/* The context's error message: every layer that fails a call records why here, below the backends. */
#include "core/internal.h"

#include <stdio.h>

fa_status fa_fail(fa_context *ctx, fa_status status, const char *fmt, ...) {
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
        va_end(ap);
    }
    return status;
}
