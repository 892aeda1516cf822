/* AMX-BF16 tile kernel: gemm_bf16 (simd/kernels.h) on TDPBF16PS, for the amx table (the avx512bf16 table with this
 * product). Built with -mamx-tile -mamx-bf16 and the AVX-512 flags (src/cpu/sources.cmake); reached only after
 * fa_cpu_amx_usable() (CPUID, XCR0 and the Linux permission request in simd/dispatch.c).
 *
 * Tiles (Intel SDM, TDPBF16PS): tmm0–3 hold a 32 × 32 fp32 block of C as 2 × 2 tiles of 16 rows × 16 columns;
 * tmm4–5 two A tiles of 16 rows × 16 words (32 bf16 of the reduction each); tmm6–7 two B tiles of 16 words of the
 * reduction × 16 columns, i.e. our pair layout B[p][j] as it is. One configuration (all 8 tiles 16 × 64 B) per
 * call; partial tiles at the edges are zero-padded copies, so no reconfiguration. docs/cpu-kernels.md, "AMX". */
#include "cpu/simd/kernels.h"

#include <immintrin.h>
#include <string.h>

/* The 64-byte palette-1 tile configuration (SDM Vol. 1, "Tile configuration"). */
typedef struct __attribute__((aligned(64))) tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

_Static_assert(sizeof(tilecfg) == 64, "ldtilecfg reads 64 bytes");

/* gcc's tile intrinsics are asm statements without memory operands: this makes stores before a tile load (and
 * loads after a tile store) stay where they are written. */
#define TILE_FENCE() __asm__ volatile("" ::: "memory")

/* Reduction words per chunk: C stays in its tiles over one chunk; A, B edge copies are chunk-sized. */
#define KC 256

/* dst[r][q] = src(r, q) = src[r·rs + q·cs] for r < nr, q < nq, 0 elsewhere in R × Q (row stride Q words). */
static void pad_copy(const uint32_t *src, ptrdiff_t rs, ptrdiff_t cs, int nr, int nq, uint32_t *dst, int R, int Q) {
    for (int r = 0; r < R; r++)
        for (int q = 0; q < Q; q++) dst[r * Q + q] = r < nr && q < nq ? src[r * rs + q * cs] : 0u;
}

void fa_amx_gemm_bf16(int m, int n, int kp, const uint32_t *A, ptrdiff_t rsa, ptrdiff_t csa, const uint32_t *B,
                      int ldb, float *C, int ldc, int acc) {
    uint32_t Ab[32 * KC] __attribute__((aligned(64)));
    uint32_t Bb[KC * 32] __attribute__((aligned(64)));
    float Cb[32 * 32] __attribute__((aligned(64)));
    if (kp <= 0) {
        if (!acc)
            for (int i = 0; i < m; i++) memset(C + (ptrdiff_t)i * ldc, 0, (size_t)n * sizeof(float));
        return;
    }
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    TILE_FENCE();
    _tile_loadconfig(&cfg);

    for (int p0 = 0; p0 < kp; p0 += KC) {
        const int kc = kp - p0 < KC ? kp - p0 : KC, kcp = (kc + 15) & ~15;
        const int first = p0 == 0 && !acc;
        for (int i0 = 0; i0 < m; i0 += 32) {
            const int mr = m - i0 < 32 ? m - i0 : 32;
            /* A rows i0..i0+31, words p0..p0+kc: in place when whole rows of whole tiles, else a padded copy */
            const uint32_t *a = A + (ptrdiff_t)i0 * rsa + (ptrdiff_t)p0 * csa;
            long sa = (long)rsa * 4;
            if (csa != 1 || mr < 32 || kc != kcp) {
                pad_copy(a, rsa, csa, mr, kc, Ab, 32, kcp);
                a = Ab, sa = (long)kcp * 4;
            }
            for (int j0 = 0; j0 < n; j0 += 32) {
                const int nc = n - j0 < 32 ? n - j0 : 32;
                const uint32_t *b = B + (ptrdiff_t)p0 * ldb + j0;
                long sb = (long)ldb * 4;
                if (nc < 32 || kc != kcp) {
                    pad_copy(b, ldb, 1, kc, nc, Bb, kcp, 32);
                    b = Bb, sb = 32 * 4;
                }
                const int whole = mr == 32 && nc == 32;
                float *c = C + (ptrdiff_t)i0 * ldc + j0;
                long sc = (long)ldc * 4;
                if (!whole) { /* the valid part of C in a padded 32 x 32 block */
                    for (int r = 0; r < 32; r++)
                        for (int q = 0; q < 32; q++) Cb[r * 32 + q] = !first && r < mr && q < nc ? c[(ptrdiff_t)r * ldc + q] : 0.0f;
                    c = Cb, sc = 32 * 4;
                }
                TILE_FENCE();
                if (first && whole) {
                    _tile_zero(0);
                    _tile_zero(1);
                    _tile_zero(2);
                    _tile_zero(3);
                } else {
                    _tile_loadd(0, c, sc);
                    _tile_loadd(1, c + 16, sc);
                    _tile_loadd(2, c + 16 * (sc / 4), sc);
                    _tile_loadd(3, c + 16 * (sc / 4) + 16, sc);
                }
                for (int p = 0; p < kcp; p += 16) {
                    _tile_loadd(4, a + p, sa);
                    _tile_loadd(5, a + 16 * (sa / 4) + p, sa);
                    _tile_loadd(6, b + (ptrdiff_t)p * (sb / 4), sb);
                    _tile_loadd(7, b + (ptrdiff_t)p * (sb / 4) + 16, sb);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
                _tile_stored(0, c, sc);
                _tile_stored(1, c + 16, sc);
                _tile_stored(2, c + 16 * (sc / 4), sc);
                _tile_stored(3, c + 16 * (sc / 4) + 16, sc);
                TILE_FENCE();
                if (!whole) {
                    float *cc = C + (ptrdiff_t)i0 * ldc + j0;
                    for (int r = 0; r < mr; r++) memcpy(cc + (ptrdiff_t)r * ldc, Cb + r * 32, (size_t)nc * sizeof(float));
                }
            }
        }
    }
    _tile_release();
}
