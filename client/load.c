/* SPDX-License-Identifier: MIT */
/*
 * load.c - loading a checkpoint into the caller's layout (ckpt_load_*).
 *
 * The caller's boxes become plan_wants; format/plan.c turns them into
 * reads, each with the CRC spans it must verify and the copies it serves.
 * ckpt_load_start() hands the plan to up to LOAD_THREADS library threads
 * that take reads in order:
 *
 *   direct   when a read's copies are each one contiguous run in the file
 *            and in the destination and together are exactly the read
 *            (a chunk loaded as it was saved): preadv straight into the
 *            destinations, then the CRC spans are checked there;
 *   bounce   otherwise: the read goes into the thread's buffer, is checked
 *            there, and each copy is scattered into place (N-d, strided).
 *
 * Threads [lock: load.lock]: the next read to take, the first failure, and
 * the count of running threads.  The last thread to stop completes the
 * future; ckpt_load_free() joins them.  The reader is only read by the
 * threads (its manifest, and the descriptors opened at start on the
 * caller's thread).
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "client/internal.h"
#include "format/crc32c.h"
#include "format/errmsg.h"
#include "format/plan.h"
#include "store/store_s3.h"

#define LOAD_THREADS  4
#define LOAD_MAX_DIMS (1u << 26) /* dims entries the boxes may take */

enum load_state { LOAD_BUILDING, LOAD_RUNNING, LOAD_DONE };

/* One destination box: the plan_want of the same index. */
struct ldst {
	uint32_t item;
	char *data;
	size_t dims;  /* offsets, shape, byte strides: 3 * ndim entries */
};

struct ckpt_load {
	struct ckpt_reader *rd;
	uint32_t flags;
	enum load_state state;

	int poison_err;               /* first failed add_* (0: none) */
	char poison_msg[512];

	uint8_t *added;               /* per manifest item */
	struct ldst *dsts;
	size_t n_dsts, cap_dsts;
	uint64_t *dims;
	size_t n_dims, cap_dims;
	uint32_t missing;

	struct plan *plan;
	int *fds;                     /* per manifest file; -1 unused */
	struct ckpt_future done;

	pthread_mutex_t lock;
	size_t next_read;             /* [lock] */
	int err;                      /* [lock] first failure */
	char errmsg[1024];            /* [lock] */
	unsigned running;             /* [lock] */
	pthread_t threads[LOAD_THREADS];
	unsigned n_threads;
};

/* ---- building ---- */

static int poison(struct ckpt_load *ld, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Records the first failure of an add_* call (it refuses the start) and
 * sets ckpt_last_error(). */
static int poison(struct ckpt_load *ld, int err, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	cli_set_error("%s", msg);
	if (!ld->poison_err) {
		ld->poison_err = err;
		snprintf(ld->poison_msg, sizeof(ld->poison_msg), "%s", msg);
	}
	return err;
}

int ckpt_load_begin(struct ckpt_reader *reader, uint32_t flags, struct ckpt_load **ret_load)
{
	struct ckpt_load *ld;

	if (!reader || !ret_load) {
		cli_set_error("ckpt_load_begin: NULL argument");
		return -EINVAL;
	}
	if (flags & ~CKPT_LOAD_PARTIAL) {
		cli_set_error("ckpt_load_begin: unknown flags 0x%x", flags & ~CKPT_LOAD_PARTIAL);
		return -EINVAL;
	}
	ld = calloc(1, sizeof(*ld));
	if (!ld)
		goto nomem;
	ld->added = calloc(reader->m.n_items ? reader->m.n_items : 1, 1);
	if (!ld->added || future_init(&ld->done)) {
		free(ld->added);
		free(ld);
		goto nomem;
	}
	pthread_mutex_init(&ld->lock, NULL);
	ld->rd = reader;
	ld->flags = flags;
	*ret_load = ld;
	return 0;
nomem:
	cli_set_error("ckpt_load_begin: out of memory");
	return -ENOMEM;
}

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
	size_t c = *cap ? *cap : 16;
	void *q;

	if (need <= *cap)
		return 0;
	while (c < need)
		c *= 2;
	q = realloc(*p, c * size);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = c;
	return 0;
}

/* Finds item `name` of `kind`; handles a missing one (PARTIAL: skipped,
 * *ret_item = -1) and one added twice. */
static int find_item(struct ckpt_load *ld, enum item_kind kind, const char *name, const char *fn,
		     long *ret_item)
{
	const char *what = kind == ITEM_BLOB ? "blob" : "tensor";
	const struct manifest_tensor *t = manifest_find(&ld->rd->m, kind, name);
	size_t i;

	if (!t) {
		if (ld->flags & CKPT_LOAD_PARTIAL) {
			ld->missing++;
			*ret_item = -1;
			return 0;
		}
		return poison(ld, -ENOENT, "%s: the checkpoint '%s' has no %s '%s'", fn,
			      ld->rd->path, what, name);
	}
	i = (size_t)(t - ld->rd->m.items);
	if (ld->added[i])
		return poison(ld, -EEXIST, "%s: %s '%s' was added already", fn, what, name);
	*ret_item = (long)i;
	return 0;
}

/* Adds one destination box of item `item`: offsets/shape NULL mean the
 * whole item; strides (elements) NULL mean row-major in shape. */
static int add_box(struct ckpt_load *ld, uint32_t item, const uint64_t *offsets,
		   const uint64_t *shape, const int64_t *strides, void *data, const char *fn)
{
	const struct manifest_tensor *t = &ld->rd->m.items[item];
	size_t esize = ckpt_dtype_size((enum ckpt_dtype)t->dtype);
	unsigned n = t->ndim;
	uint64_t *o, *s, *st, vol = 1;

	if (ld->n_dsts >= PLAN_MAX_WANTS || ld->n_dims + 3u * n > LOAD_MAX_DIMS)
		return poison(ld, -E2BIG, "%s: too many destination boxes in one load", fn);
	if (grow((void **)&ld->dsts, &ld->cap_dsts, ld->n_dsts + 1, sizeof(*ld->dsts)) ||
	    grow((void **)&ld->dims, &ld->cap_dims, ld->n_dims + 3u * n + 1, sizeof(*ld->dims)))
		return poison(ld, -ENOMEM, "%s: out of memory", fn);
	o = ld->dims + ld->n_dims;
	s = o + n;
	st = s + n;
	for (unsigned d = 0; d < n; d++) {
		o[d] = offsets ? offsets[d] : 0;
		s[d] = shape ? shape[d] : t->shape[d];
		if (o[d] > t->shape[d] || s[d] > t->shape[d] - o[d])
			return poison(ld, -EINVAL, "%s: '%s': dimension %u: the box's offset %llu + "
				      "size %llu exceeds the global size %llu", fn, t->name, d,
				      (unsigned long long)o[d], (unsigned long long)s[d],
				      (unsigned long long)t->shape[d]);
		vol *= s[d]; /* <= the tensor's volume: no overflow */
	}
	/* Byte strides, checked so that every element's address is computed
	 * without overflow: the farthest element lies within SIZE_MAX. */
	for (unsigned d = n; d-- > 0;) {
		if (strides) {
			unsigned __int128 b = (unsigned __int128)(uint64_t)strides[d] * esize;
			if (strides[d] < 0 || b > SIZE_MAX)
				return poison(ld, -EINVAL, "%s: '%s': stride %lld of dimension %u "
					      "is negative or too large", fn, t->name,
					      (long long)strides[d], d);
			st[d] = (uint64_t)b;
		} else {
			st[d] = d + 1 < n ? st[d + 1] * s[d + 1] : esize;
		}
	}
	if (vol) {
		unsigned __int128 far = esize;
		for (unsigned d = 0; d < n; d++)
			far += (unsigned __int128)(s[d] - 1) * st[d];
		if (far > SIZE_MAX)
			return poison(ld, -EINVAL, "%s: '%s': the box does not fit in memory", fn,
				      t->name);
		if (!data)
			return poison(ld, -EINVAL, "%s: '%s': destination data is NULL", fn,
				      t->name);
	}
	ld->dsts[ld->n_dsts] = (struct ldst){ .item = item, .data = data, .dims = ld->n_dims };
	ld->n_dims += 3u * n;
	ld->n_dsts++;
	return 0;
}

static bool building(struct ckpt_load *ld, const char *fn)
{
	if (ld->state != LOAD_BUILDING) {
		cli_set_error("%s: the load was started already", fn);
		return false;
	}
	return true;
}

int ckpt_load_add_tensor(struct ckpt_load *load, const struct ckpt_load_tensor *tensor)
{
	static const char fn[] = "ckpt_load_add_tensor";
	struct ckpt_load_tensor t;
	const struct manifest_tensor *mt;
	size_t before, before_dims;
	long item;
	int r;

	if (!load || !tensor) {
		cli_set_error("%s: NULL argument", fn);
		return -EINVAL;
	}
	if (!building(load, fn))
		return -EBUSY;
	r = abi_copy_in(&abi_load_tensor, &t, tensor, fn);
	if (r)
		return poison(load, r, "%s", ckpt_last_error());
	if (!t.name)
		return poison(load, -EINVAL, "%s: name is NULL", fn);
	if (t.ndim > CKPT_MAX_NDIM || (t.ndim && !t.global_shape))
		return poison(load, -EINVAL, "%s: '%.200s': ndim %u needs a global shape of at most "
			      "%u dimensions", fn, t.name, t.ndim, CKPT_MAX_NDIM);
	if (t.n_dsts == 0 || t.n_dsts > CKPT_LOAD_MAX_DSTS || !t.dsts)
		return poison(load, -EINVAL, "%s: '%.200s': %u destination boxes (1..%u)", fn,
			      t.name, t.n_dsts, CKPT_LOAD_MAX_DSTS);
	r = find_item(load, ITEM_TENSOR, t.name, fn, &item);
	if (r || item < 0)
		return r;
	mt = &load->rd->m.items[item];
	if (mt->dtype != t.dtype || mt->ndim != t.ndim ||
	    (t.ndim && memcmp(mt->shape, t.global_shape, t.ndim * sizeof(uint64_t)))) {
		char want[256], have[256];
		errmsg_dims(t.global_shape, t.ndim, want, sizeof(want));
		errmsg_dims(mt->shape, mt->ndim, have, sizeof(have));
		return poison(load, -EINVAL, "%s: tensor '%.200s': expected %s %s, the checkpoint "
			      "holds %s %s", fn, t.name,
			      ckpt_dtype_name(t.dtype) ? ckpt_dtype_name(t.dtype) : "(bad dtype)",
			      want, ckpt_dtype_name((enum ckpt_dtype)mt->dtype), have);
	}
	before = load->n_dsts;
	before_dims = load->n_dims;
	for (uint32_t k = 0; k < t.n_dsts; k++) {
		struct ckpt_load_dst d;

		r = abi_copy_in(&abi_load_dst, &d, &t.dsts[k], fn);
		if (r)
			return poison(load, r, "%s", ckpt_last_error());
		if (d.reserved)
			return poison(load, -EINVAL, "%s: '%.200s': box %u: reserved is not 0", fn,
				      t.name, k);
		if (d.device != CKPT_DEVICE_HOST)
			return poison(load, -EOPNOTSUPP, "%s: '%.200s': box %u: only host memory "
				      "destinations are supported by this libckpt", fn, t.name, k);
		if (!d.shape && d.offsets)
			return poison(load, -EINVAL, "%s: '%.200s': box %u has offsets but no shape",
				      fn, t.name, k);
		r = add_box(load, (uint32_t)item, d.offsets, d.shape, d.strides, d.data, fn);
		if (r) {
			load->n_dsts = before;
			load->n_dims = before_dims;
			return r;
		}
	}
	load->added[item] = 1;
	return 0;
}

int ckpt_load_add_blob(struct ckpt_load *load, const char *key, void *buf, size_t len)
{
	static const char fn[] = "ckpt_load_add_blob";
	const struct manifest_tensor *mt;
	size_t before_dims;
	long item;
	int r;

	if (!load || !key) {
		cli_set_error("%s: NULL argument", fn);
		return -EINVAL;
	}
	if (!building(load, fn))
		return -EBUSY;
	r = find_item(load, ITEM_BLOB, key, fn, &item);
	if (r || item < 0)
		return r;
	mt = &load->rd->m.items[item];
	if (len != mt->shape[0])
		return poison(load, -EINVAL, "%s: blob '%.200s' holds %llu bytes, the buffer %zu", fn,
			      key, (unsigned long long)mt->shape[0], len);
	before_dims = load->n_dims;
	r = add_box(load, (uint32_t)item, NULL, NULL, NULL, buf, fn);
	if (r) {
		load->n_dims = before_dims;
		return r;
	}
	load->added[item] = 1;
	return 0;
}

/* ---- running ---- */

/* Records the load's first failure (later ones are consequences). */
static void fail(struct ckpt_load *ld, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void fail(struct ckpt_load *ld, int err, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&ld->lock);
	if (!ld->err) {
		ld->err = err;
		va_start(ap, fmt);
		vsnprintf(ld->errmsg, sizeof(ld->errmsg), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&ld->lock);
}

static bool region_contiguous(const uint64_t *ext, const uint64_t *strides, unsigned n,
			      size_t esize)
{
	uint64_t want = esize;

	for (unsigned d = n; d-- > 0;) {
		if (ext[d] == 1)
			continue;
		if (strides[d] != want)
			return false;
		want *= ext[d];
	}
	return true;
}

/* Copies a box of extents ext from src (byte strides ss) to dst (byte
 * strides ds): the innermost dimensions contiguous in both become one
 * memcpy. */
static void box_copy(char *dst, const uint64_t *ds, const char *src, const uint64_t *ss,
		     const uint64_t *ext, unsigned n, size_t esize)
{
	uint64_t e[CKPT_MAX_NDIM], a[CKPT_MAX_NDIM], b[CKPT_MAX_NDIM], idx[CKPT_MAX_NDIM];
	uint64_t run = esize;
	unsigned m = 0;

	/* Drop dimensions of extent 1; a zero extent means nothing to copy. */
	for (unsigned d = 0; d < n; d++) {
		if (ext[d] == 0)
			return;
		if (ext[d] == 1)
			continue;
		e[m] = ext[d];
		a[m] = ds[d];
		b[m] = ss[d];
		m++;
	}
	while (m > 0 && a[m - 1] == run && b[m - 1] == run) {
		run *= e[m - 1];
		m--;
	}
	memset(idx, 0, sizeof(idx));
	for (;;) {
		uint64_t doff = 0, soff = 0;

		for (unsigned d = 0; d < m; d++) {
			doff += idx[d] * a[d];
			soff += idx[d] * b[d];
		}
		memcpy(dst + doff, src + soff, (size_t)run);
		unsigned d = m;
		while (d > 0) {
			d--;
			if (++idx[d] < e[d])
				break;
			idx[d] = 0;
			if (d == 0)
				return;
		}
		if (m == 0)
			return;
	}
}

/* Where copy cp's first element goes in its destination. */
static char *copy_dst(const struct ckpt_load *ld, const struct plan_copy *cp, unsigned n)
{
	const struct ldst *d = &ld->dsts[cp->want];
	const uint64_t *o = ld->dims + d->dims, *st = o + 2u * n;
	char *p = d->data;

	for (unsigned k = 0; k < n; k++)
		p += (cp->offsets[k] - o[k]) * st[k];
	return p;
}

static const char *item_name(const struct ckpt_load *ld, uint32_t item)
{
	return ld->rd->m.items[item].name;
}

/* Reads file bytes [off, off + len) into buf: pread until done, or one
 * ranged GET.  0, or -errno with the load failed. */
static int read_bytes(struct ckpt_load *ld, const struct plan_read *rd, uint64_t off,
		      uint64_t len, char *buf)
{
	const char *file = ld->rd->m.files[rd->file].path;
	uint64_t got = 0;

	if (ld->rd->s3) {
		int r = store_s3.read_range(ld->rd->path, file, off, len, buf);
		if (r < 0)
			fail(ld, r, "reading %s/%s [%llu, %llu) from S3: %s", ld->rd->path, file,
			     (unsigned long long)off, (unsigned long long)(off + len),
			     r == -EBADMSG ? "short answer (the object is truncated)" :
					     strerror(-r));
		return r;
	}
	while (got < len) {
		ssize_t n = pread(ld->fds[rd->file], buf + got, (size_t)(len - got),
				  (off_t)(off + got));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int r = n < 0 ? -errno : -EBADMSG;
			fail(ld, r, "reading %s/%s at offset %llu: %s", ld->rd->path, file,
			     (unsigned long long)(off + got),
			     n == 0 ? "the file is truncated" : strerror(-r));
			return r;
		}
		got += (uint64_t)n;
	}
	return 0;
}

/* The CRC spans of rd, against bytes at buf (file offset buf_begin). */
static int check_spans(struct ckpt_load *ld, const struct plan_read *rd, const char *buf,
		       uint64_t buf_begin, bool in_place)
{
	const struct plan *p = ld->plan;

	for (size_t k = rd->check0; k < rd->check0 + rd->n_checks; k++) {
		uint64_t bad;

		if (plan_check_span(&ld->rd->m, &p->checks[k], (const uint8_t *)buf, buf_begin,
				    &bad) < 0) {
			fail(ld, -EBADMSG, "CRC mismatch in %s/%s at offset %llu (%s '%s')%s",
			     ld->rd->path, ld->rd->m.files[rd->file].path, (unsigned long long)bad,
			     ld->rd->m.items[p->checks[k].item].kind == ITEM_BLOB ? "blob" : "tensor",
			     item_name(ld, p->checks[k].item),
			     in_place ? ": the destination holds unverified bytes" : "");
			return -EBADMSG;
		}
	}
	return 0;
}

/* The direct path: rd's copies, in file order, are contiguous on both
 * sides and tile the read exactly.  Returns true and fills iov if so. */
static bool direct_iov(struct ckpt_load *ld, const struct plan_read *rd, struct iovec *iov)
{
	const struct plan *p = ld->plan;
	uint64_t pos = rd->begin;

	if (rd->n_copies > IOV_MAX || (ld->rd->s3 && rd->n_copies != 1))
		return false;
	for (size_t i = 0; i < rd->n_copies; i++) {
		const struct plan_copy *cp = &p->copies[rd->copy0 + i];
		const struct manifest_tensor *t = &ld->rd->m.items[cp->item];
		const struct manifest_chunk *c = &t->chunks[cp->chunk];
		uint64_t ss[CKPT_MAX_NDIM];
		const uint64_t *ds = ld->dims + ld->dsts[cp->want].dims + 2u * t->ndim;
		size_t esize = ckpt_dtype_size((enum ckpt_dtype)t->dtype);

		if (cp->src != pos)
			return false;
		plan_chunk_strides(t, c, esize, ss);
		if (!region_contiguous(cp->shape, ss, t->ndim, esize) ||
		    !region_contiguous(cp->shape, ds, t->ndim, esize))
			return false;
		iov[i].iov_base = copy_dst(ld, cp, t->ndim);
		iov[i].iov_len = (size_t)cp->bytes;
		pos += cp->bytes;
	}
	return pos == rd->end;
}

/* Checks the spans of a direct read: the bytes are in the destinations,
 * so each piece is checksummed across the iovecs it spans. */
static int check_direct(struct ckpt_load *ld, const struct plan_read *rd, const struct iovec *iov)
{
	const struct plan *p = ld->plan;
	size_t v = 0;
	uint64_t vbase = rd->begin; /* file offset of iov[v] */

	for (size_t k = rd->check0; k < rd->check0 + rd->n_checks; k++) {
		const struct plan_check *ck = &p->checks[k];
		const struct manifest_chunk *c = &ld->rd->m.items[ck->item].chunks[ck->chunk];
		uint64_t pos = ck->begin;

		while (pos < ck->end) {
			uint64_t grid = (pos / LAYOUT_CRC_BLOCK + 1) * LAYOUT_CRC_BLOCK;
			uint64_t stop = grid < ck->end ? grid : ck->end, at = pos;
			uint32_t crc = 0;

			while (at < stop) {
				while (at >= vbase + iov[v].iov_len) {
					vbase += iov[v].iov_len;
					v++;
				}
				uint64_t n = stop - at, room = vbase + iov[v].iov_len - at;
				if (n > room)
					n = room;
				crc = crc32c((const char *)iov[v].iov_base + (at - vbase), (size_t)n,
					     crc);
				at += n;
			}
			if (crc != c->crcs[pos / LAYOUT_CRC_BLOCK - c->begin / LAYOUT_CRC_BLOCK]) {
				fail(ld, -EBADMSG, "CRC mismatch in %s/%s at offset %llu (%s '%s'): "
				     "the destination holds unverified bytes", ld->rd->path,
				     ld->rd->m.files[rd->file].path, (unsigned long long)pos,
				     ld->rd->m.items[ck->item].kind == ITEM_BLOB ? "blob" : "tensor",
				     item_name(ld, ck->item));
				return -EBADMSG;
			}
			pos = stop;
		}
	}
	return 0;
}

static int do_direct(struct ckpt_load *ld, const struct plan_read *rd, struct iovec *iov)
{
	const char *file = ld->rd->m.files[rd->file].path;
	uint64_t off = rd->begin;
	size_t v = 0;
	int r;

	if (ld->rd->s3) {
		r = read_bytes(ld, rd, rd->begin, rd->end - rd->begin, iov[0].iov_base);
		return r < 0 ? r : check_direct(ld, rd, iov);
	}
	/* preadv until every iovec is full; a short read moves the window. */
	struct iovec *w = malloc(rd->n_copies * sizeof(*w));
	if (!w) {
		fail(ld, -ENOMEM, "out of memory");
		return -ENOMEM;
	}
	memcpy(w, iov, rd->n_copies * sizeof(*w));
	while (v < rd->n_copies) {
		ssize_t n = preadv(ld->fds[rd->file], w + v, (int)(rd->n_copies - v), (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -EBADMSG;
			fail(ld, r, "reading %s/%s at offset %llu: %s", ld->rd->path, file,
			     (unsigned long long)off, n == 0 ? "the file is truncated" : strerror(-r));
			free(w);
			return r;
		}
		off += (uint64_t)n;
		while (v < rd->n_copies && (size_t)n >= w[v].iov_len) {
			n -= (ssize_t)w[v].iov_len;
			v++;
		}
		if (v < rd->n_copies) {
			w[v].iov_base = (char *)w[v].iov_base + n;
			w[v].iov_len -= (size_t)n;
		}
	}
	free(w);
	return check_direct(ld, rd, iov);
}

static int do_bounce(struct ckpt_load *ld, const struct plan_read *rd, char **buf, size_t *cap)
{
	const struct plan *p = ld->plan;
	uint64_t len = rd->end - rd->begin;
	int r;

	if (len > *cap) {
		free(*buf);
		*buf = malloc((size_t)len);
		*cap = *buf ? (size_t)len : 0;
		if (!*buf) {
			fail(ld, -ENOMEM, "out of memory for a %llu-byte read buffer",
			     (unsigned long long)len);
			return -ENOMEM;
		}
	}
	r = read_bytes(ld, rd, rd->begin, len, *buf);
	if (r == 0)
		r = check_spans(ld, rd, *buf, rd->begin, false);
	if (r)
		return r;
	for (size_t i = rd->copy0; i < rd->copy0 + rd->n_copies; i++) {
		const struct plan_copy *cp = &p->copies[i];
		const struct manifest_tensor *t = &ld->rd->m.items[cp->item];
		size_t esize = ckpt_dtype_size((enum ckpt_dtype)t->dtype);
		uint64_t ss[CKPT_MAX_NDIM];

		plan_chunk_strides(t, &t->chunks[cp->chunk], esize, ss);
		box_copy(copy_dst(ld, cp, t->ndim),
			 ld->dims + ld->dsts[cp->want].dims + 2u * t->ndim,
			 *buf + (cp->src - rd->begin), ss, cp->shape, t->ndim, esize);
	}
	return 0;
}

static void *load_thread(void *arg)
{
	struct ckpt_load *ld = arg;
	const struct plan *p = ld->plan;
	struct iovec *iov = NULL;
	char *buf = NULL;
	size_t cap = 0;
	bool last;

	iov = malloc(IOV_MAX * sizeof(*iov));
	if (!iov)
		fail(ld, -ENOMEM, "out of memory");
	for (;;) {
		size_t i;

		pthread_mutex_lock(&ld->lock);
		if (ld->err || ld->next_read == p->n_reads) {
			pthread_mutex_unlock(&ld->lock);
			break;
		}
		i = ld->next_read++;
		pthread_mutex_unlock(&ld->lock);
		if (direct_iov(ld, &p->reads[i], iov)) {
			if (do_direct(ld, &p->reads[i], iov))
				break;
		} else if (do_bounce(ld, &p->reads[i], &buf, &cap)) {
			break;
		}
	}
	free(buf);
	free(iov);
	pthread_mutex_lock(&ld->lock);
	last = --ld->running == 0;
	pthread_mutex_unlock(&ld->lock);
	/* The last one out reports; ld->err is final once every thread
	 * stopped. */
	if (last)
		future_complete(&ld->done, ld->err, ld->err ? ld->errmsg : "");
	return NULL;
}

int ckpt_load_start(struct ckpt_load *load, struct ckpt_future **ret_done)
{
	static const char fn[] = "ckpt_load_start";
	struct ckpt_reader *rd;
	struct plan_want *wants = NULL;
	char err[512] = "";
	int r;

	if (!load || !ret_done) {
		cli_set_error("%s: NULL argument", fn);
		return -EINVAL;
	}
	if (!building(load, fn))
		return -EBUSY;
	if (load->poison_err) {
		cli_set_error("%s: the load is incomplete: %s", fn, load->poison_msg);
		return load->poison_err;
	}
	rd = load->rd;
	if (!rd->plan_ix) {
		struct plan_index *ix;
		r = plan_index_new(&rd->m, &ix);
		if (r)
			goto nomem;
		rd->plan_ix = ix;
	}
	wants = malloc((load->n_dsts ? load->n_dsts : 1) * sizeof(*wants));
	if (!wants)
		goto nomem;
	for (size_t i = 0; i < load->n_dsts; i++) {
		const struct ldst *d = &load->dsts[i];
		unsigned n = rd->m.items[d->item].ndim;
		wants[i] = (struct plan_want){ .item = d->item, .tag = (uint32_t)i,
					       .offsets = load->dims + d->dims,
					       .shape = load->dims + d->dims + n };
	}
	r = plan_build(rd->plan_ix, wants, load->n_dsts, NULL, &load->plan, err, sizeof(err));
	free(wants);
	if (r) {
		cli_set_error("%s: %s", fn, err[0] ? err : strerror(-r));
		return r;
	}
	/* Open the files on this thread: the reader is not shared with the
	 * load's threads beyond these descriptors. */
	load->fds = malloc((rd->m.n_files ? rd->m.n_files : 1) * sizeof(int));
	if (!load->fds)
		goto nomem;
	for (size_t i = 0; i < rd->m.n_files; i++)
		load->fds[i] = -1;
	if (!rd->s3) {
		for (size_t i = 0; i < load->plan->n_reads; i++) {
			uint32_t f = load->plan->reads[i].file;
			if (load->fds[f] >= 0)
				continue;
			r = cli_reader_fd(rd, f, err, sizeof(err));
			if (r < 0) {
				cli_set_error("%s: %s", fn, err);
				return r;
			}
			load->fds[f] = r;
		}
	}
	load->state = LOAD_RUNNING;
	*ret_done = &load->done;
	if (load->plan->n_reads == 0) {
		future_complete(&load->done, 0, "");
		return 0;
	}
	load->running = 0;
	for (unsigned i = 0; i < LOAD_THREADS && i < load->plan->n_reads; i++) {
		pthread_mutex_lock(&load->lock);
		load->running++;
		pthread_mutex_unlock(&load->lock);
		r = pthread_create(&load->threads[i], NULL, load_thread, load);
		if (r) {
			pthread_mutex_lock(&load->lock);
			load->running--;
			bool none = load->running == 0;
			pthread_mutex_unlock(&load->lock);
			if (none) {
				/* No thread runs: fail the load here. */
				fail(load, -r, "cannot start a load thread: %s", strerror(r));
				future_complete(&load->done, load->err, load->errmsg);
			}
			break;
		}
		load->n_threads++;
	}
	return 0;
nomem:
	cli_set_error("%s: out of memory", fn);
	return -ENOMEM;
}

int ckpt_load_stats(const struct ckpt_load *load, struct ckpt_load_stats *ret_stats)
{
	struct ckpt_load_stats s = { CKPT_LOAD_STATS_INIT };

	if (!load || !ret_stats || ret_stats->size < sizeof(s)) {
		cli_set_error("ckpt_load_stats: NULL argument or size below "
			      "sizeof(struct ckpt_load_stats)");
		return -EINVAL;
	}
	s.missing = load->missing;
	if (load->plan) {
		s.bytes_wanted = load->plan->bytes_wanted;
		s.bytes_read = load->plan->bytes_read;
		s.reads = load->plan->n_reads;
	}
	memcpy(ret_stats, &s, sizeof(s));
	return 0;
}

void ckpt_load_free(struct ckpt_load *load)
{
	if (!load)
		return;
	for (unsigned i = 0; i < load->n_threads; i++)
		pthread_join(load->threads[i], NULL);
	plan_free(load->plan);
	free(load->fds);
	free(load->dims);
	free(load->dsts);
	free(load->added);
	future_destroy(&load->done);
	pthread_mutex_destroy(&load->lock);
	free(load);
}
