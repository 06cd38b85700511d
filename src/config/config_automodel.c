/* config_automodel.c: NeMo AutoModel's recipe keys that are not
 * meshtrain's own, each mapped onto meshtrain's keys with AutoModel's
 * meaning, accepted with an "ignored" note when it cannot change the
 * numerics, or refused with one message that says what it would need.
 *
 * A recipe that cannot run at all (a vision-language model, a diffusion
 * recipe, FP8, ...) is refused with that one reason before any key is
 * looked at.  Keys that are neither AutoModel's nor meshtrain's still fail
 * with "did you mean".  The rules are doc/automodel-recipes.md.  Datasets
 * built by Python code are not converted here: the trainer refuses them
 * (meshtrain-plan only notes them, since they do not change the plan). */
#include "config_yaml_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef void (*am_fn_t)(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                        const char *arg);

typedef enum {
    AM_SECTION, /* a section of AutoModel's only: its keys have rules */
    AM_IGNORE,  /* accepted; cannot change the numerics; noted once */
    AM_USED,    /* read elsewhere (the recipe and model classes): not noted */
    AM_REFUSE,  /* refused with arg as the message */
    AM_RENAME,  /* the meshtrain key arg, same type and meaning */
    AM_FN       /* a conversion */
} am_kind_t;

typedef struct {
    const char *path;
    am_kind_t kind;
    const char *arg;
    am_fn_t fn;
} am_rule_t;

#define CONVERT_DATA                                                                    \
    "convert the data with meshtrain-data (doc/data.md) and set dataset.path to the "  \
    "token file"

/* ---- conversions ---- */

static void fn_dp_size(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path, const char *arg)
{
    (void)arg; /* 0 and null both mean "the rest of the world" */
    if (mt_cfg_null_scalar(vn) || strcmp(mt_cfg_scalar(vn), "0") == 0)
        mt_am_set_key(c, path, "none", vn);
    else
        mt_cfg_set_node(c, mt_cfg_key_index(path), vn);
}

static void fn_dp_replicate(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                            const char *arg)
{
    (void)arg; /* 1: no HSDP, with any strategy */
    if (mt_cfg_null_scalar(vn) || strcmp(mt_cfg_scalar(vn), "1") == 0)
        mt_am_set_key(c, path, "none", vn);
    else
        mt_cfg_set_node(c, mt_cfg_key_index(path), vn);
}

static void fn_timeout(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path, const char *arg)
{
    (void)arg;
    char *end;
    const char *s = mt_cfg_scalar(vn);
    double v = strtod(s, &end);
    if (mt_cfg_null_scalar(vn))
        return;
    if (!s[0] || *end || !(v > 0) || v > 1e7) {
        mt_cfg_perr(c, vn, "%s: expected a positive number of minutes, got '%s'", path, s);
        return;
    }
    char text[32];
    snprintf(text, sizeof text, "%lld", (long long)llround(v * 60));
    mt_am_set_key(c, "distributed.timeout_s", text, vn);
}

static void fn_max_steps(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path, const char *arg)
{
    (void)arg;
    if (mt_cfg_null_scalar(vn))
        c->cfg->automodel.max_steps_null = true;
    else
        mt_cfg_set_node(c, mt_cfg_key_index(path), vn);
}

static void fn_num_epochs(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                          const char *arg)
{
    (void)arg;
    int64_t v = strtoll(mt_cfg_scalar(vn), NULL, 10);
    if (mt_cfg_null_scalar(vn))
        return;
    if (v < 1) {
        mt_cfg_perr(c, vn, "%s: expected a positive integer, got '%s'", path, mt_cfg_scalar(vn));
        return;
    }
    c->cfg->automodel.num_epochs = v;
}

static void fn_restore(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path, const char *arg)
{
    (void)path, (void)arg;
    if (!mt_cfg_null_scalar(vn))
        mt_cfg_set_node(c, mt_cfg_key_index("checkpoint.resume"), vn);
}

static void fn_reshard(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path, const char *arg)
{
    (void)arg;
    /* null: AutoModel reshards every layer but the last, which only saves
     * one all-gather; the numerics are those of true */
    if (mt_cfg_null_scalar(vn))
        mt_am_note_ignored(c->cfg, "distributed.reshard_after_forward: null (as true)");
    else
        mt_cfg_set_node(c, mt_cfg_key_index(path), vn);
}

static void fn_ac(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path, const char *arg)
{
    (void)arg;
    const char *s = mt_cfg_scalar(vn);
    if (mt_cfg_null_scalar(vn))
        return;
    if (strcasecmp(s, "full") == 0)
        mt_am_set_key(c, "distributed.activation_checkpointing", "true", vn);
    else if (strcasecmp(s, "selective") == 0)
        mt_cfg_perr(c, vn, "%s: selective is not supported (it would need per-op recompute "
                    "inside a layer); use full or true", path);
    else
        mt_cfg_set_node(c, mt_cfg_key_index("distributed.activation_checkpointing"), vn);
}

static void fn_strategy_target(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                               const char *arg)
{
    (void)arg;
    const char *leaf = mt_am_class_leaf(mt_cfg_scalar(vn));
    const char *s = NULL;
    if (strcmp(leaf, "FSDP2Config") == 0 || strcmp(leaf, "FSDP2Manager") == 0)
        s = "fsdp2";
    else if (strcmp(leaf, "MegatronFSDPConfig") == 0 || strcmp(leaf, "MegatronFSDPManager") == 0)
        s = "megatron_fsdp";
    else if (strcmp(leaf, "DDPConfig") == 0 || strcmp(leaf, "DDPManager") == 0)
        s = "ddp";
    if (!s)
        mt_cfg_perr(c, vn, "%s: %s: expected FSDP2Config, MegatronFSDPConfig or DDPConfig", path,
                    mt_cfg_scalar(vn));
    else if (!mt_am_key_given(c->cfg, "distributed.strategy"))
        mt_am_set_key(c, "distributed.strategy", s, vn);
}

static void fn_schedule(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path, const char *arg)
{
    (void)arg;
    const char *s = mt_cfg_scalar(vn);
    if (strcasecmp(s, "InterleavedZeroBubble") == 0 || strcasecmp(s, "DualPipeV") == 0)
        mt_cfg_perr(c, vn, "%s: torch's %s is not implemented; the zero-bubble schedules are "
                    "zero_bubble (ZB-H1) and v_schedule (ZBVZeroBubble)", path, s);
    else
        mt_cfg_set_node(c, mt_cfg_key_index(path), vn);
}

static void fn_torch_dtype(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                           const char *arg)
{
    (void)arg;
    const char *s = mt_cfg_scalar(vn);
    if (mt_cfg_null_scalar(vn) || strcasecmp(s, "auto") == 0)
        return;
    /* the dtype weights are loaded in; FSDP2's mp_policy decides the
     * compute dtype and meshtrain keeps fp32 master weights either way */
    if (strstr(s, "bfloat16") || strstr(s, "float32") || strcmp(s, "bf16") == 0 ||
        strcmp(s, "fp32") == 0)
        mt_am_note_ignored(c->cfg, "model.torch_dtype (weights load in fp32 master copies)");
    else
        mt_cfg_perr(c, vn, "%s: %s is not supported (bfloat16 or float32)", path, s);
}

static void fn_optimizer(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                         const char *arg)
{
    (void)arg;
    const char *full = mt_cfg_scalar(vn), *leaf = mt_am_class_leaf(full);
    mt_automodel_t *am = &c->cfg->automodel;
    if (strcmp(full, "torch.optim.AdamW") == 0 || strcmp(leaf, "FlashAdamW") == 0)
        am->optimizer = MT_AM_OPT_ADAMW;
    else if (strcmp(full, "torch.optim.Adam") == 0)
        am->optimizer = MT_AM_OPT_ADAM;
    else if (strcmp(leaf, "FusedAdam") == 0)
        am->optimizer = MT_AM_OPT_FUSED_ADAM;
    else
        mt_cfg_perr(c, vn, "%s: %s is not supported: meshtrain's optimizer is AdamW "
                    "(torch.optim.AdamW, torch.optim.Adam without weight decay, TE FusedAdam)",
                    path, full);
}

static void fn_adam_w_mode(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                           const char *arg)
{
    (void)path, (void)arg;
    c->cfg->automodel.adam_l2 = !mt_cfg_null_scalar(vn) && !mt_am_truthy(vn);
}

static void fn_must_be_true(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                            const char *arg)
{
    if (mt_cfg_null_scalar(vn) || mt_am_truthy(vn))
        mt_am_note_ignored(c->cfg, path);
    else
        mt_cfg_perr(c, vn, "%s: false is not supported: %s", path, arg);
}

static void fn_must_be_null(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                            const char *arg)
{
    if (mt_cfg_null_scalar(vn))
        mt_am_note_ignored(c->cfg, path);
    else
        mt_cfg_perr(c, vn, "%s: is not supported: %s", path, arg);
}

/* fp32 optimizer state (TE FusedAdam's exp_avg_dtype, master_weight_dtype) */
static void fn_fp32_only(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                         const char *arg)
{
    (void)arg;
    const char *s = mt_cfg_scalar(vn);
    if (mt_cfg_null_scalar(vn) || strstr(s, "float32") || strcmp(s, "fp32") == 0 ||
        strcmp(s, "32") == 0)
        mt_am_note_ignored(c->cfg, path);
    else
        mt_cfg_perr(c, vn, "%s: %s optimizer state is not supported: meshtrain keeps AdamW's "
                    "moments and master weights in float32", path, s);
}

static void fn_decay_style(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                           const char *arg)
{
    (void)arg;
    const char *s = mt_cfg_scalar(vn);
    if (strcasecmp(s, "WSD") == 0 || strcasecmp(s, "inverse-square-root") == 0)
        mt_cfg_perr(c, vn, "%s: %s is not implemented (cosine, linear or constant)", path, s);
    else
        mt_cfg_set_node(c, mt_cfg_key_index(path), vn);
}

static void fn_lr_opt(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path, const char *arg)
{
    (void)path; /* a value or null (AutoModel's derived default) */
    if (!mt_cfg_null_scalar(vn))
        mt_cfg_set_node(c, mt_cfg_key_index(arg), vn);
}

static void fn_model_backend(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                             const char *arg)
{
    (void)arg; /* kernel choices, except those that change the routing or precision */
    if (mt_am_truthy(mt_cfg_map_get(c, vn, "fake_balanced_gate")))
        mt_cfg_perr(c, vn, "%s.fake_balanced_gate: true (uniform routing for benchmarks) is "
                    "not supported", path);
    else if (mt_cfg_map_get(c, vn, "te_fp8") && !mt_cfg_null_scalar(mt_cfg_map_get(c, vn, "te_fp8")))
        mt_cfg_perr(c, vn, "%s.te_fp8: FP8 training is not supported", path);
    else
        mt_am_note_ignored(c->cfg, "model.backend");
}

static void fn_loss(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path, const char *arg)
{
    (void)arg;
    const yaml_node_t *t = vn && vn->type == YAML_MAPPING_NODE ? mt_cfg_map_get(c, vn, "_target_")
                                                               : vn;
    const char *leaf = mt_am_class_leaf(mt_cfg_scalar(t));
    if (mt_cfg_null_scalar(vn) || strcmp(leaf, "MaskedCrossEntropy") == 0 ||
        strcmp(leaf, "FusedLinearCrossEntropy") == 0 || strcmp(leaf, "TEParallelCrossEntropy") == 0 ||
        strcmp(leaf, "ChunkedCrossEntropy") == 0)
        mt_am_note_ignored(c->cfg, "loss_fn (meshtrain's cross-entropy is the same mean over tokens)");
    else
        mt_cfg_perr(c, t, "%s: %s is not supported: meshtrain's loss is next-token "
                    "cross-entropy", path, mt_cfg_scalar(t));
}

/* dataloader / validation_dataloader: shuffle maps, the rest is plumbing */
static void fn_dataloader(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                          const char *arg)
{
    (void)arg;
    const yaml_node_t *sh = mt_cfg_map_get(c, vn, "shuffle");
    if (sh && strcmp(path, "dataloader") == 0 && !mt_cfg_null_scalar(sh))
        mt_cfg_set_node(c, mt_cfg_key_index("dataset.shuffle"), sh);
    mt_am_note_ignored(c->cfg, strcmp(path, "dataloader") == 0 ? "dataloader (but shuffle)" : path);
}

/* `meshtrain:`: the keys AutoModel does not have, by their full path, as
 * the resolved config writes them (config_emit.c) */
static void fn_meshtrain(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                         const char *arg)
{
    (void)arg;
    if (mt_cfg_null_scalar(vn))
        return;
    if (vn->type != YAML_MAPPING_NODE) {
        mt_cfg_perr(c, vn, "%s: expected a mapping of meshtrain keys by full path", path);
        return;
    }
    for (yaml_node_pair_t *p = vn->data.mapping.pairs.start; p < vn->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(c->doc, p->key);
        const char *key = mt_cfg_scalar(kn);
        int ki = mt_cfg_key_index(key);
        if (ki >= 0) {
            mt_cfg_set_node(c, ki, yaml_document_get_node(c->doc, p->value));
            continue;
        }
        const char *names[MT_CFG_MAX_KEYS];
        for (int i = 0; i < mt_cfg_nkeys; i++)
            names[i] = mt_cfg_keys[i].path;
        const char *best = mt_closest_name(key, names, mt_cfg_nkeys);
        if (best)
            mt_cfg_perr(c, kn, "%s.%s: unknown meshtrain key; did you mean %s?", path, key, best);
        else
            mt_cfg_perr(c, kn, "%s.%s: unknown meshtrain key", path, key);
    }
}

/* top-level autocast (a bf16 forward): meshtrain's mp_policy param_dtype */
static void fn_autocast(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                        const char *arg)
{
    (void)arg;
    const yaml_node_t *en = mt_cfg_map_get(c, vn, "enabled"), *dt = mt_cfg_map_get(c, vn, "dtype");
    if (mt_cfg_null_scalar(vn) || !mt_am_truthy(en)) {
        mt_am_note_ignored(c->cfg, path);
        return;
    }
    if (!dt || mt_cfg_null_scalar(dt) || strstr(mt_cfg_scalar(dt), "bfloat16"))
        mt_am_set_key(c, "distributed.mp_policy.param_dtype", "bfloat16", vn);
    else
        mt_cfg_perr(c, dt, "%s.dtype: %s is not supported (bfloat16)", path, mt_cfg_scalar(dt));
}

static void fn_moe_lm_head(mt_parse_ctx_t *c, const yaml_node_t *vn, const char *path,
                           const char *arg)
{
    (void)arg;
    if (mt_cfg_null_scalar(vn))
        return;
    const char *s = mt_cfg_scalar(vn);
    if (strstr(s, "float32") || strcmp(s, "fp32") == 0)
        mt_am_set_key(c, "distributed.mp_policy.output_dtype", "float32", vn);
    else
        mt_cfg_perr(c, vn, "%s: %s is not supported (float32 or null)", path, s);
}

/* ---- the table: every AutoModel key that is not meshtrain's own ---- */

/* dataset / validation_dataset: a plain token file maps; a Python
 * builder is noted, and the trainer refuses it (the plan does not depend
 * on it).  Returns through *handled whether the section was consumed. */


#define IGN(p) {p, AM_IGNORE, NULL, NULL}
#define USED(p) {p, AM_USED, NULL, NULL}
#define SEC(p) {p, AM_SECTION, NULL, NULL}
#define REF(p, m) {p, AM_REFUSE, m, NULL}
#define REN(p, t) {p, AM_RENAME, t, NULL}
#define FN(p, f, a) {p, AM_FN, a, f}

static const am_rule_t am_rules[] = {
    /* top level */
    USED("recipe"), /* its class: mt_am_first_reason */
    FN("dataset", mt_am_fn_dataset, "dataset"), FN("validation_dataset", mt_am_fn_dataset, "validation"),
    REN("seed", "rng.seed"),
    IGN("ci"), IGN("wandb"), IGN("mlflow"), IGN("comet"), IGN("tensorboard"), IGN("compile"),
    IGN("benchmark"), IGN("nvtx"), IGN("moe_metrics"), IGN("skypilot"), IGN("slurm"),
    IGN("performance"), IGN("prewarm"), IGN("tool_call_eval"),
    FN("autocast", fn_autocast, NULL), FN("meshtrain", fn_meshtrain, NULL),
    REF("neftune", "NEFTune (noise on the embeddings) is not supported"),
    FN("loss_fn", fn_loss, NULL),
    FN("dataloader", fn_dataloader, NULL), FN("validation_dataloader", fn_dataloader, NULL),
    SEC("dist_env"), IGN("dist_env.backend"), IGN("dist_env.init_method"),
    FN("dist_env.timeout_minutes", fn_timeout, NULL),
    SEC("clip_grad_norm"), REN("clip_grad_norm.max_norm", "optimizer.max_grad_norm"),
    REF("fp8", "FP8 training is not supported"),
    REF("quantization", "quantized training is not supported"),
    REF("qat", "quantization-aware training is not supported"),
    REF("freeze_config", "freezing parts of the model is not supported (meshtrain trains every "
                         "parameter)"),
    REF("teacher_model", "knowledge distillation is not supported"),
    REF("kd_loss_fn", "knowledge distillation is not supported"),
    REF("kd_ratio", "knowledge distillation is not supported"),
    REF("processor", "multimodal processors are not supported (vision-language models)"),
    REF("tokenizer", CONVERT_DATA " (tokenize it there)"),
    REF("autopipeline", "write the pipeline as distributed.pipeline"),
    REF("parallelizer", "custom parallelizers are not supported; use distributed:"),
    REF("fsdp", "the old fsdp: section is not supported; use distributed:"),
    /* rng */
    IGN("rng._target_"), IGN("rng.ranked"), IGN("rng.deterministic"),
    /* step_scheduler */
    FN("step_scheduler.max_steps", fn_max_steps, NULL),
    FN("step_scheduler.num_epochs", fn_num_epochs, NULL),
    IGN("step_scheduler.gc_every_steps"), IGN("step_scheduler.log_remote_every_steps"),
    IGN("step_scheduler.loss_average_window_steps"),
    IGN("step_scheduler.save_checkpoint_every_epoch"),
    FN("step_scheduler.ckpt_every_steps", fn_lr_opt, "step_scheduler.ckpt_every_steps"),
    FN("step_scheduler.val_every_steps", fn_lr_opt, "step_scheduler.val_every_steps"),
    /* model */
    USED("model._target_"), /* checked by mt_am_first_reason */
    FN("model.torch_dtype", fn_torch_dtype, NULL), FN("model.dtype", fn_torch_dtype, NULL),
    IGN("model.trust_remote_code"), IGN("model.attn_implementation"),
    IGN("model.attention_backend"), IGN("model.use_liger_kernel"), IGN("model.use_sdpa_patching"),
    IGN("model.force_hf"), IGN("model.cache_dir"), IGN("model.output_hidden_states"),
    IGN("model.text_config"), IGN("model.fuse_qkv_projections"),
    FN("model.backend", fn_model_backend, NULL),
    FN("model.load_base_model", fn_must_be_true,
       "for random weights of a named architecture write model.config: "
       "{pretrained_model_name_or_path: NAME} (AutoModel's from_config)"),
    REF("model.checkpoint", "loading weights from a checkpoint file is not supported; name a "
                            "Hugging Face model in pretrained_model_name_or_path"),
    REF("model.transformer_engine_fp8", "FP8 training is not supported"),
    REF("model.mtp_loss_scaling_factor", "multi-token prediction is not supported"),
    REF("model.num_nextn_predict_layers", "multi-token prediction is not supported"),
    REF("model.freeze_router", "freezing parts of the model is not supported"),
    /* distributed */
    FN("distributed._target_", fn_strategy_target, NULL),
    FN("distributed.dp_size", fn_dp_size, NULL),
    FN("distributed.dp_replicate_size", fn_dp_replicate, NULL),
    FN("distributed.activation_checkpointing", fn_ac, NULL),
    FN("distributed.reshard_after_forward", fn_reshard, NULL),
    REN("distributed.bucket_cap_mb", "distributed.ddp_bucket_cap_mb"),
    IGN("distributed.enable_async_tensor_parallel"), IGN("distributed.enable_compile"),
    IGN("distributed.enable_fsdp2_prefetch"), IGN("distributed.fsdp2_backward_prefetch_depth"),
    IGN("distributed.fsdp2_forward_prefetch_depth"), IGN("distributed.patch_is_packed_sequence"),
    IGN("distributed.find_unused_parameters"), IGN("distributed.static_graph"),
    IGN("distributed.gradient_as_bucket_view"), IGN("distributed.offload_policy"),
    FN("distributed.autocast_dtype", fn_must_be_null, "autocast (set mp_policy instead)"),
    REF("distributed.multimodal", "vision-language models are not supported"),
    FN("distributed.moe.lm_head_precision", fn_moe_lm_head, NULL),
    IGN("distributed.mp_policy._target_"), IGN("distributed.mp_policy.cast_forward_inputs"),
    FN("distributed.pipeline.pp_schedule", fn_schedule, NULL),
    IGN("distributed.pipeline.patch_causal_lm_model"), IGN("distributed.pipeline.patch_inner_model"),
    IGN("distributed.pipeline.dtype"), IGN("distributed.pipeline.pp_seq_len"),
    IGN("distributed.pipeline._target_"),
    FN("distributed.pipeline.round_virtual_stages_to_pp_multiple", fn_lr_opt,
       "distributed.pipeline.round_virtual_stages_to_pp_multiple"),
    FN("distributed.pipeline.layers_per_stage", fn_lr_opt, "distributed.pipeline.layers_per_stage"),
    /* checkpoint */
    FN("checkpoint.restore_from", fn_restore, NULL),
    /* a no-op on bf16/fp32 weights; the loader refuses quantized ones by name */
    IGN("checkpoint.dequantize_base_checkpoint"),
    REF("checkpoint.diffusers_compatible", "diffusion models are not supported"),
    IGN("checkpoint.v4_compatible"), IGN("checkpoint.skip_task_head_prefixes_for_base_model"),
    /* optimizer */
    FN("optimizer._target_", fn_optimizer, NULL),
    IGN("optimizer.foreach"), IGN("optimizer.fused"), IGN("optimizer.compress_state_dict"),
    FN("optimizer.adam_w_mode", fn_adam_w_mode, NULL),
    FN("optimizer.bias_correction", fn_must_be_true, "Adam without bias correction"),
    FN("optimizer.master_weights", fn_must_be_true,
       "meshtrain always keeps float32 master weights"),
    FN("optimizer.exp_avg_dtype", fn_fp32_only, NULL),
    FN("optimizer.exp_avg_sq_dtype", fn_fp32_only, NULL),
    FN("optimizer.master_weight_dtype", fn_fp32_only, NULL),
    /* bf16 weights plus their 16 low bits are exactly the float32 master copy */
    IGN("optimizer.store_param_remainders"),
    FN("optimizer.master_weight_bits", fn_fp32_only, NULL),
    REF("optimizer.min_lr_ratio", "a schedule inside the optimizer; write it as lr_scheduler:"),
    REF("optimizer.warmup_ratio", "a schedule inside the optimizer; write it as lr_scheduler:"),
    /* lr_scheduler */
    FN("lr_scheduler.lr_decay_style", fn_decay_style, NULL),
    FN("lr_scheduler.lr_warmup_steps", fn_lr_opt, "lr_scheduler.lr_warmup_steps"),
    FN("lr_scheduler.min_lr", fn_lr_opt, "lr_scheduler.min_lr"),
    FN("lr_scheduler.init_lr", fn_lr_opt, "lr_scheduler.init_lr"),
    FN("lr_scheduler.max_lr", fn_lr_opt, "optimizer.lr"),
    FN("lr_scheduler.lr_decay_steps", fn_lr_opt, "lr_scheduler.lr_decay_steps"),
    FN("lr_scheduler.start_wd", fn_must_be_null, "a weight-decay schedule"),
    FN("lr_scheduler.end_wd", fn_must_be_null, "a weight-decay schedule"),
    FN("lr_scheduler.wd_incr_steps", fn_must_be_null, "a weight-decay schedule"),
    IGN("lr_scheduler.wd_incr_style"), IGN("lr_scheduler.use_checkpoint_opt_param_scheduler"),
    IGN("lr_scheduler.override_opt_param_scheduler"),
    REF("lr_scheduler.wsd_decay_steps", "the WSD schedule is not implemented"),
    REF("lr_scheduler.lr_wsd_decay_style", "the WSD schedule is not implemented"),
    /* packed_sequence: the packing itself is meshtrain-data's */
    IGN("packed_sequence.split_across_pack"), IGN("packed_sequence.max_packs"),
    IGN("packed_sequence.drop_long_samples"), IGN("packed_sequence.packing_ratio"),
    IGN("packed_sequence.packing_strategy"), IGN("packed_sequence.num_proc"),
};
static const int am_nrules = (int)(sizeof am_rules / sizeof am_rules[0]);

/* ---- lookup ---- */

static const am_rule_t *rule_of(const char *path)
{
    for (int i = 0; i < am_nrules; i++)
        if (strcmp(am_rules[i].path, path) == 0)
            return &am_rules[i];
    return NULL;
}

int mt_am_child_names(const char *prefix, const char **names, int cap)
{
    size_t pl = strlen(prefix);
    int n = 0;
    for (int i = 0; i < am_nrules && n < cap; i++) {
        const char *p = am_rules[i].path, *rest;
        if (pl == 0)
            rest = p;
        else if (strncmp(p, prefix, pl) == 0 && p[pl] == '.')
            rest = p + pl + 1;
        else
            continue;
        if (!strchr(rest, '.'))
            names[n++] = rest;
    }
    return n;
}

static void walk_am_section(mt_parse_ctx_t *c, const yaml_node_t *map, const char *prefix);

static void apply(mt_parse_ctx_t *c, const am_rule_t *r, const yaml_node_t *vn, const char *path)
{
    switch (r->kind) {
    case AM_SECTION:
        if (mt_cfg_null_scalar(vn))
            return;
        if (vn->type != YAML_MAPPING_NODE) {
            mt_cfg_perr(c, vn, "%s: expected a mapping (a section)", path);
            return;
        }
        walk_am_section(c, vn, path);
        return;
    case AM_IGNORE: mt_am_note_ignored(c->cfg, path); return;
    case AM_USED: return;
    case AM_REFUSE: mt_cfg_perr(c, vn, "%s: %s", path, r->arg); return;
    case AM_RENAME:
        if (!mt_cfg_null_scalar(vn))
            mt_cfg_set_node(c, mt_cfg_key_index(r->arg), vn);
        return;
    case AM_FN: r->fn(c, vn, path, r->arg); return;
    }
}

static void walk_am_section(mt_parse_ctx_t *c, const yaml_node_t *map, const char *prefix)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *kn = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(c->doc, p->value);
        char path[MT_PATH_MAX];
        snprintf(path, sizeof path, "%s.%s", prefix, mt_cfg_scalar(kn));
        if (mt_am_handle(c, kn, vn, path))
            continue;
        const char *names[64];
        int n = mt_am_child_names(prefix, names, 64);
        const char *best = mt_closest_name(mt_cfg_scalar(kn), names, n);
        if (best)
            mt_cfg_perr(c, kn, "%s: unknown key; did you mean %s?", path, best);
        else
            mt_cfg_perr(c, kn, "%s: unknown key in AutoModel's section '%s'", path, prefix);
    }
}

bool mt_am_handle(mt_parse_ctx_t *c, const yaml_node_t *kn, const yaml_node_t *vn,
                  const char *path)
{
    const am_rule_t *r = rule_of(path);
    if (strcmp(path, "dataset") == 0 && !mt_cfg_map_get(c, vn, "_target_"))
        return false; /* meshtrain's own dataset section */
    if (!r) {
        /* AutoModel writes null for "the default" of any size */
        int ki = mt_cfg_key_index(path);
        if (ki >= 0 && strncmp(path, "distributed.", 12) == 0 && mt_cfg_null_scalar(vn) &&
            mt_cfg_keys[ki].type != MT_T_OPT_INT) {
            mt_am_note_ignored(c->cfg, path);
            return true;
        }
        return false;
    }
    (void)kn;
    apply(c, r, vn, path);
    return true;
}

/* ---- recipes ---- */

bool mt_am_is_recipe(mt_parse_ctx_t *c, const yaml_node_t *root)
{
    return mt_cfg_map_get(c, root, "recipe") != NULL;
}

/* AutoModel's defaults where they differ from meshtrain's
 * (doc/automodel-recipes.md). */
void mt_am_recipe_defaults(mt_config_t *cfg)
{
    cfg->automodel.recipe = true;
    cfg->checkpoint.enabled = true;
    cfg->distributed.mp_policy.param_dtype = MT_DTYPE_BFLOAT16;
    cfg->distributed.mp_policy.reduce_dtype = MT_DTYPE_FLOAT32;
    cfg->distributed.mp_policy.output_dtype = MT_DTYPE_BFLOAT16;
    cfg->distributed.moe.ignore_router_for_ac = true;
    cfg->optimizer.decay_every_parameter = true;
    cfg->optimizer.max_grad_norm = 1.0;
    /* torch.optim.AdamW's */
    cfg->optimizer.betas[0] = 0.9, cfg->optimizer.betas[1] = 0.999;
    cfg->optimizer.weight_decay = 0.01;
    cfg->optimizer.lr = 1e-3;
    cfg->rng.seed = 42;
    cfg->distributed.pipeline.balanced_split = true;
    cfg->distributed.device = MT_DEVICE_AUTO; /* AutoModel recipes run on GPUs */
}


/* ---- the one reason a recipe cannot run ---- */

typedef struct {
    const char *needle;
    const char *why;
} am_kind_why_t;

/* recipe classes and model classes, by a part of their name */
static const am_kind_why_t am_unsupported[] = {
    {"VLM", "vision-language models are not supported"},
    {"ImageTextToText", "vision-language models are not supported"},
    {"Multimodal", "multimodal models are not supported"},
    {"Diffusion", "diffusion models are not supported"},
    {"KnowledgeDistillation", "knowledge distillation is not supported"},
    {"Distill", "knowledge distillation is not supported"},
    {"Eagle", "speculative-decoding draft training is not supported"},
    {"DFlash", "speculative-decoding draft training is not supported"},
    {"DSpark", "speculative-decoding draft training is not supported"},
    {"Domino", "speculative-decoding draft training is not supported"},
    {"JetSpec", "speculative-decoding draft training is not supported"},
    {"Vispec", "speculative-decoding draft training is not supported"},
    {"Drafter", "speculative-decoding draft training is not supported"},
    {"BiEncoder", "retrieval (embedding) models are not supported"},
    {"CrossEncoder", "retrieval (embedding) models are not supported"},
    {"Retriever", "retrieval (embedding) models are not supported"},
    {"SequenceClassification", "sequence classification is not supported (meshtrain trains "
                               "next-token prediction)"},
    {"Seq2Seq", "encoder-decoder models are not supported"},
    {"gpt2", "the GPT-2 builder is not supported; name a Hugging Face causal LM"},
    {"transformers.AutoModel.", "a model without a language-model head is not supported"},
};

static const char *why_unsupported(const char *cls)
{
    for (size_t i = 0; i < sizeof am_unsupported / sizeof am_unsupported[0]; i++)
        if (strstr(cls, am_unsupported[i].needle))
            return am_unsupported[i].why;
    return NULL;
}

/* top-level sections that only a recipe meshtrain cannot run has */
static const am_kind_why_t am_sections[] = {
    {"flow_matching", "diffusion models are not supported"},
    {"vae", "diffusion models are not supported"},
    {"dllm", "diffusion language models are not supported"},
    {"teacher_model", "knowledge distillation is not supported"},
    {"recipe_args", "speculative-decoding draft training is not supported"},
    {"processor", "vision-language models are not supported"},
};

bool mt_am_first_reason(mt_parse_ctx_t *c, const yaml_node_t *root)
{
    const yaml_node_t *r = mt_cfg_map_get(c, root, "recipe");
    if (r && r->type == YAML_MAPPING_NODE)
        r = mt_cfg_map_get(c, r, "_target_");
    if (r) {
        const char *cls = mt_cfg_scalar(r), *leaf = mt_am_class_leaf(cls);
        if (strcmp(leaf, "TrainFinetuneRecipeForNextTokenPrediction") != 0 &&
            strcmp(leaf, "BenchmarkingRecipeForNextTokenPrediction") != 0) {
            const char *why = why_unsupported(leaf);
            mt_cfg_perr(c, r, "recipe %s: %s", leaf,
                        why ? why : "is not a recipe meshtrain runs (it runs "
                                    "TrainFinetuneRecipeForNextTokenPrediction)");
            return true;
        }
    }
    const yaml_node_t *model = mt_cfg_map_get(c, root, "model");
    const yaml_node_t *mt = mt_cfg_map_get(c, model, "_target_");
    if (mt) {
        const char *cls = mt_cfg_scalar(mt);
        const char *why = why_unsupported(cls);
        if (!why && !strstr(cls, "ForCausalLM"))
            why = "is not a causal language model class (NeMoAutoModelForCausalLM)";
        if (why) {
            mt_cfg_perr(c, mt, "model %s: %s", mt_am_class_leaf(cls) == cls ? cls : cls, why);
            return true;
        }
    }
    for (size_t i = 0; i < sizeof am_sections / sizeof am_sections[0]; i++) {
        const yaml_node_t *s = mt_cfg_map_get(c, root, am_sections[i].needle);
        if (s) {
            mt_cfg_perr(c, s, "%s: %s", am_sections[i].needle, am_sections[i].why);
            return true;
        }
    }
    static const char *features[] = {"fp8", "quantization", "qat", "freeze_config",
                                     "kd_loss_fn"};
    for (size_t i = 0; i < sizeof features / sizeof features[0]; i++) {
        const yaml_node_t *s = mt_cfg_map_get(c, root, features[i]);
        if (s && !mt_cfg_null_scalar(s) &&
            !(strcmp(features[i], "fp8") == 0 && !mt_am_truthy(mt_cfg_map_get(c, s, "enabled")))) {
            apply(c, rule_of(features[i]), s, features[i]);
            return true;
        }
    }
    /* an optimizer meshtrain does not have, or multi-token prediction:
     * their other keys would only repeat the reason */
    int n0 = c->diag->count;
    const yaml_node_t *ot = mt_cfg_map_get(c, mt_cfg_map_get(c, root, "optimizer"), "_target_");
    if (ot)
        fn_optimizer(c, ot, "optimizer._target_", NULL);
    const yaml_node_t *mtp = mt_cfg_map_get(c, model, "num_nextn_predict_layers");
    if (c->diag->count == n0 && mtp && !mt_cfg_null_scalar(mtp) && strcmp(mt_cfg_scalar(mtp), "0"))
        apply(c, rule_of("model.num_nextn_predict_layers"), mtp, "model.num_nextn_predict_layers");
    if (c->diag->count > n0)
        return true;
    c->cfg->automodel.optimizer = MT_AM_OPT_NONE; /* set again by the walk */
    return false;
}

