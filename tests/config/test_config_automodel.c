/* test_config_automodel: AutoModel recipe YAMLs, table-driven.  Each row
 * is a recipe-shaped config and what meshtrain makes of it: the keys it
 * maps and their values, the keys it ignores (the one "ignored" line), or
 * the one reason it refuses the recipe.  Rows cover every class of the
 * table in config_automodel.c (doc/automodel-recipes.md).  No MPI. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"
#include "mt_config.h"
#include "mt_pp_exec.h"
#include "mt_test.h"

/* a small dense model, so validation has sizes; rows add their own keys */
#define MODEL                                                                           \
    "model:\n"                                                                          \
    "  _target_: nemo_automodel.NeMoAutoModelForCausalLM.from_config\n"                 \
    "  vocab_size: 256\n  hidden_size: 64\n  intermediate_size: 128\n"                  \
    "  num_attention_heads: 4\n"
#define HEADL "recipe: TrainFinetuneRecipeForNextTokenPrediction\n" MODEL
#define HEAD HEADL "  num_hidden_layers: 4\n"
#define NOREC MODEL "  num_hidden_layers: 4\n"

typedef struct {
    const char *name;
    const char *yaml;
    int world;
    const char *error;   /* NULL: valid; else a substring of the one message */
    const char *values;  /* "path=value;..." checked after validation */
    const char *ignored; /* substring of the ignored note, or NULL */
    const char *note;    /* substring of the warnings (data refusal, ...), or NULL */
} row_t;

static const row_t rows[] = {
    /* ---- the one reason first ---- */
    {"vlm recipe", "recipe: FinetuneRecipeForVLM\nmodel:\n  _target_: x.NeMoAutoModelForImageTextToText.from_pretrained\n"
     "peft:\n  dim: 8\nbogus_key: 1\n", 1, "recipe FinetuneRecipeForVLM: vision-language models are not supported", NULL, NULL, NULL},
    {"vlm model", "model:\n  _target_: nemo_automodel.NeMoAutoModelForImageTextToText.from_pretrained\n"
     "  pretrained_model_name_or_path: Qwen/Qwen2.5-VL-3B-Instruct\n", 1,
     "NeMoAutoModelForImageTextToText.from_pretrained: vision-language models are not supported", NULL, NULL, NULL},
    {"diffusion", "flow_matching:\n  x: 1\nunknown_thing: 2\n", 1, "flow_matching: diffusion models are not supported", NULL, NULL, NULL},
    {"kd", "recipe: KnowledgeDistillationRecipeForNextTokenPrediction\n", 1,
     "knowledge distillation is not supported", NULL, NULL, NULL},
    {"eagle", "recipe: TrainEagle3Recipe\n", 1, "speculative-decoding draft training", NULL, NULL, NULL},
    {"peft is LoRA, not a reason", HEAD "peft:\n  _target_: nemo_automodel.components._peft.lora.PeftConfig\n"
     "  dim: 8\n  alpha: 32\n  target_modules: ['*.q_proj']\n"
     "dataset:\n  _target_: x.make_squad_dataset\n", 1, "peft: LoRA trains adapters on a pretrained base", NULL, NULL, NULL},
    {"fp8 enabled", HEAD "fp8:\n  enabled: true\n", 1, "fp8: FP8 training is not supported", NULL, NULL, NULL},
    {"fp8 disabled is not a reason", HEAD "fp8:\n  enabled: false\n", 1, "fp8: FP8 training", NULL, NULL, NULL},
    {"seq cls", "recipe: TrainFinetuneRecipeForSequenceClassification\n", 1,
     "sequence classification is not supported", NULL, NULL, NULL},
    /* ---- ignored: listed once ---- */
    {"ignored keys", HEAD "ci:\n  recipe_owner: x\nwandb:\n  project: p\ndist_env:\n  backend: nccl\n"
     "compile:\n  enabled: false\nrng:\n  _target_: x.StatefulRNG\n  seed: 7\n  ranked: true\n", 1, NULL,
     "rng.seed=7", "ci, wandb, dist_env.backend, compile, rng._target_, rng.ranked", NULL},
    /* ---- mapped ---- */
    {"seed", HEAD "seed: 1234\n", 1, NULL, "rng.seed=1234", NULL, NULL},
    {"timeout minutes", HEAD "dist_env:\n  timeout_minutes: 1.5\n", 1, NULL, "distributed.timeout_s=90", NULL, NULL},
    {"clip", HEAD "clip_grad_norm:\n  max_norm: 0.5\n", 1, NULL, "optimizer.max_grad_norm=0.5", NULL, NULL},
    {"restore_from", HEAD "checkpoint:\n  restore_from: ckpt/step_10\n", 1, NULL, "checkpoint.resume=ckpt/step_10", NULL, NULL},
    {"recipe defaults", HEAD, 1, NULL,
     "checkpoint.enabled=true;distributed.mp_policy.param_dtype=bfloat16;distributed.mp_policy.reduce_dtype=float32;"
     "distributed.mp_policy.output_dtype=bfloat16;distributed.moe.ignore_router_for_ac=true;"
     "optimizer.decay_every_parameter=true;lr_scheduler.lr_decay_style=constant;optimizer.weight_decay=0.01;"
     "optimizer.betas=0.9,0.999;rng.seed=42;distributed.pipeline.balanced_split=true;distributed.device=auto", NULL, NULL},
    {"meshtrain defaults without recipe:", NOREC, 1, NULL,
     "checkpoint.enabled=false;distributed.mp_policy.param_dtype=float32;lr_scheduler.lr_decay_style=cosine;"
     "optimizer.decay_every_parameter=false", NULL, NULL},
    {"lr section: AutoModel's defaults", HEAD "optimizer:\n  lr: 1.0e-4\nstep_scheduler:\n  max_steps: 500\n"
     "lr_scheduler:\n  lr_decay_style: cosine\n", 1, NULL,
     "lr_scheduler.min_lr=1e-06;lr_scheduler.init_lr=1e-05;lr_scheduler.lr_warmup_steps=50;"
     "lr_scheduler.lr_decay_style=cosine;@lr_schedule=1", NULL, NULL},
    {"lr_decay_steps", HEAD "lr_scheduler:\n  lr_decay_steps: 40\n  lr_warmup_steps: 4\n  min_lr: 0\n", 1, NULL,
     "lr_scheduler.lr_decay_steps=40;lr_scheduler.lr_warmup_steps=4", NULL, NULL},
    {"WSD refused", HEAD "lr_scheduler:\n  lr_decay_style: WSD\n", 1, "WSD is not implemented", NULL, NULL, NULL},
    {"torch Adam: no decay by default", HEAD "optimizer:\n  _target_: torch.optim.Adam\n  lr: 1e-5\n", 1, NULL,
     "optimizer.weight_decay=0;@optimizer=2;optimizer.lr=1e-05", NULL, NULL},
    {"torch Adam L2 refused", HEAD "optimizer:\n  _target_: torch.optim.Adam\n  weight_decay: 0.1\n", 1,
     "is L2 regularisation", NULL, NULL, NULL},
    {"AdamW decays everything", HEAD "optimizer:\n  _target_: torch.optim.AdamW\n  weight_decay: 0.1\n"
     "  foreach: false\n", 1, NULL, "optimizer.weight_decay=0.1;optimizer.decay_every_parameter=true;@optimizer=1",
     "optimizer.foreach", NULL},
    {"FusedAdam adam_w_mode false + wd", HEAD "optimizer:\n  _target_: transformer_engine.pytorch.optimizers.fused_adam.FusedAdam\n"
     "  adam_w_mode: false\n  weight_decay: 0.1\n", 1, "is L2 regularisation", NULL, NULL, NULL},
    {"FusedAdam bf16 state refused", HEAD "optimizer:\n  _target_: transformer_engine.pytorch.optimizers.fused_adam.FusedAdam\n"
     "  exp_avg_dtype: torch.bfloat16\n", 1, "optimizer.exp_avg_dtype: torch.bfloat16 optimizer state", NULL, NULL, NULL},
    {"Muon refused", HEAD "optimizer:\n  _target_: dion.Muon\n  mu: 0.95\n  nesterov: true\n  scalar_lr: 1\n", 1, "dion.Muon is not supported", NULL, NULL, NULL},
    {"num_epochs", HEAD "step_scheduler:\n  num_epochs: 2\n  max_steps: 30\n", 1, NULL, "@num_epochs=2;step_scheduler.max_steps=30", NULL, NULL},
    {"max_steps null", HEAD "step_scheduler:\n  max_steps: null\n", 1, NULL, "@num_epochs=10;@max_steps_null=1", NULL,
     "max_steps is null"},
    {"null sizes, dp 0, dp_replicate 1", HEAD "distributed:\n  strategy: ddp\n  dp_size: 0\n  tp_size: null\n"
     "  cp_size: null\n  dp_replicate_size: 1\n", 4, NULL, "distributed.tp_size=1;distributed.dp_size=none;"
     "distributed.dp_replicate_size=none", NULL, NULL},
    {"strategy alias mfsdp", HEAD "distributed:\n  strategy: mfsdp\n", 2, NULL, "distributed.strategy=megatron_fsdp", NULL, NULL},
    {"strategy alias megatron-fsdp", HEAD "distributed:\n  strategy: megatron-fsdp\n", 2, NULL, "distributed.strategy=megatron_fsdp", NULL, NULL},
    {"strategy _target_", HEAD "distributed:\n  _target_: nemo_automodel.components.distributed.fsdp2.FSDP2Manager\n", 2,
     NULL, "distributed.strategy=fsdp2", NULL, NULL},
    {"activation_checkpointing full", HEAD "distributed:\n  activation_checkpointing: full\n", 1, NULL,
     "distributed.activation_checkpointing=true", NULL, NULL},
    {"activation_checkpointing selective", HEAD "distributed:\n  activation_checkpointing: selective\n", 1,
     "selective is not supported", NULL, NULL, NULL},
    {"reshard null", HEAD "distributed:\n  reshard_after_forward: null\n", 2, NULL, "distributed.reshard_after_forward=true",
     "reshard_after_forward: null", NULL},
    {"torch schedule names", HEAD "step_scheduler:\n  local_batch_size: 2\n  global_batch_size: 2\n"
     "distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: Interleaved1F1B\n    pp_microbatch_size: 1\n", 2, NULL, "distributed.pipeline.pp_schedule=interleaved_1f1b", NULL, NULL},
    {"ZBVZeroBubble", HEAD "distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: ZBVZeroBubble\n", 2, NULL,
     "distributed.pipeline.pp_schedule=v_schedule", NULL, NULL},
    {"LoopedBFS", HEAD "distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: LoopedBFS\n", 2, NULL,
     "distributed.pipeline.pp_schedule=looped_bfs", NULL, NULL},
    {"DualPipeV refused", HEAD "distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: DualPipeV\n", 2,
     "torch's DualPipeV is not implemented", NULL, NULL, NULL},
    {"InterleavedZeroBubble refused", HEAD "distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: InterleavedZeroBubble\n", 2,
     "InterleavedZeroBubble is not implemented", NULL, NULL, NULL},
    {"stage count not a pp multiple, no rounding", HEAD "distributed:\n  pp_size: 2\n  pipeline:\n"
     "    pp_schedule: 1f1b\n    layers_per_stage: 4\n    patch_inner_model: false\n", 2,
     "make 1 stages, not a multiple of pp_size 2", NULL, NULL, NULL},
    {"stage count rounded up", HEAD "distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: 1f1b\n"
     "    layers_per_stage: 4\n    round_virtual_stages_to_pp_multiple: up\n", 2, NULL,
     "@num_stages=2;@layers0=0-2;@layers1=2-4;distributed.pipeline.round_virtual_stages_to_pp_multiple=up", NULL, NULL},
    {"uneven split: the first stages one more", HEADL "  num_hidden_layers: 5\ndistributed:\n  pp_size: 2\n"
     "  pipeline:\n    pp_schedule: 1f1b\n", 2, NULL, "@num_stages=2;@layers0=0-3;@layers1=3-5", NULL, NULL},
    {"uneven split refused without a recipe", MODEL "  num_hidden_layers: 5\ndistributed:\n  pp_size: 2\n"
     "  pipeline:\n    pp_schedule: 1f1b\n", 2, "5 layers do not split evenly", NULL, NULL, NULL},
    {"model backend ignored", HEAD "  torch_dtype: bfloat16\n  backend:\n    _target_: x.BackendConfig\n    attn: te\n"
     "  trust_remote_code: true\n", 1, NULL, NULL, "master copies), model.backend, model.trust_remote_code", NULL},
    {"fake balanced gate refused", HEAD "  backend:\n    fake_balanced_gate: true\n", 1, "fake_balanced_gate", NULL, NULL, NULL},
    {"save_consolidated final", HEAD "checkpoint:\n  save_consolidated: final\n  model_save_format: safetensors\n", 1, NULL,
     "checkpoint.save_consolidated=final", NULL, NULL},
    {"torch_save refused", HEAD "checkpoint:\n  save_consolidated: true\n  model_save_format: torch_save\n", 1,
     "torch_save", NULL, NULL, NULL},
    {"load_base_model false refused", HEAD "  load_base_model: false\n", 1, "model.load_base_model: false is not supported: for random weights", NULL, NULL, NULL},
    {"load_base_model true", HEAD "  load_base_model: true\n", 1, NULL, NULL, "model.load_base_model", NULL},
    {"autocast bf16", NOREC "autocast:\n  enabled: true\n  dtype: bfloat16\n", 1, NULL,
     "distributed.mp_policy.param_dtype=bfloat16", NULL, NULL},
    {"FusedAdam remainders and fp32 state", HEAD "optimizer:\n  _target_: transformer_engine.pytorch.optimizers.FusedAdam\n"
     "  master_weights: true\n  store_param_remainders: true\n  exp_avg_dtype: torch.float32\n", 1, NULL,
     "@optimizer=3;optimizer.weight_decay=0", "optimizer.master_weights, optimizer.store_param_remainders, optimizer.exp_avg_dtype", NULL},
    {"lm_head_precision float32", HEAD "distributed:\n  moe:\n    lm_head_precision: float32\n", 1, NULL,
     "distributed.mp_policy.output_dtype=float32", NULL, NULL},
    {"torch_save without consolidated copies", HEAD "checkpoint:\n  save_consolidated: false\n  model_save_format: torch_save\n", 1,
     NULL, "checkpoint.model_save_format=hdf5", "torch_save (checkpoints are HDF5)", NULL},
    {"meshtrain: section", HEAD "meshtrain:\n  distributed.device: cpu_guarded\n  logging.log_every_steps: 5\n", 1, NULL,
     "distributed.device=cpu_guarded;logging.log_every_steps=5", NULL, NULL},
    {"meshtrain: section typo", HEAD "meshtrain:\n  logging.log_every_step: 5\n", 1,
     "meshtrain.logging.log_every_step: unknown meshtrain key; did you mean logging.log_every_steps?", NULL, NULL, NULL},
    /* ---- datasets ---- */
    {"python dataset: plan ok, training refuses", HEAD "dataset:\n  _target_: nemo_automodel.components.datasets.llm.squad.make_squad_dataset\n"
     "  dataset_name: rajpurkar/squad\n  seq_length: 512\ndataloader:\n  _target_: x.StatefulDataLoader\n  shuffle: true\n", 1, NULL,
     "dataset.seq_length=512;dataset.shuffle=true;@data_refusal=1", "dataloader (but shuffle)",
     "make_squad_dataset is built by Python code: convert the data with meshtrain-data"},
    {"nanogpt file maps", HEAD "dataset:\n  _target_: x.nanogpt_dataset.NanogptDataset\n  file_pattern: data/train.bin\n"
     "  seq_len: 256\n", 1, NULL, "dataset.path=data/train.bin;dataset.format=llmc;dataset.seq_length=256;@data_refusal=0", NULL, NULL},
    {"nanogpt glob refused at training", HEAD "dataset:\n  _target_: x.NanogptDataset\n  file_pattern: data/train_*.bin\n", 1, NULL,
     "@data_refusal=1", NULL, "NanogptDataset is built by Python code"},
    /* ---- strict typo check ---- */
    {"typo in an AutoModel section", HEAD "dist_env:\n  timout_minutes: 3\n", 1, "dist_env.timout_minutes: unknown key; did you mean timeout_minutes?", NULL, NULL, NULL},
    {"typo of an AutoModel top-level key", HEAD "clip_grad_nrm:\n  max_norm: 1\n", 1, "did you mean clip_grad_norm?", NULL, NULL, NULL},
    {"typo in a meshtrain section", HEAD "step_scheduler:\n  num_epoch: 1\n", 1, "did you mean num_epochs?", NULL, NULL, NULL},
    {"unknown model key", HEAD "  bogus_field: 1\n", 1, "model.bogus_field: unknown key", NULL, NULL, NULL},
    /* ---- the expert-parallel rule ---- */
    {"ep over dp x cp x tp is refused by name", HEAD "  num_experts: 4\n  moe_intermediate_size: 32\n"
     "distributed:\n  tp_size: 2\n  ep_size: 4\n", 4, "AutoModel's rule, dp x cp x tp", NULL, NULL, NULL},
};

/* The value of key `path` as text (lists as "a,b"), or an automodel field. */
static void value_text(const mt_config_t *c, const char *path, char *buf, size_t cap)
{
    const mt_automodel_t *am = &c->automodel;
    if (strncmp(path, "@layers", 7) == 0) {
        int lo, hi;
        mt_pp_stage_layers(c, atoi(path + 7), &lo, &hi);
        snprintf(buf, cap, "%d-%d", lo, hi);
        return;
    }
    if (path[0] == '@') {
        long long v = strcmp(path, "@num_epochs") == 0      ? am->num_epochs
                      : strcmp(path, "@optimizer") == 0     ? am->optimizer
                      : strcmp(path, "@lr_schedule") == 0   ? am->lr_schedule
                      : strcmp(path, "@max_steps_null") == 0 ? am->max_steps_null
                      : strcmp(path, "@data_refusal") == 0  ? am->data_refusal[0] != 0
                      : strcmp(path, "@num_stages") == 0    ? c->derived.num_stages
                                                            : -999;
        snprintf(buf, cap, "%lld", v);
        return;
    }
    int ki = mt_cfg_key_index(path);
    if (ki < 0) {
        snprintf(buf, cap, "(no key %s)", path);
        return;
    }
    const mt_cfg_key_t *k = &mt_cfg_keys[ki];
    const char *base = (const char *)c + k->offset;
    switch (k->type) {
    case MT_T_INT: snprintf(buf, cap, "%lld", (long long)*(const int64_t *)base); break;
    case MT_T_OPT_INT: {
        const mt_opt_int_t *o = (const mt_opt_int_t *)base;
        if (o->set)
            snprintf(buf, cap, "%lld", (long long)o->value);
        else
            snprintf(buf, cap, "none");
        break;
    }
    case MT_T_FLOAT: snprintf(buf, cap, "%.12g", *(const double *)base); break;
    case MT_T_BOOL: snprintf(buf, cap, "%s", *(const bool *)base ? "true" : "false"); break;
    case MT_T_STRING: snprintf(buf, cap, "%s", base); break;
    case MT_T_ENUM: snprintf(buf, cap, "%s", mt_cfg_enum_canonical(k->enums, *(const int *)base)); break;
    case MT_T_FLOAT_LIST: {
        const double *d = (const double *)base;
        int n = *(const int *)((const char *)c + k->count_offset);
        size_t len = 0;
        buf[0] = '\0';
        for (int i = 0; i < n && len < cap; i++)
            len += (size_t)snprintf(buf + len, cap - len, "%s%g", i ? "," : "", d[i]);
        break;
    }
    }
}

static mt_config_t cfg;

static void run_row(const row_t *r)
{
    char warn[8192] = "";
    FILE *w = fmemopen(warn, sizeof warn - 1, "w");
    mt_config_init(&cfg);
    mt_status_t s = mt_config_load_string(&cfg, r->yaml, "recipe.yaml");
    if (s == MT_OK)
        s = mt_config_validate(&cfg, MT_APP_ANY, r->world, NULL, w);
    fclose(w);
    const char *msg = s == MT_OK ? "" : mt_error_message();
    if (r->error) {
        CHECK(s != MT_OK, "[%s] expected the error \"%s\", but it is valid", r->name, r->error);
        if (s != MT_OK) {
            CHECK(strstr(msg, r->error) != NULL, "[%s] expected \"%s\" in:\n%s", r->name, r->error, msg);
            /* the one reason: one line */
            if (strstr(r->name, "vlm") || strstr(r->name, "diffusion") ||
                strstr(r->name, "Muon"))
                CHECK(strchr(msg, '\n') == NULL, "[%s] expected one line, got:\n%s", r->name, msg);
        }
        return;
    }
    if (strcmp(r->name, "fp8 disabled is not a reason") == 0) {
        CHECK(s == MT_OK, "[%s] %s", r->name, msg);
        return;
    }
    CHECK(s == MT_OK, "[%s] expected valid, got:\n%s", r->name, msg);
    if (s != MT_OK)
        return;
    if (r->values) {
        char list[2048];
        snprintf(list, sizeof list, "%s", r->values);
        for (char *save = NULL, *kv = strtok_r(list, ";", &save); kv; kv = strtok_r(NULL, ";", &save)) {
            char *eq = strchr(kv, '=');
            *eq = '\0';
            char got[512];
            value_text(&cfg, kv, got, sizeof got);
            CHECK(strcmp(got, eq + 1) == 0, "[%s] %s: expected %s, got %s", r->name, kv, eq + 1, got);
        }
    }
    if (r->ignored) {
        CHECK_CONTAINS(warn, "ignored (AutoModel keys that cannot change the numerics): ");
        CHECK(strstr(cfg.automodel.ignored, r->ignored) != NULL, "[%s] expected \"%s\" in the ignored note \"%s\"",
              r->name, r->ignored, cfg.automodel.ignored);
    }
    if (r->note)
        CHECK(strstr(warn, r->note) != NULL, "[%s] expected \"%s\" in the warnings:\n%s", r->name, r->note, warn);
}

/* the four hints that pointed the wrong way, and AutoModel keys by override */
static void hints_and_overrides(void)
{
    mt_config_init(&cfg);
    CHECK(mt_config_override(&cfg, "seed=99") == MT_OK, "seed=99: %s", mt_error_message());
    CHECK(cfg.rng.seed == 99, "seed=99 sets rng.seed, got %lld", (long long)cfg.rng.seed);
    CHECK(mt_config_override(&cfg, "dist_env.timeout_minutes=2") == MT_OK, "%s", mt_error_message());
    CHECK(cfg.distributed.timeout_s == 120, "timeout_minutes=2 is 120 s, got %lld",
          (long long)cfg.distributed.timeout_s);
    mt_config_init(&cfg);
    CHECK(mt_config_load_string(&cfg, NOREC "step_scheduler:\n  gc_every_steps: 10\n"
                                "lr_scheduler:\n  lr_decay_steps: 50\n", "h.yaml") == MT_OK,
          "gc_every_steps and lr_decay_steps are AutoModel keys: %s", mt_error_message());
    mt_config_init(&cfg);
    mt_status_t s = mt_config_load_string(&cfg, NOREC "  checkpoint: x.pt\n", "h.yaml");
    CHECK(s != MT_OK && strstr(mt_error_message(), "model.checkpoint: loading weights") &&
          !strstr(mt_error_message(), "did you mean checkpoint"), "model.checkpoint: %s",
          mt_error_message());
}

/* The resolved config: AutoModel's spellings, meshtrain's own keys under
 * meshtrain:, and it reads back into the same values. */
static void resolved_reads_back(void)
{
    static mt_config_t a, b;
    const char *y = HEAD "step_scheduler:\n  local_batch_size: 2\n  global_batch_size: 4\n  max_steps: 7\n"
                    "  num_epochs: 3\ndist_env:\n  timeout_minutes: 2\nclip_grad_norm:\n  max_norm: 0.25\n"
                    "distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: interleaved_1f1b\n"
                    "optimizer:\n  _target_: torch.optim.Adam\n  lr: 1.0e-4\n"
                    "lr_scheduler:\n  lr_warmup_steps: 2\n";
    mt_config_init(&a);
    CHECK(mt_config_load_string(&a, y, "a.yaml") == MT_OK, "%s", mt_error_message());
    CHECK(mt_config_validate(&a, MT_APP_ANY, 2, NULL, NULL) == MT_OK, "%s", mt_error_message());
    char text[16384];
    mt_config_to_yaml(&a, text, sizeof text);
    const char *mt = strstr(text, "\nmeshtrain:\n");
    CHECK(mt != NULL, "a meshtrain: section in:\n%s", text);
    CHECK_CONTAINS(text, "recipe: TrainFinetuneRecipeForNextTokenPrediction\n");
    CHECK_CONTAINS(text, "    pp_schedule: Interleaved1F1B\n");
    CHECK_CONTAINS(text, "dist_env:\n  timeout_minutes: 2.0\n");
    CHECK_CONTAINS(text, "clip_grad_norm:\n  max_norm: 0.25\n");
    CHECK_CONTAINS(text, "  _target_: torch.optim.Adam\n");
    CHECK_CONTAINS(text, "  num_epochs: 3\n");
    CHECK(!strstr(text, "interleaved_1f1b") && !strstr(text, "timeout_s"), "meshtrain spellings in:\n%s", text);
    if (mt) { /* distributed: holds only AutoModel's keys */
        const char *d = strstr(text, "\ndistributed:\n");
        CHECK(d && d < mt && !memmem(d, (size_t)(mt - d), "device:", 7) &&
              !memmem(d, (size_t)(mt - d), "collectives:", 12), "device/collectives outside meshtrain:\n%s", text);
        CHECK_CONTAINS(mt, "  distributed.device: auto\n");
    }
    mt_config_init(&b);
    CHECK(mt_config_load_string(&b, text, "resolved") == MT_OK, "reads back: %s", mt_error_message());
    CHECK(mt_config_validate(&b, MT_APP_ANY, 2, NULL, NULL) == MT_OK, "%s", mt_error_message());
    char text2[16384];
    mt_config_to_yaml(&b, text2, sizeof text2);
    CHECK(strcmp(text, text2) == 0, "written again it differs:\n%s\n----\n%s", text, text2);
    CHECK(memcmp(&a.distributed, &b.distributed, sizeof a.distributed) == 0 &&
          memcmp(&a.optimizer, &b.optimizer, sizeof a.optimizer) == 0 &&
          memcmp(&a.lr_scheduler, &b.lr_scheduler, sizeof a.lr_scheduler) == 0 &&
          memcmp(&a.step_scheduler, &b.step_scheduler, sizeof a.step_scheduler) == 0 &&
          a.automodel.optimizer == b.automodel.optimizer && a.automodel.num_epochs == b.automodel.num_epochs,
          "values differ after the round trip");
}

int main(void)
{
    resolved_reads_back();
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        run_row(&rows[i]);
    hints_and_overrides();
    return mt_test_exit("test_config_automodel");
}
