/* mma.h: nvcuda::wmma for the host emulation of the CUDA kernels
 * (tests/emu/cuda), bf16 16x16x16 with fp32 accumulators, as
 * src/backend/cuda/cuda_attention_tc.cu uses it.
 *
 * A and B fragments hold the whole 16x16 tile in every lane; an
 * accumulator holds the lane's 8 elements (num_elements 8, as on the
 * device) in a mapping of the emulation's own, so element-wise code is
 * right here only if it is right for any mapping (the kernels find each
 * element's row through a probe fragment), and a store writes only the
 * lane's elements, as the hardware's lanes each write theirs.  Loads and stores check what the device requires:
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

/* A and B operands: the whole tile in every lane */
template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation models 16x16x16 only");
    enum { num_elements = 256 };
    float x[256];
};
/* accumulators: the lane's 8 elements, element i of lane l at row l / 2,
 * column (l % 2) * 8 + i (the device's own mapping is another, and the
 * kernels may assume none) */
template <int M, int N, int K> struct fragment<accumulator, M, N, K, float, void> {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation models 16x16x16 only");
    enum { num_elements = 8 };
    float x[8];
};
static inline int acc_row(void) { return emu_lane() / 2; }
static inline int acc_col(int i) { return (emu_lane() % 2) * 8 + i; }

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
    const int r = acc_row();
    for (int i = 0; i < 8; i++) {
        const int c = acc_col(i);
        f.x[i] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
    }
}

/* each lane writes only its 8 elements, as the hardware's lanes do: a
 * lane that reads the tile before the others have written theirs (no
 * __syncwarp between) reads what was there before */
static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                                     unsigned ldm, layout_t l)
{
    emu_check(p, ldm, 4);
    const int r = acc_row();
    for (int i = 0; i < 8; i++) {
        const int c = acc_col(i);
        (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[i];
    }
}

template <typename Use, typename T, typename L>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, float v)
{
    for (int i = 0; i < (int)fragment<Use, 16, 16, 16, T, L>::num_elements; i++)
        f.x[i] = v;
}

/* the lane's 8 results, each sum in k order from c */
template <typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c)
{
    const int r = acc_row();
    float out[8];
    for (int i = 0; i < 8; i++) {
        const int col = acc_col(i);
        float s = c.x[i];
        for (int k = 0; k < 16; k++)
            s += a.x[r * 16 + k] * b.x[k * 16 + col];
        out[i] = s;
    }
    memcpy(d.x, out, sizeof out);
}
} /* namespace wmma */
} /* namespace nvcuda */

#endif
