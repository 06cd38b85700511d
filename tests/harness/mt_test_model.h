/* mt_test_model.h: the tiny model the model tests share (test_model,
 * test_moe, test_device_discipline): its config and random batches.
 * Header-only like mt_test.h; it holds no test logic of its own. */
#ifndef MT_TEST_MODEL_H
#define MT_TEST_MODEL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mt_config.h"
#include "mt_rng.h"
#include "mt_test.h"

/* Two layers, hidden 16, GQA 4/2, vocabulary 37, rows of 8 tokens. */
#define MT_TEST_TINY_MODEL                                                        \
    "model.vocab_size=37;model.hidden_size=16;model.intermediate_size=24;"        \
    "model.num_hidden_layers=2;model.num_attention_heads=4;"                      \
    "model.num_key_value_heads=2;model.rope_theta=100.0;"                         \
    "model.initializer_range=0.2;dataset.seq_length=8;"                           \
    "step_scheduler.global_batch_size=2;step_scheduler.local_batch_size=2"

/* The tiny model's config with the overrides of base and then extra
 * ("key=value;key=value", either NULL), validated for app on world ranks;
 * 0 (and a failed CHECK) when an override or the validation fails. */
static inline int mt_test_model_cfg(mt_config_t *cfg, const char *base, const char *extra,
                                    mt_app_kind_t app, int64_t world)
{
    mt_config_init(cfg);
    const char *parts[3] = {MT_TEST_TINY_MODEL, base, extra};
    for (int k = 0; k < 3; k++) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", parts[k] ? parts[k] : "");
        for (char *t = strtok(buf, ";"); t; t = strtok(NULL, ";"))
            if (mt_config_override(cfg, t) != MT_OK) {
                CHECK(0, "%s: %s", t, mt_error_message());
                return 0;
            }
    }
    mt_status_t s = mt_config_validate(cfg, app, world, NULL, NULL);
    CHECK(s == MT_OK, "%s", mt_error_message());
    return s == MT_OK;
}

/* n random tokens and targets below vocab from rng stream `stream`;
 * target 1 is ignored (-100). */
static inline void mt_test_batch(int64_t n, int64_t vocab, int32_t *tok, int32_t *tgt,
                                 uint32_t stream)
{
    for (int64_t i = 0; i < n; i++) {
        tok[i] = (int32_t)(mt_rng_uniform(7, stream, (uint64_t)i) * (double)vocab);
        tgt[i] = (int32_t)(mt_rng_uniform(7, stream + 1, (uint64_t)i) * (double)vocab);
    }
    tgt[1] = -100;
}

#endif
