/* data_write_internal.h: what the files of meshtrain-data's library side
 * share (data_input.c, data_sft.c, data_par.c). */
#ifndef MT_DATA_WRITE_INTERNAL_H
#define MT_DATA_WRITE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "mt_data_write.h"

/* A file read as a stream of bytes: plain, or zstd-compressed when its
 * name ends in .zst or it starts with the zstd magic. */
typedef struct mt_dw_reader mt_dw_reader_t;

mt_status_t mt_dw_reader_open(const char *path, mt_dw_reader_t **out);
void mt_dw_reader_close(mt_dw_reader_t *r);
/* The next line, without its line break (a final "\r" is kept: JSON
 * ignores it); *got 0 at the end.  The line stays valid until the next
 * call.  *lineno counts from 1. */
mt_status_t mt_dw_reader_line(mt_dw_reader_t *r, const char **line, size_t *len,
                              int64_t *lineno, int *got);
/* Uncompressed bytes handed out so far. */
int64_t mt_dw_reader_bytes(const mt_dw_reader_t *r);
/* The whole (uncompressed) file; free *buf. */
mt_status_t mt_dw_read_all(const char *path, char **buf, size_t *len);

#endif
