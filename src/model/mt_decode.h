/* mt_decode.h: incremental decoding of the single-device model with a KV
 * cache, and the samplers that pick the next token (sample.c).
 *
 * A decoder borrows a model's parameters (mt_model_t, weights loaded) and
 * keeps per layer the rotated keys and the values of every position seen,
 * so that each new token costs one row of every GEMM and attention over
 * the cached keys instead of a forward over the whole sequence.  It calls
 * kernels only through the model's backend table: the same GEMMs, norms
 * and RoPE as training, and attention_block_forward (context
 * parallelism's block attention) for new queries against the cached keys.
 * With a sliding window each query reads only its window of the cache,
 * and the cache holds a few windows' rows, not the whole sequence.
 *
 * MoE layers go through the model's own MoE code a token at a time, so a
 * MoE model must be built for one token (mt_model_init with B = T = 1,
 * all experts, activations).  What it refuses, by name: a MoE model built
 * otherwise, tensor or pipeline parts of a model, bf16 storage tables,
 * and dynamic NTK RoPE beyond
 * max_position_embeddings (its table would change with the length, and
 * keys already cached would keep the old rotation).  It does not batch
 * sequences: one sequence, on one device. */
#ifndef MT_DECODE_H
#define MT_DECODE_H

#include <stdbool.h>
#include <stdint.h>

#include "mt_model.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const mt_model_t *m;
    int64_t max_len;  /* positions the cache holds */
    int64_t len;      /* positions cached so far */
    int64_t cap;      /* rows of each cache: max_len, or with a sliding window
                       * W about 3 W (the rows before a window are dropped) */
    int64_t base;     /* the position of cache row 0 */
    /* backend memory */
    float **kc, **vc; /* [L] caches: [cap, nkv * hd] each */
    float *x, *h, *x_mid, *q, *q_raw, *k_raw, *att, *g, *u, *a, *logits, *ones;
    float *rstd, *qk_rstd, *lse;
    int32_t *tok, *pos, *ds;
    /* host scratch */
    int32_t *host_i32;
    float *host_lse;
} mt_decode_t;

/* A decoder for sequences of at most max_len tokens (prompt and
 * generated) over m's parameters, which must stay in place while it is
 * used.  Refuses what the header names. */
mt_status_t mt_decode_init(mt_decode_t *d, const mt_model_t *m, int64_t max_len);
void mt_decode_free(mt_decode_t *d);

/* Forget the cached positions (a new sequence). */
void mt_decode_reset(mt_decode_t *d);

/* Run n tokens (host array, each in [0, V_valid)) at the next n positions
 * and cache them.  logits (host memory, may be NULL) gets the last
 * token's V_valid logits, or with all_rows every token's, [n, V_valid].
 * MT_ERR_RANGE when the sequence would pass max_len or a token is outside
 * the vocabulary (nothing is cached then). */
mt_status_t mt_decode_forward(mt_decode_t *d, const int32_t *tokens, int64_t n, float *logits,
                              bool all_rows);

/* ---- sampling (sample.c) ---- */
typedef struct {
    bool greedy;        /* argmax (the lowest id among equal maxima) */
    double temperature; /* > 0 unless greedy; 0 means greedy */
    int64_t top_k;      /* 0: all */
    double top_p;       /* in (0, 1]; 1: all */
    uint64_t seed;
} mt_sample_opts_t;

/* Defaults: greedy off, temperature 1, top_k 0, top_p 1, seed 0. */
void mt_sample_opts_init(mt_sample_opts_t *o);
mt_status_t mt_sample_opts_check(const mt_sample_opts_t *o);

/* The token for generated position `step` (0, 1, ...) from V logits
 * (host memory).  Deterministic: the uniform draw is the counter-based
 * generator's element `step` of the "generate" stream under seed, so the
 * same seed gives the same ids on every machine.  Top-k, then top-p over
 * the probabilities at the temperature (sorted by probability, ties by
 * lower id; at least one token kept).  scratch: NULL, or
 * of host memory that the caller reuses, mt_sample_scratch_bytes(V). */
size_t mt_sample_scratch_bytes(int64_t V);
int32_t mt_sample(const float *logits, int64_t V, const mt_sample_opts_t *o, uint64_t step,
                  void *scratch);

#ifdef __cplusplus
}
#endif
#endif
