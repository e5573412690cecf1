/* SPDX-License-Identifier: MIT */
/* clock.c - the daemon's one clock: CLOCK_MONOTONIC (never jumps). */
#include <stdint.h>
#include <time.h>

#include "daemon/server.h"

int64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t now_ms(void)
{
	return now_us() / 1000;
}

int64_t thread_cpu_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
