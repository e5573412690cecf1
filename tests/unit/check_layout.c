/* SPDX-License-Identifier: MIT */
/* check_layout.c - dtypes, shard layout packing/placing and the safetensors
 * header. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "daemon/writer.h"
#include "format/crc32c.h"
#include "format/dtype.h"
#include "format/layout.h"
#include "format/safetensors.h"

#define MiB (1ull << 20)

START_TEST(test_dtype_table)
{
	static const struct {
		enum ckpt_dtype d;
		const char *name;
		size_t size;
	} t[] = {
		{ CKPT_BOOL, "BOOL", 1 },   { CKPT_U8, "U8", 1 },     { CKPT_I8, "I8", 1 },
		{ CKPT_I16, "I16", 2 },     { CKPT_U16, "U16", 2 },   { CKPT_I32, "I32", 4 },
		{ CKPT_U32, "U32", 4 },     { CKPT_I64, "I64", 8 },   { CKPT_U64, "U64", 8 },
		{ CKPT_F16, "F16", 2 },     { CKPT_BF16, "BF16", 2 }, { CKPT_F32, "F32", 4 },
		{ CKPT_F64, "F64", 8 },     { CKPT_F8_E4M3, "F8_E4M3", 1 },
		{ CKPT_F8_E5M2, "F8_E5M2", 1 },
	};

	ck_assert_int_eq(sizeof(t) / sizeof(t[0]), CKPT_DTYPE_COUNT);
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		ck_assert_str_eq(ckpt_dtype_name(t[i].d), t[i].name);
		ck_assert_uint_eq(ckpt_dtype_size(t[i].d), t[i].size);
		ck_assert_int_eq(dtype_from_name(t[i].name), (int)t[i].d);
	}
	ck_assert_ptr_null(ckpt_dtype_name(CKPT_DTYPE_COUNT));
	ck_assert_ptr_null(ckpt_dtype_name((enum ckpt_dtype)-1));
	ck_assert_uint_eq(ckpt_dtype_size(CKPT_DTYPE_COUNT), 0);
	ck_assert_int_eq(dtype_from_name("f32"), -EINVAL);
	ck_assert_int_eq(dtype_from_name("F32 "), -EINVAL);
	ck_assert_int_eq(dtype_from_name(""), -EINVAL);
	ck_assert_int_eq(dtype_from_name(NULL), -EINVAL);
}
END_TEST

START_TEST(test_crc_count)
{
	const uint64_t B = LAYOUT_CRC_BLOCK;

	ck_assert_uint_eq(layout_crc_count(0, 0), 0);
	ck_assert_uint_eq(layout_crc_count(5, 5), 0);
	ck_assert_uint_eq(layout_crc_count(0, 1), 1);
	ck_assert_uint_eq(layout_crc_count(0, B), 1);
	ck_assert_uint_eq(layout_crc_count(0, B + 1), 2);
	ck_assert_uint_eq(layout_crc_count(B - 1, B), 1);
	ck_assert_uint_eq(layout_crc_count(B - 1, B + 1), 2);
	ck_assert_uint_eq(layout_crc_count(B, 2 * B), 1);
	ck_assert_uint_eq(layout_crc_count(4096, 3 * B + 4096), 4);
	ck_assert_uint_eq(layout_crc_count(10 * B + 7, 10 * B + 9), 1);
}
END_TEST

static void init(struct layout *l)
{
	ck_assert_int_eq(layout_init(l, "/data/ckpt", "step-1", 1), 0);
}

START_TEST(test_pack_place)
{
	uint64_t s1[2] = { 256, 1024 };        /* 1 MiB of F32 */
	uint64_t s2[1] = { 3 };                /* 6 bytes of F16 */
	uint64_t s3[3] = { 4, 0, 5 };          /* zero elements */
	uint64_t blob[1] = { 2 * MiB + 1 };
	struct layout l;
	char err[256];

	init(&l);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "a", CKPT_F32, 2, s1, NULL, NULL, err,
				    sizeof(err)), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "b", CKPT_F16, 1, s2, NULL, NULL, err,
				    sizeof(err)), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "z", CKPT_F64, 3, s3, NULL, NULL, err,
				    sizeof(err)), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "s", CKPT_I64, 0, NULL, NULL, NULL, err,
				    sizeof(err)), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_BLOB, "rng", CKPT_U8, 1, blob, NULL, NULL, err,
				    sizeof(err)), 0);
	ck_assert_uint_eq(l.n_items, 5);
	ck_assert_uint_eq(layout_item_bytes(&l, &l.items[0]), MiB);
	ck_assert_uint_eq(layout_item_bytes(&l, &l.items[1]), 6);
	ck_assert_uint_eq(layout_item_bytes(&l, &l.items[2]), 0);
	ck_assert_uint_eq(layout_item_bytes(&l, &l.items[3]), 8); /* a scalar */
	ck_assert_uint_eq(layout_item_bytes(&l, &l.items[4]), 2 * MiB + 1);
	ck_assert(!l.items[0].sharded);
	ck_assert_uint_eq(layout_gshape(&l, &l.items[0])[1], 1024);
	ck_assert_uint_eq(layout_offs(&l, &l.items[0])[1], 0);

	ck_assert_int_eq(layout_pack(&l), 0);
	ck_assert_uint_eq(l.data_start, 0);
	ck_assert_uint_eq(l.items[0].begin, 0);
	ck_assert_uint_eq(l.items[1].begin, MiB);
	ck_assert_uint_eq(l.items[2].begin, MiB + 6);
	ck_assert_uint_eq(l.items[2].end, MiB + 6);
	ck_assert_uint_eq(l.items[3].begin, MiB + 6);
	ck_assert_uint_eq(l.items[4].end, 3 * MiB + 15);

	ck_assert_int_eq(layout_place(&l, 5000), 0);
	ck_assert_uint_eq(l.data_start, 8192); /* 8 + 5000 rounded up */
	ck_assert_uint_eq(l.data_start % LAYOUT_ALIGN, 0);
	ck_assert_uint_eq(l.items[0].begin, 8192);
	for (size_t i = 1; i < l.n_items; i++)
		ck_assert_uint_eq(l.items[i].begin, l.items[i - 1].end);
	ck_assert_uint_eq(l.file_size, 8192 + 3 * MiB + 15);
	ck_assert_uint_eq(l.file_size, l.items[4].end);

	/* CRC pieces on the absolute grid: a = [8192, 1 MiB + 8192) -> 2,
	 * b inside block 1 -> 1, z and s -> 0 and 1, the blob spans blocks
	 * 1..3 -> 3. */
	ck_assert_uint_eq(l.items[0].crc0, 0);
	ck_assert_uint_eq(l.items[1].crc0, 2);
	ck_assert_uint_eq(l.items[2].crc0, 3);
	ck_assert_uint_eq(l.items[3].crc0, 3);
	ck_assert_uint_eq(l.items[4].crc0, 4);
	ck_assert_uint_eq(l.n_crcs, 7);
	{
		uint32_t sum = 0;

		for (size_t i = 0; i < l.n_items; i++) {
			ck_assert_uint_eq(l.items[i].crc0, sum);
			sum += layout_crc_count(l.items[i].begin, l.items[i].end);
		}
		ck_assert_uint_eq(sum, l.n_crcs);
	}

	/* Placing again with another header length moves everything. */
	ck_assert_int_eq(layout_place(&l, 100), 0);
	ck_assert_uint_eq(l.data_start, 4096);
	ck_assert_uint_eq(l.items[0].begin, 4096);
	ck_assert_uint_eq(l.file_size, 4096 + 3 * MiB + 15);
	ck_assert_int_eq(layout_place(&l, LAYOUT_MAX_HEADER + 1), -EOVERFLOW);
	layout_free(&l);
	layout_free(&l); /* zeroed: fine */
}
END_TEST

START_TEST(test_sharded)
{
	uint64_t shape[2] = { 2, 6 }, gshape[2] = { 4, 6 }, offs[2] = { 2, 0 };
	uint64_t whole_offs[2] = { 0, 0 }, whole[2] = { 2, 6 };
	struct layout l;
	char err[256];

	init(&l);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "w", CKPT_F32, 2, shape, gshape, offs, err,
				    sizeof(err)), 0);
	ck_assert(l.items[0].sharded);
	ck_assert_uint_eq(layout_shape(&l, &l.items[0])[0], 2);
	ck_assert_uint_eq(layout_gshape(&l, &l.items[0])[0], 4);
	ck_assert_uint_eq(layout_offs(&l, &l.items[0])[0], 2);
	/* A "global" shape equal to the chunk at offset 0 is not sharded. */
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "v", CKPT_F32, 2, shape, whole, whole_offs,
				    err, sizeof(err)), 0);
	ck_assert(!l.items[1].sharded);
	layout_free(&l);
}
END_TEST

struct bad_add {
	const char *what;
	enum item_kind kind;
	const char *name;
	int dtype;
	unsigned ndim;
	uint64_t shape[3], gshape[3], offs[3];
	bool with_global;
	int want;
};

static const struct bad_add bad_adds[] = {
	{ "bad name", ITEM_TENSOR, "__x", CKPT_F32, 1, { 1 }, { 0 }, { 0 }, false, -EINVAL },
	{ "empty name", ITEM_TENSOR, "", CKPT_F32, 1, { 1 }, { 0 }, { 0 }, false, -EINVAL },
	{ "bad dtype", ITEM_TENSOR, "a", CKPT_DTYPE_COUNT, 1, { 1 }, { 0 }, { 0 }, false, -EINVAL },
	{ "too many dims", ITEM_TENSOR, "a", CKPT_F32, CKPT_MAX_NDIM + 1, { 0 }, { 0 }, { 0 },
	  false, -EINVAL },
	{ "bad kind", (enum item_kind)7, "a", CKPT_F32, 1, { 1 }, { 0 }, { 0 }, false, -EINVAL },
	{ "offs+shape > gshape", ITEM_TENSOR, "a", CKPT_F32, 2, { 2, 3 }, { 4, 3 }, { 3, 0 }, true,
	  -EINVAL },
	{ "shape > gshape", ITEM_TENSOR, "a", CKPT_F32, 1, { 5 }, { 4 }, { 0 }, true, -EINVAL },
	{ "offset overflow", ITEM_TENSOR, "a", CKPT_F32, 1, { 2 }, { 4 }, { UINT64_MAX }, true,
	  -EINVAL },
	{ "element overflow", ITEM_TENSOR, "a", CKPT_U8, 3, { 1ull << 32, 1ull << 32, 2 }, { 0 },
	  { 0 }, false, -EINVAL },
	{ "byte overflow", ITEM_TENSOR, "a", CKPT_F64, 1, { 1ull << 62 }, { 0 }, { 0 }, false,
	  -EINVAL },
	{ "global overflow", ITEM_TENSOR, "a", CKPT_F32, 2, { 1, 1 }, { 1ull << 40, 1ull << 40 },
	  { 0, 0 }, true, -EINVAL },
	{ "blob not U8", ITEM_BLOB, "b", CKPT_F32, 1, { 4 }, { 0 }, { 0 }, false, -EINVAL },
	{ "blob 2-D", ITEM_BLOB, "b", CKPT_U8, 2, { 4, 4 }, { 0 }, { 0 }, false, -EINVAL },
	{ "blob sharded", ITEM_BLOB, "b", CKPT_U8, 1, { 4 }, { 8 }, { 4 }, true, -EINVAL },
};

START_TEST(test_add_rejects)
{
	const struct bad_add *c = &bad_adds[_i];
	uint64_t big[CKPT_MAX_NDIM + 1];
	struct layout l;
	char err[256] = "";

	for (size_t i = 0; i < CKPT_MAX_NDIM + 1; i++)
		big[i] = 1;
	init(&l);
	ck_assert_int_eq(layout_add(&l, c->kind, c->name, (enum ckpt_dtype)c->dtype, c->ndim,
				    c->ndim > 3 ? big : c->shape, c->with_global ? c->gshape : NULL,
				    c->with_global ? c->offs : NULL, err, sizeof(err)),
			 c->want);
	ck_assert_msg(err[0] != '\0', "%s: no reason given", c->what);
	ck_assert_uint_eq(l.n_items, 0);
	ck_assert_uint_eq(l.n_dims, 0);
	layout_free(&l);
}
END_TEST

START_TEST(test_pack_overflow)
{
	uint64_t half[1] = { 1ull << 62 };
	struct layout l;

	init(&l);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "a", CKPT_U8, 1, half, NULL, NULL, NULL, 0), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "b", CKPT_U8, 1, half, NULL, NULL, NULL, 0), 0);
	/* 2^63 bytes of data do not fit in a file offset. */
	ck_assert_int_eq(layout_pack(&l), -EOVERFLOW);
	layout_free(&l);
}
END_TEST

/* Many items: names pooled, dims grown; every name readable afterwards. */
START_TEST(test_many_items)
{
	enum { N = 200000 };
	struct layout l;
	char name[64];

	init(&l);
	for (int i = 0; i < N; i++) {
		uint64_t shape[2] = { (uint64_t)(i % 7), 3 };

		snprintf(name, sizeof(name), "model.layers.%d.mlp.weight", i);
		ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, name, CKPT_BF16, 2, shape, NULL, NULL,
					    NULL, 0), 0);
	}
	ck_assert_int_eq(layout_pack(&l), 0);
	ck_assert_int_eq(layout_place(&l, 0), 0);
	for (int i = 0; i < N; i += 997) {
		snprintf(name, sizeof(name), "model.layers.%d.mlp.weight", i);
		ck_assert_str_eq(l.items[i].name, name);
		ck_assert_uint_eq(layout_shape(&l, &l.items[i])[0], (uint64_t)(i % 7));
	}
	ck_assert_uint_lt(l.n_blocks, 64);
	layout_free(&l);
}
END_TEST

/* Builds a layout, its header, places it, and returns the header text. */
static char *placed(struct layout *l, uint32_t rank, size_t *len)
{
	char *json;

	ck_assert_int_eq(layout_pack(l), 0);
	ck_assert_int_eq(st_header_json(l, rank, &json, len), 0);
	ck_assert_int_eq(layout_place(l, *len), 0);
	return json;
}

START_TEST(test_st_header)
{
	uint64_t s1[2] = { 2, 3 }, s2[1] = { 5 }, s0[2] = { 0, 4 };
	uint64_t g[2] = { 4, 3 }, o[2] = { 2, 0 };
	struct layout l;
	json_error_t jerr;
	json_t *root, *e, *md;
	char *json, *file;
	size_t len;
	uint64_t n;

	init(&l);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "w \"q\" \\", CKPT_F32, 2, s1, g, o, NULL, 0),
			 0);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "empty", CKPT_BF16, 2, s0, NULL, NULL, NULL, 0),
			 0);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "scalar", CKPT_F64, 0, NULL, NULL, NULL, NULL,
				    0), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_BLOB, "rng", CKPT_U8, 1, s2, NULL, NULL, NULL, 0), 0);
	json = placed(&l, 3, &len);
	ck_assert_uint_eq(l.data_start, 4096);

	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
	ck_assert_msg(root != NULL, "%s", jerr.text);
	ck_assert_uint_eq(json_object_size(root), 5);
	e = json_object_get(root, "w \"q\" \\");
	ck_assert_ptr_nonnull(e);
	ck_assert_str_eq(json_string_value(json_object_get(e, "dtype")), "F32");
	ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(e, "shape"), 0)), 2);
	ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(e, "shape"), 1)), 3);
	ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 0)), 0);
	ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 1)),
			 24);
	e = json_object_get(root, "empty");
	ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 0)),
			 24);
	ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 1)),
			 24);
	e = json_object_get(root, "scalar");
	ck_assert_uint_eq(json_array_size(json_object_get(e, "shape")), 0);
	ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 1)),
			 32);
	e = json_object_get(root, "rng");
	ck_assert_str_eq(json_string_value(json_object_get(e, "dtype")), "U8");
	ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 1)),
			 37);
	md = json_object_get(root, "__metadata__");
	ck_assert_str_eq(json_string_value(json_object_get(md, "format")), "pt");
	ck_assert_str_eq(json_string_value(json_object_get(md, "ckpt.rank")), "3");
	json_decref(root);

	/* The file prefix: LE length, JSON, spaces up to data_start. */
	file = malloc(l.data_start);
	ck_assert_ptr_nonnull(file);
	memset(file, 0xAA, l.data_start);
	st_header_write(&l, json, len, file);
	n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | (unsigned char)file[i];
	ck_assert_uint_eq(n, l.data_start - 8);
	ck_assert_int_eq(memcmp(file + 8, json, len), 0);
	for (size_t i = 8 + len; i < l.data_start; i++)
		ck_assert_int_eq(file[i], ' ');
	/* And the padded header is still the same JSON. */
	root = json_loadb(file + 8, l.data_start - 8, 0, &jerr);
	ck_assert_msg(root != NULL, "%s", jerr.text);
	json_decref(root);
	free(file);
	free(json);
	layout_free(&l);
}
END_TEST

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* 10,000 items: the header is built in a few ms (the bound is loose so a
 * sanitizer build passes too) and parses back with every entry. */
START_TEST(test_st_header_10k)
{
	enum { N = 10000 };
	struct layout l;
	json_t *root;
	char name[64];
	char *json;
	size_t len;
	double t0, ms;

	init(&l);
	for (int i = 0; i < N; i++) {
		uint64_t shape[2] = { 64, (uint64_t)(i % 100 + 1) };

		snprintf(name, sizeof(name), "model.layers.%d.self_attn.q_proj.weight", i);
		ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, name, CKPT_F32, 2, shape, NULL, NULL,
					    NULL, 0), 0);
	}
	ck_assert_int_eq(layout_pack(&l), 0);
	t0 = now_ms();
	ck_assert_int_eq(st_header_json(&l, 0, &json, &len), 0);
	ms = now_ms() - t0;
	ck_assert_msg(ms < 100, "header of 10k items took %.1f ms", ms);
	ck_assert_int_eq(layout_place(&l, len), 0);
	root = json_loadb(json, len, 0, NULL);
	ck_assert_ptr_nonnull(root);
	ck_assert_uint_eq(json_object_size(root), N + 1);
	json_decref(root);
	free(json);
	layout_free(&l);
}
END_TEST

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))


/* The spill tier's check (writer_crc_verify): the pieces of every item in a
 * range against CRCs computed here on the grid, independently; a changed
 * byte is found in its grid block, in any range that holds it. */
START_TEST(test_crc_verify)
{
	struct layout l;
	char err[256];
	uint64_t s1[1] = { 3u << 19 }, s2[1] = { 5000 }, bad = 0;
	uint8_t *buf;
	uint32_t *crcs;

	ck_assert_int_eq(layout_init(&l, "/r", "c", 1), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "a", CKPT_F32, 1, s1, NULL, NULL, err,
				    sizeof(err)), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_BLOB, "b", CKPT_U8, 1, s2, NULL, NULL, err,
				    sizeof(err)), 0);
	ck_assert_int_eq(layout_pack(&l), 0);
	ck_assert_int_eq(layout_place(&l, 100), 0);
	buf = malloc(l.file_size);
	crcs = calloc(l.n_crcs, sizeof(*crcs));
	ck_assert(buf && crcs);
	for (uint64_t i = 0; i < l.file_size; i++)
		buf[i] = (uint8_t)(i * 131 + (i >> 9));
	for (size_t k = 0; k < l.n_items; k++) {
		const struct layout_item *it = &l.items[k];
		uint32_t n = 0;
		for (uint64_t b = it->begin; b < it->end; n++) {
			uint64_t e = (b / LAYOUT_CRC_BLOCK + 1) * LAYOUT_CRC_BLOCK;
			if (e > it->end)
				e = it->end;
			crcs[it->crc0 + n] = crc32c(buf + b, e - b, 0);
			b = e;
		}
	}
	ck_assert_int_eq(writer_crc_verify(&l, crcs, buf, 0, l.file_size, &bad), 0);
	/* In parts of one grid block each, as the spill tier's 1 MiB-multiple
	 * parts are. */
	for (uint64_t off = 0; off < l.file_size; off += LAYOUT_CRC_BLOCK) {
		uint64_t len = l.file_size - off < LAYOUT_CRC_BLOCK ? l.file_size - off :
								       LAYOUT_CRC_BLOCK;
		ck_assert_int_eq(writer_crc_verify(&l, crcs, buf + off, off, len, &bad), 0);
	}
	/* A byte of item a in its second block, then of the blob. */
	uint64_t at[2] = { l.items[0].begin + LAYOUT_CRC_BLOCK + 7, l.items[1].end - 1 };
	for (int k = 0; k < 2; k++) {
		uint64_t blk = at[k] / LAYOUT_CRC_BLOCK * LAYOUT_CRC_BLOCK;
		buf[at[k]] ^= 0x40;
		ck_assert_int_eq(writer_crc_verify(&l, crcs, buf, 0, l.file_size, &bad), -EIO);
		ck_assert_uint_eq(bad, blk);
		ck_assert_int_eq(writer_crc_verify(&l, crcs, buf + blk, blk,
						   l.file_size - blk < LAYOUT_CRC_BLOCK ?
							   l.file_size - blk :
							   LAYOUT_CRC_BLOCK,
						   &bad),
				 -EIO);
		buf[at[k]] ^= 0x40;
	}
	/* The header is not covered by the pieces. */
	buf[3] ^= 1;
	ck_assert_int_eq(writer_crc_verify(&l, crcs, buf, 0, l.file_size, &bad), 0);
	free(buf);
	free(crcs);
	layout_free(&l);
}
END_TEST

/* writer_crc_extent: the CRC pieces it stores equal the pieces computed
 * directly, and the extent's CRC it builds from them and the bytes between
 * items (header, padding, an empty item) equals the CRC32C of the bytes,
 * for the whole file and for extents of one and of two grid blocks. */
START_TEST(test_crc_extent)
{
	struct layout l;
	char err[256];
	uint64_t s1[1] = { 3u << 19 }, s0[1] = { 0 }, s2[1] = { 5000 }, s3[1] = { 3 };
	uint8_t *buf;
	uint32_t *want, *got;

	ck_assert_int_eq(layout_init(&l, "/r", "c", 1), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "a", CKPT_F32, 1, s1, NULL, NULL, err,
				    sizeof(err)), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "z", CKPT_F32, 1, s0, NULL, NULL, err,
				    sizeof(err)), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_BLOB, "b", CKPT_U8, 1, s2, NULL, NULL, err,
				    sizeof(err)), 0);
	ck_assert_int_eq(layout_add(&l, ITEM_TENSOR, "c", CKPT_U8, 1, s3, NULL, NULL, err,
				    sizeof(err)), 0);
	ck_assert_int_eq(layout_pack(&l), 0);
	ck_assert_int_eq(layout_place(&l, 100), 0);
	buf = malloc(l.file_size);
	want = calloc(l.n_crcs + 1, sizeof(*want));
	got = calloc(l.n_crcs + 1, sizeof(*got));
	ck_assert(buf && want && got);
	for (uint64_t i = 0; i < l.file_size; i++)
		buf[i] = (uint8_t)(i * 37 + (i >> 11));
	for (size_t k = 0; k < l.n_items; k++) {
		const struct layout_item *it = &l.items[k];
		uint32_t n = 0;
		for (uint64_t b = it->begin; b < it->end; n++) {
			uint64_t e = (b / LAYOUT_CRC_BLOCK + 1) * LAYOUT_CRC_BLOCK;
			if (e > it->end)
				e = it->end;
			want[it->crc0 + n] = crc32c(buf + b, e - b, 0);
			b = e;
		}
	}
	/* The header lies outside every item, or the test proves little. */
	ck_assert_uint_gt(l.items[0].begin, 0);
	ck_assert_uint_eq(writer_crc_extent(&l, got, buf, 0, l.file_size),
			  crc32c(buf, l.file_size, 0));
	ck_assert_mem_eq(got, want, l.n_crcs * sizeof(*got));
	for (uint64_t ext = LAYOUT_CRC_BLOCK; ext <= 2 * LAYOUT_CRC_BLOCK; ext += LAYOUT_CRC_BLOCK) {
		memset(got, 0, l.n_crcs * sizeof(*got));
		for (uint64_t off = 0; off < l.file_size; off += ext) {
			uint64_t len = l.file_size - off < ext ? l.file_size - off : ext;
			ck_assert_uint_eq(writer_crc_extent(&l, got, buf + off, off, len),
					  crc32c(buf + off, len, 0));
		}
		ck_assert_mem_eq(got, want, l.n_crcs * sizeof(*got));
	}
	/* A changed header byte changes the extent's CRC, not the pieces. */
	uint32_t before = writer_crc_extent(&l, got, buf, 0, l.file_size);
	buf[3] ^= 1;
	ck_assert_uint_ne(writer_crc_extent(&l, got, buf, 0, l.file_size), before);
	ck_assert_mem_eq(got, want, l.n_crcs * sizeof(*got));
	free(buf);
	free(want);
	free(got);
	layout_free(&l);
}
END_TEST

static Suite *layout_suite(void)
{
	Suite *s = suite_create("layout");
	TCase *tc;

	tc = tcase_create("dtype");
	tcase_add_test(tc, test_dtype_table);
	suite_add_tcase(s, tc);
	tc = tcase_create("crc_count");
	tcase_add_test(tc, test_crc_count);
	tcase_add_test(tc, test_crc_verify);
	tcase_add_test(tc, test_crc_extent);
	suite_add_tcase(s, tc);
	tc = tcase_create("pack_place");
	tcase_add_test(tc, test_pack_place);
	tcase_add_test(tc, test_pack_overflow);
	suite_add_tcase(s, tc);
	tc = tcase_create("sharded");
	tcase_add_test(tc, test_sharded);
	suite_add_tcase(s, tc);
	tc = tcase_create("add_rejects");
	tcase_add_loop_test(tc, test_add_rejects, 0, N(bad_adds));
	suite_add_tcase(s, tc);
	tc = tcase_create("many_items");
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_many_items);
	suite_add_tcase(s, tc);
	tc = tcase_create("safetensors_header");
	tcase_add_test(tc, test_st_header);
	tcase_add_test(tc, test_st_header_10k);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(layout_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
