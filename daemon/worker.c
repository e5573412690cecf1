/* SPDX-License-Identifier: MIT */
/* worker.c - see worker.h. */
#include "daemon/worker.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include "daemon/log.h"

static void *worker_main(void *arg)
{
	struct workers *w = arg;
	struct creds self;
	int r;

	creds_self(&self);
	/* Lowering one's own priority needs no privilege; on Linux the nice
	 * value of a thread is its own (setpriority on its thread id). */
	if (w->nice && setpriority(PRIO_PROCESS, (id_t)gettid(), w->nice) < 0)
		log_warn("worker: setpriority(%d): %s", w->nice, strerror(errno));
	r = creds_thread_init();
	if (r < 0)
		log_warn("worker: unshare(CLONE_FS): %s (umask shared with the loop)", strerror(-r));

	pthread_mutex_lock(&w->lock);
	for (;;) {
		struct work *job;

		while (!w->q_head && !w->stopping)
			pthread_cond_wait(&w->cv, &w->lock);
		job = w->q_head;
		if (!job)
			break;
		w->q_head = job->next;
		if (!w->q_head)
			w->q_tail = NULL;
		pthread_mutex_unlock(&w->lock);

		job->res = 0;
		job->err[0] = '\0';
		r = creds_apply(job->creds ? job->creds : &self, job->err, sizeof(job->err));
		if (r < 0)
			job->res = r;
		else
			job->run(job);
		if (job->creds && creds_apply(&self, job->err, 0) < 0)
			log_err("worker: cannot return to the daemon's own credentials");

		pthread_mutex_lock(&w->lock);
		job->next = NULL;
		if (w->d_tail)
			w->d_tail->next = job;
		else
			w->d_head = job;
		w->d_tail = job;
		{
			uint64_t one = 1;
			if (write(w->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
				log_err("worker: eventfd: %s", strerror(errno));
		}
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

int workers_start(struct workers *w, unsigned n, int nice)
{
	int r;

	memset(w, 0, sizeof(*w));
	if (n < 1 || n > 16 || nice < 0 || nice > 19)
		return -EINVAL;
	w->nice = nice;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cv, NULL);
	w->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (w->efd < 0)
		return -errno;
	for (w->n = 0; w->n < n; w->n++) {
		r = pthread_create(&w->th[w->n], NULL, worker_main, w);
		if (r != 0) {
			workers_stop(w);
			return -r;
		}
	}
	return 0;
}

void workers_submit(struct workers *w, struct work *job)
{
	pthread_mutex_lock(&w->lock);
	job->next = NULL;
	if (w->q_tail)
		w->q_tail->next = job;
	else
		w->q_head = job;
	w->q_tail = job;
	w->in_flight++;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->lock);
}

unsigned workers_complete(struct workers *w)
{
	struct work *list;
	uint64_t junk;
	unsigned n = 0;

	if (read(w->efd, &junk, sizeof(junk)) < 0 && errno != EAGAIN)
		log_debug("worker eventfd: %s", strerror(errno));
	pthread_mutex_lock(&w->lock);
	list = w->d_head;
	w->d_head = w->d_tail = NULL;
	pthread_mutex_unlock(&w->lock);
	while (list) {
		struct work *job = list;
		list = job->next;
		pthread_mutex_lock(&w->lock);
		w->in_flight--;
		pthread_mutex_unlock(&w->lock);
		/* done() may free the job: nothing of it is used afterwards. */
		job->done(job);
		n++;
	}
	return n;
}

unsigned workers_in_flight(struct workers *w)
{
	unsigned n;

	pthread_mutex_lock(&w->lock);
	n = w->in_flight;
	pthread_mutex_unlock(&w->lock);
	return n;
}

void workers_stop(struct workers *w)
{
	pthread_mutex_lock(&w->lock);
	w->stopping = true;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->lock);
	for (unsigned i = 0; i < w->n; i++)
		pthread_join(w->th[i], NULL);
	w->n = 0;
	while (workers_in_flight(w))
		if (!workers_complete(w))
			break;
	if (w->efd >= 0)
		close(w->efd);
	w->efd = -1;
}
