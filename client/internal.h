/* SPDX-License-Identifier: MIT */
/*
 * internal.h - libckpt's private structures, shared by the files of client/.
 *
 * Files: client.c (connect, the receiver thread, disconnect), conn.c (the
 * socket and the HELLO handshake), save.c (the save API, the save state
 * machine and the save thread), copy.c (copy engines and threads), future.c,
 * reader.c, env.c (what the library reads from the process: CPUs, umask,
 * run id), abi.c (caller structs of any size), log.c, error.c, version.c.
 *
 * Threads of one client:
 *   the caller(s)   build saves (add_*) and commit them: commit only queues;
 *   the save thread takes committed saves in FIFO order, lays each out,
 *                   hands its descriptor to the daemon (SAVE_BEGIN/ACK) and
 *                   publishes its extents to the copy threads;
 *   copy threads    claim extents of the active save, wait for a free slot,
 *                   fill it (header bytes, then item bytes through each
 *                   item's copy engine) and send EXTENT;
 *   the receiver    reads every daemon message: RELEASE frees slots, and
 *                   SAVE_ACK / SAVE_DONE go to save.c; EOF or garbage kills
 *                   the connection.
 *
 * Locking: one mutex per client (cli.lock) guards the slot allocator, the
 * save queue, the pending list and every pipeline field of a save marked
 * "[lock]" below.  A future has its own mutex, taken only inside
 * future_complete()/ckpt_future_wait() and never while waiting on anything
 * else, so the order is always client lock -> future lock.  The log lock
 * (log.c) is taken last: client lock -> log lock, never the reverse.
 *
 * Ordering rule: a save's staged future always completes before (or with)
 * its committed future, and only once no library thread can still read the
 * caller's memory for it.  Every state change of a save happens in save.c
 * (save_set_state_locked), which keeps this rule.
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
#include "format/nameset.h"
#include "shm/arena.h"
#include "shm/proto.h"

#define CLI_MAX_COPY_THREADS 64
/* Added to the copy threads' nice value unless $CKPT_COPY_NICE says otherwise. */
#define CLI_COPY_NICE_DEFAULT 0
#define CLI_DEFAULT_ARENA (1ull << 30)
#define CLI_ATTEMPT_NAMES 64 /* names whose attempt count a client remembers */

/* ---- errors (error.c) and logging (log.c) ---- */

/* Sets this thread's ckpt_last_error() message. */
void cli_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* True if a log callback is set (so a caller can skip costly formatting). */
bool cli_log_enabled(void);
/* Formats a message and hands it to the log callback, if one is set. */
void cli_log(enum ckpt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Monotonic clock in nanoseconds, for timings in log messages. */
uint64_t cli_now_ns(void);

/* ---- caller structs of any size (abi.c) ---- */

/* Largest `size` read from a caller's struct; beyond it, -E2BIG unread. */
#define ABI_MAX_STRUCT 4096

/* A public struct that starts with a uint32_t size field. */
struct abi_struct {
	const char *name;       /* "struct ckpt_tensor", for messages */
	const char *init;       /* its _INIT macro, for messages */
	size_t size;            /* sizeof it in this library */
	size_t min_size;        /* its first version's size */
};

extern const struct abi_struct abi_connect_opts, abi_save_opts, abi_tensor, abi_load_dst,
	abi_load_tensor;

/*
 * Copies the caller's struct `src` (as long as its size field says) into
 * dst (t->size bytes), as openat2() does: fields past the caller's size
 * read as zero.  Returns 0, -EINVAL (size below t->min_size), or -E2BIG
 * (larger than ABI_MAX_STRUCT, or larger than t->size with a non-zero byte
 * this library does not know).  Sets ckpt_last_error() on failure,
 * prefixed with fn.
 */
int abi_copy_in(const struct abi_struct *t, void *dst, const void *src, const char *fn);

/* ---- the process environment (env.c) ---- */

/* CPUs this process may run on (sched_getaffinity), at least 1. */
unsigned env_cpu_count(void);

/*
 * Default number of copy threads: `cpus` divided by the ranks on this node
 * (local_world_size: the text of $LOCAL_WORLD_SIZE, NULL if unset; ignored
 * unless a whole number in 1..CKPT_MAX_WORLD), at least 1, at most
 * CLI_MAX_COPY_THREADS.  Writes how it was chosen to why (for the log).
 */
unsigned env_copy_threads_default(unsigned cpus, const char *local_world_size, char *why,
				  size_t whylen);

/* Parses the "Umask:" line of /proc/<pid>/status text.  Returns 0 and the
 * mask (<= 0777), or -ENOENT (no such line), -EBADMSG (not an octal mask). */
int env_parse_umask(const char *status, unsigned *ret_umask);

/* The process's umask, read without changing it (umask(2) cannot be read
 * without setting it, which would race with other threads creating files).
 * Returns 0 and the mask, or -errno if /proc/self/status is unreadable: the
 * caller then falls back to 022. */
int env_umask(unsigned *ret_umask);

/* Looks an environment variable up (getenv in the library; a table in
 * tests). */
typedef char *(*env_get_fn)(const char *name);

/*
 * The run id (ckpt.h explains the order): opt_run if not NULL (validated),
 * else the first of $CKPT_RUN_ID, torchrun's and SLURM's variables that is
 * set and not empty, made to fit [A-Za-z0-9._-]{1,CKPT_MAX_RUN_LEN}; else "".
 * `source` tells where it came from ("options", "CKPT_RUN_ID", ...).
 * Returns 0, or -EINVAL (bad opt_run; reason in err).
 */
int env_run_id(const char *opt_run, env_get_fn get, char ret_run[CKPT_MAX_RUN_LEN + 1],
	       const char **ret_source, char *err, size_t errlen);

/* ---- the connection to the daemon (conn.c) ---- */

/*
 * Connects to `path`, sends `hello` and waits for the answer, all within
 * timeout_ms (< 0: no limit).  Returns 0 with the connected socket, the
 * HELLO_OK message and the arena fd, or -errno with the reason in
 * ckpt_last_error(): -ETIMEDOUT, -ENOENT/-ECONNREFUSED (nobody listens), the
 * daemon's errno when it refused (its ERROR message is read even when the
 * refusal surfaced as a failed send or a reset), -EPROTO.
 */
int conn_open(const char *path, const struct proto_hello *hello, int64_t timeout_ms,
	      int *ret_sock, struct proto_hello_ok *ret_ok, int *ret_fd);

/*
 * After a send or receive on sock failed during the handshake: reads a
 * refusal (an ERROR message) the daemon queued before closing, without
 * blocking.  Returns its errno (< 0) with its text in msg, or 0 if none.
 */
int conn_read_refusal(int sock, char *msg, size_t msglen);

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

/*
 * The life of a save.  save.c's opening comment has the transitions.
 *
 *   BUILDING    the caller adds items (only the caller's thread touches it)
 *   QUEUED      committed, on the client's queue
 *   BEGUN       the save thread lays it out, sends SAVE_BEGIN, awaits ACK;
 *               copy threads fill slots already and park them
 *   STAGING     accepted: copy threads fill and send its extents   [pending]
 *   DONE_EARLY  the daemon reported the commit while the copy thread that
 *               sent the last extent had not yet counted it
 *   ABORTING    staging failed here: copies stop, the daemon is told
 *               (SAVE_ABORT) once none is in flight                [pending]
 *   DRAINING    staging failed at the daemon or the connection was lost:
 *               copies stop, nothing to tell the daemon
 *   STAGED      staged future completed; awaits SAVE_DONE          [pending]
 *   FINISHED    both futures are final
 *
 * [pending]: the daemon holds the save and will report SAVE_DONE; exactly
 * these saves are on the client's pending list (with a reference).
 */
enum save_state {
	SAVE_BUILDING,
	SAVE_QUEUED,
	SAVE_BEGUN,
	SAVE_STAGING,
	SAVE_DONE_EARLY,
	SAVE_ABORTING,
	SAVE_DRAINING,
	SAVE_STAGED,
	SAVE_FINISHED,
	SAVE_STATE_COUNT
};

/* Per item, parallel to layout.items: where its bytes come from. */
struct save_src {
	const void *data;
	const struct copy_engine *engine;
	/* CKPT_DEVICE_CUDA: the device, the caller's stream (stream_set: from
	 * the tensor, else the save's), and the save's start event for that
	 * (device, stream), set at commit (cuda.c). */
	int32_t device;
	bool stream_set;
	void *stream;
	uint32_t start;
};

/* CUDA (client/cuda.c; stubs in a build without it).  A copy thread's
 * extent whose device copies are still running. */
#ifdef CKPT_HAVE_CUDA
#include "cuda/cuxfer.h"
typedef struct cuxfer_pending cli_cuda_pending;
#else
typedef struct {
	unsigned n;
} cli_cuda_pending;
#endif
struct ckpt_client;
struct ckpt_save;
/* At connect / disconnect (after the copy threads stopped, before the arena
 * is unmapped). */
int cli_cuda_open(struct ckpt_client *c, enum ckpt_cuda_pin pin, char *err, size_t errlen);
void cli_cuda_close(struct ckpt_client *c);
/* add_tensor: checks a device tensor's memory (loads CUDA on first use). */
int cli_cuda_check(struct ckpt_client *c, const void *data, uint64_t bytes, int device, char *err,
		   size_t errlen);
/* Commit, on the caller's thread: records the start events of s. */
int cli_cuda_commit(struct ckpt_client *c, struct ckpt_save *s, char *err, size_t errlen);
/* Frees s's start events. */
void cli_cuda_save_free(struct ckpt_save *s);
/* Copy thread: queues a copy of item i's bytes [from, from + n) to dst. */
int cli_cuda_copy(struct ckpt_client *c, const struct ckpt_save *s, size_t i, void *dst,
		  const void *from, size_t n, cli_cuda_pending *p, char *err, size_t errlen);
/* After an extent's copies: 0 when none is pending; else marks them. */
int cli_cuda_mark(struct ckpt_client *c, cli_cuda_pending *p, char *err, size_t errlen);
/* 0 done, -EAGAIN (not yet; only without wait), or -errno with err. */
int cli_cuda_poll(struct ckpt_client *c, cli_cuda_pending *p, bool wait, char *err, size_t errlen);
/* Restore: len bytes of host memory src (the arena or any) to device memory
 * dst of device `device`, after the work queued on `stream` (NULL: the
 * legacy default stream), waited for (cuxfer_h2d).  Checks dst like a
 * device tensor first.  0 or -errno with err (-EOPNOTSUPP without CUDA). */
int cli_cuda_h2d(struct ckpt_client *c, int device, void *dst, const void *src, size_t len,
		 void *stream, char *err, size_t errlen);
/* The engine of CKPT_DEVICE_CUDA items (fill_extent sends them to
 * cli_cuda_copy instead of ->copy). */
extern const struct copy_engine copy_engine_cuda;

/*
 * Loads (load.c) have no client, so a load with device destinations has a
 * CUDA context of its own: a struct cuxfer whose "arena" is the load's
 * bounce buffers.  Thread-safe (cuxfer locks inside).  In a build without
 * CUDA, open fails with -EOPNOTSUPP and a message saying so.
 */
struct cuxfer;
/* Opens one over [arena, arena + len), pinned at the first
 * cli_cuda_load_check(); arena NULL: never pinned (checks only).  Returns
 * 0 and *ret, or -errno with err. */
int cli_cuda_load_open(void *arena, uint64_t len, struct cuxfer **ret, char *err, size_t errlen);
/* Unpins (before the caller frees the arena) and frees streams and events;
 * every copy must have returned.  Accepts NULL. */
void cli_cuda_load_close(struct cuxfer *x);
/* Checks that [data, data + len) is memory of CUDA device `device`; pins the
 * arena first if not tried yet (a failure to pin is logged, not returned).
 * len 0 only pins and checks the device exists.  0 or -errno with err:
 * -ENODEV (no runtime or no such device), -EINVAL (not that device's
 * memory). */
int cli_cuda_load_check(struct cuxfer *x, const void *data, uint64_t len, int device, char *err,
			size_t errlen);
/* Copies len bytes of host memory src to device memory dst of `device`
 * and waits for it (cuxfer_h2d, after the work queued on the legacy default
 * stream).  0 or -errno with err. */
int cli_cuda_load_h2d(struct cuxfer *x, int device, void *dst, const void *src, size_t len,
		      char *err, size_t errlen);

struct ckpt_save {
	struct ckpt_client *client;
	atomic_int refs;        /* caller + pipeline stage + pending list */
	/* enum save_state.  Written under the client lock (save.c only);
	 * atomic so that the caller's add_* may read it without the lock: it
	 * only asks "still BUILDING?", which only its own thread changes. */
	atomic_int state;
	uint32_t token;         /* set at commit */
	uint32_t attempt;       /* set at begin: earlier begins of this name */

	/* BUILDING: the first failed set_* / add_* call (0: none). */
	int poison_err;
	char poison_msg[PROTO_MSG_LEN];

	struct layout layout;
	struct save_src *src;   /* layout.n_items entries */
	size_t cap_src;
	struct nameset names;   /* item names -> index (format/nameset) */

	struct ckpt_future staged;
	struct ckpt_future committed;
	struct ckpt_future durable;
	bool durable_seen;      /* SAVE_DURABLE arrived (under the client lock) */

	/* CUDA: the default stream of device items (set_cuda_stream), and one
	 * start event per (device, stream) recorded at commit. */
	void *cuda_stream;
	struct cli_cuda_start {
		int32_t device;
		void *stream;
		void *event; /* cudaEvent_t */
	} *starts;
	uint32_t n_starts;

	/* Built by the save thread, read by copy threads. */
	char *hdr;              /* the file prefix [0, data_start) */

	/* Pipeline [lock]. */
	struct ckpt_save *q_next;       /* save queue link */
	struct ckpt_save *p_next;       /* pending list link */
	uint32_t desc_first, desc_count; /* descriptor slots until ACK */
	uint64_t n_ext, next_ext, sent, inflight;
	bool accepted;                  /* SAVE_ACK said yes */
	int fail_err;                   /* ABORTING/DRAINING, or BEGUN after a
	                                 * copy failed: first failure */
	char fail_msg[PROTO_MSG_LEN];
	uint64_t t_commit_ns, t_staged_ns; /* for the debug log */
};

void save_unref(struct ckpt_save *s);

/* Copy threads may claim extents of s (STAGING or DONE_EARLY, or BEGUN
 * with no copy failed yet).  [lock] */
bool save_copying(const struct ckpt_save *s);
/* s awaits the daemon's answer to SAVE_BEGIN: filled slots are parked.
 * [lock] */
bool save_awaits_ack(const struct ckpt_save *s);

/* Drops a claim on an extent of s (a copy thread's, or a parked extent
 * the save thread sent); wakes the save thread at the last (copy.c).
 * [lock] */
void save_extent_done_locked(struct ckpt_client *c, struct ckpt_save *s);

/* The EXTENT message for extent k of s, filled in slot `slot` (copy.c). */
void cli_extent_msg(const struct ckpt_client *c, const struct ckpt_save *s, uint32_t slot,
		    uint64_t k, struct proto_extent *ext);

/* Sends n EXTENT messages of s in as few system calls as the socket
 * allows, then counts each as sent (or not, if the connection failed: it is
 * then marked dead) and drops its claim (copy.c).  [lock]; dropped while
 * sending. */
void cli_send_extents_locked(struct ckpt_client *c, struct ckpt_save *s,
			     const struct proto_extent *ext, unsigned n);

/* Transitions, each under c->lock.  Every one wakes whoever may wait on
 * the change. */

/* Fails s with err/msg from whatever state it is in (the first failure
 * wins; a finished save is left alone).  daemon_done: the daemon has given
 * the save up itself or can no longer be told (connection lost), so no
 * SAVE_ABORT is due. */
void save_fail_locked(struct ckpt_client *c, struct ckpt_save *s, int err, const char *msg,
		      bool daemon_done);

/* A copy thread sent one more extent of s. */
void save_extent_sent_locked(struct ckpt_client *c, struct ckpt_save *s);

/* SAVE_ACK / SAVE_DONE from the daemon (the receiver).  Return 0, or
 * -EBADMSG with the reason in detail when the message breaks the protocol. */
int save_on_ack_locked(struct ckpt_client *c, const struct proto_save_result *m, char *detail,
		       size_t dlen);
int save_on_durable_locked(struct ckpt_client *c, const struct proto_save_result *m,
			   char *detail, size_t dlen);
int save_on_done_locked(struct ckpt_client *c, const struct proto_save_result *m, char *detail,
			size_t dlen);

/* The connection is lost (c->dead is set): fails every save the daemon
 * held or was about to hold.  c->dead_msg is the reason. */
void saves_conn_lost_locked(struct ckpt_client *c);

/* The client goes away: fails every save still waiting for SAVE_DONE with
 * -ECONNABORTED. */
void saves_abandon_locked(struct ckpt_client *c);

/* Thread bodies. */
void *save_thread_main(void *arg);
void *copy_thread_main(void *arg);
int env_copy_nice(const char *value);

/* ---- client (client.c) ---- */

/* Attempt counts of recently begun checkpoint names (least recently used
 * one replaced). */
struct attempt_entry {
	char name[CKPT_MAX_NAME_LEN + 1];
	uint32_t count;         /* saves of this name begun */
	uint64_t used;          /* last use, for replacement */
};

struct ckpt_client {
	int sock;
	uint32_t rank, world, client_id;
	char job[CKPT_MAX_JOB_LEN + 1];
	char run[CKPT_MAX_RUN_LEN + 1];
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
	struct ckpt_save *q_head, *q_tail; /* QUEUED, in commit order */
	struct ckpt_save *awaiting_ack;   /* BEGUN with SAVE_BEGIN sent */
	struct ckpt_save *active;         /* extents published to copy threads */
	/* Slots of the active save filled while it was BEGUN, to be sent
	 * (or given back) by the save thread; slots.n_slots entries. */
	struct parked {
		uint32_t slot;
		uint64_t ext;
	} *parked;
	uint32_t n_parked;
	struct ckpt_save *pending;        /* the [pending] states */
	unsigned staging;                 /* committed saves the save thread
	                                   * has not finished with */
	struct attempt_entry attempts[CLI_ATTEMPT_NAMES];
	uint64_t attempt_clock;

	void *cuda;                       /* struct cuxfer (client/cuda.c) */

	/* RESIDENT_REQ, one at a time (cli_resident_get): [lock] */
	pthread_cond_t res_cv;            /* the reply came, the slot is free,
	                                   * or the connection died */
	bool res_busy;                    /* a request is out */
	uint32_t res_token;               /* its token (0: none awaited) */
	uint32_t res_next;                /* tokens handed out */
	bool res_done;
	int res_err, res_fd;
	uint64_t res_size;
	char res_msg[PROTO_MSG_LEN];

	/* Reads through the daemon (LOAD_*): [lock] */
	struct cli_lread *lwaits;         /* LOAD_READs awaiting LOAD_DONE */
	uint32_t lreads_held;             /* reserved (cli_load_reserve) */
	char spill_dir[PROTO_MSG_LEN];    /* the daemon's S3 spill tier, or "" */
	bool share;                       /* offer PROTO_LOAD_SHARE (unless
	                                   * CKPT_LOAD_SHARE=0) */
	struct cli_pool *pools;           /* the daemon's pools mapped, newest
	                                   * first (older ones go when unused) */
	uint32_t lread_next;              /* tokens handed out */
	uint64_t lhandles[PROTO_LOAD_FILES / 64]; /* handles in use: 1 bits */

	pthread_t recv_thread, save_thread;
	pthread_t copy_threads[CLI_MAX_COPY_THREADS];
	unsigned n_copy;
	int copy_nice;                    /* added to the copy threads' nice
	                                   * value (env_copy_nice) */
	bool recv_started, save_started;
};

/* Marks the connection dead (idempotent): fails every pending save with
 * -ECONNRESET ("connection to ckptd lost: <detail>"), wakes every waiter
 * and shuts the socket down.  Caller holds c->lock. */
void cli_conn_dead_locked(struct ckpt_client *c, const char *detail);

/*
 * Asks the daemon for the resident image of `rank`'s file of checkpoint
 * attempt `attempt` at the checkpoint path whose hash is `where` (proto.h,
 * RESIDENT_REQ; resident.h of the daemon).  Returns 0 with a read-only
 * fd in *ret_fd (the caller closes it) and the file's size in *ret_size;
 * -ENOENT if the daemon does not hold it; -ECONNRESET if the connection is
 * lost; -ETIMEDOUT (no answer within timeout_ms); -EINVAL (attempt too
 * long).  Any thread; one request goes out at a time.
 */
int cli_resident_get(struct ckpt_client *c, const char *attempt, const char *where,
		     uint32_t rank, int64_t timeout_ms, int *ret_fd, uint64_t *ret_size);

/*
 * Reads through the daemon (proto.h LOAD_*; daemon/loadio.h).
 *
 * cli_load_lend: lends the daemon descriptor fd (a regular file the caller
 * opened for reading; the caller keeps its own) under a new handle, in
 * *ret_handle.  Returns 0, -EMFILE (no handle free), -ECONNRESET, -errno.
 * cli_load_unlend: gives the handle back (LOAD_CLOSE).
 * cli_arena_take: takes `count` contiguous slots of the client's arena for
 * reads, waiting up to timeout_ms for saves to give some back; the first
 * slot, or -ETIMEDOUT, -ECONNRESET, -E2BIG (more than the arena has).
 * cli_arena_put: gives them back.
 * cli_load_send: asks for file bytes [file_off, +len) of handle in the
 * arena at arena_off (all multiples of PROTO_LOAD_ALIGN, len at most
 * PROTO_LOAD_MAX, inside slots the caller took); cli_load_wait waits for
 * the answer: the bytes read (fewer than len only at the end of the file)
 * or -errno.  With offer, the daemon may answer in its pool instead
 * (PROTO_LOAD_SHARE): the cli_lread says where the bytes are.  Any thread.
 */
int cli_load_lend(struct ckpt_client *c, int fd, uint32_t *ret_handle);
/* An S3 checkpoint's shard instead (LOAD_OBJECT): ckpt is the checkpoint's
 * canonical s3:// URL, file the shard's name, size its size; the daemon
 * reads it with ranged GETs.  -ENAMETOOLONG if the names do not fit. */
int cli_load_lend_object(struct ckpt_client *c, const char *ckpt, const char *file,
			 uint64_t size, uint32_t *ret_handle);
void cli_load_unlend(struct ckpt_client *c, uint32_t handle);
int64_t cli_arena_take(struct ckpt_client *c, uint32_t count, int64_t timeout_ms);
void cli_arena_put(struct ckpt_client *c, uint32_t first, uint32_t count);
struct cli_lread;

/* A pool of the daemon (daemon/share.h) mapped read-only. */
struct cli_pool {
	uint32_t gen;
	int fd;                           /* read-only, for windows (load.c) */
	const uint8_t *map;
	uint64_t size;
	uint32_t users;                   /* reads holding bytes in it [lock] */
	struct cli_pool *next;
};

/* Where a read through the daemon put its bytes: the arena (bytes NULL),
 * or the daemon's pool of this uid (bytes the first of them, read-only;
 * shared: another loader's request read them from storage).  A read in
 * the pool holds it until cli_load_release. */
struct cli_lread {
	const char *bytes;
	bool shared;
	uint32_t token;
	struct cli_pool *pool;
	uint64_t pool_off;
	/* The wait (client.c): [lock] */
	bool offered, listed, done;
	int err, send_err;
	uint64_t len, got;
	struct cli_lread *next;
};
/* Several reads may be in flight from one thread; every cli_load_send
 * needs its cli_load_wait. */
void cli_load_send(struct ckpt_client *c, uint32_t handle, uint64_t file_off, uint64_t len,
		   uint64_t arena_off, bool offer, struct cli_lread *lr);
int64_t cli_load_wait(struct ckpt_client *c, struct cli_lread *lr);
/* The daemon drops a connection with more than PROTO_LOAD_INFLIGHT reads
 * unanswered or held in its pool: a caller reserves its n reads before
 * sending them (waits for room; -ECONNRESET, -E2BIG) and gives the room
 * back once they are waited for and released. */
int cli_load_reserve(struct ckpt_client *c, uint32_t n);
void cli_load_unreserve(struct ckpt_client *c, uint32_t n);
void cli_load_release(struct ckpt_client *c, struct cli_lread *lr);

/* Returns how many saves of checkpoint `name` this client began before, and
 * counts this one.  Caller holds c->lock. */
uint32_t cli_attempt_locked(struct ckpt_client *c, const char *name);

/* ---- readers (reader.c) and loads (load.c) ---- */

#include "format/index.h"

/* A reader is used by one thread at a time (ckpt.h); a running load only
 * reads `m`, `path`, `s3` and the descriptors it opened through
 * cli_reader_fd() on the caller's thread before it started. */
struct ckpt_reader {
	int dirfd;
	char *path;
	struct manifest m;
	int *fds;   /* per manifest file, -1 until first used */
	bool s3;    /* path is s3://...: ranged GETs instead of files */
	void *plan_ix; /* struct plan_index, made by the first load */
	struct store_s3_lease *lease; /* S3: the reader's lease, if it holds one */
};

/* Renews the reader's S3 lease when due (before each read; any thread). */
void cli_reader_touch(struct ckpt_reader *rd);

/* Copies a box of extents ext (n dimensions, elements of esize bytes) from
 * src, with byte strides ss, to dst, with byte strides ds; the innermost
 * dimensions contiguous in both become one memcpy.  Nothing for a zero
 * extent. */
void cli_box_copy(char *dst, const uint64_t *ds, const char *src, const uint64_t *ss,
		  const uint64_t *ext, unsigned n, size_t esize);

/* The descriptor of manifest file `file`, opened on first use.  Returns it
 * or -errno with a message naming the file in err. */
int cli_reader_fd(struct ckpt_reader *rd, uint32_t file, char *err, size_t errlen);

/* ---- helpers ---- */

static inline uint64_t cli_div_up(uint64_t a, uint64_t b)
{
	return a / b + (a % b != 0);
}

#endif
