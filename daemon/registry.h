/* SPDX-License-Identifier: MIT */
/*
 * registry.h - the work areas this daemon created, wherever they are.
 *
 * A save's work area lives next to its final place, which can be any
 * directory below an allowed root, so scanning the roots cannot find every
 * leftover of a crash.  Instead the daemon notes each work area it creates
 * in its state directory (one small file per area: where it is, whose it is,
 * which life of the daemon made it) before creating it, and forgets it once
 * the area is committed or removed.  The sweep removes the areas of earlier
 * lives (their saves died with them, but for the spilled saves a later life
 * resumes: pending.h) and those of this life whose save is gone, acting as
 * the area's owner.
 *
 * The state directory belongs to one daemon: it is locked (flock) for the
 * daemon's life.  Every function but registry_open runs on a worker thread
 * with the daemon's own credentials (the sweep switches to each owner).
 */
#ifndef CKPTD_REGISTRY_H
#define CKPTD_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/creds.h"
#include "store/store.h"

struct registry {
	int dirfd;   /* <state_dir>/areas */
	int lockfd;  /* <state_dir>/lock, flock'ed */
	char *path;  /* <state_dir> */
};

/* Creates and locks state_dir (0700).  Returns 0, -EBUSY (another daemon
 * holds it), or -errno; reason in err. */
int registry_open(struct registry *reg, const char *state_dir, char *err, size_t errlen);
void registry_close(struct registry *reg);

/* Notes that the work area of attempt `id` is (about to be) under root,
 * owned by creds.  Returns 0 or -errno. */
int registry_add(struct registry *reg, const char *id, const char *root, const struct creds *owner,
		 const char *instance);
/* Forgets it.  Missing is fine. */
void registry_del(struct registry *reg, const char *id);

/*
 * Removes every noted work area not live: those of other instances at once,
 * those of this instance once older than min_age_ms; an S3 one only once
 * nothing happened in it for idle_ms (another daemon of the save may still
 * be at work: store_s3_sweep), with its uploads and shards; never those of a
 * save owed a commit (its records are in <state_dir>/spill: pending.h).
 * Only an area whose attempt.json carries the noted id and life is removed,
 * as its owner (creds noted).  An entry whose area could not be removed
 * whole (S3 not answering) stays for the next sweep.  Returns how many
 * areas were removed; messages go to the log.
 */
unsigned registry_sweep(struct registry *reg, const char *instance, int64_t min_age_ms,
			int64_t idle_ms, char (*live)[STORE_ID_LEN + 1], size_t n_live);

#endif
