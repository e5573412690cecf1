/* SPDX-License-Identifier: MIT */
/*
 * check_manifest.c - manifest_parse() on manifests it must refuse and ones it
 * must accept, and the tiling check both it and the merge rely on
 * (format/boxcheck.h).
 *
 * A manifest is untrusted input: each corrupt case asserts the exact errno
 * and the phrase the user gets, and that nothing is left allocated.  The
 * manifests are made by a small generator (struct gen) that places each
 * chunk's bytes in a file, with the right CRC count, so that a case differs
 * from a valid manifest only in what it corrupts.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "format/boxcheck.h"
#include "format/index.h"
#include "format/layout.h"

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define A(...) { __VA_ARGS__ }

/* ---- the generator ------------------------------------------------------- */

#define GEN_MAX_WORLD 1024
#define DATA_START 4096 /* where a shard's data starts, as layout_place puts it */

struct gen {
	json_t *root;
	uint32_t world;
	uint32_t next_file;          /* chunks go to the files in turn */
	uint64_t used[GEN_MAX_WORLD]; /* end of each file's data so far */
};

static void gen_init(struct gen *g, uint32_t world)
{
	ck_assert_uint_le(world, GEN_MAX_WORLD);
	memset(g, 0, sizeof(*g));
	g->world = world;
	for (uint32_t r = 0; r < world; r++)
		g->used[r] = DATA_START;
	g->root = json_pack("{s:s, s:s, s:I, s:s, s:s, s:s, s:I, s:I, s:{}, s:{s:f}, s:{}, s:{}}",
			    "format", MANIFEST_FORMAT, "name", "step-5", "step", (json_int_t)5,
			    "time", "2026-11-23T03:09:36Z", "job", "job-1", "attempt", "a1b2",
			    "world_size", (json_int_t)world, "crc_block",
			    (json_int_t)LAYOUT_CRC_BLOCK, "metadata", "metrics", "loss", 0.5,
			    "tensors", "blobs");
	ck_assert_ptr_nonnull(g->root);
}

static json_t *dims_json(const uint64_t *d, unsigned n)
{
	json_t *a = json_array();

	for (unsigned i = 0; i < n; i++)
		json_array_append_new(a, json_integer((json_int_t)d[i]));
	return a;
}

/* Places `bytes` at the end of the next file: sets file, begin, end and as
 * many CRCs as the range has pieces on *obj. */
static void gen_place(struct gen *g, json_t *obj, uint64_t bytes)
{
	uint32_t f = g->next_file++ % g->world;
	uint64_t begin = g->used[f], end = begin + bytes;
	json_t *crcs = json_array();

	for (uint32_t k = 0; k < layout_crc_count(begin, end); k++)
		json_array_append_new(crcs, json_integer(0x1000 + k));
	json_object_set_new(obj, "file", json_integer(f));
	json_object_set_new(obj, "begin", json_integer((json_int_t)begin));
	json_object_set_new(obj, "end", json_integer((json_int_t)end));
	json_object_set_new(obj, "crc32c", crcs);
	g->used[f] = end;
}

/* One chunk: its offsets and shape (up to 3 dims in these tests). */
struct box {
	uint64_t o[3], s[3];
};

/* Adds tensor `name` with n chunks; returns its object. */
static json_t *gen_tensor(struct gen *g, const char *name, const char *dtype, size_t esize,
			  unsigned ndim, const uint64_t *gshape, const struct box *c, size_t n)
{
	json_t *t = json_object(), *chunks = json_array();

	json_object_set_new(t, "dtype", json_string(dtype));
	json_object_set_new(t, "shape", dims_json(gshape, ndim));
	for (size_t k = 0; k < n; k++) {
		json_t *jc = json_object();
		uint64_t vol = 1;

		for (unsigned d = 0; d < ndim; d++)
			vol *= c[k].s[d];
		json_object_set_new(jc, "offsets", dims_json(c[k].o, ndim));
		json_object_set_new(jc, "shape", dims_json(c[k].s, ndim));
		gen_place(g, jc, vol * esize);
		json_array_append_new(chunks, jc);
	}
	json_object_set_new(t, "chunks", chunks);
	json_object_set_new(json_object_get(g->root, "tensors"), name, t);
	return t;
}

static void gen_blob(struct gen *g, const char *key, uint64_t size)
{
	json_t *b = json_object();

	json_object_set_new(b, "size", json_integer((json_int_t)size));
	gen_place(g, b, size);
	json_object_set_new(json_object_get(g->root, "blobs"), key, b);
}

/* Writes "files" and "total_bytes" from what was placed; returns the tree
 * (still owned by g). */
static json_t *gen_finish(struct gen *g)
{
	json_t *files = json_array();
	uint64_t total = 0;
	char path[64];

	for (uint32_t r = 0; r < g->world; r++) {
		index_shard_name(r, path, sizeof(path));
		json_array_append_new(files, json_pack("{s:I, s:s, s:I}", "rank", (json_int_t)r,
						       "path", path, "size", (json_int_t)g->used[r]));
		total += g->used[r];
	}
	json_object_set_new(g->root, "files", files);
	json_object_set_new(g->root, "total_bytes", json_integer((json_int_t)total));
	return g->root;
}

/* The manifest text (malloc'd); frees the tree. */
static char *gen_text(struct gen *g)
{
	char *text = json_dumps(g->root, JSON_COMPACT);

	ck_assert_ptr_nonnull(text);
	json_decref(g->root);
	g->root = NULL;
	return text;
}

/* Parses text; on failure checks that nothing is left allocated. */
static int parse(const char *text, size_t len, struct manifest *m, char *err, size_t errlen)
{
	int ret;

	memset(m, 0, sizeof(*m));
	err[0] = '\0';
	ret = manifest_parse(text, len, m, err, errlen);
	if (ret) {
		ck_assert_ptr_null(m->items);
		ck_assert_ptr_null(m->files);
		ck_assert_ptr_null(m->json);
		ck_assert_ptr_null(m->pool);
	}
	return ret;
}

/* ---- chunk layouts: tilings, overlaps, holes ------------------------------ */

/* One tensor 't' of F32 with these chunks, in two files. */
struct layout_case {
	const char *what;
	unsigned ndim;
	uint64_t gshape[3];
	size_t n;
	struct box c[9];
	int want;
	const char *reason; /* NULL when valid */
};

#define B1(o, s) { { o }, { s } }
#define B2(o0, o1, s0, s1) { { o0, o1 }, { s0, s1 } }
#define B3(o0, o1, o2, s0, s1, s2) { { o0, o1, o2 }, { s0, s1, s2 } }

static const struct layout_case layouts[] = {
	/* Valid. */
	{ "1-D split", 1, { 10 }, 2, { B1(0, 4), B1(4, 6) }, 0, NULL },
	{ "1-D split, chunks out of order", 1, { 10 }, 3, { B1(6, 4), B1(0, 3), B1(3, 3) }, 0,
	  NULL },
	{ "row split", 2, { 4, 6 }, 2, { B2(0, 0, 2, 6), B2(2, 0, 2, 6) }, 0, NULL },
	{ "column split", 2, { 4, 6 }, 3, { B2(0, 0, 4, 2), B2(0, 2, 4, 2), B2(0, 4, 4, 2) }, 0,
	  NULL },
	{ "2-D grid split", 2, { 4, 6 }, 6,
	  { B2(0, 0, 2, 2), B2(0, 2, 2, 2), B2(0, 4, 2, 2), B2(2, 0, 2, 2), B2(2, 2, 2, 2),
	    B2(2, 4, 2, 2) }, 0, NULL },
	{ "2-D grid, uneven cuts, column-major", 2, { 5, 7 }, 4,
	  { B2(0, 0, 2, 3), B2(2, 0, 3, 3), B2(0, 3, 2, 4), B2(2, 3, 3, 4) }, 0, NULL },
	{ "brick wall", 2, { 2, 4 }, 5,
	  { B2(0, 0, 1, 2), B2(0, 2, 1, 2), B2(1, 0, 1, 1), B2(1, 1, 1, 2), B2(1, 3, 1, 1) }, 0,
	  NULL },
	{ "3-D grid", 3, { 2, 4, 6 }, 8,
	  { B3(0, 0, 0, 1, 2, 3), B3(0, 0, 3, 1, 2, 3), B3(0, 2, 0, 1, 2, 3), B3(0, 2, 3, 1, 2, 3),
	    B3(1, 0, 0, 1, 2, 3), B3(1, 0, 3, 1, 2, 3), B3(1, 2, 0, 1, 2, 3),
	    B3(1, 2, 3, 1, 2, 3) }, 0, NULL },
	{ "uneven split with an empty last chunk", 1, { 7 }, 3, { B1(0, 4), B1(4, 3), B1(7, 0) },
	  0, NULL },
	{ "zero-size tensor, one chunk", 2, { 0, 5 }, 1, { B2(0, 0, 0, 5) }, 0, NULL },
	{ "zero-size tensor, chunks of volume 0 in one place", 2, { 4, 0 }, 3,
	  { B2(0, 0, 2, 0), B2(2, 0, 2, 0), B2(2, 0, 2, 0) }, 0, NULL },
	{ "empty chunks inside a whole one", 2, { 4, 6 }, 3,
	  { B2(0, 0, 4, 6), B2(1, 1, 0, 3), B2(1, 1, 2, 0) }, 0, NULL },
	{ "0-D scalar", 0, { 0 }, 1, { B1(0, 0) }, 0, NULL },

	/* Overlaps. */
	{ "1-D overlap", 1, { 10 }, 2, { B1(0, 6), B1(4, 6) }, -EBADMSG,
	  "tensor 't': chunks 0 and 1 overlap (at [0] and [4])" },
	{ "1-D overlap and a hole of the same size", 1, { 10 }, 2, { B1(0, 5), B1(3, 5) },
	  -EBADMSG, "tensor 't': chunks 0 and 1 overlap (at [0] and [3])" },
	{ "identical duplicate chunk", 1, { 4 }, 2, { B1(0, 4), B1(0, 4) }, -EBADMSG,
	  "tensor 't': chunks 0 and 1 overlap (at [0] and [0])" },
	{ "duplicate far from the original", 1, { 8 }, 5,
	  { B1(6, 2), B1(0, 2), B1(2, 2), B1(4, 2), B1(6, 2) }, -EBADMSG,
	  "tensor 't': chunks 0 and 4 overlap (at [6] and [6])" },
	{ "2-D grid, a block moved onto another (overlap + hole of the same size)", 2, { 4, 6 },
	  4, { B2(0, 0, 2, 3), B2(0, 3, 2, 3), B2(2, 0, 2, 3), B2(1, 3, 2, 3) }, -EBADMSG,
	  "tensor 't': chunks 1 and 3 overlap (at [0,3] and [1,3])" },
	{ "2-D grid with a block twice", 2, { 4, 6 }, 5,
	  { B2(0, 0, 2, 3), B2(0, 3, 2, 3), B2(2, 0, 2, 3), B2(2, 3, 2, 3), B2(2, 0, 2, 3) },
	  -EBADMSG, "tensor 't': chunks 2 and 4 overlap (at [2,0] and [2,0])" },
	{ "columns overlapping", 2, { 4, 6 }, 2, { B2(0, 0, 4, 4), B2(0, 3, 4, 3) }, -EBADMSG,
	  "tensor 't': chunks 0 and 1 overlap (at [0,0] and [0,3])" },
	{ "a row across a column split", 2, { 4, 6 }, 4,
	  { B2(0, 0, 4, 2), B2(0, 2, 4, 2), B2(0, 4, 4, 2), B2(3, 0, 1, 6) }, -EBADMSG,
	  "tensor 't': chunks 0 and 3 overlap (at [0,0] and [3,0])" },
	{ "3-D grid, a block shifted", 3, { 2, 4, 6 }, 8,
	  { B3(0, 0, 0, 1, 2, 3), B3(0, 0, 3, 1, 2, 3), B3(0, 2, 0, 1, 2, 3), B3(0, 2, 3, 1, 2, 3),
	    B3(1, 0, 0, 1, 2, 3), B3(1, 0, 3, 1, 2, 3), B3(1, 2, 0, 1, 2, 3),
	    B3(1, 2, 2, 1, 2, 3) }, -EBADMSG,
	  "tensor 't': chunks 6 and 7 overlap (at [1,2,0] and [1,2,2])" },
	{ "0-D tensor with 2 chunks", 0, { 0 }, 2, { B1(0, 0), B1(0, 0) }, -EBADMSG,
	  "tensor 't': chunks 0 and 1 overlap (at [] and [])" },

	/* Holes. */
	{ "1-D hole", 1, { 10 }, 2, { B1(0, 4), B1(6, 4) }, -EBADMSG,
	  "tensor 't': chunks cover 8 of 10 elements" },
	{ "2-D grid missing a block", 2, { 4, 6 }, 3,
	  { B2(0, 0, 2, 3), B2(0, 3, 2, 3), B2(2, 0, 2, 3) }, -EBADMSG,
	  "tensor 't': chunks cover 18 of 24 elements" },
	{ "only empty chunks for a non-empty tensor", 1, { 3 }, 2, { B1(0, 0), B1(3, 0) },
	  -EBADMSG, "tensor 't': chunks cover 0 of 3 elements" },

	/* Outside the shape (checked per chunk, before the tiling). */
	{ "chunk outside the shape", 1, { 10 }, 2, { B1(0, 4), B1(4, 7) }, -EBADMSG,
	  "tensor 't' chunk 1: dimension 0: offset 4 + size 7 exceeds 10" },
	{ "empty chunk outside the shape", 1, { 10 }, 2, { B1(0, 10), B1(11, 0) }, -EBADMSG,
	  "tensor 't' chunk 1: dimension 0: offset 11 + size 0 exceeds 10" },
	{ "2-D chunk outside in the second dimension", 2, { 4, 6 }, 2,
	  { B2(0, 0, 4, 3), B2(0, 3, 4, 4) }, -EBADMSG,
	  "tensor 't' chunk 1: dimension 1: offset 3 + size 4 exceeds 6" },
};

START_TEST(test_layout)
{
	const struct layout_case *c = &layouts[_i];
	const struct manifest_tensor *t;
	struct manifest m;
	struct gen g;
	char err[512], *text;
	int ret;

	gen_init(&g, 2);
	gen_tensor(&g, "t", "F32", 4, c->ndim, c->gshape, c->c, c->n);
	gen_finish(&g);
	text = gen_text(&g);
	ret = parse(text, strlen(text), &m, err, sizeof(err));
	ck_assert_msg(ret == c->want, "%s: returned %d (%s), want %d", c->what, ret, err, c->want);
	if (c->reason) {
		ck_assert_msg(strstr(err, c->reason) != NULL, "%s: '%s' lacks '%s'", c->what, err,
			      c->reason);
	} else {
		t = manifest_find(&m, ITEM_TENSOR, "t");
		ck_assert_ptr_nonnull(t);
		ck_assert_uint_eq(t->ndim, c->ndim);
		ck_assert_uint_eq(t->n_chunks, c->n);
		for (size_t k = 0; k < c->n; k++)
			for (unsigned d = 0; d < c->ndim; d++) {
				ck_assert_uint_eq(t->chunks[k].offsets[d], c->c[k].o[d]);
				ck_assert_uint_eq(t->chunks[k].shape[d], c->c[k].s[d]);
			}
		manifest_free(&m);
	}
	free(text);
}
END_TEST

/* ---- corruptions of a valid manifest ---------------------------------------- */

static const uint64_t w_shape[2] = { 4, 6 };
static const struct box w_chunks[2] = { B2(0, 0, 2, 6), B2(2, 0, 2, 6) };
static const uint64_t b_shape[1] = { 3 };
static const struct box b_chunks[1] = { B1(0, 3) };
static const struct box s_chunks[1] = { B1(0, 0) };
static const uint64_t e_shape[2] = { 0, 5 };
static const struct box e_chunks[1] = { B2(0, 0, 0, 5) };

/*
 * The base every corruption starts from: "w" F32 [4,6] split in rows over
 * the two files (chunk 0 in file 0, chunk 1 in file 1), "b" F16 [3] in file
 * 0, the scalar "s" I64 in file 1, the empty "e" BF16 [0,5] in file 0 and
 * the blobs "rng" (100 bytes, file 1) and "big" (2 MiB + 3 bytes: 3 CRC
 * pieces, file 0).
 */
static json_t *base_manifest(struct gen *g)
{
	gen_init(g, 2);
	gen_tensor(g, "w", "F32", 4, 2, w_shape, w_chunks, 2);
	gen_tensor(g, "b", "F16", 2, 1, b_shape, b_chunks, 1);
	gen_tensor(g, "s", "I64", 8, 0, NULL, s_chunks, 1);
	gen_tensor(g, "e", "BF16", 2, 2, e_shape, e_chunks, 1);
	gen_blob(g, "rng", 100);
	gen_blob(g, "big", (2u << 20) + 3);
	return gen_finish(g);
}

static json_t *tensor_of(json_t *root, const char *name)
{
	return json_object_get(json_object_get(root, "tensors"), name);
}

static json_t *chunk_of(json_t *root, const char *name, size_t k)
{
	return json_array_get(json_object_get(tensor_of(root, name), "chunks"), k);
}

static void set_int(json_t *obj, const char *key, json_int_t v)
{
	json_object_set_new(obj, key, json_integer(v));
}

static void set_str(json_t *obj, const char *key, const char *v)
{
	json_object_set_new(obj, key, json_string(v));
}

static uint64_t get_u64(json_t *obj, const char *key)
{
	return (uint64_t)json_integer_value(json_object_get(obj, key));
}

/* A number the text edits below replace. */
#define MARK 987654321

static void fmt_ckpt2(json_t *r) { set_str(r, "format", "ckpt-2"); }
static void fmt_ckpt10(json_t *r) { set_str(r, "format", "ckpt-10"); }
static void fmt_huge(json_t *r) { set_str(r, "format", "ckpt-123456789012345678901234567890"); }
static void fmt_ckpt0(json_t *r) { set_str(r, "format", "ckpt-0"); }
static void fmt_ckpt01(json_t *r) { set_str(r, "format", "ckpt-01"); }
static void fmt_ckpt2x(json_t *r) { set_str(r, "format", "ckpt-2.1"); }
static void fmt_other(json_t *r) { set_str(r, "format", "safetensors"); }
static void fmt_int(json_t *r) { set_int(r, "format", 2); }
static void fmt_missing(json_t *r) { json_object_del(r, "format"); }

/* Chunk 1 of "w" (48 bytes, in file 1) ending 8 bytes past the file's end. */
static void range_past_end(json_t *r)
{
	uint64_t size = get_u64(json_array_get(json_object_get(r, "files"), 1), "size");
	json_t *c = chunk_of(r, "w", 1);

	set_int(c, "begin", (json_int_t)(size - 40));
	set_int(c, "end", (json_int_t)(size + 8));
}

/* "b" (6 bytes, file 0) moved onto the first bytes of "w" chunk 0 (file 0). */
static void shared_bytes(json_t *r)
{
	json_t *w0 = chunk_of(r, "w", 0), *b = chunk_of(r, "b", 0);
	uint64_t at = get_u64(w0, "begin");

	set_int(b, "begin", (json_int_t)at);
	set_int(b, "end", (json_int_t)at + 6);
}

static void begin_after_end(json_t *r)
{
	json_t *c = chunk_of(r, "w", 0);

	set_int(c, "begin", (json_int_t)get_u64(c, "end") + 1);
}

static void crc_extra(json_t *r)
{
	json_array_append_new(json_object_get(chunk_of(r, "w", 0), "crc32c"), json_integer(7));
}

static void crc_missing(json_t *r)
{
	json_array_clear(json_object_get(json_object_get(json_object_get(r, "blobs"), "big"),
					 "crc32c"));
}

static void crc_wide(json_t *r)
{
	json_array_set_new(json_object_get(chunk_of(r, "w", 0), "crc32c"), 0,
			   json_integer(1ll << 32));
}

static void bytes_short(json_t *r)
{
	json_t *c = chunk_of(r, "w", 0);

	set_int(c, "end", (json_int_t)get_u64(c, "end") - 4);
}

static void bytes_dtype(json_t *r) { set_str(tensor_of(r, "w"), "dtype", "F64"); }
static void dtype_unknown(json_t *r) { set_str(tensor_of(r, "b"), "dtype", "F17"); }
static void dtype_missing(json_t *r) { json_object_del(tensor_of(r, "b"), "dtype"); }
static void file_out_of_range(json_t *r) { set_int(chunk_of(r, "w", 0), "file", 2); }
static void file_huge(json_t *r) { set_int(chunk_of(r, "w", 1), "file", INT64_MAX); }
static void file_negative(json_t *r) { set_int(chunk_of(r, "b", 0), "file", -1); }

static void blob_file_out_of_range(json_t *r)
{
	set_int(json_object_get(json_object_get(r, "blobs"), "rng"), "file", 5);
}

static void file_rank_past_world(json_t *r)
{
	set_int(json_array_get(json_object_get(r, "files"), 1), "rank", 2);
}

static void scalar_twice(json_t *r)
{
	json_t *chunks = json_object_get(tensor_of(r, "s"), "chunks");

	json_array_append_new(chunks, json_deep_copy(json_array_get(chunks, 0)));
}

static void chunk_twice(json_t *r)
{
	json_t *chunks = json_object_get(tensor_of(r, "w"), "chunks");

	json_array_append_new(chunks, json_deep_copy(json_array_get(chunks, 1)));
}

static void chunk_short_dims(json_t *r)
{
	json_object_set_new(chunk_of(r, "w", 1), "offsets", json_pack("[i]", 2));
}

static void shape_negative(json_t *r)
{
	json_object_set_new(tensor_of(r, "w"), "shape", json_pack("[i,i]", -4, 6));
}

static void shape_real(json_t *r)
{
	json_object_set_new(tensor_of(r, "w"), "shape", json_pack("[f,i]", 4.0, 6));
}

static void shape_mark(json_t *r)
{
	json_object_set_new(tensor_of(r, "w"), "shape", json_pack("[i,i]", MARK, 6));
}

static void begin_mark(json_t *r) { set_int(chunk_of(r, "b", 0), "begin", MARK); }

static void shape_overflows(json_t *r)
{
	json_object_set_new(tensor_of(r, "w"), "shape",
			    json_pack("[I,I]", (json_int_t)INT64_MAX, (json_int_t)4));
}

static void shape_too_many_dims(json_t *r)
{
	json_t *a = json_array();

	for (int d = 0; d <= CKPT_MAX_NDIM; d++)
		json_array_append_new(a, json_integer(1));
	json_object_set_new(tensor_of(r, "b"), "shape", a);
}

static void chunks_empty(json_t *r)
{
	json_object_set_new(tensor_of(r, "b"), "chunks", json_array());
}

static void total_wrong(json_t *r)
{
	set_int(r, "total_bytes", (json_int_t)get_u64(r, "total_bytes") + 1);
}

static void blob_size_wrong(json_t *r)
{
	set_int(json_object_get(json_object_get(r, "blobs"), "rng"), "size", 99);
}

/* Text edits (after the tree is dumped). */
static void cut_half(char *t, size_t *len) { (void)t; *len /= 2; }
static void cut_last(char *t, size_t *len) { (void)t; *len -= 1; }
static void cut_all(char *t, size_t *len) { (void)t; *len = 0; }

/* Puts `with` in place of the MARK number in the text (the caller left
 * room for it to grow). */
static void replace_mark(char *t, size_t *len, const char *with)
{
	char mark[16], *p;
	size_t ml, wl = strlen(with);

	snprintf(mark, sizeof(mark), "%d", MARK);
	ml = strlen(mark);
	p = strstr(t, mark);
	ck_assert_ptr_nonnull(p);
	memmove(p + wl, p + ml, strlen(p + ml) + 1);
	memcpy(p, with, wl);
	*len = strlen(t);
}

static void mark_2_64(char *t, size_t *len) { replace_mark(t, len, "18446744073709551616"); }
static void mark_2_63(char *t, size_t *len) { replace_mark(t, len, "9223372036854775808"); }
static void mark_huge(char *t, size_t *len) { replace_mark(t, len, "1e400"); }
static void not_json(char *t, size_t *len) { *len = (size_t)sprintf(t, "this is not json"); }
static void json_array_text(char *t, size_t *len) { *len = (size_t)sprintf(t, "[1,2,3]"); }

static void nul_inside(char *t, size_t *len)
{
	t[*len / 3] = '\0';
}

/* A second "format" key in front of the first. */
static void duplicate_key(char *t, size_t *len)
{
	static const char dup[] = "{\"format\":\"ckpt-1\",";
	size_t dl = sizeof(dup) - 1;

	memmove(t + dl, t + 1, *len); /* the room was reserved by the caller */
	memcpy(t, dup, dl);
	*len += dl - 1;
}

struct corrupt_case {
	const char *what;
	void (*tree)(json_t *root);
	void (*text)(char *t, size_t *len);
	int want;
	const char *reason;
};

static const struct corrupt_case corrupts[] = {
	/* Format versions. */
	{ "newer format", fmt_ckpt2, NULL, -EPROTONOSUPPORT,
	  "manifest format 'ckpt-2' is newer than this reader knows (it reads ckpt-1)" },
	{ "newer format, two digits", fmt_ckpt10, NULL, -EPROTONOSUPPORT,
	  "manifest format 'ckpt-10' is newer" },
	{ "newer format, a version past 2^64", fmt_huge, NULL, -EPROTONOSUPPORT,
	  "manifest format 'ckpt-123456789012345678901234567890' is newer" },
	{ "format ckpt-0", fmt_ckpt0, NULL, -EBADMSG,
	  "manifest format is 'ckpt-0', expected 'ckpt-1'" },
	{ "format with a leading zero", fmt_ckpt01, NULL, -EBADMSG,
	  "manifest format is 'ckpt-01', expected 'ckpt-1'" },
	{ "format not a whole number", fmt_ckpt2x, NULL, -EBADMSG,
	  "manifest format is 'ckpt-2.1', expected 'ckpt-1'" },
	{ "another format", fmt_other, NULL, -EBADMSG,
	  "manifest format is 'safetensors', expected 'ckpt-1'" },
	{ "format not a string", fmt_int, NULL, -EBADMSG, "manifest format is '', expected" },
	{ "format missing", fmt_missing, NULL, -EBADMSG, "manifest format is '', expected" },

	/* Chunk byte ranges, CRCs and byte counts. */
	{ "byte range outside the file", range_past_end, NULL, -EBADMSG,
	  "tensor 'w' chunk 1: [begin, end) is not a range inside rank-00001.safetensors" },
	{ "two items on the same bytes", shared_bytes, NULL, -EBADMSG,
	  "share bytes of rank-00000.safetensors" },
	{ "begin after end", begin_after_end, NULL, -EBADMSG,
	  "tensor 'w' chunk 0: [begin, end) is not a range inside" },
	{ "one CRC too many", crc_extra, NULL, -EBADMSG,
	  "tensor 'w' chunk 0: crc32c is not a list of 1 32-bit values" },
	{ "CRCs missing", crc_missing, NULL, -EBADMSG,
	  "blob 'big' chunk 0: crc32c is not a list of 3 32-bit values" },
	{ "CRC past 32 bits", crc_wide, NULL, -EBADMSG,
	  "tensor 'w' chunk 0: crc32c is not a list of 1 32-bit values" },
	{ "byte count short of the shape", bytes_short, NULL, -EBADMSG,
	  "tensor 'w' chunk 0: range of 44 bytes for 48 bytes of data" },
	{ "byte count of another dtype", bytes_dtype, NULL, -EBADMSG,
	  "tensor 'w' chunk 0: range of 48 bytes for 96 bytes of data" },
	{ "blob size not its range", blob_size_wrong, NULL, -EBADMSG,
	  "blob 'rng' chunk 0: range of 100 bytes for 99 bytes of data" },
	{ "total_bytes not the sum", total_wrong, NULL, -EBADMSG,
	  "manifest total_bytes is not the sum of the file sizes" },

	/* Types, dtypes, shapes. */
	{ "unknown dtype", dtype_unknown, NULL, -EBADMSG, "tensor 'b': unknown dtype" },
	{ "no dtype", dtype_missing, NULL, -EBADMSG, "tensor 'b': unknown dtype" },
	{ "negative dimension", shape_negative, NULL, -EBADMSG,
	  "tensor 'w': shape is not an array of at most 16 non-negative integers" },
	{ "real dimension", shape_real, NULL, -EBADMSG,
	  "tensor 'w': shape is not an array of at most 16 non-negative integers" },
	{ "17 dimensions", shape_too_many_dims, NULL, -EBADMSG,
	  "tensor 'b': shape is not an array of at most 16 non-negative integers" },
	{ "volume past 2^63", shape_overflows, NULL, -EBADMSG, "tensor 'w': size overflows" },
	{ "no chunks", chunks_empty, NULL, -EBADMSG,
	  "tensor 'b': chunks is not a non-empty array" },
	{ "chunk offsets of the wrong length", chunk_short_dims, NULL, -EBADMSG,
	  "tensor 'w' chunk 1: offsets and shape must be 2 non-negative integers" },

	/* File indexes. */
	{ "file index out of range", file_out_of_range, NULL, -EBADMSG,
	  "tensor 'w' chunk 0: file is not an index below 2" },
	{ "file index 2^63-1", file_huge, NULL, -EBADMSG,
	  "tensor 'w' chunk 1: file is not an index below 2" },
	{ "negative file index", file_negative, NULL, -EBADMSG,
	  "tensor 'b' chunk 0: file is not an index below 2" },
	{ "blob file index out of range", blob_file_out_of_range, NULL, -EBADMSG,
	  "blob 'rng' chunk 0: file is not an index below 2" },
	{ "file rank not below world", file_rank_past_world, NULL, -EBADMSG,
	  "manifest file 1: rank is not an integer below 2" },

	/* Tilings. */
	{ "0-D tensor with 2 chunks", scalar_twice, NULL, -EBADMSG,
	  "tensor 's': chunks 0 and 1 overlap (at [] and [])" },
	{ "chunk listed twice", chunk_twice, NULL, -EBADMSG,
	  "tensor 'w': chunks 1 and 2 overlap (at [2,0] and [2,0])" },

	/* Not JSON, or not what we read. */
	{ "not JSON", NULL, not_json, -EBADMSG, "manifest is not valid JSON" },
	{ "empty text", NULL, cut_all, -EBADMSG, "manifest is not valid JSON" },
	{ "truncated JSON", NULL, cut_half, -EBADMSG, "manifest is not valid JSON" },
	{ "last brace missing", NULL, cut_last, -EBADMSG, "manifest is not valid JSON" },
	{ "NUL byte inside", NULL, nul_inside, -EBADMSG, "manifest is not valid JSON" },
	{ "duplicate key", NULL, duplicate_key, -EBADMSG, "manifest is not valid JSON" },
	{ "a JSON array", NULL, json_array_text, -EBADMSG, "manifest is not a JSON object" },
	{ "dimension 2^64", shape_mark, mark_2_64, -EBADMSG, "manifest is not valid JSON" },
	{ "dimension 2^63", shape_mark, mark_2_63, -EBADMSG, "manifest is not valid JSON" },
	{ "dimension 1e400", shape_mark, mark_huge, -EBADMSG, "manifest is not valid JSON" },
	{ "begin 2^64", begin_mark, mark_2_64, -EBADMSG, "manifest is not valid JSON" },
};

START_TEST(test_corrupt)
{
	const struct corrupt_case *c = &corrupts[_i];
	struct manifest m;
	struct gen g;
	char err[512], *dumped, *text;
	size_t len;
	int ret;

	base_manifest(&g);
	if (c->tree)
		c->tree(g.root);
	dumped = gen_text(&g);
	/* Room for the text edits to grow it. */
	len = strlen(dumped);
	text = calloc(len + 64, 1);
	ck_assert_ptr_nonnull(text);
	memcpy(text, dumped, len);
	free(dumped);
	if (c->text)
		c->text(text, &len);
	ret = parse(text, len, &m, err, sizeof(err));
	ck_assert_msg(ret == c->want, "%s: returned %d (%s), want %d", c->what, ret, err, c->want);
	ck_assert_msg(strstr(err, c->reason) != NULL, "%s: '%s' lacks '%s'", c->what, err,
		      c->reason);
	free(text);
}
END_TEST

/* The base manifest itself parses, with every kind of item in it. */
START_TEST(test_base_valid)
{
	const struct manifest_tensor *t;
	struct manifest m;
	struct gen g;
	char err[512], *text;

	base_manifest(&g);
	text = gen_text(&g);
	ck_assert_msg(parse(text, strlen(text), &m, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(m.n_tensors, 4);
	ck_assert_uint_eq(m.n_items, 6);
	ck_assert_uint_eq(m.n_files, 2);
	ck_assert_str_eq(m.attempt, "a1b2");

	t = manifest_find(&m, ITEM_TENSOR, "w");
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->n_chunks, 2);
	ck_assert_uint_eq(t->chunks[1].file, 1);
	ck_assert_uint_eq(t->chunks[1].end - t->chunks[1].begin, 48);

	t = manifest_find(&m, ITEM_TENSOR, "s"); /* a scalar: 0-D, one element */
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->ndim, 0);
	ck_assert_uint_eq(t->chunks[0].end - t->chunks[0].begin, 8);

	t = manifest_find(&m, ITEM_TENSOR, "e"); /* zero-size */
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->shape[0], 0);
	ck_assert_uint_eq(t->chunks[0].begin, t->chunks[0].end);

	t = manifest_find(&m, ITEM_BLOB, "big");
	ck_assert_ptr_nonnull(t);
	ck_assert_uint_eq(t->kind, ITEM_BLOB);
	ck_assert_uint_eq(t->shape[0], (2u << 20) + 3);
	ck_assert_uint_eq(layout_crc_count(t->chunks[0].begin, t->chunks[0].end), 3);
	ck_assert_uint_eq(t->chunks[0].crcs[2], 0x1002);
	ck_assert_ptr_nonnull(manifest_find(&m, ITEM_BLOB, "rng"));
	ck_assert_ptr_null(manifest_find(&m, ITEM_TENSOR, "rng"));
	manifest_free(&m);
	free(text);
}
END_TEST

/* Blobs only, including an empty one; and a manifest with no items. */
START_TEST(test_blobs_only)
{
	struct manifest m;
	struct gen g;
	char err[512], *text;

	gen_init(&g, 3);
	gen_blob(&g, "empty", 0);
	gen_blob(&g, "rng", 16);
	gen_blob(&g, "cfg", 4096);
	gen_finish(&g);
	text = gen_text(&g);
	ck_assert_msg(parse(text, strlen(text), &m, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(m.n_tensors, 0);
	ck_assert_uint_eq(m.n_items, 3);
	ck_assert_str_eq(m.items[0].name, "cfg");
	ck_assert_uint_eq(m.items[1].chunks[0].begin, m.items[1].chunks[0].end);
	manifest_free(&m);
	free(text);

	gen_init(&g, 1);
	gen_finish(&g);
	text = gen_text(&g);
	ck_assert_msg(parse(text, strlen(text), &m, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(m.n_items, 0);
	manifest_free(&m);
	free(text);
}
END_TEST

/* ---- scale ----------------------------------------------------------------- */

/*
 * 1,024 ranks x 500 tensors, each tensor sharded over every rank: rows of
 * [1024,4], columns of [4,1024], or a 32x32 grid of [64,64]; every other
 * tensor lists its chunks in reverse, so that the check sorts them.  The
 * text is written directly (a jansson tree of it would cost a gigabyte).
 * It must parse; how long it takes is left to the benchmarks.
 */
START_TEST(test_scale)
{
	enum { R = 1024, T = 500, G = 32 };
	uint64_t *used = calloc(R, sizeof(*used)), total = 0;
	const struct manifest_tensor *t;
	struct manifest m;
	char err[512], *text = NULL, name[64];
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	ck_assert_ptr_nonnull(used);
	ck_assert_ptr_nonnull(f);
	for (uint32_t r = 0; r < R; r++)
		used[r] = DATA_START;
	fprintf(f, "{\"format\":\"ckpt-1\",\"name\":\"step-5\",\"step\":5,"
		   "\"time\":\"2026-11-23T03:09:36Z\",\"job\":\"job-1\",\"world_size\":%d,"
		   "\"crc_block\":%u,\"metadata\":{},\"metrics\":{},\"blobs\":{},\"tensors\":{",
		R, LAYOUT_CRC_BLOCK);
	for (int i = 0; i < T; i++) {
		int kind = i % 3;

		fprintf(f, "%s\"model.layers.%d.weight\":{\"dtype\":\"F32\",\"shape\":%s,\"chunks\":[",
			i ? "," : "", i, kind == 0 ? "[1024,4]" : kind == 1 ? "[4,1024]" : "[64,64]");
		for (int k = 0; k < R; k++) {
			uint32_t r = (uint32_t)(i % 2 ? R - 1 - k : k);
			uint64_t b = used[r], e = b + 16;

			if (kind == 0)
				fprintf(f, "%s{\"offsets\":[%u,0],\"shape\":[1,4]", k ? "," : "", r);
			else if (kind == 1)
				fprintf(f, "%s{\"offsets\":[0,%u],\"shape\":[4,1]", k ? "," : "", r);
			else
				fprintf(f, "%s{\"offsets\":[%u,%u],\"shape\":[2,2]", k ? "," : "",
					r / G * 2, r % G * 2);
			fprintf(f, ",\"file\":%u,\"begin\":%llu,\"end\":%llu,\"crc32c\":[", r,
				(unsigned long long)b, (unsigned long long)e);
			for (uint32_t p = 0; p < layout_crc_count(b, e); p++)
				fprintf(f, "%s%u", p ? "," : "", p);
			fprintf(f, "]}");
			used[r] = e;
		}
		fprintf(f, "]}");
	}
	fprintf(f, "},\"files\":[");
	for (uint32_t r = 0; r < R; r++) {
		index_shard_name(r, name, sizeof(name));
		fprintf(f, "%s{\"rank\":%u,\"path\":\"%s\",\"size\":%llu}", r ? "," : "", r, name,
			(unsigned long long)used[r]);
		total += used[r];
	}
	fprintf(f, "],\"total_bytes\":%llu}", (unsigned long long)total);
	ck_assert_int_eq(fclose(f), 0);

	ck_assert_msg(parse(text, len, &m, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(m.n_tensors, T);
	ck_assert_uint_eq(m.n_files, R);
	ck_assert_uint_eq(m.total_bytes, total);
	for (int i = 0; i < T; i += 7) {
		snprintf(name, sizeof(name), "model.layers.%d.weight", i);
		t = manifest_find(&m, ITEM_TENSOR, name);
		ck_assert_ptr_nonnull(t);
		ck_assert_uint_eq(t->n_chunks, R);
		ck_assert_uint_eq(t->chunks[0].file, i % 2 ? R - 1 : 0);
	}
	manifest_free(&m);
	free(text);
	free(used);
}
END_TEST

/* ---- boxcheck on its own ----------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rnd(uint64_t n)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return n ? rng_state % n : 0;
}

struct rbox {
	uint64_t o[3], s[3];
};

static uint64_t rvol(const struct rbox *b, unsigned ndim)
{
	uint64_t v = 1;

	for (unsigned d = 0; d < ndim; d++)
		v *= b->s[d];
	return v;
}

static bool rmeet(const struct rbox *a, const struct rbox *b, unsigned ndim)
{
	if (!rvol(a, ndim) || !rvol(b, ndim))
		return false;
	for (unsigned d = 0; d < ndim; d++)
		if (a->o[d] >= b->o[d] + b->s[d] || b->o[d] >= a->o[d] + a->s[d])
			return false;
	return true;
}

/* Cuts the box g into at most max pieces: either by random guillotine cuts
 * (split a random piece in a random dimension) or as a grid with random cut
 * positions in each dimension.  Returns the number of pieces. */
static size_t random_tiling(unsigned ndim, const uint64_t *g, struct rbox *b, size_t max)
{
	size_t n = 1;

	memset(&b[0], 0, sizeof(b[0]));
	for (unsigned d = 0; d < ndim; d++)
		b[0].s[d] = g[d];
	if (rnd(2)) {
		size_t want = 1 + rnd(max);

		for (size_t tries = 0; n < want && tries < 8 * max; tries++) {
			size_t k = rnd(n);
			unsigned d = (unsigned)rnd(ndim);
			uint64_t cut;

			if (!ndim || b[k].s[d] < 2)
				continue;
			cut = 1 + rnd(b[k].s[d] - 1);
			b[n] = b[k];
			b[n].o[d] += cut;
			b[n].s[d] -= cut;
			b[k].s[d] = cut;
			n++;
		}
		return n;
	}
	/* A grid: cuts[d] holds the segment starts, then g[d]. */
	uint64_t cuts[3][5];
	size_t nseg[3] = { 1, 1, 1 };

	for (unsigned d = 0; d < ndim; d++) {
		size_t want = 1 + rnd(g[d] < 4 ? g[d] : 4);

		cuts[d][0] = 0;
		while (nseg[d] < want) {
			uint64_t c = 1 + rnd(g[d] - 1);
			size_t i = nseg[d];
			bool have = false;

			for (size_t j = 0; j < nseg[d]; j++)
				have = have || cuts[d][j] == c;
			if (have)
				continue;
			while (i > 0 && cuts[d][i - 1] > c) {
				cuts[d][i] = cuts[d][i - 1];
				i--;
			}
			cuts[d][i] = c;
			nseg[d]++;
		}
		cuts[d][nseg[d]] = g[d];
	}
	n = 0;
	for (size_t i = 0; i < nseg[0]; i++)
		for (size_t j = 0; j < nseg[1]; j++)
			for (size_t k = 0; k < nseg[2] && n < max; k++) {
				size_t at[3] = { i, j, k };

				memset(&b[n], 0, sizeof(b[n]));
				for (unsigned d = 0; d < ndim; d++) {
					b[n].o[d] = cuts[d][at[d]];
					b[n].s[d] = cuts[d][at[d] + 1] - cuts[d][at[d]];
				}
				n++;
			}
	return n;
}

/* One random change that may make the tiling wrong (or not). */
static size_t perturb(unsigned ndim, const uint64_t *g, struct rbox *b, size_t n, size_t cap)
{
	size_t k = rnd(n);
	unsigned d = (unsigned)rnd(ndim);

	switch (rnd(5)) {
	case 0: /* a box of volume 0 anywhere inside */
		if (!ndim || n >= cap)
			break;
		for (unsigned i = 0; i < ndim; i++) {
			b[n].o[i] = rnd(g[i] + 1);
			b[n].s[i] = rnd(g[i] - b[n].o[i] + 1);
		}
		b[n].s[d] = 0;
		return n + 1;
	case 1: /* a box twice */
		if (n >= cap)
			break;
		b[n] = b[k];
		return n + 1;
	case 2: /* a box gone */
		if (n < 2)
			break;
		b[k] = b[n - 1];
		return n - 1;
	case 3: /* a box moved by one */
		if (!ndim)
			break;
		if (rnd(2) && b[k].o[d] > 0)
			b[k].o[d]--;
		else if (b[k].o[d] + b[k].s[d] < g[d])
			b[k].o[d]++;
		break;
	case 4: /* a box one longer or shorter */
		if (!ndim)
			break;
		if (rnd(2) && b[k].s[d] > 0)
			b[k].s[d]--;
		else if (b[k].o[d] + b[k].s[d] < g[d])
			b[k].s[d]++;
		break;
	}
	return n;
}

/* Checks boxcheck's verdict on b[0..n) against comparing every pair. */
static void check_against_pairs(struct boxcheck *bc, unsigned ndim, const uint64_t *g,
				const struct rbox *b, size_t n, int iter)
{
	struct boxcheck_result res;
	enum boxcheck_verdict v;
	bool overlap = false;
	uint64_t total = 1, sum = 0;

	for (unsigned d = 0; d < ndim; d++)
		total *= g[d];
	for (size_t i = 0; i < n; i++) {
		sum += rvol(&b[i], ndim);
		for (size_t j = i + 1; j < n && !overlap; j++)
			overlap = rmeet(&b[i], &b[j], ndim);
	}
	ck_assert_int_eq(boxcheck_start(bc, ndim, g), 0);
	for (size_t i = 0; i < n; i++)
		ck_assert_int_eq(boxcheck_add(bc, b[i].o, b[i].s), 0);
	v = boxcheck_verdict(bc, &res);
	ck_assert_uint_eq(res.total, total);
	ck_assert_uint_eq(res.covered, sum);
	if (overlap) {
		ck_assert_msg(v == BOXCHECK_OVERLAP, "iteration %d: %zu boxes in %u-D: verdict %d, "
			      "want an overlap", iter, n, ndim, (int)v);
		ck_assert_uint_lt(res.first, res.second);
		ck_assert_uint_lt(res.second, n);
		ck_assert_msg(rmeet(&b[res.first], &b[res.second], ndim),
			      "iteration %d: boxes %zu and %zu do not overlap", iter, res.first,
			      res.second);
	} else {
		ck_assert_msg(v == (sum == total ? BOXCHECK_TILES : BOXCHECK_HOLE),
			      "iteration %d: %zu boxes in %u-D: verdict %d, sum %llu of %llu", iter,
			      n, ndim, (int)v, (unsigned long long)sum, (unsigned long long)total);
	}
}

/* Small random tilings in 0 to 3 dimensions, some spoilt, in random order:
 * the verdict is the one comparing every pair gives. */
START_TEST(test_boxcheck_random)
{
	enum { MAX = 80 };
	struct boxcheck bc = BOXCHECK_INIT;
	struct rbox b[MAX];

	rng_state = 0x9E3779B97F4A7C15ull;
	for (int iter = 0; iter < 6000; iter++) {
		unsigned ndim = (unsigned)rnd(4);
		uint64_t g[3] = { 1, 1, 1 };
		size_t n, changes = rnd(3);

		for (unsigned d = 0; d < ndim; d++)
			g[d] = 1 + rnd(9);
		n = random_tiling(ndim, g, b, MAX / 2);
		for (size_t c = 0; c < changes; c++)
			n = perturb(ndim, g, b, n, MAX);
		for (size_t i = n; i > 1; i--) {
			size_t j = rnd(i);
			struct rbox t = b[i - 1];

			b[i - 1] = b[j];
			b[j] = t;
		}
		check_against_pairs(&bc, ndim, g, b, n, iter);
	}
	boxcheck_free(&bc);
}
END_TEST

/* Larger 2-D guillotine tilings (long runs with one start), one box moved. */
START_TEST(test_boxcheck_random_large)
{
	enum { MAX = 1500 };
	struct boxcheck bc = BOXCHECK_INIT;
	struct rbox *b = calloc(MAX + 1, sizeof(*b));

	ck_assert_ptr_nonnull(b);
	rng_state = 0xD1B54A32D192ED03ull;
	for (int iter = 0; iter < 30; iter++) {
		uint64_t g[3] = { 16 + rnd(200), 16 + rnd(200), 1 };
		size_t n = random_tiling(2, g, b, MAX);

		if (iter % 3)
			n = perturb(2, g, b, n, MAX + 1);
		check_against_pairs(&bc, 2, g, b, n, iter);
	}
	boxcheck_free(&bc);
	free(b);
}
END_TEST

/*
 * The layout boxcheck.h names as its quadratic case: T columns of full
 * height beside 3T rows much wider than all the columns together, so that
 * the rows are the first sweep dimension and every column meets the start
 * of every row.  Slow for large T, but right.
 */
START_TEST(test_boxcheck_long_beside_short)
{
	enum { T = 100, R = 3 * T, W = 1000000 };
	static uint64_t o[T + R][2], s[T + R][2];
	uint64_t g[2] = { R, T + W };
	struct boxcheck bc = BOXCHECK_INIT;
	struct boxcheck_result res;

	for (int i = 0; i < T; i++) {
		o[i][0] = 0; /* column i */
		o[i][1] = (uint64_t)i;
		s[i][0] = R;
		s[i][1] = 1;
	}
	for (int i = 0; i < R; i++) {
		o[T + i][0] = (uint64_t)i; /* row i, right of the columns */
		o[T + i][1] = T;
		s[T + i][0] = 1;
		s[T + i][1] = W;
	}
	ck_assert_int_eq(boxcheck_start(&bc, 2, g), 0);
	for (int i = 0; i < T + R; i++)
		ck_assert_int_eq(boxcheck_add(&bc, o[i], s[i]), 0);
	ck_assert_int_eq(boxcheck_verdict(&bc, &res), BOXCHECK_TILES);
	ck_assert_uint_eq(res.covered, (uint64_t)R * (T + W));

	/* Row 7 one column wider, into the last column. */
	o[T + 7][1] = T - 1;
	s[T + 7][1] = W + 1;
	ck_assert_int_eq(boxcheck_start(&bc, 2, g), 0);
	for (int i = 0; i < T + R; i++)
		ck_assert_int_eq(boxcheck_add(&bc, o[i], s[i]), 0);
	ck_assert_int_eq(boxcheck_verdict(&bc, &res), BOXCHECK_OVERLAP);
	ck_assert_uint_eq(res.first, T - 1);
	ck_assert_uint_eq(res.second, T + 7);
	boxcheck_free(&bc);
}
END_TEST

/* One struct for many tensors: each start forgets the last; freed, it can
 * start again. */
START_TEST(test_boxcheck_reuse)
{
	static const uint64_t g1[1] = { 100 }, g0[1] = { 0 };
	static uint64_t o[100], s[100];
	static const uint64_t zero[1] = { 0 }, one[1] = { 1 }, whole[1] = { 100 };
	struct boxcheck bc = BOXCHECK_INIT;
	struct boxcheck_result res;

	for (int i = 0; i < 100; i++) {
		o[i] = (uint64_t)i;
		s[i] = 1;
	}
	ck_assert_int_eq(boxcheck_start(&bc, 1, g1), 0);
	for (int i = 99; i >= 0; i--)
		ck_assert_int_eq(boxcheck_add(&bc, &o[i], &s[i]), 0);
	ck_assert_int_eq(boxcheck_verdict(&bc, &res), BOXCHECK_TILES);

	ck_assert_int_eq(boxcheck_start(&bc, 1, g1), 0);
	ck_assert_int_eq(boxcheck_add(&bc, zero, whole), 0);
	ck_assert_int_eq(boxcheck_add(&bc, &o[40], &s[40]), 0);
	ck_assert_int_eq(boxcheck_verdict(&bc, &res), BOXCHECK_OVERLAP);
	ck_assert_uint_eq(res.first, 0);
	ck_assert_uint_eq(res.second, 1);
	ck_assert_uint_eq(res.covered, 101);

	/* No boxes at all: a hole, unless the tensor is empty. */
	ck_assert_int_eq(boxcheck_start(&bc, 1, g1), 0);
	ck_assert_int_eq(boxcheck_verdict(&bc, &res), BOXCHECK_HOLE);
	ck_assert_uint_eq(res.covered, 0);
	ck_assert_int_eq(boxcheck_start(&bc, 1, g0), 0);
	ck_assert_int_eq(boxcheck_verdict(&bc, &res), BOXCHECK_TILES);

	/* Empty boxes are numbered, but never overlap. */
	ck_assert_int_eq(boxcheck_start(&bc, 1, g1), 0);
	ck_assert_int_eq(boxcheck_add(&bc, zero, zero), 0);
	ck_assert_int_eq(boxcheck_add(&bc, zero, whole), 0);
	ck_assert_int_eq(boxcheck_add(&bc, &o[3], zero), 0);
	ck_assert_int_eq(boxcheck_add(&bc, &o[3], one), 0);
	ck_assert_int_eq(boxcheck_verdict(&bc, &res), BOXCHECK_OVERLAP);
	ck_assert_uint_eq(res.first, 1);
	ck_assert_uint_eq(res.second, 3);

	boxcheck_free(&bc);
	boxcheck_free(&bc);
	ck_assert_int_eq(boxcheck_start(&bc, 0, NULL), 0);
	ck_assert_int_eq(boxcheck_add(&bc, NULL, NULL), 0);
	ck_assert_int_eq(boxcheck_verdict(&bc, &res), BOXCHECK_TILES);
	ck_assert_int_eq(boxcheck_add(&bc, NULL, NULL), 0);
	ck_assert_int_eq(boxcheck_verdict(&bc, &res), BOXCHECK_OVERLAP);
	ck_assert_uint_eq(res.covered, 2);
	ck_assert_uint_eq(res.total, 1);
	boxcheck_free(&bc);
	boxcheck_free(NULL);
}
END_TEST

START_TEST(test_boxcheck_overflow)
{
	static const uint64_t fits[2] = { 1ull << 32, (1ull << 32) - 1 };
	static const uint64_t over[2] = { 1ull << 32, 1ull << 32 };
	static const uint64_t zero_first[3] = { 0, 1ull << 40, 1ull << 40 };
	struct boxcheck bc = BOXCHECK_INIT;
	struct boxcheck_result res;

	ck_assert_int_eq(boxcheck_start(&bc, 2, fits), 0);
	ck_assert_int_eq(boxcheck_add(&bc, (const uint64_t[]){ 0, 0 }, fits), 0);
	ck_assert_int_eq(boxcheck_verdict(&bc, &res), BOXCHECK_TILES);
	ck_assert_uint_eq(res.total, UINT64_MAX - UINT32_MAX);
	ck_assert_int_eq(boxcheck_start(&bc, 2, over), -EOVERFLOW);
	/* 0 x 2^40 x 2^40 is 0: no overflow once a dimension is 0. */
	ck_assert_int_eq(boxcheck_start(&bc, 3, zero_first), 0);
	boxcheck_free(&bc);
}
END_TEST

static Suite *manifest_suite(void)
{
	Suite *s = suite_create("manifest");
	TCase *tc;

	tc = tcase_create("layouts");
	tcase_add_loop_test(tc, test_layout, 0, N(layouts));
	suite_add_tcase(s, tc);
	tc = tcase_create("corrupt");
	tcase_add_loop_test(tc, test_corrupt, 0, N(corrupts));
	suite_add_tcase(s, tc);
	tc = tcase_create("valid");
	tcase_add_test(tc, test_base_valid);
	tcase_add_test(tc, test_blobs_only);
	suite_add_tcase(s, tc);
	tc = tcase_create("boxcheck");
	tcase_add_test(tc, test_boxcheck_random);
	tcase_add_test(tc, test_boxcheck_random_large);
	tcase_add_test(tc, test_boxcheck_long_beside_short);
	tcase_add_test(tc, test_boxcheck_reuse);
	tcase_add_test(tc, test_boxcheck_overflow);
	suite_add_tcase(s, tc);
	tc = tcase_create("scale");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_scale);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(manifest_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
