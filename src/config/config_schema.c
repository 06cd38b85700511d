/* config_schema.c: every configuration key, once.
 *
 * The table gives each key's path, type, default and meaning.  Parsing,
 * overrides, defaults, printing and doc/config-reference.md all come from
 * it, so a key cannot be documented without being parsed or the reverse.
 * Cross-key rules live in config_validate.c. */
#include "config_internal.h"

#include <limits.h>
#include <stddef.h>
#include <string.h>

#define OFF(member) offsetof(mt_config_t, member)
#define NOMAX INT64_MAX

static const mt_cfg_enum_t strategy_enum[] = {
    {"fsdp2", MT_STRATEGY_FSDP2, false},
    {"megatron_fsdp", MT_STRATEGY_MEGATRON_FSDP, false},
    {"ddp", MT_STRATEGY_DDP, false},
    {"megatron-fsdp", MT_STRATEGY_MEGATRON_FSDP, true}, /* AutoModel's aliases */
    {"mfsdp", MT_STRATEGY_MEGATRON_FSDP, true},
    {NULL, 0, false}};

static const mt_cfg_enum_t schedule_enum[] = {
    {"1f1b", MT_PP_1F1B, false},
    {"gpipe", MT_PP_GPIPE, false},
    {"interleaved_1f1b", MT_PP_INTERLEAVED_1F1B, false},
    {"interleaved1f1b", MT_PP_INTERLEAVED_1F1B, true},
    {"looped_bfs", MT_PP_LOOPED_BFS, false},
    {"dfs", MT_PP_DFS, false},
    {"v_schedule", MT_PP_V_SCHEDULE, false},
    {"zero_bubble", MT_PP_ZERO_BUBBLE, false},
    {"loopedbfs", MT_PP_LOOPED_BFS, true}, /* torch's class names, case-insensitive */
    {"zbvzerobubble", MT_PP_V_SCHEDULE, true},
    {NULL, 0, false}};

static const mt_cfg_enum_t format_enum[] = {
    {"auto", MT_DATA_AUTO, false},
    {"llmc", MT_DATA_LLMC, false},
    {"megatron", MT_DATA_MEGATRON, false},
    {NULL, 0, false}};

static const mt_cfg_enum_t loss_mask_enum[] = {
    {"auto", MT_LOSS_MASK_AUTO, false},
    {"required", MT_LOSS_MASK_REQUIRED, false},
    {"off", MT_LOSS_MASK_OFF, false},
    {NULL, 0, false}};

static const mt_cfg_enum_t decay_enum[] = {
    {"cosine", MT_LR_COSINE, false},
    {"linear", MT_LR_LINEAR, false},
    {"constant", MT_LR_CONSTANT, false},
    {NULL, 0, false}};

static const mt_cfg_enum_t dtype_enum[] = {
    {"float32", MT_DTYPE_FLOAT32, false},
    {"fp32", MT_DTYPE_FLOAT32, true},
    {"torch.float32", MT_DTYPE_FLOAT32, true},
    {"bfloat16", MT_DTYPE_BFLOAT16, false},
    {"bf16", MT_DTYPE_BFLOAT16, true},
    {"torch.bfloat16", MT_DTYPE_BFLOAT16, true},
    {NULL, 0, false}};

static const mt_cfg_enum_t device_enum[] = {
    {"cpu", MT_DEVICE_CPU, false},
    {"cuda", MT_DEVICE_CUDA, false},
    {"gpu", MT_DEVICE_CUDA, true},
    {"cpu_guarded", MT_DEVICE_CPU_GUARDED, false},
    {"auto", MT_DEVICE_AUTO, false},
    {NULL, 0, false}};

static const mt_cfg_enum_t collectives_enum[] = {
    {"auto", MT_COLL_AUTO, false},
    {"nccl", MT_COLL_NCCL, false},
    {"mpi", MT_COLL_MPI, false},
    {NULL, 0, false}};

static const mt_cfg_enum_t save_enum[] = {
    {"hdf5", MT_SAVE_HDF5, false},
    {"safetensors", MT_SAVE_SAFETENSORS, false},
    {"torch_save", MT_SAVE_TORCH_SAVE, false}, /* AutoModel's; refused by validation */
    {NULL, 0, false}};

static const mt_cfg_enum_t arch_enum[] = {
    {"auto", MT_ARCH_AUTO, false},
    {"LlamaForCausalLM", MT_ARCH_LLAMA, false},
    {"Qwen2ForCausalLM", MT_ARCH_QWEN2, false},
    {"Qwen3ForCausalLM", MT_ARCH_QWEN3, false},
    {"Qwen3MoeForCausalLM", MT_ARCH_QWEN3_MOE, false},
    {"MistralForCausalLM", MT_ARCH_MISTRAL, false},
    {"MixtralForCausalLM", MT_ARCH_MIXTRAL, false},
    {"OlmoeForCausalLM", MT_ARCH_OLMOE, false},
    {NULL, 0, false}};

static const mt_cfg_enum_t rope_enum[] = {
    {"default", MT_ROPE_DEFAULT, false},
    {"linear", MT_ROPE_LINEAR, false},
    {"dynamic", MT_ROPE_DYNAMIC, false},
    {"llama3", MT_ROPE_LLAMA3, false},
    {"yarn", MT_ROPE_YARN, false},
    {NULL, 0, false}};

static const mt_cfg_enum_t consolidate_enum[] = {
    {"false", MT_CONSOLIDATE_NEVER, false},
    {"true", MT_CONSOLIDATE_EVERY, false},
    {"every", MT_CONSOLIDATE_EVERY, false},
    {"final", MT_CONSOLIDATE_FINAL, false},
    {NULL, 0, false}};

static const mt_cfg_enum_t nonfinite_enum[] = {
    {"stop", MT_NONFINITE_STOP, false},
    {"skip", MT_NONFINITE_SKIP, false},
    {"ignore", MT_NONFINITE_IGNORE, false},
    {NULL, 0, false}};

static const mt_cfg_enum_t round_stages_enum[] = {
    {"off", 0, false}, /* AutoModel's null */
    {"up", 1, false},
    {"down", 2, false},
    {NULL, 0, false}};

static const mt_cfg_enum_t lora_dropout_enum[] = {
    {"post", MT_LORA_DROPOUT_POST, false},
    {"pre", MT_LORA_DROPOUT_PRE, false},
    {NULL, 0, false}};

static const mt_cfg_enum_t lora_init_enum[] = {
    {"xavier", MT_LORA_INIT_XAVIER, false},
    {"uniform", MT_LORA_INIT_UNIFORM, false},
    {"kaiming", MT_LORA_INIT_UNIFORM, true},
    {NULL, 0, false}};

const mt_cfg_section_t mt_cfg_sections[] = {
    {"model", "The model, with Hugging Face config.json field names."},
    {"model.rope_scaling", "RoPE scaling, config.json's rope_scaling, with the meaning of "
                           "transformers' rope initialisation functions."},
    {"dataset", "Token data (read by the training loop)."},
    {"packed_sequence", "Packing documents into fixed-length rows (meshtrain-cp)."},
    {"step_scheduler", "Batch sizes and step counts."},
    {"distributed", "Parallelism: NeMo AutoModel's `distributed:` section."},
    {"distributed.pipeline", "Pipeline parallelism; required when pp_size > 1, ignored "
                             "with a warning when pp_size is 1."},
    {"distributed.moe", "Expert-parallel options; ignored with a warning when ep_size is 1."},
    {"distributed.mp_policy", "Mixed precision, AutoModel's MixedPrecisionPolicy; every backend, "
                              "the CPU one included (doc/mixed-precision.md)."},
    {"optimizer", "AdamW."},
    {"lr_scheduler", "Learning-rate schedule."},
    {"checkpoint", "HDF5 checkpoints."},
    {"logging", "Step log and metrics."},
    {"rng", "Random number generation."},
    {"training", "What the step loop does with a diverged step."},
    {"peft", "LoRA fine-tuning, AutoModel's PeftConfig (doc/lora.md): present, it freezes "
             "the base model and trains adapters on the matched linears. Needs "
             "model.pretrained_model_name_or_path."},
};
const int mt_cfg_nsections = (int)(sizeof mt_cfg_sections / sizeof mt_cfg_sections[0]);

#define K_INT(p, m, d, lo, doc) {p, MT_T_INT, OFF(m), 0, 0, NULL, d, lo, NOMAX, doc}
#define K_INTR(p, m, d, lo, hi, doc) {p, MT_T_INT, OFF(m), 0, 0, NULL, d, lo, hi, doc}
#define K_OPT(p, m, d, lo, doc) {p, MT_T_OPT_INT, OFF(m), 0, 0, NULL, d, lo, NOMAX, doc}
#define K_FLT(p, m, d, doc) {p, MT_T_FLOAT, OFF(m), 0, 0, NULL, d, 0, 0, doc}
#define K_BOOL(p, m, d, doc) {p, MT_T_BOOL, OFF(m), 0, 0, NULL, d, 0, 0, doc}
#define K_STR(p, m, d, doc) {p, MT_T_STRING, OFF(m), 0, 0, NULL, d, 0, 0, doc}
/* a string that a YAML list of strings also sets, joined with commas */
#define K_STRL(p, m, d, doc) {p, MT_T_STRING, OFF(m), 0, 1, NULL, d, 0, 0, doc}
#define K_ENUM(p, m, e, d, doc) {p, MT_T_ENUM, OFF(m), 0, 0, e, d, 0, 0, doc}

const mt_cfg_key_t mt_cfg_keys[] = {
    /* model */
    K_INT("model.vocab_size", model.vocab_size, "32000", 1,
          "Vocabulary size; required unless a model is named (pretrained_model_name_or_path "
          "or model.config). With tp_size > 1 it is padded up to a multiple of tp_size; "
          "the padding is masked out of the loss."),
    K_INT("model.hidden_size", model.hidden_size, "4096", 1,
          "Model width; required unless a model is named. Must be divisible by "
          "num_attention_heads."),
    K_INT("model.intermediate_size", model.intermediate_size, "11008", 1,
          "SwiGLU MLP width; required unless a model is named. Must be divisible by tp_size."),
    K_INT("model.num_hidden_layers", model.num_hidden_layers, "32", 1,
          "Number of decoder layers; required unless a model is named. Must split over the "
          "pipeline stages."),
    K_INT("model.num_attention_heads", model.num_attention_heads, "32", 1,
          "Query heads; required unless a model is named. Must divide hidden_size, be "
          "divisible by num_key_value_heads, and be divisible by tp_size."),
    K_OPT("model.num_key_value_heads", model.num_key_value_heads, "none", 1,
          "Key/value heads for grouped-query attention; none means num_attention_heads. "
          "Must divide num_attention_heads and be divisible by tp_size."),
    K_INT("model.max_position_embeddings", model.max_position_embeddings, "4096", 1,
          "Kept for Hugging Face config.json interchange."),
    K_FLT("model.rope_theta", model.rope_theta, "10000.0", "RoPE base. Must be positive."),
    K_FLT("model.rms_norm_eps", model.rms_norm_eps, "1e-6", "RMSNorm epsilon. Must be positive."),
    K_FLT("model.initializer_range", model.initializer_range, "0.02",
          "Standard deviation of the normal initialisation of linear and embedding weights. "
          "Must be positive."),
    K_BOOL("model.tie_word_embeddings", model.tie_word_embeddings, "false",
           "lm_head shares the embedding weight."),
    K_BOOL("model.qk_norm", model.qk_norm, "false",
           "RMSNorm over head_dim on q and k before RoPE (Qwen3)."),
    K_INT("model.num_experts", model.num_experts, "0", 0,
          "Routed experts; 0 means a dense model. meshtrain-moe needs it > 0 and divisible "
          "by ep_size; meshtrain-dense and meshtrain-cp need 0."),
    K_INT("model.num_experts_per_tok", model.num_experts_per_tok, "2", 1,
          "Experts each token is routed to (top-k). At most num_experts."),
    K_INT("model.moe_intermediate_size", model.moe_intermediate_size, "1408", 1,
          "Width of each expert's SwiGLU MLP. Must be divisible by tp_size."),
    K_BOOL("model.norm_topk_prob", model.norm_topk_prob, "false",
           "Renormalise the top-k routing weights to sum to 1."),
    K_FLT("model.router_aux_loss_coef", model.router_aux_loss_coef, "0.001",
          "Scale of the load-balancing auxiliary loss. Must not be negative."),
    K_STR("model.mlp_only_layers", model.mlp_only_layers, "\"\"",
          "Layers that keep a dense MLP in a MoE model, as comma-separated indices "
          "(\"0,3\"; Hugging Face's mlp_only_layers list). Each must be below "
          "num_hidden_layers."),
    K_FLT("model.moe_capacity_factor", model.moe_capacity_factor, "0.0",
          "0: dropless routing. Above 0: each expert takes at most ceil(factor x tokens x "
          "num_experts_per_tok / num_experts) of a rank's micro-batch, in token order; the "
          "rest of its tokens skip it (their other experts still count). Must not be negative."),
    K_FLT("model.moe_router_bias_update_rate", model.moe_router_bias_update_rate, "0.0",
          "0: off. Above 0: aux-loss-free load balancing (DeepSeek-V3): a per-expert bias, "
          "added to the router probabilities for the top-k choice only, moves by this much "
          "after each step towards the mean load. Must not be negative."),
    K_INT("model.num_shared_experts", model.num_shared_experts, "0", 0,
          "Always-active shared experts (DeepSeek style: one SwiGLU of width "
          "num_shared_experts x moe_intermediate_size on every MoE layer, "
          "mlp.shared_experts.*)."),

    K_ENUM("model.architecture", model.architecture, arch_enum, "auto",
           "The Hugging Face class computed and written (config.json's architectures[0]). "
           "auto: LlamaForCausalLM, Qwen3ForCausalLM with qk_norm, Qwen3MoeForCausalLM with "
           "experts. Qwen2ForCausalLM adds q/k/v biases; OlmoeForCausalLM normalises q and k "
           "over the whole projection; MixtralForCausalLM names its experts w1/w2/w3."),
    K_OPT("model.head_dim", model.head_dim, "none", 1,
          "Width of one attention head; none means hidden_size / num_attention_heads. Must be "
          "even."),
    K_BOOL("model.attention_bias", model.attention_bias, "false",
           "Biases on q_proj, k_proj, v_proj and o_proj (Llama's attention_bias)."),
    K_BOOL("model.mlp_bias", model.mlp_bias, "false",
           "Biases on gate_proj, up_proj and down_proj (Llama's mlp_bias)."),
    K_OPT("model.sliding_window", model.sliding_window, "none", 1,
          "Sliding-window attention (Mistral): a token sees itself and the window - 1 tokens "
          "before it. none: full causal attention."),
    K_ENUM("model.rope_scaling.rope_type", model.rope_scaling.rope_type, rope_enum, "default",
           "default (none), linear, dynamic (NTK), llama3 or yarn."),
    K_FLT("model.rope_scaling.factor", model.rope_scaling.factor, "1.0",
          "Scaling factor of linear, dynamic, llama3 and yarn. Must be at least 1."),
    K_FLT("model.rope_scaling.low_freq_factor", model.rope_scaling.low_freq_factor, "1.0",
          "llama3: wavelengths above original_max_position_embeddings / low_freq_factor are "
          "divided by factor."),
    K_FLT("model.rope_scaling.high_freq_factor", model.rope_scaling.high_freq_factor, "4.0",
          "llama3: wavelengths below original_max_position_embeddings / high_freq_factor are "
          "kept; between the two they are interpolated."),
    K_OPT("model.rope_scaling.original_max_position_embeddings",
          model.rope_scaling.original_max_position_embeddings, "none", 1,
          "llama3 and yarn: the context the model was trained on before scaling; none means "
          "max_position_embeddings (yarn), required by llama3."),
    K_FLT("model.rope_scaling.beta_fast", model.rope_scaling.beta_fast, "32.0",
          "yarn: rotations at which the high-frequency (extrapolated) band ends."),
    K_FLT("model.rope_scaling.beta_slow", model.rope_scaling.beta_slow, "1.0",
          "yarn: rotations at which the low-frequency (interpolated) band starts."),
    K_FLT("model.rope_scaling.attention_factor", model.rope_scaling.attention_factor, "0.0",
          "yarn: scale of cos and sin; 0 means 0.1 ln(factor) + 1."),
    K_BOOL("model.rope_scaling.truncate", model.rope_scaling.truncate, "true",
           "yarn: round the correction range to whole dimensions."),
    K_STR("model.pretrained_model_name_or_path", model.pretrained_model_name_or_path, "\"\"",
          "A Hugging Face model: a directory with config.json and *.safetensors, or a hub id "
          "org/name found in the local cache (HF_HUB_CACHE, else HF_HOME/hub, else "
          "~/.cache/huggingface/hub); nothing is downloaded. Its config.json gives the "
          "architecture and its weights the initial values."),
    K_STR("model.revision", model.revision, "\"\"",
          "With a hub id: the branch, tag or commit of the cached snapshot; empty means main."),

    /* dataset */
    K_STR("dataset.path", dataset.path, "\"\"",
          "Training tokens: an llm.c .bin file or a Megatron .bin/.idx prefix. A relative "
          "path is looked up in the current directory, then beside the config file."),
    K_ENUM("dataset.format", dataset.format, format_enum, "auto",
           "auto detects the format from the file's magic."),
    K_INT("dataset.seq_length", dataset.seq_length, "2048", 1,
          "Tokens per sample. With sequence_parallel it must be divisible by tp_size; with "
          "cp_size > 1 (no packing) by 2 x cp_size."),
    K_BOOL("dataset.shuffle", dataset.shuffle, "false",
           "Visit samples in a seeded permutation per epoch instead of in order."),
    K_INT("dataset.seed", dataset.seed, "1234", 0, "Seed of the sample permutation."),
    K_STR("dataset.validation_path", dataset.validation_path, "\"\"",
          "Validation tokens, evaluated every step_scheduler.val_every_steps."),
    {"dataset.paths", MT_T_STRING_LIST, OFF(dataset.paths), OFF(dataset.npaths),
     MT_DATA_MAX_PATHS, NULL, "[]", 0, 0,
     "Instead of path: token files concatenated in this order (documents never span files), "
     "or a blend in AutoModel's zipped form [W1, P1, W2, P2, ...]: an item that reads as a "
     "number is a weight (> 0), followed by one or more paths, the shards of that entry "
     "(doc/data.md, Blends). At most 32 items."},
    {"dataset.validation_paths", MT_T_STRING_LIST, OFF(dataset.validation_paths),
     OFF(dataset.nvalidation_paths), MT_DATA_MAX_PATHS, NULL, "[]", 0, 0,
     "Instead of validation_path: a list or blend as for paths, drawn in order."},
    K_ENUM("dataset.loss_mask", dataset.loss_mask, loss_mask_enum, "auto",
           "Per-token loss masks, PATH.lossmask beside each token file: auto uses them where "
           "present (logged), required refuses a shard without one, off ignores them. A "
           "target whose mask is 0 is left out of the loss (doc/data.md, Loss masks)."),

    /* packed_sequence */
    K_INT("packed_sequence.packed_sequence_size", packed_sequence.packed_sequence_size, "0", 0,
          "Pack documents into rows of this many tokens; 0 disables packing. Needs "
          "local_batch_size 1 and divisibility by cp_size (by 2 x cp_size when cp_size > 1)."),

    /* step_scheduler */
    K_INT("step_scheduler.global_batch_size", step_scheduler.global_batch_size, "8", 1,
          "Samples per optimizer step over all ranks. Must be divisible by local_batch_size x "
          "dp_size; the quotient is the number of gradient-accumulation micro-steps."),
    K_INT("step_scheduler.local_batch_size", step_scheduler.local_batch_size, "1", 1,
          "Samples per rank per micro-step. Must be divisible by pipeline.pp_microbatch_size."),
    K_INT("step_scheduler.max_steps", step_scheduler.max_steps, "100", 1,
          "Optimizer steps to train for."),
    K_INT("step_scheduler.ckpt_every_steps", step_scheduler.ckpt_every_steps, "0", 0,
          "Save a checkpoint every this many steps; 0 saves only at the end and on signals."),
    K_INT("step_scheduler.val_every_steps", step_scheduler.val_every_steps, "0", 0,
          "Evaluate the validation set every this many steps; 0 never."),

    /* distributed */
    K_ENUM("distributed.strategy", distributed.strategy, strategy_enum, "fsdp2",
           "Data-parallel strategy: fsdp2, megatron_fsdp or ddp."),
    K_OPT("distributed.dp_size", distributed.dp_size, "none", 1,
          "Data-parallel size; none infers world_size / (tp x pp x cp). An explicit value "
          "must equal that."),
    K_OPT("distributed.dp_replicate_size", distributed.dp_replicate_size, "none", 1,
          "HSDP replicas (fsdp2 only): dp_shard = dp_size / dp_replicate_size. Must divide "
          "dp_size and be smaller than it (or equal to it with cp_size > 1: fsdp2 then shards "
          "over cp)."),
    K_INT("distributed.tp_size", distributed.tp_size, "1", 1,
          "Tensor-parallel size. Must divide the head counts and MLP widths, and a TP group "
          "must stay inside one node."),
    K_INT("distributed.pp_size", distributed.pp_size, "1", 1,
          "Pipeline-parallel size. pp_size > 1 needs a `pipeline:` block."),
    K_INT("distributed.cp_size", distributed.cp_size, "1", 1, "Context-parallel size."),
    K_INT("distributed.ep_size", distributed.ep_size, "1", 1,
          "Expert-parallel size. dp_size x cp_size must be divisible by it."),
    K_BOOL("distributed.sequence_parallel", distributed.sequence_parallel, "false",
           "Split norms and the residual stream along the sequence over TP ranks. Needs "
           "tp_size > 1."),
    K_BOOL("distributed.activation_checkpointing", distributed.activation_checkpointing, "false",
           "Recompute each layer's forward during backward."),
    K_BOOL("distributed.defer_fsdp_grad_sync", distributed.defer_fsdp_grad_sync, "true",
           "fsdp2 only: with gradient accumulation, reduce gradients on the last micro-step "
           "only."),
    K_BOOL("distributed.reshard_after_forward", distributed.reshard_after_forward, "true",
           "fsdp2 only: free each unit's gathered parameters after its forward and gather them "
           "again for backward (false keeps them until backward: less communication, more "
           "memory)."),
    K_INTR("distributed.zero_dp_strategy", distributed.zero_dp_strategy, "3", 0, 3,
           "megatron_fsdp only: 0 replicate all, 1 shard optimizer state, 2 also gradients, "
           "3 also parameters."),
    K_BOOL("distributed.overlap_grad_reduce", distributed.overlap_grad_reduce, "true",
           "megatron_fsdp only: overlap gradient reduction with backward."),
    K_BOOL("distributed.overlap_param_gather", distributed.overlap_param_gather, "true",
           "megatron_fsdp only: overlap parameter all-gather with forward."),
    K_FLT("distributed.ddp_bucket_cap_mb", distributed.ddp_bucket_cap_mb, "25.0",
          "ddp (and the experts of a MoE when ddp or megatron_fsdp replicates them): "
          "gradients are all-reduced in buckets of about this many MiB (whole parameters), "
          "each started as soon as backward has finished its gradients. Must be positive."),
    K_INT("distributed.timeout_s", distributed.timeout_s, "600", 1,
          "Collective timeout in seconds: a NCCL collective still pending after it is "
          "aborted with an error naming the collective and the axis (doc/gpu.md)."),
    K_ENUM("distributed.device", distributed.device, device_enum, "cpu",
           "Where the model computes: cpu, cuda (the GPU of the node-local rank modulo the "
           "GPU count; on several ranks every parallelism, its transfers staged through host "
           "memory, doc/gpu.md) or cpu_guarded (the CPU kernels on memory that host code may "
           "not touch: a test that the trainer is ready for a device) or auto (cuda where rank 0 "
           "sees a GPU and meshtrain is built with CUDA, else cpu, said in one line at start; "
           "an AutoModel recipe's default)."),
    K_ENUM("distributed.collectives", distributed.collectives, collectives_enum, "auto",
           "How collectives on GPU memory travel: nccl (the tensor- and data-parallel ones "
           "on NCCL communicators, one per mesh group; needs one GPU per rank), mpi (MPI on "
           "host copies, also when ranks share a GPU) or auto (nccl when the build has NCCL "
           "and every rank has its own GPU, else mpi). Only with device cuda (doc/gpu.md)."),
    K_ENUM("distributed.pipeline.pp_schedule", distributed.pipeline.pp_schedule, schedule_enum,
           "1f1b",
           "One of 1f1b, gpipe, interleaved_1f1b (alias interleaved1f1b), looped_bfs, dfs, "
           "v_schedule, zero_bubble. interleaved_1f1b, looped_bfs and dfs need at least 2 "
           "stages per rank; v_schedule exactly 2."),
    K_INT("distributed.pipeline.pp_microbatch_size", distributed.pipeline.pp_microbatch_size,
          "1", 1, "Samples per pipeline microbatch. Must divide local_batch_size."),
    K_OPT("distributed.pipeline.layers_per_stage", distributed.pipeline.layers_per_stage, "none",
          1,
          "Layers in each stage (the last stage takes the remainder); the stage count must be "
          "a multiple of pp_size. none splits evenly into pp_size stages (2 x pp_size for "
          "multi-stage schedules)."),
    K_BOOL("distributed.pipeline.scale_grads_in_schedule",
           distributed.pipeline.scale_grads_in_schedule, "false",
           "Scale gradients by 1/microbatches inside the schedule instead of after it."),
    K_ENUM("distributed.pipeline.round_virtual_stages_to_pp_multiple",
           distributed.pipeline.round_virtual_stages, round_stages_enum, "off",
           "When layers_per_stage makes a stage count that is not a multiple of pp_size: off "
           "(AutoModel's null) refuses it, up or down rounds the count to one (AutoModel's)."),
    K_BOOL("distributed.pipeline.balanced_split", distributed.pipeline.balanced_split, "false",
           "Split the layers over the stages as AutoModel does: L / stages each, the first "
           "L % stages stages one more (an AutoModel recipe's default is true). false: "
           "layers_per_stage each, the last stage the remainder."),
    K_BOOL("distributed.moe.reshard_after_forward", distributed.moe.reshard_after_forward,
           "false", "Free gathered expert weights after forward."),
    K_BOOL("distributed.moe.ignore_router_for_ac", distributed.moe.ignore_router_for_ac, "false",
           "Do not recompute the router under activation checkpointing."),
    K_BOOL("distributed.moe.wrap_outer_model", distributed.moe.wrap_outer_model, "true",
           "Make the non-layer parameters (embedding, norm, lm_head) an FSDP unit."),
    K_ENUM("distributed.mp_policy.param_dtype", distributed.mp_policy.param_dtype, dtype_enum,
           "float32", "Compute dtype of parameters and activations; bfloat16 keeps fp32 master "
           "weights, AdamW state and weight gradients."),
    K_ENUM("distributed.mp_policy.reduce_dtype", distributed.mp_policy.reduce_dtype, dtype_enum,
           "float32", "Dtype of the gradient reduce-scatters and all-reduces (the wire)."),
    K_ENUM("distributed.mp_policy.output_dtype", distributed.mp_policy.output_dtype, dtype_enum,
           "float32", "Storage dtype of the logits; under bfloat16 compute they are bf16 "
           "values either way and the loss is fp32."),

    /* optimizer */
    K_FLT("optimizer.lr", optimizer.lr, "3e-4", "Peak learning rate. Must be positive."),
    {"optimizer.betas", MT_T_FLOAT_LIST, OFF(optimizer.betas), OFF(optimizer.nbetas), 2, NULL,
     "[0.9, 0.95]", 0, 0, "AdamW (beta1, beta2), each in [0, 1)."},
    K_FLT("optimizer.eps", optimizer.eps, "1e-8", "AdamW epsilon. Must be positive."),
    K_FLT("optimizer.weight_decay", optimizer.weight_decay, "0.0",
          "Decoupled weight decay; not applied to norm weights. Must not be negative."),
    K_FLT("optimizer.max_grad_norm", optimizer.max_grad_norm, "1.0",
          "Clip the global gradient norm to this; 0 disables clipping."),
    K_BOOL("optimizer.decay_every_parameter", optimizer.decay_every_parameter, "false",
           "Weight decay on every parameter, norm weights and biases included (AutoModel's "
           "and torch's choice; an AutoModel recipe's default is true)."),

    /* lr_scheduler */
    K_INT("lr_scheduler.lr_warmup_steps", lr_scheduler.lr_warmup_steps, "0", 0,
          "Linear warm-up steps."),
    K_ENUM("lr_scheduler.lr_decay_style", lr_scheduler.lr_decay_style, decay_enum, "cosine",
           "Decay after warm-up: cosine, linear (to min_lr at max_steps) or constant."),
    K_FLT("lr_scheduler.min_lr", lr_scheduler.min_lr, "0.0",
          "Final learning rate. Must be in [0, optimizer.lr]."),
    K_FLT("lr_scheduler.init_lr", lr_scheduler.init_lr, "0.0",
          "Learning rate at the start of the warm-up. Must be in [0, optimizer.lr]."),
    K_OPT("lr_scheduler.lr_decay_steps", lr_scheduler.lr_decay_steps, "none", 1,
          "Steps over which the decay reaches min_lr (then it stays there); none means "
          "max_steps. Must be above lr_warmup_steps."),

    /* checkpoint */
    K_BOOL("checkpoint.enabled", checkpoint.enabled, "false", "Write checkpoints."),
    K_STR("checkpoint.checkpoint_dir", checkpoint.checkpoint_dir, "checkpoints",
          "Directory of step_NNNNNNNN/ checkpoints and the `latest` pointer."),
    K_STR("checkpoint.resume", checkpoint.resume, "auto",
          "auto resumes from the newest complete checkpoint, none starts fresh, anything else "
          "is a checkpoint path."),
    K_BOOL("checkpoint.save_initial", checkpoint.save_initial, "false",
           "Write the starting state before the first update: step 0, or the resumed step "
           "when checkpoint_dir does not hold it yet (so a checkpoint loaded from elsewhere is "
           "written again on this mesh; with max_steps equal to that step nothing trains)."),
    K_INT("checkpoint.keep_last_n", checkpoint.keep_last_n, "0", 0,
          "Keep the newest n checkpoints; 0 keeps all. Must be at least 2 when above 0."),
    K_ENUM("checkpoint.save_consolidated", checkpoint.save_consolidated, consolidate_enum, "false",
           "Also write the model as a Hugging Face directory, step_NNNNNNNN/model/consolidated/ "
           "(safetensors, config.json; the source model's dtypes, config and tokenizer files "
           "when model.pretrained_model_name_or_path is set): true or every (at every save, "
           "AutoModel's true), final (at the save of step max_steps only) or false."),
    K_ENUM("checkpoint.model_save_format", checkpoint.model_save_format, save_enum,
           "safetensors",
           "Format of the consolidated directory: safetensors. torch_save (AutoModel's PyTorch "
           "format) is refused: meshtrain writes no pickles. hdf5 is accepted only with "
           "save_consolidated false: the checkpoint itself is always HDF5."),

    K_FLT("checkpoint.lock_stale_s", checkpoint.lock_stale_s, "600.0",
          "The run that writes checkpoint_dir holds checkpoint_dir/.lock and touches it as it "
          "trains; another run's lock untouched this many seconds is stale and taken over "
          "with a warning (a dead pid on the same host, or an earlier run of the same job, "
          "is taken over at once). Make it longer than the longest step or save."),

    /* logging */
    K_STR("logging.metrics_file", logging.metrics_file, "metrics.jsonl",
          "One JSON object per step is appended here; empty disables it."),
    K_INT("logging.log_every_steps", logging.log_every_steps, "1", 1,
          "Print a step line every this many steps."),
    K_INT("logging.sample_every_steps", logging.sample_every_steps, "0", 0,
          "Print a greedy sample of the model on rank 0 after every this many steps (0: "
          "never), as meshtrain-generate would write it. Needs the whole model on rank 0 (no "
          "tp, pp, ep or FSDP sharding) on the CPU, and a tokenizer: the named "
          "model's tokenizer.json, else the byte tokenizer for a vocabulary of at least 258."),
    K_STR("logging.sample_prompt", logging.sample_prompt, "",
          "The samples' prompt; empty: the tokenizer's BOS token, else its EOS (a document "
          "start)."),
    K_INT("logging.sample_tokens", logging.sample_tokens, "32", 1,
          "Tokens each sample generates."),

    /* rng */
    K_INT("rng.seed", rng.seed, "42", 0,
          "Seed of the initial weights; they depend on it and the model, never on the mesh."),

    /* training */
    K_ENUM("training.on_nonfinite", training.on_nonfinite, nonfinite_enum, "stop",
           "A step whose loss or gradient norm is NaN or infinite on any rank: `stop` ends the "
           "run with an error naming the step and the quantity, before the update and saving "
           "nothing; `skip` leaves the weights and optimizer state as they were and goes on; "
           "`ignore` updates anyway. A checkpoint of non-finite weights is never written."),
    K_INT("training.max_nonfinite_skips", training.max_nonfinite_skips, "3", 1,
          "With on_nonfinite: skip, the run ends with an error after this many consecutive "
          "skipped steps."),

    /* peft */
    K_STRL("peft.target_modules", peft.target_modules, "\"\"",
          "Linears that get an adapter: a list (or comma-separated string) of patterns, each "
          "a module's name (q_proj) or its full name, where * matches any characters "
          "(*_proj, *.layers.0.*.q_proj). Every pattern must match some linear. Empty, with "
          "exclude_modules empty and match_all_linear false: *_proj."),
    K_STRL("peft.exclude_modules", peft.exclude_modules, "\"\"",
          "Instead of target_modules (not with it): every linear but these patterns. "
          "lm_head must be among them: LoRA on lm_head is not supported."),
    K_BOOL("peft.match_all_linear", peft.match_all_linear, "false",
           "Every linear, lm_head included: refused, LoRA on lm_head is not supported (use "
           "target_modules: '*_proj')."),
    K_INT("peft.dim", peft.dim, "8", 0, "The adapters' rank r; at least 1."),
    K_FLT("peft.alpha", peft.alpha, "32.0", "The adapter output is scaled by alpha / dim."),
    K_FLT("peft.dropout", peft.dropout, "0.0",
          "Dropout probability in the adapter branch; only 0 is supported so far."),
    K_ENUM("peft.dropout_position", peft.dropout_position, lora_dropout_enum, "post",
           "Where the dropout goes: post (on the adapter's output) or pre (on its input)."),
    K_ENUM("peft.lora_A_init", peft.lora_A_init, lora_init_enum, "xavier",
           "lora_A's initial values, as AutoModel draws them: xavier is uniform on [0, 1) "
           "(AutoModel's init_lora_weights), uniform (alias kaiming) is kaiming_uniform with "
           "a = sqrt(5), uniform on +-1/sqrt(in_features). lora_B starts at zero."),
    K_BOOL("peft.use_dora", peft.use_dora, "false", "DoRA: refused, not implemented."),
    K_BOOL("peft.use_triton", peft.use_triton, "false",
           "AutoModel's Triton kernels: accepted and ignored (the backend's GEMMs run)."),
    K_STR("peft.lora_dtype", peft.lora_dtype, "\"\"",
          "The adapters' dtype: empty or float32 (they train in float32)."),
};
const int mt_cfg_nkeys = (int)(sizeof mt_cfg_keys / sizeof mt_cfg_keys[0]);

_Static_assert(sizeof mt_cfg_keys / sizeof mt_cfg_keys[0] <= MT_CFG_MAX_KEYS,
               "raise MT_CFG_MAX_KEYS");
_Static_assert(sizeof mt_cfg_sections / sizeof mt_cfg_sections[0] <= MT_CFG_MAX_SECTIONS,
               "raise MT_CFG_MAX_SECTIONS");

int mt_cfg_key_index(const char *path)
{
    for (int i = 0; i < mt_cfg_nkeys; i++)
        if (strcmp(mt_cfg_keys[i].path, path) == 0)
            return i;
    return -1;
}

int mt_cfg_section_index(const char *path)
{
    for (int i = 0; i < mt_cfg_nsections; i++)
        if (strcmp(mt_cfg_sections[i].path, path) == 0)
            return i;
    return -1;
}

const char *mt_cfg_enum_canonical(const mt_cfg_enum_t *e, int value)
{
    for (; e->name; e++)
        if (e->value == value && !e->alias)
            return e->name;
    return "?";
}

const char *mt_cfg_type_name(const mt_cfg_key_t *k)
{
    switch (k->type) {
    case MT_T_INT: return "integer";
    case MT_T_OPT_INT: return "integer or none";
    case MT_T_FLOAT: return "number";
    case MT_T_BOOL: return "boolean";
    case MT_T_STRING: return "string";
    case MT_T_ENUM: return "enum";
    case MT_T_FLOAT_LIST: return "list of numbers";
    case MT_T_STRING_LIST: return "list of strings";
    }
    return "?";
}

const char *mt_strategy_name(mt_strategy_t s) { return mt_cfg_enum_canonical(strategy_enum, (int)s); }
const char *mt_device_name(mt_device_t d) { return mt_cfg_enum_canonical(device_enum, (int)d); }
const char *mt_collectives_name(mt_collectives_t c)
{
    return mt_cfg_enum_canonical(collectives_enum, (int)c);
}
const char *mt_dtype_name(mt_dtype_t d) { return mt_cfg_enum_canonical(dtype_enum, (int)d); }

size_t mt_dtype_size(mt_dtype_t d) { return d == MT_DTYPE_BFLOAT16 ? 2 : 4; }

const char *mt_arch_name(mt_arch_t a)
{
    return mt_cfg_enum_canonical(arch_enum, (int)a);
}

const char *mt_rope_type_name(mt_rope_type_t t)
{
    return mt_cfg_enum_canonical(rope_enum, (int)t);
}

const char *mt_app_kind_name(mt_app_kind_t k)
{
    switch (k) {
    case MT_APP_DENSE: return "meshtrain-dense";
    case MT_APP_MOE: return "meshtrain-moe";
    case MT_APP_CP: return "meshtrain-cp";
    case MT_APP_ANY: break;
    }
    return "meshtrain";
}

