/* train_ckpt.c: what the training loop saves and restores.  The model and
 * optimizer state go in as full logical tensors under Hugging Face names
 * (mt_checkpoint.h does the HDF5 and the atomic write); the training state
 * is the step, the samples consumed and the seeds, which with the sampling
 * contract fix the data position exactly.  With
 * checkpoint.save_consolidated, the same blocks also go into a Hugging
 * Face directory inside the step's (mt_hf.h). */
#include "train_internal.h"

#include <stdlib.h>
#include <string.h>

#include "mt_hf.h"
#include "mt_mesh.h"

/* Tensor `path`: the logical tensor of p ([rows, full columns]); this rank
 * holds local rows [first, first + count) of its part of it, at data.
 * Under tensor parallelism that part starts at row tp_off (row split) or
 * is the column block [tp_off, tp_off + local columns) (column split). */
static void set_tensor(mt_ckpt_tensor_t *t, const char *path, const mt_param_t *p, int64_t rows,
                       int64_t first, int64_t count, float *data)
{
    snprintf(t->path, sizeof t->path, "%s", path);
    t->ndim = p->ndim;
    t->shape[0] = rows;
    t->shape[1] = p->ndim > 1 ? p->full_shape[1] : 1;
    t->row_offset = (p->tp_dim == 0 ? p->tp_off : 0) + first;
    t->row_count = count;
    t->col_offset = p->tp_dim == 1 ? p->tp_off : 0;
    t->col_count = p->tp_dim == 1 ? p->shape[1] : 0; /* 0: every column */
    t->data = data;
}

/* The rows of parameter p (stored rows: `rows`) that this rank holds in
 * its segments, which start and end on row boundaries: the first row, how
 * many, and where they are (segment and element index in it).  A tensor
 * lies in one unit and a rank owns one run of each unit, so the rows found
 * are contiguous. */
static void seg_rows(const mt_param_t *p, int64_t rows, const mt_segment_t *seg, int nseg,
                     int64_t *first, int64_t *count, const mt_segment_t **in, int64_t *at)
{
    int64_t cols = p->ndim > 1 ? p->shape[1] : 1, end = p->offset + rows * cols;
    *first = *count = *at = 0;
    *in = &seg[0];
    for (int k = 0; k < nseg; k++) {
        int64_t hi = seg[k].offset + seg[k].count < end ? seg[k].offset + seg[k].count : end;
        int64_t a, n = mt_param_overlap(p, seg[k].offset, hi, &a);
        if (n > 0) {
            *first = (a - p->offset) / cols;
            *count = n / cols;
            *in = &seg[k];
            *at = a - seg[k].offset;
            return;
        }
    }
}

mt_status_t mt_train_ckpt_init(mt_train_ckpt_t *c, const mt_config_t *cfg, mt_model_t *m,
                               mt_adamw_t *opt, const mt_segment_t *seg, int nseg,
                               bool params_sharded)
{
    memset(c, 0, sizeof *c);
    c->model = m, c->opt = opt;
    MT_TRY(mt_hf_check_consolidated(cfg)); /* before training, not at the first save */
    MT_TRY(mt_model_init_ex(&c->whole, cfg, m->be, m->B, m->T, MT_MODEL_NO_PARAM_ARENA |
                            MT_MODEL_NO_GRAD_ARENA | MT_MODEL_NO_ACT_ARENA |
                            MT_MODEL_NO_EXPERT_ARENAS,
                            m->tp > 1 ? m->tp_rank : -1));
    const mt_model_t *w = &c->whole;
    c->t = calloc((size_t)w->nparams * 3, sizeof *c->t);
    c->t_save = calloc((size_t)w->nparams * 3, sizeof *c->t_save);
    size_t need = mt_config_to_yaml(cfg, NULL, 0) + 1;
    c->config_yaml = malloc(need);
    if (!c->t || !c->t_save || !c->config_yaml)
        MT_FAIL(MT_ERR_NOMEM, "checkpoint tensor list and config text");
    mt_config_to_yaml(cfg, c->config_yaml, need);
    snprintf(c->mesh, sizeof c->mesh, "world %lld: pp %lld x dp_replicate %lld x dp_shard %lld x "
             "cp %lld x tp %lld", (long long)cfg->derived.world_size,
             (long long)cfg->distributed.pp_size, (long long)cfg->derived.dp_replicate,
             (long long)cfg->derived.dp_shard, (long long)cfg->distributed.cp_size,
             (long long)cfg->distributed.tp_size);
    int np = w->nparams;
    for (int i = 0; i < np; i++) {
        const mt_param_t *wp = &w->params[i];
        bool vocab = wp == w->embed || wp == w->lm_head;
        /* stored rows: the logical tensor's, but only the real vocabulary */
        int64_t rows = vocab ? m->V_valid_full : wp->full_shape[0];
        char path[256];
        const mt_param_t *p = mt_model_param(m, wp->name);
        if (!p) { /* another pipeline stage's: nothing of it here */
            snprintf(path, sizeof path, "/model/%s", wp->name);
            set_tensor(&c->t[i], path, wp, rows, 0, 0, NULL);
            snprintf(path, sizeof path, "/optim/%s/exp_avg", wp->name);
            set_tensor(&c->t[np + i], path, wp, rows, 0, 0, NULL);
            snprintf(path, sizeof path, "/optim/%s/exp_avg_sq", wp->name);
            set_tensor(&c->t[2 * np + i], path, wp, rows, 0, 0, NULL);
            continue;
        }
        /* local: this rank's real rows of its part */
        int64_t local = vocab ? m->V_valid : p->shape[0];
        int64_t first, count, at;
        const mt_segment_t *in;
        seg_rows(p, local, seg, nseg, &first, &count, &in, &at);
        snprintf(path, sizeof path, "/model/%s", p->name);
        if (params_sharded) /* this rank's rows only */
            set_tensor(&c->t[i], path, p, rows, first, count, in->param + at);
        else
            set_tensor(&c->t[i], path, p, rows, 0, local, p->data);
        snprintf(path, sizeof path, "/optim/%s/exp_avg", p->name);
        set_tensor(&c->t[np + i], path, p, rows, first, count, opt->exp_avg + in->state + at);
        snprintf(path, sizeof path, "/optim/%s/exp_avg_sq", p->name);
        set_tensor(&c->t[2 * np + i], path, p, rows, first, count,
                   opt->exp_avg_sq + in->state + at);
    }
    c->n = 3 * np;
    memcpy(c->t_save, c->t, sizeof *c->t * (size_t)c->n); /* every rank writes until told */
    return MT_OK;
}

void mt_train_ckpt_writers(mt_train_ckpt_t *c, bool model_writer, bool optim_writer,
                           bool tp_rank0)
{
    int np = c->whole.nparams;
    for (int i = 0; i < c->n; i++) {
        const mt_param_t *p = &c->whole.params[i % np];
        bool writes = (i < np ? model_writer : optim_writer) && (p->tp_dim >= 0 || tp_rank0);
        c->t_save[i] = c->t[i];
        if (!writes)
            c->t_save[i].row_offset = c->t_save[i].row_count = 0;
    }
}

void mt_train_ckpt_stage(mt_train_ckpt_t *c, const mt_backend_t *be)
{
    for (int i = 0; i < c->n; i++) {
        c->t[i].be = c->t[i].data ? be : NULL;
        c->t_save[i].be = c->t_save[i].data ? be : NULL;
    }
}

void mt_train_ckpt_free(mt_train_ckpt_t *c)
{
    mt_ckpt_lock_release(&c->lock);
    mt_model_free(&c->whole);
    free(c->t);
    free(c->t_save);
    free(c->config_yaml);
    memset(c, 0, sizeof *c);
}

mt_status_t mt_train_save(MPI_Comm comm, const mt_config_t *cfg, mt_train_ckpt_t *c,
                          int64_t step, int64_t G)
{
    mt_train_state_t st = {step, step * G, 0, cfg->rng.seed, 0};
    MT_TRY(mt_ckpt_save(comm, cfg->checkpoint.checkpoint_dir, c->t_save, c->n, &st, c->config_yaml,
                        c->mesh, cfg->checkpoint.keep_last_n));
    /* AutoModel's final: the save of the last step, not one a signal asks for earlier */
    mt_consolidate_t when = cfg->checkpoint.save_consolidated;
    if (when == MT_CONSOLIDATE_EVERY ||
        (when == MT_CONSOLIDATE_FINAL && step >= cfg->step_scheduler.max_steps)) {
        char dir[MT_PATH_MAX + 32];
        snprintf(dir, sizeof dir, "%s/step_%08lld", cfg->checkpoint.checkpoint_dir,
                 (long long)step);
        MT_TRY(mt_hf_save_consolidated(comm, cfg, dir, c->t_save, c->n, NULL));
    }
    return MT_OK;
}

mt_status_t mt_train_resume(MPI_Comm comm, const mt_config_t *cfg, mt_train_ckpt_t *c,
                            int64_t *start, FILE *out)
{
    int rank;
    MPI_Comm_rank(comm, &rank);
    *start = 0;
    const char *mode = cfg->checkpoint.resume;
    char dir[MT_PATH_MAX + 64] = "";
    bool found_here = false; /* found and verified by find_latest */
    if (mode[0] == '\0' || strcmp(mode, "none") == 0)
        return MT_OK;
    if (strcmp(mode, "auto") == 0) {
        if (!cfg->checkpoint.enabled)
            return MT_OK;
        int found = 0;
        mt_status_t s = MT_OK;
        if (rank == 0)
            s = mt_ckpt_find_latest(cfg->checkpoint.checkpoint_dir, dir, sizeof dir, &found,
                                    out ? out : stderr);
        int st[2] = {(int)s, found};
        MT_MPI_TRY(MPI_Bcast(st, 2, MPI_INT, 0, comm));
        if (st[0] != MT_OK) {
            if (rank != 0)
                MT_FAIL((mt_status_t)st[0], "rank 0 could not search %s for checkpoints",
                        cfg->checkpoint.checkpoint_dir);
            MT_TRY(s);
        }
        if (!st[1])
            return MT_OK;
        MT_MPI_TRY(MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, comm));
        found_here = true;
    } else {
        snprintf(dir, sizeof dir, "%s", mode);
    }
    mt_train_state_t state;
    MT_TRY(found_here ? mt_ckpt_load_found(comm, dir, c->t, c->n, &state)
                      : mt_ckpt_load(comm, dir, c->t, c->n, &state));
    c->opt->step = state.step;
    c->resumed = 1;
    *start = state.step;
    if (rank == 0 && out) {
        fprintf(out, "resumed from %s at step %lld (%lld samples consumed)\n", dir,
                (long long)state.step, (long long)state.consumed_samples);
        fflush(out);
    }
    if (state.step >= cfg->step_scheduler.max_steps && rank == 0 && out)
        fprintf(out, "the checkpoint is at or past max_steps %lld: nothing to train\n",
                (long long)cfg->step_scheduler.max_steps);
    return MT_OK;
}
