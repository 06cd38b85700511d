/* checkpoint_h5.c: the HDF5 pieces of a checkpoint that need no MPI,
 * shared by the collective file I/O (checkpoint_io.c) and meshtrain-ckpt's
 * inspection (ckpt_inspect.c): errors that carry HDF5's innermost reason,
 * reading /meta's attributes, the format and version check, and the
 * serial read of the stored config.  It writes nothing and opens files
 * only with the serial driver. */
#include "checkpoint_internal.h"

#include <hdf5.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define h5_fail mt_ckpt_h5_fail

typedef struct {
    char *buf;
    size_t cap;
} h5_reason_t;

static herr_t keep_innermost(unsigned n, const H5E_error2_t *e, void *data)
{
    h5_reason_t *r = data;
    if (e->desc && e->desc[0])
        snprintf(r->buf, r->cap, "%s", e->desc);
    return 0;
}

/* The innermost description on HDF5's error stack (walking downward, the
 * last entry is where the error was first detected), then clear it. */
static const char *h5_reason(char *buf, size_t cap)
{
    h5_reason_t r = {buf, cap};
    buf[0] = '\0';
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, keep_innermost, &r);
    H5Eclear2(H5E_DEFAULT);
    if (!buf[0])
        snprintf(buf, cap, "no detail from HDF5");
    return buf;
}

mt_status_t mt_ckpt_h5_fail(const char *src, int line, const char *fmt, ...)
{
    char what[1024], why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    h5_reason(why, sizeof why);
    return mt_error_set(MT_ERR_IO, src, line, "%s (HDF5: %s)", what, why);
}

/* Refuse an attribute that is not a single element before anything reads
 * it: H5Aread writes every element, and the buffers below hold one. */
static mt_status_t attr_check_scalar(const char *fname, hid_t a, const char *obj,
                                     const char *name)
{
    hid_t sp = H5Aget_space(a);
    if (sp < 0)
        H5_FAIL("%s: cannot read the shape of attribute %s %s", fname, obj, name);
    H5S_class_t cls = H5Sget_simple_extent_type(sp);
    hssize_t n = H5Sget_simple_extent_npoints(sp);
    H5Sclose(sp);
    if (cls != H5S_SCALAR || n != 1)
        MT_FAIL(MT_ERR_IO, "%s: attribute %s %s is not a scalar (%s, %lld elements)", fname, obj,
                name, cls == H5S_SIMPLE ? "an array" : cls == H5S_NULL ? "empty" : "unknown",
                (long long)n);
    return MT_OK;
}

/* A string attribute as a malloc'd copy (fixed or variable length, so
 * files edited by other tools still read); *out = NULL when absent. */
mt_status_t mt_ckpt_h5_attr_string(const char *fname, hid_t file, const char *obj,
                                  const char *name, char **out)
{
    *out = NULL;
    htri_t ex = H5Aexists_by_name(file, obj, name, H5P_DEFAULT);
    if (ex < 0)
        H5_FAIL("%s: cannot look up attribute %s %s", fname, obj, name);
    if (ex == 0)
        return MT_OK;
    hid_t a = H5Aopen_by_name(file, obj, name, H5P_DEFAULT, H5P_DEFAULT), ft = -1, mt = -1;
    mt_status_t s = MT_OK;
    if (a < 0 || (ft = H5Aget_type(a)) < 0) {
        s = h5_fail(__FILE__, __LINE__, "%s: cannot open attribute %s %s", fname, obj, name);
    } else if ((s = attr_check_scalar(fname, a, obj, name)) != MT_OK) {
    } else if (H5Tget_class(ft) != H5T_STRING) {
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: attribute %s %s is not a string",
                         fname, obj, name);
    } else if (H5Tis_variable_str(ft) > 0) {
        char *p = NULL;
        if ((mt = H5Tcopy(H5T_C_S1)) < 0 || H5Tset_size(mt, H5T_VARIABLE) < 0 ||
            H5Aread(a, mt, &p) < 0)
            s = h5_fail(__FILE__, __LINE__, "%s: cannot read attribute %s %s", fname, obj, name);
        else if (!(*out = strdup(p ? p : "")))
            s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "attribute %s %s", obj, name);
        if (p)
            H5free_memory(p);
    } else {
        size_t size = H5Tget_size(ft);
        char *buf = size == 0 || size > MT_CKPT_ATTR_MAX ? NULL : calloc(size + 1, 1);
        if (size == 0 || size > MT_CKPT_ATTR_MAX)
            s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                             "%s: attribute %s %s has %zu bytes (at most %d)", fname, obj, name,
                             size, MT_CKPT_ATTR_MAX);
        else if (!buf)
            s = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "attribute %s %s: %zu bytes", obj,
                             name, size);
        else if (H5Aread(a, ft, buf) < 0)
            s = h5_fail(__FILE__, __LINE__, "%s: cannot read attribute %s %s", fname, obj, name);
        if (s == MT_OK)
            *out = buf;
        else
            free(buf);
    }
    mt_ckpt_h5_close_id(&mt, H5Tclose);
    mt_ckpt_h5_close_id(&ft, H5Tclose);
    mt_ckpt_h5_close_id(&a, H5Aclose);
    return s;
}

mt_status_t mt_ckpt_h5_attr_int(const char *fname, hid_t file, const char *obj, const char *name,
                               int64_t *v, int *present)
{
    *present = 0;
    htri_t ex = H5Aexists_by_name(file, obj, name, H5P_DEFAULT);
    if (ex < 0)
        H5_FAIL("%s: cannot look up attribute %s %s", fname, obj, name);
    if (ex == 0)
        return MT_OK;
    hid_t a = H5Aopen_by_name(file, obj, name, H5P_DEFAULT, H5P_DEFAULT), ft = -1;
    mt_status_t s = MT_OK;
    if (a < 0 || (ft = H5Aget_type(a)) < 0)
        s = h5_fail(__FILE__, __LINE__, "%s: cannot open attribute %s %s", fname, obj, name);
    else if ((s = attr_check_scalar(fname, a, obj, name)) != MT_OK) {
    } else if (H5Tget_class(ft) != H5T_INTEGER || H5Tget_size(ft) > 8)
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: attribute %s %s is not an integer",
                         fname, obj, name);
    else if (H5Aread(a, H5T_NATIVE_INT64, v) < 0)
        s = h5_fail(__FILE__, __LINE__, "%s: cannot read attribute %s %s", fname, obj, name);
    else
        *present = 1;
    mt_ckpt_h5_close_id(&ft, H5Tclose);
    mt_ckpt_h5_close_id(&a, H5Aclose);
    return s;
}

/* A checkpoint holds only its own objects: every link is a hard link and
 * every dataset keeps its bytes in the file.  A soft or external link, or
 * a dataset whose bytes are external files or a virtual mapping, would
 * make a reader open files the checkpoint does not name (its manifest
 * hashes only the HDF5 files themselves), so each is refused by path. */
typedef struct {
    hid_t file;
    char bad[512];
    int damaged; /* an object that does not open: the file is corrupt, not crafted */
} plain_ctx_t;

static herr_t visit_plain(hid_t group, const char *name, const H5L_info_t *info, void *data)
{
    plain_ctx_t *x = data;
    if (info->type != H5L_TYPE_HARD) {
        const char *kind = info->type == H5L_TYPE_SOFT       ? "a soft link"
                           : info->type == H5L_TYPE_EXTERNAL ? "an external link (to another file)"
                                                             : "a user-defined link";
        snprintf(x->bad, sizeof x->bad, "/%s is %s", name, kind);
        return 1;
    }
    hid_t o = H5Oopen(group, name, H5P_DEFAULT);
    if (o < 0) {
        snprintf(x->bad, sizeof x->bad, "/%s cannot be opened", name);
        x->damaged = 1;
        return 1;
    }
    if (H5Iget_type(o) == H5I_DATASET) {
        hid_t pl = H5Dget_create_plist(o);
        int ext = pl >= 0 ? H5Pget_external_count(pl) : -1;
        H5D_layout_t lay = pl >= 0 ? H5Pget_layout(pl) : H5D_LAYOUT_ERROR;
        if (pl >= 0)
            H5Pclose(pl);
        if (ext != 0)
            snprintf(x->bad, sizeof x->bad, "/%s keeps its data in %s", name,
                     ext > 0 ? "external files" : "an unreadable layout");
        else if (lay == H5D_VIRTUAL || lay == H5D_LAYOUT_ERROR)
            snprintf(x->bad, sizeof x->bad, "/%s is %s", name,
                     lay == H5D_VIRTUAL ? "a virtual dataset (mapped from other files)"
                                        : "of an unreadable layout");
    }
    H5Oclose(o);
    return x->bad[0] ? 1 : 0;
}

static mt_status_t check_plain(const char *fname, hid_t file)
{
    plain_ctx_t x = {file, "", 0};
    herr_t rc = H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, visit_plain, &x);
    if (x.damaged)
        MT_FAIL(MT_ERR_IO, "%s: %s: the file is damaged (check it with meshtrain-ckpt verify)",
                fname, x.bad);
    if (x.bad[0])
        MT_FAIL(MT_ERR_IO, "%s: %s: a checkpoint holds only its own datasets, behind hard links",
                fname, x.bad);
    if (rc < 0)
        H5_FAIL("%s: cannot list its objects", fname);
    return MT_OK;
}

mt_status_t mt_ckpt_h5_check_format(const char *fname, hid_t file, int check_version)
{
    MT_TRY(check_plain(fname, file));
    htri_t ex = H5Lexists(file, "/meta", H5P_DEFAULT);
    if (ex < 0)
        H5_FAIL("%s: cannot look up /meta", fname);
    if (ex == 0)
        MT_FAIL(MT_ERR_IO, "%s: not a meshtrain checkpoint: it has no /meta group", fname);
    char *format = NULL;
    MT_TRY(mt_ckpt_h5_attr_string(fname, file, "/meta", "format", &format));
    if (!format || strcmp(format, MT_CKPT_FORMAT) != 0) {
        mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                     "%s: not a meshtrain checkpoint: /meta format is %s%s%s, expected \"%s\"",
                     fname, format ? "\"" : "", format ? format : "missing", format ? "\"" : "",
                     MT_CKPT_FORMAT);
        free(format);
        return MT_ERR_IO;
    }
    free(format);
    if (!check_version)
        return MT_OK;
    int64_t version = 0;
    int present;
    MT_TRY(mt_ckpt_h5_attr_int(fname, file, "/meta", "version", &version, &present));
    if (!present)
        MT_FAIL(MT_ERR_IO, "%s: /meta has no version attribute: the file is damaged", fname);
    if (version != MT_CKPT_VERSION) {
        mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                     "%s: checkpoint format version %lld; this build of meshtrain reads version %d "
                     "only",
                     fname, (long long)version, MT_CKPT_VERSION);
        mt_error_hint("load it with the meshtrain release that wrote it (see /meta software)");
        return MT_ERR_IO;
    }
    return MT_OK;
}

mt_status_t mt_ckpt_h5_read_config(const char *file, char **yaml)
{
    *yaml = NULL;
    mt_ckpt_h5_quiet_t q;
    mt_ckpt_h5_quiet_begin(&q);
    mt_status_t s = MT_OK;
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), f = -1;
#if H5_VERSION_GE(1, 10, 7) && !(H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 12 && H5_VERS_RELEASE == 0)
    /* Reading only: do not fail on file systems without flock (Lustre). */
    if (fapl >= 0)
        H5Pset_file_locking(fapl, 0, 1);
#endif
    if (fapl < 0 || (f = H5Fopen(file, H5F_ACC_RDONLY, fapl)) < 0)
        s = h5_fail(__FILE__, __LINE__, "%s: cannot open as HDF5", file);
    if (s == MT_OK)
        s = mt_ckpt_h5_check_format(file, f, 0);
    if (s == MT_OK)
        s = mt_ckpt_h5_attr_string(file, f, "/meta", "config", yaml);
    if (s == MT_OK && !*yaml)
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: /meta has no config attribute",
                         file);
    mt_ckpt_h5_close_id(&f, H5Fclose);
    mt_ckpt_h5_close_id(&fapl, H5Pclose);
    mt_ckpt_h5_quiet_end(&q);
    return s;
}

mt_status_t mt_ckpt_h5_read_int_scalar(const char *fname, hid_t file, const char *path, int64_t *v)
{
    hid_t d = H5Dopen2(file, path, H5P_DEFAULT), sp = -1, ty = -1;
    mt_status_t s = MT_OK;
    if (d < 0 || (sp = H5Dget_space(d)) < 0 || (ty = H5Dget_type(d)) < 0) {
        s = h5_fail(__FILE__, __LINE__, "%s: cannot open %s", fname, path);
    } else if (H5Sget_simple_extent_type(sp) != H5S_SCALAR ||
               H5Sget_simple_extent_npoints(sp) != 1) {
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                         "%s: %s is not a scalar (%lld elements)", fname, path,
                         (long long)H5Sget_simple_extent_npoints(sp));
    } else if (H5Tget_class(ty) != H5T_INTEGER || H5Tget_size(ty) > 8) {
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s: %s is not an integer of at most 64 bits",
                         fname, path);
    } else if (H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0) {
        s = h5_fail(__FILE__, __LINE__, "%s: cannot read %s", fname, path);
    }
    mt_ckpt_h5_close_id(&ty, H5Tclose);
    mt_ckpt_h5_close_id(&sp, H5Sclose);
    mt_ckpt_h5_close_id(&d, H5Dclose);
    return s;
}
