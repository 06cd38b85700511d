/* cuda_bf16.h: __nv_bfloat16 for the host emulation of the CUDA kernels
 * (tests/emu/cuda): the bits, round to nearest even (NaN kept, as the
 * device's __float2bfloat16_rn keeps it), and the conversions the
 * kernels use. */
#ifndef MT_EMU_CUDA_BF16_H
#define MT_EMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    uint16_t u;
};
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) { /* NaN: the canonical one */
        h.u = 0x7fffu;
        return h;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    h.u = (uint16_t)(u >> 16);
    return h;
}

static inline float __bfloat162float(__nv_bfloat16 h)
{
    const uint32_t u = (uint32_t)h.u << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
    __nv_bfloat162 r = {__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
    return r;
}

#endif
