/* pp_sched_internal.h: what the two list simulations share (pp_simulate.c,
 * pp_buffers.c).  Not installed. */
#ifndef MT_PP_SCHED_INTERNAL_H
#define MT_PP_SCHED_INTERNAL_H

#include "mt_pp_schedule.h"

/* Set MT_ERR_INTERNAL: "<schedule> p= v= m=: <what>; no rank can go on:"
 * and where each unfinished rank waits (pc[r]: its next action), at most
 * 16 of them, naming each rank's send buffers when caps is not NULL. */
mt_status_t mt_pp_sched_stuck(const mt_pp_sched_t *sc, const int *pc, const int *caps,
                              const char *what, const char *file, int line);

#endif
