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

/* Collective.  Reads hf_dir/config.json and model.safetensors (or the
 * shards of model.safetensors.index.json) and writes
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
