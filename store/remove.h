/* SPDX-License-Identifier: MIT */
/*
 * remove.h - removing committed checkpoints, crash-safely, and the leases
 * that keep one from being removed while it is read.
 *
 * A checkpoint stops looking committed before any of its data goes:
 *
 *   local  take the checkpoint's lock exclusively (a reader's lease makes
 *          that fail: the checkpoint is in use and stays), make sure
 *          nothing in it is a checkpoint or a save of its own (else it
 *          stays whole: -ENOTEMPTY; a directory cannot go without what is
 *          in it), rename the
 *          directory to ROOT/.ckpt-trash-<random> and fsync ROOT; remove
 *          its manifest.json and fsync the trash directory; drop the lock;
 *          then remove the rest and the directory.  Listings never take a
 *          trash directory for a checkpoint, and store_local_trash_sweep()
 *          (run by every prune) finishes what a crash cut short.
 *   S3     overwrite manifest.json with a tombstone (a JSON object that
 *          no reader takes for a manifest, with a nonce of its own and a
 *          copy of the manifest: phase "deciding"), only over the ETag
 *          just read; look at leases (and the caller's recheck) and either
 *          put the manifest back or, having decided, rewrite the tombstone
 *          as phase "deleting" (no copy), again only over our own; delete
 *          every other key the checkpoint owns with DeleteObjects over
 *          paginated listings; and delete the tombstone last (If-Match on
 *          its ETag).  It owns every key under its prefix but what is
 *          nested in it: a checkpoint below it (a deeper prefix holding a
 *          manifest.json or a tombstone) with its leases, and a save whose
 *          root lies inside it (a work area and its attempt's shards):
 *          those are left, and said (a nested checkpoint then lists under
 *          the root as any other; saves refuse such roots now, an older
 *          daemon or a hand may have made one).  A removal
 *          that finds a deciding tombstone takes it over the same way and
 *          decides again (so of two at once only the later decides); one
 *          that finds a deleting tombstone only finishes the deletion.
 *
 * Leases keep a checkpoint that is being read (client/reader.c):
 *
 *   local  the reader holds a shared flock on the checkpoint's directory;
 *          the removal's exclusive lock cannot be had meanwhile.  A reader
 *          that opened the directory just before the rename waits for the
 *          lock, then finds no manifest: the load fails with "not a
 *          committed checkpoint", never with torn data.
 *   S3     the reader PUTs a lease object, <checkpoint>/.ckpt-lease-<random>
 *          (who, when, until when), and only then GETs the manifest; it
 *          renews the lease while it reads and deletes it at close.  The
 *          removal lists the leases after its tombstone and before any
 *          data goes: with a live one it puts the manifest back and keeps
 *          the checkpoint (-EBUSY).  S3 being strongly consistent, a
 *          reader either got the manifest (and its lease is listed) or
 *          finds the tombstone; it waits a moment for the manifest to come
 *          back, then fails cleanly.  Clocks of readers and removers may
 *          differ by STORE_S3_LEASE_SKEW_S.
 */
#ifndef CKPT_STORE_REMOVE_H
#define CKPT_STORE_REMOVE_H

#include <stdbool.h>
#include <stdint.h>
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

/* The phase of a tombstone whose removal has decided to delete: no
 * manifest will come back. */
#define STORE_TOMBSTONE_DELETING "deleting"
/* True if text is a tombstone in that phase. */
bool store_tombstone_deleting(const char *text, size_t len);

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
	int res;       /* 0 removed; -EBUSY in use (in_use set: kept); -EPERM
			* not the owner's; -ESTALE not the checkpoint planned;
			* -ENOENT gone; -EXDEV a mount point inside;
			* -ENOTEMPTY a checkpoint or save nested inside (kept);
			* other -errno */
	bool in_use;   /* a reader's lease kept it */
	char err[512];
};

/* One checkpoint to remove: its name directly in the root, and what the
 * caller saw there when it planned (st_dev and st_ino of the directory;
 * both 0: not checked).  A directory that is not the one planned (a name
 * reused meanwhile) is left alone. */
struct store_rm_target {
	const char *name;
	uint64_t dev, ino;
};

/* The marker a removal writes into a checkpoint before it renames it into
 * the trash ("trash=NAME\nuid=UID\n"): the sweep finishes only trash
 * directories whose marker names them, never a directory someone else
 * renamed to look like trash. */
#define STORE_RM_MARKER ".ckpt-removing"

/*
 * Removes the checkpoints t[0..n) directly in the directory rootfd, in
 * batches: each one is locked, marked and renamed to the trash, ROOT
 * fsynced once per batch, every manifest removed (fsynced) and every lock
 * dropped, and then the directories emptied.  With owner !=
 * STORE_NO_OWNER, a checkpoint directory owned by another uid is not
 * touched (-EPERM).  Removal never crosses into another file system.
 * res[i] says what happened to t[i]; returns how many were removed, or
 * -errno if ROOT itself failed (then res[] says how far it got).
 */
long store_local_remove(int rootfd, const struct store_rm_target *t, size_t n, uid_t owner,
			struct store_rm_result *res);

/*
 * Moves directory `name` of rootfd (not a checkpoint: a dead save's work
 * area) into the trash, marked, for store_local_trash_sweep() to remove.
 * 0, -ENOENT (gone or renamed meanwhile), or -errno (err).
 */
int store_local_trash(int rootfd, const char *name, uid_t uid, char *err, size_t errlen);

/*
 * The one way a work area is deleted.  Renames directory `name` of rootfd
 * to a fresh trash name first, checks that the rename moved the directory
 * expect_fd is open on (-1: whatever `name` is when this is called; if not,
 * the name is put back: -ENOENT), marks it (the marker names the trash and
 * uid), and with `now` removes it at once (else the trash sweep does).  So
 * a deletion only ever runs through a directory this call renamed away
 * under a name nobody else uses: a work area renamed into place as a
 * checkpoint before it (a commit that came first) is never touched
 * (-ENOENT), and a commit that comes after it finds nothing to rename and
 * fails.  0, -ENOENT, or -errno (err).
 */
int store_local_discard(int rootfd, const char *name, int expect_fd, uid_t uid, bool now,
			char *err, size_t errlen);

/*
 * Finishes removals a crash cut short: empties and removes every trash
 * directory directly in rootfd whose marker names it (and, unless owner
 * is STORE_NO_OWNER or 0, gives owner's uid).  Other trash directories,
 * and ones that fail, are reported through warn (if not NULL) and left;
 * *ret_problems (if not NULL) counts them.  Returns how many it removed,
 * or -errno if the root cannot be read.
 */
long store_local_trash_sweep(int rootfd, uid_t owner, void (*warn)(void *ud, const char *msg),
			     void *ud, size_t *ret_problems);

/* S3 leases (store_s3 must be started). */
#define STORE_S3_LEASE_PREFIX ".ckpt-lease-"
#define STORE_S3_LEASE_KEY "ckpt_lease"
#define STORE_S3_LEASE_TTL_S 900     /* a lease's life, renewed every third of it */
#define STORE_S3_LEASE_MAX_S 3600    /* a longer one is not ours: ignored */
#define STORE_S3_LEASE_SKEW_S 300    /* the clocks' disagreement allowed for */
#define STORE_S3_LEASE_SCAN_MAX 256  /* more leases than this: taken as held */
/* True for the name of an S3 lease object (relative to its checkpoint). */
bool store_is_lease_name(const char *name);

struct store_s3_lease {
	char bucket[64];
	char key[1025];
	_Atomic int64_t renew_at;    /* when to renew, CLOCK_MONOTONIC s; 0: none held */
};

/* PUTs a new lease on checkpoint `ckpt` (s3://bucket/prefix/name) into
 * *l.  0 or -errno (err): -EACCES when the credentials may not write. */
int store_s3_lease_take(const char *ckpt, struct store_s3_lease *l, char *err, size_t errlen);
/* Renews *l if a third of its life has gone (thread-safe; cheap when not
 * due; a failure is tried again later). */
void store_s3_lease_renew(struct store_s3_lease *l);
/* Deletes *l's lease object (if it holds one). */
void store_s3_lease_drop(struct store_s3_lease *l);

/*
 * S3 (store_s3 must be started): removes checkpoint `ckpt`
 * (s3://bucket/prefix/name) as described above.  With expect_etag (the
 * manifest's ETag when the caller planned; NULL or "": not checked), a
 * checkpoint committed again under that name since is kept (-ESTALE), and
 * the tombstone is written only over the manifest just read (If-Match).
 * recheck (if not NULL) is asked once the tombstone is written and no
 * lease holds, before any data goes: non-zero keeps the checkpoint (its
 * manifest put back, `why` in err), as a lease does; so a caller can see
 * what changed since its plan (prune: a pin) with no window for a race.
 * Returns 0 (err: "" or what nested keys it left), -ENOENT if there was
 * nothing, -EBUSY if a reader's lease or recheck kept it, or -errno with
 * the reason in err (a tombstone may then be left: a later call finishes
 * the job).
 */
int store_s3_remove(const char *ckpt, const char *by, const char *expect_etag,
		    int (*recheck)(void *ud, char *why, size_t whylen), void *ud, char *err,
		    size_t errlen);

#endif
