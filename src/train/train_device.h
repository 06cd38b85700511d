/* train_device.h: the trainer's device (train_device.c): the backend that
 * distributed.device names, the CUDA bring-up (the GPU of the node-local
 * rank, one reservation), and how collectives on device memory travel
 * (distributed.collectives: NCCL communicators per mesh group, or MPI on
 * host copies, mt_stage.h).  Not installed. */
#ifndef MT_TRAIN_DEVICE_H
#define MT_TRAIN_DEVICE_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "mt_backend.h"
#include "mt_config.h"
#include "mt_mesh.h"
#include "mt_model.h"
#include "mt_status.h"

typedef struct {
    const mt_backend_t *be;
    bool own_gpu;     /* cuda: every rank of every node has a GPU of its own */
    bool nccl;        /* collectives on device memory go through NCCL */
    void *nccl_state; /* the mt_nccl_t, when nccl */
    bool tp_bf16;     /* TP collectives in bf16 (bf16 compute, mt_tp_comm.h) */
    void *tp_pad;     /* their NCCL wire buffer (device), tp_pad_bytes */
    size_t tp_pad_bytes;
    int *tp_counts;   /* [2 tp]: counts, displacements */
    bool profile;     /* MESHTRAIN_PROFILE: be is mt_backend_profiled's */
    bool bf16_passes; /* MESHTRAIN_BF16_PASSES: be is a copy that rounds in passes */
    bool bf16_storage; /* be stores bf16 (mt_backend.h stores_bf16; MESHTRAIN_BF16_STORAGE) */
    int cc_major;     /* cuda: the lowest compute capability (major) of the ranks' GPUs */
    double profile_t0;
} mt_train_device_t;

/* Collective over the mesh: the backend, and with device cuda the GPU
 * binding and the NCCL communicators (collectives nccl, or auto when the
 * build has NCCL and no two ranks share a GPU).  collectives nccl that
 * cannot be honoured is an error with the reason. */
mt_status_t mt_train_device_init(mt_train_device_t *d, const mt_config_t *cfg,
                                 const mt_mesh_t *mesh);

/* Whether a run of cfg takes bf16 storage (doc/mixed-precision.md):
 * MESHTRAIN_BF16_STORAGE=0 no, set to anything else yes; unset, yes under
 * bf16 compute on device cuda (but not with MESHTRAIN_BF16_PASSES=1).
 * meshtrain-plan estimates what the trainer would do on GPUs of compute
 * capability 8.0 and up; below that the trainer's default stays float32
 * storage (mt_train_device_init: its bf16 GEMMs are cuBLASLt's bf16 ones). */
bool mt_train_bf16_storage_on(const mt_config_t *cfg);
void mt_train_device_free(mt_train_device_t *d);

/* A tensor-parallel collective (mt_tp_op_t) of device memory through NCCL
 * when the TP group has a communicator: enqueued after the compute so
 * far; float sums, gathers and reduce-scatters in bf16 under bf16
 * compute, as mt_tp_comm.h's.  With ticket NULL the compute stream waits
 * for it, else *ticket is its event, for mt_stage_join.  false: the
 * caller uses MPI. */
bool mt_train_device_tp(mt_train_device_t *d, MPI_Comm tp, const void *in, void *out, int64_t n,
                        mt_tp_op_t op, void **ticket);

/* Under MESHTRAIN_PROFILE: after each step (steps_done so far), the
 * first one's counts are dropped. */
void mt_train_device_profile_step(mt_train_device_t *d, int64_t steps_done);
/* After training, this rank's device lines: under MESHTRAIN_PROFILE the
 * report of its kernels since the first step (mt_backend_profile_report),
 * and on a GPU how often its bf16 GEMMs reused a kept cuBLASLt plan. */
void mt_train_device_end_report(const mt_train_device_t *d, FILE *out);

/* The log's line about the device and the collectives (nothing for the
 * plain CPU backend). */
void mt_train_device_print(const mt_train_device_t *d, const mt_config_t *cfg, FILE *out);

#endif
