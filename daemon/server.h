/* SPDX-License-Identifier: MIT */
/*
 * server.h - the daemon as a whole: its event loop's state, the lists of
 * connections and saves, and the counters the status report shows.
 *
 * One thread (the loop) owns everything here and in conn.h, save.h and
 * writer.h; nothing of it is locked.  Blocking work goes to worker threads
 * (worker.h) and comes back as done() callbacks on the loop, and so does
 * CPU work that grows with the bytes (checksums: server.crcs).  The loop
 * never waits on the disk and does only bookkeeping, so one client's commit
 * never stalls another's messages: `max_stall_us` measures that promise.
 */
#ifndef CKPTD_SERVER_H
#define CKPTD_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/config.h"
#include "daemon/creds.h"
#include "daemon/list.h"
#include "daemon/registry.h"
#include "daemon/status.h"
#include "daemon/worker.h"
#include "store/store.h"

/* What an epoll event points at. */
enum ev_kind {
	EV_LISTEN = 1,
	EV_CONN,
	EV_IO,
	EV_SIGNAL,
	EV_TIMER,
	EV_WORK,
	EV_POOL,
	EV_METRICS_LISTEN,
	EV_METRICS_CONN,
};
struct ev {
	enum ev_kind kind;
	void *ptr;
};

struct metrics;
struct retention;

struct server {
	struct config cfg;
	const struct store_ops *store;
	struct store_writer self;   /* this daemon's id and instance */
	struct creds creds;         /* its own credentials */
	struct registry reg;
	struct workers work;        /* file-system jobs */
	struct workers arenas;      /* making arenas (seconds each) */
	struct workers crcs;        /* checksums of arena slots (writer.h) */
	struct workers uploads;     /* uploads of spilled shards (spill tier) */
	struct workers prunes;      /* retention passes (retention.h): one thread,
	                             * nice 19 */
	struct retention *retention;
	struct workers s3_reads;    /* ranged GETs for clients' loads (loadio.h);
	                             * n == 0: S3 is not set up */
	struct workers renewals;    /* saves' heartbeats (store_ops.attempt_renew):
	                             * threads of their own, so that no slow job
	                             * holds one back; n == 0: S3 is not set up */
	int epfd, lfd, sigfd, tfd;
	struct ev ev_listen, ev_sig, ev_timer, ev_work, ev_arenas, ev_crcs, ev_uploads, ev_s3_reads;
	struct ev ev_prunes, ev_renewals;
	struct list conns, saves;
	unsigned n_conns;
	uint32_t next_id;
	uint64_t arena_in_use;
	struct list images;         /* resident.h, least recently used first */
	uint64_t resident_bytes;    /* bytes of all images (reserved or made) */
	uint32_t lent_fds;          /* descriptors clients lent (loadio.h) */
	struct list pools;          /* share.h: one per (uid, job) that shares loads */
	struct list dead_pools;     /* freed this round of the loop */
	uint64_t share_bytes;       /* bytes of all pools (reserved or made) */
	uint32_t pool_gen;          /* the last pool's gen */
	struct sfile *sfiles[256];  /* share.h: lent files, hashed by (uid, dev, ino) */
	uint64_t load_disk_bytes;   /* bytes loads had ckptd read from storage */
	uint64_t load_shared_bytes; /* bytes loads got from another load's read */
	uint64_t load_s3_bytes;     /* bytes loads had ckptd GET from S3 */
	struct list s3_conns;       /* conns with S3 reads waiting, in turn */
	unsigned s3_submitted;      /* S3 reads on the workers (<= their n) */
	bool stopping;
	bool parking;               /* saves_stop(all): pending saves are parked */
	int64_t start_ms, last_sweep_ms;
	bool sweeping;
	struct work sweep_job;
	/* Counters for the status report. */
	uint64_t saves_committed, saves_failed, saves_refused, bytes_written;
	uint64_t prune_deleted, prune_errors; /* checkpoints retention removed, or
	                                       * failed to remove */
	uint64_t conns_evicted;     /* idle connections closed to admit another
	                             * user's (users.h) */
	struct metrics *metrics;    /* metrics.h: counters, HTTP, the textfile */
	int64_t max_stall_us;       /* longest round of the loop (wall time) */
	int64_t max_busy_us;        /* most CPU time the loop used in one round:
	                             * a stall much longer than this was the loop
	                             * waiting for a CPU, not working */
	struct status_rate s3_up;   /* S3 upload rate samples (status.h) */
};

/* CLOCK_MONOTONIC in milliseconds / microseconds (clock.c). */
int64_t now_ms(void);
int64_t now_us(void);
/* CPU time of the calling thread, microseconds (clock.c). */
int64_t thread_cpu_us(void);

#endif
