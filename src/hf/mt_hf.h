/* mt_hf.h: Hugging Face interchange of meshtrain checkpoints
 * (doc/hf-interchange.md).
 *
 * Export writes a Hugging Face model directory from a checkpoint's /model
 * tensors: config.json and model.safetensors, or numbered shards plus
 * model.safetensors.index.json.  Import reads such a directory (config.json
 * plus safetensors in F32, BF16 or F16) and writes a step-0 meshtrain
 * checkpoint with zero optimizer state that training can start from.
 *
 * Both are collective over comm and work on any number of ranks: each rank
 * reads and writes only its own rows of each tensor, so no rank holds the
 * whole model (on import, each rank holds its rows of every tensor until
 * the checkpoint is saved).  Failures are agreed: every rank returns the
 * same status and message.  Nothing here downloads: directories are local. */
#ifndef MT_HF_H
#define MT_HF_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

#include "mt_checkpoint.h"
#include "mt_config.h"
#include "mt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_HF_DEFAULT_SHARD_BYTES 5000000000LL /* "5GB", as transformers */

typedef struct {
    int64_t max_shard_bytes; /* data bytes per safetensors file, before a new shard */
    int bf16;                /* write bfloat16 (round to nearest even) instead of float32 */
} mt_hf_export_opts_t;

/* Collective.  step_dir: a checkpoint step directory (its manifest is
 * verified).  hf_dir is created if needed and must not already hold
 * config.json or model*.safetensors files.  Progress lines go to `out` on
 * rank 0 (NULL: quiet). */
mt_status_t mt_hf_export(MPI_Comm comm, const char *step_dir, const char *hf_dir,
                         const mt_hf_export_opts_t *opts, FILE *out);

/* Collective.  The LoRA adapters of a peft: run's checkpoint step_dir as
 * a Hugging Face PEFT directory (adapter_config.json and
 * adapter_model.safetensors, float32 or with bf16 bfloat16; hf_peft.c). */
mt_status_t mt_hf_export_adapter(MPI_Comm comm, const char *step_dir, const char *dir, bool bf16,
                                 FILE *out);

/* Collective.  The same checkpoint merged into its base (the model its
 * config names, read again): a Hugging Face model directory as
 * mt_hf_export writes, each adapted linear W + (alpha / r) B A. */
mt_status_t mt_hf_export_merged(MPI_Comm comm, const char *step_dir, const char *dir,
                                const mt_hf_export_opts_t *opts, FILE *out);

/* Collective.  hf_dir: a directory or a hub id (mt_hf_resolve_name, at
 * main).  Reads its config.json and model.safetensors (or the shards of
 * model.safetensors.index.json) and writes
 * checkpoint_dir/step_00000000 with mt_ckpt_save.  checkpoint_dir must be
 * absent or empty.  config_path (NULL: none) supplies every section but
 * the model; the model keys it sets must agree with config.json. */
mt_status_t mt_hf_import(MPI_Comm comm, const char *hf_dir, const char *checkpoint_dir,
                         const char *config_path, FILE *out);

/* Collective: checkpoint.save_consolidated.  step_dir/model/consolidated
 * becomes the Hugging Face directory of the run's model (written as
 * consolidated.tmp, renamed when complete; an older copy is replaced).
 * t: the run's checkpoint tensor list as mt_ckpt_save takes it; each rank
 * writes the blocks of its /model/ tensors that it writes to the
 * checkpoint.  Each tensor goes in the dtype of
 * model.pretrained_model_name_or_path's safetensors (a local directory),
 * with its config.json (torch_dtype set), generation_config.json and
 * tokenizer files; with no source, in the param_dtype, with a config.json
 * made from the model section.  A progress line goes to `out` on rank 0
 * (NULL: quiet). */
mt_status_t mt_hf_save_consolidated(MPI_Comm comm, const mt_config_t *cfg, const char *step_dir,
                                    const mt_ckpt_tensor_t *t, int n, FILE *out);

/* Not collective: what mt_hf_save_consolidated would refuse that the
 * config alone shows (a model with no Hugging Face architecture meshtrain
 * writes), so that a run refuses it before training rather than at its
 * first save.  MT_OK when save_consolidated is false. */
mt_status_t mt_hf_check_consolidated(const mt_config_t *cfg);

/* A model by name, on local disk only (doc/hf-interchange.md): name is a
 * directory, or a hub id "org/name" in the one hub cache huggingface_hub
 * would use (HF_HUB_CACHE, else HF_HOME/hub, else
 * XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub), at
 * revision (NULL or "": main; a branch or tag in refs/, or a commit).  The
 * directory found (with config.json) goes to dir.  Not found: an
 * MT_ERR_CONFIG error, about `key`, that names every place looked.  Not
 * collective. */
mt_status_t mt_hf_resolve_name(const char *name, const char *revision, const char *key,
                               char *dir, size_t cap);

/* m->pretrained_model_name_or_path at m->revision. */
mt_status_t mt_hf_resolve(const mt_model_config_t *m, char *dir, size_t cap);

/* The model section of a config that names a model: config.json of
 * model.pretrained_model_name_or_path, under the fields of the model.config
 * block (which may name its own config.json), then the model.* keys set in
 * the file or overrides, a warning to `warn` for each that changes a value.
 * A config that names no model is left as it is.  Before validation, on
 * the rank that parses; not collective. */
mt_status_t mt_hf_apply_named_model(mt_config_t *cfg, FILE *warn);

/* Collective.  The initial weights of model.pretrained_model_name_or_path
 * into the blocks of t[0, n) whose path is /model/<name> (the trainer's
 * checkpoint tensor list: each rank's rows and columns): rank 0 resolves
 * the name, every rank checks the safetensors against the model section and
 * the list's shapes, then reads its own blocks with pread, converted to
 * float32.  Every rank returns the same status.  A line on `out`. */
mt_status_t mt_hf_load_weights(MPI_Comm comm, const mt_model_config_t *m,
                               const mt_ckpt_tensor_t *t, int n, FILE *out);

/* meshtrain-ckpt {export|import} ...: collective over comm (MPI must be
 * initialised); only rank 0 prints.  Every rank returns the same exit
 * code: 0 ok, 1 error, 2 usage. */
int mt_ckpt_hf_main(MPI_Comm comm, int argc, char **argv, FILE *out, FILE *err);

/* The export and import lines of meshtrain-ckpt's usage text. */
void mt_ckpt_hf_usage(FILE *o);

#ifdef __cplusplus
}
#endif
#endif
