/* test_plan: meshtrain-plan's numbers and output.  Parameter counts against
 * a hand count of the tiny model (and of one with head_dim apart from
 * hidden / heads and every bias, against the model's own count), the memory formulas of doc/plan.md on
 * layouts where they reduce to simple products, stage placement, the
 * simulated bubbles against the closed forms and the schedule table, the
 * device's workspace and NCCL buffers, the LM head's row chunks, and the text and JSON
 * reports (driven in-process through mt_plan_main with temporary files). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mt_app.h"
#include "mt_model.h"
#include "mt_plan.h"
#include "mt_test.h"

static const char *srcdir(void)
{
    const char *s = getenv("abs_top_srcdir");
    return s ? s : ".";
}

static mt_config_t cfg;

/* tiny.yaml plus overrides (';'-separated), validated for `world`. */
static int setup(int64_t world, const char *overrides)
{
    char path[4096], buf[1024];
    snprintf(path, sizeof path, "%s/share/configs/tiny.yaml", srcdir());
    mt_config_init(&cfg);
    if (mt_config_load_file(&cfg, path) != MT_OK) {
        CHECK(0, "load tiny.yaml: %s", mt_error_message());
        return 0;
    }
    snprintf(buf, sizeof buf, "%s", overrides ? overrides : "");
    for (char *tok = strtok(buf, ";"); tok; tok = strtok(NULL, ";"))
        if (mt_config_override(&cfg, tok) != MT_OK) {
            CHECK(0, "%s: %s", tok, mt_error_message());
            return 0;
        }
    mt_status_t s = mt_config_validate(&cfg, MT_APP_ANY, world, NULL, NULL);
    CHECK(s == MT_OK, "validate (%s): %s", overrides ? overrides : "", mt_error_message());
    return s == MT_OK;
}

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1.0, fabs(b)); }

static void test_params(void)
{
    mt_plan_t p;
    if (!setup(1, "distributed.strategy=ddp"))
        return;
    CHECK(mt_plan_compute(&cfg, &p) == MT_OK, "%s", mt_error_message());
    /* tiny: V 512, H 128, I 352, 4 layers, 4 heads of 32, 2 kv heads. */
    int64_t layer = 2 * 128 * 128 + 2 * (2 * 32) * 128 + 3 * 128 * 352 + 2 * 128;
    CHECK(p.params_layer_max == layer, "layer %lld != %lld", (long long)p.params_layer_max,
          (long long)layer);
    CHECK(p.params_embedding == 512 * 128, "embedding");
    CHECK(p.params_head == 128 + 512 * 128, "untied head");
    int64_t total = 512 * 128 + 128 + 512 * 128 + 4 * layer;
    CHECK(p.params_total == total, "total %lld != %lld", (long long)p.params_total, (long long)total);
    /* ddp on one rank, fp32: params 4 B, grads 4 B, AdamW 8 B per parameter. */
    CHECK(near(p.bytes_params, 4.0 * (double)total), "ddp params bytes %.0f", p.bytes_params);
    CHECK(near(p.bytes_grads, 4.0 * (double)total), "ddp grad bytes");
    CHECK(near(p.bytes_optim, 8.0 * (double)total), "ddp optimizer bytes");
    /* activations: per token per layer 4H + (2H + 2 kv hd + heads) + 3I, plus fp32 logits */
    double tokens = 2 * 128; /* local_batch 2 x seq 128 */
    double per = 4 * 128 + (2 * 128 + 2 * 2 * 32 + 4) + 3 * 352;
    /* plus one microbatch of backward working buffers: 6H + (Q + 2 KV + I) */
    double work = 6 * 128 + (128 + 2 * 64 + 352);
    CHECK(near(p.bytes_activations, 4 * per * tokens * 4 + tokens * 512 * 4 + tokens * work * 4),
          "activations %.0f", p.bytes_activations);
    CHECK(p.bubble_fraction == 0, "no bubble without pp");

    if (!setup(1, "model.tie_word_embeddings=true"))
        return;
    mt_plan_compute(&cfg, &p);
    CHECK(p.params_head == 128 && p.params_total == total - 512 * 128, "tied head");

    /* 4 heads of 48 (q 192 wide against H 128) and every linear's bias:
     * the layer by hand, the total as the model counts it */
    if (!setup(1, "model.head_dim=48;model.attention_bias=true;model.mlp_bias=true"))
        return;
    mt_plan_compute(&cfg, &p);
    int64_t blayer = 2 * 192 * 128 + 2 * (2 * 48) * 128 + 3 * 128 * 352 + 2 * 128 +
                     (192 + 2 * 96 + 128) + (2 * 352 + 128);
    CHECK(p.params_layer_max == blayer, "head_dim 48, biases: layer %lld != %lld",
          (long long)p.params_layer_max, (long long)blayer);
    mt_model_t bm;
    if (mt_model_init_ex(&bm, &cfg, mt_backend_cpu(), 1, 8, MT_MODEL_NO_PARAM_ARENA |
                         MT_MODEL_NO_GRAD_ARENA | MT_MODEL_NO_ACT_ARENA, -1) == MT_OK) {
        CHECK(p.params_total == mt_model_logical_numel(&bm), "head_dim 48, biases: plan %lld, "
              "model %lld parameters", (long long)p.params_total,
              (long long)mt_model_logical_numel(&bm));
        mt_model_free(&bm);
    } else {
        CHECK(0, "model: %s", mt_error_message());
    }
    /* ... and per token per layer: q and the attention output 192 wide */
    double bper = 4 * 128 + (2 * 192 + 2 * 2 * 48 + 4) + 3 * 352;
    double bwork = 6 * 128 + (192 - 128) + (192 + 2 * 96 + 352); /* datt: 192 wide */
    CHECK(near(p.bytes_activations, 4 * bper * tokens * 4 + tokens * 512 * 4 + tokens * bwork * 4),
          "head_dim 48: activations %.0f", p.bytes_activations);

    /* fsdp2 over 4 ranks: a quarter of everything, plus two gathered layers. */
    if (!setup(4, "step_scheduler.global_batch_size=8"))
        return;
    mt_plan_compute(&cfg, &p);
    CHECK(near(p.bytes_params, 4.0 * (double)total / 4 + 2 * 4.0 * (double)layer),
          "fsdp2 params %.0f", p.bytes_params);
    CHECK(near(p.bytes_optim, 8.0 * (double)total / 4), "fsdp2 optimizer");
    CHECK(near(p.bytes_grads, 4.0 * (double)total / 4 + 2 * 4.0 * (double)layer),
          "fsdp2 grads %.0f", p.bytes_grads);
    /* deferred sync with accumulation keeps every unit's gradient unsharded */
    if (!setup(4, "step_scheduler.global_batch_size=16"))
        return;
    mt_plan_compute(&cfg, &p);
    CHECK(near(p.bytes_grads, 4.0 * (double)total / 4 + 4.0 * (double)total),
          "fsdp2 deferred grads %.0f", p.bytes_grads);
    /* without deferral: ring slots, plus the reduce-scatter landing shard */
    if (!setup(4, "step_scheduler.global_batch_size=16;distributed.defer_fsdp_grad_sync=false"))
        return;
    mt_plan_compute(&cfg, &p);
    CHECK(near(p.bytes_grads, 2 * 4.0 * (double)total / 4 + 2 * 4.0 * (double)layer),
          "fsdp2 per-micro-step grads %.0f", p.bytes_grads);

    /* bf16 compute keeps float32 storage (doc/mixed-precision.md) and adds
     * an fp32 master copy to the optimizer state (ddp: not fsdp shards). */
    if (!setup(1, "distributed.strategy=ddp;distributed.mp_policy.param_dtype=bfloat16"))
        return;
    mt_plan_compute(&cfg, &p);
    CHECK(near(p.bytes_params, 4.0 * (double)total) && near(p.bytes_optim, 12.0 * (double)total),
          "bf16 params %.0f optim %.0f", p.bytes_params, p.bytes_optim);

    /* bf16 storage (MT_PLAN_BF16_STORAGE): the arena and the activations
     * take 2 bytes an element, plus dh's float32 accumulator; fsdp2's
     * owned shards stay float32 (the masters), its gathered units halve;
     * under float32 compute the flag changes nothing. */
    mt_plan_compute_ex(&cfg, MT_PLAN_BF16_STORAGE, &p);
    CHECK(p.bf16_storage && near(p.bytes_params, 2.0 * (double)total) &&
              near(p.bytes_grads, 4.0 * (double)total) && near(p.bytes_optim, 12.0 * (double)total),
          "bf16 storage params %.0f grads %.0f optim %.0f", p.bytes_params, p.bytes_grads,
          p.bytes_optim);
    /* (the lse, 4 heads, stays 4 bytes) */
    CHECK(near(p.bytes_activations, (2 * (per - 4) + 4 * 4) * tokens * 4 + tokens * 512 * 2 +
                                        tokens * work * 2 + tokens * 128 * 4),
          "bf16 storage activations %.0f", p.bytes_activations);
    if (!setup(4, "step_scheduler.global_batch_size=8;distributed.mp_policy.param_dtype=bfloat16"))
        return;
    mt_plan_compute_ex(&cfg, MT_PLAN_BF16_STORAGE, &p);
    CHECK(near(p.bytes_params, 4.0 * (double)total / 4 + 2 * 2.0 * (double)layer),
          "bf16 storage fsdp2 params %.0f", p.bytes_params);
    if (!setup(1, "distributed.strategy=ddp"))
        return;
    mt_plan_compute_ex(&cfg, MT_PLAN_BF16_STORAGE, &p);
    CHECK(!p.bf16_storage && near(p.bytes_params, 4.0 * (double)total),
          "bf16 storage under float32 compute");

    /* megatron_fsdp zero levels shard progressively. */
    for (int z = 0; z <= 3; z++) {
        char ov[256];
        snprintf(ov, sizeof ov, "distributed.strategy=megatron_fsdp;distributed.zero_dp_strategy=%d;"
                 "step_scheduler.global_batch_size=8", z);
        if (!setup(4, ov))
            return;
        mt_plan_compute(&cfg, &p);
        double t = (double)total;
        CHECK(near(p.bytes_optim, 8 * t / (z >= 1 ? 4 : 1)), "zero %d optimizer", z);
        /* sharded gradients: the shard plus two ring slots of unit gradients */
        CHECK(near(p.bytes_grads, 4 * t / (z >= 2 ? 4 : 1) + (z >= 2 ? 8.0 * (double)layer : 0)),
              "zero %d grads %.0f", z, p.bytes_grads);
        CHECK(near(p.bytes_params, 4 * t / (z >= 3 ? 4 : 1) + (z >= 3 ? 8.0 * (double)layer : 0)),
              "zero %d params", z);
    }
}

static void test_pipeline(void)
{
    mt_plan_t p;
    const char *base = "model.num_hidden_layers=8;step_scheduler.local_batch_size=8;"
                       "step_scheduler.global_batch_size=8;distributed.pp_size=4;";
    char ov[512];
    struct { const char *sched; double bubble; } cases[] = {
        {"gpipe", 3.0 / 11}, {"1f1b", 3.0 / 11}, {"interleaved_1f1b", 3.0 / 19},
        {"looped_bfs", 3.0 / 19}, {"dfs", 3.0 / 19}, {"zero_bubble", 3.0 / 27},
        {"v_schedule", 3.0 / 51}, /* ZB-V: only the ramp of p-1 stage forwards, (p-1)/(6m+p-1) */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(ov, sizeof ov, "%sdistributed.pipeline.pp_schedule=%s", base, cases[i].sched);
        if (!setup(4, ov))
            return;
        mt_plan_compute(&cfg, &p);
        CHECK(near(p.bubble_fraction, cases[i].bubble), "%s bubble %.4f, expected %.4f",
              cases[i].sched, p.bubble_fraction, cases[i].bubble);
        /* the comparison table: all seven, this one marked, same figure */
        CHECK(p.pp_table_len == MT_PP_NUM_SCHEDULES, "%s: table of %d", cases[i].sched,
              p.pp_table_len);
        for (int k = 0; k < p.pp_table_len; k++) {
            const mt_plan_pp_row_t *row = &p.pp_table[k];
            bool me = strcmp(mt_pp_schedule_name(row->schedule), cases[i].sched) == 0;
            CHECK(row->chosen == me && row->valid, "%s: row %d", cases[i].sched, k);
            if (me)
                CHECK(row->bubble_fraction == p.bubble_fraction, "%s: table figure", cases[i].sched);
        }
        for (int r = 0; r < 4; r++)
            CHECK(mt_plan_layers_on_rank(&cfg, r) == 2, "%s: rank %d layers", cases[i].sched, r);
    }
    /* v_schedule with m < 2p keeps the (p-1)/(6m+p-1) of its ramp. */
    snprintf(ov, sizeof ov, "%sdistributed.pipeline.pp_schedule=v_schedule;"
             "step_scheduler.local_batch_size=4;step_scheduler.global_batch_size=4", base);
    if (setup(4, ov)) {
        mt_plan_compute(&cfg, &p);
        CHECK(near(p.bubble_fraction, 3.0 / 27), "v_schedule m<2p: %.4f", p.bubble_fraction);
    }
    /* schedules the generator refuses for this m are listed with the reason */
    if (setup(4, "model.num_hidden_layers=8;distributed.pp_size=4;step_scheduler.global_batch_size=2;"
                 "distributed.pipeline.pp_schedule=1f1b")) {
        mt_plan_compute(&cfg, &p);
        const mt_plan_pp_row_t *row = &p.pp_table[MT_PP_INTERLEAVED_1F1B];
        CHECK(!row->valid && strstr(row->note, "multiple of pp_size 4"), "interleaved m=2 p=4: %s",
              row->note);
        CHECK(p.pp_table[MT_PP_DFS].valid && p.pp_table[MT_PP_1F1B].chosen, "dfs m=2 p=4");
    }
    /* layers_per_stage: 8 layers at 3 per stage on pp 3 = stages of 3, 3, 2. */
    if (setup(3, "model.num_hidden_layers=8;distributed.pp_size=3;step_scheduler.global_batch_size=2;"
                 "distributed.pipeline.layers_per_stage=3")) {
        CHECK(mt_plan_layers_on_rank(&cfg, 0) == 3 && mt_plan_layers_on_rank(&cfg, 2) == 2,
              "uneven stages");
    }
    /* V placement: rank 0 holds stages 0 and 2p-1.  10 layers at 3 per
     * stage: stages of 3, 3, 3, 1; rank 0 gets 3 + 1, rank 1 gets 3 + 3. */
    if (setup(2, "model.num_hidden_layers=10;distributed.pp_size=2;step_scheduler.global_batch_size=2;"
                 "distributed.pipeline.pp_schedule=v_schedule;distributed.pipeline.layers_per_stage=3")) {
        CHECK(mt_plan_layers_on_rank(&cfg, 0) == 4 && mt_plan_layers_on_rank(&cfg, 1) == 6,
              "V placement: %lld and %lld layers", (long long)mt_plan_layers_on_rank(&cfg, 0),
              (long long)mt_plan_layers_on_rank(&cfg, 1));
    }
    mt_error_clear();
    /* gpipe keeps every microbatch alive; 1f1b at most p. */
    snprintf(ov, sizeof ov, "%sdistributed.pipeline.pp_schedule=gpipe", base);
    if (setup(4, ov)) {
        mt_plan_compute(&cfg, &p);
        CHECK(p.inflight_microbatches == 8, "gpipe in flight %.0f", p.inflight_microbatches);
    }
    snprintf(ov, sizeof ov, "%sdistributed.pipeline.pp_schedule=1f1b", base);
    if (setup(4, ov)) {
        mt_plan_compute(&cfg, &p);
        CHECK(p.inflight_microbatches == 4, "1f1b in flight %.0f", p.inflight_microbatches);
    }
}

/* distributed.device cuda: the backend workspace, and NCCL's wire buffers
 * by the trainer's rules (doc/plan.md), in the total; none on the CPU or
 * with collectives mpi. */
static void test_device(void)
{
    mt_plan_t cpu, p;
    const double ws = 96.0 * 1024 * 1024;
    if (setup(1, NULL)) {
        mt_plan_compute(&cfg, &cpu);
        CHECK(cpu.bytes_device_workspace == 0 && cpu.bytes_device_nccl == 0, "cpu: no device");
    }
    if (setup(1, "distributed.device=cuda")) {
        mt_plan_compute(&cfg, &p);
        CHECK(p.bytes_device_workspace == ws && p.bytes_device_nccl == 0, "1 rank: workspace only");
        CHECK(near(p.bytes_total, cpu.bytes_total + ws), "1 rank total %.0f", p.bytes_total);
        CHECK(near(mt_plan_gpu_bytes_needed(&p), p.bytes_total / 0.9), "gpu needed");
    }
    /* pp 2, 1f1b, 4 microbatches of 2 x 128 tokens, H 128: each rank sends
     * and receives 4 messages through 2 send and 2 receive buffers
     * (mt_pp_sched_buffers); bf16 messages are half */
    const char *pp = "distributed.device=cuda;distributed.pp_size=2;"
                     "distributed.pipeline.pp_schedule=1f1b;distributed.pipeline.pp_microbatch_size=2;"
                     "step_scheduler.local_batch_size=8;step_scheduler.global_batch_size=8";
    double msg = 2.0 * 128 * 128 * 4;
    if (setup(2, pp)) {
        mt_plan_compute(&cfg, &p);
        CHECK(near(p.bytes_device_nccl, 4 * msg), "pp 2 fp32 wire %.0f", p.bytes_device_nccl);
    }
    char ov[1024];
    snprintf(ov, sizeof ov, "%s;distributed.mp_policy.param_dtype=bfloat16", pp);
    if (setup(2, ov)) {
        mt_plan_compute(&cfg, &p);
        CHECK(near(p.bytes_device_nccl, 2 * msg), "pp 2 bf16 wire %.0f", p.bytes_device_nccl);
    }
    snprintf(ov, sizeof ov, "%s;distributed.collectives=mpi", pp);
    if (setup(2, ov)) {
        mt_plan_compute(&cfg, &p);
        CHECK(p.bytes_device_nccl == 0 && p.bytes_device_workspace == ws, "collectives mpi");
    }
    /* tp 2 in bf16: a micro-batch of the residual stream in bf16 (2 x 128
     * tokens x 128 x 2 bytes); in fp32 no pad */
    if (setup(2, "distributed.device=cuda;distributed.tp_size=2;"
                 "distributed.mp_policy.param_dtype=bfloat16")) {
        mt_plan_compute(&cfg, &p);
        CHECK(near(p.bytes_device_nccl, 2.0 * 256 * 128), "tp 2 bf16 pad %.0f",
              p.bytes_device_nccl);
    }
    if (setup(2, "distributed.device=cuda;distributed.tp_size=2")) {
        mt_plan_compute(&cfg, &p);
        CHECK(p.bytes_device_nccl == 0, "tp 2 fp32: no pad");
    }
    /* fsdp2 over 2: a pad of the largest unit, a decoder layer (q, o; k, v;
     * the MLP; two norms), in fp32, in bf16 when both directions are */
    double layer = 2 * 128 * 128 + 2 * 64 * 128 + 3 * 128 * 352 + 2 * 128;
    if (setup(2, "distributed.device=cuda")) {
        mt_plan_compute(&cfg, &p);
        CHECK(near(p.bytes_device_nccl, 4.0 * layer), "fsdp2 pad %.0f", p.bytes_device_nccl);
    }
    if (setup(2, "distributed.device=cuda;distributed.mp_policy.param_dtype=bfloat16;"
                 "distributed.mp_policy.reduce_dtype=bfloat16")) {
        mt_plan_compute(&cfg, &p);
        CHECK(near(p.bytes_device_nccl, 2.0 * layer), "fsdp2 bf16 pad %.0f", p.bytes_device_nccl);
    }
    /* ddp over 2 with bf16 reductions: a bucket's bf16 pad, here the whole
     * model (smaller than the 25 MB cap) */
    if (setup(2, "distributed.device=cuda;distributed.strategy=ddp;"
                 "distributed.mp_policy.param_dtype=bfloat16;distributed.mp_policy.reduce_dtype=bfloat16")) {
        mt_plan_compute(&cfg, &p);
        CHECK(near(p.bytes_device_nccl, 2.0 * (double)p.params_total), "ddp bf16 pad %.0f",
              p.bytes_device_nccl);
    }
}

/* Run mt_plan_main, capture stdout and stderr. */
static int run_plan(char *out, size_t ocap, char *err, size_t ecap, int argc, char **argv)
{
    FILE *fo = tmpfile(), *fe = tmpfile();
    int rc = mt_plan_main(argc, argv, fo, fe);
    rewind(fo);
    rewind(fe);
    size_t n = fread(out, 1, ocap - 1, fo);
    out[n] = '\0';
    n = fread(err, 1, ecap - 1, fe);
    err[n] = '\0';
    fclose(fo);
    fclose(fe);
    return rc;
}

static void test_cli(void)
{
    static char out[1 << 16], err[1 << 14];
    char path[4096];
    snprintf(path, sizeof path, "%s/share/configs/llama3-70b-tp8-pp4.yaml", srcdir());
    char *a1[] = {"meshtrain-plan", "--config", path, "--world-size", "64", "--ranks-per-node", "8"};
    int rc = run_plan(out, sizeof out, err, sizeof err, 7, a1);
    CHECK(rc == 0, "plan rc %d: %s", rc, err);
    CHECK_CONTAINS(out, "is valid for meshtrain-dense on 64 ranks");
    CHECK_CONTAINS(out, "mesh                 pp 4 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 8");
    CHECK_CONTAINS(out, "64 ranks on 8 nodes (8 per node)");
    CHECK_CONTAINS(out, "tp            8 groups of 8: [0,1,2,3,4,5,6,7] [8,9,10,11,12,13,14,15]");
    CHECK_CONTAINS(out, "pp            16 groups of 4: [0,16,32,48]");
    CHECK_CONTAINS(out, "(8 more; --all-groups lists them)");
    CHECK_CONTAINS(out, "interleaved_1f1b, 8 stages (2 per rank), 16 microbatches of 1");
    CHECK_CONTAINS(out, "parameters           70.55B");
    CHECK_CONTAINS(out, "pipeline bubble        8.6% (simulated: F = B = W per stage, "
                        "no communication time, p=4 m=16 v=2)");
    CHECK_CONTAINS(out, "* interleaved_1f1b   2     8.6%          9.4%    5.5 (11)");
    CHECK_CONTAINS(out, "  1f1b               1    15.8%         18.8%    4.0 (4)");
    CHECK_CONTAINS(out, "  zero_bubble        1     5.9%          6.2%    4.0 (4)");
    CHECK_CONTAINS(out, "  v_schedule         2     3.0%          3.1%    4.0 (8)");
    /* 11 slots of 10 layers' inputs, bf16 but for each stage's first:
     * (4 + 9 x 2) bytes x 8192 x 8192 / 8 = 176 MiB a slot, plus one
     * layer's recompute set */
    CHECK_CONTAINS(out, "activations             3.688 GiB (11 stage-microbatches in flight)");
    CHECK_CONTAINS(out, "memory per rank");

    /* TP spanning nodes is caught by plan too. */
    char *a2[] = {"meshtrain-plan", "--config", path, "--world-size", "64", "--ranks-per-node", "4"};
    rc = run_plan(out, sizeof out, err, sizeof err, 7, a2);
    CHECK(rc == 1, "tp across nodes rc %d", rc);
    CHECK_CONTAINS(err, "spans two nodes");

    /* JSON lists every group. */
    char *a3[] = {"meshtrain-plan", "--config", path, "--world-size", "64", "--json"};
    rc = run_plan(out, sizeof out, err, sizeof err, 6, a3);
    CHECK(rc == 0, "json rc %d: %s", rc, err);
    CHECK_CONTAINS(out, "\"tp\": 8");
    CHECK_CONTAINS(out, "\"pp\": [[0, 16, 32, 48], [1, 17, 33, 49]");
    CHECK_CONTAINS(out, "\"bubble_fraction\": 0.085714");
    CHECK_CONTAINS(out, "\"bf16_storage\": false");
    setenv("MESHTRAIN_BF16_STORAGE", "1", 1); /* as the trainer reads it */
    rc = run_plan(out, sizeof out, err, sizeof err, 6, a3);
    unsetenv("MESHTRAIN_BF16_STORAGE");
    CHECK(rc == 0, "json rc %d: %s", rc, err);
    CHECK_CONTAINS(out, "\"bf16_storage\": true");
    /* bf16 compute on device cuda: bf16 storage unless it is set to 0 */
    char *a3c[] = {"meshtrain-plan", "--config", path, "--world-size", "64", "--json",
                   "distributed.device=cuda"};
    rc = run_plan(out, sizeof out, err, sizeof err, 7, a3c);
    CHECK(rc == 0 && strstr(out, "\"bf16_storage\": true"), "cuda default: rc %d", rc);
    setenv("MESHTRAIN_BF16_STORAGE", "0", 1);
    rc = run_plan(out, sizeof out, err, sizeof err, 7, a3c);
    unsetenv("MESHTRAIN_BF16_STORAGE");
    CHECK(rc == 0 && strstr(out, "\"bf16_storage\": false"), "cuda, storage 0: rc %d", rc);
    CHECK_CONTAINS(out, "{\"schedule\": \"interleaved_1f1b\", \"v\": 2, \"chosen\": true, "
                        "\"valid\": true, \"bubble_fraction\": 0.085714, \"bubble_ratio\": 0.093750");

    /* overrides, usage errors */
    char *a4[] = {"meshtrain-plan", "--config", path, "--world-size", "64", "distributed.tp_size=3"};
    rc = run_plan(out, sizeof out, err, sizeof err, 6, a4);
    CHECK(rc == 1, "invalid override rc %d", rc);
    CHECK_CONTAINS(err, "override 'distributed.tp_size=3'");
    char *a5[] = {"meshtrain-plan", "--config", path};
    rc = run_plan(out, sizeof out, err, sizeof err, 3, a5);
    CHECK(rc == 2, "missing --world-size rc %d", rc);
    char *a6[] = {"meshtrain-plan", "--config", path, "--world-size", "zero"};
    rc = run_plan(out, sizeof out, err, sizeof err, 5, a6);
    CHECK(rc == 2 && strstr(err, "positive integer"), "bad world size rc %d", rc);
    char *a7[] = {"meshtrain-plan", "--config-reference"};
    rc = run_plan(out, sizeof out, err, sizeof err, 2, a7);
    CHECK(rc == 0, "reference rc %d", rc);
    CHECK_CONTAINS(out, "| `tp_size` | integer >= 1 | `1` |");

    /* --gpu-memory: the verdict on stderr, exit 3 when a rank does not fit */
    char *a8[] = {"meshtrain-plan", "--config", path, "--world-size", "64", "--ranks-per-node",
                  "8", "distributed.device=cuda", "--gpu-memory", "141"};
    rc = run_plan(out, sizeof out, err, sizeof err, 10, a8);
    CHECK(rc == 0, "fits rc %d: %s", rc, err);
    CHECK_CONTAINS(err, "fits: a rank needs a GPU of");
    CHECK_CONTAINS(out, "device workspace       96.000 MiB");
    CHECK_CONTAINS(out, "NCCL wire buffers");
    CHECK_CONTAINS(out, "GPU memory needed");
    a8[9] = "8";
    rc = run_plan(out, sizeof out, err, sizeof err, 10, a8);
    CHECK(rc == 3, "does not fit rc %d", rc);
    CHECK_CONTAINS(err, "does not fit: a rank needs a GPU of");
    a8[7] = "distributed.device=cpu";
    rc = run_plan(out, sizeof out, err, sizeof err, 10, a8);
    CHECK(rc == 2 && strstr(err, "needs distributed.device: cuda"), "cpu --gpu-memory rc %d", rc);
    a8[7] = "distributed.device=cuda", a8[9] = "lots";
    rc = run_plan(out, sizeof out, err, sizeof err, 10, a8);
    CHECK(rc == 2 && strstr(err, "size in GiB"), "bad --gpu-memory rc %d", rc);
}

/* The LM head's row chunks (mt_model_head_chunk), which the trainer and
 * the plan share: 256 MiB of float32 logits, but at least 1024 rows
 * (doc/training.md), at most the micro-batch's rows, and the variable. */
static void test_head_chunk(void)
{
    CHECK(mt_model_head_chunk(8192, 512) == 8192, "small vocabulary: every row at once");
    CHECK(mt_model_head_chunk(8192, 32000) == 2048 && (256 << 20) / (4 * 32000) == 2097,
          "32k: the 256 MiB rows (2097), in whole 128 rows");
    CHECK(mt_model_head_chunk(8192, 16000) == 4096 && (256 << 20) / (4 * 16000) == 4194,
          "16k: the 256 MiB rows (4194), in whole 128 rows");
    CHECK(mt_model_head_chunk(16384, 128256) == MT_HEAD_CHUNK_MIN && MT_HEAD_CHUNK_MIN == 2048,
          "128k: the 2048-row floor, not %d", (256 << 20) / (4 * 128256));
    CHECK(mt_model_head_chunk(2000, 128256) == 2000, "fewer rows than the floor: all of them");
    CHECK(mt_model_head_chunk(600, 128256) == 600, "fewer rows than the floor: all of them");
    setenv("MESHTRAIN_HEAD_CHUNK_ROWS", "7", 1);
    CHECK(mt_model_head_chunk(16384, 128256) == 7, "MESHTRAIN_HEAD_CHUNK_ROWS");
    unsetenv("MESHTRAIN_HEAD_CHUNK_ROWS");
}

int main(void)
{
    test_params();
    test_head_chunk();
    test_pipeline();
    test_device();
    test_cli();
    return mt_test_exit("test_plan");
}
