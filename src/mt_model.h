/* mt_model.h: the Llama-architecture decoder (Hugging Face
 * LlamaForCausalLM, optional Qwen3 qk_norm), written for one device.
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

typedef struct {
    char name[MT_PARAM_NAME_MAX]; /* Hugging Face name */
    int ndim;
    int64_t shape[2];             /* PyTorch shape: [out, in] for linears */
    int64_t numel;
    float *data, *grad;           /* into the model's arenas */
    bool no_decay;                /* norm weights: no weight decay */
    bool is_norm;                 /* initialised to 1 */
} mt_param_t;

typedef struct {
    mt_param_t *attn_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm;
    mt_param_t *mlp_norm, *wgate, *wup, *wdown;
} mt_layer_params_t;

/* Saved activations of one layer (pointers into the activation arena). */
typedef struct {
    float *x;            /* layer input [N, H] */
    float *h1, *rstd1;   /* attention norm */
    float *q_raw, *k_raw, *q_rstd, *k_rstd; /* qk_norm inputs (NULL without) */
    float *q, *k, *v;    /* after RoPE */
    float *att, *lse;    /* attention output, log-sum-exp */
    float *x_mid;        /* after the attention residual */
    float *h2, *rstd2;   /* MLP norm */
    float *g, *u, *a;    /* gate, up, silu(gate)*up */
} mt_layer_acts_t;

typedef struct {
    const mt_backend_t *be;
    /* shape */
    int64_t V, V_valid, H, I, L, nh, nkv, hd;
    float eps;
    double theta, init_std;
    bool tied, qk_norm, checkpointing;
    int64_t B, T, N;     /* micro-batch: B rows of T tokens, N = B*T */

    /* parameters */
    mt_param_t *params;
    int nparams;
    int64_t numel;       /* all parameters */
    float *param_mem, *grad_mem;
    mt_param_t *embed, *final_norm, *lm_head; /* lm_head == embed when tied */
    mt_layer_params_t *layers;

    /* activations */
    float *act_mem;
    int64_t act_numel;
    mt_layer_acts_t *acts;   /* L entries (all point to `scratch` except x under AC) */
    mt_layer_acts_t scratch; /* recompute buffers under activation checkpointing */
    float *x_final, *xf, *rstdf, *logits;
    float *dres, *dtmp, *dh, *datt, *dq, *dk, *dv, *dI;
    int32_t *pos;        /* [N] positions */

    /* Called during backward each time the gradients of every parameter
     * at arena offset >= from are final for this micro-step (offsets only
     * go down: lm_head and the final norm, then layer L-1 ... 0, then the
     * embedding at 0).  The parallelize layer uses it to start gradient
     * reductions while backward goes on.  NULL: no hook. */
    void (*grad_ready)(void *ctx, int64_t from);
    void *grad_ready_ctx;
} mt_model_t;

/* Shape from a validated config (padded vocabulary, head_dim, ...), for a
 * micro-batch of B x T tokens.  Allocates every arena. */
mt_status_t mt_model_init(mt_model_t *m, const mt_config_t *cfg, const mt_backend_t *be,
                          int64_t B, int64_t T);
void mt_model_free(mt_model_t *m);

/* Initial weights from (seed, parameter name, element): independent of
 * the mesh and of the order parameters are created in. */
void mt_model_init_weights(mt_model_t *m, uint64_t seed);

void mt_model_zero_grad(mt_model_t *m);

/* Forward of one micro-batch: tokens and targets [B*T] (targets -100 are
 * ignored).  Returns the SUM of token losses; *count gets the number of
 * counted targets.  With backward, gradients of (sum * grad_scale) are
 * ACCUMULATED into the parameter gradients; pass grad_scale = 1/total
 * counted tokens of the global batch for a global token mean. */
double mt_model_step(mt_model_t *m, const int32_t *tokens, const int32_t *targets,
                     bool backward, float grad_scale, int64_t *count);

/* Find a parameter by Hugging Face name, or NULL. */
mt_param_t *mt_model_param(mt_model_t *m, const char *name);

/* Matmul FLOPs per token for forward + backward: 6 * (matmul parameters)
 * + 6 * L * T * H for causal attention (doc/training.md). */
double mt_model_flops_per_token(const mt_model_t *m);

#ifdef __cplusplus
}
#endif
#endif
