/* kernels_cpu_tile.h: the tile helpers the tiled attention kernels share,
 * the dense one (kernels_cpu_attention.c) and the block one of ring
 * attention (kernels_cpu_attention_block.c).  Not installed. */
#ifndef MT_KERNELS_CPU_TILE_H
#define MT_KERNELS_CPU_TILE_H

#include <cblas.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* C = op(A) op(B) + beta C, row-major, on the calling thread. */
static inline void mt_tile_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                                 int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                                 int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, 1.0f, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* Called first thing inside the parallel region: nested parallelism (an
 * OpenMP OpenBLAS's) of this thread becomes single-threaded.  It sets the
 * ICV of the region's implicit task only, so the caller's is untouched. */
static inline void mt_tile_single_threaded_blas(void)
{
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
}

/* dst[r][:] = src[off[r] .. off[r]+hd) * s for r < n, rows hd apart. */
static inline void mt_tile_pack_rows(float *restrict dst, const float *restrict src,
                                     const int64_t *off, int64_t n, int64_t hd, float s)
{
    for (int64_t r = 0; r < n; r++) {
        const float *restrict x = src + off[r];
#pragma omp simd
        for (int64_t d = 0; d < hd; d++)
            dst[r * hd + d] = x[d] * s;
    }
}

/* Visible columns [*c0, *c1) of row r, whose visible keys are lo[r] ..
 * hi[r], in the key block j0..j0+nj (empty when *c0 >= *c1). */
static inline void mt_tile_row_cols(const int64_t *lo, const int64_t *hi, int64_t r, int64_t j0,
                                    int64_t nj, int64_t *c0, int64_t *c1)
{
    *c0 = (lo[r] > j0 ? lo[r] : j0) - j0;
    *c1 = (hi[r] < j0 + nj - 1 ? hi[r] : j0 + nj - 1) - j0 + 1;
}

/* s[c] = 0 for c < c0 and c1 <= c < nj (mostly nothing: skip the calls);
 * an empty range (c0 >= c1) zeroes the whole row. */
static inline void mt_tile_zero_outside(float *s, int64_t c0, int64_t c1, int64_t nj)
{
    if (c0 > 0)
        memset(s, 0, (size_t)(c0 < nj ? c0 : nj) * sizeof(float));
    if (c1 < nj)
        memset(s + (c1 > 0 ? c1 : 0), 0, (size_t)(nj - (c1 > 0 ? c1 : 0)) * sizeof(float));
}

#endif
