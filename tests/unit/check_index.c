/* SPDX-License-Identifier: MIT */
/* check_index.c - per-rank indexes, their merge, and the manifest parser. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "format/index.h"
#include "format/layout.h"
#include "format/safetensors.h"

#define JOB  "job-1"
#define NAME "step-5"
#define T_2026 1795403376 /* 2026-11-23T03:09:36Z */

static char tmpdir[64];
static int dirfd_ = -1;

static void setup(void)
{
	strcpy(tmpdir, "/tmp/check_index-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
	dirfd_ = open(tmpdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ck_assert_int_ge(dirfd_, 0);
}

static void teardown(void)
{
	DIR *d = opendir(tmpdir);
	struct dirent *e;

	while (d && (e = readdir(d)))
		if (e->d_name[0] != '.')
			unlinkat(dirfd_, e->d_name, 0);
	if (d)
		closedir(d);
	close(dirfd_);
	rmdir(tmpdir);
}

/* One item of a test rank. */
struct titem {
	const char *name;
	enum item_kind kind;
	enum ckpt_dtype dtype;
	unsigned ndim;
	uint64_t shape[3], gshape[3], offs[3];
	bool sharded;
};

/* CRC values a rank "computed": distinct per rank and piece. */
static uint32_t fake_crc(uint32_t rank, uint32_t piece)
{
	return 0xC0000000u + rank * 100000u + piece;
}

/* Lays out one rank's items with its fake CRCs, as its daemon would hold
 * them.  The caller frees *ret_crcs and the layout. */
static void make_rank(const char *name, uint64_t step, uint32_t rank, const struct titem *items,
		      size_t n, struct layout *l, uint32_t **ret_crcs)
{
	uint32_t *crcs;
	char *json;
	size_t len;

	ck_assert_int_eq(layout_init(l, "/data", name, step), 0);
	for (size_t i = 0; i < n; i++) {
		const struct titem *t = &items[i];

		ck_assert_int_eq(layout_add(l, t->kind, t->name, t->dtype, t->ndim, t->shape,
					    t->sharded ? t->gshape : NULL,
					    t->sharded ? t->offs : NULL, NULL, 0), 0);
	}
	json_object_set_new(l->meta, "who", json_sprintf("rank %u", rank));
	json_object_set_new(l->metrics, "loss", json_real(0.5 + rank));
	ck_assert_int_eq(layout_pack(l), 0);
	ck_assert_int_eq(st_header_json(l, rank, &json, &len), 0);
	ck_assert_int_eq(layout_place(l, len), 0);
	free(json);
	crcs = calloc(l->n_crcs + 1, sizeof(*crcs));
	for (uint32_t k = 0; k < l->n_crcs; k++)
		crcs[k] = fake_crc(rank, k);
	*ret_crcs = crcs;
}

/* Builds one rank's index and writes it to the temp directory.  Returns the
 * shard's file size. */
static uint64_t write_rank_step(const char *job, const char *name, uint64_t step, uint32_t rank,
				uint32_t world, const struct titem *items, size_t n)
{
	struct layout l;
	uint32_t *crcs;
	char fname[32], *text;
	uint64_t size;
	FILE *f;
	int fd;

	make_rank(name, step, rank, items, n, &l, &crcs);
	ck_assert_int_eq(index_build(&l, crcs, job, rank, world, &text), 0);
	index_index_name(rank, fname, sizeof(fname));
	fd = openat(dirfd_, fname, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	ck_assert_int_ge(fd, 0);
	f = fdopen(fd, "w");
	ck_assert_int_eq(fputs(text, f) >= 0, 1);
	fclose(f);
	free(text);
	free(crcs);
	size = l.file_size;
	layout_free(&l);
	return size;
}

static uint64_t write_rank(uint32_t rank, uint32_t world, const struct titem *items, size_t n)
{
	return write_rank_step(JOB, NAME, 5, rank, world, items, n);
}

static int merge(uint32_t world, char **text, char *err, size_t errlen)
{
	return index_merge(dirfd_, JOB, NAME, world, T_2026, NULL, 0, text, err, errlen);
}

#define TENSOR(n, dt, nd, ...) { .name = n, .kind = ITEM_TENSOR, .dtype = dt, .ndim = nd, __VA_ARGS__ }
#define SHARD(n, dt, nd, s, g, o)                                                              \
	{ .name = n, .kind = ITEM_TENSOR, .dtype = dt, .ndim = nd, .shape = s, .gshape = g,        \
	  .offs = o, .sharded = true }
#define BLOB(n, len) { .name = n, .kind = ITEM_BLOB, .dtype = CKPT_U8, .ndim = 1, .shape = { len } }
#define A(...) { __VA_ARGS__ }

static const struct titem rank0_items[] = {
	SHARD("w", CKPT_F32, 2, A(2, 6), A(4, 6), A(0, 0)),
	TENSOR("b", CKPT_F16, 1, .shape = { 3 }),
	TENSOR("step", CKPT_I64, 0),
	BLOB("rng0", 100),
};
static const struct titem rank1_items[] = {
	SHARD("w", CKPT_F32, 2, A(2, 6), A(4, 6), A(2, 0)),
	TENSOR("empty", CKPT_BF16, 2, .shape = { 0, 5 }),
	BLOB("rng1", (2u << 20) + 5),
};

static char *good_manifest(uint64_t *size0, uint64_t *size1)
{
	char err[256] = "", *text = NULL;
	uint64_t s0, s1;

	s0 = write_rank(0, 2, rank0_items, 4);
	s1 = write_rank(1, 2, rank1_items, 3);
	ck_assert_msg(merge(2, &text, err, sizeof(err)) == 0, "%s", err);
	if (size0)
		*size0 = s0;
	if (size1)
		*size1 = s1;
	return text;
}

START_TEST(test_merge_good)
{
	struct manifest m;
	const struct manifest_tensor *t;
	char err[256] = "", *text;
	uint64_t s0, s1;
	json_t *root;

	text = good_manifest(&s0, &s1);
	root = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
	ck_assert_ptr_nonnull(root);
	ck_assert_str_eq(json_string_value(json_object_get(root, "format")), "ckpt-1");
	ck_assert_str_eq(json_string_value(json_object_get(root, "time")), "2026-11-23T03:09:36Z");
	ck_assert_str_eq(json_string_value(json_object_get(json_object_get(root, "metadata"), "who")),
			 "rank 0");
	json_decref(root);

	memset(&m, 0, sizeof(m));
	ck_assert_msg(manifest_parse(text, strlen(text), &m, err, sizeof(err)) == 0, "%s", err);
	ck_assert_str_eq(m.name, NAME);
	ck_assert_str_eq(m.job, JOB);
	ck_assert_str_eq(m.time, "2026-11-23T03:09:36Z");
	ck_assert_uint_eq(m.step, 5);
	ck_assert_uint_eq(m.world, 2);
	ck_assert_uint_eq(m.n_files, 2);
	ck_assert_str_eq(m.files[0].path, "rank-00000.safetensors");
	ck_assert_str_eq(m.files[1].path, "rank-00001.safetensors");
	ck_assert_uint_eq(m.files[0].size, s0);
	ck_assert_uint_eq(m.files[1].size, s1);
	ck_assert_uint_eq(m.total_bytes, s0 + s1);
	ck_assert_uint_eq(m.n_tensors, 4);
	ck_assert_uint_eq(m.n_items, 6);
	/* Sorted: tensors, then blobs. */
	ck_assert_str_eq(m.items[0].name, "b");
	ck_assert_str_eq(m.items[1].name, "empty");
	ck_assert_str_eq(m.items[2].name, "step");
	ck_assert_str_eq(m.items[3].name, "w");
	ck_assert_str_eq(m.items[4].name, "rng0");
	ck_assert_str_eq(m.items[5].name, "rng1");
	ck_assert_ptr_nonnull(json_object_get(json_object_get(m.json, "metrics"), "loss"));

	t = manifest_find(&m, ITEM_TENSOR, "w");
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->dtype, CKPT_F32);
	ck_assert_uint_eq(t->ndim, 2);
	ck_assert_uint_eq(t->shape[0], 4);
	ck_assert_uint_eq(t->shape[1], 6);
	ck_assert_uint_eq(t->n_chunks, 2);
	ck_assert_uint_eq(t->chunks[0].file, 0);
	ck_assert_uint_eq(t->chunks[1].file, 1);
	ck_assert_uint_eq(t->chunks[1].offsets[0], 2);
	ck_assert_uint_eq(t->chunks[1].shape[0], 2);
	ck_assert_uint_eq(t->chunks[1].shape[1], 6);
	ck_assert_uint_eq(t->chunks[0].begin, 4096);
	ck_assert_uint_eq(t->chunks[0].end, 4096 + 48);
	ck_assert_uint_eq(t->chunks[0].crcs[0], fake_crc(0, 0));
	ck_assert_uint_eq(t->chunks[1].crcs[0], fake_crc(1, 0));

	t = manifest_find(&m, ITEM_TENSOR, "step");
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->ndim, 0);
	ck_assert_uint_eq(t->chunks[0].end - t->chunks[0].begin, 8);
	t = manifest_find(&m, ITEM_TENSOR, "empty");
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->chunks[0].begin, t->chunks[0].end);

	t = manifest_find(&m, ITEM_BLOB, "rng1");
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->kind, ITEM_BLOB);
	ck_assert_uint_eq(t->shape[0], (2u << 20) + 5);
	ck_assert_uint_eq(t->chunks[0].file, 1);
	ck_assert_uint_eq(t->chunks[0].end - t->chunks[0].begin, (2u << 20) + 5);
	/* rng1 starts after w (48 bytes) at 4096: pieces in blocks 0, 1, 2. */
	ck_assert_uint_eq(layout_crc_count(t->chunks[0].begin, t->chunks[0].end), 3);
	ck_assert_uint_eq(t->chunks[0].crcs[2], fake_crc(1, 3));

	ck_assert_ptr_null(manifest_find(&m, ITEM_TENSOR, "rng0"));
	ck_assert_ptr_null(manifest_find(&m, ITEM_BLOB, "w"));
	ck_assert_ptr_null(manifest_find(&m, ITEM_TENSOR, "zz"));
	ck_assert_ptr_null(manifest_find(&m, ITEM_TENSOR, ""));
	manifest_free(&m);
	manifest_free(&m);
	free(text);
}
END_TEST

/* Four ranks hold a 2x2 grid of one tensor; one rank saves nothing. */
/* A rank given in memory (as the daemon has its own) merges exactly as the
 * same rank read back from its index file. */
START_TEST(test_merge_local)
{
	struct index_local lo[2];
	struct layout l0, l1;
	uint32_t *c0, *c1;
	char err[256] = "", *from_files = good_manifest(NULL, NULL), *mixed = NULL;

	make_rank(NAME, 5, 0, rank0_items, 4, &l0, &c0);
	make_rank(NAME, 5, 1, rank1_items, 3, &l1, &c1);
	lo[0] = (struct index_local){ .rank = 0, .layout = &l0, .crcs = c0 };
	lo[1] = (struct index_local){ .rank = 1, .layout = &l1, .crcs = c1 };
	/* Rank 0 from memory, rank 1 from its file. */
	ck_assert_msg(index_merge(dirfd_, JOB, NAME, 2, T_2026, lo, 1, &mixed, err,
				  sizeof(err)) == 0, "%s", err);
	ck_assert_str_eq(mixed, from_files);
	free(mixed);
	/* Both from memory: the files are not read at all. */
	unlinkat(dirfd_, "rank-00000.index.json", 0);
	unlinkat(dirfd_, "rank-00001.index.json", 0);
	ck_assert_msg(index_merge(dirfd_, JOB, NAME, 2, T_2026, lo, 2, &mixed, err,
				  sizeof(err)) == 0, "%s", err);
	ck_assert_str_eq(mixed, from_files);
	free(mixed);
	free(from_files);
	free(c0);
	free(c1);
	layout_free(&l0);
	layout_free(&l1);
}
END_TEST

START_TEST(test_merge_grid)
{
	static const struct titem r[4][1] = {
		{ SHARD("g", CKPT_F64, 2, A(3, 2), A(6, 4), A(0, 0)) },
		{ SHARD("g", CKPT_F64, 2, A(3, 2), A(6, 4), A(0, 2)) },
		{ SHARD("g", CKPT_F64, 2, A(3, 2), A(6, 4), A(3, 0)) },
		{ SHARD("g", CKPT_F64, 2, A(3, 2), A(6, 4), A(3, 2)) },
	};
	struct manifest m;
	char err[256] = "", *text;
	const struct manifest_tensor *t;

	for (uint32_t k = 0; k < 4; k++)
		write_rank(k, 5, r[k], 1);
	write_rank(4, 5, NULL, 0);
	ck_assert_msg(merge(5, &text, err, sizeof(err)) == 0, "%s", err);
	memset(&m, 0, sizeof(m));
	ck_assert_msg(manifest_parse(text, strlen(text), &m, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(m.n_files, 5);
	ck_assert_uint_eq(m.files[4].size, 4096);
	t = manifest_find(&m, ITEM_TENSOR, "g");
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->n_chunks, 4);
	ck_assert_uint_eq(t->chunks[3].offsets[0], 3);
	ck_assert_uint_eq(t->chunks[3].offsets[1], 2);
	manifest_free(&m);
	free(text);
}
END_TEST

START_TEST(test_merge_empty_world1)
{
	struct manifest m;
	char err[256] = "", *text;

	write_rank(0, 1, NULL, 0);
	ck_assert_msg(merge(1, &text, err, sizeof(err)) == 0, "%s", err);
	memset(&m, 0, sizeof(m));
	ck_assert_msg(manifest_parse(text, strlen(text), &m, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(m.n_items, 0);
	ck_assert_uint_eq(m.n_files, 1);
	ck_assert_ptr_null(manifest_find(&m, ITEM_TENSOR, "x"));
	manifest_free(&m);
	free(text);
}
END_TEST

/* Merge failures: each case writes `world` ranks (a NULL list: the rank's
 * index is missing) and expects an errno and a phrase. */
struct bad_merge {
	const char *what;
	uint32_t world;
	const struct titem *items[4];
	size_t n[4];
	int want;
	const char *reason;
};

static const struct titem w_top[] = { SHARD("w", CKPT_F32, 2, A(2, 8), A(8, 8), A(0, 0)) };
static const struct titem w_mid[] = { SHARD("w", CKPT_F32, 2, A(2, 8), A(8, 8), A(2, 0)) };
static const struct titem w_low[] = { SHARD("w", CKPT_F32, 2, A(2, 8), A(8, 8), A(4, 0)) };
static const struct titem w_ovl[] = { SHARD("w", CKPT_F32, 2, A(4, 8), A(8, 8), A(1, 0)) };
static const struct titem w_big[] = { SHARD("w", CKPT_F32, 2, A(2, 8), A(8, 9), A(4, 0)) };
static const struct titem b_f32[] = { TENSOR("b", CKPT_F32, 1, .shape = { 4 }) };
static const struct titem b_f16[] = { TENSOR("b", CKPT_F16, 1, .shape = { 4 }) };
static const struct titem blob_r[] = { BLOB("rng", 16) };
static const struct titem tensor_r[] = { TENSOR("rng", CKPT_U8, 1, .shape = { 16 }) };
static const struct titem scalar[] = { TENSOR("s", CKPT_F32, 0) };
static const struct titem col0[] = { SHARD("c", CKPT_F32, 2, A(8, 4), A(8, 8), A(0, 0)) };
static const struct titem col1[] = { SHARD("c", CKPT_F32, 2, A(8, 5), A(8, 8), A(0, 3)) };

static const struct bad_merge bad_merges[] = {
	{ "missing rank", 2, { b_f32, NULL }, { 1, 0 }, -ENOENT, "rank 1: index missing" },
	{ "missing rank 0", 2, { NULL, b_f32 }, { 0, 1 }, -ENOENT, "rank 0: index missing" },
	{ "overlapping chunks", 2, { w_top, w_ovl }, { 1, 1 }, -EBADMSG, "overlap" },
	{ "overlapping columns", 2, { col0, col1 }, { 1, 1 }, -EBADMSG, "overlap" },
	{ "incomplete coverage", 3, { w_top, w_mid, w_low }, { 1, 1, 1 }, -EBADMSG,
	  "tensor 'w': chunks cover 48 of 64 elements" },
	{ "dtype mismatch", 2, { b_f32, b_f16 }, { 1, 1 }, -EBADMSG,
	  "tensor 'b': rank 1 says F16, rank 0 says F32" },
	{ "global shape mismatch", 2, { w_top, w_big }, { 1, 1 }, -EBADMSG,
	  "tensor 'w': rank 1 says global shape [8,9], rank 0 says [8,8]" },
	{ "duplicate blob", 2, { blob_r, blob_r }, { 1, 1 }, -EBADMSG,
	  "blob 'rng' is saved by rank 0 and by rank 1" },
	{ "blob and tensor share a name", 2, { tensor_r, blob_r }, { 1, 1 }, -EBADMSG,
	  "'rng' is a tensor in rank 0 and a blob in rank 1" },
	{ "whole tensor in two ranks", 2, { b_f32, b_f32 }, { 1, 1 }, -EBADMSG, "overlap" },
	{ "scalar in two ranks", 2, { scalar, scalar }, { 1, 1 }, -EBADMSG, "overlap" },
};

START_TEST(test_merge_bad)
{
	const struct bad_merge *c = &bad_merges[_i];
	char err[256] = "", *text = (char *)0x1;

	for (uint32_t r = 0; r < c->world; r++)
		if (c->items[r])
			write_rank(r, c->world, c->items[r], c->n[r]);
	ck_assert_int_eq(merge(c->world, &text, err, sizeof(err)), c->want);
	ck_assert_msg(strstr(err, c->reason) != NULL, "%s: '%s' lacks '%s'", c->what, err,
		      c->reason);
	ck_assert_ptr_eq(text, (char *)0x1); /* untouched on failure */
}
END_TEST

START_TEST(test_merge_bad_index)
{
	char err[256] = "", *text;
	int fd;

	write_rank(0, 2, b_f32, 1);
	/* Wrong job, name, world, step. */
	write_rank_step("other", NAME, 5, 1, 2, NULL, 0);
	ck_assert_int_eq(merge(2, &text, err, sizeof(err)), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err, "rank 1: index says job 'other', expected 'job-1'"));
	write_rank_step(JOB, "step-6", 5, 1, 2, NULL, 0);
	ck_assert_int_eq(merge(2, &text, err, sizeof(err)), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err, "name"));
	write_rank_step(JOB, NAME, 5, 1, 3, NULL, 0);
	ck_assert_int_eq(merge(2, &text, err, sizeof(err)), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err, "world"));
	write_rank_step(JOB, NAME, 6, 1, 2, NULL, 0);
	ck_assert_int_eq(merge(2, &text, err, sizeof(err)), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err, "rank 1 says step 6, rank 0 says step 5"));
	/* Truncated JSON. */
	fd = openat(dirfd_, "rank-00001.index.json", O_WRONLY | O_TRUNC | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "{\"format\":", 10), 10);
	close(fd);
	ck_assert_int_eq(merge(2, &text, err, sizeof(err)), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err, "rank 1"));
	ck_assert_ptr_nonnull(strstr(err, "not valid JSON"));
	/* The index of rank 0 in rank 1's place. */
	write_rank(0, 2, b_f32, 1);
	ck_assert_int_eq(renameat(dirfd_, "rank-00000.index.json", dirfd_, "rank-00001.index.json"),
			 0);
	write_rank(0, 2, b_f32, 1);
	ck_assert_int_eq(merge(2, &text, err, sizeof(err)), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err, "rank 1: index says"));
	/* A directory where the index should be. */
	ck_assert_int_eq(unlinkat(dirfd_, "rank-00001.index.json", 0), 0);
	ck_assert_int_eq(mkdirat(dirfd_, "rank-00001.index.json", 0755), 0);
	ck_assert_int_eq(merge(2, &text, err, sizeof(err)), -EBADMSG);
	ck_assert_int_eq(unlinkat(dirfd_, "rank-00001.index.json", AT_REMOVEDIR), 0);
	ck_assert_int_eq(merge(0, &text, err, sizeof(err)), -EBADMSG);
}
END_TEST

/* ---- corrupted manifests --------------------------------------------------- */

static json_t *chunk_of(json_t *root, const char *tensor, size_t k)
{
	return json_array_get(json_object_get(json_object_get(json_object_get(root, "tensors"),
							       tensor), "chunks"), k);
}

static void set_dims(json_t *obj, const char *key, uint64_t a, uint64_t b)
{
	json_t *arr = json_array();

	json_array_append_new(arr, json_integer((json_int_t)a));
	json_array_append_new(arr, json_integer((json_int_t)b));
	json_object_set_new(obj, key, arr);
}

struct bad_manifest {
	const char *what;
	const char *reason;
};

static const struct bad_manifest bad_manifests[] = {
	{ "format", "format" },
	{ "chunk past file end", "inside" },
	{ "path with ..", "plain file name" },
	{ "path with /", "plain file name" },
	{ "path .", "plain file name" },
	{ "empty path", "plain file name" },
	{ "crc count", "crc32c" },
	{ "crc value", "crc32c" },
	{ "chunk outside global shape", "exceeds" },
	{ "bytes vs shape", "bytes" },
	{ "file index", "file" },
	{ "total_bytes", "total_bytes" },
	{ "tensor and blob", "both a tensor and a blob" },
	{ "missing chunk", "cover 12 of 24" },
	{ "world_size 0", "world_size" },
	{ "long time", "time" },
	{ "blob size", "blob 'rng0'" },
	{ "bad dtype", "dtype" },
	{ "no chunks", "chunks" },
	{ "negative begin", "inside" },
	{ "bad tensor name", "item name" },
	{ "file rank >= world", "rank" },
	{ "bad job", "job id" },
	{ "not an object", "not a JSON object" },
};

static void corrupt(json_t *root, int which)
{
	json_t *c = chunk_of(root, "w", 0);
	json_t *f0 = json_array_get(json_object_get(root, "files"), 0);
	json_t *blobs = json_object_get(root, "blobs");
	json_t *tensors = json_object_get(root, "tensors");

	switch (which) {
	case 0: json_object_set_new(root, "format", json_string("ckpt-x")); break;
	case 1: json_object_set_new(c, "end", json_integer(1 << 30)); break;
	case 2: json_object_set_new(f0, "path", json_string("..")); break;
	case 3: json_object_set_new(f0, "path", json_string("a/b")); break;
	case 4: json_object_set_new(f0, "path", json_string(".")); break;
	case 5: json_object_set_new(f0, "path", json_string("")); break;
	case 6: json_array_append_new(json_object_get(c, "crc32c"), json_integer(1)); break;
	case 7: json_array_set_new(json_object_get(c, "crc32c"), 0, json_integer(1ll << 32)); break;
	case 8: set_dims(c, "offsets", 3, 0); break;
	case 9: set_dims(c, "shape", 1, 6); set_dims(chunk_of(root, "w", 1), "shape", 3, 6);
		set_dims(chunk_of(root, "w", 1), "offsets", 1, 0); break;
	case 10: json_object_set_new(c, "file", json_integer(2)); break;
	case 11: json_object_set_new(root, "total_bytes", json_integer(1)); break;
	case 12: json_object_set(blobs, "w", json_object_get(blobs, "rng0")); break;
	case 13: json_array_remove(json_object_get(json_object_get(tensors, "w"), "chunks"), 1);
		break;
	case 14: json_object_set_new(root, "world_size", json_integer(0)); break;
	case 15: json_object_set_new(root, "time",
				     json_string("2026-11-23T03:09:36.123456789012345678901Z"));
		break;
	case 16: json_object_set_new(json_object_get(blobs, "rng0"), "size", json_integer(99));
		break;
	case 17: json_object_set_new(json_object_get(tensors, "b"), "dtype", json_string("F17"));
		break;
	case 18: json_object_set_new(json_object_get(tensors, "b"), "chunks", json_array()); break;
	case 19: json_object_set_new(c, "begin", json_integer(-1)); break;
	case 20: json_object_set(tensors, "__x", json_object_get(tensors, "b")); break;
	case 21: json_object_set_new(f0, "rank", json_integer(2)); break;
	case 22: json_object_set_new(root, "job", json_string("a/b")); break;
	case 23: break; /* handled by the caller */
	}
}

START_TEST(test_manifest_corrupt)
{
	const struct bad_manifest *c = &bad_manifests[_i];
	struct manifest m;
	char err[256] = "", *text, *bad;
	json_t *root;

	text = good_manifest(NULL, NULL);
	root = json_loads(text, 0, NULL);
	ck_assert_ptr_nonnull(root);
	corrupt(root, _i);
	bad = _i == 23 ? strdup("[]") : json_dumps(root, JSON_COMPACT);
	memset(&m, 0, sizeof(m));
	ck_assert_msg(manifest_parse(bad, strlen(bad), &m, err, sizeof(err)) == -EBADMSG,
		      "%s: accepted", c->what);
	ck_assert_msg(strstr(err, c->reason) != NULL, "%s: '%s' lacks '%s'", c->what, err,
		      c->reason);
	ck_assert_ptr_null(m.items);
	ck_assert_ptr_null(m.json);
	ck_assert_ptr_null(m.pool);
	free(bad);
	json_decref(root);
	free(text);
}
END_TEST

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* 8 ranks x 10,000 items (a row-sharded tensor per name), merged and parsed
 * back.  Target < 200 ms for the merge; the bound here is loose. */
START_TEST(test_merge_scale)
{
	enum { R = 8, N = 10000 };
	struct titem *items = calloc(N, sizeof(*items));
	char (*names)[64] = calloc(N, sizeof(*names));
	char err[256] = "", *text;
	struct manifest m;
	double t0, merge_ms, parse_ms;

	ck_assert_ptr_nonnull(items);
	for (uint32_t r = 0; r < R; r++) {
		for (int i = 0; i < N; i++) {
			snprintf(names[i], sizeof(names[i]), "model.layers.%d.mlp.up_proj.weight", i);
			items[i] = (struct titem)SHARD(names[i], CKPT_BF16, 2, A(16, 8), A(16 * R, 8),
						       A(16 * r, 0));
		}
		write_rank(r, R, items, N);
	}
	t0 = now_ms();
	ck_assert_msg(merge(R, &text, err, sizeof(err)) == 0, "%s", err);
	merge_ms = now_ms() - t0;
	memset(&m, 0, sizeof(m));
	t0 = now_ms();
	ck_assert_msg(manifest_parse(text, strlen(text), &m, err, sizeof(err)) == 0, "%s", err);
	parse_ms = now_ms() - t0;
	ck_assert_uint_eq(m.n_tensors, N);
	for (int i = 0; i < N; i += 101) {
		const struct manifest_tensor *t = manifest_find(&m, ITEM_TENSOR, names[i]);

		ck_assert_ptr_nonnull(t);
		ck_assert_uint_eq(t->n_chunks, R);
		ck_assert_uint_eq(t->shape[0], 16 * R);
	}
	/* Speed is the scale benchmark's (bench/ckpt_scale.c), not a test's:
	 * the figures are only printed. */
	printf("merge_scale: merge %.0f ms, parse %.0f ms\n", merge_ms, parse_ms);
	manifest_free(&m);
	free(text);
	free(items);
	free(names);
}
END_TEST

START_TEST(test_names)
{
	char buf[32];

	index_shard_name(3, buf, sizeof(buf));
	ck_assert_str_eq(buf, "rank-00003.safetensors");
	index_index_name(65535, buf, sizeof(buf));
	ck_assert_str_eq(buf, "rank-65535.index.json");
}
END_TEST

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static Suite *index_suite(void)
{
	Suite *s = suite_create("index");
	TCase *tc;

	tc = tcase_create("names");
	tcase_add_test(tc, test_names);
	suite_add_tcase(s, tc);
	tc = tcase_create("merge");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_merge_good);
	tcase_add_test(tc, test_merge_local);
	tcase_add_test(tc, test_merge_grid);
	tcase_add_test(tc, test_merge_empty_world1);
	suite_add_tcase(s, tc);
	tc = tcase_create("merge_errors");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_loop_test(tc, test_merge_bad, 0, N(bad_merges));
	tcase_add_test(tc, test_merge_bad_index);
	suite_add_tcase(s, tc);
	tc = tcase_create("manifest_corrupt");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_loop_test(tc, test_manifest_corrupt, 0, N(bad_manifests));
	suite_add_tcase(s, tc);
	tc = tcase_create("scale");
	tcase_set_timeout(tc, 60);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_merge_scale);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(index_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
