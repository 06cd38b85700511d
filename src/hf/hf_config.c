/* hf_config.c: Hugging Face config.json -> meshtrain's model section.
 *
 * The architectures meshtrain computes (hf_arch below) are the Llama
 * family and its relatives: LlamaForCausalLM, Qwen2ForCausalLM (q/k/v
 * biases), Qwen3ForCausalLM (q/k norm per head), MistralForCausalLM
 * (sliding window), and the mixture-of-experts Qwen3MoeForCausalLM,
 * MixtralForCausalLM and OlmoeForCausalLM (q/k norm over the whole
 * projection).  Every field that would change the numbers and that
 * meshtrain does not compute is refused by name (refused[] and the checks
 * below); fields that do not change the computation (token ids,
 * torch_dtype, use_cache, ...) are ignored.  Defaults for fields a
 * config.json may leave out are those of the transformers config class. */
#include "hf_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ------------------------------------------------------------ the architectures */

const mt_hf_arch_t mt_hf_archs[] = {
    /* arch, class, model_type, max_pos, eps, theta, moe, qk_norm */
    {MT_ARCH_LLAMA, "LlamaForCausalLM", "llama", 2048, 1e-6, 10000.0, MT_HF_DENSE, false},
    {MT_ARCH_QWEN2, "Qwen2ForCausalLM", "qwen2", 32768, 1e-6, 10000.0, MT_HF_DENSE, false},
    {MT_ARCH_QWEN3, "Qwen3ForCausalLM", "qwen3", 32768, 1e-6, 10000.0, MT_HF_DENSE, true},
    {MT_ARCH_QWEN3_MOE, "Qwen3MoeForCausalLM", "qwen3_moe", 32768, 1e-6, 10000.0, MT_HF_QWEN3_MOE,
     true},
    {MT_ARCH_MISTRAL, "MistralForCausalLM", "mistral", 131072, 1e-6, 10000.0, MT_HF_DENSE, false},
    {MT_ARCH_MIXTRAL, "MixtralForCausalLM", "mixtral", 131072, 1e-5, 1e6, MT_HF_MIXTRAL, false},
    {MT_ARCH_OLMOE, "OlmoeForCausalLM", "olmoe", 4096, 1e-5, 10000.0, MT_HF_OLMOE, true},
};
const int mt_hf_narchs = (int)(sizeof mt_hf_archs / sizeof mt_hf_archs[0]);

const mt_hf_arch_t *mt_hf_arch(mt_arch_t a)
{
    for (int i = 0; i < mt_hf_narchs; i++)
        if (mt_hf_archs[i].arch == a)
            return &mt_hf_archs[i];
    return NULL;
}

/* ------------------------------------------------------------ reading */

typedef struct {
    const json_t *j;
    const char *name; /* the file, for messages */
} cfg_t;

static mt_status_t bad_type(const cfg_t *c, const char *key, const json_t *v, const char *want)
{
    MT_FAIL(MT_ERR_IO, "%s: \"%s\" is a %s, expected %s", c->name, key, mt_hf_json_type(v), want);
}

static const json_t *get(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* The largest value accepted for an integer of config.json, checked before
 * anything loops over it or multiplies it: counts that code iterates
 * (layers, heads, experts) far below sizes, sizes far below where their
 * products could overflow int64. */
static int64_t int_max(const char *key)
{
    static const char *const counts[] = {"num_hidden_layers", "num_attention_heads",
                                         "num_key_value_heads", "num_experts",
                                         "num_local_experts", "n_routed_experts",
                                         "num_experts_per_tok", "decoder_sparse_step"};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        if (strcmp(key, counts[i]) == 0)
            return MT_HF_COUNT_MAX;
    return MT_HF_SIZE_MAX;
}

/* An integer >= 1 from object o; required, or *out keeps def when absent or null. */
static mt_status_t int_in(const cfg_t *c, const json_t *o, const char *key, int required,
                          int64_t def, int64_t *out)
{
    const json_t *v = get(o, key);
    if (!v) {
        if (required)
            MT_FAIL(MT_ERR_IO, "%s: \"%s\" is missing: it is required", c->name, key);
        *out = def;
        return MT_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1)
        return bad_type(c, key, v, "a positive integer");
    int64_t max = int_max(key);
    if (json_integer_value(v) > max)
        MT_FAIL(MT_ERR_IO, "%s: \"%s\": %lld is more than meshtrain accepts (at most %lld)",
                c->name, key, (long long)json_integer_value(v), (long long)max);
    *out = json_integer_value(v);
    return MT_OK;
}

static mt_status_t get_int(const cfg_t *c, const char *key, int required, int64_t def,
                           int64_t *out)
{
    return int_in(c, c->j, key, required, def, out);
}

/* A number > 0 (>= 0 with zero_ok) from object o, or def. */
static mt_status_t num_in(const cfg_t *c, const json_t *o, const char *key, int zero_ok,
                          double def, double *out)
{
    const json_t *v = get(o, key);
    if (!v) {
        *out = def;
        return MT_OK;
    }
    if (!json_is_number(v) || !(json_number_value(v) > 0 || (zero_ok && json_number_value(v) == 0)))
        return bad_type(c, key, v, zero_ok ? "a number >= 0" : "a positive number");
    *out = json_number_value(v);
    return MT_OK;
}

static mt_status_t get_num(const cfg_t *c, const char *key, double def, double *out)
{
    return num_in(c, c->j, key, 0, def, out);
}

static mt_status_t bool_in(const cfg_t *c, const json_t *o, const char *key, int def, int *out)
{
    const json_t *v = get(o, key);
    if (!v) {
        *out = def;
        return MT_OK;
    }
    if (!json_is_boolean(v))
        return bad_type(c, key, v, "true or false");
    *out = json_is_true(v);
    return MT_OK;
}

static mt_status_t get_bool(const cfg_t *c, const char *key, int def, int *out)
{
    return bool_in(c, c->j, key, def, out);
}

static mt_status_t unsupported(const cfg_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static mt_status_t unsupported(const cfg_t *c, const char *fmt, ...)
{
    char what[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    mt_error_set(MT_ERR_UNSUPPORTED, __FILE__, __LINE__, "%s: %s", c->name, what);
    mt_error_hint("meshtrain computes LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                  "MistralForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM and "
                  "OlmoeForCausalLM (doc/hf-models.md)");
    return MT_ERR_UNSUPPORTED;
}

/* The architecture, from "architectures" and "model_type" (which must agree). */
static mt_status_t architecture(const cfg_t *c, const mt_hf_arch_t **out)
{
    const json_t *a = get(c->j, "architectures"), *mt = get(c->j, "model_type");
    const char *arch = NULL, *type = NULL;
    if (mt && !json_is_string(mt))
        return bad_type(c, "model_type", mt, "a string");
    type = mt ? json_string_value(mt) : NULL;
    if (a) {
        if (!json_is_array(a) || json_array_size(a) != 1 || !json_is_string(json_array_get(a, 0)))
            return bad_type(c, "architectures", a, "an array of one string");
        arch = json_string_value(json_array_get(a, 0));
    }
    if (!arch && !type)
        MT_FAIL(MT_ERR_IO, "%s: neither \"architectures\" nor \"model_type\" says what model "
                "this is", c->name);
    const mt_hf_arch_t *by_arch = NULL, *by_type = NULL;
    for (int i = 0; i < mt_hf_narchs; i++) {
        if (arch && strcmp(arch, mt_hf_archs[i].cls) == 0)
            by_arch = &mt_hf_archs[i];
        if (type && strcmp(type, mt_hf_archs[i].type) == 0)
            by_type = &mt_hf_archs[i];
    }
    if (arch && !by_arch) {
        const char *why = strncasecmp(arch, "Deepseek", 8) == 0
                              ? " (multi-head latent attention is not implemented)"
                              : "";
        return unsupported(c, "architecture %.200s is not supported%s", arch, why);
    }
    if (type && !by_type)
        return unsupported(c, "model_type \"%.200s\" is not supported", type);
    if (by_arch && by_type && by_arch != by_type)
        MT_FAIL(MT_ERR_IO, "%s: architectures says %s but model_type is \"%s\"", c->name, arch,
                type);
    *out = by_arch ? by_arch : by_type;
    return MT_OK;
}

/* Fields that change the numbers and that meshtrain does not compute: each
 * is refused when present with a value other than its neutral one. */
typedef enum { NEUTRAL_NULL, NEUTRAL_ZERO, NEUTRAL_ONE, NEUTRAL_FALSE } neutral_t;
static const struct {
    const char *key;
    neutral_t ok;
    const char *what;
} refused[] = {
    {"attention_dropout", NEUTRAL_ZERO, "attention dropout in training"},
    {"hidden_dropout", NEUTRAL_ZERO, "hidden dropout"},
    {"partial_rotary_factor", NEUTRAL_ONE, "RoPE on part of each head"},
    {"clip_qkv", NEUTRAL_NULL, "clipping q, k and v"},
    {"router_jitter_noise", NEUTRAL_ZERO, "router jitter noise"},
    {"kv_lora_rank", NEUTRAL_NULL, "multi-head latent attention"},
    {"q_lora_rank", NEUTRAL_NULL, "multi-head latent attention"},
    {"attn_logit_softcapping", NEUTRAL_NULL, "attention logit soft-capping"},
    {"final_logit_softcapping", NEUTRAL_NULL, "final logit soft-capping"},
    {"logits_scaling", NEUTRAL_ONE, "logit scaling"},
    {"embedding_multiplier", NEUTRAL_ONE, "embedding scaling"},
    {"residual_multiplier", NEUTRAL_ONE, "residual scaling"},
    {"attention_multiplier", NEUTRAL_NULL, "attention scaling"},
    {"shared_expert_intermediate_size", NEUTRAL_NULL, "a gated shared expert"},
    {"router_z_loss_coef", NEUTRAL_ZERO, "the router z-loss"},
};

static mt_status_t refuse_fields(const cfg_t *c)
{
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        const json_t *v = json_object_get(c->j, refused[i].key);
        if (!v || json_is_null(v))
            continue;
        int neutral = 0;
        switch (refused[i].ok) {
        case NEUTRAL_NULL: neutral = 0; break;
        case NEUTRAL_ZERO: neutral = json_is_number(v) && json_number_value(v) == 0; break;
        case NEUTRAL_ONE: neutral = json_is_number(v) && json_number_value(v) == 1; break;
        case NEUTRAL_FALSE: neutral = json_is_false(v); break;
        }
        if (!neutral) {
            char val[64] = "";
            if (json_is_number(v))
                snprintf(val, sizeof val, " %g", json_number_value(v));
            return unsupported(c, "\"%s\"%s: %s is not supported", refused[i].key, val,
                               refused[i].what);
        }
    }
    const json_t *act = json_object_get(c->j, "hidden_act");
    const char *act_name = json_string_value(act); /* NULL unless a string */
    if (act && (!act_name || strcmp(act_name, "silu") != 0))
        return unsupported(c, "hidden_act %.60s is not supported: meshtrain's MLP is SwiGLU "
                           "(silu)", act_name ? act_name : "(not a string)");
    /* Newer configs list each layer's attention: all full, or all sliding
     * with a sliding_window. */
    const json_t *lt = get(c->j, "layer_types");
    if (lt) {
        if (!json_is_array(lt))
            return bad_type(c, "layer_types", lt, "an array of strings");
        const char *first = NULL;
        for (size_t i = 0; i < json_array_size(lt); i++) {
            const char *s = json_string_value(json_array_get(lt, i));
            if (!s || (strcmp(s, "full_attention") != 0 && strcmp(s, "sliding_attention") != 0))
                return unsupported(c, "layer_types[%zu] is %.60s: meshtrain's layers use "
                                   "full_attention or sliding_attention", i, s ? s : "not a string");
            if (first && strcmp(first, s) != 0)
                return unsupported(c, "layer_types mixes full_attention and sliding_attention "
                                   "layers: meshtrain applies one attention to every layer");
            first = s;
        }
    }
    return MT_OK;
}

/* rope_scaling (or newer transformers' rope_parameters) into r; rope_theta
 * may sit inside rope_parameters. */
static mt_status_t rope(const cfg_t *c, int64_t max_pos, mt_rope_scaling_t *r, double *theta)
{
    static const char *const keys[] = {"rope_scaling", "rope_parameters"};
    static const struct { const char *name; mt_rope_type_t t; } types[] = {
        {"default", MT_ROPE_DEFAULT}, {"linear", MT_ROPE_LINEAR}, {"dynamic", MT_ROPE_DYNAMIC},
        {"llama3", MT_ROPE_LLAMA3},   {"yarn", MT_ROPE_YARN}};
    memset(r, 0, sizeof *r);
    r->rope_type = MT_ROPE_DEFAULT;
    r->factor = 1.0, r->low_freq_factor = 1.0, r->high_freq_factor = 4.0;
    r->beta_fast = 32.0, r->beta_slow = 1.0, r->truncate = true;
    for (int k = 0; k < 2; k++) {
        const json_t *o = get(c->j, keys[k]);
        if (!o)
            continue;
        if (!json_is_object(o))
            return bad_type(c, keys[k], o, "an object or null");
        const json_t *th = get(o, "rope_theta");
        if (th && !get(c->j, "rope_theta")) {
            if (!json_is_number(th) || !(json_number_value(th) > 0))
                return bad_type(c, "rope_theta", th, "a positive number");
            *theta = json_number_value(th);
        }
        const json_t *t = get(o, "rope_type");
        if (!t)
            t = get(o, "type");
        if (!t)
            continue;
        const char *tname = json_string_value(t);
        if (!tname)
            return bad_type(c, "rope_type", t, "a string");
        size_t i = 0;
        for (; i < sizeof types / sizeof types[0]; i++)
            if (strcmp(tname, types[i].name) == 0)
                break;
        if (i == sizeof types / sizeof types[0])
            return unsupported(c, "%s of rope_type \"%.60s\" is not supported: meshtrain computes "
                               "default, linear, dynamic, llama3 and yarn", keys[k], tname);
        r->rope_type = types[i].t;
        if (r->rope_type == MT_ROPE_DEFAULT)
            continue;
        MT_TRY(num_in(c, o, "factor", 0, 1.0, &r->factor));
        /* the context before scaling: llama3 needs it, yarn may give it */
        if (r->rope_type == MT_ROPE_LLAMA3 ||
            (r->rope_type == MT_ROPE_YARN && get(o, "original_max_position_embeddings"))) {
            int64_t orig;
            MT_TRY(int_in(c, o, "original_max_position_embeddings", 1, 0, &orig));
            r->original_max_position_embeddings.set = true;
            r->original_max_position_embeddings.value = orig;
        }
        if (r->rope_type == MT_ROPE_LLAMA3) {
            MT_TRY(num_in(c, o, "low_freq_factor", 0, 1.0, &r->low_freq_factor));
            MT_TRY(num_in(c, o, "high_freq_factor", 0, 4.0, &r->high_freq_factor));
        }
        if (r->rope_type == MT_ROPE_YARN) {
            int flag;
            if (get(o, "mscale") || get(o, "mscale_all_dim"))
                return unsupported(c, "%s: yarn's mscale and mscale_all_dim (DeepSeek's attention "
                                   "factor) are not supported", keys[k]);
            MT_TRY(num_in(c, o, "beta_fast", 0, 32.0, &r->beta_fast));
            MT_TRY(num_in(c, o, "beta_slow", 0, 1.0, &r->beta_slow));
            MT_TRY(num_in(c, o, "attention_factor", 1, 0.0, &r->attention_factor));
            MT_TRY(bool_in(c, o, "truncate", 1, &flag));
            r->truncate = flag;
        }
        if (r->rope_type == MT_ROPE_DYNAMIC && get(o, "original_max_position_embeddings"))
            return unsupported(c, "%s: dynamic scaling with its own "
                               "original_max_position_embeddings is not supported (transformers "
                               "scales from max_position_embeddings = %lld)", keys[k],
                               (long long)max_pos);
    }
    return MT_OK;
}

/* The MoE fields of the family into x. */
static mt_status_t moe(const cfg_t *c, const mt_hf_arch_t *a, mt_model_config_t *x)
{
    int flag = 0;
    x->num_experts = 0;
    x->mlp_only_layers[0] = '\0';
    x->num_shared_experts = 0;
    if (a->moe == MT_HF_DENSE) {
        static const char *const keys[] = {"num_experts", "num_local_experts", "n_routed_experts"};
        for (int k = 0; k < 3; k++) {
            const json_t *v = get(c->j, keys[k]);
            if (json_is_number(v) && json_number_value(v) > 0)
                return unsupported(c, "\"%s\": %g: %s is a dense architecture", keys[k],
                                   json_number_value(v), a->cls);
        }
        return MT_OK;
    }
    if (a->moe == MT_HF_MIXTRAL) { /* every layer sparse, renormalised top-k, expert width I */
        MT_TRY(get_int(c, "num_local_experts", 1, 0, &x->num_experts));
        MT_TRY(get_int(c, "num_experts_per_tok", 0, 2, &x->num_experts_per_tok));
        x->moe_intermediate_size = x->intermediate_size;
        x->norm_topk_prob = true;
        MT_TRY(num_in(c, c->j, "router_aux_loss_coef", 1, 0.001, &x->router_aux_loss_coef));
        return MT_OK;
    }
    if (a->moe == MT_HF_OLMOE) { /* every layer sparse, expert width I */
        MT_TRY(get_int(c, "num_experts", 1, 0, &x->num_experts));
        MT_TRY(get_int(c, "num_experts_per_tok", 0, 8, &x->num_experts_per_tok));
        x->moe_intermediate_size = x->intermediate_size;
        MT_TRY(get_bool(c, "norm_topk_prob", 0, &flag));
        x->norm_topk_prob = flag;
        MT_TRY(num_in(c, c->j, "router_aux_loss_coef", 1, 0.01, &x->router_aux_loss_coef));
        return MT_OK;
    }
    /* Qwen3-MoE */
    int64_t step = 1;
    MT_TRY(get_int(c, "num_experts", 1, 0, &x->num_experts));
    MT_TRY(get_int(c, "num_experts_per_tok", 0, 8, &x->num_experts_per_tok));
    MT_TRY(get_int(c, "moe_intermediate_size", 0, 768, &x->moe_intermediate_size));
    MT_TRY(get_bool(c, "norm_topk_prob", 0, &flag));
    x->norm_topk_prob = flag;
    MT_TRY(num_in(c, c->j, "router_aux_loss_coef", 1, 0.001, &x->router_aux_loss_coef));
    MT_TRY(get_int(c, "decoder_sparse_step", 0, 1, &step));
    const json_t *dl = get(c->j, "mlp_only_layers");
    if (dl && !json_is_array(dl))
        return bad_type(c, "mlp_only_layers", dl, "an array of layer indices");
    /* dense: listed, or not on the sparse step (transformers' rule) */
    size_t used = 0;
    for (int64_t l = 0; l < x->num_hidden_layers; l++) {
        int dense = step < 1 || (l + 1) % step != 0;
        for (size_t i = 0; i < json_array_size(dl); i++) /* 0 unless an array */
            dense |= json_is_number(json_array_get(dl, i)) &&
                     json_number_value(json_array_get(dl, i)) == (double)l;
        if (dense && used + 24 < sizeof x->mlp_only_layers)
            used += (size_t)snprintf(x->mlp_only_layers + used, sizeof x->mlp_only_layers - used,
                                     "%s%lld", used ? "," : "", (long long)l);
    }
    return MT_OK;
}

/* Sliding windows: Mistral's and Mixtral's sliding_window applies when
 * set; Qwen's only under use_sliding_window, which meshtrain refuses
 * because it spares the first max_window_layers layers. */
static mt_status_t window(const cfg_t *c, const mt_hf_arch_t *a, mt_model_config_t *x)
{
    int use = 0;
    x->sliding_window.set = false;
    MT_TRY(get_bool(c, "use_sliding_window", 0, &use));
    if (a->arch == MT_ARCH_MISTRAL || a->arch == MT_ARCH_MIXTRAL) {
        int64_t w;
        if (get(c->j, "sliding_window")) {
            MT_TRY(get_int(c, "sliding_window", 0, 0, &w));
            x->sliding_window.set = true;
            x->sliding_window.value = w;
        }
        return MT_OK;
    }
    if (use)
        return unsupported(c, "\"use_sliding_window\": true is not supported for %s (a window on "
                           "layers from max_window_layers on)", a->cls);
    return MT_OK;
}

mt_status_t mt_hf_config_to_model(const json_t *j, const char *name, mt_model_config_t *m,
                                  FILE *note)
{
    cfg_t c = {j, name};
    if (!json_is_object(j))
        MT_FAIL(MT_ERR_IO, "%s: the file is a JSON %s, expected an object", name,
                mt_hf_json_type(j));
    const mt_hf_arch_t *a = NULL;
    int flag = 0;
    MT_TRY(architecture(&c, &a));
    MT_TRY(refuse_fields(&c));

    mt_model_config_t x = *m;
    int64_t kv;
    x.architecture = a->arch;
    MT_TRY(get_int(&c, "vocab_size", 1, 0, &x.vocab_size));
    MT_TRY(get_int(&c, "hidden_size", 1, 0, &x.hidden_size));
    MT_TRY(get_int(&c, "intermediate_size", 1, 0, &x.intermediate_size));
    MT_TRY(get_int(&c, "num_hidden_layers", 1, 0, &x.num_hidden_layers));
    MT_TRY(get_int(&c, "num_attention_heads", 1, 0, &x.num_attention_heads));
    MT_TRY(get_int(&c, "num_key_value_heads", 0, x.num_attention_heads, &kv));
    MT_TRY(get_int(&c, "max_position_embeddings", 0, a->max_pos, &x.max_position_embeddings));
    MT_TRY(get_num(&c, "rms_norm_eps", a->eps, &x.rms_norm_eps));
    MT_TRY(get_num(&c, "rope_theta", a->theta, &x.rope_theta));
    MT_TRY(rope(&c, x.max_position_embeddings, &x.rope_scaling, &x.rope_theta));
    MT_TRY(get_num(&c, "initializer_range", x.initializer_range, &x.initializer_range));
    MT_TRY(get_bool(&c, "tie_word_embeddings", 0, &flag));
    x.tie_word_embeddings = flag;
    /* Qwen2 hard-codes its q/k/v biases; the others say attention_bias */
    MT_TRY(get_bool(&c, "attention_bias", 0, &flag));
    if (flag && a->arch == MT_ARCH_QWEN2)
        return unsupported(&c, "\"attention_bias\": true: Qwen2ForCausalLM has q/k/v biases and "
                           "no field for them");
    x.attention_bias = flag;
    MT_TRY(get_bool(&c, "mlp_bias", 0, &flag));
    if (flag && a->arch != MT_ARCH_LLAMA)
        return unsupported(&c, "\"mlp_bias\": true: only LlamaForCausalLM has MLP biases");
    x.mlp_bias = flag;
    x.num_key_value_heads.set = true;
    x.num_key_value_heads.value = kv;
    x.qk_norm = a->qk_norm;
    MT_TRY(moe(&c, a, &x));
    MT_TRY(window(&c, a, &x));
    if (x.mlp_bias && x.num_experts > 0)
        return unsupported(&c, "\"mlp_bias\": true with experts is not supported");

    int64_t hd;
    x.head_dim.set = false;
    if (get(j, "head_dim")) {
        MT_TRY(get_int(&c, "head_dim", 0, 0, &hd));
        x.head_dim.set = true;
        x.head_dim.value = hd;
    } else if (x.hidden_size % x.num_attention_heads) {
        return unsupported(&c, "hidden_size %lld is not divisible by num_attention_heads %lld and "
                           "there is no head_dim", (long long)x.hidden_size,
                           (long long)x.num_attention_heads);
    } else {
        hd = x.hidden_size / x.num_attention_heads;
    }
    if (hd % 2)
        return unsupported(&c, "head_dim %lld is odd: RoPE rotates pairs", (long long)hd);
    if (kv < 1 || x.num_attention_heads % kv)
        MT_FAIL(MT_ERR_IO, "%s: num_attention_heads %lld is not divisible by "
                "num_key_value_heads %lld", name, (long long)x.num_attention_heads, (long long)kv);
    if (note) {
        const json_t *pt = json_object_get(j, "pretraining_tp");
        if (json_is_number(pt) && json_number_value(pt) > 1)
            fprintf(note, "note: %s: pretraining_tp %g only changes how transformers splits "
                    "matmuls; ignored\n", name, json_number_value(pt));
    }
    *m = x;
    return MT_OK;
}
