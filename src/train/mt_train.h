/* mt_train.h: the training loop of meshtrain-dense.
 *
 * One call runs a whole training run on a communicator: data, model,
 * AdamW, schedule, checkpoints (save, resume, pre-emption signals),
 * validation, the step log and metrics.jsonl.  This release computes on a
 * single rank; the data-parallel issue spreads the same computation over
 * the mesh. */
#ifndef MT_TRAIN_H
#define MT_TRAIN_H

#include <mpi.h>
#include <stdio.h>

#include "mt_config.h"
#include "mt_mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t steps_done;     /* optimizer steps completed by this call */
    int64_t last_step;      /* step number reached */
    double last_loss;
    int stopped_by_signal;  /* 1 when SIGTERM/SIGUSR1 ended the run early */
    int resumed_from_step;  /* -1 for a fresh start */
} mt_train_result_t;

/* Run training.  `out` receives the step log (rank 0).  Collective. */
mt_status_t mt_train(MPI_Comm comm, const mt_config_t *cfg, const mt_mesh_t *mesh, FILE *out,
                     mt_train_result_t *result);

/* Best of a few single-process SGEMM runs (2048^3 or smaller), GFLOP/s:
 * the peak MFU is measured against. */
double mt_measure_sgemm_gflops(int64_t n, int reps);

#ifdef __cplusplus
}
#endif
#endif
