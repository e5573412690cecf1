/* SPDX-License-Identifier: MIT */
/*
 * worker.h - the daemon's worker threads: everything that may block.
 *
 * The event loop never waits on the disk: creating directories and files,
 * fallocate, fsync, writing indexes and manifests, renames, removals and
 * sweeps, and unmapping large arenas are jobs for these threads.  A job runs
 * with the credentials it names (creds.h), then its `done` callback runs on
 * the loop thread, which learns of finished jobs through an eventfd.
 *
 * Ownership: the submitter owns the job and everything it points at until
 * `done` runs; run() touches only the job and what the job owns or what does
 * not change while a job is in flight (the configuration, a layout the save
 * holds read-only).  It never touches loop state.
 */
#ifndef CKPTD_WORKER_H
#define CKPTD_WORKER_H

#include <pthread.h>
#include <stdbool.h>

#include "daemon/creds.h"
#include "shm/proto.h"

struct work {
	/* On a worker thread, acting as *creds (NULL: the daemon itself).
	 * Sets res (0 or -errno) and, on failure, err. */
	void (*run)(struct work *w);
	/* On the loop thread, once run() returned (also after a creds
	 * failure, with res and err set and run() not called). */
	void (*done)(struct work *w);
	const struct creds *creds;
	int res;
	char err[PROTO_MSG_LEN];
	struct work *next; /* private */
};

struct workers {
	pthread_mutex_t lock;
	pthread_cond_t cv;
	struct work *q_head, *q_tail;   /* submitted, not started */
	struct work *d_head, *d_tail;   /* finished, done() not run */
	unsigned in_flight;             /* submitted, done() not run */
	bool stopping;
	int efd;                        /* readable when d_head is not empty */
	unsigned n;
	int nice;                       /* the threads' nice value */
	pthread_t th[16];
};

/* Starts n (1..16) threads at nice value `nice` (0..19: 0 is the daemon's
 * own priority, more yields the CPU to everything else).  Returns 0 or
 * -errno. */
int workers_start(struct workers *w, unsigned n, int nice);
/* Queues a job (loop thread). */
void workers_submit(struct workers *w, struct work *job);
/* Runs the done() callbacks of finished jobs (loop thread).  Returns how
 * many ran. */
unsigned workers_complete(struct workers *w);
/* Jobs submitted whose done() has not run yet. */
unsigned workers_in_flight(struct workers *w);
/* Lets the threads finish the queue, joins them and runs the remaining
 * done() callbacks. */
void workers_stop(struct workers *w);

#endif
