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
 *            there, and each copy is scattered into place (N-d, strided):
 *            memcpy into host memory, H2D copies into CUDA device memory.
 *
 * CUDA device destinations (client/cuda.c, cuda/cuxfer.h).  A load has no
 * client, so it has a CUDA context of its own (a struct cuxfer).  At add
 * time one without memory to pin checks each device box: its first and last
 * byte are memory of the device named.  At start, when reads are planned and
 * the largest is known, one arena is mapped with a slot per thread (its
 * bounce buffer, then its stage) and a second cuxfer, whose arena it is,
 * replaces the first and pins it once (a failure to pin is logged and the
 * copies go from pageable memory).  A read that serves a device box always
 * bounces (the bytes are verified in host memory before any reaches the
 * device).  Each copy to a device goes in runs contiguous in its
 * destination: a contiguous destination box is one H2D of its bytes; a
 * strided one is one H2D per contiguous run (the runtime wrapper has no
 * cudaMemcpy2D/3D).  When a run is not contiguous in the bounce buffer too
 * (a column band of a saved chunk), the copy is first packed into the
 * stage.  Every H2D is waited for (cuxfer_h2d), so a thread's bounce buffer
 * and stage are free again when its copies return.  The threads share the
 * cuxfer, which is thread-safe: one copy stream per device, so device
 * copies are serialised per device while reads and CRC checks overlap.
 *
 * Threads [lock: load.lock]: the next read to take, the first failure, the
 * count of running threads and the next arena slot.  The last thread to
 * stop completes the future; ckpt_load_free() joins them, then closes the
 * cuxfer (which unpins) before it unmaps the arena.  load.lock is never
 * held across a CUDA call.  The reader is only read by the threads (its
 * manifest, and the descriptors opened at start on the caller's thread).
 *
 * A load with a group (ckpt_load_set_group) runs one thread instead, which
 * shares the reads with the other ranks over NCCL: see "Groups" below.
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "client/internal.h"
#include "format/crc32c.h"
#include "format/errmsg.h"
#include "format/grow.h"
#include "format/plan.h"
#include "format/readassign.h"
#include "store/fsutil.h"
#include "store/s3_addr.h"
#include "store/store.h"
#include "store/store_s3.h"
#ifdef CKPT_HAVE_CUDA
#include "cuda/cudart.h"
#include "cuda/nccl.h"
#endif

#define LOAD_THREADS  4
/* Through the daemon a thread mostly waits for its read: more threads and
 * smaller reads keep the disk busy while others check and copy. */
#define LOAD_DAEMON_THREADS 8
/* An S3 read through ckptd waits this long for arena slots before the
 * library GETs it itself (a local read waits 2 s: reading it here costs
 * little; an S3 read here leaves the daemon's roots and credentials). */
#define LOAD_S3_SLOT_WAIT_MS 60000
#define LOAD_DAEMON_READ    (16u << 20)
#define LOAD_MAX_THREADS    8
#define LOAD_MAX_DIMS (1u << 26) /* dims entries the boxes may take */
#define LOAD_ALIGN    4096u      /* arena slots and stages start on a page */
#define LOAD_NO_HANDLE UINT32_MAX /* a file not lent to the daemon */

enum load_state { LOAD_BUILDING, LOAD_RUNNING, LOAD_DONE };

/* One destination box: the plan_want of the same index. */
struct ldst {
	uint32_t item;
	int32_t device; /* CUDA device ordinal, or -1: host memory */
	char *data;
	size_t dims;    /* offsets, shape, byte strides: 3 * ndim entries */
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

	/* CUDA (see the top): the add-time checker until start, then the
	 * context whose arena holds the threads' slots.  Only the caller's
	 * thread changes these; the threads use them after pthread_create. */
	struct cuxfer *cuda;
	size_t n_device_dsts;
	long first_device_dst;        /* -1: none */
	char *arena;                  /* NULL: host-only, buffers malloc'd */
	size_t arena_len, slot_bytes;
	size_t bounce_bytes;          /* a slot's bounce buffer: the largest read */
	size_t stage_bytes;           /* a slot's stage: the largest packed copy */

	struct plan *plan;
	int *fds;                     /* per manifest file; -1 unused */
	struct ckpt_client *client;   /* ckpt_load_set_client(), or NULL */
	struct limage {               /* per manifest file: its resident image */
		const char *map;      /* read-only mapping, or NULL: storage */
		uint64_t len;         /* the file's size (manifest) */
		atomic_bool bad;      /* a block did not match: storage from now */
		bool spill;           /* not ckptd's memory: the node's copy of
		                       * an S3 shard in the spill tier's cache,
		                       * read with pread from sfd (a mapped disk
		                       * file would kill the process with SIGBUS
		                       * on a bad sector; a failed read is only a
		                       * bad copy) */
		int sfd;
		int open_err;         /* opening the file in storage failed (the
		                       * fallback then fails too) */
	} *imgs;
	atomic_uint_least64_t bytes_resident; /* verified bytes from images */
	atomic_uint_least64_t bytes_local;    /* verified bytes from spill copies */
	uint32_t *lhandles;           /* per manifest file: lent to the daemon
	                               * (cli_load_lend), or LOAD_NO_HANDLE */
	atomic_uint_least64_t bytes_daemon;   /* bytes the daemon read for us */
	atomic_uint_least64_t bytes_shared;   /* of them, read for another load */
	/* ckpt_load_set_group() (see "Groups" below): set on the caller's
	 * thread before start; the counts are written by the group thread. */
	bool grouped;
	struct ckpt_load_group group;
	uint32_t g_rank, g_size;
	const struct nccl *g_nccl;
	const struct cudart *g_rt;
	atomic_uint_least64_t g_bytes_read, g_reads;
	struct ckpt_future done;

	pthread_mutex_t lock;
	size_t next_read;             /* [lock] */
	int err;                      /* [lock] first failure */
	char errmsg[1024];            /* [lock] */
	unsigned running;             /* [lock] */
	atomic_bool wrote;            /* some destination bytes were written */
	atomic_bool s3_refused;       /* ckptd refused an S3 read: warned once */
	atomic_bool *s3_skip;         /* per manifest file: ckptd refused it, the
	                               * library reads it */
	unsigned next_slot;           /* [lock] arena slots handed out */
	pthread_t threads[LOAD_MAX_THREADS];
	unsigned n_threads;
};

/* A load thread's buffers. */
struct lthread {
	char *buf;          /* bounce buffer */
	size_t cap;
	bool owned;         /* malloc'd, grown on demand; else an arena slot */
	char *stage;        /* arena slot: device copies packed for H2D */
	struct iovec *iov;  /* IOV_MAX entries, for the direct path */
	uint64_t *ioff;     /* IOV_MAX entries: their file offsets (image_iov) */
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
	ld->first_device_dst = -1;
	*ret_load = ld;
	return 0;
nomem:
	cli_set_error("ckpt_load_begin: out of memory");
	return -ENOMEM;
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

/* Checks that a box of `bytes` from data is memory of CUDA device
 * `device`, opening the load's checking context first. */
static int check_device_box(struct ckpt_load *ld, const char *name, uint32_t box, int32_t device,
			    const void *data, uint64_t bytes, const char *fn)
{
	char err[512];
	int r;

	if (!ld->cuda) {
		r = cli_cuda_load_open(NULL, 0, &ld->cuda, err, sizeof(err));
		if (r < 0)
			return poison(ld, r, "%s: '%.200s': box %u: %s", fn, name, box, err);
	}
	r = cli_cuda_load_check(ld->cuda, data, bytes, device, err, sizeof(err));
	if (r < 0)
		return poison(ld, r, "%s: '%.200s': box %u on CUDA device %d: %s", fn, name, box,
			      (int)device, err);
	return 0;
}

/* Adds destination box `box` of item `item`: offsets/shape NULL mean the
 * whole item; strides (elements) NULL mean row-major in shape.  device: a
 * CUDA device ordinal, or -1 for host memory. */
static int add_box(struct ckpt_load *ld, uint32_t item, uint32_t box, const uint64_t *offsets,
		   const uint64_t *shape, const int64_t *strides, void *data, int32_t device,
		   const char *fn)
{
	unsigned __int128 far = 0;  /* bytes from data to the box's end */
	const struct manifest_tensor *t = &ld->rd->m.items[item];
	size_t esize = ckpt_dtype_size((enum ckpt_dtype)t->dtype);
	unsigned n = t->ndim;
	uint64_t *o, *s, *st, vol = 1;

	if (ld->n_dsts >= PLAN_MAX_WANTS || ld->n_dims + 3u * n > LOAD_MAX_DIMS)
		return poison(ld, -E2BIG, "%s: too many destination boxes in one load", fn);
	if (grow_array((void **)&ld->dsts, &ld->cap_dsts, ld->n_dsts + 1, sizeof(*ld->dsts)) ||
	    grow_array((void **)&ld->dims, &ld->cap_dims, ld->n_dims + 3u * n + 1, sizeof(*ld->dims)))
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
		far = esize;
		for (unsigned d = 0; d < n; d++)
			far += (unsigned __int128)(s[d] - 1) * st[d];
		if (!data)
			return poison(ld, -EINVAL, "%s: '%s': destination data is NULL", fn,
				      t->name);
		/* The farthest byte must be an address: no wrap past the end of
		 * the address space, nor more than a C object can span. */
		if (far > PTRDIFF_MAX || (uintptr_t)data > UINTPTR_MAX - (uint64_t)far)
			return poison(ld, -EINVAL, "%s: '%s': the box, with its strides, reaches "
				      "past the end of the address space", fn, t->name);
	}
	/* Now, not at start: the caller learns which box is wrong, and a
	 * box that runs past its allocation never reaches a copy. */
	if (device >= 0) {
		int r = check_device_box(ld, t->name, box, device, data, (uint64_t)far, fn);
		if (r)
			return r;
	}
	ld->dsts[ld->n_dsts] = (struct ldst){ .item = item, .device = device, .data = data,
					      .dims = ld->n_dims };
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
	/* The array's elements are the caller's struct, of the size its
	 * header gave them (the first element's size field): step by that,
	 * not by this library's sizeof. */
	uint32_t dsz;
	memcpy(&dsz, t.dsts, sizeof(dsz));
	for (uint32_t k = 0; k < t.n_dsts; k++) {
		const void *el = (const char *)t.dsts + (size_t)k * dsz;
		struct ckpt_load_dst d;
		uint32_t esz;

		r = abi_copy_in(&abi_load_dst, &d, el, fn);
		if (r)
			return poison(load, r, "%s", ckpt_last_error());
		memcpy(&esz, el, sizeof(esz));
		if (esz != dsz)
			return poison(load, -EINVAL, "%s: '%.200s': box %u has size %u, box 0 has "
				      "%u: every element of dsts is one struct ckpt_load_dst", fn,
				      t.name, k, esz, dsz);
		if (d.reserved)
			return poison(load, -EINVAL, "%s: '%.200s': box %u: reserved is not 0", fn,
				      t.name, k);
		if (d.device != CKPT_DEVICE_HOST && d.device != CKPT_DEVICE_CUDA)
			return poison(load, -EINVAL, "%s: '%.200s': box %u: unknown device %d", fn,
				      t.name, k, (int)d.device);
		if (d.device == CKPT_DEVICE_CUDA && d.device_index < 0)
			return poison(load, -ENODEV, "%s: '%.200s': box %u: CUDA device %d does "
				      "not exist (device_index is negative)", fn, t.name, k,
				      (int)d.device_index);
		if (!d.shape && d.offsets)
			return poison(load, -EINVAL, "%s: '%.200s': box %u has offsets but no shape",
				      fn, t.name, k);
		r = add_box(load, (uint32_t)item, k, d.offsets, d.shape, d.strides, d.data,
			    d.device == CKPT_DEVICE_CUDA ? d.device_index : -1, fn);
		if (r) {
			load->n_dsts = before;
			load->n_dims = before_dims;
			return r;
		}
	}
	for (size_t i = before; i < load->n_dsts; i++) {
		if (load->dsts[i].device < 0)
			continue;
		if (load->first_device_dst < 0)
			load->first_device_dst = (long)i;
		load->n_device_dsts++;
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
	r = add_box(load, (uint32_t)item, 0, NULL, NULL, NULL, buf, -1, fn);
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

/* A box of extents ext with destination and source byte strides ds, ss,
 * without its dimensions of extent 1: their number (extents e, strides a
 * and b), or -1 if an extent is 0 (nothing to copy). */
static int squeeze(const uint64_t *ext, const uint64_t *ds, const uint64_t *ss, unsigned n,
		   uint64_t *e, uint64_t *a, uint64_t *b)
{
	int m = 0;

	for (unsigned d = 0; d < n; d++) {
		if (ext[d] == 0)
			return -1;
		if (ext[d] == 1)
			continue;
		e[m] = ext[d];
		a[m] = ds[d];
		b[m] = ss[d];
		m++;
	}
	return m;
}

void cli_box_copy(char *dst, const uint64_t *ds, const char *src, const uint64_t *ss,
		  const uint64_t *ext, unsigned n, size_t esize)
{
	uint64_t e[CKPT_MAX_NDIM], a[CKPT_MAX_NDIM], b[CKPT_MAX_NDIM], idx[CKPT_MAX_NDIM];
	uint64_t run = esize;
	int sq = squeeze(ext, ds, ss, n, e, a, b);
	unsigned m;

	if (sq < 0)
		return;
	m = (unsigned)sq;
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

/* ---- copies into CUDA device memory ---- */

/*
 * The runs of a squeezed box (m dimensions: extents e, destination strides
 * a, source strides b) that are contiguous in the destination: the
 * innermost dimensions whose strides make one run there.  Sets *ret_k (the
 * outer dimensions, one run per index of them) and *ret_run (bytes).
 * Returns whether each run is contiguous in the source too (else the copy
 * must be packed first).
 */
static bool dst_runs(const uint64_t *e, const uint64_t *a, const uint64_t *b, unsigned m,
		     size_t esize, unsigned *ret_k, uint64_t *ret_run)
{
	uint64_t run = esize;
	unsigned k = m;
	bool src_too = true;

	while (k > 0 && a[k - 1] == run) {
		if (b[k - 1] != run)
			src_too = false;
		run *= e[k - 1];
		k--;
	}
	*ret_k = k;
	*ret_run = run;
	return src_too;
}

/* Whether copy cp (to a device box) must be packed into a stage before its
 * H2D copies: some run contiguous in the destination is not in the chunk. */
static bool device_copy_packs(const struct ckpt_load *ld, const struct plan_copy *cp)
{
	const struct manifest_tensor *t = &ld->rd->m.items[cp->item];
	size_t esize = ckpt_dtype_size((enum ckpt_dtype)t->dtype);
	const uint64_t *ds = ld->dims + ld->dsts[cp->want].dims + 2u * t->ndim;
	uint64_t ss[CKPT_MAX_NDIM], e[CKPT_MAX_NDIM], a[CKPT_MAX_NDIM], b[CKPT_MAX_NDIM], run;
	unsigned k;
	int m;

	plan_chunk_strides(t, &t->chunks[cp->chunk], esize, ss);
	m = squeeze(cp->shape, ds, ss, t->ndim, e, a, b);
	return m > 0 && !dst_runs(e, a, b, (unsigned)m, esize, &k, &run);
}

/*
 * Copies cp from src (its first element in the bounce buffer, byte strides
 * ss) into its device box: one waited-for H2D per run contiguous in the
 * destination (one in all for a contiguous box), from the bounce buffer,
 * or from the thread's stage when the runs are not contiguous there.
 * 0, or -errno with the load failed, naming the tensor and the device.
 */
static int device_copy(struct ckpt_load *ld, struct lthread *th, const struct plan_copy *cp,
		       const char *src, const uint64_t *ss)
{
	const struct ldst *d = &ld->dsts[cp->want];
	const struct manifest_tensor *t = &ld->rd->m.items[cp->item];
	size_t esize = ckpt_dtype_size((enum ckpt_dtype)t->dtype);
	unsigned n = t->ndim, k;
	const uint64_t *ds = ld->dims + d->dims + 2u * n;
	uint64_t e[CKPT_MAX_NDIM], a[CKPT_MAX_NDIM], b[CKPT_MAX_NDIM], idx[CKPT_MAX_NDIM] = { 0 };
	uint64_t ps[CKPT_MAX_NDIM], run;
	char *dst = copy_dst(ld, cp, n), err[512];
	int m = squeeze(cp->shape, ds, ss, n, e, a, b), r;

	if (m < 0)
		return 0;
	if (!dst_runs(e, a, b, (unsigned)m, esize, &k, &run)) {
		/* Row-major in the copy's own shape, every suffix of the
		 * dimensions is contiguous: so is every destination run. */
		if (!th->stage || cp->bytes > ld->stage_bytes) {
			fail(ld, -EIO, "internal error: tensor '%s': a %llu-byte copy exceeds the "
			     "%zu-byte stage", t->name, (unsigned long long)cp->bytes,
			     ld->stage_bytes);
			return -EIO;
		}
		for (unsigned j = n; j-- > 0;)
			ps[j] = j + 1 < n ? ps[j + 1] * cp->shape[j + 1] : esize;
		cli_box_copy(th->stage, ps, src, ss, cp->shape, n, esize);
		src = th->stage;
		m = squeeze(cp->shape, ds, ps, n, e, a, b);
		(void)dst_runs(e, a, b, (unsigned)m, esize, &k, &run);
	}
	for (;;) {
		uint64_t doff = 0, soff = 0;

		for (unsigned j = 0; j < k; j++) {
			doff += idx[j] * a[j];
			soff += idx[j] * b[j];
		}
		r = cli_cuda_load_h2d(ld->cuda, d->device, dst + doff, src + soff, (size_t)run, err,
				      sizeof(err));
		if (r < 0) {
			fail(ld, r, "copying tensor '%s' into CUDA device %d: %s; the destination "
			     "may be partly written", t->name, (int)d->device, err);
			return r;
		}
		unsigned j = k;
		while (j > 0) {
			j--;
			if (++idx[j] < e[j])
				break;
			idx[j] = 0;
			if (j == 0)
				return 0;
		}
		if (k == 0)
			return 0;
	}
}

/* Reads file bytes [off, off + len) into buf: pread until done, or one
 * ranged GET.  0, or -errno with the load failed. */
static int read_bytes(struct ckpt_load *ld, const struct plan_read *rd, uint64_t off,
		      uint64_t len, char *buf)
{
	const char *file = ld->rd->m.files[rd->file].path;
	uint64_t got = 0;

	if (ld->rd->s3) {
		int r;

		cli_reader_touch(ld->rd);
		r = store_s3.read_range(ld->rd->path, file, off, len, buf);
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

/* Copy cp as one run: contiguous in the file and in its destination, in
 * host memory.  Fills *iov with the destination and returns true. */
static bool copy_run(struct ckpt_load *ld, const struct plan_copy *cp, struct iovec *iov)
{
	const struct manifest_tensor *t = &ld->rd->m.items[cp->item];
	const uint64_t *ds = ld->dims + ld->dsts[cp->want].dims + 2u * t->ndim;
	size_t esize = ckpt_dtype_size((enum ckpt_dtype)t->dtype);
	uint64_t ss[CKPT_MAX_NDIM];

	if (ld->dsts[cp->want].device >= 0)
		return false;
	plan_chunk_strides(t, &t->chunks[cp->chunk], esize, ss);
	if (!region_contiguous(cp->shape, ss, t->ndim, esize) ||
	    !region_contiguous(cp->shape, ds, t->ndim, esize))
		return false;
	iov->iov_base = copy_dst(ld, cp, t->ndim);
	iov->iov_len = (size_t)cp->bytes;
	return true;
}

/* The direct path: rd's copies, in file order, are contiguous on both
 * sides, tile the read exactly and go to host memory.  Returns true and
 * fills iov if so. */
static bool direct_iov(struct ckpt_load *ld, const struct plan_read *rd, struct iovec *iov)
{
	const struct plan *p = ld->plan;
	uint64_t pos = rd->begin;

	if (rd->n_copies > IOV_MAX || (ld->rd->s3 && rd->n_copies != 1))
		return false;
	for (size_t i = 0; i < rd->n_copies; i++) {
		const struct plan_copy *cp = &p->copies[rd->copy0 + i];

		if (cp->src != pos || !copy_run(ld, cp, &iov[i]))
			return false;
		pos += cp->bytes;
	}
	return pos == rd->end;
}

/*
 * A read served from an image copies no more than its copies' bytes: the
 * image is memory, so a bounce buffer of the whole CRC blocks (what a read
 * from storage takes) would only cost a second copy and check.  When every
 * copy is one contiguous run on both sides, in host memory, the runs in
 * file order without overlap and inside the read's check spans, fills iov
 * and ioff with the destinations and their file offsets and returns true.
 * crc_iov then copies the runs and checks each piece over the bytes that
 * landed, plus the image's bytes of the piece outside the runs.
 */
static bool image_iov(struct ckpt_load *ld, const struct plan_read *rd, struct iovec *iov,
		      uint64_t *ioff)
{
	const struct plan *p = ld->plan;
	uint64_t last = 0;

	if (rd->n_copies == 0 || rd->n_copies > IOV_MAX)
		return false;
	for (size_t i = 0; i < rd->n_copies; i++) {
		const struct plan_copy *cp = &p->copies[rd->copy0 + i];

		if ((i && cp->src < last) || !copy_run(ld, cp, &iov[i]))
			return false;
		ioff[i] = cp->src;
		last = cp->src + cp->bytes;
	}
	/* Every run inside the spans (the planner makes them so: a copy's
	 * bytes are in the pieces it touches), so the check sees each byte
	 * that lands. */
	for (size_t i = 0, k = rd->check0; i < rd->n_copies; i++) {
		uint64_t at = ioff[i], end = ioff[i] + iov[i].iov_len;

		while (at < end) {
			while (k < rd->check0 + rd->n_checks && at >= p->checks[k].end)
				k++;
			if (k == rd->check0 + rd->n_checks || at < p->checks[k].begin)
				return false;
			at = p->checks[k].end < end ? p->checks[k].end : end;
		}
	}
	return true;
}

/* The spans of read rd against its bytes in the iovecs, each piece
 * checksummed across the iovecs it spans.  The iovecs hold the file's bytes
 * from rd->begin on, one after the other, or with ioff, iov[i] those at
 * file offset ioff[i] (in file order, gaps allowed: image_iov).  With src
 * (an image: the file's bytes at 0), each run is copied from src into its
 * iovec first, and bytes of a piece in no iovec are taken from src.
 * Returns 0; -EBADMSG with the first bad piece's offset and item in
 * *ret_bad and *ret_item; or -EIO if a span steps backwards or outside the
 * iovecs (a bug). */
static int crc_iov(const struct ckpt_load *ld, const struct plan_read *rd,
		   const struct iovec *iov, const uint64_t *ioff, size_t n_iov, const char *src,
		   uint64_t *ret_bad, uint32_t *ret_item)
{
	const struct plan *p = ld->plan;
	size_t v = 0;
	uint64_t vbase = ioff ? ioff[0] : rd->begin; /* file offset of iov[v] */

	for (size_t k = rd->check0; k < rd->check0 + rd->n_checks; k++) {
		const struct plan_check *ck = &p->checks[k];
		const struct manifest_chunk *c = &ld->rd->m.items[ck->item].chunks[ck->chunk];
		uint64_t pos = ck->begin;

		while (pos < ck->end) {
			uint64_t grid = (pos / LAYOUT_CRC_BLOCK + 1) * LAYOUT_CRC_BLOCK;
			uint64_t stop = grid < ck->end ? grid : ck->end, at = pos;
			uint32_t crc = 0;

			while (at < stop) {
				/* Spans move forward through the iovecs (chunks
				 * own disjoint bytes: manifest_parse, plan.c);
				 * one that does not is a bug, never a read
				 * before a destination. */
				while (v < n_iov && at >= vbase + iov[v].iov_len) {
					vbase = ioff && v + 1 < n_iov ? ioff[v + 1] :
									vbase + iov[v].iov_len;
					v++;
				}
				if (v == n_iov || at < vbase) {
					/* Bytes of the piece no run takes: from
					 * the image, never copied. */
					if (!ioff || !src)
						return -EIO;
					uint64_t gap = v < n_iov && vbase < stop ? vbase : stop;
					crc = crc32c(src + at, (size_t)(gap - at), crc);
					at = gap;
					continue;
				}
				uint64_t n = stop - at, room = vbase + iov[v].iov_len - at;
				if (n > room)
					n = room;
				/* From an image (src: the file's bytes at 0),
				 * each run is copied (large ones with streaming
				 * stores), then checksummed where it landed. */
				if (src)
					copy_engine_host.copy((char *)iov[v].iov_base +
							      (at - vbase), src + at,
							      (size_t)n, NULL, 0);
				crc = crc32c((const char *)iov[v].iov_base + (at - vbase), (size_t)n,
					     crc);
				at += n;
			}
			if (crc != c->crcs[pos / LAYOUT_CRC_BLOCK - c->begin / LAYOUT_CRC_BLOCK]) {
				*ret_bad = pos;
				*ret_item = ck->item;
				return -EBADMSG;
			}
			pos = stop;
		}
	}
	return 0;
}

/* Checks the spans of a direct read: the bytes are in the destinations. */
static int check_direct(struct ckpt_load *ld, const struct plan_read *rd, const struct iovec *iov)
{
	uint64_t bad = 0;
	uint32_t item = 0;
	int r = crc_iov(ld, rd, iov, NULL, rd->n_copies, NULL, &bad, &item);

	if (r == -EIO) {
		/* Spans move forward through the iovecs (chunks own disjoint
		 * bytes: manifest_parse, plan.c); one that does not is a bug,
		 * never a read before a destination. */
		fail(ld, -EBADMSG, "internal error: a check span of %s steps backwards",
		     ld->rd->m.files[rd->file].path);
		return -EBADMSG;
	}
	if (r)
		fail(ld, -EBADMSG, "CRC mismatch in %s/%s at offset %llu (%s '%s'): "
		     "the destination holds unverified bytes", ld->rd->path,
		     ld->rd->m.files[rd->file].path, (unsigned long long)bad,
		     ld->rd->m.items[item].kind == ITEM_BLOB ? "blob" : "tensor",
		     item_name(ld, item));
	return r;
}

/* Reads the bytes of rd from the daemon's image of its file into the
 * iovecs and checks them, quietly.  Returns true if they are all good.
 * Else the image is not used again by this load (its other reads go to
 * storage), and the caller reads rd from storage: the image is a faster
 * source, never the only one -- a checkpoint saved again at the same
 * path with the same attempt id, or a daemon that reused the image
 * meanwhile, must not fail a load that storage can serve. */
static bool image_read(struct ckpt_load *ld, const struct plan_read *rd, const struct iovec *iov,
		       const uint64_t *ioff, size_t n_iov)
{
	struct limage *im = &ld->imgs[rd->file];
	uint64_t off = ioff ? ioff[0] : rd->begin, bad = 0, covered = 0, span = 0;
	uint32_t item = 0;
	int r;

	/* When the read's CRC spans cover all its iovecs (as they do when its
	 * copies are whole chunks' bytes), copy and check in one pass;
	 * else copy everything, then check. */
	for (size_t k = rd->check0; k < rd->check0 + rd->n_checks; k++)
		covered += ld->plan->checks[k].end - ld->plan->checks[k].begin;
	for (size_t i = 0; i < n_iov; i++)
		span += iov[i].iov_len;
	if (im->spill) {
		/* Read, then checked where it landed; an error or a short
		 * read is a bad copy, like a mismatch. */
		r = 0;
		for (size_t i = 0; i < n_iov && r == 0; i++) {
			size_t got = 0;
			while (got < iov[i].iov_len) {
				ssize_t n = pread(im->sfd, (char *)iov[i].iov_base + got,
						  iov[i].iov_len - got, (off_t)(off + got));
				if (n < 0 && errno == EINTR)
					continue;
				if (n <= 0) {
					r = -EIO;
					bad = off + got;
					break;
				}
				got += (size_t)n;
			}
			off = ioff && i + 1 < n_iov ? ioff[i + 1] : off + iov[i].iov_len;
		}
		if (r == 0)
			r = crc_iov(ld, rd, iov, ioff, n_iov, NULL, &bad, &item);
	} else if (ioff || covered == span) {
		/* Large runs with streaming stores: the copy then moves two
		 * thirds of the memory traffic (client/copy.c), which the
		 * check's read of the destination more than pays for. */
		r = crc_iov(ld, rd, iov, ioff, n_iov, im->map, &bad, &item);
		if (copy_engine_host.sync)
			copy_engine_host.sync(NULL, 0);
	} else {
		for (size_t i = 0; i < n_iov; i++) {
			memcpy(iov[i].iov_base, im->map + off, iov[i].iov_len);
			off = ioff && i + 1 < n_iov ? ioff[i + 1] : off + iov[i].iov_len;
		}
		r = crc_iov(ld, rd, iov, ioff, n_iov, NULL, &bad, &item);
	}
	if (r == 0) {
		atomic_fetch_add_explicit(im->spill ? &ld->bytes_local : &ld->bytes_resident,
					  rd->end - rd->begin,
					  memory_order_relaxed);
		return true;
	}
	if (!atomic_exchange(&im->bad, true))
		cli_log(CKPT_LOG_WARNING, "%s of %s/%s does not match the manifest at offset "
			"%llu: reading the file from storage instead",
			im->spill ? "the node's local copy (S3 spill tier)" : "ckptd's in-memory copy",
			ld->rd->path, ld->rd->m.files[rd->file].path, (unsigned long long)bad);
	return false;
}

/* True if reads of `file` come from the daemon's image (or a spill copy). */
static bool image_use(struct ckpt_load *ld, uint32_t file)
{
	return (ld->imgs[file].map || ld->imgs[file].spill) &&
	       !atomic_load_explicit(&ld->imgs[file].bad, memory_order_relaxed);
}

/* An image failed its check and storage is the fallback: 0 if the file
 * can be read there, else the load fails saying both. */
static int image_fallback(struct ckpt_load *ld, const struct plan_read *rd)
{
	int err = ld->imgs[rd->file].open_err;

	if (ld->rd->s3 || ld->fds[rd->file] >= 0)
		return 0;
	fail(ld, -EBADMSG, "ckptd's in-memory copy of %s/%s does not match the manifest, "
	     "and the file cannot be read from storage: %s", ld->rd->path,
	     ld->rd->m.files[rd->file].path, strerror(err ? -err : ENOENT));
	return -EBADMSG;
}

static int do_direct(struct ckpt_load *ld, const struct plan_read *rd, struct iovec *iov)
{
	const char *file = ld->rd->m.files[rd->file].path;
	uint64_t off = rd->begin;
	size_t v = 0;
	int r;

	/* Copied, then checked where it landed (image_read). */
	if (image_use(ld, rd->file)) {
		if (image_read(ld, rd, iov, NULL, rd->n_copies))
			return 0;
		if ((r = image_fallback(ld, rd)) < 0)
			return r;
	}
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

static int serve_bounce(struct ckpt_load *ld, const struct plan_read *rd, struct lthread *th,
			const char *buf);

/* The bounce path: read, verify, then copy into place (serve_bounce). */
static int do_bounce(struct ckpt_load *ld, const struct plan_read *rd, struct lthread *th)
{
	uint64_t len = rd->end - rd->begin;
	int r;

	if (len > th->cap) {
		if (!th->owned) {
			/* The slot holds the plan's largest read. */
			fail(ld, -EIO, "internal error: a %llu-byte read exceeds the %zu-byte "
			     "bounce buffer", (unsigned long long)len, th->cap);
			return -EIO;
		}
		free(th->buf);
		th->buf = malloc((size_t)len);
		th->cap = th->buf ? (size_t)len : 0;
		if (!th->buf) {
			fail(ld, -ENOMEM, "out of memory for a %llu-byte read buffer",
			     (unsigned long long)len);
			return -ENOMEM;
		}
	}
	if (image_use(ld, rd->file)) {
		/* Checked here quietly, and again by serve_bounce: a bounce
		 * read from an image pays the CRC twice. */
		struct iovec one = { th->buf, (size_t)len };
		if (image_read(ld, rd, &one, NULL, 1))
			return serve_bounce(ld, rd, th, th->buf);
		if ((r = image_fallback(ld, rd)) < 0)
			return r;
	}
	r = read_bytes(ld, rd, rd->begin, len, th->buf);
	return r ? r : serve_bounce(ld, rd, th, th->buf);
}

/* Verifies the bytes of read rd at buf (file offset rd->begin), then
 * copies each of its copies into place (device copies return when done,
 * so buf is free again when this returns). */
static int serve_bounce(struct ckpt_load *ld, const struct plan_read *rd, struct lthread *th,
			const char *buf)
{
	const struct plan *p = ld->plan;
	int r = check_spans(ld, rd, buf, rd->begin, false);

	if (r)
		return r;
	if (rd->n_copies)
		atomic_store_explicit(&ld->wrote, true, memory_order_relaxed);
	for (size_t i = rd->copy0; i < rd->copy0 + rd->n_copies; i++) {
		const struct plan_copy *cp = &p->copies[i];
		const struct manifest_tensor *t = &ld->rd->m.items[cp->item];
		size_t esize = ckpt_dtype_size((enum ckpt_dtype)t->dtype);
		const char *src = buf + (cp->src - rd->begin);
		uint64_t ss[CKPT_MAX_NDIM];

		plan_chunk_strides(t, &t->chunks[cp->chunk], esize, ss);
		if (ld->dsts[cp->want].device >= 0) {
			r = device_copy(ld, th, cp, src, ss);
			if (r)
				return r;
			continue;
		}
		cli_box_copy(copy_dst(ld, cp, t->ndim),
			 ld->dims + ld->dsts[cp->want].dims + 2u * t->ndim, src, ss, cp->shape,
			 t->ndim, esize);
	}
	return 0;
}

/* A read through the daemon that offers the pool goes as pieces, its bytes
 * cut at the PROTO_LOAD_CELL grid of the file (proto.h): the pool keeps
 * whole cells, so every loader's piece of a cell is answered from the one
 * read of it, wherever the loaders' plans cut their reads, and whether or
 * not a pool is there yet (a piece answered in the arena is just the bytes
 * asked for).  At most this many pieces. */
#define LOAD_MAX_PIECES (PROTO_LOAD_MAX / PROTO_LOAD_CELL + 1)

/* A contiguous read-only view of the n pieces of a read, piece i being
 * [cut[i], cut[i + 1]) of the file, each mapped from the pool's descriptor
 * at its offset; or NULL.  Its length (for munmap) in *ret_len. */
static char *pieces_window(const struct cli_lread *lr, const uint64_t *cut, size_t n,
			   size_t *ret_len)
{
	size_t total = (size_t)(cut[n] - cut[0]);
	char *win = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (win == MAP_FAILED)
		return NULL;
	*ret_len = total;
	for (size_t i = 0; i < n; i++) {
		void *at = win + (cut[i] - cut[0]);

		if (mmap(at, (size_t)(cut[i + 1] - cut[i]), PROT_READ, MAP_SHARED | MAP_FIXED,
			 lr[i].pool->fd, (off_t)lr[i].pool_off) == MAP_FAILED) {
			munmap(win, total);
			return NULL;
		}
	}
	return win;
}

/*
 * Through the daemon: it reads the read's bytes (on the O_DIRECT grid,
 * in pieces if offered to the pool) into slots of the client's arena
 * (registered with io_uring and faulted in long ago) or into its pool,
 * where another loader's request may have read them already; then they are
 * checked and scattered there as a bounce buffer's would be (pool pieces
 * through a contiguous view of them).  Returns 1 if the read does not fit
 * the arena (the caller reads it itself), 0, or -errno with the load
 * failed.
 */
static int do_daemon(struct ckpt_load *ld, const struct plan_read *rd, struct lthread *th)
{
	struct ckpt_client *c = ld->client;
	uint64_t a0 = rd->begin / PROTO_LOAD_ALIGN * PROTO_LOAD_ALIGN;
	uint64_t a1 = cli_div_up(rd->end, PROTO_LOAD_ALIGN) * PROTO_LOAD_ALIGN;
	uint64_t n_slots = cli_div_up(a1 - a0, c->slot_bytes), shared = 0;
	uint64_t cut[LOAD_MAX_PIECES + 1];
	struct cli_lread lr[LOAD_MAX_PIECES];
	bool offer = c->share && !ld->rd->s3;
	size_t n = 0, in_pool = 0;
	char *arena, *win = NULL;
	size_t win_len = 0;
	const char *src;
	int64_t first, got = 0;
	int r = 0;

	cli_reader_touch(ld->rd); /* the daemon reads for us: our lease still counts */
	/* Half the arena at most, so two reads always fit at once. */
	if (a1 - a0 > PROTO_LOAD_MAX || n_slots > c->slots.n_slots / 2)
		return 1;
	cut[0] = a0;
	while (offer && a1 > a0 && cut[n] / PROTO_LOAD_CELL < (a1 - 1) / PROTO_LOAD_CELL) {
		cut[n + 1] = (cut[n] / PROTO_LOAD_CELL + 1) * PROTO_LOAD_CELL;
		n++;
	}
	cut[++n] = a1;
	/* Saves on the same client take slots one at a time as they come
	 * back; rather than wait long for a run of them, read here.  A read
	 * answered in the pool leaves them unused: they bound the reads this
	 * client holds there (each piece pins its cell) as they bound its
	 * reads into the arena. */
	first = cli_arena_take(c, (uint32_t)n_slots, ld->rd->s3 ? LOAD_S3_SLOT_WAIT_MS : 2000);
	if (first == -ETIMEDOUT)
		return 1;
	if (first < 0) {
		fail(ld, (int)first, "reading %s/%s through ckptd: no arena slots: %s",
		     ld->rd->path, ld->rd->m.files[rd->file].path, strerror((int)-first));
		return (int)first;
	}
	arena = (char *)c->arena + (uint64_t)first * c->slot_bytes;
	r = cli_load_reserve(c, (uint32_t)n);
	if (r < 0) {
		fail(ld, r, "reading %s/%s through ckptd: %s", ld->rd->path,
		     ld->rd->m.files[rd->file].path, strerror(-r));
		cli_arena_put(c, (uint32_t)first, (uint32_t)n_slots);
		return r;
	}
	for (size_t i = 0; i < n; i++)
		cli_load_send(c, ld->lhandles[rd->file], cut[i], cut[i + 1] - cut[i],
			      (uint64_t)first * c->slot_bytes + (cut[i] - a0), offer, &lr[i]);
	/* Every piece's answer, whatever came before it: each holds a pin or
	 * a waiter until it is waited for and released. */
	for (size_t i = 0; i < n; i++) {
		int64_t g = cli_load_wait(c, &lr[i]);
		/* The bytes of the read in this piece: all there unless the
		 * file is shorter than its manifest says. */
		uint64_t b = rd->begin > cut[i] ? rd->begin : cut[i];
		uint64_t e = rd->end < cut[i + 1] ? rd->end : cut[i + 1];

		if (got < 0)
			continue;
		if (g < 0) {
			got = g;
			continue;
		}
		if ((uint64_t)g < e - cut[i]) {
			got = -ENODATA;
			continue;
		}
		if (lr[i].bytes) {
			in_pool++;
			if (lr[i].shared)
				shared += e - b;
		}
	}
	if (got == -EMFILE) {
		/* The daemon lends no more descriptors (daemon/loadio.h). */
		r = 1;
		goto out;
	}
	if (ld->rd->s3 && (got == -EOPNOTSUPP || got == -EPERM || got == -EACCES ||
			   got == -EINVAL || got == -ENOMEM)) {
		/* ckptd does not read this object (no S3 set up, not below
		 * its S3 roots, S3 denied its credentials): the library GETs
		 * the file itself from now on. */
		atomic_store(&ld->s3_skip[rd->file], true);
		if (!atomic_exchange(&ld->s3_refused, true))
			cli_log(CKPT_LOG_WARNING, "ckptd does not read %s for this client (%s): "
				"reading it with the library's own S3 credentials", ld->rd->path,
				got == -EPERM	    ? "not below an S3 root of its config" :
				got == -EACCES	    ? "S3 denied the daemon's credentials" :
				got == -EOPNOTSUPP ? "S3 is not set up in ckptd" :
						     strerror((int)-got));
		r = 1;
		goto out;
	}
	if (got < 0) {
		fail(ld, got == -ENODATA ? -EBADMSG : (int)got,
		     "reading %s/%s [%llu, %llu) through ckptd: %s", ld->rd->path,
		     ld->rd->m.files[rd->file].path, (unsigned long long)rd->begin,
		     (unsigned long long)rd->end,
		     got == -ENODATA ? "the file is truncated" :
		     ld->rd->s3 && got == -EBADMSG ?
			     "S3 has fewer bytes than the manifest says (the object is truncated)" :
						     strerror((int)-got));
		r = got == -ENODATA ? -EBADMSG : (int)got;
		goto out;
	}
	src = arena;
	if (in_pool == n) {
		/* Pieces side by side in one pool (the daemon hands out room
		 * first-fit, so a read's cells often are) are read through the
		 * client's mapping of the whole pool, whose pages stay mapped
		 * from one read to the next; others through a view made for
		 * this read, whose pages fault in afresh. */
		size_t i = 1;
		while (i < n && lr[i].pool == lr[0].pool &&
		       lr[i].pool_off == lr[0].pool_off + (cut[i] - a0))
			i++;
		src = i == n ? lr[0].bytes : (win = pieces_window(lr, cut, n, &win_len));
	}
	if (!src || (in_pool && in_pool < n)) {
		/* Some pieces in the arena, some in the pool (the pool was
		 * made meanwhile), or no view: the pool's into the arena. */
		for (size_t i = 0; i < n; i++)
			if (lr[i].bytes)
				memcpy(arena + (cut[i] - a0), lr[i].bytes, (size_t)lr[i].got);
		src = arena;
	}
	atomic_fetch_add_explicit(&ld->bytes_daemon, rd->end - rd->begin, memory_order_relaxed);
	atomic_fetch_add_explicit(&ld->bytes_shared, shared, memory_order_relaxed);
	r = serve_bounce(ld, rd, th, src + (rd->begin - a0));
	if (win)
		munmap(win, win_len);
out:
	for (size_t i = 0; i < n; i++)
		cli_load_release(c, &lr[i]);
	cli_load_unreserve(c, (uint32_t)n);
	cli_arena_put(c, (uint32_t)first, (uint32_t)n_slots);
	return r;
}

/* A load thread stops.  The last one out reports; ld->err is final once
 * every thread stopped.  A failure after any destination was written says
 * so, whichever read failed: the caller must not take the rest for the
 * checkpoint's state. */
static void load_thread_exit(struct ckpt_load *ld)
{
	bool last;

	pthread_mutex_lock(&ld->lock);
	last = --ld->running == 0;
	pthread_mutex_unlock(&ld->lock);
	if (!last)
		return;
	if (ld->err && atomic_load_explicit(&ld->wrote, memory_order_relaxed) &&
	    !strstr(ld->errmsg, "partly written")) {
		size_t n = strlen(ld->errmsg);
		snprintf(ld->errmsg + n, sizeof(ld->errmsg) - n,
			 "; destinations may be partly written");
	}
	future_complete(&ld->done, ld->err, ld->err ? ld->errmsg : "");
}

static void *load_thread(void *arg)
{
	struct ckpt_load *ld = arg;
	const struct plan *p = ld->plan;
	struct lthread th = { .owned = true };

	if (ld->arena) {
		unsigned slot;

		pthread_mutex_lock(&ld->lock);
		slot = ld->next_slot++;
		pthread_mutex_unlock(&ld->lock);
		th.buf = ld->arena + (size_t)slot * ld->slot_bytes;
		th.cap = ld->bounce_bytes;
		th.stage = ld->stage_bytes ? th.buf + ld->bounce_bytes : NULL;
		th.owned = false;
	}
	th.iov = malloc(IOV_MAX * sizeof(*th.iov));
	th.ioff = malloc(IOV_MAX * sizeof(*th.ioff));
	if (!th.iov || !th.ioff)
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
		if (ld->lhandles && ld->lhandles[p->reads[i].file] != LOAD_NO_HANDLE &&
		    !image_use(ld, p->reads[i].file) &&
		    !atomic_load_explicit(&ld->s3_skip[p->reads[i].file], memory_order_relaxed)) {
			int r = do_daemon(ld, &p->reads[i], &th);
			if (r < 0)
				break;
			if (r == 0)
				continue;
			/* Too large for the arena: read here, as without it. */
		}
		if (image_use(ld, p->reads[i].file) && !ld->imgs[p->reads[i].file].spill &&
		    image_iov(ld, &p->reads[i], th.iov, th.ioff)) {
			/* The copy writes the destinations before they are
			 * checked. */
			atomic_store_explicit(&ld->wrote, true, memory_order_relaxed);
			if (image_read(ld, &p->reads[i], th.iov, th.ioff, p->reads[i].n_copies))
				continue;
			if (image_fallback(ld, &p->reads[i]) < 0)
				break;
			/* Storage serves it below (the image is no longer used). */
		}
		if (direct_iov(ld, &p->reads[i], th.iov)) {
			/* preadv writes the destinations before they are checked. */
			atomic_store_explicit(&ld->wrote, true, memory_order_relaxed);
			if (do_direct(ld, &p->reads[i], th.iov))
				break;
		} else if (do_bounce(ld, &p->reads[i], &th)) {
			break;
		}
	}
	if (th.owned)
		free(th.buf);
	free(th.iov);
	free(th.ioff);
	load_thread_exit(ld);
	return NULL;
}

static size_t align_up(size_t v)
{
	return (v + LOAD_ALIGN - 1) / LOAD_ALIGN * LOAD_ALIGN;
}

/*
 * On the caller's thread, before the threads start: maps the arena of
 * n_threads slots (each the largest read, then the largest copy that must
 * be packed) and opens the copy context over it in place of the add-time
 * checker, pinned with the first device box's device current.  Sizes are
 * bounded by the plan (a read is at most max_read, PLAN_DEFAULT_MAX_READ,
 * or one CRC piece).  0, or -errno with err.
 */
static int cuda_start(struct ckpt_load *ld, unsigned n_threads, char *err, size_t errlen)
{
	const struct plan *p = ld->plan;
	const struct ldst *first = &ld->dsts[ld->first_device_dst];
	struct cuxfer *x;
	uint64_t stage = 0;
	size_t len;
	void *arena;
	int r;

	for (size_t i = 0; i < p->n_copies; i++) {
		const struct plan_copy *cp = &p->copies[i];

		if (ld->dsts[cp->want].device >= 0 && cp->bytes > stage &&
		    device_copy_packs(ld, cp))
			stage = cp->bytes;
	}
	ld->bounce_bytes = align_up((size_t)p->max_read);
	ld->stage_bytes = align_up((size_t)stage);
	if (ld->grouped) {
		/* The group thread assembles reads in buffers of its own and
		 * uses only the stage (a page at least: never an empty map). */
		ld->bounce_bytes = 0;
		if (!ld->stage_bytes)
			ld->stage_bytes = LOAD_ALIGN;
	}
	ld->slot_bytes = ld->bounce_bytes + ld->stage_bytes;
	len = ld->slot_bytes * n_threads;
	arena = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (arena == MAP_FAILED) {
		r = -errno;
		snprintf(err, errlen, "mapping %zu bytes of load buffers: %s", len, strerror(-r));
		return r;
	}
	r = cli_cuda_load_open(arena, len, &x, err, errlen);
	if (r == 0) {
		r = cli_cuda_load_check(x, first->data, 0, first->device, err, errlen);
		if (r < 0)
			cli_cuda_load_close(x);
	}
	if (r < 0) {
		munmap(arena, len);
		return r;
	}
	cli_cuda_load_close(ld->cuda);
	ld->cuda = x;
	ld->arena = arena;
	ld->arena_len = len;
	return 0;
}

/* ---- groups: read once across replicas (ckpt_load_set_group) ---- */

/*
 * Groups.  Every rank of the caller's communicator plans its own load as
 * usual, then one library thread per rank (group_thread) does the rest:
 *
 *   1. exchange: an all-gather of (number of reads, fingerprint of the
 *      checkpoint), then one of every rank's reads as (file, begin, end),
 *      padded to the longest list, both through a device buffer;
 *   2. ra_assign() on what every rank wants: the same input on every
 *      rank, so the same regions and readers (readassign.h);
 *   3. rounds over the regions in plan order, each at most GROUP_ROUND
 *      bytes: the reader of a region reads it from storage (or ckptd's
 *      image) into host memory and, if others want it, copies it to the
 *      staging buffer on the device; one ncclGroupStart/End holds every
 *      send and receive of the round; a receiver copies what it got back
 *      to host memory;
 *   4. each region's bytes go into the host buffers of this rank's plan
 *      reads that overlap it; a read whose bytes are all there is checked
 *      against its CRCs, whoever read it, and only then scattered into its
 *      destinations (serve_bounce, as a bounce read without a group).
 *
 * Deadlock freedom.  The sequence of NCCL calls depends only on what every
 * rank has after step 1 (the same bytes on every rank) and on the plan
 * ra_assign computes from it (a pure function): every rank makes the same
 * all-gathers, then the same number of rounds, each one group; within a
 * round every rank walks the same regions in the same order, so the k-th
 * send from a to b in a group is the k-th receive of b from a, the order in
 * which NCCL matches them; and inside a group the order among peers does
 * not matter.  A rank that fails on its own (a bad block, a failed read or
 * device copy) stops using bytes but goes on sending and receiving to the
 * end, so no other rank waits for it.  Only a failed CUDA or NCCL call on
 * the staging path stops a rank early (as any NCCL failure, it may leave
 * the others waiting), and a failure that every rank sees alike (another
 * checkpoint, too many reads) stops all of them before the next call.
 *
 * Memory: the staging buffer and a host buffer of the round's bytes this
 * rank handles (at most GROUP_ROUND), plus the plan reads being assembled
 * (regions come in file order, so only those that straddle a round).
 */
#ifdef CKPT_HAVE_CUDA

#define GROUP_REGION     (4u << 20)  /* ra_assign max_region: on the CRC grid */
#define GROUP_ROUND      (16u << 20) /* bytes of regions per round */
#define GROUP_MAX_RANGES (1u << 20)  /* reads one rank may announce */
_Static_assert(GROUP_REGION % LAYOUT_CRC_BLOCK == 0 && GROUP_ROUND >= GROUP_REGION,
	       "regions on the CRC grid, one at least per round");

/* What every rank sends first.  The ranks of one job run one build on one
 * architecture, so host byte order is the wire order. */
struct ghdr {
	uint64_t n_ranges;
	uint64_t fingerprint;
};

struct grange {
	uint64_t file, begin, end;
};

struct gctx {
	struct ckpt_load *ld;
	const struct nccl *nc;
	const struct cudart *rt;
	ncclComm_t comm;
	cudaStream_t st;
	char *dev;             /* device buffer: exchange, then staging */
	size_t dev_len;
	char *host;            /* the round's bytes this rank handles */
	struct ra_plan *plan;
	const struct ra_region *regs;
	size_t n_regs;
	uint8_t *mine;         /* per region: this rank wants it */
	uint32_t *peers;       /* g_size entries */
	char **rbuf;           /* per plan read: its bytes being assembled */
	uint64_t *rfill;       /* per plan read: bytes there */
	size_t lo;             /* plan reads before it are complete */
	struct lthread th;
	const struct manifest_chunk **chunks; /* g_image_ok's index */
	size_t n_chunks;
};

static bool load_failed(struct ckpt_load *ld)
{
	bool f;

	pthread_mutex_lock(&ld->lock);
	f = ld->err != 0;
	pthread_mutex_unlock(&ld->lock);
	return f;
}

static int g_cuda(struct gctx *g, cudaError_t e, const char *what)
{
	char msg[512];

	cudart_errmsg(g->rt, e, msg, sizeof(msg), "%s", what);
	fail(g->ld, cudart_errno(e), "loading across the group (rank %u): %s", g->ld->g_rank, msg);
	return cudart_errno(e);
}

static int g_nccl(struct gctx *g, ncclResult_t e, const char *what)
{
	char msg[512];

	nccl_errmsg(g->nc, e, msg, sizeof(msg), "%s", what);
	fail(g->ld, nccl_errno(e), "loading across the group (rank %u): %s", g->ld->g_rank, msg);
	return nccl_errno(e);
}

/* A device buffer of at least len bytes (its old bytes are not kept). */
static int g_dev(struct gctx *g, size_t len)
{
	ncclResult_t e;

	if (len <= g->dev_len)
		return 0;
	if (g->dev)
		g->nc->MemFree(g->dev);
	g->dev = NULL;
	g->dev_len = 0;
	e = g->nc->MemAlloc((void **)&g->dev, len);
	if (e != ncclSuccess)
		return g_nccl(g, e, "ncclMemAlloc");
	g->dev_len = len;
	return 0;
}

static int g_copy(struct gctx *g, void *dst, const void *src, size_t len, enum cudaMemcpyKind k)
{
	cudaError_t e = g->rt->MemcpyAsync(dst, src, len, k, g->st);

	return e == cudaSuccess ? 0 : g_cuda(g, e, k == cudaMemcpyHostToDevice ?
					     "cudaMemcpyAsync to the staging buffer" :
					     "cudaMemcpyAsync from the staging buffer");
}

static int g_sync(struct gctx *g)
{
	cudaError_t e = g->rt->StreamSynchronize(g->st);

	return e == cudaSuccess ? 0 : g_cuda(g, e, "cudaStreamSynchronize of the group's stream");
}

/* All-gather of len bytes from every rank: src (host) -> out (host,
 * g_size * len), through the device buffer. */
static int g_allgather(struct gctx *g, const void *src, void *out, size_t len)
{
	size_t n = g->ld->g_size;
	ncclResult_t e;
	int r;

	r = g_dev(g, (n + 1) * len);
	if (r == 0)
		r = g_copy(g, g->dev, src, len, cudaMemcpyHostToDevice);
	if (r)
		return r;
	e = g->nc->AllGather(g->dev, g->dev + len, len, ncclUint8, g->comm, g->st);
	if (e != ncclSuccess)
		return g_nccl(g, e, "ncclAllGather of the ranks' reads");
	r = g_copy(g, out, g->dev + len, n * len, cudaMemcpyDeviceToHost);
	return r ? r : g_sync(g);
}

/* The same on every rank that loads the same checkpoint, whatever its
 * path there: the attempt that committed it and its files. */
static uint64_t fingerprint(const struct manifest *m)
{
	uint32_t c = crc32c(m->attempt, strlen(m->attempt), 0);

	for (size_t i = 0; i < m->n_files; i++) {
		c = crc32c(m->files[i].path, strlen(m->files[i].path) + 1, c);
		c = crc32c(&m->files[i].size, sizeof(m->files[i].size), c);
	}
	return (uint64_t)c << 32 | (uint32_t)m->n_files;
}

/* Steps 1 and 2: what every rank reads, then the readers.  A failure that
 * depends only on the exchanged bytes is the same on every rank. */
static int g_assign(struct gctx *g)
{
	struct ckpt_load *ld = g->ld;
	const struct manifest *m = &ld->rd->m;
	const struct plan *p = ld->plan;
	size_t n = ld->g_size, max = 0, len;
	struct ghdr me = { .n_ranges = p->n_reads, .fingerprint = fingerprint(m) }, *hdrs;
	struct grange *mine = NULL, *all = NULL;
	struct ra_range *ranges = NULL;
	struct ra_request *reqs = NULL;
	char err[256];
	int r;

	hdrs = calloc(n, sizeof(*hdrs));
	if (!hdrs)
		goto nomem;
	r = g_allgather(g, &me, hdrs, sizeof(me));
	if (r)
		goto out;
	for (size_t k = 0; k < n; k++) {
		if (hdrs[k].fingerprint != me.fingerprint) {
			fail(ld, -EINVAL, "loading across the group: rank %zu loads another checkpoint "
			     "than rank %u (%s)", k, ld->g_rank, ld->rd->path);
			r = -EINVAL;
			goto out;
		}
		if (hdrs[k].n_ranges > GROUP_MAX_RANGES) {
			fail(ld, -E2BIG, "loading across the group: rank %zu needs %llu reads, more "
			     "than %u", k, (unsigned long long)hdrs[k].n_ranges, GROUP_MAX_RANGES);
			r = -E2BIG;
			goto out;
		}
		if (hdrs[k].n_ranges > max)
			max = (size_t)hdrs[k].n_ranges;
	}
	r = 0;
	if (max == 0)
		goto out; /* nobody wants a byte */
	len = max * sizeof(struct grange);
	mine = calloc(max, sizeof(*mine));
	all = malloc(n * len);
	ranges = malloc(n * max * sizeof(*ranges));
	reqs = calloc(n, sizeof(*reqs));
	if (!mine || !all || !ranges || !reqs)
		goto nomem;
	for (size_t i = 0; i < p->n_reads; i++)
		mine[i] = (struct grange){ p->reads[i].file, p->reads[i].begin, p->reads[i].end };
	r = g_allgather(g, mine, all, len);
	if (r)
		goto out;
	for (size_t k = 0; k < n; k++) {
		reqs[k] = (struct ra_request){ .rank = (uint32_t)k, .ranges = ranges + k * max,
					       .n_ranges = (size_t)hdrs[k].n_ranges };
		for (size_t i = 0; i < reqs[k].n_ranges; i++) {
			const struct grange *a = &all[k * max + i];

			if (a->file >= m->n_files || a->begin > a->end ||
			    a->end > m->files[a->file].size) {
				fail(ld, -EPROTO, "loading across the group: rank %zu asks for bytes "
				     "[%llu, %llu) of file %llu, which the checkpoint does not have",
				     k, (unsigned long long)a->begin, (unsigned long long)a->end,
				     (unsigned long long)a->file);
				r = -EPROTO;
				goto out;
			}
			ranges[k * max + i] = (struct ra_range){ (uint32_t)a->file, a->begin, a->end };
		}
	}
	r = ra_assign(reqs, n, GROUP_REGION, &g->plan, err, sizeof(err));
	if (r)
		fail(ld, r, "loading across the group: assigning readers: %s", err);
	goto out;
nomem:
	fail(ld, -ENOMEM, "loading across the group: out of memory");
	r = -ENOMEM;
out:
	free(hdrs);
	free(mine);
	free(all);
	free(ranges);
	free(reqs);
	return r;
}

/* Whether this rank handles region j: reads it, or receives it. */
static bool g_mine(const struct gctx *g, size_t j)
{
	return g->mine[j] != 0;
}

/* Whether region j goes through the staging buffer on this rank. */
static bool g_staged(const struct gctx *g, size_t j)
{
	return g->regs[j].n_wanting > 1 && g_mine(g, j);
}

/* The round that starts at region j0 ends before the returned region: at
 * most GROUP_ROUND bytes of regions (every region is at most GROUP_REGION),
 * the same on every rank. */
static size_t g_round_end(const struct gctx *g, size_t j0)
{
	uint64_t sum = 0;
	size_t j = j0;

	while (j < g->n_regs && sum + (g->regs[j].end - g->regs[j].begin) <= GROUP_ROUND) {
		sum += g->regs[j].end - g->regs[j].begin;
		j++;
	}
	return j > j0 ? j : j0 + 1;
}

/* Step 4: region bytes [b, e) of `file` at src go into the plan reads they
 * overlap; a read that is complete is verified and served, unless the load
 * failed already (then its bytes are dropped unused). */
static void g_deliver(struct gctx *g, uint32_t file, uint64_t b, uint64_t e, const char *src)
{
	struct ckpt_load *ld = g->ld;
	const struct plan *p = ld->plan;

	for (size_t i = g->lo; i < p->n_reads; i++) {
		const struct plan_read *rd = &p->reads[i];
		uint64_t len = rd->end - rd->begin, ob, oe;

		if (rd->file > file || (rd->file == file && rd->begin >= e))
			break;
		if (rd->file < file || rd->end <= b || g->rfill[i] == len)
			continue;
		ob = b > rd->begin ? b : rd->begin;
		oe = e < rd->end ? e : rd->end;
		if (!g->rbuf[i]) {
			g->rbuf[i] = malloc((size_t)len);
			if (!g->rbuf[i]) {
				fail(ld, -ENOMEM, "out of memory for a %llu-byte read buffer",
				     (unsigned long long)len);
				g->rfill[i] = len; /* dropped */
				continue;
			}
		}
		memcpy(g->rbuf[i] + (ob - rd->begin), src + (ob - b), (size_t)(oe - ob));
		g->rfill[i] += oe - ob;
		if (g->rfill[i] == len) {
			if (!load_failed(ld))
				(void)serve_bounce(ld, rd, &g->th, g->rbuf[i]);
			free(g->rbuf[i]);
			g->rbuf[i] = NULL;
		}
	}
	while (g->lo < p->n_reads && g->rfill[g->lo] == p->reads[g->lo].end - p->reads[g->lo].begin)
		g->lo++;
}

static int gchunk_cmp(const void *a, const void *b)
{
	const struct manifest_chunk *x = *(const struct manifest_chunk *const *)a;
	const struct manifest_chunk *y = *(const struct manifest_chunk *const *)b;

	return x->file != y->file ? (x->file < y->file ? -1 : 1) :
	       x->begin != y->begin ? (x->begin < y->begin ? -1 : 1) : 0;
}

/* Every chunk of the manifest, by file then offset (g_image_ok); made on
 * first use.  Returns false if out of memory. */
static bool g_chunks_ready(struct gctx *g)
{
	const struct manifest *m = &g->ld->rd->m;
	size_t n = 0;

	if (g->chunks)
		return true;
	for (size_t i = 0; i < m->n_items; i++)
		n += m->items[i].n_chunks;
	g->chunks = malloc((n ? n : 1) * sizeof(*g->chunks));
	if (!g->chunks)
		return false;
	/* Not the empty ones: they share an offset with their neighbour,
	 * and would break the order the search needs. */
	for (size_t i = 0; i < m->n_items; i++)
		for (size_t k = 0; k < m->items[i].n_chunks; k++)
			if (m->items[i].chunks[k].end > m->items[i].chunks[k].begin)
				g->chunks[g->n_chunks++] = &m->items[i].chunks[k];
	qsort(g->chunks, g->n_chunks, sizeof(*g->chunks), gchunk_cmp);
	return true;
}

/* True if every CRC piece of `file` that [off, off + len) touches matches
 * the manifest, its bytes inside the region taken from buf (the region
 * as copied: what is sent is what was checked, even if the image changed
 * meanwhile) and the rest from the image (whole pieces: the image holds the
 * whole file, whichever region a rank reads). */
static bool g_image_ok(struct gctx *g, uint32_t file, uint64_t off, uint64_t len,
		       const char *buf)
{
	const char *map = g->ld->imgs[file].map;
	size_t lo = 0, hi;

	if (!g_chunks_ready(g))
		return false;
	/* The first chunk of the file that ends after off. */
	hi = g->n_chunks;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct manifest_chunk *c = g->chunks[mid];
		if (c->file < file || (c->file == file && c->end <= off))
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; i < g->n_chunks; i++) {
		const struct manifest_chunk *c = g->chunks[i];
		uint64_t pos;

		if (c->file != file || c->begin >= off + len)
			break;
		pos = off > c->begin ? off / LAYOUT_CRC_BLOCK * LAYOUT_CRC_BLOCK : c->begin;
		if (pos < c->begin)
			pos = c->begin;
		while (pos < c->end && pos < off + len) {
			uint64_t grid = (pos / LAYOUT_CRC_BLOCK + 1) * LAYOUT_CRC_BLOCK;
			uint64_t stop = grid < c->end ? grid : c->end;

			uint64_t in0 = pos > off ? pos : off;
			uint64_t in1 = stop < off + len ? stop : off + len;
			uint32_t crc = 0;

			if (pos < in0)
				crc = crc32c(map + pos, (size_t)(in0 - pos), crc);
			crc = crc32c(buf + (in0 - off), (size_t)(in1 - in0), crc);
			if (in1 < stop)
				crc = crc32c(map + in1, (size_t)(stop - in1), crc);
			if (crc != c->crcs[pos / LAYOUT_CRC_BLOCK - c->begin / LAYOUT_CRC_BLOCK])
				return false;
			pos = stop;
		}
	}
	return true;
}

/*
 * A region's bytes, from ckptd's image of the file (or the node's copy of
 * an S3 shard) when the load has a usable one, else from storage.  The
 * image's bytes are checked here first, against every CRC piece the region
 * touches: the regions of a group load do not follow the plan's reads, so
 * the quiet check of image_read does not apply, and a bad image must cost
 * a read from storage, not the load of every rank that wanted the bytes.
 * Every rank that uses the bytes checks them again when its read is
 * complete (g_deliver), whoever read them.
 */
static int g_read(struct gctx *g, const struct plan_read *at, uint64_t off, uint64_t len,
		  char *buf)
{
	struct ckpt_load *ld = g->ld;
	struct limage *im = &ld->imgs[at->file];

	/* Spill copies are disk files: regions of group loads are read from
	 * S3 (their checks would need whole pieces read from the copy). */
	if (image_use(ld, at->file) && !im->spill) {
		memcpy(buf, im->map + off, (size_t)len);
		if (g_image_ok(g, at->file, off, len, buf)) {
			atomic_fetch_add_explicit(&ld->bytes_resident, len, memory_order_relaxed);
			return 0;
		}
		if (!atomic_exchange(&im->bad, true))
			cli_log(CKPT_LOG_WARNING, "%s of %s/%s does not match the manifest in "
				"[%llu, %llu): reading the file from storage instead",
				"ckptd's in-memory copy", ld->rd->path, ld->rd->m.files[at->file].path,
				(unsigned long long)off, (unsigned long long)(off + len));
		if (image_fallback(ld, at) < 0)
			return -EBADMSG;
	}
	return read_bytes(ld, at, off, len, buf);
}

/* Step 3: the rounds. */
static int g_transfer(struct gctx *g)
{
	struct ckpt_load *ld = g->ld;
	const struct plan *p = ld->plan;
	uint32_t me = ld->g_rank;
	struct ra_rank rk;
	size_t host_len = 0, dev_len = 0;
	int r;

	g->n_regs = ra_plan_regions(g->plan, &g->regs);
	g->mine = calloc(g->n_regs ? g->n_regs : 1, 1);
	g->peers = malloc(ld->g_size * sizeof(*g->peers));
	g->rbuf = calloc(p->n_reads ? p->n_reads : 1, sizeof(*g->rbuf));
	g->rfill = calloc(p->n_reads ? p->n_reads : 1, sizeof(*g->rfill));
	if (!g->mine || !g->peers || !g->rbuf || !g->rfill) {
		fail(ld, -ENOMEM, "loading across the group: out of memory");
		return -ENOMEM;
	}
	if (ra_plan_rank(g->plan, me, &rk) == 0)
		for (size_t s = 0; s < rk.n_spans; s++)
			memset(g->mine + rk.spans[s].first, 1, rk.spans[s].count);
	for (size_t j0 = 0, j1; j0 < g->n_regs; j0 = j1) {
		size_t h = 0, d = 0;

		j1 = g_round_end(g, j0);
		for (size_t j = j0; j < j1; j++) {
			size_t len = (size_t)(g->regs[j].end - g->regs[j].begin);
			h += g_mine(g, j) ? len : 0;
			d += g_staged(g, j) ? len : 0;
		}
		host_len = h > host_len ? h : host_len;
		dev_len = d > dev_len ? d : dev_len;
	}
	/* The staging buffer mirrors the host buffer's offsets (regions only
	 * this rank wants leave holes in it): simpler than a second layout. */
	r = g_dev(g, dev_len ? host_len : 0);
	if (r)
		return r;
	g->host = malloc(host_len ? host_len : 1);
	if (!g->host) {
		fail(ld, -ENOMEM, "loading across the group: out of memory for %zu bytes", host_len);
		return -ENOMEM;
	}
	for (size_t j0 = 0, j1; j0 < g->n_regs; j0 = j1) {
		size_t off, n_recv = 0;
		ncclResult_t e = ncclSuccess;

		j1 = g_round_end(g, j0);
		/* Reads, and what others want of them up to the device.  The
		 * host buffer and the staging buffer hold this rank's regions
		 * of the round at the same offsets. */
		off = 0;
		for (size_t j = j0; j < j1; j++) {
			const struct ra_region *rg = &g->regs[j];
			uint64_t len = rg->end - rg->begin;
			struct plan_read at = { .file = rg->file };

			if (!g_mine(g, j))
				continue;
			if (rg->reader == me) {
				/* A failed read is recorded (fail) and its zeros
				 * sent: receivers reject them by their CRCs. */
				if (g_read(g, &at, rg->begin, len, g->host + off))
					memset(g->host + off, 0, (size_t)len);
				atomic_fetch_add_explicit(&ld->g_bytes_read, len, memory_order_relaxed);
				atomic_fetch_add_explicit(&ld->g_reads, 1, memory_order_relaxed);
				if (g_staged(g, j)) {
					r = g_copy(g, g->dev + off, g->host + off, (size_t)len,
						   cudaMemcpyHostToDevice);
					if (r)
						return r;
				}
			}
			off += (size_t)len;
		}
		/* One group per round on every rank, even an empty one (see
		 * "Deadlock freedom"). */
		e = g->nc->GroupStart();
		if (e != ncclSuccess)
			return g_nccl(g, e, "ncclGroupStart");
		off = 0;
		for (size_t j = j0; j < j1 && e == ncclSuccess; j++) {
			const struct ra_region *rg = &g->regs[j];
			size_t len = (size_t)(rg->end - rg->begin);
			int n;

			if (!g_mine(g, j))
				continue;
			if (rg->n_wanting > 1 && rg->reader == me) {
				n = ra_plan_wanting(g->plan, (uint32_t)j, g->peers, ld->g_size);
				for (int k = 0; k < n && e == ncclSuccess; k++)
					if (g->peers[k] != me)
						e = g->nc->Send(g->dev + off, len, ncclUint8,
								(int)g->peers[k], g->comm, g->st);
			} else if (rg->n_wanting > 1) {
				e = g->nc->Recv(g->dev + off, len, ncclUint8, (int)rg->reader, g->comm,
						g->st);
				n_recv++;
			}
			off += len;
		}
		if (e != ncclSuccess) {
			(void)g->nc->GroupEnd();
			return g_nccl(g, e, "ncclSend/ncclRecv of a round");
		}
		e = g->nc->GroupEnd();
		if (e != ncclSuccess)
			return g_nccl(g, e, "ncclGroupEnd of a round's sends and receives");
		/* What came in, back to host memory: it is checked there. */
		off = 0;
		for (size_t j = j0; j < j1 && n_recv; j++) {
			const struct ra_region *rg = &g->regs[j];
			size_t len = (size_t)(rg->end - rg->begin);

			if (!g_mine(g, j))
				continue;
			if (rg->reader != me) {
				r = g_copy(g, g->host + off, g->dev + off, len, cudaMemcpyDeviceToHost);
				if (r)
					return r;
			}
			off += len;
		}
		/* Also before the next round's reads overwrite the host buffer
		 * that this round's H2D copies read. */
		r = g_sync(g);
		if (r)
			return r;
		off = 0;
		for (size_t j = j0; j < j1; j++) {
			const struct ra_region *rg = &g->regs[j];

			if (!g_mine(g, j))
				continue;
			g_deliver(g, rg->file, rg->begin, rg->end, g->host + off);
			off += (size_t)(rg->end - rg->begin);
		}
	}
	if (g->lo != p->n_reads && !load_failed(ld))
		fail(ld, -EIO, "internal error: loading across the group: read %zu of %zu got "
		     "%llu of its %llu bytes", g->lo, p->n_reads,
		     (unsigned long long)g->rfill[g->lo],
		     (unsigned long long)(p->reads[g->lo].end - p->reads[g->lo].begin));
	return 0;
}

static void *group_thread(void *arg)
{
	struct ckpt_load *ld = arg;
	struct gctx g = { .ld = ld, .nc = ld->g_nccl, .rt = ld->g_rt,
			  .comm = (ncclComm_t)ld->group.nccl_comm,
			  .st = (cudaStream_t)ld->group.cuda_stream, .th = { .owned = true } };
	cudaError_t e;

	if (ld->arena) {
		/* Only the stage is used: reads are assembled in g.rbuf. */
		g.th.buf = ld->arena;
		g.th.cap = ld->bounce_bytes;
		g.th.stage = ld->stage_bytes ? ld->arena + ld->bounce_bytes : NULL;
		g.th.owned = false;
	}
	/* The device of the communicator, current on this thread for the
	 * staging buffer and the calls on its stream. */
	e = ld->g_rt->SetDevice(ld->group.device_index);
	if (e != cudaSuccess)
		g_cuda(&g, e, "cudaSetDevice");
	else if (g_assign(&g) == 0 && g.plan)
		(void)g_transfer(&g);
	if (g.dev)
		g.nc->MemFree(g.dev);
	free(g.host);
	if (g.rbuf)
		for (size_t i = 0; i < ld->plan->n_reads; i++)
			free(g.rbuf[i]);
	free(g.rbuf);
	free(g.rfill);
	free(g.mine);
	free(g.peers);
	free(g.chunks);
	ra_plan_free(g.plan);
	load_thread_exit(ld);
	return NULL;
}

#endif /* CKPT_HAVE_CUDA */

int ckpt_load_set_group(struct ckpt_load *load, const struct ckpt_load_group *group)
{
	static const char fn[] = "ckpt_load_set_group";
	struct ckpt_load_group gr;
	uint32_t size;

	if (!load || !group) {
		cli_set_error("%s: NULL argument", fn);
		return -EINVAL;
	}
	if (!building(load, fn))
		return -EBUSY;
	memcpy(&size, group, sizeof(size));
	if (size < sizeof(gr)) {
		cli_set_error("%s: size %u is below sizeof(struct ckpt_load_group) (use "
			      "CKPT_LOAD_GROUP_INIT)", fn, size);
		return -EINVAL;
	}
	if (size > ABI_MAX_STRUCT) {
		cli_set_error("%s: size %u is larger than %u", fn, size, ABI_MAX_STRUCT);
		return -E2BIG;
	}
	for (size_t i = sizeof(gr); i < size; i++)
		if (((const unsigned char *)group)[i]) {
			cli_set_error("%s: the struct has a field this libckpt does not know, "
				      "set (byte %zu)", fn, i);
			return -E2BIG;
		}
	memcpy(&gr, group, sizeof(gr));
	if (gr.reserved || gr.reserved2) {
		cli_set_error("%s: reserved fields are not 0", fn);
		return -EINVAL;
	}
	if (!gr.nccl_comm || gr.device_index < 0) {
		cli_set_error("%s: no communicator, or a negative device_index", fn);
		return -EINVAL;
	}
#ifdef CKPT_HAVE_CUDA
	{
		const struct nccl *nc;
		const struct cudart *rt;
		char err[512];
		int count = 0, rank = -1;
		ncclResult_t e;

		nc = nccl_get(err, sizeof(err));
		rt = nc ? cudart_get(err, sizeof(err)) : NULL;
		if (!nc || !rt) {
			cli_set_error("%s: %s", fn, err);
			return -ENODEV;
		}
		e = nc->CommCount((ncclComm_t)gr.nccl_comm, &count);
		if (e == ncclSuccess)
			e = nc->CommUserRank((ncclComm_t)gr.nccl_comm, &rank);
		if (e != ncclSuccess) {
			nccl_errmsg(nc, e, err, sizeof(err), "ncclCommCount/ncclCommUserRank");
			cli_set_error("%s: %s", fn, err);
			return nccl_errno(e);
		}
		if (count < 1 || rank < 0 || rank >= count || (unsigned)count > RA_MAX_RANKS) {
			cli_set_error("%s: the communicator says rank %d of %d", fn, rank, count);
			return -EINVAL;
		}
		load->group = gr;
		load->g_nccl = nc;
		load->g_rt = rt;
		load->g_rank = (uint32_t)rank;
		load->g_size = (uint32_t)count;
		load->grouped = true;
		return 0;
	}
#else
	cli_set_error("%s: loads across a group need CUDA, which this build does not include "
		      "(built with CUDA=0 or without the toolkit's headers)", fn);
	return -EOPNOTSUPP;
#endif
}

int ckpt_load_set_client(struct ckpt_load *load, struct ckpt_client *client)
{
	if (!load || !client) {
		cli_set_error("ckpt_load_set_client: NULL argument");
		return -EINVAL;
	}
	if (!building(load, "ckpt_load_set_client"))
		return -EBUSY;
	load->client = client;
	return 0;
}

static void drop_images(struct ckpt_load *load)
{
	if (!load->imgs)
		return;
	for (size_t i = 0; i < load->rd->m.n_files; i++) {
		if (load->imgs[i].map)
			munmap((void *)load->imgs[i].map, (size_t)load->imgs[i].len);
		if (load->imgs[i].spill)
			close(load->imgs[i].sfd);
	}
	free(load->imgs);
	load->imgs = NULL;
}

/* An S3 location in the one spelling the daemon takes (proto.h). */
static int s3_canon(const char *url, char *buf, size_t len)
{
	struct s3_loc loc;
	char e[256];

	if (s3_url_parse(url, &loc, e, sizeof(e)) < 0 || s3_url_format(&loc, buf, len) < 0)
		return -EINVAL;
	return 0;
}

/* Lends the daemon the files the plan reads that no image serves
 * (do_daemon).  A file that cannot be lent is read here instead. */
static void lend_files(struct ckpt_load *load)
{
	const struct manifest *m = &load->rd->m;
	char canon[PROTO_LOAD_URL_LEN + 64] = "";

	if (load->rd->s3 && s3_canon(load->rd->path, canon, sizeof(canon)) < 0)
		return;
	load->lhandles = malloc((m->n_files ? m->n_files : 1) * sizeof(*load->lhandles));
	load->s3_skip = calloc(m->n_files ? m->n_files : 1, sizeof(*load->s3_skip));
	if (!load->lhandles || !load->s3_skip) {
		free(load->lhandles);
		free(load->s3_skip);
		load->lhandles = NULL;
		load->s3_skip = NULL;
		return;
	}
	for (size_t f = 0; f < m->n_files; f++)
		load->lhandles[f] = LOAD_NO_HANDLE;
	for (size_t i = 0; i < load->plan->n_reads; i++) {
		uint32_t f = load->plan->reads[i].file, h;
		struct stat st;
		int fd, r;

		if (load->lhandles[f] != LOAD_NO_HANDLE || load->imgs[f].map || load->imgs[f].spill)
			continue;
		if (load->rd->s3) {
			/* Read by the daemon with ranged GETs into the arena;
			 * a daemon without S3 or this root refuses the reads,
			 * and the library GETs the file itself (do_daemon). */
			r = cli_load_lend_object(load->client, canon, m->files[f].path,
						 m->files[f].size, &h);
			if (r == 0)
				load->lhandles[f] = h;
			continue;
		}
		/* Our own descriptor: the daemon turns on O_DIRECT in it,
		 * which the reader's (buffered preads) must not get. */
		fd = openat(load->rd->dirfd, m->files[f].path,
			    O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
		if (fd < 0)
			continue; /* the reader's open says why, if it fails too */
		r = fstat(fd, &st) < 0 ? -errno : S_ISREG(st.st_mode) ? 0 : -EINVAL;
		if (r == 0)
			r = cli_load_lend(load->client, fd, &h);
		close(fd);
		if (r == 0)
			load->lhandles[f] = h;
		else
			cli_log(CKPT_LOG_WARNING, "%s/%s: reading it without ckptd: %s",
				load->rd->path, m->files[f].path, strerror(-r));
	}
}

static void unlend_files(struct ckpt_load *load)
{
	if (!load->lhandles)
		return;
	for (size_t f = 0; f < load->rd->m.n_files; f++)
		if (load->lhandles[f] != LOAD_NO_HANDLE)
			cli_load_unlend(load->client, load->lhandles[f]);
	free(load->lhandles);
	free(load->s3_skip);
	load->lhandles = NULL;
	load->s3_skip = NULL;
}

/* True if fd is this user's own directory (dir) or regular file, which no
 * one else may write. */
static bool own_file(int fd, bool dir)
{
	struct stat st;

	return fstat(fd, &st) == 0 && st.st_uid == geteuid() && !(st.st_mode & 022) &&
	       (dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
}

/*
 * An S3 checkpoint's shards that this node saved through the spill tier
 * wait in its cache (store/spill.c): <spill_dir>/<uid>/cache/<the first 16
 * hex digits of the root's hash>/<name>/, with source.json naming the
 * root, name and attempt they belong to.  The directory is the user's own
 * (mode 0700): the library opens the files itself, with its own rights,
 * maps them and reads them as it reads images -- every block checked
 * against the manifest it took from S3, a file that does not match read
 * from S3 instead.  Any doubt (another attempt, another size) leaves the
 * file to S3.
 */
static void attach_spill(struct ckpt_load *load, const char *canon)
{
	const struct manifest *m = &load->rd->m;
	const char *slash = strrchr(canon, '/');
	char root[PATH_MAX], dir[PATH_MAX], hash[STORE_ID_LEN + 1];
	char *text;
	size_t text_len;
	json_t *j;
	bool ok;
	int dfd;

	if (!slash || (size_t)(slash - canon) >= sizeof(root))
		return;
	memcpy(root, canon, (size_t)(slash - canon));
	root[slash - canon] = '\0';
	store_hash_hex(root, strlen(root), hash);
	hash[16] = '\0';
	if ((size_t)snprintf(dir, sizeof(dir), "%s/%u/cache/%s/%s", load->client->spill_dir,
			     (unsigned)geteuid(), hash, slash + 1) >= sizeof(dir))
		return;
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return;
	/* The path came from the daemon, but the files are the user's own:
	 * in a mount namespace where another user could write there, they
	 * would not be. */
	if (!own_file(dfd, true)) {
		close(dfd);
		return;
	}
	/* The directory is the user's own and no one else may write in it
	 * (checked above): so is what it holds. */
	if (fs_read_file_at(dfd, "source.json", 64 << 10, &text, &text_len) < 0)
		text = NULL;
	j = text ? json_loads(text, 0, NULL) : NULL;
	ok = j && json_is_string(json_object_get(j, "root")) &&
	     json_is_string(json_object_get(j, "name")) &&
	     json_is_string(json_object_get(j, "attempt")) &&
	     strcmp(json_string_value(json_object_get(j, "root")), root) == 0 &&
	     strcmp(json_string_value(json_object_get(j, "name")), slash + 1) == 0 &&
	     strcmp(json_string_value(json_object_get(j, "attempt")), m->attempt) == 0;
	json_decref(j);
	free(text);
	for (size_t i = 0; ok && i < load->plan->n_reads; i++) {
		uint32_t f = load->plan->reads[i].file;
		const struct manifest_file *mf = &m->files[f];
		struct stat st;
		int fd;

		if (load->imgs[f].map || load->imgs[f].spill || load->imgs[f].len == UINT64_MAX ||
		    mf->size == 0)
			continue;
		/* A FIFO must not block the open. */
		fd = openat(dfd, mf->path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		if (fd < 0 || !own_file(fd, false) || fstat(fd, &st) < 0 ||
		    (uint64_t)st.st_size != mf->size) {
			if (fd >= 0)
				close(fd);
			load->imgs[f].len = UINT64_MAX; /* looked at once */
			continue;
		}
		(void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
		load->imgs[f].sfd = fd;
		load->imgs[f].len = mf->size;
		load->imgs[f].spill = true;
		cli_log(CKPT_LOG_DEBUG, "%s/%s: read from this node's copy in %s", load->rd->path,
			mf->path, dir);
	}
	close(dfd);
}

/* Maps the daemon's images of the files the plan reads, where it has them
 * (ckpt_load_set_client).  Anything short of a usable image leaves the file
 * to storage: the image is an accelerator, never the only way. */
static void attach_images(struct ckpt_load *load)
{
	const struct manifest *m = &load->rd->m;
	char canon[PATH_MAX], where[STORE_ID_LEN + 1];

	if (!m->attempt[0])
		return; /* a checkpoint no ckptd committed */
	/* The checkpoint's path as the daemon spells it (proto.h). */
	if (load->rd->s3) {
		if (s3_canon(load->rd->path, canon, sizeof(canon)) < 0)
			return;
	} else if (!realpath(load->rd->path, canon)) {
		return;
	}
	store_hash_hex(canon, strlen(canon), where);
	for (size_t i = 0; i < load->plan->n_reads; i++) {
		uint32_t f = load->plan->reads[i].file;
		const struct manifest_file *mf = &m->files[f];
		uint64_t size = 0;
		struct stat st;
		void *map;
		int fd, r;

		if (load->imgs[f].map || load->imgs[f].len == UINT64_MAX || mf->size == 0 ||
		    mf->size > SIZE_MAX)
			continue;
		load->imgs[f].len = UINT64_MAX; /* asked once */
		r = cli_resident_get(load->client, m->attempt, where, mf->rank, 10000, &fd, &size);
		if (r < 0) {
			if (r != -ENOENT)
				cli_log(CKPT_LOG_WARNING, "no resident image of %s/%s: %s",
					load->rd->path, mf->path, strerror(-r));
			continue;
		}
		if (size != mf->size || fstat(fd, &st) < 0 || (uint64_t)st.st_size < mf->size) {
			cli_log(CKPT_LOG_WARNING, "ckptd's image of %s/%s has %llu bytes, the "
				"manifest says %llu: reading storage", load->rd->path, mf->path,
				(unsigned long long)size, (unsigned long long)mf->size);
			close(fd);
			continue;
		}
		/* Not MAP_POPULATE: populating 2 GiB of page tables here takes
		 * ~130 ms on this thread alone, where the load threads' faults
		 * spread over every CPU (measured: slower in all). */
		map = mmap(NULL, (size_t)mf->size, PROT_READ, MAP_SHARED, fd, 0);
		close(fd);
		if (map == MAP_FAILED) {
			cli_log(CKPT_LOG_WARNING, "cannot map ckptd's image of %s/%s: %s",
				load->rd->path, mf->path, strerror(errno));
			continue;
		}
		load->imgs[f].map = map;
		load->imgs[f].len = mf->size;
		cli_log(CKPT_LOG_DEBUG, "%s/%s: read from ckptd's memory", load->rd->path,
			mf->path);
	}
	for (size_t f = 0; f < m->n_files; f++)
		if (!load->imgs[f].map)
			load->imgs[f].len = 0;
	if (load->rd->s3 && load->client->spill_dir[0])
		attach_spill(load, canon);
	for (size_t f = 0; f < m->n_files; f++)
		if (!load->imgs[f].map && !load->imgs[f].spill)
			load->imgs[f].len = 0;
}

int ckpt_load_start(struct ckpt_load *load, struct ckpt_future **ret_done)
{
	static const char fn[] = "ckpt_load_start";
	struct ckpt_reader *rd;
	struct plan_want *wants = NULL;
	char err[512] = "";
	unsigned n_threads;
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
	/* Reads through the daemon must fit half the client's arena
	 * (do_daemon), widened to the O_DIRECT grid at both ends. */
	struct plan_opts po = { 0 };
	if (load->client && load->client->slots.n_slots >= 2) {
		uint64_t room = (uint64_t)(load->client->slots.n_slots / 2) *
				load->client->slot_bytes;
		if (room > 2 * PROTO_LOAD_ALIGN + LAYOUT_CRC_BLOCK)
			po.max_read = room - 2 * PROTO_LOAD_ALIGN;
		if (po.max_read > LOAD_DAEMON_READ)
			po.max_read = LOAD_DAEMON_READ;
	}
	r = plan_build(rd->plan_ix, wants, load->n_dsts, &po, &load->plan, err, sizeof(err));
	free(wants);
	if (r) {
		cli_set_error("%s: %s", fn, err[0] ? err : strerror(-r));
		return r;
	}
	/* Open the files on this thread: the reader is not shared with the
	 * load's threads beyond these descriptors. */
	load->fds = malloc((rd->m.n_files ? rd->m.n_files : 1) * sizeof(int));
	if (!load->fds) {
		r = -ENOMEM;
		snprintf(err, sizeof(err), "out of memory");
		goto out_unplan;
	}
	for (size_t i = 0; i < rd->m.n_files; i++)
		load->fds[i] = -1;
	load->imgs = calloc(rd->m.n_files ? rd->m.n_files : 1, sizeof(*load->imgs));
	if (!load->imgs) {
		r = -ENOMEM;
		snprintf(err, sizeof(err), "out of memory");
		goto out_unplan;
	}
	if (load->client)
		attach_images(load);
	/* Reads through the daemon want an arena with room for two. */
	if (load->client && load->client->slots.n_slots >= 2)
		lend_files(load);
	if (!rd->s3) {
		for (size_t i = 0; i < load->plan->n_reads; i++) {
			uint32_t f = load->plan->reads[i].file;
			if (load->fds[f] >= 0 || load->imgs[f].open_err)
				continue;
			if (load->imgs[f].map) {
				/* Storage is the image's fallback (image_read); a
				 * file gone from storage is what images are for. */
				r = cli_reader_fd(rd, f, err, sizeof(err));
				if (r < 0)
					load->imgs[f].open_err = r;
				else
					load->fds[f] = r;
				err[0] = '\0';
				continue;
			}
			r = cli_reader_fd(rd, f, err, sizeof(err));
			if (r < 0)
				goto out_unplan;
			load->fds[f] = r;
		}
	}
	n_threads = load->lhandles ? LOAD_DAEMON_THREADS : LOAD_THREADS;
	if (load->plan->n_reads < n_threads)
		n_threads = (unsigned)load->plan->n_reads;
	/* A group load is collective: its one thread takes part even when
	 * this rank wants nothing. */
	if (load->grouped)
		n_threads = 1;
	if (load->n_device_dsts && n_threads) {
		r = cuda_start(load, n_threads, err, sizeof(err));
		if (r < 0)
			goto out_unplan;
	}
	load->state = LOAD_RUNNING;
	*ret_done = &load->done;
	if (load->plan->n_reads == 0 && !load->grouped) {
		future_complete(&load->done, 0, "");
		return 0;
	}
	/* Every thread is counted before the first starts, so the count
	 * cannot reach 0 (and the future complete) while threads are still
	 * being made.  A thread that cannot be made is uncounted; fewer
	 * threads do the same work, and none at all fails the load. */
	pthread_mutex_lock(&load->lock);
	load->running = n_threads;
	pthread_mutex_unlock(&load->lock);
	for (unsigned i = 0; i < n_threads; i++) {
		void *(*run)(void *) = load_thread;

#ifdef CKPT_HAVE_CUDA
		if (load->grouped)
			run = group_thread;
#endif
		r = pthread_create(&load->threads[i], NULL, run, load);
		if (r) {
			pthread_mutex_lock(&load->lock);
			load->running -= n_threads - i;
			bool none = load->running == 0;
			if (i == 0 && !load->err) {
				load->err = -r;
				snprintf(load->errmsg, sizeof(load->errmsg),
					 "cannot start a load thread: %s", strerror(r));
			}
			pthread_mutex_unlock(&load->lock);
			if (none)
				future_complete(&load->done, load->err, load->errmsg);
			break;
		}
		load->n_threads++;
	}
	return 0;
out_unplan:
	/* Still BUILDING: a later start plans again. */
	cli_set_error("%s: %s", fn, err);
	free(load->fds);
	load->fds = NULL;
	unlend_files(load);
	drop_images(load);
	plan_free(load->plan);
	load->plan = NULL;
	return r;
nomem:
	cli_set_error("%s: out of memory", fn);
	return -ENOMEM;
}

int ckpt_load_stats(const struct ckpt_load *load, struct ckpt_load_stats *ret_stats)
{
	struct ckpt_load_stats s = { CKPT_LOAD_STATS_INIT };

	size_t n;

	/* The first 0.5 builds had the struct without the resident fields. */
	if (!load || !ret_stats ||
	    ret_stats->size < offsetof(struct ckpt_load_stats, bytes_resident)) {
		cli_set_error("ckpt_load_stats: NULL argument or size below "
			      "sizeof(struct ckpt_load_stats)");
		return -EINVAL;
	}
	n = ret_stats->size < sizeof(s) ? ret_stats->size : sizeof(s);
	s.size = (uint32_t)n;
	s.bytes_resident = atomic_load(&load->bytes_resident);
	s.bytes_daemon = atomic_load(&load->bytes_daemon);
	s.bytes_shared = atomic_load(&load->bytes_shared);
	s.bytes_local = atomic_load(&load->bytes_local);
	for (size_t f = 0; load->imgs && f < load->rd->m.n_files; f++)
		if ((load->imgs[f].map || load->imgs[f].spill) && !atomic_load(&load->imgs[f].bad)) {
			if (load->imgs[f].spill)
				s.files_local++;
			else
				s.files_resident++;
		}
	s.missing = load->missing;
	if (load->plan) {
		s.bytes_wanted = load->plan->bytes_wanted;
		s.bytes_read = load->plan->bytes_read;
		s.reads = load->plan->n_reads;
	}
	if (load->grouped) {
		/* What this rank read from storage; the rest came from peers. */
		s.bytes_read = atomic_load(&load->g_bytes_read);
		s.reads = atomic_load(&load->g_reads);
	}
	memcpy(ret_stats, &s, n);
	return 0;
}

void ckpt_load_free(struct ckpt_load *load)
{
	if (!load)
		return;
	for (unsigned i = 0; i < load->n_threads; i++)
		pthread_join(load->threads[i], NULL);
	/* Unpins the arena, so before it is unmapped. */
	cli_cuda_load_close(load->cuda);
	if (load->arena)
		munmap(load->arena, load->arena_len);
	plan_free(load->plan);
	free(load->fds);
	unlend_files(load);
	drop_images(load);
	free(load->dims);
	free(load->dsts);
	free(load->added);
	future_destroy(&load->done);
	pthread_mutex_destroy(&load->lock);
	free(load);
}
