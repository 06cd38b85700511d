/* meshtrain.h: the public API of libmeshtrain in one include, layer by
 * layer (doc/architecture.md).  mt_nccl.h is left out: it needs the CUDA
 * runtime's and NCCL's headers, so a program that uses it includes it
 * itself. */
#ifndef MESHTRAIN_H
#define MESHTRAIN_H

#include "mt_status.h"
#include "mt_comm.h"
#include "mt_rng.h"
#include "mt_backend.h"
#if defined(__has_include)
#if __has_include("mt_cuda.h") /* installed where the library has the CUDA backend */
#include "mt_cuda.h"
#endif
#endif
#include "mt_pp_schedule.h"
#include "mt_config.h"
#include "mt_mesh.h"
#include "mt_tokenizer.h"
#include "mt_data.h"
#include "mt_pack.h"
#include "mt_checkpoint.h"
#include "mt_model.h"
#include "mt_optim.h"
#include "mt_comm_bf16.h"
#include "mt_hf.h"
#include "mt_ddp.h"
#include "mt_fsdp.h"
#include "mt_ring_attention.h"
#include "mt_pp_exec.h"
#include "mt_plan.h"
#include "mt_train.h"
#include "mt_app.h"
#include "mt_ckpt_cli.h"

#endif
