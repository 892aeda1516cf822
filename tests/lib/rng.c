/* xoshiro256** (Blackman and Vigna), seeded through splitmix64. */
#include "rng.h"

#include <math.h>

t_rng t_default_rng;

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void t_rng_seed(t_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

uint64_t t_rng_u64(t_rng *r) {
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double t_rng_uniform(t_rng *r) { return (double)(t_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

double t_rng_randn(t_rng *r) {
    double u1 = t_rng_uniform(r), u2 = t_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int t_rng_int(t_rng *r, int lo, int hi) { return lo + (int)(t_rng_u64(r) % (uint64_t)(hi - lo + 1)); }

uint64_t t_rand_u64(void) { return t_rng_u64(&t_default_rng); }
double t_uniform(void) { return t_rng_uniform(&t_default_rng); }
double t_randn(void) { return t_rng_randn(&t_default_rng); }
int t_randint(int lo, int hi) { return t_rng_int(&t_default_rng, lo, hi); }
