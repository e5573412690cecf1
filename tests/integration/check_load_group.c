/* SPDX-License-Identifier: MIT */
/*
 * check_load_group.c - integration: loads shared across a group of ranks
 * (ckpt_load_set_group), each byte read from storage once and sent to the
 * other ranks that want it, against the fake NCCL and the fake CUDA
 * runtime of tests/fakes/ (these machines have no GPU, nor a second one).
 *
 * A checkpoint is saved through a real ckptd by rank processes; then the
 * "ranks" of a load are threads of the test, each with its own reader,
 * load, communicator of one fake world and stream, loading into host
 * memory or fake device memory.  Checked: every destination byte against
 * the saved pattern; that the ranks together read from storage exactly
 * what one load of the union of their boxes reads (each byte once); the
 * bytes that went between ranks (the fake counts them); a corrupt block
 * failing every rank that wanted it, and no other; a rank that wants
 * nothing; the refusals of ckpt_load_set_group.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
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
#define MAX_RANKS 4
#define MAX_BOXES 4

/* ---- the checkpoint: saved by two ranks, each a half of w and e -------------- */

struct tdef {
	const char *name;
	enum ckpt_dtype dt;
	unsigned ndim;
	uint64_t shape[3];
	unsigned cut;
	uint64_t seed;
};

/* w is 32 MiB (several regions and rounds of the group's transfers); row
 * bands of 512 rows are 8 MiB. */
static const struct tdef defs[] = {
	{ "w", CKPT_F32, 2, { 2048, 4096 }, 0, 301 },
	{ "e", CKPT_BF16, 3, { 64, 48, 10 }, 1, 302 },
	{ "s", CKPT_I64, 0, { 0 }, 0, 303 },
};
#define N_DEFS (sizeof(defs) / sizeof(defs[0]))
#define SAVE_WORLD 2

struct save_args {
	const char *sock, *root, *name;
	uint32_t rank;
	uint32_t flags; /* ckpt_connect_opts.flags */
	const char *run; /* NULL: the library's default */
	uint64_t seed_add; /* other bytes than defs' */
};

#define JOB "loadgroup"

static int connect_run_rc(const char *sock, const char *run, uint32_t rank, uint32_t world,
			  uint32_t flags, struct ckpt_client **ret)
{
	struct ckpt_connect_opts o = { CKPT_CONNECT_OPTS_INIT, .socket_path = sock, .job = JOB,
				       .rank = rank, .world = world, .arena_bytes = 16 * MiB,
				       .flags = flags, .run = run };

	return ckpt_connect(&o, ret);
}

static int connect_rc(const char *sock, uint32_t rank, uint32_t world, uint32_t flags,
		      struct ckpt_client **ret)
{
	return connect_run_rc(sock, NULL, rank, world, flags, ret);
}

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

/* A saving rank process: reports, the parent asserts. */
static int save_rank(void *arg, int rep, int go)
{
	const struct save_args *a = arg;
	struct ckpt_client *c = NULL;
	struct ckpt_save *sv = NULL;
	char msg[512];
	void *bufs[N_DEFS] = { 0 };
	uint64_t offs[N_DEFS][3], shape[N_DEFS][3];
	int rc, st, cm;

	(void)go;
	rc = connect_run_rc(a->sock, a->run, a->rank, SAVE_WORLD, a->flags, &c);
	if (rc < 0) {
		td_report(rep, "connect %d: %s", rc, ckpt_last_error());
		return 11;
	}
	rc = ckpt_save_begin(c, a->root, a->name, 1, &sv);
	if (rc < 0) {
		td_report(rep, "begin %d: %s", rc, ckpt_last_error());
		return 12;
	}
	for (unsigned i = 0; i < N_DEFS; i++) {
		const struct tdef *d = &defs[i];
		size_t es = ckpt_dtype_size(d->dt);

		part_box(d, SAVE_WORLD, a->rank, offs[i], shape[i]);
		bufs[i] = malloc(td_nbytes(es, d->ndim, shape[i]) + 1);
		if (!bufs[i])
			return 10;
		td_fill_chunk(bufs[i], es, d->ndim, d->shape, offs[i], shape[i],
			      d->seed + a->seed_add);
		struct ckpt_tensor tn = { CKPT_TENSOR_INIT, .name = d->name, .dtype = d->dt,
					  .ndim = d->ndim, .shape = shape[i], .data = bufs[i],
					  .global_shape = d->ndim ? d->shape : NULL,
					  .offsets = d->ndim ? offs[i] : NULL };
		if (!d->ndim)
			tn.replica = a->rank; /* rank 0 writes the scalar */
		rc = ckpt_save_add_tensor(sv, &tn);
		if (rc < 0) {
			td_report(rep, "add %s %d: %s", d->name, rc, ckpt_last_error());
			return 13;
		}
	}
	rc = td_commit_wait(sv, WAIT_MS, &st, &cm, msg, sizeof(msg));
	if (rc < 0) {
		td_report(rep, "commit %d: %s", rc, msg);
		return 14;
	}
	td_report(rep, "committed %d %s", cm, msg);
	ckpt_save_free(sv);
	ckpt_disconnect(c);
	for (unsigned i = 0; i < N_DEFS; i++)
		free(bufs[i]);
	return st == 0 && cm == 0 ? 0 : 1;
}

/* Saves the checkpoint as <root>/<name>; its path into path.  Before the
 * test loads the fakes: the ranks are forked. */
static void save_ckpt_how(struct testd *t, int daemon, const char *run, uint64_t seed_add,
			  const char *name, uint32_t flags, char *path, size_t len)
{
	struct td_child ch[SAVE_WORLD];
	struct save_args a[SAVE_WORLD];

	for (uint32_t r = 0; r < SAVE_WORLD; r++) {
		a[r] = (struct save_args){ .sock = td_sock(t, daemon), .root = t->root,
					   .name = name, .rank = r, .flags = flags, .run = run,
					   .seed_add = seed_add };
		ck_assert_int_eq(td_child_start(&ch[r], save_rank, &a[r]), 0);
	}
	for (uint32_t r = 0; r < SAVE_WORLD; r++) {
		int st = td_child_wait(&ch[r], 90000);
		ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
			      "rank %u: %s; it said:\n%s", r, td_status_str(st), ch[r].out);
	}
	td_path(path, len, "%s/%s", t->root, name);
}

static void save_ckpt_flags(struct testd *t, const char *name, uint32_t flags, char *path,
			    size_t len)
{
	save_ckpt_how(t, 0, NULL, 0, name, flags, path, len);
}

static void save_ckpt(struct testd *t, const char *name, char *path, size_t len)
{
	save_ckpt_flags(t, name, 0, path, len);
}

#ifdef CKPT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tests/fakes/fake_nccl.h"

/* ---- the fakes, shared with libckpt ------------------------------------------ */

struct fakes {
	cudaError_t (*malloc_)(void **, size_t);
	cudaError_t (*free_)(void *);
	cudaError_t (*set_device)(int);
	cudaError_t (*memcpy_async)(void *, const void *, size_t, enum cudaMemcpyKind,
				    cudaStream_t);
	cudaError_t (*stream_sync)(cudaStream_t);
	cudaError_t (*stream_create)(cudaStream_t *, unsigned);
	cudaError_t (*stream_destroy)(cudaStream_t);
	__typeof__(fake_nccl_comm_create) *comm_create;
	__typeof__(fake_nccl_comm_destroy) *comm_destroy;
	__typeof__(fake_nccl_fail) *fail_at;
	__typeof__(fake_nccl_stat) *stat;
	__typeof__(fake_nccl_reset_stats) *reset;
};

/* Loads both fakes through the paths libckpt will load ($CKPT_CUDART,
 * $CKPT_NCCL_LIB), so that the test and the library share one instance of
 * each.  false if the fake NCCL was not built (no nccl.h here). */
static bool fakes_load(struct fakes *f)
{
	static char cudart[TD_PATH], nccl[TD_PATH];
	void *dc, *dn;

	td_path(cudart, sizeof(cudart), "%s/tests/libfakecudart.so", td_build_dir());
	td_path(nccl, sizeof(nccl), "%s/tests/libfakenccl.so", td_build_dir());
	if (!td_exists(nccl))
		return false;
	setenv("CKPT_CUDART", cudart, 1);
	setenv("CKPT_NCCL_LIB", nccl, 1);
	dc = dlopen(cudart, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(dc, "%s", dlerror());
	dn = dlopen(nccl, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(dn, "%s", dlerror());
#define SYM(dl, field, name) ck_assert_ptr_nonnull(*(void **)&f->field = dlsym(dl, name))
	SYM(dc, malloc_, "cudaMalloc");
	SYM(dc, free_, "cudaFree");
	SYM(dc, set_device, "cudaSetDevice");
	SYM(dc, memcpy_async, "cudaMemcpyAsync");
	SYM(dc, stream_sync, "cudaStreamSynchronize");
	SYM(dc, stream_create, "cudaStreamCreateWithFlags");
	SYM(dc, stream_destroy, "cudaStreamDestroy");
	SYM(dn, comm_create, "fake_nccl_comm_create");
	SYM(dn, comm_destroy, "fake_nccl_comm_destroy");
	SYM(dn, fail_at, "fake_nccl_fail");
	SYM(dn, stat, "fake_nccl_stat");
	SYM(dn, reset, "fake_nccl_reset_stats");
#undef SYM
	return true;
}

#define NEED_FAKES(f)                                                                      \
	do {                                                                               \
		if (!fakes_load(f)) {                                                      \
			td_skip("load_group", "no nccl.h was found at build time, so the " \
				"fake NCCL was not built");                                \
			return;                                                            \
		}                                                                          \
	} while (0)

/* ---- ranks as threads ---------------------------------------------------------- */

/* A destination: box offs/shape of defs[def], in host memory or on a fake
 * device, contiguous. */
struct rbox {
	unsigned def;
	uint64_t offs[3], shape[3];
	int dev;      /* -1: host */
	uint8_t *mem;
	size_t len;
};

struct rank_run {
	const struct fakes *f;
	const char *path;
	bool grouped;
	struct ncclComm *comm;
	struct ckpt_client *client; /* ckpt_load_set_client, or NULL */
	cudaStream_t stream;
	int dev;                  /* the communicator's device */
	struct rbox boxes[MAX_BOXES];
	unsigned n_boxes;
	/* outcome */
	int rc_setup;             /* first failed call before start, or 0 */
	char setup_msg[512];
	int rc;                   /* the done future */
	char msg[1024];
	struct ckpt_load_stats stats;
};

static void rank_fail(struct rank_run *r, int rc, const char *what)
{
	if (!r->rc_setup) {
		r->rc_setup = rc;
		snprintf(r->setup_msg, sizeof(r->setup_msg), "%s: %d %s", what, rc,
			 ckpt_last_error());
	}
}

/* A rank's thread: no ck_assert here (the main thread asserts). */
static void *rank_main(void *arg)
{
	struct rank_run *r = arg;
	struct ckpt_reader *rd = NULL;
	struct ckpt_load *ld = NULL;
	struct ckpt_future *done;
	int rc;

	r->stats = (struct ckpt_load_stats){ CKPT_LOAD_STATS_INIT };
	rc = ckpt_reader_open(r->path, &rd);
	if (rc < 0) {
		rank_fail(r, rc, "reader_open");
		return NULL;
	}
	rc = ckpt_load_begin(rd, 0, &ld);
	if (rc < 0) {
		rank_fail(r, rc, "load_begin");
		goto out;
	}
	for (unsigned i = 0; i < r->n_boxes; i++) {
		const struct rbox *b = &r->boxes[i];
		const struct tdef *d = &defs[b->def];
		struct ckpt_load_dst dst = { CKPT_LOAD_DST_INIT,
					     .device = b->dev >= 0 ? CKPT_DEVICE_CUDA :
								     CKPT_DEVICE_HOST,
					     .device_index = b->dev >= 0 ? b->dev : 0,
					     .offsets = d->ndim ? b->offs : NULL,
					     .shape = d->ndim ? b->shape : NULL, .data = b->mem };
		struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = d->dt,
					       .name = d->name, .ndim = d->ndim,
					       .global_shape = d->ndim ? d->shape : NULL,
					       .n_dsts = 1, .dsts = &dst };

		rc = ckpt_load_add_tensor(ld, &lt);
		if (rc < 0) {
			rank_fail(r, rc, "add_tensor");
			goto out;
		}
	}
	if (r->client) {
		rc = ckpt_load_set_client(ld, r->client);
		if (rc < 0) {
			rank_fail(r, rc, "set_client");
			goto out;
		}
	}
	if (r->grouped) {
		struct ckpt_load_group g = { CKPT_LOAD_GROUP_INIT, .nccl_comm = r->comm,
					     .cuda_stream = r->stream, .device_index = r->dev };
		rc = ckpt_load_set_group(ld, &g);
		if (rc < 0) {
			rank_fail(r, rc, "set_group");
			goto out;
		}
	}
	rc = ckpt_load_start(ld, &done);
	if (rc < 0) {
		rank_fail(r, rc, "start");
		goto out;
	}
	r->rc = td_future_wait(done, WAIT_MS);
	snprintf(r->msg, sizeof(r->msg), "%s", ckpt_future_error(done));
	rc = ckpt_load_stats(ld, &r->stats);
	if (rc < 0)
		rank_fail(r, rc, "stats");
out:
	ckpt_load_free(ld);
	ckpt_reader_close(rd);
	return NULL;
}

/* Runs n ranks at once, each on its own thread, all on one new world. */
static void run_ranks(const struct fakes *f, struct rank_run *r, unsigned n, bool grouped)
{
	struct ncclComm *comms[MAX_RANKS];
	pthread_t th[MAX_RANKS];

	ck_assert_uint_le(n, MAX_RANKS);
	ck_assert_int_eq(f->comm_create((int)n, comms), 0);
	for (unsigned k = 0; k < n; k++) {
		r[k].grouped = grouped;
		r[k].comm = comms[k];
		ck_assert_int_eq(f->set_device(r[k].dev), cudaSuccess);
		ck_assert_int_eq(f->stream_create(&r[k].stream, cudaStreamNonBlocking),
				 cudaSuccess);
	}
	for (unsigned k = 0; k < n; k++)
		ck_assert_int_eq(pthread_create(&th[k], NULL, rank_main, &r[k]), 0);
	for (unsigned k = 0; k < n; k++)
		ck_assert_int_eq(pthread_join(th[k], NULL), 0);
	for (unsigned k = 0; k < n; k++)
		ck_assert_int_eq(f->stream_destroy(r[k].stream), cudaSuccess);
	f->comm_destroy(comms, (int)n);
}

static void box_set(struct rbox *b, unsigned def, const uint64_t *offs, const uint64_t *shape,
		    int dev)
{
	const struct tdef *d = &defs[def];

	*b = (struct rbox){ .def = def, .dev = dev };
	for (unsigned k = 0; k < d->ndim; k++) {
		b->offs[k] = offs ? offs[k] : 0;
		b->shape[k] = shape ? shape[k] : d->shape[k];
	}
	b->len = (size_t)td_nbytes(ckpt_dtype_size(d->dt), d->ndim, b->shape);
}

/* Rows [r0, r0 + n) of w. */
static void box_rows(struct rbox *b, uint64_t r0, uint64_t n, int dev)
{
	box_set(b, 0, (const uint64_t[]){ r0, 0 }, (const uint64_t[]){ n, defs[0].shape[1] }, dev);
}

static void box_mem(const struct fakes *f, struct rbox *b)
{
	if (b->dev < 0) {
		b->mem = malloc(b->len);
		ck_assert_ptr_nonnull(b->mem);
		memset(b->mem, 0x5A, b->len);
		return;
	}
	ck_assert_int_eq(f->set_device(b->dev), cudaSuccess);
	ck_assert_int_eq(f->malloc_((void **)&b->mem, b->len), cudaSuccess);
}

/* The box holds exactly the saved bytes. */
static void box_verify(const struct fakes *f, const struct rbox *b, unsigned rank)
{
	const struct tdef *d = &defs[b->def];
	uint8_t *got = malloc(b->len), *want = malloc(b->len);

	ck_assert_ptr_nonnull(got);
	ck_assert_ptr_nonnull(want);
	if (b->dev >= 0) {
		ck_assert_int_eq(f->memcpy_async(got, b->mem, b->len, cudaMemcpyDeviceToHost, NULL),
				 cudaSuccess);
		ck_assert_int_eq(f->stream_sync(NULL), cudaSuccess);
	} else {
		memcpy(got, b->mem, b->len);
	}
	td_fill_chunk(want, ckpt_dtype_size(d->dt), d->ndim, d->shape, b->offs, b->shape, d->seed);
	for (size_t i = 0; i < b->len; i++)
		if (got[i] != want[i])
			ck_abort_msg("rank %u: '%s' box at row %llu: byte %zu of %zu differs", rank,
				     d->name, (unsigned long long)b->offs[0], i, b->len);
	free(got);
	free(want);
}

static void box_free(const struct fakes *f, struct rbox *b)
{
	if (b->dev >= 0)
		ck_assert_int_eq(f->free_(b->mem), cudaSuccess);
	else
		free(b->mem);
	b->mem = NULL;
}

static void ranks_free(const struct fakes *f, struct rank_run *r, unsigned n)
{
	for (unsigned k = 0; k < n; k++)
		for (unsigned i = 0; i < r[k].n_boxes; i++)
			box_free(f, &r[k].boxes[i]);
}

/* What one load without a group reads from storage for boxes b[0..n). */
static uint64_t solo_bytes_read(const struct fakes *f, const char *path, const struct rbox *b,
				unsigned n)
{
	struct rank_run r = { .f = f, .path = path, .n_boxes = n };

	for (unsigned i = 0; i < n; i++) {
		r.boxes[i] = b[i];
		r.boxes[i].dev = -1;
		box_mem(f, &r.boxes[i]);
	}
	rank_main(&r);
	ck_assert_msg(r.rc_setup == 0 && r.rc == 0, "solo load: %s %s", r.setup_msg, r.msg);
	for (unsigned i = 0; i < n; i++)
		box_verify(f, &r.boxes[i], 99);
	ranks_free(f, &r, 1);
	return r.stats.bytes_read;
}

/*
 * Each byte read once: the ranks together read from storage what one load
 * of the union of their boxes reads (`u`), and what each received from the
 * others (the fake counts the bytes) is what its own load would read minus
 * what it read.
 */
static void assert_read_once(const struct fakes *f, const char *path, const struct rank_run *r,
			     unsigned n, uint64_t u)
{
	uint64_t sum = 0, recv = 0;

	for (unsigned k = 0; k < n; k++) {
		uint64_t own = r[k].n_boxes ? solo_bytes_read(f, path, r[k].boxes, r[k].n_boxes) : 0;

		ck_assert_msg(r[k].stats.bytes_read <= own, "rank %u read %llu bytes, its own load "
			      "reads %llu", k, (unsigned long long)r[k].stats.bytes_read,
			      (unsigned long long)own);
		sum += r[k].stats.bytes_read;
		recv += own - r[k].stats.bytes_read;
	}
	ck_assert_msg(sum == u, "the ranks read %llu bytes in all, one load of the union reads "
		      "%llu", (unsigned long long)sum, (unsigned long long)u);
	ck_assert_int_eq(f->stat("p2p_bytes"), (long)recv);
}

static void assert_ok(const struct rank_run *r, unsigned n)
{
	for (unsigned k = 0; k < n; k++)
		ck_assert_msg(r[k].rc_setup == 0 && r[k].rc == 0, "rank %u: %s; load: %d %s", k,
			      r[k].setup_msg, r[k].rc, r[k].msg);
}

static uint64_t sum_read(const struct rank_run *r, unsigned n)
{
	uint64_t s = 0;

	for (unsigned k = 0; k < n; k++)
		s += r[k].stats.bytes_read;
	return s;
}

/* ---- replicas ------------------------------------------------------------------- */

/*
 * Four replicas load the whole checkpoint (_i = 0: into host memory; 1:
 * into fake device memory, each rank on one of two devices; 2: half the
 * ranks host, half device).  Together they read from storage exactly what
 * one load reads, each about a quarter (at most a region more), and every
 * byte read by one rank went to each of the three others.
 */
START_TEST(test_replicas)
{
	struct fakes f;
	struct testd t;
	struct rank_run r[4];
	struct rbox all[N_DEFS];
	char path[TD_PATH];
	uint64_t solo, sum;
	const unsigned n = 4;

	td_init(&t, "replicas");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "rep", path, sizeof(path));
	NEED_FAKES(&f);
	for (unsigned i = 0; i < N_DEFS; i++)
		box_set(&all[i], i, NULL, NULL, -1);
	solo = solo_bytes_read(&f, path, all, N_DEFS);
	ck_assert_uint_ge(solo, 32 * MiB);

	memset(r, 0, sizeof(r));
	for (unsigned k = 0; k < n; k++) {
		int dev = _i == 0 ? -1 : _i == 1 ? (int)(k % 2) : (k % 2 ? 1 : -1);

		r[k] = (struct rank_run){ .f = &f, .path = path, .dev = (int)(k % 2),
					  .n_boxes = N_DEFS };
		for (unsigned i = 0; i < N_DEFS; i++) {
			box_set(&r[k].boxes[i], i, NULL, NULL, dev);
			box_mem(&f, &r[k].boxes[i]);
		}
	}
	f.reset();
	run_ranks(&f, r, n, true);
	assert_ok(r, n);
	for (unsigned k = 0; k < n; k++)
		for (unsigned i = 0; i < N_DEFS; i++)
			box_verify(&f, &r[k].boxes[i], k);
	sum = sum_read(r, n);
	ck_assert_msg(sum == solo, "the ranks read %llu bytes in all, one load reads %llu",
		      (unsigned long long)sum, (unsigned long long)solo);
	for (unsigned k = 0; k < n; k++) {
		/* ra_assign's bound for replicas: a share plus the largest
		 * region (4 MiB, the library's GROUP_REGION). */
		ck_assert_msg(r[k].stats.bytes_read <= solo / n + 4 * MiB &&
				      r[k].stats.bytes_read > 0,
			      "rank %u read %llu of %llu bytes", k,
			      (unsigned long long)r[k].stats.bytes_read, (unsigned long long)solo);
		ck_assert_uint_eq(r[k].stats.bytes_wanted, r[0].stats.bytes_wanted);
	}
	ck_assert_int_eq(f.stat("p2p_bytes"), (long)(solo * (n - 1)));
	ck_assert_int_eq(f.stat("allgathers"), 2 * (long)n);
	ck_assert_int_eq(f.stat("allocs"), 0);
	ranks_free(&f, r, n);
	td_fini(&t);
}
END_TEST

/*
 * Overlapping row bands of w: rank k wants rows [256 k, 256 k + 1024), so
 * neighbours share 768 rows.  The ranks read the union once (what a load of
 * rows [0, 1792) reads), and what a rank receives is exactly what it wants
 * and did not read.
 */
START_TEST(test_overlap)
{
	struct fakes f;
	struct testd t;
	struct rank_run r[4];
	struct rbox u;
	char path[TD_PATH];
	uint64_t solo;
	const unsigned n = 4;

	td_init(&t, "overlap");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "ovl", path, sizeof(path));
	NEED_FAKES(&f);
	box_rows(&u, 0, 256 * (n - 1) + 1024, -1);
	solo = solo_bytes_read(&f, path, &u, 1);
	memset(r, 0, sizeof(r));
	for (unsigned k = 0; k < n; k++) {
		r[k] = (struct rank_run){ .f = &f, .path = path, .dev = (int)(k % 2), .n_boxes = 1 };
		box_rows(&r[k].boxes[0], 256 * k, 1024, k % 2 ? (int)(k % 2) : -1);
		box_mem(&f, &r[k].boxes[0]);
	}
	f.reset();
	run_ranks(&f, r, n, true);
	assert_ok(r, n);
	for (unsigned k = 0; k < n; k++)
		box_verify(&f, &r[k].boxes[0], k);
	assert_read_once(&f, path, r, n, solo);
	ranks_free(&f, r, n);
	td_fini(&t);
}
END_TEST

/*
 * Disjoint needs: rank k wants row band k of w (8 MiB), plus (_i = 1) e
 * whole on every rank.  Each reads its own band, less the CRC pieces it
 * shares with a neighbour; e, wanted by all, is read once.
 */
START_TEST(test_disjoint)
{
	struct fakes f;
	struct testd t;
	struct rank_run r[4];
	struct rbox u[2];
	char path[TD_PATH];
	uint64_t e_read = 0, solo;
	const unsigned n = 4;

	td_init(&t, "disjoint");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "dis", path, sizeof(path));
	NEED_FAKES(&f);
	box_rows(&u[0], 0, 2048, -1);
	box_set(&u[1], 1, NULL, NULL, -1);
	solo = solo_bytes_read(&f, path, u, _i ? 2 : 1);
	if (_i)
		e_read = solo_bytes_read(&f, path, &u[1], 1);
	memset(r, 0, sizeof(r));
	for (unsigned k = 0; k < n; k++) {
		r[k] = (struct rank_run){ .f = &f, .path = path, .dev = 0, .n_boxes = _i ? 2 : 1 };
		box_rows(&r[k].boxes[0], 512 * k, 512, k % 2 ? 0 : -1);
		box_mem(&f, &r[k].boxes[0]);
		if (_i) {
			box_set(&r[k].boxes[1], 1, NULL, NULL, k % 2 ? -1 : 0);
			box_mem(&f, &r[k].boxes[1]);
		}
	}
	f.reset();
	run_ranks(&f, r, n, true);
	assert_ok(r, n);
	for (unsigned k = 0; k < n; k++)
		for (unsigned i = 0; i < r[k].n_boxes; i++)
			box_verify(&f, &r[k].boxes[i], k);
	/* Only the CRC pieces at the bands' ends (a shard's data starts
	 * 4 KiB into its file, off the grid) and e are shared. */
	assert_read_once(&f, path, r, n, solo);
	for (unsigned k = 0; k < n; k++)
		ck_assert_uint_ge(r[k].stats.bytes_read, 7 * MiB);
	ck_assert_uint_le(f.stat("p2p_bytes"), (long)(e_read * (n - 1) + 4 * 2 * MiB));
	ranks_free(&f, r, n);
	td_fini(&t);
}
END_TEST

/*
 * A rank that wants nothing (no boxes: _i = 0; only the scalar s, _i = 1,
 * which another rank wants too) still takes part: three ranks load the
 * whole checkpoint, and the loads of all four succeed.
 */
START_TEST(test_wants_nothing)
{
	struct fakes f;
	struct testd t;
	struct rank_run r[4];
	struct rbox all[N_DEFS];
	char path[TD_PATH];
	uint64_t solo;
	const unsigned n = 4;

	td_init(&t, "wants_nothing");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "none", path, sizeof(path));
	NEED_FAKES(&f);
	for (unsigned i = 0; i < N_DEFS; i++)
		box_set(&all[i], i, NULL, NULL, -1);
	solo = solo_bytes_read(&f, path, all, N_DEFS);
	memset(r, 0, sizeof(r));
	for (unsigned k = 0; k < n; k++) {
		r[k] = (struct rank_run){ .f = &f, .path = path, .dev = 1 };
		if (k == 2) {
			if (_i) {
				box_set(&r[k].boxes[0], 2, NULL, NULL, -1);
				box_mem(&f, &r[k].boxes[0]);
				r[k].n_boxes = 1;
			}
			continue;
		}
		r[k].n_boxes = N_DEFS;
		for (unsigned i = 0; i < N_DEFS; i++) {
			box_set(&r[k].boxes[i], i, NULL, NULL, 1);
			box_mem(&f, &r[k].boxes[i]);
		}
	}
	f.reset();
	run_ranks(&f, r, n, true);
	assert_ok(r, n);
	for (unsigned k = 0; k < n; k++)
		for (unsigned i = 0; i < r[k].n_boxes; i++)
			box_verify(&f, &r[k].boxes[i], k);
	if (!_i) {
		ck_assert_uint_eq(r[2].stats.bytes_read, 0);
		ck_assert_uint_eq(r[2].stats.bytes_wanted, 0);
	}
	assert_read_once(&f, path, r, n, solo);
	ranks_free(&f, r, n);
	td_fini(&t);
}
END_TEST

/* ---- a corrupt block ----------------------------------------------------------------- */

/*
 * A flipped byte in the third CRC piece of rank-00000.safetensors (rows of
 * w that the first save rank wrote).  Ranks 0-2 load the whole checkpoint:
 * whoever read that block, every one of them fails with the CRC mismatch,
 * naming the file and the piece's offset.  Rank 3 loads only the rows of
 * rank-00001.safetensors and succeeds.
 */
START_TEST(test_corrupt)
{
	struct fakes f;
	struct testd t;
	struct rank_run r[4];
	char path[TD_PATH], file[TD_PATH];
	FILE *fp;
	int ch;
	const unsigned n = 4;

	td_init(&t, "corrupt");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "bad", path, sizeof(path));
	NEED_FAKES(&f);
	td_path(file, sizeof(file), "%s/rank-00000.safetensors", path);
	fp = fopen(file, "r+b");
	ck_assert_ptr_nonnull(fp);
	ck_assert_int_eq(fseek(fp, (long)(2 * MiB + 4321), SEEK_SET), 0);
	ch = fgetc(fp);
	ck_assert_int_eq(fseek(fp, (long)(2 * MiB + 4321), SEEK_SET), 0);
	fputc(ch ^ 0x01, fp);
	fclose(fp);

	memset(r, 0, sizeof(r));
	for (unsigned k = 0; k < n; k++) {
		r[k] = (struct rank_run){ .f = &f, .path = path, .dev = (int)(k % 2) };
		if (k == 3) {
			box_rows(&r[k].boxes[0], 1024, 1024, 1);
			box_mem(&f, &r[k].boxes[0]);
			r[k].n_boxes = 1;
			continue;
		}
		r[k].n_boxes = N_DEFS;
		for (unsigned i = 0; i < N_DEFS; i++) {
			box_set(&r[k].boxes[i], i, NULL, NULL, k == 1 ? 1 : -1);
			box_mem(&f, &r[k].boxes[i]);
		}
	}
	run_ranks(&f, r, n, true);
	for (unsigned k = 0; k < 3; k++) {
		ck_assert_msg(r[k].rc_setup == 0, "rank %u: %s", k, r[k].setup_msg);
		ck_assert_msg(r[k].rc == -EBADMSG, "rank %u: %d %s", k, r[k].rc, r[k].msg);
		ck_assert_msg(strstr(r[k].msg, "CRC mismatch") &&
				      strstr(r[k].msg, "rank-00000.safetensors") &&
				      strstr(r[k].msg, "offset 2097152") && strstr(r[k].msg, "'w'"),
			      "rank %u: %s", k, r[k].msg);
	}
	assert_ok(&r[3], 1);
	box_verify(&f, &r[3].boxes[0], 3);
	ranks_free(&f, r, n);
	td_fini(&t);
}
END_TEST

/*
 * Ranks 0 and 1 load one checkpoint, ranks 2 and 3 another (saved alike):
 * every rank finds out from the first exchange and fails, naming a rank
 * that loads another checkpoint; nothing is read.
 */
START_TEST(test_other_ckpt)
{
	struct fakes f;
	struct testd t;
	struct rank_run r[4];
	char path[2][TD_PATH];
	const unsigned n = 4;

	td_init(&t, "other_ckpt");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "one", path[0], sizeof(path[0]));
	save_ckpt(&t, "two", path[1], sizeof(path[1]));
	NEED_FAKES(&f);
	memset(r, 0, sizeof(r));
	for (unsigned k = 0; k < n; k++) {
		r[k] = (struct rank_run){ .f = &f, .path = path[k / 2], .dev = 0, .n_boxes = 1 };
		box_set(&r[k].boxes[0], 1, NULL, NULL, -1);
		box_mem(&f, &r[k].boxes[0]);
	}
	f.reset();
	run_ranks(&f, r, n, true);
	for (unsigned k = 0; k < n; k++) {
		ck_assert_msg(r[k].rc_setup == 0, "rank %u: %s", k, r[k].setup_msg);
		ck_assert_msg(r[k].rc == -EINVAL && strstr(r[k].msg, "loads another checkpoint"),
			      "rank %u: %d %s", k, r[k].rc, r[k].msg);
		ck_assert_uint_eq(r[k].stats.bytes_read, 0);
	}
	ck_assert_int_eq(f.stat("allgathers"), (long)n);
	ck_assert_int_eq(f.stat("sends"), 0);
	ranks_free(&f, r, n);
	td_fini(&t);
}
END_TEST

/*
 * Saved by clients connected with CKPT_CONNECT_RESIDENT, then the shard
 * rank-00000.safetensors is deleted: four replicas, each with a client of
 * the job (ckpt_load_set_client), load everything.  The regions of the
 * deleted file come from ckptd's image, to whichever rank reads them, and
 * reach the others over the group; every byte matches.
 */
START_TEST(test_resident)
{
	struct fakes f;
	struct testd t;
	struct rank_run r[4];
	char path[TD_PATH], file[TD_PATH];
	uint64_t resident = 0;
	const unsigned n = 4;

	td_init(&t, "resident");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt_flags(&t, "res", CKPT_CONNECT_RESIDENT, path, sizeof(path));
	NEED_FAKES(&f);
	td_path(file, sizeof(file), "%s/rank-00000.safetensors", path);
	ck_assert_int_eq(unlink(file), 0);
	memset(r, 0, sizeof(r));
	for (unsigned k = 0; k < n; k++) {
		int rc;

		r[k] = (struct rank_run){ .f = &f, .path = path, .dev = (int)(k % 2),
					  .n_boxes = N_DEFS };
		rc = connect_rc(td_sock(&t, 0), k, n, 0, &r[k].client);
		ck_assert_msg(rc == 0, "connect rank %u: %d %s", k, rc, ckpt_last_error());
		for (unsigned i = 0; i < N_DEFS; i++) {
			box_set(&r[k].boxes[i], i, NULL, NULL, k % 2 ? 1 : -1);
			box_mem(&f, &r[k].boxes[i]);
		}
	}
	run_ranks(&f, r, n, true);
	assert_ok(r, n);
	for (unsigned k = 0; k < n; k++) {
		for (unsigned i = 0; i < N_DEFS; i++)
			box_verify(&f, &r[k].boxes[i], k);
		resident += r[k].stats.bytes_resident;
		ck_assert_uint_le(r[k].stats.bytes_resident, r[k].stats.bytes_read);
		ckpt_disconnect(r[k].client);
	}
	/* Half of w (16 MiB) and more lives only in the image now. */
	ck_assert_msg(resident >= 16 * MiB, "%llu bytes came from ckptd's memory",
		      (unsigned long long)resident);
	ranks_free(&f, r, n);
	td_fini(&t);
}
END_TEST

/*
 * A stale image: job J saves "st" resident through daemon 0 (bytes of
 * other seeds); the checkpoint is removed and saved again at the same path,
 * with the same run (so the same attempt id), through daemon 1, which
 * cannot tell daemon 0.  Daemon 0 still serves its image for that path and
 * attempt; the group load through its clients must find the image's pieces
 * wrong before using them and read storage instead: every byte right, no
 * byte from the image, and a warning.
 */
START_TEST(test_stale_resident)
{
	struct fakes f;
	struct testd t;
	struct rank_run r[2];
	char path[TD_PATH];
	const unsigned n = 2;

	td_init(&t, "stale_resident");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	ck_assert_int_eq(td_daemon_start(&t, 1, "arena_max = 32M\n"), 0);
	save_ckpt_how(&t, 0, "run1", 1000, "st", CKPT_CONNECT_RESIDENT, path, sizeof(path));
	ck_assert_int_eq(td_rm_rf(path), 0);
	save_ckpt_how(&t, 1, "run1", 0, "st", 0, path, sizeof(path));
	NEED_FAKES(&f);
	memset(r, 0, sizeof(r));
	for (unsigned k = 0; k < n; k++) {
		int rc;

		r[k] = (struct rank_run){ .f = &f, .path = path, .dev = (int)(k % 2),
					  .n_boxes = N_DEFS };
		rc = connect_rc(td_sock(&t, 0), k, n, 0, &r[k].client);
		ck_assert_msg(rc == 0, "connect rank %u: %d %s", k, rc, ckpt_last_error());
		for (unsigned i = 0; i < N_DEFS; i++) {
			box_set(&r[k].boxes[i], i, NULL, NULL, -1);
			box_mem(&f, &r[k].boxes[i]);
		}
	}
	run_ranks(&f, r, n, true);
	assert_ok(r, n);
	for (unsigned k = 0; k < n; k++) {
		for (unsigned i = 0; i < N_DEFS; i++)
			box_verify(&f, &r[k].boxes[i], k);
		ck_assert_uint_eq(r[k].stats.bytes_resident, 0);
		ckpt_disconnect(r[k].client);
	}
	ranks_free(&f, r, n);
	td_fini(&t);
}
END_TEST

/* ---- refusals -------------------------------------------------------------------------- */

/* ckpt_load_set_group's checks, before anything is loaded. */
START_TEST(test_refused)
{
	struct fakes f;
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct ncclComm *comms[2];
	char path[TD_PATH];
	struct {
		struct ckpt_load_group g;
		uint64_t more;
	} big;

	td_init(&t, "refused");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "ref", path, sizeof(path));
	NEED_FAKES(&f);
	ck_assert_int_eq(f.comm_create(2, comms), 0);
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	struct ckpt_load_group g = { CKPT_LOAD_GROUP_INIT, .nccl_comm = comms[1], .device_index = 0 };
	struct ckpt_load_group bad;

	ck_assert_int_eq(ckpt_load_set_group(NULL, &g), -EINVAL);
	ck_assert_int_eq(ckpt_load_set_group(ld, NULL), -EINVAL);
	bad = g;
	bad.size = 8;
	ck_assert_int_eq(ckpt_load_set_group(ld, &bad), -EINVAL);
	bad = g;
	bad.reserved2 = 1;
	ck_assert_int_eq(ckpt_load_set_group(ld, &bad), -EINVAL);
	bad = g;
	bad.nccl_comm = NULL;
	ck_assert_int_eq(ckpt_load_set_group(ld, &bad), -EINVAL);
	memset(&big, 0, sizeof(big));
	big.g = g;
	big.g.size = sizeof(big);
	big.more = 1;
	ck_assert_int_eq(ckpt_load_set_group(ld, &big.g), -E2BIG);
	big.more = 0;
	ck_assert_int_eq(ckpt_load_set_group(ld, &big.g), 0);
	f.fail_at("CommCount", 1, 2 /* ncclSystemError */);
	ck_assert_int_eq(ckpt_load_set_group(ld, &g), -EIO);
	ck_assert_msg(strstr(ckpt_last_error(), "ncclCommCount") &&
			      strstr(ckpt_last_error(), "system error"),
		      "%s", ckpt_last_error());
	ckpt_load_free(ld);
	ckpt_reader_close(rd);
	f.comm_destroy(comms, 2);
	td_fini(&t);
}
END_TEST

#else /* !CKPT_HAVE_CUDA */

/* Without CUDA there is no NCCL path: the group is refused, and says why. */
START_TEST(test_no_cuda)
{
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	char path[TD_PATH];
	int comm;
	struct ckpt_load_group g = { CKPT_LOAD_GROUP_INIT, .nccl_comm = &comm };

	td_init(&t, "no_cuda");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_ckpt(&t, "nocuda", path, sizeof(path));
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	ck_assert_int_eq(ckpt_load_set_group(ld, &g), -EOPNOTSUPP);
	ck_assert_msg(strstr(ckpt_last_error(), "CUDA"), "%s", ckpt_last_error());
	ckpt_load_free(ld);
	ckpt_reader_close(rd);
	td_fini(&t);
}
END_TEST

START_TEST(test_group_loads)
{
	td_skip("load_group", "libckpt was built without CUDA (CUDA=0 or no toolkit headers): "
		"group loads are not checked");
}
END_TEST
#endif

int main(void)
{
	Suite *s = suite_create("load_group");

#ifndef CKPT_HAVE_CUDA
	td_case(s, "no_cuda", test_no_cuda, 120, 0, 1);
	td_case(s, "group_loads", test_group_loads, 30, 0, 1);
#else
	td_case(s, "replicas", test_replicas, 180, 0, 3);
	td_case(s, "overlap", test_overlap, 180, 0, 1);
	td_case(s, "disjoint", test_disjoint, 180, 0, 2);
	td_case(s, "wants_nothing", test_wants_nothing, 180, 0, 2);
	td_case(s, "corrupt", test_corrupt, 180, 0, 1);
	td_case(s, "other_ckpt", test_other_ckpt, 180, 0, 1);
	td_case(s, "resident", test_resident, 180, 0, 1);
	td_case(s, "stale_resident", test_stale_resident, 180, 0, 1);
	td_case(s, "refused", test_refused, 120, 0, 1);
#endif
	return td_main(s, "check_load_group");
}
