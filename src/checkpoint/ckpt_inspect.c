/* ckpt_inspect.c: meshtrain-ckpt's view of a model.h5: /meta and a
 * description of every dataset (path, shape, dtype, size), read from the
 * file's own structure, so it describes any model and needs no tensor
 * list.  Reads metadata and integer scalars only, never tensor data.
 *
 * No MPI: the file is opened with HDF5's default (sec2) driver.  The serial
 * API of the parallel HDF5 build works without MPI_Init; H5Pset_fapl_mpio
 * does not, which is why this does not reuse checkpoint_io.c's collective
 * reader; the attribute readers and the format check are shared with it
 * (checkpoint_internal.h). */
#include "ckpt_cli_internal.h"

#include <ctype.h>
#include <errno.h>
#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ------------------------------------------------------------ HDF5 */

#define h5_fail mt_ckpt_h5_fail

static mt_status_t open_file(const char *file, hid_t *f)
{
    struct stat st;
    *f = -1;
    if (stat(file, &st) != 0)
        MT_FAIL(MT_ERR_IO, "%s: %s", file, strerror(errno));
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
#if H5_VERSION_GE(1, 10, 7) && !(H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 12 && H5_VERS_RELEASE == 0)
    if (fapl >= 0) /* read-only: do not fail on file systems without flock */
        H5Pset_file_locking(fapl, 0, 1);
#endif
    if (fapl >= 0)
        *f = H5Fopen(file, H5F_ACC_RDONLY, fapl);
    /* Take HDF5's reason before H5Pclose, which clears its error stack. */
    mt_status_t s = *f >= 0 ? MT_OK : h5_fail(__FILE__, __LINE__, "%s: cannot open as HDF5", file);
    if (fapl >= 0)
        H5Pclose(fapl);
    return s;
}

/* ------------------------------------------------------------ what a file holds */

void mt_ckpt_info_free(mt_ckpt_info_t *in)
{
    for (int i = 0; i < in->nds; i++)
        free(in->ds[i].path);
    free(in->ds);
    free(in->format);
    free(in->mesh);
    free(in->software);
    in->ds = NULL, in->nds = in->cap = 0;
    in->format = in->mesh = in->software = NULL;
}

/* /meta: format must be ours; version must be ours if `strict`. */
static mt_status_t read_meta(hid_t f, const char *fname, mt_ckpt_info_t *in, int strict)
{
    int has_version;
    MT_TRY(mt_ckpt_h5_check_format(fname, f, strict));
    MT_TRY(mt_ckpt_h5_attr_string(fname, f, "/meta", "format", &in->format));
    MT_TRY(mt_ckpt_h5_attr_int(fname, f, "/meta", "version", &in->version, &has_version));
    if (!has_version)
        MT_FAIL(MT_ERR_IO, "%s: /meta has no version attribute: the file is damaged", fname);
    MT_TRY(mt_ckpt_h5_attr_string(fname, f, "/meta", "mesh", &in->mesh));
    MT_TRY(mt_ckpt_h5_attr_string(fname, f, "/meta", "software", &in->software));
    MT_TRY(mt_ckpt_h5_attr_int(fname, f, "/meta", "world_size", &in->world_size, &in->has_world));
    return MT_OK;
}

static mt_status_t add_dataset(mt_ckpt_info_t *in, hid_t d, const char *name)
{
    if (in->nds == in->cap) {
        int cap = in->cap ? 2 * in->cap : 64;
        mt_ckpt_dataset_info_t *v = realloc(in->ds, sizeof *v * (size_t)cap);
        if (!v)
            MT_FAIL(MT_ERR_NOMEM, "listing %s: %d datasets", in->fname, cap);
        in->ds = v, in->cap = cap;
    }
    mt_ckpt_dataset_info_t *x = &in->ds[in->nds];
    memset(x, 0, sizeof *x);
    if (!(x->path = malloc(strlen(name) + 2)))
        MT_FAIL(MT_ERR_NOMEM, "listing %s", in->fname);
    sprintf(x->path, "/%s", name);
    in->nds++;
    hid_t sp = H5Dget_space(d), ty = H5Dget_type(d);
    H5T_class_t cls = ty >= 0 ? H5Tget_class(ty) : H5T_NO_CLASS;
    size_t size = ty >= 0 ? H5Tget_size(ty) : 0;
    hssize_t npts = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    hsize_t dims[H5S_MAX_RANK];
    x->ndim = sp >= 0 ? H5Sget_simple_extent_dims(sp, dims, NULL) : -1;
    for (int k = 0; k < x->ndim && k < MT_CKPT_INFO_MAX_RANK; k++)
        x->dims[k] = (int64_t)dims[k];
    int is_signed = cls == H5T_INTEGER && H5Tget_sign(ty) == H5T_SGN_2;
    if (ty >= 0)
        H5Tclose(ty);
    if (sp >= 0)
        H5Sclose(sp);
    if (x->ndim < 0 || npts < 0 || cls == H5T_NO_CLASS)
        H5_FAIL("%s: cannot read the shape or type of %s", in->fname, x->path);
    x->nelem = (int64_t)npts;
    x->bytes = x->nelem * (int64_t)size;
    if (cls == H5T_FLOAT || cls == H5T_INTEGER)
        snprintf(x->dtype, sizeof x->dtype, "%s%zu",
                 cls == H5T_FLOAT ? "float" : is_signed ? "int" : "uint", 8 * size);
    else
        snprintf(x->dtype, sizeof x->dtype, "%s", cls == H5T_STRING ? "string" : "other");
    if (x->ndim == 0 && cls == H5T_INTEGER &&
        H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &x->value) >= 0)
        x->has_value = 1;
    H5Eclear2(H5E_DEFAULT);
    return MT_OK;
}

typedef struct {
    mt_ckpt_info_t *in;
    mt_status_t s;
} visit_t;

/* H5Lvisit's callback: every link below /, names relative to it. */
static herr_t visit_link(hid_t g, const char *name, const H5L_info_t *li, void *data)
{
    visit_t *v = data;
    if (li->type != H5L_TYPE_HARD)
        return 0;
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    if (o < 0) {
        v->s = h5_fail(__FILE__, __LINE__, "%s: cannot open /%s", v->in->fname, name);
        return -1;
    }
    if (H5Iget_type(o) == H5I_DATASET)
        v->s = add_dataset(v->in, o, name);
    H5Oclose(o);
    return v->s == MT_OK ? 0 : -1;
}

/* Paths in natural order: layers.2 before layers.10. */
static int natural_cmp(const void *pa, const void *pb)
{
    const char *a = ((const mt_ckpt_dataset_info_t *)pa)->path;
    const char *b = ((const mt_ckpt_dataset_info_t *)pb)->path;
    const char *a0 = a, *b0 = b;
    while (*a && *b) {
        if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
            size_t la = strspn(a, "0123456789"), lb = strspn(b, "0123456789");
            int c = la != lb ? (la < lb ? -1 : 1) : strncmp(a, b, la);
            if (c)
                return c;
            a += la, b += lb;
        } else if (*a != *b) {
            return (unsigned char)*a - (unsigned char)*b;
        } else {
            a++, b++;
        }
    }
    return *a || *b ? (unsigned char)*a - (unsigned char)*b : strcmp(a0, b0);
}

mt_status_t mt_ckpt_info_read(const char *step_dir, mt_ckpt_info_t *in, int strict, int datasets)
{
    memset(in, 0, sizeof *in);
    MT_TRY(mt_ckpt_join(in->fname, step_dir, MT_CKPT_FILE));
    const char *file = in->fname;
    /* HDF5 prints its error stack by default; ours carry its innermost
     * reason instead. */
    H5E_auto2_t func;
    void *func_data;
    H5Eget_auto2(H5E_DEFAULT, &func, &func_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f;
    visit_t v = {in, MT_OK};
    mt_status_t s = open_file(file, &f);
    if (s == MT_OK)
        s = read_meta(f, file, in, strict);
    if (s == MT_OK && datasets && H5Lvisit(f, H5_INDEX_NAME, H5_ITER_INC, visit_link, &v) < 0)
        s = v.s != MT_OK ? v.s : h5_fail(__FILE__, __LINE__, "%s: cannot walk the file", file);
    if (f >= 0 && H5Fclose(f) < 0 && s == MT_OK)
        s = h5_fail(__FILE__, __LINE__, "%s: cannot close", file);
    H5Eset_auto2(H5E_DEFAULT, func, func_data);
    if (s == MT_OK && in->nds > 1)
        qsort(in->ds, (size_t)in->nds, sizeof *in->ds, natural_cmp);
    return s;
}

mt_status_t mt_ckpt_check_step(const char *step_dir, int *manifest_ok)
{
    mt_ckpt_info_t in;
    *manifest_ok = 0;
    MT_TRY(mt_ckpt_verify(step_dir));
    *manifest_ok = 1;
    mt_status_t s = mt_ckpt_info_read(step_dir, &in, 1, 0);
    mt_ckpt_info_free(&in);
    return s;
}
