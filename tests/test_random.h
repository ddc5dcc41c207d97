/*
 * test_random.h: the tests' random numbers (xorshift64*, seeded per case), so that every
 * test program draws the same way and a failing case can be replayed from its seed.
 */
#ifndef TP_TEST_RANDOM_H
#define TP_TEST_RANDOM_H

#include <stdint.h>

static uint64_t rng_state;

static inline void seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull; }

static inline uint64_t next_u64(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static inline float uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)(next_u64() >> 40) / (float)(1 << 24);
}

static inline int rand_int(int n) /* [0, n) */ { return (int)(next_u64() % (uint64_t)n); }

/* perm[0, n) = a random permutation of 0 .. n-1 (Fisher-Yates): cache blocks in no order. */
static inline void random_permutation(int32_t *perm, int n)
{
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = rand_int(i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

#endif
