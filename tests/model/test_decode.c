/* test_decode: incremental decoding with the KV cache (mt_decode.h)
 * against the model's own full forward, and the samplers.
 *
 * 1. For each family the model runs (Llama, Llama biases, Qwen2 biases,
 *    Qwen3 q/k norm with head_dim, Mistral with a window shorter than the
 *    sequence, llama3 RoPE scaling, tied embeddings), every position's
 *    logits from a prefill followed by single-token steps equal the
 *    logits of mt_model_step over the whole sequence to 1e-5; so do
 *    those of one prefill of the whole sequence, and of a sequence longer
 *    than the decoder's chunk of rows.  Under a window the cache holds
 *    fewer rows than the sequence (it drops rows before the window).  The decoder runs on a second model
 *    of the same weights built for one token (as meshtrain-generate
 *    builds it); MoE layers (Qwen3-MoE, Mixtral, OLMoE, shared experts and
 *    a dense layer) route through it a token at a time.
 * 2. Refusals: MoE on a model built for more than one token, a token
 *    outside the vocabulary, a sequence past max_len.
 * 3. Sampling: the same seed gives the same ids, top_k 1 and a tiny top_p
 *    give greedy's, top_k 3 draws only the 3 most likely, and draws at
 *    temperature 1 follow the softmax.
 * No MPI. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mt_backend.h"
#include "mt_config.h"
#include "mt_decode.h"
#include "mt_model.h"
#include "mt_test.h"
#include "mt_test_model.h"

static int make(mt_model_t *m, mt_config_t *cfg, const char *extra, int64_t T)
{
    char buf[512];
    snprintf(buf, sizeof buf, "dataset.seq_length=%lld;step_scheduler.global_batch_size=1;"
             "step_scheduler.local_batch_size=1;%s", (long long)T, extra ? extra : "");
    if (!mt_test_model_cfg(cfg, NULL, buf, MT_APP_ANY, 1))
        return 0;
    mt_status_t s = mt_model_init(m, cfg, mt_backend_cpu(), 1, T);
    CHECK(s == MT_OK, "init (%s): %s", buf, mt_error_message());
    if (s != MT_OK)
        return 0;
    mt_model_init_weights(m, 11);
    return 1;
}

static double max_diff(const float *a, const float *b, int64_t n, double *scale)
{
    double d = 0.0, s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        d = e > d || isnan(e) ? e : d;
        s = fabs(b[i]) > s ? fabs(b[i]) : s;
    }
    *scale = s;
    return d;
}

/* the logits of every position: full forward vs prefill(P) + steps */
static void against_forward(const char *what, const char *extra, int64_t T, int64_t P)
{
    mt_config_t cfg;
    mt_model_t m;
    if (!make(&m, &cfg, extra, T))
        return;
    const int64_t V = m.V_valid;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T), *tgt = malloc(sizeof(int32_t) * (size_t)T);
    float *full = malloc(sizeof(float) * (size_t)(T * V)), *dec = malloc(sizeof(float) * (size_t)(T * V));
    mt_test_batch(T, V, tok, tgt, 3);
    int64_t cnt;
    mt_model_step(&m, tok, tgt, false, 1.0f, &cnt);
    for (int64_t i = 0; i < T; i++) /* m.logits: [T, padded V] (T <= the head chunk) */
        m.be->copy_to_host(full + i * V, m.logits + i * m.V, sizeof(float) * (size_t)V);

    /* the decoder on a model of the same weights built for one token at a
     * time, as meshtrain-generate builds it (MoE layers route per token) */
    mt_model_t m1;
    mt_status_t s = mt_model_init_ex(&m1, &cfg, mt_backend_cpu(), 1, 1, MT_MODEL_NO_GRAD_ARENA, -1);
    CHECK(s == MT_OK, "%s: the 1-token model: %s", what, mt_error_message());
    if (s != MT_OK) {
        free(tok), free(tgt), free(full), free(dec);
        mt_model_free(&m);
        return;
    }
    mt_model_init_weights(&m1, 11);
    mt_decode_t d;
    s = mt_decode_init(&d, &m1, T);
    CHECK(s == MT_OK, "%s: decoder: %s", what, mt_error_message());
    if (s == MT_OK) {
        s = mt_decode_forward(&d, tok, P, dec, true);
        for (int64_t t = P; s == MT_OK && t < T; t++)
            s = mt_decode_forward(&d, tok + t, 1, dec + t * V, false);
        CHECK(s == MT_OK && d.len == T, "%s: decode: %s", what, mt_error_message());
        if (m.window > 0 && 3 * m.window < T) /* the window bounds the cache */
            CHECK(d.cap < T && d.base > 0, "%s: a cache of %lld rows from position %lld for "
                  "%lld positions, window %lld", what, (long long)d.cap, (long long)d.base,
                  (long long)T, (long long)m.window);
        double sc, e = max_diff(dec, full, T * V, &sc);
        CHECK(e <= 1e-5 * (sc > 1 ? sc : 1), "%s: prefill %lld + steps: logits differ from the "
              "full forward by %.3g (largest |logit| %.3g)", what, (long long)P, e, sc);
        /* again from the start, the whole sequence at once */
        mt_decode_reset(&d);
        s = mt_decode_forward(&d, tok, T, dec, true);
        e = max_diff(dec, full, T * V, &sc);
        CHECK(s == MT_OK && e <= 1e-5 * (sc > 1 ? sc : 1), "%s: one prefill: logits differ by "
              "%.3g", what, e);
        mt_decode_free(&d);
    }
    free(tok), free(tgt), free(full), free(dec);
    mt_model_free(&m1);
    mt_model_free(&m);
}

static void refusals(void)
{
    mt_config_t cfg;
    mt_model_t m;
    mt_decode_t d;
    if (make(&m, &cfg, "model.num_experts=4;model.num_experts_per_tok=2;"
             "model.moe_intermediate_size=8", 8)) {
        mt_status_t s = mt_decode_init(&d, &m, 8);
        CHECK(s == MT_ERR_UNSUPPORTED && strstr(mt_error_message(), "MoE layers needs the model "
              "built for one token at a time"), "MoE on an 8-token model refused: %s",
              mt_error_message());
        mt_model_free(&m);
    }
    if (!make(&m, &cfg, NULL, 8))
        return;
    if (mt_decode_init(&d, &m, 4) == MT_OK) {
        int32_t bad[2] = {3, 37}, ok[5] = {1, 2, 3, 4, 5};
        float lg[37];
        mt_status_t s = mt_decode_forward(&d, bad, 2, lg, false);
        CHECK(s == MT_ERR_RANGE && strstr(mt_error_message(), "id 37") && d.len == 0,
              "a token outside the vocabulary: %s", mt_error_message());
        s = mt_decode_forward(&d, ok, 5, lg, false);
        CHECK(s == MT_ERR_RANGE && strstr(mt_error_message(), "5 tokens") && d.len == 0,
              "past max_len: %s", mt_error_message());
        mt_decode_free(&d);
    }
    mt_model_free(&m);
}

static void sampling(void)
{
    enum { V = 50, N = 40000 };
    float l[V];
    for (int i = 0; i < V; i++) /* a few likely ids, a tie at the top (ids 7, 19) */
        l[i] = i == 7 || i == 19 ? 2.5f : (float)(0.3 * sin(1.7 * i));
    mt_sample_opts_t o, g;
    mt_sample_opts_init(&o);
    mt_sample_opts_init(&g);
    g.greedy = true;
    const int32_t best = mt_sample(l, V, &g, 0, NULL);
    CHECK(best == 7, "greedy: the lower id of the tie, got %d", best);
    o.seed = 42;
    int diff = 0, topk1 = 0, topp = 0;
    mt_sample_opts_t k1 = o, pp = o, k3 = o, o2 = o;
    k1.top_k = 1;
    pp.top_p = 1e-9;
    k3.top_k = 3;
    o2.seed = 43;
    static int hist[V];
    void *scratch = malloc(mt_sample_scratch_bytes(V));
    for (uint64_t t = 0; t < N; t++) {
        int32_t a = mt_sample(l, V, &o, t, scratch), b = mt_sample(l, V, &o, t, NULL);
        diff += a != b;
        hist[a]++;
        topk1 += mt_sample(l, V, &k1, t, scratch) != best;
        topp += mt_sample(l, V, &pp, t, scratch) != best;
    }
    /* the third most likely id by the logits themselves */
    int third = -1;
    for (int i = 0; i < V; i++)
        if (i != 7 && i != 19 && (third < 0 || l[i] > l[third]))
            third = i;
    int out3 = 0;
    for (uint64_t t = 0; t < 2000; t++) {
        int32_t c = mt_sample(l, V, &k3, t, scratch);
        out3 += c != 7 && c != 19 && c != third;
    }
    CHECK(diff == 0, "the same seed and step, the same id: %d differ", diff);
    CHECK(topk1 == 0 && topp == 0, "top_k 1 / tiny top_p equal greedy: %d, %d differ", topk1,
          topp);
    CHECK(out3 == 0, "top_k 3 drew %d ids outside the 3 most likely", out3);
    int same = 0;
    for (uint64_t t = 0; t < 200; t++)
        same += mt_sample(l, V, &o, t, scratch) == mt_sample(l, V, &o2, t, scratch);
    CHECK(same < 150, "another seed gives other ids: %d of 200 equal", same);
    double z = 0, mx = 2.5, worst = 0;
    for (int i = 0; i < V; i++)
        z += exp(l[i] - mx);
    for (int i = 0; i < V; i++) { /* binomial: within 5 standard deviations */
        double p = exp(l[i] - mx) / z, sd = sqrt(N * p * (1 - p));
        double dev = fabs(hist[i] - N * p) / sd;
        worst = dev > worst ? dev : worst;
    }
    CHECK(worst < 5.0, "draws follow the softmax: worst id %.2f standard deviations off", worst);
    mt_sample_opts_t bad = o;
    bad.top_p = 0.0;
    CHECK(mt_sample_opts_check(&bad) == MT_ERR_CONFIG && strstr(mt_error_message(), "top_p"),
          "top_p 0 refused: %s", mt_error_message());
    bad = o;
    bad.temperature = -1;
    CHECK(mt_sample_opts_check(&bad) == MT_ERR_CONFIG, "a negative temperature refused");
    free(scratch);
}

int main(void)
{
    against_forward("llama", NULL, 16, 5);
    against_forward("llama biases, head_dim", "model.head_dim=6;model.attention_bias=true;"
                    "model.mlp_bias=true", 12, 4);
    against_forward("qwen2", "model.architecture=Qwen2ForCausalLM", 12, 1);
    against_forward("qwen3", "model.architecture=Qwen3ForCausalLM;model.qk_norm=true;"
                    "model.head_dim=8", 12, 3);
    against_forward("mistral window 5", "model.architecture=MistralForCausalLM;"
                    "model.sliding_window=5", 20, 3);
    against_forward("mistral window 5, long prefill", "model.architecture=MistralForCausalLM;"
                    "model.sliding_window=5", 20, 13);
    against_forward("llama3 rope", "model.rope_scaling.rope_type=llama3;"
                    "model.rope_scaling.factor=4.0;model.rope_scaling.low_freq_factor=1.0;"
                    "model.rope_scaling.high_freq_factor=4.0;"
                    "model.rope_scaling.original_max_position_embeddings=8", 16, 2);
    against_forward("tied, mqa", "model.tie_word_embeddings=true;model.num_key_value_heads=1",
                    10, 4);
    against_forward("qwen3-moe", "model.num_experts=4;model.num_experts_per_tok=2;"
                    "model.moe_intermediate_size=8;model.norm_topk_prob=true;model.qk_norm=true",
                    12, 5);
    against_forward("mixtral", "model.architecture=MixtralForCausalLM;model.num_experts=4;"
                    "model.num_experts_per_tok=2;model.moe_intermediate_size=8", 12, 3);
    against_forward("olmoe", "model.architecture=OlmoeForCausalLM;model.num_experts=4;"
                    "model.num_experts_per_tok=2;model.moe_intermediate_size=8;"
                    "model.qk_norm=true", 12, 3);
    against_forward("moe, shared experts, dense layer", "model.num_experts=4;"
                    "model.num_experts_per_tok=2;model.moe_intermediate_size=8;"
                    "model.num_shared_experts=1;model.mlp_only_layers=0", 12, 3);
    against_forward("longer than a chunk, window", "model.architecture=MistralForCausalLM;"
                    "model.sliding_window=40", 300, 290);
    refusals();
    sampling();
    return mt_test_exit("test_decode");
}
