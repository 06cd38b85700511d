/* backend_require.h: the precondition check of the kernel backends (CPU
 * and CUDA).  Kernels return void, so a violated precondition (a caller
 * bug: bad shape, token id or target out of range) cannot be reported as a
 * status; it stops the process with the backend, the kernel's name and
 * the offending values, in every build.  Not installed. */
#ifndef MT_BACKEND_REQUIRE_H
#define MT_BACKEND_REQUIRE_H

#include <stdio.h>
#include <stdlib.h>

#define MT_BACKEND_REQUIRE(backend, cond, kernel, ...)                             \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "meshtrain %s backend: %s: precondition %s failed: ",   \
                    (backend), (kernel), #cond);                                   \
            fprintf(stderr, __VA_ARGS__);                                          \
            fputc('\n', stderr);                                                   \
            abort();                                                               \
        }                                                                          \
    } while (0)

#endif
