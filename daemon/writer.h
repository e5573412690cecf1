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
 * Checksums are CPU work, so they run on the daemon's checksum thread
 * (server.crcs), one job per slot, never on the loop: a cold 8 MiB slot can
 * take tens of milliseconds, and the loop must answer every other client
 * meanwhile.  While a client is still copying they are deferred (on a small
 * machine they would take CPU from its copy threads); they become due when
 * the rank is staged, the client goes away or stalls, or it runs short of
 * free slots.
 *
 * A store that checks each extent's CRC32C on receipt (S3:
 * shard_wants_crc) gets the extent only after its checksum: the same pass
 * that takes the CRC pieces for the index gives the extent's whole CRC
 * (combined from the pieces and the bytes between items), so the checksum
 * S3 verifies and the ones the manifest records come from one read of the
 * bytes, and a slot changed after that read fails its upload instead of
 * committing bytes the manifest does not describe.  It also keeps the
 * upload's CPU (sending, and the sink's on this machine) off a client
 * that is still copying, as the checksums are.
 */
#ifndef CKPTD_WRITER_H
#define CKPTD_WRITER_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/list.h"
#include "daemon/worker.h"
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
	bool crc_first;          /* the store wants each extent's CRC32C with it:
				  * write after the checksum (shard_write_crc) */
	unsigned held;           /* slots the writer holds for this target */
	uint8_t *image;          /* or NULL: the checksum pass copies every
	                          * extent here at its file offset (resident.h;
	                          * at least layout->file_size bytes) */
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
	uint32_t reads;          /* loadio.h reads into it in flight (the
	                          * client's slot, lent to the daemon) */
	bool write_held;         /* the write waits for the checksum (crc_first) */
	uint32_t ext_crc;        /* CRC32C of the extent's len bytes (crc_first) */
	int res;
	struct list clink;       /* in writer.crc_q while its checksum waits */
	struct work crc_job;     /* the checksum, once it is due */
};

struct writer {
	struct server *srv;
	const struct store_ops *store;
	struct store_arena *io;
	uint8_t *base;
	uint64_t slot_bytes;
	uint32_t n_slots, held;
	struct wslot *slots;
	struct list crc_q;       /* slots whose checksum is deferred */
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
 * away or stalled, or it is short of free slots): they go to the checksum
 * thread, or straight to done for a target that no longer needs them. */
void writer_crc_due(struct writer *w);

/* Slots held with a write or checksum still to finish. */
static inline uint32_t writer_held(const struct writer *w)
{
	return w->held;
}

/* Checks the CRC pieces of l's items in the file range [off, off + len),
 * whose bytes are at buf, against crcs (as the checksum jobs stored them):
 * 0, or -EIO with the grid block of the first mismatch in *bad. */
/* Computes the CRC pieces of l's items in the file range [off, off + len)
 * from its bytes at buf into crcs (their entries only), and returns the
 * CRC32C of all len bytes, built from those pieces and the bytes between
 * items (crc32c_combine): one pass over the bytes. */
uint32_t writer_crc_extent(const struct layout *l, uint32_t *crcs, const uint8_t *buf,
			   uint64_t off, uint64_t len);

int writer_crc_verify(const struct layout *l, const uint32_t *crcs, const uint8_t *buf,
		      uint64_t off, uint64_t len, uint64_t *bad);

#endif
