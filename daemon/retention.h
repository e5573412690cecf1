/* SPDX-License-Identifier: MIT */
/*
 * retention.h - ckptd's own retention: the policies of its config
 * (`retention = ROOT RULE`), applied in the background by the prune engine
 * (store/prune.h) to the directory a save committed in, after each
 * successful commit (never after a failed one), and to every directory it
 * knows on a periodic sweep.
 *
 * A pass covers the checkpoints of one owner in one directory: the
 * committing user's, with that user's credentials (a job on the retention
 * worker, worker.h), so one user's commits never count against another's
 * checkpoints and the kernel checks every removal.  S3 checkpoints have no
 * owner: a pass there covers the directory.  Passes run one at a time on a
 * thread at the lowest CPU and I/O priority, never on the loop, so they
 * never block a save; a directory already queued is not queued twice.
 */
#ifndef CKPTD_RETENTION_H
#define CKPTD_RETENTION_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/creds.h"

struct server;

/* [startup] Starts the retention worker if the config has a policy.
 * 0 or -errno. */
int retention_start(struct server *srv);
/* [loop] Lets the pass in flight end; drops the queue. */
void retention_stop(struct server *srv);

/* [loop] A save by `creds` committed in directory `dir` (a local path or
 * an s3:// URL): queues a pass there if a policy covers it. */
void retention_after_commit(struct server *srv, const char *dir, const struct creds *creds);

/* [loop] Called from the loop's timer: queues the periodic sweep when due. */
void retention_tick(struct server *srv, int64_t now_ms);

/* [loop] Queues a sweep now (on demand: SIGUSR1 or the status socket). */
void retention_sweep_now(struct server *srv);

/* The policy text that covers dir, or NULL (for status). */
const char *retention_policy_for(const struct server *srv, const char *dir);

#endif
