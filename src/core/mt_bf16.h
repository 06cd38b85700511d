/* mt_bf16.h: bfloat16 bits <-> float32, the one definition (not
 * installed).  Inline, so the kernels' loops (kernels_cpu*.c), the bf16
 * wire (comm_bf16.c) and the safetensors codec (safetensors.c) share it
 * without a call per element. */
#ifndef MT_BF16_H
#define MT_BF16_H

#include <stdint.h>
#include <string.h>

/* float32 -> bfloat16, rounding to nearest even; NaN stays a quiet NaN
 * (sign kept), infinities stay, a carry into the exponent may round up to
 * infinity. */
static inline uint16_t mt_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* exact */
static inline float mt_bf16_to_f32(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
