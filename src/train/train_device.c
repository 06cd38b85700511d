/* train_device.c: backend choice, CUDA bring-up and NCCL communicators
 * for the trainer (train_device.h, doc/gpu.md). */
#include <config.h>

#include "train_device.h"

#include <stdlib.h>
#include <string.h>

#include "mt_clock.h"
#include "mt_comm.h"
#ifdef MT_HAVE_CUDA
#include "mt_cuda.h"
#endif
#ifdef MT_HAVE_NCCL
#include "mt_nccl.h"
#endif

static mt_status_t bring_up_cuda(mt_train_device_t *d, const mt_config_t *cfg,
                                 const mt_mesh_t *mesh)
{
#ifdef MT_HAVE_CUDA
    MPI_Comm node;
    mt_cuda_device_t dev;
    size_t reserved = 0;
    MT_MPI_TRY(MPI_Comm_split_type(mesh->comm, MPI_COMM_TYPE_SHARED, mesh->rank, MPI_INFO_NULL,
                                   &node));
    /* the GPU of the node-local rank, one reservation for everything */
    mt_status_t s = mt_cuda_setup(node, MT_CUDA_SCRATCH_BYTES, &dev, &reserved);
    MPI_Comm_free(&node);
    MT_TRY(mt_agree(mesh->comm, s)); /* no rank goes on to the collectives below alone */
    MT_TRY(mt_allreduce(&dev.cc_major, &d->cc_major, 1, MPI_INT, MPI_MIN, mesh->comm));
    /* bf16 compute: GEMMs and attention on tensor cores (doc/mixed-precision.md) */
    d->be = cfg->distributed.mp_policy.param_dtype == MT_DTYPE_BFLOAT16 ? mt_backend_cuda_bf16()
                                                                       : mt_backend_cuda();
    int own = dev.sharing == 1, all = 0;
    MT_TRY(mt_allreduce(&own, &all, 1, MPI_INT, MPI_MIN, mesh->comm));
    d->own_gpu = all != 0;
    return MT_OK;
#else
    (void)d, (void)cfg, (void)mesh;
    MT_FAIL(MT_ERR_UNSUPPORTED, "distributed.device cuda: this build has no CUDA backend "
            "(configure did not find CUDA, or ran with --without-cuda)");
#endif
}

static mt_status_t bring_up_nccl(mt_train_device_t *d, const mt_config_t *cfg,
                                 const mt_mesh_t *mesh)
{
    mt_collectives_t want = cfg->distributed.collectives;
    if (want == MT_COLL_MPI || mesh->size == 1)
        return MT_OK;
#ifdef MT_HAVE_NCCL
    if (!d->own_gpu) {
        if (want == MT_COLL_NCCL)
            MT_FAIL(MT_ERR_CONFIG, "distributed.collectives nccl: ranks of a node share a GPU, "
                    "and NCCL needs one GPU per rank: give each rank its own GPU, or use "
                    "collectives auto or mpi (MPI on host copies)");
        return MT_OK;
    }
    mt_nccl_t *n = calloc(1, sizeof *n);
    if (!n)
        MT_FAIL(MT_ERR_NOMEM, "NCCL communicators");
    mt_status_t s = mt_nccl_init(n, mesh, (double)cfg->distributed.timeout_s);
    if (s == MT_OK)
        s = mt_nccl_activate(n, mesh);
    if (s != MT_OK) {
        mt_nccl_free(n);
        free(n);
        return s;
    }
    d->nccl_state = n;
    d->nccl = true;
    d->tp_bf16 = cfg->distributed.mp_policy.param_dtype == MT_DTYPE_BFLOAT16;
    return MT_OK;
#else
    if (want == MT_COLL_NCCL)
        MT_FAIL(MT_ERR_UNSUPPORTED, "distributed.collectives nccl: this build has no NCCL "
                "(configure did not find it: --with-nccl=DIR)");
    (void)d;
    return MT_OK;
#endif
}

/* Environment variable name's value when it is set to something but 0,
 * else NULL */
static const char *env_on(const char *name)
{
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0 ? e : NULL;
}

/* MESHTRAIN_BF16_PASSES=1: the bf16 table with rounds_bf16 and reads_bf16
 * cleared, so the model rounds every activation in a pass of its own, as
 * before the roundings moved into the kernels.  The kernels' own roundings
 * then meet bf16 values and change nothing, so a run must give the same
 * bits either way: a check of the fused roundings (tests/emu/cuda_emulation.sh)
 * and a way to bisect a numerical difference on a device. */
static void bf16_passes(mt_train_device_t *d)
{
    static mt_backend_t passes;
    if (!env_on("MESHTRAIN_BF16_PASSES") || !d->be->rounds_bf16 || d->be->stores_bf16)
        return; /* (bf16 storage, refused with it, has no passes to fall back to) */
    passes = *d->be;
    passes.rounds_bf16 = passes.reads_bf16 = false;
    d->be = &passes, d->bf16_passes = true;
}

bool mt_train_bf16_storage_on(const mt_config_t *cfg)
{
    const char *e = getenv("MESHTRAIN_BF16_STORAGE");
    if (e && *e) /* set: 0 off, anything else on */
        return strcmp(e, "0") != 0;
    return cfg->distributed.device == MT_DEVICE_CUDA &&
           cfg->distributed.mp_policy.param_dtype == MT_DTYPE_BFLOAT16 &&
           !env_on("MESHTRAIN_BF16_PASSES");
}

/* bf16 storage (doc/mixed-precision.md, "bf16 storage"): the table whose
 * activation and parameter arenas hold bf16 bits, by default under bf16
 * compute on device cuda (mt_train_bf16_storage_on).  Refused, before
 * anything is allocated, where it was asked for and cannot be. */
static mt_status_t bf16_storage(mt_train_device_t *d, const mt_config_t *cfg)
{
    if (!mt_train_bf16_storage_on(cfg))
        return MT_OK;
    const char *e = getenv("MESHTRAIN_BF16_STORAGE");
    /* by default only where every GPU runs bf16 GEMMs on tensor cores
     * (compute capability 8.0 and up); asked for, anywhere */
    if (!(e && *e) && cfg->distributed.device == MT_DEVICE_CUDA && d->cc_major < 8)
        return MT_OK;
    const mt_distributed_config_t *dc = &cfg->distributed;
    const char *why = NULL;
    if (dc->mp_policy.param_dtype != MT_DTYPE_BFLOAT16)
        why = "it needs mp_policy.param_dtype bfloat16";
    else if (dc->device == MT_DEVICE_CPU_GUARDED)
        why = "distributed.device cpu_guarded has no bf16-storage backend";
    else if (env_on("MESHTRAIN_BF16_PASSES"))
        why = "MESHTRAIN_BF16_PASSES=1 rounds in passes over float32 storage, which bf16 "
              "storage has none of";
    if (why)
        MT_FAIL(MT_ERR_UNSUPPORTED, "MESHTRAIN_BF16_STORAGE=%s: %s (doc/mixed-precision.md, "
                "\"bf16 storage\"); set it to 0 to train with bf16 values in float32 "
                "storage", e ? e : "(default)", why);
#ifdef MT_HAVE_CUDA
    if (dc->device == MT_DEVICE_CUDA) {
        d->be = mt_backend_cuda_bf16_storage(), d->bf16_storage = true;
        return MT_OK;
    }
#endif
    d->be = mt_backend_cpu_bf16_storage(), d->bf16_storage = true;
    return MT_OK;
}

/* MESHTRAIN_PROFILE=1: the backend timed entry by entry (mt_backend_profiled) */
static mt_status_t profile(mt_train_device_t *d)
{
    if (!env_on("MESHTRAIN_PROFILE"))
        return MT_OK;
    const mt_backend_t *p = mt_backend_profiled(d->be);
    if (!p)
        MT_FAIL(MT_ERR_UNSUPPORTED, "MESHTRAIN_PROFILE: one backend per process is profiled");
    d->be = p, d->profile = true;
    return MT_OK;
}

mt_status_t mt_train_device_init(mt_train_device_t *d, const mt_config_t *cfg,
                                 const mt_mesh_t *mesh)
{
    memset(d, 0, sizeof *d);
    /* read by the CUDA attention launchers (cuda_attention_tc.cu): checked
     * here, before anything is allocated, on every device */
    const char *ak = getenv("MESHTRAIN_ATTENTION_KERNEL");
    if (ak && *ak && strcmp(ak, "mma") != 0 && strcmp(ak, "wmma") != 0)
        MT_FAIL(MT_ERR_CONFIG, "MESHTRAIN_ATTENTION_KERNEL=%s: mma (the default) or wmma "
                "(doc/gpu.md)", ak);
    /* bf16 compute: the table whose kernels round their outputs (mt_backend.h) */
    d->be = cfg->distributed.mp_policy.param_dtype == MT_DTYPE_BFLOAT16 ? mt_backend_cpu_bf16()
                                                                       : mt_backend_cpu();
    if (cfg->distributed.device == MT_DEVICE_CPU_GUARDED)
        d->be = mt_backend_cpu_guarded();
    if (cfg->distributed.device == MT_DEVICE_CUDA) {
        MT_TRY(bring_up_cuda(d, cfg, mesh));
        MT_TRY(bring_up_nccl(d, cfg, mesh));
    }
    MT_TRY(bf16_storage(d, cfg));
    bf16_passes(d);
    return profile(d);
}

void mt_train_device_profile_step(mt_train_device_t *d, int64_t steps_done)
{
    if (d->profile && steps_done <= 1) { /* the first step (warm-up) is left out */
        mt_backend_profile_reset();
        d->profile_t0 = mt_now_s();
    }
}

void mt_train_device_end_report(const mt_train_device_t *d, FILE *out)
{
    if (d->profile && out)
        mt_backend_profile_report(out, mt_now_s() - d->profile_t0, 8);
#ifdef MT_HAVE_CUDA
    mt_cuda_lt_stats_t st;
    if (out && d->cc_major > 0) { /* a GPU: the bf16 GEMMs' kept cuBLASLt plans */
        mt_cuda_lt_stats(&st);
        if (st.hits + st.misses > 0)
            fprintf(out, "cuBLASLt: %lld of %lld bf16 GEMMs on this rank reused a kept plan (%d "
                         "kept, %lld made, %lld given up)\n",
                    (long long)st.hits, (long long)(st.hits + st.misses), st.plans,
                    (long long)st.misses, (long long)st.evictions);
    }
#endif
}

void mt_train_device_free(mt_train_device_t *d)
{
#ifdef MT_HAVE_NCCL
    if (d->tp_pad) {
        cudaDeviceSynchronize(); /* the TP group's stream may still read it */
        d->be->device_free(d->tp_pad);
    }
    free(d->tp_counts);
    if (d->nccl_state) {
        mt_nccl_deactivate();
        mt_nccl_free(d->nccl_state);
        free(d->nccl_state);
    }
#endif
    memset(d, 0, sizeof *d);
}

#ifdef MT_HAVE_NCCL
/* bf16 on the wire (mt_tp_comm.h): the float sums, gathers and
 * reduce-scatters through the padded bf16 collectives of mt_nccl.h, their
 * wire buffer d->tp_pad (n bf16 elements for a sum, tp x n for a gather or
 * reduce-scatter; grown in the first step,
 * after the group's collectives that may still read it) */
static mt_status_t tp_bf16(mt_train_device_t *d, mt_nccl_group_t *g, const void *in, void *out,
                           int64_t n, mt_tp_op_t op, cudaStream_t cs)
{
    bool parts = op == MT_TP_GATHER_FLOAT || op == MT_TP_SCATTER_FLOAT; /* a slot per rank */
    size_t need = 2 * (size_t)n * (parts ? (size_t)g->size : 1);
    if (need > d->tp_pad_bytes || !d->tp_counts) {
        MT_TRY(mt_nccl_wait(g, "tensor-parallel wire buffer"));
        d->be->device_free(d->tp_pad);
        free(d->tp_counts);
        d->tp_counts = malloc(2 * sizeof(int) * (size_t)g->size);
        if (!(d->tp_pad = d->be->device_alloc(need)) || !d->tp_counts)
            MT_FAIL(MT_ERR_NOMEM, "tensor-parallel bf16 wire buffer of %zu bytes", need);
        d->tp_pad_bytes = need;
    }
    int *counts = d->tp_counts, *displs = d->tp_counts + g->size;
    for (int r = 0; r < g->size; r++)
        counts[r] = (int)n, displs[r] = (int)(r * n);
    if (op == MT_TP_GATHER_FLOAT)
        return mt_nccl_all_gatherv(g, in, out, counts, displs, d->tp_pad, MT_NCCL_BF16, cs);
    if (op == MT_TP_SCATTER_FLOAT)
        return mt_nccl_reduce_scatterv(g, in, out, counts, displs, d->tp_pad, 1, cs);
    if (in != out)
        d->be->copy(out, in, sizeof(float) * (size_t)n);
    return mt_nccl_all_reduce_f32(g, out, (size_t)n, d->tp_pad, 1, cs);
}
#endif

bool mt_train_device_tp(mt_train_device_t *d, MPI_Comm tp, const void *in, void *out, int64_t n,
                        mt_tp_op_t op, void **ticket)
{
#ifdef MT_HAVE_NCCL
    mt_nccl_group_t *g = d->nccl ? mt_nccl_for(tp) : NULL;
    if (!g)
        return false;
    cudaStream_t cs = (cudaStream_t)mt_cuda_stream();
    size_t c = (size_t)n;
    mt_status_t s = MT_OK;
    switch (op) {
    case MT_TP_SUM_FLOAT:
    case MT_TP_GATHER_FLOAT:
    case MT_TP_SCATTER_FLOAT:
        if (d->tp_bf16 && d->bf16_storage) { /* bf16 bits already: NCCL's bf16 as it is */
            if (op == MT_TP_GATHER_FLOAT)
                s = mt_nccl_all_gather(g, in, out, c, ncclBfloat16, cs);
            else if (op == MT_TP_SCATTER_FLOAT)
                s = mt_nccl_reduce_scatter(g, in, out, c, ncclBfloat16, ncclSum, cs);
            else
                s = mt_nccl_all_reduce(g, in, out, c, ncclBfloat16, ncclSum, cs);
            break;
        }
        if (d->tp_bf16) {
            s = tp_bf16(d, g, in, out, n, op, cs);
            break;
        }
        if (op == MT_TP_GATHER_FLOAT)
            s = mt_nccl_all_gather(g, in, out, c, ncclFloat32, cs);
        else if (op == MT_TP_SCATTER_FLOAT)
            s = mt_nccl_reduce_scatter(g, in, out, c, ncclFloat32, ncclSum, cs);
        else
            s = mt_nccl_all_reduce(g, in, out, c, ncclFloat32, ncclSum, cs);
        break;
    case MT_TP_MAX_FLOAT:
        s = mt_nccl_all_reduce(g, in, out, c, ncclFloat32, ncclMax, cs);
        break;
    case MT_TP_SUM_DOUBLE:
        s = mt_nccl_all_reduce(g, in, out, c, ncclFloat64, ncclSum, cs);
        break;
    }
    if (s == MT_OK && ticket) /* the caller joins it (mt_stage_join) */
        *ticket = mt_nccl_last_event(g);
    else if (s == MT_OK)
        s = mt_nccl_join(g, cs);
    if (s != MT_OK) /* the other TP ranks are inside this collective */
        mt_comm_fatal(tp, MPI_ERR_OTHER, "tensor-parallel collective (NCCL)");
    return true;
#else
    (void)d, (void)tp, (void)in, (void)out, (void)n, (void)op, (void)ticket;
    return false;
#endif
}

void mt_train_device_print(const mt_train_device_t *d, const mt_config_t *cfg, FILE *out)
{
    if (cfg->distributed.device != MT_DEVICE_CUDA)
        return;
    fprintf(out, "device: %s backend%s, collectives %s\n", d->be->name,
            d->bf16_passes ? " (MESHTRAIN_BF16_PASSES: rounding in passes)" : "",
            d->nccl ? "NCCL (one communicator per mesh group and per pipeline channel)"
                    : "MPI on host copies (staged)");
}
