/* cm_time.h - the clocks, one of each: monotonic seconds for intervals and
 * deadlines inside a process, wall-clock milliseconds for deadlines that
 * cross processes (the wire's deadline_ms). */
#ifndef CM_TIME_H
#define CM_TIME_H

/* CLOCK_MONOTONIC, in seconds. */
double cm_now(void);
/* CLOCK_REALTIME, in milliseconds since the epoch. */
double cm_wall_ms(void);

#endif
