/* mt_test_dir.h: a scratch directory for a unit test's files (mkdtemp
 * under $TMPDIR), paths in it, whole-file writes, and its removal.  Needs
 * mt_test.h first (CHECK). */
#ifndef MT_TEST_DIR_H
#define MT_TEST_DIR_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char mt_test_dir[512];

/* Create the directory, named after the test; 0 on success. */
static inline int mt_test_dir_make(const char *name)
{
    snprintf(mt_test_dir, sizeof mt_test_dir, "%s/meshtrain-test-%s.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", name);
    if (!mkdtemp(mt_test_dir)) {
        perror("mkdtemp");
        return -1;
    }
    return 0;
}

/* The path of `name` in the directory; four calls' results live at once. */
static inline const char *tmp(const char *name)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", mt_test_dir, name);
    return buf[k];
}

/* The directory and its files (no subdirectories). */
static inline void mt_test_dir_remove(void)
{
    DIR *d = opendir(mt_test_dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlink(tmp(e->d_name));
    if (d)
        closedir(d);
    rmdir(mt_test_dir);
}

static inline void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(p, 1, n, f) == n, "cannot write %s", path);
    if (f)
        fclose(f);
}

#endif
