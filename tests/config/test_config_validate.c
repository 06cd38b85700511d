/* test_config_validate: every cross-key rule of src/config/config_validate.c.
 * Each rule has a valid case and an invalid one whose message must name the
 * key path and the rule's own text.  Also: warnings for ignored blocks,
 * schedule names at parse time, the node topology rule, derived sizes,
 * message locations and several violations reported at once.  No MPI. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt_config.h"
#include "mt_test.h"

/* A small valid dense model; every case varies one thing on top of it. */
static const char base_yaml[] = "model:\n"
                                "  vocab_size: 256\n"
                                "  hidden_size: 64\n"
                                "  intermediate_size: 128\n"
                                "  num_hidden_layers: 4\n"
                                "  num_attention_heads: 4\n"
                                "  num_key_value_heads: 2\n"
                                "dataset:\n"
                                "  seq_length: 64\n"
                                "step_scheduler:\n"
                                "  global_batch_size: 16\n"
                                "  local_batch_size: 2\n";

static mt_config_t cfg;

static int base_lines(void)
{
    int n = 0;
    for (const char *p = base_yaml; *p; p++)
        n += *p == '\n';
    return n;
}

/* Load base_yaml + yaml (may be NULL), then apply the ';'-separated
 * overrides in ovr (may be NULL).  False (and a failed CHECK) if either
 * does not parse. */
static bool load(const char *yaml, const char *ovr)
{
    char text[4096], list[1024];
    mt_config_init(&cfg);
    snprintf(text, sizeof text, "%s%s", base_yaml, yaml ? yaml : "");
    mt_status_t s = mt_config_load_string(&cfg, text, "test.yaml");
    CHECK(s == MT_OK, "YAML does not parse: %s\n%s", mt_error_message(), text);
    if (s != MT_OK)
        return false;
    snprintf(list, sizeof list, "%s", ovr ? ovr : "");
    for (char *save = NULL, *a = strtok_r(list, ";", &save); a; a = strtok_r(NULL, ";", &save)) {
        s = mt_config_override(&cfg, a);
        CHECK(s == MT_OK, "override %s does not parse: %s", a, mt_error_message());
        if (s != MT_OK)
            return false;
    }
    return true;
}

static mt_status_t validate(int64_t world, const int *nodes, mt_app_kind_t app, FILE *warn)
{
    mt_error_clear();
    return mt_config_validate(&cfg, app, world, nodes, warn);
}

static void expect_ok(const char *yaml, const char *ovr, int64_t world, const int *nodes,
                      mt_app_kind_t app)
{
    if (!load(yaml, ovr))
        return;
    mt_status_t s = validate(world, nodes, app, NULL);
    CHECK(s == MT_OK && cfg.validated, "expected valid (world %lld, %s, overrides '%s'):\n%s",
          (long long)world, mt_app_kind_name(app), ovr ? ovr : "", mt_error_message());
}

static void expect_err(const char *yaml, const char *ovr, int64_t world, const int *nodes,
                       mt_app_kind_t app, const char *needle1, const char *needle2)
{
    if (!load(yaml, ovr))
        return;
    int before = mt_test_failures;
    mt_status_t s = validate(world, nodes, app, NULL);
    CHECK(s == MT_ERR_CONFIG && !cfg.validated, "expected a config error, got %s",
          mt_status_name(s));
    const char *msg = mt_error_message();
    CHECK_CONTAINS(msg, needle1);
    if (needle2)
        CHECK_CONTAINS(msg, needle2);
    if (mt_test_failures > before)
        fprintf(stderr, "  in case: world %lld, %s, yaml '%s', overrides '%s'\n",
                (long long)world, mt_app_kind_name(app), yaml ? yaml : "", ovr ? ovr : "");
}

/* ------------------------------------------------------------------ */
/* the rule table: one valid and at least one invalid case per rule     */

typedef struct {
    const char *ovr;     /* ';'-separated overrides on the base */
    int64_t world;
    mt_app_kind_t app;
    const char *path;    /* NULL: the case must validate */
    const char *text;    /* the rule's message */
} rule_case_t;

#define OK(w, o) {o, w, MT_APP_ANY, NULL, NULL}
#define BAD(w, o, p, t) {o, w, MT_APP_ANY, p, t}
#define OK_APP(a, w, o) {o, w, a, NULL, NULL}
#define BAD_APP(a, w, o, p, t) {o, w, a, p, t}

#define D "distributed."
#define MEG D "strategy=megatron_fsdp;"
#define DDP D "strategy=ddp;"
#define PP2 D "pp_size=2;" D "pipeline.pp_schedule="
#define LPS ";" D "pipeline.layers_per_stage="

static const rule_case_t rule_cases[] = {
    /* world divisible by tp x pp x cp */
    OK(4, D "tp_size=2"),
    OK(8, D "tp_size=2;" D "cp_size=2"),
    BAD(5, D "tp_size=2", "override 'distributed.tp_size=2': distributed.tp_size: ",
        "world size 5 is not divisible by tp_size x pp_size x cp_size = 2 x 1 x 1 = 2"),
    BAD(6, D "cp_size=4", "override 'distributed.cp_size=4': distributed.cp_size: ",
        "= 1 x 1 x 4 = 4"),
    /* explicit dp_size must equal the inferred one */
    OK(4, D "tp_size=2;" D "dp_size=2"),
    OK(4, D "dp_size=none"),
    BAD(4, D "tp_size=2;" D "dp_size=4", "distributed.dp_size: ",
        "4 does not match world_size / (tp x pp x cp) = 4 / 2 = 2"),
    /* dp_replicate_size: fsdp2 only, divides dp_size, smaller than it */
    OK(4, D "dp_replicate_size=2"),
    OK(8, D "dp_replicate_size=4"),
    BAD(4, DDP D "dp_replicate_size=2", "distributed.dp_replicate_size: ",
        "ddp replicates over every data-parallel rank already; remove dp_replicate_size"),
    BAD(4, MEG D "dp_replicate_size=2", "distributed.dp_replicate_size: ",
        "is fsdp2 only (HSDP); strategy is megatron_fsdp"),
    BAD(8, D "dp_replicate_size=3", "distributed.dp_replicate_size: ",
        "3 does not divide dp_size 8"),
    BAD(4, D "dp_replicate_size=4", "distributed.dp_replicate_size: ",
        "4 must be smaller than dp_size 4: pure replication is not supported"),
    OK(4, D "cp_size=2;" D "dp_replicate_size=2"), /* fsdp2 shards over dp_shard_cp = cp */
    /* megatron_fsdp: no pp, ep or sequence_parallel */
    OK(2, MEG D "tp_size=2"),
    BAD(2, MEG PP2 "1f1b", "distributed.pp_size: ",
        "megatron_fsdp does not support pipeline parallelism (pp_size = 2)"),
    BAD(2, MEG D "ep_size=2;model.num_experts=4", "distributed.ep_size: ",
        "megatron_fsdp does not support expert parallelism (ep_size = 2)"),
    BAD(2, MEG D "tp_size=2;" D "sequence_parallel=true", "distributed.sequence_parallel: ",
        "megatron_fsdp does not support sequence_parallel"),
    /* megatron_fsdp-only options */
    OK(2, MEG D "zero_dp_strategy=1;" D "overlap_grad_reduce=false;"
              D "overlap_param_gather=false"),
    BAD(2, D "zero_dp_strategy=2", "distributed.zero_dp_strategy: ",
        "is a megatron_fsdp option; strategy is fsdp2"),
    BAD(2, DDP D "overlap_grad_reduce=false", "distributed.overlap_grad_reduce: ",
        "is a megatron_fsdp option; strategy is ddp"),
    BAD(2, D "overlap_param_gather=false", "distributed.overlap_param_gather: ",
        "is a megatron_fsdp option; strategy is fsdp2"),
    /* ... but only when set to something other than the default */
    OK(2, DDP D "overlap_grad_reduce=true;" D "zero_dp_strategy=3"),
    /* zero_dp_strategy in 0..3 */
    /* distributed.device: several ranks off the CPU (staged collectives) */
    OK(1, D "device=cuda"),
    OK(2, D "device=cuda;" D "collectives=nccl"),
    OK(2, D "device=cpu;" D "collectives=mpi"),
    BAD(1, D "collectives=nccl", "distributed.collectives: ",
        "nccl needs distributed.device cuda (the device is cpu)"),
    OK(1, D "device=cpu_guarded"),
    OK(2, D "device=cpu"),
    OK(2, D "device=cuda"),
    OK(2, D "device=cpu_guarded;" DDP),
    OK(2, D "device=cpu_guarded;" MEG D "zero_dp_strategy=3"),
    OK(4, D "device=cuda;" D "dp_replicate_size=2"),
    OK(4, D "device=cuda;" D "tp_size=2;" D "sequence_parallel=true"),
    OK(2, D "device=cpu;" PP2 "1f1b"),
    OK(1, D "device=cpu_guarded;model.num_experts=4"),
    OK(2, D "device=cuda;" PP2 "1f1b"),
    /* ... and context and expert parallelism and MoE models (their
     * exchanges staged too) */
    OK(4, D "device=cpu_guarded;" D "cp_size=2"),
    OK(2, D "device=cpu_guarded;" D "ep_size=2;model.num_experts=4"),
    OK(2, D "device=cuda;model.num_experts=4"),
    OK(4, D "device=cuda;" D "cp_size=2;" D "ep_size=2;model.num_experts=4"),
    OK(1, MEG D "zero_dp_strategy=0"),
    OK(1, MEG D "zero_dp_strategy=3"),
    BAD(1, MEG D "zero_dp_strategy=4", "distributed.zero_dp_strategy: ",
        "must be at most 3, got 4"),
    BAD(1, MEG D "zero_dp_strategy=-1", "distributed.zero_dp_strategy: ",
        "must be at least 0, got -1"),
    /* ddp is data parallelism only */
    OK(4, DDP D "dp_size=4"),
    BAD(2, DDP D "tp_size=2", "distributed.tp_size: ",
        "ddp is data parallelism only; tp_size = 2 needs strategy fsdp2"),
    BAD(2, DDP PP2 "1f1b", "distributed.pp_size: ",
        "ddp is data parallelism only; pp_size = 2 needs strategy fsdp2"),
    BAD(2, DDP D "cp_size=2", "distributed.cp_size: ",
        "ddp is data parallelism only; cp_size = 2 needs strategy fsdp2"),
    BAD(2, DDP D "ep_size=2;model.num_experts=4", "distributed.ep_size: ",
        "ddp is data parallelism only; ep_size = 2 needs strategy fsdp2"),
    /* defer_fsdp_grad_sync is fsdp2 only */
    OK(2, D "defer_fsdp_grad_sync=false"),
    BAD(2, DDP D "defer_fsdp_grad_sync=false", "distributed.defer_fsdp_grad_sync: ",
        "is an fsdp2 option; strategy is ddp"),
    BAD(2, MEG D "defer_fsdp_grad_sync=false", "distributed.defer_fsdp_grad_sync: ",
        "is an fsdp2 option; strategy is megatron_fsdp"),
    OK(2, MEG D "defer_fsdp_grad_sync=true"), /* the default */
    /* reshard_after_forward is fsdp2 only */
    OK(2, D "reshard_after_forward=false"),
    BAD(2, DDP D "reshard_after_forward=false", "distributed.reshard_after_forward: ",
        "is an fsdp2 option; strategy is ddp"),
    BAD(2, MEG D "reshard_after_forward=false", "distributed.reshard_after_forward: ",
        "is an fsdp2 option; strategy is megatron_fsdp"),
    /* expert parallelism */
    OK(4, D "ep_size=2;model.num_experts=4"),
    OK(4, D "cp_size=2;" D "ep_size=4;model.num_experts=8"),
    BAD(4, D "ep_size=3;model.num_experts=6", "distributed.ep_size: ",
        "dp_size x cp_size = 4 x 1 = 4 is not divisible by ep_size 3"),
    BAD(4, D "ep_size=2", "distributed.ep_size: ",
        "ep_size 2 needs a MoE model (model.num_experts > 0)"),
    BAD(4, D "ep_size=4;model.num_experts=6", "model.num_experts: ",
        "6 experts do not split evenly over ep_size 4"),
    /* pp_size > 1 needs a pipeline: block */
    OK(2, PP2 "1f1b"),
    BAD(2, D "pp_size=2", "distributed.pp_size: ",
        "pp_size 2 needs a `pipeline:` block under distributed:"),
    /* layers split evenly over the stages */
    OK(2, PP2 "interleaved_1f1b"),
    BAD(2, PP2 "1f1b;model.num_hidden_layers=3", "model.num_hidden_layers: ",
        "3 layers do not split evenly over 2 stages (pp_size 2 x 1 per rank for 1f1b)"),
    BAD(2, PP2 "looped_bfs;model.num_hidden_layers=6", "model.num_hidden_layers: ",
        "6 layers do not split evenly over 4 stages (pp_size 2 x 2 per rank for looped_bfs)"),
    /* layers_per_stage: the stage count is a multiple of pp_size */
    OK(2, PP2 "1f1b" LPS "2"),
    OK(2, PP2 "1f1b" LPS "3"), /* 3 + 1 */
    BAD(2, PP2 "1f1b" LPS "4", "distributed.pipeline.layers_per_stage: ",
        "4 layers at 4 per stage make 1 stages, not a multiple of pp_size 2"),
    BAD(2, PP2 "1f1b;model.num_hidden_layers=6" LPS "2", "distributed.pipeline.layers_per_stage: ",
        "6 layers at 2 per stage make 3 stages"),
    /* interleaved_1f1b, looped_bfs, dfs: at least 2 stages per rank */
    OK(2, PP2 "dfs" LPS "1"),
    OK(2, PP2 "looped_bfs;model.num_hidden_layers=8" LPS "1"),
    BAD(2, PP2 "interleaved_1f1b" LPS "2", "distributed.pipeline.pp_schedule: ",
        "interleaved_1f1b needs at least 2 stages per rank, layers_per_stage gives 1"),
    BAD(2, PP2 "looped_bfs" LPS "2", "distributed.pipeline.pp_schedule: ",
        "looped_bfs needs at least 2 stages per rank"),
    BAD(2, PP2 "dfs" LPS "2", "distributed.pipeline.pp_schedule: ",
        "dfs needs at least 2 stages per rank"),
    /* tied embeddings: first and last stage on one rank (the V) */
    OK(2, PP2 "v_schedule;model.tie_word_embeddings=true"),
    BAD(2, PP2 "1f1b;model.tie_word_embeddings=true", "model.tie_word_embeddings: ",
        "tied embeddings need the first and the last pipeline stage on one rank (1f1b puts "
        "them on pipeline ranks 0 and 1)"),
    /* the split backward keeps activations: no activation checkpointing */
    OK(2, PP2 "1f1b;" D "activation_checkpointing=true"),
    BAD(2, PP2 "zero_bubble;" D "activation_checkpointing=true",
        "distributed.activation_checkpointing: ", "zero_bubble defers weight gradients"),
    BAD(2, PP2 "v_schedule;" D "activation_checkpointing=true",
        "distributed.activation_checkpointing: ", "v_schedule defers weight gradients"),
    /* v_schedule: exactly 2 stages per rank */
    OK(2, PP2 "v_schedule"),
    OK(2, PP2 "v_schedule" LPS "1"),
    BAD(2, PP2 "v_schedule;model.num_hidden_layers=8" LPS "1",
        "distributed.pipeline.pp_schedule: ",
        "v_schedule needs exactly 2 stages per rank, layers_per_stage gives 4"),
    BAD(2, PP2 "v_schedule" LPS "2", "distributed.pipeline.pp_schedule: ",
        "v_schedule needs exactly 2 stages per rank, layers_per_stage gives 1"),
    /* interleaved_1f1b walks microbatches in rounds of pp_size */
    BAD(4, D "pp_size=4;" D "pipeline.pp_schedule=interleaved_1f1b;model.num_hidden_layers=8",
        "distributed.pipeline.pp_schedule: ",
        "interleaved_1f1b needs the number of microbatches (2 = local_batch_size / "
        "pp_microbatch_size) to be a multiple of pp_size 4"),
    OK(4, D "pp_size=4;" D "pipeline.pp_schedule=dfs;model.num_hidden_layers=8"),
    /* gpipe, 1f1b, zero_bubble: one stage per rank */
    OK(2, PP2 "gpipe"),
    OK(2, PP2 "zero_bubble" LPS "2"),
    BAD(2, PP2 "gpipe" LPS "1", "distributed.pipeline.pp_schedule: ",
        "gpipe runs 1 stage per rank, layers_per_stage gives 2; use interleaved_1f1b"),
    BAD(2, PP2 "1f1b" LPS "1", "distributed.pipeline.pp_schedule: ",
        "1f1b runs 1 stage per rank"),
    BAD(2, PP2 "zero_bubble" LPS "1", "distributed.pipeline.pp_schedule: ",
        "zero_bubble runs 1 stage per rank"),
    /* pp_microbatch_size divides local_batch_size */
    OK(2, PP2 "1f1b;" D "pipeline.pp_microbatch_size=2"),
    OK(1, D "pipeline.pp_microbatch_size=4"), /* ignored with pp_size 1 */
    BAD(2, PP2 "1f1b;" D "pipeline.pp_microbatch_size=4",
        "distributed.pipeline.pp_microbatch_size: ",
        "4 does not divide step_scheduler.local_batch_size 2"),
    /* packed sequences: local_batch_size 1, 2 x cp divides the row */
    OK(1, "packed_sequence.packed_sequence_size=128;step_scheduler.local_batch_size=1"),
    BAD(1, "packed_sequence.packed_sequence_size=64", "step_scheduler.local_batch_size: ",
        "packed sequences need local_batch_size 1 (got 2)"),
    OK(2, D "cp_size=2;packed_sequence.packed_sequence_size=128;step_scheduler.local_batch_size=1"),
    BAD(2, D "cp_size=2;packed_sequence.packed_sequence_size=66;step_scheduler.local_batch_size=1",
        "packed_sequence.packed_sequence_size: ", "66 is not divisible by 2 x cp_size = 4"),
    /* seq_length divisible by 2 x cp without packing */
    OK(4, D "cp_size=4"),
    OK(2, D "cp_size=2;dataset.seq_length=66;packed_sequence.packed_sequence_size=64;"
             "step_scheduler.local_batch_size=1"),
    BAD(2, D "cp_size=2;dataset.seq_length=66", "dataset.seq_length: ",
        "66 is not divisible by 2 x cp_size = 4: load-balanced causal sharding"),
    /* tp divides the heads and MLP widths */
    OK(2, D "tp_size=2"),
    BAD(4, D "tp_size=4;model.num_attention_heads=2;model.num_key_value_heads=none",
        "model.num_attention_heads: ", "2 is not divisible by tp_size 4"),
    BAD(4, D "tp_size=4", "model.num_key_value_heads: ", "2 is not divisible by tp_size 4"),
    BAD(2, D "tp_size=2;model.intermediate_size=129", "model.intermediate_size: ",
        "129 is not divisible by tp_size 2"),
    OK(2, D "tp_size=2;model.moe_intermediate_size=129"), /* dense: not used */
    /* MoE under TP: whole experts, each TP rank routes N / tp tokens */
    OK(2, D "tp_size=2;model.num_experts=4;model.moe_intermediate_size=129"),
    OK(2, D "tp_size=2;model.num_experts=4;dataset.seq_length=33"), /* 2 rows: 66 tokens */
    BAD(2, D "tp_size=2;model.num_experts=4;dataset.seq_length=33;"
        "step_scheduler.local_batch_size=1", "distributed.tp_size: ",
        "the 33 tokens of a micro-batch (1 rows of 33 per CP rank) do not split over tp_size 2"),
    /* sequence_parallel: tp > 1, sequence divisible by tp */
    OK(2, D "tp_size=2;" D "sequence_parallel=true"),
    BAD(1, D "sequence_parallel=true", "distributed.sequence_parallel: ", "needs tp_size > 1"),
    BAD(2, D "tp_size=2;" D "sequence_parallel=true;dataset.seq_length=65",
        "distributed.sequence_parallel: ",
        "the sequence (seq_length 65, 65 per CP rank) is not divisible by tp_size 2"),
    BAD(8, D "tp_size=4;" D "cp_size=2;" D "sequence_parallel=true;model.num_key_value_heads=none;"
           "packed_sequence.packed_sequence_size=12;step_scheduler.local_batch_size=1",
        "distributed.sequence_parallel: ",
        "the sequence (packed_sequence_size 12, 6 per CP rank) is not divisible by tp_size 4"),
    /* global_batch_size divisible by local x dp */
    OK(4, NULL),
    BAD(4, "step_scheduler.global_batch_size=12", "step_scheduler.global_batch_size: ",
        "12 is not divisible by local_batch_size x dp_size = 2 x 4 = 8"),
    /* model shape */
    OK(1, "model.num_key_value_heads=1"),
    BAD(1, "model.hidden_size=66", "model.hidden_size: ",
        "66 is not divisible by num_attention_heads (4)"),
    BAD(1, "model.num_key_value_heads=3", "model.num_key_value_heads: ",
        "num_attention_heads (4) is not divisible by num_key_value_heads (3)"),
    /* integer ranges */
    BAD(1, "model.hidden_size=0", "model.hidden_size: ", "must be positive, got 0"),
    BAD(1, "model.num_hidden_layers=-2", "model.num_hidden_layers: ", "must be positive, got -2"),
    BAD(1, "model.num_key_value_heads=0", "model.num_key_value_heads: ", "must be positive, got 0"),
    BAD(1, D "dp_replicate_size=0", "distributed.dp_replicate_size: ", "must be positive, got 0"),
    BAD(1, D "tp_size=0", "distributed.tp_size: ", "must be positive, got 0"),
    BAD(1, "model.num_experts=-1", "model.num_experts: ", "must be at least 0, got -1"),
    BAD(1, "step_scheduler.ckpt_every_steps=-1", "step_scheduler.ckpt_every_steps: ",
        "must be at least 0, got -1"),
    /* float ranges */
    BAD(1, "model.rope_theta=0", "model.rope_theta: ", "must be positive, got 0"),
    OK(1, "model.rope_theta=1000000.0"),
    BAD(1, "model.rms_norm_eps=-1e-6", "model.rms_norm_eps: ", "must be positive, got -1e-06"),
    BAD(1, "model.initializer_range=0.0", "model.initializer_range: ", "must be positive, got 0"),
    OK(1, "model.router_aux_loss_coef=0.0"),
    BAD(1, "model.router_aux_loss_coef=-0.5", "model.router_aux_loss_coef: ",
        "must not be negative, got -0.5"),
    BAD(1, "optimizer.lr=0.0", "optimizer.lr: ", "must be positive, got 0"),
    BAD(1, "optimizer.eps=0.0", "optimizer.eps: ", "must be positive, got 0"),
    OK(1, "optimizer.weight_decay=0.1"),
    BAD(1, "optimizer.weight_decay=-0.1", "optimizer.weight_decay: ",
        "must not be negative, got -0.1"),
    OK(1, "optimizer.max_grad_norm=0.0"),
    BAD(1, "optimizer.max_grad_norm=-1.0", "optimizer.max_grad_norm: ",
        "must not be negative (0 disables clipping), got -1"),
    OK(1, "optimizer.betas=[0.0, 0.999]"),
    BAD(1, "optimizer.betas=[0.9, 1.0]", "optimizer.betas: ",
        "each beta must be in [0, 1), got 1"),
    BAD(1, "optimizer.betas=[-0.1, 0.95]", "optimizer.betas: ",
        "each beta must be in [0, 1), got -0.1"),
    OK(1, "lr_scheduler.min_lr=3e-4"), /* equal to optimizer.lr */
    BAD(1, "lr_scheduler.min_lr=-1e-5", "lr_scheduler.min_lr: ",
        "must be in [0, optimizer.lr = 0.0003], got -1e-05"),
    BAD(1, "lr_scheduler.min_lr=4e-4", "lr_scheduler.min_lr: ",
        "must be in [0, optimizer.lr = 0.0003], got 0.0004"),
    /* keep_last_n: 0 or at least 2 */
    OK(1, "checkpoint.keep_last_n=0"),
    OK(1, "checkpoint.keep_last_n=2"),
    BAD(1, "checkpoint.keep_last_n=1", "checkpoint.keep_last_n: ",
        "must be 0 (keep all) or at least 2, got 1"),
    /* model_save_format: safetensors; hdf5 only without a consolidated save */
    OK(1, "checkpoint.enabled=true;checkpoint.save_consolidated=final"),
    BAD(1, "checkpoint.save_consolidated=every", "checkpoint.save_consolidated: ",
        "every with checkpoint.enabled false: the consolidated directory is written beside a "
        "checkpoint, and none is"),
    OK(1, "checkpoint.model_save_format=hdf5"),
    BAD(1, "checkpoint.model_save_format=torch_save", "checkpoint.model_save_format: ",
        "torch_save (AutoModel's PyTorch pickle format) is not supported: meshtrain writes no "
        "pickles; use safetensors"),
    BAD(1, "checkpoint.enabled=true;checkpoint.model_save_format=hdf5;"
           "checkpoint.save_consolidated=true",
        "checkpoint.model_save_format: ", "hdf5 with save_consolidated every: the consolidated "
        "directory is Hugging Face safetensors"),
    /* app rules */
    OK_APP(MT_APP_MOE, 1, "model.num_experts=4"),
    BAD_APP(MT_APP_MOE, 1, NULL, "model.num_experts: ",
            "meshtrain-moe trains MoE models: set num_experts > 0"),
    OK_APP(MT_APP_DENSE, 1, NULL),
    BAD_APP(MT_APP_DENSE, 1, "model.num_experts=4", "model.num_experts: ",
            "meshtrain-dense trains dense models; num_experts = 4 is a MoE model"),
    OK_APP(MT_APP_CP, 1, NULL),
    BAD_APP(MT_APP_CP, 1, "model.num_experts=4", "model.num_experts: ",
            "meshtrain-cp trains dense models; num_experts = 4 is a MoE model"),
    OK_APP(MT_APP_ANY, 1, "model.num_experts=4"),
    /* num_experts_per_tok <= num_experts */
    OK(1, "model.num_experts=4;model.num_experts_per_tok=4"),
    OK(1, "model.num_experts_per_tok=8"), /* dense: not used */
    BAD(1, "model.num_experts=4;model.num_experts_per_tok=8", "model.num_experts_per_tok: ",
        "8 exceeds num_experts (4)"),
    /* dataset.paths: one spelling, well-formed blends */
    OK(1, "dataset.paths=[a.bin, b.bin]"),
    OK(1, "dataset.paths=[30, a, 70, b0, b1];dataset.validation_paths=[1, v]"),
    BAD(1, "dataset.path=x.bin;dataset.paths=[a.bin]", "dataset.paths: ",
        "is set together with dataset.path: give one of them"),
    BAD(1, "dataset.validation_path=x.bin;dataset.validation_paths=[a.bin]",
        "dataset.validation_paths: ", "is set together with dataset.validation_path"),
    BAD(1, "dataset.paths=[1, a, -2, b]", "dataset.paths: ",
        "item 2: weight -2: a blend weight must be a positive number"),
    BAD(1, "dataset.paths=[0, a]", "dataset.paths: ", "item 0: weight 0: a blend weight"),
    BAD(1, "dataset.paths=[a, 1, b]", "dataset.paths: ", "item 0: \"a\": a blend starts with"),
    BAD(1, "dataset.validation_paths=[1, a, 2]", "dataset.validation_paths: ",
        "item 2: weight 2 is not followed by a path"),
};

static void test_rule_table(void)
{
    for (size_t i = 0; i < sizeof rule_cases / sizeof rule_cases[0]; i++) {
        const rule_case_t *c = &rule_cases[i];
        if (c->path)
            expect_err(NULL, c->ovr, c->world, NULL, c->app, c->path, c->text);
        else
            expect_ok(NULL, c->ovr, c->world, NULL, c->app);
    }
}

/* ------------------------------------------------------------------ */
/* warnings: ignored blocks                                             */

/* Validate with a warning stream; the case must pass.  needles NULL: no
 * warning at all. */
static void expect_warning(const char *yaml, const char *ovr, int64_t world, const char *needle1,
                           const char *needle2)
{
    char buf[2048] = "";
    FILE *f = tmpfile();
    CHECK(f != NULL, "tmpfile failed");
    if (!f || !load(yaml, ovr)) {
        if (f)
            fclose(f);
        return;
    }
    mt_status_t s = validate(world, NULL, MT_APP_ANY, f);
    CHECK(s == MT_OK, "a warning must not fail validation: %s", mt_error_message());
    rewind(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    if (!needle1) {
        CHECK(n == 0, "expected no warning, got:\n%s", buf);
        return;
    }
    CHECK_CONTAINS(buf, needle1);
    if (needle2)
        CHECK_CONTAINS(buf, needle2);
}

static void test_warnings(void)
{
    char loc[64];
    int b = base_lines();

    expect_warning("distributed:\n  moe:\n    reshard_after_forward: true\n", NULL, 1,
                   "warning: ", "distributed.moe: ignored because ep_size is 1");
    snprintf(loc, sizeof loc, "test.yaml:%d:3: distributed.moe", b + 2);
    expect_warning("distributed:\n  moe:\n    reshard_after_forward: true\n", NULL, 1, loc, NULL);
    expect_warning(NULL, D "moe.wrap_outer_model=false", 1,
                   "override 'distributed.moe.wrap_outer_model=false'",
                   "distributed.moe: ignored because ep_size is 1");
    expect_warning("distributed:\n  ep_size: 2\n  moe:\n    reshard_after_forward: true\n",
                   "model.num_experts=4", 2, NULL, NULL);

    expect_warning("distributed:\n  pipeline:\n    pp_microbatch_size: 2\n", NULL, 1,
                   "warning: ", "distributed.pipeline: ignored because pp_size is 1");
    snprintf(loc, sizeof loc, "test.yaml:%d:3: distributed.pipeline", b + 2);
    expect_warning("distributed:\n  pipeline:\n    pp_microbatch_size: 2\n", NULL, 1, loc, NULL);
    expect_warning("distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: gpipe\n", NULL, 2,
                   NULL, NULL);
    expect_warning(NULL, NULL, 1, NULL, NULL);
}

/* ------------------------------------------------------------------ */
/* pp_schedule names are checked when parsing                           */

static void test_schedule_names(void)
{
    char text[2048], loc[64];
    mt_config_init(&cfg);
    snprintf(text, sizeof text, "%sdistributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: 1f1c\n",
             base_yaml);
    mt_status_t s = mt_config_load_string(&cfg, text, "test.yaml");
    CHECK(s == MT_ERR_CONFIG, "unknown pp_schedule must fail to parse");
    CHECK_CONTAINS(mt_error_message(), "distributed.pipeline.pp_schedule: expected one of");
    CHECK_CONTAINS(mt_error_message(), "did you mean 1f1b?");
    snprintf(loc, sizeof loc, "test.yaml:%d:18: ", base_lines() + 4);
    CHECK_CONTAINS(mt_error_message(), loc);

    mt_config_init(&cfg);
    s = mt_config_override(&cfg, D "pipeline.pp_schedule=interleaved_1f1");
    CHECK(s == MT_ERR_CONFIG, "unknown pp_schedule override must fail");
    CHECK_CONTAINS(mt_error_message(), "did you mean interleaved_1f1b?");

    /* The alias parses to the canonical schedule. */
    if (load("distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: interleaved1f1b\n",
             NULL)) {
        CHECK(cfg.distributed.pipeline.pp_schedule == MT_PP_INTERLEAVED_1F1B, "alias value");
        CHECK(strcmp(mt_pp_schedule_name(cfg.distributed.pipeline.pp_schedule),
                     "interleaved_1f1b") == 0, "canonical name");
        CHECK(validate(2, NULL, MT_APP_ANY, NULL) == MT_OK, "alias validates: %s",
              mt_error_message());
        CHECK(cfg.derived.num_stages == 4 && cfg.derived.stages_per_rank == 2,
              "interleaved1f1b: %lld stages, %lld per rank", (long long)cfg.derived.num_stages,
              (long long)cfg.derived.stages_per_rank);
    }
}

/* ------------------------------------------------------------------ */
/* topology: a TP group stays inside one node                           */

static void test_topology(void)
{
    int by3[8], by4[8], by2[8], rr[8];
    for (int r = 0; r < 8; r++)
        by3[r] = r / 3, by4[r] = r / 4, by2[r] = r / 2, rr[r] = r % 2;

    /* nodes of 3, 3, 2 ranks: ranks 2 and 3 are on different nodes */
    expect_err(NULL, D "tp_size=2", 8, by3, MT_APP_ANY, "distributed.tp_size: ",
               "the TP group of ranks 2-3 spans two nodes");
    expect_err(NULL, D "tp_size=2", 8, by3, MT_APP_ANY, "rank 2 and rank 3 are on different nodes",
               "2 ranks on the smallest node");
    expect_err(NULL, D "tp_size=2", 8, rr, MT_APP_ANY, "distributed.tp_size: ",
               "the TP group of ranks 0-1 spans two nodes");
    expect_err(NULL, D "tp_size=4;model.num_key_value_heads=none", 8, by2, MT_APP_ANY,
               "distributed.tp_size: ", "the TP group of ranks 0-3 spans two nodes");

    expect_ok(NULL, D "tp_size=4;model.num_key_value_heads=none", 8, by4, MT_APP_ANY);
    CHECK(cfg.derived.num_nodes == 2 && cfg.derived.ranks_per_node == 4,
          "r/4: %lld nodes of %lld", (long long)cfg.derived.num_nodes,
          (long long)cfg.derived.ranks_per_node);
    expect_ok(NULL, D "tp_size=2", 8, by4, MT_APP_ANY);
    expect_ok(NULL, NULL, 8, by3, MT_APP_ANY); /* tp 1 never spans */
    CHECK(cfg.derived.num_nodes == 3 && cfg.derived.ranks_per_node == 2,
          "r/3: %lld nodes, smallest %lld", (long long)cfg.derived.num_nodes,
          (long long)cfg.derived.ranks_per_node);
    expect_ok(NULL, D "tp_size=4;model.num_key_value_heads=none", 8, NULL, MT_APP_ANY);
    CHECK(cfg.derived.num_nodes == 1 && cfg.derived.ranks_per_node == 8,
          "NULL nodes: one node of 8");
}

/* ------------------------------------------------------------------ */
/* derived sizes                                                        */

#define CHECK_DERIVED(field, want)                                                   \
    CHECK(cfg.derived.field == (want), "derived." #field " = %lld, want %lld",      \
          (long long)cfg.derived.field, (long long)(want))

static void test_derived(void)
{
    expect_ok(NULL, NULL, 4, NULL, MT_APP_ANY);
    CHECK_DERIVED(world_size, 4);
    CHECK_DERIVED(dp_size, 4);
    CHECK_DERIVED(dp_replicate, 1);
    CHECK_DERIVED(dp_shard, 4);
    CHECK_DERIVED(ep_shard, 1);
    CHECK_DERIVED(grad_accum_steps, 2);
    CHECK_DERIVED(seq_len, 64);
    CHECK_DERIVED(padded_vocab, 256);
    CHECK_DERIVED(head_dim, 16);
    CHECK_DERIVED(num_stages, 1);
    CHECK_DERIVED(stages_per_rank, 1);
    CHECK_DERIVED(num_microbatches, 1);
    CHECK(cfg.model.num_key_value_heads.value == 2, "explicit kv heads kept");

    /* HSDP 2 x 2 */
    expect_ok(NULL, D "dp_replicate_size=2", 4, NULL, MT_APP_ANY);
    CHECK_DERIVED(dp_size, 4);
    CHECK_DERIVED(dp_replicate, 2);
    CHECK_DERIVED(dp_shard, 2);

    /* tp and cp shrink dp */
    expect_ok(NULL, D "tp_size=2;" D "cp_size=2", 8, NULL, MT_APP_ANY);
    CHECK_DERIVED(dp_size, 2);
    CHECK_DERIVED(dp_shard, 2);
    CHECK_DERIVED(grad_accum_steps, 4);

    /* expert shards: dp x cp / ep */
    expect_ok(NULL, D "ep_size=2;model.num_experts=4", 4, NULL, MT_APP_MOE);
    CHECK_DERIVED(ep_shard, 2);
    expect_ok(NULL, D "cp_size=2;" D "ep_size=4;model.num_experts=8", 4, NULL, MT_APP_MOE);
    CHECK_DERIVED(dp_size, 2);
    CHECK_DERIVED(ep_shard, 1);

    /* pipeline stages and microbatches */
    expect_ok(NULL, PP2 "interleaved_1f1b", 4, NULL, MT_APP_ANY);
    CHECK_DERIVED(dp_size, 2);
    CHECK_DERIVED(num_stages, 4);
    CHECK_DERIVED(stages_per_rank, 2);
    CHECK_DERIVED(num_microbatches, 2);
    expect_ok(NULL, PP2 "1f1b" LPS "3;" D "pipeline.pp_microbatch_size=2", 2, NULL, MT_APP_ANY);
    CHECK_DERIVED(num_stages, 2);
    CHECK_DERIVED(stages_per_rank, 1);
    CHECK_DERIVED(num_microbatches, 1);
    expect_ok(NULL, PP2 "dfs;model.num_hidden_layers=8" LPS "1", 2, NULL, MT_APP_ANY);
    CHECK_DERIVED(num_stages, 8);
    CHECK_DERIVED(stages_per_rank, 4);

    /* packing sets the sequence length */
    expect_ok(NULL, "packed_sequence.packed_sequence_size=128;step_scheduler.local_batch_size=1",
              2, NULL, MT_APP_ANY);
    CHECK_DERIVED(seq_len, 128);
    CHECK_DERIVED(grad_accum_steps, 8);

    /* num_key_value_heads: none resolves to num_attention_heads */
    expect_ok(NULL, "model.num_key_value_heads=none", 1, NULL, MT_APP_ANY);
    CHECK(cfg.model.num_key_value_heads.set && cfg.model.num_key_value_heads.value == 4,
          "kv heads none -> %lld (set %d), want 4", (long long)cfg.model.num_key_value_heads.value,
          (int)cfg.model.num_key_value_heads.set);

    /* vocab padding to a multiple of tp is not an error */
    expect_ok(NULL, "model.vocab_size=250;" D "tp_size=4;model.num_key_value_heads=none", 4, NULL,
              MT_APP_ANY);
    CHECK_DERIVED(padded_vocab, 252);
    expect_ok(NULL, "model.vocab_size=250", 1, NULL, MT_APP_ANY);
    CHECK_DERIVED(padded_vocab, 250);

    /* world size must be positive: a caller bug, not a config error */
    if (load(NULL, NULL))
        CHECK(validate(0, NULL, MT_APP_ANY, NULL) == MT_ERR_RANGE, "world 0 is MT_ERR_RANGE");
}

/* ------------------------------------------------------------------ */
/* locations and several violations                                     */

static int count_lines(const char *s)
{
    int n = *s ? 1 : 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static void test_locations(void)
{
    char loc[128];
    int b = base_lines();

    /* a key set in the file: FILE:LINE:COL of its value */
    snprintf(loc, sizeof loc, "test.yaml:%d:12: distributed.tp_size: ddp is data", b + 3);
    expect_err("distributed:\n  strategy: ddp\n  tp_size: 2\n", NULL, 2, NULL, MT_APP_ANY, loc,
               NULL);
    /* the world-size rule points at the mesh size that was set */
    snprintf(loc, sizeof loc, "test.yaml:%d:12: distributed.tp_size: world size 5", b + 2);
    expect_err("distributed:\n  tp_size: 2\n", NULL, 5, NULL, MT_APP_ANY, loc, NULL);
    /* a key from the base file */
    snprintf(loc, sizeof loc, "test.yaml:%d:16: model.hidden_size: 64 is not divisible", 3);
    expect_err(NULL, "model.num_attention_heads=3;model.num_key_value_heads=none", 1, NULL,
               MT_APP_ANY, loc, NULL);
    /* an override */
    expect_err(NULL, DDP D "tp_size=3;model.num_attention_heads=3;model.hidden_size=48;"
                         "model.num_key_value_heads=none;model.intermediate_size=129",
               3, NULL, MT_APP_ANY,
               "override 'distributed.tp_size=3': distributed.tp_size: ddp is data parallelism",
               NULL);
    expect_err(NULL, D "tp_size=3", 4, NULL, MT_APP_ANY,
               "override 'distributed.tp_size=3': distributed.tp_size: world size 4",
               "(tp_size from override 'distributed.tp_size=3')");
    /* all violated rules are reported, also when the world size is wrong */
    expect_err(NULL, DDP D "tp_size=2", 5, NULL, MT_APP_ANY, "world size 5 is not divisible",
               "ddp is data parallelism only; tp_size = 2");
    /* a default */
    expect_err(NULL, "model.num_experts=1", 1, NULL, MT_APP_ANY,
               "test.yaml: (default) model.num_experts_per_tok: 2 exceeds num_experts (1)", NULL);
}

static void test_many_violations(void)
{
    /* three independent rules on one config: all three lines */
    if (load(NULL, "model.hidden_size=66;" DDP D "tp_size=2;step_scheduler.global_batch_size=6")) {
        CHECK(validate(4, NULL, MT_APP_ANY, NULL) == MT_ERR_CONFIG, "expected errors");
        const char *msg = mt_error_message();
        CHECK_CONTAINS(msg, "model.hidden_size: 66 is not divisible by num_attention_heads");
        CHECK_CONTAINS(msg, "distributed.tp_size: ddp is data parallelism only");
        CHECK_CONTAINS(msg, "step_scheduler.global_batch_size: 6 is not divisible");
        CHECK(count_lines(msg) == 3, "want 3 lines, got %d:\n%s", count_lines(msg), msg);
    }
    /* range errors are all reported, and stop the cross-key rules */
    if (load(NULL, "model.hidden_size=0;optimizer.lr=0.0;checkpoint.keep_last_n=1;"
                   "model.num_key_value_heads=3")) {
        CHECK(validate(1, NULL, MT_APP_ANY, NULL) == MT_ERR_CONFIG, "expected errors");
        const char *msg = mt_error_message();
        CHECK_CONTAINS(msg, "model.hidden_size: must be positive");
        CHECK_CONTAINS(msg, "optimizer.lr: must be positive");
        CHECK_CONTAINS(msg, "checkpoint.keep_last_n: must be 0");
        CHECK(count_lines(msg) == 3, "want 3 lines, got %d:\n%s", count_lines(msg), msg);
    }
    /* the app, pipeline, sequence and tp rules together */
    if (load(NULL, "model.num_experts=4;" PP2 "gpipe" LPS "1;" D "cp_size=2;"
                   "dataset.seq_length=66")) {
        CHECK(validate(4, NULL, MT_APP_DENSE, NULL) == MT_ERR_CONFIG, "expected errors");
        const char *msg = mt_error_message();
        CHECK_CONTAINS(msg, "model.num_experts: meshtrain-dense trains dense models");
        CHECK_CONTAINS(msg, "distributed.pipeline.pp_schedule: gpipe runs 1 stage per rank");
        CHECK_CONTAINS(msg, "dataset.seq_length: 66 is not divisible by 2 x cp_size = 4");
        CHECK(count_lines(msg) == 3, "want 3 lines, got %d:\n%s", count_lines(msg), msg);
    }
}

int main(void)
{
    test_rule_table();
    test_warnings();
    test_schedule_names();
    test_topology();
    test_derived();
    test_locations();
    test_many_violations();
    return mt_test_exit("test_config_validate");
}
