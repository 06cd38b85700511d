/* train_mp.c: master weights for mixed precision (train_mp.h). */
#include "train_mp.h"

#include <stdlib.h>
#include <string.h>

mt_status_t mt_train_mp_init(mt_train_mp_t *mp, const mt_model_t *m, const mt_segment_t *seg,
                             int nseg, int64_t owned, bool in_arena, uint64_t seed,
                             const mt_segment_t **use)
{
    memset(mp, 0, sizeof *mp);
    *use = seg;
    if (!m->bf16 || !in_arena)
        return MT_OK;
    const mt_backend_t *be = m->be;
    mp->be = be, mp->work = seg, mp->nseg = nseg;
    mp->master = be->device_alloc(sizeof(float) * (size_t)(owned > 0 ? owned : 1));
    mp->seg = malloc(sizeof *mp->seg * (size_t)(nseg > 0 ? nseg : 1));
    if (!mp->master || !mp->seg)
        MT_FAIL(MT_ERR_NOMEM, "mixed precision master weights (%lld floats)", (long long)owned);
    mp->storage = m->bf16_storage;
    for (int k = 0; k < nseg; k++) {
        mp->seg[k] = seg[k];
        mp->seg[k].param = mp->master + seg[k].state;
        mp->seg[k].work = seg[k].param; /* the optimizer writes the compute copy */
        if (mp->storage) /* the arena holds only bf16 bits: the masters from the seed */
            mt_model_init_range_device(m, seed, seg[k].offset, seg[k].offset + seg[k].count,
                                       mp->seg[k].param);
        else
            be->copy(mp->seg[k].param, seg[k].param, sizeof(float) * (size_t)seg[k].count);
    }
    if (m->param_mem && !mp->storage)
        be->round_bf16(m->param_mem, m->numel);
    *use = mp->seg;
    return MT_OK;
}

void mt_train_mp_refresh(const mt_train_mp_t *mp)
{
    if (!mp->master)
        return;
    const mt_backend_t *be = mp->be;
    for (int k = 0; k < mp->nseg; k++) {
        const mt_segment_t *w = &mp->work[k];
        if (mp->storage) { /* the arena's bf16 bits, rounded as round_bf16 rounds */
            be->to_bf16((uint16_t *)w->param, mp->seg[k].param, w->count);
            continue;
        }
        be->copy(w->param, mp->seg[k].param, sizeof(float) * (size_t)w->count);
        be->round_bf16(w->param, w->count);
    }
}

void mt_train_mp_free(mt_train_mp_t *mp)
{
    if (mp->master)
        mp->be->device_free(mp->master);
    free(mp->seg);
    memset(mp, 0, sizeof *mp);
}
