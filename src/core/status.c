/* status.c: the per-thread error context behind mt_status.h.
 * Fixed-size buffers: recording an error never allocates, so it works
 * when allocation itself is what failed. */
#include "mt_status.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MT_MSG_MAX 8192
#define MT_WHERE_MAX 1024
#define MT_HINT_MAX 1024

static _Thread_local char msg_buf[MT_MSG_MAX];
static _Thread_local char where_buf[MT_WHERE_MAX];
static _Thread_local char hint_buf[MT_HINT_MAX];

static const char *short_file(const char *file)
{
    /* Keep "src/x.c" rather than a build-tree absolute path. */
    const char *p = strstr(file, "src/");
    return p ? p : file;
}

static void vappend(char *buf, size_t cap, const char *fmt, va_list ap)
{
    size_t n = strlen(buf);
    if (n + 1 >= cap)
        return;
    vsnprintf(buf + n, cap - n, fmt, ap);
}

static void append(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vappend(buf, cap, fmt, ap);
    va_end(ap);
}

const char *mt_status_name(mt_status_t s)
{
    switch (s) {
    case MT_OK: return "success";
    case MT_ERR_CONFIG: return "configuration error";
    case MT_ERR_IO: return "I/O error";
    case MT_ERR_MPI: return "MPI error";
    case MT_ERR_NOMEM: return "out of memory";
    case MT_ERR_RANGE: return "argument out of range";
    case MT_ERR_UNSUPPORTED: return "unsupported";
    case MT_ERR_INTERNAL: return "internal error";
    }
    return "unknown error";
}

mt_status_t mt_error_set(mt_status_t s, const char *file, int line,
                         const char *fmt, ...)
{
    va_list ap;
    msg_buf[0] = where_buf[0] = hint_buf[0] = '\0';
    va_start(ap, fmt);
    vappend(msg_buf, sizeof msg_buf, fmt, ap);
    va_end(ap);
    append(where_buf, sizeof where_buf, "%s:%d", short_file(file), line);
    return s;
}

void mt_error_trace(const char *file, int line)
{
    append(where_buf, sizeof where_buf, " <- %s:%d", short_file(file), line);
}

void mt_error_append(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vappend(msg_buf, sizeof msg_buf, fmt, ap);
    va_end(ap);
}

void mt_error_hint(const char *fmt, ...)
{
    va_list ap;
    hint_buf[0] = '\0';
    va_start(ap, fmt);
    vappend(hint_buf, sizeof hint_buf, fmt, ap);
    va_end(ap);
}

const char *mt_error_message(void) { return msg_buf; }
const char *mt_error_where(void) { return where_buf; }
const char *mt_error_hint_text(void) { return hint_buf; }

void mt_error_clear(void)
{
    msg_buf[0] = where_buf[0] = hint_buf[0] = '\0';
}

mt_status_t mt_error_mpi(int rc, const char *call, const char *file, int line)
{
    char es[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, es, &len) != MPI_SUCCESS)
        snprintf(es, sizeof es, "MPI error code %d", rc);
    return mt_error_set(MT_ERR_MPI, file, line, "%s failed: %s", call, es);
}
