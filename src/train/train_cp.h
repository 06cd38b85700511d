/* train_cp.h: context parallelism in the trainer (train_cp.c): the CP
 * group's ring attention hooked into the model, and the data slicing that
 * gives each CP rank its two load-balanced chunks of every row.  Not
 * installed. */
#ifndef MT_TRAIN_CP_H
#define MT_TRAIN_CP_H

#include <mpi.h>
#include <stdint.h>

#include "mt_blend.h"
#include "mt_data.h"
#include "mt_mesh.h"
#include "mt_model.h"
#include "mt_pack.h"
#include "mt_pp_exec.h"
#include "mt_ring_attention.h"
#include "mt_status.h"

typedef struct {
    int size, rank;       /* the CP group; size 1: context parallelism off */
    MPI_Comm comm;
    mt_ring_attention_t ring;
    int64_t B, T;         /* full rows: B rows of T tokens (the model has T / size) */
    int32_t *tokens, *targets, *pos, *docs; /* one micro-batch of full rows [B*T] */
} mt_train_cp_t;

/* With cp_size > 1: the ring over the CP group, hooked into m (whose T is
 * already T / cp_size), and full-row buffers for `rows` rows per micro-step
 * (a pipeline runs them m->B at a time).  With cp_size 1: nothing (size
 * 1).  T is the full row length. */
mt_status_t mt_train_cp_init(mt_train_cp_t *cp, const mt_mesh_t *mesh, mt_model_t *m, int64_t rows,
                             int64_t T);
void mt_train_cp_free(mt_train_cp_t *cp);

/* One micro-batch for this rank under CP: the full rows of its dp rank
 * (packed when the data is), then this CP rank's chunks of tokens,
 * targets and positions (global ones: restarting per document when
 * packed, 0..T-1 along the row otherwise) and, packed, doc_start (global
 * row indices).  Outputs are [B * T / cp]; docs is untouched unpacked. */
mt_status_t mt_train_cp_fill(mt_train_cp_t *cp, const mt_blend_t *data, int64_t step, int64_t global,
                      int64_t dp_rank, int64_t dp_size, int64_t micro, int32_t *tokens,
                      int32_t *targets, int32_t *pos, int32_t *docs);

/* The validation loss (plain rows, up to 64 batches of B rows, as the
 * single-rank path) with each row split over the CP group, through the
 * pipeline's stages when pipe is not NULL.  Collective over the CP group
 * (and the pipeline); tok, tgt, pos are [B * T / cp] scratch. */
mt_status_t mt_train_cp_validation_loss(mt_train_cp_t *cp, mt_model_t *m, mt_pp_exec_t *pipe,
                                        const mt_blend_t *val, int32_t *tok, int32_t *tgt,
                                        int32_t *pos, double *mean);

#endif
