/* SPDX-License-Identifier: MIT */
/*
 * metrics.h - what the daemon counts for Prometheus, and the two ways it
 * hands that out: a tiny HTTP server on the event loop (metrics_listen, a
 * loopback address only: it has no authentication) answering GET /metrics in
 * the text exposition format 0.0.4, and a file (metrics_textfile) replaced
 * whole after every save's end and every 15 s, for node_exporter's textfile
 * collector (after a burst of saves, once a second at most).
 *
 * The HTTP side must never be a way to stall or crash the daemon: sockets
 * are non-blocking, a request is at most 8 KiB of head (no body is read), at
 * most 16 connections are open (a new one evicts the oldest that has not
 * sent a whole request yet), each has a deadline, and the answer is built
 * once into a buffer and written as the socket takes it.  The file is
 * written by a worker (metrics.c), never on the loop.
 *
 * Series are bounded: job names come from clients, so at most
 * METRICS_MAX_JOBS jobs get a series of their own and the rest share
 * job="(other)" (parentheses are not allowed in a job name, so no job can
 * be that bucket).  The endpoint shows every user's job names: anyone on the
 * node who can connect to the loopback address can read them.
 *
 * Everything here runs on the loop thread (server.h), but the textfile job.
 */
#ifndef CKPTD_METRICS_H
#define CKPTD_METRICS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct server;
struct save;
struct ev;

#define METRICS_MAX_JOBS 64
#define METRICS_MAX_CONNS 16
#define METRICS_REQUEST_MAX 8192
#define METRICS_TEXTFILE_EVERY_MS 15000

/* Where a save's bytes went (ckptd_bytes_written_total{backend}). */
enum metrics_backend { METRICS_LOCAL, METRICS_S3, METRICS_SPILL, METRICS_N_BACKENDS };

/* The phases of a save that are timed (ckptd_save_phase_seconds{phase}):
 *   stage   a rank's SAVE_BEGIN to its last byte staged
 *   write   staged to durable on the first tier (the local disk, S3 for a
 *           direct S3 save, the spill directory)
 *   upload  spilled: durable on the node to uploaded with its index
 *   commit  the commit job of rank 0's daemon (indexes merged, manifest,
 *           renames), the one that committed */
enum metrics_phase { METRICS_STAGE, METRICS_WRITE, METRICS_UPLOAD, METRICS_COMMIT,
		     METRICS_N_PHASES };

/* The last committed save someone may see (status.h "last_commit"). */
struct metrics_commit {
	bool set;
	uid_t uid;
	char *root;               /* malloc'd */
	char name[129], job[129];
	uint64_t step, bytes;
	int64_t at_ms;            /* now_ms() at the commit */
};

/*
 * [loop, setup] Makes the state (always: the counters feed the status
 * report) and, as configured, the listening socket (registered with epoll)
 * and the textfile's directory.  Returns 0; -EBUSY for a configuration that
 * cannot work (a missing directory: exit 78), logged; -errno else (a port
 * in use: exit 1), logged.
 */
int metrics_start(struct server *srv);
/* [teardown, after the workers stopped] Closes and frees everything. */
void metrics_stop(struct server *srv);

/* epoll events of the listening socket and of a connection (ev->ptr). */
void metrics_listen_event(struct ev *ev);
void metrics_conn_event(struct ev *ev, uint32_t events);
/* Every tick: deadlines, the textfile when due. */
void metrics_tick(struct server *srv);
/* Between loop rounds: frees connections closed during the round. */
void metrics_reap(struct server *srv);

/* ---- what save.c reports ---- */
void metrics_written(struct server *srv, enum metrics_backend b, uint64_t bytes);
void metrics_observe(struct server *srv, enum metrics_phase p, int64_t us);
/* A save became COMMITTED or FAILED (its state says which). */
void metrics_save_end(struct server *srv, const struct save *s);

/* ---- what status.c shows ---- */
/* The newest commit of uid's saves (all: of anyone's), or NULL. */
const struct metrics_commit *metrics_last_commit(const struct server *srv, uid_t uid, bool all);
/* "127.0.0.1:PORT" as bound (port 0 resolved), or NULL when off. */
const char *metrics_listen_addr(const struct server *srv);

/*
 * The exposition text as /metrics serves it; exposed for tests.  Returns 0
 * and a malloc'd *ret (len bytes), or -ENOMEM.
 */
int metrics_render(struct server *srv, char **ret, size_t *len);

#endif
