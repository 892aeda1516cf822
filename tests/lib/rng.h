/* The tests' random numbers: xoshiro256** seeded through splitmix64. A state is explicit (t_rng) where a caller
 * needs its own stream, as `flashattn check` does per case; the t_rand_* functions draw from the stream that
 * t_init seeded from FA_TEST_SEED. */
#ifndef FA_TESTLIB_RNG_H
#define FA_TESTLIB_RNG_H

#include <stdint.h>

typedef struct t_rng {
    uint64_t s[4];
} t_rng;

void t_rng_seed(t_rng *r, uint64_t seed);
uint64_t t_rng_u64(t_rng *r);
double t_rng_uniform(t_rng *r);             /* [0, 1) */
double t_rng_randn(t_rng *r);               /* N(0, 1) */
int t_rng_int(t_rng *r, int lo, int hi);    /* [lo, hi] */

/* The default stream (seeded by t_init). */
extern t_rng t_default_rng;
uint64_t t_rand_u64(void);
double t_uniform(void);
double t_randn(void);
int t_randint(int lo, int hi);

#endif
