/* Memory-system lab: GB/s of a plain read over a 512 MB buffer in blocks of a given size, in address order and in a
 * shuffled order (as a paged KV cache's pages come from an allocator), on all OpenMP threads; optionally with a
 * software prefetch (into L2) of the block `ahead` blocks later, line by line beside the reads. The anchor for CPU
 * decoding over small pages (docs/kvcache.md): what scattered blocks cost the machine before any kernel runs.
 *
 *   read_blocks [block_kb=32] [ahead=0]
 *
 * Not a test; built on demand (`cmake --build <dir> --target read_blocks`). */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const size_t n = (size_t)512 << 20, blk = (size_t)(argc > 1 ? atol(argv[1]) : 32) * 1024;
    const size_t ahead = argc > 2 ? (size_t)atol(argv[2]) : 0;
    if (blk < 64 || blk % 64 || n % blk) {
        fprintf(stderr, "usage: %s [block_kb dividing 512 MB] [ahead]\n", argv[0]);
        return 2;
    }
    const size_t nb = n / blk;
    char *a = aligned_alloc(4096, n);
    size_t *ord = malloc(nb * sizeof *ord);
    if (!a || !ord) return 1;
    memset(a, 1, n);
    uint64_t r = 88172645463325252ull;
    for (size_t i = 0; i < nb; i++) ord[i] = i;
    for (size_t i = nb - 1; i > 0; i--) { /* Fisher-Yates with xorshift */
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const size_t j = r % (i + 1), t = ord[i];
        ord[i] = ord[j], ord[j] = t;
    }
    for (int shuffled = 0; shuffled < 2; shuffled++) {
        double best = 1e30;
        volatile uint64_t kept = 0; /* the sums are stored, so the reads are not dropped */
        for (int rep = 0; rep < 5; rep++) {
            const double t0 = now();
            uint64_t sink = 0;
#pragma omp parallel reduction(+ : sink)
            {
                __m128i s = _mm_setzero_si128();
#pragma omp for schedule(static)
                for (size_t b = 0; b < nb; b++) {
                    const size_t bn = b + ahead < nb ? b + ahead : b;
                    const char *p = a + (shuffled ? ord[b] : b) * blk, *q = a + (shuffled ? ord[bn] : bn) * blk;
                    for (size_t o = 0; o < blk; o += 64) {
                        if (ahead) _mm_prefetch(q + o, _MM_HINT_T1);
                        s = _mm_add_epi64(s, _mm_load_si128((const __m128i *)(p + o)));
                    }
                }
                sink += (uint64_t)_mm_cvtsi128_si64(s);
            }
            const double t = now() - t0;
            kept = kept + sink;
            if (t < best) best = t;
        }
        printf("blocks of %zu KB, %s, prefetch %zu ahead: %.1f GB/s\n", blk / 1024, shuffled ? "shuffled" : "in order",
               ahead, (double)n / best * 1e-9);
    }
    free(a), free(ord);
    return 0;
}
