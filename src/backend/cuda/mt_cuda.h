/* mt_cuda.h: the CUDA backend's public C interface (built when configure
 * finds CUDA; MT_HAVE_CUDA in config.h).
 *
 * A rank binds one GPU (mt_cuda_device_init, by its node-local rank), takes
 * its device memory from arenas (one cudaMalloc each, a bump allocator, no
 * managed memory), and computes through mt_backend_cuda(): the same table
 * as the CPU backend (mt_backend.h), operating on DEVICE pointers, on one
 * CUDA stream.  The bf16 pieces that the fp32 table has no slot for yet
 * (mixed-precision AdamW, bf16 cross-entropy, MoE permutation) are plain
 * functions below; bf16 values are passed as uint16_t bit patterns so this
 * header needs no CUDA header.  All of it is untested on hardware so far:
 * doc/gpu.md says what has been checked and what has not.
 *
 * Nothing here prints or exits except the kernel launchers, which, like
 * the CPU kernels (void, no status), stop the process with the kernel's
 * name when a shape precondition or a launch fails. */
#ifndef MT_CUDA_H
#define MT_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mt_backend.h"
#include "mt_status.h"

#if !defined(__CUDACC__)
#include <mpi.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ device */

/* The trainer's reservation (mt_cuda_setup, src/train/train_device.c), which
 * meshtrain-plan counts: this share of the GPU's memory
 * (MT_CUDA_MEMORY_FRACTION in the environment overrides it), the backend's
 * cuBLASLt workspace and kernel scratch taken from it, the rest the pool. */
#define MT_CUDA_MEMORY_SHARE 0.9
#define MT_CUDA_LT_WORKSPACE_BYTES ((size_t)32 << 20)
/* per-call reduction space of the kernels (doc/gpu.md: 64 MiB covers 64k
 * tokens a micro-batch at dim 8192) */
#define MT_CUDA_SCRATCH_BYTES ((size_t)64 << 20)

typedef struct {
    int device;         /* CUDA ordinal this rank uses */
    int local_rank;     /* rank within its node */
    int local_size;     /* ranks on its node */
    int device_count;   /* devices visible to this rank */
    int cc_major, cc_minor;
    int sm_count;
    size_t total_mem;   /* bytes */
    char name[128];
    int sharing;        /* ranks of the node on this physical GPU (by PCI bus
                         * id; mt_cuda_setup), 0 when not counted */
} mt_cuda_device_t;

/* Devices visible to this process; 0 when there is no device or no driver
 * (never an error: tests use it to skip). */
int mt_cuda_device_count(void);

#if !defined(__CUDACC__)
/* Bind the GPU of this rank's node-local rank: node_comm is a
 * communicator of the ranks on this node (MPI_Comm_split_type with
 * MPI_COMM_TYPE_SHARED).  Device local_rank % device_count, so several
 * ranks may share one GPU (multi-rank code paths then run on one GPU,
 * their collectives staged through MPI). */
mt_status_t mt_cuda_device_init(mt_cuda_device_t *dev, MPI_Comm node_comm);
#endif

/* Record a CUDA runtime error (code err from `call`) with its
 * cudaGetErrorString text, file:line and a hint; returns MT_ERR_INTERNAL
 * (MT_ERR_NOMEM for out-of-memory). */
mt_status_t mt_error_cuda(int err, const char *call, const char *file, int line);

/* ------------------------------------------------------------------ arenas */

/* One cudaMalloc; allocations are bumped off it, 256-byte aligned, and
 * released all together (reset) or with the arena (free). */
typedef struct {
    char *base;
    size_t size;
    size_t used;
    size_t peak;
    const char *name; /* for error messages ("params", "activations") */
} mt_cuda_arena_t;

mt_status_t mt_cuda_arena_init(mt_cuda_arena_t *a, const char *name, size_t bytes);
/* *out = bytes of device memory; MT_ERR_NOMEM naming the arena when full. */
mt_status_t mt_cuda_arena_alloc(mt_cuda_arena_t *a, size_t bytes, void **out);
void mt_cuda_arena_reset(mt_cuda_arena_t *a);
void mt_cuda_arena_free(mt_cuda_arena_t *a);

/* The device-memory pool: what is left of an arena, cut up by a best-fit
 * allocator with coalescing (mt_pool.h), so the backend's device_alloc
 * and device_free work on one cudaMalloc.  Until mt_cuda_pool_init runs,
 * device_alloc falls back to cudaMalloc (the kernel tests). */
mt_status_t mt_cuda_pool_init(mt_cuda_arena_t *a);
/* bytes from the pool; NULL when it is not set up or has no block that big */
void *mt_cuda_pool_alloc(size_t bytes);
/* true when p came from the pool (and is released now) */
bool mt_cuda_pool_free(void *p);
/* the pool's size, bytes in use and their peak (zeros without a pool) */
void mt_cuda_pool_stats(size_t *size, size_t *used, size_t *peak);

#if !defined(__CUDACC__)
/* The trainer's bring-up on a rank: bind the GPU of its node-local rank
 * (node_comm: MPI_COMM_TYPE_SHARED), reserve ONE cudaMalloc of
 * fraction x the device's memory / the ranks sharing it (capped at the
 * free memory less 512 MiB; fraction from MT_CUDA_MEMORY_FRACTION, default
 * 0.9), initialise the backend with scratch_bytes of scratch from it, and
 * make the rest the pool.  *reserved gets the arena's size.  Once per
 * process: a later call returns the same binding and reservation. */
mt_status_t mt_cuda_setup(MPI_Comm node_comm, size_t scratch_bytes, mt_cuda_device_t *dev,
                          size_t *reserved);
#endif

/* ------------------------------------------------------------------ backend */

/* Set up the process's CUDA backend on the current device: its stream,
 * cuBLAS and cuBLASLt handles, and scratch_bytes of device scratch taken
 * from `arena` (kernels never allocate; reductions that must be
 * deterministic keep fixed-size partial sums there).  A pinned host buffer
 * of the same order receives the partial sums of the kernels that return a
 * double (cross-entropy, sum_squares).  mt_backend_cuda() is usable
 * after this returns MT_OK; its kernels stop the process if it was not
 * called. */
mt_status_t mt_cuda_backend_init(mt_cuda_arena_t *arena, size_t scratch_bytes);
void mt_cuda_backend_free(void);

/* The CUDA backend's table: same semantics as mt_backend_cpu(), device
 * pointers; kernels run on the backend's stream.  Kernels that return a
 * value (cross_entropy, ce_shard_finish, sum_squares) synchronise it. */
const mt_backend_t *mt_backend_cuda(void);

/* The table for mixed precision as bf16 numerics on fp32 storage
 * (distributed.mp_policy.param_dtype bfloat16 with device cuda; the
 * trainer selects it): every input of a GEMM or of attention is a float32
 * tensor read as bf16 values.  The same table as mt_backend_cuda(), name
 * "cuda_bf16", except:
 *   matmul              tensor cores, CUBLAS_COMPUTE_32F_FAST_16BF (inputs
 *                       converted to bf16, fp32 accumulation, fp32 C);
 *   attention_forward,  bf16 WMMA FlashAttention (cuda_attention_tc.cu),
 *   attention_backward  P and dS rounded to bf16 before their products,
 *                       fp32 softmax and accumulators; head dims 64 and
 *                       128 (others, and devices below sm_80: the fp32
 *                       kernels);
 *   rmsnorm, rope,      rounds_bf16: the activations these entries and
 *   swiglu (forward     attention write are rounded to bf16 in the
 *   and backward)       kernels' stores; reads_bf16: their activation
 *                       inputs are rounded as they are loaded; the bytes
 *                       of the cuda table's entry on round_bf16 of the
 *                       inputs, followed by its round_bf16 (mt_backend.h);
 *   cross_entropy,      read the logits as bf16 values and store dlogits
 *   ce_shard_*          rounded (rounds_bf16).
 * Inputs that are not bf16 values are rounded to bf16 by matmul and
 * attention.
 * Results differ from the CPU backend's by the bounds of doc/gpu.md. */
const mt_backend_t *mt_backend_cuda_bf16(void);

/* bf16 storage on the GPU (stores_bf16, cuda_storage.cu): the rounding
 * table's kernels on bf16 bits, so its entries give the rounding table's
 * bits (the GEMMs, cuBLASLt's bf16 ones, to bf16 tolerance).  Every entry
 * is built; attention runs on tensor cores for head dims 64 and 128 on
 * sm_80 and up, on CUDA cores otherwise.  The trainer takes it for bf16
 * compute on device cuda unless MESHTRAIN_BF16_STORAGE=0
 * (src/train/train_device.c). */
const mt_backend_t *mt_backend_cuda_bf16_storage(void);

/* Whether that table's attention runs on tensor cores for head dim hd on
 * this rank's device (else it runs the fp32 kernels): hd 64 or 128,
 * compute capability >= 8.0, enough opt-in shared memory.  Needs a bound
 * device. */
bool mt_cuda_attention_tc_supported(int64_t hd);

/* Which tensor-core kernels serve it: mma.sync ones (1, the default;
 * src/backend/cuda/cuda_attention_mma.cu) or the WMMA ones (0; cuda_attention_tc.cu);
 * -1 goes back to MESHTRAIN_ATTENTION_KERNEL (mma or wmma).  Tests and
 * benchmarks compare the two with it. */
void mt_cuda_attention_tc_select(int mma);

/* That table's attention entries with the rounding chosen: round true is
 * the table's (inputs read as bf16 values, out; dq, dk, dv rounded as
 * stored), false leaves the fp32 accumulators' values and reads the fp32
 * row dots' inputs as they are (tests compare the two bit for bit). */
void mt_cuda_attention_tc_forward(float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int32_t *doc_start, int64_t B,
                                  int64_t T, int64_t nh, int64_t nkv, int64_t hd, bool round);
void mt_cuda_attention_tc_backward(float *dq, float *dk, float *dv, const float *dout,
                                   const float *out, const float *lse, const float *q,
                                   const float *k, const float *v, const int32_t *doc_start,
                                   int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd,
                                   bool round);

/* The backend's stream (a cudaStream_t) and a blocking wait for it. */
void *mt_cuda_stream(void);
mt_status_t mt_cuda_synchronize(void);

/* ------------------------------------------------------------------ bf16 */

/* bf16 <-> fp32 conversion, round to nearest even (device pointers). */
void mt_cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t n);
void mt_cuda_bf16_to_f32(float *dst, const uint16_t *src, int64_t n);

/* C[M,N] (bf16) = op(A) @ op(B) + beta C with A, B bf16 and fp32
 * accumulation through cuBLASLt; row-major, the transposes of
 * mt_backend_t.matmul.  Also the table's matmul_bf16 entry. */
void mt_cuda_matmul_bf16(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                         int64_t k, bool trans_a, bool trans_b, float beta);

/* Cross-entropy over bf16 logits [n, V] (first v_valid columns real):
 * the loss of cross_entropy in fp32 registers, never an fp32 copy of the
 * logits; the gradient (softmax - onehot) * grad_scale is written as bf16
 * into dlogits (may alias logits) unless it is NULL.  Returns the sum over
 * non-ignored rows (row order), *count their number. */
double mt_cuda_cross_entropy_bf16(uint16_t *dlogits, const uint16_t *logits,
                                  const int32_t *targets, int64_t n, int64_t V, int64_t v_valid,
                                  float grad_scale, int64_t *count);

/* The bf16 GEMMs' cuBLASLt plans (descriptors, layouts and the
 * heuristic's algorithm), kept per shape, transposes, output type and
 * operand alignment, the least recently used given up past 128: how often
 * a GEMM found its plan since mt_cuda_backend_init (doc/gpu.md). */
typedef struct {
    int64_t hits, misses, evictions;
    int plans; /* kept now */
} mt_cuda_lt_stats_t;
void mt_cuda_lt_stats(mt_cuda_lt_stats_t *st);

/* The same with an fp32 C (fp32 accumulation into fp32 weight gradients). */
void mt_cuda_matmul_bf16_f32out(float *c, const uint16_t *a, const uint16_t *b, int64_t m,
                                int64_t n, int64_t k, bool trans_a, bool trans_b, float beta);

/* LM head and cross-entropy together, bf16, in row chunks, so the [n, V]
 * logits never exist whole, in fp32 or bf16.  h [n, H] and W [V, H] are
 * bf16 (W in nn.Linear layout; V = padded vocabulary, v_valid real
 * columns).  For each chunk of at most chunk_rows rows: logits = h W^T
 * into `work` (bf16, chunk_rows * V elements, from the caller), the bf16
 * cross-entropy in place, then dh = dlogits W (bf16, overwritten) and
 * dW += dlogits^T h (fp32).  dh and dW may be NULL (loss only: no
 * gradient pass at all when both are).  Returns the loss summed over
 * non-ignored rows in row order, *count their number. */
double mt_cuda_lm_head_cross_entropy_bf16(uint16_t *dh, float *dW, const uint16_t *h,
                                          const uint16_t *W, const int32_t *targets, int64_t n,
                                          int64_t H, int64_t V, int64_t v_valid,
                                          float grad_scale, uint16_t *work, int64_t chunk_rows,
                                          int64_t *count);

/* AdamW on fp32 master weights p (the table's adamw), also writing the
 * bf16 working copy p_bf16 the forward reads (NULL: none). */
void mt_cuda_adamw_mixed(float *p, uint16_t *p_bf16, const float *g, float *m, float *v, int64_t n,
                         float lr, float b1, float b2, float eps, float wd, int64_t t);

/* ------------------------------------------------------------------ MoE */

/* Routing: expert[i] in [0, n_experts) for the n_assign = tokens*top_k
 * assignments (row-major [tokens, top_k]).  Writes pos[i], the row of
 * assignment i in the expert-sorted order (experts ascending, assignments
 * of one expert in index order: a stable counting sort, deterministic),
 * and offsets[e] (n_experts + 1 entries), the first row of expert e. */
void mt_cuda_moe_route(int32_t *pos, int32_t *offsets, const int32_t *expert, int64_t n_assign,
                       int64_t n_experts);
/* Permute: out[pos[t*top_k+k], :] = x[t, :] (each token copied once per
 * chosen expert).  Its backward is unpermute with weights NULL (1). */
void mt_cuda_moe_permute(float *out, const float *x, const int32_t *pos, int64_t n_tokens,
                         int64_t top_k, int64_t dim);
/* Unpermute: y[t, :] = sum_k w[t,k] * e[pos[t*top_k+k], :], k ascending
 * (w NULL: weights 1).  Overwrites y. */
void mt_cuda_moe_unpermute(float *y, const float *e, const int32_t *pos, const float *w,
                           int64_t n_tokens, int64_t top_k, int64_t dim);
/* Unpermute backward: de[pos[t,k], :] = w[t,k] dy[t, :] (overwrites de),
 * dw[t,k] = dot(dy[t], e[pos[t,k]]) (overwrites dw; skipped when NULL). */
void mt_cuda_moe_unpermute_backward(float *de, float *dw, const float *dy, const float *e,
                                    const int32_t *pos, const float *w, int64_t n_tokens,
                                    int64_t top_k, int64_t dim);

#ifdef __cplusplus
}
#endif
#endif
