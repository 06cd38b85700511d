/* train_sample.c: a greedy sample in the training log every
 * logging.sample_every_steps steps, as llm.c prints one, from rank 0's
 * copy of the model through the KV-cache decoder (mt_decode.h).
 *
 * Validation has made sure the model is whole on rank 0 (all experts
 * too), on the CPU.  The decoder runs on a view of it built for one token
 * (a MoE layer routes the model's micro-batch): its own small buffers,
 * the training model's parameters.  The tokenizer is the named model's tokenizer.json when it has one,
 * else the byte tokenizer.  A sample reads the weights and touches no
 * training state.  Nothing is gathered: sharded runs are refused before
 * they start. */
#include "train_sample.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model_moe.h"
#include "mt_decode.h"
#include "mt_hf.h"
#include "mt_tokenizer.h"

/* after a failure: no more samples in this process (one warning) */
static bool given_up;

static mt_status_t load_tokenizer(const mt_config_t *cfg, mt_tokenizer_t **tok)
{
    if (cfg->model.pretrained_model_name_or_path[0]) {
        char dir[MT_PATH_MAX + 512], path[MT_PATH_MAX + 600];
        struct stat st;
        MT_TRY(mt_hf_resolve(&cfg->model, dir, sizeof dir));
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        if (stat(path, &st) == 0)
            return mt_tokenizer_load(path, tok);
    }
    return mt_tokenizer_load("byte", tok);
}

static void print_escaped(FILE *out, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", out);
        else if (c == '\t')
            fputs("\\t", out);
        else if (c == '\\')
            fputs("\\\\", out);
        else if (c < 0x20 || c == 0x7f)
            fprintf(out, "\\x%02x", c);
        else
            fputc(c, out);
    }
}

/* v: the model's architecture for one token at a time, over m's
 * parameters (and experts, and a copy of the balancing biases) */
static mt_status_t one_token_view(const mt_config_t *cfg, const mt_model_t *m, mt_model_t *v)
{
    MT_TRY(mt_model_init_ex(v, cfg, m->be, 1, 1, MT_MODEL_NO_PARAM_ARENA |
                            MT_MODEL_NO_GRAD_ARENA | MT_MODEL_NO_EXPERT_ARENAS, -1));
    bool same = v->nparams == m->nparams && !v->moe == !m->moe &&
                (!m->moe || (v->moe->nxp == m->moe->nxp && !v->moe->bias == !m->moe->bias));
    if (!same)
        MT_FAIL(MT_ERR_INTERNAL, "the sample's view of the model has other parameters");
    for (int i = 0; i < m->nparams; i++)
        if (!(v->params[i].data = m->params[i].data))
            MT_FAIL(MT_ERR_UNSUPPORTED, "%s is not on this rank", m->params[i].name);
    for (int i = 0; m->moe && i < m->moe->nxp; i++)
        if (!(v->moe->xp[i].data = m->moe->xp[i].data))
            MT_FAIL(MT_ERR_UNSUPPORTED, "%s is not on this rank", m->moe->xp[i].name);
    if (m->moe && m->moe->bias)
        m->be->copy(v->moe->bias, m->moe->bias, sizeof(float) * (size_t)(m->L * m->moe->E));
    return MT_OK;
}

static mt_status_t sample(const mt_config_t *cfg, const mt_model_t *model, int64_t step,
                          FILE *out)
{
    mt_model_t view;
    memset(&view, 0, sizeof view);
    const mt_model_t *m = &view;
    const mt_logging_config_t *lc = &cfg->logging;
    mt_tokenizer_t *tok = NULL;
    mt_ids_t ids = {0}, gen = {0};
    mt_text_t txt = {0};
    mt_decode_t d = {0};
    float *logits = NULL;
    mt_status_t s = one_token_view(cfg, model, &view);
    if (s == MT_OK)
        s = load_tokenizer(cfg, &tok);
    if (s == MT_OK)
        s = mt_tokenizer_encode(tok, lc->sample_prompt, strlen(lc->sample_prompt), true, &ids);
    if (s == MT_OK && ids.n == 0) { /* a document start */
        int32_t b = mt_tokenizer_bos_id(tok);
        s = mt_ids_push(&ids, b >= 0 ? b : mt_tokenizer_eos_id(tok));
    }
    int64_t V = m->V_valid;
    if (s == MT_OK && mt_tokenizer_vocab_size(tok) < V) /* ids the tokenizer writes */
        V = mt_tokenizer_vocab_size(tok);
    if (s == MT_OK)
        s = mt_decode_init(&d, m, (int64_t)ids.n + lc->sample_tokens);
    if (s == MT_OK && !(logits = malloc(sizeof(float) * (size_t)m->V_valid)))
        s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "sample logits");
    if (s == MT_OK)
        s = mt_decode_forward(&d, ids.v, (int64_t)ids.n, logits, false);
    mt_sample_opts_t o;
    mt_sample_opts_init(&o);
    o.greedy = true;
    const int32_t eos = tok ? mt_tokenizer_eos_id(tok) : -1;
    for (int64_t i = 0; s == MT_OK && i < lc->sample_tokens; i++) {
        int32_t t = mt_sample(logits, V, &o, (uint64_t)i, NULL);
        s = mt_ids_push(&gen, t);
        if (s != MT_OK || t == eos || i + 1 == lc->sample_tokens)
            break;
        s = mt_decode_forward(&d, &t, 1, logits, false);
    }
    if (s == MT_OK)
        s = mt_tokenizer_decode(tok, gen.v, gen.n, true, &txt);
    if (s == MT_OK) {
        fprintf(out, "sample step %lld: ", (long long)step);
        print_escaped(out, txt.s ? txt.s : "", txt.n);
        fputc('\n', out);
        fflush(out);
    }
    free(logits);
    mt_decode_free(&d);
    mt_text_free(&txt);
    mt_ids_free(&gen);
    mt_ids_free(&ids);
    mt_tokenizer_free(tok);
    mt_model_free(&view);
    return s;
}

void mt_train_sample(const mt_config_t *cfg, const mt_model_t *m, int64_t step, FILE *out)
{
    const int64_t every = cfg->logging.sample_every_steps;
    if (every <= 0 || step % every != 0 || given_up || !out)
        return;
    mt_status_t s = sample(cfg, m, step, out);
    if (s != MT_OK) {
        fprintf(out, "warning: step %lld: no sample (%s); samples are off for the rest of "
                "the run\n", (long long)step, mt_error_message());
        fflush(out);
        given_up = true;
    }
}
