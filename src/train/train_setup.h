/* train_setup.h: the state of one training run: data, model, the
 * data-parallel layer, optimizer, checkpoint lists and the groups they
 * talk over.  train_setup.c builds it, frees it and prints its opening
 * report; train.c runs the steps on it.  Not installed. */
#ifndef MT_TRAIN_SETUP_H
#define MT_TRAIN_SETUP_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "mt_config.h"
#include "mt_blend.h"
#include "mt_data.h"
#include "mt_ddp.h"
#include "mt_fsdp.h"
#include "mt_mesh.h"
#include "mt_model.h"
#include "mt_optim.h"
#include "mt_pack.h"
#include "mt_pp_exec.h"
#include "mt_stage.h"
#include "mt_tp_comm.h"
#include "train_cp.h"
#include "train_device.h"
#include "train_internal.h"
#include "train_moe.h"
#include "train_mp.h"

typedef struct {
    mt_blend_t data, val;        /* dataset.path(s), validation_path(s) */
    int have_val;
    mt_model_t model;
    mt_adamw_t opt;
    int32_t *tokens, *targets;   /* [accum][B*T] */
    bool packed;                 /* packed_sequence_size > 0 */
    int32_t *pos, *docs;         /* packed rows: [accum][B*T] */
    mt_train_ckpt_t ckpt;
    mt_ddp_t ddp;                /* replicated strategies */
    bool sharded;                /* else: fsdp over data parallelism */
    mt_fsdp_t fsdp;
    mt_segment_t whole;
    const mt_segment_t *seg;     /* what this rank updates */
    int nseg;
    MPI_Comm tp;                 /* tensor-parallel group */
    mt_tp_comm_t tpc;            /* its collectives over MPI */
    bool staged;                 /* backend memory is not host memory: checkpoints
                                  * and tp_partial_grad sums go through host
                                  * copies (`stage`, mt_stage.h) */
    mt_stage_buf_t stage;
    bool pp;                     /* pipeline parallelism: the model is this
                                  * rank's stages, run by the executor */
    mt_pp_exec_t pipe;
    MPI_Comm ppc;                /* pipeline group */
    int64_t rows;                /* samples per rank per micro-step */
    mt_train_cp_t cp;            /* context parallelism (train_cp.c) */
    mt_train_moe_t moe;          /* experts, aux loss, expert load (train_moe.c) */
    mt_train_mp_t mp;            /* bf16 compute: fp32 master weights (train_mp.c) */
    mt_train_device_t device;    /* backend, GPU, NCCL (train_device.c) */
} mt_train_run_t;

/* Data, model, the data-parallel layer, the optimizer and the checkpoint
 * lists into r (zeroed), for this rank of mesh.  Local: the caller agrees
 * on the outcome over the mesh.  On failure r holds what was built, for
 * mt_train_run_free. */
mt_status_t mt_train_run_setup(mt_train_run_t *r, const mt_config_t *cfg, const mt_mesh_t *mesh);
void mt_train_run_free(mt_train_run_t *r);

/* The log's opening lines (rank 0): memory per rank next to
 * meshtrain-plan's estimate, the packing, the run's size from step
 * `start`, the device, mixed precision and the pipeline; peak is MFU's
 * peak in GFLOP/s, threads the compute threads per rank. */
void mt_train_run_report(const mt_train_run_t *r, const mt_config_t *cfg, FILE *out,
                         int64_t start, int threads, double peak);

#endif
