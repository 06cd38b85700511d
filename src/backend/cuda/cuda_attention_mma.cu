/* cuda_attention_mma.cu: causal grouped-query attention on tensor cores
 * through mma.sync (m16n8k16, bf16 operands, fp32 accumulators), forward
 * and backward: the bf16 tables' attention for head dims 64 and 128 on
 * compute capability 8.0 and up (MESHTRAIN_ATTENTION_KERNEL=wmma takes
 * the WMMA kernels of cuda_attention_tc.cu instead; doc/gpu.md).
 *
 * Same contract, tiles and arithmetic as the WMMA kernels: S = Q K^T,
 * the online softmax, O += P V; in the backward S and dP = dO V^T
 * recomputed, P = exp(S scale - lse), dS = P (dP - D), dQ = scale dS K,
 * dV = P^T dO, dK = scale dS^T Q; P and dS rounded to bf16 as operands,
 * everything else fp32.  Blocks of 4 warps; a warp owns 16 rows (queries
 * in the forward and dq, keys in dk/dv); tiles of 64.
 *
 * What differs is where S lives: in registers.  With mma.sync's
 * documented fragment layout (cuda_attention_tc.cuh) a lane knows the
 * rows and columns of its accumulator elements, so the masks, the row
 * maxima and sums (over the 4 lanes of a row) and the rescaling of O run
 * on the accumulators, and an m16n8 accumulator pair is already the A
 * operand of the next product (FlashAttention-2's register reuse): no
 * trip of S, P or dS through shared memory, which the WMMA kernels need
 * because a WMMA fragment's layout is unspecified.  Every tile is
 * row-major bf16 [64][HD+8], and the fragments load through ldmatrix:
 * the B operands of Q K^T, dO V^T, K Q^T and V dO^T (the reduced
 * dimension along a row) as they are, those of P V, dS K, P^T dO and
 * dS^T Q (along a column) with .trans, which transposes 8x8 blocks on
 * the way to registers.
 *
 * Every output element is summed by one warp in a fixed order: the
 * passes are deterministic without atomics.  Tiles come in by
 * cp.async, double-buffered in dq and dk/dv, and in the forward at head
 * dim 64.  Not here: more than 16 rows a warp (B fragments reused across
 * row tiles), wgmma/TMA (Hopper's FlashAttention-3). */
#include <float.h>

#include "cuda_attention_tc.cuh"
/* (here, not in the header: the host emulation rewrites it in .cu files) */
#define TC_DECLARE_SMEM(name) extern __shared__ __align__(128) unsigned char name[]

/* ------------------------------------------------------------------ tiles and fragments */

/* x and y as bf16 (nearest even), x in the low half */
__device__ __forceinline__ uint32_t ma_pack(float x, float y)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

/* The A fragment of 16 columns from two m16n8 accumulators (columns
 * 0..8 and 8..16 of the 16): the accumulator layout is the A layout. */
__device__ __forceinline__ void ma_acc_to_a(uint32_t a[4], const float *c0, const float *c1)
{
    a[0] = ma_pack(c0[0], c0[1]);
    a[1] = ma_pack(c0[2], c0[3]);
    a[2] = ma_pack(c1[0], c1[1]);
    a[3] = ma_pack(c1[2], c1[3]);
}

/* acc[nb] = A B^T for the 8-column blocks nb in [nb0, nb1) of a 64-wide
 * tile (nb0, nb1 even): A the warp's 16 rows (from a0) of a [.][HD+8]
 * tile, B^T the rows of another (Bs row nb*8.. is B's column), both
 * row-major over HD.  Fragments through ldmatrix: an A fragment once for
 * all the column blocks, B two column blocks a call. */
template <int HD>
__device__ __forceinline__ void ma_dot(float acc[8][4], const tc_bf16 *As, int a0,
                                       const tc_bf16 *Bs, int nb0, int nb1)
{
    const int LDH = HD + 8, l = threadIdx.x % 32;
#pragma unroll
    for (int nb = 0; nb < 8; nb++)
        acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.0f;
    const tc_bf16 *arow = As + (a0 + (l & 7) + 8 * ((l >> 3) & 1)) * LDH + 8 * (l >> 4);
    const tc_bf16 *brow = Bs + ((l & 7) + 8 * (l >> 4)) * LDH + 8 * ((l >> 3) & 1);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t a[4];
        mt_ldmatrix_x4<false>(a, arow + kk * 16);
#pragma unroll
        for (int nb = 0; nb < 8; nb += 2) {
            if (nb < nb0 || nb >= nb1)
                continue; /* warp-uniform */
            uint32_t b[4];
            mt_ldmatrix_x4<false>(b, brow + nb * 8 * LDH + kk * 16);
            mt_mma_bf16_16816(acc[nb], a, b);
            mt_mma_bf16_16816(acc[nb + 1], a, b + 2);
        }
    }
}

/* out[nd] += X Y over the 16-column steps kf in [kf0, kf1) of X (the
 * accumulators x, rounded to bf16) for all HD/8 output blocks; Y is a
 * row-major bf16 tile [.][HD+8] (row k, column d), whose B fragments
 * ldmatrix.trans gives two output blocks at a time */
template <int HD>
__device__ __forceinline__ void ma_accum(float out[HD / 8][4], float x[8][4], const tc_bf16 *Y,
                                         int kf0, int kf1)
{
    const int LDH = HD + 8, l = threadIdx.x % 32;
#pragma unroll
    for (int kf = 0; kf < 4; kf++) {
        if (kf < kf0 || kf >= kf1)
            continue;
        uint32_t a[4];
        ma_acc_to_a(a, x[2 * kf], x[2 * kf + 1]);
        const tc_bf16 *row = Y + (kf * 16 + (l & 15)) * LDH + 8 * (l >> 4);
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd += 2) {
            uint32_t b[4];
            mt_ldmatrix_x4<true>(b, row + nd * 8);
            mt_mma_bf16_16816(out[nd], a, b);
            mt_mma_bf16_16816(out[nd + 1], a, b + 2);
        }
    }
}

/* the warp's HD/8 accumulator blocks into global rows dst + r*stride of
 * the warp's 16 (rows below nrows), times f[0] (row g) and f[1] (row g+8),
 * rounded to bf16 when rnd */
template <int HD, typename T>
__device__ __forceinline__ void ma_store(T *dst, int64_t stride, int nrows,
                                         const float acc[HD / 8][4], const float f[2], bool rnd)
{
    const int l = threadIdx.x % 32, g = l >> 2, t = l & 3;
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++)
        for (int i = 0; i < 4; i++) {
            const int r = g + 8 * (i >> 1);
            if (r < nrows)
                mt_st(dst, r * stride + nd * 8 + 2 * t + (i & 1),
                      mt_bf16_if(acc[nd][i] * f[i >> 1], rnd));
        }
}

/* the lane's two query rows in a forward or dq block: wr0 + g and
 * wr0 + g + 8 (g = lane / 4), whether they exist, their positions and
 * first visible keys */
struct ma_rows_t {
    bool v[2];
    int64_t t[2], lo[2];
};

__device__ __forceinline__ ma_rows_t ma_rows(const tc_geom_t &G, const tc_qblock_t &Q)
{
    const int g8 = (threadIdx.x % 32) >> 2;
    ma_rows_t R;
    for (int i = 0; i < 2; i++) {
        R.v[i] = Q.wr0 + g8 + 8 * i < Q.nq;
        R.t[i] = Q.q0 + Q.wr0 + g8 + 8 * i;
        R.lo[i] = R.v[i] ? tc_first_key(G, Q.b, R.t[i]) : 0;
    }
    return R;
}

/* the key tile from tj0 (through qlast) and its value tile into buffer
 * buf of Kb: Ks at Kb + 2 buf TC_BK LDH, Vs TC_BK LDH after it */
template <int HD, typename T>
__device__ __forceinline__ void ma_load_kv(tc_bf16 *Kb, int buf, const T *k, const T *v,
                                           int64_t kvbase, const tc_geom_t &G, int64_t tj0,
                                           int64_t qlast)
{
    const int LDH = HD + 8, tnj = (int)tc_min64(TC_BK, qlast + 1 - tj0);
    tc_bf16 *Ks = Kb + 2 * buf * TC_BK * LDH;
    tc_load_tile<HD, TC_BK>(Ks, k + kvbase + tj0 * G.kvstride, G.kvstride, tnj, G.vec);
    tc_load_tile<HD, TC_BK>(Ks + TC_BK * LDH, v + kvbase + tj0 * G.kvstride, G.kvstride, tnj,
                            G.vec);
}

/* The forward's key/value buffers: two at head dim 64, where a second
 * costs no block on Hopper (registers hold it to 4 blocks an SM, and
 * 4 x 45 KiB of shared memory fit in 228 KiB), one at 128 (a second would
 * take its 3 blocks an SM to 2).  Tuned for sm_90: with less shared
 * memory an SM (A100's 164 KiB, sm_86/89's 100) the second buffer costs
 * the hd-64 forward a block an SM (4 to 3, 3 to 2). */
template <int HD> struct ma_fwd_bufs {
    static constexpr int n = HD <= 64 ? 2 : 1;
};

/* exp(x) as 2^(x log2 e): the tile loops' exponentials are 2^ (ma_exp2)
 * of one FMA, the softmax scale and the row's max or lse folded in (scale2 =
 * scale log2 e, FlashAttention-2's scale_log2), where expf's own range
 * reduction costs about eight instructions an element.  The CPU
 * reference uses expf; the two agree to about |x| 2^-24 relative, far
 * inside the bf16 rounding of P and dS. */
#define MA_LOG2E 1.4426950408889634f

/* 2^x by ex2.approx.ftz: one MUFU instruction.  exp2f compiles to the
 * non-flushing ex2.approx.f32, which adds a range check and two scaling
 * multiplies around it for subnormal results; flushed, a P below 2^-126
 * is 0, nothing against the row's largest, which is 1.  -inf gives 0,
 * NaN stays NaN.  (The host emulation: exp2f, its subnormal results
 * flushed.) */
__device__ __forceinline__ float ma_exp2(float x)
{
#ifdef MT_CUDA_EMULATED
    const float y = exp2f(x);
    return y < FLT_MIN ? 0.0f * y : y;
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#endif
}

/* The masks of a lane's S (or dP) accumulators as column ranges: element
 * (nb, i) of the lane is column c = nb*8 + 2*t4 + (i&1) of the tile, and
 * its query sees its key exactly when c lies in [lo, hi] of its row r =
 * i >> 1.  Stored less 2*t4, so that after unrolling the test compares a
 * constant, nb*8 + (i&1), with two registers: two 32-bit compares an
 * element, where the conditions spelled out per element (64-bit keys
 * against the row's first and last, the tile's tail, the fragment range,
 * the row's existence) cost about as many instructions as the element's
 * arithmetic.  An empty range is lo 1, hi 0. */
struct ma_cols_t {
    int lo[2], hi[2];
};
/* the accumulators' 64 columns: TC_BK keys, or in dk/dv TC_BQ queries */
static_assert(TC_BQ == TC_BK && TC_BK == 64, "ma_cols_t: 8 column blocks of 8");

__device__ __forceinline__ void ma_cols_set(ma_cols_t &C, int r, bool v, int64_t lo, int64_t hi)
{
    const int t2 = 2 * (threadIdx.x % 4);
    lo = tc_max64(lo, 0), hi = tc_min64(hi, TC_BK - 1);
    if (!v || lo > hi)
        lo = 1, hi = 0;
    C.lo[r] = (int)lo - t2, C.hi[r] = (int)hi - t2;
}

__device__ __forceinline__ bool ma_cols_in(const ma_cols_t &C, int nb, int i)
{
    const int k = nb * 8 + (i & 1);
    return k >= C.lo[i >> 1] && k <= C.hi[i >> 1];
}

/* forward and dq: the keys of the tile at j0 (nj of them, the warp's
 * fragments [kf0, kf1)) that the lane's query rows see: from the row's
 * first visible key through the row itself */
__device__ __forceinline__ ma_cols_t ma_q_cols(const ma_rows_t &R, int64_t j0, int nj, int kf0,
                                               int kf1)
{
    ma_cols_t C;
    for (int r = 0; r < 2; r++)
        ma_cols_set(C, r, R.v[r], tc_max64(R.lo[r] - j0, 16 * kf0),
                    tc_min64(tc_min64(R.t[r] - j0, nj - 1), 16 * kf1 - 1));
    return C;
}

/* ------------------------------------------------------------------ kernels */

/* shared: Qs, then ma_fwd_bufs<HD>::n buffers of Ks, Vs, bf16 [64][HD+8]
 * each.  With two, the next key tile's copies are issued before this
 * one's products and waited for a tile later, as in the dq kernel; with
 * one, a tile is copied, waited for, then used. */
template <int HD, typename T>
__global__ void __launch_bounds__(TC_THREADS)
    mt_k_attention_mma_forward(T *out, float *lse, const T *q, const T *k, const T *v,
                               tc_geom_t G)
{
    const int LDH = HD + 8;
    constexpr int NBUF = ma_fwd_bufs<HD>::n;
    TC_DECLARE_SMEM(smem);
    tc_bf16 *Qs = (tc_bf16 *)smem, *Kb = Qs + TC_BQ * LDH;

    const int t4 = threadIdx.x % 4;
    const tc_qblock_t Q = tc_qblock(G);
    const ma_rows_t R = ma_rows(G, Q);
    const int64_t b = Q.b, h = Q.h, q0 = Q.q0, qlast = Q.qlast;
    const int nq = Q.nq, wr0 = Q.wr0;
    tc_load_tile<HD, TC_BQ>(Qs, q + (b * G.T + q0) * G.qstride + h * HD, G.qstride, nq, G.vec);

    float o[HD / 8][4];
    for (int nd = 0; nd < HD / 8; nd++)
        o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float scale2 = G.scale * MA_LOG2E;
    const int64_t kvbase = b * G.T * G.kvstride + Q.g * HD;

    int64_t j0 = Q.minlo;
    if constexpr (NBUF == 2) {
        ma_load_kv<HD>(Kb, 0, k, v, kvbase, G, j0, qlast);
        mt_cp_async_commit(); /* the queries' rows and the first key tile */
    }
    for (int buf = 0; j0 <= qlast; buf ^= NBUF - 1) {
        const int64_t next = j0 + TC_BK;
        __syncthreads(); /* the buffer filled next is no longer read */
        if constexpr (NBUF == 2) {
            tc_prefetch_wait(next <= qlast,
                             [&] { ma_load_kv<HD>(Kb, buf ^ 1, k, v, kvbase, G, next, qlast); });
        } else {
            ma_load_kv<HD>(Kb, 0, k, v, kvbase, G, j0, qlast);
            mt_cp_async_wait_all();
        }
        __syncthreads(); /* every thread's copies of this tile (the first time: Qs too) */
        const int64_t tj0 = j0;
        j0 = next;
        const int nj = (int)tc_min64(TC_BK, qlast + 1 - tj0);
        if (!Q.wactive)
            continue;
        const tc_bf16 *Ks = Kb + 2 * buf * TC_BK * LDH, *Vs = Ks + TC_BK * LDH;
        int kf0, kf1;
        if (!tc_warp_frags(Q, tj0, nj, &kf0, &kf1))
            continue; /* none of the warp's rows sees this tile (warp-uniform) */
        float s[8][4];
        ma_dot<HD>(s, Qs, wr0, Ks, 2 * kf0, 2 * kf1);
        /* masks, then the online softmax over the row's 4 lanes; S, the
         * row maxima m stay unscaled, the scale is folded into the
         * exponentials' FMA (scale2) */
        float tmax[2] = {-INFINITY, -INFINITY};
        const ma_cols_t C = ma_q_cols(R, tj0, nj, kf0, kf1);
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
            for (int i = 0; i < 4; i++) {
                const int r = i >> 1;
                s[nb][i] = ma_cols_in(C, nb, i) ? s[nb][i] : -INFINITY;
                tmax[r] = fmaxf(tmax[r], s[nb][i]);
            }
        float corr[2], mnew[2], msub[2], psum[2] = {0.0f, 0.0f};
        for (int r = 0; r < 2; r++) {
            tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
            tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
            mnew[r] = fmaxf(m[r], tmax[r]);
            corr[r] = m[r] == -INFINITY ? 0.0f : ma_exp2((m[r] - mnew[r]) * scale2);
            /* a row with no key seen yet subtracts 0: its masked -inf
             * elements then give 2^-inf = 0 as every other row's do, with
             * no test an element */
            msub[r] = (mnew[r] == -INFINITY ? 0.0f : mnew[r]) * scale2;
        }
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
            for (int i = 0; i < 4; i++) {
                const int r = i >> 1;
                const float p = ma_exp2(fmaf(s[nb][i], scale2, -msub[r]));
                s[nb][i] = p;
                psum[r] += p;
            }
        for (int r = 0; r < 2; r++) {
            psum[r] += __shfl_xor_sync(0xffffffffu, psum[r], 1);
            psum[r] += __shfl_xor_sync(0xffffffffu, psum[r], 2);
            l[r] = l[r] * corr[r] + psum[r];
            m[r] = mnew[r];
        }
        for (int nd = 0; nd < HD / 8; nd++)
            for (int i = 0; i < 4; i++)
                o[nd][i] *= corr[i >> 1];
        ma_accum<HD>(o, s, Vs, kf0, kf1);
    }
    if (!Q.wactive)
        return; /* no barrier follows */
    const float f[2] = {1.0f / l[0], 1.0f / l[1]};
    ma_store<HD>(out + (b * G.T + q0 + wr0) * G.qstride + h * HD, G.qstride, nq - wr0, o, f,
                 G.round);
    if (t4 == 0)
        for (int r = 0; r < 2; r++)
            if (R.v[r])
                lse[(b * G.nh + h) * G.T + R.t[r]] = m[r] * G.scale + logf(l[r]);
}

/* dq of 64 query rows.  Shared: Qs, dOs, then two buffers of Ks, Vs,
 * bf16 [64][HD+8] each.  The key tiles come in double-buffered, as the
 * dk/dv kernel's query tiles do: the next tile's copies are issued
 * before this one's products and waited for a tile later. */
template <int HD, typename T>
__global__ void __launch_bounds__(TC_THREADS)
    mt_k_attention_mma_dq(T *dq, const T *dout, const float *lse, const float *D, const T *q,
                          const T *k, const T *v, tc_geom_t G)
{
    const int LDH = HD + 8;
    TC_DECLARE_SMEM(smem);
    tc_bf16 *Qs = (tc_bf16 *)smem, *dOs = Qs + TC_BQ * LDH, *Kb = dOs + TC_BQ * LDH;
    /* buffer i: Ks at Kb + 2 i TC_BK LDH, Vs TC_BK LDH after it */

    const tc_qblock_t Q = tc_qblock(G);
    const ma_rows_t R = ma_rows(G, Q);
    const int64_t b = Q.b, h = Q.h, q0 = Q.q0, qlast = Q.qlast;
    const int nq = Q.nq, wr0 = Q.wr0;
    float L2[2], Dr[2]; /* the rows' lse (in log2 units) and D */
    const float scale2 = G.scale * MA_LOG2E;
    for (int i = 0; i < 2; i++) {
        L2[i] = R.v[i] ? lse[(b * G.nh + h) * G.T + R.t[i]] * MA_LOG2E : 0.0f;
        Dr[i] = R.v[i] ? D[(b * G.nh + h) * G.T + R.t[i]] : 0.0f;
    }
    const int64_t qoff = (b * G.T + q0) * G.qstride + h * HD;
    tc_load_tile<HD, TC_BQ>(Qs, q + qoff, G.qstride, nq, G.vec);
    tc_load_tile<HD, TC_BQ>(dOs, dout + qoff, G.qstride, nq, G.vec);

    float acc[HD / 8][4];
    for (int nd = 0; nd < HD / 8; nd++)
        acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;
    const int64_t kvbase = b * G.T * G.kvstride + Q.g * HD;
    int64_t j0 = Q.minlo;
    ma_load_kv<HD>(Kb, 0, k, v, kvbase, G, j0, qlast);
    mt_cp_async_commit(); /* the queries' rows and the first key tile */
    for (int buf = 0; j0 <= qlast; buf ^= 1) {
        const int64_t next = j0 + TC_BK;
        __syncthreads(); /* the other buffer is no longer read */
        tc_prefetch_wait(next <= qlast,
                         [&] { ma_load_kv<HD>(Kb, buf ^ 1, k, v, kvbase, G, next, qlast); });
        __syncthreads(); /* every thread's copies of this tile (the first time: Qs, dOs) */
        const int64_t tj0 = j0;
        j0 = next;
        const int nj = (int)tc_min64(TC_BK, qlast + 1 - tj0);
        if (!Q.wactive)
            continue;
        const tc_bf16 *Ks = Kb + 2 * buf * TC_BK * LDH, *Vs = Ks + TC_BK * LDH;
        int kf0, kf1;
        if (!tc_warp_frags(Q, tj0, nj, &kf0, &kf1))
            continue; /* none of the warp's rows sees this tile */
        float s[8][4], dp[8][4];
        ma_dot<HD>(s, Qs, wr0, Ks, 2 * kf0, 2 * kf1);
        ma_dot<HD>(dp, dOs, wr0, Vs, 2 * kf0, 2 * kf1);
        const ma_cols_t C = ma_q_cols(R, tj0, nj, kf0, kf1);
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
            for (int i = 0; i < 4; i++) {
                const int r = i >> 1;
                s[nb][i] = ma_cols_in(C, nb, i)
                               ? ma_exp2(fmaf(s[nb][i], scale2, -L2[r])) * (dp[nb][i] - Dr[r])
                               : 0.0f;
            }
        ma_accum<HD>(acc, s, Ks, kf0, kf1);
    }
    if (!Q.wactive)
        return;
    const float f[2] = {G.scale, G.scale};
    ma_store<HD>(dq + qoff + wr0 * G.qstride, G.qstride, nq - wr0, acc, f, G.round);
}

/* dk, dv of 64 key rows of kv head g.  Shared: Ks, Vs (own rows), then
 * two buffers of Qs, dOs (query tiles), bf16 [64][HD+8] each; per query
 * of the tile sL, sD (fp32) and sLo (int) [64].  The query tiles come in
 * double-buffered: the next tile's copies are issued (cp.async on bf16
 * storage) before this one's products, into the other buffer, and waited
 * for a tile later (cp.async.wait_group 1).  On the register path the
 * loads are synchronous and the prefetch only reorders them. */
template <int HD, typename T>
__global__ void __launch_bounds__(TC_THREADS)
    mt_k_attention_mma_dkdv(T *dk, T *dv, const T *dout, const float *lse, const float *D,
                            const T *q, const T *k, const T *v, tc_geom_t G)
{
    const int LDH = HD + 8;
    TC_DECLARE_SMEM(smem);
    tc_bf16 *Ks = (tc_bf16 *)smem, *Vs = Ks + TC_BK * LDH, *Qb = Vs + TC_BK * LDH;
    /* buffer i: Qs at Qb + 2 i TC_BQ LDH, dOs TC_BQ LDH after it */
    float *sL = (float *)(Qb + 4 * TC_BQ * LDH), *sD = sL + TC_BQ;
    int *sLo = (int *)(sD + TC_BQ);

    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g8 = lane >> 2, t4 = lane & 3;
    const int64_t b = blockIdx.z, g = blockIdx.y;
    const int64_t j0 = (int64_t)blockIdx.x * TC_BK;
    const float scale2 = G.scale * MA_LOG2E;
    const int nk = (int)tc_min64(TC_BK, G.T - j0);
    const int64_t klast = j0 + nk - 1;
    const int wk0 = w * 16;
    const bool wactive = wk0 < nk;
    /* the lane's two key rows */
    bool kv[2];
    int64_t kr[2];
    for (int i = 0; i < 2; i++) {
        kv[i] = wk0 + g8 + 8 * i < nk;
        kr[i] = j0 + wk0 + g8 + 8 * i;
    }
    const int64_t kvoff = (b * G.T + j0) * G.kvstride + g * HD;
    tc_load_tile<HD, TC_BK>(Ks, k + kvoff, G.kvstride, nk, G.vec);
    tc_load_tile<HD, TC_BK>(Vs, v + kvoff, G.kvstride, nk, G.vec);

    float adk[HD / 8][4], adv[HD / 8][4];
    for (int nd = 0; nd < HD / 8; nd++)
        for (int i = 0; i < 4; i++)
            adk[nd][i] = adv[nd][i] = 0.0f;

    /* the query tiles: the group's heads in order, each from the block's
     * first key on (earlier queries see none of these keys) */
    int64_t hh = 0, q0 = j0;
    auto load_tile = [&](int buf, int64_t th, int64_t tq0) {
        const int64_t qoff = (b * G.T + tq0) * G.qstride + (g * G.group + th) * HD;
        const int tnq = (int)tc_min64(TC_BQ, G.T - tq0);
        tc_bf16 *Qs = Qb + 2 * buf * TC_BQ * LDH;
        tc_load_tile<HD, TC_BQ>(Qs, q + qoff, G.qstride, tnq, G.vec);
        tc_load_tile<HD, TC_BQ>(Qs + TC_BQ * LDH, dout + qoff, G.qstride, tnq, G.vec);
    };
    load_tile(0, hh, q0);
    mt_cp_async_commit(); /* the keys and the first tile */
    for (int buf = 0; hh < G.group; buf ^= 1) {
        int64_t nh = hh, nq0 = q0 + TC_BQ;
        if (nq0 >= G.T)
            nh++, nq0 = j0;
        __syncthreads(); /* the other buffer, sL, sD, sLo are no longer read */
        tc_prefetch_wait(nh < G.group, [&] { load_tile(buf ^ 1, nh, nq0); });
        const int64_t h = g * G.group + hh, tq0 = q0;
        const int nq = (int)tc_min64(TC_BQ, G.T - tq0);
        hh = nh, q0 = nq0;
        if (!tc_dkdv_tile_fill(G, b, h, tq0, nq, klast, lse, D, sL, sD, sLo))
            continue; /* block-uniform: no query of the tile reaches these keys */
        __syncthreads(); /* sL, sD, sLo */
        if (!wactive)
            continue;
        const tc_bf16 *Qs = Qb + 2 * buf * TC_BQ * LDH, *dOs = Qs + TC_BQ * LDH;
        /* queries before the warp's first key see none of its keys */
        const int64_t cmin = tc_max64(j0 + wk0 - tq0, 0);
        if (cmin > nq - 1)
            continue;
        const int qf0 = (int)(cmin / 16), qf1 = (nq - 1) / 16 + 1;
        float st[8][4], dpt[8][4];
        ma_dot<HD>(st, Ks, wk0, Qs, 2 * qf0, 2 * qf1);
        ma_dot<HD>(dpt, Vs, wk0, dOs, 2 * qf0, 2 * qf1);
        /* the lane's key rows see the queries from their own position
         * (causal) to the tile's end, within the warp's fragments, and
         * with documents only those whose first key is at most the key */
        ma_cols_t C;
        for (int r = 0; r < 2; r++)
            ma_cols_set(C, r, kv[r], tc_max64(kr[r] - tq0, 16 * qf0),
                        tc_min64(nq - 1, 16 * qf1 - 1));
        const bool docs = G.doc_start != nullptr;
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
            for (int i = 0; i < 4; i++) {
                const int r = i >> 1, c = nb * 8 + 2 * t4 + (i & 1);
                float p = 0.0f, ds = 0.0f;
                if (ma_cols_in(C, nb, i) && (!docs || sLo[c] <= kr[r])) {
                    p = ma_exp2(fmaf(st[nb][i], scale2, -sL[c] * MA_LOG2E));
                    ds = p * (dpt[nb][i] - sD[c]);
                }
                st[nb][i] = p;
                dpt[nb][i] = ds;
            }
        ma_accum<HD>(adv, st, dOs, qf0, qf1);
        ma_accum<HD>(adk, dpt, Qs, qf0, qf1);
    }
    if (!wactive)
        return;
    const float one[2] = {1.0f, 1.0f}, sc[2] = {G.scale, G.scale};
    ma_store<HD>(dv + kvoff + wk0 * G.kvstride, G.kvstride, nk - wk0, adv, one, G.round);
    ma_store<HD>(dk + kvoff + wk0 * G.kvstride, G.kvstride, nk - wk0, adk, sc, G.round);
}

/* ------------------------------------------------------------------ launchers */

/* dynamic shared memory of the three kernels, bytes */
template <int HD> static size_t ma_smem_forward(void)
{
    return (size_t)(TC_BQ + 2 * ma_fwd_bufs<HD>::n * TC_BK) * (HD + 8) * 2;
}
template <int HD> static size_t ma_smem_dq(void) /* the key tiles double-buffered */
{
    return (size_t)(2 * TC_BQ + 4 * TC_BK) * (HD + 8) * 2;
}
template <int HD> static size_t ma_smem_dkdv(void) /* the query tiles double-buffered */
{
    return (size_t)(4 * TC_BQ + 2 * TC_BK) * (HD + 8) * 2 + (size_t)TC_BQ * 12;
}

size_t mt_attention_mma_smem(int64_t hd)
{
    if (hd == 64)
        return ma_smem_dkdv<64>() > ma_smem_dq<64>() ? ma_smem_dkdv<64>() : ma_smem_dq<64>();
    return ma_smem_dkdv<128>() > ma_smem_dq<128>() ? ma_smem_dkdv<128>() : ma_smem_dq<128>();
}

template <int HD, typename T>
static void ma_forward(cudaStream_t s, T *out, float *lse, const T *q, const T *k, const T *v,
                       const tc_geom_t &G)
{
    static bool ready = false;
    const size_t smem = ma_smem_forward<HD>();
    tc_prepare(mt_k_attention_mma_forward<HD, T>, smem, &ready);
    dim3 grid((unsigned)((G.T + TC_BQ - 1) / TC_BQ), (unsigned)G.nh, (unsigned)G.B);
    mt_k_attention_mma_forward<HD, T><<<grid, TC_THREADS, smem, s>>>(out, lse, q, k, v, G);
    MT_CUDA_LAUNCH_CHECK("attention_mma_forward");
}

template <int HD, typename T>
static void ma_backward(cudaStream_t s, T *dq, T *dk, T *dv, const T *dout, const float *lse,
                        const float *D, const T *q, const T *k, const T *v, const tc_geom_t &G)
{
    static bool ready_dq = false, ready_kv = false;
    const size_t smem_dq = ma_smem_dq<HD>(), smem_kv = ma_smem_dkdv<HD>();
    tc_prepare(mt_k_attention_mma_dq<HD, T>, smem_dq, &ready_dq);
    tc_prepare(mt_k_attention_mma_dkdv<HD, T>, smem_kv, &ready_kv);
    dim3 gq((unsigned)((G.T + TC_BQ - 1) / TC_BQ), (unsigned)G.nh, (unsigned)G.B);
    mt_k_attention_mma_dq<HD, T><<<gq, TC_THREADS, smem_dq, s>>>(dq, dout, lse, D, q, k, v, G);
    MT_CUDA_LAUNCH_CHECK("attention_mma_dq");
    dim3 gk((unsigned)((G.T + TC_BK - 1) / TC_BK), (unsigned)G.nkv, (unsigned)G.B);
    mt_k_attention_mma_dkdv<HD, T><<<gk, TC_THREADS, smem_kv, s>>>(dk, dv, dout, lse, D, q, k,
                                                                   v, G);
    MT_CUDA_LAUNCH_CHECK("attention_mma_dkdv");
}

template <typename T>
void mt_attention_mma_forward(cudaStream_t s, T *out, float *lse, const T *q, const T *k,
                              const T *v, const tc_geom_t &G, int64_t hd)
{
    if (hd == 64)
        ma_forward<64>(s, out, lse, q, k, v, G);
    else
        ma_forward<128>(s, out, lse, q, k, v, G);
}

template <typename T>
void mt_attention_mma_backward(cudaStream_t s, T *dq, T *dk, T *dv, const T *dout,
                               const float *lse, const float *D, const T *q, const T *k,
                               const T *v, const tc_geom_t &G, int64_t hd)
{
    if (hd == 64)
        ma_backward<64>(s, dq, dk, dv, dout, lse, D, q, k, v, G);
    else
        ma_backward<128>(s, dq, dk, dv, dout, lse, D, q, k, v, G);
}

template void mt_attention_mma_forward<float>(cudaStream_t, float *, float *, const float *,
                                              const float *, const float *, const tc_geom_t &,
                                              int64_t);
template void mt_attention_mma_forward<__nv_bfloat16>(cudaStream_t, __nv_bfloat16 *, float *,
                                                      const __nv_bfloat16 *,
                                                      const __nv_bfloat16 *,
                                                      const __nv_bfloat16 *, const tc_geom_t &,
                                                      int64_t);
template void mt_attention_mma_backward<float>(cudaStream_t, float *, float *, float *,
                                               const float *, const float *, const float *,
                                               const float *, const float *, const float *,
                                               const tc_geom_t &, int64_t);
template void mt_attention_mma_backward<__nv_bfloat16>(
    cudaStream_t, __nv_bfloat16 *, __nv_bfloat16 *, __nv_bfloat16 *, const __nv_bfloat16 *,
    const float *, const float *, const __nv_bfloat16 *, const __nv_bfloat16 *,
    const __nv_bfloat16 *, const tc_geom_t &, int64_t);
