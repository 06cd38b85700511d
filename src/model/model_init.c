/* model_init.c: the initial weights, dense and expert alike: element
 * (r, c) of every logical tensor is normal(seed, name, r * cols + c) (norm
 * weights 1, biases and vocabulary padding rows 0), whatever slice or
 * arena a rank holds, so the initial model is independent of the mesh.
 * Generated on the host and copied into backend memory in chunks.  It
 * does not decide who holds which elements (the sharding layers pass
 * ranges) and touches no activation. */
#include "mt_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_moe.h"
#include "mt_bf16.h"
#include "mt_rng.h"

/* Fill local elements [a, b) of parameter p (offsets relative to the
 * tensor) into out: element (r, c) of the logical tensor is
 * normal(seed, name, r * full_cols + c), whatever slice this rank holds. */
static void init_slice(const mt_model_t *m, const mt_param_t *p, uint64_t seed, int64_t a,
                       int64_t b, float *out)
{
    uint32_t stream = mt_rng_stream(p->name);
    int64_t cols = p->shape[1], fcols = p->full_shape[1];
    if (p->tp_dim != 1) { /* contiguous in the logical tensor */
        int64_t first = (p->tp_dim == 0 ? p->tp_off * cols : 0) + a;
        mt_rng_fill_normal(out, b - a, seed, stream, (uint64_t)first, (float)m->init_std);
        return;
    }
    for (int64_t e = a; e < b;) { /* a column slice: one run per row */
        int64_t r = e / cols, c = e % cols, n = cols - c < b - e ? cols - c : b - e;
        mt_rng_fill_normal(out + (e - a), n, seed, stream, (uint64_t)(r * fcols + p->tp_off + c),
                           (float)m->init_std);
        e += n;
    }
}

/* LoRA's lora_A, as AutoModel's init_lora_weights draws it: xavier is
 * uniform on [0, 1) (torch.nn.init.uniform_), uniform is kaiming_uniform
 * with a = sqrt(5), uniform on +-1/sqrt(in); element (r, c) of the
 * logical tensor from uniform(seed, name, r * in + c) */
static void init_lora_a(const mt_model_t *m, const mt_param_t *p, uint64_t seed, int64_t a,
                        int64_t b, float *out)
{
    uint32_t stream = mt_rng_stream(p->name);
    int64_t cols = p->shape[1], fcols = p->full_shape[1], off = p->tp_dim == 1 ? p->tp_off : 0;
    double bound = 1.0 / sqrt((double)fcols);
    for (int64_t e = a; e < b; e++) {
        double u = mt_rng_uniform(seed, stream, (uint64_t)((e / cols) * fcols + off + e % cols));
        out[e - a] = (float)(m->lora_init == MT_LORA_INIT_XAVIER ? u : bound * (2.0 * u - 1.0));
    }
}

static bool name_has(const mt_param_t *p, const char *what)
{
    return strstr(p->name, what) != NULL;
}

void mt_model_init_range(const mt_model_t *m, uint64_t seed, int64_t lo, int64_t hi, float *dst)
{
    for (int i = 0; i < m->nparams; i++) {
        const mt_param_t *p = &m->params[i];
        int64_t a, n = mt_param_overlap(p, lo, hi, &a), b = a + n;
        if (n == 0)
            continue;
        float *out = dst + (a - lo);
        if (p->is_norm || p->is_bias || (m->lora && name_has(p, ".lora_B."))) {
            for (int64_t j = 0; j < b - a; j++) /* lora_B zero: step 0 is the base */
                out[j] = p->is_norm ? 1.0f : 0.0f;
            continue;
        }
        if (m->lora && name_has(p, ".lora_A.")) {
            init_lora_a(m, p, seed, a - p->offset, b - p->offset, out);
            continue;
        }
        init_slice(m, p, seed, a - p->offset, b - p->offset, out);
        /* Vocabulary padding rows (tp padding) start at zero. */
        if (p == m->embed || p == m->lm_head) {
            int64_t pad = p->offset + m->V_valid * m->H; /* first padding element here */
            for (int64_t e = a > pad ? a : pad; e < b; e++)
                dst[e - lo] = 0.0f;
        }
    }
}

/* Elements [lo, hi) of the initial weights into backend memory at dst, in
 * host chunks: float32, or with bf16 their bf16 bits (bf16 storage: the
 * values a float32 arena holds after the trainer's rounding, src/train/train_mp.c) */
static void init_to_device(const mt_model_t *m, uint64_t seed, int64_t lo, int64_t hi, void *dst,
                           bool bf16)
{
    enum { CHUNK = 1 << 20, SMALL = 1 << 10 }; /* elements per copy */
    float small[SMALL];
    uint16_t small16[SMALL];
    int64_t chunk = hi - lo < CHUNK ? hi - lo : CHUNK;
    float *buf = chunk > SMALL ? malloc(sizeof(float) * (size_t)chunk) : NULL;
    uint16_t *bits = buf && bf16 ? malloc(sizeof *bits * (size_t)chunk) : NULL;
    if (!buf || (bf16 && !bits)) { /* short of host memory (or a small range): smaller copies */
        free(buf);
        buf = small, bits = small16, chunk = SMALL;
    }
    for (int64_t a = lo; a < hi; a += chunk) {
        int64_t b = a + chunk < hi ? a + chunk : hi;
        mt_model_init_range(m, seed, a, b, buf);
        if (bf16) {
            for (int64_t i = 0; i < b - a; i++)
                bits[i] = mt_f32_to_bf16(buf[i]);
            m->be->copy_to_device((uint16_t *)dst + (a - lo), bits,
                                  sizeof *bits * (size_t)(b - a));
        } else {
            m->be->copy_to_device((float *)dst + (a - lo), buf, sizeof(float) * (size_t)(b - a));
        }
    }
    if (buf != small)
        free(buf), free(bits);
}

void mt_model_init_range_device(const mt_model_t *m, uint64_t seed, int64_t lo, int64_t hi,
                                float *dst)
{
    init_to_device(m, seed, lo, hi, dst, false);
}

void mt_model_init_device(const mt_model_t *m, uint64_t seed, float *dst)
{
    init_to_device(m, seed, 0, m->numel, dst, m->bf16_storage);
}

void mt_model_init_weights(mt_model_t *m, uint64_t seed)
{
    if (m->param_mem) /* bf16 storage: the arena holds bf16 bits */
        init_to_device(m, seed, 0, m->numel, m->param_mem, m->bf16_storage);
    if (m->frozen_mem) { /* LoRA's base, by the same rule (a run loads it over this) */
        mt_model_t v = *m;
        v.params = m->frozen, v.nparams = m->nfrozen, v.numel = m->frozen_numel;
        v.lora = false;
        init_to_device(&v, seed, 0, v.numel, m->frozen_mem, false);
    }
    if (m->moe)
        mt_moe_init_weights(m, seed);
}

void mt_moe_init_weights(mt_model_t *m, uint64_t seed)
{
    mt_moe_t *x = m->moe;
    if (!x->param_mem) /* sharded: the sharding layer initialises its rows */
        return;
    /* normal(seed, name, element) for every expert tensor, as
     * mt_model_init_range draws it for a whole (tp_dim -1) tensor */
    mt_model_t v;
    memset(&v, 0, sizeof v);
    v.be = m->be, v.init_std = m->init_std, v.bf16_storage = m->bf16_storage;
    v.params = x->xp, v.nparams = x->nxp, v.numel = x->numel;
    mt_model_init_device(&v, seed, x->param_mem);
}
