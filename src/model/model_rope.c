/* model_rope.c: the model's RoPE table (model_rope.h): inverse
 * frequencies inv_freq[i], i < head_dim/2, and the scale of cos and sin,
 * for each rope_type of config.json's rope_scaling, with the formulas of
 * transformers' modeling_rope_utils.py (doc/rope-scaling.md writes them
 * out and says where each comes from):
 *
 *   default  theta^(-2i/d)
 *   linear   theta^(-2i/d) / factor
 *   dynamic  base^(-2i/d), base = theta (factor L / max_pos - factor + 1)^(d/(d-2)),
 *            L = max(seq_len, max_pos): NTK-aware, per sequence length
 *   llama3   Llama 3.1's band split of theta^(-2i/d) by wavelength
 *   yarn     a ramp between theta^(-2i/d) and theta^(-2i/d) / factor over
 *            the correction range, and cos/sin scaled by the attention factor
 *
 * transformers forms these in float32; here everything is double (the
 * kernels take double frequencies and form the angle in double), so
 * tables agree with transformers' to float rounding and the unscaled one
 * is bit for bit what the kernels formed when they took theta.
 *
 * Dynamic NTK is the only table that moves: transformers' dynamic_rope_update
 * recomputes it from seq_len = max(position_ids) + 1 when that exceeds
 * max_position_embeddings and returns to the unscaled one below it.  Here
 * the table is a function of the micro-batch's seq_len alone: transformers
 * keeps the longest seq_len seen so far (a shorter sequence that still
 * exceeds max_position_embeddings reuses the longer one's table), which
 * would make a run depend on the order in which a rank met its
 * micro-batches, hence on the mesh, and a resumed run differ from an
 * unbroken one.  The two agree whenever seq_len does not shrink while
 * above max_position_embeddings: always for rows of fixed length.
 *
 * Not here: longrope, partial_rotary_factor and DeepSeek's mscale /
 * mscale_all_dim (the config has no keys for them, so they are refused
 * when parsed); the kernels (src/backend). */
#include "model_rope.h"

#include <math.h>
#include <stdlib.h>

mt_status_t mt_rope_spec(const mt_model_config_t *mc, int64_t head_dim, mt_rope_spec_t *spec)
{
    const mt_rope_scaling_t *r = &mc->rope_scaling;
    const char *type = mt_rope_type_name(r->rope_type);
    if (head_dim <= 0 || head_dim % 2)
        MT_FAIL(MT_ERR_CONFIG, "model.head_dim: RoPE needs an even head_dim, got %lld",
                (long long)head_dim);
    if (!(mc->rope_theta > 0))
        MT_FAIL(MT_ERR_CONFIG, "model.rope_theta must be positive, got %g", mc->rope_theta);
    if (mc->max_position_embeddings <= 0)
        MT_FAIL(MT_ERR_CONFIG, "model.max_position_embeddings must be positive for RoPE, got %lld",
                (long long)mc->max_position_embeddings);
    /* transformers' default, linear and dynamic functions never read it:
     * accepting it would ignore it */
    if (r->original_max_position_embeddings.set && r->rope_type != MT_ROPE_LLAMA3 &&
        r->rope_type != MT_ROPE_YARN)
        MT_FAIL(MT_ERR_CONFIG, "model.rope_scaling.original_max_position_embeddings is read by "
                "rope_type llama3 and yarn only, not by %s (dynamic scales from "
                "model.max_position_embeddings): remove it", type);
    if (r->rope_type == MT_ROPE_LLAMA3 && !r->original_max_position_embeddings.set)
        MT_FAIL(MT_ERR_CONFIG, "model.rope_scaling.original_max_position_embeddings is required "
                "by rope_type llama3");
    if (r->rope_type == MT_ROPE_DYNAMIC && head_dim == 2)
        MT_FAIL(MT_ERR_UNSUPPORTED, "model.rope_scaling.rope_type dynamic needs head_dim > 2 "
                "(its base grows with the power head_dim / (head_dim - 2))");
    if (r->rope_type != MT_ROPE_DEFAULT && !(r->factor >= 1.0))
        MT_FAIL(MT_ERR_CONFIG, "model.rope_scaling.factor must be at least 1 for rope_type %s, "
                "got %g", type, r->factor);
    *spec = (mt_rope_spec_t){*r, mc->rope_theta, head_dim, mc->max_position_embeddings};
    return MT_OK;
}

/* theta^(-2i/d): the expression the kernels used, so the unscaled table
 * keeps their bits */
static double base_freq(double theta, int64_t i, int64_t d)
{
    return pow(theta, -2.0 * (double)i / (double)d);
}

/* yarn's find_correction_dim: the dimension (of d) whose wavelength makes
 * num_rotations turns over ctx positions */
static double correction_dim(double num_rotations, int64_t d, double theta, double ctx)
{
    return (double)d * log(ctx / (num_rotations * 2 * M_PI)) / (2 * log(theta));
}

static void yarn(const mt_rope_spec_t *s, double *inv, double *att)
{
    const mt_rope_scaling_t *r = &s->scaling;
    const int64_t d = s->head_dim;
    const double factor = r->factor;
    const double ctx = r->original_max_position_embeddings.set
                           ? (double)r->original_max_position_embeddings.value
                           : (double)s->max_position_embeddings;
    /* attention_factor 0 in the config: the paper's default, get_mscale */
    *att = r->attention_factor > 0 ? r->attention_factor
           : factor <= 1.0         ? 1.0
                                   : 0.1 * log(factor) + 1.0;
    /* find_correction_range: the dimensions of beta_fast and beta_slow
     * turns, rounded outwards unless truncate is false, clamped to [0, d-1] */
    double lo = correction_dim(r->beta_fast, d, s->theta, ctx);
    double hi = correction_dim(r->beta_slow, d, s->theta, ctx);
    if (r->truncate)
        lo = floor(lo), hi = ceil(hi);
    lo = lo > 0 ? lo : 0;
    hi = hi < (double)(d - 1) ? hi : (double)(d - 1);
    if (lo == hi) /* linear_ramp_factor's guard against a zero-width ramp */
        hi += 0.001;
    for (int64_t i = 0; i < d / 2; i++) {
        const double extra = base_freq(s->theta, i, d), inter = extra / factor;
        double ramp = ((double)i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        const double keep = 1 - ramp; /* inv_freq_extrapolation_factor */
        inv[i] = inter * (1 - keep) + extra * keep;
    }
}

/* Llama 3.1: wavelengths shorter than ctx / high_freq_factor kept, longer
 * than ctx / low_freq_factor divided by factor, smoothly between */
static void llama3(const mt_rope_spec_t *s, double *inv)
{
    const mt_rope_scaling_t *r = &s->scaling;
    const double ctx = (double)r->original_max_position_embeddings.value;
    const double low = r->low_freq_factor, high = r->high_freq_factor, factor = r->factor;
    const double low_wavelen = ctx / low, high_wavelen = ctx / high;
    for (int64_t i = 0; i < s->head_dim / 2; i++) {
        const double f = base_freq(s->theta, i, s->head_dim), wavelen = 2 * M_PI / f;
        if (wavelen < high_wavelen) {
            inv[i] = f;
        } else if (wavelen > low_wavelen) {
            inv[i] = f / factor;
        } else {
            const double smooth = (ctx / wavelen - low) / (high - low);
            inv[i] = (1 - smooth) * f / factor + smooth * f;
        }
    }
}

void mt_rope_table(const mt_rope_spec_t *s, int64_t seq_len, double *inv, double *att)
{
    const mt_rope_scaling_t *r = &s->scaling;
    const int64_t d = s->head_dim;
    *att = 1.0;
    switch (r->rope_type) {
    case MT_ROPE_DEFAULT:
        for (int64_t i = 0; i < d / 2; i++)
            inv[i] = base_freq(s->theta, i, d);
        break;
    case MT_ROPE_LINEAR: /* positions divided by factor, on the frequencies */
        for (int64_t i = 0; i < d / 2; i++)
            inv[i] = base_freq(s->theta, i, d) / r->factor;
        break;
    case MT_ROPE_DYNAMIC: {
        const double mp = (double)s->max_position_embeddings;
        const double L = seq_len > s->max_position_embeddings ? (double)seq_len : mp;
        const double base =
            s->theta * pow(r->factor * L / mp - (r->factor - 1), (double)d / (double)(d - 2));
        for (int64_t i = 0; i < d / 2; i++)
            inv[i] = base_freq(base, i, d);
        break;
    }
    case MT_ROPE_LLAMA3:
        llama3(s, inv);
        break;
    case MT_ROPE_YARN:
        yarn(s, inv, att);
        break;
    }
}

mt_status_t mt_rope_init(mt_model_t *m, const mt_model_config_t *mc)
{
    mt_rope_spec_t spec;
    MT_TRY(mt_rope_spec(mc, m->hd, &spec));
    struct mt_rope *r = calloc(1, sizeof *r);
    if (!r)
        MT_FAIL(MT_ERR_NOMEM, "RoPE table");
    m->rope = r; /* mt_model_free frees the rest on failure */
    r->spec = spec;
    const size_t bytes = sizeof(double) * (size_t)(m->hd / 2);
    r->host = malloc(bytes);
    r->inv_freq = m->be->device_alloc(bytes);
    if (!r->host || !r->inv_freq)
        MT_FAIL(MT_ERR_NOMEM, "RoPE table of %lld frequencies", (long long)(m->hd / 2));
    mt_rope_table(&spec, 0, r->host, &r->scale);
    r->len = spec.scaling.rope_type == MT_ROPE_DYNAMIC ? spec.max_position_embeddings : 0;
    m->be->copy_to_device(r->inv_freq, r->host, bytes);
    return MT_OK;
}

void mt_rope_free(mt_model_t *m)
{
    if (!m->rope)
        return;
    if (m->be)
        m->be->device_free(m->rope->inv_freq);
    free(m->rope->host);
    free(m->rope);
    m->rope = NULL;
}

void mt_rope_update(mt_model_t *m, const int32_t *pos)
{
    struct mt_rope *r = m->rope;
    if (!r || r->spec.scaling.rope_type != MT_ROPE_DYNAMIC)
        return;
    int32_t top = m->N > 0 ? (int32_t)(m->T - 1) : 0;
    if (pos) {
        top = 0;
        for (int64_t i = 0; i < m->N; i++)
            top = pos[i] > top ? pos[i] : top;
    }
    if (m->pos_max) /* context parallelism: the row's other chunks */
        m->pos_max(m->pos_ctx, &top);
    const int64_t seq = (int64_t)top + 1, mp = r->spec.max_position_embeddings;
    const int64_t len = seq > mp ? seq : mp;
    if (len == r->len)
        return;
    mt_rope_table(&r->spec, len, r->host, &r->scale);
    m->be->copy_to_device(r->inv_freq, r->host, sizeof(double) * (size_t)(r->spec.head_dim / 2));
    r->len = len;
}
