/* SPDX-License-Identifier: MIT */
/*
 * copy.c - copy engines and the copy threads that fill arena slots.
 *
 * Extent k of a save is the file bytes [k*S, min((k+1)*S, file_size)),
 * S = slot_bytes.  A copy thread claims the next extent of the active save,
 * takes one free slot (waiting when the daemon has not released any: that
 * is the backpressure when the arena is smaller than the checkpoint), fills
 * it from the header buffer and the items' memory, and sends one EXTENT for
 * it (a few at a time once the save is under way: see SEND_BATCH) -- or
 * parks it while the daemon has not yet accepted the save (save.c).
 * Nothing in this path allocates or makes a syscall per item.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "client/internal.h"

/* ---- engines ---- */

/*
 * The host engine writes the arena with non-temporal (streaming) stores.
 * Nothing on this host reads the staged bytes soon: the disk reads them by
 * DMA and the daemon's checksum pass comes later, long after a multi-GiB
 * copy has cycled through the caches.  Streaming stores skip the read of
 * each destination line that an ordinary store makes first, so a large copy
 * moves about two thirds of the memory traffic: measured ~24 GiB/s with two
 * threads against ~18 GiB/s for glibc memcpy on the 2-core CI machines
 * (glibc switches to streaming stores only above a threshold far larger than
 * a slot).  Short copies stay with memcpy; SSE2 is part of x86-64, so no
 * CPU dispatch is needed, and other architectures use memcpy.
 */
#if defined(__x86_64__)
#include <emmintrin.h>

#define STREAM_MIN (64u * 1024) /* below this, memcpy */

static void stream_copy(char *dst, const char *src, size_t len)
{
	size_t head = (size_t)(-(uintptr_t)dst & 63);
	size_t body;

	memcpy(dst, src, head);
	dst += head;
	src += head;
	len -= head;
	body = len & ~(size_t)63;
	for (size_t i = 0; i < body; i += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)(src + i));
		__m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
		__m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
		_mm_stream_si128((__m128i *)(dst + i), a);
		_mm_stream_si128((__m128i *)(dst + i + 16), b);
		_mm_stream_si128((__m128i *)(dst + i + 32), c);
		_mm_stream_si128((__m128i *)(dst + i + 48), d);
	}
	memcpy(dst + body, src + body, len - body);
}

static int host_copy(void *dst, const void *src, size_t len, char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	if (len >= STREAM_MIN)
		stream_copy(dst, src, len);
	else
		memcpy(dst, src, len);
	return 0;
}

/* Streaming stores are weakly ordered: fence them before the slot is handed
 * to the daemon, so every byte is in memory before it reads or writes it. */
static int host_sync(char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	_mm_sfence();
	return 0;
}
#else
static int host_copy(void *dst, const void *src, size_t len, char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	memcpy(dst, src, len);
	return 0;
}
#define host_sync NULL
#endif

const struct copy_engine copy_engine_host = {
	.name = "host",
	.copy = host_copy,
	.sync = host_sync,
};

const struct copy_engine *copy_engine_select(enum ckpt_device device, int device_index,
					     int *ret_err, char *err, size_t errlen)
{
	(void)device_index;
	switch (device) {
	case CKPT_DEVICE_HOST:
		return &copy_engine_host;
	case CKPT_DEVICE_CUDA:
		/* Whether CUDA can serve it is cli_cuda_check()'s to say. */
		return &copy_engine_cuda;
	default:
		snprintf(err, errlen, "unknown device %d", (int)device);
		*ret_err = -EINVAL;
		return NULL;
	}
}

/* ---- filling a slot ---- */

#define MAX_ENGINES 4

/* Copies file bytes [off, off + len) of save s into dst: host items at
 * once, device items queued on their copy streams and noted in p (marked
 * when this returns: the caller polls p before the slot may go anywhere).
 * Returns 0 or -errno with the reason in err; on failure nothing of it is
 * still running. */
static int fill_extent(struct ckpt_client *c, const struct ckpt_save *s, uint64_t off,
		       uint64_t len, char *dst, cli_cuda_pending *p, char *err, size_t errlen)
{
	const struct layout *l = &s->layout;
	const struct copy_engine *used[MAX_ENGINES];
	unsigned n_used = 0;
	uint64_t pos = off, end = off + len;
	int r;

	if (pos < l->data_start) {
		uint64_t n = (end < l->data_start ? end : l->data_start) - pos;
		memcpy(dst, s->hdr + pos, n);
		pos += n;
	}
	for (size_t i = pos < end ? layout_find(l, pos) : l->n_items;
	     pos < end && i < l->n_items; i++) {
		const struct layout_item *it = &l->items[i];
		const struct copy_engine *e = s->src[i].engine;
		uint64_t n;

		if (it->end <= pos)
			continue; /* empty item */
		if (it->begin > pos) {
			snprintf(err, errlen, "internal error: item '%s' starts at %llu, after a "
				 "hole at %llu", it->name, (unsigned long long)it->begin,
				 (unsigned long long)pos);
			r = -EIO;
			goto out_drain;
		}
		n = (end < it->end ? end : it->end) - pos;
		if (e == &copy_engine_cuda)
			r = cli_cuda_copy(c, s, i, dst + (pos - off),
					  (const char *)s->src[i].data + (pos - it->begin), (size_t)n,
					  p, err, errlen);
		else
			r = e->copy(dst + (pos - off), (const char *)s->src[i].data + (pos - it->begin),
				    (size_t)n, err, errlen);
		if (r < 0)
			goto out_drain;
		if (e->sync) {
			unsigned k = 0;
			while (k < n_used && used[k] != e)
				k++;
			if (k == n_used) {
				if (n_used == MAX_ENGINES) {
					r = e->sync(err, errlen);
					if (r < 0)
						goto out_drain;
				} else {
					used[n_used++] = e;
				}
			}
		}
		pos += n;
	}
	if (pos != end) {
		snprintf(err, errlen, "internal error: the items end at %llu, the file at %llu",
			 (unsigned long long)pos, (unsigned long long)end);
		r = -EIO;
		goto out_drain;
	}
	for (unsigned k = 0; k < n_used; k++) {
		r = used[k]->sync(err, errlen);
		if (r < 0)
			goto out_drain;
	}
	/* O_DIRECT writes whole 4 KiB blocks: the tail must be zeros, not
	 * whatever a previous save left in the slot. */
	uint64_t padded = (len + LAYOUT_ALIGN - 1) / LAYOUT_ALIGN * LAYOUT_ALIGN;
	memset(dst + len, 0, (size_t)(padded - len));
	return cli_cuda_mark(c, p, err, errlen);

out_drain:
	/* Copies already queued still write into the slot: wait for them
	 * before the caller gives the slot back. */
	if (p->n > 0) {
		char why[PROTO_MSG_LEN];

		if (cli_cuda_mark(c, p, why, sizeof(why)) == 0)
			(void)cli_cuda_poll(c, p, true, why, sizeof(why));
	}
	return r;
}

/* ---- the copy threads ---- */

void cli_extent_msg(const struct ckpt_client *c, const struct ckpt_save *s, uint32_t slot,
		    uint64_t k, struct proto_extent *ext)
{
	uint64_t off = k * c->slot_bytes, len = s->layout.file_size - off;

	proto_init(&ext->h, PROTO_EXTENT, sizeof(*ext));
	ext->token = s->token;
	ext->file_off = off;
	ext->arena_off = (uint64_t)slot * c->slot_bytes;
	ext->len = len < c->slot_bytes ? len : c->slot_bytes;
}

void cli_send_extents_locked(struct ckpt_client *c, struct ckpt_save *s,
			     const struct proto_extent *ext, unsigned n)
{
	char why[PROTO_MSG_LEN];
	unsigned sent = 0;

	if (!c->dead) {
		int r;

		pthread_mutex_unlock(&c->lock);
		r = proto_send_many(c->sock, ext, sizeof(*ext), n, &sent);
		if (r < 0)
			snprintf(why, sizeof(why), "sending EXTENT: %s", strerror(-r));
		pthread_mutex_lock(&c->lock);
		if (r < 0)
			cli_conn_dead_locked(c, why);
	}
	for (unsigned i = 0; i < n; i++) {
		if (i < sent)
			save_extent_sent_locked(c, s);
		save_extent_done_locked(c, s);
	}
}

void save_extent_done_locked(struct ckpt_client *c, struct ckpt_save *s)
{
	if (--s->inflight == 0)
		pthread_cond_broadcast(&c->save_cv);
}

/*
 * Filled extents a copy thread has not sent yet.  Each EXTENT wakes the
 * daemon's loop, which on a busy node takes a CPU from a copy thread, and
 * once its write queue is full the daemon cannot use an extent sooner than
 * the disk frees a write anyway.  So after the first few extents of a save
 * (sent one by one, to start the disk at once) a thread sends its extents
 * SEND_BATCH at a time, in one system call.  It sends what it holds before
 * it waits for anything (a slot, more work), and extents count as in flight
 * until sent, so no save completes or drains while a thread holds some.
 */
#define SEND_BATCH 4
#define SEND_SINGLY 4

struct send_batch {
	struct ckpt_save *s;
	unsigned n;
	struct proto_extent ext[SEND_BATCH];
};

/* Sends b's extents.  Caller holds c->lock; dropped while sending. */
static void batch_flush_locked(struct ckpt_client *c, struct send_batch *b)
{
	unsigned n = b->n;

	if (n == 0)
		return;
	b->n = 0;
	cli_send_extents_locked(c, b->s, b->ext, n);
}

/*
 * Extents whose device copies a thread has queued and not yet seen finish.
 * Their slots are the daemon's to see only once the copies are done, so
 * they stay counted in flight (s->inflight) until then.  A thread queues up
 * to PENDING_MAX extents before it waits for the oldest: that keeps the
 * GPU's copy engine busy while the thread works on the next extent.  Like
 * held EXTENTs, pending extents are finished before the thread waits for
 * anything (a slot, more work): the daemon cannot free slots it has not
 * been sent.
 */
#define PENDING_MAX 4

struct pending {
	unsigned head, n;
	struct pending_ext {
		struct ckpt_save *s;
		uint32_t slot;
		uint64_t k;
		cli_cuda_pending p;
	} e[PENDING_MAX];
};

/* A filled extent (r: fill_extent's result, err its reason): parked,
 * given back, queued for sending or failed.  [lock] */
static void extent_filled_locked(struct ckpt_client *c, struct send_batch *b, struct ckpt_save *s,
				 uint32_t slot, uint64_t k, int r, const char *err)
{
	char msg[PROTO_MSG_LEN];
	uint64_t off = k * c->slot_bytes, len = s->layout.file_size - off;

	if (r == 0 && save_awaits_ack(s)) {
		/* Filled before the daemon answered SAVE_BEGIN: the save
		 * thread sends it once the daemon has accepted. */
		c->parked[c->n_parked].slot = slot;
		c->parked[c->n_parked].ext = k;
		c->n_parked++;
		save_extent_done_locked(c, s);
		return;
	}
	if (r == 0 && !s->accepted) {
		/* Refused, or the connection was lost, before the daemon
		 * took it: the slot was never the daemon's. */
		arena_slots_put(&c->slots, slot, 1);
		pthread_cond_broadcast(&c->slot_cv);
		save_extent_done_locked(c, s);
		return;
	}
	if (r == 0) {
		if (b->n > 0 && b->s != s)
			batch_flush_locked(c, b);
		/* In flight until batch_flush_locked sends it. */
		b->s = s;
		cli_extent_msg(c, s, slot, k, &b->ext[b->n++]);
		if (b->n == SEND_BATCH || s->sent < SEND_SINGLY)
			batch_flush_locked(c, b);
		return;
	}
	/* The slot never reached the daemon: it is ours again. */
	arena_slots_put(&c->slots, slot, 1);
	pthread_cond_broadcast(&c->slot_cv);
	if (len > c->slot_bytes)
		len = c->slot_bytes;
	snprintf(msg, sizeof(msg), "save '%s': copying file bytes [%llu, %llu): %.300s",
		 s->layout.name, (unsigned long long)off, (unsigned long long)(off + len), err);
	save_fail_locked(c, s, r, msg, false);
	save_extent_done_locked(c, s);
}

/* Finishes pending extents, oldest first: waits for the first `must` of
 * them (all: UINT_MAX), then takes those done already.  [lock]; dropped
 * while waiting. */
static void pending_reap_locked(struct ckpt_client *c, struct send_batch *b, struct pending *q,
				unsigned must)
{
	char err[PROTO_MSG_LEN];

	while (q->n > 0) {
		struct pending_ext *e = &q->e[q->head];
		bool wait = must > 0;
		int r;

		if (wait)
			pthread_mutex_unlock(&c->lock);
		r = cli_cuda_poll(c, &e->p, wait, err, sizeof(err));
		if (wait)
			pthread_mutex_lock(&c->lock);
		if (r == -EAGAIN)
			return;
		if (must > 0)
			must--;
		q->head = (q->head + 1) % PENDING_MAX;
		q->n--;
		extent_filled_locked(c, b, e->s, e->slot, e->k, r, err);
	}
}

/* Sends or finishes everything the thread holds.  [lock] */
static void hold_flush_locked(struct ckpt_client *c, struct send_batch *b, struct pending *q)
{
	pending_reap_locked(c, b, q, UINT_MAX);
	batch_flush_locked(c, b);
}

void *copy_thread_main(void *arg)
{
	struct ckpt_client *c = arg;
	struct send_batch b = { 0 };
	struct pending q = { 0 };
	char err[PROTO_MSG_LEN];

	pthread_setname_np(pthread_self(), "ckpt-copy"); /* for top -H, and tests */
	if (c->copy_nice > 0) {
		/* Per thread on Linux: this thread's nice value, relative to
		 * the one it inherited.  Raising it needs no privilege. */
		pid_t tid = (pid_t)syscall(SYS_gettid);
		int cur;

		errno = 0;
		cur = getpriority(PRIO_PROCESS, (id_t)tid);
		if (errno != 0)
			cli_log(CKPT_LOG_DEBUG, "copy thread: getpriority: %s", strerror(errno));
		else if (cur < 19 &&
			 setpriority(PRIO_PROCESS, (id_t)tid, cur + c->copy_nice > 19 ? 19 :
				     cur + c->copy_nice) < 0)
			cli_log(CKPT_LOG_DEBUG, "copy thread: setpriority: %s", strerror(errno));
	}
	pthread_mutex_lock(&c->lock);
	while (!c->stopping) {
		struct ckpt_save *s = c->active;
		cli_cuda_pending p = { 0 };
		uint64_t k, off, len;
		int64_t slot;
		int r;

		if (q.n > 0)
			pending_reap_locked(c, &b, &q, q.n == PENDING_MAX ? 1 : 0);

		bool idle = !s || !save_copying(s) || c->dead || s->next_ext >= s->n_ext;

		if ((b.n > 0 || q.n > 0) && idle) {
			hold_flush_locked(c, &b, &q);
			continue;
		}
		if (b.n > 0 && s != b.s) {
			batch_flush_locked(c, &b);
			continue;
		}
		if (idle) {
			pthread_cond_wait(&c->copy_cv, &c->lock);
			continue;
		}
		k = s->next_ext++;
		s->inflight++;
		while ((slot = arena_slots_take(&c->slots, 1)) < 0 && !c->dead && save_copying(s) &&
		       !c->stopping) {
			if (b.n > 0 || q.n > 0)
				hold_flush_locked(c, &b, &q); /* then look again */
			else
				pthread_cond_wait(&c->slot_cv, &c->lock);
		}
		if (slot < 0) {
			save_extent_done_locked(c, s);
			continue;
		}
		pthread_mutex_unlock(&c->lock);

		off = k * c->slot_bytes;
		len = s->layout.file_size - off;
		if (len > c->slot_bytes)
			len = c->slot_bytes;
		r = fill_extent(c, s, off, len, (char *)c->arena + (uint64_t)slot * c->slot_bytes, &p,
				err, sizeof(err));
		pthread_mutex_lock(&c->lock);
		if (r == 0 && p.n > 0) {
			struct pending_ext *e = &q.e[(q.head + q.n) % PENDING_MAX];

			*e = (struct pending_ext){ s, (uint32_t)slot, k, p };
			q.n++;
			continue;
		}
		extent_filled_locked(c, &b, s, (uint32_t)slot, k, r, err);
	}
	hold_flush_locked(c, &b, &q);
	pthread_mutex_unlock(&c->lock);
	return NULL;
}
