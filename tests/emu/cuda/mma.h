/* mma.h: nvcuda::wmma for the host emulation of the CUDA kernels
 * (tests/emu/cuda), bf16 16x16x16 with fp32 accumulators, as
 * src/cuda_attention_tc.cu uses it.
 *
 * Each lane holds the WHOLE 16x16 fragment (x[r*16 + c]), computed
 * redundantly, so element-wise code that is right for any element mapping
 * is right here too; a store writes only the lane's 8 elements, as the
 * hardware's lanes each write theirs.  Loads and stores check what the device requires:
 * ldm a multiple of 16 bytes, the pointer 32-byte aligned, and (as the
 * kernels stage every tile there) the 16x16 footprint inside the block's
 * dynamic shared memory.  mma is an fp32 loop: the tensor cores' order
 * and rounding of the sums are not modelled. */
#ifndef MT_EMU_MMA_H
#define MT_EMU_MMA_H

#include <string.h>

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation models 16x16x16 only");
    enum { num_elements = 256 };
    float x[256];
};

static inline void emu_check(const void *p, unsigned ldm, size_t esize)
{
    const unsigned char *c = (const unsigned char *)p;
    if (ldm % (esize == 2 ? 8 : 4))
        emu_kernel_fail("wmma: ldm is not a multiple of 16 bytes");
    if ((uintptr_t)c % 32)
        emu_kernel_fail("wmma: pointer not 32-byte aligned");
    if (c < emu_smem || c + (15 * (size_t)ldm + 16) * esize > emu_smem + emu_smem_bytes)
        emu_kernel_fail("wmma: 16x16 footprint outside the dynamic shared memory");
}

template <typename Use, typename L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, L> &f,
                                    const __nv_bfloat16 *p, unsigned ldm)
{
    emu_check(p, ldm, 2);
    const bool rm = std::is_same<L, row_major>::value;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = __bfloat162float(rm ? p[r * ldm + c] : p[c * ldm + r]);
}

static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                                    unsigned ldm, layout_t l)
{
    emu_check(p, ldm, 4);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

/* a store is the warp's: each lane writes its share, 8 of the 256
 * elements, so a lane that reads the tile before the others have written
 * theirs (no __syncwarp between) reads what was there before */
static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                                     unsigned ldm, layout_t l)
{
    emu_check(p, ldm, 4);
    for (int e = emu_lane() * 8; e < emu_lane() * 8 + 8; e++) {
        const int r = e / 16, c = e % 16;
        (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
    }
}

template <typename Use, typename T, typename L>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, float v)
{
    for (int i = 0; i < 256; i++)
        f.x[i] = v;
}

template <typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c)
{
    /* each sum in k order; the loops run r, k, n so that the compiler
     * vectorises over n without reordering any sum */
    float out[256];
    memcpy(out, c.x, sizeof out);
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < 16; k++) {
            const float ark = a.x[r * 16 + k];
            for (int n = 0; n < 16; n++)
                out[r * 16 + n] += ark * b.x[k * 16 + n];
        }
    memcpy(d.x, out, sizeof out);
}
} /* namespace wmma */
} /* namespace nvcuda */

#endif
