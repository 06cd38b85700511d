/* hf_config.c: Hugging Face config.json <-> meshtrain's model section,
 * and the list of tensors the dense model has.
 *
 * meshtrain's dense model is LlamaForCausalLM, or Qwen3ForCausalLM when
 * qk_norm is on (RMSNorm of q and k over head_dim).  Reading refuses, by
 * name, what that model does not compute: other architectures (MoE
 * included), biases, activations other than SiLU, RoPE scaling, sliding
 * windows, and a head_dim other than hidden_size / num_attention_heads.
 * Keys that do not change the computation (token ids, torch_dtype,
 * use_cache, ...) are ignored. */
#include "hf_internal.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define LLAMA "LlamaForCausalLM"
#define QWEN3 "Qwen3ForCausalLM"
#define QWEN3_MOE "Qwen3MoeForCausalLM"

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
    if (nh < 1 || H % nh)
        MT_FAIL(MT_ERR_CONFIG, "hidden_size %lld is not divisible by num_attention_heads %lld",
                (long long)H, (long long)nh);
    if (m->num_hidden_layers < 1 || m->num_hidden_layers > 100000)
        MT_FAIL(MT_ERR_CONFIG, "num_hidden_layers %lld is out of range",
                (long long)m->num_hidden_layers);
    int64_t hd = H / nh, L = m->num_hidden_layers;
    int64_t per_layer = 11 + (m->num_experts > 0 ? 1 + 3 * m->num_experts : 0);
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
        LAYER("input_layernorm.weight", H, 0);
        LAYER("self_attn.q_proj.weight", nh * hd, H);
        LAYER("self_attn.k_proj.weight", nkv * hd, H);
        LAYER("self_attn.v_proj.weight", nkv * hd, H);
        LAYER("self_attn.o_proj.weight", H, nh * hd);
        if (m->qk_norm) {
            LAYER("self_attn.q_norm.weight", hd, 0);
            LAYER("self_attn.k_norm.weight", hd, 0);
        }
        LAYER("post_attention_layernorm.weight", H, 0);
        if (sparse_layer(m, l)) { /* Qwen3-MoE: the router, then each expert */
            int64_t Im = m->moe_intermediate_size;
            LAYER("mlp.gate.weight", m->num_experts, H);
            for (int64_t e = 0; e < m->num_experts; e++) {
                char ex[96];
                snprintf(ex, sizeof ex, "mlp.experts.%lld.gate_proj.weight", (long long)e);
                LAYER(ex, Im, H);
                snprintf(ex, sizeof ex, "mlp.experts.%lld.up_proj.weight", (long long)e);
                LAYER(ex, Im, H);
                snprintf(ex, sizeof ex, "mlp.experts.%lld.down_proj.weight", (long long)e);
                LAYER(ex, H, Im);
            }
        } else {
            LAYER("mlp.gate_proj.weight", I, H);
            LAYER("mlp.up_proj.weight", I, H);
            LAYER("mlp.down_proj.weight", H, I);
        }
#undef LAYER
    }
    add(t, n, "model.norm.weight", H, 0);
    if (!m->tie_word_embeddings)
        add(t, n, "lm_head.weight", V, H);
    *out = t;
    return MT_OK;
}

/* ------------------------------------------------------------ reading config.json */

typedef struct {
    const json_t *j;
    const char *name; /* the file, for messages */
} cfg_t;

static mt_status_t bad_type(const cfg_t *c, const char *key, const json_t *v, const char *want)
{
    MT_FAIL(MT_ERR_IO, "%s: \"%s\" is a %s, expected %s", c->name, key, mt_hf_json_type(v), want);
}

/* An integer >= 1; required, or *out keeps def when absent or null. */
static mt_status_t get_int(const cfg_t *c, const char *key, int required, int64_t def,
                           int64_t *out)
{
    const json_t *v = json_object_get(c->j, key);
    if (!v || json_is_null(v)) {
        if (required)
            MT_FAIL(MT_ERR_IO, "%s: \"%s\" is missing: it is required", c->name, key);
        *out = def;
        return MT_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1)
        return bad_type(c, key, v, "a positive integer");
    *out = json_integer_value(v);
    return MT_OK;
}

static mt_status_t get_num(const cfg_t *c, const char *key, double def, double *out)
{
    const json_t *v = json_object_get(c->j, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return MT_OK;
    }
    if (!json_is_number(v) || !(json_number_value(v) > 0))
        return bad_type(c, key, v, "a positive number");
    *out = json_number_value(v);
    return MT_OK;
}

static mt_status_t get_bool(const cfg_t *c, const char *key, int def, int *out)
{
    const json_t *v = json_object_get(c->j, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return MT_OK;
    }
    if (!json_is_boolean(v))
        return bad_type(c, key, v, "true or false");
    *out = json_is_true(v);
    return MT_OK;
}

static mt_status_t unsupported(const cfg_t *c, const char *what)
{
    mt_error_set(MT_ERR_UNSUPPORTED, __FILE__, __LINE__, "%s: %s", c->name, what);
    mt_error_hint("meshtrain imports " LLAMA ", " QWEN3 " and " QWEN3_MOE " models without biases, RoPE "
                  "scaling or sliding windows, with head_dim = hidden_size / "
                  "num_attention_heads (doc/hf-interchange.md)");
    return MT_ERR_UNSUPPORTED;
}

/* "Qwen3MoeForCausalLM", "MixtralForCausalLM", ... */
static int looks_moe(const char *arch)
{
    for (const char *p = arch; *p; p++)
        if (strncasecmp(p, "moe", 3) == 0 || strncasecmp(p, "mixtral", 7) == 0)
            return 1;
    return 0;
}

/* The architecture: 0 Llama, 1 Qwen3, 2 Qwen3-MoE. */
static mt_status_t architecture(const cfg_t *c, int *qwen3)
{
    const json_t *a = json_object_get(c->j, "architectures");
    const json_t *mt = json_object_get(c->j, "model_type");
    const char *arch = NULL, *type = NULL;
    char what[512];
    if (mt && !json_is_string(mt))
        return bad_type(c, "model_type", mt, "a string");
    type = mt ? json_string_value(mt) : NULL;
    if (a && !json_is_null(a)) {
        if (!json_is_array(a) || json_array_size(a) != 1 || !json_is_string(json_array_get(a, 0)))
            return bad_type(c, "architectures", a, "an array of one string");
        arch = json_string_value(json_array_get(a, 0));
    }
    if (!arch && !type)
        MT_FAIL(MT_ERR_IO, "%s: neither \"architectures\" nor \"model_type\" says what model "
                "this is", c->name);
    if (arch && strcmp(arch, LLAMA) != 0 && strcmp(arch, QWEN3) != 0 &&
        strcmp(arch, QWEN3_MOE) != 0) {
        snprintf(what, sizeof what, "architecture %.200s is not supported: meshtrain imports "
                 LLAMA ", " QWEN3 " and " QWEN3_MOE "%s", arch,
                 looks_moe(arch) ? " (of mixture-of-experts models, Qwen3-MoE only)" : "");
        return unsupported(c, what);
    }
    if (type && strcmp(type, "llama") != 0 && strcmp(type, "qwen3") != 0 &&
        strcmp(type, "qwen3_moe") != 0) {
        snprintf(what, sizeof what, "model_type \"%.200s\" is not supported: meshtrain imports "
                 "\"llama\", \"qwen3\" and \"qwen3_moe\"", type);
        return unsupported(c, what);
    }
    int from_arch = !arch ? -1 : strcmp(arch, QWEN3) == 0 ? 1 : strcmp(arch, QWEN3_MOE) == 0 ? 2 : 0;
    int from_type = !type ? -1 : strcmp(type, "qwen3") == 0 ? 1 : strcmp(type, "qwen3_moe") == 0 ? 2
                                                                                            : 0;
    *qwen3 = from_arch >= 0 ? from_arch : from_type;
    if (from_arch >= 0 && from_type >= 0 && from_arch != from_type)
        MT_FAIL(MT_ERR_IO, "%s: architectures says %s but model_type is \"%s\"", c->name, arch,
                type);
    return MT_OK;
}

/* RoPE scaling: absent, null, or of type "default".  Newer transformers
 * put rope_theta inside rope_parameters. */
static mt_status_t rope(const cfg_t *c, double *theta)
{
    static const char *const keys[] = {"rope_scaling", "rope_parameters"};
    char what[300];
    for (int k = 0; k < 2; k++) {
        const json_t *r = json_object_get(c->j, keys[k]);
        if (!r || json_is_null(r))
            continue;
        if (!json_is_object(r))
            return bad_type(c, keys[k], r, "an object or null");
        const json_t *t = json_object_get(r, "rope_type");
        if (!t)
            t = json_object_get(r, "type");
        const char *tname = json_string_value(t); /* NULL unless a string */
        if (t && (!tname || strcmp(tname, "default") != 0)) {
            snprintf(what, sizeof what, "%s of type %.100s is not supported: meshtrain's RoPE "
                     "has no scaling", keys[k], tname ? tname : "?");
            return unsupported(c, what);
        }
        const json_t *th = json_object_get(r, "rope_theta");
        if (json_is_number(th) && json_number_value(th) > 0 &&
            !json_object_get(c->j, "rope_theta"))
            *theta = json_number_value(th);
    }
    return MT_OK;
}

mt_status_t mt_hf_config_to_model(const json_t *j, const char *name, mt_model_config_t *m,
                                  FILE *note)
{
    cfg_t c = {j, name};
    if (!json_is_object(j))
        MT_FAIL(MT_ERR_IO, "%s: the file is a JSON %s, expected an object", name,
                mt_hf_json_type(j));
    int qwen3 = 0, flag = 0;
    MT_TRY(architecture(&c, &qwen3));

    /* What the dense model does not compute. */
    static const char *const bias_keys[] = {"attention_bias", "mlp_bias", "use_sliding_window"};
    for (int k = 0; k < 3; k++) {
        MT_TRY(get_bool(&c, bias_keys[k], 0, &flag));
        if (flag) {
            char what[200];
            snprintf(what, sizeof what, "\"%s\": true is not supported: meshtrain's layers have "
                     "%s", bias_keys[k], k < 2 ? "no biases" : "full causal attention only");
            return unsupported(&c, what);
        }
    }
    static const char *const moe_keys[] = {"num_experts", "num_local_experts", "n_routed_experts"};
    for (int k = qwen3 == 2 ? 3 : 0; k < 3; k++) {
        const json_t *v = json_object_get(j, moe_keys[k]);
        if (json_is_number(v) && json_number_value(v) > 0) {
            char what[200];
            snprintf(what, sizeof what, "\"%s\": %g: mixture-of-experts models are not supported "
                     "by import", moe_keys[k], json_number_value(v));
            return unsupported(&c, what);
        }
    }
    const json_t *act = json_object_get(j, "hidden_act");
    const char *act_name = json_string_value(act); /* NULL unless a string */
    if (act && (!act_name || strcmp(act_name, "silu") != 0)) {
        char what[200];
        snprintf(what, sizeof what, "hidden_act %.60s is not supported: meshtrain's MLP is "
                 "SwiGLU (silu)", act_name ? act_name : "(not a string)");
        return unsupported(&c, what);
    }

    mt_model_config_t x = *m;
    int64_t kv;
    MT_TRY(get_int(&c, "vocab_size", 1, 0, &x.vocab_size));
    MT_TRY(get_int(&c, "hidden_size", 1, 0, &x.hidden_size));
    MT_TRY(get_int(&c, "intermediate_size", 1, 0, &x.intermediate_size));
    MT_TRY(get_int(&c, "num_hidden_layers", 1, 0, &x.num_hidden_layers));
    MT_TRY(get_int(&c, "num_attention_heads", 1, 0, &x.num_attention_heads));
    MT_TRY(get_int(&c, "num_key_value_heads", 0, x.num_attention_heads, &kv));
    /* transformers' class defaults for what a config.json may leave out */
    MT_TRY(get_int(&c, "max_position_embeddings", 0, qwen3 ? 32768 : 2048,
                   &x.max_position_embeddings));
    MT_TRY(get_num(&c, "rms_norm_eps", 1e-6, &x.rms_norm_eps));
    MT_TRY(get_num(&c, "rope_theta", 10000.0, &x.rope_theta));
    MT_TRY(rope(&c, &x.rope_theta));
    MT_TRY(get_num(&c, "initializer_range", x.initializer_range, &x.initializer_range));
    MT_TRY(get_bool(&c, "tie_word_embeddings", 0, &flag));
    x.tie_word_embeddings = flag;
    x.num_key_value_heads.set = true;
    x.num_key_value_heads.value = kv;
    x.qk_norm = qwen3 != 0;
    x.num_experts = 0;
    x.mlp_only_layers[0] = '\0';
    if (qwen3 == 2) { /* Qwen3-MoE: transformers' defaults for what may be left out */
        int64_t step = 1;
        MT_TRY(get_int(&c, "num_experts", 1, 0, &x.num_experts));
        MT_TRY(get_int(&c, "num_experts_per_tok", 0, 8, &x.num_experts_per_tok));
        MT_TRY(get_int(&c, "moe_intermediate_size", 0, 768, &x.moe_intermediate_size));
        MT_TRY(get_bool(&c, "norm_topk_prob", 0, &flag));
        x.norm_topk_prob = flag;
        MT_TRY(get_num(&c, "router_aux_loss_coef", 0.001, &x.router_aux_loss_coef));
        MT_TRY(get_int(&c, "decoder_sparse_step", 0, 1, &step));
        const json_t *dl = json_object_get(j, "mlp_only_layers");
        if (dl && !json_is_null(dl) && !json_is_array(dl))
            return bad_type(&c, "mlp_only_layers", dl, "an array of layer indices");
        /* dense: listed, or not on the sparse step (transformers' rule) */
        size_t used = 0;
        for (int64_t l = 0; l < x.num_hidden_layers; l++) {
            int dense = step < 1 || (l + 1) % step != 0;
            for (size_t i = 0; i < json_array_size(dl); i++) /* 0 unless an array */
                dense |= json_is_number(json_array_get(dl, i)) &&
                         json_number_value(json_array_get(dl, i)) == (double)l;
            if (dense && used + 24 < sizeof x.mlp_only_layers)
                used += (size_t)snprintf(x.mlp_only_layers + used, sizeof x.mlp_only_layers - used,
                                         "%s%lld", used ? "," : "", (long long)l);
        }
    }
    if (x.hidden_size % x.num_attention_heads)
        return unsupported(&c, "hidden_size is not divisible by num_attention_heads");
    int64_t hd, derived = x.hidden_size / x.num_attention_heads;
    MT_TRY(get_int(&c, "head_dim", 0, derived, &hd));
    if (hd != derived) {
        char what[300];
        snprintf(what, sizeof what, "head_dim %lld differs from hidden_size / num_attention_heads "
                 "= %lld / %lld = %lld; meshtrain derives head_dim from those two, so it cannot "
                 "hold this model yet", (long long)hd, (long long)x.hidden_size,
                 (long long)x.num_attention_heads, (long long)derived);
        return unsupported(&c, what);
    }
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

mt_status_t mt_hf_config_json(const mt_model_config_t *m, mt_st_dtype_t dtype, char **text)
{
    char *t = NULL, eps[40], theta[40], init[40];
    size_t len = 0;
    FILE *o = open_memstream(&t, &len);
    if (!o)
        MT_FAIL(MT_ERR_NOMEM, "config.json text");
    int64_t kv = m->num_key_value_heads.set ? m->num_key_value_heads.value : m->num_attention_heads;
    fmt_double(m->rms_norm_eps, eps, sizeof eps);
    fmt_double(m->rope_theta, theta, sizeof theta);
    fmt_double(m->initializer_range, init, sizeof init);
    /* Qwen3-MoE's keys, after the dense ones */
    char moe[MT_PATH_MAX + 512] = "", coef[40];
    if (m->num_experts > 0) {
        fmt_double(m->router_aux_loss_coef, coef, sizeof coef);
        int k = snprintf(moe, sizeof moe, "  \"num_experts\": %lld,\n  \"num_experts_per_tok\": "
                         "%lld,\n  \"moe_intermediate_size\": %lld,\n  \"norm_topk_prob\": %s,\n"
                         "  \"router_aux_loss_coef\": %s,\n  \"decoder_sparse_step\": 1,\n"
                         "  \"output_router_logits\": false,\n  \"mlp_only_layers\": [",
                         (long long)m->num_experts, (long long)m->num_experts_per_tok,
                         (long long)m->moe_intermediate_size, m->norm_topk_prob ? "true" : "false",
                         coef);
        for (const char *c = m->mlp_only_layers; *c && k > 0 && (size_t)k < sizeof moe - 32;) {
            char *end;
            long v = strtol(c, &end, 10);
            if (end == c)
                break;
            k += snprintf(moe + k, sizeof moe - (size_t)k, "%s%ld", moe[k - 1] == '[' ? "" : ", ", v);
            c = end + strspn(end, " ,");
        }
        if (k > 0 && (size_t)k < sizeof moe - 4)
            snprintf(moe + k, sizeof moe - (size_t)k, "],\n");
    }
    const char *arch = m->num_experts > 0 ? QWEN3_MOE : m->qk_norm ? QWEN3 : LLAMA;
    const char *type = m->num_experts > 0 ? "qwen3_moe" : m->qk_norm ? "qwen3" : "llama";
    fprintf(o, "{\n"
            "  \"architectures\": [\"%s\"],\n"
            "  \"model_type\": \"%s\",\n"
            "  \"vocab_size\": %lld,\n"
            "  \"hidden_size\": %lld,\n"
            "  \"intermediate_size\": %lld,\n"
            "  \"num_hidden_layers\": %lld,\n"
            "  \"num_attention_heads\": %lld,\n"
            "  \"num_key_value_heads\": %lld,\n"
            "  \"head_dim\": %lld,\n"
            "  \"hidden_act\": \"silu\",\n"
            "  \"max_position_embeddings\": %lld,\n"
            "  \"rms_norm_eps\": %s,\n"
            "  \"rope_theta\": %s,\n"
            "  \"rope_scaling\": null,\n"
            "  \"attention_bias\": false,\n"
            "  \"attention_dropout\": 0.0,\n"
            "%s%s"
            "  \"initializer_range\": %s,\n"
            "  \"tie_word_embeddings\": %s,\n"
            "  \"use_cache\": true,\n"
            "  \"torch_dtype\": \"%s\"\n"
            "}\n",
            arch, type, (long long)m->vocab_size,
            (long long)m->hidden_size, (long long)m->intermediate_size,
            (long long)m->num_hidden_layers, (long long)m->num_attention_heads, (long long)kv,
            (long long)(m->hidden_size / m->num_attention_heads),
            (long long)m->max_position_embeddings, eps, theta,
            m->qk_norm ? "  \"use_sliding_window\": false,\n  \"sliding_window\": null,\n"
                       : "  \"mlp_bias\": false,\n",
            moe,
            init, m->tie_word_embeddings ? "true" : "false",
            dtype == MT_ST_BF16 ? "bfloat16" : "float32");
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
