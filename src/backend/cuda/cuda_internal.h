/* cuda_internal.h: what the CUDA backend's files share (not installed).
 * Included by C (cuda_device.c, cuda_setup.c, nccl_comm.c, the tests do
 * not) and by the .cu files.  It holds the error macros, the backend
 * context (stream, cuBLAS handles, scratch) and the launchers'
 * declarations: each launcher takes a stream, checks its shape
 * preconditions, launches and checks the launch.  Device-side helpers live
 * in cuda_common.cuh (C++ only).
 *
 * The files call one another in one direction, lowest first:
 * cuda_device.c (errors, binding, arenas), cuda_context.cu (the context),
 * cuda_setup.c (the trainer's bring-up and the pool), the kernel files
 * (launchers), then cuda_backend.cu and cuda_storage.cu (the tables). */
#ifndef MT_CUDA_INTERNAL_H
#define MT_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend_require.h"
#include "mt_cuda.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Library code that returns mt_status_t: record the CUDA error string with
 * file:line and a hint, and return. */
#define MT_CUDA_TRY(call)                                                           \
    do {                                                                            \
        cudaError_t mt_cuda_rc_ = (call);                                           \
        if (mt_cuda_rc_ != cudaSuccess)                                             \
            return mt_error_cuda((int)mt_cuda_rc_, #call, __FILE__, __LINE__);      \
    } while (0)

/* Kernels (void, like the CPU ones): a failed call stops the process with
 * the CUDA error string and file:line. */
void mt_cuda_die(const char *what, const char *detail, const char *file, int line);

#define MT_CUDA_CHECK(call)                                                         \
    do {                                                                            \
        cudaError_t mt_cuda_rc_ = (call);                                           \
        if (mt_cuda_rc_ != cudaSuccess)                                             \
            mt_cuda_die(#call, cudaGetErrorString(mt_cuda_rc_), __FILE__, __LINE__); \
    } while (0)

/* After a <<<>>> launch: bad configurations surface here, faults later. */
#define MT_CUDA_LAUNCH_CHECK(kernel) MT_CUDA_CHECK(cudaGetLastError())

/* A shape precondition of a launcher (a caller bug; backend_require.h). */
#define MT_CUDA_REQUIRE(cond, kernel, ...) MT_BACKEND_REQUIRE("cuda", cond, kernel, __VA_ARGS__)

/* Where an arena's next allocation starts (mt_cuda_arena_alloc; the pool
 * takes the rest from there): its use rounded up to 256 bytes. */
#define MT_CUDA_ARENA_ALIGN 256
static inline size_t mt_cuda_arena_next(const mt_cuda_arena_t *a)
{
    return (a->used + MT_CUDA_ARENA_ALIGN - 1) / MT_CUDA_ARENA_ALIGN * MT_CUDA_ARENA_ALIGN;
}

/* The process's backend context (mt_cuda_backend_init). */
typedef struct {
    int ready;
    cudaStream_t stream;
    void *cublas;   /* cublasHandle_t */
    void *cublaslt; /* cublasLtHandle_t */
    void *lt_workspace;
    size_t lt_workspace_bytes;
    char *scratch; /* device scratch: partial sums of deterministic reductions */
    size_t scratch_bytes;
    char *host;    /* pinned host buffer: partial sums copied back */
    size_t host_bytes;
} mt_cuda_ctx_t;

/* The initialised context (cuda_context.cu); stops the process if
 * mt_cuda_backend_init was not called. */
mt_cuda_ctx_t *mt_cuda_ctx(const char *kernel);

/* Device scratch of `bytes` (reused by every kernel: valid until the next
 * kernel on the stream), stops the process naming `kernel` when too small. */
void *mt_cuda_scratch(const char *kernel, size_t bytes);

/* The context's pinned host buffer, at least `bytes` (where the tables
 * copy partial sums back: valid until the next such copy); stops the
 * process naming `kernel` when too small. */
char *mt_cuda_host(const char *kernel, size_t bytes);

/* Waits for the stream and releases the context's stream, handles and
 * pinned buffer (a no-op without a context); its half of
 * mt_cuda_backend_free. */
void mt_cuda_context_free(void);

/* Destroys the kept cuBLASLt plans (cuda_matmul.cu); the other half of
 * mt_cuda_backend_free. */
void mt_cuda_lt_plans_free(void);

/* Launchers: kernels first, these last, one file per op family.  All
 * pointers are device pointers; bf16 tensors are uint16_t bit patterns. */
void mt_cuda_launch_matmul(cudaStream_t s, float *c, const float *a, const float *b, int64_t m,
                           int64_t n, int64_t k, bool ta, bool tb, float beta);
/* fp32 A, B, C on tensor cores: inputs down-converted to bf16 (exact for
 * bf16-valued inputs), fp32 accumulation (the bf16-numerics table) */
void mt_cuda_launch_matmul_fast_bf16(cudaStream_t s, float *c, const float *a, const float *b,
                                     int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                                     float beta);
void mt_cuda_launch_matmul_bf16(cudaStream_t s, uint16_t *c, const uint16_t *a,
                                const uint16_t *b, int64_t m, int64_t n, int64_t k, bool ta,
                                bool tb, float beta);
/* c = r + op(a) op(b), bf16: r read as cuBLASLt's C, c written as its D */
void mt_cuda_launch_matmul_bf16_add(cudaStream_t s, uint16_t *c, const uint16_t *r,
                                    const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                                    int64_t k, bool ta, bool tb);
/* bf16 A, B; fp32 C (beta 1: accumulate fp32 weight gradients) */
void mt_cuda_launch_matmul_bf16_f32out(cudaStream_t s, float *c, const uint16_t *a,
                                       const uint16_t *b, int64_t m, int64_t n, int64_t k,
                                       bool ta, bool tb, float beta);
void mt_cuda_launch_embedding_forward(cudaStream_t s, float *out, const int32_t *tokens,
                                      const float *table, int64_t n_tokens, int64_t dim);
void mt_cuda_launch_embedding_backward(cudaStream_t s, float *dtable, const float *dout,
                                       const int32_t *tokens, int64_t n_tokens, int64_t dim);
void mt_cuda_launch_embedding_forward_bf16s(cudaStream_t s, uint16_t *out, const int32_t *tokens,
                                            const uint16_t *table, int64_t n_tokens, int64_t dim);
void mt_cuda_launch_embedding_backward_bf16s(cudaStream_t s, float *dtable, const uint16_t *dout,
                                             const int32_t *tokens, int64_t n_tokens,
                                             int64_t dim);
/* round: the activations written (not rstd, dw) are rounded to bf16 in
 * the kernel's store, for the rounding table (mt_backend_t.rounds_bf16) */
void mt_cuda_launch_rmsnorm_forward(cudaStream_t s, float *out, float *rstd, const float *x,
                                    const float *w, int64_t n, int64_t dim, float eps,
                                    bool round);
void mt_cuda_launch_rmsnorm_backward(cudaStream_t s, float *dx, float *dw, const float *dout,
                                     const float *x, const float *w, const float *rstd,
                                     int64_t n, int64_t dim, bool accumulate, bool round);
/* bf16 storage: x, w, out, dout and dx bf16 bits; rstd and dw float32 */
void mt_cuda_launch_rmsnorm_rowsums(cudaStream_t s, double *sums, const float *a,
                                    const float *b, const float *w, int64_t n, int64_t dim,
                                    bool round);
void mt_cuda_launch_rmsnorm_forward_sums(cudaStream_t s, float *out, float *rstd, const float *x,
                                         const float *w, const double *sums, int64_t n,
                                         int64_t dim, int64_t full_dim, float eps, bool round);
void mt_cuda_launch_rmsnorm_backward_sums(cudaStream_t s, float *dx, float *dw,
                                          const float *dout, const float *x, const float *w,
                                          const float *rstd, const double *sums, int64_t n,
                                          int64_t dim, int64_t full_dim, bool accumulate,
                                          bool round);
void mt_cuda_launch_rmsnorm_rowsums_bf16s(cudaStream_t s, double *sums, const uint16_t *a,
                                          const uint16_t *b, const uint16_t *w, int64_t n,
                                          int64_t dim);
void mt_cuda_launch_rmsnorm_forward_sums_bf16s(cudaStream_t s, uint16_t *out, float *rstd,
                                               const uint16_t *x, const uint16_t *w,
                                               const double *sums, int64_t n, int64_t dim,
                                               int64_t full_dim, float eps);
void mt_cuda_launch_rmsnorm_backward_sums_bf16s(cudaStream_t s, uint16_t *dx, float *dw,
                                                const uint16_t *dout, const uint16_t *x,
                                                const uint16_t *w, const float *rstd,
                                                const double *sums, int64_t n, int64_t dim,
                                                int64_t full_dim, bool accumulate);
void mt_cuda_launch_rmsnorm_forward_bf16s(cudaStream_t s, uint16_t *out, float *rstd,
                                          const uint16_t *x, const uint16_t *w, int64_t n,
                                          int64_t dim, float eps);
void mt_cuda_launch_rmsnorm_backward_bf16s(cudaStream_t s, uint16_t *dx, float *dw,
                                           const uint16_t *dout, const uint16_t *x,
                                           const uint16_t *w, const float *rstd, int64_t n,
                                           int64_t dim, bool accumulate);
void mt_cuda_launch_rope(cudaStream_t s, float *x, const int32_t *pos, int64_t n_tokens,
                         int64_t n_heads, int64_t head_dim, const double *inv_freq,
                         double scale, double sign, bool round);
void mt_cuda_launch_rope_bf16s(cudaStream_t s, uint16_t *x, const int32_t *pos,
                               int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                               const double *inv_freq, double scale, double sign);
void mt_cuda_launch_swiglu_forward(cudaStream_t s, float *out, const float *gate,
                                   const float *up, int64_t n, bool round);
void mt_cuda_launch_swiglu_backward(cudaStream_t s, float *dgate, float *dup, const float *dout,
                                    const float *gate, const float *up, int64_t n, bool round);
void mt_cuda_launch_add(cudaStream_t s, float *y, const float *x, int64_t n);
/* bf16 storage (mt_backend_t.stores_bf16): the same kernels on bf16 bits,
 * rounding what they store; add rounds the sum */
void mt_cuda_launch_swiglu_forward_bf16s(cudaStream_t s, uint16_t *out, const uint16_t *gate,
                                         const uint16_t *up, int64_t n);
void mt_cuda_launch_swiglu_backward_bf16s(cudaStream_t s, uint16_t *dgate, uint16_t *dup,
                                          const uint16_t *dout, const uint16_t *gate,
                                          const uint16_t *up, int64_t n);
void mt_cuda_launch_add_bf16s(cudaStream_t s, uint16_t *y, const uint16_t *x, int64_t n);
void mt_cuda_launch_scale(cudaStream_t s, float *x, float a, int64_t n);
void mt_cuda_launch_round_bf16(cudaStream_t s, float *x, int64_t n);
/* Deterministic sum of squares: writes MT_CUDA_SUMSQ_PARTS doubles to
 * partial (the caller adds them in order). */
#define MT_CUDA_SUMSQ_PARTS 256
void mt_cuda_launch_sum_squares(cudaStream_t s, double *partial, const float *x, int64_t n);
void mt_cuda_launch_adamw(cudaStream_t s, float *p, uint16_t *p_bf16, float *p_work,
                          const float *g, float gscale, float *m, float *v, int64_t n, float lr,
                          float b1, float b2, float eps, float wd, int64_t t);
void mt_cuda_launch_convert(cudaStream_t s, void *dst, const void *src, int64_t n,
                            bool to_bf16);
/* How cross-entropy holds logits and dlogits: float32; float32 read and
 * written as bf16 values (each load and store rounded: the rounding
 * table's); bf16 bits. */
typedef enum { MT_CUDA_CE_F32, MT_CUDA_CE_F32_AS_BF16, MT_CUDA_CE_BF16 } mt_cuda_ce_elem_t;
/* Cross-entropy: row_loss[i] (0 for ignored rows) per row; the caller sums
 * in row order.  The shard passes take float32 logits, rounded as they are
 * read and dlogits as it is written when round. */
void mt_cuda_launch_cross_entropy(cudaStream_t s, void *dlogits, const void *logits,
                                  mt_cuda_ce_elem_t elem, const int32_t *targets, int64_t n,
                                  int64_t V, int64_t v_valid, float grad_scale,
                                  double *row_loss);
void mt_cuda_launch_ce_shard_max(cudaStream_t s, float *mx, const float *logits, int64_t n,
                                 int64_t V, int64_t v_valid, bool round);
void mt_cuda_launch_ce_shard_sum(cudaStream_t s, double *z, double *ly, const float *logits,
                                 const int32_t *targets, const float *mx, int64_t n, int64_t V,
                                 int64_t v_lo, int64_t v_valid, bool round);
void mt_cuda_launch_ce_shard_finish(cudaStream_t s, float *dlogits, const float *logits,
                                    const int32_t *targets, const float *mx, const double *z,
                                    const double *ly, int64_t n, int64_t V, int64_t v_lo,
                                    int64_t v_valid, float grad_scale, double *row_loss,
                                    bool round);
/* The MoE row entries on bf16 bits (bf16 storage, cuda_storage.cu): the
 * same kernels; dlogits and de rounded as stored, y and dw float32. */
void mt_cuda_launch_moe_router_backward_bf16s(cudaStream_t s, uint16_t *dlogits, const float *dw,
                                              const float *probs, const int32_t *idx,
                                              const float *w, const float *dp_all, int64_t n,
                                              int64_t E, int64_t k, bool norm_topk);
void mt_cuda_launch_moe_gather_rows_bf16s(cudaStream_t s, uint16_t *dst, const uint16_t *src,
                                          const int32_t *rows, int64_t n, int64_t width);
void mt_cuda_launch_moe_unpermute_bf16s(cudaStream_t s, float *y, const uint16_t *res,
                                        const uint16_t *e, const int32_t *pos, const float *w,
                                        int64_t n_tokens, int64_t top_k, int64_t dim);
void mt_cuda_launch_moe_unpermute_backward_bf16s(cudaStream_t s, uint16_t *de, float *dw,
                                                 const uint16_t *dy, const uint16_t *e,
                                                 const int32_t *pos, const float *w,
                                                 int64_t n_tokens, int64_t top_k, int64_t dim);
/* The CUDA-core attention on bf16 bits (bf16 storage: exact loads, out,
 * dq, dk, dv rounded as stored); the tensor-core _bf16s launchers fall
 * back to them. */
void mt_cuda_launch_attention_forward_bf16s(cudaStream_t s, uint16_t *out, float *lse,
                                            const uint16_t *q, const uint16_t *k,
                                            const uint16_t *v, const int32_t *doc_start,
                                            int64_t B, int64_t T, int64_t nh, int64_t nkv,
                                            int64_t hd);
void mt_cuda_launch_attention_backward_bf16s(cudaStream_t s, uint16_t *dq, uint16_t *dk,
                                             uint16_t *dv, const uint16_t *dout,
                                             const uint16_t *out, const float *lse,
                                             const uint16_t *q, const uint16_t *k,
                                             const uint16_t *v, const int32_t *doc_start,
                                             int64_t B, int64_t T, int64_t nh, int64_t nkv,
                                             int64_t hd);
/* The shard passes on bf16 bits (bf16 storage, cuda_storage.cu). */
void mt_cuda_launch_ce_shard_max_bf16s(cudaStream_t s, float *mx, const uint16_t *logits,
                                       int64_t n, int64_t V, int64_t v_valid);
void mt_cuda_launch_ce_shard_sum_bf16s(cudaStream_t s, double *z, double *ly,
                                       const uint16_t *logits, const int32_t *targets,
                                       const float *mx, int64_t n, int64_t V, int64_t v_lo,
                                       int64_t v_valid);
void mt_cuda_launch_ce_shard_finish_bf16s(cudaStream_t s, uint16_t *dlogits,
                                          const uint16_t *logits, const int32_t *targets,
                                          const float *mx, const double *z, const double *ly,
                                          int64_t n, int64_t V, int64_t v_lo, int64_t v_valid,
                                          float grad_scale, double *row_loss);
/* ce_shard_finish on bf16 bits, its row losses summed in row order as
 * the tables' (cuda_backend.cu) */
double mt_cuda_ce_shard_finish_bf16(uint16_t *dlogits, const uint16_t *logits,
                                    const int32_t *targets, const float *mx, const double *z,
                                    const double *ly, int64_t n, int64_t V, int64_t v_lo,
                                    int64_t v_valid, float grad_scale, int64_t *count);
/* round_in: q, k, v, dout, out read as bf16 values (the bf16 table's
 * fallback, mt_backend_t.reads_bf16); false: as they are */
void mt_cuda_launch_attention_forward(cudaStream_t s, float *out, float *lse, const float *q,
                                      const float *k, const float *v, const int32_t *doc_start,
                                      int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd,
                                      bool round_in);
void mt_cuda_launch_attention_backward(cudaStream_t s, float *dq, float *dk, float *dv,
                                       const float *dout, const float *out, const float *lse,
                                       const float *q, const float *k, const float *v,
                                       const int32_t *doc_start, int64_t B, int64_t T,
                                       int64_t nh, int64_t nkv, int64_t hd, bool round_in);
/* Tensor-core (bf16 WMMA) attention, cuda_attention_tc.cu: q, k, v, dout
 * become bf16 tiles (rounded to nearest even as they are loaded).  Head
 * dims 64 and 128 on compute capability >= 8.0
 * (mt_cuda_attention_tc_supported); anything else runs the fp32 kernels
 * above.  round: every activation input is read as its bf16 value (the
 * fp32 fold of dout . out too) and out (forward) and dq, dk, dv
 * (backward) are rounded to bf16 as they are stored (the fp32 kernels: in
 * a pass after); false: only the tiles round. */
void mt_cuda_launch_attention_tc_forward(cudaStream_t s, float *out, float *lse, const float *q,
                                         const float *k, const float *v,
                                         const int32_t *doc_start, int64_t B, int64_t T,
                                         int64_t nh, int64_t nkv, int64_t hd, bool round);
void mt_cuda_launch_attention_tc_backward(cudaStream_t s, float *dq, float *dk, float *dv,
                                          const float *dout, const float *out, const float *lse,
                                          const float *q, const float *k, const float *v,
                                          const int32_t *doc_start, int64_t B, int64_t T,
                                          int64_t nh, int64_t nkv, int64_t hd, bool round);
/* D[(b*nh + h)*T + t] = dout . out over head h of token (b, t) (rows of
 * nh*hd floats): the backward's row dots; with B = 1, T = nq it is the
 * block backward's D[h * nq + i]. */
void mt_cuda_launch_attention_rowdot(cudaStream_t s, float *D, const float *dout,
                                     const float *out, int64_t B, int64_t T, int64_t nh,
                                     int64_t hd, bool round);
void mt_cuda_launch_attention_rowdot_bf16s(cudaStream_t s, float *D, const uint16_t *dout,
                                           const uint16_t *out, int64_t B, int64_t T, int64_t nh,
                                           int64_t hd);
/* bf16 storage: the tensor-core attention on bf16 bits (head dims 64 and
 * 128 on sm_80 and up; others take the CUDA-core _bf16s kernels above) */
void mt_cuda_launch_attention_tc_forward_bf16s(cudaStream_t s, uint16_t *out, float *lse,
                                              const uint16_t *q, const uint16_t *k,
                                              const uint16_t *v, const int32_t *doc_start,
                                              int64_t B, int64_t T, int64_t nh, int64_t nkv,
                                              int64_t hd);
void mt_cuda_launch_attention_tc_backward_bf16s(cudaStream_t s, uint16_t *dq, uint16_t *dk,
                                               uint16_t *dv, const uint16_t *dout,
                                               const uint16_t *out, const float *lse,
                                               const uint16_t *q, const uint16_t *k,
                                               const uint16_t *v, const int32_t *doc_start,
                                               int64_t B, int64_t T, int64_t nh, int64_t nkv,
                                               int64_t hd);
void mt_cuda_launch_attention_block_forward(cudaStream_t s, float *out, float *lse,
                                            int64_t lse_stride, const float *q, const float *k,
                                            const float *v, const int32_t *doc_start, int64_t nq,
                                            int64_t nk, int64_t q0, int64_t k0, int64_t nh,
                                            int64_t nkv, int64_t hd);
void mt_cuda_launch_attention_block_backward(cudaStream_t s, float *dq, float *dk, float *dv,
                                             const float *dout, const float *out,
                                             const float *lse, int64_t lse_stride,
                                             const float *q, const float *k, const float *v,
                                             const int32_t *doc_start, int64_t nq, int64_t nk,
                                             int64_t q0, int64_t k0, int64_t nh, int64_t nkv,
                                             int64_t hd);
/* The same on bf16 storage: the inputs bf16 bits, out (forward) and dq,
 * dk, dv float32 sums (mt_backend.h's stores_bf16 contract). */
void mt_cuda_launch_attention_block_forward_bf16s(cudaStream_t s, float *out, float *lse,
                                                  int64_t lse_stride, const uint16_t *q,
                                                  const uint16_t *k, const uint16_t *v,
                                                  const int32_t *doc_start, int64_t nq, int64_t nk,
                                                  int64_t q0, int64_t k0, int64_t nh, int64_t nkv,
                                                  int64_t hd);
void mt_cuda_launch_attention_block_backward_bf16s(cudaStream_t s, float *dq, float *dk,
                                                   float *dv, const uint16_t *dout,
                                                   const uint16_t *out, const float *lse,
                                                   int64_t lse_stride, const uint16_t *q,
                                                   const uint16_t *k, const uint16_t *v,
                                                   const int32_t *doc_start, int64_t nq,
                                                   int64_t nk, int64_t q0, int64_t k0, int64_t nh,
                                                   int64_t nkv, int64_t hd);
void mt_cuda_launch_moe_route(cudaStream_t s, int32_t *pos, int32_t *offsets,
                              const int32_t *expert, int64_t n_assign, int64_t n_experts);
void mt_cuda_launch_moe_permute(cudaStream_t s, float *out, const float *x, const int32_t *pos,
                                int64_t n_tokens, int64_t top_k, int64_t dim);
/* y = res (0 when NULL; y may alias it) + the w-weighted rows e[pos] in
 * k order; pos -1 (a dropped slot) adds nothing.  The backward gives a
 * dropped slot dw 0 and no row.  These are also the table's moe_combine
 * and moe_combine_backward (pos = slot_row). */
void mt_cuda_launch_moe_unpermute(cudaStream_t s, float *y, const float *res, const float *e,
                                  const int32_t *pos, const float *w, int64_t n_tokens,
                                  int64_t top_k, int64_t dim);
void mt_cuda_launch_moe_unpermute_backward(cudaStream_t s, float *de, float *dw, const float *dy,
                                           const float *e, const int32_t *pos, const float *w,
                                           int64_t n_tokens, int64_t top_k, int64_t dim);
void mt_cuda_launch_moe_gather_rows(cudaStream_t s, float *dst, const float *src,
                                    const int32_t *rows, int64_t n, int64_t width);
void mt_cuda_launch_moe_router_forward(cudaStream_t s, float *probs, int32_t *idx, float *w,
                                       const float *bias, int64_t n, int64_t E, int64_t k,
                                       bool norm_topk);
void mt_cuda_launch_moe_prob_sums(cudaStream_t s, double *sums, const float *probs, int64_t n,
                                  int64_t E);
void mt_cuda_launch_moe_router_backward(cudaStream_t s, float *dlogits, const float *dw,
                                        const float *probs, const int32_t *idx, const float *w,
                                        const float *dp_all, int64_t n, int64_t E, int64_t k,
                                        bool norm_topk);

#ifdef __cplusplus
}
#endif
#endif
