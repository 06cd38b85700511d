/* mt_status.h: status codes and error context for libmeshtrain.
 *
 * Every library function that can fail returns an mt_status_t.  The first
 * failure records a message with its file:line; MT_TRY() appends the call
 * sites it propagates through, so an app can print where it went wrong.
 * The context is per thread.  This file does not print or exit: apps decide
 * that, after the ranks agree (see mt_app.h). */
#ifndef MT_STATUS_H
#define MT_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MT_OK = 0,
    MT_ERR_CONFIG,  /* invalid configuration or command line */
    MT_ERR_IO,      /* file system or file format */
    MT_ERR_MPI,     /* an MPI call failed */
    MT_ERR_NOMEM,   /* allocation failed */
    MT_ERR_RANGE,   /* argument out of range; a bug in the caller */
    MT_ERR_UNSUPPORTED, /* valid request this build cannot serve */
    MT_ERR_INTERNAL
} mt_status_t;

/* Short name of a status code ("config error", ...). */
const char *mt_status_name(mt_status_t s);

/* Record an error: resets the context and stores the message. */
mt_status_t mt_error_set(mt_status_t s, const char *file, int line,
                         const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Append one propagation frame ("at file:line"). */
void mt_error_trace(const char *file, int line);

/* Append free text to the current message (e.g. several diagnostics). */
void mt_error_append(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Attach a hint for the user, printed after the message. */
void mt_error_hint(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

const char *mt_error_message(void); /* message of the last error ("" if none) */
const char *mt_error_where(void);   /* "file:line" of origin, then trace */
const char *mt_error_hint_text(void);
void mt_error_clear(void);

/* Set an error and return its status from the current function. */
#define MT_FAIL(status, ...)                                              \
    return mt_error_set((status), __FILE__, __LINE__, __VA_ARGS__)

/* Evaluate expr once; on failure add this call site and return. */
#define MT_TRY(expr)                                                      \
    do {                                                                  \
        mt_status_t mt_try_s_ = (expr);                                   \
        if (mt_try_s_ != MT_OK) {                                         \
            mt_error_trace(__FILE__, __LINE__);                           \
            return mt_try_s_;                                             \
        }                                                                 \
    } while (0)

/* Check an MPI return code; on failure record the MPI error string. */
#define MT_MPI_TRY(call)                                                  \
    do {                                                                  \
        int mt_mpi_rc_ = (call);                                          \
        if (mt_mpi_rc_ != 0)                                              \
            return mt_error_mpi(mt_mpi_rc_, #call, __FILE__, __LINE__);   \
    } while (0)

mt_status_t mt_error_mpi(int rc, const char *call, const char *file, int line);

#ifdef __cplusplus
}
#endif
#endif
