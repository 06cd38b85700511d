/* train.c: the training loop (data -> forward/backward -> clip -> AdamW),
 * with resume, checkpoints, pre-emption signals, validation, the step log
 * and metrics.jsonl.  Everything the loop needs is allocated before the
 * first step, by train_setup.c.  Checkpoint tensor lists: train_ckpt.c. */
#include <config.h>

#include "mt_train.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mt_backend.h"
#ifdef MT_HAVE_CUDA
#include "mt_cuda.h"
#endif
#include "mt_clock.h"
#include "mt_comm.h"
#include "mt_hf.h"
#include "mt_plan.h"
#include "train_sample.h"
#include "train_lora.h"
#include "train_setup.h"

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
static mt_status_t validation_loss(mt_model_t *m, mt_pp_exec_t *pipe, const mt_blend_t *val,
                                   int64_t rows, int32_t *tok, int32_t *tgt, double *mean)
{
    int64_t batches = mt_blend_num_samples(val) / rows;
    if (batches > 64)
        batches = 64;
    double sum = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < batches; i++) {
        MT_TRY(mt_blend_fill_batch(val, i, rows, 0, 1, 0, rows, tok, tgt, NULL, NULL));
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

/* A JSON number, or null where the value is NaN or infinite: printf's
 * "nan" and "inf" are not JSON, and a diverged run must still log. */
static const char *json_num(char *buf, size_t cap, const char *fmt, double v)
{
    if (!isfinite(v))
        return "null";
    snprintf(buf, cap, fmt, v);
    return buf;
}

static void write_metrics(FILE *f, int64_t step, double loss, double gnorm, double lr,
                          int64_t tokens, double dt, double tps, double mfu, double val,
                          double wait, const char *extra)
{
    if (!f)
        return;
    char b[5][40];
    fprintf(f, "{\"step\": %lld, \"loss\": %s, \"grad_norm\": %s, \"lr\": %s, "
               "\"tokens\": %lld, \"step_time_s\": %.6f, \"tokens_per_s\": %s, \"mfu\": %s",
            (long long)step, json_num(b[0], 40, "%.17g", loss), json_num(b[1], 40, "%.17g", gnorm),
            json_num(b[2], 40, "%.9g", lr), (long long)tokens, dt,
            json_num(b[3], 40, "%.3f", tps), json_num(b[4], 40, "%.6f", mfu));
    if (!isnan(val))
        fprintf(f, ", \"val_loss\": %s", json_num(b[0], 40, "%.9g", val));
    fprintf(f, ", \"comm_wait_s\": %.6f%s}\n", wait, extra);
    fflush(f);
}

/* What the step loop reads besides the run: the communicators of the
 * batch and the loss, the batch's geometry, and the step log's inputs. */
typedef struct {
    MPI_Comm comm;
    MPI_Comm dpcp;            /* dp_cp: the loss (sum and token count) is summed
                               * over it, which is dp without context parallelism */
    int rank, size, threads;
    int dp_rank, dp_size;     /* rows are dealt out by dp rank */
    int64_t N;                /* tokens of a rank's micro-step, its part of each row
                               * under CP (the pipeline cuts it into microbatches) */
    int64_t accum, G, T;      /* micro-steps per step, global batch, full row length */
    int64_t start, max_steps; /* the step resumed after, the last step */
    double peak, flops_tok;   /* MFU: peak GFLOP/s, FLOPs per token of the whole model */
    double t_run;             /* when the first step began */
    FILE *out, *metrics;      /* the step log and metrics.jsonl (rank 0) */
    int64_t skipped, consecutive; /* steps skipped as non-finite: all, and in a row */
} loop_t;

/* One step's figures for the log. */
typedef struct {
    double loss, gnorm, lr;
    double dt, wait;          /* seconds of the step, and of them waiting on communication */
    double val;               /* validation loss, or NaN when none was due */
} step_figures_t;

static void loop_init(loop_t *lp, const mt_train_run_t *r, MPI_Comm comm, const mt_config_t *cfg,
                      const mt_mesh_t *mesh, FILE *out)
{
    memset(lp, 0, sizeof *lp);
    lp->comm = comm, lp->out = out;
    lp->dpcp = mesh->group[MT_GROUP_DP_CP];
    lp->dp_rank = mesh->group_rank[MT_GROUP_DP], lp->dp_size = mesh->group_size[MT_GROUP_DP];
    lp->N = r->rows * r->model.T, lp->accum = cfg->derived.grad_accum_steps;
    lp->G = cfg->step_scheduler.global_batch_size, lp->T = cfg->derived.seq_len;
    lp->max_steps = cfg->step_scheduler.max_steps;
}

/* The run's state on every rank, or on none: a rank whose setup failed
 * stops the others. */
static mt_status_t build_run(mt_train_run_t *r, MPI_Comm comm, const mt_config_t *cfg,
                             const mt_mesh_t *mesh)
{
    MT_TRY(mt_agree(comm, mt_train_run_setup(r, cfg, mesh))); /* nobody goes on alone */
    if (!r->pp)
        return MT_OK;
    /* the pipeline's channels: collective over pp */
    return mt_agree(comm, mt_pp_exec_connect(&r->pipe, r->device.be, r->device.nccl,
                                             cfg->distributed.mp_policy.param_dtype ==
                                                 MT_DTYPE_BFLOAT16,
                                             r->model.Ns * r->model.H));
}

/* checkpoint.resume, and what the loaded state implies for the copies of
 * it: lp->start becomes the step to continue after. */
static mt_status_t resume_run(mt_train_run_t *r, loop_t *lp, const mt_config_t *cfg)
{
    MT_TRY(mt_train_resume(lp->comm, cfg, &r->ckpt, &lp->start, lp->out));
    /* a model by name starts from its weights, unless a checkpoint was
     * resumed; LoRA's frozen base always does (the checkpoint holds the
     * adapters) */
    if (cfg->peft.enabled)
        MT_TRY(mt_train_lora_load_base(lp->comm, cfg, &r->model,
                                       r->staged ? r->device.be : NULL, lp->out));
    else if (!r->ckpt.resumed && cfg->model.pretrained_model_name_or_path[0])
        MT_TRY(mt_hf_load_weights(lp->comm, &cfg->model, r->ckpt.t, r->ckpt.n, lp->out));
    if (r->mp.master) { /* loaded master weights: their bf16 copy */
        mt_train_mp_refresh(&r->mp);
        if (r->sharded) /* megatron_fsdp zero 1/2: spread the shards */
            MT_TRY(mt_fsdp_after_update(&r->fsdp));
    }
    return mt_train_moe_after_load(&r->moe);
}

/* checkpoint.save_initial: the starting state, unless checkpoint_dir
 * holds it already; a checkpoint resumed from elsewhere is written again
 * on this mesh.  Collective. */
static mt_status_t save_initial(mt_train_run_t *r, const loop_t *lp, const mt_config_t *cfg)
{
    if (!cfg->checkpoint.enabled || !cfg->checkpoint.save_initial)
        return MT_OK;
    int have = 0;
    if (lp->rank == 0) {
        char dir[MT_PATH_MAX + 32];
        snprintf(dir, sizeof dir, "%s/step_%08lld", cfg->checkpoint.checkpoint_dir,
                 (long long)lp->start);
        have = access(dir, F_OK) == 0;
    }
    MPI_Bcast(&have, 1, MPI_INT, 0, lp->comm);
    return have ? MT_OK : mt_train_save(lp->comm, cfg, &r->ckpt, lp->start, lp->G);
}

/* MFU's peak over the mesh's size ranks, GFLOP/s: on the CPU the measured
 * sgemm rate; on a GPU its dense bf16 peak, MT_PEAK_TFLOPS (default 989:
 * H100 and H200 SXM) */
static double peak_gflops(const mt_config_t *cfg, int size)
{
    if (cfg->distributed.device == MT_DEVICE_CUDA) {
        const char *e = getenv("MT_PEAK_TFLOPS");
        double tf = e && atof(e) > 0 ? atof(e) : 989.0;
        return tf * 1e3 * (double)size;
    }
    return mt_measure_sgemm_gflops(1024, 3) * (double)size;
}

/* lp->flops_tok: the whole model's FLOPs per token.  Collective over pp. */
static mt_status_t step_flops(const mt_train_run_t *r, loop_t *lp)
{
    const mt_model_t *m = &r->model;
    /* the model is this TP rank's part: matmuls and heads split evenly */
    double f = mt_model_flops_per_token(m) * (double)m->tp;
    /* under CP the model holds T / cp tokens, but each still attends over its row */
    f += 6.0 * (double)(m->L * (lp->T - m->T) * m->nh * m->hd) * (double)m->tp;
    lp->flops_tok = f;
    if (r->pp) /* each stage's share */
        MT_TRY(mt_allreduce(&f, &lp->flops_tok, 1, MPI_DOUBLE, MPI_SUM, r->ppc));
    return MT_OK;
}

/* metrics.jsonl on rank 0, appended to after a resume.  Collective: rank
 * 0's failure to open it stops every rank. */
static mt_status_t open_metrics(loop_t *lp, const mt_config_t *cfg)
{
    mt_status_t s = MT_OK;
    if (lp->rank == 0 && cfg->logging.metrics_file[0]) {
        lp->metrics = fopen(cfg->logging.metrics_file, lp->start > 0 ? "a" : "w");
        if (!lp->metrics)
            s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: cannot open the metrics file",
                             cfg->logging.metrics_file);
    }
    return mt_agree(lp->comm, s);
}

/* The handlers stay installed after training: a pre-emption signal that
 * lands between the last step and exit (Slurm sends it on its own clock)
 * must not kill a run that finished and saved. */
static void install_signal_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    stop_signal = 0;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

/* Everything between the built run and the first step: the starting
 * state, the MFU figures, metrics.jsonl and the opening report. */
static mt_status_t begin_run(mt_train_run_t *r, loop_t *lp, const mt_config_t *cfg,
                             mt_train_result_t *res)
{
    if (cfg->checkpoint.enabled) /* before resume reads it: this run owns it */
        MT_TRY(mt_ckpt_lock_acquire(lp->comm, cfg->checkpoint.checkpoint_dir,
                                    cfg->checkpoint.lock_stale_s, lp->rank == 0 ? stderr : NULL,
                                    &r->ckpt.lock));
    MT_TRY(resume_run(r, lp, cfg));
    res->resumed_from_step = lp->start > 0 || r->ckpt.resumed ? (int)lp->start : -1;
    res->last_step = lp->start;
    MT_TRY(save_initial(r, lp, cfg));
    lp->peak = peak_gflops(cfg, lp->size);
    MT_TRY(step_flops(r, lp));
    MT_TRY(open_metrics(lp, cfg));
    if (lp->rank == 0 && lp->out)
        mt_train_run_report(r, cfg, lp->out, lp->start, lp->threads, lp->peak);
    install_signal_handlers();
    return MT_OK;
}

/* The micro-step batches of step `step` for this rank, into the run's
 * buffers; returns how many of their tokens have a target. */
static mt_status_t fill_batches(mt_train_run_t *r, const loop_t *lp, int64_t step,
                                int64_t *count)
{
    int64_t N = lp->N, G = lp->G, local_count = 0;
    mt_status_t s = MT_OK;
    for (int64_t u = 0; u < lp->accum && s == MT_OK; u++) {
        if (r->cp.size > 1)
            s = mt_train_cp_fill(&r->cp, &r->data, step - 1, G, lp->dp_rank, lp->dp_size, u,
                                 r->tokens + u * N, r->targets + u * N, r->pos + u * N,
                                 r->docs + u * N);
        else
            s = mt_blend_fill_batch(&r->data, step - 1, G, lp->dp_rank, lp->dp_size, u, r->rows,
                                    r->tokens + u * N, r->targets + u * N,
                                    r->packed ? r->pos + u * N : NULL,
                                    r->packed ? r->docs + u * N : NULL);
        for (int64_t i = 0; i < N && s == MT_OK; i++)
            local_count += r->targets[u * N + i] != MT_IGNORE_INDEX;
    }
    *count = local_count;
    /* a bad window on one rank stops every rank here, before any id
     * reaches the embedding or a collective waits for the one that left */
    return mt_agree(lp->comm, s);
}

/* The micro-steps' forward and backward, each opened with the
 * data-parallel layer (and the experts'); this rank's loss sum is added
 * into *local_sum.  in_schedule: every micro-batch's loss gradient is
 * scaled by scale inside backward. */
static mt_status_t forward_backward(mt_train_run_t *r, const loop_t *lp, bool in_schedule,
                                    float scale, double *local_sum)
{
    mt_model_t *m = &r->model;
    int64_t N = lp->N, accum = lp->accum;
    for (int64_t u = 0; u < accum; u++) {
        int64_t c = 0;
        if (r->sharded)
            MT_TRY(mt_fsdp_begin(&r->fsdp, u));
        else
            mt_ddp_begin(&r->ddp, !r->pp && u == accum - 1);
        MT_TRY(mt_train_moe_begin_micro(&r->moe, u, !r->pp && u == accum - 1));
        bool with_pos = r->packed || r->cp.size > 1;
        if (r->pp) {
            MT_TRY(mt_pp_exec_run(&r->pipe, m, r->tokens + u * N, r->targets + u * N,
                                  with_pos ? r->pos + u * N : NULL,
                                  r->packed ? r->docs + u * N : NULL, in_schedule ? scale : 1.0f,
                                  local_sum, &c));
            continue;
        }
        if (with_pos)
            mt_model_set_packing(m, r->pos + u * N, r->packed ? r->docs + u * N : NULL);
        *local_sum += mt_model_step(m, r->tokens + u * N, r->targets + u * N, true, scale, &c);
    }
    return MT_OK;
}

/* After the micro-steps: the gradients' reduction finished (and scaled
 * when the schedule did not), and the loss summed over every rank that
 * holds a part of it, into *sum. */
static mt_status_t finish_gradients(mt_train_run_t *r, const loop_t *lp, bool in_schedule,
                                    float scale, double local_sum, double *sum)
{
    if (r->pp && !r->sharded)
        mt_ddp_begin(&r->ddp, true); /* the pipeline's gradients reduce after the schedule */
    MT_TRY(r->sharded ? mt_fsdp_finish(&r->fsdp) : mt_ddp_finish(&r->ddp));
    if (!in_schedule)
        mt_grad_scale(&r->model, r->seg, r->nseg, scale);
    MT_TRY(mt_allreduce(&local_sum, sum, 1, MPI_DOUBLE, MPI_SUM, lp->dpcp));
    if (r->pp) { /* the loss is on the last stage's ranks */
        double t = *sum;
        MT_TRY(mt_allreduce(&t, sum, 1, MPI_DOUBLE, MPI_SUM, r->ppc));
    }
    return MT_OK;
}

/* This rank's squared gradient norm over segment g into part: [0]
 * tensors split over TP ranks, [1] tensors every TP rank holds whole (one
 * kind without TP), after the TP sum of the gradients each TP rank holds
 * a share of.  Neighbouring tensors of a kind are summed in one call: on
 * a device each call waits for its result. */
static mt_status_t segment_sumsq(mt_train_run_t *r, const mt_config_t *cfg,
                                 const mt_segment_t *g, double part[2])
{
    mt_model_t *m = &r->model;
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
    return MT_OK;
}

/* The two kinds of segment_sumsq summed over the ranks holding other
 * parts of the model: the shard group, the TP group (the split kind
 * alone) and the pipeline's stages. */
static mt_status_t sumsq_over_mesh(mt_train_run_t *r, double part[2])
{
    double sum[2];
    if (r->sharded) { /* replicas (HSDP) hold the same shard: sum over the shard group */
        MT_TRY(mt_allreduce(part, sum, 2, MPI_DOUBLE, MPI_SUM, r->fsdp.shard));
        part[0] = sum[0], part[1] = sum[1];
    }
    if (r->model.tp > 1) {
        MT_TRY(mt_allreduce(&part[0], &sum[0], 1, MPI_DOUBLE, MPI_SUM, r->tp));
        part[0] = sum[0];
    }
    if (r->pp) { /* every stage holds different parameters */
        MT_TRY(mt_allreduce(part, sum, 2, MPI_DOUBLE, MPI_SUM, r->ppc));
        part[0] = sum[0], part[1] = sum[1];
    }
    return MT_OK;
}

/* Global gradient norm over every shard. */
static mt_status_t grad_norm(mt_train_run_t *r, const mt_config_t *cfg, double *gnorm)
{
    double part[2] = {0, 0};
    for (int k = 0; k < r->nseg; k++)
        MT_TRY(segment_sumsq(r, cfg, &r->seg[k], part));
    MT_TRY(sumsq_over_mesh(r, part));
    double experts = 0; /* the experts' reduction and share of the norm (train_moe.c) */
    MT_TRY(mt_train_moe_grad_sumsq(&r->moe, &r->model, &experts));
    *gnorm = sqrt(part[0] + part[1] + experts);
    return MT_OK;
}

/* Clipping, the AdamW update of this rank's segments (none when !apply:
 * a skipped step leaves weights and optimizer state as they were), and
 * the all-gather that unsharded parameters need either way. */
static mt_status_t update(mt_train_run_t *r, const mt_config_t *cfg, int64_t step, double gnorm,
                          bool apply, double *lr)
{
    mt_model_t *m = &r->model;
    double coef = mt_clip_coef(gnorm, cfg->optimizer.max_grad_norm);
    *lr = mt_lr_at(cfg, step);
    if (apply) {
        /* clipping inside the update: its coefficient scales each gradient
         * as AdamW reads it */
        mt_adamw_step(&r->opt, m, r->seg, r->nseg, &cfg->optimizer, *lr, (float)coef);
        r->moe.opt.step = r->opt.step - 1; /* the same step count, also after a resume */
    }
    MT_TRY(mt_train_moe_update(&r->moe, m, coef, &cfg->optimizer, *lr, apply));
    /* bf16 compute: the update wrote the master weights' bf16 copy too */
    if (r->sharded)
        MT_TRY(mt_fsdp_after_update(&r->fsdp));
    return MT_OK;
}

/* *name: the first tensor of the segments whose values (grads false) or
 * gradients (true) hold a NaN or an infinity on this rank, or "" when
 * none does.  Only on the error path: one sum per tensor. */
static void first_nonfinite(const mt_model_t *m, const mt_segment_t *seg, int nseg, bool grads,
                            char *name, size_t cap)
{
    name[0] = '\0';
    for (int k = 0; k < nseg; k++)
        for (int i = 0; i < m->nparams; i++) {
            const mt_param_t *p = &m->params[i];
            int64_t a, n = mt_param_overlap(p, seg[k].offset, seg[k].offset + seg[k].count, &a);
            if (n == 0)
                continue;
            const float *v = (grads ? seg[k].grad : seg[k].param) + (a - seg[k].offset);
            if (!isfinite(m->be->sum_squares(v, n))) {
                snprintf(name, cap, "%s", p->name);
                return;
            }
        }
}

/* The lowest rank of comm with a non-finite tensor, and that tensor's
 * name, into who/name (who is the size of comm when no rank has one).
 * Collective over comm. */
static mt_status_t agree_nonfinite(const mt_train_run_t *r, MPI_Comm comm, bool grads, int *who,
                                   char name[MT_PARAM_NAME_MAX])
{
    int rank, size;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    MT_MPI_TRY(MPI_Comm_size(comm, &size));
    first_nonfinite(&r->model, r->seg, r->nseg, grads, name, MT_PARAM_NAME_MAX);
    if (!name[0] && r->moe.on)
        first_nonfinite(&r->moe.view, r->moe.seg, r->moe.nseg, grads, name, MT_PARAM_NAME_MAX);
    int mine = name[0] ? rank : size;
    MT_TRY(mt_allreduce(&mine, who, 1, MPI_INT, MPI_MIN, comm));
    if (*who < size)
        MT_MPI_TRY(MPI_Bcast(name, MT_PARAM_NAME_MAX, MPI_CHAR, *who, comm));
    return MT_OK;
}

/* A step whose loss sum or gradient norm is not finite on some rank, by
 * training.on_nonfinite: *apply false to skip the update; an error to
 * stop before it (nothing is saved).  Collective over lp->comm: every rank
 * decides alike. */
static mt_status_t check_finite(const mt_train_run_t *r, loop_t *lp, const mt_config_t *cfg,
                                int64_t step, double loss_sum, double gnorm, bool *apply)
{
    int bad = (isfinite(loss_sum) ? 0 : 1) | (isfinite(gnorm) ? 0 : 2), any = 0;
    MT_TRY(mt_allreduce(&bad, &any, 1, MPI_INT, MPI_BOR, lp->comm));
    *apply = true;
    if (any == 0) {
        lp->consecutive = 0;
        return MT_OK;
    }
    mt_nonfinite_t how = cfg->training.on_nonfinite;
    if (how == MT_NONFINITE_IGNORE)
        return MT_OK;
    int who;
    char name[MT_PARAM_NAME_MAX];
    MT_TRY(agree_nonfinite(r, lp->comm, true, &who, name));
    char what[2 * MT_PARAM_NAME_MAX];
    const char *q = (any & 1) && (any & 2) ? "the loss and the gradient norm are"
                    : (any & 1)            ? "the loss is" : "the gradient norm is";
    if (who < lp->size)
        snprintf(what, sizeof what, "%s not finite; first non-finite gradient: %s (rank %d)", q,
                 name, who);
    else
        snprintf(what, sizeof what, "%s not finite (every gradient is finite)", q);
    if (how == MT_NONFINITE_STOP)
        MT_FAIL(MT_ERR_RANGE, "step %lld: %s; training.on_nonfinite is stop: the run ends "
                "before this step's update and saves nothing; the last checkpoint is as it was",
                (long long)step, what);
    lp->skipped++, lp->consecutive++;
    if (lp->consecutive > cfg->training.max_nonfinite_skips)
        MT_FAIL(MT_ERR_RANGE, "step %lld: %s; %lld steps in a row were not finite, more than "
                "training.max_nonfinite_skips (%lld) skips: the run ends and saves nothing",
                (long long)step, what, (long long)lp->consecutive,
                (long long)cfg->training.max_nonfinite_skips);
    if (lp->rank == 0 && lp->out) {
        fprintf(lp->out, "warning: step %lld: %s; update skipped (%lld in a row, %lld in all)\n",
                (long long)step, what, (long long)lp->consecutive, (long long)lp->skipped);
        fflush(lp->out);
    }
    *apply = false;
    return MT_OK;
}

/* Step `step`: its batches, forward and backward, the reduced gradients,
 * the update and the experts' figures; f gets all but the validation loss. */
static mt_status_t train_step(mt_train_run_t *r, loop_t *lp, const mt_config_t *cfg,
                              int64_t step, step_figures_t *f)
{
    double t0 = mt_now_s(), w0 = mt_comm_wait_seconds();
    int64_t count = 0, local_count = 0;
    MT_TRY(fill_batches(r, lp, step, &local_count));
    /* the loss is a token mean over the whole global batch */
    MT_TRY(mt_allreduce(&local_count, &count, 1, MPI_INT64_T, MPI_SUM, lp->dpcp));
    mt_model_zero_grad(&r->model);
    double local_sum = 0, sum = 0;
    float scale = count ? 1.0f / (float)count : 0.0f;
    /* Pipelines by default backpropagate the summed loss and scale the
     * reduced gradients once (AutoModel's scale_grads_in_schedule
     * false); in the schedule, every microbatch's loss gradient is
     * scaled, as without a pipeline. */
    bool in_schedule = !r->pp || cfg->distributed.pipeline.scale_grads_in_schedule;
    mt_train_moe_begin_step(&r->moe, &r->model, in_schedule, scale);
    MT_TRY(forward_backward(r, lp, in_schedule, scale, &local_sum));
    MT_TRY(finish_gradients(r, lp, in_schedule, scale, local_sum, &sum));
    MT_TRY(grad_norm(r, cfg, &f->gnorm));
    bool apply = true;
    MT_TRY(check_finite(r, lp, cfg, step, sum, f->gnorm, &apply));
    if (count == 0 && apply) { /* every target masked: no mean to take, nothing to learn */
        apply = false;
        if (lp->rank == 0 && lp->out) {
            fprintf(lp->out, "warning: step %lld: every target of the global batch is masked "
                    "out (loss masks): no token to average over; update skipped\n",
                    (long long)step);
            fflush(lp->out);
        }
    }
    MT_TRY(update(r, cfg, step, f->gnorm, apply, &f->lr));
    MT_TRY(mt_train_moe_step_stats(&r->moe, &r->model));
    /* the objective: token-mean cross-entropy + coef x mean aux loss */
    f->loss = count ? sum / (double)count + r->moe.coef * r->moe.aux : NAN;
    f->dt = mt_now_s() - t0, f->wait = mt_comm_wait_seconds() - w0;
    return MT_OK;
}

/* *val: the validation loss after step `step` when one is due, else NaN. */
static mt_status_t validate(mt_train_run_t *r, const mt_config_t *cfg, int64_t step, double *val)
{
    *val = NAN;
    if (!r->have_val || cfg->step_scheduler.val_every_steps <= 0 ||
        step % cfg->step_scheduler.val_every_steps != 0)
        return MT_OK;
    mt_model_t *m = &r->model;
    mt_model_set_packing(m, NULL, NULL); /* validation rows are not packed */
    if (r->cp.size > 1)
        return mt_train_cp_validation_loss(&r->cp, m, r->pp ? &r->pipe : NULL, &r->val,
                                           r->tokens, r->targets, r->pos, val);
    return validation_loss(m, r->pp ? &r->pipe : NULL, &r->val, r->rows, r->tokens, r->targets,
                           val);
}

/* The step line and the progress line of the log. */
static void print_step(const loop_t *lp, int64_t step, const step_figures_t *f, double tps,
                       double mfu, const char *moe_line)
{
    char el[32], eta[32];
    double elapsed = mt_now_s() - lp->t_run;
    fmt_hms(elapsed, el, sizeof el);
    fmt_hms(elapsed / (double)(step - lp->start) * (double)(lp->max_steps - step), eta,
            sizeof eta);
    fprintf(lp->out, "step %6lld/%lld | loss %.6f | lr %.3e | grad_norm %.4f | %.0f tok/s "
                     "| mfu %.1f%% | %.3f s",
            (long long)step, (long long)lp->max_steps, f->loss, f->lr, f->gnorm, tps, 100 * mfu,
            f->dt);
    if (!isnan(f->val))
        fprintf(lp->out, " | val_loss %.6f", f->val);
    fputs(moe_line, lp->out);
    fprintf(lp->out, "\nprogress %5.1f%% | elapsed %s | ETA %s\n",
            100.0 * (double)step / (double)lp->max_steps, el, eta);
    fflush(lp->out);
}

/* Step `step` into metrics.jsonl, and into the log when it is due. */
static void log_step(const mt_train_run_t *r, const loop_t *lp, const mt_config_t *cfg,
                     int64_t step, const step_figures_t *f)
{
    double tps = (double)(lp->G * lp->T) / f->dt;
    double mfu = lp->peak > 0 ? lp->flops_tok * tps / (lp->peak * 1e9) : 0;
    char moe_line[160], moe_json[320];
    mt_train_moe_log(&r->moe, moe_line, sizeof moe_line, moe_json, sizeof moe_json);
    if (lp->rank != 0)
        return;
    write_metrics(lp->metrics, step, f->loss, f->gnorm, f->lr, lp->G * lp->T, f->dt, tps, mfu,
                  f->val, f->wait, moe_json);
    if (lp->out && (step % cfg->logging.log_every_steps == 0 || step == lp->max_steps ||
                    step == lp->start + 1))
        print_step(lp, step, f, tps, mfu, moe_line);
}

/* After step `step`: a checkpoint when one is due or a pre-emption signal
 * reached any rank; *stop: the run ends here.  Collective. */
static mt_status_t checkpoint_or_stop(mt_train_run_t *r, const loop_t *lp, const mt_config_t *cfg,
                                      int64_t step, bool *stop)
{
    mt_ckpt_lock_beat(&r->ckpt.lock);
    int mine = stop_signal != 0, any_stop = 0;
    MPI_Allreduce(&mine, &any_stop, 1, MPI_INT, MPI_MAX, lp->comm);
    *stop = any_stop != 0;
    bool periodic = cfg->step_scheduler.ckpt_every_steps > 0 &&
                    step % cfg->step_scheduler.ckpt_every_steps == 0;
    if (cfg->checkpoint.enabled && (periodic || step == lp->max_steps || *stop)) {
        if (r->sharded)
            MT_TRY(mt_fsdp_sync(&r->fsdp));
        int who;
        char name[MT_PARAM_NAME_MAX];
        MT_TRY(agree_nonfinite(r, lp->comm, false, &who, name));
        if (who < lp->size)
            MT_FAIL(MT_ERR_RANGE, "step %lld: weight %s (rank %d) is not finite: no checkpoint "
                    "is written of it; the last checkpoint is as it was", (long long)step, name,
                    who);
        MT_TRY(mt_train_save(lp->comm, cfg, &r->ckpt, step, lp->G));
    }
    if (*stop && lp->rank == 0 && lp->out)
        fprintf(lp->out, "signal received: %s after step %lld; exiting\n",
                cfg->checkpoint.enabled ? "checkpoint written" : "checkpointing is "
                "disabled, nothing saved", (long long)step);
    return MT_OK;
}

/* The steps after lp->start up to max_steps, or up to a pre-emption
 * signal. */
static mt_status_t run_steps(mt_train_run_t *r, loop_t *lp, const mt_config_t *cfg,
                             mt_train_result_t *res)
{
    lp->t_run = mt_now_s();
    for (int64_t step = lp->start + 1; step <= lp->max_steps; step++) {
        step_figures_t f;
        bool stop;
        MT_TRY(train_step(r, lp, cfg, step, &f));
        MT_TRY(validate(r, cfg, step, &f.val));
        log_step(r, lp, cfg, step, &f);
        if (lp->rank == 0) /* logging.sample_every_steps */
            mt_train_sample(cfg, &r->model, step, lp->out);
        res->steps_done++, res->last_step = step, res->last_loss = f.loss;
        mt_train_device_profile_step(&r->device, res->steps_done);
        MT_TRY(checkpoint_or_stop(r, lp, cfg, step, &stop));
        if (stop) {
            res->stopped_by_signal = 1;
            break;
        }
    }
    return MT_OK;
}

/* The pipeline's measured bubble next to the simulator's.  Collective
 * over the mesh. */
static mt_status_t report_pipeline_idle(mt_train_run_t *r, const loop_t *lp)
{
    double meas, sim, cost[3], mb;
    MT_TRY(mt_pp_exec_idle(&r->pipe, &meas, &sim, cost, &mb));
    if (lp->rank == 0 && lp->out)
        fprintf(lp->out, "pipeline idle: %.1f%% of the pipeline ranks' time measured; the "
                         "simulator gives %.1f%% for the same lists with the measured mean "
                         "costs F %.3f ms, B %.3f ms, W %.3f ms and free transfers\n"
                         "pipeline messages: %.6f MB per rank per micro-step (%s)\n",
                100.0 * meas, 100.0 * sim, 1e3 * cost[0], 1e3 * cost[1], 1e3 * cost[2], mb,
                r->pipe.bf16 ? "bf16" : "float32");
    return MT_OK;
}

#ifdef MT_HAVE_CUDA
/* The plan, checked: the largest device memory peak of the ranks next to
 * the plan's estimate.  Collective. */
static mt_status_t report_device_peak(const mt_train_run_t *r, const loop_t *lp,
                                      const mt_config_t *cfg)
{
    size_t size, used, peak;
    mt_cuda_pool_stats(&size, &used, &peak);
    double mine = (double)peak, most = 0;
    mt_plan_t plan;
    MT_TRY(mt_allreduce(&mine, &most, 1, MPI_DOUBLE, MPI_MAX, lp->comm));
    if (lp->rank == 0 && lp->out &&
        mt_plan_compute_ex(cfg, r->model.bf16_storage ? MT_PLAN_BF16_STORAGE : 0,
                           &plan) == MT_OK)
        fprintf(lp->out, "device memory peak (MiB, the largest of the ranks): %.3f, plan "
                         "estimate %.3f, pool %.1f\n", most / 1048576.0,
                mt_plan_device_pool_bytes(&plan) / 1048576.0, (double)size / 1048576.0);
    return MT_OK;
}
#endif

/* After the step loop, whose outcome is s: the end-of-run reports when it
 * went well, then (either way) a parameter all-gather still in flight
 * joined. */
static mt_status_t end_run(mt_train_run_t *r, const loop_t *lp, const mt_config_t *cfg,
                           const mt_train_result_t *res, mt_status_t s)
{
    if (s == MT_OK && lp->rank == 0)
        mt_train_device_end_report(&r->device, lp->out);
    if (s == MT_OK && r->pp && res->steps_done > 0)
        s = report_pipeline_idle(r, lp);
#ifdef MT_HAVE_CUDA
    if (s == MT_OK && cfg->distributed.device == MT_DEVICE_CUDA)
        s = report_device_peak(r, lp, cfg);
#endif
    if (r->sharded) {
        mt_status_t s2 = mt_fsdp_sync(&r->fsdp);
        if (s == MT_OK)
            s = s2;
    }
    return s;
}

mt_status_t mt_train(MPI_Comm comm, const mt_config_t *cfg, const mt_mesh_t *mesh, FILE *out,
                     mt_train_result_t *res)
{
    int rank, size;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    MT_MPI_TRY(MPI_Comm_size(comm, &size));
    memset(res, 0, sizeof *res);
    res->resumed_from_step = -1;
    mt_comm_set_wait_mode(mesh->node);
    int threads = mt_comm_set_threads(mesh->node);

    mt_train_run_t *r = calloc(1, sizeof *r);
    if (!r)
        MT_FAIL(MT_ERR_NOMEM, "run state");
    mt_status_t s = build_run(r, comm, cfg, mesh);
    if (s == MT_OK) {
        loop_t lp;
        loop_init(&lp, r, comm, cfg, mesh, out);
        lp.rank = rank, lp.size = size, lp.threads = threads;
        s = begin_run(r, &lp, cfg, res);
        if (s == MT_OK)
            s = end_run(r, &lp, cfg, res, run_steps(r, &lp, cfg, res));
        if (lp.metrics)
            fclose(lp.metrics);
    }
    if (s != MT_OK)
        mt_error_trace(__FILE__, __LINE__);
    mt_train_run_free(r), free(r);
    return s;
}
