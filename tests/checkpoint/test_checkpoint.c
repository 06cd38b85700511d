/* test_checkpoint: HDF5 checkpoints at any rank count (run at 1 and 4).
 *
 * Saves three tensors with rows split unevenly (the last rank holds none),
 * reloads them with other splits and compares every value exactly; checks
 * the file with plain serial HDF5, `latest`, the manifest, pruning, resume
 * discovery, and that every kind of damage (missing manifest, flipped
 * byte, truncation, leftover .tmp, foreign format, newer version, wrong
 * shape, bad arguments) is refused on every rank with the same message.
 * SHA-256 is checked against the FIPS 180-4 vectors on rank 0
 * (test_checkpoint_sha256.c).
 *
 * Tensors held as blocks of rows x columns are test_checkpoint_blocks.c.
 *
 * `test_checkpoint save=DIR` only writes step 7 into DIR, and
 * `test_checkpoint save-blocks=DIR` only writes step 1 of the block
 * tensors (for tests/checkpoint/checkpoint_h5dump.sh); each then exits. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mt_checkpoint.h"
#include "mt_test.h"
#include "test_checkpoint.h"

static MPI_Comm comm;
static int rank, nranks;
static char root[512], ckdir[600];

#define NT 3
static const char *const names[NT] = {
    "/model/model.embed_tokens.weight",
    "/model/model.norm.weight",
    "/optim/model.layers.0.self_attn.q_proj.weight/exp_avg",
};
static const int ndims[NT] = {2, 1, 3};
static const int64_t shapes[NT][4] = {{10, 6}, {7}, {3, 4, 5}};

static const char *const config_yaml =
    "model:\n  hidden_size: 64\n  name: \"tiny \\\"quoted\\\"\"\n"
    "step_scheduler:\n  global_batch_size: 32\n";

typedef enum { SPLIT_UNEVEN, SPLIT_REVERSED, SPLIT_ALL } split_t;

/* ------------------------------------------------------------ helpers */

static float value(int t, int64_t idx, int64_t step)
{
    return (float)(t * 1000 + idx) * 0.5f - 100.25f + (float)step; /* exact in float */
}

static int64_t row_size(int t)
{
    int64_t n = 1;
    for (int d = 1; d < ndims[t]; d++)
        n *= shapes[t][d];
    return n;
}

/* Uneven: ranks 0..P-2 share the rows, rank 0 takes the remainder, the
 * last rank has none.  Reversed: rank q gets what rank P-1-q had. */
static int64_t uneven_count(int64_t rows, int q)
{
    if (nranks == 1)
        return rows;
    if (q == nranks - 1)
        return 0;
    int64_t base = rows / (nranks - 1), rem = rows % (nranks - 1);
    return q == 0 ? base + rem : base;
}

static void rows_of(int64_t rows, split_t mode, int r, int64_t *off, int64_t *cnt)
{
    if (mode == SPLIT_ALL) {
        *off = 0;
        *cnt = rows;
        return;
    }
    *off = 0;
    for (int q = 0; q <= r; q++) {
        int64_t c = uneven_count(rows, mode == SPLIT_REVERSED ? nranks - 1 - q : q);
        if (q < r)
            *off += c;
        else
            *cnt = c;
    }
}

static void make_tensors(mt_ckpt_tensor_t *t, split_t mode, int64_t step, int fill)
{
    memset(t, 0, sizeof *t * NT);
    for (int i = 0; i < NT; i++) {
        snprintf(t[i].path, sizeof t[i].path, "%s", names[i]);
        t[i].ndim = ndims[i];
        memcpy(t[i].shape, shapes[i], sizeof t[i].shape);
        rows_of(shapes[i][0], mode, rank, &t[i].row_offset, &t[i].row_count);
        int64_t n = t[i].row_count * row_size(i);
        t[i].data = malloc(sizeof(float) * (size_t)(n ? n : 1));
        for (int64_t k = 0; k < n; k++)
            t[i].data[k] = fill ? value(i, t[i].row_offset * row_size(i) + k, step) : -12345.0f;
    }
}

static void free_tensors(mt_ckpt_tensor_t *t)
{
    for (int i = 0; i < NT; i++)
        free(t[i].data);
}

static int64_t mismatches(const mt_ckpt_tensor_t *t, int64_t step)
{
    int64_t bad = 0;
    for (int i = 0; i < NT; i++)
        for (int64_t k = 0; k < t[i].row_count * row_size(i); k++)
            bad += t[i].data[k] != value(i, t[i].row_offset * row_size(i) + k, step);
    return bad;
}

static mt_train_state_t state_for(int64_t step)
{
    mt_train_state_t s = {step, step * 32, step / 3, 1234, step * 7};
    return s;
}

static mt_status_t save_split(int64_t step, int64_t keep, const char *config, split_t mode)
{
    mt_ckpt_tensor_t t[NT];
    make_tensors(t, mode, step, 1);
    mt_train_state_t st = state_for(step);
    char mesh[64];
    snprintf(mesh, sizeof mesh, "dp_shard=%d (world %d)", nranks, nranks);
    mt_status_t s = mt_ckpt_save(comm, ckdir, t, NT, &st, config, mesh, keep);
    free_tensors(t);
    return s;
}

static mt_status_t save_step(int64_t step, int64_t keep, const char *config)
{
    return save_split(step, keep, config, SPLIT_UNEVEN);
}

/* Every rank failed with `want` and a message containing needle. */
static void expect_fail_all(mt_status_t s, mt_status_t want, const char *needle)
{
    int mine = (int)s, lo, hi;
    MPI_Allreduce(&mine, &lo, 1, MPI_INT, MPI_MIN, comm);
    MPI_Allreduce(&mine, &hi, 1, MPI_INT, MPI_MAX, comm);
    CHECK(lo == hi && lo == (int)want, "rank %d: statuses %d..%d, expected %d everywhere (%s)",
          rank, lo, hi, (int)want, mt_error_message());
    CHECK_CONTAINS(mt_error_message(), needle);
}

static void expect_ok_all(mt_status_t s, const char *what)
{
    int mine = (int)s, hi;
    MPI_Allreduce(&mine, &hi, 1, MPI_INT, MPI_MAX, comm);
    CHECK(hi == MT_OK, "%s failed (rank %d: %s)", what, rank, mt_error_message());
}

static const char *step_dir(int64_t step)
{
    static char buf[4][700];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/step_%08lld", ckdir, (long long)step);
    return p;
}

static char *slurp(const char *path)
{
    static char buf[1 << 17];
    buf[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f)
        return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot write %s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static int remove_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(p);
}

static void rm_rf(const char *path) { nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS); }

/* Sorted names in ckdir, space-separated. */
static const char *listing(void)
{
    static char out[2048];
    char names_found[32][256];
    int n = 0;
    out[0] = '\0';
    DIR *d = opendir(ckdir);
    if (!d)
        return out;
    struct dirent *e;
    while ((e = readdir(d)) && n < 32)
        if (e->d_name[0] != '.')
            snprintf(names_found[n++], 256, "%s", e->d_name);
    closedir(d);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(names_found[j], names_found[i]) < 0) {
                char tmp[256];
                memcpy(tmp, names_found[i], 256);
                memcpy(names_found[i], names_found[j], 256);
                memcpy(names_found[j], tmp, 256);
            }
    for (int i = 0; i < n; i++)
        snprintf(out + strlen(out), sizeof out - strlen(out), "%s%s", i ? " " : "", names_found[i]);
    return out;
}

/* find_latest on rank 0: the directory found (or "") and the warnings. */
static void find_latest(char *found_dir, size_t cap, char **warnings)
{
    static char *buf;
    size_t len;
    free(buf);
    buf = NULL;
    FILE *w = open_memstream(&buf, &len);
    int found = -1;
    mt_status_t s = mt_ckpt_find_latest(ckdir, found_dir, cap, &found, w);
    fclose(w);
    CHECK(s == MT_OK, "find_latest: %s", mt_error_message());
    CHECK(found == (found_dir[0] != '\0'), "found flag %d with \"%s\"", found, found_dir);
    *warnings = buf;
}

static void rewrite_manifest(int64_t step)
{
    char file[800], man[800], hex[65], line[128];
    snprintf(file, sizeof file, "%s/model.h5", step_dir(step));
    snprintf(man, sizeof man, "%s/manifest.sha256", step_dir(step));
    CHECK(mt_sha256_file(file, hex) == MT_OK, "hash %s", file);
    snprintf(line, sizeof line, "%s  model.h5\n", hex);
    put(man, line);
}

/* ------------------------------------------------------------ serial HDF5 view */

/* Names of the links in group `path`, comma-separated, in name order. */
static void members_of(hid_t f, const char *path, char *out, size_t cap)
{
    H5G_info_t info;
    out[0] = '\0';
    if (H5Gget_info_by_name(f, path, &info, H5P_DEFAULT) < 0)
        return;
    for (hsize_t i = 0; i < info.nlinks; i++) {
        char name[256] = "";
        H5Lget_name_by_idx(f, path, H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT);
        snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? "," : "", name);
    }
}

static void check_with_serial_hdf5(int64_t step)
{
    char file[800];
    snprintf(file, sizeof file, "%s/model.h5", step_dir(step));
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    CHECK(f >= 0, "serial H5Fopen %s", file);
    if (f < 0)
        return;
    char members[512];
    members_of(f, "/", members, sizeof members);
    CHECK(strcmp(members, "meta,model,optim,train") == 0, "/ holds %s", members);
    members_of(f, "/model", members, sizeof members);
    CHECK(strcmp(members, "model.embed_tokens.weight,model.norm.weight") == 0, "/model holds %s",
          members);
    members_of(f, "/optim", members, sizeof members);
    CHECK(strcmp(members, "model.layers.0.self_attn.q_proj.weight,step") == 0, "/optim holds %s",
          members);
    members_of(f, "/optim/model.layers.0.self_attn.q_proj.weight", members, sizeof members);
    CHECK(strcmp(members, "exp_avg") == 0, "/optim/...q_proj.weight holds %s", members);

    /* /model/model.embed_tokens.weight: float32 [10, 6] with every value */
    hid_t d = H5Dopen2(f, names[0], H5P_DEFAULT);
    hid_t type = H5Dget_type(d), space = H5Dget_space(d);
    hsize_t dims[4] = {0};
    int nd = H5Sget_simple_extent_dims(space, dims, NULL);
    CHECK(H5Tequal(type, H5T_IEEE_F32LE) > 0, "dtype is not float32 little-endian");
    CHECK(nd == 2 && dims[0] == 10 && dims[1] == 6, "shape %d [%llu, %llu]", nd,
          (unsigned long long)dims[0], (unsigned long long)dims[1]);
    float all[60];
    int bad = H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, all) < 0;
    for (int k = 0; k < 60; k++)
        bad += all[k] != value(0, k, step);
    CHECK(bad == 0, "serial read of %s: %d differences", names[0], bad);
    H5Sclose(space);
    H5Tclose(type);
    H5Dclose(d);

    const char *scalars[] = {"/train/step", "/train/consumed_samples", "/train/data_epoch",
                             "/train/rng_seed", "/train/rng_offset", "/optim/step"};
    mt_train_state_t st = state_for(step);
    int64_t want[] = {st.step, st.consumed_samples, st.data_epoch, st.rng_seed, st.rng_offset,
                      st.step};
    for (int i = 0; i < 6; i++) {
        int64_t v = -1;
        d = H5Dopen2(f, scalars[i], H5P_DEFAULT);
        H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v);
        H5Dclose(d);
        CHECK(v == want[i], "%s = %lld, expected %lld", scalars[i], (long long)v,
              (long long)want[i]);
    }

    char text[256] = "";
    hid_t a = H5Aopen_by_name(f, "/meta", "format", H5P_DEFAULT, H5P_DEFAULT);
    hid_t at = H5Aget_type(a);
    CHECK(H5Tget_size(at) < sizeof text, "format size");
    H5Aread(a, at, text);
    H5Tclose(at);
    H5Aclose(a);
    CHECK(strcmp(text, MT_CKPT_FORMAT) == 0, "format \"%s\"", text);
    int64_t version = 0, world = 0;
    a = H5Aopen_by_name(f, "/meta", "version", H5P_DEFAULT, H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_INT64, &version);
    H5Aclose(a);
    a = H5Aopen_by_name(f, "/meta", "world_size", H5P_DEFAULT, H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_INT64, &world);
    H5Aclose(a);
    CHECK(version == MT_CKPT_VERSION && world == nranks, "version %lld world_size %lld",
          (long long)version, (long long)world);
    CHECK(H5Aexists_by_name(f, "/meta", "mesh", H5P_DEFAULT) > 0 &&
              H5Aexists_by_name(f, "/meta", "config", H5P_DEFAULT) > 0,
          "/meta mesh and config attributes");
    H5Fclose(f);
}

/* ------------------------------------------------------------ the tests */

static void test_roundtrip(void)
{
    expect_ok_all(save_step(1, 2, config_yaml), "save step 1");
    if (rank == 0) {
        char path[800], hex[65], want[128];
        snprintf(path, sizeof path, "%s/latest", ckdir);
        CHECK(strcmp(slurp(path), "step_00000001\n") == 0, "latest holds \"%s\"", slurp(path));
        snprintf(path, sizeof path, "%s/model.h5", step_dir(1));
        CHECK(mt_sha256_file(path, hex) == MT_OK, "hash model.h5");
        snprintf(want, sizeof want, "%s  model.h5\n", hex);
        snprintf(path, sizeof path, "%s/manifest.sha256", step_dir(1));
        CHECK(strcmp(slurp(path), want) == 0, "manifest \"%s\", expected \"%s\"", slurp(path),
              want);
        CHECK(strcmp(listing(), "latest step_00000001") == 0, "after save: %s", listing());
        CHECK(mt_ckpt_verify(step_dir(1)) == MT_OK, "verify: %s", mt_error_message());
        char *yaml = NULL;
        CHECK(mt_ckpt_read_config(step_dir(1), &yaml) == MT_OK && yaml &&
                  strcmp(yaml, config_yaml) == 0,
              "config read back: %s", yaml ? yaml : mt_error_message());
        free(yaml);
        check_with_serial_hdf5(1);
    }

    /* Read back with different splits than the writer's. */
    const split_t modes[] = {SPLIT_REVERSED, SPLIT_ALL, SPLIT_UNEVEN};
    for (int m = 0; m < 3; m++) {
        mt_ckpt_tensor_t t[NT];
        make_tensors(t, modes[m], 1, 0);
        mt_train_state_t st;
        memset(&st, 0xff, sizeof st);
        mt_status_t s = mt_ckpt_load(comm, step_dir(1), t, NT, m == 2 ? NULL : &st);
        expect_ok_all(s, "load step 1");
        int64_t bad = mismatches(t, 1);
        CHECK(bad == 0, "rank %d split %d: %lld values differ", rank, m, (long long)bad);
        if (m < 2) {
            mt_train_state_t want = state_for(1);
            CHECK(memcmp(&st, &want, sizeof st) == 0, "state step %lld consumed %lld",
                  (long long)st.step, (long long)st.consumed_samples);
        }
        free_tensors(t);
    }

    /* Every rank holding every tensor whole (data parallelism) is allowed:
     * rank 0 writes.  The same step again replaces the directory. */
    expect_ok_all(save_split(1, 2, config_yaml, SPLIT_ALL), "save step 1 replicated");
    if (rank == 0)
        CHECK(strcmp(listing(), "latest step_00000001") == 0, "after resave: %s", listing());
    mt_ckpt_tensor_t t[NT];
    make_tensors(t, SPLIT_REVERSED, 1, 0);
    expect_ok_all(mt_ckpt_load(comm, step_dir(1), t, NT, NULL), "load replicated save");
    CHECK(mismatches(t, 1) == 0, "rank %d: replicated save read back differs", rank);
    free_tensors(t);
}

static void test_prune_and_discovery(void)
{
    /* A config over 64 KiB must still fit (dense attribute storage). */
    size_t big_len = 100000;
    char *big = malloc(big_len + 1);
    snprintf(big, big_len + 1, "%s", config_yaml);
    for (size_t k = strlen(big); k < big_len; k++)
        big[k] = k % 80 == 79 ? '\n' : '#';
    big[big_len] = '\0';
    expect_ok_all(save_step(2, 2, big), "save step 2 with a 100 kB config");
    if (rank == 0) {
        char *yaml = NULL;
        CHECK(mt_ckpt_read_config(step_dir(2), &yaml) == MT_OK && yaml && strcmp(yaml, big) == 0,
              "long config read back (%zu bytes)", yaml ? strlen(yaml) : 0);
        free(yaml);
    }
    free(big);
    expect_ok_all(save_step(3, 2, config_yaml), "save step 3");
    expect_ok_all(save_step(4, 2, config_yaml), "save step 4");
    if (rank == 0) {
        CHECK(strcmp(listing(), "latest step_00000003 step_00000004") == 0, "keep 2: %s",
              listing());
        char path[700], found[800], *warn;
        snprintf(path, sizeof path, "%s/latest", ckdir);
        CHECK(strcmp(slurp(path), "step_00000004\n") == 0, "latest: %s", slurp(path));
        find_latest(found, sizeof found, &warn);
        CHECK(strcmp(found, step_dir(4)) == 0, "latest found: %s", found);
        CHECK(warn[0] == '\0', "no warnings expected: %s", warn);
    }
}

/* Rank 0 damages step 4 with `damage`; everyone checks that verify,
 * find_latest and load refuse it with `needle`, then step 4 is rewritten. */
static void damaged(const char *what, void (*damage)(const char *dir), const char *needle)
{
    if (rank == 0) {
        damage(step_dir(4));
        CHECK(mt_ckpt_verify(step_dir(4)) == MT_ERR_IO, "%s: verify accepted it", what);
        CHECK_CONTAINS(mt_error_message(), needle);
        char found[800], *warn;
        find_latest(found, sizeof found, &warn);
        CHECK(strcmp(found, step_dir(3)) == 0, "%s: find_latest gave \"%s\"", what, found);
        CHECK_CONTAINS(warn, "skipping checkpoint step_00000004");
        CHECK_CONTAINS(warn, needle);
    }
    MPI_Barrier(comm);
    mt_ckpt_tensor_t t[NT];
    make_tensors(t, SPLIT_REVERSED, 4, 0);
    expect_fail_all(mt_ckpt_load(comm, step_dir(4), t, NT, NULL), MT_ERR_IO, needle);
    free_tensors(t);
    /* Saving the same step again replaces the damaged directory. */
    expect_ok_all(save_step(4, 2, config_yaml), "resave step 4");
    if (rank == 0) {
        CHECK(mt_ckpt_verify(step_dir(4)) == MT_OK, "%s: resaved: %s", what, mt_error_message());
        CHECK(strcmp(listing(), "latest step_00000003 step_00000004") == 0, "%s: %s", what,
              listing());
    }
}

static void drop_manifest(const char *dir)
{
    char p[800];
    snprintf(p, sizeof p, "%s/manifest.sha256", dir);
    CHECK(remove(p) == 0, "remove %s", p);
}

static void flip_byte(const char *dir)
{
    char p[800];
    snprintf(p, sizeof p, "%s/model.h5", dir);
    FILE *f = fopen(p, "r+b");
    fseek(f, 0, SEEK_END);
    long mid = ftell(f) / 2;
    fseek(f, mid, SEEK_SET);
    int c = fgetc(f);
    fseek(f, mid, SEEK_SET);
    fputc(c ^ 0x01, f);
    fclose(f);
}

static void truncate_file(const char *dir)
{
    char p[800];
    struct stat st;
    snprintf(p, sizeof p, "%s/model.h5", dir);
    stat(p, &st);
    CHECK(truncate(p, st.st_size / 2) == 0, "truncate %s", p);
}

static void garbage_manifest(const char *dir)
{
    char p[800];
    snprintf(p, sizeof p, "%s/manifest.sha256", dir);
    put(p, "this is not a manifest\n");
}

static void manifest_names_missing_file(const char *dir)
{
    char p[800];
    snprintf(p, sizeof p, "%s/manifest.sha256", dir);
    put(p, "0000000000000000000000000000000000000000000000000000000000000000  gone.bin\n");
}

static void manifest_without_model(const char *dir)
{
    char p[800], hex[65], line[128];
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    put(p, "hello\n");
    mt_sha256_file(p, hex);
    snprintf(line, sizeof line, "%s  notes.txt\n", hex);
    snprintf(p, sizeof p, "%s/manifest.sha256", dir);
    put(p, line);
}

static void test_damage(void)
{
    damaged("no manifest", drop_manifest,
            "step_00000004: no manifest.sha256: the checkpoint is incomplete");
    damaged("flipped byte", flip_byte,
            "step_00000004/model.h5: SHA-256 mismatch: the file is corrupt or was modified");
    damaged("truncated", truncate_file,
            "step_00000004/model.h5: SHA-256 mismatch: the file is corrupt or was modified");
    damaged("garbage manifest", garbage_manifest,
            "manifest.sha256: line 1 is malformed: expected \"<64 hex digits>  <file name>\"");
    damaged("manifest names a missing file", manifest_names_missing_file,
            "step_00000004/gone.bin: listed in manifest.sha256 but missing");
    damaged("manifest without model.h5", manifest_without_model,
            "manifest.sha256: does not list model.h5: the checkpoint is incomplete");

    /* Leftover .tmp directories are never candidates; older ones are
     * removed by the next save, newer ones are left alone. */
    if (rank == 0) {
        char p[800];
        snprintf(p, sizeof p, "%s/step_00000009.tmp", ckdir);
        mkdir(p, 0777);
        snprintf(p, sizeof p, "%s/step_00000009.tmp/model.h5", ckdir);
        put(p, "half a file");
        snprintf(p, sizeof p, "%s/step_00000002.tmp", ckdir);
        mkdir(p, 0777);
        char found[800], *warn;
        find_latest(found, sizeof found, &warn);
        CHECK(strcmp(found, step_dir(4)) == 0, "with .tmp dirs: %s", found);
        CHECK(warn[0] == '\0', "a .tmp dir was considered: %s", warn);
        CHECK(mt_ckpt_verify(step_dir(9)) == MT_ERR_IO, "step 9 does not exist");
        CHECK_CONTAINS(mt_error_message(), "no such checkpoint directory");
        snprintf(p, sizeof p, "%s/step_00000009.tmp", ckdir);
        CHECK(mt_ckpt_verify(p) == MT_ERR_IO, "verify of a .tmp dir");
        CHECK_CONTAINS(mt_error_message(), "step_00000009.tmp: no manifest.sha256");
    }
    MPI_Barrier(comm);
    expect_ok_all(save_step(5, 2, config_yaml), "save step 5");
    if (rank == 0) {
        CHECK(strcmp(listing(), "latest step_00000004 step_00000005 step_00000009.tmp") == 0,
              "after step 5: %s", listing());
        char p[800];
        snprintf(p, sizeof p, "%s/step_00000009.tmp", ckdir);
        rm_rf(p);

        /* Nothing valid: found = 0, a warning for each. */
        drop_manifest(step_dir(4));
        flip_byte(step_dir(5));
        char found[800], *warn;
        find_latest(found, sizeof found, &warn);
        CHECK(found[0] == '\0', "all damaged, yet found %s", found);
        CHECK_CONTAINS(warn, "skipping checkpoint step_00000005");
        CHECK_CONTAINS(warn, "skipping checkpoint step_00000004");

        /* No directory at all is a fresh start, not an error. */
        char saved[600];
        snprintf(saved, sizeof saved, "%s", ckdir);
        snprintf(ckdir, sizeof ckdir, "%s/none", root);
        find_latest(found, sizeof found, &warn);
        CHECK(found[0] == '\0' && warn[0] == '\0', "missing dir: %s %s", found, warn);
        snprintf(ckdir, sizeof ckdir, "%s", saved);
    }
    MPI_Barrier(comm);
    expect_ok_all(save_step(5, 2, config_yaml), "resave step 5");
}

static void set_meta(const char *dir, const char *format, int version)
{
    char p[800];
    snprintf(p, sizeof p, "%s/model.h5", dir);
    hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    CHECK(f >= 0, "open %s for writing", p);
    hid_t g = H5Gopen2(f, "/meta", H5P_DEFAULT);
    H5Adelete(g, "format");
    H5Adelete(g, "version");
    hid_t type = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR);
    H5Tset_size(type, strlen(format) + 1);
    hid_t a = H5Acreate2(g, "format", type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, type, format);
    H5Aclose(a);
    a = H5Acreate2(g, "version", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT, &version);
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
    H5Gclose(g);
    H5Fclose(f);
}

static void test_refusals(void)
{
    mt_ckpt_tensor_t t[NT];

    /* A shape that differs from the file's, a tensor the file lacks. */
    make_tensors(t, SPLIT_ALL, 5, 0);
    t[0].shape[1] = 7;
    expect_fail_all(mt_ckpt_load(comm, step_dir(5), t, NT, NULL), MT_ERR_IO,
                    "/model/model.embed_tokens.weight has shape [10, 6] in the checkpoint, "
                    "expected [10, 7]");
    t[0].shape[1] = 6;
    t[1].ndim = 2;
    t[1].shape[1] = 1;
    expect_fail_all(mt_ckpt_load(comm, step_dir(5), t, NT, NULL), MT_ERR_IO,
                    "/model/model.norm.weight has shape [7] in the checkpoint, expected [7, 1]");
    t[1].ndim = 1;
    snprintf(t[2].path, sizeof t[2].path, "/optim/model.layers.9.mlp.up_proj.weight/exp_avg_sq");
    expect_fail_all(mt_ckpt_load(comm, step_dir(5), t, NT, NULL), MT_ERR_IO,
                    "no tensor /optim/model.layers.9.mlp.up_proj.weight/exp_avg_sq in the "
                    "checkpoint");
    free_tensors(t);
    make_tensors(t, SPLIT_ALL, 5, 0);
    expect_fail_all(mt_ckpt_load(comm, step_dir(77), t, NT, NULL), MT_ERR_IO,
                    "step_00000077: no such checkpoint directory");

    /* Another program's file and a newer format version, each with a
     * manifest that matches, so only the format check can refuse them. */
    if (rank == 0) {
        set_meta(step_dir(5), "other-format", 1);
        rewrite_manifest(5);
        char *yaml = NULL;
        CHECK(mt_ckpt_read_config(step_dir(5), &yaml) == MT_ERR_IO && !yaml,
              "read_config of a foreign file");
        CHECK_CONTAINS(mt_error_message(), "not a meshtrain checkpoint");
    }
    MPI_Barrier(comm);
    expect_fail_all(mt_ckpt_load(comm, step_dir(5), t, NT, NULL), MT_ERR_IO,
                    "model.h5: not a meshtrain checkpoint: /meta format is \"other-format\", "
                    "expected \"meshtrain-checkpoint\"");
    if (rank == 0) {
        set_meta(step_dir(5), MT_CKPT_FORMAT, 2);
        rewrite_manifest(5);
    }
    MPI_Barrier(comm);
    expect_fail_all(mt_ckpt_load(comm, step_dir(5), t, NT, NULL), MT_ERR_IO,
                    "checkpoint format version 2; this build of meshtrain reads version 1 only");
    if (rank == 0) {
        set_meta(step_dir(5), MT_CKPT_FORMAT, 1);
        rewrite_manifest(5);
    }
    MPI_Barrier(comm);
    expect_ok_all(mt_ckpt_load(comm, step_dir(5), t, NT, NULL), "load after restoring /meta");
    CHECK(mismatches(t, 5) == 0, "values after restoring /meta");
    free_tensors(t);

    /* Bad save arguments fail on every rank, and leave nothing behind. */
    mt_train_state_t st = state_for(6);
    make_tensors(t, SPLIT_UNEVEN, 6, 1);
    if (rank == 0)
        t[0].row_count--; /* row 9 (or the last of rank 0's) is nobody's */
    char gap[160];
    snprintf(gap, sizeof gap, "/model/model.embed_tokens.weight: row %lld is saved by no rank: "
             "every element must be saved by exactly one rank",
             (long long)uneven_count(10, 0) - 1);
    expect_fail_all(mt_ckpt_save(comm, ckdir, t, NT, &st, config_yaml, "", 2), MT_ERR_RANGE, gap);
    if (rank == 0)
        t[0].row_count++;
    if (rank == nranks - 1) {
        t[1].row_offset = 7;
        t[1].row_count = 1;
    }
    expect_fail_all(mt_ckpt_save(comm, ckdir, t, NT, &st, config_yaml, "", 2), MT_ERR_RANGE,
                    "/model/model.norm.weight: rows [7, 8) are outside dim 0 of size 7");
    if (rank == nranks - 1)
        rows_of(7, SPLIT_UNEVEN, rank, &t[1].row_offset, &t[1].row_count);
    if (nranks > 1) {
        expect_fail_all(mt_ckpt_save(comm, ckdir, t, rank == 1 ? NT - 1 : NT, &st, config_yaml,
                                     "", 2),
                        MT_ERR_RANGE, "rank 1 was called with a different directory, train state "
                                      "or tensor list than rank 0");
    }
    snprintf(t[1].path, sizeof t[1].path, "/train/step");
    expect_fail_all(mt_ckpt_save(comm, ckdir, t, NT, &st, config_yaml, "", 2), MT_ERR_RANGE,
                    "tensors live under /model/ or /optim/");
    snprintf(t[1].path, sizeof t[1].path, "%s", names[1]);

    /* A directory that cannot be created (a file is in the way). */
    char blocked[700];
    snprintf(blocked, sizeof blocked, "%s/afile/ckpt", root);
    if (rank == 0) {
        char p[700];
        snprintf(p, sizeof p, "%s/afile", root);
        put(p, "x");
    }
    MPI_Barrier(comm);
    expect_fail_all(mt_ckpt_save(comm, blocked, t, NT, &st, config_yaml, "", 2), MT_ERR_IO,
                    "ckpt: cannot create the checkpoint directory");
    free_tensors(t);
    if (rank == 0)
        CHECK(strcmp(listing(), "latest step_00000004 step_00000005") == 0,
              "failed saves left: %s", listing());
}

static int save_only(const char *dir)
{
    snprintf(ckdir, sizeof ckdir, "%s", dir);
    mt_status_t s = save_step(7, 0, config_yaml);
    if (s != MT_OK && rank == 0)
        fprintf(stderr, "test_checkpoint: %s\n", mt_error_message());
    expect_ok_all(s, "save step 7");
    return mt_test_exit_mpi("test_checkpoint save", comm);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &nranks);
    if (argc > 1 && strncmp(argv[1], "save=", 5) == 0) {
        int rc = save_only(argv[1] + 5);
        MPI_Comm_free(&comm);
        MPI_Finalize();
        return rc;
    }
    if (argc > 1 && strncmp(argv[1], "save-blocks=", 12) == 0) {
        mt_test_failures += save_blocks_only(comm, argv[1] + 12);
        int rc = mt_test_exit_mpi("test_checkpoint save-blocks", comm);
        MPI_Comm_free(&comm);
        MPI_Finalize();
        return rc;
    }

    if (rank == 0) {
        const char *tmp = getenv("TMPDIR");
        snprintf(root, sizeof root, "%s/mt-ckpt-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        if (!mkdtemp(root))
            root[0] = '\0';
    }
    MPI_Bcast(root, sizeof root, MPI_CHAR, 0, comm);
    if (!root[0]) {
        if (rank == 0)
            fprintf(stderr, "test_checkpoint: cannot make a temporary directory\n");
        MPI_Finalize();
        return 99;
    }
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", root);

    int checks, failures;
    if (rank == 0) {
        test_sha256(root, &checks, &failures);
        mt_test_checks += checks;
        mt_test_failures += failures;
    }
    test_roundtrip();
    test_prune_and_discovery();
    test_damage();
    test_refusals();
    test_blocks(comm, root, &checks, &failures);
    mt_test_checks += checks;
    mt_test_failures += failures;

    MPI_Barrier(comm);
    if (rank == 0)
        rm_rf(root);
    int rc = mt_test_exit_mpi("test_checkpoint", comm);
    MPI_Comm_free(&comm);
    MPI_Finalize();
    return rc;
}
