/* pp_link.h: the pipeline executor's point-to-point channels and
 * transfers (pp_link.c), over MPI or NCCL.  Internal to the executor
 * (pp_exec.c); mt_pp_exec_connect, in mt_pp_exec.h, makes the channels. */
#ifndef MT_PP_LINK_H
#define MT_PP_LINK_H

#include "mt_pp_exec.h"

/* Send a copy of buf [n] (be's memory) and route [nr] (host doubles;
 * neither is waited for here), or receive into them, over the channel of
 * send/receive action a. */
mt_status_t mt_pp_link_transfer(mt_pp_exec_t *x, const mt_backend_t *be, const mt_pp_action_t *a,
                                float *buf, int64_t n, double *route, int64_t nr);

/* Before a run's first transfer: its k-th send (receive) takes device
 * buffer k mod n again, the order mt_pp_sched_check_buffers plays. */
void mt_pp_link_begin(mt_pp_exec_t *x);

/* The channels, their buffers and communicators (collective over each
 * channel's two ranks). */
void mt_pp_link_free(mt_pp_exec_t *x);

#endif
