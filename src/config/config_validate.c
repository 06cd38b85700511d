/* config_validate.c: every cross-key rule of a meshtrain config.
 *
 * Each rule has its own message, names the key path and where the value
 * came from (FILE:LINE:COL, an override, or the default), and has its own
 * test in tests/config/test_config_validate.c.  All violated rules are reported
 * together.  The same function serves the apps and meshtrain-plan, so a
 * config that plans cleanly starts cleanly.  Derived sizes are filled in
 * cfg->derived; nothing here talks to MPI. */
#include "config_internal.h"
#include "mt_pp_schedule.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    mt_config_t *cfg;
    mt_diag_t diag;
} vctx_t;

/* Report a violation located at key `path` (or section, if not a key). */
static void verr(vctx_t *v, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void verr(vctx_t *v, const char *path, const char *fmt, ...)
{
    char loc[MT_PATH_MAX + 300], msg[1024];
    mt_origin_t o = {MT_ORIGIN_DEFAULT, 0, 0, 0};
    int ki = mt_cfg_key_index(path), si = mt_cfg_section_index(path);
    if (ki >= 0)
        o = v->cfg->key_origin[ki];
    else if (si >= 0)
        o = v->cfg->section_origin[si];
    mt_diag_location(v->cfg, &o, loc, sizeof loc);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mt_diag_add(&v->diag, "%s%s: %s", loc, path, msg);
}

/* " (tp_size from FILE:L:C)" when the key was set explicitly: rules about
 * one key often come from another key's value. */
static const char *from(const vctx_t *v, const char *path, char *buf, size_t cap)
{
    int ki = mt_cfg_key_index(path);
    buf[0] = '\0';
    if (ki < 0 || v->cfg->key_origin[ki].kind == MT_ORIGIN_DEFAULT)
        return buf;
    char loc[MT_PATH_MAX + 300];
    mt_diag_location(v->cfg, &v->cfg->key_origin[ki], loc, sizeof loc);
    size_t n = strlen(loc);
    while (n > 0 && (loc[n - 1] == ' ' || loc[n - 1] == ':'))
        loc[--n] = '\0';
    snprintf(buf, cap, " (%s from %s)", strrchr(path, '.') + 1, loc);
    return buf;
}

/* The mesh size key most likely responsible: an overridden one, else one
 * set in the file, else the section. */
static const char *size_culprit(const vctx_t *v)
{
    static const char *keys[] = {"distributed.tp_size", "distributed.pp_size", "distributed.cp_size"};
    for (int kind = MT_ORIGIN_OVERRIDE; kind >= MT_ORIGIN_FILE; kind--)
        for (int i = 0; i < 3; i++) {
            int ki = mt_cfg_key_index(keys[i]);
            if (v->cfg->key_origin[ki].kind == kind)
                return keys[i];
        }
    return "distributed";
}

/* Set explicitly to something other than its default: an option of another
 * strategy is an error only then, so a resolved config (which lists every
 * key) and a strategy switched by an override still validate. */
static bool key_set(const mt_config_t *cfg, const char *path)
{
    int ki = mt_cfg_key_index(path);
    if (ki < 0 || cfg->key_origin[ki].kind == MT_ORIGIN_DEFAULT)
        return false;
    const mt_cfg_key_t *k = &mt_cfg_keys[ki];
    mt_config_t *def = calloc(1, sizeof *def);
    if (!def)
        return true;
    size_t size = k->type == MT_T_BOOL    ? sizeof(bool)
                  : k->type == MT_T_INT   ? sizeof(int64_t)
                  : k->type == MT_T_FLOAT ? sizeof(double)
                                          : 0;
    bool differs = true;
    if (size && mt_cfg_set_default(def, k) == MT_OK)
        differs = memcmp((const char *)cfg + k->offset, (const char *)def + k->offset, size) != 0;
    free(def);
    return differs;
}

static bool section_present(const mt_config_t *cfg, const char *path)
{
    int si = mt_cfg_section_index(path);
    return si >= 0 && cfg->section_origin[si].kind != MT_ORIGIN_DEFAULT;
}

/* ---- ranges of single keys (run first: later rules divide by them) ---- */
static void check_ranges(vctx_t *v)
{
    const mt_config_t *cfg = v->cfg;
    const char *base = (const char *)cfg;
    for (int i = 0; i < mt_cfg_nkeys; i++) {
        const mt_cfg_key_t *k = &mt_cfg_keys[i];
        int64_t val;
        if (k->type == MT_T_INT)
            val = *(const int64_t *)(base + k->offset);
        else if (k->type == MT_T_OPT_INT && ((const mt_opt_int_t *)(base + k->offset))->set)
            val = ((const mt_opt_int_t *)(base + k->offset))->value;
        else
            continue;
        if (val < k->min && k->min == 1)
            verr(v, k->path, "must be positive, got %lld", (long long)val);
        else if (val < k->min)
            verr(v, k->path, "must be at least %lld, got %lld", (long long)k->min, (long long)val);
        else if (val > k->max)
            verr(v, k->path, "must be at most %lld, got %lld", (long long)k->max, (long long)val);
    }
    const mt_model_config_t *m = &cfg->model;
    if (!(m->rope_theta > 0))
        verr(v, "model.rope_theta", "must be positive, got %g", m->rope_theta);
    if (!(m->rms_norm_eps > 0))
        verr(v, "model.rms_norm_eps", "must be positive, got %g", m->rms_norm_eps);
    if (!(m->initializer_range > 0))
        verr(v, "model.initializer_range", "must be positive, got %g", m->initializer_range);
    if (m->moe_router_bias_update_rate < 0)
        verr(v, "model.moe_router_bias_update_rate", "must not be negative (0 is off), got %g",
             m->moe_router_bias_update_rate);
    if (m->moe_capacity_factor < 0)
        verr(v, "model.moe_capacity_factor", "must not be negative (0 is dropless), got %g",
             m->moe_capacity_factor);
    if (m->router_aux_loss_coef < 0)
        verr(v, "model.router_aux_loss_coef", "must not be negative, got %g",
             m->router_aux_loss_coef);
    if (!(cfg->distributed.ddp_bucket_cap_mb > 0))
        verr(v, "distributed.ddp_bucket_cap_mb", "must be positive, got %g",
             cfg->distributed.ddp_bucket_cap_mb);
    const mt_optimizer_config_t *o = &cfg->optimizer;
    if (!(o->lr > 0))
        verr(v, "optimizer.lr", "must be positive, got %g", o->lr);
    if (!(o->eps > 0))
        verr(v, "optimizer.eps", "must be positive, got %g", o->eps);
    if (o->weight_decay < 0)
        verr(v, "optimizer.weight_decay", "must not be negative, got %g", o->weight_decay);
    if (o->max_grad_norm < 0)
        verr(v, "optimizer.max_grad_norm", "must not be negative (0 disables clipping), got %g",
             o->max_grad_norm);
    for (int i = 0; i < o->nbetas; i++)
        if (!(o->betas[i] >= 0 && o->betas[i] < 1))
            verr(v, "optimizer.betas", "each beta must be in [0, 1), got %g", o->betas[i]);
    if (cfg->lr_scheduler.min_lr < 0 || cfg->lr_scheduler.min_lr > o->lr)
        verr(v, "lr_scheduler.min_lr", "must be in [0, optimizer.lr = %g], got %g", o->lr,
             cfg->lr_scheduler.min_lr);
    if (!(cfg->checkpoint.lock_stale_s > 0 && cfg->checkpoint.lock_stale_s <= 1e9))
        verr(v, "checkpoint.lock_stale_s", "must be a number of seconds in (0, 1e9], got %g",
             cfg->checkpoint.lock_stale_s);
    if (cfg->checkpoint.keep_last_n == 1)
        verr(v, "checkpoint.keep_last_n",
             "must be 0 (keep all) or at least 2, got 1: the newest checkpoint may be "
             "incomplete when a job dies, so one older complete one must survive");
    if (cfg->checkpoint.model_save_format == MT_SAVE_TORCH_SAVE)
        verr(v, "checkpoint.model_save_format",
             "torch_save (AutoModel's PyTorch pickle format) is not supported: meshtrain writes "
             "no pickles; use safetensors");
    else if (cfg->checkpoint.model_save_format == MT_SAVE_HDF5 &&
             cfg->checkpoint.save_consolidated != MT_CONSOLIDATE_NEVER)
        verr(v, "checkpoint.model_save_format",
             "hdf5 with save_consolidated %s: the consolidated directory is Hugging Face "
             "safetensors (the checkpoint beside it is HDF5 already); use safetensors",
             cfg->checkpoint.save_consolidated == MT_CONSOLIDATE_FINAL ? "final" : "every");
    if (cfg->checkpoint.save_consolidated != MT_CONSOLIDATE_NEVER && !cfg->checkpoint.enabled)
        verr(v, "checkpoint.save_consolidated",
             "%s with checkpoint.enabled false: the consolidated directory is written beside "
             "a checkpoint, and none is; set checkpoint.enabled true",
             cfg->checkpoint.save_consolidated == MT_CONSOLIDATE_FINAL ? "final" : "every");
}

/* ---- RoPE scaling: the ranges transformers' rope initialisation accepts ---- */
static void check_rope(vctx_t *v, const mt_model_config_t *m)
{
    const mt_rope_scaling_t *r = &m->rope_scaling;
    if (r->rope_type == MT_ROPE_DEFAULT)
        return;
    if (!(r->factor >= 1.0))
        verr(v, "model.rope_scaling.factor", "must be at least 1 for rope_type %s, got %g",
             mt_rope_type_name(r->rope_type), r->factor);
    if (r->rope_type == MT_ROPE_LLAMA3) {
        if (!r->original_max_position_embeddings.set)
            verr(v, "model.rope_scaling.original_max_position_embeddings",
                 "is required by rope_type llama3 (the context before scaling, 8192 for "
                 "Llama 3.1)");
        if (!(r->low_freq_factor > 0 && r->high_freq_factor > r->low_freq_factor))
            verr(v, "model.rope_scaling.high_freq_factor", "llama3 needs 0 < low_freq_factor < "
                 "high_freq_factor, got %g and %g", r->low_freq_factor, r->high_freq_factor);
    }
    if (r->rope_type == MT_ROPE_YARN) {
        if (!(r->beta_slow > 0 && r->beta_fast > r->beta_slow))
            verr(v, "model.rope_scaling.beta_fast", "yarn needs 0 < beta_slow < beta_fast, got "
                 "%g and %g", r->beta_slow, r->beta_fast);
        if (r->attention_factor < 0)
            verr(v, "model.rope_scaling.attention_factor", "must not be negative, got %g",
                 r->attention_factor);
    }
}

/* ---- no silent default model ---- */
/* A model is named by pretrained_model_name_or_path, a model.config block,
 * or its shape keys set explicitly; the schema's defaults describe no real
 * model, so a config that relies on them is refused. */
static void check_named_model(vctx_t *v)
{
    static const char *const shape[] = {"model.vocab_size", "model.hidden_size",
                                        "model.intermediate_size", "model.num_hidden_layers",
                                        "model.num_attention_heads"};
    const mt_model_config_t *m = &v->cfg->model;
    if (m->pretrained_model_name_or_path[0] || m->hf_config[0])
        return;
    char missing[512] = "";
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++) {
        int ki = mt_cfg_key_index(shape[i]);
        if (ki >= 0 && v->cfg->key_origin[ki].kind == MT_ORIGIN_DEFAULT)
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s",
                     missing[0] ? ", " : "", shape[i]);
    }
    if (missing[0])
        verr(v, "model", "no model is named: set model.pretrained_model_name_or_path (a "
             "directory, or a hub id org/name in the local Hugging Face cache), a model.config "
             "block (AutoModel's from_config), or the shape keys (missing: %s)", missing);
}

/* ---- model shape ---- */
/* a * b * c into *out; on int64 overflow, an error naming key and the
 * factors, and 0 returned so the caller stops before using the product. */
static int mul3(vctx_t *v, const char *key, const char *what, int64_t a, int64_t b, int64_t c,
                int64_t *out)
{
    int64_t ab;
    if (!__builtin_mul_overflow(a, b, &ab) && !__builtin_mul_overflow(ab, c, out))
        return 1;
    verr(v, key, "%s = %lld x %lld x %lld overflows a 64-bit integer: the model is too large "
         "to size", what, (long long)a, (long long)b, (long long)c);
    return 0;
}

/* The model's sizes multiplied the way the trainer and the plan multiply
 * them (parameters, their bytes with optimizer state, the logits of a
 * row), overflow-checked so a huge size is refused by name here instead
 * of wrapping around into a negative memory or a division by zero. */
static int check_products(vctx_t *v, const mt_model_config_t *m, int64_t seq)
{
    int64_t V = m->vocab_size, H = m->hidden_size, I = m->intermediate_size;
    int64_t L = m->num_hidden_layers, E = m->num_experts, Im = m->moe_intermediate_size;
    int64_t emb, attn, mlp, moe, layer, total, bytes, logits;
    if (!mul3(v, V >= H ? "model.vocab_size" : "model.hidden_size",
              "2 x vocab_size x hidden_size", 2, V, H, &emb) ||
        !mul3(v, "model.hidden_size", "4 x hidden_size x hidden_size", 4, H, H, &attn) ||
        !mul3(v, "model.intermediate_size", "3 x hidden_size x intermediate_size", 3, H, I,
              &mlp) ||
        !mul3(v, "model.num_experts", "num_experts x hidden_size x 3 x moe_intermediate_size",
              E > 0 ? E : 0, H, 3 * (Im > 0 && Im < INT64_MAX / 3 ? Im : 1), &moe) ||
        !mul3(v, "model.vocab_size", "seq_length x vocab_size x 4 bytes of logits",
              seq > 0 ? seq : 1, V, 4, &logits))
        return 0;
    if (__builtin_add_overflow(attn, mlp, &layer) || __builtin_add_overflow(layer, moe, &layer)) {
        verr(v, "model.hidden_size", "the parameters of one layer overflow a 64-bit integer: "
             "the model is too large to size");
        return 0;
    }
    if (!mul3(v, "model.num_hidden_layers", "num_hidden_layers x parameters per layer", L, layer,
              1, &total))
        return 0;
    if (__builtin_add_overflow(total, emb, &total)) {
        verr(v, "model.vocab_size", "the parameter count overflows a 64-bit integer: the model "
             "is too large to size");
        return 0;
    }
    return mul3(v, "model.num_hidden_layers", "parameters x 16 bytes (weights, gradients, Adam)",
                total, 16, 1, &bytes);
}

static void check_model(vctx_t *v, mt_app_kind_t app)
{
    mt_model_config_t *m = &v->cfg->model;
    check_named_model(v);
    if (!check_products(v, m, v->cfg->dataset.seq_length))
        return;
    if (!m->num_key_value_heads.set) /* HF: none means multi-head attention */
        m->num_key_value_heads.set = true, m->num_key_value_heads.value = m->num_attention_heads;
    int64_t kv = m->num_key_value_heads.value;
    if (!m->head_dim.set && m->hidden_size % m->num_attention_heads)
        verr(v, "model.hidden_size", "%lld is not divisible by num_attention_heads (%lld); "
             "set model.head_dim when heads are not hidden_size / num_attention_heads wide",
             (long long)m->hidden_size, (long long)m->num_attention_heads);
    if (m->head_dim.set && m->head_dim.value % 2)
        verr(v, "model.head_dim", "%lld is odd: RoPE rotates pairs of dimensions",
             (long long)m->head_dim.value);
    check_rope(v, m);
    if (m->num_attention_heads % kv)
        verr(v, "model.num_key_value_heads",
             "num_attention_heads (%lld) is not divisible by num_key_value_heads (%lld)",
             (long long)m->num_attention_heads, (long long)kv);
    if (m->num_experts > 0 && m->num_experts_per_tok > m->num_experts)
        verr(v, "model.num_experts_per_tok", "%lld exceeds num_experts (%lld)",
             (long long)m->num_experts_per_tok, (long long)m->num_experts);
    if (app == MT_APP_MOE && m->num_experts == 0)
        verr(v, "model.num_experts",
             "meshtrain-moe trains MoE models: set num_experts > 0 (or use meshtrain-dense)");
    if (m->mlp_only_layers[0]) { /* "0, 3": integers in [0, num_hidden_layers) */
        const char *c = m->mlp_only_layers;
        while (*c) {
            char *end;
            long long l = strtoll(c, &end, 10);
            if (end == c || l < 0 || l >= m->num_hidden_layers) {
                verr(v, "model.mlp_only_layers", "\"%s\": expected comma-separated layer "
                     "indices in [0, %lld)", m->mlp_only_layers, (long long)m->num_hidden_layers);
                break;
            }
            c = end + strspn(end, " ,");
        }
    }
    if ((app == MT_APP_DENSE || app == MT_APP_CP) && m->num_experts > 0)
        verr(v, "model.num_experts", "%s trains dense models; num_experts = %lld is a MoE model: "
             "use meshtrain-moe", mt_app_kind_name(app), (long long)m->num_experts);
}

/* ---- sizes, strategies, dp_replicate, ep ---- */
static void check_sizes(vctx_t *v, int64_t world)
{
    mt_config_t *cfg = v->cfg;
    mt_distributed_config_t *d = &cfg->distributed;
    mt_derived_t *dv = &cfg->derived;
    int64_t model_par = d->tp_size * d->pp_size * d->cp_size;

    dv->world_size = world;
    dv->dp_size = 0;
    dv->dp_replicate = 1;
    if (d->collectives == MT_COLL_NCCL && d->device != MT_DEVICE_CUDA)
        verr(v, "distributed.collectives", "nccl needs distributed.device cuda (the device is "
             "%s): use collectives auto or mpi", mt_device_name(d->device));
    if (world % model_par) {
        verr(v, size_culprit(v), "world size %lld is not divisible by tp_size x pp_size x cp_size "
             "= %lld x %lld x %lld = %lld", (long long)world, (long long)d->tp_size,
             (long long)d->pp_size, (long long)d->cp_size, (long long)model_par);
    } else {
        dv->dp_size = world / model_par;
        if (d->dp_size.set && d->dp_size.value != dv->dp_size)
            verr(v, "distributed.dp_size", "%lld does not match world_size / (tp x pp x cp) = "
                 "%lld / %lld = %lld; set it to none to infer it", (long long)d->dp_size.value,
                 (long long)world, (long long)model_par, (long long)dv->dp_size);
    }
    if (d->dp_replicate_size.set) {
        int64_t r = d->dp_replicate_size.value;
        if (d->strategy == MT_STRATEGY_DDP)
            verr(v, "distributed.dp_replicate_size",
                 "ddp replicates over every data-parallel rank already; remove dp_replicate_size");
        else if (d->strategy != MT_STRATEGY_FSDP2)
            verr(v, "distributed.dp_replicate_size",
                 "is fsdp2 only (HSDP); strategy is %s", mt_strategy_name(d->strategy));
        else if (dv->dp_size == 0)
            ; /* the world-size rule above already failed */
        else if (dv->dp_size % r)
            verr(v, "distributed.dp_replicate_size", "%lld does not divide dp_size %lld",
                 (long long)r, (long long)dv->dp_size);
        else if (r >= dv->dp_size && d->cp_size == 1) /* with cp, fsdp2 shards over cp */
            verr(v, "distributed.dp_replicate_size",
                 "%lld must be smaller than dp_size %lld: pure replication is not supported "
                 "(use strategy: ddp)", (long long)r, (long long)dv->dp_size);
        else
            dv->dp_replicate = r;
    }
    dv->dp_shard = dv->dp_size / dv->dp_replicate;

    if (d->strategy == MT_STRATEGY_MEGATRON_FSDP) {
        if (d->pp_size > 1)
            verr(v, "distributed.pp_size", "megatron_fsdp does not support pipeline parallelism "
                 "(pp_size = %lld); use fsdp2", (long long)d->pp_size);
        if (d->ep_size > 1)
            verr(v, "distributed.ep_size", "megatron_fsdp does not support expert parallelism "
                 "(ep_size = %lld); use fsdp2", (long long)d->ep_size);
        if (d->sequence_parallel)
            verr(v, "distributed.sequence_parallel",
                 "megatron_fsdp does not support sequence_parallel; use fsdp2");
    } else {
        static const char *mfsdp_only[] = {"distributed.zero_dp_strategy",
                                           "distributed.overlap_grad_reduce",
                                           "distributed.overlap_param_gather"};
        for (int i = 0; i < 3; i++)
            if (key_set(cfg, mfsdp_only[i]))
                verr(v, mfsdp_only[i], "is a megatron_fsdp option; strategy is %s",
                     mt_strategy_name(d->strategy));
    }
    if (d->strategy == MT_STRATEGY_DDP) {
        const char *axes[] = {"tp_size", "pp_size", "cp_size", "ep_size"};
        int64_t vals[] = {d->tp_size, d->pp_size, d->cp_size, d->ep_size};
        for (int i = 0; i < 4; i++) {
            char path[64];
            snprintf(path, sizeof path, "distributed.%s", axes[i]);
            if (vals[i] > 1)
                verr(v, path, "ddp is data parallelism only; %s = %lld needs strategy fsdp2",
                     axes[i], (long long)vals[i]);
        }
    }
    if (d->strategy != MT_STRATEGY_DDP && key_set(cfg, "distributed.ddp_bucket_cap_mb"))
        verr(v, "distributed.ddp_bucket_cap_mb", "is a ddp option; strategy is %s",
             mt_strategy_name(d->strategy));
    static const char *fsdp2_only[] = {"distributed.defer_fsdp_grad_sync",
                                        "distributed.reshard_after_forward"};
    for (int i = 0; i < 2; i++)
        if (d->strategy != MT_STRATEGY_FSDP2 && key_set(cfg, fsdp2_only[i]))
            verr(v, fsdp2_only[i], "is an fsdp2 option; strategy is %s",
                 mt_strategy_name(d->strategy));

    dv->ep_shard = 1;
    if (d->ep_size > 1) {
        int64_t dpcp = dv->dp_size * d->cp_size;
        if (dpcp == 0)
            ; /* the world-size rule already failed */
        else if (dpcp % d->ep_size && (dpcp * d->tp_size) % d->ep_size == 0)
            /* AutoModel folds tp into the expert axis; meshtrain's experts
             * are tp-split inside each expert-parallel rank instead */
            verr(v, "distributed.ep_size", "dp_size x cp_size = %lld x %lld = %lld is not "
                 "divisible by ep_size %lld (AutoModel's rule, dp x cp x tp, folds the %lld "
                 "tp ranks into the expert axis; meshtrain splits experts over dp x cp and "
                 "each expert over tp): lower ep_size to a divisor of %lld", (long long)dv->dp_size,
                 (long long)d->cp_size, (long long)dpcp, (long long)d->ep_size,
                 (long long)d->tp_size, (long long)dpcp);
        else if (dpcp % d->ep_size)
            verr(v, "distributed.ep_size", "dp_size x cp_size = %lld x %lld = %lld is not "
                 "divisible by ep_size %lld", (long long)dv->dp_size, (long long)d->cp_size,
                 (long long)dpcp, (long long)d->ep_size);
        else
            dv->ep_shard = dpcp / d->ep_size;
        if (cfg->model.num_experts == 0)
            verr(v, "distributed.ep_size", "ep_size %lld needs a MoE model (model.num_experts > 0)",
                 (long long)d->ep_size);
        else if (cfg->model.num_experts % d->ep_size)
            verr(v, "model.num_experts", "%lld experts do not split evenly over ep_size %lld",
                 (long long)cfg->model.num_experts, (long long)d->ep_size);
    }
}

/* ---- pipeline ---- */
static void check_pipeline(vctx_t *v)
{
    mt_config_t *cfg = v->cfg;
    const mt_distributed_config_t *d = &cfg->distributed;
    const mt_pipeline_config_t *p = &d->pipeline;
    mt_derived_t *dv = &cfg->derived;
    int64_t L = cfg->model.num_hidden_layers, pp = d->pp_size;

    dv->num_stages = 1, dv->stages_per_rank = 1, dv->num_microbatches = 1;
    if (pp == 1)
        return;
    if (!section_present(cfg, "distributed.pipeline")) {
        verr(v, "distributed.pp_size", "pp_size %lld needs a `pipeline:` block under "
             "distributed: (pp_schedule, pp_microbatch_size, ...)", (long long)pp);
        return;
    }
    bool multi = mt_pp_schedule_multi_stage(p->pp_schedule);
    int64_t stages;
    if (p->layers_per_stage.set) {
        int64_t k = p->layers_per_stage.value;
        stages = (L + k - 1) / k;
        if (stages % pp && p->round_virtual_stages == 1)
            stages += pp - stages % pp;
        else if (stages % pp && p->round_virtual_stages == 2 && stages > pp)
            stages -= stages % pp;
        if (stages % pp) {
            verr(v, "distributed.pipeline.layers_per_stage",
                 "%lld layers at %lld per stage make %lld stages, not a multiple of pp_size %lld",
                 (long long)L, (long long)k, (long long)stages, (long long)pp);
            return;
        }
    } else {
        stages = pp * (multi ? 2 : 1);
        if (L % stages && !p->balanced_split) {
            verr(v, "model.num_hidden_layers", "%lld layers do not split evenly over %lld stages "
                 "(pp_size %lld x %d per rank for %s); set pipeline.layers_per_stage",
                 (long long)L, (long long)stages, (long long)pp, multi ? 2 : 1,
                 mt_pp_schedule_name(p->pp_schedule));
            return;
        }
    }
    int64_t per_rank = stages / pp;
    dv->num_stages = stages, dv->stages_per_rank = per_rank;
    bool v_ok = false;
    if (p->pp_schedule == MT_PP_V_SCHEDULE && per_rank != 2)
        verr(v, "distributed.pipeline.pp_schedule", "v_schedule needs exactly 2 stages per rank, "
             "layers_per_stage gives %lld", (long long)per_rank);
    else if (multi && per_rank < 2)
        verr(v, "distributed.pipeline.pp_schedule", "%s needs at least 2 stages per rank, "
             "layers_per_stage gives %lld", mt_pp_schedule_name(p->pp_schedule),
             (long long)per_rank);
    else if (!multi && per_rank != 1)
        verr(v, "distributed.pipeline.pp_schedule", "%s runs 1 stage per rank, layers_per_stage "
             "gives %lld; use interleaved_1f1b, looped_bfs or dfs",
             mt_pp_schedule_name(p->pp_schedule), (long long)per_rank);
    else
        v_ok = true;
    /* What the executor does not do (doc/pipeline.md, "The executor"). */
    int first = mt_pp_stage_rank(p->pp_schedule, (int)pp, 0);
    int last = mt_pp_stage_rank(p->pp_schedule, (int)pp, (int)stages - 1);
    if (v_ok && cfg->model.tie_word_embeddings && first != last)
        verr(v, "model.tie_word_embeddings", "tied embeddings need the first and the last "
             "pipeline stage on one rank (%s puts them on pipeline ranks %d and %d); untie them "
             "or use v_schedule", mt_pp_schedule_name(p->pp_schedule), first, last);
    bool split = p->pp_schedule == MT_PP_ZERO_BUBBLE || p->pp_schedule == MT_PP_V_SCHEDULE;
    if (split && d->activation_checkpointing)
        verr(v, "distributed.activation_checkpointing", "%s defers weight gradients, which need "
             "every layer's stored activations: not with activation_checkpointing",
             mt_pp_schedule_name(p->pp_schedule));

    int64_t local = cfg->step_scheduler.local_batch_size;
    if (local % p->pp_microbatch_size)
        verr(v, "distributed.pipeline.pp_microbatch_size",
             "%lld does not divide step_scheduler.local_batch_size %lld",
             (long long)p->pp_microbatch_size, (long long)local);
    else
        dv->num_microbatches = local / p->pp_microbatch_size;
    /* what the schedule generator itself needs (the microbatch rules) */
    if (v_ok && local % p->pp_microbatch_size == 0 &&
        mt_pp_schedule_check(p->pp_schedule, (int)pp, (int)per_rank, (int)dv->num_microbatches) != MT_OK) {
        verr(v, "distributed.pipeline.pp_schedule", "%s", mt_error_message());
        mt_error_clear();
    }
}

/* ---- sequence: packing, cp, sequence parallel ---- */
static void check_sequence(vctx_t *v)
{
    mt_config_t *cfg = v->cfg;
    const mt_distributed_config_t *d = &cfg->distributed;
    int64_t packed = cfg->packed_sequence.packed_sequence_size, cp = d->cp_size;
    int64_t tp = d->tp_size;

    cfg->derived.seq_len = packed > 0 ? packed : cfg->dataset.seq_length;
    if (packed > 0) {
        if (cfg->step_scheduler.local_batch_size != 1)
            verr(v, "step_scheduler.local_batch_size", "packed sequences need local_batch_size 1 "
                 "(got %lld): one packed row is one sample",
                 (long long)cfg->step_scheduler.local_batch_size);
        if (cp > 1 && packed % (2 * cp))
            verr(v, "packed_sequence.packed_sequence_size", "%lld is not divisible by 2 x cp_size "
                 "= %lld: load-balanced causal sharding cuts each row into 2 x cp chunks",
                 (long long)packed, (long long)(2 * cp));
    } else if (cp > 1 && cfg->dataset.seq_length % (2 * cp)) {
        verr(v, "dataset.seq_length", "%lld is not divisible by 2 x cp_size = %lld: "
             "load-balanced causal sharding cuts each row into 2 x cp chunks",
             (long long)cfg->dataset.seq_length, (long long)(2 * cp));
    }
    if (d->sequence_parallel) {
        int64_t s = cfg->derived.seq_len;
        const char *what = packed > 0 ? "packed_sequence_size" : "seq_length";
        if (tp == 1)
            verr(v, "distributed.sequence_parallel", "needs tp_size > 1 (sequence parallelism "
                 "splits the sequence over the TP ranks)");
        else if ((s / cp) % tp || s % cp)
            verr(v, "distributed.sequence_parallel", "the sequence (%s %lld, %lld per CP rank) "
                 "is not divisible by tp_size %lld", what, (long long)s, (long long)(s / cp),
                 (long long)tp);
    } else if (tp > 1 && cfg->model.num_experts > 0) {
        /* each TP rank routes its share of a micro-batch's tokens (model_moe.h) */
        int64_t rows = d->pp_size > 1 ? d->pipeline.pp_microbatch_size
                                      : cfg->step_scheduler.local_batch_size;
        int64_t n = rows * (cfg->derived.seq_len / cp);
        if (n % tp)
            verr(v, "distributed.tp_size", "MoE layers with tensor parallelism route N / tp_size "
                 "tokens on each TP rank: the %lld tokens of a micro-batch (%lld rows of %lld "
                 "per CP rank) do not split over tp_size %lld", (long long)n, (long long)rows,
                 (long long)(cfg->derived.seq_len / cp), (long long)tp);
    }
}

/* ---- datasets: one spelling each, and well-formed blends ---- */
static void check_paths(vctx_t *v, const char *key, const char (*items)[MT_PATH_MAX], int n,
                        const char *single_key, const char *single)
{
    if (n == 0) /* an empty list is no list: a resolved config prints one */
        return;
    if (single[0])
        verr(v, key, "is set together with %s: give one of them", single_key);
    mt_blend_spec_t spec;
    char why[MT_PATH_MAX + 200];
    int bad = mt_blend_spec_parse(items, n, &spec, why, sizeof why);
    if (bad >= n)
        verr(v, key, "%s", why);
    else if (bad >= 0)
        verr(v, key, "item %d: %s", bad, why);
}

static void check_dataset(vctx_t *v)
{
    const mt_dataset_config_t *d = &v->cfg->dataset;
    check_paths(v, "dataset.paths", (const char (*)[MT_PATH_MAX])d->paths, d->npaths,
                "dataset.path", d->path);
    check_paths(v, "dataset.validation_paths", (const char (*)[MT_PATH_MAX])d->validation_paths,
                d->nvalidation_paths, "dataset.validation_path", d->validation_path);
}

/* ---- tensor parallel and batch ---- */
static void check_tp_batch(vctx_t *v)
{
    mt_config_t *cfg = v->cfg;
    const mt_model_config_t *m = &cfg->model;
    int64_t tp = cfg->distributed.tp_size;
    struct { const char *path; int64_t val; bool on; } need[] = {
        {"model.num_attention_heads", m->num_attention_heads, true},
        {"model.num_key_value_heads", m->num_key_value_heads.value, true},
        {"model.intermediate_size", m->intermediate_size, true},
    };
    char note[MT_PATH_MAX + 400];
    from(v, "distributed.tp_size", note, sizeof note);
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (need[i].on && need[i].val % tp)
            verr(v, need[i].path, "%lld is not divisible by tp_size %lld%s", (long long)need[i].val,
                 (long long)tp, note);
    cfg->derived.padded_vocab = (m->vocab_size + tp - 1) / tp * tp;
    cfg->derived.head_dim = m->head_dim.set ? m->head_dim.value
                                            : m->hidden_size / m->num_attention_heads;

    int64_t dp = cfg->derived.dp_size, g = cfg->step_scheduler.global_batch_size;
    int64_t l = cfg->step_scheduler.local_batch_size;
    cfg->derived.grad_accum_steps = 0;
    if (dp > 0) {
        if (g % (l * dp))
            verr(v, "step_scheduler.global_batch_size", "%lld is not divisible by "
                 "local_batch_size x dp_size = %lld x %lld = %lld", (long long)g, (long long)l,
                 (long long)dp, (long long)(l * dp));
        else
            cfg->derived.grad_accum_steps = g / (l * dp);
    }
}

/* ---- topology: a TP group must not span nodes ---- */
static void check_topology(vctx_t *v, const int *node_of_rank)
{
    mt_derived_t *dv = &v->cfg->derived;
    int64_t world = dv->world_size, tp = v->cfg->distributed.tp_size;
    dv->num_nodes = 1, dv->ranks_per_node = world;
    if (!node_of_rank)
        return;
    /* Node ids are in [0, world): count ranks per node in one pass. */
    int64_t *count = calloc((size_t)world, sizeof *count);
    int64_t min_count = world, nodes = 0;
    if (!count)
        return; /* the rule cannot run; the allocation failure shows up later */
    for (int64_t r = 0; r < world; r++)
        if (node_of_rank[r] >= 0 && node_of_rank[r] < world)
            count[node_of_rank[r]]++;
    for (int64_t n = 0; n < world; n++)
        if (count[n] > 0) {
            nodes++;
            if (count[n] < min_count)
                min_count = count[n];
        }
    free(count);
    dv->num_nodes = nodes, dv->ranks_per_node = min_count;
    if (tp <= 1 || world % tp)
        return;
    /* tp is the innermost mesh axis: TP groups are runs of tp consecutive ranks. */
    for (int64_t g = 0; g < world; g += tp)
        for (int64_t r = g + 1; r < g + tp; r++)
            if (node_of_rank[r] != node_of_rank[g]) {
                verr(v, "distributed.tp_size", "the TP group of ranks %lld-%lld spans two nodes "
                     "(rank %lld and rank %lld are on different nodes; %lld ranks on the smallest "
                     "node): tp_size must divide the ranks per node so TP stays inside one node",
                     (long long)g, (long long)(g + tp - 1), (long long)g, (long long)r,
                     (long long)min_count);
                return;
            }
}

/* Training samples decode on rank 0 with its copy of the model
 * (mt_decode.h): it must be whole there, every expert too, on the CPU,
 * and the run must have a tokenizer.  Gathering a sharded model for them is not
 * done: refused here, before training. */
static void check_samples(vctx_t *v)
{
    const mt_config_t *c = v->cfg;
    const char *k = "logging.sample_every_steps";
    if (c->logging.sample_every_steps <= 0)
        return;
    /* the parameters FSDP shards (mt_fsdp_options_from_config): fsdp2 over
     * dp_shard x cp, megatron_fsdp under zero 3 over dp x cp */
    const mt_distributed_config_t *d = &c->distributed;
    const bool fsdp = (d->strategy == MT_STRATEGY_FSDP2 && c->derived.dp_shard * d->cp_size > 1) ||
                      (d->strategy == MT_STRATEGY_MEGATRON_FSDP && d->zero_dp_strategy >= 3 &&
                       c->derived.dp_size * d->cp_size > 1);
    if (c->distributed.tp_size > 1 || c->distributed.pp_size > 1 || fsdp)
        verr(v, k, "samples need the whole model on rank 0; with tp_size %lld, pp_size %lld, "
             "dp_shard %lld, cp_size %lld and strategy %s it is sharded (use strategy: ddp, "
             "megatron_fsdp below zero 3, or meshtrain-generate on a checkpoint)", (long long)c->distributed.tp_size,
             (long long)c->distributed.pp_size, (long long)c->derived.dp_shard,
             (long long)c->distributed.cp_size, mt_strategy_name(c->distributed.strategy));
    if (c->distributed.ep_size > 1)
        verr(v, k, "samples need every expert on rank 0; ep_size %lld shards them",
             (long long)c->distributed.ep_size);
    if (c->distributed.device != MT_DEVICE_CPU)
        verr(v, k, "samples run on the CPU backend only (distributed.device is %s)",
             mt_device_name(c->distributed.device));
    if (!c->model.pretrained_model_name_or_path[0] && c->model.vocab_size < 258)
        verr(v, k, "no tokenizer for the samples: model.vocab_size %lld is below the byte "
             "tokenizer's 258 and no model.pretrained_model_name_or_path names a "
             "tokenizer.json", (long long)c->model.vocab_size);
}

static void warnings(const mt_config_t *cfg, FILE *warn)
{
    if (!warn)
        return;
    char loc[MT_PATH_MAX + 300];
    int si;
    const mt_automodel_t *am = &cfg->automodel;
    if (am->ignored[0])
        fprintf(warn, "%s: ignored (AutoModel keys that cannot change the numerics): %s\n",
                cfg->source_file, am->ignored);
    if (am->data_refusal[0])
        fprintf(warn, "note: %s: the plan does not depend on the data, but training refuses "
                "it: %s\n", cfg->source_file, am->data_refusal);
    if (am->max_steps_null)
        fprintf(warn, "note: %s: step_scheduler.max_steps is null: the trainer derives the "
                "step count from num_epochs and the data; the plan uses max_steps %lld\n",
                cfg->source_file, (long long)cfg->step_scheduler.max_steps);
    if (section_present(cfg, "distributed.moe") && cfg->distributed.ep_size == 1) {
        si = mt_cfg_section_index("distributed.moe");
        mt_diag_location(cfg, &cfg->section_origin[si], loc, sizeof loc);
        fprintf(warn, "warning: %sdistributed.moe: ignored because ep_size is 1, except "
                "ignore_router_for_ac\n", loc);
    }
    if (section_present(cfg, "distributed.pipeline") && cfg->distributed.pp_size == 1) {
        si = mt_cfg_section_index("distributed.pipeline");
        mt_diag_location(cfg, &cfg->section_origin[si], loc, sizeof loc);
        fprintf(warn, "warning: %sdistributed.pipeline: ignored because pp_size is 1\n", loc);
    }
}

mt_status_t mt_config_validate(mt_config_t *cfg, mt_app_kind_t app, int64_t world_size,
                               const int *node_of_rank, FILE *warn)
{
    vctx_t v;
    memset(&v, 0, sizeof v);
    v.cfg = cfg;
    cfg->validated = false;
    memset(&cfg->derived, 0, sizeof cfg->derived);
    if (world_size < 1)
        MT_FAIL(MT_ERR_RANGE, "world size must be positive, got %lld", (long long)world_size);

    check_ranges(&v);
    if (v.diag.count) /* the rules below divide by these */
        return mt_diag_finish(&v.diag, __FILE__, __LINE__);
    check_model(&v, app);
    check_sizes(&v, world_size);
    check_pipeline(&v);
    check_sequence(&v);
    check_dataset(&v);
    check_tp_batch(&v);
    check_topology(&v, node_of_rank);
    check_samples(&v);
    mt_peft_validate(cfg, &v.diag);
    if (v.diag.count)
        return mt_diag_finish(&v.diag, __FILE__, __LINE__);
    warnings(cfg, warn);
    cfg->validated = true;
    return MT_OK;
}
