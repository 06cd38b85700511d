/* train_internal.h: checkpoint glue of the training loop (train_ckpt.c).
 * Not installed. */
#ifndef MT_TRAIN_INTERNAL_H
#define MT_TRAIN_INTERNAL_H

#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>

#include "mt_checkpoint.h"
#include "mt_config.h"
#include "mt_model.h"
#include "mt_optim.h"

typedef struct {
    mt_model_t *model;
    mt_model_t whole;    /* names and shapes of every parameter of the
                          * model (this TP rank's parts): the tensor list
                          * is the same on every rank, also under pipeline
                          * parallelism, where a rank holds some of them */
    mt_adamw_t *opt;
    mt_ckpt_tensor_t *t; /* parameters, then exp_avg, then exp_avg_sq */
    mt_ckpt_tensor_t *t_save; /* what this rank writes: t, with nothing from the
                               * blocks another replica writes */
    int n;
    int resumed;
    char *config_yaml;   /* the resolved config, stored in every checkpoint */
    char mesh[256];      /* the mesh it was saved on */
    mt_ckpt_lock_t lock; /* checkpoint_dir's ownership, while checkpointing */
} mt_train_ckpt_t;

/* The tensor list: /model/<name>, /optim/<name>/exp_avg, .../exp_avg_sq,
 * full logical tensors (vocabulary padding rows are not stored).  This
 * rank passes the rows of its optimizer segments, and of its parameters
 * too when they are sharded (else the whole tensors, written once). */
mt_status_t mt_train_ckpt_init(mt_train_ckpt_t *c, const mt_config_t *cfg, mt_model_t *m,
                               mt_adamw_t *opt, const mt_segment_t *seg, int nseg,
                               bool params_sharded);
void mt_train_ckpt_free(mt_train_ckpt_t *c);

/* Each block of a tensor must be written by exactly one rank: the ranks
 * that hold the same block as another (data-parallel replicas of whole or
 * HSDP-sharded state; the TP ranks of a tensor every TP rank holds whole)
 * read it on load but write it only from the first of them.
 * model_writer / optim_writer: this rank is the first replica of its
 * /model (/optim) blocks; tp_rank0: it is TP rank 0. */
void mt_train_ckpt_writers(mt_train_ckpt_t *c, bool model_writer, bool optim_writer,
                           bool tp_rank0);

/* The blocks with data live in be's memory (NULL: host memory): the
 * checkpoint I/O stages them through host copies.  After every list is
 * built (the experts' too). */
void mt_train_ckpt_stage(mt_train_ckpt_t *c, const mt_backend_t *be);

/* Save after `step` updates (global batch G).  Collective. */
mt_status_t mt_train_save(MPI_Comm comm, const mt_config_t *cfg, mt_train_ckpt_t *c,
                          int64_t step, int64_t G);

/* checkpoint.resume: auto (newest complete checkpoint, if checkpointing is
 * enabled), none, or a step directory.  Sets *start to the step to
 * continue after (0 for a fresh start).  Collective. */
mt_status_t mt_train_resume(MPI_Comm comm, const mt_config_t *cfg, mt_train_ckpt_t *c,
                            int64_t *start, FILE *out);

#endif
