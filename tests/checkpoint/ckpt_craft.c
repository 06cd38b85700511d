/* ckpt_craft: rewrites one object of a checkpoint's model.h5 in place the
 * way a hostile file would, for the tests of the checkpoint readers.
 *   ckpt_craft FILE attr-int-array OBJ NAME    an int64[4] attribute
 *   ckpt_craft FILE attr-str-array OBJ NAME    a fixed-length string[4]
 *   ckpt_craft FILE attr-vstr-array OBJ NAME   a variable-length string[4]
 *   ckpt_craft FILE dset-array PATH            an int64[8] dataset
 *   ckpt_craft FILE dset-value PATH VALUE      an int64 scalar dataset
 *   ckpt_craft FILE extlink PATH TARGET        an external link to TARGET:/x
 *   ckpt_craft FILE softlink PATH TARGET       a soft link to TARGET
 *   ckpt_craft FILE extstore PATH TARGET       a float32[n] dataset stored in TARGET
 * Exit 0 when written, 1 on an HDF5 error, 2 on usage. */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int drop(hid_t f, const char *path)
{
    htri_t ex = H5Lexists(f, path, H5P_DEFAULT);
    return ex > 0 ? H5Ldelete(f, path, H5P_DEFAULT) : ex;
}

static int attr_array(hid_t f, const char *obj, const char *name, const char *kind)
{
    hsize_t n = 4;
    hid_t o = H5Oopen(f, obj, H5P_DEFAULT), sp = H5Screate_simple(1, &n, NULL), ty, a;
    if (o < 0 || sp < 0)
        return -1;
    if (H5Aexists(o, name) > 0 && H5Adelete(o, name) < 0)
        return -1;
    herr_t rc;
    if (strcmp(kind, "attr-int-array") == 0) {
        long long v[4] = {1, 2, 3, 4};
        a = H5Acreate2(o, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
        rc = a < 0 ? -1 : H5Awrite(a, H5T_NATIVE_LLONG, v);
    } else if (strcmp(kind, "attr-str-array") == 0) {
        char v[4][64];
        for (int i = 0; i < 4; i++)
            snprintf(v[i], sizeof v[i], "meshtrain-checkpoint-element-%d", i);
        ty = H5Tcopy(H5T_C_S1);
        H5Tset_size(ty, 64);
        a = H5Acreate2(o, name, ty, sp, H5P_DEFAULT, H5P_DEFAULT);
        rc = a < 0 ? -1 : H5Awrite(a, ty, v);
        H5Tclose(ty);
    } else {
        const char *v[4] = {"a", "bb", "ccc", "dddd"};
        ty = H5Tcopy(H5T_C_S1);
        H5Tset_size(ty, H5T_VARIABLE);
        a = H5Acreate2(o, name, ty, sp, H5P_DEFAULT, H5P_DEFAULT);
        rc = a < 0 ? -1 : H5Awrite(a, ty, v);
        H5Tclose(ty);
    }
    if (a >= 0)
        H5Aclose(a);
    H5Sclose(sp);
    H5Oclose(o);
    return rc;
}

static int dset(hid_t f, const char *path, hsize_t n, const long long *v)
{
    if (drop(f, path) < 0)
        return -1;
    hid_t sp = n ? H5Screate_simple(1, &n, NULL) : H5Screate(H5S_SCALAR);
    hid_t d = H5Dcreate2(f, path, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    herr_t rc = d < 0 ? -1 : H5Dwrite(d, H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    if (d >= 0)
        H5Dclose(d);
    H5Sclose(sp);
    return rc;
}

/* The dataset at PATH, same shape, its bytes in TARGET instead. */
static int extstore(hid_t f, const char *path, const char *target)
{
    hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
    if (d < 0)
        return -1;
    hid_t sp = H5Dget_space(d), ty = H5Dget_type(d);
    H5Dclose(d);
    if (H5Ldelete(f, path, H5P_DEFAULT) < 0)
        return -1;
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(pl, target, 0, H5F_UNLIMITED);
    d = H5Dcreate2(f, path, ty, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    H5Pclose(pl);
    H5Tclose(ty);
    H5Sclose(sp);
    if (d < 0)
        return -1;
    H5Dclose(d);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: ckpt_craft FILE MODE ARGS...\n");
        return 2;
    }
    const char *mode = argv[2];
    hid_t f = H5Fopen(argv[1], H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0)
        return 1;
    int rc;
    if (strncmp(mode, "attr-", 5) == 0 && argc == 5) {
        rc = attr_array(f, argv[3], argv[4], mode);
    } else if (strcmp(mode, "dset-array") == 0) {
        long long v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        rc = dset(f, argv[3], 8, v);
    } else if (strcmp(mode, "dset-value") == 0 && argc == 5) {
        long long v = strtoll(argv[4], NULL, 0);
        rc = dset(f, argv[3], 0, &v);
    } else if (strcmp(mode, "extlink") == 0 && argc == 5) {
        rc = drop(f, argv[3]) < 0 ? -1
                                  : H5Lcreate_external(argv[4], "/x", f, argv[3], H5P_DEFAULT,
                                                       H5P_DEFAULT);
    } else if (strcmp(mode, "softlink") == 0 && argc == 5) {
        rc = drop(f, argv[3]) < 0 ? -1
                                  : H5Lcreate_soft(argv[4], f, argv[3], H5P_DEFAULT, H5P_DEFAULT);
    } else if (strcmp(mode, "extstore") == 0 && argc == 5) {
        rc = extstore(f, argv[3], argv[4]);
    } else {
        fprintf(stderr, "ckpt_craft: unknown mode or arguments: %s\n", mode);
        H5Fclose(f);
        return 2;
    }
    if (H5Fclose(f) < 0)
        rc = -1;
    return rc < 0 ? 1 : 0;
}
