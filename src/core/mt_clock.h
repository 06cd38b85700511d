/* mt_clock.h: the monotonic wall clock in seconds, for timings and
 * timeouts (not installed). */
#ifndef MT_CLOCK_H
#define MT_CLOCK_H

#include <time.h>

static inline double mt_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
