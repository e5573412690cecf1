/* SPDX-License-Identifier: MIT */
/*
 * check_load.c - integration: loading checkpoints into new layouts.
 *
 * Checkpoints are saved through a real ckptd by N rank processes with
 * random shardings and replicas, then loaded by M "ranks" (loads need no
 * daemon) with other shardings, into contiguous and strided destinations;
 * every byte is compared with the global pattern, and padding around
 * strided destinations must stay untouched.  Then the failures: strict
 * checks, corrupt and missing files, `latest`.  The case "s3" does the
 * same through S3 (ranged GETs), run by tests/integration/s3.sh.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "ckpt.h"
#include "format/layout.h"
#include "store/s3_http.h"
#include "store/store_s3.h"
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

/*
 * The arena of a saving rank.  ckptd sends an S3 shard in whole arena slots
 * (an eighth of the arena): one PUT if the shard fits one S3 part, else one
 * part per slot, and S3's parts are at least 5 MiB.  64 MiB (8 MiB slots)
 * takes any shard; with less, a shard larger than a slot but within one
 * part fails its save ("not whole (2 of 1 parts uploaded)": each slot went
 * up as the whole object).
 */
static uint64_t arena_for(const char *root)
{
	return strncmp(root, "s3://", 5) ? 16 * MiB : 64 * MiB;
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
	rc = td_connect_rc(a->sock, "loadjob", a->rank, s->world, arena_for(a->root), &c);
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

/* N rank processes save s under `root` (t->root, or an S3 root the daemon
 * allows) as checkpoint `name`. */
static void save_state(struct testd *t, const char *root, const struct state *s,
		       const struct cut *cuts, const char *name)
{
	struct td_child ch[MAX_R];
	struct rank_args a[MAX_R];

	for (uint32_t r = 0; r < s->world; r++) {
		a[r] = (struct rank_args){ .sock = td_sock(t, 0), .root = root, .name = name,
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
	save_state(&t, t.root, &s, cuts, "ckpt");
	td_path(path, sizeof(path), "%s/ckpt", t.root);
	for (uint32_t m = 0; m < M; m++)
		load_rank(m == 0 ? t.root : path, &s, m, M, m == 0);
	td_fini(&t);
}
END_TEST

/* ---- the failures ---- */

/* One rank saves "w" F32 [512, 1024] (2 MiB, three CRC pieces) and a blob
 * under `root` (t->root, or an S3 root the daemon allows). */
static void save_simple(struct testd *t, const char *root, const char *name, uint64_t step)
{
	struct ckpt_client *c = td_connect(td_sock(t, 0), "simple", 0, 1, arena_for(root));
	struct ckpt_save *s;
	uint64_t shape[2] = { 512, 1024 };
	float *w = malloc(512 * 1024 * 4);
	uint8_t b[100];
	char msg[256];
	int st, cm;

	td_fill(w, 512 * 1024 * 4, 77, 0);
	td_fill(b, sizeof(b), 78, 0);
	ck_assert_int_eq(ckpt_save_begin(c, root, name, step, &s), 0);
	td_add(s, "w", CKPT_F32, 2, shape, w);
	ck_assert_int_eq(ckpt_save_add_blob(s, "b", b, sizeof(b)), 0);
	ck_assert_int_eq(td_commit_wait(s, 60000, &st, &cm, msg, sizeof(msg)), 0);
	ck_assert_msg(st == 0 && cm == 0, "%s", msg);
	ckpt_save_free(s);
	ckpt_disconnect(c);
	free(w);
}

/* load_w loads through this client when set (reads by ckptd). */
static struct ckpt_client *load_w_via;

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
	if (load_w_via)
		ck_assert_int_eq(ckpt_load_set_client(ld, load_w_via), 0);
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
	save_simple(&t, t.root, "c", 1);
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
	save_simple(&t, t.root, "s", 1);
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
	save_simple(&t, t.root, "b-step7", 7);
	save_simple(&t, t.root, "a-step9", 9);
	save_simple(&t, t.root, "z-step3", 3);
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

/* ---- the same through S3 ---- */

/*
 * Run by tests/integration/s3.sh, which starts moto (signatures checked)
 * and sets S3_ENDPOINT, the AWS_* variables (the test process's reader
 * reads S3 with them) and CKPT_TEST_S3_ROOT; without a server they SKIP,
 * each check under its own name.  The daemon saves to a prefix of each
 * test's own under that root; the loads read the objects with ranged GETs
 * (store_s3.read_range) from the load's threads.
 *
 * Every S3 case saves before it first reads: the reader starts the
 * process's S3 client, whose transport thread a forked rank would not
 * have (td_child_start forks only while there is no library thread).
 */

/* The S3 root of the cases, or NULL after a SKIP naming check `name`. */
static const char *s3_base(const char *name)
{
	const char *base = getenv("CKPT_TEST_S3_ROOT"), *ep = getenv("S3_ENDPOINT");
	const char *py = getenv("CKPT_TEST_PYTHON");

	if (!base || !*base || !ep || !py || !*py) {
		td_skip(name, "no S3 server: tests/integration/s3.sh runs this with moto");
		return NULL;
	}
	return base;
}

/* Starts daemon 0 of t with its own S3 root <base>/<what>-<pid> as well as
 * t->root; the root is written to root[len]. */
static void s3_daemon_start(struct testd *t, const char *base, const char *what, char *root,
			    size_t len)
{
	char conf[2048];

	ck_assert_int_lt(snprintf(root, len, "%s/%s-%d", base, what, (int)getpid()), (int)len);
	snprintf(conf, sizeof(conf), "arena_max = 64M\ncommit_deadline = 90s\nroot = %s\n"
		 "s3_endpoint = %s\ns3_retries = 4\ns3_backoff_base = 20ms\n", root,
		 getenv("S3_ENDPOINT"));
	ck_assert_int_eq(td_daemon_start(t, 0, conf), 0);
}

/*
 * Changes the bucket behind the library's back with boto3 (a client we did
 * not write), under the root URL:
 *   put  URL REL TEXT   object REL = TEXT
 *   flip URL CKPT OFF   rank 0's shard of checkpoint CKPT: byte OFF ^= 0x10
 *   cut  URL CKPT LEN   the same shard cut to LEN bytes
 *   rm   URL CKPT       the same shard deleted
 * The shard ops print the shard's file name (as the manifest lists it).
 */
static const char s3_edit_py[] =
	"import os, sys\n"
	"import boto3\n"
	"op, url = sys.argv[1:3]\n"
	"bucket, _, pre = url[5:].partition('/')\n"
	"pre = pre.rstrip('/') + '/' if pre else ''\n"
	"s3 = boto3.client('s3', endpoint_url=os.environ['S3_ENDPOINT'],\n"
	"                  region_name=os.environ.get('AWS_REGION', 'us-east-1'))\n"
	"if op == 'put':\n"
	"    s3.put_object(Bucket=bucket, Key=pre + sys.argv[3], Body=sys.argv[4].encode())\n"
	"    sys.exit(0)\n"
	"d = pre + sys.argv[3] + '/'\n"
	"got = s3.list_objects_v2(Bucket=bucket, Prefix=d + 'rank-00000.').get('Contents', [])\n"
	"assert len(got) == 1, [o['Key'] for o in got]\n"
	"key = got[0]['Key']\n"
	"if op == 'rm':\n"
	"    s3.delete_object(Bucket=bucket, Key=key)\n"
	"else:\n"
	"    body = bytearray(s3.get_object(Bucket=bucket, Key=key)['Body'].read())\n"
	"    n = int(sys.argv[4])\n"
	"    assert n < len(body), (n, len(body))\n"
	"    if op == 'flip':\n"
	"        body[n] ^= 0x10\n"
	"    else:\n"
	"        del body[n:]\n"
	"    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))\n"
	"print(key[len(d):])\n";

/* Runs one s3_edit_py op (arg2 may be NULL); asserts it worked and copies
 * the first line it printed to out[len] (may be NULL). */
static void s3_edit(const char *op, const char *url, const char *arg1, const char *arg2,
		    char *out, size_t len)
{
	char *argv[] = { (char *)getenv("CKPT_TEST_PYTHON"), "-c", (char *)s3_edit_py,
			 (char *)op, (char *)url, (char *)arg1, (char *)arg2, NULL };
	char *said = NULL;
	int st = td_run_capture(argv, 60000, &said);

	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "boto3 %s %s %s: %s: %s",
		      op, url, arg1, td_status_str(st), said ? said : "");
	if (out) {
		ck_assert_ptr_nonnull(said);
		snprintf(out, len, "%.*s", (int)strcspn(said, "\n"), said);
		ck_assert_msg(out[0], "boto3 %s printed no name", op);
	}
	free(said);
}

/* N ranks save to S3, M load from it (rank 0 through latest): the pairs of
 * the loop, each with its own random state. */
START_TEST(test_s3_reshard)
{
	static const uint32_t pairs[][2] = { { 2, 3 }, { 4, 1 }, { 1, 4 }, { 8, 3 } };
	uint32_t N = pairs[_i][0], M = pairs[_i][1];
	struct testd t;
	struct state s;
	struct cut cuts[MAX_T];
	char name[32], root[1024], path[1100];
	const char *base;

	snprintf(name, sizeof(name), "s3_reshard_%ux%u", N, M);
	base = s3_base(name);
	if (!base)
		return;
	rng_state = 0x53E0AD00u + (uint64_t)_i;
	td_init(&t, name);
	s3_daemon_start(&t, base, name, root, sizeof(root));
	random_state(&s, N, 40 + (unsigned)_i, cuts);
	save_state(&t, root, &s, cuts, "ckpt");
	snprintf(path, sizeof(path), "%s/ckpt", root);
	for (uint32_t m = 0; m < M; m++)
		load_rank(m == 0 ? root : path, &s, m, M, m == 0);
	td_fini(&t);
}
END_TEST

/* Bytes the process's S3 client has downloaded so far (its counters are
 * exact once the requests that moved them have returned). */
static uint64_t s3_bytes_down(void)
{
	struct s3_stats st;

	ck_assert_ptr_nonnull(store_s3_client());
	s3_client_stats(store_s3_client(), &st);
	return st.bytes_down;
}

/* A small box of a big tensor is fetched with ranged GETs: what goes over
 * the wire is the box widened to its CRC pieces, not the object. */
START_TEST(test_s3_ranged)
{
	enum { ROWS = 4096, COLS = 1024, R0 = 2000, NR = 8 };
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *sv;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct ckpt_future *done;
	uint64_t shape[2] = { ROWS, COLS }, offs[2] = { R0, 0 }, box[2] = { NR, COLS };
	struct ckpt_load_stats st = { CKPT_LOAD_STATS_INIT };
	float *w = malloc((size_t)ROWS * COLS * 4), *part = malloc((size_t)NR * COLS * 4);
	char root[1024], path[1100], msg[256];
	const char *base = s3_base("s3_ranged");
	uint64_t before, down;
	int sst, cm;

	if (!base) {
		free(w);
		free(part);
		return;
	}
	ck_assert_ptr_nonnull(w);
	ck_assert_ptr_nonnull(part);
	td_init(&t, "s3_ranged");
	s3_daemon_start(&t, base, "ranged", root, sizeof(root));
	td_fill(w, (size_t)ROWS * COLS * 4, 91, 0);
	c = td_connect(td_sock(&t, 0), "ranged", 0, 1, arena_for(root));
	ck_assert_int_eq(ckpt_save_begin(c, root, "big", 1, &sv), 0);
	td_add(sv, "w", CKPT_F32, 2, shape, w);
	ck_assert_int_eq(td_commit_wait(sv, 90000, &sst, &cm, msg, sizeof(msg)), 0);
	ck_assert_msg(sst == 0 && cm == 0, "%s", msg);
	ckpt_save_free(sv);
	ckpt_disconnect(c);
	free(w);

	snprintf(path, sizeof(path), "%s/big", root);
	ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
	struct ckpt_load_dst d = { CKPT_LOAD_DST_INIT, .offsets = offs, .shape = box,
				   .data = part };
	struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_F32, .name = "w",
				       .global_shape = shape, .ndim = 2, .n_dsts = 1, .dsts = &d };
	ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
	ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
	before = s3_bytes_down();
	ck_assert_int_eq(ckpt_load_start(ld, &done), 0);
	ck_assert_msg(td_future_wait(done, 60000) == 0, "%s", ckpt_future_error(done));
	down = s3_bytes_down() - before;
	ck_assert_int_eq(td_check(part, (size_t)NR * COLS * 4, 91, (uint64_t)R0 * COLS * 4), -1);
	ck_assert_int_eq(ckpt_load_stats(ld, &st), 0);
	ck_assert_uint_eq(st.bytes_wanted, NR * COLS * 4);
	ck_assert_uint_eq(st.reads, 1);
	/* 32 KiB inside one or two 1 MiB pieces of a 16 MiB object. */
	ck_assert_uint_ge(st.bytes_read, st.bytes_wanted);
	ck_assert_uint_le(st.bytes_read, 2 * LAYOUT_CRC_BLOCK);
	ck_assert_msg(down == st.bytes_read, "%llu bytes downloaded for a plan of %llu",
		      (unsigned long long)down, (unsigned long long)st.bytes_read);
	ckpt_load_free(ld);
	ckpt_reader_close(rd);
	free(part);
	td_fini(&t);
}
END_TEST

/* An S3 checkpoint saved by a resident client loads from ckptd's memory:
 * not one byte comes from S3, and the bytes are the saved ones.  The same
 * load of another job's client reads S3 (the image is not its own), through
 * ckptd's ranged GETs. */
START_TEST(test_s3_resident)
{
	enum { N = 3 * 1024 * 1024 + 77 };
	struct testd t;
	struct ckpt_connect_opts o = { CKPT_CONNECT_OPTS_INIT };
	struct ckpt_client *c, *other;
	struct ckpt_save *sv;
	uint64_t shape[1] = { N };
	uint8_t *w = malloc(N), *back = malloc(N);
	char root[1024], path[1100], msg[256];
	const char *base = s3_base("s3_resident");
	int sst, cm;

	if (!base) {
		free(w);
		free(back);
		return;
	}
	td_init(&t, "s3_resident");
	s3_daemon_start(&t, base, "resident", root, sizeof(root));
	td_fill(w, N, 93, 0);
	o.world = 1;
	o.job = "resident";
	o.run = "";
	o.socket_path = td_sock(&t, 0);
	o.arena_bytes = arena_for(root);
	o.flags = CKPT_CONNECT_RESIDENT;
	ck_assert_msg(ckpt_connect(&o, &c) == 0, "%s", ckpt_last_error());
	ck_assert_int_eq(ckpt_save_begin(c, root, "ram", 1, &sv), 0);
	td_add(sv, "w", CKPT_U8, 1, shape, w);
	ck_assert_int_eq(td_commit_wait(sv, 90000, &sst, &cm, msg, sizeof(msg)), 0);
	ck_assert_msg(sst == 0 && cm == 0, "%s", msg);
	ckpt_save_free(sv);
	o.flags = 0;
	o.job = "stranger";
	ck_assert_msg(ckpt_connect(&o, &other) == 0, "%s", ckpt_last_error());

	snprintf(path, sizeof(path), "%s/ram", root);
	for (int k = 0; k < 2; k++) {
		struct ckpt_reader *rd;
		struct ckpt_load *ld;
		struct ckpt_future *done;
		struct ckpt_load_stats st = { CKPT_LOAD_STATS_INIT };
		uint64_t offs[1] = { 0 }, before;
		struct ckpt_load_dst d = { CKPT_LOAD_DST_INIT, .offsets = offs, .shape = shape,
					   .data = back };
		struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_U8,
					       .name = "w", .global_shape = shape, .ndim = 1,
					       .n_dsts = 1, .dsts = &d };

		memset(back, 0, N);
		ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
		ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
		ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
		/* The image is handed over once the saving rank is done with
		 * (between loop rounds after the commit): a moment at most. */
		ck_assert_int_eq(ckpt_load_set_client(ld, k == 0 ? c : other), 0);
		before = s3_bytes_down();
		ck_assert_int_eq(ckpt_load_start(ld, &done), 0);
		ck_assert_msg(td_future_wait(done, 60000) == 0, "%s", ckpt_future_error(done));
		ck_assert_int_eq(ckpt_load_stats(ld, &st), 0);
		ck_assert_msg(memcmp(back, w, N) == 0, "load %d: bytes differ", k);
		/* Not one byte by the library's own S3 client: from the
		 * image, or (another job's) GET by ckptd. */
		ck_assert_uint_eq(s3_bytes_down() - before, 0);
		if (k == 0) {
			ck_assert_uint_eq(st.files_resident, 1);
			ck_assert_uint_eq(st.bytes_resident, st.bytes_read);
			ck_assert_uint_eq(st.bytes_daemon, 0);
		} else {
			ck_assert_uint_eq(st.files_resident, 0);
			ck_assert_uint_eq(st.bytes_daemon, st.bytes_read);
		}
		ckpt_load_free(ld);
		ckpt_reader_close(rd);
	}
	ckpt_disconnect(other);
	ckpt_disconnect(c);
	free(w);
	free(back);
	td_fini(&t);
}
END_TEST

/* One load of all of tensor w [rows, cols] f32 of path through client c
 * into buf, started (the future in *ret_done, the load in *ret_ld). */
static void s3q_start(const char *path, struct ckpt_client *c, uint64_t *shape, float *buf,
		      struct ckpt_reader **ret_rd, struct ckpt_load **ret_ld,
		      struct ckpt_future **ret_done)
{
	static uint64_t zero[2];
	struct ckpt_load_dst d = { CKPT_LOAD_DST_INIT, .offsets = zero, .shape = shape,
				   .data = buf };
	struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_F32, .name = "w",
				       .global_shape = shape, .ndim = 2, .n_dsts = 1, .dsts = &d };

	ck_assert_int_eq(ckpt_reader_open(path, ret_rd), 0);
	ck_assert_int_eq(ckpt_load_begin(*ret_rd, 0, ret_ld), 0);
	ck_assert_int_eq(ckpt_load_add_tensor(*ret_ld, &lt), 0);
	ck_assert_int_eq(ckpt_load_set_client(*ret_ld, c), 0);
	ck_assert_int_eq(ckpt_load_start(*ret_ld, ret_done), 0);
}

struct s3q_args {
	const char *sock, *path;
	uint64_t *shape;
};

/* A trainer that dies in the middle of its S3 load (reads queued in ckptd
 * for its connection): connects, starts the load, says so, _exit()s. */
static int s3q_quitter(void *arg, int rep, int go)
{
	struct s3q_args *a = arg;
	struct ckpt_connect_opts o = { CKPT_CONNECT_OPTS_INIT };
	struct ckpt_client *c;
	struct ckpt_reader *rd;
	struct ckpt_load *ld;
	struct ckpt_future *done;
	float *buf = malloc(a->shape[0] * a->shape[1] * 4);
	static uint64_t zero[2];

	(void)go;
	o.socket_path = a->sock;
	o.job = "s3q-quitter";
	o.world = 1;
	o.arena_bytes = 64ull << 20;
	if (!buf || ckpt_connect(&o, &c) < 0 || ckpt_reader_open(a->path, &rd) < 0)
		return 2;
	struct ckpt_load_dst d = { CKPT_LOAD_DST_INIT, .offsets = zero, .shape = a->shape,
				   .data = buf };
	struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_F32, .name = "w",
				       .global_shape = a->shape, .ndim = 2, .n_dsts = 1,
				       .dsts = &d };
	if (ckpt_load_begin(rd, 0, &ld) < 0 || ckpt_load_add_tensor(ld, &lt) < 0 ||
	    ckpt_load_set_client(ld, c) < 0 || ckpt_load_start(ld, &done) < 0)
		return 3;
	usleep(30 * 1000);
	td_report(rep, "started");
	_exit(0);
}

/*
 * ckptd's S3 reads with one worker (s3_parts_in_flight = 1), so reads wait
 * in its queue: a trainer dies with reads of its load queued (they end
 * unread, the daemon goes on), then two clients load at once, taking the
 * worker in turn; both get every byte through ckptd, and the daemon stops
 * cleanly.
 */
START_TEST(test_s3_queue)
{
	enum { ROWS = 24576, COLS = 1024 }; /* 96 MiB: three 32 MiB reads a load */
	struct testd t;
	struct td_child ch;
	struct ckpt_client *c, *l[2];
	struct ckpt_save *sv;
	uint64_t shape[2] = { ROWS, COLS };
	size_t bytes = (size_t)ROWS * COLS * 4;
	float *w = malloc(bytes), *back[2] = { malloc(bytes), malloc(bytes) };
	char root[1024], path[1100], msg[256], conf[2048];
	const char *base = s3_base("s3_queue");
	struct s3q_args a;
	int sst, cm, st;

	if (!base) {
		free(w);
		free(back[0]);
		free(back[1]);
		return;
	}
	ck_assert_ptr_nonnull(w);
	td_init(&t, "s3_queue");
	ck_assert_int_lt(snprintf(root, sizeof(root), "%s/queue-%d", base, (int)getpid()),
			 (int)sizeof(root));
	snprintf(conf, sizeof(conf), "arena_max = 64M\ncommit_deadline = 90s\nroot = %s\n"
		 "s3_endpoint = %s\ns3_retries = 4\ns3_parts_in_flight = 1\n", root,
		 getenv("S3_ENDPOINT"));
	ck_assert_int_eq(td_daemon_start(&t, 0, conf), 0);
	td_fill(w, bytes, 97, 0);
	c = td_connect(td_sock(&t, 0), "s3q", 0, 1, 64ull << 20);
	ck_assert_int_eq(ckpt_save_begin(c, root, "q", 1, &sv), 0);
	td_add(sv, "w", CKPT_F32, 2, shape, w);
	ck_assert_int_eq(td_commit_wait(sv, 180000, &sst, &cm, msg, sizeof(msg)), 0);
	ck_assert_msg(sst == 0 && cm == 0, "%s", msg);
	ckpt_save_free(sv);
	ckpt_disconnect(c);
	snprintf(path, sizeof(path), "%s/q", root);

	a = (struct s3q_args){ .sock = td_sock(&t, 0), .path = path, .shape = shape };
	ck_assert_int_eq(td_child_start(&ch, s3q_quitter, &a), 0);
	ck_assert_int_eq(td_child_expect(&ch, "started", 60000, NULL, 0), 0);
	st = td_child_wait(&ch, 30000);
	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the quitter: %s",
		      td_status_str(st));

	struct ckpt_reader *rd[2];
	struct ckpt_load *ld[2];
	struct ckpt_future *done[2];
	for (int k = 0; k < 2; k++) {
		l[k] = td_connect(td_sock(&t, 0), k ? "s3q-b" : "s3q-a", 0, 1, 64ull << 20);
		memset(back[k], 0, bytes);
	}
	for (int k = 0; k < 2; k++)
		s3q_start(path, l[k], shape, back[k], &rd[k], &ld[k], &done[k]);
	for (int k = 0; k < 2; k++) {
		struct ckpt_load_stats ls = { CKPT_LOAD_STATS_INIT };

		ck_assert_msg(td_future_wait(done[k], 120000) == 0, "load %d: %s", k,
			      ckpt_future_error(done[k]));
		ck_assert_int_eq(ckpt_load_stats(ld[k], &ls), 0);
		ck_assert_msg(memcmp(back[k], w, bytes) == 0, "load %d: bytes differ", k);
		ck_assert_uint_eq(ls.bytes_daemon, ls.bytes_read);
		ck_assert_uint_ge(ls.reads, 3);
		ckpt_load_free(ld[k]);
		ckpt_reader_close(rd[k]);
		ckpt_disconnect(l[k]);
	}
	st = td_daemon_stop(&t, 0);
	ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "ckptd stopped with %s",
		      td_status_str(st));
	free(w);
	free(back[0]);
	free(back[1]);
	td_fini(&t);
}
END_TEST

/* What the library logged at WARNING or above. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_seen[4096];

static void keep_warnings(enum ckpt_log_level level, const char *msg, void *ud)
{
	(void)ud;
	if (level > CKPT_LOG_WARNING)
		return;
	pthread_mutex_lock(&log_lock);
	size_t n = strlen(log_seen);
	snprintf(log_seen + n, sizeof(log_seen) - n, "%s\n", msg);
	pthread_mutex_unlock(&log_lock);
}

/* latest on an S3 root: the greatest step among the committed checkpoints;
 * never a prefix with a shard and no manifest, nor a work area (whose
 * attempt.json says step 99); a manifest that does not parse (step 100) is
 * skipped with a warning; the root may end with '/'. */
START_TEST(test_s3_latest)
{
	struct testd t;
	struct ckpt_reader *rd;
	char root[1024], slash[1100], nobucket[64];
	const char *base = s3_base("s3_latest");
	float *w = malloc(512 * 1024 * 4);
	char msg[1024];
	int start;

	if (!base) {
		free(w);
		return;
	}
	ck_assert_ptr_nonnull(w);
	td_init(&t, "s3_latest");
	s3_daemon_start(&t, base, "latest", root, sizeof(root));
	/* The saves below run in this process (no fork): the reader may
	 * start the S3 client first. */
	ck_assert_int_eq(ckpt_reader_open_latest(root, &rd), -ENOENT);
	ck_assert_msg(strstr(ckpt_last_error(), "no committed checkpoint"), "%s",
		      ckpt_last_error());
	save_simple(&t, root, "b-step7", 7);
	save_simple(&t, root, "a-step9", 9);
	save_simple(&t, root, "z-step3", 3);
	s3_edit("put", root, "zz-partial/rank-00000.0123456789abcdef.safetensors", "not a shard",
		NULL, 0);
	s3_edit("put", root, ".ckpt-work-0123456789abcdef0123456789abcdef/attempt.json",
		"{\"format\": \"ckpt-attempt-1\", \"name\": \"zz-next\", \"step\": 99}", NULL, 0);
	s3_edit("put", root, "zz-bad/manifest.json", "{\"step\": 100, not json", NULL, 0);
	s3_edit("put", root, "zz-bad/rank-00000.0123456789abcdef.safetensors", "x", NULL, 0);

	log_seen[0] = '\0';
	ckpt_set_log_fn(keep_warnings, NULL);
	int r = ckpt_reader_open_latest(root, &rd);
	ckpt_set_log_fn(NULL, NULL);
	ck_assert_msg(r == 0, "open_latest: %d %s", r, ckpt_last_error());
	ck_assert_uint_eq(ckpt_reader_step(rd), 9);
	ckpt_reader_close(rd);
	ck_assert_msg(strstr(log_seen, "skipping") && strstr(log_seen, "/zz-bad'") &&
			      !strstr(log_seen, "zz-partial") && !strstr(log_seen, ".ckpt-work-"),
		      "warnings: %s", log_seen);

	/* The same with a '/' after the root; step 9's bytes read back. */
	snprintf(slash, sizeof(slash), "%s/", root);
	ck_assert_int_eq(ckpt_reader_open_latest(slash, &rd), 0);
	ck_assert_uint_eq(ckpt_reader_step(rd), 9);
	ckpt_reader_close(rd);
	snprintf(slash, sizeof(slash), "%s/a-step9", root);
	ck_assert_int_eq(load_w(slash, 0, w, &start, msg, sizeof(msg)), 0);
	ck_assert_int_eq(td_check(w, 512 * 1024 * 4, 77, 0), -1);

	/* A bucket that does not exist holds no checkpoint, and is named;
	 * a root the URL parser refuses (an empty segment) says why. */
	snprintf(nobucket, sizeof(nobucket), "s3://no-such-bucket-ckpt-%d/x", (int)getpid());
	ck_assert_int_eq(ckpt_reader_open_latest(nobucket, &rd), -ENOENT);
	ck_assert_msg(strstr(ckpt_last_error(), nobucket + 5) &&
			      strstr(ckpt_last_error(), "does not exist"),
		      "%s", ckpt_last_error());
	snprintf(slash, sizeof(slash), "%s//x", root);
	ck_assert_int_eq(ckpt_reader_open_latest(slash, &rd), -EINVAL);
	ck_assert_msg(strstr(ckpt_last_error(), "empty"), "%s", ckpt_last_error());
	free(w);
	td_fini(&t);
}
END_TEST

/* Damage on S3, done with boto3: a flipped byte fails the load with the
 * CRC message naming file, tensor and offset; a cut object says
 * truncated; a deleted one names the missing object. */
START_TEST(test_s3_corrupt)
{
	struct testd t;
	char root[1024], path[1100], off[32], file[256], msg[1024], name[32];
	const char *base;
	float *w = malloc(512 * 1024 * 4);
	int start, rc;

	/* _i 1: every load through a client, so ckptd's ranged GETs read
	 * the object and the library checks what they brought. */
	snprintf(name, sizeof(name), "s3_corrupt%s", _i ? "_via" : "");
	base = s3_base(name);
	if (!base) {
		free(w);
		return;
	}
	ck_assert_ptr_nonnull(w);
	td_init(&t, name);
	s3_daemon_start(&t, base, name, root, sizeof(root));
	save_simple(&t, root, "c", 1);
	if (_i)
		load_w_via = td_connect(td_sock(&t, 0), "corrupt-reader", 0, 1, arena_for(root));
	snprintf(path, sizeof(path), "%s/c", root);
	ck_assert_int_eq(load_w(path, 0, w, &start, msg, sizeof(msg)), 0);
	ck_assert_int_eq(td_check(w, 512 * 1024 * 4, 77, 0), -1);

	/* A flipped byte in the second MiB of the object. */
	snprintf(off, sizeof(off), "%llu", MiB + 12345);
	s3_edit("flip", root, "c", off, file, sizeof(file));
	rc = load_w(path, 0, w, &start, msg, sizeof(msg));
	ck_assert_int_eq(start, 0);
	ck_assert_int_eq(rc, -EBADMSG);
	ck_assert_msg(strstr(msg, "CRC mismatch") && strstr(msg, file) && strstr(msg, "'w'") &&
			      strstr(msg, "offset 1048576"),
		      "%s (shard %s)", msg, file);

	/* Cut in the middle of w: the ranged GET comes back short. */
	snprintf(off, sizeof(off), "%llu", MiB + 100);
	s3_edit("cut", root, "c", off, NULL, 0);
	rc = load_w(path, 0, w, &start, msg, sizeof(msg));
	ck_assert_int_eq(rc, -EBADMSG);
	ck_assert_msg(strstr(msg, "truncated") && strstr(msg, file), "%s", msg);

	/* Cut before w begins: S3 answers 416 InvalidRange, still "truncated". */
	s3_edit("cut", root, "c", "1000", NULL, 0);
	rc = load_w(path, 0, w, &start, msg, sizeof(msg));
	ck_assert_int_eq(rc, -EBADMSG);
	ck_assert_msg(strstr(msg, "truncated") && strstr(msg, file), "%s", msg);

	/* The object is gone. */
	s3_edit("rm", root, "c", NULL, NULL, 0);
	rc = load_w(path, 0, w, &start, msg, sizeof(msg));
	ck_assert_int_eq(rc, -ENOENT);
	ck_assert_msg(strstr(msg, file) && strstr(msg, root), "%s", msg);
	if (load_w_via) {
		ckpt_disconnect(load_w_via);
		load_w_via = NULL;
	}
	free(w);
	td_fini(&t);
}
END_TEST

/*
 * Loads of S3 checkpoints through a client: ckptd GETs the shards into the
 * client's arena (the library's own S3 client downloads nothing), for a
 * whole tensor and for a box in the middle of one.  A daemon whose roots
 * do not hold the checkpoint refuses (its credentials serve its roots
 * only); the library then GETs the shards itself, with a warning, and the
 * bytes are the same.
 */
START_TEST(test_s3_daemon)
{
	enum { ROWS = 3000, COLS = 1024 };
	struct testd t;
	struct ckpt_client *c, *stranger;
	struct ckpt_save *sv;
	uint64_t shape[2] = { ROWS, COLS };
	float *w = malloc((size_t)ROWS * COLS * 4), *back = malloc((size_t)ROWS * COLS * 4);
	char root[1024], path[1100], msg[256], conf[2048];
	const char *base = s3_base("s3_daemon");
	int sst, cm;

	if (!base) {
		free(w);
		free(back);
		return;
	}
	td_init(&t, "s3_daemon");
	s3_daemon_start(&t, base, "daemon", root, sizeof(root));
	/* Daemon 1: the same bucket and credentials, only a local root. */
	snprintf(conf, sizeof(conf), "arena_max = 64M\ns3_endpoint = %s\ns3_retries = 4\n",
		 getenv("S3_ENDPOINT"));
	ck_assert_int_eq(td_daemon_start(&t, 1, conf), 0);
	td_fill(w, (size_t)ROWS * COLS * 4, 95, 0);
	c = td_connect(td_sock(&t, 0), "s3-daemon", 0, 1, arena_for(root));
	ck_assert_int_eq(ckpt_save_begin(c, root, "d", 1, &sv), 0);
	td_add(sv, "w", CKPT_F32, 2, shape, w);
	ck_assert_int_eq(td_commit_wait(sv, 90000, &sst, &cm, msg, sizeof(msg)), 0);
	ck_assert_msg(sst == 0 && cm == 0, "%s", msg);
	ckpt_save_free(sv);
	stranger = td_connect(td_sock(&t, 1), "s3-daemon", 0, 1, 64ull << 20);
	snprintf(path, sizeof(path), "%s/d", root);

	/* k 0, 1: through daemon 0 (whole, then rows [1001, 1777)); k 2:
	 * through daemon 1, which refuses. */
	for (int k = 0; k < 3; k++) {
		struct ckpt_reader *rd;
		struct ckpt_load *ld;
		struct ckpt_future *done;
		struct ckpt_load_stats st = { CKPT_LOAD_STATS_INIT };
		uint64_t r0 = k == 1 ? 1001 : 0, nr = k == 1 ? 776 : ROWS, before;
		uint64_t offs[2] = { r0, 0 }, box[2] = { nr, COLS };
		size_t bytes = (size_t)(nr * COLS * 4);
		struct ckpt_load_dst d = { CKPT_LOAD_DST_INIT, .offsets = offs, .shape = box,
					   .data = back };
		struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_F32,
					       .name = "w", .global_shape = shape, .ndim = 2,
					       .n_dsts = 1, .dsts = &d };

		memset(back, 0xA5, (size_t)ROWS * COLS * 4);
		ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
		ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
		ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
		ck_assert_int_eq(ckpt_load_set_client(ld, k < 2 ? c : stranger), 0);
		if (k == 2) {
			log_seen[0] = '\0';
			ckpt_set_log_fn(keep_warnings, NULL);
		}
		before = s3_bytes_down();
		ck_assert_int_eq(ckpt_load_start(ld, &done), 0);
		ck_assert_msg(td_future_wait(done, 60000) == 0, "load %d: %s", k,
			      ckpt_future_error(done));
		if (k == 2)
			ckpt_set_log_fn(NULL, NULL);
		ck_assert_int_eq(ckpt_load_stats(ld, &st), 0);
		ck_assert_int_eq(td_check(back, bytes, 95, r0 * COLS * 4), -1);
		/* Nothing written past the box. */
		for (size_t i = bytes; i < (size_t)ROWS * COLS * 4; i++)
			ck_assert_msg(((uint8_t *)back)[i] == 0xA5, "load %d wrote byte %zu", k, i);
		if (k < 2) {
			ck_assert_msg(st.bytes_daemon == st.bytes_read,
				      "load %d: %llu of %llu bytes through ckptd", k,
				      (unsigned long long)st.bytes_daemon,
				      (unsigned long long)st.bytes_read);
			ck_assert_uint_eq(s3_bytes_down() - before, 0);
		} else {
			ck_assert_uint_eq(st.bytes_daemon, 0);
			ck_assert_uint_eq(s3_bytes_down() - before, st.bytes_read);
			ck_assert_msg(strstr(log_seen, "not below an S3 root"), "no warning: '%s'",
				      log_seen);
		}
		ckpt_load_free(ld);
		ckpt_reader_close(rd);
	}
	ckpt_disconnect(stranger);
	ckpt_disconnect(c);
	free(w);
	free(back);
	td_fini(&t);
}
END_TEST

/* An S3 checkpoint saved through the spill tier loads from this node's copy
 * in the spill cache (no byte from S3), every block checked against the
 * manifest from S3: a copy with a flipped byte is left for S3, with a
 * warning, and the load still gets the right bytes. */
START_TEST(test_s3_spill)
{
	enum { N = 3 * 1024 * 1024 + 77 };
	struct testd t;
	struct ckpt_connect_opts o = { CKPT_CONNECT_OPTS_INIT };
	struct ckpt_client *c;
	struct ckpt_save *sv;
	uint64_t shape[1] = { N };
	uint8_t *w = malloc(N), *back = malloc(N);
	char root[1024], path[1100], msg[256], conf[2048], spill[TD_PATH], cache[TD_PATH * 2];
	char shard[TD_PATH * 3] = "";
	const char *base = s3_base("s3_spill");
	int sst, cm;

	if (!base) {
		free(w);
		free(back);
		return;
	}
	td_init(&t, "s3_spill");
	ck_assert_int_lt(snprintf(root, sizeof(root), "%s/spill-%d", base, (int)getpid()),
			 (int)sizeof(root));
	td_path(spill, sizeof(spill), "%s/spill", t.dir);
	snprintf(conf, sizeof(conf), "arena_max = 64M\ncommit_deadline = 90s\nroot = %s\n"
		 "s3_endpoint = %s\ns3_retries = 4\ns3_backoff_base = 20ms\ns3_spill_dir = %s\n",
		 root, getenv("S3_ENDPOINT"), spill);
	ck_assert_int_eq(td_daemon_start(&t, 0, conf), 0);
	td_fill(w, N, 94, 0);
	o.world = 1;
	o.job = "spill";
	o.run = "";
	o.socket_path = td_sock(&t, 0);
	o.arena_bytes = arena_for(root);
	ck_assert_msg(ckpt_connect(&o, &c) == 0, "%s", ckpt_last_error());
	ck_assert_int_eq(ckpt_save_begin(c, root, "sp", 1, &sv), 0);
	td_add(sv, "w", CKPT_U8, 1, shape, w);
	ck_assert_int_eq(td_commit_wait(sv, 90000, &sst, &cm, msg, sizeof(msg)), 0);
	ck_assert_msg(sst == 0 && cm == 0, "%s", msg);
	ckpt_save_free(sv);

	/* The cache keeps the committed copy: <spill>/<uid>/cache/<hash>/sp/. */
	{
		char d[TD_PATH + 32];
		DIR *dir;
		struct dirent *e;
		int64_t end = td_now_ms() + 15000;

		snprintf(d, sizeof(d), "%s/%u/cache", spill, (unsigned)geteuid());
		while (!shard[0] && td_now_ms() < end) {
			dir = opendir(d);
			while (dir && (e = readdir(dir)))
				if (e->d_name[0] != '.')
					snprintf(cache, sizeof(cache), "%s/%s/sp", d, e->d_name);
			if (dir)
				closedir(dir);
			dir = cache[0] ? opendir(cache) : NULL;
			while (dir && (e = readdir(dir)))
				if (!strncmp(e->d_name, "rank-00000", 10))
					snprintf(shard, sizeof(shard), "%s/%s", cache, e->d_name);
			if (dir)
				closedir(dir);
			if (!shard[0])
				td_sleep_ms(50);
		}
		ck_assert_msg(shard[0], "no copy of rank 0's shard under %s", d);
	}

	snprintf(path, sizeof(path), "%s/sp", root);
	for (int k = 0; k < 3; k++) {
		struct ckpt_reader *rd;
		struct ckpt_load *ld;
		struct ckpt_future *done;
		struct ckpt_load_stats st = { CKPT_LOAD_STATS_INIT };
		uint64_t offs[1] = { 0 }, before;
		struct ckpt_load_dst d = { CKPT_LOAD_DST_INIT, .offsets = offs, .shape = shape,
					   .data = back };
		struct ckpt_load_tensor lt = { CKPT_LOAD_TENSOR_INIT, .dtype = CKPT_U8,
					       .name = "w", .global_shape = shape, .ndim = 1,
					       .n_dsts = 1, .dsts = &d };

		if (k == 1) {
			/* A byte of the local copy flipped: S3 serves that file. */
			int fd = open(shard, O_RDWR | O_CLOEXEC);
			uint8_t b;
			ck_assert_int_ge(fd, 0);
			ck_assert_int_eq(pread(fd, &b, 1, 4096 + 1000), 1);
			b ^= 0x40;
			ck_assert_int_eq(pwrite(fd, &b, 1, 4096 + 1000), 1);
			close(fd);
			pthread_mutex_lock(&log_lock);
			log_seen[0] = '\0';
			pthread_mutex_unlock(&log_lock);
			ckpt_set_log_fn(keep_warnings, NULL);
		}
		memset(back, 0, N);
		ck_assert_int_eq(ckpt_reader_open(path, &rd), 0);
		ck_assert_int_eq(ckpt_load_begin(rd, 0, &ld), 0);
		ck_assert_int_eq(ckpt_load_add_tensor(ld, &lt), 0);
		if (k < 2)
			ck_assert_int_eq(ckpt_load_set_client(ld, c), 0);
		before = s3_bytes_down();
		ck_assert_int_eq(ckpt_load_start(ld, &done), 0);
		ck_assert_msg(td_future_wait(done, 60000) == 0, "%s", ckpt_future_error(done));
		ck_assert_int_eq(ckpt_load_stats(ld, &st), 0);
		ck_assert_msg(memcmp(back, w, N) == 0, "load %d: bytes differ", k);
		ck_assert_uint_eq(st.bytes_resident, 0);
		if (k == 0) {
			ck_assert_uint_eq(st.files_local, 1);
			ck_assert_uint_eq(st.bytes_local, st.bytes_read);
			ck_assert_uint_eq(s3_bytes_down() - before, 0);
		} else {
			/* The flipped copy (k 1), or no client (k 2): S3. */
			ck_assert_uint_eq(st.files_local, 0);
			ck_assert_uint_gt(s3_bytes_down() - before, 0);
		}
		if (k == 1) {
			ckpt_set_log_fn(NULL, NULL);
			pthread_mutex_lock(&log_lock);
			ck_assert_msg(strstr(log_seen, "local copy") != NULL, "no warning: '%s'",
				      log_seen);
			pthread_mutex_unlock(&log_lock);
		}
		ckpt_load_free(ld);
		ckpt_reader_close(rd);
	}
	ckpt_disconnect(c);
	free(w);
	free(back);
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
	/* One case, so that s3.sh runs them all with CK_RUN_CASE=s3. */
	TCase *tc = tcase_create("s3");
	tcase_set_timeout(tc, 240);
	tcase_add_loop_test(tc, test_s3_reshard, 0, 4);
	tcase_add_test(tc, test_s3_ranged);
	tcase_add_test(tc, test_s3_resident);
	tcase_add_test(tc, test_s3_latest);
	tcase_add_loop_test(tc, test_s3_corrupt, 0, 2);
	tcase_add_test(tc, test_s3_daemon);
	tcase_add_test(tc, test_s3_queue);
	tcase_add_test(tc, test_s3_spill);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return td_main(load_suite(), "check_load");
}
