/* flashattn CLI: buffers on the device a context runs on. Host memory (64-byte aligned) for the CPU backend;
 * CUDA runtime memory, copies and events for the CUDA backend when the tools are built with CUDA
 * (FA_TOOLS_CUDA), otherwise every CUDA request fails cleanly. */
#define _DEFAULT_SOURCE /* madvise */
#include "common.h"
#include "cpu/simd/kernels.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef FA_TOOLS_CUDA
#include <cuda_runtime_api.h>
#endif

int cuda_tools_built(void) {
#ifdef FA_TOOLS_CUDA
    return 1;
#else
    return 0;
#endif
}

int dev_alloc(dev_buf *b, fa_backend dev, size_t bytes) {
    b->dev = dev;
    b->ptr = NULL;
    b->bytes = bytes;
    size_t sz = (bytes + 63) & ~(size_t)63;
    if (sz == 0) sz = 64;
    if (dev == FA_BACKEND_CPU) {
        b->ptr = aligned_alloc(64, sz);
        return b->ptr ? 0 : -1;
    }
#ifdef FA_TOOLS_CUDA
    void *p = NULL;
    if (cudaMalloc(&p, sz) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    b->ptr = p;
    return 0;
#else
    return -1;
#endif
}

void *host_alloc(size_t n, int huge) {
    if (!huge) return malloc(n ? n : 1);
    const size_t hp = (size_t)2 << 20, sz = (n + hp - 1) / hp * hp;
    void *p = aligned_alloc(hp, sz ? sz : hp);
    if (p) madvise(p, sz ? sz : hp, MADV_HUGEPAGE); /* advice only: without THP the pages stay 4 KB */
    return p;
}

int dev_alloc_pages(dev_buf *b, fa_backend dev, size_t bytes, int huge) {
    if (dev != FA_BACKEND_CPU || !huge) return dev_alloc(b, dev, bytes);
    b->dev = dev, b->bytes = bytes, b->ptr = host_alloc(bytes, 1);
    return b->ptr ? 0 : -1;
}

void dev_free(dev_buf *b) {
    if (!b->ptr) return;
    if (b->dev == FA_BACKEND_CPU) free(b->ptr);
#ifdef FA_TOOLS_CUDA
    else cudaFree(b->ptr);
#endif
    b->ptr = NULL;
}

int dev_upload(dev_buf *b, const void *host, size_t bytes) {
    if (b->dev == FA_BACKEND_CPU) {
        memcpy(b->ptr, host, bytes);
        return 0;
    }
#ifdef FA_TOOLS_CUDA
    return cudaMemcpy(b->ptr, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
#else
    return -1;
#endif
}

int dev_upload_tiled(dev_buf *b, const void *host, size_t block) {
    if (block == 0 || block >= b->bytes) return dev_upload(b, host, block < b->bytes ? block : b->bytes);
    dev_buf head = *b;
    head.bytes = block;
    if (dev_upload(&head, host, block)) return -1;
    for (size_t done = block; done < b->bytes;) { /* double the filled prefix: log2(bytes / block) copies */
        const size_t n = done < b->bytes - done ? done : b->bytes - done;
        char *dst = (char *)b->ptr + done;
        if (b->dev == FA_BACKEND_CPU) {
            memcpy(dst, b->ptr, n);
        } else {
#ifdef FA_TOOLS_CUDA
            if (cudaMemcpy(dst, b->ptr, n, cudaMemcpyDeviceToDevice) != cudaSuccess) return -1;
#else
            return -1;
#endif
        }
        done += n;
    }
    return 0;
}

int dev_download(const dev_buf *b, void *host, size_t bytes) {
    if (b->dev == FA_BACKEND_CPU) {
        memcpy(host, b->ptr, bytes);
        return 0;
    }
#ifdef FA_TOOLS_CUDA
    return cudaMemcpy(host, b->ptr, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
#else
    return -1;
#endif
}

int dev_fill_nan(dev_buf *b) {
    if (b->dev == FA_BACKEND_CPU) {
        memset(b->ptr, 0xff, b->bytes);
        return 0;
    }
#ifdef FA_TOOLS_CUDA
    return cudaMemset(b->ptr, 0xff, b->bytes) == cudaSuccess ? 0 : -1;
#else
    return -1;
#endif
}

#ifdef FA_TOOLS_CUDA
int dev_read_all(const void *ptr, size_t bytes, void *sink4); /* device_read.cu */
#endif

int dev_read(const dev_buf *b, dev_buf *sink) {
#ifdef FA_TOOLS_CUDA
    if (b->dev == FA_BACKEND_CUDA && sink->dev == FA_BACKEND_CUDA && sink->bytes >= 4)
        return dev_read_all(b->ptr, b->bytes, sink->ptr);
#else
    (void)b, (void)sink;
#endif
    return -1;
}

int dev_sync(fa_backend dev) {
    if (dev == FA_BACKEND_CPU) return 0;
#ifdef FA_TOOLS_CUDA
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
#else
    return -1;
#endif
}

struct dev_timer {
    fa_backend dev;
    double t0;
#ifdef FA_TOOLS_CUDA
    cudaEvent_t e0, e1;
#endif
};

dev_timer *dev_timer_create(fa_backend dev) {
    dev_timer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->dev = dev;
#ifdef FA_TOOLS_CUDA
    if (dev == FA_BACKEND_CUDA && (cudaEventCreate(&t->e0) != cudaSuccess || cudaEventCreate(&t->e1) != cudaSuccess)) {
        free(t);
        return NULL;
    }
#endif
    return t;
}

void dev_timer_start(dev_timer *t) {
#ifdef FA_TOOLS_CUDA
    if (t->dev == FA_BACKEND_CUDA) {
        cudaEventRecord(t->e0, 0);
        return;
    }
#endif
    t->t0 = now_ms();
}

double dev_timer_stop(dev_timer *t) {
#ifdef FA_TOOLS_CUDA
    if (t->dev == FA_BACKEND_CUDA) {
        float ms = 0;
        cudaEventRecord(t->e1, 0);
        cudaEventSynchronize(t->e1);
        cudaEventElapsedTime(&ms, t->e0, t->e1);
        return ms;
    }
#endif
    return now_ms() - t->t0;
}

void dev_timer_destroy(dev_timer *t) {
    if (!t) return;
#ifdef FA_TOOLS_CUDA
    if (t->dev == FA_BACKEND_CUDA) {
        cudaEventDestroy(t->e0);
        cudaEventDestroy(t->e1);
    }
#endif
    free(t);
}

int64_t cuda_smem_per_sm(void) {
#ifdef FA_TOOLS_CUDA
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess)
        return v;
#endif
    return 0;
}

int64_t cuda_mem_free(void) {
#ifdef FA_TOOLS_CUDA
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) return (int64_t)fr;
#endif
    return 0;
}

void device_describe(fa_backend dev, int threads, char *buf, size_t len) {
    if (dev == FA_BACKEND_CUDA) {
#ifdef FA_TOOLS_CUDA
        struct cudaDeviceProp p;
        int d = 0;
        if (cudaGetDevice(&d) == cudaSuccess && cudaGetDeviceProperties(&p, d) == cudaSuccess) {
            snprintf(buf, len, "%s (%d SMs, %d KiB smem/SM)", p.name, p.multiProcessorCount,
                     (int)(p.sharedMemPerMultiprocessor / 1024));
            return;
        }
#endif
        snprintf(buf, len, "cuda (unavailable)");
        return;
    }
    char model[128] = "cpu";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) == 0) {
                char *c = strchr(line, ':');
                if (c) {
                    c++;
                    while (*c == ' ') c++;
                    snprintf(model, sizeof model, "%s", c);
                    model[strcspn(model, "\n")] = 0;
                }
                break;
            }
        }
        fclose(f);
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    /* the kernel level a context created now runs, and the dispatcher's reason (simd/dispatch.c) */
    const fa_cpu_kernels *K = NULL;
    char why[256];
    if (fa_cpu_kernels_select(&K, why, sizeof why) != FA_OK) snprintf(why, sizeof why, "none");
    snprintf(buf, len, "%s, %ld cores, %d threads, kernels %s", model, ncpu, threads, why);
}
