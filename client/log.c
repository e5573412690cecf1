/* SPDX-License-Identifier: MIT */
/*
 * log.c - the optional, process-wide log callback (ckpt_set_log_fn).
 *
 * The library never prints.  When the caller installs a callback, messages
 * are formatted and handed to it; without one, cli_log() costs one atomic
 * load.  A read-write lock is held around each call of the callback, so
 * that ckpt_set_log_fn() returns only once no call of the old callback runs
 * any more (its userdata may then be freed).  This lock is taken after the
 * client lock, never before it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "client/internal.h"

static pthread_rwlock_t log_lock = PTHREAD_RWLOCK_INITIALIZER;
static ckpt_log_fn log_fn;       /* [log_lock] */
static void *log_userdata;       /* [log_lock] */
/* Mirrors log_fn != NULL for the lock-free fast path.  A stale read only
 * costs a formatted message nobody gets, or one missed message while the
 * callback is being set: the callback itself is always read under the lock. */
static atomic_bool log_on;

void ckpt_set_log_fn(ckpt_log_fn fn, void *userdata)
{
	pthread_rwlock_wrlock(&log_lock);
	log_fn = fn;
	log_userdata = userdata;
	atomic_store_explicit(&log_on, fn != NULL, memory_order_relaxed);
	pthread_rwlock_unlock(&log_lock);
}

bool cli_log_enabled(void)
{
	return atomic_load_explicit(&log_on, memory_order_relaxed);
}

void cli_log(enum ckpt_log_level level, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	if (!cli_log_enabled())
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pthread_rwlock_rdlock(&log_lock);
	if (log_fn)
		log_fn(level, msg, log_userdata);
	pthread_rwlock_unlock(&log_lock);
}

uint64_t cli_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
