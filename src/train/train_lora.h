/* train_lora.h: what a LoRA run (peft:) adds to the training loop
 * (train_lora.c).  Not installed. */
#ifndef MT_TRAIN_LORA_H
#define MT_TRAIN_LORA_H

#include <mpi.h>
#include <stdio.h>

#include "mt_config.h"
#include "mt_model.h"

/* The frozen base from model.pretrained_model_name_or_path into the
 * model's frozen arena: at every start, a resumed one too (a checkpoint
 * holds the adapters and names the base).  be: the backend whose memory
 * the arena is when it is not host memory, else NULL.  Collective. */
mt_status_t mt_train_lora_load_base(MPI_Comm comm, const mt_config_t *cfg, mt_model_t *m,
                                    const mt_backend_t *be, FILE *out);

#endif
