/* test_model_storage: the model on bf16 storage (mt_model_t.bf16_storage,
 * the CPU table mt_backend_cpu_bf16_storage; doc/mixed-precision.md,
 * "bf16 storage: the plan", step 3) computes the bits of the model on the
 * CPU rounding table, where every activation is a bf16 value in float32
 * storage.
 *
 * Two models of the tiny config, one on each table, same seed: the float32
 * one's weights rounded as the trainer rounds them (src/train/train_mp.c), the
 * other's initialised as bf16 bits.  Two micro-batches (the gradients
 * accumulate), forward with the head's backward, then the backward, and
 * an evaluation forward: the losses and token counts must be equal, the
 * float32 gradient arenas equal byte for byte, and the last layer output
 * and the residual gradient equal as bf16 bits.  Dense, qk_norm, tied
 * embeddings, packed rows (document-masked attention), activation
 * checkpointing, a split backward (zero-bubble's B then W), the LM head
 * in chunks of 3 rows (the offsets into xf and dh), every linear's bias
 * with head_dim apart from hidden / heads, and MoE layers with a
 * shared expert and with checkpointing (the experts' arena and gradients
 * too).  Also: the arenas take half the bytes, and float32 compute is
 * refused at init.  The parallel paths are tests/train/mixed_precision.sh's.
 * No MPI ranks beyond one. */
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mt_backend.h"
#include "mt_bf16.h"
#include "mt_config.h"
#include "mt_model.h"
#include "mt_test.h"
#include "mt_test_model.h"
#include "model_moe.h"

#define BF16 "distributed.mp_policy.param_dtype=bfloat16"

static void same_grads(const char *label, const mt_model_t *a, const mt_model_t *b)
{
    CHECK(a->numel == b->numel && memcmp(a->grad_mem, b->grad_mem,
                                         sizeof(float) * (size_t)a->numel) == 0,
          "%s: the gradients differ", label);
    if (a->moe)
        CHECK(a->moe->numel == b->moe->numel &&
                  memcmp(a->moe->grad_mem, b->moe->grad_mem,
                         sizeof(float) * (size_t)a->moe->numel) == 0,
              "%s: the experts' gradients differ", label);
}

/* a's float32 activation (bf16 values) against b's bf16 bits */
static void same_act(const char *label, const char *what, const float *a, const float *b,
                     int64_t n)
{
    const uint16_t *bb = (const uint16_t *)b;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += mt_f32_to_bf16(a[i]) != bb[i];
    CHECK(bad == 0, "%s: %s: %lld of %lld elements differ", label, what, (long long)bad,
          (long long)n);
}

static void run(const char *label, const char *extra, bool packed, bool split)
{
    mt_config_t cfg;
    if (!mt_test_model_cfg(&cfg, BF16, extra, strstr(extra, "experts") ? MT_APP_MOE : MT_APP_DENSE,
                           1))
        return;
    mt_model_t a, b;
    static int lo[1] = {0}, hi[1];
    mt_model_part_t part = {0};
    const mt_model_part_t *pp = NULL;
    if (split) {
        hi[0] = (int)cfg.model.num_hidden_layers;
        part.nchunks = 1, part.layer_lo = lo, part.layer_hi = hi;
        part.embed = part.head = true, part.nslots = 1, part.split_backward = true;
        pp = &part;
    }
    const int64_t B = 2, T = 8, N = B * T;
    mt_status_t sa = mt_model_init_part(&a, &cfg, mt_backend_cpu_bf16(), B, T, 0, -1, pp);
    CHECK(sa == MT_OK, "%s: %s", label, mt_error_message());
    mt_status_t sb = mt_model_init_part(&b, &cfg, mt_backend_cpu_bf16_storage(), B, T, 0, -1, pp);
    CHECK(sb == MT_OK, "%s: %s", label, mt_error_message());
    if (sa != MT_OK || sb != MT_OK)
        return;
    CHECK(b.bf16_storage && !a.bf16_storage, "%s: bf16_storage a %d b %d", label,
          a.bf16_storage, b.bf16_storage);
    /* half the activation arena but the float32 parts (rstd, lse, dh_acc) */
    CHECK(b.act_numel < a.act_numel * 3 / 4, "%s: activation arena %lld floats, float32 %lld",
          label, (long long)b.act_numel, (long long)a.act_numel);
    mt_model_init_weights(&a, 5);
    a.be->round_bf16(a.param_mem, a.numel);
    mt_model_init_weights(&b, 5);
    for (int i = 0; i < a.nparams; i++) /* nonzero biases (they start at 0), as bf16 values */
        for (int64_t j = 0; a.params[i].is_bias && j < a.params[i].numel; j++) {
            uint16_t v = mt_f32_to_bf16((float)(0.2 * mt_rng_normal(3, (uint32_t)i, (uint64_t)j)));
            a.params[i].data[j] = mt_bf16_to_f32(v);
            ((uint16_t *)b.params[i].data)[j] = v;
        }
    same_act(label, "initial weights", a.param_mem, b.param_mem, a.numel);
    if (a.moe) { /* the experts' arena too */
        a.be->round_bf16(a.moe->param_mem, a.moe->numel);
        same_act(label, "initial expert weights", a.moe->param_mem, b.moe->param_mem,
                 a.moe->numel);
    }
    mt_model_zero_grad(&a);
    mt_model_zero_grad(&b);
    if (packed) { /* two documents in row 0, three in row 1 */
        int32_t pos[16], ds[16];
        for (int64_t i = 0; i < N; i++) {
            int64_t t = i % T, start = i < T ? (t < 5 ? 0 : 5) : (t < 2 ? 0 : t < 6 ? 2 : 6);
            ds[i] = (int32_t)start, pos[i] = (int32_t)(t - start);
        }
        mt_model_set_packing(&a, pos, ds);
        mt_model_set_packing(&b, pos, ds);
    }
    for (int mb = 0; mb < 2; mb++) {
        int32_t tok[16], tgt[16];
        mt_test_batch(N, 37, tok, tgt, 21 + 2 * (uint32_t)mb);
        int64_t ca, cb;
        double la = mt_model_forward_chunk(&a, 0, tok, tgt, true, 1.0f / 15, &ca);
        double lb = mt_model_forward_chunk(&b, 0, tok, tgt, true, 1.0f / 15, &cb);
        CHECK(la == lb && ca == cb, "%s, micro-batch %d: loss %.17g (%lld) vs %.17g (%lld)", label,
              mb, lb, (long long)cb, la, (long long)ca);
        same_act(label, "x_final", a.x_final, b.x_final, N * a.H);
        same_act(label, "dres after the head", a.dres, b.dres, N * a.H);
        mt_model_backward_chunk(&a, 0, tok, split);
        mt_model_backward_chunk(&b, 0, tok, split);
        if (split) {
            mt_model_weight_chunk(&a, 0);
            mt_model_weight_chunk(&b, 0);
        }
        same_act(label, "dres after the backward", a.dres, b.dres, N * a.H);
        same_grads(label, &a, &b);
    }
    int32_t tok[16], tgt[16];
    mt_test_batch(N, 37, tok, tgt, 40);
    int64_t ca, cb;
    double la = mt_model_forward_chunk(&a, 0, tok, tgt, false, 1.0f, &ca);
    double lb = mt_model_forward_chunk(&b, 0, tok, tgt, false, 1.0f, &cb);
    CHECK(la == lb && ca == cb, "%s, evaluation: loss %.17g vs %.17g", label, lb, la);
    mt_model_free(&a);
    mt_model_free(&b);
}

static void refused(const char *label, const char *base, const char *extra, mt_app_kind_t app,
                    int64_t world, int tp_rank, const char *needle)
{
    mt_config_t cfg;
    if (!mt_test_model_cfg(&cfg, base, extra, app, world))
        return;
    mt_model_t m;
    mt_status_t s = mt_model_init_ex(&m, &cfg, mt_backend_cpu_bf16_storage(), 2, 8, 0, tp_rank);
    CHECK(s != MT_OK, "%s: accepted", label);
    if (s != MT_OK)
        CHECK_CONTAINS(mt_error_message(), needle);
    else
        mt_model_free(&m);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    run("dense", "", false, false);
    run("qk_norm", "model.qk_norm=true", false, false);
    run("tied", "model.tie_word_embeddings=true", false, false);
    run("packed rows", "", true, false);
    run("checkpointing", "distributed.activation_checkpointing=true", false, false);
    run("split backward", "", false, true);
    /* the biases (added by rank-1 GEMMs before the linears', one rounding)
     * with heads 6 wide against hidden 16, whole and split backward */
    run("biases, head_dim 6", "model.head_dim=6;model.attention_bias=true;model.mlp_bias=true",
        false, false);
    run("biases, split backward", "model.attention_bias=true;model.mlp_bias=true", false, true);
    setenv("MESHTRAIN_HEAD_CHUNK_ROWS", "3", 1);
    run("head in chunks of 3 rows", "model.qk_norm=true", false, false);
    unsetenv("MESHTRAIN_HEAD_CHUNK_ROWS");
    /* MoE: the rows as bf16 bits, the combine, the shared expert's sum and
     * the experts' input gradients in float32 */
    run("moe with a shared expert",
        "model.num_experts=4;model.num_experts_per_tok=2;model.moe_intermediate_size=8;"
        "model.num_shared_experts=1;model.router_aux_loss_coef=0.01",
        false, false);
    run("moe, checkpointing",
        "model.num_experts=4;model.num_experts_per_tok=2;model.moe_intermediate_size=8;"
        "distributed.activation_checkpointing=true",
        false, false);
    refused("float32 compute", NULL, NULL, MT_APP_DENSE, 1, -1, "bfloat16 only");
    int rc = mt_test_exit("test_model_storage");
    MPI_Finalize();
    return rc;
}
