/* SPDX-License-Identifier: MIT */
/* writer.c - see writer.h. */
#include "daemon/writer.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/server.h"
#include "format/crc32c.h"


int writer_init(struct writer *w, struct server *srv, uint8_t *base, uint64_t arena_bytes,
		uint64_t slot_bytes, struct store_arena *io,
		void (*release)(struct writer *w, uint32_t slot))
{
	w->srv = srv;
	w->store = srv->store;
	w->io = io;
	w->base = base;
	w->slot_bytes = slot_bytes;
	w->n_slots = (uint32_t)(arena_bytes / slot_bytes);
	w->held = 0;
	w->release = release;
	w->last_extent_ms = 0;
	list_init(&w->crc_q);
	w->slots = calloc(w->n_slots ? w->n_slots : 1, sizeof(*w->slots));
	if (!w->slots)
		return -ENOMEM;
	for (uint32_t i = 0; i < w->n_slots; i++) {
		w->slots[i].w = w;
		list_init(&w->slots[i].clink);
	}
	return 0;
}

void writer_free(struct writer *w)
{
	free(w->slots);
	w->slots = NULL;
}

bool writer_slot_held(const struct writer *w, uint32_t slot)
{
	return w->slots[slot].t != NULL;
}

/* Both the write and the checksum are done: give the slot back, then tell
 * the target (which may fail its save: the slot is free first). */
static void slot_finish(struct wslot *s)
{
	struct writer *w = s->w;
	struct wtarget *t = s->t;
	uint64_t bytes = s->len;
	int res = s->res;

	s->t = NULL;
	t->held--;
	w->held--;
	w->release(w, (uint32_t)(s - w->slots));
	t->extent_done(t, bytes, res);
}

static void io_done(void *ud, int res)
{
	struct wslot *s = ud;

	s->writing = false;
	s->res = res;
	if (!s->crc_pending)
		slot_finish(s);
}

/* Walks the CRC pieces of l's items that lie in [off, off + len) of the
 * file, whose bytes are at buf: stores each piece's CRC into out, or (want
 * given) compares it with want and stops at the first that differs,
 * returning -EIO with the offset of its grid block in *bad.  With whole,
 * also the CRC32C of the entire range: the pieces combined in file order
 * with the bytes outside them (the header, padding between items). */
static int crc_walk(const struct layout *l, uint32_t *out, const uint32_t *want,
		    const uint8_t *buf, uint64_t off, uint64_t len, uint64_t *bad,
		    uint32_t *whole)
{
	uint64_t end = off + len, pos = off;
	uint32_t acc = 0;

	for (size_t i = layout_find(l, off); i < l->n_items && l->items[i].begin < end; i++) {
		const struct layout_item *it = &l->items[i];
		uint64_t b = it->begin > off ? it->begin : off;
		uint64_t e = it->end < end ? it->end : end;
		if (whole && b > pos)
			acc = crc32c(buf + (pos - off), b - pos, acc);
		if (e > pos)
			pos = e;
		while (b < e) {
			uint64_t grid = (b / LAYOUT_CRC_BLOCK + 1) * LAYOUT_CRC_BLOCK;
			uint64_t pe = grid < e ? grid : e;
			/* Piece index within the item: grid cells since its first. */
			uint32_t k = (uint32_t)(b / LAYOUT_CRC_BLOCK - it->begin / LAYOUT_CRC_BLOCK);
			uint32_t c = crc32c(buf + (b - off), pe - b, 0);
			if (whole)
				acc = crc32c_combine(acc, c, pe - b);
			if (!want) {
				out[it->crc0 + k] = c;
			} else if (want[it->crc0 + k] != c) {
				*bad = b / LAYOUT_CRC_BLOCK * LAYOUT_CRC_BLOCK;
				return -EIO;
			}
			b = pe;
		}
	}
	if (whole) {
		if (pos < end)
			acc = crc32c(buf + (pos - off), end - pos, acc);
		*whole = acc;
	}
	return 0;
}

uint32_t writer_crc_extent(const struct layout *l, uint32_t *crcs, const uint8_t *buf,
			   uint64_t off, uint64_t len)
{
	uint32_t whole = 0;

	crc_walk(l, crcs, NULL, buf, off, len, NULL, &whole);
	return whole;
}

int writer_crc_verify(const struct layout *l, const uint32_t *crcs, const uint8_t *buf,
		      uint64_t off, uint64_t len, uint64_t *bad)
{
	return crc_walk(l, NULL, crcs, buf, off, len, bad, NULL);
}

/* Checksum thread: reads only the slot's bytes and the target's layout
 * (fixed while a slot of it is held) and writes the slot's own entries of
 * t->crcs; the loop reads them after done() (worker.c's lock orders it). */
static void crc_run(struct work *job)
{
	struct wslot *s = (struct wslot *)((char *)job - offsetof(struct wslot, crc_job));
	struct writer *w = s->w;

	const uint8_t *buf = w->base + (uint64_t)(s - w->slots) * w->slot_bytes;

	/* Resident image: copy, then checksum the COPY, so the image holds
	 * exactly the bytes the index describes even if the client writes
	 * its slot meanwhile (the write from the slot then disagrees and is
	 * caught: by S3's checksum, or by the CRCs at load).  Offsets and
	 * lengths were checked against the file size when the extent came
	 * (rank_extent). */
	if (s->t->image) {
		memcpy(s->t->image + s->file_off, buf, s->len);
		buf = s->t->image + s->file_off;
	}
	if (s->write_held)
		s->ext_crc = writer_crc_extent(s->t->layout, s->t->crcs, buf, s->file_off, s->len);
	else
		crc_walk(s->t->layout, s->t->crcs, NULL, buf, s->file_off, s->len, NULL, NULL);
}

static uint64_t padded_len(uint64_t len)
{
	return (len + LAYOUT_ALIGN - 1) / LAYOUT_ALIGN * LAYOUT_ALIGN;
}

/* A held write that will not run (its save failed): the slot is done. */
static void held_drop(struct wslot *s)
{
	s->write_held = false;
	s->writing = false;
	s->res = -ECANCELED;
}

static void crc_done(struct work *job)
{
	struct wslot *s = (struct wslot *)((char *)job - offsetof(struct wslot, crc_job));
	struct writer *w = s->w;

	s->crc_pending = false;
	if (s->write_held) {
		if (s->t->no_crc) {
			held_drop(s);
		} else {
			s->write_held = false;
			w->store->shard_write_crc(s->t->shard, w->io,
						  (uint64_t)(s - w->slots) * w->slot_bytes,
						  s->file_off, padded_len(s->len), s->ext_crc,
						  io_done, s);
			return;
		}
	}
	if (!s->writing)
		slot_finish(s);
}

void writer_crc_due(struct writer *w)
{
	/* slot_finish() may fail a save, which calls back here: take one slot
	 * at a time off the queue's head, so a nested call finds the rest. */
	while (!list_empty(&w->crc_q)) {
		struct wslot *s = list_entry(w->crc_q.next, struct wslot, clink);

		list_del(&s->clink);
		if (s->t->no_crc) {
			s->crc_pending = false;
			if (s->write_held)
				held_drop(s);
			if (!s->writing)
				slot_finish(s);
			continue;
		}
		s->crc_job.run = crc_run;
		s->crc_job.done = crc_done;
		s->crc_job.creds = NULL;
		workers_submit(&w->srv->crcs, &s->crc_job);
	}
}

void writer_extent(struct writer *w, uint32_t slot, struct wtarget *t, uint64_t file_off,
		   uint64_t len)
{
	struct wslot *s = &w->slots[slot];

	s->t = t;
	s->file_off = file_off;
	s->len = len;
	s->res = 0;
	s->writing = true;
	s->crc_pending = true;
	s->write_held = t->crc_first;
	list_add_tail(&w->crc_q, &s->clink);
	t->held++;
	w->held++;
	w->last_extent_ms = now_ms();

	/* The write goes first (unless it waits for the checksum: crc_first);
	 * the checksum waits unless it is due.  Both only read the slot, and
	 * it is released after both (a slot is never rewritten while held:
	 * the client has no right to it until RELEASE). */
	if (!s->write_held)
		w->store->shard_write(t->shard, w->io, (uint64_t)slot * w->slot_bytes, file_off,
				      padded_len(len), io_done, s);
	if (t->crc_now || t->no_crc || w->n_slots - w->held <= 1)
		writer_crc_due(w);
	else
		w->store->arena_reap(w->io);
}
