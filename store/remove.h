/* SPDX-License-Identifier: MIT */
/*
 * remove.h - removing committed checkpoints, crash-safely, and the leases
 * that keep one from being removed while it is read.
 *
 * A checkpoint stops looking committed before any of its data goes:
 *
 *   local  take the checkpoint's lock exclusively (a reader's lease makes
 *          that fail: the checkpoint is in use and stays), rename the
 *          directory to ROOT/.ckpt-trash-<random> and fsync ROOT; remove
 *          its manifest.json and fsync the trash directory; drop the lock;
 *          then remove the rest and the directory.  Listings never take a
 *          trash directory for a checkpoint, and store_local_trash_sweep()
 *          (run by every prune) finishes what a crash cut short.
 *   S3     overwrite manifest.json with a tombstone (a small JSON object
 *          that no reader takes for a manifest), delete every other key of
 *          the checkpoint with DeleteObjects over paginated listings, and
 *          delete the tombstone last.  A prune that finds a tombstone
 *          finishes the removal.
 *
 * Leases (local only): a reader holds a shared flock on the checkpoint's
 * directory while it reads (client/reader.c); the removal's exclusive lock
 * cannot be had meanwhile.  A reader that opened the directory just before
 * the rename waits for the lock, then finds no manifest: the load fails
 * with "not a committed checkpoint", never with torn data.  S3 has no such
 * lock: a load racing a removal there fails on a missing object.
 */
#ifndef CKPT_STORE_REMOVE_H
#define CKPT_STORE_REMOVE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "format/index.h"

#define STORE_TRASH_PREFIX ".ckpt-trash-"
/* The key of a tombstone object (it has no "format"). */
#define STORE_TOMBSTONE_KEY MANIFEST_TOMBSTONE_KEY
#define STORE_NO_OWNER ((uid_t)-1)

/* For crash tests: called before each step of a removal with its name
 * ("rename", "unlink-manifest", "delete-batch", ...).  NULL normally. */
extern void (*store_remove_hook)(const char *step);

/* True for the name of a trash directory (a removal under way). */
bool store_is_trash_name(const char *name);

/* True if text (len bytes) is a tombstone that stands in for a manifest. */
bool store_is_tombstone(const char *text, size_t len);

/* A reader's lease on the checkpoint directory open at dirfd: a shared
 * lock, waited for up to timeout_ms (a removal holds it exclusively for a
 * moment).  0, -EBUSY (still locked), or -errno.  The lease ends when the
 * descriptor is closed. */
int store_lease_take(int dirfd, unsigned timeout_ms);

/* 1 if checkpoint `name` directly in rootfd is leased (read) right now, 0
 * if not, -errno if it cannot be told (-ENOENT: gone). */
int store_lease_busy(int rootfd, const char *name);

/* What happened to one checkpoint of a removal. */
struct store_rm_result {
	int res;       /* 0 removed; -EBUSY in use (kept); -EPERM not the
			* owner's; -ENOENT gone; other -errno */
	char err[256];
};

/*
 * Removes the checkpoints names[0..n) directly in the directory rootfd,
 * in batches: each one is locked and renamed to the trash, ROOT fsynced
 * once per batch, and then emptied.  With owner != STORE_NO_OWNER, a
 * checkpoint directory owned by another uid is not touched (-EPERM).
 * res[i] says what happened to names[i]; returns how many were removed,
 * or -errno if ROOT itself failed (then res[] says how far it got).
 */
long store_local_remove(int rootfd, const char *const *names, size_t n, uid_t owner,
			struct store_rm_result *res);

/*
 * Finishes removals a crash cut short: empties and removes every trash
 * directory directly in rootfd (of `owner`'s, unless STORE_NO_OWNER).
 * Returns how many it removed, or -errno with the reason in err.
 */
long store_local_trash_sweep(int rootfd, uid_t owner, char *err, size_t errlen);

/*
 * S3 (store_s3 must be started): removes checkpoint `ckpt`
 * (s3://bucket/prefix/name) as described above.  Returns 0, -ENOENT if
 * there was nothing, or -errno with the reason in err (a tombstone may
 * then be left: a later call finishes the job).
 */
int store_s3_remove(const char *ckpt, const char *by, char *err, size_t errlen);

#endif
