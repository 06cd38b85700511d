/* train_sample.h: the training log's samples (logging.sample_every_steps,
 * train_sample.c). */
#ifndef MT_TRAIN_SAMPLE_H
#define MT_TRAIN_SAMPLE_H

#include <stdint.h>
#include <stdio.h>

#include "mt_config.h"
#include "mt_model.h"

/* On rank 0 after step `step`, when a sample is due: a greedy sample of
 * logging.sample_tokens from logging.sample_prompt through m's weights,
 * one line "sample step N: TEXT" on out (control bytes escaped).  Not
 * collective and never fatal: what goes wrong is a warning line, and the
 * samples stop. */
void mt_train_sample(const mt_config_t *cfg, const mt_model_t *m, int64_t step, FILE *out);

#endif
