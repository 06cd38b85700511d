/* hf_cli.c: the command line of `meshtrain-ckpt export` and `import`
 * (mt_hf.h).  Export and import run as a single process or under mpiexec;
 * every rank parses the same arguments, and only rank 0 prints.  The
 * tool's dispatcher (app/ckpt_tool.c) starts MPI for these two commands
 * only. */
#include <config.h>

#include "ckpt_cli_internal.h"
#include "hf_internal.h"

#include <stdlib.h>
#include <string.h>

#define PROG "meshtrain-ckpt"

void mt_ckpt_hf_usage(FILE *o)
{
    fprintf(o,
            "       " PROG " export PATH -o HF_DIR [--max-shard-size SIZE] [--dtype float32|bfloat16]\n"
            "                 the /model tensors as a Hugging Face model: config.json and\n"
            "                 model.safetensors (shards and model.safetensors.index.json\n"
            "                 above SIZE, default 5GB); bfloat16 rounds to nearest even\n"
            "       " PROG " export PATH --adapter -o DIR [--dtype float32|bfloat16]\n"
            "                 a LoRA run's adapters (peft:) as a Hugging Face PEFT directory:\n"
            "                 adapter_config.json and adapter_model.safetensors\n"
            "       " PROG " export PATH --merge -o HF_DIR [--max-shard-size SIZE] [--dtype ...]\n"
            "                 a LoRA run merged into its base (read again by name):\n"
            "                 each adapted linear W + alpha/r B A\n"
            "       " PROG " import HF_DIR -o CHECKPOINT_DIR [--config CONFIG.yaml]\n"
            "                 a Hugging Face Llama or Qwen3 directory (config.json and\n"
            "                 safetensors in F32, BF16 or F16), or a hub id ORG/NAME in the\n"
            "                 local Hugging Face cache, as CHECKPOINT_DIR/step_00000000\n"
            "                 with zero optimizer state; CONFIG.yaml gives the other sections\n"
            "export and import also run under mpiexec -n N: each rank reads and writes its\n"
            "own rows of each tensor.\n");
}

static int usage_error(int rank, FILE *err, const char *fmt, const char *arg)
{
    if (rank == 0) {
        fprintf(err, PROG ": ");
        fprintf(err, fmt, arg);
        fprintf(err, "\nusage: " PROG " ...\n");
        mt_ckpt_hf_usage(err);
    }
    return 2;
}

int mt_ckpt_hf_main(MPI_Comm comm, int argc, char **argv, FILE *out, FILE *err)
{
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    const char *cmd = NULL, *src = NULL, *dst = NULL, *config = NULL, *shard = NULL;
    const char *dtype = NULL;
    int adapter = 0, merge = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            if (rank == 0) {
                fprintf(out, "usage:\n");
                mt_ckpt_hf_usage(out);
            }
            return 0;
        } else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
            if (!has_value)
                return usage_error(rank, err, "%s needs a directory", a);
            dst = argv[++i];
        } else if (strcmp(a, "--config") == 0 || strcmp(a, "--max-shard-size") == 0 ||
                   strcmp(a, "--dtype") == 0) {
            if (!has_value)
                return usage_error(rank, err, "%s needs a value", a);
            const char **slot = strcmp(a, "--config") == 0 ? &config
                                : strcmp(a, "--dtype") == 0 ? &dtype : &shard;
            *slot = argv[++i];
        } else if (strcmp(a, "--adapter") == 0) {
            adapter = 1;
        } else if (strcmp(a, "--merge") == 0) {
            merge = 1;
        } else if (a[0] == '-' && a[1]) {
            return usage_error(rank, err, "unknown option '%s'", a);
        } else if (!cmd) {
            cmd = a;
        } else if (!src) {
            src = a;
        } else {
            return usage_error(rank, err, "unexpected argument '%s'", a);
        }
    }
    int export = cmd && strcmp(cmd, "export") == 0;
    if (!cmd || (!export && strcmp(cmd, "import") != 0))
        return usage_error(rank, err, "unknown command '%s'", cmd ? cmd : "");
    if (!src)
        return usage_error(rank, err, "%s needs a source", export ? "export: PATH" : "import: HF_DIR");
    if (!dst)
        return usage_error(rank, err, "%s needs -o DIR", cmd);
    if (export && config)
        return usage_error(rank, err, "%s", "--config applies to import only");
    if (adapter && (!export || shard || merge))
        return usage_error(rank, err, "%s", "--adapter applies to export, without "
                           "--max-shard-size or --merge");
    if (merge && !export)
        return usage_error(rank, err, "%s", "--merge applies to export");
    if (!export && (shard || dtype))
        return usage_error(rank, err, "%s", "--max-shard-size and --dtype apply to export only");

    mt_status_t s = MT_OK;
    if (export) {
        mt_hf_export_opts_t o = {MT_HF_DEFAULT_SHARD_BYTES, 0};
        if (dtype && strcmp(dtype, "float32") != 0 && strcmp(dtype, "bfloat16") != 0)
            return usage_error(rank, err, "--dtype %s: expected float32 or bfloat16", dtype);
        o.bf16 = dtype && strcmp(dtype, "bfloat16") == 0;
        if (shard && mt_hf_parse_size(shard, &o.max_shard_bytes) != MT_OK)
            return usage_error(rank, err, "--max-shard-size: %s", mt_error_message());
        /* Rank 0 resolves PATH (and says which step it picked). */
        char step[MT_CKPT_PATH_CAP] = "";
        int rc = rank == 0 ? mt_ckpt_cli_resolve(src, step, err) : 0;
        MPI_Bcast(&rc, 1, MPI_INT, 0, comm);
        if (rc != 0)
            return rc;
        MPI_Bcast(step, sizeof step, MPI_CHAR, 0, comm);
        if (adapter)
            s = mt_hf_export_adapter(comm, step, dst, o.bf16, rank == 0 ? out : NULL);
        else if (merge)
            s = mt_hf_export_merged(comm, step, dst, &o, rank == 0 ? out : NULL);
        else
            s = mt_hf_export(comm, step, dst, &o, rank == 0 ? out : NULL);
    } else {
        s = mt_hf_import(comm, src, dst, config, rank == 0 ? out : NULL);
    }
    if (s != MT_OK) {
        if (rank == 0) {
            fprintf(err, PROG ": %s failed: %s\n", cmd, mt_error_message());
            if (mt_error_hint_text()[0])
                fprintf(err, PROG ": hint: %s\n", mt_error_hint_text());
        }
        return 1;
    }
    if (rank == 0 && (fflush(out) != 0 || ferror(out))) {
        fprintf(err, PROG ": cannot write the output\n");
        return 1;
    }
    return 0;
}
