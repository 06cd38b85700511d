/* plan_report.c: meshtrain-plan's text and JSON reports.  The numbers come
 * from plan.c and mesh_layout.c; this file only lays them out. */
#include "mt_mesh.h"
#include "mt_plan.h"

#include "mt_cuda.h"

#include <stdlib.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

/* Bytes with a binary unit that keeps three significant digits or more. */
static const char *human_bytes(double b, char *buf, size_t cap)
{
    if (b >= GIB)
        snprintf(buf, cap, "%9.3f GiB", b / GIB);
    else if (b >= 1024.0 * 1024.0)
        snprintf(buf, cap, "%9.3f MiB", b / (1024.0 * 1024.0));
    else
        snprintf(buf, cap, "%9.3f KiB", b / 1024.0);
    return buf;
}

static void human_count(int64_t n, char *buf, size_t cap)
{
    if (n >= 1000000000LL)
        snprintf(buf, cap, "%.2fB", (double)n / 1e9);
    else if (n >= 1000000LL)
        snprintf(buf, cap, "%.2fM", (double)n / 1e6);
    else if (n >= 1000LL)
        snprintf(buf, cap, "%.1fK", (double)n / 1e3);
    else
        snprintf(buf, cap, "%lld", (long long)n);
}

void mt_plan_write_text(const mt_config_t *cfg, const mt_plan_t *plan, FILE *out,
                        int64_t max_groups)
{
    const mt_distributed_config_t *d = &cfg->distributed;
    const mt_derived_t *dv = &cfg->derived;
    mt_layout_t lay;
    char a[32], b[32], c[32], e[32];
    mt_layout_from_config(cfg, &lay);

    fprintf(out, "sizes\n");
    fprintf(out, "  strategy             %s", mt_strategy_name(d->strategy));
    if (d->strategy == MT_STRATEGY_MEGATRON_FSDP)
        fprintf(out, " (zero_dp_strategy %lld)", (long long)d->zero_dp_strategy);
    fprintf(out, "\n  world                %lld ranks on %lld node%s (%lld per node)\n",
            (long long)dv->world_size, (long long)dv->num_nodes, dv->num_nodes == 1 ? "" : "s",
            (long long)dv->ranks_per_node);
    fprintf(out, "  mesh                 pp %lld x dp_replicate %lld x dp_shard %lld x cp %lld x tp %lld\n",
            (long long)d->pp_size, (long long)dv->dp_replicate, (long long)dv->dp_shard,
            (long long)d->cp_size, (long long)d->tp_size);
    fprintf(out, "  dp                   %lld (dp_shard_cp %lld, dp_cp %lld)\n", (long long)dv->dp_size,
            (long long)(dv->dp_shard * d->cp_size), (long long)(dv->dp_size * d->cp_size));
    if (d->ep_size > 1)
        fprintf(out, "  moe mesh             pp %lld x ep_shard %lld x ep %lld\n",
                (long long)d->pp_size, (long long)dv->ep_shard, (long long)d->ep_size);
    fprintf(out, "  batch                global %lld = local %lld x dp %lld x %lld accumulation step%s\n",
            (long long)cfg->step_scheduler.global_batch_size,
            (long long)cfg->step_scheduler.local_batch_size, (long long)dv->dp_size,
            (long long)dv->grad_accum_steps, dv->grad_accum_steps == 1 ? "" : "s");
    fprintf(out, "  sequence             %lld tokens%s, %lld per CP rank%s\n", (long long)dv->seq_len,
            cfg->packed_sequence.packed_sequence_size > 0 ? " (packed)" : "",
            (long long)(dv->seq_len / d->cp_size), d->sequence_parallel ? ", sequence parallel" : "");
    if (d->pp_size > 1)
        fprintf(out, "  pipeline             %s, %lld stages (%lld per rank), %lld microbatches of %lld\n",
                mt_pp_schedule_name(d->pipeline.pp_schedule), (long long)dv->num_stages,
                (long long)dv->stages_per_rank, (long long)dv->num_microbatches,
                (long long)d->pipeline.pp_microbatch_size);

    fprintf(out, "\ngroups\n");
    mt_layout_write_groups(&lay, out, max_groups);

    human_count(plan->params_total, a, sizeof a);
    human_count(plan->params_embedding, b, sizeof b);
    human_count(plan->params_layer_max, c, sizeof c);
    human_count(plan->params_head, e, sizeof e);
    fprintf(out, "\nmodel\n  parameters           %s (embedding %s, %lld layers of %s, head %s)\n", a,
            b, (long long)cfg->model.num_hidden_layers, c, e);
    if (cfg->peft.enabled)
        fprintf(out, "  LoRA                 rank %lld, alpha %g: the base frozen (no gradients "
                "or optimizer state), the adapters train (doc/lora.md)\n",
                (long long)cfg->peft.dim, cfg->peft.alpha);
    if (dv->padded_vocab != cfg->model.vocab_size)
        fprintf(out, "  vocabulary           %lld padded to %lld for tp %lld\n",
                (long long)cfg->model.vocab_size, (long long)dv->padded_vocab, (long long)d->tp_size);

    fprintf(out, "\nmemory per rank, estimate (worst rank: pp rank %d, %lld layers%s; "
                 "doc/plan.md)\n",
            plan->worst_pp_rank, (long long)plan->layers_on_worst,
            plan->bf16_storage ? "; bf16 storage" : "");
    char hb[32];
    fprintf(out, "  parameters          %s\n", human_bytes(plan->bytes_params, hb, sizeof hb));
    fprintf(out, "  gradients           %s\n", human_bytes(plan->bytes_grads, hb, sizeof hb));
    fprintf(out, "  optimizer state     %s\n", human_bytes(plan->bytes_optim, hb, sizeof hb));
    fprintf(out, "  activations         %s (%.0f stage-microbatch%s in flight)\n",
            human_bytes(plan->bytes_activations, hb, sizeof hb), plan->inflight_microbatches,
            plan->inflight_microbatches == 1 ? "" : "es");
    if (d->device == MT_DEVICE_CUDA) {
        fprintf(out, "  device workspace    %s (cuBLASLt workspace, kernel scratch)\n",
                human_bytes(plan->bytes_device_workspace, hb, sizeof hb));
        if (plan->bytes_device_nccl > 0)
            fprintf(out, "  NCCL wire buffers   %s (pipeline messages, fsdp, ddp and TP pads)\n",
                    human_bytes(plan->bytes_device_nccl, hb, sizeof hb));
    }
    fprintf(out, "  total               %s\n", human_bytes(plan->bytes_total, hb, sizeof hb));
    if (d->device == MT_DEVICE_CUDA)
        fprintf(out, "  GPU memory needed   %s per GPU (the trainer reserves %.0f%% of it; "
                     "--gpu-memory checks a size)\n",
                human_bytes(mt_plan_gpu_bytes_needed(plan), hb, sizeof hb),
                100.0 * MT_CUDA_MEMORY_SHARE);

    fprintf(out, "\npipeline bubble        %.1f%% (%s", 100.0 * plan->bubble_fraction,
            plan->bubble_formula);
    if (d->pp_size > 1)
        fprintf(out, ", p=%lld m=%lld v=%lld", (long long)d->pp_size,
                (long long)dv->num_microbatches, (long long)dv->stages_per_rank);
    fprintf(out, ")\n");
    if (plan->pp_table_len == 0)
        return;
    /* every schedule at this p and m, simulated alike (doc/pipeline.md) */
    fprintf(out, "  schedule            v   bubble  idle/compute  rank-0 activations (microbatches of all\n"
                 "                                                its layers; stage-microbatches)\n");
    for (int k = 0; k < plan->pp_table_len; k++) {
        const mt_plan_pp_row_t *row = &plan->pp_table[k];
        fprintf(out, "%s %-17s %2d", row->chosen ? "*" : " ", mt_pp_schedule_name(row->schedule),
                row->v);
        if (row->valid)
            fprintf(out, "  %6.1f%%  %11.1f%%  %5.1f (%d)\n", 100.0 * row->bubble_fraction,
                    100.0 * row->bubble_ratio, (double)row->peak_held / row->v, row->peak_held);
        else
            fprintf(out, "  n/a: %s\n", row->note);
    }
}

static void json_groups(const mt_layout_t *lay, FILE *out)
{
    fprintf(out, "  \"groups\": {");
    int first = 1;
    for (int g = 0; g < MT_NGROUPS; g++) {
        if (!mt_layout_has_group(lay, (mt_group_t)g))
            continue;
        int64_t gs = mt_layout_group_size(lay, (mt_group_t)g);
        int64_t ng = mt_layout_num_groups(lay, (mt_group_t)g);
        int64_t *t = malloc(sizeof *t * (size_t)lay->world);
        if (!t)
            continue;
        mt_layout_group_table(lay, (mt_group_t)g, t);
        fprintf(out, "%s\n    \"%s\": [", first ? "" : ",", mt_group_name((mt_group_t)g));
        for (int64_t i = 0; i < ng; i++) {
            fprintf(out, "%s[", i ? ", " : "");
            for (int64_t j = 0; j < gs; j++)
                fprintf(out, "%s%lld", j ? ", " : "", (long long)t[i * gs + j]);
            fputc(']', out);
        }
        fputc(']', out);
        free(t);
        first = 0;
    }
    fprintf(out, "\n  },\n");
}

void mt_plan_write_json(const mt_config_t *cfg, const mt_plan_t *plan, FILE *out)
{
    const mt_distributed_config_t *d = &cfg->distributed;
    const mt_derived_t *dv = &cfg->derived;
    mt_layout_t lay;
    mt_layout_from_config(cfg, &lay);
    fprintf(out, "{\n  \"strategy\": \"%s\",\n", mt_strategy_name(d->strategy));
    fprintf(out, "  \"sizes\": {\"world\": %lld, \"nodes\": %lld, \"ranks_per_node\": %lld, "
                 "\"pp\": %lld, \"dp_replicate\": %lld, \"dp_shard\": %lld, \"cp\": %lld, "
                 "\"tp\": %lld, \"dp\": %lld, \"ep\": %lld, \"ep_shard\": %lld, "
                 "\"grad_accum_steps\": %lld, \"seq_len\": %lld, \"padded_vocab\": %lld, "
                 "\"stages\": %lld, \"stages_per_rank\": %lld, \"microbatches\": %lld},\n",
            (long long)dv->world_size, (long long)dv->num_nodes, (long long)dv->ranks_per_node,
            (long long)d->pp_size, (long long)dv->dp_replicate, (long long)dv->dp_shard,
            (long long)d->cp_size, (long long)d->tp_size, (long long)dv->dp_size,
            (long long)d->ep_size, (long long)dv->ep_shard, (long long)dv->grad_accum_steps,
            (long long)dv->seq_len, (long long)dv->padded_vocab, (long long)dv->num_stages,
            (long long)dv->stages_per_rank, (long long)dv->num_microbatches);
    json_groups(&lay, out);
    fprintf(out, "  \"parameters\": {\"total\": %lld, \"embedding\": %lld, \"layer_max\": %lld, "
                 "\"head\": %lld},\n",
            (long long)plan->params_total, (long long)plan->params_embedding,
            (long long)plan->params_layer_max, (long long)plan->params_head);
    fprintf(out, "  \"memory_per_rank_bytes\": {\"worst_pp_rank\": %d, \"parameters\": %.0f, "
                 "\"gradients\": %.0f, \"optimizer\": %.0f, \"activations\": %.0f, "
                 "\"device_workspace\": %.0f, \"nccl_wire\": %.0f, \"total\": %.0f, "
                 "\"gpu_needed\": %.0f, \"bf16_storage\": %s},\n",
            plan->worst_pp_rank, plan->bytes_params, plan->bytes_grads, plan->bytes_optim,
            plan->bytes_activations, plan->bytes_device_workspace, plan->bytes_device_nccl,
            plan->bytes_total,
            cfg->distributed.device == MT_DEVICE_CUDA ? mt_plan_gpu_bytes_needed(plan) : 0.0,
            plan->bf16_storage ? "true" : "false");
    fprintf(out, "  \"pipeline\": {\"schedule\": \"%s\", \"bubble_fraction\": %.6f, "
                 "\"bubble_ratio\": %.6f, \"formula\": \"%s\", \"schedules\": [",
            d->pp_size > 1 ? mt_pp_schedule_name(d->pipeline.pp_schedule) : "none",
            plan->bubble_fraction, plan->bubble_ratio, plan->bubble_formula);
    for (int k = 0; k < plan->pp_table_len; k++) {
        const mt_plan_pp_row_t *row = &plan->pp_table[k];
        fprintf(out, "%s\n    {\"schedule\": \"%s\", \"v\": %d, \"chosen\": %s, ", k ? "," : "",
                mt_pp_schedule_name(row->schedule), row->v, row->chosen ? "true" : "false");
        if (row->valid)
            fprintf(out, "\"valid\": true, \"bubble_fraction\": %.6f, \"bubble_ratio\": %.6f, "
                         "\"peak_activations_rank0\": %d}",
                    row->bubble_fraction, row->bubble_ratio, row->peak_held);
        else { /* the generator's message: no quotes or backslashes in it */
            fprintf(out, "\"valid\": false, \"reason\": \"");
            for (const char *c = row->note; *c; c++)
                fputc(*c == '"' || *c == '\\' ? '\'' : *c, out);
            fprintf(out, "\"}");
        }
    }
    fprintf(out, "%s]}\n}\n", plan->pp_table_len ? "\n  " : "");
}
