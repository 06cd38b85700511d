/* hf_config_out.c: what a model section is on the Hugging Face side: the
 * tensors it has (names and shapes, in the trainer's parameter order) and
 * the config.json that describes it. */
#include "hf_internal.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ------------------------------------------------------------ the tensor list */

static void add(mt_hf_tensor_t *t, int *n, const char *name, int64_t rows, int64_t cols)
{
    mt_hf_tensor_t *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->ndim = cols ? 2 : 1;
    x->shape[0] = rows;
    x->shape[1] = cols ? cols : 1;
}

/* Layer l is a MoE layer: num_experts > 0 and l not in mlp_only_layers
 * (model_moe.c's rule, on the model section alone). */
static int sparse_layer(const mt_model_config_t *m, int64_t l)
{
    if (m->num_experts <= 0)
        return 0;
    for (const char *c = m->mlp_only_layers; *c;) {
        char *end;
        long v = strtol(c, &end, 10);
        if (end == c)
            break;
        if (v == l)
            return 0;
        c = end + strspn(end, " ,");
    }
    return 1;
}

mt_status_t mt_hf_expected_tensors(const mt_model_config_t *m, mt_hf_tensor_t **out, int *n)
{
    int64_t H = m->hidden_size, I = m->intermediate_size, V = m->vocab_size;
    int64_t nh = m->num_attention_heads;
    int64_t nkv = m->num_key_value_heads.set ? m->num_key_value_heads.value : nh;
    if (nh < 1 || (!m->head_dim.set && H % nh))
        MT_FAIL(MT_ERR_CONFIG, "hidden_size %lld is not divisible by num_attention_heads %lld",
                (long long)H, (long long)nh);
    if (m->num_hidden_layers < 1 || m->num_hidden_layers > 100000)
        MT_FAIL(MT_ERR_CONFIG, "num_hidden_layers %lld is out of range",
                (long long)m->num_hidden_layers);
    int64_t hd = m->head_dim.set ? m->head_dim.value : H / nh, L = m->num_hidden_layers;
    const bool qkv_b = mt_model_qkv_bias(m), o_b = mt_model_o_bias(m), mlp_b = m->mlp_bias;
    const bool whole = mt_model_qk_norm_whole(m);
    const mt_arch_t arch = mt_model_arch(m);
    const char *moe = arch == MT_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp";
    int64_t per_layer = 18 + (m->num_experts > 0 ? 1 + 3 * m->num_experts : 0);
    mt_hf_tensor_t *t = calloc((size_t)(3 + per_layer * L), sizeof *t);
    if (!t)
        MT_FAIL(MT_ERR_NOMEM, "tensor list of %lld layers", (long long)L);
    *n = 0;
    char name[MT_HF_NAME_MAX];
    add(t, n, "model.embed_tokens.weight", V, H);
    for (int64_t l = 0; l < L; l++) {
#define LAYER(suffix, rows, cols)                                                    \
    do {                                                                             \
        snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, suffix); \
        add(t, n, name, rows, cols);                                                 \
    } while (0)
#define LINEAR(proj, rows, cols, bias)                                               \
    do {                                                                             \
        LAYER(proj ".weight", rows, cols);                                           \
        if (bias)                                                                    \
            LAYER(proj ".bias", rows, 0);                                            \
    } while (0)
        LAYER("input_layernorm.weight", H, 0);
        LINEAR("self_attn.q_proj", nh * hd, H, qkv_b);
        LINEAR("self_attn.k_proj", nkv * hd, H, qkv_b);
        LINEAR("self_attn.v_proj", nkv * hd, H, qkv_b);
        LINEAR("self_attn.o_proj", H, nh * hd, o_b);
        if (m->qk_norm) {
            LAYER("self_attn.q_norm.weight", whole ? nh * hd : hd, 0);
            LAYER("self_attn.k_norm.weight", whole ? nkv * hd : hd, 0);
        }
        LAYER("post_attention_layernorm.weight", H, 0);
        if (sparse_layer(m, l)) { /* the router, then each expert */
            int64_t Im = m->moe_intermediate_size;
            char ex[128];
            snprintf(ex, sizeof ex, "%s.gate.weight", moe);
            LAYER(ex, m->num_experts, H);
            for (int64_t e = 0; e < m->num_experts; e++) {
                static const char *const mixtral[3] = {"w1", "w3", "w2"};
                static const char *const hf[3] = {"gate_proj", "up_proj", "down_proj"};
                const char *const *nm = arch == MT_ARCH_MIXTRAL ? mixtral : hf;
                for (int w = 0; w < 3; w++) {
                    snprintf(ex, sizeof ex, "%s.experts.%lld.%s.weight", moe, (long long)e, nm[w]);
                    LAYER(ex, w < 2 ? Im : H, w < 2 ? H : Im);
                }
            }
        } else {
            LINEAR("mlp.gate_proj", I, H, mlp_b);
            LINEAR("mlp.up_proj", I, H, mlp_b);
            LINEAR("mlp.down_proj", H, I, mlp_b);
        }
#undef LINEAR
#undef LAYER
    }
    add(t, n, "model.norm.weight", H, 0);
    if (!m->tie_word_embeddings)
        add(t, n, "lm_head.weight", V, H);
    *out = t;
    return MT_OK;
}

/* ------------------------------------------------------------ writing config.json */

/* Shortest text that reads back to the same double, with a '.' or an
 * exponent as Python's json writes floats. */
static void fmt_double(double v, char *buf, size_t cap)
{
    if (v == (double)(int64_t)v && v > -1e15 && v < 1e15) { /* 500000.0, not 5e+05 */
        snprintf(buf, cap, "%.1f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    if (!strpbrk(buf, ".eE") && strlen(buf) + 2 < cap)
        strcat(buf, ".0");
}

/* "  \"key\": 1.5,\n" */
static void put_num(FILE *o, const char *key, double v)
{
    char b[40];
    fmt_double(v, b, sizeof b);
    fprintf(o, "  \"%s\": %s,\n", key, b);
}

static void put_rope(FILE *o, const mt_model_config_t *m)
{
    const mt_rope_scaling_t *r = &m->rope_scaling;
    char f[40], a[40], b[40];
    if (r->rope_type == MT_ROPE_DEFAULT) {
        fprintf(o, "  \"rope_scaling\": null,\n");
        return;
    }
    fmt_double(r->factor, f, sizeof f);
    fprintf(o, "  \"rope_scaling\": {\n    \"rope_type\": \"%s\",\n    \"factor\": %s",
            mt_rope_type_name(r->rope_type), f);
    if (r->rope_type == MT_ROPE_LLAMA3) {
        fmt_double(r->low_freq_factor, a, sizeof a);
        fmt_double(r->high_freq_factor, b, sizeof b);
        fprintf(o, ",\n    \"low_freq_factor\": %s,\n    \"high_freq_factor\": %s", a, b);
    }
    if (r->rope_type == MT_ROPE_YARN) {
        fmt_double(r->beta_fast, a, sizeof a);
        fmt_double(r->beta_slow, b, sizeof b);
        fprintf(o, ",\n    \"beta_fast\": %s,\n    \"beta_slow\": %s,\n    \"truncate\": %s", a,
                b, r->truncate ? "true" : "false");
        if (r->attention_factor > 0) {
            fmt_double(r->attention_factor, a, sizeof a);
            fprintf(o, ",\n    \"attention_factor\": %s", a);
        }
    }
    if (r->original_max_position_embeddings.set)
        fprintf(o, ",\n    \"original_max_position_embeddings\": %lld",
                (long long)r->original_max_position_embeddings.value);
    fprintf(o, "\n  },\n");
}

static void put_moe(FILE *o, const mt_model_config_t *m, mt_arch_t arch)
{
    if (m->num_experts <= 0)
        return;
    put_num(o, "router_aux_loss_coef", m->router_aux_loss_coef);
    fprintf(o, "  \"num_experts_per_tok\": %lld,\n  \"output_router_logits\": false,\n",
            (long long)m->num_experts_per_tok);
    if (arch == MT_ARCH_MIXTRAL) {
        fprintf(o, "  \"num_local_experts\": %lld,\n  \"router_jitter_noise\": 0.0,\n",
                (long long)m->num_experts);
        return;
    }
    fprintf(o, "  \"num_experts\": %lld,\n  \"norm_topk_prob\": %s,\n", (long long)m->num_experts,
            m->norm_topk_prob ? "true" : "false");
    if (arch == MT_ARCH_OLMOE)
        return;
    fprintf(o, "  \"moe_intermediate_size\": %lld,\n  \"decoder_sparse_step\": 1,\n"
            "  \"mlp_only_layers\": [", (long long)m->moe_intermediate_size);
    int first = 1;
    for (const char *c = m->mlp_only_layers; *c;) {
        char *end;
        long v = strtol(c, &end, 10);
        if (end == c)
            break;
        fprintf(o, "%s%ld", first ? "" : ", ", v);
        first = 0;
        c = end + strspn(end, " ,");
    }
    fprintf(o, "],\n");
}

mt_status_t mt_hf_config_json(const mt_model_config_t *m, mt_st_dtype_t dtype, char **text)
{
    char *t = NULL;
    size_t len = 0;
    const mt_arch_t arch = mt_model_arch(m);
    const mt_hf_arch_t *a = mt_hf_arch(arch);
    if (!a)
        MT_FAIL(MT_ERR_CONFIG, "architecture %s has no config.json", mt_arch_name(arch));
    if (m->num_experts > 0 && a->moe == MT_HF_DENSE)
        MT_FAIL(MT_ERR_UNSUPPORTED, "%s has no experts; this model has %lld", a->cls,
                (long long)m->num_experts);
    if (m->num_experts > 0 && a->moe != MT_HF_QWEN3_MOE &&
        (m->moe_intermediate_size != m->intermediate_size || m->mlp_only_layers[0] ||
         m->num_shared_experts))
        MT_FAIL(MT_ERR_UNSUPPORTED, "%s's experts are intermediate_size wide on every layer, "
                "without shared experts: this model cannot be written as one", a->cls);
    if (m->num_shared_experts || m->moe_router_bias_update_rate > 0)
        MT_FAIL(MT_ERR_UNSUPPORTED, "shared experts and the router's balancing bias change what "
                "the model computes and %s has neither", a->cls);
    FILE *o = open_memstream(&t, &len);
    if (!o)
        MT_FAIL(MT_ERR_NOMEM, "config.json text");
    int64_t kv = m->num_key_value_heads.set ? m->num_key_value_heads.value : m->num_attention_heads;
    int64_t hd = m->head_dim.set ? m->head_dim.value : m->hidden_size / m->num_attention_heads;
    fprintf(o, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", a->cls, a->type);
    fprintf(o, "  \"vocab_size\": %lld,\n  \"hidden_size\": %lld,\n  \"intermediate_size\": %lld,\n"
            "  \"num_hidden_layers\": %lld,\n  \"num_attention_heads\": %lld,\n"
            "  \"num_key_value_heads\": %lld,\n  \"head_dim\": %lld,\n  \"hidden_act\": \"silu\",\n"
            "  \"max_position_embeddings\": %lld,\n",
            (long long)m->vocab_size, (long long)m->hidden_size, (long long)m->intermediate_size,
            (long long)m->num_hidden_layers, (long long)m->num_attention_heads, (long long)kv,
            (long long)hd, (long long)m->max_position_embeddings);
    put_num(o, "rms_norm_eps", m->rms_norm_eps);
    put_num(o, "rope_theta", m->rope_theta);
    put_rope(o, m);
    if (arch != MT_ARCH_QWEN2)
        fprintf(o, "  \"attention_bias\": %s,\n", m->attention_bias ? "true" : "false");
    if (arch == MT_ARCH_LLAMA)
        fprintf(o, "  \"mlp_bias\": %s,\n", m->mlp_bias ? "true" : "false");
    fprintf(o, "  \"attention_dropout\": 0.0,\n");
    if (arch == MT_ARCH_MISTRAL || arch == MT_ARCH_MIXTRAL) {
        if (m->sliding_window.set)
            fprintf(o, "  \"sliding_window\": %lld,\n", (long long)m->sliding_window.value);
        else
            fprintf(o, "  \"sliding_window\": null,\n");
    } else if (arch == MT_ARCH_QWEN2 || arch == MT_ARCH_QWEN3 || arch == MT_ARCH_QWEN3_MOE) {
        fprintf(o, "  \"use_sliding_window\": false,\n  \"sliding_window\": null,\n");
    }
    put_moe(o, m, arch);
    put_num(o, "initializer_range", m->initializer_range);
    fprintf(o, "  \"tie_word_embeddings\": %s,\n  \"use_cache\": true,\n  \"torch_dtype\": \"%s\"\n}\n",
            m->tie_word_embeddings ? "true" : "false",
            dtype == MT_ST_BF16 ? "bfloat16" : dtype == MT_ST_F16 ? "float16" : "float32");
    if (fclose(o) != 0 || !t) {
        free(t);
        MT_FAIL(MT_ERR_NOMEM, "config.json text");
    }
    *text = t;
    return MT_OK;
}

/* ------------------------------------------------------------ sizes */

mt_status_t mt_hf_parse_size(const char *s, int64_t *bytes)
{
    static const struct { const char *unit; double mult; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
        {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v > 0))
        MT_FAIL(MT_ERR_CONFIG, "size \"%s\": expected a positive number with an optional unit "
                "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 5GB", s);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(end, units[i].unit) == 0) {
            double b = v * units[i].mult;
            if (b < 1 || b > 9.0e18)
                break;
            *bytes = (int64_t)b;
            return MT_OK;
        }
    MT_FAIL(MT_ERR_CONFIG, "size \"%s\": expected a positive number with an optional unit (B, "
            "KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 5GB", s);
}
