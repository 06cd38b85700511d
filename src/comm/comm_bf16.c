/* comm_bf16.c: bfloat16 messages for the data-parallel collectives
 * (mt_comm_bf16.h).  The conversions are safetensors.c's, so a value
 * rounds the same way on the wire, in a checkpoint export and in the
 * backend's round_bf16. */
#include "mt_comm_bf16.h"

#include "mt_bf16.h" /* mt_f32_to_bf16, mt_bf16_to_f32 */
#include "mt_stage.h"

/* inout[i] = bf16(in[i] + inout[i]), the sum taken in float32.  MPI passes
 * the lower ranks' partial result as `in`; float addition of two operands
 * is commutative, so only the grouping (fixed by commute = 0) matters. */
static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = mt_f32_to_bf16(mt_bf16_to_f32(a[i]) + mt_bf16_to_f32(b[i]));
}

mt_status_t mt_bf16_comm_init(mt_bf16_comm_t *c)
{
    c->ready = false;
    /* A derived type rather than MPI_UINT16_T, so that MPI_SUM on it is an
     * error instead of an integer sum of bit patterns. */
    MT_MPI_TRY(MPI_Type_contiguous(1, MPI_UINT16_T, &c->type));
    MT_MPI_TRY(MPI_Type_commit(&c->type));
    MT_MPI_TRY(MPI_Type_set_name(c->type, "mt_bf16"));
    MT_MPI_TRY(MPI_Op_create(sum_bf16, 0, &c->sum));
    c->ready = true;
    return MT_OK;
}

void mt_bf16_comm_free(mt_bf16_comm_t *c)
{
    if (!c->ready)
        return;
    MPI_Op_free(&c->sum);
    MPI_Type_free(&c->type);
    c->ready = false;
}

void mt_bf16_pack(uint16_t *dst, const float *src, int64_t n)
{
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++)
        dst[i] = mt_f32_to_bf16(src[i]);
}

void mt_bf16_unpack(float *dst, const uint16_t *src, int64_t n)
{
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++)
        dst[i] = mt_bf16_to_f32(src[i]);
}

void mt_bf16_pack_from(const mt_backend_t *be, uint16_t *dst, const float *x, float *scratch,
                       int64_t n)
{
    if (mt_stage_needed(be)) {
        be->copy_to_host(scratch, x, sizeof(float) * (size_t)n);
        x = scratch;
    }
    mt_bf16_pack(dst, x, n);
}

void mt_bf16_unpack_to(const mt_backend_t *be, float *x, const uint16_t *src, float *scratch,
                       int64_t n)
{
    if (!mt_stage_needed(be)) {
        mt_bf16_unpack(x, src, n);
        return;
    }
    mt_bf16_unpack(scratch, src, n);
    be->copy_to_device(x, scratch, sizeof(float) * (size_t)n);
}
