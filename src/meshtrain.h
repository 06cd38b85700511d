/* meshtrain.h: the public API of libmeshtrain in one include. */
#ifndef MESHTRAIN_H
#define MESHTRAIN_H

#include "mt_status.h"
#include "mt_config.h"
#include "mt_mesh.h"
#include "mt_plan.h"
#include "mt_app.h"
#include "mt_backend.h"
#include "mt_data.h"
#include "mt_checkpoint.h"
#include "mt_rng.h"
#include "mt_model.h"
#include "mt_optim.h"
#include "mt_train.h"
#include "mt_comm.h"
#include "mt_ddp.h"
#include "mt_ckpt_cli.h"

#endif
