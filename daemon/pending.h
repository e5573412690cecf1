/* SPDX-License-Identifier: MIT */
/*
 * pending.h - the spilled saves this daemon owes a commit: what it keeps in
 * its state directory so that a save reported durable on the node (the
 * spill tier, store_spill.h) is finished without its trainer and across the
 * daemon's own restarts.
 *
 * Once a spilled rank's file is fsynced, and before SAVE_DURABLE tells its
 * client so, the daemon writes (fsynced) what it needs to finish the save
 * alone:
 *
 *   <state_dir>/spill/<attempt id>/rank-NNNNN.rec   one per local rank: its
 *       layout (the save descriptor, desc.h, as the client sent it and the
 *       daemon checked it), the CRC32C of every 1 MiB piece the daemon took
 *       from the arena (what the upload checks the file against, and what
 *       its index and the manifest record), and the S3 part size (the
 *       connection's slot size); magic, version and a CRC32C of it all
 *   <state_dir>/spill/<attempt id>/save.json        the attempt's key, its
 *       canonical S3 root, the owner's credentials, the local ranks known
 *       when it was written; written after the rank's record
 *
 * The bytes themselves stay in the spill directory's work area of the
 * attempt.  The state directory is the daemon's alone (0700, locked): a
 * user cannot forge or change a record.  It goes when the save commits, or
 * fails for good, or an operator drops it (`ckptctl spill drop`); the
 * registry's sweep never removes the work areas of an attempt that has one
 * (registry_sweep).  At start-up every record is resumed (save.c:
 * saves_resume).
 *
 * Every function runs on a worker thread or at start-up, acting as the
 * daemon.
 */
#ifndef CKPTD_PENDING_H
#define CKPTD_PENDING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/creds.h"
#include "format/layout.h"
#include "store/store.h"

#define PENDING_DIR "spill"

/* One local rank, as it was made durable. */
struct pending_rank {
	uint32_t rank;
	uint64_t extent;       /* the connection's slot size: S3 parts */
	struct layout layout;  /* placed, checked by desc_parse */
	uint32_t *crcs;        /* layout.n_crcs */
};

/* One save, as pending_load() found it. */
struct pending_save {
	char id[STORE_ID_LEN + 1];
	struct store_key key;
	char root[4096];       /* the canonical S3 root */
	struct creds owner;
	uint32_t *local;       /* the local ranks known, sorted */
	size_t n_local;
	struct pending_rank *ranks; /* the ones made durable, sorted */
	size_t n_ranks;
};

/*
 * Records local rank `rank` of attempt `id` (layout l, its CRCs, the part
 * size `extent`), then the save: key, root, owner, and local[n_local] (the
 * save's local ranks when the caller looked; gen orders the calls of one
 * save: a save.json of a later gen is never replaced by an earlier one).
 * Both are fsynced before it returns 0; else -errno (err).
 */
int pending_record(const char *state_dir, const char *id, const struct store_key *k,
		   const char *root, const struct creds *owner, const uint32_t *local,
		   size_t n_local, uint64_t gen, uint32_t rank, uint64_t extent,
		   const struct layout *l, const uint32_t *crcs, char *err, size_t errlen);

/* Removes attempt id's records (missing is fine). */
void pending_remove(const char *state_dir, const char *id);

/* True if attempt id has records (even ones that do not load). */
bool pending_exists(const char *state_dir, const char *id);

/*
 * Calls fn for every attempt with records, loaded and checked (caps on
 * everything; the descriptor through desc_parse): fn takes *p over
 * (pending_free).  One that does not load is reported through bad(ud, id,
 * why, false) and left on disk: nothing is deleted silently.  Only records
 * of ranks whose save never got its save.json (the daemon stopped between
 * the two writes, before any SAVE_DURABLE) are removed: bad(..., true).
 * Returns how many loaded.
 */
unsigned pending_load_all(const char *state_dir, void (*fn)(void *ud, struct pending_save *p),
			  void (*bad)(void *ud, const char *id, const char *why, bool removed),
			  void *ud);

void pending_free(struct pending_save *p);

#endif
