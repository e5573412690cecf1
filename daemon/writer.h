/* SPDX-License-Identifier: MIT */
/*
 * writer.h - drains a connection's arena: each slot the client filled is
 * written to its shard through the storage backend and checksummed, then
 * given back.
 *
 * The writer knows shards only as `struct wtarget`: where the bytes go
 * (store shard), how to checksum them (layout, crcs) and whom to tell.  It
 * reports every finished extent through the target's callback and never
 * calls into the save or commit logic (save.h implements the callback), as
 * fio's engines report completions.
 *
 * Checksums are CPU work on the loop thread.  While a client is still
 * copying they are deferred (on a small machine they would take CPU from its
 * copy threads), and when they are due they run in batches of a few slots
 * per loop round, so one 2 GiB rank never holds the loop for long.
 */
#ifndef CKPTD_WRITER_H
#define CKPTD_WRITER_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/list.h"
#include "format/layout.h"
#include "store/store.h"

struct server;

/* A shard as the writer sees it. */
struct wtarget {
	struct store_shard *shard;
	const struct layout *layout;
	uint32_t *crcs;          /* layout->n_crcs */
	bool no_crc;             /* failed: checksums are no longer needed */
	bool crc_now;            /* every extent arrived: checksum without delay */
	unsigned held;           /* slots the writer holds for this target */
	/* An extent of `bytes` file bytes is written and checksummed (res 0),
	 * or its write failed (res < 0).  Its slot is free again already. */
	void (*extent_done)(struct wtarget *t, uint64_t bytes, int res);
};

struct wslot {
	struct writer *w;
	struct wtarget *t;       /* NULL: free (the client owns it) */
	uint64_t file_off;       /* extent's offset in the file */
	uint64_t len;            /* file bytes of the extent */
	bool writing, crc_pending;
	int res;
	uint64_t crc_done;       /* bytes of the extent checksummed so far */
	struct list clink;       /* in writer.crc_q */
};

struct writer {
	struct server *srv;
	const struct store_ops *store;
	struct store_arena *io;
	uint8_t *base;
	uint64_t slot_bytes;
	uint32_t n_slots, held;
	struct wslot *slots;
	struct list crc_q;       /* slots whose checksum is due or deferred */
	struct list busy_link;   /* in server.crc_busy while checksums are due */
	bool urgent;             /* checksums due now (not deferred) */
	int64_t last_extent_ms;
	/* Gives slot `slot` back to the client (a RELEASE message). */
	void (*release)(struct writer *w, uint32_t slot);
};

int writer_init(struct writer *w, struct server *srv, uint8_t *base, uint64_t arena_bytes,
		uint64_t slot_bytes, struct store_arena *io,
		void (*release)(struct writer *w, uint32_t slot));
void writer_free(struct writer *w);

/* True if the daemon holds `slot` (between an extent and its release). */
bool writer_slot_held(const struct writer *w, uint32_t slot);

/* Takes the slot the client filled with the extent [file_off, +len) of t,
 * and starts its write (padded to LAYOUT_ALIGN for O_DIRECT). */
void writer_extent(struct writer *w, uint32_t slot, struct wtarget *t, uint64_t file_off,
		   uint64_t len);

/* Makes the deferred checksums due (the rank is staged, the client went
 * away or stalled, or it is short of free slots). */
void writer_crc_due(struct writer *w);

/* Loop: checksums due slots, a 1 MiB piece (the CRC grid) at a time, until
 * about `budget` bytes are done or the clock passes `until_us` (now_us()),
 * whichever comes first; at least one piece.  Returns the bytes used of the
 * budget (> 0); the writer leaves server.crc_busy once nothing is due. */
uint64_t writer_crc_step(struct writer *w, uint64_t budget, int64_t until_us);

/* Slots held with a write or checksum still to finish. */
static inline uint32_t writer_held(const struct writer *w)
{
	return w->held;
}

#endif
