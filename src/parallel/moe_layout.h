/* moe_layout.h: where a MoE model's experts live on the mesh, as pure
 * functions of the configuration: how many ranks hold the same experts,
 * and whether those ranks shard them.  The trainer builds its groups and
 * the planner sizes memory from the same answers.  Not installed. */
#ifndef MT_MOE_LAYOUT_H
#define MT_MOE_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "mt_config.h"

/* The ranks holding the same experts: ep_shard x tp_size (dp x cp x
 * tp_size when ep_size is 1), per pipeline stage. */
int64_t mt_moe_expert_replicas(const mt_config_t *cfg);

/* Whether the experts are FSDP-sharded over those ranks (fsdp2, more than
 * one of them): the model is then built with MT_MODEL_NO_EXPERT_ARENAS. */
bool mt_moe_experts_sharded(const mt_config_t *cfg);

#endif
