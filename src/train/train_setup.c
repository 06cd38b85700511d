/* train_setup.c: a training run's state built before the first step
 * (train_setup.h): the data, the model on this rank's part of the mesh,
 * the data-parallel layer with the initial weights, the optimizer, the
 * batch buffers and the checkpoint lists; and the log's opening report on
 * it.  It runs no step and talks to no other rank: agreeing on the setup's
 * outcome and everything from the first step on is train.c's. */
#include <config.h>

#include "train_setup.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef MT_HAVE_CUDA
#include "mt_cuda.h"
#endif
#include "moe_layout.h"
#include "mt_comm.h"
#include "mt_plan.h"

void mt_train_run_free(mt_train_run_t *r)
{
    mt_blend_close(&r->data);
    mt_blend_close(&r->val);
    mt_model_free(&r->model);
    mt_adamw_free(&r->opt);
    free(r->tokens);
    free(r->targets);
    free(r->pos);
    free(r->docs);
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
    mt_train_run_t *r = ctx;
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
    mt_train_run_t *r = ctx;
    if (mt_stage_join(ticket) != MT_OK)
        mt_comm_fatal(r->tp, MPI_ERR_OTHER, "tensor-parallel collective (join)");
}

static void tp_hook(void *ctx, const void *in, void *out, int64_t n, mt_tp_op_t op)
{
    tp_join(ctx, tp_start(ctx, in, out, n, op));
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

/* One data set: `single` (key path) or the list `items` (key list, n
 * items, validated), each path resolved, opened as a blend. */
static mt_status_t open_blend(mt_blend_t *b, const mt_config_t *cfg, const char *key,
                              const char *single, const char *list,
                              const char (*items)[MT_PATH_MAX], int n, mt_blend_options_t *o)
{
    mt_blend_spec_t spec;
    char why[MT_PATH_MAX + 200];
    if (n == 0) { /* the single path: one entry of one file */
        items = (const char (*)[MT_PATH_MAX])single;
        n = 1;
    } else {
        key = list;
    }
    if (mt_blend_spec_parse(items, n, &spec, why, sizeof why) >= 0)
        MT_FAIL(MT_ERR_CONFIG, "%s: %s", key, why);
    char (*paths)[MT_PATH_MAX] = calloc((size_t)n, sizeof *paths);
    if (!paths)
        MT_FAIL(MT_ERR_NOMEM, "%s: %d paths", key, n);
    for (int i = 0; i < n; i++)
        resolve_data_path(items[i], cfg->source_file, paths[i], MT_PATH_MAX);
    mt_status_t s = mt_blend_open(b, &spec, (const char (*)[MT_PATH_MAX])paths, o);
    free(paths);
    if (s != MT_OK) { /* which key (and line) named the file */
        char where[MT_PATH_MAX + 300];
        mt_config_key_where(cfg, key, where, sizeof where);
        mt_error_append(" (%s, %s)", key, where);
    }
    return s;
}

/* An AutoModel recipe's num_epochs: AutoModel stops at whichever of
 * max_steps and num_epochs x its epoch length comes first (its
 * StepScheduler; a distributed sampler pads the data to dp ranks). The
 * step count is meshtrain's, so an epoch bound that binds is refused with
 * the max_steps that would say it. */
static mt_status_t check_epochs(const mt_train_run_t *r, const mt_config_t *cfg)
{
    const mt_automodel_t *am = &cfg->automodel;
    if (am->num_epochs == 0)
        return MT_OK;
    int64_t n = mt_blend_num_samples(&r->data);
    int64_t dp = cfg->derived.dp_size, lb = cfg->step_scheduler.local_batch_size;
    int64_t acc = cfg->derived.grad_accum_steps;
    int64_t per_rank = (n + dp - 1) / dp, batches = (per_rank + lb - 1) / lb;
    int64_t epoch = (batches + acc - 1) / acc, total = am->num_epochs * epoch;
    if (am->max_steps_null || total < cfg->step_scheduler.max_steps)
        MT_FAIL(MT_ERR_CONFIG, "step_scheduler.num_epochs %lld: %lld samples make %lld steps an "
                "epoch, %lld in all%s; meshtrain counts steps: set step_scheduler.max_steps: "
                "%lld", (long long)am->num_epochs, (long long)n, (long long)epoch,
                (long long)total, am->max_steps_null ? " (max_steps is null)" : ", before max_steps",
                (long long)total);
    return MT_OK;
}

/* The training set (each entry's documents packed into rows when asked)
 * and the validation set (plain rows, in order). */
static mt_status_t open_data(mt_train_run_t *r, const mt_config_t *cfg)
{
    const mt_dataset_config_t *d = &cfg->dataset;
    if (cfg->automodel.data_refusal[0])
        MT_FAIL(MT_ERR_CONFIG, "%s: %s", cfg->source_file, cfg->automodel.data_refusal);
    if (!d->path[0] && d->npaths == 0)
        MT_FAIL(MT_ERR_CONFIG, "dataset.path is empty: set it to an llm.c .bin file or a Megatron "
                "prefix (make one with meshtrain-data), or list files in dataset.paths");
    r->packed = cfg->packed_sequence.packed_sequence_size > 0;
    mt_blend_options_t o = {d->format, cfg->model.vocab_size, cfg->derived.seq_len, r->packed,
                            d->shuffle, (uint64_t)d->seed, d->loss_mask};
    MT_TRY(open_blend(&r->data, cfg, "dataset.path", d->path, "dataset.paths",
                      (const char (*)[MT_PATH_MAX])d->paths, d->npaths, &o));
    if (d->validation_path[0] || d->nvalidation_paths > 0) {
        o.packed = false, o.shuffle = false;
        MT_TRY(open_blend(&r->val, cfg, "dataset.validation_path", d->validation_path,
                          "dataset.validation_paths",
                          (const char (*)[MT_PATH_MAX])d->validation_paths,
                          d->nvalidation_paths, &o));
        r->have_val = 1;
    }
    MT_TRY(check_epochs(r, cfg));
    return MT_OK;
}

/* The model: this rank's pipeline stages (the executor's part), its TP
 * and EP shares, and T / cp tokens of each row; the arenas the sharding
 * layer holds itself (fo, filled here) are left out. */
static mt_status_t build_model(mt_train_run_t *r, const mt_config_t *cfg, const mt_mesh_t *mesh,
                               mt_fsdp_options_t *fo)
{
    const mt_backend_t *be = r->device.be;
    int64_t B = r->rows, T = cfg->derived.seq_len;
    r->sharded = mt_fsdp_options_from_config(cfg, fo);
    unsigned flags = 0;
    if (r->sharded)
        flags = (fo->shard_params ? MT_MODEL_NO_PARAM_ARENA : 0u) |
                (fo->shard_grads ? MT_MODEL_NO_GRAD_ARENA : 0u);
    mt_model_part_t part, *pp_part = NULL;
    r->pp = cfg->distributed.pp_size > 1;
    r->ppc = mesh->group[MT_GROUP_PP];
    if (r->pp) { /* this rank's stages, one microbatch at a time */
        MT_TRY(mt_pp_exec_init(&r->pipe, cfg, r->ppc));
        mt_pp_exec_part(&r->pipe, &part);
        pp_part = &part;
        B = cfg->distributed.pipeline.pp_microbatch_size;
        fo->pipeline = true;
    }
    /* under context parallelism the model holds T / cp tokens of each row */
    int cp = (int)cfg->distributed.cp_size;
    MT_TRY(mt_train_moe_check(cfg, mesh->size));
    if (cfg->model.num_experts > 0) { /* experts: train_moe.c */
        if (mt_moe_experts_sharded(cfg))
            flags |= MT_MODEL_NO_EXPERT_ARENAS;
        int ep_rank = cfg->distributed.ep_size > 1 ? mesh->group_rank[MT_GROUP_EP] : -1;
        return mt_model_init_ep(&r->model, cfg, be, B, T / cp, flags,
                                mesh->group_rank[MT_GROUP_TP], ep_rank, pp_part);
    }
    return mt_model_init_part(&r->model, cfg, be, B, T / cp, flags,
                              mesh->group_rank[MT_GROUP_TP], pp_part);
}

/* Context parallelism's ring, and the model's tensor-parallel hooks. */
static mt_status_t attach_groups(mt_train_run_t *r, const mt_config_t *cfg, const mt_mesh_t *mesh)
{
    const mt_backend_t *be = r->device.be;
    MT_TRY(mt_train_cp_init(&r->cp, mesh, &r->model, r->rows, cfg->derived.seq_len));
    r->tp = mesh->group[MT_GROUP_TP];
    r->staged = mt_stage_needed(be);
    MT_TRY(mt_tp_comm_init(&r->tpc, r->tp, be, cfg->distributed.mp_policy.param_dtype ==
                                                   MT_DTYPE_BFLOAT16));
    r->model.tp_allreduce = tp_hook;
    r->model.tp_start = tp_start;
    r->model.tp_join = tp_join;
    r->model.tp_ctx = r;
    return MT_OK;
}

/* The data-parallel layer (fsdp, or ddp's buckets over the whole model)
 * and the initial weights through it; *owned: the elements this rank
 * updates. */
static mt_status_t data_parallel(mt_train_run_t *r, const mt_config_t *cfg, const mt_mesh_t *mesh,
                                 const mt_fsdp_options_t *fo, int64_t *owned)
{
    int cp = (int)cfg->distributed.cp_size;
    *owned = r->model.numel;
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
        MT_TRY(mt_fsdp_init(&r->fsdp, &r->model, shard, rep, fo));
        mt_fsdp_init_weights(&r->fsdp, (uint64_t)cfg->rng.seed);
        r->seg = r->fsdp.seg, r->nseg = r->fsdp.nunits, *owned = r->fsdp.owned;
        return MT_OK;
    }
    mt_model_init_weights(&r->model, (uint64_t)cfg->rng.seed);
    MT_TRY(mt_ddp_init(&r->ddp, mesh->group[cp > 1 ? MT_GROUP_DP_CP : MT_GROUP_DP], &r->model,
                       (int64_t)(cfg->distributed.ddp_bucket_cap_mb * 1048576.0),
                       cfg->distributed.mp_policy.reduce_dtype == MT_DTYPE_BFLOAT16));
    /* megatron_fsdp zero 0: overlap_grad_reduce false reduces after backward */
    if (cfg->distributed.strategy == MT_STRATEGY_MEGATRON_FSDP)
        r->ddp.overlap = cfg->distributed.overlap_grad_reduce;
    r->whole = mt_segment_whole(&r->model);
    r->seg = &r->whole, r->nseg = 1;
    return MT_OK;
}

/* The master weights (bf16 compute), AdamW's state for the owned
 * elements, the experts' side, and the batch buffers of a step. */
static mt_status_t optimizer_and_buffers(mt_train_run_t *r, const mt_config_t *cfg,
                                         const mt_mesh_t *mesh, bool params_sharded,
                                         int64_t owned)
{
    /* bf16 compute: where the optimizer's segments are the parameter arena
     * (everything but sharded parameters), the master weights move out */
    MT_TRY(mt_train_mp_init(&r->mp, &r->model, r->seg, r->nseg, owned, !params_sharded,
                            (uint64_t)cfg->rng.seed, &r->seg));
    MT_TRY(mt_adamw_init(&r->opt, r->device.be, owned));
    MT_TRY(mt_train_moe_init(&r->moe, &r->model, cfg, mesh));
    int cp = (int)cfg->distributed.cp_size;
    size_t nbuf = (size_t)(cfg->derived.grad_accum_steps * r->rows * cfg->derived.seq_len);
    r->tokens = malloc(sizeof(int32_t) * nbuf);
    r->targets = malloc(sizeof(int32_t) * nbuf);
    if (r->packed || cp > 1) { /* under CP plain rows have positions too: global ones */
        r->pos = malloc(sizeof(int32_t) * nbuf);
        r->docs = malloc(sizeof(int32_t) * nbuf);
    }
    if (!r->tokens || !r->targets || ((r->packed || cp > 1) && (!r->pos || !r->docs)))
        MT_FAIL(MT_ERR_NOMEM, "batch buffers");
    return MT_OK;
}

/* The checkpoint's tensor lists, who writes which block, and the experts'
 * entries. */
static mt_status_t checkpoint_lists(mt_train_run_t *r, const mt_config_t *cfg,
                                    const mt_mesh_t *mesh, bool params_sharded)
{
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
    mt_train_ckpt_stage(&r->ckpt, r->staged ? r->device.be : NULL);
    return MT_OK;
}

/* mesh gives the groups: every rank is data parallel in this release. */
mt_status_t mt_train_run_setup(mt_train_run_t *r, const mt_config_t *cfg, const mt_mesh_t *mesh)
{
    MT_TRY(mt_train_device_init(&r->device, cfg, mesh));
    r->rows = cfg->step_scheduler.local_batch_size;
    MT_TRY(open_data(r, cfg));
    mt_fsdp_options_t fo;
    MT_TRY(build_model(r, cfg, mesh, &fo));
    MT_TRY(attach_groups(r, cfg, mesh));
    int64_t owned;
    MT_TRY(data_parallel(r, cfg, mesh, &fo, &owned));
    bool params_sharded = r->sharded && fo.shard_params;
    MT_TRY(optimizer_and_buffers(r, cfg, mesh, params_sharded, owned));
    return checkpoint_lists(r, cfg, mesh, params_sharded);
}

/* The log's memory lines: measured bytes next to meshtrain-plan's estimate. */
static void print_memory(const mt_train_run_t *r, const mt_config_t *cfg, FILE *out)
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
    ps += 4.0 * (double)m->frozen_numel; /* LoRA's frozen base */
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

static void print_packing(const mt_train_run_t *r, const mt_config_t *cfg, FILE *out)
{
    int64_t T = cfg->derived.seq_len;
    for (int e = 0; e < r->data.n; e++) {
        const mt_packing_t *pk = &r->data.pk[e];
        fprintf(out, "packed %lld documents (%lld pieces, %lld tokens) into %lld rows of "
                     "%lld tokens: %.1f%% padding\n",
                (long long)r->data.ds[e].n_docs, (long long)pk->pieces, (long long)pk->tokens,
                (long long)pk->rows, (long long)T,
                100.0 * (1.0 - (double)pk->tokens / (double)(pk->rows * T)));
    }
}

static void print_size(const mt_train_run_t *r, const mt_config_t *cfg, FILE *out, int64_t start,
                       int threads, double peak)
{
    int64_t G = cfg->step_scheduler.global_batch_size, T = cfg->derived.seq_len;
    fprintf(out, "training: %lld parameters, %lld steps from step %lld, %lld tokens/step "
                 "(%lld micro-steps of %lld x %lld), %d threads per rank, %s peak %.1f GFLOP/s\n",
            (long long)mt_model_logical_numel(&r->ckpt.whole),
            (long long)cfg->step_scheduler.max_steps, (long long)start, (long long)(G * T),
            (long long)cfg->derived.grad_accum_steps, (long long)r->rows, (long long)T, threads,
            cfg->distributed.device == MT_DEVICE_CUDA ? "device (MT_PEAK_TFLOPS)" : "sgemm",
            peak);
    const mt_model_t *w = &r->ckpt.whole;
    if (w->lora) { /* the parameters above are the adapters */
        int64_t frozen = 0;
        for (int i = 0; i < w->nfrozen; i++)
            frozen += w->frozen[i].full_shape[0] * w->frozen[i].full_shape[1];
        fprintf(out, "LoRA: the parameters above are the adapters (rank %lld, alpha %g, %d "
                "tensors); the base's %lld are frozen\n", (long long)cfg->peft.dim,
                cfg->peft.alpha, w->nparams, (long long)frozen);
    }
}

static void print_mixed_precision(const mt_train_run_t *r, const mt_config_t *cfg, FILE *out)
{
    const mt_model_t *m = &r->model;
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

static void print_pipeline(const mt_train_run_t *r, const mt_config_t *cfg, FILE *out)
{
    fprintf(out, "pipeline: %s, %d stages (%d per rank), %d microbatches of %lld x %lld "
                 "per micro-step; pipeline rank 0 holds layers of %d stages and the "
                 "activations of up to %d stage-microbatches at once\n",
            mt_pp_schedule_name(cfg->distributed.pipeline.pp_schedule),
            r->pipe.sched.num_stages, r->pipe.sched.v, r->pipe.sched.m, (long long)r->model.B,
            (long long)cfg->derived.seq_len, r->pipe.nchunks, r->pipe.nslots);
}

void mt_train_run_report(const mt_train_run_t *r, const mt_config_t *cfg, FILE *out,
                         int64_t start, int threads, double peak)
{
    print_memory(r, cfg, out);
    /* the data, its masks and the blend's realised proportions */
    int64_t draws = cfg->step_scheduler.max_steps * cfg->step_scheduler.global_batch_size;
    mt_blend_report(&r->data, "data", draws, out);
    if (r->have_val)
        mt_blend_report(&r->val, "validation data", 0, out);
    if (r->packed)
        print_packing(r, cfg, out);
    print_size(r, cfg, out, start, threads, peak);
    mt_train_device_print(&r->device, cfg, out);
    if (r->model.bf16)
        print_mixed_precision(r, cfg, out);
    if (r->pp)
        print_pipeline(r, cfg, out);
    fflush(out);
}
