/* test_config_bcast: rank 0 parses and validates, every rank gets the
 * result.  A valid config arrives identical on all ranks; an invalid one
 * (bad file, unknown key, rule violated on this world size, missing file)
 * fails on every rank with rank 0's message, and nobody hangs.  Only rank 0
 * can read the config file here, which proves the others never parse it. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mt_app.h"
#include "mt_test.h"

static char path[256];

static void write_config(MPI_Comm comm, const char *text)
{
    int rank;
    MPI_Comm_rank(comm, &rank);
    if (rank == 0) {
        FILE *f = fopen(path, "w");
        fputs(text, f);
        fclose(f);
    }
    MPI_Barrier(comm);
}

static mt_status_t load(MPI_Comm comm, mt_config_t *cfg, const char *ov)
{
    mt_app_args_t args;
    memset(&args, 0, sizeof args);
    args.config_path = path;
    if (ov)
        args.overrides[args.noverrides++] = ov;
    memset(cfg, 0xA5, sizeof *cfg); /* garbage: everything must be received */
    return mt_config_load_bcast(comm, &args, MT_APP_DENSE, cfg, NULL);
}

/* Every rank failed with the same status and a message containing needle. */
static void expect_fail_everywhere(MPI_Comm comm, mt_status_t s, const char *needle)
{
    int mine = (int)s, lo, hi;
    MPI_Allreduce(&mine, &lo, 1, MPI_INT, MPI_MIN, comm);
    MPI_Allreduce(&mine, &hi, 1, MPI_INT, MPI_MAX, comm);
    CHECK(lo == hi && lo == MT_ERR_CONFIG, "status differs or not a config error: %d..%d", lo, hi);
    CHECK_CONTAINS(mt_error_message(), needle);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    snprintf(path, sizeof path, "%s/mt-bcast-%d.yaml", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, comm);
    mt_config_t *cfg = malloc(sizeof *cfg);

    /* valid: identical everywhere */
    write_config(comm, "model:\n  hidden_size: 64\n  num_attention_heads: 4\n"
                       "  num_key_value_heads: 2\n  intermediate_size: 128\n"
                       "  num_hidden_layers: 2\n  vocab_size: 256\n"
                       "step_scheduler:\n  global_batch_size: 32\n  local_batch_size: 2\n"
                       "distributed:\n  tp_size: 2\n");
    mt_status_t s = load(comm, cfg, "optimizer.lr=0.01");
    CHECK(mt_agree(comm, s) == MT_OK, "valid config failed: %s", mt_error_message());
    if (s == MT_OK) {
        CHECK(cfg->validated && cfg->distributed.tp_size == 2 && cfg->optimizer.lr == 0.01,
              "received values");
        CHECK(cfg->derived.world_size == size && cfg->derived.dp_size == size / 2,
              "derived dp %lld", (long long)cfg->derived.dp_size);
        /* Byte-identical to rank 0's copy. */
        mt_config_t *root = malloc(sizeof *root);
        memcpy(root, cfg, sizeof *root);
        MPI_Bcast(root, (int)sizeof *root, MPI_BYTE, 0, comm);
        CHECK(memcmp(root, cfg, sizeof *cfg) == 0, "rank %d config differs from rank 0's", rank);
        free(root);
    }

    /* rule violated for this world: tp 3 does not divide it */
    s = load(comm, cfg, "distributed.tp_size=3");
    expect_fail_everywhere(comm, s, "world size");
    expect_fail_everywhere(comm, s, "override 'distributed.tp_size=3'");

    /* unknown key with suggestion */
    write_config(comm, "distributed:\n  tp_sise: 2\n");
    s = load(comm, cfg, NULL);
    expect_fail_everywhere(comm, s, "did you mean tp_size?");

    /* malformed YAML */
    write_config(comm, "distributed: [\n");
    s = load(comm, cfg, NULL);
    expect_fail_everywhere(comm, s, "malformed YAML");

    /* missing file */
    if (rank == 0)
        unlink(path);
    MPI_Barrier(comm);
    s = load(comm, cfg, NULL);
    expect_fail_everywhere(comm, s, "cannot open the config file");

    /* mt_agree: one failing rank makes everyone fail */
    mt_status_t local = rank == size - 1 ? MT_ERR_IO : MT_OK;
    CHECK(mt_agree(comm, local) == MT_ERR_IO, "agree on a failure of the last rank");
    CHECK(mt_agree(comm, MT_OK) == MT_OK, "agree on success");

    free(cfg);
    int rc = mt_test_exit_mpi("test_config_bcast", comm);
    MPI_Comm_free(&comm);
    MPI_Finalize();
    return rc;
}
