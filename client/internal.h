/* SPDX-License-Identifier: MIT */
/*
 * internal.h - libckpt's private structures, shared by the files of client/.
 *
 * Threads of one client:
 *   the caller(s)   build saves (add_*) and commit them: commit only queues;
 *   the save thread takes committed saves in FIFO order, lays each out,
 *                   hands its descriptor to the daemon (SAVE_BEGIN/ACK) and
 *                   publishes its extents to the copy threads;
 *   copy threads    claim extents of the active save, wait for a free slot,
 *                   fill it (header bytes, then item bytes through each
 *                   item's copy engine) and send EXTENT;
 *   the receiver    reads every daemon message: RELEASE frees slots,
 *                   SAVE_ACK wakes the save thread, SAVE_DONE completes the
 *                   committed future; EOF or garbage kills the connection.
 *
 * Locking: one mutex per client (cli.lock) guards the slot allocator, the
 * save queue, the pending list and every pipeline field of a save marked
 * "[lock]" below.  A future has its own mutex, taken only inside
 * future_complete()/ckpt_future_wait() and never while waiting on anything
 * else, so the order is always client lock -> future lock.
 *
 * Ordering rule: a save's staged future always completes before (or with)
 * its committed future, and only once no library thread can still read the
 * caller's memory for it.
 */
#ifndef CKPT_CLIENT_INTERNAL_H
#define CKPT_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "format/layout.h"
#include "shm/arena.h"
#include "shm/proto.h"

#define CLI_MAX_COPY_THREADS 64
#define CLI_DEFAULT_COPY_THREADS 2
#define CLI_DEFAULT_ARENA (1ull << 30)

/* ---- errors (error.c) ---- */

/* Sets this thread's ckpt_last_error() message. */
void cli_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- futures (future.c) ---- */

struct ckpt_future {
	pthread_mutex_t lock;
	pthread_cond_t cond;   /* CLOCK_MONOTONIC */
	atomic_int state;      /* FUTURE_PENDING until final; release-stored
	                        * after err/msg, acquire-loaded by poll */
	int err;               /* 0 or -errno, valid once final */
	char msg[PROTO_MSG_LEN];
};

enum { FUTURE_PENDING = 0, FUTURE_FINAL = 1 };

int future_init(struct ckpt_future *f);
void future_destroy(struct ckpt_future *f);
/* Completes f with err (0: success) and a reason (NULL: none).  Only the
 * first completion counts; later ones are ignored.  Wakes every waiter. */
void future_complete(struct ckpt_future *f, int err, const char *msg);

/* ---- copy engines (copy.c) ---- */

/*
 * A copy engine moves an item's bytes from where they live (host memory, a
 * GPU) into the arena.  The host engine is memcpy; a CUDA engine would issue
 * async copies in copy() and wait for them in sync().
 */
struct copy_engine {
	const char *name;
	/* Copies len bytes from src (the item's memory, at some offset) to dst
	 * (in the arena).  Returns 0 or -errno with a reason in err. */
	int (*copy)(void *dst, const void *src, size_t len, char *err, size_t errlen);
	/* Optional: waits until every copy() issued by this thread is done,
	 * called once per filled slot before it is handed to the daemon. */
	int (*sync)(char *err, size_t errlen);
};

extern const struct copy_engine copy_engine_host;

/* Selects the engine for memory on `device`.  Returns NULL with a reason in
 * err and *ret_err (-EOPNOTSUPP, -EINVAL) when there is none in this build. */
const struct copy_engine *copy_engine_select(enum ckpt_device device, int device_index,
					     int *ret_err, char *err, size_t errlen);

/* ---- saves (save.c) ---- */

/* Per item, parallel to layout.items: where its bytes come from. */
struct save_src {
	const void *data;
	const struct copy_engine *engine;
};

struct ckpt_save {
	struct ckpt_client *client;
	atomic_int refs;        /* caller + pipeline stage + pending list */
	bool committed;         /* set by commit (caller's thread) */
	uint32_t token;         /* set at commit */

	struct layout layout;
	struct save_src *src;   /* layout.n_items entries */
	size_t cap_src;
	uint32_t *set;          /* open-addressed name set: item index + 1 */
	size_t set_cap;         /* power of two, or 0 */

	struct ckpt_future staged;
	struct ckpt_future committed_f;

	/* Built by the save thread, read by copy threads. */
	char *hdr;              /* the file prefix [0, data_start) */

	/* Pipeline state [lock]. */
	struct ckpt_save *q_next;       /* save queue link */
	struct ckpt_save *p_next;       /* pending list link */
	bool on_pending;                /* accepted, waiting for SAVE_DONE */
	bool acked;                     /* SAVE_ACK arrived */
	int ack_err;
	char ack_msg[PROTO_MSG_LEN];
	uint32_t desc_first, desc_count; /* descriptor slots until ACK */
	uint64_t n_ext, next_ext, sent, inflight;
	bool failed;                    /* staging stops: see fail_err */
	int fail_err;
	char fail_msg[PROTO_MSG_LEN];
	bool staging_done;              /* staged future completed */
	bool has_done;                  /* committed result known (stashed) */
	int done_err;
	char done_msg[PROTO_MSG_LEN];
};

void save_unref(struct ckpt_save *s);

/* ---- client (client.c) ---- */

struct ckpt_client {
	int sock;
	uint32_t rank, world, client_id;
	char job[CKPT_MAX_JOB_LEN + 1];
	void *arena;
	uint64_t arena_bytes, slot_bytes;

	pthread_mutex_t lock;
	pthread_cond_t slot_cv;  /* a slot was released, or the connection died */
	pthread_cond_t copy_cv;  /* copy threads: an active save has extents */
	pthread_cond_t save_cv;  /* save thread / disconnect: queue, ACK,
	                          * extents finished, staging count */

	/* [lock] */
	struct arena_slots slots;
	bool dead;                /* the connection is lost */
	char dead_msg[PROTO_MSG_LEN];
	bool stopping;            /* disconnect: threads exit */
	uint32_t next_token;
	struct ckpt_save *q_head, *q_tail; /* committed, not yet started */
	struct ckpt_save *awaiting_ack;   /* SAVE_BEGIN sent */
	struct ckpt_save *active;         /* extents published to copy threads */
	struct ckpt_save *pending;        /* accepted, waiting for SAVE_DONE */
	unsigned staging;                 /* committed saves not yet staged/failed */

	pthread_t recv_thread, save_thread;
	pthread_t copy_threads[CLI_MAX_COPY_THREADS];
	unsigned n_copy;
	bool recv_started, save_started;
};

/* Marks the connection dead (idempotent): fails every pending committed
 * future with -ECONNRESET ("connection to ckptd lost: <detail>"), wakes every
 * waiter and shuts the socket down.  Caller holds c->lock. */
void cli_conn_dead_locked(struct ckpt_client *c, const char *detail);

/* Completes s's committed future with err/msg if its staging is over, else
 * stashes the result for the save thread.  Removes s from the pending list
 * (dropping that reference).  Caller holds c->lock. */
void save_finish_locked(struct ckpt_client *c, struct ckpt_save *s, int err, const char *msg);

/* Ends the staging of an accepted save once no copy thread works on it any
 * more (or once every extent is sent): completes the staged future, and the
 * committed one if its result is known.  Idempotent.  Returns true if the
 * daemon must be told to abort the save (SAVE_ABORT, sent by the caller
 * without the lock).  Caller holds c->lock. */
bool save_stage_end_locked(struct ckpt_client *c, struct ckpt_save *s);

/* Thread bodies. */
void *save_thread_main(void *arg);
void *copy_thread_main(void *arg);

/* ---- helpers ---- */

static inline uint64_t cli_div_up(uint64_t a, uint64_t b)
{
	return a / b + (a % b != 0);
}

#endif
