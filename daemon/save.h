/* SPDX-License-Identifier: MIT */
/*
 * save.h - saves and their ranks: the daemon's state machine, in one place.
 *
 * A save is one attempt (store.h) of one job at one checkpoint name on this
 * daemon; a rank is the part one connection writes.
 *
 *   save:  OPENING --open job--> ACTIVE --all local ranks durable-->
 *            coordinator:  COMMITTING --commit job--> COMMITTED
 *            other daemon: ACTIVE, polling until rank 0's daemon commits
 *          any non-final state --fail--> FAILED
 *
 *   rank:  OPENING --shard job--> STAGING --every extent arrived--> WRITING
 *          --every extent written and checksummed--> FINISHING
 *          --fsync + index job--> DURABLE;   any non-final --fail--> FAILED
 *          A shard that spills (store.h: the spill tier) goes FINISHING
 *          --fsync job--> UPLOADING --upload + index job--> DURABLE.
 *
 * The ACK of a SAVE_BEGIN goes out when the rank leaves OPENING (accepted
 * or refused); SAVE_DURABLE when its bytes are durable at the first tier
 * (UPLOADING, or DURABLE for a shard that does not spill); SAVE_DONE when
 * the save is COMMITTED or FAILED.  A save that
 * fails tells every rank; a rank that fails (its client vanished before
 * staging, an I/O error) fails its save.  A save never fails while its
 * commit job is in flight: the job decides.
 *
 * Spilled saves (the spill tier) are owed a commit.  A spilled rank's
 * file, once fsynced, is recorded in the state directory (pending.h)
 * before its SAVE_DURABLE goes out, and the save is then `pending`: a
 * step that meets the store failing (an upload, an index, the count or the
 * commit: unreachable, throttled, refusing) never fails it; the step is
 * tried again after a capped, growing wait, for as long as it takes, and
 * the commit deadline does not run out on a save whose ranks are all
 * durable on this node (save_whole_here).  It ends only by its commit, by
 * a failure that no retry can mend (the spilled copy no longer matches
 * its checksums, another save committed the name, another daemon failed
 * the save, ranks on other daemons never came within the deadline, which
 * counts only while the store answers), or by an operator (save_drop).
 * When the daemon stops, a pending save is `parked`: final in this life,
 * nothing of it removed, and the next life resumes it from its records
 * (saves_resume): a save with no client at all, whose ranks start in
 * UPLOADING.
 *
 * Lifetimes: a rank lives until its save is final, it holds no arena slot and
 * no job of it is in flight; a save until all its ranks are gone and no job
 * of it (its heartbeat's included) is in flight.  save_reap() frees them between loop rounds, so no
 * handler frees what another event of the same round may point at.
 */
#ifndef CKPTD_SAVE_H
#define CKPTD_SAVE_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/list.h"
#include "daemon/worker.h"
#include "daemon/writer.h"
#include "format/layout.h"
#include "shm/proto.h"
#include "store/store.h"

struct conn;
struct image;
struct server;

enum save_state { SAVE_OPENING, SAVE_ACTIVE, SAVE_COMMITTING, SAVE_COMMITTED, SAVE_FAILED };
enum rank_state {
	RANK_OPENING,
	RANK_STAGING,
	RANK_WRITING,
	RANK_FINISHING,
	RANK_UPLOADING,
	RANK_DURABLE,
	RANK_FAILED,
};

struct rank {
	struct save *save;
	struct conn *conn;         /* lives at least as long as its ranks;
	                            * NULL for a rank a later life resumed */
	enum rank_state state;
	uint32_t rank, token;
	struct layout layout;
	uint32_t *crcs;
	struct wtarget wt;
	struct store_shard *shard;
	struct image *img;         /* resident.h: filled by this save, or NULL */
	uint32_t n_extents, extents_in, extents_done;
	uint8_t *got;              /* one bit per extent */
	uint64_t bytes_in, bytes_written;
	int err;                   /* the rank's own failure, for its client */
	bool told;                 /* SAVE_DONE sent (or the client is gone) */
	bool made;                 /* this daemon created the rank's shard: the
	                            * only shard its cleanup may remove */
	int create_err;            /* the shard could not be created: why */
	bool job_busy;             /* job in flight */
	bool spill;                /* its shard spills (store.h) */
	bool recorded;             /* spilled: in the state directory (pending.h) */
	bool forwarded;            /* spilled: the store has the file; only
	                            * its index is left to publish */
	uint64_t extent;           /* the part size: its connection's slots */
	uint64_t uploaded;         /* spilled: bytes the store acknowledged
	                            * (written atomically by the upload job) */
	struct work job;
	char job_err[PROTO_MSG_LEN];
	char to[STORE_ID_LEN + 1]; /* the claim its index is addressed to */
	int64_t t_begin, t_staged, t_written;
	struct list slink;         /* in save.ranks */
	struct list clink;         /* in conn.ranks */
};

struct save {
	struct server *srv;
	enum save_state state;
	struct store_key key;
	char id[STORE_ID_LEN + 1];
	char root[4096];           /* as asked, then canonical once open */
	char asked_root[4096];     /* as the first rank wrote it */
	struct creds creds;        /* of the connection that opened it */
	struct store_attempt *att;
	bool created;              /* this daemon made the work area */
	bool noted;                /* it is in the registry (created, or with a
	                            * spill area of this daemon's) */
	bool coordinator;          /* this daemon holds the claim: it created
	                            * rank 0's shard (exclusively) and claimed
	                            * the area; only it commits or removes the
	                            * work area (set once the claim succeeded,
	                            * never just because rank 0 is here) */
	bool delivered;            /* every local rank durable (indexes out) */
	char nonce[STORE_ID_LEN + 1]; /* coordinator: its claim of the area */
	bool cleaned;              /* the failure cleanup ran */
	uint32_t n_present;        /* coordinator: ranks delivered so far */
	bool pending;              /* a rank of it spilled: owed a commit
	                            * (see the top of this file) */
	bool resumed;              /* made from records at start-up */
	bool resend;               /* pending: a shard of its own is gone from
	                            * the store: sent again from the node's
	                            * copy, as a resumed save (save.c) */
	bool parked;               /* final in this life only: its records
	                            * and areas stay for the next one */
	uint64_t rec_gen;          /* orders its record writes (pending.h) */
	unsigned rounds;           /* pending: steps that met the store failing */
	int64_t retry_ms;          /* pending: no new step before (now_ms) */
	int64_t last_err_ms;       /* pending: when the last one failed, or 0 */
	char last_err[PROTO_MSG_LEN];
	int64_t started_ms, deadline_ms;
	int err;
	char msg[PROTO_MSG_LEN];
	bool job_busy;
	struct work job;
	bool renew_busy;           /* a heartbeat job is in flight (save.c) */
	bool renew_off;            /* the store needs none, or the area is gone */
	bool renew_failing;        /* the last one failed (logged once) */
	int64_t renew_due_ms;      /* the next heartbeat, on now_ms()'s clock */
	uint64_t bytes;            /* local ranks' file bytes */
	struct list ranks;
	struct list link;          /* in server.saves */
};

/*
 * A SAVE_BEGIN whose descriptor parsed into *l (taken over, zeroed).  On a
 * refusal that needs no job, returns -errno with the reason in err (the
 * caller ACKs it); else 0, and the ACK follows when the rank is open.
 */
int save_begin(struct server *srv, struct conn *c, uint32_t token, uint32_t attempt,
	       struct layout *l, char *err, size_t errlen);

/* The rank of connection c with this token, or NULL. */
struct rank *rank_find(struct conn *c, uint32_t token);

/*
 * An EXTENT for rank r: checks it against the layout (file_off a slot
 * multiple inside the file, the right length, not sent before).  Returns 0
 * and hands it to the writer, 1 if the rank no longer wants it (the caller
 * releases the slot), or -EPROTO with the reason in err (the client broke
 * the protocol).
 */
int rank_extent(struct rank *r, uint32_t slot, uint64_t file_off, uint64_t len, char *err,
		size_t errlen);

/* The client aborted rank r (SAVE_ABORT), or its connection closed. */
void rank_abort(struct rank *r, int err, const char *why);

/* Fails a save for every rank. */
void save_fail(struct save *s, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Periodic: deadlines, polling other daemons, retrying commits. */
void saves_tick(struct server *srv);
/* Shutdown: fails every save whose bytes are not all here (stop=true
 * fails all of them but the pending ones, which are parked). */
void saves_stop(struct server *srv, bool all);
/* True while a save still has something to do now: not a pending save
 * that waits only for its next try (those are parked at the stop). */
bool saves_busy(struct server *srv);

/* [start-up] Resumes the pending saves an earlier life recorded
 * (pending.h), before the first sweep.  Returns how many. */
unsigned saves_resume(struct server *srv);

/*
 * An operator's `ckptctl spill drop`: fails the pending save whose attempt
 * id, or canonical ROOT/NAME, is `what`, removing its spilled copy, its
 * records and what it left in the store.  Only its owner or root (uid)
 * may.  Returns 0, -ENOENT (no such pending save), -EPERM, -EBUSY (its
 * commit is in flight: it may commit), with the message in msg.
 */
int save_drop(struct server *srv, uid_t uid, const char *what, char *msg, size_t msglen);
/* Frees final saves and ranks nothing points at any more. */
void saves_reap(struct server *srv);
/* Fills ids of live saves (at most max); returns how many. */
size_t saves_live_ids(struct server *srv, char (*ids)[STORE_ID_LEN + 1], size_t max);
/* "staging", "writing", "waiting", "committing" for the status report. */
const char *save_state_name(const struct save *s);

#endif
