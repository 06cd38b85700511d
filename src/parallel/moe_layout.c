/* moe_layout.c: the experts' replication and sharding on the mesh
 * (moe_layout.h).  Only arithmetic on the configuration: it builds no
 * group and touches no parameter; train_moe.c does that. */
#include "moe_layout.h"

int64_t mt_moe_expert_replicas(const mt_config_t *cfg)
{
    const mt_distributed_config_t *d = &cfg->distributed;
    int64_t r = d->ep_size > 1 ? cfg->derived.ep_shard : cfg->derived.dp_size * d->cp_size;
    return r * d->tp_size;
}

bool mt_moe_experts_sharded(const mt_config_t *cfg)
{
    return cfg->model.num_experts > 0 && cfg->distributed.strategy == MT_STRATEGY_FSDP2 &&
           mt_moe_expert_replicas(cfg) > 1;
}
