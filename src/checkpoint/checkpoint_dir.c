/* checkpoint_dir.c: the step directories of a checkpoint_dir: making
 * step_NNNNNNNN.tmp, publishing it (manifest, rename, `latest`), pruning,
 * verifying a manifest and finding the newest complete step.
 *
 * Plain POSIX file-system work, never collective: during a save only
 * rank 0 calls into this file and checkpoint.c broadcasts the outcome.
 * Nothing here locks the directory: one job writes a checkpoint_dir at a
 * time. */
#define _XOPEN_SOURCE 700 /* nftw */
#include "checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_CAP MT_CKPT_PATH_CAP
#define STEP_PREFIX MT_CKPT_STEP_PREFIX

/* ------------------------------------------------------------ file system */

mt_status_t mt_ckpt_join(char *out, const char *dir, const char *name)
{
    if ((size_t)snprintf(out, PATH_CAP, "%s/%s", dir, name) >= PATH_CAP)
        MT_FAIL(MT_ERR_RANGE, "path too long: %s/%s", dir, name);
    return MT_OK;
}

static mt_status_t mkdir_p(const char *dir)
{
    char buf[PATH_CAP];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            MT_FAIL(MT_ERR_IO, "%s: cannot create the checkpoint directory: %s (at %s)", dir,
                    strerror(errno), buf);
        *p = c;
        if (!c)
            break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        MT_FAIL(MT_ERR_IO, "%s: cannot create the checkpoint directory: it exists and is not a "
                "directory", dir);
    return MT_OK;
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path) != 0 ? -1 : 0;
}

/* 0, or -1 with errno; a path that does not exist is already removed. */
int mt_ckpt_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0 && errno == ENOENT)
        return 0;
    return nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0 ? -1 : 0;
}

static mt_status_t rm_rf(const char *path)
{
    if (mt_ckpt_remove_tree(path) != 0)
        MT_FAIL(MT_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return MT_OK;
}

/* Make a file's data or a directory's entries durable.  File systems that
 * cannot sync a directory say EINVAL; that is not an error. */
static mt_status_t sync_path(const char *path, int is_dir)
{
    int fd = open(path, O_RDONLY | (is_dir ? O_DIRECTORY : 0));
    if (fd < 0)
        MT_FAIL(MT_ERR_IO, "%s: cannot open to sync: %s", path, strerror(errno));
    int rc = fsync(fd), err = errno;
    close(fd);
    if (rc != 0 && err != EINVAL && err != ENOTSUP)
        MT_FAIL(MT_ERR_IO, "%s: fsync failed: %s", path, strerror(err));
    return MT_OK;
}

static mt_status_t write_synced(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        MT_FAIL(MT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    size_t len = strlen(text), done = 0;
    while (done < len) {
        ssize_t w = write(fd, text + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            int err = errno;
            close(fd);
            MT_FAIL(MT_ERR_IO, "%s: write failed: %s", path, strerror(err));
        }
        done += (size_t)w;
    }
    int rc = fsync(fd), err = errno;
    if (close(fd) != 0 && rc == 0)
        rc = -1, err = errno;
    if (rc != 0)
        MT_FAIL(MT_ERR_IO, "%s: cannot make it durable: %s", path, strerror(err));
    return MT_OK;
}

/* ------------------------------------------------------------ step directories */

typedef struct {
    int64_t step;
    int tmp; /* an unfinished step_N.tmp or step_N.replaced.tmp */
    char name[256];
} step_entry_t;

/* "step_<digits>" is complete, "step_<digits>.<...>.tmp" unfinished;
 * anything else is not ours. */
static int parse_step_name(const char *name, int64_t *step, int *tmp)
{
    if (strncmp(name, STEP_PREFIX, strlen(STEP_PREFIX)) != 0)
        return 0;
    const char *p = name + strlen(STEP_PREFIX);
    int digits = 0;
    int64_t v = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++)
        v = v * 10 + (*p - '0');
    if (digits == 0 || digits > 18)
        return 0;
    size_t rest = strlen(p);
    *step = v;
    *tmp = rest > 0;
    return rest == 0 || (*p == '.' && rest >= 4 && strcmp(p + rest - 4, ".tmp") == 0);
}

static int by_step(const void *a, const void *b)
{
    int64_t x = ((const step_entry_t *)a)->step, y = ((const step_entry_t *)b)->step;
    return (x > y) - (x < y);
}

/* Step directories under dir, sorted by step, oldest first; *exists = 0
 * (and no error) when dir itself does not exist. */
static mt_status_t list_steps(const char *dir, step_entry_t **out, int *n, int *exists)
{
    *out = NULL;
    *n = 0;
    *exists = 1;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) {
            *exists = 0;
            return MT_OK;
        }
        MT_FAIL(MT_ERR_IO, "%s: cannot list the checkpoint directory: %s", dir, strerror(errno));
    }
    step_entry_t *v = NULL;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        step_entry_t s;
        char path[PATH_CAP];
        struct stat st;
        if (!parse_step_name(e->d_name, &s.step, &s.tmp) || mt_ckpt_join(path, dir, e->d_name) != MT_OK ||
            stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        snprintf(s.name, sizeof s.name, "%s", e->d_name);
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            step_entry_t *w = realloc(v, sizeof *v * (size_t)cap);
            if (!w) {
                free(v);
                closedir(d);
                MT_FAIL(MT_ERR_NOMEM, "listing %s", dir);
            }
            v = w;
        }
        v[(*n)++] = s;
    }
    closedir(d);
    mt_error_clear(); /* mt_ckpt_join() may have complained about a name we skipped */
    if (*n)
        qsort(v, (size_t)*n, sizeof *v, by_step);
    *out = v;
    return MT_OK;
}

/* Delete the oldest complete step directories beyond keep (0: keep all),
 * never `current`, and unfinished ones older than `current` (they are
 * leftovers of interrupted saves and can never be loaded). */
static mt_status_t prune(const char *dir, int64_t current, int64_t keep)
{
    step_entry_t *v;
    int n, exists, complete = 0;
    MT_TRY(list_steps(dir, &v, &n, &exists));
    for (int i = 0; i < n; i++)
        complete += !v[i].tmp;
    int64_t excess = keep > 0 ? complete - keep : 0;
    mt_status_t s = MT_OK;
    char path[PATH_CAP];
    for (int i = 0; i < n && s == MT_OK; i++) {
        int drop = v[i].tmp ? v[i].step < current : excess > 0 && v[i].step != current;
        if (!drop)
            continue;
        if (!v[i].tmp)
            excess--;
        s = mt_ckpt_join(path, dir, v[i].name);
        if (s == MT_OK)
            s = rm_rf(path);
    }
    free(v);
    return s;
}

/* ------------------------------------------------------------ save: rank 0 */

/* Rank 0: an empty step_N.tmp under an existing checkpoint_dir. */
mt_status_t mt_ckpt_prepare(const char *dir, const char *tmp)
{
    MT_TRY(mkdir_p(dir));
    MT_TRY(rm_rf(tmp));
    if (mkdir(tmp, 0777) != 0)
        MT_FAIL(MT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    return MT_OK;
}

/* Rank 0, after model.h5 is closed on every rank: manifest, rename,
 * `latest`, prune.  Each step is made durable before the next depends on
 * it, so a crash leaves either the old state or the new one. */
mt_status_t mt_ckpt_publish(const char *dir, const char *name, const char *tmp, int64_t step,
                            int64_t keep)
{
    char file[PATH_CAP], manifest[PATH_CAP], final[PATH_CAP], aside[PATH_CAP];
    char latest[PATH_CAP], latest_tmp[PATH_CAP], hex[65], line[PATH_CAP];
    MT_TRY(mt_ckpt_join(file, tmp, MT_CKPT_FILE));
    MT_TRY(mt_ckpt_join(manifest, tmp, MT_CKPT_MANIFEST));
    MT_TRY(mt_ckpt_join(final, dir, name));
    MT_TRY(mt_ckpt_join(latest, dir, "latest"));
    MT_TRY(mt_ckpt_join(latest_tmp, dir, "latest.tmp"));
    snprintf(aside, sizeof aside, "%s.replaced.tmp", final);

    MT_TRY(sync_path(file, 0));
    MT_TRY(mt_sha256_file(file, hex));
    snprintf(line, sizeof line, "%s  %s\n", hex, MT_CKPT_FILE);
    MT_TRY(write_synced(manifest, line));
    MT_TRY(sync_path(tmp, 1));

    /* rename() cannot replace a non-empty directory: move an older copy of
     * this step aside (as .tmp, so nothing loads it) and delete it after. */
    struct stat st;
    if (lstat(final, &st) == 0) {
        MT_TRY(rm_rf(aside));
        if (rename(final, aside) != 0)
            MT_FAIL(MT_ERR_IO, "cannot move the existing %s aside: %s", final, strerror(errno));
    }
    if (rename(tmp, final) != 0)
        MT_FAIL(MT_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    MT_TRY(sync_path(dir, 1));
    MT_TRY(rm_rf(aside));

    snprintf(line, sizeof line, "%s\n", name);
    mt_status_t s = write_synced(latest_tmp, line);
    if (s == MT_OK && rename(latest_tmp, latest) != 0)
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "cannot rename %s to %s: %s",
                         latest_tmp, latest, strerror(errno));
    if (s == MT_OK)
        s = sync_path(dir, 1);
    if (s != MT_OK) {
        /* the step directory is already published and verifies: say so,
         * and leave no half-written pointer behind */
        unlink(latest_tmp);
        mt_error_append(" (checkpoint %s itself is complete and verifies; `latest` was not "
                        "updated; resume: auto finds the step by scanning the directory)",
                        final);
        mt_error_trace(__FILE__, __LINE__);
        return s;
    }

    if (prune(dir, step, keep) != MT_OK) {
        mt_error_append(" (checkpoint %s itself is complete)", final);
        mt_error_trace(__FILE__, __LINE__);
        return MT_ERR_IO;
    }
    return MT_OK;
}

/* ------------------------------------------------------------ verify, find */

mt_status_t mt_ckpt_verify(const char *step_dir)
{
    struct stat st;
    if (stat(step_dir, &st) != 0)
        MT_FAIL(MT_ERR_IO, "%s: no such checkpoint directory: %s", step_dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        MT_FAIL(MT_ERR_IO, "%s: not a checkpoint directory", step_dir);

    char path[PATH_CAP];
    MT_TRY(mt_ckpt_join(path, step_dir, MT_CKPT_MANIFEST));
    FILE *f = fopen(path, "rb");
    if (!f && errno == ENOENT) {
        mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                     "%s: no " MT_CKPT_MANIFEST ": the checkpoint is incomplete", step_dir);
        mt_error_hint("its save was interrupted; resume from an older checkpoint");
        return MT_ERR_IO;
    }
    if (!f)
        MT_FAIL(MT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    enum { MANIFEST_MAX = 1 << 16 };
    char *text = malloc(MANIFEST_MAX + 1);
    if (!text) {
        fclose(f);
        MT_FAIL(MT_ERR_NOMEM, "reading %s", path);
    }
    size_t len = fread(text, 1, MANIFEST_MAX + 1, f);
    fclose(f);
    text[len < MANIFEST_MAX ? len : MANIFEST_MAX] = '\0';

    mt_status_t s = MT_OK;
    int lineno = 0, has_model = 0;
    if (len > MANIFEST_MAX || memchr(text, '\0', len))
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                         "%s: not a manifest (binary or over %d bytes)", path, MANIFEST_MAX);
    for (char *line = text, *next; s == MT_OK && *line; line = next) {
        lineno++;
        char *end = strchr(line, '\n');
        next = end ? end + 1 : line + strlen(line);
        if (end)
            *end = '\0';
        if (!line[0])
            continue;
        /* sha256sum's format: 64 hex digits, space, ' ' or '*', a file name
         * in this directory. */
        size_t hexlen = strspn(line, "0123456789abcdefABCDEF");
        const char *fname = line + 66;
        if (hexlen != 64 || line[64] != ' ' || (line[65] != ' ' && line[65] != '*') ||
            !fname[0] || strchr(fname, '/') || !strcmp(fname, ".") || !strcmp(fname, "..")) {
            s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                             "%s: line %d is malformed: expected \"<64 hex digits>  <file name>\"",
                             path, lineno);
            break;
        }
        char file[PATH_CAP], hex[65];
        if ((s = mt_ckpt_join(file, step_dir, fname)) != MT_OK)
            break;
        if (stat(file, &st) != 0) {
            s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                             "%s: listed in " MT_CKPT_MANIFEST " but missing: the checkpoint is "
                             "incomplete", file);
            break;
        }
        if ((s = mt_sha256_file(file, hex)) != MT_OK)
            break;
        if (strncasecmp(hex, line, 64) != 0) {
            s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                             "%s: SHA-256 mismatch: the file is corrupt or was modified "
                             "(manifest %.64s, file %s)", file, line, hex);
            break;
        }
        has_model |= strcmp(fname, MT_CKPT_FILE) == 0;
    }
    free(text);
    if (s == MT_OK && !has_model)
        s = mt_error_set(MT_ERR_IO, __FILE__, __LINE__,
                         "%s: does not list " MT_CKPT_FILE ": the checkpoint is incomplete", path);
    return s;
}

mt_status_t mt_ckpt_find_latest(const char *checkpoint_dir, char *out, size_t cap, int *found,
                                FILE *warn)
{
    *found = 0;
    if (cap)
        out[0] = '\0';
    step_entry_t *v;
    int n, exists;
    MT_TRY(list_steps(checkpoint_dir, &v, &n, &exists));
    mt_status_t s = MT_OK;
    char path[PATH_CAP];
    for (int i = n - 1; i >= 0 && s == MT_OK && !*found; i--) {
        if (v[i].tmp || mt_ckpt_join(path, checkpoint_dir, v[i].name) != MT_OK)
            continue;
        if (mt_ckpt_verify(path) != MT_OK) {
            if (warn)
                fprintf(warn, "meshtrain: warning: skipping checkpoint %s: %s\n", v[i].name,
                        mt_error_message());
            continue;
        }
        if (strlen(path) >= cap)
            s = mt_error_set(MT_ERR_RANGE, __FILE__, __LINE__,
                             "%s: path longer than the %zu bytes given", path, cap);
        else
            memcpy(out, path, strlen(path) + 1), *found = 1;
    }
    free(v);
    if (s == MT_OK)
        mt_error_clear(); /* skipped checkpoints are warnings, not this call's error */
    return s;
}
