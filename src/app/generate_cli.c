/* generate_cli.c: meshtrain-generate, text from a meshtrain checkpoint or
 * a Hugging Face model directory (doc/generate.md).
 *
 * It builds the single-device model on the CPU backend from the model
 * section the source gives (a checkpoint's stored config, or the
 * config.json of a directory or hub id in the local cache), loads the
 * weights whole (mt_ckpt_load, mt_hf_load_weights), prefills the prompt
 * into the KV cache (mt_decode.h) and samples one token at a time until
 * --max-new-tokens, EOS or a --stop-id.  One rank: a launch on several is
 * refused on every rank, since a copy per rank would only repeat the work.
 * MoE models route a token at a time (the prompt too).
 * Nothing here trains or writes files; no chat templates. */
#include <config.h>

#include "mt_app.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mt_checkpoint.h"
#include "mt_comm.h"
#include "mt_decode.h"
#include "mt_hf.h"
#include "mt_model.h"
#include "mt_tokenizer.h"
#include "model_moe.h" /* the experts' tensors */

#define PROG "meshtrain-generate"
#define MAX_STOPS 16

typedef struct {
    const char *checkpoint, *model, *revision, *tokenizer;
    int64_t step; /* -1: latest */
    const char *prompt, *prompt_file, *prompt_ids;
    int64_t max_new;
    mt_sample_opts_t so;
    bool print_ids, help;
    int32_t stops[MAX_STOPS];
    int nstops;
} gen_args_t;

static void usage(FILE *o)
{
    fprintf(o,
            "usage: " PROG " (--checkpoint DIR [--step N] | --model NAME_OR_DIR [--revision R])\n"
            "       [--tokenizer byte|FILE|DIR] (--prompt TEXT | --prompt-file FILE |\n"
            "       --prompt-ids ID,ID,...) [--max-new-tokens N] [--greedy]\n"
            "       [--temperature T] [--top-k K] [--top-p P] [--seed S] [--stop-id ID]...\n"
            "       [--print-ids]\n"
            "Text from a meshtrain checkpoint (the latest step, or --step N) or a Hugging Face\n"
            "model (a directory, or a hub id in the local cache), on one rank, CPU.\n"
            "  --tokenizer       default: tokenizer.json of the model's directory; else the\n"
            "                    byte tokenizer when the vocabulary is its 258 ids\n"
            "  --max-new-tokens  tokens to generate (default 32); stops early at EOS or --stop-id\n"
            "  --greedy          argmax (also --temperature 0); default temperature 1\n"
            "  --top-k, --top-p  keep the K most likely / the smallest set of mass P\n"
            "  --seed            the draws' seed (default 0): the same seed, the same text\n"
            "  --print-ids       print the generated ids (comma-separated), not text\n");
}

static mt_status_t parse_i64(const char *opt, const char *s, int64_t lo, int64_t *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s || *end || x < lo)
        MT_FAIL(MT_ERR_CONFIG, "%s '%s': expected an integer >= %lld", opt, s, (long long)lo);
    *v = x;
    return MT_OK;
}

static mt_status_t parse_f64(const char *opt, const char *s, double *v)
{
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || end == s || *end)
        MT_FAIL(MT_ERR_CONFIG, "%s '%s': expected a number", opt, s);
    *v = x;
    return MT_OK;
}

static mt_status_t parse_ids(const char *s, mt_ids_t *ids)
{
    const char *p = s;
    for (int64_t k = 0;; k++) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ','))
            MT_FAIL(MT_ERR_CONFIG, "--prompt-ids '%s': entry %lld is not a token id "
                    "(comma-separated integers >= 0)", s, (long long)k);
        MT_TRY(mt_ids_push(ids, (int32_t)v));
        if (!*end)
            return MT_OK;
        p = end + 1;
    }
}

static mt_status_t parse_args(int argc, char **argv, gen_args_t *a)
{
    memset(a, 0, sizeof *a);
    a->step = -1;
    a->max_new = 32;
    mt_sample_opts_init(&a->so);
    static const char *const valued[] = {
        "--checkpoint", "--step", "--model", "--revision", "--tokenizer", "--prompt",
        "--prompt-file", "--prompt-ids", "--max-new-tokens", "--temperature", "--top-k",
        "--top-p", "--seed", "--stop-id"};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = NULL;
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            a->help = true;
            continue;
        }
        if (strcmp(o, "--greedy") == 0) {
            a->so.greedy = true;
            continue;
        }
        if (strcmp(o, "--print-ids") == 0) {
            a->print_ids = true;
            continue;
        }
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            known = known || strcmp(o, valued[k]) == 0;
        if (!known)
            MT_FAIL(MT_ERR_CONFIG, "unknown argument '%s' (see --help)", o);
        if (i + 1 >= argc)
            MT_FAIL(MT_ERR_CONFIG, "%s needs a value", o);
        v = argv[++i];
        int64_t n;
        if (strcmp(o, "--checkpoint") == 0) {
            a->checkpoint = v;
        } else if (strcmp(o, "--step") == 0) {
            MT_TRY(parse_i64(o, v, 0, &a->step));
        } else if (strcmp(o, "--model") == 0) {
            a->model = v;
        } else if (strcmp(o, "--revision") == 0) {
            a->revision = v;
        } else if (strcmp(o, "--tokenizer") == 0) {
            a->tokenizer = v;
        } else if (strcmp(o, "--prompt") == 0) {
            a->prompt = v;
        } else if (strcmp(o, "--prompt-file") == 0) {
            a->prompt_file = v;
        } else if (strcmp(o, "--prompt-ids") == 0) {
            a->prompt_ids = v;
        } else if (strcmp(o, "--max-new-tokens") == 0) {
            MT_TRY(parse_i64(o, v, 1, &a->max_new));
        } else if (strcmp(o, "--temperature") == 0) {
            MT_TRY(parse_f64(o, v, &a->so.temperature));
        } else if (strcmp(o, "--top-k") == 0) {
            MT_TRY(parse_i64(o, v, 0, &a->so.top_k));
        } else if (strcmp(o, "--top-p") == 0) {
            MT_TRY(parse_f64(o, v, &a->so.top_p));
        } else if (strcmp(o, "--seed") == 0) {
            MT_TRY(parse_i64(o, v, 0, &n));
            a->so.seed = (uint64_t)n;
        } else { /* --stop-id */
            if (a->nstops >= MAX_STOPS)
                MT_FAIL(MT_ERR_CONFIG, "more than %d --stop-id", MAX_STOPS);
            MT_TRY(parse_i64(o, v, 0, &n));
            if (n > INT32_MAX)
                MT_FAIL(MT_ERR_CONFIG, "--stop-id %s: not a token id", v);
            a->stops[a->nstops++] = (int32_t)n;
        }
    }
    if (a->help)
        return MT_OK;
    if (!a->checkpoint == !a->model)
        MT_FAIL(MT_ERR_CONFIG, a->model ? "--checkpoint and --model both given: one source"
                                        : "no model: pass --checkpoint DIR or --model NAME_OR_DIR");
    if (a->step >= 0 && !a->checkpoint)
        MT_FAIL(MT_ERR_CONFIG, "--step goes with --checkpoint");
    if (a->revision && !a->model)
        MT_FAIL(MT_ERR_CONFIG, "--revision goes with --model");
    if ((a->prompt != NULL) + (a->prompt_file != NULL) + (a->prompt_ids != NULL) != 1)
        MT_FAIL(MT_ERR_CONFIG, "pass exactly one of --prompt, --prompt-file, --prompt-ids");
    if (a->prompt_ids) { /* its form now, the vocabulary once the model is known */
        mt_ids_t ids = {0};
        mt_status_t s = parse_ids(a->prompt_ids, &ids);
        mt_ids_free(&ids);
        MT_TRY(s);
    }
    return mt_sample_opts_check(&a->so);
}

static bool is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The step directory of --checkpoint DIR [--step N]: DIR itself when it is
 * one (it holds model.h5), else DIR/step_N or the latest complete one. */
static mt_status_t step_dir_of(const gen_args_t *a, char *dir, size_t cap, FILE *err,
                               bool *verified)
{
    *verified = false;
    char p[MT_PATH_MAX + 32];
    if (!is_dir(a->checkpoint))
        MT_FAIL(MT_ERR_IO, "--checkpoint %s: no such directory", a->checkpoint);
    snprintf(p, sizeof p, "%s/model.h5", a->checkpoint);
    if (is_file(p)) {
        if (a->step >= 0)
            MT_FAIL(MT_ERR_CONFIG, "--checkpoint %s is a step directory; --step %lld needs the "
                    "checkpoint directory above it", a->checkpoint, (long long)a->step);
        snprintf(dir, cap, "%s", a->checkpoint);
        return MT_OK;
    }
    if (a->step >= 0) {
        snprintf(dir, cap, "%s/step_%08lld", a->checkpoint, (long long)a->step);
        if (!is_dir(dir))
            MT_FAIL(MT_ERR_IO, "--checkpoint %s has no step %lld (%s)", a->checkpoint,
                    (long long)a->step, dir);
        return MT_OK;
    }
    int found = 0;
    MT_TRY(mt_ckpt_find_latest(a->checkpoint, dir, cap, &found, err));
    *verified = found != 0;
    if (!found)
        MT_FAIL(MT_ERR_IO, "--checkpoint %s holds no complete checkpoint (no verified "
                "step_* directory)", a->checkpoint);
    return MT_OK;
}

/* One device, whatever the run was sharded over: the model section is
 * what counts; the distributed section goes back to its defaults. */
static mt_status_t single_device(mt_config_t *cfg)
{
    mt_config_t def;
    mt_config_init(&def);
    cfg->distributed = def.distributed;
    cfg->step_scheduler.global_batch_size = cfg->step_scheduler.local_batch_size = 1;
    return mt_config_validate(cfg, MT_APP_ANY, 1, NULL, NULL); /* (no warnings about
                                                                * sections it ignores) */
}

/* The config of the source, and where its tokenizer.json would be. */
static mt_status_t source_config(const gen_args_t *a, mt_config_t *cfg, char *step_dir,
                                 size_t cap, char *model_dir, size_t mcap, FILE *err)
{
    mt_config_init(cfg);
    model_dir[0] = step_dir[0] = '\0';
    if (a->model) {
        MT_TRY(mt_hf_resolve_name(a->model, a->revision, "--model", model_dir, mcap));
        snprintf(cfg->model.pretrained_model_name_or_path,
                 sizeof cfg->model.pretrained_model_name_or_path, "%s", model_dir);
        MT_TRY(mt_hf_apply_named_model(cfg, NULL)); /* (sets no model.* key to warn about) */
        return single_device(cfg);
    }
    bool verified;
    MT_TRY(step_dir_of(a, step_dir, cap, err, &verified));
    if (!verified) /* (the latest one found is verified already) */
        MT_TRY(mt_ckpt_verify(step_dir));
    char *yaml = NULL;
    MT_TRY(mt_ckpt_read_config(step_dir, &yaml));
    char name[MT_PATH_MAX + 32];
    snprintf(name, sizeof name, "%s (stored config)", step_dir);
    mt_status_t s = mt_config_load_string(cfg, yaml, name);
    free(yaml);
    MT_TRY(s);
    /* its tokenizer: the consolidated copy's, else the named model's */
    snprintf(model_dir, mcap, "%s/model/consolidated", step_dir);
    if (!is_dir(model_dir) && cfg->model.pretrained_model_name_or_path[0] &&
        mt_hf_resolve(&cfg->model, model_dir, mcap) != MT_OK) {
        mt_error_clear();
        model_dir[0] = '\0';
    }
    return single_device(cfg);
}

/* One entry of the tensor list: `rows` rows of a [rows, cols] (cols 1:
 * 1-D) tensor at data, or an entry with nothing to read (data NULL). */
static void entry(mt_ckpt_tensor_t *t, const char *fmt, const char *name, int ndim, int64_t rows,
                  int64_t cols, float *data, const mt_backend_t *be)
{
    snprintf(t->path, sizeof t->path, fmt, name);
    t->ndim = ndim;
    t->shape[0] = rows;
    t->shape[1] = ndim > 1 ? cols : 1;
    t->row_count = data ? rows : 0;
    t->data = data;
    t->be = data && !be->host_memory ? be : NULL;
}

/* The tensor list of the model's whole parameters (the experts' and the
 * balancing biases too), as checkpoints and safetensors hold them (the
 * real vocabulary's rows only); with optim, the checkpoint's optimizer
 * tensors as well, of which nothing is read (a checkpoint is read against
 * its whole list). */
static mt_status_t tensor_list(const mt_model_t *m, bool optim, mt_ckpt_tensor_t **out, int *n)
{
    static const char *const kind[3] = {"/model/%s", "/optim/%s/exp_avg", "/optim/%s/exp_avg_sq"};
    const mt_moe_t *x = m->moe;
    const int nk = optim ? 3 : 1, nbias = x && x->bias ? x->nmoe : 0;
    const int cap = nk * (m->nparams + (x ? x->nxp : 0)) + nbias;
    mt_ckpt_tensor_t *t = calloc((size_t)cap, sizeof *t);
    if (!t)
        MT_FAIL(MT_ERR_NOMEM, "tensor list");
    int k = 0;
    for (int s = 0; s < nk; s++) {
        for (int i = 0; i < m->nparams; i++) {
            const mt_param_t *p = &m->params[i];
            bool vocab = p == m->embed || p == m->lm_head;
            entry(&t[k++], kind[s], p->name, p->ndim, vocab ? m->V_valid : p->shape[0],
                  p->shape[1], s == 0 ? p->data : NULL, m->be);
        }
        for (int i = 0; x && i < x->nxp; i++)
            entry(&t[k++], kind[s], x->xp[i].name, 2, x->xp[i].shape[0], x->xp[i].shape[1],
                  s == 0 ? x->xp[i].data : NULL, m->be);
    }
    for (int l = 0; nbias && l < m->L; l++) {
        if (!x->sparse[l])
            continue;
        char name[MT_PARAM_NAME_MAX];
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
        entry(&t[k++], "/model/%s", name, 1, x->E, 1, x->bias + l * x->E, m->be);
    }
    *out = t;
    *n = k;
    return MT_OK;
}

static mt_status_t load_weights(MPI_Comm comm, const gen_args_t *a, const mt_config_t *cfg,
                                mt_model_t *m, const char *step_dir, FILE *err)
{
    mt_ckpt_tensor_t *t = NULL;
    int n = 0;
    MT_TRY(tensor_list(m, a->checkpoint != NULL, &t, &n));
    mt_status_t s = a->model ? mt_hf_load_weights(comm, &cfg->model, t, n, err)
                             : mt_ckpt_load_found(comm, step_dir, t, n, NULL); /* (verified
                                                   * when its config was read) */
    free(t);
    if (s == MT_OK && a->checkpoint)
        fprintf(err, PROG ": loaded %s\n", step_dir);
    return s;
}

static mt_status_t read_file(const char *path, mt_text_t *txt)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        MT_FAIL(MT_ERR_IO, "--prompt-file %s: %s", path, strerror(errno));
    char buf[65536];
    size_t n;
    mt_status_t s = MT_OK;
    while (s == MT_OK && (n = fread(buf, 1, sizeof buf, f)) > 0)
        s = mt_text_append(txt, buf, n);
    bool bad = ferror(f);
    fclose(f);
    MT_TRY(s);
    if (bad)
        MT_FAIL(MT_ERR_IO, "--prompt-file %s: read error", path);
    return MT_OK;
}

/* The tokenizer, when text goes in or comes out: --tokenizer, else the
 * model directory's tokenizer.json, else the byte one for its vocabulary. */
static mt_status_t pick_tokenizer(const gen_args_t *a, const char *model_dir, int64_t vocab,
                                  mt_tokenizer_t **tok)
{
    *tok = NULL;
    bool needed = !a->prompt_ids || !a->print_ids;
    if (!a->tokenizer && !needed)
        return MT_OK;
    if (a->tokenizer)
        return mt_tokenizer_load(a->tokenizer, tok);
    char p[MT_PATH_MAX + 600];
    snprintf(p, sizeof p, "%s/tokenizer.json", model_dir);
    if (model_dir[0] && is_file(p))
        return mt_tokenizer_load(p, tok);
    if (vocab == 258)
        return mt_tokenizer_load("byte", tok);
    mt_status_t s = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "no tokenizer: %s has no "
                                 "tokenizer.json and its vocabulary (%lld) is not the byte "
                                 "tokenizer's (258)", model_dir[0] ? model_dir : "the model",
                                 (long long)vocab);
    mt_error_hint("pass --tokenizer byte or --tokenizer FILE, or give --prompt-ids with "
                  "--print-ids to work in ids alone");
    return s;
}

static mt_status_t prompt_ids(const gen_args_t *a, const mt_tokenizer_t *tok, mt_ids_t *ids)
{
    if (a->prompt_ids)
        return parse_ids(a->prompt_ids, ids);
    mt_text_t txt = {0};
    mt_status_t s = a->prompt ? mt_text_append(&txt, a->prompt, strlen(a->prompt))
                              : read_file(a->prompt_file, &txt);
    if (s == MT_OK)
        s = mt_tokenizer_encode(tok, txt.s ? txt.s : "", txt.n, true, ids);
    mt_text_free(&txt);
    MT_TRY(s);
    if (ids->n == 0) { /* nothing to condition on: the BOS token, if there is one */
        int32_t bos = mt_tokenizer_bos_id(tok);
        if (bos < 0)
            MT_FAIL(MT_ERR_CONFIG, "the prompt is empty and the tokenizer has no BOS token");
        MT_TRY(mt_ids_push(ids, bos));
    }
    return MT_OK;
}

typedef struct {
    mt_config_t cfg;
    mt_model_t m;
    mt_decode_t d;
    mt_tokenizer_t *tok;
    mt_ids_t prompt, gen;
    float *logits;
    void *scratch;
} gen_state_t;

static void gen_free(gen_state_t *g)
{
    mt_decode_free(&g->d);
    mt_model_free(&g->m);
    mt_tokenizer_free(g->tok);
    mt_ids_free(&g->prompt);
    mt_ids_free(&g->gen);
    free(g->logits);
    free(g->scratch);
}

static mt_status_t generate(MPI_Comm comm, const gen_args_t *a, gen_state_t *g, FILE *out,
                            FILE *err)
{
    char step_dir[MT_PATH_MAX + 64], model_dir[MT_PATH_MAX + 512];
    MT_TRY(source_config(a, &g->cfg, step_dir, sizeof step_dir, model_dir, sizeof model_dir,
                         err));
    const mt_model_config_t *mc = &g->cfg.model;
    MT_TRY(pick_tokenizer(a, model_dir, mc->vocab_size, &g->tok));
    MT_TRY(prompt_ids(a, g->tok, &g->prompt));
    const int64_t V = mc->vocab_size;
    for (size_t i = 0; i < g->prompt.n; i++)
        if (g->prompt.v[i] >= V)
            MT_FAIL(MT_ERR_CONFIG, "prompt token %zu is id %d, outside the model's vocabulary "
                    "[0, %lld)", i, g->prompt.v[i], (long long)V);
    for (int i = 0; i < a->nstops; i++)
        if (a->stops[i] >= V)
            MT_FAIL(MT_ERR_CONFIG, "--stop-id %d is outside the model's vocabulary [0, %lld)",
                    a->stops[i], (long long)V);
    const int64_t len = (int64_t)g->prompt.n + a->max_new;
    if (len > mc->max_position_embeddings)
        fprintf(err, PROG ": warning: %lld positions, beyond model.max_position_embeddings "
                "%lld\n", (long long)len, (long long)mc->max_position_embeddings);

    /* one token at a time: a MoE layer routes the model's micro-batch,
     * through the activations of its MoE code */
    MT_TRY(mt_model_init_ex(&g->m, &g->cfg, mt_backend_cpu(), 1, 1,
                            MT_MODEL_NO_GRAD_ARENA |
                                (mc->num_experts > 0 ? 0u : MT_MODEL_NO_ACT_ARENA), -1));
    MT_TRY(load_weights(comm, a, &g->cfg, &g->m, step_dir, err));
    MT_TRY(mt_decode_init(&g->d, &g->m, len));
    /* sample only ids the tokenizer can write (a model's vocabulary may be padded) */
    int64_t Vs = g->m.V_valid;
    if (g->tok && mt_tokenizer_vocab_size(g->tok) < Vs)
        Vs = mt_tokenizer_vocab_size(g->tok);
    g->logits = malloc(sizeof(float) * (size_t)g->m.V_valid);
    g->scratch = malloc(mt_sample_scratch_bytes(Vs));
    if (!g->logits || !g->scratch)
        MT_FAIL(MT_ERR_NOMEM, "logits");
    const int32_t eos = g->tok ? mt_tokenizer_eos_id(g->tok) : -1;
    MT_TRY(mt_decode_forward(&g->d, g->prompt.v, (int64_t)g->prompt.n, g->logits, false));
    for (int64_t i = 0; i < a->max_new; i++) {
        int32_t t = mt_sample(g->logits, Vs, &a->so, (uint64_t)i, g->scratch);
        MT_TRY(mt_ids_push(&g->gen, t));
        bool stop = t == eos;
        for (int k = 0; k < a->nstops; k++)
            stop = stop || t == a->stops[k];
        if (stop || i + 1 == a->max_new)
            break;
        MT_TRY(mt_decode_forward(&g->d, &t, 1, g->logits, false));
    }
    if (a->print_ids) {
        for (size_t i = 0; i < g->gen.n; i++)
            fprintf(out, "%s%d", i ? "," : "", g->gen.v[i]);
        fprintf(out, "\n");
        return MT_OK;
    }
    mt_text_t txt = {0};
    mt_status_t s = mt_tokenizer_decode(g->tok, g->gen.v, g->gen.n, true, &txt);
    if (s == MT_OK)
        fprintf(out, "%s\n", txt.s ? txt.s : "");
    mt_text_free(&txt);
    return s;
}

int mt_generate_main(MPI_Comm comm, int argc, char **argv, FILE *out, FILE *err)
{
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    gen_args_t a;
    mt_status_t s = parse_args(argc, argv, &a);
    if (s == MT_OK && a.help) {
        if (rank == 0)
            usage(out);
        return 0;
    }
    if (s != MT_OK) {
        if (rank == 0) {
            mt_report_error(err, PROG, rank, s);
            fprintf(err, "(see " PROG " --help)\n");
        }
        return 2;
    }
    if (size > 1) { /* every rank knows: no collective needed */
        if (rank == 0)
            fprintf(err, PROG ": runs on one rank, launched on %d: run it without mpiexec, "
                    "or with -n 1\n", size);
        return 2;
    }
    gen_state_t g;
    memset(&g, 0, sizeof g);
    s = generate(comm, &a, &g, out, err);
    if (s != MT_OK)
        mt_report_error(err, PROG, rank, s);
    gen_free(&g);
    fflush(out);
    return s == MT_OK ? 0 : 1;
}

int mt_generate_tool_main(int argc, char **argv)
{
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        fprintf(stderr, PROG ": MPI_Init failed\n");
        return 1;
    }
    int rc = mt_generate_main(MPI_COMM_WORLD, argc, argv, stdout, stderr);
    MPI_Finalize();
    return rc;
}
