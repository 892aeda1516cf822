/* The ring constructors' thread-local message: comm.c and both transports set it, so it sits below all of them. */
#include "dist/ring.h"

#include <stdio.h>

static _Thread_local char create_err[FA_ERR_LEN];

const char *fa_ring_create_error(void) { return create_err; }

fa_status fa_ring_create_fail(fa_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(create_err, sizeof create_err, fmt, ap);
    va_end(ap);
    return status;
}

void fa_ring_create_ok(void) { create_err[0] = 0; }
