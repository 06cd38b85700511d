/* train_cp.c: context parallelism in the trainer (train_cp.h).
 *
 * The model stays single-device: it sees T / cp tokens per row and calls
 * its attention hook, which runs ring attention over the CP group.  CP
 * ranks of one dp rank read the same rows (the data layer is indexed by
 * dp rank only) and each keeps chunks r and 2cp-1-r.  Loss sums and token
 * counts, gradient reduction and FSDP sharding over dp_cp / dp_shard_cp
 * are the training loop's (train.c): here only the CP-specific pieces.
 * Not here: CP for the validation rows of packed data (validation rows are
 * plain, as without CP). */
#include <config.h>

#include "train_cp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mt_comm.h"

static void cp_forward(void *ctx, float *out, float *lse, const float *q, const float *k,
                       const float *v, const int32_t *doc_start, int64_t B, int64_t T,
                       int64_t nh, int64_t nkv, int64_t hd)
{
    mt_train_cp_t *cp = ctx;
    (void)B, (void)T, (void)nkv, (void)hd; /* fixed at init: the model's shape */
    /* mid-forward: the CP peers cannot be told, so a failure aborts */
    if (mt_ring_attention_forward(&cp->ring, out, lse, q, k, v, doc_start, nh) != MT_OK)
        mt_comm_fatal(cp->comm, MPI_ERR_OTHER, "ring attention (forward)");
}

static void cp_backward(void *ctx, float *dq, float *dk, float *dv, const float *dout,
                        const float *out, const float *lse, const float *q, const float *k,
                        const float *v, const int32_t *doc_start, int64_t B, int64_t T,
                        int64_t nh, int64_t nkv, int64_t hd)
{
    mt_train_cp_t *cp = ctx;
    (void)B, (void)T, (void)nkv, (void)hd;
    if (mt_ring_attention_backward(&cp->ring, dq, dk, dv, dout, out, lse, q, k, v, doc_start,
                                   nh) != MT_OK)
        mt_comm_fatal(cp->comm, MPI_ERR_OTHER, "ring attention (backward)");
}

/* m->pos_max: the row's largest position over the CP group (dynamic NTK
 * RoPE), from mt_model_set_packing, which every CP rank calls alike and
 * which cannot fail: a failure aborts */
static void cp_pos_max(void *ctx, int32_t *max)
{
    mt_train_cp_t *cp = ctx;
    int rc = MPI_Allreduce(MPI_IN_PLACE, max, 1, MPI_INT32_T, MPI_MAX, cp->comm);
    if (rc != MPI_SUCCESS)
        mt_comm_fatal(cp->comm, rc, "largest position (all-reduce over cp)");
}

mt_status_t mt_train_cp_init(mt_train_cp_t *cp, const mt_mesh_t *mesh, mt_model_t *m, int64_t rows,
                             int64_t T)
{
    memset(cp, 0, sizeof *cp);
    cp->size = mesh->group_size[MT_GROUP_CP];
    cp->rank = mesh->group_rank[MT_GROUP_CP];
    cp->comm = mesh->group[MT_GROUP_CP];
    if (cp->size <= 1)
        return MT_OK;
    if (m->T * cp->size != T)
        MT_FAIL(MT_ERR_INTERNAL, "context parallelism: the model holds %lld tokens per row, "
                "not %lld / %d", (long long)m->T, (long long)T, cp->size);
    cp->B = rows, cp->T = T;
    MT_TRY(mt_ring_attention_init(&cp->ring, cp->comm, m->be, m->B, m->T, m->nkv, m->hd));
    if (m->bf16) /* K and V hold bf16 values: they travel as bf16 (bits under bf16 storage) */
        MT_TRY(mt_ring_attention_bf16(&cp->ring, m->nh));
    size_t n = sizeof(int32_t) * (size_t)(rows * T);
    cp->tokens = malloc(n), cp->targets = malloc(n), cp->pos = malloc(n), cp->docs = malloc(n);
    if (!cp->tokens || !cp->targets || !cp->pos || !cp->docs)
        MT_FAIL(MT_ERR_NOMEM, "context parallelism: row buffers");
    m->attn_forward = cp_forward;
    m->attn_backward = cp_backward;
    m->attn_ctx = cp;
    m->pos_max = cp_pos_max, m->pos_ctx = cp;
    return MT_OK;
}

void mt_train_cp_free(mt_train_cp_t *cp)
{
    if (cp->size > 1)
        mt_ring_attention_free(&cp->ring);
    free(cp->tokens), free(cp->targets), free(cp->pos), free(cp->docs);
    memset(cp, 0, sizeof *cp);
}

/* local[b, i] = full[b, global index of local token i] */
static void keep_chunks(const mt_train_cp_t *cp, const int32_t *full, int32_t *local)
{
    const int64_t Tl = cp->T / cp->size;
    for (int64_t b = 0; b < cp->B; b++)
        for (int64_t i = 0; i < Tl; i++)
            local[b * Tl + i] = full[b * cp->T + mt_cp_global_index(i, Tl, cp->rank, cp->size)];
}

/* Plain rows: positions are the global indices along the row. */
static void row_positions(mt_train_cp_t *cp)
{
    for (int64_t i = 0; i < cp->B * cp->T; i++)
        cp->pos[i] = (int32_t)(i % cp->T);
}

mt_status_t mt_train_cp_fill(mt_train_cp_t *cp, const mt_blend_t *data, int64_t step, int64_t global,
                      int64_t dp_rank, int64_t dp_size, int64_t micro, int32_t *tokens,
                      int32_t *targets, int32_t *pos, int32_t *docs)
{
    bool pk = data->o.packed;
    MT_TRY(mt_blend_fill_batch(data, step, global, dp_rank, dp_size, micro, cp->B, cp->tokens,
                               cp->targets, cp->pos, cp->docs));
    if (!pk)
        row_positions(cp);
    keep_chunks(cp, cp->tokens, tokens);
    keep_chunks(cp, cp->targets, targets);
    keep_chunks(cp, cp->pos, pos);
    if (pk) /* doc_start values are row indices already: global, as the ring wants */
        keep_chunks(cp, cp->docs, docs);
    return MT_OK;
}

mt_status_t mt_train_cp_validation_loss(mt_train_cp_t *cp, mt_model_t *m, mt_pp_exec_t *pipe,
                                        const mt_blend_t *val, int32_t *tok, int32_t *tgt,
                                        int32_t *pos, double *mean)
{
    int64_t batches = mt_blend_num_samples(val) / cp->B;
    if (batches > 64)
        batches = 64;
    double sum[2] = {0, 0}, tot[2] = {0, 0}; /* loss sum, token count */
    row_positions(cp);
    keep_chunks(cp, cp->pos, pos);
    for (int64_t i = 0; i < batches; i++) {
        MT_TRY(mt_blend_fill_batch(val, i, cp->B, 0, 1, 0, cp->B, cp->tokens, cp->targets, NULL,
                                   NULL));
        keep_chunks(cp, cp->tokens, tok);
        keep_chunks(cp, cp->targets, tgt);
        /* the model's micro-batches: all cp->B rows, or a pipeline's
         * microbatches of m->B rows (every row has the same positions) */
        for (int64_t j = 0; j < cp->B / m->B; j++) {
            int64_t c = 0;
            double l;
            mt_model_set_packing(m, pos, NULL);
            if (pipe)
                MT_TRY(mt_pp_exec_forward(pipe, m, tok + j * m->N, tgt + j * m->N, &l, &c));
            else
                l = mt_model_step(m, tok + j * m->N, tgt + j * m->N, false, 0.0f, &c);
            sum[0] += l, sum[1] += (double)c;
        }
    }
    /* a pipeline's loss is on every stage already (mt_pp_exec_forward) */
    MT_TRY(mt_allreduce(sum, tot, 2, MPI_DOUBLE, MPI_SUM, cp->comm));
    *mean = tot[1] > 0 ? tot[0] / tot[1] : NAN;
    return MT_OK;
}
