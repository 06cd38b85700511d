/* mt_rng.h: counter-based random numbers (Philox4x32-10).
 *
 * A value is a pure function of (seed, stream, index): no state, so any
 * rank can generate exactly the elements of its own shard, and initial
 * weights never depend on how the model is laid out.  The stream of a
 * parameter is derived from its Hugging Face name (mt_rng_stream). */
#ifndef MT_RNG_H
#define MT_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Philox4x32 with 10 rounds: counter ctr[4], key key[2] -> out[4]. */
void mt_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* A 32-bit stream id from a name (FNV-1a). */
uint32_t mt_rng_stream(const char *name);

/* Uniform in (0, 1) and standard normal (Box-Muller) for element `index`
 * of `stream` under `seed`. */
double mt_rng_uniform(uint64_t seed, uint32_t stream, uint64_t index);
double mt_rng_normal(uint64_t seed, uint32_t stream, uint64_t index);

/* out[i] = std * normal(seed, stream, first + i) for i < n. */
void mt_rng_fill_normal(float *out, int64_t n, uint64_t seed, uint32_t stream, uint64_t first,
                        float std);

#ifdef __cplusplus
}
#endif
#endif
