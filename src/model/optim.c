/* optim.c: AdamW, clipping and the learning-rate schedule.  The AdamW
 * arithmetic itself is a backend kernel; this file decides per parameter
 * (weight decay or not) and per step (learning rate). */
#include "mt_optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

mt_segment_t mt_segment_whole(const mt_model_t *m)
{
    mt_segment_t s = {0, m->numel, m->param_mem, m->grad_mem, 0, NULL};
    return s;
}

mt_status_t mt_adamw_init(mt_adamw_t *opt, const mt_backend_t *be, int64_t numel)
{
    memset(opt, 0, sizeof *opt);
    opt->be = be;
    size_t bytes = sizeof(float) * (size_t)(numel > 0 ? numel : 1);
    opt->exp_avg = be->device_alloc(bytes); /* zeroed */
    opt->exp_avg_sq = be->device_alloc(bytes);
    if (!opt->exp_avg || !opt->exp_avg_sq) {
        mt_adamw_free(opt);
        MT_FAIL(MT_ERR_NOMEM, "AdamW state for %lld parameters", (long long)numel);
    }
    opt->numel = numel;
    return MT_OK;
}

void mt_adamw_free(mt_adamw_t *opt)
{
    if (opt->be) {
        opt->be->device_free(opt->exp_avg);
        opt->be->device_free(opt->exp_avg_sq);
    }
    memset(opt, 0, sizeof *opt);
}

void mt_adamw_step(mt_adamw_t *opt, const mt_model_t *m, const mt_segment_t *seg, int nseg,
                   const mt_optimizer_config_t *oc, double lr, float gscale)
{
    opt->step++;
    for (int k = 0; k < nseg; k++) {
        const mt_segment_t *s = &seg[k];
        for (int i = 0; i < m->nparams; i++) { /* split at parameters: decay differs */
            const mt_param_t *p = &m->params[i];
            int64_t a, n = mt_param_overlap(p, s->offset, s->offset + s->count, &a);
            if (n == 0)
                continue;
            int64_t j = a - s->offset;
            float *pm = s->param + j, *gm = s->grad + j, *m1 = opt->exp_avg + s->state + j;
            float *m2 = opt->exp_avg_sq + s->state + j;
            const float wd = p->no_decay && !oc->decay_every_parameter ? 0.0f : (float)oc->weight_decay;
            /* the compute copy's element j: bf16 bits under bf16 storage */
            float *wk = s->work ? mt_act_at(m, s->work, j) : NULL;
            if (wk) /* the master weights and their bf16 compute copy, one pass */
                m->be->adamw_bf16_copy(pm, wk, gm, gscale, m1, m2, n, (float)lr,
                                       (float)oc->betas[0], (float)oc->betas[1], (float)oc->eps,
                                       wd, opt->step);
            else
                m->be->adamw(pm, gm, gscale, m1, m2, n, (float)lr, (float)oc->betas[0],
                             (float)oc->betas[1], (float)oc->eps, wd, opt->step);
        }
    }
}

/* AutoModel's OptimizerParamScheduler: step s (1-based) uses the value at
 * its num_steps = s - 1, warming up from init_lr and holding min_lr after
 * lr_decay_steps. */
static double automodel_lr(const mt_config_t *cfg, int64_t step)
{
    const mt_lr_config_t *l = &cfg->lr_scheduler;
    double peak = cfg->optimizer.lr, lo = l->min_lr;
    int64_t n = step - 1, warm = l->lr_warmup_steps;
    int64_t decay = l->lr_decay_steps.set ? l->lr_decay_steps.value : cfg->step_scheduler.max_steps;
    if (warm > 0 && n <= warm)
        return l->init_lr + (peak - l->init_lr) * (double)n / (double)warm;
    if (l->lr_decay_style == MT_LR_CONSTANT)
        return peak;
    if (n > decay || decay <= warm)
        return lo;
    double ratio = (double)(n - warm) / (double)(decay - warm);
    double coeff = l->lr_decay_style == MT_LR_LINEAR ? 1.0 - ratio : 0.5 * (cos(M_PI * ratio) + 1.0);
    return lo + coeff * (peak - lo);
}

double mt_lr_at(const mt_config_t *cfg, int64_t step)
{
    if (cfg->automodel.lr_schedule)
        return automodel_lr(cfg, step);
    double peak = cfg->optimizer.lr, lo = cfg->lr_scheduler.min_lr, init = cfg->lr_scheduler.init_lr;
    int64_t warm = cfg->lr_scheduler.lr_warmup_steps, total = cfg->step_scheduler.max_steps;
    if (cfg->lr_scheduler.lr_decay_steps.set)
        total = cfg->lr_scheduler.lr_decay_steps.value;
    if (warm > 0 && step <= warm)
        return init + (peak - init) * (double)step / (double)warm;
    if (cfg->lr_scheduler.lr_decay_style == MT_LR_CONSTANT || total <= warm)
        return peak;
    double progress = (double)(step - warm) / (double)(total - warm);
    if (progress > 1)
        progress = 1;
    if (cfg->lr_scheduler.lr_decay_style == MT_LR_LINEAR)
        return peak - (peak - lo) * progress;
    return lo + 0.5 * (peak - lo) * (1.0 + cos(M_PI * progress));
}

double mt_grad_sumsq(const mt_model_t *m, const mt_segment_t *seg, int nseg)
{
    double sum = 0;
    for (int k = 0; k < nseg; k++)
        sum += m->be->sum_squares(seg[k].grad, seg[k].count);
    return sum;
}

void mt_grad_scale(const mt_model_t *m, const mt_segment_t *seg, int nseg, float c)
{
    for (int k = 0; k < nseg; k++)
        m->be->scale(seg[k].grad, c, seg[k].count);
}

double mt_clip_coef(double norm, double max_norm)
{
    if (max_norm <= 0)
        return 1.0;
    double c = max_norm / (norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}
