/* optim.c: AdamW, clipping and the learning-rate schedule.  The AdamW
 * arithmetic itself is a backend kernel; this file decides per parameter
 * (weight decay or not) and per step (learning rate). */
#include "mt_optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

mt_status_t mt_adamw_init(mt_adamw_t *opt, int64_t lo, int64_t hi)
{
    int64_t numel = hi - lo;
    memset(opt, 0, sizeof *opt);
    opt->exp_avg = calloc((size_t)numel, sizeof(float));
    opt->exp_avg_sq = calloc((size_t)numel, sizeof(float));
    if (!opt->exp_avg || !opt->exp_avg_sq) {
        mt_adamw_free(opt);
        MT_FAIL(MT_ERR_NOMEM, "AdamW state for %lld parameters", (long long)numel);
    }
    opt->numel = numel, opt->lo = lo, opt->hi = hi;
    return MT_OK;
}

void mt_adamw_free(mt_adamw_t *opt)
{
    free(opt->exp_avg);
    free(opt->exp_avg_sq);
    memset(opt, 0, sizeof *opt);
}

void mt_adamw_step(mt_adamw_t *opt, mt_model_t *m, const mt_optimizer_config_t *oc, double lr)
{
    opt->step++;
    for (int i = 0; i < m->nparams; i++) {
        mt_param_t *p = &m->params[i];
        int64_t off = p->data - m->param_mem;
        int64_t a = off > opt->lo ? off : opt->lo, b = off + p->numel;
        if (b > opt->hi)
            b = opt->hi;
        if (a >= b)
            continue; /* not in this rank's range */
        m->be->adamw(m->param_mem + a, m->grad_mem + a, opt->exp_avg + (a - opt->lo),
                     opt->exp_avg_sq + (a - opt->lo), b - a, (float)lr, (float)oc->betas[0],
                     (float)oc->betas[1], (float)oc->eps,
                     p->no_decay ? 0.0f : (float)oc->weight_decay, opt->step);
    }
}

double mt_lr_at(const mt_config_t *cfg, int64_t step)
{
    double peak = cfg->optimizer.lr, lo = cfg->lr_scheduler.min_lr;
    int64_t warm = cfg->lr_scheduler.lr_warmup_steps, total = cfg->step_scheduler.max_steps;
    if (warm > 0 && step <= warm)
        return peak * (double)step / (double)warm;
    if (cfg->lr_scheduler.lr_decay_style == MT_LR_CONSTANT || total <= warm)
        return peak;
    double progress = (double)(step - warm) / (double)(total - warm);
    if (progress > 1)
        progress = 1;
    if (cfg->lr_scheduler.lr_decay_style == MT_LR_LINEAR)
        return peak - (peak - lo) * progress;
    return lo + 0.5 * (peak - lo) * (1.0 + cos(M_PI * progress));
}

double mt_grad_sumsq(const mt_model_t *m)
{
    return m->be->sum_squares(m->grad_mem, m->numel);
}

double mt_clip_coef(double norm, double max_norm)
{
    if (max_norm <= 0)
        return 1.0;
    double c = max_norm / (norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}
