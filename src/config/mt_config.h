/* mt_config.h: the one validated configuration of a meshtrain run.
 *
 * A YAML file (NeMo AutoModel field names) plus `section.key=value`
 * overrides fill an mt_config_t.  The struct is plain data with no
 * pointers, so rank 0 parses it and broadcasts it as bytes; after
 * validation it is treated as const.  Every key is described once, in the
 * schema table (config_schema.c); parsing, overrides, printing and the
 * reference documentation all walk that table.
 *
 * Validation needs the world size and the node of every rank; it does not
 * build communicators (that is mt_mesh.h). */
#ifndef MT_CONFIG_H
#define MT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mt_pp_schedule.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_PATH_MAX 1024
#define MT_MAX_LIST 8  /* longest list value (optimizer.betas, ...) */

typedef enum { MT_STRATEGY_FSDP2, MT_STRATEGY_MEGATRON_FSDP, MT_STRATEGY_DDP } mt_strategy_t;

typedef enum { MT_DATA_AUTO, MT_DATA_LLMC, MT_DATA_MEGATRON } mt_data_format_t;
typedef enum { MT_LR_COSINE, MT_LR_LINEAR, MT_LR_CONSTANT } mt_lr_decay_t;
typedef enum { MT_DTYPE_FLOAT32, MT_DTYPE_BFLOAT16 } mt_dtype_t;
/* Where the model computes: the CPU backend, the CUDA backend, or the CPU
 * kernels on guarded memory that host code may not touch (tests). */
/* AUTO (an AutoModel recipe's default) is resolved before validation by
 * the apps (mt_config_resolve_device): cuda where the rank sees a GPU and
 * the build has CUDA, else cpu. */
typedef enum { MT_DEVICE_CPU, MT_DEVICE_CUDA, MT_DEVICE_CPU_GUARDED, MT_DEVICE_AUTO } mt_device_t;
/* distributed.collectives: how collectives on device memory travel */
typedef enum { MT_COLL_AUTO, MT_COLL_NCCL, MT_COLL_MPI } mt_collectives_t;
typedef enum { MT_SAVE_HDF5, MT_SAVE_SAFETENSORS, MT_SAVE_TORCH_SAVE } mt_save_format_t;
/* checkpoint.save_consolidated: AutoModel's true means at every save. */
typedef enum { MT_CONSOLIDATE_NEVER, MT_CONSOLIDATE_EVERY, MT_CONSOLIDATE_FINAL } mt_consolidate_t;

/* model.architecture: the Hugging Face class the model computes and is
 * named as (config.json's architectures[0]).  AUTO: LlamaForCausalLM, or
 * Qwen3ForCausalLM with qk_norm, or Qwen3MoeForCausalLM with experts. */
typedef enum {
    MT_ARCH_AUTO,
    MT_ARCH_LLAMA,
    MT_ARCH_QWEN2,     /* biases on q, k and v */
    MT_ARCH_QWEN3,     /* qk_norm over head_dim */
    MT_ARCH_QWEN3_MOE,
    MT_ARCH_MISTRAL,   /* optional sliding window */
    MT_ARCH_MIXTRAL,   /* block_sparse_moe.experts.E.w1/w2/w3, no q/k norm */
    MT_ARCH_OLMOE      /* q/k norm over the whole projection */
} mt_arch_t;



/* Which app is validating: each adds its own rules. */
typedef enum { MT_APP_ANY, MT_APP_DENSE, MT_APP_MOE, MT_APP_CP } mt_app_kind_t;

/* A nullable integer: AutoModel writes `dp_size: none`. */
typedef struct {
    bool set;
    int64_t value;
} mt_opt_int_t;

/* RoPE scaling (config.json's rope_scaling), with the meaning of
 * transformers' rope initialisation functions (doc/hf-models.md). */
typedef enum { MT_ROPE_DEFAULT, MT_ROPE_LINEAR, MT_ROPE_DYNAMIC, MT_ROPE_LLAMA3, MT_ROPE_YARN } mt_rope_type_t;

typedef struct {
    mt_rope_type_t rope_type;
    double factor;                     /* linear, dynamic, llama3, yarn */
    double low_freq_factor, high_freq_factor; /* llama3 */
    mt_opt_int_t original_max_position_embeddings; /* llama3, yarn (none: max_position_embeddings) */
    double beta_fast, beta_slow;       /* yarn */
    double attention_factor;           /* yarn; 0: 0.1 ln(factor) + 1 */
    bool truncate;                     /* yarn: round the correction range to integers */
} mt_rope_scaling_t;

/* The model's config.json, or the YAML model.config block as JSON text:
 * what mt_config_t carries for the layer that reads it (hf/). */
#define MT_HF_CONFIG_TEXT_MAX 16384

typedef struct {
    int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers;
    int64_t num_attention_heads, max_position_embeddings;
    mt_opt_int_t num_key_value_heads; /* none: num_attention_heads (resolved by validation) */
    double rope_theta, rms_norm_eps, initializer_range;
    bool tie_word_embeddings, qk_norm;
    /* MoE (Qwen3-MoE names); num_experts 0 means a dense model. */
    int64_t num_experts, num_experts_per_tok, moe_intermediate_size;
    bool norm_topk_prob;
    double router_aux_loss_coef;
    char mlp_only_layers[MT_PATH_MAX]; /* comma-separated layer indices: dense MLPs */
    int64_t num_shared_experts;
    double moe_capacity_factor;        /* 0: dropless */
    double moe_router_bias_update_rate; /* 0: no aux-loss-free balancing */
    mt_arch_t architecture;
    mt_opt_int_t head_dim;             /* none: hidden_size / num_attention_heads */
    bool attention_bias, mlp_bias;     /* Llama's: q/k/v/o biases; gate/up/down biases */
    mt_opt_int_t sliding_window;       /* none: full causal attention */
    mt_rope_scaling_t rope_scaling;
    /* Loading by name: a local directory or a hub id resolved in the local
     * Hugging Face cache; revision a branch, tag or commit ("" = main). */
    char pretrained_model_name_or_path[MT_PATH_MAX];
    char revision[MT_PATH_MAX];
    /* The YAML model.config block (AutoModel's inline config), as a JSON
     * object's text; "" when absent. */
    char hf_config[MT_HF_CONFIG_TEXT_MAX];
} mt_model_config_t;

/* What the architecture implies beyond its config.json keys. */
static inline bool mt_model_qkv_bias(const mt_model_config_t *m)
{
    return m->attention_bias || m->architecture == MT_ARCH_QWEN2;
}
static inline bool mt_model_o_bias(const mt_model_config_t *m)
{
    return m->attention_bias && m->architecture != MT_ARCH_QWEN2;
}
/* The architecture, AUTO resolved. */
static inline mt_arch_t mt_model_arch(const mt_model_config_t *m)
{
    if (m->architecture != MT_ARCH_AUTO)
        return m->architecture;
    return m->num_experts > 0 ? MT_ARCH_QWEN3_MOE : m->qk_norm ? MT_ARCH_QWEN3 : MT_ARCH_LLAMA;
}
/* q/k norm over the whole projection (nh * hd and nkv * hd), not per head */
static inline bool mt_model_qk_norm_whole(const mt_model_config_t *m)
{
    return m->qk_norm && m->architecture == MT_ARCH_OLMOE;
}

/* dataset.paths, dataset.validation_paths: at most this many items. */
#define MT_DATA_MAX_PATHS 32
/* dataset.loss_mask: PATH.lossmask files (doc/data.md "Loss masks") are
 * used where present (auto), required of every shard, or ignored (off). */
typedef enum { MT_LOSS_MASK_AUTO, MT_LOSS_MASK_REQUIRED, MT_LOSS_MASK_OFF } mt_loss_mask_t;

typedef struct {
    char path[MT_PATH_MAX];
    char validation_path[MT_PATH_MAX];
    /* token files concatenated, or a blend "W1, P1[, P1b...], W2, P2..."
     * (items that read as numbers are weights: mt_blend_spec_parse) */
    char paths[MT_DATA_MAX_PATHS][MT_PATH_MAX];
    int npaths;
    char validation_paths[MT_DATA_MAX_PATHS][MT_PATH_MAX];
    int nvalidation_paths;
    mt_loss_mask_t loss_mask;
    mt_data_format_t format;
    int64_t seq_length;
    bool shuffle;
    int64_t seed;
} mt_dataset_config_t;

/* A parsed dataset.paths list.  Without any number it is one entry of
 * every path, concatenated (weight 1).  With numbers it is a Megatron /
 * AutoModel zipped blend: each weight (finite, > 0) is followed by one or
 * more paths, the shards of that entry, concatenated. */
typedef struct {
    int n;                              /* entries */
    bool weighted;                      /* the list had weights */
    double weight[MT_DATA_MAX_PATHS];   /* as written, not normalised */
    int first[MT_DATA_MAX_PATHS + 1];   /* entry e: shard[first[e] .. first[e+1]-1] */
    int shard[MT_DATA_MAX_PATHS];       /* item index of each shard */
} mt_blend_spec_t;

/* Parse items[0, n).  Returns -1, or the index of the item at fault (n
 * for the list as a whole) with the reason in why. */
int mt_blend_spec_parse(const char (*items)[MT_PATH_MAX], int n, mt_blend_spec_t *out, char *why,
                        size_t cap);

typedef struct {
    int64_t packed_sequence_size;
} mt_packed_config_t;

typedef struct {
    int64_t global_batch_size, local_batch_size, max_steps;
    int64_t ckpt_every_steps, val_every_steps;
} mt_step_config_t;

typedef struct {
    mt_pp_schedule_t pp_schedule;
    int64_t pp_microbatch_size;
    mt_opt_int_t layers_per_stage;
    bool scale_grads_in_schedule;
    int round_virtual_stages;   /* 0 none, 1 up, 2 down: a stage count not a pp multiple */
    bool balanced_split;        /* AutoModel's: the first L % S stages take one layer more */
} mt_pipeline_config_t;

typedef struct {
    bool reshard_after_forward, ignore_router_for_ac, wrap_outer_model;
} mt_moe_config_t;

typedef struct {
    mt_dtype_t param_dtype, reduce_dtype, output_dtype;
} mt_mp_policy_t;

typedef struct {
    mt_strategy_t strategy;
    mt_opt_int_t dp_size, dp_replicate_size;
    int64_t tp_size, pp_size, cp_size, ep_size;
    bool sequence_parallel, activation_checkpointing, defer_fsdp_grad_sync;
    bool reshard_after_forward; /* fsdp2 */
    int64_t zero_dp_strategy;
    bool overlap_grad_reduce, overlap_param_gather;
    double ddp_bucket_cap_mb;
    int64_t timeout_s;
    mt_device_t device;
    mt_collectives_t collectives;
    mt_pipeline_config_t pipeline;
    mt_moe_config_t moe;
    mt_mp_policy_t mp_policy;
} mt_distributed_config_t;

typedef struct {
    double lr, eps, weight_decay, max_grad_norm;
    double betas[MT_MAX_LIST];
    int nbetas;
    bool decay_every_parameter; /* false: norm weights and biases do not decay */
} mt_optimizer_config_t;

typedef struct {
    int64_t lr_warmup_steps;
    mt_lr_decay_t lr_decay_style;
    double min_lr;
    double init_lr;                /* the warm-up starts here */
    mt_opt_int_t lr_decay_steps;   /* none: max_steps */
} mt_lr_config_t;

typedef struct {
    bool enabled, save_initial;
    mt_consolidate_t save_consolidated;
    char checkpoint_dir[MT_PATH_MAX];
    char resume[MT_PATH_MAX]; /* "auto", "none" or a path */
    int64_t keep_last_n;
    mt_save_format_t model_save_format;
    double lock_stale_s; /* another run's lock without a heartbeat this long is stale */
} mt_checkpoint_config_t;

typedef struct {
    char metrics_file[MT_PATH_MAX];
    int64_t log_every_steps;
    /* a greedy sample from sample_prompt every sample_every_steps (0: off)
     * on rank 0, sample_tokens long (doc/generate.md) */
    int64_t sample_every_steps, sample_tokens;
    char sample_prompt[MT_PATH_MAX];
} mt_logging_config_t;

typedef struct {
    int64_t seed;
} mt_rng_config_t;

/* training.on_nonfinite: what a step whose loss or gradient norm is not
 * finite does. */
typedef enum { MT_NONFINITE_STOP, MT_NONFINITE_SKIP, MT_NONFINITE_IGNORE } mt_nonfinite_t;

typedef struct {
    mt_nonfinite_t on_nonfinite;
    int64_t max_nonfinite_skips;
} mt_training_config_t;

/* What an AutoModel recipe said that meshtrain's keys do not hold
 * (config_automodel.c, doc/automodel-recipes.md). */
typedef enum { MT_AM_OPT_NONE, MT_AM_OPT_ADAMW, MT_AM_OPT_ADAM, MT_AM_OPT_FUSED_ADAM } mt_am_optimizer_t;

typedef struct {
    bool recipe;          /* a top-level `recipe:` key: AutoModel's defaults apply */
    bool lr_schedule;     /* AutoModel's OptimizerParamScheduler (the lr_scheduler section) */
    bool max_steps_null;  /* max_steps: null: the epochs decide */
    bool adam_l2;         /* FusedAdam adam_w_mode false */
    int optimizer;        /* mt_am_optimizer_t */
    int64_t num_epochs;   /* 0: not given */
    char data_refusal[512]; /* why the trainer cannot read the dataset; "" = it can */
    char ignored[2048];   /* keys accepted that cannot change the numerics, noted once */
} mt_automodel_t;

/* peft: LoRA adapters on a frozen base (AutoModel's PeftConfig,
 * doc/lora.md).  Module lists are comma-separated (a YAML list is joined). */
typedef enum { MT_LORA_DROPOUT_POST, MT_LORA_DROPOUT_PRE } mt_lora_dropout_pos_t;
typedef enum { MT_LORA_INIT_XAVIER, MT_LORA_INIT_UNIFORM } mt_lora_init_t;

typedef struct {
    bool enabled;             /* a peft: section (or a peft.* override) is present */
    char target_modules[MT_PATH_MAX];
    char exclude_modules[MT_PATH_MAX];
    bool match_all_linear, use_dora, use_triton;
    int64_t dim;
    double alpha, dropout;
    mt_lora_dropout_pos_t dropout_position;
    mt_lora_init_t lora_A_init;
    char lora_dtype[MT_PATH_MAX];
} mt_peft_config_t;

/* Where a key's value came from, for error messages. */
typedef enum { MT_ORIGIN_DEFAULT = 0, MT_ORIGIN_FILE, MT_ORIGIN_OVERRIDE } mt_origin_kind_t;

typedef struct {
    uint8_t kind;   /* mt_origin_kind_t */
    int32_t line;   /* 1-based, for MT_ORIGIN_FILE */
    int32_t column; /* 1-based */
    int32_t index;  /* override index, for MT_ORIGIN_OVERRIDE */
} mt_origin_t;

#define MT_CFG_MAX_KEYS 128
#define MT_CFG_MAX_SECTIONS 20

/* Quantities derived by validation (valid only after mt_config_validate). */
typedef struct {
    int64_t world_size;
    int64_t dp_size;          /* dp_replicate * dp_shard */
    int64_t dp_replicate;     /* 1 when not HSDP */
    int64_t dp_shard;
    int64_t ep_shard;         /* dp*cp/ep, 1 when ep_size is 1 */
    int64_t grad_accum_steps; /* global / (local * dp) */
    int64_t seq_len;          /* packed_sequence_size if > 0, else seq_length */
    int64_t padded_vocab;     /* vocab_size rounded up to tp_size */
    int64_t head_dim;
    int64_t num_stages;       /* pp_size * stages_per_rank */
    int64_t stages_per_rank;
    int64_t num_microbatches; /* local_batch / pp_microbatch_size (1 w/o pp) */
    int64_t ranks_per_node;   /* smallest node, for the TP rule */
    int64_t num_nodes;
} mt_derived_t;

typedef struct mt_config {
    mt_model_config_t model;
    mt_dataset_config_t dataset;
    mt_packed_config_t packed_sequence;
    mt_step_config_t step_scheduler;
    mt_distributed_config_t distributed;
    mt_optimizer_config_t optimizer;
    mt_lr_config_t lr_scheduler;
    mt_checkpoint_config_t checkpoint;
    mt_logging_config_t logging;
    mt_rng_config_t rng;
    mt_training_config_t training;
    mt_automodel_t automodel;
    mt_peft_config_t peft;

    mt_derived_t derived;
    bool validated;

    /* Provenance: file name, per-key and per-section origins. */
    char source_file[MT_PATH_MAX];
    mt_origin_t key_origin[MT_CFG_MAX_KEYS];
    mt_origin_t section_origin[MT_CFG_MAX_SECTIONS];
    char overrides[8][256]; /* first overrides, for messages */
    int noverrides;
} mt_config_t;

/* Where key `path` was set: "FILE:LINE:COL", "override '...'" or
 * "FILE (default)", for errors found after validation. */
void mt_config_key_where(const mt_config_t *cfg, const char *path, char *buf, size_t cap);

/* ---- lifecycle ---- */

/* Fill every key with its documented default. */
void mt_config_init(mt_config_t *cfg);

/* Parse a YAML file into cfg (which must have been initialised). */
mt_status_t mt_config_load_file(mt_config_t *cfg, const char *path);

/* Parse YAML text; `name` is used in messages in place of a file name. */
mt_status_t mt_config_load_string(mt_config_t *cfg, const char *text, const char *name);

/* Apply one `section.key=value` override (value is YAML: 4, true, [0.9, 0.95]). */
mt_status_t mt_config_override(mt_config_t *cfg, const char *assignment);

/* Validate for a world of `world_size` ranks, where node_of_rank[r], in [0, world_size), names
 * the node of rank r (NULL means all ranks on one node).  Fills
 * cfg->derived.  On failure the error message lists every violated rule,
 * one per line.  Warnings (ignored blocks) are written to `warn` if not
 * NULL. */
mt_status_t mt_config_validate(mt_config_t *cfg, mt_app_kind_t app, int64_t world_size,
                               const int *node_of_rank, FILE *warn);

/* ---- output ---- */

/* Write the resolved config as YAML that mt_config_load_* reads back. */
void mt_config_write_yaml(const mt_config_t *cfg, FILE *out);

/* Same into a buffer; returns the length it needs (like snprintf). */
size_t mt_config_to_yaml(const mt_config_t *cfg, char *buf, size_t cap);

/* Write the configuration reference (every key, type, default, rule) as
 * Markdown: doc/config-reference.md is this output. */
void mt_config_write_reference(FILE *out);

/* ---- names ---- */
const char *mt_strategy_name(mt_strategy_t s);
const char *mt_device_name(mt_device_t d);
const char *mt_collectives_name(mt_collectives_t c);
const char *mt_dtype_name(mt_dtype_t d);
size_t mt_dtype_size(mt_dtype_t d);
const char *mt_app_kind_name(mt_app_kind_t k);
const char *mt_arch_name(mt_arch_t a);          /* "LlamaForCausalLM", ... */
const char *mt_rope_type_name(mt_rope_type_t t); /* "default", "llama3", ... */

/* peft: whether LoRA goes on the linear named full_name (a Hugging Face
 * module name, "model.layers.0.self_attn.q_proj"), by AutoModel's
 * ModuleMatcher rules (doc/lora.md).  Needs no validated config. */
bool mt_peft_matches(const mt_peft_config_t *p, const char *full_name);

/* Levenshtein distance, used for "did you mean" suggestions. */
int mt_edit_distance(const char *a, const char *b);

#ifdef __cplusplus
}
#endif
#endif
