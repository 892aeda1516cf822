/* BLAS thread control through the BLAS's own API, looked up in the loaded image (blas.h). OpenBLAS's pthread
 * build keeps one process-wide thread count (OPENBLAS_NUM_THREADS or all cores) and ignores OpenMP's settings;
 * its OpenMP build also follows the caller's nthreads-var, which standard_blas.c sets per task. */
#if defined(__linux__) || defined(__APPLE__)
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#define FA_HAVE_DLSYM 1
#endif
#include "cpu/blas.h"

#include <stdio.h>

typedef int (*get_int_fn)(void);
typedef void (*set_int_fn)(int);
typedef char *(*get_str_fn)(void);

static void *sym(const char *name) {
#ifdef FA_HAVE_DLSYM
    return dlsym(RTLD_DEFAULT, name);
#else
    (void)name;
    return NULL;
#endif
}

int fa_cpu_blas_set_threads(int n) {
    /* object-to-function pointer conversion through a union: what dlsym's contract needs, without -Wpedantic noise */
    union { void *p; get_int_fn f; } get = {sym("openblas_get_num_threads")}, par = {sym("openblas_get_parallel")};
    union { void *p; set_int_fn f; } set = {sym("openblas_set_num_threads")};
    /* the OpenMP build's setter also sets the caller's nthreads-var: leave that build to the per-task ICV */
    if (!get.p || !set.p || !par.p || par.f() == 2) return 0;
    const int old = get.f();
    if (n > 0 && n != old) set.f(n);
    return old;
}

void fa_cpu_blas_describe(char *buf, size_t n) {
    union { void *p; get_str_fn f; } config = {sym("openblas_get_config")}, core = {sym("openblas_get_corename")};
    union { void *p; get_int_fn f; } par = {sym("openblas_get_parallel")}, threads = {sym("openblas_get_num_threads")};
    if (!config.p) {
        snprintf(buf, n, "none");
        return;
    }
    const int mode = par.p ? par.f() : -1;
    snprintf(buf, n, "%s, core %s (%s build, %d threads)", config.f(), core.p ? core.f() : "?",
             mode == 0 ? "sequential" : mode == 1 ? "pthread" : mode == 2 ? "OpenMP" : "unknown",
             threads.p ? threads.f() : 0);
}
