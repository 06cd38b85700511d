/* fsdp_internal.h: what the units' collectives (fsdp.c) and the sharded
 * state's layout (fsdp_layout.c) share.  Not installed. */
#ifndef MT_FSDP_INTERNAL_H
#define MT_FSDP_INTERNAL_H

#include <stdbool.h>

#include "mt_fsdp.h"

/* Slot of a unit in the ring: 0 or 1, or 2 for a tied embedding. */
static inline int mt_fsdp_slot(int u, bool tied) { return tied && u == 0 ? 2 : u % 2; }

/* After the layout (fsdp_layout.c): every unit's starting state
 * (parameters released when sharded, else whole; gradients pointed at
 * their place unless the ring hands them out), and f as the model's unit
 * hook. */
void mt_fsdp_attach(mt_fsdp_t *f);

#endif
