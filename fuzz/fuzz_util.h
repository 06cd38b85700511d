/* Helpers shared by the fuzz targets whose library entry points read
 * files: the input goes to a per-process temporary file. */
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Write data to DIR/name (DIR made once per process); returns the path in
 * buf or NULL. */
static inline const char *fuzz_write_file(const char *name, const uint8_t *data, size_t size,
                                          char *buf, size_t cap)
{
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/mt-fuzz-XXXXXX");
        if (!mkdtemp(dir)) { dir[0] = '\0'; return NULL; }
    }
    snprintf(buf, cap, "%s/%s", dir, name);
    FILE *f = fopen(buf, "wb");
    if (!f) return NULL;
    if (size && fwrite(data, 1, size, f) != size) { fclose(f); return NULL; }
    fclose(f);
    return buf;
}
#endif
