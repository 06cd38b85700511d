/* data_cli.c: meshtrain-data's command line: options, the tokenizer (the
 * byte-level one, a tokenizer.json or its directory, or a model name
 * resolved as model loading resolves it), then the collective pipeline of
 * src/data (mt_data_build) or --inspect.
 *
 * The pipeline's errors are agreed on by all ranks; each rank prints the
 * agreed message and returns 1, so no rank waits for another. */
#include <config.h>

#include "mt_data_cli.h"

#include "mt_comm.h"
#include "mt_data.h"
#include "mt_data_write.h"
#include "mt_hf.h"
#include "mt_tokenizer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PROG "meshtrain-data"

typedef struct {
    mt_dw_opts_t o;
    const char *tokenizer, *output, *inspect, *format;
    long long vocab;
    int json, help, version;
    char keybuf[1024];
    size_t keyused;
} cli_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: meshtrain-data --output PATH [--tokenizer byte|PATH|NAME]\n"
            "                      [--format llmc|megatron] [--documents paragraphs|lines|file]\n"
            "                      [--json-keys KEY[,KEY...]] [--sft [--prompt-key K]\n"
            "                      [--completion-key K] [--messages-key K]\n"
            "                      [--chat-template auto|llama3|chatml]]\n"
            "                      [--invalid-utf8 error|replace] [--seq-length N]\n"
            "                      [--vocab-size N] [--split-validation FRACTION] [--quiet]\n"
            "                      INPUT...\n"
            "       meshtrain-data --inspect PATH [--vocab-size N]\n"
            "Tokenizes text into token datasets, as one process or under mpiexec (the output\n"
            "does not depend on the rank count). --tokenizer is \"byte\" (the default: ids\n"
            "0..255 are bytes, %d ends each document), a tokenizer.json or its directory, or\n"
            "a model name (a directory or a hub id in the local Hugging Face cache).\n"
            "Inputs: text files, split into documents (paragraphs, lines or whole files), or\n"
            "JSON Lines (*.jsonl, *.json, optionally zstd-compressed *.zst, or any input with\n"
            "--json-keys), one document per record and key (default key \"text\"). --sft reads\n"
            "fine-tuning records, {\"prompt\", \"completion\"} or {\"messages\": [...]}, and writes\n"
            "PATH.lossmask with the dataset. Output: a Megatron-LM dataset PATH.bin + PATH.idx\n"
            "(JSONL: PATH_KEY_document.bin/.idx per key), EOS after each document, uint16 ids\n"
            "when the vocabulary is below %d and int32 otherwise; or, for byte-level text, an\n"
            "llm.c token file PATH (the default there). --split-validation writes the last\n"
            "FRACTION of the documents with .val added to the names. --seq-length refuses a\n"
            "longer document; --invalid-utf8 replace substitutes U+FFFD (default: an error).\n"
            "--inspect prints a token file's format, counts, token range and first 64 tokens,\n"
            "checking every token against N if given. Exit status: 0 ok, 1 error, 2 usage.\n"
            "See doc/data.md.\n",
            MT_TOKEN_EOD, MT_DW_UINT16_VOCAB_LIMIT);
}

static int usage_error(FILE *err, const char *what, const char *arg)
{
    fprintf(err, PROG ": %s%s%s%s\n", what, arg ? " '" : "", arg ? arg : "", arg ? "'" : "");
    usage(err);
    return 2;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int is_jsonl_name(const char *p)
{
    return ends_with(p, ".jsonl") || ends_with(p, ".json") || ends_with(p, ".jsonl.zst") ||
           ends_with(p, ".json.zst");
}

static int parse_count(const char *v, long long *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < 1)
        return 0;
    *out = x;
    return 1;
}

/* Returns -1 to go on, else the exit code. */
static int parse(cli_t *c, int argc, char **argv, const char **inputs, FILE *out, FILE *err)
{
    mt_dw_opts_t *o = &c->o;
    o->docs = MT_DW_PARAGRAPHS;
    o->prompt_key = "prompt";
    o->completion_key = "completion";
    o->messages_key = "messages";
    o->progress = true;
    c->tokenizer = "byte";
    static const char *valued[] = {"--output", "--inspect", "--format", "--documents",
                                   "--split-validation", "--vocab-size", "--tokenizer",
                                   "--json-keys", "--json-key", "--prompt-key",
                                   "--completion-key", "--messages-key", "--chat-template",
                                   "--invalid-utf8", "--seq-length"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = 0;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            has_value |= !strcmp(a, valued[k]);
        if (has_value && i + 1 >= argc)
            return usage_error(err, "missing value after", a);
        const char *v = has_value ? argv[++i] : NULL;
        long long n;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(out);
            return 0;
        } else if (!strcmp(a, "--version")) {
            fprintf(out, PROG " (%s) %s\n", PACKAGE_NAME, PACKAGE_VERSION);
            return 0;
        } else if (!strcmp(a, "--output")) {
            c->output = v;
        } else if (!strcmp(a, "--inspect")) {
            c->inspect = v;
        } else if (!strcmp(a, "--tokenizer")) {
            c->tokenizer = v;
        } else if (!strcmp(a, "--format")) {
            if (strcmp(v, "llmc") && strcmp(v, "megatron"))
                return usage_error(err, "--format must be llmc or megatron, got", v);
            c->format = v;
        } else if (!strcmp(a, "--documents")) {
            if (!strcmp(v, "paragraphs"))
                o->docs = MT_DW_PARAGRAPHS;
            else if (!strcmp(v, "lines"))
                o->docs = MT_DW_LINES;
            else if (!strcmp(v, "file"))
                o->docs = MT_DW_FILE;
            else
                return usage_error(err, "--documents must be paragraphs, lines or file, got", v);
        } else if (!strcmp(a, "--split-validation")) {
            char *end;
            errno = 0;
            o->val_fraction = strtod(v, &end);
            if (errno || end == v || *end || !(o->val_fraction > 0 && o->val_fraction < 1))
                return usage_error(err, "--split-validation needs a fraction in (0, 1), got", v);
        } else if (!strcmp(a, "--vocab-size")) {
            if (!parse_count(v, &n))
                return usage_error(err, "--vocab-size needs a positive integer, got", v);
            c->vocab = n;
        } else if (!strcmp(a, "--seq-length")) {
            if (!parse_count(v, &n))
                return usage_error(err, "--seq-length needs a positive integer, got", v);
            o->seq_length = n;
        } else if (!strcmp(a, "--json-keys") || !strcmp(a, "--json-key")) {
            c->json = 1;
            if (c->keyused + strlen(v) + 1 > sizeof c->keybuf)
                return usage_error(err, "--json-keys: too many keys", NULL);
            char *buf = c->keybuf + c->keyused;
            strcpy(buf, v);
            c->keyused += strlen(v) + 1;
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                if (o->n_keys == MT_DW_MAX_KEYS)
                    return usage_error(err, "--json-keys: at most 16 keys, got", v);
                o->keys[o->n_keys++] = tok;
            }
            if (o->n_keys == 0)
                return usage_error(err, "--json-keys needs a key, got", v);
        } else if (!strcmp(a, "--sft")) {
            o->kind = MT_DW_SFT;
        } else if (!strcmp(a, "--prompt-key")) {
            o->prompt_key = v;
        } else if (!strcmp(a, "--completion-key")) {
            o->completion_key = v;
        } else if (!strcmp(a, "--messages-key")) {
            o->messages_key = v;
        } else if (!strcmp(a, "--chat-template")) {
            if (!strcmp(v, "auto"))
                o->chat = MT_CHAT_AUTO;
            else if (!strcmp(v, "llama3"))
                o->chat = MT_CHAT_LLAMA3;
            else if (!strcmp(v, "chatml"))
                o->chat = MT_CHAT_CHATML;
            else
                return usage_error(err, "--chat-template must be auto, llama3 or chatml (the "
                                   "templates meshtrain renders), got", v);
        } else if (!strcmp(a, "--invalid-utf8")) {
            if (strcmp(v, "error") && strcmp(v, "replace"))
                return usage_error(err, "--invalid-utf8 must be error or replace, got", v);
            o->utf8_replace = !strcmp(v, "replace");
        } else if (!strcmp(a, "--quiet")) {
            o->progress = false;
        } else if (a[0] == '-' && a[1]) {
            return usage_error(err, "unknown option", a);
        } else {
            inputs[o->n_inputs++] = a;
        }
    }
    if (c->inspect) {
        if (c->output || o->n_inputs)
            return usage_error(err, "--inspect takes one token file and no --output or inputs",
                               NULL);
        return -1;
    }
    if (!c->output || !o->n_inputs)
        return usage_error(err, !c->output ? "--output PATH is required" : "no input files",
                           NULL);
    if (o->kind == MT_DW_SFT && c->json)
        return usage_error(err, "--sft reads its own keys (--prompt-key, --completion-key, "
                           "--messages-key), not --json-keys", NULL);
    if (o->kind != MT_DW_SFT) {
        int nj = 0;
        for (int i = 0; i < o->n_inputs; i++)
            nj += is_jsonl_name(inputs[i]);
        if (nj && nj < o->n_inputs && !c->json)
            return usage_error(err, "the inputs mix JSON Lines and text files; pass "
                               "--json-keys to read all of them as JSON Lines", NULL);
        if (c->json || nj) {
            o->kind = MT_DW_JSONL;
            if (o->n_keys == 0)
                o->keys[o->n_keys++] = "text"; /* Megatron's default */
        }
    }
    if (o->kind != MT_DW_TEXT && c->format && !strcmp(c->format, "llmc"))
        return usage_error(err, "--format llmc takes text input only: JSON Lines and --sft "
                           "write Megatron datasets", NULL);
    return -1;
}

/* "byte", an existing path, or a model name (mt_hf_resolve_name). */
static mt_status_t load_tokenizer(const char *spec, mt_tokenizer_t **tok)
{
    struct stat st;
    if (strcmp(spec, "byte") == 0 || stat(spec, &st) == 0) {
        MT_TRY(mt_tokenizer_load(spec, tok));
        return MT_OK;
    }
    char dir[MT_PATH_MAX];
    MT_TRY(mt_hf_resolve_name(spec, NULL, "--tokenizer", dir, sizeof dir));
    MT_TRY(mt_tokenizer_load(dir, tok));
    return MT_OK;
}

static int report(FILE *err, int rank, int size, mt_status_t s)
{
    if (s == MT_OK)
        return 0;
    if (size > 1)
        fprintf(err, PROG ": rank %d: %s\n", rank, mt_error_message());
    else
        fprintf(err, PROG ": %s\n", mt_error_message());
    if (mt_error_hint_text()[0])
        fprintf(err, "hint: %s\n", mt_error_hint_text());
    fflush(err);
    return 1;
}

static int build(MPI_Comm comm, cli_t *c, FILE *out, FILE *err)
{
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    mt_dw_opts_t *o = &c->o;
    mt_tokenizer_t *tok = NULL;
    mt_status_t s = load_tokenizer(c->tokenizer, &tok);
    if (s != MT_OK) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", mt_error_message());
        mt_error_set(s, __FILE__, __LINE__, "--tokenizer %s: %s", c->tokenizer, msg);
    }
    int byte = s == MT_OK && strcmp(mt_tokenizer_kind(tok), "byte") == 0;
    if (s == MT_OK) {
        o->megatron = c->format ? !strcmp(c->format, "megatron") : !(byte && o->kind == MT_DW_TEXT);
        if (!o->megatron && !byte)
            s = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "--format llmc needs the byte "
                             "tokenizer: llm.c files have no document index, and readers split "
                             "them at token %d; use --format megatron", MT_TOKEN_EOD);
        else if (c->vocab && c->vocab < mt_tokenizer_vocab_size(tok))
            s = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "--vocab-size %lld is below the "
                             "tokenizer's vocabulary of %lld", c->vocab,
                             (long long)mt_tokenizer_vocab_size(tok));
        else if (!o->megatron && c->vocab > 65536)
            s = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "--vocab-size %lld: llm.c files "
                             "hold uint16 ids; use --format megatron", c->vocab);
    }
    o->vocab_size = c->vocab;
    /* Megatron output takes a prefix; accept PREFIX.bin or PREFIX.idx too. */
    char target[MT_PATH_MAX];
    size_t olen = strlen(c->output);
    if (s == MT_OK && olen >= MT_PATH_MAX - 64)
        s = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "%s: path too long", c->output);
    if (o->megatron && olen > 4 &&
        (ends_with(c->output, ".bin") || ends_with(c->output, ".idx")))
        olen -= 4;
    snprintf(target, sizeof target, "%.*s", (int)olen, c->output);
    o->output = target;
    s = mt_agree(comm, s);
    if (s == MT_OK)
        s = mt_data_build(comm, tok, o, out, err);
    mt_tokenizer_free(tok);
    return report(err, rank, size, s);
}

int mt_data_main(MPI_Comm comm, int argc, char **argv, FILE *out, FILE *err)
{
    cli_t *c = calloc(1, sizeof *c);
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    if (!c || !inputs) {
        free(c);
        free(inputs);
        fprintf(err, PROG ": out of memory\n");
        return 1;
    }
    c->o.inputs = inputs;
    int code = parse(c, argc, argv, inputs, out, err);
    if (code < 0 && c->inspect)
        code = mt_data_inspect(c->inspect, c->vocab ? c->vocab : INT64_MAX, out, err);
    else if (code < 0)
        code = build(comm, c, out, err);
    free(inputs);
    free(c);
    return code;
}

int mt_data_tool_main(int argc, char **argv)
{
    /* Parse first: help, usage errors and --inspect run without MPI. */
    cli_t *c = calloc(1, sizeof *c);
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    if (!c || !inputs) {
        free(c);
        free(inputs);
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    FILE *devnull = fopen("/dev/null", "w");
    int code = parse(c, argc, argv, inputs, devnull ? devnull : stdout, devnull ? devnull : stderr);
    int needs_mpi = code < 0 && !c->inspect;
    if (devnull)
        fclose(devnull);
    free(inputs);
    free(c);
    if (!needs_mpi)
        return mt_data_main(MPI_COMM_NULL, argc, argv, stdout, stderr);
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        fprintf(stderr, PROG ": MPI_Init failed\n");
        return 1;
    }
    code = mt_data_main(MPI_COMM_WORLD, argc, argv, stdout, stderr);
    MPI_Finalize();
    return code;
}
