/* SPDX-License-Identifier: MIT */
/*
 * check_load_cuda.c - integration: loading checkpoints into CUDA device
 * memory (ckpt_load_* with CKPT_DEVICE_CUDA boxes), against the fake CUDA
 * runtime of tests/fakes/ (these machines have no GPU).
 *
 * Checkpoints are saved through a real ckptd by rank processes, then loaded
 * (loads need no daemon) into "device memory" of the fake: memory its
 * cudaMalloc handed out, on the device that was current, which only its
 * H2D copies may write.  Every box is read back through the fake (a D2H
 * copy) and compared byte for byte with the saved pattern; padding around
 * strided boxes must still hold PAD.  The fake counts its cudaMemcpyAsync
 * calls, which shows how a copy went: one H2D per contiguous destination,
 * one per contiguous run of a strided one.  Then the refusals at add time,
 * a corrupt block, and failed copies.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "ckpt.h"
#include "tests/lib/testd.h"

#define MiB (1024ull * 1024ull)
#define WAIT_MS 60000
#define PAD 0xA5
#define MAX_RANKS 4
#define MAX_DEFS 4

/* ---- saving: each rank holds one part of each tensor ------------------------ */

/* A tensor of the checkpoint: its bytes are td_fill_chunk's pattern of
 * `seed`; rank r of `world` saves part r of a cut along dimension `cut`. */
struct tdef {
	const char *name;
	enum ckpt_dtype dt;
	unsigned ndim;
	uint64_t shape[3];
	unsigned cut;
	uint64_t seed;
};

#define BLOB_LEN(rank) (1000u + 17u * (rank))
#define BLOB_SEED(rank) (9000u + (rank))

struct save_args {
	const char *sock, *root, *name;
	const struct tdef *defs;
	unsigned n_defs;
	uint32_t rank, world;
};

static void part_box(const struct tdef *d, unsigned parts, unsigned p, uint64_t *offs,
		     uint64_t *shape)
{
	for (unsigned k = 0; k < d->ndim; k++) {
		offs[k] = 0;
		shape[k] = d->shape[k];
	}
	if (d->ndim == 0 || parts <= 1)
		return;
	offs[d->cut] = d->shape[d->cut] * p / parts;
	shape[d->cut] = d->shape[d->cut] * (p + 1) / parts - offs[d->cut];
}

/* A rank process (no ck_assert here: it reports, the parent asserts). */
static int save_rank(void *arg, int rep, int go)
{
	const struct save_args *a = arg;
	struct ckpt_client *c = NULL;
	struct ckpt_save *sv = NULL;
	char msg[512];
	void *bufs[MAX_DEFS + 1] = { 0 };
	uint64_t offs[MAX_DEFS][3], shape[MAX_DEFS][3];
	char key[32];
	int rc, st, cm;

	(void)go;
	rc = td_connect_rc(a->sock, "loadcuda", a->rank, a->world, 16 * MiB, &c);
	if (rc < 0) {
		td_report(rep, "connect %d: %s", rc, ckpt_last_error());
		return 11;
	}
	rc = ckpt_save_begin(c, a->root, a->name, 1, &sv);
	if (rc < 0) {
		td_report(rep, "begin %d: %s", rc, ckpt_last_error());
		return 12;
	}
	for (unsigned i = 0; i < a->n_defs; i++) {
		const struct tdef *d = &a->defs[i];
		size_t es = ckpt_dtype_size(d->dt);

		part_box(d, a->world, a->rank, offs[i], shape[i]);
		bufs[i] = malloc(td_nbytes(es, d->ndim, shape[i]) + 1);
		if (!bufs[i])
			return 10;
		td_fill_chunk(bufs[i], es, d->ndim, d->shape, offs[i], shape[i], d->seed);
		struct ckpt_tensor tn = { CKPT_TENSOR_INIT, .name = d->name, .dtype = d->dt,
					  .ndim = d->ndim, .shape = shape[i], .data = bufs[i],
					  .global_shape = d->ndim ? d->shape : NULL,
					  .offsets = d->ndim ? offs[i] : NULL };
		if (!d->ndim) /* a scalar: rank 0 writes it, the others are replicas */
			tn.replica = a->rank;
		rc = ckpt_save_add_tensor(sv, &tn);
		if (rc < 0) {
			td_report(rep, "add %s %d: %s", d->name, rc, ckpt_last_error());
			return 13;
		}
	}
	bufs[MAX_DEFS] = malloc(BLOB_LEN(a->rank));
	if (!bufs[MAX_DEFS])
		return 10;
	td_fill(bufs[MAX_DEFS], BLOB_LEN(a->rank), BLOB_SEED(a->rank), 0);
	snprintf(key, sizeof(key), "loader/dp-%u", a->rank);
	rc = ckpt_save_add_blob(sv, key, bufs[MAX_DEFS], BLOB_LEN(a->rank));
	if (rc < 0) {
		td_report(rep, "blob %d: %s", rc, ckpt_last_error());
		return 13;
	}
	rc = td_commit_wait(sv, WAIT_MS, &st, &cm, msg, sizeof(msg));
	if (rc < 0) {
		td_report(rep, "commit %d: %s", rc, msg);
		return 14;
	}
	td_report(rep, "committed %d %s", cm, msg);
	ckpt_save_free(sv);
	ckpt_disconnect(c);
	for (unsigned i = 0; i <= MAX_DEFS; i++)
		free(bufs[i]);
	return st == 0 && cm == 0 ? 0 : 1;
}

/* Saves checkpoint `name` of defs from `world` rank processes, and
 * returns its path in path.  Before the test loads the fake runtime: the
 * ranks are forked. */
static void save_ckpt(struct testd *t, const char *name, const struct tdef *defs,
		      unsigned n_defs, uint32_t world, char *path, size_t len)
{
	struct td_child ch[MAX_RANKS];
	struct save_args a[MAX_RANKS];

	ck_assert_uint_le(world, MAX_RANKS);
	ck_assert_uint_le(n_defs, MAX_DEFS);
	for (uint32_t r = 0; r < world; r++) {
		a[r] = (struct save_args){ .sock = td_sock(t, 0), .root = t->root, .name = name,
					   .defs = defs, .n_defs = n_defs, .rank = r,
					   .world = world };
		ck_assert_int_eq(td_child_start(&ch[r], save_rank, &a[r]), 0);
	}
	for (uint32_t r = 0; r < world; r++) {
		int st = td_child_wait(&ch[r], 90000);
		ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
			      "rank %u: %s; it said:\n%s", r, td_status_str(st), ch[r].out);
	}
	td_path(path, len, "%s/%s", t->root, name);
}

#ifdef CKPT_HAVE_CUDA
#include "cuda/cudart.h"
#include "tests/fakes/fake_cudart.h"

/* ---- the fake runtime, shared with libckpt ----------------------------------- */

struct fake {
	cudaError_t (*malloc_)(void **, size_t);
	cudaError_t (*free_)(void *);
	cudaError_t (*set_device)(int);
	cudaError_t (*get_device)(int *);
	cudaError_t (*memcpy_async)(void *, const void *, size_t, enum cudaMemcpyKind,
				    cudaStream_t);
	cudaError_t (*stream_sync)(cudaStream_t);
	__typeof__(fake_cuda_fail) *fail_at;
	__typeof__(fake_cuda_stat) *stat;
};

/* Loads the fake through the path libckpt will load ($CKPT_CUDART), so that
 * the test and the library share one instance. */
static struct fake fake_load(void)
{
	static char path[TD_PATH];
	struct fake f;
	void *dl;

	td_path(path, sizeof(path), "%s/tests/libfakecudart.so", td_build_dir());
	setenv("CKPT_CUDART", path, 1);
	dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(dl, "%s", dlerror());
#define SYM(field, name) ck_assert_ptr_nonnull(*(void **)&f.field = dlsym(dl, name))
	SYM(malloc_, "cudaMalloc");
	SYM(free_, "cudaFree");
	SYM(set_device, "cudaSetDevice");
	SYM(get_device, "cudaGetDevice");
	SYM(memcpy_async, "cudaMemcpyAsync");
	SYM(stream_sync, "cudaStreamSynchronize");
	SYM(fail_at, "fake_cuda_fail");
	SYM(stat, "fake_cuda_stat");
#undef SYM
	return f;
}

/* Host <-> fake device, through the fake's own copies (the legacy stream). */
static void dev_write(const struct fake *f, void *dev, const void *src, size_t len)
{
	ck_assert_int_eq(f->memcpy_async(dev, src, len, cudaMemcpyHostToDevice, NULL), cudaSuccess);
	ck_assert_int_eq(f->stream_sync(NULL), cudaSuccess);
}

static void dev_read(const struct fake *f, void *dst, const void *dev, size_t len)
{
	ck_assert_int_eq(f->memcpy_async(dst, dev, len, cudaMemcpyDeviceToHost, NULL), cudaSuccess);
	ck_assert_int_eq(f->stream_sync(NULL), cudaSuccess);
}

/* ---- destination boxes in device or host memory ------------------------------ */

struct box {
	uint64_t offs[3], shape[3];
	int64_t strides[3];   /* elements */
	bool strided;         /* strides given to the load (else row-major) */
	int dev;              /* CUDA device, or -1: host memory */
	uint8_t *mem;         /* the whole allocation */
	size_t mem_len;
	uint64_t at;          /* bytes from mem to element [0,..,0] */
};

static struct box box_of(int dev, unsigned ndim, const uint64_t *offs, const uint64_t *shape)
{
	struct box b = { .dev = dev };

	for (unsigned k = 0; k < ndim; k++) {
		b.offs[k] = offs[k];
		b.shape[k] = shape[k];
	}
	return b;
}

/* Allocates len bytes on b's device (or host) and fills them with PAD. */
static void box_mem(const struct fake *f, struct box *b, size_t len)
{
	uint8_t *pad = malloc(len);

	ck_assert_ptr_nonnull(pad);
	memset(pad, PAD, len);
	b->mem_len = len;
	if (b->dev < 0) {
		b->mem = pad;
		return;
	}
	ck_assert_int_eq(f->set_device(b->dev), cudaSuccess);
	ck_assert_int_eq(f->malloc_((void **)&b->mem, len), cudaSuccess);
	dev_write(f, b->mem, pad, len);
	free(pad);
}

/* Row-major over shape + pad, the box `lead` elements into each dimension
 * (pad NULL: contiguous, no strides given). */
static void box_alloc(const struct fake *f, struct box *b, unsigned ndim, size_t es,
		      const uint64_t *pad, const uint64_t *lead)
{
	uint64_t len = 1;

	for (unsigned k = ndim; k-- > 0;) {
		b->strides[k] = (int64_t)len;
		len *= b->shape[k] + (pad ? pad[k] : 0);
	}
	b->strided = pad != NULL;
	b->at = 0;
	for (unsigned k = 0; k < ndim; k++)
		b->at += (lead ? lead[k] : 0) * (uint64_t)b->strides[k] * es;
	box_mem(f, b, (size_t)(len * es) + es); /* one element of slack after it */
}

/* Any element strides (>= 0), the box at the start. */
static void box_alloc_strides(const struct fake *f, struct box *b, unsigned ndim, size_t es,
			      const int64_t *strides)
{
	uint64_t far = 1;

	for (unsigned k = 0; k < ndim; k++) {
		b->strides[k] = strides[k];
		far += (b->shape[k] - 1) * (uint64_t)strides[k];
	}
	b->strided = true;
	b->at = 0;
	box_mem(f, b, (size_t)(far * es) + es);
}

static struct ckpt_load_dst box_dst(const struct box *b, unsigned ndim)
{
	return (struct ckpt_load_dst){ CKPT_LOAD_DST_INIT,
				       .device = b->dev >= 0 ? CKPT_DEVICE_CUDA : CKPT_DEVICE_HOST,
				       .device_index = b->dev >= 0 ? b->dev : 0,
				       .offsets = ndim ? b->offs : NULL,
				       .shape = ndim ? b->shape : NULL,
				       .strides = b->strided ? b->strides : NULL,
				       .data = b->mem + b->at };
}

/* Reads b back (through the fake for device memory) and compares the box
 * with the pattern of d, and every byte outside it with PAD. */
static void box_verify(const struct fake *f, const struct box *b, const struct tdef *d)
{
	size_t es = ckpt_dtype_size(d->dt);
	uint64_t n = 1, idx[3] = { 0 };
	uint8_t *mem = malloc(b->mem_len), *seen = calloc(b->mem_len, 1), *want;

	for (unsigned k = 0; k < d->ndim; k++)
		n *= b->shape[k];
	want = malloc(n * es + 1);
	ck_assert_ptr_nonnull(mem);
	ck_assert_ptr_nonnull(seen);
	ck_assert_ptr_nonnull(want);
	if (b->dev >= 0)
		dev_read(f, mem, b->mem, b->mem_len);
	else
		memcpy(mem, b->mem, b->mem_len);
	td_fill_chunk(want, es, d->ndim, d->shape, b->offs, b->shape, d->seed);
	for (uint64_t e = 0; e < n; e++) {
		uint64_t off = b->at;

		for (unsigned k = 0; k < d->ndim; k++)
			off += idx[k] * (uint64_t)b->strides[k] * es;
		if (memcmp(mem + off, want + e * es, es))
			ck_abort_msg("'%s' on device %d: element %llu of the box differs", d->name,
				     b->dev, (unsigned long long)e);
		memset(seen + off, 1, es);
		for (unsigned k = d->ndim; k-- > 0;) {
			if (++idx[k] < b->shape[k])
				break;
			idx[k] = 0;
		}
	}
	for (size_t i = 0; i < b->mem_len; i++)
		if (!seen[i] && mem[i] != PAD)
			ck_abort_msg("'%s' on device %d: byte %zu outside the box was written",
				     d->name, b->dev, i);
	free(mem);
	free(seen);
	free(want);
}

static void box_free(const struct fake *f, struct box *b)
{
	if (b->dev >= 0)
		ck_assert_int_eq(f->free_(b->mem), cudaSuccess);
	else
		free(b->mem);
	b->mem = NULL;
}

/* ---- loading ------------------------------------------------------------------ */

/* Adds tensor d with boxes b[0..nb); returns add_tensor's result. */
static int add_boxes(struct ckpt_load *ld, const struct tdef *d, const struct box *b,
		     unsigned nb)
{
	struct ckpt_load_dst dst[4];
	struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = d->dt, .name = d->name,
				       .global_shape = d->ndim ? d->shape : NULL,
				       .ndim = d->ndim, .n_dsts = nb, .dsts = dst };

	ck_assert_uint_le(nb, 4);
	for (unsigned k = 0; k < nb; k++)
		dst[k] = box_dst(&b[k], d->ndim);
	return ckpt_load_add_tensor(ld, &lt);
}

static void add_ok(struct ckpt_load *ld, const struct tdef *d, const struct box *b, unsigned nb)
{
	int rc = add_boxes(ld, d, b, nb);

	ck_assert_msg(rc == 0, "add '%s': %d %s", d->name, rc, ckpt_last_error());
}

/* Starts ld and waits: the future's result, its message in msg. */
static int run_load(struct ckpt_load *ld, char *msg, size_t len)
{
	struct ckpt_future *done;
	int rc = ckpt_load_start(ld, &done);

	ck_assert_msg(rc == 0, "start: %d %s", rc, ckpt_last_error());
	rc = td_future_wait(done, WAIT_MS);
	snprintf(msg, len, "%s", ckpt_future_error(done));
	return rc;
}

/* Nothing of a load's CUDA context is left once it is freed. */
static void assert_cuda_released(const struct fake *f)
{
	ck_assert_int_eq(f->stat("registered"), 0);
	ck_assert_int_eq(f->stat("streams"), 0);
	ck_assert_int_eq(f->stat("events"), 0);
}

static int warned;

static void on_log(enum ckpt_log_level level, const char *msg, void *ud)
{
	(void)ud;
	if (level == CKPT_LOG_WARNING && strstr(msg, "unpinned memory") &&
	    strstr(msg, "cudaErrorMemoryAllocation"))
		__atomic_add_fetch(&warned, 1, __ATOMIC_RELAXED);
}

/* ---- whole tensors ------------------------------------------------------------ */

static const struct tdef whole_defs[] = {
	{ "w", CKPT_F32, 2, { 512, 1024 }, 0, 77 },   /* 2 MiB: three CRC pieces */
	{ "v", CKPT_U8, 1, { 1000 }, 0, 78 },
	{ "s", CKPT_I64, 0, { 0 }, 0, 79 },
	{ "e", CKPT_BF16, 3, { 6, 40, 10 }, 0, 80 },
};
#define N_WHOLE (sizeof(whole_defs) / sizeof(whole_defs[0]))

/*
 * Each tensor whole into contiguous memory of device 0: one H2D each, from
 * the bounce buffers, pinned for the load (registered once, unregistered
 * at free).  _i = 1: pinning fails; the load warns once and copies from
 * pageable memory.  The caller's current device is left alone.
 */
START_TEST(test_whole)
{
	struct fake f = fake_load();
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct box b[N_WHOLE];
	char path[TD_PATH], msg[1024];
	int cur = -1;
	long copies;

	td_init(&t, _i ? "whole_unpinned" : "whole");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "whole", whole_defs, N_WHOLE, 1, path, sizeof(path));
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	for (unsigned i = 0; i < N_WHOLE; i++) {
		b[i] = box_of(0, whole_defs[i].ndim, (const uint64_t[3]){ 0 }, whole_defs[i].shape);
		box_alloc(&f, &b[i], whole_defs[i].ndim, ckpt_dtype_size(whole_defs[i].dt), NULL,
			  NULL);
		add_ok(ld, &whole_defs[i], &b[i], 1);
	}
	/* Checked at add time, but nothing pinned before start. */
	ck_assert_int_eq(f.stat("registered"), 0);
	if (_i) {
		f.fail_at("HostRegister", 1, cudaErrorMemoryAllocation, false);
		warned = 0;
		ckpt_set_log_fn(on_log, NULL);
	}
	ck_assert_int_eq(f.set_device(1), cudaSuccess);
	copies = f.stat("copies");
	ck_assert_msg(run_load(ld, msg, sizeof(msg)) == 0, "load: %s", msg);
	ck_assert_int_eq(f.stat("copies") - copies, (long)N_WHOLE);
	ck_assert_int_eq(f.get_device(&cur), cudaSuccess);
	ck_assert_int_eq(cur, 1);
	ck_assert_int_eq(f.stat("registered"), _i ? 0 : 1);
	if (_i) {
		ckpt_set_log_fn(NULL, NULL);
		ck_assert_msg(warned == 1, "%d warnings about unpinned memory", warned);
	}
	ckpt_load_free(ld);
	assert_cuda_released(&f);
	for (unsigned i = 0; i < N_WHOLE; i++) {
		box_verify(&f, &b[i], &whole_defs[i]);
		box_free(&f, &b[i]);
	}
	ckpt_reader_close(rd);
	td_fini(&t);
}
END_TEST

/* ---- another layout, two devices ---------------------------------------------- */

static const struct tdef shard_defs[] = {
	{ "w", CKPT_F32, 2, { 300, 2000 }, 0, 81 },   /* saved in row bands */
	{ "e", CKPT_BF16, 3, { 64, 48, 10 }, 1, 82 }, /* saved cut along dim 1 */
};

/*
 * Saved by 3 ranks (3 files: up to 3 load threads copy at once), loaded by
 * 2 "ranks" in another layout, each box on one of two devices:
 *   w: column halves [300, 1000] into contiguous device memory: each
 *      saved band's part is a strided region of the bounce buffer, packed
 *      into the stage and copied with one H2D (3 in all);
 *   e: halves along dim 0 [32, 48, 10]: each saved chunk's part is
 *      contiguous in the file but 32 runs of [16, 10] in the box: 32 H2Ds
 *      per chunk, from the bounce buffer.
 */
START_TEST(test_reshard)
{
	struct fake f = fake_load();
	struct testd t;
	struct ckpt_reader *rd;
	char path[TD_PATH], msg[1024];

	td_init(&t, "reshard");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "sharded", shard_defs, 2, 3, path, sizeof(path));
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	for (unsigned m = 0; m < 2; m++) {
		struct ckpt_load *ld;
		struct box bw, be;
		long copies;

		bw = box_of((int)m, 2, (const uint64_t[]){ 0, 1000 * m },
			    (const uint64_t[]){ 300, 1000 });
		box_alloc(&f, &bw, 2, 4, NULL, NULL);
		be = box_of(1 - (int)m, 3, (const uint64_t[]){ 32 * m, 0, 0 },
			    (const uint64_t[]){ 32, 48, 10 });
		box_alloc(&f, &be, 3, 2, NULL, NULL);
		ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
		add_ok(ld, &shard_defs[0], &bw, 1);
		add_ok(ld, &shard_defs[1], &be, 1);
		copies = f.stat("copies");
		ck_assert_msg(run_load(ld, msg, sizeof(msg)) == 0, "load rank %u: %s", m, msg);
		ck_assert_int_eq(f.stat("copies") - copies, 3 + 3 * 32);
		ckpt_load_free(ld);
		assert_cuda_released(&f);
		box_verify(&f, &bw, &shard_defs[0]);
		box_verify(&f, &be, &shard_defs[1]);
		box_free(&f, &bw);
		box_free(&f, &be);
	}
	ckpt_reader_close(rd);
	td_fini(&t);
}
END_TEST

/* ---- strided device destinations ---------------------------------------------- */

/*
 * Strided boxes, each copy one H2D per run contiguous in the destination,
 * and the padding between runs untouched:
 *   w rows [10, 200) x cols [100, 900) in a padded device 0 buffer: 190 rows;
 *   w rows [300, 304) x cols [0, 256) column-major (strides {1, 4}): every
 *     element its own run, 1024;
 *   v [100, 400) every third byte of a device 1 buffer: 300.
 */
START_TEST(test_strided)
{
	static const struct tdef defs[] = {
		{ "w", CKPT_F32, 2, { 512, 1024 }, 0, 83 },
		{ "v", CKPT_U8, 1, { 1000 }, 0, 84 },
	};
	struct fake f = fake_load();
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct box bw[2], bv;
	char path[TD_PATH], msg[1024];
	long copies;

	td_init(&t, "strided");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "strided", defs, 2, 1, path, sizeof(path));
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	bw[0] = box_of(0, 2, (const uint64_t[]){ 10, 100 }, (const uint64_t[]){ 190, 800 });
	box_alloc(&f, &bw[0], 2, 4, (const uint64_t[]){ 3, 50 }, (const uint64_t[]){ 1, 20 });
	bw[1] = box_of(0, 2, (const uint64_t[]){ 300, 0 }, (const uint64_t[]){ 4, 256 });
	box_alloc_strides(&f, &bw[1], 2, 4, (const int64_t[]){ 1, 4 });
	bv = box_of(1, 1, (const uint64_t[]){ 100 }, (const uint64_t[]){ 300 });
	box_alloc_strides(&f, &bv, 1, 1, (const int64_t[]){ 3 });

	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	add_ok(ld, &defs[0], bw, 2);
	add_ok(ld, &defs[1], &bv, 1);
	copies = f.stat("copies");
	ck_assert_msg(run_load(ld, msg, sizeof(msg)) == 0, "load: %s", msg);
	ck_assert_int_eq(f.stat("copies") - copies, 190 + 1024 + 300);
	ckpt_load_free(ld);
	assert_cuda_released(&f);
	box_verify(&f, &bw[0], &defs[0]);
	box_verify(&f, &bw[1], &defs[0]);
	box_verify(&f, &bv, &defs[1]);
	box_free(&f, &bw[0]);
	box_free(&f, &bw[1]);
	box_free(&f, &bv);
	ckpt_reader_close(rd);
	td_fini(&t);
}
END_TEST

/* ---- host and device boxes in one load ---------------------------------------- */

/*
 * Saved by 2 ranks.  One load: w's top half to device 0 and its bottom
 * half to a strided host buffer (the same tensor, the same reads), v whole
 * to device 1, e to host memory only, and rank 1's blob to host memory.
 */
START_TEST(test_mixed)
{
	static const struct tdef defs[] = {
		{ "w", CKPT_F32, 2, { 512, 1024 }, 0, 85 },
		{ "v", CKPT_U8, 1, { 3000 }, 0, 86 },
		{ "e", CKPT_I32, 2, { 40, 30 }, 1, 87 },
	};
	struct fake f = fake_load();
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct box bw[2], bv, be;
	uint8_t *blob = malloc(BLOB_LEN(1));
	char path[TD_PATH], msg[1024];

	ck_assert_ptr_nonnull(blob);
	td_init(&t, "mixed");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "mixed", defs, 3, 2, path, sizeof(path));
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	bw[0] = box_of(0, 2, (const uint64_t[]){ 0, 0 }, (const uint64_t[]){ 256, 1024 });
	box_alloc(&f, &bw[0], 2, 4, NULL, NULL);
	bw[1] = box_of(-1, 2, (const uint64_t[]){ 256, 0 }, (const uint64_t[]){ 256, 1024 });
	box_alloc(&f, &bw[1], 2, 4, (const uint64_t[]){ 2, 8 }, (const uint64_t[]){ 1, 3 });
	bv = box_of(1, 1, (const uint64_t[]){ 0 }, defs[1].shape);
	box_alloc(&f, &bv, 1, 1, NULL, NULL);
	be = box_of(-1, 2, (const uint64_t[]){ 0, 0 }, defs[2].shape);
	box_alloc(&f, &be, 2, 4, NULL, NULL);

	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	add_ok(ld, &defs[0], bw, 2);
	add_ok(ld, &defs[1], &bv, 1);
	add_ok(ld, &defs[2], &be, 1);
	ck_assert_int_eq(ckpt_load_add_blob(ld, "loader/dp-1", blob, BLOB_LEN(1)), 0);
	ck_assert_msg(run_load(ld, msg, sizeof(msg)) == 0, "load: %s", msg);
	ckpt_load_free(ld);
	assert_cuda_released(&f);
	box_verify(&f, &bw[0], &defs[0]);
	box_verify(&f, &bw[1], &defs[0]);
	box_verify(&f, &bv, &defs[1]);
	box_verify(&f, &be, &defs[2]);
	ck_assert_int_eq(td_check(blob, BLOB_LEN(1), BLOB_SEED(1), 0), -1);
	box_free(&f, &bw[0]);
	box_free(&f, &bw[1]);
	box_free(&f, &bv);
	box_free(&f, &be);
	free(blob);
	ckpt_reader_close(rd);
	td_fini(&t);
}
END_TEST

/* ---- refused at add time ------------------------------------------------------- */

static const struct tdef simple_defs[] = {
	{ "w", CKPT_F32, 2, { 512, 1024 }, 0, 77 },
};

enum refusal { HOST_PTR, BAD_INDEX, NEG_INDEX, OTHER_DEVICE, PAST_END, BAD_DEVICE, N_REFUSALS };

/*
 * A device box that cannot be right is refused when added, with a message
 * naming the tensor and the box, and the load then refuses to start with
 * the same errno.
 */
START_TEST(test_refused)
{
	static const struct {
		const char *what;
		int err;
		const char *says;
	} cases[N_REFUSALS] = {
		[HOST_PTR] = { "host memory given as device 0's", -EINVAL,
			       "is not CUDA device memory" },
		[BAD_INDEX] = { "device 5 of 2", -ENODEV, "CUDA device 5 does not exist" },
		[NEG_INDEX] = { "device -1", -ENODEV, "CUDA device -1 does not exist" },
		[OTHER_DEVICE] = { "device 1's memory given as device 0's", -EINVAL,
				   "device 1, not 0" },
		[PAST_END] = { "a box past its allocation", -EINVAL, "last byte" },
		[BAD_DEVICE] = { "device kind 7", -EINVAL, "unknown device 7" },
	};
	const size_t len = 512 * 1024 * 4;
	struct fake f = fake_load();
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct ckpt_future *done;
	struct ckpt_load_dst d = { CKPT_LOAD_DST_INIT, .device = CKPT_DEVICE_CUDA };
	struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_F32, .name = "w",
				       .global_shape = simple_defs[0].shape, .ndim = 2,
				       .n_dsts = 1, .dsts = &d };
	void *mem = NULL;
	char path[TD_PATH], name[32];
	int rc;

	snprintf(name, sizeof(name), "refused-%d", _i);
	td_init(&t, name);
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "refused", simple_defs, 1, 1, path, sizeof(path));
	switch ((enum refusal)_i) {
	case HOST_PTR:
	case BAD_DEVICE:
		mem = malloc(len);
		break;
	case BAD_INDEX:
	case NEG_INDEX:
		ck_assert_int_eq(f.malloc_(&mem, len), cudaSuccess);
		d.device_index = _i == BAD_INDEX ? 5 : -1;
		break;
	case OTHER_DEVICE:
		ck_assert_int_eq(f.set_device(1), cudaSuccess);
		ck_assert_int_eq(f.malloc_(&mem, len), cudaSuccess);
		break;
	case PAST_END:
		ck_assert_int_eq(f.malloc_(&mem, len - 4), cudaSuccess);
		break;
	default:
		ck_abort();
	}
	ck_assert_ptr_nonnull(mem);
	if (_i == BAD_DEVICE)
		d.device = (enum ckpt_device)7;
	d.data = mem;

	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	rc = ckpt_load_add_tensor(ld, &lt);
	ck_assert_msg(rc == cases[_i].err, "%s: add = %d, want %d: %s", cases[_i].what, rc,
		      cases[_i].err, ckpt_last_error());
	ck_assert_msg(strstr(ckpt_last_error(), cases[_i].says) && strstr(ckpt_last_error(), "'w'") &&
			      strstr(ckpt_last_error(), "box 0"),
		      "%s: %s", cases[_i].what, ckpt_last_error());
	ck_assert_int_eq(ckpt_load_start(ld, &done), cases[_i].err);
	ck_assert_msg(strstr(ckpt_last_error(), "incomplete") &&
			      strstr(ckpt_last_error(), cases[_i].says),
		      "%s", ckpt_last_error());
	ckpt_load_free(ld);
	assert_cuda_released(&f);
	ckpt_reader_close(rd);
	if (_i == HOST_PTR || _i == BAD_DEVICE)
		free(mem);
	else
		ck_assert_int_eq(f.free_(mem), cudaSuccess);
	td_fini(&t);
}
END_TEST

/* ---- failures while loading ------------------------------------------------------ */

/* A flipped byte in w's second CRC piece: the device load fails with the
 * CRC mismatch, naming the file, the tensor and the piece. */
START_TEST(test_crc_mismatch)
{
	struct fake f = fake_load();
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct box b;
	char path[TD_PATH], file[TD_PATH], msg[1024];
	FILE *fp;
	int ch;

	td_init(&t, "crc_mismatch");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "crc", simple_defs, 1, 1, path, sizeof(path));
	td_path(file, sizeof(file), "%s/rank-00000.safetensors", path);
	fp = fopen(file, "r+b");
	ck_assert_ptr_nonnull(fp);
	ck_assert_int_eq(fseek(fp, (long)(MiB + 12345), SEEK_SET), 0);
	ch = fgetc(fp);
	ck_assert_int_eq(fseek(fp, (long)(MiB + 12345), SEEK_SET), 0);
	fputc(ch ^ 0x10, fp);
	fclose(fp);

	b = box_of(0, 2, (const uint64_t[]){ 0, 0 }, simple_defs[0].shape);
	box_alloc(&f, &b, 2, 4, NULL, NULL);
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	add_ok(ld, &simple_defs[0], &b, 1);
	ck_assert_int_eq(run_load(ld, msg, sizeof(msg)), -EBADMSG);
	ck_assert_msg(strstr(msg, "CRC mismatch") && strstr(msg, "rank-00000.safetensors") &&
			      strstr(msg, "'w'") && strstr(msg, "offset 1048576"),
		      "%s", msg);
	ckpt_load_free(ld);
	assert_cuda_released(&f);
	box_free(&f, &b);
	ckpt_reader_close(rd);
	td_fini(&t);
}
END_TEST

/*
 * The second H2D copy fails, when queued (_i = 0) or, as a GPU reports an
 * illegal address, when it runs (_i = 1): the load fails with the CUDA
 * error, naming the tensor and the device, and saying the destination may
 * be partly written; the context is released all the same.
 */
START_TEST(test_copy_error)
{
	static const struct {
		bool async;
		cudaError_t err;
		const char *name;
	} cases[] = {
		{ false, cudaErrorLaunchFailure, "cudaErrorLaunchFailure" },
		{ true, cudaErrorIllegalAddress, "cudaErrorIllegalAddress" },
	};
	struct fake f = fake_load();
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct box b;
	char path[TD_PATH], msg[1024];
	int rc;

	td_init(&t, _i ? "copy_error_async" : "copy_error");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "copyerr", simple_defs, 1, 1, path, sizeof(path));
	/* 100 rows of a padded buffer on device 1: 100 H2Ds. */
	b = box_of(1, 2, (const uint64_t[]){ 0, 0 }, (const uint64_t[]){ 100, 1024 });
	box_alloc(&f, &b, 2, 4, (const uint64_t[]){ 0, 4 }, NULL);
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	add_ok(ld, &simple_defs[0], &b, 1);
	f.fail_at("MemcpyAsync", 2, cases[_i].err, cases[_i].async);
	rc = run_load(ld, msg, sizeof(msg));
	ck_assert_int_eq(rc, -EIO);
	ck_assert_msg(strstr(msg, "tensor 'w'") && strstr(msg, "CUDA device 1") &&
			      strstr(msg, cases[_i].name) && strstr(msg, "partly written"),
		      "%s", msg);
	ckpt_load_free(ld);
	assert_cuda_released(&f);
	box_free(&f, &b);
	ckpt_reader_close(rd);
	td_fini(&t);
}
END_TEST

/* ---- the real runtime, without a driver ---------------------------------------- */

START_TEST(test_real_runtime_no_driver)
{
	static const uint64_t shape[2] = { 512, 1024 };
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct ckpt_load_dst d = { CKPT_LOAD_DST_INIT, .device = CKPT_DEVICE_CUDA,
				   .data = (void *)0x1000 };
	struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_F32, .name = "w",
				       .global_shape = shape, .ndim = 2, .n_dsts = 1, .dsts = &d };
	const struct cudart *rt;
	char path[TD_PATH], err[512];
	int n = 0;

	unsetenv("CKPT_CUDART");
	rt = cudart_get(err, sizeof(err));
	if (!rt) {
		td_skip("load_real_runtime_no_driver", "no CUDA runtime in the loader's path: %s",
			err);
		return;
	}
	if (rt->GetDeviceCount(&n) == cudaSuccess && n > 0) {
		td_skip("load_real_runtime_no_driver", "a GPU is present: see tests/gpu/");
		return;
	}
	td_init(&t, "real_runtime_no_driver");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "nodriver", simple_defs, 1, 1, path, sizeof(path));
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), -ENODEV);
	ck_assert_msg(strstr(ckpt_last_error(), "cudaGetDeviceCount") &&
			      strstr(ckpt_last_error(), "'w'"),
		      "%s", ckpt_last_error());
	ckpt_load_free(ld);
	ckpt_reader_close(rd);
	td_fini(&t);
}
END_TEST

#else /* built without CUDA */

/* Without CUDA a device box is refused, saying why; host loads still work. */
START_TEST(test_no_cuda)
{
	static const struct tdef defs[] = { { "w", CKPT_F32, 2, { 512, 1024 }, 0, 77 } };
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct ckpt_future *done;
	float *w = malloc(512 * 1024 * 4);
	struct ckpt_load_dst d = { CKPT_LOAD_DST_INIT, .device = CKPT_DEVICE_CUDA, .data = w };
	struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_F32, .name = "w",
				       .global_shape = defs[0].shape, .ndim = 2, .n_dsts = 1,
				       .dsts = &d };
	char path[TD_PATH];

	ck_assert_ptr_nonnull(w);
	td_init(&t, "no_cuda");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "nocuda", defs, 1, 1, path, sizeof(path));
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), -EOPNOTSUPP);
	ck_assert_msg(strstr(ckpt_last_error(), "'w'") && strstr(ckpt_last_error(), "CUDA=0"),
		      "%s", ckpt_last_error());
	ck_assert_int_eq(ckpt_load_start(ld, &done), -EOPNOTSUPP);
	ckpt_load_free(ld);
	d.device = CKPT_DEVICE_HOST;
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
	ck_assert_int_eq(ckpt_load_start(ld, &done), 0);
	ck_assert_int_eq(td_future_wait(done, WAIT_MS), 0);
	ckpt_load_free(ld);
	{
		float *want = malloc(512 * 1024 * 4);
		const uint64_t zero[2] = { 0, 0 };

		ck_assert_ptr_nonnull(want);
		td_fill_chunk(want, 4, 2, defs[0].shape, zero, defs[0].shape, defs[0].seed);
		ck_assert_int_eq(memcmp(w, want, 512 * 1024 * 4), 0);
		free(want);
	}
	ckpt_reader_close(rd);
	free(w);
	td_fini(&t);
}
END_TEST

START_TEST(test_device_loads)
{
	td_skip("load_cuda", "libckpt was built without CUDA (CUDA=0 or no toolkit headers): "
		"loads into device memory are not checked");
}
END_TEST
#endif

int main(void)
{
	Suite *s = suite_create("load_cuda");

#ifndef CKPT_HAVE_CUDA
	td_case(s, "no_cuda", test_no_cuda, 60, 0, 1);
	td_case(s, "device_loads", test_device_loads, 30, 0, 1);
#else
	td_case(s, "whole", test_whole, 120, 0, 2);
	td_case(s, "reshard", test_reshard, 120, 0, 1);
	td_case(s, "strided", test_strided, 120, 0, 1);
	td_case(s, "mixed", test_mixed, 120, 0, 1);
	td_case(s, "refused", test_refused, 120, 0, N_REFUSALS);
	td_case(s, "crc_mismatch", test_crc_mismatch, 120, 0, 1);
	td_case(s, "copy_error", test_copy_error, 120, 0, 2);
	td_case(s, "real_runtime_no_driver", test_real_runtime_no_driver, 120, 0, 1);
#endif
	return td_main(s, "check_load_cuda");
}
