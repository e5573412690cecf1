/* SPDX-License-Identifier: MIT */
/*
 * store_spill.h - the spill tier: S3 roots written through the node's disk
 * (spill.c has the design).  The daemon starts it when `s3_spill_dir` is
 * configured; the router (store_route.h) then sends every attempt on an S3
 * root here.
 */
#ifndef CKPT_STORE_STORE_SPILL_H
#define CKPT_STORE_STORE_SPILL_H

#include <stdbool.h>
#include <sys/types.h>

#include "store/store.h"

extern const struct store_ops store_spill;

/* [startup, as the daemon] Creates `dir` if needed and checks it belongs to
 * this process and is not writable by others; keep: committed checkpoints
 * kept per root in the restore cache (0: none).  Returns 0 or -errno. */
int store_spill_start(const char *dir, unsigned keep, char *err, size_t errlen);
void store_spill_stop(void);
bool store_spill_on(void);

/* [worker, as the daemon] Makes <dir>/<uid> (mode 0700, owned by uid) if it
 * is missing, and checks it.  0 when the tier is off. */
int store_spill_prepare(uid_t uid, gid_t gid, char *err, size_t errlen);

/* The local root of uid's spill work areas, or -ENOENT when the tier is
 * off (the sweep removes a dead attempt's area there). */
int store_spill_work_root(uid_t uid, char *buf, size_t len);

#endif
