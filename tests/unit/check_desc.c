/* SPDX-License-Identifier: MIT */
/*
 * check_desc.c - the save descriptor: round trip, the documented wire
 * layout, malformed input (one reason each), truncation at every byte, and
 * a seeded mutation loop that must never crash the parser.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "format/desc.h"
#include "format/layout.h"
#include "format/safetensors.h"

/* Offsets of the version 2 encoding, written out from desc.h so that the
 * tests check the documented layout rather than the parser's own structs. */
enum {
	H_MAGIC = 0,
	H_VERSION = 4,
	H_TOTAL = 8,
	H_STEP = 16,
	H_FILE_SIZE = 24,
	H_DATA_START = 32,
	H_N_ITEMS = 40,
	H_N_DIMS = 44,
	H_STRINGS = 48,
	H_META = 52,
	H_NAME_LEN = 56,
	H_ROOT_LEN = 60,
	HDR = 64,

	R_NAME_OFF = 0,
	R_NAME_LEN = 4,
	R_KIND = 8,
	R_DTYPE = 9,
	R_NDIM = 10,
	R_FLAGS = 11,
	R_DIMS = 12,
	R_BEGIN = 16,
	R_END = 24,
	REC = 32,
};

static void put32(unsigned char *p, size_t off, uint32_t v)
{
	memcpy(p + off, &v, sizeof(v));
}

static void put64(unsigned char *p, size_t off, uint64_t v)
{
	memcpy(p + off, &v, sizeof(v));
}

static uint32_t get32(const unsigned char *p, size_t off)
{
	uint32_t v;

	memcpy(&v, p + off, sizeof(v));
	return v;
}

/* ---- a test-side encoder, from desc.h's description ---- */

#define MAX_TITEMS 3

struct titem {
	const char *name;
	size_t name_len; /* 0: strlen(name) */
	unsigned kind, dtype, ndim, flags;
	uint64_t dims[256]; /* the wire entries: ndim, or 3 * ndim if sharded */
	uint64_t begin, end;
};

struct spec {
	const char *name, *root, *meta;
	size_t name_len, root_len; /* 0: strlen */
	uint64_t step, file_size, data_start;
	unsigned n_items;
	struct titem items[MAX_TITEMS];
	unsigned extra_dims, extra_strings; /* unused entries / bytes appended */
};

/*
 * The base of the malformed table, itself good: w = F32 [2,3], a sharded
 * chunk at offset [2,0] of [4,3] (24 bytes) at [4096, 4120), and blob b (8
 * bytes) at [4120, 4128).
 */
static void base_spec(struct spec *s)
{
	memset(s, 0, sizeof(*s));
	s->name = "s";
	s->root = "/r";
	s->meta = "{\"meta\":{},\"metrics\":{}}";
	s->step = 1;
	s->file_size = 4128;
	s->data_start = 4096;
	s->n_items = 2;
	s->items[0] = (struct titem){ .name = "w", .kind = ITEM_TENSOR, .dtype = CKPT_F32,
				      .ndim = 2, .flags = 1, .dims = { 2, 3, 4, 3, 2, 0 },
				      .begin = 4096, .end = 4120 };
	s->items[1] = (struct titem){ .name = "b", .kind = ITEM_BLOB, .dtype = CKPT_U8,
				      .ndim = 1, .dims = { 8 }, .begin = 4120, .end = 4128 };
}

static size_t slen(const char *s, size_t n)
{
	return n ? n : strlen(s);
}

static unsigned twire(const struct titem *it)
{
	return it->flags & 1 ? 3 * it->ndim : it->ndim;
}

/* Encodes s with every count, offset and length consistent.  Returns a
 * malloc'd buffer of *ret_len bytes with `slack` spare bytes after it. */
static unsigned char *encode(const struct spec *s, size_t slack, size_t *ret_len)
{
	size_t nl = slen(s->name, s->name_len), rl = slen(s->root, s->root_len);
	size_t ml = strlen(s->meta), strings = nl + rl + s->extra_strings;
	size_t n_dims = s->extra_dims, total, at, pool, dpos = 0, spos;
	unsigned char *p;

	for (unsigned i = 0; i < s->n_items; i++) {
		ck_assert_uint_le(twire(&s->items[i]), 256);
		n_dims += twire(&s->items[i]);
		strings += slen(s->items[i].name, s->items[i].name_len);
	}
	total = HDR + s->n_items * REC + n_dims * 8 + strings + ml;
	p = calloc(1, total + slack);
	ck_assert_ptr_nonnull(p);
	memcpy(p + H_MAGIC, "CKDS", 4);
	put32(p, H_VERSION, 2);
	put64(p, H_TOTAL, total);
	put64(p, H_STEP, s->step);
	put64(p, H_FILE_SIZE, s->file_size);
	put64(p, H_DATA_START, s->data_start);
	put32(p, H_N_ITEMS, s->n_items);
	put32(p, H_N_DIMS, (uint32_t)n_dims);
	put32(p, H_STRINGS, (uint32_t)strings);
	put32(p, H_META, (uint32_t)ml);
	put32(p, H_NAME_LEN, (uint32_t)nl);
	put32(p, H_ROOT_LEN, (uint32_t)rl);
	at = HDR + s->n_items * REC;
	pool = at + n_dims * 8;
	memcpy(p + pool, s->name, nl);
	memcpy(p + pool + nl, s->root, rl);
	spos = nl + rl;
	for (unsigned i = 0; i < s->n_items; i++) {
		const struct titem *it = &s->items[i];
		size_t r = HDR + i * REC, n = slen(it->name, it->name_len);

		put32(p, r + R_NAME_OFF, (uint32_t)spos);
		put32(p, r + R_NAME_LEN, (uint32_t)n);
		p[r + R_KIND] = (unsigned char)it->kind;
		p[r + R_DTYPE] = (unsigned char)it->dtype;
		p[r + R_NDIM] = (unsigned char)it->ndim;
		p[r + R_FLAGS] = (unsigned char)it->flags;
		put32(p, r + R_DIMS, (uint32_t)dpos);
		put64(p, r + R_BEGIN, it->begin);
		put64(p, r + R_END, it->end);
		for (unsigned d = 0; d < twire(it); d++)
			put64(p, at + (dpos + d) * 8, it->dims[d]);
		dpos += twire(it);
		memcpy(p + pool + spos, it->name, n);
		spos += n;
	}
	memcpy(p + pool + strings, s->meta, ml);
	*ret_len = total;
	return p;
}

/* Parses a private copy of exactly len bytes (so ASan sees any read past
 * the end).  On failure checks the layout was left freed. */
static int parse_exact(const unsigned char *buf, size_t len, struct layout *p, char *err,
		       size_t errlen)
{
	char *copy = malloc(len ? len : 1);
	int r;

	ck_assert_ptr_nonnull(copy);
	memcpy(copy, buf, len);
	memset(p, 0, sizeof(*p));
	err[0] = '\0';
	r = desc_parse(copy, len, p, err, errlen);
	free(copy);
	if (r < 0) {
		ck_assert_ptr_null(p->items);
		ck_assert_ptr_null(p->dims);
		ck_assert_ptr_null(p->meta);
		ck_assert_ptr_null(p->metrics);
		ck_assert_ptr_null(p->root);
	}
	return r;
}

/* ---- round trips ---- */

static void place(struct layout *l)
{
	char *json;
	size_t len;

	ck_assert_int_eq(layout_pack(l), 0);
	ck_assert_int_eq(st_header_json(l, 0, &json, &len), 0);
	ck_assert_int_eq(layout_place(l, len), 0);
	free(json);
}

/* A layout with every kind of item: sharded, whole, zero-size, scalar,
 * blob, names with quotes and backslashes, metadata and metrics. */
static void build_sample(struct layout *l)
{
	uint64_t s1[2] = { 2, 3 }, g1[2] = { 4, 3 }, o1[2] = { 2, 0 };
	uint64_t s2[3] = { 300, 1024, 1 }, s3[2] = { 0, 7 }, blob[1] = { 1000 };

	ck_assert_int_eq(layout_init(l, "/data/ck pt", "step-100", 100), 0);
	ck_assert_int_eq(layout_add(l, ITEM_TENSOR, "w", CKPT_F32, 2, s1, g1, o1, NULL, 0), 0);
	ck_assert_int_eq(layout_add(l, ITEM_TENSOR, "big \"q\"\\", CKPT_BF16, 3, s2, NULL, NULL,
				    NULL, 0), 0);
	ck_assert_int_eq(layout_add(l, ITEM_TENSOR, "empty", CKPT_I64, 2, s3, NULL, NULL, NULL, 0),
			 0);
	ck_assert_int_eq(layout_add(l, ITEM_TENSOR, "scalar", CKPT_F8_E5M2, 0, NULL, NULL, NULL,
				    NULL, 0), 0);
	ck_assert_int_eq(layout_add(l, ITEM_BLOB, "rng", CKPT_U8, 1, blob, NULL, NULL, NULL, 0), 0);
	json_object_set_new(l->meta, "model", json_string("llama \"7b\"\n\xc3\xa9"));
	json_object_set_new(l->meta, "git", json_string("abc123"));
	json_object_set_new(l->metrics, "loss", json_real(1.25));
	json_object_set_new(l->metrics, "acc", json_real(0.1));
	json_object_set_new(l->metrics, "tiny", json_real(-3.4e-300));
	place(l);
}

static void assert_same(const struct layout *a, const struct layout *b)
{
	ck_assert_str_eq(a->name, b->name);
	ck_assert_str_eq(a->root, b->root);
	ck_assert_uint_eq(a->step, b->step);
	ck_assert_uint_eq(a->file_size, b->file_size);
	ck_assert_uint_eq(a->data_start, b->data_start);
	ck_assert_uint_eq(a->n_crcs, b->n_crcs);
	ck_assert(json_equal(a->meta, b->meta));
	ck_assert(json_equal(a->metrics, b->metrics));
	ck_assert_uint_eq(a->n_items, b->n_items);
	ck_assert_uint_eq(a->n_dims, b->n_dims);
	for (size_t i = 0; i < a->n_items; i++) {
		const struct layout_item *x = &a->items[i], *y = &b->items[i];

		ck_assert_str_eq(x->name, y->name);
		ck_assert_uint_eq(x->kind, y->kind);
		ck_assert_uint_eq(x->dtype, y->dtype);
		ck_assert_uint_eq(x->ndim, y->ndim);
		ck_assert_int_eq(x->sharded, y->sharded);
		ck_assert_uint_eq(x->begin, y->begin);
		ck_assert_uint_eq(x->end, y->end);
		ck_assert_uint_eq(x->crc0, y->crc0);
		if (x->ndim) /* a layout of scalars only has no dims array */
			ck_assert_int_eq(memcmp(layout_shape(a, x), layout_shape(b, y),
						3u * x->ndim * sizeof(uint64_t)), 0);
	}
}

START_TEST(test_round_trip)
{
	struct layout l, p;
	char err[256] = "";
	char *text, *text2;
	size_t len, len2;

	build_sample(&l);
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	memset(&p, 0, sizeof(p));
	ck_assert_msg(desc_parse(text, len, &p, err, sizeof(err)) == 0, "%s", err);
	assert_same(&l, &p);
	ck_assert(p.items[0].sharded);
	ck_assert(!p.items[1].sharded);
	ck_assert_uint_eq(layout_gshape(&p, &p.items[0])[0], 4);
	ck_assert_uint_eq(layout_offs(&p, &p.items[0])[0], 2);
	/* An unsharded item's gshape and offs are filled in as layout_add does. */
	ck_assert_uint_eq(layout_gshape(&p, &p.items[1])[1], 1024);
	ck_assert_uint_eq(layout_offs(&p, &p.items[1])[1], 0);
	/* Building the parsed layout again gives the same bytes. */
	ck_assert_int_eq(desc_build(&p, &text2, &len2), 0);
	ck_assert_uint_eq(len, len2);
	ck_assert_int_eq(memcmp(text, text2, len), 0);
	free(text2);
	free(text);
	layout_free(&l);
	layout_free(&p);
}
END_TEST

START_TEST(test_round_trip_empty)
{
	struct layout l, p;
	char err[256] = "";
	char *text;
	size_t len;

	ck_assert_int_eq(layout_init(&l, "/", "e", 0), 0);
	place(&l);
	ck_assert_uint_eq(l.file_size, 4096);
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	memset(&p, 0, sizeof(p));
	ck_assert_msg(desc_parse(text, len, &p, err, sizeof(err)) == 0, "%s", err);
	assert_same(&l, &p);
	free(text);
	layout_free(&l);
	layout_free(&p);
}
END_TEST

/* Only scalars: the layout has no dims at all. */
START_TEST(test_round_trip_scalars)
{
	struct layout l, p;
	char err[256] = "";
	char *text;
	size_t len;

	ck_assert_int_eq(layout_init(&l, "/r", "s", 3), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "a", CKPT_F64, 0, NULL, NULL, NULL, NULL, 0),
			 0);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "b", CKPT_BOOL, 0, NULL, NULL, NULL, NULL, 0),
			 0);
	place(&l);
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	ck_assert_uint_eq(get32((const unsigned char *)text, H_N_DIMS), 0);
	memset(&p, 0, sizeof(p));
	ck_assert_msg(desc_parse(text, len, &p, err, sizeof(err)) == 0, "%s", err);
	assert_same(&l, &p);
	free(text);
	layout_free(&l);
	layout_free(&p);
}
END_TEST

/* desc_build writes exactly what desc.h describes: the same layout through
 * the test's own encoder gives the same bytes. */
START_TEST(test_wire_layout)
{
	uint64_t s1[2] = { 2, 3 }, g1[2] = { 4, 3 }, o1[2] = { 2, 0 }, sb[1] = { 8 };
	struct layout l;
	struct spec s;
	unsigned char *want;
	char *text;
	size_t len, wlen;

	ck_assert_int_eq(layout_init(&l, "/r", "s", 1), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "w", CKPT_F32, 2, s1, g1, o1, NULL, 0), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_BLOB, "b", CKPT_U8, 1, sb, NULL, NULL, NULL, 0), 0);
	place(&l);
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	base_spec(&s);
	want = encode(&s, 0, &wlen);
	ck_assert_uint_eq(len, wlen);
	ck_assert_int_eq(memcmp(text, want, len), 0);
	free(want);
	free(text);
	layout_free(&l);
}
END_TEST

/* Integer metrics from a peer become reals, so they compare with ours. */
START_TEST(test_integer_metric)
{
	struct layout p;
	struct spec s;
	char err[256];
	unsigned char *d;
	size_t len;

	base_spec(&s);
	s.meta = "{\"metrics\": {\"epoch\": 3}, \"meta\": {\"k\": \"v\"}}";
	d = encode(&s, 0, &len);
	ck_assert_msg(parse_exact(d, len, &p, err, sizeof(err)) == 0, "%s", err);
	ck_assert(json_is_real(json_object_get(p.metrics, "epoch")));
	ck_assert(json_real_value(json_object_get(p.metrics, "epoch")) == 3.0);
	ck_assert_str_eq(json_string_value(json_object_get(p.meta, "k")), "v");
	layout_free(&p);
	free(d);
}
END_TEST

/* ---- malformed input ---- */

/* The good base parses, so each case below fails for its own reason. */
START_TEST(test_base_is_good)
{
	struct layout p;
	struct spec s;
	char err[256];
	unsigned char *d;
	size_t len;

	base_spec(&s);
	d = encode(&s, 0, &len);
	ck_assert_msg(parse_exact(d, len, &p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(p.n_items, 2);
	ck_assert_uint_eq(p.n_crcs, 2);
	ck_assert_uint_eq(p.items[1].crc0, 1);
	ck_assert(p.items[0].sharded);
	ck_assert_uint_eq(layout_gshape(&p, &p.items[0])[0], 4);
	ck_assert_uint_eq(layout_offs(&p, &p.items[0])[0], 2);
	ck_assert_str_eq(p.items[1].name, "b");
	ck_assert_uint_eq(p.items[1].kind, ITEM_BLOB);
	layout_free(&p);
	free(d);
}
END_TEST

/* A case edits the spec before encoding, patches the bytes after (the buffer
 * has 64 spare bytes; *len may grow into them), or both. */
struct bad_desc {
	const char *what;
	void (*edit)(struct spec *s);
	void (*patch)(unsigned char *d, size_t *len);
	const char *reason; /* a substring of the message */
};

#define EDIT(fn, body)                                                                             \
	static void fn(struct spec *s)                                                             \
	{                                                                                          \
		body;                                                                              \
	}
#define PATCH(fn, body)                                                                            \
	static void fn(unsigned char *d, size_t *len)                                              \
	{                                                                                          \
		(void)len;                                                                         \
		body;                                                                              \
	}
#define W (s->items[0])
#define B (s->items[1])
#define ITEM0 HDR
#define ITEM1 (HDR + REC)

/* The header and its sections. */
PATCH(p_magic, d[0] = 'X')
PATCH(p_magic_json, memcpy(d, "{\"v\":", 5))
PATCH(p_version1, put32(d, H_VERSION, 1))
PATCH(p_version3, put32(d, H_VERSION, 3))
PATCH(p_version_swapped, put32(d, H_VERSION, 0x02000000))
PATCH(p_total_long, put64(d, H_TOTAL, *len + 1))
PATCH(p_total_huge, put64(d, H_TOTAL, UINT64_MAX))
PATCH(p_trailing, d[*len] = 'x'; *len += 1; put64(d, H_TOTAL, *len))
PATCH(p_n_items_max, put32(d, H_N_ITEMS, UINT32_MAX))
PATCH(p_n_items_cap, put32(d, H_N_ITEMS, CKPT_MAX_ITEMS + 1))
PATCH(p_n_items_small_buf, put32(d, H_N_ITEMS, CKPT_MAX_ITEMS))
PATCH(p_n_items_more, put32(d, H_N_ITEMS, 3))
PATCH(p_n_items_fewer, put32(d, H_N_ITEMS, 1))
PATCH(p_n_dims_huge, put32(d, H_N_DIMS, UINT32_MAX))
PATCH(p_strings_huge, put32(d, H_STRINGS, UINT32_MAX))
PATCH(p_meta_huge, put32(d, H_META, UINT32_MAX))
PATCH(p_meta_zero, put32(d, H_META, 0))
PATCH(p_name_len_huge, put32(d, H_NAME_LEN, UINT32_MAX))
PATCH(p_root_len_huge, put32(d, H_ROOT_LEN, UINT32_MAX))
PATCH(p_root_len_past, put32(d, H_ROOT_LEN, get32(d, H_STRINGS)))
EDIT(e_name_bad, s->name = "../x")
EDIT(e_name_hidden, s->name = ".x")
EDIT(e_name_empty, s->name = ""; s->name_len = 0)
EDIT(e_name_nul, s->name = "a\0b"; s->name_len = 3)
EDIT(e_name_long, static char n[CKPT_MAX_NAME_LEN + 2]; memset(n, 'a', CKPT_MAX_NAME_LEN + 1);
     s->name = n)
EDIT(e_root_relative, s->root = "r")
EDIT(e_root_dotdot, s->root = "/r/../x")
EDIT(e_root_empty, s->root = "")
EDIT(e_root_nul, s->root = "/r\0/x"; s->root_len = 5)
EDIT(e_ds_unaligned, s->data_start = 4000)
EDIT(e_ds_zero, s->data_start = 0; s->file_size = 32; W.begin = 0; W.end = 24; B.begin = 24;
     B.end = 32)
EDIT(e_ds_huge, s->data_start = 1u << 30)
EDIT(e_fs_short, s->file_size = 4127)
EDIT(e_fs_long, s->file_size = 8192)
EDIT(e_fs_no_items, s->n_items = 0)
EDIT(e_extra_dims, s->extra_dims = 1)
EDIT(e_extra_strings, s->extra_strings = 1)

/* The meta section. */
EDIT(e_meta_not_json, s->meta = "{\"meta\":{},")
EDIT(e_meta_empty, s->meta = "")
EDIT(e_meta_array, s->meta = "[]")
EDIT(e_meta_extra_key, s->meta = "{\"meta\":{},\"metrics\":{},\"x\":1}")
EDIT(e_meta_missing, s->meta = "{\"meta\":{}}")
EDIT(e_meta_dup, s->meta = "{\"meta\":{},\"meta\":{},\"metrics\":{}}")
EDIT(e_meta_not_object, s->meta = "{\"meta\":[],\"metrics\":{}}")
EDIT(e_metrics_not_object, s->meta = "{\"meta\":{},\"metrics\":7}")
EDIT(e_meta_value, s->meta = "{\"meta\":{\"k\":1},\"metrics\":{}}")
EDIT(e_meta_reserved, s->meta = "{\"meta\":{\"__k\":\"v\"},\"metrics\":{}}")
EDIT(e_meta_ctrl_key, s->meta = "{\"meta\":{\"a\\u0001\":\"v\"},\"metrics\":{}}")
EDIT(e_metric_string, s->meta = "{\"meta\":{},\"metrics\":{\"loss\":\"1\"}}")
EDIT(e_metric_inf, s->meta = "{\"meta\":{},\"metrics\":{\"loss\":1e999}}")
EDIT(e_metric_nan, s->meta = "{\"meta\":{},\"metrics\":{\"loss\":NaN}}")
EDIT(e_metric_empty_key, s->meta = "{\"meta\":{},\"metrics\":{\"\":1.0}}")

/* A meta section bigger than any valid one: refused before it is parsed. */
#define META_BIG (16u << 20)
EDIT(e_meta_big, static char *big; if (!big) big = malloc(META_BIG + 1);
     ck_assert_ptr_nonnull(big); memset(big, ' ', META_BIG); big[META_BIG] = '\0';
     s->meta = big)

/* Item names. */
EDIT(e_item_reserved, W.name = "__metadata__")
EDIT(e_item_ctrl, W.name = "a\x01")
EDIT(e_item_del, W.name = "a\x7f")
EDIT(e_item_utf8, W.name = "\xc3\xa9")
EDIT(e_item_nul, W.name = "a\0b"; W.name_len = 3)
EDIT(e_item_long, static char n[CKPT_MAX_ITEM_NAME + 2]; memset(n, 'n', CKPT_MAX_ITEM_NAME + 1);
     W.name = n)
EDIT(e_item_dup, B.name = "w")
PATCH(p_item_empty_name, put32(d, ITEM0 + R_NAME_LEN, 0); put32(d, ITEM1 + R_NAME_OFF, 3))
PATCH(p_item_name_off, put32(d, ITEM0 + R_NAME_OFF, 2))
PATCH(p_item_name_off_huge, put32(d, ITEM1 + R_NAME_OFF, UINT32_MAX))
PATCH(p_item_name_len_huge, put32(d, ITEM1 + R_NAME_LEN, UINT32_MAX))
PATCH(p_item_name_len_past, put32(d, ITEM1 + R_NAME_LEN, 2))

/* Item fields. */
EDIT(e_kind, W.kind = 2)
EDIT(e_kind_ctrl_name, W.kind = 2; W.name = "a\x01")
EDIT(e_dtype, W.dtype = CKPT_DTYPE_COUNT)
EDIT(e_dtype_255, W.dtype = 255)
EDIT(e_ndim_17, W.ndim = 17; W.flags = 0)
EDIT(e_ndim_255, W.ndim = 255; W.flags = 0)
EDIT(e_flags, W.flags = 3)
PATCH(p_dims_index, put32(d, ITEM1 + R_DIMS, 5))
PATCH(p_dims_index_huge, put32(d, ITEM1 + R_DIMS, UINT32_MAX))
PATCH(p_dims_past, d[ITEM1 + R_NDIM] = 2)
PATCH(p_dims_past_sharded, d[ITEM1 + R_FLAGS] = 1)
EDIT(e_bytes_mismatch, W.end = 4116; B.begin = 4116; B.dims[0] = 12)
EDIT(e_end_before_begin, W.end = 4000)
EDIT(e_end_huge, W.end = UINT64_MAX)
EDIT(e_overlap, B.begin = 4116; B.end = 4124)
EDIT(e_gap, B.begin = 4124; B.end = 4132; s->file_size = 4132)
EDIT(e_before_ds, W.begin = 0; W.end = 24; B.begin = 24; B.end = 32; s->file_size = 32)
EDIT(e_offs_past_gshape, W.dims[4] = 3)
EDIT(e_offs_huge, W.dims[4] = UINT64_MAX)
EDIT(e_whole_flagged, W.dims[2] = 2; W.dims[4] = 0)
EDIT(e_elem_overflow, W.flags = 0; W.ndim = 3; W.dims[0] = 1ull << 32; W.dims[1] = 1ull << 32;
     W.dims[2] = 4)
EDIT(e_byte_overflow, W.flags = 0; W.ndim = 1; W.dims[0] = 1ull << 62)
EDIT(e_gshape_overflow, W.dims[2] = 1ull << 62; W.dims[3] = 1ull << 62)
EDIT(e_blob_f32, B.dtype = CKPT_F32; B.dims[0] = 2)
EDIT(e_blob_2d, B.ndim = 2; B.dims[0] = 2; B.dims[1] = 4)
EDIT(e_blob_sharded, B.flags = 1; B.dims[1] = 16; B.dims[2] = 8)
#undef W
#undef B

static const struct bad_desc bad_descs[] = {
	{ "bad magic", NULL, p_magic, "magic \"CKDS\"" },
	{ "version 1 JSON", NULL, p_magic_json, "magic" },
	{ "version 1", NULL, p_version1, "descriptor version is 1, not 2" },
	{ "version 3", NULL, p_version3, "version is 3" },
	{ "other byte order", NULL, p_version_swapped, "version is 33554432" },
	{ "total_len long", NULL, p_total_long, "says it is 214 bytes but 213 arrived" },
	{ "total_len huge", NULL, p_total_huge, "descriptor says it is 18446744073709551615" },
	{ "trailing byte", NULL, p_trailing, "1 trailing bytes" },
	{ "n_items 2^32-1", NULL, p_n_items_max, "4294967295 items (at most 1000000)" },
	{ "n_items past the cap", NULL, p_n_items_cap, "at most 1000000" },
	{ "huge n_items, small buffer", NULL, p_n_items_small_buf,
	  "item table (1000000 items, 32000000 bytes) runs past its end" },
	{ "one item too many", NULL, p_n_items_more, "runs past its end" },
	{ "one item too few", NULL, p_n_items_fewer, "trailing bytes" },
	{ "n_dims huge", NULL, p_n_dims_huge, "dims array (4294967295 entries) runs past" },
	{ "strings_len huge", NULL, p_strings_huge, "string pool (4294967295 bytes) runs past" },
	{ "meta_len huge", NULL, p_meta_huge, "meta section (4294967295 bytes) runs past" },
	{ "meta_len zero", NULL, p_meta_zero, "trailing bytes" },
	{ "name_len huge", NULL, p_name_len_huge, "run past the string pool" },
	{ "root_len huge", NULL, p_root_len_huge, "run past the string pool" },
	{ "root_len past the pool", NULL, p_root_len_past, "run past the string pool" },
	{ "bad checkpoint name", e_name_bad, NULL, "contains '/'" },
	{ "hidden checkpoint name", e_name_hidden, NULL, "starts with '.'" },
	{ "empty checkpoint name", e_name_empty, NULL, "checkpoint name is empty" },
	{ "NUL in checkpoint name", e_name_nul, NULL, "checkpoint name holds a NUL byte at 1" },
	{ "long checkpoint name", e_name_long, NULL, "checkpoint name is 129 bytes (at most 128)" },
	{ "relative root", e_root_relative, NULL, "absolute" },
	{ "root with ..", e_root_dotdot, NULL, "'..'" },
	{ "empty root", e_root_empty, NULL, "root directory is empty" },
	{ "NUL in root", e_root_nul, NULL, "root directory holds a NUL byte at 2" },
	{ "unaligned data_start", e_ds_unaligned, NULL, "data_start 4000" },
	{ "zero data_start", e_ds_zero, NULL, "data_start 0" },
	{ "huge data_start", e_ds_huge, NULL, "data_start 1073741824" },
	{ "file_size short", e_fs_short, NULL, "items end at 4128 but file_size is 4127" },
	{ "file_size long", e_fs_long, NULL, "file_size is 8192" },
	{ "file_size without items", e_fs_no_items, NULL, "items end at 4096" },
	{ "unused dims", e_extra_dims, NULL, "dims array has 8 entries but the items use 7" },
	{ "unused pool bytes", e_extra_strings, NULL,
	  "string pool has 6 bytes but the names use 5" },
	{ "meta section not JSON", e_meta_not_json, NULL, "meta section is not valid JSON" },
	{ "meta section empty", e_meta_empty, NULL, "meta section is not valid JSON" },
	{ "meta section an array", e_meta_array, NULL, "exactly \"meta\" and \"metrics\"" },
	{ "meta section extra key", e_meta_extra_key, NULL, "exactly" },
	{ "meta section lacks metrics", e_meta_missing, NULL, "exactly" },
	{ "meta section duplicate key", e_meta_dup, NULL, "duplicate" },
	{ "meta not an object", e_meta_not_object, NULL, "meta is not an object" },
	{ "metrics not an object", e_metrics_not_object, NULL, "metrics is not an object" },
	{ "meta value not a string", e_meta_value, NULL, "meta 'k'" },
	{ "meta reserved key", e_meta_reserved, NULL, "meta key" },
	{ "meta key with a control char", e_meta_ctrl_key, NULL, "printable" },
	{ "metric not a number", e_metric_string, NULL, "metric 'loss'" },
	{ "non-finite metric", e_metric_inf, NULL, "not valid JSON" },
	{ "NaN metric", e_metric_nan, NULL, "not valid JSON" },
	{ "empty metric key", e_metric_empty_key, NULL, "metrics key" },
	{ "meta section too big", e_meta_big, NULL, "meta section is 16777216 bytes (at most" },
	{ "reserved item name", e_item_reserved, NULL,
	  "item 0: item name '__metadata__' starts with '__'" },
	{ "control char in item name", e_item_ctrl, NULL,
	  "item 0: item name 'a?' has a byte outside printable ASCII at 1" },
	{ "DEL in item name", e_item_del, NULL, "printable" },
	{ "UTF-8 in item name", e_item_utf8, NULL, "printable" },
	{ "NUL in item name", e_item_nul, NULL, "item 0: item name holds a NUL byte at 1" },
	{ "long item name", e_item_long, NULL, "item 0: item name is 513 bytes (at most 512)" },
	{ "empty item name", NULL, p_item_empty_name, "item 0: item name is empty" },
	{ "duplicate names", e_item_dup, NULL, "item 1 ('w'): name already used by item 0" },
	{ "name offset not packed", NULL, p_item_name_off,
	  "item 0: name at pool offset 2, expected 3" },
	{ "name offset huge", NULL, p_item_name_off_huge,
	  "item 1: name at pool offset 4294967295" },
	{ "name length huge", NULL, p_item_name_len_huge,
	  "item 1: name of 4294967295 bytes at 4 runs past" },
	{ "name length past the pool", NULL, p_item_name_len_past,
	  "item 1: name of 2 bytes at 4 runs past the string pool (5 bytes)" },
	{ "bad kind", e_kind, NULL, "item 0 ('w'): bad kind 2" },
	{ "bad kind, unprintable name", e_kind_ctrl_name, NULL, "item 0 ('a?'): bad kind 2" },
	{ "bad dtype", e_dtype, NULL, "item 0 ('w'): unknown dtype 15" },
	{ "dtype 255", e_dtype_255, NULL, "unknown dtype 255" },
	{ "ndim 17", e_ndim_17, NULL, "item 0 ('w'): 17 dimensions (at most 16)" },
	{ "ndim 255", e_ndim_255, NULL, "255 dimensions" },
	{ "unknown flags", e_flags, NULL, "item 0 ('w'): unknown flags 0x03" },
	{ "dims index not packed", NULL, p_dims_index,
	  "item 1 ('b'): dims at index 5, expected 6" },
	{ "dims index huge", NULL, p_dims_index_huge, "dims at index 4294967295" },
	{ "dims past the array", NULL, p_dims_past,
	  "item 1 ('b'): 2 dims at index 6 run past the dims array (7 entries)" },
	{ "sharded dims past the array", NULL, p_dims_past_sharded, "3 dims at index 6 run past" },
	{ "shape/bytes mismatch", e_bytes_mismatch, NULL,
	  "item 0 ('w'): shape [2,3] F32 is 24 bytes but the range holds 20" },
	{ "end before begin", e_end_before_begin, NULL, "ends at 4000, before it begins at 4096" },
	{ "end huge", e_end_huge, NULL, "is 24 bytes but the range holds" },
	{ "overlapping ranges", e_overlap, NULL,
	  "item 1 ('b'): begins at 4116 but the previous item ends at 4120 (overlap)" },
	{ "gap", e_gap, NULL, "(gap)" },
	{ "begins before data_start", e_before_ds, NULL, "begins at 0, before data_start 4096" },
	{ "offs+shape > gshape", e_offs_past_gshape, NULL,
	  "item 0: 'w': dimension 0: offset 3 + size 2 exceeds the global size 4" },
	{ "offs huge", e_offs_huge, NULL, "exceeds" },
	{ "sharded flag on a whole tensor", e_whole_flagged, NULL, "flagged sharded" },
	{ "element overflow", e_elem_overflow, NULL, "element count overflows" },
	{ "byte overflow", e_byte_overflow, NULL, "byte size overflows" },
	{ "global overflow", e_gshape_overflow, NULL, "global element count overflows" },
	{ "blob not U8", e_blob_f32, NULL, "blob 'b' must be a 1-D U8 array" },
	{ "blob 2-D", e_blob_2d, NULL, "blob" },
	{ "blob sharded", e_blob_sharded, NULL, "not sharded" },
};

START_TEST(test_malformed)
{
	const struct bad_desc *c = &bad_descs[_i];
	struct layout p;
	struct spec s;
	unsigned char *d;
	size_t len;
	char err[256];

	base_spec(&s);
	if (c->edit)
		c->edit(&s);
	d = encode(&s, 64, &len);
	if (c->patch)
		c->patch(d, &len);
	ck_assert_msg(parse_exact(d, len, &p, err, sizeof(err)) == -EBADMSG, "%s: accepted",
		      c->what);
	ck_assert_msg(strstr(err, c->reason) != NULL, "%s: reason '%s' lacks '%s'", c->what, err,
		      c->reason);
	free(d);
}
END_TEST

/* A name may hold any printable ASCII, '"' and '\' included: they need no
 * escaping in the pool. */
START_TEST(test_quotes_in_names)
{
	struct layout p;
	struct spec s;
	char err[256];
	unsigned char *d;
	size_t len;

	base_spec(&s);
	s.items[0].name = "w \"x\" \\ {}[],:";
	s.meta = "{\"meta\":{\"a \\\"b\\\"\":\"c\\\\\"},\"metrics\":{}}";
	d = encode(&s, 0, &len);
	ck_assert_msg(parse_exact(d, len, &p, err, sizeof(err)) == 0, "%s", err);
	ck_assert_str_eq(p.items[0].name, "w \"x\" \\ {}[],:");
	ck_assert_str_eq(json_string_value(json_object_get(p.meta, "a \"b\"")), "c\\");
	layout_free(&p);
	free(d);
}
END_TEST

/*
 * Cut the base at every length.  With total_len left alone the length check
 * refuses it; with total_len fixed up to the cut, the first section that
 * no longer fits is named.
 */
START_TEST(test_truncated)
{
	struct layout p;
	struct spec s;
	char err[256];
	unsigned char *d;
	size_t len, items_end, dims_end, strings_end;

	base_spec(&s);
	d = encode(&s, 0, &len);
	items_end = HDR + 2 * REC;
	dims_end = items_end + 7 * 8;
	strings_end = dims_end + 5;
	ck_assert_uint_eq(len, strings_end + strlen(s.meta));
	for (size_t cut = 0; cut < len; cut++) {
		const char *want;

		put64(d, H_TOTAL, len);
		if (cut >= HDR) {
			ck_assert_int_eq(parse_exact(d, cut, &p, err, sizeof(err)), -EBADMSG);
			ck_assert_msg(strstr(err, "descriptor says it is") != NULL, "cut %zu: %s",
				      cut, err);
		}
		put64(d, H_TOTAL, cut);
		if (cut < HDR)
			want = "shorter than its 64-byte header";
		else if (cut < items_end)
			want = "item table (2 items, 64 bytes) runs past its end";
		else if (cut < dims_end)
			want = "dims array (7 entries) runs past its end";
		else if (cut < strings_end)
			want = "string pool (5 bytes) runs past its end";
		else
			want = "meta section (24 bytes) runs past its end";
		ck_assert_int_eq(parse_exact(d, cut, &p, err, sizeof(err)), -EBADMSG);
		ck_assert_msg(strstr(err, want) != NULL, "cut %zu: '%s' lacks '%s'", cut, err, want);
	}
	free(d);
}
END_TEST

/* Too many meta keys (more than CKPT_MAX_META_KEYS) and a too-long value. */
START_TEST(test_meta_caps)
{
	struct layout l, p;
	char key[32], err[256];
	char *text, *val;
	size_t len;

	ck_assert_int_eq(layout_init(&l, "/r", "s", 1), 0);
	place(&l);
	for (int i = 0; i <= CKPT_MAX_META_KEYS; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		json_object_set_new(l.meta, key, json_string("v"));
	}
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	memset(&p, 0, sizeof(p));
	ck_assert_int_eq(desc_parse(text, len, &p, err, sizeof(err)), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err, "meta has 257 keys (at most 256)"));
	free(text);

	json_object_clear(l.meta);
	val = malloc(CKPT_MAX_META_LEN + 2);
	memset(val, 'v', CKPT_MAX_META_LEN + 1);
	val[CKPT_MAX_META_LEN + 1] = '\0';
	json_object_set_new(l.meta, "k", json_string(val));
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	ck_assert_int_eq(desc_parse(text, len, &p, err, sizeof(err)), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(err, "meta 'k' is not a string of at most 4096 bytes"));
	free(text);
	val[CKPT_MAX_META_LEN] = '\0'; /* exactly the cap: fine */
	json_object_set_new(l.meta, "k", json_string(val));
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	ck_assert_int_eq(desc_parse(text, len, &p, err, sizeof(err)), 0);
	free(text);
	free(val);
	layout_free(&p);
	layout_free(&l);
}
END_TEST

/* The largest meta and metrics a descriptor can hold (every key and value
 * at its cap, values escaped 6 bytes per byte) pass the meta size cap. */
START_TEST(test_meta_largest)
{
	struct layout l, p;
	char key[CKPT_MAX_ITEM_NAME + 1], err[256] = "";
	char *text, *val;
	size_t len;

	ck_assert_int_eq(layout_init(&l, "/r", "s", 1), 0);
	place(&l);
	val = malloc(CKPT_MAX_META_LEN + 1);
	ck_assert_ptr_nonnull(val);
	memset(val, 0x01, CKPT_MAX_META_LEN);
	val[CKPT_MAX_META_LEN] = '\0';
	memset(key, '"', CKPT_MAX_ITEM_NAME);
	key[CKPT_MAX_ITEM_NAME] = '\0';
	for (int i = 0; i < CKPT_MAX_META_KEYS; i++) {
		snprintf(key, sizeof(key), "%04d", i);
		key[4] = '"';
		json_object_set_new(l.meta, key, json_string(val));
		json_object_set_new(l.metrics, key, json_real(-1.2345678901234567e-300));
	}
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	ck_assert_uint_gt(len, 2u * CKPT_MAX_META_KEYS * 6 * CKPT_MAX_META_LEN / 2);
	memset(&p, 0, sizeof(p));
	ck_assert_msg(desc_parse(text, len, &p, err, sizeof(err)) == 0, "%s", err);
	ck_assert(json_equal(l.meta, p.meta));
	ck_assert(json_equal(l.metrics, p.metrics));
	free(text);
	free(val);
	layout_free(&p);
	layout_free(&l);
}
END_TEST

/* ---- mutation loop ---- */

static uint64_t rng_state;

static uint64_t rnd(void)
{
	/* xorshift64*: fixed seed, so a failure reproduces. */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1Dull;
}

/* A value likely to sit on a boundary of whatever field it lands in. */
static uint64_t edge_value(uint64_t old, size_t len)
{
	static const uint64_t v[] = { 0, 1, 2, 3, 7, 8, 16, 17, 64, 255, 256, 4095, 4096, 4097,
				      0x7fffffff, 0x80000000, 0xffffffff, 0x100000000ull,
				      INT64_MAX, (uint64_t)INT64_MAX + 1, UINT64_MAX };
	size_t n = sizeof(v) / sizeof(v[0]);
	uint64_t k = rnd() % (n + 4);

	if (k < n)
		return v[k];
	if (k == n)
		return old + 1;
	if (k == n + 1)
		return old - 1;
	if (k == n + 2)
		return len;
	return rnd();
}

/*
 * Flips, overwrites, truncates and extends a good descriptor a few thousand
 * times: the parser must answer 0 or -EBADMSG, never crash (run it under
 * ASan/UBSan too), and leave the layout freed on failure.  When it accepts,
 * building the result again gives the same bytes outside the meta section
 * (whose JSON text may legitimately be spelled differently).
 */
START_TEST(test_mutations)
{
	enum { ITERS = 4000 };
	struct layout l, p;
	unsigned char *d;
	char *base, *again, err[256];
	size_t blen, len, alen;
	unsigned accepted = 0, refused = 0;

	build_sample(&l);
	ck_assert_int_eq(desc_build(&l, &base, &blen), 0);
	layout_free(&l);
	rng_state = 0x9E3779B97F4A7C15ull;
	d = malloc(blen + 64);
	ck_assert_ptr_nonnull(d);
	for (int it = 0; it < ITERS; it++) {
		unsigned ops = 1 + (unsigned)(rnd() % 3);
		int r;

		memcpy(d, base, blen);
		len = blen;
		for (unsigned k = 0; k < ops; k++) {
			uint64_t op = rnd() % 8, v;
			size_t at;

			if (len == 0)
				break;
			/* Half the hits go to the header and item table, where
			 * the counts and offsets live. */
			at = (rnd() % 2 ? rnd() % (HDR + 5 * REC) : rnd()) % len;
			switch (op) {
			case 0:
			case 1:
				d[at] ^= (unsigned char)(1u << (rnd() % 8));
				break;
			case 2:
				d[at] = (unsigned char)rnd();
				break;
			case 3: /* an aligned u32 field */
				at &= ~(size_t)3;
				if (at + 4 <= len) {
					uint32_t o = get32(d, at);

					put32(d, at, (uint32_t)edge_value(o, len));
				}
				break;
			case 4: /* an aligned u64 field */
				at &= ~(size_t)7;
				if (at + 8 <= len) {
					memcpy(&v, d + at, 8);
					put64(d, at, edge_value(v, len));
				}
				break;
			case 5:
				len = at;
				break;
			case 6: {
				size_t n = 1 + rnd() % 16;

				if (len + n <= blen + 64) {
					for (size_t i = 0; i < n; i++)
						d[len + i] = (unsigned char)rnd();
					len += n;
				}
				break;
			}
			default: /* a dims entry: shapes and offsets */
				at = HDR + 5 * REC + 8 * (rnd() % 16);
				if (at + 8 <= len) {
					memcpy(&v, d + at, 8);
					put64(d, at, edge_value(v, len));
				}
				break;
			}
		}
		/* Mostly keep total_len right, or the length check hides the rest. */
		if (len >= 16 && rnd() % 4)
			put64(d, H_TOTAL, len);

		r = parse_exact(d, len, &p, err, sizeof(err));
		ck_assert_msg(r == 0 || r == -EBADMSG, "iteration %d: %d", it, r);
		if (r < 0) {
			ck_assert_msg(err[0] != '\0', "iteration %d: no reason", it);
			refused++;
			continue;
		}
		accepted++;
		ck_assert_int_eq(desc_build(&p, &again, &alen), 0);
		{
			uint32_t ml = get32(d, H_META), aml = get32((unsigned char *)again, H_META);

			ck_assert_uint_eq(len - ml, alen - aml);
			/* The header but total_len and meta_len, then the rest up
			 * to the meta section. */
			ck_assert_int_eq(memcmp(d, again, H_TOTAL), 0);
			ck_assert_int_eq(memcmp(d + H_STEP, again + H_STEP, H_META - H_STEP), 0);
			ck_assert_int_eq(memcmp(d + H_NAME_LEN, again + H_NAME_LEN,
						len - ml - H_NAME_LEN), 0);
		}
		free(again);
		layout_free(&p);
	}
	printf("desc mutations: %u accepted, %u refused\n", accepted, refused);
	ck_assert_uint_gt(accepted, 0);
	ck_assert_uint_gt(refused, ITERS / 2);
	free(d);
	free(base);
}
END_TEST

/* ---- scale ---- */

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* 10,000 items round trip; prints the times (targets: build and parse well
 * under 2 ms on an optimised build), asserts only the outcome. */
START_TEST(test_10k)
{
	enum { N = 10000 };
	struct layout l, p;
	char name[80], err[256] = "";
	char *text;
	size_t len;
	double t0, build_ms, parse_ms;

	ck_assert_int_eq(layout_init(&l, "/data", "big", 7), 0);
	for (int i = 0; i < N; i++) {
		uint64_t shape[2] = { 128, (uint64_t)(i % 50 + 1) };
		uint64_t g[2] = { 1024, (uint64_t)(i % 50 + 1) }, o[2] = { 256, 0 };

		snprintf(name, sizeof(name), "model.layers.%d.self_attn.o_proj.weight", i);
		ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, name, CKPT_BF16, 2, shape,
					    i % 2 ? g : NULL, i % 2 ? o : NULL, NULL, 0), 0);
	}
	place(&l);
	t0 = now_ms();
	ck_assert_int_eq(desc_build(&l, &text, &len), 0);
	build_ms = now_ms() - t0;
	memset(&p, 0, sizeof(p));
	t0 = now_ms();
	ck_assert_msg(desc_parse(text, len, &p, err, sizeof(err)) == 0, "%s", err);
	parse_ms = now_ms() - t0;
	assert_same(&l, &p);
	printf("desc 10k items (%zu bytes): build %.2f ms, parse %.2f ms\n", len, build_ms,
	       parse_ms);
	free(text);
	layout_free(&l);
	layout_free(&p);
}
END_TEST

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static Suite *desc_suite(void)
{
	Suite *s = suite_create("desc");
	TCase *tc;

	tc = tcase_create("round_trip");
	tcase_add_test(tc, test_round_trip);
	tcase_add_test(tc, test_round_trip_empty);
	tcase_add_test(tc, test_round_trip_scalars);
	tcase_add_test(tc, test_wire_layout);
	tcase_add_test(tc, test_integer_metric);
	tcase_add_test(tc, test_quotes_in_names);
	suite_add_tcase(s, tc);
	tc = tcase_create("malformed");
	tcase_add_test(tc, test_base_is_good);
	tcase_add_loop_test(tc, test_malformed, 0, N(bad_descs));
	tcase_add_test(tc, test_truncated);
	tcase_add_test(tc, test_meta_caps);
	tcase_add_test(tc, test_meta_largest);
	suite_add_tcase(s, tc);
	tc = tcase_create("mutations");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_mutations);
	suite_add_tcase(s, tc);
	tc = tcase_create("scale");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_10k);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(desc_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
