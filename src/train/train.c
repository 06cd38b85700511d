/* train.c: the training loop (data -> forward/backward -> clip -> AdamW),
 * with resume, checkpoints, pre-emption signals, validation, the step log
 * and metrics.jsonl.  Everything the loop needs is allocated before the
 * first step.  Checkpoint tensor lists: train_ckpt.c. */
#include <config.h>

#include "mt_train.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mt_backend.h"
#include "mt_checkpoint.h"
#ifdef MT_HAVE_CUDA
#include "mt_cuda.h"
#endif
#include "mt_comm.h"
#include "mt_ddp.h"
#include "mt_data.h"
#include "mt_fsdp.h"
#include "mt_model.h"
#include "mt_optim.h"
#include "mt_pack.h"
#include "mt_plan.h"
#include "mt_pp_exec.h"
#include "mt_stage.h"
#include "train_cp.h"
#include "train_internal.h"
#include "train_moe.h"
#include "mt_tp_comm.h"
#include "moe_layout.h"
#include "train_device.h"
#include "train_mp.h"
#include "mt_clock.h"

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

double mt_measure_sgemm_gflops(int64_t n, int reps)
{
    const mt_backend_t *be = mt_backend_cpu();
    float *a = malloc(sizeof(float) * (size_t)(n * n)), *b = malloc(sizeof(float) * (size_t)(n * n));
    float *c = malloc(sizeof(float) * (size_t)(n * n));
    double best = 0;
    if (a && b && c) {
        for (int64_t i = 0; i < n * n; i++)
            a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
        be->matmul(c, a, b, n, n, n, false, false, 0.0f); /* warm-up */
        for (int r = 0; r < reps; r++) {
            double t = mt_now_s();
            be->matmul(c, a, b, n, n, n, false, false, 0.0f);
            double g = 2.0 * (double)n * (double)n * (double)n / (mt_now_s() - t) / 1e9;
            if (g > best)
                best = g;
        }
    }
    free(a), free(b), free(c);
    return best;
}

static void fmt_hms(double s, char *buf, size_t cap)
{
    long t = (long)(s + 0.5);
    snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
}

/* Mean loss over up to 64 batches of `rows` samples of the validation set,
 * in order (through the pipeline's stages, a microbatch at a time, when
 * there is one); tok and tgt hold rows samples. */
static mt_status_t validation_loss(mt_model_t *m, mt_pp_exec_t *pipe, const mt_dataset_t *val,
                                   int64_t rows, int32_t *tok, int32_t *tgt, double *mean)
{
    mt_sampler_t vs = {mt_dataset_num_samples(val, m->T), m->T, false, 0};
    int64_t batches = vs.num_samples / rows;
    if (batches > 64)
        batches = 64;
    double sum = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < batches; i++) {
        mt_data_fill_batch(val, &vs, i, rows, 0, 1, 0, rows, tok, tgt);
        for (int64_t j = 0; j < rows / m->B; j++) {
            int64_t c = 0;
            double l;
            if (pipe)
                MT_TRY(mt_pp_exec_forward(pipe, m, tok + j * m->N, tgt + j * m->N, &l, &c));
            else
                l = mt_model_step(m, tok + j * m->N, tgt + j * m->N, false, 0.0f, &c);
            sum += l;
            count += c;
        }
    }
    *mean = count ? sum / (double)count : NAN;
    return MT_OK;
}

/* A relative data path is looked up in the current directory first, then
 * beside the config file, so a shipped config finds the data shipped with
 * it both in the source tree and after `make install`.  For the Megatron
 * format the path may be a prefix, so "exists" also accepts PATH.bin. */
static void resolve_data_path(const char *path, const char *config_file, char *out, size_t cap)
{
    char probe[MT_PATH_MAX + 8];
    snprintf(out, cap, "%s", path);
    if (!path[0] || path[0] == '/' || !config_file[0])
        return;
    snprintf(probe, sizeof probe, "%s.bin", path);
    if (access(path, F_OK) == 0 || access(probe, F_OK) == 0)
        return;
    const char *slash = strrchr(config_file, '/');
    if (!slash)
        return;
    char alt[2 * MT_PATH_MAX + 2];
    snprintf(alt, sizeof alt, "%.*s/%s", (int)(slash - config_file), config_file, path);
    snprintf(probe, sizeof probe, "%.*s.bin", MT_PATH_MAX - 1, alt);
    if (access(alt, F_OK) == 0 || access(probe, F_OK) == 0)
        snprintf(out, cap, "%s", alt);
}

typedef struct {
    mt_dataset_t data, val;
    int have_val;
    mt_model_t model;
    mt_adamw_t opt;
    int32_t *tokens, *targets;   /* [accum][B*T] */
    bool packed;                 /* packed_sequence_size > 0 */
    mt_packing_t pack;
    int32_t *pos, *docs;         /* packed rows: [accum][B*T] */
    mt_train_ckpt_t ckpt;
    mt_ddp_t ddp;                /* replicated strategies */
    bool sharded;                /* else: fsdp over data parallelism */
    mt_fsdp_t fsdp;
    mt_segment_t whole;
    const mt_segment_t *seg;     /* what this rank updates */
    int nseg;
    MPI_Comm tp;                 /* tensor-parallel group */
    mt_tp_comm_t tpc;            /* its collectives over MPI */
    bool staged;                 /* backend memory is not host memory: checkpoints
                                  * and tp_partial_grad sums go through host
                                  * copies (`stage`, mt_stage.h) */
    mt_stage_buf_t stage;
    bool pp;                     /* pipeline parallelism: the model is this
                                  * rank's stages, run by the executor */
    mt_pp_exec_t pipe;
    MPI_Comm ppc;                /* pipeline group */
    int64_t rows;                /* samples per rank per micro-step */
    mt_train_cp_t cp;            /* context parallelism (train_cp.c) */
    mt_train_moe_t moe;          /* experts, aux loss, expert load (train_moe.c) */
    mt_train_mp_t mp;            /* bf16 compute: fp32 master weights (train_mp.c) */
    mt_train_device_t device;    /* backend, GPU, NCCL (train_device.c) */
} run_t;

static void run_free(run_t *r)
{
    mt_dataset_close(&r->data);
    if (r->have_val)
        mt_dataset_close(&r->val);
    mt_model_free(&r->model);
    mt_adamw_free(&r->opt);
    free(r->tokens);
    free(r->targets);
    free(r->pos);
    free(r->docs);
    mt_pack_free(&r->pack);
    mt_train_ckpt_free(&r->ckpt);
    mt_ddp_free(&r->ddp);
    mt_fsdp_free(&r->fsdp);
    mt_pp_exec_free(&r->pipe);
    mt_train_cp_free(&r->cp);
    mt_train_moe_free(&r->moe);
    mt_train_mp_free(&r->mp);
    mt_stage_buf_free(&r->stage);
    mt_tp_comm_free(&r->tpc);
    mt_train_device_free(&r->device);
}

/* The model's tensor-parallel collectives: NCCL when the TP group has a
 * communicator, else MPI (staged, bf16 on the wire under bf16 compute:
 * mt_tp_comm.h). */
static void *tp_start(void *ctx, const void *in, void *out, int64_t n, mt_tp_op_t op)
{
    run_t *r = ctx;
    void *ticket = NULL;
    if (mt_train_device_tp(&r->device, r->tp, in, out, n, op, &ticket)) /* NCCL */
        return ticket;
    /* mid-forward/backward: the TP peers cannot be told, so a failure aborts */
    if (mt_tp_comm_run(&r->tpc, in, out, n, op) != MT_OK)
        mt_comm_fatal(r->tp, MPI_ERR_OTHER, "tensor-parallel collective");
    return NULL;
}

static void tp_join(void *ctx, void *ticket)
{
    run_t *r = ctx;
    if (mt_stage_join(ticket) != MT_OK)
        mt_comm_fatal(r->tp, MPI_ERR_OTHER, "tensor-parallel collective (join)");
}

static void tp_hook(void *ctx, const void *in, void *out, int64_t n, mt_tp_op_t op)
{
    tp_join(ctx, tp_start(ctx, in, out, n, op));
}

/* Data, model, the data-parallel layer and the optimizer.  mesh gives the
 * groups: every rank is data parallel in this release. */
static mt_status_t setup(run_t *r, const mt_config_t *cfg, const mt_mesh_t *mesh)
{
    MT_TRY(mt_train_device_init(&r->device, cfg, mesh));
    const mt_backend_t *be = r->device.be;
    int64_t B = cfg->step_scheduler.local_batch_size, T = cfg->derived.seq_len;
    r->rows = B;
    int64_t accum = cfg->derived.grad_accum_steps;
    if (!cfg->dataset.path[0])
        MT_FAIL(MT_ERR_CONFIG, "dataset.path is empty: set it to an llm.c .bin file or a Megatron "
                "prefix (make one with meshtrain-data)");
    char path[MT_PATH_MAX];
    resolve_data_path(cfg->dataset.path, cfg->source_file, path, sizeof path);
    MT_TRY(mt_dataset_open(&r->data, path, cfg->dataset.format, cfg->model.vocab_size));
    r->packed = cfg->packed_sequence.packed_sequence_size > 0;
    if (r->packed)
        MT_TRY(mt_pack_init(&r->pack, &r->data, T, cfg->dataset.shuffle,
                            (uint64_t)cfg->dataset.seed));
    else if (mt_dataset_num_samples(&r->data, T) < 1)
        MT_FAIL(MT_ERR_CONFIG, "%s: %lld tokens are fewer than one sample of seq_len %lld + 1",
                cfg->dataset.path, (long long)r->data.n_tokens, (long long)T);
    if (cfg->dataset.validation_path[0]) {
        resolve_data_path(cfg->dataset.validation_path, cfg->source_file, path, sizeof path);
        MT_TRY(mt_dataset_open(&r->val, path, cfg->dataset.format,
                               cfg->model.vocab_size));
        r->have_val = 1;
    }
    mt_fsdp_options_t fo;
    r->sharded = mt_fsdp_options_from_config(cfg, &fo);
    unsigned flags = 0;
    if (r->sharded)
        flags = (fo.shard_params ? MT_MODEL_NO_PARAM_ARENA : 0u) |
                (fo.shard_grads ? MT_MODEL_NO_GRAD_ARENA : 0u);
    mt_model_part_t part, *pp_part = NULL;
    r->pp = cfg->distributed.pp_size > 1;
    r->ppc = mesh->group[MT_GROUP_PP];
    if (r->pp) { /* this rank's stages, one microbatch at a time */
        MT_TRY(mt_pp_exec_init(&r->pipe, cfg, r->ppc));
        mt_pp_exec_part(&r->pipe, &part);
        pp_part = &part;
        B = cfg->distributed.pipeline.pp_microbatch_size;
        fo.pipeline = true;
    }
    /* under context parallelism the model holds T / cp tokens of each row */
    int cp = (int)cfg->distributed.cp_size;
    MT_TRY(mt_train_moe_check(cfg, mesh->size));
    if (cfg->model.num_experts > 0) { /* experts: train_moe.c */
        if (mt_moe_experts_sharded(cfg))
            flags |= MT_MODEL_NO_EXPERT_ARENAS;
        int ep_rank = cfg->distributed.ep_size > 1 ? mesh->group_rank[MT_GROUP_EP] : -1;
        MT_TRY(mt_model_init_ep(&r->model, cfg, be, B, T / cp, flags,
                                mesh->group_rank[MT_GROUP_TP], ep_rank, pp_part));
    } else {
        MT_TRY(mt_model_init_part(&r->model, cfg, be, B, T / cp, flags,
                                  mesh->group_rank[MT_GROUP_TP], pp_part));
    }
    MT_TRY(mt_train_cp_init(&r->cp, mesh, &r->model, r->rows, T));
    r->tp = mesh->group[MT_GROUP_TP];
    r->staged = mt_stage_needed(be);
    MT_TRY(mt_tp_comm_init(&r->tpc, r->tp, be, cfg->distributed.mp_policy.param_dtype ==
                                                   MT_DTYPE_BFLOAT16));
    r->model.tp_allreduce = tp_hook;
    r->model.tp_start = tp_start;
    r->model.tp_join = tp_join;
    r->model.tp_ctx = r;
    int64_t owned = r->model.numel;
    if (r->sharded) {
        /* fsdp2 shards over dp_shard (all-reducing across dp_replicate:
         * HSDP); megatron_fsdp over the whole dp group.  CP ranks hold the
         * same parameters, so with cp > 1 the shard groups take them in
         * (dp_shard_cp, dp_cp). */
        bool f2 = cfg->distributed.strategy == MT_STRATEGY_FSDP2;
        MPI_Comm shard = mesh->group[f2 ? (cp > 1 ? MT_GROUP_DP_SHARD_CP : MT_GROUP_DP_SHARD)
                                        : (cp > 1 ? MT_GROUP_DP_CP : MT_GROUP_DP)];
        MPI_Comm rep = f2 && mesh->group_size[MT_GROUP_DP_REPLICATE] > 1
                           ? mesh->group[MT_GROUP_DP_REPLICATE] : MPI_COMM_NULL;
        MT_TRY(mt_fsdp_init(&r->fsdp, &r->model, shard, rep, &fo));
        mt_fsdp_init_weights(&r->fsdp, (uint64_t)cfg->rng.seed);
        r->seg = r->fsdp.seg, r->nseg = r->fsdp.nunits, owned = r->fsdp.owned;
    } else {
        mt_model_init_weights(&r->model, (uint64_t)cfg->rng.seed);
        MT_TRY(mt_ddp_init(&r->ddp, mesh->group[cp > 1 ? MT_GROUP_DP_CP : MT_GROUP_DP], &r->model,
                           (int64_t)(cfg->distributed.ddp_bucket_cap_mb * 1048576.0),
                           cfg->distributed.mp_policy.reduce_dtype == MT_DTYPE_BFLOAT16));
        /* megatron_fsdp zero 0: overlap_grad_reduce false reduces after backward */
        if (cfg->distributed.strategy == MT_STRATEGY_MEGATRON_FSDP)
            r->ddp.overlap = cfg->distributed.overlap_grad_reduce;
        r->whole = mt_segment_whole(&r->model);
        r->seg = &r->whole, r->nseg = 1;
    }
    /* bf16 compute: where the optimizer's segments are the parameter arena
     * (everything but sharded parameters), the master weights move out */
    bool params_sharded = r->sharded && fo.shard_params;
    MT_TRY(mt_train_mp_init(&r->mp, &r->model, r->seg, r->nseg, owned, !params_sharded,
                            (uint64_t)cfg->rng.seed, &r->seg));
    MT_TRY(mt_adamw_init(&r->opt, be, owned));
    MT_TRY(mt_train_moe_init(&r->moe, &r->model, cfg, mesh));
    size_t nbuf = (size_t)(accum * r->rows * T);
    r->tokens = malloc(sizeof(int32_t) * nbuf);
    r->targets = malloc(sizeof(int32_t) * nbuf);
    if (r->packed || cp > 1) { /* under CP plain rows have positions too: global ones */
        r->pos = malloc(sizeof(int32_t) * nbuf);
        r->docs = malloc(sizeof(int32_t) * nbuf);
    }
    if (!r->tokens || !r->targets || ((r->packed || cp > 1) && (!r->pos || !r->docs)))
        MT_FAIL(MT_ERR_NOMEM, "batch buffers");
    /* parameters are saved from the segments (master weights) when sharded
     * or apart from the bf16 arena, else from the arena */
    bool from_seg = params_sharded || r->mp.master;
    MT_TRY(mt_train_ckpt_init(&r->ckpt, cfg, &r->model, &r->opt, r->seg, r->nseg, from_seg));
    /* Who writes what: replicas of a block leave it to the first of them.
     * Sharded state's replicas are the HSDP replicas (megatron_fsdp shards
     * over all of dp: none); whole state's are every dp rank, and every
     * CP rank (dp_cp; the same group as dp without CP). */
    bool rep0 = !r->sharded || r->fsdp.nrep == 1 || mesh->group_rank[MT_GROUP_DP_REPLICATE] == 0;
    bool dp0 = mesh->group_rank[MT_GROUP_DP_CP] == 0;
    mt_train_ckpt_writers(&r->ckpt, r->sharded && from_seg ? rep0 : dp0,
                          r->sharded ? rep0 : dp0, mesh->group_rank[MT_GROUP_TP] == 0);
    MT_TRY(mt_train_moe_ckpt(&r->moe, &r->ckpt, &r->model));
    /* a device's memory is staged through host copies; the CPU's is host memory */
    mt_train_ckpt_stage(&r->ckpt, r->staged ? be : NULL);
    return MT_OK;
}

/* Global gradient norm over every shard, clipping, the AdamW update of this
 * rank's segments, and the all-gather that unsharded parameters need. */
static mt_status_t update(run_t *r, const mt_config_t *cfg, int64_t step, double *gnorm,
                          double *lr)
{
    mt_model_t *m = &r->model;
    /* [0] tensors split over TP ranks, [1] tensors every TP rank holds
     * whole (one kind without TP).  Neighbouring tensors of a kind are
     * summed in one call: on a device each call waits for its result. */
    double part[2] = {0, 0}, sum[2];
    for (int k = 0; k < r->nseg; k++) {
        const mt_segment_t *g = &r->seg[k];
        float *run = NULL;
        int64_t len = 0;
        int kind = 0;
        for (int i = 0; i < m->nparams; i++) {
            const mt_param_t *p = &m->params[i];
            int64_t a, n = mt_param_overlap(p, g->offset, g->offset + g->count, &a);
            if (n == 0)
                continue;
            float *grad = g->grad + (a - g->offset);
            if (p->tp_partial_grad) /* per-head norm weights: each TP rank has its heads' share */
                MT_TRY(mt_stage_allreduce_grad(m->be, &r->stage, grad, n, r->tp,
                                               cfg->distributed.mp_policy.reduce_dtype ==
                                                   MT_DTYPE_BFLOAT16));
            int kd = m->tp > 1 && p->tp_dim < 0 ? 1 : 0;
            if (run && kd == kind && run + len == grad) {
                len += n;
                continue;
            }
            if (run)
                part[kind] += m->be->sum_squares(run, len);
            run = grad, len = n, kind = kd;
        }
        if (run)
            part[kind] += m->be->sum_squares(run, len);
    }
    if (r->sharded) { /* replicas (HSDP) hold the same shard: sum over the shard group */
        MT_TRY(mt_allreduce(part, sum, 2, MPI_DOUBLE, MPI_SUM, r->fsdp.shard));
        part[0] = sum[0], part[1] = sum[1];
    }
    if (m->tp > 1) {
        MT_TRY(mt_allreduce(&part[0], &sum[0], 1, MPI_DOUBLE, MPI_SUM, r->tp));
        part[0] = sum[0];
    }
    if (r->pp) { /* every stage holds different parameters */
        MT_TRY(mt_allreduce(part, sum, 2, MPI_DOUBLE, MPI_SUM, r->ppc));
        part[0] = sum[0], part[1] = sum[1];
    }
    double experts = 0; /* the experts' reduction and share of the norm (train_moe.c) */
    MT_TRY(mt_train_moe_grad_sumsq(&r->moe, m, &experts));
    *gnorm = sqrt(part[0] + part[1] + experts);
    double coef = mt_clip_coef(*gnorm, cfg->optimizer.max_grad_norm);
    *lr = mt_lr_at(cfg, step);
    /* clipping inside the update: its coefficient scales each gradient as
     * AdamW reads it */
    mt_adamw_step(&r->opt, m, r->seg, r->nseg, &cfg->optimizer, *lr, (float)coef);
    r->moe.opt.step = r->opt.step - 1; /* the same step count, also after a resume */
    MT_TRY(mt_train_moe_update(&r->moe, m, coef, &cfg->optimizer, *lr));
    /* bf16 compute: the update wrote the master weights' bf16 copy too */
    if (r->sharded)
        MT_TRY(mt_fsdp_after_update(&r->fsdp));
    return MT_OK;
}

/* The log's memory lines: measured bytes next to meshtrain-plan's estimate. */
static void print_memory(const run_t *r, const mt_config_t *cfg, FILE *out)
{
    const mt_model_t *m = &r->model;
    mt_plan_t plan;
    double mib = 1024.0 * 1024.0, act = 4.0 * (double)m->act_numel;
    /* the parameter arena: bf16 bits under bf16 storage; gradients float32 */
    double ps = (m->bf16_storage ? 2.0 : 4.0) * (double)m->numel, pw = 0;
    double gs = 4.0 * (double)m->numel, gw = 0;
    if (r->sharded)
        mt_fsdp_bytes(&r->fsdp, &ps, &pw, &gs, &gw);
    mt_train_moe_bytes(&r->moe, m, &ps, &pw, &gs, &gw, &act);
    if (r->cp.size > 1) /* the ring's shards */
        act += mt_ring_attention_bytes(&r->cp.ring);
    if (mt_plan_compute_ex(cfg, m->bf16_storage ? MT_PLAN_BF16_STORAGE : 0, &plan) != MT_OK)
        return;
    fprintf(out, "memory per rank (MiB, measured / plan estimate): parameters %.3f / %.3f, "
                 "gradients %.3f / %.3f, optimizer state %.3f / %.3f, activations %.3f / %.3f\n",
            (ps + pw) / mib, plan.bytes_params / mib, (gs + gw) / mib, plan.bytes_grads / mib,
            (mt_train_mp_optim_bytes(&r->mp, r->opt.numel) +
             mt_train_mp_optim_bytes(&r->moe.mp, r->moe.opt.numel)) / mib,
            plan.bytes_optim / mib, act / mib,
            plan.bytes_activations / mib);
#ifdef MT_HAVE_CUDA
    if (cfg->distributed.device == MT_DEVICE_CUDA) {
        size_t size, used, peak;
        mt_cuda_pool_stats(&size, &used, &peak);
        fprintf(out, "device memory (MiB): pool %.1f (one cudaMalloc less the backend's "
                     "workspace), %.1f in use, peak %.1f, plan estimate %.1f\n",
                (double)size / mib, (double)used / mib, (double)peak / mib,
                mt_plan_device_pool_bytes(&plan) / mib);
    }
#endif
    if (r->sharded)
        fprintf(out, "sharded over %d ranks (model %.3f MiB): parameters %.3f own + %.3f "
                     "gathered units, gradients %.3f own + %.3f unit buffers, optimizer state "
                     "%.3f own\n",
                r->fsdp.nshard, 4.0 * (double)m->numel / mib, ps / mib, pw / mib, gs / mib,
                gw / mib, mt_train_mp_optim_bytes(&r->mp, r->opt.numel) / mib);
}

static void write_metrics(FILE *f, int64_t step, double loss, double gnorm, double lr,
                          int64_t tokens, double dt, double tps, double mfu, double val,
                          double wait, const char *extra)
{
    if (!f)
        return;
    fprintf(f, "{\"step\": %lld, \"loss\": %.17g, \"grad_norm\": %.17g, \"lr\": %.9g, "
               "\"tokens\": %lld, \"step_time_s\": %.6f, \"tokens_per_s\": %.3f, \"mfu\": %.6f",
            (long long)step, loss, gnorm, lr, (long long)tokens, dt, tps, mfu);
    if (!isnan(val))
        fprintf(f, ", \"val_loss\": %.9g", val);
    fprintf(f, ", \"comm_wait_s\": %.6f%s}\n", wait, extra);
    fflush(f);
}

mt_status_t mt_train(MPI_Comm comm, const mt_config_t *cfg, const mt_mesh_t *mesh, FILE *out,
                     mt_train_result_t *res)
{
    int rank, size;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    MT_MPI_TRY(MPI_Comm_size(comm, &size));
    memset(res, 0, sizeof *res);
    res->resumed_from_step = -1;
    /* Rows are dealt out by dp rank; the loss (sum and token count) is
     * summed over dp_cp, which is dp without context parallelism. */
    MPI_Comm dpcp = mesh->group[MT_GROUP_DP_CP];
    int dp_rank = mesh->group_rank[MT_GROUP_DP], dp_size = mesh->group_size[MT_GROUP_DP];
    mt_comm_set_wait_mode(mesh->node);
    int threads = mt_comm_set_threads(mesh->node);

    run_t *r = calloc(1, sizeof *r);
    if (!r)
        MT_FAIL(MT_ERR_NOMEM, "run state");
    mt_status_t s = mt_agree(comm, setup(r, cfg, mesh)); /* nobody goes on alone */
    if (s == MT_OK && r->pp) /* the pipeline's channels: collective over pp */
        s = mt_agree(comm, mt_pp_exec_connect(&r->pipe, r->device.be, r->device.nccl,
                                              cfg->distributed.mp_policy.param_dtype ==
                                                  MT_DTYPE_BFLOAT16,
                                              r->model.Ns * r->model.H));
    if (s != MT_OK) {
        mt_error_trace(__FILE__, __LINE__);
        run_free(r), free(r);
        return s;
    }
    mt_model_t *m = &r->model;
    /* N: tokens of a rank's micro-step, its part of each row under CP (the
     * pipeline cuts it into microbatches) */
    int64_t N = r->rows * m->T, accum = cfg->derived.grad_accum_steps;
    int64_t G = cfg->step_scheduler.global_batch_size, T = cfg->derived.seq_len; /* full rows */
    mt_sampler_t sampler = {r->packed ? r->pack.rows : mt_dataset_num_samples(&r->data, T), T,
                            cfg->dataset.shuffle, (uint64_t)cfg->dataset.seed};

    /* ---- resume ---- */
    int64_t start = 0;
    s = mt_train_resume(comm, cfg, &r->ckpt, &start, out);
    if (s == MT_OK && r->mp.master) { /* loaded master weights: their bf16 copy */
        mt_train_mp_refresh(&r->mp);
        if (r->sharded) /* megatron_fsdp zero 1/2: spread the shards */
            s = mt_fsdp_after_update(&r->fsdp);
    }
    if (s == MT_OK)
        s = mt_train_moe_after_load(&r->moe);
    if (s != MT_OK)
        goto fail;
    res->resumed_from_step = start > 0 || r->ckpt.resumed ? (int)start : -1;
    res->last_step = start;
    if (cfg->checkpoint.enabled && cfg->checkpoint.save_initial) {
        /* the starting state, unless checkpoint_dir holds it already: a
         * checkpoint resumed from elsewhere is written again on this mesh */
        int have = 0;
        if (rank == 0) {
            char dir[MT_PATH_MAX + 32];
            snprintf(dir, sizeof dir, "%s/step_%08lld", cfg->checkpoint.checkpoint_dir,
                     (long long)start);
            have = access(dir, F_OK) == 0;
        }
        MPI_Bcast(&have, 1, MPI_INT, 0, comm);
        s = have ? MT_OK : mt_train_save(comm, cfg, &r->ckpt, start, G);
        if (s != MT_OK)
            goto fail;
    }

    /* MFU's peak: on the CPU the measured sgemm rate; on a GPU its dense
     * bf16 peak, MT_PEAK_TFLOPS (default 989: H100 and H200 SXM) */
    double peak;
    if (cfg->distributed.device == MT_DEVICE_CUDA) {
        const char *e = getenv("MT_PEAK_TFLOPS");
        double tf = e && atof(e) > 0 ? atof(e) : 989.0;
        peak = tf * 1e3 * (double)size;
    } else {
        peak = mt_measure_sgemm_gflops(1024, 3) * (double)size;
    }
    /* the model is this TP rank's part: matmuls and heads split evenly */
    double flops_tok = mt_model_flops_per_token(m) * (double)m->tp;
    /* under CP the model holds T / cp tokens, but each still attends over its row */
    flops_tok += 6.0 * (double)(m->L * (T - m->T) * m->H) * (double)m->tp;
    if (r->pp) { /* each stage's share */
        double t = flops_tok;
        s = mt_allreduce(&t, &flops_tok, 1, MPI_DOUBLE, MPI_SUM, r->ppc);
        if (s != MT_OK)
            goto fail;
    }
    FILE *metrics = NULL;
    if (rank == 0 && cfg->logging.metrics_file[0]) {
        metrics = fopen(cfg->logging.metrics_file, start > 0 ? "a" : "w");
        if (!metrics)
            s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: cannot open the metrics file",
                             cfg->logging.metrics_file);
    }
    s = mt_agree(comm, s); /* rank 0's failure to open it stops every rank */
    if (s != MT_OK)
        goto fail;
    if (rank == 0 && out) {
        print_memory(r, cfg, out);
        if (r->packed)
            fprintf(out, "packed %lld documents (%lld pieces, %lld tokens) into %lld rows of "
                         "%lld tokens: %.1f%% padding\n",
                    (long long)r->data.n_docs, (long long)r->pack.pieces,
                    (long long)r->pack.tokens, (long long)r->pack.rows, (long long)T,
                    100.0 * (1.0 - (double)r->pack.tokens / (double)(r->pack.rows * T)));
        fprintf(out, "training: %lld parameters, %lld steps from step %lld, %lld tokens/step "
                     "(%lld micro-steps of %lld x %lld), %d threads per rank, %s peak %.1f GFLOP/s\n",
                (long long)mt_model_logical_numel(&r->ckpt.whole),
                (long long)cfg->step_scheduler.max_steps, (long long)start, (long long)(G * T),
                (long long)accum, (long long)r->rows, (long long)T, threads,
                cfg->distributed.device == MT_DEVICE_CUDA ? "device (MT_PEAK_TFLOPS)" : "sgemm",
                peak);
        mt_train_device_print(&r->device, cfg, out);
        if (m->bf16) {
            const mt_mp_policy_t *mp = &cfg->distributed.mp_policy;
            fprintf(out, "mixed precision: bf16 parameters and activations (%s%s; between "
                         "ranks they travel as bf16), fp32 master weights%s, gradients reduced "
                         "in %s\n",
                    m->bf16_storage ? "bf16 storage; MESHTRAIN_BF16_STORAGE=0 for float32"
                                    : "bf16 values in float32 storage",
                    m->x_bf16 ? ", the checkpointed layer inputs as bf16" : "",
                    r->mp.master ? " (a copy beside the optimizer state)" : " (the fsdp shards)",
                    mp->reduce_dtype == MT_DTYPE_BFLOAT16 ? "bf16" : "fp32");
        }
        if (r->pp)
            fprintf(out, "pipeline: %s, %d stages (%d per rank), %d microbatches of %lld x %lld "
                         "per micro-step; pipeline rank 0 holds layers of %d stages and the "
                         "activations of up to %d stage-microbatches at once\n",
                    mt_pp_schedule_name(cfg->distributed.pipeline.pp_schedule),
                    r->pipe.sched.num_stages, r->pipe.sched.v, r->pipe.sched.m, (long long)m->B,
                    (long long)T, r->pipe.nchunks, r->pipe.nslots);
        fflush(out);
    }

    /* The handlers stay installed after training: a pre-emption signal that
     * lands between the last step and exit (Slurm sends it on its own
     * clock) must not kill a run that finished and saved. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    stop_signal = 0;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);

    double t_run = mt_now_s(), loss = NAN;
    int64_t max_steps = cfg->step_scheduler.max_steps, step;
    for (step = start + 1; step <= max_steps; step++) {
        double t0 = mt_now_s(), w0 = mt_comm_wait_seconds();
        int64_t count = 0, local_count = 0;
        for (int64_t u = 0; u < accum; u++) {
            if (r->cp.size > 1)
                mt_train_cp_fill(&r->cp, &r->data, r->packed ? &r->pack : NULL, &sampler, step - 1,
                                 G, dp_rank, dp_size, u, r->tokens + u * N, r->targets + u * N,
                                 r->pos + u * N, r->docs + u * N);
            else if (r->packed)
                mt_pack_fill_batch(&r->pack, &r->data, &sampler, step - 1, G, dp_rank, dp_size, u,
                                   r->rows, r->tokens + u * N, r->targets + u * N,
                                   r->pos + u * N, r->docs + u * N);
            else
                mt_data_fill_batch(&r->data, &sampler, step - 1, G, dp_rank, dp_size, u, r->rows,
                                   r->tokens + u * N, r->targets + u * N);
            for (int64_t i = 0; i < N; i++)
                local_count += r->targets[u * N + i] != MT_IGNORE_INDEX;
        }
        /* the loss is a token mean over the whole global batch */
        s = mt_allreduce(&local_count, &count, 1, MPI_INT64_T, MPI_SUM, dpcp);
        if (s != MT_OK)
            break;
        mt_model_zero_grad(m);
        double local_sum = 0, sum = 0;
        float scale = count ? 1.0f / (float)count : 0.0f;
        /* Pipelines by default backpropagate the summed loss and scale the
         * reduced gradients once (AutoModel's scale_grads_in_schedule
         * false); in the schedule, every microbatch's loss gradient is
         * scaled, as without a pipeline. */
        bool in_schedule = !r->pp || cfg->distributed.pipeline.scale_grads_in_schedule;
        mt_train_moe_begin_step(&r->moe, m, in_schedule, scale);
        for (int64_t u = 0; u < accum && s == MT_OK; u++) {
            int64_t c = 0;
            if (r->sharded)
                s = mt_fsdp_begin(&r->fsdp, u);
            else
                mt_ddp_begin(&r->ddp, !r->pp && u == accum - 1);
            if (s == MT_OK)
                s = mt_train_moe_begin_micro(&r->moe, u, !r->pp && u == accum - 1);
            if (s != MT_OK)
                break;
            bool with_pos = r->packed || r->cp.size > 1;
            if (r->pp) {
                s = mt_pp_exec_run(&r->pipe, m, r->tokens + u * N, r->targets + u * N,
                                   with_pos ? r->pos + u * N : NULL,
                                   r->packed ? r->docs + u * N : NULL, in_schedule ? scale : 1.0f,
                                   &local_sum, &c);
                continue;
            }
            if (with_pos)
                mt_model_set_packing(m, r->pos + u * N, r->packed ? r->docs + u * N : NULL);
            local_sum += mt_model_step(m, r->tokens + u * N, r->targets + u * N, true, scale, &c);
        }
        if (s == MT_OK && r->pp && !r->sharded)
            mt_ddp_begin(&r->ddp, true); /* the pipeline's gradients reduce after the schedule */
        if (s == MT_OK)
            s = r->sharded ? mt_fsdp_finish(&r->fsdp) : mt_ddp_finish(&r->ddp);
        if (s == MT_OK && !in_schedule)
            mt_grad_scale(m, r->seg, r->nseg, scale);
        if (s == MT_OK)
            s = mt_allreduce(&local_sum, &sum, 1, MPI_DOUBLE, MPI_SUM, dpcp);
        if (s == MT_OK && r->pp) { /* the loss is on the last stage's ranks */
            double t = sum;
            s = mt_allreduce(&t, &sum, 1, MPI_DOUBLE, MPI_SUM, r->ppc);
        }
        double gnorm = 0, lr = 0;
        if (s == MT_OK)
            s = update(r, cfg, step, &gnorm, &lr);
        if (s != MT_OK)
            break;
        s = mt_train_moe_step_stats(&r->moe, m);
        if (s != MT_OK)
            break;
        /* the objective: token-mean cross-entropy + coef x mean aux loss */
        loss = count ? sum / (double)count + r->moe.coef * r->moe.aux : NAN;
        double dt = mt_now_s() - t0, wait = mt_comm_wait_seconds() - w0;

        double val = NAN;
        if (r->have_val && cfg->step_scheduler.val_every_steps > 0 &&
            step % cfg->step_scheduler.val_every_steps == 0) {
            mt_model_set_packing(m, NULL, NULL); /* validation rows are not packed */
            if (r->cp.size > 1)
                s = mt_train_cp_validation_loss(&r->cp, m, r->pp ? &r->pipe : NULL, &r->val,
                                                r->tokens, r->targets, r->pos, &val);
            else
                s = validation_loss(m, r->pp ? &r->pipe : NULL, &r->val, r->rows, r->tokens,
                                    r->targets, &val);
            if (s != MT_OK)
                break;
        }
        double tps = (double)(G * T) / dt, mfu = peak > 0 ? flops_tok * tps / (peak * 1e9) : 0;
        char moe_line[160], moe_json[320];
        mt_train_moe_log(&r->moe, moe_line, sizeof moe_line, moe_json, sizeof moe_json);
        if (rank == 0) {
            write_metrics(metrics, step, loss, gnorm, lr, G * T, dt, tps, mfu, val, wait,
                          moe_json);
            if (out && (step % cfg->logging.log_every_steps == 0 || step == max_steps ||
                        step == start + 1)) {
                char el[32], eta[32];
                double elapsed = mt_now_s() - t_run;
                fmt_hms(elapsed, el, sizeof el);
                fmt_hms(elapsed / (double)(step - start) * (double)(max_steps - step), eta,
                        sizeof eta);
                fprintf(out, "step %6lld/%lld | loss %.6f | lr %.3e | grad_norm %.4f | %.0f tok/s "
                             "| mfu %.1f%% | %.3f s",
                        (long long)step, (long long)max_steps, loss, lr, gnorm, tps, 100 * mfu, dt);
                if (!isnan(val))
                    fprintf(out, " | val_loss %.6f", val);
                fputs(moe_line, out);
                fprintf(out, "\nprogress %5.1f%% | elapsed %s | ETA %s\n",
                        100.0 * (double)step / (double)max_steps, el, eta);
                fflush(out);
            }
        }
        res->steps_done++, res->last_step = step, res->last_loss = loss;
        mt_train_device_profile_step(&r->device, res->steps_done);

        int stop = stop_signal != 0, any_stop = 0;
        MPI_Allreduce(&stop, &any_stop, 1, MPI_INT, MPI_MAX, comm);
        bool periodic = cfg->step_scheduler.ckpt_every_steps > 0 &&
                        step % cfg->step_scheduler.ckpt_every_steps == 0;
        if (cfg->checkpoint.enabled && (periodic || step == max_steps || any_stop)) {
            s = r->sharded ? mt_fsdp_sync(&r->fsdp) : MT_OK;
            if (s == MT_OK)
                s = mt_train_save(comm, cfg, &r->ckpt, step, G);
            if (s != MT_OK)
                break;
        }
        if (any_stop) {
            if (rank == 0 && out)
                fprintf(out, "signal received: %s after step %lld; exiting\n",
                        cfg->checkpoint.enabled ? "checkpoint written" : "checkpointing is "
                        "disabled, nothing saved", (long long)step);
            res->stopped_by_signal = 1;
            break;
        }
    }
    if (s == MT_OK && rank == 0)
        mt_train_device_end_report(&r->device, out);
    if (s == MT_OK && r->pp && res->steps_done > 0) { /* the pipeline's measured bubble */
        double meas, sim, cost[3], mb;
        s = mt_pp_exec_idle(&r->pipe, &meas, &sim, cost, &mb);
        if (s == MT_OK && rank == 0 && out)
            fprintf(out, "pipeline idle: %.1f%% of the pipeline ranks' time measured; the "
                         "simulator gives %.1f%% for the same lists with the measured mean "
                         "costs F %.3f ms, B %.3f ms, W %.3f ms and free transfers\n"
                         "pipeline messages: %.6f MB per rank per micro-step (%s)\n",
                    100.0 * meas, 100.0 * sim, 1e3 * cost[0], 1e3 * cost[1], 1e3 * cost[2], mb,
                    r->pipe.bf16 ? "bf16" : "float32");
    }
#ifdef MT_HAVE_CUDA
    if (s == MT_OK && cfg->distributed.device == MT_DEVICE_CUDA) { /* the plan, checked */
        size_t size, used, peak;
        mt_cuda_pool_stats(&size, &used, &peak);
        double mine = (double)peak, most = 0;
        mt_plan_t plan;
        s = mt_allreduce(&mine, &most, 1, MPI_DOUBLE, MPI_MAX, comm);
        if (s == MT_OK && rank == 0 && out &&
            mt_plan_compute_ex(cfg, r->model.bf16_storage ? MT_PLAN_BF16_STORAGE : 0,
                               &plan) == MT_OK)
            fprintf(out, "device memory peak (MiB, the largest of the ranks): %.3f, plan "
                         "estimate %.3f, pool %.1f\n", most / 1048576.0,
                    mt_plan_device_pool_bytes(&plan) / 1048576.0, (double)size / 1048576.0);
    }
#endif
    if (r->sharded) { /* a parameter all-gather may still be in flight */
        mt_status_t s2 = mt_fsdp_sync(&r->fsdp);
        if (s == MT_OK)
            s = s2;
    }
    if (metrics)
        fclose(metrics);
    if (s != MT_OK)
        goto fail;
    run_free(r), free(r);
    return MT_OK;
fail:
    mt_error_trace(__FILE__, __LINE__);
    run_free(r), free(r);
    return s;
}
