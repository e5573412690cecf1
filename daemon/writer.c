/* SPDX-License-Identifier: MIT */
/*
 * writer.c - drains a client's arena to its shard files with io_uring.
 *
 * Each client has its own ring with its arena registered as fixed buffers,
 * so writes go from the shared pages to the disk with O_DIRECT and no copy,
 * and pages are pinned once, at connect time, not on every write.  One
 * kernel limit shapes the registration: a fixed buffer may be at most 1 GiB,
 * so the arena is registered as consecutive 1 GiB iovecs; slots (<= 8 MiB,
 * aligned) never straddle two of them.
 *
 * Every slot has one wreq.  A write that finds the ring full waits in
 * wait_q; completions make room.  The ring's eventfd wakes the epoll loop.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/server.h"

#define FIXED_MAX (1ull << 30)
#define UD_FSYNC_TAG 1ull /* low bit of user_data: an fsync of a rank */

int writer_init(struct client *c, unsigned depth, char *err, size_t errlen)
{
	struct iovec *iov = NULL;
	unsigned n_iov;
	int r;

	c->ring_depth = depth;
	r = io_uring_queue_init(depth + 8, &c->ring, 0);
	if (r < 0) {
		snprintf(err, errlen, "io_uring_queue_init: %s", strerror(-r));
		return r;
	}
	c->ring_ok = true;

	n_iov = (unsigned)((c->arena_bytes + FIXED_MAX - 1) / FIXED_MAX);
	iov = calloc(n_iov, sizeof(*iov));
	if (!iov) {
		r = -ENOMEM;
		goto out_ring;
	}
	for (unsigned i = 0; i < n_iov; i++) {
		uint64_t off = (uint64_t)i * FIXED_MAX;
		iov[i].iov_base = c->arena + off;
		iov[i].iov_len = c->arena_bytes - off < FIXED_MAX ? c->arena_bytes - off : FIXED_MAX;
	}
	r = io_uring_register_buffers(&c->ring, iov, n_iov);
	free(iov);
	if (r == 0) {
		c->fixed = true;
	} else {
		/* Typically RLIMIT_MEMLOCK: still correct, only slower (pages are
		 * pinned per write).  The unit file raises the limit. */
		log_warn("client %u: io_uring buffer registration failed (%s); writing without "
			 "fixed buffers (raise LimitMEMLOCK)",
			 c->id, strerror(-r));
	}

	c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->efd < 0) {
		r = -errno;
		goto out_ring;
	}
	r = io_uring_register_eventfd(&c->ring, c->efd);
	if (r < 0)
		goto out_efd;
	return 0;

out_efd:
	close(c->efd);
	c->efd = -1;
out_ring:
	io_uring_queue_exit(&c->ring);
	c->ring_ok = false;
	snprintf(err, errlen, "io_uring setup: %s", strerror(-r));
	return r;
}

void writer_exit(struct client *c)
{
	if (c->ring_ok) {
		io_uring_queue_exit(&c->ring);
		c->ring_ok = false;
	}
	if (c->efd >= 0) {
		close(c->efd);
		c->efd = -1;
	}
}

/* Queues the SQE for a slot's next chunk.  Returns false if the ring is full. */
static bool prep_write(struct client *c, uint32_t slot)
{
	struct wreq *w = &c->slots[slot];
	struct io_uring_sqe *sqe;
	uint64_t arena_off = (uint64_t)slot * c->slot_bytes;
	uint64_t done_pad = w->file_off - (w->file_off / c->slot_bytes) * c->slot_bytes;
	uint8_t *buf = c->arena + arena_off + done_pad;

	if (c->ring_inflight >= c->ring_depth)
		return false;
	sqe = io_uring_get_sqe(&c->ring);
	if (!sqe)
		return false;
	if (c->fixed)
		io_uring_prep_write_fixed(sqe, w->rs->fd, buf, (unsigned)w->len, w->file_off,
					  (int)(arena_off / FIXED_MAX));
	else
		io_uring_prep_write(sqe, w->rs->fd, buf, (unsigned)w->len, w->file_off);
	io_uring_sqe_set_data64(sqe, (uint64_t)slot << 1);
	c->ring_inflight++;
	w->rs->inflight++;
	return true;
}

static void flush(struct client *c)
{
	int r = io_uring_submit(&c->ring);
	if (r < 0 && r != -EBUSY && r != -EAGAIN)
		log_err("client %u: io_uring_submit: %s", c->id, strerror(-r));
}

void writer_submit(struct client *c, uint32_t slot)
{
	struct wreq *w = &c->slots[slot];

	if (!list_empty(&c->wait_q) || !prep_write(c, slot)) {
		list_add_tail(&c->wait_q, &w->qlink);
		return;
	}
	flush(c);
}

void writer_fsync(struct rank_save *rs)
{
	struct client *c = rs->client;
	struct io_uring_sqe *sqe = io_uring_get_sqe(&c->ring);

	if (!sqe) {
		/* The ring reserves room beyond ring_depth for fsyncs; if even
		 * that is full, do it synchronously rather than lose it. */
		rank_synced(rs, fsync(rs->fd) < 0 ? -errno : 0);
		return;
	}
	io_uring_prep_fsync(sqe, rs->fd, 0);
	io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)rs | UD_FSYNC_TAG);
	rs->inflight++;
	rs->syncing = true;
	flush(c);
}

/* A slot's write finished (res bytes, or -errno). */
/* Starts the fsync once a staged rank is completely written and
 * checksummed: its index, written after the fsync, needs every CRC. */
static void rank_maybe_sync(struct rank_save *rs)
{
	if (!rs->staged || rs->extents_written != rs->n_extents || rs->crc_pending ||
	    rs->syncing || rs->durable || rs->failed || rs->save->state != SAVE_ACTIVE)
		return;
	rs->t_written = now_us();
	/* The last extent was padded to LAYOUT_ALIGN for O_DIRECT: cut the file
	 * to its real length before making it durable. */
	if (ftruncate(rs->fd, (off_t)rs->layout.file_size) < 0)
		rank_fail(rs, -errno, "truncating the shard of rank %u: %s", rs->rank,
			  strerror(errno));
	else
		writer_fsync(rs);
}

/* Gives a slot back to the client.  The slot must be written (or its save
 * failed) and no longer waiting for its checksum. */
static void slot_release(struct client *c, uint32_t slot)
{
	struct wreq *w = &c->slots[slot];
	struct rank_save *rs = w->rs;

	if (w->crc_pending) {
		list_del(&w->clink);
		w->crc_pending = false;
		rs->crc_pending--;
	}
	w->rs = NULL;
	w->written = false;
	c->slots_held--;
	rs->held--;
	client_send_release(c, (uint64_t)slot * c->slot_bytes);
}

/* A slot's write finished (res bytes, or -errno). */
static void write_done(struct client *c, uint32_t slot, int res)
{
	struct wreq *w = &c->slots[slot];
	struct rank_save *rs = w->rs;

	c->ring_inflight--;
	rs->inflight--;
	if (res < 0 || rs->failed || rs->save->state == SAVE_FAILED) {
		if (res < 0 && !rs->failed) {
			uint64_t lim = c->srv->fsize_limit;
			bool over = lim && w->file_off + w->len > lim;

			/* Past RLIMIT_FSIZE an O_DIRECT write is cut short to a
			 * length it cannot have: the kernel says EINVAL. */
			rank_fail(rs, res, "writing the shard of rank %u in '%s/%s': %s%s",
				  rs->rank, rs->save->root, rs->save->work, strerror(-res),
				  over ? " (the write passes ckptd's file size limit, RLIMIT_FSIZE "
					 "or systemd's LimitFSIZE=)" : "");
		}
		slot_release(c, slot);
		return;
	}
	if ((uint64_t)res < w->len) {
		/* Short write (a signal, a full disk about to report ENOSPC):
		 * go on from where it stopped, as with write(2).  A zero-byte
		 * write would loop forever: treat it as an I/O error. */
		if (res == 0) {
			rank_fail(rs, -EIO, "writing the shard of rank %u: no progress", rs->rank);
			slot_release(c, slot);
			return;
		}
		w->file_off += (uint64_t)res;
		w->len -= (uint64_t)res;
		writer_submit(c, slot);
		return;
	}

	rs->bytes_written += w->done;
	rs->extents_written++;
	c->srv->bytes_written += w->done;
	w->written = true;
	if (!w->crc_pending)
		slot_release(c, slot);
	rank_maybe_sync(rs);
}

void writer_crc_drain(struct client *c, uint32_t want_free)
{
	while (!list_empty(&c->crc_q) && (want_free == 0 || c->n_slots - c->slots_held < want_free)) {
		struct wreq *w = list_entry(c->crc_q.next, struct wreq, clink);
		struct rank_save *rs = w->rs;
		uint32_t slot = (uint32_t)(w - c->slots);
		uint64_t ext_off = w->file_off - w->file_off % c->slot_bytes;

		list_del(&w->clink);
		w->crc_pending = false;
		rs->crc_pending--;
		if (!rs->failed && rs->save->state == SAVE_ACTIVE)
			rank_crc_extent(rs, c->arena + (uint64_t)slot * c->slot_bytes, ext_off,
					w->done);
		if (w->written)
			slot_release(c, slot);
		rank_maybe_sync(rs);
		/* Keep the disk busy between checksums. */
		writer_reap(c);
	}
}

void writer_reap(struct client *c)
{
	struct io_uring_cqe *cqe;
	unsigned head, n;

	if (!c->ring_ok)
		return;
	for (;;) {
		n = 0;
		struct {
			uint64_t ud;
			int res;
		} done[64];
		io_uring_for_each_cqe(&c->ring, head, cqe)
		{
			done[n].ud = cqe->user_data;
			done[n].res = cqe->res;
			if (++n == 64)
				break;
		}
		if (n == 0)
			break;
		io_uring_cq_advance(&c->ring, n);
		for (unsigned i = 0; i < n; i++) {
			if (done[i].ud & UD_FSYNC_TAG) {
				struct rank_save *rs =
					(struct rank_save *)(uintptr_t)(done[i].ud & ~UD_FSYNC_TAG);
				rs->inflight--;
				rs->syncing = false;
				rank_synced(rs, done[i].res < 0 ? done[i].res : 0);
			} else {
				write_done(c, (uint32_t)(done[i].ud >> 1), done[i].res);
			}
		}
		/* Completions made room: start queued writes. */
		bool any = false;
		while (!list_empty(&c->wait_q)) {
			struct wreq *w = list_entry(c->wait_q.next, struct wreq, qlink);
			uint32_t slot = (uint32_t)(w - c->slots);
			if (!prep_write(c, slot))
				break;
			list_del(&w->qlink);
			any = true;
		}
		if (any)
			flush(c);
	}
}

void writer_ring_event(struct client *c)
{
	uint64_t junk;

	if (read(c->efd, &junk, sizeof(junk)) < 0 && errno != EAGAIN)
		log_debug("client %u: eventfd read: %s", c->id, strerror(errno));
	writer_reap(c);
}
