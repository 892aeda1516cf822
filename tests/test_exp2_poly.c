/* fa3_exp2_poly (src/cuda/wgmma/exp2_poly.h), the FMA-pipe 2^x of the FLASH3 backward's Pᵀ at d = 64, on the host:
 * the same source the kernel compiles, checked against exp2 in double. Its contract is MUFU's ex2.approx.ftz on the
 * clamped argument: 2^x for −126 <= x <= 0 within a relative 2^-12 (Pᵀ is rounded to bf16 or f16 after it), exactly
 * +0 below −126 and for −inf, 1 for x >= 0, NaN for NaN, and exact powers of two at integers. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda/wgmma/exp2_poly.h"

static int failures;

static float from_bits(uint32_t b) {
    float x;
    memcpy(&x, &b, 4);
    return x;
}
static uint32_t bits(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}

/* got must be exactly want, bit for bit (so +0 is not −0) */
static void expect_exact(float x, float want) {
    const float got = fa3_exp2_poly(x);
    if (bits(got) != bits(want)) {
        printf("FAIL x = %a: got %a, want %a\n", x, got, want);
        failures++;
    }
}

static double max_rel;
static float worst_x;
static long checked;

/* one swept value: relative error against 2^x in double where MUFU gives a normal number, exactly +0 where it
 * flushes */
static void sweep_one(float x) {
    const float got = fa3_exp2_poly(x);
    const double xc = x > 0.f ? 0.0 : x < -127.f ? -127.0 : (double)x;
    checked++;
    if (xc < -126.0) {
        if (bits(got) != 0) {
            printf("FAIL x = %a: got %a, want +0 (below 2^-126, flushed)\n", x, got);
            failures++;
        }
        return;
    }
    const double want = exp2(xc), rel = fabs((double)got - want) / want;
    if (!(rel <= max_rel)) max_rel = rel, worst_x = x; /* a NaN got sticks */
}

int main(void) {
    /* special values */
    expect_exact(0.f, 1.f);
    expect_exact(-0.f, 1.f);
    expect_exact(-INFINITY, 0.f);
    expect_exact(-126.5f, 0.f);
    expect_exact(-127.f, 0.f);
    expect_exact(-127.5f, 0.f);
    expect_exact(-1e30f, 0.f);
    expect_exact(1e-7f, 1.f); /* x > 0 (rounding in the kernel) is clamped to 0 */
    expect_exact(INFINITY, 1.f);
    if (!isnan(fa3_exp2_poly(NAN)) || !isnan(fa3_exp2_poly(-NAN))) {
        printf("FAIL NaN does not give NaN\n");
        failures++;
    }
    for (int n = -126; n <= 0; n++) expect_exact((float)n, ldexpf(1.f, n)); /* integers exact: p(0) = 1 */

    sweep_one(-FLT_MIN); /* f = x + 1 rounds to 1: p(1)·2^-1 */
    /* f on a fine grid: x = −k·2^-24 in [−1, 0), every f = x − floor(x) the kernel meets at this resolution */
    for (uint32_t k = 1; k <= (1u << 24); k++) sweep_one(-(float)k * 0x1p-24f);
    /* every float in [−127.5, 0) at a stride of 29 bit patterns (odd, so that every low mantissa bit varies): all
     * exponents, the ranges near −126 and −127, and the denormals of x itself */
    for (uint32_t b = bits(-0.f) + 1; b <= bits(-127.5f); b += 29) sweep_one(from_bits(b));

    printf("test_exp2_poly: %ld values, max relative error %.3e = 2^%.2f at x = %a (bound 2^-12)\n", checked, max_rel,
           log2(max_rel), worst_x);
    if (!(max_rel <= 0x1p-12)) {
        printf("FAIL max relative error above 2^-12\n");
        failures++;
    }
    if (failures) printf("test_exp2_poly: %d FAILED\n", failures);
    else printf("test_exp2_poly: all passed\n");
    return failures != 0;
}
