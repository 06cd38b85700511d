/* train_lora.c: the frozen base of a LoRA run, loaded from the named
 * Hugging Face model into the model's frozen arena through the same
 * block reader as a full fine-tune's start (hf_load.c): each rank reads
 * its TP part of every base tensor.  The adapters are the model's
 * parameters and go through the ordinary lists (checkpoints, sharding). */
#include "train_lora.h"

#include <stdlib.h>
#include <string.h>

#include "mt_checkpoint.h"
#include "mt_hf.h"

mt_status_t mt_train_lora_load_base(MPI_Comm comm, const mt_config_t *cfg, mt_model_t *m,
                                    const mt_backend_t *be, FILE *out)
{
    mt_ckpt_tensor_t *t = calloc((size_t)(m->nfrozen > 0 ? m->nfrozen : 1), sizeof *t);
    if (!t)
        MT_FAIL(MT_ERR_NOMEM, "the frozen base's tensor list");
    for (int i = 0; i < m->nfrozen; i++) {
        const mt_param_t *p = &m->frozen[i];
        bool vocab = p == m->embed || p == m->lm_head;
        snprintf(t[i].path, sizeof t[i].path, "/model/%s", p->name);
        t[i].ndim = p->ndim;
        /* stored rows: the real vocabulary, not the TP padding */
        t[i].shape[0] = vocab ? m->V_valid_full : p->full_shape[0];
        t[i].shape[1] = p->ndim > 1 ? p->full_shape[1] : 1;
        t[i].row_offset = p->tp_dim == 0 ? p->tp_off : 0;
        t[i].row_count = vocab ? m->V_valid : p->shape[0];
        t[i].col_offset = p->tp_dim == 1 ? p->tp_off : 0;
        t[i].col_count = p->tp_dim == 1 ? p->shape[1] : 0;
        t[i].data = p->data;
        t[i].be = be;
    }
    mt_status_t s = mt_hf_load_weights(comm, &cfg->model, t, m->nfrozen, out);
    free(t);
    if (s == MT_OK && m->bf16) /* bf16 compute reads bf16 values; the base has no master */
        m->be->round_bf16(m->frozen_mem, m->frozen_numel);
    return s;
}
