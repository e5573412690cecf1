/* SPDX-License-Identifier: MIT */
/*
 * future.c - the staged and committed futures of a save.
 *
 * A future is completed once by a library thread and read by any number of
 * caller threads.  poll() needs no lock: the completer writes err and msg
 * first and then release-stores the state, so an acquire-load that sees the
 * final state also sees them.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "client/internal.h"

int future_init(struct ckpt_future *f)
{
	pthread_condattr_t ca;
	int r;

	memset(f, 0, sizeof(*f));
	atomic_init(&f->state, FUTURE_PENDING);
	r = pthread_mutex_init(&f->lock, NULL);
	if (r)
		return -r;
	r = pthread_condattr_init(&ca);
	if (r)
		goto out_mutex;
	/* Timed waits must not jump with the wall clock. */
	r = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (!r)
		r = pthread_cond_init(&f->cond, &ca);
	pthread_condattr_destroy(&ca);
	if (r)
		goto out_mutex;
	return 0;

out_mutex:
	pthread_mutex_destroy(&f->lock);
	return -r;
}

void future_destroy(struct ckpt_future *f)
{
	pthread_cond_destroy(&f->cond);
	pthread_mutex_destroy(&f->lock);
}

void future_complete(struct ckpt_future *f, int err, const char *msg)
{
	pthread_mutex_lock(&f->lock);
	if (atomic_load_explicit(&f->state, memory_order_relaxed) == FUTURE_PENDING) {
		f->err = err;
		if (err && msg)
			proto_set_msg(f->msg, msg);
		else
			f->msg[0] = '\0';
		/* Partner: the acquire-load in ckpt_future_poll(). */
		atomic_store_explicit(&f->state, FUTURE_FINAL, memory_order_release);
		pthread_cond_broadcast(&f->cond);
	}
	pthread_mutex_unlock(&f->lock);
}

int ckpt_future_poll(const struct ckpt_future *future)
{
	if (!future) {
		cli_set_error("ckpt_future_poll: future is NULL");
		return -EINVAL;
	}
	if (atomic_load_explicit(&future->state, memory_order_acquire) == FUTURE_PENDING)
		return -EINPROGRESS;
	if (future->err)
		cli_set_error("%s", future->msg);
	return future->err;
}

int ckpt_future_wait(struct ckpt_future *future, int64_t timeout_ms)
{
	struct timespec deadline;
	int r;

	r = ckpt_future_poll(future);
	if (r != -EINPROGRESS)
		return r;
	if (timeout_ms == 0) {
		cli_set_error("future still pending");
		return -ETIMEDOUT;
	}
	if (timeout_ms > 0) {
		clock_gettime(CLOCK_MONOTONIC, &deadline);
		/* Cap at about 100 years so the arithmetic cannot overflow. */
		if (timeout_ms > (int64_t)3153600000000)
			timeout_ms = (int64_t)3153600000000;
		deadline.tv_sec += (time_t)(timeout_ms / 1000);
		deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
		if (deadline.tv_nsec >= 1000000000L) {
			deadline.tv_sec++;
			deadline.tv_nsec -= 1000000000L;
		}
	}

	pthread_mutex_lock(&future->lock);
	while (atomic_load_explicit(&future->state, memory_order_acquire) == FUTURE_PENDING) {
		if (timeout_ms < 0) {
			pthread_cond_wait(&future->cond, &future->lock);
		} else if (pthread_cond_timedwait(&future->cond, &future->lock, &deadline) ==
			   ETIMEDOUT) {
			if (atomic_load_explicit(&future->state, memory_order_acquire) ==
			    FUTURE_PENDING) {
				pthread_mutex_unlock(&future->lock);
				cli_set_error("future still pending after %lld ms",
					      (long long)timeout_ms);
				return -ETIMEDOUT;
			}
		}
	}
	pthread_mutex_unlock(&future->lock);
	return ckpt_future_poll(future);
}

const char *ckpt_future_error(const struct ckpt_future *future)
{
	if (!future ||
	    atomic_load_explicit(&future->state, memory_order_acquire) == FUTURE_PENDING ||
	    future->err == 0)
		return "";
	return future->msg;
}
