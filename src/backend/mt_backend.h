/* mt_backend.h: the one interface every compute kernel sits behind.
 *
 * The model (model.c) calls kernels only through an mt_backend_t table, so
 * the CUDA backend can be added beside the CPU one without touching model
 * code.  The CPU backend (kernels_cpu_*.c, one file per op family) is the
 * reference: fp32, GEMMs through CBLAS, everything else in OpenMP loops.
 *
 * Conventions for every kernel:
 *  - tensors are dense, row-major float32;
 *  - activations are [n_tokens, features] with n_tokens = B*T, token index
 *    b*T + t; q is [B*T, n_heads*head_dim] with head h at columns
 *    h*head_dim..(h+1)*head_dim (the layout q_proj produces, no transposes);
 *  - "_backward" kernels ACCUMULATE (+=) into parameter gradients and
 *    OVERWRITE activation gradients unless the comment says otherwise;
 *  - kernels are deterministic: the same inputs and thread count give
 *    bit-identical outputs (no atomics, no OpenMP reduction clauses whose
 *    combine order can vary).  Activation checkpointing and resume rely on
 *    this;
 *  - kernels never allocate; scratch comes from the caller. */
#ifndef MT_BACKEND_H
#define MT_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_backend mt_backend_t;

struct mt_backend {
    const char *name;

    /* C[M,N] = op(A) @ op(B) + beta * C, row-major; op(A) is [M,K]
     * (A stored [K,M] when trans_a), op(B) is [K,N] (B stored [N,K] when
     * trans_b).  beta 0 overwrites, 1 accumulates. */
    void (*matmul)(float *c, const float *a, const float *b, int64_t m, int64_t n, int64_t k,
                   bool trans_a, bool trans_b, float beta);

    /* out[i,:] = table[tokens[i],:]; dtable[tokens[i],:] += dout[i,:].
     * The backward adds rows in token order (deterministic).  A token -1
     * is one that another rank's vocabulary shard holds (tensor
     * parallelism): forward writes a zero row, backward skips it. */
    void (*embedding_forward)(float *out, const int32_t *tokens, const float *table,
                              int64_t n_tokens, int64_t dim);
    void (*embedding_backward)(float *dtable, const float *dout, const int32_t *tokens,
                               int64_t n_tokens, int64_t dim);

    /* RMSNorm over the last dim, for n rows: rstd[i] = 1/sqrt(mean(x_i^2)+eps),
     * out = x * rstd * w.  Backward: dw += over rows; dx is overwritten, or
     * with accumulate the input gradient is added to it (dx += grad, one
     * float add: a residual stream's gradient). */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *x, const float *w, int64_t n,
                            int64_t dim, float eps);
    void (*rmsnorm_backward)(float *dx, float *dw, const float *dout, const float *x,
                             const float *w, const float *rstd, int64_t n, int64_t dim,
                             bool accumulate);
    /* The same norm over rows split by columns across ranks (a q/k norm
     * over the whole projection under tensor parallelism): each rank holds
     * dim of a row's full_dim columns.  rmsnorm_rowsums writes each row's
     * partial sums[i] = sum_j a_ij b_ij w_j (w NULL: no w) in double, over
     * this rank's columns; the caller adds them over the ranks.  Forward:
     * sums of x x give rstd = 1/sqrt(sums/full_dim + eps).  Backward: sums
     * of dout w x, over the whole row; dw gathers this rank's columns.  On
     * one rank (dim == full_dim) they equal rmsnorm_forward/_backward up to
     * the order of the row sums.  a and b are activations: read as bf16
     * where reads_bf16. */
    void (*rmsnorm_rowsums)(double *sums, const float *a, const float *b, const float *w,
                            int64_t n, int64_t dim);
    void (*rmsnorm_forward_sums)(float *out, float *rstd, const float *x, const float *w,
                                 const double *sums, int64_t n, int64_t dim, int64_t full_dim,
                                 float eps);
    void (*rmsnorm_backward_sums)(float *dx, float *dw, const float *dout, const float *x,
                                  const float *w, const float *rstd, const double *sums,
                                  int64_t n, int64_t dim, int64_t full_dim, bool accumulate);

    /* RoPE in place on x [n_tokens, n_heads*head_dim], Hugging Face
     * rotate_half pairing: element i pairs with i + head_dim/2 and turns by
     * the angle pos[token] * inv_freq[i] (i < head_dim/2), formed in double;
     * cos and sin, taken in double, are multiplied by scale before they
     * are rounded to float.  inv_freq [head_dim/2] is backend memory (the
     * model's table, model_rope.c: theta^(-2i/head_dim), or a RoPE
     * scaling's); scale is transformers' attention_scaling (yarn's
     * attention factor, else 1.0, which changes no bit).  The backward
     * applies the transpose, scale times the inverse rotation, in place to
     * the gradient. */
    void (*rope_forward)(float *x, const int32_t *pos, int64_t n_tokens, int64_t n_heads,
                         int64_t head_dim, const double *inv_freq, double scale);
    void (*rope_backward)(float *dx, const int32_t *pos, int64_t n_tokens, int64_t n_heads,
                          int64_t head_dim, const double *inv_freq, double scale);

    /* Causal grouped-query attention, scale 1/sqrt(head_dim).
     * q [B*T, nh*hd], k and v [B*T, nkv*hd]; query head h uses kv head
     * h / (nh/nkv).  doc_start: NULL, or per token the index (within its
     * row) of its first visible key; token t then attends to t' with
     * doc_start[t] <= t' <= t: the first token of its document (packing),
     * later under a sliding window (doc/sliding-window.md).  Any values
     * in [0, t] are served, document starts or not.
     * out [B*T, nh*hd]; lse [B, nh, T] = log-sum-exp of the scaled scores
     * (kept for backward).  Backward overwrites dq, dk, dv. */
    void (*attention_forward)(float *out, float *lse, const float *q, const float *k,
                              const float *v, const int32_t *doc_start, int64_t B, int64_t T,
                              int64_t nh, int64_t nkv, int64_t hd);
    void (*attention_backward)(float *dq, float *dk, float *dv, const float *dout,
                               const float *out, const float *lse, const float *q,
                               const float *k, const float *v, const int32_t *doc_start,
                               int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd);

    /* SwiGLU: out = silu(gate) * up over n elements.  Backward overwrites
     * dgate and dup (which may alias gate and up: the kernel reads each
     * element before writing it). */
    void (*swiglu_forward)(float *out, const float *gate, const float *up, int64_t n);
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, int64_t n);

    /* Softmax cross-entropy over rows of logits [n, V] of which the first
     * v_valid columns are real (the rest is vocabulary padding, masked out).
     * Targets equal to -100 are ignored.  Returns the SUM of the losses of
     * the non-ignored rows (double, summed in row order); writes the number
     * of non-ignored rows to *count.  If dlogits is not NULL it receives
     * (softmax - onehot) * grad_scale for non-ignored rows and 0 for ignored
     * rows and padding columns; dlogits may alias logits. */
    double (*cross_entropy)(float *dlogits, const float *logits, const int32_t *targets,
                            int64_t n, int64_t V, int64_t v_valid, float grad_scale,
                            int64_t *count);

    /* Vocabulary-parallel cross-entropy (tensor parallelism): the same loss
     * and gradient as cross_entropy, computed by shards that each hold
     * columns [v_lo, v_lo + V) of the vocabulary, of which the first
     * v_valid are real (0 is allowed), in three passes between which the
     * caller combines the shards' partial results:
     *   ce_shard_max:    mx[i] = max of row i's valid columns (-inf if none);
     *                    the caller takes the max over the shards;
     *   ce_shard_sum:    z[i] = sum_j exp(l_ij - mx[i]) over valid columns,
     *                    ly[i] = l_iy if this shard holds row i's target
     *                    y, else 0; the caller sums z and ly over shards;
     *   ce_shard_finish: returns the SUM over non-ignored rows of
     *                    mx + log z - ly (row order; every shard returns
     *                    the same), *count their number, and writes dlogits
     *                    (softmax - onehot) * grad_scale for this shard's
     *                    columns (0 on padding and ignored rows) unless
     *                    dlogits is NULL; dlogits may alias logits.
     * Targets -100 are ignored. */
    void (*ce_shard_max)(float *mx, const float *logits, int64_t n, int64_t V, int64_t v_valid);
    void (*ce_shard_sum)(double *z, double *ly, const float *logits, const int32_t *targets,
                         const float *mx, int64_t n, int64_t V, int64_t v_lo, int64_t v_valid);
    double (*ce_shard_finish)(float *dlogits, const float *logits, const int32_t *targets,
                              const float *mx, const double *z, const double *ly, int64_t n,
                              int64_t V, int64_t v_lo, int64_t v_valid, float grad_scale,
                              int64_t *count);

    /* y += x over n elements. */
    void (*add)(float *y, const float *x, int64_t n);

    /* Sum of squares of x (double accumulation, deterministic order). */
    double (*sum_squares)(const float *x, int64_t n);

    /* x *= s over n elements. */
    void (*scale)(float *x, float s, int64_t n);

    /* One AdamW step (decoupled weight decay, bias correction) with step
     * number t >= 1:  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
     * p -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd * p),
     * where g is the stored gradient times gscale (gradient clipping's
     * coefficient, 1 for none), one float product: the bits of scaling the
     * gradient first, without the pass (the stored gradient is left as it
     * is). */
    void (*adamw)(float *p, const float *g, float gscale, float *m, float *v, int64_t n,
                  float lr, float b1, float b2, float eps, float wd, int64_t t);

    /* ---- context parallelism: block attention for ring attention.
     * One block = nq query tokens against nk key/value tokens taken from
     * anywhere in a row, identified by their GLOBAL indices in the row:
     * query i is token q0 + i, key c is token k0 + c.  q [nq, nh*hd], k and
     * v [nk, nkv*hd] (rows contiguous); doc_start NULL (plain causal) or
     * [nq]: the global index of query i's first visible key (document
     * start, or the window's); query i sees key j when doc_start[i] <= j
     * <= q0 + i.  lse entries are
     * lse[h * lse_stride + i].
     * Forward MERGES into a running (out, lse) (online softmax over blocks):
     * on entry they hold the attention over the keys of earlier blocks (lse
     * -inf and out 0 before the first), on return over those and this
     * block's keys; rows that see no key of the block are left untouched.
     * Backward takes the final (out, lse) of all blocks and ACCUMULATES
     * (+=) this block's share into dq [nq, nh*hd], dk and dv [nk, nkv*hd]
     * (FlashAttention-2 with P = exp(S - lse)). */
    void (*attention_block_forward)(float *out, float *lse, int64_t lse_stride, const float *q,
                                    const float *k, const float *v, const int32_t *doc_start,
                                    int64_t nq, int64_t nk, int64_t q0, int64_t k0, int64_t nh,
                                    int64_t nkv, int64_t hd);
    void (*attention_block_backward)(float *dq, float *dk, float *dv, const float *dout,
                                     const float *out, const float *lse, int64_t lse_stride,
                                     const float *q, const float *k, const float *v,
                                     const int32_t *doc_start, int64_t nq, int64_t nk,
                                     int64_t q0, int64_t k0, int64_t nh, int64_t nkv, int64_t hd);

    /* ---- memory moves for device backends ----
     * Memory moves for a backend whose tensors live on a device; the
     * model's memcpy/memset on arena memory go through these once it is
     * wired to the device (doc/gpu.md).  On the CPU backend they are
     * memcpy, memset and nothing.  copy_to_device / copy_to_host move
     * bytes between host memory and the backend's memory, copy within the
     * backend's memory.  The two that touch host memory block until
     * done; copy and zero (0 bytes in the backend's memory) are in order
     * with the kernels, the host going on.  synchronize
     * waits for every kernel issued so far. */
    void (*copy_to_device)(void *dst, const void *src, size_t bytes);
    void (*copy_to_host)(void *dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*zero)(void *dst, size_t bytes);
    void (*synchronize)(void);

    /* matmul with bf16 operands and result (uint16_t bit patterns,
     * round to nearest even), fp32 accumulation; same shapes, transposes
     * and beta as matmul.  The CPU version is a plain reference loop. */
    void (*matmul_bf16)(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                        int64_t k, bool trans_a, bool trans_b, float beta);

    /* ---- mixture of experts (model_moe.c) ---- */
    /* Router over n tokens and E experts: probs [n,E] holds the router
     * logits on entry and their softmax on return; idx [n,k] gets the top
     * k experts by probability + bias[e] (bias NULL: 0; aux-loss-free
     * balancing), descending, ties to the LOWEST index, and w [n,k] their
     * probabilities (without the bias), divided by their sum when
     * norm_topk. */
    void (*moe_router_forward)(float *probs, int32_t *idx, float *w, const float *bias,
                               int64_t n, int64_t E, int64_t k, bool norm_topk);
    /* Its backward: dlogits [n,E] (overwritten) from dw [n,k], the
     * gradient of the routing weights, plus dp_all [E] (may be NULL), a
     * gradient added to every token's probability of each expert (the
     * load-balancing loss). */
    void (*moe_router_backward)(float *dlogits, const float *dw, const float *probs,
                                const int32_t *idx, const float *w, const float *dp_all,
                                int64_t n, int64_t E, int64_t k, bool norm_topk);
    /* The router's probability sums (the load-balancing loss's P): adds
     * probs[t,e] into sums[e] (double, the backend's memory), one t after
     * another in order, for every e < E: the same bits on every backend,
     * and as a host loop adding into a running total. */
    void (*moe_prob_sums)(double *sums, const float *probs, int64_t n, int64_t E);
    /* dst[i,:] = src[rows[i],:] for i < n (rows of `width` floats). */
    void (*moe_gather_rows)(float *dst, const float *src, const int32_t *rows, int64_t n,
                            int64_t width);
    /* out[t,:] = res[t,:] (0 when res is NULL) + sum over j < k, in order,
     * of w[t,j] (1 when w is NULL) * y[slot_row[t,j],:]; slots with
     * slot_row -1 (dropped by a capacity limit) are skipped. */
    void (*moe_combine)(float *out, const float *res, const float *y, const int32_t *slot_row,
                        const float *w, int64_t n, int64_t k, int64_t width);
    /* Backward of moe_combine with w: dw[t,j] = dout[t,:] . y[slot_row[t,j],:]
     * and dy[slot_row[t,j],:] = w[t,j] dout[t,:] (both overwritten); a
     * dropped slot (slot_row -1) gets dw 0 and no row. */
    void (*moe_combine_backward)(float *dw, float *dy, const float *dout, const float *y,
                                 const int32_t *slot_row, const float *w, int64_t n, int64_t k,
                                 int64_t width);

    /* ---- the backend's own memory (doc/gpu.md) ----
     * The backend's own memory: device_alloc returns `bytes` (0 allowed)
     * of zeroed memory that the kernels and the copy/zero entries above
     * take, or NULL when out of memory; device_free releases what
     * device_alloc returned (NULL: nothing).  The model allocates every
     * tensor the kernels read or write here, and host code reaches it only
     * through this table.  CPU: calloc and free; CUDA: cudaMalloc plus a
     * memset on the backend's stream, and cudaFree. */
    void *(*device_alloc)(size_t bytes);
    void (*device_free)(void *p);

    /* ---- bf16 rounding for mixed precision (doc/mixed-precision.md) ----
     * x[i] = the bfloat16 value nearest x[i] (round to nearest, ties to
     * even; NaN stays NaN, infinities stay), in place over n floats.  The
     * model stores a bf16 tensor as float32 holding bf16 values, so this
     * is the one cast; rounding a bf16 value again leaves it unchanged. */
    void (*round_bf16)(float *x, int64_t n);

    /* ---- bf16 conversions for bf16 storage (doc/mixed-precision.md) ----
     * to_bf16: dst[i] = the bf16 bits of src[i], rounded as round_bf16
     * rounds (exact for a bf16 value); from_bf16: dst[i] = the float of
     * the bf16 bits src[i] (exact).  n elements of the backend's memory
     * each; activation checkpointing keeps its layer inputs this way. */
    void (*to_bf16)(uint16_t *dst, const float *src, int64_t n);
    void (*from_bf16)(float *dst, const uint16_t *src, int64_t n);

    /* ---- mixed precision's optimizer step ----
     * adamw on the fp32 master weights p, and in the same pass work[i] =
     * the bf16 value nearest the updated p[i] (round_bf16's rounding): the
     * compute copy the model reads (train_mp.c), without a copy and a
     * rounding pass after the update.  p, m, v get adamw's bits exactly;
     * work does not overlap them. */
    void (*adamw_bf16_copy)(float *p, float *work, const float *g, float gscale, float *m,
                            float *v, int64_t n, float lr, float b1, float b2, float eps,
                            float wd, int64_t t);

    /* ---- float32 results from bf16 storage (doc/mixed-precision.md) ----
     * C[M,N] = op(A) @ op(B) + beta * C with a float32 C, shapes and
     * transposes as matmul's.  On a table with stores_bf16 (below) A and B
     * are bf16 bits, as matmul's are there, but C stays float32: the
     * weight gradients, the router's logits and the sums of several GEMMs
     * rounded once after the last (doc/mixed-precision.md, "bf16 storage:
     * the plan") take it.  On every other table it is matmul. */
    void (*matmul_f32out)(float *c, const float *a, const float *b, int64_t m, int64_t n,
                          int64_t k, bool trans_a, bool trans_b, float beta);
    /* y[i] += x[i] on float32 on every table: the sums that are float32
     * under bf16 storage too (gradient shards over micro-steps, the ring
     * attention's dK/dV partial sums), where add's y and x are bf16 bits.
     * On every other table it is add. */
    void (*add_f32)(float *y, const float *x, int64_t n);
    /* c[m,n] = r[m,n] + op(a) op(b): the residual branches' output
     * projections (c the next residual, r the last), types, shapes and
     * transposes as matmul's; r == c is matmul with beta 1.  The bits of
     * copying r into c and then matmul with beta 1, which is what every
     * table does but bf16 storage's, whose cuBLASLt GEMM reads r as C and
     * writes c as D: no copy of the residual first. */
    void (*matmul_add)(float *c, const float *r, const float *a, const float *b, int64_t m,
                       int64_t n, int64_t k, bool trans_a, bool trans_b);

    /* ---- fused rounding (doc/mixed-precision.md) ----
     * true on the tables the model takes for bf16 mixed precision
     * (mt_backend_cpu_bf16, mt_backend_cuda_bf16): these entries round
     * the activations they write to bf16 values as round_bf16 does, in
     * the kernel's own store, instead of leaving a pass over the tensor to
     * the caller:
     *   rmsnorm_forward (out; rstd stays fp32), rmsnorm_backward (dx, after
     *   the accumulation; dw is a gradient, fp32), rope_forward,
     *   rope_backward, swiglu_forward,
     *   swiglu_backward (dgate, dup), attention_forward (out; lse fp32),
     *   attention_backward (dq, dk, dv);
     * and cross_entropy and ce_shard_max / _sum / _finish read each logit
     * as its bf16 value and write dlogits rounded, so the caller rounds
     * neither the logits nor their gradient (these may leave the logits
     * buffer rounded in place: the CPU's do).
     * Each writes exactly round_bf16 of what the plain table writes (for
     * the loss entries: what the plain one writes and returns from rounded
     * logits); every other entry is the plain one's.  false: nothing is
     * rounded. */
    bool rounds_bf16;
    /* With rounds_bf16 (mt_backend_cuda_bf16; not the CPU's, below): those
     * entries also read their activation inputs as bf16 values, rounding
     * each element as it is loaded:
     *   rmsnorm_forward (x), rmsnorm_backward (dout, x, and dx when it
     *   accumulates), rope_forward and rope_backward (x), swiglu_forward
     *   (gate, up), swiglu_backward (dout, gate, up), attention_forward
     *   (q, k, v), attention_backward (dout, out, q, k, v).
     * Each writes exactly what it writes from round_bf16 of those inputs
     * (rounding is idempotent: inputs that are bf16 values change
     * nothing), so the model leaves a GEMM's output unrounded when only
     * these entries read it (mt_model_round_in, model_moe.h): the pass
     * moves into the reader's load.  Weights, rstd and lse are read as
     * they are.  The CPU's rounding table leaves this false: its loops
     * are compute-bound on SSE2, where a rounding per load costs more
     * than the pass it saves (doc/mixed-precision.md). */
    bool reads_bf16;
    /* bf16 storage (mt_backend_cpu_bf16_storage, mt_backend_cuda_bf16_storage;
     * doc/mixed-precision.md):
     * the tensors below are bf16 bits (uint16_t, round to nearest even,
     * 2 bytes an element) behind their float pointers, and n, m, k, dim
     * and the shapes still count elements.  Each entry computes exactly
     * what the rounding table (rounds_bf16) computes from the widened
     * values, and stores its bf16 outputs rounded (for matmul: the
     * rounding table's fp32 result, then round_bf16):
     *   matmul: a, b, c;  matmul_f32out: a, b (c float32);
     *   embedding_forward: out, table;  embedding_backward: dout;
     *   rmsnorm_forward: out, x, w;  rmsnorm_backward: dx, dout, x, w;
     *   rope_forward, rope_backward: x;
     *   attention_forward: out, q, k, v;
     *   attention_backward: dq, dk, dv, dout, out, q, k, v;
     *   swiglu_forward: out, gate, up;  swiglu_backward: all five;
     *   cross_entropy, ce_shard_*: logits, dlogits;  add: y, x;
     *   attention_block_forward: q, k, v (out float32: the ring's running
     *   merge);  attention_block_backward: dout, out, q, k, v (dq, dk, dv
     *   float32: sums over blocks);
     *   moe_router_backward: dlogits;  moe_gather_rows: dst, src;
     *   moe_combine: res, y (out float32: a sum the shared experts may add
     *   to);  moe_combine_backward: dy, dout, y;
     *   adamw_bf16_copy: work.
     * Float32 everywhere: parameter gradients (dw, dtable, matmul_f32out's
     * c, add_f32), rstd, lse, the loss's mx, z and ly, the router's logits,
     * probabilities and weights, the combine's dw, and sum_squares,
     * scale, adamw, round_bf16, to_bf16's source and from_bf16's
     * destination.  Such a table also sets rounds_bf16 and reads_bf16
     * (its outputs are rounded and its inputs bf16, trivially); the model
     * then runs no rounding pass of its own. */
    bool stores_bf16;
    /* The table's memory is plain host memory: MPI and host code may take
     * its pointers as they are.  true for the CPU tables and copies of
     * them; false for device memory (cuda) and for memory the host must
     * not touch directly (cpu_guarded, the profiling wrapper), whose
     * collectives stage through host buffers (mt_stage.h). */
    bool host_memory;
};

/* true when MPI may not be handed be's memory directly. */
static inline bool mt_stage_needed(const mt_backend_t *be) { return !be->host_memory; }

/* The CPU reference backend. */
const mt_backend_t *mt_backend_cpu(void);
/* The same with rounds_bf16 (name "cpu_bf16"): the table the model takes
 * for bf16 mixed precision on the CPU. */
const mt_backend_t *mt_backend_cpu_bf16(void);

/* bf16 storage on the CPU (name "cpu_bf16_storage", kernels_cpu_storage.c):
 * each entry widens its bf16 arguments into float32 scratch, runs the
 * rounding table's entry and narrows its bf16 outputs, exact both ways,
 * so it computes the rounding table's bits.  It is the reference the
 * GPU's bf16-storage kernels and the model's bf16 storage are checked
 * against, not a fast path: its scratch is the one exception to
 * "kernels never allocate" (grow-only, kept for the process). */
const mt_backend_t *mt_backend_cpu_bf16_storage(void);

/* The CPU backend with a guard, for tests (kernels_cpu_guard.c): the same
 * kernels, but device_alloc returns mmap'd pages that are PROT_NONE except
 * while one of this table's entries runs, so host code that touches
 * backend memory without going through the backend faults, as it would
 * on a GPU.  Kernels may still be given host pointers.  The first call
 * installs a SIGSEGV handler that prints the faulting address, the
 * allocation it falls in and (glibc) a backtrace, then _exits with
 * MT_CPU_GUARD_EXIT.  One host thread; slow (every call changes the
 * protection of every allocation). */
#define MT_CPU_GUARD_EXIT 86
const mt_backend_t *mt_backend_cpu_guarded(void);
/* Strict: every tensor argument of a guarded call (not the scalar out
 * parameters like cross_entropy's count) must be the guarded backend's
 * memory or NULL; a host array handed to a kernel, which a GPU could not
 * read, stops the program the same way.  Off by default; on from the
 * first mt_backend_cpu_guarded() call when the environment sets
 * MESHTRAIN_GUARD_STRICT to anything but 0 (the trainer's guarded runs in
 * tests/train/device_guard.sh). */
void mt_cpu_guard_strict(bool on);

/* A table that times every entry of be (kernels_profile.c): each call
 * synchronizes be before and after, so its time is the kernel's alone
 * (on a GPU with its launch); the numbers are be's.  One be per process:
 * NULL for a second, different one.  The trainer uses it under
 * MESHTRAIN_PROFILE=1 (doc/performance.md, "Kernel profile").  report
 * prints entries by total time, then matmul's top_shapes largest shapes
 * with their TFLOP/s, against wall_s, and returns the seconds spent in
 * the backend; reset forgets what was counted (the first step's warm-up). */
const mt_backend_t *mt_backend_profiled(const mt_backend_t *be);
double mt_backend_profile_report(FILE *out, double wall_s, int top_shapes);
void mt_backend_profile_reset(void);

#ifdef __cplusplus
}
#endif
#endif
