/* model_rope.h: the model's RoPE table (model_rope.c): the inverse
 * frequencies the rope kernels read and the scale of their cos and sin,
 * from model.rope_theta and model.rope_scaling with the meaning of
 * transformers' rope initialisation functions (doc/rope-scaling.md).
 * Shared by the model's files and its tests; not installed. */
#ifndef MT_MODEL_ROPE_H
#define MT_MODEL_ROPE_H

#include <stdint.h>

#include "mt_config.h"
#include "mt_model.h"
#include "mt_status.h"

/* What a table depends on: the config's RoPE keys and the head width. */
typedef struct {
    mt_rope_scaling_t scaling;
    double theta;
    int64_t head_dim, max_position_embeddings;
} mt_rope_spec_t;

/* The model's table (m->rope). */
struct mt_rope {
    mt_rope_spec_t spec;
    double *inv_freq; /* [head_dim/2] backend memory: what the kernels read */
    double scale;     /* of cos and sin: transformers' attention_scaling */
    double *host;     /* [head_dim/2] host memory: the table last computed */
    /* dynamic NTK: the sequence length the table is for (at least
     * max_position_embeddings); 0 for the other types, whose table is
     * fixed */
    int64_t len;
};

/* The spec of a model config's RoPE for heads head_dim wide; refuses, by
 * the name of the key, what the types do not read (so it would be
 * ignored) or cannot compute. */
mt_status_t mt_rope_spec(const mt_model_config_t *mc, int64_t head_dim, mt_rope_spec_t *spec);

/* inv_freq [head_dim/2] (host memory) and *attention_factor as
 * transformers' _compute_<type>_rope_parameters give them, in double, for
 * a sequence of seq_len tokens: only dynamic NTK reads it, and a seq_len
 * at most max_position_embeddings (0 included: at init) means
 * max_position_embeddings, which is the unscaled table. */
void mt_rope_table(const mt_rope_spec_t *spec, int64_t seq_len, double *inv_freq,
                   double *attention_factor);

/* m->rope for the model's config (m->hd and m->be set): the table for
 * max_position_embeddings, in backend memory. */
mt_status_t mt_rope_init(mt_model_t *m, const mt_model_config_t *mc);
void mt_rope_free(mt_model_t *m);

/* Before a micro-batch, from its host positions [m->N] (NULL: 0..T-1 in
 * every row): dynamic NTK's table for seq_len = the largest position + 1
 * over the ranks holding the micro-batch (m->pos_max), copied to the
 * device only when it changes; the other types' tables never change. */
void mt_rope_update(mt_model_t *m, const int32_t *pos);

#endif
