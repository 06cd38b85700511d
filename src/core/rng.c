/* rng.c: Philox4x32-10 (Salmon et al., SC'11) and the normal sampler used
 * for weight initialisation.  Deterministic for a given (seed, stream,
 * index) on any rank; not a cryptographic generator. */
#include "mt_rng.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void mt_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

uint32_t mt_rng_stream(const char *name)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h;
}

static void draw(uint64_t seed, uint32_t stream, uint64_t index, uint32_t out[4])
{
    uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), stream, 0x6d747261u /* "mtra" */};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    mt_philox4x32(ctr, key, out);
}

/* 53-bit uniform strictly inside (0, 1). */
static double to_unit(uint32_t hi, uint32_t lo)
{
    uint64_t bits = ((uint64_t)hi << 21) ^ (lo >> 11); /* 53 bits */
    bits &= (1ull << 53) - 1;
    return ((double)bits + 0.5) * (1.0 / 9007199254740992.0);
}

double mt_rng_uniform(uint64_t seed, uint32_t stream, uint64_t index)
{
    uint32_t o[4];
    draw(seed, stream, index, o);
    return to_unit(o[0], o[1]);
}

double mt_rng_normal(uint64_t seed, uint32_t stream, uint64_t index)
{
    uint32_t o[4];
    draw(seed, stream, index, o);
    double u1 = to_unit(o[0], o[1]), u2 = to_unit(o[2], o[3]);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

void mt_rng_fill_normal(float *out, int64_t n, uint64_t seed, uint32_t stream, uint64_t first,
                        float std)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = (float)(std * mt_rng_normal(seed, stream, first + (uint64_t)i));
}
