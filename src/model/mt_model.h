/* mt_model.h: the Llama-architecture decoder (Hugging Face
 * LlamaForCausalLM with its attention_bias and mlp_bias, Qwen2's q/k/v
 * biases, optional Qwen3 qk_norm, any head_dim), written for one device.
 *
 * Forward and backward are written by hand and call kernels only through
 * an mt_backend_t.  Parameters, gradients and activations live in arenas
 * sized once by mt_model_init; a training step allocates nothing.  How the
 * model is sharded across ranks is decided elsewhere (the parallelize
 * layer); this file knows nothing about MPI. */
#ifndef MT_MODEL_H
#define MT_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "mt_backend.h"
#include "mt_config.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_PARAM_NAME_MAX 96

typedef struct mt_param {
    char name[MT_PARAM_NAME_MAX]; /* Hugging Face name */
    int ndim;
    int64_t shape[2];             /* PyTorch shape: [out, in] for linears */
    int64_t numel;
    int64_t offset;               /* element offset in the flat parameter order */
    float *data, *grad;           /* into the model's arenas, or wherever the
                                   * parallelize layer points them */
    bool no_decay;                /* norm weights and biases: no weight decay */
    bool is_norm;                 /* initialised to 1 */
    bool is_bias;                 /* a linear's bias: initialised to 0 */
    /* Tensor parallelism: this rank's part of the logical tensor
     * full_shape.  tp_dim -1: replicated (whole); 0: rows [tp_off,
     * tp_off + shape[0]) (column-parallel linears, vocabulary shards);
     * 1: columns [tp_off, tp_off + shape[1]) (row-parallel linears). */
    int tp_dim;
    int64_t tp_off;
    int64_t full_shape[2];
    bool tp_partial_grad;         /* whole on every TP rank, but each rank's
                                   * gradient covers only its heads (q_norm,
                                   * k_norm): to be summed over TP */
    /* LoRA (peft:, model_lora.c): a frozen linear's adapters, lora_A [r,
     * in] and lora_B [out, r] (trainable parameters), or NULL */
    struct mt_param *lora_a, *lora_b;
} mt_param_t;

/* The model's tensor-parallel collectives (mt_model_t.tp_allreduce). */
typedef enum {
    MT_TP_SUM_FLOAT,       /* all-reduce, n elements, in place */
    MT_TP_MAX_FLOAT,
    MT_TP_SUM_DOUBLE,
    MT_TP_GATHER_FLOAT,    /* all-gather: n from each rank -> n * tp, rank order */
    MT_TP_SCATTER_FLOAT    /* reduce-scatter: sum n * tp, keep this rank's n */
} mt_tp_op_t;

typedef struct {
    mt_param_t *attn_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm;
    mt_param_t *mlp_norm, *wgate, *wup, *wdown;
    /* the linears' biases (mt_model_qkv_bias, mt_model_o_bias, mlp_bias),
     * each right after its weight in the flat order; NULL without */
    mt_param_t *bq, *bk, *bv, *bo, *bgate, *bup, *bdown;
    mt_param_t *router; /* MoE layers: mlp.gate.weight (the experts are in
                         * model_moe.c); NULL for a dense MLP.  A MoE layer's
                         * wgate, wup, wdown are its shared experts
                         * (mlp.shared_experts.*), or NULL */
} mt_layer_params_t;

/* The expert-parallel all-to-alls (mt_model_t.ep_alltoall), over the EP
 * group in rank order:
 *   MT_EP_COUNTS: `width` int64 to each rank (send + d * width goes to
 *                 rank d), the same from each into recv; counts ignored;
 *   MT_EP_ROWS:   scounts[d] rows of `width` floats to rank d, in rank
 *                 order, rcounts[s] rows from rank s into recv. */
typedef enum { MT_EP_COUNTS, MT_EP_ROWS } mt_ep_op_t;

/* What a unit hook is told.  A unit is a contiguous range of the flat
 * parameter order that forward and backward use together: unit 0 is the
 * embedding, unit l+1 is decoder layer l, unit L+1 the final norm with the
 * (untied) lm_head.  Under pipeline parallelism l counts this rank's
 * layers, and the embedding or head unit is empty where the rank does not
 * hold it.  A tied lm_head is the embedding's weight: it is used
 * by unit L+1 but belongs to unit 0. */
typedef enum {
    MT_UNIT_PRE_FORWARD,   /* about to read the unit's parameters */
    MT_UNIT_POST_FORWARD,  /* forward of the unit done (not sent for the
                            * last unit when backward follows) */
    MT_UNIT_PRE_BACKWARD,  /* about to run the unit's backward */
    MT_UNIT_POST_BACKWARD  /* the gradients of every parameter at flat
                            * offset >= unit_lo[unit] are final for this
                            * micro-step (except a tied embedding, final
                            * only after unit 0) */
} mt_unit_event_t;

/* mt_model_init_ex flags: leave an arena out; the parallelize layer then
 * points every parameter's data (or grad) at its own buffers before the
 * unit is used (model-only code never touches absent arenas). */
#define MT_MODEL_NO_PARAM_ARENA 1u
#define MT_MODEL_NO_GRAD_ARENA 2u
/* ... and no activations: a table of the parameters' names and shapes. */
#define MT_MODEL_NO_ACT_ARENA 4u
/* The same for the MoE experts' own arenas (model_moe.h): the trainer
 * shards them over ep_shard. */
#define MT_MODEL_NO_EXPERT_ARENAS 8u

/* Saved activations of one layer (pointers into the activation arena). */
typedef struct {
    float *x;            /* layer input [Ns, H] */
    /* Under activation checkpointing with bf16 values (x_bf16): the kept
     * input of a layer that is not its stage's first, as bf16 bits [Ns,
     * H]; x then points at x_final while the layer runs.  NULL
     * otherwise. */
    uint16_t *x16;
    float *h1, *rstd1;   /* attention norm */
    float *q_raw, *k_raw, *q_rstd, *k_rstd; /* qk_norm inputs (NULL without) */
    float *q, *k, *v;    /* after RoPE */
    float *att, *lse;    /* attention output, log-sum-exp */
    float *x_mid;        /* after the attention residual */
    float *h2, *rstd2;   /* MLP norm */
    float *g, *u, *a;    /* gate, up, silu(gate)*up */
    /* Split backward (zero-bubble pipelines): the output gradients of the
     * linears, kept by the input-gradient pass B for the weight-gradient
     * pass W.  NULL otherwise.  (g and u hold the gate and up gradients
     * after B in every case.) */
    float *w_dmlp, *w_datt;  /* [N, H]: d(down_proj out), d(o_proj out) */
    float *w_dq, *w_dk, *w_dv; /* [N, Q], [N, KV], [N, KV] */
} mt_layer_acts_t;

/* What part of the model this rank holds (pipeline parallelism): the
 * stages it runs, each a contiguous range of global layers, in ascending
 * order; whether the first stage (embedding) and the last (final norm,
 * lm_head, loss) are among them; how many stage-microbatches may hold
 * activations at once (slots); whether backward is split into B and W. */
typedef struct {
    int nchunks;
    const int *layer_lo, *layer_hi; /* [nchunks]: global layers [lo, hi) */
    bool embed, head;
    int nslots;
    bool split_backward;
} mt_model_part_t;

typedef struct {
    const mt_backend_t *be;
    /* shape */
    /* Shape.  Under tensor parallelism V, V_valid, I, nh and nkv are this
     * rank's: vocabulary columns [v_lo, v_lo + V) of the padded vocabulary
     * (V_valid of them real), I/tp of the MLP, nh/tp and nkv/tp heads. */
    int64_t V, V_valid, H, I, L, nh, nkv, hd;
    /* Pipeline parallelism: L is the number of layers this rank holds,
     * L_full the model's; layer_id[l] is local layer l's global index (its
     * name and initial values).  The rank runs nchunks stages, chunk c
     * being local layers [chunk_lo[c], chunk_lo[c + 1]); has_embed: chunk 0
     * starts with the embedding; has_head: the last chunk ends with the
     * norm, lm_head and loss.  One device: one chunk of every layer. */
    int64_t L_full;
    int *layer_id;
    int nchunks;
    int *chunk_lo;
    bool has_embed, has_head, split_bw;
    int tp, tp_rank;     /* 1, 0 on one device */
    int64_t v_lo, V_valid_full;
    float eps;
    double init_std;
    bool tied, qk_norm, checkpointing;
    bool qk_norm_whole;  /* q/k norm over all heads of the projection (OLMoE), not per head */
    int64_t B, T, N;     /* micro-batch: B rows of T tokens, N = B*T */

    /* parameters */
    mt_param_t *params;
    int nparams;
    int64_t numel;       /* all parameters */
    float *param_mem, *grad_mem; /* NULL when left out (mt_model_init_ex) */
    int nunits;          /* L + 2 */
    int64_t *unit_lo;    /* [nunits + 1]: unit u is [unit_lo[u], unit_lo[u+1]) */
    mt_param_t *embed, *final_norm, *lm_head; /* lm_head == embed when tied */
    mt_layer_params_t *layers;

    /* activations: nslots slots of slot_numel floats (what a
     * stage-microbatch keeps from forward to backward), then the scratch
     * every slot shares; the pointers below are those of the slot and
     * chunk last chosen (mt_model_use_slot) */
    float *act_mem;
    int64_t act_numel, slot_numel;
    int nslots;
    mt_layer_acts_t *acts;   /* L entries (all point to `scratch` except x under AC) */
    mt_layer_acts_t scratch; /* recompute buffers under activation checkpointing */
    float *x_final, *xf, *rstdf, *logits; /* logits: [head_chunk, V] */
    int64_t head_chunk;  /* rows of the LM head and loss at once (mt_model_head_chunk) */
    float *dres, *dtmp, *dh, *datt, *dq, *dk, *dv, *dI;
    int32_t *pos;        /* [N] positions */
    struct mt_rope *rope; /* RoPE's inverse frequencies and cos/sin scale (model_rope.h) */
    /* [N] ones (bf16 bits under bf16 storage), or NULL without biases: a
     * bias is added as the rank-1 GEMM ones b^T and its gradient is the
     * GEMM dy^T ones, so the biases need no kernels of their own and
     * round where the matmuls round */
    float *ones;
    const int32_t *doc_start; /* [N] each query's first visible key (doc_mem), or NULL */
    int64_t window;           /* sliding window (model.sliding_window), 0: none */

    /* Called around each unit's forward and backward (mt_unit_event_t), so
     * the parallelize layer can gather parameters before a unit runs and
     * start gradient reductions while backward goes on.  NULL: no hook. */
    void (*unit_hook)(void *ctx, int unit, mt_unit_event_t ev);
    void *hook_ctx;

    /* With tp > 1: a collective over the TP group (mt_tp_op_t; the
     * all-reduces are in place, in == out).  The parallelize layer sets it
     * before the first step. */
    void (*tp_allreduce)(void *ctx, const void *in, void *out, int64_t n, mt_tp_op_t op);
    /* Optional asynchronous form (NULL: the model calls tp_allreduce):
     * tp_start starts the collective and returns a ticket, or NULL when it
     * has already completed; tp_join(ctx, ticket) orders the kernels
     * launched after it behind the collective.  Between the two the model
     * launches only kernels that neither write `in` nor touch `out`, so
     * the collective runs behind them (Megatron's overlap of a column-
     * parallel layer's input-gradient reduction with its weight-gradient
     * GEMMs). */
    void *(*tp_start)(void *ctx, const void *in, void *out, int64_t n, mt_tp_op_t op);
    void (*tp_join)(void *ctx, void *ticket);
    /* Sequence parallelism (tp > 1): the residual stream, the norms and
     * their inputs hold this rank's Ns = N / tp tokens (rows
     * [tp_rank * Ns, (tp_rank + 1) * Ns)); the norm outputs are all-gathered
     * before the column-parallel layers and the row-parallel outputs
     * reduce-scattered.  Ns = N without it. */
    bool sp;
    /* Mixed precision (distributed.mp_policy.param_dtype bfloat16,
     * doc/mixed-precision.md): every activation and activation gradient
     * is rounded to a bf16 value once it is complete (round_bf16); the
     * parameter arena holds bf16 values, which the parallelize layer
     * keeps so (fp32 master weights live with the optimizer). */
    bool bf16;
    /* Activation checkpointing under bf16: the layer inputs kept from
     * forward to backward are bf16 bits (x16), half the bytes; the stage's
     * first layer keeps its float32 input (the stage input a pipeline
     * receives into).  The other layers run on x_final: the forward writes
     * each output over its input (a layer reads its input only before it
     * writes its output), the backward unpacks the input there (the
     * stage's output is sent or used by the head before). */
    bool x_bf16;
    /* bf16 storage (the backend's stores_bf16; doc/mixed-precision.md,
     * "bf16 storage: the plan"): the parameter arena and every activation
     * buffer but the float32 ones (rstd, lse, the accumulator dh_acc) hold
     * bf16 bits, 2 bytes an element, behind their float pointers, and the
     * model runs no rounding pass (mt_act_at, mt_act_bytes below).
     * So far one device, dense: mt_model_init refuses tensor parallelism
     * and experts with such a backend. */
    bool bf16_storage;
    float *dh_acc;       /* [N, H] float32 under bf16 storage: the column-parallel
                          * layers' summed input gradient, rounded once */
    int64_t Ns;
    float *dh_local;     /* [Ns, H] under sequence parallelism */
    float *gather;       /* [N, H] under sequence parallelism: a gathered norm output */
    void *tp_ctx;
    int32_t *tok_local;  /* [N] the micro-batch's tokens; under TP this
                          * vocabulary shard's (-1 elsewhere) */
    float *ce_mx;        /* [N] vocabulary-parallel loss: row max */
    double *ce_z, *ce_ly; /* [N] exp-sums, target logits */

    /* Context parallelism: when set, attention runs through these instead
     * of be->attention_forward/backward, with the same arguments; T is
     * then this rank's local tokens of each row, pos their global
     * positions and doc_start global row indices (mt_ring_attention.h).
     * The parallelize layer sets them; NULL: the backend's kernels. */
    void (*attn_forward)(void *ctx, float *out, float *lse, const float *q, const float *k,
                         const float *v, const int32_t *doc_start, int64_t B, int64_t T,
                         int64_t nh, int64_t nkv, int64_t hd);
    void (*attn_backward)(void *ctx, float *dq, float *dk, float *dv, const float *dout,
                          const float *out, const float *lse, const float *q, const float *k,
                          const float *v, const int32_t *doc_start, int64_t B, int64_t T,
                          int64_t nh, int64_t nkv, int64_t hd);
    void *attn_ctx;
    /* Mixture of experts (model_moe.c, model_moe.h): experts, routing
     * state and the load-balancing loss; NULL for a dense model. */
    struct mt_moe *moe;
    /* With ep > 1: token dispatch to the experts' owners (mt_ep_op_t),
     * set by the parallelize layer like tp_allreduce. */
    void (*ep_alltoall)(void *ctx, mt_ep_op_t op, const void *send, const int64_t *scounts,
                        void *recv, const int64_t *rcounts, int64_t width);
    /* Optional asynchronous MT_EP_ROWS (NULL: ep_alltoall), with the
     * contract of tp_start and tp_join: the shared experts' and the
     * router's work runs behind the row all-to-alls (Megatron's
     * moe_shared_expert_overlap). */
    void *(*ep_start)(void *ctx, const void *send, const int64_t *scounts, void *recv,
                      const int64_t *rcounts, int64_t width);
    void (*ep_join)(void *ctx, void *ticket);
    void *ep_ctx;
    /* The micro-batch's MoE routing totals (model_moe.h, MT_MOE_ROUTE), in
     * host memory, of the pipeline slot in use: a pipeline passes them on
     * with the activations and back with the gradients.  NULL, 0 for a
     * dense model. */
    double *route;
    int64_t nroute;
    /* Sums n doubles in place over the ranks that hold the micro-batch's
     * other tokens (context and tensor parallel ranks); set by the
     * parallelize layer, NULL: this rank holds them all. */
    void (*route_sum)(void *ctx, double *buf, int64_t n);
    void *route_ctx;
    /* The largest position of the micro-batch, in place, over the ranks
     * that hold its other tokens (context parallel ranks): dynamic NTK
     * RoPE sizes its table by it (model_rope.h).  Set by the parallelize
     * layer; NULL: this rank holds them all. */
    void (*pos_max)(void *ctx, int32_t *max);
    void *pos_ctx;
    bool recomputing;    /* inside the activation-checkpointing recompute */
    /* LoRA (peft:, model_lora.c, doc/lora.md): params are the adapters
     * alone, in the units of the layers they adapt (the embedding and
     * head units are empty), and the base is `frozen`: nfrozen
     * parameters in frozen_mem (frozen_numel elements, no gradient), its
     * matrices' grad NULL (their weight-gradient GEMMs are skipped), its
     * 1-D tensors' grad the shared lora_sink that nothing reads (the norm
     * kernels write one).  lora_z, lora_u [N, lora_r]: scratch. */
    bool lora;
    int64_t lora_r;
    float lora_scale;    /* alpha / r */
    int lora_init;       /* mt_lora_init_t */
    mt_param_t *frozen;
    int nfrozen;
    int64_t frozen_numel;
    float *frozen_mem, *lora_sink, *lora_z, *lora_u;
    /* Device wiring (doc/gpu.md): every buffer above that a kernel reads
     * or writes (arenas, pos, doc_start, rope's table, tok_local, ce_*,
     * and these) is backend memory (be->device_alloc) that host code reaches only
     * through the backend.  The caller's tokens, targets, positions and
     * document starts are host arrays that the model copies in:
     * targets_dev and doc_mem [N] hold them on the device, host_i32 [N] is
     * host scratch for what host loops build before copy_to_device. */
    int32_t *targets_dev, *doc_mem;
    int32_t *host_i32;
} mt_model_t;

/* An activation's element n (bf16 bits under bf16 storage, else float32)
 * and the bytes of n of them: every offset into and every copy of an
 * activation buffer, and into the parameter arena, goes through these (the
 * float32 buffers, rstd, lse and dh_acc, do not) */
static inline float *mt_act_at(const mt_model_t *m, const float *p, int64_t n)
{
    return (float *)((char *)p + n * (m->bf16_storage ? 2 : 4));
}

static inline size_t mt_act_bytes(const mt_model_t *m, int64_t n)
{
    return (size_t)n * (m->bf16_storage ? 2u : 4u);
}


/* Shape from a validated config (padded vocabulary, head_dim, ...), for a
 * micro-batch of B x T tokens.  Allocates every arena. */
mt_status_t mt_model_init(mt_model_t *m, const mt_config_t *cfg, const mt_backend_t *be,
                          int64_t B, int64_t T);
/* The same, leaving out arenas (MT_MODEL_NO_*_ARENA), for TP rank
 * tp_rank of cfg's tp_size (Megatron layout: q, k, v, gate, up, their
 * biases and the vocabulary split by rows, o and down by columns, norms
 * and the biases of o and down whole). */
mt_status_t mt_model_init_ex(mt_model_t *m, const mt_config_t *cfg, const mt_backend_t *be,
                             int64_t B, int64_t T, unsigned flags, int tp_rank);
/* The same for part of the model (pipeline parallelism); part NULL: all
 * of it (one chunk, one slot). */
mt_status_t mt_model_init_part(mt_model_t *m, const mt_config_t *cfg, const mt_backend_t *be,
                               int64_t B, int64_t T, unsigned flags, int tp_rank,
                               const mt_model_part_t *part);
/* The same for expert-parallel rank ep_rank of cfg's ep_size: a MoE
 * model holds only that rank's num_experts / ep_size experts (ep_rank -1:
 * all of them). */
mt_status_t mt_model_init_ep(mt_model_t *m, const mt_config_t *cfg, const mt_backend_t *be,
                             int64_t B, int64_t T, unsigned flags, int tp_rank, int ep_rank,
                             const mt_model_part_t *part);
void mt_model_free(mt_model_t *m);

/* Initial weights from (seed, parameter name, element): independent of
 * the mesh and of the order parameters are created in.  Generated on the
 * host and copied into the parameter arenas (where the model has them). */
void mt_model_init_weights(mt_model_t *m, uint64_t seed);

/* Initial values of flat elements [lo, hi) into dst[0 .. hi-lo), host
 * memory: any shard of the model is generated alone, identical to the
 * same elements of the whole. */
void mt_model_init_range(const mt_model_t *m, uint64_t seed, int64_t lo, int64_t hi, float *dst);

/* The same into dst[0 .. hi-lo) of the model's backend memory: generated
 * on the host a chunk at a time and copied in (m->be->copy_to_device). */
void mt_model_init_range_device(const mt_model_t *m, uint64_t seed, int64_t lo, int64_t hi,
                                float *dst);

/* Zero the gradient arena (when the model has one). */
void mt_model_zero_grad(mt_model_t *m);

/* Forward of one micro-batch: tokens and targets [B*T], host arrays
 * (targets -100 are ignored).  Returns the SUM of token losses; *count gets the number of
 * counted targets.  With backward, gradients of (sum * grad_scale) are
 * ACCUMULATED into the parameter gradients; pass grad_scale = 1/total
 * counted tokens of the global batch for a global token mean. */
double mt_model_step(mt_model_t *m, const int32_t *tokens, const int32_t *targets,
                     bool backward, float grad_scale, int64_t *count);

/* Pipeline stage passes.  mt_model_use_slot points the activation
 * buffers at slot `slot` laid out for chunk c; every pass below works on
 * the slot chosen last.  mt_model_stage_input is where chunk c's input
 * goes (a stage without the embedding receives it there), and m->x_final
 * holds its output after the forward.  m->dres holds the gradient of the
 * chunk's output before its backward (the last chunk computes it from
 * the loss) and the gradient of its input afterwards.
 *
 * forward_chunk returns the loss SUM (and *count) for the chunk with the
 * head, else 0; with backward set, the head's backward (lm_head, final
 * norm) runs right there and m->dres holds the gradient of the chunk's
 * last layer output for backward_chunk.  backward_chunk with defer_weights (split backward)
 * leaves the decoder layers' linear weight gradients to weight_chunk;
 * everything else (norm weights, embedding, lm_head) is done in it.
 * tokens are the microbatch's, needed by the chunk with the embedding. */
void mt_model_use_slot(mt_model_t *m, int slot, int c);
float *mt_model_stage_input(mt_model_t *m, int c);
double mt_model_forward_chunk(mt_model_t *m, int c, const int32_t *tokens,
                              const int32_t *targets, bool backward, float grad_scale,
                              int64_t *count);
void mt_model_backward_chunk(mt_model_t *m, int c, const int32_t *tokens, bool defer_weights);
void mt_model_weight_chunk(mt_model_t *m, int c);

/* Packed rows for the next mt_model_step: pos [N] are the position ids
 * (restarting in each document) and doc_start [N] the index within its row
 * of each token's first document token (block-diagonal causal attention);
 * host arrays, which the model copies.  NULL, NULL: plain rows again
 * (positions 0..T-1, causal over the row).  With a sliding window the
 * model narrows each query's first visible key to the window, taking the
 * token's index in its row as doc_start + pos (pos alone without
 * doc_start): what the data layer's packing and context parallelism's
 * global positions give.  Dynamic NTK
 * RoPE's table follows the largest position (model_rope.h). */
void mt_model_set_packing(mt_model_t *m, const int32_t *pos, const int32_t *doc_start);

/* The part of parameter p's flat range [offset, offset + numel) that lies
 * in [lo, hi): its length (0 if none), and in *first its first offset. */
static inline int64_t mt_param_overlap(const mt_param_t *p, int64_t lo, int64_t hi,
                                       int64_t *first)
{
    int64_t end = p->offset + p->numel;
    int64_t a = p->offset > lo ? p->offset : lo, b = end < hi ? end : hi;
    *first = a;
    return b > a ? b - a : 0;
}

/* Parameters of the whole logical model (under tensor parallelism numel
 * is this rank's part). */
int64_t mt_model_logical_numel(const mt_model_t *m);

/* Rows of the LM head and loss computed at once for N rows of a V-column
 * (this rank's) vocabulary: as many as fit float32 logits in 256 MiB, but
 * at least MT_HEAD_CHUNK_MIN, in whole MT_HEAD_CHUNK_ALIGN rows, and at
 * most N.  MESHTRAIN_HEAD_CHUNK_ROWS sets it instead (tests).
 * meshtrain-plan counts the same. */
#define MT_HEAD_CHUNK_MIN 2048
#define MT_HEAD_CHUNK_ALIGN 128
int64_t mt_model_head_chunk(int64_t N, int64_t V);

/* Find a parameter by Hugging Face name, or NULL. */
mt_param_t *mt_model_param(mt_model_t *m, const char *name);

/* Matmul FLOPs per token for forward + backward: 6 * (matmul parameters)
 * + 6 * L * T * H for causal attention (doc/training.md). */
double mt_model_flops_per_token(const mt_model_t *m);

#ifdef __cplusplus
}
#endif
#endif
