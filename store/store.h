/* SPDX-License-Identifier: MIT */
/*
 * store.h - storage backends behind one ops table.
 *
 * The daemon stages, checksums and orders; a backend moves bytes to storage
 * and makes them visible.  Adding a backend (S3) is adding a file that fills
 * in `struct store_ops`, not branches in the daemon.  As with fio's
 * ioengines, the daemon's writer queues extent writes and learns of each
 * completion through a callback; it never reaches into the backend's state,
 * and the backend never into the daemon's.
 *
 * Threads.  Every hook says where it runs:
 *   [loop]   the daemon's event loop: must not block;
 *   [worker] a worker thread acting with the client's credentials (the
 *            daemon's worker.h): may block on the disk or the network.
 *
 * A save attempt.  All ranks of one attempt of one save -- on one daemon or
 * on several sharing the storage -- meet in one work area named by
 * store_key_id(): (job, run, name, step, attempt, world) hashed to 32 hex
 * digits.  The work area records the whole key and the daemon that made it
 * (attempt.json); a daemon joins a work area only if the key is the same, and
 * never one made by an earlier life of itself (but to finish a spilled save
 * that life owed a commit: attempt_resume).  Nothing in it is read by an
 * attempt with another key.  The commit makes the work area the checkpoint,
 * atomically, after which nothing writes into it.
 *
 * Addressing.  The daemon of rank 0 (the coordinator) claims the work area
 * with a fresh random nonce (coordinator.json); every other daemon addresses
 * each rank index it delivers to the nonce it finds there ("to"), and
 * re-addresses it if a new claim appears.  The coordinator merges only
 * indexes addressed to its own claim.  So an index that an earlier life of
 * any daemon left in a work area of the same key -- a crashed attempt's --
 * can never be merged: its addressee is gone for good.
 */
#ifndef CKPT_STORE_STORE_H
#define CKPT_STORE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ckpt.h"
#include "format/index.h"

#define STORE_ID_LEN 32 /* hex digits of an attempt id or a daemon id */

/* What names one save attempt. */
struct store_key {
	char job[CKPT_MAX_JOB_LEN + 1];
	char run[CKPT_MAX_RUN_LEN + 1];
	char name[CKPT_MAX_NAME_LEN + 1];
	uint64_t step;
	uint32_t attempt;
	uint32_t world;
};

/* Who writes: a daemon's stable identity (its host and socket) and this
 * life of it (random at start-up). */
struct store_writer {
	char id[STORE_ID_LEN + 1];
	char instance[STORE_ID_LEN + 1];
};

/* The attempt id of k: 32 lowercase hex digits and a NUL into ret. */
void store_key_id(const struct store_key *k, char ret[STORE_ID_LEN + 1]);

/* A 128-bit hash of len bytes as 32 hex digits (not cryptographic: ids are
 * always checked against the full key they stand for). */
void store_hash_hex(const void *buf, size_t len, char ret[STORE_ID_LEN + 1]);

/* What list() found. */
enum store_entry {
	STORE_ENTRY_OTHER = 0,      /* a directory (prefix) that is neither */
	STORE_ENTRY_CHECKPOINT = 1, /* holds manifest.json */
	STORE_ENTRY_WORK = 2,       /* a work area of a save in progress */
	STORE_ENTRY_FILE = 3,       /* a file (object), nothing to look into */
};

/* Work areas are named STORE_WORK_PREFIX + the 32-digit attempt id. */
#define STORE_WORK_PREFIX ".ckpt-work-"
#define STORE_ATTEMPT_FILE "attempt.json"
/* The coordinator's claim in a work area (its nonce, daemon and life). */
#define STORE_CLAIM_FILE "coordinator.json"

/* Every name ckptd gives its own things in a root or a checkpoint starts
 * with this: work areas, trash, leases, removal markers, pins. */
#define STORE_RESERVED_PREFIX ".ckpt-"
/* Older daemons' work directories. */
#define STORE_LEGACY_WORK_PREFIX ".partial-"

/*
 * True for a name a save's root may not have as a directory below its
 * allowed root: one of ckptd's own (STORE_RESERVED_PREFIX,
 * STORE_LEGACY_WORK_PREFIX: a root named like a work area would make its
 * checkpoints list as saves in progress, one named like trash would be
 * swept), or manifest.json (its parent would look like a checkpoint).
 */
bool store_name_reserved(const char *name);

struct store_arena;
struct store_attempt;
struct store_shard;

/* A write finished: res is 0 or -errno (a short write is retried inside the
 * backend; only a write that cannot progress is an error). */
typedef void (*store_io_cb)(void *ud, int res);

/* Checks len bytes of a shard at file offset off as read back from a spill
 * file: 0, or -errno with the reason in err. */
typedef int (*store_check_fn)(void *ud, const uint8_t *buf, uint64_t off, uint64_t len,
			      char *err, size_t errlen);

/* What the committer merges: this daemon's own ranks, from memory. */
struct store_merge {
	const struct store_key *key;
	const char *attempt_id;
	const char *nonce;          /* the coordinator's claim */
	const struct store_writer *self;
	const struct index_local *local;
	size_t n_local;
	int64_t time_utc;
};

/* What a daemon holds of a failed attempt (attempt_fail). */
struct store_fail {
	bool coordinator;       /* it created rank 0's shard and claimed the area */
	bool delivered;         /* an index of its ranks went to a claim */
	bool mark;              /* tell the others: leave the failure marker */
	bool created;           /* it created the work area */
	const uint32_t *made;   /* ranks whose shard it created (sorted or not) */
	size_t n_made;
	const char *msg;        /* why: the marker's text */
};

struct store_ops {
	const char *name;

	/* ---- arenas: the client's staging memory, registered for I/O ---- */
	/* [worker] Sets up I/O from [base, base + len) with `depth` writes in
	 * flight.  Returns 0 or -errno (reason in err). */
	int (*arena_attach)(void *base, uint64_t len, unsigned depth, struct store_arena **ret,
			    char *err, size_t errlen);
	/* [any] No write may be in flight.  Accepts NULL. */
	void (*arena_detach)(struct store_arena *a);
	/* [loop] An fd that becomes readable when completions wait. */
	int (*arena_fd)(const struct store_arena *a);
	/* [loop] Runs the callbacks of finished writes; never waits. */
	void (*arena_reap)(struct store_arena *a);
	/* [loop] Writes queued or in flight. */
	unsigned (*arena_busy)(const struct store_arena *a);
	/* [startup] Caps the writes in flight of all arenas together (0: no
	 * cap beyond each arena's depth); arenas beyond it wait in turn. */
	void (*set_disk_depth)(unsigned depth);

	/* ---- attempts ---- */
	/*
	 * [worker] Opens the root of a save: `root` (canonical, no trailing
	 * '/') at or below `base`, the allowed root it lies under (canonical,
	 * in the same spelling).  What is missing below base is created, as
	 * the calling thread's user, with mode 0755 less its umask: never
	 * writable by others, whatever the client's umask.  Refused (-EINVAL,
	 * reason in err): a component below base that is reserved
	 * (store_name_reserved) or is a checkpoint (removing that checkpoint
	 * would take the root's checkpoints with it).  Local roots (already
	 * spelled without links) are walked from "/" one component at a time
	 * without following a symbolic link (-EACCES for one), and *ret_fd is
	 * the root's directory, the one the checks were made on: attempt_open
	 * works in it and never resolves the path again (a directory swapped
	 * for a link meanwhile cannot lead the save out of the roots).  S3
	 * roots give -1.  0 or -errno.
	 */
	int (*root_open)(const char *base, const char *root, int *ret_fd, char *err,
			 size_t errlen);
	/* [worker] Creates the attempt's work area under `root` (canonical),
	 * or joins it when another daemon of the same attempt made it.
	 * rootfd: the root's directory as root_open gave it (the local
	 * backend uses it, a duplicate of it, and names `root` only in
	 * messages), or -1 (local: `root` is opened; S3 ignores it).
	 * Refuses: -EEXIST (the checkpoint exists, or the area belongs to
	 * another user or key), -ECANCELED (this attempt already failed:
	 * reason in err).  *ret_created tells whether this call made it. */
	int (*attempt_open)(const char *root, int rootfd, const struct store_key *k,
			    const char *attempt_id, const struct store_writer *self, uid_t uid,
			    struct store_attempt **ret, bool *ret_created, char *err,
			    size_t errlen);
	/* [worker] Optional (NULL: never): the attempt of an earlier life of
	 * this daemon whose local ranks spilled (shard_spills) and whose save
	 * the daemon resumes, opened again to finish it: its work area is
	 * joined whichever life of this daemon made it, never replaced, and
	 * made again when it is gone and `coordinator` (rank 0 is ours).
	 * Returns 0 (*ret), 1 (*ret: the attempt is committed already),
	 * -ECANCELED (it failed, or rank 0's daemon gave it up), -EEXIST
	 * (another save holds the name), -EBADMSG (what the node's disk kept
	 * of it is gone), or another -errno when the store could not tell
	 * (unreachable: try again later); reason in err. */
	int (*attempt_resume)(const char *root, const struct store_key *k, const char *attempt_id,
			      const struct store_writer *self, uid_t uid, bool coordinator,
			      struct store_attempt **ret, char *err, size_t errlen);
	/* [worker] Creates rank's shard (exclusively: a rank is written once
	 * per attempt) with room for `size` bytes reserved; its extents will
	 * be `extent` bytes each (the last one shorter), file offsets
	 * multiples of it.  -EEXIST if the rank is already being written;
	 * -ENOSPC/-EDQUOT/-EFBIG if there is no room or the backend cannot
	 * store a file of that size in such extents. */
	int (*shard_create)(struct store_attempt *a, uint32_t rank, uint64_t size, uint64_t extent,
			    bool direct, struct store_shard **ret, char *err, size_t errlen);
	/* [any] NULL, or the tag in this attempt's shard file names
	 * (index_origin.shard_tag). */
	const char *(*attempt_tag)(const struct store_attempt *a);
	/* [loop] Queues a write of len bytes of the arena at arena_off to the
	 * shard at file_off (len a multiple of 4096; the bytes stay untouched
	 * until cb runs).  cb runs from arena_reap, exactly once. */
	void (*shard_write)(struct store_shard *s, struct store_arena *a, uint64_t arena_off,
			    uint64_t file_off, uint64_t len, store_io_cb cb, void *ud);
	/* [loop] Optional (NULL: not offered): queues a read of len bytes of
	 * the open file fd at file_off into the arena at arena_off (for a
	 * client's load, daemon/load.c).  O_DIRECT on fd needs file_off, len
	 * and arena_off multiples of the file system's block size.  cb gets
	 * the bytes read (>= 0; fewer than len only at the end of the file)
	 * or -errno, from arena_reap, exactly once. */
	void (*arena_read)(struct store_arena *a, int fd, uint64_t arena_off, uint64_t file_off,
			   uint64_t len, store_io_cb cb, void *ud);
	/* [any] Optional (NULL: never): does s want each extent's CRC32C
	 * with its write (shard_write_crc instead of shard_write)?  The store
	 * has the bytes checked against it on receipt (S3 verifies
	 * x-amz-checksum-crc32c), and the writer computes it in the pass that
	 * takes the index's CRC pieces, before the write starts. */
	bool (*shard_wants_crc)(const struct store_shard *s);
	/* [loop] As shard_write, with crc the CRC32C of the extent's file
	 * bytes (len up to the shard's size: not the padding).  Required
	 * where shard_wants_crc can say true. */
	void (*shard_write_crc)(struct store_shard *s, struct store_arena *a, uint64_t arena_off,
				uint64_t file_off, uint64_t len, uint32_t crc, store_io_cb cb,
				void *ud);
	/* [loop] Optional: what the first failed write of s said, beyond
	 * its errno (an S3 part's code and message), or NULL. */
	const char *(*shard_error)(const struct store_shard *s);
	/* [worker] Makes the shard durable at its final size (for a shard
	 * that spills, on the node's disk: see shard_forward). */
	int (*shard_finish)(struct store_shard *s, uint64_t size, char *err, size_t errlen);
	/* [any] Optional (NULL: never): does s spill?  A spilled shard is
	 * written to a file on the node's disk first (its arena slots are free
	 * once the file has them), and after shard_finish it still has to be
	 * moved to the store with shard_forward before its index may be
	 * published. */
	bool (*shard_spills)(const struct store_shard *s);
	/* [worker] Optional (with attempt_resume): rank's shard, spilled and
	 * made durable by an earlier life of this daemon (its file is in the
	 * attempt's area on the node's disk), for shard_forward.  -EBADMSG if
	 * the file is gone or not `size` bytes (reason in err). */
	int (*shard_resume)(struct store_attempt *a, uint32_t rank, uint64_t size, uint64_t extent,
			    struct store_shard **ret, char *err, size_t errlen);
	/* [worker] Moves a finished spilled shard to the store; may take long.
	 * Every byte read back from the node's disk is handed to check()
	 * before it is sent (a non-zero return stops the move with that
	 * error); *progress (written atomically) counts the bytes the store
	 * acknowledged.  May be called again after a failure (the spill tier
	 * retries until the store takes it): it starts the move over.
	 * Returns 0; -ECANCELED after shard_cancel; -EBADMSG when the copy on
	 * the node's disk cannot be moved, ever (gone, unreadable, or refused
	 * by check()); -EEXIST when another writer holds the rank; any other
	 * -errno when the store did not take it (unreachable, throttled,
	 * refusing for now): the copy is whole, try again later. */
	int (*shard_forward)(struct store_shard *s, store_check_fn check, void *check_ud,
			     uint64_t *progress, char *err, size_t errlen);
	/* [loop] Optional: makes a shard_forward in flight stop soon. */
	void (*shard_cancel)(struct store_shard *s);
	/* [worker] Publishes (or replaces) rank's index in the work area. */
	int (*rank_publish)(struct store_attempt *a, uint32_t rank, const char *index_text,
			    char *err, size_t errlen);
	/* [worker] The coordinator claims the work area: a fresh nonce into
	 * ret (32 hex digits).  Returns 0 or -errno. */
	int (*attempt_claim)(struct store_attempt *a, const struct store_writer *self,
			     char ret[STORE_ID_LEN + 1], char *err, size_t errlen);
	/* [worker] The nonce of the current claim, or -ENOENT if none yet. */
	int (*attempt_addressee)(struct store_attempt *a, char ret[STORE_ID_LEN + 1]);
	/* [any] Accepts NULL. */
	void (*shard_close)(struct store_shard *s);
	/* [worker] How many ranks, counting up from *io_n, have delivered an
	 * index addressed to `nonce` (ranks listed in local[n_local], sorted,
	 * count as delivered: the caller has them).  Returns 0 or -errno;
	 * -ECANCELED if another daemon has marked the attempt failed (its
	 * ranks will never come: the coordinator gives up at once rather than
	 * at the deadline).  The marker is looked for after the count, and
	 * whatever the count: a daemon marks while it still holds its ranks'
	 * shards and removes them only after, so a rank re-created by anyone
	 * since (another run saving the same attempt) cannot be counted
	 * without the marker being seen.  Another -errno with the reason in
	 * err (an index that could not be read, or whose bytes did not match
	 * their checksum). */
	int (*attempt_count)(struct store_attempt *a, uint32_t world, const char *nonce,
			     const uint32_t *local, size_t n_local, uint32_t *io_n, char *err,
			     size_t errlen);
	/* [worker] Merges the delivered indexes (and m->local) into the
	 * manifest and commits it: after a successful return the checkpoint is
	 * visible and complete, and nothing writes into it again. */
	int (*attempt_commit)(struct store_attempt *a, const struct store_merge *m, char *err,
			      size_t errlen);
	/* [worker] For a daemon that does not coordinate: 1 committed (by this
	 * attempt), 0 not yet, or -errno: failed or abandoned (reason in err). */
	int (*attempt_poll)(struct store_attempt *a, const char *attempt_id, char *err,
			    size_t errlen);
	/* [worker] The attempt failed (struct store_fail says what this
	 * daemon holds).  A daemon deletes only what it created and still
	 * owns, and never through a directory renamed into place:
	 *   - the coordinator (it holds the claim) removes the work area, by
	 *     renaming it away first (store_local_discard; on S3 after making
	 *     sure no manifest of the attempt exists), never after a commit;
	 *   - another daemon that has not delivered leaves the failure marker
	 *     if f->mark, and then removes exactly the shards it created
	 *     (f->made): the area cannot have been committed without them;
	 *     if it also created the area and nobody has claimed it (so no
	 *     coordinator will remove it), it removes the area as the
	 *     coordinator would;
	 *   - one that has delivered writes and deletes nothing (the area may
	 *     be committed already).
	 * Returns 0, or -errno if something it had to remove is still there
	 * (the storage was unreachable, an answer unreadable): the caller
	 * keeps the area noted, and its sweep tries again later. */
	int (*attempt_fail)(struct store_attempt *a, const struct store_fail *f);
	/* [worker] Optional (NULL: the store needs none): says that this
	 * daemon's part of the save is alive, for `ckptctl gc` and other
	 * daemons' sweeps, which age a work area from its last activity.
	 * The daemon calls it every s3_heartbeat while the save is not final,
	 * also while another hook of a (a slow commit) is in flight: it reads
	 * only what attempt_open set.  Returns 0;
	 * -ENOENT once the work area is gone (committed or removed: nothing
	 * to renew any more, and nothing of the renewal is left behind);
	 * -EOPNOTSUPP where this attempt needs no renewal; or -errno (err). */
	int (*attempt_renew)(struct store_attempt *a, const struct store_writer *self, char *err,
			     size_t errlen);
	/* [any] Accepts NULL. */
	void (*attempt_close)(struct store_attempt *a);

	/* ---- what tools and readers use ---- */
	/* [any] Calls fn for each entry directly under `dir` of `root` (dir ""
	 * for the root itself): its name and whether it is a committed
	 * checkpoint, a work area or something else.  Stops at fn's first
	 * non-zero return and returns it; else 0 or -errno. */
	int (*list)(const char *root, const char *dir,
		    int (*fn)(void *ud, const char *name, enum store_entry kind), void *ud);
	/* [any] Reads len bytes at off of `file` in checkpoint `ckpt` (a path
	 * or prefix) into buf.  -EBADMSG if the object is shorter. */
	int (*read_range)(const char *ckpt, const char *file, uint64_t off, uint64_t len,
			  void *buf);
	/* [worker] Removes checkpoint or work area `name` under root and all
	 * of it.  0 (also if it was not there) or -errno. */
	int (*remove)(const char *root, const char *name);
};

extern const struct store_ops store_local;

#endif
