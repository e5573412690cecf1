/* SPDX-License-Identifier: MIT */
/*
 * share.h - pieces of checkpoint files that loads read through the daemon,
 * kept in a pool per uid so that every loader of that uid on the node that
 * wants the same bytes gets them from one read of the disk.
 *
 * Why: when M ranks of a node load a checkpoint saved in another layout,
 * each needs a part of every CRC piece (a column band of a row-sharded
 * tensor, say), and a piece is verified whole, so each must read every
 * piece.  With O_DIRECT (loadio.h) nothing is shared between them: M
 * loaders read the file M times.  The pool makes that once.
 *
 * The pool: a sealed memfd (config `load_share` bytes), registered with
 * io_uring like an arena, and mapped read-only by the loaders it serves (a
 * read-only descriptor, F_SEAL_FUTURE_WRITE: only the daemon's mapping,
 * made before the seal, writes it).  One pool per (uid, job), as resident
 * images are keyed: a loader sees only bytes of files some loader of its
 * own uid and job opened and lent (a uid is not always a tenant: containers
 * may share one), and a pool is never handed to another.  It is made, on
 * an arena worker, once two clients of the (uid, job) have the same file
 * lent -- something to share -- and there is room in arena_total; until
 * it is ready (populating it takes a second or so here) reads land in the
 * clients' arenas as without it.
 *
 * An entry is one cell of one file (proto.h, PROTO_LOAD_CELL: 8 MiB of its
 * grid), up to the file's end, at `off` in the pool, keyed by the file's
 * identity as fstat() gives it at each read (device, inode, size, mtime,
 * ctime), so a file written again is a new key.  A read lies within one
 * cell (the client cuts its reads at the grid; one that does not is read
 * into the arena) and is answered by that cell's entry (READY, or READING:
 * it waits), else by a new entry, the whole cell read from the disk with
 * the asking client's descriptor.  Whole cells, not the bytes asked for:
 * loaders' plans cut their reads in different places, and an entry of
 * one's bytes would hold another's only by chance (it read them again).
 * Entries are pinned while a waiting read or a client holds them (the
 * client sends LOAD_RELEASE when it has copied and checked the bytes);
 * unpinned ones are kept, least recently used first, until their room is
 * needed, and only while some client of the uid has the file lent
 * (LOAD_FILE to LOAD_CLOSE): the pool shares bytes between loads that run
 * at the same time, and is not a cache that would serve a later load of
 * the same file from memory (the page cache's job; a load from ckptd's
 * memory is what resident images are for).  A pool
 * nobody pinned for SHARE_IDLE_MS is freed, and so is an idle one when an
 * arena needs the memory (arenas win, as over resident images).  A uid's
 * pools count against its arena_per_uid with its arenas (users.h): a pool
 * that would take it past that is not made.
 *
 * Trust: the client checks every CRC piece it uses against its manifest,
 * as with any read; the pool saves disk reads, never checks.  A file
 * changed under a key between two reads (same mtime and ctime) gives a
 * CRC mismatch, as it would without the pool.
 *
 * Everything here runs on the loop thread except the make and free jobs.
 */
#ifndef CKPTD_SHARE_H
#define CKPTD_SHARE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "daemon/list.h"

struct server;
struct pool;
struct pentry;
struct sfile;

/* An unpinned pool is freed after this long. */
#define SHARE_IDLE_MS 60000

/* A read waiting for an entry.  cb runs once: res 0 with a pin on w->e
 * (READY: share_put it when done), or res < 0: no bytes (read directly
 * instead).  It may run inside share_get. */
struct share_wait {
	struct share_wait *next;
	struct pentry *e;
	uint64_t file_off, len;
	uint32_t who; /* the asking connection's id */
	bool reader;  /* the entry was read from the disk for this connection
	               * (this request or an earlier one of it): not shared
	               * with another load */
	void (*cb)(struct share_wait *w, int res);
};

/* A client of (uid, job) lent the file st describes (LOAD_FILE): its
 * pieces may be kept while it is lent.  NULL: out of memory (its reads go
 * without the pool). */
struct sfile *share_lend(struct server *srv, uid_t uid, const char *job, const struct stat *st);
/* That client gave it back (or closed): the last one out drops the file's
 * unpinned entries (pinned ones go when unpinned). */
void share_unlend(struct server *srv, struct sfile *f);
/* Asks for [w->file_off, +w->len) of lent file sf, open as fd (fstat'ed
 * now as st).  Returns true if w will be answered by cb, false if the
 * pool cannot take it now (none yet: one is being made; no room; across
 * two cells; past the end of the file; disabled): the caller reads it
 * itself. */
bool share_get(struct server *srv, struct sfile *sf, int fd, const struct stat *st,
	       struct share_wait *w);
/* What an answered read got: bytes (from file_off, at most len; fewer at
 * the end of the file), where they start in the pool, the pool's gen and
 * its read-only descriptor (the pool's own: dup or send, never close). */
uint64_t share_got(const struct share_wait *w, uint64_t *ret_pool_off, uint32_t *ret_gen,
		   int *ret_fd);
/* Drops a pin. */
void share_put(struct server *srv, struct pentry *e);

/* A pool's io_uring completions (EV_POOL). */
void share_io_event(struct pool *p);
/* After each round of the loop: frees the pools freed during it (an event
 * of the round may still have named them). */
void share_reap(struct server *srv);
/* Timer: frees pools idle for SHARE_IDLE_MS. */
void share_tick(struct server *srv);
/* For a request of `need` more bytes by uid (an arena): frees idle
 * (unpinned) pools until they fit in arena_total, and uid's own idle pools
 * until they fit in its arena_per_uid too.  Another uid's pool goes only if
 * users_may_evict() lets uid (users.h).  Returns true if they fit in
 * arena_total. */
bool share_make_room(struct server *srv, uid_t uid, uint64_t need);
/* Bytes of uid's pools (made or being made). */
uint64_t share_bytes_of(const struct server *srv, uid_t uid);

/* Calls fn for every pool (made or being made): its uid and bytes. */
void share_each(const struct server *srv, void (*fn)(void *ud, uid_t uid, uint64_t bytes),
		void *ud);
/* Stopping: reaps what is in flight (true if anything still is). */
bool share_busy(struct server *srv);
/* Stopping, nothing in flight: frees every pool at once. */
void share_free_all(struct server *srv);
/* Status report: one JSON object per pool (of uid, or all), appended to
 * arr (a json_t *). */
void share_status(const struct server *srv, void *arr, uid_t uid, bool all);

#endif
