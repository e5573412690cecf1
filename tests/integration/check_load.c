/* SPDX-License-Identifier: MIT */
/*
 * check_load.c - integration: loading checkpoints into new layouts.
 *
 * Checkpoints are saved through a real ckptd by N rank processes with
 * random shardings and replicas, then loaded by M "ranks" (loads need no
 * daemon) with other shardings, into contiguous and strided destinations;
 * every byte is compared with the global pattern, and padding around
 * strided destinations must stay untouched.  Then the failures: strict
 * checks, corrupt and missing files, `latest`.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "ckpt.h"
#include "tests/lib/testd.h"

#define MiB (1024ull * 1024ull)
#define MAX_T 8
#define MAX_R 8
#define PAD 0xA5

static uint64_t rng_state;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static uint64_t below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

static uint64_t vol(const uint64_t *s, unsigned n)
{
	uint64_t v = 1;

	for (unsigned d = 0; d < n; d++)
		v *= s[d];
	return v;
}

/* ---- a random state, and how N ranks save it ---- */

struct tensor {
	char name[32];
	enum ckpt_dtype dt;
	unsigned ndim;
	uint64_t shape[4];
	uint64_t seed;
};

struct state {
	struct tensor t[MAX_T];
	unsigned n_t;
	uint32_t world;
	uint64_t blob_len[MAX_R];
};

/* Part p of `parts` along dimension d of t (rows split as evenly as the
 * sizes allow; a part may be empty). */
static void part_box(const struct tensor *t, unsigned d, unsigned parts, unsigned p,
		     uint64_t *offs, uint64_t *shape)
{
	for (unsigned k = 0; k < t->ndim; k++) {
		offs[k] = 0;
		shape[k] = t->shape[k];
	}
	if (t->ndim == 0 || parts <= 1)
		return;
	offs[d] = t->shape[d] * p / parts;
	shape[d] = t->shape[d] * (p + 1) / parts - offs[d];
}

/* Where tensor i is cut when saved: along dim `d` into `parts`, each part
 * p held by ranks p, p + parts, ... (replica = rank / parts). */
struct cut {
	unsigned d, parts;
};

static void random_state(struct state *s, uint32_t world, unsigned seed, struct cut *cuts)
{
	memset(s, 0, sizeof(*s));
	s->world = world;
	s->n_t = 3 + (unsigned)below(MAX_T - 2);
	for (unsigned i = 0; i < s->n_t; i++) {
		struct tensor *t = &s->t[i];

		snprintf(t->name, sizeof(t->name), "layer%u.w", i);
		t->dt = (enum ckpt_dtype)((i + seed * 5) % CKPT_DTYPE_COUNT);
		t->ndim = (unsigned)below(5);
		for (unsigned d = 0; d < t->ndim; d++)
			t->shape[d] = 1 + below(9);
		if (i == 0) { /* one tensor over a few CRC blocks */
			t->ndim = 2;
			t->shape[0] = 300 + below(400);
			t->shape[1] = 1024 + below(1024);
		}
		t->seed = 5000 + 100ull * seed + i;
		cuts[i].d = t->ndim ? (unsigned)below(t->ndim) : 0;
		cuts[i].parts = t->ndim ? 1 + (unsigned)below(world) : 1;
	}
	for (uint32_t r = 0; r < world; r++)
		s->blob_len[r] = 1 + below(5000);
}

struct rank_args {
	const char *sock, *root, *name;
	const struct state *s;
	const struct cut *cuts;
	uint32_t rank;
};

static int save_rank(void *arg, int rep, int go)
{
	const struct rank_args *a = arg;
	const struct state *s = a->s;
	struct ckpt_client *c = NULL;
	struct ckpt_save *sv = NULL;
	struct ckpt_future *fs, *fc;
	void *bufs[MAX_T + 1] = { 0 };
	uint64_t offs[MAX_T][4], shape[MAX_T][4];
	char key[32];
	int rc, st, cm;

	(void)go;
	rc = td_connect_rc(a->sock, "loadjob", a->rank, s->world, 16 * MiB, &c);
	if (rc < 0) {
		td_report(rep, "committed %d connect: %s", rc, ckpt_last_error());
		return 11;
	}
	rc = ckpt_save_begin(c, a->root, a->name, 42, &sv);
	if (rc < 0) {
		td_report(rep, "committed %d begin: %s", rc, ckpt_last_error());
		return 12;
	}
	for (unsigned i = 0; i < s->n_t; i++) {
		const struct tensor *t = &s->t[i];
		unsigned parts = a->cuts[i].parts, p = a->rank % parts;
		size_t es = ckpt_dtype_size(t->dt);

		part_box(t, a->cuts[i].d, parts, p, offs[i], shape[i]);
		bufs[i] = malloc(td_nbytes(es, t->ndim, shape[i]) + 1);
		if (!bufs[i])
			return 10;
		td_fill_chunk(bufs[i], es, t->ndim, t->shape, offs[i], shape[i], t->seed);
		struct ckpt_tensor tn = { CKPT_TENSOR_INIT, .name = t->name, .dtype = t->dt,
					  .ndim = t->ndim, .shape = shape[i], .data = bufs[i],
					  .global_shape = t->ndim ? t->shape : NULL,
					  .offsets = t->ndim ? offs[i] : NULL,
					  .replica = a->rank / parts };
		if (!t->ndim && a->rank) /* a scalar: rank 0 writes it */
			tn.replica = a->rank;
		rc = ckpt_save_add_tensor(sv, &tn);
		if (rc < 0) {
			td_report(rep, "committed %d add %s: %s", rc, t->name, ckpt_last_error());
			return 13;
		}
	}
	bufs[MAX_T] = malloc(s->blob_len[a->rank]);
	if (!bufs[MAX_T])
		return 10;
	td_fill(bufs[MAX_T], s->blob_len[a->rank], 9000 + a->rank, 0);
	snprintf(key, sizeof(key), "loader/dp-%u", a->rank);
	rc = ckpt_save_add_blob(sv, key, bufs[MAX_T], s->blob_len[a->rank]);
	if (rc < 0) {
		td_report(rep, "committed %d blob: %s", rc, ckpt_last_error());
		return 13;
	}
	rc = ckpt_save_commit(sv, &fs, &fc);
	if (rc < 0) {
		td_report(rep, "committed %d commit: %s", rc, ckpt_last_error());
		return 14;
	}
	st = td_future_wait(fs, 60000);
	cm = td_future_wait(fc, 60000);
	td_report(rep, "committed %d %s", cm, ckpt_future_error(fc));
	ckpt_save_free(sv);
	ckpt_disconnect(c);
	for (unsigned i = 0; i <= MAX_T; i++)
		free(bufs[i]);
	return st == 0 && cm == 0 ? 0 : 1;
}

static void save_state(struct testd *t, const struct state *s, const struct cut *cuts,
		       const char *name)
{
	struct td_child ch[MAX_R];
	struct rank_args a[MAX_R];

	for (uint32_t r = 0; r < s->world; r++) {
		a[r] = (struct rank_args){ .sock = td_sock(t, 0), .root = t->root, .name = name,
					   .s = s, .cuts = cuts, .rank = r };
		ck_assert_int_eq(td_child_start(&ch[r], save_rank, &a[r]), 0);
	}
	for (uint32_t r = 0; r < s->world; r++) {
		int st = td_child_wait(&ch[r], 90000);
		ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
			      "rank %u: %s; it said:\n%s", r, td_status_str(st), ch[r].out);
	}
}

/* ---- loading it back in another layout ---- */

/* One destination box, maybe strided inside a padded buffer. */
struct dst {
	uint64_t offs[4], shape[4];
	int64_t strides[4];   /* elements */
	uint8_t *mem;         /* the whole padded buffer */
	size_t mem_len;
	uint64_t at;          /* byte offset of element [0..0] in mem */
	bool strided;
};

static void dst_alloc(struct dst *d, unsigned ndim, size_t es)
{
	uint64_t pad[4], len = 1;

	d->strided = ndim > 0 && below(2);
	for (unsigned k = 0; k < ndim; k++)
		pad[k] = d->strided ? below(3) : 0;
	/* Row-major over shape + pad, with the box at a random offset. */
	uint64_t ext[4];
	for (unsigned k = 0; k < ndim; k++)
		ext[k] = d->shape[k] + pad[k];
	for (unsigned k = ndim; k-- > 0;) {
		d->strides[k] = (int64_t)len;
		len *= ext[k];
	}
	d->at = 0;
	for (unsigned k = 0; k < ndim; k++)
		d->at += (pad[k] ? below(pad[k] + 1) : 0) * (uint64_t)d->strides[k];
	d->mem_len = (size_t)(len * es) + es;
	d->at *= es;
	d->mem = malloc(d->mem_len);
	ck_assert_ptr_nonnull(d->mem);
	memset(d->mem, PAD, d->mem_len);
}

/* Compares the box with the pattern, and every byte outside it with PAD. */
static void dst_verify(const struct dst *d, const struct tensor *t, const char *who)
{
	size_t es = ckpt_dtype_size(t->dt);
	uint64_t n = vol(d->shape, t->ndim), idx[4] = { 0 };
	uint8_t *want = malloc(n * es + 1), *seen = calloc(d->mem_len, 1);

	ck_assert_ptr_nonnull(want);
	ck_assert_ptr_nonnull(seen);
	td_fill_chunk(want, es, t->ndim, t->shape, d->offs, d->shape, t->seed);
	for (uint64_t e = 0; e < n; e++) {
		uint64_t off = d->at;
		for (unsigned k = 0; k < t->ndim; k++)
			off += idx[k] * (uint64_t)d->strides[k] * es;
		if (memcmp(d->mem + off, want + e * es, es))
			ck_abort_msg("%s: '%s' element %llu of the box differs", who, t->name,
				     (unsigned long long)e);
		memset(seen + off, 1, es);
		for (unsigned k = t->ndim; k-- > 0;) {
			if (++idx[k] < d->shape[k])
				break;
			idx[k] = 0;
		}
	}
	for (size_t b = 0; b < d->mem_len; b++)
		if (!seen[b] && d->mem[b] != PAD)
			ck_abort_msg("%s: '%s': byte %zu outside the box was written", who, t->name,
				     b);
	free(want);
	free(seen);
}

/* Load rank m of M: each tensor cut along a random dim into M parts (or
 * fewer: then ranks share parts, as replicas would), some parts given as
 * two boxes; its blob is saved rank m % N's. */
static void load_rank(const char *path, const struct state *s, uint32_t m, uint32_t M,
		      bool latest)
{
	struct ckpt_reader *rd = NULL;
	struct ckpt_load *ld = NULL;
	struct ckpt_future *done = NULL;
	struct dst dsts[MAX_T][2];
	unsigned nd[MAX_T];
	struct ckpt_load_dst ldst[MAX_T][2];
	uint32_t br = m % s->world;
	uint8_t *blob = malloc(s->blob_len[br]);
	char key[32], who[64];
	int rc;

	snprintf(who, sizeof(who), "load rank %u/%u", m, M);
	rc = latest ? ckpt_reader_open_latest(path, &rd) : ckpt_reader_open(path, &rd);
	ck_assert_msg(rc == 0, "%s: open: %d %s", who, rc, ckpt_last_error());
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	for (unsigned i = 0; i < s->n_t; i++) {
		const struct tensor *t = &s->t[i];
		unsigned d = t->ndim ? (unsigned)below(t->ndim) : 0;
		unsigned parts = 1 + (unsigned)below(M);
		uint64_t offs[4], shape[4];

		part_box(t, d, parts, m % parts, offs, shape);
		nd[i] = 1;
		if (t->ndim && shape[d] >= 2 && below(3) == 0)
			nd[i] = 2;
		for (unsigned k = 0; k < nd[i]; k++) {
			struct dst *x = &dsts[i][k];
			memcpy(x->offs, offs, sizeof(offs));
			memcpy(x->shape, shape, sizeof(shape));
			if (nd[i] == 2) {
				uint64_t half = shape[d] / 2;
				x->offs[d] = k ? offs[d] + half : offs[d];
				x->shape[d] = k ? shape[d] - half : half;
			}
			dst_alloc(x, t->ndim, ckpt_dtype_size(t->dt));
			ldst[i][k] = (struct ckpt_load_dst){ CKPT_LOAD_DST_INIT,
							    .offsets = t->ndim ? x->offs : NULL,
							    .shape = t->ndim ? x->shape : NULL,
							    .strides = x->strided ? x->strides : NULL,
							    .data = x->mem + x->at };
		}
		struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = t->dt,
					       .name = t->name, .global_shape = t->shape,
					       .ndim = t->ndim, .n_dsts = nd[i], .dsts = ldst[i] };
		rc = ckpt_load_add_tensor(ld, &lt);
		ck_assert_msg(rc == 0, "%s: add '%s': %d %s", who, t->name, rc, ckpt_last_error());
	}
	snprintf(key, sizeof(key), "loader/dp-%u", br);
	ck_assert_ptr_nonnull(blob);
	rc = ckpt_load_add_blob(ld, key, blob, s->blob_len[br]);
	ck_assert_msg(rc == 0, "%s: add blob: %d %s", who, rc, ckpt_last_error());
	rc = ckpt_load_start(ld, &done);
	ck_assert_msg(rc == 0, "%s: start: %d %s", who, rc, ckpt_last_error());
	rc = td_future_wait(done, 60000);
	ck_assert_msg(rc == 0, "%s: load: %d %s", who, rc, ckpt_future_error(done));
	for (unsigned i = 0; i < s->n_t; i++)
		for (unsigned k = 0; k < nd[i]; k++) {
			dst_verify(&dsts[i][k], &s->t[i], who);
			free(dsts[i][k].mem);
		}
	ck_assert_int_eq(td_check(blob, s->blob_len[br], 9000 + br, 0), -1);
	struct ckpt_load_stats st = { CKPT_LOAD_STATS_INIT };
	ck_assert_int_eq(ckpt_load_stats(ld, &st), 0);
	ck_assert_uint_ge(st.bytes_read, st.bytes_wanted);
	ck_assert_uint_eq(st.missing, 0);
	ckpt_load_free(ld);
	ckpt_reader_close(rd);
	free(blob);
}

/* N ranks save, M load: (N, M) over {1, 2, 3, 4, 8}^2 across the loop. */
START_TEST(test_reshard)
{
	static const uint32_t sizes[] = { 1, 2, 3, 4, 8 };
	struct testd t;
	struct state s;
	struct cut cuts[MAX_T];
	uint32_t N = sizes[_i % 5], M = sizes[(_i / 5 + _i) % 5];
	char name[32], path[TD_PATH];

	rng_state = 0xC0FFEE00u + (uint64_t)_i;
	snprintf(name, sizeof(name), "reshard-%d", _i);
	td_init(&t, name);
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\ncommit_deadline = 60s\n"), 0);
	random_state(&s, N, (unsigned)_i, cuts);
	save_state(&t, &s, cuts, "ckpt");
	td_path(path, sizeof(path), "%s/ckpt", t.root);
	for (uint32_t m = 0; m < M; m++)
		load_rank(m == 0 ? t.root : path, &s, m, M, m == 0);
	td_fini(&t);
}
END_TEST

/* ---- the failures ---- */

/* One rank saves "w" F32 [512, 1024] (2 MiB, three CRC pieces) and a blob. */
static void save_simple(struct testd *t, const char *name, uint64_t step)
{
	struct ckpt_client *c = td_connect(td_sock(t, 0), "simple", 0, 1, 16 * MiB);
	struct ckpt_save *s;
	uint64_t shape[2] = { 512, 1024 };
	float *w = malloc(512 * 1024 * 4);
	uint8_t b[100];
	char msg[256];
	int st, cm;

	td_fill(w, 512 * 1024 * 4, 77, 0);
	td_fill(b, sizeof(b), 78, 0);
	ck_assert_int_eq(ckpt_save_begin(c, t->root, name, step, &s), 0);
	td_add(s, "w", CKPT_F32, 2, shape, w);
	ck_assert_int_eq(ckpt_save_add_blob(s, "b", b, sizeof(b)), 0);
	ck_assert_int_eq(td_commit_wait(s, 60000, &st, &cm, msg, sizeof(msg)), 0);
	ck_assert_msg(st == 0 && cm == 0, "%s", msg);
	ckpt_save_free(s);
	ckpt_disconnect(c);
	free(w);
}

static int load_w(const char *path, uint32_t flags, float *w, int *ret_start, char *msg,
		  size_t len)
{
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct ckpt_future *done;
	uint64_t shape[2] = { 512, 1024 };
	struct ckpt_load_dst d = { CKPT_LOAD_DST_INIT, .data = w };
	struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_F32, .name = "w",
				       .global_shape = shape, .ndim = 2, .n_dsts = 1, .dsts = &d };
	int rc;

	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	ck_assert_int_eq(ckpt_load_begin(rd, flags, &ld), 0);
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
	*ret_start = ckpt_load_start(ld, &done);
	if (*ret_start) {
		snprintf(msg, len, "%s", ckpt_last_error());
		rc = *ret_start;
	} else {
		rc = td_future_wait(done, 30000);
		snprintf(msg, len, "%s", ckpt_future_error(done));
	}
	ckpt_load_free(ld);
	ckpt_reader_close(rd);
	return rc;
}

START_TEST(test_corrupt)
{
	struct testd t;
	char path[TD_PATH], file[TD_PATH], msg[1024];
	float *w = malloc(512 * 1024 * 4);
	int start, rc;
	struct stat sb;
	FILE *f;

	td_init(&t, "corrupt");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_simple(&t, "c", 1);
	td_path(path, sizeof(path), "%s/c", t.root);
	td_path(file, sizeof(file), "%s/rank-00000.safetensors", path);
	ck_assert_int_eq(load_w(path, 0, w, &start, msg, sizeof(msg)), 0);
	ck_assert_int_eq(td_check(w, 512 * 1024 * 4, 77, 0), -1);

	/* A flipped byte in the second MiB of the file. */
	ck_assert_int_eq(stat(file, &sb), 0);
	f = fopen(file, "r+b");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fseek(f, (long)(MiB + 12345), SEEK_SET), 0);
	int ch = fgetc(f);
	ck_assert_int_eq(fseek(f, (long)(MiB + 12345), SEEK_SET), 0);
	fputc(ch ^ 0x10, f);
	fclose(f);
	rc = load_w(path, 0, w, &start, msg, sizeof(msg));
	ck_assert_int_eq(start, 0);
	ck_assert_int_eq(rc, -EBADMSG);
	ck_assert_msg(strstr(msg, "CRC mismatch") && strstr(msg, "rank-00000.safetensors") &&
			      strstr(msg, "'w'") && strstr(msg, "offset 1048576"),
		      "%s", msg);

	/* Truncated in the middle of w. */
	ck_assert_int_eq(truncate(file, (off_t)(MiB + 100)), 0);
	rc = load_w(path, 0, w, &start, msg, sizeof(msg));
	ck_assert_int_eq(rc, -EBADMSG);
	ck_assert_msg(strstr(msg, "truncated"), "%s", msg);

	/* The rank's file is gone: the load is refused at start. */
	ck_assert_int_eq(unlink(file), 0);
	rc = load_w(path, 0, w, &start, msg, sizeof(msg));
	ck_assert_int_eq(start, -ENOENT);
	ck_assert_msg(strstr(msg, "rank-00000.safetensors"), "%s", msg);
	free(w);
	td_fini(&t);
}
END_TEST

START_TEST(test_strict)
{
	struct testd t;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct ckpt_future *done;
	char path[TD_PATH];
	float *w = calloc(512 * 1024, 4);
	uint8_t b[100];
	uint64_t shape[2] = { 512, 1024 }, bad_shape[2] = { 512, 1000 };
	uint64_t offs[2] = { 500, 0 }, box[2] = { 13, 1024 };
	struct ckpt_load_dst d = { CKPT_LOAD_DST_INIT, .data = w };
	struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_F32, .name = "w",
				       .global_shape = shape, .ndim = 2, .n_dsts = 1, .dsts = &d };
	struct ckpt_load_stats st = { CKPT_LOAD_STATS_INIT };

	td_init(&t, "strict");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	save_simple(&t, "s", 1);
	td_path(path, sizeof(path), "%s/s", t.root);
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);

	/* A missing tensor refuses the load, naming it. */
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	lt.name = "nope";
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), -ENOENT);
	ck_assert_msg(strstr(ckpt_last_error(), "'nope'"), "%s", ckpt_last_error());
	lt.name = "w";
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), -EEXIST);
	ck_assert_int_eq(ckpt_load_start(ld, &done), -ENOENT);
	ck_assert_msg(strstr(ckpt_last_error(), "incomplete") && strstr(ckpt_last_error(), "nope"),
		      "%s", ckpt_last_error());
	ckpt_load_free(ld);

	/* Mismatches fail even with CKPT_LOAD_PARTIAL. */
	ck_assert_int_eq(ckpt_load_begin(rd, CKPT_LOAD_PARTIAL, &ld), 0);
	lt.dtype = CKPT_BF16;
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), -EINVAL);
	ck_assert_msg(strstr(ckpt_last_error(), "'w'") && strstr(ckpt_last_error(), "BF16") &&
			      strstr(ckpt_last_error(), "F32"),
		      "%s", ckpt_last_error());
	lt.dtype = CKPT_F32;
	lt.global_shape = bad_shape;
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), -EINVAL);
	lt.global_shape = shape;
	d.offsets = offs;
	d.shape = box;
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), -EINVAL);
	ck_assert_msg(strstr(ckpt_last_error(), "exceeds"), "%s", ckpt_last_error());
	ckpt_load_free(ld);

	/* PARTIAL: a missing tensor and blob are skipped and counted. */
	ck_assert_int_eq(ckpt_load_begin(rd, CKPT_LOAD_PARTIAL, &ld), 0);
	box[0] = 12;
	lt.name = "nope";
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
	lt.name = "w";
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
	ck_assert_int_eq(ckpt_load_add_blob(ld, "nope", b, 1), 0);
	ck_assert_int_eq(ckpt_load_add_blob(ld, "b", b, 99), -EINVAL);
	ckpt_load_free(ld);
	ck_assert_int_eq(ckpt_load_begin(rd, CKPT_LOAD_PARTIAL, &ld), 0);
	lt.name = "nope";
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
	lt.name = "w";
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
	ck_assert_int_eq(ckpt_load_add_blob(ld, "b", b, sizeof(b)), 0);
	ck_assert_int_eq(ckpt_load_start(ld, &done), 0);
	ck_assert_int_eq(ckpt_load_start(ld, &done), -EBUSY);
	ck_assert_int_eq(ckpt_load_add_blob(ld, "b", b, sizeof(b)), -EBUSY);
	ck_assert_int_eq(td_future_wait(done, 30000), 0);
	ck_assert_int_eq(ckpt_load_stats(ld, &st), 0);
	ck_assert_uint_eq(st.missing, 1);
	ck_assert_uint_eq(st.bytes_wanted, 12 * 1024 * 4 + sizeof(b));
	ck_assert_int_eq(td_check(w, 12 * 1024 * 4, 77, 500 * 1024 * 4), -1);
	ck_assert_int_eq(td_check(b, sizeof(b), 78, 0), -1);
	ckpt_load_free(ld);
	ckpt_load_free(NULL);
	ckpt_reader_close(rd);
	free(w);
	td_fini(&t);
}
END_TEST

/* latest: the greatest step among committed checkpoints; never a partial
 * one (shards without a manifest, a work area). */
START_TEST(test_latest)
{
	struct testd t;
	struct ckpt_reader *rd;
	char p[TD_PATH], q[TD_PATH];

	td_init(&t, "latest");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	ck_assert_int_eq(ckpt_reader_open_latest(t.root, &rd), -ENOENT);
	save_simple(&t, "b-step7", 7);
	save_simple(&t, "a-step9", 9);
	save_simple(&t, "z-step3", 3);
	/* A partial copy of a newer one: shards, no manifest. */
	td_path(p, sizeof(p), "%s/zz-partial", t.root);
	ck_assert_int_eq(mkdir(p, 0755), 0);
	td_path(q, sizeof(q), "%s/zz-partial/rank-00000.safetensors", t.root);
	ck_assert_int_eq(td_write_file(q, "not a shard"), 0);
	td_path(p, sizeof(p), "%s/.ckpt-work-0123456789abcdef0123456789abcdef", t.root);
	ck_assert_int_eq(mkdir(p, 0755), 0);
	ck_assert_int_eq(ckpt_reader_open_latest(t.root, &rd), 0);
	ck_assert_uint_eq(ckpt_reader_step(rd), 9);
	ckpt_reader_close(rd);
	ck_assert_int_eq(ckpt_reader_open_latest(NULL, &rd), -EINVAL);
	td_fini(&t);
}
END_TEST

static Suite *load_suite(void)
{
	Suite *s = suite_create("integration_load");

	td_case(s, "reshard", test_reshard, 180, 0, 25);
	td_case(s, "corrupt", test_corrupt, 60, 0, 1);
	td_case(s, "strict", test_strict, 60, 0, 1);
	td_case(s, "latest", test_latest, 60, 0, 1);
	return s;
}

int main(void)
{
	return td_main(load_suite(), "check_load");
}
